//! The interval join benchmark: two generated streams keyed alike and joined within
//! `[-bound, +bound]` ms (`KeyedStream::interval_join`) on one shard, on the heap or on RocksDB,
//! against a hand-written single-threaded loop over the same records that keeps each key's
//! records of both sides in time-ordered buffers.
//!
//! Records are `(key, timestamp, payload)`: record `i` of either side has time `i` ms (one per
//! side per millisecond, in order) and key `i % keys`, so each key gets a record of each side
//! every `keys` ms and a record joins about `2 * bound / keys + 1` of the other side.
//! Watermarks are monotonous, so no record is late and the pairs are the same on both sides;
//! both reduce them to an order-independent checksum, which must agree.

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use weir_engine::prelude::*;

use crate::error::BenchError;
use crate::measure::{alternate, Digest, DigestSink, Measurement, Versus, ROUNDS};
use crate::nexmark::harness::CheckpointFigures;
use crate::state::StateBackend;

const JOB: &str = "bench-join";

/// One side's record: key, event time (ms), payload.
type Side = (u64, i64, u64);

/// The loop's buffer of one side of one key: (time, payload), oldest first.
type Buffer = VecDeque<(i64, u64)>;

/// What `weir bench join --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct JoinReport {
    /// Always `"join"`.
    pub benchmark: &'static str,
    /// Where the join's buffers live.
    pub backend: StateBackend,
    /// Records of each side.
    pub records: u64,
    /// Distinct keys.
    pub keys: u64,
    /// The join's bounds: `between(-bound_ms, bound_ms)`.
    pub bound_ms: i64,
    /// The engine against the loop, in records of both sides per second.
    #[serde(flatten)]
    pub versus: Versus,
    /// Pairs joined.
    pub pairs: u64,
    /// Whether the engine's pairs are the loop's (same count and checksum).
    pub results_match: bool,
    /// With `--checkpoint-interval-ms`: the checkpoints of the engine's best round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<CheckpointFigures>,
}

/// Record `i` of a side; the right side's payloads are told apart by their top bit.
#[inline]
fn record(i: u64, keys: u64, right: bool) -> Side {
    (i % keys, i as i64, i | (u64::from(right) << 63))
}

/// An order-independent digest of the joined pairs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Checksum {
    pairs: u64,
    digest: u64,
}

impl Checksum {
    #[inline]
    fn add(&mut self, left: u64, right: u64) {
        let h =
            left.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ right.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        self.pairs += 1;
        self.digest = self
            .digest
            .wrapping_add(h.wrapping_mul(0x1656_67B1_9E37_79F9));
    }
}

impl Digest<(u64, u64)> for Checksum {
    #[inline]
    fn add(&mut self, (left, right): (u64, u64)) {
        Checksum::add(self, left, right);
    }

    fn merge(&mut self, other: Checksum) {
        self.pairs += other.pairs;
        self.digest = self.digest.wrapping_add(other.digest);
    }
}

/// The loop: one record of each side per millisecond, left first; per key a time-ordered
/// buffer of each side, whose records older than `bound` behind the time are dropped.
fn run_baseline(records: u64, keys: u64, bound: i64) -> (Measurement, Checksum) {
    let started = Instant::now();
    let mut buffers: Vec<(Buffer, Buffer)> = (0..keys).map(|_| Default::default()).collect();
    let mut sum = Checksum::default();
    for i in 0..records {
        for right in [false, true] {
            let (key, time, payload) = record(i, keys, right);
            let (lefts, rights) = &mut buffers[key as usize];
            let (own, other) = if right {
                (rights, &mut *lefts)
            } else {
                (lefts, &mut *rights)
            };
            while other.front().is_some_and(|&(t, _)| t < time - bound) {
                other.pop_front();
            }
            for &(_, buffered) in other.iter() {
                if right {
                    sum.add(buffered, payload);
                } else {
                    sum.add(payload, buffered);
                }
            }
            own.push_back((time, payload));
        }
    }
    black_box(&buffers);
    let measurement = Measurement {
        duration: started.elapsed(),
        surviving_records: sum.pairs,
    };
    (measurement, sum)
}

/// One run of the engine: its time, its pairs' checksum, and its checkpoints' figures.
type EngineRun = (Measurement, Checksum, Option<CheckpointFigures>);

