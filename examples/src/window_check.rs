//! An exactly-once check for window and join state: every key's numbered records go through
//! tumbling, sliding, session and count windows — a `reduce`, an `aggregate` (two-phase where
//! the configuration asks for it) and a `process` function — and every window reports how many
//! records it held and the sum of their sequence numbers; every tenth record is also
//! interval-joined with the key's records close to it in event time, each pair reported once.
//! Each window's contents and each record's partners are known from the sequence numbers
//! alone, so a report that is off by one record (lost, or counted twice after a restore) names
//! its window, and so does a window that never fires (a timer lost) or a missing pair (a join
//! buffer lost). Stopped and resumed from its checkpoints any number of times, each run reports
//! a window or pair at most once, and the reports of all runs hold every window and pair, each
//! with exactly its records (one that fired between the last checkpoint and a stop reports
//! again in the next run, with the same figures: the output is at-least-once, the state
//! exactly-once).
//!
//! The source has one split per reader (pinned), key `k` of reader `r` being
//! `r·keys_per_split + k`; record `seq` of a key carries event time [`timestamp`]`(seq)`,
//! which pauses after every [`SESSION_RECORDS`] records, so sessions end there.

use std::collections::HashMap;
use std::time::Duration;

use weir_engine::connector::{
    Boundedness, ConnectorError, LocalBoxFuture, ReadStatus, Source, SourceReader, SplitEnumerator,
    StaticSplits,
};
use weir_engine::prelude::*;
use weir_engine::window::GlobalWindow;

use crate::sequence_check::{SequenceSplit, Throttle};

/// Tumbling windows' size, ms.
pub const TUMBLING_MS: i64 = 50;
/// Sliding windows' size and slide, ms.
pub const SLIDING_MS: (i64, i64) = (40, 10);
/// Records of a key between two pauses of its event time.
pub const SESSION_RECORDS: u64 = 30;
/// The pause, ms: longer than the session gap.
pub const SESSION_PAUSE_MS: u64 = 20;
/// The session gap, ms.
pub const SESSION_GAP_MS: i64 = 5;
/// Records per count window.
pub const COUNT: u64 = 25;
/// Every this many records of a key, one joins the key's records within [`JOIN_BOUND_MS`].
pub const JOIN_EVERY: u64 = 10;
/// The interval join's bounds: `-JOIN_BOUND_MS ..= JOIN_BOUND_MS` around the left record.
pub const JOIN_BOUND_MS: i64 = 3;

/// The event time of a key's record `seq`.
pub fn timestamp(seq: u64) -> i64 {
    (seq + seq / SESSION_RECORDS * SESSION_PAUSE_MS) as i64
}

/// The source's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowCheckSpec {
    /// Keys each reader generates.
    pub keys_per_split: u32,
    /// Records each key gets.
    pub per_key: u64,
    /// Records per second per reader at most (unthrottled if `None`).
    pub rate: Option<f64>,
}

/// Which windows a report is of.
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
pub enum WindowKind {
    /// Tumbling, by `reduce`.
    Tumbling,
    /// Sliding, by `aggregate`.
    Sliding,
    /// Sessions, by `process`.
    Session,
    /// Count windows, by `reduce`; `start` and `end` are sequence numbers.
    Count,
    /// An interval-joined pair: `start` is the left record's sequence number, `end` the right
    /// one's.
    Join,
}

/// What one firing of a window reports.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WindowReport {
    /// The windows.
    pub kind: WindowKind,
    /// The key.
    pub key: u32,
    /// The window: `[start, end)`.
    pub start: i64,
    /// Its end (exclusive).
    pub end: i64,
    /// Records it held.
    pub count: u64,
    /// The sum of their sequence numbers.
    pub sum: u64,
}

/// A key's records folded: how many, their sequence numbers' sum and the smallest.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Tally {
    /// The key.
    pub key: u32,
    /// Records.
    pub count: u64,
    /// Sum of their sequence numbers.
    pub sum: u64,
    /// The smallest sequence number.
    pub first: u64,
}

impl Tally {
    fn merge(mut self, other: Tally) -> Tally {
        self.count += other.count;
        self.sum += other.sum;
        self.first = self.first.min(other.first);
        self
    }
}

/// The bounded source: one split per reader.
#[derive(Clone, Debug)]
struct CheckSource {
    spec: WindowCheckSpec,
}

impl Source<Tally> for CheckSource {
    type Split = SequenceSplit;

    fn boundedness(&self) -> Boundedness {
        Boundedness::Bounded
    }

