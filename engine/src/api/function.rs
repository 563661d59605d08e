//! User function traits and the contexts they receive.

use crate::operator::process::OwnKeyedState;
use crate::operator::{Batch, Emitter, OutputTag, RuntimeContext};
use crate::record::{Key, Watermark, NO_TIMESTAMP};
use crate::state::{
    AggregatingState, AggregatingStateDescriptor, KeyedStateStore, ListState, ListStateDescriptor,
    MapState, MapStateDescriptor, ReducingState, ReducingStateDescriptor, StateValue, ValueState,
    ValueStateDescriptor,
};
use crate::time::{now_ms, TimeDomain, TimerQueue};

fn timestamp_of(timestamp: i64) -> Option<i64> {
    (timestamp != NO_TIMESTAMP).then_some(timestamp)
}

/// Where a `flat_map` function puts its output records. They keep the input record's
/// timestamp.
pub struct Collector<'a, T> {
    pub(crate) out: &'a mut Batch<T>,
    pub(crate) timestamp: i64,
}

impl<T> Collector<'_, T> {
    /// Emits one record.
    #[inline]
    pub fn collect(&mut self, record: T) {
        self.out.push(record, self.timestamp);
    }
}

/// The context of a [`ProcessFunction`] call.
pub struct ProcessContext<'a, O> {
    pub(crate) out: &'a mut Emitter<O>,
    pub(crate) timestamp: i64,
    pub(crate) watermark: Watermark,
    pub(crate) runtime: &'a RuntimeContext,
}

impl<O> ProcessContext<'_, O> {
    /// Emits one record (with the input record's timestamp).
    #[inline]
    pub fn emit(&mut self, record: O) {
        self.out.main.push(record, self.timestamp);
    }

    /// Emits one record to the side output `tag` (read it with `get_side_output`).
    pub fn output<X: 'static>(&mut self, tag: &OutputTag<X>, record: X) {
        self.out.side.emit(tag, record, self.timestamp);
    }

    /// The input record's event timestamp, if it has one.
    pub fn timestamp(&self) -> Option<i64> {
        timestamp_of(self.timestamp)
    }

    /// The operator's current event time (the last watermark it received).
    pub fn current_watermark(&self) -> i64 {
        self.watermark.0
    }

    /// The subtask this call runs in.
    pub fn runtime(&self) -> &RuntimeContext {
        self.runtime
    }
}

/// A function over each record of a stream, emitting any number of records through its
/// context. One instance (a clone of the one given to `process`) runs per subtask.
///
/// Closures work too; name the context type in their signature:
/// `|x: u64, ctx: &mut ProcessContext<'_, u64>| ctx.emit(x)`.
pub trait ProcessFunction<I, O>: Clone + Send + Sync + 'static {
    /// Called once per subtask before the first record.
    fn open(&mut self, _ctx: &RuntimeContext) {}
    /// Handles one record.
    fn process_element(&mut self, value: I, ctx: &mut ProcessContext<'_, O>);
}

impl<I, O, F> ProcessFunction<I, O> for F
where
    F: FnMut(I, &mut ProcessContext<'_, O>) + Clone + Send + Sync + 'static,
{
    fn process_element(&mut self, value: I, ctx: &mut ProcessContext<'_, O>) {
        self(value, ctx)
    }
}

/// A keyed operator's timers: per key, event-time timers (fired by watermarks) and
/// processing-time timers (fired by the wall clock).
pub(crate) struct KeyedTimers<K> {
    pub(crate) event: TimerQueue<K>,
    pub(crate) processing: TimerQueue<K>,
}

impl<K> Default for KeyedTimers<K> {
    fn default() -> Self {
        KeyedTimers {
            event: TimerQueue::default(),
            processing: TimerQueue::default(),
        }
    }
}

/// The context of a [`KeyedProcessFunction`] call: for a record (`process_element`) or for a
/// timer that fired (`on_timer`, where [`KeyedProcessContext::time_domain`] says which kind).
pub struct KeyedProcessContext<'a, K, O> {
    pub(crate) key: &'a K,
    pub(crate) out: &'a mut Emitter<O>,
    pub(crate) timestamp: i64,
    pub(crate) watermark: Watermark,
    pub(crate) timers: &'a mut KeyedTimers<K>,
    pub(crate) domain: Option<TimeDomain>,
    pub(crate) runtime: &'a RuntimeContext,
    pub(crate) state: &'a KeyedStateStore<K>,
}

