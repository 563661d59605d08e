//! Window snapshots written after their barrier, and which keys changed since the last
//! checkpoint: the tumbling and sliding window operator's (`aligned`), the session
//! operator's (`session.rs`) and the count window operator's (`global.rs`).
//!
//! **Changes.** With incremental checkpoints (`checkpoint::chain`) an operator records which
//! keys change (or go) between checkpoints: a checkpoint writes only those, as a delta over
//! the chain's last full link, unless it writes every key.
//!
//! **Snapshots written after the barrier.** A checkpoint's snapshot (a full one or a delta) is
//! not encoded while the barrier passes: the operator lists the keys it holds then (or takes
//! the list of the keys changed and gone since the last link, put in about the table's order)
//! and writes them, [`LOOKUPS`] looked up at a time, in steps of about
//! `task_state::PIECE_BYTES` between batches of records, on its task's processing-time turn
//! ([`Changes::write_some`]; the operator asks for that turn while it has keys to write). The
//! operator's state is not copy-on-write; instead a key is written before its first change
//! since the barrier: every change goes through [`Changes::record`], which on a key's first
//! change of an epoch writes the key into the snapshot if it has it and it is not written yet.
//! A key added after the barrier is marked written as it is added (nothing of it to write),
//! and a key that went after the barrier was written before it went. So the barrier costs a
//! copy of the key list, and each key is encoded once, on its turn or at its first change,
//! whichever comes first. What a key's snapshot holds is its state's ([`TrackedKey`]), written by the
//! operator's [`KeyContents`] (everything it must write of the key as it was at the barrier,
//! timers included). The task's checkpoint writer then hands the snapshot out in pieces
//! (`task_state::FileEncoder`, `checkpoint::chain`). A snapshot still being written when the
//! next barrier comes is finished at that barrier; a savepoint, or a checkpoint after the
//! input ended, has its keys written at the barrier (no turn may follow: the job may stop).
//! The operator keeps its map to itself: a record costs nothing more for the snapshot being
//! written. Its steps count in the checkpoint's `sync_pause_ms` like the writer's pieces
//! (`PartEncoder::longest_step_elsewhere`).

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::rc::Rc;
use std::time::{Duration, Instant};

use weir_state::{prefetch, KeyedSnapshotPieces, StateCodec, StateError};

use super::checkpoint::WindowSnapshot;
use super::KeyMap;
use crate::checkpoint::chain::{KeyedChain, Link};
use crate::checkpoint::task_state::{
    AfterBarrier, DeferredPart, OperatorSnapshot, WrittenBetweenRecords, PIECE_BYTES,
};
use crate::record::Key;

/// What the snapshots written after their barrier need of a key's state: when it last
/// changed, and which snapshot has it (cells: the writer looks up several keys at once, and
/// renumbering goes through a shared map).
#[derive(Default)]
pub(crate) struct Marks {
    /// The checkpoint epoch in which the key last changed.
    changed_in: Cell<u32>,
    /// The epoch of the last snapshot written after its barrier that has the key.
    written_in: Cell<u32>,
}

/// A key's state in an operator whose snapshots are written after their barrier.
pub(crate) trait TrackedKey {
    fn marks(&self) -> &Marks;
}

/// What an operator writes of a key's state into its snapshot: everything of the key as it
/// was at the barrier (its windows' contents, and its timers as they stood then).
pub(crate) trait KeyContents<K, S, N, A> {
    fn put(
        &self,
        snapshot: &mut WindowSnapshot<K, N, A>,
        key: &K,
        state: &S,
    ) -> Result<(), StateError>;
}

/// Writes keys' states into a window snapshot with the operator's [`KeyContents`].
pub(crate) struct KeyWriter<K, N, A, C> {
    snapshot: WindowSnapshot<K, N, A>,
    contents: C,
}

impl<K, N, A, C> KeyWriter<K, N, A, C> {
    pub(crate) fn new(snapshot: WindowSnapshot<K, N, A>, contents: C) -> Self {
        KeyWriter { snapshot, contents }
    }
}

/// What [`Changes`] needs of a [`KeyWriter`].
pub(crate) trait WriteKeys<K, S> {
    /// Writes `key`'s state.
    fn put(&mut self, key: &K, state: &S) -> Result<(), StateError>;
    /// Marks `key` as gone (a delta).
    fn removed(&mut self, key: &K) -> Result<(), StateError>;
    /// About how many bytes the snapshot holds so far.
    fn encoded_len(&self) -> usize;
    /// The snapshot, to be handed out in pieces.
    fn into_pieces(self) -> KeyedSnapshotPieces;
    /// The snapshot, encoded.
    fn finish(self) -> Result<Vec<u8>, StateError>;
}

