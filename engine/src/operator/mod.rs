//! Operators and how chained operators pass records to each other.
//!
//! Every operator implements [`Operator`]; inside a chain, an [`OperatorLink`] drives one
//! operator over a batch of input records and hands its output batch to the next link (a
//! function call, records moved by value). The last link of a chain hands its output to a
//! sink or to an exchange writer, which is where records leave the shard's memory.
//!
//! Links are asynchronous because an exchange writer may have to wait for credit: when it does,
//! the whole chain above it waits with it, which is how backpressure reaches the source.
//!
//! Everything else that travels down a chain — watermarks, idleness, processing time, the
//! buffer timeout's flush, the end of input — is a [`ChainEvent`], handed through one method,
//! [`Output::event`], in order with the records: the operator link calls its operator's hook,
//! sends on what the operator emitted, then passes the event to its side outputs and the next
//! link; a filter or a fan-out passes it on as it is. Checkpoint barriers are meant to travel
//! the same way, changing only the outputs that act on them.

pub(crate) mod batch;
mod fan_out;
mod filter;
mod flat_map;
mod map;
pub(crate) mod process;
mod reduce;
pub(crate) mod scope;

use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;

pub use batch::OutputTag;
pub(crate) use batch::{Batch, Emitter, SideOutputs, Taking};
pub(crate) use fan_out::FanOut;
pub(crate) use filter::FilterLink;
pub(crate) use flat_map::FlatMapOperator;
pub(crate) use map::MapOperator;
pub(crate) use process::{KeyedProcessOperator, ProcessOperator};
pub(crate) use reduce::ReduceOperator;

use crate::checkpoint::task_state::TaskStateId;
use crate::checkpoint::task_state::{OperatorSnapshot, TaskState};
use crate::checkpoint::CheckpointBarrier;
use crate::connector::SinkSettings;
use crate::error::{TaskError, TaskResult};
use crate::metrics::OperatorMetrics;
use crate::record::{LatencyMarker, Watermark};
use crate::state::{OperatorStateId, StateEnv};
use crate::time;
use weir_state::OperatorStateStore;

pub(crate) use futures::future::LocalBoxFuture;

/// The future of an `Output` call that has nothing to do (an end of a chain that ignores it).
pub(crate) fn nothing_to_do<'a>() -> LocalBoxFuture<'a, TaskResult> {
    Box::pin(std::future::ready(Ok(())))
}

/// What a subtask knows about itself; handed to user functions that ask for it.
#[derive(Clone, Debug)]
pub struct RuntimeContext {
    /// The job's name.
    pub job_name: Arc<str>,
    /// The operator's name.
    pub operator_name: Arc<str>,
    /// This subtask's index, in `0..parallelism`.
    pub subtask: usize,
    /// The operator's parallelism.
    pub parallelism: usize,
    /// The job's maximum parallelism (number of key groups).
    pub max_parallelism: usize,
    /// The job's `sink.*` settings: what a sink that sets none of its own follows.
    pub sinks: SinkSettings,
    /// Where a keyed operator's state lives.
    pub(crate) state: StateEnv,
    /// Names this subtask's operator (non-keyed) state on its shard.
    pub(crate) operator_state: OperatorStateId,
    /// Names the state of the task this operator runs in: where its snapshots go, and what it
    /// restores from.
    pub(crate) task: TaskStateId,
}

impl RuntimeContext {
    /// The context of subtask `subtask` of `parallelism` of `operator_name`, with heap state:
    /// for testing a source, sink or function outside a job.
    pub fn new(
        operator_name: &str,
        subtask: usize,
        parallelism: usize,
        max_parallelism: usize,
    ) -> Self {
        RuntimeContext {
            job_name: "job".into(),
            operator_name: operator_name.into(),
            subtask,
            parallelism,
            max_parallelism,
            sinks: SinkSettings::default(),
            state: StateEnv::default(),
            operator_state: OperatorStateId::fresh(),
            task: TaskStateId::detached(),
        }
    }

