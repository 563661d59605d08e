//! A sink that collects every record in memory for the caller to read after (or while) the
//! job runs — Flink's `executeAndCollect`, for tests and small results.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::LocalBoxFuture;

use super::{ConnectorError, Sink, SinkWriter};
use crate::operator::RuntimeContext;

/// The records a [`CollectSink`] received, per subtask, in arrival order.
#[derive(Debug)]
pub struct Collected<T> {
    subtasks: Arc<Mutex<Vec<Vec<T>>>>,
}

impl<T> Clone for Collected<T> {
    fn clone(&self) -> Self {
        Collected {
            subtasks: Arc::clone(&self.subtasks),
        }
    }
}

impl<T: Clone> Collected<T> {
    /// Every record, subtask 0's first.
    pub fn records(&self) -> Vec<T> {
        self.subtasks
            .lock()
            .expect("collect lock")
            .iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// The records each subtask received, in order.
    pub fn by_subtask(&self) -> Vec<Vec<T>> {
        self.subtasks.lock().expect("collect lock").clone()
    }

    /// Total number of records received so far.
    pub fn len(&self) -> usize {
        self.subtasks
            .lock()
            .expect("collect lock")
            .iter()
            .map(Vec::len)
            .sum()
    }

    /// Whether nothing was received.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Collects records into a shared [`Collected`]; optionally slow, to exercise backpressure.
pub struct CollectSink<T> {
    collected: Collected<T>,
    delay_per_batch: Duration,
}

impl<T> CollectSink<T> {
    /// A sink and the handle its records can be read from.
    pub fn new() -> (Self, Collected<T>) {
        let collected = Collected {
            subtasks: Arc::new(Mutex::new(Vec::new())),
        };
        (
            CollectSink {
                collected: collected.clone(),
                delay_per_batch: Duration::ZERO,
            },
            collected,
        )
    }

    /// Sleeps (without blocking the shard) this long after every batch: a slow consumer.
    pub fn with_delay_per_batch(mut self, delay: Duration) -> Self {
        self.delay_per_batch = delay;
        self
    }
}

impl<T: Send + 'static> Sink<T> for CollectSink<T> {
    fn create_writer(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Box<dyn SinkWriter<T>>, ConnectorError> {
        let mut subtasks = self.collected.subtasks.lock().expect("collect lock");
        if subtasks.len() < ctx.parallelism {
            subtasks.resize_with(ctx.parallelism, Vec::new);
        }
        Ok(Box::new(CollectWriter {
            collected: Arc::clone(&self.collected.subtasks),
            subtask: ctx.subtask,
            delay: self.delay_per_batch,
        }))
    }
}

struct CollectWriter<T> {
    collected: Arc<Mutex<Vec<Vec<T>>>>,
    subtask: usize,
    delay: Duration,
}

impl<T> SinkWriter<T> for CollectWriter<T> {
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<T>,
        _timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
        self.collected.lock().expect("collect lock")[self.subtask].append(batch);
        let delay = self.delay;
        Box::pin(async move {
            if !delay.is_zero() {
                glommio::timer::sleep(delay).await;
            }
            Ok(())
        })
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(async { Ok(()) })
    }
}
