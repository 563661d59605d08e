//! The chained pipeline benchmark: `DataGeneratorSource` → `map` → `filter` → `DiscardSink`, all
//! chained into one task on one shard, against a single-threaded loop that generates, maps,
//! filters and `black_box`es each surviving record (as the discard sink does).

use std::hint::black_box;
use std::time::Instant;

use serde::Serialize;
use weir_engine::prelude::*;

use crate::error::BenchError;
use crate::measure::{alternate, Measurement, Versus};
use crate::record::BenchRecord;

const JOB: &str = "bench-chain";
const SINK: &str = "discard";

/// What `weir bench chain --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct ChainReport {
    /// Records generated (each run).
    pub records: u64,
    /// Shards the engine ran on (always 1).
    pub shards: usize,
    /// The engine against the loop, in generated records per second.
    #[serde(flatten)]
    pub versus: Versus,
    /// Records that passed the filter (the engine's sink input).
    pub surviving_records: u64,
    /// Whether the engine's sink received as many records as survived the hand-written loop.
    pub results_match: bool,
}

/// Runs the chained job on one shard with `records` records and returns what it measured.
pub fn run_engine(records: u64) -> Result<Measurement, BenchError> {
    let config = Configuration::default()
        .with("taskmanager.numberOfTaskSlots", "1")
        .map_err(|e| BenchError::job(JOB)(e.into()))?;
    let env = StreamEnvironment::new(config).map_err(BenchError::job(JOB))?;
    env.from_source(
        DataGeneratorSource::new(Some(records), BenchRecord::generate),
        WatermarkStrategy::no_watermarks(),
        "generator",
    )
    .map(BenchRecord::mapped)
    .filter(BenchRecord::survives)
    .sink_to(DiscardSink::new(), SINK);
    let result = env.execute(JOB).map_err(BenchError::job(JOB))?;
    Ok(Measurement {
        duration: result.duration,
        surviving_records: result.records_in(&format!("Sink: {SINK}")),
    })
}

/// The hand-written loop: generate, map, filter and `black_box` each surviving record.
pub fn run_baseline(records: u64) -> Measurement {
    let started = Instant::now();
    let mut surviving = 0u64;
    for i in 0..records {
        let record = BenchRecord::generate(i).mapped();
        if record.survives() {
            black_box(record);
            surviving += 1;
        }
    }
    Measurement {
        duration: started.elapsed(),
        surviving_records: surviving,
    }
}

/// Runs the hand-written loop and the engine job alternately, [`ROUNDS`] times each, and
/// reports the best round of each.
pub fn run(records: u64) -> Result<ChainReport, BenchError> {
    if records == 0 {
        return Err(BenchError::NoRecords);
    }
    let (engine, baseline) = alternate(|| run_baseline(records), || run_engine(records))?;
    Ok(ChainReport {
        records,
        shards: 1,
        versus: Versus::of(records, &engine, &baseline),
        surviving_records: engine.surviving_records,
        results_match: engine.surviving_records == baseline.surviving_records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_run_matches_the_baseline() {
        let report = run(10_000).unwrap();
        assert!(report.results_match, "{report:?}");
        assert!(report.surviving_records > 8_000, "{report:?}");
        assert!(report.versus.records_per_second > 0.0, "{report:?}");
        assert!(
            report.versus.baseline_records_per_second > 0.0,
            "{report:?}"
        );
        let json = serde_json::to_value(&report).unwrap();
        for field in [
            "records",
            "seconds",
            "records_per_second",
            "baseline_records_per_second",
        ] {
            assert!(json.get(field).is_some(), "missing {field} in {json}");
        }
    }

    #[test]
    fn zero_records_is_refused() {
        assert!(matches!(run(0), Err(BenchError::NoRecords)));
    }
}
