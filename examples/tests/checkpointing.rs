//! Checkpoints in process: a job stopped at a random moment resumes from its latest completed
//! checkpoint with every record counted once — in keyed state, and in tumbling, sliding,
//! session and count windows; a job whose subtasks panic at random points restarts from its
//! latest checkpoint (its restart strategy) with the same result, and writes every record once
//! through the file sink and into PostgreSQL (a throw-away cluster); a damaged checkpoint is
//! passed over for the one before it; jobs whose state checkpoints cannot write yet are
//! refused, naming it.

mod common;

// The control crate's throw-away PostgreSQL cluster; these tests restart none.
#[allow(dead_code)]
#[path = "../../control/tests/common/postgres.rs"]
mod postgres_cluster;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_engine::api::RunOptions;
use weir_engine::checkpoint::CheckpointBarrier;
use weir_engine::connector::{ConnectorError, LocalBoxFuture, PostgresSink, SinkWriter};
use weir_engine::prelude::*;
use weir_engine::state::StateValue;
use weir_engine::JobError;
use weir_examples::keyed_aggregation;
use weir_examples::sequence_check::{
    self, echo_problems, problems, reports, reports_with, Echoed, KeyReport, Numbered, SequenceSpec,
};
use weir_examples::window_check::{self, WindowCheckSpec, WindowReport};

use common::{config_on, Notice, NoticeLog, HEAP, ROCKSDB};

/// Many small splits, so that splits change hands while checkpoints are taken.
const SPEC: SequenceSpec = SequenceSpec {
    splits: 24,
    keys_per_split: 2,
    per_key: 4_000,
    rate: Some(60_000.0),
};

fn config(checkpoints: &Path, slots: usize, retained: usize) -> Configuration {
    config_on(HEAP, checkpoints, slots, retained)
}

/// The completed checkpoints in job `job`'s directory, by number.
fn completed_of(checkpoints: &Path, job: &str) -> Vec<u64> {
    let mut numbers: Vec<u64> = std::fs::read_dir(checkpoints.join(job))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().join("_metadata").exists())
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("chk-")?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    numbers.sort_unstable();
    numbers
}

/// The sequence check's completed checkpoints.
fn completed(checkpoints: &Path) -> Vec<u64> {
    completed_of(checkpoints, "sequence-check")
}

/// Runs the check until `stop_after` checkpoints completed in this run, then cancels it.
fn run_until_checkpoints(
    config: &Configuration,
    checkpoints: &Path,
    resume: bool,
    stop_after: usize,
) {
    stop_after_checkpoints(
        config,
        checkpoints,
        "sequence-check",
        resume,
        stop_after,
        |env| {
            reports(env, SPEC).sink_to(DiscardSink::new(), "discard");
        },
    );
}

/// Runs job `name` (built by `build`) until `stop_after` checkpoints completed in this run,
/// then cancels it (it may have finished first: its last checkpoints are there all the same).
fn stop_after_checkpoints(
    config: &Configuration,
    checkpoints: &Path,
    name: &str,
    resume: bool,
    stop_after: usize,
    build: impl Fn(&StreamEnvironment),
) {
    let before = completed_of(checkpoints, name).last().copied().unwrap_or(0);
    let env = StreamEnvironment::new(config.clone()).expect("an environment");
    build(&env);
    let options = RunOptions {
        resume,
        ..RunOptions::default()
    };
    let job = env.execute_async(name, options).expect("started");
    let started = Instant::now();
    // Retention deletes older checkpoints: count the ones seen while polling.
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < stop_after {
        seen.extend(
            completed_of(checkpoints, name)
                .into_iter()
                .filter(|&n| n > before),
        );
        if job.is_finished() {
            let ended = job.wait().map(|_| "finished".to_string());
            panic!("the job ended before {stop_after} checkpoints: {ended:?}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no checkpoint completes"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    job.cancel();
    match job.wait() {
        Err(JobError::Cancelled { .. }) | Ok(_) => {}
        Err(other) => panic!("expected the cancelled job, got {other}"),
    }
}

/// Resumes the check over `spec` and runs it to its end: its reports, and how many records
/// its source read.
fn resume_reports(config: &Configuration, spec: SequenceSpec) -> (Vec<KeyReport>, u64) {
    resume_reports_with(config, spec, |records| records)
}

/// [`resume_reports`] of the check built with `between` (`reports_with`).
fn resume_reports_with(
    config: &Configuration,
    spec: SequenceSpec,
    between: impl FnOnce(DataStream<Numbered>) -> DataStream<Numbered>,
) -> (Vec<KeyReport>, u64) {
    let env = StreamEnvironment::new(config.clone()).expect("an environment");
    let (sink, collected) = CollectSink::new();
    reports_with(&env, spec, between).sink_to(sink, "collect");
    let options = RunOptions {
        resume: true,
        ..RunOptions::default()
    };
    let result = env
        .execute_with("sequence-check", options)
        .expect("the resumed job");
    (collected.records(), result.records_out("Source: sequence"))
}

/// Resumes the check, which must be refused: why.
fn resume_refused(config: &Configuration) -> String {
    let env = StreamEnvironment::new(config.clone()).expect("an environment");
    reports(&env, SPEC).sink_to(DiscardSink::new(), "discard");
    refused_resume(&env, "sequence-check")
}

/// Resumes job `name` built in `env`, which must be refused: why.
fn refused_resume(env: &StreamEnvironment, name: &str) -> String {
    let options = RunOptions {
        resume: true,
        ..RunOptions::default()
    };
    env.execute_with(name, options)
        .expect_err("the resume is refused")
        .to_string()
}

/// [`resume_reports`], checked: the problems with the reports, and the records read.
fn resume_to_end(config: &Configuration) -> (Vec<String>, u64) {
    let (reports, read) = resume_reports(config, SPEC);
    (problems(SPEC, &reports), read)
}

fn stopped_and_resumed(backend: &str, slots: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = config_on(backend, dir.path(), slots, 1);
    run_until_checkpoints(&config, dir.path(), false, 2);
    run_until_checkpoints(&config, dir.path(), true, 3);
    resume_to_end_counting_once(&config);
}

/// [`resume_to_end`]: every record counted once, and the run resumed from a checkpoint.
fn resume_to_end_counting_once(config: &Configuration) {
    let (problems, read) = resume_to_end(config);
    assert!(problems.is_empty(), "{problems:?}");
    assert!(
        read < SPEC.records(),
        "the last run read {read} of {} records: it did not resume",
        SPEC.records()
    );
}

#[test]
fn a_stopped_job_resumes_with_every_record_counted_once_at_parallelism_1() {
    stopped_and_resumed(HEAP, 1);
}

#[test]
fn a_stopped_job_resumes_with_every_record_counted_once_at_parallelism_2() {
    stopped_and_resumed(HEAP, 2);
}

#[test]
fn a_stopped_job_on_rocksdb_resumes_with_every_record_counted_once_at_parallelism_1() {
    stopped_and_resumed(ROCKSDB, 1);
}

#[test]
fn a_stopped_job_on_rocksdb_resumes_with_every_record_counted_once_at_parallelism_2() {
    stopped_and_resumed(ROCKSDB, 2);
}

#[test]
fn at_least_once_loses_nothing() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = config(dir.path(), 2, 1)
        .with("execution.checkpointing.mode", "AT_LEAST_ONCE")
        .unwrap();
    run_until_checkpoints(&config, dir.path(), false, 2);
    let (reports, read) = resume_reports(&config, SPEC);
    assert!(read < SPEC.records(), "it resumed");
    assert_eq!(reports.len(), SPEC.keys() as usize);
    for report in &reports {
        // Records after a barrier may be counted again; none may be lost.
        assert_eq!(report.gaps, 0, "{report}");
        assert_eq!(report.next, SPEC.per_key, "{report}");
        assert_eq!(report.count, SPEC.per_key + report.repeats, "{report}");
    }
}

/// Slow enough that checkpoints complete while the windows fill.
const WINDOWS: WindowCheckSpec = WindowCheckSpec {
    keys_per_split: 4,
    per_key: 3_000,
    rate: Some(5_000.0),
};

/// [`WINDOWS`] at half the rate on RocksDB, whose checkpoints flush and upload files: three
/// of them still fit into a stopped run on a loaded machine.
fn windows_spec(backend: &str) -> WindowCheckSpec {
    match backend {
        ROCKSDB => WindowCheckSpec {
            rate: WINDOWS.rate.map(|rate| rate / 2.0),
            ..WINDOWS
        },
        _ => WINDOWS,
    }
}

/// Many keys, of which a checkpoint every few ms sees a few change: tumbling and sliding
/// windows write deltas of the keys changed (`checkpoint::chain`), and a full snapshot after
/// the sliding windows of every key fired (once a run, at sequence number 10).
const DELTAS: WindowCheckSpec = WindowCheckSpec {
    keys_per_split: 1_000,
    per_key: 20,
    // 10 s a run: two stopped runs of three checkpoints each fit even where a loaded machine
    // takes a second per RocksDB checkpoint.
    rate: Some(2_000.0),
};

/// [`config_on`] checkpointing every 5 ms: a few of [`DELTAS`]' keys change between two
/// checkpoints.
fn deltas_config(
    backend: &str,
    checkpoints: &Path,
    slots: usize,
    retained: usize,
) -> Configuration {
    config_on(backend, checkpoints, slots, retained)
        .with("execution.checkpointing.interval", "5ms")
        .expect("valid settings")
}

/// A sink writing one log per subtask, each record at the next position; a writer restored
/// from a checkpoint goes on at the position that checkpoint recorded, over what the run
/// before wrote after it (a log cut back to its committed offset on restore, as exactly-once
/// file sinks do). The logs hold what an exactly-once sink would have committed.
struct OffsetLog<T> {
    logs: Arc<Mutex<Vec<Vec<T>>>>,
}

impl<T> Clone for OffsetLog<T> {
    fn clone(&self) -> Self {
        OffsetLog {
            logs: Arc::clone(&self.logs),
        }
    }
}

impl<T> Default for OffsetLog<T> {
    fn default() -> Self {
        OffsetLog {
            logs: Arc::default(),
        }
    }
}

impl<T: Clone> OffsetLog<T> {
    fn records(&self) -> Vec<T> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .cloned()
            .collect()
    }
}

struct OffsetLogWriter<T> {
    logs: Arc<Mutex<Vec<Vec<T>>>>,
    subtask: usize,
    next: u64,
    offset: weir_engine::state::OperatorListState<u64>,
}

impl<T: StateValue + Send> Sink<T> for OffsetLog<T> {
    fn create_writer(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Box<dyn SinkWriter<T>>, ConnectorError> {
        let offset = ctx
            .operator_state()
            .list_state(&ListStateDescriptor::new("offset"))
            .map_err(|e| ConnectorError::external(e.to_string()))?;
        let next = offset.get().first().copied().unwrap_or(0);
        let mut logs = self.logs.lock().unwrap();
        if logs.len() < ctx.parallelism {
            logs.resize_with(ctx.parallelism, Vec::new);
        }
        logs[ctx.subtask].truncate(next as usize);
        Ok(Box::new(OffsetLogWriter {
            logs: Arc::clone(&self.logs),
            subtask: ctx.subtask,
            next,
            offset,
        }))
    }
}

impl<T> SinkWriter<T> for OffsetLogWriter<T> {
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<T>,
        _timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
        self.next += batch.len() as u64;
        self.logs.lock().unwrap()[self.subtask].append(batch);
        Box::pin(async { Ok(()) })
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(async { Ok(()) })
    }

    fn flush(
        &mut self,
        _barrier: &CheckpointBarrier,
    ) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        self.offset.update([self.next]);
        Box::pin(async { Ok(()) })
    }
}

