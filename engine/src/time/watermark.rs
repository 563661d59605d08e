//! Watermark strategies (Flink's `WatermarkStrategy`): a timestamp assigner and a watermark
//! generator, emitted periodically and/or per record, with idleness; and the per-split
//! bookkeeping a source subtask (or `assign_timestamps_and_watermarks`) runs them with.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::record::{Watermark, NO_TIMESTAMP};

/// Where a [`WatermarkGenerator`] puts what it decides.
#[derive(Debug)]
pub struct WatermarkOutput {
    watermark: Watermark,
    idle: bool,
}

impl Default for WatermarkOutput {
    fn default() -> Self {
        WatermarkOutput {
            watermark: Watermark::MIN,
            idle: false,
        }
    }
}

impl WatermarkOutput {
    /// Event time has reached `timestamp`. A watermark below one already emitted is ignored:
    /// watermarks never go backwards. Emitting marks the output active.
    pub fn emit_watermark(&mut self, timestamp: i64) {
        self.idle = false;
        if timestamp > self.watermark.0 {
            self.watermark = Watermark(timestamp);
        }
    }

    /// No records are coming for now: stop holding event time back downstream.
    pub fn mark_idle(&mut self) {
        self.idle = true;
    }

    /// Records are coming again.
    pub fn mark_active(&mut self) {
        self.idle = false;
    }

    /// The highest watermark emitted.
    pub fn watermark(&self) -> Watermark {
        self.watermark
    }

    /// Whether the output is idle.
    pub fn is_idle(&self) -> bool {
        self.idle
    }
}

/// Decides watermarks from the records seen (Flink's `WatermarkGenerator`). One instance runs
/// per source split.
pub trait WatermarkGenerator<T>: Send {
    /// Sees every record with its timestamp; may emit a watermark at once (per-record emission).
    fn on_event(&mut self, event: &T, timestamp: i64, output: &mut WatermarkOutput);
    /// Called every `pipeline.auto-watermark-interval`; periodic generators emit here.
    fn on_periodic_emit(&mut self, output: &mut WatermarkOutput);

    /// Sees records in bulk (`timestamps[i]` is `events[i]`'s), as `on_event` would one by
    /// one, stopping after the first on which it emits a watermark or marks the output idle;
    /// returns how many it saw (at least one, unless `events` is empty). Sources call this
    /// once per batch; the default calls `on_event` per record, and a generator that only
    /// follows the timestamps (as [`BoundedOutOfOrderness`] does) can override it with a
    /// loop over `timestamps` alone.
    fn on_events(
        &mut self,
        events: &[T],
        timestamps: &[i64],
        output: &mut WatermarkOutput,
    ) -> usize {
        let before = output.watermark;
        for (i, (event, &timestamp)) in events.iter().zip(timestamps).enumerate() {
            self.on_event(event, timestamp, output);
            if output.watermark != before || output.idle {
                return i + 1;
            }
        }
        events.len()
    }
}

/// Watermarks that trail the highest timestamp seen by a fixed bound: `max_ts - bound - 1`
/// (Flink's formula), emitted periodically. A bound of zero gives monotonous timestamps.
#[derive(Clone, Debug)]
pub struct BoundedOutOfOrderness {
    max_timestamp: i64,
    bound: i64,
}

impl BoundedOutOfOrderness {
    /// Records may arrive up to `bound` late.
    pub fn new(bound: Duration) -> Self {
        let bound = bound.as_millis().min(i64::MAX as u128 / 2) as i64;
        BoundedOutOfOrderness {
            max_timestamp: i64::MIN + bound + 1,
            bound,
        }
    }
}

impl<T> WatermarkGenerator<T> for BoundedOutOfOrderness {
    #[inline]
    fn on_event(&mut self, _event: &T, timestamp: i64, _output: &mut WatermarkOutput) {
        self.max_timestamp = self.max_timestamp.max(timestamp);
    }

    fn on_periodic_emit(&mut self, output: &mut WatermarkOutput) {
        output.emit_watermark(self.max_timestamp - self.bound - 1);
    }

    /// Emits nothing per record: the batch's maximum timestamp is all it needs.
    #[inline]
    fn on_events(
        &mut self,
        events: &[T],
        timestamps: &[i64],
        _output: &mut WatermarkOutput,
    ) -> usize {
        let seen = &timestamps[..events.len()];
        self.max_timestamp = seen.iter().copied().fold(self.max_timestamp, i64::max);
        events.len()
    }
}

