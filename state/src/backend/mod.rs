//! The keyed state backend of one keyed operator instance on one shard.
//!
//! [`LocalKeyedBackend`] holds the current key (and namespace), the registered states and their
//! storage — typed maps on the heap, or column families of the slot's [`RocksDbInstance`]. The
//! engine sets the current key before it hands a record (or a timer) to the operator; the
//! operator's state handles then act on that key. The backend is shard-bound (`!Send`): one
//! instance per operator subtask, used from its shard's thread only.

pub(crate) mod context;
pub(crate) mod heap;
pub(crate) mod keyed_chain;
pub(crate) mod keyed_entries;
pub(crate) mod keyed_snapshot;
mod registry;
pub(crate) mod rocksdb;

use std::any::type_name;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;

use crate::codec::StateCodec;
use crate::descriptor::{
    AggregatingStateDescriptor, ListStateDescriptor, MapStateDescriptor, ReducingStateDescriptor,
    StateKind, StateSignature, ValueStateDescriptor,
};
use crate::error::StateError;
use crate::handle::{
    AggregatingState, Aggregator, ListState, MapState, ReducingState, ValueAccess, ValueState,
};
use crate::key_group::{KeyGroup, KeyGroupRange};
use crate::ttl::{Clock, StateTtlConfig};
use crate::{StateKey, StateValue};

use self::context::{KeyCodec, KeyContext};
use self::heap::restore::{KeyDecoder, RestoreSummary};
use self::heap::snapshot::HeapSnapshot;
use self::heap::states::{HeapList, HeapMap, HeapValue};
use self::heap::table::{Entry, FastMap};
use self::heap::HeapStorage;
use self::registry::Registry;
use self::rocksdb::key::MAX_PARALLELISM_LIMIT;
use self::rocksdb::states::{RocksList, RocksMap, RocksValue};
use self::rocksdb::{RocksDbInstance, RocksStorage};

/// Which storage a backend uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendType {
    /// Typed maps on the heap.
    Heap,
    /// A RocksDB instance of the operator subtask (`state.backend.type: rocksdb`).
    RocksDb,
}

impl BackendType {
    /// Its name as `state.backend.type` spells it.
    pub fn config_name(self) -> &'static str {
        match self {
            BackendType::Heap => "hashmap",
            BackendType::RocksDb => "rocksdb",
        }
    }
}

/// The key groups a keyed backend serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyedBackendConfig {
    /// `pipeline.max-parallelism`: the number of key groups (at most 32768).
    pub max_parallelism: u32,
    /// The key groups of this operator subtask.
    pub key_groups: KeyGroupRange,
}

impl KeyedBackendConfig {
    /// The config of subtask `subtask` of `parallelism`.
    pub fn for_subtask(max_parallelism: u32, parallelism: u32, subtask: u32) -> Self {
        KeyedBackendConfig {
            max_parallelism,
            key_groups: KeyGroupRange::for_subtask(max_parallelism, parallelism, subtask),
        }
    }

    /// All key groups (parallelism 1).
    pub fn single(max_parallelism: u32) -> Self {
        KeyedBackendConfig::for_subtask(max_parallelism, 1, 0)
    }

    fn validate(&self) -> Result<(), StateError> {
        if self.max_parallelism == 0 || self.max_parallelism > MAX_PARALLELISM_LIMIT {
            return Err(StateError::invalid_config(
                "pipeline.max-parallelism",
                self.max_parallelism,
                format!("use 1..={MAX_PARALLELISM_LIMIT} (the default is 128)"),
            ));
        }
        if self.key_groups.is_empty() || self.key_groups.end >= self.max_parallelism {
            return Err(StateError::invalid_config(
                "key group range",
                format!("{}..={}", self.key_groups.start, self.key_groups.end),
                format!(
                    "use a non-empty range below max parallelism {}",
                    self.max_parallelism
                ),
            ));
        }
        Ok(())
    }
}

/// The estimated size of one state, for budget errors and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateSize {
    /// The state name.
    pub name: String,
    /// Its kind.
    pub kind: StateKind,
    /// Number of `(key, namespace)` entries (RocksDB: its estimate of keys, map entries count
    /// one each).
    pub entries: u64,
    /// Estimated bytes: heap, see `backend/heap/table.rs`; RocksDB, live SST data plus
    /// memtables.
    pub estimated_bytes: u64,
}

