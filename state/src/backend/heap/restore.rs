//! Restoring the heap backend from keyed state snapshots ([`crate::backend::keyed_snapshot`]).
//!
//! States are registered lazily — an operator registers one the first time it asks for it —
//! so a restore cannot build typed tables: it does not know the types yet. It keeps each state's
//! entries still encoded ([`RestoredState`]: the key-group blocks of this backend's key groups,
//! from all snapshots, each a slice of its snapshot's bytes, which are shared, not copied), and
//! the state's table is built from them when the state is registered ([`load`], called by `HeapStorage::create_table`), after checking that
//! it is registered as the kind and types it was checkpointed with. Reads and writes never see
//! any of this: a table is complete once registered.
//!
//! A restored state nobody registers again stays encoded, and every later snapshot carries it
//! unchanged, so state is not lost while an operator does not (yet) ask for it.
//!
//! **Rescaling.** A restore takes the snapshots of any number of old subtasks and keeps the
//! blocks of its own key groups only, skipping the others by their length. A key group appears
//! in at most one snapshot of a checkpoint; one that appears twice is an error.
//!
//! **TTL.** Entries keep their expiry. One that has expired by the time its state is registered
//! is dropped. A state checkpointed without TTL and registered with one gives its entries the
//! TTL from the moment of registration; one checkpointed with TTL and registered without keeps
//! its unexpired entries for good. A changed TTL duration applies to writes from then on.

use std::any::type_name;

use bytes::Bytes;
use indexmap::IndexMap;
use rkyv::rancor;

use crate::backend::heap::snapshot::SnapshotValue;
use crate::backend::heap::states::HeapTable;
use crate::backend::heap::table::{hash_of, HashedKey};
use crate::backend::keyed_snapshot::{corrupt, describe, parse, BlockEntries, StateHeader};
use crate::descriptor::StateKind;
use crate::error::{StateError, StateErrorKind};
use crate::key_group::{KeyGroup, KeyGroupRange};
use crate::ttl::{is_expired, NEVER_EXPIRES};
use crate::StateKey;

/// What [`crate::LocalKeyedBackend::restore`] took over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreSummary {
    /// Snapshots read.
    pub snapshots: usize,
    /// Distinct states found in them.
    pub states: usize,
    /// Entries kept: those of this backend's key groups.
    pub entries: u64,
    /// Entries left to other subtasks: those of other key groups.
    pub entries_elsewhere: u64,
    /// Encoded bytes kept until the states are registered.
    pub bytes: u64,
}

/// One key-group block of a [`RestoredState`]: its entries, still encoded, in the snapshot's
/// own bytes (shared, not copied: a restore holds each state file once).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RestoredBlock {
    pub(crate) key_group: u32,
    pub(crate) entries: u32,
    pub(crate) bytes: Bytes,
}

/// A restored state not registered yet: its header and its key-group blocks, still encoded, in
/// ascending key-group order.
#[derive(Clone, Debug)]
pub(crate) struct RestoredState {
    pub(crate) header: StateHeader,
    pub(crate) blocks: Vec<RestoredBlock>,
}

impl RestoredState {
    /// The state without the key groups in `range`.
    pub(crate) fn without(&self, range: KeyGroupRange) -> RestoredState {
        RestoredState {
            header: self.header.clone(),
            blocks: self
                .blocks
                .iter()
                .filter(|block| !range.contains(KeyGroup(block.key_group)))
                .cloned()
                .collect(),
        }
    }

    /// The bytes of its blocks.
    pub(crate) fn len(&self) -> usize {
        self.blocks.iter().map(|block| block.bytes.len()).sum()
    }
}

/// Decoders of the backend's key and namespace types, captured by `restore`, where the types
/// are known to be [`crate::StateCodec`], for registration, where they need not be.
pub(crate) struct KeyDecoder<K, N> {
    pub(crate) key: fn(&[u8]) -> Result<K, rancor::Error>,
    pub(crate) namespace: fn(&[u8]) -> Result<N, rancor::Error>,
}

