//! The keyed-state suite: every test body runs against the heap backend, the RocksDB backend,
//! and RocksDB behind a write-back cache that evicts all the time.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{Fixture, Kind};
use rkyv::{Archive, Deserialize, Serialize};
use weir_state::{
    AggregateFunction, AggregatingStateDescriptor, KeyGroup, KeyGroupRange, KeyedBackendConfig,
    ListStateDescriptor, LocalKeyedBackend, MapStateDescriptor, ReducingStateDescriptor,
    StateErrorKind, StateTtlConfig, TtlUpdateType, ValueStateDescriptor,
};

/// A window namespace, as the window operator would use.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
struct Window {
    start: i64,
    end: i64,
}

fn window(start: i64) -> Window {
    Window {
        start,
        end: start + 10,
    }
}

macro_rules! backend_suite {
    ($($test:ident),* $(,)?) => {
        mod heap {
            $(
                #[test]
                fn $test() {
                    super::$test(&super::Fixture::heap());
                }
            )*
        }

        mod rocksdb {
            $(
                #[test]
                fn $test() {
                    super::$test(&super::Fixture::rocksdb());
                }
            )*
        }

        mod rocksdb_evicting {
            $(
                #[test]
                fn $test() {
                    super::$test(&super::Fixture::rocksdb_evicting());
                }
            )*
        }
    };
}

backend_suite!(
    value_state_per_key,
    value_state_per_namespace,
    value_state_updates_in_place,
    values_of_new_keys_are_inserted,
    list_state_semantics,
    map_state_semantics,
    map_iteration_spans_chunks,
    reducing_state_folds,
    aggregating_state_averages,
    key_group_range_keys_and_deletion,
    subtask_backend_rejects_foreign_keys,
    ttl_value_expires_on_create_and_write,
    ttl_value_refreshes_on_read_and_write,
    ttl_list_elements_expire_individually,
    ttl_map_entries_expire_individually,
    ttl_reducing_and_aggregating_expire,
    registration_conflicts_name_the_state,
    same_descriptor_shares_state,
    access_without_key_is_an_error,
    state_sizes_are_reported,
);

fn value_state_per_key(f: &Fixture) {
    let backend: LocalKeyedBackend<String> = f.backend(128);
    let count = backend
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    let name = backend
        .value_state(&ValueStateDescriptor::<String>::new("name"))
        .unwrap();
    for (key, n) in [("a", 1u64), ("b", 2), ("c", 3)] {
        backend.set_current_key(&key.to_string()).unwrap();
        assert_eq!(count.value().unwrap(), None);
        count.update(n).unwrap();
        name.update(format!("name-{key}")).unwrap();
    }
    for (key, n) in [("a", 1u64), ("b", 2), ("c", 3)] {
        backend.set_current_key(&key.to_string()).unwrap();
        assert_eq!(count.value().unwrap(), Some(n));
        assert_eq!(name.value().unwrap(), Some(format!("name-{key}")));
    }
    backend.set_current_key(&"b".to_string()).unwrap();
    count.clear().unwrap();
    assert_eq!(count.value().unwrap(), None);
    assert_eq!(name.value().unwrap(), Some("name-b".to_string()));
    backend.set_current_key(&"a".to_string()).unwrap();
    assert_eq!(count.value().unwrap(), Some(1));
    assert_eq!(backend.current_key(), Some("a".to_string()));
    assert_eq!(
        backend.current_key_group(),
        Some(KeyGroup::of(&"a".to_string(), 128))
    );
}

