//! Keyed state in a running job.
//!
//! A keyed `process` function declares its state with descriptors (Flink's API, from
//! `weir-state`) and reaches it through its context, scoped to the current key:
//!
//! ```
//! use weir_engine::prelude::*;
//!
//! /// Emits each key's running count.
//! #[derive(Clone)]
//! struct Count {
//!     count: ValueStateDescriptor<u64>,
//! }
//!
//! impl KeyedProcessFunction<String, String, (String, u64)> for Count {
//!     fn process_element(&mut self, word: String, ctx: &mut KeyedProcessContext<'_, String, (String, u64)>) {
//!         let count = ctx.value_state(&self.count);
//!         let next = count.value().expect("read count").unwrap_or(0) + 1;
//!         count.update(next).expect("write count");
//!         ctx.emit((word, next));
//!     }
//! }
//! # let _ = Count { count: ValueStateDescriptor::new("count") };
//! ```
//!
//! The function holds descriptors, not handles: functions are cloned to every subtask (so they
//! are `Send`), while handles belong to one shard. The context hands out a handle per call from
//! a small cache (a name comparison per registered state, no hashing); the first call with a
//! descriptor registers it, and a second descriptor with the same name but another type fails
//! the job with both types named.
//!
//! `state.backend.type` picks the storage: typed maps on the heap (`hashmap`, the default) or
//! RocksDB (`rocksdb`): one instance per keyed operator subtask, in its slot's memory, sized
//! from the slot's managed memory. Each keyed
//! operator subtask gets a [`weir_state::LocalKeyedBackend`] over its key groups. A shard's
//! heap use is checked against its slot's heap share ([`check_shard_heap`]); the job fails
//! naming the slot, the largest state and its operator when it is exceeded.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use weir_memory::{HeapBudgetExceeded, HeapStateSize, RocksDbBudget};
use weir_state::{KeyedBackendConfig, LocalKeyedBackend, RocksDbConfig, RocksDbSlot, SystemClock};

pub use weir_state::{BroadcastState, OperatorListState, OperatorStateStore};

pub use weir_state::{
    AggregatingState, AggregatingStateDescriptor, BackendType, ListState, ListStateDescriptor,
    MapEntries, MapState, MapStateDescriptor, ReducingState, ReducingStateDescriptor, StateError,
    StateErrorKind, StateTtlConfig, StateValue, StateVisibility, TtlUpdateType, ValueState,
    ValueStateDescriptor,
};

use crate::checkpoint::native::NativeState;
use crate::checkpoint::task_state::{OperatorSnapshot, RestoredParts, Whole, PART_KEYED};
use crate::error::JobError;
use crate::operator::RuntimeContext;
use crate::record::Key;

/// What a subtask needs to build its keyed state backend.
#[derive(Clone, Debug)]
pub(crate) struct StateEnv {
    pub(crate) backend: BackendType,
    /// The slot's RocksDB, where each keyed operator subtask opens its instance
    /// (`state.backend.type: rocksdb`).
    pub(crate) rocksdb: Option<Arc<RocksDbSlot>>,
    /// Whether checkpoints list what earlier ones wrote instead of writing it again: RocksDB's
    /// files, windows' unchanged keys (`execution.checkpointing.incremental`).
    pub(crate) incremental: bool,
    /// Whether the job takes checkpoints.
    pub(crate) checkpointed: bool,
    /// Names the operator's column families: its uid, else its node id.
    pub(crate) operator_id: Arc<str>,
}

impl Default for StateEnv {
    fn default() -> Self {
        StateEnv {
            backend: BackendType::Heap,
            rocksdb: None,
            incremental: true,
            checkpointed: false,
            operator_id: "operator".into(),
        }
    }
}

/// The slots' RocksDB of one job, in a directory removed when the job ends.
///
/// The directory, `<localdir>/weir-<pid>-<n>`, holds an `owner.lock` its process keeps
/// `flock`ed; a process killed before removing its directory leaves the lock free, and the
/// next job to open RocksDB under the same local directory removes what was left
/// ([`remove_abandoned`]), as Flink's task managers clear their local working directories.
pub(crate) struct JobRocksDb {
    dir: PathBuf,
    pub(crate) slots: Vec<Arc<RocksDbSlot>>,
    /// Holds the directory's `flock` while the job runs.
    _owner: std::fs::File,
}

