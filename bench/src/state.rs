//! The keyed-state benchmark: a `ValueState<u64>` read and written once per operation on one
//! shard, on the heap or the RocksDB backend, against a plain `HashMap<u64, u64>` loop doing the
//! same reads and writes.
//!
//! Operation `i` picks key `key_of(i)` — a Fibonacci hash of `i` modulo `keys`, the same
//! pseudo-random sequence as the window benchmark, so every key is touched and consecutive
//! operations rarely hit the same key — and adds `i + 1` to that key's sum. The engine side does
//! what a keyed operator does per record: `set_current_key`, `value()`, `update()`. The baseline
//! does a `get` and an `insert` on a `std::collections::HashMap` with the default hasher
//! (SipHash-1-3, randomly seeded), also two lookups per operation. Both start empty each round.
//!
//! Only the loop is timed; opening the backend (on RocksDB: a fresh database in a temporary
//! directory, with one slot's default managed memory as its cache, far more than the working set
//! of the default 10 000 keys) is not. After the loop, both sides read every key back into an
//! order-independent checksum, which must agree.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tempfile::TempDir;
use weir_memory::{MemoryConfig, RocksDbMemoryRatios};
use weir_state::{
    Clock, KeyedBackendConfig, LocalKeyedBackend, RocksDbConfig, RocksDbInstance, StateError,
    SystemClock, ValueStateDescriptor,
};

use crate::error::BenchError;
use crate::measure::{alternate, rate, Measurement, ROUNDS};

/// Key groups of the benchmarked backend (`pipeline.max-parallelism`'s default).
const MAX_PARALLELISM: u32 = 128;
/// The operator id that names the RocksDB column family.
const OPERATOR: &str = "bench-state";

/// Which keyed state backend to benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StateBackend {
    /// Typed maps on the heap.
    Heap,
    /// A slot RocksDB instance.
    RocksDb,
}

impl StateBackend {
    fn name(self) -> &'static str {
        match self {
            StateBackend::Heap => "heap",
            StateBackend::RocksDb => "rocksdb",
        }
    }

    /// Its `state.backend.type`.
    pub(crate) fn config_name(self) -> &'static str {
        match self {
            StateBackend::Heap => "hashmap",
            StateBackend::RocksDb => "rocksdb",
        }
    }
}

impl std::str::FromStr for StateBackend {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "heap" => Ok(StateBackend::Heap),
            "rocksdb" => Ok(StateBackend::RocksDb),
            other => Err(format!(
                "unknown state backend '{other}'; use heap or rocksdb"
            )),
        }
    }
}

/// What `weir bench state --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct StateReport {
    /// Always `"state"`.
    pub benchmark: &'static str,
    /// The backend measured.
    pub backend: StateBackend,
    /// RocksDB: the share of managed memory its write-back cache had.
    pub write_back_ratio: Option<f64>,
    /// Distinct keys.
    pub keys: u64,
    /// Operations (get + update of one key's value) per run.
    pub ops: u64,
    /// Rounds run; the best round of each side is reported.
    pub rounds: usize,
    /// The backend's best wall time for the loop, in seconds.
    pub seconds: f64,
    /// The backend's throughput: operations (one read and one write each) per second, one shard.
    pub ops_per_second: f64,
    /// The `HashMap` loop's best wall time, in seconds.
    pub baseline_seconds: f64,
    /// The `HashMap` loop's throughput.
    pub baseline_ops_per_second: f64,
    /// `baseline_ops_per_second / ops_per_second`: how many times slower the backend is.
    pub ratio: f64,
    /// Whether the backend's final per-key sums equal the loop's (same checksum and key count).
    pub results_match: bool,
}

/// The key of operation `i`.
#[inline]
fn key_of(i: u64, keys: u64) -> u64 {
    let mixed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed ^ (mixed >> 29)) % keys
}

/// An order-independent digest of the final `(key, sum)` pairs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Checksum {
    keys: u64,
    digest: u64,
}

impl Checksum {
    fn add(&mut self, key: u64, sum: u64) {
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ sum.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        self.keys += 1;
        self.digest = self
            .digest
            .wrapping_add(h.wrapping_mul(0x1656_67B1_9E37_79F9));
    }
}

/// A backend under benchmark and, for RocksDB, the directory its database lives in. Fields
/// drop in declaration order: the database closes (and flushes) before its directory goes.
struct OpenBackend {
    backend: LocalKeyedBackend<u64>,
    _dir: Option<TempDir>,
}

/// A fresh backend of `kind` over all key groups; on RocksDB with a write-back cache of
/// `write_back_ratio` of the slot's managed memory.
fn open_backend(kind: StateBackend, write_back_ratio: f64) -> Result<OpenBackend, BenchError> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let config = KeyedBackendConfig::single(MAX_PARALLELISM);
    let failed = BenchError::state(kind.name());
    match kind {
        StateBackend::Heap => Ok(OpenBackend {
            backend: LocalKeyedBackend::heap(config, clock).map_err(failed)?,
            _dir: None,
        }),
        StateBackend::RocksDb => {
            let dir = tempfile::tempdir().map_err(|source| BenchError::TempDir {
                dir: std::env::temp_dir(),
                error: source,
            })?;
            // One slot's share of the default worker memory: write-back cache, block cache and
            // memtable budget.
            let ratios = RocksDbMemoryRatios {
                write_back_ratio,
                ..RocksDbMemoryRatios::default()
            };
            ratios.validate()?;
            let budget = MemoryConfig::default()
                .worker_budget_with(1, ratios)
                .slot
                .rocksdb;
            let rocks = RocksDbConfig::from_budget(dir.path().join("db"), &budget);
            let slot =
                RocksDbInstance::open(rocks, clock).map_err(BenchError::state(kind.name()))?;
            Ok(OpenBackend {
                backend: LocalKeyedBackend::rocksdb(config, slot, OPERATOR).map_err(failed)?,
                _dir: Some(dir),
            })
        }
    }
}

