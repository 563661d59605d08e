//! Subtasks: the loops that run one chain on one shard — a source task polling its reader, or
//! a network task reading its input gate — plus the output that ends a chain in a sink.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::{self, Either, LocalBoxFuture};

use super::exchange::frame::{Entries, Entry, Event};
use super::exchange::reader::InputGate;
use crate::connector::{ConnectorError, ReadStatus, SinkWriter, SourceReader, SplitEnumerator};
use crate::error::{TaskError, TaskResult};
use crate::metrics::OperatorMetrics;
use crate::operator::{scope, Output};
use crate::record::{Record, Watermark};

/// Settings every task of a job shares.
#[derive(Clone, Debug)]
pub struct TaskSettings {
    /// Records per batch between chained operators (`execution.batch-size`).
    pub batch_size: usize,
    /// `execution.buffer-timeout`.
    pub buffer_timeout: Duration,
    /// Number of key groups.
    pub max_parallelism: usize,
}

impl TaskSettings {
    /// Whether exchange writers send a segment after every record (buffer timeout 0).
    pub fn flush_per_record(&self) -> bool {
        self.buffer_timeout.is_zero()
    }
}

/// A runnable subtask.
pub(crate) trait Subtask {
    fn run(self: Box<Self>) -> LocalBoxFuture<'static, TaskResult>;
}

/// Decides when buffered output must be flushed (Flink's output flusher, inline in the task).
struct FlushTimer {
    timeout: Duration,
    last: Instant,
    dirty: bool,
}

impl FlushTimer {
    fn new(timeout: Duration) -> Self {
        FlushTimer {
            timeout,
            last: Instant::now(),
            dirty: false,
        }
    }

    /// Time until a flush is due, if output is pending and flushing is time-based.
    fn due_in(&self) -> Option<Duration> {
        (self.dirty && !self.timeout.is_zero())
            .then(|| self.timeout.saturating_sub(self.last.elapsed()))
    }

    async fn flush_if_due<T>(&mut self, chain: &mut Box<dyn Output<T>>) -> TaskResult {
        if self.due_in() == Some(Duration::ZERO) {
            self.flush(chain).await?;
        }
        Ok(())
    }

    async fn flush<T>(&mut self, chain: &mut Box<dyn Output<T>>) -> TaskResult {
        chain.flush().await?;
        self.dirty = false;
        self.last = Instant::now();
        Ok(())
    }
}

/// The source subtask loop: poll the reader, push batches down the chain, ask the enumerator
/// for splits, end with the final watermark.
pub(crate) struct SourceTask<T, S> {
    pub(crate) reader: Box<dyn SourceReader<T, S>>,
    pub(crate) enumerator: Arc<Mutex<Box<dyn SplitEnumerator<S>>>>,
    pub(crate) subtask: usize,
    pub(crate) chain: Box<dyn Output<T>>,
    pub(crate) settings: TaskSettings,
    pub(crate) metrics: Arc<OperatorMetrics>,
    pub(crate) cancel: Arc<AtomicBool>,
}

impl ConnectorError {
    /// The task failure this connector error means, raised by `operator`.
    pub(crate) fn in_operator(self, operator: &str) -> TaskError {
        let kind = if self.bad_input {
            TaskError::user
        } else {
            TaskError::external
        };
        kind(self.message).in_operator(operator)
    }
}

impl<T: 'static, S: 'static> SourceTask<T, S> {
    async fn run_loop(mut self) -> TaskResult {
        let mut batch = Vec::with_capacity(self.settings.batch_size);
        let mut timer = FlushTimer::new(self.settings.buffer_timeout);
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(TaskError::cancelled("the job was cancelled"));
            }
            let status = {
                let _scope = scope::enter(&self.metrics.name);
                self.reader
                    .poll_next(&mut batch, self.settings.batch_size)
                    .await
            };
            match status.map_err(|e| e.in_operator(&self.metrics.name))? {
                ReadStatus::Records => {
                    if !batch.is_empty() {
                        self.metrics.records_out.add(batch.len() as u64);
                        self.chain.push(&mut batch).await?;
                        timer.dirty = true;
                    }
                }
                ReadStatus::NeedSplit => {
                    let next = self
                        .enumerator
                        .lock()
                        .expect("enumerator lock")
                        .next_split(self.subtask);
                    match next {
                        Some(split) => self.reader.add_split(split),
                        None => break,
                    }
                }
                ReadStatus::Idle(wait) => {
                    if timer.dirty {
                        timer.flush(&mut self.chain).await?;
                    }
                    glommio::timer::sleep(wait.min(Duration::from_millis(100))).await;
                }
            }
            timer.flush_if_due(&mut self.chain).await?;
            glommio::yield_if_needed().await;
        }
        self.chain.watermark(Watermark::MAX).await?;
        self.chain.finish().await
    }
}

