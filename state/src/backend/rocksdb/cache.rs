//! The write-back cache in front of a slot's RocksDB: the hot entries of its value states
//! (value, reducing and aggregating state — a window's accumulators among them), in memory.
//!
//! Keyed state is read, changed and written back per record. Straight to RocksDB that is a
//! memtable lookup and a write per record, about 1.3 µs on this project's machine, which is
//! what held the window operators on RocksDB to a tenth of their heap speed. With the cache a
//! record's read-modify-write on a hot entry is a hash lookup in memory, and RocksDB sees an
//! entry only when the cache evicts it, when too much is dirty (below), or when a scan (or a
//! savepoint's flushed checkpoint) needs RocksDB to hold everything. A checkpoint's cut copies
//! the dirty entries instead and leaves them dirty (below, "Cuts"). A window pane that is
//! created, filled, fired and deleted while it is cached never reaches RocksDB at all.
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
//! lands in one memtable whatever its size, so this bounds what one write-back puts into
//! RocksDB (and what a checkpoint holds beside its files) even after a replay or a bulk load
//! dirtied the whole cache.
//!
//! **Consistency with RocksDB.** Only cached column families go through the cache, and every
//! access to them does; whatever reads RocksDB directly (a flushed checkpoint, a key-group
//! scan, a compaction, a size estimate) first has the cache write back what is dirty
//! ([`super::RocksDbInstance`] does that), a checkpoint's cut copies what is dirty beside
//! RocksDB's files, and a range deletion first drops the column family's entries. A
//! write-back that fails fails the job (its records are gone from the cache); the job
//! restarts from its last checkpoint, as after any RocksDB write error.
//!
//! **Cuts.** A checkpoint cuts an instance's RocksDB files as they are at its barrier
//! ([`super::RocksDbInstance::cut`]); what the cache holds dirty of the instance then is the
//! rest of its state, and the cut's *held writes* (`held.rs`). Copying them at the barrier was
//! the barrier's whole cost (a scan of the table and a copy per dirty entry: 31–57 ms at the
//! median for 64 MB dirty), so the barrier only marks them, in O(1), and they are copied
//! while records flow: by steps of a sweep over the table's buckets that the checkpoint's
//! writer takes between records ([`WriteBackCache::capture_step`]), and, before a marked
//! entry changes or leaves the cache (a write, a delete, an eviction, a write-back, a
//! forgotten column family), by that change, which copies it first (copy-on-write per entry).
//! Each owner (instance) has an epoch (two bits, going round), advanced by its cut; an entry
//! carries the epoch of its owner as of its last change. So at the cut every dirty entry of
//! the owner carries another epoch: it is marked. Copying an entry, or changing it, gives it
//! its owner's epoch, and new entries get it, so an entry dirtied after the cut is never taken
//! for a marked one. The cut counts its owner's dirty entries; the capture is done when it
//! copied that many. The sweep goes round as often as it must (the table may move entries
//! between its steps: it rehashes as it grows, and in place once deletions used its room up);
//! a turn that finds none of the entries still counted is followed by a whole turn in one
//! step, where nothing moves, and if that finds them neither the count went wrong and the
//! checkpoint fails. A capture given up (its checkpoint aborted) stops copying, and the
//! owner's next cut takes over what it still marks: those entries are dirty at the new cut
//! too, and their epoch is not the new one — for two given-up captures in a row; the cut
//! after them sweeps what they left first (without copying), before the epochs come round.
//! A cut that finds an earlier capture not yet done and not given up (overlapping
//! checkpoints) copies the rest at its barrier and keeps its held writes for their holder.
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

use std::mem::size_of;

use hashbrown::HashTable;

use crate::backend::rocksdb::held::HeldWrites;
use crate::error::StateError;
use crate::key_group::fmix64;
use crate::prefetch::prefetch_bytes;

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
/// Two bits: the epoch of the entry's owner as of the entry's last change (or copy by a
/// capture). A dirty entry whose epoch is not its owner's is held by the owner's cut and not
/// yet copied (see "Cuts" in the module docs).
const EPOCH: u8 = 0b11 << EPOCH_SHIFT;
const EPOCH_SHIFT: u8 = 4;
/// Epochs go round in two bits.
const EPOCHS: u8 = 4;
/// Given-up captures a cut may leave unswept in a row: an entry left marked through one
/// more would carry the epoch the next cut starts, and pass for copied.
const MAX_SUPERSEDED: u8 = EPOCHS - 2;

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

/// The multiplier of [`WriteBackCache::hash`]'s word folding (odd, bits spread).
const HASH_MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

/// The 8 bytes of `bytes` from `at` on, little-endian.
#[inline]
fn word_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// Up to 8 bytes as one word: two overlapping 4-byte reads, or for fewer than 4 bytes the
/// first, middle and last. Only a hash reads it, with the length beside it.
#[inline]
fn short_word(bytes: &[u8]) -> u64 {
    let len = bytes.len();
    if len >= 4 {
        let half = |at: usize| {
            let mut half = [0; 4];
            half.copy_from_slice(&bytes[at..at + 4]);
            u64::from(u32::from_le_bytes(half))
        };
        half(0) | half(len - 4) << 32
    } else if len > 0 {
        u64::from(bytes[0]) | u64::from(bytes[len / 2]) << 8 | u64::from(bytes[len - 1]) << 16
    } else {
        0
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

    fn epoch(&self) -> u8 {
        (self.flags & EPOCH) >> EPOCH_SHIFT
    }

    fn set_epoch(&mut self, epoch: u8) {
        self.flags = (self.flags & !EPOCH) | (epoch << EPOCH_SHIFT);
    }
}

/// Where [`WriteBackCache::read`] found a key (or put it, loaded): its hash, its entry's
/// bucket, and the table's generation then. A write goes to the bucket if no entry has moved
/// or left since (the generation is the same), else looks for the key again.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    hash: u64,
    bucket: Option<usize>,
    generation: u64,
    /// RocksDB may hold the key: if a write inserts it, its delete must reach RocksDB.
    stored: bool,
}

impl Found {
    /// A key no read has located: a write looks for it (its generation is never consulted).
    fn unlocated(column: ColumnId, key: &[u8], stored: bool) -> Found {
        Found {
            hash: WriteBackCache::hash(column, key),
            bucket: None,
            generation: 0,
            stored,
        }
    }
}

/// One entry written back: a put of `value`, or a delete.
#[derive(Clone, Copy)]
pub(crate) struct WriteBack<'a> {
    /// The instance the column family is of.
    pub(crate) owner: u32,
    /// The column family's name.
    pub(crate) column_family: &'a str,
    pub(crate) key: &'a [u8],
    pub(crate) value: Option<&'a [u8]>,
}

