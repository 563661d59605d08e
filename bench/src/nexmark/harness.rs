//! `weir bench nexmark`: one Nexmark query on the engine (embedded, `--parallelism` shards) or
//! its hand-written baseline, timed, with the output's count and checksum and — for the engine
//! — the latency from an event's generation to the emission of the result it completes.
//!
//! **Latency.** The source's generator notes the wall time at which its clock (an event's time
//! before any delay the generator gives it) first reaches each millisecond (a timeline). The sink
//! samples every [`SAMPLE_EVERY`]th result with the wall time of its write and its *origin*: the
//! event time whose arrival made the result possible — the record's own time for q0–q3 (which emit
//! per event), the window's end plus the watermark delay for window and timer outputs (the event
//! that moves the watermark past the window). A result's latency is its write time minus the time
//! its origin was generated; percentiles come from an HDR histogram (µs precision). The origin is
//! resolved to the millisecond, so a figure is at most 1 ms of event time pessimistic. With
//! `--rate` the generator's event time runs at that rate, so event time and wall time agree (as in
//! Flink's Nexmark runner); without it the generator runs flat out at 10 M events/s of event time
//! and latencies mostly show queueing.

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use weir_engine::checkpoint::CheckpointStats;
use weir_engine::connector::{ConnectorError, Generator, LocalBoxFuture, Sink, SinkWriter};
use weir_engine::monitor::JobMonitor;
use weir_engine::prelude::*;
use weir_engine::runtime::{PeriodicThread, RunOptions};
use weir_engine::NO_TIMESTAMP;

use super::baseline;
use super::checksum::{checksum_of, q12_totals, q4_final, BaselineResult, Checksum, StableHash};
use super::generator::{NexmarkConfig, NexmarkGenerator, BASE_TIME_MS, WATERMARK_DELAY_MS};
use super::model::{BidderWindowCount, CategoryAverage, Event};
use super::queries;
use crate::BenchError;

/// One result in this many is sampled for latency.
pub const SAMPLE_EVERY: u64 = 64;

/// The queries of the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Query {
    /// Pass-through.
    Q0,
    /// Currency conversion.
    Q1,
    /// Selection.
    Q2,
    /// Local item suggestion (join).
    Q3,
    /// Average price per category.
    Q4,
    /// Hot items (sliding windows).
    Q5,
    /// Highest bid (tumbling windows).
    Q7,
    /// Monitor new users (window join).
    Q8,
    /// User sessions.
    Q11,
    /// Processing-time windows.
    Q12,
}

impl Query {
    /// Every query, in suite order.
    pub const ALL: [Query; 10] = [
        Query::Q0,
        Query::Q1,
        Query::Q2,
        Query::Q3,
        Query::Q4,
        Query::Q5,
        Query::Q7,
        Query::Q8,
        Query::Q11,
        Query::Q12,
    ];

    /// `q0`, `q1`, …
    pub fn name(self) -> &'static str {
        match self {
            Query::Q0 => "q0",
            Query::Q1 => "q1",
            Query::Q2 => "q2",
            Query::Q3 => "q3",
            Query::Q4 => "q4",
            Query::Q5 => "q5",
            Query::Q7 => "q7",
            Query::Q8 => "q8",
            Query::Q11 => "q11",
            Query::Q12 => "q12",
        }
    }

    /// The query's hand-written baseline over events `0..events` of a generator.
    pub fn baseline(self) -> fn(&NexmarkGenerator, u64) -> BaselineResult {
        match self {
            Query::Q0 => baseline::run_q0,
            Query::Q1 => baseline::run_q1,
            Query::Q2 => baseline::run_q2,
            Query::Q3 => baseline::run_q3,
            Query::Q4 => baseline::run_q4,
            Query::Q5 => baseline::run_q5,
            Query::Q7 => baseline::run_q7,
            Query::Q8 => baseline::run_q8,
            Query::Q11 => baseline::run_q11,
            Query::Q12 => baseline::run_q12,
        }
    }

    /// How much later than a result's timestamp its origin event comes (see the module docs):
    /// nothing for per-event results, the watermark delay for window and timer outputs (their
    /// timestamp is the window's last millisecond). `None` for q12, whose processing-time
    /// windows are stamped with wall-clock time, not event time: it has no latency figure.
    fn origin_delay_ms(self) -> Option<i64> {
        match self {
            Query::Q0 | Query::Q1 | Query::Q2 | Query::Q3 => Some(0),
            Query::Q12 => None,
            _ => Some(WATERMARK_DELAY_MS + 1),
        }
    }
}

impl std::str::FromStr for Query {
    type Err = String;

