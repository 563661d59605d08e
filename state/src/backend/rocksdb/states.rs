//! RocksDB implementations of value, list and map access.
//!
//! A value is one frame under the current key's prefix; a list is a sequence of frames under
//! the prefix, appended with a merge (no read); a map entry is one frame under the prefix plus
//! the encoded user key, read back by prefix iteration. Reads check expiry: an expired value is
//! deleted and not returned; `OnReadAndWrite` rewrites what it returns with a new expiry.
//! Values of value, reducing and aggregating states go through the slot's write-back cache when
//! it has one (`cache.rs`); lists and maps go to RocksDB directly.

use std::any::type_name;
use std::cell::{RefCell, RefMut};
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

use rocksdb::{BoundColumnFamily, DBPinnableSlice, ReadOptions, WriteBatch};

use crate::backend::context::{Current, KeyContext};
use crate::backend::rocksdb::cache::{ColumnId, Found};
use crate::backend::rocksdb::key::prefix_end;
use crate::backend::rocksdb::slot::RocksDbInstance;
use crate::backend::rocksdb::value::{
    begin_element, finish_element, list_elements, parse_frame, set_expiry, write_header,
    ColumnLayout, Frame,
};
use crate::codec::StateCodec;
use crate::descriptor::StateKind;
use crate::error::{StateError, StateErrorKind};
use crate::handle::{
    ListAccess, MapAccess, MapEntries, UpdateFn, ValueAccess, MAP_ITERATION_CHUNK,
};
use crate::ttl::{AccessTime, TtlPolicy};
use crate::StateKey;

/// Deletes are written in batches of this many keys when a map is cleared.
const CLEAR_BATCH: usize = 1024;

/// One registered RocksDB state: its column family and TTL.
pub(crate) struct RocksColumn {
    pub(crate) state: Rc<str>,
    pub(crate) kind: StateKind,
    pub(crate) layout: ColumnLayout,
    pub(crate) column_family: String,
    pub(crate) ttl: Option<TtlPolicy>,
    /// The column family's handle, looked up once: `cf_handle` takes a lock, searches a map by
    /// name and counts a reference, twice per read-modify-write. Declared before `slot` so that
    /// it is dropped first (see [`RocksColumn::new`]).
    handle: Arc<BoundColumnFamily<'static>>,
    /// The column's id in the slot's write-back cache, if its values go through it.
    cached: Option<ColumnId>,
    pub(crate) slot: Arc<RocksDbInstance>,
    /// Encoding buffer for values.
    scratch: RefCell<Vec<u8>>,
    /// Encoding buffer for map keys.
    key_scratch: RefCell<Vec<u8>>,
}

impl RocksColumn {
    /// The state `state` stored in the existing column family `column_family` of `slot`.
    pub(crate) fn new(
        state: &str,
        kind: StateKind,
        layout: ColumnLayout,
        column_family: String,
        ttl: Option<TtlPolicy>,
        slot: Arc<RocksDbInstance>,
    ) -> Result<RocksColumn, StateError> {
        let handle = slot.column_family(&column_family)?;
        let cached = match kind {
            StateKind::Value | StateKind::Reducing | StateKind::Aggregating => {
                slot.cached_column(&column_family)
            }
            StateKind::List | StateKind::Map => None,
        };
        // SAFETY: only the lifetime changes (the type is otherwise the same, and rocksdb itself
        // makes handles of any lifetime from the same `Arc`). The lifetime stands for "the
        // database is open"; that holds while `handle` lives, because the `slot` field keeps
        // the database open and is dropped after `handle` (fields drop in declaration order),
        // and no column family is ever dropped while the database is open (there is no
        // `drop_cf` in this crate). `handle` is private and never handed out with the longer
        // lifetime: `cf` returns it borrowed from `self`.
        let handle = unsafe {
            std::mem::transmute::<Arc<BoundColumnFamily<'_>>, Arc<BoundColumnFamily<'static>>>(
                handle,
            )
        };
        Ok(RocksColumn {
            state: Rc::from(state),
            kind,
            layout,
            column_family,
            ttl,
            handle,
            cached,
            slot,
            scratch: RefCell::new(Vec::new()),
            key_scratch: RefCell::new(Vec::new()),
        })
    }

