//! Property test: random operation sequences on both backends agree with a `HashMap` model.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use common::Fixture;
use proptest::prelude::*;
use weir_state::{
    KeyGroup, KeyGroupRange, ListState, ListStateDescriptor, LocalKeyedBackend, MapState,
    MapStateDescriptor, ReducingState, ReducingStateDescriptor, StateTtlConfig, TtlUpdateType,
    ValueState, ValueStateDescriptor,
};

const MAX_PARALLELISM: u32 = 8;
const TTL_MS: i64 = 10;

#[derive(Clone, Debug)]
enum Action {
    ValueGet,
    ValueSet(u16),
    ValueClear,
    ListGet,
    ListAdd(u16),
    ListAddAll(Vec<u16>),
    ListUpdate(Vec<u16>),
    ListClear,
    MapGet(u8),
    MapPut(u8, u16),
    MapRemove(u8),
    MapContains(u8),
    MapEntries,
    MapIsEmpty,
    MapClear,
    SumAdd(u16),
    SumGet,
    TtlGet,
    TtlSet(u16),
    Advance(u8),
    DeleteKeyGroups(u8, u8),
    Keys,
}

/// One step: make `(key, namespace)` current, then act.
#[derive(Clone, Debug)]
struct Op {
    key: u8,
    namespace: Option<u8>,
    action: Action,
}

