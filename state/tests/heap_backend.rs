//! Heap-only behaviour: copy-on-write snapshots and incremental TTL cleanup.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::Fixture;
use weir_state::{
    KeyGroup, ListStateDescriptor, LocalKeyedBackend, MapStateDescriptor, StateCodec,
    StateTtlConfig, ValueStateDescriptor,
};

/// Decodes the value entries of state `name` in a snapshot into a map.
fn snapshot_values(snapshot: &weir_state::HeapSnapshot<u64, ()>, name: &str) -> BTreeMap<u64, u64> {
    let mut values = BTreeMap::new();
    snapshot
        .state(name)
        .unwrap()
        .for_each(|key_group, entry| {
            assert_eq!(KeyGroup::of(entry.key, 128), key_group);
            values.insert(*entry.key, u64::decode(entry.value).unwrap());
            Ok(())
        })
        .unwrap();
    values
}

#[test]
fn snapshot_is_consistent_while_writes_continue() {
    let f = Fixture::heap();
    let backend: LocalKeyedBackend<u64> = f.backend(128);
    let value = backend
        .value_state(&ValueStateDescriptor::<u64>::new("v"))
        .unwrap();
    let list = backend
        .list_state(&ListStateDescriptor::<u64>::new("l"))
        .unwrap();
    let map = backend
        .map_state(&MapStateDescriptor::<u64, u64>::new("m"))
        .unwrap();
    for key in 0..1000u64 {
        backend.set_current_key(&key).unwrap();
        value.update(key).unwrap();
        list.add_all([key, key + 1]).unwrap();
        map.put(key, key * 2).unwrap();
    }
    let first = backend.heap_snapshot().unwrap();

    // Processing goes on: overwrite, delete, add keys, and extend lists and maps.
    for key in 0..1500u64 {
        backend.set_current_key(&key).unwrap();
        if key % 3 == 0 {
            value.clear().unwrap();
            map.clear().unwrap();
        } else {
            value.update(key + 1_000_000).unwrap();
            map.put(key + 1, 0).unwrap();
        }
        list.add(7).unwrap();
    }
    let second = backend.heap_snapshot().unwrap();
    backend.delete_key_groups(backend.key_groups()).unwrap();

    // The first snapshot still shows exactly the state before the writes.
    let expected: BTreeMap<u64, u64> = (0..1000).map(|key| (key, key)).collect();
    assert_eq!(snapshot_values(&first, "v"), expected);
    assert_eq!(first.state("v").unwrap().entries(), 1000);
    let mut list_elements = 0;
    first
        .state("l")
        .unwrap()
        .for_each(|_, entry| {
            let element = u64::decode(entry.value).unwrap();
            assert!(element == *entry.key || element == *entry.key + 1);
            list_elements += 1;
            Ok(())
        })
        .unwrap();
    assert_eq!(list_elements, 2000);
    let mut map_entries = 0;
    first
        .state("m")
        .unwrap()
        .for_each(|_, entry| {
            let user_key = u64::decode(entry.user_key.unwrap()).unwrap();
            assert_eq!(user_key, *entry.key);
            assert_eq!(u64::decode(entry.value).unwrap(), user_key * 2);
            map_entries += 1;
            Ok(())
        })
        .unwrap();
    assert_eq!(map_entries, 1000);

    // The second one shows the state after them.
    let expected: BTreeMap<u64, u64> = (0..1500)
        .filter(|key| key % 3 != 0)
        .map(|key| (key, key + 1_000_000))
        .collect();
    assert_eq!(snapshot_values(&second, "v"), expected);
    assert_eq!(second.state("l").unwrap().entries(), 1500);

    // And the backend itself is empty after the deletion.
    assert_eq!(
        backend.state_sizes().iter().map(|s| s.entries).sum::<u64>(),
        0
    );
}

