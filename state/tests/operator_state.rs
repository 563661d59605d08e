//! Operator (non-keyed) state: handles, registration, snapshots and their byte format, and
//! redistribution to a new parallelism on restore.

use std::time::Duration;

use proptest::prelude::*;
use weir_state::{
    redistribute, DistributionMode, ListStateDescriptor, MapStateDescriptor, OperatorStateSnapshot,
    OperatorStateStore, StateError, StateErrorKind, StateTtlConfig, SNAPSHOT_FORMAT_VERSION,
};

fn offsets() -> ListStateDescriptor<u64> {
    ListStateDescriptor::new("offsets")
}

fn rules() -> MapStateDescriptor<String, u32> {
    MapStateDescriptor::new("rules")
}

// ---------------------------------------------------------------------------------------------
// Handles
// ---------------------------------------------------------------------------------------------

#[test]
fn list_state_add_update_clear() {
    let store = OperatorStateStore::new();
    for list in [
        store.list_state(&offsets()).unwrap(),
        store
            .union_list_state(&ListStateDescriptor::new("union-offsets"))
            .unwrap(),
    ] {
        assert!(list.is_empty());
        assert_eq!(list.get(), Vec::<u64>::new());
        list.add(1);
        list.add_all([2, 3]);
        assert_eq!(list.get(), vec![1, 2, 3]);
        assert_eq!(list.len(), 3);
        list.update([9, 8]);
        assert_eq!(list.get(), vec![9, 8]);
        list.add_all(Vec::new());
        assert_eq!(list.get(), vec![9, 8]);
        list.clear();
        assert!(list.is_empty());
        list.add(4);
        assert_eq!(list.get(), vec![4]);
    }
    assert_eq!(store.state_names(), vec!["offsets", "union-offsets"]);
    assert!(!store.is_restored());
}

#[test]
fn broadcast_state_map_operations() {
    let store = OperatorStateStore::new();
    let map = store.broadcast_state(&rules()).unwrap();
    assert!(map.is_empty());
    assert_eq!(map.get(&"a".to_string()), None);
    map.put("a".into(), 1);
    map.put_all([("b".into(), 2), ("c".into(), 3)]);
    map.put("a".into(), 10);
    assert_eq!(map.get(&"a".to_string()), Some(10));
    assert!(map.contains(&"b".to_string()));
    assert_eq!(map.len(), 3);
    assert_eq!(
        map.entries(),
        vec![("a".into(), 10), ("b".into(), 2), ("c".into(), 3)]
    );
    assert_eq!(map.remove(&"a".to_string()), Some(10));
    assert_eq!(map.remove(&"a".to_string()), None);
    assert!(!map.contains(&"a".to_string()));
    let mut keys = map.keys();
    keys.sort();
    assert_eq!(keys, vec!["b".to_string(), "c".to_string()]);
    map.clear();
    assert!(map.is_empty());
    assert_eq!(map.entries(), Vec::new());
}

#[test]
fn registering_again_returns_the_same_state() {
    let store = OperatorStateStore::new();
    let first = store.list_state(&offsets()).unwrap();
    let second = store.list_state(&offsets()).unwrap();
    first.add(7);
    assert_eq!(second.get(), vec![7]);

    let map = store.broadcast_state(&rules()).unwrap();
    store.broadcast_state(&rules()).unwrap().put("x".into(), 1);
    assert_eq!(map.get(&"x".to_string()), Some(1));
}

fn assert_incompatible(err: StateError, registered: &str, requested: &str) {
    let text = err.to_string();
    match err.kind() {
        StateErrorKind::IncompatibleRegistration {
            state,
            registered: found_registered,
            requested: found_requested,
        } => {
            assert_eq!(state, "offsets");
            assert_eq!(found_registered, registered);
            assert_eq!(found_requested, requested);
        }
        other => panic!("expected IncompatibleRegistration, got {other:?}"),
    }
    assert!(text.contains("'offsets'"), "{text}");
    assert!(text.contains("another name"), "{text}");
    assert!(err.is_usage_error());
}

