//! Two-input constructs end to end: `connect` (co-map, co-flat-map, co-process, keyed
//! co-process with timers), window joins and co-groups (tumbling, sliding, session windows)
//! and interval joins (inclusive, exclusive and negative bounds, late records, a record exactly
//! at the watermark), against hand-computed outputs; then property tests that compare window
//! and interval joins with a nested-loop reference on random keyed, timestamped input, at
//! parallelism 1 and 2.
//!
//! Event time at a join is the minimum of its two inputs' watermarks, and records of the two
//! inputs interleave in any order. The hand-computed cases therefore either let watermarks
//! advance only at the end (a bound larger than the input's time span) or order what matters
//! causally (a gated source holds a record back until the join's output proves where both
//! inputs' watermarks are). The property tests' inputs are out of order
//! by at most the watermark bound, so nothing is late under any interleaving while watermarks
//! still advance, windows fire and interval-join buffers are cleaned up mid-stream.

mod common;
mod join_support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use join_support::*;
use proptest::prelude::*;
use weir_engine::prelude::*;

// ---------------------------------------------------------------------------------------
// connect

#[test]
fn connect_map_and_flat_map_take_each_input_through_its_function() {
    let env = common::env();
    let numbers = env.from_collection((0..100u64).collect::<Vec<_>>());
    let words = env.from_collection(vec!["x".to_string(), "yy".to_string()]);
    let (sink, out) = CollectSink::new();
    numbers
        .connect(words)
        .map(|n: u64| format!("n{n}"), |w: String| format!("w{w}"))
        .sink_to(sink, "mapped");
    let numbers = env.from_collection(vec![3u64, 0]);
    let words = env.from_collection(vec!["ab".to_string()]);
    let (flat_sink, flat_out) = CollectSink::new();
    numbers
        .connect(words)
        .flat_map(
            |n: u64, out: &mut Collector<'_, String>| {
                (0..n).for_each(|i| out.collect(i.to_string()))
            },
            |w: String, out: &mut Collector<'_, String>| {
                w.chars().for_each(|c| out.collect(c.into()))
            },
        )
        .sink_to(flat_sink, "flat");
    env.execute("connect").expect("the job succeeds");

    let mut expected: Vec<String> = (0..100).map(|n| format!("n{n}")).collect();
    expected.extend(["wx".to_string(), "wyy".to_string()]);
    common::assert_same_multiset(&out.records(), &expected);
    common::assert_same_multiset(
        &flat_out.records(),
        &["0", "1", "2", "a", "b"].map(String::from),
    );
}

/// Tags each record with the method that saw it; checks `open` ran first.
#[derive(Clone, Default)]
struct WhichInput {
    opened: bool,
}

impl CoProcessFunction<u64, String, (u8, String)> for WhichInput {
    fn open(&mut self, _: &RuntimeContext) {
        self.opened = true;
    }
    fn process_element1(&mut self, n: u64, ctx: &mut ProcessContext<'_, (u8, String)>) {
        assert!(self.opened);
        ctx.emit((1, n.to_string()));
    }
    fn process_element2(&mut self, w: String, ctx: &mut ProcessContext<'_, (u8, String)>) {
        assert!(self.opened);
        ctx.emit((2, w));
    }
}

#[test]
fn co_process_sees_each_input_in_its_own_method() {
    let env = common::env();
    let (sink, out) = CollectSink::new();
    env.from_collection(vec![7u64, 8])
        .connect(env.from_collection(vec!["seven".to_string()]))
        .process(WhichInput::default())
        .sink_to(sink, "tagged");
    env.execute("co-process").expect("the job succeeds");
    common::assert_same_multiset(
        &out.records(),
        &[(1, "7".into()), (1, "8".into()), (2, "seven".into())],
    );
}

type Order = (u32, i64);
type Payment = (u32, i64, u64);

/// What [`OrderTimeout`] reports: (key, [`TIMEOUT`] or [`SEEN`], timer time, orders seen,
/// payments seen).
type Report = (u32, u8, i64, u64, u64);
const TIMEOUT: u8 = 0;
const SEEN: u8 = 1;
const REPORT_AT: i64 = 500_000;

/// An order (before 100 s) not paid within 1 s of event time times out: the order sets a
/// timer, its payment deletes it (a payment that comes first means the order sets none).
/// Also counts each key's orders and payments in this instance, reported at [`REPORT_AT`],
/// which shows that both inputs of a key reach the same subtask.
#[derive(Clone, Default)]
struct OrderTimeout {
    open_orders: HashMap<u32, i64>,
    paid_first: HashSet<u32>,
    seen: HashMap<u32, (u64, u64)>,
}

