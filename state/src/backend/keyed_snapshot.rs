//! The canonical byte format of one keyed operator subtask's state: what a checkpoint writes
//! for a keyed backend, and what [`crate::LocalKeyedBackend::restore`] reads back.
//!
//! The format is backend-neutral: every entry is a key, an optional namespace, an optional map
//! user key and a value, each encoded with [`crate::StateCodec`], grouped by key group — the
//! unit in which state moves between subtasks when a job is rescaled. It describes itself
//! (magic, version, and per state its name, kind, value types and TTL), so a restore can check
//! a state's registration against what was checkpointed and a tool can read a file without the
//! job's types. A heap backend writes it with [`encode_keyed_snapshot`] from a [`HeapSnapshot`];
//! restored states that no descriptor asked for again are written back unchanged.
//!
//! **Version 1** (little-endian; never change it, add a version). `text` is a `u32` length and
//! UTF-8; `bytes` a `u32` length and the bytes.
//!
//! | field                    | content                                                      |
//! |--------------------------|--------------------------------------------------------------|
//! | magic                    | `WKST` (Weir keyed state), 4 bytes                           |
//! | version                  | `u32`, [`KEYED_SNAPSHOT_FORMAT_VERSION`]                     |
//! | max parallelism          | `u32`: the number of key groups of the job                   |
//! | key groups               | first and last (inclusive) key group of the subtask, `u32`s  |
//! | taken at                 | `i64`, ms since the epoch (the backend's clock)              |
//! | key type, namespace type | `text` each: `std::any::type_name` of `K` and `N`            |
//! | state count              | `u32`, then each state:                                      |
//! | - name                   | `text`, unique in the snapshot                               |
//! | - kind                   | `u8`: 0 value, 1 list, 2 map, 3 reducing, 4 aggregating      |
//! | - value type             | `text`: type of values, list elements, map values, or the    |
//! |                          | accumulator of aggregating state                             |
//! | - user key type          | `text`, map state only                                       |
//! | - TTL                    | `u8`: 1 if the state has a time to live, else 0              |
//! | - key-group block count  | `u32`, then each block, in ascending key-group order:        |
//! | -- key group             | `u32`                                                        |
//! | -- entry count           | `u32` (at least 1: empty key groups are left out)            |
//! | -- length                | `u64`: bytes of the entries that follow                      |
//! | -- entries               | each: flags `u8` (1 namespace, 2 user key, 4 expiry), key    |
//! |                          | `bytes`, namespace `bytes` if flagged, user key `bytes` (map |
//! |                          | state, always), value `bytes`, expiry `i64` (ms) if flagged  |
//! | checksum                 | `u32`: CRC-32 of every byte before it                        |
//!
//! A list state has one entry per element, in list order; a map state one per user key, in the
//! map's order. Entries that had expired when the snapshot was taken are left out.
//!
//! The type fingerprints are `std::any::type_name`, which names a type with its module path:
//! renaming or moving a state's type makes its registration after a restore fail (naming both
//! types), and so could, in principle, a compiler that prints a type differently — Rust does
//! not promise these names stay the same. Keys and namespaces are checked the same way, once
//! per restore.
//!
//! Reading never panics: every length is checked against the bytes that are left, and damaged,
//! truncated or foreign bytes give a [`StateErrorKind::CorruptSnapshot`] error saying what is
//! wrong, at which byte. The checksum catches damage that still parses; a length per key-group
//! block lets a restore skip the key groups of other subtasks without reading their entries.

use std::any::type_name;

use crate::backend::heap::snapshot::{HeapSnapshot, SnapshotEntry};
use crate::backend::rocksdb::key::MAX_PARALLELISM_LIMIT;
use crate::checksum::{crc32, Crc32};
use crate::codec::StateCodec;
use crate::descriptor::StateKind;
use crate::error::{StateError, StateErrorKind};
use crate::key_group::{KeyGroup, KeyGroupRange};
use crate::StateKey;

/// The format version [`encode_keyed_snapshot`] writes and a restore reads.
pub const KEYED_SNAPSHOT_FORMAT_VERSION: u32 = 1;

const MAGIC: [u8; 4] = *b"WKST";
const WHAT: &str = "keyed state snapshot";

/// Entry flags.
const HAS_NAMESPACE: u8 = 1;
const HAS_USER_KEY: u8 = 2;
const HAS_EXPIRY: u8 = 4;

pub(crate) fn kind_code(kind: StateKind) -> u8 {
    match kind {
        StateKind::Value => 0,
        StateKind::List => 1,
        StateKind::Map => 2,
        StateKind::Reducing => 3,
        StateKind::Aggregating => 4,
    }
}

pub(crate) fn kind_of(code: u8) -> Option<StateKind> {
    Some(match code {
        0 => StateKind::Value,
        1 => StateKind::List,
        2 => StateKind::Map,
        3 => StateKind::Reducing,
        4 => StateKind::Aggregating,
        _ => return None,
    })
}