fn value_state_updates_in_place(f: &Fixture) {
    let backend: LocalKeyedBackend<u8> = f.backend(128);
    let held = backend
        .value_state(&ValueStateDescriptor::<Vec<u32>>::new("held"))
        .unwrap();
    backend.set_current_key(&1).unwrap();
    // No value: `None` stores nothing, `Some` stores it.
    held.update_with(|current| {
        assert_eq!(current, None);
        None
    })
    .unwrap();
    assert_eq!(held.value().unwrap(), None);
    held.update_with(|_| Some(vec![1])).unwrap();
    // A value: changed in place (returning `None` keeps the change), or replaced.
    held.update_with(|current| {
        current.expect("stored").push(2);
        None
    })
    .unwrap();
    assert_eq!(held.value().unwrap(), Some(vec![1, 2]));
    held.update_with(|current| {
        current.expect("stored").push(3);
        Some(vec![9])
    })
    .unwrap();
    assert_eq!(held.value().unwrap(), Some(vec![9]));
    // Another key is untouched, and starts with none.
    backend.set_current_key(&2).unwrap();
    held.update_with(|current| {
        assert_eq!(current, None);
        Some(vec![5])
    })
    .unwrap();
    backend.set_current_key(&1).unwrap();
    assert_eq!(held.value().unwrap(), Some(vec![9]));
    // `update_or_init`: changed in place, or started from `init` for a key without a value.
    held.update_or_init(
        || unreachable!("a value is stored"),
        |current| current.push(4),
    )
    .unwrap();
    assert_eq!(held.value().unwrap(), Some(vec![9, 4]));
    backend.set_current_key(&3).unwrap();
    held.update_or_init(|| vec![7], |current| current.push(8))
        .unwrap();
    assert_eq!(held.value().unwrap(), Some(vec![7, 8]));
    backend.set_current_key(&1).unwrap();

    // With TTL it is a write (refreshes the expiry), and an expired value is none.
    let expiring = backend
        .value_state(&ValueStateDescriptor::<u64>::new("expiring").with_ttl(ttl(100)))
        .unwrap();
    expiring.update(1).unwrap();
    f.clock.advance(Duration::from_millis(60));
    expiring
        .update_with(|current| {
            *current.expect("live") += 1;
            None
        })
        .unwrap();
    f.clock.advance(Duration::from_millis(60));
    assert_eq!(
        expiring.value().unwrap(),
        Some(2),
        "refreshed by the change"
    );
    f.clock.advance(Duration::from_millis(100));
    expiring
        .update_with(|current| {
            assert_eq!(current, None, "expired");
            Some(7)
        })
        .unwrap();
    assert_eq!(expiring.value().unwrap(), Some(7));
}

/// `insert_new` sets the first value of a key (here: a key in a namespace never used) as
/// `update` does, on every backend — on RocksDB without a read, whether the value is still
/// cached when it changes or is cleared, or was evicted to RocksDB on the way.
fn values_of_new_keys_are_inserted(f: &Fixture) {
    let backend: LocalKeyedBackend<u64, u64> = f.backend(128);
    let count = backend
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    let keys = 0..2_000u64;
    for key in keys.clone() {
        backend
            .set_current_key_and_namespace(&key, key % 3)
            .unwrap();
        count.insert_new(key).unwrap();
        count
            .update_or_init(|| unreachable!("inserted"), |value| *value += 1)
            .unwrap();
    }
    for key in keys.clone() {
        backend.set_current_key(&key).unwrap();
        backend.set_current_namespace(key % 3 + 1).unwrap();
        assert_eq!(
            count.value().unwrap(),
            None,
            "another namespace of key {key}"
        );
        backend.set_current_namespace(key % 3).unwrap();
        assert_eq!(count.value().unwrap(), Some(key + 1), "key {key}");
        if key % 2 == 0 {
            count.clear().unwrap();
        }
    }
    for key in keys {
        backend
            .set_current_key_and_namespace(&key, key % 3)
            .unwrap();
        let expected = (key % 2 == 1).then_some(key + 1);
        assert_eq!(
            count.value().unwrap(),
            expected,
            "key {key} after clearing the even ones"
        );
    }
}

