//! Checkpointing (see `docs/design/checkpoints.md` for the plan and what has landed).
//!
//! - [`coordinator`]: when checkpoints are triggered, complete and abort — a state machine
//!   without I/O, run by whoever hosts the job's coordination.
//! - [`restart`]: after a failure, whether and when the job restarts from its last checkpoint
//!   (Flink's restart strategies).
//!
//! The files of a checkpoint are written by `weir_state::checkpoint`.

pub mod coordinator;
pub mod restart;

pub use coordinator::{AbortReason, CheckpointSettings, Command, Coordinator};
pub use restart::{ExponentialDelay, RestartDecision, RestartStrategy, RestartTracker};
