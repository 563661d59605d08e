//! The sink contract: one writer per subtask.

use futures::future::LocalBoxFuture;

use super::ConnectorError;
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

    /// The input ended: write out everything and close.
    fn finish(&mut self) -> LocalBoxFuture<'_, Result<(), ConnectorError>>;

    /// A checkpoint barrier reached the sink: hand what it buffered to the system, so that
    /// records from before a completed checkpoint outlive the process (a resumed job does not
    /// produce them again). The default has nothing buffered.
    fn flush(&mut self) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(async { Ok(()) })
    }
}

/// A sink of records of type `T`.
pub trait Sink<T>: Send + Sync + 'static {
    /// Creates the writer of one subtask, on its shard.
    fn create_writer(&self, ctx: &RuntimeContext)
        -> Result<Box<dyn SinkWriter<T>>, ConnectorError>;
}
