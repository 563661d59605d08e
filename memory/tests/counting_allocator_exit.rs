//! The counting allocator's sum stays exact when threads end: what an ended thread allocated
//! and did not free stays in the total (in the exited figure) until someone frees it.
//!
//! One test in its own binary, so that no other test allocates while the totals are compared.

use std::alloc::System;

use weir_memory::{heap_snapshot, register_current_thread, total_net_bytes, CountingAllocator};

#[global_allocator]
static GLOBAL: CountingAllocator<System> = CountingAllocator::new(System);

const LEAK: usize = 8 << 20;
/// What the thread machinery itself may keep or give back around a spawn and join.
const SLACK: i64 = 64 << 10;

fn spawn_and_join<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(f).join().unwrap()
}

#[test]
fn an_ended_threads_bytes_stay_in_the_total_until_freed() {
    // Warm up whatever the first spawn initialises.
    spawn_and_join(|| register_current_thread("warm-up"));

    let start = total_net_bytes();
    let exited_start = heap_snapshot().exited_net_bytes;
    let leaked = spawn_and_join(|| {
        register_current_thread("test-leaker");
        let buffer: &'static mut [u8] = Box::leak(vec![1u8; LEAK].into_boxed_slice());
        buffer.as_mut_ptr() as usize
    });
    let after_exit = total_net_bytes();
    assert!(
        (after_exit - start - LEAK as i64).abs() < SLACK,
        "total moved by {} after a thread leaked {LEAK} bytes and ended",
        after_exit - start
    );
    let snapshot = heap_snapshot();
    assert!(
        snapshot.thread("test-leaker").is_none(),
        "an ended thread is not listed"
    );
    assert!(snapshot.exited_net_bytes - exited_start >= LEAK as i64 - SLACK);

    // Freeing the ended thread's memory here brings the total back.
    // SAFETY: `leaked` is the address of the boxed slice of `LEAK` bytes leaked above, and
    // nothing else refers to it.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(leaked as *mut u8, LEAK)) });
    let end = total_net_bytes();
    assert!(
        (end - start).abs() < SLACK,
        "total moved by {} after the leak was freed",
        end - start
    );
}
