//! Per-slot memory for Weir workers.
//!
//! A worker's `taskmanager.memory.process.size` is split into managed (state backends),
//! network (exchange segments) and heap shares; each share is divided evenly across slots.
//! This crate owns that arithmetic ([`MemoryConfig`], [`SlotBudget`], [`WorkerBudget`] with
//! RocksDB's part of the managed share, [`RocksDbBudget`]), the fixed pool of network segments
//! each slot sends its records in ([`SegmentPool`]), the counting global allocator that
//! measures each shard's heap ([`CountingAllocator`]) and the check that holds it to the slot's
//! heap share ([`check_heap_budget`]), and the process's opt-out of transparent huge pages
//! ([`disable_transparent_huge_pages`]).
#![warn(missing_docs)]

mod alloc;
mod budget;
mod heap;
mod pages;
mod segment;
mod units;

pub use alloc::{
    current_thread_allocated_bytes, current_thread_net_bytes, heap_snapshot, is_counting,
    register_current_thread, total_net_bytes, CountingAllocator, HeapSnapshot, ThreadHeap,
};
pub use budget::{
    default_process_size, host_memory, MemoryConfig, MemoryConfigError, RocksDbBudget,
    RocksDbMemoryRatios, SlotBudget, WorkerBudget, BASE_PROCESS_SIZE,
    DEFAULT_HIGH_PRIORITY_POOL_RATIO, DEFAULT_WRITE_BACK_RATIO, DEFAULT_WRITE_BUFFER_RATIO,
    PROCESS_SIZE_PER_SLOT,
};
pub use heap::{check_heap_budget, HeapBudgetExceeded, HeapStateSize};
pub use pages::{disable_transparent_huge_pages, transparent_huge_pages_disabled};
pub use segment::{PoolStats, Segment, SegmentPool, SegmentPoolError};
