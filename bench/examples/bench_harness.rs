//! Runs the macro benchmarks and prints each report as one JSON object per line, as
//! `weir bench chain|exchange --json` does:
//!
//! ```text
//! cargo run --release -p weir-bench --example bench_harness -- chain --records 50000000
//! cargo run --release -p weir-bench --example bench_harness -- exchange --records 20000000 --shards 2
//! cargo run --release -p weir-bench --example bench_harness -- all
//! cargo run --release -p weir-bench --example bench_harness -- startup
//! ```
//!
//! `startup` runs the chain job with a single record a few times and prints, per run, the
//! engine's `JobResult::duration` and the wall time of the whole call (environment, memory
//! pools, shard threads): the fixed cost every job pays.
#![allow(clippy::print_stdout)]

use std::process::ExitCode;
use std::time::Instant;

use weir_bench::{chain, exchange, BenchError};

const USAGE: &str = "usage: bench_harness chain [--records N] | exchange [--records N] \
                     [--shards S] | all | startup";

fn flag(args: &[String], name: &str) -> Result<Option<u64>, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.replace('_', "").parse().ok())
            .map(Some)
            .ok_or_else(|| format!("{name} needs a whole number\n{USAGE}")),
    }
}

/// One single-record chain job: its reported duration and the wall time of the whole call.
fn startup() -> Result<String, BenchError> {
    let started = Instant::now();
    let run = chain::run_engine(1)?;
    let wall = started.elapsed();
    Ok(format!(
        "{{\"job_duration_ms\":{:.3},\"wall_ms\":{:.3}}}",
        run.duration.as_secs_f64() * 1e3,
        wall.as_secs_f64() * 1e3
    ))
}

fn run(args: &[String]) -> Result<(), String> {
    let records = flag(args, "--records")?;
    let shards = flag(args, "--shards")?.unwrap_or(2) as usize;
    let chain = |records| -> Result<String, BenchError> {
        Ok(serde_json::to_string(&chain::run(records)?).expect("report serializes"))
    };
    let exchange =
        |records| -> Result<String, BenchError> {
            Ok(serde_json::to_string(&exchange::run(records, shards, &[])?)
                .expect("report serializes"))
        };
    let lines = match args.first().map(String::as_str) {
        Some("chain") => vec![chain(records.unwrap_or(50_000_000))],
        Some("exchange") => vec![exchange(records.unwrap_or(20_000_000))],
        Some("startup") => (0..5).map(|_| startup()).collect(),
        Some("all") => vec![
            chain(records.unwrap_or(50_000_000)),
            exchange(records.unwrap_or(20_000_000)),
        ],
        _ => return Err(USAGE.into()),
    };
    for line in lines {
        println!("{}", line.map_err(|e| e.to_string())?);
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}