    /// This subtask's share of the list-like part `name` (each part decoded to its elements by
    /// `decode`) in the checkpoint the job resumes from (`None`: it does not resume): the
    /// elements its own subtask wrote, or, restoring at another parallelism, an even share of
    /// every old subtask's.
    pub(crate) fn restored_share<T, E>(
        &self,
        name: &str,
        decode: impl FnMut(&[u8]) -> Result<Vec<T>, E>,
    ) -> Option<Result<Vec<T>, E>> {
        let task = self.task.get();
        let parts = task.restored_for(&self.state.operator_id, name, self.parallelism)?;
        Some(parts.share(decode))
    }

    /// Calls `read` with the part `name` of every subtask of this operator in the checkpoint
    /// the job resumes from (keyed state, which each subtask filters by the key groups it
    /// owns), as the restored checkpoint holds them: a keyed part can be a whole state, so
    /// it is lent, not copied.
    pub(crate) fn with_restored_of_all<R>(
        &self,
        name: &str,
        read: impl FnOnce(&[Bytes]) -> R,
    ) -> R {
        let task = self.task.get();
        read(&task.restored_of_all(&self.state.operator_id, name))
    }

    /// The parts `name` of this operator that stand for files of the checkpoint the job
    /// resumes from (RocksDB's), of every old subtask (`None`: none).
    pub(crate) fn restored_native(
        &self,
        name: &str,
    ) -> Option<crate::checkpoint::task_state::RestoredNative> {
        self.task
            .get()
            .restored_native(&self.state.operator_id, name)
    }

    /// This subtask's operator state (Flink's `OperatorStateStore`): list state (split evenly
    /// across subtasks when the parallelism changes), union list state and broadcast state, for
    /// sources, sinks and functions without a key. One store per operator subtask; handles
    /// belong to the subtask's shard, so a source reader or sink writer may keep them, while a
    /// function (cloned to every subtask) takes them from here per call. Snapshots of it
    /// (`OperatorStateStore::snapshot`) are what checkpoints will persist; until a job is
    /// checkpointed, its contents live as long as the run.
    /// The store belongs to the subtask's shard: called on another thread (a context cloned
    /// there), this gives that thread's own, separate store.
    pub fn operator_state(&self) -> Rc<OperatorStateStore> {
        self.operator_state.store()
    }
}

/// What passes down a chain besides records, in order with them. Every [`Output`] takes all
/// of them through [`Output::event`]: a link that only passes them on forwards whatever comes,
/// so a new kind of event changes only the outputs that act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChainEvent {
    /// Event time advanced.
    Watermark(Watermark),
    /// The stream became idle (no records or watermarks for a while: it no longer holds event
    /// time back downstream) or active again.
    WatermarkStatus {
        /// Idle (else active again).
        idle: bool,
    },
    /// The wall clock reached this time (ms since the epoch): fire processing-time timers due.
    ProcessingTime(i64),
    /// Send on whatever is buffered (the buffer timeout expired).
    Flush,
    /// The input has ended: emit what is left (`Operator::finish`). No records follow; with
    /// checkpointing on, the final checkpoint's barrier and notice still do (Flink's
    /// end of data, then the checkpoint after tasks finish).
    Finish,
    /// After `Finish` (and the final checkpoint's notice, when the job is checkpointed): the
    /// task ends, and its exchange writers end their channels.
    End,
    /// The job stops with a savepoint (`StopMode::Suspend`): close without emitting what is
    /// left — open windows and timers are in the savepoint, to fire after it is restored.
    Suspend,
    /// A checkpoint barrier: every operator writes its state as it is after the records before
    /// the barrier (`Operator::snapshot_state`), then passes the barrier on.
    Barrier(CheckpointBarrier),
    /// This checkpoint completed (`Operator::notify_checkpoint_complete`): it came from the
    /// sources, behind the data that was before them when they heard of it.
    CheckpointComplete(u64),
    /// This checkpoint was aborted (`Operator::notify_checkpoint_aborted`).
    CheckpointAborted(u64),
    /// A latency marker: passed on at once, to every output; sinks take its age.
    LatencyMarker(LatencyMarker),
}

