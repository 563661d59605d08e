//! Helpers shared by the engine's integration tests: environments sized to the machine and
//! multiset comparisons of job output.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;

use weir_engine::prelude::*;

/// Slots the tests run on: two where the machine has them (CI has two cores), never more
/// shards than cores.
pub fn slots() -> usize {
    weir_engine::runtime::available_cores().len().min(2)
}

/// The parallelisms worth testing here: 1 and, where there are two cores, 2.
pub fn parallelisms() -> Vec<usize> {
    (1..=slots()).collect()
}

/// A configuration with `slots` slots and the given `key=value` settings.
pub fn config_with(slots: usize, pairs: &[(&str, &str)]) -> Configuration {
    let mut config = Configuration::default();
    config
        .set("taskmanager.numberOfTaskSlots", slots.to_string())
        .expect("slot count is a valid setting");
    for (key, value) in pairs {
        config
            .set(key, *value)
            .unwrap_or_else(|e| panic!("test setting {key}={value}: {e}"));
    }
    config
}

/// An environment on [`slots`] slots.
pub fn env() -> StreamEnvironment {
    env_with(slots(), &[])
}

/// An environment on `slots` slots with the given settings.
pub fn env_with(slots: usize, pairs: &[(&str, &str)]) -> StreamEnvironment {
    StreamEnvironment::new(config_with(slots, pairs)).expect("environment")
}

/// How often each value occurs.
pub fn multiset<T: Hash + Eq>(values: impl IntoIterator<Item = T>) -> HashMap<T, usize> {
    let mut counts = HashMap::new();
    for value in values {
        *counts.entry(value).or_insert(0) += 1;
    }
    counts
}

/// Asserts that `actual` holds exactly the values of `expected`, each as often, in any order;
/// on failure, names the values missing and the values in excess.
#[track_caller]
pub fn assert_same_multiset<T: Hash + Eq + Debug + Clone>(actual: &[T], expected: &[T]) {
    let actual_counts = multiset(actual.iter().cloned());
    let expected_counts = multiset(expected.iter().cloned());
    if actual_counts == expected_counts {
        return;
    }
    let mut missing = Vec::new();
    let mut extra = Vec::new();
    for (value, &want) in &expected_counts {
        let got = actual_counts.get(value).copied().unwrap_or(0);
        if got < want {
            missing.push((value.clone(), want - got));
        }
    }
    for (value, &got) in &actual_counts {
        let want = expected_counts.get(value).copied().unwrap_or(0);
        if got > want {
            extra.push((value.clone(), got - want));
        }
    }
    missing.truncate(20);
    extra.truncate(20);
    panic!(
        "multisets differ: {} records received, {} expected; missing (value, times) {missing:?}; \
         in excess {extra:?}",
        actual.len(),
        expected.len()
    );
}

/// A small deterministic pseudo-random generator (xorshift), so that inputs are varied but
/// every run of a test sees the same ones.
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A value in `0..bound`.
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }
}

/// Runs `job` on its own thread and returns what it returns, failing the test if it has not
/// returned after `limit`: a guard that turns a hung job into a test failure instead of a hung
/// test run. Not a performance bound — set the limit far above any healthy run.
pub fn within<R: Send + 'static>(
    limit: std::time::Duration,
    what: &str,
    job: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (done, result) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("job: {what}"))
        .spawn(move || {
            let _ = done.send(job());
        })
        .expect("spawn the job thread");
    match result.recv_timeout(limit) {
        Ok(value) => value,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} did not end within {limit:?}: the job hangs")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("{what} panicked on its thread")
        }
    }
}
