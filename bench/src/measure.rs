//! What one timed run produced, and small helpers shared by the harnesses.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use weir_engine::connector::{ConnectorError, LocalBoxFuture, SinkWriter};
use weir_engine::prelude::{RuntimeContext, Sink};

/// Rounds each harness runs, alternating baseline and engine; the best of each is reported.
pub const ROUNDS: usize = 5;

/// One timed run of a benchmark, by the engine or by a hand-written baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measurement {
    /// Wall time of the run (for the engine: `JobResult::duration`, deployment to end).
    pub duration: Duration,
    /// Records that passed the filter and reached the sink (or the consumer).
    pub surviving_records: u64,
}

/// The engine's best round against the hand-written loop's, in a report: `#[serde(flatten)]`
/// puts its fields beside the report's own.
#[derive(Clone, Debug, Serialize)]
pub struct Versus {
    /// Rounds run; the best round of each side is reported.
    pub rounds: usize,
    /// The engine's best wall time, in seconds.
    pub seconds: f64,
    /// The engine's throughput: the benchmark's records per second (one shard).
    pub records_per_second: f64,
    /// The hand-written loop's best wall time, in seconds.
    pub baseline_seconds: f64,
    /// The loop's throughput.
    pub baseline_records_per_second: f64,
    /// `baseline_records_per_second / records_per_second`: how many times slower the engine is.
    pub slowdown: f64,
}

impl Versus {
    /// `records` done by the engine's best round `engine` and the loop's `baseline`.
    pub(crate) fn of(records: u64, engine: &Measurement, baseline: &Measurement) -> Versus {
        let records_per_second = rate(records, engine.duration);
        let baseline_records_per_second = rate(records, baseline.duration);
        Versus {
            rounds: ROUNDS,
            seconds: engine.duration.as_secs_f64(),
            records_per_second,
            baseline_seconds: baseline.duration.as_secs_f64(),
            baseline_records_per_second,
            slowdown: baseline_records_per_second / records_per_second,
        }
    }
}

/// The configuration of a one-shard sink benchmark job: the sinks' `guarantee`, and
/// checkpoints every `interval_ms` into `dir` when an interval is given.
pub(crate) fn one_shard(
    interval_ms: Option<u64>,
    dir: &std::path::Path,
    guarantee: weir_engine::connector::DeliveryGuarantee,
    job: &'static str,
) -> Result<weir_engine::Configuration, crate::BenchError> {
    let mut config = weir_engine::Configuration::default()
        .with("taskmanager.numberOfTaskSlots", "1")
        .and_then(|config| config.with("sink.delivery-guarantee", guarantee.name()))
        .map_err(|e| crate::BenchError::job(job)(e.into()))?;
    if let Some(interval) = interval_ms {
        for (key, value) in [
            ("execution.checkpointing.interval", format!("{interval} ms")),
            (
                "execution.checkpointing.dir",
                dir.to_string_lossy().into_owned(),
            ),
        ] {
            config
                .set(key, value)
                .map_err(|e| crate::BenchError::job(job)(e.into()))?;
        }
    }
    Ok(config)
}

/// Runs job `job` of `config`: `records` generated numbers into `sink` (named and uid'd
/// `name`).
pub(crate) fn generated_into<S: weir_engine::connector::Sink<u64>>(
    config: weir_engine::Configuration,
    records: u64,
    sink: S,
    name: &str,
    job: &'static str,
) -> Result<weir_engine::JobResult, crate::BenchError> {
    use weir_engine::prelude::*;
    let env = StreamEnvironment::new(config).map_err(crate::BenchError::job(job))?;
    env.from_source(
        DataGeneratorSource::new(Some(records), |i| i),
        WatermarkStrategy::no_watermarks(),
        "generator",
    )
    .uid("generator")
    .sink_to(sink, name)
    .uid(name);
    env.execute(job).map_err(crate::BenchError::job(job))
}

/// Records per second for `records` done in `elapsed` (never divides by zero).
pub(crate) fn rate(records: u64, elapsed: Duration) -> f64 {
    records as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// The fastest of `runs` (the one least disturbed by the rest of the machine).
pub(crate) fn best(runs: &[Measurement]) -> Measurement {
    *runs
        .iter()
        .min_by_key(|m| m.duration)
        .expect("at least one round")
}

/// Runs `baseline` then `engine`, alternately, [`ROUNDS`] times, and returns the best of each.
pub(crate) fn alternate<E>(
    mut baseline: impl FnMut() -> Measurement,
    mut engine: impl FnMut() -> Result<Measurement, E>,
) -> Result<(Measurement, Measurement), E> {
    let mut baselines = Vec::with_capacity(ROUNDS);
    let mut engines = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        baselines.push(baseline());
        engines.push(engine()?);
    }
    Ok((best(&engines), best(&baselines)))
}

/// An order-independent digest of a job's results, which each sink subtask keeps of its own
/// records and merges into the job's at its end.
pub(crate) trait Digest<T>: Default + Send + 'static {
    /// Adds one result.
    fn add(&mut self, result: T);
    /// Adds another subtask's digest.
    fn merge(&mut self, other: Self);
}

/// A sink that folds its records into a [`Digest`] per subtask, merged into `total` when the
/// subtask finishes.
pub(crate) struct DigestSink<D> {
    pub(crate) total: Arc<Mutex<D>>,
}

impl<D> Clone for DigestSink<D> {
    fn clone(&self) -> Self {
        DigestSink {
            total: Arc::clone(&self.total),
        }
    }
}

struct DigestWriter<D> {
    local: D,
    total: Arc<Mutex<D>>,
}

impl<T: Send + 'static, D: Digest<T>> Sink<T> for DigestSink<D> {
    fn create_writer(
        &self,
        _ctx: &RuntimeContext,
    ) -> Result<Box<dyn SinkWriter<T>>, ConnectorError> {
        Ok(Box::new(DigestWriter {
            local: D::default(),
            total: Arc::clone(&self.total),
        }))
    }
}

impl<T: Send + 'static, D: Digest<T>> SinkWriter<T> for DigestWriter<D> {
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<T>,
        _timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
        for result in batch.drain(..) {
            self.local.add(result);
        }
        Box::pin(async { Ok(()) })
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        self.total
            .lock()
            .expect("digest lock")
            .merge(std::mem::take(&mut self.local));
        Box::pin(async { Ok(()) })
    }
}
