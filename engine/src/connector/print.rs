//! The print sink: writes each record to stdout as `subtask> record` (Flink's `print()`).

use std::fmt::Debug;
use std::io::Write;

use futures::future::LocalBoxFuture;

use super::{ConnectorError, Sink, SinkWriter};
use crate::operator::RuntimeContext;

/// Prints records with their `Debug` form, prefixed by the subtask index (1-based, as Flink).
#[derive(Clone, Copy, Debug, Default)]
pub struct PrintSink;

impl PrintSink {
    /// A print sink.
    pub fn new() -> Self {
        PrintSink
    }
}

impl<T: Debug + 'static> Sink<T> for PrintSink {
    fn create_writer(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Box<dyn SinkWriter<T>>, ConnectorError> {
        let prefix = if ctx.parallelism > 1 {
            format!("{}> ", ctx.subtask + 1)
        } else {
            String::new()
        };
        Ok(Box::new(PrintWriter {
            prefix,
            buffer: Vec::new(),
        }))
    }
}

struct PrintWriter {
    prefix: String,
    buffer: Vec<u8>,
}

impl PrintWriter {
    fn write_out(&mut self) -> Result<(), ConnectorError> {
        let mut stdout = std::io::stdout().lock();
        let result = stdout.write_all(&self.buffer).and_then(|()| stdout.flush());
        self.buffer.clear();
        result.map_err(|e| {
            ConnectorError::external(format!("print sink cannot write to stdout: {e}"))
        })
    }
}

impl<T: Debug> SinkWriter<T> for PrintWriter {
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<T>,
        _timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
        for record in batch.drain(..) {
            // Writing into a Vec cannot fail.
            let _ = writeln!(self.buffer, "{}{record:?}", self.prefix);
        }
        let result = self.write_out();
        Box::pin(async move { result })
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(async { Ok(()) })
    }
}
