//! The slot's heap share is enforced for heap-backend state: a job whose keyed state outgrows
//! it fails with a message naming the slot, the state, its operator, the usage, the budget and
//! the fix — and the process goes on running other jobs.
//!
//! This test binary counts allocations (as the `weir` binary does); without a counting
//! allocator there is nothing to enforce.

mod common;

use std::alloc::System;

use weir_engine::prelude::*;
use weir_memory::CountingAllocator;

#[global_allocator]
static GLOBAL: CountingAllocator<System> = CountingAllocator::new(System);

/// 1 slot of a 256 MiB worker: 102 MiB managed, 64 MiB network (the minimum), ~90 MiB heap.
fn small_worker(backend: &str) -> StreamEnvironment {
    common::env_with(
        1,
        &[
            ("taskmanager.memory.process.size", "256m"),
            ("state.backend.type", backend),
        ],
    )
}

/// Keeps 64 bytes of state for every key it sees.
#[derive(Clone)]
struct Remember {
    seen: ValueStateDescriptor<[u64; 8]>,
}

impl KeyedProcessFunction<u64, u64, u64> for Remember {
    fn process_element(&mut self, n: u64, ctx: &mut KeyedProcessContext<'_, u64, u64>) {
        ctx.value_state(&self.seen).update([n; 8]).expect("write");
    }
}

fn remember_every_key(env: &StreamEnvironment, keys: u64) {
    env.from_source(
        DataGeneratorSource::sequence(0, keys),
        WatermarkStrategy::no_watermarks(),
        "keys",
    )
    .key_by(|n: &u64| *n)
    .process(Remember {
        seen: ValueStateDescriptor::new("seen"),
    })
    .name("remember")
    .sink_to(DiscardSink::new(), "nothing");
}

#[test]
fn heap_state_beyond_the_slot_share_fails_the_job_with_the_fix() {
    // 3 M keys hold ~300 MiB on the heap: far more than the ~90 MiB share.
    let env = small_worker("hashmap");
    remember_every_key(&env, 3_000_000);
    let error = env.execute("too-big").expect_err("the job fails");
    let message = error.to_string();
    // The state is blamed when its estimate is at least half the usage (the usual case); the
    // message names it either way.
    for part in [
        "slot 0 heap budget exceeded (",
        " MiB of 89.6 MiB)",
        "'seen' of operator 'remember'",
        "raise taskmanager.memory.process.size",
    ] {
        assert!(message.contains(part), "missing {part:?} in: {message}");
    }

    // The process goes on: the next job runs, with its own fresh shard.
    let env = small_worker("hashmap");
    remember_every_key(&env, 1_000);
    let result = env.execute("small").expect("a small job still runs");
    assert_eq!(result.records_in("remember"), 1_000);
}

/// `n` records of 64 bytes, 1 ms apart, in 1 000 keys, collected by an hour-long window per
/// key (`process` keeps every record until the window fires); emits each window's count.
fn collect_in_windows(env: &StreamEnvironment, n: u64) -> weir_engine::connector::Collected<u64> {
    let (sink, out) = CollectSink::new();
    env.from_source(
        DataGeneratorSource::new(Some(n), |i: u64| [i; 8]),
        WatermarkStrategy::for_monotonous_timestamps()
            .with_timestamp_assigner(|r: &[u64; 8], _| r[0] as i64),
        "records",
    )
    .key_by(|r: &[u64; 8]| r[0] % 1_000)
    .window(TumblingEventTimeWindows::of(
        std::time::Duration::from_secs(3_600),
    ))
    .process(
        |_: &u64,
         _: &TimeWindow,
         records: WindowElements<'_, [u64; 8]>,
         out: &mut Collector<'_, u64>| { out.collect(records.len() as u64) },
    )
    .name("hold")
    .sink_to(sink, "counts");
    out
}

#[test]
fn window_contents_beyond_the_heap_share_fail_on_the_heap_and_fit_in_rocksdb() {
    // 2 M records of 64 bytes: ~128 MiB of window contents against a ~90 MiB heap share.
    const RECORDS: u64 = 2_000_000;
    let env = small_worker("hashmap");
    collect_in_windows(&env, RECORDS);
    let message = env
        .execute("windows on the heap")
        .expect_err("the job fails")
        .to_string();
    for part in [
        "slot 0 heap budget exceeded (",
        "state.backend.type: rocksdb",
    ] {
        assert!(message.contains(part), "missing {part:?} in: {message}");
    }

    // In RocksDB the contents leave the heap; every record is counted in its window.
    let env = small_worker("rocksdb");
    let counts = collect_in_windows(&env, RECORDS);
    env.execute("windows in rocksdb").expect("the job fits");
    let counts = counts.records();
    assert_eq!(counts.len(), 1_000, "one window per key");
    assert_eq!(counts.iter().sum::<u64>(), RECORDS);
}