impl KeyedCoProcessFunction<u32, Order, Payment, Report> for OrderTimeout {
    fn process_element1(&mut self, order: Order, ctx: &mut KeyedProcessContext<'_, u32, Report>) {
        assert_eq!(*ctx.current_key(), order.0);
        assert_eq!(ctx.timestamp(), Some(order.1));
        if order.1 < 100_000 && !self.paid_first.remove(&order.0) {
            self.open_orders.insert(order.0, order.1);
            ctx.register_event_time_timer(order.1 + 1_000);
        }
        self.seen.entry(order.0).or_default().0 += 1;
        ctx.register_event_time_timer(REPORT_AT);
    }

    fn process_element2(
        &mut self,
        payment: Payment,
        ctx: &mut KeyedProcessContext<'_, u32, Report>,
    ) {
        assert_eq!(*ctx.current_key(), payment.0);
        assert_eq!(ctx.timestamp(), Some(payment.1));
        if payment.1 < 100_000 {
            match self.open_orders.remove(&payment.0) {
                Some(ordered) => ctx.delete_event_time_timer(ordered + 1_000),
                None => {
                    self.paid_first.insert(payment.0);
                }
            }
        }
        self.seen.entry(payment.0).or_default().1 += 1;
        ctx.register_event_time_timer(REPORT_AT);
    }

    fn on_timer(&mut self, timestamp: i64, ctx: &mut KeyedProcessContext<'_, u32, Report>) {
        assert_eq!(ctx.time_domain(), Some(TimeDomain::EventTime));
        assert_eq!(ctx.timestamp(), Some(timestamp));
        let key = *ctx.current_key();
        if timestamp == REPORT_AT {
            let (orders, payments) = self.seen[&key];
            ctx.emit((key, SEEN, timestamp, orders, payments));
        } else {
            self.open_orders.remove(&key);
            ctx.emit((key, TIMEOUT, timestamp, 0, 0));
        }
    }
}

#[test]
fn keyed_co_process_sets_and_deletes_timers_per_key_across_both_inputs() {
    let orders: Vec<Order> = vec![(1, 1_000), (2, 2_000), (3, 3_000)];
    let payments: Vec<Payment> = vec![(1, 1_500, 10), (3, 3_500, 30)];
    // Many more keys, records of both inputs, to spread keys over both subtasks.
    let many_orders: Vec<Order> = (0..400)
        .map(|i| (100 + i % 40, 200_000 + i as i64))
        .collect();
    let many_payments: Vec<Payment> = (0..300)
        .map(|i| (100 + i % 30, 200_000 + i as i64, i as u64))
        .collect();
    for parallelism in common::parallelisms() {
        for keyed_first in [false, true] {
            let env = common::env_with(parallelism, &[]);
            let orders = env.from_source(
                CollectionSource::new([orders.clone(), many_orders.clone()].concat()),
                per_record(AT_END, |o: &Order| o.1),
                "orders",
            );
            let payments = env.from_source(
                CollectionSource::new([payments.clone(), many_payments.clone()].concat()),
                per_record(AT_END, |p: &Payment| p.1),
                "payments",
            );
            let result = if keyed_first {
                orders
                    .key_by(|o: &Order| o.0)
                    .connect(payments.key_by(|p: &Payment| p.0))
                    .process(OrderTimeout::default())
            } else {
                orders
                    .connect(payments)
                    .key_by(|o: &Order| o.0, |p: &Payment| p.0)
                    .process(OrderTimeout::default())
            };
            let (sink, out) = CollectSink::new();
            result.sink_to(sink, "out");
            env.execute("keyed co-process").expect("the job succeeds");

            let mut expected: Vec<Report> = vec![
                (2, TIMEOUT, 3_000, 0, 0),
                (1, SEEN, REPORT_AT, 1, 1),
                (2, SEEN, REPORT_AT, 1, 0),
                (3, SEEN, REPORT_AT, 1, 1),
            ];
            for key in 100..140u32 {
                let payments = if key < 130 { 10 } else { 0 };
                expected.push((key, SEEN, REPORT_AT, 10, payments));
            }
            common::assert_same_multiset(&out.records(), &expected);
        }
    }
}

