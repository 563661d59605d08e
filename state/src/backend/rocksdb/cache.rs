//! The write-back cache in front of a slot's RocksDB: the hot entries of its value states
//! (value, reducing and aggregating state — a window's accumulators among them), in memory.
//!
//! Keyed state is read, changed and written back per record. Straight to RocksDB that is a
//! memtable lookup and a write per record, about 1.3 µs on this project's machine, which is
//! what held the window operators on RocksDB to a tenth of their heap speed. With the cache a
//! record's read-modify-write on a hot entry is a hash lookup in memory, and RocksDB sees an
//! entry only when the cache evicts it, when too much is dirty (below), or when a scan (or a
//! savepoint's flushed checkpoint) needs RocksDB to hold everything. A checkpoint's cut copies
//! the dirty entries instead and leaves them dirty (`held.rs`). A window pane that is created, filled, fired and deleted while it is cached never
//! reaches RocksDB at all.
//!
//! **What an entry is.** An entry is one RocksDB key of a cached column family and what the
//! cache knows of its value: the value frame (as `value.rs` lays it out, so TTL works on cached
//! values exactly as on stored ones), or that there is none. Three flags say how it relates to
//! RocksDB: *dirty* (the cache's value or deletion is newer than RocksDB's and must be written
//! back), *stored* (RocksDB may hold a value for the key: false only after the cache read the key
//! and found nothing, or wrote its deletion back) and *referenced* (read or written since the
//! eviction hand last passed it).
//!
//! **Deletes** of a key that RocksDB does not hold drop the entry and write nothing; others leave
//! a dirty tombstone that the write-back turns into a RocksDB delete.
//!
//! **Eviction** is CLOCK over the hash table's buckets: when the table is as full as it may be,
//! or the buffers of long entries take the cache past its capacity, the hand sweeps, giving
//! referenced entries a second chance and evicting the others until a sixteenth of the entries
//! (and enough bytes) are free, and the dirty ones among them go to RocksDB in one write batch.
//!
//! **Dirty bound.** Once the dirty entries hold more than about one memtable (the slot's
//! column write buffer), all of them are written back, staying cached and clean: a write batch
//! lands in one memtable whatever its size, and a checkpoint's barrier writes back and
//! flushes what is dirty, so this bounds the barrier's work even after a replay or a bulk
//! load dirtied the whole cache.
//!
//! **Consistency with RocksDB.** Only cached column families go through the cache, and every
//! access to them does; whatever reads RocksDB directly (a flushed checkpoint, a key-group
//! scan, a compaction, a size estimate) first has the cache write back what is dirty
//! ([`super::RocksDbInstance`] does that), a checkpoint's cut copies what is dirty beside
//! RocksDB's files, and a range deletion first drops the column family's entries. A write-back that fails fails the job (its records are gone from the cache); the job
//! restarts from its last checkpoint, as after any RocksDB write error.
//!
//! **Layout.** An entry keeps its key and value inline when they fit [`INLINE_BYTES`] (a
//! window accumulator does: column id, key group, an 8-byte key, an 8-byte pane and an 8-byte
//! count take 42 bytes with a TTL header), so that a lookup touches one 64-byte table slot and
//! nothing else; longer ones go to a buffer of their own. Firing windows reads every live pane in
//! no order the CPU caches can follow, so what a lookup touches is what it costs.
//!
//! **Memory.** The capacity is a share of the slot's managed memory
//! (`state.backend.rocksdb.memory.write-back-ratio`), taken from the block cache. The table
//! grows as entries come, up to the largest power of two of 65-byte slots (entry and control
//! byte) within the capacity, and never past it: the cache holds at most half as many entries
//! as hashbrown's capacity for that many slots, because a table that runs out of free slots
//! (deleted entries leave tombstones) rehashes in place while at most half full, and doubles
//! otherwise. What the cache holds is its table plus the buffers of long entries (their
//! capacity and the allocator's header), and it stays within the capacity.

use std::hash::Hasher;
use std::mem::size_of;

use hashbrown::HashTable;

use crate::backend::rocksdb::held::HeldWrites;
use crate::error::StateError;
use crate::key_group::StableHasher;

/// A cached column family, as the cache numbers them.
pub(crate) type ColumnId = u32;