/// The receiving end of a stream of `T` inside a task: a chained operator, a fan-out, a sink
/// or an exchange writer.
pub(crate) trait Output<T> {
    /// Takes every record out of `batch` (leaving it empty, capacity kept).
    fn push<'a>(&'a mut self, batch: &'a mut Batch<T>) -> LocalBoxFuture<'a, TaskResult>;
    /// Handles `event`, which comes after every record pushed before it, and passes it on.
    fn event(&mut self, event: ChainEvent) -> LocalBoxFuture<'_, TaskResult>;
    /// The earliest processing-time timer registered here or downstream in the chain.
    fn next_processing_time(&self) -> Option<i64>;
}

/// One operator of a chain. Records go in one at a time, with their timestamps; what the
/// operator emits is collected into `out`, which the driving [`OperatorLink`] hands downstream.
pub(crate) trait Operator<I, O>: 'static {
    /// Called once on the shard before the first record.
    fn open(&mut self, _ctx: &RuntimeContext) {}
    /// Hands the operator its metrics (before `open`), for operators that count more than
    /// records in and out.
    fn bind_metrics(&mut self, _metrics: &Arc<OperatorMetrics>) {}
    /// Handles one record (`timestamp` is `NO_TIMESTAMP` if it has none).
    fn process_element(&mut self, record: I, timestamp: i64, out: &mut Emitter<O>);

    /// Whether each record yields at most one record (map, filter, reduce). The link then hands
    /// a whole batch to [`Operator::process_batch`] at once: its output cannot outgrow the batch.
    const AT_MOST_ONE_PER_RECORD: bool = false;

    /// Handles every record of `batch`, leaving it empty. Operators override this with a tight
    /// loop the compiler can vectorize; only called when `AT_MOST_ONE_PER_RECORD`.
    #[inline]
    fn process_batch(&mut self, batch: &mut Batch<I>, out: &mut Emitter<O>) {
        for (record, timestamp) in batch.drain() {
            self.process_element(record, timestamp, out);
        }
    }
    /// Event time advanced (fire event-time timers and windows); the watermark itself is
    /// forwarded by the link afterwards.
    fn on_watermark(&mut self, _watermark: Watermark, _out: &mut Emitter<O>) {}
    /// The wall clock reached `now`: fire processing-time timers due.
    fn on_processing_time(&mut self, _now: i64, _out: &mut Emitter<O>) {}
    /// The earliest processing-time timer this operator holds.
    fn next_processing_time(&self) -> Option<i64> {
        None
    }
    /// The buffer timeout expired: emit what is held back to be sent in fewer records (a
    /// local pre-aggregation), so that it leaves with the flush.
    fn flush(&mut self, _out: &mut Emitter<O>) {}
    /// The input ended; emit anything held back.
    fn finish(&mut self, _out: &mut Emitter<O>) {}

    /// A checkpoint barrier is about to pass: emit what is held back to be sent later (as at a
    /// flush), so that it goes out ahead of the barrier.
    fn prepare_snapshot_pre_barrier(&mut self, out: &mut Emitter<O>) {
        self.flush(out);
    }
    /// Writes the operator's state as it is when the barrier passes into `snapshot`: its keyed
    /// state and timers, anything it keeps itself. Its operator state (`RuntimeContext::
    /// operator_state`) is written by the link. A restored operator reads its parts back in
    /// `open` (`RuntimeContext::restored`).
    fn snapshot_state(&mut self, _snapshot: &mut OperatorSnapshot) -> Result<(), String> {
        Ok(())
    }
    /// Checkpoint `checkpoint` completed (in increasing order; a newer one covers older ones
    /// whose notice did not come).
    fn notify_checkpoint_complete(&mut self, _checkpoint: u64) {}
    /// Checkpoint `checkpoint` was aborted.
    fn notify_checkpoint_aborted(&mut self, _checkpoint: u64) {}
    /// What this operator holds that checkpoints cannot write yet, if anything: a job with
    /// checkpointing on is refused at its start, naming it.
    fn unsupported_state(&self) -> Option<&'static str> {
        None
    }
}

/// Drives one operator inside a chain and passes its output on.
pub(crate) struct OperatorLink<O, Op> {
    operator: Op,
    out: Emitter<O>,
    next: Box<dyn Output<O>>,
    batch_size: usize,
    metrics: Arc<OperatorMetrics>,
    /// Where the operator's snapshot goes when a barrier passes, under its operator id.
    task: Rc<TaskState>,
    operator_id: Arc<str>,
    operator_state: OperatorStateId,
}