#[test]
fn registration_conflicts_name_the_state_and_both_signatures() {
    let store = OperatorStateStore::new();
    store.list_state(&offsets()).unwrap();

    let err = store
        .list_state(&ListStateDescriptor::<u32>::new("offsets"))
        .unwrap_err();
    assert_incompatible(
        err,
        "ListState<u64> (split redistribution)",
        "ListState<u32> (split redistribution)",
    );

    let err = store.union_list_state(&offsets()).unwrap_err();
    assert_incompatible(
        err,
        "ListState<u64> (split redistribution)",
        "ListState<u64> (union redistribution)",
    );

    let err = store
        .broadcast_state(&MapStateDescriptor::<String, u32>::new("offsets"))
        .unwrap_err();
    assert_incompatible(
        err,
        "ListState<u64> (split redistribution)",
        "BroadcastState<alloc::string::String, u32>",
    );

    // The failed registrations changed nothing.
    assert_eq!(store.state_names(), vec!["offsets"]);
    store.list_state(&offsets()).unwrap();
}

#[test]
fn descriptors_with_ttl_are_refused() {
    let store = OperatorStateStore::new();
    let ttl = StateTtlConfig::new(Duration::from_secs(60));
    let errors = [
        store.list_state(&offsets().with_ttl(ttl)).unwrap_err(),
        store
            .union_list_state(&offsets().with_ttl(ttl))
            .unwrap_err(),
        store
            .broadcast_state(&MapStateDescriptor::<String, u32>::new("offsets").with_ttl(ttl))
            .unwrap_err(),
    ];
    for err in errors {
        assert!(
            matches!(err.kind(), StateErrorKind::OperatorStateTtl { state, .. } if state == "offsets"),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.contains("'offsets'"), "{text}");
        assert!(text.contains("remove with_ttl"), "{text}");
        assert!(err.is_usage_error());
    }
    assert!(store.state_names().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Snapshots
// ---------------------------------------------------------------------------------------------

/// A store with one state of each kind, filled.
fn filled_store() -> OperatorStateStore {
    let store = OperatorStateStore::new();
    store.list_state(&offsets()).unwrap().add_all([1, 2, 3]);
    store
        .union_list_state(&ListStateDescriptor::<String>::new("watermarks"))
        .unwrap()
        .add("w-1".into());
    store
        .broadcast_state(&rules())
        .unwrap()
        .put_all([("a".into(), 1), ("b".into(), 2)]);
    store
}

#[test]
fn snapshot_describes_every_state() {
    let snapshot = filled_store().snapshot().unwrap();
    let described: Vec<_> = snapshot
        .states()
        .iter()
        .map(|state| (state.name(), state.mode(), state.len()))
        .collect();
    assert_eq!(
        described,
        vec![
            ("offsets", DistributionMode::SplitDistribute, 3),
            ("watermarks", DistributionMode::Union, 1),
            ("rules", DistributionMode::Broadcast, 2),
        ]
    );
    let offsets_image = snapshot.state("offsets").unwrap();
    assert_eq!(offsets_image.type_names(), "u64");
    assert_eq!(offsets_image.list_elements().unwrap().len(), 3);
    assert!(offsets_image.broadcast_entries().is_none());
    assert_eq!(
        snapshot
            .state("rules")
            .unwrap()
            .broadcast_entries()
            .unwrap()
            .len(),
        2
    );
    assert!(snapshot.state("missing").is_none());
}

#[test]
fn later_writes_do_not_change_a_snapshot() {
    let store = filled_store();
    let snapshot = store.snapshot().unwrap();
    let bytes = snapshot.to_bytes().unwrap();

    store.list_state(&offsets()).unwrap().update([42]);
    store
        .union_list_state(&ListStateDescriptor::<String>::new("watermarks"))
        .unwrap()
        .clear();
    let map = store.broadcast_state(&rules()).unwrap();
    map.put("c".into(), 3);
    map.remove(&"a".to_string());
    store
        .list_state(&ListStateDescriptor::<u8>::new("new-state"))
        .unwrap()
        .add(1);

    assert_eq!(snapshot.to_bytes().unwrap(), bytes);
    let restored = OperatorStateStore::from_snapshot(snapshot);
    assert_eq!(
        restored.list_state(&offsets()).unwrap().get(),
        vec![1, 2, 3]
    );
    assert_eq!(
        restored
            .broadcast_state(&rules())
            .unwrap()
            .get(&"a".to_string()),
        Some(1)
    );
    assert_eq!(
        restored.state_names(),
        vec!["offsets", "watermarks", "rules"]
    );
    // And the store itself moved on.
    assert_eq!(store.snapshot().unwrap().state("offsets").unwrap().len(), 1);
}

#[test]
fn bytes_round_trip() {
    let snapshot = filled_store().snapshot().unwrap();
    let bytes = snapshot.to_bytes().unwrap();
    assert_eq!(&bytes[0..4], b"WOPS");
    assert_eq!(bytes[4], SNAPSHOT_FORMAT_VERSION);
    let decoded = OperatorStateSnapshot::from_bytes(&bytes).unwrap();
    assert_eq!(decoded, snapshot);
    // Deterministic: the same state gives the same bytes.
    assert_eq!(
        filled_store().snapshot().unwrap().to_bytes().unwrap(),
        bytes
    );

    let store = OperatorStateStore::from_snapshot(decoded);
    assert!(store.is_restored());
    assert_eq!(store.list_state(&offsets()).unwrap().get(), vec![1, 2, 3]);
    assert_eq!(
        store
            .union_list_state(&ListStateDescriptor::<String>::new("watermarks"))
            .unwrap()
            .get(),
        vec!["w-1".to_string()]
    );
    assert_eq!(
        store.broadcast_state(&rules()).unwrap().entries(),
        vec![("a".into(), 1), ("b".into(), 2)]
    );

    let empty = OperatorStateSnapshot::default();
    let decoded = OperatorStateSnapshot::from_bytes(&empty.to_bytes().unwrap()).unwrap();
    assert!(decoded.is_empty());
}

fn corrupt_problem(bytes: &[u8]) -> String {
    let err = OperatorStateSnapshot::from_bytes(bytes).expect_err("damaged bytes must not load");
    let text = err.to_string();
    match err.kind() {
        StateErrorKind::CorruptSnapshot { what, problem } => {
            assert_eq!(*what, "operator state snapshot");
            assert!(
                text.contains("restore from an earlier checkpoint"),
                "{text}"
            );
            problem.clone()
        }
        other => panic!("expected CorruptSnapshot, got {other:?}"),
    }
}

#[test]
fn truncated_bytes_are_a_clear_error() {
    let bytes = filled_store().snapshot().unwrap().to_bytes().unwrap();
    for len in 0..bytes.len() {
        let problem = corrupt_problem(&bytes[..len]);
        assert!(problem.contains("truncated"), "at {len}: {problem}");
    }
    let problem = corrupt_problem(&bytes[..5]);
    assert!(
        problem.contains("5 bytes, shorter than the 17-byte header"),
        "{problem}"
    );
    let problem = corrupt_problem(&bytes[..bytes.len() - 3]);
    assert!(
        problem.contains(&format!("only {} follow", bytes.len() - 17 - 3)),
        "{problem}"
    );

    let mut longer = bytes.clone();
    longer.extend_from_slice(&[0, 0]);
    let problem = corrupt_problem(&longer);
    assert!(
        problem.contains("2 unexpected bytes after the body"),
        "{problem}"
    );
}

#[test]
fn every_damaged_byte_is_detected() {
    let bytes = filled_store().snapshot().unwrap().to_bytes().unwrap();
    for at in 0..bytes.len() {
        for flip in [0x01u8, 0x80] {
            let mut damaged = bytes.clone();
            damaged[at] ^= flip;
            corrupt_problem(&damaged);
        }
    }

    let mut bad_magic = bytes.clone();
    bad_magic[0] = b'X';
    assert!(corrupt_problem(&bad_magic).contains("not an operator state snapshot"));

    let mut future = bytes.clone();
    future[4] = SNAPSHOT_FORMAT_VERSION + 1;
    let problem = corrupt_problem(&future);
    assert!(
        problem.contains(&format!(
            "format version {}, this build reads version {SNAPSHOT_FORMAT_VERSION}",
            SNAPSHOT_FORMAT_VERSION + 1
        )),
        "{problem}"
    );

    let mut damaged_body = bytes.clone();
    let last = damaged_body.len() - 1;
    damaged_body[last] ^= 0xff;
    assert!(corrupt_problem(&damaged_body).contains("CRC-32"));
}

// ---------------------------------------------------------------------------------------------
// Restore
// ---------------------------------------------------------------------------------------------

#[test]
fn restored_state_is_decoded_when_registered() {
    let store = OperatorStateStore::new();
    store
        .list_state(&ListStateDescriptor::<u8>::new("flags"))
        .unwrap()
        .add_all([0, 7]);
    store.list_state(&offsets()).unwrap().add(5);
    let snapshot = store.snapshot().unwrap();

    let restored = OperatorStateStore::restore(&[snapshot], 0, 1).unwrap();
    assert!(restored.is_restored());
    // Registered with a type the bytes do not decode as: an error naming the state.
    let err = restored
        .list_state(&ListStateDescriptor::<bool>::new("flags"))
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err.kind(), StateErrorKind::Corrupt { state, what: "list element", type_name: "bool", .. } if state == "flags"),
        "{err:?}"
    );
    assert!(text.contains("'flags'"), "{text}");
    assert!(
        text.contains("ListState<u8> (split redistribution)"),
        "{text}"
    );
    assert!(
        text.contains("clear the state if the type changed on purpose"),
        "{text}"
    );
    // The restored bytes are still there for the right type.
    assert_eq!(
        restored
            .list_state(&ListStateDescriptor::<u8>::new("flags"))
            .unwrap()
            .get(),
        vec![0, 7]
    );

    // Another mode than the checkpoint's: an error naming the state and both modes.
    for err in [
        restored.union_list_state(&offsets()).unwrap_err(),
        restored
            .broadcast_state(&MapStateDescriptor::<u64, u64>::new("offsets"))
            .unwrap_err(),
    ] {
        assert!(
            matches!(err.kind(), StateErrorKind::IncompatibleRestore { state, restored, .. }
                if state == "offsets" && restored == "ListState<u64> (split redistribution)"),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("register it as ListState<u64>"),
            "{err}"
        );
    }
    assert_eq!(restored.list_state(&offsets()).unwrap().get(), vec![5]);
}

