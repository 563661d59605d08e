//! `connect`: two streams of different types processed by one function with two inputs
//! (Flink's `ConnectedStreams`, `CoMapFunction`, `CoFlatMapFunction`, `CoProcessFunction`
//! and, keyed, `KeyedCoProcessFunction`).
//!
//! Built from single-input parts: each input is tagged into an [`Either`] by a map chained to
//! it, the two tagged streams are unioned, and one operator dispatches each record to the
//! function's first or second method. Keyed, the key selector dispatches to the selector of the
//! record's side, so records of both inputs with equal keys reach the same subtask, and the
//! operator is the keyed process operator: timers, side outputs and keyed state work as in
//! `KeyedStream::process`. Event time is the minimum of both inputs' watermarks (the union's
//! input gate), as in Flink.

use super::either::Either;
use super::function::{
    Collector, KeyedProcessContext, KeyedProcessFunction, ProcessContext, ProcessFunction,
};
use super::keyed::KeyedStream;
use super::stream::DataStream;
use crate::operator::RuntimeContext;
use crate::record::{Key, Record};

/// Tags both inputs and unions them: the one stream a two-input construct runs on. The tagging
/// maps are named `<what>: left` and `<what>: right` (they chain to their inputs).
pub(crate) fn tag_and_union<A: Record, B: Record>(
    left: DataStream<A>,
    right: DataStream<B>,
    what: &str,
) -> DataStream<Either<A, B>> {
    let left = left
        .map(Either::<A, B>::Left)
        .name(&format!("{what}: left"));
    let right = right
        .map(Either::<A, B>::Right)
        .name(&format!("{what}: right"));
    left.union([right])
}

/// The key selector of a tagged stream: the left selector for left records, the right one for
/// right records.
pub(crate) fn either_key<A, B, K, KA, KB>(
    left: KA,
    right: KB,
) -> impl Fn(&Either<A, B>) -> K + Clone + Send + Sync + 'static
where
    A: 'static,
    B: 'static,
    K: Key,
    KA: Fn(&A) -> K + Clone + Send + Sync + 'static,
    KB: Fn(&B) -> K + Clone + Send + Sync + 'static,
{
    move |record: &Either<A, B>| match record {
        Either::Left(value) => left(value),
        Either::Right(value) => right(value),
    }
}

/// Two streams connected for one two-input function (Flink's `ConnectedStreams`); made by
/// [`DataStream::connect`]. Records of the two inputs interleave in arrival order; event time
/// is the minimum of the two inputs' watermarks.
///
/// ```no_run
/// use weir_engine::prelude::*;
///
/// # fn job(numbers: DataStream<u64>, words: DataStream<String>) {
/// numbers
///     .connect(words)
///     .map(|n: u64| n.to_string(), |w: String| w)
///     .sink_to(PrintSink::new(), "both");
/// # }
/// ```
pub struct ConnectedStreams<A, B> {
    left: DataStream<A>,
    right: DataStream<B>,
}

impl<A, B> std::fmt::Debug for ConnectedStreams<A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectedStreams")
            .field("left", &self.left)
            .field("right", &self.right)
            .finish()
    }
}

impl<A: Record, B: Record> ConnectedStreams<A, B> {
    fn tagged(self, what: &str) -> DataStream<Either<A, B>> {
        tag_and_union(self.left, self.right, what)
    }

    /// Maps records of the first input with `f1`, of the second with `f2` (Flink's
    /// `CoMapFunction`); the output keeps each record's timestamp.
    pub fn map<O: Record, F1, F2>(self, mut f1: F1, mut f2: F2) -> DataStream<O>
    where
        F1: FnMut(A) -> O + Clone + Send + Sync + 'static,
        F2: FnMut(B) -> O + Clone + Send + Sync + 'static,
    {
        self.tagged("Co-Map")
            .map(move |record: Either<A, B>| match record {
                Either::Left(value) => f1(value),
                Either::Right(value) => f2(value),
            })
            .name("Co-Map")
    }