impl<O, Op> OperatorLink<O, Op> {
    pub(crate) fn new<I>(
        mut operator: Op,
        ctx: &RuntimeContext,
        next: Box<dyn Output<O>>,
        side: SideOutputs,
        batch_size: usize,
        metrics: Arc<OperatorMetrics>,
    ) -> Self
    where
        Op: Operator<I, O>,
    {
        operator.bind_metrics(&metrics);
        {
            let _scope = scope::enter(&metrics.name);
            operator.open(ctx);
        }
        OperatorLink {
            operator,
            out: Emitter::new(batch_size, side),
            next,
            batch_size,
            metrics,
            task: ctx.task.get(),
            operator_id: Arc::clone(&ctx.state.operator_id),
            operator_state: ctx.operator_state,
        }
    }
}

/// Writes a snapshot of one operator at a barrier into its task's state: what the operator
/// writes itself (`Operator::snapshot_state` via `write`), then its operator state if it has
/// any. Shared by operator links, sources and sinks.
pub(crate) fn snapshot_operator(
    barrier: CheckpointBarrier,
    task: &TaskState,
    operator_id: &Arc<str>,
    operator_state: OperatorStateId,
    name: &str,
    write: impl FnOnce(&mut OperatorSnapshot) -> Result<(), String>,
) -> TaskResult {
    let _scope = scope::enter(name);
    let mut snapshot = OperatorSnapshot::new(barrier.kind);
    let fail = |error: String| {
        TaskError::user(format!("cannot snapshot its state: {error}")).in_operator(name)
    };
    write(&mut snapshot).map_err(fail)?;
    if let Some(store) = operator_state.existing() {
        if !store.state_names().is_empty() {
            let bytes = store
                .snapshot()
                .and_then(|snapshot| snapshot.to_bytes())
                .map_err(|error| fail(error.to_string()))?;
            snapshot.add(crate::checkpoint::task_state::PART_OPERATOR_STATE, bytes);
        }
    }
    task.add(operator_id, snapshot);
    Ok(())
}

impl<O: 'static, Op> OperatorLink<O, Op> {
    /// Hands the operator records from `records` until its main output holds a batch or the
    /// input is used up (true then). Synchronous, so that a record goes from its slot to the
    /// operator: read inside the async `push`, a record lives in the future's state across the
    /// loop's await, and a large one (a 160-byte Nexmark event) is copied there and out again.
    #[inline]
    fn process_until_full<I>(&mut self, records: &mut Taking<'_, I>) -> bool
    where
        Op: Operator<I, O>,
    {
        let _scope = scope::enter(&self.metrics.name);
        for (record, timestamp) in records {
            self.operator
                .process_element(record, timestamp, &mut self.out);
            if self.out.main.len() >= self.batch_size {
                return false;
            }
        }
        true
    }

    /// Sends what the operator emitted on: the main output, then the side outputs.
    async fn emit(&mut self) -> TaskResult {
        for mut chunk in self.out.main.take_spilled() {
            self.metrics.records_out.add(chunk.len() as u64);
            self.next.push(&mut chunk).await?;
        }
        if !self.out.main.is_empty() {
            self.metrics.records_out.add(self.out.main.len() as u64);
            self.next.push(&mut self.out.main).await?;
        }
        if !self.out.side.is_empty() {
            self.out.side.push_all().await?;
        }
        Ok(())
    }
}

