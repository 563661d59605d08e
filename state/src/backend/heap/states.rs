//! Heap implementations of value, list and map access: typed values, no serialization.
//!
//! Reads clone the stored value out (handles return owned values on both backends); writes
//! move the new value in. TTL is checked on every read: an expired entry is removed and not
//! returned, and with `OnReadAndWrite` a read moves the expiry forward.

use std::cell::RefCell;
use std::hash::Hash;
use std::rc::Rc;

use crate::backend::context::{Current, KeyContext};
use crate::backend::heap::table::{Entry, FastMap, HashedKey, KeyGroupedTable, Purge, Stored};
use crate::descriptor::StateKind;
use crate::error::StateError;
use crate::handle::{ListAccess, MapAccess, MapEntries, UpdateFn, ValueAccess};
use crate::ttl::{AccessTime, TtlPolicy};
use crate::StateKey;

/// One registered heap state: its name, kind, TTL and entries.
pub(crate) struct HeapTable<K, N, V> {
    pub(crate) name: Rc<str>,
    pub(crate) kind: StateKind,
    pub(crate) ttl: Option<TtlPolicy>,
    pub(crate) data: RefCell<KeyGroupedTable<K, N, V>>,
}

/// The `(key, namespace)` (with its cached hash) and key group index of the current key, or the
/// error for a state accessed without one.
#[inline]
fn lookup<'a, K, N>(
    current: &'a Current<K, N>,
    state: &str,
) -> Result<(HashedKey<'a, K, N>, usize), StateError> {
    match &current.composite {
        Some(key) => Ok((
            HashedKey {
                key,
                hash: current.composite_hash,
            },
            current.group_index,
        )),
        None => Err(StateError::no_current_key(state)),
    }
}

/// A heap value state (also the accumulator of reducing and aggregating state).
pub(crate) struct HeapValue<K, N, T> {
    pub(crate) context: Rc<KeyContext<K, N>>,
    pub(crate) table: Rc<HeapTable<K, N, Entry<T>>>,
}

impl<K: StateKey, N: StateKey, T: Clone + 'static> ValueAccess<T> for HeapValue<K, N, T> {
    fn value(&self) -> Result<Option<T>, StateError> {
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        let mut data = self.table.data.borrow_mut();
        let Some(entry) = data.get(group, key) else {
            return Ok(None);
        };
        let Some(ttl) = &self.table.ttl else {
            return Ok(Some(entry.value.clone()));
        };
        let access = AccessTime::of(Some(ttl));
        if access.expired(entry.expires_at) {
            data.remove(group, key);
            return Ok(None);
        }
        if access.refresh_on_read {
            return Ok(data.modify(group, key, |entry| {
                entry.expires_at = access.write_expiry;
                entry.value.clone()
            }));
        }
        Ok(Some(entry.value.clone()))
    }

    fn update(&self, value: T) -> Result<(), StateError> {
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        let expires_at = AccessTime::of(self.table.ttl.as_ref()).write_expiry;
        self.table
            .data
            .borrow_mut()
            .upsert(group, key, Entry { value, expires_at });
        Ok(())
    }

    fn clear(&self) -> Result<(), StateError> {
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        self.table.data.borrow_mut().remove(group, key);
        Ok(())
    }

    fn update_with(&self, update: UpdateFn<'_, T>) -> Result<(), StateError> {
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        let access = AccessTime::of(self.table.ttl.as_ref());
        let mut data = self.table.data.borrow_mut();
        let live = data
            .get(group, key)
            .is_some_and(|entry| !access.expired(entry.expires_at));
        if live {
            data.modify(group, key, |entry| {
                if let Some(replacement) = update(Some(&mut entry.value)) {
                    entry.value = replacement;
                }
                entry.expires_at = access.write_expiry;
            });
        } else if let Some(value) = update(None) {
            let expires_at = access.write_expiry;
            data.upsert(group, key, Entry { value, expires_at });
        }
        Ok(())
    }
}