/// The file in a job's RocksDB directory whose `flock` says that its process is alive.
const OWNER_LOCK: &str = "owner.lock";

impl JobRocksDb {
    /// Prepares `slots` RocksDB slots under `local_dir`, each with the slot's RocksDB budget;
    /// a checkpointed job's instances write RocksDB's log, so that a checkpoint cuts them
    /// without flushing their memtables (`RocksDbInstance::cut`).
    pub(crate) fn open(
        local_dir: &Path,
        slots: usize,
        budget: RocksDbBudget,
        checkpointed: bool,
    ) -> Result<JobRocksDb, JobError> {
        static JOBS: AtomicU64 = AtomicU64::new(0);
        let (dir, owner) = {
            // One job of this process at a time between the sweep and its lock, so that the
            // sweep never takes another job's directory for an abandoned one.
            static OPENING: Mutex<()> = Mutex::new(());
            let _opening = OPENING.lock().unwrap_or_else(PoisonError::into_inner);
            remove_abandoned(local_dir);
            fresh_dir(local_dir, || JOBS.fetch_add(1, Ordering::Relaxed))
        }
        .map_err(|(path, error)| {
            JobError::InvalidJob(format!(
                "cannot create {}: {error}; check state.backend.rocksdb.localdir ({}): it must \
                 be a writable local directory",
                path.display(),
                local_dir.display()
            ))
        })?;
        let mut job = JobRocksDb {
            dir,
            slots: Vec::with_capacity(slots),
            _owner: owner,
        };
        for slot in 0..slots {
            let config = RocksDbConfig::from_budget(job.dir.join(format!("slot-{slot}")), &budget)
                .with_write_ahead_log(checkpointed);
            let db = RocksDbSlot::new(config, Arc::new(SystemClock)).map_err(|error| {
                JobError::InvalidJob(format!(
                    "cannot open the RocksDB state backend of slot {slot}: {error}; check \
                     state.backend.rocksdb.localdir ({}) and the slot's managed memory \
                     (taskmanager.memory.process.size, taskmanager.memory.managed.fraction)",
                    local_dir.display()
                ))
            })?;
            job.slots.push(Arc::new(db));
        }
        Ok(job)
    }
}

impl Drop for JobRocksDb {
    fn drop(&mut self) {
        // The instances close when their last handle goes; the job's operators are gone by now.
        self.slots.clear();
        if let Err(error) = std::fs::remove_dir_all(&self.dir) {
            if error.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.dir.display(), %error, "cannot remove RocksDB working files");
            }
        }
    }
}

/// A new job directory `weir-<pid>-<n>` under `local_dir`, with `n` from `next`, and its
/// `owner.lock` held. The directory is made as `.weir-<pid>-<n>.new`, its lock created and
/// taken there, and only then renamed into place, so that no one (a sweep of another process,
/// perhaps in another PID namespace with this pid) ever sees a job directory without its lock
/// held. The name must not exist yet: one of an earlier process with this pid (pids come
/// round, and a container's start the same) may still be there, and RocksDB would open its
/// instances with their old state. An existing name, or a staging directory a sweep took
/// meanwhile, is passed over for the next `n`.
fn fresh_dir(
    local_dir: &Path,
    mut next: impl FnMut() -> u64,
) -> Result<(PathBuf, std::fs::File), (PathBuf, std::io::Error)> {
    use std::io::ErrorKind::{AlreadyExists, NotFound};
    std::fs::create_dir_all(local_dir).map_err(|error| (local_dir.to_path_buf(), error))?;
    loop {
        let name = format!("weir-{}-{}", std::process::id(), next());
        let staging = local_dir.join(format!(".{name}{STAGING_SUFFIX}"));
        match std::fs::create_dir(&staging) {
            Ok(()) => {}
            Err(error) if error.kind() == AlreadyExists => continue,
            Err(error) => return Err((staging, error)),
        }
        let lock_path = staging.join(OWNER_LOCK);
        let owner = match std::fs::File::create(&lock_path) {
            Ok(owner) => owner,
            Err(error) if error.kind() == NotFound => continue,
            Err(error) => return Err((lock_path, error)),
        };
        match weir_state::lock::try_lock_exclusive(&owner) {
            Ok(true) => {}
            // A sweep holds it, and removes the staging directory.
            Ok(false) => continue,
            Err(error) => return Err((lock_path, error)),
        }
        let dir = local_dir.join(&name);
        match rename_no_replace(&staging, &dir) {
            Ok(()) => return Ok((dir, owner)),
            // A sweep removed the staging directory before the lock was taken.
            Err(error) if error.kind() == NotFound => continue,
            Err(error) if error.kind() == AlreadyExists => {
                drop(owner);
                if let Err(error) = std::fs::remove_dir_all(&staging) {
                    tracing::warn!(dir = %staging.display(), %error, "cannot remove a staging directory");
                }
            }
            Err(error) => return Err((dir, error)),
        }
    }
}

