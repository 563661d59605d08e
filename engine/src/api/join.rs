//! Window joins and co-groups (Flink's `JoinedStreams` and `CoGroupedStreams`):
//! `a.join(b).where_key(ka).equal_to(kb).window(assigner).apply(f)`.
//!
//! Built as Flink builds them, on single-input parts: each input is tagged into an [`Either`],
//! the two tagged streams are unioned and keyed (the key selector dispatches to the selector of
//! the record's side), and an ordinary window operator with a full-window `process` function
//! holds both sides' records per key and window. When a window fires, the join function runs
//! on every (left, right) pair of the window (an inner join: a window with records of only one
//! side emits nothing); a co-group function gets both sides' records at once. Every window
//! assigner works — tumbling, sliding (a pair that shares several windows is joined in each),
//! sessions (both sides' records merge one key's sessions) — and so do `allowed_lateness` and
//! the late-record count of window operators. Output records carry the window's
//! `max_timestamp()` (`end - 1`), as in Flink. Event time is the minimum of both inputs'
//! watermarks.
//!
//! Cost per firing window: one pass over its records to split the sides, then
//! `lefts × rights` join calls.

use std::time::Duration;

use super::connected::{either_key, tag_and_union};
use super::either::Either;
use super::function::Collector;
use super::stream::DataStream;
use crate::record::{Key, Record};
use crate::state::StateValue;
use crate::window::{ProcessWindowFunction, WindowAssigner, WindowElements};

/// The function of a window join: one output record per (left, right) pair of a window
/// (Flink's `JoinFunction`). Closures work: `|l: &Order, r: &Payment| (l.id, r.amount)`.
pub trait JoinFunction<A, B, O>: Clone + Send + Sync + 'static {
    /// The output for one pair.
    fn join(&mut self, left: &A, right: &B) -> O;
}

impl<A, B, O, F> JoinFunction<A, B, O> for F
where
    F: FnMut(&A, &B) -> O + Clone + Send + Sync + 'static,
{
    fn join(&mut self, left: &A, right: &B) -> O {
        self(left, right)
    }
}

/// The function of a window join that emits any number of records per (left, right) pair
/// (Flink's `FlatJoinFunction`). Closures work:
/// `|l: &Order, r: &Payment, out: &mut Collector<'_, u64>| out.collect(r.amount)`.
pub trait FlatJoinFunction<A, B, O>: Clone + Send + Sync + 'static {
    /// Emits the output of one pair through `out`.
    fn join(&mut self, left: &A, right: &B, out: &mut Collector<'_, O>);
}

impl<A, B, O, F> FlatJoinFunction<A, B, O> for F
where
    F: FnMut(&A, &B, &mut Collector<'_, O>) + Clone + Send + Sync + 'static,
{
    fn join(&mut self, left: &A, right: &B, out: &mut Collector<'_, O>) {
        self(left, right, out)
    }
}

/// The function of a window co-group: per key and window, all records of both sides (either
/// may be empty, not both), in arrival order (Flink's `CoGroupFunction`, plus the key).
/// Closures work: `|key: &u32, lefts: &[Order], rights: &[Payment], out: &mut Collector<'_, u64>| ..`.
pub trait CoGroupFunction<K, A, B, O>: Clone + Send + Sync + 'static {
    /// Emits the output of one key's window through `out`.
    fn co_group(&mut self, key: &K, lefts: &[A], rights: &[B], out: &mut Collector<'_, O>);
}

impl<K, A, B, O, F> CoGroupFunction<K, A, B, O> for F
where
    F: FnMut(&K, &[A], &[B], &mut Collector<'_, O>) + Clone + Send + Sync + 'static,
{
    fn co_group(&mut self, key: &K, lefts: &[A], rights: &[B], out: &mut Collector<'_, O>) {
        self(key, lefts, rights, out)
    }
}

/// Two streams to join per key and window; made by [`DataStream::join`]. Next:
/// [`JoinedStreams::where_key`].
///
/// ```no_run
/// use std::time::Duration;
/// use weir_engine::prelude::*;
///
/// # fn job(orders: DataStream<(u32, i64)>, payments: DataStream<(u32, u64)>) {
/// orders
///     .join(payments)
///     .where_key(|o: &(u32, i64)| o.0)
///     .equal_to(|p: &(u32, u64)| p.0)
///     .window(TumblingEventTimeWindows::of(Duration::from_secs(60)))
///     .apply(|o: &(u32, i64), p: &(u32, u64)| (o.0, o.1, p.1))
///     .sink_to(PrintSink::new(), "paid orders");
/// # }
/// ```
pub struct JoinedStreams<A, B> {
    left: DataStream<A>,
    right: DataStream<B>,
}

/// A window join with its left key; made by [`JoinedStreams::where_key`]. Next:
/// [`JoinWhere::equal_to`].
pub struct JoinWhere<A, B, KA> {
    inputs: JoinedStreams<A, B>,
    left_key: KA,
}

/// A window join with both keys; made by [`JoinWhere::equal_to`]. Next:
/// [`JoinEqualTo::window`].
pub struct JoinEqualTo<A, B, KA, KB> {
    inputs: JoinedStreams<A, B>,
    left_key: KA,
    right_key: KB,
}

/// A window join ready for its function; made by [`JoinEqualTo::window`]. End it with
/// [`WindowedJoin::apply`] or [`WindowedJoin::flat_apply`].
pub struct WindowedJoin<A, B, KA, KB, W> {
    inputs: JoinedStreams<A, B>,
    left_key: KA,
    right_key: KB,
    assigner: W,
    allowed_lateness: Option<Duration>,
}

impl<A, B> std::fmt::Debug for JoinedStreams<A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinedStreams")
            .field("left", &self.left)
            .field("right", &self.right)
            .finish()
    }
}

