//! One RocksDB instance per keyed operator subtask, in its slot's directory and memory.
//!
//! A [`RocksDbSlot`] owns a slot's block cache and write buffer manager; each keyed operator
//! subtask of the slot opens a [`RocksDbInstance`] of its own in them (Flink's layout), so that
//! a checkpoint can cut each operator's state at its own barrier
//! ([`RocksDbInstance::create_checkpoint`]) while the slot's memory bound holds for all of
//! them together. Each keyed state gets its own column family, named
//! `<layout>:<operator>:<state>` (layout `value` or `list`, which decides the compaction filter
//! and merge operator when the database is opened again from a checkpoint).
//!
//! **Memory.** The slot's managed share is handed in as two numbers: the block cache capacity
//! and the write buffer (memtable) budget. The write buffer manager charges memtable memory to
//! the block cache, and index and filter blocks live in the cache too, so the cache capacity is
//! the bound for all three; the write buffer budget is the part memtables may take before they
//! are flushed (writers stall while they are over it). The cache is an LRU cache *without* a
//! strict capacity limit: rocksdb 0.25 does not expose one (the C API's
//! `rocksdb_cache_create_lru_with_strict_capacity_limit` has no safe wrapper), and a strict
//! limit makes reads fail with `Incomplete` when pinned blocks fill the cache — Flink leaves it
//! off for the same reason. The bound is checked by measuring resident memory in
//! `tests/rocksdb_memory.rs`.
//!
//! **Write-back cache.** With `write_back_bytes` above zero, value, reducing and aggregating
//! states go through the slot's write-back cache (`cache.rs`), shared by its instances: hot
//! entries live in memory and reach their instance's RocksDB when evicted, or when something
//! reads RocksDB directly — a flushed checkpoint, a key-group scan, a compaction, a size
//! estimate — which first writes the dirty ones back. A checkpoint's cut copies the dirty ones
//! into a file of its own instead (`held.rs`).
//!
//! **Durability.** A checkpoint is the unit of durability (as in Flink): nothing is synced.
//! Without checkpoints, writes skip the write-ahead log, and
//! [`RocksDbInstance::create_checkpoint`] flushes memtables before it hard-links the SST files.
//! A checkpointed job's instances write the log (unsynced, so a write costs a copy into the
//! page cache), and a checkpoint cuts them without a flush ([`RocksDbInstance::cut`]): the
//! logs up to their length at the barrier hold what the memtables held, and a file of held
//! writes what the write-back cache held that RocksDB did not (`held.rs`). A flush at the barrier
//! took hundreds of milliseconds with the shard waiting; RocksDB now flushes on its own
//! threads, when a memtable fills or the logs pass about one memtable.
//!
//! **Memtables for read-modify-write.** Keyed state is read, changed and written back, again and
//! again, on the same keys. With RocksDB's defaults a counter updated a million times leaves a
//! million versions in the memtable, and every read and every write searches one skip list over
//! all of them. Two column family options change that (`bench/RESULTS.md`, "State backends",
//! has the measurements):
//!
//! - `inplace_update_support`: a put whose key's newest memtable entry is a put of a value at
//!   least as long overwrites that value in place, so the memtable holds about one entry per
//!   live key. RocksDB's conditions hold: a slot has one writer (its shard's thread), so memtable
//!   writes are not concurrent (`allow_concurrent_memtable_write` is off); nothing takes
//!   snapshots; an open iterator may see a value written after it was created, which map
//!   iteration already allows ("writes made while iterating may or may not be seen", as in
//!   Flink). One interaction needs care: an in-place update keeps the entry's old sequence
//!   number, so after a range deletion the memtable could hold a new value older than the
//!   tombstone, which would hide it. [`RocksDbInstance::delete_key_groups`] therefore flushes the
//!   column family after its range tombstone, so later writes start a fresh memtable.
//! - A hash memtable (`HashLinkList`) keyed by a prefix extractor that cuts a stored key after
//!   its namespace (key group, key, namespace; see `key.rs`): a point read or write hashes to the
//!   bucket of its `(key, namespace)` instead of searching the whole memtable, and a map's
//!   entries share one bucket, so its prefix scans stay cheap. A bucket is a sorted list that
//!   RocksDB turns into a skip list past 256 entries (a big map). Iterators that cross prefixes
//!   (the key-group scans of [`RocksDbInstance::raw_entries`]) ask for total order seek, which sorts
//!   the memtable for that iterator; those are for rescaling and inspection, not per record.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use librocksdb_sys as ffi;
use rocksdb::checkpoint::Checkpoint;
use rocksdb::{
    AsColumnFamilyRef, AsRawPtr, BlockBasedOptions, BottommostLevelCompaction, BoundColumnFamily,
    Cache, ColumnFamilyDescriptor, CompactOptions, DBCompressionType, DBRawIteratorWithThreadMode,
    DBWithThreadMode, MemtableFactory, MultiThreaded, Options, ReadOptions, SliceTransform,
    WriteBatch, WriteBufferManager, WriteOptions,
};

use crate::backend::rocksdb::cache::{
    Backing, CaptureStep, ColumnId, Found, WriteBack, WriteBackCache, WriteBackStats,
    MIN_WRITE_BACK_BYTES,
};
use crate::backend::rocksdb::held::{self, HELD_WRITES_FILE};
use crate::backend::rocksdb::key::{has_state_prefix, key_group_bounds, state_prefix};
use crate::backend::rocksdb::value::{list_append, ColumnLayout, TtlFilterFactory};
use crate::error::{StateError, StateErrorKind};
use crate::key_group::KeyGroupRange;
use crate::ttl::Clock;

/// The RocksDB database type: column families can be created through a shared reference.
pub(crate) type Db = DBWithThreadMode<MultiThreaded>;

/// Hash buckets of a state's memtable (8 bytes each, allocated with the memtable: 128 KiB). More
/// live keys than buckets cost a short list walk per access, not a failure.
const MEMTABLE_BUCKETS: usize = 16 << 10;

/// Where and with how much memory a slot's RocksDB runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RocksDbConfig {
    /// The database directory (created if missing; an existing database is opened).
    pub path: PathBuf,
    /// Block cache capacity in bytes: the bound for data blocks, index and filter blocks and
    /// (through the write buffer manager) memtables.
    pub block_cache_bytes: usize,
    /// Memtable budget in bytes, charged to the block cache; at most `block_cache_bytes`.
    pub write_buffer_bytes: usize,
    /// Background flush and compaction threads (RocksDB's `max_background_jobs`).
    pub background_jobs: i32,
    /// Capacity of the write-back cache of value states, in bytes (see the module docs), in
    /// addition to the block cache; 0 turns it off.
    pub write_back_bytes: usize,
    /// Whether writes go through RocksDB's write-ahead log, so that a checkpoint can cut the
    /// instance without flushing its memtables ([`RocksDbInstance::cut`]): on for the
    /// instances of a checkpointed job.
    pub write_ahead_log: bool,
}

impl RocksDbConfig {
    /// A config with an explicit cache capacity and memtable budget, 2 background jobs and no
    /// write-back cache.
    pub fn new(
        path: impl Into<PathBuf>,
        block_cache_bytes: usize,
        write_buffer_bytes: usize,
    ) -> Self {
        RocksDbConfig {
            path: path.into(),
            block_cache_bytes,
            write_buffer_bytes,
            background_jobs: 2,
            write_back_bytes: 0,
            write_ahead_log: false,
        }
    }

