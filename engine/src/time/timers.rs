//! Timer queues: timers per (payload, time), deduplicated, fired in time order (ties in the
//! order they were registered).
//!
//! Two kinds: [`TimerQueue`], general (any time per payload, deletable), and [`TimerBuckets`],
//! for timers that many payloads share the times of (every key's aligned window ends at the same
//! instants): one bucket of payloads per time, which the owner keeps live or stale itself.
//!
//! **Cuts.** A [`TimerQueue`]'s timers as they stand at a checkpoint's barrier are written after
//! it, in steps between records ([`TimerQueue::cut`], [`TimerQueue::write_cut`]): the barrier
//! costs nothing, and the queue is copy-on-write per time instead — a bucket the writer has not
//! come to yet keeps its timers as they were at the cut aside on its first change after it
//! (a registration, a deletion or a timer firing), and a bucket made after the cut is marked so
//! that the writer passes it over. A step writes whole buckets in time order, so a step costs
//! about its budget plus one bucket.

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
    /// Registered timers.
    len: usize,
    /// Cuts taken so far; the last one's number while it is being written.
    cuts: u64,
    /// The cut being written, if one is.
    cut: Option<Box<Cut<T>>>,
}

impl<T> Default for TimerQueue<T> {
    fn default() -> Self {
        TimerQueue {
            by_time: BTreeMap::new(),
            len: 0,
            cuts: 0,
            cut: None,
        }
    }
}

/// What is left to write of a cut (see the module docs).
struct Cut<T> {
    /// The cut's buckets up to this time are written.
    written_to: Option<i64>,
    /// The cut's buckets that changed before the writer came to them, as they were at the cut.
    kept: BTreeMap<i64, Vec<T>>,
}

impl<T: Hash + Eq + Clone> Cut<T> {
    /// Before `bucket` at `time` changes: keeps what the cut `cut` holds of it, unless the
    /// writer is past it, or the bucket is the cut's already (kept, or made after the cut).
    #[inline]
    fn keep(&mut self, cut: u64, time: i64, bucket: &mut Bucket<T>) {
        if bucket.cut == cut || self.written_to.is_some_and(|written| time <= written) {
            return;
        }
        bucket.cut = cut;
        self.kept.insert(time, bucket.payloads().cloned().collect());
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
    /// The last cut whose writer does not read this bucket from the tree: made after that
    /// cut, or kept aside for it.
    cut: u64,
}

impl<T: Hash + Eq + Clone> Bucket<T> {
    /// A bucket made after the cut numbered `cut`.
    fn new(cut: u64) -> Self {
        Bucket {
            order: VecDeque::new(),
            live: None,
            registered: 0,
            cut,
        }
    }

    fn len(&self) -> usize {
        self.live.as_ref().map_or(self.order.len(), HashMap::len)
    }

