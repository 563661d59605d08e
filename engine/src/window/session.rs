//! Session windows: per key, a record opens the window `[t, t + gap)`, and windows that
//! overlap merge (their accumulators merged, their timers replaced by the merged window's).
//! A key's sessions sit in a `BTreeMap` by start, so finding the ones a record overlaps is
//! O(log n + merged).

use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::sync::Arc;

use super::assigner::SessionGap;
use super::function::WindowLogic;
use super::{element_time, LateData, TimeWindow, Window};
use crate::metrics::OperatorMetrics;
use crate::operator::{Emitter, Operator, OutputTag};
use crate::record::{Key, Watermark};
use crate::time::{TimeDomain, TimerQueue};

/// A key's sessions: start → (end, accumulator).
type Sessions<A> = BTreeMap<i64, (i64, A)>;

pub(crate) struct SessionWindowOperator<K, T, O, KS, L: WindowLogic<K, TimeWindow, T, O>> {
    key_selector: KS,
    logic: L,
    gap: SessionGap<T>,
    domain: TimeDomain,
    allowed_lateness: i64,
    late: LateData<T>,
    operator: Arc<str>,
    keys: HashMap<K, Sessions<L::Acc>>,
    fire_timers: TimerQueue<K>,
    cleanup_timers: TimerQueue<K>,
    watermark: Watermark,
    _output: PhantomData<fn() -> O>,
}

impl<K, T, O, KS, L> SessionWindowOperator<K, T, O, KS, L>
where
    K: Key,
    T: 'static,
    L: WindowLogic<K, TimeWindow, T, O>,
{
    pub(crate) fn new(
        key_selector: KS,
        logic: L,
        gap: SessionGap<T>,
        domain: TimeDomain,
        allowed_lateness: i64,
        late_tag: Option<OutputTag<T>>,
    ) -> Self {
        SessionWindowOperator {
            key_selector,
            logic,
            gap,
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
            _output: PhantomData,
        }
    }

    fn is_past(&self, window: &TimeWindow, lateness: i64) -> bool {
        self.domain == TimeDomain::EventTime
            && window.max_timestamp().saturating_add(lateness) <= self.watermark.0
    }

    /// The session of `key` whose timers at `time` (its `max_timestamp()`, or an earlier one
    /// if it grew since the timer was set) belong to it: (start, end).
    fn session_at(&self, key: &K, time: i64) -> Option<(i64, i64)> {
        let sessions = self.keys.get(key)?;
        // `..=time + 1`: a session may be empty at the very end of time (`[MAX, MAX)`);
        // sessions never touch, so no other one starts right after `time`.
        let (&start, &(end, _)) = sessions.range(..=time.saturating_add(1)).next_back()?;
        (end.saturating_sub(1) >= time).then_some((start, end))
    }

    fn remove_session(&mut self, key: &K, start: i64) {
        if let Some(sessions) = self.keys.get_mut(key) {
            sessions.remove(&start);
            if sessions.is_empty() {
                self.keys.remove(key);
            }
        }
    }

    fn fire(&mut self, key: &K, start: i64, out: &mut Emitter<O>) {
        let Some((end, acc)) = self.keys.get(key).and_then(|s| s.get(&start)) else {
            return;
        };
        let window = TimeWindow::new(start, *end);
        self.logic
            .fire(key, &window, &[acc], window.max_timestamp(), &mut out.main);
    }

    /// Fires the sessions whose end the watermark (or clock) passed. Timers are set lazily:
    /// a session that grew after its timer was set gets a new timer when the old one comes
    /// due, instead of one per record.
    fn advance(&mut self, limit: i64, out: &mut Emitter<O>) {
        while let Some((time, key)) = self.fire_timers.pop_due(limit) {
            match self.session_at(&key, time) {
                Some((_, end)) if end - 1 > time => self.fire_timers.register(&key, end - 1),
                Some((start, _)) => {
                    self.fire(&key, start, out);
                    if self.allowed_lateness == 0 {
                        self.remove_session(&key, start);
                    } else {
                        self.cleanup_timers
                            .register(&key, time.saturating_add(self.allowed_lateness));
                    }
                }
                None => {}
            }
        }
        while let Some((time, key)) = self.cleanup_timers.pop_due(limit) {
            let fired_at = time - self.allowed_lateness;
            match self.session_at(&key, fired_at) {
                Some((_, end)) if end - 1 > fired_at => self
                    .cleanup_timers
                    .register(&key, (end - 1).saturating_add(self.allowed_lateness)),
                Some((start, _)) => self.remove_session(&key, start),
                None => {}
            }
        }
    }
}

