//! Interval joins (Flink's `KeyedStream.intervalJoin`):
//! `a.key_by(ka).interval_join(b.key_by(kb)).between(lower, upper).process(f)` joins a left
//! record at time `t` with every right record of its key whose time lies in
//! `[t + lower, t + upper]` (each bound inclusive unless made exclusive).
//!
//! Built on single-input parts, like the window join: both inputs are tagged into an
//! [`Either`], unioned, keyed by the side's key selector and run through one keyed process
//! function, so records of both sides with equal keys meet in one subtask and event time is
//! the minimum of both inputs' watermarks. Per key, each side is buffered in time order
//! ([`TimeOrdered`]): a record looks up the other side's range (`O(log n + matches)`), joins,
//! and is buffered. Flink's rules hold: a record below the current watermark is late and
//! dropped (or sent to the side's late-data side output), the output carries
//! `max(left time, right time)`, and buffers are cleaned with event-time timers: once the
//! watermark `w` passes `t + upper` no right record that can still arrive (at `w` or later)
//! joins a left record at `t`, nor, once `w` passes `t - lower`, a left record a right record
//! at `t`. Each record registers one timer at the first watermark that retires it; a firing
//! timer drops every retired record of its key from the front of both buffers.
//!
//! A checkpoint shares the buffers at its barrier and encodes them after it; a key's first
//! change after the barrier writes that key into the snapshot first ([`JoinBuffers`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use super::connected::{either_key, tag_and_union};
use super::either::Either;
use super::function::{KeyedProcessContext, KeyedProcessFunction};
use bytes::Bytes;
use weir_state::{
    prefetch, prefetch_bytes, KeyedSnapshotEntries, KeyedSnapshotPieces, KeyedSnapshotWriter,
    StateError, StateKind, StateValueCodec, WriterState,
};

use super::keyed::KeyedStream;
use super::stream::DataStream;
use crate::checkpoint::keyed::{foreign_state, KeyedScope};
use crate::checkpoint::task_state::{DeferredPart, PartEncoder};
use crate::operator::process::OwnKeyedState;
use crate::operator::{Emitter, OutputTag, RuntimeContext};
use crate::record::{Key, Record};
use crate::state::StateValue;

/// The function of an interval join (Flink's `ProcessJoinFunction`): called once per joined
/// (left, right) pair. Closures work:
/// `|l: &Order, r: &Payment, ctx: &mut ProcessJoinContext<'_, (u32, u64)>| ctx.emit((l.id, r.amount))`.
pub trait ProcessJoinFunction<A, B, O>: Clone + Send + Sync + 'static {
    /// Called once per subtask before the first record.
    fn open(&mut self, _ctx: &RuntimeContext) {}
    /// Handles one joined pair.
    fn process_element(&mut self, left: &A, right: &B, ctx: &mut ProcessJoinContext<'_, O>);
}

impl<A, B, O, F> ProcessJoinFunction<A, B, O> for F
where
    F: FnMut(&A, &B, &mut ProcessJoinContext<'_, O>) + Clone + Send + Sync + 'static,
{
    fn process_element(&mut self, left: &A, right: &B, ctx: &mut ProcessJoinContext<'_, O>) {
        self(left, right, ctx)
    }
}

/// The context of a [`ProcessJoinFunction`] call: the pair's timestamps, and where its output
/// goes.
pub struct ProcessJoinContext<'a, O> {
    out: &'a mut Emitter<O>,
    left_timestamp: i64,
    right_timestamp: i64,
    runtime: &'a RuntimeContext,
}

impl<O> ProcessJoinContext<'_, O> {
    /// Emits one record, stamped with [`ProcessJoinContext::timestamp`].
    #[inline]
    pub fn emit(&mut self, record: O) {
        let timestamp = self.timestamp();
        self.out.main.push(record, timestamp);
    }

    /// Emits one record to the side output `tag` (read it with `get_side_output`), stamped with
    /// [`ProcessJoinContext::timestamp`].
    pub fn output<X: 'static>(&mut self, tag: &OutputTag<X>, record: X) {
        let timestamp = self.timestamp();
        self.out.side.emit(tag, record, timestamp);
    }

    /// The pair's timestamp: the later of the two records' (Flink's rule).
    pub fn timestamp(&self) -> i64 {
        self.left_timestamp.max(self.right_timestamp)
    }

    /// The left record's timestamp.
    pub fn left_timestamp(&self) -> i64 {
        self.left_timestamp
    }

    /// The right record's timestamp.
    pub fn right_timestamp(&self) -> i64 {
        self.right_timestamp
    }

    /// The subtask this call runs in.
    pub fn runtime(&self) -> &RuntimeContext {
        self.runtime
    }
}

/// Two keyed streams to join by time interval; made by [`KeyedStream::interval_join`]. Next:
/// [`IntervalJoin::between`].
pub struct IntervalJoin<A, B, K, KA, KB> {
    left: KeyedStream<A, K, KA>,
    right: KeyedStream<B, K, KB>,
}

