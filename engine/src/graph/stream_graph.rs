//! The StreamGraph: what the API calls built, with type-erased factories that create each
//! node's runtime objects on the shard that runs them.

use std::any::Any;
use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use std::rc::Rc;

use weir_memory::SegmentPool;

use crate::checkpoint::driver::TaskCheckpointing;
use crate::connector::Boundedness;
use crate::error::TaskResult;
use crate::metrics::{OperatorMetrics, TaskMetrics};
use crate::operator::{RuntimeContext, SideOutputs};
use crate::runtime::exchange::channel::{SegmentReceiver, SegmentSender};
use crate::runtime::exchange::inflight::Announcements;
use crate::runtime::exchange::PartitionKind;
use crate::runtime::task::{Subtask, TaskSettings};

/// Builds the task of a chain that starts at an exchange: its input channels, its chain, the
/// job's task settings, its side of checkpointing and the job's stop flag.
pub(crate) type NetworkTaskFn = fn(
    Vec<ReceiverEnd>,
    AnyOutput,
    &TaskSettings,
    Option<TaskCheckpointing>,
    Arc<AtomicBool>,
    Arc<TaskMetrics>,
) -> Box<dyn Subtask>;

/// A `Box<dyn Output<T>>` for the `T` of the edge it stands on, boxed once more so that graph
/// code can move it without knowing `T`. Downcast once, when a task is built.
pub(crate) type AnyOutput = Box<dyn Any>;

/// Creates one subtask's instance of an operator, wrapped around its downstream output.
pub(crate) trait OperatorFactory: Send + Sync {
    fn create(
        &self,
        ctx: &RuntimeContext,
        settings: &TaskSettings,
        metrics: Arc<OperatorMetrics>,
        next: AnyOutput,
        side: SideOutputs,
    ) -> AnyOutput;
    /// What the operators this makes hold that checkpoints cannot write yet, if anything.
    fn unsupported_state(&self) -> Option<&'static str>;
}

/// Creates one subtask's sink writer, as an output.
pub(crate) trait SinkFactory: Send + Sync {
    fn create(&self, ctx: &RuntimeContext, metrics: Arc<OperatorMetrics>) -> TaskResult<AnyOutput>;
}

/// A split enumerator shared by a source's subtasks (`Mutex<EnumeratorCell<S>>`).
pub(crate) type SharedEnumerator = Arc<dyn Any + Send + Sync>;

/// Creates a source's enumerator (once per run) and its subtasks.
pub(crate) trait SourceFactory: Send + Sync {
    fn boundedness(&self) -> Boundedness;
    /// The enumerator of a run with `parallelism` readers; `restored` is its snapshot in the
    /// checkpoint the run resumes from. With `pinned`, every split any reader could take
    /// goes to one reader, as if it had been pinned to it (split `i` of those to reader
    /// `i % parallelism`): each executor of a spread run makes the same enumerator and
    /// serves only its own readers from it.
    fn create_enumerator(
        &self,
        parallelism: usize,
        restored: Option<&[u8]>,
        pinned: bool,
    ) -> Result<SharedEnumerator, String>;
    /// The enumerator's snapshot for `checkpoint`; it hands no reader another split until
    /// that reader has passed the checkpoint's barrier.
    fn snapshot_enumerator(
        &self,
        enumerator: &SharedEnumerator,
        checkpoint: u64,
    ) -> Result<Vec<u8>, String>;
    #[allow(clippy::too_many_arguments)]
    fn create_task(
        &self,
        ctx: &RuntimeContext,
        settings: &TaskSettings,
        metrics: Arc<OperatorMetrics>,
        enumerator: &SharedEnumerator,
        chain: AnyOutput,
        cancel: Arc<AtomicBool>,
        checkpointing: Option<TaskCheckpointing>,
    ) -> TaskResult<Box<dyn Subtask>>;
}

/// The sending end of one channel: one carrying segments (to another shard or process, see
/// `exchange/channel.rs`), or a queue to a subtask on this shard (a `LocalChannel<T>` for the
/// edge's `T`, checked when the writer is built).
pub(crate) enum SenderEnd {
    Segments(Box<dyn SegmentSender>),
    Local(Rc<dyn Any>),
}

/// The receiving end of one channel, as [`SenderEnd`].
pub(crate) enum ReceiverEnd {
    Segments(SegmentReceiver),
    Local(Rc<dyn Any>),
}

/// What an exchange writer of one subtask on one edge is built from.
pub(crate) struct WriterParts<'a> {
    pub(crate) kind: PartitionKind,
    /// One sender per receiving channel, in channel order.
    pub(crate) senders: Vec<SenderEnd>,
    /// With unaligned checkpoints: where barriers are announced, and each channel's receiving
    /// task.
    pub(crate) announce: Option<(Announcements, Vec<usize>)>,
    /// The sending slot's segment pool.
    pub(crate) pool: SegmentPool,
    pub(crate) settings: &'a TaskSettings,
    /// The producing operator's metrics (backpressure waits are counted there).
    pub(crate) metrics: Arc<OperatorMetrics>,
    /// Set when any subtask of the job fails; ends a wait for credit that can never come.
    pub(crate) cancel: Arc<AtomicBool>,
    /// The consuming operator: a key selector runs for it, and its panics are reported so.
    pub(crate) consumer: &'a str,
}