    /// The same config with a write-back cache of `bytes`.
    pub fn with_write_back(self, bytes: usize) -> Self {
        RocksDbConfig {
            write_back_bytes: bytes,
            ..self
        }
    }

    /// The same config with the write-ahead log on or off.
    pub fn with_write_ahead_log(self, on: bool) -> Self {
        RocksDbConfig {
            write_ahead_log: on,
            ..self
        }
    }

    /// The config of a slot with RocksDB budget `budget` (from `weir-memory`): block cache,
    /// memtable budget and write-back cache as the budget divides the slot's managed share.
    pub fn from_budget(path: impl Into<PathBuf>, budget: &weir_memory::RocksDbBudget) -> Self {
        let bytes = |value: u64| usize::try_from(value).unwrap_or(usize::MAX);
        RocksDbConfig::new(path, bytes(budget.block_cache), bytes(budget.write_buffers))
            .with_write_back(bytes(budget.write_back_cache))
    }

    /// A config for a slot whose managed memory share is `managed_bytes`, divided with the
    /// default ratios (see [`weir_memory::RocksDbMemoryRatios`]).
    pub fn from_managed_memory(path: impl Into<PathBuf>, managed_bytes: u64) -> Self {
        let budget = weir_memory::RocksDbBudget::new(
            managed_bytes,
            weir_memory::RocksDbMemoryRatios::default(),
        );
        RocksDbConfig::from_budget(path, &budget)
    }

    fn validate(&self) -> Result<(), StateError> {
        const MIN_CACHE: usize = 4 << 20;
        if self.block_cache_bytes < MIN_CACHE {
            return Err(StateError::invalid_config(
                "RocksDB block cache bytes",
                self.block_cache_bytes,
                "give the slot at least 4 MiB of managed memory (raise \
                 taskmanager.memory.managed.fraction or taskmanager.memory.process.size)",
            ));
        }
        if self.write_buffer_bytes == 0 || self.write_buffer_bytes > self.block_cache_bytes {
            return Err(StateError::invalid_config(
                "RocksDB write buffer bytes",
                self.write_buffer_bytes,
                format!(
                    "use more than 0 and at most the block cache capacity ({} bytes): memtables \
                     are charged to the cache",
                    self.block_cache_bytes
                ),
            ));
        }
        if self.write_back_bytes != 0 && self.write_back_bytes < MIN_WRITE_BACK_BYTES {
            return Err(StateError::invalid_config(
                "RocksDB write-back cache bytes",
                self.write_back_bytes,
                format!(
                    "give the write-back cache at least {MIN_WRITE_BACK_BYTES} bytes (raise \
                     state.backend.rocksdb.memory.write-back-ratio or the slot's managed memory), \
                     or 0 to turn it off"
                ),
            ));
        }
        if self.background_jobs < 1 {
            return Err(StateError::invalid_config(
                "RocksDB background jobs",
                self.background_jobs,
                "use at least 1",
            ));
        }
        Ok(())
    }

    /// The memtable size of one column family: a quarter of the budget, between 1 and 64 MiB,
    /// so that one busy state flushes before it holds the whole budget.
    fn column_write_buffer(&self) -> usize {
        (self.write_buffer_bytes / 4).clamp(1 << 20, 64 << 20)
    }
}

/// What a slot's RocksDB uses, from RocksDB's own accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RocksDbMemoryUsage {
    /// The block cache capacity.
    pub block_cache_capacity: usize,
    /// Bytes in the block cache (blocks, index/filter blocks, memtable reservations).
    pub block_cache_usage: usize,
    /// Bytes of pinned entries in the block cache.
    pub block_cache_pinned: usize,
    /// The memtable budget.
    pub write_buffer_limit: usize,
    /// Bytes of memtables (the write buffer manager's count).
    pub write_buffer_usage: usize,
    /// Table reader memory not held in the cache, summed over column families.
    pub table_readers: u64,
    /// The write-back cache's capacity (0: no cache).
    pub write_back_capacity: usize,
    /// Bytes the write-back cache holds (its table, once allocated, and long entries).
    pub write_back_usage: usize,
    /// Entries the write-back cache holds.
    pub write_back_entries: usize,
}

/// The memory RocksDB instances share: one slot's block cache, write buffer manager and
/// write-back cache.
#[derive(Clone)]
struct SlotMemory {
    cache: Cache,
    write_buffer_manager: WriteBufferManager,
    write_back: Option<Arc<SharedWriteBack>>,
}

impl SlotMemory {
    fn new(config: &RocksDbConfig) -> SlotMemory {
        let cache = Cache::new_lru_cache(config.block_cache_bytes);
        let write_buffer_manager = WriteBufferManager::new_write_buffer_manager_with_cache(
            config.write_buffer_bytes,
            true,
            cache.clone(),
        );
        let write_back = (config.write_back_bytes > 0).then(|| {
            Arc::new(SharedWriteBack {
                cache: Mutex::new(
                    WriteBackCache::new(config.write_back_bytes)
                        .with_dirty_limit(config.column_write_buffer()),
                ),
                instances: Mutex::new(Vec::new()),
                seen: Default::default(),
            })
        });
        SlotMemory {
            cache,
            write_buffer_manager,
            write_back,
        }
    }

    /// What the slot's caches and memtables use now, from RocksDB's own accounting (no table
    /// readers: those are per instance). Any thread may read it without waiting: the
    /// write-back cache is read if its shard does not hold it at that moment, else as it was
    /// last read.
    fn usage(&self, config: &RocksDbConfig) -> RocksDbMemoryUsage {
        let (write_back_usage, write_back_entries) =
            self.write_back.as_ref().map_or((0, 0), |shared| {
                let (used, len) = &shared.seen;
                if let Ok(cache) = shared.cache.try_lock() {
                    used.store(cache.used(), Ordering::Relaxed);
                    len.store(cache.len(), Ordering::Relaxed);
                }
                (used.load(Ordering::Relaxed), len.load(Ordering::Relaxed))
            });
        RocksDbMemoryUsage {
            block_cache_capacity: config.block_cache_bytes,
            block_cache_usage: self.cache.get_usage(),
            block_cache_pinned: self.cache.get_pinned_usage(),
            write_buffer_limit: config.write_buffer_bytes,
            write_buffer_usage: self.write_buffer_manager.get_usage(),
            table_readers: 0,
            write_back_capacity: config.write_back_bytes,
            write_back_usage,
            write_back_entries,
        }
    }
}

/// A slot's write-back cache, shared by its instances, so that the busiest state gets the
/// room it needs (an even split left q5's window contents half the room they need). A column
/// family is cached with the id of its instance (its owner) and its name: eviction and
/// flushes write each entry back to its own instance.
struct SharedWriteBack {
    cache: Mutex<WriteBackCache>,
    /// The slot's instances by id (an instance's index here).
    instances: Mutex<Vec<Weak<RocksDbInstance>>>,
    /// What the cache held, bytes and entries, when a metrics reader last found it free.
    seen: (AtomicUsize, AtomicUsize),
}