/// How a state of `kind` storing `value_type` (and `user_key_type`) shows in error messages,
/// e.g. `ValueState<u64>`, `MapState<alloc::string::String, u64>`.
pub(crate) fn describe(kind: StateKind, value_type: &str, user_key_type: Option<&str>) -> String {
    match (kind, user_key_type) {
        (StateKind::Aggregating, _) => format!("{kind} with accumulator {value_type}"),
        (_, Some(user_key_type)) => format!("{kind}<{user_key_type}, {value_type}>"),
        (_, None) => format!("{kind}<{value_type}>"),
    }
}

/// What a snapshot says about one state, before its entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StateHeader {
    pub(crate) name: String,
    pub(crate) kind: StateKind,
    pub(crate) value_type: String,
    pub(crate) user_key_type: Option<String>,
    pub(crate) has_ttl: bool,
}

impl StateHeader {
    pub(crate) fn describe(&self) -> String {
        describe(self.kind, &self.value_type, self.user_key_type.as_deref())
    }
}

fn write_state_header(
    out: &mut Vec<u8>,
    name: &str,
    kind: StateKind,
    value_type: &str,
    user_key_type: Option<&str>,
    has_ttl: bool,
) -> Result<(), StateError> {
    put_bytes(out, name, name.as_bytes())?;
    out.push(kind_code(kind));
    put_bytes(out, name, value_type.as_bytes())?;
    if kind == StateKind::Map {
        put_bytes(out, name, user_key_type.unwrap_or_default().as_bytes())?;
    }
    out.push(u8::from(has_ttl));
    Ok(())
}

fn too_long(state: &str, len: usize) -> StateError {
    StateErrorKind::Encode {
        state: state.to_string(),
        type_name: "keyed state snapshot field",
        reason: format!("{len} bytes do not fit the format's u32 length"),
    }
    .into()
}

/// Appends a `u32` length and `bytes`.
fn put_bytes(out: &mut Vec<u8>, state: &str, bytes: &[u8]) -> Result<(), StateError> {
    let len = u32::try_from(bytes.len()).map_err(|_| too_long(state, bytes.len()))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

/// Encodes keys and namespaces, reusing the last encoding while the entries of one
/// `(key, namespace)` follow each other (list elements, map entries).
struct KeyEncoder<K, N> {
    key: *const K,
    key_bytes: Vec<u8>,
    namespace: *const N,
    namespace_bytes: Vec<u8>,
}

impl<K: StateCodec, N: StateCodec> KeyEncoder<K, N> {
    fn new() -> Self {
        KeyEncoder {
            key: std::ptr::null(),
            key_bytes: Vec::new(),
            namespace: std::ptr::null(),
            namespace_bytes: Vec::new(),
        }
    }

    fn encode<T: StateCodec>(state: &str, value: &T, out: &mut Vec<u8>) -> Result<(), StateError> {
        out.clear();
        value.encode_into(out).map_err(|error| {
            StateErrorKind::Encode {
                state: state.to_string(),
                type_name: type_name::<T>(),
                reason: error.to_string(),
            }
            .into()
        })
    }

    /// Appends one entry. The snapshot is frozen while it is encoded, so an entry at the
    /// address of the previous one is the same entry.
    fn put_entry(
        &mut self,
        out: &mut Vec<u8>,
        state: &str,
        entry: &SnapshotEntry<'_, K, N>,
    ) -> Result<(), StateError> {
        if !std::ptr::eq(self.key, entry.key) {
            Self::encode(state, entry.key, &mut self.key_bytes)?;
            self.key = entry.key;
        }
        if let Some(namespace) = entry.namespace {
            if !std::ptr::eq(self.namespace, namespace) {
                Self::encode(state, namespace, &mut self.namespace_bytes)?;
                self.namespace = namespace;
            }
        }
        write_entry(
            out,
            state,
            &RawEntry {
                key: &self.key_bytes,
                namespace: entry.namespace.map(|_| self.namespace_bytes.as_slice()),
                user_key: entry.user_key,
                value: entry.value,
                expires_at_ms: entry.expires_at_ms,
            },
        )
    }
}

/// Appends one entry of a key-group block.
pub(crate) fn write_entry(
    out: &mut Vec<u8>,
    state: &str,
    entry: &RawEntry<'_>,
) -> Result<(), StateError> {
    let mut flags = 0;
    if entry.namespace.is_some() {
        flags |= HAS_NAMESPACE;
    }
    if entry.user_key.is_some() {
        flags |= HAS_USER_KEY;
    }
    if entry.expires_at_ms.is_some() {
        flags |= HAS_EXPIRY;
    }
    out.push(flags);
    put_bytes(out, state, entry.key)?;
    if let Some(namespace) = entry.namespace {
        put_bytes(out, state, namespace)?;
    }
    if let Some(user_key) = entry.user_key {
        put_bytes(out, state, user_key)?;
    }
    put_bytes(out, state, entry.value)?;
    if let Some(expires_at) = entry.expires_at_ms {
        out.extend_from_slice(&expires_at.to_le_bytes());
    }
    Ok(())
}

/// Appends the canonical encoding of `snapshot` to `out` (see the module docs). It only reads
/// the snapshot, so it may run any time after the snapshot was taken, while the backend goes on
/// writing. On an error (a value whose rkyv `Serialize` fails), `out` is left as it was.
pub fn encode_keyed_snapshot<K: StateKey + StateCodec, N: StateKey + StateCodec>(
    snapshot: &HeapSnapshot<K, N>,
    out: &mut Vec<u8>,
) -> Result<(), StateError> {
    let start = out.len();
    let mut encoder = KeyedSnapshotEncoder::new(snapshot);
    loop {
        match encoder.encode_next(out, usize::MAX) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(error) => {
                out.truncate(start);
                return Err(error);
            }
        }
    }
}

