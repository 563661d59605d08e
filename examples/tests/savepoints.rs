//! Savepoints in process: a job stopped with a savepoint, started again from it — moved to
//! another directory, with its checkpoints gone — at the same or another parallelism, on the
//! heap and on RocksDB and from one to the other, counts every record once, and its windows
//! hold exactly their records across both runs (on the same backend or the other); a data
//! generator handing out chunks goes on from a savepoint at either parallelism with every
//! number once; a savepoint taken while the job runs on restores the same way; a drained
//! stop fires every timer first; state of an operator the job no longer has is refused unless
//! allowed; a job without checkpointing refuses savepoints, naming the settings.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weir_engine::api::{JobClient, RunOptions, StopMode};
use weir_engine::prelude::*;
use weir_engine::JobError;
use weir_examples::sequence_check::{self, problems, KeyReport, Numbered, SequenceSpec};
use weir_examples::window_check::{self, WindowCheckSpec, WindowReport};

use common::{config_on, Notice, NoticeLog, HEAP, ROCKSDB};

/// Slow enough that a stop lands mid-way.
const SPEC: SequenceSpec = SequenceSpec {
    splits: 24,
    keys_per_split: 2,
    per_key: 4_000,
    rate: Some(40_000.0),
};

/// Starts job `name`, built by `build`, from `savepoint` if given.
fn start(
    config: &Configuration,
    name: &str,
    savepoint: Option<&Path>,
    build: impl FnOnce(&StreamEnvironment),
) -> JobClient {
    let env = StreamEnvironment::new(config.clone()).expect("an environment");
    build(&env);
    let options = RunOptions {
        from_savepoint: savepoint.map(Path::to_path_buf),
        ..RunOptions::default()
    };
    env.execute_async(name, options).expect("started")
}

