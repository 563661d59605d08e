//! Two-phase (local-global) window aggregation against one-phase: on out-of-order input with
//! late records, tumbling, sliding and session event-time windows give the same results, drop
//! the same records, on both state backends, at every group limit (`execution.batch-size`) — and the
//! local phase really runs (`table.optimizer.agg-phase-strategy: TWO_PHASE`) or does not
//! (`ONE_PHASE`); `AUTO` runs it only where the exchange may cross shards.
//!
//! One source subtask with a watermark after every record: every channel carries records and
//! watermarks in one known order, so which records are late is decided the same way in both
//! runs.
//!
//! Processing-time windows depend on arrival, so there the tests check what cannot move: every
//! record counted once, one result per key and window, partials handed on at the buffer
//! timeout, and one phase where there is no buffer timeout.

mod common;

use std::time::Duration;

use proptest::prelude::*;
use weir_engine::prelude::*;
use weir_engine::time::{WatermarkGenerator, WatermarkOutput};

/// (key, timestamp, value).
type Event = (u8, i64, i64);
/// (key, window start, sum, count).
type Summed = (u8, i64, i64, u64);

#[derive(Clone)]
struct PerRecord {
    max: i64,
    bound: i64,
}

impl WatermarkGenerator<Event> for PerRecord {
    fn on_event(&mut self, _: &Event, timestamp: i64, output: &mut WatermarkOutput) {
        self.max = self.max.max(timestamp);
        output.emit_watermark(self.max - self.bound - 1);
    }
    fn on_periodic_emit(&mut self, _: &mut WatermarkOutput) {}
}

#[derive(Clone)]
struct SumCount;

impl AggregateFunction<Event, (i64, u64), (i64, u64)> for SumCount {
    fn create_accumulator(&self) -> (i64, u64) {
        (0, 0)
    }
    fn add(&self, e: Event, acc: &mut (i64, u64)) {
        acc.0 += e.2;
        acc.1 += 1;
    }
    fn get_result(&self, acc: &(i64, u64)) -> (i64, u64) {
        *acc
    }
    fn merge(&self, into: &mut (i64, u64), other: &(i64, u64)) {
        into.0 += other.0;
        into.1 += other.1;
    }
}

struct Run {
    out: Vec<Summed>,
    dropped: u64,
    local_phase: bool,
}

