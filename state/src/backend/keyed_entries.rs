//! Keyed state an operator keeps in structures of its own — window panes and their timers,
//! join buffers — written in the canonical keyed-snapshot format ([`crate::backend::keyed_snapshot`])
//! and read back by key group.
//!
//! Such operators hold their state in maps tuned for their access pattern rather than in a
//! keyed backend, but their checkpoints are keyed state all the same: the same file format,
//! the same key-group blocks (so the state moves between subtasks when a job is rescaled), the
//! same type fingerprints and checksum, readable by the same tools. [`KeyedSnapshotWriter`]
//! takes entries in any order — an operator walks its hash map — and files each under its
//! key's group; [`KeyedSnapshotEntries`] reads the snapshots of one or more old subtasks and
//! hands back, decoded, the entries of the key groups a subtask owns now.
//!
//! Values travel through a [`StateValueCodec`]: the value type's fingerprint and its encoder
//! and decoder as plain functions, so code generic over a type that is not known to be
//! [`StateCodec`] where the snapshot is written (a window function's accumulator) can carry
//! the codec of the type from where it is.

use std::any::type_name;
use std::marker::PhantomData;

use bytes::Bytes;
use rkyv::rancor;

use crate::backend::heap::restore::{decode_with, merge_snapshots, RestoreSummary, RestoredState};
use crate::backend::keyed_snapshot::{
    block_header, corrupt, describe, write_entry, write_header_raw, write_state_start,
    BlockEntries, RawEntry, StateHeader, BLOCK_HEADER_LEN,
};
use crate::checksum::Crc32;
use crate::codec::StateCodec;
use crate::descriptor::StateKind;
use crate::error::{StateError, StateErrorKind};
use crate::key_group::{KeyGroup, KeyGroupRange};
use crate::StateKey;

/// How the values of one state become bytes and back: the type's fingerprint
/// (`std::any::type_name`, checked on restore) and its [`StateCodec`] functions.
pub struct StateValueCodec<V> {
    value_type: &'static str,
    encode: fn(&V, &mut Vec<u8>) -> Result<(), rancor::Error>,
    decode: fn(&[u8]) -> Result<V, rancor::Error>,
}

impl<V> Clone for StateValueCodec<V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<V> Copy for StateValueCodec<V> {}

impl<V> std::fmt::Debug for StateValueCodec<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("StateValueCodec")
            .field(&self.value_type)
            .finish()
    }
}

impl<V: StateCodec> StateValueCodec<V> {
    /// The codec of `V`.
    pub fn of() -> Self {
        StateValueCodec {
            value_type: type_name::<V>(),
            encode: V::encode_into,
            decode: V::decode,
        }
    }
}

impl<V> StateValueCodec<V> {
    /// The value type's fingerprint.
    pub fn value_type(&self) -> &'static str {
        self.value_type
    }
}

/// A state of a [`KeyedSnapshotWriter`], as [`KeyedSnapshotWriter::add_state`] returned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriterState(usize);

/// One state being written: its header and its entries per key group of the subtask.
struct PendingState {
    header: StateHeader,
    value_type: &'static str,
    /// Per key group of the subtask (index: group - first group).
    blocks: Vec<Block>,
}

/// The entries of one key group of one state, in chunks of about [`CHUNK_BYTES`] (a block
/// that grows is never copied, and its memory is of one size the allocator reuses).
#[derive(Clone, Debug, Default)]
struct Block {
    entries: u32,
    /// Bytes in the chunks, the header's room included.
    len: usize,
    /// The first begins with room for the block's header ([`BLOCK_HEADER_LEN`] bytes, filled
    /// in when the block is handed out); none while the block has no entries.
    chunks: Vec<Vec<u8>>,
}

/// About how many bytes a chunk of a [`Block`] holds.
const CHUNK_BYTES: usize = 64 << 10;

