//! Backpressure: a slow sink behind an exchange, with a network pool of a few segments per
//! slot, blocks the producer on credit instead of buffering without bound or dropping records,
//! and the pool is never used past its size.

mod common;

use std::time::Duration;

use common::assert_same_multiset;
use weir_engine::prelude::*;

/// Segments per slot in the small pool.
const SEGMENTS_PER_SLOT: usize = 16;
const SEGMENT_SIZE: usize = 4 << 10;

/// Credits per channel for the small pools: 4 in flight (+2) fit [`SEGMENTS_PER_SLOT`].
const SMALL_POOL_CREDITS: (&str, &str) = ("taskmanager.network.memory.buffers-per-channel", "4");

/// An environment whose slots each own a pool of [`SEGMENTS_PER_SLOT`] 4 KiB segments: the
/// network share is pinned (min = max) to exactly that many segments over all slots.
fn small_pool_env(slots: usize, extra: &[(&str, &str)]) -> StreamEnvironment {
    pool_env(slots, SEGMENTS_PER_SLOT, extra)
}

/// About 120 bytes per record: a 4 KiB segment holds a few dozen.
fn payload(n: u64) -> String {
    format!("{n:08}-{}", "p".repeat(100 + (n % 16) as usize))
}

/// The operator named "payload" (ahead of the exchange) had to wait for credit.
#[track_caller]
fn assert_producer_waited(result: &JobResult) {
    assert!(
        result.backpressure_waits("payload") > 0,
        "the producer never waited for credit: {:?}",
        result.operators
    );
}

fn assert_pools_small_and_within_bounds(result: &JobResult) {
    assert!(!result.pools.is_empty());
    for pool in &result.pools {
        assert_eq!(pool.segments, SEGMENTS_PER_SLOT, "the configured pool size");
        assert_eq!(pool.segment_size, SEGMENT_SIZE);
        assert!(
            pool.high_water <= pool.segments,
            "slot {} used {} of {} segments",
            pool.slot,
            pool.high_water,
            pool.segments
        );
        assert_eq!(pool.in_use, 0, "every segment went back to its pool");
    }
    assert!(
        result.pools.iter().any(|p| p.high_water > 0),
        "the exchange used the pools"
    );
}

#[test]
fn slow_sink_behind_rebalance_blocks_the_source_and_loses_nothing() {
    let slots = common::slots();
    let env = small_pool_env(slots, &[SMALL_POOL_CREDITS]);
    let (sink, collected) = CollectSink::new();
    let sink = sink.with_delay_per_batch(Duration::from_millis(2));
    env.from_sequence(0, 10_000)
        .map(payload)
        .name("payload")
        .rebalance()
        .sink_to(sink, "slow");
    let result = env.execute("backpressure").expect("the job succeeds");

    let expected: Vec<String> = (0..10_000).map(payload).collect();
    assert_same_multiset(&collected.records(), &expected);
    assert_eq!(result.records_in("Sink: slow"), 10_000);
    assert_producer_waited(&result);
    assert_pools_small_and_within_bounds(&result);
}

#[test]
fn slow_keyed_sink_blocks_the_source_and_loses_nothing() {
    let slots = common::slots();
    let env = small_pool_env(slots, &[SMALL_POOL_CREDITS]);
    let (sink, collected) = CollectSink::new();
    let sink = sink.with_delay_per_batch(Duration::from_millis(2));
    env.from_sequence(0, 8_000)
        .map(|n: u64| (n % 97, payload(n)))
        .name("payload")
        .key_by(|(key, _): &(u64, String)| *key)
        .process(
            |record: (u64, String), ctx: &mut KeyedProcessContext<'_, u64, (u64, String)>| {
                ctx.emit(record)
            },
        )
        .sink_to(sink, "slow");
    let result = env.execute("keyed backpressure").expect("the job succeeds");

    let expected: Vec<(u64, String)> = (0..8_000).map(|n| (n % 97, payload(n))).collect();
    assert_same_multiset(&collected.records(), &expected);
    assert_producer_waited(&result);
    assert_pools_small_and_within_bounds(&result);
}