/// Bytes in front of a block's entries: key group, entry count, length.
pub(crate) const BLOCK_HEADER_LEN: usize = 16;

/// Bucket positions of a key group read in one step of [`KeyedSnapshotEncoder::encode_next`].
const BUCKETS_PER_STEP: usize = 256;

/// Entries of a key group let go of that one step frees at most.
const ENTRIES_FREED_PER_STEP: usize = 64;

/// What freeing an entry counts for against a step's budget at least, whatever its encoding
/// (an expired one was not encoded at all): so that a call's budget frees at most about
/// `budget / FREE_WORK` entries.
const FREE_WORK: usize = 256;

/// Where a [`KeyedSnapshotEncoder`] goes on.
#[derive(Clone, Copy, Debug)]
enum Step {
    Header,
    /// The header and block count of state `n` (past the last: the restored states).
    State(usize),
    /// Key group `group` of state `state`, from bucket position `position`.
    Group {
        state: usize,
        group: u32,
        position: usize,
    },
    /// The header and block count of restored state `n` (past the last: the checksum).
    Restored(usize),
    /// Block `block` of restored state `state`.
    RestoredBlock {
        state: usize,
        block: usize,
    },
    Checksum,
    Done,
}

/// The canonical encoding of a heap snapshot, produced in pieces
/// ([`KeyedSnapshotEncoder::encode_next`]) so that a checkpoint writer can encode a large
/// state between batches of records and write each piece as it comes, never holding the whole
/// encoding. The bytes are those [`encode_keyed_snapshot`] writes. `S` is the snapshot, owned
/// or borrowed.
pub struct KeyedSnapshotEncoder<K, N, S = HeapSnapshot<K, N>> {
    snapshot: S,
    keys: KeyEncoder<K, N>,
    crc: Crc32,
    step: Step,
    /// The entries of the key group being read, and how many.
    block: Vec<u8>,
    entries: u32,
    /// Blocks the current state's count announced, and blocks written.
    announced: u32,
    written: u32,
    /// Let go of each key group once read ([`KeyedSnapshotEncoder::releasing`]).
    release: bool,
    /// What freeing one entry of the key group let go of last counts for against a step's
    /// budget: its entries' mean encoded length, at least [`FREE_WORK`].
    release_work: usize,
}

