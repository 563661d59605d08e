//! The discard ("blackhole") sink: drops every record. Its operator metrics still count them.

use futures::future::LocalBoxFuture;

use super::{ConnectorError, Sink, SinkWriter};
use crate::operator::RuntimeContext;

/// Drops every record.
#[derive(Clone, Copy, Debug, Default)]
pub struct DiscardSink;

impl DiscardSink {
    /// A discard sink.
    pub fn new() -> Self {
        DiscardSink
    }
}

impl<T: 'static> Sink<T> for DiscardSink {
    fn create_writer(
        &self,
        _ctx: &RuntimeContext,
    ) -> Result<Box<dyn SinkWriter<T>>, ConnectorError> {
        Ok(Box::new(DiscardSink))
    }
}

impl<T> SinkWriter<T> for DiscardSink {
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<T>,
        _timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
        for record in batch.drain(..) {
            std::hint::black_box(record);
        }
        Box::pin(async { Ok(()) })
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(async { Ok(()) })
    }
}
