//! The network segment pool: a fixed number of aligned, fixed-size buffers per slot.
//!
//! Records that cross an exchange edge are serialized into a [`Segment`]; the segment handle
//! (not its bytes) moves to the receiving shard, and dropping it there returns it to the pool it
//! came from. The pool never grows: its size is the slot's network budget, so the memory held by
//! in-flight records is bounded by construction.

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Alignment of every segment: the pool is one anonymous mapping (page aligned) and segment
/// sizes are powers of two of at least 64 bytes.
#[cfg(test)]
const SEGMENT_ALIGN: usize = 64;

/// A pool request that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum SegmentPoolError {
    /// Every segment of the pool is in flight.
    #[error(
        "network segment pool of slot {slot} exhausted: all {segments} segments of {segment_size} \
         bytes are in flight; raise taskmanager.memory.network.fraction or \
         taskmanager.memory.process.size"
    )]
    Exhausted {
        /// The slot that owns the pool.
        slot: usize,
        /// Size of the pool, in segments.
        segments: usize,
        /// Size of one segment, in bytes.
        segment_size: usize,
    },
}

struct PoolInner {
    memory: NonNull<u8>,
    bytes: usize,
    segment_size: usize,
    segments: usize,
    slot: usize,
    /// Free segment indices, used last-in first-out so that recently used (cache-warm)
    /// segments are handed out again first.
    free: Mutex<Vec<u32>>,
    in_use: AtomicUsize,
    high_water: AtomicUsize,
    acquired: AtomicU64,
    /// Called after a segment came back (see [`SegmentPool::on_return`]).
    on_return: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

// SAFETY: the pool's memory is only reached through `Segment` handles, and each segment index
// is owned by exactly one handle at a time (it is popped from `free` before a handle exists and
// pushed back when the handle drops), so no two threads ever touch the same bytes concurrently.
unsafe impl Send for PoolInner {}
// SAFETY: see `Send`: shared access only reads the immutable fields and the atomic counters.
unsafe impl Sync for PoolInner {}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // SAFETY: `memory` is the mapping of `bytes` bytes made in `SegmentPool::new`, and every
        // segment handle holds an `Arc` to this pool, so none is alive any more.
        unsafe { libc::munmap(self.memory.as_ptr().cast(), self.bytes) };
    }
}

/// A fixed pool of network segments for one slot. Cloning shares the pool.
#[derive(Clone)]
pub struct SegmentPool {
    inner: Arc<PoolInner>,
}

impl fmt::Debug for SegmentPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SegmentPool")
            .field("stats", &self.stats())
            .finish()
    }
}

/// A snapshot of a pool's usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolStats {
    /// The slot that owns the pool.
    pub slot: usize,
    /// Size of the pool, in segments.
    pub segments: usize,
    /// Size of one segment, in bytes.
    pub segment_size: usize,
    /// Segments currently handed out.
    pub in_use: usize,
    /// The most segments ever handed out at once.
    pub high_water: usize,
    /// Segments handed out since the pool was created.
    pub acquired: u64,
}

impl SegmentPool {
    /// Allocates a pool of `segments` segments of `segment_size` bytes for `slot`.
    ///
    /// # Panics
    /// If `segment_size` is not a power of two of at least 64 bytes, or `segments` is zero.
    pub fn new(slot: usize, segments: usize, segment_size: usize) -> SegmentPool {
        assert!(
            segment_size.is_power_of_two() && segment_size >= 64,
            "bad segment size"
        );
        assert!(
            segments > 0 && segments <= u32::MAX as usize,
            "bad segment count"
        );
        let bytes = segments
            .checked_mul(segment_size)
            .expect("segment pool size overflows");
        // One anonymous private mapping: page aligned, zero filled, and committed by the kernel
        // page by page as segments are first written, so a large, mostly idle pool costs little
        // resident memory and nothing at start-up.
        // SAFETY: a fresh anonymous mapping with no address hint aliases nothing.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(
            ptr != libc::MAP_FAILED,
            "cannot map {bytes} bytes for the segment pool of slot {slot}: {}",
            std::io::Error::last_os_error()
        );
        let memory = NonNull::new(ptr.cast::<u8>()).expect("mmap returns a non-null address");
        let free = Mutex::new((0..segments as u32).rev().collect());
        SegmentPool {
            inner: Arc::new(PoolInner {
                memory,
                bytes,
                segment_size,
                segments,
                slot,
                free,
                in_use: AtomicUsize::new(0),
                high_water: AtomicUsize::new(0),
                acquired: AtomicU64::new(0),
                on_return: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Calls `hook` each time a segment comes back to the pool, on the thread that dropped it
    /// (a network channel's receiver announces credit for its freed segments so). One hook
    /// per pool, for the pool's life (a channel's own pool): false, and `hook` dropped, if it
    /// has one already. The hook must not hold the pool, or the pool is never unmapped.
    pub fn on_return(&self, hook: impl Fn() + Send + Sync + 'static) -> bool {
        self.inner.on_return.set(Box::new(hook)).is_ok()
    }

    /// Takes a free segment, or fails if every segment is in flight.
    pub fn acquire(&self) -> Result<Segment, SegmentPoolError> {
        let inner = &self.inner;
        let mut free = inner.free.lock().expect("segment pool lock");
        let index = free.pop().ok_or(SegmentPoolError::Exhausted {
            slot: inner.slot,
            segments: inner.segments,
            segment_size: inner.segment_size,
        })?;
        // Counted under the lock, as a return is: `in_use` never disagrees with the free list.
        let in_use = inner.in_use.fetch_add(1, Ordering::Relaxed) + 1;
        drop(free);
        inner.high_water.fetch_max(in_use, Ordering::Relaxed);
        inner.acquired.fetch_add(1, Ordering::Relaxed);
        Ok(Segment {
            pool: Arc::clone(inner),
            index,
            len: 0,
        })
    }

    /// The size of one segment, in bytes.
    pub fn segment_size(&self) -> usize {
        self.inner.segment_size
    }

    /// The number of segments in the pool.
    pub fn capacity(&self) -> usize {
        self.inner.segments
    }

    /// Current usage.
    pub fn stats(&self) -> PoolStats {
        let inner = &self.inner;
        PoolStats {
            slot: inner.slot,
            segments: inner.segments,
            segment_size: inner.segment_size,
            in_use: inner.in_use.load(Ordering::Relaxed),
            high_water: inner.high_water.load(Ordering::Relaxed),
            acquired: inner.acquired.load(Ordering::Relaxed),
        }
    }
}

/// One network segment: exclusive access to `segment_size` bytes of a pool, of which the first
/// `len()` are filled. Dropping it returns it to its pool, on whatever thread that happens.
pub struct Segment {
    pool: Arc<PoolInner>,
    index: u32,
    len: usize,
}

impl fmt::Debug for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Segment")
            .field("index", &self.index)
            .field("len", &self.len)
            .finish()
    }
}

impl Segment {
    fn start(&self) -> *mut u8 {
        // SAFETY: `index < segments`, so the offset stays inside the pool's allocation.
        unsafe {
            self.pool
                .memory
                .as_ptr()
                .add(self.index as usize * self.pool.segment_size)
        }
    }

