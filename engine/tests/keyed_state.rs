//! Keyed state in jobs: every test runs on both backends (`state.backend.type: hashmap` and
//! `rocksdb`) and with parallelism 1 and 2, and checks the output against a per-key reference.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use weir_engine::prelude::*;
use weir_engine::state::StateVisibility;

const BACKENDS: [&str; 2] = ["hashmap", "rocksdb"];

fn env(backend: &str, parallelism: usize) -> StreamEnvironment {
    common::env_with(
        parallelism,
        &[
            ("state.backend.type", backend),
            ("parallelism.default", &parallelism.to_string()),
        ],
    )
}

type Event = (String, i64);

/// Random events over `keys` keys, values in 0..1000.
fn events(seed: u64, n: usize, keys: u64) -> Vec<Event> {
    let mut rng = common::XorShift::new(seed);
    (0..n)
        .map(|_| (format!("key-{}", rng.below(keys)), rng.below(1_000) as i64))
        .collect()
}

/// The source runs with parallelism 1 so each key's records arrive in input order.
fn source(env: &StreamEnvironment, input: Vec<Event>) -> DataStream<Event> {
    env.from_source(
        CollectionSource::new(input),
        WatermarkStrategy::no_watermarks(),
        "events",
    )
    .parallelism(1)
}

/// Emits each key's running count, kept in a `ValueState`.
#[derive(Clone)]
struct RunningCount {
    count: ValueStateDescriptor<u64>,
}

impl KeyedProcessFunction<String, Event, (String, u64)> for RunningCount {
    fn process_element(
        &mut self,
        event: Event,
        ctx: &mut KeyedProcessContext<'_, String, (String, u64)>,
    ) {
        let count = ctx.value_state(&self.count);
        let next = count.value().expect("read").unwrap_or(0) + 1;
        count.update(next).expect("write");
        ctx.emit((event.0, next));
    }
}

/// What a running count per key emits for `input`: each key with 1, 2, … up to its number of
/// records (in no particular order across keys).
fn running_counts(input: &[Event]) -> Vec<(String, u64)> {
    let mut totals: HashMap<String, u64> = HashMap::new();
    for (key, _) in input {
        *totals.entry(key.clone()).or_default() += 1;
    }
    totals
        .iter()
        .flat_map(|(key, &n)| (1..=n).map(move |i| (key.clone(), i)))
        .collect()
}

#[test]
fn value_state_keeps_a_count_per_key() {
    let input = events(1, 3_000, 50);
    let expected = running_counts(&input);
    for backend in BACKENDS {
        for parallelism in common::parallelisms() {
            let env = env(backend, parallelism);
            let (sink, out) = CollectSink::new();
            source(&env, input.clone())
                .key_by(|e: &Event| e.0.clone())
                .process(RunningCount {
                    count: ValueStateDescriptor::new("count"),
                })
                .sink_to(sink, "counts");
            env.execute("running-count")
                .unwrap_or_else(|e| panic!("{backend}, parallelism {parallelism}: {e}"));
            common::assert_same_multiset(&out.records(), &expected);
        }
    }
}

/// Per record, updates a list, a map, a reducing and an aggregating state of its key and emits
/// what they hold afterwards.
#[derive(Clone)]
struct AllKinds {
    list: ListStateDescriptor<i64>,
    map: MapStateDescriptor<i64, u32>,
    sum: ReducingStateDescriptor<i64>,
    max: AggregatingStateDescriptor<i64, Option<i64>, i64>,
}

#[derive(Clone)]
struct Max;

impl weir_engine::window::AggregateFunction<i64, Option<i64>, i64> for Max {
    fn create_accumulator(&self) -> Option<i64> {
        None
    }
    fn add(&self, value: i64, accumulator: &mut Option<i64>) {
        *accumulator = Some(accumulator.map_or(value, |max| max.max(value)));
    }
    fn get_result(&self, accumulator: &Option<i64>) -> i64 {
        accumulator.unwrap_or(i64::MIN)
    }
    fn merge(&self, into: &mut Option<i64>, other: &Option<i64>) {
        if let Some(other) = other {
            self.add(*other, into);
        }
    }
}

