//! Windows on keyed streams (and `window_all`): what a window is, how records are assigned to
//! windows, and the functions that turn a window's records into output.
//!
//! - Tumbling and sliding windows are *aligned*: every key's windows start at the same times.
//!   Records are kept per **pane** (the greatest common divisor of size and slide) — each
//!   record goes into exactly one pane, never copied into every overlapping window — and a
//!   firing window merges its panes' accumulators (`aligned.rs`).
//! - Session windows merge per key as records arrive (`session.rs`).
//! - Global windows with a count trigger fire every `n` records of a key (`global.rs`).
//!
//! A window fires when event time (the watermark) or processing time passes its end; with
//! `allowed_lateness` it stays until `end + lateness` and fires again for each late record;
//! records later than that go to the late-data side output, or are dropped and counted
//! (`late_records_dropped`). Output records carry the window's `max_timestamp()`.

pub(crate) mod aligned;
pub(crate) mod assigner;
mod checkpoint;
mod deferred;
pub(crate) mod function;
mod global;
mod panes;
mod session;
mod stored;
pub(crate) mod two_phase;

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::{BuildHasherDefault, Hash};

pub(crate) use assigner::WindowParts;
pub use assigner::{
    EventTimeSessionWindows, GlobalWindows, ProcessingTimeSessionWindows, SlidingEventTimeWindows,
    SlidingProcessingTimeWindows, TumblingEventTimeWindows, TumblingProcessingTimeWindows,
    WindowAssigner,
};
pub use function::{AggregateFunction, ProcessWindowFunction, WindowElements};
pub(crate) use global::CountWindowOperator;
pub(crate) use session::SessionWindowOperator;

/// The window operators' per-key maps, hashed with the stable key hash (Weir key hash v1, as
/// heap state is): a few multiplies per key instead of SipHash, which cost ~18% of the window
/// benchmark. Unseeded, like the key-group hash every keyed record already goes through.
pub(crate) type KeyMap<K, V> = HashMap<K, V, BuildHasherDefault<weir_state::StableHasher>>;

/// A window: a group of records that are processed together.
pub trait Window: Clone + Hash + Eq + Debug + Send + 'static {
    /// The largest timestamp that still belongs to the window; the window's output carries it.
    fn max_timestamp(&self) -> i64;
}

/// A time interval `[start, end)` in milliseconds.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct TimeWindow {
    /// First millisecond of the window (inclusive).
    pub start: i64,
    /// End of the window (exclusive).
    pub end: i64,
}

impl TimeWindow {
    /// The window `[start, end)`.
    pub fn new(start: i64, end: i64) -> Self {
        TimeWindow { start, end }
    }

    /// The start of the window of `size` (shifted by `offset`) that holds `timestamp`
    /// (Flink's `getWindowStartWithOffset`).
    pub fn start_with_offset(timestamp: i64, offset: i64, size: i64) -> i64 {
        timestamp - (timestamp - offset).rem_euclid(size)
    }
}

impl Window for TimeWindow {
    fn max_timestamp(&self) -> i64 {
        self.end - 1
    }
}

/// The one window of `GlobalWindows`: all of a key's records, fired by a count trigger.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct GlobalWindow;

impl Window for GlobalWindow {
    fn max_timestamp(&self) -> i64 {
        i64::MAX
    }
}

/// What a window operator does with records that arrive after their window's allowed
/// lateness: send them to a side output, or drop and count them.
pub(crate) struct LateData<T> {
    pub(crate) tag: Option<crate::operator::OutputTag<T>>,
    pub(crate) dropped: Option<crate::metrics::Counter>,
}

impl<T: 'static> LateData<T> {
    pub(crate) fn new(tag: Option<crate::operator::OutputTag<T>>) -> Self {
        LateData { tag, dropped: None }
    }

    /// Sends a late `record` to the side output, or drops it and counts the `records` input
    /// records it stands for.
    pub(crate) fn handle<O>(
        &self,
        record: T,
        timestamp: i64,
        records: u64,
        out: &mut crate::operator::Emitter<O>,
    ) {
        match &self.tag {
            Some(tag) => out.side.emit(tag, record, timestamp),
            None => {
                if let Some(dropped) = &self.dropped {
                    dropped.add(records);
                }
            }
        }
    }
}

/// The timestamp a window operator files a record under: its event timestamp, or the wall
/// clock for processing-time windows. A record without a timestamp in an event-time window
/// is a job error: nothing assigned timestamps.
#[inline]
pub(crate) fn element_time(domain: crate::time::TimeDomain, timestamp: i64, operator: &str) -> i64 {
    match domain {
        crate::time::TimeDomain::ProcessingTime => crate::time::stretch_now_ms(),
        crate::time::TimeDomain::EventTime if timestamp == crate::record::NO_TIMESTAMP => panic!(
            "event-time window '{operator}' received a record without a timestamp; give the source a \
             WatermarkStrategy with a timestamp assigner (env.from_source(source, \
             WatermarkStrategy::for_bounded_out_of_orderness(..).with_timestamp_assigner(..), name)) \
             or use processing-time windows"
        ),
        crate::time::TimeDomain::EventTime => timestamp,
    }
}

/// An empty vector of references in `refs`'s allocation, so that the buffer is reused across
/// firings though its references live only for one. (Collecting `into_iter().map(..)` in
/// place did the same, but as a loop the compiler kept where it inlined it differently.)
#[inline]
pub(crate) fn recycle<'a, 'b, A>(refs: Vec<&'a A>) -> Vec<&'b A> {
    let mut refs = std::mem::ManuallyDrop::new(refs);
    refs.clear();
    let (buffer, capacity) = (refs.as_mut_ptr(), refs.capacity());
    // SAFETY: the allocation is `refs`'s, given up above (`ManuallyDrop`), with its capacity;
    // `&'a A` and `&'b A` have one layout, and the vector holds none of them.
    unsafe { Vec::from_raw_parts(buffer.cast::<&'b A>(), 0, capacity) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every timestamp lies in the window that `start_with_offset` gives it, and windows
        /// tile time: the start is aligned to the offset.
        #[test]
        fn window_start_holds_the_timestamp(ts in -1_000_000_000i64..1_000_000_000, size in 1i64..100_000, offset in -50_000i64..50_000) {
            let start = TimeWindow::start_with_offset(ts, offset, size);
            prop_assert!(start <= ts && ts < start + size);
            prop_assert_eq!((start - offset).rem_euclid(size), 0);
        }
    }

    /// A recycled vector is empty and keeps its allocation.
    #[test]
    fn recycling_keeps_the_buffer() {
        let values = [1, 2, 3];
        let mut refs: Vec<&i32> = Vec::with_capacity(8);
        refs.extend(values.iter());
        let (buffer, capacity) = (refs.as_ptr() as usize, refs.capacity());
        let mut recycled: Vec<&i32> = recycle(refs);
        assert!(recycled.is_empty());
        assert_eq!(recycled.capacity(), capacity);
        assert_eq!(recycled.as_ptr() as usize, buffer);
        let other = 4;
        recycled.push(&other);
        assert_eq!(recycled, [&4]);
    }

    #[test]
    fn hand_computed_starts() {
        assert_eq!(TimeWindow::start_with_offset(12_345, 0, 10_000), 10_000);
        assert_eq!(TimeWindow::start_with_offset(-1, 0, 10_000), -10_000);
        assert_eq!(TimeWindow::start_with_offset(12_345, 3_000, 10_000), 3_000);
        assert_eq!(TimeWindow::new(0, 10).max_timestamp(), 9);
    }
}
