//! Tumbling and sliding windows, kept per pane.
//!
//! Windows of `size` start every `slide` (tumbling: `slide == size`), aligned to `offset`. The
//! pane is `gcd(size, slide)`: each record is folded into the one pane that holds its
//! timestamp, and a window is the `size / pane` consecutive panes it spans. So a sliding
//! window with an incremental function costs one accumulator update per record, not one per
//! overlapping window; firing merges `size / pane` accumulators per key and window.
//!
//! Per key the live panes sit in a `PaneList` ordered by start: inline in the key's map entry
//! while there is one (tumbling windows, in-order input: no pointer to chase per record), in a
//! deque when there are more (appends at the back in the common, in-order case). One timer per (key, window) fires the window at its
//! `max_timestamp()`; with allowed lateness a second timer at `max_timestamp() + lateness`
//! drops the panes no later window needs.

use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::sync::Arc;

use super::function::WindowLogic;
use super::{element_time, LateData, TimeWindow, Window};
use crate::metrics::OperatorMetrics;
use crate::operator::{Emitter, Operator, OutputTag, RuntimeContext};
use crate::record::{Key, Watermark};
use crate::time::{TimeDomain, TimerQueue};

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The window geometry: sizes in ms.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    size: i64,
    slide: i64,
    offset: i64,
    pane: i64,
}

impl Geometry {
    pub(crate) fn new(size: i64, slide: i64, offset: i64) -> Self {
        Geometry {
            size,
            slide,
            offset,
            pane: gcd(size, slide),
        }
    }

    fn pane_start(&self, timestamp: i64) -> i64 {
        TimeWindow::start_with_offset(timestamp, self.offset, self.pane)
    }

    /// The start of the last (latest-starting) window that holds the pane at `pane_start`.
    fn last_window_start(&self, pane_start: i64) -> i64 {
        TimeWindow::start_with_offset(pane_start, self.offset, self.slide)
    }

    /// The windows holding the pane at `pane_start`, latest first.
    fn windows_of_pane(&self, pane_start: i64) -> impl Iterator<Item = TimeWindow> {
        let last = self.last_window_start(pane_start);
        let (size, slide) = (self.size, self.slide);
        (0..)
            .map(move |i| last - i * slide)
            .take_while(move |start| start.saturating_add(size) > pane_start)
            .map(move |start| TimeWindow::new(start, start.saturating_add(size)))
    }

    /// The `max_timestamp()` of the last window that holds the pane at `pane_start`.
    fn pane_last_max_timestamp(&self, pane_start: i64) -> i64 {
        self.last_window_start(pane_start)
            .saturating_add(self.size - 1)
    }
}

/// A key's live panes, ordered by start: inline while there is one, else in a deque.
pub(crate) struct PaneList<A> {
    single: Option<(i64, A)>,
    many: VecDeque<(i64, A)>,
}

impl<A> Default for PaneList<A> {
    fn default() -> Self {
        PaneList {
            single: None,
            many: VecDeque::new(),
        }
    }
}

impl<A> PaneList<A> {
    /// The accumulator of the pane at `start`, created with `make` if there is none yet
    /// (`true`: created).
    #[inline]
    fn get_mut_or_insert_with(&mut self, start: i64, make: impl FnOnce() -> A) -> (&mut A, bool) {
        if self.many.is_empty() {
            match self.single.as_ref().map(|(s, _)| *s == start) {
                None => {
                    let (_, acc) = self.single.insert((start, make()));
                    return (acc, true);
                }
                Some(true) => return (&mut self.single.as_mut().expect("checked").1, false),
                Some(false) => {
                    let moved = self.single.take().expect("checked");
                    self.many.push_back(moved);
                }
            }
        }
        let at = match self.many.iter().rposition(|(s, _)| *s <= start) {
            Some(i) if self.many[i].0 == start => return (&mut self.many[i].1, false),
            found => found.map_or(0, |i| i + 1),
        };
        self.many.insert(at, (start, make()));
        (&mut self.many[at].1, true)
    }

    fn iter(&self) -> impl Iterator<Item = &(i64, A)> {
        self.single.iter().chain(self.many.iter())
    }

    fn retain(&mut self, mut keep: impl FnMut(&(i64, A)) -> bool) {
        if self.single.as_ref().is_some_and(|pane| !keep(pane)) {
            self.single = None;
        }
        self.many.retain(|pane| keep(pane));
        if self.many.len() == 1 {
            self.single = self.many.pop_front();
        }
    }

    fn is_empty(&self) -> bool {
        self.single.is_none() && self.many.is_empty()
    }
}

