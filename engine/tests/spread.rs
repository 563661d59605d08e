//! A job spread over two executors: each runs one slot of the job on a shard of its own, with
//! its own QUIC endpoint and certificate of one cluster CA, and the channels between the
//! slots cross loopback. The job gives what it gives on one executor; a failure on one
//! side ends both, naming why; a spread that cannot work is refused before anything runs;
//! a checkpointed run's executors checkpoint together and resume from one checkpoint, with
//! aligned or unaligned barriers.
//! (Here the two executors are two runs in one process; the control plane's tests run them
//! as processes of their own.)

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::assert_same_multiset;
use weir_engine::connector::Collected;
use weir_engine::prelude::*;
use weir_engine::runtime::{on_loopback, CancelHandle, RunOptions, Spread};

const NODES: [&str; 2] = ["node-0", "node-1"];

fn spreads(run: &str) -> Vec<Spread> {
    on_loopback(run, 2).unwrap()
}

/// An executor of a spread run, as a worker would set it up: one slot, on the machine's
/// `n`th core (the only core of its own), running its share of a job of parallelism 2, with
/// the keys `extra` too.
fn executor_env(n: usize, extra: &[(&str, &str)]) -> StreamEnvironment {
    let core = weir_engine::runtime::available_cores()[n].to_string();
    let mut pairs = vec![
        ("taskmanager.cpu.cores", core.as_str()),
        ("parallelism.default", "2"),
    ];
    pairs.extend_from_slice(extra);
    common::env_with(1, &pairs)
}

/// How an executor's run ended, and what it sank.
type Ended<T> = (Result<JobResult, JobError>, Vec<T>);

/// Builds the job (`build` returns its output) and runs it on both executors at once, each on
/// a thread of its own; each executor's result and output, in node order. Fails the test if
/// either has not ended within a minute.
fn run_spread<T: Clone + Send + 'static>(
    build: fn(&StreamEnvironment) -> Collected<T>,
) -> Vec<Ended<T>> {
    run_executors(spreads("test-run-1"), &[], false, build, |_| {})
}