impl Block {
    /// The chunk to append an entry of `len` bytes to.
    fn chunk_for(&mut self, len: usize) -> &mut Vec<u8> {
        let full = self
            .chunks
            .last()
            .is_none_or(|chunk| chunk.len() + len > chunk.capacity());
        if full {
            let mut chunk = Vec::with_capacity(CHUNK_BYTES.max(len + BLOCK_HEADER_LEN));
            if self.chunks.is_empty() {
                chunk.extend_from_slice(&[0; BLOCK_HEADER_LEN]);
                self.len = BLOCK_HEADER_LEN;
            }
            self.chunks.push(chunk);
        }
        self.chunks.last_mut().expect("a chunk")
    }
}

/// Writes one operator subtask's keyed state in the canonical keyed-snapshot format from
/// entries given in any order (see the module docs). Keys are `K`; namespaces `N`.
///
/// ```
/// use weir_state::{KeyGroupRange, KeyedSnapshotEntries, KeyedSnapshotWriter, StateKind, StateValueCodec};
///
/// # fn main() -> Result<(), weir_state::StateError> {
/// let groups = KeyGroupRange::for_subtask(128, 1, 0);
/// let counts = StateValueCodec::<u64>::of();
/// let mut writer = KeyedSnapshotWriter::<String, i64>::new(128, groups, 0);
/// let state = writer.add_state("counts", StateKind::Value, counts.value_type());
/// writer.set_key(&"a".to_string())?;
/// writer.put(state, Some(&10), &counts, &3)?;
/// let mut bytes = Vec::new();
/// writer.finish(&mut bytes)?;
///
/// let restored = KeyedSnapshotEntries::<String, i64>::read(&[&bytes], 128, groups)?;
/// let mut seen = Vec::new();
/// restored.for_each("counts", StateKind::Value, &counts, |key, window, count| {
///     seen.push((key.clone(), window, count));
///     Ok(())
/// })?;
/// assert_eq!(seen, vec![("a".to_string(), Some(10), 3)]);
/// # Ok(())
/// # }
/// ```
pub struct KeyedSnapshotWriter<K, N> {
    max_parallelism: u32,
    key_groups: KeyGroupRange,
    taken_at_ms: i64,
    states: Vec<PendingState>,
    /// The current key's encoding and block index (`None`: no key set yet).
    key_bytes: Vec<u8>,
    block: Option<usize>,
    namespace_bytes: Vec<u8>,
    value_bytes: Vec<u8>,
    /// Bytes of the blocks so far.
    encoded: usize,
    _types: PhantomData<fn(&K, &N)>,
}

impl<K: StateKey + StateCodec, N: StateCodec> KeyedSnapshotWriter<K, N> {
    /// A writer for the subtask owning `key_groups` of `max_parallelism`, stamped `taken_at_ms`.
    pub fn new(max_parallelism: u32, key_groups: KeyGroupRange, taken_at_ms: i64) -> Self {
        KeyedSnapshotWriter {
            max_parallelism,
            key_groups,
            taken_at_ms,
            states: Vec::new(),
            key_bytes: Vec::new(),
            block: None,
            namespace_bytes: Vec::new(),
            value_bytes: Vec::new(),
            encoded: 0,
            _types: PhantomData,
        }
    }

    /// Adds a state of `kind` whose values are `value_type` (a [`StateValueCodec::value_type`]);
    /// a list state gets one entry per element.
    ///
    /// # Panics
    /// If `kind` is map state (its entries need user keys, which this writer does not take)
    /// or a state of that name was added already: both are mistakes in the calling code.
    pub fn add_state(
        &mut self,
        name: &str,
        kind: StateKind,
        value_type: &'static str,
    ) -> WriterState {
        assert!(
            kind != StateKind::Map,
            "KeyedSnapshotWriter writes value, list, reducing and aggregating state, not map \
             state '{name}'"
        );
        assert!(
            self.states.iter().all(|state| state.header.name != name),
            "state '{name}' added twice to a KeyedSnapshotWriter"
        );
        self.states.push(PendingState {
            header: StateHeader {
                name: name.to_string(),
                kind,
                value_type: value_type.to_string(),
                user_key_type: None,
                has_ttl: false,
            },
            value_type,
            blocks: vec![Block::default(); self.key_groups.len() as usize],
        });
        WriterState(self.states.len() - 1)
    }

