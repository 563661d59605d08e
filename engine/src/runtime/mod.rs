//! Running a job: shard executors, subtask deployment, the exchange between shards, and the
//! live progress report.

mod deploy;
pub mod exchange;
pub(crate) mod factories;
mod periodic;
mod progress;
pub mod shard;
mod spread;
pub mod task;
mod watchdog;

pub use deploy::{run_job, CancelHandle, JobResult, Restart, RunOptions};
pub use periodic::PeriodicThread;
pub use shard::{available_cores, resolve_cores, ShardLoad};
pub use spread::{on_loopback, SlotPlace, Spread};