    fn from_str(text: &str) -> Result<Query, String> {
        Query::ALL
            .into_iter()
            .find(|q| q.name().eq_ignore_ascii_case(text))
            .ok_or_else(|| {
                let names: Vec<&str> = Query::ALL.iter().map(|q| q.name()).collect();
                format!(
                    "unknown Nexmark query '{text}'; the suite has {}",
                    names.join(", ")
                )
            })
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct NexmarkOptions {
    /// The query.
    pub query: Query,
    /// Events to generate.
    pub events: u64,
    /// Shards (and source subtasks) of the engine run.
    pub parallelism: usize,
    /// Events per second in all, or as fast as possible.
    pub rate: Option<f64>,
    /// `state.backend.type` of the engine run.
    pub state_backend: String,
    /// `execution.buffer-timeout` of the engine run, in milliseconds.
    pub buffer_timeout_ms: u64,
    /// The generator's seed.
    pub seed: u64,
    /// Checkpoint the engine run this often (into a temporary directory); `None`: off.
    pub checkpoint_interval_ms: Option<u64>,
    /// Further engine settings, `KEY=VALUE` (`-D`), applied after the ones above.
    pub settings: Vec<String>,
    /// Read the job's live figures this often and encode them as an executor does for its
    /// worker's `/metrics` (`None`: no monitor is read).
    pub scrape_ms: Option<u64>,
    /// Executors the engine run is spread over, in this process (1: one executor; more: one
    /// slot each, QUIC with mutual TLS on loopback between them).
    pub executors: usize,
}

/// Milliseconds at the median and the maximum.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct MedianMaxMs {
    /// Median.
    pub p50: f64,
    /// Largest.
    pub max: f64,
}

/// Milliseconds at the median, the 99th percentile and the maximum.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct PausesMs {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// The size of the last checkpoint.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CheckpointBytes {
    /// Of the last full checkpoint.
    pub last_full: u64,
    /// What the last one wrote: its full size less the shared files earlier checkpoints
    /// wrote and it lists again (RocksDB's SST files, links of window chains).
    pub last_incremental: u64,
}

/// What the checkpoints of an engine run did.
#[derive(Clone, Debug, Serialize)]
pub struct CheckpointFigures {
    /// The interval asked for.
    pub interval_ms: u64,
    /// Checkpoints completed.
    pub checkpoints_completed: u64,
    /// Checkpoints aborted.
    pub checkpoints_aborted: u64,
    /// Trigger to commit (`None`: none completed).
    pub checkpoint_duration_ms: Option<MedianMaxMs>,
    /// Size of the last completed checkpoint.
    pub checkpoint_bytes: CheckpointBytes,
    /// Per task and checkpoint, the longest its shard worked on the snapshot instead of
    /// records at once: the barrier's part plus the longest piece of the encoding after it
    /// (`None`: none completed).
    pub sync_pause_ms: Option<PausesMs>,
}

impl CheckpointFigures {
    pub(crate) fn of(interval_ms: u64, stats: &CheckpointStats) -> Self {
        let ms = |durations: &[Duration]| {
            let mut ms: Vec<f64> = durations.iter().map(|d| d.as_secs_f64() * 1e3).collect();
            ms.sort_by(f64::total_cmp);
            ms
        };
        let at = |sorted: &[f64], q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
        let durations = ms(&stats.durations);
        let pauses = ms(&stats.sync_pauses);
        CheckpointFigures {
            interval_ms,
            checkpoints_completed: stats.completed,
            checkpoints_aborted: stats.aborted,
            checkpoint_duration_ms: (!durations.is_empty()).then(|| MedianMaxMs {
                p50: at(&durations, 0.5),
                max: at(&durations, 1.0),
            }),
            checkpoint_bytes: CheckpointBytes {
                last_full: stats.last_bytes,
                last_incremental: stats.last_incremental_bytes,
            },
            sync_pause_ms: (!pauses.is_empty()).then(|| PausesMs {
                p50: at(&pauses, 0.5),
                p99: at(&pauses, 0.99),
                max: at(&pauses, 1.0),
            }),
        }
    }
}

/// Latency percentiles, in milliseconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LatencyMs {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
    /// Results sampled.
    pub samples: u64,
}

/// One run's report (`--json` prints it as one object).
#[derive(Clone, Debug, Serialize)]
pub struct NexmarkReport {
    /// `q0`, …
    pub query: &'static str,
    /// `weir` or `baseline`.
    pub engine: &'static str,
    /// Events generated.
    pub events: u64,
    /// Wall time of the run (the engine's: deployment to the end of the job).
    pub seconds: f64,
    /// Events per second.
    pub events_per_second: f64,
    /// Events per second per core.
    pub events_per_second_per_core: f64,
    /// Cores used (shards; 1 for the baseline).
    pub cores: usize,
    /// Executors the engine run was spread over (1: one; and for the baseline).
    pub executors: usize,
    /// Generation-to-result latency (engine runs; `None` for the baseline, for q12 — its
    /// windows are in processing time — or without results).
    pub latency_ms: Option<LatencyMs>,
    /// Output records.
    pub results: u64,
    /// The output's checksum (q4: of the final value per category; q12: of the bids per
    /// bidder), hexadecimal: equal for the engine and the baseline on the same events.
    pub checksum: String,
    /// The requested rate, if throttled.
    pub rate: Option<f64>,
    /// The engine's state backend (`None` for the baseline).
    pub state_backend: Option<String>,
    /// The further engine settings the run had (`-D KEY=VALUE`; none for the baseline).
    pub settings: Vec<String>,
    /// The checkpoints' figures (`None`: the run was not checkpointed).
    #[serde(flatten)]
    pub checkpoints: Option<CheckpointFigures>,
    /// Readings of the live figures taken during the run (`--scrape-ms`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scrapes: Option<u64>,
}