impl<I, O: 'static, Op: Operator<I, O>> Output<I> for OperatorLink<O, Op> {
    fn push<'a>(&'a mut self, batch: &'a mut Batch<I>) -> LocalBoxFuture<'a, TaskResult> {
        Box::pin(async move {
            self.metrics.records_in.add(batch.len() as u64);
            time::new_stretch();
            if Op::AT_MOST_ONE_PER_RECORD {
                let _scope = scope::enter(&self.metrics.name);
                self.operator.process_batch(batch, &mut self.out);
            } else {
                let mut records = batch.drain();
                while !self.process_until_full(&mut records) {
                    self.emit().await?;
                    time::new_stretch();
                }
            }
            self.emit().await
        })
    }

    fn event(&mut self, event: ChainEvent) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(async move {
            let emitted = {
                let _scope = scope::enter(&self.metrics.name);
                let out = &mut self.out;
                match event {
                    ChainEvent::Watermark(watermark) => {
                        self.operator.on_watermark(watermark, out);
                        true
                    }
                    ChainEvent::WatermarkStatus { .. } => false,
                    ChainEvent::ProcessingTime(now) => {
                        let due = self
                            .operator
                            .next_processing_time()
                            .is_some_and(|t| t <= now);
                        if due {
                            self.operator.on_processing_time(now, out);
                        }
                        due
                    }
                    ChainEvent::Flush => {
                        self.operator.flush(out);
                        true
                    }
                    ChainEvent::Finish => {
                        self.operator.finish(out);
                        true
                    }
                    ChainEvent::Suspend | ChainEvent::End => false,
                    ChainEvent::Barrier(_) => {
                        self.operator.prepare_snapshot_pre_barrier(out);
                        true
                    }
                    ChainEvent::CheckpointComplete(checkpoint) => {
                        self.operator.notify_checkpoint_complete(checkpoint);
                        false
                    }
                    ChainEvent::CheckpointAborted(checkpoint) => {
                        self.operator.notify_checkpoint_aborted(checkpoint);
                        false
                    }
                    ChainEvent::LatencyMarker(_) => false,
                }
            };
            if emitted {
                self.emit().await?;
            }
            if let ChainEvent::Barrier(barrier) = event {
                let operator = &mut self.operator;
                snapshot_operator(
                    barrier,
                    &self.task,
                    &self.operator_id,
                    self.operator_state,
                    &self.metrics.name,
                    |snapshot| operator.snapshot_state(snapshot),
                )?;
            }
            self.out.side.pass_on(&mut *self.next, event).await
        })
    }

    fn next_processing_time(&self) -> Option<i64> {
        [
            self.operator.next_processing_time(),
            self.next.next_processing_time(),
            self.out.side.next_processing_time(),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::metrics::MetricsRegistry;
    use crate::record::NO_TIMESTAMP;

    /// What a recording output saw, in order.
    #[derive(Clone, Debug, PartialEq)]
    enum Seen {
        Records(Vec<u64>),
        Event(ChainEvent),
    }

    /// Records what reaches it.
    struct Recorder(Log);

    impl Output<u64> for Recorder {
        fn push<'a>(&'a mut self, batch: &'a mut Batch<u64>) -> LocalBoxFuture<'a, TaskResult> {
            let records = batch.drain().map(|(record, _)| record).collect();
            self.0.borrow_mut().push(Seen::Records(records));
            nothing_to_do()
        }

        fn event(&mut self, event: ChainEvent) -> LocalBoxFuture<'_, TaskResult> {
            self.0.borrow_mut().push(Seen::Event(event));
            nothing_to_do()
        }

        fn next_processing_time(&self) -> Option<i64> {
            None
        }
    }

    /// What a recorder saw, shared with the test.
    type Log = Rc<RefCell<Vec<Seen>>>;

    fn recorder() -> (Box<dyn Output<u64>>, Log) {
        let seen = Rc::new(RefCell::new(Vec::new()));
        (Box::new(Recorder(Rc::clone(&seen))), seen)
    }

    /// Adds one to each record, copies it to the side output "copies", and emits a 1000 at
    /// each watermark, flush and end of input: what an operator emits on an event goes ahead
    /// of the event.
    struct PlusOne(OutputTag<u64>);

    impl Operator<u64, u64> for PlusOne {
        fn process_element(&mut self, record: u64, timestamp: i64, out: &mut Emitter<u64>) {
            out.main.push(record + 1, timestamp);
            out.side.emit(&self.0, record, timestamp);
        }
        fn on_watermark(&mut self, _watermark: Watermark, out: &mut Emitter<u64>) {
            out.main.push(1000, NO_TIMESTAMP);
        }
        fn flush(&mut self, out: &mut Emitter<u64>) {
            out.main.push(1000, NO_TIMESTAMP);
        }
        fn finish(&mut self, out: &mut Emitter<u64>) {
            out.main.push(1000, NO_TIMESTAMP);
        }
    }

    /// Every kind of event goes down a filter, a fan-out, an operator and the operator's side
    /// output, after the records pushed before it and in the order it came.
    /// A fan-out to a recorder (`direct`) and to `PlusOne`, whose main and side outputs are
    /// recorders (`plus`, `side`): the fan-out, and the three logs.
    fn fan_out_to_plus_one(metrics: &Arc<OperatorMetrics>) -> (FanOut<u64>, [Log; 3]) {
        let ctx = RuntimeContext::new("test", 0, 1, 128);
        let (side_out, side_seen) = recorder();
        let mut side = SideOutputs::default();
        side.add(Arc::from("copies"), side_out);
        let (plus_out, plus_seen) = recorder();
        let plus = OperatorLink::new(
            PlusOne(OutputTag::new("copies")),
            &ctx,
            plus_out,
            side,
            4,
            Arc::clone(metrics),
        );
        let (direct, direct_seen) = recorder();
        let fan_out = FanOut::new(vec![direct, Box::new(plus)]);
        (fan_out, [direct_seen, plus_seen, side_seen])
    }

    #[test]
    fn every_event_reaches_every_output_in_order_with_the_records() {
        let metrics = MetricsRegistry::default().register(0, "test", 0);
        let (fan_out, [direct_seen, plus_seen, side_seen]) = fan_out_to_plus_one(&metrics);
        let mut chain = FilterLink::new(
            |n: &u64| n.is_multiple_of(2),
            Box::new(fan_out),
            SideOutputs::default(),
            metrics,
        );
        let events = [
            ChainEvent::Watermark(Watermark(10)),
            ChainEvent::WatermarkStatus { idle: true },
            ChainEvent::ProcessingTime(5),
            ChainEvent::Flush,
            ChainEvent::Suspend,
            ChainEvent::Finish,
            ChainEvent::End,
        ];
        futures::executor::block_on(async {
            for (round, &event) in events.iter().enumerate() {
                let mut batch = Batch::default();
                for n in [1, 2, 3, 4] {
                    batch.push(n + 10 * round as u64, NO_TIMESTAMP);
                }
                chain.push(&mut batch).await.unwrap();
                chain.event(event).await.unwrap();
            }
        });
        let evens = |round: u64| vec![2 + 10 * round, 4 + 10 * round];
        let mut direct = Vec::new();
        let mut plus = Vec::new();
        let mut side = Vec::new();
        for (round, &event) in events.iter().enumerate() {
            let round = round as u64;
            direct.extend([Seen::Records(evens(round)), Seen::Event(event)]);
            plus.push(Seen::Records(evens(round).iter().map(|n| n + 1).collect()));
            // What the operator emitted on the event, ahead of it.
            if matches!(
                event,
                ChainEvent::Watermark(_) | ChainEvent::Flush | ChainEvent::Finish
            ) {
                plus.push(Seen::Records(vec![1000]));
            }
            plus.push(Seen::Event(event));
            side.extend([Seen::Records(evens(round)), Seen::Event(event)]);
        }
        assert_eq!(
            *direct_seen.borrow(),
            direct,
            "the fan-out's direct consumer"
        );
        assert_eq!(*plus_seen.borrow(), plus, "after the operator");
        assert_eq!(*side_seen.borrow(), side, "the operator's side output");
    }

    #[test]
    fn each_latency_marker_takes_one_output_in_turn() {
        let metrics = MetricsRegistry::default().register(0, "test", 0);
        let (mut fan_out, [direct_seen, plus_seen, side_seen]) = fan_out_to_plus_one(&metrics);
        let marker = |n: i64| {
            ChainEvent::LatencyMarker(LatencyMarker {
                marked_ms: n,
                source: 0,
                subtask: 0,
            })
        };
        futures::executor::block_on(async {
            for n in 0..6 {
                fan_out.event(marker(n)).await.unwrap();
            }
        });
        let seen = |log: &Log| -> Vec<Seen> { log.borrow().clone() };
        // The fan-out alternates; behind it, the operator alternates its main and side output.
        assert_eq!(
            seen(&direct_seen),
            [0, 2, 4].map(|n| Seen::Event(marker(n)))
        );
        assert_eq!(seen(&plus_seen), [1, 5].map(|n| Seen::Event(marker(n))));
        assert_eq!(seen(&side_seen), [Seen::Event(marker(3))]);
    }
}