/// What one call of [`LocalKeyedBackend::cleanup_expired`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanupProgress {
    /// Entries examined.
    pub examined: usize,
    /// Entries removed because everything in them had expired.
    pub removed: usize,
    /// Whether the call finished a pass over all states (the next starts from the beginning).
    pub round_complete: bool,
}

enum Storage<K, N> {
    Heap(HeapStorage<K, N>),
    RocksDb(RocksStorage),
}

/// The keyed state of one operator subtask (see the module docs). `K` is the key type, `N` the
/// namespace type (the window type for window state; `()` when unused).
pub struct LocalKeyedBackend<K, N = ()> {
    context: Rc<KeyContext<K, N>>,
    registry: Registry,
    storage: Storage<K, N>,
}

fn encode_with<T: StateCodec>(value: &T, out: &mut Vec<u8>) -> Result<(), ::rkyv::rancor::Error> {
    value.encode_into(out)
}

fn decode_with<T: StateCodec>(bytes: &[u8]) -> Result<T, ::rkyv::rancor::Error> {
    T::decode(bytes)
}

impl<K: StateKey, N: StateKey> LocalKeyedBackend<K, N> {
    /// A heap backend. `clock` is the processing-time clock of TTL.
    pub fn heap(config: KeyedBackendConfig, clock: Arc<dyn Clock>) -> Result<Self, StateError> {
        config.validate()?;
        Ok(LocalKeyedBackend {
            context: Rc::new(KeyContext::new(
                config.max_parallelism,
                config.key_groups,
                None,
            )),
            registry: Registry::default(),
            storage: Storage::Heap(HeapStorage::new(
                clock,
                config.max_parallelism,
                config.key_groups,
            )),
        })
    }

    /// A RocksDB backend for operator `operator_id` (unique within the job, without ':'),
    /// storing its states in `slot`. TTL uses the slot's clock.
    pub fn rocksdb(
        config: KeyedBackendConfig,
        slot: Arc<RocksDbInstance>,
        operator_id: &str,
    ) -> Result<Self, StateError>
    where
        K: StateCodec,
        N: StateCodec,
    {
        config.validate()?;
        let codec = KeyCodec {
            encode_key: encode_with::<K>,
            encode_namespace: encode_with::<N>,
            decode_key: decode_with::<K>,
            decode_namespace: decode_with::<N>,
        };
        Ok(LocalKeyedBackend {
            context: Rc::new(KeyContext::new(
                config.max_parallelism,
                config.key_groups,
                Some(codec),
            )),
            registry: Registry::default(),
            storage: Storage::RocksDb(RocksStorage::new(slot, operator_id)?),
        })
    }

    /// Which storage this backend uses.
    pub fn backend_type(&self) -> BackendType {
        match self.storage {
            Storage::Heap(_) => BackendType::Heap,
            Storage::RocksDb(_) => BackendType::RocksDb,
        }
    }

    /// The number of key groups.
    pub fn max_parallelism(&self) -> u32 {
        self.context.max_parallelism()
    }

    /// The key groups this backend serves.
    pub fn key_groups(&self) -> KeyGroupRange {
        self.context.key_groups()
    }

    /// Makes `key` the key every state handle acts on. Fails if the key's group is not served
    /// here (a routing bug) or, on RocksDB, if the key does not encode.
    #[inline]
    pub fn set_current_key(&self, key: &K) -> Result<(), StateError> {
        self.context.set_key(key)
    }

    /// The current key.
    pub fn current_key(&self) -> Option<K> {
        self.context.key()
    }

    /// The key group of the current key.
    pub fn current_key_group(&self) -> Option<KeyGroup> {
        self.context.key_group()
    }

    /// Scopes state access to `namespace` (e.g. a window) until it is changed or cleared.
    pub fn set_current_namespace(&self, namespace: N) -> Result<(), StateError> {
        self.context.set_namespace(Some(namespace))
    }

    /// [`LocalKeyedBackend::set_current_key`] and [`LocalKeyedBackend::set_current_namespace`]
    /// in one, for an access to another key's state in another namespace (a window's pane):
    /// what depends on the namespace is derived once, not for the old one and then the new.
    #[inline]
    pub fn set_current_key_and_namespace(&self, key: &K, namespace: N) -> Result<(), StateError> {
        self.context.set_key_and_namespace(key, Some(namespace))
    }