/// The window check stopped twice and resumed to its end: what its sink committed holds
/// every window and pair once, with exactly its records.
fn windows_stopped_and_resumed(backend: &str, slots: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = config_on(backend, dir.path(), slots, 1);
    windows_stopped_and_resumed_with(config, dir.path(), windows_spec(backend), slots);
}

/// [`windows_stopped_and_resumed`] of `spec` with `config`, checkpointing into `checkpoints`.
fn windows_stopped_and_resumed_with(
    config: Configuration,
    checkpoints: &Path,
    spec: WindowCheckSpec,
    slots: usize,
) {
    let log = OffsetLog::<WindowReport>::default();
    let build = |env: &StreamEnvironment| {
        window_check::reports(env, spec, slots).sink_to(log.clone(), "log");
    };
    stop_after_checkpoints(&config, checkpoints, "window-check", false, 3, build);
    stop_after_checkpoints(&config, checkpoints, "window-check", true, 3, build);
    windows_resumed_to_end(config, spec, slots, &log, build);
}

/// Resumes the window check (built by `build`, its `readers` source subtasks writing into
/// `log`) and runs it to its end: it resumed from a checkpoint, and `log` holds every window
/// and pair once, with exactly its records.
fn windows_resumed_to_end(
    config: Configuration,
    spec: WindowCheckSpec,
    readers: usize,
    log: &OffsetLog<WindowReport>,
    build: impl Fn(&StreamEnvironment),
) {
    let result = window_check_resumed(config, build);
    let total = u64::from(spec.keys_per_split) * readers as u64 * spec.per_key;
    assert!(
        result.records_out("Source: numbers") < total,
        "the last run resumed from a checkpoint"
    );
    let problems = window_check::problems(spec, readers, &[log.records()]);
    assert!(problems.is_empty(), "{problems:?}");
}

/// The window check built by `build`, resumed with `config` and run to its end.
fn window_check_resumed(
    config: Configuration,
    build: impl Fn(&StreamEnvironment),
) -> weir_engine::JobResult {
    let env = StreamEnvironment::new(config).expect("an environment");
    build(&env);
    let options = RunOptions {
        resume: true,
        ..RunOptions::default()
    };
    env.execute_with("window-check", options)
        .expect("the resumed job")
}

#[test]
fn windows_and_joins_resume_with_every_record_counted_once_at_parallelism_1() {
    windows_stopped_and_resumed(HEAP, 1);
}

#[test]
fn windows_and_joins_resume_with_every_record_counted_once_at_parallelism_2() {
    windows_stopped_and_resumed(HEAP, 2);
}

#[test]
fn windows_and_joins_on_rocksdb_resume_with_every_record_counted_once_at_parallelism_1() {
    windows_stopped_and_resumed(ROCKSDB, 1);
}

#[test]
fn windows_and_joins_on_rocksdb_resume_with_every_record_counted_once_at_parallelism_2() {
    windows_stopped_and_resumed(ROCKSDB, 2);
}

/// Resumed from checkpoints whose window parts are chains of deltas.
#[test]
fn windows_checkpointed_as_deltas_resume_with_every_record_counted_once() {
    for backend in [HEAP, ROCKSDB] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = deltas_config(backend, dir.path(), 2, 1);
        windows_stopped_and_resumed_with(config, dir.path(), DELTAS, 2);
    }
}

/// A keyed `reduce` (the keyed-aggregation example) resumes with its running values.
#[test]
fn a_keyed_reduce_resumes_with_its_values() {
    let (events, sensors, every) = (3_000_000, 7, 1_000);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = config(dir.path(), 2, 1);
    let build = |env: &StreamEnvironment,
                 sink: Option<CollectSink<keyed_aggregation::SensorStats>>| {
        let stats = keyed_aggregation::reports(env, events, sensors, every);
        match sink {
            Some(sink) => stats.sink_to(sink, "collect"),
            None => stats.sink_to(DiscardSink::new(), "discard"),
        };
    };
    stop_after_checkpoints(&config, dir.path(), "aggregation", false, 1, |env| {
        build(env, None)
    });

    let env = StreamEnvironment::new(config).unwrap();
    let (sink, collected) = CollectSink::new();
    build(&env, Some(sink));
    let options = RunOptions {
        resume: true,
        ..RunOptions::default()
    };
    env.execute_with("aggregation", options).unwrap();
    let mut expected = std::collections::HashMap::new();
    for i in 0..events {
        *expected
            .entry(keyed_aggregation::reading(i, sensors).sensor)
            .or_insert(0u64) += 1;
    }
    for (sensor, count) in expected {
        let last = collected
            .records()
            .iter()
            .filter(|r| r.sensor == sensor)
            .map(|r| r.count)
            .max();
        assert_eq!(last, Some(count / every * every), "sensor {sensor}");
    }
}

