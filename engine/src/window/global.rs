//! Global windows with a purging count trigger: every `count` records of a key, the key's
//! window fires with them and starts over. Records of a window that never fills up are not
//! emitted (as in Flink, a count window fires only when full).

use std::marker::PhantomData;

use super::function::WindowLogic;
use super::{GlobalWindow, KeyMap, Window};
use crate::operator::{Emitter, Operator};
use crate::record::Key;

pub(crate) struct CountWindowOperator<K, T, O, KS, L: WindowLogic<K, GlobalWindow, T, O>> {
    key_selector: KS,
    logic: L,
    count: u64,
    keys: KeyMap<K, (u64, L::Acc)>,
    _types: PhantomData<fn(T) -> O>,
}

impl<K, T, O, KS, L: WindowLogic<K, GlobalWindow, T, O>> CountWindowOperator<K, T, O, KS, L> {
    pub(crate) fn new(key_selector: KS, logic: L, count: u64) -> Self {
        CountWindowOperator {
            key_selector,
            logic,
            count,
            keys: KeyMap::default(),
            _types: PhantomData,
        }
    }
}

impl<K, T, O, KS, L> Operator<T, O> for CountWindowOperator<K, T, O, KS, L>
where
    K: Key,
    T: 'static,
    O: 'static,
    KS: Fn(&T) -> K + 'static,
    L: WindowLogic<K, GlobalWindow, T, O>,
{
    fn process_element(&mut self, record: T, _timestamp: i64, out: &mut Emitter<O>) {
        let key = (self.key_selector)(&record);
        let logic = &mut self.logic;
        let (seen, acc) = self
            .keys
            .entry(key.clone())
            .or_insert_with(|| (0, logic.create(&key)));
        logic.add(acc, record);
        *seen += 1;
        if *seen >= self.count {
            let (_, acc) = self.keys.remove(&key).expect("present");
            self.logic.fire(
                &key,
                &GlobalWindow,
                &[&acc],
                GlobalWindow.max_timestamp(),
                &mut out.main,
            );
        }
    }
}