impl SharedWriteBack {
    /// The cache, locked. Only the slot's shard waits for it (a metrics reader only tries it),
    /// so the lock is never contended for long; a panic while it was held leaves it consistent (every change to it completes before a
    /// call out of it, and its own checks of a broken invariant panic before the change they
    /// guard), so a poisoned lock is taken as it is.
    fn lock(&self) -> MutexGuard<'_, WriteBackCache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new instance's id.
    fn register(&self) -> u32 {
        let mut instances = self
            .instances
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        instances.push(Weak::new());
        (instances.len() - 1) as u32
    }
}

/// One slot's RocksDB: a directory and a memory budget, shared by one instance per keyed
/// operator subtask of the slot (Flink's layout). Each instance can be checkpointed at its own
/// operator's barrier; together they stay within the slot's block cache, memtable budget and
/// write-back cache.
pub struct RocksDbSlot {
    /// The slot's directory and budget.
    config: RocksDbConfig,
    memory: SlotMemory,
    clock: Arc<dyn Clock>,
}

impl RocksDbSlot {
    /// The slot of `config`: its directory and whole budget, the write-back cache included.
    pub fn new(config: RocksDbConfig, clock: Arc<dyn Clock>) -> Result<RocksDbSlot, StateError> {
        config.validate()?;
        let memory = SlotMemory::new(&config);
        Ok(RocksDbSlot {
            config,
            memory,
            clock,
        })
    }

    /// The slot's directory.
    pub fn path(&self) -> &Path {
        &self.config.path
    }

    /// What the slot's block cache (memtables charged to it), memtables and write-back cache
    /// use now, shared by its instances; `table_readers` is 0 (per instance: see
    /// [`RocksDbInstance::memory_usage`]). Cheap, and safe from any thread (a metrics reader).
    pub fn memory_usage(&self) -> RocksDbMemoryUsage {
        self.memory.usage(&self.config)
    }

    /// Where instance `name` keeps its database.
    pub fn instance_path(&self, name: &str) -> PathBuf {
        self.config.path.join(name)
    }

    /// Opens (or creates) instance `name` in the slot's directory and memory.
    pub fn open_instance(&self, name: &str) -> Result<Arc<RocksDbInstance>, StateError> {
        let config = RocksDbConfig {
            path: self.instance_path(name),
            ..self.config.clone()
        };
        RocksDbInstance::open_with(config, self.memory.clone(), Arc::clone(&self.clock))
    }
}

impl std::fmt::Debug for RocksDbSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksDbSlot")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A native checkpoint of one instance: its files as they were at a barrier
/// ([`RocksDbInstance::create_checkpoint`], [`RocksDbInstance::cut`]).
#[derive(Debug)]
pub struct NativeCheckpoint {
    /// Its directory of hard links and copies, next to the instance's.
    pub dir: PathBuf,
    /// Its files, by name.
    pub files: Vec<NativeFile>,
    /// The write-back cache's entries that RocksDB's files lack, being captured: the file
    /// [`HELD_WRITES_FILE`] of the checkpoint, once every piece is out (a cut's only).
    pub held: Option<HeldCapture>,
}

/// The held writes of a cut ([`RocksDbInstance::cut`]), captured while records flow: the
/// write-back cache's entries of the instance that were dirty at the cut, each copied by a
/// step of the capture or, first, by a change to it (`cache.rs`, "Cuts"). Dropped before the
/// last piece is out, the capture is given up.
pub struct HeldCapture {
    shared: Arc<SharedWriteBack>,
    /// The instance's directory, for errors.
    path: PathBuf,
    instance: u32,
    cut: u64,
    done: bool,
}

impl HeldCapture {
    /// Buckets of the cache a step looks at, at most (a step also ends once it copied
    /// [`crate::backend::rocksdb::cache::STEP_HELD_BYTES`]): about 30 µs of work where few
    /// entries are held.
    const STEP_BUCKETS: usize = 4096;

    /// Appends the next piece of the held-writes file to `out` (the magic and version in the
    /// first); whether more follow. Fails when the capture lost entries.
    pub fn next_piece(&mut self, out: &mut Vec<u8>) -> Result<bool, StateError> {
        if self.done {
            return Ok(false);
        }
        let step = self
            .shared
            .lock()
            .capture_step(self.instance, self.cut, Self::STEP_BUCKETS, out)
            .map_err(|problem| StateErrorKind::CutIncomplete {
                path: self.path.clone(),
                problem,
            })?;
        self.done = step == CaptureStep::Done;
        Ok(!self.done)
    }
}

impl Drop for HeldCapture {
    fn drop(&mut self) {
        if !self.done {
            self.shared.lock().abandon_capture(self.instance, self.cut);
        }
    }
}

impl std::fmt::Debug for HeldCapture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldCapture")
            .field("path", &self.path)
            .field("instance", &self.instance)
            .field("cut", &self.cut)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// One file of a [`NativeCheckpoint`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NativeFile {
    /// The file's name, RocksDB's (`000012.sst`, `MANIFEST-000005`, `CURRENT`, …).
    pub name: String,
    /// Its length in bytes.
    pub len: u64,
    /// Where its bytes are.
    pub source: NativeSource,
}

/// Where a [`NativeFile`]'s bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NativeSource {
    /// The first `len` bytes of this file: a log or manifest that RocksDB goes on appending to
    /// holds the checkpoint's part in its first `len` bytes.
    File(PathBuf),
    /// These bytes (`CURRENT`, which names the manifest).
    Bytes(Vec<u8>),
}

impl NativeFile {
    /// Whether the file is an SST file: immutable, so one uploaded once serves every later
    /// checkpoint that still has it.
    pub fn is_sst(&self) -> bool {
        NativeFile::is_sst_name(&self.name)
    }

    /// Whether RocksDB's file `name` is an SST file.
    pub fn is_sst_name(name: &str) -> bool {
        name.ends_with(".sst")
    }
}

/// RocksDB's file deletions paused on an instance until this is dropped (the count is
/// RocksDB's: every pause must end for deletions to resume).
struct DeletionsPaused<'a>(&'a RocksDbInstance);

impl DeletionsPaused<'_> {
    fn new(instance: &RocksDbInstance) -> Result<DeletionsPaused<'_>, StateError> {
        instance.db.disable_file_deletions().map_err(|source| {
            StateError::rocksdb(instance.path(), "*", "pausing file deletions", source)
        })?;
        Ok(DeletionsPaused(instance))
    }
}

impl Drop for DeletionsPaused<'_> {
    fn drop(&mut self) {
        if let Err(error) = self.0.db.enable_file_deletions() {
            tracing::warn!(db = %self.0.path().display(), %error, "cannot resume RocksDB's file deletions");
        }
    }
}

/// One keyed operator subtask's RocksDB instance (see the module docs). Shared by its keyed
/// backend (or window contents) and its checkpoint writer through an `Arc`.
pub struct RocksDbInstance {
    db: Db,
    config: RocksDbConfig,
    /// The slot's block cache, write buffer manager and write-back cache of value states (if
    /// the config has one).
    memory: SlotMemory,
    clock: Arc<dyn Clock>,
    write_options: WriteOptions,
    read_options: ReadOptions,
    /// The instance's id in its slot's write-back cache.
    id: u32,
    /// Its column families by name, `default` included (flushed after a cut).
    column_names: Mutex<Vec<String>>,
}