    fn create_enumerator(&self, parallelism: usize) -> Box<dyn SplitEnumerator<SequenceSplit>> {
        Box::new(StaticSplits::pinned(
            (0..parallelism as u32)
                .map(|split| SequenceSplit { split, next: 0 })
                .collect(),
            parallelism,
        ))
    }

    fn create_reader(&self, _ctx: &RuntimeContext) -> Box<dyn SourceReader<Tally, SequenceSplit>> {
        Box::new(CheckReader {
            spec: self.spec,
            split: None,
            throttle: Throttle::new(self.spec.rate),
        })
    }
}

struct CheckReader {
    spec: WindowCheckSpec,
    split: Option<SequenceSplit>,
    throttle: Throttle,
}

impl SourceReader<Tally, SequenceSplit> for CheckReader {
    fn add_split(&mut self, split: SequenceSplit) {
        assert!(
            self.split.is_none(),
            "a window-check reader reads one split"
        );
        self.split = Some(split);
    }

    fn poll_next<'a>(
        &'a mut self,
        out: &'a mut Vec<Tally>,
        max: usize,
    ) -> LocalBoxFuture<'a, Result<ReadStatus, ConnectorError>> {
        Box::pin(async move {
            let Some(split) = self.split.as_mut() else {
                return Ok(ReadStatus::NeedSplit);
            };
            let keys = u64::from(self.spec.keys_per_split);
            let end = keys * self.spec.per_key;
            if split.next >= end {
                self.split = None;
                return Ok(ReadStatus::SplitFinished { split: 0 });
            }
            let room = self.throttle.room(max);
            if room == 0 {
                return Ok(ReadStatus::Idle(Duration::from_millis(1)));
            }
            let first_key = split.split * self.spec.keys_per_split;
            let until = end.min(split.next + room);
            for j in split.next..until {
                let seq = j / keys;
                out.push(Tally {
                    key: first_key + (j % keys) as u32,
                    count: 1,
                    sum: seq,
                    first: seq,
                });
            }
            self.throttle.took(until - split.next);
            split.next = until;
            Ok(ReadStatus::Records { split: 0 })
        })
    }

    fn snapshot_splits(&self) -> Vec<SequenceSplit> {
        self.split.iter().cloned().collect()
    }
}

/// The sliding windows' aggregate: (records, sum).
#[derive(Clone)]
struct CountAndSum;

impl AggregateFunction<Tally, (u64, u64), (u64, u64)> for CountAndSum {
    fn create_accumulator(&self) -> (u64, u64) {
        (0, 0)
    }

    fn add(&self, value: Tally, acc: &mut (u64, u64)) {
        acc.0 += value.count;
        acc.1 += value.sum;
    }

    fn get_result(&self, acc: &(u64, u64)) -> (u64, u64) {
        *acc
    }

    fn merge(&self, into: &mut (u64, u64), other: &(u64, u64)) {
        into.0 += other.0;
        into.1 += other.1;
    }
}

fn report(kind: WindowKind, key: u32, window: &TimeWindow, count: u64, sum: u64) -> WindowReport {
    WindowReport {
        kind,
        key,
        start: window.start,
        end: window.end,
        count,
        sum,
    }
}

/// The reports of the check with `parallelism` readers of shape `spec`.
pub fn reports(
    env: &StreamEnvironment,
    spec: WindowCheckSpec,
    parallelism: usize,
) -> DataStream<WindowReport> {
    reports_with(env, spec, parallelism, |records| records)
}

