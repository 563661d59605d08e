//! A file sink: each subtask writes one `part-<subtask>` file of lines in the output directory,
//! through the shard's io_uring (glommio's buffered file streams).

use std::fmt::Display;
use std::path::PathBuf;
use std::sync::Arc;

use futures::future::LocalBoxFuture;
use futures_lite::AsyncWriteExt;
use glommio::io::{BufferedFile, StreamWriter, StreamWriterBuilder};

use super::wake_filter::polled_when_woken;
use super::{ConnectorError, Sink, SinkWriter};
use crate::operator::RuntimeContext;

type Formatter<T> = Arc<dyn Fn(&T, &mut String) + Send + Sync>;

/// Writes records as lines into `<dir>/part-<subtask>`.
pub struct FileSink<T> {
    dir: PathBuf,
    format: Formatter<T>,
}

impl<T: Display> FileSink<T> {
    /// One line per record, its `Display` form.
    pub fn lines(dir: impl Into<PathBuf>) -> Self {
        FileSink::with_formatter(dir, |record: &T, line: &mut String| {
            use std::fmt::Write;
            // Writing into a String cannot fail.
            let _ = write!(line, "{record}");
        })
    }
}

impl<T> FileSink<T> {
    /// One line per record, written by `format` (without the newline).
    pub fn with_formatter(
        dir: impl Into<PathBuf>,
        format: impl Fn(&T, &mut String) + Send + Sync + 'static,
    ) -> Self {
        FileSink {
            dir: dir.into(),
            format: Arc::new(format),
        }
    }
}

impl<T: 'static> Sink<T> for FileSink<T> {
    fn create_writer(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Box<dyn SinkWriter<T>>, ConnectorError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| {
            ConnectorError::external(format!(
                "file sink cannot create directory '{}': {e}; choose a writable output directory",
                self.dir.display()
            ))
        })?;
        Ok(Box::new(FileWriter {
            path: self.dir.join(format!("part-{}", ctx.subtask)),
            format: Arc::clone(&self.format),
            writer: None,
            text: String::new(),
        }))
    }
}

struct FileWriter<T> {
    path: PathBuf,
    format: Formatter<T>,
    writer: Option<StreamWriter>,
    text: String,
}

impl<T> FileWriter<T> {
    fn io_error(&self, what: &str, e: impl Display) -> ConnectorError {
        ConnectorError::external(format!(
            "file sink cannot {what} '{}': {e}",
            self.path.display()
        ))
    }

    async fn writer(&mut self) -> Result<&mut StreamWriter, ConnectorError> {
        if self.writer.is_none() {
            let file = BufferedFile::create(&self.path)
                .await
                .map_err(|e| self.io_error("create", e))?;
            self.writer = Some(
                StreamWriterBuilder::new(file)
                    .with_buffer_size(128 << 10)
                    .build(),
            );
        }
        Ok(self.writer.as_mut().expect("created above"))
    }

    async fn write_batch(&mut self, batch: &mut Vec<T>) -> Result<(), ConnectorError> {
        self.text.clear();
        for record in batch.drain(..) {
            (self.format)(&record, &mut self.text);
            self.text.push('\n');
        }
        let text = std::mem::take(&mut self.text);
        let result = self.writer().await?.write_all(text.as_bytes()).await;
        self.text = text;
        result.map_err(|e| self.io_error("write", e))
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        // Create the file even if no record arrived, so every subtask leaves its part.
        self.writer().await?;
        let mut writer = self.writer.take().expect("created above");
        writer.close().await.map_err(|e| self.io_error("close", e))
    }
}

impl<T> SinkWriter<T> for FileWriter<T> {
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<T>,
        _timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
        Box::pin(polled_when_woken(self.write_batch(batch)))
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(polled_when_woken(self.close()))
    }

    fn flush(&mut self) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(polled_when_woken(async move {
            match &mut self.writer {
                Some(writer) => {
                    let result = writer.flush().await;
                    result.map_err(|e| self.io_error("write", e))
                }
                None => Ok(()),
            }
        }))
    }
}
