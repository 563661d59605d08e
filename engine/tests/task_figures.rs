//! The live figures of a job's tasks (`RunOptions::monitor`): where each task's time goes —
//! busy, idle, backpressured — the bytes that cross shards, and the event time of each task,
//! input channel and source split.

mod common;

use std::time::{Duration, Instant};

use weir_engine::api::JobClient;
use weir_engine::monitor::{Figures, JobMonitor, TaskFigures};
use weir_engine::prelude::*;
use weir_engine::runtime::RunOptions;

/// Polls `monitor` until `done` holds for its figures (or panics after `limit`).
fn figures_until(
    monitor: &JobMonitor,
    limit: Duration,
    what: &str,
    done: impl Fn(&Figures) -> bool,
) -> Figures {
    let deadline = Instant::now() + limit;
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(figures) = monitor.figures() {
            if done(&figures) {
                return figures;
            }
            last = Some(figures);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} within {limit:?}; last figures: {last:#?}");
}

fn tasks_named<'a>(figures: &'a Figures, name: &str) -> Vec<&'a TaskFigures> {
    figures.tasks.iter().filter(|t| t.name == name).collect()
}

/// Starts, on `slots` slots with `settings`, numbers tripled and rebalanced into a map that
/// takes 100 µs a record: the job, and its monitor.
fn start_slow_job(slots: usize, settings: &[(&str, &str)]) -> (JobClient, JobMonitor) {
    let env = common::env_with(slots, settings);
    env.from_source(
        DataGeneratorSource::new(None, |i| i),
        WatermarkStrategy::no_watermarks(),
        "numbers",
    )
    .map(|n: u64| n * 3)
    .name("triple")
    .rebalance()
    .map(|n: u64| {
        std::thread::sleep(Duration::from_micros(100));
        n
    })
    .name("slow")
    .sink_to(DiscardSink::new(), "discard");
    let monitor = JobMonitor::default();
    let options = RunOptions {
        monitor: monitor.clone(),
        ..RunOptions::default()
    };
    let job = env.execute_async("slow task", options).expect("starts");
    (job, monitor)
}

#[test]
fn a_producer_behind_a_slow_task_is_timed_backpressured_and_the_slow_task_busy() {
    let slots = common::slots();
    let (job, monitor) = start_slow_job(slots, &[]);
    let figures = figures_until(
        &monitor,
        Duration::from_secs(60),
        "a second of backpressure",
        |f| {
            let sources = tasks_named(f, "Source: numbers -> triple");
            sources.len() == slots && sources.iter().all(|t| t.backpressured_seconds > 1.0)
        },
    );
    job.cancel();
    let _ = job.wait();

    let sources = tasks_named(&figures, "Source: numbers -> triple");
    let slow = tasks_named(&figures, "slow -> Sink: discard");
    assert_eq!((sources.len(), slow.len()), (slots, slots), "{figures:#?}");
    for task in &slow {
        assert!(
            task.busy_seconds > task.idle_seconds && task.backpressured_seconds < 0.1,
            "the slow task works, never waiting for credit: {task:#?}"
        );
    }
    if slots > 1 {
        // Half of a rebalance's channels cross shards, in segments.
        assert!(sources.iter().all(|t| t.bytes_out > 0), "{figures:#?}");
        assert!(slow.iter().all(|t| t.bytes_in > 0), "{figures:#?}");
        // The operator that writes to the exchange sent them, not the one chained before it.
        for s in &figures.subtasks {
            match s.operator.as_str() {
                "triple" => assert!(s.bytes_out > 0, "{s:?}"),
                _ => assert_eq!(s.bytes_out, 0, "{s:?}"),
            }
        }
    }
    assert_eq!(sources[0].operators.len(), 2, "source and triple chain");
    assert!(
        figures.latency.is_empty(),
        "no latency markers unless metrics.latency.interval is set"
    );
}