fn generator(options: &NexmarkOptions) -> Result<NexmarkGenerator, BenchError> {
    let mut config = NexmarkConfig {
        seed: options.seed,
        ..NexmarkConfig::default()
    };
    if let Some(rate) = options.rate {
        // Event time runs at the wall-clock rate, so windows close in real time.
        config.first_event_rate = rate.round().max(1.0) as u64;
    }
    NexmarkGenerator::new(config).map_err(|e| BenchError::Nexmark(e.to_string()))
}

fn check(options: &NexmarkOptions) -> Result<(), BenchError> {
    if options.events == 0 {
        return Err(BenchError::NoRecords);
    }
    if options.parallelism == 0 {
        return Err(BenchError::NoShards);
    }
    let cores = weir_engine::runtime::available_cores().len();
    if options.parallelism > cores {
        return Err(BenchError::TooManyShards {
            shards: options.parallelism,
            cores,
        });
    }
    if options.rate.is_some_and(|r| !(r >= 1.0 && r.is_finite())) {
        return Err(BenchError::Nexmark(format!(
            "--rate must be at least 1 event per second, got {}",
            options.rate.unwrap_or_default()
        )));
    }
    Ok(())
}

/// Runs the query's hand-written baseline, single-threaded.
pub fn run_baseline(options: &NexmarkOptions) -> Result<NexmarkReport, BenchError> {
    check(options)?;
    let generator = generator(options)?;
    let started = Instant::now();
    let result = options.query.baseline()(&generator, options.events);
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    let rate = options.events as f64 / seconds;
    Ok(NexmarkReport {
        query: options.query.name(),
        engine: "baseline",
        events: options.events,
        seconds,
        events_per_second: rate,
        events_per_second_per_core: rate,
        cores: 1,
        executors: 1,
        latency_ms: None,
        results: result.results,
        checksum: format!("{:016x}", result.checksum),
        rate: None,
        state_backend: None,
        settings: Vec::new(),
        checkpoints: None,
        scrapes: None,
    })
}

/// When the generator first reached each millisecond of event time.
#[derive(Debug)]
struct Timeline {
    started: Instant,
    latest: AtomicI64,
    /// (event time, nanoseconds since `started`), one per millisecond reached.
    marks: Mutex<Vec<(i64, u64)>>,
}

impl Timeline {
    fn new() -> Self {
        Timeline {
            started: Instant::now(),
            latest: AtomicI64::new(i64::MIN),
            marks: Mutex::new(Vec::new()),
        }
    }

    fn nanos(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    #[inline]
    fn reached(&self, event_time: i64) {
        if event_time > self.latest.load(Ordering::Relaxed)
            && self.latest.fetch_max(event_time, Ordering::Relaxed) < event_time
        {
            let now = self.nanos();
            self.marks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((event_time, now));
        }
    }

    /// The marks sorted by event time, each with the earliest time any later millisecond was
    /// reached (so a lookup finds when event time first reached *at least* a value).
    fn sorted(&self) -> Vec<(i64, u64)> {
        let mut marks = self.marks.lock().unwrap_or_else(|e| e.into_inner()).clone();
        marks.sort_unstable();
        let mut earliest = u64::MAX;
        for mark in marks.iter_mut().rev() {
            earliest = earliest.min(mark.1);
            mark.1 = earliest;
        }
        marks
    }
}

/// The Nexmark generator, noting its progress on a [`Timeline`].
struct Timed {
    generator: NexmarkGenerator,
    timeline: Arc<Timeline>,
}

/// Each event notes the generator's own clock, before any delay it gives the event.
impl Generator<Event> for Timed {
    #[inline]
    fn generate(&self, index: u64) -> Event {
        let generator = &self.generator;
        self.timeline
            .reached(generator.timestamp(generator.event_number(index)));
        generator.generate(index)
    }

    /// What the engine's source calls: the event built in its batch, its time noted on the
    /// way (worked out once).
    #[inline]
    fn generate_into<'a>(&self, index: u64, slot: &'a mut MaybeUninit<Event>) -> &'a mut Event {
        self.generator
            .generate_into(index, slot, |time| self.timeline.reached(time))
    }
}

/// What the sinks of one run gathered.
struct Gathered<T> {
    checksum: Checksum,
    /// (origin event time, write time in nanoseconds since the timeline started).
    samples: Vec<(i64, u64)>,
    kept: Vec<T>,
}

