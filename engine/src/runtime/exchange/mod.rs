//! The exchange: records crossing shards travel as rkyv archives in network segments over a
//! channel per (sender, receiver) pair — one contract (`channel.rs`: credit, order, close,
//! trust) for a bounded ring between shards of this process (glommio's `shared_channel`,
//! whose capacity is the receiver's credit; only the segment's handle moves) and for a channel
//! to another process, whose segments are checked before they are read (`frame.rs`). Records
//! between subtasks of one shard move by value in batches (`local.rs`).

pub mod channel;
#[doc(hidden)]
pub mod frame;
pub(crate) mod inflight;
pub(crate) mod local;
pub(crate) mod partitioner;
pub(crate) mod reader;
pub(crate) mod writer;

pub use partitioner::PartitionKind;