#[test]
fn a_damaged_checkpoint_is_passed_over_for_the_one_before() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = config(dir.path(), 2, 2);
    run_until_checkpoints(&config, dir.path(), false, 3);
    let numbers = completed(dir.path());
    let newest = dir
        .path()
        .join("sequence-check")
        .join(format!("chk-{}", numbers.last().unwrap()));
    let file = std::fs::read_dir(&newest)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("task-")
        })
        .expect("a task state file");
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&file, bytes).unwrap();
    let (problems, read) = resume_to_end(&config);
    assert!(problems.is_empty(), "{problems:?}");
    assert!(
        read < SPEC.records(),
        "it resumed from the older checkpoint"
    );

    // With every retained checkpoint damaged, the start is refused naming why.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = self::config(dir.path(), 1, 1);
    run_until_checkpoints(&config, dir.path(), false, 1);
    for number in completed(dir.path()) {
        let chk = dir
            .path()
            .join("sequence-check")
            .join(format!("chk-{number}"));
        std::fs::remove_file(chk.join("_metadata")).unwrap();
    }
    let error = resume_refused(&config);
    assert!(
        error.contains("no checkpoint") && error.contains("never completed"),
        "{error}"
    );

    // A directory whose only attempt a kill cut short before any checkpoint completed has
    // nothing to lose: the resume starts from scratch.
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::create_dir_all(dir.path().join("sequence-check/chk-1")).unwrap();
    let (problems, read) = resume_to_end(&self::config(dir.path(), 1, 1));
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(read, SPEC.records(), "it started from scratch");
}

/// A function keeping what it saw in a field of its own, which checkpoints cannot restore.
#[derive(Clone, Default)]
struct RecentCache {
    recent: Vec<u64>,
}

impl KeyedProcessFunction<u64, u64, u64> for RecentCache {
    fn process_element(&mut self, value: u64, ctx: &mut KeyedProcessContext<'_, u64, u64>) {
        self.recent.push(value);
        ctx.emit(value);
    }

    fn unmanaged_state(&self) -> Option<&'static str> {
        Some("a cache of recent numbers")
    }
}

#[test]
fn state_checkpoints_cannot_write_yet_is_refused_at_the_start() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = config(dir.path(), 1, 1);
    let env = StreamEnvironment::new(config.clone()).unwrap();
    env.from_source(
        DataGeneratorSource::sequence(0, 1_000),
        WatermarkStrategy::no_watermarks(),
        "numbers",
    )
    .key_by(|n: &u64| n % 10)
    .process(RecentCache::default())
    .name("cached")
    .sink_to(DiscardSink::new(), "discard");
    let error = env.execute("cache").expect_err("refused").to_string();
    assert!(
        error.contains("'cached'") && error.contains("a cache of recent numbers"),
        "{error}"
    );

    let no_dir = Configuration::default()
        .with("execution.checkpointing.interval", "1s")
        .unwrap();
    let error = StreamEnvironment::new(no_dir)
        .and_then(|env| {
            reports(&env, SPEC).sink_to(DiscardSink::new(), "discard");
            env.execute("sequence-check")
        })
        .expect_err("refused")
        .to_string();
    assert!(error.contains("execution.checkpointing.dir"), "{error}");
}

/// Panics when the records through it, counted over every subtask and every restart, reach
/// one of its points: each point fails the job once, in whichever subtask gets there.
#[derive(Clone)]
struct Faults {
    through: Arc<AtomicU64>,
    points: Arc<Vec<u64>>,
    fired: Arc<AtomicU64>,
}

impl Faults {
    /// `count` points from `within`, at least a tenth of its length apart (so that one
    /// failure has stopped the job before the next point is reached), drawn from `seed`.
    fn random(seed: u64, count: usize, within: std::ops::Range<u64>) -> Faults {
        let mut state = seed;
        let mut next = || {
            // SplitMix64.
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let gap = (within.end - within.start) / 10;
        let mut points: Vec<u64> = Vec::new();
        while points.len() < count {
            let point = within.start + next() % (within.end - within.start);
            if points.iter().all(|&p| p.abs_diff(point) >= gap) {
                points.push(point);
            }
        }
        points.sort_unstable();
        Faults {
            through: Arc::default(),
            points: Arc::new(points),
            fired: Arc::default(),
        }
    }

    /// `stream` with this injector after it.
    fn inject<T: Record>(&self, stream: DataStream<T>) -> DataStream<T> {
        let faults = self.clone();
        stream
            .map(move |record: T| {
                let through = faults.through.fetch_add(1, Ordering::Relaxed) + 1;
                if faults.points.binary_search(&through).is_ok() {
                    faults.fired.fetch_add(1, Ordering::Relaxed);
                    panic!("injected failure at record {through}");
                }
                record
            })
            .name("faults")
    }

    fn fired(&self) -> u64 {
        self.fired.load(Ordering::Relaxed)
    }
}

/// Restarts at once, as often as the faults need.
fn restarting(config: Configuration) -> Configuration {
    config
        .with("restart-strategy.type", "fixed-delay")
        .and_then(|c| c.with("restart-strategy.fixed-delay.attempts", "100"))
        .and_then(|c| c.with("restart-strategy.fixed-delay.delay", "0"))
        .expect("valid settings")
}

/// A seed for the fault points, printed so that a failing run can be repeated.
fn seed() -> u64 {
    let seed = std::env::var("WEIR_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_nanos() as u64
        });
    eprintln!("fault points from WEIR_FAULT_SEED={seed}");
    seed
}

/// The restarts of `result` were the injected failures: one each, except that failures in
/// two subtasks of one run (the injectors before and after the windows count separately, so
/// their points may come due together) end that run once.
fn check_restarts(result: &weir_engine::JobResult, faults: &[&Faults], seed: u64) {
    check_restarts_of(result, faults, faults.len() == 1, seed);
}

/// [`check_restarts`]; `apart`: each failure ended its run before the next point was reached.
fn check_restarts_of(result: &weir_engine::JobResult, faults: &[&Faults], apart: bool, seed: u64) {
    let fired: u64 = faults.iter().map(|f| f.fired()).sum();
    let restarts = result.restarts.len() as u64;
    assert!(
        if apart {
            restarts == fired
        } else {
            (1..=fired).contains(&restarts)
        },
        "{restarts} restarts for {fired} injected failures (seed {seed}): {:?}",
        result.restarts
    );
    for restart in &result.restarts {
        assert!(
            restart.cause.contains("injected failure at record"),
            "restarted for something else (seed {seed}): {}",
            restart.cause
        );
    }
}

fn sequence_survives_panics(backend: &str, slots: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = config_on(backend, dir.path(), slots, 1);
    let (result, seed) =
        sequence_with_panics(config, SPEC, true, |records, faults| faults.inject(records));
    assert!(
        result.records_out("Source: sequence") < SPEC.records(),
        "the last run restored a checkpoint (seed {seed})"
    );
}

/// The sequence check over `spec` with `config`, `between` (given the fault injector) between
/// its source and its keyed step, the injector panicking at three random points: every record
/// counted once, one restart per panic (`apart`; else at most one). The job's result, and the
/// seed of the points.
fn sequence_with_panics(
    config: Configuration,
    spec: SequenceSpec,
    apart: bool,
    between: impl FnOnce(DataStream<Numbered>, &Faults) -> DataStream<Numbered>,
) -> (weir_engine::JobResult, u64) {
    let seed = seed();
    let env = StreamEnvironment::new(restarting(config)).unwrap();
    let records = spec.records();
    let faults = Faults::random(seed, 3, records / 10..records * 9 / 10);
    let log = OffsetLog::<KeyReport>::default();
    sequence_check::reports_with(&env, spec, |records| between(records, &faults))
        .sink_to(log.clone(), "log");
    let result = env
        .execute("sequence-check")
        .unwrap_or_else(|e| panic!("the job failed (seed {seed}): {e}"));
    assert_eq!(faults.fired(), 3, "every point was reached (seed {seed})");
    check_restarts_of(&result, &[&faults], apart, seed);
    let problems = problems(spec, &log.records());
    assert!(problems.is_empty(), "seed {seed}: {problems:?}");
    (result, seed)
}

