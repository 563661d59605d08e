//! Operator (non-keyed) state in jobs: each sink subtask and each function subtask gets its
//! own store from its `RuntimeContext`; a sink writer keeps its handles, a function takes them
//! per call; registering a name with two kinds fails the job.

mod common;

use std::sync::{Arc, Mutex};

use futures::future::LocalBoxFuture;
use weir_engine::connector::{ConnectorError, SinkWriter};
use weir_engine::prelude::*;
use weir_engine::state::{BroadcastState, OperatorListState};

/// What each sink subtask held in its states when the input ended: (subtask, list, broadcast
/// entries).
type Report = (usize, Vec<u64>, Vec<(String, u64)>);

/// A sink that buffers every record in operator list state, counts records per parity in
/// broadcast state, and reports both at the end.
#[derive(Clone)]
struct BufferingSink {
    reports: Arc<Mutex<Vec<Report>>>,
}

struct BufferingWriter {
    subtask: usize,
    buffer: OperatorListState<u64>,
    parities: BroadcastState<String, u64>,
    reports: Arc<Mutex<Vec<Report>>>,
}

impl Sink<u64> for BufferingSink {
    fn create_writer(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Box<dyn SinkWriter<u64>>, ConnectorError> {
        let store = ctx.operator_state();
        let buffer = store
            .list_state(&ListStateDescriptor::new("buffer"))
            .map_err(|e| ConnectorError::external(e.to_string()))?;
        let parities = store
            .broadcast_state(&MapStateDescriptor::new("parities"))
            .map_err(|e| ConnectorError::external(e.to_string()))?;
        Ok(Box::new(BufferingWriter {
            subtask: ctx.subtask,
            buffer,
            parities,
            reports: Arc::clone(&self.reports),
        }))
    }
}

impl SinkWriter<u64> for BufferingWriter {
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<u64>,
        _timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
        for n in batch.drain(..) {
            let parity = if n % 2 == 0 { "even" } else { "odd" }.to_string();
            let seen = self.parities.get(&parity).unwrap_or(0);
            self.parities.put(parity, seen + 1);
            self.buffer.add(n);
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, Result<(), ConnectorError>> {
        let mut entries = self.parities.entries();
        entries.sort();
        self.reports
            .lock()
            .expect("reports")
            .push((self.subtask, self.buffer.get(), entries));
        Box::pin(std::future::ready(Ok(())))
    }
}

#[test]
fn each_sink_subtask_keeps_its_own_operator_state() {
    for parallelism in common::parallelisms() {
        let env = common::env_with(parallelism, &[]);
        let reports = Arc::new(Mutex::new(Vec::new()));
        env.from_source(
            DataGeneratorSource::sequence(0, 1000),
            WatermarkStrategy::no_watermarks(),
            "numbers",
        )
        .rebalance()
        .sink_to(
            BufferingSink {
                reports: Arc::clone(&reports),
            },
            "buffering",
        )
        .parallelism(parallelism);
        env.execute("operator-state").expect("the job succeeds");

        let mut reports = reports.lock().expect("reports").clone();
        reports.sort();
        assert_eq!(reports.len(), parallelism, "one report per subtask");
        let mut all: Vec<u64> = Vec::new();
        for (subtask, buffer, parities) in &reports {
            let even = buffer.iter().filter(|n| *n % 2 == 0).count() as u64;
            let odd = buffer.len() as u64 - even;
            let expected: Vec<(String, u64)> = [("even", even), ("odd", odd)]
                .into_iter()
                .filter(|(_, count)| *count > 0)
                .map(|(parity, count)| (parity.to_string(), count))
                .collect();
            assert_eq!(parities, &expected, "subtask {subtask}: its own counts");
            all.extend(buffer);
        }
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<u64>>(), "every record once");
    }
}

/// A function that takes its operator state from the context per call: the running count of
/// records this subtask saw.
#[derive(Clone)]
struct CountInSubtask;

impl ProcessFunction<u64, (usize, usize)> for CountInSubtask {
    fn process_element(&mut self, _n: u64, ctx: &mut ProcessContext<'_, (usize, usize)>) {
        let subtask = ctx.runtime().subtask;
        let seen = ctx
            .runtime()
            .operator_state()
            .union_list_state(&ListStateDescriptor::<u8>::new("seen"))
            .expect("register");
        seen.add(0);
        let count = seen.len();
        ctx.emit((subtask, count));
    }
}

#[test]
fn a_function_reaches_its_subtask_state_through_the_context() {
    let env = common::env_with(1, &[]);
    let (sink, out) = CollectSink::new();
    env.from_source(
        DataGeneratorSource::sequence(0, 100),
        WatermarkStrategy::no_watermarks(),
        "numbers",
    )
    .process(CountInSubtask)
    .sink_to(sink, "counts");
    env.execute("function-state").expect("the job succeeds");
    let counts: Vec<usize> = out.records().iter().map(|&(_, count)| count).collect();
    assert_eq!(counts, (1..=100).collect::<Vec<usize>>());
}

/// Registers "seen" as a split list and then as a union list.
#[derive(Clone)]
struct TwoModes;

impl ProcessFunction<u64, u64> for TwoModes {
    fn process_element(&mut self, n: u64, ctx: &mut ProcessContext<'_, u64>) {
        let store = ctx.runtime().operator_state();
        let descriptor = ListStateDescriptor::<u64>::new("seen");
        store.list_state(&descriptor).expect("first registration");
        if let Err(error) = store.union_list_state(&descriptor) {
            panic!("{error}");
        }
        ctx.emit(n);
    }
}

#[test]
fn one_name_in_two_modes_fails_the_job_naming_the_state() {
    let env = common::env_with(1, &[]);
    env.from_source(
        DataGeneratorSource::sequence(0, 10),
        WatermarkStrategy::no_watermarks(),
        "numbers",
    )
    .process(TwoModes)
    .name("two-modes")
    .sink_to(DiscardSink::new(), "nothing");
    let error = env.execute("conflict").expect_err("fails").to_string();
    assert!(
        error.contains("two-modes") && error.contains("'seen'"),
        "{error}"
    );
}
