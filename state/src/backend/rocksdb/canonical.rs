//! RocksDB state in the canonical keyed-snapshot format (`keyed_snapshot.rs`), so that a
//! savepoint of a RocksDB job restores on the heap and one of a heap job on RocksDB; and the
//! record of each state's kind and types that makes this possible.
//!
//! **The state record.** RocksDB stores bytes: what type a column family's values are is known
//! only to the descriptor that registered it. So each registration is recorded in the
//! instance's default column family (`weir-state\0<operator>\0<state>` → the state's header:
//! kind, value type, user key type, TTL flag, as the canonical format writes it), where it
//! travels with the instance's checkpoints. Registering a state recorded with another kind or
//! types fails, naming the state and both — the check the heap backend makes against a restored
//! snapshot, here also after a restore from RocksDB's own files.
//!
//! **Writing** ([`RocksDbInstance::write_keyed_snapshot`]): each recorded state's column family
//! is read in key order — which is key-group order, the layout's first two bytes — and every
//! live entry becomes a canonical entry: a value frame one entry, a list one entry per live
//! element, a map entry one entry with its user key.
//!
//! **Loading** ([`RocksDbInstance::load_keyed_snapshots`]) does the reverse into a fresh
//! instance: the entries of its key groups go straight to RocksDB in write batches (past the
//! write-back cache, which holds nothing of a fresh instance), a list's elements gathered into
//! one value, and each state is recorded.

use bytes::Bytes;
use rocksdb::WriteBatch;

use super::key::{split_key, write_key, write_namespace, write_void_namespace};
use super::slot::RocksDbInstance;
use super::value::{begin_element, finish_element, list_elements, parse_frame, ColumnLayout};
use crate::backend::heap::restore::merge_snapshots;
use crate::backend::keyed_snapshot::{
    corrupt, kind_code, kind_of, with_checksum, write_entry, write_header_raw, write_state_blocks,
    BlockEntries, RawEntry, StateHeader,
};
use crate::descriptor::StateKind;
use crate::error::{StateError, StateErrorKind};
use crate::key_group::{KeyGroup, KeyGroupRange};
use crate::ttl::is_expired;

/// Entries written to RocksDB per write batch when loading.
const BATCH_ENTRIES: usize = 4096;

/// What a canonical keyed snapshot is of: the job's key groups (`max_parallelism`), the
/// subtask's, and the `std::any::type_name`s of its keys and namespaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotShape<'a> {
    /// The number of key groups of the job.
    pub max_parallelism: u32,
    /// The subtask's key groups.
    pub key_groups: KeyGroupRange,
    /// The key type's name.
    pub key_type: &'a str,
    /// The namespace type's name.
    pub namespace_type: &'a str,
}

/// One state record: its key and the encoded header.
type Record = (Box<[u8]>, Box<[u8]>);

/// What every state record's key starts with.
const RECORD_PREFIX: &[u8] = b"weir-state\0";

/// The default column family key of `operator`'s state `state` record.
fn record_key(operator: &str, state: &str) -> Vec<u8> {
    let mut key = RECORD_PREFIX.to_vec();
    key.extend_from_slice(operator.as_bytes());
    key.push(0);
    key.extend_from_slice(state.as_bytes());
    key
}

fn encode_header(header: &StateHeader) -> Vec<u8> {
    let mut out = Vec::new();
    let mut text = |text: &str| {
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    };
    text(&header.name);
    text(&header.value_type);
    text(header.user_key_type.as_deref().unwrap_or_default());
    out.push(kind_code(header.kind));
    out.push(u8::from(header.has_ttl));
    out
}

