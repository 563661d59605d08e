//! The RocksDB state backend (`state.backend.type: rocksdb`).
//!
//! A slot's [`RocksDbInstance`] is shared by the keyed backends of the slot's operators; each
//! operator's states live in column families named after the operator, so operators never see
//! each other's data. See [`key`] for the key layout, `value.rs` for the value layout, and
//! [`slot`] for memory and checkpoints.

pub(crate) mod cache;
pub(crate) mod canonical;
pub(crate) mod held;
pub(crate) mod key;
pub(crate) mod slot;
pub(crate) mod states;
pub(crate) mod value;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use crate::backend::context::KeyCodec;
use crate::backend::StateSize;
use crate::descriptor::StateKind;
use crate::error::StateError;
use crate::key_group::KeyGroupRange;
use crate::ttl::{is_expired, StateTtlConfig, TtlPolicy};

pub use cache::WriteBackStats;
pub use canonical::SnapshotShape;
pub use held::HELD_WRITES_FILE;
pub use key::{split_key, StateKeyParts, MAX_PARALLELISM_LIMIT};
pub use slot::{
    HeldCapture, NativeCheckpoint, NativeFile, NativeSource, RawEntries, RocksDbConfig,
    RocksDbInstance, RocksDbMemoryUsage, RocksDbSlot,
};

use states::RocksColumn;
use value::{list_elements, parse_frame, ColumnLayout};

/// The RocksDB side of one operator's keyed backend.
pub(crate) struct RocksStorage {
    slot: Arc<RocksDbInstance>,
    operator: String,
    columns: RefCell<Vec<Rc<RocksColumn>>>,
}

impl RocksStorage {
    pub(crate) fn new(
        slot: Arc<RocksDbInstance>,
        operator: &str,
    ) -> Result<RocksStorage, StateError> {
        if operator.is_empty() || operator.contains(':') {
            return Err(StateError::invalid_config(
                "operator id",
                format!("'{operator}'"),
                "use a non-empty operator id without ':' (it names RocksDB column families)",
            ));
        }
        Ok(RocksStorage {
            slot,
            operator: operator.to_string(),
            columns: RefCell::new(Vec::new()),
        })
    }

    pub(crate) fn slot(&self) -> &Arc<RocksDbInstance> {
        &self.slot
    }

    /// The operator whose states these are.
    pub(crate) fn operator(&self) -> &str {
        &self.operator
    }

    /// Creates (or reopens) the column family of a state.
    /// The state's values are `value_type` (list elements, map values, an aggregating
    /// state's accumulator), a map's keys `user_key_type`: the registration is recorded, and
    /// one recorded with other types is refused (`canonical.rs`).
    pub(crate) fn create_column(
        &self,
        state: &str,
        kind: StateKind,
        ttl: Option<&StateTtlConfig>,
        (value_type, user_key_type): (&str, Option<&str>),
    ) -> Result<Rc<RocksColumn>, StateError> {
        let layout = match kind {
            StateKind::List => ColumnLayout::List,
            _ => ColumnLayout::Single,
        };
        self.slot.record_state(
            &self.operator,
            &crate::backend::keyed_snapshot::StateHeader {
                name: state.to_string(),
                kind,
                value_type: value_type.to_string(),
                user_key_type: user_key_type.map(str::to_string),
                has_ttl: ttl.is_some(),
            },
        )?;
        let name = format!("{}:{}:{}", layout.tag(), self.operator, state);
        self.slot.ensure_column_family(&name, layout)?;
        let column = Rc::new(RocksColumn::new(
            state,
            kind,
            layout,
            name,
            TtlPolicy::new(ttl, self.slot.clock()),
            Arc::clone(&self.slot),
        )?);
        self.columns.borrow_mut().push(Rc::clone(&column));
        Ok(column)
    }

