//! The Nexmark queries as engine jobs against the hand-written baselines: on the same
//! generated events, every query's output must have the baseline's record count and
//! order-independent checksum (q4: the same final value per category; q12: the same bids per
//! bidder), at parallelism 1 and 2 (never more slots than cores), the stateful queries also
//! with `state.backend.type: rocksdb`, and with out-of-order events within the watermark bound.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;

use weir_bench::nexmark::baseline;
use weir_bench::nexmark::queries;
use weir_bench::nexmark::{
    checksum_of, q12_totals, q4_final, BaselineResult, Event, NexmarkConfig, NexmarkGenerator,
    StableHash,
};
use weir_engine::prelude::*;
use weir_engine::Record;

/// Events for the stateless queries.
const STATELESS_EVENTS: u64 = 100_000;
/// Events for the stateful ones: at [`RATE`], 60 s of event time (six 10 s windows).
const STATEFUL_EVENTS: u64 = 60_000;
/// Events per second of event time: low, so that few events span many windows.
const RATE: u64 = 1_000;

/// A query builder.
type Query<T> = fn(DataStream<Event>) -> DataStream<T>;

/// Slots the tests run on: two where the machine has them, never more than cores.
fn slots() -> usize {
    weir_engine::runtime::available_cores().len().min(2)
}

/// The parallelisms to test: 1 and, where there are two cores, 2.
fn parallelisms() -> Vec<usize> {
    (1..=slots()).collect()
}

fn generator(config: NexmarkConfig) -> NexmarkGenerator {
    NexmarkGenerator::new(config).expect("valid generator settings")
}

/// The generator the tests use: in order, [`RATE`] events per second of event time.
fn slow_generator() -> NexmarkGenerator {
    generator(NexmarkConfig {
        first_event_rate: RATE,
        ..NexmarkConfig::default()
    })
}

/// Runs `query` over events `0..events` of `generator` at `parallelism` on `backend` and
/// returns its output.
fn run<T: Record>(
    generator: &NexmarkGenerator,
    events: u64,
    parallelism: usize,
    backend: &str,
    query: Query<T>,
) -> Vec<T> {
    let mut config = Configuration::default();
    for (key, value) in [
        ("taskmanager.numberOfTaskSlots", parallelism.to_string()),
        ("parallelism.default", parallelism.to_string()),
        ("state.backend.type", backend.to_string()),
    ] {
        config.set(key, value).expect("a valid setting");
    }
    let env = StreamEnvironment::new(config).expect("environment");
    let (sink, out) = CollectSink::new();
    query(queries::source(&env, generator.clone(), events, None)).sink_to(sink, "out");
    env.execute("nexmark query")
        .unwrap_or_else(|e| panic!("the job fails at parallelism {parallelism} on {backend}: {e}"));
    out.records()
}

/// On a checksum mismatch: the records missing from `actual` and those in excess (up to 10).
fn difference<T: Hash + Eq + Debug + Clone>(actual: &[T], expected: &[T]) -> String {
    let mut counts: HashMap<&T, i64> = HashMap::new();
    for record in expected {
        *counts.entry(record).or_default() += 1;
    }
    for record in actual {
        *counts.entry(record).or_default() -= 1;
    }
    let missing: Vec<_> = counts.iter().filter(|(_, &n)| n > 0).take(10).collect();
    let excess: Vec<_> = counts.iter().filter(|(_, &n)| n < 0).take(10).collect();
    format!("missing {missing:?}; in excess {excess:?}")
}

/// The runs of a query: every parallelism on the heap backend and, for a stateful query,
/// RocksDB at the largest.
fn runs(stateful: bool) -> Vec<(usize, &'static str)> {
    let mut runs: Vec<(usize, &str)> = parallelisms().into_iter().map(|p| (p, "hashmap")).collect();
    if stateful {
        runs.push((slots(), "rocksdb"));
    }
    runs
}

/// Runs `query` as every run of [`runs`] and checks each output against the baseline: the
/// records of `reference` (the baseline's core) and the result of `runner` (its runner, which
/// must agree with them).
#[allow(clippy::too_many_arguments)]
fn check<T>(
    name: &str,
    generator: &NexmarkGenerator,
    events: u64,
    stateful: bool,
    query: Query<T>,
    reference: impl FnOnce(&NexmarkGenerator, u64) -> Vec<T>,
    runner: fn(&NexmarkGenerator, u64) -> BaselineResult,
) where
    T: Record + StableHash + Hash + Eq + Debug,
{
    let expected = reference(generator, events);
    let expected_result = checksum_of(&expected).result();
    assert_eq!(
        expected_result,
        runner(generator, events),
        "{name}: baseline"
    );
    assert!(
        expected_result.results > 0,
        "{name}: the baseline has output"
    );
    for (parallelism, backend) in runs(stateful) {
        let actual = run(generator, events, parallelism, backend, query);
        let result = checksum_of(&actual).result();
        assert!(
            result == expected_result,
            "{name} at parallelism {parallelism} on {backend}: {result:?}, baseline {expected_result:?}; {}",
            difference(&actual, &expected)
        );
    }
}

