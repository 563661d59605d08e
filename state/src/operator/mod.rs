//! Operator (non-keyed) state: what sources, sinks and other operators without a key keep per
//! subtask (Flink's `OperatorStateStore`).
//!
//! - [`OperatorStateStore`]: one per operator subtask, shard-bound. An operator registers its
//!   states in `open`: [`OperatorStateStore::list_state`] (a list split evenly across the new
//!   subtasks on restore, e.g. a source's partition offsets),
//!   [`OperatorStateStore::union_list_state`] (every new subtask gets all elements) and
//!   [`OperatorStateStore::broadcast_state`] (a map every subtask holds identically).
//! - [`OperatorStateSnapshot`]: the encoded image of one subtask's states, taken at once by
//!   [`OperatorStateStore::snapshot`], with a checksummed byte format for checkpoint files.
//! - [`redistribute`]: Flink's rules for handing the old subtasks' snapshots to the new
//!   subtasks when the parallelism changes; [`OperatorStateStore::restore`] applies them.
//!
//! Restored states stay encoded until the operator registers them (restore runs before
//! `open`); registration decodes them with the registered type. A restored state that is never
//! registered is carried into later snapshots unchanged, as in Flink.
//!
//! Operator state has no TTL (as in Flink): a descriptor with one is refused.
//!
//! ```
//! use weir_state::{ListStateDescriptor, OperatorStateSnapshot, OperatorStateStore};
//!
//! # fn main() -> Result<(), weir_state::StateError> {
//! // Two source subtasks, each reading two partitions, checkpoint their offsets ...
//! let mut checkpoint = Vec::new();
//! for subtask in 0..2u32 {
//!     let store = OperatorStateStore::new();
//!     let offsets = store.list_state(&ListStateDescriptor::<(u32, u64)>::new("offsets"))?;
//!     offsets.update([(2 * subtask, 10), (2 * subtask + 1, 20)]);
//!     checkpoint.push(store.snapshot()?.to_bytes()?);
//! }
//! // ... and the job restarts with three subtasks: 4 offsets split as 2, 1, 1.
//! let old = checkpoint
//!     .iter()
//!     .map(|bytes| OperatorStateSnapshot::from_bytes(bytes))
//!     .collect::<Result<Vec<_>, _>>()?;
//! let store = OperatorStateStore::restore(&old, 1, 3)?;
//! let offsets = store.list_state(&ListStateDescriptor::<(u32, u64)>::new("offsets"))?;
//! assert_eq!(offsets.get(), vec![(2, 10)]);
//! # Ok(())
//! # }
//! ```

mod handle;
mod redistribute;
mod snapshot;

pub use self::handle::{BroadcastState, OperatorListState};
pub use self::redistribute::{redistribute, split_range};
pub use self::snapshot::{
    DistributionMode, OperatorStateImage, OperatorStateSnapshot, SNAPSHOT_FORMAT_VERSION,
};

use std::any::TypeId;
use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;

use indexmap::IndexMap;

use crate::codec::StateCodec;
use crate::descriptor::{ListStateDescriptor, MapStateDescriptor, StateSignature};
use crate::error::{StateError, StateErrorKind};
use crate::ttl::StateTtlConfig;
use crate::{StateKey, StateValue};

use self::handle::{ListTable, MapTable, OperatorTable};

/// What identifies an operator state registration: mode and types.
#[derive(Clone, Debug, PartialEq, Eq)]
struct OperatorStateSignature {
    mode: DistributionMode,
    types: TypeId,
    type_names: String,
}

impl OperatorStateSignature {
    /// The signature of a descriptor registered in `mode`; a descriptor with TTL is refused.
    fn new(
        name: &str,
        mode: DistributionMode,
        keyed: StateSignature,
        ttl: Option<&StateTtlConfig>,
    ) -> Result<Self, StateError> {
        let signature = OperatorStateSignature {
            mode,
            types: keyed.types,
            type_names: keyed.type_names,
        };
        if ttl.is_some() {
            return Err(StateErrorKind::OperatorStateTtl {
                state: name.to_string(),
                kind: signature.to_string(),
            }
            .into());
        }
        Ok(signature)
    }
}

impl fmt::Display for OperatorStateSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.mode.describe(&self.type_names))
    }
}

/// One state name of the store.
enum Slot {
    /// Restored and not registered yet: still encoded.
    Restored(OperatorStateImage),
    /// Registered: a typed table.
    Registered {
        signature: OperatorStateSignature,
        name: Rc<str>,
        table: Rc<dyn OperatorTable>,
    },
}

/// The operator state of one operator subtask (see the module docs). Shard-bound (`!Send`):
/// one per subtask, used from its shard's thread.
#[derive(Default)]
pub struct OperatorStateStore {
    states: RefCell<IndexMap<String, Slot>>,
    restored: bool,
}

impl OperatorStateStore {
    /// An empty store, for a subtask that starts without a checkpoint.
    pub fn new() -> Self {
        OperatorStateStore::default()
    }

    /// The store of subtask `subtask` of `parallelism`, restored from `old` — the snapshots of
    /// all old subtasks, in subtask order — by the rules of [`redistribute`].
    pub fn restore(
        old: &[OperatorStateSnapshot],
        subtask: u32,
        parallelism: u32,
    ) -> Result<Self, StateError> {
        let share = redistribute(old, subtask, parallelism)?;
        tracing::debug!(
            subtask,
            parallelism,
            old_parallelism = old.len(),
            states = share.states().len(),
            "restored operator state"
        );
        Ok(OperatorStateStore::from_snapshot(share))
    }