/// Runs the job `build` makes as `spreads` say, each executor on a thread of its own with
/// the keys `extra` (resuming if `resume`), and `meanwhile` on this thread with their cancel
/// handles; each executor's result and output, in node order. Fails the test if any has not
/// ended within a minute.
fn run_executors<T: Clone + Send + 'static>(
    spreads: Vec<Spread>,
    extra: &[(&str, &str)],
    resume: bool,
    build: fn(&StreamEnvironment) -> Collected<T>,
    meanwhile: impl FnOnce(&[CancelHandle]),
) -> Vec<Ended<T>> {
    let (ended_tx, ended_rx) = mpsc::channel();
    let mut cancels = Vec::new();
    let threads: Vec<_> = spreads
        .into_iter()
        .enumerate()
        .map(|(i, spread)| {
            let ended = ended_tx.clone();
            let options = RunOptions {
                spread: Some(spread),
                resume,
                ..RunOptions::default()
            };
            cancels.push(options.cancel.clone());
            let extra: Vec<(String, String)> = extra
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            std::thread::spawn(move || {
                let extra: Vec<(&str, &str)> = extra
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                let env = executor_env(i, &extra);
                let collected = build(&env);
                let result = env.execute_with("spread", options);
                ended.send(i).unwrap();
                (result, collected.records())
            })
        })
        .collect();
    meanwhile(&cancels);
    for _ in 0..threads.len() {
        ended_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("every executor ends within a minute");
    }
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Keys whose running counts cross both ways: every key is read on both slots and counted on
/// the one owning it.
fn keyed_counts(env: &StreamEnvironment) -> Collected<(u64, u64)> {
    let (sink, collected) = CollectSink::new();
    env.from_sequence(0, 200_000)
        .map(|n: u64| (n % 1_000, 1u64))
        .key_by(|pair: &(u64, u64)| pair.0)
        .reduce(|a: (u64, u64), b: (u64, u64)| (a.0, a.1 + b.1))
        .name("count")
        .sink_to(sink, "counts");
    collected
}

/// Runs `build`'s job spread over the two executors and on one, and asserts both sank the
/// same records; each executor's result.
fn assert_spread_gives_embedded<T>(build: fn(&StreamEnvironment) -> Collected<T>) -> Vec<JobResult>
where
    T: Clone + Send + std::hash::Hash + Eq + std::fmt::Debug + 'static,
{
    let mut spread = Vec::new();
    let mut results = Vec::new();
    for (node, (result, records)) in NODES.iter().zip(run_spread(build)) {
        results.push(result.unwrap_or_else(|e| panic!("{node}'s run failed: {e}")));
        spread.extend(records);
    }
    let env = common::env_with(2, &[]);
    let embedded = build(&env);
    env.execute("embedded").unwrap();
    assert!(!spread.is_empty(), "the spread job sank records");
    assert_same_multiset(&spread, &embedded.records());
    results
}

#[test]
fn a_keyed_job_spread_over_two_executors_gives_what_it_gives_on_one() {
    if common::slots() < 2 {
        return;
    }
    let results = assert_spread_gives_embedded(keyed_counts);
    for (node, result) in NODES.iter().zip(results) {
        assert!(
            result.records_in("count") > 0,
            "{node} counted records: its slot ran the reduce"
        );
    }
}

fn collection_words(env: &StreamEnvironment) -> Collected<(String, u64)> {
    let words: Vec<String> = (0..5_000).map(|i| format!("w{}", i % 37)).collect();
    let (sink, collected) = CollectSink::new();
    env.from_collection(words)
        .map(|w: String| (w, 1u64))
        .key_by(|pair: &(String, u64)| pair.0.clone())
        .reduce(|a: (String, u64), b: (String, u64)| (a.0, a.1 + b.1))
        .sink_to(sink, "words");
    collected
}

#[test]
fn splits_any_reader_may_take_are_read_once_across_executors() {
    if common::slots() < 2 {
        return;
    }
    assert_spread_gives_embedded(collection_words);
}

fn poisoned(env: &StreamEnvironment) -> Collected<u64> {
    let (sink, collected) = CollectSink::new();
    env.from_sequence(0, 1_000_000)
        .rebalance()
        .map(|n: u64| {
            if n == 77_777 {
                panic!("poison record {n}");
            }
            n
        })
        .name("exploding-map")
        .sink_to(sink, "out");
    collected
}

#[test]
fn a_failure_in_one_executor_ends_the_run_in_both() {
    if common::slots() < 2 {
        return;
    }
    let runs = run_spread(poisoned);
    let errors: Vec<String> = runs
        .into_iter()
        .map(|(result, _)| match result {
            Ok(_) => panic!("a run of the poisoned job succeeded"),
            Err(error) => error.to_string(),
        })
        .collect();
    let panicked: Vec<usize> = (0..2)
        .filter(|&n| errors[n].contains("poison record 77777"))
        .collect();
    assert_eq!(
        panicked.len(),
        1,
        "one executor names the panic: {errors:?}"
    );
    // The other reports, of its subtasks' failures (a channel cut, then the stop that
    // followed), the one that says where it came from: the panicking executor's slot and node.
    let (failed, other) = (panicked[0], 1 - panicked[0]);
    assert!(
        errors[other].contains("channel")
            && errors[other].contains(&format!("slot {failed} on node '{}'", NODES[failed])),
        "the other learns it through a channel from {}: {errors:?}",
        NODES[failed]
    );
    assert!(
        errors.iter().all(|e| !e.contains("restart")),
        "a spread run is not restarted by its executor: {errors:?}"
    );
}

fn fanned_out(env: &StreamEnvironment) -> Collected<u64> {
    let (sink, collected) = CollectSink::new();
    env.from_sequence(0, 1_000)
        .parallelism(1)
        .rebalance()
        .map(|n: u64| n + 1)
        .sink_to(sink, "out");
    collected
}

#[test]
fn an_executor_whose_senders_never_come_fails_naming_the_channel() {
    if common::slots() < 2 {
        return;
    }
    // Slot 0 (the source) is node-0's, which never runs; node-1 only receives from it, so
    // it dials nobody and learns of it only from the channels it waits for.
    let mut spread = spreads("test-run-3").remove(1);
    spread.connect_timeout = Duration::from_millis(500);
    let env = executor_env(1, &[]);
    let _ = fanned_out(&env);
    let options = RunOptions {
        spread: Some(spread),
        ..RunOptions::default()
    };
    let error = env
        .execute_with("fanned out", options)
        .expect_err("no sender came")
        .to_string();
    assert!(
        error.contains("no sender opened channel test-run-3/0/0/1 within 1s"),
        "{error}"
    );
}

#[test]
fn a_shard_that_cannot_reach_its_peer_fails_the_run_and_its_neighbours_do_not_wait() {
    if common::slots() < 2 {
        return;
    }
    // Slots 0 and 1 here, slot 2 on node-2, which never runs: slot 0 dials it and gives up,
    // while slot 1 (which dials nobody) waits for its ring from slot 0.
    let mut spread = on_loopback("test-run-4", 3).unwrap().remove(0);
    spread.slots[1].node = "node-0".into();
    spread.connect_timeout = Duration::from_millis(500);
    spread.idle_timeout = Duration::from_secs(1);
    let (ended_tx, ended_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let cores = weir_engine::runtime::available_cores();
        let cores = format!("{},{}", cores[0], cores[1]);
        let env = common::env_with(
            2,
            &[
                ("taskmanager.cpu.cores", cores.as_str()),
                ("parallelism.default", "3"),
            ],
        );
        let _ = fanned_out(&env);
        let options = RunOptions {
            spread: Some(spread),
            ..RunOptions::default()
        };
        let error = env.execute_with("unreachable", options).map(|_| ());
        ended_tx.send(error).unwrap();
    });
    let error = ended_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the run ends")
        .expect_err("slot 2 cannot be reached")
        .to_string();
    assert!(
        error.contains("slot 0 cannot reach slot 2 on node 'node-2'"),
        "{error}"
    );
}