/// What ends the name of a job directory that is being made (`.weir-<pid>-<n>.new`).
const STAGING_SUFFIX: &str = ".new";

/// Renames `from` to `to`, failing with `AlreadyExists` where `to` exists (where `rename`
/// would replace an empty directory).
fn rename_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = |path: &Path| {
        std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidInput, error))
    };
    let (from, to) = (c_path(from)?, c_path(to)?);
    // SAFETY: both are NUL-terminated paths that live for the duration of the call.
    let renamed = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if renamed == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Removes the RocksDB directories under `local_dir` that a process left behind when it was
/// killed: those named `weir-<pid>-<n>` (or `.weir-<pid>-<n>.new`, killed while making it)
/// whose `owner.lock` no one holds, after a process that is gone — or after this one's pid,
/// which an earlier process had (this process holds the lock of each of its own; its caller
/// keeps its other jobs from opening meanwhile). A directory of another running process is
/// never touched, nor one whose lock is held (its owner may run in another PID namespace, and
/// a staging directory taken from such an owner before its lock only makes it try the next
/// name). What cannot be removed is logged and left; the job starts either way.
fn remove_abandoned(local_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(local_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(job_dir_pid) else {
            continue;
        };
        let dir = entry.path();
        let elsewhere = pid != std::process::id() && process_alive(pid);
        if elsewhere || !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            continue;
        }
        let lock_free = match std::fs::File::open(dir.join(OWNER_LOCK)) {
            Ok(lock) => weir_state::lock::try_lock_exclusive(&lock).unwrap_or(false),
            Err(error) => error.kind() == std::io::ErrorKind::NotFound,
        };
        if !lock_free {
            continue;
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => tracing::info!(
                dir = %dir.display(),
                pid,
                "removed the RocksDB working files of a process that ended without removing them"
            ),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => tracing::warn!(
                dir = %dir.display(),
                %error,
                "cannot remove the RocksDB working files of a process that ended"
            ),
        }
    }
}

