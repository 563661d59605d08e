//! What the checkpoint and savepoint tests share: their configuration, and a sink that keeps
//! what each subtask was told.

#![allow(dead_code)]

use std::path::Path;
use std::sync::{Arc, Mutex};

use weir_engine::checkpoint::CheckpointBarrier;
use weir_engine::connector::{ConnectorError, LocalBoxFuture, SinkWriter};
use weir_engine::prelude::*;

/// The state backends, by `state.backend.type`.
pub const HEAP: &str = "hashmap";
pub const ROCKSDB: &str = "rocksdb";

/// A job on `slots` shards with state on `backend`, checkpointed every 20 ms into
/// `checkpoints`, keeping `retained` of them.
pub fn config_on(
    backend: &str,
    checkpoints: &Path,
    slots: usize,
    retained: usize,
) -> Configuration {
    Configuration::default()
        .with("state.backend.type", backend)
        .and_then(|c| c.with("execution.checkpointing.interval", "20ms"))
        .and_then(|c| {
            c.with(
                "execution.checkpointing.dir",
                checkpoints.to_str().expect("a UTF-8 path"),
            )
        })
        .and_then(|c| c.with("taskmanager.numberOfTaskSlots", slots.to_string()))
        .and_then(|c| c.with("execution.checkpointing.num-retained", retained.to_string()))
        .expect("valid settings")
}

/// What a sink subtask was told, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A barrier reached it.
    Flushed,
    Complete(u64),
    Aborted(u64),
    /// Its input ended (`SinkWriter::finish`).
    Finished,
}

/// A sink that writes nothing and keeps, per subtask, the barriers and checkpoint notices
/// it saw.
#[derive(Clone, Default)]
pub struct NoticeLog {
    pub subtasks: Arc<Mutex<Vec<Vec<Notice>>>>,
}

struct NoticeWriter {
    subtasks: Arc<Mutex<Vec<Vec<Notice>>>>,
    subtask: usize,
}

impl NoticeWriter {
    fn note(&mut self, notice: Notice) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        self.subtasks.lock().unwrap()[self.subtask].push(notice);
        Box::pin(async { Ok(()) })
    }
}

impl<T: Send + 'static> Sink<T> for NoticeLog {
    fn create_writer(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Box<dyn SinkWriter<T>>, ConnectorError> {
        self.subtasks
            .lock()
            .unwrap()
            .resize_with(ctx.parallelism, Vec::new);
        Ok(Box::new(NoticeWriter {
            subtasks: Arc::clone(&self.subtasks),
            subtask: ctx.subtask,
        }))
    }
}

impl<T> SinkWriter<T> for NoticeWriter {
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<T>,
        _timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
        batch.clear();
        Box::pin(async { Ok(()) })
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        self.note(Notice::Finished)
    }

    fn flush(
        &mut self,
        _barrier: &CheckpointBarrier,
    ) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        self.note(Notice::Flushed)
    }

    fn notify_checkpoint_complete(
        &mut self,
        checkpoint: u64,
    ) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        self.note(Notice::Complete(checkpoint))
    }

    fn notify_checkpoint_aborted(
        &mut self,
        checkpoint: u64,
    ) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        self.note(Notice::Aborted(checkpoint))
    }
}