impl RocksDbInstance {
    /// Opens (or creates) the database at `config.path` with a block cache and write buffer
    /// manager of its own (an instance alone in its slot), with every column family it already
    /// has. `clock` is the processing-time clock of TTL, read by the compaction filter.
    pub fn open(
        config: RocksDbConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<RocksDbInstance>, StateError> {
        config.validate()?;
        let memory = SlotMemory::new(&config);
        RocksDbInstance::open_with(config, memory, clock)
    }

    /// Opens (or creates) the database at `config.path` in `memory` (see [`RocksDbSlot`]).
    fn open_with(
        config: RocksDbConfig,
        memory: SlotMemory,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<RocksDbInstance>, StateError> {
        std::fs::create_dir_all(&config.path)
            .map_err(|source| StateError::io(&config.path, "creating", source))?;
        let mut db_options = column_options(&config, &memory.cache, &clock, None);
        db_options.create_if_missing(true);
        db_options.create_missing_column_families(true);
        db_options.set_write_buffer_manager(&memory.write_buffer_manager);
        db_options.set_max_background_jobs(config.background_jobs);
        db_options.set_keep_log_file_num(2);
        db_options.set_max_log_file_size(1 << 20);
        if config.write_ahead_log {
            // A cut copies the logs: past about one memtable of them, RocksDB flushes the
            // column families that hold the oldest, so that it can drop it.
            db_options.set_max_total_wal_size(config.column_write_buffer() as u64);
            // The log is written to its file when its buffer fills and when a cut lists it,
            // not after every write: a state written per record (a list's append) would
            // otherwise cost a system call per record.
            db_options.set_manual_wal_flush(true);
        }

        let existing = Db::list_cf(&db_options, &config.path).unwrap_or_default();
        let mut column_names = existing.clone();
        if !column_names
            .iter()
            .any(|name| name == rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
        {
            column_names.push(rocksdb::DEFAULT_COLUMN_FAMILY_NAME.to_string());
        }
        let descriptors: Vec<ColumnFamilyDescriptor> = existing
            .into_iter()
            .filter(|name| name != rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
            .map(|name| {
                let layout = name
                    .split_once(':')
                    .and_then(|(tag, _)| ColumnLayout::from_tag(tag));
                let options = column_options(&config, &memory.cache, &clock, layout);
                ColumnFamilyDescriptor::new(name, options)
            })
            .collect();
        let db = Db::open_cf_descriptors(&db_options, &config.path, descriptors)
            .map_err(|source| StateError::rocksdb(&config.path, "*", "opening", source))?;
        let mut write_options = WriteOptions::default();
        write_options.disable_wal(!config.write_ahead_log);
        tracing::debug!(
            path = %config.path.display(),
            block_cache_bytes = config.block_cache_bytes,
            write_buffer_bytes = config.write_buffer_bytes,
            write_back_bytes = config.write_back_bytes,
            "opened RocksDB instance"
        );
        let id = memory
            .write_back
            .as_ref()
            .map_or(0, |shared| shared.register());
        let instance = Arc::new(RocksDbInstance {
            db,
            config,
            memory,
            clock,
            write_options,
            read_options: ReadOptions::default(),
            id,
            column_names: Mutex::new(column_names),
        });
        if let Some(shared) = &instance.memory.write_back {
            shared
                .instances
                .lock()
                .unwrap_or_else(PoisonError::into_inner)[id as usize] = Arc::downgrade(&instance);
        }
        instance.write_held()?;
        Ok(instance)
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.config.path
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &RocksDbConfig {
        &self.config
    }

    /// Names of all column families (one per keyed state of any operator, plus `default`).
    pub fn column_families(&self) -> Result<Vec<String>, StateError> {
        Db::list_cf(&Options::default(), self.path()).map_err(|source| {
            StateError::rocksdb(self.path(), "*", "listing column families", source)
        })
    }

    /// Writes a native RocksDB checkpoint into `dir` (which must not exist, on the instance's
    /// file system for hard links): the write-back cache is written back and memtables are
    /// flushed, then the live SST files are hard-linked with a copy of the manifest, options
    /// and `CURRENT`. The directory opens as a database of its own ([`RocksDbInstance::open`]).
    /// Its files, with their lengths, come back: SST files never change, so an incremental
    /// checkpoint uploads only those an earlier one did not have.
    pub fn create_checkpoint(&self, dir: &Path) -> Result<NativeCheckpoint, StateError> {
        self.flush_write_back()?;
        let checkpoint = Checkpoint::new(&self.db).map_err(|source| {
            StateError::rocksdb(self.path(), "*", "preparing a checkpoint", source)
        })?;
        checkpoint.create_checkpoint(dir).map_err(|source| {
            StateError::rocksdb(self.path(), "*", "writing a checkpoint", source)
        })?;
        let listing = |source| StateError::io(dir, "listing", source);
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(listing)? {
            let entry = entry.map_err(listing)?;
            let len = entry.metadata().map_err(listing)?.len();
            let name = entry.file_name().into_string().map_err(|name| {
                StateError::invalid_config(
                    "RocksDB checkpoint file name",
                    format!("{name:?}"),
                    "RocksDB names its files in ASCII; remove foreign files from the checkpoint",
                )
            })?;
            let source = NativeSource::File(dir.join(&name));
            files.push(NativeFile { name, len, source });
        }
        files.sort_by(|a, b| a.name.cmp(&b.name));
        tracing::debug!(db = %self.path().display(), checkpoint = %dir.display(), files = files.len(), "created RocksDB checkpoint");
        Ok(NativeCheckpoint {
            dir: dir.to_path_buf(),
            files,
            held: None,
        })
    }

    /// Cuts the instance at a barrier into `dir` (which must not exist, on the instance's file
    /// system), without flushing its memtables or writing the write-back cache back: the
    /// cache's dirty entries of this instance are held for a file of the checkpoint,
    /// [`crate::HELD_WRITES_FILE`] (`held.rs`), copied after the barrier through
    /// [`NativeCheckpoint::held`]; with RocksDB's file deletions paused, the live
    /// files are listed as they are now — the SST files, the manifest and the write-ahead logs
    /// still needed, each with its present length (RocksDB's `GetLiveFilesStorageInfo`),
    /// `CURRENT` by its contents — and hard-linked into `dir`. RocksDB goes on appending to the
    /// logs and the manifest (the links see it; only the listed lengths are the cut's) and may
    /// compact the SST files away (the links keep them). Opened again, those files replay the
    /// logs into memtables and write the held entries into RocksDB ([`RocksDbInstance::open`]):
    /// the state as it was at the cut. Then the memtables start flushing on RocksDB's threads,
    /// not waited for, so that the next cut's logs hold only what comes after this one.
    ///
    /// Only an instance that writes its log ([`RocksDbConfig::write_ahead_log`]) can be cut;
    /// [`RocksDbInstance::create_checkpoint`] flushes instead.
    pub fn cut(&self, dir: &Path) -> Result<NativeCheckpoint, StateError> {
        if !self.config.write_ahead_log {
            return Err(StateError::invalid_config(
                "RocksDB write-ahead log",
                false,
                "cut only an instance that writes its log (RocksDbConfig::with_write_ahead_log); \
                 create_checkpoint flushes the memtables instead",
            ));
        }
        let held = self.memory.write_back.as_ref().and_then(|shared| {
            let cut = shared.lock().begin_capture(self.id)?;
            Some(HeldCapture {
                shared: Arc::clone(shared),
                path: self.path().to_path_buf(),
                instance: self.id,
                cut,
                done: false,
            })
        });
        std::fs::create_dir_all(dir).map_err(|source| StateError::io(dir, "creating", source))?;
        let mut files = {
            let _paused = DeletionsPaused::new(self)?;
            // Logs older than this hold nothing the manifest needs (it only grows); RocksDB
            // lists every log on disk when it is not asked to flush.
            let oldest_log = self
                .db
                .property_int_value("rocksdb.min-log-number-to-keep")
                .ok()
                .flatten()
                .unwrap_or(0);
            let mut files = live_files(&self.db).map_err(|source| {
                StateError::io(self.path(), "listing the live files of", source)
            })?;
            files.retain(|file| log_number(&file.name).is_none_or(|number| number >= oldest_log));
            for file in &mut files {
                if let NativeSource::File(from) = &file.source {
                    let link = dir.join(&file.name);
                    std::fs::hard_link(from, &link)
                        .map_err(|source| StateError::io(from, "hard-linking", source))?;
                    file.source = NativeSource::File(link);
                }
            }
            files
        };
        files.sort_by(|a, b| a.name.cmp(&b.name));
        if let Err(error) = self.flush_in_background() {
            tracing::warn!(db = %self.path().display(), %error, "cannot start flushing after a cut");
        }
        tracing::debug!(db = %self.path().display(), files = files.len(), "cut RocksDB instance");
        Ok(NativeCheckpoint {
            dir: dir.to_path_buf(),
            files,
            held,
        })
    }

    /// Copies every entry of `other`'s state column families in `key_groups` into this
    /// instance (creating the column families it lacks), and its states' records of their
    /// types (`canonical.rs`): how a rescaled restore takes its key
    /// groups from an old subtask's checkpoint, opened as an instance of its own, into a fresh
    /// one (the entries go to RocksDB directly, past the write-back cache, which must hold none
    /// of those keys). Returns the number of entries copied.
    pub fn copy_key_groups_from(
        &self,
        other: &RocksDbInstance,
        key_groups: KeyGroupRange,
    ) -> Result<u64, StateError> {
        const BATCH_ENTRIES: usize = 4096;
        self.flush_write_back()?;
        self.copy_records_from(other)?;
        let mut copied = 0;
        for name in other.column_families()? {
            let Some(layout) = name
                .split_once(':')
                .and_then(|(tag, _)| ColumnLayout::from_tag(tag))
            else {
                continue;
            };
            self.ensure_column_family(&name, layout)?;
            let cf = self.column_family(&name)?;
            let mut batch = WriteBatch::default();
            for entry in other.raw_entries(&name, key_groups)? {
                let (key, value) = entry?;
                batch.put_cf(&cf, key, value);
                copied += 1;
                if batch.len() >= BATCH_ENTRIES {
                    self.db
                        .write_opt(std::mem::take(&mut batch), &self.write_options)
                        .map_err(|source| {
                            StateError::rocksdb(self.path(), &name, "restoring key groups", source)
                        })?;
                }
            }
            self.db
                .write_opt(batch, &self.write_options)
                .map_err(|source| {
                    StateError::rocksdb(self.path(), &name, "restoring key groups", source)
                })?;
        }
        Ok(copied)
    }

    /// Compacts every column family down to the last level, running the TTL compaction filter
    /// over all data (RocksDB also compacts on its own; this is for tests and maintenance).
    pub fn compact_all(&self) -> Result<(), StateError> {
        self.flush_write_back()?;
        let mut options = CompactOptions::default();
        options.set_bottommost_level_compaction(BottommostLevelCompaction::Force);
        for name in self.column_families()? {
            if let Some(cf) = self.db.cf_handle(&name) {
                self.db
                    .compact_range_cf_opt(&cf, None::<&[u8]>, None::<&[u8]>, &options);
            }
        }
        Ok(())
    }

    /// RocksDB's own account of its memory.
    pub fn memory_usage(&self) -> RocksDbMemoryUsage {
        let table_readers = self
            .column_families()
            .unwrap_or_default()
            .iter()
            .filter_map(|name| self.db.cf_handle(name))
            .filter_map(|cf| {
                self.db
                    .property_int_value_cf(&cf, "rocksdb.estimate-table-readers-mem")
                    .ok()
                    .flatten()
            })
            .sum();
        RocksDbMemoryUsage {
            table_readers,
            ..self.memory.usage(&self.config)
        }
    }

    /// The raw entries of column family `column_family` in `key_groups`, in key order: for
    /// rescaling (copy them into another instance) and inspection. Keys split with
    /// [`crate::split_key`]; values are frames (see `value.rs`), expired ones included.
    pub fn raw_entries(
        &self,
        column_family: &str,
        key_groups: KeyGroupRange,
    ) -> Result<RawEntries<'_>, StateError> {
        self.flush_write_back()?;
        let cf = self.column_family(column_family)?;
        let (start, end) = key_group_bounds(key_groups);
        let mut options = ReadOptions::default();
        options.set_iterate_lower_bound(start.to_vec());
        options.set_iterate_upper_bound(end.to_vec());
        // The scan crosses key prefixes: no prefix seek (see the module docs).
        options.set_total_order_seek(true);
        let mut iterator = self.db.raw_iterator_cf_opt(&cf, options);
        iterator.seek_to_first();
        Ok(RawEntries {
            iterator,
            slot: self,
            column_family: column_family.to_string(),
            done: false,
        })
    }

    /// Deletes every entry of `column_family` in `key_groups` (one range tombstone), then
    /// flushes the column family so that no later in-place update can land behind the tombstone
    /// (see the module docs). The write-back cache writes back and forgets the column family's
    /// entries first.
    pub fn delete_key_groups(
        &self,
        column_family: &str,
        key_groups: KeyGroupRange,
    ) -> Result<(), StateError> {
        if let Some(mut cache) = self.write_back() {
            cache.flush(&SlotBacking { this: self })?;
            cache.forget_column(self.id, column_family);
        }
        let cf = self.column_family(column_family)?;
        let (start, end) = key_group_bounds(key_groups);
        self.db
            .delete_range_cf_opt(&cf, start, end, &self.write_options)
            .map_err(|source| {
                StateError::rocksdb(self.path(), column_family, "deleting key groups", source)
            })?;
        self.db.flush_cf(&cf).map_err(|source| {
            StateError::rocksdb(
                self.path(),
                column_family,
                "flushing after deleting key groups",
                source,
            )
        })
    }

    /// Creates the column family `name` for values laid out as `layout`, if it is missing.
    pub(crate) fn ensure_column_family(
        &self,
        name: &str,
        layout: ColumnLayout,
    ) -> Result<(), StateError> {
        if self.db.cf_handle(name).is_some() {
            return Ok(());
        }
        let options = column_options(&self.config, &self.memory.cache, &self.clock, Some(layout));
        self.db.create_cf(name, &options).map_err(|source| {
            StateError::rocksdb(self.path(), name, "creating a column family", source)
        })?;
        self.column_names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(name.to_string());
        Ok(())
    }

    /// Writes the entries a cut held ([`RocksDbInstance::cut`]) into RocksDB, if the directory
    /// holds that file (a checkpoint's files copied in), and removes the file.
    fn write_held(&self) -> Result<(), StateError> {
        const BATCH_ENTRIES: usize = 4096;
        let path = self.path().join(HELD_WRITES_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(StateError::io(&path, "reading", source)),
        };
        let mut batch = WriteBatch::default();
        let mut written = 0u64;
        let write = |batch: &mut WriteBatch| {
            self.db
                .write_opt(std::mem::take(batch), &self.write_options)
                .map_err(|source| {
                    StateError::rocksdb(self.path(), "*", "writing held entries", source)
                })
        };
        let result = held::for_each(&bytes, |column, key, value| -> Result<(), StateError> {
            let layout = column
                .split_once(':')
                .and_then(|(tag, _)| ColumnLayout::from_tag(tag))
                .ok_or_else(|| StateError::unknown_state(column))?;
            self.ensure_column_family(column, layout)?;
            let cf = self.column_family(column)?;
            match value {
                Some(value) => batch.put_cf(&cf, key, value),
                None => batch.delete_cf(&cf, key),
            }
            written += 1;
            if batch.len() >= BATCH_ENTRIES {
                write(&mut batch)?;
            }
            Ok(())
        })
        .map_err(|problem| -> StateError {
            StateErrorKind::CorruptSnapshot {
                what: "RocksDB held writes",
                problem: format!("{}: {problem}", path.display()),
            }
            .into()
        })?;
        result?;
        write(&mut batch)?;
        std::fs::remove_file(&path).map_err(|source| StateError::io(&path, "removing", source))?;
        tracing::debug!(db = %self.path().display(), written, "wrote the entries a cut held");
        Ok(())
    }

    /// Starts flushing, on RocksDB's threads and without waiting, the memtable of every column
    /// family that holds writes and has no older memtable still waiting for its flush (a
    /// second one waiting would stall writes): so the next cut finds this one's writes in SST
    /// files, and in the logs only what came since.
    fn flush_in_background(&self) -> Result<(), StateError> {
        let names = self
            .column_names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let property = |cf: &Arc<BoundColumnFamily<'_>>, name: &str| {
            self.db.property_int_value_cf(cf, name).ok().flatten()
        };
        let ready: Vec<Arc<BoundColumnFamily<'_>>> = names
            .iter()
            .filter_map(|name| self.db.cf_handle(name))
            .filter(|cf| {
                property(cf, "rocksdb.num-immutable-mem-table") == Some(0)
                    && property(cf, "rocksdb.num-entries-active-mem-table").unwrap_or(0) > 0
            })
            .collect();
        if ready.is_empty() {
            return Ok(());
        }
        let mut handles: Vec<*mut ffi::rocksdb_column_family_handle_t> =
            ready.iter().map(|cf| cf.inner()).collect();
        // SAFETY: the options are created and destroyed here; the handles belong to the column
        // families `ready` holds for the whole call; the error is the call's own.
        let started = unsafe {
            let options = ffi::rocksdb_flushoptions_create();
            ffi::rocksdb_flushoptions_set_wait(options, 0);
            // Start it even where it will slow writes (L0 crowded): RocksDB's default waits
            // for that to clear first, which would hold the barrier.
            ffi::rocksdb_flushoptions_set_allow_write_stall(options, 1);
            let mut error: *mut std::ffi::c_char = std::ptr::null_mut();
            ffi::rocksdb_flush_cfs(
                self.db.as_raw_ptr(),
                options,
                handles.as_mut_ptr(),
                handles.len() as std::ffi::c_int,
                &mut error,
            );
            ffi::rocksdb_flushoptions_destroy(options);
            take_error(error)
        };
        started.map_err(|source| StateError::io(self.path(), "starting a flush of", source))
    }

    /// The handle of column family `name`.
    pub(crate) fn column_family(
        &self,
        name: &str,
    ) -> Result<Arc<BoundColumnFamily<'_>>, StateError> {
        self.db
            .cf_handle(name)
            .ok_or_else(|| StateError::unknown_state(name))
    }

    /// Writes every dirty entry of the write-back cache to RocksDB (one write batch); they stay
    /// cached. Everything that reads RocksDB directly calls it first.
    ///
    /// The cache is the slot's: the other instances' dirty entries go back to them too.
    pub fn flush_write_back(&self) -> Result<(), StateError> {
        match self.write_back() {
            Some(mut cache) => cache.flush(&SlotBacking { this: self }),
            None => Ok(()),
        }
    }

    /// What the write-back cache has done, if there is one.
    pub fn write_back_stats(&self) -> Option<WriteBackStats> {
        self.write_back().map(|cache| cache.stats())
    }

    /// The slot's write-back cache, locked ([`SharedWriteBack::lock`]).
    fn write_back(&self) -> Option<MutexGuard<'_, WriteBackCache>> {
        self.memory.write_back.as_ref().map(|shared| shared.lock())
    }

    /// The write-back cache, locked, for an access to a column it caches.
    fn cache_of_cached_column(&self) -> MutexGuard<'_, WriteBackCache> {
        self.write_back()
            .expect("a cached column belongs to a slot with a write-back cache")
    }