fn value_state_per_namespace(f: &Fixture) {
    let backend: LocalKeyedBackend<u32, Window> = f.backend(128);
    let sum = backend
        .value_state(&ValueStateDescriptor::<i64>::new("sum"))
        .unwrap();
    backend.set_current_key(&7).unwrap();
    sum.update(-1).unwrap();
    for start in [0, 10, 20] {
        backend.set_current_namespace(window(start)).unwrap();
        sum.update(start * 100).unwrap();
    }
    // Namespace survives a key change; each (key, namespace) is separate.
    backend.set_current_key(&8).unwrap();
    assert_eq!(backend.current_namespace(), Some(window(20)));
    assert_eq!(sum.value().unwrap(), None);
    sum.update(8).unwrap();
    backend.set_current_key(&7).unwrap();
    for start in [0, 10, 20] {
        backend.set_current_namespace(window(start)).unwrap();
        assert_eq!(sum.value().unwrap(), Some(start * 100));
    }
    backend.set_current_namespace(window(10)).unwrap();
    sum.clear().unwrap();
    assert_eq!(sum.value().unwrap(), None);
    backend.set_current_namespace(window(20)).unwrap();
    assert_eq!(sum.value().unwrap(), Some(2000));
    backend.clear_current_namespace().unwrap();
    assert_eq!(sum.value().unwrap(), Some(-1));
    // Namespace set before the first key.
    let fresh: LocalKeyedBackend<u32, Window> =
        f.backend_for(KeyedBackendConfig::single(128), "fresh");
    let other = fresh
        .value_state(&ValueStateDescriptor::<i64>::new("sum"))
        .unwrap();
    fresh.set_current_namespace(window(30)).unwrap();
    fresh.set_current_key(&7).unwrap();
    assert_eq!(other.value().unwrap(), None);
    other.update(30).unwrap();
    fresh.clear_current_namespace().unwrap();
    assert_eq!(other.value().unwrap(), None);
}

fn list_state_semantics(f: &Fixture) {
    let backend: LocalKeyedBackend<u64> = f.backend(128);
    let list = backend
        .list_state(&ListStateDescriptor::<String>::new("events"))
        .unwrap();
    backend.set_current_key(&1).unwrap();
    assert!(list.get().unwrap().is_empty());
    list.add("a".into()).unwrap();
    list.add("b".into()).unwrap();
    list.add_all(["c".to_string(), "d".to_string()]).unwrap();
    list.add_all(Vec::<String>::new()).unwrap();
    assert_eq!(list.get().unwrap(), ["a", "b", "c", "d"]);
    backend.set_current_key(&2).unwrap();
    assert!(list.get().unwrap().is_empty());
    list.add("x".into()).unwrap();
    backend.set_current_key(&1).unwrap();
    list.update(["z".to_string()]).unwrap();
    assert_eq!(list.get().unwrap(), ["z"]);
    list.add("y".into()).unwrap();
    assert_eq!(list.get().unwrap(), ["z", "y"]);
    list.update(Vec::<String>::new()).unwrap();
    assert!(list.get().unwrap().is_empty());
    backend.set_current_key(&2).unwrap();
    assert_eq!(list.get().unwrap(), ["x"]);
    list.clear().unwrap();
    assert!(list.get().unwrap().is_empty());
}