struct NoWatermarks;

impl<T> WatermarkGenerator<T> for NoWatermarks {
    fn on_event(&mut self, _event: &T, _timestamp: i64, _output: &mut WatermarkOutput) {}
    fn on_periodic_emit(&mut self, _output: &mut WatermarkOutput) {}
}

type GeneratorFactory<T> = Arc<dyn Fn() -> Box<dyn WatermarkGenerator<T>> + Send + Sync>;
/// The user's timestamp assigner, run over a whole batch: one dynamic call per batch, not
/// per record.
type TimestampAssigner<T> = Arc<dyn Fn(&[T], &mut Vec<i64>) + Send + Sync>;

/// How a stream's records get event timestamps and how watermarks are derived from them.
///
/// ```
/// use std::time::Duration;
/// use weir_engine::time::WatermarkStrategy;
///
/// let strategy = WatermarkStrategy::<(String, i64)>::for_bounded_out_of_orderness(Duration::from_secs(5))
///     .with_timestamp_assigner(|event: &(String, i64), _| event.1)
///     .with_idleness(Duration::from_secs(60));
/// # let _ = strategy;
/// ```
pub struct WatermarkStrategy<T> {
    pub(crate) generator: GeneratorFactory<T>,
    pub(crate) assigner: Option<TimestampAssigner<T>>,
    pub(crate) idleness: Option<Duration>,
    /// Whether watermarks are generated at all (`no_watermarks` leaves records unstamped).
    pub(crate) generates: bool,
}

impl<T> Clone for WatermarkStrategy<T> {
    fn clone(&self) -> Self {
        WatermarkStrategy {
            generator: Arc::clone(&self.generator),
            assigner: self.assigner.clone(),
            idleness: self.idleness,
            generates: self.generates,
        }
    }
}

impl<T> std::fmt::Debug for WatermarkStrategy<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatermarkStrategy")
            .field("assigner", &self.assigner.is_some())
            .field("idleness", &self.idleness)
            .field("generates", &self.generates)
            .finish()
    }
}

impl<T: 'static> WatermarkStrategy<T> {
    /// Records may be up to `bound` out of order; the watermark is `max_ts - bound - 1 ms`.
    pub fn for_bounded_out_of_orderness(bound: Duration) -> Self {
        Self::for_generator(move || BoundedOutOfOrderness::new(bound))
    }

    /// Timestamps never decrease; the watermark is `max_ts - 1 ms`.
    pub fn for_monotonous_timestamps() -> Self {
        Self::for_bounded_out_of_orderness(Duration::ZERO)
    }

    /// A custom generator, created once per split.
    pub fn for_generator<G, F>(make: F) -> Self
    where
        G: WatermarkGenerator<T> + 'static,
        F: Fn() -> G + Send + Sync + 'static,
    {
        WatermarkStrategy {
            generator: Arc::new(move || Box::new(make())),
            assigner: None,
            idleness: None,
            generates: true,
        }
    }

    /// No timestamps, no watermarks (until the input ends, which emits the maximum).
    pub fn no_watermarks() -> Self {
        WatermarkStrategy {
            generator: Arc::new(|| Box::new(NoWatermarks)),
            assigner: None,
            idleness: None,
            generates: false,
        }
    }

    /// Takes each record's event timestamp (ms) from the record; the second argument is the
    /// timestamp the record already has, if any.
    pub fn with_timestamp_assigner(
        mut self,
        assigner: impl Fn(&T, Option<i64>) -> i64 + Send + Sync + 'static,
    ) -> Self {
        self.assigner = Some(Arc::new(move |records: &[T], into: &mut Vec<i64>| {
            into.extend(records.iter().map(|record| assigner(record, None)));
        }));
        self
    }

    /// A split that has had no records for `timeout` is marked idle: it stops holding event
    /// time back until records return.
    pub fn with_idleness(mut self, timeout: Duration) -> Self {
        self.idleness = Some(timeout);
        self
    }
}