#[test]
fn a_spread_that_cannot_work_is_refused_naming_why() {
    let mut spread = spreads("test-run-2").remove(0);
    let env = executor_env(0, &[]);
    let _ = keyed_counts(&env);
    let refused = |spread: Spread, env: &StreamEnvironment| {
        let options = RunOptions {
            spread: Some(spread),
            ..RunOptions::default()
        };
        env.execute_with("refused", options)
            .expect_err("refused")
            .to_string()
    };
    let mut wide = spread.clone();
    wide.slots.push(wide.slots[1].clone());
    let error = refused(wide, &env);
    assert!(
        error.contains("spread over 3 slots but the job needs 2"),
        "{error}"
    );
    let mut both_here = spread.clone();
    both_here.slots[1].node = "node-0".into();
    let error = refused(both_here, &env);
    assert!(
        error
            .contains("2 of the run's slots are on node 'node-0', but this executor has 1 core(s)"),
        "{error}"
    );
    let mut elsewhere = spread.clone();
    elsewhere.node = "node-9".into();
    let error = refused(elsewhere, &env);
    assert!(
        error.contains("no slot of the run is on node 'node-9'"),
        "{error}"
    );
    spread.run = "r".repeat(300);
    let error = refused(spread, &env);
    assert!(error.contains("too long to name its channels"), "{error}");
}

/// How many numbers [`throttled_counts`] counts, over how many keys.
const THROTTLED: u64 = 40_000;
const THROTTLED_KEYS: u64 = 100;

/// Counts per key of [`THROTTLED`] numbers read at 20 000 a second (two seconds at least),
/// keyed both ways between the slots.
fn throttled_counts(env: &StreamEnvironment) -> Collected<(u64, u64)> {
    counts_of_throttled(env, Duration::ZERO)
}

/// [`throttled_counts`] through a counter that takes 200 µs a record, slower than the 10 000
/// records a second each of its subtasks gets: its input channels, from its own executor and
/// from the other, stay full.
fn backpressured_counts(env: &StreamEnvironment) -> Collected<(u64, u64)> {
    counts_of_throttled(env, Duration::from_micros(200))
}

fn counts_of_throttled(env: &StreamEnvironment, per_record: Duration) -> Collected<(u64, u64)> {
    let (sink, collected) = CollectSink::new();
    env.from_source(
        DataGeneratorSource::sequence(0, THROTTLED).with_rate(20_000.0),
        WatermarkStrategy::no_watermarks(),
        "numbers",
    )
    .map(|n: u64| (n % THROTTLED_KEYS, 1u64))
    .key_by(|pair: &(u64, u64)| pair.0)
    .reduce(move |a: (u64, u64), b: (u64, u64)| {
        std::thread::sleep(per_record);
        (a.0, a.1 + b.1)
    })
    .name("count")
    .sink_to(sink, "counts");
    collected
}

/// How a checkpointed run over two executors goes: its barriers, and when the first run is
/// cancelled.
#[derive(Clone, Copy, PartialEq)]
enum Checkpointed {
    /// Aligned, over [`throttled_counts`]: cancelled once a checkpoint completed.
    Aligned,
    /// Unaligned, over [`backpressured_counts`]: cancelled once a checkpoint holding in-flight
    /// data completed.
    Unaligned,
}

