//! Restoring the heap backend from keyed-state checkpoints: round trips of every kind of
//! state, with and without namespaces and TTL; rescaling (several snapshots into one backend,
//! one snapshot into several); restored states nobody registers; registrations that do not
//! match the checkpoint; copy-on-write. The byte format itself and damaged bytes:
//! `keyed_snapshot_format.rs`.

mod common;
mod restore_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use restore_support::*;
use weir_state::{
    decode_keyed_snapshot, encode_keyed_snapshot, AggregatingStateDescriptor, KeyGroup,
    KeyedBackendConfig, KeyedSnapshotEncoder, ListState, ListStateDescriptor, LocalKeyedBackend,
    ManualClock, MapState, MapStateDescriptor, SnapshotShape, StateErrorKind, StateKind,
    StateTtlConfig, ValueState, ValueStateDescriptor,
};

#[test]
fn every_kind_of_state_round_trips_without_namespaces() {
    let (source, _) = heap::<()>(1, 0);
    write_all(&source, 0..300, &[None]);
    let expected = dump(&source);
    assert_eq!(expected.len(), 300);
    let bytes = checkpoint(&source);

    let (restored, _) = heap::<()>(1, 0);
    let summary = restored.restore(&[&bytes]).unwrap();
    assert_eq!(summary.snapshots, 1);
    assert_eq!(summary.states, 5);
    assert_eq!(summary.entries_elsewhere, 0);
    assert_eq!(
        restored.restored_state_names(),
        ["session", "events", "counts", "sum", "average"]
    );
    assert_eq!(dump(&restored), expected);
    assert!(restored.restored_state_names().is_empty());
    assert_eq!(restored.state_sizes(), source.state_sizes());

    // What was written can be read without the job's types, and says what it holds.
    let contents = decode_keyed_snapshot(&bytes).unwrap();
    assert_eq!(contents.max_parallelism, MAX_PARALLELISM);
    assert_eq!(contents.key_type, "u64");
    assert_eq!(contents.namespace_type, "()");
    let kinds: Vec<(&str, StateKind, usize)> = contents
        .states
        .iter()
        .map(|state| (state.name.as_str(), state.kind, state.entries.len()))
        .collect();
    let maps: usize = (0..300u64).map(|key| 1 + (key * 10 % 3) as usize).sum();
    assert_eq!(
        kinds,
        [
            ("session", StateKind::Value, 300),
            ("events", StateKind::List, 900),
            ("counts", StateKind::Map, maps),
            ("sum", StateKind::Reducing, 300),
            ("average", StateKind::Aggregating, 300),
        ]
    );
    let counts = &contents.states[2];
    assert_eq!(
        counts.user_key_type.as_deref(),
        Some("alloc::string::String")
    );
    assert_eq!(contents.states[4].value_type, "(u64, u64)");
    for state in &contents.states {
        assert!(state
            .entries
            .windows(2)
            .all(|pair| pair[0].key_group <= pair[1].key_group));
        assert!(state.entries.iter().all(|entry| entry.namespace.is_none()));
    }
}

#[test]
fn states_under_namespaces_round_trip() {
    let (source, _) = heap::<u64>(1, 0);
    write_all(&source, 0..120, &[None, Some(7), Some(1 << 40)]);
    let expected = dump(&source);
    assert_eq!(expected.len(), 360);
    let bytes = checkpoint(&source);
    let (restored, _) = heap::<u64>(1, 0);
    restored.restore(&[&bytes]).unwrap();
    assert_eq!(dump(&restored), expected);
}