/// Tumbling/sliding window operator over keys `K` with window function `L`.
pub(crate) struct AlignedWindowOperator<K, T, O, KS, L: WindowLogic<K, TimeWindow, T, O>> {
    key_selector: KS,
    logic: L,
    geometry: Geometry,
    domain: TimeDomain,
    allowed_lateness: i64,
    late: LateData<T>,
    operator: Arc<str>,
    keys: HashMap<K, PaneList<L::Acc>>,
    /// Window firings, at each window's `max_timestamp()`.
    fire_timers: TimerQueue<K>,
    /// Pane clean-ups at `max_timestamp() + lateness` (only with allowed lateness).
    cleanup_timers: TimerQueue<K>,
    watermark: Watermark,
    /// The last pane a record fell in, `[start, end)`, and the start of its last window:
    /// in-order input hits it almost always and skips two divisions per record.
    recent_pane: (i64, i64, i64),
    _output: PhantomData<fn() -> O>,
}

impl<K, T, O, KS, L: WindowLogic<K, TimeWindow, T, O>> AlignedWindowOperator<K, T, O, KS, L> {
    pub(crate) fn new(
        key_selector: KS,
        logic: L,
        geometry: Geometry,
        domain: TimeDomain,
        allowed_lateness: i64,
        late_tag: Option<OutputTag<T>>,
    ) -> Self
    where
        T: 'static,
    {
        AlignedWindowOperator {
            key_selector,
            logic,
            geometry,
            domain,
            allowed_lateness: if domain == TimeDomain::EventTime {
                allowed_lateness
            } else {
                0
            },
            late: LateData::new(late_tag),
            operator: "".into(),
            keys: HashMap::new(),
            fire_timers: TimerQueue::default(),
            cleanup_timers: TimerQueue::default(),
            watermark: Watermark::MIN,
            recent_pane: (0, 0, 0),
            _output: PhantomData,
        }
    }
}

impl<K, T, O, KS, L> AlignedWindowOperator<K, T, O, KS, L>
where
    K: Key,
    T: 'static,
    L: WindowLogic<K, TimeWindow, T, O>,
{
    /// Whether `window` has passed its allowed lateness (its state is gone or going).
    fn is_expired(&self, window: &TimeWindow) -> bool {
        self.domain == TimeDomain::EventTime
            && window.max_timestamp().saturating_add(self.allowed_lateness) <= self.watermark.0
    }

    /// Emits `window`'s output for `key` from the panes it spans (nothing if it has none).
    fn fire_window(&mut self, key: &K, window: TimeWindow, out: &mut Emitter<O>) {
        let Some(panes) = self.keys.get(key) else {
            return;
        };
        let in_window: Vec<&L::Acc> = panes
            .iter()
            .filter(|(start, _)| *start >= window.start && *start < window.end)
            .map(|(_, acc)| acc)
            .collect();
        if in_window.is_empty() {
            return;
        }
        self.logic.fire(
            key,
            &window,
            &in_window,
            window.max_timestamp(),
            &mut out.main,
        );
    }

    /// Drops `key`'s panes that no window needs any more at `time`.
    fn clean_up(&mut self, key: &K, time: i64) {
        let geometry = self.geometry;
        let lateness = self.allowed_lateness;
        if let Some(panes) = self.keys.get_mut(key) {
            panes.retain(|(start, _)| {
                geometry
                    .pane_last_max_timestamp(*start)
                    .saturating_add(lateness)
                    > time
            });
            if panes.is_empty() {
                self.keys.remove(key);
            }
        }
    }

    /// Fires the windows whose timers are due at `limit` in `domain`, then cleans up.
    fn advance(&mut self, limit: i64, out: &mut Emitter<O>) {
        while let Some((time, key)) = self.fire_timers.pop_due(limit) {
            let end = time.saturating_add(1);
            self.fire_window(&key, TimeWindow::new(end - self.geometry.size, end), out);
            if self.allowed_lateness == 0 {
                self.clean_up(&key, time);
            }
        }
        while let Some((time, key)) = self.cleanup_timers.pop_due(limit) {
            self.clean_up(&key, time);
        }
    }
}