/// (key, list length, list last, map entries as (bucket, count), sum, max)
type Summary = (String, usize, i64, Vec<(i64, u32)>, i64, i64);

impl KeyedProcessFunction<String, Event, Summary> for AllKinds {
    fn process_element(
        &mut self,
        event: Event,
        ctx: &mut KeyedProcessContext<'_, String, Summary>,
    ) {
        let (key, value) = event;
        let list = ctx.list_state(&self.list);
        list.add(value).expect("list add");
        let map = ctx.map_state(&self.map);
        let bucket = value % 7;
        let seen = map.get(&bucket).expect("map get").unwrap_or(0);
        map.put(bucket, seen + 1).expect("map put");
        let sum = ctx.reducing_state(&self.sum);
        sum.add(value).expect("sum add");
        let max = ctx.aggregating_state(&self.max);
        max.add(value).expect("max add");

        let items = list.get().expect("list get");
        let mut buckets: Vec<(i64, u32)> = map
            .entries()
            .expect("map entries")
            .map(|entry| entry.expect("map entry"))
            .collect();
        buckets.sort_unstable();
        ctx.emit((
            key,
            items.len(),
            *items.last().expect("just added"),
            buckets,
            sum.get().expect("sum").expect("has a sum"),
            max.get().expect("max").expect("has a max"),
        ));
    }
}

#[test]
fn list_map_reducing_and_aggregating_states_match_a_reference() {
    let input = events(2, 1_500, 20);
    let mut expected = Vec::new();
    let mut per_key: HashMap<String, (Vec<i64>, BTreeMap<i64, u32>)> = HashMap::new();
    for (key, value) in &input {
        let (list, map) = per_key.entry(key.clone()).or_default();
        list.push(*value);
        *map.entry(value % 7).or_default() += 1;
        expected.push((
            key.clone(),
            list.len(),
            *value,
            map.iter().map(|(&b, &n)| (b, n)).collect(),
            list.iter().sum(),
            *list.iter().max().expect("not empty"),
        ));
    }
    for backend in BACKENDS {
        for parallelism in common::parallelisms() {
            let env = env(backend, parallelism);
            let (sink, out) = CollectSink::new();
            source(&env, input.clone())
                .key_by(|e: &Event| e.0.clone())
                .process(AllKinds {
                    list: ListStateDescriptor::new("values"),
                    map: MapStateDescriptor::new("buckets"),
                    sum: ReducingStateDescriptor::new("sum", |a: &i64, b: &i64| a + b),
                    max: AggregatingStateDescriptor::new("max", Max),
                })
                .sink_to(sink, "summaries");
            env.execute("all-kinds")
                .unwrap_or_else(|e| panic!("{backend}, parallelism {parallelism}: {e}"));
            common::assert_same_multiset(&out.records(), &expected);
        }
    }
}

/// Stores the record's value under a 50 ms TTL and without one, then reads both back from a
/// processing-time timer 300 ms later.
#[derive(Clone)]
struct Expiring {
    short: ValueStateDescriptor<i64>,
    kept: ValueStateDescriptor<i64>,
}

impl KeyedProcessFunction<String, Event, (String, Option<i64>, Option<i64>)> for Expiring {
    fn process_element(
        &mut self,
        event: Event,
        ctx: &mut KeyedProcessContext<'_, String, (String, Option<i64>, Option<i64>)>,
    ) {
        ctx.value_state(&self.short).update(event.1).expect("write");
        ctx.value_state(&self.kept).update(event.1).expect("write");
        let fire_at = ctx.current_processing_time() + 300;
        ctx.register_processing_time_timer(fire_at);
    }

    fn on_timer(
        &mut self,
        _timestamp: i64,
        ctx: &mut KeyedProcessContext<'_, String, (String, Option<i64>, Option<i64>)>,
    ) {
        let short = ctx.value_state(&self.short).value().expect("read");
        let kept = ctx.value_state(&self.kept).value().expect("read");
        let key = ctx.current_key().clone();
        ctx.emit((key, short, kept));
    }
}

