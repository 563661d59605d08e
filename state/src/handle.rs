//! State handles: what an operator holds after registering a descriptor.
//!
//! Every handle acts on the backend's *current* key (and namespace), set by the engine before
//! it calls the operator ([`crate::LocalKeyedBackend::set_current_key`]). Handles are cheap to
//! clone and shard-bound (`!Send`), like the backend they came from.
//!
//! Each backend implements three access traits (value, list, map); reducing and aggregating
//! state are a value state plus a function, so both backends share their logic here.

use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use crate::descriptor::{AggregateFunction, ReduceFn};
use crate::error::StateError;

/// Changes a value in place: called with the current value (`Some`, to be modified in place,
/// returning `None`) or with `None` when there is none (returning the value to store).
pub(crate) type UpdateFn<'a, T> = &'a mut dyn FnMut(Option<&mut T>) -> Option<T>;

/// Backend side of [`ValueState`].
pub(crate) trait ValueAccess<T> {
    fn value(&self) -> Result<Option<T>, StateError>;
    fn update(&self, value: T) -> Result<(), StateError>;
    fn clear(&self) -> Result<(), StateError>;
    /// Read-modify-write without cloning the stored value (heap) or decoding it twice (RocksDB).
    fn update_with(&self, update: UpdateFn<'_, T>) -> Result<(), StateError>;
    /// See [`ValueState::prefetch`]; backends without a table to prefetch from do nothing.
    fn prefetch(&self) {}
    /// See [`ValueState::insert_new`]; a backend that reads nothing to write is right to
    /// [`ValueAccess::update`].
    fn insert_new(&self, value: T) -> Result<(), StateError> {
        self.update(value)
    }
}

/// Backend side of [`ListState`].
pub(crate) trait ListAccess<T> {
    fn get(&self) -> Result<Vec<T>, StateError>;
    fn add(&self, value: T) -> Result<(), StateError>;
    fn add_all(&self, values: Vec<T>) -> Result<(), StateError>;
    fn update(&self, values: Vec<T>) -> Result<(), StateError>;
    fn clear(&self) -> Result<(), StateError>;
}

/// Backend side of [`MapState`].
pub(crate) trait MapAccess<UK, UV> {
    fn get(&self, key: &UK) -> Result<Option<UV>, StateError>;
    fn put(&self, key: UK, value: UV) -> Result<(), StateError>;
    fn put_all(&self, entries: Vec<(UK, UV)>) -> Result<(), StateError>;
    fn remove(&self, key: &UK) -> Result<(), StateError>;
    fn contains(&self, key: &UK) -> Result<bool, StateError>;
    fn entries(&self) -> Result<MapEntries<UK, UV>, StateError>;
    /// Every entry, in the order of `entries`, lent to `visit`.
    fn for_each(
        &self,
        visit: &mut dyn FnMut(&UK, &UV) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        for entry in self.entries()? {
            let (key, value) = entry?;
            visit(&key, &value)?;
        }
        Ok(())
    }
    fn is_empty(&self) -> Result<bool, StateError>;
    fn clear(&self) -> Result<(), StateError>;
}

/// One value per key and namespace (Flink's `ValueState`).
pub struct ValueState<T> {
    access: Rc<dyn ValueAccess<T>>,
}

impl<T> ValueState<T> {
    pub(crate) fn new(access: Rc<dyn ValueAccess<T>>) -> Self {
        ValueState { access }
    }

    /// The value of the current key, or `None` if it has none (or it expired).
    pub fn value(&self) -> Result<Option<T>, StateError> {
        self.access.value()
    }

    /// Sets the value of the current key.
    pub fn update(&self, value: T) -> Result<(), StateError> {
        self.access.update(value)
    }

    /// Removes the value of the current key.
    pub fn clear(&self) -> Result<(), StateError> {
        self.access.clear()
    }

    /// Sets the value of a current key that has never had one in this backend: a namespace
    /// used for the first time, such as a window pane just numbered. On RocksDB the write-back
    /// cache takes the value without first asking RocksDB what the key holds, and a later
    /// [`ValueState::clear`] while the value is cached reaches no further than the cache. The
    /// caller must know the key is new: a value RocksDB held for it would come back after
    /// that clear. Otherwise the same as [`ValueState::update`].
    pub fn insert_new(&self, value: T) -> Result<(), StateError> {
        self.access.insert_new(value)
    }

    /// Hints that the current key's value is read soon: on RocksDB, the CPU starts bringing in
    /// where the write-back cache most likely holds it, so that the cache misses of several
    /// values prefetched before any is read overlap. Reads nothing and changes nothing;
    /// without a current key, or on the heap backend, it does nothing.
    pub fn prefetch(&self) {
        self.access.prefetch()
    }