#[derive(Clone, Copy, Debug)]
enum Windows {
    Sliding { size_ms: u64, slide_ms: u64 },
    Session { gap_ms: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Setup {
    windows: Windows,
    bound_ms: i64,
    batch_size: usize,
}

fn label(key: &u8, w: &TimeWindow, (sum, count): (i64, u64)) -> Summed {
    (*key, w.start, sum, count)
}

fn run(input: &[Event], setup: Setup, strategy: &str, backend: &str) -> Run {
    let env = common::env_with(
        common::slots(),
        &[
            ("table.optimizer.agg-phase-strategy", strategy),
            ("state.backend.type", backend),
            ("execution.batch-size", &setup.batch_size.to_string()),
        ],
    );
    let bound = setup.bound_ms;
    let watermarks = WatermarkStrategy::for_generator(move || PerRecord {
        max: i64::MIN + bound + 1,
        bound,
    })
    .with_timestamp_assigner(|e: &Event, _| e.1);
    let (sink, out) = CollectSink::new();
    let keyed = env
        .from_source(CollectionSource::new(input.to_vec()), watermarks, "events")
        .parallelism(1)
        .key_by(|e: &Event| e.0);
    let sums = match setup.windows {
        Windows::Sliding { size_ms, slide_ms } => keyed
            .window(SlidingEventTimeWindows::of(
                Duration::from_millis(size_ms),
                Duration::from_millis(slide_ms),
            ))
            .aggregate_with(SumCount, label),
        Windows::Session { gap_ms } => keyed
            .window(EventTimeSessionWindows::with_gap(Duration::from_millis(
                gap_ms,
            )))
            .aggregate_with(SumCount, label),
    };
    sums.name("sums").sink_to(sink, "out");
    let result = env
        .execute("two-phase")
        .unwrap_or_else(|e| panic!("the job succeeds ({strategy}, {backend}): {e}"));
    let local_phase = result
        .operators
        .iter()
        .any(|op| op.name.starts_with("Local Window"));
    Run {
        out: out.records(),
        dropped: result.late_records_dropped("sums"),
        local_phase,
    }
}

fn assert_same(input: &[Event], setup: Setup, backend: &str) -> Result<(), TestCaseError> {
    let one = run(input, setup, "ONE_PHASE", backend);
    let two = run(input, setup, "TWO_PHASE", backend);
    prop_assert!(!one.local_phase, "ONE_PHASE runs no local phase");
    prop_assert!(two.local_phase, "TWO_PHASE pre-aggregates");
    let mut expected = one.out;
    let mut actual = two.out;
    expected.sort_unstable();
    actual.sort_unstable();
    prop_assert_eq!(actual, expected, "{:?} on {}", setup, backend);
    prop_assert_eq!(two.dropped, one.dropped, "late records dropped");
    Ok(())
}

fn setup() -> impl Strategy<Value = Setup> {
    let windows = prop_oneof![
        (1u64..6, 1u64..4).prop_map(|(size_s, parts)| Windows::Sliding {
            size_ms: size_s * 1_000,
            slide_ms: size_s * 1_000 / parts,
        }),
        (1u64..2_000).prop_map(|gap_ms| Windows::Session { gap_ms }),
    ];
    (windows, 0i64..3_000, 1usize..40).prop_map(|(windows, bound_ms, batch_size)| Setup {
        windows,
        bound_ms,
        batch_size,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Timestamps anywhere in 20 s, watermarks trailing the highest by at most 3 s: many
    /// records are late, many windows overlap.
    #[test]
    fn two_phase_gives_what_one_phase_gives(
        input in proptest::collection::vec((0u8..6, 0i64..20_000, -100i64..100), 1..300),
        setup in setup(),
    ) {
        assert_same(&input, setup, "hashmap")?;
    }
}

#[test]
fn two_phase_gives_what_one_phase_gives_on_rocksdb() {
    let input: Vec<Event> = (0..2_000i64)
        .map(|i| ((i % 7) as u8, (i * 997) % 15_000, i % 11 - 5))
        .collect();
    for windows in [
        Windows::Sliding {
            size_ms: 4_000,
            slide_ms: 1_000,
        },
        Windows::Session { gap_ms: 300 },
    ] {
        let setup = Setup {
            windows,
            bound_ms: 1_500,
            batch_size: 16,
        };
        assert_same(&input, setup, "rocksdb").unwrap();
        let run = run(&input, setup, "TWO_PHASE", "rocksdb");
        assert!(run.dropped > 0, "the input has late records ({windows:?})");
        assert!(!run.out.is_empty());
    }
}

/// Whether a tumbling count over `slots` slots (source and window at the default parallelism)
/// runs a local phase under `AUTO`.
fn auto_runs_a_local_phase(slots: usize) -> bool {
    let env = common::env_with(slots, &[]);
    let (sink, out) = CollectSink::new();
    let input: Vec<Event> = (0..1_000i64).map(|i| ((i % 3) as u8, i, 1)).collect();
    env.from_source(
        CollectionSource::new(input),
        WatermarkStrategy::for_monotonous_timestamps().with_timestamp_assigner(|e: &Event, _| e.1),
        "events",
    )
    .key_by(|e: &Event| e.0)
    .window(TumblingEventTimeWindows::of(Duration::from_millis(100)))
    .aggregate_with(SumCount, label)
    .sink_to(sink, "out");
    let result = env.execute("auto").unwrap();
    let counted: u64 = out.records().iter().map(|r| r.3).sum();
    assert_eq!(counted, 1_000, "every record counted once");
    result
        .operators
        .iter()
        .any(|op| op.name.starts_with("Local Window"))
}

#[test]
fn auto_pre_aggregates_only_where_the_exchange_may_cross_shards() {
    assert!(
        !auto_runs_a_local_phase(1),
        "one subtask on each side: the exchange is chained, a local phase only adds work"
    );
    if common::slots() > 1 {
        assert!(auto_runs_a_local_phase(2), "two subtasks: pre-aggregate");
    }
}

#[test]
fn a_late_data_side_output_keeps_one_phase() {
    let env = common::env_with(
        common::slots(),
        &[("table.optimizer.agg-phase-strategy", "TWO_PHASE")],
    );
    let late = OutputTag::<Event>::new("late");
    let (sink, _) = CollectSink::new();
    let windowed = env
        .from_source(
            CollectionSource::new(vec![(1u8, 5i64, 1i64)]),
            WatermarkStrategy::for_monotonous_timestamps()
                .with_timestamp_assigner(|e: &Event, _| e.1),
            "events",
        )
        .key_by(|e: &Event| e.0)
        .window(TumblingEventTimeWindows::of(Duration::from_secs(1)))
        .side_output_late_data(&late)
        .aggregate_with(SumCount, label);
    windowed.sink_to(sink, "out");
    let result = env.execute("one-phase").unwrap();
    assert!(
        !result
            .operators
            .iter()
            .any(|op| op.name.starts_with("Local Window")),
        "late records must reach the side output as records, not partials"
    );
}

/// A processing-time tumbling `SumCount` per key, in `strategy`'s plan: the outputs, and
/// whether a local phase ran. `pace` holds each record that long before the key_by (a
/// stream that keeps arriving while windows close).
fn processing_time_run(
    input: &[Event],
    window: Duration,
    pace: Duration,
    strategy: &str,
    extra: &[(&str, &str)],
) -> (Vec<Summed>, bool) {
    let mut settings = vec![("table.optimizer.agg-phase-strategy", strategy)];
    settings.extend_from_slice(extra);
    let env = common::env_with(common::slots(), &settings);
    let (sink, out) = CollectSink::new();
    env.from_source(
        CollectionSource::new(input.to_vec()),
        WatermarkStrategy::no_watermarks(),
        "events",
    )
    .parallelism(1)
    .map(move |e: Event| {
        if !pace.is_zero() {
            std::thread::sleep(pace);
        }
        e
    })
    .key_by(|e: &Event| e.0)
    .window(TumblingProcessingTimeWindows::of(window))
    .aggregate_with(SumCount, label)
    .sink_to(sink, "out");
    let result = env
        .execute("processing-time two-phase")
        .unwrap_or_else(|e| panic!("the job succeeds ({strategy}): {e}"));
    let local_phase = result
        .operators
        .iter()
        .any(|op| op.name.starts_with("Local Window"));
    (out.records(), local_phase)
}

/// Per key: (sum, count) over all its windows.
fn totals(windows: &[Summed]) -> std::collections::BTreeMap<u8, (i64, u64)> {
    let mut totals = std::collections::BTreeMap::new();
    for &(key, _, sum, count) in windows {
        let total = totals.entry(key).or_insert((0, 0));
        total.0 += sum;
        total.1 += count;
    }
    totals
}

#[test]
fn processing_time_windows_pre_aggregate_and_count_every_record_once() {
    let input: Vec<Event> = (0..5_000i64)
        .map(|i| ((i % 7) as u8, 0, i % 13 - 6))
        .collect();
    let expected = totals(&input.iter().map(|e| (e.0, 0, e.2, 1)).collect::<Vec<_>>());
    for strategy in ["ONE_PHASE", "TWO_PHASE"] {
        let (out, local_phase) = processing_time_run(
            &input,
            Duration::from_secs(3_600),
            Duration::ZERO,
            strategy,
            &[],
        );
        assert_eq!(local_phase, strategy == "TWO_PHASE", "{strategy}");
        assert_eq!(
            totals(&out),
            expected,
            "{strategy}: every record in one window, once"
        );
        if strategy == "TWO_PHASE" {
            let windows = common::multiset(out.iter().map(|r| (r.0, r.1)));
            assert!(
                windows.values().all(|&n| n == 1),
                "one result per key and window, however many partials: {out:?}"
            );
        }
    }
}

/// The local phase holds a partial no longer than the buffer timeout (1 ms): one key's stream
/// arriving over ~800 ms falls into several 100 ms windows — held until the end of input, or
/// until the group limit, it would all fall into one.
#[test]
fn processing_time_partials_go_on_at_the_buffer_timeout() {
    let input: Vec<Event> = (0..400i64).map(|i| (1, 0, i)).collect();
    let (out, local_phase) = processing_time_run(
        &input,
        Duration::from_millis(100),
        Duration::from_millis(2),
        "TWO_PHASE",
        &[("execution.batch-size", "1")],
    );
    assert!(local_phase);
    assert_eq!(
        totals(&out).get(&1),
        Some(&((0..400).sum::<i64>(), 400)),
        "every record counted once"
    );
    assert!(
        out.len() >= 3,
        "records spread over ~8 windows of processing time land in several: {out:?}"
    );
}

/// With no buffer timeout (a send per record) nothing would bound how long a processing-time
/// local phase holds a partial, so the plan keeps one phase even when two are asked for.
#[test]
fn processing_time_windows_keep_one_phase_without_a_buffer_timeout() {
    let input: Vec<Event> = (0..200i64).map(|i| ((i % 3) as u8, 0, i)).collect();
    let (out, local_phase) = processing_time_run(
        &input,
        Duration::from_secs(3_600),
        Duration::ZERO,
        "TWO_PHASE",
        &[("execution.buffer-timeout", "0")],
    );
    assert!(!local_phase, "no local phase without a buffer timeout");
    assert_eq!(
        totals(&out),
        totals(&input.iter().map(|e| (e.0, 0, e.2, 1)).collect::<Vec<_>>())
    );
}
