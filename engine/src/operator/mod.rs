//! Operators and how chained operators pass records to each other.
//!
//! Every operator implements [`Operator`]; inside a chain, an [`OperatorLink`] drives one
//! operator over a batch of input records and hands its output batch to the next link (a
//! function call, records moved by value). The last link of a chain hands its output to a
//! sink or to an exchange writer, which is where records leave the shard's memory.
//!
//! Links are asynchronous because an exchange writer may have to wait for credit: when it does,
//! the whole chain above it waits with it, which is how backpressure reaches the source.

mod fan_out;
mod filter;
mod flat_map;
mod map;
mod process;
mod reduce;
pub(crate) mod scope;

use std::sync::Arc;

pub(crate) use fan_out::FanOut;
pub(crate) use filter::FilterLink;
pub(crate) use flat_map::FlatMapOperator;
pub(crate) use map::MapOperator;
pub(crate) use process::{KeyedProcessOperator, ProcessOperator};
pub(crate) use reduce::ReduceOperator;

use crate::error::TaskResult;
use crate::metrics::OperatorMetrics;
use crate::record::Watermark;

pub(crate) use futures::future::LocalBoxFuture;

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
}

/// The receiving end of a stream of `T` inside a task: a chained operator, a fan-out, a sink
/// or an exchange writer.
pub(crate) trait Output<T> {
    /// Takes every record out of `batch` (leaving it empty, capacity kept).
    fn push<'a>(&'a mut self, batch: &'a mut Vec<T>) -> LocalBoxFuture<'a, TaskResult>;
    /// Event time advanced.
    fn watermark(&mut self, watermark: Watermark) -> LocalBoxFuture<'_, TaskResult>;
    /// Sends on whatever is buffered (the buffer timeout expired).
    fn flush(&mut self) -> LocalBoxFuture<'_, TaskResult>;
    /// The input has ended: emit what is left and close.
    fn finish(&mut self) -> LocalBoxFuture<'_, TaskResult>;
}

/// One operator of a chain. Records go in one at a time; what the operator emits is collected
/// into `out`, which the driving [`OperatorLink`] hands downstream.
pub(crate) trait Operator<I, O>: 'static {
    /// Called once on the shard before the first record.
    fn open(&mut self, _ctx: &RuntimeContext) {}
    /// Handles one record.
    fn process_element(&mut self, record: I, out: &mut Vec<O>);

    /// Whether each record yields at most one record (map, filter, reduce). The link then hands
    /// a whole batch to [`Operator::process_batch`] at once: its output cannot outgrow the batch.
    const AT_MOST_ONE_PER_RECORD: bool = false;

    /// Handles every record of `batch`, leaving it empty. Operators override this with a tight
    /// loop the compiler can vectorize; only called when `AT_MOST_ONE_PER_RECORD`.
    #[inline]
    fn process_batch(&mut self, batch: &mut Vec<I>, out: &mut Vec<O>) {
        for record in batch.drain(..) {
            self.process_element(record, out);
        }
    }
    /// Event time advanced; the watermark itself is forwarded by the link afterwards.
    fn on_watermark(&mut self, _watermark: Watermark, _out: &mut Vec<O>) {}
    /// The input ended; emit anything held back.
    fn finish(&mut self, _out: &mut Vec<O>) {}
}

/// Drives one operator inside a chain and passes its output on.
pub(crate) struct OperatorLink<O, Op> {
    operator: Op,
    out: Vec<O>,
    next: Box<dyn Output<O>>,
    batch_size: usize,
    metrics: Arc<OperatorMetrics>,
}

impl<O, Op> OperatorLink<O, Op> {
    pub(crate) fn new<I>(
        mut operator: Op,
        ctx: &RuntimeContext,
        next: Box<dyn Output<O>>,
        batch_size: usize,
        metrics: Arc<OperatorMetrics>,
    ) -> Self
    where
        Op: Operator<I, O>,
    {
        {
            let _scope = scope::enter(&metrics.name);
            operator.open(ctx);
        }
        OperatorLink {
            operator,
            out: Vec::with_capacity(batch_size),
            next,
            batch_size,
            metrics,
        }
    }
}

async fn emit<O>(
    next: &mut Box<dyn Output<O>>,
    out: &mut Vec<O>,
    metrics: &OperatorMetrics,
) -> TaskResult {
    metrics.records_out.add(out.len() as u64);
    next.push(out).await
}

impl<I, O: 'static, Op: Operator<I, O>> Output<I> for OperatorLink<O, Op> {
    fn push<'a>(&'a mut self, batch: &'a mut Vec<I>) -> LocalBoxFuture<'a, TaskResult> {
        Box::pin(async move {
            self.metrics.records_in.add(batch.len() as u64);
            if Op::AT_MOST_ONE_PER_RECORD {
                let _scope = scope::enter(&self.metrics.name);
                self.operator.process_batch(batch, &mut self.out);
            } else {
                for record in batch.drain(..) {
                    {
                        let _scope = scope::enter(&self.metrics.name);
                        self.operator.process_element(record, &mut self.out);
                    }
                    if self.out.len() >= self.batch_size {
                        emit(&mut self.next, &mut self.out, &self.metrics).await?;
                    }
                }
            }
            if !self.out.is_empty() {
                emit(&mut self.next, &mut self.out, &self.metrics).await?;
            }
            Ok(())
        })
    }

    fn watermark(&mut self, watermark: Watermark) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(async move {
            {
                let _scope = scope::enter(&self.metrics.name);
                self.operator.on_watermark(watermark, &mut self.out);
            }
            if !self.out.is_empty() {
                emit(&mut self.next, &mut self.out, &self.metrics).await?;
            }
            self.next.watermark(watermark).await
        })
    }

    fn flush(&mut self) -> LocalBoxFuture<'_, TaskResult> {
        self.next.flush()
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(async move {
            {
                let _scope = scope::enter(&self.metrics.name);
                self.operator.finish(&mut self.out);
            }
            if !self.out.is_empty() {
                emit(&mut self.next, &mut self.out, &self.metrics).await?;
            }
            self.next.finish().await
        })
    }
}
