//! The counting global allocator: per-thread heap figures, so a shard's heap use can be held
//! against its slot's heap share.
//!
//! [`CountingAllocator`] wraps the real allocator (mimalloc in the `weir` binary) and, on every
//! allocation, reallocation and free, updates counters that belong to the calling thread.
//!
//! Each thread owns one `ThreadSlot`, found through a thread-local pointer. Only the owning
//! thread writes its slot, so an update is a relaxed load and a relaxed store, with no atomic
//! read-modify-write on the hot path; other threads read the slots relaxed when they report
//! ([`heap_snapshot`], [`total_net_bytes`]). [`CountingAllocator`] says what the figures mean.
//!
//! # Inside the allocator
//! Counting must not allocate through the global allocator it is part of. A thread gets its
//! slot on its first allocation: a free slot of an ended thread is reused, or a new one is
//! taken from the system allocator ([`std::alloc::System`]), never from the global one. Slots are
//! never freed, so a slot pointer stays valid for the life of the process. A thread-local
//! guard gives the slot back when the thread ends; registering that guard may itself allocate,
//! which is counted on the slot already in place. Allocations the thread makes after its guard
//! ran (later thread-local destructors) go to the exited figure. This relies on native
//! thread-locals (`#[thread_local]`), which Linux, the platform Weir runs on, has.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard};

/// A global allocator that forwards to `A` and counts heap bytes per thread.
///
/// # What the figures mean
/// A free is counted on the thread that frees, whichever thread allocated the memory. A
/// thread's figure is therefore *net*: bytes it allocated minus bytes it freed. It can be
/// negative (a shard that frees records another shard built), and only the sum over all threads
/// is the process's exact heap use. Figures of threads that have ended, and the few
/// allocations a thread makes while it starts or tears down its thread-locals, are kept in one
/// "exited" figure so that the sum stays exact. Reads from other threads are not a consistent
/// cut: a snapshot taken while threads allocate or end may be off by what moved meanwhile.
///
/// # Use
/// The `weir` binary wraps mimalloc; here the system allocator:
///
/// ```
/// use std::alloc::System;
/// use weir_memory::{current_thread_net_bytes, CountingAllocator};
///
/// #[global_allocator]
/// static GLOBAL: CountingAllocator<System> = CountingAllocator::new(System);
///
/// fn main() {
///     let before = current_thread_net_bytes();
///     let buffer = std::hint::black_box(vec![0u8; 4096]);
///     assert_eq!(current_thread_net_bytes() - before, 4096);
///     drop(buffer);
///     assert_eq!(current_thread_net_bytes(), before);
/// }
/// ```
#[derive(Debug, Default)]
pub struct CountingAllocator<A> {
    inner: A,
}

impl<A> CountingAllocator<A> {
    /// Wraps `inner`; usable in a `static`.
    pub const fn new(inner: A) -> CountingAllocator<A> {
        CountingAllocator { inner }
    }

    /// The wrapped allocator.
    pub fn inner(&self) -> &A {
        &self.inner
    }
}