    /// The write-back cache's id of column family `name`; `None` without a cache.
    pub(crate) fn cached_column(&self, name: &str) -> Option<ColumnId> {
        self.write_back()
            .map(|mut cache| cache.column(self.id, name))
    }

    /// Hands the value of `key` in cached column `column` to `read` (see `cache.rs`), and says
    /// where the entry was found, for the write of a read-modify-write
    /// ([`RocksDbInstance::cached_write_found`]).
    pub(crate) fn cached_read<R>(
        &self,
        column: ColumnId,
        key: &[u8],
        read: impl FnOnce(Option<&[u8]>) -> R,
    ) -> Result<(R, Found), StateError> {
        let mut cache = self.cache_of_cached_column();
        cache.read(&SlotBacking { this: self }, column, key, read)
    }

    /// Prefetches where the write-back cache most likely holds `key` of cached column `column`
    /// (see `cache.rs`).
    pub(crate) fn cached_prefetch(&self, column: ColumnId, key: &[u8]) {
        if let Some(cache) = self.write_back() {
            cache.prefetch(column, key);
        }
    }

    /// Puts (`Some`) or deletes (`None`) the value of `key` in cached column `column`.
    pub(crate) fn cached_write(
        &self,
        column: ColumnId,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), StateError> {
        let mut cache = self.cache_of_cached_column();
        cache.write(&SlotBacking { this: self }, column, key, value)
    }