    fn error(&self, action: &'static str, source: rocksdb::Error) -> StateError {
        StateError::rocksdb(self.slot.path(), &self.state, action, source)
    }

    pub(crate) fn corrupt(
        &self,
        what: &'static str,
        type_name: &'static str,
        len: usize,
        reason: impl ToString,
    ) -> StateError {
        StateErrorKind::Corrupt {
            state: self.state.to_string(),
            what,
            type_name,
            len,
            reason: reason.to_string(),
        }
        .into()
    }

    /// The column family's handle.
    #[inline]
    pub(crate) fn cf(&self) -> &Arc<BoundColumnFamily<'_>> {
        &self.handle
    }

    /// Hands the stored value of `key` (`None`: there is none) to `read`: from the write-back
    /// cache for a cached column, else pinned in RocksDB. Also says where a cached column's
    /// cache found `key` (`None` for an uncached column), for a write that follows
    /// ([`RocksColumn::put_found`]).
    fn with_stored<R>(
        &self,
        key: &[u8],
        read: impl FnOnce(Option<&[u8]>) -> R,
    ) -> Result<(R, Option<Found>), StateError> {
        if let Some(column) = self.cached {
            let (result, found) = self.slot.cached_read(column, key, read)?;
            return Ok((result, Some(found)));
        }
        Ok((read(self.get_pinned(key)?.as_deref()), None))
    }

    /// The value of `key` pinned in RocksDB itself, past any write-back cache: for uncached
    /// columns only (lists are never cached).
    fn get_pinned(&self, key: &[u8]) -> Result<Option<DBPinnableSlice<'_>>, StateError> {
        debug_assert!(self.cached.is_none(), "a cached column read past its cache");
        self.slot
            .db()
            .get_pinned_cf_opt(self.cf(), key, self.slot.read_options())
            .map_err(|source| self.error("reading", source))
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.put_found(key, value, None)
    }

    /// Puts `value` under `key`, which a read just found `found` in the cache (if it did).
    fn put_found(&self, key: &[u8], value: &[u8], found: Option<Found>) -> Result<(), StateError> {
        if let Some(column) = self.cached {
            return match found {
                Some(found) => self
                    .slot
                    .cached_write_found(column, key, found, Some(value)),
                None => self.slot.cached_write(column, key, Some(value)),
            };
        }
        self.slot
            .db()
            .put_cf_opt(self.cf(), key, value, self.slot.write_options())
            .map_err(|source| self.error("writing", source))
    }

    /// Puts `value` under `key`, which has never had a value (see [`ValueState::insert_new`]).
    ///
    /// [`ValueState::insert_new`]: crate::ValueState::insert_new
    fn put_new(&self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        match self.cached {
            Some(column) => self.slot.cached_write_new(column, key, value),
            None => self.put_found(key, value, None),
        }
    }

    fn delete(&self, key: &[u8]) -> Result<(), StateError> {
        if let Some(column) = self.cached {
            return self.slot.cached_write(column, key, None);
        }
        self.slot
            .db()
            .delete_cf_opt(self.cf(), key, self.slot.write_options())
            .map_err(|source| self.error("deleting", source))
    }

    fn merge(&self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.slot
            .db()
            .merge_cf_opt(self.cf(), key, value, self.slot.write_options())
            .map_err(|source| self.error("appending", source))
    }

    fn write(&self, batch: WriteBatch) -> Result<(), StateError> {
        self.slot
            .db()
            .write_opt(batch, self.slot.write_options())
            .map_err(|source| self.error("writing a batch", source))
    }

    pub(crate) fn decode<T: StateCodec>(
        &self,
        what: &'static str,
        bytes: &[u8],
    ) -> Result<T, StateError> {
        T::decode(bytes).map_err(|error| self.corrupt(what, type_name::<T>(), bytes.len(), error))
    }

    pub(crate) fn parse<'a>(
        &self,
        what: &'static str,
        type_name: &'static str,
        bytes: &'a [u8],
    ) -> Result<Frame<'a>, StateError> {
        parse_frame(bytes).map_err(|error| self.corrupt(what, type_name, bytes.len(), error))
    }

    fn encode<T: StateCodec>(&self, value: &T, out: &mut Vec<u8>) -> Result<(), StateError> {
        value.encode_into(out).map_err(|error| {
            StateErrorKind::Encode {
                state: self.state.to_string(),
                type_name: type_name::<T>(),
                reason: error.to_string(),
            }
            .into()
        })
    }

    /// Appends a frame holding `value`, expiring at `expires_at`.
    fn encode_frame<T: StateCodec>(
        &self,
        value: &T,
        expires_at: i64,
        out: &mut Vec<u8>,
    ) -> Result<(), StateError> {
        write_header(out, expires_at);
        self.encode(value, out)
    }

    /// `prefix` followed by the encoded `user_key`.
    fn map_key<UK: StateCodec>(
        &self,
        prefix: &[u8],
        user_key: &UK,
    ) -> Result<RefMut<'_, Vec<u8>>, StateError> {
        let mut key = self.key_scratch.borrow_mut();
        key.clear();
        key.extend_from_slice(prefix);
        self.encode(user_key, &mut key)?;
        Ok(key)
    }

    /// Reads a one-frame entry with TTL semantics and hands its payload to `read`; with
    /// `refresh`, `OnReadAndWrite` rewrites the entry with a new expiry.
    fn read_single<R>(
        &self,
        key: &[u8],
        refresh: bool,
        type_name: &'static str,
        read: impl FnOnce(&[u8]) -> Result<R, StateError>,
    ) -> Result<Option<R>, StateError> {
        self.read_single_found(key, refresh, type_name, read)
            .map(|(result, _)| result)
    }

    /// [`RocksColumn::read_single`], and where the cache found the entry (see
    /// [`RocksColumn::with_stored`]).
    fn read_single_found<R>(
        &self,
        key: &[u8],
        refresh: bool,
        type_name: &'static str,
        read: impl FnOnce(&[u8]) -> Result<R, StateError>,
    ) -> Result<(Option<R>, Option<Found>), StateError> {
        /// What the stored entry held.
        enum Stored<R> {
            Nothing,
            Expired,
            /// The result, and the entry rewritten with a new expiry if it needs one.
            Live(R, Option<Vec<u8>>),
        }
        let access = AccessTime::of(self.ttl.as_ref());
        let (stored, at) = self.with_stored(key, |stored| -> Result<Stored<R>, StateError> {
            let Some(stored) = stored else {
                return Ok(Stored::Nothing);
            };
            let frame = self.parse("value", type_name, stored)?;
            if access.expired(frame.expires_at) {
                return Ok(Stored::Expired);
            }
            let result = read(frame.payload)?;
            let refreshed =
                (refresh && access.refresh_on_read && frame.expires_at != access.write_expiry)
                    .then(|| {
                        let mut refreshed = stored.to_vec();
                        set_expiry(&mut refreshed, access.write_expiry);
                        refreshed
                    });
            Ok(Stored::Live(result, refreshed))
        })?;
        match stored? {
            Stored::Nothing => Ok((None, at)),
            Stored::Expired => {
                self.delete(key)?;
                Ok((None, at))
            }
            Stored::Live(result, refreshed) => {
                if let Some(refreshed) = refreshed {
                    self.put_found(key, &refreshed, at)?;
                }
                Ok((Some(result), at))
            }
        }
    }

    /// Writes `value` as the one-frame entry under `key`.
    fn write_single<T: StateCodec>(&self, key: &[u8], value: &T) -> Result<(), StateError> {
        self.write_single_found(key, value, None)
    }

    /// [`RocksColumn::write_single`] of a key a read just found `found` in the cache.
    fn write_single_found<T: StateCodec>(
        &self,
        key: &[u8],
        value: &T,
        found: Option<Found>,
    ) -> Result<(), StateError> {
        let frame = self.single_frame(value)?;
        self.put_found(key, &frame, found)
    }

    /// `value` as the one frame of an entry written now (its expiry from now on), in the
    /// column's scratch buffer.
    fn single_frame<T: StateCodec>(&self, value: &T) -> Result<RefMut<'_, Vec<u8>>, StateError> {
        let expires_at = AccessTime::of(self.ttl.as_ref()).write_expiry;
        let mut buffer = self.scratch.borrow_mut();
        buffer.clear();
        self.encode_frame(value, expires_at, &mut buffer)?;
        Ok(buffer)
    }
}