/// The entry holds a value (else it stands for "no value").
const PRESENT: u8 = 1;
/// The entry is newer than RocksDB.
const DIRTY: u8 = 2;
/// RocksDB may hold a value for the key.
const STORED: u8 = 4;
/// Used since the eviction hand last passed.
const REFERENCED: u8 = 8;

/// Bytes of one table slot: an entry and its control byte.
pub(crate) const SLOT_BYTES: usize = size_of::<Cached>() + 1;

/// The smallest capacity a cache may have (a table of 32 slots holding 14 entries).
pub const MIN_WRITE_BACK_BYTES: usize = 4 << 10;

/// The allocator's header of a long entry's buffer, charged with it.
const BUFFER_OVERHEAD: usize = 16;

/// Key and value bytes an entry holds inline.
pub(crate) const INLINE_BYTES: usize = 46;

/// An entry's bytes: inline when they fit, else in a buffer of their own.
enum EntryBytes {
    Inline { len: u8, bytes: [u8; INLINE_BYTES] },
    Buffer(Vec<u8>),
}

impl EntryBytes {
    /// The `parts` one after the other.
    fn new(parts: &[&[u8]]) -> EntryBytes {
        let len: usize = parts.iter().map(|part| part.len()).sum();
        if len <= INLINE_BYTES {
            let mut bytes = [0; INLINE_BYTES];
            let mut at = 0;
            for part in parts {
                bytes[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            }
            EntryBytes::Inline {
                len: len as u8,
                bytes,
            }
        } else {
            EntryBytes::Buffer(parts.concat())
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            EntryBytes::Inline { len, bytes } => &bytes[..usize::from(*len)],
            EntryBytes::Buffer(buffer) => buffer,
        }
    }

    /// Keeps the first `at` bytes and appends `tail`.
    fn replace_tail(&mut self, at: usize, tail: &[u8]) {
        let len = at + tail.len();
        match self {
            EntryBytes::Inline { len: old, bytes } if len <= INLINE_BYTES => {
                bytes[at..len].copy_from_slice(tail);
                *old = len as u8;
            }
            EntryBytes::Buffer(buffer) => {
                buffer.truncate(at);
                buffer.extend_from_slice(tail);
            }
            EntryBytes::Inline { .. } => {
                *self = EntryBytes::new(&[&self.as_slice()[..at], tail]);
            }
        }
    }

    /// Bytes held outside the entry.
    fn outside(&self) -> usize {
        match self {
            EntryBytes::Inline { .. } => 0,
            EntryBytes::Buffer(buffer) => buffer.capacity() + BUFFER_OVERHEAD,
        }
    }
}

/// Bytes of the column id in front of each entry's key.
const COLUMN_BYTES: usize = size_of::<ColumnId>();

struct Cached {
    /// The hash of the column id and key.
    hash: u64,
    /// The column id (little-endian), the RocksDB key, then the value frame if present.
    bytes: EntryBytes,
    key_len: u32,
    flags: u8,
}

impl Cached {
    fn new(hash: u64, column: ColumnId, key: &[u8], value: &[u8], flags: u8) -> Cached {
        Cached {
            hash,
            bytes: EntryBytes::new(&[&column.to_le_bytes(), key, value]),
            key_len: (COLUMN_BYTES + key.len()) as u32,
            flags,
        }
    }

    /// Whether this is the entry of `key` in `column`, whose hash is `hash`.
    fn is(&self, hash: u64, column: ColumnId, key: &[u8]) -> bool {
        let bytes = self.bytes.as_slice();
        self.hash == hash
            && bytes[..COLUMN_BYTES] == column.to_le_bytes()
            && &bytes[COLUMN_BYTES..self.key_len as usize] == key
    }

    fn column(&self) -> ColumnId {
        let mut id = [0; COLUMN_BYTES];
        id.copy_from_slice(&self.bytes.as_slice()[..COLUMN_BYTES]);
        ColumnId::from_le_bytes(id)
    }

    fn rocksdb_key(&self) -> &[u8] {
        &self.bytes.as_slice()[COLUMN_BYTES..self.key_len as usize]
    }

    fn value(&self) -> Option<&[u8]> {
        (self.flags & PRESENT != 0).then(|| &self.bytes.as_slice()[self.key_len as usize..])
    }

