//! The checkpoint benchmark (`weir bench checkpoint`): what checkpoints cost a keyed job that
//! holds a given amount of state, and how long it takes to come back from a failure.
//!
//! One keyed function on one shard keeps a `ValueState<Vec<u8>>` of `value_bytes` per key for
//! `state_bytes / value_bytes` keys, on the heap or in RocksDB, checkpointed every `interval`.
//! Its source first writes every key once (the fill, as fast as the job goes), then, each
//! interval, updates 1 % of the keys, spread over the key space (a Fibonacci hash): a *round*.
//! Values are pseudo-random bytes (they do not compress).
//! At the first record of round `rounds + 1` the function panics (once); the job restarts
//! (`fixed-delay`, no delay) from its latest checkpoint, replays what came after it and runs
//! `rounds` more rounds before its input ends.
//!
//! Reported, for the run after the restart (the job's figures are the last run's): the
//! checkpoints' sync pauses (per checkpoint, how long the shard worked on the snapshot instead
//! of records), their durations (trigger to commit), the last one's full size and what it
//! wrote (RocksDB: the SST files no earlier checkpoint wrote; 1 % of the keys changed since the
//! one before); and, from the injected failure, the time until the restored function was open
//! (`restore_seconds`: the checkpoint read, the tasks deployed, the state restored) and until
//! it processed its first record again (`recovery_seconds`). A state is registered at its first
//! use, and the heap decodes its restored entries then: on the heap that part of the restore
//! falls in `recovery_seconds`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use weir_engine::connector::{
    Boundedness, ConnectorError, LocalBoxFuture, ReadStatus, Source, SourceReader, SourceSplit,
    SplitEnumerator, StaticSplits,
};
use weir_engine::prelude::*;

use crate::error::BenchError;
use crate::nexmark::harness::{CheckpointFigures, MedianMaxMs, PausesMs};
use crate::state::StateBackend;

/// What to run.
#[derive(Clone, Debug)]
pub struct CheckpointBenchOptions {
    /// Where the state lives.
    pub backend: StateBackend,
    /// State to hold, in value bytes.
    pub state_bytes: u64,
    /// Bytes per key's value.
    pub value_bytes: usize,
    /// The checkpoint interval.
    pub interval: Duration,
    /// Rounds of updates before the failure, and after it.
    pub rounds: u32,
    /// Where the checkpoints (and RocksDB's files) go: a fresh directory in it, removed after
    /// the run.
    pub dir: PathBuf,
}

/// What `weir bench checkpoint --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct CheckpointBenchReport {
    /// Always `"checkpoint"`.
    pub benchmark: &'static str,
    /// The backend measured.
    pub backend: StateBackend,
    /// State held, in value bytes.
    pub state_bytes: u64,
    /// Keys.
    pub keys: u64,
    /// Bytes per value.
    pub value_bytes: usize,
    /// The checkpoint interval, ms.
    pub interval_ms: u64,
    /// Keys updated per round (1 %).
    pub updates_per_round: u64,
    /// From the job's start to the fill's last record read.
    pub fill_seconds: f64,
    /// Checkpoints completed after the restart.
    pub checkpoints_completed: u64,
    /// Per checkpoint after the restart, the longest the shard worked on the snapshot instead
    /// of records at once (the barrier's part plus the encoding's longest piece).
    pub sync_pause_ms: Option<PausesMs>,
    /// Per checkpoint after the restart, trigger to commit.
    pub checkpoint_seconds: Option<MedianMaxMs>,
    /// The last checkpoint's size.
    pub full_bytes: u64,
    /// What the last checkpoint wrote: its size less the files earlier ones wrote.
    pub incremental_bytes: u64,
    /// From the injected failure to the restored function's `open`.
    pub restore_seconds: f64,
    /// From the injected failure to the first record processed again.
    pub recovery_seconds: f64,
    /// Restarts the job made (1: the injected failure).
    pub restarts: usize,
}

/// The instants the run is measured by, shared by the source and the function.
#[derive(Default)]
struct Probe {
    started: Mutex<Option<Instant>>,
    filled: Mutex<Option<Instant>>,
    failed: AtomicBool,
    failed_at: Mutex<Option<Instant>>,
    reopened: Mutex<Option<Instant>>,
    first_again: Mutex<Option<Instant>>,
}