    /// The filled part of the segment.
    pub fn filled(&self) -> &[u8] {
        // SAFETY: this handle owns the segment's bytes exclusively (see `PoolInner`), the region
        // `[start, start + len)` lies inside it, and it was zero-initialised at allocation.
        unsafe { std::slice::from_raw_parts(self.start(), self.len) }
    }

    /// The whole segment, for writing. Call [`Segment::set_len`] after filling it.
    pub fn buffer_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `filled`, for the whole `segment_size` bytes; `&mut self` makes the
        // access unique.
        unsafe { std::slice::from_raw_parts_mut(self.start(), self.pool.segment_size) }
    }

    /// Number of filled bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Total size of the segment, in bytes.
    pub fn capacity(&self) -> usize {
        self.pool.segment_size
    }

    /// Marks the first `len` bytes as filled.
    ///
    /// # Panics
    /// If `len` exceeds the segment's capacity.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.pool.segment_size,
            "segment length past its capacity"
        );
        self.len = len;
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // A poisoned lock only means another thread panicked while holding it; the list of
        // indices itself is always consistent.
        let mut free = self
            .pool
            .free
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        free.push(self.index);
        // Under the lock, as `acquire` counts: `in_use` never disagrees with the free list
        // (a receiver announcing credit for what it says is free finds those segments there).
        self.pool.in_use.fetch_sub(1, Ordering::Relaxed);
        drop(free);
        if let Some(hook) = self.pool.on_return.get() {
            hook();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_until_exhausted_then_reuse() {
        let pool = SegmentPool::new(3, 2, 4096);
        let mut a = pool.acquire().unwrap();
        let b = pool.acquire().unwrap();
        let err = pool.acquire().unwrap_err().to_string();
        assert!(err.contains("slot 3"), "{err}");
        assert!(err.contains("taskmanager.memory.network.fraction"), "{err}");
        a.buffer_mut()[..3].copy_from_slice(b"abc");
        a.set_len(3);
        assert_eq!(a.filled(), b"abc");
        assert_eq!(pool.stats().in_use, 2);
        drop(a);
        drop(b);
        let stats = pool.stats();
        assert_eq!((stats.in_use, stats.high_water, stats.acquired), (0, 2, 2));
        assert!(pool.acquire().is_ok());
    }

    #[test]
    fn segments_are_aligned_and_disjoint() {
        let pool = SegmentPool::new(0, 4, 8192);
        let mut segs: Vec<Segment> = (0..4).map(|_| pool.acquire().unwrap()).collect();
        for (i, s) in segs.iter_mut().enumerate() {
            assert_eq!(s.buffer_mut().as_ptr() as usize % SEGMENT_ALIGN, 0);
            s.buffer_mut().fill(i as u8);
            s.set_len(8192);
        }
        for (i, s) in segs.iter().enumerate() {
            assert!(s.filled().iter().all(|&b| b == i as u8));
        }
    }

    #[test]
    fn a_return_hook_runs_for_every_segment_back() {
        let pool = SegmentPool::new(0, 2, 4096);
        let returned = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&returned);
        assert!(pool.on_return(move || {
            count.fetch_add(1, Ordering::Relaxed);
        }));
        assert!(!pool.on_return(|| {}), "one hook per pool");
        let (a, b) = (pool.acquire().unwrap(), pool.acquire().unwrap());
        drop(a);
        std::thread::spawn(move || drop(b)).join().unwrap();
        assert_eq!(returned.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn in_use_never_exceeds_the_pool_while_threads_take_and_return() {
        let pool = SegmentPool::new(0, 2, 4096);
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if let Ok(segment) = pool.acquire() {
                            assert!(pool.stats().in_use <= 2);
                            drop(segment);
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        let stats = pool.stats();
        assert_eq!(stats.in_use, 0);
        assert!(stats.high_water <= 2, "{stats:?}");
    }

    #[test]
    fn returns_from_another_thread() {
        let pool = SegmentPool::new(0, 1, 4096);
        let seg = pool.acquire().unwrap();
        std::thread::spawn(move || drop(seg)).join().unwrap();
        assert_eq!(pool.stats().in_use, 0);
        assert!(pool.acquire().is_ok());
    }
}
