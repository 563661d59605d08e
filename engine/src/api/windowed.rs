//! `WindowedStream`: a keyed stream cut into windows, and the window functions that end it
//! (`reduce`, `aggregate`, `process`).

use std::marker::PhantomData;
use std::time::Duration;

use super::keyed::KeyedStream;
use super::stream::DataStream;
use crate::operator::OutputTag;
use crate::record::{Key, Record};
use crate::state::StateValue;
use crate::window::function::{AggregateLogic, ProcessLogic, ReduceLogic, StoredLogic};
use std::sync::Arc;

use crate::config::AggPhaseStrategy;
use crate::graph::OperatorFactory;
use crate::runtime::factories::OperatorNode;
use crate::time::TimeDomain;
use crate::window::aligned::Geometry;
use crate::window::assigner::{factory_of_spec, SessionGap, WindowAs, WindowSpec};
use crate::window::two_phase::{
    partial_key, partial_length, LocalSessionAggregate, LocalWindowAggregate, MergeLogic, Partial,
};
use crate::window::{
    AggregateFunction, GlobalWindows, ProcessWindowFunction, TimeWindow, WindowAssigner,
    WindowParts,
};

/// Groups (keys and panes, or partial sessions) a local pre-aggregation holds, per record of
/// `execution.batch-size`, before it emits them all (it also emits at every watermark, buffer
/// timeout and the end of input).
const LOCAL_GROUPS_PER_BATCH: usize = 16;

/// A keyed stream with a window assigner (Flink's `WindowedStream`). End it with a window
/// function; set lateness and the late-data side output first.
///
/// What the windows hold — accumulators, or the records for `process` — lives on the heap, or
/// with `state.backend.type: rocksdb` in the slot's RocksDB (keyed by key and pane), so
/// accumulators and records must be [`StateValue`]s (rkyv-archivable, as records are).
///
/// ```no_run
/// use std::time::Duration;
/// use weir_engine::prelude::*;
/// use weir_engine::window::TumblingEventTimeWindows;
///
/// # fn job(events: DataStream<(String, u64)>) {
/// let late = OutputTag::<(String, u64)>::new("late");
/// let counts = events
///     .key_by(|e: &(String, u64)| e.0.clone())
///     .window(TumblingEventTimeWindows::of(Duration::from_secs(10)))
///     .allowed_lateness(Duration::from_secs(5))
///     .side_output_late_data(&late)
///     .reduce(|a, b| (a.0, a.1 + b.1));
/// counts.get_side_output(&late).sink_to(PrintSink::new(), "late");
/// # }
/// ```
pub struct WindowedStream<T, K, KS, A> {
    keyed: KeyedStream<T, K, KS>,
    assigner: A,
    allowed_lateness: i64,
    late_tag: Option<OutputTag<T>>,
    /// `window_all`: the window operator runs as one subtask.
    all: bool,
    _key: PhantomData<fn() -> K>,
}

impl<T, K, KS, A: std::fmt::Debug> std::fmt::Debug for WindowedStream<T, K, KS, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowedStream")
            .field("assigner", &self.assigner)
            .field("allowed_lateness", &self.allowed_lateness)
            .finish()
    }
}