impl<T> Default for Gathered<T> {
    fn default() -> Self {
        Gathered {
            checksum: Checksum::default(),
            samples: Vec::new(),
            kept: Vec::new(),
        }
    }
}

/// Counts, checksums, samples latency and (for q4 and q12) keeps the results.
struct ResultSink<T> {
    gathered: Arc<Mutex<Gathered<T>>>,
    results: Arc<AtomicU64>,
    timeline: Arc<Timeline>,
    origin_delay_ms: Option<i64>,
    keep: bool,
}

struct ResultWriter<T> {
    gathered: Arc<Mutex<Gathered<T>>>,
    results: Arc<AtomicU64>,
    timeline: Arc<Timeline>,
    origin_delay_ms: Option<i64>,
    keep: bool,
    local: Gathered<T>,
    seen: u64,
}

impl<T: StableHash + Record> Sink<T> for ResultSink<T> {
    fn create_writer(
        &self,
        _ctx: &RuntimeContext,
    ) -> Result<Box<dyn SinkWriter<T>>, ConnectorError> {
        Ok(Box::new(ResultWriter {
            gathered: Arc::clone(&self.gathered),
            results: Arc::clone(&self.results),
            timeline: Arc::clone(&self.timeline),
            origin_delay_ms: self.origin_delay_ms,
            keep: self.keep,
            local: Gathered::default(),
            seen: 0,
        }))
    }
}

impl<T: StableHash + Record> SinkWriter<T> for ResultWriter<T> {
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<T>,
        timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
        let now = self.timeline.nanos();
        self.results
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        for (record, &timestamp) in batch.iter().zip(timestamps) {
            self.local.checksum.add(record);
            self.seen += 1;
            // Results 1, 1 + SAMPLE_EVERY, …: a query with few results still gets samples.
            if let Some(delay) = self.origin_delay_ms {
                if self.seen % SAMPLE_EVERY == 1 && timestamp != NO_TIMESTAMP {
                    self.local
                        .samples
                        .push((timestamp.saturating_add(delay), now));
                }
            }
        }
        if self.keep {
            self.local.kept.append(batch);
        } else {
            batch.clear();
        }
        Box::pin(async { Ok(()) })
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        let mut gathered = self.gathered.lock().unwrap_or_else(|e| e.into_inner());
        gathered.checksum.merge(self.local.checksum);
        gathered.samples.append(&mut self.local.samples);
        gathered.kept.append(&mut self.local.kept);
        Box::pin(async { Ok(()) })
    }
}

/// The sink end of one run, typed by the query's output.
struct Outputs<T> {
    gathered: Arc<Mutex<Gathered<T>>>,
}

impl<T: StableHash + Record> Outputs<T> {
    fn take(&self) -> Gathered<T> {
        std::mem::take(&mut *self.gathered.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Attaches the result sinks of one run (all sharing its timeline and result counter).
struct Attach<'a> {
    query: Query,
    timeline: &'a Arc<Timeline>,
    counter: &'a Arc<AtomicU64>,
    /// What the sinks gather into: made by the first job attached, shared by the others
    /// (the executors of a run spread over several in this process).
    gathered: std::cell::RefCell<Option<Box<dyn std::any::Any>>>,
}

impl Attach<'_> {
    /// Where the run's `T` results are gathered.
    fn gathered<T: 'static>(&self) -> Arc<Mutex<Gathered<T>>> {
        let mut shared = self.gathered.borrow_mut();
        let known = shared
            .as_ref()
            .and_then(|any| any.downcast_ref::<Arc<Mutex<Gathered<T>>>>());
        if let Some(gathered) = known {
            return Arc::clone(gathered);
        }
        let gathered = Arc::new(Mutex::new(Gathered::default()));
        *shared = Some(Box::new(Arc::clone(&gathered)));
        gathered
    }

    /// Sends `results` to a sink gathering them for this run.
    fn attach<T: StableHash + Record>(&self, results: DataStream<T>) -> Outputs<T> {
        let gathered = self.gathered();
        let sink = ResultSink {
            gathered: Arc::clone(&gathered),
            results: Arc::clone(self.counter),
            timeline: Arc::clone(self.timeline),
            origin_delay_ms: self.query.origin_delay_ms(),
            keep: matches!(self.query, Query::Q4 | Query::Q12),
        };
        results.sink_to(sink, "results");
        Outputs { gathered }
    }

    /// As [`Attach::attach`], for a query whose checksum is over all its results.
    fn plain<T: StableHash + Record>(
        &self,
        results: DataStream<T>,
    ) -> Box<dyn FnOnce() -> RunOutput> {
        let outputs = self.attach(results);
        Box::new(move || finish(outputs.take(), |g| g.checksum))
    }
}

/// The gathered output of a run, whatever the query's output type.
struct RunOutput {
    checksum: Checksum,
    results: u64,
    samples: Vec<(i64, u64)>,
}