/// Where the cache reads misses from and writes dirty entries back to: the slot's RocksDB
/// (or, in tests, a model of it).
pub(crate) trait Backing {
    /// Appends the stored value of `key` in `column_family` of instance `owner` to `into`;
    /// whether there was one.
    fn load(
        &self,
        owner: u32,
        column_family: &str,
        key: &[u8],
        into: &mut Vec<u8>,
    ) -> Result<bool, StateError>;

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
    /// Dirty entries.
    dirty: usize,
    /// Dirty entries of more than about this many bytes are written back at once (see
    /// [`WriteBackCache::with_dirty_limit`]).
    dirty_limit: usize,
    table: HashTable<Cached>,
    /// Names of the cached column families, by id (in their owner's instance).
    columns: Vec<String>,
    /// The owner (instance) of each cached column family, by id.
    owners: Vec<u32>,
    /// Each owner's dirty entries and its last cut's capture.
    cuts: Cuts,
    /// The eviction hand: a bucket index.
    hand: usize,
    /// Where the table's buckets end and its control bytes begin, as of the last insert (the
    /// table is allocated anew only when an insert grows it): for [`WriteBackCache::prefetch`]
    /// alone, so an address that hashbrown laid out otherwise would cost a wasted hint, never
    /// a wrong read. 0 before the first insert.
    buckets_end: usize,
    /// Changes whenever an entry may have moved to another bucket or left the table (an
    /// insert, which may grow it, a removal, an eviction): a [`Found`] of the same generation
    /// still points at its key's entry.
    generation: u64,
    stats: WriteBackStats,
}

/// What the cache keeps per owner for its cuts (see "Cuts" in the module docs).
#[derive(Default)]
struct Cuts {
    owners: Vec<Owner>,
}

#[derive(Default)]
struct Owner {
    /// Dirty entries of the owner's column families.
    dirty: usize,
    /// The epoch of entries that changed since the owner's last cut: the cut's.
    epoch: u8,
    /// Given-up captures that later cuts took over without sweeping them, in a row.
    superseded: u8,
    /// The capture of its last cut, until its holder took the held writes.
    capture: Option<Capture>,
    /// Captures that a later cut finished before their holders took them: the held writes
    /// by the cut's number.
    finished: Vec<(u64, Vec<u8>)>,
    /// Cuts begun.
    cuts: u64,
}

/// The held writes of one cut being captured.
struct Capture {
    /// The cut's number.
    cut: u64,
    /// What is captured and not yet taken; `None` once the checkpoint was given up (the
    /// rest is swept without copying).
    held: Option<HeldWrites>,
    /// Each cache column id's index in the held writes: the owner's at the cut.
    index: Vec<Option<u32>>,
    /// Entries dirty at the cut not yet copied.
    pending: usize,
    /// The next bucket the sweep looks at.
    cursor: usize,
    /// Buckets the sweep passed since it last copied an entry.
    idle: usize,
    /// Entries counted as held that a whole turn of the sweep did not find (a count gone
    /// wrong): the capture fails.
    lost: usize,
}

impl Capture {
    /// Copies `entry`, dirty at the cut and not yet copied.
    fn take(&mut self, entry: &Cached) {
        debug_assert!(
            self.pending > 0,
            "a capture took more entries than were dirty"
        );
        self.pending = self.pending.saturating_sub(1);
        self.idle = 0;
        if let Some(held) = &mut self.held {
            let column = self.index[entry.column() as usize]
                .expect("an entry dirty at a cut is of a column family registered before it");
            held.entry(column, entry.rocksdb_key(), entry.value());
        }
    }
}

/// Copies `entry` into `capture` if its owner's cut (the owner's epoch now: `epoch`) holds
/// it and it is not yet copied, and gives it that epoch: it counts as changed since the cut.
#[inline]
fn settle(entry: &mut Cached, epoch: u8, capture: Option<&mut Capture>) {
    if entry.epoch() != epoch {
        if entry.is_dirty() {
            capture
                .expect("an entry is held only while its owner's cut is captured")
                .take(entry);
        }
        entry.set_epoch(epoch);
    }
}

impl Cuts {
    /// Before `entry` of `owner` changes or leaves the cache (written, deleted, evicted,
    /// written back or forgotten): [`settle`]s it.
    #[inline]
    fn hold(&mut self, owner: u32, entry: &mut Cached) {
        let state = &mut self.owners[owner as usize];
        settle(entry, state.epoch, state.capture.as_mut());
    }

    /// Whether a cut of any owner is being captured (else no entry is held).
    fn capturing(&self) -> bool {
        self.owners.iter().any(|owner| owner.capture.is_some())
    }

    fn dirty(&mut self, owner: u32, dirty: bool) {
        let count = &mut self.owners[owner as usize].dirty;
        if dirty {
            *count += 1;
        } else {
            *count -= 1;
        }
    }
}

/// Bytes of held writes after which a step of a capture ends ([`WriteBackCache::capture_step`]):
/// copying 3.5 MB of 1 KiB entries in one step held the shard for 6 ms.
pub(crate) const STEP_HELD_BYTES: usize = 256 << 10;