#[test]
fn unregistered_restored_state_survives_later_snapshots() {
    let snapshot = filled_store().snapshot().unwrap();
    let restored = OperatorStateStore::from_snapshot(snapshot.clone());
    restored.list_state(&offsets()).unwrap().add(4);
    let next = restored.snapshot().unwrap();
    assert_eq!(next.state("watermarks"), snapshot.state("watermarks"));
    assert_eq!(next.state("rules"), snapshot.state("rules"));
    assert_eq!(next.state("offsets").unwrap().len(), 4);
}

#[test]
fn restore_checks_subtask_and_parallelism() {
    let old = vec![filled_store().snapshot().unwrap()];
    for (subtask, parallelism) in [(0, 0), (2, 2), (5, 3)] {
        let err = OperatorStateStore::restore(&old, subtask, parallelism).unwrap_err();
        assert!(
            matches!(err.kind(), StateErrorKind::InvalidConfig { .. }),
            "{err:?}"
        );
    }
    // No old subtasks: the operator had no state in the checkpoint.
    let store = OperatorStateStore::restore(&[], 0, 4).unwrap();
    assert!(store.state_names().is_empty());
    assert!(store.is_restored());
}

#[test]
fn old_subtasks_disagreeing_on_a_mode_is_an_error() {
    let split = OperatorStateStore::new();
    split.list_state(&offsets()).unwrap();
    let union = OperatorStateStore::new();
    union.union_list_state(&offsets()).unwrap();
    let old = [split.snapshot().unwrap(), union.snapshot().unwrap()];
    let err = redistribute(&old, 0, 3).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(
            "state 'offsets' is a split list in old subtask 0 but a union list in old subtask 1"
        ),
        "{text}"
    );
}