impl<K, S, N, A, C> WriteKeys<K, S> for KeyWriter<K, N, A, C>
where
    K: Key,
    N: StateCodec + PartialEq + Copy,
    C: KeyContents<K, S, N, A>,
{
    fn put(&mut self, key: &K, state: &S) -> Result<(), StateError> {
        self.contents.put(&mut self.snapshot, key, state)
    }

    fn removed(&mut self, key: &K) -> Result<(), StateError> {
        self.snapshot.removed_key(key)
    }

    fn encoded_len(&self) -> usize {
        self.snapshot.encoded_len()
    }

    fn into_pieces(self) -> KeyedSnapshotPieces {
        self.snapshot.into_pieces()
    }

    fn finish(self) -> Result<Vec<u8>, StateError> {
        self.snapshot.finish()
    }
}

/// The keys that changed (or went) since the last checkpoint, and the snapshot being written
/// after its barrier, if one is (see the module docs).
pub(crate) struct Changes<K, S, W> {
    /// The current epoch (one per barrier), from 1; 0 while the operator is not checkpointed:
    /// a key changed in epoch 0 is never recorded.
    pub(crate) epoch: u32,
    /// The first epoch the next delta covers: the one the last link's barrier began.
    since: u32,
    /// With incremental checkpoints, the keys changed since the last link, in the order they
    /// first changed in each epoch (a key may be here more than once; a delta writes it once).
    keys: Vec<K>,
    /// With incremental checkpoints, the keys that went since the last link.
    removed: Vec<K>,
    chain: Option<KeyedChain>,
    /// The snapshot being written after its barrier.
    pending: Option<Rc<RefCell<Pending<K, S, W>>>>,
}

/// What a barrier writes of the keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// Every key, the changes kept for the next link: a savepoint, or a checkpoint without a
    /// chain.
    Whole,
    /// Every key: a chain's full link.
    Full,
    /// The keys changed and gone since the last link: a chain's delta.
    Delta,
}

impl<K, S, W> Changes<K, S, W> {
    /// Changes of an operator that is not checkpointed.
    pub(crate) fn untracked() -> Self {
        Changes {
            epoch: 0,
            since: 0,
            keys: Vec::new(),
            removed: Vec::new(),
            chain: None,
            pending: None,
        }
    }

    /// Changes of the operator opened with `ctx`: tracked if the job is checkpointed,
    /// incrementally (its part `part` a chain) if its checkpoints are.
    pub(crate) fn opened(ctx: &crate::operator::RuntimeContext, part: &'static str) -> Self {
        if ctx.state.checkpointed {
            Changes::tracked(KeyedChain::open(ctx, part))
        } else {
            Changes::untracked()
        }
    }

    /// Changes of a checkpointed operator, incremental with `chain`.
    pub(crate) fn tracked(chain: Option<KeyedChain>) -> Self {
        Changes {
            epoch: 1,
            since: 1,
            chain,
            ..Changes::untracked()
        }
    }
}

impl<K: Key, S: TrackedKey, W: WriteKeys<K, S>> Changes<K, S, W> {
    /// Records that `key` changes now: call it before changing `state` (or removing it).
    #[inline]
    pub(crate) fn record(&mut self, key: &K, state: &S) {
        if state.marks().changed_in.get() != self.epoch {
            self.first_change(key, state);
        }
    }

    /// The key's first change in this epoch.
    fn first_change(&mut self, key: &K, state: &S) {
        if let Some(pending) = &self.pending {
            if !pending.borrow_mut().write_before_change(key, state) {
                self.pending = None;
            }
        }
        state.marks().changed_in.set(self.epoch);
        if self.chain.is_some() {
            self.keys.push(key.clone());
        }
    }

    /// `state` was just added: it is in no snapshot being written.
    #[inline]
    pub(crate) fn added(&self, state: &S) {
        state.marks().written_in.set(self.epoch);
    }

    /// `key` was just removed (after [`Changes::record`]).
    #[inline]
    pub(crate) fn gone(&mut self, key: &K) {
        if self.chain.is_some() {
            self.removed.push(key.clone());
        }
    }