/// The echo job writing through the file sink, with panics injected after its keyed count (in
/// the sink's task) at three random points: its committed parts hold every record once, each
/// key's in order.
fn echo_survives_panics(backend: &str, settings: &[(&str, &str)], slots: usize) {
    let seed = seed();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut config = restarting(config_on(backend, dir.path(), slots, 1));
    for (key, value) in settings {
        config.set(key, *value).expect("a valid setting");
    }
    let out = dir.path().join("out");
    let env = StreamEnvironment::new(config).unwrap();
    let records = SPEC.records();
    let faults = Faults::random(seed, 3, records / 10..records * 9 / 10);
    sequence_check::echoed_with(&env, SPEC, |echoed| faults.inject(echoed))
        .sink_to(FileSink::lines(&out), "files");
    let result = env
        .execute("sequence-echo")
        .unwrap_or_else(|e| panic!("the job failed (seed {seed}): {e}"));
    assert_eq!(faults.fired(), 3, "every point was reached (seed {seed})");
    check_restarts_of(&result, &[&faults], false, seed);
    let mut parts: Vec<((usize, u64), std::path::PathBuf)> = std::fs::read_dir(&out)
        .expect("the output")
        .map(|entry| {
            let path = entry.expect("an entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let (subtask, n) = name
                .strip_prefix("part-")
                .and_then(|rest| rest.split_once('-'))
                .unwrap_or_else(|| panic!("'{name}' is left in the output (seed {seed})"));
            ((subtask.parse().unwrap(), n.parse().unwrap()), path)
        })
        .collect();
    parts.sort();
    let echoed: Vec<Echoed> = parts
        .iter()
        .flat_map(|(_, path)| {
            std::fs::read_to_string(path)
                .expect("a part")
                .lines()
                .map(|line| Echoed::parse(line).expect("a record"))
                .collect::<Vec<_>>()
        })
        .collect();
    let check = echo_problems(SPEC, &echoed);
    assert!(
        check.is_clean(),
        "{backend}, {settings:?}, {slots} (seed {seed}): {check:?}"
    );
}

/// The echo job writing into PostgreSQL (a throw-away cluster), appending every record and
/// upserting each key's latest, with panics injected after its keyed count (in the sinks'
/// task) at three random points: the table holds every record once, each key's in order; the
/// upserted table holds each key's last record; nothing is left prepared or staged.
fn echo_into_postgres_survives_panics(backend: &str, settings: &[(&str, &str)], slots: usize) {
    let Some(cluster) = postgres_cluster::Cluster::start() else {
        return;
    };
    cluster.create_echo_table();
    cluster.execute("CREATE TABLE latest (key integer PRIMARY KEY, seq bigint, count bigint)");
    let seed = seed();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut config = restarting(config_on(backend, dir.path(), slots, 1));
    for (key, value) in settings {
        config.set(key, *value).expect("a valid setting");
    }
    let env = StreamEnvironment::new(config).unwrap();
    let records = SPEC.records();
    let faults = Faults::random(seed, 3, records / 10..records * 9 / 10);
    let sink = PostgresSink::new(
        &cluster.url(),
        "echo",
        &sequence_check::ECHO_COLUMNS,
        sequence_check::echo_row,
    )
    .expect("a sink");
    let latest = PostgresSink::new(
        &cluster.url(),
        "latest",
        &sequence_check::ECHO_COLUMNS,
        sequence_check::echo_row,
    )
    .expect("a sink")
    .upsert(&["key"]);
    let echoed = sequence_check::echoed_with(&env, SPEC, |echoed| faults.inject(echoed));
    echoed.clone().sink_to(sink, "postgres");
    echoed.sink_to(latest, "latest");
    let result = env
        .execute("sequence-echo")
        .unwrap_or_else(|e| panic!("the job failed (seed {seed}): {e}"));
    assert_eq!(faults.fired(), 3, "every point was reached (seed {seed})");
    check_restarts_of(&result, &[&faults], false, seed);
    let echoed: Vec<Echoed> = cluster
        .echo_rows()
        .into_iter()
        .map(|(key, seq, count)| Echoed { key, seq, count })
        .collect();
    let check = echo_problems(SPEC, &echoed);
    assert!(
        check.is_clean(),
        "{backend}, {settings:?}, {slots} (seed {seed}): {check:?}"
    );
    let mut last: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
    for row in &echoed {
        last.insert(row.key, (row.seq, row.count));
    }
    let upserted: std::collections::BTreeMap<u32, (u64, u64)> = cluster
        .client()
        .query("SELECT key, seq, count FROM latest", &[])
        .expect("read")
        .iter()
        .map(|row| {
            let (key, seq, count): (i32, i64, i64) = (row.get(0), row.get(1), row.get(2));
            (key as u32, (seq as u64, count as u64))
        })
        .collect();
    assert_eq!(upserted, last, "each key's last record (seed {seed})");
    let prepared = cluster.count("SELECT count(*) FROM pg_prepared_xacts");
    assert_eq!(prepared, 0, "prepared transactions are left (seed {seed})");
    let staged = cluster
        .count("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'weir\\_staged\\_latest\\_%'");
    assert_eq!(staged, 1, "one staging table (seed {seed})");
    let table: String = cluster
        .client()
        .query_one(
            "SELECT tablename::text FROM pg_tables WHERE tablename LIKE 'weir\\_staged%'",
            &[],
        )
        .expect("the staging table")
        .get(0);
    let left = cluster.count(&format!("SELECT count(*) FROM \"{table}\""));
    assert_eq!(left, 0, "rows left staged (seed {seed})");
}

#[test]
fn panics_leave_every_row_in_postgres_once() {
    for slots in [1, 2] {
        echo_into_postgres_survives_panics(HEAP, &[], slots);
        echo_into_postgres_survives_panics(
            ROCKSDB,
            &[("execution.checkpointing.unaligned.enabled", "true")],
            slots,
        );
    }
}

#[test]
fn panics_leave_every_record_in_the_file_sink_once() {
    for slots in [1, 2] {
        echo_survives_panics(HEAP, &[], slots);
        echo_survives_panics(
            HEAP,
            &[("execution.checkpointing.unaligned.enabled", "true")],
            slots,
        );
    }
}

#[test]
fn panics_leave_every_record_in_the_file_sink_once_on_rocksdb() {
    for slots in [1, 2] {
        echo_survives_panics(ROCKSDB, &[], slots);
        echo_survives_panics(
            ROCKSDB,
            &[("execution.checkpointing.unaligned.enabled", "true")],
            slots,
        );
    }
}

#[test]
fn a_job_whose_subtasks_panic_restarts_with_every_record_counted_once_at_parallelism_1() {
    sequence_survives_panics(HEAP, 1);
}

#[test]
fn a_job_whose_subtasks_panic_restarts_with_every_record_counted_once_at_parallelism_2() {
    sequence_survives_panics(HEAP, 2);
}

#[test]
fn a_job_on_rocksdb_whose_subtasks_panic_restarts_with_every_record_counted_once() {
    sequence_survives_panics(ROCKSDB, 2);
}

/// Windows and joins, with panics both before the windows (in the source's task) and after
/// them (in the task that writes their reports).
fn windows_survive_panics(backend: &str, slots: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = config_on(backend, dir.path(), slots, 1);
    windows_survive_panics_with(config, WINDOWS, slots);
}

/// [`windows_survive_panics`] of `spec` with `config`.
fn windows_survive_panics_with(config: Configuration, spec: WindowCheckSpec, slots: usize) {
    let seed = seed();
    let env = StreamEnvironment::new(restarting(config)).unwrap();
    let records = u64::from(spec.keys_per_split) * slots as u64 * spec.per_key;
    let reports = window_check::expected(spec, slots).len() as u64;
    let before = Faults::random(seed, 2, records / 10..records * 9 / 10);
    let after = Faults::random(seed.rotate_left(17), 1, reports / 10..reports / 2);
    let log = OffsetLog::<WindowReport>::default();
    let windows = window_check::reports_with(&env, spec, slots, |r| before.inject(r));
    after.inject(windows).sink_to(log.clone(), "log");
    let result = env
        .execute("window-check")
        .unwrap_or_else(|e| panic!("the job failed (seed {seed}): {e}"));
    assert_eq!(
        before.fired() + after.fired(),
        3,
        "every point was reached (seed {seed})"
    );
    check_restarts(&result, &[&before, &after], seed);
    let problems = window_check::problems(spec, slots, &[log.records()]);
    assert!(problems.is_empty(), "seed {seed}: {problems:?}");
}

#[test]
fn windows_and_joins_whose_subtasks_panic_restart_with_every_record_counted_once_at_parallelism_1()
{
    windows_survive_panics(HEAP, 1);
}

#[test]
fn windows_and_joins_whose_subtasks_panic_restart_with_every_record_counted_once_at_parallelism_2()
{
    windows_survive_panics(HEAP, 2);
}

#[test]
fn windows_and_joins_on_rocksdb_whose_subtasks_panic_restart_with_every_record_counted_once() {
    windows_survive_panics(ROCKSDB, 2);
}

/// Restarted from checkpoints whose window parts are chains of deltas.
#[test]
fn windows_checkpointed_as_deltas_restart_with_every_record_counted_once() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    windows_survive_panics_with(deltas_config(HEAP, dir.path(), 2, 1), DELTAS, 2);
}

