//! The typed side of the graph's type-erased factories: each is created by an API call that
//! knows the record types, and downcasts its `AnyOutput`s exactly once, when a task is built.

use std::marker::PhantomData;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::exchange::local::LocalChannel;
use super::exchange::partitioner::{
    BroadcastPartitioner, ForwardPartitioner, KeyGroupPartitioner, RebalancePartitioner,
};
use super::exchange::reader::{BarrierAlignment, InputGate};
use super::exchange::writer::ExchangeWriter;
use super::exchange::PartitionKind;
use super::task::{DiscardOutput, NetworkTask, SinkOutput, SourceTask, Subtask, TaskSettings};
use crate::checkpoint::bytes::{ByteReader, ByteWriter};
use crate::checkpoint::driver::TaskCheckpointing;
use crate::checkpoint::task_state::PART_SPLITS;
use crate::connector::{Boundedness, Sink, Source, SourceSplit, SplitEnumerator};
use crate::error::{TaskError, TaskResult};
use crate::graph::SharedEnumerator;
use crate::graph::{
    AnyOutput, OperatorFactory, ReceiverEnd, SinkFactory, SourceFactory, TypeOps, WriterFactory,
    WriterParts,
};
use crate::metrics::{OperatorMetrics, TaskMetrics};
use crate::operator::{
    FanOut, FilterLink, Operator, OperatorLink, Output, RuntimeContext, SideOutputs,
};
use crate::record::{Key, Record};
use crate::time::watermark::SplitWatermarkTracker;
use crate::time::WatermarkStrategy;

/// Unwraps an [`AnyOutput`] built for `T`.
pub(crate) fn downcast_output<T: 'static>(output: AnyOutput) -> Box<dyn Output<T>> {
    *output.downcast::<Box<dyn Output<T>>>().unwrap_or_else(|_| {
        panic!(
            "internal error: an output of the wrong record type (expected {})",
            std::any::type_name::<T>()
        )
    })
}

pub(crate) fn erase_output<T: 'static>(output: Box<dyn Output<T>>) -> AnyOutput {
    Box::new(output)
}

/// One subtask's chain link around `operator`, in front of `next` (an output of `O`), erased
/// for the graph.
pub(crate) fn link_operator<I: Record, O: Record, Op: Operator<I, O>>(
    operator: Op,
    ctx: &RuntimeContext,
    settings: &TaskSettings,
    metrics: Arc<OperatorMetrics>,
    next: AnyOutput,
    side: SideOutputs,
) -> AnyOutput {
    let next = downcast_output::<O>(next);
    let link = OperatorLink::new(operator, ctx, next, side, settings.batch_size, metrics);
    erase_output::<I>(Box::new(link))
}

fn fan_out<T: Record>(outputs: Vec<AnyOutput>) -> AnyOutput {
    erase_output::<T>(Box::new(FanOut::new(
        outputs.into_iter().map(downcast_output::<T>).collect(),
    )))
}

fn network_task<T: Record>(
    inputs: Vec<ReceiverEnd>,
    chain: AnyOutput,
    settings: &TaskSettings,
    mut checkpointing: Option<TaskCheckpointing>,
    cancel: Arc<AtomicBool>,
    metrics: Arc<TaskMetrics>,
) -> Box<dyn Subtask> {
    let alignment = match &checkpointing {
        Some(c) if !c.job.exactly_once => BarrierAlignment::AtLeastOnce,
        _ => BarrierAlignment::Aligned,
    };
    let mut gate = InputGate::<T>::new(inputs, alignment, metrics.bytes_in.clone());
    if let Some(checkpointing) = &mut checkpointing {
        if let Some((timeout, announcements)) = &checkpointing.job.unaligned {
            gate = gate.unaligned(
                *timeout,
                announcements.clone(),
                checkpointing.task,
                Arc::clone(&checkpointing.input_layout),
            );
        }
        if let Some(in_flight) = checkpointing.in_flight.take() {
            gate = gate.restoring(in_flight);
        }
    }
    Box::new(NetworkTask {
        gate,
        chain: downcast_output::<T>(chain),
        settings: settings.clone(),
        checkpointing,
        cancel,
        metrics,
    })
}

