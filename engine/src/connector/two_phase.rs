//! The two-phase-commit sink contract (Flink's `TwoPhaseCommittingSink`: a writer that
//! pre-commits, and a committer), which makes a sink's output exactly once.
//!
//! A [`TransactionWriter`] writes into open transactions. At a checkpoint barrier it closes
//! them for commit ([`TransactionWriter::prepare_commit`]) and hands over their
//! committables: what it takes to commit a transaction later, in this process or in one that
//! resumes the job. The committables become part of the checkpoint (the sink's union list
//! state); once the checkpoint completes, a [`Committer`] commits them. A job restored from a
//! checkpoint commits the committables the checkpoint holds again (a commit is idempotent),
//! and aborts the transactions an earlier run left that no checkpoint holds: their records are
//! replayed.
//!
//! [`two_phase_writer`] does the bookkeeping for any such sink, by its
//! [`DeliveryGuarantee`] (`sink.delivery-guarantee`):
//!
//! - `exactly-once`: commit when the checkpoint whose barrier closed a transaction completes
//!   (or a later one: a notice may be skipped, and an aborted checkpoint's transactions wait
//!   for the next that completes). A savepoint's completion commits nothing unless the job
//!   stops with it (Flink's rule: an intermediate savepoint has no side effects, since the job
//!   may recover from an older checkpoint).
//! - `at-least-once`: commit what the writer closed by itself (a rolling policy) at once, and
//!   what is open at the barrier, before the checkpoint's state is written: what a restore
//!   replays is written again.
//! - `none`: commit what the writer closed by itself and what is open at the end of the
//!   input; barriers do nothing, so what is open when the job fails is lost.
//!
//! A bounded job commits its last transactions at its end: after the final checkpoint
//! completed, or, unchecked, when its input ended.

use std::time::Duration;

use futures::future::LocalBoxFuture;
use weir_state::OperatorListState;
use weir_state::{StateCodec, StateValue};

use super::{ConnectorError, SinkWriter};
use crate::checkpoint::{CheckpointBarrier, SnapshotKind};
use crate::operator::RuntimeContext;
use crate::state::ListStateDescriptor;

/// What a sink promises about its output when the job fails and recovers (Flink's
/// `sink.delivery-guarantee`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeliveryGuarantee {
    /// Every record exactly once: output becomes visible when the checkpoint after it
    /// completes.
    #[default]
    ExactlyOnce,
    /// No record lost; records replayed after a failure are written again.
    AtLeastOnce,
    /// No promise: output becomes visible as the sink closes it.
    None,
}

impl DeliveryGuarantee {
    /// The setting's values, as `sink.delivery-guarantee` spells them.
    pub const NAMES: [&'static str; 3] = ["exactly-once", "at-least-once", "none"];

    /// The guarantee `text` names (`exactly-once`, `at-least-once` or `none`).
    pub fn parse(text: &str) -> Option<DeliveryGuarantee> {
        match text.trim() {
            "exactly-once" => Some(DeliveryGuarantee::ExactlyOnce),
            "at-least-once" => Some(DeliveryGuarantee::AtLeastOnce),
            "none" => Some(DeliveryGuarantee::None),
            _ => None,
        }
    }

    /// The setting's spelling.
    pub fn name(self) -> &'static str {
        match self {
            DeliveryGuarantee::ExactlyOnce => Self::NAMES[0],
            DeliveryGuarantee::AtLeastOnce => Self::NAMES[1],
            DeliveryGuarantee::None => Self::NAMES[2],
        }
    }
}

/// Writes one subtask's records into open transactions (Flink's precommitting `SinkWriter`).
pub trait TransactionWriter<T, C>: 'static {
    /// Writes (and removes) every record of `batch` into the open transactions, opening them
    /// as needed. `timestamps[i]` is the event timestamp of `batch[i]`.
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<T>,
        timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>>;

    /// Closes every open transaction for commit, durably (a committable must still commit
    /// after the process is killed), and returns their committables with those of the
    /// transactions it closed by itself since the last call: at checkpoint `checkpoint`'s
    /// barrier, and when the input ends (`None`). The next write opens new transactions.
    fn prepare_commit(
        &mut self,
        checkpoint: Option<u64>,
    ) -> LocalBoxFuture<'_, Result<Vec<C>, ConnectorError>>;

    /// The transactions the writer closed by itself since the last call (a rolling policy),
    /// prepared for commit. `prepare_commit` returns them too, if they were not taken here.
    fn take_closed(&mut self) -> Vec<C> {
        Vec::new()
    }
}

