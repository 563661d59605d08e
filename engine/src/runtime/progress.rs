//! The live progress line `weir run` prints to stderr while a job runs.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::periodic::PeriodicThread;
use super::shard::ShardLoad;
use crate::metrics::MetricsRegistry;

/// Reports records/s, per-operator counts and shard load every `interval` until stopped.
pub(crate) struct ProgressReporter {
    _thread: PeriodicThread,
}

fn human(n: f64) -> String {
    match n {
        n if n >= 1e9 => format!("{:.2}G", n / 1e9),
        n if n >= 1e6 => format!("{:.2}M", n / 1e6),
        n if n >= 1e3 => format!("{:.1}K", n / 1e3),
        n => format!("{n:.0}"),
    }
}

impl ProgressReporter {
    pub(crate) fn start(
        interval: Duration,
        metrics: MetricsRegistry,
        sources: Vec<String>,
        loads: Vec<Arc<ShardLoad>>,
    ) -> ProgressReporter {
        let started = Instant::now();
        let mut last = (Instant::now(), 0u64, vec![0u64; loads.len()]);
        let thread = PeriodicThread::spawn("weir-progress", interval, move || {
            let counts = metrics.snapshot();
            let emitted: u64 = counts
                .iter()
                .filter(|c| sources.contains(&c.name))
                .map(|c| c.records_out)
                .sum();
            let now = Instant::now();
            let secs = now.duration_since(last.0).as_secs_f64().max(1e-9);
            let rate = (emitted - last.1) as f64 / secs;
            let busy: Vec<String> = loads
                .iter()
                .zip(&last.2)
                .map(|(l, prev)| {
                    let ns = l.processing_ns.load(Ordering::Relaxed);
                    format!(
                        "{:.0}%",
                        (ns.saturating_sub(*prev)) as f64 / (secs * 1e9) * 100.0
                    )
                })
                .collect();
            let operators: Vec<String> = counts
                .iter()
                .map(|c| {
                    let n = if sources.contains(&c.name) {
                        c.records_out
                    } else {
                        c.records_in
                    };
                    let bp = if c.backpressure_waits > 0 {
                        format!(" bp {}", human(c.backpressure_waits as f64))
                    } else {
                        String::new()
                    };
                    format!("{} {}{bp}", c.name, human(n as f64))
                })
                .collect();
            let mut err = std::io::stderr().lock();
            let _ = writeln!(
                err,
                "[{:>6.1}s] {} records/s | shards busy {} | {}",
                started.elapsed().as_secs_f64(),
                human(rate),
                busy.join(" "),
                operators.join(" | ")
            );
            last = (
                now,
                emitted,
                loads
                    .iter()
                    .map(|l| l.processing_ns.load(Ordering::Relaxed))
                    .collect(),
            );
        })
        .expect("spawn progress thread");
        ProgressReporter { _thread: thread }
    }
}
