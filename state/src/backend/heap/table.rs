//! The heap backend's data structure: one typed map per key group, copied on write.
//!
//! A state's table holds, for each key group the backend owns, an `Rc` to a hash table of
//! `(key, namespace)` and the stored value ([`GroupMap`]). A snapshot clones the `Rc`s (one
//! pointer per key group, no entry is copied); the next write to a key group that a snapshot
//! still shares copies that key group's map first (`Rc::make_mut`). So a checkpoint sees a
//! consistent version while processing goes on, and pays at most one copy of each key group it
//! overlaps with writes — never of the whole state at once.
//!
//! The maps hash with [`StableHasher`] (fast, no per-map seed) and hold their entries inline,
//! so a lookup in a large state costs one cache miss, not two as in an index-plus-entries map.
//! Background TTL cleanup resumes at a bucket position instead of rescanning: removing an entry
//! moves no other. Lookups by the current key take its hash from the key context
//! ([`HashedKey`]), computed once per `set_current_key`, so a read followed by a write hashes
//! nothing.
//!
//! **Size estimate.** Each table counts its entries and nested elements (list elements, map
//! entries) as they change, and estimates its size from those counts and the inline sizes of its
//! types: per entry `size_of::<(K, Option<N>)>() + size_of::<V>() + 24` bytes (control byte
//! and load-factor slack of the hash table), plus per nested element the inline size of the
//! element (and 24 bytes of index slot, hash and slack for map entries). Heap memory that keys and values
//! own themselves (a `String`'s bytes, a `Vec`'s buffer) and spare capacity are not counted, and
//! neither are copies held by snapshots: the estimate ranks states by size and shows growth; the
//! authoritative per-shard number is the counting allocator's.

use std::hash::BuildHasherDefault;
use std::mem::size_of;
use std::rc::Rc;

use std::hash::BuildHasher;

use hashbrown::hash_table::{Entry as Slot, HashTable};
use indexmap::IndexMap;

use crate::key_group::StableHasher;
use crate::ttl::is_expired;

/// The hasher of all heap maps.
pub(crate) type StableBuildHasher = BuildHasherDefault<StableHasher>;
/// An insertion-ordered hash map with the stable hasher (a map state's entries).
pub(crate) type FastMap<K, V> = IndexMap<K, V, StableBuildHasher>;

/// The entries of one key group: `(key, namespace)` and the stored value, inline in a hash
/// table. Positions are bucket indexes.
pub(crate) struct GroupMap<K, N, V> {
    table: HashTable<((K, Option<N>), V)>,
}

impl<K, N, V> Default for GroupMap<K, N, V> {
    fn default() -> Self {
        GroupMap {
            table: HashTable::new(),
        }
    }
}

impl<K: Clone, N: Clone, V: Clone> Clone for GroupMap<K, N, V> {
    fn clone(&self) -> Self {
        GroupMap {
            table: self.table.clone(),
        }
    }
}

impl<K, N, V> GroupMap<K, N, V> {
    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// Every entry, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&(K, Option<N>), &V)> {
        self.table.iter().map(|(key, value)| (key, value))
    }

    /// Every value.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.table.iter().map(|(_, value)| value)
    }

    /// The entries, taken: the table's memory goes when the iterator is dropped.
    pub(crate) fn into_entries(self) -> hashbrown::hash_table::IntoIter<((K, Option<N>), V)> {
        self.table.into_iter()
    }

    /// Bucket positions: each holds at most one entry.
    pub(crate) fn num_buckets(&self) -> usize {
        self.table.num_buckets()
    }

    /// The entries at the bucket positions `positions`, in position order: a map that does not
    /// change can be read in pieces, each resuming where the last stopped.
    pub(crate) fn iter_buckets(
        &self,
        positions: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (&(K, Option<N>), &V)> {
        positions
            .filter_map(|index| self.table.get_bucket(index))
            .map(|(key, value)| (key, value))
    }
}

/// The hash a group map files `key` under: [`HashedKey::hash`] must be this.
pub(crate) fn hash_of<K: std::hash::Hash, N: std::hash::Hash>(key: &(K, Option<N>)) -> u64 {
    StableBuildHasher::default().hash_one(key)
}