fn side_output<T: Record>(tag: Arc<str>, output: AnyOutput, sides: &mut SideOutputs) {
    sides.add(tag, downcast_output::<T>(output));
}

fn discard<T: Record>() -> AnyOutput {
    erase_output::<T>(Box::new(DiscardOutput))
}

/// The record-type operations of `T`.
pub(crate) fn type_ops<T: Record>() -> TypeOps {
    TypeOps {
        fan_out: fan_out::<T>,
        network_task: network_task::<T>,
        local_channel: LocalChannel::<T>::new_erased,
        side_output: side_output::<T>,
        discard: discard::<T>,
    }
}

/// Creates an operator per subtask (`make` clones the user's function into a fresh operator).
pub(crate) struct OperatorNode<I, O, Make> {
    make: Make,
    _types: PhantomData<fn(I) -> O>,
}

impl<I, O, Make> OperatorNode<I, O, Make> {
    pub(crate) fn new(make: Make) -> Self {
        OperatorNode {
            make,
            _types: PhantomData,
        }
    }
}

impl<I, O, Op, Make> OperatorFactory for OperatorNode<I, O, Make>
where
    I: Record,
    O: Record,
    Op: Operator<I, O>,
    Make: Fn() -> Op + Send + Sync,
{
    fn create(
        &self,
        ctx: &RuntimeContext,
        settings: &TaskSettings,
        metrics: Arc<OperatorMetrics>,
        next: AnyOutput,
        side: SideOutputs,
    ) -> AnyOutput {
        link_operator((self.make)(), ctx, settings, metrics, next, side)
    }

    fn unsupported_state(&self) -> Option<&'static str> {
        (self.make)().unsupported_state()
    }
}

/// Creates a filter per subtask (a link of its own: it filters batches in place).
pub(crate) struct FilterNode<T, F> {
    predicate: F,
    _types: PhantomData<fn(T)>,
}

impl<T, F> FilterNode<T, F> {
    pub(crate) fn new(predicate: F) -> Self {
        FilterNode {
            predicate,
            _types: PhantomData,
        }
    }
}

impl<T, F> OperatorFactory for FilterNode<T, F>
where
    T: Record,
    F: FnMut(&T) -> bool + Clone + Send + Sync + 'static,
{
    fn create(
        &self,
        _ctx: &RuntimeContext,
        _settings: &TaskSettings,
        metrics: Arc<OperatorMetrics>,
        next: AnyOutput,
        side: SideOutputs,
    ) -> AnyOutput {
        let link = FilterLink::new(
            self.predicate.clone(),
            downcast_output::<T>(next),
            side,
            metrics,
        );
        erase_output::<T>(Box::new(link))
    }

    fn unsupported_state(&self) -> Option<&'static str> {
        None
    }
}

/// Creates a sink writer per subtask.
pub(crate) struct SinkNode<T, S> {
    sink: S,
    _types: PhantomData<fn(T)>,
}

impl<T, S> SinkNode<T, S> {
    pub(crate) fn new(sink: S) -> Self {
        SinkNode {
            sink,
            _types: PhantomData,
        }
    }
}

impl<T: Record, S: Sink<T>> SinkFactory for SinkNode<T, S> {
    fn create(&self, ctx: &RuntimeContext, metrics: Arc<OperatorMetrics>) -> TaskResult<AnyOutput> {
        let writer = self
            .sink
            .create_writer(ctx)
            .map_err(|e| e.in_operator(&metrics.name))?;
        Ok(erase_output::<T>(Box::new(SinkOutput {
            writer,
            metrics,
            task: ctx.task.get(),
            operator_id: Arc::clone(&ctx.state.operator_id),
            operator_state: ctx.operator_state,
            finished: false,
        })))
    }
}

/// Creates a source's enumerator and reader tasks.
pub(crate) struct SourceNode<T, S> {
    source: S,
    watermarks: WatermarkStrategy<T>,
}

impl<T, S> SourceNode<T, S> {
    pub(crate) fn new(source: S, watermarks: WatermarkStrategy<T>) -> Self {
        SourceNode { source, watermarks }
    }
}

/// A source's split enumerator, shared by its readers, with the checkpoint barrier each
/// reader must pass before it gets another split (see `checkpoint::driver`).
pub(crate) struct EnumeratorCell<S> {
    enumerator: Box<dyn SplitEnumerator<S>>,
    held: Vec<Option<u64>>,
}

