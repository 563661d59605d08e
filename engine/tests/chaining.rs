//! Operator chaining changes how a job is cut into tasks, never what it computes: the same job
//! with chaining on, off (`pipeline.operator-chaining.enabled=false`) and broken at one
//! operator (`disable_chaining()`) gives the same records, and its plan shows the difference; a
//! link whose output fills mid-batch goes on where it stopped.

mod common;

use common::assert_same_multiset;
use weir_engine::prelude::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chaining {
    On,
    OffByConfig,
    BrokenAtFilter,
}

/// source -> map -> filter -> map -> key_by -> reduce (counting) -> map -> sink.
fn build(
    chaining: Chaining,
) -> (
    StreamEnvironment,
    weir_engine::connector::Collected<(u64, u64)>,
) {
    let slots = common::slots();
    let env = match chaining {
        Chaining::OffByConfig => {
            common::env_with(slots, &[("pipeline.operator-chaining.enabled", "false")])
        }
        _ => common::env(),
    };
    let (sink, collected) = CollectSink::new();
    let filtered = env
        .from_sequence(0, 20_000)
        .map(|n: u64| n * 7 + 1)
        .name("scale")
        .filter(|n: &u64| !n.is_multiple_of(3))
        .name("drop-thirds");
    let filtered = if chaining == Chaining::BrokenAtFilter {
        filtered.disable_chaining()
    } else {
        filtered
    };
    filtered
        .map(|n: u64| (n % 101, 1u64))
        .name("pair")
        .key_by(|(key, _): &(u64, u64)| *key)
        .reduce(|(key, a): (u64, u64), (_, b): (u64, u64)| (key, a + b))
        .name("count")
        .map(|(key, count): (u64, u64)| (key, count))
        .name("identity")
        .sink_to(sink, "out");
    (env, collected)
}

fn expected() -> Vec<(u64, u64)> {
    // A running count emits 1, 2, ..., n for a key with n records, whatever their order.
    let mut per_key = std::collections::HashMap::new();
    for n in (0..20_000u64)
        .map(|n| n * 7 + 1)
        .filter(|n| !n.is_multiple_of(3))
    {
        *per_key.entry(n % 101).or_insert(0u64) += 1;
    }
    per_key
        .into_iter()
        .flat_map(|(key, n)| (1..=n).map(move |count| (key, count)))
        .collect()
}

#[test]
fn chaining_on_off_and_broken_give_identical_results() {
    let expected = expected();
    let mut vertex_counts = Vec::new();
    for chaining in [
        Chaining::On,
        Chaining::OffByConfig,
        Chaining::BrokenAtFilter,
    ] {
        let (env, collected) = build(chaining);
        let vertices = env.plan("chaining").expect("plans").job.vertices.len();
        vertex_counts.push((chaining, vertices));
        let result = env.execute("chaining").expect("the job succeeds");
        assert_same_multiset(&collected.records(), &expected);
        assert_eq!(
            result.records_out("count"),
            expected.len() as u64,
            "{chaining:?}"
        );
        assert_eq!(result.records_in("scale"), 20_000, "{chaining:?}");
    }
    // On: [source, scale, drop-thirds, pair] + [count, identity, sink].
    // Off: every one of the 7 nodes alone. Broken at the filter: [source, scale],
    // [drop-thirds], [pair], [count, identity, sink].
    assert_eq!(
        vertex_counts,
        [
            (Chaining::On, 2),
            (Chaining::OffByConfig, 7),
            (Chaining::BrokenAtFilter, 4)
        ]
    );
}

#[test]
fn explain_shows_the_chains() {
    let (on, _) = build(Chaining::On);
    let text = on.explain("chaining").expect("explains");
    assert!(text.contains("== JobGraph: 2 task(s) =="), "{text}");
    assert!(
        text.contains("Source: Sequence -> scale -> drop-thirds -> pair (parallelism"),
        "{text}"
    );
    assert!(text.contains("count -> identity -> Sink: out"), "{text}");
    assert!(text.contains("HASH"), "{text}");

    let (off, _) = build(Chaining::OffByConfig);
    let text = off.explain("chaining").expect("explains");
    assert!(text.contains("== JobGraph: 7 task(s) =="), "{text}");
    assert!(!text.contains(" -> scale"), "{text}");
    assert!(
        text.contains("FORWARD"),
        "forward exchanges between unchained tasks: {text}"
    );

    let (broken, _) = build(Chaining::BrokenAtFilter);
    let text = broken.explain("chaining").expect("explains");
    assert!(text.contains("== JobGraph: 4 task(s) =="), "{text}");
    assert!(
        text.contains("Source: Sequence -> scale (parallelism"),
        "{text}"
    );
    assert!(text.contains("drop-thirds (parallelism"), "{text}");
}

#[test]
fn unchained_forward_edges_have_one_channel_per_subtask() {
    let slots = common::slots();
    let env = common::env_with(slots, &[("pipeline.operator-chaining.enabled", "false")]);
    let (sink, collected) = CollectSink::new();
    env.from_sequence(0, 1_000)
        .map(|n: u64| n + 1)
        .sink_to(sink, "out");
    let plan = env.plan("forward").expect("plans");
    assert_eq!(plan.job.vertices.len(), 3);
    let unchained: Vec<_> = plan.job.edges.iter().filter(|e| !e.chained).collect();
    assert_eq!(unchained.len(), 2);
    let text = plan.explain();
    assert_eq!(
        text.matches(&format!("(FORWARD): {slots} channel(s)"))
            .count(),
        2,
        "{text}"
    );
    env.execute("forward").expect("the job succeeds");
    assert_same_multiset(&collected.records(), &(1..=1_000).collect::<Vec<_>>());
    // A forward edge keeps each source subtask's records in its own sink subtask, in order.
    for records in collected.by_subtask() {
        assert!(
            records.windows(2).all(|w| w[0] < w[1]),
            "in order: {records:?}"
        );
    }
}

#[test]
fn disable_chaining_on_a_sink_runs_it_as_its_own_task() {
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_sequence(0, 500)
        .map(|n: u64| n * 2)
        .sink_to(sink, "alone")
        .disable_chaining();
    let plan = env.plan("sink alone").expect("plans");
    let names: Vec<&str> = plan.job.vertices.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["Source: Sequence -> Map", "Sink: alone"]);
    env.execute("sink alone").expect("the job succeeds");
    assert_same_multiset(
        &collected.records(),
        &(0..500).map(|n| n * 2).collect::<Vec<_>>(),
    );
}

/// A chained operator that emits more than a batch for one record hands the batch on and goes
/// on with the rest of its input where it stopped: with batches of 4 and up to 9 records out
/// per record in, every record comes out once, in order.
#[test]
fn a_link_that_fills_its_output_mid_batch_loses_and_repeats_nothing() {
    let env = common::env_with(1, &[("execution.batch-size", "4")]);
    let (sink, collected) = CollectSink::new();
    env.from_sequence(0, 2_000)
        .flat_map(|n: u64, out: &mut Collector<'_, (u64, u64)>| {
            for copy in 0..n % 10 {
                out.collect((n, copy));
            }
        })
        .name("fan out")
        .map(|pair: (u64, u64)| pair)
        .name("after")
        .sink_to(sink, "out");
    env.execute("fan out in a chain").expect("the job succeeds");
    let expected: Vec<(u64, u64)> = (0..2_000u64)
        .flat_map(|n| (0..n % 10).map(move |copy| (n, copy)))
        .collect();
    assert_eq!(collected.records(), expected);
}
