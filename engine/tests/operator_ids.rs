//! Operator ids: stable across edits elsewhere in the job, distinct for uids that would escape
//! alike, and never shared between a uid and an operator without one — checked on the plan and
//! by running jobs whose operators would share RocksDB column families if their ids collided.

mod common;

use std::collections::{BTreeMap, HashMap};

use weir_engine::graph::OperatorId;
use weir_engine::prelude::*;

/// The id of each running node, by name (names are unique in these jobs).
fn ids(env: &StreamEnvironment) -> HashMap<String, OperatorId> {
    let plan = env.plan("ids").expect("plan");
    let job = &plan.job;
    job.stream_graph()
        .node_infos()
        .into_iter()
        .filter(|node| job.node_parallelism[node.id] > 0)
        .map(|node| (node.name, job.operator_ids[node.id]))
        .collect()
}

/// source -> "double" -> key_by -> "count" (a running count per key) -> sink "counts".
fn pipeline(env: &StreamEnvironment, map_name: &str) {
    env.from_source(
        CollectionSource::new((0..10u64).collect()),
        WatermarkStrategy::no_watermarks(),
        "events",
    )
    .map(|n: u64| n * 2)
    .name(map_name)
    .key_by(|n: &u64| n % 3)
    .reduce(|a, b| a + b)
    .name("count")
    .sink_to(CollectSink::new().0, "counts");
}

/// An unrelated branch: its own source, a filter and a sink.
fn other_branch(env: &StreamEnvironment) {
    env.from_sequence(0, 5)
        .filter(|n: &u64| n.is_multiple_of(2))
        .name("evens")
        .sink_to(CollectSink::new().0, "evens out");
}

#[test]
fn ids_do_not_move_when_an_unrelated_branch_is_added_before() {
    let alone = common::env();
    pipeline(&alone, "double");
    let with_other = common::env();
    other_branch(&with_other);
    pipeline(&with_other, "double");
    let (alone, with_other) = (ids(&alone), ids(&with_other));
    for name in ["Source: events", "double", "count", "Sink: counts"] {
        assert_eq!(alone[name], with_other[name], "{name}");
    }
    // All ids in one job differ.
    let mut distinct: Vec<OperatorId> = with_other.values().copied().collect();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), with_other.len(), "{with_other:?}");
}

#[test]
fn an_edit_upstream_moves_an_operator_without_a_uid_but_not_one_with() {
    let before = common::env();
    pipeline(&before, "double");
    let after = common::env();
    pipeline(&after, "triple");
    let (before, after) = (ids(&before), ids(&after));
    assert_eq!(before["Source: events"], after["Source: events"]);
    assert_ne!(before["count"], after["count"], "derived from its inputs");

    // With uids, the edit changes neither.
    let uids = |map_name: &str| {
        let env = common::env();
        env.from_sequence(0, 10)
            .map(|n: u64| n * 2)
            .name(map_name)
            .key_by(|n: &u64| n % 3)
            .reduce(|a, b| a + b)
            .name("count")
            .uid("count")
            .sink_to(CollectSink::new().0, "counts")
            .uid("counts");
        ids(&env)
    };
    let (before, after) = (uids("double"), uids("triple"));
    assert_eq!(before["count"], OperatorId::from_uid("count"));
    assert_eq!(after["count"], OperatorId::from_uid("count"));
    assert_eq!(before["Sink: counts"], after["Sink: counts"]);
}

#[test]
fn twins_of_one_stream_get_their_own_ids() {
    let env = common::env();
    let numbers = env.from_sequence(0, 10);
    for sink in ["first", "second"] {
        numbers
            .clone()
            .map(|n: u64| n + 1)
            .name("twin")
            .sink_to(CollectSink::new().0, sink);
    }
    let plan = env.plan("twins").expect("plan");
    let job = &plan.job;
    let twins: Vec<OperatorId> = job
        .stream_graph()
        .node_infos()
        .iter()
        .filter(|node| node.name == "twin")
        .map(|node| job.operator_ids[node.id])
        .collect();
    assert_eq!(twins.len(), 2);
    assert_ne!(twins[0], twins[1]);
}