    fn column(&self, state: &str) -> Result<Rc<RocksColumn>, StateError> {
        self.columns
            .borrow()
            .iter()
            .find(|column| &*column.state == state)
            .cloned()
            .ok_or_else(|| StateError::unknown_state(state))
    }

    /// The column family of a registered state.
    pub(crate) fn column_family(&self, state: &str) -> Option<String> {
        self.column(state)
            .ok()
            .map(|column| column.column_family.clone())
    }

    /// The live `(key, namespace)` pairs of `state` in `key_groups`, in key order.
    pub(crate) fn keys<K, N>(
        &self,
        codec: &KeyCodec<K, N>,
        state: &str,
        key_groups: KeyGroupRange,
    ) -> Result<Vec<(K, Option<N>)>, StateError> {
        let column = self.column(state)?;
        let now = self.slot.clock().now_ms();
        let mut keys = Vec::new();
        let mut last_prefix: Vec<u8> = Vec::new();
        for entry in self.slot.raw_entries(&column.column_family, key_groups)? {
            let (key, value) = entry?;
            let parts = split_key(&key).ok_or_else(|| {
                column.corrupt(
                    "key",
                    std::any::type_name::<K>(),
                    key.len(),
                    "does not follow the key layout",
                )
            })?;
            let prefix = &key[..parts.prefix_len];
            if prefix == last_prefix.as_slice() {
                continue;
            }
            let live = match column.layout {
                ColumnLayout::Single => {
                    parse_frame(&value).is_ok_and(|frame| !is_expired(frame.expires_at, now))
                }
                ColumnLayout::List => list_elements(&value).any(|element| {
                    element
                        .and_then(parse_frame)
                        .is_ok_and(|frame| !is_expired(frame.expires_at, now))
                }),
            };
            if !live {
                continue;
            }
            last_prefix.clear();
            last_prefix.extend_from_slice(prefix);
            let decoded_key = (codec.decode_key)(parts.key).map_err(|error| {
                column.corrupt("key", std::any::type_name::<K>(), parts.key.len(), error)
            })?;
            let namespace = match parts.namespace {
                None => None,
                Some(bytes) => Some((codec.decode_namespace)(bytes).map_err(|error| {
                    column.corrupt("namespace", std::any::type_name::<N>(), bytes.len(), error)
                })?),
            };
            keys.push((decoded_key, namespace));
        }
        Ok(keys)
    }

    /// Deletes `key_groups` from every column family of this operator, registered in this run
    /// or not.
    pub(crate) fn delete_key_groups(&self, key_groups: KeyGroupRange) -> Result<(), StateError> {
        for name in self.slot.column_families()? {
            let ours = name.split_once(':').is_some_and(|(tag, rest)| {
                ColumnLayout::from_tag(tag).is_some()
                    && rest
                        .strip_prefix(self.operator.as_str())
                        .is_some_and(|state| state.starts_with(':'))
            });
            if ours {
                self.slot.delete_key_groups(&name, key_groups)?;
            }
        }
        Ok(())
    }

    /// RocksDB's size estimates per registered state: live SST data plus memtables, after the
    /// write-back cache has written back (if that fails, the estimates leave its dirty entries
    /// out, and the next access reports the error).
    pub(crate) fn sizes(&self) -> Vec<StateSize> {
        if let Err(error) = self.slot.flush_write_back() {
            tracing::warn!(%error, "size estimates without the write-back cache's entries");
        }
        let db = self.slot.db();
        self.columns
            .borrow()
            .iter()
            .map(|column| {
                let property = |name: &str| -> u64 {
                    db.property_int_value_cf(column.cf(), name)
                        .ok()
                        .flatten()
                        .unwrap_or(0)
                };
                StateSize {
                    name: column.state.to_string(),
                    kind: column.kind,
                    entries: property("rocksdb.estimate-num-keys"),
                    estimated_bytes: property("rocksdb.estimate-live-data-size")
                        + property("rocksdb.cur-size-all-mem-tables"),
                }
            })
            .collect()
    }
}
