//! Per-subtask operator metrics: counters written by one shard without atomic read-modify-write
//! on the hot path, read from any thread when a report or a scrape asks.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A counter with a single writer (the shard running the subtask) and any number of readers.
/// `add` is a plain load and store, not a locked increment.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Adds `n`. Only the owning subtask may call this.
    #[inline]
    pub fn add(&self, n: u64) {
        let cell = &self.0;
        cell.store(cell.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Where a task's time goes (Flink's busy, idle and backpressured time), what crosses its
/// exchanges, and its event time, written by the task's shard only. The clocks are read only
/// where a task stops to wait (its input ran dry, or its output has no credit), never per
/// record: busy time is what is left.
#[derive(Debug)]
pub struct TaskMetrics {
    /// The stream node id of the chain's first operator.
    pub head: usize,
    /// The subtask index.
    pub subtask: usize,
    started: Instant,
    idle: Stopwatch,
    backpressured: Stopwatch,
    /// Bytes of the segments it read from other shards.
    pub bytes_in: Counter,
    /// Bytes of the segments it sent to other shards (records to a subtask on the same shard
    /// move without being serialized, and count no bytes).
    pub bytes_out: Counter,
    /// The event time its chain is at: the input watermark of a task reading an exchange, the
    /// watermark a source emitted (`i64::MIN` before the first).
    watermark: AtomicI64,
    /// Its input channels, in the input gate's order.
    channels: Vec<ChannelGauge>,
    /// A source's splits, with their watermarks as of their last publication.
    splits: Mutex<Vec<SplitFigures>>,
    /// The highest busy, idle and backpressured nanoseconds a reading reported: readings
    /// never go back (a reading can race a wait that starts or ends, by the time the writer
    /// takes to publish it).
    reported: [AtomicU64; 3],
}

/// A watermark gauge's value, `None` while it holds `i64::MIN` (none yet).
fn known(watermark: i64) -> Option<i64> {
    Some(watermark).filter(|&w| w != i64::MIN)
}

/// Total nanoseconds spent in a state, and when the state was entered if the task is in it
/// now (nanoseconds since the task started, plus one; 0 when it is not). Its one writer
/// moves a stretch that ended from `since` into `total_ns` inside a sequence bracket, so that
/// a reading never sees the stretch twice or not at all (the counters it feeds never go
/// back).
#[derive(Debug, Default)]
struct Stopwatch {
    /// Odd while the writer moves a stretch into the total.
    sequence: AtomicU64,
    total_ns: AtomicU64,
    since: AtomicU64,
}

impl Stopwatch {
    fn start(&self, started: Instant) {
        debug_assert_eq!(
            self.since.load(Ordering::Relaxed),
            0,
            "a wait started inside another of the same kind"
        );
        self.since
            .store(started.elapsed().as_nanos() as u64 + 1, Ordering::Release);
    }

    fn stop(&self, started: Instant) {
        let since = self.since.load(Ordering::Relaxed);
        if since == 0 {
            return;
        }
        let now = started.elapsed().as_nanos() as u64 + 1;
        let sequence = self.sequence.load(Ordering::Relaxed);
        self.sequence.store(sequence + 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        let total = self.total_ns.load(Ordering::Relaxed) + now.saturating_sub(since);
        self.total_ns.store(total, Ordering::Relaxed);
        self.since.store(0, Ordering::Relaxed);
        self.sequence.store(sequence + 2, Ordering::Release);
    }

    /// The total and the current stretch's start, as of one moment (take the time after
    /// this: every stretch it holds started and ended before).
    fn read(&self) -> Reading {
        loop {
            let before = self.sequence.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let total = self.total_ns.load(Ordering::Relaxed);
            let since = self.since.load(Ordering::Relaxed);
            std::sync::atomic::fence(Ordering::Acquire);
            if self.sequence.load(Ordering::Relaxed) == before {
                return Reading { total, since };
            }
        }
    }
}

/// A [`Stopwatch`] as of one moment.
#[derive(Clone, Copy)]
struct Reading {
    total: u64,
    since: u64,
}

impl Reading {
    /// Nanoseconds in the state, including the stretch it is in, at `now_ns` since the start.
    fn at(self, now_ns: u64) -> u64 {
        let running = if self.since > 0 {
            (now_ns + 1).saturating_sub(self.since)
        } else {
            0
        };
        self.total + running
    }
}

/// Stops its stopwatch when dropped (however the wait ends).
#[must_use = "the wait is timed until this is dropped"]
pub struct Timed<'a> {
    watch: &'a Stopwatch,
    started: Instant,
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        self.watch.stop(self.started);
    }
}