// ---------------------------------------------------------------------------------------
// window joins and co-groups

const WINDOW_LEFT: &[(&str, i64, u32)] = &[
    ("a", 1_000, 1),
    ("a", 2_000, 2),
    ("b", 3_000, 3),
    ("a", 12_000, 4),
];
const WINDOW_RIGHT: &[(&str, i64, u64)] = &[
    ("a", 1_500, 10),
    ("b", 9_000, 11),
    ("c", 5_000, 12),
    ("a", 11_000, 13),
    ("a", 25_000, 14),
];

#[test]
fn tumbling_window_join_pairs_each_keys_records_per_window() {
    let out = run_pairs(WINDOW_LEFT, WINDOW_RIGHT, |left, right| {
        left.join(right)
            .where_key(|l: &Left| l.0.clone())
            .equal_to(|r: &Right| r.0.clone())
            .window(TumblingEventTimeWindows::of(Duration::from_secs(10)))
            .apply(|l: &Left, r: &Right| (l.2, r.2))
    });
    // [0, 10 s): a 1,2 × 10; b 3 × 11; c has no left records. [10 s, 20 s): a 4 × 13.
    // [20 s, 30 s): a has no left records. Each stamped with the window's end - 1.
    common::assert_same_multiset(
        &out,
        &[
            (1, 10, 9_999),
            (2, 10, 9_999),
            (3, 11, 9_999),
            (4, 13, 19_999),
        ],
    );
}

#[test]
fn sliding_window_join_pairs_records_once_per_shared_window() {
    let out = run_pairs(
        &[("a", 6_000, 1)],
        &[("a", 9_000, 10), ("a", 12_000, 11)],
        |left, right| {
            left.join(right)
                .where_key(|l: &Left| l.0.clone())
                .equal_to(|r: &Right| r.0.clone())
                .window(SlidingEventTimeWindows::of(
                    Duration::from_secs(10),
                    Duration::from_secs(5),
                ))
                .flat_apply(|l: &Left, r: &Right, out: &mut Collector<'_, (u32, u64)>| {
                    out.collect((l.2, r.2))
                })
        },
    );
    // 6 s and 9 s share [0, 10 s) and [5 s, 15 s); 6 s and 12 s share [5 s, 15 s).
    common::assert_same_multiset(&out, &[(1, 10, 9_999), (1, 10, 14_999), (1, 11, 14_999)]);
}

#[test]
fn session_window_join_merges_sessions_over_both_inputs() {
    let out = run_pairs(
        &[("a", 1_000, 1), ("a", 5_000, 2)],
        &[("a", 1_500, 10), ("a", 5_200, 11), ("a", 2_300, 12)],
        |left, right| {
            left.join(right)
                .where_key(|l: &Left| l.0.clone())
                .equal_to(|r: &Right| r.0.clone())
                .window(EventTimeSessionWindows::with_gap(Duration::from_secs(1)))
                .apply(|l: &Left, r: &Right| (l.2, r.2))
        },
    );
    // Sessions of "a" over both inputs: [1 000, 3 300) (1, 10, 12) and [5 000, 6 200) (2, 11).
    common::assert_same_multiset(&out, &[(1, 10, 3_299), (1, 12, 3_299), (2, 11, 6_199)]);
}

#[test]
fn co_group_sees_both_sides_of_every_key_and_window_even_one_sided_ones() {
    type Grouped = (String, usize, usize, i64);
    let env = common::env();
    let left = left_source(&env, lefts(WINDOW_LEFT), AT_END).parallelism(1);
    let right = right_source(&env, rights(WINDOW_RIGHT), AT_END).parallelism(1);
    let (sink, out) = CollectSink::new();
    left.co_group(right)
        .where_key(|l: &Left| l.0.clone())
        .equal_to(|r: &Right| r.0.clone())
        .window(TumblingEventTimeWindows::of(Duration::from_secs(10)))
        .apply(
            |key: &String,
             ls: &[Left],
             rs: &[Right],
             out: &mut Collector<'_, (String, usize, usize)>| {
                assert!(ls.iter().all(|l| &l.0 == key) && rs.iter().all(|r| &r.0 == key));
                out.collect((key.clone(), ls.len(), rs.len()))
            },
        )
        .process(
            |g: (String, usize, usize), ctx: &mut ProcessContext<'_, Grouped>| {
                let timestamp = ctx.timestamp().expect("timestamped");
                ctx.emit((g.0, g.1, g.2, timestamp))
            },
        )
        .sink_to(sink, "groups");
    env.execute("co-group").expect("the job succeeds");
    common::assert_same_multiset(
        &out.records(),
        &[
            ("a".into(), 2, 1, 9_999),
            ("b".into(), 1, 1, 9_999),
            ("c".into(), 0, 1, 9_999),
            ("a".into(), 1, 1, 19_999),
            ("a".into(), 0, 1, 29_999),
        ],
    );
}