/// Windows and joins restarted from unaligned checkpoints (with the in-flight data of their
/// exchanges), on both backends.
#[test]
fn windows_and_joins_with_unaligned_checkpoints_restart_with_every_record_counted_once() {
    for backend in [HEAP, ROCKSDB] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = unaligned(config_on(backend, dir.path(), 2, 1), "0");
        windows_survive_panics_with(config, windows_spec(backend), 2);
    }
}

/// Stopped at parallelism `from` and resumed at `to`: key groups (state and timers) move to
/// the subtasks that own them now and the readers' splits are shared out again, and every
/// record is still counted once.
fn sequence_rescaled(backend: &str, from: usize, to: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let at = |slots| config_on(backend, dir.path(), slots, 1);
    run_until_checkpoints(&at(from), dir.path(), false, 2);
    resume_to_end_counting_once(&at(to));
}

#[test]
fn a_job_stopped_at_parallelism_2_resumes_at_1_with_every_record_counted_once() {
    sequence_rescaled(HEAP, 2, 1);
}

#[test]
fn a_job_stopped_at_parallelism_1_resumes_at_2_with_every_record_counted_once() {
    sequence_rescaled(HEAP, 1, 2);
}

#[test]
fn a_job_on_rocksdb_stopped_at_parallelism_2_resumes_at_1_with_every_record_counted_once() {
    sequence_rescaled(ROCKSDB, 2, 1);
}

#[test]
fn a_job_on_rocksdb_stopped_at_parallelism_1_resumes_at_2_with_every_record_counted_once() {
    sequence_rescaled(ROCKSDB, 1, 2);
}

/// The window check's windows and join at parallelism 2, then 1, then 2 again (its source and
/// sink stay at 2, so the input and the sink's logs are the same): every window and pair
/// once, with exactly its records.
fn windows_rescaled(backend: &str) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let at = |windows: usize| {
        config_on(backend, dir.path(), 2, 1)
            .with("parallelism.default", windows.to_string())
            .expect("valid settings")
    };
    let spec = windows_spec(backend);
    let log = OffsetLog::<WindowReport>::default();
    let build = |env: &StreamEnvironment| {
        window_check::reports(env, spec, 2)
            .sink_to(log.clone(), "log")
            .parallelism(2);
    };
    stop_after_checkpoints(&at(2), dir.path(), "window-check", false, 3, build);
    stop_after_checkpoints(&at(1), dir.path(), "window-check", true, 3, build);
    windows_resumed_to_end(at(2), spec, 2, &log, build);
}

#[test]
fn windows_and_joins_rescale_with_every_record_counted_once() {
    windows_rescaled(HEAP);
}

#[test]
fn windows_and_joins_on_rocksdb_rescale_with_every_record_counted_once() {
    windows_rescaled(ROCKSDB);
}

/// Runs the sequence check at parallelism 2 into a [`NoticeLog`] (behind a `key_by` exchange,
/// so the notices cross shards), every checkpoint kept: the notices per sink subtask, and the
/// checkpoints that completed; no aborted checkpoint's directory is left behind.
fn notices(extra: &[(&str, &str)]) -> (Vec<Vec<Notice>>, Vec<u64>) {
    let (result, subtasks, completed) = run_noting(extra);
    result.expect("the job");
    (subtasks, completed)
}

/// Runs the sequence check into a [`NoticeLog`] at parallelism 2 with `extra` settings: how
/// the job ended, what each sink subtask was told, and the completed checkpoints.
fn run_noting(
    extra: &[(&str, &str)],
) -> (
    Result<weir_engine::JobResult, JobError>,
    Vec<Vec<Notice>>,
    Vec<u64>,
) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut config = config(dir.path(), 2, 100_000);
    for (key, value) in extra {
        config.set(key, *value).expect("a valid setting");
    }
    let env = StreamEnvironment::new(config).expect("an environment");
    let log = NoticeLog::default();
    reports(&env, SPEC).sink_to(log.clone(), "notices");
    let result = env.execute("sequence-check");
    let subtasks = log.subtasks.lock().unwrap().clone();
    let unfinished: Vec<String> = std::fs::read_dir(dir.path().join("sequence-check"))
        .expect("the job's checkpoint directory")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("chk-"))
        .filter(|e| !e.path().join("_metadata").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        unfinished.is_empty(),
        "aborted checkpoints were removed: {unfinished:?}"
    );
    (result, subtasks, completed(dir.path()))
}

/// The checkpoints `notices` told of as completed, and as aborted.
fn checkpoints_told(notices: &[Notice]) -> (Vec<u64>, Vec<u64>) {
    let (mut complete, mut aborted) = (Vec::new(), Vec::new());
    for notice in notices {
        match notice {
            Notice::Complete(checkpoint) => complete.push(*checkpoint),
            Notice::Aborted(checkpoint) => aborted.push(*checkpoint),
            Notice::Flushed | Notice::Finished => {}
        }
    }
    (complete, aborted)
}

/// Every sink subtask hears of completed checkpoints after their barriers, in increasing
/// order, and only of checkpoints that completed.
#[test]
fn sinks_are_told_of_completed_checkpoints_in_order() {
    let (subtasks, completed) = notices(&[]);
    assert!(completed.len() >= 3, "checkpoints completed: {completed:?}");
    assert_eq!(subtasks.len(), 2);
    for (subtask, notices) in subtasks.iter().enumerate() {
        let (told, aborted) = checkpoints_told(notices);
        assert!(
            told.len() >= 2,
            "subtask {subtask} was told of {told:?} (completed: {completed:?})"
        );
        assert!(told.windows(2).all(|w| w[0] < w[1]), "in order: {told:?}");
        for checkpoint in &told {
            assert!(
                completed.contains(checkpoint),
                "{checkpoint} did not complete"
            );
        }
        // A checkpoint completes only after every sink subtask passed its barrier.
        let first_told = notices
            .iter()
            .position(|n| matches!(n, Notice::Complete(_)));
        let first_flush = notices.iter().position(|n| *n == Notice::Flushed);
        assert!(first_flush < first_told, "subtask {subtask}: {notices:?}");
        assert!(aborted.is_empty(), "nothing aborted: {notices:?}");
    }
}

/// With a timeout no checkpoint can meet, every sink subtask hears of aborted checkpoints,
/// and of no completed one; the job, which cannot end without its final checkpoint, fails
/// once more checkpoints failed in a row than it tolerates.
#[test]
fn sinks_are_told_of_aborted_checkpoints() {
    let (result, subtasks, completed) = run_noting(&[
        ("execution.checkpointing.timeout", "1 ms"),
        ("execution.checkpointing.tolerable-failed-checkpoints", "40"),
        ("restart-strategy.type", "none"),
    ]);
    let error = result.expect_err("no checkpoint completes").to_string();
    assert!(
        error.contains("41 checkpoint(s) in a row failed")
            && error.contains("execution.checkpointing.tolerable-failed-checkpoints = 40"),
        "{error}"
    );
    for (subtask, notices) in subtasks.iter().enumerate() {
        let (_, aborted) = checkpoints_told(notices);
        assert!(!aborted.is_empty(), "subtask {subtask}: {notices:?}");
        assert!(
            aborted.windows(2).all(|w| w[0] < w[1]),
            "in order: {aborted:?}"
        );
        for checkpoint in &aborted {
            assert!(
                !completed.contains(checkpoint),
                "{checkpoint} was aborted and completed"
            );
        }
    }
}