#[test]
fn ttl_entries_keep_their_expiry() {
    let ttl = StateTtlConfig::new(Duration::from_millis(100));
    let value_d = ValueStateDescriptor::<u64>::new("v").with_ttl(ttl);
    let list_d = ListStateDescriptor::<u64>::new("l").with_ttl(ttl);
    let map_d = MapStateDescriptor::<u64, u64>::new("m").with_ttl(ttl);
    let (source, clock) = heap::<()>(1, 0);
    let value = source.value_state(&value_d).unwrap();
    let list = source.list_state(&list_d).unwrap();
    let map = source.map_state(&map_d).unwrap();
    let write = |keys: std::ops::Range<u64>| {
        for key in keys {
            source.set_current_key(&key).unwrap();
            value.update(key).unwrap();
            list.add(key).unwrap();
            map.put(key, key).unwrap();
        }
    };
    write(0..10); // expire at START + 100
    clock.advance(Duration::from_millis(50));
    write(10..20); // expire at START + 150
    let bytes = checkpoint(&source);
    let contents = decode_keyed_snapshot(&bytes).unwrap();
    for state in &contents.states {
        assert!(state.has_ttl);
        let expiries: BTreeSet<Option<i64>> =
            state.entries.iter().map(|e| e.expires_at_ms).collect();
        assert_eq!(
            expiries,
            [Some(START_MS + 100), Some(START_MS + 150)].into(),
            "{}",
            state.name
        );
    }

    // Restored 120 ms after the start: the first ten have expired, the others live 30 ms more.
    let (restored, clock) = heap::<()>(1, 0);
    clock.set(START_MS + 120);
    restored.restore(&[&bytes]).unwrap();
    let value = restored.value_state(&value_d).unwrap();
    let list = restored.list_state(&list_d).unwrap();
    let map = restored.map_state(&map_d).unwrap();
    let live: Vec<u64> = restored
        .keys("v", restored.key_groups())
        .unwrap()
        .into_iter()
        .map(|(key, _)| key)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(live, (10..20).collect::<Vec<_>>());
    assert_eq!(
        restored
            .state_sizes()
            .iter()
            .map(|s| s.entries)
            .sum::<u64>(),
        30
    );
    for key in 0..20u64 {
        restored.set_current_key(&key).unwrap();
        let expected = (key >= 10).then_some(key);
        assert_eq!(value.value().unwrap(), expected);
        assert_eq!(
            list.get().unwrap(),
            expected.into_iter().collect::<Vec<_>>()
        );
        assert_eq!(map.get(&key).unwrap(), expected);
    }
    clock.set(START_MS + 150);
    for key in 10..20u64 {
        restored.set_current_key(&key).unwrap();
        assert_eq!(value.value().unwrap(), None);
        assert!(list.get().unwrap().is_empty());
        assert_eq!(map.get(&key).unwrap(), None);
    }
}

#[test]
fn a_ttl_added_or_removed_on_restore_follows_the_new_registration() {
    let ttl = StateTtlConfig::new(Duration::from_millis(100));
    let (source, _) = heap::<()>(1, 0);
    let plain = source
        .value_state(&ValueStateDescriptor::<u64>::new("plain"))
        .unwrap();
    let timed = source
        .value_state(&ValueStateDescriptor::<u64>::new("timed").with_ttl(ttl))
        .unwrap();
    source.set_current_key(&1).unwrap();
    plain.update(1).unwrap();
    timed.update(2).unwrap();
    let bytes = checkpoint(&source);

    let (restored, clock) = heap::<()>(1, 0);
    clock.set(START_MS + 50);
    restored.restore(&[&bytes]).unwrap();
    // "plain" gets the TTL from its registration on; "timed" loses its TTL and lives on.
    let plain = restored
        .value_state(&ValueStateDescriptor::<u64>::new("plain").with_ttl(ttl))
        .unwrap();
    let timed = restored
        .value_state(&ValueStateDescriptor::<u64>::new("timed"))
        .unwrap();
    restored.set_current_key(&1).unwrap();
    clock.set(START_MS + 149);
    assert_eq!(
        (plain.value().unwrap(), timed.value().unwrap()),
        (Some(1), Some(2))
    );
    clock.set(START_MS + 150);
    assert_eq!(
        (plain.value().unwrap(), timed.value().unwrap()),
        (None, Some(2))
    );
    clock.set(START_MS + 1_000_000);
    assert_eq!(timed.value().unwrap(), Some(2));
}

/// The states of subtasks 0 and 1 of parallelism 2, holding keys `0..n` between them.
fn two_subtasks(n: u64) -> (Vec<u8>, Vec<u8>, Dump<u64>) {
    let mut expected = Dump::new();
    let mut bytes = Vec::new();
    for subtask in 0..2 {
        let (backend, _) = heap::<u64>(2, subtask);
        let keys: Vec<u64> = (0..n).filter(|&key| owner(key, 2) == subtask).collect();
        assert!(!keys.is_empty());
        write_all(&backend, keys, &[None, Some(3)]);
        expected.extend(dump(&backend));
        bytes.push(checkpoint(&backend));
    }
    let second = bytes.pop().unwrap();
    (bytes.pop().unwrap(), second, expected)
}