#[test]
fn a_window_join_without_timestamps_fails_naming_the_fix() {
    let env = common::env();
    let (sink, _) = CollectSink::new();
    env.from_sequence(0, 10)
        .join(env.from_sequence(0, 10))
        .where_key(|n: &u64| n % 3)
        .equal_to(|n: &u64| n % 3)
        .window(TumblingEventTimeWindows::of(Duration::from_secs(1)))
        .apply(|a: &u64, b: &u64| a + b)
        .sink_to(sink, "out");
    let text = env
        .execute("no timestamps")
        .expect_err("no timestamps")
        .to_string();
    assert!(text.contains("Window Join"), "{text}");
    assert!(text.contains("WatermarkStrategy"), "{text}");
}

// ---------------------------------------------------------------------------------------
// interval joins

const INTERVAL_LEFT: &[(&str, i64, u32)] = &[("a", 10_000, 1), ("b", 10_000, 2)];
const INTERVAL_RIGHT: &[(&str, i64, u64)] = &[
    ("a", 9_000, 10),
    ("a", 10_000, 11),
    ("a", 11_000, 12),
    ("a", 12_000, 13),
    ("a", 13_000, 14),
    ("b", 12_000, 15),
    ("c", 10_000, 16),
];

/// The interval join of the two inputs over `[lower, upper]`, with the bounds made exclusive
/// as `exclusive` says; checks the context's timestamps on every pair.
fn interval(
    lower: i64,
    upper: i64,
    exclusive: (bool, bool),
) -> impl FnOnce(DataStream<Left>, DataStream<Right>) -> DataStream<(u32, u64)> {
    move |left, right| {
        let mut joined = left
            .key_by(|l: &Left| l.0.clone())
            .interval_join(right.key_by(|r: &Right| r.0.clone()))
            .between(lower, upper);
        if exclusive.0 {
            joined = joined.lower_bound_exclusive();
        }
        if exclusive.1 {
            joined = joined.upper_bound_exclusive();
        }
        joined.process(
            |l: &Left, r: &Right, ctx: &mut ProcessJoinContext<'_, (u32, u64)>| {
                assert_eq!((ctx.left_timestamp(), ctx.right_timestamp()), (l.1, r.1));
                assert_eq!(ctx.timestamp(), l.1.max(r.1));
                ctx.emit((l.2, r.2))
            },
        )
    }
}

#[test]
fn interval_join_bounds_are_inclusive_unless_made_exclusive() {
    let run = |lower, upper, exclusive| {
        run_pairs(
            INTERVAL_LEFT,
            INTERVAL_RIGHT,
            interval(lower, upper, exclusive),
        )
    };
    // a at 10 s joins right records of "a" in [10 s, 12 s]; b at 10 s those of "b".
    common::assert_same_multiset(
        &run(0, 2_000, (false, false)),
        &[
            (1, 11, 10_000),
            (1, 12, 11_000),
            (1, 13, 12_000),
            (2, 15, 12_000),
        ],
    );
    common::assert_same_multiset(
        &run(0, 2_000, (true, false)),
        &[(1, 12, 11_000), (1, 13, 12_000), (2, 15, 12_000)],
    );
    common::assert_same_multiset(
        &run(0, 2_000, (false, true)),
        &[(1, 11, 10_000), (1, 12, 11_000)],
    );
    common::assert_same_multiset(&run(0, 2_000, (true, true)), &[(1, 12, 11_000)]);
    // A negative lower bound reaches back: [9 s, 11 s]; the output carries the later time.
    common::assert_same_multiset(
        &run(-1_000, 1_000, (false, false)),
        &[(1, 10, 10_000), (1, 11, 10_000), (1, 12, 11_000)],
    );
    // An empty interval ([1 s, 1 s) after exclusion) joins nothing.
    assert!(run(1_000, 1_000, (false, true)).is_empty());
}

