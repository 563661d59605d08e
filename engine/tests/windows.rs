//! Windows end to end, against hand-computed outputs: tumbling windows count out-of-order
//! records within the bound in the right window; records after the watermark are dropped and
//! counted, or go to the late side output, exactly as the allowed lateness says; sliding
//! windows, merging sessions, count windows, full-window `process` and `window_all`.
//!
//! Every job runs on both state backends: with `rocksdb` the windows' contents live in RocksDB
//! (`window/stored.rs`), and both runs must give the same output.
//!
//! The sources here emit a watermark after every record (`max_ts - bound - 1`), so where each
//! watermark falls between records is known, and with one source subtask every channel
//! carries records and watermarks in that order.

mod common;

use std::time::Duration;

use weir_engine::prelude::*;
use weir_engine::time::{WatermarkGenerator, WatermarkOutput};

/// Bounded out-of-orderness, emitted after every record instead of periodically.
#[derive(Clone)]
struct PerRecord {
    max: i64,
    bound: i64,
}

impl WatermarkGenerator<(String, i64)> for PerRecord {
    fn on_event(&mut self, _: &(String, i64), timestamp: i64, output: &mut WatermarkOutput) {
        self.max = self.max.max(timestamp);
        output.emit_watermark(self.max - self.bound - 1);
    }
    fn on_periodic_emit(&mut self, _: &mut WatermarkOutput) {}
}

type Event = (String, i64);

fn per_record(bound_ms: i64) -> WatermarkStrategy<Event> {
    WatermarkStrategy::for_generator(move || PerRecord {
        max: i64::MIN + bound_ms + 1,
        bound: bound_ms,
    })
    .with_timestamp_assigner(|e: &Event, _| e.1)
}

fn events(list: &[(&str, i64)]) -> Vec<Event> {
    list.iter().map(|(k, t)| (k.to_string(), *t)).collect()
}

/// Counts records per key and window.
#[derive(Clone)]
struct Count;

impl AggregateFunction<Event, u64, u64> for Count {
    fn create_accumulator(&self) -> u64 {
        0
    }
    fn add(&self, _: Event, acc: &mut u64) {
        *acc += 1;
    }
    fn get_result(&self, acc: &u64) -> u64 {
        *acc
    }
    fn merge(&self, into: &mut u64, other: &u64) {
        *into += other;
    }
}

type Counted = (String, i64, i64, u64);

#[allow(clippy::ptr_arg)] // the signature of a window function over `String` keys
fn label(key: &String, window: &TimeWindow, count: u64) -> Counted {
    (key.clone(), window.start, window.end, count)
}

/// The state backends every job here runs on.
const BACKENDS: [&str; 2] = ["hashmap", "rocksdb"];

fn env_on(backend: &str) -> StreamEnvironment {
    common::env_with(common::slots(), &[("state.backend.type", backend)])
}

/// Runs `input` (one source subtask, per-record watermarks with `bound_ms`) through `build`
/// on every backend, checks that they agree, and returns the main output, the late side
/// output and the result of the first.
fn run(
    input: &[(&str, i64)],
    bound_ms: i64,
    build: impl Fn(DataStream<Event>, &OutputTag<Event>) -> DataStream<Counted>,
) -> (Vec<Counted>, Vec<Event>, JobResult) {
    let runs = BACKENDS.map(|backend| run_on(backend, input, bound_ms, &build));
    for (backend, (out, late, _)) in BACKENDS.iter().zip(&runs).skip(1) {
        let (first_out, first_late, _) = &runs[0];
        common::assert_same_multiset(out, first_out);
        assert_eq!(late, first_late, "late records on {backend}");
    }
    let [first, ..] = runs;
    first
}

fn run_on(
    backend: &str,
    input: &[(&str, i64)],
    bound_ms: i64,
    build: &impl Fn(DataStream<Event>, &OutputTag<Event>) -> DataStream<Counted>,
) -> (Vec<Counted>, Vec<Event>, JobResult) {
    let env = env_on(backend);
    let late = OutputTag::<Event>::new("late");
    let source = env
        .from_source(
            CollectionSource::new(events(input)),
            per_record(bound_ms),
            "events",
        )
        .parallelism(1);
    let windowed = build(source, &late);
    let (sink, out) = CollectSink::new();
    let (late_sink, late_out) = CollectSink::new();
    windowed.get_side_output(&late).sink_to(late_sink, "late");
    windowed.sink_to(sink, "out");
    let result = env
        .execute("windows")
        .unwrap_or_else(|e| panic!("the job succeeds on {backend}: {e}"));
    (out.records(), late_out.records(), result)
}