/// The records a baseline core emits over events `0..events`.
macro_rules! reference {
    ($query:path) => {
        |generator: &NexmarkGenerator, events: u64| {
            let mut out = Vec::new();
            $query(generator.events(0..events), |record| out.push(record));
            out
        }
    };
}

#[test]
fn q0_passes_every_bid() {
    let generator = generator(NexmarkConfig::default());
    check(
        "q0",
        &generator,
        STATELESS_EVENTS,
        false,
        queries::q0,
        reference!(baseline::q0),
        baseline::run_q0,
    );
}

#[test]
fn q1_converts_every_bid() {
    let generator = generator(NexmarkConfig::default());
    check(
        "q1",
        &generator,
        STATELESS_EVENTS,
        false,
        queries::q1,
        reference!(baseline::q1),
        baseline::run_q1,
    );
}

#[test]
fn q2_selects_the_bids_of_every_123rd_auction() {
    let generator = generator(NexmarkConfig::default());
    check(
        "q2",
        &generator,
        STATELESS_EVENTS,
        false,
        queries::q2,
        reference!(baseline::q2),
        baseline::run_q2,
    );
}

#[test]
fn q3_joins_local_sellers_with_their_auctions() {
    check(
        "q3",
        &slow_generator(),
        STATEFUL_EVENTS,
        true,
        queries::q3,
        reference!(baseline::q3),
        baseline::run_q3,
    );
}

/// q4's updates: their number must be the baseline's (one per closed auction with a winning
/// bid) and their final value per category the baseline's.
fn check_q4(generator: &NexmarkGenerator, events: u64, runs: &[(usize, &str)]) {
    let mut updates = 0u64;
    baseline::q4(generator.events(0..events), |_| updates += 1);
    let expected = baseline::run_q4(generator, events);
    assert!(expected.results > 0 && updates > expected.results);
    for &(parallelism, backend) in runs {
        let actual = run(generator, events, parallelism, backend, queries::q4);
        assert_eq!(
            actual.len() as u64,
            updates,
            "q4 updates at parallelism {parallelism} on {backend}"
        );
        let finals = q4_final(actual);
        assert_eq!(
            checksum_of(&finals).result(),
            expected,
            "q4 finals at parallelism {parallelism} on {backend}: {finals:?}"
        );
    }
}

#[test]
fn q4_averages_winning_bids_per_category() {
    check_q4(&slow_generator(), STATEFUL_EVENTS, &runs(true));
}

#[test]
fn q5_reports_the_hottest_auctions_of_every_window() {
    check(
        "q5",
        &slow_generator(),
        STATEFUL_EVENTS,
        true,
        queries::q5,
        reference!(baseline::q5),
        baseline::run_q5,
    );
}

#[test]
fn q7_reports_the_highest_bids_of_every_window() {
    check(
        "q7",
        &slow_generator(),
        STATEFUL_EVENTS,
        true,
        queries::q7,
        reference!(baseline::q7),
        baseline::run_q7,
    );
}

#[test]
fn q8_reports_new_users_who_sold_in_their_first_window() {
    check(
        "q8",
        &slow_generator(),
        STATEFUL_EVENTS,
        true,
        queries::q8,
        reference!(baseline::q8),
        baseline::run_q8,
    );
}

#[test]
fn q11_counts_bidder_sessions() {
    check(
        "q11",
        &slow_generator(),
        STATEFUL_EVENTS,
        true,
        queries::q11,
        reference!(baseline::q11),
        baseline::run_q11,
    );
}

#[test]
fn q12_windows_add_up_to_every_bidders_bids() {
    let generator = slow_generator();
    let expected = baseline::q12(generator.events(0..STATEFUL_EVENTS));
    assert_eq!(
        checksum_of(&expected).result(),
        baseline::run_q12(&generator, STATEFUL_EVENTS)
    );
    for (parallelism, backend) in runs(true) {
        let actual = run(
            &generator,
            STATEFUL_EVENTS,
            parallelism,
            backend,
            queries::q12,
        );
        assert!(actual.iter().all(|w| w.count > 0));
        assert_eq!(
            q12_totals(&actual),
            expected,
            "q12 at parallelism {parallelism} on {backend}"
        );
    }
}

