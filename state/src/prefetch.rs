//! Prefetch hints: asking the CPU to bring cache lines in ahead of their reads, so that the
//! misses of several scattered lookups overlap instead of following one another.

/// Prefetches the cache lines of `value`. A hint: it reads nothing.
#[inline(always)]
pub fn prefetch<T>(value: &T) {
    prefetch_bytes((value as *const T).cast(), std::mem::size_of::<T>());
}

/// Prefetches every cache line holding one of the `len` bytes from `start`, which need not be
/// valid memory (a hint never faults).
#[inline(always)]
pub fn prefetch_bytes(start: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        const LINE: usize = 64;
        // From the start of `start`'s line: bytes that straddle a line get both.
        let skew = start as usize % LINE;
        let line = start.wrapping_sub(skew);
        for offset in (0..skew + len.max(1)).step_by(LINE) {
            // SAFETY: a prefetch loads nothing into registers and never faults, whatever the
            // address; SSE, which it needs, is part of every x86-64 CPU.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.wrapping_add(offset).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (start, len);
}