    /// Goes back to the state outside any namespace.
    pub fn clear_current_namespace(&self) -> Result<(), StateError> {
        self.context.set_namespace(None)
    }

    /// The current namespace.
    pub fn current_namespace(&self) -> Option<N> {
        self.context.namespace()
    }

    /// Registers (or finds) a value state.
    pub fn value_state<T: StateValue>(
        &self,
        descriptor: &ValueStateDescriptor<T>,
    ) -> Result<ValueState<T>, StateError> {
        let access =
            self.value_access::<T>(descriptor.name(), descriptor.signature(), descriptor.ttl())?;
        Ok(ValueState::new(access))
    }

    /// Registers (or finds) a reducing state.
    pub fn reducing_state<T: StateValue>(
        &self,
        descriptor: &ReducingStateDescriptor<T>,
    ) -> Result<ReducingState<T>, StateError> {
        let access =
            self.value_access::<T>(descriptor.name(), descriptor.signature(), descriptor.ttl())?;
        Ok(ReducingState::new(
            access,
            Arc::clone(descriptor.reduce_fn()),
        ))
    }

    /// Registers (or finds) an aggregating state.
    pub fn aggregating_state<IN: 'static, ACC: StateValue, OUT: 'static>(
        &self,
        descriptor: &AggregatingStateDescriptor<IN, ACC, OUT>,
    ) -> Result<AggregatingState<IN, OUT>, StateError> {
        let accumulator =
            self.value_access::<ACC>(descriptor.name(), descriptor.signature(), descriptor.ttl())?;
        Ok(AggregatingState::new(Rc::new(Aggregator {
            accumulator,
            function: Arc::clone(descriptor.function()),
        })))
    }

    /// Registers (or finds) a list state.
    pub fn list_state<T: StateValue>(
        &self,
        descriptor: &ListStateDescriptor<T>,
    ) -> Result<ListState<T>, StateError> {
        let (name, signature, ttl) = (descriptor.name(), descriptor.signature(), descriptor.ttl());
        match &self.storage {
            Storage::Heap(heap) => {
                let table = self.registry.get_or_register(name, signature, || {
                    heap.create_table::<Vec<Entry<T>>>(name, StateKind::List, ttl)
                })?;
                Ok(ListState::new(Rc::new(HeapList {
                    context: Rc::clone(&self.context),
                    table,
                })))
            }
            Storage::RocksDb(rocks) => {
                let column = self.registry.get_or_register(name, signature, || {
                    rocks.create_column(name, StateKind::List, ttl, (type_name::<T>(), None))
                })?;
                Ok(ListState::new(Rc::new(RocksList::<K, N, T> {
                    context: Rc::clone(&self.context),
                    column,
                    _value: PhantomData,
                })))
            }
        }
    }

    /// Registers (or finds) a map state.
    pub fn map_state<UK: StateKey + StateCodec, UV: StateValue>(
        &self,
        descriptor: &MapStateDescriptor<UK, UV>,
    ) -> Result<MapState<UK, UV>, StateError> {
        let (name, signature, ttl) = (descriptor.name(), descriptor.signature(), descriptor.ttl());
        match &self.storage {
            Storage::Heap(heap) => {
                let table = self.registry.get_or_register(name, signature, || {
                    heap.create_table::<FastMap<UK, Entry<UV>>>(name, StateKind::Map, ttl)
                })?;
                Ok(MapState::new(Rc::new(HeapMap {
                    context: Rc::clone(&self.context),
                    table,
                })))
            }
            Storage::RocksDb(rocks) => {
                let column = self.registry.get_or_register(name, signature, || {
                    rocks.create_column(
                        name,
                        StateKind::Map,
                        ttl,
                        (type_name::<UV>(), Some(type_name::<UK>())),
                    )
                })?;
                Ok(MapState::new(Rc::new(RocksMap::<K, N, UK, UV> {
                    context: Rc::clone(&self.context),
                    column,
                    _types: PhantomData,
                })))
            }
        }
    }