/// Runs the late-record scenario: returns the joined pairs and the late side output (when
/// `side_output`).
fn run_with_a_late_record(side_output: bool) -> (Vec<Pair>, Vec<Left>) {
    let env = common::env();
    let (sink, out) = CollectSink::<Pair>::new();
    let (late_sink, late_out) = CollectSink::<Left>::new();
    // The late left record (3 s) waits until the join has emitted both pairs of the right
    // records at 10.5 s and 10.6 s: the second one came after the right input's watermark
    // 10 499, and the late record travels behind the left input's watermark 9 999, so the
    // join's watermark is at least 9 999 when it arrives, whatever the interleaving.
    let joined = out.clone();
    let left_input = lefts(&[
        ("a", 1_000, 1),
        ("a", 10_000, 2),
        ("a", 3_000, 3), // late
        ("a", 20_000, 4),
    ]);
    let left = env
        .from_source(
            GatedSource {
                elements: Arc::new(left_input),
                gate_at: 2,
                open: Arc::new(move || joined.len() >= 2),
            },
            per_record(0, |e: &Left| e.1),
            "left",
        )
        .parallelism(1);
    let right = right_source(
        &env,
        rights(&[("a", 3_500, 10), ("a", 10_500, 11), ("a", 10_600, 12)]),
        0,
    )
    .parallelism(1);
    let late = OutputTag::<Left>::new("late left");
    let mut join = left
        .key_by(|l: &Left| l.0.clone())
        .interval_join(right.key_by(|r: &Right| r.0.clone()))
        .between(0, 1_000);
    if side_output {
        join = join.side_output_left_late_data(&late);
    }
    let pairs = join.process(
        |l: &Left, r: &Right, ctx: &mut ProcessJoinContext<'_, (u32, u64)>| ctx.emit((l.2, r.2)),
    );
    pairs.get_side_output(&late).sink_to(late_sink, "late");
    stamped(pairs).sink_to(sink, "pairs");
    env.execute("late interval join").expect("the job succeeds");
    (out.records(), late_out.records())
}

#[test]
fn interval_join_drops_records_below_the_watermark_or_sends_them_to_the_side_output() {
    for side_output in [true, false] {
        let (out, late) = common::within(
            Duration::from_secs(120),
            "interval join with a late record",
            move || run_with_a_late_record(side_output),
        );
        // Had the record at 3 s been joined, it would pair with the right record at 3.5 s.
        common::assert_same_multiset(&out, &[(2, 11, 10_500), (2, 12, 10_600)]);
        let expected_late = if side_output {
            lefts(&[("a", 3_000, 3)])
        } else {
            Vec::new()
        };
        assert_eq!(late, expected_late);
    }
}

/// A left record at 1 000 with `between(0, 200)` must stay buffered while the watermark is
/// 1 200: a right record at exactly 1 200 is not late (only records below the watermark are)
/// and joins it. (Flink's operator fires its cleanup timer at `t + upper` = 1 200 and would
/// have dropped the left record; this one waits for 1 201.)
fn run_with_a_record_at_the_watermark() -> Vec<Pair> {
    let env = common::env();
    let (sink, out) = CollectSink::<Pair>::new();
    let joined = out.clone();
    let left = left_source(
        &env,
        lefts(&[("a", 1_000, 1), ("s", 5_000, 2), ("s", 5_050, 3)]),
        0,
    )
    .parallelism(1);
    // The right input's watermark trails by 3 900 ms: 1 200 after ("s", 5 100). The record at
    // 1 200 waits until both "s" pairs are out: the second left "s" record came after the left
    // input's watermark 4 999, so the join's watermark becomes exactly 1 200 when the right
    // watermark behind ("s", 5 100) arrives — before the record at 1 200, on the same channel.
    let right = env
        .from_source(
            GatedSource {
                elements: Arc::new(rights(&[("s", 5_100, 10), ("a", 1_200, 11)])),
                gate_at: 1,
                open: Arc::new(move || joined.len() >= 2),
            },
            per_record(3_899, |e: &Right| e.1),
            "right",
        )
        .parallelism(1);
    let pairs = left
        .key_by(|l: &Left| l.0.clone())
        .interval_join(right.key_by(|r: &Right| r.0.clone()))
        .between(0, 200)
        .process(
            |l: &Left, r: &Right, ctx: &mut ProcessJoinContext<'_, (u32, u64)>| {
                ctx.emit((l.2, r.2))
            },
        );
    stamped(pairs).sink_to(sink, "pairs");
    env.execute("interval join at the watermark")
        .expect("the job succeeds");
    out.records()
}

