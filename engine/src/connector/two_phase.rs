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
//!   for the next that completes). The commit runs on a task beside the writer, which writes
//!   on meanwhile; the checkpoints keep its committables until it returns, the next commit
//!   waits for it (a writer's commits keep their order), and its failure (or panic) fails the
//!   writer's next write, barrier, notice or end that finds it returned. A savepoint's
//!   completion commits nothing unless the job stops with it (Flink's rule: an intermediate
//!   savepoint has no side effects, since the job may recover from an older checkpoint).
//! - `at-least-once`: commit what the writer closed by itself (a rolling policy) at once, and
//!   what is open at the barrier, before the checkpoint's state is written: what a restore
//!   replays is written again.
//! - `none`: commit what the writer closed by itself and what is open at the end of the
//!   input; barriers do nothing, so what is open when the job fails is lost.
//!
//! A bounded job commits its last transactions at its end: after the final checkpoint
//! completed, or, unchecked, when its input ended.

use std::panic::{resume_unwind, AssertUnwindSafe};
use std::task::Poll;
use std::time::Duration;

use futures::FutureExt;

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
        committer: CommitterSlot::Idle(committer),
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
    committer: CommitterSlot<C>,
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

/// The committer, or the commit it runs beside the writer.
enum CommitterSlot<C> {
    Idle(Box<dyn Committer<C>>),
    /// Committing `committables` (which the checkpoints keep until it returns) on a task of
    /// its own, which hands the committer back.
    Busy {
        committables: Vec<C>,
        task: glommio::Task<Committed<C>>,
    },
    /// Between the two, inside a method.
    Moving,
}

/// What a commit beside the writer hands back: the committer and the commit's result, or the
/// panic that ended it (raised again in the writer's call, where the subtask's own panic
/// handling and restart strategy see it).
type Committed<C> = Result<(Box<dyn Committer<C>>, WriteResult), Box<dyn std::any::Any + Send>>;

/// Commits `committables`, retrying with a growing wait while the committer says a retry may
/// help.
async fn commit_with_retries<C: 'static>(
    committer: &mut dyn Committer<C>,
    sink: &str,
    committables: &[C],
) -> WriteResult {
    if committables.is_empty() {
        return Ok(());
    }
    let mut wait = Duration::from_millis(50);
    for attempt in 1.. {
        match committer.commit(committables).await {
            Ok(()) => return Ok(()),
            Err(CommitError::Fail(error)) => return Err(error),
            Err(CommitError::Retry(reason)) if attempt < COMMIT_TRIES => {
                tracing::warn!(sink = %sink, attempt, %reason, "commit failed; retrying");
                glommio::timer::sleep(wait).await;
                wait = (wait * 2).min(MAX_BACKOFF);
            }
            Err(CommitError::Retry(reason)) => {
                return Err(ConnectorError::external(format!(
                    "sink '{sink}' could not commit after {COMMIT_TRIES} tries: {reason}"
                )))
            }
        }
    }
    unreachable!("the loop returns")
}

