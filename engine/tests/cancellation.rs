//! Unbounded jobs run until cancelled: `execute_async` returns at once, `cancel` stops every
//! subtask (sources first; the rest wind down as their inputs close), and `wait` reports
//! `JobError::Cancelled` — not a failure.

mod common;

use std::time::{Duration, Instant};

use weir_engine::api::{JobClient, RunOptions};
use weir_engine::prelude::*;

/// Waits until `ready` holds, failing the test after a minute.
fn eventually(what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Cancels the job, waits for it to end, and checks that it ended as cancelled.
#[track_caller]
fn cancel_and_wait(client: JobClient) -> JobError {
    client.cancel();
    let err = common::within(
        Duration::from_secs(120),
        "the cancelled job to end",
        move || client.wait(),
    )
    .expect_err("cancelled");
    assert!(matches!(err, JobError::Cancelled { .. }), "{err:?}");
    err
}

#[test]
fn an_unbounded_job_runs_until_cancelled() {
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_source(
        DataGeneratorSource::new(None, |i| i),
        WatermarkStrategy::no_watermarks(),
        "forever",
    )
    .key_by(|n: &u64| n % 97)
    .reduce(|a, b| a.max(b))
    .sink_to(sink, "out");
    let client = env
        .execute_async("unbounded", RunOptions::default())
        .expect("starts");
    eventually("records to flow", || collected.len() >= 10_000);
    assert!(
        !client.is_finished(),
        "an unbounded job does not end by itself"
    );
    let err = cancel_and_wait(client);
    assert_eq!(err.to_string(), "job 'unbounded' was cancelled");
}

#[test]
fn a_rate_limited_source_stops_while_idle() {
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_source(
        DataGeneratorSource::new(None, |i| i).with_rate(1_000.0),
        WatermarkStrategy::no_watermarks(),
        "slow",
    )
    .rebalance()
    .sink_to(sink, "out");
    let client = env
        .execute_async("rate limited", RunOptions::default())
        .expect("starts");
    eventually("a first record", || !collected.is_empty());
    cancel_and_wait(client);
}

#[test]
fn a_bounded_job_run_asynchronously_finishes_normally() {
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_sequence(0, 20_000)
        .rebalance()
        .sink_to(sink, "out");
    let client = env
        .execute_async("bounded", RunOptions::default())
        .expect("starts");
    let result = common::within(Duration::from_secs(120), "the job to end", move || {
        client.wait()
    })
    .expect("finishes");
    assert_eq!(result.records_in("Sink: out"), 20_000);
    assert_eq!(collected.len(), 20_000);
}