/// Waits until job `name` completed a checkpoint in `checkpoints` (a stop then lands after
/// the job is well under way).
fn wait_for_a_checkpoint(checkpoints: &Path, name: &str, job: &JobClient) {
    let started = Instant::now();
    let has_one = || {
        std::fs::read_dir(checkpoints.join(name)).is_ok_and(|entries| {
            entries
                .filter_map(Result::ok)
                .any(|entry| entry.path().join("_metadata").exists())
        })
    };
    while !has_one() {
        assert!(
            !job.is_finished(),
            "the job ended before its first checkpoint"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no checkpoint completes"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Stops `job` with a savepoint: the savepoint's directory, moved into `to` (a savepoint is
/// self-contained), and the job's result.
fn stop(job: JobClient, mode: StopMode, to: &Path) -> (PathBuf, weir_engine::JobResult) {
    let savepoint = job
        .stop_with_savepoint(mode)
        .wait()
        .expect("the savepoint completes")
        .dir;
    let result = job.wait().expect("the job stops cleanly");
    assert_eq!(result.savepoint.as_deref(), Some(savepoint.as_path()));
    (moved(&savepoint, to), result)
}

/// Moves directory `dir` into `to`: its new path.
fn moved(dir: &Path, to: &Path) -> PathBuf {
    let target = to.join(dir.file_name().expect("a named directory"));
    std::fs::create_dir_all(to).expect("the target directory");
    std::fs::rename(dir, &target).expect("the savepoint moves");
    target
}

/// Checks that `savepoint` lists only files of its own directory.
fn assert_self_contained(savepoint: &Path) {
    let completed = weir_state::checkpoint::open_savepoint(savepoint)
        .unwrap_or_else(|e| panic!("the savepoint checks out: {e}"));
    for file in completed.metadata.all_files() {
        assert!(
            file.shared_by().is_none() && !file.name.contains('/'),
            "{} lists {}, which is not its own",
            savepoint.display(),
            file.name
        );
    }
}

/// The sequence check on `(backend, slots)` stopped with a savepoint, started from it on
/// `(backend, slots)` `to`: every record counted once, each key's end-of-input timer fired
/// once, and the second run read only what came after the savepoint.
fn sequence_stopped_and_restarted(
    (backend, from): (&str, usize),
    (restores_on, to): (&str, usize),
) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let checkpoints = dir.path().join("checkpoints");
    let build = |env: &StreamEnvironment| {
        sequence_check::reports(env, SPEC).sink_to(DiscardSink::new(), "discard");
    };
    let config = config_on(backend, &checkpoints, from, 1);
    let job = start(&config, "sequence-check", None, build);
    wait_for_a_checkpoint(&checkpoints, "sequence-check", &job);
    let (savepoint, _) = stop(job, StopMode::Suspend, &dir.path().join("moved"));
    assert_self_contained(&savepoint);
    // Nothing of the first run's checkpoints is needed any more.
    std::fs::remove_dir_all(&checkpoints).expect("the checkpoints go");

    sequence_counts_once_from(config_on(restores_on, &checkpoints, to, 1), savepoint);
}

/// Runs the sequence check with `config` from `savepoint` to its end: it read only what came
/// after the savepoint, and counted every record once.
fn sequence_counts_once_from(config: Configuration, savepoint: PathBuf) {
    let env = StreamEnvironment::new(config).expect("an environment");
    let (sink, collected) = CollectSink::new();
    sequence_check::reports(&env, SPEC).sink_to(sink, "collect");
    let options = RunOptions {
        from_savepoint: Some(savepoint),
        ..RunOptions::default()
    };
    let result = env
        .execute_with("sequence-check", options)
        .expect("the job started from the savepoint");
    let read = result.records_out("Source: sequence");
    assert!(
        read > 0 && read < SPEC.records(),
        "the second run read {read} of {} records: it did not start from the savepoint",
        SPEC.records()
    );
    let problems = problems(SPEC, &collected.records());
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn a_job_stopped_with_a_savepoint_starts_from_it_with_every_record_counted_once() {
    sequence_stopped_and_restarted((HEAP, 2), (HEAP, 2));
    sequence_stopped_and_restarted((HEAP, 2), (HEAP, 1));
}

#[test]
fn a_job_on_rocksdb_stopped_with_a_savepoint_starts_from_it_with_every_record_counted_once() {
    sequence_stopped_and_restarted((ROCKSDB, 2), (ROCKSDB, 2));
    sequence_stopped_and_restarted((ROCKSDB, 1), (ROCKSDB, 2));
}

/// A savepoint holds keyed state in the canonical format: one taken at parallelism 2 on
/// either backend starts the job on the other at parallelism 1 and 2.
#[test]
fn a_savepoint_starts_the_job_on_the_other_backend_at_any_parallelism() {
    for (wrote, restores_on) in [(HEAP, ROCKSDB), (ROCKSDB, HEAP)] {
        for to in [1, 2] {
            sequence_stopped_and_restarted((wrote, 2), (restores_on, to));
        }
    }
}

/// Windows fill while checkpoints (window deltas, on both backends) are taken.
const WINDOWS: WindowCheckSpec = WindowCheckSpec {
    keys_per_split: 40,
    per_key: 400,
    rate: Some(4_000.0),
};

/// The window check on `backend` stopped with a savepoint (without draining) and started from
/// it on `restores_on`: the two runs' sinks together hold every window and pair exactly once,
/// with exactly its records — nothing after the savepoint's barrier reached the first run's
/// sink.
fn windows_stopped_and_restarted(backend: &str, restores_on: &str) {
    let slots = 2;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let checkpoints = dir.path().join("checkpoints");
    let config = config_on(backend, &checkpoints, slots, 1);
    let (first_sink, first) = CollectSink::new();
    let job = start(&config, "window-check", None, |env| {
        window_check::reports(env, WINDOWS, slots).sink_to(first_sink, "collect");
    });
    wait_for_a_checkpoint(&checkpoints, "window-check", &job);
    std::thread::sleep(Duration::from_millis(200));
    let (savepoint, _) = stop(job, StopMode::Suspend, &dir.path().join("moved"));
    assert_self_contained(&savepoint);
    std::fs::remove_dir_all(&checkpoints).expect("the checkpoints go");

    let config = config_on(restores_on, &checkpoints, slots, 1);
    let env = StreamEnvironment::new(config).expect("an environment");
    let (second_sink, second) = CollectSink::new();
    window_check::reports(&env, WINDOWS, slots).sink_to(second_sink, "collect");
    let options = RunOptions {
        from_savepoint: Some(savepoint),
        ..RunOptions::default()
    };
    env.execute_with("window-check", options)
        .expect("the job started from the savepoint");
    let mut both: Vec<WindowReport> = first.records();
    assert!(
        !both.is_empty(),
        "the first run fired no window before its stop"
    );
    both.extend(second.records());
    let problems = window_check::problems(WINDOWS, slots, &[both]);
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn windows_stopped_with_a_savepoint_fire_once_across_both_runs() {
    windows_stopped_and_restarted(HEAP, HEAP);
}

#[test]
fn windows_on_rocksdb_stopped_with_a_savepoint_fire_once_across_both_runs() {
    windows_stopped_and_restarted(ROCKSDB, ROCKSDB);
}

/// Windows' savepoints are canonical too (each pane's contents read out of RocksDB into the
/// heap's layout): taken on either backend, they start the job on the other.
#[test]
fn windows_stopped_with_a_savepoint_start_again_on_the_other_backend() {
    windows_stopped_and_restarted(HEAP, ROCKSDB);
    windows_stopped_and_restarted(ROCKSDB, HEAP);
}

/// A savepoint taken while the job runs on, then the job cancelled: started from the
/// savepoint, every record is counted once.
#[test]
fn a_savepoint_taken_while_the_job_runs_restores_like_a_stop() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let checkpoints = dir.path().join("checkpoints");
    let config = config_on(HEAP, &checkpoints, 2, 1);
    let build = |env: &StreamEnvironment| {
        sequence_check::reports(env, SPEC).sink_to(DiscardSink::new(), "discard");
    };
    let job = start(&config, "sequence-check", None, build);
    wait_for_a_checkpoint(&checkpoints, "sequence-check", &job);
    let savepoint = job.trigger_savepoint().wait().expect("a savepoint").dir;
    assert!(
        savepoint.starts_with(checkpoints.join("sequence-check").join("savepoints")),
        "{} is not in the default savepoint directory",
        savepoint.display()
    );
    // The job runs on, and checkpoints go on.
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !job.is_finished(),
        "the job stopped after a plain savepoint"
    );
    job.cancel();
    assert!(matches!(job.wait(), Err(JobError::Cancelled { .. })));
    let savepoint = moved(&savepoint, &dir.path().join("moved"));
    sequence_counts_once_from(config, savepoint);
}

#[test]
fn a_checkpoint_asked_for_is_taken_at_once_and_restores_like_the_periodic_ones() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let checkpoints = dir.path().join("checkpoints");
    // An interval no run of this test reaches: past the first, taken as the job starts,
    // every checkpoint is one asked for.
    let config = config_on(HEAP, &checkpoints, 2, 1)
        .with("execution.checkpointing.interval", "1h")
        .expect("a valid interval");
    let job = start(&config, "sequence-check", None, |env| {
        sequence_check::reports(env, SPEC).sink_to(DiscardSink::new(), "discard");
    });
    let first = job.trigger_checkpoint().wait().expect("a checkpoint");
    let second = job.trigger_checkpoint().wait().expect("another");
    assert_eq!(first.checkpoint + 1, second.checkpoint);
    assert_eq!(
        second.dir,
        checkpoints
            .join("sequence-check")
            .join(format!("chk-{}", second.checkpoint)),
        "a checkpoint of the job's own"
    );
    assert!(second.dir.join("_metadata").exists());
    assert!(
        !first.dir.exists(),
        "retained like the periodic ones (one here): the newer one replaced it"
    );
    job.cancel();
    assert!(matches!(job.wait(), Err(JobError::Cancelled { .. })));
    sequence_counts_once_from(config, second.dir);
}

/// Stopped with a drain, the job fires every event-time timer before the savepoint (the
/// check reports each key it saw at the final watermark, every record read counted once);
/// stopped without, it fires none.
#[test]
fn a_drained_stop_fires_every_timer_first_and_a_suspended_one_none() {
    for (mode, reports_expected) in [(StopMode::Drain, true), (StopMode::Suspend, false)] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = config_on(HEAP, dir.path(), 2, 1);
        let (sink, collected) = CollectSink::new();
        let job = start(&config, "sequence-check", None, |env| {
            sequence_check::reports(env, SPEC).sink_to(sink, "collect");
        });
        wait_for_a_checkpoint(dir.path(), "sequence-check", &job);
        let (_, result) = stop(job, mode, &dir.path().join("moved"));
        let reports: Vec<KeyReport> = collected.records();
        let read = result.records_out("Source: sequence");
        assert!(
            read < SPEC.records(),
            "{mode:?}: the job read all its input"
        );
        if reports_expected {
            // Every key seen (the readers take their splits one at a time: not every key) has
            // reported, once, with every record read counted once.
            let keys: std::collections::HashSet<u32> = reports.iter().map(|r| r.key).collect();
            assert!(!reports.is_empty(), "{mode:?}: no key reported");
            assert_eq!(keys.len(), reports.len(), "{mode:?}: a key reported twice");
            let counted: u64 = reports.iter().map(|report| report.count).sum();
            assert_eq!(counted, read, "{mode:?}: each record read is counted once");
        } else {
            assert!(reports.is_empty(), "{mode:?}: {} reports", reports.len());
        }
    }
}

