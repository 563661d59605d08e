//! Session windows: per key, a record opens the window `[t, t + gap)`, and windows that
//! overlap merge (their accumulators merged, their timers replaced by the merged window's).
//! A key's latest session sits inline in its map entry (in-order input extends it without
//! chasing a pointer), earlier ones in a `BTreeMap` by start, so finding the ones a record
//! overlaps is O(log n + merged).

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use weir_state::{KeyedSnapshotEntries, StateError, StateKind, StateValueCodec};

use super::assigner::SessionGap;
use super::checkpoint::{AccCodec, KeyedScope, Layout, CLEANUP_TIMERS, FIRE_TIMERS};
use super::function::WindowLogic;
use super::{element_time, KeyMap, LateData, TimeWindow, Window};
use crate::checkpoint::task_state::OperatorSnapshot;
use crate::metrics::OperatorMetrics;
use crate::operator::{Emitter, Operator, OutputTag, RuntimeContext};
use crate::record::{Key, Watermark};
use crate::time::{TimeDomain, TimerQueue};

/// A key's sessions, start → (end, accumulator): the latest-starting one inline, the others
/// in a map. Invariant: no latest session, no others.
struct Sessions<A> {
    latest: Option<(i64, (i64, A))>,
    earlier: BTreeMap<i64, (i64, A)>,
}

impl<A> Default for Sessions<A> {
    fn default() -> Self {
        Sessions {
            latest: None,
            earlier: BTreeMap::new(),
        }
    }
}

impl<A> Sessions<A> {
    /// The sessions starting at or before `to`, latest first.
    fn starting_until(&self, to: i64) -> impl Iterator<Item = (i64, &(i64, A))> {
        let latest = self.latest.as_ref().filter(|(start, _)| *start <= to);
        latest
            .map(|(start, session)| (*start, session))
            .into_iter()
            .chain(
                self.earlier
                    .range(..=to)
                    .rev()
                    .map(|(s, session)| (*s, session)),
            )
    }

    /// The latest session starting at or before `to`.
    #[inline]
    fn last_starting_until_mut(&mut self, to: i64) -> Option<(i64, &mut (i64, A))> {
        match &mut self.latest {
            Some((start, session)) if *start <= to => Some((*start, session)),
            _ => self
                .earlier
                .range_mut(..=to)
                .next_back()
                .map(|(start, session)| (*start, session)),
        }
    }

    fn get(&self, start: i64) -> Option<&(i64, A)> {
        match &self.latest {
            Some((latest, session)) if *latest == start => Some(session),
            _ => self.earlier.get(&start),
        }
    }

    fn get_mut(&mut self, start: i64) -> Option<&mut (i64, A)> {
        match &mut self.latest {
            Some((latest, session)) if *latest == start => Some(session),
            _ => self.earlier.get_mut(&start),
        }
    }

    /// Every session: start, end and accumulator.
    fn iter(&self) -> impl Iterator<Item = (i64, &(i64, A))> {
        self.earlier
            .iter()
            .map(|(start, session)| (*start, session))
            .chain(
                self.latest
                    .as_ref()
                    .map(|(start, session)| (*start, session)),
            )
    }

    fn insert(&mut self, start: i64, session: (i64, A)) {
        match &self.latest {
            Some((latest, _)) if *latest > start => {
                self.earlier.insert(start, session);
            }
            _ => {
                if let Some((latest, previous)) = self.latest.replace((start, session)) {
                    // Never equal: a session starting there would have been merged.
                    self.earlier.insert(latest, previous);
                }
            }
        }
    }

    fn remove(&mut self, start: i64) -> Option<(i64, A)> {
        match &self.latest {
            Some((latest, _)) if *latest == start => {
                let (_, session) = std::mem::replace(&mut self.latest, self.earlier.pop_last())?;
                Some(session)
            }
            _ => self.earlier.remove(&start),
        }
    }

    fn is_empty(&self) -> bool {
        self.latest.is_none()
    }
}