    /// Makes `key` the key of the entries [`KeyedSnapshotWriter::put`] adds next.
    pub fn set_key(&mut self, key: &K) -> Result<(), StateError> {
        self.key_bytes.clear();
        key.encode_into(&mut self.key_bytes)
            .map_err(|error| StateError::encoding("*", type_name::<K>(), error))?;
        let group = KeyGroup::of(key, self.max_parallelism);
        if !self.key_groups.contains(group) {
            self.block = None;
            return Err(StateErrorKind::Encode {
                state: "*".to_string(),
                type_name: type_name::<K>(),
                reason: format!(
                    "key {key:?} is in key group {}, outside the key groups {}..={} of the \
                     subtask writing the snapshot",
                    group.0, self.key_groups.start, self.key_groups.end
                ),
            }
            .into());
        }
        self.block = Some((group.0 - self.key_groups.start) as usize);
        Ok(())
    }

    /// Adds the entry `value` under `namespace` of the current key to `state`.
    ///
    /// # Panics
    /// If no key was set, or `state` is another writer's.
    pub fn put<V>(
        &mut self,
        state: WriterState,
        namespace: Option<&N>,
        codec: &StateValueCodec<V>,
        value: &V,
    ) -> Result<(), StateError> {
        self.put_with(state, namespace, |out| (codec.encode)(value, out))
    }

    /// Adds an entry under `namespace` of the current key to `state` whose value `encode`
    /// appends to the buffer it is given: the value's [`StateCodec`] encoding, of the type the
    /// state was added with.
    ///
    /// # Panics
    /// If no key was set, or `state` is another writer's.
    pub fn put_with(
        &mut self,
        state: WriterState,
        namespace: Option<&N>,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), rancor::Error>,
    ) -> Result<(), StateError> {
        let block = self
            .block
            .expect("KeyedSnapshotWriter::put without a key: call set_key first");
        let pending = &mut self.states[state.0];
        let name = pending.header.name.as_str();
        if let Some(namespace) = namespace {
            self.namespace_bytes.clear();
            namespace
                .encode_into(&mut self.namespace_bytes)
                .map_err(|error| StateError::encoding(name, type_name::<N>(), error))?;
        }
        self.value_bytes.clear();
        encode(&mut self.value_bytes)
            .map_err(|error| StateError::encoding(name, pending.value_type, error))?;
        self.encoded += append_entry(
            pending,
            block,
            &self.key_bytes,
            namespace.map(|_| self.namespace_bytes.as_slice()),
            &self.value_bytes,
        )?;
        Ok(())
    }

    /// Adds an entry to `state` under the current key whose namespace and value come encoded
    /// ([`StateCodec`] encodings of `N` and of the state's value type): for a caller that
    /// encodes a value once for many entries.
    ///
    /// # Panics
    /// If no key was set, or `state` is another writer's.
    pub fn put_encoded(
        &mut self,
        state: WriterState,
        namespace: Option<&[u8]>,
        value: &[u8],
    ) -> Result<(), StateError> {
        let block = self
            .block
            .expect("KeyedSnapshotWriter::put without a key: call set_key first");
        let pending = &mut self.states[state.0];
        self.encoded += append_entry(pending, block, &self.key_bytes, namespace, value)?;
        Ok(())
    }

    /// About how many bytes the entries put so far take in the snapshot.
    pub fn encoded_len(&self) -> usize {
        self.encoded
    }

    /// Marks the current key as removed: a delta of a chain
    /// ([`crate::merge_keyed_chain`]) says so for a key an earlier link holds and the operator
    /// no longer has. Its entry goes into the state [`crate::REMOVED_KEYS`], added on first use.
    ///
    /// # Panics
    /// If no key was set.
    pub fn remove_key(&mut self) -> Result<(), StateError> {
        let removed = match self
            .states
            .iter()
            .position(|state| state.header.name == crate::REMOVED_KEYS)
        {
            Some(at) => WriterState(at),
            None => self.add_state(crate::REMOVED_KEYS, StateKind::Value, type_name::<()>()),
        };
        self.put_with(removed, None, |_| Ok(()))
    }

    /// Appends the snapshot to `out`. On an error `out` is left as it was.
    pub fn finish(self, out: &mut Vec<u8>) -> Result<(), StateError> {
        // The header goes first, so no block is swapped in (see `encode_next`).
        let mut pieces = self.into_pieces();
        while pieces.encode_next(out, usize::MAX)? {}
        Ok(())
    }

    /// The snapshot, to be handed out in pieces ([`KeyedSnapshotPieces::encode_next`]): the
    /// bytes [`KeyedSnapshotWriter::finish`] appends.
    pub fn into_pieces(self) -> KeyedSnapshotPieces {
        KeyedSnapshotPieces {
            max_parallelism: self.max_parallelism,
            key_groups: self.key_groups,
            taken_at_ms: self.taken_at_ms,
            key_type: type_name::<K>(),
            namespace_type: type_name::<N>(),
            states: self.states,
            next: Piece::Header,
            crc: Crc32::default(),
        }
    }
}