impl<K, N, S> KeyedSnapshotEncoder<K, N, S>
where
    K: StateKey + StateCodec,
    N: StateKey + StateCodec,
    S: std::borrow::Borrow<HeapSnapshot<K, N>>,
{
    /// An encoder of `snapshot`, at its beginning.
    pub fn new(snapshot: S) -> Self {
        KeyedSnapshotEncoder {
            snapshot,
            keys: KeyEncoder::new(),
            crc: Crc32::default(),
            step: Step::Header,
            block: Vec::new(),
            entries: 0,
            announced: 0,
            written: 0,
            release: false,
            release_work: FREE_WORK,
        }
    }

    /// Lets go of each key group's memory as soon as it is read (the snapshot reads as empty
    /// there after), so that the memory the snapshot held goes between the pieces, a few
    /// entries a step, rather than all at once when it is dropped: for the snapshot's only
    /// reader.
    pub fn releasing(mut self) -> Self {
        self.release = true;
        self
    }

    /// Appends the next bytes of the encoding to `out`: about `budget` bytes of entries (at
    /// least one step, however small the budget), and returns whether more follow. Reading a
    /// key group of many entries takes several calls; its block is appended when it is read
    /// whole — or, when `out` is empty, becomes `out` (the two buffers are swapped rather than
    /// the block copied, so `out` may come back as another allocation).
    pub fn encode_next(&mut self, out: &mut Vec<u8>, budget: usize) -> Result<bool, StateError> {
        let start = out.len();
        let mut work = 0usize;
        loop {
            work = work.saturating_add(self.step(out)?);
            match self.step {
                Step::Checksum => {
                    self.crc.update(&out[start..]);
                    let checksum = std::mem::take(&mut self.crc).finish();
                    out.extend_from_slice(&checksum.to_le_bytes());
                    self.step = Step::Done;
                    return Ok(false);
                }
                Step::Done => return Ok(false),
                _ if work >= budget => {
                    self.crc.update(&out[start..]);
                    return Ok(true);
                }
                _ => {}
            }
        }
    }

    /// Takes one step; returns about how much work it was (bytes, bucket positions).
    fn step(&mut self, out: &mut Vec<u8>) -> Result<usize, StateError> {
        let snapshot = self.snapshot.borrow();
        let before = out.len();
        match self.step {
            Step::Header => {
                write_header::<K, N>(
                    out,
                    snapshot.max_parallelism,
                    snapshot.key_groups,
                    snapshot.taken_at_ms,
                    snapshot.states.len() + snapshot.restored.len(),
                )?;
                self.step = Step::State(0);
            }
            Step::State(index) => {
                let Some(state) = snapshot.states.get(index) else {
                    self.step = Step::Restored(0);
                    return Ok(0);
                };
                write_state_header(
                    out,
                    &state.name,
                    state.kind,
                    state.value_type,
                    state.user_key_type,
                    state.has_ttl,
                )?;
                let groups = state.key_groups.start..=state.key_groups.end;
                self.announced = groups
                    .clone()
                    .filter(|&group| state.has_entries_in_key_group(KeyGroup(group)))
                    .count() as u32;
                self.written = 0;
                out.extend_from_slice(&self.announced.to_le_bytes());
                self.step = Step::Group {
                    state: index,
                    group: state.key_groups.start,
                    position: 0,
                };
                return Ok(out.len() - before + groups.count());
            }
            Step::Group {
                state: index,
                group,
                position,
            } => {
                let state = &snapshot.states[index];
                if self.release {
                    // What the last key group let go of goes first, about as much at a step
                    // as its encoding took.
                    let freed = state.release_some(ENTRIES_FREED_PER_STEP);
                    if freed > 0 {
                        return Ok(freed * self.release_work);
                    }
                }
                if group > state.key_groups.end {
                    if self.written != self.announced {
                        return Err(StateErrorKind::Encode {
                            state: state.name.clone(),
                            type_name: "keyed state snapshot",
                            reason: format!(
                                "internal error: {} key groups announced, {} written",
                                self.announced, self.written
                            ),
                        }
                        .into());
                    }
                    self.step = Step::State(index + 1);
                    return Ok(0);
                }
                let key_group = KeyGroup(group);
                let buckets = state.buckets_in_key_group(key_group);
                let end = buckets.min(position + BUCKETS_PER_STEP);
                if self.block.is_empty() {
                    // Room for the block's header, written once the block is read whole.
                    self.block.extend_from_slice(&[0; BLOCK_HEADER_LEN]);
                }
                let read = self.block.len();
                let (keys, block, entries) = (&mut self.keys, &mut self.block, &mut self.entries);
                state.visit_key_group_buckets(key_group, position..end, |entry| {
                    *entries = entries
                        .checked_add(1)
                        .ok_or_else(|| too_long(&state.name, usize::MAX))?;
                    keys.put_entry(block, &state.name, &entry)
                })?;
                let work = self.block.len() - read + (end - position);
                if position == 0 && end < buckets {
                    // A large key group: room for all of it at the rate of its first step, so
                    // that it is not copied again each time the buffer doubles.
                    let estimate = (self.block.len() - read) / end.max(1) * buckets;
                    self.block
                        .reserve(estimate.saturating_sub(self.block.len()));
                }
                if end < buckets {
                    self.step = Step::Group {
                        state: index,
                        group,
                        position: end,
                    };
                    return Ok(work);
                }
                if self.release {
                    // Per entry of the map (a list's or map's whole value; expired ones too,
                    // which were not encoded).
                    let taken = state.release_key_group(key_group);
                    let encoded = self.block.len().saturating_sub(BLOCK_HEADER_LEN);
                    self.release_work = (encoded / taken.max(1)).max(FREE_WORK);
                }
                if self.entries > 0 {
                    let len = self.block.len() - BLOCK_HEADER_LEN;
                    self.block[..BLOCK_HEADER_LEN].copy_from_slice(&block_header(
                        group,
                        self.entries,
                        len,
                    ));
                    if out.is_empty() {
                        // The block is the piece: handed over, not copied (the caller's
                        // buffer comes back as the next block's).
                        std::mem::swap(out, &mut self.block);
                    } else {
                        out.extend_from_slice(&self.block);
                    }
                    self.written += 1;
                }
                self.block.clear();
                self.entries = 0;
                self.step = Step::Group {
                    state: index,
                    group: group + 1,
                    position: 0,
                };
                return Ok(work + 1);
            }
            Step::Restored(index) => {
                let Some(state) = snapshot.restored.get(index) else {
                    self.step = Step::Checksum;
                    return Ok(0);
                };
                write_state_start(out, &state.header, state.blocks.len())?;
                self.step = Step::RestoredBlock {
                    state: index,
                    block: 0,
                };
            }
            Step::RestoredBlock {
                state: index,
                block,
            } => {
                let state = &snapshot.restored[index];
                match state.blocks.get(block) {
                    Some(entry) => {
                        write_block(out, entry.key_group, entry.entries, &entry.bytes);
                        self.step = Step::RestoredBlock {
                            state: index,
                            block: block + 1,
                        };
                    }
                    None => self.step = Step::Restored(index + 1),
                }
            }
            Step::Checksum | Step::Done => {}
        }
        Ok(out.len() - before)
    }
}