fn map_state_semantics(f: &Fixture) {
    let backend: LocalKeyedBackend<String> = f.backend(128);
    let map = backend
        .map_state(&MapStateDescriptor::<String, u32>::new("counts"))
        .unwrap();
    backend.set_current_key(&"k1".to_string()).unwrap();
    assert!(map.is_empty().unwrap());
    map.put("x".into(), 1).unwrap();
    map.put("y".into(), 2).unwrap();
    map.put("x".into(), 3).unwrap();
    map.put_all([("z".to_string(), 4), ("w".to_string(), 5)])
        .unwrap();
    assert_eq!(map.get(&"x".to_string()).unwrap(), Some(3));
    assert_eq!(map.get(&"nope".to_string()).unwrap(), None);
    assert!(map.contains(&"y".to_string()).unwrap());
    assert!(!map.contains(&"nope".to_string()).unwrap());
    assert!(!map.is_empty().unwrap());
    map.remove(&"y".to_string()).unwrap();
    map.remove(&"nope".to_string()).unwrap();
    assert!(!map.contains(&"y".to_string()).unwrap());
    let entries: BTreeMap<String, u32> = map.entries().unwrap().map(Result::unwrap).collect();
    assert_eq!(
        entries,
        BTreeMap::from([("w".into(), 5), ("x".into(), 3), ("z".into(), 4)])
    );
    let keys: BTreeSet<String> = map.keys().unwrap().map(Result::unwrap).collect();
    assert_eq!(keys, BTreeSet::from(["w".into(), "x".into(), "z".into()]));
    let mut values: Vec<u32> = map.values().unwrap().map(Result::unwrap).collect();
    values.sort();
    assert_eq!(values, [3, 4, 5]);

    // Another key's map is separate, and a key that is a prefix of another does not leak.
    backend.set_current_key(&"k".to_string()).unwrap();
    assert!(map.is_empty().unwrap());
    map.put("only".into(), 9).unwrap();
    assert_eq!(map.entries().unwrap().count(), 1);
    backend.set_current_key(&"k1".to_string()).unwrap();
    assert_eq!(map.entries().unwrap().count(), 3);
    map.clear().unwrap();
    assert!(map.is_empty().unwrap());
    assert_eq!(map.get(&"x".to_string()).unwrap(), None);
    backend.set_current_key(&"k".to_string()).unwrap();
    assert_eq!(map.get(&"only".to_string()).unwrap(), Some(9));
}

fn map_iteration_spans_chunks(f: &Fixture) {
    let backend: LocalKeyedBackend<u32> = f.backend(128);
    let map = backend
        .map_state(&MapStateDescriptor::<u32, String>::new("big"))
        .unwrap();
    backend.set_current_key(&1).unwrap();
    map.put_all((0..1000u32).map(|i| (i, format!("v{i}"))))
        .unwrap();
    backend.set_current_key(&2).unwrap();
    map.put(5, "other".into()).unwrap();
    backend.set_current_key(&1).unwrap();
    let entries: BTreeMap<u32, String> = map.entries().unwrap().map(Result::unwrap).collect();
    assert_eq!(entries.len(), 1000);
    assert!(entries.iter().all(|(k, v)| *v == format!("v{k}")));
    let mut visited = BTreeMap::new();
    map.for_each(|key, value| {
        visited.insert(*key, value.clone());
        Ok(())
    })
    .unwrap();
    assert_eq!(visited, entries, "for_each lends what entries yields");
    let mut lent = 0;
    let stopped = map.for_each(|_, _| {
        lent += 1;
        if lent == 10 {
            return Err(weir_state::StateError::encoding(
                "big",
                "String",
                "stop at 10",
            ));
        }
        Ok(())
    });
    assert!(
        stopped.is_err() && lent == 10,
        "the first error stops the visit"
    );
    // Writes while iterating do not break the iteration.
    let mut seen = 0;
    for entry in map.entries().unwrap() {
        let (key, _) = entry.unwrap();
        if key % 2 == 0 {
            map.remove(&key).unwrap();
        }
        seen += 1;
    }
    assert_eq!(seen, 1000);
    assert_eq!(map.entries().unwrap().count(), 500);
}