    /// Turns records of the first input into any number of records with `f1`, of the second
    /// with `f2` (Flink's `CoFlatMapFunction`).
    pub fn flat_map<O: Record, F1, F2>(self, mut f1: F1, mut f2: F2) -> DataStream<O>
    where
        F1: FnMut(A, &mut Collector<'_, O>) + Clone + Send + Sync + 'static,
        F2: FnMut(B, &mut Collector<'_, O>) + Clone + Send + Sync + 'static,
    {
        self.tagged("Co-Flat Map")
            .flat_map(
                move |record: Either<A, B>, out: &mut Collector<'_, O>| match record {
                    Either::Left(value) => f1(value, out),
                    Either::Right(value) => f2(value, out),
                },
            )
            .name("Co-Flat Map")
    }

    /// Runs a [`CoProcessFunction`] over both inputs.
    pub fn process<O: Record, F: CoProcessFunction<A, B, O>>(self, function: F) -> DataStream<O> {
        self.tagged("Co-Process")
            .process(CoProcessAdapter(function))
            .name("Co-Process")
    }

    /// Partitions both inputs by key — `key1` on the first, `key2` on the second, of one key
    /// type — so that records of both with equal keys reach the same subtask.
    pub fn key_by<K: Key, K1, K2>(self, key1: K1, key2: K2) -> KeyedConnectedStreams<A, B, K1, K2>
    where
        K1: Fn(&A) -> K + Clone + Send + Sync + 'static,
        K2: Fn(&B) -> K + Clone + Send + Sync + 'static,
    {
        KeyedConnectedStreams {
            left: self.left,
            right: self.right,
            key1,
            key2,
        }
    }
}

/// Two streams connected and keyed with one key type (Flink's `ConnectedStreams` after
/// `keyBy`); made by [`ConnectedStreams::key_by`] or [`KeyedStream::connect`].
pub struct KeyedConnectedStreams<A, B, K1, K2> {
    left: DataStream<A>,
    right: DataStream<B>,
    key1: K1,
    key2: K2,
}

impl<A, B, K1, K2> std::fmt::Debug for KeyedConnectedStreams<A, B, K1, K2> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedConnectedStreams")
            .field("left", &self.left)
            .field("right", &self.right)
            .finish()
    }
}

impl<A: Record, B: Record, K1, K2> KeyedConnectedStreams<A, B, K1, K2> {
    /// Runs a [`KeyedCoProcessFunction`] over both inputs; its context tells the current key
    /// and sets timers per key, as in `KeyedStream::process`. The operator is named
    /// `Keyed Co-Process`.
    pub fn process<K, O, F>(self, function: F) -> DataStream<O>
    where
        K: Key,
        K1: Fn(&A) -> K + Clone + Send + Sync + 'static,
        K2: Fn(&B) -> K + Clone + Send + Sync + 'static,
        O: Record,
        F: KeyedCoProcessFunction<K, A, B, O>,
    {
        tag_and_union(self.left, self.right, "Keyed Co-Process")
            .key_by(either_key(self.key1, self.key2))
            .process(KeyedCoProcessAdapter(function))
            .name("Keyed Co-Process")
    }
}

impl<T: Record> DataStream<T> {
    /// Connects this stream (the first input) with `other` (the second) for a function with
    /// two inputs (Flink's `connect`): `map`, `flat_map` or `process` with a
    /// [`CoProcessFunction`], or `key_by` both and `process` with a
    /// [`KeyedCoProcessFunction`].
    pub fn connect<B: Record>(self, other: DataStream<B>) -> ConnectedStreams<T, B> {
        ConnectedStreams {
            left: self,
            right: other,
        }
    }
}

