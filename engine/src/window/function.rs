//! Window functions: incremental (`reduce`, `aggregate`: one accumulator per pane or window)
//! and full (`process`: the window's records), behind one internal interface the window
//! operators drive.

use std::marker::PhantomData;

use weir_state::{
    ListState, ListStateDescriptor, LocalKeyedBackend, StateCodec, StateError, StateValue,
    ValueState, ValueStateDescriptor,
};

use super::checkpoint::{decode_entry, AccCodec, Entries, Layout, CONTENTS};

use crate::api::Collector;
use crate::checkpoint::task_state::PART_OWN_KEYED;
use crate::operator::{Batch, RuntimeContext};
use crate::record::Key;

/// An incremental aggregation (Flink's `AggregateFunction`): records are folded into an
/// accumulator as they arrive; the window's result is computed from it when the window fires.
/// One trait with keyed state's `AggregatingStateDescriptor`; windows also need `Clone` (one
/// copy per subtask).
pub use weir_state::AggregateFunction;

/// The records of a firing window, in arrival order per pane (a tumbling window has one pane,
/// a sliding window `size / gcd(size, slide)`). Iterating does not copy them.
pub struct WindowElements<'a, T> {
    panes: &'a [&'a Vec<T>],
}

impl<'a, T> WindowElements<'a, T> {
    /// Iterates over the window's records.
    pub fn iter(&self) -> impl Iterator<Item = &'a T> + 'a {
        self.panes.iter().flat_map(|pane| pane.iter())
    }

    /// Number of records in the window.
    pub fn len(&self) -> usize {
        self.panes.iter().map(|pane| pane.len()).sum()
    }

    /// Whether the window has no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A function over all records of a window (Flink's `ProcessWindowFunction`), with the key and
/// the window. Closures work: `|key: &u32, window: &TimeWindow, elements: WindowElements<'_, Event>,
/// out: &mut Collector<'_, Summary>| ...`.
pub trait ProcessWindowFunction<K, W, IN, OUT>: Clone + Send + Sync + 'static {
    /// Emits the window's output through `out`.
    fn process(
        &mut self,
        key: &K,
        window: &W,
        elements: WindowElements<'_, IN>,
        out: &mut Collector<'_, OUT>,
    );
}

impl<K, W, IN, OUT, F> ProcessWindowFunction<K, W, IN, OUT> for F
where
    F: FnMut(&K, &W, WindowElements<'_, IN>, &mut Collector<'_, OUT>)
        + Clone
        + Send
        + Sync
        + 'static,
{
    fn process(
        &mut self,
        key: &K,
        window: &W,
        elements: WindowElements<'_, IN>,
        out: &mut Collector<'_, OUT>,
    ) {
        self(key, window, elements, out)
    }
}

/// What a window operator needs from a window function: an accumulator per pane or window,
/// and the window's output from the accumulators of its panes.
pub(crate) trait WindowLogic<K, W, T, O>: 'static {
    type Acc: 'static;
    /// A new accumulator for a pane or window of `key`.
    fn create(&self, key: &K) -> Self::Acc;
    /// How many input records `value` stands for (a partial aggregate holds several): what a
    /// late `value` adds to the dropped-records count.
    fn weight(&self, _value: &T) -> u64 {
        1
    }
    fn add(&mut self, acc: &mut Self::Acc, value: T);
    /// Folds `from` into `into`, consuming it (merging sessions).
    fn merge_owned(&mut self, into: &mut Self::Acc, from: Self::Acc);
    /// Emits the output of a window whose panes hold `panes` (oldest first, at least one),
    /// stamped `timestamp`.
    fn fire(
        &mut self,
        key: &K,
        window: &W,
        panes: &[&Self::Acc],
        timestamp: i64,
        out: &mut Batch<O>,
    );
    /// How the canonical layout writes an accumulator: its contents, wherever they live
    /// (`checkpoint.rs`).
    fn acc_codec(&self) -> AccCodec<Self::Acc>;
    /// With the contents in the state backend: how a checkpoint writes what stands for them,
    /// beside the backend's own checkpoint of the contents
    /// ([`WindowLogic::snapshot_contents`]).
    fn stored_codec(&self) -> Option<AccCodec<Self::Acc>> {
        None
    }
    /// Adds the contents kept in the state backend to a checkpoint.
    fn snapshot_contents(
        &self,
        _snapshot: &mut crate::checkpoint::task_state::OperatorSnapshot,
    ) -> Result<(), StateError> {
        Ok(())
    }
    /// How a savepoint, or else a checkpoint, writes the windows: a savepoint always in the
    /// canonical layout, restorable on either backend.
    fn layout(&self, savepoint: bool) -> Layout<Self::Acc> {
        Layout::of(self.stored_codec().filter(|_| !savepoint), self.acc_codec())
    }
    /// How the checkpoint the job resumes from holds the windows: beside the state backend's
    /// own checkpoint when it has the operator's `own-keyed` part, else in the canonical
    /// layout (a savepoint, or a heap checkpoint), whichever backend wrote it.
    fn restored_layout(&self, ctx: &RuntimeContext) -> Layout<Self::Acc> {
        let native = ctx.with_restored_of_all(PART_OWN_KEYED, |parts| !parts.is_empty());
        Layout::of(self.stored_codec().filter(|_| native), self.acc_codec())
    }
}