impl Probe {
    /// Sets `at` to now unless it is set.
    fn mark(at: &Mutex<Option<Instant>>) {
        at.lock()
            .expect("probe lock")
            .get_or_insert_with(Instant::now);
    }

    fn get(at: &Mutex<Option<Instant>>) -> Option<Instant> {
        *at.lock().expect("probe lock")
    }
}

/// One record: a key's new version, of a round (0: the fill).
#[derive(Clone, Copy, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct Update {
    key: u64,
    round: u32,
}

/// The shape of the input.
#[derive(Clone, Copy, Debug)]
struct Shape {
    keys: u64,
    per_round: u64,
    rounds: u32,
    interval: Duration,
}

impl Shape {
    /// Records in all: the fill, then the rounds before the failure, the one it happens in,
    /// and those after.
    fn records(&self) -> u64 {
        self.keys + self.per_round * (2 * u64::from(self.rounds) + 1)
    }

    /// Record `index`.
    fn record(&self, index: u64) -> Update {
        if index < self.keys {
            return Update {
                key: index,
                round: 0,
            };
        }
        let update = index - self.keys;
        Update {
            // Fibonacci hashing spreads a round's keys over the key space.
            key: update.wrapping_mul(0x9E37_79B9_7F4A_7C15) % self.keys,
            round: 1 + (update / self.per_round) as u32,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct InputSplit {
    next: u64,
}

impl SourceSplit for InputSplit {
    fn split_id(&self) -> String {
        "checkpoint-bench".into()
    }
}

#[derive(Clone)]
struct Input {
    shape: Shape,
    probe: Arc<Probe>,
}

impl Source<Update> for Input {
    type Split = InputSplit;

    fn boundedness(&self) -> Boundedness {
        Boundedness::Bounded
    }

    fn create_enumerator(&self, _parallelism: usize) -> Box<dyn SplitEnumerator<InputSplit>> {
        Box::new(StaticSplits::shared(vec![InputSplit { next: 0 }]))
    }

    fn create_reader(&self, _ctx: &RuntimeContext) -> Box<dyn SourceReader<Update, InputSplit>> {
        Box::new(InputReader {
            shape: self.shape,
            probe: Arc::clone(&self.probe),
            split: None,
            updating_since: None,
        })
    }
}

struct InputReader {
    shape: Shape,
    probe: Arc<Probe>,
    split: Option<InputSplit>,
    /// When this reader began the rounds, and at which record.
    updating_since: Option<(Instant, u64)>,
}

impl SourceReader<Update, InputSplit> for InputReader {
    fn add_split(&mut self, split: InputSplit) {
        self.split = Some(split);
    }

    fn poll_next<'a>(
        &'a mut self,
        out: &'a mut Vec<Update>,
        max: usize,
    ) -> LocalBoxFuture<'a, Result<ReadStatus, ConnectorError>> {
        Box::pin(async move {
            let Some(split) = self.split.as_mut() else {
                return Ok(ReadStatus::NeedSplit);
            };
            let shape = self.shape;
            let end = shape.records();
            if split.next >= end {
                self.split = None;
                return Ok(ReadStatus::SplitFinished { split: 0 });
            }
            let until = if split.next < shape.keys {
                shape.keys.min(split.next + max as u64)
            } else {
                // A round per interval, from when this reader reached the rounds.
                let (since, from) = *self
                    .updating_since
                    .get_or_insert_with(|| (Instant::now(), split.next));
                let rounds = since.elapsed().as_secs_f64() / shape.interval.as_secs_f64();
                let allowed = from + (rounds * shape.per_round as f64) as u64;
                end.min(allowed).min(split.next + max as u64)
            };
            if until <= split.next {
                return Ok(ReadStatus::Idle(Duration::from_millis(1)));
            }
            out.extend((split.next..until).map(|index| shape.record(index)));
            split.next = until;
            if split.next == shape.keys {
                Probe::mark(&self.probe.filled);
            }
            Ok(ReadStatus::Records { split: 0 })
        })
    }

    fn snapshot_splits(&self) -> Vec<InputSplit> {
        self.split.iter().cloned().collect()
    }
}

/// Writes each record's key a new value; fails once, at the first record of the round after
/// `rounds`.
#[derive(Clone)]
struct Store {
    value: ValueStateDescriptor<Vec<u8>>,
    value_bytes: usize,
    fail_at_round: u32,
    probe: Arc<Probe>,
    /// Opened after the failure: the next record is the first processed again.
    restored: bool,
}

impl KeyedProcessFunction<u64, Update, ()> for Store {
    fn open(&mut self, _ctx: &RuntimeContext) {
        self.restored = self.probe.failed.load(Ordering::Relaxed);
        if self.restored {
            Probe::mark(&self.probe.reopened);
        }
    }

