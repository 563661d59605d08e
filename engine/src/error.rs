//! Errors a job can end with.

use std::fmt;

use crate::config::ConfigError;

/// How the control plane should react to a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// Bad job or bad input: restarting will not help.
    User,
    /// Something outside the job (a file, a disk) failed: a restart may help.
    External,
    /// A bug in Weir: fail loudly.
    Internal,
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureKind::User => "user error",
            FailureKind::External => "external error",
            FailureKind::Internal => "internal error",
        })
    }
}

/// Why a job did not run to completion.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The job graph is malformed (no sink, parallelism 0 or above the slots, duplicate uid...).
    #[error("invalid job: {0}")]
    InvalidJob(String),
    /// A setting is unknown or has a bad value.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A subtask failed while running.
    #[error(
        "operator '{operator}' (subtask {subtask} of {parallelism}) failed ({kind}): {message}"
    )]
    TaskFailed {
        /// Name of the operator that failed.
        operator: String,
        /// Index of the failed subtask.
        subtask: usize,
        /// Parallelism of the operator.
        parallelism: usize,
        /// What happened.
        message: String,
        /// Whether restarting could help.
        kind: FailureKind,
    },
    /// Checkpoints failed more often in a row than the job tolerates.
    #[error("job '{job}' failed: {reason}")]
    CheckpointsFailed {
        /// The job's name.
        job: String,
        /// What failed, naming the setting.
        reason: String,
    },
    /// A task failed and the restart strategy allows no further restart.
    #[error("{last}; not restarted again: {reason}")]
    RestartsExhausted {
        /// Restarts before this failure.
        restarts: u32,
        /// Which setting ran out, and how to change it.
        reason: String,
        /// The failure that ended the job.
        last: Box<JobError>,
    },
    /// The job was cancelled on request before it finished.
    #[error("job '{job}' was cancelled")]
    Cancelled {
        /// The job's name.
        job: String,
    },
    /// The shard executors could not be started.
    #[error("cannot start shard {shard} on core {core}: {message}")]
    Runtime {
        /// The shard index.
        shard: usize,
        /// The core it was to be pinned to.
        core: usize,
        /// The executor's error.
        message: String,
    },
}

impl JobError {
    /// Whether the job's restart strategy applies: a task failed, or checkpoints failed more
    /// often than tolerated. A bad job or setting, a cancel request, or executors that cannot
    /// start would end a restarted run the same way.
    pub fn is_restartable(&self) -> bool {
        matches!(
            self,
            JobError::TaskFailed { .. } | JobError::CheckpointsFailed { .. }
        )
    }
}

/// The text of a panic's payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-text payload".into())
}

/// A failure inside a running subtask, before it is attributed to an operator.
#[derive(Debug, Clone)]
pub(crate) struct TaskError {
    pub(crate) message: String,
    pub(crate) kind: FailureKind,
    /// The operator that raised it, when it is not the subtask's head.
    pub(crate) operator: Option<String>,
    /// Whether it caused the run's end or followed from another failure.
    pub(crate) role: Role,
}

/// What a subtask's failure is to the run that failed; a run reports the first failure in this
/// order (its cause, else the consequence that says most about where it came from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Role {
    /// The failure itself: the run's cause.
    Cause,
    /// A channel's other end, in another process, went before ending it (its subtask failed
    /// or was cancelled, or that executor's run ended): the message names the peer.
    Elsewhere,
    /// A consequence of a failure in this process or of a cancel request: a channel whose
    /// other end here went, the job's stop flag.
    Here,
}

impl TaskError {
    pub(crate) fn user(message: impl Into<String>) -> TaskError {
        TaskError {
            message: message.into(),
            kind: FailureKind::User,
            operator: None,
            role: Role::Cause,
        }
    }
    pub(crate) fn external(message: impl Into<String>) -> TaskError {
        TaskError {
            message: message.into(),
            kind: FailureKind::External,
            operator: None,
            role: Role::Cause,
        }
    }
    pub(crate) fn internal(message: impl Into<String>) -> TaskError {
        TaskError {
            message: message.into(),
            kind: FailureKind::Internal,
            operator: None,
            role: Role::Cause,
        }
    }
    /// A consequence of a failure in this process or of a cancel request.
    pub(crate) fn consequence(message: impl Into<String>) -> TaskError {
        TaskError {
            message: message.into(),
            kind: FailureKind::Internal,
            operator: None,
            role: Role::Here,
        }
    }
    /// A consequence of a failure in another process, whose end of a channel went.
    pub(crate) fn cut_by_peer(message: impl Into<String>) -> TaskError {
        TaskError {
            message: message.into(),
            kind: FailureKind::Internal,
            operator: None,
            role: Role::Elsewhere,
        }
    }
    pub(crate) fn in_operator(mut self, operator: &str) -> TaskError {
        self.operator.get_or_insert_with(|| operator.to_string());
        self
    }
}

pub(crate) type TaskResult<T = ()> = Result<T, TaskError>;