    fn is_dirty(&self) -> bool {
        self.flags & DIRTY != 0
    }
}

/// One entry written back: a put of `value`, or a delete.
pub(crate) struct WriteBack<'a> {
    /// The column family's name.
    pub(crate) column_family: &'a str,
    pub(crate) key: &'a [u8],
    pub(crate) value: Option<&'a [u8]>,
}

/// Where the cache reads misses from and writes dirty entries back to: the slot's RocksDB
/// (or, in tests, a model of it).
pub(crate) trait Backing {
    /// Appends the stored value of `key` in `column_family` to `into`; whether there was one.
    fn load(&self, column_family: &str, key: &[u8], into: &mut Vec<u8>)
        -> Result<bool, StateError>;

    /// Writes `entries` atomically (one RocksDB write batch).
    fn write_back(&self, entries: &[WriteBack<'_>]) -> Result<(), StateError>;
}

/// What the cache has done since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteBackStats {
    /// Reads answered from the cache.
    pub hits: u64,
    /// Reads that went to RocksDB.
    pub misses: u64,
    /// Entries evicted.
    pub evicted: u64,
    /// Puts and deletes written back to RocksDB (by eviction or a flush).
    pub written: u64,
}

/// The cache (see the module docs).
pub(crate) struct WriteBackCache {
    capacity: usize,
    /// The most entries the table holds: half of hashbrown's capacity for the most slots the
    /// capacity allows, so that it never grows past them (see the module docs).
    max_entries: usize,
    /// Bytes of long entries' buffers.
    outside: usize,
    dirty: usize,
    /// Dirty entries of more than about this many bytes are written back at once (see
    /// [`WriteBackCache::with_dirty_limit`]).
    dirty_limit: usize,
    table: HashTable<Cached>,
    /// Names of the cached column families, by id.
    columns: Vec<String>,
    /// The eviction hand: a bucket index.
    hand: usize,
    stats: WriteBackStats,
}

impl WriteBackCache {
    /// A cache of at most `capacity` bytes, at least [`MIN_WRITE_BACK_BYTES`] (see the module
    /// docs).
    pub(crate) fn new(capacity: usize) -> WriteBackCache {
        debug_assert!(
            capacity >= MIN_WRITE_BACK_BYTES,
            "write-back cache of {capacity} bytes"
        );
        let mut slots = 4;
        while slots * 2 * SLOT_BYTES <= capacity {
            slots *= 2;
        }
        // hashbrown's capacity for `slots` slots: all but one below 8, else 7/8 of them.
        let table_capacity = if slots < 8 { slots - 1 } else { slots / 8 * 7 };
        WriteBackCache {
            capacity,
            max_entries: (table_capacity / 2).max(1),
            outside: 0,
            dirty: 0,
            dirty_limit: usize::MAX,
            table: HashTable::new(),
            columns: Vec::new(),
            hand: 0,
            stats: WriteBackStats::default(),
        }
    }

    /// Writes the dirty entries back once they hold more than about `bytes` (each entry's
    /// slot and its share of the long entries' buffers): a write-back goes to RocksDB in one
    /// batch, which RocksDB puts into one memtable whatever its size limit, and a checkpoint's
    /// barrier writes back and flushes what is dirty — bounded so, the barrier's work is at
    /// most about one memtable, even after a replay or a bulk load dirtied the whole cache.
    pub(crate) fn with_dirty_limit(mut self, bytes: usize) -> WriteBackCache {
        self.dirty_limit = bytes;
        self
    }

    /// Writes the dirty entries back if they hold more than the dirty limit.
    fn bound_dirty(&mut self, backing: &impl Backing) -> Result<(), StateError> {
        let entries = self.table.len();
        let dirty_bytes = self
            .dirty
            .saturating_mul(SLOT_BYTES * entries + self.outside);
        if dirty_bytes > self.dirty_limit.saturating_mul(entries) {
            self.flush(backing)?;
        }
        Ok(())
    }

    /// The id of column family `name`, registering it on first use.
    pub(crate) fn column(&mut self, name: &str) -> ColumnId {
        match self.columns.iter().position(|column| column == name) {
            Some(index) => index as ColumnId,
            None => {
                self.columns.push(name.to_string());
                (self.columns.len() - 1) as ColumnId
            }
        }
    }

