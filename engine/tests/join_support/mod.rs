//! What the join tests share: the two input types, per-record watermarks, sources, a gated
//! source that orders a record after an effect seen elsewhere in the job, and the random
//! inputs and job runner of the property tests.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use weir_engine::connector::{
    Boundedness, ConnectorError, LocalBoxFuture, ReadStatus, SourceReader, SourceSplit,
    SplitEnumerator, StaticSplits,
};
use weir_engine::prelude::*;
use weir_engine::time::{WatermarkGenerator, WatermarkOutput};

use crate::common;

/// (key, timestamp, id): the left input.
pub type Left = (String, i64, u32);
/// (key, timestamp, id): the right input, of another type.
pub type Right = (String, i64, u64);
/// (left id, right id, timestamp of the output record).
pub type Pair = (u32, u64, i64);

/// Bounded out-of-orderness, emitted after every record instead of periodically.
#[derive(Clone)]
pub struct PerRecord {
    max: i64,
    bound: i64,
}

impl<T> WatermarkGenerator<T> for PerRecord {
    fn on_event(&mut self, _: &T, timestamp: i64, output: &mut WatermarkOutput) {
        self.max = self.max.max(timestamp);
        output.emit_watermark(self.max - self.bound - 1);
    }
    fn on_periodic_emit(&mut self, _: &mut WatermarkOutput) {}
}

/// Per-record watermarks `max_ts - bound - 1`, timestamps from `timestamp`.
pub fn per_record<T: 'static>(bound_ms: i64, timestamp: fn(&T) -> i64) -> WatermarkStrategy<T> {
    WatermarkStrategy::for_generator(move || PerRecord {
        max: i64::MIN + bound_ms + 1,
        bound: bound_ms,
    })
    .with_timestamp_assigner(move |e: &T, _| timestamp(e))
}

/// A bound above every timestamp of the hand-computed cases: watermarks advance only when
/// the inputs end, so nothing is late whatever the interleaving.
pub const AT_END: i64 = 1_000_000;

pub fn lefts(list: &[(&str, i64, u32)]) -> Vec<Left> {
    list.iter()
        .map(|&(k, t, id)| (k.to_string(), t, id))
        .collect()
}

pub fn rights(list: &[(&str, i64, u64)]) -> Vec<Right> {
    list.iter()
        .map(|&(k, t, id)| (k.to_string(), t, id))
        .collect()
}

pub fn left_source(env: &StreamEnvironment, input: Vec<Left>, bound_ms: i64) -> DataStream<Left> {
    env.from_source(
        CollectionSource::new(input),
        per_record(bound_ms, |e: &Left| e.1),
        "left",
    )
}

pub fn right_source(
    env: &StreamEnvironment,
    input: Vec<Right>,
    bound_ms: i64,
) -> DataStream<Right> {
    env.from_source(
        CollectionSource::new(input),
        per_record(bound_ms, |e: &Right| e.1),
        "right",
    )
}

/// Pairs each record with the timestamp it carries.
pub fn stamped(pairs: DataStream<(u32, u64)>) -> DataStream<Pair> {
    pairs.process(|p: (u32, u64), ctx: &mut ProcessContext<'_, Pair>| {
        let timestamp = ctx.timestamp().expect("join output is timestamped");
        ctx.emit((p.0, p.1, timestamp))
    })
}

/// Runs `build` over the two inputs (sources of parallelism 1, watermarks at the end) and
/// returns its output with timestamps.
pub fn run_pairs(
    left: &[(&str, i64, u32)],
    right: &[(&str, i64, u64)],
    build: impl FnOnce(DataStream<Left>, DataStream<Right>) -> DataStream<(u32, u64)>,
) -> Vec<Pair> {
    let env = common::env();
    let left = left_source(&env, lefts(left), AT_END).parallelism(1);
    let right = right_source(&env, rights(right), AT_END).parallelism(1);
    let (sink, out) = CollectSink::new();
    stamped(build(left, right)).sink_to(sink, "pairs");
    env.execute("join").expect("the job succeeds");
    out.records()
}

/// A bounded source (one split, for one subtask) that emits `elements[..gate_at]`, then waits
/// until `open()` says so before it emits the rest: it orders a record after an effect seen
/// elsewhere in the job.
pub struct GatedSource<T> {
    /// Everything the source emits, in order.
    pub elements: Arc<Vec<T>>,
    /// The index of the first element held back.
    pub gate_at: usize,
    /// Whether the held-back elements may go.
    pub open: Arc<dyn Fn() -> bool + Send + Sync>,
}

#[derive(Clone, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct GatedSplit {
    next: usize,
}

impl SourceSplit for GatedSplit {
    fn split_id(&self) -> String {
        "gated".into()
    }
}

struct GatedReader<T> {
    elements: Arc<Vec<T>>,
    gate_at: usize,
    open: Arc<dyn Fn() -> bool + Send + Sync>,
    split: Option<GatedSplit>,
}