/// What a step of a capture ([`WriteBackCache::capture_step`]) left.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CaptureStep {
    /// Entries dirty at the cut are still to be copied.
    More,
    /// Every entry is copied: the last of the held writes was handed out.
    Done,
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
            owners: Vec::new(),
            cuts: Cuts::default(),
            hand: 0,
            buckets_end: 0,
            generation: 0,
            stats: WriteBackStats::default(),
        }
    }

    /// Writes the dirty entries back once they hold more than about `bytes` (each entry's
    /// slot and its share of the long entries' buffers): a write-back goes to RocksDB in one
    /// batch, which RocksDB puts into one memtable whatever its size limit, and a checkpoint's
    /// cut holds what is dirty beside RocksDB's files — bounded so, both are at most about one
    /// memtable, even after a replay or a bulk load dirtied the whole cache.
    pub(crate) fn with_dirty_limit(mut self, bytes: usize) -> WriteBackCache {
        self.dirty_limit = bytes;
        self
    }

    /// Counts an entry of `owner` that became dirty (`true`) or clean or gone (`false`).
    fn count_dirty(&mut self, owner: u32, dirty: bool) {
        self.cuts.dirty(owner, dirty);
        if dirty {
            self.dirty += 1;
        } else {
            self.dirty -= 1;
        }
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

    /// The id of column family `family` of instance `owner`, registering it on first use.
    pub(crate) fn column(&mut self, owner: u32, family: &str) -> ColumnId {
        match self.column_of(owner, family) {
            Some(column) => column,
            None => {
                self.columns.push(family.to_string());
                self.owners.push(owner);
                if self.cuts.owners.len() <= owner as usize {
                    self.cuts
                        .owners
                        .resize_with(owner as usize + 1, Owner::default);
                }
                (self.columns.len() - 1) as ColumnId
            }
        }
    }

    /// The id of column family `family` of instance `owner`, if it is registered.
    fn column_of(&self, owner: u32, family: &str) -> Option<ColumnId> {
        (0..self.columns.len())
            .find(|&at| self.owners[at] == owner && self.columns[at] == family)
            .map(|at| at as ColumnId)
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

    /// The hash of `key` in `column`. Not the stable key hash: the table lives in this process
    /// only, so the key is read a word at a time (its last word overlapping the one before),
    /// not byte by byte into a hasher's buffer.
    fn hash(column: ColumnId, key: &[u8]) -> u64 {
        let fold =
            |state: u64, word: u64| (state.rotate_left(5) ^ word).wrapping_mul(HASH_MULTIPLIER);
        let mut state = fold(u64::from(column), key.len() as u64);
        let mut rest = key;
        while rest.len() > 8 {
            state = fold(state, word_at(rest, 0));
            rest = &rest[8..];
        }
        let last = if key.len() >= 8 {
            word_at(key, key.len() - 8)
        } else {
            short_word(key)
        };
        fmix64(fold(state, last))
    }

    /// Prefetches where the entry of `key` in `column` most likely is: the control bytes its
    /// probe starts at and the bucket beside them. Hashbrown keeps bucket `i` of `n` just
    /// below the control bytes, `i + 1` slots down, and starts a probe for `hash` at bucket
    /// `hash mod n`; with the table at most half full ([`WriteBackCache::new`]) most entries
    /// sit there. Several reads whose entries are prefetched first overlap their cache misses.
    pub(crate) fn prefetch(&self, column: ColumnId, key: &[u8]) {
        if let Some((control, bucket)) = self.probe_start(Self::hash(column, key)) {
            // The group of control bytes the probe loads first (16 with SSE2).
            prefetch_bytes(control, 16);
            prefetch_bytes(bucket.cast(), size_of::<Cached>());
        }
    }

    /// The control byte and the bucket where a probe for `hash` starts (see
    /// [`WriteBackCache::prefetch`]); `None` before the first insert.
    fn probe_start(&self, hash: u64) -> Option<(*const u8, *const Cached)> {
        if self.buckets_end == 0 {
            return None;
        }
        let at = hash as usize & (self.table.num_buckets() - 1);
        let end = self.buckets_end as *const u8;
        let bucket = end.wrapping_sub((at + 1) * size_of::<Cached>());
        Some((end.wrapping_add(at), bucket.cast()))
    }

    /// Hands the value of `key` in `column` (`None`: no value) to `read`, loading it from
    /// `backing` on a miss; then evicts if the load made the cache too full. Returns where the
    /// entry was found too, for a write of the same key that follows
    /// ([`WriteBackCache::write_found`]): a read-modify-write hashes and probes once.
    pub(crate) fn read<R>(
        &mut self,
        backing: &impl Backing,
        column: ColumnId,
        key: &[u8],
        read: impl FnOnce(Option<&[u8]>) -> R,
    ) -> Result<(R, Found), StateError> {
        let hash = Self::hash(column, key);
        if let Some(bucket) = self
            .table
            .find_bucket_index(hash, |entry| entry.is(hash, column, key))
        {
            let entry = self
                .table
                .get_bucket_mut(bucket)
                .expect("the bucket just found");
            entry.flags |= REFERENCED;
            self.stats.hits += 1;
            let found = Found {
                hash,
                bucket: Some(bucket),
                generation: self.generation,
                stored: true,
            };
            return Ok((read(entry.value()), found));
        }
        self.stats.misses += 1;
        let mut value = Vec::new();
        let at = column as usize;
        let found = backing.load(self.owners[at], &self.columns[at], key, &mut value)?;
        let entry = Cached::new(
            hash,
            column,
            key,
            &value,
            if found { PRESENT | STORED } else { 0 },
        );
        let result = read(entry.value());
        let found = self.insert(backing, entry)?;
        Ok((result, found))
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
        let found = Found::unlocated(column, key, true);
        self.write_found(backing, column, key, found, value)
    }

    /// [`WriteBackCache::write`] of a key its caller knows RocksDB holds nothing for (it has
    /// never had a value): RocksDB is not asked, and the entry is as a read that found
    /// nothing leaves it — deleted while cached, it is dropped without a write to RocksDB.
    pub(crate) fn write_new(
        &mut self,
        backing: &impl Backing,
        column: ColumnId,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), StateError> {
        let found = Found::unlocated(column, key, false);
        self.write_found(backing, column, key, found, Some(value))
    }

    /// [`WriteBackCache::write`] of the key a [`WriteBackCache::read`] found `found`:
    /// where the read left its entry, unless entries have moved or left since (then it is
    /// looked for again).
    pub(crate) fn write_found(
        &mut self,
        backing: &impl Backing,
        column: ColumnId,
        key: &[u8],
        found: Found,
        value: Option<&[u8]>,
    ) -> Result<(), StateError> {
        let Found {
            hash,
            bucket,
            generation,
            stored,
        } = found;
        debug_assert_eq!(hash, Self::hash(column, key), "found for another key");
        let is_key = |entry: &Cached| entry.is(hash, column, key);
        // The generation says the bucket still holds the entry; its hash, on the cache line
        // the write touches anyway, guards against a change that forgot to count (debug
        // builds compare the key too).
        let bucket = match bucket {
            Some(bucket)
                if generation == self.generation
                    && self
                        .table
                        .get_bucket(bucket)
                        .is_some_and(|entry| entry.hash == hash) =>
            {
                debug_assert!(
                    self.table.get_bucket(bucket).is_some_and(is_key),
                    "bucket {bucket} of an unchanged generation holds another entry"
                );
                Some(bucket)
            }
            _ => self.table.find_bucket_index(hash, is_key),
        };
        let Some(bucket) = bucket else {
            // Unless the caller knows better, RocksDB may hold the key: a delete must reach it.
            let present = if value.is_some() { PRESENT } else { 0 };
            let stored = if stored { STORED } else { 0 };
            let flags = DIRTY | REFERENCED | present | stored;
            let entry = Cached::new(hash, column, key, value.unwrap_or_default(), flags);
            return self.insert(backing, entry).map(|_| ());
        };
        let Ok(mut found) = self.table.get_bucket_entry(bucket) else {
            unreachable!("bucket {bucket} holds the entry just found");
        };
        let owner = self.owners[column as usize];
        let entry = found.get_mut();
        self.cuts.hold(owner, entry);
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
                self.generation += 1;
                self.outside -= before;
                if removed.is_dirty() {
                    self.count_dirty(owner, false);
                }
                return Ok(());
            }
            None => {
                entry.bytes.replace_tail(key_len, &[]);
                entry.flags = (entry.flags & !PRESENT) | DIRTY | REFERENCED;
            }
        }
        self.outside = self.outside - before + entry.bytes.outside();
        if !was_dirty {
            self.count_dirty(owner, true);
        }
        if self.used() > self.capacity {
            self.evict(backing, self.table.len())?;
        }
        self.bound_dirty(backing)
    }

    /// Adds `entry` (not in the table), making room first if the table holds all it may, and
    /// evicting after if its buffer takes the cache past its capacity. Returns where it went,
    /// as of the generation it went there in: if that eviction removed anything (the entry
    /// itself, maybe), a write there looks for it again.
    fn insert(&mut self, backing: &impl Backing, mut entry: Cached) -> Result<Found, StateError> {
        if self.table.len() >= self.max_entries {
            let keep = (self.max_entries - self.max_entries / 16).min(self.max_entries - 1);
            self.evict(backing, keep)?;
        }
        self.outside += entry.bytes.outside();
        self.generation += 1;
        let owner = self.owners[entry.column() as usize];
        // New: changed since any cut.
        entry.set_epoch(self.cuts.owners[owner as usize].epoch);
        if entry.is_dirty() {
            self.count_dirty(owner, true);
        }
        let inserted = self
            .table
            .insert_unique(entry.hash, entry, |entry| entry.hash);
        let bucket = inserted.bucket_index();
        self.buckets_end =
            (inserted.get() as *const Cached as usize) + (bucket + 1) * size_of::<Cached>();
        let found = Found {
            hash: inserted.get().hash,
            bucket: Some(bucket),
            generation: self.generation,
            stored: true,
        };
        if self.used() > self.capacity {
            self.evict(backing, self.table.len())?;
        }
        self.bound_dirty(backing)?;
        Ok(found)
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
                    let owner = entry.is_dirty().then(|| {
                        let owner = self.owners[entry.column() as usize];
                        self.cuts.hold(owner, entry);
                        owner
                    });
                    let (entry, _) = bucket.remove();
                    self.generation += 1;
                    self.outside -= entry.bytes.outside();
                    self.stats.evicted += 1;
                    if let Some(owner) = owner {
                        self.count_dirty(owner, false);
                        evicted.push(entry);
                    }
                }
            }
            self.hand += 1;
        }
        self.stats.written += write_back(backing, &self.columns, &self.owners, evicted.iter())?;
        Ok(())
    }

    /// Writes every dirty entry back (one batch) and keeps them, clean.
    pub(crate) fn flush(&mut self, backing: &impl Backing) -> Result<(), StateError> {
        if self.dirty == 0 {
            return Ok(());
        }
        if self.cuts.capturing() {
            for entry in self.table.iter_mut().filter(|entry| entry.is_dirty()) {
                self.cuts.hold(self.owners[entry.column() as usize], entry);
            }
        }
        let dirty = self.table.iter().filter(|entry| entry.is_dirty());
        self.stats.written += write_back(backing, &self.columns, &self.owners, dirty)?;
        for entry in self.table.iter_mut() {
            if entry.is_dirty() {
                entry.flags &= !(DIRTY | STORED);
                if entry.flags & PRESENT != 0 {
                    entry.flags |= STORED;
                }
            }
        }
        self.dirty = 0;
        for owner in &mut self.cuts.owners {
            owner.dirty = 0;
        }
        Ok(())
    }

    /// Begins a cut of `owner`: its dirty entries are held by the cut from now on, copied by
    /// [`WriteBackCache::capture_step`] or, before one of them changes or leaves the cache,
    /// by that change (see "Cuts" in the module docs); they stay dirty. Returns the cut's
    /// number, or `None` when nothing of `owner`'s is dirty. An earlier cut's capture not
    /// yet done is finished first, all at once — unless it was given up: then this cut takes
    /// over what it still marks, which this cut holds too (up to [`MAX_SUPERSEDED`] in a row).
    pub(crate) fn begin_capture(&mut self, owner: u32) -> Option<u64> {
        let state = self.cuts.owners.get_mut(owner as usize)?;
        match &state.capture {
            Some(capture) if capture.held.is_none() && state.superseded < MAX_SUPERSEDED => {
                state.capture = None;
                state.superseded += 1;
            }
            Some(_) => self.finish_capture(owner),
            None => {}
        }
        let families: Vec<Option<&str>> = self
            .columns
            .iter()
            .zip(&self.owners)
            .map(|(name, column_owner)| (*column_owner == owner).then_some(&**name))
            .collect();
        let state = self.cuts.owners.get_mut(owner as usize)?;
        state.cuts += 1;
        if state.dirty == 0 {
            // Nothing dirty: nothing marked.
            state.superseded = 0;
            return None;
        }
        let mut held = HeldWrites::default();
        let index = families
            .into_iter()
            .map(|family| family.map(|family| held.column(family)))
            .collect();
        state.epoch = (state.epoch + 1) % EPOCHS;
        state.capture = Some(Capture {
            cut: state.cuts,
            held: Some(held),
            index,
            pending: state.dirty,
            cursor: 0,
            idle: 0,
            lost: 0,
        });
        Some(state.cuts)
    }

    /// Copies entries held by `owner`'s cut number `cut` ([`WriteBackCache::begin_capture`])
    /// from at most `buckets` of the table's buckets (fewer once [`STEP_HELD_BYTES`] are
    /// captured), and moves what is captured and not yet
    /// handed out to the end of `out` (the held-writes file, in pieces). `Done` once the last
    /// of it is handed out; fails when the held writes are incomplete.
    pub(crate) fn capture_step(
        &mut self,
        owner: u32,
        cut: u64,
        buckets: usize,
        out: &mut Vec<u8>,
    ) -> Result<CaptureStep, String> {
        let not_captured = || format!("cut {cut} of the instance is not being captured");
        let state = self
            .cuts
            .owners
            .get_mut(owner as usize)
            .ok_or_else(not_captured)?;
        if let Some(at) = state.finished.iter().position(|(number, _)| *number == cut) {
            out.extend_from_slice(&state.finished.swap_remove(at).1);
            return Ok(CaptureStep::Done);
        }
        let capture = state
            .capture
            .as_mut()
            .filter(|capture| capture.cut == cut)
            .ok_or_else(not_captured)?;
        sweep(
            &mut self.table,
            &self.owners,
            owner,
            state.epoch,
            capture,
            (buckets, STEP_HELD_BYTES),
        );
        if let Some(held) = &mut capture.held {
            held.drain_into(out);
        }
        if capture.pending > 0 {
            return Ok(CaptureStep::More);
        }
        let (lost, epoch) = (capture.lost, state.epoch);
        // Every entry is copied, or a whole turn found none left marked.
        state.capture = None;
        state.superseded = 0;
        debug_assert!(
            lost > 0
                || !self.table.iter().any(|entry| entry.is_dirty()
                    && entry.epoch() != epoch
                    && self.owners[entry.column() as usize] == owner),
            "a capture ended with entries held and not copied"
        );
        if lost > 0 {
            return Err(format!(
                "{lost} entries dirty at the cut were not found in the write-back cache"
            ));
        }
        Ok(CaptureStep::Done)
    }

    /// Gives up `owner`'s cut number `cut`: what it holds is no longer copied (the owner's
    /// next cut takes over the entries it still marks, or sweeps them without copying).
    pub(crate) fn abandon_capture(&mut self, owner: u32, cut: u64) {
        let Some(state) = self.cuts.owners.get_mut(owner as usize) else {
            return;
        };
        state.finished.retain(|(number, _)| *number != cut);
        if let Some(capture) = state.capture.as_mut().filter(|capture| capture.cut == cut) {
            capture.held = None;
        }
    }

    /// Copies everything `owner`'s cut still holds, keeping the held writes for their
    /// holder (unless it gave them up).
    fn finish_capture(&mut self, owner: u32) {
        let Some(state) = self.cuts.owners.get_mut(owner as usize) else {
            return;
        };
        let Some(mut capture) = state.capture.take() else {
            return;
        };
        while capture.pending > 0 {
            sweep(
                &mut self.table,
                &self.owners,
                owner,
                state.epoch,
                &mut capture,
                (usize::MAX, usize::MAX),
            );
        }
        state.superseded = 0;
        if let Some(mut held) = capture.held.filter(|_| capture.lost == 0) {
            let mut bytes = Vec::new();
            held.drain_into(&mut bytes);
            state.finished.push((capture.cut, bytes));
        }
    }

    /// Forgets every entry of column family `family` of `owner` (RocksDB is about to change
    /// under them). Dirty ones are dropped unwritten: flush first to keep them.
    pub(crate) fn forget_column(&mut self, owner: u32, family: &str) {
        let Some(column) = self.column_of(owner, family) else {
            return;
        };
        let (mut outside, mut dirty) = (0, 0);
        let cuts = &mut self.cuts;
        self.generation += 1;
        self.table.retain(|entry| {
            let keep = entry.column() != column;
            if !keep {
                outside += entry.bytes.outside();
                if entry.is_dirty() {
                    cuts.hold(owner, entry);
                    dirty += 1;
                }
            }
            keep
        });
        self.outside -= outside;
        for _ in 0..dirty {
            self.count_dirty(owner, false);
        }
    }
}