/// What a reader asking for a split gets.
pub(crate) enum NextSplit<S> {
    Split(S),
    /// No more work for it.
    NoMore,
    /// Not before it has passed the barrier of a checkpoint being taken: ask again after
    /// reading the mailbox.
    Held,
}

impl<S> EnumeratorCell<S> {
    pub(crate) fn next_split(&mut self, subtask: usize) -> NextSplit<S> {
        if self.held.get(subtask).copied().flatten().is_some() {
            return NextSplit::Held;
        }
        match self.enumerator.next_split(subtask) {
            Some(split) => NextSplit::Split(split),
            None => NextSplit::NoMore,
        }
    }

    /// Reader `subtask` passed the barrier of `checkpoint`.
    pub(crate) fn release(&mut self, subtask: usize, checkpoint: u64) {
        if let Some(held) = self.held.get_mut(subtask) {
            if held.is_some_and(|c| c <= checkpoint) {
                *held = None;
            }
        }
    }
}

type EnumeratorOf<S> = Mutex<EnumeratorCell<S>>;

/// Encodes a source's splits, each with the subtask it is kept for (`None`: any): per split
/// a `u8` (1: kept for a subtask), the subtask (`u64`), its id and its `Debug` form (texts,
/// which `weir checkpoint inspect` shows as its position) and its encoding (bytes).
fn encode_splits<S: SourceSplit>(splits: &[(Option<usize>, S)]) -> Result<Vec<u8>, String> {
    let mut out = ByteWriter::default();
    out.u64(splits.len() as u64);
    let mut scratch = Vec::new();
    for (owner, split) in splits {
        out.u8(u8::from(owner.is_some()));
        out.u64(owner.unwrap_or(0) as u64);
        out.text(&split.split_id());
        out.text(&format!("{split:?}"));
        scratch.clear();
        split
            .encode_into(&mut scratch)
            .map_err(|e| format!("cannot encode split {}: {e}", split.split_id()))?;
        out.bytes(&scratch);
    }
    Ok(out.out)
}

/// One split as [`encode_splits`] wrote it, still encoded.
pub(crate) struct RawSplit<'a> {
    pub(crate) owner: Option<usize>,
    pub(crate) id: String,
    /// Its `Debug` form: where reading has got to.
    pub(crate) shown: String,
    pub(crate) bytes: &'a [u8],
}

/// Reads what [`encode_splits`] wrote, without the split type.
pub(crate) fn read_splits<'a>(bytes: &'a [u8], what: &'a str) -> Result<Vec<RawSplit<'a>>, String> {
    let mut reader = ByteReader::new(bytes, what);
    // Flag, subtask, and three lengths.
    let count = reader.count(1 + 4 * 8)?;
    let mut splits = Vec::with_capacity(count);
    for _ in 0..count {
        let has_owner = reader.u8()? != 0;
        let owner = reader.u64()? as usize;
        splits.push(RawSplit {
            owner: has_owner.then_some(owner),
            id: reader.text()?,
            shown: reader.text()?,
            bytes: reader.bytes()?,
        });
    }
    if !reader.is_empty() {
        return Err(format!("{what} has bytes after its last split"));
    }
    Ok(splits)
}

/// Writes `splits` as [`encode_splits`] does, still encoded.
fn write_raw_splits<'a>(splits: impl ExactSizeIterator<Item = RawSplit<'a>>) -> Vec<u8> {
    let mut out = ByteWriter::default();
    out.u64(splits.len() as u64);
    for split in splits {
        out.u8(u8::from(split.owner.is_some()));
        out.u64(split.owner.unwrap_or(0) as u64);
        out.text(&split.id);
        out.text(&split.shown);
        out.bytes(split.bytes);
    }
    out.out
}

/// An enumerator's snapshot ([`encode_splits`]) with only the splits pending for the readers
/// `keep` holds: in a spread run, each executor's copy of the enumerator serves its own.
/// Splits for no reader in particular stay where `keep_unowned` says.
pub(crate) fn keep_splits(
    bytes: &[u8],
    keep: impl Fn(usize) -> bool,
    keep_unowned: bool,
) -> Result<Vec<u8>, String> {
    let kept: Vec<RawSplit<'_>> = read_splits(bytes, "a split enumerator's snapshot")?
        .into_iter()
        .filter(|split| split.owner.map_or(keep_unowned, &keep))
        .collect();
    Ok(write_raw_splits(kept.into_iter()))
}