/// Stopped with a savepoint, every sink subtask — behind a `key_by` exchange — hears of the
/// savepoint's completion before its task ends (where a transactional sink commits), and is
/// finished only when the stop drains: stopped without, its tasks close unfinished.
#[test]
fn sinks_hear_the_stopping_savepoint_complete_and_finish_only_when_drained() {
    for (mode, finishes) in [(StopMode::Suspend, 0), (StopMode::Drain, 1)] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = config_on(HEAP, dir.path(), 2, 1);
        let log = NoticeLog::default();
        let job = start(&config, "sequence-check", None, |env| {
            sequence_check::reports(env, SPEC).sink_to(log.clone(), "notices");
        });
        wait_for_a_checkpoint(dir.path(), "sequence-check", &job);
        let (savepoint, _) = stop(job, mode, &dir.path().join("moved"));
        let number = weir_state::checkpoint::open_savepoint(&savepoint)
            .expect("the savepoint")
            .metadata
            .checkpoint;
        let subtasks = log.subtasks.lock().unwrap().clone();
        assert_eq!(subtasks.len(), 2);
        for (subtask, notices) in subtasks.iter().enumerate() {
            let told = notices
                .iter()
                .position(|notice| *notice == Notice::Complete(number))
                .unwrap_or_else(|| {
                    panic!("{mode:?}: subtask {subtask} was not told of savepoint {number}: {notices:?}")
                });
            let after = &notices[told + 1..];
            assert!(
                after
                    .iter()
                    .all(|n| matches!(n, Notice::Flushed | Notice::Finished)),
                "{mode:?}: subtask {subtask}: {notices:?}"
            );
            let finished = notices.iter().filter(|n| **n == Notice::Finished).count();
            assert_eq!(
                finished, finishes,
                "{mode:?}: subtask {subtask}: {notices:?}"
            );
        }
    }
}

