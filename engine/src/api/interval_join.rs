//! Interval joins (Flink's `KeyedStream.intervalJoin`):
//! `a.key_by(ka).interval_join(b.key_by(kb)).between(lower, upper).process(f)` joins a left
//! record at time `t` with every right record of its key whose time lies in
//! `[t + lower, t + upper]` (each bound inclusive unless made exclusive).
//!
//! Built on single-input parts, like the window join: both inputs are tagged into an
//! [`Either`], unioned, keyed by the side's key selector and run through one keyed process
//! function, so records of both sides with equal keys meet in one subtask and event time is
//! the minimum of both inputs' watermarks. Per key, each side is buffered in a
//! `BTreeMap<timestamp, Vec<record>>`: a record looks up the other side's range
//! (`O(log n + matches)`), joins, and is buffered. Flink's rules hold: a record below the
//! current watermark is late and dropped (or sent to the side's late-data side output), the
//! output carries `max(left time, right time)`, and buffers are cleaned with event-time
//! timers: once the watermark `w` passes `t + upper` no right record that can still arrive
//! (at `w` or later) joins a left record at `t`, nor, once `w` passes `t - lower`, a left
//! record a right record at `t`. Each record registers one timer at the first watermark that
//! retires it; a firing timer drops every retired entry of its key from the front of both maps.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};

use super::connected::{either_key, tag_and_union};
use super::either::Either;
use super::function::{KeyedProcessContext, KeyedProcessFunction};
use bytes::Bytes;
use weir_state::{
    KeyedSnapshotEntries, KeyedSnapshotWriter, StateError, StateKind, StateValueCodec, WriterState,
};

use super::keyed::KeyedStream;
use super::stream::DataStream;
use crate::checkpoint::keyed::{foreign_state, KeyedScope};
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
    /// [`StateValue`]s (rkyv-archivable, as records are).
    pub fn process<O: Record, F: ProcessJoinFunction<A, B, O>>(self, function: F) -> DataStream<O>
    where
        A: StateValue,
        B: StateValue,
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

/// One key's buffered records of both sides, by timestamp.
struct KeyBuffers<A, B> {
    left: BTreeMap<i64, Vec<A>>,
    right: BTreeMap<i64, Vec<B>>,
}

impl<A, B> Default for KeyBuffers<A, B> {
    fn default() -> Self {
        KeyBuffers {
            left: BTreeMap::new(),
            right: BTreeMap::new(),
        }
    }
}

/// Drops the entries at the front of `buffer` that `retired` says no later record can join.
fn drop_retired<T>(buffer: &mut BTreeMap<i64, Vec<T>>, retired: impl Fn(i64) -> bool) {
    while let Some(entry) = buffer.first_entry() {
        if !retired(*entry.key()) {
            break;
        }
        entry.remove();
    }
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
    buffers: SubtaskState<HashMap<K, KeyBuffers<A, B>>>,
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

    /// The buffers of `key`, created empty if it has none.
    fn key_buffers<'s>(
        buffers: &'s mut HashMap<K, KeyBuffers<A, B>>,
        key: &K,
    ) -> &'s mut KeyBuffers<A, B> {
        if !buffers.contains_key(key) {
            buffers.insert(key.clone(), KeyBuffers::default());
        }
        buffers.get_mut(key).expect("inserted above")
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
    fn snapshot(&mut self, scope: &KeyedScope) -> Result<Vec<u8>, StateError> {
        let mut writer = scope.writer::<K, i64>();
        let left = BufferState::<A>::add(&mut writer, LEFT_BUFFER);
        let right = BufferState::<B>::add(&mut writer, RIGHT_BUFFER);
        for (key, buffers) in self.buffers.get().iter() {
            writer.set_key(key)?;
            left.put(&mut writer, &buffers.left)?;
            right.put(&mut writer, &buffers.right)?;
        }
        let mut bytes = Vec::new();
        writer.finish(&mut bytes)?;
        Ok(bytes)
    }

    fn restore(&mut self, scope: &KeyedScope, parts: &[Bytes]) -> Result<(), StateError> {
        let restored = scope.read::<K, i64>(parts)?;
        let buffers = self.buffers.get();
        BufferState::<A>::restore(&restored, LEFT_BUFFER, |key, timestamp, record| {
            let side = &mut Self::key_buffers(buffers, key).left;
            side.entry(timestamp).or_default().push(record);
        })?;
        BufferState::<B>::restore(&restored, RIGHT_BUFFER, |key, timestamp, record| {
            let side = &mut Self::key_buffers(buffers, key).right;
            side.entry(timestamp).or_default().push(record);
        })
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
        buffer: &BTreeMap<i64, Vec<T>>,
    ) -> Result<(), StateError> {
        for (timestamp, records) in buffer {
            for record in records {
                writer.put(self.state, Some(timestamp), &self.codec, record)?;
            }
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
    K: Key,
    A: Record + StateValue,
    B: Record + StateValue,
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
                let buffers = Self::key_buffers(buffers.get(), ctx.current_key());
                let (from, to) = (
                    timestamp.saturating_add(lower),
                    timestamp.saturating_add(upper),
                );
                if from <= to {
                    for (&right_timestamp, rights) in buffers.right.range(from..=to) {
                        let mut join_ctx = ProcessJoinContext {
                            out: &mut *ctx.out,
                            left_timestamp: timestamp,
                            right_timestamp,
                            runtime,
                        };
                        for right in rights {
                            function.process_element(&left, right, &mut join_ctx);
                        }
                    }
                }
                buffers.left.entry(timestamp).or_default().push(left);
                // Retired once the watermark passes `timestamp + upper`.
                ctx.register_event_time_timer(to.saturating_add(1));
            }
            Either::Right(right) => {
                let buffers = Self::key_buffers(buffers.get(), ctx.current_key());
                let (from, to) = (
                    timestamp.saturating_sub(upper),
                    timestamp.saturating_sub(lower),
                );
                if from <= to {
                    for (&left_timestamp, lefts) in buffers.left.range(from..=to) {
                        let mut join_ctx = ProcessJoinContext {
                            out: &mut *ctx.out,
                            left_timestamp,
                            right_timestamp: timestamp,
                            runtime,
                        };
                        for left in lefts {
                            function.process_element(left, &right, &mut join_ctx);
                        }
                    }
                }
                buffers.right.entry(timestamp).or_default().push(right);
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
        let buffers = self.buffers.get();
        let Some(key_buffers) = buffers.get_mut(ctx.current_key()) else {
            return;
        };
        // A right record arriving from now on has a time of at least `watermark`.
        drop_retired(&mut key_buffers.left, |t| {
            t.saturating_add(upper) < watermark
        });
        drop_retired(&mut key_buffers.right, |t| {
            t.saturating_sub(lower) < watermark
        });
        if key_buffers.left.is_empty() && key_buffers.right.is_empty() {
            buffers.remove(ctx.current_key());
        }
    }
}