/// [`reports`], with `between` applied to the source's records before the windows (a
/// failure injector, in the recovery tests).
pub fn reports_with(
    env: &StreamEnvironment,
    spec: WindowCheckSpec,
    parallelism: usize,
    between: impl FnOnce(DataStream<Tally>) -> DataStream<Tally>,
) -> DataStream<WindowReport> {
    let source = env
        .from_source(
            CheckSource { spec },
            WatermarkStrategy::for_monotonous_timestamps()
                .with_timestamp_assigner(|tally: &Tally, _| timestamp(tally.first)),
            "numbers",
        )
        .parallelism(parallelism)
        .uid("numbers");
    let records = between(source);
    let key = |tally: &Tally| tally.key;
    let tumbling = records
        .clone()
        .key_by(key)
        .window(TumblingEventTimeWindows::of(Duration::from_millis(
            TUMBLING_MS as u64,
        )))
        .reduce_with(Tally::merge, |key: &u32, window: &TimeWindow, t: Tally| {
            report(WindowKind::Tumbling, *key, window, t.count, t.sum)
        })
        .uid("tumbling");
    let sliding = records
        .clone()
        .key_by(key)
        .window(SlidingEventTimeWindows::of(
            Duration::from_millis(SLIDING_MS.0 as u64),
            Duration::from_millis(SLIDING_MS.1 as u64),
        ))
        .aggregate_with(
            CountAndSum,
            |key: &u32, window: &TimeWindow, (count, sum): (u64, u64)| {
                report(WindowKind::Sliding, *key, window, count, sum)
            },
        )
        .uid("sliding");
    let sessions = records
        .clone()
        .key_by(key)
        .window(EventTimeSessionWindows::with_gap(Duration::from_millis(
            SESSION_GAP_MS as u64,
        )))
        .process(
            |key: &u32,
             window: &TimeWindow,
             elements: WindowElements<'_, Tally>,
             out: &mut Collector<'_, WindowReport>| {
                let (count, sum) = elements
                    .iter()
                    .fold((0, 0), |(c, s), t| (c + t.count, s + t.sum));
                out.collect(report(WindowKind::Session, *key, window, count, sum));
            },
        )
        .uid("sessions");
    let counts = records
        .clone()
        .key_by(key)
        .count_window(COUNT)
        .reduce_with(Tally::merge, |key: &u32, _: &GlobalWindow, t: Tally| {
            WindowReport {
                kind: WindowKind::Count,
                key: *key,
                start: t.first as i64,
                end: (t.first + t.count) as i64,
                count: t.count,
                sum: t.sum,
            }
        })
        .uid("counts");
    let pairs = records
        .clone()
        .filter(|tally: &Tally| tally.first.is_multiple_of(JOIN_EVERY))
        .key_by(key)
        .interval_join(records.clone().key_by(key))
        .between(-JOIN_BOUND_MS, JOIN_BOUND_MS)
        .process(
            |left: &Tally, right: &Tally, ctx: &mut ProcessJoinContext<'_, WindowReport>| {
                ctx.emit(WindowReport {
                    kind: WindowKind::Join,
                    key: left.key,
                    start: left.first as i64,
                    end: right.first as i64,
                    count: 1,
                    sum: left.first + right.first,
                })
            },
        )
        .uid("pairs");
    tumbling.union([sliding, sessions, counts, pairs])
}

/// The reports a run of `spec` with `parallelism` readers must give, by window.
pub fn expected(
    spec: WindowCheckSpec,
    parallelism: usize,
) -> HashMap<(WindowKind, u32, i64, i64), (u64, u64)> {
    // Every key has the same sequence, so the same windows.
    let mut per_key: HashMap<(WindowKind, i64, i64), (u64, u64)> = HashMap::new();
    let mut add = |kind, start: i64, end: i64, seq: u64| {
        let entry = per_key.entry((kind, start, end)).or_default();
        entry.0 += 1;
        entry.1 += seq;
    };
    for seq in 0..spec.per_key {
        let ts = timestamp(seq);
        let start = ts - ts.rem_euclid(TUMBLING_MS);
        add(WindowKind::Tumbling, start, start + TUMBLING_MS, seq);
        let (size, slide) = SLIDING_MS;
        let mut start = ts - ts.rem_euclid(slide);
        while start > ts - size {
            add(WindowKind::Sliding, start, start + size, seq);
            start -= slide;
        }
        // Count windows that fill up.
        let window = seq / COUNT;
        if (window + 1) * COUNT <= spec.per_key {
            let start = (window * COUNT) as i64;
            add(WindowKind::Count, start, start + COUNT as i64, seq);
        }
        // A session: the records between two pauses, from the first's time to the last's
        // plus the gap.
        let first = seq / SESSION_RECORDS * SESSION_RECORDS;
        let last = (first + SESSION_RECORDS).min(spec.per_key) - 1;
        add(
            WindowKind::Session,
            timestamp(first),
            timestamp(last) + SESSION_GAP_MS,
            seq,
        );
    }
    // Pairs: sequence numbers near `left` whose times are within the bounds.
    for left in (0..spec.per_key).step_by(JOIN_EVERY as usize) {
        let at = timestamp(left);
        let near = left.saturating_sub(JOIN_BOUND_MS as u64)..(left + JOIN_BOUND_MS as u64 + 1);
        for right in near.filter(|r| *r < spec.per_key) {
            if (timestamp(right) - at).abs() <= JOIN_BOUND_MS {
                let figures = per_key
                    .entry((WindowKind::Join, left as i64, right as i64))
                    .or_default();
                *figures = (1, left + right);
            }
        }
    }
    let keys = spec.keys_per_split * parallelism as u32;
    (0..keys)
        .flat_map(|key| {
            per_key
                .iter()
                .map(move |(&(kind, start, end), &figures)| ((kind, key, start, end), figures))
        })
        .collect()
}

