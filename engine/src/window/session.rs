//! Session windows: per key, a record opens the window `[t, t + gap)`, and windows that
//! overlap merge (their accumulators merged, their timers replaced by the merged window's).
//! A key's latest session sits inline in its map entry (in-order input extends it without
//! chasing a pointer), earlier ones in a `BTreeMap` by start, so finding the ones a record
//! overlaps is O(log n + merged).

use std::collections::hash_map::Entry;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use weir_state::{KeyedSnapshotEntries, StateError, StateKind, StateValueCodec, WriterState};

use super::assigner::SessionGap;
use super::checkpoint::{
    AccCodec, KeyedScope, Layout, WindowSnapshot, CLEANUP_TIMERS, FIRE_TIMERS,
};
use super::deferred::{Changes, KeyContents, KeyWriter, Marks, TrackedKey, STEP_BYTES};
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
    /// The latest end (`max_timestamp()`) of a session of the key that the restored
    /// checkpoint says fired (it held the session's clean-up timer): the key's sessions ending
    /// at or before it fired. The watermark is not restored, so until it passes this, it alone
    /// would not tell (and another old subtask's watermark says nothing of this key's).
    restored_fired: i64,
    /// For the snapshots written after their barrier ([`Changes`]).
    marks: Marks,
}

impl<A> Default for Sessions<A> {
    fn default() -> Self {
        Sessions {
            latest: None,
            earlier: BTreeMap::new(),
            restored_fired: i64::MIN,
            marks: Marks::default(),
        }
    }
}