/// Creates the exchange writer of one subtask on one edge.
pub(crate) trait WriterFactory: Send + Sync {
    fn create(&self, parts: WriterParts<'_>) -> AnyOutput;
}

/// Operations that depend only on a record type: fanning a node's output out to several
/// consumers, and reading a task's network input.
#[derive(Clone, Copy)]
pub(crate) struct TypeOps {
    pub(crate) fan_out: fn(Vec<AnyOutput>) -> AnyOutput,
    /// The task reading a subtask's input channels (in channel order) into its chain.
    pub(crate) network_task: NetworkTaskFn,
    /// A channel between two subtasks on one shard carrying this type, holding at most the
    /// given number of batches and events.
    pub(crate) local_channel: fn(usize) -> Rc<dyn Any>,
    /// Adds an output of this type as the side output `tag` of an operator.
    pub(crate) side_output: fn(Arc<str>, AnyOutput, &mut SideOutputs),
    /// An output that drops records (a main output nobody reads when a side output is read).
    pub(crate) discard: fn() -> AnyOutput,
}

/// The partitioning an edge asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EdgeRequest {
    /// Forward if parallelism matches, else rebalance (Flink's default).
    Default,
    Rebalance,
    Broadcast,
    Hash,
}

pub(crate) struct StreamEdge {
    pub(crate) source: usize,
    pub(crate) request: EdgeRequest,
    /// The side output of `source` this edge carries (`None`: its main output).
    pub(crate) side: Option<Arc<str>>,
    pub(crate) writer: Arc<dyn WriterFactory>,
}

pub(crate) enum NodeKind {
    Source(Arc<dyn SourceFactory>),
    Operator(Arc<dyn OperatorFactory>),
    Sink(Arc<dyn SinkFactory>),
}

pub(crate) struct StreamNode {
    pub(crate) id: usize,
    pub(crate) name: String,
    pub(crate) uid: Option<String>,
    pub(crate) parallelism: Option<usize>,
    pub(crate) chaining_allowed: bool,
    pub(crate) kind: NodeKind,
    pub(crate) inputs: Vec<StreamEdge>,
    /// Operations on the node's input record type (for a task whose head it is).
    pub(crate) input_ops: Option<TypeOps>,
    /// Operations on the node's output record type.
    pub(crate) output_ops: Option<TypeOps>,
}

impl StreamNode {
    pub(crate) fn kind_name(&self) -> &'static str {
        match self.kind {
            NodeKind::Source(_) => "source",
            NodeKind::Operator(_) => "operator",
            NodeKind::Sink(_) => "sink",
        }
    }
}

/// A job's nodes as the API built them.
pub struct StreamGraph {
    pub(crate) job_name: String,
    pub(crate) nodes: Vec<StreamNode>,
}

/// What the graph says about one node, for display and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamNodeInfo {
    /// Node id (creation order).
    pub id: usize,
    /// Display name.
    pub name: String,
    /// `source`, `operator` or `sink`.
    pub kind: &'static str,
    /// Parallelism set on the node, if any.
    pub parallelism: Option<usize>,
}

impl StreamGraph {
    /// The nodes, in creation (= topological) order.
    pub fn node_infos(&self) -> Vec<StreamNodeInfo> {
        self.nodes
            .iter()
            .map(|n| StreamNodeInfo {
                id: n.id,
                name: n.name.clone(),
                kind: n.kind_name(),
                parallelism: n.parallelism,
            })
            .collect()
    }
}

impl fmt::Debug for StreamGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamGraph")
            .field("job_name", &self.job_name)
            .field("nodes", &self.node_infos())
            .finish()
    }
}

impl StreamNode {
    /// A copy sharing the same factories (for translating a graph without consuming it).
    pub(crate) fn share(&self) -> StreamNode {
        StreamNode {
            id: self.id,
            name: self.name.clone(),
            uid: self.uid.clone(),
            parallelism: self.parallelism,
            chaining_allowed: self.chaining_allowed,
            kind: match &self.kind {
                NodeKind::Source(f) => NodeKind::Source(Arc::clone(f)),
                NodeKind::Operator(f) => NodeKind::Operator(Arc::clone(f)),
                NodeKind::Sink(f) => NodeKind::Sink(Arc::clone(f)),
            },
            inputs: self
                .inputs
                .iter()
                .map(|e| StreamEdge {
                    source: e.source,
                    request: e.request,
                    side: e.side.clone(),
                    writer: Arc::clone(&e.writer),
                })
                .collect(),
            input_ops: self.input_ops,
            output_ops: self.output_ops,
        }
    }
}