fn reducing_state_folds(f: &Fixture) {
    let backend: LocalKeyedBackend<u8> = f.backend(128);
    let max = backend
        .reducing_state(&ReducingStateDescriptor::new("max", |a: &i64, b: &i64| {
            *a.max(b)
        }))
        .unwrap();
    let concat = backend
        .reducing_state(&ReducingStateDescriptor::new(
            "concat",
            |a: &String, b: &String| format!("{a}{b}"),
        ))
        .unwrap();
    backend.set_current_key(&1).unwrap();
    assert_eq!(max.get().unwrap(), None);
    for v in [3, -1, 7, 2] {
        max.add(v).unwrap();
        concat.add(v.to_string()).unwrap();
    }
    assert_eq!(max.get().unwrap(), Some(7));
    assert_eq!(concat.get().unwrap(), Some("3-172".to_string()));
    backend.set_current_key(&2).unwrap();
    max.add(-5).unwrap();
    assert_eq!(max.get().unwrap(), Some(-5));
    max.clear().unwrap();
    assert_eq!(max.get().unwrap(), None);
    backend.set_current_key(&1).unwrap();
    assert_eq!(max.get().unwrap(), Some(7));
}

struct Average;

impl AggregateFunction<u32, (u64, u64), f64> for Average {
    fn create_accumulator(&self) -> (u64, u64) {
        (0, 0)
    }
    fn add(&self, value: u32, accumulator: &mut (u64, u64)) {
        accumulator.0 += u64::from(value);
        accumulator.1 += 1;
    }
    fn get_result(&self, accumulator: &(u64, u64)) -> f64 {
        accumulator.0 as f64 / accumulator.1 as f64
    }
    fn merge(&self, into: &mut (u64, u64), other: &(u64, u64)) {
        into.0 += other.0;
        into.1 += other.1;
    }
}

fn aggregating_state_averages(f: &Fixture) {
    let backend: LocalKeyedBackend<u8, Window> = f.backend(128);
    let average = backend
        .aggregating_state(&AggregatingStateDescriptor::new("avg", Average))
        .unwrap();
    backend.set_current_key(&1).unwrap();
    backend.set_current_namespace(window(0)).unwrap();
    assert_eq!(average.get().unwrap(), None);
    for v in [1, 2, 3, 6] {
        average.add(v).unwrap();
    }
    assert_eq!(average.get().unwrap(), Some(3.0));
    backend.set_current_namespace(window(10)).unwrap();
    average.add(10).unwrap();
    assert_eq!(average.get().unwrap(), Some(10.0));
    average.clear().unwrap();
    assert_eq!(average.get().unwrap(), None);
    backend.set_current_namespace(window(0)).unwrap();
    assert_eq!(average.get().unwrap(), Some(3.0));
    let mut merged = (1, 1);
    Average.merge(&mut merged, &(3, 1));
    assert_eq!(merged, (4, 2));
}