// SAFETY: every method forwards to `inner` with the caller's arguments unchanged and returns its
// result unchanged, so `inner`'s guarantees are ours; counting only reads the layout sizes and
// touches per-thread counters, never the memory handed out, and it never unwinds.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingAllocator<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which is `inner`'s.
        let ptr = unsafe { self.inner.alloc(layout) };
        if !ptr.is_null() {
            count(layout.size(), 0);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let ptr = unsafe { self.inner.alloc_zeroed(layout) };
        if !ptr.is_null() {
            count(layout.size(), 0);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller guarantees `ptr` was allocated by this allocator, that is by
        // `inner`, with `layout`.
        unsafe { self.inner.dealloc(ptr, layout) };
        count(0, layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`, and the caller guarantees `new_size` is valid for `layout`'s
        // alignment.
        let new = unsafe { self.inner.realloc(ptr, layout, new_size) };
        // On failure the old block is untouched and still owned by the caller: nothing changed.
        if !new.is_null() {
            count(new_size, layout.size());
        }
        new
    }
}

/// The counters of one thread. Aligned to two cache lines so that threads updating their own
/// slots never share a line.
#[repr(align(128))]
struct ThreadSlot {
    /// Bytes allocated minus bytes freed by the owner. Written only by the owner.
    net: AtomicI64,
    /// Bytes allocated by the owner since it took the slot. Written only by the owner.
    allocated: AtomicU64,
    /// Allocation calls (including reallocations) by the owner. Written only by the owner.
    allocations: AtomicU64,
    /// `FREE`, `CLAIMING` or `LIVE`.
    state: AtomicU8,
    /// Weir's id of the owning thread: unique for the life of the process.
    id: AtomicU64,
    /// The operating system's id of the owning thread (0 where unknown).
    os_tid: AtomicU64,
    /// The name given by [`register_current_thread`]; taken out when the owner ends.
    name: Mutex<Option<Box<str>>>,
    /// The next slot in the registry; set once, before the slot is published.
    next: AtomicPtr<ThreadSlot>,
}

/// Slot states.
const FREE: u8 = 0;
const CLAIMING: u8 = 1;
const LIVE: u8 = 2;

/// Per-thread states.
const UNATTACHED: u8 = 0;
const ATTACHING: u8 = 1;
const ATTACHED: u8 = 2;
const DETACHED: u8 = 3;

/// Every slot ever made, newest first. Slots are never removed or freed.
static REGISTRY: AtomicPtr<ThreadSlot> = AtomicPtr::new(std::ptr::null_mut());
static NEXT_THREAD_ID: AtomicU64 = AtomicU64::new(1);
/// Set once a `CountingAllocator` has counted anything in this process.
static COUNTING: AtomicBool = AtomicBool::new(false);
/// Figures of ended threads, and of allocations made while a thread had no slot.
static EXITED_NET: AtomicI64 = AtomicI64::new(0);
static EXITED_ALLOCATED: AtomicU64 = AtomicU64::new(0);
static EXITED_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    // Both have constant initialisers and no destructor: accessing them never allocates,
    // never registers anything, and works at any point of the thread's life.
    static CURRENT: Cell<Option<&'static ThreadSlot>> = const { Cell::new(None) };
    static THREAD_STATE: Cell<u8> = const { Cell::new(UNATTACHED) };
    // Its destructor gives the slot back when the thread ends.
    static EXIT_GUARD: ExitGuard = const { ExitGuard };
}

struct ExitGuard;

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let Some(slot) = CURRENT.with(Cell::get) else {
            return;
        };
        // Drop the name while the slot is still ours, so that its free is counted on it.
        let name = lock(&slot.name).take();
        drop(name);
        CURRENT.with(|current| current.set(None));
        THREAD_STATE.with(|state| state.set(DETACHED));
        release(slot);
    }
}

fn lock(name: &Mutex<Option<Box<str>>>) -> MutexGuard<'_, Option<Box<str>>> {
    // The name is replaced whole under the lock, so a poisoned lock still holds a valid one.
    name.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Counts one allocator call on the current thread: `allocated` new bytes, `freed` old bytes.
#[inline]
fn count(allocated: usize, freed: usize) {
    match CURRENT.with(Cell::get) {
        Some(slot) => add(slot, allocated, freed),
        None => count_unattached(allocated, freed),
    }
}

#[inline]
fn add(slot: &ThreadSlot, allocated: usize, freed: usize) {
    // Only the owning thread writes these counters (see `ThreadSlot`), so a relaxed load and
    // store is an exact update. Wrapping arithmetic: nothing in here may panic.
    let net = slot.net.load(Ordering::Relaxed);
    slot.net.store(
        net.wrapping_add(allocated as i64)
            .wrapping_sub(freed as i64),
        Ordering::Relaxed,
    );
    if allocated > 0 {
        let bytes = slot.allocated.load(Ordering::Relaxed);
        slot.allocated
            .store(bytes.wrapping_add(allocated as u64), Ordering::Relaxed);
        let calls = slot.allocations.load(Ordering::Relaxed);
        slot.allocations
            .store(calls.wrapping_add(1), Ordering::Relaxed);
    }
}

/// The first call on a thread (which attaches it to a slot), or a call while the thread has
/// no slot: during attaching, after its guard ran, or when no slot could be made.
#[cold]
#[inline(never)]
fn count_unattached(allocated: usize, freed: usize) {
    if !COUNTING.load(Ordering::Relaxed) {
        COUNTING.store(true, Ordering::Relaxed);
    }
    if THREAD_STATE.with(Cell::get) == UNATTACHED {
        if let Some(slot) = attach_current_thread() {
            add(slot, allocated, freed);
            return;
        }
    }
    EXITED_NET.fetch_add(
        (allocated as i64).wrapping_sub(freed as i64),
        Ordering::Relaxed,
    );
    if allocated > 0 {
        EXITED_ALLOCATED.fetch_add(allocated as u64, Ordering::Relaxed);
        EXITED_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Gives the current thread a slot. Must only be called while the thread is `UNATTACHED`.
fn attach_current_thread() -> Option<&'static ThreadSlot> {
    THREAD_STATE.with(|state| state.set(ATTACHING));
    let Some(slot) = claim_slot() else {
        // The system allocator is out of memory; try again on the next call.
        THREAD_STATE.with(|state| state.set(UNATTACHED));
        return None;
    };
    CURRENT.with(|current| current.set(Some(slot)));
    // Registering the guard's destructor may allocate; that is counted on `slot`.
    if EXIT_GUARD.try_with(|_| ()).is_err() {
        // The thread is already running its thread-local destructors: nothing would give the
        // slot back, so give it back now.
        CURRENT.with(|current| current.set(None));
        THREAD_STATE.with(|state| state.set(DETACHED));
        release(slot);
        return None;
    }
    THREAD_STATE.with(|state| state.set(ATTACHED));
    Some(slot)
}

/// Takes a free slot from the registry, or makes a new one with the system allocator.
fn claim_slot() -> Option<&'static ThreadSlot> {
    let mut cursor = REGISTRY.load(Ordering::Acquire);
    // SAFETY: registry pointers are slots allocated and initialised below, published with
    // release ordering (paired with this acquire load) and never freed, so each is a valid
    // `ThreadSlot` for `'static`.
    while let Some(slot) = unsafe { cursor.as_ref() } {
        if slot
            .state
            .compare_exchange(FREE, CLAIMING, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            init_claimed(slot);
            return Some(slot);
        }
        cursor = slot.next.load(Ordering::Relaxed);
    }
    let layout = Layout::new::<ThreadSlot>();
    // SAFETY: the layout has a non-zero size. The system allocator never calls back into the
    // global allocator, so this does not recurse.
    let raw = unsafe { System.alloc(layout) }.cast::<ThreadSlot>();
    if raw.is_null() {
        return None;
    }
    // SAFETY: `raw` is a fresh allocation of `ThreadSlot`'s size and alignment; building the
    // value allocates nothing (`Mutex::new` and the atomics are plain values).
    unsafe {
        raw.write(ThreadSlot {
            net: AtomicI64::new(0),
            allocated: AtomicU64::new(0),
            allocations: AtomicU64::new(0),
            state: AtomicU8::new(CLAIMING),
            id: AtomicU64::new(0),
            os_tid: AtomicU64::new(0),
            name: Mutex::new(None),
            next: AtomicPtr::new(std::ptr::null_mut()),
        });
    }
    // SAFETY: initialised just above and never freed.
    let slot: &'static ThreadSlot = unsafe { &*raw };
    init_claimed(slot);
    let mut head = REGISTRY.load(Ordering::Relaxed);
    loop {
        slot.next.store(head, Ordering::Relaxed);
        match REGISTRY.compare_exchange_weak(head, raw, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return Some(slot),
            Err(current) => head = current,
        }
    }
}

/// Fills in the owner of a slot in state `CLAIMING` and makes it `LIVE`.
fn init_claimed(slot: &ThreadSlot) {
    slot.id.store(
        NEXT_THREAD_ID.fetch_add(1, Ordering::Relaxed),
        Ordering::Relaxed,
    );
    slot.os_tid.store(os_thread_id(), Ordering::Relaxed);
    slot.state.store(LIVE, Ordering::Release);
}

/// Folds a slot's figures into the exited figures and frees it for another thread. Called by
/// the owner, which then no longer touches it.
fn release(slot: &ThreadSlot) {
    EXITED_NET.fetch_add(slot.net.swap(0, Ordering::Relaxed), Ordering::Relaxed);
    EXITED_ALLOCATED.fetch_add(slot.allocated.swap(0, Ordering::Relaxed), Ordering::Relaxed);
    EXITED_ALLOCATIONS.fetch_add(
        slot.allocations.swap(0, Ordering::Relaxed),
        Ordering::Relaxed,
    );
    slot.state.store(FREE, Ordering::Release);
}

#[cfg(target_os = "linux")]
fn os_thread_id() -> u64 {
    // SAFETY: `gettid` takes no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    u64::try_from(tid).unwrap_or(0)
}

#[cfg(not(target_os = "linux"))]
fn os_thread_id() -> u64 {
    0
}

/// Every slot in the registry, live or not.
fn slots() -> impl Iterator<Item = &'static ThreadSlot> {
    let mut cursor = REGISTRY.load(Ordering::Acquire);
    std::iter::from_fn(move || {
        // SAFETY: see `claim_slot`: registry pointers are valid for `'static`.
        let slot = unsafe { cursor.as_ref() }?;
        cursor = slot.next.load(Ordering::Relaxed);
        Some(slot)
    })
}

/// Whether a [`CountingAllocator`] is the global allocator of this process and has counted.
///
/// When it is not, every figure is zero and a heap budget cannot be enforced.
pub fn is_counting() -> bool {
    COUNTING.load(Ordering::Relaxed)
}

/// The current thread's net heap bytes: allocated minus freed on this thread (it may be
/// negative: see [`CountingAllocator`]). A thread-local read and one load.
#[inline]
pub fn current_thread_net_bytes() -> i64 {
    CURRENT
        .with(Cell::get)
        .map_or(0, |slot| slot.net.load(Ordering::Relaxed))
}

/// Bytes the current thread has allocated since it started, frees not subtracted.
#[inline]
pub fn current_thread_allocated_bytes() -> u64 {
    CURRENT
        .with(Cell::get)
        .map_or(0, |slot| slot.allocated.load(Ordering::Relaxed))
}

/// Names the current thread's counter in [`heap_snapshot`], e.g. `"shard-3"`. A later call
/// replaces the name; the name goes when the thread ends.
pub fn register_current_thread(name: &str) {
    let slot = match CURRENT.with(Cell::get) {
        Some(slot) => Some(slot),
        None if THREAD_STATE.with(Cell::get) == UNATTACHED => attach_current_thread(),
        None => None,
    };
    if let Some(slot) = slot {
        let name: Box<str> = name.into();
        let old = lock(&slot.name).replace(name);
        drop(old);
    }
}

/// The process's net heap bytes: every live thread's figure plus the exited figure. Does not
/// allocate.
pub fn total_net_bytes() -> i64 {
    slots()
        .filter(|slot| slot.state.load(Ordering::Acquire) == LIVE)
        .fold(EXITED_NET.load(Ordering::Relaxed), |sum, slot| {
            sum.wrapping_add(slot.net.load(Ordering::Relaxed))
        })
}

/// One thread's figures in a [`HeapSnapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadHeap {
    /// Weir's id of the thread, unique for the life of the process.
    pub id: u64,
    /// The operating system's thread id (Linux `gettid`), 0 where unknown.
    pub os_tid: u64,
    /// The name given by [`register_current_thread`], else the operating system's name of the
    /// thread where it can be read (Linux), else `None`.
    pub name: Option<String>,
    /// Bytes allocated minus bytes freed on this thread; may be negative.
    pub net_bytes: i64,
    /// Bytes allocated on this thread, frees not subtracted.
    pub allocated_bytes: u64,
    /// Allocation calls on this thread, reallocations included.
    pub allocations: u64,
}

