//! Running `reduce` on a keyed stream: folds each record into its key's value and emits the
//! new value. The per-key values live in memory until the keyed-state backends land.

use std::collections::HashMap;

use super::{Emitter, Operator};
use crate::record::Key;

pub(crate) struct ReduceOperator<K, T, KS, F> {
    key_selector: KS,
    reduce: F,
    values: HashMap<K, T>,
}

impl<K, T, KS, F> ReduceOperator<K, T, KS, F> {
    pub(crate) fn new(key_selector: KS, reduce: F) -> Self {
        ReduceOperator {
            key_selector,
            reduce,
            values: HashMap::new(),
        }
    }
}

impl<K, T, KS, F> Operator<T, T> for ReduceOperator<K, T, KS, F>
where
    K: Key,
    T: Clone + 'static,
    KS: Fn(&T) -> K + 'static,
    F: FnMut(T, T) -> T + 'static,
{
    #[inline]
    fn process_element(&mut self, record: T, timestamp: i64, out: &mut Emitter<T>) {
        let key = (self.key_selector)(&record);
        let value = match self.values.remove(&key) {
            Some(previous) => (self.reduce)(previous, record),
            None => record,
        };
        out.main.push(value.clone(), timestamp);
        self.values.insert(key, value);
    }

    const AT_MOST_ONE_PER_RECORD: bool = true;
}
