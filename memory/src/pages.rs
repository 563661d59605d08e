//! Transparent huge pages off for the process: the heap is faulted in 4 KiB pages.
//!
//! mimalloc asks the kernel for transparent huge pages on its arenas (`madvise(MADV_HUGEPAGE)`),
//! so a first touch of any part of a 2 MiB region makes the kernel zero all of it, and each
//! region mimalloc purges after a free is zeroed again when it is used again. A job whose state
//! grows and shrinks (window panes, timers, hash tables that rehash) spent up to 18 % of a shard's
//! time in the kernel's `clear_page_erms` that way (Nexmark q4, 1 shard). With huge pages off,
//! q5 ran 6.13–6.68 M events/s against 5.00–5.46 M, and 3.05–3.32 s of CPU against 3.67–4.03 s
//! (three alternating runs each, `bench/RESULTS.md`); jobs that keep no state (q0) did not move.
//! Redis and MongoDB give their servers the same advice.

/// Disables transparent huge pages for this process (`PR_SET_THP_DISABLE`), for memory mapped
/// before the call as well as after; threads and child processes inherit the setting. Call it
/// first thing in `main`, before the shards start.
///
/// # Errors
/// The `prctl` error, on a kernel without the setting (before Linux 3.15).
pub fn disable_transparent_huge_pages() -> std::io::Result<()> {
    // SAFETY: `prctl` with `PR_SET_THP_DISABLE` reads only its integer arguments.
    let result = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether transparent huge pages are disabled for this process (`PR_GET_THP_DISABLE`).
pub fn transparent_huge_pages_disabled() -> bool {
    // SAFETY: `prctl` with `PR_GET_THP_DISABLE` takes no pointers.
    unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_pages_stay_off_for_the_process_and_its_threads() {
        disable_transparent_huge_pages().expect("the kernel has PR_SET_THP_DISABLE");
        assert!(transparent_huge_pages_disabled());
        let in_thread = std::thread::spawn(transparent_huge_pages_disabled)
            .join()
            .expect("thread");
        assert!(
            in_thread,
            "a thread started after the call inherits the setting"
        );
    }
}