/// Runs the join on one shard with its buffers on `backend`, checkpointed every
/// `checkpoint_interval_ms` if given (into a temporary directory).
fn run_engine(
    backend: StateBackend,
    records: u64,
    keys: u64,
    bound: i64,
    checkpoint_interval_ms: Option<u64>,
) -> Result<EngineRun, BenchError> {
    let temp_dir = || {
        tempfile::tempdir().map_err(|source| BenchError::TempDir {
            dir: std::env::temp_dir(),
            error: source,
        })
    };
    let local = temp_dir()?;
    let checkpoints = checkpoint_interval_ms.map(|_| temp_dir()).transpose()?;
    let mut settings = vec![
        ("taskmanager.numberOfTaskSlots", "1".to_string()),
        ("state.backend.type", backend.config_name().to_string()),
        (
            "state.backend.rocksdb.localdir",
            local.path().to_string_lossy().into_owned(),
        ),
    ];
    if let Some((interval, checkpoints)) = checkpoint_interval_ms.zip(checkpoints.as_ref()) {
        settings.push(("execution.checkpointing.interval", format!("{interval} ms")));
        settings.push((
            "execution.checkpointing.dir",
            checkpoints.path().to_string_lossy().into_owned(),
        ));
    }
    let mut config = Configuration::default();
    for (key, value) in settings {
        config
            .set(key, value)
            .map_err(|e| BenchError::job(JOB)(e.into()))?;
    }
    let env = StreamEnvironment::new(config).map_err(BenchError::job(JOB))?;
    let side = |name: &str, right: bool| {
        env.from_source(
            DataGeneratorSource::new(Some(records), move |i| record(i, keys, right)),
            WatermarkStrategy::for_monotonous_timestamps()
                .with_timestamp_assigner(|r: &Side, _| r.1),
            name,
        )
        .key_by(|r: &Side| r.0)
    };
    let total = Arc::new(Mutex::new(Checksum::default()));
    side("left", false)
        .interval_join(side("right", true))
        .between(-bound, bound)
        .process(
            |left: &Side, right: &Side, ctx: &mut ProcessJoinContext<'_, (u64, u64)>| {
                ctx.emit((left.2, right.2))
            },
        )
        .sink_to(
            DigestSink {
                total: Arc::clone(&total),
            },
            "checksum",
        );
    let result = env.execute(JOB).map_err(BenchError::job(JOB))?;
    let checksum = *total.lock().expect("checksum lock");
    let measurement = Measurement {
        duration: result.duration,
        surviving_records: checksum.pairs,
    };
    let figures = checkpoint_interval_ms
        .zip(result.checkpoints.as_ref())
        .map(|(interval, stats)| CheckpointFigures::of(interval, stats));
    Ok((measurement, checksum, figures))
}

/// Runs the loop and the engine alternately, [`ROUNDS`] times each; reports the best rounds.
pub fn run(
    backend: StateBackend,
    records: u64,
    keys: u64,
    bound_ms: i64,
    checkpoint_interval_ms: Option<u64>,
) -> Result<JoinReport, BenchError> {
    if records == 0 {
        return Err(BenchError::NoRecords);
    }
    let keys = keys.max(1);
    let bound = bound_ms.max(0);
    let mut engine_sum = Checksum::default();
    let mut baseline_sum = Checksum::default();
    let mut figures = Vec::with_capacity(ROUNDS);
    let (engine, baseline) = alternate(
        || {
            let (m, s) = run_baseline(records, keys, bound);
            baseline_sum = s;
            m
        },
        || {
            run_engine(backend, records, keys, bound, checkpoint_interval_ms).map(|(m, s, f)| {
                engine_sum = s;
                figures.push((m.duration, f));
                m
            })
        },
    )?;
    let checkpoints = figures
        .into_iter()
        .find(|(duration, _)| *duration == engine.duration)
        .and_then(|(_, figures)| figures);
    Ok(JoinReport {
        benchmark: "join",
        backend,
        records,
        keys,
        bound_ms: bound,
        versus: Versus::of(2 * records, &engine, &baseline),
        pairs: engine_sum.pairs,
        results_match: engine_sum == baseline_sum,
        checkpoints,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loop's pairs are those of a nested loop over both sides.
    #[test]
    fn the_loop_joins_what_a_nested_loop_joins() {
        let (records, keys, bound) = (300, 7, 20);
        let mut reference = Checksum::default();
        for i in 0..records {
            for j in 0..records {
                let (left, right) = (record(i, keys, false), record(j, keys, true));
                if left.0 == right.0 && (right.1 - left.1).abs() <= bound {
                    reference.add(left.2, right.2);
                }
            }
        }
        assert!(reference.pairs > records);
        assert_eq!(run_baseline(records, keys, bound).1, reference);
    }
}