#[test]
fn snapshot_leaves_out_expired_entries() {
    let f = Fixture::heap();
    let backend: LocalKeyedBackend<u64> = f.backend(128);
    let value = backend
        .value_state(
            &ValueStateDescriptor::<u64>::new("v")
                .with_ttl(StateTtlConfig::new(Duration::from_millis(100))),
        )
        .unwrap();
    for key in 0..10u64 {
        backend.set_current_key(&key).unwrap();
        value.update(key).unwrap();
        if key == 4 {
            f.clock.advance(Duration::from_millis(50));
        }
    }
    f.clock.advance(Duration::from_millis(60));
    let snapshot = backend.heap_snapshot().unwrap();
    let values = snapshot_values(&snapshot, "v");
    assert_eq!(values.keys().copied().collect::<Vec<_>>(), [5, 6, 7, 8, 9]);
    snapshot
        .state("v")
        .unwrap()
        .for_each(|_, entry| {
            assert_eq!(entry.expires_at_ms, Some(1_000_000 + 50 + 100));
            Ok(())
        })
        .unwrap();
}

#[test]
fn cleanup_is_incremental_and_complete() {
    let f = Fixture::heap();
    let backend: LocalKeyedBackend<u64> = f.backend(128);
    let ttl = StateTtlConfig::new(Duration::from_millis(100));
    let value = backend
        .value_state(&ValueStateDescriptor::<u64>::new("v").with_ttl(ttl))
        .unwrap();
    let list = backend
        .list_state(&ListStateDescriptor::<u64>::new("l").with_ttl(ttl))
        .unwrap();
    let forever = backend
        .value_state(&ValueStateDescriptor::<u64>::new("forever"))
        .unwrap();
    for key in 0..2000u64 {
        backend.set_current_key(&key).unwrap();
        forever.update(key).unwrap();
        if key % 2 == 0 {
            value.update(key).unwrap();
            list.add(key).unwrap();
        }
    }
    f.clock.advance(Duration::from_millis(50));
    for key in (1..2000u64).step_by(2) {
        backend.set_current_key(&key).unwrap();
        value.update(key).unwrap();
        list.add(key).unwrap();
    }
    f.clock.advance(Duration::from_millis(50));
    // The even keys (written at t=0) have expired; the odd ones (t=50) have not.
    let mut calls = 0;
    let mut removed = 0;
    loop {
        let progress = backend.cleanup_expired(100);
        assert!(progress.examined <= 100, "{progress:?}");
        removed += progress.removed;
        calls += 1;
        if progress.round_complete {
            break;
        }
        assert!(calls < 1000);
    }
    assert!(calls >= 40, "4000 entries at 100 per call: {calls} calls");
    // One round is complete: removing an entry moves no other past the cursor.
    let sizes: BTreeMap<String, u64> = backend
        .state_sizes()
        .into_iter()
        .map(|size| (size.name, size.entries))
        .collect();
    assert_eq!(sizes["v"], 1000);
    assert_eq!(sizes["l"], 1000);
    assert_eq!(sizes["forever"], 2000);
    assert_eq!(removed, 2000);
    for key in 0..2000u64 {
        backend.set_current_key(&key).unwrap();
        assert_eq!(value.value().unwrap().is_some(), key % 2 == 1);
        assert_eq!(forever.value().unwrap(), Some(key));
    }
}

#[test]
fn cleanup_does_not_copy_key_groups_a_snapshot_shares() {
    let f = Fixture::heap();
    let backend: LocalKeyedBackend<u64> = f.backend(128);
    let value = backend
        .value_state(
            &ValueStateDescriptor::<u64>::new("v")
                .with_ttl(StateTtlConfig::new(Duration::from_millis(100))),
        )
        .unwrap();
    for key in 0..100u64 {
        backend.set_current_key(&key).unwrap();
        value.update(key).unwrap();
    }
    let snapshot = backend.heap_snapshot().unwrap();
    // Nothing expired: cleanup only reads, and the snapshot stays complete either way.
    while !backend.cleanup_expired(1000).round_complete {}
    f.clock.advance(Duration::from_millis(100));
    while !backend.cleanup_expired(1000).round_complete {}
    assert_eq!(snapshot.state("v").unwrap().entries(), 100);
    assert_eq!(backend.state_sizes()[0].entries, 0);
}