fn decode_header(bytes: &[u8]) -> Option<StateHeader> {
    let mut rest = bytes;
    let mut text = || -> Option<String> {
        let (len, tail) = rest.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        let (text, tail) = (tail.get(..len)?, tail.get(len..)?);
        rest = tail;
        String::from_utf8(text.to_vec()).ok()
    };
    let (name, value_type, user_key_type) = (text()?, text()?, text()?);
    let [kind, ttl] = rest else {
        return None;
    };
    let kind = kind_of(*kind)?;
    Some(StateHeader {
        name,
        kind,
        value_type,
        user_key_type: (kind == StateKind::Map).then_some(user_key_type),
        has_ttl: *ttl == 1,
    })
}

/// Appends a list element of `payload` expiring at `expires_at` to a list value.
fn push_element(list: &mut Vec<u8>, payload: &[u8], expires_at: i64) {
    let start = begin_element(list);
    super::value::write_header(list, expires_at);
    list.extend_from_slice(payload);
    finish_element(list, start);
}

/// The column family of `operator`'s state of `header`.
fn column_family_of(operator: &str, header: &StateHeader) -> (String, ColumnLayout) {
    let layout = match header.kind {
        StateKind::List => ColumnLayout::List,
        _ => ColumnLayout::Single,
    };
    (
        format!("{}:{operator}:{}", layout.tag(), header.name),
        layout,
    )
}

impl RocksDbInstance {
    /// Records that operator `operator` registered the state of `header` (see the module
    /// docs); a state recorded with another kind or types is refused, naming both.
    pub(crate) fn record_state(
        &self,
        operator: &str,
        header: &StateHeader,
    ) -> Result<(), StateError> {
        let key = record_key(operator, &header.name);
        let recorded = self
            .db()
            .get(&key)
            .map_err(|source| {
                StateError::rocksdb(self.path(), &header.name, "reading its record", source)
            })?
            .and_then(|bytes| decode_header(&bytes));
        if let Some(recorded) = recorded {
            let same = recorded.kind == header.kind
                && recorded.value_type == header.value_type
                && recorded.user_key_type == header.user_key_type;
            if !same {
                return Err(StateErrorKind::IncompatibleKeyedRestore {
                    state: header.name.clone(),
                    restored: recorded.describe(),
                    requested: header.describe(),
                }
                .into());
            }
            if recorded.has_ttl == header.has_ttl {
                return Ok(());
            }
        }
        self.db()
            .put_opt(&key, encode_header(header), self.write_options())
            .map_err(|source| {
                StateError::rocksdb(self.path(), &header.name, "recording it", source)
            })
    }

    /// The state records whose keys start with `prefix`: `(key, value)`, in key order.
    fn records(&self, prefix: &[u8]) -> Result<Vec<Record>, StateError> {
        let mut records = Vec::new();
        for item in self.db().prefix_iterator(prefix) {
            let (key, value) = item.map_err(|source| {
                StateError::rocksdb(self.path(), "*", "reading the state records", source)
            })?;
            if !key.starts_with(prefix) {
                break;
            }
            records.push((key, value));
        }
        Ok(records)
    }

    /// Copies every state record of `other` into this instance (a rescaled restore, which
    /// copies the states' entries too: `RocksDbInstance::copy_key_groups_from`).
    pub(crate) fn copy_records_from(&self, other: &RocksDbInstance) -> Result<(), StateError> {
        for (key, value) in other.records(RECORD_PREFIX)? {
            self.db()
                .put_opt(&key, &value, self.write_options())
                .map_err(|source| {
                    StateError::rocksdb(self.path(), "*", "recording a state", source)
                })?;
        }
        Ok(())
    }

