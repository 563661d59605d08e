//! Timer queues: timers per (payload, time), deduplicated, fired in time order (ties in the
//! order they were registered).
//!
//! Two kinds: [`TimerQueue`], general (any time per payload, deletable), and [`TimerBuckets`],
//! for timers that many payloads share the times of (every key's aligned window ends at the same
//! instants): one bucket of payloads per time, which the owner keeps live or stale itself.

use std::collections::{BTreeMap, HashMap, VecDeque};
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
///
/// One bucket per time, in a B-tree by time. Timers are mostly set a little ahead of the
/// current time, so registering touches the tree's right edge and one recent bucket, and
/// firing its left edge: both stay in cache however many timers are pending, where one hash
/// index over all (payload, time) pairs costs a cache miss per registration and per firing.
/// Registering, deleting and firing cost O(log t) for t distinct times, plus O(1) in the
/// bucket (a short scan in a small one).
pub(crate) struct TimerQueue<T> {
    by_time: BTreeMap<i64, Bucket<T>>,
}

impl<T> Default for TimerQueue<T> {
    fn default() -> Self {
        TimerQueue {
            by_time: BTreeMap::new(),
        }
    }
}

/// Payloads a bucket holds before it indexes them in a hash map.
const SMALL_BUCKET: usize = 8;

/// The timers at one time, in registration order.
struct Bucket<T> {
    /// Registrations in order, each with its number in the bucket. A small bucket holds
    /// exactly its live timers; a large one also deleted ones, skipped when they come up.
    order: VecDeque<(T, u64)>,
    /// A large bucket's live payloads, to the number of their live registration (a payload
    /// deleted and registered again fires at its new place, once).
    live: Option<HashMap<T, u64, BuildHasherDefault<StableHasher>>>,
    registered: u64,
}

impl<T: Hash + Eq + Clone> Bucket<T> {
    fn new() -> Self {
        Bucket {
            order: VecDeque::new(),
            live: None,
            registered: 0,
        }
    }

    fn len(&self) -> usize {
        self.live.as_ref().map_or(self.order.len(), HashMap::len)
    }

    fn register(&mut self, payload: &T) {
        let number = self.registered;
        match &mut self.live {
            Some(live) => {
                let std::collections::hash_map::Entry::Vacant(slot) = live.entry(payload.clone())
                else {
                    return;
                };
                slot.insert(number);
            }
            None => {
                if self.order.iter().any(|(queued, _)| queued == payload) {
                    return;
                }
                if self.order.len() == SMALL_BUCKET {
                    let mut live = HashMap::default();
                    live.extend(self.order.iter().cloned());
                    live.insert(payload.clone(), number);
                    self.live = Some(live);
                }
            }
        }
        self.registered += 1;
        self.order.push_back((payload.clone(), number));
    }

    fn delete(&mut self, payload: &T) {
        match &mut self.live {
            Some(live) => {
                if live.remove(payload).is_some()
                    && self.order.len() > 2 * live.len() + SMALL_BUCKET
                {
                    self.order
                        .retain(|(queued, number)| live.get(queued) == Some(number));
                }
            }
            None => {
                if let Some(at) = self.order.iter().position(|(queued, _)| queued == payload) {
                    self.order.remove(at);
                }
            }
        }
    }

    /// The earliest live registration, removed.
    fn pop(&mut self) -> Option<T> {
        while let Some((payload, number)) = self.order.pop_front() {
            let Some(live) = &mut self.live else {
                return Some(payload);
            };
            if live.get(&payload) == Some(&number) {
                live.remove(&payload);
                return Some(payload);
            }
        }
        None
    }
}

impl<T: Hash + Eq + Clone> TimerQueue<T> {
    /// Registers a timer; a second registration of the same (payload, time) is a no-op.
    pub(crate) fn register(&mut self, payload: &T, time: i64) {
        self.by_time
            .entry(time)
            .or_insert_with(Bucket::new)
            .register(payload);
    }

    /// Removes a timer if it is registered.
    pub(crate) fn delete(&mut self, payload: &T, time: i64) {
        let std::collections::btree_map::Entry::Occupied(mut bucket) = self.by_time.entry(time)
        else {
            return;
        };
        bucket.get_mut().delete(payload);
        if bucket.get().len() == 0 {
            bucket.remove();
        }
    }

    /// The earliest timer's time.
    pub(crate) fn next_time(&self) -> Option<i64> {
        self.by_time.first_key_value().map(|(time, _)| *time)
    }

    /// Removes and returns the earliest timer if its time is at or before `limit`.
    pub(crate) fn pop_due(&mut self, limit: i64) -> Option<(i64, T)> {
        let mut bucket = self.by_time.first_entry()?;
        let time = *bucket.key();
        if time > limit {
            return None;
        }
        // A bucket in the tree holds a live timer.
        let payload = bucket
            .get_mut()
            .pop()
            .expect("a bucket in the queue is not empty");
        if bucket.get().len() == 0 {
            bucket.remove();
        }
        Some((time, payload))
    }

    /// Every registered timer, in the order they would fire: what a checkpoint writes, and
    /// registering them again in this order into an empty queue gives the same queue.
    pub(crate) fn for_each(&self, mut visit: impl FnMut(i64, &T)) {
        for (&time, bucket) in &self.by_time {
            for (payload, number) in &bucket.order {
                let live = bucket
                    .live
                    .as_ref()
                    .is_none_or(|live| live.get(payload) == Some(number));
                if live {
                    visit(time, payload);
                }
            }
        }
    }

    /// Number of registered timers.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_time.values().map(Bucket::len).sum()
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
        /// Against a model: a list of (time, registration, payload), deduplicated, popped by
        /// (time, registration). Few times and many payloads make buckets large (indexed),
        /// many times keep them small.
        #[test]
        fn agrees_with_a_model(
            ops in proptest::collection::vec((0u8..8, 0u8..24, 0i64..4), 0..300),
            spread in prop_oneof![Just(1i64), Just(25)],
        ) {
            let mut q = TimerQueue::default();
            let mut model: Vec<(i64, usize, u8)> = Vec::new();
            for (step, (op, key, time)) in ops.into_iter().enumerate() {
                let time = time * spread;
                match op {
                    0..=4 => {
                        q.register(&key, time);
                        if !model.iter().any(|&(t, _, k)| (t, k) == (time, key)) {
                            model.push((time, step, key));
                        }
                    }
                    5 | 6 => {
                        q.delete(&key, time);
                        model.retain(|&(t, _, k)| (t, k) != (time, key));
                    }
                    _ => {
                        let limit = time;
                        let expected = model
                            .iter()
                            .copied()
                            .filter(|&(t, _, _)| t <= limit)
                            .min_by_key(|&(t, step, _)| (t, step));
                        model.retain(|&timer| Some(timer) != expected);
                        prop_assert_eq!(q.pop_due(limit), expected.map(|(t, _, k)| (t, k)));
                    }
                }
                prop_assert_eq!(q.len(), model.len());
                prop_assert_eq!(q.next_time(), model.iter().map(|&(t, _, _)| t).min());
            }
            model.sort_by_key(|&(t, step, _)| (t, step));
            let mut fired = Vec::new();
            while let Some(timer) = q.pop_due(i64::MAX) {
                fired.push(timer);
            }
            let expected: Vec<(i64, u8)> = model.into_iter().map(|(t, _, k)| (t, k)).collect();
            prop_assert_eq!(fired, expected);
        }
    }
}