    /// Takes a snapshot of `keys` at this barrier into `snapshot`'s part `part` (or its
    /// chain's next link), written after the barrier with `writer` — at once when no turn may
    /// follow (a savepoint: the job stops; or the operator's input has `finished`), or when
    /// the operator is not checkpointed (tested on its own). A savepoint is written whole, outside the chain (it
    /// shares nothing), so the next checkpoint's delta still goes over the chain's last link.
    pub(crate) fn take(
        &mut self,
        keys: &KeyMap<K, S>,
        mut writer: W,
        snapshot: &mut OperatorSnapshot,
        part: &'static str,
        finished: bool,
    ) -> Result<(), StateError>
    where
        K: 'static,
        S: 'static,
        W: 'static,
    {
        if self.epoch == 0 {
            for (key, state) in keys.iter() {
                writer.put(key, state)?;
            }
            snapshot.add(part, writer.finish()?);
            return Ok(());
        }
        self.finish_pending(keys);
        self.renumber_if_spent(keys);
        let count = keys.len();
        let chain = self.chain.as_ref().filter(|_| !snapshot.is_savepoint());
        let cut = match chain.map(|chain| (chain, chain.next(self.keys.len(), count))) {
            None => Cut::Whole,
            Some((chain, Link::Unchanged)) => {
                chain.add(snapshot, None, count);
                self.unchanged();
                return Ok(());
            }
            Some((_, Link::Full)) => Cut::Full,
            Some((_, Link::Delta)) => Cut::Delta,
        };
        tracing::debug!(
            ?cut,
            keys = count,
            changed = self.keys.len(),
            "window snapshot"
        );
        let encoder = self.write_after_barrier(keys, writer, cut);
        if finished || snapshot.is_savepoint() {
            self.finish_pending(keys);
        }
        match (cut, &self.chain) {
            (Cut::Full | Cut::Delta, Some(chain)) => {
                chain.add(snapshot, Some((cut == Cut::Full, encoder)), count)
            }
            _ => snapshot.add_deferred(part, encoder),
        }
        Ok(())
    }

    /// Writes what is left of the snapshot being written after its barrier, if one is: a
    /// barrier comes, and each snapshot cuts at its own. A failure goes to that snapshot's
    /// writer.
    pub(crate) fn finish_pending(&mut self, keys: &KeyMap<K, S>) {
        if let Some(pending) = self.pending.take() {
            pending.borrow_mut().write_step(keys, usize::MAX);
        }
    }

    /// Whether a snapshot written after its barrier has keys left to write.
    pub(crate) fn writing(&self) -> bool {
        self.pending.is_some()
    }

    /// Writes about `budget` bytes' worth of the keys left of the snapshot being written
    /// after its barrier, if one is.
    pub(crate) fn write_some(&mut self, keys: &KeyMap<K, S>, budget: usize) {
        let done = self.pending.as_ref().is_some_and(|pending| {
            let started = Instant::now();
            let mut pending = pending.borrow_mut();
            let done = pending.write_step(keys, budget);
            pending.longest = pending.longest.max(started.elapsed());
            done
        });
        if done {
            self.pending = None;
        }
    }

    /// Before a barrier: when the epochs' numbers are about to run out, numbers them again
    /// from 1 (every key unchanged and unwritten), and the chain starts again with a full link.
    fn renumber_if_spent(&mut self, keys: &KeyMap<K, S>) {
        if self.epoch < LAST_EPOCH {
            return;
        }
        keys.values().for_each(|state| {
            let marks = state.marks();
            marks.changed_in.set(0);
            marks.written_in.set(0);
        });
        (self.epoch, self.since) = (1, 1);
        self.keys.clear();
        self.removed.clear();
        self.chain.iter().for_each(KeyedChain::restart);
    }

    /// A checkpoint's barrier passed with nothing changed since the last link.
    fn unchanged(&mut self) {
        self.epoch += 1;
        self.since = self.epoch;
    }

