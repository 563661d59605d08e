//! The sink contract: one writer per subtask.

use futures::future::LocalBoxFuture;

use super::ConnectorError;
use crate::checkpoint::CheckpointBarrier;
use crate::operator::RuntimeContext;

/// Writes one subtask's records. Lives on the subtask's shard.
pub trait SinkWriter<T> {
    /// Writes (and removes) every record of `batch`. `timestamps[i]` is the event timestamp
    /// of `batch[i]` (`NO_TIMESTAMP` if it has none), as Flink's `SinkWriter.Context` gives.
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<T>,
        timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>>;

    /// The input ended: write out everything. With checkpointing on, the final checkpoint's
    /// notice still follows (`notify_checkpoint_complete`: where a transactional sink commits
    /// what it wrote last); no record and no `flush` do.
    fn finish(&mut self) -> LocalBoxFuture<'_, Result<(), ConnectorError>>;

    /// `barrier` reached the sink: hand what it buffered to the system, so that records from
    /// before a completed checkpoint outlive the process (a resumed job does not produce them
    /// again); a transactional sink pre-commits here (`two_phase_writer`). Whatever the
    /// writer keeps in its operator state is snapshotted after this returns. The default has
    /// nothing buffered.
    fn flush(
        &mut self,
        _barrier: &CheckpointBarrier,
    ) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(async { Ok(()) })
    }

    /// The subtask ends: after `finish` and the final checkpoint's notice when the input
    /// ended, or after the savepoint the job stops with (`stopped_with_savepoint`; `finish`
    /// was not called, and the job goes on from the savepoint). The default does nothing.
    fn close(
        &mut self,
        _stopped_with_savepoint: bool,
    ) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(async { Ok(()) })
    }

    /// Checkpoint `checkpoint` completed: what was flushed at its barrier (and at earlier
    /// ones) is part of a durable checkpoint and may be committed (Flink's
    /// `notifyCheckpointComplete`). Notices come in increasing order, after the records that
    /// followed the barrier may already have been written; one may be skipped when a newer
    /// checkpoint completes first, so a newer notice covers every older checkpoint. A bounded
    /// job's last notice is its final checkpoint's, after `finish`.
    fn notify_checkpoint_complete(
        &mut self,
        _checkpoint: u64,
    ) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(async { Ok(()) })
    }

    /// Checkpoint `checkpoint` was aborted: what was flushed at its barrier is not part of a
    /// checkpoint (it is covered by the next one that completes).
    fn notify_checkpoint_aborted(
        &mut self,
        _checkpoint: u64,
    ) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(async { Ok(()) })
    }
}

/// A sink of records of type `T`.
pub trait Sink<T>: Send + Sync + 'static {
    /// Creates the writer of one subtask, on its shard.
    fn create_writer(&self, ctx: &RuntimeContext)
        -> Result<Box<dyn SinkWriter<T>>, ConnectorError>;
}
