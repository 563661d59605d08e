//! Checkpoints of the window operators' state.
//!
//! A window operator keeps its windows in maps of its own (`aligned.rs`, `session.rs`,
//! `global.rs`), not in a keyed backend, and checkpoints them as keyed state
//! (`checkpoint::keyed`): the task's `keyed` part of the operator, keyed by the window's key,
//! with these states:
//!
//! - `window-contents`: per window, its accumulator (value state), or its records for
//!   `process` (list state); the namespace is the pane `[start, start + pane)` of tumbling and
//!   sliding windows, the session `[start, end)`, none for count windows;
//! - `window-fire-timers` (list of `i64`): the key's window-firing timers — the one live timer
//!   of an aligned window's key, one at the end of each of a key's sessions not fired yet;
//! - `window-cleanup-timers` (list of `i64`): sessions kept for their allowed lateness;
//! - `window-count` (`u64`): records in the key's count window.
//!
//! That is the canonical layout, the operator's `keyed` part: every heap checkpoint and every
//! savepoint, on either backend, restorable on either. With the RocksDB backend the contents
//! live in the operator's RocksDB instance (`stored.rs`): a checkpoint writes them as the
//! instance's own (`checkpoint::native`), and this layout in the operator's `own-keyed` part
//! with the pane number the contents are stored under as each accumulator; a savepoint reads
//! the contents out of the instance into the canonical layout ([`Layout`]).
//!
//! Pane clean-up timers are not written: a restore sets them again from the panes. The
//! operator's watermark is not written either: as in Flink, a restored operator starts from
//! no watermark, and its timers fire when watermarks arrive again.
//!
//! Window operators write their snapshot after the barrier, in pieces between records
//! (`deferred.rs`): the barrier lists the keys, and each is written on the operator's turn or
//! just before it first changes, whichever comes first. With incremental checkpoints
//! (`checkpoint::chain`) they record which keys change, and a checkpoint writes only those
//! (and which keys went) as a delta over the last full link.

use std::any::type_name;

use rkyv::rancor;
use weir_state::{
    KeyedSnapshotEntries, KeyedSnapshotWriter, StateCodec, StateError, StateErrorKind, StateKind,
    StateValueCodec,
};

use crate::checkpoint::keyed::foreign_state;
pub(crate) use crate::checkpoint::keyed::KeyedScope;
#[cfg(test)]
use crate::checkpoint::task_state::OperatorSnapshot;
use crate::operator::RuntimeContext;
use crate::record::Key;

/// The accumulators (or records) of panes, sessions and count windows.
pub(crate) const CONTENTS: &str = "window-contents";
/// Window-firing timers.
pub(crate) const FIRE_TIMERS: &str = "window-fire-timers";
/// Session clean-up timers (allowed lateness).
pub(crate) const CLEANUP_TIMERS: &str = "window-cleanup-timers";
/// Records in each key's count window.
pub(crate) const COUNTS: &str = "window-count";

/// How a window function's accumulator is checkpointed: as the entries of a value or list
/// state of `value_type` under its key and window.
pub(crate) struct AccCodec<A> {
    pub(super) kind: StateKind,
    pub(super) value_type: &'static str,
    /// Puts each entry of `acc` (none, one, or a list's elements).
    pub(super) encode: fn(&A, &mut Entries<'_>) -> Result<(), StateError>,
    /// Folds one checkpointed entry into `acc` (a value state's entry replaces it).
    pub(super) decode_entry: fn(&mut A, &[u8]) -> Result<(), StateError>,
}

impl<A> Clone for AccCodec<A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for AccCodec<A> {}

impl<A> AccCodec<A> {
    /// Calls `visit` with every window content in `restored`: key, window and encoded entry,
    /// which [`AccCodec::decode_into`] folds into the window's accumulator.
    pub(crate) fn restore<K: Key, N: StateCodec>(
        &self,
        restored: &KeyedSnapshotEntries<K, N>,
        visit: impl FnMut(&K, Option<N>, &[u8]) -> Result<(), StateError>,
    ) -> Result<u64, StateError> {
        restored.for_each_encoded(CONTENTS, self.kind, self.value_type, visit)
    }

    /// Folds one checkpointed entry into `acc` (a value state's entry replaces it).
    pub(crate) fn decode_into(&self, acc: &mut A, bytes: &[u8]) -> Result<(), StateError> {
        (self.decode_entry)(acc, bytes)
    }
}

/// Where a window operator's snapshot goes and how it writes accumulators: its `keyed` part
/// in the canonical layout, or its `own-keyed` part beside the state backend's own checkpoint
/// of the contents ([`super::function::WindowLogic::layout`]).
pub(crate) struct Layout<A> {
    pub(crate) part: &'static str,
    pub(crate) codec: AccCodec<A>,
}

impl<A> Layout<A> {
    /// Beside the state backend's own checkpoint, accumulators written with `stored`, if
    /// given; else the canonical layout, accumulators written with `canonical`.
    pub(crate) fn of(stored: Option<AccCodec<A>>, canonical: AccCodec<A>) -> Self {
        use crate::checkpoint::task_state::{PART_KEYED, PART_OWN_KEYED};
        match stored {
            Some(codec) => Layout {
                part: PART_OWN_KEYED,
                codec,
            },
            None => Layout {
                part: PART_KEYED,
                codec: canonical,
            },
        }
    }
}

/// Where an accumulator's entries go: each is encoded into a buffer and handed on.
pub(crate) struct Entries<'a> {
    value: &'a mut Vec<u8>,
    value_type: &'static str,
    sink: &'a mut dyn FnMut(&[u8]) -> Result<(), StateError>,
}