/// One enumerator snapshot holding the splits of all of `parts` (each an [`encode_splits`]).
pub(crate) fn join_splits(parts: &[Vec<u8>]) -> Result<Vec<u8>, String> {
    let mut all = Vec::new();
    for part in parts {
        all.extend(read_splits(part, "a split enumerator's snapshot")?);
    }
    Ok(write_raw_splits(all.into_iter()))
}

fn decode_splits<S: SourceSplit>(
    bytes: &[u8],
    what: &str,
) -> Result<Vec<(Option<usize>, S)>, String> {
    read_splits(bytes, what)?
        .into_iter()
        .map(|raw| {
            let split = S::decode(raw.bytes).map_err(|e| {
                format!(
                    "{what} holds split {} that does not decode as {}: {e}",
                    raw.id,
                    std::any::type_name::<S>()
                )
            })?;
            Ok((raw.owner, split))
        })
        .collect()
}

impl<T: Record, S: Source<T>> SourceFactory for SourceNode<T, S> {
    fn boundedness(&self) -> Boundedness {
        self.source.boundedness()
    }

    fn create_enumerator(
        &self,
        parallelism: usize,
        restored: Option<&[u8]>,
        pinned: bool,
    ) -> Result<SharedEnumerator, String> {
        let mut enumerator = match restored {
            None => self.source.create_enumerator(parallelism),
            Some(bytes) => {
                let pending = decode_splits(bytes, "the split enumerator's snapshot")?;
                self.source
                    .restore_enumerator(parallelism, repin(pending, parallelism))
            }
        };
        if pinned {
            let pending = self
                .source
                .pin_splits(parallelism, enumerator.snapshot_state());
            enumerator = self.source.restore_enumerator(parallelism, pending);
        }
        Ok(Arc::new(Mutex::new(EnumeratorCell {
            enumerator,
            held: vec![None; parallelism],
        })))
    }

    fn snapshot_enumerator(
        &self,
        enumerator: &SharedEnumerator,
        checkpoint: u64,
    ) -> Result<Vec<u8>, String> {
        let cell = enumerator
            .downcast_ref::<EnumeratorOf<S::Split>>()
            .expect("internal error: enumerator of the wrong split type");
        let mut cell = cell.lock().expect("enumerator lock");
        let bytes = encode_splits(&cell.enumerator.snapshot_state())?;
        for held in &mut cell.held {
            *held = Some(checkpoint);
        }
        Ok(bytes)
    }

    fn create_task(
        &self,
        ctx: &RuntimeContext,
        settings: &TaskSettings,
        metrics: Arc<OperatorMetrics>,
        enumerator: &SharedEnumerator,
        chain: AnyOutput,
        cancel: Arc<AtomicBool>,
        checkpointing: Option<TaskCheckpointing>,
    ) -> TaskResult<Box<dyn Subtask>> {
        let enumerator = Arc::clone(enumerator)
            .downcast::<EnumeratorOf<S::Split>>()
            .unwrap_or_else(|_| panic!("internal error: enumerator of the wrong split type"));
        let mut reader = self.source.create_reader(ctx);
        let mut watermarks =
            SplitWatermarkTracker::new(self.watermarks.clone(), settings.auto_watermark_interval);
        let restored = ctx.restored_share(PART_SPLITS, |bytes| {
            decode_splits::<S::Split>(bytes, "the reader's split snapshot")
        });
        if let Some(splits) = restored {
            let splits = splits.map_err(|e| TaskError::internal(e).in_operator(&metrics.name))?;
            for (_, split) in splits {
                metrics
                    .task
                    .split_added(watermarks.on_split_added(), split.split_id());
                reader.add_split(split);
            }
        }
        Ok(Box::new(SourceTask {
            reader,
            enumerator,
            subtask: ctx.subtask,
            chain: downcast_output::<T>(chain),
            settings: settings.clone(),
            metrics,
            cancel,
            watermarks,
            mailbox: checkpointing.as_ref().and_then(|c| c.job.mailbox(c.task)),
            checkpointing,
            operator_id: Arc::clone(&ctx.state.operator_id),
            operator_state: ctx.operator_state,
            stopping: None,
            final_checkpoint: None,
            finished: false,
            input_ended: false,
            publish_splits_at: Instant::now(),
            next_marker: settings
                .latency_interval
                .map(|interval| Instant::now() + interval),
        }))
    }
}

