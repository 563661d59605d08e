//! Errors of the keyed-state library.
//!
//! [`StateError`] is one boxed word wide, so `Result<T, StateError>` stays small on the hot path;
//! [`StateError::kind`] gives the variant. Every message names the state (or the setting), the
//! offending value and what to do about it.

use std::path::PathBuf;

/// An error from keyed state: registration, encoding, a backend, or the configuration.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct StateError(Box<StateErrorKind>);

impl StateError {
    /// What went wrong.
    pub fn kind(&self) -> &StateErrorKind {
        &self.0
    }

    /// A value of `type_name` in state `state` that its codec could not encode.
    pub fn encoding(state: &str, type_name: &'static str, error: impl std::fmt::Display) -> Self {
        StateErrorKind::Encode {
            state: state.to_string(),
            type_name,
            reason: error.to_string(),
        }
        .into()
    }

    /// Whether this is a bug or misuse on the engine side (no current key, key outside the
    /// backend's key groups, incompatible registration) rather than bad data or a failing disk.
    pub fn is_usage_error(&self) -> bool {
        matches!(
            *self.0,
            StateErrorKind::IncompatibleRegistration { .. }
                | StateErrorKind::NoCurrentKey { .. }
                | StateErrorKind::KeyGroupOutOfRange { .. }
                | StateErrorKind::UnknownState { .. }
                | StateErrorKind::InvalidConfig { .. }
                | StateErrorKind::IncompatibleRestore { .. }
                | StateErrorKind::IncompatibleKeyedRestore { .. }
                | StateErrorKind::IncompatibleKeyedSnapshot { .. }
                | StateErrorKind::InvalidRestore { .. }
                | StateErrorKind::NotBuilt { .. }
                | StateErrorKind::OperatorStateTtl { .. }
        )
    }
}

impl From<StateErrorKind> for StateError {
    fn from(kind: StateErrorKind) -> Self {
        StateError(Box::new(kind))
    }
}