/// Runs a job of counts spread over two executors as run `run`, checkpointing every 100 ms
/// into `dir` as `how` says (resuming from there if `resume`); with `cancel`, cancels both
/// once a checkpoint completed (holding in-flight data, if unaligned) and records flowed on
/// after it. Each executor's result and output.
fn checkpointed_run(
    how: Checkpointed,
    run: &str,
    dir: &std::path::Path,
    resume: bool,
    cancel: bool,
) -> Vec<Ended<(u64, u64)>> {
    let mut extra = vec![
        ("execution.checkpointing.interval", "100 ms"),
        ("execution.checkpointing.dir", dir.to_str().unwrap()),
    ];
    let build = match how {
        Checkpointed::Aligned => throttled_counts,
        Checkpointed::Unaligned => {
            extra.push(("execution.checkpointing.unaligned.enabled", "true"));
            backpressured_counts
        }
    };
    run_executors(spreads(run), &extra, resume, build, |cancels| {
        if !cancel {
            return;
        }
        let checkpoints = dir.join("spread");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let done = || match how {
            Checkpointed::Aligned => latest_checkpoint(&checkpoints).is_some(),
            Checkpointed::Unaligned => {
                latest_checkpoint(&checkpoints).is_some_and(|chk| in_flight_bytes(&chk) > 0)
            }
        };
        while !done() {
            assert!(
                std::time::Instant::now() < deadline,
                "no checkpoint completed"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(300));
        for cancel in cancels {
            cancel.cancel();
        }
    })
}

/// The newest completed checkpoint in job directory `dir`.
fn latest_checkpoint(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.path().join("_metadata").exists())
        .filter_map(|entry| {
            let name = entry.file_name();
            let number: u64 = name.to_str()?.strip_prefix("chk-")?.parse().ok()?;
            Some((number, entry.path()))
        })
        .max()
        .map(|(_, path)| path)
}

/// The bytes of in-flight data (what unaligned barriers overtook) checkpoint `chk` holds.
fn in_flight_bytes(chk: &std::path::Path) -> u64 {
    use weir_engine::checkpoint::inspect::{inspect, PartContent};
    let report = inspect(chk).unwrap_or_else(|e| panic!("{}: {e}", chk.display()));
    report
        .operators
        .iter()
        .flat_map(|operator| &operator.subtasks)
        .flat_map(|subtask| &subtask.parts)
        .map(|part| match part.content {
            PartContent::InFlight { bytes, .. } => bytes,
            _ => 0,
        })
        .sum()
}

#[test]
fn a_checkpointed_run_over_two_executors_resumes_on_both_from_one_checkpoint_counting_once() {
    resumed_from_one_checkpoint_counting_once(Checkpointed::Aligned, "test-run-5");
}

/// Unaligned barriers overtake what the channels between the executors hold, too: a completed
/// checkpoint holds that in-flight data, and the run resumed from it counts every key once.
#[test]
fn an_unaligned_checkpoint_over_two_executors_holds_what_its_barriers_overtook_and_resumes_once() {
    resumed_from_one_checkpoint_counting_once(Checkpointed::Unaligned, "test-run-7");
}

/// Runs a checkpointed job of counts over two executors as `how` says, cancels it after a
/// checkpoint, resumes it from there to its end, and checks every key was counted once.
fn resumed_from_one_checkpoint_counting_once(how: Checkpointed, run: &str) {
    if common::slots() < 2 {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let first = checkpointed_run(how, &format!("{run}a"), dir.path(), false, true);
    let mut counts: Vec<(u64, u64)> = Vec::new();
    for (node, (result, records)) in NODES.iter().zip(first) {
        assert!(result.is_err(), "{node}'s first run was cancelled");
        counts.extend(records);
    }
    if how == Checkpointed::Unaligned {
        // What the second run resumes from holds what the first run's channels held.
        let chk = latest_checkpoint(&dir.path().join("spread")).expect("a checkpoint");
        assert!(
            in_flight_bytes(&chk) > 0,
            "{} holds no in-flight data",
            chk.display()
        );
    }
    let second = checkpointed_run(how, &format!("{run}b"), dir.path(), true, false);
    let mut resumed = 0;
    for (node, (result, records)) in NODES.iter().zip(second) {
        let result = result.unwrap_or_else(|e| panic!("{node}'s resumed run failed: {e}"));
        if node == &NODES[0] {
            // Slot 0's executor coordinates: it counts the run's checkpoints.
            let stats = result.checkpoints.expect("a checkpointed run");
            assert!(stats.completed >= 1, "{stats:?}");
        }
        resumed += records.len();
        counts.extend(records);
    }
    // The second run began past the first's checkpoint, not from scratch...
    assert!(
        resumed < THROTTLED as usize,
        "{resumed} counts after resuming"
    );
    // ...with every key's count restored once: its last count is its share, none higher.
    let mut last = std::collections::HashMap::new();
    for (key, count) in counts {
        let highest = last.entry(key).or_insert(0);
        *highest = count.max(*highest);
    }
    assert_eq!(last.len() as u64, THROTTLED_KEYS);
    let share = THROTTLED / THROTTLED_KEYS;
    let wrong: Vec<_> = last.iter().filter(|(_, &count)| count != share).collect();
    assert!(
        wrong.is_empty(),
        "keys counted other than {share} times: {wrong:?}"
    );
}
