//! Handles to operator state and the typed tables behind them.
//!
//! A handle is cheap to clone and shard-bound (`!Send`), like the store it came from. Every
//! handle registered under one name shares one table. Operator state lives on the heap and has
//! no current key, so no operation can fail: the handles return values, not `Result`s.

use std::any::{type_name, Any};
use std::cell::RefCell;
use std::fmt;
use std::rc::Rc;

use indexmap::IndexMap;

use crate::codec::StateCodec;
use crate::error::{StateError, StateErrorKind};
use crate::operator::snapshot::{OperatorStateData, OperatorStateImage};
use crate::{StateKey, StateValue};

/// A registered table: typed contents that can be encoded for a snapshot.
pub(crate) trait OperatorTable {
    /// The contents, encoded, as they are now.
    fn encode(&self, state: &str) -> Result<OperatorStateData, StateError>;
    /// For downcasting to the concrete table on a repeated registration.
    fn into_any(self: Rc<Self>) -> Rc<dyn Any>;
}

/// The elements of a split or union list state.
pub(crate) struct ListTable<T> {
    union: bool,
    elements: RefCell<Vec<T>>,
}

impl<T: StateValue> ListTable<T> {
    /// A table for a union list (`union`) or a split list, holding the elements of `restored`
    /// (decoded as `T`) or none.
    pub(crate) fn new(
        union: bool,
        restored: Option<&OperatorStateImage>,
    ) -> Result<Rc<Self>, StateError> {
        let elements = match restored {
            Some(image) => image
                .list_elements()
                .unwrap_or_default()
                .iter()
                .map(|bytes| decode::<T>(image, "list element", bytes))
                .collect::<Result<Vec<T>, StateError>>()?,
            None => Vec::new(),
        };
        Ok(Rc::new(ListTable {
            union,
            elements: RefCell::new(elements),
        }))
    }
}

impl<T: StateValue> OperatorTable for ListTable<T> {
    fn encode(&self, state: &str) -> Result<OperatorStateData, StateError> {
        let encoded = self
            .elements
            .borrow()
            .iter()
            .map(|element| encode(state, element))
            .collect::<Result<Vec<_>, StateError>>()?;
        Ok(if self.union {
            OperatorStateData::UnionList(encoded)
        } else {
            OperatorStateData::SplitList(encoded)
        })
    }

    fn into_any(self: Rc<Self>) -> Rc<dyn Any> {
        self
    }
}

/// The entries of a broadcast state, in insertion order (removal moves the last entry into the
/// gap), so equal operations on every subtask give equal snapshots.
pub(crate) struct MapTable<K, V> {
    entries: RefCell<IndexMap<K, V>>,
}

impl<K: StateKey + StateCodec, V: StateValue> MapTable<K, V> {
    /// A table holding the entries of `restored` (decoded as `K`, `V`) or none.
    pub(crate) fn new(restored: Option<&OperatorStateImage>) -> Result<Rc<Self>, StateError> {
        let mut entries = IndexMap::new();
        if let Some(image) = restored {
            for (key, value) in image.broadcast_entries().unwrap_or_default() {
                entries.insert(
                    decode::<K>(image, "broadcast key", key)?,
                    decode::<V>(image, "broadcast value", value)?,
                );
            }
        }
        Ok(Rc::new(MapTable {
            entries: RefCell::new(entries),
        }))
    }
}

impl<K: StateKey + StateCodec, V: StateValue> OperatorTable for MapTable<K, V> {
    fn encode(&self, state: &str) -> Result<OperatorStateData, StateError> {
        let encoded = self
            .entries
            .borrow()
            .iter()
            .map(|(key, value)| Ok((encode(state, key)?, encode(state, value)?)))
            .collect::<Result<Vec<_>, StateError>>()?;
        Ok(OperatorStateData::Broadcast(encoded))
    }

    fn into_any(self: Rc<Self>) -> Rc<dyn Any> {
        self
    }
}

fn encode<T: StateCodec>(state: &str, value: &T) -> Result<Vec<u8>, StateError> {
    value.encode().map_err(|error| {
        StateErrorKind::Encode {
            state: state.to_string(),
            type_name: type_name::<T>(),
            reason: error.to_string(),
        }
        .into()
    })
}

fn decode<T: StateCodec>(
    image: &OperatorStateImage,
    what: &'static str,
    bytes: &[u8],
) -> Result<T, StateError> {
    T::decode(bytes).map_err(|error| {
        StateErrorKind::Corrupt {
            state: image.name().to_string(),
            what,
            type_name: type_name::<T>(),
            len: bytes.len(),
            reason: format!("{error} (the checkpoint holds it as {})", image.describe()),
        }
        .into()
    })
}

