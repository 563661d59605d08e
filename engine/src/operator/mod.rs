//! Operators and how chained operators pass records to each other.
//!
//! Every operator implements [`Operator`]; inside a chain, an [`OperatorLink`] drives one
//! operator over a batch of input records and hands its output batch to the next link (a
//! function call, records moved by value). The last link of a chain hands its output to a
//! sink or to an exchange writer, which is where records leave the shard's memory.
//!
//! Links are asynchronous because an exchange writer may have to wait for credit: when it does,
//! the whole chain above it waits with it, which is how backpressure reaches the source.

pub(crate) mod batch;
mod fan_out;
mod filter;
mod flat_map;
mod map;
mod process;
mod reduce;
pub(crate) mod scope;

use std::rc::Rc;
use std::sync::Arc;

pub use batch::OutputTag;
pub(crate) use batch::{Batch, Emitter, ErasedOutput, SideOutputs, Taking};
pub(crate) use fan_out::FanOut;
pub(crate) use filter::FilterLink;
pub(crate) use flat_map::FlatMapOperator;
pub(crate) use map::MapOperator;
pub(crate) use process::{KeyedProcessOperator, ProcessOperator};
pub(crate) use reduce::ReduceOperator;

use crate::error::TaskResult;
use crate::metrics::OperatorMetrics;
use crate::record::Watermark;
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
    /// The operator's name.
    pub operator_name: Arc<str>,
    /// This subtask's index, in `0..parallelism`.
    pub subtask: usize,
    /// The operator's parallelism.
    pub parallelism: usize,
    /// The job's maximum parallelism (number of key groups).
    pub max_parallelism: usize,
    /// Where a keyed operator's state lives.
    pub(crate) state: StateEnv,
    /// Names this subtask's operator (non-keyed) state on its shard.
    pub(crate) operator_state: OperatorStateId,
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
            operator_name: operator_name.into(),
            subtask,
            parallelism,
            max_parallelism,
            state: StateEnv::default(),
            operator_state: OperatorStateId::fresh(),
        }
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

/// The receiving end of a stream of `T` inside a task: a chained operator, a fan-out, a sink
/// or an exchange writer.
pub(crate) trait Output<T> {
    /// Takes every record out of `batch` (leaving it empty, capacity kept).
    fn push<'a>(&'a mut self, batch: &'a mut Batch<T>) -> LocalBoxFuture<'a, TaskResult>;
    /// Event time advanced.
    fn watermark(&mut self, watermark: Watermark) -> LocalBoxFuture<'_, TaskResult>;
    /// The stream became idle (no records or watermarks for a while: it no longer holds event
    /// time back downstream) or active again.
    fn watermark_status(&mut self, idle: bool) -> LocalBoxFuture<'_, TaskResult>;
    /// The wall clock reached `now` (ms since the epoch): fire processing-time timers due.
    fn processing_time(&mut self, now: i64) -> LocalBoxFuture<'_, TaskResult>;
    /// The earliest processing-time timer registered here or downstream in the chain.
    fn next_processing_time(&self) -> Option<i64>;
    /// Sends on whatever is buffered (the buffer timeout expired).
    fn flush(&mut self) -> LocalBoxFuture<'_, TaskResult>;
    /// The input has ended: emit what is left and close.
    fn finish(&mut self) -> LocalBoxFuture<'_, TaskResult>;
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
}

/// Drives one operator inside a chain and passes its output on.
pub(crate) struct OperatorLink<O, Op> {
    operator: Op,
    out: Emitter<O>,
    next: Box<dyn Output<O>>,
    batch_size: usize,
    metrics: Arc<OperatorMetrics>,
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
        }
    }
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

    fn watermark(&mut self, watermark: Watermark) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(async move {
            {
                let _scope = scope::enter(&self.metrics.name);
                self.operator.on_watermark(watermark, &mut self.out);
            }
            self.emit().await?;
            for side in self.out.side.outputs() {
                side.watermark(watermark).await?;
            }
            self.next.watermark(watermark).await
        })
    }

    fn watermark_status(&mut self, idle: bool) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(async move {
            for side in self.out.side.outputs() {
                side.watermark_status(idle).await?;
            }
            self.next.watermark_status(idle).await
        })
    }

    fn processing_time(&mut self, now: i64) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(async move {
            if self
                .operator
                .next_processing_time()
                .is_some_and(|t| t <= now)
            {
                {
                    let _scope = scope::enter(&self.metrics.name);
                    self.operator.on_processing_time(now, &mut self.out);
                }
                self.emit().await?;
            }
            for side in self.out.side.outputs() {
                side.processing_time(now).await?;
            }
            self.next.processing_time(now).await
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

    fn flush(&mut self) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(async move {
            {
                let _scope = scope::enter(&self.metrics.name);
                self.operator.flush(&mut self.out);
            }
            self.emit().await?;
            for side in self.out.side.outputs() {
                side.flush().await?;
            }
            self.next.flush().await
        })
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(async move {
            {
                let _scope = scope::enter(&self.metrics.name);
                self.operator.finish(&mut self.out);
            }
            self.emit().await?;
            for side in self.out.side.outputs() {
                side.finish().await?;
            }
            self.next.finish().await
        })
    }
}