impl<A, B, KA> std::fmt::Debug for JoinWhere<A, B, KA> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinWhere")
            .field("inputs", &self.inputs)
            .finish()
    }
}

impl<A, B, KA, KB> std::fmt::Debug for JoinEqualTo<A, B, KA, KB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinEqualTo")
            .field("inputs", &self.inputs)
            .finish()
    }
}

impl<A, B, KA, KB, W: std::fmt::Debug> std::fmt::Debug for WindowedJoin<A, B, KA, KB, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowedJoin")
            .field("inputs", &self.inputs)
            .field("assigner", &self.assigner)
            .field("allowed_lateness", &self.allowed_lateness)
            .finish()
    }
}

impl<T: Record> DataStream<T> {
    /// Joins this stream (the left side) with `other` (the right side) per key and window
    /// (Flink's `join`): `.where_key(..).equal_to(..).window(..).apply(..)`.
    pub fn join<B: Record>(self, other: DataStream<B>) -> JoinedStreams<T, B> {
        JoinedStreams {
            left: self,
            right: other,
        }
    }

    /// Groups this stream (the left side) and `other` (the right side) together per key and
    /// window (Flink's `coGroup`): `.where_key(..).equal_to(..).window(..).apply(..)`.
    pub fn co_group<B: Record>(self, other: DataStream<B>) -> CoGroupedStreams<T, B> {
        CoGroupedStreams {
            inputs: self.join(other),
        }
    }
}

impl<A: Record, B: Record> JoinedStreams<A, B> {
    /// The key of left records (Flink's `where`, a reserved word in Rust).
    pub fn where_key<K: Key, KA>(self, key: KA) -> JoinWhere<A, B, KA>
    where
        KA: Fn(&A) -> K + Clone + Send + Sync + 'static,
    {
        JoinWhere {
            inputs: self,
            left_key: key,
        }
    }
}

impl<A: Record, B: Record, KA> JoinWhere<A, B, KA> {
    /// The key of right records; a left and a right record join when their keys are equal.
    pub fn equal_to<K: Key, KB>(self, key: KB) -> JoinEqualTo<A, B, KA, KB>
    where
        KA: Fn(&A) -> K + Clone + Send + Sync + 'static,
        KB: Fn(&B) -> K + Clone + Send + Sync + 'static,
    {
        JoinEqualTo {
            inputs: self.inputs,
            left_key: self.left_key,
            right_key: key,
        }
    }
}

impl<A: Record, B: Record, KA, KB> JoinEqualTo<A, B, KA, KB> {
    /// The windows to join in: records of both sides are assigned to windows as in
    /// `KeyedStream::window` (the assigner sees them as [`Either`]s).
    pub fn window<W: WindowAssigner<Either<A, B>>>(
        self,
        assigner: W,
    ) -> WindowedJoin<A, B, KA, KB, W> {
        WindowedJoin {
            inputs: self.inputs,
            left_key: self.left_key,
            right_key: self.right_key,
            assigner,
            allowed_lateness: None,
        }
    }
}