/// One split's generator, output and idleness clock.
struct SplitWatermarks<T> {
    generator: Box<dyn WatermarkGenerator<T>>,
    output: WatermarkOutput,
    /// Records seen since the last idleness check, and when records were last seen.
    seen_since_check: bool,
    last_active: Instant,
}

/// What a stream's watermarks did since the last look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WatermarkUpdate {
    Advanced(Watermark),
    Idle,
    Active,
}

/// Runs a strategy over the splits of one source subtask: assigns timestamps, feeds each
/// split's generator, and combines the splits' watermarks — the minimum over the splits that
/// are not idle; idle when all are.
pub(crate) struct SplitWatermarkTracker<T> {
    strategy: WatermarkStrategy<T>,
    splits: Vec<(u32, SplitWatermarks<T>)>,
    /// Splits added so far: the next split's number.
    added: u32,
    interval: Option<Duration>,
    next_periodic: Instant,
    emitted: Watermark,
    idle: bool,
}

impl<T: 'static> SplitWatermarkTracker<T> {
    /// `interval` is `pipeline.auto-watermark-interval` (`None`: periodic emission off).
    pub(crate) fn new(strategy: WatermarkStrategy<T>, interval: Option<Duration>) -> Self {
        SplitWatermarkTracker {
            strategy,
            splits: Vec::new(),
            added: 0,
            interval,
            next_periodic: Instant::now(),
            emitted: Watermark::MIN,
            idle: false,
        }
    }

    /// Whether records get timestamps and watermarks from this strategy.
    pub(crate) fn generates(&self) -> bool {
        self.strategy.generates
    }

    fn split(&mut self, split: u32) -> &mut SplitWatermarks<T> {
        let index = match self.splits.iter().position(|(id, _)| *id == split) {
            Some(index) => index,
            None => {
                self.splits.push((
                    split,
                    SplitWatermarks {
                        generator: (self.strategy.generator)(),
                        output: WatermarkOutput::default(),
                        seen_since_check: false,
                        last_active: Instant::now(),
                    },
                ));
                self.splits.len() - 1
            }
        };
        &mut self.splits[index].1
    }

    /// The reader was given its next split (numbered in order from 0, as readers number
    /// them): it holds event time back from now on, until it is read to its end or idle.
    /// Returns the split's number.
    pub(crate) fn on_split_added(&mut self) -> u32 {
        let number = self.added;
        self.added += 1;
        if self.strategy.generates {
            self.split(number);
        }
        number
    }

    /// Each split's number, watermark and idleness.
    pub(crate) fn split_states(&self) -> impl Iterator<Item = (u32, i64, bool)> + '_ {
        self.splits
            .iter()
            .map(|(number, s)| (*number, s.output.watermark.0, s.output.idle))
    }

    /// Stamps `records` (all read from `split`) into `timestamps` and shows them to the split's
    /// generator. Where a generator emits a watermark on a record (per-record emission), the
    /// update is pushed to `cuts` with the number of records that come before it.
    pub(crate) fn on_records(
        &mut self,
        split: u32,
        records: &[T],
        timestamps: &mut Vec<i64>,
        cuts: &mut Vec<(usize, WatermarkUpdate)>,
    ) {
        let first = timestamps.len();
        match &self.strategy.assigner {
            Some(assign) => assign(records, timestamps),
            None => timestamps.resize(first + records.len(), NO_TIMESTAMP),
        }
        let stamped = &timestamps[first..];
        self.split(split);
        let index = self
            .splits
            .iter()
            .position(|(id, _)| *id == split)
            .expect("created above");
        let mut updates = Vec::new();
        let mut seen = 0;
        while seen < records.len() {
            let state = &mut self.splits[index].1;
            state.seen_since_check = true;
            if state.output.idle {
                // The split is back: the subtask may be active again before this record.
                state.output.mark_active();
                self.updates(&mut updates);
                cuts.extend(updates.drain(..).map(|update| (seen, update)));
            }
            let state = &mut self.splits[index].1;
            let before = state.output.watermark;
            let taken =
                state
                    .generator
                    .on_events(&records[seen..], &stamped[seen..], &mut state.output);
            seen += taken.clamp(1, records.len() - seen);
            if state.output.watermark != before {
                self.updates(&mut updates);
                cuts.extend(updates.drain(..).map(|update| (seen, update)));
            }
        }
    }

    /// A split was read to its end: it no longer holds event time back.
    pub(crate) fn on_split_finished(&mut self, split: u32) {
        self.splits.retain(|(id, _)| *id != split);
    }

    /// When the next periodic emission is due.
    pub(crate) fn next_periodic(&self) -> Option<Instant> {
        (self.strategy.generates && self.interval.is_some()).then_some(self.next_periodic)
    }

    /// Runs periodic emission (and idleness checks) if due at `now`.
    pub(crate) fn on_periodic(&mut self, now: Instant) {
        let Some(interval) = self.interval else {
            return;
        };
        if now < self.next_periodic {
            return;
        }
        self.next_periodic = now + interval;
        let idleness = self.strategy.idleness;
        for (_, split) in &mut self.splits {
            if split.seen_since_check {
                split.seen_since_check = false;
                split.last_active = now;
            }
            match idleness {
                Some(timeout) if now.duration_since(split.last_active) >= timeout => {
                    split.output.mark_idle();
                }
                _ => split.generator.on_periodic_emit(&mut split.output),
            }
        }
    }

    /// What changed since the last call: the subtask became active, its combined watermark
    /// advanced, or it became idle (all its splits are).
    pub(crate) fn updates(&mut self, into: &mut Vec<WatermarkUpdate>) {
        if self.splits.is_empty() {
            return;
        }
        let active = self.splits.iter().filter(|(_, s)| !s.output.idle);
        let combined = active.map(|(_, s)| s.output.watermark).min();
        match combined {
            None => {
                if !self.idle {
                    self.idle = true;
                    into.push(WatermarkUpdate::Idle);
                }
            }
            Some(watermark) => {
                if self.idle {
                    self.idle = false;
                    into.push(WatermarkUpdate::Active);
                }
                if watermark > self.emitted {
                    self.emitted = watermark;
                    into.push(WatermarkUpdate::Advanced(watermark));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker(strategy: WatermarkStrategy<i64>) -> SplitWatermarkTracker<i64> {
        SplitWatermarkTracker::new(
            strategy.with_timestamp_assigner(|t: &i64, _| *t),
            Some(Duration::from_millis(200)),
        )
    }

    /// Feeds records; returns their timestamps. Periodic generators emit no watermark per
    /// record; the only update a record may cause at once is its idle split becoming active.
    fn feed(t: &mut SplitWatermarkTracker<i64>, split: u32, records: &[i64]) -> Vec<i64> {
        let mut stamps = Vec::new();
        let mut cuts = Vec::new();
        t.on_records(split, records, &mut stamps, &mut cuts);
        assert!(
            cuts.iter().all(|(_, u)| *u == WatermarkUpdate::Active),
            "{cuts:?}"
        );
        stamps
    }

    fn updates(t: &mut SplitWatermarkTracker<i64>) -> Vec<WatermarkUpdate> {
        let mut u = Vec::new();
        t.updates(&mut u);
        u
    }

    #[test]
    fn bounded_out_of_orderness_trails_the_maximum_by_bound_plus_one() {
        let mut t = tracker(WatermarkStrategy::for_bounded_out_of_orderness(
            Duration::from_millis(5),
        ));
        assert_eq!(feed(&mut t, 0, &[100, 120, 90]), vec![100, 120, 90]);
        assert_eq!(
            updates(&mut t),
            vec![],
            "periodic: nothing before the interval"
        );
        t.on_periodic(Instant::now() + Duration::from_secs(1));
        assert_eq!(
            updates(&mut t),
            vec![WatermarkUpdate::Advanced(Watermark(114))]
        );
    }

    #[test]
    fn the_subtask_watermark_is_the_minimum_over_its_splits() {
        let mut t = tracker(WatermarkStrategy::for_monotonous_timestamps());
        feed(&mut t, 0, &[1000]);
        feed(&mut t, 1, &[500]);
        let now = Instant::now() + Duration::from_secs(1);
        t.on_periodic(now);
        assert_eq!(
            updates(&mut t),
            vec![WatermarkUpdate::Advanced(Watermark(499))]
        );
        t.on_split_finished(1);
        assert_eq!(
            updates(&mut t),
            vec![WatermarkUpdate::Advanced(Watermark(999))]
        );
    }

    #[test]
    fn an_idle_split_stops_holding_time_back_and_rejoins() {
        let mut t = tracker(
            WatermarkStrategy::for_monotonous_timestamps().with_idleness(Duration::from_secs(1)),
        );
        let start = Instant::now();
        feed(&mut t, 0, &[100]);
        feed(&mut t, 1, &[50]);
        t.on_periodic(start + Duration::from_millis(300));
        assert_eq!(
            updates(&mut t),
            vec![WatermarkUpdate::Advanced(Watermark(49))]
        );
        // Split 0 keeps receiving records; split 1 goes quiet for longer than the timeout.
        for step in 1..=8 {
            feed(&mut t, 0, &[100 + step * 100]);
            t.on_periodic(start + Duration::from_millis(300 + step as u64 * 250));
        }
        assert_eq!(
            updates(&mut t),
            vec![WatermarkUpdate::Advanced(Watermark(899))]
        );
        // Split 1 returns: it is active again and holds time at its own watermark.
        feed(&mut t, 1, &[950]);
        t.on_periodic(start + Duration::from_secs(5));
        assert_eq!(
            updates(&mut t),
            vec![WatermarkUpdate::Advanced(Watermark(949))]
        );
    }

    #[test]
    fn all_splits_idle_makes_the_subtask_idle() {
        let mut t = tracker(
            WatermarkStrategy::for_monotonous_timestamps().with_idleness(Duration::from_secs(1)),
        );
        let start = Instant::now();
        feed(&mut t, 0, &[10]);
        t.on_periodic(start + Duration::from_millis(300));
        assert_eq!(
            updates(&mut t),
            vec![WatermarkUpdate::Advanced(Watermark(9))]
        );
        t.on_periodic(start + Duration::from_millis(1500));
        assert_eq!(updates(&mut t), vec![WatermarkUpdate::Idle]);
        // A record makes the subtask active at once, before the record goes out.
        let (mut stamps, mut cuts) = (Vec::new(), Vec::new());
        t.on_records(0, &[20], &mut stamps, &mut cuts);
        assert_eq!(cuts, vec![(0, WatermarkUpdate::Active)]);
        t.on_periodic(start + Duration::from_millis(1800));
        assert_eq!(
            updates(&mut t),
            vec![WatermarkUpdate::Advanced(Watermark(19))]
        );
    }

    #[test]
    fn a_silent_split_holds_time_back_until_it_is_idle() {
        let mut t = tracker(
            WatermarkStrategy::for_monotonous_timestamps().with_idleness(Duration::from_secs(1)),
        );
        let start = Instant::now();
        t.on_split_added();
        t.on_split_added();
        feed(&mut t, 0, &[500]);
        t.on_periodic(start + Duration::from_millis(300));
        assert_eq!(updates(&mut t), vec![], "split 1 has not emitted anything");
        feed(&mut t, 0, &[700]);
        t.on_periodic(start + Duration::from_millis(1200));
        assert_eq!(
            updates(&mut t),
            vec![WatermarkUpdate::Advanced(Watermark(699))]
        );
    }

    /// A punctuated generator: emits on every record whose value is a multiple of 10.
    struct Punctuated;

    impl WatermarkGenerator<i64> for Punctuated {
        fn on_event(&mut self, event: &i64, timestamp: i64, output: &mut WatermarkOutput) {
            if event % 10 == 0 {
                output.emit_watermark(timestamp);
            }
        }
        fn on_periodic_emit(&mut self, _output: &mut WatermarkOutput) {}
    }

    #[test]
    fn per_record_emission_cuts_the_batch_after_the_record() {
        let mut t = SplitWatermarkTracker::new(
            WatermarkStrategy::for_generator(|| Punctuated)
                .with_timestamp_assigner(|t: &i64, _| *t),
            None,
        );
        let (mut stamps, mut cuts) = (Vec::new(), Vec::new());
        t.on_records(0, &[3, 10, 12, 20, 7], &mut stamps, &mut cuts);
        assert_eq!(stamps, vec![3, 10, 12, 20, 7]);
        assert_eq!(
            cuts,
            vec![
                (2, WatermarkUpdate::Advanced(Watermark(10))),
                (4, WatermarkUpdate::Advanced(Watermark(20)))
            ]
        );
        assert_eq!(updates(&mut t), vec![]);
    }
}