/// The current key prefix, or the error for a state accessed without a current key.
#[inline]
fn prefix<'a, K, N>(current: &'a Current<K, N>, state: &str) -> Result<&'a [u8], StateError> {
    match current.composite {
        Some(_) => Ok(&current.prefix),
        None => Err(StateError::no_current_key(state)),
    }
}

/// A RocksDB value state (also the accumulator of reducing and aggregating state).
pub(crate) struct RocksValue<K, N, T> {
    pub(crate) context: Rc<KeyContext<K, N>>,
    pub(crate) column: Rc<RocksColumn>,
    pub(crate) _value: PhantomData<fn() -> T>,
}

impl<K: StateKey, N: StateKey, T: StateCodec> ValueAccess<T> for RocksValue<K, N, T> {
    fn value(&self) -> Result<Option<T>, StateError> {
        let current = self.context.current();
        let key = prefix(&current, &self.column.state)?;
        self.column
            .read_single(key, true, type_name::<T>(), |payload| {
                self.column.decode("value", payload)
            })
    }

    fn update(&self, value: T) -> Result<(), StateError> {
        let current = self.context.current();
        let key = prefix(&current, &self.column.state)?;
        self.column.write_single(key, &value)
    }

    fn clear(&self) -> Result<(), StateError> {
        let current = self.context.current();
        let key = prefix(&current, &self.column.state)?;
        self.column.delete(key)
    }