/// Why a commit failed.
#[derive(Debug)]
pub enum CommitError {
    /// It may succeed if tried again (a lost connection, a busy server).
    Retry(String),
    /// It cannot: the job fails (and, restarted, commits from its checkpoint again).
    Fail(ConnectorError),
}

/// Commits what writers pre-committed, on the subtask's shard.
pub trait Committer<C>: 'static {
    /// Commits every one of `committables`. A committable committed already (by this process,
    /// or by one before it) commits again as a success.
    fn commit<'a>(
        &'a mut self,
        committables: &'a [C],
    ) -> LocalBoxFuture<'a, Result<(), CommitError>>;

    /// Before anything is written, on a start or a restore: aborts the transactions an
    /// earlier run of the job left that belong to this subtask (of those the old subtasks
    /// left, subtask `s` takes the ones of old subtasks `s`, `s + parallelism`, …), except
    /// those in `keep`: the committables the restored checkpoint holds, which are committed.
    /// It looks in its own [`scope`](Committer::scope) and in `earlier`: the other scopes
    /// the restored checkpoint's run had (a job renamed since, another table).
    fn abort_lingering<'a>(
        &'a mut self,
        keep: &'a [C],
        earlier: &'a [String],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>>;

    /// Where this subtask's transactions live, as a restore needs it to find what a run
    /// left (a transaction name prefix): kept in every checkpoint, and handed to
    /// `abort_lingering` when a restored job's scope differs. `None`: no such thing.
    fn scope(&self) -> Option<String> {
        None
    }

    /// The subtask whose writer closed `committable`, if it tells. A restored job commits
    /// each old subtask's committables on one subtask (`s % parallelism`), in their order:
    /// commits of one writer's transactions stay in the order it wrote them. `None`: shared
    /// out by their position in the checkpoint.
    fn writer_of(&self, _committable: &C) -> Option<usize> {
        None
    }
}

/// A sink whose output becomes visible only when committed: every subtask gets a
/// [`TransactionWriter`] and a [`Committer`], and [`two_phase_writer`] ties them to the
/// job's checkpoints. Its `Sink` implementation calls [`two_phase_writer`].
pub trait TwoPhaseCommitSink<T>: Send + Sync + 'static {
    /// What a pre-commit hands over.
    type Committable: StateValue;

    /// The writer of one subtask, on its shard.
    fn create_writer(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Box<dyn TransactionWriter<T, Self::Committable>>, ConnectorError>;

    /// The committer of one subtask, on its shard.
    fn create_committer(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Box<dyn Committer<Self::Committable>>, ConnectorError>;

    /// The sink's own guarantee; `None`: the job's `sink.delivery-guarantee`.
    fn delivery_guarantee(&self) -> Option<DeliveryGuarantee>;
}

/// The name of the union list state that holds a two-phase sink's committables.
pub(crate) const COMMITTABLES: &str = "two-phase committables";
/// The union list state that holds the committers' scopes.
const SCOPES: &str = "two-phase scopes";

/// The most tries of one commit, and the longest wait between two.
const COMMIT_TRIES: u32 = 10;
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The sink writer of one subtask of `sink`: its transaction writer and committer, tied to
/// the job's checkpoints by the sink's delivery guarantee (see the module docs).
pub fn two_phase_writer<T: 'static, S: TwoPhaseCommitSink<T>>(
    sink: &S,
    ctx: &RuntimeContext,
) -> Result<Box<dyn SinkWriter<T>>, ConnectorError> {
    let committables = ctx
        .operator_state()
        .union_list_state(&ListStateDescriptor::<Vec<u8>>::new(COMMITTABLES))
        .map_err(|e| {
            ConnectorError::external(format!(
                "sink '{}' cannot register its committables' state: {e}",
                ctx.operator_name
            ))
        })?;
    // Every subtask restores every old subtask's committables (to keep them from being
    // aborted); each commits its share of them.
    let restored = committables
        .get()
        .iter()
        .map(|bytes| S::Committable::decode(bytes))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            ConnectorError::external(format!(
                "sink '{}' cannot read the committables of the checkpoint it restores: {e}",
                ctx.operator_name
            ))
        })?;
    committables.clear();
    let committer = sink.create_committer(ctx)?;
    let scopes = ctx
        .operator_state()
        .union_list_state(&ListStateDescriptor::<String>::new(SCOPES))
        .map_err(|e| {
            ConnectorError::external(format!(
                "sink '{}' cannot register its scopes' state: {e}",
                ctx.operator_name
            ))
        })?;
    let scope = committer.scope();
    let mut earlier = scopes.get();
    earlier.sort();
    earlier.dedup();
    earlier.retain(|earlier| Some(earlier) != scope.as_ref());
    // Until the restore aborted what they left, a checkpoint keeps the earlier scopes too.
    scopes.update(earlier.iter().cloned().chain(scope.clone()));
    Ok(Box::new(TwoPhaseWriter {
        writer: sink.create_writer(ctx)?,
        committer,
        guarantee: sink
            .delivery_guarantee()
            .unwrap_or(ctx.sinks.delivery_guarantee),
        sink: ctx.operator_name.to_string(),
        pending: Vec::new(),
        savepoints: Vec::new(),
        completed: None,
        committables,
        recovery: Some(Recovery {
            restored,
            earlier,
            scopes,
            scope,
            subtask: ctx.subtask,
            parallelism: ctx.parallelism,
        }),
    }))
}