/// `reduce(f)`, optionally followed by `post(key, window, reduced)`.
#[derive(Clone)]
pub(crate) struct ReduceLogic<F, P> {
    pub(crate) reduce: F,
    pub(crate) post: P,
}

impl<F, P> ReduceLogic<F, P> {
    fn fold<T: Clone>(reduce: &mut F, into: &mut Option<T>, value: T)
    where
        F: FnMut(T, T) -> T,
    {
        *into = Some(match into.take() {
            Some(acc) => reduce(acc, value),
            None => value,
        });
    }
}

impl<K, W, T, O, F, P> WindowLogic<K, W, T, O> for ReduceLogic<F, P>
where
    T: Clone + StateCodec,
    F: FnMut(T, T) -> T + 'static,
    P: FnMut(&K, &W, T) -> O + 'static,
{
    type Acc = Option<T>;

    fn create(&self, _: &K) -> Option<T> {
        None
    }

    #[inline]
    fn add(&mut self, acc: &mut Option<T>, value: T) {
        Self::fold(&mut self.reduce, acc, value);
    }

    fn merge_owned(&mut self, into: &mut Option<T>, from: Option<T>) {
        if let Some(value) = from {
            Self::fold(&mut self.reduce, into, value);
        }
    }

    fn fire(
        &mut self,
        key: &K,
        window: &W,
        panes: &[&Option<T>],
        timestamp: i64,
        out: &mut Batch<O>,
    ) {
        let mut result: Option<T> = None;
        for value in panes.iter().filter_map(|pane| pane.as_ref()) {
            Self::fold(&mut self.reduce, &mut result, value.clone());
        }
        if let Some(result) = result {
            out.push((self.post)(key, window, result), timestamp);
        }
    }

    fn acc_codec(&self) -> AccCodec<Option<T>> {
        AccCodec::optional()
    }
}

/// `aggregate(f)`, optionally followed by `post(key, window, result)`.
pub(crate) struct AggregateLogic<A, ACC, R, P> {
    pub(crate) aggregate: A,
    pub(crate) post: P,
    pub(crate) _types: PhantomData<fn(ACC) -> R>,
}

impl<A: Clone, ACC, R, P: Clone> Clone for AggregateLogic<A, ACC, R, P> {
    fn clone(&self) -> Self {
        AggregateLogic {
            aggregate: self.aggregate.clone(),
            post: self.post.clone(),
            _types: PhantomData,
        }
    }
}

impl<K, W, T, ACC, R, O, A, P> WindowLogic<K, W, T, O> for AggregateLogic<A, ACC, R, P>
where
    ACC: StateCodec,
    R: 'static,
    A: AggregateFunction<T, ACC, R> + Clone,
    P: FnMut(&K, &W, R) -> O + 'static,
{
    type Acc = ACC;

    fn create(&self, _: &K) -> ACC {
        self.aggregate.create_accumulator()
    }

    #[inline]
    fn add(&mut self, acc: &mut ACC, value: T) {
        self.aggregate.add(value, acc);
    }

    fn merge_owned(&mut self, into: &mut ACC, from: ACC) {
        self.aggregate.merge(into, &from);
    }

    fn fire(&mut self, key: &K, window: &W, panes: &[&ACC], timestamp: i64, out: &mut Batch<O>) {
        let result = match panes {
            [single] => self.aggregate.get_result(single),
            _ => {
                let mut merged = self.aggregate.create_accumulator();
                for pane in panes {
                    self.aggregate.merge(&mut merged, pane);
                }
                self.aggregate.get_result(&merged)
            }
        };
        out.push((self.post)(key, window, result), timestamp);
    }

    fn acc_codec(&self) -> AccCodec<ACC> {
        AccCodec::value()
    }
}

/// `process(f)`: keeps the records, hands them all to `f` when the window fires.
#[derive(Clone)]
pub(crate) struct ProcessLogic<F> {
    pub(crate) function: F,
}

