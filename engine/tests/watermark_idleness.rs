//! Idleness: a source split with no records holds event time back (the watermark at a task is
//! the minimum over its inputs) until it is marked idle; then the windows downstream fire on
//! the other inputs' watermarks alone.

mod common;

use std::time::{Duration, Instant};

use weir_engine::api::RunOptions;
use weir_engine::prelude::*;

/// One busy source (a record every ms of event time) and one that emits nothing, unioned
/// into 100 ms tumbling windows; returns the window results seen within `run_for` (or as soon
/// as `enough` have come), then cancels.
fn windows_fired(idleness: Option<Duration>, run_for: Duration, enough: usize) -> usize {
    let env = common::env_with(1, &[("pipeline.auto-watermark-interval", "20 ms")]);
    let strategy = || {
        let s = WatermarkStrategy::for_monotonous_timestamps()
            .with_timestamp_assigner(|n: &u64, _| *n as i64);
        match idleness {
            Some(timeout) => s.with_idleness(timeout),
            None => s,
        }
    };
    let busy = env.from_source(
        DataGeneratorSource::new(None, |i| i).with_rate(5_000.0),
        strategy(),
        "busy",
    );
    // A rate this low emits its first record after about 17 minutes: the split stays silent.
    let silent = env.from_source(
        DataGeneratorSource::new(None, |i| i).with_rate(0.001),
        strategy(),
        "silent",
    );
    let (sink, out) = CollectSink::new();
    busy.union([silent])
        .key_by(|n: &u64| n % 2)
        .window(TumblingEventTimeWindows::of(Duration::from_millis(100)))
        .reduce(|a, b| a.max(b))
        .sink_to(sink, "windows");
    let client = env
        .execute_async("idleness", RunOptions::default())
        .expect("starts");
    let deadline = Instant::now() + run_for;
    while Instant::now() < deadline && out.len() < enough {
        std::thread::sleep(Duration::from_millis(10));
    }
    client.cancel();
    assert!(matches!(client.wait(), Err(JobError::Cancelled { .. })));
    out.len()
}

#[test]
fn a_silent_split_stalls_event_time_without_idleness() {
    // Two seconds are 10 000 busy records, 100 windows of event time: none may fire while
    // the silent source holds the minimum watermark at its initial value.
    assert_eq!(windows_fired(None, Duration::from_secs(2), 1), 0);
}

#[test]
fn an_idle_split_no_longer_stalls_event_time() {
    let fired = windows_fired(
        Some(Duration::from_millis(200)),
        Duration::from_secs(60),
        10,
    );
    assert!(fired >= 10, "only {fired} windows fired");
}