const INPUT: &[(&str, i64)] = &[
    ("a", 1_000),
    ("a", 9_000),
    ("a", 7_000), // out of order, within the 5 s bound (watermark 3 999)
    ("b", 2_000),
    ("a", 12_000), // watermark 6 999
    ("a", 10_500),
    ("a", 16_000), // watermark 10 999: [0, 10 000) fires
    ("a", 3_000),  // after the watermark: late for [0, 10 000)
    ("a", 30_000), // watermark 24 999: [10 000, 20 000) fires
];

#[test]
fn tumbling_windows_count_out_of_order_records_in_their_window() {
    let (out, late, result) = run(INPUT, 5_000, |s, late| {
        s.key_by(|e: &Event| e.0.clone())
            .window(TumblingEventTimeWindows::of(Duration::from_secs(10)))
            .side_output_late_data(late)
            .aggregate_with(Count, label)
            .name("counts")
    });
    common::assert_same_multiset(
        &out,
        &[
            ("a".into(), 0, 10_000, 3),
            ("b".into(), 0, 10_000, 1),
            ("a".into(), 10_000, 20_000, 3),
            ("a".into(), 30_000, 40_000, 1),
        ],
    );
    assert_eq!(late, events(&[("a", 3_000)]));
    assert_eq!(
        result.late_records_dropped("counts"),
        0,
        "it went to the side output"
    );
}

#[test]
fn late_records_without_a_side_output_are_dropped_and_counted() {
    let (out, late, result) = run(INPUT, 5_000, |s, _| {
        s.key_by(|e: &Event| e.0.clone())
            .window(TumblingEventTimeWindows::of(Duration::from_secs(10)))
            .aggregate_with(Count, label)
            .name("counts")
    });
    assert_eq!(out.len(), 4);
    assert!(late.is_empty());
    assert_eq!(result.late_records_dropped("counts"), 1);
}

#[test]
fn allowed_lateness_fires_again_for_late_records_then_drops_later_ones() {
    let input = &[
        ("a", 1_000),
        ("a", 9_000),
        ("a", 7_000),
        ("a", 12_000),
        ("a", 10_500),
        ("a", 16_000), // watermark 10 999: [0, 10 000) fires with 3
        ("a", 3_000),  // within 2 s of lateness: fires again with 4
        ("a", 17_500), // watermark 12 499: [0, 10 000) is cleaned up (9 999 + 2 000 passed)
        ("a", 2_000),  // too late
        ("a", 30_000),
    ];
    let (out, late, _) = run(input, 5_000, |s, late| {
        s.key_by(|e: &Event| e.0.clone())
            .window(TumblingEventTimeWindows::of(Duration::from_secs(10)))
            .allowed_lateness(Duration::from_secs(2))
            .side_output_late_data(late)
            .aggregate_with(Count, label)
    });
    assert_eq!(
        out,
        vec![
            ("a".into(), 0, 10_000, 3),
            ("a".into(), 0, 10_000, 4),
            ("a".into(), 10_000, 20_000, 4),
            ("a".into(), 30_000, 40_000, 1),
        ],
        "one key, one window operator subtask: firing order is event-time order"
    );
    assert_eq!(late, events(&[("a", 2_000)]));
}

#[test]
fn a_late_record_of_a_new_key_fires_its_window_once() {
    let input = &[
        ("a", 1_000),
        ("a", 16_000), // watermark 10 999: [0, 10 000) fires for "a"
        ("b", 3_000),  // within 2 s of lateness: "b"'s first record fires [0, 10 000) once
        ("a", 17_500), // watermark 12 499: a timer would fire "b" again here
        ("a", 30_000),
    ];
    let (out, _, _) = run(input, 5_000, |s, _| {
        s.key_by(|e: &Event| e.0.clone())
            .window(TumblingEventTimeWindows::of(Duration::from_secs(10)))
            .allowed_lateness(Duration::from_secs(2))
            .aggregate_with(Count, label)
    });
    common::assert_same_multiset(
        &out,
        &[
            ("a".into(), 0, 10_000, 1),
            ("b".into(), 0, 10_000, 1),
            ("a".into(), 10_000, 20_000, 2),
            ("a".into(), 30_000, 40_000, 1),
        ],
    );
}