/// The sequence check with a second keyed operator (uid `extra`) beside it.
fn with_extra(env: &StreamEnvironment) {
    let reports = sequence_check::reports_with(env, SPEC, |records| {
        records
            .clone()
            .key_by(|record: &Numbered| record.key)
            .reduce(|a: Numbered, b: Numbered| if a.seq >= b.seq { a } else { b })
            .uid("extra")
            .sink_to(DiscardSink::new(), "extra sink");
        records
    });
    reports.sink_to(DiscardSink::new(), "discard");
}

/// A savepoint holding state of an operator the job no longer has is refused, naming the
/// operator and the flag; with `allow_non_restored_state` the job starts without it.
#[test]
fn state_of_a_removed_operator_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let checkpoints = dir.path().join("checkpoints");
    let config = config_on(HEAP, &checkpoints, 1, 1);
    let job = start(&config, "sequence-check", None, with_extra);
    wait_for_a_checkpoint(&checkpoints, "sequence-check", &job);
    let (savepoint, _) = stop(job, StopMode::Suspend, &dir.path().join("moved"));

    let run = |allow: bool| {
        let env = StreamEnvironment::new(config.clone()).expect("an environment");
        let (sink, collected) = CollectSink::new();
        sequence_check::reports(&env, SPEC).sink_to(sink, "collect");
        let options = RunOptions {
            from_savepoint: Some(savepoint.clone()),
            allow_non_restored_state: allow,
            ..RunOptions::default()
        };
        env.execute_with("sequence-check", options)
            .map(|_| collected.records())
    };
    let refused = run(false)
        .expect_err("the savepoint is refused")
        .to_string();
    for needle in ["extra", "no longer has", "--allow-non-restored-state"] {
        assert!(refused.contains(needle), "'{needle}' not in: {refused}");
    }
    let reports = run(true).expect("started without the extra operator's state");
    let problems = problems(SPEC, &reports);
    assert!(problems.is_empty(), "{problems:?}");
}