/// Reads the snapshots and keeps the blocks of `key_groups`, per state, in first-seen order.
pub(crate) fn merge_snapshots(
    snapshots: &[Bytes],
    max_parallelism: u32,
    key_groups: KeyGroupRange,
    key_type: &str,
    namespace_type: &str,
) -> Result<(Vec<RestoredState>, RestoreSummary), StateError> {
    let mut summary = RestoreSummary {
        snapshots: snapshots.len(),
        ..RestoreSummary::default()
    };
    // Per state: what is kept, and which snapshot holds each of its key groups.
    let mut states: IndexMap<String, (RestoredState, Vec<Option<usize>>, usize)> = IndexMap::new();
    let count = snapshots.len();
    for (index, bytes) in snapshots.iter().enumerate() {
        let parsed = parse(bytes, &|key_group| key_groups.contains(key_group))
            .map_err(|problem| corrupt(format!("snapshot {index} of {count}: {problem}")))?;
        let mismatch = |what, restored: String, current: String, fix| -> StateError {
            StateErrorKind::IncompatibleKeyedSnapshot {
                what,
                restored,
                current,
                fix,
            }
            .into()
        };
        if parsed.max_parallelism != max_parallelism {
            return Err(mismatch(
                "max parallelism",
                parsed.max_parallelism.to_string(),
                max_parallelism.to_string(),
                "set pipeline.max-parallelism back to the value the checkpoint was taken with \
                 (it fixes the key groups), or start the job without restoring its state",
            ));
        }
        if parsed.key_type != key_type {
            return Err(mismatch(
                "key type",
                parsed.key_type.to_string(),
                key_type.to_string(),
                "key the stream by the type it was keyed by when the checkpoint was taken, or \
                 start the job without restoring this operator's state",
            ));
        }
        if parsed.namespace_type != namespace_type {
            return Err(mismatch(
                "namespace type",
                parsed.namespace_type.to_string(),
                namespace_type.to_string(),
                "keep the window (namespace) type the checkpoint was taken with, or start the \
                 job without restoring this operator's state",
            ));
        }
        for state in parsed.states {
            let name = state.header.name.clone();
            let (restored, owners, first) = states.entry(name).or_insert_with(|| {
                (
                    RestoredState {
                        header: state.header.clone(),
                        blocks: Vec::new(),
                    },
                    vec![None; key_groups.len() as usize],
                    index,
                )
            });
            if restored.header != state.header {
                return Err(StateErrorKind::InvalidRestore {
                    problem: format!(
                        "state '{}' is {}{} in snapshot {first} but {}{} in snapshot {index}",
                        state.header.name,
                        restored.header.describe(),
                        ttl_text(restored.header.has_ttl),
                        state.header.describe(),
                        ttl_text(state.header.has_ttl),
                    ),
                }
                .into());
            }
            for block in state.blocks {
                if !key_groups.contains(KeyGroup(block.key_group)) {
                    summary.entries_elsewhere += u64::from(block.entries);
                    continue;
                }
                let owner = &mut owners[(block.key_group - key_groups.start) as usize];
                if let Some(other) = *owner {
                    return Err(StateErrorKind::InvalidRestore {
                        problem: format!(
                            "key group {} of state '{}' is in snapshot {other} and in snapshot \
                             {index}: the snapshots overlap",
                            block.key_group, state.header.name
                        ),
                    }
                    .into());
                }
                *owner = Some(index);
                summary.entries += u64::from(block.entries);
                restored.blocks.push(RestoredBlock {
                    key_group: block.key_group,
                    entries: block.entries,
                    bytes: bytes.slice_ref(block.bytes),
                });
            }
        }
    }
    let states: Vec<RestoredState> = states
        .into_values()
        .map(|(mut state, _, _)| {
            // Snapshots handed in another order than their key groups: sort the blocks.
            state.blocks.sort_by_key(|block| block.key_group);
            state
        })
        .collect();
    summary.states = states.len();
    summary.bytes = states.iter().map(|state| state.len() as u64).sum();
    Ok((states, summary))
}

fn ttl_text(has_ttl: bool) -> &'static str {
    if has_ttl {
        " with TTL"
    } else {
        " without TTL"
    }
}

/// Checks that a state registered as `kind` storing `V` is what was checkpointed.
pub(crate) fn check_registration<V: SnapshotValue>(
    restored: &RestoredState,
    kind: StateKind,
) -> Result<(), StateError> {
    let header = &restored.header;
    if header.kind == kind
        && header.value_type == V::value_type()
        && header.user_key_type.as_deref() == V::user_key_type()
    {
        return Ok(());
    }
    Err(StateErrorKind::IncompatibleKeyedRestore {
        state: header.name.clone(),
        restored: header.describe(),
        requested: describe(kind, V::value_type(), V::user_key_type()),
    }
    .into())
}