/// One input channel of a task: who sends on it, and the watermark it last sent.
#[derive(Debug)]
struct ChannelGauge {
    from: ChannelSource,
    watermark: AtomicI64,
    idle: AtomicBool,
}

/// The subtask sending on a channel: the stream node id of its chain's first operator, and
/// its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChannelSource {
    /// The sending task's first operator.
    pub head: usize,
    /// The sending subtask.
    pub subtask: usize,
}

/// A reading of one input channel.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChannelFigures {
    /// Who sends on it.
    pub from: ChannelSource,
    /// The watermark it last sent (`None` before the first; `i64::MAX` once it ended).
    pub watermark: Option<i64>,
    /// Whether its sender declared itself idle.
    pub idle: bool,
}

/// A reading of one split of a source subtask.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SplitFigures {
    /// The split's number in its reader (in the order it was added).
    #[serde(skip)]
    pub number: u32,
    /// The split's id (`SourceSplit::split_id`).
    pub split: String,
    /// Its watermark (`None` before the first).
    pub watermark: Option<i64>,
    /// Whether it is idle (it does not hold event time back).
    pub idle: bool,
}

/// A reading of a task's time, in seconds since it started.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TaskTime {
    /// Seconds since the task started.
    pub elapsed: f64,
    /// Working: neither idle nor backpressured. None of the three goes back from one
    /// reading to the next (so they may add up to a little more than `elapsed`).
    pub busy: f64,
    /// Waiting for input.
    pub idle: f64,
    /// Waiting for credit downstream.
    pub backpressured: f64,
}

impl TaskMetrics {
    /// A task starting now, whose input channels are sent on by `channels`.
    pub fn new(head: usize, subtask: usize, channels: Vec<ChannelSource>) -> Self {
        TaskMetrics {
            head,
            subtask,
            started: Instant::now(),
            idle: Stopwatch::default(),
            backpressured: Stopwatch::default(),
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
            watermark: AtomicI64::new(i64::MIN),
            channels: channels
                .into_iter()
                .map(|from| ChannelGauge {
                    from,
                    watermark: AtomicI64::new(i64::MIN),
                    idle: AtomicBool::new(false),
                })
                .collect(),
            splits: Mutex::new(Vec::new()),
            reported: Default::default(),
        }
    }

    /// The task waits for input until the returned guard is dropped.
    #[inline]
    pub fn idle(&self) -> Timed<'_> {
        self.timed(&self.idle)
    }

    /// The task waits for credit until the returned guard is dropped.
    #[inline]
    pub fn backpressured(&self) -> Timed<'_> {
        self.timed(&self.backpressured)
    }

    fn timed<'a>(&'a self, watch: &'a Stopwatch) -> Timed<'a> {
        watch.start(self.started);
        Timed {
            watch,
            started: self.started,
        }
    }

    /// Where its time went so far.
    pub fn time(&self) -> TaskTime {
        let (idle, backpressured) = (self.idle.read(), self.backpressured.read());
        let now_ns = self.started.elapsed().as_nanos() as u64;
        let (idle, backpressured) = (idle.at(now_ns), backpressured.at(now_ns));
        let busy = now_ns.saturating_sub(idle + backpressured);
        let kept = |i: usize, ns: u64| self.reported[i].fetch_max(ns, Ordering::Relaxed).max(ns);
        let (busy, idle, backpressured) = (kept(0, busy), kept(1, idle), kept(2, backpressured));
        let seconds = |ns: u64| ns as f64 / 1e9;
        TaskTime {
            elapsed: seconds(now_ns),
            busy: seconds(busy),
            idle: seconds(idle),
            backpressured: seconds(backpressured),
        }
    }

    /// The chain's event time advanced to `watermark`.
    #[inline]
    pub fn set_watermark(&self, watermark: i64) {
        self.watermark.store(watermark, Ordering::Relaxed);
    }

    /// The chain's event time (`None` before the first watermark).
    pub fn watermark(&self) -> Option<i64> {
        known(self.watermark.load(Ordering::Relaxed))
    }

    /// Input channel `channel` is at `watermark` and (not) idle.
    pub fn set_channel(&self, channel: usize, watermark: i64, idle: bool) {
        if let Some(gauge) = self.channels.get(channel) {
            gauge.watermark.store(watermark, Ordering::Relaxed);
            gauge.idle.store(idle, Ordering::Relaxed);
        }
    }

    /// Its input channels now.
    pub fn channels(&self) -> Vec<ChannelFigures> {
        self.channels
            .iter()
            .map(|gauge| ChannelFigures {
                from: gauge.from,
                watermark: known(gauge.watermark.load(Ordering::Relaxed)),
                idle: gauge.idle.load(Ordering::Relaxed),
            })
            .collect()
    }

    fn lock_splits(&self) -> std::sync::MutexGuard<'_, Vec<SplitFigures>> {
        self.splits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A source reader was given split `id`, its `number`th.
    pub fn split_added(&self, number: u32, id: String) {
        self.lock_splits().push(SplitFigures {
            number,
            split: id,
            watermark: None,
            idle: false,
        });
    }

    /// A source reader read split `number` to its end.
    pub fn split_finished(&self, number: u32) {
        self.lock_splits().retain(|s| s.number != number);
    }

    /// Each split's watermark and idleness now (`number`, watermark, idle), from the source's
    /// periodic emission.
    pub fn set_splits(&self, states: impl Iterator<Item = (u32, i64, bool)>) {
        let mut splits = self.lock_splits();
        for (number, watermark, idle) in states {
            if let Some(split) = splits.iter_mut().find(|s| s.number == number) {
                split.watermark = known(watermark);
                split.idle = idle;
            }
        }
    }

    /// A source's splits now.
    pub fn splits(&self) -> Vec<SplitFigures> {
        self.lock_splits().clone()
    }
}