    /// [`RocksDbInstance::cached_write`] of a key that has never had a value
    /// ([`WriteBackCache::write_new`]).
    pub(crate) fn cached_write_new(
        &self,
        column: ColumnId,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), StateError> {
        let mut cache = self.cache_of_cached_column();
        cache.write_new(&SlotBacking { this: self }, column, key, value)
    }

    /// [`RocksDbInstance::cached_write`] of the key a [`RocksDbInstance::cached_read`]
    /// found `found`.
    pub(crate) fn cached_write_found(
        &self,
        column: ColumnId,
        key: &[u8],
        found: Found,
        value: Option<&[u8]>,
    ) -> Result<(), StateError> {
        let mut cache = self.cache_of_cached_column();
        cache.write_found(&SlotBacking { this: self }, column, key, found, value)
    }

    pub(crate) fn db(&self) -> &Db {
        &self.db
    }

    pub(crate) fn write_options(&self) -> &WriteOptions {
        &self.write_options
    }

    pub(crate) fn read_options(&self) -> &ReadOptions {
        &self.read_options
    }

    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }
}

/// Where the slot's write-back cache reads and writes: each column family in the instance it
/// is cached for (its owner). `this` is the instance calling, which resolves without its
/// registration (an instance being dropped can no longer be upgraded to).
struct SlotBacking<'a> {
    this: &'a RocksDbInstance,
}

