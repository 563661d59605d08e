//! `filter`: keeps the records a predicate accepts, in place — the batch it receives is the
//! batch it passes on, with the rejected records removed.

use std::sync::Arc;

use super::{scope, LocalBoxFuture, Output};
use crate::error::TaskResult;
use crate::metrics::OperatorMetrics;
use crate::record::Watermark;

pub(crate) struct FilterLink<T, F> {
    predicate: F,
    next: Box<dyn Output<T>>,
    metrics: Arc<OperatorMetrics>,
}

impl<T, F> FilterLink<T, F> {
    pub(crate) fn new(
        predicate: F,
        next: Box<dyn Output<T>>,
        metrics: Arc<OperatorMetrics>,
    ) -> Self {
        FilterLink {
            predicate,
            next,
            metrics,
        }
    }
}

impl<T: 'static, F: FnMut(&T) -> bool + 'static> Output<T> for FilterLink<T, F> {
    fn push<'a>(&'a mut self, batch: &'a mut Vec<T>) -> LocalBoxFuture<'a, TaskResult> {
        Box::pin(async move {
            {
                let _scope = scope::enter(&self.metrics);
                self.metrics.records_in.add(batch.len() as u64);
                batch.retain(&mut self.predicate);
                self.metrics.records_out.add(batch.len() as u64);
            }
            if batch.is_empty() {
                return Ok(());
            }
            self.next.push(batch).await
        })
    }

    fn watermark(&mut self, watermark: Watermark) -> LocalBoxFuture<'_, TaskResult> {
        self.next.watermark(watermark)
    }

    fn flush(&mut self) -> LocalBoxFuture<'_, TaskResult> {
        self.next.flush()
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, TaskResult> {
        self.next.finish()
    }
}