#[test]
fn rescaling_restores_the_key_groups_of_each_new_subtask() {
    let (zero, one, all) = two_subtasks(400);
    assert_eq!(all.len(), 800);

    // Parallelism 2 -> 1: the union, whatever order the files come in.
    for order in [[&zero[..], &one[..]], [&one[..], &zero[..]]] {
        let (single, _) = heap::<u64>(1, 0);
        let summary = single.restore(&order).unwrap();
        assert_eq!(summary.entries_elsewhere, 0);
        assert_eq!(summary.states, 5);
        let bytes = checkpoint(&single);
        assert_eq!(dump(&single), all);
        // The merged state's blocks were put in key-group order.
        for state in decode_keyed_snapshot(&bytes).unwrap().states {
            assert!(state
                .entries
                .windows(2)
                .all(|pair| pair[0].key_group <= pair[1].key_group));
        }
    }

    // Parallelism 2 -> 2 and 2 -> 3: each subtask gets exactly its own keys.
    for parallelism in [2, 3] {
        let mut union = Dump::new();
        for subtask in 0..parallelism {
            let (backend, _) = heap::<u64>(parallelism, subtask);
            let summary = backend.restore(&[&zero, &one]).unwrap();
            let own = dump(&backend);
            assert!(own
                .keys()
                .all(|(key, _)| owner(*key, parallelism) == subtask));
            let expected: Dump<u64> = all
                .iter()
                .filter(|((key, _), _)| owner(*key, parallelism) == subtask)
                .map(|(key, contents)| (*key, contents.clone()))
                .collect();
            assert_eq!(own, expected, "subtask {subtask} of {parallelism}");
            assert!(summary.entries > 0 && summary.entries_elsewhere > 0);
            union.extend(own);
        }
        assert_eq!(union, all);
    }
}