/// An interval join with its bounds; end it with [`IntervalJoined::process`].
///
/// ```no_run
/// use weir_engine::prelude::*;
///
/// # fn job(orders: DataStream<(u32, i64)>, payments: DataStream<(u32, i64)>) {
/// // Payments from 1 s before to 10 s after each order of the same id.
/// orders
///     .key_by(|o: &(u32, i64)| o.0)
///     .interval_join(payments.key_by(|p: &(u32, i64)| p.0))
///     .between(-1_000, 10_000)
///     .process(|o: &(u32, i64), p: &(u32, i64), ctx: &mut ProcessJoinContext<'_, (u32, i64)>| {
///         ctx.emit((o.0, p.1 - o.1))
///     })
///     .sink_to(PrintSink::new(), "paid");
/// # }
/// ```
pub struct IntervalJoined<A, B, K, KA, KB> {
    left: KeyedStream<A, K, KA>,
    right: KeyedStream<B, K, KB>,
    lower: i64,
    upper: i64,
    lower_inclusive: bool,
    upper_inclusive: bool,
    left_late: Option<OutputTag<A>>,
    right_late: Option<OutputTag<B>>,
}

impl<A, B, K, KA, KB> std::fmt::Debug for IntervalJoin<A, B, K, KA, KB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntervalJoin")
            .field("left", &self.left)
            .field("right", &self.right)
            .finish()
    }
}

impl<A, B, K, KA, KB> std::fmt::Debug for IntervalJoined<A, B, K, KA, KB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntervalJoined")
            .field("left", &self.left)
            .field("right", &self.right)
            .field("lower", &self.lower)
            .field("upper", &self.upper)
            .field("lower_inclusive", &self.lower_inclusive)
            .field("upper_inclusive", &self.upper_inclusive)
            .finish()
    }
}

impl<T, K, KS> KeyedStream<T, K, KS>
where
    T: Record,
    K: Key,
    KS: Fn(&T) -> K + Clone + Send + Sync + 'static,
{
    /// Joins this keyed stream (the left side) with `other` (the right side, same key type)
    /// by time interval (Flink's `intervalJoin`); set the interval with
    /// [`IntervalJoin::between`]. Both sides need event timestamps.
    pub fn interval_join<B, KB>(self, other: KeyedStream<B, K, KB>) -> IntervalJoin<T, B, K, KS, KB>
    where
        B: Record,
        KB: Fn(&B) -> K + Clone + Send + Sync + 'static,
    {
        IntervalJoin {
            left: self,
            right: other,
        }
    }
}

impl<A, B, K, KA, KB> IntervalJoin<A, B, K, KA, KB> {
    /// A left record at `t` joins the right records of its key at `t + lower ..= t + upper`,
    /// in milliseconds (either may be negative; `lower <= upper`, else the job is refused).
    pub fn between(self, lower: i64, upper: i64) -> IntervalJoined<A, B, K, KA, KB> {
        IntervalJoined {
            left: self.left,
            right: self.right,
            lower,
            upper,
            lower_inclusive: true,
            upper_inclusive: true,
            left_late: None,
            right_late: None,
        }
    }
}

impl<A, B, K, KA, KB> IntervalJoined<A, B, K, KA, KB>
where
    A: Record,
    B: Record,
    K: Key,
    KA: Fn(&A) -> K + Clone + Send + Sync + 'static,
    KB: Fn(&B) -> K + Clone + Send + Sync + 'static,
{
    /// Excludes right records at exactly `t + lower`.
    pub fn lower_bound_exclusive(mut self) -> Self {
        self.lower_inclusive = false;
        self
    }

    /// Excludes right records at exactly `t + upper`.
    pub fn upper_bound_exclusive(mut self) -> Self {
        self.upper_inclusive = false;
        self
    }

    /// Late left records (below the watermark when they arrive) go to the side output `tag`
    /// instead of being dropped.
    pub fn side_output_left_late_data(mut self, tag: &OutputTag<A>) -> Self {
        self.left_late = Some(tag.clone());
        self
    }

    /// Late right records go to the side output `tag` instead of being dropped.
    pub fn side_output_right_late_data(mut self, tag: &OutputTag<B>) -> Self {
        self.right_late = Some(tag.clone());
        self
    }

    /// Calls `function` on every joined pair. The operator is named `Interval Join`. Both
    /// sides' records wait in buffers per key, which checkpoints write, so they must be
    /// [`StateValue`]s (rkyv-archivable, as records are); a checkpoint shares them with the
    /// operator until it has written them, so they and the key must be `Sync` (plain data is).
    pub fn process<O: Record, F: ProcessJoinFunction<A, B, O>>(self, function: F) -> DataStream<O>
    where
        K: Sync,
        A: StateValue + Sync,
        B: StateValue + Sync,
    {
        let left_key = self.left.key_selector();
        let right_key = self.right.key_selector();
        let left = self.left.into_unkeyed();
        let right = self.right.into_unkeyed();
        if self.lower > self.upper {
            left.env.record_error(format!(
                "interval join between({}, {}): the lower bound is above the upper bound; \
                 give between(lower, upper) with lower <= upper (in milliseconds)",
                self.lower, self.upper
            ));
        }
        // Inclusive bounds from here on, as Flink's operator keeps them.
        let lower = if self.lower_inclusive {
            self.lower
        } else {
            self.lower.saturating_add(1)
        };
        let upper = if self.upper_inclusive {
            self.upper
        } else {
            self.upper.saturating_sub(1)
        };
        tag_and_union(left, right, "Interval Join")
            .key_by(either_key(left_key, right_key))
            .process(IntervalJoinFunction {
                function,
                lower,
                upper,
                left_late: self.left_late,
                right_late: self.right_late,
                buffers: SubtaskState::default(),
            })
            .name("Interval Join")
    }
}