fn key_group_range_keys_and_deletion(f: &Fixture) {
    const MAX: u32 = 16;
    let backend: LocalKeyedBackend<u64, Window> = f.backend(MAX);
    let value = backend
        .value_state(&ValueStateDescriptor::<u64>::new("v"))
        .unwrap();
    let list = backend
        .list_state(&ListStateDescriptor::<u64>::new("l"))
        .unwrap();
    let map = backend
        .map_state(&MapStateDescriptor::<u64, u64>::new("m"))
        .unwrap();
    let keys: Vec<u64> = (0..200).collect();
    for &key in &keys {
        backend.set_current_key(&key).unwrap();
        value.update(key).unwrap();
        list.add(key).unwrap();
        map.put(1, key).unwrap();
        map.put(2, key).unwrap();
        if key % 10 == 0 {
            backend.set_current_namespace(window(0)).unwrap();
            value.update(key + 1).unwrap();
            backend.clear_current_namespace().unwrap();
        }
    }
    let low = KeyGroupRange { start: 0, end: 7 };
    let high = KeyGroupRange { start: 8, end: 15 };
    let in_range = |range: KeyGroupRange| -> BTreeSet<u64> {
        keys.iter()
            .copied()
            .filter(|key| range.contains(KeyGroup::of(key, MAX)))
            .collect()
    };
    for state in ["v", "l", "m"] {
        let found: Vec<(u64, Option<Window>)> = backend.keys(state, low).unwrap();
        let plain: BTreeSet<u64> = found
            .iter()
            .filter(|(_, ns)| ns.is_none())
            .map(|(k, _)| *k)
            .collect();
        assert_eq!(plain, in_range(low), "state {state}");
        // One pair per (key, namespace), even for maps with several entries.
        assert_eq!(found.len(), {
            let windows = if state == "v" {
                in_range(low).iter().filter(|k| *k % 10 == 0).count()
            } else {
                0
            };
            plain.len() + windows
        });
    }
    backend.delete_key_groups(low).unwrap();
    for state in ["v", "l", "m"] {
        assert!(backend.keys(state, low).unwrap().is_empty());
        let high_keys: BTreeSet<u64> = backend
            .keys(state, high)
            .unwrap()
            .into_iter()
            .filter(|(_, ns)| ns.is_none())
            .map(|(k, _)| k)
            .collect();
        assert_eq!(high_keys, in_range(high));
    }
    for &key in &keys {
        backend.set_current_key(&key).unwrap();
        let kept = high.contains(KeyGroup::of(&key, MAX));
        assert_eq!(value.value().unwrap().is_some(), kept, "key {key}");
        assert_eq!(list.get().unwrap().len(), usize::from(kept));
        assert_eq!(map.entries().unwrap().count(), if kept { 2 } else { 0 });
    }
}

fn subtask_backend_rejects_foreign_keys(f: &Fixture) {
    let config = KeyedBackendConfig::for_subtask(128, 4, 1);
    let backend: LocalKeyedBackend<u64> = f.backend_for(config, "sub");
    let mine = (0u64..)
        .find(|key| config.key_groups.contains(KeyGroup::of(key, 128)))
        .unwrap();
    let foreign = (0u64..)
        .find(|key| !config.key_groups.contains(KeyGroup::of(key, 128)))
        .unwrap();
    backend.set_current_key(&mine).unwrap();
    let err = backend.set_current_key(&foreign).unwrap_err();
    assert!(matches!(
        err.kind(),
        StateErrorKind::KeyGroupOutOfRange { .. }
    ));
    let text = err.to_string();
    assert!(text.contains(&format!("key {foreign}")), "{text}");
    assert!(text.contains("32..=63"), "{text}");
    assert!(err.is_usage_error());
}

fn ttl(ms: u64) -> StateTtlConfig {
    StateTtlConfig::new(Duration::from_millis(ms))
}

fn ttl_value_expires_on_create_and_write(f: &Fixture) {
    let backend: LocalKeyedBackend<u32> = f.backend(128);
    let value = backend
        .value_state(&ValueStateDescriptor::<u64>::new("v").with_ttl(ttl(100)))
        .unwrap();
    backend.set_current_key(&1).unwrap();
    value.update(10).unwrap();
    backend.set_current_key(&2).unwrap();
    value.update(20).unwrap();
    f.clock.advance(Duration::from_millis(60));
    backend.set_current_key(&1).unwrap();
    assert_eq!(value.value().unwrap(), Some(10)); // a read does not refresh
    backend.set_current_key(&2).unwrap();
    value.update(21).unwrap(); // a write does
    f.clock.advance(Duration::from_millis(40));
    backend.set_current_key(&1).unwrap();
    assert_eq!(
        value.value().unwrap(),
        None,
        "expired at exactly write + ttl"
    );
    backend.set_current_key(&2).unwrap();
    assert_eq!(value.value().unwrap(), Some(21));
    // The expired entry was removed by the read.
    let keys = backend.keys("v", backend.key_groups()).unwrap();
    assert_eq!(keys, vec![(2, None)]);
    if let Some(slot) = &f.slot {
        let raw = slot
            .raw_entries(&backend.column_family("v").unwrap(), backend.key_groups())
            .unwrap()
            .count();
        assert_eq!(raw, 1, "expired entry deleted on read");
    }
    f.clock.advance(Duration::from_millis(1_000));
    assert_eq!(value.value().unwrap(), None);
    assert!(backend.keys("v", backend.key_groups()).unwrap().is_empty());
}

