//! Per-slot memory for Weir workers.
//!
//! A worker's `taskmanager.memory.process.size` is split into managed (state backends),
//! network (exchange segments) and heap shares; each share is divided evenly across slots.
//! This crate owns that arithmetic ([`MemoryConfig`], [`SlotBudget`]) and the fixed pool of
//! network segments each slot sends its records in ([`SegmentPool`]).
#![warn(missing_docs)]

mod budget;
mod segment;

pub use budget::{MemoryConfig, MemoryConfigError, SlotBudget};
pub use segment::{PoolStats, Segment, SegmentPool, SegmentPoolError};