pub(crate) struct SessionWindowOperator<K, T, O, KS, L: WindowLogic<K, TimeWindow, T, O>> {
    key_selector: KS,
    logic: L,
    gap: SessionGap<T>,
    domain: TimeDomain,
    allowed_lateness: i64,
    late: LateData<T>,
    operator: Arc<str>,
    keys: KeyMap<K, Sessions<L::Acc>>,
    fire_timers: TimerQueue<K>,
    cleanup_timers: TimerQueue<K>,
    watermark: Watermark,
    /// Set when opened.
    scope: Option<KeyedScope>,
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
            keys: KeyMap::default(),
            fire_timers: TimerQueue::default(),
            cleanup_timers: TimerQueue::default(),
            watermark: Watermark::MIN,
            scope: None,
            _output: PhantomData,
        }
    }

    /// Writes every key's sessions and their timers (`checkpoint.rs` has the layout).
    fn write_snapshot(&self, snapshot: &mut OperatorSnapshot) -> Result<(), StateError> {
        let scope = self.scope.expect("opened");
        let layout = self.logic.layout(snapshot.is_savepoint());
        let mut writer = super::checkpoint::snapshot::<K, TimeWindow, L::Acc>(&scope, layout.codec);
        let fire_timers = writer.add_state::<i64>(FIRE_TIMERS, StateKind::List);
        let cleanup_timers = writer.add_state::<i64>(CLEANUP_TIMERS, StateKind::List);
        for (key, sessions) in &self.keys {
            writer.key(key)?;
            for (start, (end, acc)) in sessions.iter() {
                writer.contents(Some(&TimeWindow::new(start, *end)), acc)?;
            }
        }
        let mut result = Ok(());
        for (timers, state) in [
            (&self.fire_timers, &fire_timers),
            (&self.cleanup_timers, &cleanup_timers),
        ] {
            timers.for_each(|time, key| {
                if result.is_ok() {
                    result = writer.key(key).and_then(|()| writer.put_timer(state, time));
                }
            });
        }
        result?;
        snapshot.add(layout.part, writer.finish()?);
        self.logic.snapshot_contents(snapshot)
    }

    /// Takes back the sessions and timers of this subtask's key groups from the checkpoint
    /// the job resumes from, its accumulators written with `codec`.
    fn restore(
        &mut self,
        restored: &KeyedSnapshotEntries<K, TimeWindow>,
        codec: AccCodec<L::Acc>,
    ) -> Result<(), StateError> {
        let (keys, logic) = (&mut self.keys, &self.logic);
        codec.restore(restored, |key, window, bytes| {
            let window = window.ok_or_else(|| {
                super::checkpoint::foreign_window(format!(
                    "the session window operator's checkpoint holds contents of key {key:?} \
                     without their session"
                ))
            })?;
            let sessions = keys.entry(key.clone()).or_default();
            if sessions.get(window.start).is_none() {
                sessions.insert(window.start, (window.end, logic.create(key)));
            }
            let (_, acc) = sessions.get_mut(window.start).expect("inserted above");
            codec.decode_into(acc, bytes)
        })?;
        let times = StateValueCodec::<i64>::of();
        for (name, timers) in [
            (FIRE_TIMERS, &mut self.fire_timers),
            (CLEANUP_TIMERS, &mut self.cleanup_timers),
        ] {
            restored.for_each(name, StateKind::List, &times, |key, _, time| {
                timers.register(key, time);
                Ok(())
            })?;
        }
        Ok(())
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
        let (start, &(end, _)) = sessions.starting_until(time.saturating_add(1)).next()?;
        (end.saturating_sub(1) >= time).then_some((start, end))
    }

    fn remove_session(&mut self, key: &K, start: i64) {
        if let Some(sessions) = self.keys.get_mut(key) {
            sessions.remove(start);
            if sessions.is_empty() {
                self.keys.remove(key);
            }
        }
    }

    fn fire(&mut self, key: &K, start: i64, out: &mut Emitter<O>) {
        let Some((end, acc)) = self.keys.get(key).and_then(|s| s.get(start)) else {
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

    fn open(&mut self, ctx: &RuntimeContext) {
        let Layout { part, codec } = self.logic.restored_layout(ctx);
        let scope = super::checkpoint::open(ctx, "sessions", part, |restored| {
            self.restore(restored, codec)
        });
        self.scope = Some(scope);
    }

    fn snapshot_state(&mut self, snapshot: &mut OperatorSnapshot) -> Result<(), String> {
        self.write_snapshot(snapshot)
            .map_err(|error| error.to_string())
    }

    fn process_element(&mut self, record: T, timestamp: i64, out: &mut Emitter<O>) {
        let time = element_time(self.domain, timestamp, &self.operator);
        let gap = self.gap.of(&record);
        let key = (self.key_selector)(&record);
        let mut merged = TimeWindow::new(time, time.saturating_add(gap));
        if let Some(sessions) = self.keys.get_mut(&key) {
            // The common case: the latest session starting before the new window ends starts
            // at or before the record and reaches it. No other session overlaps then: none
            // starts later within the new window, and sessions never touch, so earlier ones
            // end before this one starts.
            if let Some((start, (end, acc))) = sessions.last_starting_until_mut(merged.end) {
                if start <= merged.start && *end >= merged.start {
                    let grown = TimeWindow::new(start, (*end).max(merged.end));
                    let event_time = self.domain == TimeDomain::EventTime;
                    let watermark = self.watermark.0;
                    let past = |lateness: i64| {
                        event_time && grown.max_timestamp().saturating_add(lateness) <= watermark
                    };
                    if past(self.allowed_lateness) {
                        let records = self.logic.weight(&record);
                        self.late.handle(record, timestamp, records, out);
                        return;
                    }
                    // Update it in place; its timer catches up when it comes due (see
                    // `advance`).
                    let fired_before = end.saturating_sub(1) <= watermark;
                    *end = grown.end;
                    self.logic.add(acc, record);
                    if past(0) {
                        self.fire(&key, start, out);
                    } else if fired_before && event_time {
                        // It fired already (kept for its lateness) and its timer is spent: it
                        // needs one for its new end.
                        self.fire_timers.register(&key, grown.max_timestamp());
                    }
                    return;
                }
            }
        }
        // Sessions overlapping the new window (touching counts, as in Flink), latest first.
        let overlapping: Vec<i64> = match self.keys.get(&key) {
            None => Vec::new(),
            Some(sessions) => sessions
                .starting_until(merged.end)
                .take_while(|(_, (end, _))| *end >= merged.start)
                .map(|(start, _)| start)
                .collect(),
        };
        if let Some(sessions) = self.keys.get(&key) {
            for start in &overlapping {
                merged.start = merged.start.min(*start);
                merged.end = merged.end.max(sessions.get(*start).expect("found above").0);
            }
        }
        if self.is_past(&merged, self.allowed_lateness) {
            let records = self.logic.weight(&record);
            self.late.handle(record, timestamp, records, out);
            return;
        }
        let mut acc = self.logic.create(&key);
        let sessions = self.keys.entry(key.clone()).or_default();
        for start in overlapping.iter().rev() {
            let (end, old) = sessions.remove(*start).expect("found above");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_session_stays_inline_whatever_the_order() {
        let mut sessions = Sessions::default();
        for start in [20, 0, 40, 10] {
            sessions.insert(start, (start + 5, start as u32));
        }
        assert_eq!(sessions.latest, Some((40, (45, 40))));
        let until_25: Vec<i64> = sessions.starting_until(25).map(|(s, _)| s).collect();
        assert_eq!(until_25, vec![20, 10, 0], "latest first");
        assert_eq!(sessions.starting_until(40).next().map(|(s, _)| s), Some(40));
        assert_eq!(
            sessions.last_starting_until_mut(39).map(|(s, _)| s),
            Some(20)
        );
        assert_eq!(sessions.get(10), Some(&(15, 10)));
        assert_eq!(sessions.remove(40), Some((45, 40)));
        assert_eq!(
            sessions.latest,
            Some((20, (25, 20))),
            "the next moves inline"
        );
        assert_eq!(sessions.remove(0), Some((5, 0)));
        assert_eq!(sessions.remove(0), None);
        sessions.remove(20);
        sessions.remove(10);
        assert!(sessions.is_empty() && sessions.earlier.is_empty());
    }
}