/// Pending splits kept for a subtask the job no longer has (it resumes at a lower
/// parallelism) go to subtask `owner % parallelism`, as a rescaled reader's splits are shared
/// out; a split kept for nobody in particular stays so.
fn repin<S>(pending: Vec<(Option<usize>, S)>, parallelism: usize) -> Vec<(Option<usize>, S)> {
    pending
        .into_iter()
        .map(|(owner, split)| (owner.map(|o| o % parallelism.max(1)), split))
        .collect()
}

/// The encoded splits of a reader, for its snapshot.
pub(crate) fn snapshot_reader_splits<S: SourceSplit>(splits: Vec<S>) -> Result<Vec<u8>, String> {
    let owned: Vec<(Option<usize>, S)> = splits.into_iter().map(|s| (None, s)).collect();
    encode_splits(&owned)
}

/// Exchange writers for unkeyed edges (forward, rebalance, broadcast).
pub(crate) struct PlainWriter<T>(PhantomData<fn(T)>);

impl<T> PlainWriter<T> {
    pub(crate) fn new() -> Self {
        PlainWriter(PhantomData)
    }
}

impl<T: Record> WriterFactory for PlainWriter<T> {
    fn create(&self, parts: WriterParts<'_>) -> AnyOutput {
        let writer: Box<dyn Output<T>> = match parts.kind {
            PartitionKind::Forward => Box::new(ExchangeWriter::new(parts, ForwardPartitioner)),
            PartitionKind::Broadcast => Box::new(ExchangeWriter::new(parts, BroadcastPartitioner)),
            PartitionKind::Rebalance => {
                // Start each sender at a different receiver so that small inputs spread out.
                let next = parts.metrics.subtask % parts.senders.len().max(1);
                Box::new(ExchangeWriter::new(parts, RebalancePartitioner { next }))
            }
            PartitionKind::Hash => unreachable!("keyed edges get their writer from KeyedWriter"),
        };
        erase_output::<T>(writer)
    }
}

/// Exchange writers for `key_by` edges.
pub(crate) struct KeyedWriter<T, K, KS> {
    key_selector: KS,
    _types: PhantomData<fn(T) -> K>,
}

impl<T, K, KS> KeyedWriter<T, K, KS> {
    pub(crate) fn new(key_selector: KS) -> Self {
        KeyedWriter {
            key_selector,
            _types: PhantomData,
        }
    }
}

impl<T, K, KS> WriterFactory for KeyedWriter<T, K, KS>
where
    T: Record,
    K: Key,
    KS: Fn(&T) -> K + Clone + Send + Sync + 'static,
{
    fn create(&self, parts: WriterParts<'_>) -> AnyOutput {
        if parts.kind == PartitionKind::Forward {
            // One subtask on each side (see `JobGraph`): every key group is downstream.
            return erase_output::<T>(Box::new(ExchangeWriter::new(parts, ForwardPartitioner)));
        }
        debug_assert_eq!(parts.kind, PartitionKind::Hash);
        let partitioner = KeyGroupPartitioner {
            key_selector: self.key_selector.clone(),
            max_parallelism: parts.settings.max_parallelism as u32,
            consumer: format!("key selector of '{}'", parts.consumer),
            _key: PhantomData,
        };
        erase_output::<T>(Box::new(ExchangeWriter::new(parts, partitioner)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_kept_for_a_subtask_that_is_gone_go_to_one_that_remains() {
        let pending = vec![(Some(0), 'a'), (Some(1), 'b'), (None, 'c'), (Some(3), 'd')];
        assert_eq!(
            repin(pending.clone(), 4),
            pending,
            "unchanged when every owner remains"
        );
        assert_eq!(
            repin(pending, 2),
            vec![(Some(0), 'a'), (Some(1), 'b'), (None, 'c'), (Some(1), 'd')]
        );
    }
}