    /// Takes `cut` of `keys` at this barrier, to be written after it with `writer` (see the
    /// module docs).
    fn write_after_barrier(&mut self, keys: &KeyMap<K, S>, writer: W, cut: Cut) -> DeferredPart
    where
        K: 'static,
        S: 'static,
        W: 'static,
    {
        debug_assert!(self.pending.is_none(), "finish_pending first");
        let every_key = || Todo::Listed(keys.keys().cloned().collect::<Vec<K>>().into_iter());
        let (todo, removed, since) = match cut {
            Cut::Whole => (every_key(), Vec::new(), 0),
            Cut::Full => {
                self.keys.clear();
                self.removed.clear();
                (every_key(), Vec::new(), 0)
            }
            Cut::Delta => (
                KeySort::start(std::mem::take(&mut self.keys), keys),
                std::mem::take(&mut self.removed),
                self.since,
            ),
        };
        self.epoch += 1;
        if cut != Cut::Whole {
            self.since = self.epoch;
        }
        let pending = Rc::new(RefCell::new(Pending {
            epoch: self.epoch,
            since,
            writer: Some(writer),
            todo,
            removed: removed.into_iter(),
            written: false,
            longest: Duration::ZERO,
            error: None,
            _states: PhantomData,
        }));
        self.pending = Some(Rc::clone(&pending));
        AfterBarrier::part(pending)
    }
}

/// The keys a snapshot written after its barrier has still to visit.
enum Todo<K> {
    /// A delta's keys, being put in about the table's order.
    Sorting(KeySort<K>),
    /// Keys to visit in this order.
    Listed(std::vec::IntoIter<K>),
}

/// A delta's keys being put in about the order the table holds them — grouped by where in
/// the table their buckets lie, so that looking them up walks its memory in order, not at
/// random (a delta's keys come in the order they changed; a lookup that misses the cache
/// costs more than the key's encoding). A counting sort on the top bits of the bucket index,
/// in steps after the barrier like the writing (hundreds of thousands of keys took 6–14 ms);
/// the order is only a hint, so a table that grows meanwhile changes nothing but the order.
struct KeySort<K> {
    /// The table's buckets when the sort began, and the bits of a bucket index dropped to
    /// get its part.
    buckets: usize,
    shift: u32,
    phase: SortPhase<K>,
}

enum SortPhase<K> {
    /// Finding each key's part: `parts` holds those of the first keys.
    Parts { keys: Vec<K>, parts: Vec<u16> },
    /// Moving each key to its place: `next` holds each part's next free place.
    Scatter {
        keys: std::vec::IntoIter<K>,
        parts: std::vec::IntoIter<u16>,
        next: Vec<usize>,
        sorted: Vec<Option<K>>,
    },
    /// Taking the keys out of their places, in order.
    Gather {
        sorted: std::vec::IntoIter<Option<K>>,
        listed: Vec<K>,
    },
    /// Between two phases (a step moved it out).
    Moved,
}

/// Parts of the table a delta's keys are sorted into (each a few hundred buckets at most).
const PARTS: usize = 1 << 14;

impl<K: Key> KeySort<K> {
    /// `keys` to be put in about `map`'s order, unless they are too few or the table stays in
    /// the cache: then in their own order.
    fn start<V>(keys: Vec<K>, map: &KeyMap<K, V>) -> Todo<K> {
        let buckets = (map.capacity() * 8 / 7).next_power_of_two();
        if buckets <= PARTS || keys.len() < PARTS / 4 {
            return Todo::Listed(keys.into_iter());
        }
        let parts = Vec::with_capacity(keys.len());
        Todo::Sorting(KeySort {
            buckets,
            shift: buckets.trailing_zeros() - PARTS.trailing_zeros(),
            phase: SortPhase::Parts { keys, parts },
        })
    }