/// A sink whose subtasks each keep their index in a union list state, and note what every
/// writer got back when it was created.
#[derive(Clone, Default)]
struct UnionProbe {
    restored: Arc<Mutex<Vec<Restored>>>,
}

/// A writer's subtask and the union list it got back.
type Restored = (usize, Vec<u32>);

struct UnionProbeWriter {
    subtask: u32,
    subtasks: weir_engine::state::OperatorListState<u32>,
}

impl<T: Send + 'static> Sink<T> for UnionProbe {
    fn create_writer(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Box<dyn SinkWriter<T>>, ConnectorError> {
        let subtasks = ctx
            .operator_state()
            .union_list_state(&ListStateDescriptor::new("subtasks"))
            .map_err(|e| ConnectorError::external(e.to_string()))?;
        let mut got = subtasks.get();
        got.sort_unstable();
        self.restored.lock().unwrap().push((ctx.subtask, got));
        Ok(Box::new(UnionProbeWriter {
            subtask: ctx.subtask as u32,
            subtasks,
        }))
    }
}

impl<T> SinkWriter<T> for UnionProbeWriter {
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<T>,
        _timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
        batch.clear();
        Box::pin(async { Ok(()) })
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(async { Ok(()) })
    }

    fn flush(
        &mut self,
        _barrier: &CheckpointBarrier,
    ) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        self.subtasks.update([self.subtask]);
        Box::pin(async { Ok(()) })
    }
}

/// A union list state comes back whole to every subtask, at an unchanged parallelism too
/// (Flink's union redistribution), not only its own elements.
#[test]
fn union_list_state_comes_back_whole_to_every_subtask() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = config(dir.path(), 2, 1);
    let probe = UnionProbe::default();
    let build = |env: &StreamEnvironment| {
        reports(env, SPEC).sink_to(probe.clone(), "probe");
    };
    stop_after_checkpoints(&config, dir.path(), "sequence-check", false, 2, build);
    let fresh = std::mem::take(&mut *probe.restored.lock().unwrap());
    assert!(fresh.iter().all(|(_, got)| got.is_empty()), "{fresh:?}");
    stop_after_checkpoints(&config, dir.path(), "sequence-check", true, 1, build);
    let mut restored = probe.restored.lock().unwrap().clone();
    restored.sort();
    assert_eq!(restored, vec![(0, vec![0, 1]), (1, vec![0, 1])]);
}

/// On RocksDB checkpoints are incremental: later ones list the SST files an earlier one
/// uploaded instead of writing them again, and the job's shared directory keeps only what a
/// retained checkpoint lists (or a newer attempt may).
#[test]
fn rocksdb_checkpoints_share_the_files_they_have_in_common() {
    let shared = retained_shared_files(true);
    assert!(
        shared.iter().any(|name| name.ends_with(".sst")),
        "{shared:?}"
    );
    let mut distinct = shared.clone();
    distinct.dedup();
    assert!(
        distinct.len() < shared.len(),
        "no SST file shared: {shared:?}"
    );
}

/// With `execution.checkpointing.incremental: false` every checkpoint writes every file.
#[test]
fn full_rocksdb_checkpoints_share_no_file() {
    let shared = retained_shared_files(false);
    assert!(
        shared.iter().any(|name| name.ends_with(".sst")),
        "{shared:?}"
    );
    let mut distinct = shared.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), shared.len(), "a file shared: {shared:?}");
}

/// The sequence check on RocksDB, stopped after 6 checkpoints with 3 retained: the shared
/// files the retained checkpoints list (a name once per checkpoint listing it), sorted. Checks
/// that the job's shared directory holds nothing else but files of a newer attempt. It runs
/// without the write-back cache, which would hold its small state whole (a checkpoint lists
/// that as held writes, in no SST file).
fn retained_shared_files(incremental: bool) -> Vec<String> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = config_on(ROCKSDB, dir.path(), 1, 3)
        .with(
            "execution.checkpointing.incremental",
            incremental.to_string(),
        )
        .and_then(|config| config.with("state.backend.rocksdb.memory.write-back-ratio", "0"))
        .expect("valid settings");
    run_until_checkpoints(&config, dir.path(), false, 6);
    shared_files_listed(dir.path(), "sequence-check", 3)
}

/// The shared files the `retained` checkpoints of `job` list (a name once per checkpoint
/// listing it), sorted; checks that its shared directory holds nothing else but files of a
/// newer attempt.
fn shared_files_listed(checkpoints: &Path, job: &str, retained: usize) -> Vec<String> {
    let retained = {
        let completed = completed_of(checkpoints, job);
        assert_eq!(completed.len(), retained, "{completed:?}");
        completed
    };
    let job = checkpoints.join(job);
    let mut listed: Vec<String> = Vec::new();
    for n in &retained {
        let bytes = std::fs::read(job.join(format!("chk-{n}/_metadata"))).expect("metadata");
        let metadata = weir_state::checkpoint::CheckpointMetadata::from_bytes(&bytes).unwrap();
        listed.extend(
            metadata
                .referenced
                .into_iter()
                .filter_map(|file| Some(file.name.strip_prefix("shared/")?.to_string())),
        );
    }
    listed.sort();
    let newest = retained.last().copied().unwrap_or(0);
    let shared = match std::fs::read_dir(job.join("shared")) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return listed,
        Err(error) => panic!("cannot read {}: {error}", job.join("shared").display()),
    };
    for entry in shared {
        let name = entry.expect("an entry").file_name();
        let name = name.to_str().expect("a UTF-8 name").to_string();
        let newer = name
            .split_once('-')
            .and_then(|(number, _)| number.parse::<u64>().ok())
            .is_some_and(|number| number > newest);
        assert!(
            listed.contains(&name) || newer,
            "{name} is neither listed by checkpoints {retained:?} nor newer"
        );
    }
    listed
}

/// Tumbling and sliding windows checkpoint incrementally on both backends: after a full
/// snapshot, a checkpoint writes the keys that changed as a delta, and lists the chain; the
/// retained checkpoints share its links, and the shared directory holds no link they do not
/// list. With `execution.checkpointing.incremental: false` every window part is written
/// whole, into the checkpoint's own state file.
#[test]
fn window_checkpoints_write_only_the_keys_that_changed() {
    // Slow enough that few keys change between two checkpoints even on a loaded machine,
    // where a RocksDB checkpoint takes a second (and 500 records would change half the keys).
    let spec = WindowCheckSpec {
        rate: Some(100.0),
        ..DELTAS
    };
    for backend in [HEAP, ROCKSDB] {
        for incremental in [true, false] {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let config = deltas_config(backend, dir.path(), 1, 6)
                .with(
                    "execution.checkpointing.incremental",
                    incremental.to_string(),
                )
                .expect("valid settings");
            let build = |env: &StreamEnvironment| {
                window_check::reports(env, spec, 1).sink_to(DiscardSink::new(), "discard");
            };
            stop_after_checkpoints(&config, dir.path(), "window-check", false, 8, build);
            // Each retained checkpoint's window parts: the links of their chains.
            let mut chains: Vec<u64> = Vec::new();
            for n in completed_of(dir.path(), "window-check") {
                let path = dir.path().join(format!("window-check/chk-{n}"));
                let report = weir_engine::checkpoint::inspect::inspect(&path).expect("inspected");
                assert!(report.problems.is_empty(), "{:?}", report.problems);
                chains.extend(
                    report
                        .operators
                        .iter()
                        .flat_map(|operator| &operator.subtasks)
                        .flat_map(|subtask| &subtask.parts)
                        .filter_map(|part| part.chain_links),
                );
            }
            let links = shared_files_listed(dir.path(), "window-check", 6);
            let chain_links: Vec<&String> = links.iter().filter(|n| !n.ends_with(".sst")).collect();
            if incremental {
                assert!(
                    chains.iter().any(|&links| links > 1),
                    "{backend}: no window part with a delta: {chains:?}"
                );
                let mut distinct = chain_links.clone();
                distinct.dedup();
                assert!(
                    distinct.len() < chain_links.len(),
                    "{backend}: no link shared by two checkpoints: {chain_links:?}"
                );
            } else {
                assert!(chains.is_empty(), "{backend}: {chains:?}");
                assert!(chain_links.is_empty(), "{backend}: {chain_links:?}");
            }
        }
    }
}

