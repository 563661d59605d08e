//! Window functions: incremental (`reduce`, `aggregate`: one accumulator per pane or window)
//! and full (`process`: the window's records), behind one internal interface the window
//! operators drive.

use std::marker::PhantomData;

use crate::api::Collector;
use crate::operator::Batch;

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
    fn create(&self) -> Self::Acc;
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
    T: Clone + 'static,
    F: FnMut(T, T) -> T + 'static,
    P: FnMut(&K, &W, T) -> O + 'static,
{
    type Acc = Option<T>;

    fn create(&self) -> Option<T> {
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
    ACC: 'static,
    R: 'static,
    A: AggregateFunction<T, ACC, R> + Clone,
    P: FnMut(&K, &W, R) -> O + 'static,
{
    type Acc = ACC;

    fn create(&self) -> ACC {
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
}

/// `process(f)`: keeps the records, hands them all to `f` when the window fires.
#[derive(Clone)]
pub(crate) struct ProcessLogic<F> {
    pub(crate) function: F,
}

impl<K, W, T, O, F> WindowLogic<K, W, T, O> for ProcessLogic<F>
where
    T: 'static,
    F: ProcessWindowFunction<K, W, T, O>,
{
    type Acc = Vec<T>;

    fn create(&self) -> Vec<T> {
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
}
