//! A job spread over two executors: each runs one slot of the job on a shard of its own, with
//! its own QUIC endpoint and certificate of one cluster CA, and the channels between the
//! slots cross loopback. The job gives what it gives on one executor; a failure on one
//! side ends both, naming why; a spread that cannot work is refused before anything runs.
//! (Here the two executors are two runs in one process; the control plane's tests run them
//! as processes of their own.)

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::assert_same_multiset;
use weir_engine::connector::Collected;
use weir_engine::prelude::*;
use weir_engine::runtime::{on_loopback, RunOptions, Spread};

const NODES: [&str; 2] = ["node-0", "node-1"];

fn spreads(run: &str) -> Vec<Spread> {
    on_loopback(run, 2).unwrap()
}

/// An executor of a spread run, as a worker would set it up: one slot, on the machine's
/// `n`th core (the only core of its own), running its share of a job of parallelism 2.
fn executor_env(n: usize) -> StreamEnvironment {
    let core = weir_engine::runtime::available_cores()[n].to_string();
    common::env_with(
        1,
        &[
            ("taskmanager.cpu.cores", core.as_str()),
            ("parallelism.default", "2"),
        ],
    )
}

/// Builds the job (`build` returns its output) and runs it on both executors at once, each on
/// a thread of its own; each executor's result and output, in node order. Fails the test if
/// either has not ended within a minute.
fn run_spread<T: Clone + Send + 'static>(
    build: fn(&StreamEnvironment) -> Collected<T>,
) -> Vec<(Result<JobResult, JobError>, Vec<T>)> {
    let (ended_tx, ended_rx) = mpsc::channel();
    let threads: Vec<_> = spreads("test-run-1")
        .into_iter()
        .enumerate()
        .map(|(i, spread)| {
            let ended = ended_tx.clone();
            std::thread::spawn(move || {
                let env = executor_env(i);
                let collected = build(&env);
                let options = RunOptions {
                    spread: Some(spread),
                    ..RunOptions::default()
                };
                let result = env.execute_with("spread", options);
                ended.send(i).unwrap();
                (result, collected.records())
            })
        })
        .collect();
    for _ in 0..threads.len() {
        ended_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("both executors end within a minute");
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
    let (panicked, other): (Vec<&String>, Vec<&String>) = errors
        .iter()
        .partition(|e| e.contains("poison record 77777"));
    assert_eq!(
        panicked.len(),
        1,
        "one executor names the panic: {errors:?}"
    );
    assert!(
        other[0].contains("channel"),
        "the other learns it through a channel: {errors:?}"
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
    let env = executor_env(1);
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
    let env = executor_env(0);
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
    let error = refused(spread.clone(), &env);
    assert!(error.contains("too long to name its channels"), "{error}");
    spread.run = "test-run-2".into();
    let dir = tempfile::tempdir().unwrap();
    let core = weir_engine::runtime::available_cores()[0].to_string();
    let checkpointed = common::env_with(
        1,
        &[
            ("taskmanager.cpu.cores", core.as_str()),
            ("parallelism.default", "2"),
            ("execution.checkpointing.interval", "1 s"),
            ("execution.checkpointing.dir", dir.path().to_str().unwrap()),
        ],
    );
    let _ = keyed_counts(&checkpointed);
    let error = refused(spread, &checkpointed);
    assert!(
        error.contains("checkpoints of a job spread over several executors"),
        "{error}"
    );
}