/// Appends what `body` writes and its CRC-32; on an error `out` is left as it was.
pub(crate) fn with_checksum(
    out: &mut Vec<u8>,
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), StateError>,
) -> Result<(), StateError> {
    let start = out.len();
    match body(out) {
        Ok(()) => {
            let checksum = crc32(&out[start..]);
            out.extend_from_slice(&checksum.to_le_bytes());
            Ok(())
        }
        Err(error) => {
            out.truncate(start);
            Err(error)
        }
    }
}

/// Appends everything in front of the states: magic, version, key groups, time, key and
/// namespace types, and the number of states that follow.
pub(crate) fn write_header<K, N>(
    out: &mut Vec<u8>,
    max_parallelism: u32,
    key_groups: KeyGroupRange,
    taken_at_ms: i64,
    states: usize,
) -> Result<(), StateError> {
    write_header_raw(
        out,
        max_parallelism,
        key_groups,
        taken_at_ms,
        type_name::<K>(),
        type_name::<N>(),
        states,
    )
}

/// [`write_header`] with the key and namespace types' names given.
pub(crate) fn write_header_raw(
    out: &mut Vec<u8>,
    max_parallelism: u32,
    key_groups: KeyGroupRange,
    taken_at_ms: i64,
    key_type: &str,
    namespace_type: &str,
    states: usize,
) -> Result<(), StateError> {
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&KEYED_SNAPSHOT_FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&max_parallelism.to_le_bytes());
    out.extend_from_slice(&key_groups.start.to_le_bytes());
    out.extend_from_slice(&key_groups.end.to_le_bytes());
    out.extend_from_slice(&taken_at_ms.to_le_bytes());
    put_bytes(out, "*", key_type.as_bytes())?;
    put_bytes(out, "*", namespace_type.as_bytes())?;
    let count = u32::try_from(states).map_err(|_| too_long("*", states))?;
    out.extend_from_slice(&count.to_le_bytes());
    Ok(())
}

/// Appends a state of `header` whose key-group blocks are already encoded: `(key group, entry
/// count, entries)`, in ascending key-group order, none empty.
pub(crate) fn write_state_blocks<'a>(
    out: &mut Vec<u8>,
    header: &StateHeader,
    blocks: impl ExactSizeIterator<Item = (u32, u32, &'a [u8])>,
) -> Result<(), StateError> {
    write_state_start(out, header, blocks.len())?;
    for (key_group, entries, bytes) in blocks {
        write_block(out, key_group, entries, bytes);
    }
    Ok(())
}

/// Appends the header of a state of `header` and the count of `blocks` that follow it.
pub(crate) fn write_state_start(
    out: &mut Vec<u8>,
    header: &StateHeader,
    blocks: usize,
) -> Result<(), StateError> {
    write_state_header(
        out,
        &header.name,
        header.kind,
        &header.value_type,
        header.user_key_type.as_deref(),
        header.has_ttl,
    )?;
    let count = u32::try_from(blocks).map_err(|_| too_long(&header.name, blocks))?;
    out.extend_from_slice(&count.to_le_bytes());
    Ok(())
}

/// Appends one key-group block: its header ([`block_header`]) and entries.
fn write_block(out: &mut Vec<u8>, key_group: u32, entries: u32, bytes: &[u8]) {
    out.extend_from_slice(&block_header(key_group, entries, bytes.len()));
    out.extend_from_slice(bytes);
}

/// What goes in front of a key-group block's entries: key group, entry count, length.
pub(crate) fn block_header(key_group: u32, entries: u32, len: usize) -> [u8; BLOCK_HEADER_LEN] {
    let mut header = [0; BLOCK_HEADER_LEN];
    header[..4].copy_from_slice(&key_group.to_le_bytes());
    header[4..8].copy_from_slice(&entries.to_le_bytes());
    header[8..].copy_from_slice(&(len as u64).to_le_bytes());
    header
}

/// The bytes of a snapshot, read field by field; every problem is a sentence with the offset.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    fn is_at_end(&self) -> bool {
        self.at == self.bytes.len()
    }

    fn take(&mut self, len: u64, what: &str) -> Result<&'a [u8], String> {
        let left = self.bytes.len() - self.at;
        if len > left as u64 {
            return Err(format!(
                "truncated: {what} of {len} bytes at byte {}, only {left} left",
                self.at
            ));
        }
        let taken = &self.bytes[self.at..self.at + len as usize];
        self.at += len as usize;
        Ok(taken)
    }

    fn array<const LEN: usize>(&mut self, what: &str) -> Result<[u8; LEN], String> {
        let mut array = [0; LEN];
        array.copy_from_slice(self.take(LEN as u64, what)?);
        Ok(array)
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: &str) -> Result<i64, String> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    fn bytes(&mut self, what: &str) -> Result<&'a [u8], String> {
        let len = self.u32(what)?;
        self.take(u64::from(len), what)
    }

    fn text(&mut self, what: &str) -> Result<&'a str, String> {
        let at = self.at;
        std::str::from_utf8(self.bytes(what)?)
            .map_err(|_| format!("the {what} at byte {at} is not UTF-8"))
    }
}