/// State that lives in one subtask's instance of a function. Functions must be `Sync` (the
/// template they are cloned from is shared); a `Mutex` makes the state `Sync` for any `Send`
/// content without ever locking: the instance reaches it through `&mut self`
/// (`Mutex::get_mut`). A clone starts empty: functions are cloned before they run.
struct SubtaskState<S>(Mutex<S>);

impl<S: Default> Default for SubtaskState<S> {
    fn default() -> Self {
        SubtaskState(Mutex::new(S::default()))
    }
}

impl<S: Default> Clone for SubtaskState<S> {
    fn clone(&self) -> Self {
        SubtaskState::default()
    }
}

impl<S> SubtaskState<S> {
    fn get(&mut self) -> &mut S {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One side's buffered records of a key, in timestamp order (records of equal timestamps in
/// arrival order). Records come mostly in time order, so one goes at or near the back, and
/// the oldest retire from the front; a copy is one allocation.
#[derive(Clone, Debug)]
struct TimeOrdered<T> {
    records: VecDeque<(i64, T)>,
}

impl<T> Default for TimeOrdered<T> {
    fn default() -> Self {
        TimeOrdered {
            records: VecDeque::new(),
        }
    }
}

impl<T> TimeOrdered<T> {
    /// Buffers `record` at `timestamp`, after the records of its time.
    fn insert(&mut self, timestamp: i64, record: T) {
        let at = self.records.partition_point(|(t, _)| *t <= timestamp);
        if at == self.records.len() {
            self.records.push_back((timestamp, record));
        } else {
            self.records.insert(at, (timestamp, record));
        }
    }

    /// The records of times `from..=to`, in order.
    fn between(&self, from: i64, to: i64) -> impl Iterator<Item = &(i64, T)> {
        let start = self.records.partition_point(|(t, _)| *t < from);
        let records = self.records.range(start..);
        records.take_while(move |(t, _)| *t <= to)
    }

    /// Whether the oldest record is one `retired` says no later record can join.
    fn front_retired(&self, retired: &impl Fn(i64) -> bool) -> bool {
        self.records.front().is_some_and(|(t, _)| retired(*t))
    }

    /// Drops the records at the front that `retired` says no later record can join.
    fn drop_retired(&mut self, retired: impl Fn(i64) -> bool) {
        while self.front_retired(&retired) {
            self.records.pop_front();
        }
    }

    fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Asks for the cache lines of the first few records.
    #[inline(always)]
    fn prefetch_front(&self) {
        let (front, _) = self.records.as_slices();
        let len = front.len().min(4) * std::mem::size_of::<(i64, T)>();
        prefetch_bytes(front.as_ptr().cast(), len);
    }

    fn iter(&self) -> impl Iterator<Item = &(i64, T)> {
        self.records.iter()
    }
}

/// One key's buffered records of both sides, and the key (which a snapshot writes them
/// under).
#[derive(Clone)]
struct KeyBuffers<K, A, B> {
    key: K,
    left: TimeOrdered<A>,
    right: TimeOrdered<B>,
}

/// The buffers of the subtask's keys, and the snapshot of the checkpoint being written after
/// its barrier. The barrier shares each key's buffers with the snapshot (an `Arc` per key: a
/// pointer copy per key, no record copied), whose writer encodes them in pieces on its turns.
/// A key's first change after the barrier, while the snapshot still shares it, writes the key
/// into the snapshot first and lets the snapshot's share go, so the change is made in place:
/// the snapshot holds every key as it was at the barrier, each key is encoded once, and none
/// is copied (as the window operators write a key before its first change).
struct JoinBuffers<K, A, B> {
    keys: HashMap<K, Buffered<K, A, B>>,
    /// The snapshot being written, from its barrier until the next.
    pending: Option<SharedPending<K, A, B>>,
}

/// The snapshot being written, shared by the operator (which writes a key before its first
/// change) and the checkpoint writer (which writes the rest on its turns).
type SharedPending<K, A, B> = Arc<Mutex<Pending<K, A, B>>>;

/// A key's buffers, and their place in the snapshot being written (if it holds them).
struct Buffered<K, A, B> {
    buffers: Arc<KeyBuffers<K, A, B>>,
    slot: usize,
}

impl<K, A, B> Default for JoinBuffers<K, A, B> {
    fn default() -> Self {
        JoinBuffers {
            keys: HashMap::new(),
            pending: None,
        }
    }
}

impl<K: Key, A: StateValue, B: StateValue> JoinBuffers<K, A, B> {
    /// The buffers of `key` to change, created empty if it has none.
    fn of_key(&mut self, key: &K) -> &mut KeyBuffers<K, A, B> {
        if !self.keys.contains_key(key) {
            let empty = KeyBuffers {
                key: key.clone(),
                left: TimeOrdered::default(),
                right: TimeOrdered::default(),
            };
            let buffered = Buffered {
                buffers: Arc::new(empty),
                slot: usize::MAX,
            };
            self.keys.insert(key.clone(), buffered);
        }
        let buffered = self.keys.get_mut(key).expect("inserted above");
        Self::release(&self.pending, buffered);
        Arc::make_mut(&mut buffered.buffers)
    }

    /// Before a change to `buffered`: if the snapshot being written still shares the key, it
    /// writes the key now and lets it go (so `Arc::make_mut` copies nothing). A snapshot whose
    /// checkpoint was given up (its part dropped) lets the key go unwritten.
    fn release(pending: &Option<SharedPending<K, A, B>>, buffered: &Buffered<K, A, B>) {
        if Arc::strong_count(&buffered.buffers) == 1 {
            return;
        }
        if let Some(pending) = pending {
            let given_up = Arc::strong_count(pending) == 1;
            let mut pending = lock(pending);
            if given_up {
                pending.let_go(buffered.slot);
            } else {
                pending.write_slot(buffered.slot);
            }
        }
    }

    /// Drops the records of `key` that `left_retired` and `right_retired` say no later record
    /// can join (the entries at the front of each side), and the key once it has none left.
    fn retire(
        &mut self,
        key: &K,
        left_retired: impl Fn(i64) -> bool,
        right_retired: impl Fn(i64) -> bool,
    ) {
        let Some(buffered) = self.keys.get_mut(key) else {
            return;
        };
        let shared = &buffered.buffers;
        if !shared.left.front_retired(&left_retired) && !shared.right.front_retired(&right_retired)
        {
            // Nothing to drop.
            return;
        }
        Self::release(&self.pending, buffered);
        let buffers = Arc::make_mut(&mut buffered.buffers);
        buffers.left.drop_retired(left_retired);
        buffers.right.drop_retired(right_retired);
        if buffers.left.is_empty() && buffers.right.is_empty() {
            self.keys.remove(key);
        }
    }

    /// A snapshot of every key's buffers as they are now, written into `writer` after the
    /// barrier. A snapshot still being written is finished first: each key has a place in
    /// one snapshot at a time.
    fn snapshot(
        &mut self,
        writer: KeyedSnapshotWriter<K, i64>,
        left: BufferState<A>,
        right: BufferState<B>,
    ) -> SharedPending<K, A, B> {
        if let Some(previous) = self.pending.take() {
            if Arc::strong_count(&previous) > 1 {
                lock(&previous).write_all();
            }
        }
        // Sharing a key's buffers writes the count at the head of its `Arc`, a cache miss
        // per key: ask for the counts a few keys ahead, so that the misses overlap.
        let mut listed: Vec<&mut Buffered<K, A, B>> = self.keys.values_mut().collect();
        for ahead in listed.iter().take(BARRIER_PREFETCH) {
            prefetch_count(&ahead.buffers);
        }
        let mut keys = Vec::with_capacity(listed.len());
        for slot in 0..listed.len() {
            if let Some(ahead) = listed.get(slot + BARRIER_PREFETCH) {
                prefetch_count(&ahead.buffers);
            }
            let buffered = &mut listed[slot];
            buffered.slot = slot;
            keys.push(Some(Arc::clone(&buffered.buffers)));
        }
        let pending = Arc::new(Mutex::new(Pending {
            keys,
            next: 0,
            writing: Some(writer),
            left,
            right,
            pieces: None,
            error: None,
        }));
        self.pending = Some(Arc::clone(&pending));
        pending
    }
}

/// How many keys ahead a snapshot's writing asks for the keys' buffers.
const WRITE_PREFETCH: usize = 8;

/// How many keys ahead the barrier asks for the counts of the keys' `Arc`s.
const BARRIER_PREFETCH: usize = 16;

/// Asks for the cache line of `shared`'s counts, which lie just before its value.
#[inline(always)]
fn prefetch_count<T>(shared: &Arc<T>) {
    let counts = 2 * std::mem::size_of::<usize>();
    prefetch_bytes(
        Arc::as_ptr(shared).cast::<u8>().wrapping_sub(counts),
        counts,
    );
}

/// Locks a snapshot being written (only its shard ever does; a panic elsewhere cannot leave
/// it half-changed in a way that matters more than the failed job).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The interval join as a keyed process function over the tagged union of both sides.
/// `lower` and `upper` are inclusive (exclusive bounds already moved in by one).
#[derive(Clone)]
struct IntervalJoinFunction<K, A, B, F> {
    function: F,
    lower: i64,
    upper: i64,
    left_late: Option<OutputTag<A>>,
    right_late: Option<OutputTag<B>>,
    buffers: SubtaskState<JoinBuffers<K, A, B>>,
}

impl<K: Key, A, B, F> IntervalJoinFunction<K, A, B, F> {
    /// The record's timestamp, and whether it is late (below the current watermark).
    fn arrival<O>(&self, ctx: &KeyedProcessContext<'_, K, O>) -> (i64, bool) {
        let Some(timestamp) = ctx.timestamp() else {
            panic!(
                "interval join '{}' received a record without a timestamp; give both inputs a \
                 WatermarkStrategy with a timestamp assigner (env.from_source(source, \
                 WatermarkStrategy::for_bounded_out_of_orderness(..).with_timestamp_assigner(..), \
                 name))",
                ctx.runtime().operator_name
            )
        };
        let watermark = ctx.current_watermark();
        (timestamp, watermark != i64::MIN && timestamp < watermark)
    }
}

/// The checkpointed buffers: per key one list state per side, an entry per buffered record
/// with its timestamp as namespace.
const LEFT_BUFFER: &str = "interval-join-left";
const RIGHT_BUFFER: &str = "interval-join-right";

impl<K, A, B, F> OwnKeyedState<K> for IntervalJoinFunction<K, A, B, F>
where
    K: Key,
    A: StateValue,
    B: StateValue,
{
    fn snapshot(&mut self, scope: &KeyedScope) -> Result<DeferredPart, StateError> {
        let mut writer = scope.writer::<K, i64>();
        let left = BufferState::<A>::add(&mut writer, LEFT_BUFFER);
        let right = BufferState::<B>::add(&mut writer, RIGHT_BUFFER);
        let pending = self.buffers.get().snapshot(writer, left, right);
        Ok(Box::new(BuffersPart(pending)))
    }

    fn restore(&mut self, scope: &KeyedScope, parts: &[Bytes]) -> Result<(), StateError> {
        let restored = scope.read::<K, i64>(parts)?;
        let buffers = self.buffers.get();
        BufferState::<A>::restore(&restored, LEFT_BUFFER, |key, timestamp, record| {
            buffers.of_key(key).left.insert(timestamp, record);
        })?;
        BufferState::<B>::restore(&restored, RIGHT_BUFFER, |key, timestamp, record| {
            buffers.of_key(key).right.insert(timestamp, record);
        })
    }
}

/// A checkpoint's snapshot of the buffers, as they were at its barrier, being written: the
/// keys not written yet, and the snapshot so far.
struct Pending<K, A, B> {
    /// Each key's buffers at the barrier, until written (by the writer's turn, or before the
    /// key's first change).
    keys: Vec<Option<Arc<KeyBuffers<K, A, B>>>>,
    /// Where the writer's turns go on.
    next: usize,
    /// The snapshot, while keys are written into it.
    writing: Option<KeyedSnapshotWriter<K, i64>>,
    left: BufferState<A>,
    right: BufferState<B>,
    /// The snapshot once every key is written.
    pieces: Option<KeyedSnapshotPieces>,
    /// Why a key could not be written, for the checkpoint writer to report.
    error: Option<String>,
}

impl<K: Key, A: StateValue, B: StateValue> Pending<K, A, B> {
    /// Lets the key in place `slot` go without writing it.
    fn let_go(&mut self, slot: usize) {
        if let Some(share) = self.keys.get_mut(slot) {
            *share = None;
        }
    }

    /// Writes the key in place `slot` if it is not written yet, and lets its buffers go.
    fn write_slot(&mut self, slot: usize) {
        let Some(buffers) = self.keys.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let Some(writer) = &mut self.writing else {
            return;
        };
        let written = writer
            .set_key(&buffers.key)
            .and_then(|()| self.left.put(writer, &buffers.left))
            .and_then(|()| self.right.put(writer, &buffers.right));
        if let Err(error) = written {
            self.error.get_or_insert(error.to_string());
        }
    }

    /// Writes keys until about `budget` more bytes are written; whether every key is.
    fn write_some(&mut self, budget: usize) -> bool {
        let until = self
            .writing
            .as_ref()
            .map_or(0, |writer| writer.encoded_len().saturating_add(budget));
        while self.next < self.keys.len() {
            if self
                .writing
                .as_ref()
                .is_some_and(|writer| writer.encoded_len() >= until)
            {
                return false;
            }
            self.prefetch_ahead(self.next);
            self.write_slot(self.next);
            self.next += 1;
        }
        true
    }

    /// Asks for what writing the keys after `slot` reads, which lies scattered: the buffers
    /// of the key [`WRITE_PREFETCH`] places on, and the first records of each side of the key
    /// half as far (whose buffers an earlier call asked for), so that the misses overlap.
    #[inline(always)]
    fn prefetch_ahead(&self, slot: usize) {
        if let Some(Some(far)) = self.keys.get(slot + WRITE_PREFETCH) {
            prefetch(&**far);
        }
        if let Some(Some(near)) = self.keys.get(slot + WRITE_PREFETCH / 2) {
            near.left.prefetch_front();
            near.right.prefetch_front();
        }
    }

    /// Writes every key not written yet.
    fn write_all(&mut self) {
        self.write_some(usize::MAX);
    }
}

/// The checkpoint writer's side of a [`Pending`] snapshot: writes its keys about its budget a
/// step, then hands the snapshot out in pieces.
struct BuffersPart<K, A, B>(SharedPending<K, A, B>);

impl<K: Key, A: StateValue, B: StateValue> PartEncoder for BuffersPart<K, A, B> {
    fn encode_next(&mut self, out: &mut Vec<u8>, budget: usize) -> Result<bool, String> {
        let mut pending = lock(&self.0);
        if pending.writing.is_some() {
            let done = pending.write_some(budget);
            if let Some(error) = pending.error.take() {
                return Err(error);
            }
            if !done {
                return Ok(true);
            }
            let writer = pending.writing.take().expect("checked above");
            pending.pieces = Some(writer.into_pieces());
            // Every share is let go by now.
            pending.keys = Vec::new();
        }
        let pieces = pending.pieces.as_mut().expect("every key is written");
        pieces
            .encode_next(out, budget)
            .map_err(|error| error.to_string())
    }
}

/// One side's buffer in a checkpoint.
struct BufferState<T> {
    state: WriterState,
    codec: StateValueCodec<T>,
}

impl<T: StateValue> BufferState<T> {
    fn add<K: Key>(writer: &mut KeyedSnapshotWriter<K, i64>, name: &str) -> Self {
        let codec = StateValueCodec::of();
        let state = writer.add_state(name, StateKind::List, codec.value_type());
        BufferState { state, codec }
    }

    /// Writes the current key's buffered records.
    fn put<K: Key>(
        &self,
        writer: &mut KeyedSnapshotWriter<K, i64>,
        buffer: &TimeOrdered<T>,
    ) -> Result<(), StateError> {
        for (timestamp, record) in buffer.iter() {
            writer.put(self.state, Some(timestamp), &self.codec, record)?;
        }
        Ok(())
    }

    /// Hands every restored record of `name` with its key and timestamp to `buffer`.
    fn restore<K: Key>(
        restored: &KeyedSnapshotEntries<K, i64>,
        name: &str,
        mut buffer: impl FnMut(&K, i64, T),
    ) -> Result<(), StateError> {
        restored.for_each(
            name,
            StateKind::List,
            &StateValueCodec::of(),
            |key, timestamp, record| {
                let timestamp = timestamp.ok_or_else(|| {
                    foreign_state(
                        format!(
                            "the interval join's checkpoint holds a record of key {key:?} \
                             without its timestamp"
                        ),
                        "restore from a checkpoint this job wrote",
                    )
                })?;
                buffer(key, timestamp, record);
                Ok(())
            },
        )?;
        Ok(())
    }
}

impl<K, A, B, O, F> KeyedProcessFunction<K, Either<A, B>, O> for IntervalJoinFunction<K, A, B, F>
where
    K: Key + Sync,
    A: Record + StateValue + Sync,
    B: Record + StateValue + Sync,
    F: ProcessJoinFunction<A, B, O>,
{
    fn open(&mut self, ctx: &RuntimeContext) {
        self.function.open(ctx);
    }

    #[allow(private_interfaces)]
    fn own_keyed_state(&mut self) -> Option<&mut dyn OwnKeyedState<K>> {
        Some(self)
    }

    fn process_element(&mut self, value: Either<A, B>, ctx: &mut KeyedProcessContext<'_, K, O>) {
        let (timestamp, late) = self.arrival(ctx);
        let IntervalJoinFunction {
            function,
            lower,
            upper,
            left_late,
            right_late,
            buffers,
        } = self;
        let (lower, upper) = (*lower, *upper);
        let runtime = ctx.runtime;
        match value {
            Either::Left(left) if late => {
                if let Some(tag) = left_late {
                    ctx.output(tag, left);
                }
            }
            Either::Right(right) if late => {
                if let Some(tag) = right_late {
                    ctx.output(tag, right);
                }
            }
            Either::Left(left) => {
                let buffers = buffers.get().of_key(ctx.current_key());
                let (from, to) = (
                    timestamp.saturating_add(lower),
                    timestamp.saturating_add(upper),
                );
                for (right_timestamp, right) in buffers.right.between(from, to) {
                    let mut join_ctx = ProcessJoinContext {
                        out: &mut *ctx.out,
                        left_timestamp: timestamp,
                        right_timestamp: *right_timestamp,
                        runtime,
                    };
                    function.process_element(&left, right, &mut join_ctx);
                }
                buffers.left.insert(timestamp, left);
                // Retired once the watermark passes `timestamp + upper`.
                ctx.register_event_time_timer(to.saturating_add(1));
            }
            Either::Right(right) => {
                let buffers = buffers.get().of_key(ctx.current_key());
                let (from, to) = (
                    timestamp.saturating_sub(upper),
                    timestamp.saturating_sub(lower),
                );
                for (left_timestamp, left) in buffers.left.between(from, to) {
                    let mut join_ctx = ProcessJoinContext {
                        out: &mut *ctx.out,
                        left_timestamp: *left_timestamp,
                        right_timestamp: timestamp,
                        runtime,
                    };
                    function.process_element(left, &right, &mut join_ctx);
                }
                buffers.right.insert(timestamp, right);
                // Retired once the watermark passes `timestamp - lower`.
                ctx.register_event_time_timer(to.saturating_add(1));
            }
        }
    }

    /// A cleanup timer of the current key: drops what the watermark has retired on both sides
    /// (timers of both sides at one time are one timer).
    fn on_timer(&mut self, _timestamp: i64, ctx: &mut KeyedProcessContext<'_, K, O>) {
        let watermark = ctx.current_watermark();
        let (lower, upper) = (self.lower, self.upper);
        // A right record arriving from now on has a time of at least `watermark`.
        self.buffers.get().retire(
            ctx.current_key(),
            |t| t.saturating_add(upper) < watermark,
            |t| t.saturating_sub(lower) < watermark,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A step on a side's buffer: buffer a record at a time, look up a range, or retire
    /// what is older than a time.
    #[derive(Clone, Debug)]
    enum Step {
        Insert(i64),
        Between(i64, i64),
        Retire(i64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0i64..200).prop_map(Step::Insert),
            2 => (0i64..200, 0i64..60).prop_map(|(from, len)| Step::Between(from, from + len)),
            1 => (0i64..200).prop_map(Step::Retire),
        ]
    }

    proptest! {
        /// A side's buffer finds, keeps and retires what a map of timestamps to records in
        /// arrival order does, whatever the order records come in.
        #[test]
        fn a_side_buffer_behaves_as_a_map_by_time(steps in proptest::collection::vec(step(), 1..200)) {
            let mut buffer = TimeOrdered::default();
            let mut reference: std::collections::BTreeMap<i64, Vec<usize>> = Default::default();
            for (n, step) in steps.into_iter().enumerate() {
                match step {
                    Step::Insert(t) => {
                        buffer.insert(t, n);
                        reference.entry(t).or_default().push(n);
                    }
                    Step::Between(from, to) => {
                        let found: Vec<_> = buffer.between(from, to).copied().collect();
                        let expected: Vec<_> = reference
                            .range(from..=to)
                            .flat_map(|(t, records)| records.iter().map(|r| (*t, *r)))
                            .collect();
                        prop_assert_eq!(found, expected);
                    }
                    Step::Retire(before) => {
                        buffer.drop_retired(|t| t < before);
                        reference.retain(|t, _| *t >= before);
                    }
                }
                let all: Vec<_> = buffer.iter().copied().collect();
                let expected: Vec<_> = reference
                    .iter()
                    .flat_map(|(t, records)| records.iter().map(|r| (*t, *r)))
                    .collect();
                prop_assert_eq!(all, expected);
            }
        }
    }

    type Buffers = std::collections::BTreeMap<u32, (Vec<(i64, u64)>, Vec<(i64, String)>)>;

    fn join() -> IntervalJoinFunction<u32, u64, String, ()> {
        IntervalJoinFunction {
            function: (),
            lower: -10,
            upper: 10,
            left_late: None,
            right_late: None,
            buffers: SubtaskState::default(),
        }
    }

    /// One side's buffered records, in order.
    fn side<T: Clone>(buffer: &TimeOrdered<T>) -> Vec<(i64, T)> {
        buffer.iter().cloned().collect()
    }

    /// Every key's buffered records.
    fn contents(join: &mut IntervalJoinFunction<u32, u64, String, ()>) -> Buffers {
        let keys = join.buffers.get().keys.iter();
        keys.map(|(key, buffered)| {
            let buffers = &buffered.buffers;
            (*key, (side(&buffers.left), side(&buffers.right)))
        })
        .collect()
    }

    fn buffer_left(join: &mut IntervalJoinFunction<u32, u64, String, ()>, key: u32, t: i64) {
        join.buffers
            .get()
            .of_key(&key)
            .left
            .insert(t, t as u64 * 100);
    }

    fn buffer_right(join: &mut IntervalJoinFunction<u32, u64, String, ()>, key: u32, t: i64) {
        join.buffers
            .get()
            .of_key(&key)
            .right
            .insert(t, format!("r{t}"));
    }

    /// Hands `part` out in steps of `budget`, each appended to the bytes so far.
    fn encode(mut part: DeferredPart, budget: usize) -> (Vec<u8>, usize) {
        let (mut bytes, mut steps) = (Vec::new(), 0);
        while part
            .encode_next(&mut bytes, budget)
            .expect("encode the buffers")
        {
            steps += 1;
        }
        (bytes, steps + 1)
    }

    #[test]
    fn a_snapshot_holds_the_buffers_as_they_were_at_its_barrier_while_records_change_them() {
        let scope = KeyedScope::single(128);
        let mut live = join();
        for key in 0..40 {
            for t in [10, 20, 20] {
                buffer_left(&mut live, key, t);
            }
            buffer_right(&mut live, key, 15);
        }
        let at_barrier = contents(&mut live);
        let part = live.snapshot(&scope).expect("snapshot at the barrier");

        // After the barrier: records added to a key, a key retired whole, a key retired in
        // part, a new key.
        buffer_left(&mut live, 1, 30);
        buffer_right(&mut live, 1, 31);
        live.buffers.get().retire(&2, |_| true, |_| true);
        live.buffers.get().retire(&3, |t| t < 15, |_| false);
        buffer_left(&mut live, 99, 5);
        let after = contents(&mut live);
        assert!(!after.contains_key(&2) && after[&3].0 == [(20, 2000), (20, 2000)]);
        assert_eq!(
            after[&1].1,
            [(15, "r15".to_string()), (31, "r31".to_string())]
        );

        let (bytes, steps) = encode(part, 64);
        assert!(
            steps > 2,
            "the buffers are written in several steps: {steps}"
        );
        let mut restored = join();
        restored
            .restore(&scope, &[Bytes::from(bytes)])
            .expect("restore the snapshot");
        assert_eq!(contents(&mut restored), at_barrier);
        assert_eq!(
            contents(&mut live),
            after,
            "the live buffers are as they were changed"
        );
    }

    /// The key's buffers as the operator holds them.
    fn held(join: &mut IntervalJoinFunction<u32, u64, String, ()>, key: u32) -> *const () {
        Arc::as_ptr(&join.buffers.get().keys[&key].buffers).cast()
    }

    #[test]
    fn a_change_after_the_barrier_writes_the_key_first_and_copies_nothing() {
        let scope = KeyedScope::single(128);
        let mut live = join();
        buffer_left(&mut live, 7, 10);
        buffer_left(&mut live, 8, 10);
        let seven = held(&mut live, 7);
        let part = live.snapshot(&scope).expect("snapshot at the barrier");
        live.buffers.get().retire(&7, |t| t < 10, |_| true);
        buffer_left(&mut live, 7, 11);
        live.buffers.get().retire(&8, |t| t <= 10, |_| true);
        assert_eq!(held(&mut live, 7), seven, "changed in place, not copied");
        assert!(!live.buffers.get().keys.contains_key(&8));

        let (bytes, _) = encode(part, 64);
        let mut restored = join();
        restored
            .restore(&scope, &[Bytes::from(bytes)])
            .expect("restore the snapshot");
        let expected: Buffers = [
            (7, (vec![(10, 1000)], vec![])),
            (8, (vec![(10, 1000)], vec![])),
        ]
        .into_iter()
        .collect();
        assert_eq!(contents(&mut restored), expected);
    }

    #[test]
    fn a_snapshot_given_up_lets_the_keys_go_unwritten() {
        let scope = KeyedScope::single(128);
        let mut live = join();
        buffer_left(&mut live, 7, 10);
        let seven = held(&mut live, 7);
        drop(live.snapshot(&scope).expect("snapshot at the barrier"));
        buffer_left(&mut live, 7, 11);
        assert_eq!(held(&mut live, 7), seven, "changed in place, not copied");
        let pending = live.buffers.get().pending.clone().expect("the snapshot");
        let pending = lock(&pending);
        assert!(pending.keys.iter().all(Option::is_none));
        let writer = pending.writing.as_ref().expect("never finished");
        assert_eq!(writer.encoded_len(), 0, "nothing was written for it");
    }

    #[test]
    fn a_barrier_finishes_the_snapshot_before_it() {
        let scope = KeyedScope::single(128);
        let mut live = join();
        for key in 0..10 {
            buffer_left(&mut live, key, 10);
        }
        let first = live.snapshot(&scope).expect("the first barrier");
        let at_first = contents(&mut live);
        buffer_left(&mut live, 3, 12);
        let second = live.snapshot(&scope).expect("the second barrier");
        let at_second = contents(&mut live);
        buffer_left(&mut live, 3, 13);
        for (part, expected) in [(second, at_second), (first, at_first)] {
            let (bytes, _) = encode(part, 64);
            let mut restored = join();
            restored
                .restore(&scope, &[Bytes::from(bytes)])
                .expect("restore a snapshot");
            assert_eq!(contents(&mut restored), expected);
        }
    }
}