fn ttl_value_refreshes_on_read_and_write(f: &Fixture) {
    let backend: LocalKeyedBackend<u32> = f.backend(128);
    let config = ttl(100).with_update_type(TtlUpdateType::OnReadAndWrite);
    let value = backend
        .value_state(&ValueStateDescriptor::<u64>::new("v").with_ttl(config))
        .unwrap();
    backend.set_current_key(&1).unwrap();
    value.update(10).unwrap();
    for _ in 0..5 {
        f.clock.advance(Duration::from_millis(80));
        assert_eq!(
            value.value().unwrap(),
            Some(10),
            "each read extends the life"
        );
    }
    f.clock.advance(Duration::from_millis(100));
    assert_eq!(value.value().unwrap(), None);
}

fn ttl_list_elements_expire_individually(f: &Fixture) {
    let backend: LocalKeyedBackend<u32> = f.backend(128);
    let list = backend
        .list_state(&ListStateDescriptor::<u32>::new("l").with_ttl(ttl(100)))
        .unwrap();
    backend.set_current_key(&1).unwrap();
    list.add(1).unwrap();
    list.add(2).unwrap();
    f.clock.advance(Duration::from_millis(50));
    list.add(3).unwrap();
    assert_eq!(list.get().unwrap(), [1, 2, 3]);
    f.clock.advance(Duration::from_millis(50));
    assert_eq!(list.get().unwrap(), [3]);
    f.clock.advance(Duration::from_millis(50));
    assert!(list.get().unwrap().is_empty());
    assert!(backend.keys("l", backend.key_groups()).unwrap().is_empty());
    // update() gives all elements a fresh life.
    list.update([7, 8]).unwrap();
    f.clock.advance(Duration::from_millis(99));
    assert_eq!(list.get().unwrap(), [7, 8]);
}

fn ttl_map_entries_expire_individually(f: &Fixture) {
    let backend: LocalKeyedBackend<u32> = f.backend(128);
    let map = backend
        .map_state(&MapStateDescriptor::<u32, u32>::new("m").with_ttl(ttl(100)))
        .unwrap();
    backend.set_current_key(&1).unwrap();
    map.put(1, 10).unwrap();
    map.put(2, 20).unwrap();
    f.clock.advance(Duration::from_millis(50));
    map.put(3, 30).unwrap();
    map.put(1, 11).unwrap();
    f.clock.advance(Duration::from_millis(50));
    assert_eq!(map.get(&2).unwrap(), None);
    assert!(!map.contains(&2).unwrap());
    let entries: BTreeMap<u32, u32> = map.entries().unwrap().map(Result::unwrap).collect();
    assert_eq!(entries, BTreeMap::from([(1, 11), (3, 30)]));
    let mut visited = BTreeMap::new();
    map.for_each(|key, value| {
        visited.insert(*key, *value);
        Ok(())
    })
    .unwrap();
    assert_eq!(visited, entries, "for_each lends live entries only");
    f.clock.advance(Duration::from_millis(50));
    assert!(map.is_empty().unwrap());
    assert_eq!(map.entries().unwrap().count(), 0);
    assert!(backend.keys("m", backend.key_groups()).unwrap().is_empty());
}