/// A heap list state; each element carries its own expiry.
pub(crate) struct HeapList<K, N, T> {
    pub(crate) context: Rc<KeyContext<K, N>>,
    pub(crate) table: Rc<HeapTable<K, N, Vec<Entry<T>>>>,
}

impl<K: StateKey, N: StateKey, T: Clone + 'static> ListAccess<T> for HeapList<K, N, T> {
    fn get(&self) -> Result<Vec<T>, StateError> {
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        let mut data = self.table.data.borrow_mut();
        let Some(list) = data.get(group, key) else {
            return Ok(Vec::new());
        };
        let Some(ttl) = &self.table.ttl else {
            return Ok(list.iter().map(|element| element.value.clone()).collect());
        };
        let access = AccessTime::of(Some(ttl));
        if !access.refresh_on_read && !list.any_expired(access.now) {
            return Ok(list.iter().map(|element| element.value.clone()).collect());
        }
        let values = data.modify(group, key, |list| {
            list.purge_expired(access.now);
            if access.refresh_on_read {
                for element in list.iter_mut() {
                    element.expires_at = access.write_expiry;
                }
            }
            list.iter().map(|element| element.value.clone()).collect()
        });
        Ok(values.unwrap_or_default())
    }

    fn add(&self, value: T) -> Result<(), StateError> {
        self.add_all(vec![value])
    }

    fn add_all(&self, values: Vec<T>) -> Result<(), StateError> {
        if values.is_empty() {
            return Ok(());
        }
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        let expires_at = AccessTime::of(self.table.ttl.as_ref()).write_expiry;
        let mut elements = values.into_iter().map(|value| Entry { value, expires_at });
        let mut data = self.table.data.borrow_mut();
        if data.get(group, key).is_some() {
            data.modify(group, key, |list| list.extend(&mut elements));
        } else {
            data.upsert(group, key, elements.collect());
        }
        Ok(())
    }

    fn update(&self, values: Vec<T>) -> Result<(), StateError> {
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        let mut data = self.table.data.borrow_mut();
        if values.is_empty() {
            data.remove(group, key);
            return Ok(());
        }
        let expires_at = AccessTime::of(self.table.ttl.as_ref()).write_expiry;
        let list = values
            .into_iter()
            .map(|value| Entry { value, expires_at })
            .collect();
        data.upsert(group, key, list);
        Ok(())
    }

    fn clear(&self) -> Result<(), StateError> {
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        self.table.data.borrow_mut().remove(group, key);
        Ok(())
    }
}

/// A heap map state; each user key carries its own expiry.
pub(crate) struct HeapMap<K, N, UK, UV> {
    pub(crate) context: Rc<KeyContext<K, N>>,
    pub(crate) table: Rc<HeapTable<K, N, FastMap<UK, Entry<UV>>>>,
}

impl<K, N, UK, UV> HeapMap<K, N, UK, UV>
where
    K: StateKey,
    N: StateKey,
    UK: Hash + Eq + Clone + 'static,
    UV: Clone + 'static,
{
    /// Reads one user entry with TTL semantics: `read` sees the live entry.
    fn read_entry<R>(
        &self,
        user_key: &UK,
        read: impl FnOnce(&UV) -> R,
    ) -> Result<Option<R>, StateError> {
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        let mut data = self.table.data.borrow_mut();
        let Some(entry) = data.get(group, key).and_then(|map| map.get(user_key)) else {
            return Ok(None);
        };
        let Some(ttl) = &self.table.ttl else {
            return Ok(Some(read(&entry.value)));
        };
        let access = AccessTime::of(Some(ttl));
        if access.expired(entry.expires_at) {
            data.modify(group, key, |map| map.swap_remove(user_key));
            return Ok(None);
        }
        if access.refresh_on_read {
            return Ok(data
                .modify(group, key, |map| {
                    map.get_mut(user_key).map(|entry| {
                        entry.expires_at = access.write_expiry;
                        read(&entry.value)
                    })
                })
                .flatten());
        }
        Ok(Some(read(&entry.value)))
    }

    /// Drops expired entries of the current map and refreshes the rest when reads refresh;
    /// used before whole-map reads.
    fn purge_for_read(&self) -> Result<(), StateError> {
        let Some(ttl) = &self.table.ttl else {
            return Ok(());
        };
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        let access = AccessTime::of(Some(ttl));
        let mut data = self.table.data.borrow_mut();
        let Some(map) = data.get(group, key) else {
            return Ok(());
        };
        if access.refresh_on_read || map.any_expired(access.now) {
            data.modify(group, key, |map| {
                if map.purge_expired(access.now) != Purge::Empty && access.refresh_on_read {
                    for entry in map.values_mut() {
                        entry.expires_at = access.write_expiry;
                    }
                }
            });
        }
        Ok(())
    }
}

