//! Local exchange: records crossing shards travel as rkyv archives in network segments over a
//! bounded single-producer single-consumer ring per (sender, receiver) pair (glommio's
//! `shared_channel`). The ring's capacity is the receiver's credit: a sender with a full ring
//! waits. Only the segment handle moves between shards, not its bytes.

#[doc(hidden)]
pub mod frame;
pub(crate) mod inflight;
pub(crate) mod local;
pub(crate) mod partitioner;
pub(crate) mod reader;
pub(crate) mod writer;

pub use partitioner::PartitionKind;
