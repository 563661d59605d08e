//! Tumbling and sliding windows, kept per pane.
//!
//! Windows of `size` start every `slide` (tumbling: `slide == size`), aligned to `offset`. The
//! pane is `gcd(size, slide)`: each record is folded into the one pane that holds its
//! timestamp, and a window is the `size / pane` consecutive panes it spans. So a sliding
//! window with an incremental function costs one accumulator update per record, not one per
//! overlapping window; firing merges `size / pane` accumulators per key and window.
//!
//! Per key the live panes sit in a `PaneList` ordered by start: the newest inline in the key's
//! map entry (in-order input: no pointer to chase per record), older ones in a ring behind one
//! pointer (the watermark trails the input, so a key has a few panes waiting to fire). A
//! count's entry is 56 bytes, a record's part of it the first 40 (the key, its checkpoint marks
//! and the newest pane).
//!
//! A key has at most one live fire timer: at the `max_timestamp()` of its next window to fire.
//! Firing it emits that window and moves the timer on to the key's next window that holds one
//! of its panes; a new pane moves it earlier only if the pane's first open window ends sooner
//! (out-of-order input). So a sliding window costs one timer per key and window, not one per
//! pane and window. Every key's windows end at the same instants, so the timers sit in one
//! bucket of keys per instant ([`TimerBuckets`]); a registration the key's timer has moved
//! away from is skipped when its bucket comes due. With allowed lateness each pane also gets
//! a clean-up timer, at `max_timestamp() + lateness` of the last window holding it.

use std::marker::PhantomData;
use std::sync::Arc;

use weir_state::{KeyedSnapshotEntries, StateError, StateKind, StateValueCodec, WriterState};

use super::checkpoint::{
    foreign_window, AccCodec, KeyedScope, Layout, WindowSnapshot, FIRE_TIMERS,
};
use super::deferred::{Changes, KeyContents, KeyWriter, Marks, TrackedKey, STEP_BYTES};
use super::function::WindowLogic;
use super::panes::PaneList;
use super::recycle;
use super::{element_time, KeyMap, LateData, TimeWindow, Window};
use crate::checkpoint::task_state::OperatorSnapshot;
use crate::metrics::OperatorMetrics;
use crate::operator::{Batch, Emitter, Operator, OutputTag, RuntimeContext};
use crate::record::{Key, Watermark};
use crate::time::timers::TimerBuckets;
use crate::time::TimeDomain;

/// A key's timer time when it has no timer. Window ends are at most `i64::MAX - 1`.
const NO_TIMER: i64 = i64::MAX;

/// Whether a timer at `due` comes before the one at `current` (or there is none).
fn sooner(due: i64, current: i64) -> bool {
    current == NO_TIMER || due < current
}

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

    /// The pane length.
    pub(crate) fn pane(&self) -> i64 {
        self.pane
    }

    pub(crate) fn pane_start(&self, timestamp: i64) -> i64 {
        TimeWindow::start_with_offset(timestamp, self.offset, self.pane)
    }

    /// The `max_timestamp()` of the window starting at `start`.
    fn window_max(&self, start: i64) -> i64 {
        start.saturating_add(self.size) - 1
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

    /// The `max_timestamp()` of the first (earliest-starting) window that holds the pane at
    /// `pane_start`.
    fn pane_first_max_timestamp(&self, pane_start: i64) -> i64 {
        let last = self.last_window_start(pane_start);
        // Windows start `slide` apart; those before `last` that still reach past the pane.
        let earlier = (self.size - 1 - (pane_start - last)) / self.slide;
        self.window_max(last - earlier * self.slide)
    }

    /// The `max_timestamp()` of the last window that holds the pane at `pane_start`.
    fn pane_last_max_timestamp(&self, pane_start: i64) -> i64 {
        self.window_max(self.last_window_start(pane_start))
    }

    /// The earliest `max_timestamp()` after `after` of the windows holding the pane at
    /// `pane_start` (`None`: they all end at or before it).
    fn next_window_max(&self, pane_start: i64, after: i64) -> Option<i64> {
        let first = self.pane_first_max_timestamp(pane_start);
        if first > after {
            return Some(first);
        }
        let last = self.pane_last_max_timestamp(pane_start);
        if last <= after {
            return None;
        }
        // Window ends are `slide` apart, from `first` to `last`.
        let steps = (after - first) / self.slide + 1;
        Some(first.saturating_add(steps * self.slide).min(last))
    }
}

/// A key's panes and the time of its live fire timer (`NO_TIMER`: none). What a record reads
/// comes first (`repr(C)`), after the key in its map entry: the marks, then the newest pane;
/// with a count's panes the entry is 56 bytes, the record's part of it 40.
#[repr(C)]
struct KeyState<A> {
    /// For the snapshots written after their barrier ([`Changes`]).
    marks: Marks,
    panes: PaneList<A>,
    fire_at: i64,
}

impl<A> Default for KeyState<A> {
    fn default() -> Self {
        KeyState {
            panes: PaneList::default(),
            fire_at: NO_TIMER,
            marks: Marks::default(),
        }
    }
}