impl<K, N, UK, UV> MapAccess<UK, UV> for HeapMap<K, N, UK, UV>
where
    K: StateKey,
    N: StateKey,
    UK: Hash + Eq + Clone + 'static,
    UV: Clone + 'static,
{
    fn get(&self, user_key: &UK) -> Result<Option<UV>, StateError> {
        self.read_entry(user_key, UV::clone)
    }

    fn put(&self, user_key: UK, value: UV) -> Result<(), StateError> {
        self.put_all(vec![(user_key, value)])
    }

    fn put_all(&self, entries: Vec<(UK, UV)>) -> Result<(), StateError> {
        if entries.is_empty() {
            return Ok(());
        }
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        let expires_at = AccessTime::of(self.table.ttl.as_ref()).write_expiry;
        let mut entries = entries
            .into_iter()
            .map(|(user_key, value)| (user_key, Entry { value, expires_at }));
        let mut data = self.table.data.borrow_mut();
        if data.get(group, key).is_some() {
            data.modify(group, key, |map| map.extend(&mut entries));
        } else {
            data.upsert(group, key, entries.collect());
        }
        Ok(())
    }

    fn remove(&self, user_key: &UK) -> Result<(), StateError> {
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        let mut data = self.table.data.borrow_mut();
        if data
            .get(group, key)
            .is_some_and(|map| map.contains_key(user_key))
        {
            data.modify(group, key, |map| map.swap_remove(user_key));
        }
        Ok(())
    }

    fn contains(&self, user_key: &UK) -> Result<bool, StateError> {
        Ok(self.read_entry(user_key, |_| ())?.is_some())
    }

    fn entries(&self) -> Result<MapEntries<UK, UV>, StateError> {
        self.purge_for_read()?;
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        let data = self.table.data.borrow();
        let entries: Vec<(UK, UV)> = data
            .get(group, key)
            .map(|map| {
                map.iter()
                    .map(|(user_key, entry)| (user_key.clone(), entry.value.clone()))
                    .collect()
            })
            .unwrap_or_default();
        Ok(MapEntries::new(Box::new(entries.into_iter().map(Ok))))
    }

    fn for_each(
        &self,
        visit: &mut dyn FnMut(&UK, &UV) -> Result<(), StateError>,
    ) -> Result<(), StateError> {
        self.purge_for_read()?;
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        let data = self.table.data.borrow();
        if let Some(map) = data.get(group, key) {
            for (user_key, entry) in map.iter() {
                visit(user_key, &entry.value)?;
            }
        }
        Ok(())
    }

    fn is_empty(&self) -> Result<bool, StateError> {
        self.purge_for_read()?;
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        let data = self.table.data.borrow();
        Ok(data.get(group, key).is_none_or(|map| map.is_empty()))
    }

    fn clear(&self) -> Result<(), StateError> {
        let current = self.context.current();
        let (key, group) = lookup(&current, &self.table.name)?;
        self.table.data.borrow_mut().remove(group, key);
        Ok(())
    }
}