impl Entries<'_> {
    /// Puts the entry that `encode` appends to an empty buffer.
    pub(crate) fn put(
        &mut self,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), rancor::Error>,
    ) -> Result<(), StateError> {
        self.value.clear();
        encode(self.value)
            .map_err(|error| StateError::encoding(CONTENTS, self.value_type, error))?;
        (self.sink)(self.value)
    }
}

/// A checkpointed entry of window contents decoded as a `T`, or why it cannot be.
pub(crate) fn decode_entry<T: StateCodec>(bytes: &[u8]) -> Result<T, StateError> {
    T::decode(bytes).map_err(|error| {
        StateErrorKind::Corrupt {
            state: CONTENTS.to_string(),
            what: "checkpointed window contents",
            type_name: type_name::<T>(),
            len: bytes.len(),
            reason: error.to_string(),
        }
        .into()
    })
}

impl<T: StateCodec> AccCodec<Option<T>> {
    /// `reduce`: the reduced value, if any.
    pub(crate) fn optional() -> Self {
        AccCodec {
            kind: StateKind::Value,
            value_type: type_name::<T>(),
            encode: |acc, entries| match acc {
                Some(value) => entries.put(|out| value.encode_into(out)),
                None => Ok(()),
            },
            decode_entry: |acc, bytes| {
                *acc = Some(decode_entry(bytes)?);
                Ok(())
            },
        }
    }
}

impl<T: StateCodec> AccCodec<T> {
    /// `aggregate`: the accumulator itself.
    pub(crate) fn value() -> Self {
        AccCodec {
            kind: StateKind::Value,
            value_type: type_name::<T>(),
            encode: |acc, entries| entries.put(|out| acc.encode_into(out)),
            decode_entry: |acc, bytes| {
                *acc = decode_entry(bytes)?;
                Ok(())
            },
        }
    }
}

impl<T: StateCodec> AccCodec<Vec<T>> {
    /// `process`: the window's records, one list element each.
    pub(crate) fn list() -> Self {
        AccCodec {
            kind: StateKind::List,
            value_type: type_name::<T>(),
            encode: |acc, entries| {
                acc.iter()
                    .try_for_each(|value| entries.put(|out| value.encode_into(out)))
            },
            decode_entry: |acc, bytes| {
                acc.push(decode_entry(bytes)?);
                Ok(())
            },
        }
    }
}

/// Writes one window operator subtask's snapshot.
pub(crate) struct WindowSnapshot<K, N, A> {
    writer: KeyedSnapshotWriter<K, N>,
    codec: AccCodec<A>,
    contents: weir_state::WriterState,
    windows: Recent<N>,
    timers: Recent<i64>,
    /// An entry's encoding.
    value: Vec<u8>,
}

impl<K: Key, N: StateCodec + PartialEq + Copy, A> WindowSnapshot<K, N, A> {
    /// Makes `key` the key of what is put next.
    pub(crate) fn key(&mut self, key: &K) -> Result<(), StateError> {
        self.writer.set_key(key)
    }

    /// Puts the current key's window `window` holding `acc`.
    pub(crate) fn contents(&mut self, window: Option<&N>, acc: &A) -> Result<(), StateError> {
        let namespace = match window {
            Some(window) => Some(self.windows.encoding(window, CONTENTS)?),
            None => None,
        };
        let (writer, contents) = (&mut self.writer, self.contents);
        let mut entries = Entries {
            value: &mut self.value,
            value_type: self.codec.value_type,
            sink: &mut |value| writer.put_encoded(contents, namespace, value),
        };
        (self.codec.encode)(acc, &mut entries)
    }

    /// Puts a timer of the current key at `at` into `state`.
    pub(crate) fn put_timer(
        &mut self,
        (state, _): &(weir_state::WriterState, StateValueCodec<i64>),
        at: i64,
    ) -> Result<(), StateError> {
        let value = self.timers.encoding(&at, "window timers")?;
        self.writer.put_encoded(*state, None, value)
    }

    /// Adds a state of `i64` or `u64` values (timers, counts).
    pub(crate) fn add_state<V: StateCodec>(
        &mut self,
        name: &str,
        kind: StateKind,
    ) -> (weir_state::WriterState, StateValueCodec<V>) {
        let codec = StateValueCodec::<V>::of();
        (self.writer.add_state(name, kind, codec.value_type()), codec)
    }

    /// Puts `value` of the current key into `state`.
    pub(crate) fn put<V>(
        &mut self,
        (state, codec): &(weir_state::WriterState, StateValueCodec<V>),
        value: &V,
    ) -> Result<(), StateError> {
        self.writer.put(*state, None, codec, value)
    }

