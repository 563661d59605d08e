//! Why a benchmark could not run.

use weir_engine::JobError;

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A run asked for no records, so there is no rate to report.
    #[error("--records must be at least 1 (got 0)")]
    NoRecords,
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
    /// No shards asked for.
    #[error("--shards must be at least 1 (got 0)")]
    NoShards,
    /// The engine refused or failed the benchmark job.
    #[error("benchmark job '{job}' failed: {source}")]
    Job {
        /// The job's name.
        job: &'static str,
        /// The engine's error.
        #[source]
        source: Box<JobError>,
    },
}

impl BenchError {
    pub(crate) fn job(job: &'static str) -> impl FnOnce(JobError) -> BenchError {
        move |source| BenchError::Job {
            job,
            source: Box::new(source),
        }
    }
}