/// A snapshot a [`KeyedSnapshotWriter`] wrote, handed out in pieces so that a checkpoint
/// writer can write it while records flow, without copying it whole once more.
pub struct KeyedSnapshotPieces {
    max_parallelism: u32,
    key_groups: KeyGroupRange,
    taken_at_ms: i64,
    key_type: &'static str,
    namespace_type: &'static str,
    states: Vec<PendingState>,
    next: Piece,
    crc: Crc32,
}

/// What a [`KeyedSnapshotPieces`] hands out next.
#[derive(Clone, Copy, Debug)]
enum Piece {
    Header,
    /// The header and block count of state `n` (past the last: the checksum).
    State(usize),
    /// Of state `.0`, chunk `.2` of the block of the subtask's key group `.1` (counted from
    /// its first).
    Block(usize, usize, usize),
    Done,
}

impl KeyedSnapshotPieces {
    /// Appends the next bytes of the snapshot to `out`, at least `budget` of them unless it
    /// ends first, and returns whether more follow. A block's chunk is handed out whole — and
    /// when `out` is empty, it becomes `out` (the buffers are swapped, not the chunk copied,
    /// so `out` may come back as another allocation). On an error, `out` is left as it was.
    pub fn encode_next(&mut self, out: &mut Vec<u8>, budget: usize) -> Result<bool, StateError> {
        if let Piece::Done = self.next {
            return Ok(false);
        }
        let start = out.len();
        match self.fill(out, start, budget) {
            Ok(more) => {
                self.crc.update(&out[start..]);
                if !more {
                    let checksum = std::mem::take(&mut self.crc).finish();
                    out.extend_from_slice(&checksum.to_le_bytes());
                }
                Ok(more)
            }
            Err(error) => {
                out.truncate(start);
                Err(error)
            }
        }
    }

    fn fill(&mut self, out: &mut Vec<u8>, start: usize, budget: usize) -> Result<bool, StateError> {
        while out.len() - start < budget {
            match self.next {
                Piece::Header => {
                    write_header_raw(
                        out,
                        self.max_parallelism,
                        self.key_groups,
                        self.taken_at_ms,
                        self.key_type,
                        self.namespace_type,
                        self.states.len(),
                    )?;
                    self.next = Piece::State(0);
                }
                Piece::State(index) => {
                    let Some(state) = self.states.get(index) else {
                        self.next = Piece::Done;
                        return Ok(false);
                    };
                    let blocks = state.blocks.iter().filter(|b| b.entries > 0).count();
                    write_state_start(out, &state.header, blocks)?;
                    self.next = Piece::Block(index, 0, 0);
                }
                Piece::Block(index, at, chunk) => {
                    let Some(block) = self.states[index].blocks.get_mut(at) else {
                        self.next = Piece::State(index + 1);
                        continue;
                    };
                    let Some(bytes) = block.chunks.get_mut(chunk) else {
                        // Handed out: its memory goes now, not with the whole snapshot.
                        block.chunks = Vec::new();
                        self.next = Piece::Block(index, at + 1, 0);
                        continue;
                    };
                    self.next = Piece::Block(index, at, chunk + 1);
                    if chunk == 0 {
                        let len = block.len - BLOCK_HEADER_LEN;
                        let group = self.key_groups.start + at as u32;
                        let header = block_header(group, block.entries, len);
                        bytes[..BLOCK_HEADER_LEN].copy_from_slice(&header);
                    }
                    if out.is_empty() {
                        std::mem::swap(out, bytes);
                    } else {
                        out.extend_from_slice(bytes);
                    }
                }
                Piece::Done => return Ok(false),
            }
        }
        Ok(true)
    }
}