#[test]
fn sliding_windows_hold_each_record_in_every_window_it_falls_in() {
    let input = &[("a", 1_000), ("a", 6_000), ("a", 12_000), ("b", 14_000)];
    let (out, _, _) = run(input, 0, |s, _| {
        s.key_by(|e: &Event| e.0.clone())
            .window(SlidingEventTimeWindows::of(
                Duration::from_secs(10),
                Duration::from_secs(5),
            ))
            .aggregate_with(Count, label)
    });
    common::assert_same_multiset(
        &out,
        &[
            ("a".into(), -5_000, 5_000, 1),
            ("a".into(), 0, 10_000, 2),
            ("a".into(), 5_000, 15_000, 2),
            ("a".into(), 10_000, 20_000, 1),
            ("b".into(), 5_000, 15_000, 1),
            ("b".into(), 10_000, 20_000, 1),
        ],
    );
}

#[test]
fn sliding_reduce_and_process_agree_with_the_aggregate() {
    // Slide that does not divide the size: panes of gcd(9 s, 6 s) = 3 s.
    let mut rng = common::XorShift::new(7);
    let input: Vec<(String, i64)> = (0..400)
        .map(|_| (format!("k{}", rng.below(5)), rng.below(60_000) as i64))
        .collect();
    let refs: Vec<(&str, i64)> = input.iter().map(|(k, t)| (k.as_str(), *t)).collect();
    let assigner = || SlidingEventTimeWindows::of(Duration::from_secs(9), Duration::from_secs(6));
    let bound = 60_000; // everything in order enough: nothing is late
    let (aggregated, _, _) = run(&refs, bound, |s, _| {
        s.key_by(|e: &Event| e.0.clone())
            .window(assigner())
            .aggregate_with(Count, label)
    });
    let (reduced, _, _) = run(&refs, bound, |s, _| {
        s.map(|e: Event| (e.0, 1i64))
            .key_by(|e: &Event| e.0.clone())
            .window(assigner())
            .reduce_with(
                |a, b| (a.0, a.1 + b.1),
                |key: &String, w: &TimeWindow, sum: Event| {
                    (key.clone(), w.start, w.end, sum.1 as u64)
                },
            )
    });
    let (processed, _, _) = run(&refs, bound, |s, _| {
        s.key_by(|e: &Event| e.0.clone())
            .window(assigner())
            .process(
                |key: &String,
                 w: &TimeWindow,
                 elements: WindowElements<'_, Event>,
                 out: &mut Collector<'_, Counted>| {
                    assert!(elements.iter().all(|e| e.1 >= w.start && e.1 < w.end));
                    out.collect((key.clone(), w.start, w.end, elements.len() as u64));
                },
            )
    });
    // The reference: every (key, window start) a record falls in.
    let mut expected = std::collections::HashMap::<(String, i64), u64>::new();
    for (key, ts) in &input {
        let last = ts - ts.rem_euclid(6_000);
        let mut start = last;
        while start + 9_000 > *ts {
            *expected.entry((key.clone(), start)).or_default() += 1;
            start -= 6_000;
        }
    }
    let expected: Vec<Counted> = expected
        .into_iter()
        .map(|((k, s), c)| (k, s, s + 9_000, c))
        .collect();
    common::assert_same_multiset(&aggregated, &expected);
    common::assert_same_multiset(&reduced, &expected);
    common::assert_same_multiset(&processed, &expected);
}

