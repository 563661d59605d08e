//! Timer queues: timers per (payload, time), deduplicated, fired in time order (ties in the
//! order they were registered). Registering, deleting and firing cost O(log n).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// Event time (driven by watermarks) or processing time (driven by the wall clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimeDomain {
    /// Timers fire when the watermark passes their time.
    EventTime,
    /// Timers fire when the shard's wall clock passes their time.
    ProcessingTime,
}

/// Timers of one domain. `T` is what a timer is for: a key, or a key and a window.
pub(crate) struct TimerQueue<T> {
    /// (time, registration number) → payload: iteration order is firing order.
    by_time: BTreeMap<(i64, u64), T>,
    /// (payload, time) → registration number: deduplicates and finds a timer to delete.
    index: HashMap<(T, i64), u64>,
    registered: u64,
}

impl<T> Default for TimerQueue<T> {
    fn default() -> Self {
        TimerQueue {
            by_time: BTreeMap::new(),
            index: HashMap::new(),
            registered: 0,
        }
    }
}

impl<T: Hash + Eq + Clone> TimerQueue<T> {
    /// Registers a timer; a second registration of the same (payload, time) is a no-op.
    pub(crate) fn register(&mut self, payload: &T, time: i64) {
        let std::collections::hash_map::Entry::Vacant(slot) =
            self.index.entry((payload.clone(), time))
        else {
            return;
        };
        let number = self.registered;
        self.registered += 1;
        slot.insert(number);
        self.by_time.insert((time, number), payload.clone());
    }

    /// Removes a timer if it is registered.
    pub(crate) fn delete(&mut self, payload: &T, time: i64) {
        if let Some(number) = self.index.remove(&(payload.clone(), time)) {
            self.by_time.remove(&(time, number));
        }
    }

    /// The earliest timer's time.
    pub(crate) fn next_time(&self) -> Option<i64> {
        self.by_time.first_key_value().map(|((time, _), _)| *time)
    }

    /// Removes and returns the earliest timer if its time is at or before `limit`.
    pub(crate) fn pop_due(&mut self, limit: i64) -> Option<(i64, T)> {
        let entry = self.by_time.first_entry()?;
        if entry.key().0 > limit {
            return None;
        }
        let ((time, _), payload) = entry.remove_entry();
        self.index.remove(&(payload.clone(), time));
        Some((time, payload))
    }

    /// Number of registered timers.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_time.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fires_in_time_order_once_per_key_and_time() {
        let mut q = TimerQueue::default();
        q.register(&"b", 20);
        q.register(&"a", 10);
        q.register(&"a", 10);
        q.register(&"c", 20);
        q.register(&"a", 30);
        q.delete(&"a", 30);
        assert_eq!(q.len(), 3);
        assert_eq!(q.pop_due(25), Some((10, "a")));
        assert_eq!(q.pop_due(25), Some((20, "b")));
        assert_eq!(q.pop_due(25), Some((20, "c")));
        assert_eq!(q.pop_due(25), None);
        assert_eq!(q.next_time(), None);
    }

    proptest! {
        /// Against a model: a sorted, deduplicated list.
        #[test]
        fn agrees_with_a_sorted_set(ops in proptest::collection::vec((0u8..3, 0u8..5, 0i64..50), 0..200)) {
            let mut q = TimerQueue::default();
            let mut model: Vec<(i64, u8)> = Vec::new();
            for (op, key, time) in ops {
                match op {
                    0 | 1 => {
                        q.register(&key, time);
                        if !model.contains(&(time, key)) { model.push((time, key)); }
                    }
                    _ => {
                        q.delete(&key, time);
                        model.retain(|&e| e != (time, key));
                    }
                }
            }
            let mut fired = Vec::new();
            while let Some((time, key)) = q.pop_due(i64::MAX) {
                fired.push((time, key));
            }
            let mut times: Vec<i64> = fired.iter().map(|f| f.0).collect();
            let sorted = { let mut t = times.clone(); t.sort(); t };
            prop_assert_eq!(&times, &sorted);
            times.dedup();
            fired.sort();
            model.sort();
            prop_assert_eq!(fired, model);
        }
    }
}
