//! Criterion: what one reading of a running job's live figures costs — what an executor does
//! once a second (`weir_engine::package::FIGURES_INTERVAL`) to hand its worker the figures a
//! `/metrics` scrape and the REST API show: `JobMonitor::figures` (it sums the shards'
//! single-writer counters and reads each shard's pool, load and run-queue delay, off the
//! shards) and the reading's JSON encoding.
//!
//! Measured on Nexmark q1 (one chain per subtask) and q5 (keyed, windowed, an exchange between
//! every pair of subtasks) running unthrottled on every core, with latency markers on, so the
//! reading sums what a loaded job's reading sums. The shards' own counting is in the record
//! loop whether or not anyone reads it (and so in every Nexmark figure); a reading is the
//! whole of what scraping adds, on a thread of its own. Its time per second is the share of
//! one core that reading the figures once a second takes.
//!
//! `cargo bench -p weir-bench --bench scrape`.

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::short;
use criterion::{criterion_group, criterion_main, Criterion};
use weir_bench::nexmark::{queries, NexmarkConfig, NexmarkGenerator};
use weir_engine::api::JobClient;
use weir_engine::monitor::JobMonitor;
use weir_engine::prelude::*;
use weir_engine::runtime::{available_cores, RunOptions};

/// Starts Nexmark `query` (q1 or q5) unthrottled on every core: the job and its monitor, once
/// its figures can be read.
fn start(query: &str) -> (JobClient, JobMonitor) {
    let cores = available_cores().len().max(1);
    let config = Configuration::default()
        .with("taskmanager.numberOfTaskSlots", cores.to_string())
        .and_then(|c| c.with("parallelism.default", cores.to_string()))
        .and_then(|c| c.with("metrics.latency.interval", "200ms"))
        .expect("valid settings");
    let env = StreamEnvironment::new(config).expect("an environment");
    let generator = NexmarkGenerator::new(NexmarkConfig::default()).expect("default config");
    let events = queries::source(&env, generator, u64::MAX / 2, None);
    match query {
        "q1" => queries::q1(events).sink_to(DiscardSink::new(), "discard"),
        _ => queries::q5(events).sink_to(DiscardSink::new(), "discard"),
    };
    let monitor = JobMonitor::default();
    let options = RunOptions {
        monitor: monitor.clone(),
        ..RunOptions::default()
    };
    let job = env.execute_async(query, options).expect("the job starts");
    let started = Instant::now();
    while monitor.figures().is_none_or(|f| f.latency.is_empty()) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no figures with latency"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    (job, monitor)
}

fn scrape(c: &mut Criterion) {
    for query in ["q1", "q5"] {
        let (job, monitor) = start(query);
        let mut group = short(c, &format!("scrape_{query}"), 3);
        group.bench_function("figures", |b| {
            b.iter(|| black_box(monitor.figures().expect("figures")))
        });
        group.bench_function("figures_json", |b| {
            b.iter(|| {
                let figures = monitor.figures().expect("figures");
                black_box(serde_json::to_vec(&figures).expect("figures encode"))
            })
        });
        group.finish();
        let figures = monitor.figures().expect("figures");
        eprintln!(
            "{query}: {} operator subtasks, {} tasks, {} shards, {} latency histograms, {} bytes of JSON",
            figures.subtasks.len(),
            figures.tasks.len(),
            figures.shards.len(),
            figures.latency.len(),
            serde_json::to_vec(&figures).expect("figures encode").len()
        );
        job.cancel();
        let _ = job.wait();
    }
}

criterion_group!(benches, scrape);
criterion_main!(benches);
