//! Consistent snapshots of the heap backend, taken while processing goes on.
//!
//! [`HeapSnapshot`] holds, per state, shared pointers to the key-group maps as they were when it
//! was taken (see [`super::table`] for the copy-on-write). Taking one costs one pointer copy per
//! key group and state; later writes copy a key group they touch, so the snapshot never changes.
//! It is shard-bound (`!Send`), like the backend: the checkpoint writer runs on the same shard
//! (glommio's throughput queue) and reads it entry by entry, in encoded form, one key group at a
//! time — the unit in which a checkpoint is written and rescaled.
//!
//! Entries already expired when the snapshot was taken are left out.

use std::rc::Rc;

use crate::backend::heap::table::{Entry, FastMap, GroupMap, Stored};
use crate::codec::StateCodec;
use crate::descriptor::StateKind;
use crate::error::{StateError, StateErrorKind};
use crate::key_group::{KeyGroup, KeyGroupRange};
use crate::ttl::{is_expired, NEVER_EXPIRES};

/// One entry of a snapshot: a key (and namespace) and the encoded value. A list yields one entry
/// per element, in order; a map one entry per user key.
#[derive(Debug)]
pub struct SnapshotEntry<'a, K, N> {
    /// The key.
    pub key: &'a K,
    /// The namespace, if the entry was written under one.
    pub namespace: Option<&'a N>,
    /// Map state: the encoded user key ([`StateCodec`]).
    pub user_key: Option<&'a [u8]>,
    /// The encoded value, list element or map value ([`StateCodec`]).
    pub value: &'a [u8],
    /// When the entry expires (milliseconds since the epoch), for states with TTL.
    pub expires_at_ms: Option<i64>,
}