/// Keyed state, scoped to the current key. Each method returns the handle of the state its
/// descriptor declares, registering it on first use (see [`crate::state`]); registering a name
/// again with another type fails the job. Handles are cheap (a reference count) and act on the
/// current key only: take them per call, keep descriptors in the function.
impl<K: Key, O> KeyedProcessContext<'_, K, O> {
    /// A single value per key (Flink's `ValueState`).
    pub fn value_state<T: StateValue>(
        &self,
        descriptor: &ValueStateDescriptor<T>,
    ) -> ValueState<T> {
        self.state
            .handle(self.key, descriptor.id(), descriptor.name(), |b| {
                b.value_state(descriptor)
            })
    }

    /// A list per key (Flink's `ListState`; on RocksDB appends are merges, no read).
    pub fn list_state<T: StateValue>(&self, descriptor: &ListStateDescriptor<T>) -> ListState<T> {
        self.state
            .handle(self.key, descriptor.id(), descriptor.name(), |b| {
                b.list_state(descriptor)
            })
    }

    /// A map per key (Flink's `MapState`; iterate with `entries`).
    pub fn map_state<UK, UV>(&self, descriptor: &MapStateDescriptor<UK, UV>) -> MapState<UK, UV>
    where
        UK: weir_state::StateKey + weir_state::StateCodec,
        UV: StateValue,
    {
        self.state
            .handle(self.key, descriptor.id(), descriptor.name(), |b| {
                b.map_state(descriptor)
            })
    }

    /// A value per key folded with the descriptor's reduce function on every `add`.
    pub fn reducing_state<T: StateValue>(
        &self,
        descriptor: &ReducingStateDescriptor<T>,
    ) -> ReducingState<T> {
        self.state
            .handle(self.key, descriptor.id(), descriptor.name(), |b| {
                b.reducing_state(descriptor)
            })
    }

    /// An accumulator per key, fed by `add`, read as the descriptor's aggregate result.
    pub fn aggregating_state<IN: 'static, ACC: StateValue, OUT: 'static>(
        &self,
        descriptor: &AggregatingStateDescriptor<IN, ACC, OUT>,
    ) -> AggregatingState<IN, OUT> {
        self.state
            .handle(self.key, descriptor.id(), descriptor.name(), |b| {
                b.aggregating_state(descriptor)
            })
    }
}

impl<K: std::hash::Hash + Eq + Clone, O> KeyedProcessContext<'_, K, O> {
    /// The key of the record being processed (or of the timer that fired).
    #[inline]
    pub fn current_key(&self) -> &K {
        self.key
    }

    /// Emits one record. It carries the input record's timestamp, or an event-time timer's
    /// time; records emitted from a processing-time timer have none.
    #[inline]
    pub fn emit(&mut self, record: O) {
        self.out.main.push(record, self.timestamp);
    }

    /// Emits one record to the side output `tag` (read it with `get_side_output`).
    pub fn output<X: 'static>(&mut self, tag: &OutputTag<X>, record: X) {
        self.out.side.emit(tag, record, self.timestamp);
    }

    /// The input record's event timestamp (or the event-time timer's time), if any.
    pub fn timestamp(&self) -> Option<i64> {
        timestamp_of(self.timestamp)
    }

    /// In `on_timer`: whether an event-time or a processing-time timer fired. `None` in
    /// `process_element`.
    pub fn time_domain(&self) -> Option<TimeDomain> {
        self.domain
    }

    /// The operator's current event time (the last watermark it received).
    pub fn current_watermark(&self) -> i64 {
        self.watermark.0
    }

    /// The wall clock, in ms since the epoch.
    pub fn current_processing_time(&self) -> i64 {
        now_ms()
    }

    /// Calls `on_timer` for the current key once the watermark reaches `time`. Registering the
    /// same (key, time) twice fires once.
    pub fn register_event_time_timer(&mut self, time: i64) {
        self.timers.event.register(self.key, time);
    }

    /// Calls `on_timer` for the current key once the wall clock reaches `time`.
    pub fn register_processing_time_timer(&mut self, time: i64) {
        self.timers.processing.register(self.key, time);
    }

    /// Removes the current key's event-time timer at `time`, if there is one.
    pub fn delete_event_time_timer(&mut self, time: i64) {
        self.timers.event.delete(self.key, time);
    }

    /// Removes the current key's processing-time timer at `time`, if there is one.
    pub fn delete_processing_time_timer(&mut self, time: i64) {
        self.timers.processing.delete(self.key, time);
    }

    /// The subtask this call runs in.
    pub fn runtime(&self) -> &RuntimeContext {
        self.runtime
    }
}

/// A function over each record of a keyed stream; sees the record's key, and may set timers
/// per key that call [`KeyedProcessFunction::on_timer`]. Every record of a key reaches the
/// same subtask (and so the same instance).
///
/// Closures work too (without timers): `|x: Event, ctx: &mut KeyedProcessContext<'_, u32, u64>| ...`.
pub trait KeyedProcessFunction<K, I, O>: Clone + Send + Sync + 'static {
    /// Called once per subtask before the first record.
    fn open(&mut self, _ctx: &RuntimeContext) {}
    /// Handles one record.
    fn process_element(&mut self, value: I, ctx: &mut KeyedProcessContext<'_, K, O>);
    /// A timer of `ctx.current_key()` fired at `timestamp`.
    fn on_timer(&mut self, _timestamp: i64, _ctx: &mut KeyedProcessContext<'_, K, O>) {}
    /// What the function keeps in its own fields that a checkpoint cannot restore, if it
    /// matters: a job with checkpointing on refuses to start, naming it. Keyed state and timers
    /// are checkpointed; a function's fields are not (as in Flink).
    fn unmanaged_state(&self) -> Option<&'static str> {
        None
    }
    /// Keyed state the function keeps in fields of its own and writes to checkpoints itself
    /// (the interval join's buffers).
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn own_keyed_state(&mut self) -> Option<&mut dyn OwnKeyedState<K>> {
        None
    }
}

impl<K, I, O, F> KeyedProcessFunction<K, I, O> for F
where
    F: FnMut(I, &mut KeyedProcessContext<'_, K, O>) + Clone + Send + Sync + 'static,
{
    fn process_element(&mut self, value: I, ctx: &mut KeyedProcessContext<'_, K, O>) {
        self(value, ctx)
    }
}