impl<A> TrackedKey for KeyState<A> {
    fn marks(&self) -> &Marks {
        &self.marks
    }
}

/// What a snapshot holds of a key: its panes and fire timer (`checkpoint.rs` has the layout).
struct PaneContents {
    fire_timers: (WriterState, StateValueCodec<i64>),
    /// The panes' length (ms).
    pane: i64,
}

/// The snapshots' writer.
type PaneWriter<K, A> = KeyWriter<K, TimeWindow, A, PaneContents>;

impl PaneContents {
    fn writer<K: Key, A>(scope: &KeyedScope, codec: AccCodec<A>, pane: i64) -> PaneWriter<K, A> {
        let mut snapshot = super::checkpoint::snapshot(scope, codec);
        let fire_timers = snapshot.add_state::<i64>(FIRE_TIMERS, StateKind::List);
        KeyWriter::new(snapshot, PaneContents { fire_timers, pane })
    }
}

impl<K: Key, A> KeyContents<K, KeyState<A>, TimeWindow, A> for PaneContents {
    fn put(
        &self,
        snapshot: &mut WindowSnapshot<K, TimeWindow, A>,
        key: &K,
        state: &KeyState<A>,
    ) -> Result<(), StateError> {
        snapshot.key(key)?;
        for (start, acc) in state.panes.iter() {
            let window = TimeWindow::new(*start, start.saturating_add(self.pane));
            snapshot.contents(Some(&window), acc)?;
        }
        if state.fire_at != NO_TIMER {
            snapshot.put_timer(&self.fire_timers, state.fire_at)?;
        }
        Ok(())
    }
}

/// The pane the last record fell in, `[start, end)`, with what the per-record path needs of
/// it: in-order input hits it almost always and skips the divisions.
#[derive(Clone, Copy, Debug)]
struct RecentPane {
    start: i64,
    end: i64,
    /// `max_timestamp() + lateness` of its last window: its records are late once the
    /// watermark reaches this.
    expires: i64,
    /// `max_timestamp()` of its first window: up to there, the watermark has passed some.
    first_max: i64,
}

/// When windows fire and panes go: the geometry, the time, and the timers.
struct Schedule<K> {
    geometry: Geometry,
    domain: TimeDomain,
    allowed_lateness: i64,
    watermark: Watermark,
    /// Window firings; the key's live one is `KeyState::fire_at`.
    fire_timers: TimerBuckets<K>,
    /// Pane clean-ups (only with allowed lateness): one per pane, each dropping the key's
    /// panes whose lateness has passed (so a spent or repeated one does no harm).
    cleanup_timers: TimerBuckets<K>,
}

impl<K: Clone> Schedule<K> {
    /// `key` has a new pane, `pane`: brings its fire timer forward where the pane needs it,
    /// and sets the pane's clean-up.
    fn on_new_pane<A>(&mut self, key: &K, state: &mut KeyState<A>, pane: RecentPane) {
        // Windows the watermark has passed (within their lateness) fire at once, in
        // `process_element`; a timer would fire them a second time.
        let after = match self.domain {
            TimeDomain::EventTime => self.watermark.0,
            TimeDomain::ProcessingTime => i64::MIN,
        };
        let due = if pane.first_max > after {
            Some(pane.first_max)
        } else {
            self.geometry.next_window_max(pane.start, after)
        };
        if let Some(due) = due {
            if sooner(due, state.fire_at) {
                state.fire_at = due;
                self.fire_timers.register(key.clone(), due);
            }
        }
        if self.allowed_lateness > 0 {
            // `expires` is this instant: the last window's end plus the lateness.
            self.cleanup_timers.register(key.clone(), pane.expires);
        }
    }
}

/// Fires windows: the window function, and a buffer for a window's pane accumulators that
/// outlives each firing.
struct Firing<L, A: 'static> {
    logic: L,
    panes: Vec<&'static A>,
}