/// A `(key, namespace)` and its hash under [`StableBuildHasher`], as the key context caches
/// them. The hash must be that of `key`: a wrong one finds nothing, or files an entry where
/// lookups by key never find it.
pub(crate) struct HashedKey<'a, K, N> {
    pub(crate) key: &'a (K, Option<N>),
    pub(crate) hash: u64,
}

impl<K, N> Clone for HashedKey<'_, K, N> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K, N> Copy for HashedKey<'_, K, N> {}

/// Hash map overhead per entry, in bytes (see the module docs).
const MAP_ENTRY_OVERHEAD: usize = 24;

/// A value and the instant it expires ([`crate::ttl::NEVER_EXPIRES`] without TTL).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Entry<T> {
    pub(crate) value: T,
    pub(crate) expires_at: i64,
}

/// What a TTL purge did to a stored value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purge {
    /// Nothing expired.
    Untouched,
    /// Some parts expired and were removed.
    Changed,
    /// Everything expired: remove the entry.
    Empty,
}

/// A value a heap table stores per `(key, namespace)`.
pub(crate) trait Stored: Clone + 'static {
    /// Inline bytes of one nested element (0 for plain values).
    const NESTED_BYTES: usize;
    /// Number of nested elements (list elements, map entries).
    fn nested_len(&self) -> usize;
    /// Whether a container holds nothing (always false for plain values).
    fn is_empty_container(&self) -> bool;
    /// Whether anything in it is expired at `now` (read-only, so a shared key group is not
    /// copied just to find out).
    fn any_expired(&self, now: i64) -> bool;
    /// Whether anything in it is still live at `now`.
    fn any_live(&self, now: i64) -> bool;
    /// Removes what is expired at `now`.
    fn purge_expired(&mut self, now: i64) -> Purge;
}

impl<T: Clone + 'static> Stored for Entry<T> {
    const NESTED_BYTES: usize = 0;

    fn nested_len(&self) -> usize {
        0
    }

    fn is_empty_container(&self) -> bool {
        false
    }

    fn any_expired(&self, now: i64) -> bool {
        is_expired(self.expires_at, now)
    }

    fn any_live(&self, now: i64) -> bool {
        !is_expired(self.expires_at, now)
    }

    fn purge_expired(&mut self, now: i64) -> Purge {
        if is_expired(self.expires_at, now) {
            Purge::Empty
        } else {
            Purge::Untouched
        }
    }
}

impl<T: Clone + 'static> Stored for Vec<Entry<T>> {
    const NESTED_BYTES: usize = size_of::<Entry<T>>();

    fn nested_len(&self) -> usize {
        self.len()
    }

    fn is_empty_container(&self) -> bool {
        self.is_empty()
    }

    fn any_expired(&self, now: i64) -> bool {
        self.iter()
            .any(|element| is_expired(element.expires_at, now))
    }

    fn any_live(&self, now: i64) -> bool {
        self.iter()
            .any(|element| !is_expired(element.expires_at, now))
    }

    fn purge_expired(&mut self, now: i64) -> Purge {
        let before = self.len();
        self.retain(|element| !is_expired(element.expires_at, now));
        purge_result(before, self.len())
    }
}

impl<UK, UV> Stored for FastMap<UK, Entry<UV>>
where
    UK: std::hash::Hash + Eq + Clone + 'static,
    UV: Clone + 'static,
{
    const NESTED_BYTES: usize = size_of::<UK>() + size_of::<Entry<UV>>() + MAP_ENTRY_OVERHEAD;

    fn nested_len(&self) -> usize {
        self.len()
    }

    fn is_empty_container(&self) -> bool {
        self.is_empty()
    }

    fn any_expired(&self, now: i64) -> bool {
        self.values().any(|entry| is_expired(entry.expires_at, now))
    }

    fn any_live(&self, now: i64) -> bool {
        self.values()
            .any(|entry| !is_expired(entry.expires_at, now))
    }

    fn purge_expired(&mut self, now: i64) -> Purge {
        let before = self.len();
        self.retain(|_, entry| !is_expired(entry.expires_at, now));
        purge_result(before, self.len())
    }
}

