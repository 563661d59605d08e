//! The counting allocator as the global allocator: each thread's figure moves by exactly what
//! that thread allocates and frees, and no other thread's does.

use std::alloc::System;
use std::hint::black_box;
use std::sync::{Barrier, Mutex};

use weir_memory::{
    current_thread_allocated_bytes, current_thread_net_bytes, heap_snapshot, is_counting,
    register_current_thread, CountingAllocator,
};

#[global_allocator]
static GLOBAL: CountingAllocator<System> = CountingAllocator::new(System);

const N: usize = 1 << 20;

/// Runs `f` on a fresh thread, so that it starts with its own counter.
fn on_new_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| scope.spawn(f).join().unwrap())
}

#[test]
fn allocating_raises_the_thread_figure_and_freeing_lowers_it() {
    on_new_thread(|| {
        assert!(is_counting());
        let before = current_thread_net_bytes();
        let allocated_before = current_thread_allocated_bytes();
        let buffer: Vec<u8> = black_box(Vec::with_capacity(N));
        let during = current_thread_net_bytes();
        assert!(during - before >= N as i64, "{before} -> {during}");
        assert!(current_thread_allocated_bytes() - allocated_before >= N as u64);
        drop(buffer);
        assert_eq!(current_thread_net_bytes(), before);
        // Zeroed allocations (`vec![0; n]`) count too.
        let zeroed = black_box(vec![0u8; N]);
        assert_eq!(current_thread_net_bytes() - before, N as i64);
        drop(zeroed);
        assert_eq!(current_thread_net_bytes(), before);
    });
}

#[test]
fn realloc_counts_the_size_difference() {
    on_new_thread(|| {
        let before = current_thread_net_bytes();
        let allocated_before = current_thread_allocated_bytes();
        let mut buffer: Vec<u8> = Vec::with_capacity(1000);
        assert_eq!(current_thread_net_bytes() - before, 1000);
        // Growing reallocates from 1000 to 50 000 bytes.
        buffer.reserve_exact(50_000);
        assert_eq!(buffer.capacity(), 50_000);
        assert_eq!(current_thread_net_bytes() - before, 50_000);
        // A reallocation counts its new size as allocated (and the old size as freed).
        assert_eq!(
            current_thread_allocated_bytes() - allocated_before,
            1000 + 50_000
        );
        // Shrinking reallocates down.
        buffer.shrink_to(100);
        assert_eq!(buffer.capacity(), 100);
        assert_eq!(current_thread_net_bytes() - before, 100);
        drop(black_box(buffer));
        assert_eq!(current_thread_net_bytes(), before);
    });
}

#[test]
fn other_threads_figures_are_unaffected() {
    let barrier = Barrier::new(2);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            register_current_thread("test-grower");
            barrier.wait();
            // The bystander takes its first readings here.
            barrier.wait();
            let big: Vec<u8> = black_box(Vec::with_capacity(16 * N));
            barrier.wait();
            // The bystander takes its second readings here.
            barrier.wait();
            drop(big);
        });
        let bystander = scope.spawn(|| {
            register_current_thread("test-bystander");
            barrier.wait();
            let snapshot_before = heap_snapshot();
            let before = current_thread_net_bytes();
            barrier.wait();
            // The grower allocates 16 MiB here.
            barrier.wait();
            let after = current_thread_net_bytes();
            let snapshot_after = heap_snapshot();
            barrier.wait();
            (before, after, snapshot_before, snapshot_after)
        });
        // Asserted once both threads are past the barriers, so a failure cannot hang the test.
        let (before, after, snapshot_before, snapshot_after) = bystander.join().unwrap();
        assert_eq!(
            after, before,
            "another thread's allocation moved this thread's figure"
        );
        let grower_before = snapshot_before
            .thread("test-grower")
            .expect("grower listed");
        let grower_after = snapshot_after.thread("test-grower").expect("grower listed");
        assert_eq!(grower_before.id, grower_after.id);
        assert!(
            grower_after.net_bytes - grower_before.net_bytes >= 16 * N as i64,
            "{grower_before:?} -> {grower_after:?}"
        );
        let bystander = snapshot_after
            .thread("test-bystander")
            .expect("bystander listed");
        assert_ne!(grower_after.id, bystander.id);
    });
}

#[test]
fn a_free_counts_on_the_freeing_thread_so_figures_are_net() {
    let handoff: Mutex<Option<Vec<u8>>> = Mutex::new(None);
    let barrier = Barrier::new(2);
    std::thread::scope(|scope| {
        let producer = scope.spawn(|| {
            let before = current_thread_net_bytes();
            let buffer: Vec<u8> = black_box(Vec::with_capacity(N));
            *handoff.lock().unwrap() = Some(buffer);
            barrier.wait();
            // The consumer frees the buffer here.
            barrier.wait();
            current_thread_net_bytes() - before
        });
        let consumer = scope.spawn(|| {
            let before = current_thread_net_bytes();
            barrier.wait();
            let buffer = handoff.lock().unwrap().take();
            drop(buffer);
            let change = current_thread_net_bytes() - before;
            barrier.wait();
            change
        });
        // Freed elsewhere: still counted as the producer's.
        assert_eq!(producer.join().unwrap(), N as i64);
        // The consumer freed what it never allocated: its net figure went below where it was,
        // and the two threads' changes sum to zero.
        assert_eq!(consumer.join().unwrap(), -(N as i64));
    });
}