    /// The states `operator` recorded, in name order; a state column family of the operator
    /// without a record (written by a build before records) is an error naming it.
    fn recorded_states(&self, operator: &str) -> Result<Vec<StateHeader>, StateError> {
        let prefix = record_key(operator, "");
        let mut headers = Vec::new();
        for (key, value) in self.records(&prefix)? {
            let header = decode_header(&value).ok_or_else(|| {
                corrupt(format!(
                    "the record of state '{}' in {} does not parse",
                    String::from_utf8_lossy(&key[prefix.len()..]),
                    self.path().display()
                ))
            })?;
            headers.push(header);
        }
        for column_family in self.column_families()? {
            let Some((tag, rest)) = column_family.split_once(':') else {
                continue;
            };
            let state = rest
                .strip_prefix(operator)
                .and_then(|rest| rest.strip_prefix(':'));
            if let (Some(_), Some(state)) = (ColumnLayout::from_tag(tag), state) {
                if !headers.iter().any(|header| header.name == state) {
                    return Err(StateError::invalid_config(
                        "RocksDB state to write canonically",
                        format!(
                            "'{state}' of operator {operator}, whose types the build that \
                             wrote it did not record"
                        ),
                        "let the job register the state (touch it once) before the savepoint",
                    ));
                }
            }
        }
        Ok(headers)
    }

    /// Appends operator `operator`'s state of `shape` (its key groups, keys and namespaces)
    /// in the canonical keyed-snapshot format (see the module docs); entries expired by
    /// `now_ms` are left out.
    pub fn write_keyed_snapshot(
        &self,
        operator: &str,
        shape: SnapshotShape<'_>,
        now_ms: i64,
        out: &mut Vec<u8>,
    ) -> Result<(), StateError> {
        let key_groups = shape.key_groups;
        self.flush_write_back()?;
        let headers = self.recorded_states(operator)?;
        with_checksum(out, |out| {
            write_header_raw(
                out,
                shape.max_parallelism,
                key_groups,
                now_ms,
                shape.key_type,
                shape.namespace_type,
                headers.len(),
            )?;
            let mut blocks: Vec<(u32, u32, Vec<u8>)> = Vec::new();
            for header in &headers {
                blocks.clear();
                let (column_family, layout) = column_family_of(operator, header);
                if self.column_family(&column_family).is_ok() {
                    self.state_blocks(
                        &column_family,
                        layout,
                        header,
                        key_groups,
                        now_ms,
                        &mut blocks,
                    )?;
                }
                let encoded = blocks
                    .iter()
                    .map(|(group, entries, bytes)| (*group, *entries, bytes.as_slice()));
                write_state_blocks(out, header, encoded)?;
            }
            Ok(())
        })
    }

    /// The live entries of one state's column family, as canonical key-group blocks.
    fn state_blocks(
        &self,
        column_family: &str,
        layout: ColumnLayout,
        header: &StateHeader,
        key_groups: KeyGroupRange,
        now_ms: i64,
        blocks: &mut Vec<(u32, u32, Vec<u8>)>,
    ) -> Result<(), StateError> {
        let damaged = |what: &str| {
            corrupt(format!(
                "state '{}' in {} holds {what}",
                header.name,
                self.path().display()
            ))
        };
        let expiry = |at: i64| header.has_ttl.then_some(at);
        for item in self.raw_entries(column_family, key_groups)? {
            let (key, value) = item?;
            let parts =
                split_key(&key).ok_or_else(|| damaged("a key that does not follow the layout"))?;
            let group = parts.key_group.0;
            if blocks.last().is_none_or(|(last, _, _)| *last != group) {
                blocks.push((group, 0, Vec::new()));
            }
            let (_, entries, bytes) = blocks.last_mut().expect("pushed");
            let user_key = (header.kind == StateKind::Map).then_some(parts.user_key);
            let mut put = |payload: &[u8], expires_at: i64| -> Result<(), StateError> {
                if is_expired(expires_at, now_ms) {
                    return Ok(());
                }
                *entries += 1;
                write_entry(
                    bytes,
                    &header.name,
                    &RawEntry {
                        key: parts.key,
                        namespace: parts.namespace,
                        user_key,
                        value: payload,
                        expires_at_ms: expiry(expires_at),
                    },
                )
            };
            match layout {
                ColumnLayout::Single => {
                    let frame = parse_frame(&value)
                        .map_err(|e| damaged(&format!("a value it cannot read ({e})")))?;
                    put(frame.payload, frame.expires_at)?;
                }
                ColumnLayout::List => {
                    for element in list_elements(&value) {
                        let frame = element
                            .and_then(parse_frame)
                            .map_err(|e| damaged(&format!("a list it cannot read ({e})")))?;
                        put(frame.payload, frame.expires_at)?;
                    }
                }
            }
        }
        blocks.retain(|(_, entries, _)| *entries > 0);
        Ok(())
    }