#[test]
fn session_windows_merge_when_a_record_bridges_them() {
    let input = &[
        ("a", 1_000),
        ("a", 2_000), // [1 000, 6 000) with a 4 s gap
        ("a", 9_000), // a second session [9 000, 13 000)
        ("a", 5_500), // [5 500, 9 500) bridges both: one session [1 000, 13 000)
        ("b", 1_000),
        ("b", 20_000), // b: two sessions
        ("a", 30_000),
    ];
    let (out, _, _) = run(input, 10_000, |s, _| {
        s.key_by(|e: &Event| e.0.clone())
            .window(EventTimeSessionWindows::with_gap(Duration::from_secs(4)))
            .aggregate_with(Count, label)
    });
    common::assert_same_multiset(
        &out,
        &[
            ("a".into(), 1_000, 13_000, 4),
            ("a".into(), 30_000, 34_000, 1),
            ("b".into(), 1_000, 5_000, 1),
            ("b".into(), 20_000, 24_000, 1),
        ],
    );
}

#[test]
fn a_session_that_grows_after_firing_within_its_lateness_fires_again_at_its_new_end() {
    let input = &[
        ("a", 0),
        ("b", 1_500), // watermark 1 499: "a"'s session [0, 1 000) fires (1), kept for lateness
        ("a", 900),   // not late: "a" grows to [0, 1 900), which has not ended yet
        ("b", 2_500), // watermark 2 499: [0, 1 900) fires again (2)
        ("b", 9_000),
    ];
    let (out, _, _) = run(input, 0, |s, _| {
        s.key_by(|e: &Event| e.0.clone())
            .window(EventTimeSessionWindows::with_gap(Duration::from_secs(1)))
            .allowed_lateness(Duration::from_secs(5))
            .aggregate_with(Count, label)
    });
    let of_a: Vec<Counted> = out.iter().filter(|c| c.0 == "a").cloned().collect();
    assert_eq!(
        of_a,
        vec![("a".into(), 0, 1_000, 1), ("a".into(), 0, 1_900, 2)]
    );
}

#[test]
fn dynamic_gap_sessions_use_each_records_gap() {
    // The gap is the record's own timestamp digit: "a" at 1 000 (gap 1 s) and 2 500 (gap
    // 2.5 s) do not touch: [1 000, 2 000) and [2 500, 5 000).
    let input = &[("a", 1_000), ("a", 2_500), ("a", 4_000)];
    let (out, _, _) = run(input, 10_000, |s, _| {
        s.key_by(|e: &Event| e.0.clone())
            .window(EventTimeSessionWindows::with_dynamic_gap(|e: &Event| {
                Duration::from_millis(e.1 as u64)
            }))
            .aggregate_with(Count, label)
    });
    common::assert_same_multiset(
        &out,
        &[("a".into(), 1_000, 2_000, 1), ("a".into(), 2_500, 8_000, 2)],
    );
}

#[test]
fn count_windows_fire_every_n_records_of_a_key() {
    for backend in BACKENDS {
        let env = env_on(backend);
        let (sink, out) = CollectSink::new();
        env.from_collection((1..=7u64).map(|i| (i % 2, i)).collect::<Vec<_>>())
            .parallelism(1) // one reader: each key's records arrive in order
            .key_by(|e: &(u64, u64)| e.0)
            .count_window(2)
            .reduce(|a, b| (a.0, a.1 + b.1))
            .sink_to(sink, "out");
        env.execute("count windows").expect("the job succeeds");
        // Odd: 1+3, 5+7; even: 2+4 (6 alone never fills its window).
        common::assert_same_multiset(&out.records(), &[(1, 4), (1, 12), (0, 6)]);
    }
}

#[test]
fn window_all_sums_the_whole_stream_per_window() {
    let input = &[("a", 1_000), ("b", 2_000), ("c", 11_000), ("a", 12_000)];
    let (out, _, _) = run(input, 0, |s, _| {
        s.window_all(TumblingEventTimeWindows::of(Duration::from_secs(10)))
            .aggregate_with(Count, |_: &(), w: &TimeWindow, c| {
                ("all".to_string(), w.start, w.end, c)
            })
    });
    common::assert_same_multiset(
        &out,
        &[
            ("all".into(), 0, 10_000, 2),
            ("all".into(), 10_000, 20_000, 2),
        ],
    );
}