impl<K, W, T, O, F> WindowLogic<K, W, T, O> for ProcessLogic<F>
where
    T: StateCodec,
    F: ProcessWindowFunction<K, W, T, O>,
{
    type Acc = Vec<T>;

    fn create(&self, _: &K) -> Vec<T> {
        Vec::new()
    }

    #[inline]
    fn add(&mut self, acc: &mut Vec<T>, value: T) {
        acc.push(value);
    }

    fn merge_owned(&mut self, into: &mut Vec<T>, mut from: Vec<T>) {
        into.append(&mut from);
    }

    fn fire(&mut self, key: &K, window: &W, panes: &[&Vec<T>], timestamp: i64, out: &mut Batch<O>) {
        self.function.process(
            key,
            window,
            WindowElements { panes },
            &mut Collector { out, timestamp },
        );
    }

    fn acc_codec(&self) -> AccCodec<Vec<T>> {
        AccCodec::list()
    }
}

/// How a window function keeps a pane's (or session's) contents in a state backend, for the
/// window operators' RocksDB path (`stored.rs`): the namespace is the pane, and the backend's
/// current key and namespace are set by the caller. Incremental functions keep their
/// accumulator (read-modify-write per record); `process` appends records to a list (RocksDB's
/// merge operator: no read per record).
pub(crate) trait StoredLogic<K, W, T, O>: WindowLogic<K, W, T, O> {
    /// The state handle the contents live in.
    type Contents: Contents;
    /// Registers the contents' state with an operator subtask's backend.
    fn register(backend: &LocalKeyedBackend<K, u64>) -> Result<Self::Contents, StateError>;
    /// Folds `value` into the current pane's contents.
    fn add_stored(&mut self, contents: &Self::Contents, value: T) -> Result<(), StateError>;
    /// [`StoredLogic::add_stored`] into a pane numbered just now, whose contents the backend
    /// has never held: what needs no read first writes them with
    /// [`ValueState::insert_new`].
    fn add_new(&mut self, contents: &Self::Contents, value: T) -> Result<(), StateError> {
        self.add_stored(contents, value)
    }
    /// The current pane's contents as an accumulator.
    fn load(&mut self, contents: &Self::Contents) -> Result<Self::Acc, StateError>;
    /// Folds `from` (another pane's loaded contents) into the current pane's.
    fn merge_stored(
        &mut self,
        contents: &Self::Contents,
        from: Self::Acc,
    ) -> Result<(), StateError>;
    /// [`StoredLogic::merge_stored`] into a pane numbered just now (see
    /// [`StoredLogic::add_new`]).
    fn merge_new(&mut self, contents: &Self::Contents, from: Self::Acc) -> Result<(), StateError> {
        self.merge_stored(contents, from)
    }
}

/// A state handle holding window contents: what a pane's clean-up and the canonical layout
/// need of it. The current pane's contents are the entries the heap's accumulator of the same
/// window function is written as (a reduced value or an accumulator, or a list of records),
/// encoded alike.
pub(crate) trait Contents: 'static {
    /// Removes the current pane's contents.
    fn clear(&self) -> Result<(), StateError>;
    /// Puts each entry of the current pane's contents.
    fn encode_entries(&self, entries: &mut Entries<'_>) -> Result<(), StateError>;
    /// Adds one checkpointed entry to the current pane's contents.
    fn put_entry(&self, bytes: &[u8]) -> Result<(), StateError>;
    /// Hints that the current pane's contents are loaded soon (see [`ValueState::prefetch`]).
    fn prefetch(&self);
}

impl<T: StateValue> Contents for ValueState<T> {
    fn clear(&self) -> Result<(), StateError> {
        ValueState::clear(self)
    }

    fn encode_entries(&self, entries: &mut Entries<'_>) -> Result<(), StateError> {
        match self.value()? {
            Some(value) => entries.put(|out| value.encode_into(out)),
            None => Ok(()),
        }
    }

    fn put_entry(&self, bytes: &[u8]) -> Result<(), StateError> {
        self.update(decode_entry(bytes)?)
    }

    fn prefetch(&self) {
        ValueState::prefetch(self)
    }
}

impl<T: StateValue> Contents for ListState<T> {
    fn clear(&self) -> Result<(), StateError> {
        ListState::clear(self)
    }

    fn encode_entries(&self, entries: &mut Entries<'_>) -> Result<(), StateError> {
        self.get()?
            .iter()
            .try_for_each(|value| entries.put(|out| value.encode_into(out)))
    }

    fn put_entry(&self, bytes: &[u8]) -> Result<(), StateError> {
        self.add(decode_entry(bytes)?)
    }