fn finish<T>(gathered: Gathered<T>, checksum: impl FnOnce(&Gathered<T>) -> Checksum) -> RunOutput {
    RunOutput {
        checksum: checksum(&gathered),
        results: gathered.checksum.count,
        samples: gathered.samples,
    }
}

/// Prints a progress line on stderr every second until dropped.
fn progress(
    query: Query,
    rate: f64,
    timeline: Arc<Timeline>,
    results: Arc<AtomicU64>,
) -> Option<PeriodicThread> {
    PeriodicThread::spawn("nexmark-progress", Duration::from_secs(1), move || {
        let latest = timeline.latest.load(Ordering::Relaxed);
        let generated = if latest == i64::MIN {
            0.0
        } else {
            (latest - BASE_TIME_MS) as f64 * rate / 1_000.0
        };
        let seconds = timeline.started.elapsed().as_secs_f64();
        eprintln!(
            "{}: {:.1} s, ~{:.2} M events generated ({:.2} M/s), {} results",
            query.name(),
            seconds,
            generated / 1e6,
            generated / 1e6 / seconds.max(1e-9),
            results.load(Ordering::Relaxed)
        );
    })
    .ok()
}

/// Builds `query` over `events` into its environment, its results into `sinks`: what takes
/// the run's output once it ended.
fn build_query(
    query: Query,
    events: DataStream<Event>,
    sinks: &Attach<'_>,
) -> Box<dyn FnOnce() -> RunOutput> {
    match query {
        Query::Q0 => sinks.plain(queries::q0(events)),
        Query::Q1 => sinks.plain(queries::q1(events)),
        Query::Q2 => sinks.plain(queries::q2(events)),
        Query::Q3 => sinks.plain(queries::q3(events)),
        Query::Q4 => {
            let outputs = sinks.attach(queries::q4(events));
            Box::new(move || {
                finish(outputs.take(), |g: &Gathered<CategoryAverage>| {
                    checksum_of(&q4_final(g.kept.iter().cloned()))
                })
            })
        }
        Query::Q5 => sinks.plain(queries::q5(events)),
        Query::Q7 => sinks.plain(queries::q7(events)),
        Query::Q8 => sinks.plain(queries::q8(events)),
        Query::Q11 => sinks.plain(queries::q11(events)),
        Query::Q12 => {
            let outputs = sinks.attach(queries::q12(events));
            Box::new(move || {
                finish(outputs.take(), |g: &Gathered<BidderWindowCount>| {
                    checksum_of(&q12_totals(&g.kept))
                })
            })
        }
    }
}

