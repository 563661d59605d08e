//! A job package of one's own: an executable built against `weir-engine` whose `main` hands
//! its named jobs to `weir_engine::package::main`. A control plane with `web.upload.enabled`
//! takes it over HTTP (`curl -F jarfile=@weir-example-package http://localhost:8081/jars/upload`)
//! and runs its jobs on its workers (`weir submit --jar ID even-squares --to 1000000`), each in
//! an executor process started from this file.

use std::process::ExitCode;

use weir_engine::package::{self, Registry};
use weir_engine::prelude::*;

fn main() -> ExitCode {
    package::main(
        Registry::new("weir-example-package")
            .job(
                "even-squares",
                "Sums the squares of the even numbers below --to N (default 1000000) per last \
                 digit, and prints each digit's sum.",
                even_squares,
            )
            .job(
                "fail-at-start",
                "Fails on its first record, at every start (a job whose restarts give up).",
                fail_at_start,
            ),
    )
}

/// `--to N`, the only argument these jobs take.
fn upper_bound(args: &[String]) -> Result<u64, String> {
    match args {
        [] => Ok(1_000_000),
        [flag, value] if flag == "--to" => value
            .parse()
            .map_err(|_| format!("--to takes a whole number, not '{value}'")),
        other => Err(format!(
            "unexpected arguments {other:?}; the only one is --to N"
        )),
    }
}

/// The numbers below `to`, the source of both jobs.
fn numbers(env: &StreamEnvironment, to: u64) -> DataStream<u64> {
    env.from_source(
        DataGeneratorSource::new(Some(to), |i| i),
        WatermarkStrategy::no_watermarks(),
        "numbers",
    )
    .uid("numbers")
}

fn even_squares(env: &StreamEnvironment, args: &[String]) -> Result<(), String> {
    numbers(env, upper_bound(args)?)
        .filter(|n: &u64| n.is_multiple_of(2))
        .name("even numbers")
        .map(|n: u64| (n % 10, n * n))
        .name("squares by last digit")
        .key_by(|(digit, _): &(u64, u64)| *digit)
        .reduce(|(digit, a), (_, b)| (digit, a.wrapping_add(b)))
        .name("sum per digit")
        .uid("sum-per-digit")
        .sink_to(PrintSink::new(), "print");
    Ok(())
}

fn fail_at_start(env: &StreamEnvironment, args: &[String]) -> Result<(), String> {
    numbers(env, upper_bound(args)?)
        .map(|n: u64| -> u64 { panic!("fail-at-start fails on record {n}, as it always does") })
        .name("always fails")
        .sink_to(DiscardSink::new(), "discard");
    Ok(())
}