/// A list of values per operator subtask (Flink's operator `ListState`), from
/// [`crate::OperatorStateStore::list_state`] (split on restore) or
/// [`crate::OperatorStateStore::union_list_state`] (every subtask gets all of it).
pub struct OperatorListState<T> {
    name: Rc<str>,
    table: Rc<ListTable<T>>,
}

impl<T: Clone> OperatorListState<T> {
    pub(crate) fn new(name: Rc<str>, table: Rc<ListTable<T>>) -> Self {
        OperatorListState { name, table }
    }

    /// The state name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A copy of the elements, in order.
    pub fn get(&self) -> Vec<T> {
        self.table.elements.borrow().clone()
    }

    /// Appends `value`.
    pub fn add(&self, value: T) {
        self.table.elements.borrow_mut().push(value);
    }

    /// Appends `values`, in order.
    pub fn add_all(&self, values: impl IntoIterator<Item = T>) {
        // Collected first: the iterator may read this state.
        let values: Vec<T> = values.into_iter().collect();
        self.table.elements.borrow_mut().extend(values);
    }

    /// Replaces the elements with `values`.
    pub fn update(&self, values: impl IntoIterator<Item = T>) {
        // Collected first: the iterator may read this state.
        let values: Vec<T> = values.into_iter().collect();
        *self.table.elements.borrow_mut() = values;
    }

    /// Removes all elements.
    pub fn clear(&self) {
        self.table.elements.borrow_mut().clear();
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.table.elements.borrow().len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.table.elements.borrow().is_empty()
    }
}

/// A map every subtask of an operator holds identically (Flink's `BroadcastState`), from
/// [`crate::OperatorStateStore::broadcast_state`]. Keeping the copies equal is the operator's
/// job: change it only from the broadcast side, the same way on every subtask.
pub struct BroadcastState<K, V> {
    name: Rc<str>,
    table: Rc<MapTable<K, V>>,
}

impl<K: StateKey, V: Clone> BroadcastState<K, V> {
    pub(crate) fn new(name: Rc<str>, table: Rc<MapTable<K, V>>) -> Self {
        BroadcastState { name, table }
    }

    /// The state name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A copy of the value under `key`.
    pub fn get(&self, key: &K) -> Option<V> {
        self.table.entries.borrow().get(key).cloned()
    }

    /// Puts `value` under `key`, replacing any value there.
    pub fn put(&self, key: K, value: V) {
        self.table.entries.borrow_mut().insert(key, value);
    }

    /// Puts every entry of `entries`, in order.
    pub fn put_all(&self, entries: impl IntoIterator<Item = (K, V)>) {
        // Collected first: the iterator may read this state.
        let entries: Vec<(K, V)> = entries.into_iter().collect();
        self.table.entries.borrow_mut().extend(entries);
    }

    /// Removes `key`, returning its value.
    pub fn remove(&self, key: &K) -> Option<V> {
        self.table.entries.borrow_mut().swap_remove(key)
    }

    /// Whether `key` has a value.
    pub fn contains(&self, key: &K) -> bool {
        self.table.entries.borrow().contains_key(key)
    }

    /// A copy of all entries, in insertion order (a removal moves the last entry into its
    /// place).
    pub fn entries(&self) -> Vec<(K, V)> {
        self.table
            .entries
            .borrow()
            .iter()
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect()
    }

    /// A copy of all keys, in the order of [`BroadcastState::entries`].
    pub fn keys(&self) -> Vec<K> {
        self.table.entries.borrow().keys().cloned().collect()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.table.entries.borrow().len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.table.entries.borrow().is_empty()
    }

    /// Removes all entries.
    pub fn clear(&self) {
        self.table.entries.borrow_mut().clear();
    }
}

impl<T> Clone for OperatorListState<T> {
    fn clone(&self) -> Self {
        OperatorListState {
            name: Rc::clone(&self.name),
            table: Rc::clone(&self.table),
        }
    }
}

impl<K, V> Clone for BroadcastState<K, V> {
    fn clone(&self) -> Self {
        BroadcastState {
            name: Rc::clone(&self.name),
            table: Rc::clone(&self.table),
        }
    }
}

impl<T> fmt::Debug for OperatorListState<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperatorListState")
            .field("name", &self.name)
            .field("union", &self.table.union)
            .field(
                "len",
                &self.table.elements.try_borrow().map(|e| e.len()).ok(),
            )
            .finish()
    }
}

impl<K, V> fmt::Debug for BroadcastState<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BroadcastState")
            .field("name", &self.name)
            .field(
                "len",
                &self.table.entries.try_borrow().map(|e| e.len()).ok(),
            )
            .finish()
    }
}