/// Runs the query on the engine: `options.parallelism` shards, embedded — in one executor,
/// or spread over `options.executors` in this process, one slot each.
pub fn run_engine(options: &NexmarkOptions) -> Result<NexmarkReport, BenchError> {
    check(options)?;
    let event_rate = generator(options)?.config().first_event_rate as f64;
    let executors = options.executors;
    if executors == 0 {
        return Err(BenchError::Nexmark(
            "--executors 0: a run needs one executor at least".into(),
        ));
    }
    if executors > 1 && executors != options.parallelism {
        return Err(BenchError::Nexmark(format!(
            "--executors {executors}: a run over several executors gives each one slot \
             (--parallelism {executors})"
        )));
    }
    let cores = weir_engine::runtime::available_cores();
    if executors > cores.len() {
        return Err(BenchError::Nexmark(format!(
            "--executors {executors}: this machine has {} core(s), one per executor",
            cores.len()
        )));
    }
    let mut config = Configuration::default();
    let settings = [
        (
            "taskmanager.numberOfTaskSlots",
            (options.parallelism / executors).to_string(),
        ),
        ("parallelism.default", options.parallelism.to_string()),
        ("state.backend.type", options.state_backend.clone()),
        (
            "execution.buffer-timeout",
            format!("{} ms", options.buffer_timeout_ms),
        ),
    ];
    for (key, value) in settings {
        config
            .set(key, value)
            .map_err(|e| BenchError::Nexmark(e.to_string()))?;
    }
    // Removed when the run is over.
    let checkpoint_dir = match options.checkpoint_interval_ms {
        Some(interval) => {
            let dir = tempfile::tempdir().map_err(|e| {
                BenchError::Nexmark(format!("cannot create a checkpoint directory: {e}"))
            })?;
            let path = dir.path().to_str().ok_or_else(|| {
                BenchError::Nexmark("the temporary directory's path is not UTF-8".into())
            })?;
            for (key, value) in [
                ("execution.checkpointing.interval", format!("{interval} ms")),
                ("execution.checkpointing.dir", path.to_string()),
            ] {
                config
                    .set(key, value)
                    .map_err(|e| BenchError::Nexmark(e.to_string()))?;
            }
            Some(dir)
        }
        None => None,
    };
    config
        .apply_pairs(options.settings.iter().map(String::as_str))
        .map_err(|e| BenchError::Nexmark(e.to_string()))?;
    let timeline = Arc::new(Timeline::new());
    let counter = Arc::new(AtomicU64::new(0));
    let query = options.query;
    let sinks = Attach {
        query,
        timeline: &timeline,
        counter: &counter,
        gathered: Default::default(),
    };
    let name = format!("nexmark {}", query.name());
    let spreads = match executors {
        1 => vec![None],
        _ => weir_engine::runtime::on_loopback("nexmark", executors)
            .map_err(BenchError::Remote)?
            .into_iter()
            .map(Some)
            .collect(),
    };
    let monitor = JobMonitor::default();
    let scrapes = Arc::new(AtomicU64::new(0));
    // Every executor's job built before any starts (nothing is left running on an error).
    let mut take = None;
    let mut jobs = Vec::with_capacity(executors);
    for (spread, core) in spreads.into_iter().zip(cores) {
        let mut config = config.clone();
        if spread.is_some() {
            config
                .set("taskmanager.cpu.cores", core.to_string())
                .map_err(|e| BenchError::Nexmark(e.to_string()))?;
        }
        let env = StreamEnvironment::new(config).map_err(BenchError::job("nexmark"))?;
        let timed = Timed {
            generator: generator(options)?,
            timeline: Arc::clone(&timeline),
        };
        let events = queries::source(&env, timed, options.events, options.rate);
        let built = build_query(query, events, &sinks);
        take.get_or_insert(built);
        // The first executor's figures are the ones scraped.
        let run = RunOptions {
            monitor: if jobs.is_empty() {
                monitor.clone()
            } else {
                JobMonitor::default()
            },
            spread,
            ..RunOptions::default()
        };
        jobs.push((env, run));
    }
    let take = take.expect("one executor at least");
    let progress = progress(query, event_rate, Arc::clone(&timeline), counter);
    let scraper = options
        .scrape_ms
        .map(|ms| scraper(&monitor, Duration::from_millis(ms), Arc::clone(&scrapes)))
        .transpose()?;
    let runs: Vec<_> = jobs
        .into_iter()
        .map(|(env, run)| env.execute_async(&name, run))
        .collect();
    if runs.iter().any(Result::is_err) {
        // One that did not start: the others would wait for it until their connect timeout.
        for run in runs.iter().flatten() {
            run.cancel();
        }
    }
    // Every executor waited for, whatever the first did (a failure on one ends the others).
    let results: Vec<_> = runs
        .into_iter()
        .map(|run| run.and_then(|run| run.wait()))
        .collect();
    let mut result = None;
    // The first executor runs slot 0: it coordinates the run's checkpoints.
    let mut checkpoints = None;
    for ended in results {
        let ended = ended.map_err(BenchError::job("nexmark"))?;
        if checkpoints.is_none() {
            checkpoints = ended.checkpoints.clone();
        }
        // The run lasts until its last executor ends.
        if result
            .as_ref()
            .is_none_or(|r: &weir_engine::JobResult| r.duration < ended.duration)
        {
            result = Some(ended);
        }
    }
    let result = result.expect("one executor at least");
    drop(scraper);
    drop(progress);
    drop(checkpoint_dir);
    let output = take();
    let seconds = result.duration.as_secs_f64().max(1e-9);
    let rate = options.events as f64 / seconds;
    Ok(NexmarkReport {
        query: query.name(),
        engine: "weir",
        events: options.events,
        seconds,
        events_per_second: rate,
        events_per_second_per_core: rate / options.parallelism as f64,
        cores: options.parallelism,
        executors,
        latency_ms: latency(&timeline, &output.samples),
        results: output.results,
        checksum: format!("{:016x}", output.checksum.sum),
        rate: options.rate,
        state_backend: Some(options.state_backend.clone()),
        settings: options.settings.clone(),
        checkpoints: options
            .checkpoint_interval_ms
            .zip(checkpoints.as_ref())
            .map(|(interval, stats)| CheckpointFigures::of(interval, stats)),
        scrapes: options.scrape_ms.map(|_| scrapes.load(Ordering::Relaxed)),
    })
}

/// Reads `monitor` every `period` and encodes the figures as an executor does to hand them
/// to its worker (what a `/metrics` scrape costs the job's process), counting the readings.
fn scraper(
    monitor: &JobMonitor,
    period: Duration,
    scrapes: Arc<AtomicU64>,
) -> Result<PeriodicThread, BenchError> {
    let monitor = monitor.clone();
    PeriodicThread::spawn("nexmark-scrape", period, move || {
        if let Some(figures) = monitor.figures() {
            let encoded = serde_json::to_vec(&figures).expect("figures encode");
            std::hint::black_box(encoded);
            scrapes.fetch_add(1, Ordering::Relaxed);
        }
    })
    .map_err(|e| BenchError::Nexmark(format!("cannot start the scraping thread: {e}")))
}