impl SlotBacking<'_> {
    /// Instance `id`, which column family `family` is cached for.
    fn resolve(&self, id: u32, family: &str) -> Result<Instance<'_>, StateError> {
        if id == self.this.id {
            return Ok(Instance::This(self.this));
        }
        let gone = || StateError::unknown_state(&format!("{family} (of RocksDB instance {id})"));
        let shared = self.this.memory.write_back.as_ref().ok_or_else(gone)?;
        let other = shared
            .instances
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id as usize)
            .and_then(Weak::upgrade)
            .ok_or_else(gone)?;
        Ok(Instance::Other(other))
    }
}

/// An instance [`SlotBacking`] resolved.
enum Instance<'a> {
    This(&'a RocksDbInstance),
    Other(Arc<RocksDbInstance>),
}

impl std::ops::Deref for Instance<'_> {
    type Target = RocksDbInstance;

    fn deref(&self) -> &RocksDbInstance {
        match self {
            Instance::This(this) => this,
            Instance::Other(other) => other,
        }
    }
}

impl Backing for SlotBacking<'_> {
    fn load(
        &self,
        owner: u32,
        family: &str,
        key: &[u8],
        into: &mut Vec<u8>,
    ) -> Result<bool, StateError> {
        self.resolve(owner, family)?.load(family, key, into)
    }

    /// One write batch per instance, in the order the instances first appear.
    fn write_back(&self, entries: &[WriteBack<'_>]) -> Result<(), StateError> {
        let mut done: Vec<u32> = Vec::new();
        for entry in entries {
            let id = entry.owner;
            if done.contains(&id) {
                continue;
            }
            done.push(id);
            let instance = self.resolve(id, entry.column_family)?;
            let own: Vec<WriteBack<'_>> = entries
                .iter()
                .filter(|entry| entry.owner == id)
                .copied()
                .collect();
            instance.write_entries(&own)?;
        }
        Ok(())
    }
}

impl RocksDbInstance {
    /// The stored value of `key` in column family `column_family`, appended to `into`.
    fn load(
        &self,
        column_family: &str,
        key: &[u8],
        into: &mut Vec<u8>,
    ) -> Result<bool, StateError> {
        let cf = self.column_family(column_family)?;
        let stored = self
            .db
            .get_pinned_cf_opt(&cf, key, &self.read_options)
            .map_err(|source| StateError::rocksdb(self.path(), column_family, "reading", source))?;
        Ok(stored.is_some_and(|value| {
            into.extend_from_slice(&value);
            true
        }))
    }