/// Fills the new, empty `table` of a state being registered with its restored entries, decoding
/// them. `now` decides which entries have expired (see the module docs). Returns the number of
/// entries loaded.
pub(crate) fn load<K: StateKey, N: StateKey, V: SnapshotValue>(
    restored: &RestoredState,
    table: &HeapTable<K, N, V>,
    decoder: &KeyDecoder<K, N>,
    max_parallelism: u32,
    key_groups: KeyGroupRange,
    now: i64,
) -> Result<u64, StateError> {
    let name = restored.header.name.as_str();
    let mut data = table.data.borrow_mut();
    let mut loaded = 0;
    // The last `(key, namespace)`, its encoding and hash: the entries of one key follow each
    // other, so a list or map is decoded and hashed once per key, not once per element.
    let mut last: Option<DecodedKey<'_, K, N>> = None;
    for block in &restored.blocks {
        let group = (block.key_group - key_groups.start) as usize;
        let entries = BlockEntries::new(&block.bytes, block.entries, &restored.header);
        for entry in entries {
            let entry =
                entry.map_err(|problem| corrupt(format!("restored state '{name}': {problem}")))?;
            let expires_at = match entry.expires_at_ms {
                Some(at) if is_expired(at, now) => continue,
                Some(at) if table.ttl.is_some() => at,
                Some(_) => NEVER_EXPIRES,
                None => table
                    .ttl
                    .as_ref()
                    .map_or(NEVER_EXPIRES, |ttl| ttl.expiry_from(now)),
            };
            let cached = match last.take() {
                Some(cached) if cached.key == entry.key && cached.namespace == entry.namespace => {
                    cached
                }
                _ => {
                    let key = decode_with(name, "checkpointed key", decoder.key, entry.key)?;
                    let key_group = KeyGroup::of(&key, max_parallelism);
                    if key_group.0 != block.key_group {
                        return Err(corrupt(format!(
                            "state '{name}' holds key {key:?} in key group {}, but it belongs to \
                             key group {} (max parallelism {max_parallelism}): the key type's \
                             Hash changed since the checkpoint was taken",
                            block.key_group, key_group.0
                        )));
                    }
                    let namespace = match entry.namespace {
                        None => None,
                        Some(bytes) => Some(decode_with(
                            name,
                            "checkpointed namespace",
                            decoder.namespace,
                            bytes,
                        )?),
                    };
                    let composite = (key, namespace);
                    DecodedKey {
                        key: entry.key,
                        namespace: entry.namespace,
                        hash: hash_of(&composite),
                        composite,
                    }
                }
            };
            let cached = last.insert(cached);
            let part = V::decode_part(name, entry.user_key, entry.value, expires_at)?;
            data.add_restored(
                group,
                HashedKey {
                    key: &cached.composite,
                    hash: cached.hash,
                },
                part,
                V::from_part,
                V::add_part,
            );
            loaded += 1;
        }
    }
    Ok(loaded)
}

/// A decoded `(key, namespace)`, its encoding and its hash in the heap maps.
struct DecodedKey<'a, K, N> {
    key: &'a [u8],
    namespace: Option<&'a [u8]>,
    composite: (K, Option<N>),
    hash: u64,
}

/// Decodes `bytes` of state `state` with `decode`, or says what they failed to be.
pub(crate) fn decode_with<T>(
    state: &str,
    what: &'static str,
    decode: fn(&[u8]) -> Result<T, rancor::Error>,
    bytes: &[u8],
) -> Result<T, StateError> {
    decode(bytes).map_err(|error| {
        StateErrorKind::Corrupt {
            state: state.to_string(),
            what,
            type_name: type_name::<T>(),
            len: bytes.len(),
            reason: error.to_string(),
        }
        .into()
    })
}

/// The restored side of one heap backend: states waiting for their registration.
pub(crate) struct RestoredStates<K, N> {
    /// Whether a restore ran (a backend is restored once).
    pub(crate) done: bool,
    /// States restored and not registered yet, in checkpoint order; shared with snapshots.
    pub(crate) states: Vec<std::rc::Rc<RestoredState>>,
    /// Set by the restore.
    pub(crate) decoder: Option<KeyDecoder<K, N>>,
}

impl<K, N> Default for RestoredStates<K, N> {
    fn default() -> Self {
        RestoredStates {
            done: false,
            states: Vec::new(),
            decoder: None,
        }
    }
}