impl<L, A: 'static> Firing<L, A> {
    /// Emits `window`'s output for `key` from the panes it spans (nothing if it has none).
    fn fire<K, T, O>(
        &mut self,
        key: &K,
        panes: &PaneList<A>,
        window: TimeWindow,
        out: &mut Batch<O>,
    ) where
        L: WindowLogic<K, TimeWindow, T, O, Acc = A>,
    {
        let mut in_window: Vec<&A> = recycle(std::mem::take(&mut self.panes));
        in_window.extend(panes.range(window.start, window.end));
        if !in_window.is_empty() {
            self.logic
                .fire(key, &window, &in_window, window.max_timestamp(), out);
        }
        self.panes = recycle(in_window);
    }

    /// Fires `key`'s window ending at `time` (its fire timer came due), drops the panes no
    /// later window holds (without allowed lateness), and sets the key's next fire time:
    /// returned to be registered (`None`: no window left to fire).
    fn fire_due<K, T, O>(
        &mut self,
        schedule: &Schedule<K>,
        key: &K,
        state: &mut KeyState<A>,
        time: i64,
        out: &mut Batch<O>,
    ) -> Option<i64>
    where
        L: WindowLogic<K, TimeWindow, T, O, Acc = A>,
    {
        let geometry = schedule.geometry;
        let end = time.saturating_add(1);
        let window = TimeWindow::new(end - geometry.size, end);
        self.fire(key, &state.panes, window, out);
        // Panes from the next window's start on are in later windows; the ones before are
        // in none (no division per pane to find out).
        let later = window.start + geometry.slide;
        if schedule.allowed_lateness == 0 {
            state.panes.drop_before(later);
        }
        // Panes are in order, and so are their windows' ends: the first pane with a window
        // left has the next one.
        let next = state
            .panes
            .iter()
            .find(|(start, _)| *start >= later)
            .and_then(|(start, _)| {
                if *start < end.saturating_add(geometry.slide) {
                    // In the very next window (in-order input): no division.
                    Some(time.saturating_add(geometry.slide))
                } else {
                    geometry.next_window_max(*start, time)
                }
            });
        state.fire_at = next.unwrap_or(NO_TIMER);
        next
    }

    /// Fires again, at once, the windows of the pane at `pane_start` that the watermark has
    /// passed but whose lateness has not: a late record joined them.
    fn fire_late<K, T, O>(
        &mut self,
        schedule: &Schedule<K>,
        key: &K,
        panes: &PaneList<A>,
        pane_start: i64,
        out: &mut Batch<O>,
    ) where
        L: WindowLogic<K, TimeWindow, T, O, Acc = A>,
    {
        let watermark = schedule.watermark.0;
        let lateness = schedule.allowed_lateness;
        // Windows come latest first: skip those still open, stop at the first expired one.
        for window in schedule
            .geometry
            .windows_of_pane(pane_start)
            .skip_while(|w| w.max_timestamp() > watermark)
            .take_while(|w| w.max_timestamp().saturating_add(lateness) > watermark)
        {
            self.fire(key, panes, window, out);
        }
    }
}

/// Tumbling/sliding window operator over keys `K` with window function `L`.
pub(crate) struct AlignedWindowOperator<K, T, O, KS, L: WindowLogic<K, TimeWindow, T, O>> {
    key_selector: KS,
    firing: Firing<L, L::Acc>,
    schedule: Schedule<K>,
    late: LateData<T>,
    operator: Arc<str>,
    keys: KeyMap<K, KeyState<L::Acc>>,
    changes: Changes<K, KeyState<L::Acc>, PaneWriter<K, L::Acc>>,
    recent: RecentPane,
    /// The input ended (`Operator::finish`).
    finished: bool,
    /// Set when opened.
    scope: Option<KeyedScope>,
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
            firing: Firing {
                logic,
                panes: Vec::new(),
            },
            schedule: Schedule {
                geometry,
                domain,
                allowed_lateness: if domain == TimeDomain::EventTime {
                    allowed_lateness
                } else {
                    0
                },
                watermark: Watermark::MIN,
                fire_timers: TimerBuckets::default(),
                cleanup_timers: TimerBuckets::default(),
            },
            late: LateData::new(late_tag),
            operator: "".into(),
            keys: KeyMap::default(),
            changes: Changes::untracked(),
            recent: RecentPane {
                start: 0,
                end: 0,
                expires: 0,
                first_max: 0,
            },
            finished: false,
            scope: None,
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
    /// The pane that holds `time`.
    #[inline]
    fn pane_of(&mut self, time: i64) -> RecentPane {
        let recent = self.recent;
        if recent.start <= time && time < recent.end {
            return recent;
        }
        let geometry = self.schedule.geometry;
        let start = geometry.pane_start(time);
        self.recent = RecentPane {
            start,
            end: start.saturating_add(geometry.pane),
            expires: geometry
                .pane_last_max_timestamp(start)
                .saturating_add(self.schedule.allowed_lateness),
            first_max: geometry.pane_first_max_timestamp(start),
        };
        self.recent
    }

    /// `key`'s fire timer at `time` came due: fires its window ending there (unless the timer
    /// moved) and moves the timer on to the key's next window.
    fn fire_key(&mut self, key: K, time: i64, out: &mut Emitter<O>) {
        let keys = &mut self.keys;
        let Some(state) = keys.get_mut(&key) else {
            return;
        };
        if state.fire_at != time {
            return;
        }
        self.changes.record(&key, state);
        match self
            .firing
            .fire_due(&self.schedule, &key, state, time, &mut out.main)
        {
            Some(next) => self.schedule.fire_timers.register(key, next),
            None if state.panes.is_empty() => {
                keys.remove(&key);
                self.changes.gone(&key);
            }
            None => {}
        }
    }

    /// Fires every key whose timer is due at `time`, in one pass over the map: when most keys
    /// fire, memory order beats a random probe per key.
    fn fire_all_due(&mut self, time: i64, out: &mut Emitter<O>) {
        let (firing, schedule, changes) = (&mut self.firing, &mut self.schedule, &mut self.changes);
        self.keys.retain(|key, state| {
            if state.fire_at != time {
                return true;
            }
            changes.record(key, state);
            match firing.fire_due(schedule, key, state, time, &mut out.main) {
                Some(next) => {
                    schedule.fire_timers.register(key.clone(), next);
                    true
                }
                None if state.panes.is_empty() => {
                    changes.gone(key);
                    false
                }
                None => true,
            }
        });
    }