    /// Writes `entries` of this instance's column families in one write batch.
    fn write_entries(&self, entries: &[WriteBack<'_>]) -> Result<(), StateError> {
        let mut batch = WriteBatch::default();
        let mut handles: Vec<(&str, Arc<BoundColumnFamily<'_>>)> = Vec::new();
        for entry in entries {
            let cf = match handles
                .iter()
                .find(|(name, _)| *name == entry.column_family)
            {
                Some((_, cf)) => cf,
                None => {
                    let cf = self.column_family(entry.column_family)?;
                    handles.push((entry.column_family, cf));
                    &handles[handles.len() - 1].1
                }
            };
            match entry.value {
                Some(value) => batch.put_cf(cf, entry.key, value),
                None => batch.delete_cf(cf, entry.key),
            }
        }
        self.db
            .write_opt(batch, &self.write_options)
            .map_err(|source| {
                StateError::rocksdb(self.path(), "*", "writing back cached state", source)
            })
    }
}

impl Drop for RocksDbInstance {
    /// Writes the write-back cache back, so that the database on disk is whole when it closes.
    fn drop(&mut self) {
        if let Err(error) = self.flush_write_back() {
            tracing::warn!(%error, db = %self.path().display(), "cannot write cached state back to RocksDB");
        }
    }
}

impl std::fmt::Debug for RocksDbInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksDbInstance")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What RocksDB's C API reported through a call's error pointer: `Ok` for null, else its
/// message as an I/O error, the string freed.
///
/// # Safety
///
/// `error` is null or a string the C API allocated for the caller and nobody freed yet.
unsafe fn take_error(error: *mut std::ffi::c_char) -> Result<(), std::io::Error> {
    if error.is_null() {
        return Ok(());
    }
    // SAFETY: the caller's promise: a NUL-terminated string of RocksDB's, not yet freed.
    let message = unsafe { std::ffi::CStr::from_ptr(error) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: the same string, copied above and freed once, here, with RocksDB's allocator.
    unsafe { ffi::rocksdb_free(error.cast::<std::ffi::c_void>()) };
    Err(std::io::Error::other(message))
}

/// The number of write-ahead log `name` (`000012.log`), if it is one.
fn log_number(name: &str) -> Option<u64> {
    name.strip_suffix(".log")?.parse().ok()
}

/// RocksDB's live files as they are now, without a flush (`GetLiveFilesStorageInfo` with no
/// log size that would ask for one): each with the length that belongs to this moment.
fn live_files(db: &Db) -> Result<Vec<NativeFile>, std::io::Error> {
    use std::ffi::{c_char, CStr};

    let text = |pointer: *const c_char| {
        // SAFETY: RocksDB hands out NUL-terminated strings that live as long as the info.
        unsafe { CStr::from_ptr(pointer) }
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: the options and the info are created, read within their bounds and destroyed
    // here; `db` outlives the call; the error is the call's own.
    unsafe {
        let options = ffi::rocksdb_livefiles_storage_info_options_create();
        ffi::rocksdb_livefiles_storage_info_options_set_wal_size_for_flush(options, u64::MAX);
        let mut error: *mut c_char = std::ptr::null_mut();
        let info = ffi::rocksdb_get_livefiles_storage_info(db.as_raw_ptr(), options, &mut error);
        ffi::rocksdb_livefiles_storage_info_options_destroy(options);
        take_error(error)?;
        let count = ffi::rocksdb_livefiles_storage_info_count(info);
        let mut files = Vec::with_capacity(count);
        for index in 0..count {
            let name = text(ffi::rocksdb_livefiles_storage_info_relative_filename(
                info, index,
            ));
            let name = name.trim_start_matches('/').to_string();
            let len = ffi::rocksdb_livefiles_storage_info_size(info, index);
            let mut size = 0;
            let contents =
                ffi::rocksdb_livefiles_storage_info_replacement_contents(info, index, &mut size);
            let source = if size > 0 {
                NativeSource::Bytes(
                    std::slice::from_raw_parts(contents.cast::<u8>(), size).to_vec(),
                )
            } else {
                let dir = text(ffi::rocksdb_livefiles_storage_info_directory(info, index));
                NativeSource::File(Path::new(&dir).join(&name))
            };
            files.push(NativeFile { name, len, source });
        }
        ffi::rocksdb_livefiles_storage_info_destroy(info);
        Ok(files)
    }
}

/// Options of a column family (and, with `layout = None`, of the database and its default
/// column family): the shared block cache, lz4, Bloom filters for point reads, in-place memtable
/// updates; for states also the hash memtable by `(key, namespace)` prefix (see the module
/// docs), the TTL compaction filter, and for lists the append merge operator.
fn column_options(
    config: &RocksDbConfig,
    cache: &Cache,
    clock: &Arc<dyn Clock>,
    layout: Option<ColumnLayout>,
) -> Options {
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(cache);
    table.set_cache_index_and_filter_blocks(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    table.set_bloom_filter(10.0, false);
    table.set_format_version(5);

    let mut options = Options::default();
    options.set_block_based_table_factory(&table);
    options.set_compression_type(DBCompressionType::Lz4);
    options.set_write_buffer_size(config.column_write_buffer());
    options.set_level_compaction_dynamic_level_bytes(true);
    // One writer per slot (its shard): update values in place in the memtable (see the module
    // docs), which RocksDB allows only without concurrent memtable writes (a database option,
    // set here for the database and its default column family).
    options.set_inplace_update_support(true);
    options.set_allow_concurrent_memtable_write(false);
    if let Some(layout) = layout {
        options.set_prefix_extractor(SliceTransform::create(
            "weir.state-key-prefix",
            state_prefix,
            Some(has_state_prefix),
        ));
        options.set_memtable_factory(MemtableFactory::HashLinkList {
            bucket_count: MEMTABLE_BUCKETS,
        });
        options.set_compaction_filter_factory(TtlFilterFactory {
            layout,
            clock: Arc::clone(clock),
        });
        if layout == ColumnLayout::List {
            options.set_merge_operator_associative("weir-list-append", list_append);
        }
    }
    options
}

/// Raw entries of one column family in a key-group range ([`RocksDbInstance::raw_entries`]).
pub struct RawEntries<'a> {
    iterator: DBRawIteratorWithThreadMode<'a, Db>,
    slot: &'a RocksDbInstance,
    column_family: String,
    done: bool,
}

impl Iterator for RawEntries<'_> {
    type Item = Result<(Box<[u8]>, Box<[u8]>), StateError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if !self.iterator.valid() {
            self.done = true;
            return match self.iterator.status() {
                Ok(()) => None,
                Err(source) => Some(Err(StateError::rocksdb(
                    self.slot.path(),
                    &self.column_family,
                    "iterating key groups",
                    source,
                ))),
            };
        }
        let item = self
            .iterator
            .item()
            .map(|(key, value)| (Box::from(key), Box::from(value)));
        self.iterator.next();
        item.map(Ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ttl::ManualClock;
    use crate::{KeyedBackendConfig, LocalKeyedBackend, ValueStateDescriptor};

    /// Two instances of one slot share its write-back cache: what one's writes evict goes back
    /// to the instance each entry belongs to, and an instance's checkpoint holds all of its
    /// own values (written back first) and none of the other's.
    #[test]
    fn instances_of_a_slot_share_its_write_back_cache() {
        let dir = tempfile::tempdir().unwrap();
        let config = RocksDbConfig::new(dir.path(), 8 << 20, 4 << 20).with_write_back(64 << 10);
        let slot = RocksDbSlot::new(config, Arc::new(ManualClock::new(0))).unwrap();
        let descriptor = ValueStateDescriptor::<u64>::new("v");
        let (a, b) = (
            slot.open_instance("a").unwrap(),
            slot.open_instance("b").unwrap(),
        );
        let backends: Vec<LocalKeyedBackend<u64>> = [&a, &b]
            .into_iter()
            .map(|instance| {
                let config = KeyedBackendConfig::single(8);
                LocalKeyedBackend::rocksdb(config, Arc::clone(instance), "op").unwrap()
            })
            .collect();
        // More entries than the cache holds, interleaved between the two instances.
        for key in 0..5_000u64 {
            for (i, backend) in backends.iter().enumerate() {
                backend.set_current_key(&key).unwrap();
                let value = backend.value_state(&descriptor).unwrap();
                value.update(key * 10 + i as u64).unwrap();
            }
        }
        assert!(
            a.write_back_stats().unwrap().evicted > 0,
            "the cache evicted"
        );
        for (i, backend) in backends.iter().enumerate() {
            let value = backend.value_state(&descriptor).unwrap();
            for key in 0..5_000u64 {
                backend.set_current_key(&key).unwrap();
                assert_eq!(
                    value.value().unwrap(),
                    Some(key * 10 + i as u64),
                    "{i}: {key}"
                );
            }
        }
        let checkpoint = dir.path().join("a.checkpoint");
        a.create_checkpoint(&checkpoint).unwrap();
        let restored = RocksDbInstance::open(
            RocksDbConfig::new(&checkpoint, 8 << 20, 4 << 20),
            Arc::new(ManualClock::new(0)),
        )
        .unwrap();
        let backend: LocalKeyedBackend<u64> =
            LocalKeyedBackend::rocksdb(KeyedBackendConfig::single(8), restored, "op").unwrap();
        let value = backend.value_state(&descriptor).unwrap();
        for key in 0..5_000u64 {
            backend.set_current_key(&key).unwrap();
            assert_eq!(value.value().unwrap(), Some(key * 10), "a's {key}");
        }
    }

    /// A value written in place after its key group was deleted is visible (the range
    /// tombstone does not hide it), and so is one written to a key never seen before.
    #[test]
    fn writes_after_deleting_key_groups_are_visible() {
        let dir = tempfile::tempdir().unwrap();
        let slot = RocksDbInstance::open(
            RocksDbConfig::new(dir.path(), 8 << 20, 4 << 20),
            Arc::new(ManualClock::new(0)),
        )
        .unwrap();
        let backend: LocalKeyedBackend<u64> =
            LocalKeyedBackend::rocksdb(KeyedBackendConfig::single(8), slot, "op").unwrap();
        let value = backend
            .value_state(&ValueStateDescriptor::<u64>::new("v"))
            .unwrap();
        for round in 1..=3u64 {
            for key in 0..20u64 {
                backend.set_current_key(&key).unwrap();
                value.update(key * 10 + round).unwrap();
                value.update(key * 100 + round).unwrap();
            }
            backend.delete_key_groups(backend.key_groups()).unwrap();
            for key in 0..20u64 {
                backend.set_current_key(&key).unwrap();
                assert_eq!(value.value().unwrap(), None, "key {key}, round {round}");
                value.update(key + round).unwrap();
                assert_eq!(value.value().unwrap(), Some(key + round), "key {key}");
            }
        }
    }
}