#[test]
fn latency_markers_reach_every_sink_subtask_behind_the_records_before_them() {
    let slots = common::slots();
    let (job, monitor) = start_slow_job(slots, &[("metrics.latency.interval", "20ms")]);
    let figures = figures_until(
        &monitor,
        Duration::from_secs(60),
        "five markers at every sink subtask",
        |f| {
            (0..slots).all(|subtask| {
                f.latency
                    .iter()
                    .any(|l| l.subtask == subtask && l.buckets.iter().sum::<u64>() >= 5)
            })
        },
    );
    job.cancel();
    let _ = job.wait();
    assert!(
        figures.ready_seconds.is_some_and(|s| s > 0.0),
        "every task was built: {figures:#?}"
    );
    for latency in &figures.latency {
        assert_eq!(
            (latency.sink.as_str(), latency.source.as_str()),
            ("Sink: discard", "Source: numbers"),
            "{latency:#?}"
        );
        let markers = latency.buckets.iter().sum::<u64>();
        // Behind a backlog of records that take 100 µs each: far more than a millisecond.
        assert!(latency.sum_seconds / markers as f64 > 0.001, "{latency:#?}");
    }
}

#[test]
fn each_task_split_and_channel_shows_its_event_time() {
    let slots = common::slots();
    let env = common::env_with(slots, &[("pipeline.auto-watermark-interval", "20ms")]);
    // Split 0 of each source subtask is at event time 1_000_000 + index, the subtask's
    // watermark follows; the last subtask's is 500 s behind the others.
    let behind = (slots - 1) as u64;
    let stamped = WatermarkStrategy::for_bounded_out_of_orderness(Duration::ZERO)
        .with_timestamp_assigner(move |n: &u64, _| {
            let lag = if slots > 1 && n % slots as u64 == behind {
                500_000
            } else {
                0
            };
            1_000_000_000 + *n as i64 - lag
        });
    env.from_source(
        DataGeneratorSource::new(None, |i| i).with_rate(20_000.0),
        stamped,
        "numbers",
    )
    .key_by(|n: &u64| n % 7)
    .process(|n: u64, ctx: &mut KeyedProcessContext<'_, u64, u64>| ctx.emit(n))
    .name("keyed")
    .sink_to(DiscardSink::new(), "discard");
    let monitor = JobMonitor::default();
    let options = RunOptions {
        monitor: monitor.clone(),
        ..RunOptions::default()
    };
    let job = env.execute_async("event time", options).expect("starts");
    let figures = figures_until(
        &monitor,
        Duration::from_secs(60),
        "watermarks on every task, channel and split",
        |f| {
            // Every task of both vertices registered, each with its event time.
            f.tasks.len() == 2 * slots
                && f.tasks.iter().all(|t| {
                    t.watermark.is_some()
                        && t.channels.iter().all(|c| c.watermark.is_some())
                        && t.splits.iter().all(|s| s.watermark.is_some())
                })
        },
    );
    job.cancel();
    let _ = job.wait();

    let sources = tasks_named(&figures, "Source: numbers");
    let keyed = tasks_named(&figures, "keyed -> Sink: discard");
    assert_eq!((sources.len(), keyed.len()), (slots, slots), "{figures:#?}");
    for source in &sources {
        let [split] = &source.splits[..] else {
            panic!("one split per generator subtask: {source:#?}");
        };
        assert_eq!(
            split.split,
            format!("generator-{}-of-{slots}", source.subtask)
        );
        assert!(!split.idle);
        // A subtask of one split is at the split's event time, give or take the 100 ms
        // between two showings of the split's (20 s of event time a second here).
        let watermark = source.watermark.unwrap();
        assert!(
            (watermark - split.watermark.unwrap()).abs() < 10_000
                && watermark > 1_000_000_000 - 600_000,
            "{source:#?}"
        );
        assert!(source.channels.is_empty());
    }
    for task in &keyed {
        assert_eq!(task.channels.len(), slots, "one channel per source subtask");
        let mut senders: Vec<usize> = task.channels.iter().map(|c| c.from.subtask).collect();
        senders.sort_unstable();
        assert_eq!(senders, (0..slots).collect::<Vec<_>>());
        assert!(task.channels.iter().all(|c| c.from.head == sources[0].head));
        // The input watermark is the lowest channel's, never ahead of it.
        let lowest = task.channels.iter().filter_map(|c| c.watermark).min();
        assert!(task.watermark <= lowest, "{task:#?}");
        if slots > 1 {
            let from_behind = task
                .channels
                .iter()
                .find(|c| c.from.subtask == slots - 1)
                .unwrap();
            let ahead = task.channels.iter().find(|c| c.from.subtask == 0).unwrap();
            assert!(
                ahead.watermark.unwrap() - from_behind.watermark.unwrap() > 400_000,
                "the last source subtask's channel is 500 s behind: {task:#?}"
            );
        }
    }
}