impl<T, K, KS, A> WindowedStream<T, K, KS, A>
where
    T: Record,
    K: Key,
    KS: Fn(&T) -> K + Clone + Send + Sync + 'static,
    A: WindowAssigner<T>,
{
    pub(crate) fn new(keyed: KeyedStream<T, K, KS>, assigner: A, all: bool) -> Self {
        WindowedStream {
            keyed,
            assigner,
            allowed_lateness: 0,
            late_tag: None,
            all,
            _key: PhantomData,
        }
    }

    /// Keeps each window's state until the watermark passes its end by `lateness`: a record
    /// arriving in that time is added and the window fires again. Event-time windows only
    /// (processing time is never late). Default: 0.
    pub fn allowed_lateness(mut self, lateness: Duration) -> Self {
        self.allowed_lateness = lateness.as_millis().min(i64::MAX as u128 / 2) as i64;
        self
    }

    /// Records later than the allowed lateness go to the side output `tag` (read it with
    /// `get_side_output` on the window's result) instead of being dropped and counted.
    pub fn side_output_late_data(mut self, tag: &OutputTag<T>) -> Self {
        self.late_tag = Some(tag.clone());
        self
    }

    fn name(&self, function: &str) -> String {
        format!(
            "{}({:?}, {function})",
            if self.all { "Window All" } else { "Window" },
            self.assigner
        )
    }

    fn build<O: Record, L>(self, function: &str, logic: L) -> DataStream<O>
    where
        L: StoredLogic<K, A::Window, T, O> + Clone + Send + Sync,
    {
        let name = self.name(function);
        let parts = WindowParts {
            key_selector: self.keyed.key_selector(),
            allowed_lateness: self.allowed_lateness,
            late_tag: self.late_tag,
        };
        let factory = self.assigner.factory(parts, logic);
        window_node(self.keyed, self.all, &name, factory)
    }

    /// `aggregate`: in two phases where that cannot change the result (tumbling or sliding
    /// windows, event-time session windows, no allowed lateness, no late-data side output, and
    /// `table.optimizer.agg-phase-strategy` asks for it; see `window::two_phase`), else
    /// in one.
    fn build_aggregate<O: Record, L>(self, logic: L) -> DataStream<O>
    where
        L: StoredLogic<K, A::Window, T, O> + Clone + Send + Sync,
        L::Acc: StateValue + Send,
    {
        let wanted = match self.keyed.config().agg_phase_strategy() {
            AggPhaseStrategy::OnePhase => false,
            AggPhaseStrategy::TwoPhase => true,
            AggPhaseStrategy::Auto => {
                let consumer = if self.all {
                    1
                } else {
                    self.keyed.default_parallelism()
                };
                self.keyed.may_cross_shards(consumer)
            }
        };
        let two_phase = wanted && self.late_tag.is_none() && self.allowed_lateness == 0;
        if !two_phase {
            return self.build("Aggregate", logic);
        }
        let name = self.name("Aggregate");
        let WindowedStream {
            keyed,
            assigner,
            all,
            ..
        } = self;
        let key_selector = keyed.key_selector();
        let limit = LOCAL_GROUPS_PER_BATCH * keyed.config().batch_size();
        // A processing-time local phase hands its partials on at the buffer timeout's flush;
        // with no timeout (a send per record) nothing would bound how long it holds them.
        let timed_flush = !keyed.config().buffer_timeout().is_zero();
        // Both phases run the function written for the assigner's windows on time windows
        // (the same type for these specs; `WindowAs` checks it).
        let time_logic = |logic: L| WindowAs::<TimeWindow, L, A::Window>::new(logic);
        let (local, global_spec, logic) = match assigner.spec() {
            WindowSpec::Aligned {
                size,
                slide,
                offset,
                domain,
            } if domain == TimeDomain::EventTime || timed_flush => {
                let geometry = Geometry::new(size, slide, offset);
                let logic = time_logic(logic);
                let local_logic = logic.clone();
                let local = OperatorNode::<T, Partial<K, L::Acc>, _>::new(move || {
                    LocalWindowAggregate::new(
                        key_selector.clone(),
                        local_logic.clone(),
                        geometry,
                        domain,
                        limit,
                    )
                });
                let global = WindowSpec::Aligned {
                    size,
                    slide,
                    offset,
                    domain,
                };
                (Arc::new(local) as Arc<dyn OperatorFactory>, global, logic)
            }
            WindowSpec::Session {
                gap,
                domain: TimeDomain::EventTime,
            } => {
                let logic = time_logic(logic);
                let local_logic = logic.clone();
                let local = OperatorNode::<T, Partial<K, L::Acc>, _>::new(move || {
                    LocalSessionAggregate::new(
                        key_selector.clone(),
                        local_logic.clone(),
                        gap.clone(),
                        limit,
                    )
                });
                // A partial session's window is its own `[start, end)`.
                let global = WindowSpec::Session {
                    gap: SessionGap::Dynamic(Arc::new(partial_length::<K, L::Acc>)),
                    domain: TimeDomain::EventTime,
                };
                (Arc::new(local) as Arc<dyn OperatorFactory>, global, logic)
            }
            spec => {
                let parts = WindowParts {
                    key_selector,
                    allowed_lateness: 0,
                    late_tag: None,
                };
                let factory = factory_of_spec::<T, K, KS, O, L, A::Window>(spec, parts, logic);
                return window_node(keyed, all, &name, factory);
            }
        };
        let key_of = partial_key::<K, L::Acc> as fn(&Partial<K, L::Acc>) -> K;
        let parts = WindowParts {
            key_selector: key_of,
            allowed_lateness: 0,
            late_tag: None,
        };
        let global = factory_of_spec::<_, K, _, O, _, TimeWindow>(
            global_spec,
            parts,
            MergeLogic::<_, T>::new(logic),
        );
        let partials: DataStream<Partial<K, L::Acc>> = keyed
            .into_unkeyed()
            .then_beside(&format!("Local {name}"), local);
        window_node(partials.key_by(key_of), all, &name, global)
    }

    /// Folds each window's records with `f` (incrementally: one value per window, or per pane
    /// of a sliding window) and emits the result when the window fires.
    pub fn reduce<F>(self, f: F) -> DataStream<T>
    where
        T: StateValue,
        F: FnMut(T, T) -> T + Clone + Send + Sync + 'static,
    {
        let post = |_: &K, _: &A::Window, value: T| value;
        self.build("Reduce", ReduceLogic { reduce: f, post })
    }

    /// Like `reduce`, then `post(key, window, reduced)` makes the output (Flink's reduce with a
    /// window function: incremental, yet the output can name its key and window).
    pub fn reduce_with<O: Record, F, P>(self, f: F, post: P) -> DataStream<O>
    where
        T: StateValue,
        F: FnMut(T, T) -> T + Clone + Send + Sync + 'static,
        P: FnMut(&K, &A::Window, T) -> O + Clone + Send + Sync + 'static,
    {
        self.build("Reduce", ReduceLogic { reduce: f, post })
    }

    /// Aggregates each window incrementally with `aggregate` (one accumulator per window, or
    /// per pane of a sliding window, merged when the window fires).
    pub fn aggregate<ACC, R, F>(self, aggregate: F) -> DataStream<R>
    where
        ACC: StateValue + Send,
        R: Record,
        F: AggregateFunction<T, ACC, R> + Clone,
    {
        let post = |_: &K, _: &A::Window, result: R| result;
        self.build_aggregate(AggregateLogic {
            aggregate,
            post,
            _types: PhantomData,
        })
    }

    /// Like `aggregate`, then `post(key, window, result)` makes the output.
    pub fn aggregate_with<ACC, R, O, F, P>(self, aggregate: F, post: P) -> DataStream<O>
    where
        ACC: StateValue + Send,
        R: 'static,
        O: Record,
        F: AggregateFunction<T, ACC, R> + Clone,
        P: FnMut(&K, &A::Window, R) -> O + Clone + Send + Sync + 'static,
    {
        self.build_aggregate(AggregateLogic {
            aggregate,
            post,
            _types: PhantomData,
        })
    }

    /// Hands each firing window's records (all of them, in arrival order per pane) to `f` with
    /// the key and the window.
    pub fn process<O: Record, F>(self, f: F) -> DataStream<O>
    where
        T: StateValue,
        F: ProcessWindowFunction<K, A::Window, T, O>,
    {
        self.build("Process", ProcessLogic { function: f })
    }
}

