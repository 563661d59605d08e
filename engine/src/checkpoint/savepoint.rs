//! Savepoints asked for while a job runs (Flink's `JobClient::triggerSavepoint` and
//! `stopWithSavepoint`), and checkpoints asked for at once (Flink's manual checkpoint,
//! `POST /jobs/:id/checkpoints`): the handle a caller keeps, and the queue the job's
//! checkpoint coordinator takes requests from. A checkpoint asked for is one of the job's own
//! (written, retained and subsumed like the periodic ones), triggered without waiting for the
//! interval.
//!
//! A savepoint is a checkpoint the user asks for: numbered with the checkpoints and cut by the
//! same barriers (a [`super::SnapshotKind::Savepoint`] barrier), but written self-contained —
//! every part whole, every file in the savepoint's own directory — into
//! `execution.checkpointing.savepoint-dir` (default `<checkpoint dir>/<job>/savepoints`), and
//! never deleted by the job. A job started from it (`RunOptions::from_savepoint`, `weir run
//! --from-savepoint`) restores every state as the savepoint's barrier found it, at any
//! parallelism.
//!
//! **Stopping with a savepoint.** Each source, having sent the savepoint's barrier, reads no
//! more input until the savepoint completed or was aborted, and passes the notice on (every
//! task and sink hears of the completion before it ends). Completed, the job ends: with
//! [`StopMode::Suspend`] every channel ends without a final watermark and no operator or sink
//! is finished (windows still open stay in the savepoint, to fire after the job resumes), with
//! [`StopMode::Drain`] each source first sends the final watermark and finishes its chain, so
//! every event-time window fires and every operator finishes before the barrier (what they
//! emit is in the savepoint) and the job ends as if its input had ended, with no final
//! checkpoint after the savepoint. Aborted, the sources read on and the job runs — but a
//! draining stop's chains are finished: its sources fail, and the job restarts from its latest
//! checkpoint (as Flink's does).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// How a job stops once its savepoint completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopMode {
    /// Stop without a final watermark: open windows and timers stay in the savepoint (Flink's
    /// `stop`; a job that will resume from it).
    Suspend,
    /// Send the final watermark and finish the operators first, so that every event-time
    /// window and timer fires before the savepoint (Flink's `stop --drain`; a job that ends
    /// for good).
    Drain,
}

/// Why a savepoint (or checkpoint) asked for was not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SavepointError(pub String);

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Requested {
    /// A checkpoint of the job's own, at once.
    Checkpoint,
    /// A savepoint; with `stop`, the job stops once it completed.
    Savepoint {
        /// How the job stops, if it does.
        stop: Option<StopMode>,
    },
}

/// A checkpoint or savepoint taken on request.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Taken {
    /// Its number (savepoints are numbered with the checkpoints).
    pub checkpoint: u64,
    /// Its directory.
    pub dir: PathBuf,
}

/// One checkpoint or savepoint asked for.
#[derive(Debug)]
pub(crate) struct SavepointRequest {
    /// What it asks for.
    pub(crate) requested: Requested,
    reply: mpsc::Sender<Result<Taken, SavepointError>>,
}

impl SavepointRequest {
    /// How the job stops once it completed, if it does.
    pub(crate) fn stop(&self) -> Option<StopMode> {
        match self.requested {
            Requested::Checkpoint => None,
            Requested::Savepoint { stop } => stop,
        }
    }

    /// Tells the caller how it ended (a caller that stopped waiting is not told).
    pub(crate) fn answer(self, result: Result<Taken, SavepointError>) {
        let _ = self.reply.send(result);
    }

    /// Tells the caller it failed, saying why.
    pub(crate) fn fail(self, reason: impl Into<String>) {
        self.answer(Err(SavepointError(reason.into())));
    }
}

#[derive(Debug, Default)]
struct Queue {
    requests: VecDeque<SavepointRequest>,
    /// Why requests are refused (the job takes no checkpoints, or it ended).
    closed: Option<String>,
    /// Wakes the coordinator of the run taking requests now, if one does.
    wake: Option<Wake>,
}

/// Tells a waiting coordinator that a request came (else it looks only when its own
/// timers or the tasks wake it).
pub(crate) struct Wake(pub(crate) Box<dyn Fn() + Send>);

impl std::fmt::Debug for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Wake")
    }
}

/// Asks a running job for savepoints (`RunOptions::savepoints`); cloning shares the handle.
/// Requests made before the job's checkpoint coordinator runs, or while the job restarts,
/// wait for it.
#[derive(Clone, Debug, Default)]
pub struct SavepointHandle {
    queue: Arc<Mutex<Queue>>,
}