/// The counters of one operator in one subtask.
#[derive(Debug)]
pub struct OperatorMetrics {
    /// The stream node id of the operator.
    pub node: usize,
    /// The operator's name.
    pub name: String,
    /// The subtask index.
    pub subtask: usize,
    /// Records the operator received.
    pub records_in: Counter,
    /// Records the operator emitted.
    pub records_out: Counter,
    /// Times a full segment found no credit on its channel and the task had to wait
    /// (backpressure from downstream).
    pub backpressure_waits: Counter,
    /// Records that arrived after their window's allowed lateness and were dropped (Flink's
    /// `numLateRecordsDropped`).
    pub late_records_dropped: Counter,
    /// Bytes of the segments it sent to other shards.
    pub bytes_out: Counter,
    /// A sink's: the age of the latency markers it took, per source operator.
    pub latency: Mutex<Vec<LatencyHistogram>>,
    /// The task it runs in (shared by the operators chained in it).
    pub task: Arc<TaskMetrics>,
}

/// Upper bounds, in seconds, of the latency histogram's buckets.
pub const LATENCY_SECONDS_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The ages of the latency markers of one source operator at one sink subtask (Flink's
/// `latency` histogram, at operator granularity).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyHistogram {
    /// The source operator's stream node id.
    pub source: usize,
    /// Markers per bucket of [`LATENCY_SECONDS_BUCKETS`], one more for those above the last.
    pub buckets: Vec<u64>,
    /// The sum of the ages, seconds.
    pub sum_seconds: f64,
}

impl OperatorMetrics {
    /// A latency marker of source operator `source` reached this sink, `age_ms` after its
    /// source marked it. Markers come a few times a second per source subtask, never per
    /// record: a lock is cheap here.
    pub(crate) fn record_latency(&self, source: usize, age_ms: i64) {
        let seconds = age_ms.max(0) as f64 / 1000.0;
        let bucket = LATENCY_SECONDS_BUCKETS
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(LATENCY_SECONDS_BUCKETS.len());
        let mut histograms = self.latency.lock().unwrap_or_else(|e| e.into_inner());
        let index = match histograms.iter().position(|h| h.source == source) {
            Some(index) => index,
            None => {
                histograms.push(LatencyHistogram {
                    source,
                    buckets: vec![0; LATENCY_SECONDS_BUCKETS.len() + 1],
                    sum_seconds: 0.0,
                });
                histograms.len() - 1
            }
        };
        let histogram = &mut histograms[index];
        histogram.buckets[bucket] += 1;
        histogram.sum_seconds += seconds;
    }
}

/// A reading of one operator's counters, summed over its subtasks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorCounts {
    /// The stream node id of the operator.
    pub node: usize,
    /// The operator's name.
    pub name: String,
    /// Number of subtasks.
    pub subtasks: usize,
    /// Records received.
    pub records_in: u64,
    /// Records emitted.
    pub records_out: u64,
    /// Waits for credit.
    pub backpressure_waits: u64,
    /// Late records dropped, summed over subtasks.
    pub late_records_dropped: u64,
}