/// One entry of a key-group block, still encoded.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawEntry<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) namespace: Option<&'a [u8]>,
    pub(crate) user_key: Option<&'a [u8]>,
    pub(crate) value: &'a [u8],
    pub(crate) expires_at_ms: Option<i64>,
}

/// The entries of one key-group block of a state.
pub(crate) struct BlockEntries<'a> {
    reader: Reader<'a>,
    left: u32,
    is_map: bool,
    has_ttl: bool,
}

impl<'a> BlockEntries<'a> {
    /// The `entries` entries in `bytes`, a block of a state of `header`.
    pub(crate) fn new(bytes: &'a [u8], entries: u32, header: &StateHeader) -> Self {
        BlockEntries {
            reader: Reader::new(bytes),
            left: entries,
            is_map: header.kind == StateKind::Map,
            has_ttl: header.has_ttl,
        }
    }

    fn read(&mut self) -> Result<RawEntry<'a>, String> {
        let at = self.reader.at;
        let flags = self.reader.u8("entry flags")?;
        if flags & !(HAS_NAMESPACE | HAS_USER_KEY | HAS_EXPIRY) != 0 {
            return Err(format!(
                "unknown entry flags {flags:#04x} at block byte {at}"
            ));
        }
        if (flags & HAS_USER_KEY != 0) != self.is_map {
            return Err(format!(
                "the entry at block byte {at} {} a map user key, but the state is {}a map state",
                if self.is_map { "lacks" } else { "has" },
                if self.is_map { "" } else { "not " },
            ));
        }
        if flags & HAS_EXPIRY != 0 && !self.has_ttl {
            return Err(format!(
                "the entry at block byte {at} has an expiry, but the state has no TTL"
            ));
        }
        let key = self.reader.bytes("key")?;
        let namespace = match flags & HAS_NAMESPACE {
            0 => None,
            _ => Some(self.reader.bytes("namespace")?),
        };
        let user_key = match flags & HAS_USER_KEY {
            0 => None,
            _ => Some(self.reader.bytes("user key")?),
        };
        let value = self.reader.bytes("value")?;
        let expires_at_ms = match flags & HAS_EXPIRY {
            0 => None,
            _ => Some(self.reader.i64("expiry")?),
        };
        Ok(RawEntry {
            key,
            namespace,
            user_key,
            value,
            expires_at_ms,
        })
    }

    /// Reads every entry, checking that the count and the length agree.
    fn validate(mut self) -> Result<(), String> {
        while self.next().transpose()?.is_some() {}
        Ok(())
    }
}

impl<'a> Iterator for BlockEntries<'a> {
    type Item = Result<RawEntry<'a>, String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            if self.reader.is_at_end() {
                return None;
            }
            let extra = self.reader.bytes.len() - self.reader.at;
            self.reader.at = self.reader.bytes.len();
            return Some(Err(format!(
                "{extra} bytes after the last entry of a key-group block"
            )));
        }
        self.left -= 1;
        let entry = self.read();
        if entry.is_err() {
            self.left = 0;
            self.reader.at = self.reader.bytes.len();
        }
        Some(entry)
    }
}

/// A block of one state's entries in one key group.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ParsedBlock<'a> {
    pub(crate) key_group: u32,
    pub(crate) entries: u32,
    pub(crate) bytes: &'a [u8],
}

/// One state of a parsed snapshot.
pub(crate) struct ParsedState<'a> {
    pub(crate) header: StateHeader,
    pub(crate) blocks: Vec<ParsedBlock<'a>>,
}

/// A snapshot whose structure and checksum were checked; entries still encoded.
pub(crate) struct ParsedSnapshot<'a> {
    pub(crate) max_parallelism: u32,
    pub(crate) key_groups: KeyGroupRange,
    pub(crate) taken_at_ms: i64,
    pub(crate) key_type: &'a str,
    pub(crate) namespace_type: &'a str,
    pub(crate) states: Vec<ParsedState<'a>>,
}

/// A [`StateErrorKind::CorruptSnapshot`] error.
pub(crate) fn corrupt(problem: String) -> StateError {
    StateErrorKind::CorruptSnapshot {
        what: WHAT,
        problem,
    }
    .into()
}

