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
//!
//! States restored from a checkpoint that no descriptor has registered again yet are carried
//! along as they were restored, still encoded ([`HeapSnapshot::unregistered_restored_states`]):
//! [`crate::encode_keyed_snapshot`] writes them out unchanged, so they survive any number of
//! checkpoints until an operator asks for them (as in Flink).

use std::cell::RefCell;
use std::rc::Rc;

use crate::backend::heap::restore::RestoredState;
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

/// Decodes restored bytes, or says which state holds them and why they do not decode.
fn decode<T: StateCodec>(state: &str, what: &'static str, bytes: &[u8]) -> Result<T, StateError> {
    T::decode(bytes).map_err(|error| {
        StateErrorKind::Corrupt {
            state: state.to_string(),
            what,
            type_name: std::any::type_name::<T>(),
            len: bytes.len(),
            reason: error.to_string(),
        }
        .into()
    })
}

/// A stored value that can be written to a snapshot, and rebuilt from one entry at a time when
/// a restored state is registered.
pub(crate) trait SnapshotValue: Stored {
    /// One entry of a snapshot, decoded: a value, a list element, or a map entry.
    type Part;

    /// The type fingerprint of the stored values (the value type, the list element type, the
    /// map value type).
    fn value_type() -> &'static str;

    /// The type fingerprint of a map's user keys; `None` for other kinds.
    fn user_key_type() -> Option<&'static str>;

    /// Decodes one restored entry of state `state`, expiring at `expires_at`.
    fn decode_part(
        state: &str,
        user_key: Option<&[u8]>,
        value: &[u8],
        expires_at: i64,
    ) -> Result<Self::Part, StateError>;

    /// The stored value made of its first restored part.
    fn from_part(part: Self::Part) -> Self;

    /// Adds a later restored part: a value replaces, a list element is appended, a map entry
    /// is inserted.
    fn add_part(&mut self, part: Self::Part);

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
    type Part = Entry<T>;

    fn value_type() -> &'static str {
        std::any::type_name::<T>()
    }

    fn user_key_type() -> Option<&'static str> {
        None
    }

    fn decode_part(
        state: &str,
        _user_key: Option<&[u8]>,
        value: &[u8],
        expires_at: i64,
    ) -> Result<Entry<T>, StateError> {
        Ok(Entry {
            value: decode(state, "checkpointed value", value)?,
            expires_at,
        })
    }

    fn from_part(part: Entry<T>) -> Self {
        part
    }

    fn add_part(&mut self, part: Entry<T>) {
        *self = part;
    }

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
    type Part = Entry<T>;

    fn value_type() -> &'static str {
        std::any::type_name::<T>()
    }

    fn user_key_type() -> Option<&'static str> {
        None
    }

    fn decode_part(
        state: &str,
        _user_key: Option<&[u8]>,
        value: &[u8],
        expires_at: i64,
    ) -> Result<Entry<T>, StateError> {
        Ok(Entry {
            value: decode(state, "checkpointed list element", value)?,
            expires_at,
        })
    }

    fn from_part(part: Entry<T>) -> Self {
        vec![part]
    }

    fn add_part(&mut self, part: Entry<T>) {
        self.push(part);
    }

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
    type Part = (UK, Entry<UV>);

    fn value_type() -> &'static str {
        std::any::type_name::<UV>()
    }

    fn user_key_type() -> Option<&'static str> {
        Some(std::any::type_name::<UK>())
    }

    fn decode_part(
        state: &str,
        user_key: Option<&[u8]>,
        value: &[u8],
        expires_at: i64,
    ) -> Result<(UK, Entry<UV>), StateError> {
        let user_key = decode(state, "checkpointed map key", user_key.unwrap_or_default())?;
        let value = decode(state, "checkpointed map value", value)?;
        Ok((user_key, Entry { value, expires_at }))
    }

    fn from_part((user_key, entry): (UK, Entry<UV>)) -> Self {
        let mut map = FastMap::default();
        map.insert(user_key, entry);
        map
    }

    fn add_part(&mut self, (user_key, entry): (UK, Entry<UV>)) {
        self.insert(user_key, entry);
    }

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
    /// Bucket positions of key group `group` ([`TableSnapshot::visit_group_buckets`]).
    fn buckets(&self, group: usize) -> usize;
    /// Visits the entries of key group `group` at the bucket positions `positions`, so that a
    /// large key group can be read in pieces.
    fn visit_group_buckets(
        &self,
        group: usize,
        positions: std::ops::Range<usize>,
        now: i64,
        visit: &mut Visitor<'_, K, N>,
    ) -> Result<(), StateError>;
    /// Whether visiting key group `group` at `now` visits anything (something not expired).
    fn has_live(&self, group: usize, now: i64) -> bool;
    /// Lets go of key group `group` (read whole by its only reader): it reads as empty after,
    /// and its memory goes over the next calls of [`TableSnapshot::release_some`] (a key
    /// group of many entries took up to 20 ms to free at once), not with the whole snapshot.
    /// Returns how many entries are left to free that way (0: the live table still shares the
    /// group's map, so nothing of it is freed).
    fn release(&self, group: usize) -> usize;
    /// Frees up to `entries` entries of the key group released last; returns how many it
    /// freed (0: nothing is left to free).
    fn release_some(&self, entries: usize) -> usize;
    /// Entries released and not freed yet (`None`: none being freed).
    #[cfg(test)]
    fn releasing_len(&self) -> Option<usize>;

    fn visit_group(
        &self,
        group: usize,
        now: i64,
        visit: &mut Visitor<'_, K, N>,
    ) -> Result<(), StateError> {
        self.visit_group_buckets(group, 0..self.buckets(group), now, visit)
    }
}