impl<T, K, KS> KeyedStream<T, K, KS>
where
    T: Record,
    K: Key,
    KS: Fn(&T) -> K + Clone + Send + Sync + 'static,
{
    /// Connects two keyed streams with the same key type for a [`KeyedCoProcessFunction`]
    /// (Flink's `keyedA.connect(keyedB)`).
    pub fn connect<B, KB>(self, other: KeyedStream<B, K, KB>) -> KeyedConnectedStreams<T, B, KS, KB>
    where
        B: Record,
        KB: Fn(&B) -> K + Clone + Send + Sync + 'static,
    {
        let key1 = self.key_selector();
        let key2 = other.key_selector();
        KeyedConnectedStreams {
            left: self.into_unkeyed(),
            right: other.into_unkeyed(),
            key1,
            key2,
        }
    }
}

/// A function over two inputs (Flink's `CoProcessFunction`): `process_element1` sees the
/// records of the first input, `process_element2` those of the second, in arrival order. One
/// instance (a clone of the one given to `process`) runs per subtask.
pub trait CoProcessFunction<A, B, O>: Clone + Send + Sync + 'static {
    /// Called once per subtask before the first record.
    fn open(&mut self, _ctx: &RuntimeContext) {}
    /// Handles one record of the first input.
    fn process_element1(&mut self, value: A, ctx: &mut ProcessContext<'_, O>);
    /// Handles one record of the second input.
    fn process_element2(&mut self, value: B, ctx: &mut ProcessContext<'_, O>);
}

/// A function over two keyed inputs (Flink's `KeyedCoProcessFunction`). Records of both inputs
/// with equal keys reach the same subtask (and instance); the context is the one of
/// `KeyedStream::process`: the current key, timers per key (calling
/// [`KeyedCoProcessFunction::on_timer`]), side outputs and keyed state.
pub trait KeyedCoProcessFunction<K, A, B, O>: Clone + Send + Sync + 'static {
    /// Called once per subtask before the first record.
    fn open(&mut self, _ctx: &RuntimeContext) {}
    /// Handles one record of the first input.
    fn process_element1(&mut self, value: A, ctx: &mut KeyedProcessContext<'_, K, O>);
    /// Handles one record of the second input.
    fn process_element2(&mut self, value: B, ctx: &mut KeyedProcessContext<'_, K, O>);
    /// A timer of `ctx.current_key()` fired at `timestamp`.
    fn on_timer(&mut self, _timestamp: i64, _ctx: &mut KeyedProcessContext<'_, K, O>) {}
}

/// A [`CoProcessFunction`] as the process function of the tagged union.
#[derive(Clone)]
struct CoProcessAdapter<F>(F);

impl<A, B, O, F: CoProcessFunction<A, B, O>> ProcessFunction<Either<A, B>, O>
    for CoProcessAdapter<F>
{
    fn open(&mut self, ctx: &RuntimeContext) {
        self.0.open(ctx);
    }

    #[inline]
    fn process_element(&mut self, value: Either<A, B>, ctx: &mut ProcessContext<'_, O>) {
        match value {
            Either::Left(value) => self.0.process_element1(value, ctx),
            Either::Right(value) => self.0.process_element2(value, ctx),
        }
    }
}

/// A [`KeyedCoProcessFunction`] as the keyed process function of the tagged union.
#[derive(Clone)]
struct KeyedCoProcessAdapter<F>(F);

impl<K, A, B, O, F> KeyedProcessFunction<K, Either<A, B>, O> for KeyedCoProcessAdapter<F>
where
    F: KeyedCoProcessFunction<K, A, B, O>,
{
    fn open(&mut self, ctx: &RuntimeContext) {
        self.0.open(ctx);
    }

    #[inline]
    fn process_element(&mut self, value: Either<A, B>, ctx: &mut KeyedProcessContext<'_, K, O>) {
        match value {
            Either::Left(value) => self.0.process_element1(value, ctx),
            Either::Right(value) => self.0.process_element2(value, ctx),
        }
    }

    fn on_timer(&mut self, timestamp: i64, ctx: &mut KeyedProcessContext<'_, K, O>) {
        self.0.on_timer(timestamp, ctx);
    }
}