    /// Sorts on for at most `budget` keys' worth of work, taking off `budget` what it did;
    /// returns the keys in order once sorted.
    fn sort_some<V>(&mut self, map: &KeyMap<K, V>, budget: &mut usize) -> Option<Vec<K>> {
        use std::hash::BuildHasher;
        while *budget > 0 {
            self.phase = match std::mem::replace(&mut self.phase, SortPhase::Moved) {
                SortPhase::Parts { keys, mut parts } => {
                    let hasher = map.hasher();
                    let (mask, shift) = (self.buckets - 1, self.shift);
                    let from = parts.len();
                    let to = keys.len().min(from.saturating_add(*budget));
                    parts.extend(
                        keys[from..to]
                            .iter()
                            .map(|key| ((hasher.hash_one(key) as usize & mask) >> shift) as u16),
                    );
                    *budget -= to - from;
                    if parts.len() < keys.len() {
                        SortPhase::Parts { keys, parts }
                    } else {
                        let mut next = vec![0usize; PARTS + 1];
                        for &part in &parts {
                            next[usize::from(part) + 1] += 1;
                        }
                        for index in 1..=PARTS {
                            next[index] += next[index - 1];
                        }
                        let sorted = std::iter::repeat_with(|| None).take(keys.len()).collect();
                        SortPhase::Scatter {
                            keys: keys.into_iter(),
                            parts: parts.into_iter(),
                            next,
                            sorted,
                        }
                    }
                }
                SortPhase::Scatter {
                    mut keys,
                    mut parts,
                    mut next,
                    mut sorted,
                } => {
                    for (key, part) in keys.by_ref().zip(parts.by_ref()).take(*budget) {
                        let at = &mut next[usize::from(part)];
                        sorted[*at] = Some(key);
                        *at += 1;
                        *budget -= 1;
                    }
                    if keys.len() > 0 {
                        SortPhase::Scatter {
                            keys,
                            parts,
                            next,
                            sorted,
                        }
                    } else {
                        let listed = Vec::with_capacity(sorted.len());
                        SortPhase::Gather {
                            sorted: sorted.into_iter(),
                            listed,
                        }
                    }
                }
                SortPhase::Gather {
                    mut sorted,
                    mut listed,
                } => {
                    let take = sorted.len().min(*budget);
                    listed.extend(sorted.by_ref().take(take).flatten());
                    *budget -= take;
                    if sorted.len() == 0 {
                        return Some(listed);
                    }
                    SortPhase::Gather { sorted, listed }
                }
                SortPhase::Moved => unreachable!("a sort's phase is put back after each step"),
            };
        }
        None
    }
}

/// The last epoch before they are numbered again ([`Changes::renumber_if_spent`]).
const LAST_EPOCH: u32 = u32::MAX - 1;

/// A snapshot being written after its barrier.
struct Pending<K, S, W> {
    /// The epoch the barrier began: a key whose `written_in` is this is in the snapshot (or
    /// was added after the barrier).
    epoch: u32,
    /// A delta's: a key last changed before this epoch is not in it (0: every key is).
    since: u32,
    /// `None` once every key is written (or the snapshot was given up).
    writer: Option<W>,
    /// The keys the writer has not come to yet: every key at the barrier, or a delta's keys
    /// changed before it (those gone since are skipped: they were written before they went).
    todo: Todo<K>,
    /// A delta's keys that went before the barrier, to be marked gone. One that came back
    /// is marked gone and has its entries: in a delta, a key's entries win.
    removed: std::vec::IntoIter<K>,
    /// Every key is written: the snapshot is the writer's to hand out.
    written: bool,
    /// The longest of the operator's steps writing keys between records.
    longest: Duration,
    /// Why the snapshot cannot be written, for its writer to report.
    error: Option<StateError>,
    _states: PhantomData<fn(&S)>,
}

impl<K: Key, S: TrackedKey, W: WriteKeys<K, S>> Pending<K, S, W> {
    /// Writes `key` as it is before its first change since the barrier, if the snapshot has
    /// it and it is not written already; returns whether the snapshot is still being written.
    fn write_before_change(&mut self, key: &K, state: &S) -> bool {
        let Some(writer) = &mut self.writer else {
            return false;
        };
        let marks = state.marks();
        if marks.written_in.get() != self.epoch && marks.changed_in.get() >= self.since {
            marks.written_in.set(self.epoch);
            if let Err(error) = writer.put(key, state) {
                self.fail(error);
                return false;
            }
        }
        true
    }

    /// Writes keys of the lists, about `budget` bytes' worth; returns whether any are left.
    fn write_some(&mut self, keys: &KeyMap<K, S>, budget: usize) -> Result<bool, StateError> {
        let Some(writer) = &mut self.writer else {
            return Ok(false);
        };
        let mut work = 0;
        while work < budget {
            let before = writer.encoded_len();
            let visited = if let Some(key) = self.removed.next() {
                writer.removed(&key)?;
                1
            } else {
                match &mut self.todo {
                    Todo::Sorting(sort) => {
                        let allowed = (budget - work).div_ceil(KEY_WORK);
                        let mut left = allowed;
                        if let Some(sorted) = sort.sort_some(keys, &mut left) {
                            self.todo = Todo::Listed(sorted.into_iter());
                        }
                        allowed - left
                    }
                    Todo::Listed(todo) if todo.len() == 0 => return Ok(false),
                    Todo::Listed(todo) => write_batch(writer, todo, keys, self.epoch)?,
                }
            };
            work += visited * KEY_WORK + (writer.encoded_len() - before);
        }
        Ok(true)
    }

