//! Property: for any collection of (key, value) records, key_by + a summing reduce ends with
//! each key's sum, computed in the one subtask that owns the key.

mod common;

use std::collections::HashMap;

use proptest::prelude::*;
use weir_engine::prelude::*;

fn final_sums(records: Vec<(u8, u32)>) -> (HashMap<u8, u64>, usize) {
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_collection(records)
        .map(|(key, value): (u8, u32)| (key, u64::from(value)))
        .key_by(|(key, _): &(u8, u64)| *key)
        .reduce(|(key, a): (u8, u64), (_, b): (u8, u64)| (key, a + b))
        .sink_to(sink, "sums");
    env.execute("keyed sums").expect("the job succeeds");
    // The last value a key's subtask emitted is its sum; a key must live in one subtask only.
    let mut sums = HashMap::new();
    let mut owner = HashMap::new();
    for (subtask, records) in collected.by_subtask().into_iter().enumerate() {
        for (key, sum) in records {
            assert_eq!(
                *owner.entry(key).or_insert(subtask),
                subtask,
                "key {key} in two subtasks"
            );
            sums.insert(key, sum);
        }
    }
    (sums, collected.len())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn keyed_reduce_sums_match_a_hash_map(
        records in proptest::collection::vec((any::<u8>(), any::<u32>()), 0..2_000)
    ) {
        let mut expected: HashMap<u8, u64> = HashMap::new();
        for &(key, value) in &records {
            *expected.entry(key).or_insert(0) += u64::from(value);
        }
        let count = records.len();
        let (sums, outputs) = final_sums(records);
        prop_assert_eq!(outputs, count, "one reduce output per record");
        prop_assert_eq!(sums, expected);
    }
}