fn action() -> impl Strategy<Value = Action> {
    let small = 0u16..50;
    let user_key = 0u8..6;
    prop_oneof![
        Just(Action::ValueGet),
        small.clone().prop_map(Action::ValueSet),
        Just(Action::ValueClear),
        Just(Action::ListGet),
        small.clone().prop_map(Action::ListAdd),
        proptest::collection::vec(small.clone(), 0..4).prop_map(Action::ListAddAll),
        proptest::collection::vec(small.clone(), 0..4).prop_map(Action::ListUpdate),
        Just(Action::ListClear),
        user_key.clone().prop_map(Action::MapGet),
        (user_key.clone(), small.clone()).prop_map(|(k, v)| Action::MapPut(k, v)),
        user_key.clone().prop_map(Action::MapRemove),
        user_key.prop_map(Action::MapContains),
        Just(Action::MapEntries),
        Just(Action::MapIsEmpty),
        Just(Action::MapClear),
        small.clone().prop_map(Action::SumAdd),
        Just(Action::SumGet),
        Just(Action::TtlGet),
        small.prop_map(Action::TtlSet),
        (0u8..15).prop_map(Action::Advance),
        (0u8..8, 0u8..3).prop_map(|(start, len)| Action::DeleteKeyGroups(start, len)),
        Just(Action::Keys),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    (0u8..12, proptest::option::of(0u8..3), action()).prop_map(|(key, namespace, action)| Op {
        key,
        namespace,
        action,
    })
}

type Slot = (u8, Option<u8>);

/// The expected state.
#[derive(Default)]
struct Model {
    now: i64,
    values: HashMap<Slot, u16>,
    lists: HashMap<Slot, Vec<u16>>,
    maps: HashMap<Slot, BTreeMap<u8, u16>>,
    sums: HashMap<Slot, u64>,
    /// Value and expiry of the TTL state (OnReadAndWrite).
    timed: HashMap<Slot, (u16, i64)>,
}

/// What an operation returned, compared between model and backend.
#[derive(Debug, PartialEq)]
enum Outcome {
    None,
    Value(Option<u16>),
    List(Vec<u16>),
    Entries(BTreeMap<u8, u16>),
    Bool(bool),
    Sum(Option<u64>),
    Keys(Vec<Slot>),
}

impl Model {
    fn apply(&mut self, op: &Op) -> Outcome {
        let slot = (op.key, op.namespace);
        match &op.action {
            Action::ValueGet => Outcome::Value(self.values.get(&slot).copied()),
            Action::ValueSet(v) => {
                self.values.insert(slot, *v);
                Outcome::None
            }
            Action::ValueClear => {
                self.values.remove(&slot);
                Outcome::None
            }
            Action::ListGet => Outcome::List(self.lists.get(&slot).cloned().unwrap_or_default()),
            Action::ListAdd(v) => {
                self.lists.entry(slot).or_default().push(*v);
                Outcome::None
            }
            Action::ListAddAll(vs) => {
                if !vs.is_empty() {
                    self.lists.entry(slot).or_default().extend(vs);
                }
                Outcome::None
            }
            Action::ListUpdate(vs) => {
                if vs.is_empty() {
                    self.lists.remove(&slot);
                } else {
                    self.lists.insert(slot, vs.clone());
                }
                Outcome::None
            }
            Action::ListClear => {
                self.lists.remove(&slot);
                Outcome::None
            }
            Action::MapGet(k) => {
                Outcome::Value(self.maps.get(&slot).and_then(|m| m.get(k)).copied())
            }
            Action::MapPut(k, v) => {
                self.maps.entry(slot).or_default().insert(*k, *v);
                Outcome::None
            }
            Action::MapRemove(k) => {
                if let Some(map) = self.maps.get_mut(&slot) {
                    map.remove(k);
                    if map.is_empty() {
                        self.maps.remove(&slot);
                    }
                }
                Outcome::None
            }
            Action::MapContains(k) => {
                Outcome::Bool(self.maps.get(&slot).is_some_and(|m| m.contains_key(k)))
            }
            Action::MapEntries => {
                Outcome::Entries(self.maps.get(&slot).cloned().unwrap_or_default())
            }
            Action::MapIsEmpty => Outcome::Bool(!self.maps.contains_key(&slot)),
            Action::MapClear => {
                self.maps.remove(&slot);
                Outcome::None
            }
            Action::SumAdd(v) => {
                *self.sums.entry(slot).or_default() += u64::from(*v);
                Outcome::None
            }
            Action::SumGet => Outcome::Sum(self.sums.get(&slot).copied()),
            Action::TtlGet => {
                let now = self.now;
                match self.timed.get_mut(&slot) {
                    Some((value, expires_at)) if *expires_at > now => {
                        *expires_at = now + TTL_MS;
                        Outcome::Value(Some(*value))
                    }
                    Some(_) => {
                        self.timed.remove(&slot);
                        Outcome::Value(None)
                    }
                    None => Outcome::Value(None),
                }
            }
            Action::TtlSet(v) => {
                self.timed.insert(slot, (*v, self.now + TTL_MS));
                Outcome::None
            }
            Action::Advance(ms) => {
                self.now += i64::from(*ms);
                Outcome::None
            }
            Action::DeleteKeyGroups(start, len) => {
                let range = key_group_range(*start, *len);
                let gone = |slot: &Slot| range.contains(KeyGroup::of(&slot.0, MAX_PARALLELISM));
                self.values.retain(|slot, _| !gone(slot));
                self.lists.retain(|slot, _| !gone(slot));
                self.maps.retain(|slot, _| !gone(slot));
                self.sums.retain(|slot, _| !gone(slot));
                self.timed.retain(|slot, _| !gone(slot));
                Outcome::None
            }
            Action::Keys => {
                let mut keys: Vec<Slot> = self.values.keys().copied().collect();
                keys.sort();
                Outcome::Keys(keys)
            }
        }
    }
}

fn key_group_range(start: u8, len: u8) -> KeyGroupRange {
    let start = u32::from(start);
    KeyGroupRange {
        start,
        end: (start + u32::from(len)).min(MAX_PARALLELISM - 1),
    }
}

/// The backend and its state handles.
struct System {
    fixture: Fixture,
    backend: LocalKeyedBackend<u8, u8>,
    value: ValueState<u16>,
    list: ListState<u16>,
    map: MapState<u8, u16>,
    sum: ReducingState<u64>,
    timed: ValueState<u16>,
}

impl System {
    fn new(fixture: Fixture) -> System {
        let backend: LocalKeyedBackend<u8, u8> = fixture.backend(MAX_PARALLELISM);
        let ttl = StateTtlConfig::new(Duration::from_millis(TTL_MS as u64))
            .with_update_type(TtlUpdateType::OnReadAndWrite);
        System {
            value: backend
                .value_state(&ValueStateDescriptor::new("v"))
                .unwrap(),
            list: backend.list_state(&ListStateDescriptor::new("l")).unwrap(),
            map: backend.map_state(&MapStateDescriptor::new("m")).unwrap(),
            sum: backend
                .reducing_state(&ReducingStateDescriptor::new("sum", |a: &u64, b: &u64| {
                    a + b
                }))
                .unwrap(),
            timed: backend
                .value_state(&ValueStateDescriptor::new("timed").with_ttl(ttl))
                .unwrap(),
            backend,
            fixture,
        }
    }

    fn apply(&self, op: &Op) -> Outcome {
        self.backend.set_current_key(&op.key).unwrap();
        match op.namespace {
            Some(namespace) => self.backend.set_current_namespace(namespace).unwrap(),
            None => self.backend.clear_current_namespace().unwrap(),
        }
        match &op.action {
            Action::ValueGet => Outcome::Value(self.value.value().unwrap()),
            Action::ValueSet(v) => {
                self.value.update(*v).unwrap();
                Outcome::None
            }
            Action::ValueClear => {
                self.value.clear().unwrap();
                Outcome::None
            }
            Action::ListGet => Outcome::List(self.list.get().unwrap()),
            Action::ListAdd(v) => {
                self.list.add(*v).unwrap();
                Outcome::None
            }
            Action::ListAddAll(vs) => {
                self.list.add_all(vs.clone()).unwrap();
                Outcome::None
            }
            Action::ListUpdate(vs) => {
                self.list.update(vs.clone()).unwrap();
                Outcome::None
            }
            Action::ListClear => {
                self.list.clear().unwrap();
                Outcome::None
            }
            Action::MapGet(k) => Outcome::Value(self.map.get(k).unwrap()),
            Action::MapPut(k, v) => {
                self.map.put(*k, *v).unwrap();
                Outcome::None
            }
            Action::MapRemove(k) => {
                self.map.remove(k).unwrap();
                Outcome::None
            }
            Action::MapContains(k) => Outcome::Bool(self.map.contains(k).unwrap()),
            Action::MapEntries => {
                Outcome::Entries(self.map.entries().unwrap().map(Result::unwrap).collect())
            }
            Action::MapIsEmpty => Outcome::Bool(self.map.is_empty().unwrap()),
            Action::MapClear => {
                self.map.clear().unwrap();
                Outcome::None
            }
            Action::SumAdd(v) => {
                self.sum.add(u64::from(*v)).unwrap();
                Outcome::None
            }
            Action::SumGet => Outcome::Sum(self.sum.get().unwrap()),
            Action::TtlGet => Outcome::Value(self.timed.value().unwrap()),
            Action::TtlSet(v) => {
                self.timed.update(*v).unwrap();
                Outcome::None
            }
            Action::Advance(ms) => {
                self.fixture
                    .clock
                    .advance(Duration::from_millis(u64::from(*ms)));
                Outcome::None
            }
            Action::DeleteKeyGroups(start, len) => {
                self.backend
                    .delete_key_groups(key_group_range(*start, *len))
                    .unwrap();
                Outcome::None
            }
            Action::Keys => {
                let mut keys = self.backend.keys("v", self.backend.key_groups()).unwrap();
                keys.sort();
                Outcome::Keys(keys)
            }
        }
    }
}

fn check(ops: &[Op]) -> Result<(), TestCaseError> {
    let heap = System::new(Fixture::heap());
    let rocksdb = System::new(Fixture::rocksdb());
    let mut model = Model {
        now: 1_000_000,
        ..Model::default()
    };
    for (step, op) in ops.iter().enumerate() {
        let expected = model.apply(op);
        prop_assert_eq!(&heap.apply(op), &expected, "heap, step {}: {:?}", step, op);
        prop_assert_eq!(
            &rocksdb.apply(op),
            &expected,
            "rocksdb, step {}: {:?}",
            step,
            op
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn backends_agree_with_a_hashmap_model(ops in proptest::collection::vec(op(), 1..100)) {
        check(&ops)?;
    }
}
