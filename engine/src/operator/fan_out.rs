//! Hands one operator's output to several consumers (chained operators and exchange writers).

use super::{Batch, ChainEvent, LocalBoxFuture, Output};
use crate::error::TaskResult;

/// Copies each batch to every consumer but the last, which gets the original. Events go to
/// every consumer; a latency marker to one, each in turn (as Flink's broadcasting output
/// sends it to one, at random).
pub(crate) struct FanOut<T> {
    outputs: Vec<Box<dyn Output<T>>>,
    copy: Batch<T>,
    /// The consumer the next latency marker goes to.
    next_marker: usize,
}

impl<T: Clone> FanOut<T> {
    pub(crate) fn new(outputs: Vec<Box<dyn Output<T>>>) -> Self {
        assert!(outputs.len() >= 2, "a fan-out has at least two consumers");
        FanOut {
            outputs,
            copy: Batch::default(),
            next_marker: 0,
        }
    }
}

impl<T: Clone + 'static> Output<T> for FanOut<T> {
    fn push<'a>(&'a mut self, batch: &'a mut Batch<T>) -> LocalBoxFuture<'a, TaskResult> {
        Box::pin(async move {
            let (last, rest) = self.outputs.split_last_mut().expect("non-empty");
            for output in rest {
                self.copy.extend_from(batch);
                output.push(&mut self.copy).await?;
            }
            last.push(batch).await
        })
    }

    fn event(&mut self, event: ChainEvent) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(async move {
            if let ChainEvent::LatencyMarker(_) = event {
                let one = self.next_marker % self.outputs.len();
                self.next_marker = one + 1;
                return self.outputs[one].event(event).await;
            }
            for output in &mut self.outputs {
                output.event(event).await?;
            }
            Ok(())
        })
    }

    fn next_processing_time(&self) -> Option<i64> {
        self.outputs
            .iter()
            .filter_map(|o| o.next_processing_time())
            .min()
    }
}
