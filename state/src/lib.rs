//! Keyed state for Weir operators: key groups, the state API, and the heap and RocksDB
//! backends.
//!
//! - [`key_group`]: the stable assignment of keys to key groups and of key groups to subtasks.
//! - [`descriptor`]: what an operator declares in `open` (name, types, TTL).
//! - [`handle`]: what it gets back — [`ValueState`], [`ListState`], [`MapState`],
//!   [`ReducingState`], [`AggregatingState`] — acting on the backend's current key.
//! - [`backend`]: [`LocalKeyedBackend`], one per keyed operator subtask, over the heap
//!   (copy-on-write snapshots) or a [`RocksDbInstance`] per keyed operator subtask (checkpoints, compaction-time TTL);
//!   [`encode_keyed_snapshot`] writes a heap snapshot in the canonical keyed-state format that
//!   [`LocalKeyedBackend::restore`] reads back, rescaled to the backend's key groups.
//! - [`ttl`]: time to live and the injectable [`Clock`].
//! - [`checkpoint`]: checkpoint storage — state files written through io_uring with their
//!   checksums, metadata committed atomically, the newest usable checkpoint found on restore.
//! - [`codec`]: how values, keys and namespaces become bytes (rkyv).
//! - [`prefetch`](mod@prefetch): cache-line prefetch hints, so that the misses of scattered
//!   lookups overlap (the write-back cache's, the engine's snapshot writers').
//! - [`operator`]: operator (non-keyed) state — [`OperatorStateStore`], one per operator
//!   subtask, with split and union [`OperatorListState`]s and [`BroadcastState`]; its
//!   [`OperatorStateSnapshot`] (a checksummed byte format for checkpoint files) and
//!   [`redistribute`], Flink's rules for handing it to a new parallelism on restore.
//!
//! ```
//! use std::sync::Arc;
//! use weir_state::{
//!     KeyedBackendConfig, LocalKeyedBackend, ManualClock, ValueStateDescriptor,
//! };
//!
//! # fn main() -> Result<(), weir_state::StateError> {
//! // One backend per keyed operator subtask; here: all 128 key groups, on the heap.
//! let backend: LocalKeyedBackend<String> =
//!     LocalKeyedBackend::heap(KeyedBackendConfig::single(128), Arc::new(ManualClock::new(0)))?;
//! // In `open`: register state.
//! let count = backend.value_state(&ValueStateDescriptor::<u64>::new("count"))?;
//! // Per record: the engine sets the key, the operator uses its state.
//! for word in ["a", "b", "a"] {
//!     backend.set_current_key(&word.to_string())?;
//!     let next = count.value()?.unwrap_or(0) + 1;
//!     count.update(next)?;
//! }
//! backend.set_current_key(&"a".to_string())?;
//! assert_eq!(count.value()?, Some(2));
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

pub mod backend;
pub mod checkpoint;
pub mod checksum;
pub mod codec;
pub mod descriptor;
pub mod error;
pub mod handle;
pub mod key_group;
pub mod lock;
pub mod operator;
pub mod prefetch;
pub mod ttl;

pub use backend::heap::restore::RestoreSummary;
pub use backend::heap::snapshot::{HeapSnapshot, SnapshotEntry, StateSnapshot};
pub use backend::keyed_chain::{merge_keyed_chain, REMOVED_KEYS};
pub use backend::keyed_entries::{
    KeyedSnapshotEntries, KeyedSnapshotPieces, KeyedSnapshotWriter, StateValueCodec, WriterState,
};
pub use backend::keyed_snapshot::{
    decode_keyed_snapshot, encode_keyed_snapshot, KeyedEntryBytes, KeyedSnapshotContents,
    KeyedSnapshotEncoder, KeyedStateContents, KEYED_SNAPSHOT_FORMAT_VERSION,
};
pub use backend::rocksdb::{
    split_key, HeldCapture, NativeCheckpoint, NativeFile, NativeSource, RawEntries, RocksDbConfig,
    RocksDbInstance, RocksDbMemoryUsage, RocksDbSlot, SnapshotShape, StateKeyParts, WriteBackStats,
    HELD_WRITES_FILE, MAX_PARALLELISM_LIMIT,
};
pub use backend::{BackendType, CleanupProgress, KeyedBackendConfig, LocalKeyedBackend, StateSize};
pub use codec::StateCodec;
pub use descriptor::{
    AggregateFunction, AggregatingStateDescriptor, ListStateDescriptor, MapStateDescriptor,
    ReduceFn, ReducingStateDescriptor, StateKind, ValueStateDescriptor,
};
pub use error::{StateError, StateErrorKind};
pub use handle::{
    AggregatingState, ListState, MapEntries, MapState, ReducingState, ValueState,
    MAP_ITERATION_CHUNK,
};
pub use key_group::{KeyGroup, KeyGroupRange, StableHasher};
pub use operator::{
    redistribute, split_range, BroadcastState, DistributionMode, OperatorListState,
    OperatorStateImage, OperatorStateSnapshot, OperatorStateStore, SNAPSHOT_FORMAT_VERSION,
};
pub use prefetch::{prefetch, prefetch_bytes};
pub use ttl::{Clock, ManualClock, StateTtlConfig, StateVisibility, SystemClock, TtlUpdateType};

use std::fmt::Debug;
use std::hash::Hash;

/// What a key (or namespace, or map key) of keyed state must be: hashable for key groups and
/// heap maps, comparable, clonable, printable for error messages. The RocksDB backend also
/// needs [`StateCodec`].
pub trait StateKey: Hash + Eq + Clone + Debug + 'static {}

impl<T: Hash + Eq + Clone + Debug + 'static> StateKey for T {}

/// What a stored value must be: encodable (RocksDB, snapshots) and clonable (heap reads hand
/// out copies).
pub trait StateValue: StateCodec + Clone {}

impl<T: StateCodec + Clone> StateValue for T {}
