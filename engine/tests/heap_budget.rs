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

/// Runs `remember_every_key` of `keys` keys on `backend` in a 256 MiB worker until `done`
/// holds for its one slot's figures, and returns them.
fn slot_figures_of(
    backend: &str,
    keys: u64,
    done: impl Fn(&weir_engine::monitor::ShardFigures) -> bool,
) -> weir_engine::monitor::ShardFigures {
    use std::time::{Duration, Instant};
    let env = small_worker(backend);
    remember_every_key(&env, keys);
    let monitor = weir_engine::monitor::JobMonitor::default();
    let options = weir_engine::runtime::RunOptions {
        monitor: monitor.clone(),
        ..Default::default()
    };
    let job = env.execute_async(backend, options).expect("starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    while Instant::now() < deadline && !job.is_finished() {
        if let Some(shard) = monitor.figures().and_then(|f| f.shards.first().cloned()) {
            if done(&shard) {
                job.cancel();
                let _ = job.wait();
                return shard;
            }
            last = Some(shard);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the slot's figures never held on {backend}; the last: {last:#?}");
}

#[test]
fn a_slots_memory_shows_its_shares_and_what_its_backend_holds() {
    // On the heap: what the shard's thread holds, against its share; no managed memory used.
    let heap = slot_figures_of("hashmap", 50_000_000, |s| {
        s.heap_used_bytes.is_some_and(|used| used > 8 << 20)
    });
    assert!(heap.heap_bytes > 80 << 20, "{heap:#?}");
    assert!(heap.managed_bytes > 80 << 20, "{heap:#?}");
    assert_eq!((heap.managed_used_bytes, heap.rocksdb.as_ref()), (0, None));
    if std::path::Path::new("/proc/self/schedstat").exists() {
        assert!(
            heap.stalled_seconds.is_some(),
            "this kernel keeps run-queue delays"
        );
    }

    // In RocksDB: its block cache (memtables charged to it) within the managed share.
    let rocksdb = slot_figures_of("rocksdb", 50_000_000, |s| {
        s.rocksdb.as_ref().is_some_and(|r| r.memtable_bytes > 0)
    });
    let memory = rocksdb.rocksdb.as_ref().unwrap();
    // The memtables are charged to the cache in steps, read a moment apart: a slack of 1 MiB.
    assert!(
        memory.block_cache_capacity_bytes <= rocksdb.managed_bytes
            && memory.memtable_limit_bytes <= memory.block_cache_capacity_bytes
            && memory.block_cache_usage_bytes + (1 << 20) >= memory.memtable_bytes,
        "{rocksdb:#?}"
    );
    assert!(rocksdb.managed_used_bytes >= memory.block_cache_usage_bytes);
    assert_eq!(rocksdb.heap_used_bytes, None, "it drifts with RocksDB");
}