impl<T: 'static, S: 'static> Subtask for SourceTask<T, S> {
    fn run(self: Box<Self>) -> LocalBoxFuture<'static, TaskResult> {
        Box::pin(self.run_loop())
    }
}

/// The loop of a subtask whose chain starts at an exchange: read segments from the input
/// gate, decode records in place into batches, forward watermarks and end of input.
pub(crate) struct NetworkTask<T> {
    pub(crate) gate: InputGate,
    pub(crate) chain: Box<dyn Output<T>>,
    pub(crate) settings: TaskSettings,
}

impl<T: Record> NetworkTask<T> {
    async fn run_loop(mut self) -> TaskResult {
        let mut batch: Vec<T> = Vec::with_capacity(self.settings.batch_size);
        let mut timer = FlushTimer::new(self.settings.buffer_timeout);
        loop {
            let next = match timer.due_in() {
                None => self.gate.next().await?,
                Some(wait) => {
                    let sleep = glommio::timer::sleep(wait);
                    match future::select(Box::pin(self.gate.next()), Box::pin(sleep)).await {
                        Either::Left((next, _)) => next?,
                        Either::Right(_) => {
                            timer.flush(&mut self.chain).await?;
                            continue;
                        }
                    }
                }
            };
            let Some((channel, segment)) = next else {
                break;
            };
            for entry in Entries::new(&segment) {
                match entry {
                    Entry::Record(bytes) => {
                        // SAFETY: the sender wrote these bytes with `T::encode` at a 16-byte
                        // aligned offset of a page-aligned segment (see `frame`). Both ends of
                        // an edge are built from one typed API call (`DataStream<T>` feeding an
                        // operator of input `T`), so the sender's type is this task's `T`.
                        batch.push(unsafe { T::decode(bytes) });
                        if batch.len() >= self.settings.batch_size {
                            self.chain.push(&mut batch).await?;
                        }
                    }
                    Entry::Event(event) => {
                        if !batch.is_empty() {
                            self.chain.push(&mut batch).await?;
                        }
                        let advanced = match event {
                            Event::Watermark(w) => self.gate.on_watermark(channel, w),
                            Event::EndOfPartition => self.gate.on_end_of_partition(channel),
                        };
                        if let Some(watermark) = advanced {
                            self.chain.watermark(watermark).await?;
                        }
                    }
                }
            }
            drop(segment);
            if !batch.is_empty() {
                self.chain.push(&mut batch).await?;
            }
            timer.dirty = true;
            timer.flush_if_due(&mut self.chain).await?;
        }
        self.chain.finish().await
    }
}

impl<T: Record> Subtask for NetworkTask<T> {
    fn run(self: Box<Self>) -> LocalBoxFuture<'static, TaskResult> {
        Box::pin(self.run_loop())
    }
}

/// Ends a chain in a sink writer.
pub(crate) struct SinkOutput<T> {
    pub(crate) writer: Box<dyn SinkWriter<T>>,
    pub(crate) metrics: Arc<OperatorMetrics>,
}

impl<T: 'static> Output<T> for SinkOutput<T> {
    fn push<'a>(&'a mut self, batch: &'a mut Vec<T>) -> LocalBoxFuture<'a, TaskResult> {
        Box::pin(async move {
            let _scope = scope::enter(&self.metrics.name);
            self.metrics.records_in.add(batch.len() as u64);
            let result = self.writer.write(batch).await;
            // A writer must take every record; one that only looked at them must not see them
            // again with the next batch.
            batch.clear();
            result.map_err(|e| e.in_operator(&self.metrics.name))
        })
    }

    fn watermark(&mut self, _watermark: Watermark) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(async { Ok(()) })
    }

    /// The buffer timeout bounds how long records wait in network segments (as in Flink), not
    /// in a sink's own buffers: a sink writes out what it buffered when its input ends.
    fn flush(&mut self) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(async { Ok(()) })
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(async move {
            let _scope = scope::enter(&self.metrics.name);
            let result = self.writer.finish().await;
            result.map_err(|e| e.in_operator(&self.metrics.name))
        })
    }
}