fn purge_result(before: usize, after: usize) -> Purge {
    if after == 0 {
        Purge::Empty
    } else if after < before {
        Purge::Changed
    } else {
        Purge::Untouched
    }
}

/// Progress of one bounded cleanup step over one key group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct GroupCleanup {
    /// Entries looked at.
    pub(crate) examined: usize,
    /// Entries removed entirely.
    pub(crate) removed: usize,
    /// Where the next step in this key group starts, or `None` when it is done.
    pub(crate) next: Option<usize>,
}

/// One state's entries, partitioned by key group (see the module docs).
pub(crate) struct KeyGroupedTable<K, N, V> {
    groups: Vec<Rc<GroupMap<K, N, V>>>,
    entries: usize,
    nested: usize,
}

impl<K, N, V> KeyGroupedTable<K, N, V>
where
    K: std::hash::Hash + Eq + Clone + 'static,
    N: std::hash::Hash + Eq + Clone + 'static,
    V: Stored,
{
    /// An empty table for `groups` key groups.
    pub(crate) fn new(groups: usize) -> Self {
        KeyGroupedTable {
            groups: (0..groups).map(|_| Rc::new(GroupMap::default())).collect(),
            entries: 0,
            nested: 0,
        }
    }

    /// The value of `key` in key group `group`.
    #[inline]
    pub(crate) fn get(&self, group: usize, key: HashedKey<'_, K, N>) -> Option<&V> {
        self.groups[group]
            .table
            .find(key.hash, |(stored, _)| stored == key.key)
            .map(|(_, value)| value)
    }

    /// Changes the value of `key` in place, if present. A container left empty is removed.
    /// Callers check that the key is present first: a key group shared with a snapshot is
    /// copied before the lookup.
    #[inline]
    pub(crate) fn modify<R>(
        &mut self,
        group: usize,
        key: HashedKey<'_, K, N>,
        change: impl FnOnce(&mut V) -> R,
    ) -> Option<R> {
        let map = &mut Rc::make_mut(&mut self.groups[group]).table;
        let Ok(mut slot) = map.find_entry(key.hash, |(stored, _)| stored == key.key) else {
            return None;
        };
        let value = &mut slot.get_mut().1;
        let before = value.nested_len();
        let result = change(value);
        let after = value.nested_len();
        let empty = value.is_empty_container();
        self.nested = self.nested + after - before;
        if empty {
            slot.remove();
            self.entries -= 1;
        }
        Some(result)
    }

    /// Stores `value` under `key`, replacing any previous value; clones the key only when it
    /// is new.
    #[inline]
    pub(crate) fn upsert(&mut self, group: usize, key: HashedKey<'_, K, N>, value: V) {
        let added = value.nested_len();
        let map = &mut Rc::make_mut(&mut self.groups[group]).table;
        match map.entry(
            key.hash,
            |(stored, _)| stored == key.key,
            |(stored, _)| hash_of(stored),
        ) {
            Slot::Occupied(mut slot) => {
                let stored = &mut slot.get_mut().1;
                self.nested = self.nested + added - stored.nested_len();
                *stored = value;
            }
            Slot::Vacant(slot) => {
                slot.insert((key.key.clone(), value));
                self.entries += 1;
                self.nested += added;
            }
        }
    }

    /// Adds one restored part (a value, a list element, a map entry) to the value of `key`:
    /// the value is made with `new` if `key` has none yet, else `part` is added with `add`.
    /// Used only while a restored state is registered (see `super::restore`).
    pub(crate) fn add_restored<P>(
        &mut self,
        group: usize,
        key: HashedKey<'_, K, N>,
        part: P,
        new: impl FnOnce(P) -> V,
        add: impl FnOnce(&mut V, P),
    ) {
        let map = &mut Rc::make_mut(&mut self.groups[group]).table;
        match map.entry(
            key.hash,
            |(stored, _)| stored == key.key,
            |(stored, _)| hash_of(stored),
        ) {
            Slot::Occupied(mut slot) => {
                let stored = &mut slot.get_mut().1;
                let before = stored.nested_len();
                add(stored, part);
                self.nested = self.nested + stored.nested_len() - before;
            }
            Slot::Vacant(slot) => {
                let value = new(part);
                self.nested += value.nested_len();
                self.entries += 1;
                slot.insert((key.key.clone(), value));
            }
        }
    }

    /// Removes `key`, returning its value.
    #[inline]
    pub(crate) fn remove(&mut self, group: usize, key: HashedKey<'_, K, N>) -> Option<V> {
        // Do not copy a key group shared with a snapshot for nothing.
        self.get(group, key)?;
        let map = &mut Rc::make_mut(&mut self.groups[group]).table;
        let Ok(slot) = map.find_entry(key.hash, |(stored, _)| stored == key.key) else {
            return None;
        };
        let ((_, removed), _) = slot.remove();
        self.entries -= 1;
        self.nested -= removed.nested_len();
        Some(removed)
    }

    /// The maps of all key groups, shared (a snapshot).
    pub(crate) fn share_groups(&self) -> Vec<Rc<GroupMap<K, N, V>>> {
        self.groups.clone()
    }

    /// The map of one key group.
    pub(crate) fn group(&self, group: usize) -> &GroupMap<K, N, V> {
        &self.groups[group]
    }

    /// Number of key groups.
    pub(crate) fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Drops every entry of key group `group` (a snapshot keeps its own copy).
    pub(crate) fn clear_group(&mut self, group: usize) {
        let map = std::mem::take(&mut self.groups[group]);
        self.entries -= map.len();
        self.nested -= map.values().map(Stored::nested_len).sum::<usize>();
    }

    /// Number of `(key, namespace)` entries.
    pub(crate) fn entries(&self) -> usize {
        self.entries
    }

    /// Estimated bytes (see the module docs).
    pub(crate) fn estimated_bytes(&self) -> usize {
        self.entries * (size_of::<(K, Option<N>)>() + size_of::<V>() + MAP_ENTRY_OVERHEAD)
            + self.nested * V::NESTED_BYTES
    }

    /// Removes what is expired at `now` among at most `budget` bucket positions of key group
    /// `group`, starting at position `start`. Removal moves no other entry, so the next step
    /// resumes exactly where this one stopped, unless the map grew (and rehashed) meanwhile:
    /// then some entries may be skipped until the next round (a read still never returns one
    /// that expired).
    pub(crate) fn cleanup_group(
        &mut self,
        group: usize,
        start: usize,
        budget: usize,
        now: i64,
    ) -> GroupCleanup {
        let map = &self.groups[group].table;
        let end = map.num_buckets().min(start.saturating_add(budget));
        if start >= end {
            return GroupCleanup {
                examined: 0,
                removed: 0,
                next: None,
            };
        }
        let examined = end - start;
        let expired: Vec<usize> = (start..end)
            .filter(|&index| {
                map.get_bucket(index)
                    .is_some_and(|(_, value)| value.any_expired(now))
            })
            .collect();
        let mut removed = 0;
        if !expired.is_empty() {
            let map = &mut Rc::make_mut(&mut self.groups[group]).table;
            for index in expired {
                let Some(mut slot) = map.get_bucket_entry(index).ok() else {
                    continue;
                };
                let value = &mut slot.get_mut().1;
                let before = value.nested_len();
                let purge = value.purge_expired(now);
                let after = value.nested_len();
                self.nested = self.nested + after - before;
                if purge == Purge::Empty {
                    slot.remove();
                    self.entries -= 1;
                    removed += 1;
                }
            }
        }
        GroupCleanup {
            examined,
            removed,
            next: (end < self.groups[group].table.num_buckets()).then_some(end),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ttl::NEVER_EXPIRES;

    use std::hash::BuildHasher;

    fn key(k: u32) -> (u32, Option<u8>) {
        (k, None)
    }

    fn hashed(key: &(u32, Option<u8>)) -> HashedKey<'_, u32, u8> {
        HashedKey {
            key,
            hash: StableBuildHasher::default().hash_one(key),
        }
    }

    #[test]
    fn snapshot_shares_until_write() {
        let mut table: KeyGroupedTable<u32, u8, Entry<u64>> = KeyGroupedTable::new(2);
        table.upsert(
            0,
            hashed(&key(1)),
            Entry {
                value: 10,
                expires_at: NEVER_EXPIRES,
            },
        );
        table.upsert(
            1,
            hashed(&key(2)),
            Entry {
                value: 20,
                expires_at: NEVER_EXPIRES,
            },
        );
        let snapshot = table.share_groups();
        table.modify(0, hashed(&key(1)), |entry| entry.value = 11);
        // Key group 0 was copied, key group 1 is still shared.
        assert!(!Rc::ptr_eq(&snapshot[0], &table.groups[0]));
        assert!(Rc::ptr_eq(&snapshot[1], &table.groups[1]));
        let old: Vec<u64> = snapshot[0].values().map(|entry| entry.value).collect();
        assert_eq!(old, [10]);
        assert_eq!(table.get(0, hashed(&key(1))).unwrap().value, 11);
        // Removing an absent key does not copy a shared group.
        assert!(table.remove(1, hashed(&key(99))).is_none());
        assert!(Rc::ptr_eq(&snapshot[1], &table.groups[1]));
    }

    #[test]
    fn counts_follow_nested_changes() {
        let mut table: KeyGroupedTable<u32, u8, Vec<Entry<u64>>> = KeyGroupedTable::new(1);
        let element = |value| Entry {
            value,
            expires_at: NEVER_EXPIRES,
        };
        table.upsert(0, hashed(&key(1)), vec![element(1), element(2)]);
        table.modify(0, hashed(&key(1)), |list| list.push(element(3)));
        assert_eq!((table.entries(), table.nested), (1, 3));
        table.modify(0, hashed(&key(1)), |list| list.clear());
        assert_eq!((table.entries(), table.nested), (0, 0));
        assert_eq!(table.estimated_bytes(), 0);
    }

    #[test]
    fn lookups_find_every_key_after_the_map_grew_and_shrank() {
        let mut table: KeyGroupedTable<u32, u8, Entry<u64>> = KeyGroupedTable::new(1);
        let entry = |value| Entry {
            value,
            expires_at: NEVER_EXPIRES,
        };
        // Growing rehashes every entry with `hash_of`, which must agree with the cached hash.
        for k in 0..5000u32 {
            table.upsert(0, hashed(&key(k)), entry(u64::from(k)));
        }
        for k in (0..5000u32).step_by(2) {
            assert_eq!(
                table.remove(0, hashed(&key(k))).map(|e| e.value),
                Some(u64::from(k))
            );
        }
        for k in 5000..6000u32 {
            table.upsert(0, hashed(&key(k)), entry(u64::from(k)));
        }
        for k in 0..6000u32 {
            let expected = (k % 2 == 1 || k >= 5000).then_some(u64::from(k));
            assert_eq!(
                table.get(0, hashed(&key(k))).map(|e| e.value),
                expected,
                "key {k}"
            );
        }
        assert_eq!(table.entries(), 3500);
        assert_eq!(table.group(0).len(), 3500);
    }

    #[test]
    fn cleanup_is_bounded_and_complete() {
        let mut table: KeyGroupedTable<u32, u8, Entry<u64>> = KeyGroupedTable::new(1);
        for k in 0..100u32 {
            let expires_at = if k % 2 == 0 { 50 } else { NEVER_EXPIRES };
            table.upsert(
                0,
                hashed(&key(k)),
                Entry {
                    value: 0,
                    expires_at,
                },
            );
        }
        let mut position = Some(0);
        let mut steps = 0;
        while let Some(start) = position {
            let step = table.cleanup_group(0, start, 10, 100);
            assert!(step.examined <= 10);
            position = step.next;
            steps += 1;
        }
        assert!(steps >= 5);
        // Removal moves no entry: one round finds every expired one.
        assert_eq!(table.entries(), 50);
        assert!(table
            .group(0)
            .values()
            .all(|entry| entry.expires_at == NEVER_EXPIRES));
    }
}
