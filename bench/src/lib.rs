//! Weir's benchmark harness: macro benchmarks that run real jobs on the engine, each measured
//! in the same run against a hand-written loop doing the same work, so that a report says both
//! how fast the engine is and how far it is from what plain Rust does on this machine.
//!
//! - [`chain`]: source → map → filter → discard sink, chained on one shard, against a
//!   single-threaded loop.
//! - [`exchange`]: the same pipeline with a hash exchange (`key_by`) between shards, against a
//!   hand-written two-thread hand-off of the same records.
//! - [`window`]: keyed counts per tumbling, sliding or session window on one shard, against a
//!   hand-written loop keeping the same counts in hash maps.
//! - [`state`]: `ValueState` get + update per key on one shard, heap or RocksDB backend, against
//!   a plain `HashMap` loop.
//! - [`checkpoint`]: a keyed job holding a given amount of state, checkpointed under updates
//!   and failed once: sync pauses, checkpoint durations and sizes, restore and recovery times.
//! - [`file_sink`]: generated records written by the exactly-once file sink on one shard,
//!   against a plain buffered write of the same bytes.
//! - [`postgres`]: generated rows written by the exactly-once PostgreSQL sink from one
//!   subtask, against a hand-written `COPY` of the same rows.
//! - [`net`]: segments between two shards over `weir-net`'s QUIC channels on loopback, against
//!   a bare quinn bulk transfer of the same bytes.
//! - [`nexmark`]: the Nexmark event model, its standard generator, hand-written baselines of
//!   the queries, the queries as Weir jobs, and the harness behind `weir bench nexmark`
//!   (throughput per core, generation-to-result latency, checksums against the baseline).
//! - [`record`]: the 64-byte record both use, and the map and filter functions they share.
//!
//! Every report derives `serde::Serialize`; the `weir bench chain|exchange|net|window|state|join|checkpoint|file-sink|postgres|nexmark
//! --json` commands print one as a JSON object. The criterion micro-benchmarks live in
//! `benches/pipeline.rs` (pipelines, key groups, record codec) and `benches/hot_paths.rs` (a
//! Nexmark bid's codecs, segment write/read, the shard-to-shard ring, window assignment, state
//! get/put).
#![warn(missing_docs)]

pub mod chain;
pub mod checkpoint;
mod error;
pub mod exchange;
pub mod file_sink;
pub mod join;
mod measure;
pub mod net;
pub mod nexmark;
pub mod postgres;
pub mod record;
pub mod state;
pub mod veth;
pub mod window;

pub use error::BenchError;
pub use measure::{Measurement, ROUNDS};