/// The get + update loop on a fresh backend of `kind`, then the read-back.
fn run_engine(
    kind: StateBackend,
    write_back_ratio: f64,
    keys: u64,
    ops: u64,
) -> Result<(Measurement, Checksum), BenchError> {
    let open = open_backend(kind, write_back_ratio)?;
    let backend = &open.backend;
    let run = || -> Result<(Measurement, Checksum), StateError> {
        let sums = backend.value_state(&ValueStateDescriptor::<u64>::new("sum"))?;
        let started = Instant::now();
        for i in 0..ops {
            backend.set_current_key(&key_of(i, keys))?;
            let sum = sums.value()?.unwrap_or(0);
            sums.update(sum.wrapping_add(i + 1))?;
        }
        let duration = started.elapsed();
        let mut checksum = Checksum::default();
        for key in 0..keys {
            backend.set_current_key(&key)?;
            if let Some(sum) = sums.value()? {
                checksum.add(key, sum);
            }
        }
        Ok((
            Measurement {
                duration,
                surviving_records: checksum.keys,
            },
            checksum,
        ))
    };
    run().map_err(BenchError::state(kind.name()))
}

/// The `HashMap` loop: the same operations, a `get` and an `insert` each.
fn run_baseline(keys: u64, ops: u64) -> (Measurement, Checksum) {
    let mut sums: HashMap<u64, u64> = HashMap::new();
    let started = Instant::now();
    for i in 0..ops {
        let key = key_of(i, keys);
        let sum = sums.get(&key).copied().unwrap_or(0);
        sums.insert(key, sum.wrapping_add(i + 1));
    }
    let duration = started.elapsed();
    black_box(&sums);
    let mut checksum = Checksum::default();
    for key in 0..keys {
        if let Some(&sum) = sums.get(&key) {
            checksum.add(key, sum);
        }
    }
    (
        Measurement {
            duration,
            surviving_records: checksum.keys,
        },
        checksum,
    )
}

/// Runs the `HashMap` loop and the backend alternately, [`ROUNDS`] times each; reports the best
/// rounds. `write_back_ratio` is `state.backend.rocksdb.memory.write-back-ratio` (RocksDB only).
pub fn run(
    backend: StateBackend,
    write_back_ratio: f64,
    keys: u64,
    ops: u64,
) -> Result<StateReport, BenchError> {
    if ops == 0 {
        return Err(BenchError::NoOps);
    }
    RocksDbMemoryRatios {
        write_back_ratio,
        ..RocksDbMemoryRatios::default()
    }
    .validate()?;
    let keys = keys.max(1);
    let mut engine_sum = Checksum::default();
    let mut baseline_sum = Checksum::default();
    let (engine, baseline) = alternate(
        || {
            let (m, s) = run_baseline(keys, ops);
            baseline_sum = s;
            m
        },
        || {
            run_engine(backend, write_back_ratio, keys, ops).map(|(m, s)| {
                engine_sum = s;
                m
            })
        },
    )?;
    let ops_per_second = rate(ops, engine.duration);
    let baseline_ops_per_second = rate(ops, baseline.duration);
    Ok(StateReport {
        benchmark: "state",
        backend,
        write_back_ratio: (backend == StateBackend::RocksDb).then_some(write_back_ratio),
        keys,
        ops,
        rounds: ROUNDS,
        seconds: engine.duration.as_secs_f64(),
        ops_per_second,
        baseline_seconds: baseline.duration.as_secs_f64(),
        baseline_ops_per_second,
        ratio: baseline_ops_per_second / ops_per_second,
        results_match: engine_sum == baseline_sum && engine_sum.keys > 0,
    })
}

#[cfg(test)]
mod tests {
    use weir_memory::DEFAULT_WRITE_BACK_RATIO;

    use super::*;

    #[test]
    fn both_backends_match_the_hash_map() {
        let cases = [
            (StateBackend::Heap, DEFAULT_WRITE_BACK_RATIO),
            (StateBackend::RocksDb, DEFAULT_WRITE_BACK_RATIO),
            (StateBackend::RocksDb, 0.0),
        ];
        for (backend, write_back_ratio) in cases {
            let report = run(backend, write_back_ratio, 100, 20_000).unwrap();
            assert!(report.results_match, "{report:?}");
            assert!(report.ops_per_second > 0.0, "{report:?}");
            let json = serde_json::to_value(&report).unwrap();
            for field in [
                "backend",
                "ops",
                "seconds",
                "ops_per_second",
                "baseline_ops_per_second",
                "ratio",
                "results_match",
            ] {
                assert!(json.get(field).is_some(), "missing {field} in {json}");
            }
            assert_eq!(json["backend"], backend.name());
        }
    }

    #[test]
    fn zero_ops_is_refused() {
        assert!(matches!(
            run(StateBackend::Heap, DEFAULT_WRITE_BACK_RATIO, 10, 0),
            Err(BenchError::NoOps)
        ));
    }

    #[test]
    fn backend_names_parse() {
        assert_eq!("heap".parse(), Ok(StateBackend::Heap));
        assert_eq!("rocksdb".parse(), Ok(StateBackend::RocksDb));
        assert!("memory".parse::<StateBackend>().is_err());
    }

    #[test]
    fn a_bad_write_back_ratio_names_the_key() {
        let error = run(StateBackend::RocksDb, 1.5, 10, 10)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("state.backend.rocksdb.memory.write-back-ratio = 1.5"),
            "{error}"
        );
    }
}