    /// A clean-up timer of `key` at `time` came due: drops its panes that no window needs
    /// any more (the oldest ones), and the key with the last of them.
    fn clean_up_key(&mut self, key: K, time: i64) {
        let keys = &mut self.keys;
        let Some(state) = keys.get_mut(&key) else {
            return;
        };
        self.changes.record(&key, state);
        let geometry = self.schedule.geometry;
        let lateness = self.schedule.allowed_lateness;
        state.panes.drop_while(|(start, _)| {
            geometry
                .pane_last_max_timestamp(*start)
                .saturating_add(lateness)
                <= time
        });
        if state.panes.is_empty() {
            keys.remove(&key);
            self.changes.gone(&key);
        }
    }

    /// Fires the windows whose timers are due at `limit` in `domain`, then cleans up.
    fn advance(&mut self, limit: i64, out: &mut Emitter<O>) {
        while let Some((time, mut due)) = self.schedule.fire_timers.pop_due(limit) {
            // A scan costs O(keys); it is taken only when the bucket is at least half that.
            if due.len() >= self.keys.len() / 2 {
                due.clear();
                self.fire_all_due(time, out);
            } else {
                for key in due.drain(..) {
                    self.fire_key(key, time, out);
                }
            }
            self.schedule.fire_timers.recycle(due);
        }
        while let Some((time, mut due)) = self.schedule.cleanup_timers.pop_due(limit) {
            for key in due.drain(..) {
                self.clean_up_key(key, time);
            }
            self.schedule.cleanup_timers.recycle(due);
        }
    }
}