/// A job that takes no checkpoints refuses a savepoint, naming the settings; so does a
/// request after the job ended.
#[test]
fn a_job_without_checkpoints_refuses_savepoints() {
    let config = Configuration::default()
        .with("taskmanager.numberOfTaskSlots", "1")
        .expect("valid settings");
    let job = start(&config, "sequence-check", None, |env| {
        sequence_check::reports(env, SPEC).sink_to(DiscardSink::new(), "discard");
    });
    let error = job
        .stop_with_savepoint(StopMode::Suspend)
        .wait_timeout(Duration::from_secs(30))
        .expect("an answer")
        .expect_err("refused");
    assert!(
        error
            .to_string()
            .contains("execution.checkpointing.interval"),
        "{error}"
    );
    job.cancel();
    assert!(matches!(job.wait(), Err(JobError::Cancelled { .. })));
}

/// `weir run --from-savepoint` of a directory that is no savepoint is refused, naming it.
#[test]
fn a_missing_or_damaged_savepoint_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = config_on(HEAP, &dir.path().join("checkpoints"), 1, 1);
    let env = StreamEnvironment::new(config).expect("an environment");
    sequence_check::reports(&env, SPEC).sink_to(DiscardSink::new(), "discard");
    let missing = dir.path().join("savepoint-nothing");
    let options = RunOptions {
        from_savepoint: Some(missing.clone()),
        ..RunOptions::default()
    };
    let error = env
        .execute_with("sequence-check", options)
        .expect_err("refused")
        .to_string();
    assert!(
        error.contains(&missing.display().to_string()) && error.contains("savepoint"),
        "{error}"
    );
}

/// A data generator handing out chunks (each to whichever subtask asks first), stopped with a
/// savepoint at 2 slots and started from it at 1 and at 2: the two runs' sinks together hold
/// every number once. The readers' positions in their chunks and the chunks no reader took
/// yet are both in the savepoint.
#[test]
fn a_chunked_generator_stopped_with_a_savepoint_goes_on_from_it_with_every_number_once() {
    const NUMBERS: u64 = 40_000;
    fn build(env: &StreamEnvironment, sink: CollectSink<u64>) {
        let numbers = DataGeneratorSource::sequence(0, NUMBERS)
            .with_chunks(500)
            .with_rate(20_000.0);
        env.from_source(numbers, WatermarkStrategy::no_watermarks(), "numbers")
            .uid("numbers")
            .key_by(|n: &u64| *n)
            .process(|n: u64, ctx: &mut KeyedProcessContext<'_, u64, u64>| ctx.emit(n))
            .uid("pass")
            .sink_to(sink, "collect");
    }
    for to in [1, 2] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let checkpoints = dir.path().join("checkpoints");
        let (sink, before) = CollectSink::new();
        let job = start(
            &config_on(HEAP, &checkpoints, 2, 1),
            "chunks",
            None,
            |env| build(env, sink),
        );
        wait_for_a_checkpoint(&checkpoints, "chunks", &job);
        let (savepoint, _) = stop(job, StopMode::Suspend, &dir.path().join("moved"));
        let mut numbers = before.records();
        let first = numbers.len() as u64;
        assert!(
            0 < first && first < NUMBERS,
            "the stop lands mid-way: {first} of {NUMBERS} numbers before it"
        );

        let (sink, after) = CollectSink::new();
        start(
            &config_on(HEAP, &checkpoints, to, 1),
            "chunks",
            Some(&savepoint),
            |env| build(env, sink),
        )
        .wait()
        .expect("the job goes on from the savepoint to its end");
        numbers.extend(after.records());
        numbers.sort_unstable();
        let expected: Vec<u64> = (0..NUMBERS).collect();
        if numbers != expected {
            let mut seen = std::collections::HashMap::new();
            for n in &numbers {
                *seen.entry(*n).or_insert(0u32) += 1;
            }
            let twice = seen.values().filter(|&&c| c > 1).count();
            let lost = (0..NUMBERS).filter(|n| !seen.contains_key(n)).count();
            panic!("restored at {to} slots: {lost} numbers lost, {twice} read twice");
        }
    }
}