/// The variants of [`StateError`].
#[derive(Debug, thiserror::Error)]
pub enum StateErrorKind {
    /// A state name was registered twice with different kinds, types or TTL.
    #[error(
        "state '{state}' is already registered as {registered}, but was requested as \
         {requested}; state names are unique per operator: give one of them another name"
    )]
    IncompatibleRegistration {
        /// The state name.
        state: String,
        /// The existing registration, e.g. `ValueState<u64> (no TTL)`.
        registered: String,
        /// The new request.
        requested: String,
    },

    /// A state was accessed before the backend had a current key.
    #[error(
        "state '{state}' was accessed before a current key was set; call \
         set_current_key before touching keyed state"
    )]
    NoCurrentKey {
        /// The state name.
        state: String,
    },

    /// The current key belongs to a key group this backend does not own.
    #[error(
        "key {key} belongs to key group {key_group}, outside this backend's key groups \
         {start}..={end} (max parallelism {max_parallelism}); the record reached the wrong \
         subtask: the key_by partitioner and the state backend must use the same max parallelism"
    )]
    KeyGroupOutOfRange {
        /// The key, `Debug`-formatted.
        key: String,
        /// Its key group.
        key_group: u32,
        /// First key group of the backend.
        start: u32,
        /// Last key group of the backend.
        end: u32,
        /// The max parallelism both sides were configured with.
        max_parallelism: u32,
    },

    /// A state name that was never registered with this backend.
    #[error(
        "state '{state}' is not registered with this keyed backend; register it with its \
         descriptor (e.g. value_state) first"
    )]
    UnknownState {
        /// The state name.
        state: String,
    },

    /// Stored bytes do not decode as the expected type.
    #[error(
        "state '{state}' holds a corrupt {what} of {len} bytes that does not decode as \
         {type_name}: {reason}; it was written by another type or a damaged file: restore from \
         an earlier checkpoint, or clear the state if the type changed on purpose"
    )]
    Corrupt {
        /// The state name.
        state: String,
        /// What was being read: "value", "key", "list element", "map key", ...
        what: &'static str,
        /// The Rust type it should decode as.
        type_name: &'static str,
        /// Length of the bytes.
        len: usize,
        /// The decoder's explanation.
        reason: String,
    },

    /// A value could not be encoded.
    #[error(
        "state '{state}' could not encode a {type_name}: {reason}; the type's rkyv \
         Serialize impl failed (check custom `with` wrappers)"
    )]
    Encode {
        /// The state name.
        state: String,
        /// The Rust type being encoded.
        type_name: &'static str,
        /// The encoder's explanation.
        reason: String,
    },

    /// A RocksDB operation failed.
    #[error(
        "RocksDB at {path} failed while {action} (state '{state}'): {error}; check free disk \
         space, permissions and open-file limits of that directory"
    )]
    RocksDb {
        /// The database directory.
        path: PathBuf,
        /// The state (or `*` for slot-wide operations).
        state: String,
        /// What was being done, e.g. "writing".
        action: &'static str,
        /// RocksDB's error (in the message, so not also a `source`).
        error: rocksdb::Error,
    },

    /// A file-system operation failed.
    #[error("{action} {path} failed: {error}; check that the directory is writable")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// What was being done, e.g. "creating".
        action: &'static str,
        /// The OS error (in the message, so not also a `source`).
        error: std::io::Error,
    },

    /// A restored operator state was registered with another kind or redistribution mode than
    /// the one it was checkpointed with.
    #[error(
        "state '{state}' was checkpointed as {restored}, but is now registered as {requested}; \
         a restored operator state keeps its kind and redistribution mode: register it as \
         {restored} again, or give the new state another name"
    )]
    IncompatibleRestore {
        /// The state name.
        state: String,
        /// What the checkpoint holds, e.g. `ListState<u64> (union redistribution)`.
        restored: String,
        /// What the operator asked for.
        requested: String,
    },

    /// A restored keyed state was registered with another kind or stored type than the one it
    /// was checkpointed with.
    #[error(
        "state '{state}' was checkpointed as {restored}, but is now registered as {requested}; \
         a restored keyed state keeps its kind and types: register it as {restored} again, or \
         give the new state another name"
    )]
    IncompatibleKeyedRestore {
        /// The state name.
        state: String,
        /// What the checkpoint holds, e.g. `ValueState<u64>`.
        restored: String,
        /// What the operator asked for, e.g. `ListState<u64>`.
        requested: String,
    },

    /// A keyed state snapshot taken by a backend that does not fit the one restoring it:
    /// another max parallelism, key type or namespace type.
    #[error(
        "a keyed state snapshot was taken with {what} {restored}, but the backend restoring it \
         has {what} {current}; {fix}"
    )]
    IncompatibleKeyedSnapshot {
        /// What differs, e.g. "max parallelism" or "key type".
        what: &'static str,
        /// The snapshot's value.
        restored: String,
        /// The restoring backend's value.
        current: String,
        /// What to do about it.
        fix: &'static str,
    },

    /// A keyed backend was restored at the wrong moment (twice, or after a state was registered)
    /// or from snapshots that do not belong together.
    #[error(
        "keyed state cannot be restored: {problem}; restore a keyed backend once, before its \
         operator registers any state, from the snapshots of one checkpoint"
    )]
    InvalidRestore {
        /// What is wrong, with the offending values.
        problem: String,
    },

    /// A capability that this build does not have yet.
    #[error("{what} is not built yet; {fix}")]
    NotBuilt {
        /// What was asked for.
        what: &'static str,
        /// What to do instead.
        fix: &'static str,
    },

    /// An operator (non-keyed) state descriptor carries a TTL, which operator state does not
    /// support (as in Flink).
    #[error(
        "state '{state}' is operator state ({kind}), which has no time to live (as in Flink); \
         remove with_ttl from its descriptor, or keep the entries in keyed state if they must \
         expire"
    )]
    OperatorStateTtl {
        /// The state name.
        state: String,
        /// What was requested, e.g. `ListState<u64> (split redistribution)`.
        kind: String,
    },

    /// Snapshot bytes that are truncated, damaged, or of a format version this build does not
    /// read.
    #[error(
        "{what} is corrupt: {problem}; the file is damaged, truncated or was written by \
         another Weir version: restore from an earlier checkpoint"
    )]
    CorruptSnapshot {
        /// What was being read, e.g. "operator state snapshot".
        what: &'static str,
        /// What is wrong, with the offending values.
        problem: String,
    },

    /// A RocksDB cut whose held writes (the write-back cache's entries its files lack) were
    /// not all copied: the checkpoint fails rather than hold less than the state.
    #[error(
        "the cut of RocksDB at {} did not copy all its held writes: {problem}; this checkpoint \
         fails and the next one cuts again (this is a bug in Weir: please report it)",
        path.display()
    )]
    CutIncomplete {
        /// The instance's directory.
        path: PathBuf,
        /// What is wrong, with the counts.
        problem: String,
    },

    /// A checkpoint that a restore cannot use: never completed, or a file of it is missing,
    /// truncated or damaged, or it belongs to another job.
    #[error(
        "checkpoint {} cannot be restored: {problem}; a restore passes over it to the newest \
         earlier complete checkpoint, if there is one (delete it, or restore from another)",
        path.display()
    )]
    CorruptCheckpoint {
        /// The checkpoint's directory, or the file of it that is wrong.
        path: PathBuf,
        /// What is wrong, with the offending values.
        problem: String,
    },

    /// Another process holds a job's checkpoint directory.
    #[error(
        "{} is in use by another Weir process ({holder}); stop that process first, or give \
         this job another execution.checkpointing.dir",
        path.display()
    )]
    CheckpointDirectoryInUse {
        /// The job's checkpoint directory.
        path: PathBuf,
        /// Who holds it, as its lock file says (a pid), or that it could not be read.
        holder: String,
    },

    /// A configuration value that cannot work.
    #[error("{setting} = {value} is invalid: {fix}")]
    InvalidConfig {
        /// The setting (or constructor argument).
        setting: &'static str,
        /// The offending value.
        value: String,
        /// What to use instead.
        fix: String,
    },
}