    /// Bytes held now: the table and long entries' buffers.
    pub(crate) fn used(&self) -> usize {
        let table = if self.table.capacity() == 0 {
            0
        } else {
            self.table.num_buckets() * SLOT_BYTES
        };
        table + self.outside
    }

    /// Entries held now.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn stats(&self) -> WriteBackStats {
        self.stats
    }

    /// The hash of `key` in `column`.
    fn hash(column: ColumnId, key: &[u8]) -> u64 {
        let mut hasher = StableHasher::new();
        hasher.write_u64(u64::from(column));
        hasher.write(key);
        hasher.finish()
    }

    /// Hands the value of `key` in `column` (`None`: no value) to `read`, loading it from
    /// `backing` on a miss; then evicts if the load made the cache too full.
    pub(crate) fn read<R>(
        &mut self,
        backing: &impl Backing,
        column: ColumnId,
        key: &[u8],
        read: impl FnOnce(Option<&[u8]>) -> R,
    ) -> Result<R, StateError> {
        let hash = Self::hash(column, key);
        if let Some(entry) = self
            .table
            .find_mut(hash, |entry| entry.is(hash, column, key))
        {
            entry.flags |= REFERENCED;
            self.stats.hits += 1;
            return Ok(read(entry.value()));
        }
        self.stats.misses += 1;
        let mut value = Vec::new();
        let found = backing.load(&self.columns[column as usize], key, &mut value)?;
        let entry = Cached::new(
            hash,
            column,
            key,
            &value,
            if found { PRESENT | STORED } else { 0 },
        );
        let result = read(entry.value());
        self.insert(backing, entry)?;
        Ok(result)
    }

    /// Sets the value of `key` in `column` to `value`, or deletes it (`None`); evicts if that
    /// made the cache too full.
    pub(crate) fn write(
        &mut self,
        backing: &impl Backing,
        column: ColumnId,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), StateError> {
        let hash = Self::hash(column, key);
        match self
            .table
            .find_entry(hash, |entry| entry.is(hash, column, key))
        {
            Ok(mut found) => {
                let entry = found.get_mut();
                let before = entry.bytes.outside();
                let was_dirty = entry.is_dirty();
                let key_len = entry.key_len as usize;
                match value {
                    Some(value) => {
                        entry.bytes.replace_tail(key_len, value);
                        entry.flags |= PRESENT | DIRTY | REFERENCED;
                    }
                    None if entry.flags & STORED == 0 => {
                        // Nothing to delete in RocksDB: the key need not be remembered.
                        let (removed, _) = found.remove();
                        self.outside -= before;
                        self.dirty -= usize::from(removed.is_dirty());
                        return Ok(());
                    }
                    None => {
                        entry.bytes.replace_tail(key_len, &[]);
                        entry.flags = (entry.flags & !PRESENT) | DIRTY | REFERENCED;
                    }
                }
                self.outside = self.outside - before + entry.bytes.outside();
                self.dirty += usize::from(!was_dirty);
                if self.used() > self.capacity {
                    self.evict(backing, self.table.len())?;
                }
                self.bound_dirty(backing)
            }
            Err(_) => {
                // RocksDB may hold the key: a delete must reach it.
                let present = if value.is_some() { PRESENT } else { 0 };
                let flags = DIRTY | STORED | REFERENCED | present;
                let entry = Cached::new(hash, column, key, value.unwrap_or_default(), flags);
                self.insert(backing, entry)
            }
        }
    }

    /// Adds `entry` (not in the table), making room first if the table holds all it may, and
    /// evicting after if its buffer takes the cache past its capacity.
    fn insert(&mut self, backing: &impl Backing, entry: Cached) -> Result<(), StateError> {
        if self.table.len() >= self.max_entries {
            let keep = (self.max_entries - self.max_entries / 16).min(self.max_entries - 1);
            self.evict(backing, keep)?;
        }
        self.outside += entry.bytes.outside();
        self.dirty += usize::from(entry.is_dirty());
        self.table
            .insert_unique(entry.hash, entry, |entry| entry.hash);
        if self.used() > self.capacity {
            self.evict(backing, self.table.len())?;
        }
        self.bound_dirty(backing)
    }

