//! Failures: a panicking user function fails the job with the operator and subtask that
//! panicked, and the process can run jobs afterwards; settings and jobs that cannot work are
//! refused with a message naming the key or operator.

mod common;

use std::time::Duration;

use common::assert_same_multiset;
use weir_engine::config::ConfigError;
use weir_engine::prelude::*;

const POISON: u64 = 777;

fn explode(n: u64) -> u64 {
    if n == POISON {
        panic!("poison record {n}");
    }
    n
}

/// Asserts that `err` is the failure of `exploding-map` on the record [`POISON`], in
/// `subtask` of `parallelism`.
#[track_caller]
fn assert_exploded(err: &JobError, subtask: usize, parallelism: usize) {
    match err {
        JobError::TaskFailed {
            operator,
            subtask: failed,
            parallelism: of,
            message,
            ..
        } => {
            assert_eq!(operator, "exploding-map", "{err}");
            assert_eq!((*failed, *of), (subtask, parallelism), "{err}");
            assert!(message.contains("poison record 777"), "{err}");
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("'exploding-map'"), "{text}");
    assert!(
        text.contains(&format!("subtask {subtask} of {parallelism}")),
        "{text}"
    );
}

fn run_a_healthy_job() {
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_sequence(0, 5_000)
        .map(|n: u64| n + 1)
        .rebalance()
        .sink_to(sink, "healthy");
    env.execute("after the failure")
        .expect("a job after a failed one succeeds");
    assert_same_multiset(&collected.records(), &(1..=5_000).collect::<Vec<_>>());
}

#[test]
fn panic_in_a_chained_map_names_the_map_and_the_process_keeps_working() {
    let parallelism = common::slots();
    let env = common::env();
    let (sink, _collected) = CollectSink::new();
    env.from_sequence(0, 10_000)
        .map(explode)
        .name("exploding-map")
        .map(|n: u64| n * 2)
        .sink_to(sink, "out");
    let err = env.execute("exploding").expect_err("the map panics");
    // The sequence source's subtask s generates s, s + p, s + 2p, ...: the poison record is
    // read, and the chained map runs, in subtask POISON % p.
    assert_exploded(&err, POISON as usize % parallelism, parallelism);
    run_a_healthy_job();
}

#[test]
fn panic_in_a_map_behind_an_exchange_names_the_map() {
    let parallelism = common::slots();
    let env = common::env();
    let (sink, _collected) = CollectSink::new();
    // Keyed by the value itself: the poison record reaches the subtask owning its key group.
    env.from_sequence(0, 10_000)
        .key_by(|n: &u64| *n)
        .process(|n: u64, ctx: &mut KeyedProcessContext<'_, u64, u64>| ctx.emit(n))
        .map(explode)
        .name("exploding-map")
        .sink_to(sink, "out");
    let err = env.execute("exploding").expect_err("the map panics");
    let owner = weir_state::KeyGroup::of(&POISON, 128).subtask(128, parallelism as u32);
    assert_exploded(&err, owner as usize, parallelism);
    run_a_healthy_job();
}

#[test]
fn panic_in_an_unchained_map_names_the_map() {
    let env = common::env();
    let (sink, _collected) = CollectSink::new();
    env.from_collection(vec![1u64, 2, POISON, 4])
        .parallelism(1)
        .map(explode)
        .name("exploding-map")
        .parallelism(1)
        .disable_chaining()
        .sink_to(sink, "out");
    let err = env.execute("exploding").expect_err("the map panics");
    assert_exploded(&err, 0, 1);
}

#[test]
fn panic_in_a_sink_side_chain_with_a_slow_sink_still_ends_the_job() {
    // The failing subtask's peers are blocked on credit or waiting for input; the failure must
    // still bring the whole job down rather than leave them waiting.
    let parallelism = common::slots();
    let err = common::within(Duration::from_secs(120), "the failing job", move || {
        let env = common::env_with(
            parallelism,
            &[
                ("taskmanager.network.memory.buffers-per-channel", "1"),
                ("taskmanager.memory.segment-size", "4kb"),
            ],
        );
        let (sink, _collected) = CollectSink::new();
        let sink = sink.with_delay_per_batch(Duration::from_millis(1));
        env.from_sequence(0, 50_000)
            .rebalance()
            .map(|n: u64| if n == 40_000 { explode(POISON) } else { n })
            .name("exploding-map")
            .sink_to(sink, "slow");
        env.execute("exploding").map(|_| ())
    })
    .expect_err("the map panics");
    match &err {
        JobError::TaskFailed { operator, .. } => assert_eq!(operator, "exploding-map", "{err}"),
        other => panic!("expected TaskFailed, got {other:?}"),
    }
    run_a_healthy_job();
}

#[test]
fn more_slots_than_cores_is_refused_naming_the_key() {
    let cores = weir_engine::runtime::available_cores().len();
    let mut config = Configuration::default();
    config
        .set("taskmanager.numberOfTaskSlots", (cores + 1).to_string())
        .expect("a count parses");
    let err = StreamEnvironment::new(config).expect_err("more slots than cores");
    let text = err.to_string();
    assert!(text.contains("taskmanager.numberOfTaskSlots"), "{text}");
    assert!(text.contains(&(cores + 1).to_string()), "{text}");
    assert!(
        matches!(err, JobError::Config(ConfigError::InvalidValue { ref key, .. }) if key == "taskmanager.numberOfTaskSlots"),
        "{err:?}"
    );
}

#[test]
fn parallelism_zero_is_refused_naming_the_operator() {
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_sequence(0, 10)
        .map(|n: u64| n)
        .name("zero-wide")
        .parallelism(0)
        .sink_to(sink, "out");
    let err = env.execute("zero").expect_err("parallelism 0");
    match &err {
        JobError::InvalidJob(message) => {
            assert!(message.contains("'zero-wide'"), "{message}");
            assert!(message.contains("parallelism 0"), "{message}");
        }
        other => panic!("expected InvalidJob, got {other:?}"),
    }
    assert!(collected.is_empty());
}

#[test]
fn parallelism_above_the_slots_is_refused_naming_the_operator() {
    let slots = common::slots();
    let env = common::env();
    let (sink, _collected) = CollectSink::new();
    env.from_sequence(0, 10)
        .map(|n: u64| n)
        .name("too-wide")
        .parallelism(slots + 1)
        .sink_to(sink, "out");
    let err = env
        .execute("too wide")
        .expect_err("parallelism above the slots");
    let text = err.to_string();
    assert!(matches!(err, JobError::InvalidJob(_)), "{err:?}");
    assert!(text.contains("too-wide"), "{text}");
    assert!(text.contains("taskmanager.numberOfTaskSlots"), "{text}");
}

#[test]
fn unknown_config_key_is_refused_with_a_suggestion() {
    let err = Configuration::default()
        .set("execution.buffer-timout", "5 ms")
        .expect_err("a misspelt key");
    assert_eq!(
        err,
        ConfigError::UnknownKey {
            key: "execution.buffer-timout".into(),
            suggestion: Some("execution.buffer-timeout".into()),
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("did you mean 'execution.buffer-timeout'"),
        "{text}"
    );

    let err = Configuration::default()
        .with("taskmanager.memory.segmentsize", "4kb")
        .expect_err("a misspelt key");
    assert!(
        matches!(&err, ConfigError::UnknownKey { suggestion: Some(s), .. } if s == "taskmanager.memory.segment-size"),
        "{err:?}"
    );
}

#[test]
fn invalid_config_value_names_key_value_and_expectation() {
    let err = Configuration::default()
        .set("taskmanager.memory.segment-size", "lots")
        .expect_err("not a size");
    let text = err.to_string();
    assert!(text.contains("taskmanager.memory.segment-size"), "{text}");
    assert!(text.contains("'lots'"), "{text}");
    // A size that parses but the memory settings refuse, caught when the environment is made.
    let config = common::config_with(1, &[("taskmanager.memory.segment-size", "3kb")]);
    let err = StreamEnvironment::new(config).expect_err("not a power of two");
    assert!(
        err.to_string().contains("taskmanager.memory.segment-size"),
        "{err}"
    );
}

#[test]
fn a_job_without_a_sink_is_refused() {
    let env = common::env();
    let _unused = env.from_sequence(0, 10).map(|n: u64| n + 1);
    let err = env.execute("no sink").expect_err("nothing to run");
    match &err {
        JobError::InvalidJob(message) => assert!(message.contains("no sink"), "{message}"),
        other => panic!("expected InvalidJob, got {other:?}"),
    }
}

#[test]
fn a_duplicate_uid_is_refused_naming_both_operators() {
    let env = common::env();
    let (sink, _collected) = CollectSink::new();
    env.from_sequence(0, 10)
        .map(|n: u64| n)
        .name("first")
        .uid("same")
        .map(|n: u64| n)
        .name("second")
        .uid("same")
        .sink_to(sink, "out");
    let err = env.execute("uids").expect_err("duplicate uid");
    let text = err.to_string();
    assert!(
        text.contains("'same'") && text.contains("'first'") && text.contains("'second'"),
        "{text}"
    );
}

#[test]
fn a_record_larger_than_a_segment_fails_naming_the_setting() {
    let env = common::env_with(
        common::slots(),
        &[("taskmanager.memory.segment-size", "4kb")],
    );
    let (sink, _collected) = CollectSink::new();
    env.from_collection(vec!["small".to_string(), "x".repeat(10_000)])
        .map(|s: String| s)
        .name("big-records")
        .rebalance()
        .sink_to(sink, "out");
    let err = env
        .execute("big record")
        .expect_err("the record cannot cross the exchange");
    match &err {
        JobError::TaskFailed {
            operator, message, ..
        } => {
            // Raised by the exchange writer at the end of the chain that ends in big-records.
            assert!(operator.contains("big-records"), "{err}");
            assert!(
                message.contains("taskmanager.memory.segment-size"),
                "{message}"
            );
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }
    run_a_healthy_job();
}

#[test]
fn a_receiver_failing_while_its_sender_waits_for_credit_ends_the_job() {
    // Subtask 0 of the map stalls its shard on its first record, so that the other shard's
    // source fills the one-credit ring to it and waits for credit; then it panics. The waiting
    // sender must notice and the job must fail, not hang.
    if common::slots() < 2 {
        return;
    }
    let err = common::within(Duration::from_secs(120), "the failing job", || {
        let env = common::env_with(
            2,
            &[("taskmanager.network.memory.buffers-per-channel", "1")],
        );
        let (sink, _collected) = CollectSink::new();
        env.from_sequence(0, 10_000_000)
            .rebalance()
            .process(|n: u64, ctx: &mut ProcessContext<'_, u64>| {
                if ctx.runtime().subtask == 0 {
                    std::thread::sleep(Duration::from_millis(200));
                    panic!("poison record {POISON} (stalled subtask 0 on {n})");
                }
                ctx.emit(n);
            })
            .name("exploding-map")
            .sink_to(sink, "out");
        env.execute("stalled receiver").map(|_| ())
    })
    .expect_err("the map panics");
    assert_exploded(&err, 0, 2);
}

/// A panic in a key selector is reported as the key selector of the keyed operator — a user
/// error — even though it runs on the sending side, inside the upstream operator's output.
#[test]
fn panic_in_a_key_selector_names_the_keyed_operator() {
    let env = common::env();
    let (sink, _collected) = CollectSink::new();
    env.from_sequence(0, 10_000)
        .map(|n: u64| n + 1)
        .key_by(|n: &u64| {
            if *n == POISON {
                panic!("poison key {n}");
            }
            *n % 10
        })
        .reduce(|a, b| a + b)
        .name("sums")
        .sink_to(sink, "out");
    let err = env.execute("bad key").expect_err("the key selector panics");
    match &err {
        JobError::TaskFailed {
            operator,
            message,
            kind,
            ..
        } => {
            assert_eq!(operator, "key selector of 'sums'", "{err}");
            assert!(message.contains("poison key 777"), "{err}");
            assert_eq!(*kind, weir_engine::error::FailureKind::User, "{err}");
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }
}

/// A panic in a process function's `open` names that operator.
#[test]
fn panic_in_open_names_the_operator() {
    #[derive(Clone)]
    struct FailsToOpen;
    impl ProcessFunction<u64, u64> for FailsToOpen {
        fn open(&mut self, ctx: &RuntimeContext) {
            panic!("cannot open subtask {}", ctx.subtask);
        }
        fn process_element(&mut self, value: u64, ctx: &mut ProcessContext<'_, u64>) {
            ctx.emit(value);
        }
    }
    let env = common::env();
    let (sink, _collected) = CollectSink::new();
    env.from_sequence(0, 100)
        .process(FailsToOpen)
        .name("opener")
        .sink_to(sink, "out");
    let err = env.execute("bad open").expect_err("open panics");
    match &err {
        JobError::TaskFailed {
            operator, message, ..
        } => {
            assert_eq!(operator, "opener", "{err}");
            assert!(message.contains("cannot open subtask"), "{err}");
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }
}

/// Without checkpointing, a restart strategy starts the job again from the beginning; when it
/// runs out, the job fails with the last failure and the setting that ran out.
#[test]
fn a_restart_strategy_restarts_from_the_beginning_until_it_gives_up() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    let strategy = [
        ("restart-strategy.type", "fixed-delay"),
        ("restart-strategy.fixed-delay.attempts", "2"),
        ("restart-strategy.fixed-delay.delay", "10 ms"),
    ];
    // Panics on the poison record the first time only: one restart, then the whole input.
    let env = common::env_with(1, &strategy);
    let failed = Arc::new(AtomicU64::new(0));
    let once = Arc::clone(&failed);
    let (sink, collected) = CollectSink::new();
    env.from_sequence(0, 2_000)
        .map(move |n: u64| {
            if n == POISON && once.fetch_add(1, Ordering::Relaxed) == 0 {
                explode(n)
            } else {
                n
            }
        })
        .name("exploding-map")
        .sink_to(sink, "collect");
    let result = env.execute("once").expect("the restarted job ends");
    assert_eq!(result.restarts.len(), 1, "{:?}", result.restarts);
    assert!(result.restarts[0].cause.contains("poison record 777"));
    assert_eq!(result.restarts[0].delay, Duration::from_millis(10));
    assert_eq!(
        result.records_out("Source: Sequence"),
        2_000,
        "from the beginning"
    );
    // The collect sink is not transactional: what the first run wrote is there too.
    let mut records = collected.records();
    records.sort_unstable();
    records.dedup();
    assert_eq!(records, (0..2_000).collect::<Vec<_>>());

    // Panics every time: two restarts, then the job fails.
    let env = common::env_with(1, &strategy);
    env.from_sequence(0, 2_000)
        .map(explode)
        .name("exploding-map")
        .sink_to(DiscardSink::new(), "discard");
    let err = env.execute("always").expect_err("it keeps failing");
    match &err {
        JobError::RestartsExhausted { restarts, last, .. } => {
            assert_eq!(*restarts, 2, "{err}");
            assert_exploded(last, 0, 1);
        }
        other => panic!("expected RestartsExhausted, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("restart-strategy.fixed-delay.attempts = 2") && text.contains("poison"),
        "{text}"
    );
    run_a_healthy_job();
}