#[test]
fn split_lists_rescale_as_documented() {
    // 10 elements over 2 old subtasks (4 + 6), restored with 3: 4, 3, 3.
    let old: Vec<_> = [vec![0u64, 1, 2, 3], vec![4, 5, 6, 7, 8, 9]]
        .into_iter()
        .map(|elements| {
            let store = OperatorStateStore::new();
            store.list_state(&offsets()).unwrap().update(elements);
            store.snapshot().unwrap()
        })
        .collect();
    let shares: Vec<Vec<u64>> = (0..3)
        .map(|subtask| {
            let store = OperatorStateStore::restore(&old, subtask, 3).unwrap();
            store.list_state(&offsets()).unwrap().get()
        })
        .collect();
    assert_eq!(shares, vec![vec![0, 1, 2, 3], vec![4, 5, 6], vec![7, 8, 9]]);

    // Unchanged parallelism: every subtask keeps its own list, however uneven.
    for (subtask, expected) in [vec![0u64, 1, 2, 3], vec![4, 5, 6, 7, 8, 9]]
        .iter()
        .enumerate()
    {
        let store = OperatorStateStore::restore(&old, subtask as u32, 2).unwrap();
        assert_eq!(&store.list_state(&offsets()).unwrap().get(), expected);
    }
}