/// All operator metrics of a job.
#[derive(Clone, Debug, Default)]
pub struct MetricsRegistry {
    operators: Arc<Mutex<Vec<Arc<OperatorMetrics>>>>,
}

impl MetricsRegistry {
    /// Registers the counters of `name` in `subtask`, the first operator of its own task.
    pub fn register(&self, node: usize, name: &str, subtask: usize) -> Arc<OperatorMetrics> {
        let task = Arc::new(TaskMetrics::new(node, subtask, Vec::new()));
        self.register_in(&task, node, name)
    }

    /// Registers the counters of `name`, chained in `task`.
    pub fn register_in(
        &self,
        task: &Arc<TaskMetrics>,
        node: usize,
        name: &str,
    ) -> Arc<OperatorMetrics> {
        let metrics = Arc::new(OperatorMetrics {
            node,
            name: name.to_string(),
            subtask: task.subtask,
            records_in: Counter::default(),
            records_out: Counter::default(),
            backpressure_waits: Counter::default(),
            late_records_dropped: Counter::default(),
            bytes_out: Counter::default(),
            latency: Mutex::default(),
            task: Arc::clone(task),
        });
        self.operators
            .lock()
            .expect("metrics lock")
            .push(Arc::clone(&metrics));
        metrics
    }

    /// The counters of every operator in every subtask, as registered.
    pub fn subtasks(&self) -> Vec<Arc<OperatorMetrics>> {
        self.operators.lock().expect("metrics lock").clone()
    }

    /// Current counts per operator, in stream node order.
    pub fn snapshot(&self) -> Vec<OperatorCounts> {
        let operators = self.operators.lock().expect("metrics lock");
        let mut counts: Vec<OperatorCounts> = Vec::new();
        for m in operators.iter() {
            let entry = match counts.iter_mut().find(|c| c.node == m.node) {
                Some(entry) => entry,
                None => {
                    counts.push(OperatorCounts {
                        node: m.node,
                        name: m.name.clone(),
                        subtasks: 0,
                        records_in: 0,
                        records_out: 0,
                        backpressure_waits: 0,
                        late_records_dropped: 0,
                    });
                    counts.last_mut().expect("just pushed")
                }
            };
            entry.subtasks += 1;
            entry.records_in += m.records_in.get();
            entry.records_out += m.records_out.get();
            entry.backpressure_waits += m.backpressure_waits.get();
            entry.late_records_dropped += m.late_records_dropped.get();
        }
        counts.sort_by_key(|c| c.node);
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn waits_are_timed_while_they_last_and_add_up_once_over() {
        let task = TaskMetrics::new(0, 0, Vec::new());
        let zero = task.time();
        assert_eq!((zero.idle, zero.backpressured), (0.0, 0.0));
        {
            let _idle = task.idle();
            std::thread::sleep(Duration::from_millis(30));
            let during = task.time();
            assert!(
                during.idle >= 0.03,
                "a wait counts while it lasts: {during:?}"
            );
        }
        let after = task.time();
        std::thread::sleep(Duration::from_millis(10));
        let later = task.time();
        assert_eq!(after.idle, later.idle, "an ended wait counts no more");
        assert!(later.elapsed > after.elapsed);
        {
            let _backpressured = task.backpressured();
            std::thread::sleep(Duration::from_millis(20));
        }
        let time = task.time();
        assert!(time.backpressured >= 0.02 && time.backpressured < time.elapsed - time.idle);
        assert_eq!(time.idle, later.idle);
    }

    #[test]
    fn channels_and_splits_show_their_latest_event_time() {
        let from = |subtask| ChannelSource { head: 3, subtask };
        let task = TaskMetrics::new(5, 1, vec![from(0), from(1)]);
        assert_eq!(task.watermark(), None);
        task.set_watermark(7);
        assert_eq!(task.watermark(), Some(7));
        task.set_channel(1, 40, true);
        task.set_channel(9, 1, false);
        // Readings never go back.
        let first = task.time();
        assert!(task.time().busy >= first.busy);
        let channels = task.channels();
        assert_eq!(channels[0].watermark, None);
        assert_eq!((channels[1].watermark, channels[1].idle), (Some(40), true));
        assert_eq!(channels[1].from, from(1));
        task.split_added(0, "a".into());
        task.split_added(1, "b".into());
        task.set_splits([(0, 10, false), (1, i64::MIN, true)].into_iter());
        task.split_finished(0);
        assert_eq!(
            task.splits(),
            vec![SplitFigures {
                number: 1,
                split: "b".into(),
                watermark: None,
                idle: true
            }]
        );
    }
}