/// What is wrong with the reports of the runs `runs` of `spec` with `parallelism` readers
/// (one run, or a run and those that resumed it): windows and pairs reported twice by one run,
/// wrong, or missing from all — empty when every window held exactly its records.
pub fn problems(
    spec: WindowCheckSpec,
    parallelism: usize,
    runs: &[Vec<WindowReport>],
) -> Vec<String> {
    let expected = expected(spec, parallelism);
    let mut problems = Vec::new();
    let mut seen: HashMap<(WindowKind, u32, i64, i64), u32> = HashMap::new();
    for (run, reports) in runs.iter().enumerate() {
        let mut in_run = std::collections::HashSet::new();
        let mut repeated = 0;
        for report in reports {
            let window = (report.kind, report.key, report.start, report.end);
            if !in_run.insert(window) {
                repeated += 1;
            }
        }
        if repeated > 0 {
            problems.push(format!(
                "run {run} reported {repeated} windows or pairs twice"
            ));
        }
    }
    for report in runs.iter().flatten() {
        let window = (report.kind, report.key, report.start, report.end);
        *seen.entry(window).or_default() += 1;
        match expected.get(&window) {
            None => problems.push(format!("{report:?}: no such window")),
            Some(&(count, sum)) if (count, sum) != (report.count, report.sum) => problems.push(
                format!("{report:?}: expected {count} records summing to {sum}"),
            ),
            Some(_) => {}
        }
    }
    let mut missing: Vec<_> = expected
        .keys()
        .filter(|window| !seen.contains_key(window))
        .collect();
    missing.sort_unstable();
    if !missing.is_empty() {
        problems.push(format!(
            "{} windows or pairs never reported, the first {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        ));
    }
    if problems.len() > MAX_PROBLEMS {
        let more = problems.len() - MAX_PROBLEMS;
        problems.truncate(MAX_PROBLEMS);
        problems.push(format!("and {more} more"));
    }
    problems
}

/// Problems listed before the rest are counted.
const MAX_PROBLEMS: usize = 10;

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: WindowCheckSpec = WindowCheckSpec {
        keys_per_split: 3,
        per_key: 500,
        rate: None,
    };

    #[test]
    fn every_window_reports_its_records_once() {
        for parallelism in [1, 2] {
            let env = StreamEnvironment::new(Configuration::default()).unwrap();
            let (sink, collected) = CollectSink::new();
            reports(&env, SPEC, parallelism).sink_to(sink, "collect");
            env.execute("window-check").unwrap();
            let reports = collected.records();
            assert_eq!(reports.len(), expected(SPEC, parallelism).len());
            assert_eq!(
                problems(SPEC, parallelism, &[reports]),
                Vec::<String>::new()
            );
        }
    }

    #[test]
    fn the_check_sees_wrong_missing_and_repeated_windows() {
        let env = StreamEnvironment::new(Configuration::default()).unwrap();
        let (sink, collected) = CollectSink::new();
        reports(&env, SPEC, 1).sink_to(sink, "collect");
        env.execute("window-check").unwrap();
        let good = collected.records();
        let mut wrong = good.clone();
        wrong[3].count += 1;
        assert_eq!(problems(SPEC, 1, &[wrong]).len(), 1);
        let missing = good[1..].to_vec();
        assert_eq!(problems(SPEC, 1, &[missing]).len(), 1);
        let mut repeated = good.clone();
        repeated.push(good[0].clone());
        assert_eq!(problems(SPEC, 1, &[repeated]).len(), 1);
        let again = vec![good[0].clone()];
        assert!(
            problems(SPEC, 1, &[good, again]).is_empty(),
            "another run may report it again"
        );
    }

    #[test]
    fn sessions_pause_after_their_records() {
        assert_eq!(timestamp(SESSION_RECORDS - 1), SESSION_RECORDS as i64 - 1);
        assert_eq!(
            timestamp(SESSION_RECORDS),
            (SESSION_RECORDS + SESSION_PAUSE_MS) as i64
        );
        let sessions = expected(SPEC, 1)
            .keys()
            .filter(|(kind, key, ..)| *kind == WindowKind::Session && *key == 0)
            .count() as u64;
        assert_eq!(sessions, SPEC.per_key.div_ceil(SESSION_RECORDS));
    }
}