#[test]
fn stateful_operators_without_a_uid_are_named() {
    let env = common::env();
    env.from_sequence(0, 10)
        .uid("numbers")
        .key_by(|n: &u64| n % 2)
        .reduce(|a, b| a + b)
        .name("sums")
        .map(|n: u64| n + 1)
        .name("plus one")
        .key_by(|n: &u64| n % 3)
        .reduce(|a, b| a.max(b))
        .name("maxima")
        .uid("maxima")
        .sink_to(CollectSink::new().0, "out");
    let plan = env.plan("uids").expect("plan");
    assert_eq!(plan.job.stateful_without_uid(), ["sums"]);
    let explained = env.explain("uids").expect("explain");
    assert!(
        explained.contains(&format!("id={}", OperatorId::from_uid("maxima"))),
        "{explained}"
    );
}

/// Emits each key's running count, kept in a value state named "count".
#[derive(Clone)]
struct RunningCount {
    count: ValueStateDescriptor<u64>,
}

impl KeyedProcessFunction<u64, u64, (u64, u64)> for RunningCount {
    fn process_element(&mut self, n: u64, ctx: &mut KeyedProcessContext<'_, u64, (u64, u64)>) {
        let count = ctx.value_state(&self.count);
        let next = count.value().expect("read").unwrap_or(0) + 1;
        count.update(next).expect("write");
        ctx.emit((n % 4, next));
    }
}

/// Four running counts of one stream, each with a state named "count": one with the uid
/// `node-3`, one without a uid that is the job's node 3, and two with the uids `a:b` and `a_b`.
/// Each must count alone: operators whose ids collided (as these did when ids were the uid with
/// ':' escaped, or `node-N`) would share a RocksDB column family and count records twice.
#[test]
fn operators_whose_ids_once_collided_keep_their_own_state() {
    let records = 400u64;
    // Per key: how many counts came out, and the highest (each key has a quarter of the records).
    let summary = |counts: Vec<(u64, u64)>| {
        let mut per_key: BTreeMap<u64, (usize, u64)> = BTreeMap::new();
        for (key, count) in counts {
            let entry = per_key.entry(key).or_default();
            entry.0 += 1;
            entry.1 = entry.1.max(count);
        }
        per_key
    };
    let quarter = records / 4;
    let expected: BTreeMap<u64, (usize, u64)> = (0..4)
        .map(|key| (key, (quarter as usize, quarter)))
        .collect();
    for backend in ["hashmap", "rocksdb"] {
        for parallelism in common::parallelisms() {
            let env = common::env_with(
                parallelism,
                &[
                    ("state.backend.type", backend),
                    ("parallelism.default", &parallelism.to_string()),
                ],
            );
            // Node 0.
            let numbers = env.from_sequence(0, records).uid("numbers");
            let count = || RunningCount {
                count: ValueStateDescriptor::new("count"),
            };
            let mut outputs = Vec::new();
            // Operator and sink: nodes 1 and 2, 3 and 4, 5 and 6, 7 and 8.
            for uid in [Some("node-3"), None, Some("a:b"), Some("a_b")] {
                let (sink, out) = CollectSink::new();
                let counted = numbers.clone().key_by(|n: &u64| n % 4).process(count());
                let counted = match uid {
                    Some(uid) => counted.uid(uid),
                    None => counted,
                };
                counted.sink_to(sink, &format!("out {uid:?}"));
                outputs.push((uid, out));
            }
            let plan = env.plan("collisions").expect("plan");
            assert_eq!(
                plan.job.stream_graph().node_infos()[3].name,
                "Keyed Process",
                "the operator without a uid is node 3"
            );
            env.execute("collisions")
                .unwrap_or_else(|e| panic!("{backend}, parallelism {parallelism}: {e}"));
            for (uid, out) in outputs {
                assert_eq!(
                    summary(out.records()),
                    expected,
                    "{backend}, parallelism {parallelism}, uid {uid:?}"
                );
            }
        }
    }
}