/// Out-of-order events (Beam's group shuffle and delayed events, within the 4 s bound): the
/// window, session and timer queries still match the baseline.
#[test]
fn out_of_order_events_give_the_same_results() {
    let generator = generator(NexmarkConfig {
        first_event_rate: RATE,
        out_of_order_group_size: 100,
        delayed_event_probability: 0.1,
        max_delay_ms: 2_500,
        ..NexmarkConfig::default()
    });
    // The input really is out of order.
    let times: Vec<i64> = generator.events(0..1_000).map(|e| e.date_time()).collect();
    assert!(times.windows(2).any(|pair| pair[1] < pair[0]));
    let runs = [(slots(), "hashmap")];
    let check_on = |name: &str, outputs: Checked| {
        for &(parallelism, backend) in &runs {
            let (actual, expected) = outputs(&generator, parallelism, backend);
            assert_eq!(
                actual, expected,
                "{name} at parallelism {parallelism} on {backend}"
            );
        }
    };
    check_on("q5", |g, p, b| {
        let expected = reference!(baseline::q5)(g, STATEFUL_EVENTS);
        (
            checksum_of(&run(g, STATEFUL_EVENTS, p, b, queries::q5)).result(),
            checksum_of(&expected).result(),
        )
    });
    check_on("q7", |g, p, b| {
        (
            checksum_of(&run(g, STATEFUL_EVENTS, p, b, queries::q7)).result(),
            baseline::run_q7(g, STATEFUL_EVENTS),
        )
    });
    check_on("q8", |g, p, b| {
        (
            checksum_of(&run(g, STATEFUL_EVENTS, p, b, queries::q8)).result(),
            baseline::run_q8(g, STATEFUL_EVENTS),
        )
    });
    check_on("q11", |g, p, b| {
        (
            checksum_of(&run(g, STATEFUL_EVENTS, p, b, queries::q11)).result(),
            baseline::run_q11(g, STATEFUL_EVENTS),
        )
    });
    check_q4(&generator, STATEFUL_EVENTS, &runs);
}

/// An out-of-order check: the engine's and the baseline's result.
type Checked = fn(&NexmarkGenerator, usize, &str) -> (BaselineResult, BaselineResult);

/// A bid for the hand-made inputs.
fn bid(auction: u64, price: u64, date_time: i64) -> Event {
    Event::Bid(weir_bench::nexmark::Bid {
        auction,
        bidder: auction + 7,
        price,
        channel: "Google".into(),
        url: String::new(),
        date_time,
        extra: format!("bid-{auction}-{date_time}"),
    })
}

/// Runs `query` over hand-made `events` (timestamped by `date_time`, 4 s bound).
fn run_on<T: Record>(events: Vec<Event>, parallelism: usize, query: Query<T>) -> Vec<T> {
    let mut config = Configuration::default();
    config
        .set("taskmanager.numberOfTaskSlots", parallelism.to_string())
        .expect("a valid setting");
    let env = StreamEnvironment::new(config).expect("environment");
    let watermarks =
        WatermarkStrategy::for_bounded_out_of_orderness(std::time::Duration::from_secs(4))
            .with_timestamp_assigner(|event: &Event, _| event.date_time());
    let (sink, out) = CollectSink::new();
    query(env.from_source(CollectionSource::new(events), watermarks, "hand-made"))
        .sink_to(sink, "out");
    env.execute("nexmark ties").expect("the job succeeds");
    out.records()
}

/// Ties are all reported: two auctions with the most bids of a q5 window, two bids at a q7
/// window's highest price (one price bucket), and the maximum of several buckets.
#[test]
fn ties_are_all_reported() {
    let base = 1_700_000_000_000;
    let events = vec![
        bid(1, 500, base + 100),
        bid(2, 500, base + 200),
        bid(3, 300, base + 300),
        bid(1, 400, base + 1_100),
        bid(2, 200, base + 1_500),
        bid(4, 100, base + 12_000),
        bid(5, 100, base + 13_000),
        bid(5, 99, base + 14_000),
        bid(6, 164, base + 15_000),
        bid(7, 100, base + 16_000),
    ];
    for parallelism in parallelisms() {
        let q5 = run_on(events.clone(), parallelism, queries::q5);
        let mut expected = Vec::new();
        baseline::q5(events.clone(), |record| expected.push(record));
        assert!(
            expected
                .iter()
                .filter(|h| h.window_end == base + 2_000)
                .count()
                == 2
        );
        assert_eq!(
            checksum_of(&q5),
            checksum_of(&expected),
            "{}",
            difference(&q5, &expected)
        );
        let q7 = run_on(events.clone(), parallelism, queries::q7);
        let mut expected = Vec::new();
        baseline::q7(events.clone(), |record| expected.push(record));
        assert_eq!(expected.len(), 3, "two bids at 500, one at 164");
        assert_eq!(
            checksum_of(&q7),
            checksum_of(&expected),
            "{}",
            difference(&q7, &expected)
        );
    }
}