/// [`TableSnapshot`] over shared key-group maps.
pub(crate) struct SharedGroups<K, N, V> {
    pub(crate) name: Rc<str>,
    pub(crate) groups: Vec<RefCell<Rc<GroupMap<K, N, V>>>>,
    /// The entries of the key group released last, if the snapshot held its map alone (the
    /// live table copied it on its first write since), being freed.
    pub(crate) releasing: RefCell<Option<GroupEntries<K, N, V>>>,
}

/// A key group's entries, taken out of its map to be freed a few at a time.
pub(crate) type GroupEntries<K, N, V> = hashbrown::hash_table::IntoIter<((K, Option<N>), V)>;

impl<K, N, V: SnapshotValue> TableSnapshot<K, N> for SharedGroups<K, N, V> {
    fn entries(&self) -> usize {
        self.groups.iter().map(|group| group.borrow().len()).sum()
    }

    fn buckets(&self, group: usize) -> usize {
        self.groups[group].borrow().num_buckets()
    }

    fn has_live(&self, group: usize, now: i64) -> bool {
        self.groups[group]
            .borrow()
            .values()
            .any(|value| value.any_live(now))
    }

    fn release(&self, group: usize) -> usize {
        // A map the live table still shares only loses a reference; one it copied on its
        // first write since the snapshot is the snapshot's alone, to be freed in steps.
        let map = self.groups[group].replace(Rc::default());
        match Rc::try_unwrap(map) {
            Ok(map) => {
                let entries = map.len();
                *self.releasing.borrow_mut() = Some(map.into_entries());
                entries
            }
            Err(_) => 0,
        }
    }

    #[cfg(test)]
    fn releasing_len(&self) -> Option<usize> {
        self.releasing.borrow().as_ref().map(ExactSizeIterator::len)
    }

    fn release_some(&self, entries: usize) -> usize {
        let mut releasing = self.releasing.borrow_mut();
        let Some(left) = releasing.as_mut() else {
            return 0;
        };
        let freed = left.by_ref().take(entries).count();
        if left.len() == 0 {
            // The table's own memory goes with the emptied iterator.
            *releasing = None;
        }
        freed
    }