/// Copies the entries of `owner` dirty at its cut and not yet copied (those not of `epoch`)
/// from at most `buckets` buckets of `table` into `capture`, from where its sweep stopped,
/// until the capture holds `bytes` not handed out (after one bucket at least); around again
/// if the table moved entries meanwhile (it rehashes as it grows).
fn sweep(
    table: &mut HashTable<Cached>,
    owners: &[u32],
    owner: u32,
    epoch: u8,
    capture: &mut Capture,
    (buckets, bytes): (usize, usize),
) {
    let count = table.num_buckets();
    let visit = |table: &mut HashTable<Cached>, index: usize, capture: &mut Capture| {
        if let Ok(mut bucket) = table.get_bucket_entry(index) {
            let entry = bucket.get_mut();
            // The flags first: the column of a long entry is behind a pointer.
            if entry.is_dirty()
                && entry.epoch() != epoch
                && owners[entry.column() as usize] == owner
            {
                settle(entry, epoch, Some(capture));
            }
        }
    };
    for looked in 0..buckets {
        let full = |held: &HeldWrites| held.len() >= bytes;
        if capture.pending == 0 || (looked > 0 && capture.held.as_ref().is_some_and(full)) {
            return;
        }
        if capture.idle >= count {
            // A turn across steps found none of the entries still counted; the table may
            // have moved them between steps (it rehashes as it grows, and in place once
            // deletions used its room up). Look once more, a whole turn in this call, where
            // nothing moves.
            for index in 0..count {
                visit(table, index, capture);
            }
            if capture.pending > 0 {
                // A count gone wrong: stop rather than sweep for ever; the checkpoint fails.
                capture.lost = capture.pending;
                capture.pending = 0;
            }
            return;
        }
        if capture.cursor >= count {
            capture.cursor = 0;
        }
        visit(table, capture.cursor, capture);
        capture.cursor += 1;
        capture.idle += 1;
    }
}