impl StateError {
    pub(crate) fn no_current_key(state: &str) -> StateError {
        StateErrorKind::NoCurrentKey {
            state: state.to_string(),
        }
        .into()
    }

    pub(crate) fn unknown_state(state: &str) -> StateError {
        StateErrorKind::UnknownState {
            state: state.to_string(),
        }
        .into()
    }

    /// A file-system operation `action` on `path` failed with `source`.
    pub(crate) fn io(
        path: &std::path::Path,
        action: &'static str,
        source: std::io::Error,
    ) -> StateError {
        StateErrorKind::Io {
            path: path.to_path_buf(),
            action,
            error: source,
        }
        .into()
    }

    pub(crate) fn rocksdb(
        path: &std::path::Path,
        state: &str,
        action: &'static str,
        source: rocksdb::Error,
    ) -> StateError {
        StateErrorKind::RocksDb {
            path: path.to_path_buf(),
            state: state.to_string(),
            action,
            error: source,
        }
        .into()
    }

    pub(crate) fn invalid_config(
        setting: &'static str,
        value: impl ToString,
        fix: impl Into<String>,
    ) -> StateError {
        StateErrorKind::InvalidConfig {
            setting,
            value: value.to_string(),
            fix: fix.into(),
        }
        .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_one_word() {
        assert_eq!(
            std::mem::size_of::<StateError>(),
            std::mem::size_of::<usize>()
        );
    }

    #[test]
    fn messages_name_state_value_and_fix() {
        let err: StateError = StateErrorKind::Corrupt {
            state: "counts".into(),
            what: "value",
            type_name: "u64",
            len: 3,
            reason: "buffer too short".into(),
        }
        .into();
        let text = err.to_string();
        assert!(text.contains("'counts'"), "{text}");
        assert!(text.contains("u64"), "{text}");
        assert!(
            text.contains("restore from an earlier checkpoint"),
            "{text}"
        );
        assert!(!err.is_usage_error());
    }
}