impl<T: 'static, C: StateValue> TwoPhaseWriter<T, C> {
    async fn recover(&mut self) -> Result<(), ConnectorError> {
        let Some(recovery) = self.recovery.take() else {
            return Ok(());
        };
        let committer = self.idle_committer().await?;
        let share: Vec<C> = recovery
            .restored
            .iter()
            .enumerate()
            .filter(|(i, committable)| {
                let writer = committer.writer_of(committable).unwrap_or(*i);
                writer % recovery.parallelism == recovery.subtask
            })
            .map(|(_, committable)| committable.clone())
            .collect();
        self.commit(&share).await?;
        self.idle_committer()
            .await?
            .abort_lingering(&recovery.restored, &recovery.earlier)
            .await?;
        recovery.scopes.update(recovery.scope);
        Ok(())
    }

    /// The committer, once the commit running beside the writer (if any) returned; its
    /// failure, if it failed.
    async fn idle_committer(&mut self) -> Result<&mut dyn Committer<C>, ConnectorError> {
        if let CommitterSlot::Busy { .. } = self.committer {
            let CommitterSlot::Busy { task, .. } =
                std::mem::replace(&mut self.committer, CommitterSlot::Moving)
            else {
                unreachable!("checked")
            };
            let (committer, result) = task.await.unwrap_or_else(|panic| resume_unwind(panic));
            self.committer = CommitterSlot::Idle(committer);
            result?;
        }
        match &mut self.committer {
            CommitterSlot::Idle(committer) => Ok(committer.as_mut()),
            _ => unreachable!("the committer is back"),
        }
    }

    /// The failure of the commit running beside the writer, if it returned one by now.
    async fn commit_failure(&mut self) -> WriteResult {
        let CommitterSlot::Busy { task, .. } = &mut self.committer else {
            return Ok(());
        };
        let Poll::Ready(committed) = futures::poll!(task) else {
            return Ok(());
        };
        let (committer, result) = committed.unwrap_or_else(|panic| resume_unwind(panic));
        self.committer = CommitterSlot::Idle(committer);
        result
    }

    /// Commits `committables` (after the commit running beside the writer, if any).
    async fn commit(&mut self, committables: &[C]) -> WriteResult {
        if committables.is_empty() {
            return Ok(());
        }
        self.idle_committer().await?;
        let CommitterSlot::Idle(committer) = &mut self.committer else {
            unreachable!("idle")
        };
        commit_with_retries(committer.as_mut(), &self.sink, committables).await
    }

    /// Commits `committables` on a task beside the writer (after the one running, if any,
    /// so commits keep their order): the writer writes on meanwhile, and the checkpoints keep
    /// them until the commit returns.
    async fn commit_beside(&mut self, committables: Vec<C>) -> WriteResult {
        self.idle_committer().await?;
        let CommitterSlot::Idle(mut committer) =
            std::mem::replace(&mut self.committer, CommitterSlot::Moving)
        else {
            unreachable!("idle")
        };
        let (sink, running) = (self.sink.clone(), committables.clone());
        let task = glommio::spawn_local(
            AssertUnwindSafe(async move {
                let result = commit_with_retries(committer.as_mut(), &sink, &running).await;
                (committer, result)
            })
            .catch_unwind(),
        );
        self.committer = CommitterSlot::Busy { committables, task };
        Ok(())
    }

    /// Takes the pending transactions closed at or before `checkpoint`'s barrier.
    fn take_due(&mut self, checkpoint: u64) -> Vec<C> {
        let (due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(closed_at, _)| *closed_at <= checkpoint);
        self.pending = rest;
        due.into_iter()
            .map(|(_, committable)| committable)
            .collect()
    }

    /// Commits every pending transaction closed at or before `checkpoint`'s barrier.
    async fn commit_through(&mut self, checkpoint: u64) -> WriteResult {
        let due = self.take_due(checkpoint);
        self.commit(&due).await
    }

    async fn write_batch(&mut self, batch: &mut Vec<T>, timestamps: &[i64]) -> WriteResult {
        self.recover().await?;
        self.commit_failure().await?;
        self.writer.write(batch, timestamps).await?;
        if self.guarantee != DeliveryGuarantee::ExactlyOnce {
            let closed = self.writer.take_closed();
            self.commit(&closed).await?;
        }
        Ok(())
    }

    async fn barrier(&mut self, barrier: CheckpointBarrier) -> WriteResult {
        self.recover().await?;
        self.commit_failure().await?;
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
        self.commit_failure().await?;
        self.completed = self.completed.max(Some(checkpoint));
        if let Some(at) = self.savepoints.iter().position(|&s| s == checkpoint) {
            // Committed by the next checkpoint, or when the job stops with this savepoint.
            self.savepoints.remove(at);
            return Ok(());
        }
        let due = self.take_due(checkpoint);
        if due.is_empty() {
            return Ok(());
        }
        self.commit_beside(due).await
    }

    /// Puts the committables not committed yet (those of the commit running beside the
    /// writer, then the pending ones) into the sink's state, for the next snapshot.
    fn keep_pending(&mut self) -> WriteResult {
        let committing = match &self.committer {
            CommitterSlot::Busy { committables, .. } => committables.as_slice(),
            CommitterSlot::Idle(_) => &[],
            CommitterSlot::Moving => unreachable!("a writer's call was dropped mid-commit"),
        };
        let encoded = committing
            .iter()
            .chain(self.pending.iter().map(|(_, committable)| committable))
            .map(|committable| {
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
        self.commit_failure().await?;
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
        // What commits beside the writer is done before the subtask ends.
        self.idle_committer().await?;
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::NO_TIMESTAMP;

    /// A sink whose transactions are numbered as they close, and whose committer waits until
    /// its gate opens (and then fails, if told to).
    #[derive(Default)]
    struct Gated {
        open: Arc<AtomicBool>,
        fail: Arc<AtomicBool>,
        /// Set as a commit returns.
        returned: Arc<AtomicBool>,
        committed: Arc<Mutex<Vec<u64>>>,
    }

    struct Numbered {
        next: u64,
        written: bool,
    }

    impl TransactionWriter<u64, u64> for Numbered {
        fn write<'a>(
            &'a mut self,
            batch: &'a mut Vec<u64>,
            _timestamps: &'a [i64],
        ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
            batch.clear();
            self.written = true;
            Box::pin(std::future::ready(Ok(())))
        }

        fn prepare_commit(
            &mut self,
            _checkpoint: Option<u64>,
        ) -> LocalBoxFuture<'_, Result<Vec<u64>, ConnectorError>> {
            let closed = match std::mem::take(&mut self.written) {
                true => vec![self.next],
                false => Vec::new(),
            };
            self.next += closed.len() as u64;
            Box::pin(std::future::ready(Ok(closed)))
        }
    }

    struct GatedCommitter {
        open: Arc<AtomicBool>,
        fail: Arc<AtomicBool>,
        returned: Arc<AtomicBool>,
        committed: Arc<Mutex<Vec<u64>>>,
    }

    impl Committer<u64> for GatedCommitter {
        fn commit<'a>(
            &'a mut self,
            committables: &'a [u64],
        ) -> LocalBoxFuture<'a, Result<(), CommitError>> {
            Box::pin(async move {
                while !self.open.load(Ordering::Relaxed) {
                    glommio::timer::sleep(Duration::from_millis(1)).await;
                }
                let result = match self.fail.load(Ordering::Relaxed) {
                    true => Err(CommitError::Fail(ConnectorError::external("refused"))),
                    false => {
                        self.committed.lock().unwrap().extend(committables);
                        Ok(())
                    }
                };
                self.returned.store(true, Ordering::Relaxed);
                result
            })
        }

        fn abort_lingering<'a>(
            &'a mut self,
            _keep: &'a [u64],
            _earlier: &'a [String],
        ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
            Box::pin(std::future::ready(Ok(())))
        }
    }

    impl TwoPhaseCommitSink<u64> for Gated {
        type Committable = u64;

        fn create_writer(
            &self,
            _ctx: &RuntimeContext,
        ) -> Result<Box<dyn TransactionWriter<u64, u64>>, ConnectorError> {
            Ok(Box::new(Numbered {
                next: 0,
                written: false,
            }))
        }

        fn create_committer(
            &self,
            _ctx: &RuntimeContext,
        ) -> Result<Box<dyn Committer<u64>>, ConnectorError> {
            Ok(Box::new(GatedCommitter {
                open: Arc::clone(&self.open),
                fail: Arc::clone(&self.fail),
                returned: Arc::clone(&self.returned),
                committed: Arc::clone(&self.committed),
            }))
        }

        fn delivery_guarantee(&self) -> Option<DeliveryGuarantee> {
            None
        }
    }

    /// The committables a snapshot of the sink would keep now.
    fn held(ctx: &RuntimeContext) -> Vec<u64> {
        let state = ctx
            .operator_state()
            .union_list_state(&ListStateDescriptor::<Vec<u8>>::new(COMMITTABLES))
            .unwrap();
        state
            .get()
            .iter()
            .map(|b| u64::decode(b).unwrap())
            .collect()
    }

    /// Runs `steps` on an executor; a step that hangs fails the test after 30 s.
    fn on_executor(steps: impl FnOnce() -> LocalBoxFuture<'static, ()> + Send + 'static) {
        glommio::LocalExecutorBuilder::default()
            .spawn(|| async move {
                let limit = glommio::timer::sleep(Duration::from_secs(30));
                if let futures::future::Either::Right(_) =
                    futures::future::select(steps(), Box::pin(limit)).await
                {
                    panic!("the steps did not finish in 30 s");
                }
            })
            .unwrap()
            .join()
            .unwrap();
    }

    /// A completed checkpoint's commit runs beside the writer, which writes on; a checkpoint
    /// taken meanwhile keeps what it commits; the next commit waits for it (commits keep
    /// their order); the subtask's end waits for both.
    #[test]
    fn a_commit_runs_beside_the_writer_and_checkpoints_keep_it_until_it_returns() {
        on_executor(|| {
            Box::pin(async {
                let sink = Gated::default();
                let ctx = RuntimeContext::new("sink", 0, 1, 128);
                let mut writer = two_phase_writer(&sink, &ctx).unwrap();
                let barrier = CheckpointBarrier::checkpoint;
                writer.write(&mut vec![1], &[NO_TIMESTAMP]).await.unwrap();
                writer.flush(&barrier(1)).await.unwrap();
                writer.notify_checkpoint_complete(1).await.unwrap();
                assert!(
                    sink.committed.lock().unwrap().is_empty(),
                    "still committing"
                );
                writer.write(&mut vec![2], &[NO_TIMESTAMP]).await.unwrap();
                writer.flush(&barrier(2)).await.unwrap();
                assert_eq!(
                    held(&ctx),
                    [0, 1],
                    "the one committing, and the pending one"
                );
                sink.open.store(true, Ordering::Relaxed);
                writer.notify_checkpoint_complete(2).await.unwrap();
                while !sink.returned.load(Ordering::Relaxed)
                    || sink.committed.lock().unwrap().len() < 2
                {
                    glommio::timer::sleep(Duration::from_millis(1)).await;
                }
                writer.flush(&barrier(3)).await.unwrap();
                assert_eq!(held(&ctx), [] as [u64; 0], "committed: no longer kept");
                writer.close(false).await.unwrap();
                assert_eq!(*sink.committed.lock().unwrap(), [0, 1]);
            })
        });
    }

    /// A commit that fails beside the writer fails the writer's next call that finds it
    /// returned, and its end.
    #[test]
    fn a_commit_failing_beside_the_writer_fails_the_subtask() {
        on_executor(|| {
            Box::pin(async {
                let sink = Gated::default();
                sink.fail.store(true, Ordering::Relaxed);
                let ctx = RuntimeContext::new("sink", 0, 1, 128);
                let mut writer = two_phase_writer(&sink, &ctx).unwrap();
                writer.write(&mut vec![1], &[NO_TIMESTAMP]).await.unwrap();
                writer
                    .flush(&CheckpointBarrier::checkpoint(1))
                    .await
                    .unwrap();
                writer.notify_checkpoint_complete(1).await.unwrap();
                writer.write(&mut vec![2], &[NO_TIMESTAMP]).await.unwrap();
                sink.open.store(true, Ordering::Relaxed);
                // The next write that finds the commit returned fails.
                let error = loop {
                    match writer.write(&mut vec![3], &[NO_TIMESTAMP]).await {
                        Err(error) => break error,
                        Ok(()) => glommio::timer::sleep(Duration::from_millis(1)).await,
                    }
                };
                assert!(error.message.contains("refused"), "{}", error.message);
                assert!(sink.committed.lock().unwrap().is_empty());
            })
        });
    }
}