/// Writes `entries` back in one batch; how many.
fn write_back<'a>(
    backing: &impl Backing,
    columns: &[String],
    owners: &[u32],
    entries: impl Iterator<Item = &'a Cached>,
) -> Result<u64, StateError> {
    let writes: Vec<WriteBack<'_>> = entries
        .map(|entry| WriteBack {
            owner: owners[entry.column() as usize],
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
    use crate::backend::rocksdb::held;

    /// A stored entry's `<owner>/<column family>` and key.
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
            owner: u32,
            column_family: &str,
            key: &[u8],
            into: &mut Vec<u8>,
        ) -> Result<bool, StateError> {
            self.loads.set(self.loads.get() + 1);
            match self
                .stored
                .borrow()
                .get(&(format!("{owner}/{column_family}"), key.to_vec()))
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
                let key = (
                    format!("{}/{}", entry.owner, entry.column_family),
                    entry.key.to_vec(),
                );
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
            .map(|(value, _)| value)
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

    /// The prefetch hints point where hashbrown keeps the entries: every bucket where the
    /// last insert says, through each time the table grew, and most entries at the bucket
    /// their probe starts at.
    #[test]
    fn prefetch_hints_point_at_the_entries() {
        let model = Model::default();
        let mut cache = WriteBackCache::new(1 << 20);
        let column = cache.column(0, "value:op:acc");
        assert!(cache.probe_start(0).is_none());
        let keys: Vec<[u8; 8]> = (0..2_000u64).map(u64::to_be_bytes).collect();
        for key in &keys {
            cache.write(&model, column, key, Some(&[1])).unwrap();
        }
        assert_eq!(cache.len(), keys.len(), "nothing evicted");
        for at in 0..cache.table.num_buckets() {
            if let Some(entry) = cache.table.get_bucket(at) {
                let expected = cache.buckets_end - (at + 1) * size_of::<Cached>();
                assert_eq!(entry as *const Cached as usize, expected, "bucket {at}");
            }
        }
        let at_start = keys
            .iter()
            .filter(|key| {
                let hash = WriteBackCache::hash(column, &key[..]);
                let entry = cache.table.find(hash, |e| e.is(hash, column, &key[..]));
                let (_, bucket) = cache.probe_start(hash).unwrap();
                std::ptr::eq(bucket, entry.unwrap())
            })
            .count();
        assert!(
            at_start * 2 > keys.len(),
            "{at_start} of {} entries where their probe starts",
            keys.len()
        );
    }

    /// A write where a read found its key lands on that key: in place (reads and writes in
    /// place move nothing: the generation stays), and where the bucket no longer holds it —
    /// the table grew (entries rehashed), the entry left the table, or the bucket holds
    /// another key or none — without touching what is there.
    #[test]
    fn a_write_where_a_read_found_the_key_lands_on_the_key() {
        let model = Model::default();
        let mut cache = WriteBackCache::new(1 << 20);
        let column = cache.column(0, "value:op:acc");
        let found_at = |cache: &mut WriteBackCache, key: &[u8]| {
            cache.read(&model, column, key, |_| ()).unwrap().1
        };
        let bucket_of = |cache: &WriteBackCache, key: &[u8]| {
            let hash = WriteBackCache::hash(column, key);
            cache
                .table
                .find_bucket_index(hash, |entry| entry.is(hash, column, key))
        };
        cache.write(&model, column, b"a", Some(b"1")).unwrap();
        // In place.
        let found = found_at(&mut cache, b"a");
        assert_eq!(found.bucket, bucket_of(&cache, b"a"), "a hit says where");
        cache
            .write_found(&model, column, b"a", found, Some(b"2"))
            .unwrap();
        assert_eq!(get(&mut cache, &model, column, b"a"), Some(b"2".to_vec()));
        assert_eq!(found.generation, cache.generation, "nothing moved");
        // A miss says where the load put the key.
        let found = found_at(&mut cache, b"c");
        assert_eq!(found.bucket, bucket_of(&cache, b"c"));
        cache
            .write_found(&model, column, b"c", found, Some(b"c"))
            .unwrap();
        assert_eq!(get(&mut cache, &model, column, b"c"), Some(b"c".to_vec()));
        // After the table grew: every entry rehashed.
        let found = found_at(&mut cache, b"a");
        let buckets = cache.table.num_buckets();
        for other in 0..1_000u32 {
            cache
                .write(&model, column, &other.to_be_bytes(), Some(b"x"))
                .unwrap();
        }
        assert!(cache.table.num_buckets() > buckets, "the table grew");
        cache
            .write_found(&model, column, b"a", found, Some(b"3"))
            .unwrap();
        assert_eq!(get(&mut cache, &model, column, b"a"), Some(b"3".to_vec()));
        // The remembered bucket, of a generation before entries moved, holds another key:
        // that key keeps its value.
        let other = 7u32.to_be_bytes();
        let stale = Found {
            hash: WriteBackCache::hash(column, b"a"),
            bucket: bucket_of(&cache, &other),
            generation: cache.generation - 1,
            stored: true,
        };
        cache
            .write_found(&model, column, b"a", stale, Some(b"4"))
            .unwrap();
        assert_eq!(get(&mut cache, &model, column, b"a"), Some(b"4".to_vec()));
        assert_eq!(get(&mut cache, &model, column, &other), Some(b"x".to_vec()));
        // The remembered bucket is empty: the key's entry left the table (RocksDB never held
        // "d", so its delete dropped it).
        let found = found_at(&mut cache, b"d");
        cache
            .write_found(&model, column, b"d", found, Some(b"d"))
            .unwrap();
        let found = found_at(&mut cache, b"d");
        cache.write(&model, column, b"d", None).unwrap();
        assert_eq!(bucket_of(&cache, b"d"), None, "dropped, not a tombstone");
        assert!(cache.table.get_bucket(found.bucket.unwrap()).is_none());
        cache
            .write_found(&model, column, b"d", found, Some(b"5"))
            .unwrap();
        assert_eq!(get(&mut cache, &model, column, b"d"), Some(b"5".to_vec()));
        for other in 0..1_000u32 {
            let other = other.to_be_bytes();
            assert_eq!(get(&mut cache, &model, column, &other), Some(b"x".to_vec()));
        }
        assert_eq!(cache.len(), 1_003, "a, c, d and the others, once each");
        assert_eq!(model.writes.get(), 0, "nothing written back");
    }

    /// A read whose load is too big to keep evicts its own entry at once; a write after it
    /// looks for the key again (finds it gone) and caches the new value.
    #[test]
    fn a_write_after_a_read_whose_entry_was_evicted_at_once() {
        let model = Model::default();
        let mut cache = WriteBackCache::new(MIN_WRITE_BACK_BYTES);
        let column = cache.column(0, "value:op:acc");
        model.stored.borrow_mut().insert(
            ("0/value:op:acc".to_string(), b"big".to_vec()),
            vec![7; 2 * MIN_WRITE_BACK_BYTES],
        );
        let (len, found) = cache
            .read(&model, column, b"big", |value| value.map(<[u8]>::len))
            .unwrap();
        assert_eq!(len, Some(2 * MIN_WRITE_BACK_BYTES));
        assert_eq!(cache.len(), 0, "evicted as soon as loaded");
        cache
            .write_found(&model, column, b"big", found, Some(b"small"))
            .unwrap();
        assert_eq!(
            get(&mut cache, &model, column, b"big"),
            Some(b"small".to_vec())
        );
        cache.flush(&model).unwrap();
        assert_eq!(
            model.stored.borrow()[&("0/value:op:acc".to_string(), b"big".to_vec())],
            b"small"
        );
    }

    /// A key created, updated and deleted while cached costs RocksDB one read and no write.
    #[test]
    fn short_lived_entries_never_reach_rocksdb() {
        let model = Model::default();
        let mut cache = WriteBackCache::new(1 << 20);
        let column = cache.column(0, "value:op:acc");
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

    /// A key new to RocksDB (`write_new`) costs no read: deleted while cached, no write
    /// either; flushed, evicted and read back, it is RocksDB's like any other, and a delete
    /// then reaches RocksDB.
    #[test]
    fn new_keys_cost_rocksdb_no_read() {
        let model = Model::default();
        let mut cache = WriteBackCache::new(1 << 20);
        let column = cache.column(0, "value:op:acc");
        for pane in 0..100u32 {
            let key = pane.to_be_bytes();
            cache.write_new(&model, column, &key, &[0]).unwrap();
            for round in 1..10u8 {
                let (value, found) = cache
                    .read(&model, column, &key, |value| value.map(<[u8]>::to_vec))
                    .unwrap();
                assert_eq!(value, Some(vec![round - 1]));
                cache
                    .write_found(&model, column, &key, found, Some(&[round]))
                    .unwrap();
            }
            cache.write(&model, column, &key, None).unwrap();
        }
        cache.flush(&model).unwrap();
        assert_eq!((model.loads.get(), model.writes.get()), (0, 0));
        assert_eq!(cache.len(), 0);

        cache.write_new(&model, column, b"kept", b"1").unwrap();
        cache.flush(&model).unwrap();
        assert_eq!(model.writes.get(), 1);
        cache.evict(&model, 0).unwrap();
        assert_eq!(
            get(&mut cache, &model, column, b"kept"),
            Some(b"1".to_vec())
        );
        cache.write(&model, column, b"kept", None).unwrap();
        cache.flush(&model).unwrap();
        assert_eq!(model.writes.get(), 2, "the delete reached RocksDB");
        assert!(model.stored.borrow().is_empty());
    }

    /// A flush writes every dirty entry once; entries stay cached, clean.
    #[test]
    fn flush_writes_dirty_entries_once() {
        let model = Model::default();
        let mut cache = WriteBackCache::new(1 << 20);
        let column = cache.column(0, "value:op:acc");
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
        let column = cache.column(0, "value:op:acc");
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
        let column = cache.column(0, "value:op:acc");
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
        /// The column forgotten without a flush first: its dirty entries are dropped.
        ForgetUnflushed(u8),
        /// A cut of the column's owner.
        Cut(u8),
        /// A step of the owner's oldest capture, over this many buckets.
        Step(u8, u8),
        /// The owner's oldest capture given up.
        Abandon(u8),
        /// A read of the key that keeps where it found it, for a later `WriteFound`.
        ReadFound(u8, u8),
        /// A write (`Some`) or delete where the last `ReadFound` found its key, whatever
        /// happened to the table since.
        WriteFound(Option<Vec<u8>>),
    }

    fn op() -> impl Strategy<Value = Op> {
        let column = 0..2u8;
        let key = 0..24u8;
        prop_oneof![
            4 => (column.clone(), key.clone()).prop_map(|(c, k)| Op::Read(c, k)),
            4 => (column.clone(), key.clone(), proptest::collection::vec(any::<u8>(), 0..40))
                .prop_map(|(c, k, v)| Op::Put(c, k, v)),
            2 => (column.clone(), key.clone()).prop_map(|(c, k)| Op::Delete(c, k)),
            1 => Just(Op::Flush),
            1 => column.clone().prop_map(Op::Forget),
            1 => column.clone().prop_map(Op::ForgetUnflushed),
            1 => column.clone().prop_map(Op::Cut),
            2 => (column.clone(), 1..8u8).prop_map(|(c, b)| Op::Step(c, b)),
            1 => column.clone().prop_map(Op::Abandon),
            2 => (column, key).prop_map(|(c, k)| Op::ReadFound(c, k)),
            2 => proptest::option::weighted(0.8, proptest::collection::vec(any::<u8>(), 0..40))
                .prop_map(Op::WriteFound),
        ]
    }

    /// A column's entries by key.
    type Entries = BTreeMap<u8, Vec<u8>>;

    /// A cut under way in the test: what RocksDB and the cache held of the column at the cut,
    /// and the held writes handed out so far.
    struct OpenCut {
        cut: u64,
        stored: Entries,
        expected: Entries,
        held: Vec<u8>,
    }

    /// `model`'s entries of cached column `name`.
    fn stored_of(model: &Model, name: &str) -> Entries {
        model
            .stored
            .borrow()
            .iter()
            .filter(|((column, _), _)| column == name)
            .map(|((_, key), value)| (key[0], value.clone()))
            .collect()
    }

    /// Steps `open`'s capture of `owner` until it is done (unless it is), then checks that
    /// RocksDB at the cut with the held writes applied is the column as it was at the cut.
    fn finish_cut(cache: &mut WriteBackCache, owner: u32, mut open: OpenCut, mut done: bool) {
        while !done {
            done = cache
                .capture_step(owner, open.cut, 5, &mut open.held)
                .unwrap()
                == CaptureStep::Done;
        }
        let mut restored = open.stored;
        for (key, value) in held_entries(&open.held) {
            match value {
                Some(value) => restored.insert(key[0], value),
                None => restored.remove(&key[0]),
            };
        }
        assert_eq!(restored, open.expected, "cut {} of owner {owner}", open.cut);
    }

    /// Held writes by key (a capture holds a key once).
    type Held = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

    /// The entries of held-writes file `bytes`, all of column family `value:op:acc` or of the
    /// property test's.
    fn held_entries(bytes: &[u8]) -> Held {
        let mut entries = BTreeMap::new();
        held::for_each(bytes, |family, key, value| {
            assert!(family.starts_with("value:"), "{family}");
            let before = entries.insert(key.to_vec(), value.map(<[u8]>::to_vec));
            assert!(before.is_none(), "{key:?} held twice");
            Ok::<(), ()>(())
        })
        .unwrap()
        .unwrap();
        entries
    }

    /// A cache of instance `owner` whose column `value:op:acc` holds each key in `keys` (one
    /// byte) with the value `[key]`, dirty.
    fn dirty_cache(owner: u32, keys: std::ops::Range<u8>) -> (Model, WriteBackCache, ColumnId) {
        let model = Model::default();
        let mut cache = WriteBackCache::new(1 << 20);
        let column = cache.column(owner, "value:op:acc");
        for key in keys {
            cache.write(&model, column, &[key], Some(&[key])).unwrap();
        }
        (model, cache, column)
    }

    /// `[key]` for each of `keys`: what [`dirty_cache`] wrote.
    fn as_written(keys: std::ops::Range<u8>) -> Held {
        keys.map(|key| (vec![key], Some(vec![key]))).collect()
    }

    proptest! {
        /// Whatever the capacity and the order of operations, every read returns the last value
        /// written, and after a flush RocksDB holds exactly that (a forgotten column family's
        /// unflushed writes are lost on purpose: its key groups are being deleted). A cut's held
        /// writes, applied to what RocksDB held at the cut, give the column as it was then,
        /// whatever changed, was evicted or written back while they were captured; given-up
        /// captures leave the next cut whole.
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
            // Column c belongs to owner c.
            let families = ["value:a:s", "value:b:s"];
            let names = ["0/value:a:s", "1/value:b:s"];
            let columns = [cache.column(0, families[0]), cache.column(1, families[1])];
            let mut expected: [Entries; 2] = Default::default();
            let mut open: [Vec<OpenCut>; 2] = Default::default();
            let mut last_found: Option<(u8, u8, Found)> = None;
            for op in ops {
                match op {
                    Op::ReadFound(c, k) => {
                        let (got, found) = cache
                            .read(&model, columns[c as usize], &[k], |value| value.map(<[u8]>::to_vec))
                            .unwrap();
                        prop_assert_eq!(got.as_ref(), expected[c as usize].get(&k));
                        last_found = Some((c, k, found));
                    }
                    Op::WriteFound(value) => {
                        if let Some((c, k, found)) = last_found {
                            cache
                                .write_found(&model, columns[c as usize], &[k], found, value.as_deref())
                                .unwrap();
                            match value {
                                Some(value) => expected[c as usize].insert(k, value),
                                None => expected[c as usize].remove(&k),
                            };
                        }
                    }
                    Op::Read(c, k) => {
                        let got = get(&mut cache, &model, columns[c as usize], &[k]);
                        prop_assert_eq!(got.as_ref(), expected[c as usize].get(&k));
                    }
                    Op::Put(c, k, v) => {
                        cache.write(&model, columns[c as usize], &[k], Some(&v)).unwrap();
                        expected[c as usize].insert(k, v);
                    }
                    Op::Delete(c, k) => {
                        cache.write(&model, columns[c as usize], &[k], None).unwrap();
                        expected[c as usize].remove(&k);
                    }
                    Op::Flush => cache.flush(&model).unwrap(),
                    Op::Forget(c) => {
                        cache.flush(&model).unwrap();
                        cache.forget_column(u32::from(c), families[c as usize]);
                    }
                    Op::ForgetUnflushed(c) => {
                        cache.forget_column(u32::from(c), families[c as usize]);
                        // What RocksDB holds is the column now (a cut under way still holds
                        // the dropped entries as they were at it).
                        expected[c as usize] = stored_of(&model, names[c as usize]);
                    }
                    Op::Cut(c) => {
                        if let Some(cut) = cache.begin_capture(u32::from(c)) {
                            open[c as usize].push(OpenCut {
                                cut,
                                stored: stored_of(&model, names[c as usize]),
                                expected: expected[c as usize].clone(),
                                held: Vec::new(),
                            });
                        } else {
                            // Nothing dirty: RocksDB holds the column whole.
                            prop_assert_eq!(
                                &stored_of(&model, names[c as usize]),
                                &expected[c as usize]
                            );
                        }
                    }
                    Op::Step(c, buckets) => {
                        if let Some(first) = open[c as usize].first_mut() {
                            let step = cache
                                .capture_step(u32::from(c), first.cut, buckets.into(), &mut first.held)
                                .unwrap();
                            if step == CaptureStep::Done {
                                finish_cut(&mut cache, u32::from(c), open[c as usize].remove(0), true);
                            }
                        }
                    }
                    Op::Abandon(c) => {
                        if !open[c as usize].is_empty() {
                            let given_up = open[c as usize].remove(0);
                            cache.abandon_capture(u32::from(c), given_up.cut);
                        }
                    }
                }
                prop_assert!(cache.used() <= cache.capacity);
                // The counters agree with the entries.
                let dirty = cache.table.iter().filter(|entry| entry.is_dirty()).count();
                prop_assert_eq!(cache.dirty, dirty);
                for owner in 0..2u32 {
                    let of_owner = cache
                        .table
                        .iter()
                        .filter(|entry| entry.is_dirty() && cache.owners[entry.column() as usize] == owner)
                        .count();
                    prop_assert_eq!(cache.cuts.owners[owner as usize].dirty, of_owner);
                }
                let outside: usize = cache.table.iter().map(|entry| entry.bytes.outside()).sum();
                prop_assert_eq!(cache.outside, outside);
                prop_assert!(cache.len() <= cache.max_entries);
            }
            for (owner, cuts) in open.into_iter().enumerate() {
                for cut in cuts {
                    finish_cut(&mut cache, owner as u32, cut, false);
                }
            }
            cache.flush(&model).unwrap();
            for (c, name) in names.iter().enumerate() {
                prop_assert_eq!(&stored_of(&model, name), &expected[c]);
            }
        }
    }

    /// A step of a capture ends once it copied about [`STEP_HELD_BYTES`], however many
    /// buckets it may look at: what holds the shard stays bounded where entries are long.
    #[test]
    fn a_capture_step_is_bounded_by_its_bytes() {
        let model = Model::default();
        let mut cache = WriteBackCache::new(8 << 20);
        let column = cache.column(0, "value:op:acc");
        let value = vec![7u8; 4096];
        for key in 0..512u32 {
            cache
                .write(&model, column, &key.to_be_bytes(), Some(&value))
                .unwrap();
        }
        let cut = cache.begin_capture(0).expect("dirty entries");
        let mut steps = 0;
        loop {
            let mut piece = Vec::new();
            let step = cache.capture_step(0, cut, usize::MAX, &mut piece).unwrap();
            assert!(
                piece.len() < STEP_HELD_BYTES + 4200,
                "{} bytes",
                piece.len()
            );
            steps += 1;
            if step == CaptureStep::Done {
                break;
            }
        }
        assert!(steps >= 512 * 4096 / STEP_HELD_BYTES, "{steps} steps");
    }

    /// A capture finds its entries however the table moves them between its steps: it grows
    /// (a rehash moves every entry) after the sweep passed some buckets.
    #[test]
    fn a_capture_survives_the_table_growing_under_its_sweep() {
        let (model, mut cache, column) = dirty_cache(0, 0..8);
        let buckets = cache.table.num_buckets();
        let cut = cache.begin_capture(0).expect("dirty entries");
        let mut bytes = Vec::new();
        assert_eq!(
            cache.capture_step(0, cut, 2, &mut bytes).unwrap(),
            CaptureStep::More
        );
        for key in 100..3000u32 {
            cache
                .write(&model, column, &key.to_be_bytes(), Some(&[2]))
                .unwrap();
        }
        assert!(cache.table.num_buckets() > buckets, "the table grew");
        while cache.capture_step(0, cut, 2, &mut bytes).unwrap() == CaptureStep::More {}
        assert_eq!(held_entries(&bytes), as_written(0..8));
    }

    /// A cut takes over what a given-up capture still marks, without a sweep at its barrier,
    /// for up to [`MAX_SUPERSEDED`] in a row, and the cut after them sweeps first: however many
    /// captures in a row are given up, the next one that runs to its end holds every dirty
    /// entry as it is — those unchanged since before the first included.
    #[test]
    fn cuts_after_given_up_captures_hold_everything() {
        let (model, mut cache, column) = dirty_cache(0, 0..40);
        let mut expected = as_written(0..40);
        for round in 0..7u8 {
            let cut = cache.begin_capture(0).expect("dirty entries");
            assert!(cache.cuts.owners[0].superseded <= MAX_SUPERSEDED);
            // Half the keys change; the other half stay as they were before the first cut.
            for key in 0..20u8 {
                cache
                    .write(&model, column, &[key], Some(&[key, round]))
                    .unwrap();
                expected.insert(vec![key], Some(vec![key, round]));
            }
            cache.abandon_capture(0, cut);
        }
        let cut = cache.begin_capture(0).expect("dirty entries");
        let mut bytes = Vec::new();
        while cache.capture_step(0, cut, 7, &mut bytes).unwrap() == CaptureStep::More {}
        assert_eq!(held_entries(&bytes), expected);
        assert_eq!(model.writes.get(), 0);
    }

    /// A capture that cannot find every entry it counted fails (the checkpoint with it)
    /// instead of handing out held writes that lack some.
    #[test]
    fn a_capture_missing_entries_fails() {
        let (_, mut cache, _) = dirty_cache(0, 0..8);
        let cut = cache.begin_capture(0).expect("dirty entries");
        cache.cuts.owners[0].capture.as_mut().unwrap().pending += 1;
        let mut bytes = Vec::new();
        let error = loop {
            match cache.capture_step(0, cut, 4, &mut bytes) {
                Ok(CaptureStep::More) => {}
                Ok(CaptureStep::Done) => panic!("a capture missing an entry ended"),
                Err(error) => break error,
            }
        };
        assert!(error.contains("1 entries"), "{error}");
        assert!(cache.cuts.owners[0].capture.is_none());
        // The next cut holds every dirty entry again.
        let next = cache.begin_capture(0).expect("dirty entries");
        assert_eq!(cache.cuts.owners[0].capture.as_ref().unwrap().pending, 8);
        while cache.capture_step(0, next, 4, &mut bytes).unwrap() == CaptureStep::More {}
    }

    /// A cut holds what was dirty at it: an entry changed before the capture's sweep reaches
    /// it is copied as it was, one dirtied after the cut is not held, and the entries stay
    /// dirty (RocksDB sees nothing of the cut).
    #[test]
    fn a_cut_holds_its_entries_as_they_were() {
        let (model, mut cache, column) = dirty_cache(3, 0..100);
        let cut = cache.begin_capture(3).expect("dirty entries");
        for key in 0..50u8 {
            cache
                .write(&model, column, &[key], Some(&[key, 1]))
                .unwrap();
        }
        cache.write(&model, column, &[200], Some(&[0])).unwrap();
        let mut held = Vec::new();
        let mut steps = 0;
        while cache.capture_step(3, cut, 16, &mut held).unwrap() == CaptureStep::More {
            steps += 1;
        }
        assert!(steps > 1, "captured in steps");
        assert_eq!(held_entries(&held), as_written(0..100));
        assert_eq!(model.writes.get(), 0);
        assert_eq!(cache.dirty, 101);
        // The next cut holds the entries changed since, and those never captured again.
        let next = cache.begin_capture(3).expect("dirty entries");
        assert_eq!(cache.cuts.owners[3].capture.as_ref().unwrap().pending, 101);
        cache.abandon_capture(3, next);
        assert!(cache.begin_capture(3).is_some());
        assert!(
            cache.capture_step(3, next, 1, &mut held).is_err(),
            "given up"
        );
    }
}