/// Every live thread's heap figures, read at one moment (not atomically across threads).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapSnapshot {
    /// Live threads that have allocated or registered a name, newest first.
    pub threads: Vec<ThreadHeap>,
    /// Net bytes of threads that have ended (what they allocated and nobody freed yet, minus
    /// what they freed of others' memory), and of calls made while a thread had no counter.
    pub exited_net_bytes: i64,
    /// Bytes allocated by threads that have ended.
    pub exited_allocated_bytes: u64,
    /// Allocation calls of threads that have ended.
    pub exited_allocations: u64,
}

impl HeapSnapshot {
    /// The process's net heap bytes: the sum of every figure.
    pub fn total_net_bytes(&self) -> i64 {
        self.threads.iter().fold(self.exited_net_bytes, |sum, t| {
            sum.wrapping_add(t.net_bytes)
        })
    }

    /// The live thread registered (or named by the system) as `name`.
    pub fn thread(&self, name: &str) -> Option<&ThreadHeap> {
        self.threads
            .iter()
            .find(|t| t.name.as_deref() == Some(name))
    }
}

/// Reads every live thread's figures. Allocates (on the calling thread) for the result.
pub fn heap_snapshot() -> HeapSnapshot {
    let mut threads = Vec::new();
    for slot in slots() {
        if slot.state.load(Ordering::Acquire) != LIVE {
            continue;
        }
        let registered = lock(&slot.name).as_deref().map(str::to_string);
        let os_tid = slot.os_tid.load(Ordering::Relaxed);
        threads.push(ThreadHeap {
            id: slot.id.load(Ordering::Relaxed),
            os_tid,
            name: registered.or_else(|| os_thread_name(os_tid)),
            net_bytes: slot.net.load(Ordering::Relaxed),
            allocated_bytes: slot.allocated.load(Ordering::Relaxed),
            allocations: slot.allocations.load(Ordering::Relaxed),
        });
    }
    HeapSnapshot {
        threads,
        exited_net_bytes: EXITED_NET.load(Ordering::Relaxed),
        exited_allocated_bytes: EXITED_ALLOCATED.load(Ordering::Relaxed),
        exited_allocations: EXITED_ALLOCATIONS.load(Ordering::Relaxed),
    }
}