    /// A store holding exactly the states of `snapshot` (already this subtask's share).
    pub fn from_snapshot(snapshot: OperatorStateSnapshot) -> Self {
        let states = snapshot
            .into_states()
            .into_iter()
            .map(|image| (image.name().to_string(), Slot::Restored(image)))
            .collect();
        OperatorStateStore {
            states: RefCell::new(states),
            restored: true,
        }
    }

    /// Whether the store was restored from a checkpoint (Flink's `isRestored`): a source then
    /// resumes from its state instead of its configured start position.
    pub fn is_restored(&self) -> bool {
        self.restored
    }

    /// Registers (or returns) the list state `descriptor` names, split evenly across the new
    /// subtasks when the parallelism changes (Flink's `getListState`).
    pub fn list_state<T: StateValue>(
        &self,
        descriptor: &ListStateDescriptor<T>,
    ) -> Result<OperatorListState<T>, StateError> {
        self.list(descriptor, DistributionMode::SplitDistribute)
    }

    /// Registers (or returns) the list state `descriptor` names, of which every subtask gets
    /// all elements of all old subtasks on restore (Flink's `getUnionListState`).
    pub fn union_list_state<T: StateValue>(
        &self,
        descriptor: &ListStateDescriptor<T>,
    ) -> Result<OperatorListState<T>, StateError> {
        self.list(descriptor, DistributionMode::Union)
    }

    /// Registers (or returns) the broadcast state `descriptor` names: a map every subtask holds
    /// identically (Flink's `getBroadcastState`).
    pub fn broadcast_state<K, V>(
        &self,
        descriptor: &MapStateDescriptor<K, V>,
    ) -> Result<BroadcastState<K, V>, StateError>
    where
        K: StateKey + StateCodec,
        V: StateValue,
    {
        let signature = OperatorStateSignature::new(
            descriptor.name(),
            DistributionMode::Broadcast,
            descriptor.signature(),
            descriptor.ttl(),
        )?;
        let (name, table) = self.register(descriptor.name(), signature, MapTable::<K, V>::new)?;
        Ok(BroadcastState::new(name, table))
    }

    fn list<T: StateValue>(
        &self,
        descriptor: &ListStateDescriptor<T>,
        mode: DistributionMode,
    ) -> Result<OperatorListState<T>, StateError> {
        let signature = OperatorStateSignature::new(
            descriptor.name(),
            mode,
            descriptor.signature(),
            descriptor.ttl(),
        )?;
        let union = mode == DistributionMode::Union;
        let (name, table) = self.register(descriptor.name(), signature, |restored| {
            ListTable::<T>::new(union, restored)
        })?;
        Ok(OperatorListState::new(name, table))
    }

    /// The table registered as `name`, or a new one from `create`, which gets the restored
    /// image of that name if there is one.
    fn register<Table: OperatorTable + 'static>(
        &self,
        name: &str,
        signature: OperatorStateSignature,
        create: impl FnOnce(Option<&OperatorStateImage>) -> Result<Rc<Table>, StateError>,
    ) -> Result<(Rc<str>, Rc<Table>), StateError> {
        let mut states = self.states.borrow_mut();
        let table = match states.get(name) {
            Some(Slot::Registered {
                signature: registered,
                name: shared_name,
                table,
            }) => {
                let mismatch = || -> StateError {
                    StateErrorKind::IncompatibleRegistration {
                        state: name.to_string(),
                        registered: registered.to_string(),
                        requested: signature.to_string(),
                    }
                    .into()
                };
                if *registered != signature {
                    return Err(mismatch());
                }
                let table = Rc::clone(table)
                    .into_any()
                    .downcast::<Table>()
                    .map_err(|_| mismatch())?;
                return Ok((Rc::clone(shared_name), table));
            }
            Some(Slot::Restored(image)) => {
                if image.mode() != signature.mode {
                    return Err(StateErrorKind::IncompatibleRestore {
                        state: name.to_string(),
                        restored: image.describe(),
                        requested: signature.to_string(),
                    }
                    .into());
                }
                create(Some(image))?
            }
            None => create(None)?,
        };
        let shared_name: Rc<str> = Rc::from(name);
        states.insert(
            name.to_string(),
            Slot::Registered {
                signature,
                name: Rc::clone(&shared_name),
                table: Rc::clone(&table) as Rc<dyn OperatorTable>,
            },
        );
        Ok((shared_name, table))
    }

    /// The names of all states: registered ones and restored ones not registered yet, in
    /// registration (restored: checkpoint) order.
    pub fn state_names(&self) -> Vec<String> {
        self.states.borrow().keys().cloned().collect()
    }

    /// An encoded image of every state as it is now; later writes do not change it. Restored
    /// states that were never registered are included as restored.
    pub fn snapshot(&self) -> Result<OperatorStateSnapshot, StateError> {
        let states = self.states.borrow();
        let mut images = Vec::with_capacity(states.len());
        for (name, slot) in states.iter() {
            images.push(match slot {
                Slot::Restored(image) => image.clone(),
                Slot::Registered {
                    signature, table, ..
                } => OperatorStateImage::new(
                    name.clone(),
                    signature.type_names.clone(),
                    table.encode(name)?,
                ),
            });
        }
        Ok(OperatorStateSnapshot::new(images))
    }
}

impl fmt::Debug for OperatorStateStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperatorStateStore")
            .field("states", &self.states.try_borrow().map(|s| s.len()).ok())
            .field("restored", &self.restored)
            .finish()
    }
}