    fn value_access<T: StateValue>(
        &self,
        name: &str,
        signature: StateSignature,
        ttl: Option<&StateTtlConfig>,
    ) -> Result<Rc<dyn ValueAccess<T>>, StateError> {
        let kind = signature.kind;
        match &self.storage {
            Storage::Heap(heap) => {
                let table = self.registry.get_or_register(name, signature, || {
                    heap.create_table::<Entry<T>>(name, kind, ttl)
                })?;
                Ok(Rc::new(HeapValue {
                    context: Rc::clone(&self.context),
                    table,
                }))
            }
            Storage::RocksDb(rocks) => {
                let column = self.registry.get_or_register(name, signature, || {
                    rocks.create_column(name, kind, ttl, (type_name::<T>(), None))
                })?;
                Ok(Rc::new(RocksValue::<K, N, T> {
                    context: Rc::clone(&self.context),
                    column,
                    _value: PhantomData,
                }))
            }
        }
    }

    /// Names of the registered states, in registration order.
    pub fn state_names(&self) -> Vec<String> {
        self.registry.names()
    }

    /// The kind of a registered state.
    pub fn state_kind(&self, state: &str) -> Option<StateKind> {
        self.registry
            .signature(state)
            .map(|signature| signature.kind)
    }

    /// The `(key, namespace)` pairs that hold live (unexpired) data of `state` in `key_groups`
    /// (Flink's `getKeys`): for rescaling, timers and tests. Heap: grouped by key group;
    /// RocksDB: in key order.
    pub fn keys(
        &self,
        state: &str,
        key_groups: KeyGroupRange,
    ) -> Result<Vec<(K, Option<N>)>, StateError> {
        match &self.storage {
            Storage::Heap(heap) => heap.keys(state, key_groups),
            Storage::RocksDb(rocks) => {
                let codec = self
                    .context
                    .codec()
                    .expect("a RocksDB backend is built with a key codec");
                rocks.keys(codec, state, key_groups)
            }
        }
    }

    /// Deletes all state of `key_groups` (after they moved to another subtask). Heap: the
    /// key groups' maps are dropped; RocksDB: one range deletion per column family of this
    /// operator, including states not registered in this run.
    pub fn delete_key_groups(&self, key_groups: KeyGroupRange) -> Result<(), StateError> {
        match &self.storage {
            Storage::Heap(heap) => {
                heap.delete_key_groups(key_groups);
                Ok(())
            }
            Storage::RocksDb(rocks) => rocks.delete_key_groups(key_groups),
        }
    }

    /// Estimated size of every registered state (see [`StateSize`]), largest first.
    pub fn state_sizes(&self) -> Vec<StateSize> {
        let mut sizes = match &self.storage {
            Storage::Heap(heap) => heap.sizes(),
            Storage::RocksDb(rocks) => rocks.sizes(),
        };
        sizes.sort_by_key(|size| std::cmp::Reverse(size.estimated_bytes));
        sizes
    }

    /// Removes expired entries, examining at most `max_entries` of them and continuing where
    /// the previous call stopped; the engine calls it periodically (e.g. from the background
    /// task queue). Heap only: RocksDB drops expired entries in its compaction filter, so on
    /// RocksDB this examines nothing and reports a complete round.
    pub fn cleanup_expired(&self, max_entries: usize) -> CleanupProgress {
        match &self.storage {
            Storage::Heap(heap) => heap.cleanup_expired(max_entries),
            Storage::RocksDb(_) => CleanupProgress {
                examined: 0,
                removed: 0,
                round_complete: true,
            },
        }
    }

    /// Takes over keyed state from checkpoint snapshots ([`crate::encode_keyed_snapshot`]'s
    /// bytes): one snapshot, or several when the job was rescaled (those of the old subtasks
    /// whose key groups overlap this one's). Only entries of this backend's key groups are
    /// kept. Call it once, before any state is registered: each state's entries stay encoded
    /// until the operator registers it, which then checks that the kind and types are those it
    /// was checkpointed with and decodes them; states nobody registers are carried into every
    /// later snapshot unchanged. See `backend/heap/restore.rs` for TTL and rescaling.
    ///
    /// Damaged or truncated bytes are a [`crate::StateErrorKind::CorruptSnapshot`] error,
    /// snapshots of another max parallelism, key or namespace type an
    /// [`crate::StateErrorKind::IncompatibleKeyedSnapshot`] one. On RocksDB (a fresh instance)
    /// the entries go into the instance at once and each state is recorded with its types,
    /// which its registration is then checked against
    /// ([`RocksDbInstance::load_keyed_snapshots`]).
    ///
    /// The heap keeps the snapshots' bytes until the states are registered: this copies each
    /// snapshot whole first (other subtasks' key groups too);
    /// [`LocalKeyedBackend::restore_shared`] takes shared bytes as they are.
    pub fn restore(&self, snapshots: &[&[u8]]) -> Result<RestoreSummary, StateError>
    where
        K: StateCodec,
        N: StateCodec,
    {
        let shared: Vec<Bytes> = snapshots
            .iter()
            .map(|bytes| Bytes::copy_from_slice(bytes))
            .collect();
        self.restore_shared(&shared)
    }

