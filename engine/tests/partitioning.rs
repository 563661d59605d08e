//! Union, broadcast and rebalance deliver the right multiset of records to the right subtasks.

mod common;

use std::collections::HashMap;

use common::assert_same_multiset;
use weir_engine::prelude::*;

/// Tags each record with the subtask that received it.
fn tag(n: u64, ctx: &mut ProcessContext<'_, (u64, usize)>) {
    let subtask = ctx.runtime().subtask;
    ctx.emit((n, subtask));
}

fn per_subtask(tagged: &[(u64, usize)], parallelism: usize) -> Vec<Vec<u64>> {
    let mut out = vec![Vec::new(); parallelism];
    for &(n, subtask) in tagged {
        out[subtask].push(n);
    }
    out
}

#[test]
fn broadcast_delivers_every_record_to_every_subtask() {
    let parallelism = common::slots();
    for source_parallelism in common::parallelisms() {
        let env = common::env();
        let (sink, collected) = CollectSink::new();
        env.from_sequence(0, 3_000)
            .parallelism(source_parallelism)
            .broadcast()
            .process(tag)
            .parallelism(parallelism)
            .sink_to(sink, "tagged");
        let result = env.execute("broadcast").expect("the job succeeds");
        let tagged = collected.records();
        assert_eq!(tagged.len(), 3_000 * parallelism);
        assert_eq!(result.records_in("Process"), 3_000 * parallelism as u64);
        let expected: Vec<u64> = (0..3_000).collect();
        for (subtask, records) in per_subtask(&tagged, parallelism).iter().enumerate() {
            assert_eq!(records.len(), 3_000, "subtask {subtask}");
            assert_same_multiset(records, &expected);
        }
    }
}

#[test]
fn broadcast_of_strings_across_an_exchange() {
    let parallelism = common::slots();
    let env = common::env();
    let words: Vec<String> = (0..500)
        .map(|i| format!("word-{i}-{}", "x".repeat(i % 40)))
        .collect();
    let (sink, collected) = CollectSink::new();
    env.from_collection(words.clone())
        .parallelism(1)
        .broadcast()
        .map(|w: String| w)
        .parallelism(parallelism)
        .sink_to(sink, "words");
    env.execute("broadcast strings").expect("the job succeeds");
    let by_subtask = collected.by_subtask();
    assert_eq!(by_subtask.len(), parallelism);
    for records in &by_subtask {
        // One sender: each receiver sees the records in the order they were sent.
        assert_eq!(records, &words);
    }
}

#[test]
fn union_of_two_sources_delivers_both_multisets() {
    let env = common::env();
    let evens: Vec<u64> = (0..2_000).map(|n| n * 2).collect();
    let left = env.from_collection(evens.clone());
    // Overlapping values, so a union that dropped or deduplicated records would show.
    let right = env.from_sequence(1_000, 3_000).map(|n: u64| n);
    let (sink, collected) = CollectSink::new();
    left.union([right]).sink_to(sink, "both");
    env.execute("union").expect("the job succeeds");
    let mut expected = evens;
    expected.extend(1_000..3_000);
    assert_same_multiset(&collected.records(), &expected);
}

#[test]
fn union_of_three_streams_then_rebalance() {
    let parallelism = common::slots();
    let env = common::env();
    let a = env.from_sequence(0, 1_000);
    let b = env.from_collection(vec![7u64; 500]);
    let c = env
        .from_sequence(0, 1_000)
        .filter(|n: &u64| n.is_multiple_of(3));
    let (sink, collected) = CollectSink::new();
    a.union([b, c])
        .rebalance()
        .process(tag)
        .parallelism(parallelism)
        .sink_to(sink, "all");
    env.execute("union of three").expect("the job succeeds");
    let tagged = collected.records();
    let values: Vec<u64> = tagged.iter().map(|(n, _)| *n).collect();
    let mut expected: Vec<u64> = (0..1_000).collect();
    expected.extend(std::iter::repeat_n(7, 500));
    expected.extend((0..1_000).filter(|n: &u64| n.is_multiple_of(3)));
    assert_same_multiset(&values, &expected);
}

#[test]
fn rebalance_from_one_subtask_spreads_round_robin() {
    let parallelism = common::slots();
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_sequence(0, 10_001)
        .parallelism(1)
        .rebalance()
        .process(tag)
        .parallelism(parallelism)
        .sink_to(sink, "tagged")
        .parallelism(1);
    env.execute("rebalance").expect("the job succeeds");
    let tagged = collected.records();
    let values: Vec<u64> = tagged.iter().map(|(n, _)| *n).collect();
    assert_same_multiset(&values, &(0..10_001).collect::<Vec<_>>());
    // One sender going round-robin: the receivers' shares differ by at most one record.
    let counts = per_subtask(&tagged, parallelism)
        .iter()
        .map(Vec::len)
        .collect::<Vec<_>>();
    let (min, max) = (
        counts.iter().min().copied().unwrap_or(0),
        counts.iter().max().copied().unwrap_or(0),
    );
    assert!(max - min <= 1, "round-robin shares {counts:?}");
}

#[test]
fn rebalance_between_differing_parallelisms() {
    let parallelism = common::slots();
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    // Parallelism 2 -> 1 -> 2 (or 1 -> 1 -> 1 on one core): a default edge between different
    // parallelisms is a rebalance too.
    env.from_sequence(0, 5_000)
        .parallelism(parallelism)
        .map(|n: u64| n * 3)
        .parallelism(1)
        .rebalance()
        .process(tag)
        .parallelism(parallelism)
        .sink_to(sink, "tagged");
    let graph = env.plan("differing").expect("plans");
    assert_eq!(
        graph.job.vertices.len(),
        if parallelism > 1 { 3 } else { 2 },
        "{}",
        graph.explain()
    );
    env.execute("differing").expect("the job succeeds");
    let tagged = collected.records();
    let values: Vec<u64> = tagged.iter().map(|(n, _)| *n).collect();
    assert_same_multiset(&values, &(0..5_000).map(|n| n * 3).collect::<Vec<_>>());
    let used: HashMap<usize, usize> = common::multiset(tagged.iter().map(|(_, s)| *s));
    assert_eq!(
        used.len(),
        parallelism,
        "every receiving subtask got records"
    );
}

#[test]
fn one_stream_feeding_two_sinks_delivers_to_both() {
    let env = common::env();
    let numbers = env.from_sequence(0, 2_000);
    let (first, first_got) = CollectSink::new();
    let (second, second_got) = CollectSink::new();
    numbers
        .clone()
        .map(|n: u64| n + 1)
        .sink_to(first, "plus-one");
    numbers
        .rebalance()
        .filter(|n: &u64| n.is_multiple_of(2))
        .sink_to(second, "evens");
    env.execute("fan out").expect("the job succeeds");
    assert_same_multiset(&first_got.records(), &(1..=2_000).collect::<Vec<_>>());
    assert_same_multiset(
        &second_got.records(),
        &(0..2_000)
            .filter(|n: &u64| n.is_multiple_of(2))
            .collect::<Vec<_>>(),
    );
}