    /// Evicts (see the module docs) until at most `keep` entries are left and the cache is
    /// within its capacity, and writes the dirty entries it evicted back.
    fn evict(&mut self, backing: &impl Backing, keep: usize) -> Result<(), StateError> {
        let buckets = self.table.num_buckets();
        let mut evicted = Vec::new();
        while (self.table.len() > keep || self.used() > self.capacity) && !self.table.is_empty() {
            if self.hand >= buckets {
                self.hand = 0;
            }
            if let Ok(mut bucket) = self.table.get_bucket_entry(self.hand) {
                let entry = bucket.get_mut();
                if entry.flags & REFERENCED != 0 {
                    entry.flags &= !REFERENCED;
                } else {
                    let (entry, _) = bucket.remove();
                    self.outside -= entry.bytes.outside();
                    self.stats.evicted += 1;
                    if entry.is_dirty() {
                        self.dirty -= 1;
                        evicted.push(entry);
                    }
                }
            }
            self.hand += 1;
        }
        self.stats.written += write_back(backing, &self.columns, evicted.iter())?;
        Ok(())
    }

    /// Writes every dirty entry back (one batch) and keeps them, clean.
    pub(crate) fn flush(&mut self, backing: &impl Backing) -> Result<(), StateError> {
        if self.dirty == 0 {
            return Ok(());
        }
        let dirty = self.table.iter().filter(|entry| entry.is_dirty());
        self.stats.written += write_back(backing, &self.columns, dirty)?;
        for entry in self.table.iter_mut() {
            if entry.is_dirty() {
                entry.flags &= !(DIRTY | STORED);
                if entry.flags & PRESENT != 0 {
                    entry.flags |= STORED;
                }
            }
        }
        self.dirty = 0;
        Ok(())
    }

    /// Appends the dirty entries of the columns whose cached names start with `prefix` (one
    /// instance's: `<id>/`) to `out` in the held-writes layout (`held.rs`), leaving them
    /// dirty, and returns how many. What a cut takes instead of writing them back.
    pub(crate) fn capture_dirty(&self, prefix: &str, out: &mut HeldWrites) -> usize {
        let index: Vec<Option<u32>> = self
            .columns
            .iter()
            .map(|name| name.strip_prefix(prefix).map(|name| out.column(name)))
            .collect();
        if self.dirty == 0 || index.iter().all(Option::is_none) {
            return 0;
        }
        let mut captured = 0;
        for entry in self.table.iter().filter(|entry| entry.is_dirty()) {
            if let Some(column) = index[entry.column() as usize] {
                out.entry(column, entry.rocksdb_key(), entry.value());
                captured += 1;
            }
        }
        captured
    }

    /// Forgets every entry of column family `name` (RocksDB is about to change under them).
    /// Dirty ones are dropped unwritten: flush first to keep them.
    pub(crate) fn forget_column(&mut self, name: &str) {
        let Some(column) = self.columns.iter().position(|column| column == name) else {
            return;
        };
        let column = column as ColumnId;
        let (mut outside, mut dirty) = (self.outside, self.dirty);
        self.table.retain(|entry| {
            let keep = entry.column() != column;
            if !keep {
                outside -= entry.bytes.outside();
                dirty -= usize::from(entry.is_dirty());
            }
            keep
        });
        (self.outside, self.dirty) = (outside, dirty);
    }
}