    fn prefetch(&self) {
        let current = self.context.current();
        if let (Some(column), Ok(key)) = (self.column.cached, prefix(&current, &self.column.state))
        {
            self.column.slot.cached_prefetch(column, key);
        }
    }

    fn insert_new(&self, value: T) -> Result<(), StateError> {
        let current = self.context.current();
        let key = prefix(&current, &self.column.state)?;
        let frame = self.column.single_frame(&value)?;
        self.column.put_new(key, &frame)
    }

    fn update_with(&self, update: UpdateFn<'_, T>) -> Result<(), StateError> {
        let current = self.context.current();
        let key = prefix(&current, &self.column.state)?;
        // The write goes where the read found the entry: one hashing and probe of the cache.
        let (existing, found) =
            self.column
                .read_single_found(key, false, type_name::<T>(), |payload| {
                    self.column.decode::<T>("value", payload)
                })?;
        let new = match existing {
            Some(mut value) => {
                if let Some(replacement) = update(Some(&mut value)) {
                    value = replacement;
                }
                Some(value)
            }
            None => update(None),
        };
        match new {
            Some(value) => self.column.write_single_found(key, &value, found),
            None => Ok(()),
        }
    }
}

/// A RocksDB list state.
pub(crate) struct RocksList<K, N, T> {
    pub(crate) context: Rc<KeyContext<K, N>>,
    pub(crate) column: Rc<RocksColumn>,
    pub(crate) _value: PhantomData<fn() -> T>,
}

impl<K: StateKey, N: StateKey, T: StateCodec> RocksList<K, N, T> {
    /// Encodes `values` as list elements expiring at `expires_at`.
    fn encode_elements(&self, values: &[T], out: &mut Vec<u8>) -> Result<(), StateError> {
        let expires_at = AccessTime::of(self.column.ttl.as_ref()).write_expiry;
        for value in values {
            let start = begin_element(out);
            self.column.encode_frame(value, expires_at, out)?;
            finish_element(out, start);
        }
        Ok(())
    }
}

impl<K: StateKey, N: StateKey, T: StateCodec> ListAccess<T> for RocksList<K, N, T> {
    fn get(&self) -> Result<Vec<T>, StateError> {
        let current = self.context.current();
        let key = prefix(&current, &self.column.state)?;
        let Some(stored) = self.column.get_pinned(key)? else {
            return Ok(Vec::new());
        };
        let access = AccessTime::of(self.column.ttl.as_ref());
        let mut values = Vec::new();
        let mut expired = false;
        let mut stale = false;
        for element in list_elements(&stored) {
            let element = element.map_err(|error| {
                self.column
                    .corrupt("list", type_name::<T>(), stored.len(), error)
            })?;
            let frame = self
                .column
                .parse("list element", type_name::<T>(), element)?;
            if access.expired(frame.expires_at) {
                expired = true;
                continue;
            }
            stale |= access.refresh_on_read && frame.expires_at != access.write_expiry;
            values.push(self.column.decode("list element", frame.payload)?);
        }
        if expired || stale {
            // Drop expired elements (and move the expiry of the rest forward on refresh).
            let mut rewritten = Vec::with_capacity(stored.len());
            for element in list_elements(&stored).flatten() {
                let Ok(frame) = parse_frame(element) else {
                    continue;
                };
                if access.expired(frame.expires_at) {
                    continue;
                }
                let start = begin_element(&mut rewritten);
                rewritten.extend_from_slice(element);
                if access.refresh_on_read {
                    set_expiry(&mut rewritten[start + 4..], access.write_expiry);
                }
                finish_element(&mut rewritten, start);
            }
            drop(stored);
            if rewritten.is_empty() {
                self.column.delete(key)?;
            } else {
                self.column.put(key, &rewritten)?;
            }
        }
        Ok(values)
    }