/// Appends an entry of `key` to `state`'s block `block`; returns the bytes it took.
fn append_entry(
    state: &mut PendingState,
    block: usize,
    key: &[u8],
    namespace: Option<&[u8]>,
    value: &[u8],
) -> Result<usize, StateError> {
    let block = &mut state.blocks[block];
    let len = 13 + key.len() + namespace.map_or(0, |namespace| 4 + namespace.len()) + value.len();
    let before = block.len;
    let out = block.chunk_for(len);
    let start = out.len();
    write_entry(
        out,
        &state.header.name,
        &RawEntry {
            key,
            namespace,
            user_key: None,
            value,
            expires_at_ms: None,
        },
    )?;
    let written = out.len() - start;
    block.len += written;
    block.entries += 1;
    Ok(block.len - before)
}

/// The entries of the key groups one subtask owns, from the keyed snapshots of one or more
/// subtasks of a checkpoint (see the module docs). Keys are `K`; namespaces `N`.
pub struct KeyedSnapshotEntries<K, N> {
    states: Vec<RestoredState>,
    summary: RestoreSummary,
    max_parallelism: u32,
    _types: PhantomData<fn() -> (K, N)>,
}

impl<K: StateKey + StateCodec, N: StateCodec> KeyedSnapshotEntries<K, N> {
    /// Reads `snapshots` and keeps the entries of `key_groups`. Fails on damaged bytes, a
    /// snapshot of another max parallelism, key type or namespace type, or two snapshots
    /// holding one key group.
    pub fn read(
        snapshots: &[&[u8]],
        max_parallelism: u32,
        key_groups: KeyGroupRange,
    ) -> Result<Self, StateError> {
        let shared: Vec<Bytes> = snapshots
            .iter()
            .map(|bytes| Bytes::copy_from_slice(bytes))
            .collect();
        Self::read_shared(&shared, max_parallelism, key_groups)
    }

    /// [`KeyedSnapshotEntries::read`] from bytes it shares instead of copying
    /// ([`KeyedSnapshotEntries::read`] copies each snapshot whole first).
    pub fn read_shared(
        snapshots: &[Bytes],
        max_parallelism: u32,
        key_groups: KeyGroupRange,
    ) -> Result<Self, StateError> {
        let (states, summary) = merge_snapshots(
            snapshots,
            max_parallelism,
            key_groups,
            type_name::<K>(),
            type_name::<N>(),
        )?;
        Ok(KeyedSnapshotEntries {
            states,
            summary,
            max_parallelism,
            _types: PhantomData,
        })
    }

    /// What the read took over.
    pub fn summary(&self) -> RestoreSummary {
        self.summary
    }

    /// The names of the states the snapshots hold, in snapshot order.
    pub fn state_names(&self) -> impl Iterator<Item = &str> {
        self.states.iter().map(|state| state.header.name.as_str())
    }

    /// Calls `visit` with every entry of `name` (list elements in list order), decoded, and
    /// returns how many there were. A state the snapshots lack has none; one checkpointed as
    /// another kind or value type than `kind` and `codec`'s is an error naming both.
    pub fn for_each<V>(
        &self,
        name: &str,
        kind: StateKind,
        codec: &StateValueCodec<V>,
        mut visit: impl FnMut(&K, Option<N>, V) -> Result<(), StateError>,
    ) -> Result<u64, StateError> {
        self.for_each_encoded(name, kind, codec.value_type, |key, namespace, bytes| {
            let value = decode_with(name, "checkpointed value", codec.decode, bytes)?;
            visit(key, namespace, value)
        })
    }