    /// Lists are read from RocksDB itself (a list is never in the write-back cache), whose
    /// lookups hold no table to prefetch.
    fn prefetch(&self) {}
}

impl<K, W, T, O, F, P> StoredLogic<K, W, T, O> for ReduceLogic<F, P>
where
    K: Key,
    T: StateValue,
    F: FnMut(T, T) -> T + 'static,
    P: FnMut(&K, &W, T) -> O + 'static,
{
    type Contents = ValueState<T>;

    fn register(backend: &LocalKeyedBackend<K, u64>) -> Result<ValueState<T>, StateError> {
        backend.value_state(&ValueStateDescriptor::new(CONTENTS))
    }

    fn add_stored(&mut self, contents: &ValueState<T>, value: T) -> Result<(), StateError> {
        let mut acc = contents.value()?;
        Self::fold(&mut self.reduce, &mut acc, value);
        contents.update(acc.expect("folded"))
    }

    /// The first value is the reduced value.
    fn add_new(&mut self, contents: &ValueState<T>, value: T) -> Result<(), StateError> {
        contents.insert_new(value)
    }

    fn load(&mut self, contents: &ValueState<T>) -> Result<Option<T>, StateError> {
        contents.value()
    }

    fn merge_stored(
        &mut self,
        contents: &ValueState<T>,
        from: Option<T>,
    ) -> Result<(), StateError> {
        match from {
            Some(value) => self.add_stored(contents, value),
            None => Ok(()),
        }
    }

    fn merge_new(&mut self, contents: &ValueState<T>, from: Option<T>) -> Result<(), StateError> {
        match from {
            Some(value) => contents.insert_new(value),
            None => Ok(()),
        }
    }
}

impl<K, W, T, ACC, R, O, A, P> StoredLogic<K, W, T, O> for AggregateLogic<A, ACC, R, P>
where
    K: Key,
    ACC: StateValue,
    R: 'static,
    A: AggregateFunction<T, ACC, R> + Clone,
    P: FnMut(&K, &W, R) -> O + 'static,
{
    type Contents = ValueState<ACC>;

    fn register(backend: &LocalKeyedBackend<K, u64>) -> Result<ValueState<ACC>, StateError> {
        backend.value_state(&ValueStateDescriptor::new(CONTENTS))
    }

    /// One read-modify-write of the stored accumulator (`ValueState::update_or_init`).
    fn add_stored(&mut self, contents: &ValueState<ACC>, value: T) -> Result<(), StateError> {
        let aggregate = &self.aggregate;
        contents.update_or_init(
            || aggregate.create_accumulator(),
            |acc| aggregate.add(value, acc),
        )
    }

    fn load(&mut self, contents: &ValueState<ACC>) -> Result<ACC, StateError> {
        Ok(contents
            .value()?
            .unwrap_or_else(|| self.aggregate.create_accumulator()))
    }

    fn merge_stored(&mut self, contents: &ValueState<ACC>, from: ACC) -> Result<(), StateError> {
        let aggregate = &self.aggregate;
        contents.update_or_init(
            || aggregate.create_accumulator(),
            |acc| aggregate.merge(acc, &from),
        )
    }

    /// `add_stored` starting from a fresh accumulator, as `update_or_init` does for a pane
    /// without contents.
    fn add_new(&mut self, contents: &ValueState<ACC>, value: T) -> Result<(), StateError> {
        let mut acc = self.aggregate.create_accumulator();
        self.aggregate.add(value, &mut acc);
        contents.insert_new(acc)
    }

    fn merge_new(&mut self, contents: &ValueState<ACC>, from: ACC) -> Result<(), StateError> {
        let mut acc = self.aggregate.create_accumulator();
        self.aggregate.merge(&mut acc, &from);
        contents.insert_new(acc)
    }
}

impl<K, W, T, O, F> StoredLogic<K, W, T, O> for ProcessLogic<F>
where
    K: Key,
    T: StateValue,
    F: ProcessWindowFunction<K, W, T, O>,
{
    type Contents = ListState<T>;

    fn register(backend: &LocalKeyedBackend<K, u64>) -> Result<ListState<T>, StateError> {
        backend.list_state(&ListStateDescriptor::new(CONTENTS))
    }

    fn add_stored(&mut self, contents: &ListState<T>, value: T) -> Result<(), StateError> {
        contents.add(value)
    }

    fn load(&mut self, contents: &ListState<T>) -> Result<Vec<T>, StateError> {
        contents.get()
    }

    fn merge_stored(&mut self, contents: &ListState<T>, from: Vec<T>) -> Result<(), StateError> {
        contents.add_all(from)
    }
}
