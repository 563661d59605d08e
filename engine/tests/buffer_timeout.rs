//! `execution.buffer-timeout`: at 0 every record is sent in its own segment, at a long
//! timeout partly filled segments wait — either way, everything arrives when the job ends.

mod common;

use common::assert_same_multiset;
use weir_engine::prelude::*;

fn run_through_exchanges(timeout: &str) -> (Vec<(u64, u64)>, JobResult) {
    let env = common::env_with(
        common::slots(),
        &[
            ("execution.buffer-timeout", timeout),
            ("taskmanager.memory.segment-size", "4kb"),
        ],
    );
    let (sink, collected) = CollectSink::new();
    env.from_sequence(0, 5_000)
        .map(|n: u64| (n % 13, n))
        .rebalance()
        .key_by(|(key, _): &(u64, u64)| *key)
        .reduce(|(key, a): (u64, u64), (_, b): (u64, u64)| (key, a.max(b)))
        .name("max")
        .sink_to(sink, "out");
    let result = env.execute("buffer timeout").expect("the job succeeds");
    (collected.records(), result)
}

fn check(records: &[(u64, u64)]) {
    assert_eq!(records.len(), 5_000);
    // The running max of each key ends at the key's largest value.
    let mut finals = std::collections::HashMap::new();
    for &(key, max) in records {
        let best = finals.entry(key).or_insert(0);
        *best = max.max(*best);
    }
    for key in 0..13 {
        let largest = (0..5_000).filter(|n| n % 13 == key).max();
        assert_eq!(finals.get(&key).copied(), largest, "key {key}");
    }
}

#[test]
fn buffer_timeout_zero_delivers_everything() {
    let (records, result) = run_through_exchanges("0");
    check(&records);
    // Per-record flushing: a segment for every record sent to the other slot (the 13 keys
    // spread over both), many more than 5000 small records need when batched. Records for a
    // subtask on the same slot move without segments.
    let acquired: u64 = result.pools.iter().map(|p| p.acquired).sum();
    let remote_at_least = if common::slots() > 1 { 5_000 / 4 } else { 0 };
    assert!(
        acquired >= remote_at_least,
        "{acquired} segments for 5000 records at timeout 0"
    );
}

#[test]
fn a_long_buffer_timeout_still_delivers_everything_at_the_end() {
    let (records, result) = run_through_exchanges("1 min");
    check(&records);
    let acquired: u64 = result.pools.iter().map(|p| p.acquired).sum();
    assert!(
        acquired < 5_000,
        "{acquired} segments: records were batched"
    );
}

#[test]
fn buffer_timeout_zero_keeps_a_slow_consumer_fed_record_by_record() {
    let env = common::env_with(common::slots(), &[("execution.buffer-timeout", "0")]);
    let (sink, collected) = CollectSink::new();
    let sink = sink.with_delay_per_batch(std::time::Duration::from_micros(200));
    let words: Vec<String> = (0..2_000).map(|i| format!("w{i}")).collect();
    env.from_collection(words.clone())
        .broadcast()
        .sink_to(sink, "slow");
    env.execute("timeout zero broadcast")
        .expect("the job succeeds");
    let mut expected = Vec::new();
    for _ in 0..common::slots() {
        expected.extend(words.iter().cloned());
    }
    assert_same_multiset(&collected.records(), &expected);
}
