//! Checkpointing (see `docs/design/checkpoints.md` for the plan and what has landed).
//!
//! - [`coordinator`]: when checkpoints are triggered, complete and abort — a state machine
//!   without I/O, run by whoever hosts the job's coordination.
//! - `driver`: hosts the coordinator of a job run embedded (local mode) on a thread of its own,
//!   triggers the sources through their mailboxes, collects the tasks' acknowledgements and
//!   commits the checkpoint storage; reads the latest checkpoint back when a job resumes.
//! - `task_state`: what one task's operators write at a barrier and restore from.
//! - `keyed`: keyed state operators keep in structures of their own, in the keyed-snapshot
//!   format.
//! - [`restart`]: after a failure, whether and when the job restarts from its last checkpoint
//!   (Flink's restart strategies).
//!
//! The files of a checkpoint are written by `weir_state::checkpoint`.

pub(crate) mod bytes;
pub mod coordinator;
pub(crate) mod driver;
pub(crate) mod keyed;
pub mod restart;
pub(crate) mod task_state;

/// A checkpoint barrier: the records before it belong to checkpoint `id`'s state, those after
/// it to the next one's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CheckpointBarrier {
    /// The checkpoint.
    pub(crate) id: u64,
}

pub use coordinator::{AbortReason, CheckpointSettings, Command, Coordinator};
pub use restart::{ExponentialDelay, RestartDecision, RestartStrategy, RestartTracker};