impl SavepointHandle {
    /// Takes a savepoint; the job runs on.
    pub fn trigger(&self) -> PendingSavepoint {
        self.request(Requested::Savepoint { stop: None })
    }

    /// Takes a savepoint and, once it completed, stops the job (see the module docs); if it
    /// fails, the job runs on.
    pub fn stop_with_savepoint(&self, mode: StopMode) -> PendingSavepoint {
        self.request(Requested::Savepoint { stop: Some(mode) })
    }

    /// Takes a checkpoint now, without waiting for the interval (see the module docs).
    pub fn checkpoint(&self) -> PendingSavepoint {
        self.request(Requested::Checkpoint)
    }

    fn request(&self, requested: Requested) -> PendingSavepoint {
        let (reply, answer) = mpsc::channel();
        let request = SavepointRequest { requested, reply };
        let mut queue = self.queue.lock().expect("savepoint queue lock");
        match &queue.closed {
            Some(reason) => request.fail(reason.clone()),
            None => {
                queue.requests.push_back(request);
                if let Some(wake) = &queue.wake {
                    (wake.0)();
                }
            }
        }
        PendingSavepoint { answer }
    }

    /// The coordinator that takes requests from now on wakes with `wake` (at once, if some
    /// wait); `None` when it ends.
    pub(crate) fn wake_with(&self, wake: Option<Wake>) {
        let mut queue = self.queue.lock().expect("savepoint queue lock");
        queue.wake = wake;
        if let (Some(wake), false) = (&queue.wake, queue.requests.is_empty()) {
            (wake.0)();
        }
    }

    /// Puts a request taken but not started back first in line (or refuses it, if the
    /// handle closed meanwhile).
    pub(crate) fn put_back(&self, request: SavepointRequest) {
        let mut queue = self.queue.lock().expect("savepoint queue lock");
        match &queue.closed {
            Some(reason) => request.fail(reason.clone()),
            None => queue.requests.push_front(request),
        }
    }

    /// The next request, if any (the coordinator's loop).
    pub(crate) fn take(&self) -> Option<SavepointRequest> {
        self.queue
            .lock()
            .expect("savepoint queue lock")
            .requests
            .pop_front()
    }

    /// Takes requests again (a job run begins with the handle).
    pub(crate) fn open(&self) {
        self.queue.lock().expect("savepoint queue lock").closed = None;
    }

    /// Refuses every waiting and later request with `reason` (the job ended, or takes no
    /// checkpoints).
    pub(crate) fn close(&self, reason: &str) {
        let mut queue = self.queue.lock().expect("savepoint queue lock");
        queue.closed = Some(reason.to_string());
        queue.wake = None;
        for request in queue.requests.drain(..) {
            request.fail(reason);
        }
    }
}

/// A savepoint (or checkpoint) asked for: its number and directory once it completed.
#[derive(Debug)]
pub struct PendingSavepoint {
    answer: mpsc::Receiver<Result<Taken, SavepointError>>,
}

impl PendingSavepoint {
    /// Waits until the savepoint completed or failed.
    pub fn wait(&self) -> Result<Taken, SavepointError> {
        self.answer
            .recv()
            .unwrap_or_else(|_| Err(SavepointError("the job ended before it was taken".into())))
    }

    /// Waits at most `timeout`; `None` if the savepoint is still being taken.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Result<Taken, SavepointError>> {
        match self.answer.recv_timeout(timeout) {
            Ok(result) => Some(result),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(Err(SavepointError(
                "the job ended before it was taken".into(),
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_wait_in_order_until_the_handle_closes() {
        let handle = SavepointHandle::default();
        let first = handle.trigger();
        let second = handle.stop_with_savepoint(StopMode::Drain);
        let third = handle.checkpoint();
        let taken = handle.take().expect("the first request");
        assert_eq!(taken.stop(), None);
        let done = Taken {
            checkpoint: 1,
            dir: PathBuf::from("/sp/1"),
        };
        taken.answer(Ok(done.clone()));
        assert_eq!(first.wait(), Ok(done));
        let taken = handle.take().expect("the second request");
        assert_eq!(taken.stop(), Some(StopMode::Drain));
        drop(taken);
        assert!(second.wait().is_err(), "a request dropped unanswered fails");
        handle.close("the job ended");
        assert_eq!(third.wait(), Err(SavepointError("the job ended".into())));
        let late = handle.trigger();
        assert_eq!(
            late.wait_timeout(Duration::from_secs(1)),
            Some(Err(SavepointError("the job ended".into())))
        );
        assert!(handle.take().is_none());
    }
}