/// The window operator `factory` makes, after `keyed`; one subtask for `window_all`.
fn window_node<I, K, S, O>(
    keyed: KeyedStream<I, K, S>,
    all: bool,
    name: &str,
    factory: Arc<dyn OperatorFactory>,
) -> DataStream<O>
where
    I: Record,
    K: Key,
    S: Fn(&I) -> K + Clone + Send + Sync + 'static,
    O: Record,
{
    let stream = keyed.then(name, factory);
    if all {
        stream.parallelism(1)
    } else {
        stream
    }
}

impl<T, K, KS> KeyedStream<T, K, KS>
where
    T: Record,
    K: Key,
    KS: Fn(&T) -> K + Clone + Send + Sync + 'static,
{
    /// Cuts each key's records into the windows `assigner` gives them.
    pub fn window<A: WindowAssigner<T>>(self, assigner: A) -> WindowedStream<T, K, KS, A> {
        WindowedStream::new(self, assigner, false)
    }

    /// Windows of `count` records per key: each fires when full, then starts over.
    pub fn count_window(self, count: u64) -> WindowedStream<T, K, KS, GlobalWindows> {
        self.window(GlobalWindows::with_count_trigger(count))
    }
}

impl<T: Record> DataStream<T> {
    /// Windows over the whole stream, not per key (Flink's `windowAll`): the window operator
    /// runs as a single subtask.
    #[allow(clippy::type_complexity)]
    pub fn window_all<A: WindowAssigner<T>>(self, assigner: A) -> WindowedStream<T, (), fn(&T), A> {
        WindowedStream::new(self.key_by(unit_key::<T> as fn(&T)), assigner, true)
    }
}

/// The key of `window_all`: every record has the same one.
fn unit_key<T>(_: &T) {}