/// The pid in a job's RocksDB directory name, `weir-<pid>-<n>`, or in the name of one being
/// made (`.weir-<pid>-<n>.new`, see [`fresh_dir`]).
fn job_dir_pid(name: &str) -> Option<u32> {
    let name = match name.strip_prefix('.') {
        Some(staging) => staging.strip_suffix(STAGING_SUFFIX)?,
        None => name,
    };
    let (pid, job) = name.strip_prefix("weir-")?.split_once('-')?;
    job.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// Whether a process with this pid exists (one this process may not signal exists too).
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 sends nothing; it only asks whether the process exists.
    let signalled = unsafe { libc::kill(pid, 0) } == 0;
    signalled || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A registered state's handle, type-erased, with the state's name and the id of the
/// descriptor that last asked for it.
struct CachedHandle {
    descriptor: u64,
    name: Box<str>,
    handle: Box<dyn Any>,
}

/// A keyed operator subtask's state: its backend and the handles its function asked for.
pub(crate) struct KeyedStateStore<K> {
    backend: LocalKeyedBackend<K>,
    /// Handles by descriptor id, in the order they were first asked for.
    handles: RefCell<Vec<CachedHandle>>,
    /// Whether the backend's current key is the key of the call in progress.
    key_set: Cell<bool>,
    operator: Arc<str>,
    subtask: usize,
    parallelism: usize,
    /// The RocksDB instance's checkpoints, when state lives there.
    native: Option<NativeState>,
}

/// A keyed operator subtask's backend (namespace `N`) on the job's state backend, over its
/// key groups, with its RocksDB instance (restored from the checkpoint the job resumes from)
/// when state lives there; a heap checkpoint is restored by the caller
/// (`LocalKeyedBackend::restore`). A checkpoint of the other backend never gets here: the job
/// is refused at its start (`runtime::deploy`).
pub(crate) fn open_keyed_backend<K: Key, N: weir_state::StateKey + weir_state::StateCodec>(
    ctx: &RuntimeContext,
) -> Result<(LocalKeyedBackend<K, N>, Option<NativeState>), StateError> {
    let config = KeyedBackendConfig::for_subtask(
        ctx.max_parallelism as u32,
        ctx.parallelism as u32,
        ctx.subtask as u32,
    );
    match &ctx.state.rocksdb {
        Some(slot) if ctx.state.backend == BackendType::RocksDb => {
            let native = NativeState::open(ctx, slot)?;
            let backend = LocalKeyedBackend::rocksdb(
                config,
                Arc::clone(native.instance()),
                &ctx.state.operator_id,
            )?;
            Ok((backend, Some(native)))
        }
        _ => Ok((
            LocalKeyedBackend::heap(config, Arc::new(SystemClock))?,
            None,
        )),
    }
}

impl<K: Key> KeyedStateStore<K> {
    /// The backend of subtask `ctx.subtask`: its key groups, on the job's state backend. Lives
    /// in an `Rc` so the shard's heap check can find it.
    pub(crate) fn open(ctx: &RuntimeContext) -> Result<Rc<Self>, StateError> {
        let (backend, native) = open_keyed_backend(ctx)?;
        // Canonical keyed snapshots (any heap checkpoint, any savepoint), on either backend; a
        // RocksDB checkpoint's files were restored with the instance.
        ctx.with_restored_of_all(PART_KEYED, |parts| {
            if parts.is_empty() {
                Ok(())
            } else {
                backend.restore_shared(parts).map(drop)
            }
        })?;
        let store = Rc::new(KeyedStateStore {
            backend,
            handles: RefCell::new(Vec::new()),
            key_set: Cell::new(false),
            operator: Arc::clone(&ctx.operator_name),
            subtask: ctx.subtask,
            parallelism: ctx.parallelism,
            native,
        });
        if store.backend.backend_type() == BackendType::Heap {
            let weak: Weak<dyn HeapStates> = Rc::downgrade(&store) as Weak<dyn HeapStates>;
            SHARD_HEAP_STATES.with(|states| states.borrow_mut().push(weak));
        }
        Ok(store)
    }

    /// Adds the keyed state to `snapshot`: on the heap a copy-on-write snapshot taken now (a
    /// pointer per key group and state), encoded by the checkpoint writer after the barrier;
    /// on RocksDB the instance's native checkpoint, uploaded by the writer — or, for a
    /// savepoint, read out by the writer as a canonical snapshot (restorable on either
    /// backend).
    pub(crate) fn snapshot_into(&self, snapshot: &mut OperatorSnapshot) -> Result<(), String> {
        match &self.native {
            Some(native) if snapshot.is_savepoint() => {
                let export = native
                    .canonical_export(weir_state::SnapshotShape {
                        max_parallelism: self.backend.max_parallelism(),
                        key_groups: self.backend.key_groups(),
                        key_type: std::any::type_name::<K>(),
                        namespace_type: std::any::type_name::<()>(),
                    })
                    .map_err(|e| e.to_string())?;
                snapshot.add_deferred(
                    PART_KEYED,
                    Whole::part(move |out: &mut Vec<u8>| export.write(out)),
                );
                return Ok(());
            }
            Some(native) => return native.snapshot(snapshot).map_err(|e| e.to_string()),
            None => {}
        }
        let heap = self
            .backend
            .heap_snapshot()
            .ok_or("internal error: keyed state neither on the heap nor in RocksDB")?;
        snapshot.add_deferred(
            PART_KEYED,
            Box::new(weir_state::KeyedSnapshotEncoder::new(heap).releasing()),
        );
        Ok(())
    }

    /// A new call begins (a record or a timer, maybe for another key).
    #[inline]
    pub(crate) fn next_call(&self) {
        self.key_set.set(false);
    }

    /// The handle of the state `name` that the descriptor with id `descriptor` declares,
    /// registered by `register` on first use. Found by the descriptor's id (no name compared
    /// per call); a descriptor not seen before (another one of the same name, or a function
    /// that makes its descriptors per call) is found by name and takes the entry over, so the
    /// cache holds one entry per state. Makes `key` the backend's current key if this call has
    /// not yet.
    pub(crate) fn handle<H: Clone + 'static>(
        &self,
        key: &K,
        descriptor: u64,
        name: &str,
        register: impl FnOnce(&LocalKeyedBackend<K>) -> Result<H, StateError>,
    ) -> H {
        if !self.key_set.get() {
            self.backend
                .set_current_key(key)
                .unwrap_or_else(|error| panic!("keyed state: {error}"));
            self.key_set.set(true);
        }
        let mut handles = self.handles.borrow_mut();
        if let Some(handle) = handles
            .iter()
            .find(|cached| cached.descriptor == descriptor)
            .and_then(|cached| cached.handle.downcast_ref::<H>())
        {
            return handle.clone();
        }
        if let Some(cached) = handles.iter_mut().find(|cached| *cached.name == *name) {
            if let Some(handle) = cached.handle.downcast_ref::<H>() {
                cached.descriptor = descriptor;
                return handle.clone();
            }
        }
        // Not cached, or cached with another type: registering reports the conflict.
        let handle = register(&self.backend).unwrap_or_else(|error| panic!("keyed state: {error}"));
        handles.push(CachedHandle {
            descriptor,
            name: name.into(),
            handle: Box::new(handle.clone()),
        });
        handle
    }
}

