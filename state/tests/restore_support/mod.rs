//! What the keyed-restore tests share: heap backends of one subtask, checkpoints of them, and
//! five states of every kind with a writer and a reader of all they hold.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rkyv::{Archive, Deserialize, Serialize};
use weir_state::checksum::crc32;
use weir_state::{
    encode_keyed_snapshot, AggregateFunction, AggregatingStateDescriptor, KeyGroup,
    KeyedBackendConfig, ListStateDescriptor, LocalKeyedBackend, ManualClock, MapStateDescriptor,
    ReducingStateDescriptor, StateCodec, StateKey, ValueStateDescriptor,
};

pub const MAX_PARALLELISM: u32 = 128;
pub const START_MS: i64 = 1_000_000;

/// A heap backend for subtask `subtask` of `parallelism`, on a clock of its own.
pub fn heap<N: StateKey + StateCodec>(
    parallelism: u32,
    subtask: u32,
) -> (LocalKeyedBackend<u64, N>, ManualClock) {
    let clock = ManualClock::new(START_MS);
    let config = KeyedBackendConfig::for_subtask(MAX_PARALLELISM, parallelism, subtask);
    let backend = LocalKeyedBackend::heap(config, Arc::new(clock.clone())).expect("heap backend");
    (backend, clock)
}

/// The subtask of `parallelism` that owns `key`.
pub fn owner(key: u64, parallelism: u32) -> u32 {
    KeyGroup::of(&key, MAX_PARALLELISM).subtask(MAX_PARALLELISM, parallelism)
}

/// The backend's state, encoded.
pub fn checkpoint<N: StateKey + StateCodec>(backend: &LocalKeyedBackend<u64, N>) -> Vec<u8> {
    let snapshot = backend.heap_snapshot().expect("a heap backend");
    let mut bytes = Vec::new();
    encode_keyed_snapshot(&snapshot, &mut bytes).expect("encode");
    bytes
}

/// An average: the accumulator is (sum, count).
pub struct Average;

impl AggregateFunction<u64, (u64, u64), u64> for Average {
    fn create_accumulator(&self) -> (u64, u64) {
        (0, 0)
    }
    fn add(&self, value: u64, accumulator: &mut (u64, u64)) {
        accumulator.0 += value;
        accumulator.1 += 1;
    }
    fn get_result(&self, accumulator: &(u64, u64)) -> u64 {
        accumulator.0 / accumulator.1.max(1)
    }
    fn merge(&self, into: &mut (u64, u64), other: &(u64, u64)) {
        into.0 += other.0;
        into.1 += other.1;
    }
}

/// A user type with a layout of its own.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Session {
    pub user: String,
    pub clicks: u32,
}

pub fn value_d() -> ValueStateDescriptor<Session> {
    ValueStateDescriptor::new("session")
}
pub fn list_d() -> ListStateDescriptor<u64> {
    ListStateDescriptor::new("events")
}
pub fn map_d() -> MapStateDescriptor<String, u64> {
    MapStateDescriptor::new("counts")
}
pub fn reducing_d() -> ReducingStateDescriptor<u64> {
    ReducingStateDescriptor::new("sum", |a, b| a + b)
}
pub fn aggregating_d() -> AggregatingStateDescriptor<u64, (u64, u64), u64> {
    AggregatingStateDescriptor::new("average", Average)
}

/// Everything the five states hold for one `(key, namespace)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Contents {
    pub session: Option<Session>,
    pub events: Vec<u64>,
    pub counts: Vec<(String, u64)>,
    pub sum: Option<u64>,
    pub average: Option<u64>,
}

pub type Dump<N> = BTreeMap<(u64, Option<N>), Contents>;

/// Writes the five states for `keys`, each under every namespace of `namespaces`.
pub fn write_all<N: StateKey + StateCodec>(
    backend: &LocalKeyedBackend<u64, N>,
    keys: impl IntoIterator<Item = u64>,
    namespaces: &[Option<N>],
) {
    let value = backend.value_state(&value_d()).unwrap();
    let list = backend.list_state(&list_d()).unwrap();
    let map = backend.map_state(&map_d()).unwrap();
    let reducing = backend.reducing_state(&reducing_d()).unwrap();
    let aggregating = backend.aggregating_state(&aggregating_d()).unwrap();
    for key in keys {
        backend.set_current_key(&key).unwrap();
        for (n, namespace) in namespaces.iter().enumerate() {
            match namespace {
                Some(namespace) => backend.set_current_namespace(namespace.clone()).unwrap(),
                None => backend.clear_current_namespace().unwrap(),
            }
            let salt = key * 10 + n as u64;
            value
                .update(Session {
                    user: format!("user-{salt}"),
                    clicks: salt as u32,
                })
                .unwrap();
            // Out of order, so that order matters.
            list.add_all([salt + 2, salt, salt + 1]).unwrap();
            for word in ["zeta", "alpha", "mid"]
                .iter()
                .take(1 + (salt % 3) as usize)
            {
                map.put(format!("{word}-{salt}"), salt).unwrap();
            }
            reducing.add(salt).unwrap();
            reducing.add(1).unwrap();
            aggregating.add(salt).unwrap();
            aggregating.add(salt + 4).unwrap();
        }
    }
}

/// Registers the five states and reads everything they hold in the backend's key groups.
pub fn dump<N: StateKey + StateCodec + Ord>(backend: &LocalKeyedBackend<u64, N>) -> Dump<N> {
    let value = backend.value_state(&value_d()).unwrap();
    let list = backend.list_state(&list_d()).unwrap();
    let map = backend.map_state(&map_d()).unwrap();
    let reducing = backend.reducing_state(&reducing_d()).unwrap();
    let aggregating = backend.aggregating_state(&aggregating_d()).unwrap();
    let mut keys = BTreeSet::new();
    for state in ["session", "events", "counts", "sum", "average"] {
        keys.extend(backend.keys(state, backend.key_groups()).unwrap());
    }
    let mut out = Dump::new();
    for (key, namespace) in keys {
        backend.set_current_key(&key).unwrap();
        match &namespace {
            Some(namespace) => backend.set_current_namespace(namespace.clone()).unwrap(),
            None => backend.clear_current_namespace().unwrap(),
        }
        let contents = Contents {
            session: value.value().unwrap(),
            events: list.get().unwrap(),
            counts: map.entries().unwrap().map(Result::unwrap).collect(),
            sum: reducing.get().unwrap(),
            average: aggregating.get().unwrap(),
        };
        out.insert((key, namespace), contents);
    }
    out
}

/// `bytes` with the checksum recomputed, so that a change inside them passes it.
pub fn with_checksum(mut bytes: Vec<u8>) -> Vec<u8> {
    let body = bytes.len() - 4;
    let checksum = crc32(&bytes[..body]);
    bytes[body..].copy_from_slice(&checksum.to_le_bytes());
    bytes
}
