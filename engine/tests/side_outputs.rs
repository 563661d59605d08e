//! Side outputs: `ctx.output(tag, value)` in a process function, read with
//! `get_side_output(tag)`, chained or across an exchange, next to the main output or alone.

mod common;

use weir_engine::prelude::*;

fn split_odd(tag: OutputTag<String>) -> impl ProcessFunction<u64, u64> {
    move |n: u64, ctx: &mut ProcessContext<'_, u64>| {
        if n % 2 == 1 {
            ctx.output(&tag, format!("odd {n}"));
        } else {
            ctx.emit(n);
        }
    }
}

#[test]
fn records_go_to_the_main_or_the_side_output() {
    for rebalance in [false, true] {
        let env = common::env();
        let odd = OutputTag::<String>::new("odd");
        let evens = env.from_sequence(0, 1_000).process(split_odd(odd.clone()));
        let (main_sink, main) = CollectSink::new();
        let (side_sink, side) = CollectSink::new();
        let side_stream = evens.get_side_output(&odd);
        let side_stream = if rebalance {
            side_stream.rebalance()
        } else {
            side_stream
        };
        side_stream.sink_to(side_sink, "odd");
        evens.sink_to(main_sink, "even");
        env.execute("side outputs").expect("the job succeeds");
        common::assert_same_multiset(
            &main.records(),
            &(0..1_000).filter(|n| n % 2 == 0).collect::<Vec<u64>>(),
        );
        common::assert_same_multiset(
            &side.records(),
            &(0..1_000)
                .filter(|n| n % 2 == 1)
                .map(|n| format!("odd {n}"))
                .collect::<Vec<String>>(),
        );
    }
}

#[test]
fn a_side_output_alone_is_enough_to_run_the_operator() {
    let env = common::env();
    let odd = OutputTag::<String>::new("odd");
    let (sink, side) = CollectSink::new();
    env.from_sequence(0, 100)
        .process(split_odd(odd.clone()))
        .get_side_output(&odd)
        .sink_to(sink, "odd");
    env.execute("side only").expect("the job succeeds");
    assert_eq!(side.len(), 50);
}

#[test]
fn side_outputs_of_a_source_are_refused() {
    let env = common::env();
    let tag = OutputTag::<u64>::new("nothing");
    let (sink, _) = CollectSink::new();
    env.from_sequence(0, 10)
        .get_side_output(&tag)
        .sink_to(sink, "out");
    let err = env.execute("bad").expect_err("refused");
    assert!(err.to_string().contains("side outputs come from"), "{err}");
}

#[test]
fn a_side_output_of_an_operator_that_emits_none_is_an_empty_stream_that_ends() {
    for rebalance in [false, true] {
        let env = common::env();
        let tag = OutputTag::<u64>::new("nothing");
        let kept = env
            .from_sequence(0, 100)
            .filter(|n: &u64| n.is_multiple_of(2));
        let side = kept.get_side_output(&tag);
        let side = if rebalance { side.rebalance() } else { side };
        let (sink, out) = CollectSink::new();
        let (main_sink, main) = CollectSink::new();
        side.sink_to(sink, "side");
        kept.sink_to(main_sink, "main");
        env.execute("empty side").expect("the job ends");
        assert_eq!(out.len(), 0);
        assert_eq!(main.len(), 50);
    }
}