    fn add(&self, value: T) -> Result<(), StateError> {
        self.add_all(vec![value])
    }

    fn add_all(&self, values: Vec<T>) -> Result<(), StateError> {
        if values.is_empty() {
            return Ok(());
        }
        let current = self.context.current();
        let key = prefix(&current, &self.column.state)?;
        let mut buffer = self.column.scratch.borrow_mut();
        buffer.clear();
        self.encode_elements(&values, &mut buffer)?;
        self.column.merge(key, &buffer)
    }

    fn update(&self, values: Vec<T>) -> Result<(), StateError> {
        let current = self.context.current();
        let key = prefix(&current, &self.column.state)?;
        if values.is_empty() {
            return self.column.delete(key);
        }
        let mut buffer = self.column.scratch.borrow_mut();
        buffer.clear();
        self.encode_elements(&values, &mut buffer)?;
        self.column.put(key, &buffer)
    }

    fn clear(&self) -> Result<(), StateError> {
        let current = self.context.current();
        let key = prefix(&current, &self.column.state)?;
        self.column.delete(key)
    }
}

/// A RocksDB map state.
pub(crate) struct RocksMap<K, N, UK, UV> {
    pub(crate) context: Rc<KeyContext<K, N>>,
    pub(crate) column: Rc<RocksColumn>,
    pub(crate) _types: PhantomData<fn() -> (UK, UV)>,
}

impl<K, N, UK, UV> MapAccess<UK, UV> for RocksMap<K, N, UK, UV>
where
    K: StateKey,
    N: StateKey,
    UK: StateCodec,
    UV: StateCodec,
{
    fn get(&self, user_key: &UK) -> Result<Option<UV>, StateError> {
        let current = self.context.current();
        let key = self
            .column
            .map_key(prefix(&current, &self.column.state)?, user_key)?;
        self.column
            .read_single(&key, true, type_name::<UV>(), |payload| {
                self.column.decode("map value", payload)
            })
    }

    fn put(&self, user_key: UK, value: UV) -> Result<(), StateError> {
        let current = self.context.current();
        let key = self
            .column
            .map_key(prefix(&current, &self.column.state)?, &user_key)?;
        self.column.write_single(&key, &value)
    }

    fn put_all(&self, entries: Vec<(UK, UV)>) -> Result<(), StateError> {
        let current = self.context.current();
        let prefix = prefix(&current, &self.column.state)?;
        let expires_at = AccessTime::of(self.column.ttl.as_ref()).write_expiry;
        let cf = self.column.cf();
        let mut batch = WriteBatch::default();
        let mut value = Vec::new();
        for (user_key, user_value) in &entries {
            let key = self.column.map_key(prefix, user_key)?;
            value.clear();
            self.column
                .encode_frame(user_value, expires_at, &mut value)?;
            batch.put_cf(cf, &*key, &value);
        }
        self.column.write(batch)
    }

    fn remove(&self, user_key: &UK) -> Result<(), StateError> {
        let current = self.context.current();
        let key = self
            .column
            .map_key(prefix(&current, &self.column.state)?, user_key)?;
        self.column.delete(&key)
    }

    fn contains(&self, user_key: &UK) -> Result<bool, StateError> {
        let current = self.context.current();
        let key = self
            .column
            .map_key(prefix(&current, &self.column.state)?, user_key)?;
        Ok(self
            .column
            .read_single(&key, true, type_name::<UV>(), |_| Ok(()))?
            .is_some())
    }

    fn entries(&self) -> Result<MapEntries<UK, UV>, StateError> {
        let current = self.context.current();
        let prefix = prefix(&current, &self.column.state)?;
        let entries = RocksMapEntries::<UK, UV> {
            column: Rc::clone(&self.column),
            prefix_len: prefix.len(),
            lower: prefix.to_vec(),
            upper: prefix_end(prefix),
            buffer: VecDeque::new(),
            done: false,
        };
        Ok(MapEntries::new(Box::new(entries)))
    }

    fn is_empty(&self) -> Result<bool, StateError> {
        Ok(self.entries()?.next().transpose()?.is_none())
    }

    fn clear(&self) -> Result<(), StateError> {
        let current = self.context.current();
        let prefix = prefix(&current, &self.column.state)?;
        let cf = self.column.cf();
        let mut options = ReadOptions::default();
        options.set_iterate_lower_bound(prefix.to_vec());
        if let Some(upper) = prefix_end(prefix) {
            options.set_iterate_upper_bound(upper);
        }
        let mut iterator = self.column.slot.db().raw_iterator_cf_opt(cf, options);
        iterator.seek_to_first();
        let mut batch = WriteBatch::default();
        while let Some(key) = iterator.key() {
            batch.delete_cf(cf, key);
            if batch.len() >= CLEAR_BATCH {
                self.column.write(std::mem::take(&mut batch))?;
            }
            iterator.next();
        }
        iterator
            .status()
            .map_err(|source| self.column.error("iterating a map", source))?;
        if !batch.is_empty() {
            self.column.write(batch)?;
        }
        Ok(())
    }
}