/// Latency percentiles of `samples` (see the module docs).
fn latency(timeline: &Timeline, samples: &[(i64, u64)]) -> Option<LatencyMs> {
    let marks = timeline.sorted();
    let last = marks.last()?.1;
    // 1 µs to an hour, 3 significant figures; longer latencies count as an hour.
    let mut histogram =
        Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds");
    for &(origin, written) in samples {
        let index = marks.partition_point(|&(time, _)| time < origin);
        // Results of windows closed by the end of input originate when generation ended.
        let generated = marks.get(index).map_or(last, |&(_, at)| at);
        let micros = written.saturating_sub(generated) / 1_000;
        histogram.saturating_record(micros.max(1));
    }
    if histogram.is_empty() {
        return None;
    }
    let ms = |micros: u64| micros as f64 / 1_000.0;
    Some(LatencyMs {
        p50: ms(histogram.value_at_quantile(0.5)),
        p99: ms(histogram.value_at_quantile(0.99)),
        p999: ms(histogram.value_at_quantile(0.999)),
        max: ms(histogram.max()),
        samples: histogram.len(),
    })
}

/// The engine's report and the baseline's on the same events, as a table row.
#[derive(Clone, Debug, Serialize)]
pub struct SuiteRow {
    /// The engine run.
    pub engine: NexmarkReport,
    /// The baseline run.
    pub baseline: NexmarkReport,
    /// Baseline events/s per core over the engine's (how far from one core's best).
    pub slowdown: f64,
    /// Whether the checksums agree (q12: the bids per bidder).
    pub checksums_match: bool,
}

/// Runs the engine and the baseline of every query on the same events (`--all`).
pub fn run_suite(options: &NexmarkOptions) -> Result<Vec<SuiteRow>, BenchError> {
    Query::ALL
        .into_iter()
        .map(|query| {
            let options = NexmarkOptions {
                query,
                ..options.clone()
            };
            let baseline = run_baseline(&options)?;
            let engine = run_engine(&options)?;
            Ok(SuiteRow {
                slowdown: baseline.events_per_second_per_core
                    / engine.events_per_second_per_core.max(1e-9),
                checksums_match: engine.checksum == baseline.checksum,
                engine,
                baseline,
            })
        })
        .collect()
}