/// The kernel's name of a thread of this process (what `std::thread::Builder::name` set,
/// cut to 15 bytes).
fn os_thread_name(os_tid: u64) -> Option<String> {
    if !cfg!(target_os = "linux") || os_tid == 0 {
        return None;
    }
    let name = std::fs::read_to_string(format!("/proc/self/task/{os_tid}/comm")).ok()?;
    let name = name.trim_end();
    (!name.is_empty()).then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    //! The unit tests run without the counting allocator installed (see `tests/` for that);
    //! they cover the slot registry, which works either way.

    use super::*;

    #[test]
    fn a_registered_thread_appears_under_its_name() {
        std::thread::spawn(|| {
            register_current_thread("unit-named");
            let snapshot = heap_snapshot();
            let me = snapshot
                .thread("unit-named")
                .expect("registered thread listed");
            assert_eq!(me.os_tid, os_thread_id());
            register_current_thread("unit-renamed");
            assert!(heap_snapshot().thread("unit-named").is_none());
            assert!(heap_snapshot().thread("unit-renamed").is_some());
        })
        .join()
        .unwrap();
        assert!(heap_snapshot().thread("unit-renamed").is_none());
    }

    #[test]
    fn slots_of_ended_threads_are_reused() {
        // Warm up so that at least one slot exists and is free.
        std::thread::spawn(|| register_current_thread("unit-reuse"))
            .join()
            .unwrap();
        let before = slots().count();
        let mut ids = Vec::new();
        for _ in 0..50 {
            let id = std::thread::spawn(|| {
                register_current_thread("unit-reuse");
                CURRENT.with(Cell::get).unwrap().id.load(Ordering::Relaxed)
            })
            .join()
            .unwrap();
            ids.push(id);
        }
        // Other tests of this binary may run threads meanwhile; 50 sequential threads must
        // still not have needed 50 new slots.
        assert!(slots().count() < before + 10, "slots were not reused");
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 50, "every thread gets its own id");
    }
}
