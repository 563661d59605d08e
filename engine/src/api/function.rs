//! User function traits and the contexts they receive.

use crate::operator::RuntimeContext;

/// Where a `flat_map` function puts its output records.
pub struct Collector<'a, T> {
    pub(crate) out: &'a mut Vec<T>,
}

impl<T> Collector<'_, T> {
    /// Emits one record.
    #[inline]
    pub fn collect(&mut self, record: T) {
        self.out.push(record);
    }
}

/// The context of a [`ProcessFunction`] call.
pub struct ProcessContext<'a, O> {
    pub(crate) out: &'a mut Vec<O>,
    pub(crate) runtime: &'a RuntimeContext,
}

impl<O> ProcessContext<'_, O> {
    /// Emits one record.
    #[inline]
    pub fn emit(&mut self, record: O) {
        self.out.push(record);
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

/// The context of a [`KeyedProcessFunction`] call.
pub struct KeyedProcessContext<'a, K, O> {
    pub(crate) key: &'a K,
    pub(crate) out: &'a mut Vec<O>,
    pub(crate) runtime: &'a RuntimeContext,
}

impl<K, O> KeyedProcessContext<'_, K, O> {
    /// The key of the record being processed.
    #[inline]
    pub fn current_key(&self) -> &K {
        self.key
    }

    /// Emits one record.
    #[inline]
    pub fn emit(&mut self, record: O) {
        self.out.push(record);
    }

    /// The subtask this call runs in.
    pub fn runtime(&self) -> &RuntimeContext {
        self.runtime
    }
}

/// A function over each record of a keyed stream; sees the record's key. Every record of a key
/// reaches the same subtask (and so the same instance).
///
/// Closures work too: `|x: Event, ctx: &mut KeyedProcessContext<'_, u32, u64>| ...`.
pub trait KeyedProcessFunction<K, I, O>: Clone + Send + Sync + 'static {
    /// Called once per subtask before the first record.
    fn open(&mut self, _ctx: &RuntimeContext) {}
    /// Handles one record.
    fn process_element(&mut self, value: I, ctx: &mut KeyedProcessContext<'_, K, O>);
}

impl<K, I, O, F> KeyedProcessFunction<K, I, O> for F
where
    F: FnMut(I, &mut KeyedProcessContext<'_, K, O>) + Clone + Send + Sync + 'static,
{
    fn process_element(&mut self, value: I, ctx: &mut KeyedProcessContext<'_, K, O>) {
        self(value, ctx)
    }
}