/// Window contents may live in RocksDB (`state.backend.type: rocksdb`), so both sides'
/// records must be [`StateValue`]s (rkyv-archivable, as records are).
impl<A, B, KA, KB, W> WindowedJoin<A, B, KA, KB, W>
where
    A: Record + StateValue,
    B: Record + StateValue,
    W: WindowAssigner<Either<A, B>>,
{
    /// Keeps each window until the watermark passes its end by `lateness`; a late record in
    /// that time fires the window again — joining all its pairs again, as in Flink.
    pub fn allowed_lateness(mut self, lateness: Duration) -> Self {
        self.allowed_lateness = Some(lateness);
        self
    }

    /// Builds the job: tag, union, key, window, then `function` per firing window. The window
    /// operator is named `<what>(<assigner>)`.
    fn build<K, O, F>(self, what: &str, function: F) -> DataStream<O>
    where
        K: Key,
        KA: Fn(&A) -> K + Clone + Send + Sync + 'static,
        KB: Fn(&B) -> K + Clone + Send + Sync + 'static,
        O: Record,
        F: ProcessWindowFunction<K, W::Window, Either<A, B>, O>,
    {
        let name = format!("{what}({:?})", self.assigner);
        let mut windowed = tag_and_union(self.inputs.left, self.inputs.right, what)
            .key_by(either_key(self.left_key, self.right_key))
            .window(self.assigner);
        if let Some(lateness) = self.allowed_lateness {
            windowed = windowed.allowed_lateness(lateness);
        }
        windowed.process(function).name(&name)
    }

    /// Emits `function(left, right)` for every (left, right) pair of each key's window, stamped
    /// with the window's `max_timestamp()`. The operator is named `Window Join(<assigner>)`.
    pub fn apply<K, O, F>(self, function: F) -> DataStream<O>
    where
        K: Key,
        KA: Fn(&A) -> K + Clone + Send + Sync + 'static,
        KB: Fn(&B) -> K + Clone + Send + Sync + 'static,
        O: Record,
        F: JoinFunction<A, B, O>,
    {
        self.build("Window Join", JoinWindow(EachPair(function)))
    }

    /// Like [`WindowedJoin::apply`], with a function that emits any number of records per
    /// pair.
    pub fn flat_apply<K, O, F>(self, function: F) -> DataStream<O>
    where
        K: Key,
        KA: Fn(&A) -> K + Clone + Send + Sync + 'static,
        KB: Fn(&B) -> K + Clone + Send + Sync + 'static,
        O: Record,
        F: FlatJoinFunction<A, B, O>,
    {
        self.build("Window Join", JoinWindow(function))
    }
}

/// Two streams to group together per key and window; made by [`DataStream::co_group`]. The
/// same steps as a join: `where_key`, `equal_to`, `window`, then
/// [`WindowedCoGroup::apply`].
pub struct CoGroupedStreams<A, B> {
    inputs: JoinedStreams<A, B>,
}

/// A co-group with its left key; made by [`CoGroupedStreams::where_key`].
pub struct CoGroupWhere<A, B, KA> {
    inner: JoinWhere<A, B, KA>,
}

/// A co-group with both keys; made by [`CoGroupWhere::equal_to`].
pub struct CoGroupEqualTo<A, B, KA, KB> {
    inner: JoinEqualTo<A, B, KA, KB>,
}

/// A co-group ready for its function; made by [`CoGroupEqualTo::window`].
pub struct WindowedCoGroup<A, B, KA, KB, W> {
    inner: WindowedJoin<A, B, KA, KB, W>,
}

impl<A, B> std::fmt::Debug for CoGroupedStreams<A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CoGroupedStreams")
            .field(&self.inputs)
            .finish()
    }
}

impl<A, B, KA> std::fmt::Debug for CoGroupWhere<A, B, KA> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CoGroupWhere").field(&self.inner).finish()
    }
}

impl<A, B, KA, KB> std::fmt::Debug for CoGroupEqualTo<A, B, KA, KB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CoGroupEqualTo").field(&self.inner).finish()
    }
}

impl<A, B, KA, KB, W: std::fmt::Debug> std::fmt::Debug for WindowedCoGroup<A, B, KA, KB, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("WindowedCoGroup").field(&self.inner).finish()
    }
}

impl<A: Record, B: Record> CoGroupedStreams<A, B> {
    /// The key of left records (Flink's `where`, a reserved word in Rust).
    pub fn where_key<K: Key, KA>(self, key: KA) -> CoGroupWhere<A, B, KA>
    where
        KA: Fn(&A) -> K + Clone + Send + Sync + 'static,
    {
        CoGroupWhere {
            inner: self.inputs.where_key(key),
        }
    }
}

