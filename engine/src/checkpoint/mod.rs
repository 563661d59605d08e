//! Checkpointing (see `docs/design/checkpoints.md` for the plan and what has landed).
//!
//! - [`coordinator`]: when checkpoints are triggered, complete and abort — a state machine
//!   without I/O, run by whoever hosts the job's coordination.
//!
//! The files of a checkpoint are written by `weir_state::checkpoint`.

pub mod coordinator;

pub use coordinator::{AbortReason, CheckpointSettings, Command, Coordinator};
