//! Checkpointing (see `docs/design/checkpoints.md` for the plan and what has landed).
//!
//! - [`coordinator`]: when checkpoints are triggered, complete and abort — a state machine
//!   without I/O, run by whoever hosts the job's coordination.
//! - `driver`: hosts the coordinator of a job run embedded (local mode) on a thread of its own,
//!   triggers the sources through their mailboxes, collects the tasks' acknowledgements and
//!   commits the checkpoint storage; reads the latest checkpoint back when a job resumes.
//! - `task_state`: what one task's operators write at a barrier and restore from.
//! - [`inspect`]: what a checkpoint holds, read without the job's types, checksums verified.
//! - `keyed`: keyed state operators keep in structures of their own, in the keyed-snapshot
//!   format; `chain`: such state checkpointed incrementally, a full snapshot and deltas.
//! - [`savepoint`]: savepoints asked for while a job runs, and stopping a job with one.
//! - [`restart`]: after a failure, whether and when the job restarts from its last checkpoint
//!   (Flink's restart strategies).
//!
//! The files of a checkpoint are written by `weir_state::checkpoint`.

pub(crate) mod bytes;
pub(crate) mod chain;
pub mod coordinator;
pub(crate) mod driver;
pub mod inspect;
pub(crate) mod keyed;
pub(crate) mod native;
pub mod relay;
pub mod restart;
pub mod savepoint;
pub(crate) mod task_state;

use std::time::Duration;

/// A checkpoint barrier: the records before it belong to checkpoint `id`'s state, those after
/// it to the next one's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointBarrier {
    /// The checkpoint (savepoints are numbered with the checkpoints).
    pub id: u64,
    /// What the barrier cuts.
    pub kind: SnapshotKind,
    /// The job's final checkpoint, taken once every source's input ended: it aligns whatever
    /// the checkpointing mode, so that it holds every record and nothing in flight, as Flink's
    /// final checkpoint does (its tasks have finished). Were its barrier to overtake data, the
    /// operators' snapshots would come before their input's end, and a job resumed from it
    /// would process that data again, past its end.
    pub is_final: bool,
}

impl CheckpointBarrier {
    /// The barrier of checkpoint `id`.
    pub fn checkpoint(id: u64) -> CheckpointBarrier {
        CheckpointBarrier {
            id,
            kind: SnapshotKind::Checkpoint,
            is_final: false,
        }
    }

    /// The barrier of the job's final checkpoint `id`.
    pub fn final_checkpoint(id: u64) -> CheckpointBarrier {
        CheckpointBarrier {
            is_final: true,
            ..CheckpointBarrier::checkpoint(id)
        }
    }

    /// The barrier of savepoint `id`.
    pub fn savepoint(id: u64) -> CheckpointBarrier {
        CheckpointBarrier {
            id,
            kind: SnapshotKind::Savepoint,
            is_final: false,
        }
    }

    /// Whether the barrier may overtake data (an unaligned checkpoint, when they are enabled):
    /// savepoints and the final checkpoint align always.
    pub fn may_overtake(&self) -> bool {
        self.kind == SnapshotKind::Checkpoint && !self.is_final
    }
}

/// What a barrier cuts (Flink's `SnapshotType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SnapshotKind {
    /// A checkpoint: the job's own, for recovery; it may share files with earlier ones and
    /// write incremental parts.
    #[default]
    Checkpoint,
    /// A savepoint: the user's; self-contained (every file in its own directory) and every
    /// part whole, so that it outlives the job's checkpoints and can be moved.
    Savepoint,
}

/// What a job run's checkpoints did (`JobResult::checkpoints`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckpointStats {
    /// Checkpoints completed (committed).
    pub completed: u64,
    /// Checkpoints triggered and then aborted (declined, expired, or not committed).
    pub aborted: u64,
    /// Per completed checkpoint, from its trigger to its commit.
    pub durations: Vec<Duration>,
    /// The bytes of the files the last completed checkpoint consists of (its full size).
    pub last_bytes: u64,
    /// The bytes the last completed checkpoint wrote: its full size less the shared files an
    /// earlier checkpoint wrote (RocksDB's incremental checkpoints).
    pub last_incremental_bytes: u64,
    /// Per task and completed checkpoint, the longest the task's shard worked on its snapshot
    /// instead of records at once: the barrier's way through the task's chain (the operators'
    /// synchronous snapshots) plus the longest single piece of its state file's deferred
    /// encoding (records flow between pieces). Alignment is not counted.
    pub sync_pauses: Vec<Duration>,
}

impl CheckpointStats {
    pub(crate) fn completed(
        &mut self,
        took: Duration,
        (full, incremental): (u64, u64),
        pauses: Vec<Duration>,
    ) {
        self.completed += 1;
        self.durations.push(took);
        self.last_bytes = full;
        self.last_incremental_bytes = incremental;
        self.sync_pauses.extend(pauses);
    }
}

pub use coordinator::{AbortReason, CheckpointSettings, Command, Coordinator};
pub use relay::{CheckpointMessage, Relay};
pub use restart::{ExponentialDelay, RestartDecision, RestartStrategy, RestartTracker};
pub use savepoint::{PendingSavepoint, SavepointError, SavepointHandle, StopMode, Taken};