    fn visit_group_buckets(
        &self,
        group: usize,
        positions: std::ops::Range<usize>,
        now: i64,
        visit: &mut Visitor<'_, K, N>,
    ) -> Result<(), StateError> {
        let mut scratch = Scratch::default();
        for ((key, namespace), value) in self.groups[group].borrow().iter_buckets(positions) {
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
    /// The stored value type (list element, map value), as `std::any::type_name` gives it.
    pub(crate) value_type: &'static str,
    /// Map state: the user key type.
    pub(crate) user_key_type: Option<&'static str>,
    pub(crate) has_ttl: bool,
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

    /// The type of the stored values (of list elements, of map values), as
    /// `std::any::type_name` gives it: the fingerprint a restore checks.
    pub fn value_type(&self) -> &'static str {
        self.value_type
    }

    /// Map state: the type of the user keys.
    pub fn user_key_type(&self) -> Option<&'static str> {
        self.user_key_type
    }

    /// Whether the state has a time to live.
    pub fn has_ttl(&self) -> bool {
        self.has_ttl
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

    /// Bucket positions of key group `key_group` (0 outside the state's key groups): what
    /// [`StateSnapshot::visit_key_group_buckets`] reads a key group in pieces by.
    pub(crate) fn buckets_in_key_group(&self, key_group: KeyGroup) -> usize {
        self.group_index(key_group)
            .map_or(0, |group| self.table.buckets(group))
    }

    /// Visits the entries of `key_group` at bucket positions `positions`, in position order.
    pub(crate) fn visit_key_group_buckets(
        &self,
        key_group: KeyGroup,
        positions: std::ops::Range<usize>,
        mut visit: impl FnMut(SnapshotEntry<'_, K, N>) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        match self.group_index(key_group) {
            Some(group) => {
                self.table
                    .visit_group_buckets(group, positions, self.taken_at_ms, &mut visit)
            }
            None => Ok(()),
        }
    }

    /// Whether visiting `key_group` visits any entry (one not expired when the snapshot was
    /// taken).
    pub(crate) fn has_entries_in_key_group(&self, key_group: KeyGroup) -> bool {
        self.group_index(key_group)
            .is_some_and(|group| self.table.has_live(group, self.taken_at_ms))
    }

    /// Lets go of `key_group`, read whole ([`TableSnapshot::release`]); returns how many
    /// entries are left to free with [`StateSnapshot::release_some`].
    pub(crate) fn release_key_group(&self, key_group: KeyGroup) -> usize {
        self.group_index(key_group)
            .map_or(0, |group| self.table.release(group))
    }

    /// Entries released and not freed yet ([`TableSnapshot::releasing_len`]).
    #[cfg(test)]
    pub(crate) fn table_releasing_len(&self) -> Option<usize> {
        self.table.releasing_len()
    }

    /// Frees up to `entries` entries of the key group released last
    /// ([`TableSnapshot::release_some`]); returns how many it freed.
    pub(crate) fn release_some(&self, entries: usize) -> usize {
        self.table.release_some(entries)
    }

    fn group_index(&self, key_group: KeyGroup) -> Option<usize> {
        self.key_groups
            .contains(key_group)
            .then(|| (key_group.0 - self.key_groups.start) as usize)
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
    pub(crate) max_parallelism: u32,
    pub(crate) key_groups: KeyGroupRange,
    pub(crate) states: Vec<StateSnapshot<K, N>>,
    /// Restored states not registered again yet, still encoded (see the module docs).
    pub(crate) restored: Vec<Rc<RestoredState>>,
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

    /// The number of key groups of the job (`pipeline.max-parallelism`).
    pub fn max_parallelism(&self) -> u32 {
        self.max_parallelism
    }

    /// Every registered state, in registration order.
    pub fn states(&self) -> &[StateSnapshot<K, N>] {
        &self.states
    }

    /// States restored from a checkpoint that were not registered again: their names and
    /// kinds, in checkpoint order. Their entries stay encoded; the snapshot's encoding holds them
    /// unchanged.
    pub fn unregistered_restored_states(&self) -> impl Iterator<Item = (&str, StateKind)> {
        self.restored
            .iter()
            .map(|state| (state.header.name.as_str(), state.header.kind))
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
            .field(
                "unregistered_restored",
                &self
                    .restored
                    .iter()
                    .map(|state| &state.header.name)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}