#[test]
fn a_record_at_the_watermark_still_finds_its_partner() {
    let out = common::within(
        Duration::from_secs(120),
        "interval join with a record at the watermark",
        run_with_a_record_at_the_watermark,
    );
    common::assert_same_multiset(&out, &[(2, 10, 5_100), (3, 10, 5_100), (1, 11, 1_200)]);
}

#[test]
fn an_interval_join_without_timestamps_fails_naming_the_fix() {
    let env = common::env();
    let (sink, _) = CollectSink::new();
    env.from_sequence(0, 10)
        .key_by(|n: &u64| n % 3)
        .interval_join(env.from_sequence(0, 10).key_by(|n: &u64| n % 3))
        .between(0, 10)
        .process(|a: &u64, b: &u64, ctx: &mut ProcessJoinContext<'_, u64>| ctx.emit(a + b))
        .sink_to(sink, "out");
    let text = env
        .execute("no timestamps")
        .expect_err("no timestamps")
        .to_string();
    assert!(text.contains("'Interval Join'"), "{text}");
    assert!(text.contains("WatermarkStrategy"), "{text}");
}

#[test]
fn an_interval_with_lower_above_upper_is_refused() {
    let env = common::env();
    let (sink, _) = CollectSink::new();
    env.from_sequence(0, 10)
        .key_by(|n: &u64| n % 3)
        .interval_join(env.from_sequence(0, 10).key_by(|n: &u64| n % 3))
        .between(5, -5)
        .process(|a: &u64, b: &u64, ctx: &mut ProcessJoinContext<'_, u64>| ctx.emit(a + b))
        .sink_to(sink, "out");
    let text = env.execute("bad bounds").expect_err("refused").to_string();
    assert!(text.contains("between(5, -5)"), "{text}");
}

// ---------------------------------------------------------------------------------------
// property tests against a nested loop (inputs and runner in `join_support`)

/// Window kinds the property test draws from.
#[derive(Clone, Copy, Debug)]
enum Windows {
    Tumbling(i64),
    Sliding(i64, i64),
    Session(i64),
}

fn windows() -> impl Strategy<Value = Windows> {
    prop_oneof![
        (1i64..=20).prop_map(|size| Windows::Tumbling(size * 250)),
        (1i64..=20, 1i64..=20).prop_map(|(a, b)| Windows::Sliding(a.max(b) * 250, a.min(b) * 250)),
        (1i64..=8).prop_map(|gap| Windows::Session(gap * 250)),
    ]
}

/// The (start, end) of every window holding `t` (tumbling, sliding).
fn aligned_windows(t: i64, size: i64, slide: i64) -> Vec<(i64, i64)> {
    let mut start = t - t.rem_euclid(slide);
    let mut all = Vec::new();
    while start + size > t {
        all.push((start, start + size));
        start -= slide;
    }
    all
}

/// Nested-loop window join: every pair with equal keys, once per window holding both, stamped
/// with the window's end - 1.
fn window_join_reference(windows: Windows, left: &[PLeft], right: &[PRight]) -> Vec<Pair> {
    let mut out = Vec::new();
    match windows {
        Windows::Tumbling(size) | Windows::Sliding(size, _) => {
            let slide = match windows {
                Windows::Sliding(_, slide) => slide,
                _ => size,
            };
            for l in left {
                for r in right.iter().filter(|r| r.0 == l.0) {
                    for (start, end) in aligned_windows(l.1, size, slide) {
                        if start <= r.1 && r.1 < end {
                            out.push((l.2, r.2, end - 1));
                        }
                    }
                }
            }
        }
        Windows::Session(gap) => {
            // Per key, the sessions over both inputs' timestamps: sorted, split where the next
            // timestamp is past the current session's end (sessions that touch merge, as
            // Flink's `TimeWindow::intersects` has it).
            let mut times: HashMap<u8, Vec<i64>> = HashMap::new();
            left.iter()
                .for_each(|l| times.entry(l.0).or_default().push(l.1));
            right
                .iter()
                .for_each(|r| times.entry(r.0).or_default().push(r.1));
            let mut sessions: HashMap<u8, Vec<(i64, i64)>> = HashMap::new();
            for (key, mut ts) in times {
                ts.sort_unstable();
                let list = sessions.entry(key).or_default();
                for t in ts {
                    match list.last_mut() {
                        Some(last) if t <= last.1 => last.1 = last.1.max(t + gap),
                        _ => list.push((t, t + gap)),
                    }
                }
            }
            let session_end = |key: u8, t: i64| {
                sessions[&key]
                    .iter()
                    .find(|(start, end)| *start <= t && t < *end)
                    .expect("every timestamp is in a session")
                    .1
            };
            for l in left {
                for r in right.iter().filter(|r| r.0 == l.0) {
                    let end = session_end(l.0, l.1);
                    if end == session_end(r.0, r.1) {
                        out.push((l.2, r.2, end - 1));
                    }
                }
            }
        }
    }
    out
}

/// Nested-loop interval join: every pair with equal keys whose right time is in the interval
/// around the left time, stamped with the later of the two.
fn interval_join_reference(
    (lower, upper): (i64, i64),
    (lower_exclusive, upper_exclusive): (bool, bool),
    left: &[PLeft],
    right: &[PRight],
) -> Vec<Pair> {
    let mut out = Vec::new();
    for l in left {
        for r in right.iter().filter(|r| r.0 == l.0) {
            let d = r.1 - l.1;
            let above = if lower_exclusive {
                d > lower
            } else {
                d >= lower
            };
            let below = if upper_exclusive {
                d < upper
            } else {
                d <= upper
            };
            if above && below {
                out.push((l.2, r.2, l.1.max(r.1)));
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn window_joins_match_a_nested_loop(
        left in keyed_input(60),
        right in keyed_input(60),
        windows in windows(),
        right_first in any::<bool>(),
        coarse in any::<bool>(),
    ) {
        // Coarse: records meet exactly at session ends (touching sessions merge).
        let (left, right) = with_ids(&left, &right, coarse);
        let expected = window_join_reference(windows, &left, &right);
        for parallelism in common::parallelisms() {
            // A window's last millisecond is late once the watermark reaches it: records stay
            // above the watermark.
            let lag = DISORDER;
            let out = run_property(parallelism, right_first, lag, &left, &right, |l, r| {
                let joined = l
                    .join(r)
                    .where_key(|l: &PLeft| l.0)
                    .equal_to(|r: &PRight| r.0);
                let pair = |l: &PLeft, r: &PRight| (l.2, r.2);
                let ms = |ms: i64| Duration::from_millis(ms as u64);
                match windows {
                    Windows::Tumbling(size) => joined
                        .window(TumblingEventTimeWindows::of(ms(size)))
                        .apply(pair),
                    Windows::Sliding(size, slide) => joined
                        .window(SlidingEventTimeWindows::of(ms(size), ms(slide)))
                        .apply(pair),
                    Windows::Session(gap) => joined
                        .window(EventTimeSessionWindows::with_gap(ms(gap)))
                        .apply(pair),
                }
            });
            common::assert_same_multiset(&out, &expected);
        }
    }

    #[test]
    fn interval_joins_match_a_nested_loop(
        left in keyed_input(80),
        right in keyed_input(80),
        lower in -1_500i64..=1_500,
        width in 0i64..=2_000,
        exclusive in (any::<bool>(), any::<bool>()),
        right_first in any::<bool>(),
        coarse in any::<bool>(),
    ) {
        // Coarse: records land exactly on the watermark and on the interval's bounds.
        let (left, right) = with_ids(&left, &right, coarse);
        let bounds = (on_grid(coarse, lower), on_grid(coarse, lower) + on_grid(coarse, width));
        let expected = interval_join_reference(bounds, exclusive, &left, &right);
        for parallelism in common::parallelisms() {
            // A record may sit exactly at the watermark: not late (Flink's `t < watermark`).
            let lag = DISORDER - 1;
            let out = run_property(parallelism, right_first, lag, &left, &right, |l, r| {
                let mut joined = l
                    .key_by(|l: &PLeft| l.0)
                    .interval_join(r.key_by(|r: &PRight| r.0))
                    .between(bounds.0, bounds.1);
                if exclusive.0 {
                    joined = joined.lower_bound_exclusive();
                }
                if exclusive.1 {
                    joined = joined.upper_bound_exclusive();
                }
                joined.process(
                    |l: &PLeft, r: &PRight, ctx: &mut ProcessJoinContext<'_, (u32, u64)>| {
                        ctx.emit((l.2, r.2))
                    },
                )
            });
            common::assert_same_multiset(&out, &expected);
        }
    }
}
