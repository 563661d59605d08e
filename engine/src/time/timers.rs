//! Timer queues: timers per (payload, time), deduplicated, fired in time order (ties in the
//! order they were registered). Registering, deleting and firing cost O(log n).
//!
//! Two kinds: [`TimerQueue`], general (any time per payload, deletable), and [`TimerBuckets`],
//! for timers that many payloads share the times of (every key's aligned window ends at the same
//! instants): one bucket of payloads per time, which the owner keeps live or stale itself.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hash};

use weir_state::StableHasher;

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
    index: HashMap<(T, i64), u64, BuildHasherDefault<StableHasher>>,
    registered: u64,
}

impl<T> Default for TimerQueue<T> {
    fn default() -> Self {
        TimerQueue {
            by_time: BTreeMap::new(),
            index: HashMap::default(),
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

/// Timers as buckets: per time, the payloads due then, in the order they were registered.
/// Registering costs O(log b) for b distinct times (few, when the times are aligned window ends)
/// plus a push, and just the push in a row of registrations at one time (every key's next
/// window ends at the same instant); a bucket comes due whole. Registrations are not
/// deduplicated and cannot be deleted: the owner records each payload's live timer time and
/// skips the payloads of a due bucket whose live time is another (moved or spent), so a
/// duplicate fires once.
pub(crate) struct TimerBuckets<T> {
    by_time: BTreeMap<i64, Vec<T>>,
    /// The bucket registered into last, out of the map until another time is registered or a
    /// bucket is taken.
    open: Option<(i64, Vec<T>)>,
    /// Emptied buckets, kept for their capacity.
    spare: Vec<Vec<T>>,
}

impl<T> Default for TimerBuckets<T> {
    fn default() -> Self {
        TimerBuckets {
            by_time: BTreeMap::new(),
            open: None,
            spare: Vec::new(),
        }
    }
}

impl<T> TimerBuckets<T> {
    /// Adds `payload` to the bucket at `time`.
    #[inline]
    pub(crate) fn register(&mut self, payload: T, time: i64) {
        match &mut self.open {
            Some((open, bucket)) if *open == time => bucket.push(payload),
            _ => self.open_at(time).push(payload),
        }
    }

    /// Makes the bucket at `time` the open one.
    fn open_at(&mut self, time: i64) -> &mut Vec<T> {
        self.close();
        let spare = &mut self.spare;
        let bucket = self
            .by_time
            .remove(&time)
            .unwrap_or_else(|| spare.pop().unwrap_or_default());
        &mut self.open.insert((time, bucket)).1
    }

    /// Puts the open bucket back in the map.
    fn close(&mut self) {
        if let Some((time, bucket)) = self.open.take() {
            self.by_time.insert(time, bucket);
        }
    }

    /// The earliest bucket's time.
    pub(crate) fn next_time(&self) -> Option<i64> {
        let first = self.by_time.first_key_value().map(|(time, _)| *time);
        let open = self.open.as_ref().map(|(time, _)| *time);
        first.into_iter().chain(open).min()
    }

    /// Removes and returns the earliest bucket if its time is at or before `limit`; hand it
    /// back with [`TimerBuckets::recycle`] once drained.
    pub(crate) fn pop_due(&mut self, limit: i64) -> Option<(i64, Vec<T>)> {
        self.close();
        let entry = self.by_time.first_entry()?;
        if *entry.key() > limit {
            return None;
        }
        Some(entry.remove_entry())
    }

    /// Keeps an emptied bucket's capacity for a later time.
    pub(crate) fn recycle(&mut self, mut bucket: Vec<T>) {
        bucket.clear();
        if self.spare.len() < 4 {
            self.spare.push(bucket);
        }
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

    #[test]
    fn buckets_come_due_in_time_order_with_registration_order_inside() {
        let mut b = TimerBuckets::default();
        b.register("x", 20);
        b.register("y", 10);
        b.register("z", 20);
        b.register("x", 20);
        assert_eq!(b.next_time(), Some(10));
        b.register("w", 5);
        assert_eq!(b.next_time(), Some(5), "the open bucket counts");
        assert_eq!(
            b.pop_due(5).map(|(t, bucket)| (t, bucket.len())),
            Some((5, 1))
        );
        assert_eq!(b.pop_due(5), None);
        let (time, bucket) = b.pop_due(25).unwrap();
        assert_eq!((time, bucket.as_slice()), (10, &["y"][..]));
        b.recycle(bucket);
        let (time, bucket) = b.pop_due(25).unwrap();
        assert_eq!((time, bucket.as_slice()), (20, &["x", "z", "x"][..]));
        assert_eq!(b.pop_due(i64::MAX), None);
        assert_eq!(b.next_time(), None);
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
