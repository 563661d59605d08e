//! A job package of one's own: an executable built against `weir-engine` whose `main` hands
//! its named jobs to `weir_engine::package::main`. A control plane with `web.upload.enabled`
//! takes it over HTTP (`curl -F jarfile=@weir-example-package http://localhost:8081/jars/upload`)
//! and runs its jobs on its workers (`weir submit --jar ID even-squares --to 1000000`), each in
//! an executor process started from this file.

use std::process::ExitCode;

use weir_engine::package::{self, Registry};
use weir_engine::prelude::*;
use weir_memory::CountingAllocator;

/// As the `weir` binary does: mimalloc, counted per thread, so that each shard's heap is held
/// to its slot's share and shown (`weir_slot_heap_memory_used_bytes`).
#[global_allocator]
static GLOBAL: CountingAllocator<mimalloc::MiMalloc> = CountingAllocator::new(mimalloc::MiMalloc);

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
            )
            .job(
                "lagging-split",
                "Numbers without end in one split per subtask, stamped with the wall clock, \
                 those of split 1 --lag-ms behind (default 60000), through a map that takes \
                 --sleep-us per record (default 100) into a discard sink: a job whose \
                 bottleneck and event-time holdback are known (run it at parallelism 2).",
                lagging_split,
            )
            .job(
                "slow-subtask",
                "Numbers without end, dealt round-robin to a map whose subtask 1 takes \
                 --sleep-us per record (default 1000) into a discard sink: run at parallelism \
                 2, subtask 1 backpressures every source subtask, over the network where the \
                 job spans workers.",
                slow_subtask,
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

/// `--lag-ms N --sleep-us N`, in any order, each optional.
fn lag_and_sleep(args: &[String]) -> Result<(i64, u64), String> {
    let (mut lag_ms, mut sleep_us) = (60_000, 100);
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} takes a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag} takes a whole number, not '{value}'"))
        };
        match flag.as_str() {
            "--lag-ms" => lag_ms = number()? as i64,
            "--sleep-us" => sleep_us = number()?,
            other => {
                return Err(format!(
                    "unexpected argument '{other}'; use --lag-ms N, --sleep-us N"
                ))
            }
        }
    }
    Ok((lag_ms, sleep_us))
}

fn lagging_split(env: &StreamEnvironment, args: &[String]) -> Result<(), String> {
    let (lag_ms, sleep_us) = lag_and_sleep(args)?;
    let now_ms = weir_engine::time::now_ms;
    // Subtask s of p generates the indices s, s + p, …: at parallelism 2 the odd ones are
    // split 1's.
    let stamped = WatermarkStrategy::for_bounded_out_of_orderness(std::time::Duration::ZERO)
        .with_timestamp_assigner(move |n: &u64, _| now_ms() - if n % 2 == 1 { lag_ms } else { 0 });
    env.from_source(DataGeneratorSource::new(None, |i| i), stamped, "numbers")
        .uid("numbers")
        .rebalance()
        .map(move |n: u64| {
            std::thread::sleep(std::time::Duration::from_micros(sleep_us));
            n
        })
        .name("slow map")
        .sink_to(DiscardSink::new(), "discard");
    Ok(())
}

fn slow_subtask(env: &StreamEnvironment, args: &[String]) -> Result<(), String> {
    let sleep_us = match args {
        [] => 1000,
        [flag, value] if flag == "--sleep-us" => value
            .parse()
            .map_err(|_| format!("--sleep-us takes a whole number, not '{value}'"))?,
        other => {
            return Err(format!(
                "unexpected arguments {other:?}; the only one is --sleep-us N"
            ))
        }
    };
    env.from_source(
        DataGeneratorSource::new(None, |i| i),
        WatermarkStrategy::no_watermarks(),
        "numbers",
    )
    .uid("numbers")
    .rebalance()
    .process(move |n: u64, ctx: &mut ProcessContext<'_, u64>| {
        if ctx.runtime().subtask == 1 {
            std::thread::sleep(std::time::Duration::from_micros(sleep_us));
        }
        ctx.emit(n);
    })
    .name("slow on subtask 1")
    .sink_to(DiscardSink::new(), "discard");
    Ok(())
}

fn fail_at_start(env: &StreamEnvironment, args: &[String]) -> Result<(), String> {
    numbers(env, upper_bound(args)?)
        .map(|n: u64| -> u64 { panic!("fail-at-start fails on record {n}, as it always does") })
        .name("always fails")
        .sink_to(DiscardSink::new(), "discard");
    Ok(())
}