/// Checks magic, version, checksum and structure of a snapshot, and the entries of the
/// key-group blocks for which `read_entries` is true (the others are skipped by their length:
/// a restore reads only its own key groups).
pub(crate) fn parse<'a>(
    bytes: &'a [u8],
    read_entries: &dyn Fn(KeyGroup) -> bool,
) -> Result<ParsedSnapshot<'a>, String> {
    const MIN_LEN: usize = MAGIC.len() + 4 + 4;
    if bytes.len() < MIN_LEN {
        return Err(format!(
            "truncated: {} bytes, shorter than the smallest snapshot ({MIN_LEN} bytes)",
            bytes.len()
        ));
    }
    if bytes[..4] != MAGIC {
        return Err(format!(
            "it starts with {:02x?}, not the magic bytes \"WKST\": it is not a keyed state \
             snapshot",
            &bytes[..4]
        ));
    }
    let (body, stored) = bytes.split_at(bytes.len() - 4);
    let mut reader = Reader::new(body);
    reader.at = MAGIC.len();
    let version = reader.u32("format version")?;
    if version != KEYED_SNAPSHOT_FORMAT_VERSION {
        return Err(format!(
            "format version {version}; this build reads version {KEYED_SNAPSHOT_FORMAT_VERSION}"
        ));
    }
    let stored = u32::from_le_bytes(stored.try_into().map_err(|_| "no checksum".to_string())?);
    let computed = crc32(body);
    if stored != computed {
        return Err(format!(
            "its CRC-32 is {computed:#010x}, but it says {stored:#010x}: the bytes are torn or \
             damaged"
        ));
    }
    let max_parallelism = reader.u32("max parallelism")?;
    if max_parallelism == 0 || max_parallelism > MAX_PARALLELISM_LIMIT {
        return Err(format!(
            "max parallelism {max_parallelism} is outside 1..={MAX_PARALLELISM_LIMIT}"
        ));
    }
    let key_groups = KeyGroupRange {
        start: reader.u32("first key group")?,
        end: reader.u32("last key group")?,
    };
    if key_groups.start > key_groups.end || key_groups.end >= max_parallelism {
        return Err(format!(
            "key groups {}..={} are not a range below max parallelism {max_parallelism}",
            key_groups.start, key_groups.end
        ));
    }
    let taken_at_ms = reader.i64("snapshot time")?;
    let key_type = reader.text("key type")?;
    let namespace_type = reader.text("namespace type")?;
    let count = reader.u32("state count")?;
    let mut states: Vec<ParsedState<'_>> = Vec::with_capacity(count.min(1024) as usize);
    for _ in 0..count {
        let state = parse_state(&mut reader, key_groups, read_entries)?;
        if states
            .iter()
            .any(|other| other.header.name == state.header.name)
        {
            return Err(format!("state '{}' appears twice", state.header.name));
        }
        states.push(state);
    }
    if !reader.is_at_end() {
        return Err(format!(
            "{} unexpected bytes after the last state",
            body.len() - reader.at
        ));
    }
    Ok(ParsedSnapshot {
        max_parallelism,
        key_groups,
        taken_at_ms,
        key_type,
        namespace_type,
        states,
    })
}

fn parse_state<'a>(
    reader: &mut Reader<'a>,
    key_groups: KeyGroupRange,
    read_entries: &dyn Fn(KeyGroup) -> bool,
) -> Result<ParsedState<'a>, String> {
    let name = reader.text("state name")?.to_string();
    let at = reader.at;
    let code = reader.u8("state kind")?;
    let kind = kind_of(code)
        .ok_or_else(|| format!("state '{name}' has the unknown kind {code} at byte {at}"))?;
    let value_type = reader.text("value type")?.to_string();
    let user_key_type = match kind {
        StateKind::Map => Some(reader.text("user key type")?.to_string()),
        _ => None,
    };
    let has_ttl = match reader.u8("TTL flag")? {
        0 => false,
        1 => true,
        other => {
            return Err(format!(
                "state '{name}' has the TTL flag {other}, not 0 or 1"
            ))
        }
    };
    let header = StateHeader {
        name,
        kind,
        value_type,
        user_key_type,
        has_ttl,
    };
    let count = reader.u32("block count")?;
    let mut blocks: Vec<ParsedBlock<'a>> = Vec::with_capacity(count.min(1024) as usize);
    for _ in 0..count {
        let key_group = reader.u32("key group")?;
        let entries = reader.u32("entry count")?;
        let len = reader.u64("block length")?;
        let bytes = reader.take(len, "key-group block")?;
        let problem =
            |what: String| format!("state '{}', key group {key_group}: {what}", header.name);
        if !key_groups.contains(KeyGroup(key_group)) {
            return Err(problem(format!(
                "outside the snapshot's key groups {}..={}",
                key_groups.start, key_groups.end
            )));
        }
        if blocks
            .last()
            .is_some_and(|last| last.key_group >= key_group)
        {
            return Err(problem(
                "key-group blocks are not in ascending order".into(),
            ));
        }
        if entries == 0 {
            return Err(problem("an empty key-group block".into()));
        }
        if read_entries(KeyGroup(key_group)) {
            BlockEntries::new(bytes, entries, &header)
                .validate()
                .map_err(problem)?;
        }
        blocks.push(ParsedBlock {
            key_group,
            entries,
            bytes,
        });
    }
    Ok(ParsedState { header, blocks })
}