#[test]
fn processing_time_windows_count_every_record_once() {
    for backend in BACKENDS {
        let env = env_on(backend);
        let (sink, out) = CollectSink::new();
        env.from_sequence(0, 10_000)
            .key_by(|n: &u64| n % 3)
            .window(TumblingProcessingTimeWindows::of(Duration::from_secs(3600)))
            .reduce(|a, b| a + b)
            .sink_to(sink, "out");
        env.execute("processing time").expect("the job succeeds");
        // Every record is in exactly one window per key (two if an hour boundary passed).
        assert_eq!(
            out.records().iter().sum::<u64>(),
            (0..10_000).sum::<u64>(),
            "{backend}"
        );
    }
}

#[test]
fn event_time_windows_without_timestamps_fail_naming_the_fix() {
    let env = common::env();
    let (sink, _) = CollectSink::new();
    env.from_sequence(0, 10)
        .key_by(|n: &u64| n % 3)
        .window(TumblingEventTimeWindows::of(Duration::from_secs(1)))
        .reduce(|a, b| a + b)
        .name("sums")
        .sink_to(sink, "out");
    let err = env.execute("no timestamps").expect_err("no timestamps");
    let text = err.to_string();
    assert!(text.contains("'sums'"), "{text}");
    assert!(text.contains("WatermarkStrategy"), "{text}");
}

/// RocksDB behind its write-back cache gives the heap's results whatever the cache holds:
/// the default cache (everything fits), no cache, and one of a few kilobytes that evicts
/// (writes panes and sessions back, reads them in again) all the time. Sliding windows and
/// sessions over 3 000 keys, out of order within the bound, with late records dropped.
#[test]
fn rocksdb_windows_agree_with_the_heap_whatever_the_write_back_cache_holds() {
    let input: Vec<Event> = (0..30_000i64)
        .map(|i| {
            let key = (i * 7_919) % 3_000;
            // Time moves 10 ms per record, with a jitter of up to 3 s either way.
            let jitter = (i * 104_729) % 6_000 - 3_000;
            (format!("k{key}"), (i * 10 + jitter).max(0))
        })
        .collect();
    let settings: [(&str, &[(&str, &str)]); 4] = [
        ("heap", &[("state.backend.type", "hashmap")]),
        ("rocksdb", &[("state.backend.type", "rocksdb")]),
        (
            "rocksdb without a write-back cache",
            &[
                ("state.backend.type", "rocksdb"),
                ("state.backend.rocksdb.memory.write-back-ratio", "0"),
            ],
        ),
        (
            "rocksdb with a write-back cache that evicts",
            &[
                ("state.backend.type", "rocksdb"),
                ("state.backend.rocksdb.memory.write-back-ratio", "0.00003"),
            ],
        ),
    ];
    let run = |pairs: &[(&str, &str)]| {
        let env = common::env_with(common::slots(), pairs);
        let source = || {
            env.from_source(
                CollectionSource::new(input.clone()),
                per_record(2_000),
                "events",
            )
            .parallelism(1)
            .key_by(|e: &Event| e.0.clone())
        };
        let (sliding_sink, sliding) = CollectSink::new();
        source()
            .window(SlidingEventTimeWindows::of(
                Duration::from_secs(10),
                Duration::from_secs(2),
            ))
            .aggregate_with(Count, label)
            .sink_to(sliding_sink, "sliding");
        let (session_sink, sessions) = CollectSink::new();
        source()
            .window(EventTimeSessionWindows::with_gap(Duration::from_secs(5)))
            .aggregate_with(Count, label)
            .sink_to(session_sink, "sessions");
        env.execute("windows over many keys")
            .unwrap_or_else(|e| panic!("the job succeeds with {pairs:?}: {e}"));
        (sliding.records(), sessions.records())
    };
    let (heap_sliding, heap_sessions) = run(settings[0].1);
    assert!(heap_sliding.len() > 10_000, "{}", heap_sliding.len());
    assert!(heap_sessions.len() > 3_000, "{}", heap_sessions.len());
    for (name, pairs) in &settings[1..] {
        let (sliding, sessions) = run(pairs);
        assert_eq!(
            sliding.len(),
            heap_sliding.len(),
            "sliding windows on {name}"
        );
        common::assert_same_multiset(&sliding, &heap_sliding);
        assert_eq!(sessions.len(), heap_sessions.len(), "sessions on {name}");
        common::assert_same_multiset(&sessions, &heap_sessions);
    }
}