fn ttl_reducing_and_aggregating_expire(f: &Fixture) {
    let backend: LocalKeyedBackend<u32> = f.backend(128);
    let sum = backend
        .reducing_state(
            &ReducingStateDescriptor::new("sum", |a: &u64, b: &u64| a + b).with_ttl(ttl(100)),
        )
        .unwrap();
    let average = backend
        .aggregating_state(&AggregatingStateDescriptor::new("avg", Average).with_ttl(ttl(100)))
        .unwrap();
    backend.set_current_key(&1).unwrap();
    sum.add(1).unwrap();
    average.add(4).unwrap();
    f.clock.advance(Duration::from_millis(100));
    // An expired accumulator is not folded into: adding starts afresh.
    sum.add(5).unwrap();
    assert_eq!(sum.get().unwrap(), Some(5));
    assert_eq!(average.get().unwrap(), None);
    average.add(2).unwrap();
    assert_eq!(average.get().unwrap(), Some(2.0));
}

fn registration_conflicts_name_the_state(f: &Fixture) {
    let backend: LocalKeyedBackend<u32> = f.backend(128);
    backend
        .value_state(&ValueStateDescriptor::<u64>::new("counts"))
        .unwrap();
    let err = backend
        .list_state(&ListStateDescriptor::<u64>::new("counts"))
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("'counts'"), "{text}");
    assert!(text.contains("ValueState<u64>"), "{text}");
    assert!(text.contains("ListState<u64>"), "{text}");
    assert!(text.contains("another name"), "{text}");
    assert!(backend
        .value_state(&ValueStateDescriptor::<u32>::new("counts"))
        .is_err());
    assert!(backend
        .value_state(&ValueStateDescriptor::<u64>::new("counts").with_ttl(ttl(5)))
        .is_err());
    assert!(backend
        .reducing_state(&ReducingStateDescriptor::new(
            "counts",
            |a: &u64, b: &u64| a + b
        ))
        .is_err());
    assert!(err.is_usage_error());
}

fn same_descriptor_shares_state(f: &Fixture) {
    let backend: LocalKeyedBackend<u32> = f.backend(128);
    let descriptor = ValueStateDescriptor::<String>::new("s");
    let a = backend.value_state(&descriptor).unwrap();
    let b = backend.value_state(&descriptor.clone()).unwrap();
    backend.set_current_key(&3).unwrap();
    a.update("shared".into()).unwrap();
    assert_eq!(b.value().unwrap(), Some("shared".to_string()));
    assert_eq!(backend.state_names(), ["s"]);
}

fn access_without_key_is_an_error(f: &Fixture) {
    let backend: LocalKeyedBackend<u32> = f.backend(128);
    let value = backend
        .value_state(&ValueStateDescriptor::<u64>::new("v"))
        .unwrap();
    let err = value.value().unwrap_err();
    assert!(err.to_string().contains("'v'"), "{err}");
    assert!(err.to_string().contains("set_current_key"), "{err}");
}

fn state_sizes_are_reported(f: &Fixture) {
    let backend: LocalKeyedBackend<u32> = f.backend(128);
    let small = backend
        .value_state(&ValueStateDescriptor::<u8>::new("small"))
        .unwrap();
    let big = backend
        .list_state(&ListStateDescriptor::<[u64; 8]>::new("big"))
        .unwrap();
    for key in 0..1000 {
        backend.set_current_key(&key).unwrap();
        small.update(1).unwrap();
        big.add_all([[key as u64; 8]; 10]).unwrap();
    }
    let sizes = backend.state_sizes();
    assert_eq!(sizes.len(), 2);
    if f.kind == Kind::Heap {
        assert_eq!(sizes[0].name, "big", "largest first: {sizes:?}");
        assert_eq!(sizes[0].entries, 1000);
        assert!(sizes[0].estimated_bytes >= 1000 * 10 * 64, "{sizes:?}");
        assert!(sizes[1].estimated_bytes > 0);
    } else {
        // RocksDB reports memtable and SST sizes; both states have something.
        assert!(
            sizes.iter().all(|size| size.estimated_bytes > 0),
            "{sizes:?}"
        );
        assert_eq!(sizes[0].name, "big", "largest first: {sizes:?}");
    }
}