#[test]
fn overlapping_snapshots_are_rejected() {
    let (zero, _, _) = two_subtasks(50);
    let (single, _) = heap::<u64>(1, 0);
    let err = single.restore(&[&zero, &zero]).unwrap_err();
    assert!(
        matches!(err.kind(), StateErrorKind::InvalidRestore { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("the snapshots overlap"), "{err}");
    // A failed restore leaves the backend as it was: it can be restored properly.
    single.restore(&[&zero]).unwrap();
}

#[test]
fn a_restored_state_nobody_registers_survives_later_checkpoints() {
    let (source, _) = heap::<u64>(1, 0);
    write_all(&source, 0..100, &[None, Some(1)]);
    let expected = dump(&source);
    let first = checkpoint(&source);

    // The next run registers only the list state, and changes it.
    let (second_run, _) = heap::<u64>(1, 0);
    second_run.restore(&[&first]).unwrap();
    let list = second_run.list_state(&list_d()).unwrap();
    second_run.set_current_key(&5).unwrap();
    list.add(99).unwrap();
    assert_eq!(
        second_run.restored_state_names(),
        ["session", "counts", "sum", "average"]
    );
    let snapshot = second_run.heap_snapshot().unwrap();
    let unregistered: Vec<&str> = snapshot
        .unregistered_restored_states()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(unregistered, ["session", "counts", "sum", "average"]);
    let second = checkpoint(&second_run);

    // The states it did not register are in its checkpoint exactly as they were restored.
    let before = decode_keyed_snapshot(&first).unwrap();
    let after = decode_keyed_snapshot(&second).unwrap();
    for name in ["session", "counts", "sum", "average"] {
        let find = |contents: &weir_state::KeyedSnapshotContents| {
            contents
                .states
                .iter()
                .find(|state| state.name == name)
                .cloned()
                .unwrap()
        };
        assert_eq!(find(&after), find(&before), "{name}");
    }

    // A third run registers everything and finds it all, with the list change.
    let (third_run, _) = heap::<u64>(1, 0);
    third_run.restore(&[&second]).unwrap();
    let mut expected = expected;
    expected.get_mut(&(5, None)).unwrap().events.push(99);
    assert_eq!(dump(&third_run), expected);
}

#[test]
fn unregistered_restored_states_give_up_deleted_key_groups() {
    let (source, _) = heap::<u64>(1, 0);
    write_all(&source, 0..100, &[None]);
    let bytes = checkpoint(&source);
    let (restored, _) = heap::<u64>(1, 0);
    restored.restore(&[&bytes]).unwrap();
    let moved = weir_state::KeyGroupRange { start: 0, end: 63 };
    restored.delete_key_groups(moved).unwrap();
    let left = dump(&restored);
    assert!(!left.is_empty());
    assert!(left
        .keys()
        .all(|(key, _)| !moved.contains(KeyGroup::of(key, MAX_PARALLELISM))));
    assert_eq!(
        left.len(),
        (0..100u64).filter(|key| owner(*key, 2) == 1).count()
    );
}

#[test]
fn a_state_restored_as_another_kind_or_type_fails_naming_both() {
    let (source, _) = heap::<()>(1, 0);
    write_all(&source, 0..10, &[None]);
    let bytes = checkpoint(&source);
    let (restored, _) = heap::<()>(1, 0);
    restored.restore(&[&bytes]).unwrap();

    let check = |err: weir_state::StateError, restored: &str, requested: &str| {
        assert!(
            matches!(err.kind(), StateErrorKind::IncompatibleKeyedRestore { .. }),
            "{err}"
        );
        let text = err.to_string();
        for part in [restored, requested, "give the new state another name"] {
            assert!(text.contains(part), "{part} in {text}");
        }
        assert!(err.is_usage_error());
    };
    // Another value type.
    let err = restored
        .value_state(&ValueStateDescriptor::<String>::new("session"))
        .unwrap_err();
    check(
        err,
        "'session' was checkpointed as ValueState<keyed_restore::restore_support::Session>",
        "registered as ValueState<alloc::string::String>",
    );
    // Another kind with the same stored type.
    let err = restored
        .value_state(&ValueStateDescriptor::<u64>::new("sum"))
        .unwrap_err();
    check(err, "ReducingState<u64>", "ValueState<u64>");
    let err = restored
        .list_state(&ListStateDescriptor::<u64>::new("sum"))
        .unwrap_err();
    check(err, "ReducingState<u64>", "ListState<u64>");
    // Another map key type.
    let err = restored
        .map_state(&MapStateDescriptor::<u64, u64>::new("counts"))
        .unwrap_err();
    check(
        err,
        "MapState<alloc::string::String, u64>",
        "MapState<u64, u64>",
    );
    // Another accumulator.
    let err = restored
        .aggregating_state(&AggregatingStateDescriptor::<u64, (u64, u64), u64>::new(
            "session", Average,
        ))
        .unwrap_err();
    check(
        err,
        "ValueState<keyed_restore::restore_support::Session>",
        "AggregatingState with accumulator (u64, u64)",
    );

    // The failed registrations lost nothing: the right ones find all the data.
    assert_eq!(restored.restored_state_names().len(), 5);
    assert_eq!(dump(&restored), dump(&source));
}

#[test]
fn a_value_that_does_not_decode_is_a_corrupt_error_naming_the_state() {
    let (source, _) = heap::<()>(1, 0);
    let names = source
        .value_state(&ValueStateDescriptor::<String>::new("names"))
        .unwrap();
    source.set_current_key(&1).unwrap();
    names
        .update("a name long enough to live out of line".into())
        .unwrap();
    let mut bytes = checkpoint(&source);
    let at = bytes
        .windows(6)
        .position(|window| window == b"a name")
        .unwrap();
    bytes[at] = 0xff; // no longer UTF-8
    let bytes = with_checksum(bytes);

    let (restored, _) = heap::<()>(1, 0);
    restored.restore(&[&bytes]).unwrap();
    let err = restored
        .value_state(&ValueStateDescriptor::<String>::new("names"))
        .unwrap_err();
    assert!(
        matches!(
            err.kind(),
            StateErrorKind::Corrupt { state, what: "checkpointed value", .. } if state == "names"
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("restore from an earlier checkpoint"),
        "{err}"
    );
}

#[test]
fn snapshots_that_do_not_fit_the_backend_are_rejected() {
    let (source, _) = heap::<()>(1, 0);
    write_all(&source, 0..10, &[None]);
    let bytes = checkpoint(&source);

    // Another max parallelism.
    let other = LocalKeyedBackend::<u64, ()>::heap(
        KeyedBackendConfig::single(256),
        Arc::new(ManualClock::new(0)),
    )
    .unwrap();
    let err = other.restore(&[&bytes]).unwrap_err();
    assert!(
        matches!(
            err.kind(),
            StateErrorKind::IncompatibleKeyedSnapshot {
                what: "max parallelism",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("128") && err.to_string().contains("256"),
        "{err}"
    );

    // Another key type, another namespace type.
    let keyed_by_string = LocalKeyedBackend::<String, ()>::heap(
        KeyedBackendConfig::single(MAX_PARALLELISM),
        Arc::new(ManualClock::new(0)),
    )
    .unwrap();
    let err = keyed_by_string.restore(&[&bytes]).unwrap_err();
    assert!(err.to_string().contains("key type u64"), "{err}");
    let (windowed, _) = heap::<u64>(1, 0);
    let err = windowed.restore(&[&bytes]).unwrap_err();
    assert!(err.to_string().contains("namespace type ()"), "{err}");

    // After a registration, or a second time.
    let (late, _) = heap::<()>(1, 0);
    late.value_state(&value_d()).unwrap();
    let err = late.restore(&[&bytes]).unwrap_err();
    assert!(
        err.to_string().contains("'session' is already registered"),
        "{err}"
    );
    let (twice, _) = heap::<()>(1, 0);
    twice.restore(&[&bytes]).unwrap();
    let err = twice.restore(&[&bytes]).unwrap_err();
    assert!(err.to_string().contains("restored before"), "{err}");
}

/// `dump`, with each map's entries in one order (the heap keeps a map in its own order,
/// RocksDB in key order).
fn sorted<N: Ord>(mut dump: Dump<N>) -> Dump<N> {
    for contents in dump.values_mut() {
        contents.counts.sort();
    }
    dump
}

/// A RocksDB backend of subtask `subtask` of `parallelism` for operator "op", in a fixture of
/// its own.
fn rocksdb(parallelism: u32, subtask: u32) -> (common::Fixture, LocalKeyedBackend<u64, u64>) {
    let fixture = common::Fixture::rocksdb_evicting();
    let config = KeyedBackendConfig::for_subtask(MAX_PARALLELISM, parallelism, subtask);
    let backend = fixture.backend_for(config, "op");
    (fixture, backend)
}

/// The canonical snapshot a RocksDB backend's instance writes of operator "op".
fn rocksdb_checkpoint(fixture: &common::Fixture, backend: &LocalKeyedBackend<u64, u64>) -> Vec<u8> {
    let mut bytes = Vec::new();
    fixture
        .slot
        .as_ref()
        .expect("a RocksDB fixture")
        .write_keyed_snapshot(
            "op",
            SnapshotShape {
                max_parallelism: MAX_PARALLELISM,
                key_groups: backend.key_groups(),
                key_type: std::any::type_name::<u64>(),
                namespace_type: std::any::type_name::<u64>(),
            },
            START_MS,
            &mut bytes,
        )
        .expect("a canonical snapshot");
    bytes
}

/// Heap → RocksDB → heap in the canonical format: every kind of state, with and without
/// namespaces, loads into RocksDB — whole, and rescaled into two subtasks that each keep their
/// key groups — and RocksDB writes it back so that a heap backend restores the same; a state
/// registered on RocksDB with other types than it was loaded (or first registered) with is
/// refused, naming both.
#[test]
fn rocksdb_loads_canonical_snapshots_and_writes_them_back() {
    let (source, _) = heap::<u64>(1, 0);
    write_all(&source, 0..300, &[None, Some(7)]);
    let expected = sorted(dump(&source));
    let bytes = checkpoint(&source);

    let (fixture, whole) = rocksdb(1, 0);
    let summary = whole.restore(&[&bytes]).unwrap();
    assert_eq!(
        summary.entries,
        decode_keyed_snapshot(&bytes)
            .unwrap()
            .states
            .iter()
            .map(|s| s.entries.len() as u64)
            .sum::<u64>()
    );
    assert_eq!(sorted(dump(&whole)), expected);
    let back = rocksdb_checkpoint(&fixture, &whole);
    let (heap_again, _) = heap::<u64>(1, 0);
    heap_again.restore(&[&back]).unwrap();
    assert_eq!(sorted(dump(&heap_again)), expected);

    for subtask in 0..2 {
        let (_fixture, half) = rocksdb(2, subtask);
        half.restore(&[&bytes]).unwrap();
        let mine: Dump<u64> = expected
            .iter()
            .filter(|((key, _), _)| owner(*key, 2) == subtask)
            .map(|(key, contents)| (*key, contents.clone()))
            .collect();
        assert!(!mine.is_empty());
        assert_eq!(sorted(dump(&half)), mine, "subtask {subtask} of 2");
    }

    let err = whole
        .value_state(&ValueStateDescriptor::<u64>::new("session"))
        .expect_err("another type is refused");
    let text = err.to_string();
    assert!(
        text.contains("'session'") && text.contains("Session") && text.contains("u64"),
        "{text}"
    );
    // A RocksDB backend that registered a state records it: another type is refused there too.
    let (_fixture, fresh) = rocksdb(1, 0);
    fresh
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    let err = fresh
        .list_state(&ListStateDescriptor::<u64>::new("count"))
        .expect_err("another kind is refused");
    assert!(err.to_string().contains("'count'"), "{err}");
}

/// A rescaled restore copies the states' records with their entries, so a savepoint after it
/// holds every state, registered again or not.
#[test]
fn rocksdb_key_groups_copied_into_another_instance_keep_their_types() {
    let (source, _) = heap::<u64>(1, 0);
    write_all(&source, 0..100, &[None, Some(3)]);
    let expected = sorted(dump(&source));
    let (old_fixture, old) = rocksdb(1, 0);
    old.restore(&[&checkpoint(&source)]).unwrap();
    let (new_fixture, new) = rocksdb(1, 0);
    new_fixture
        .slot
        .as_ref()
        .unwrap()
        .copy_key_groups_from(old_fixture.slot.as_ref().unwrap(), new.key_groups())
        .unwrap();
    // Nothing registered in `new`: its savepoint still holds all five states.
    let bytes = rocksdb_checkpoint(&new_fixture, &new);
    let states: Vec<String> = decode_keyed_snapshot(&bytes)
        .unwrap()
        .states
        .into_iter()
        .map(|state| state.name)
        .collect();
    assert_eq!(states.len(), 5, "{states:?}");
    let (heap_again, _) = heap::<u64>(1, 0);
    heap_again.restore(&[&bytes]).unwrap();
    assert_eq!(sorted(dump(&heap_again)), expected);
    drop(old);
}

#[test]
fn writes_after_the_snapshot_do_not_change_its_encoding() {
    let (backend, _) = heap::<u64>(1, 0);
    write_all(&backend, 0..200, &[None, Some(2)]);
    let snapshot = backend.heap_snapshot().unwrap();
    let mut before = Vec::new();
    encode_keyed_snapshot(&snapshot, &mut before).unwrap();
    let expected = dump(&backend);

    // Processing goes on before the (asynchronous) encoding runs again.
    write_all(&backend, 100..300, &[Some(2), Some(9)]);
    backend
        .delete_key_groups(weir_state::KeyGroupRange { start: 0, end: 10 })
        .unwrap();
    let mut after = vec![0xaa];
    encode_keyed_snapshot(&snapshot, &mut after).unwrap();
    assert_eq!(after[0], 0xaa, "appends to what the buffer holds");
    assert_eq!(&after[1..], &before[..]);

    let (restored, _) = heap::<u64>(1, 0);
    restored.restore(&[&after[1..]]).unwrap();
    assert_eq!(dump(&restored), expected);
}

#[test]
fn an_empty_backend_round_trips() {
    let (source, _) = heap::<()>(2, 1);
    let bytes = checkpoint(&source);
    let contents = decode_keyed_snapshot(&bytes).unwrap();
    assert!(contents.states.is_empty());
    assert_eq!(contents.key_groups, source.key_groups());
    let (restored, _) = heap::<()>(1, 0);
    let summary = restored.restore(&[&bytes]).unwrap();
    assert_eq!((summary.states, summary.entries), (0, 0));
}

/// One write of the model test.
#[derive(Clone, Debug)]
enum Write {
    Value(u64, Option<u8>, u32),
    ClearValue(u64, Option<u8>),
    Push(u64, Option<u8>, u32),
    Put(u64, Option<u8>, u8, u32),
    Remove(u64, Option<u8>, u8),
}

fn write() -> impl Strategy<Value = Write> {
    let key = 0u64..60;
    let namespace = prop::option::of(0u8..3);
    prop_oneof![
        (key.clone(), namespace.clone(), any::<u32>()).prop_map(|(k, n, v)| Write::Value(k, n, v)),
        (key.clone(), namespace.clone()).prop_map(|(k, n)| Write::ClearValue(k, n)),
        (key.clone(), namespace.clone(), any::<u32>()).prop_map(|(k, n, v)| Write::Push(k, n, v)),
        (key.clone(), namespace.clone(), 0u8..5, any::<u32>())
            .prop_map(|(k, n, u, v)| Write::Put(k, n, u, v)),
        (key, namespace, 0u8..5).prop_map(|(k, n, u)| Write::Remove(k, n, u)),
    ]
}

type Model = BTreeMap<(u64, Option<u8>), (Option<u32>, Vec<u32>, BTreeMap<u8, u32>)>;

impl Write {
    /// The key and namespace it writes under.
    fn target(&self) -> (u64, Option<u8>) {
        match self {
            Write::Value(k, n, _)
            | Write::ClearValue(k, n)
            | Write::Push(k, n, _)
            | Write::Put(k, n, _, _)
            | Write::Remove(k, n, _) => (*k, *n),
        }
    }
}

/// The model tests' states — a value `v`, a list `l` and a map `m` — on a heap backend of one
/// subtask.
struct Modelled {
    backend: LocalKeyedBackend<u64, u8>,
    value: ValueState<u32>,
    list: ListState<u32>,
    map: MapState<u8, u32>,
}

impl Modelled {
    fn new() -> Modelled {
        let (backend, _) = heap::<u8>(1, 0);
        Modelled {
            value: backend
                .value_state(&ValueStateDescriptor::new("v"))
                .unwrap(),
            list: backend.list_state(&ListStateDescriptor::new("l")).unwrap(),
            map: backend.map_state(&MapStateDescriptor::new("m")).unwrap(),
            backend,
        }
    }

    /// Applies `write` to the backend.
    fn apply(&self, write: &Write) {
        let (key, namespace) = write.target();
        self.backend.set_current_key(&key).unwrap();
        match namespace {
            Some(n) => self.backend.set_current_namespace(n).unwrap(),
            None => self.backend.clear_current_namespace().unwrap(),
        }
        match *write {
            Write::Value(_, _, v) => self.value.update(v).unwrap(),
            Write::ClearValue(..) => self.value.clear().unwrap(),
            Write::Push(_, _, v) => self.list.add(v).unwrap(),
            Write::Put(_, _, u, v) => self.map.put(u, v).unwrap(),
            Write::Remove(_, _, u) => {
                self.map.remove(&u).unwrap();
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random writes, a checkpoint, and a restore into every subtask of a random parallelism:
    /// together they hold exactly what a model of the writes holds, each key in one subtask.
    #[test]
    fn restore_matches_a_model(
        writes in prop::collection::vec(write(), 0..300),
        parallelism in 1u32..5,
    ) {
        let value_d = ValueStateDescriptor::<u32>::new("v");
        let list_d = ListStateDescriptor::<u32>::new("l");
        let map_d = MapStateDescriptor::<u8, u32>::new("m");
        let source = Modelled::new();
        let mut model = Model::new();
        for write in &writes {
            source.apply(write);
            let entry = model.entry(write.target()).or_default();
            match *write {
                Write::Value(_, _, v) => entry.0 = Some(v),
                Write::ClearValue(..) => entry.0 = None,
                Write::Push(_, _, v) => entry.1.push(v),
                Write::Put(_, _, u, v) => { entry.2.insert(u, v); }
                Write::Remove(_, _, u) => { entry.2.remove(&u); }
            }
        }
        model.retain(|_, (v, l, m)| v.is_some() || !l.is_empty() || !m.is_empty());
        let bytes = checkpoint(&source.backend);

        let mut seen = Model::new();
        for subtask in 0..parallelism {
            let (backend, _) = heap::<u8>(parallelism, subtask);
            backend.restore(&[&bytes]).unwrap();
            let value = backend.value_state(&value_d).unwrap();
            let list = backend.list_state(&list_d).unwrap();
            let map = backend.map_state(&map_d).unwrap();
            let mut keys = BTreeSet::new();
            for state in ["v", "l", "m"] {
                keys.extend(backend.keys(state, backend.key_groups()).unwrap());
            }
            for (key, namespace) in keys {
                prop_assert_eq!(owner(key, parallelism), subtask);
                backend.set_current_key(&key).unwrap();
                match namespace {
                    Some(n) => backend.set_current_namespace(n).unwrap(),
                    None => backend.clear_current_namespace().unwrap(),
                }
                let contents = (
                    value.value().unwrap(),
                    list.get().unwrap(),
                    map.entries().unwrap().map(Result::unwrap).collect(),
                );
                prop_assert!(seen.insert((key, namespace), contents).is_none());
            }
        }
        prop_assert_eq!(seen, model);
    }
}

/// The snapshot's encoding in pieces of about `budget` bytes, and how many pieces; `release`:
/// letting go of each key group once read.
fn encode_in_pieces<N: weir_state::StateKey + weir_state::StateCodec>(
    backend: &LocalKeyedBackend<u64, N>,
    budget: usize,
    release: bool,
) -> (Vec<u8>, usize) {
    // Each piece into a buffer of its own, as a checkpoint writer hands them out (a key
    // group's block can then become the piece itself).
    let mut encoder = KeyedSnapshotEncoder::new(backend.heap_snapshot().unwrap());
    if release {
        encoder = encoder.releasing();
    }
    let (mut bytes, mut pieces, mut piece) = (Vec::new(), 0, Vec::new());
    loop {
        piece.clear();
        let more = encoder.encode_next(&mut piece, budget).unwrap();
        bytes.extend_from_slice(&piece);
        pieces += 1;
        if !more {
            return (bytes, pieces);
        }
    }
}

#[test]
fn encoding_in_pieces_gives_the_bytes_of_one_go() {
    // Every kind of state, under namespaces; key groups whose entries have all expired; a
    // restored state nobody registered; a key group larger than one piece.
    let ttl = StateTtlConfig::new(Duration::from_millis(100));
    let (first, _) = heap::<u64>(1, 0);
    write_all(&first, 0..50, &[None, Some(7)]);
    let restored = checkpoint(&first);
    let (source, clock) = heap::<u64>(1, 0);
    source.restore(&[&restored]).unwrap();
    let value = source.value_state(&value_d()).unwrap();
    let short = source
        .value_state(&ValueStateDescriptor::<u64>::new("short").with_ttl(ttl))
        .unwrap();
    let long = source
        .list_state(&ListStateDescriptor::<u64>::new("long").with_ttl(ttl))
        .unwrap();
    for key in 0..3_000u64 {
        source.set_current_key(&key).unwrap();
        if key < 40 {
            short.update(key).unwrap();
        }
        long.add(key).unwrap();
    }
    value.clear().unwrap();
    clock.advance(Duration::from_millis(60));
    for key in 2_000..3_000u64 {
        source.set_current_key(&key).unwrap();
        long.add(key).unwrap();
    }
    // The short state and half the long one have expired by the snapshot.
    clock.advance(Duration::from_millis(60));
    let whole = checkpoint(&source);
    assert!(!source.restored_state_names().is_empty());
    for budget in [0, 1, 100, 4_096, 1 << 20] {
        for release in [false, true] {
            let (bytes, pieces) = encode_in_pieces(&source, budget, release);
            assert_eq!(bytes, whole, "budget {budget}, release {release}");
            if budget <= 4_096 {
                assert!(pieces > 10, "budget {budget}: {pieces} pieces");
            }
        }
    }
    // Letting go of the snapshot's key groups leaves the backend's own as they were.
    assert_eq!(checkpoint(&source), whole);
    let contents = decode_keyed_snapshot(&whole).unwrap();
    let short = contents.states.iter().find(|s| s.name == "short").unwrap();
    assert!(short.entries.is_empty());
    let long = contents.states.iter().find(|s| s.name == "long").unwrap();
    assert_eq!(long.entries.len(), 1_000);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// However small its pieces, an encoding in pieces is the encoding in one go, and later
    /// writes to the backend do not change it.
    #[test]
    fn pieces_of_any_size_make_the_same_encoding(
        writes in prop::collection::vec(write(), 0..300),
        budget in 0usize..2_000,
    ) {
        let source = Modelled::new();
        let apply = |write: &Write| source.apply(write);
        let (before, after) = writes.split_at(writes.len() / 2);
        before.iter().for_each(apply);
        let whole = checkpoint(&source.backend);
        let mut encoder = KeyedSnapshotEncoder::new(source.backend.heap_snapshot().unwrap());
        if budget % 3 == 0 {
            // Letting go of each key group once read, as a checkpoint does.
            encoder = encoder.releasing();
        }
        let (mut bytes, mut piece) = (Vec::new(), Vec::new());
        let mut later = after.iter();
        // Pieces into one buffer, or each into a buffer of its own.
        let own = budget % 2 == 0;
        loop {
            let more = if own {
                piece.clear();
                let more = encoder.encode_next(&mut piece, budget).unwrap();
                bytes.extend_from_slice(&piece);
                more
            } else {
                encoder.encode_next(&mut bytes, budget).unwrap()
            };
            if !more {
                break;
            }
            if let Some(write) = later.next() {
                apply(write);
            }
        }
        later.for_each(apply);
        prop_assert_eq!(bytes, whole);
    }
}
