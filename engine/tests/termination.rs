//! Bounded jobs end: when every source has read its input, end of partition reaches every
//! task, `execute` returns, and the counts match what went in. Sequence, collection and file
//! sources, at parallelism 1 and 2, with and without exchanges, and with empty inputs.

mod common;

use std::io::Write;

use common::assert_same_multiset;
use weir_engine::prelude::*;

/// Checks a finished job's counts: the source emitted `n`, the sink received `n`, the
/// collected records are `expected`.
#[track_caller]
fn assert_complete<T>(
    result: &JobResult,
    source: &str,
    collected: &weir_engine::connector::Collected<T>,
    expected: &[T],
) where
    T: Clone + std::hash::Hash + Eq + std::fmt::Debug,
{
    let n = expected.len() as u64;
    assert_eq!(result.records_out(source), n, "{:?}", result.operators);
    assert_eq!(result.records_in("Sink: out"), n, "{:?}", result.operators);
    assert_same_multiset(&collected.records(), expected);
    for pool in &result.pools {
        assert_eq!(pool.in_use, 0, "slot {} leaked segments", pool.slot);
    }
}

#[test]
fn a_sequence_source_job_ends() {
    for parallelism in common::parallelisms() {
        for through_exchange in [false, true] {
            let env = common::env();
            let (sink, collected) = CollectSink::new();
            let stream = env.from_sequence(100, 10_100).parallelism(parallelism);
            let stream = if through_exchange {
                stream.rebalance()
            } else {
                stream
            };
            stream
                .map(|n: u64| n - 100)
                .parallelism(parallelism)
                .sink_to(sink, "out")
                .parallelism(parallelism);
            let result = env.execute("sequence").expect("the job ends");
            assert_complete(
                &result,
                "Source: Sequence",
                &collected,
                &(0..10_000).collect::<Vec<_>>(),
            );
            assert_eq!(collected.by_subtask().len(), parallelism);
        }
    }
}

#[test]
fn a_collection_source_job_ends() {
    for parallelism in common::parallelisms() {
        let env = common::env();
        let words: Vec<String> = (0..7_777).map(|i| format!("w{}", i % 123)).collect();
        let (sink, collected) = CollectSink::new();
        env.from_collection(words.clone())
            .parallelism(parallelism)
            .key_by(|w: &String| w.clone())
            .process(|w: String, ctx: &mut KeyedProcessContext<'_, String, String>| ctx.emit(w))
            .parallelism(parallelism)
            .sink_to(sink, "out");
        let result = env.execute("collection").expect("the job ends");
        assert_complete(&result, "Source: Collection", &collected, &words);
    }
}

#[test]
fn a_file_source_job_ends() {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    let lines: Vec<String> = (0..5_000).map(|i| format!("line {i}")).collect();
    writeln!(file, "{}", lines.join("\n")).expect("write");
    file.flush().expect("flush");
    for parallelism in common::parallelisms() {
        let env = common::env();
        let (sink, collected) = CollectSink::new();
        env.from_source(
            FileSource::text_lines(file.path()),
            WatermarkStrategy::no_watermarks(),
            "file",
        )
        .parallelism(parallelism)
        .rebalance()
        .sink_to(sink, "out")
        .parallelism(parallelism);
        let result = env.execute("file").expect("the job ends");
        assert_complete(&result, "Source: file", &collected, &lines);
    }
}

#[test]
fn empty_inputs_end_at_once() {
    for parallelism in common::parallelisms() {
        let env = common::env();
        let (sink, collected) = CollectSink::new();
        env.from_collection(Vec::<u64>::new())
            .parallelism(parallelism)
            .rebalance()
            .sink_to(sink, "out")
            .parallelism(parallelism);
        let result = env.execute("empty collection").expect("the job ends");
        assert_complete(&result, "Source: Collection", &collected, &[]);

        let env = common::env();
        let (sink, collected) = CollectSink::new();
        env.from_sequence(5, 5)
            .parallelism(parallelism)
            .key_by(|n: &u64| *n)
            .reduce(|a: u64, b: u64| a + b)
            .sink_to(sink, "out");
        let result = env.execute("empty sequence").expect("the job ends");
        assert_complete(&result, "Source: Sequence", &collected, &[]);

        let file = tempfile::NamedTempFile::new().expect("temp file");
        let env = common::env();
        let (sink, collected) = CollectSink::new();
        env.from_source(
            FileSource::text_lines(file.path()),
            WatermarkStrategy::no_watermarks(),
            "file",
        )
        .parallelism(parallelism)
        .sink_to(sink, "out");
        let result = env.execute("empty file").expect("the job ends");
        assert_complete(&result, "Source: file", &collected, &[]);
    }
}

#[test]
fn fewer_records_than_subtasks_still_ends() {
    // Subtasks without a split must end too, and tell their receivers so.
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_collection(vec![1u64])
        .rebalance()
        .map(|n: u64| n + 1)
        .key_by(|n: &u64| *n)
        .reduce(|a: u64, b: u64| a + b)
        .sink_to(sink, "out");
    let result = env.execute("one record").expect("the job ends");
    assert_complete(&result, "Source: Collection", &collected, &[2]);
}

#[test]
fn a_deep_pipeline_of_exchanges_ends() {
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    let other = env.from_collection((0..1_000u64).collect::<Vec<_>>());
    env.from_sequence(0, 3_000)
        .rebalance()
        .map(|n: u64| n + 1)
        .broadcast()
        .filter(|n: &u64| n.is_multiple_of(2))
        .parallelism(1)
        .union([other])
        .key_by(|n: &u64| n % 7)
        .process(|n: u64, ctx: &mut KeyedProcessContext<'_, u64, u64>| ctx.emit(n))
        .rebalance()
        .map(|n: u64| n)
        .sink_to(sink, "out");
    let result = env.execute("deep").expect("the job ends");
    let mut expected: Vec<u64> = (1..=3_000).filter(|n: &u64| n.is_multiple_of(2)).collect();
    expected.extend(0..1_000);
    assert_same_multiset(&collected.records(), &expected);
    assert_eq!(result.records_in("Sink: out"), expected.len() as u64);
}

#[test]
fn the_same_environment_runs_its_job_twice() {
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_sequence(0, 1_000).rebalance().sink_to(sink, "out");
    let first = env.execute("first").expect("the job ends");
    let second = env.execute("second").expect("the job ends again");
    assert_eq!(first.records_in("Sink: out"), 1_000);
    assert_eq!(second.records_in("Sink: out"), 1_000);
    assert_eq!(second.job_name, "second");
    // Both runs wrote into the same collector.
    let mut expected: Vec<u64> = (0..1_000).collect();
    expected.extend(0..1_000);
    assert_same_multiset(&collected.records(), &expected);
}