#[test]
fn one_credit_per_channel_still_delivers_everything() {
    let slots = common::slots();
    let env = small_pool_env(
        slots,
        &[("taskmanager.network.memory.buffers-per-channel", "1")],
    );
    let (sink, collected) = CollectSink::new();
    let sink = sink.with_delay_per_batch(Duration::from_millis(1));
    env.from_sequence(0, 5_000)
        .map(payload)
        .name("payload")
        .rebalance()
        .map(|s: String| s.len() as u64)
        .sink_to(sink, "slow");
    let result = env.execute("one credit").expect("the job succeeds");
    let expected: Vec<u64> = (0..5_000).map(|n| payload(n).len() as u64).collect();
    assert_same_multiset(&collected.records(), &expected);
    assert_producer_waited(&result);
    assert_pools_small_and_within_bounds(&result);
}

#[test]
fn a_pool_too_small_for_the_channels_is_refused_before_running() {
    let slots = common::slots();
    if slots < 2 {
        // One slot has no channel to another slot, so no segments to run short of.
        return;
    }
    // 16 segments per slot cannot hold 20 credits + 2 for even one channel to another slot.
    let env = small_pool_env(
        slots,
        &[("taskmanager.network.memory.buffers-per-channel", "20")],
    );
    let (sink, collected) = CollectSink::new();
    env.from_sequence(0, 100).rebalance().sink_to(sink, "never");
    let err = env
        .execute("too small")
        .expect_err("the pool cannot hold the channels");
    assert!(matches!(err, JobError::InvalidJob(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("network segments"), "{text}");
    assert!(
        text.contains("taskmanager.network.memory.buffers-per-channel"),
        "{text}"
    );
    assert!(collected.is_empty(), "nothing ran");
}

/// An environment whose slots each own exactly `segments` 4 KiB segments.
fn pool_env(slots: usize, segments: usize, extra: &[(&str, &str)]) -> StreamEnvironment {
    let network = format!("{}b", slots * segments * SEGMENT_SIZE);
    let mut pairs = vec![
        ("taskmanager.memory.segment-size", "4kb"),
        ("taskmanager.memory.network.min", network.as_str()),
        ("taskmanager.memory.network.max", network.as_str()),
    ];
    pairs.extend_from_slice(extra);
    common::env_with(slots, &pairs)
}

/// Credits that are not a power of two are rounded up (a channel's ring holds a power of two),
/// and the up-front pool check counts the rounded credits: 3 credits need 4 + 2 segments per
/// channel to another slot, so a pool sized for 3 + 2 is refused, and one sized for 4 + 2 never
/// runs dry even with a slow sink keeping every ring full. (The channel within a slot moves
/// records without segments.)
#[test]
fn credits_round_up_and_the_admitted_pool_is_never_exhausted() {
    let slots = common::slots();
    // Rebalance from `slots` senders to `slots` receivers: `slots - 1` channels per sending
    // slot go to another slot.
    let remote = slots - 1;
    let credits = [
        ("taskmanager.network.memory.buffers-per-channel", "3"),
        ("execution.batch-size", "4"),
    ];
    let build = |env: &StreamEnvironment| {
        let (sink, collected) = CollectSink::new();
        let sink = sink.with_delay_per_batch(Duration::from_millis(1));
        env.from_sequence(0, 3_000)
            .map(payload)
            .rebalance()
            .sink_to(sink, "slow");
        collected
    };

    if remote > 0 {
        let too_small = pool_env(slots, remote * 5, &credits);
        build(&too_small);
        let err = too_small
            .execute("pool for unrounded credits")
            .expect_err("refused up front");
        assert!(err.to_string().contains("buffers-per-channel"), "{err}");
    }

    let segments = (remote * 6).max(1);
    let enough = pool_env(slots, segments, &credits);
    let collected = build(&enough);
    let result = enough
        .execute("pool for rounded credits")
        .expect("the admitted job runs");
    for pool in &result.pools {
        assert_eq!(pool.segments, segments);
        assert!(pool.high_water <= pool.segments, "{pool:?}");
    }
    let expected: Vec<String> = (0..3_000).map(payload).collect();
    assert_same_multiset(&collected.records(), &expected);
}