impl<A> TrackedKey for Sessions<A> {
    fn marks(&self) -> &Marks {
        &self.marks
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
    changes: Changes<K, Sessions<L::Acc>, SessionWriter<K, L::Acc>>,
    /// The input ended (`Operator::finish`).
    finished: bool,
    /// Set when opened.
    scope: Option<KeyedScope>,
    _output: PhantomData<fn() -> O>,
}

/// What a snapshot holds of a key: its sessions and their timers (`checkpoint.rs` has the
/// layout), each session's timer as it stood at the barrier: its fire timer at its end, or —
/// once fired (the watermark passed its end) and kept for its allowed lateness — its clean-up
/// timer. (Timers are set lazily, see `advance`: one set while a session ended sooner moves on
/// to these when it comes due, so these are what it comes to.)
struct SessionContents {
    fire_timers: (WriterState, StateValueCodec<i64>),
    cleanup_timers: (WriterState, StateValueCodec<i64>),
    /// In event time, the watermark at the barrier: sessions ending at or before it fired.
    fired_until: Option<i64>,
    allowed_lateness: i64,
}

/// The snapshots' writer.
type SessionWriter<K, A> = KeyWriter<K, TimeWindow, A, SessionContents>;

impl<K: Key, A> KeyContents<K, Sessions<A>, TimeWindow, A> for SessionContents {
    fn put(
        &self,
        snapshot: &mut WindowSnapshot<K, TimeWindow, A>,
        key: &K,
        sessions: &Sessions<A>,
    ) -> Result<(), StateError> {
        snapshot.key(key)?;
        for (start, (end, acc)) in sessions.iter() {
            snapshot.contents(Some(&TimeWindow::new(start, *end)), acc)?;
        }
        // In event time, sessions the watermark at the barrier passed fired, and so did those
        // the restored checkpoint says fired.
        let fired_until = self
            .fired_until
            .map(|watermark| watermark.max(sessions.restored_fired));
        for (start, (end, _)) in sessions.iter() {
            let max = TimeWindow::new(start, *end).max_timestamp();
            match fired_until {
                Some(fired_until) if max <= fired_until => {
                    if self.allowed_lateness > 0 {
                        let at = max.saturating_add(self.allowed_lateness);
                        snapshot.put_timer(&self.cleanup_timers, at)?;
                    }
                }
                _ => snapshot.put_timer(&self.fire_timers, max)?,
            }
        }
        Ok(())
    }
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
            changes: Changes::untracked(),
            finished: false,
            scope: None,
            _output: PhantomData,
        }
    }

    /// Writes every key's sessions and their timers (`checkpoint.rs` has the layout) — or,
    /// checkpointing incrementally, those of the keys changed since the last checkpoint, and
    /// which went (`checkpoint::chain`) — after the barrier, in pieces (`deferred.rs`).
    fn write_snapshot(&mut self, snapshot: &mut OperatorSnapshot) -> Result<(), StateError> {
        let scope = self.scope.expect("opened");
        let layout = self.logic.layout(snapshot.is_savepoint());
        let mut writer = super::checkpoint::snapshot::<K, TimeWindow, L::Acc>(&scope, layout.codec);
        let fire_timers = writer.add_state::<i64>(FIRE_TIMERS, StateKind::List);
        let cleanup_timers = writer.add_state::<i64>(CLEANUP_TIMERS, StateKind::List);
        let contents = SessionContents {
            fire_timers,
            cleanup_timers,
            fired_until: (self.domain == TimeDomain::EventTime).then_some(self.watermark.0),
            allowed_lateness: self.allowed_lateness,
        };
        let writer = KeyWriter::new(writer, contents);
        self.changes
            .take(&self.keys, writer, snapshot, layout.part, self.finished)?;
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
        restored.for_each(FIRE_TIMERS, StateKind::List, &times, |key, _, time| {
            self.fire_timers.register(key, time);
            Ok(())
        })?;
        let (cleanup_timers, keys) = (&mut self.cleanup_timers, &mut self.keys);
        restored.for_each(CLEANUP_TIMERS, StateKind::List, &times, |key, _, time| {
            cleanup_timers.register(key, time);
            if let Some(sessions) = keys.get_mut(key) {
                let fired = time.saturating_sub(self.allowed_lateness);
                sessions.restored_fired = sessions.restored_fired.max(fired);
            }
            Ok(())
        })?;
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
            self.changes.record(key, sessions);
            sessions.remove(start);
            if sessions.is_empty() {
                self.keys.remove(key);
                self.changes.gone(key);
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
                    // Its timers change (a key's snapshot has the timers as they stand).
                    if let Some(sessions) = self.keys.get_mut(&key) {
                        self.changes.record(&key, sessions);
                    }
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
        self.changes = Changes::opened(ctx, self.logic.layout(false).part);
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
            self.changes.record(&key, sessions);
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
        let sessions = match self.keys.entry(key.clone()) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => {
                let sessions = entry.insert(Sessions::default());
                self.changes.added(sessions);
                sessions
            }
        };
        self.changes.record(&key, sessions);
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
        self.changes.write_some(&self.keys, STEP_BYTES);
        if self.domain == TimeDomain::ProcessingTime {
            self.advance(now, out);
        }
    }

    /// While a snapshot written after its barrier has keys left, now: the task gives the
    /// operator a turn between batches of records to write some (`deferred.rs`).
    fn next_processing_time(&self) -> Option<i64> {
        if self.changes.writing() {
            return Some(i64::MIN);
        }
        match self.domain {
            TimeDomain::ProcessingTime => self.fire_timers.next_time(),
            TimeDomain::EventTime => None,
        }
    }

    /// Processing-time sessions still open when the input ends fire now.
    fn finish(&mut self, out: &mut Emitter<O>) {
        self.finished = true;
        // No turn need follow the input's end (a source task's chain gets none).
        self.changes.finish_pending(&self.keys);
        if self.domain == TimeDomain::ProcessingTime {
            self.advance(i64::MAX, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::chain::KeyedChain;
    use crate::checkpoint::task_state::{Part, PART_KEYED};
    use crate::checkpoint::SnapshotKind;
    use crate::operator::SideOutputs;
    use crate::window::deferred::{encode_while_fed, finish_link, timed_input, WrittenInPieces};

    type Counting = SessionWindowOperator<
        u8,
        (u8, u64),
        (u8, i64, i64, u64),
        fn(&(u8, u64)) -> u8,
        super::super::function::ReduceLogic<
            fn((u8, u64), (u8, u64)) -> (u8, u64),
            fn(&u8, &TimeWindow, (u8, u64)) -> (u8, i64, i64, u64),
        >,
    >;

    impl WrittenInPieces for Counting {
        fn take_snapshot(&mut self, snapshot: &mut OperatorSnapshot) {
            self.write_snapshot(snapshot).expect("a snapshot");
        }

        fn write_some_keys(&mut self, budget: usize) {
            self.changes.write_some(&self.keys, budget);
        }
    }

    /// An event-time session operator counting each key's records per session: (key, start,
    /// end, count) per firing.
    fn counting(gap: i64, lateness: i64) -> Counting {
        let logic = super::super::function::ReduceLogic {
            reduce: (|a, b| (a.0, a.1 + b.1)) as fn((u8, u64), (u8, u64)) -> (u8, u64),
            post: (|key: &u8, w: &TimeWindow, r: (u8, u64)| (*key, w.start, w.end, r.1))
                as fn(&u8, &TimeWindow, (u8, u64)) -> (u8, i64, i64, u64),
        };
        let mut op = SessionWindowOperator::new(
            (|r| r.0) as fn(&(u8, u64)) -> u8,
            logic,
            SessionGap::Static(gap),
            TimeDomain::EventTime,
            lateness,
            None,
        );
        op.scope = Some(KeyedScope::single(16));
        op
    }

    fn feed(
        op: &mut Counting,
        input: &[Result<(u8, i64), i64>],
        out: &mut Emitter<(u8, i64, i64, u64)>,
    ) {
        for item in input {
            match *item {
                Ok((key, ts)) => op.process_element((key, 1), ts, out),
                Err(w) if w > op.watermark.0 => op.on_watermark(Watermark(w), out),
                Err(_) => {}
            }
        }
    }

    fn fired_whole(
        gap: i64,
        lateness: i64,
        input: &[Result<(u8, i64), i64>],
    ) -> Vec<(u8, i64, i64, u64)> {
        let mut op = counting(gap, lateness);
        let mut out = Emitter::new(0, SideOutputs::default());
        feed(&mut op, input, &mut out);
        let mut fired = out.main.records.clone();
        fired.sort_unstable();
        fired
    }

    /// What a new operator restored from `restored` fires on `rest` of the input after it sees
    /// the `watermark` the checkpointed one had again, added to `before` (the checkpointed
    /// one's output before the checkpoint); sorted.
    fn fired_after_restore(
        (gap, lateness): (i64, i64),
        restored: &KeyedSnapshotEntries<u8, TimeWindow>,
        watermark: Watermark,
        rest: &[Result<(u8, i64), i64>],
        before: Vec<(u8, i64, i64, u64)>,
    ) -> Result<Vec<(u8, i64, i64, u64)>, proptest::test_runner::TestCaseError> {
        let mut restarted = counting(gap, lateness);
        let codec = restarted.logic.acc_codec();
        restarted.restore(restored, codec).expect("restored");
        // Checkpointed again before any watermark (as after a restart whose inputs have not
        // all sent one), and restored from that.
        let mut again = OperatorSnapshot::new(SnapshotKind::Checkpoint);
        restarted.write_snapshot(&mut again).expect("a snapshot");
        let again = super::super::checkpoint::read_back(again, 16);
        let mut second = counting(gap, lateness);
        second.restore(&again, codec).expect("restored again");
        let mut after = Emitter::new(0, SideOutputs::default());
        after.main.records = before;
        if watermark > Watermark::MIN {
            second.on_watermark(watermark, &mut after);
        }
        feed(&mut second, rest, &mut after);
        proptest::prop_assert!(
            second.keys.is_empty(),
            "state left after the last watermark"
        );
        let mut fired = after.main.records;
        fired.sort_unstable();
        Ok(fired)
    }

    proptest::proptest! {
        /// Sessions checkpointed incrementally — a full snapshot, then deltas of the keys whose
        /// sessions or timers changed, or that went — at several points of the input, each
        /// link written after its barrier while the operator goes on (a piece of `budget`
        /// bytes after each record): an operator restored from what the chain merges into
        /// fires, with the original's output before the last checkpoint, exactly what the
        /// original fires.
        #[test]
        fn sessions_restored_from_deltas_fire_what_the_original_fires(
            gap in 1i64..20,
            lateness in proptest::prop_oneof![proptest::strategy::Just(0i64), 0i64..40],
            steps in proptest::collection::vec((0u8..4, 0u8..6, -40i64..10), 1..120),
            mut cuts in proptest::collection::vec(0usize..120, 1..6),
            budget in 1usize..200,
        ) {
            use crate::checkpoint::chain::ChainLink;
            let input = timed_input(steps, 9);
            let mut first = counting(gap, lateness);
            first.changes = Changes::tracked(Some(KeyedChain::deltas_only(PART_KEYED)));
            let mut out = Emitter::new(0, SideOutputs::default());
            cuts.iter_mut().for_each(|cut| *cut = (*cut).min(input.len()));
            cuts.sort_unstable();
            let mut chain: Vec<Vec<u8>> = Vec::new();
            let mut writing: std::collections::VecDeque<(ChainLink, Vec<u8>)> = Default::default();
            let mut feed_while_writing = |op: &mut Counting, items: &[Result<(u8, i64), i64>], out: &mut Emitter<_>, writing: &mut std::collections::VecDeque<(ChainLink, Vec<u8>)>| {
                for item in items {
                    feed(op, std::slice::from_ref(item), out);
                    op.changes.write_some(&op.keys, budget);
                    if let Some((link, bytes)) = writing.front_mut() {
                        if !link.step(bytes, budget) {
                            let (link, bytes) = writing.pop_front().expect("a link");
                            finish_link(&mut chain, link, bytes);
                        }
                    }
                }
            };
            let mut at = 0;
            for &cut in &cuts {
                feed_while_writing(&mut first, &input[at..cut], &mut out, &mut writing);
                at = cut;
                let mut snapshot = OperatorSnapshot::default();
                first.write_snapshot(&mut snapshot).expect("a snapshot");
                for (_, part) in snapshot.parts {
                    let Part::Chained(link) = part else {
                        panic!("a session part that is not a link");
                    };
                    writing.push_back((link, Vec::new()));
                }
            }
            let (watermark, before) = (first.watermark, out.main.records.clone());
            feed_while_writing(&mut first, &input[at..], &mut out, &mut writing);
            first.changes.finish_pending(&first.keys);
            while let Some((link, bytes)) = writing.pop_front() {
                finish_link(&mut chain, link, bytes);
            }
            let links: Vec<&[u8]> = chain.iter().map(Vec::as_slice).collect();
            let merged = weir_state::merge_keyed_chain(&links).expect("the chain merges");
            let restored = KeyedScope::single(16).read(&[merged.into()]).expect("it reads back");
            let fired = fired_after_restore((gap, lateness), &restored, watermark, &input[at..], before)?;
            proptest::prop_assert_eq!(fired, fired_whole(gap, lateness, &input));
        }
    }

    /// Restored from two old subtasks whose watermarks differ, then checkpointed again before
    /// any watermark: a session one of them had fired (kept for its lateness) is written as
    /// fired, and one the other had not fired — ending earlier than the first — as not fired,
    /// so restored once more, the operator fires the second and not the first again.
    #[test]
    fn what_fired_is_told_per_key_after_a_restore_from_subtasks_with_other_watermarks() {
        let (gap, lateness) = (10, 100);
        let scopes = [KeyedScope::subtask(16, 2, 0), KeyedScope::subtask(16, 2, 1)];
        let key_of = |scope: &KeyedScope| (0u8..=255).find(|key| scope.holds(key)).expect("a key");
        let (fired_key, open_key) = (key_of(&scopes[0]), key_of(&scopes[1]));
        let mut parts = Vec::new();
        // The first subtask's session [0, 20) fired at watermark 30; the second's [0, 10) has
        // not, at watermark 5.
        for (scope, key, ts, watermark) in
            [(scopes[0], fired_key, 10, 30), (scopes[1], open_key, 0, 5)]
        {
            let mut op = counting(gap, lateness);
            op.scope = Some(scope);
            let mut out = Emitter::new(0, SideOutputs::default());
            feed(&mut op, &[Ok((key, ts)), Err(watermark)], &mut out);
            let fired = out.main.records.len();
            assert_eq!(fired, usize::from(key == fired_key), "as set up");
            let mut snapshot = OperatorSnapshot::new(SnapshotKind::Checkpoint);
            op.write_snapshot(&mut snapshot).expect("a snapshot");
            let Some((_, Part::Bytes(bytes))) = snapshot.parts.pop() else {
                panic!("written at once");
            };
            parts.push(bytes::Bytes::from(bytes));
        }
        let restored = KeyedScope::single(16).read(&parts).expect("both read back");
        let mut first = counting(gap, lateness);
        let codec = first.logic.acc_codec();
        first.restore(&restored, codec).expect("restored");
        let mut again = OperatorSnapshot::new(SnapshotKind::Checkpoint);
        first
            .write_snapshot(&mut again)
            .expect("a snapshot before any watermark");
        let again = super::super::checkpoint::read_back(again, 16);
        let mut second = counting(gap, lateness);
        second.restore(&again, codec).expect("restored again");
        let mut out = Emitter::new(0, SideOutputs::default());
        second.on_watermark(Watermark(i64::MAX), &mut out);
        assert_eq!(out.main.records, [(open_key, 0, 10, 1)]);
    }

    proptest::proptest! {
        /// A snapshot of sessions written after its barrier holds the sessions and timers at
        /// the barrier, however the operator changes while it is written: records and
        /// watermarks go on between the writer's pieces (sessions growing, merging, firing,
        /// kept for their lateness and dropped), and maybe a second barrier comes before the
        /// writer is done. An operator restored from it fires, with the original's output
        /// before the barrier, what the original fires. A checkpoint without incremental
        /// links, or a savepoint next to a chain.
        #[test]
        fn a_session_snapshot_written_after_its_barrier_holds_the_state_at_the_barrier(
            gap in 1i64..20,
            lateness in proptest::prop_oneof![proptest::strategy::Just(0i64), 0i64..40],
            steps in proptest::collection::vec((0u8..4, 0u8..6, -40i64..10), 1..120),
            cut in 0usize..120,
            budget in 1usize..120,
            chained in proptest::prelude::any::<bool>(),
            second_barrier_after in proptest::option::of(0usize..40),
        ) {
            let input = timed_input(steps, 9);
            let cut = cut.min(input.len());
            let mut first = counting(gap, lateness);
            first.changes = Changes::tracked(
                chained.then(|| KeyedChain::deltas_only(PART_KEYED)),
            );
            let mut out = Emitter::new(0, SideOutputs::default());
            feed(&mut first, &input[..cut], &mut out);
            let kind = if chained { SnapshotKind::Savepoint } else { SnapshotKind::Checkpoint };
            let mut snapshot = OperatorSnapshot::new(kind);
            first.write_snapshot(&mut snapshot).expect("a snapshot");
            let (watermark, before) = (first.watermark, out.main.records.clone());
            let rest = &input[cut..];
            let bytes = encode_while_fed(snapshot, budget, &mut first, rest, second_barrier_after, |op, item| {
                feed(op, std::slice::from_ref(item), &mut out)
            });
            let restored = KeyedScope::single(16).read(&[bytes.into()]).expect("it reads back");
            let fired = fired_after_restore((gap, lateness), &restored, watermark, &input[cut..], before)?;
            proptest::prop_assert_eq!(fired, fired_whole(gap, lateness, &input));
        }
    }

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