    fn process_element(&mut self, record: Update, ctx: &mut KeyedProcessContext<'_, u64, ()>) {
        if record.round == self.fail_at_round && !self.probe.failed.swap(true, Ordering::Relaxed) {
            Probe::mark(&self.probe.failed_at);
            panic!("weir bench checkpoint: the injected failure");
        }
        ctx.value_state(&self.value)
            .update(value_of(&record, self.value_bytes))
            .expect("write state");
        // Processed: after the state's first use, which registers it (and on the heap decodes
        // what was restored of it).
        if self.restored {
            self.restored = false;
            Probe::mark(&self.probe.first_again);
        }
    }
}

/// The value an update writes: `len` pseudo-random bytes of its key and round (splitmix64), so
/// that no compression makes the state smaller than it is.
fn value_of(update: &Update, len: usize) -> Vec<u8> {
    let mut seed = update.key ^ (u64::from(update.round) << 48);
    let mut value = Vec::with_capacity(len + 8);
    while value.len() < len {
        seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        value.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    value.truncate(len);
    value
}

/// Runs the benchmark (see the module docs).
pub fn run(options: &CheckpointBenchOptions) -> Result<CheckpointBenchReport, BenchError> {
    let bad = |what: String| BenchError::Checkpoint(what);
    if options.value_bytes == 0 {
        return Err(bad(
            "--value-bytes 0: give each value at least one byte".into()
        ));
    }
    if options.rounds == 0 {
        return Err(bad(
            "--rounds 0: run at least one round before the failure".into()
        ));
    }
    let keys = options.state_bytes / options.value_bytes as u64;
    if keys < 100 {
        return Err(bad(format!(
            "--state-bytes {} holds {keys} values of {} bytes; 1 % of the keys must be at least \
             one: give at least {} bytes",
            options.state_bytes,
            options.value_bytes,
            100 * options.value_bytes
        )));
    }
    let dir = tempfile::Builder::new()
        .prefix("weir-bench-checkpoint-")
        .tempdir_in(&options.dir)
        .map_err(|e| {
            bad(format!(
                "cannot create a directory in {}: {e}",
                options.dir.display()
            ))
        })?;
    let path = |name: &str| {
        let path = dir.path().join(name);
        path.to_str()
            .map(str::to_string)
            .ok_or_else(|| bad(format!("{} is not UTF-8", path.display())))
    };
    // The heap backend's state counts against the slot's heap share: room for the state, its
    // maps and a checkpoint's encoding beside it.
    let process_size = (options.state_bytes * 4 + (1 << 30)).max(1728 << 20);
    let settings = [
        (
            "state.backend.type",
            options.backend.config_name().to_string(),
        ),
        ("state.backend.rocksdb.localdir", path("rocksdb")?),
        ("execution.checkpointing.dir", path("checkpoints")?),
        (
            "execution.checkpointing.interval",
            format!("{} ms", options.interval.as_millis()),
        ),
        ("restart-strategy.type", "fixed-delay".into()),
        ("restart-strategy.fixed-delay.attempts", "1".into()),
        ("restart-strategy.fixed-delay.delay", "0 ms".into()),
        ("taskmanager.numberOfTaskSlots", "1".into()),
        ("taskmanager.memory.process.size", process_size.to_string()),
    ];
    let mut config = Configuration::default();
    for (key, value) in settings {
        config.set(key, value).map_err(|e| bad(e.to_string()))?;
    }
    let shape = Shape {
        keys,
        per_round: (keys / 100).max(1),
        rounds: options.rounds,
        interval: options.interval,
    };
    let probe = Arc::new(Probe::default());
    let env = StreamEnvironment::new(config).map_err(BenchError::job("checkpoint"))?;
    env.from_source(
        Input {
            shape,
            probe: Arc::clone(&probe),
        },
        WatermarkStrategy::no_watermarks(),
        "updates",
    )
    .uid("updates")
    .key_by(|update: &Update| update.key)
    .process(Store {
        value: ValueStateDescriptor::new("value"),
        value_bytes: options.value_bytes,
        fail_at_round: options.rounds + 1,
        probe: Arc::clone(&probe),
        restored: false,
    })
    .name("store")
    .uid("store")
    .sink_to(DiscardSink::new(), "discard");
    Probe::mark(&probe.started);
    let result = env
        .execute("checkpoint-bench")
        .map_err(BenchError::job("checkpoint"))?;
    drop(dir);
    let instant = |at: &Mutex<Option<Instant>>, what: &str| {
        Probe::get(at).ok_or_else(|| bad(format!("the run never {what}")))
    };
    let failed_at = instant(&probe.failed_at, "reached the injected failure")?;
    let since_failure = |at: Instant| at.duration_since(failed_at).as_secs_f64();
    let stats = result
        .checkpoints
        .as_ref()
        .ok_or_else(|| bad("the run took no checkpoints".into()))?;
    let figures = CheckpointFigures::of(options.interval.as_millis() as u64, stats);
    Ok(CheckpointBenchReport {
        benchmark: "checkpoint",
        backend: options.backend,
        state_bytes: keys * options.value_bytes as u64,
        keys,
        value_bytes: options.value_bytes,
        interval_ms: options.interval.as_millis() as u64,
        updates_per_round: shape.per_round,
        fill_seconds: instant(&probe.filled, "finished the fill")?
            .duration_since(instant(&probe.started, "started")?)
            .as_secs_f64(),
        checkpoints_completed: stats.completed,
        sync_pause_ms: figures.sync_pause_ms,
        checkpoint_seconds: figures.checkpoint_duration_ms.map(|ms| MedianMaxMs {
            p50: ms.p50 / 1e3,
            max: ms.max / 1e3,
        }),
        full_bytes: stats.last_bytes,
        incremental_bytes: stats.last_incremental_bytes,
        restore_seconds: since_failure(instant(&probe.reopened, "restored the function")?),
        recovery_seconds: since_failure(instant(&probe.first_again, "processed a record again")?),
        restarts: result.restarts.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small run on each backend fails once, recovers, and reports its checkpoints.
    #[test]
    fn a_small_run_reports_checkpoints_restore_and_recovery() {
        for backend in [StateBackend::Heap, StateBackend::RocksDb] {
            let dir = tempfile::tempdir().unwrap();
            let report = run(&CheckpointBenchOptions {
                backend,
                state_bytes: 2_000 * 64,
                value_bytes: 64,
                interval: Duration::from_millis(50),
                rounds: 3,
                dir: dir.path().to_path_buf(),
            })
            .unwrap();
            assert_eq!(report.keys, 2_000);
            assert_eq!(report.restarts, 1, "{report:?}");
            assert!(report.checkpoints_completed > 0, "{report:?}");
            // The values do not compress: the full checkpoint holds them all.
            assert!(report.full_bytes >= 2_000 * 64, "{report:?}");
            assert!(report.incremental_bytes <= report.full_bytes, "{report:?}");
            assert!(
                report.recovery_seconds >= report.restore_seconds,
                "{report:?}"
            );
            assert!(report.sync_pause_ms.is_some(), "{report:?}");
            assert_eq!(
                std::fs::read_dir(dir.path()).unwrap().count(),
                0,
                "its directory is removed"
            );
        }
    }

    #[test]
    fn too_little_state_is_refused_naming_the_fix() {
        let error = run(&CheckpointBenchOptions {
            backend: StateBackend::Heap,
            state_bytes: 1_000,
            value_bytes: 1_024,
            interval: Duration::from_millis(50),
            rounds: 1,
            dir: std::env::temp_dir(),
        })
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("--state-bytes 1000") && error.contains("102400"),
            "{error}"
        );
    }
}