impl<K, T, O, KS, L> Operator<T, O> for SessionWindowOperator<K, T, O, KS, L>
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

    fn process_element(&mut self, record: T, timestamp: i64, out: &mut Emitter<O>) {
        let time = element_time(self.domain, timestamp, &self.operator);
        let gap = self.gap.of(&record);
        let key = (self.key_selector)(&record);
        let mut merged = TimeWindow::new(time, time.saturating_add(gap));
        // Sessions overlapping the new window (touching counts, as in Flink), latest first.
        let overlapping: Vec<i64> = match self.keys.get(&key) {
            None => Vec::new(),
            Some(sessions) => sessions
                .range(..=merged.end)
                .rev()
                .take_while(|(_, (end, _))| *end >= merged.start)
                .map(|(&start, _)| start)
                .collect(),
        };
        if let Some(sessions) = self.keys.get(&key) {
            for start in &overlapping {
                merged.start = merged.start.min(*start);
                merged.end = merged.end.max(sessions[start].0);
            }
        }
        if self.is_past(&merged, self.allowed_lateness) {
            self.late.handle(record, timestamp, out);
            return;
        }
        if let [start] = overlapping[..] {
            if start == merged.start {
                // The common case: the record extends one session at its end. Update it in
                // place; its timer catches up when it comes due (see `advance`).
                let sessions = self.keys.get_mut(&key).expect("found above");
                let (end, acc) = sessions.get_mut(&start).expect("found above");
                let fired_before = end.saturating_sub(1) <= self.watermark.0;
                *end = merged.end;
                self.logic.add(acc, record);
                if self.is_past(&merged, 0) {
                    self.fire(&key, start, out);
                } else if fired_before && self.domain == TimeDomain::EventTime {
                    // It fired already (kept for its lateness) and its timer is spent: it
                    // needs one for its new end.
                    self.fire_timers.register(&key, merged.max_timestamp());
                }
                return;
            }
        }
        let mut acc = self.logic.create();
        let sessions = self.keys.entry(key.clone()).or_default();
        for start in overlapping.iter().rev() {
            let (end, old) = sessions.remove(start).expect("found above");
            self.fire_timers.delete(&key, end - 1);
            if self.allowed_lateness > 0 {
                self.cleanup_timers
                    .delete(&key, (end - 1).saturating_add(self.allowed_lateness));
            }
            self.logic.merge_owned(&mut acc, old);
        }
        self.logic.add(&mut acc, record);
        sessions.insert(merged.start, (merged.end, acc));
        let max = merged.max_timestamp();
        if self.is_past(&merged, 0) {
            // Late, but within the allowed lateness: fire again at once, and keep the
            // session until its lateness has passed.
            self.fire(&key, merged.start, out);
            self.cleanup_timers
                .register(&key, max.saturating_add(self.allowed_lateness));
        } else {
            self.fire_timers.register(&key, max);
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

    /// Processing-time sessions still open when the input ends fire now.
    fn finish(&mut self, out: &mut Emitter<O>) {
        if self.domain == TimeDomain::ProcessingTime {
            self.advance(i64::MAX, out);
        }
    }
}
