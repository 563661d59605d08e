//! What one timed run produced, and small helpers shared by the harnesses.

use std::time::Duration;

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