    /// [`KeyedSnapshotEntries::for_each`] with the values still encoded: `visit` gets the
    /// [`StateCodec`] encoding of a `value_type`.
    pub fn for_each_encoded(
        &self,
        name: &str,
        kind: StateKind,
        value_type: &'static str,
        mut visit: impl FnMut(&K, Option<N>, &[u8]) -> Result<(), StateError>,
    ) -> Result<u64, StateError> {
        let Some(state) = self.states.iter().find(|state| state.header.name == name) else {
            return Ok(0);
        };
        let header = &state.header;
        if header.kind != kind || header.value_type != value_type || header.has_ttl {
            return Err(StateErrorKind::IncompatibleKeyedRestore {
                state: name.to_string(),
                restored: header.describe(),
                requested: describe(kind, value_type, None),
            }
            .into());
        }
        let mut visited = 0;
        let mut last: Option<(&[u8], K)> = None;
        for block in &state.blocks {
            for entry in BlockEntries::new(&block.bytes, block.entries, header) {
                let entry =
                    entry.map_err(|problem| corrupt(format!("state '{name}': {problem}")))?;
                let key = match last.take() {
                    Some((bytes, key)) if bytes == entry.key => (bytes, key),
                    _ => {
                        let key = decode_with(name, "checkpointed key", K::decode, entry.key)?;
                        let group = KeyGroup::of(&key, self.max_parallelism);
                        if group.0 != block.key_group {
                            return Err(corrupt(format!(
                                "state '{name}' holds key {key:?} in key group {}, but it \
                                 belongs to key group {} (max parallelism {}): the key type's \
                                 Hash changed since the checkpoint was taken",
                                block.key_group, group.0, self.max_parallelism
                            )));
                        }
                        (entry.key, key)
                    }
                };
                let namespace = match entry.namespace {
                    None => None,
                    Some(bytes) => Some(decode_with(
                        name,
                        "checkpointed namespace",
                        N::decode,
                        bytes,
                    )?),
                };
                visit(&key.1, namespace, entry.value)?;
                last = Some(key);
                visited += 1;
            }
        }
        Ok(visited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode_keyed_snapshot;

    fn groups(parallelism: u32, subtask: u32) -> KeyGroupRange {
        KeyGroupRange::for_subtask(128, parallelism, subtask)
    }

    /// Writes `entries` (key, namespace, value) of one value state as the subtasks of
    /// `parallelism` would, each its own keys.
    fn write(parallelism: u32, entries: &[(u32, i64, u64)]) -> Vec<Vec<u8>> {
        writers(parallelism, entries)
            .into_iter()
            .map(|writer| {
                let mut out = Vec::new();
                writer.finish(&mut out).unwrap();
                out
            })
            .collect()
    }

    /// The writers of [`write`], before they finish.
    fn writers(
        parallelism: u32,
        entries: &[(u32, i64, u64)],
    ) -> Vec<KeyedSnapshotWriter<u32, i64>> {
        let codec = StateValueCodec::<u64>::of();
        (0..parallelism)
            .map(|subtask| {
                let owned = groups(parallelism, subtask);
                let mut writer = KeyedSnapshotWriter::<u32, i64>::new(128, owned, 7);
                let state = writer.add_state("v", StateKind::Value, codec.value_type());
                let list = writer.add_state("l", StateKind::List, codec.value_type());
                for (key, namespace, value) in entries {
                    if owned.contains(KeyGroup::of(key, 128)) {
                        writer.set_key(key).unwrap();
                        writer.put(state, Some(namespace), &codec, value).unwrap();
                        writer.put(list, None, &codec, value).unwrap();
                        writer.put(list, None, &codec, &(value + 1)).unwrap();
                    }
                }
                writer
            })
            .collect()
    }

    /// A block larger than a chunk is handed out chunk by chunk, whole and in order, and
    /// reads back entry for entry.
    #[test]
    fn a_block_of_many_chunks_reads_back() {
        let codec = StateValueCodec::<u64>::of();
        let groups = KeyGroupRange { start: 0, end: 0 };
        let writer = || {
            let mut writer = KeyedSnapshotWriter::<u32, i64>::new(1, groups, 7);
            let state = writer.add_state("v", StateKind::Value, codec.value_type());
            for key in 0..20_000u32 {
                writer.set_key(&key).unwrap();
                writer
                    .put(state, Some(&-1), &codec, &u64::from(key))
                    .unwrap();
            }
            writer
        };
        let mut whole = Vec::new();
        writer().finish(&mut whole).unwrap();
        assert!(whole.len() > 8 * CHUNK_BYTES, "{} bytes", whole.len());
        let mut pieces = writer().into_pieces();
        let (mut bytes, mut piece, mut count) = (Vec::new(), Vec::new(), 0);
        while {
            piece.clear();
            let more = pieces.encode_next(&mut piece, 1).unwrap();
            bytes.extend_from_slice(&piece);
            count += 1;
            more
        } {}
        assert!(count > 8, "{count} pieces");
        assert_eq!(bytes, whole);
        let restored = KeyedSnapshotEntries::<u32, i64>::read(&[&bytes], 1, groups).unwrap();
        let mut seen = Vec::new();
        restored
            .for_each("v", StateKind::Value, &codec, |key, _, value| {
                seen.push((*key, value));
                Ok(())
            })
            .unwrap();
        seen.sort_unstable();
        let expected: Vec<(u32, u64)> = (0..20_000).map(|key| (key, u64::from(key))).collect();
        assert_eq!(seen, expected);
    }

    proptest::proptest! {
        /// Handed out in pieces of any size — each into an empty buffer (blocks are swapped
        /// in) or appended to what came before — a snapshot is the bytes `finish` writes.
        #[test]
        fn pieces_make_the_snapshot_finish_writes(
            keys in proptest::collection::hash_map(proptest::prelude::any::<u32>(), (proptest::prelude::any::<i64>(), proptest::prelude::any::<u64>()), 0..80),
            budget in 1usize..600,
            fresh in proptest::prelude::any::<bool>(),
        ) {
            let entries: Vec<(u32, i64, u64)> = keys.iter().map(|(k, (n, v))| (*k, *n, *v)).collect();
            let whole = write(1, &entries).pop().unwrap();
            let writer = writers(1, &entries).pop().unwrap();
            proptest::prop_assert!(writer.encoded_len() <= whole.len());
            let mut pieces = writer.into_pieces();
            let mut bytes = Vec::new();
            let mut piece = Vec::new();
            loop {
                let more = if fresh {
                    piece.clear();
                    let more = pieces.encode_next(&mut piece, budget).unwrap();
                    bytes.extend_from_slice(&piece);
                    more
                } else {
                    pieces.encode_next(&mut bytes, budget).unwrap()
                };
                if !more {
                    break;
                }
            }
            // Once done, it hands out nothing more.
            proptest::prop_assert!(!pieces.encode_next(&mut bytes, budget).unwrap());
            proptest::prop_assert_eq!(bytes, whole);
        }
    }

    fn read(snapshots: &[Vec<u8>], owned: KeyGroupRange) -> Vec<(u32, Option<i64>, u64)> {
        let parts: Vec<&[u8]> = snapshots.iter().map(Vec::as_slice).collect();
        let restored = KeyedSnapshotEntries::<u32, i64>::read(&parts, 128, owned).unwrap();
        let mut seen = Vec::new();
        let codec = StateValueCodec::<u64>::of();
        restored
            .for_each("v", StateKind::Value, &codec, |key, namespace, value| {
                seen.push((*key, namespace, value));
                Ok(())
            })
            .unwrap();
        let mut lists = std::collections::HashMap::<u32, Vec<u64>>::new();
        restored
            .for_each("l", StateKind::List, &codec, |key, namespace, value| {
                assert_eq!(namespace, None);
                lists.entry(*key).or_default().push(value);
                Ok(())
            })
            .unwrap();
        // A key's list elements come back in the order they were put.
        assert_eq!(lists.len(), seen.len());
        for (key, _, value) in &seen {
            assert_eq!(lists[key], vec![*value, value + 1]);
        }
        seen.sort_unstable();
        seen
    }

    proptest::proptest! {
        /// Whatever the order entries come in, and whichever subtasks wrote them, a subtask
        /// reads back exactly the entries of its key groups, and the format's own decoder reads
        /// the bytes.
        #[test]
        fn entries_come_back_by_key_group(
            keys in proptest::collection::hash_map(proptest::prelude::any::<u32>(), (proptest::prelude::any::<i64>(), proptest::prelude::any::<u64>()), 0..60),
            written_by in 1u32..4,
            read_by in 1u32..4,
        ) {
            let entries: Vec<(u32, i64, u64)> = keys.iter().map(|(k, (n, v))| (*k, *n, *v)).collect();
            let snapshots = write(written_by, &entries);
            for snapshot in &snapshots {
                let decoded = decode_keyed_snapshot(snapshot).unwrap();
                proptest::prop_assert_eq!(decoded.taken_at_ms, 7);
                proptest::prop_assert_eq!(decoded.states.len(), 2);
                proptest::prop_assert!(decoded.states[0].entries.is_sorted_by_key(|e| e.key_group));
            }
            let mut all = Vec::new();
            for subtask in 0..read_by {
                let owned = groups(read_by, subtask);
                let got = read(&snapshots, owned);
                for (key, ..) in &got {
                    proptest::prop_assert!(owned.contains(KeyGroup::of(key, 128)));
                }
                all.extend(got);
            }
            all.sort_unstable();
            let mut expected: Vec<(u32, Option<i64>, u64)> = entries.iter().map(|&(k, n, v)| (k, Some(n), v)).collect();
            expected.sort_unstable();
            proptest::prop_assert_eq!(all, expected);
        }
    }

    #[test]
    fn a_state_read_as_another_type_names_both() {
        let snapshots = write(1, &[(1, 2, 3)]);
        let restored =
            KeyedSnapshotEntries::<u32, i64>::read(&[&snapshots[0]], 128, groups(1, 0)).unwrap();
        let error = restored
            .for_each(
                "v",
                StateKind::Value,
                &StateValueCodec::<u32>::of(),
                |_, _, _| Ok(()),
            )
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("ValueState<u64>") && error.contains("ValueState<u32>"),
            "{error}"
        );
        let error = restored
            .for_each(
                "v",
                StateKind::List,
                &StateValueCodec::<u64>::of(),
                |_, _, _| Ok(()),
            )
            .unwrap_err()
            .to_string();
        assert!(error.contains("ListState<u64>"), "{error}");
        assert_eq!(
            restored
                .for_each(
                    "absent",
                    StateKind::Value,
                    &StateValueCodec::<u64>::of(),
                    |_, _, _| Ok(())
                )
                .unwrap(),
            0
        );
        let error = KeyedSnapshotEntries::<u64, i64>::read(&[&snapshots[0]], 128, groups(1, 0))
            .err()
            .expect("another key type")
            .to_string();
        assert!(error.contains("key type"), "{error}");
    }

    #[test]
    fn a_key_of_another_subtask_is_refused_when_written() {
        let owned = groups(2, 0);
        let mut writer = KeyedSnapshotWriter::<u32, i64>::new(128, owned, 0);
        let foreign = (0..)
            .find(|k: &u32| !owned.contains(KeyGroup::of(k, 128)))
            .unwrap();
        let error = writer.set_key(&foreign).unwrap_err().to_string();
        assert!(error.contains("outside the key groups 0..=63"), "{error}");
    }

    #[test]
    fn damage_is_found() {
        let mut snapshot = write(1, &[(1, 2, 3)]).remove(0);
        let at = snapshot.len() / 2;
        snapshot[at] ^= 0x40;
        let error = KeyedSnapshotEntries::<u32, i64>::read(&[&snapshot], 128, groups(1, 0))
            .err()
            .expect("damaged")
            .to_string();
        assert!(error.contains("CRC-32"), "{error}");
    }
}