/// Writes `entries` back in one batch; how many.
fn write_back<'a>(
    backing: &impl Backing,
    columns: &[String],
    entries: impl Iterator<Item = &'a Cached>,
) -> Result<u64, StateError> {
    let writes: Vec<WriteBack<'_>> = entries
        .map(|entry| WriteBack {
            column_family: &columns[entry.column() as usize],
            key: entry.rocksdb_key(),
            value: entry.value(),
        })
        .collect();
    if !writes.is_empty() {
        backing.write_back(&writes)?;
    }
    Ok(writes.len() as u64)
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// A stored entry's column family and key.
    type StoredKey = (String, Vec<u8>);

    /// RocksDB as a map, counting its reads and writes.
    #[derive(Default)]
    struct Model {
        stored: RefCell<BTreeMap<StoredKey, Vec<u8>>>,
        loads: Cell<u64>,
        writes: Cell<u64>,
    }

    impl Backing for Model {
        fn load(
            &self,
            column_family: &str,
            key: &[u8],
            into: &mut Vec<u8>,
        ) -> Result<bool, StateError> {
            self.loads.set(self.loads.get() + 1);
            match self
                .stored
                .borrow()
                .get(&(column_family.to_string(), key.to_vec()))
            {
                Some(value) => {
                    into.extend_from_slice(value);
                    Ok(true)
                }
                None => Ok(false),
            }
        }

        fn write_back(&self, entries: &[WriteBack<'_>]) -> Result<(), StateError> {
            let mut stored = self.stored.borrow_mut();
            for entry in entries {
                self.writes.set(self.writes.get() + 1);
                let key = (entry.column_family.to_string(), entry.key.to_vec());
                match entry.value {
                    Some(value) => stored.insert(key, value.to_vec()),
                    None => stored.remove(&key),
                };
            }
            Ok(())
        }
    }

    fn get(
        cache: &mut WriteBackCache,
        model: &Model,
        column: ColumnId,
        key: &[u8],
    ) -> Option<Vec<u8>> {
        cache
            .read(model, column, key, |value| value.map(<[u8]>::to_vec))
            .unwrap()
    }

    /// An entry is one 64-byte table slot, and a window accumulator fits inline.
    #[test]
    fn entries_fill_one_cache_line() {
        assert_eq!(size_of::<Cached>(), 64);
        let key_group = 2;
        let key = 1 + 8;
        let pane = 1 + 1 + 8;
        // A frame header with an expiry, and an 8-byte count.
        let frame = 1 + 8 + 8;
        assert_eq!(COLUMN_BYTES + key_group + key + pane + frame, 42);
        assert!(COLUMN_BYTES + key_group + key + pane + frame <= INLINE_BYTES);
    }

    /// A key created, updated and deleted while cached costs RocksDB one read and no write.
    #[test]
    fn short_lived_entries_never_reach_rocksdb() {
        let model = Model::default();
        let mut cache = WriteBackCache::new(1 << 20);
        let column = cache.column("value:op:acc");
        for pane in 0..100u32 {
            let key = pane.to_be_bytes();
            assert_eq!(get(&mut cache, &model, column, &key), None);
            for round in 0..10u8 {
                cache.write(&model, column, &key, Some(&[round])).unwrap();
                assert_eq!(get(&mut cache, &model, column, &key), Some(vec![round]));
            }
            cache.write(&model, column, &key, None).unwrap();
        }
        cache.flush(&model).unwrap();
        assert_eq!(model.loads.get(), 100);
        assert_eq!(model.writes.get(), 0);
        assert_eq!(cache.len(), 0);
    }

    /// A flush writes every dirty entry once; entries stay cached, clean.
    #[test]
    fn flush_writes_dirty_entries_once() {
        let model = Model::default();
        let mut cache = WriteBackCache::new(1 << 20);
        let column = cache.column("value:op:acc");
        for key in 0..10u8 {
            cache
                .write(&model, column, &[key], Some(&[key, key]))
                .unwrap();
        }
        cache.flush(&model).unwrap();
        cache.flush(&model).unwrap();
        assert_eq!(model.writes.get(), 10);
        assert_eq!(model.stored.borrow().len(), 10);
        // Deleting a written-back key writes a delete at the next flush.
        cache.write(&model, column, &[3], None).unwrap();
        assert_eq!(get(&mut cache, &model, column, &[3]), None);
        cache.flush(&model).unwrap();
        assert_eq!(model.writes.get(), 11);
        assert_eq!(model.stored.borrow().len(), 9);
        assert_eq!(model.loads.get(), 0);
    }

    /// Past its dirty limit the cache writes its dirty entries back (in one batch), so that
    /// what is dirty at any moment stays about within the limit.
    #[test]
    fn dirty_entries_past_the_limit_are_written_back() {
        let model = Model::default();
        let limit = 10 * SLOT_BYTES;
        let mut cache = WriteBackCache::new(1 << 20).with_dirty_limit(limit);
        let column = cache.column("value:op:acc");
        for key in 0..100u8 {
            cache.write(&model, column, &[key], Some(&[key])).unwrap();
            assert!(cache.dirty <= 10, "{} dirty entries", cache.dirty);
        }
        assert!(
            model.writes.get() >= 90,
            "{} written back",
            model.writes.get()
        );
        assert_eq!(cache.len(), 100, "written back, not evicted");
        cache.flush(&model).unwrap();
        assert_eq!(model.stored.borrow().len(), 100);
    }

    /// A full cache evicts down below its capacity and writes what it evicts that is dirty.
    #[test]
    fn eviction_keeps_the_bound() {
        let model = Model::default();
        let capacity = 16 << 10;
        let mut cache = WriteBackCache::new(capacity);
        let column = cache.column("value:op:acc");
        for key in 0..10_000u32 {
            cache
                .write(&model, column, &key.to_be_bytes(), Some(&[1; 8]))
                .unwrap();
            assert!(cache.used() <= capacity, "{} > {capacity}", cache.used());
            // The table never grows past the slots the capacity allows.
            assert!(cache.table.num_buckets() <= 128);
            assert!(cache.len() <= 56);
        }
        let stats = cache.stats();
        assert!(stats.evicted > 9_000, "{stats:?}");
        assert_eq!(model.writes.get(), stats.evicted);
        cache.flush(&model).unwrap();
        assert_eq!(model.stored.borrow().len(), 10_000);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Read(u8, u8),
        Put(u8, u8, Vec<u8>),
        Delete(u8, u8),
        Flush,
        Forget(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        let column = 0..2u8;
        let key = 0..24u8;
        prop_oneof![
            4 => (column.clone(), key.clone()).prop_map(|(c, k)| Op::Read(c, k)),
            4 => (column.clone(), key.clone(), proptest::collection::vec(any::<u8>(), 0..40))
                .prop_map(|(c, k, v)| Op::Put(c, k, v)),
            2 => (column.clone(), key).prop_map(|(c, k)| Op::Delete(c, k)),
            1 => Just(Op::Flush),
            1 => column.prop_map(Op::Forget),
        ]
    }

    proptest! {
        /// Whatever the capacity and the order of operations, every read returns the last value
        /// written, and after a flush RocksDB holds exactly that (a forgotten column family's
        /// unflushed writes are lost on purpose: its key groups are being deleted).
        #[test]
        fn reads_see_the_last_write_and_flushes_persist_it(
            capacity_entries in 0usize..40,
            dirty_limit_entries in proptest::option::of(1usize..30),
            ops in proptest::collection::vec(op(), 1..300),
        ) {
            let model = Model::default();
            let capacity = MIN_WRITE_BACK_BYTES + capacity_entries * 4 * SLOT_BYTES;
            let mut cache = WriteBackCache::new(capacity);
            if let Some(entries) = dirty_limit_entries {
                cache = cache.with_dirty_limit(entries * SLOT_BYTES);
            }
            let names = ["value:a:s", "value:b:s"];
            let columns = [cache.column(names[0]), cache.column(names[1])];
            let mut expected: BTreeMap<(u8, u8), Vec<u8>> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Read(c, k) => {
                        let got = get(&mut cache, &model, columns[c as usize], &[k]);
                        prop_assert_eq!(got.as_ref(), expected.get(&(c, k)));
                    }
                    Op::Put(c, k, v) => {
                        cache.write(&model, columns[c as usize], &[k], Some(&v)).unwrap();
                        expected.insert((c, k), v);
                    }
                    Op::Delete(c, k) => {
                        cache.write(&model, columns[c as usize], &[k], None).unwrap();
                        expected.remove(&(c, k));
                    }
                    Op::Flush => cache.flush(&model).unwrap(),
                    Op::Forget(c) => {
                        cache.flush(&model).unwrap();
                        cache.forget_column(names[c as usize]);
                    }
                }
                prop_assert!(cache.used() <= cache.capacity);
                // The counters agree with the entries.
                let dirty = cache.table.iter().filter(|entry| entry.is_dirty()).count();
                prop_assert_eq!(cache.dirty, dirty);
                let outside: usize = cache.table.iter().map(|entry| entry.bytes.outside()).sum();
                prop_assert_eq!(cache.outside, outside);
                prop_assert!(cache.len() <= cache.max_entries);
            }
            cache.flush(&model).unwrap();
            let stored: BTreeMap<(u8, u8), Vec<u8>> = model
                .stored
                .borrow()
                .iter()
                .map(|((column, key), value)| {
                    let c = names.iter().position(|name| name == column).unwrap() as u8;
                    ((c, key[0]), value.clone())
                })
                .collect();
            prop_assert_eq!(stored, expected);
        }
    }
}
