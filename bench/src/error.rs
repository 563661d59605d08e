//! Why a benchmark could not run.

use std::path::PathBuf;

use weir_engine::JobError;
use weir_state::StateError;

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A run asked for no records, so there is no rate to report.
    #[error("--records must be at least 1 (got 0)")]
    NoRecords,
    /// A record width the remote exchange benchmark has no record for.
    #[error("--record-bytes must be 64 or 1024 (got {0})")]
    RecordBytes(usize),
    /// The executors of a spread run could not be set up.
    #[error("cannot set up two executors on loopback: {0}")]
    Remote(String),
    /// A state benchmark asked for no operations.
    #[error("--ops must be at least 1 (got 0)")]
    NoOps,
    /// More shards than this machine has cores (one shard per core).
    #[error(
        "--shards {shards} is more than the {cores} core(s) this process may run on (one shard \
         per core); pass --shards {cores} or less"
    )]
    TooManyShards {
        /// Shards asked for.
        shards: usize,
        /// Cores available.
        cores: usize,
    },
    /// The network namespaces of a run over a veth pair cannot be made.
    #[error("cannot make two network namespaces joined by a veth pair: {0}")]
    Veth(String),
    /// The network exchange benchmark cannot run.
    #[error("the network exchange benchmark: {0}")]
    Net(String),
    /// No shards asked for.
    #[error("--shards must be at least 1 (got 0)")]
    NoShards,
    /// The engine refused or failed the benchmark job.
    #[error("benchmark job '{job}' failed: {error}")]
    Job {
        /// The job's name.
        job: &'static str,
        /// The engine's error.
        error: Box<JobError>,
    },
    /// The keyed state backend under benchmark failed.
    #[error("state benchmark on the {backend} backend failed: {error}")]
    State {
        /// The backend (`heap` or `rocksdb`).
        backend: &'static str,
        /// The backend's error.
        error: Box<StateError>,
    },
    /// A memory setting of the benchmark is invalid.
    #[error("{0}")]
    Memory(#[from] weir_memory::MemoryConfigError),
    /// A checkpoint benchmark option is invalid, or its run did not do what it measures.
    #[error("checkpoint benchmark: {0}")]
    Checkpoint(String),
    /// The PostgreSQL benchmark's server refused or failed a step.
    #[error("postgres benchmark: {0}")]
    Postgres(String),
    /// A Nexmark option or generator setting is invalid.
    #[error("nexmark: {0}")]
    Nexmark(String),
    /// No temporary directory for the benchmark's files (RocksDB's, checkpoints, output).
    #[error(
        "could not create or read a temporary directory in {}: {error}; choose a writable \
         directory (--dir where the benchmark has one, else TMPDIR)",
        dir.display()
    )]
    TempDir {
        /// Where it was to be created.
        dir: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
}

impl BenchError {
    pub(crate) fn job(job: &'static str) -> impl FnOnce(JobError) -> BenchError {
        move |error| BenchError::Job {
            job,
            error: Box::new(error),
        }
    }

    pub(crate) fn state(backend: &'static str) -> impl FnOnce(StateError) -> BenchError {
        move |error| BenchError::State {
            backend,
            error: Box::new(error),
        }
    }
}
