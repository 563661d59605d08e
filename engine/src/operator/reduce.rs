//! Running `reduce` on a keyed stream: folds each record into its key's value, kept in keyed
//! state (heap or RocksDB, as `state.backend.type` says), and emits the new value.

use std::rc::Rc;

use super::{Emitter, Operator, RuntimeContext};
use crate::checkpoint::task_state::OperatorSnapshot;
use crate::record::Key;
use crate::state::{KeyedStateStore, StateValue, ValueStateDescriptor};

/// The state's name, as Flink's `StreamGroupedReduceOperator` calls it.
const STATE_NAME: &str = "_op_state";

pub(crate) struct ReduceOperator<K, T, KS, F> {
    key_selector: KS,
    reduce: F,
    descriptor: ValueStateDescriptor<T>,
    state: Option<Rc<KeyedStateStore<K>>>,
}

impl<K, T: 'static, KS, F> ReduceOperator<K, T, KS, F> {
    pub(crate) fn new(key_selector: KS, reduce: F) -> Self {
        ReduceOperator {
            key_selector,
            reduce,
            descriptor: ValueStateDescriptor::new(STATE_NAME),
            state: None,
        }
    }
}

impl<K, T, KS, F> Operator<T, T> for ReduceOperator<K, T, KS, F>
where
    K: Key,
    T: StateValue,
    KS: Fn(&T) -> K + 'static,
    F: FnMut(T, T) -> T + 'static,
{
    fn open(&mut self, ctx: &RuntimeContext) {
        let state = KeyedStateStore::open(ctx)
            .unwrap_or_else(|error| panic!("cannot open the keyed state backend: {error}"));
        self.state = Some(state);
    }

    #[inline]
    fn process_element(&mut self, record: T, timestamp: i64, out: &mut Emitter<T>) {
        let key = (self.key_selector)(&record);
        let store = self.state.as_deref().expect("opened");
        store.next_call();
        let state = store.handle(&key, self.descriptor.id(), STATE_NAME, |b| {
            b.value_state(&self.descriptor)
        });
        let value = match state.value().unwrap_or_else(|e| panic!("keyed state: {e}")) {
            Some(previous) => (self.reduce)(previous, record),
            None => record,
        };
        state
            .update(value.clone())
            .unwrap_or_else(|e| panic!("keyed state: {e}"));
        out.main.push(value, timestamp);
    }

    const AT_MOST_ONE_PER_RECORD: bool = true;

    fn snapshot_state(&mut self, snapshot: &mut OperatorSnapshot) -> Result<(), String> {
        let state = self.state.as_deref().expect("opened");
        state.snapshot_into(snapshot)?;
        Ok(())
    }
}
