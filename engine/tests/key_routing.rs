//! `key_by` routes every key to exactly one subtask: the one that owns its key group
//! (`KeyGroup::of(key, max_parallelism).subtask(max_parallelism, parallelism)`).

mod common;

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;

use weir_engine::prelude::*;
use weir_engine::Key;
use weir_state::KeyGroup;

/// Asserts that every key of `seen` (key, subtask) pairs appears with one subtask only, the
/// one its key group maps to.
#[track_caller]
fn assert_routed_by_key_group<K: Hash + Eq + Debug>(
    seen: &[(K, usize)],
    max_parallelism: u32,
    parallelism: usize,
) {
    let mut owners: HashMap<&K, HashSet<usize>> = HashMap::new();
    for (key, subtask) in seen {
        owners.entry(key).or_default().insert(*subtask);
    }
    for (key, subtasks) in &owners {
        assert_eq!(
            subtasks.len(),
            1,
            "key {key:?} reached subtasks {subtasks:?}"
        );
        let expected = KeyGroup::of(*key, max_parallelism)
            .subtask(max_parallelism, parallelism as u32) as usize;
        let actual = *subtasks.iter().next().expect("one subtask");
        assert_eq!(actual, expected, "key {key:?} went to the wrong subtask");
    }
}

/// Runs `records` through `key_by(key) -> process(emit (key, subtask))` and returns the pairs.
fn route<T, K>(
    env: &StreamEnvironment,
    records: Vec<T>,
    key: impl Fn(&T) -> K + Clone + Send + Sync + 'static,
) -> Vec<(K, usize)>
where
    T: weir_engine::Record + Sync,
    K: Key,
    (K, usize): weir_engine::Record,
{
    let (sink, collected) = CollectSink::new();
    env.from_collection(records)
        .key_by(key)
        .process(
            |_record: T, ctx: &mut KeyedProcessContext<'_, K, (K, usize)>| {
                let pair = (ctx.current_key().clone(), ctx.runtime().subtask);
                ctx.emit(pair);
            },
        )
        .name("where")
        .sink_to(sink, "pairs");
    env.execute("key routing").expect("the job succeeds");
    collected.records()
}

#[test]
fn integer_keys_go_to_their_key_group_subtask() {
    let parallelism = common::slots();
    let env = common::env();
    let records: Vec<(u64, u64)> = (0..5_000).map(|i| (i % 1_000, i)).collect();
    let seen = route(&env, records, |r: &(u64, u64)| r.0);
    assert_eq!(
        seen.len(),
        5_000,
        "every record reached the process function"
    );
    assert_eq!(
        seen.iter().map(|(k, _)| *k).collect::<HashSet<_>>().len(),
        1_000,
        "every key arrived"
    );
    assert_routed_by_key_group(&seen, 128, parallelism);
    if parallelism > 1 {
        let used: HashSet<usize> = seen.iter().map(|(_, s)| *s).collect();
        assert_eq!(
            used.len(),
            parallelism,
            "1000 keys spread over every subtask"
        );
    }
}

#[test]
fn string_keys_go_to_their_key_group_subtask() {
    let parallelism = common::slots();
    let env = common::env();
    let records: Vec<String> = (0..3_000).map(|i| format!("user-{}", i % 300)).collect();
    let seen = route(&env, records, |r: &String| r.clone());
    assert_eq!(seen.len(), 3_000);
    assert_routed_by_key_group(&seen, 128, parallelism);
}

#[test]
fn routing_follows_a_configured_max_parallelism() {
    let parallelism = common::slots();
    let env = common::env_with(parallelism, &[("pipeline.max-parallelism", "7")]);
    let records: Vec<u32> = (0..2_000).collect();
    let seen = route(&env, records, |r: &u32| r % 97);
    assert_eq!(seen.len(), 2_000);
    assert_routed_by_key_group(&seen, 7, parallelism);
}

#[test]
fn keys_from_a_union_of_sources_meet_in_one_subtask() {
    let parallelism = common::slots();
    let env = common::env();
    let left = env.from_collection((0..2_000u64).collect::<Vec<_>>());
    let right = env.from_sequence(0, 2_000).map(|n: u64| n + 1_000);
    let (sink, collected) = CollectSink::new();
    left.union([right])
        .key_by(|n: &u64| n % 500)
        .process(
            |_n: u64, ctx: &mut KeyedProcessContext<'_, u64, (u64, usize)>| {
                let pair = (*ctx.current_key(), ctx.runtime().subtask);
                ctx.emit(pair);
            },
        )
        .sink_to(sink, "pairs");
    env.execute("union routing").expect("the job succeeds");
    let seen = collected.records();
    assert_eq!(seen.len(), 4_000);
    assert_routed_by_key_group(&seen, 128, parallelism);
}

#[test]
fn keyed_operator_with_lower_parallelism_routes_over_its_own_subtasks() {
    // Source at full parallelism, keyed operator at parallelism 1: everything meets there.
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_sequence(0, 1_000)
        .key_by(|n: &u64| n % 10)
        .process(
            |_n: u64, ctx: &mut KeyedProcessContext<'_, u64, (u64, usize)>| {
                let pair = (*ctx.current_key(), ctx.runtime().subtask);
                ctx.emit(pair);
            },
        )
        .parallelism(1)
        .sink_to(sink, "pairs");
    env.execute("narrow keyed").expect("the job succeeds");
    let seen = collected.records();
    assert_eq!(seen.len(), 1_000);
    assert!(seen.iter().all(|(_, s)| *s == 0));
    assert_routed_by_key_group(&seen, 128, 1);
}