/// A visitor of snapshot entries.
pub(crate) type Visitor<'v, K, N> =
    dyn FnMut(SnapshotEntry<'_, K, N>) -> Result<(), StateError> + 'v;

/// Reusable encoding buffers.
#[derive(Default)]
pub(crate) struct Scratch {
    user_key: Vec<u8>,
    value: Vec<u8>,
}

fn encode<T: StateCodec>(state: &str, value: &T, out: &mut Vec<u8>) -> Result<(), StateError> {
    out.clear();
    value.encode_into(out).map_err(|error| {
        StateErrorKind::Encode {
            state: state.to_string(),
            type_name: std::any::type_name::<T>(),
            reason: error.to_string(),
        }
        .into()
    })
}

fn expiry(expires_at: i64) -> Option<i64> {
    (expires_at != NEVER_EXPIRES).then_some(expires_at)
}

/// A stored value that can be written to a snapshot.
pub(crate) trait SnapshotValue: Stored {
    fn visit<K, N>(
        &self,
        state: &str,
        now: i64,
        key: &K,
        namespace: Option<&N>,
        scratch: &mut Scratch,
        visit: &mut Visitor<'_, K, N>,
    ) -> Result<(), StateError>;
}

impl<T: StateCodec + Clone> SnapshotValue for Entry<T> {
    fn visit<K, N>(
        &self,
        state: &str,
        now: i64,
        key: &K,
        namespace: Option<&N>,
        scratch: &mut Scratch,
        visit: &mut Visitor<'_, K, N>,
    ) -> Result<(), StateError> {
        if is_expired(self.expires_at, now) {
            return Ok(());
        }
        encode(state, &self.value, &mut scratch.value)?;
        visit(SnapshotEntry {
            key,
            namespace,
            user_key: None,
            value: &scratch.value,
            expires_at_ms: expiry(self.expires_at),
        })
    }
}

impl<T: StateCodec + Clone> SnapshotValue for Vec<Entry<T>> {
    fn visit<K, N>(
        &self,
        state: &str,
        now: i64,
        key: &K,
        namespace: Option<&N>,
        scratch: &mut Scratch,
        visit: &mut Visitor<'_, K, N>,
    ) -> Result<(), StateError> {
        for element in self {
            element.visit(state, now, key, namespace, scratch, visit)?;
        }
        Ok(())
    }
}

impl<UK, UV> SnapshotValue for FastMap<UK, Entry<UV>>
where
    UK: StateCodec + std::hash::Hash + Eq + Clone,
    UV: StateCodec + Clone,
{
    fn visit<K, N>(
        &self,
        state: &str,
        now: i64,
        key: &K,
        namespace: Option<&N>,
        scratch: &mut Scratch,
        visit: &mut Visitor<'_, K, N>,
    ) -> Result<(), StateError> {
        for (user_key, entry) in self {
            if is_expired(entry.expires_at, now) {
                continue;
            }
            encode(state, user_key, &mut scratch.user_key)?;
            encode(state, &entry.value, &mut scratch.value)?;
            visit(SnapshotEntry {
                key,
                namespace,
                user_key: Some(&scratch.user_key),
                value: &scratch.value,
                expires_at_ms: expiry(entry.expires_at),
            })?;
        }
        Ok(())
    }
}

/// The frozen key-group maps of one state.
pub(crate) trait TableSnapshot<K, N> {
    fn entries(&self) -> usize;
    fn visit_group(
        &self,
        group: usize,
        now: i64,
        visit: &mut Visitor<'_, K, N>,
    ) -> Result<(), StateError>;
}

/// [`TableSnapshot`] over shared key-group maps.
pub(crate) struct SharedGroups<K, N, V> {
    pub(crate) name: Rc<str>,
    pub(crate) groups: Vec<Rc<GroupMap<K, N, V>>>,
}

impl<K, N, V: SnapshotValue> TableSnapshot<K, N> for SharedGroups<K, N, V> {
    fn entries(&self) -> usize {
        self.groups.iter().map(|group| group.len()).sum()
    }

    fn visit_group(
        &self,
        group: usize,
        now: i64,
        visit: &mut Visitor<'_, K, N>,
    ) -> Result<(), StateError> {
        let mut scratch = Scratch::default();
        for ((key, namespace), value) in self.groups[group].iter() {
            value.visit(
                &self.name,
                now,
                key,
                namespace.as_ref(),
                &mut scratch,
                visit,
            )?;
        }
        Ok(())
    }
}

/// The snapshot of one state.
pub struct StateSnapshot<K, N> {
    pub(crate) name: String,
    pub(crate) kind: StateKind,
    pub(crate) key_groups: KeyGroupRange,
    pub(crate) taken_at_ms: i64,
    pub(crate) table: Box<dyn TableSnapshot<K, N>>,
}

impl<K, N> StateSnapshot<K, N> {
    /// The state name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The state kind.
    pub fn kind(&self) -> StateKind {
        self.kind
    }

    /// Number of `(key, namespace)` entries, including any that had expired but were not yet
    /// removed (those are skipped when visiting).
    pub fn entries(&self) -> usize {
        self.table.entries()
    }

    /// Visits the entries of one key group; a key group outside the backend's range has none.
    pub fn for_each_in_key_group(
        &self,
        key_group: KeyGroup,
        mut visit: impl FnMut(SnapshotEntry<'_, K, N>) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        if !self.key_groups.contains(key_group) {
            return Ok(());
        }
        let group = (key_group.0 - self.key_groups.start) as usize;
        self.table.visit_group(group, self.taken_at_ms, &mut visit)
    }

    /// Visits all entries, key group by key group in ascending order.
    pub fn for_each(
        &self,
        mut visit: impl FnMut(KeyGroup, SnapshotEntry<'_, K, N>) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        for group in self.key_groups.start..=self.key_groups.end {
            let key_group = KeyGroup(group);
            self.for_each_in_key_group(key_group, |entry| visit(key_group, entry))?;
        }
        Ok(())
    }
}

/// A consistent snapshot of all states of a heap backend.
pub struct HeapSnapshot<K, N> {
    pub(crate) taken_at_ms: i64,
    pub(crate) key_groups: KeyGroupRange,
    pub(crate) states: Vec<StateSnapshot<K, N>>,
}

impl<K, N> HeapSnapshot<K, N> {
    /// When the snapshot was taken (the backend clock, milliseconds since the epoch).
    pub fn taken_at_ms(&self) -> i64 {
        self.taken_at_ms
    }

    /// The key groups it covers.
    pub fn key_groups(&self) -> KeyGroupRange {
        self.key_groups
    }

    /// Every state, in registration order.
    pub fn states(&self) -> &[StateSnapshot<K, N>] {
        &self.states
    }

    /// The state named `name`.
    pub fn state(&self, name: &str) -> Option<&StateSnapshot<K, N>> {
        self.states.iter().find(|state| state.name == name)
    }
}

impl<K, N> std::fmt::Debug for HeapSnapshot<K, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapSnapshot")
            .field("taken_at_ms", &self.taken_at_ms)
            .field("key_groups", &self.key_groups)
            .field(
                "states",
                &self
                    .states
                    .iter()
                    .map(|state| &state.name)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}