    /// Marks `key` as removed (a delta of a chain: `checkpoint::chain`).
    pub(crate) fn removed_key(&mut self, key: &K) -> Result<(), StateError> {
        self.writer.set_key(key)?;
        self.writer.remove_key()
    }

    /// About how many bytes the snapshot holds so far.
    pub(crate) fn encoded_len(&self) -> usize {
        self.writer.encoded_len()
    }

    /// The encoded snapshot.
    pub(crate) fn finish(self) -> Result<Vec<u8>, StateError> {
        let mut bytes = Vec::new();
        self.writer.finish(&mut bytes)?;
        Ok(bytes)
    }

    /// The snapshot, to be handed out in pieces.
    pub(crate) fn into_pieces(self) -> weir_state::KeyedSnapshotPieces {
        self.writer.into_pieces()
    }
}

/// A snapshot of one window operator subtask whose window contents are written with
/// `codec` (the operator adds it to its snapshot as the part its [`Layout`] names).
pub(crate) fn snapshot<K: Key, N: StateCodec, A>(
    scope: &KeyedScope,
    codec: AccCodec<A>,
) -> WindowSnapshot<K, N, A> {
    let mut writer = scope.writer();
    let contents = writer.add_state(CONTENTS, codec.kind, codec.value_type);
    WindowSnapshot {
        writer,
        codec,
        contents,
        windows: Recent::default(),
        timers: Recent::default(),
        value: Vec::new(),
    }
}

/// The encodings of the few values seen last: a window operator's panes and timers fall on
/// the same few instants for every key, so each is encoded once per snapshot, not per entry.
struct Recent<T> {
    seen: Vec<(T, Vec<u8>)>,
    /// The one replaced next once [`RECENT`] are kept.
    next: usize,
}

/// Values a [`Recent`] keeps.
const RECENT: usize = 16;

impl<T> Default for Recent<T> {
    fn default() -> Self {
        Recent {
            seen: Vec::new(),
            next: 0,
        }
    }
}

impl<T: StateCodec + PartialEq + Copy> Recent<T> {
    /// `value`'s encoding, as a value of state `state`.
    fn encoding(&mut self, value: &T, state: &str) -> Result<&[u8], StateError> {
        let at = match self.seen.iter().position(|(seen, _)| seen == value) {
            Some(at) => at,
            None => {
                let bytes = value
                    .encode()
                    .map_err(|error| StateError::encoding(state, type_name::<T>(), error))?;
                if self.seen.len() < RECENT {
                    self.seen.push((*value, bytes));
                    self.seen.len() - 1
                } else {
                    let at = self.next;
                    self.next = (at + 1) % RECENT;
                    self.seen[at] = (*value, bytes);
                    at
                }
            }
        };
        Ok(&self.seen[at].1)
    }
}

/// Opens a window operator subtask: the key groups it owns, whose entries in its part `part`
/// of the checkpoint the job resumes from (if it does) go to `restore`. A restore that fails
/// fails the job, naming the `what` it could not restore and why (a checkpoint of the other
/// backend is refused at the job's start, `runtime::deploy`).
pub(crate) fn open<K: Key, N: StateCodec>(
    ctx: &RuntimeContext,
    what: &str,
    part: &'static str,
    restore: impl FnOnce(&KeyedSnapshotEntries<K, N>) -> Result<(), StateError>,
) -> KeyedScope {
    let scope = KeyedScope::of(ctx);
    let restored = scope
        .restored(ctx, part)
        .and_then(|restored| restored.map_or(Ok(()), |restored| restore(&restored)));
    match restored {
        Ok(()) => scope,
        Err(error) => panic!("cannot restore the {what}: {error}"),
    }
}

/// The keyed part of an operator's `snapshot` (encoded now, if its encoding was deferred: the
/// operator must have written its keys), read back as one subtask owning every key group: for testing an operator's snapshot and
/// restore on their own.
#[cfg(test)]
pub(crate) fn read_back<K: Key, N: StateCodec>(
    snapshot: OperatorSnapshot,
    max_parallelism: u32,
) -> KeyedSnapshotEntries<K, N> {
    use crate::checkpoint::task_state::{Part, PART_KEYED};
    let bytes = snapshot
        .parts
        .into_iter()
        .find_map(|(name, part)| match part {
            Part::Bytes(bytes) if name == PART_KEYED => Some(bytes),
            Part::Deferred(mut encoder) if name == PART_KEYED => Some(
                crate::checkpoint::task_state::encode_whole(&mut encoder, 64),
            ),
            _ => None,
        })
        .expect("a keyed part");
    KeyedScope::single(max_parallelism)
        .read(&[bytes.into()])
        .expect("the snapshot reads back")
}

/// A checkpointed window the operator cannot take back: its geometry changed.
pub(crate) fn foreign_window(what: String) -> StateError {
    foreign_state(
        what,
        "restore with the window assigner (size, slide, offset, gap) the checkpoint was taken \
         with",
    )
}