    /// Writes keys, about `budget` bytes' worth; returns whether the operator is done with
    /// the snapshot (every key written, or the snapshot failed or was given up).
    fn write_step(&mut self, keys: &KeyMap<K, S>, budget: usize) -> bool {
        match self.write_some(keys, budget) {
            Ok(true) => false,
            Ok(false) => {
                self.written = self.writer.is_some();
                true
            }
            Err(error) => {
                self.fail(error);
                true
            }
        }
    }

    fn fail(&mut self, error: StateError) {
        self.error.get_or_insert(error);
        self.stop();
    }
}

impl<K, S, W> Pending<K, S, W> {
    /// No more keys are written.
    fn stop(&mut self) {
        self.writer = None;
        self.todo = Todo::Listed(Vec::new().into_iter());
        self.removed = Vec::new().into_iter();
    }
}

/// Writes those of the next [`LOOKUPS`] keys of `todo` that `keys` holds unwritten in
/// `epoch`, all looked up before any is written (their cache misses overlap); returns how
/// many keys it visited.
fn write_batch<K: Key, S: TrackedKey, W: WriteKeys<K, S>>(
    writer: &mut W,
    todo: &mut std::vec::IntoIter<K>,
    keys: &KeyMap<K, S>,
    epoch: u32,
) -> Result<usize, StateError> {
    let batch = todo.as_slice();
    let batch = &batch[..batch.len().min(LOOKUPS)];
    let states: [Option<&S>; LOOKUPS] =
        std::array::from_fn(|at| batch.get(at).and_then(|key| keys.get(key)));
    // The lookups read each entry's key; its marks and contents may lie on other cache lines.
    for state in states.iter().flatten() {
        prefetch(*state);
    }
    for (key, state) in batch.iter().zip(states) {
        match state {
            Some(state) if state.marks().written_in.get() != epoch => {
                state.marks().written_in.set(epoch);
                writer.put(key, state)?;
            }
            _ => {}
        }
    }
    let visited = batch.len();
    if visited > 0 {
        todo.nth(visited - 1);
    }
    Ok(visited)
}

/// What visiting a key of the list counts for against a step's budget, besides its bytes.
const KEY_WORK: usize = 16;

/// Keys of the list looked up together, before any is written: a delta's keys lie scattered
/// over a table too large for the cache, and one lookup at a time waits for each miss in turn.
const LOOKUPS: usize = 16;

/// A snapshot written after its barrier: once the operator has written every key, the
/// checkpoint writer hands it out in pieces.
impl<K: Key, S: TrackedKey, W: WriteKeys<K, S>> WrittenBetweenRecords for Pending<K, S, W> {
    type Written = KeyedSnapshotPieces;
    const UNWRITTEN: &'static str = "the window operator closed before its snapshot was written";

    fn take_written(&mut self) -> Result<Option<KeyedSnapshotPieces>, String> {
        if let Some(error) = self.error.take() {
            return Err(error.to_string());
        }
        if !self.written {
            return Ok(None);
        }
        let writer = self.writer.take();
        let writer = writer.ok_or("internal error: a window snapshot was given up")?;
        Ok(Some(writer.into_pieces()))
    }

    fn longest_step(&self) -> Duration {
        self.longest
    }

    fn give_up(&mut self) {
        self.stop();
    }
}

/// Records `Ok((key, timestamp))` and watermarks `Err(w)` from generated steps (kind, key,
/// jitter), for the window operators' tests: time moves forward by up to `advance - 1` ms a
/// step, records land up to 40 ms behind it, watermarks trail it; the last watermark ends
/// time.
#[cfg(test)]
pub(crate) fn timed_input(steps: Vec<(u8, u8, i64)>, advance: i64) -> Vec<Result<(u8, i64), i64>> {
    let mut now = 0;
    let mut input = Vec::new();
    for (kind, key, jitter) in steps {
        now += jitter.rem_euclid(advance);
        match kind {
            0 => input.push(Err(now + jitter / 2)),
            _ => input.push(Ok((key, now + jitter))),
        }
    }
    input.push(Err(i64::MAX));
    input
}

