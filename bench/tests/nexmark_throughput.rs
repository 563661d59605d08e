//! Rough single-threaded speeds of the Nexmark generator and baselines, for the record; run
//! with `cargo test -p weir-bench --release -- --ignored --nocapture nexmark_throughput`. They
//! print rates and assert nothing about time.
#![allow(clippy::print_stdout)]

use std::hint::black_box;
use std::time::Instant;

use weir_bench::nexmark::harness::Query;
use weir_bench::nexmark::{Event, NexmarkConfig, NexmarkGenerator};

const EVENTS: u64 = 10_000_000;

fn report(what: &str, events: u64, started: Instant) {
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{what}: {events} events in {seconds:.3} s = {:.2} M events/s ({:.1} ns/event)",
        events as f64 / seconds / 1e6,
        seconds * 1e9 / events as f64
    );
}

#[test]
#[ignore = "a measurement; run in release"]
fn generator_speed() {
    let generator = NexmarkGenerator::new(NexmarkConfig::default()).unwrap();
    for _ in 0..2 {
        let started = Instant::now();
        let mut bytes = 0usize;
        for i in 0..EVENTS {
            let event = generator.generate(i);
            bytes += match &event {
                Event::Bid(b) => b.extra.len(),
                _ => 1,
            };
            black_box(event);
        }
        black_box(bytes);
        report("generate", EVENTS, started);
    }
}

#[test]
#[ignore = "a measurement; run in release"]
fn baseline_speed() {
    let generator = NexmarkGenerator::new(NexmarkConfig::default()).unwrap();
    let filter = std::env::var("NEXMARK_QUERIES").unwrap_or_default();
    for query in Query::ALL {
        let name = query.name();
        if !filter.is_empty() && !filter.split(',').any(|q| q == name) {
            continue;
        }
        let started = Instant::now();
        let result = query.baseline()(&generator, EVENTS);
        report(&format!("{name} {result:?}"), EVENTS, started);
    }
}