    /// Reads and changes the current key's value in one access, without cloning it out and
    /// writing it back: `change` gets the stored value (`Some`) to change in place, returning
    /// `None` to keep it so or `Some` to replace it; for a key without a value it gets `None`
    /// and returns the value to store, if any. On the heap backend the stored value itself is
    /// changed (one lookup); on RocksDB it is read and decoded once and written once. For TTL
    /// this is a write.
    pub fn update_with(
        &self,
        change: impl FnOnce(Option<&mut T>) -> Option<T>,
    ) -> Result<(), StateError> {
        let mut change = Some(change);
        self.access
            .update_with(&mut |current| change.take().and_then(|change| change(current)))
    }

    /// Changes the current key's value in place with `change`, starting from `init()` where
    /// the key has none: one read-modify-write, as [`ValueState::update_with`] (an
    /// accumulator's `add` or `merge`).
    pub fn update_or_init(
        &self,
        init: impl FnOnce() -> T,
        change: impl FnOnce(&mut T),
    ) -> Result<(), StateError> {
        update_or_init(&*self.access, init, change)
    }
}

/// [`ValueState::update_or_init`] over a backend's value access.
fn update_or_init<T>(
    access: &dyn ValueAccess<T>,
    init: impl FnOnce() -> T,
    change: impl FnOnce(&mut T),
) -> Result<(), StateError> {
    let mut steps = Some((init, change));
    access.update_with(&mut |current| {
        let (init, change) = steps.take()?;
        match current {
            Some(current) => {
                change(current);
                None
            }
            None => {
                let mut value = init();
                change(&mut value);
                Some(value)
            }
        }
    })
}

/// A list of values per key and namespace (Flink's `ListState`).
pub struct ListState<T> {
    access: Rc<dyn ListAccess<T>>,
}

impl<T> ListState<T> {
    pub(crate) fn new(access: Rc<dyn ListAccess<T>>) -> Self {
        ListState { access }
    }

    /// The elements of the current key's list, in insertion order (empty if none).
    pub fn get(&self) -> Result<Vec<T>, StateError> {
        self.access.get()
    }

    /// Appends `value` (RocksDB: a merge, no read).
    pub fn add(&self, value: T) -> Result<(), StateError> {
        self.access.add(value)
    }

    /// Appends all `values` in one write.
    pub fn add_all(&self, values: impl IntoIterator<Item = T>) -> Result<(), StateError> {
        self.access.add_all(values.into_iter().collect())
    }

    /// Replaces the list with `values` (an empty `values` clears it).
    pub fn update(&self, values: impl IntoIterator<Item = T>) -> Result<(), StateError> {
        self.access.update(values.into_iter().collect())
    }

    /// Removes the current key's list.
    pub fn clear(&self) -> Result<(), StateError> {
        self.access.clear()
    }
}

/// A map per key and namespace (Flink's `MapState`).
pub struct MapState<UK, UV> {
    access: Rc<dyn MapAccess<UK, UV>>,
}

impl<UK, UV> MapState<UK, UV> {
    pub(crate) fn new(access: Rc<dyn MapAccess<UK, UV>>) -> Self {
        MapState { access }
    }

    /// The value under `key` in the current key's map.
    pub fn get(&self, key: &UK) -> Result<Option<UV>, StateError> {
        self.access.get(key)
    }

    /// Sets `key` to `value`.
    pub fn put(&self, key: UK, value: UV) -> Result<(), StateError> {
        self.access.put(key, value)
    }

    /// Sets several entries in one write.
    pub fn put_all(&self, entries: impl IntoIterator<Item = (UK, UV)>) -> Result<(), StateError> {
        self.access.put_all(entries.into_iter().collect())
    }

    /// Removes `key`.
    pub fn remove(&self, key: &UK) -> Result<(), StateError> {
        self.access.remove(key)
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &UK) -> Result<bool, StateError> {
        self.access.contains(key)
    }

    /// All entries of the current key's map. Order: arbitrary on the heap backend, by the
    /// encoded user key on RocksDB. The heap backend copies the map out first; RocksDB reads it
    /// in chunks of [`MAP_ITERATION_CHUNK`] entries, so writes made while iterating may or may
    /// not be seen (as in Flink).
    pub fn entries(&self) -> Result<MapEntries<UK, UV>, StateError> {
        self.access.entries()
    }

    /// Lends every entry of the current key's map to `visit`, in the order of
    /// [`MapState::entries`], stopping at its first error: the heap backend lends its own
    /// entries (nothing is copied), RocksDB decodes each. `visit` must not change this state
    /// (the heap backend holds its map while `visit` runs, and a change panics).
    pub fn for_each(
        &self,
        mut visit: impl FnMut(&UK, &UV) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        self.access.for_each(&mut visit)
    }

    /// All keys of the current key's map (see [`MapState::entries`]).
    pub fn keys(&self) -> Result<impl Iterator<Item = Result<UK, StateError>>, StateError> {
        Ok(self
            .access
            .entries()?
            .map(|entry| entry.map(|(key, _)| key)))
    }

    /// All values of the current key's map (see [`MapState::entries`]).
    pub fn values(&self) -> Result<impl Iterator<Item = Result<UV, StateError>>, StateError> {
        Ok(self
            .access
            .entries()?
            .map(|entry| entry.map(|(_, value)| value)))
    }