    /// [`LocalKeyedBackend::restore`] from bytes the heap shares, not copies: a restored
    /// state's entries stay in the snapshot's own bytes (a state file read once) until the
    /// state is registered.
    pub fn restore_shared(&self, snapshots: &[Bytes]) -> Result<RestoreSummary, StateError>
    where
        K: StateCodec,
        N: StateCodec,
    {
        match &self.storage {
            Storage::Heap(heap) => {
                let summary = heap.restore(
                    snapshots,
                    KeyDecoder {
                        key: decode_with::<K>,
                        namespace: decode_with::<N>,
                    },
                )?;
                tracing::info!(
                    key_groups = ?self.key_groups(),
                    snapshots = summary.snapshots,
                    states = summary.states,
                    entries = summary.entries,
                    entries_elsewhere = summary.entries_elsewhere,
                    bytes = summary.bytes,
                    "restored keyed state"
                );
                Ok(summary)
            }
            Storage::RocksDb(rocks) => {
                let shape = rocksdb::SnapshotShape {
                    max_parallelism: self.max_parallelism(),
                    key_groups: self.key_groups(),
                    key_type: type_name::<K>(),
                    namespace_type: type_name::<N>(),
                };
                let entries =
                    rocks
                        .slot()
                        .load_keyed_snapshots(rocks.operator(), snapshots, shape)?;
                tracing::info!(
                    key_groups = ?self.key_groups(),
                    snapshots = snapshots.len(),
                    entries,
                    "restored keyed state into RocksDB"
                );
                Ok(RestoreSummary {
                    snapshots: snapshots.len(),
                    entries,
                    ..RestoreSummary::default()
                })
            }
        }
    }

    /// Names of the states a restore brought that no descriptor registered yet, in checkpoint
    /// order (always empty on RocksDB).
    pub fn restored_state_names(&self) -> Vec<String> {
        match &self.storage {
            Storage::Heap(heap) => heap.restored_names(),
            Storage::RocksDb(_) => Vec::new(),
        }
    }

    /// A consistent snapshot of all heap state, taken in O(states × key groups); writes go on
    /// and do not change it. It includes restored states not registered yet, still encoded;
    /// [`crate::encode_keyed_snapshot`] writes it in the checkpoint format. `None` on RocksDB,
    /// whose snapshot is [`RocksDbInstance::create_checkpoint`].
    pub fn heap_snapshot(&self) -> Option<HeapSnapshot<K, N>> {
        match &self.storage {
            Storage::Heap(heap) => Some(heap.snapshot()),
            Storage::RocksDb(_) => None,
        }
    }

    /// The slot database of a RocksDB backend.
    pub fn rocksdb_slot(&self) -> Option<&Arc<RocksDbInstance>> {
        match &self.storage {
            Storage::Heap(_) => None,
            Storage::RocksDb(rocks) => Some(rocks.slot()),
        }
    }

    /// The column family of a registered state on a RocksDB backend (for
    /// [`RocksDbInstance::raw_entries`]).
    pub fn column_family(&self, state: &str) -> Option<String> {
        match &self.storage {
            Storage::Heap(_) => None,
            Storage::RocksDb(rocks) => rocks.column_family(state),
        }
    }
}

impl<K, N> std::fmt::Debug for LocalKeyedBackend<K, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match self.storage {
            Storage::Heap(_) => BackendType::Heap,
            Storage::RocksDb(_) => BackendType::RocksDb,
        };
        f.debug_struct("LocalKeyedBackend")
            .field("backend", &backend)
            .field("states", &self.registry.names())
            .finish_non_exhaustive()
    }
}
