//! Data exchange between servers.
//!
//! A channel between executors in different processes carries whole network segments over
//! an ordered byte stream of its own (a QUIC stream), with credit-based flow control on top
//! of the transport's: [`wire`] is what the stream carries (data frames landing in segments
//! of the receiver's own pool, credit frames back), [`credit`] the bookkeeping of both sides.
//! Both are free of I/O. [`transport`] drives them over QUIC on each shard, authenticated
//! by mutual TLS ([`tls`]).
#![warn(missing_docs)]

pub mod credit;
pub mod tls;
pub mod transport;
pub mod wire;

pub use transport::{ChannelReceiver, ChannelSender, NetConfig, NetError, NetShard, Peer, TrySend};