    /// Registers `payload`; returns whether it was not registered already.
    fn register(&mut self, payload: &T) -> bool {
        let number = self.registered;
        match &mut self.live {
            Some(live) => {
                let std::collections::hash_map::Entry::Vacant(slot) = live.entry(payload.clone())
                else {
                    return false;
                };
                slot.insert(number);
            }
            None => {
                if self.order.iter().any(|(queued, _)| queued == payload) {
                    return false;
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
        true
    }

    /// Deletes `payload`; returns whether it was registered.
    fn delete(&mut self, payload: &T) -> bool {
        match &mut self.live {
            Some(live) => {
                let removed = live.remove(payload).is_some();
                if removed && self.order.len() > 2 * live.len() + SMALL_BUCKET {
                    self.order
                        .retain(|(queued, number)| live.get(queued) == Some(number));
                }
                removed
            }
            None => match self.order.iter().position(|(queued, _)| queued == payload) {
                Some(at) => {
                    self.order.remove(at);
                    true
                }
                None => false,
            },
        }
    }

    /// Every live payload, in registration order.
    fn payloads(&self) -> impl Iterator<Item = &T> {
        self.order.iter().filter_map(|(payload, number)| {
            let live = self
                .live
                .as_ref()
                .is_none_or(|live| live.get(payload) == Some(number));
            live.then_some(payload)
        })
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
        let bucket = match self.by_time.entry(time) {
            std::collections::btree_map::Entry::Occupied(bucket) => {
                let bucket = bucket.into_mut();
                if let Some(cut) = &mut self.cut {
                    cut.keep(self.cuts, time, bucket);
                }
                bucket
            }
            std::collections::btree_map::Entry::Vacant(slot) => slot.insert(Bucket::new(self.cuts)),
        };
        if bucket.register(payload) {
            self.len += 1;
        }
    }

    /// Removes a timer if it is registered.
    pub(crate) fn delete(&mut self, payload: &T, time: i64) {
        let std::collections::btree_map::Entry::Occupied(mut bucket) = self.by_time.entry(time)
        else {
            return;
        };
        if let Some(cut) = &mut self.cut {
            cut.keep(self.cuts, time, bucket.get_mut());
        }
        if bucket.get_mut().delete(payload) {
            self.len -= 1;
        }
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
        if let Some(cut) = &mut self.cut {
            cut.keep(self.cuts, time, bucket.get_mut());
        }
        // A bucket in the tree holds a live timer.
        let payload = bucket
            .get_mut()
            .pop()
            .expect("a bucket in the queue is not empty");
        self.len -= 1;
        if bucket.get().len() == 0 {
            bucket.remove();
        }
        Some((time, payload))
    }

    /// Number of registered timers.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Cuts the queue: its timers as they are now, to be written with
    /// [`TimerQueue::write_cut`] while it changes (see the module docs); returns how many
    /// there are. A cut still being written is given up.
    pub(crate) fn cut(&mut self) -> usize {
        self.cuts += 1;
        self.cut = Some(Box::new(Cut {
            written_to: None,
            kept: BTreeMap::new(),
        }));
        self.len
    }

    /// Gives up the cut being written, if one is.
    pub(crate) fn end_cut(&mut self) {
        self.cut = None;
    }

    /// Writes the cut's timers on from where the last call stopped, in the order they would
    /// fire (registering them in this order into an empty queue gives the queue as it was at
    /// the cut), whole buckets until about `budget` timers are written; returns whether the
    /// cut is written (it ends then; so does a queue without one).
    pub(crate) fn write_cut<E>(
        &mut self,
        budget: usize,
        mut write: impl FnMut(i64, &T) -> Result<(), E>,
    ) -> Result<bool, E> {
        use std::ops::Bound::{Excluded, Unbounded};
        let Some(cut) = &mut self.cut else {
            return Ok(true);
        };
        let mut work = 0;
        while work < budget {
            let after = cut.written_to.map_or(Unbounded, Excluded);
            let live = self.by_time.range((after, Unbounded)).next();
            let kept = cut.kept.first_key_value().map(|(time, _)| *time);
            match (live, kept) {
                (None, None) => {
                    self.cut = None;
                    return Ok(true);
                }
                (live, Some(kept)) if live.is_none_or(|(&time, _)| kept <= time) => {
                    let (time, timers) = cut.kept.pop_first().expect("a kept bucket");
                    for payload in &timers {
                        write(time, payload)?;
                    }
                    work += timers.len().max(1);
                    cut.written_to = Some(time);
                }
                (Some((&time, bucket)), _) => {
                    if bucket.cut != self.cuts {
                        for payload in bucket.payloads() {
                            write(time, payload)?;
                        }
                    }
                    work += bucket.len().max(1);
                    cut.written_to = Some(time);
                }
                (None, Some(_)) => unreachable!("guarded above"),
            }
        }
        Ok(false)
    }

    /// Every registered timer, in the order they would fire.
    #[cfg(test)]
    pub(crate) fn for_each(&self, mut visit: impl FnMut(i64, &T)) {
        for (&time, bucket) in &self.by_time {
            bucket.payloads().for_each(|payload| visit(time, payload));
        }
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

        /// A cut written in steps while the queue changes (registrations, deletions,
        /// timers firing, at times the writer has and has not come to) writes the timers the
        /// queue held at the cut, in firing order; a new cut gives up one still being written.
        #[test]
        fn a_cut_written_while_the_queue_changes_holds_the_timers_at_the_cut(
            before in proptest::collection::vec((0u8..8, 0u8..24, 0i64..12), 0..200),
            after in proptest::collection::vec((0u8..10, 0u8..24, 0i64..12, 0usize..4), 0..300),
            spread in prop_oneof![Just(1i64), Just(25)],
        ) {
            let mut q = TimerQueue::default();
            let change = |q: &mut TimerQueue<u8>, op: u8, key: u8, time: i64| match op {
                0..=4 => q.register(&key, time),
                5 | 6 => q.delete(&key, time),
                _ => {
                    q.pop_due(time);
                }
            };
            for (op, key, time) in before {
                change(&mut q, op, key, time * spread);
            }
            let at_cut = |q: &TimerQueue<u8>| {
                let mut timers = Vec::new();
                q.for_each(|time, &key| timers.push((time, key)));
                timers
            };
            let mut expected = at_cut(&q);
            prop_assert_eq!(q.cut(), expected.len());
            let mut written = Vec::new();
            let mut done = false;
            for (op, key, time, budget) in after {
                match op {
                    8 => {
                        // Another barrier: the cut being written is given up.
                        expected = at_cut(&q);
                        prop_assert_eq!(q.cut(), expected.len());
                        written.clear();
                        done = false;
                    }
                    9 if !done => {
                        done = q
                            .write_cut(budget, |time, &key| {
                                written.push((time, key));
                                Ok::<(), ()>(())
                            })
                            .expect("writes");
                    }
                    _ => change(&mut q, op, key, time * spread),
                }
            }
            while !done {
                done = q
                    .write_cut(1, |time, &key| {
                        written.push((time, key));
                        Ok::<(), ()>(())
                    })
                    .expect("writes");
            }
            prop_assert_eq!(written, expected);
            prop_assert!(q.cut.is_none(), "a written cut ends");
        }
    }
}