/// One entry of [`KeyedStateContents`], still encoded ([`crate::StateCodec`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyedEntryBytes {
    /// The key group of the key.
    pub key_group: KeyGroup,
    /// The encoded key.
    pub key: Vec<u8>,
    /// The encoded namespace, if the entry was written under one.
    pub namespace: Option<Vec<u8>>,
    /// Map state: the encoded user key.
    pub user_key: Option<Vec<u8>>,
    /// The encoded value, list element or map value.
    pub value: Vec<u8>,
    /// When the entry expires (ms since the epoch), for states with TTL.
    pub expires_at_ms: Option<i64>,
}

/// One state of [`KeyedSnapshotContents`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyedStateContents {
    /// The state name.
    pub name: String,
    /// Its kind.
    pub kind: StateKind,
    /// Type of its values, list elements, map values or accumulators (`std::any::type_name`).
    pub value_type: String,
    /// Map state: type of its user keys.
    pub user_key_type: Option<String>,
    /// Whether it has a time to live.
    pub has_ttl: bool,
    /// Its entries, by ascending key group; list elements in list order.
    pub entries: Vec<KeyedEntryBytes>,
}

/// Everything a keyed state snapshot holds, for inspection and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyedSnapshotContents {
    /// The number of key groups of the job.
    pub max_parallelism: u32,
    /// The key groups of the subtask that took it.
    pub key_groups: KeyGroupRange,
    /// When it was taken (ms since the epoch).
    pub taken_at_ms: i64,
    /// `std::any::type_name` of the key type.
    pub key_type: String,
    /// `std::any::type_name` of the namespace type.
    pub namespace_type: String,
    /// Its states: registered ones in registration order, then restored ones that were not
    /// registered again.
    pub states: Vec<KeyedStateContents>,
}

/// Reads the bytes of [`encode_keyed_snapshot`] without the job's types. Damaged, truncated or
/// foreign bytes are a [`StateErrorKind::CorruptSnapshot`] error saying what is wrong.
pub fn decode_keyed_snapshot(bytes: &[u8]) -> Result<KeyedSnapshotContents, StateError> {
    let parsed = parse(bytes, &|_| true).map_err(corrupt)?;
    let mut states = Vec::with_capacity(parsed.states.len());
    for state in parsed.states {
        let mut entries = Vec::new();
        for block in &state.blocks {
            for entry in BlockEntries::new(block.bytes, block.entries, &state.header) {
                let entry = entry.map_err(corrupt)?;
                entries.push(KeyedEntryBytes {
                    key_group: KeyGroup(block.key_group),
                    key: entry.key.to_vec(),
                    namespace: entry.namespace.map(<[u8]>::to_vec),
                    user_key: entry.user_key.map(<[u8]>::to_vec),
                    value: entry.value.to_vec(),
                    expires_at_ms: entry.expires_at_ms,
                });
            }
        }
        let header = state.header;
        states.push(KeyedStateContents {
            name: header.name,
            kind: header.kind,
            value_type: header.value_type,
            user_key_type: header.user_key_type,
            has_ttl: header.has_ttl,
            entries,
        });
    }
    Ok(KeyedSnapshotContents {
        max_parallelism: parsed.max_parallelism,
        key_groups: parsed.key_groups,
        taken_at_ms: parsed.taken_at_ms,
        key_type: parsed.key_type.to_string(),
        namespace_type: parsed.namespace_type.to_string(),
        states,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{KeyedBackendConfig, LocalKeyedBackend, ManualClock, ValueStateDescriptor};

    /// A releasing encoder frees the key groups the live table copied on write since the
    /// snapshot a few entries a step, and has freed every one of them by its end.
    #[test]
    fn a_releasing_encoder_frees_copied_key_groups_in_steps() {
        let config = KeyedBackendConfig::for_subtask(4, 1, 0);
        let backend =
            LocalKeyedBackend::<u64, ()>::heap(config, Arc::new(ManualClock::new(0))).unwrap();
        let value = backend
            .value_state(&ValueStateDescriptor::<Vec<u8>>::new("v"))
            .unwrap();
        let keys = 0..2_000u64;
        for key in keys.clone() {
            backend.set_current_key(&key).unwrap();
            value.update(vec![7; 100]).unwrap();
        }
        let snapshot = backend.heap_snapshot().unwrap();
        // A write to every key group after the snapshot: the live table copies each.
        for key in keys {
            backend.set_current_key(&key).unwrap();
            value.update(vec![8; 100]).unwrap();
        }
        let state = &snapshot.states[0];
        let mut encoder = KeyedSnapshotEncoder::new(&snapshot).releasing();
        let (mut piece, mut freeing_seen) = (Vec::new(), 0);
        loop {
            piece.clear();
            let more = encoder.encode_next(&mut piece, 4_096).unwrap();
            // Between pieces a copied key group may be freed in part; an emptied one is
            // never kept.
            if let Some(left) = state.table_releasing_len() {
                freeing_seen += 1;
                assert!(left > 0, "an emptied iterator is dropped");
            }
            if !more {
                break;
            }
        }
        assert!(freeing_seen > 4, "freed over {freeing_seen} pieces");
        assert_eq!(
            state.table_releasing_len(),
            None,
            "everything freed by the end"
        );
        assert_eq!(state.entries(), 0, "every key group let go of");
    }
}