// ---------------------------------------------------------------------------------------------
// Redistribution properties
// ---------------------------------------------------------------------------------------------

/// Old subtasks: one list per subtask for each list kind, one broadcast copy per subtask.
fn old_snapshots(lists: &[Vec<u32>], broadcast: &[(u32, u32)]) -> Vec<OperatorStateSnapshot> {
    lists
        .iter()
        .enumerate()
        .map(|(subtask, elements)| {
            let store = OperatorStateStore::new();
            // Tag elements with their old subtask so that duplicates would show.
            let tagged: Vec<(u32, u32)> = elements.iter().map(|&e| (subtask as u32, e)).collect();
            store
                .list_state(&ListStateDescriptor::<(u32, u32)>::new("split"))
                .unwrap()
                .update(tagged.clone());
            store
                .union_list_state(&ListStateDescriptor::<(u32, u32)>::new("union"))
                .unwrap()
                .update(tagged);
            store
                .broadcast_state(&MapStateDescriptor::<u32, u32>::new("broadcast"))
                .unwrap()
                .put_all(broadcast.iter().copied());
            // Through the file format, as a real restore would.
            let bytes = store.snapshot().unwrap().to_bytes().unwrap();
            OperatorStateSnapshot::from_bytes(&bytes).unwrap()
        })
        .collect()
}

struct Restored {
    split: Vec<(u32, u32)>,
    union: Vec<(u32, u32)>,
    broadcast: Vec<(u32, u32)>,
}