/// Lazy iteration over one map, [`MAP_ITERATION_CHUNK`] entries per RocksDB iterator, so no
/// iterator (and no pinned block) outlives a call to `next`.
struct RocksMapEntries<UK, UV> {
    column: Rc<RocksColumn>,
    prefix_len: usize,
    /// Where the next chunk starts (inclusive).
    lower: Vec<u8>,
    /// The end of the map's key range (exclusive).
    upper: Option<Vec<u8>>,
    buffer: VecDeque<(UK, UV)>,
    done: bool,
}

impl<UK: StateCodec, UV: StateCodec> RocksMapEntries<UK, UV> {
    fn fill(&mut self) -> Result<(), StateError> {
        let column = &self.column;
        let access = AccessTime::of(column.ttl.as_ref());
        let cf = column.cf();
        let mut options = ReadOptions::default();
        options.set_iterate_lower_bound(self.lower.clone());
        if let Some(upper) = &self.upper {
            options.set_iterate_upper_bound(upper.clone());
        }
        let mut iterator = column.slot.db().raw_iterator_cf_opt(cf, options);
        iterator.seek_to_first();
        let mut batch = WriteBatch::default();
        let mut read = 0;
        while read < MAP_ITERATION_CHUNK {
            let Some((key, value)) = iterator.item() else {
                break;
            };
            read += 1;
            let frame = column.parse("map value", type_name::<UV>(), value)?;
            if access.expired(frame.expires_at) {
                batch.delete_cf(cf, key);
            } else {
                let user_key = column.decode::<UK>("map key", &key[self.prefix_len..])?;
                let user_value = column.decode::<UV>("map value", frame.payload)?;
                if access.refresh_on_read && frame.expires_at != access.write_expiry {
                    let mut refreshed = value.to_vec();
                    set_expiry(&mut refreshed, access.write_expiry);
                    batch.put_cf(cf, key, refreshed);
                }
                self.buffer.push_back((user_key, user_value));
            }
            self.lower.clear();
            self.lower.extend_from_slice(key);
            self.lower.push(0);
            iterator.next();
        }
        iterator
            .status()
            .map_err(|source| column.error("iterating a map", source))?;
        if read < MAP_ITERATION_CHUNK {
            self.done = true;
        }
        drop(iterator);
        if !batch.is_empty() {
            column.write(batch)?;
        }
        Ok(())
    }
}

impl<UK: StateCodec, UV: StateCodec> Iterator for RocksMapEntries<UK, UV> {
    type Item = Result<(UK, UV), StateError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(entry) = self.buffer.pop_front() {
                return Some(Ok(entry));
            }
            if self.done {
                return None;
            }
            if let Err(error) = self.fill() {
                self.done = true;
                return Some(Err(error));
            }
        }
    }
}