/// What a writer does before its first record: commit its share of the restored
/// committables, abort what else an earlier run left.
struct Recovery<C> {
    restored: Vec<C>,
    /// The restored run's scopes other than this one's.
    earlier: Vec<String>,
    /// Where the scopes go at a barrier, and this committer's.
    scopes: OperatorListState<String>,
    scope: Option<String>,
    subtask: usize,
    parallelism: usize,
}

struct TwoPhaseWriter<T, C: StateValue> {
    writer: Box<dyn TransactionWriter<T, C>>,
    committer: Box<dyn Committer<C>>,
    guarantee: DeliveryGuarantee,
    /// The sink's name, for messages.
    sink: String,
    /// Prepared and not yet committed, each with the checkpoint whose barrier closed it
    /// (`u64::MAX`: closed at the end of the input, after every barrier).
    pending: Vec<(u64, C)>,
    /// Savepoints whose barrier passed and whose notice did not come yet.
    savepoints: Vec<u64>,
    /// The newest checkpoint or savepoint that completed.
    completed: Option<u64>,
    /// Where `pending` goes at a barrier.
    committables: OperatorListState<Vec<u8>>,
    /// Done before the first call that writes or commits.
    recovery: Option<Recovery<C>>,
}

impl<T: 'static, C: StateValue> TwoPhaseWriter<T, C> {
    async fn recover(&mut self) -> Result<(), ConnectorError> {
        let Some(recovery) = self.recovery.take() else {
            return Ok(());
        };
        let share: Vec<C> = recovery
            .restored
            .iter()
            .enumerate()
            .filter(|(i, committable)| {
                let writer = self.committer.writer_of(committable).unwrap_or(*i);
                writer % recovery.parallelism == recovery.subtask
            })
            .map(|(_, committable)| committable.clone())
            .collect();
        self.commit(&share).await?;
        self.committer
            .abort_lingering(&recovery.restored, &recovery.earlier)
            .await?;
        recovery.scopes.update(recovery.scope);
        Ok(())
    }

    /// Commits `committables`, retrying with a growing wait while the committer says a retry
    /// may help.
    async fn commit(&mut self, committables: &[C]) -> Result<(), ConnectorError> {
        if committables.is_empty() {
            return Ok(());
        }
        let mut wait = Duration::from_millis(50);
        for attempt in 1.. {
            match self.committer.commit(committables).await {
                Ok(()) => return Ok(()),
                Err(CommitError::Fail(error)) => return Err(error),
                Err(CommitError::Retry(reason)) if attempt < COMMIT_TRIES => {
                    tracing::warn!(sink = %self.sink, attempt, %reason, "commit failed; retrying");
                    glommio::timer::sleep(wait).await;
                    wait = (wait * 2).min(MAX_BACKOFF);
                }
                Err(CommitError::Retry(reason)) => {
                    return Err(ConnectorError::external(format!(
                        "sink '{}' could not commit after {COMMIT_TRIES} tries: {reason}",
                        self.sink
                    )))
                }
            }
        }
        unreachable!("the loop returns")
    }

    /// Commits every pending transaction closed at or before `checkpoint`'s barrier.
    async fn commit_through(&mut self, checkpoint: u64) -> Result<(), ConnectorError> {
        let (due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(closed_at, _)| *closed_at <= checkpoint);
        self.pending = rest;
        let due: Vec<C> = due
            .into_iter()
            .map(|(_, committable)| committable)
            .collect();
        self.commit(&due).await
    }

    async fn write_batch(&mut self, batch: &mut Vec<T>, timestamps: &[i64]) -> WriteResult {
        self.recover().await?;
        self.writer.write(batch, timestamps).await?;
        if self.guarantee != DeliveryGuarantee::ExactlyOnce {
            let closed = self.writer.take_closed();
            self.commit(&closed).await?;
        }
        Ok(())
    }

    async fn barrier(&mut self, barrier: CheckpointBarrier) -> WriteResult {
        self.recover().await?;
        match self.guarantee {
            DeliveryGuarantee::ExactlyOnce => {
                let closed = self.writer.prepare_commit(Some(barrier.id)).await?;
                self.pending.extend(
                    closed
                        .into_iter()
                        .map(|committable| (barrier.id, committable)),
                );
                if barrier.kind == SnapshotKind::Savepoint {
                    self.savepoints.push(barrier.id);
                }
                self.keep_pending()?;
            }
            DeliveryGuarantee::AtLeastOnce => {
                let closed = self.writer.prepare_commit(Some(barrier.id)).await?;
                self.commit(&closed).await?;
            }
            DeliveryGuarantee::None => {}
        }
        Ok(())
    }

    async fn completed(&mut self, checkpoint: u64) -> WriteResult {
        self.recover().await?;
        self.completed = self.completed.max(Some(checkpoint));
        if let Some(at) = self.savepoints.iter().position(|&s| s == checkpoint) {
            // Committed by the next checkpoint, or when the job stops with this savepoint.
            self.savepoints.remove(at);
            return Ok(());
        }
        self.commit_through(checkpoint).await
    }

    /// Puts the pending committables into the sink's state, for the next snapshot.
    fn keep_pending(&mut self) -> WriteResult {
        let encoded = self
            .pending
            .iter()
            .map(|(_, committable)| {
                let mut bytes = Vec::new();
                committable.encode_into(&mut bytes).map(|()| bytes)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                ConnectorError::external(format!(
                    "sink '{}' cannot encode its committables: {e}",
                    self.sink
                ))
            })?;
        self.committables.update(encoded);
        Ok(())
    }

    /// The input ended: close what is open. Exactly once, it is committed at the end
    /// (`close`), after the final checkpoint, which holds it (no barrier reaches a finished
    /// sink, so its state is put aside now); otherwise at once, since no record before the
    /// final checkpoint is replayed.
    async fn finish(&mut self) -> WriteResult {
        self.recover().await?;
        let closed = self.writer.prepare_commit(None).await?;
        if self.guarantee != DeliveryGuarantee::ExactlyOnce {
            return self.commit(&closed).await;
        }
        self.pending.extend(
            closed
                .into_iter()
                .map(|committable| (u64::MAX, committable)),
        );
        self.keep_pending()
    }

    async fn close(&mut self, stopped_with_savepoint: bool) -> WriteResult {
        self.recover().await?;
        if stopped_with_savepoint {
            if self.guarantee != DeliveryGuarantee::ExactlyOnce {
                // What is open came before the savepoint's barrier (the sources stopped
                // there), and no run after this one writes it again.
                let closed = self.writer.prepare_commit(None).await?;
                self.commit(&closed).await?;
            }
            // What the savepoint holds is committed; what came after its barrier (nothing,
            // the sources stopped there) is not.
            match self.completed {
                Some(savepoint) => self.commit_through(savepoint).await,
                None => Ok(()),
            }
        } else {
            // The job ended: the final checkpoint completed, or none is taken.
            self.commit_through(u64::MAX).await
        }
    }
}

type WriteResult = Result<(), ConnectorError>;

impl<T: 'static, C: StateValue> SinkWriter<T> for TwoPhaseWriter<T, C> {
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<T>,
        timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, WriteResult> {
        Box::pin(self.write_batch(batch, timestamps))
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, WriteResult> {
        Box::pin(TwoPhaseWriter::finish(self))
    }

    fn flush(&mut self, barrier: &CheckpointBarrier) -> LocalBoxFuture<'_, WriteResult> {
        Box::pin(self.barrier(*barrier))
    }

    fn notify_checkpoint_complete(&mut self, checkpoint: u64) -> LocalBoxFuture<'_, WriteResult> {
        Box::pin(self.completed(checkpoint))
    }

    fn close(&mut self, stopped_with_savepoint: bool) -> LocalBoxFuture<'_, WriteResult> {
        Box::pin(TwoPhaseWriter::close(self, stopped_with_savepoint))
    }
}