/// What the shard's heap check asks of a heap backend: its largest state, and which subtask
/// of how many holds it.
trait HeapStates {
    fn largest(&self) -> Option<(HeapStateSize, usize, usize)>;
}

impl<K: Key> HeapStates for KeyedStateStore<K> {
    fn largest(&self) -> Option<(HeapStateSize, usize, usize)> {
        let size = self.backend.state_sizes().into_iter().next()?;
        let state = HeapStateSize {
            operator: self.operator.to_string(),
            state: size.name,
            bytes: size.estimated_bytes,
        };
        Some((state, self.subtask, self.parallelism))
    }
}

/// A shard outgrew its heap share.
#[derive(Debug)]
pub(crate) struct HeapExceeded {
    pub(crate) error: HeapBudgetExceeded,
    /// The subtask and parallelism of the operator whose state is the largest, if any.
    pub(crate) holder: Option<(usize, usize)>,
}

thread_local! {
    /// The heap backends of the job running on this shard.
    static SHARD_HEAP_STATES: RefCell<Vec<Weak<dyn HeapStates>>> = const { RefCell::new(Vec::new()) };
}

/// Checks this shard's heap use (as the counting allocator reports it) against its slot's
/// share; the error names the largest heap state. Always passes where no counting allocator
/// is installed (nothing to measure).
pub(crate) fn check_shard_heap(slot: usize, heap_share: u64) -> Result<(), HeapExceeded> {
    if !weir_memory::is_counting() {
        return Ok(());
    }
    let mut holder = None;
    weir_memory::check_heap_budget(
        slot,
        heap_share,
        weir_memory::current_thread_net_bytes(),
        || {
            let (state, subtask, parallelism) = SHARD_HEAP_STATES.with(|states| {
                states
                    .borrow()
                    .iter()
                    .filter_map(Weak::upgrade)
                    .filter_map(|store| store.largest())
                    .max_by_key(|(size, _, _)| size.bytes)
            })?;
            holder = Some((subtask, parallelism));
            Some(state)
        },
    )
    .map_err(|error| HeapExceeded { error, holder })
}