#[test]
fn state_with_a_ttl_expires_and_state_without_one_stays() {
    let input: Vec<Event> = (0..10).map(|i| (format!("key-{i}"), i)).collect();
    for backend in BACKENDS {
        let env = env(backend, 1);
        let (sink, out) = CollectSink::new();
        // The source must still be running when the timers fire: processing-time timers of a
        // finished input are dropped, as in Flink. A slow tail keeps it alive for ~1 s.
        let tail = env
            .from_source(
                DataGeneratorSource::sequence(0, 20).with_rate(20.0),
                WatermarkStrategy::no_watermarks(),
                "tail",
            )
            .filter(|_: &u64| false)
            .map(|n: u64| (String::new(), n as i64));
        source(&env, input.clone())
            .union([tail])
            .key_by(|e: &Event| e.0.clone())
            .process(Expiring {
                short: ValueStateDescriptor::new("short").with_ttl(
                    StateTtlConfig::new(Duration::from_millis(50))
                        .with_visibility(StateVisibility::NeverReturnExpired),
                ),
                kept: ValueStateDescriptor::new("kept"),
            })
            .sink_to(sink, "read-back");
        env.execute("ttl")
            .unwrap_or_else(|e| panic!("{backend}: {e}"));
        let expected: Vec<(String, Option<i64>, Option<i64>)> = input
            .iter()
            .map(|(key, value)| (key.clone(), None, Some(*value)))
            .collect();
        common::assert_same_multiset(&out.records(), &expected);
    }
}

/// Registers "count" as a `ValueState<u64>` and then as a `ValueState<String>`.
/// Counts per key with a descriptor made on every call, and reads the count through one it
/// holds: both name the state "count", so both reach the same state.
#[derive(Clone)]
struct TwoDescriptors {
    held: ValueStateDescriptor<u64>,
}

impl KeyedProcessFunction<String, Event, (String, u64)> for TwoDescriptors {
    fn process_element(
        &mut self,
        event: Event,
        ctx: &mut KeyedProcessContext<'_, String, (String, u64)>,
    ) {
        let per_call = ctx.value_state(&ValueStateDescriptor::<u64>::new("count"));
        let next = per_call.value().expect("read").unwrap_or(0) + 1;
        per_call.update(next).expect("write");
        let held = ctx.value_state(&self.held).value().expect("read");
        ctx.emit((event.0, held.expect("the same state")));
    }
}

#[test]
fn descriptors_of_one_name_reach_one_state_even_when_made_per_call() {
    let input = events(2, 2_000, 20);
    let expected = running_counts(&input);
    for backend in BACKENDS {
        let env = env(backend, 1);
        let (sink, out) = CollectSink::new();
        source(&env, input.clone())
            .key_by(|e: &Event| e.0.clone())
            .process(TwoDescriptors {
                held: ValueStateDescriptor::new("count"),
            })
            .sink_to(sink, "counts");
        env.execute("two-descriptors")
            .unwrap_or_else(|e| panic!("{backend}: {e}"));
        common::assert_same_multiset(&out.records(), &expected);
    }
}

#[derive(Clone)]
struct Conflicting;

impl KeyedProcessFunction<String, Event, u64> for Conflicting {
    fn process_element(&mut self, _event: Event, ctx: &mut KeyedProcessContext<'_, String, u64>) {
        ctx.value_state(&ValueStateDescriptor::<u64>::new("count"));
        ctx.value_state(&ValueStateDescriptor::<String>::new("count"));
    }
}

#[test]
fn one_name_with_two_types_fails_the_job_naming_the_state() {
    for backend in BACKENDS {
        let env = env(backend, 1);
        source(&env, events(3, 10, 3))
            .key_by(|e: &Event| e.0.clone())
            .process(Conflicting)
            .name("conflicting")
            .sink_to(DiscardSink::new(), "nothing");
        let error = env
            .execute("conflict")
            .expect_err("the job fails")
            .to_string();
        assert!(
            error.contains("conflicting")
                && error.contains("state 'count' is already registered as")
                && error.contains("give one of them another name"),
            "{backend}: {error}"
        );
    }
}

#[test]
fn an_unknown_backend_is_refused_naming_the_choices() {
    let error = Configuration::default()
        .with("state.backend.type", "rocks")
        .expect_err("refused")
        .to_string();
    assert!(
        error.contains("state.backend.type") && error.contains("hashmap, heap, rocksdb"),
        "{error}"
    );
}