impl<K, T, O, KS, L> AlignedWindowOperator<K, T, O, KS, L>
where
    K: Key,
    T: 'static,
    L: WindowLogic<K, TimeWindow, T, O>,
{
    /// Writes every key's panes and its fire timer (`checkpoint.rs` has the layout) — or,
    /// checkpointing incrementally, those of the keys changed since the last checkpoint, and
    /// which went (`checkpoint::chain`) — after the barrier, in pieces (`deferred.rs`). A
    /// savepoint is written whole, outside the chain (it shares nothing), so the next
    /// checkpoint's delta still goes over the chain's last link.
    fn write_snapshot(&mut self, snapshot: &mut OperatorSnapshot) -> Result<(), StateError> {
        let layout = self.firing.logic.layout(snapshot.is_savepoint());
        let scope = self.scope.expect("opened");
        let writer = PaneContents::writer(&scope, layout.codec, self.schedule.geometry.pane);
        self.changes
            .take(&self.keys, writer, snapshot, layout.part, self.finished)?;
        self.firing.logic.snapshot_contents(snapshot)
    }

    /// Takes back the panes and fire timers of this subtask's key groups from the checkpoint
    /// the job resumes from, its accumulators written with `codec`; pane clean-ups are set
    /// again from the panes.
    fn restore(
        &mut self,
        restored: &KeyedSnapshotEntries<K, TimeWindow>,
        codec: AccCodec<L::Acc>,
    ) -> Result<(), StateError> {
        let geometry = self.schedule.geometry;
        let keys = &mut self.keys;
        let logic = &self.firing.logic;
        codec.restore(restored, |key, window, bytes| {
            let window = window
                .filter(|w| w.end.saturating_sub(w.start) == geometry.pane || w.end == i64::MAX)
                .filter(|w| geometry.pane_start(w.start) == w.start)
                .ok_or_else(|| {
                    foreign_window(format!(
                        "the window operator's checkpoint holds pane {window:?}, which is not a \
                         pane of windows of size {} ms sliding by {} ms (offset {} ms)",
                        geometry.size, geometry.slide, geometry.offset
                    ))
                })?;
            let state = keys.entry(key.clone()).or_default();
            let (acc, _) = state
                .panes
                .get_mut_or_insert_with(window.start, || logic.create(key));
            codec.decode_into(acc, bytes)
        })?;
        let schedule = &mut self.schedule;
        restored.for_each(
            FIRE_TIMERS,
            StateKind::List,
            &StateValueCodec::<i64>::of(),
            |key, _, at| {
                let start = at.saturating_add(1).saturating_sub(geometry.size);
                if TimeWindow::start_with_offset(start, geometry.offset, geometry.slide) != start {
                    return Err(foreign_window(format!(
                        "the window operator's checkpoint has a timer at {at}, which is not the \
                         end of a window of size {} ms sliding by {} ms (offset {} ms)",
                        geometry.size, geometry.slide, geometry.offset
                    )));
                }
                if let Some(state) = keys.get_mut(key) {
                    state.fire_at = at;
                    schedule.fire_timers.register(key.clone(), at);
                }
                Ok(())
            },
        )?;
        if schedule.allowed_lateness > 0 {
            for (key, state) in keys.iter() {
                for (start, _) in state.panes.iter() {
                    let expires = geometry
                        .pane_last_max_timestamp(*start)
                        .saturating_add(schedule.allowed_lateness);
                    schedule.cleanup_timers.register(key.clone(), expires);
                }
            }
        }
        Ok(())
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

    fn open(&mut self, ctx: &RuntimeContext) {
        let Layout { part, codec } = self.firing.logic.restored_layout(ctx);
        let scope = super::checkpoint::open(ctx, "windows", part, |restored| {
            self.restore(restored, codec)
        });
        self.scope = Some(scope);
        self.changes = Changes::opened(ctx, self.firing.logic.layout(false).part);
    }

    fn snapshot_state(&mut self, snapshot: &mut OperatorSnapshot) -> Result<(), String> {
        self.write_snapshot(snapshot)
            .map_err(|error| error.to_string())
    }

    #[inline]
    fn process_element(&mut self, record: T, timestamp: i64, out: &mut Emitter<O>) {
        let time = element_time(self.schedule.domain, timestamp, &self.operator);
        let pane = self.pane_of(time);
        let event_time = self.schedule.domain == TimeDomain::EventTime;
        let watermark = self.schedule.watermark.0;
        if event_time && pane.expires <= watermark {
            let records = self.firing.logic.weight(&record);
            self.late.handle(record, timestamp, records, out);
            return;
        }
        // A record for windows the watermark has already passed (but within the allowed
        // lateness) fires them again at once, with the record included.
        let fires_late =
            event_time && self.schedule.allowed_lateness > 0 && pane.first_max <= watermark;
        let key = (self.key_selector)(&record);
        let firing = &mut self.firing;
        let state = match self.keys.get_mut(&key) {
            Some(state) => state,
            None => {
                let state = self.keys.entry(key.clone()).or_default();
                self.changes.added(state);
                state
            }
        };
        self.changes.record(&key, state);
        let (acc, created) = state
            .panes
            .get_mut_or_insert_with(pane.start, || firing.logic.create(&key));
        firing.logic.add(acc, record);
        if created {
            self.schedule.on_new_pane(&key, state, pane);
        }
        if fires_late {
            firing.fire_late(
                &self.schedule,
                &key,
                &state.panes,
                pane.start,
                &mut out.main,
            );
        }
    }

    fn on_watermark(&mut self, watermark: Watermark, out: &mut Emitter<O>) {
        self.schedule.watermark = watermark;
        if self.schedule.domain == TimeDomain::EventTime {
            self.advance(watermark.0, out);
        }
    }

    fn on_processing_time(&mut self, now: i64, out: &mut Emitter<O>) {
        self.changes.write_some(&self.keys, STEP_BYTES);
        if self.schedule.domain == TimeDomain::ProcessingTime {
            self.advance(now, out);
        }
    }

    /// While a snapshot written after its barrier has keys left, now: the task gives the
    /// operator a turn between batches of records to write some (`deferred.rs`).
    fn next_processing_time(&self) -> Option<i64> {
        if self.changes.writing() {
            return Some(i64::MIN);
        }
        match self.schedule.domain {
            TimeDomain::ProcessingTime => self.schedule.fire_timers.next_time(),
            TimeDomain::EventTime => None,
        }
    }

    /// Processing-time windows still open when the input ends fire now (event-time windows
    /// have already fired on the final watermark).
    fn finish(&mut self, out: &mut Emitter<O>) {
        self.finished = true;
        // No turn need follow the input's end (a source task's chain gets none).
        self.changes.finish_pending(&self.keys);
        if self.schedule.domain == TimeDomain::ProcessingTime {
            self.advance(i64::MAX, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::chain::ChainLink;
    use crate::checkpoint::chain::KeyedChain;
    use crate::window::deferred::{encode_while_fed, finish_link, timed_input, WrittenInPieces};
    use std::collections::VecDeque;

    #[test]
    fn a_record_reads_the_first_40_bytes_of_its_key_s_entry() {
        // A `u64` key counting records: the state's marks and newest pane first (`repr(C)`);
        // the entry's size and the key before the state are what the compiler does today
        // (neither is promised): a canary for the layout the per-record path was measured on.
        type Entry = (u64, KeyState<u64>);
        assert_eq!(std::mem::size_of::<Entry>(), 56);
        assert_eq!(std::mem::offset_of!(Entry, 1), 8);
        assert_eq!(std::mem::offset_of!(KeyState<u64>, marks), 0);
        assert_eq!(std::mem::offset_of!(KeyState<u64>, panes), 8);
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
        assert_eq!(g.pane_first_max_timestamp(12_000), 13_999);
        assert_eq!(g.next_window_max(12_000, i64::MIN), Some(13_999));
        assert_eq!(g.next_window_max(12_000, 13_999), Some(15_999));
        assert_eq!(g.next_window_max(12_000, 20_000), Some(21_999));
        assert_eq!(g.next_window_max(12_000, 21_999), None);

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

    type Counting = AlignedWindowOperator<
        u8,
        (u8, u64),
        (u8, i64, u64),
        fn(&(u8, u64)) -> u8,
        super::super::function::ReduceLogic<
            fn((u8, u64), (u8, u64)) -> (u8, u64),
            fn(&u8, &TimeWindow, (u8, u64)) -> (u8, i64, u64),
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

    /// An event-time operator counting each key's records per window: (key, start, count).
    fn counting(g: Geometry, lateness: i64) -> Counting {
        let logic = super::super::function::ReduceLogic {
            reduce: (|a, b| (a.0, a.1 + b.1)) as fn((u8, u64), (u8, u64)) -> (u8, u64),
            post: (|key, w, r| (*key, w.start, r.1)) as fn(&u8, &TimeWindow, (u8, u64)) -> _,
        };
        let mut op = AlignedWindowOperator::new(
            (|r| r.0) as fn(&(u8, u64)) -> u8,
            logic,
            g,
            TimeDomain::EventTime,
            lateness,
            None,
        );
        op.scope = Some(KeyedScope::single(16));
        op
    }

    /// Feeds `input` (see `deferred::timed_input`) to `op`, skipping watermarks that do not advance.
    fn feed(
        op: &mut Counting,
        input: &[Result<(u8, i64), i64>],
        out: &mut Emitter<(u8, i64, u64)>,
    ) {
        for item in input {
            match *item {
                Ok((key, ts)) => op.process_element((key, 1), ts, out),
                Err(w) => {
                    if w > op.schedule.watermark.0 {
                        op.on_watermark(Watermark(w), out);
                    }
                }
            }
        }
    }

    /// What Flink's window operator emits, window by window (no panes): (key, window start,
    /// count) per firing. `input` holds records `Ok((key, timestamp))` and watermarks `Err(w)`.
    fn reference(
        g: &Geometry,
        lateness: i64,
        input: &[Result<(u8, i64), i64>],
    ) -> Vec<(u8, i64, u64)> {
        let mut windows = std::collections::BTreeMap::<(u8, i64), u64>::new();
        let mut watermark = i64::MIN;
        let mut out = Vec::new();
        for item in input {
            match *item {
                Ok((key, ts)) => {
                    for w in g.windows_of_pane(g.pane_start(ts)) {
                        if w.start > ts || w.max_timestamp().saturating_add(lateness) <= watermark {
                            continue;
                        }
                        let count = windows.entry((key, w.start)).or_default();
                        *count += 1;
                        if w.max_timestamp() <= watermark {
                            out.push((key, w.start, *count));
                        }
                    }
                }
                Err(w) if w > watermark => {
                    for (&(key, start), &count) in &windows {
                        let max = g.window_max(start);
                        if max > watermark && max <= w {
                            out.push((key, start, count));
                        }
                    }
                    windows
                        .retain(|&(_, start), _| g.window_max(start).saturating_add(lateness) > w);
                    watermark = w;
                }
                Err(_) => {}
            }
        }
        out.sort_unstable();
        out
    }

    /// Everything an operator fires on the whole of `input`, sorted.
    fn fired_whole(
        g: Geometry,
        lateness: i64,
        input: &[Result<(u8, i64), i64>],
    ) -> Vec<(u8, i64, u64)> {
        let mut op = counting(g, lateness);
        let mut out = Emitter::new(0, crate::operator::SideOutputs::default());
        feed(&mut op, input, &mut out);
        let mut fired = out.main.records.clone();
        fired.sort_unstable();
        fired
    }

    /// What a new operator restored from `restored` fires on `rest` of the input after it sees
    /// the `watermark` the checkpointed one had again (as after a restore), added to `out`
    /// (the checkpointed one's output before the checkpoint); sorted. Fails if the operator
    /// holds state after the last watermark.
    fn fired_after_restore(
        g: Geometry,
        lateness: i64,
        restored: &KeyedSnapshotEntries<u8, TimeWindow>,
        watermark: Watermark,
        rest: &[Result<(u8, i64), i64>],
        mut out: Emitter<(u8, i64, u64)>,
    ) -> Result<Vec<(u8, i64, u64)>, proptest::test_runner::TestCaseError> {
        let mut second = counting(g, lateness);
        let codec = second.firing.logic.acc_codec();
        second.restore(restored, codec).expect("restored");
        if watermark > Watermark::MIN {
            second.on_watermark(watermark, &mut out);
        }
        feed(&mut second, rest, &mut out);
        proptest::prop_assert!(
            second.keys.is_empty(),
            "state left after the last watermark"
        );
        let mut fired = out.main.records;
        fired.sort_unstable();
        Ok(fired)
    }

    /// Links being written after their barriers, oldest first, with their bytes so far.
    type Writing = VecDeque<(ChainLink, Vec<u8>)>;

    /// Feeds `items` to `op`, each followed by the operator's turn to write `budget` bytes of
    /// its keys and a piece of `budget` bytes of the oldest link being written; the links
    /// finished go to `chain`.
    fn feed_while_writing(
        op: &mut Counting,
        items: &[Result<(u8, i64), i64>],
        out: &mut Emitter<(u8, i64, u64)>,
        writing: &mut Writing,
        chain: &mut Vec<Vec<u8>>,
        budget: usize,
    ) {
        for item in items {
            feed(op, std::slice::from_ref(item), out);
            op.changes.write_some(&op.keys, budget);
            if let Some((link, bytes)) = writing.front_mut() {
                if !link.step(bytes, budget) {
                    let (link, bytes) = writing.pop_front().expect("a link");
                    finish_link(chain, link, bytes);
                }
            }
        }
    }

    proptest::proptest! {
        /// Tumbling and sliding windows, out of order, with and without lateness: the pane
        /// operator emits what Flink's per-window operator would.
        #[test]
        fn fires_what_a_per_window_operator_fires(
            size in 1i64..30,
            slide_part in 1i64..30,
            offset_part in 0i64..30,
            lateness in proptest::prop_oneof![proptest::strategy::Just(0i64), 0i64..40],
            steps in proptest::collection::vec((0u8..4, 0u8..8, -40i64..10), 1..160),
        ) {
            let slide = slide_part.min(size);
            let g = Geometry::new(size, slide, offset_part % slide);
            let input = timed_input(steps, 7);
            let mut op = counting(g, lateness);
            let mut out = Emitter::new(0, crate::operator::SideOutputs::default());
            feed(&mut op, &input, &mut out);
            let mut fired: Vec<(u8, i64, u64)> = out.main.records.clone();
            fired.sort_unstable();
            proptest::prop_assert_eq!(fired, reference(&g, lateness, &input));
            proptest::prop_assert!(op.keys.is_empty(), "state left after the last watermark");
        }
    }

    proptest::proptest! {
        /// An operator snapshotted anywhere in its input and restored into a new one (which,
        /// as after a restore, sees the last watermark again) fires, with the original's
        /// output before the snapshot, exactly what the original fires.
        #[test]
        fn a_restored_operator_fires_what_the_original_fires(
            size in 1i64..30,
            slide_part in 1i64..30,
            lateness in proptest::prop_oneof![proptest::strategy::Just(0i64), 0i64..40],
            steps in proptest::collection::vec((0u8..4, 0u8..8, -40i64..10), 1..120),
            cut in 0usize..120,
        ) {
            let slide = slide_part.min(size);
            let g = Geometry::new(size, slide, 0);
            let input = timed_input(steps, 7);
            let cut = cut.min(input.len());
            let mut first = counting(g, lateness);
            let mut out = Emitter::new(0, crate::operator::SideOutputs::default());
            feed(&mut first, &input[..cut], &mut out);
            let mut snapshot = OperatorSnapshot::default();
            first.write_snapshot(&mut snapshot).expect("a snapshot");
            let restored = super::super::checkpoint::read_back(snapshot, 16);
            let fired = fired_after_restore(
                g, lateness, &restored, first.schedule.watermark, &input[cut..], out,
            )?;
            proptest::prop_assert_eq!(fired, fired_whole(g, lateness, &input));
        }
    }

    proptest::proptest! {
        /// An operator checkpointed incrementally — a full snapshot, then deltas of the keys
        /// that changed or went — at several points of its input, restored from what its chain
        /// merges into, fires with the original's output before the last checkpoint exactly
        /// what the original fires; so does one restored from a savepoint taken at one of the
        /// points (written whole, outside the chain, whose next delta still covers the changes
        /// since the link before it). Each link is written after its barrier while the
        /// original goes on: a piece of `budget` bytes after each record that follows.
        #[test]
        fn an_operator_restored_from_deltas_fires_what_the_original_fires(
            size in 1i64..30,
            slide_part in 1i64..30,
            lateness in proptest::prop_oneof![proptest::strategy::Just(0i64), 0i64..40],
            steps in proptest::collection::vec((0u8..4, 0u8..8, -40i64..10), 1..120),
            mut cuts in proptest::collection::vec(0usize..120, 1..6),
            savepoint_at in 0usize..6,
            budget in 1usize..200,
        ) {
            let slide = slide_part.min(size);
            let g = Geometry::new(size, slide, 0);
            let input = timed_input(steps, 7);
            let mut first = counting(g, lateness);
            first.changes = Changes::tracked(Some(KeyedChain::deltas_only(
                crate::checkpoint::task_state::PART_KEYED,
            )));
            let mut out = Emitter::new(0, crate::operator::SideOutputs::default());
            cuts.iter_mut().for_each(|cut| *cut = (*cut).min(input.len()));
            cuts.sort_unstable();
            let mut chain: Vec<Vec<u8>> = Vec::new();
            let mut writing = VecDeque::new();
            let mut at = 0;
            for (index, &cut) in cuts.iter().enumerate() {
                let items = &input[at..cut];
                feed_while_writing(&mut first, items, &mut out, &mut writing, &mut chain, budget);
                at = cut;
                if index == savepoint_at {
                    let mut savepoint = OperatorSnapshot::new(crate::checkpoint::SnapshotKind::Savepoint);
                    first.write_snapshot(&mut savepoint).expect("a savepoint");
                    first.changes.finish_pending(&first.keys);
                    let from_savepoint = super::super::checkpoint::read_back(savepoint, 16);
                    let mut savepoint_out = Emitter::new(0, crate::operator::SideOutputs::default());
                    savepoint_out.main.records = out.main.records.clone();
                    let fired = fired_after_restore(
                        g, lateness, &from_savepoint, first.schedule.watermark, &input[at..], savepoint_out,
                    )?;
                    proptest::prop_assert_eq!(fired, fired_whole(g, lateness, &input));
                }
                let mut snapshot = OperatorSnapshot::default();
                first.write_snapshot(&mut snapshot).expect("a snapshot");
                for (_, part) in snapshot.parts {
                    let crate::checkpoint::task_state::Part::Chained(link) = part else {
                        panic!("a window part that is not a link");
                    };
                    writing.push_back((link, Vec::new()));
                }
            }
            // The original goes on while the last links are written.
            let (watermark, mut at_last) = (first.schedule.watermark, Emitter::new(0, crate::operator::SideOutputs::default()));
            at_last.main.records = out.main.records.clone();
            feed_while_writing(&mut first, &input[at..], &mut out, &mut writing, &mut chain, budget);
            first.changes.finish_pending(&first.keys);
            while let Some((link, bytes)) = writing.pop_front() {
                finish_link(&mut chain, link, bytes);
            }
            let links: Vec<&[u8]> = chain.iter().map(Vec::as_slice).collect();
            let merged = weir_state::merge_keyed_chain(&links).expect("the chain merges");
            let restored = KeyedScope::single(16).read(&[merged.into()]).expect("it reads back");
            let fired = fired_after_restore(g, lateness, &restored, watermark, &input[at..], at_last)?;
            proptest::prop_assert_eq!(fired, fired_whole(g, lateness, &input));
        }
    }

    proptest::proptest! {
        /// A full snapshot written after its barrier holds the state at the barrier, however
        /// the operator changes while it is written: records and watermarks go on between the
        /// writer's pieces (firing windows, adding keys, dropping them), and maybe a second
        /// barrier comes before the writer is done. An operator restored from the snapshot
        /// fires, with the original's output before the barrier, what the original fires. A
        /// checkpoint without incremental links, or a savepoint next to a chain.
        #[test]
        fn a_snapshot_written_after_its_barrier_holds_the_state_at_the_barrier(
            size in 1i64..30,
            slide_part in 1i64..30,
            lateness in proptest::prop_oneof![proptest::strategy::Just(0i64), 0i64..40],
            steps in proptest::collection::vec((0u8..4, 0u8..8, -40i64..10), 1..120),
            cut in 0usize..120,
            budget in 1usize..120,
            chained in proptest::prelude::any::<bool>(),
            second_barrier_after in proptest::option::of(0usize..40),
        ) {
            use crate::checkpoint::task_state::PART_KEYED;
            let slide = slide_part.min(size);
            let g = Geometry::new(size, slide, 0);
            let input = timed_input(steps, 7);
            let cut = cut.min(input.len());
            let mut first = counting(g, lateness);
            first.changes = Changes::tracked(chained.then(|| KeyedChain::deltas_only(PART_KEYED)));
            let mut out = Emitter::new(0, crate::operator::SideOutputs::default());
            feed(&mut first, &input[..cut], &mut out);
            let kind = if chained {
                crate::checkpoint::SnapshotKind::Savepoint
            } else {
                crate::checkpoint::SnapshotKind::Checkpoint
            };
            let mut snapshot = OperatorSnapshot::new(kind);
            first.write_snapshot(&mut snapshot).expect("a snapshot");
            let (watermark, before) = (first.schedule.watermark, out.main.records.clone());
            let rest = &input[cut..];
            let bytes = encode_while_fed(snapshot, budget, &mut first, rest, second_barrier_after, |op, item| {
                feed(op, std::slice::from_ref(item), &mut out)
            });
            let restored = KeyedScope::single(16).read(&[bytes.into()]).expect("it reads back");
            let mut at_barrier = Emitter::new(0, crate::operator::SideOutputs::default());
            at_barrier.main.records = before;
            let fired = fired_after_restore(g, lateness, &restored, watermark, &input[cut..], at_barrier)?;
            proptest::prop_assert_eq!(fired, fired_whole(g, lateness, &input));
        }
    }

    proptest::proptest! {
        /// The first, last and next window ends of a pane agree with listing its windows.
        #[test]
        fn window_ends_of_a_pane_agree_with_its_windows(
            size in 1i64..50,
            slide_part in 1i64..50,
            offset in -60i64..60,
            time in -500i64..500,
            after in -600i64..600,
        ) {
            let slide = slide_part.min(size);
            let g = Geometry::new(size, slide, offset % slide);
            let pane = g.pane_start(time);
            let ends: Vec<i64> = g.windows_of_pane(pane).map(|w| w.max_timestamp()).collect();
            proptest::prop_assert!(!ends.is_empty());
            proptest::prop_assert_eq!(g.pane_last_max_timestamp(pane), ends[0]);
            proptest::prop_assert_eq!(g.pane_first_max_timestamp(pane), *ends.last().unwrap());
            let next = ends.iter().copied().filter(|&end| end > after).min();
            proptest::prop_assert_eq!(g.next_window_max(pane, after), next);
        }
    }
}