impl<T: Clone + Send + Sync + 'static> Source<T> for GatedSource<T> {
    type Split = GatedSplit;

    fn boundedness(&self) -> Boundedness {
        Boundedness::Bounded
    }

    fn create_enumerator(&self, _parallelism: usize) -> Box<dyn SplitEnumerator<GatedSplit>> {
        Box::new(StaticSplits::shared(vec![GatedSplit { next: 0 }]))
    }

    fn create_reader(&self, _: &RuntimeContext) -> Box<dyn SourceReader<T, GatedSplit>> {
        Box::new(GatedReader {
            elements: Arc::clone(&self.elements),
            gate_at: self.gate_at,
            open: Arc::clone(&self.open),
            split: None,
        })
    }
}

impl<T: Clone> SourceReader<T, GatedSplit> for GatedReader<T> {
    fn add_split(&mut self, split: GatedSplit) {
        self.split = Some(split);
    }

    fn poll_next<'a>(
        &'a mut self,
        out: &'a mut Vec<T>,
        max: usize,
    ) -> LocalBoxFuture<'a, Result<ReadStatus, ConnectorError>> {
        let status = match &mut self.split {
            None => ReadStatus::NeedSplit,
            Some(split) if split.next == self.elements.len() => {
                self.split = None;
                ReadStatus::SplitFinished { split: 0 }
            }
            Some(split) if split.next == self.gate_at && !(self.open)() => {
                ReadStatus::Idle(Duration::from_millis(1))
            }
            Some(split) => {
                let stop = if split.next < self.gate_at {
                    self.gate_at
                } else {
                    self.elements.len()
                };
                let end = stop.min(split.next + max);
                out.extend_from_slice(&self.elements[split.next..end]);
                split.next = end;
                ReadStatus::Records { split: 0 }
            }
        };
        Box::pin(async move { Ok(status) })
    }

    fn snapshot_splits(&self) -> Vec<GatedSplit> {
        self.split.iter().cloned().collect()
    }
}

// ---------------------------------------------------------------------------------------
// property tests against a nested loop

/// Out-of-orderness of the generated inputs, and their watermark bound.
pub const DISORDER: i64 = 300;

/// Records with keys in `0..4` and ids `0..n`, timestamps rising in random steps and then
/// moved forward by up to [`DISORDER`]: never more than the bound out of order, so nothing
/// is late, while watermarks advance all along.
pub fn keyed_input(max_len: usize) -> impl Strategy<Value = Vec<(u8, i64)>> {
    proptest::collection::vec((0u8..4, 0i64..400, 0..=DISORDER), 0..max_len).prop_map(|steps| {
        let mut base = 0;
        steps
            .into_iter()
            .map(|(key, step, jitter)| {
                base += step;
                (key, base + jitter)
            })
            .collect()
    })
}

pub type PLeft = (u8, i64, u32);
pub type PRight = (u8, i64, u64);

/// `t`, or with `coarse` `t` rounded down to a multiple of [`GRID`] ms. Rounding keeps
/// generated inputs within [`DISORDER`] (a multiple of the grid) of order.
pub fn on_grid(coarse: bool, t: i64) -> i64 {
    if coarse {
        t - t.rem_euclid(GRID)
    } else {
        t
    }
}

/// The coarse time grid: records, windows and bounds meet exactly on it.
pub const GRID: i64 = 50;

/// Both inputs with ids (their indexes), on the coarse grid if `coarse`.
pub fn with_ids(
    left: &[(u8, i64)],
    right: &[(u8, i64)],
    coarse: bool,
) -> (Vec<PLeft>, Vec<PRight>) {
    let left = left
        .iter()
        .enumerate()
        .map(|(i, &(k, t))| (k, on_grid(coarse, t), i as u32))
        .collect();
    let right = right
        .iter()
        .enumerate()
        .map(|(i, &(k, t))| (k, on_grid(coarse, t), i as u64))
        .collect();
    (left, right)
}

/// Runs `build` over the inputs at `parallelism` (sources included) and returns its output
/// with timestamps. Every record and watermark travels in a segment of its own with one credit
/// per channel, so a source cannot run far ahead of the join: the two inputs interleave
/// closely instead of arriving one after the other; `right_first` declares the right source
/// first. Watermarks trail the highest timestamp by `bound + 1` ms.
pub fn run_property(
    parallelism: usize,
    right_first: bool,
    bound: i64,
    left: &[PLeft],
    right: &[PRight],
    build: impl FnOnce(DataStream<PLeft>, DataStream<PRight>) -> DataStream<(u32, u64)>,
) -> Vec<Pair> {
    let env = common::env_with(
        parallelism,
        &[
            ("execution.buffer-timeout", "0 ms"),
            ("taskmanager.network.memory.buffers-per-channel", "1"),
        ],
    );
    let left_source = |env: &StreamEnvironment| {
        env.from_source(
            CollectionSource::new(left.to_vec()),
            per_record(bound, |e: &PLeft| e.1),
            "left",
        )
    };
    let right_source = |env: &StreamEnvironment| {
        env.from_source(
            CollectionSource::new(right.to_vec()),
            per_record(bound, |e: &PRight| e.1),
            "right",
        )
    };
    let (left, right) = if right_first {
        let right = right_source(&env);
        (left_source(&env), right)
    } else {
        let left = left_source(&env);
        (left, right_source(&env))
    };
    let (sink, out) = CollectSink::new();
    stamped(build(left, right)).sink_to(sink, "pairs");
    env.execute("join property").expect("the job succeeds");
    out.records()
}