/// An auction for the hand-made inputs.
fn auction(id: u64, category: u64, date_time: i64, expires: i64) -> Event {
    Event::Auction(weir_bench::nexmark::Auction {
        id,
        item_name: format!("item-{id}"),
        description: String::new(),
        initial_bid: 1,
        reserve: 2,
        date_time,
        expires,
        seller: 1_000 + id,
        category,
        extra: String::new(),
    })
}

/// q4 with bids that come before their auction: of those, only the ones in the auction's range
/// count, several at one millisecond included (the highest wins, whatever their order).
#[test]
fn q4_counts_the_early_bids_in_range() {
    let base = 1_700_000_000_000;
    let events = vec![
        // Auction 1 opens at +8: the bid at +5 is out of range, the three at +10 in it.
        bid(1, 90, base + 5),
        bid(1, 30, base + 10),
        bid(1, 70, base + 10),
        bid(1, 50, base + 10),
        // Auction 2 opens at +25 and closes at +35: two early bids in range, one after it.
        bid(2, 40, base + 30),
        bid(2, 45, base + 31),
        bid(2, 99, base + 36),
        auction(1, 10, base + 8, base + 1_000),
        auction(2, 11, base + 25, base + 35),
        bid(1, 60, base + 20),
    ];
    let updates = |outputs: Vec<weir_bench::nexmark::CategoryAverage>| {
        let mut outputs: Vec<(u64, u64, u64)> = outputs
            .into_iter()
            .map(|a| (a.category, a.sum, a.count))
            .collect();
        outputs.sort_unstable();
        outputs
    };
    let mut expected = Vec::new();
    baseline::q4(events.clone(), |record| expected.push(record));
    assert_eq!(
        updates(expected),
        [(10, 70, 1), (11, 45, 1)],
        "the baseline agrees with the hand count"
    );
    for parallelism in parallelisms() {
        let actual = run_on(events.clone(), parallelism, queries::q4);
        assert_eq!(
            updates(actual),
            [(10, 70, 1), (11, 45, 1)],
            "q4 at parallelism {parallelism}"
        );
    }
}

/// Rough rates of the engine jobs at parallelism 1 (generation included) next to their
/// baselines, for the record; run with `cargo test -p weir-bench --release --test
/// nexmark_queries -- --ignored --nocapture`. Prints, asserts nothing about time.
#[test]
#[ignore = "a measurement; run in release"]
#[allow(clippy::print_stdout)]
fn query_rates() {
    fn rate<T: Record>(
        name: &str,
        query: Query<T>,
        runner: fn(&NexmarkGenerator, u64) -> BaselineResult,
    ) {
        const EVENTS: u64 = 10_000_000;
        let generator = generator(NexmarkConfig::default());
        let mut config = Configuration::default();
        config
            .set("taskmanager.numberOfTaskSlots", "1")
            .expect("a valid setting");
        let env = StreamEnvironment::new(config).expect("environment");
        query(queries::source(&env, generator.clone(), EVENTS, None))
            .sink_to(DiscardSink::new(), "discard");
        let started = std::time::Instant::now();
        env.execute(name).expect("the job succeeds");
        let engine = EVENTS as f64 / started.elapsed().as_secs_f64() / 1e6;
        let started = std::time::Instant::now();
        std::hint::black_box(runner(&generator, EVENTS));
        let plain = EVENTS as f64 / started.elapsed().as_secs_f64() / 1e6;
        println!(
            "{name}: engine {engine:.2} M events/s, baseline {plain:.2} M events/s ({:.2}x)",
            plain / engine
        );
    }
    // The engine's floor: the source alone (against the q0 baseline).
    rate("source", |events| events, baseline::run_q0);
    rate("q0", queries::q0, baseline::run_q0);
    rate("q1", queries::q1, baseline::run_q1);
    rate("q2", queries::q2, baseline::run_q2);
    rate("q5", queries::q5, baseline::run_q5);
    rate("q7", queries::q7, baseline::run_q7);
    rate("q8", queries::q8, baseline::run_q8);
    rate("q11", queries::q11, baseline::run_q11);
}