impl<A: Record, B: Record, KA> CoGroupWhere<A, B, KA> {
    /// The key of right records; records of both sides with equal keys are grouped together.
    pub fn equal_to<K: Key, KB>(self, key: KB) -> CoGroupEqualTo<A, B, KA, KB>
    where
        KA: Fn(&A) -> K + Clone + Send + Sync + 'static,
        KB: Fn(&B) -> K + Clone + Send + Sync + 'static,
    {
        CoGroupEqualTo {
            inner: self.inner.equal_to(key),
        }
    }
}

impl<A: Record, B: Record, KA, KB> CoGroupEqualTo<A, B, KA, KB> {
    /// The windows to group in (the assigner sees records as [`Either`]s).
    pub fn window<W: WindowAssigner<Either<A, B>>>(
        self,
        assigner: W,
    ) -> WindowedCoGroup<A, B, KA, KB, W> {
        WindowedCoGroup {
            inner: self.inner.window(assigner),
        }
    }
}

impl<A, B, KA, KB, W> WindowedCoGroup<A, B, KA, KB, W>
where
    A: Record + StateValue,
    B: Record + StateValue,
    W: WindowAssigner<Either<A, B>>,
{
    /// Keeps each window until the watermark passes its end by `lateness`; a late record in
    /// that time fires the window again.
    pub fn allowed_lateness(self, lateness: Duration) -> Self {
        WindowedCoGroup {
            inner: self.inner.allowed_lateness(lateness),
        }
    }

    /// Calls `function(key, lefts, rights, out)` once per key and firing window, with the
    /// records of each side (copies, in arrival order); output records carry the window's
    /// `max_timestamp()`. The operator is named `Window CoGroup(<assigner>)`.
    pub fn apply<K, O, F>(self, function: F) -> DataStream<O>
    where
        K: Key,
        KA: Fn(&A) -> K + Clone + Send + Sync + 'static,
        KB: Fn(&B) -> K + Clone + Send + Sync + 'static,
        O: Record,
        F: CoGroupFunction<K, A, B, O>,
    {
        self.inner.build("Window CoGroup", CoGroupWindow(function))
    }
}

/// A [`JoinFunction`] as a flat one: one output per pair.
#[derive(Clone)]
struct EachPair<F>(F);

impl<A, B, O, F: JoinFunction<A, B, O>> FlatJoinFunction<A, B, O> for EachPair<F> {
    #[inline]
    fn join(&mut self, left: &A, right: &B, out: &mut Collector<'_, O>) {
        out.collect(self.0.join(left, right));
    }
}

/// Splits a window's tagged records by side.
fn sides<'a, A, B>(elements: &WindowElements<'a, Either<A, B>>) -> (Vec<&'a A>, Vec<&'a B>) {
    let mut lefts = Vec::new();
    let mut rights = Vec::new();
    for record in elements.iter() {
        match record {
            Either::Left(left) => lefts.push(left),
            Either::Right(right) => rights.push(right),
        }
    }
    (lefts, rights)
}

/// The window function of a join: the flat join function on every pair of the window.
#[derive(Clone)]
struct JoinWindow<F>(F);

impl<K, W, A, B, O, F> ProcessWindowFunction<K, W, Either<A, B>, O> for JoinWindow<F>
where
    F: FlatJoinFunction<A, B, O>,
{
    fn process(
        &mut self,
        _key: &K,
        _window: &W,
        elements: WindowElements<'_, Either<A, B>>,
        out: &mut Collector<'_, O>,
    ) {
        let (lefts, rights) = sides(&elements);
        for left in &lefts {
            for right in &rights {
                self.0.join(left, right, out);
            }
        }
    }
}

/// The window function of a co-group: both sides' records, copied out of the window.
#[derive(Clone)]
struct CoGroupWindow<F>(F);

impl<K, W, A, B, O, F> ProcessWindowFunction<K, W, Either<A, B>, O> for CoGroupWindow<F>
where
    A: Clone,
    B: Clone,
    F: CoGroupFunction<K, A, B, O>,
{
    fn process(
        &mut self,
        key: &K,
        _window: &W,
        elements: WindowElements<'_, Either<A, B>>,
        out: &mut Collector<'_, O>,
    ) {
        let (lefts, rights) = sides(&elements);
        let lefts: Vec<A> = lefts.into_iter().cloned().collect();
        let rights: Vec<B> = rights.into_iter().cloned().collect();
        self.0.co_group(key, &lefts, &rights, out);
    }
}