    /// Loads the entries of `shape`'s key groups from canonical keyed snapshots (one, or those
    /// of the old subtasks a rescaled subtask takes its key groups from) into this fresh
    /// instance as operator `operator`'s states, recording each (see the module docs). The
    /// snapshots must be of the shape's key groups, keys and namespaces (an
    /// `IncompatibleKeyedSnapshot` error names what differs). Returns the number of entries
    /// loaded.
    pub fn load_keyed_snapshots(
        &self,
        operator: &str,
        snapshots: &[Bytes],
        shape: SnapshotShape<'_>,
    ) -> Result<u64, StateError> {
        let (states, _) = merge_snapshots(
            snapshots,
            shape.max_parallelism,
            shape.key_groups,
            shape.key_type,
            shape.namespace_type,
        )?;
        let mut loaded = 0;
        for state in &states {
            let header = &state.header;
            let (column_family, layout) = column_family_of(operator, header);
            self.ensure_column_family(&column_family, layout)?;
            self.record_state(operator, header)?;
            let cf = self.column_family(&column_family)?;
            let mut batch = WriteBatch::default();
            let mut key = Vec::new();
            let mut value = Vec::new();
            let write = |batch: &mut WriteBatch| -> Result<(), StateError> {
                self.db()
                    .write_opt(std::mem::take(batch), self.write_options())
                    .map_err(|source| {
                        StateError::rocksdb(
                            self.path(),
                            &column_family,
                            "loading a snapshot",
                            source,
                        )
                    })
            };
            for block in &state.blocks {
                let entries = BlockEntries::new(&block.bytes, block.entries, header);
                // A list's elements follow each other: gathered into one value per key.
                let mut pending: Option<Vec<u8>> = None;
                for entry in entries {
                    let entry = entry.map_err(|problem| {
                        corrupt(format!(
                            "state '{}', key group {}: {problem}",
                            header.name, block.key_group
                        ))
                    })?;
                    let mut this_key = Vec::new();
                    write_key(&mut this_key, KeyGroup(block.key_group), entry.key);
                    match entry.namespace {
                        Some(namespace) => write_namespace(&mut this_key, namespace),
                        None => write_void_namespace(&mut this_key),
                    }
                    if let Some(user_key) = entry.user_key {
                        this_key.extend_from_slice(user_key);
                    }
                    let expires_at = entry.expires_at_ms.unwrap_or(crate::ttl::NEVER_EXPIRES);
                    if let Some(list) = pending.as_mut().filter(|_| this_key == key) {
                        push_element(list, entry.value, expires_at);
                        loaded += 1;
                        continue;
                    }
                    if let Some(list) = pending.take() {
                        batch.put_cf(&cf, &key, list);
                    }
                    key = this_key;
                    match layout {
                        ColumnLayout::Single => {
                            value.clear();
                            super::value::write_header(&mut value, expires_at);
                            value.extend_from_slice(entry.value);
                            batch.put_cf(&cf, &key, &value);
                        }
                        ColumnLayout::List => {
                            let mut list = Vec::new();
                            push_element(&mut list, entry.value, expires_at);
                            pending = Some(list);
                        }
                    }
                    loaded += 1;
                    if batch.len() >= BATCH_ENTRIES {
                        write(&mut batch)?;
                    }
                }
                if let Some(list) = pending.take() {
                    batch.put_cf(&cf, &key, list);
                }
            }
            write(&mut batch)?;
        }
        Ok(loaded)
    }
}
