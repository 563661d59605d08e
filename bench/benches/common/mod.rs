//! What the criterion benchmark files share.

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion};

/// A benchmark group kept short (10 samples, 0.5 s warm-up, `seconds` of measurement) so a
/// whole file runs in minutes on a shared machine.
pub fn short<'a>(c: &'a mut Criterion, name: &str, seconds: u64) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(seconds));
    group
}