/// Adds `link` (its first `bytes` written already) to `chain`: a full link starts it again.
#[cfg(test)]
pub(crate) fn finish_link(
    chain: &mut Vec<Vec<u8>>,
    link: crate::checkpoint::chain::ChainLink,
    mut bytes: Vec<u8>,
) {
    if let Some((full, rest)) = link.take() {
        bytes.extend_from_slice(&rest);
        if full {
            *chain = vec![bytes];
        } else {
            chain.push(bytes);
        }
    }
}

/// Encodes the keyed part of `snapshot` (its last, written after its barrier) in pieces of
/// `budget` bytes, each after `between` (records for the operator and its turn to write keys):
/// a snapshot written after its barrier while the operator goes on, for the window operators'
/// tests.
#[cfg(test)]
pub(crate) fn encode_between(
    mut snapshot: OperatorSnapshot,
    budget: usize,
    mut between: impl FnMut(),
) -> Vec<u8> {
    use crate::checkpoint::task_state::{Part, PART_KEYED};
    let mut encoder = match snapshot.parts.pop() {
        Some((PART_KEYED, Part::Deferred(encoder))) => encoder,
        _ => panic!("the keyed part is written after the barrier"),
    };
    let mut bytes = Vec::new();
    loop {
        between();
        if !encoder.encode_next(&mut bytes, budget).expect("it encodes") {
            return bytes;
        }
    }
}

/// A window operator as the tests that feed it while its keyed part is written drive it.
#[cfg(test)]
pub(crate) trait WrittenInPieces {
    /// Takes a snapshot (its keyed part written after the barrier).
    fn take_snapshot(&mut self, snapshot: &mut OperatorSnapshot);
    /// The operator's turn to write some of its keys.
    fn write_some_keys(&mut self, budget: usize);
}

/// `snapshot`'s keyed part, encoded in pieces of `budget` bytes while `operator` takes `rest`
/// between them (an item per turn, then its turn to write some keys), with another barrier
/// of the same kind after item `second_barrier_after`.
#[cfg(test)]
pub(crate) fn encode_while_fed<O: WrittenInPieces, I>(
    snapshot: OperatorSnapshot,
    budget: usize,
    operator: &mut O,
    rest: &[I],
    second_barrier_after: Option<usize>,
    mut feed: impl FnMut(&mut O, &I),
) -> Vec<u8> {
    let kind = snapshot.kind;
    let mut rest = rest.iter().enumerate();
    encode_between(snapshot, budget, || {
        if let Some((at, item)) = rest.next() {
            feed(operator, item);
            if second_barrier_after == Some(at) {
                operator.take_snapshot(&mut OperatorSnapshot::new(kind));
            }
        }
        operator.write_some_keys(budget);
    })
}

/// About how many bytes of keys the operator writes on each processing-time turn.
pub(crate) const STEP_BYTES: usize = PIECE_BYTES;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    /// A delta's keys sorted in steps, the table growing between them, come out once each (as
    /// often as listed), grouped by their part of the table as it was when the sort began.
    #[test]
    fn a_delta_sorted_in_steps_keeps_every_key_in_the_tables_order() {
        let mut map: KeyMap<u64, ()> = KeyMap::default();
        map.extend((0..100_000u64).map(|key| (key, ())));
        // Changed in some order; some gone since (not in the table), some listed twice.
        let mut keys: Vec<u64> = (0..30_000u64).map(|i| (i * 7919) % 120_000).collect();
        keys.extend_from_within(..100);
        let Todo::Sorting(mut sort) = KeySort::start(keys.clone(), &map) else {
            panic!("a delta this large over a table this large is sorted");
        };
        let (buckets, shift) = (sort.buckets, sort.shift);
        let mut steps = 0u64;
        let sorted = loop {
            let mut budget = 1_000;
            if let Some(sorted) = sort.sort_some(&map, &mut budget) {
                break sorted;
            }
            assert_eq!(
                budget, 0,
                "a step that does not end the sort uses its budget"
            );
            steps += 1;
            map.insert(1_000_000 + steps, ());
        };
        assert!(
            steps >= 90,
            "three passes over 30 100 keys, 1 000 a step: {steps} steps"
        );
        let part = |key: &u64| (map.hasher().hash_one(key) as usize & (buckets - 1)) >> shift;
        assert!(sorted
            .windows(2)
            .all(|pair| part(&pair[0]) <= part(&pair[1])));
        let (mut listed, mut sorted) = (keys, sorted);
        listed.sort_unstable();
        sorted.sort_unstable();
        assert_eq!(sorted, listed);
    }
}