impl<K, T, O, KS, L> Operator<T, O> for AlignedWindowOperator<K, T, O, KS, L>
where
    K: Key,
    T: 'static,
    O: 'static,
    KS: Fn(&T) -> K + 'static,
    L: WindowLogic<K, TimeWindow, T, O>,
{
    fn bind_metrics(&mut self, metrics: &Arc<OperatorMetrics>) {
        self.late.dropped = Some(metrics.late_records_dropped.clone());
        self.operator = metrics.name.as_str().into();
    }

    fn open(&mut self, _ctx: &RuntimeContext) {}

    fn process_element(&mut self, record: T, timestamp: i64, out: &mut Emitter<O>) {
        let time = element_time(self.domain, timestamp, &self.operator);
        let geometry = self.geometry;
        let (pane_start, last_start) = match self.recent_pane {
            (start, end, last) if start <= time && time < end => (start, last),
            _ => {
                let start = geometry.pane_start(time);
                let last = geometry.last_window_start(start);
                self.recent_pane = (start, start.saturating_add(geometry.pane), last);
                (start, last)
            }
        };
        let last_window = TimeWindow::new(last_start, last_start.saturating_add(geometry.size));
        if self.is_expired(&last_window) {
            self.late.handle(record, timestamp, out);
            return;
        }
        let key = (self.key_selector)(&record);
        let logic = &mut self.logic;
        let (acc, created) = self
            .keys
            .entry(key.clone())
            .or_default()
            .get_mut_or_insert_with(pane_start, || logic.create());
        logic.add(acc, record);
        if created {
            // A new pane: make sure every window holding it will fire (and be cleaned up).
            for window in geometry.windows_of_pane(pane_start) {
                let max = window.max_timestamp();
                if self.domain == TimeDomain::EventTime
                    && max.saturating_add(self.allowed_lateness) <= self.watermark.0
                {
                    continue;
                }
                // A window the watermark has passed (within its lateness) fires below, at
                // once; a timer would fire it a second time.
                if self.domain == TimeDomain::ProcessingTime || max > self.watermark.0 {
                    self.fire_timers.register(&key, max);
                }
                if self.allowed_lateness > 0 {
                    self.cleanup_timers
                        .register(&key, max.saturating_add(self.allowed_lateness));
                }
            }
        }
        // A record for windows the watermark has already passed (but within the allowed
        // lateness) fires them again at once, with the record included.
        // Windows come latest first: skip those still open, stop at the first expired one.
        if self.domain == TimeDomain::EventTime && self.allowed_lateness > 0 {
            let watermark = self.watermark.0;
            let late_windows: Vec<TimeWindow> = geometry
                .windows_of_pane(pane_start)
                .skip_while(|w| w.max_timestamp() > watermark)
                .take_while(|w| !self.is_expired(w))
                .collect();
            for window in late_windows {
                self.fire_window(&key, window, out);
            }
        }
    }

    fn on_watermark(&mut self, watermark: Watermark, out: &mut Emitter<O>) {
        self.watermark = watermark;
        if self.domain == TimeDomain::EventTime {
            self.advance(watermark.0, out);
        }
    }

    fn on_processing_time(&mut self, now: i64, out: &mut Emitter<O>) {
        if self.domain == TimeDomain::ProcessingTime {
            self.advance(now, out);
        }
    }

    fn next_processing_time(&self) -> Option<i64> {
        match self.domain {
            TimeDomain::ProcessingTime => self.fire_timers.next_time(),
            TimeDomain::EventTime => None,
        }
    }

    /// Processing-time windows still open when the input ends fire now (event-time windows
    /// have already fired on the final watermark).
    fn finish(&mut self, out: &mut Emitter<O>) {
        if self.domain == TimeDomain::ProcessingTime {
            self.advance(i64::MAX, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pane_lists_stay_ordered_inline_or_not() {
        let mut list = PaneList::default();
        for start in [20, 10, 30, 20, 0] {
            let (acc, _) = list.get_mut_or_insert_with(start, || 0u32);
            *acc += 1;
        }
        let panes: Vec<(i64, u32)> = list.iter().copied().collect();
        assert_eq!(panes, vec![(0, 1), (10, 1), (20, 2), (30, 1)]);
        list.retain(|(start, _)| *start >= 30);
        assert!(
            list.single.is_some() && list.many.is_empty(),
            "one pane goes inline"
        );
        assert!(
            !list.get_mut_or_insert_with(30, || 9).1,
            "found, not created"
        );
        list.retain(|_| false);
        assert!(list.is_empty());
    }

    #[test]
    fn panes_of_a_sliding_window() {
        let g = Geometry::new(10_000, 2_000, 0);
        assert_eq!(g.pane, 2_000);
        assert_eq!(g.pane_start(12_345), 12_000);
        let windows: Vec<TimeWindow> = g.windows_of_pane(12_000).collect();
        assert_eq!(
            windows,
            vec![
                TimeWindow::new(12_000, 22_000),
                TimeWindow::new(10_000, 20_000),
                TimeWindow::new(8_000, 18_000),
                TimeWindow::new(6_000, 16_000),
                TimeWindow::new(4_000, 14_000),
            ]
        );
        assert_eq!(g.pane_last_max_timestamp(12_000), 21_999);

        let odd = Geometry::new(10_000, 4_000, 0);
        assert_eq!(odd.pane, 2_000);
        let windows: Vec<TimeWindow> = odd.windows_of_pane(10_000).collect();
        assert_eq!(
            windows,
            vec![
                TimeWindow::new(8_000, 18_000),
                TimeWindow::new(4_000, 14_000)
            ]
        );

        let tumbling = Geometry::new(10_000, 10_000, 0);
        assert_eq!(
            tumbling.windows_of_pane(30_000).collect::<Vec<_>>(),
            vec![TimeWindow::new(30_000, 40_000)]
        );
    }
}