/// A heap checkpoint's keyed state and windows (canonical keyed snapshots) resume on RocksDB
/// with every record counted once and every window once; a RocksDB checkpoint's (RocksDB's
/// own files) is refused on the heap at the start, naming the operator and the backend to use.
#[test]
fn a_heap_checkpoint_resumes_on_rocksdb_and_rocksdb_files_are_refused_on_the_heap() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    run_until_checkpoints(&config_on(HEAP, dir.path(), 1, 1), dir.path(), false, 2);
    resume_to_end_counting_once(&config_on(ROCKSDB, dir.path(), 1, 1));

    let dir = tempfile::tempdir().expect("a temporary directory");
    run_until_checkpoints(&config_on(ROCKSDB, dir.path(), 1, 1), dir.path(), false, 2);
    let error = resume_refused(&config_on(HEAP, dir.path(), 1, 1));
    assert!(
        error.contains("'check sequence'")
            && error.contains("RocksDB's own files")
            && error.contains(&format!("state.backend.type: {ROCKSDB}")),
        "{error}"
    );

    let dir = tempfile::tempdir().expect("a temporary directory");
    let (spec, slots) = (windows_spec(ROCKSDB), 2);
    let log = OffsetLog::<WindowReport>::default();
    let build = |env: &StreamEnvironment| {
        window_check::reports(env, spec, slots).sink_to(log.clone(), "log");
    };
    let heap = config_on(HEAP, dir.path(), slots, 1);
    stop_after_checkpoints(&heap, dir.path(), "window-check", false, 3, build);
    let rocksdb = config_on(ROCKSDB, dir.path(), slots, 1);
    windows_resumed_to_end(rocksdb, spec, slots, &log, build);
}

/// A short, unthrottled check.
const SMALL: SequenceSpec = SequenceSpec {
    splits: 4,
    keys_per_split: 2,
    per_key: 500,
    rate: None,
};

/// [`config_on`] checkpointing at the start (checkpoint 1), then not before the final
/// checkpoint.
fn start_and_end_only(backend: &str, checkpoints: &Path, slots: usize) -> Configuration {
    config_on(backend, checkpoints, slots, 1)
        .with("execution.checkpointing.interval", "1 h")
        .expect("a valid setting")
}

/// A bounded job ends with a final checkpoint taken after its operators finished: every sink
/// subtask hears of it last, after its input ended (where a transactional sink commits its
/// last transaction), and a job resumed from it reads and reports nothing again — its end is
/// in the checkpoint.
fn ends_with_a_final_checkpoint(backend: &str, slots: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = start_and_end_only(backend, dir.path(), slots);
    let env = StreamEnvironment::new(config.clone()).expect("an environment");
    let log = NoticeLog::default();
    let (sink, collected) = CollectSink::new();
    let checked = reports(&env, SMALL);
    checked.clone().sink_to(log.clone(), "notices");
    checked.sink_to(sink, "collect");
    env.execute("sequence-check").expect("the job");
    assert_eq!(problems(SMALL, &collected.records()), Vec::<String>::new());
    let last = *completed(dir.path())
        .last()
        .expect("a completed checkpoint");
    assert!(last >= 2, "the final checkpoint follows the first: {last}");
    for (subtask, notices) in log.subtasks.lock().unwrap().iter().enumerate() {
        let finished = notices.iter().position(|n| *n == Notice::Finished);
        assert!(
            finished.is_some() && notices.last() == Some(&Notice::Complete(last)),
            "subtask {subtask} hears of the final checkpoint {last} after it finished: {notices:?}"
        );
        assert!(
            !notices[finished.unwrap()..].contains(&Notice::Flushed),
            "nothing to flush after finishing: {notices:?}"
        );
    }

    let (reported, read) = resume_reports(&config, SMALL);
    assert_eq!(read, 0, "nothing to read");
    assert_eq!(reported, Vec::new(), "nothing reported again");
    assert!(
        *completed(dir.path()).last().expect("a checkpoint") > last,
        "the resumed run ended with a final checkpoint of its own"
    );
}

/// Window operators, and the interval join's timers, whose snapshot of a checkpoint is still
/// being written after its barrier when their input ends (here at once: a run resumed from
/// the final checkpoint reads nothing) write it as they finish — a source task's chain gets
/// no turn after its input ended, and the final checkpoint waits for the one before it.
#[test]
fn windows_whose_input_ends_behind_a_barrier_still_end_with_a_final_checkpoint() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = start_and_end_only(HEAP, dir.path(), 1);
    let spec = WindowCheckSpec {
        rate: None,
        ..WINDOWS
    };
    let log = OffsetLog::<WindowReport>::default();
    let build = |env: &StreamEnvironment| {
        window_check::reports(env, spec, 1).sink_to(log.clone(), "log");
    };
    let env = StreamEnvironment::new(config.clone()).expect("an environment");
    build(&env);
    env.execute("window-check").expect("the job");
    let problems = window_check::problems(spec, 1, &[log.records()]);
    assert!(problems.is_empty(), "{problems:?}");
    let completed = || completed_of(dir.path(), "window-check");
    let last = *completed().last().expect("a completed checkpoint");

    let result = window_check_resumed(config, build);
    assert_eq!(result.records_out("Source: numbers"), 0, "nothing to read");
    assert!(
        *completed().last().expect("a checkpoint") > last,
        "the resumed run ended with a final checkpoint of its own"
    );
}

#[test]
fn a_bounded_job_ends_with_a_final_checkpoint_at_parallelism_1() {
    ends_with_a_final_checkpoint(HEAP, 1);
}

#[test]
fn a_bounded_job_ends_with_a_final_checkpoint_at_parallelism_2() {
    ends_with_a_final_checkpoint(HEAP, 2);
}

#[test]
fn a_bounded_job_on_rocksdb_ends_with_a_final_checkpoint() {
    ends_with_a_final_checkpoint(ROCKSDB, 2);
}

/// Unaligned checkpoints (`execution.checkpointing.unaligned.enabled`), with `timeout` as the
/// aligned-checkpoint timeout.
fn unaligned(config: Configuration, timeout: &str) -> Configuration {
    config
        .with("execution.checkpointing.unaligned.enabled", "true")
        .and_then(|c| {
            c.with(
                "execution.checkpointing.aligned-checkpoint-timeout",
                timeout,
            )
        })
        .expect("valid settings")
}

/// `stream` through a step that takes `per_record` for each record (spinning: it holds its
/// shard as real work does), behind an exchange, so that data queues in the exchange.
fn slowed<T: Record>(stream: DataStream<T>, per_record: Duration) -> DataStream<T> {
    stream
        .rebalance()
        .map(move |record: T| {
            let started = Instant::now();
            while started.elapsed() < per_record {
                std::hint::spin_loop();
            }
            record
        })
        .name("slow")
}

/// The bytes of in-flight data in the completed checkpoints of job `job` (read back by
/// `weir checkpoint inspect`'s library call).
fn in_flight_bytes(checkpoints: &Path, job: &str) -> u64 {
    completed_of(checkpoints, job)
        .into_iter()
        .map(|n| in_flight_bytes_of(&checkpoints.join(job).join(format!("chk-{n}"))))
        .sum()
}

/// The bytes of in-flight data in the checkpoint at `path`.
fn in_flight_bytes_of(path: &Path) -> u64 {
    let report = weir_engine::checkpoint::inspect::inspect(path)
        .unwrap_or_else(|error| panic!("{} does not read back: {error}", path.display()));
    report
        .operators
        .into_iter()
        .flat_map(|operator| operator.subtasks)
        .flat_map(|subtask| subtask.parts)
        .map(|part| match part.content {
            weir_engine::checkpoint::inspect::PartContent::InFlight { bytes, .. } => bytes,
            _ => 0,
        })
        .sum()
}

