//! Keyed state that operators keep in structures of their own — window panes, join buffers —
//! checkpointed as keyed state all the same: one canonical keyed snapshot per operator
//! subtask (`weir_state::KeyedSnapshotWriter`), keyed by the operator's key, so a restore keeps
//! the key groups a subtask owns (rescaling) and tools read it like any keyed state.

use bytes::Bytes;
use weir_state::{
    KeyGroupRange, KeyedSnapshotEntries, KeyedSnapshotWriter, StateCodec, StateError,
    StateErrorKind,
};

use crate::operator::RuntimeContext;
use crate::record::Key;

/// The key groups an operator subtask owns: where its snapshot's keys lie, and which entries
/// of a checkpoint it takes back.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyedScope {
    max_parallelism: u32,
    key_groups: KeyGroupRange,
}

impl KeyedScope {
    pub(crate) fn of(ctx: &RuntimeContext) -> Self {
        KeyedScope {
            max_parallelism: ctx.max_parallelism as u32,
            key_groups: KeyGroupRange::for_subtask(
                ctx.max_parallelism as u32,
                ctx.parallelism as u32,
                ctx.subtask as u32,
            ),
        }
    }

    /// Every key group of `max_parallelism` (an operator tested on its own).
    #[cfg(test)]
    pub(crate) fn single(max_parallelism: u32) -> Self {
        KeyedScope {
            max_parallelism,
            key_groups: KeyGroupRange::for_subtask(max_parallelism, 1, 0),
        }
    }

    /// Subtask `subtask` of `parallelism`, outside a job (tests of operators on their own).
    #[cfg(test)]
    pub(crate) fn subtask(max_parallelism: u32, parallelism: u32, subtask: u32) -> Self {
        KeyedScope {
            max_parallelism,
            key_groups: KeyGroupRange::for_subtask(max_parallelism, parallelism, subtask),
        }
    }

    /// Whether `key` is in this subtask's key groups.
    #[cfg(test)]
    pub(crate) fn holds<K: std::hash::Hash>(&self, key: &K) -> bool {
        self.key_groups
            .contains(weir_state::KeyGroup::of(key, self.max_parallelism))
    }

    /// A writer of a snapshot of this subtask's keys, stamped now.
    pub(crate) fn writer<K: Key, N: StateCodec>(&self) -> KeyedSnapshotWriter<K, N> {
        KeyedSnapshotWriter::new(self.max_parallelism, self.key_groups, crate::time::now_ms())
    }

    /// What the parts `parts` (one per old subtask) hold for this subtask's key groups.
    pub(crate) fn read<K: Key, N: StateCodec>(
        &self,
        parts: &[Bytes],
    ) -> Result<KeyedSnapshotEntries<K, N>, StateError> {
        KeyedSnapshotEntries::read_shared(parts, self.max_parallelism, self.key_groups)
    }

    /// What part `part` of the checkpoint the job resumes from holds for this subtask's key
    /// groups (`None`: the job does not resume, or the operator wrote no such part).
    pub(crate) fn restored<K: Key, N: StateCodec>(
        &self,
        ctx: &RuntimeContext,
        part: &str,
    ) -> Result<Option<KeyedSnapshotEntries<K, N>>, StateError> {
        ctx.with_restored_of_all(part, |parts| {
            if parts.is_empty() {
                Ok(None)
            } else {
                self.read(parts).map(Some)
            }
        })
    }
}

/// What checkpointed keyed state an operator cannot take back, and how to go on.
pub(crate) fn foreign_state(what: String, fix: &str) -> StateError {
    StateErrorKind::InvalidRestore {
        problem: format!("{what}; {fix}, or start the job without restoring this operator's state"),
    }
    .into()
}