/// The suite as a Markdown table.
pub fn suite_table(rows: &[SuiteRow]) -> String {
    let mut table = String::from(
        "| query | events | weir events/s/core | baseline events/s | baseline/weir | p50 ms | p99 ms | results | checksum |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let (p50, p99) = row.engine.latency_ms.map_or(("-".into(), "-".into()), |l| {
            (format!("{:.1}", l.p50), format!("{:.1}", l.p99))
        });
        table.push_str(&format!(
            "| {} | {} | {:.2} M | {:.2} M | {:.2}x | {} | {} | {} | {} |\n",
            row.engine.query,
            row.engine.events,
            row.engine.events_per_second_per_core / 1e6,
            row.baseline.events_per_second / 1e6,
            row.slowdown,
            p50,
            p99,
            row.engine.results,
            if row.checksums_match {
                "match"
            } else {
                "DIFFERS"
            },
        ));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(query: Query, events: u64) -> NexmarkOptions {
        NexmarkOptions {
            query,
            events,
            parallelism: 1,
            rate: None,
            state_backend: "hashmap".into(),
            buffer_timeout_ms: 1,
            seed: 0,
            checkpoint_interval_ms: None,
            settings: Vec::new(),
            scrape_ms: None,
            executors: 1,
        }
    }

    /// Spread over two executors (QUIC between them), a query gives what it gives on one.
    #[test]
    fn a_query_over_two_executors_gives_what_it_gives_on_one() {
        let one = NexmarkOptions {
            parallelism: 2,
            ..options(Query::Q5, 200_000)
        };
        let two = NexmarkOptions {
            executors: 2,
            ..one.clone()
        };
        let reference = run_engine(&one).unwrap();
        let spread = run_engine(&two).unwrap();
        assert!(reference.results > 0);
        assert_eq!(
            (spread.checksum, spread.results),
            (reference.checksum.clone(), reference.results)
        );
        assert_eq!(spread.executors, 2);
        // Checkpointed across both executors: the same results, and the figures of slot 0's
        // executor, which coordinates the checkpoints (the final one at least completes).
        let checkpointed = run_engine(&NexmarkOptions {
            checkpoint_interval_ms: Some(50),
            ..two.clone()
        })
        .unwrap();
        assert_eq!(checkpointed.checksum, reference.checksum);
        let figures = checkpointed.checkpoints.expect("checkpoint figures");
        assert!(figures.checkpoints_completed >= 1, "{figures:?}");
        let refused = run_engine(&NexmarkOptions {
            parallelism: 1,
            ..two
        });
        assert!(
            matches!(&refused, Err(BenchError::Nexmark(m)) if m.contains("one slot")),
            "{refused:?}"
        );
    }

    /// A scraped run reads its figures as often as asked, and gives the same results.
    #[test]
    fn a_scraped_run_counts_its_readings() {
        // The rate sets the events' times: both runs have it.
        let plain = NexmarkOptions {
            rate: Some(100_000.0),
            ..options(Query::Q1, 50_000)
        };
        let scraped = NexmarkOptions {
            scrape_ms: Some(20),
            ..plain.clone()
        };
        let reference = run_engine(&plain).unwrap();
        assert_eq!(reference.scrapes, None);
        let report = run_engine(&scraped).unwrap();
        assert_eq!(report.checksum, reference.checksum);
        // Half a second at 20 ms.
        let scrapes = report.scrapes.expect("scrapes are reported");
        assert!((5..=40).contains(&scrapes), "{scrapes} readings");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["scrapes"], scrapes);
    }

    /// A checkpointed run gives the same results, and reports its checkpoints in its JSON.
    #[test]
    fn a_checkpointed_run_reports_its_checkpoints() {
        let plain = options(Query::Q5, 100_000);
        let checkpointed = NexmarkOptions {
            rate: Some(100_000.0),
            checkpoint_interval_ms: Some(50),
            ..plain.clone()
        };
        let reference = run_engine(&plain).unwrap();
        let report = run_engine(&checkpointed).unwrap();
        assert_eq!(report.checksum, reference.checksum);
        let figures = report.checkpoints.as_ref().expect("checkpoint figures");
        assert!(figures.checkpoints_completed > 0, "{figures:?}");
        assert!(figures.checkpoint_bytes.last_full > 0, "{figures:?}");
        let pauses = figures.sync_pause_ms.expect("pauses");
        assert!(
            pauses.p50 <= pauses.p99 && pauses.p99 <= pauses.max,
            "{pauses:?}"
        );
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        for field in [
            "checkpoints_completed",
            "checkpoint_duration_ms",
            "checkpoint_bytes",
            "sync_pause_ms",
        ] {
            assert!(json.get(field).is_some(), "{field} in {json}");
        }
        let json = serde_json::to_value(&reference).unwrap();
        assert!(json.get("checkpoints_completed").is_none(), "{json}");
    }

    #[test]
    fn queries_parse_by_name_and_unknown_ones_are_named() {
        assert_eq!("Q11".parse::<Query>(), Ok(Query::Q11));
        let error = "q6".parse::<Query>().expect_err("no q6");
        assert!(
            error.contains("'q6'") && error.contains("q0, q1"),
            "{error}"
        );
    }

    #[test]
    fn engine_and_baseline_agree_and_the_engine_reports_latency() {
        for query in [Query::Q0, Query::Q5] {
            let options = options(query, 200_000);
            let engine = run_engine(&options).expect("engine run");
            let baseline = run_baseline(&options).expect("baseline run");
            assert_eq!(engine.checksum, baseline.checksum, "{query:?}");
            assert_eq!(engine.results, baseline.results, "{query:?}");
            assert!(engine.results > 0, "{query:?}");
            let latency = engine.latency_ms.expect("sampled results");
            assert!(latency.samples > 0, "{latency:?}");
            assert!(
                latency.p50 <= latency.p99 && latency.p99 <= latency.max,
                "{latency:?}"
            );
            // A result waits at least for its batch to be generated and processed.
            assert!(latency.max >= 0.01, "{latency:?}");
        }
    }

    #[test]
    fn processing_time_results_have_no_latency_figure() {
        let report = run_engine(&options(Query::Q12, 50_000)).expect("engine run");
        assert!(report.results > 0);
        assert!(report.latency_ms.is_none(), "{report:?}");
    }

    #[test]
    fn bad_options_are_refused_naming_the_fix() {
        let mut bad = options(Query::Q0, 0);
        assert!(matches!(run_engine(&bad), Err(BenchError::NoRecords)));
        bad.events = 10;
        bad.rate = Some(0.0);
        let error = run_engine(&bad).expect_err("rate 0").to_string();
        assert!(error.contains("--rate must be at least 1"), "{error}");
        bad.rate = None;
        bad.parallelism = 1_000;
        assert!(matches!(
            run_baseline(&bad),
            Err(BenchError::TooManyShards { .. })
        ));
        bad.parallelism = 1;
        bad.settings = vec!["state.backend.rocksdb.memory.write-back-ratio=2".into()];
        let error = run_engine(&bad).expect_err("ratio 2").to_string();
        assert!(
            error.contains("state.backend.rocksdb.memory.write-back-ratio") && error.contains('2'),
            "{error}"
        );
    }

    /// `-D` settings reach the engine: q5 on RocksDB gives the same checksum with and without
    /// the write-back cache, and the report names the settings.
    #[test]
    fn further_settings_reach_the_engine() {
        let mut options = options(Query::Q5, 20_000);
        options.state_backend = "rocksdb".into();
        let cached = run_engine(&options).unwrap();
        options.settings = vec!["state.backend.rocksdb.memory.write-back-ratio=0".into()];
        let uncached = run_engine(&options).unwrap();
        assert_eq!(cached.checksum, uncached.checksum);
        assert_eq!(uncached.settings, options.settings);
        assert!(cached.settings.is_empty());
    }
}
