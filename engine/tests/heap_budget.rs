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