/// Names one operator subtask's operator state. The store itself lives on the subtask's shard
/// (it is `!Send`), so that the `RuntimeContext` holding the name stays `Send` and functions
/// may keep it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct OperatorStateId(u64);

impl OperatorStateId {
    /// A name never given before in this process.
    pub(crate) fn fresh() -> OperatorStateId {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        OperatorStateId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The store, created on first use on this thread.
    pub(crate) fn store(self) -> Rc<OperatorStateStore> {
        SHARD_OPERATOR_STATES.with(|stores| Rc::clone(stores.borrow_mut().entry(self).or_default()))
    }

    /// The store if it was used on this thread.
    pub(crate) fn existing(self) -> Option<Rc<OperatorStateStore>> {
        SHARD_OPERATOR_STATES.with(|stores| stores.borrow().get(&self).cloned())
    }

    /// Makes the store of this id subtask `subtask` of `parallelism`'s share of the restored
    /// operator state (every old subtask's `OperatorStateSnapshot`, redistributed by Flink's
    /// rules: split lists stay with their subtask at an unchanged parallelism and are shared
    /// out at another; every subtask gets all of a union list; broadcast state is copied).
    pub(crate) fn restore(
        self,
        restored: &RestoredParts<'_>,
        subtask: usize,
        parallelism: usize,
    ) -> Result<(), StateError> {
        // One snapshot per old subtask, in subtask order (empty where one wrote none).
        let mut old = vec![weir_state::OperatorStateSnapshot::default(); restored.old_parallelism];
        for &(old_subtask, bytes) in &restored.parts {
            if let Some(slot) = old.get_mut(old_subtask) {
                *slot = weir_state::OperatorStateSnapshot::from_bytes(bytes)?;
            }
        }
        let store = OperatorStateStore::restore(&old, subtask as u32, parallelism as u32)?;
        SHARD_OPERATOR_STATES.with(|stores| stores.borrow_mut().insert(self, Rc::new(store)));
        Ok(())
    }
}

thread_local! {
    /// The operator state of the subtasks running on this shard.
    static SHARD_OPERATOR_STATES: RefCell<HashMap<OperatorStateId, Rc<OperatorStateStore>>> =
        RefCell::default();
}

/// Forgets this shard's state (the job on it ended or begins).
pub(crate) fn clear_shard_states() {
    crate::checkpoint::task_state::clear_shard_task_states();
    SHARD_HEAP_STATES.with(|states| states.borrow_mut().clear());
    SHARD_OPERATOR_STATES.with(|stores| stores.borrow_mut().clear());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pid no process has: a child that has been waited for.
    fn ended_pid() -> u32 {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        child.wait().expect("wait for true");
        pid
    }

    fn job_dir(local: &Path, pid: u32, job: u64) -> PathBuf {
        let dir = local.join(format!("weir-{pid}-{job}"));
        std::fs::create_dir_all(dir.join("slot-0")).expect("create a job directory");
        std::fs::write(dir.join("slot-0").join("000004.log"), b"data").expect("write a file");
        dir
    }

    #[test]
    fn only_the_directories_of_ended_processes_that_no_one_locks_are_removed() {
        let local = tempfile::tempdir().expect("a temporary directory");
        let ended = ended_pid();
        let killed = job_dir(local.path(), ended, 0);
        std::fs::File::create(killed.join(OWNER_LOCK)).expect("create a lock file");
        let without_lock = job_dir(local.path(), ended, 1);
        let locked = job_dir(local.path(), ended, 2);
        let held = std::fs::File::create(locked.join(OWNER_LOCK)).expect("create a lock file");
        assert!(weir_state::lock::try_lock_exclusive(&held).expect("lock"));
        let running = job_dir(local.path(), 1, 3);
        let earlier = job_dir(local.path(), std::process::id(), 5);
        let own = job_dir(local.path(), std::process::id(), 6);
        let own_lock = std::fs::File::create(own.join(OWNER_LOCK)).expect("create a lock file");
        assert!(weir_state::lock::try_lock_exclusive(&own_lock).expect("lock"));
        let unrelated = local.path().join(format!("weir-{ended}-x"));
        std::fs::create_dir(&unrelated).expect("create a directory");
        let not_a_directory = local.path().join(format!("weir-{ended}-4"));
        std::fs::write(&not_a_directory, b"").expect("write a file");
        let staged = local.path().join(format!(".weir-{ended}-7.new"));
        std::fs::create_dir(&staged).expect("create a staging directory");
        std::fs::File::create(staged.join(OWNER_LOCK)).expect("create a lock file");
        let staged_without_lock = local.path().join(format!(".weir-{ended}-8.new"));
        std::fs::create_dir(&staged_without_lock).expect("create a staging directory");
        let staged_running = local.path().join(".weir-1-9.new");
        std::fs::create_dir(&staged_running).expect("create a staging directory");

        remove_abandoned(local.path());

        assert!(!killed.exists(), "a killed process's directory is removed");
        assert!(
            !without_lock.exists(),
            "one without a lock file (an older build's) too"
        );
        assert!(locked.exists(), "a directory whose lock is held is kept");
        assert!(running.exists(), "a running process's directory is kept");
        assert!(
            !earlier.exists(),
            "one of an earlier process with this pid is removed"
        );
        assert!(own.exists(), "one of this process's jobs is kept");
        assert!(
            unrelated.exists() && not_a_directory.exists(),
            "other names are left alone"
        );
        assert!(
            !staged.exists() && !staged_without_lock.exists(),
            "one a killed process was making is removed, with or without its lock file"
        );
        assert!(
            staged_running.exists(),
            "one a running process is making is kept"
        );
    }

    #[test]
    fn a_new_job_directory_is_never_one_that_exists() {
        let local = tempfile::tempdir().expect("a temporary directory");
        let pid = std::process::id();
        let stale = job_dir(local.path(), pid, 0);
        let empty = local.path().join(format!("weir-{pid}-1"));
        std::fs::create_dir(&empty).expect("create an empty job directory");
        let staging = local.path().join(format!(".weir-{pid}-2.new"));
        std::fs::create_dir(&staging).expect("create a staging directory");
        let mut numbers = 0..;
        let (dir, owner) = fresh_dir(local.path(), || numbers.next().expect("a number"))
            .expect("a fresh directory");
        assert_eq!(dir, local.path().join(format!("weir-{pid}-3")));
        assert!(
            stale.join("slot-0").exists(),
            "the existing one is left as it was"
        );
        assert!(
            std::fs::read_dir(&empty).expect("read it").next().is_none(),
            "an empty one is not replaced"
        );
        assert!(staging.exists(), "another's staging directory is left");
        let names: Vec<_> = std::fs::read_dir(local.path())
            .expect("read the local directory")
            .map(|entry| entry.expect("an entry").file_name())
            .collect();
        assert_eq!(
            names.len(),
            4,
            "no staging directory of its own is left: {names:?}"
        );
        let lock = std::fs::File::open(dir.join(OWNER_LOCK)).expect("the owner lock");
        assert!(
            !weir_state::lock::try_lock_exclusive(&lock).expect("try the lock"),
            "the new directory's lock is held"
        );
        drop(owner);
        assert!(weir_state::lock::try_lock_exclusive(&lock).expect("try the lock"));
    }

    #[test]
    fn a_job_locks_its_directory_and_removes_it_when_it_ends() {
        let local = tempfile::tempdir().expect("a temporary directory");
        let budget = RocksDbBudget::new(64 << 20, weir_memory::RocksDbMemoryRatios::default());
        let job = JobRocksDb::open(local.path(), 1, budget, false).expect("open RocksDB");
        let lock = std::fs::File::open(job.dir.join(OWNER_LOCK)).expect("the owner lock");
        assert!(!weir_state::lock::try_lock_exclusive(&lock).expect("try the lock"));
        let dir = job.dir.clone();
        drop(job);
        assert!(!dir.exists());
    }
}