    /// Whether the current key's map has no entries.
    pub fn is_empty(&self) -> Result<bool, StateError> {
        self.access.is_empty()
    }

    /// Removes the current key's whole map.
    pub fn clear(&self) -> Result<(), StateError> {
        self.access.clear()
    }
}

/// How many entries the RocksDB backend reads per step of a map iteration.
pub const MAP_ITERATION_CHUNK: usize = 128;

/// An iterator over map state entries. Items are `Result`s because RocksDB reads lazily.
pub struct MapEntries<UK, UV> {
    inner: Box<dyn Iterator<Item = Result<(UK, UV), StateError>>>,
}

impl<UK, UV> MapEntries<UK, UV> {
    pub(crate) fn new(inner: Box<dyn Iterator<Item = Result<(UK, UV), StateError>>>) -> Self {
        MapEntries { inner }
    }
}

impl<UK, UV> Iterator for MapEntries<UK, UV> {
    type Item = Result<(UK, UV), StateError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next()
    }
}

/// One value per key, to which added values are folded by a reduce function (Flink's
/// `ReducingState`).
pub struct ReducingState<T> {
    access: Rc<dyn ValueAccess<T>>,
    reduce: ReduceFn<T>,
}

impl<T> ReducingState<T> {
    pub(crate) fn new(access: Rc<dyn ValueAccess<T>>, reduce: ReduceFn<T>) -> Self {
        ReducingState { access, reduce }
    }

    /// The folded value of the current key.
    pub fn get(&self) -> Result<Option<T>, StateError> {
        self.access.value()
    }

    /// Folds `value` into the current key's value (or stores it if there is none).
    pub fn add(&self, value: T) -> Result<(), StateError> {
        let mut added = Some(value);
        let reduce = &self.reduce;
        self.access.update_with(&mut |current| match current {
            Some(current) => {
                if let Some(added) = added.take() {
                    *current = reduce(current, &added);
                }
                None
            }
            None => added.take(),
        })
    }

    /// Removes the current key's value.
    pub fn clear(&self) -> Result<(), StateError> {
        self.access.clear()
    }
}

/// Backend-independent side of [`AggregatingState`], hiding the accumulator type.
pub(crate) trait AggregatingAccess<IN, OUT> {
    fn get(&self) -> Result<Option<OUT>, StateError>;
    fn add(&self, value: IN) -> Result<(), StateError>;
    fn clear(&self) -> Result<(), StateError>;
}

/// An accumulator value state and the aggregate function that drives it.
pub(crate) struct Aggregator<IN, ACC, OUT> {
    pub(crate) accumulator: Rc<dyn ValueAccess<ACC>>,
    pub(crate) function: Arc<dyn AggregateFunction<IN, ACC, OUT>>,
}

impl<IN: 'static, ACC: 'static, OUT: 'static> AggregatingAccess<IN, OUT>
    for Aggregator<IN, ACC, OUT>
{
    fn get(&self) -> Result<Option<OUT>, StateError> {
        Ok(self
            .accumulator
            .value()?
            .map(|accumulator| self.function.get_result(&accumulator)))
    }

    fn add(&self, value: IN) -> Result<(), StateError> {
        let function = &self.function;
        update_or_init(
            &*self.accumulator,
            || function.create_accumulator(),
            |accumulator| function.add(value, accumulator),
        )
    }

    fn clear(&self) -> Result<(), StateError> {
        self.accumulator.clear()
    }
}

/// An accumulator per key, fed inputs and read as results (Flink's `AggregatingState`).
pub struct AggregatingState<IN, OUT> {
    access: Rc<dyn AggregatingAccess<IN, OUT>>,
}

impl<IN, OUT> AggregatingState<IN, OUT> {
    pub(crate) fn new(access: Rc<dyn AggregatingAccess<IN, OUT>>) -> Self {
        AggregatingState { access }
    }

    /// The aggregate result of the current key, or `None` if nothing was added.
    pub fn get(&self) -> Result<Option<OUT>, StateError> {
        self.access.get()
    }

    /// Adds `value` to the current key's accumulator.
    pub fn add(&self, value: IN) -> Result<(), StateError> {
        self.access.add(value)
    }

    /// Removes the current key's accumulator.
    pub fn clear(&self) -> Result<(), StateError> {
        self.access.clear()
    }
}

macro_rules! handle_boilerplate {
    ($ty:ident < $($param:ident),+ > { $($field:ident),+ }) => {
        impl<$($param),+> Clone for $ty<$($param),+> {
            fn clone(&self) -> Self {
                $ty { $($field: self.$field.clone()),+ }
            }
        }

        impl<$($param),+> fmt::Debug for $ty<$($param),+> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($ty)).finish_non_exhaustive()
            }
        }
    };
}

handle_boilerplate!(ValueState<T> { access });
handle_boilerplate!(ListState<T> { access });
handle_boilerplate!(MapState < UK, UV > { access });
handle_boilerplate!(ReducingState<T> { access, reduce });
handle_boilerplate!(AggregatingState < IN, OUT > { access });