/// A bounded job with unaligned checkpoints ends with a final checkpoint that holds every
/// record: the final checkpoint aligns (as Flink's does after its tasks finished), so no data
/// is in flight in it. Were its barrier to overtake the data queued behind the slow step, the
/// check's snapshot would come before its input's end, and a job resumed from the final
/// checkpoint would process that data and report every key again.
#[test]
fn with_unaligned_checkpoints_the_final_checkpoint_still_holds_every_record() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = unaligned(start_and_end_only(HEAP, dir.path(), 2), "0");
    let slow = |records| slowed(records, Duration::from_micros(20));
    let env = StreamEnvironment::new(config.clone()).expect("an environment");
    let (sink, collected) = CollectSink::new();
    reports_with(&env, SLOWED, slow).sink_to(sink, "collect");
    env.execute("sequence-check").expect("the job");
    assert_eq!(problems(SLOWED, &collected.records()), Vec::<String>::new());
    let last = *completed(dir.path())
        .last()
        .expect("a completed checkpoint");
    let final_checkpoint = dir
        .path()
        .join("sequence-check")
        .join(format!("chk-{last}"));
    assert_eq!(
        in_flight_bytes_of(&final_checkpoint),
        0,
        "in flight in checkpoint {last}"
    );

    let (reported, read) = resume_reports_with(&config, SLOWED, slow);
    assert_eq!(read, 0, "nothing to read");
    assert_eq!(reported, Vec::new(), "nothing reported again");
}

/// The sequence checked behind a slow step in the unaligned tests: long enough that several
/// checkpoints complete with data in flight between the injected failures (their final
/// checkpoint aligns, so it holds none).
const SLOWED: SequenceSpec = SequenceSpec {
    splits: 8,
    keys_per_split: 2,
    per_key: 10_000,
    rate: None,
};

/// The sequence check behind a slow step (data queues before it), checkpointed unaligned
/// every 20 ms with `timeout` as the aligned-checkpoint timeout, its slow task panicking at
/// three random points: every record counted once, and the checkpoints held in-flight data.
fn unaligned_sequence_survives_panics(backend: &str, slots: usize, timeout: &str) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = unaligned(config_on(backend, dir.path(), slots, 1_000), timeout);
    // Two subtasks run the injector behind a queue: one may reach its point before the
    // other's failure has stopped it, ending the run once for both.
    let (_, seed) = sequence_with_panics(config, SLOWED, slots == 1, |records, faults| {
        faults.inject(slowed(records, Duration::from_micros(20)))
    });
    assert!(
        in_flight_bytes(dir.path(), "sequence-check") > 0,
        "no checkpoint held in-flight data (seed {seed})"
    );
}

#[test]
fn unaligned_checkpoints_restore_their_in_flight_data_once_at_parallelism_1() {
    unaligned_sequence_survives_panics(HEAP, 1, "0");
}

#[test]
fn unaligned_checkpoints_restore_their_in_flight_data_once_at_parallelism_2() {
    unaligned_sequence_survives_panics(HEAP, 2, "0");
}

#[test]
fn unaligned_checkpoints_on_rocksdb_restore_their_in_flight_data_once() {
    unaligned_sequence_survives_panics(ROCKSDB, 2, "0");
}

#[test]
fn checkpoints_that_time_out_aligning_go_unaligned_and_restore_once() {
    unaligned_sequence_survives_panics(HEAP, 2, "5ms");
}

/// A sink that takes `per_record` for each record, waiting on its shard's timer (the shard
/// runs its other tasks meanwhile, as a sink waiting for a slow database does).
#[derive(Clone, Copy)]
struct SlowSink {
    per_record: Duration,
}

struct SlowWriter {
    per_record: Duration,
}

impl<T: Send + 'static> Sink<T> for SlowSink {
    fn create_writer(
        &self,
        _ctx: &RuntimeContext,
    ) -> Result<Box<dyn SinkWriter<T>>, ConnectorError> {
        Ok(Box::new(SlowWriter {
            per_record: self.per_record,
        }))
    }
}

impl<T> SinkWriter<T> for SlowWriter {
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<T>,
        _timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
        let wait = self.per_record * batch.len() as u32;
        batch.clear();
        Box::pin(async move {
            glommio::timer::sleep(wait).await;
            Ok(())
        })
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(async { Ok(()) })
    }

    fn flush(
        &mut self,
        _barrier: &CheckpointBarrier,
    ) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        Box::pin(async { Ok(()) })
    }
}

/// An endless sequence behind an exchange into a sink taking 1 ms a record, 4 096 records
/// queued before it (64 batches of 64); `exchange` repartitions the sequence.
fn into_a_slow_sink(
    env: &StreamEnvironment,
    exchange: impl FnOnce(DataStream<Numbered>) -> DataStream<Numbered>,
) {
    const ENDLESS: SequenceSpec = SequenceSpec {
        splits: 2,
        keys_per_split: 2,
        per_key: 1 << 40,
        rate: None,
    };
    let sequence = env
        .from_source(
            sequence_check::SequenceSource::new(ENDLESS),
            WatermarkStrategy::no_watermarks(),
            "sequence",
        )
        .uid("sequence");
    exchange(sequence)
        .sink_to(
            SlowSink {
                per_record: Duration::from_millis(1),
            },
            "slow",
        )
        .uid("slow");
}

/// Under backpressure — a slow sink behind a full queue — an aligned checkpoint's barrier
/// waits behind the queue (4 s) and times out (2 s), while an unaligned one overtakes it and
/// completes; a checkpoint holding in-flight data is not restored at another parallelism, nor
/// into channels fed by another partitioning.
#[test]
fn under_backpressure_unaligned_checkpoints_complete_where_aligned_ones_time_out() {
    let run = |unaligned_checkpoints: bool| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut config = config_on(HEAP, dir.path(), 1, 100)
            .with("execution.checkpointing.interval", "200ms")
            .and_then(|c| c.with("execution.checkpointing.timeout", "2s"))
            .and_then(|c| {
                c.with(
                    "execution.checkpointing.tolerable-failed-checkpoints",
                    "100",
                )
            })
            .and_then(|c| c.with("execution.batch-size", "64"))
            .and_then(|c| c.with("taskmanager.network.memory.buffers-per-channel", "64"))
            .expect("valid settings");
        if unaligned_checkpoints {
            config = unaligned(config, "0");
        }
        let env = StreamEnvironment::new(config.clone()).unwrap();
        into_a_slow_sink(&env, DataStream::rebalance);
        let job = env
            .execute_async("slow-sink", RunOptions::default())
            .expect("started");
        std::thread::sleep(Duration::from_secs(5));
        job.cancel();
        match job.wait() {
            Err(JobError::Cancelled { .. }) => {}
            other => panic!("expected the cancelled job, got {other:?}"),
        }
        let completed = completed_of(dir.path(), "slow-sink");
        (dir, config, completed)
    };
    let (_, _, aligned) = run(false);
    let (dir, config, unaligned) = run(true);
    // The first checkpoint may be taken before the queue filled.
    assert!(
        aligned.iter().all(|&n| n == 1),
        "aligned checkpoints wait behind the queue: {aligned:?} completed"
    );
    assert!(
        unaligned.len() >= 5,
        "unaligned checkpoints complete under backpressure: {unaligned:?}"
    );
    assert!(
        in_flight_bytes(dir.path(), "slow-sink") > 0,
        "the barriers overtook data"
    );
    // Resumed at parallelism 2, the in-flight data has no channels to go back to.
    let rescaled = config
        .clone()
        .with("taskmanager.numberOfTaskSlots", "2")
        .expect("valid settings");
    let env = StreamEnvironment::new(rescaled).unwrap();
    into_a_slow_sink(&env, DataStream::rebalance);
    let refused = refused_resume(&env, "slow-sink");
    assert!(
        refused.contains("in-flight data") && refused.contains("savepoint"),
        "{refused}"
    );
    // Nor into channels fed otherwise at the same parallelism.
    let env = StreamEnvironment::new(config).unwrap();
    into_a_slow_sink(&env, DataStream::broadcast);
    let refused = refused_resume(&env, "slow-sink");
    assert!(
        refused.contains("in-flight data") && refused.contains("Broadcast"),
        "{refused}"
    );
}

#[test]
fn unaligned_checkpoints_need_exactly_once_and_one_checkpoint_at_a_time() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (key, value, says) in [
        (
            "execution.checkpointing.mode",
            "AT_LEAST_ONCE",
            "EXACTLY_ONCE",
        ),
        (
            "execution.checkpointing.max-concurrent-checkpoints",
            "2",
            "max-concurrent",
        ),
    ] {
        let config = unaligned(config(dir.path(), 1, 1), "0")
            .with(key, value)
            .expect("valid settings");
        let error = config.checkpointing().expect_err("refused").to_string();
        assert!(
            error.contains("execution.checkpointing.unaligned.enabled") && error.contains(says),
            "{error}"
        );
    }
}