fn restore_all(old: &[OperatorStateSnapshot], parallelism: u32) -> Vec<Restored> {
    (0..parallelism)
        .map(|subtask| {
            let store = OperatorStateStore::restore(old, subtask, parallelism).unwrap();
            Restored {
                split: store
                    .list_state(&ListStateDescriptor::<(u32, u32)>::new("split"))
                    .unwrap()
                    .get(),
                union: store
                    .union_list_state(&ListStateDescriptor::<(u32, u32)>::new("union"))
                    .unwrap()
                    .get(),
                broadcast: store
                    .broadcast_state(&MapStateDescriptor::<u32, u32>::new("broadcast"))
                    .unwrap()
                    .entries(),
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn redistribution_loses_and_duplicates_nothing(
        lists in proptest::collection::vec(proptest::collection::vec(any::<u32>(), 0..20), 1..=8),
        broadcast in proptest::collection::vec((any::<u32>(), any::<u32>()), 0..10),
        new_parallelism in 1u32..=8,
    ) {
        let old = old_snapshots(&lists, &broadcast);
        let concatenation: Vec<(u32, u32)> = lists
            .iter()
            .enumerate()
            .flat_map(|(subtask, elements)| elements.iter().map(move |&e| (subtask as u32, e)))
            .collect();
        let restored = restore_all(&old, new_parallelism);
        prop_assert_eq!(restored.len(), new_parallelism as usize);

        // Split: the new lists, concatenated in subtask order, are the old concatenation:
        // nothing lost, nothing duplicated, order kept.
        let split: Vec<(u32, u32)> = restored.iter().flat_map(|r| r.split.clone()).collect();
        prop_assert_eq!(&split, &concatenation);
        if lists.len() == new_parallelism as usize {
            // Unchanged parallelism: every subtask gets its own list back.
            for (subtask, r) in restored.iter().enumerate() {
                prop_assert_eq!(r.split.len(), lists[subtask].len());
            }
        } else {
            // Rescaled: ⌈n/p⌉ for the first n mod p subtasks, ⌊n/p⌋ for the others.
            let n = concatenation.len();
            let p = new_parallelism as usize;
            for (subtask, r) in restored.iter().enumerate() {
                let expected = n / p + usize::from(subtask < n % p);
                prop_assert_eq!(r.split.len(), expected);
            }
            let sizes: Vec<usize> = restored.iter().map(|r| r.split.len()).collect();
            prop_assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        }

        // Union: everyone gets everything, in old subtask order.
        for r in &restored {
            prop_assert_eq!(&r.union, &concatenation);
        }

        // Broadcast: equal everywhere, equal to the old copies (insertion order included).
        let mut expected = indexmap::IndexMap::new();
        expected.extend(broadcast.iter().copied());
        let expected: Vec<(u32, u32)> = expected.into_iter().collect();
        for r in &restored {
            prop_assert_eq!(&r.broadcast, &expected);
        }
    }

    #[test]
    fn split_redistribution_of_snapshots_tiles_the_elements(
        sizes in proptest::collection::vec(0usize..30, 1..=8),
        new_parallelism in 1u32..=8,
    ) {
        let lists: Vec<Vec<u32>> = sizes.iter().map(|&n| (0..n as u32).collect()).collect();
        let old = old_snapshots(&lists, &[]);
        let mut all = Vec::new();
        for subtask in 0..new_parallelism {
            let share = redistribute(&old, subtask, new_parallelism).unwrap();
            // Every new subtask knows every state, possibly empty.
            let names: Vec<&str> = share.states().iter().map(|s| s.name()).collect();
            prop_assert_eq!(names, vec!["split", "union", "broadcast"]);
            all.extend(share.state("split").unwrap().list_elements().unwrap().to_vec());
        }
        let expected: Vec<Vec<u8>> = old
            .iter()
            .flat_map(|s| s.state("split").unwrap().list_elements().unwrap().to_vec())
            .collect();
        prop_assert_eq!(all, expected);
    }
}

#[test]
fn broadcast_copies_are_taken_round_robin() {
    // Copies that differ (they should not, but a user's broadcast function may be
    // non-deterministic): new subtask i gets old copy i mod old parallelism, as in Flink.
    let old: Vec<_> = (0..2u32)
        .map(|subtask| {
            let store = OperatorStateStore::new();
            store
                .broadcast_state(&rules())
                .unwrap()
                .put("from".into(), subtask);
            store.snapshot().unwrap()
        })
        .collect();
    for (subtask, expected) in [(0, 0), (1, 1), (2, 0), (3, 1), (4, 0)] {
        let store = OperatorStateStore::restore(&old, subtask, 5).unwrap();
        assert_eq!(
            store
                .broadcast_state(&rules())
                .unwrap()
                .get(&"from".to_string()),
            Some(expected)
        );
    }
}
