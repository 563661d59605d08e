//! Deploying an ExecutionGraph onto shard executors: network pools and channels are created up
//! front, then each shard connects, builds and runs its subtasks; the first real failure (not
//! one caused by another failure) becomes the job's error.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{join_all, LocalBoxFuture};
use futures::FutureExt;
use glommio::channels::shared_channel::{self, SharedReceiver, SharedSender};
use weir_memory::{PoolStats, Segment, SegmentPool};

use super::exchange::channel::{net, ring};
use super::exchange::inflight::{decode_in_flight, layout_of_data, Announcements, PART_IN_FLIGHT};
use super::factories::keep_splits;
use super::progress::ProgressReporter;
use super::shard::{run_on_shards, ShardLoad, ShardQueues};
use super::spread::{ShardNet, Spread};
use super::task::{Subtask, TaskSettings};
use crate::checkpoint::driver::{
    open_checkpoints, open_savepoint, CheckpointDriver, CheckpointStart, DriverEnd, DriverPlan,
    JobCheckpointing, OperatorEntry, RestoreRules, SpreadPlan, TaskCheckpointing,
};
use crate::checkpoint::native::PART_ROCKSDB;
use crate::checkpoint::restart::{RestartDecision, RestartStrategy, RestartTracker};
use crate::checkpoint::task_state::{RestoredJob, TaskStateId, PART_OPERATOR_STATE};
use crate::checkpoint::{CheckpointStats, SavepointHandle};
use crate::config::CheckpointConfig;
use crate::config::Configuration;
use crate::connector::SinkSettings;
use crate::error::{panic_message, JobError, Role, TaskError, TaskResult};
use crate::graph::{
    within_slot, AnyOutput, ExecutionGraph, JobEdge, NodeKind, ReceiverEnd, SenderEnd,
    SharedEnumerator, TypeOps, WriterParts,
};
use crate::metrics::{
    ChannelSource, MetricsRegistry, OperatorCounts, OperatorMetrics, TaskMetrics,
};
use crate::monitor::EdgeFigures;
use crate::operator::{scope, RuntimeContext, SideOutputs};
use crate::state::{self, BackendType, JobRocksDb, OperatorStateId, StateEnv};

/// What a finished job reports.
#[derive(Debug)]
pub struct JobResult {
    /// The job's name.
    pub job_name: String,
    /// Wall time from deployment to the last subtask's end.
    pub duration: Duration,
    /// Record counts per operator, summed over subtasks.
    pub operators: Vec<OperatorCounts>,
    /// Network segment pool usage per slot.
    pub pools: Vec<PoolStats>,
    /// What the run's checkpoints did (`None`: checkpointing was off). After restarts, this
    /// and the other figures are those of the last run of the tasks (Flink's metrics, too,
    /// start again with the restarted tasks).
    pub checkpoints: Option<CheckpointStats>,
    /// The restarts after task failures, in order.
    pub restarts: Vec<Restart>,
    /// The savepoint the job was stopped with ([`SavepointHandle::stop_with_savepoint`]), if
    /// it was.
    pub savepoint: Option<PathBuf>,
}

/// A restart of the job's tasks after a failure.
#[derive(Clone, Debug)]
pub struct Restart {
    /// The failure, as the job would have ended with it.
    pub cause: String,
    /// How long the restart waited (the restart strategy's delay).
    pub delay: Duration,
}

impl JobResult {
    fn counts(&self, operator: &str) -> Option<&OperatorCounts> {
        self.operators.iter().find(|c| c.name == operator)
    }

    /// Records the named operator emitted (0 if there is no such operator).
    pub fn records_out(&self, operator: &str) -> u64 {
        self.counts(operator).map_or(0, |c| c.records_out)
    }

    /// Records the named operator received (0 if there is no such operator).
    pub fn records_in(&self, operator: &str) -> u64 {
        self.counts(operator).map_or(0, |c| c.records_in)
    }

    /// Records the named (window) operator dropped as too late.
    pub fn late_records_dropped(&self, operator: &str) -> u64 {
        self.counts(operator).map_or(0, |c| c.late_records_dropped)
    }

    /// Times the named operator waited for credit downstream.
    pub fn backpressure_waits(&self, operator: &str) -> u64 {
        self.counts(operator).map_or(0, |c| c.backpressure_waits)
    }
}

/// Options of one run.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Print a progress line to stderr this often.
    pub progress: Option<Duration>,
    /// Cancels the run from another thread.
    pub cancel: CancelHandle,
    /// With checkpointing configured: start from the latest completed checkpoint in the job's
    /// checkpoint directory (`weir run … --resume`), or, when it has none yet, from
    /// `from_savepoint` if that is set (how a control plane restarts a job it started from a
    /// savepoint), else from scratch.
    pub resume: bool,
    /// Start from this savepoint (or retained checkpoint) directory (`weir run …
    /// --from-savepoint PATH`); a restart after a failure takes the run's own latest
    /// checkpoint, or this again if none completed yet.
    pub from_savepoint: Option<PathBuf>,
    /// Leave out (with a warning) state of operators the job no longer has, instead of
    /// refusing to restore it (`--allow-non-restored-state`).
    pub allow_non_restored_state: bool,
    /// The job's live figures, read from any thread while it runs.
    pub monitor: crate::monitor::JobMonitor,
    /// Asks the running job for savepoints, and to stop with one.
    pub savepoints: SavepointHandle,
    /// Where the job's slots are when the run spans several executors (`None`: all here).
    /// Such a run is not restarted by its executor: a failure ends it, and whoever placed it
    /// (the control plane) starts every executor of the job again.
    pub spread: Option<Spread>,
}

/// Cancels a running job: its sources stop, every subtask winds down, and the run ends with
/// [`JobError::Cancelled`]. Cloning shares the handle.
#[derive(Clone, Debug, Default)]
pub struct CancelHandle {
    /// The job's stop flag: set by a cancel request or by any failing subtask.
    stop: Arc<AtomicBool>,
    /// Set only by [`CancelHandle::cancel`]: tells a requested stop from a failure.
    requested: Arc<AtomicBool>,
}

impl CancelHandle {
    /// Asks the job to stop.
    pub fn cancel(&self) {
        self.requested.store(true, Ordering::Relaxed);
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Whether [`CancelHandle::cancel`] was called.
    pub fn is_requested(&self) -> bool {
        self.requested.load(Ordering::Relaxed)
    }
}

/// One end of a channel, before connecting: a ring between shards, a channel between two
/// subtasks of one shard, which that shard creates (`LocalChannels`), or a channel to or from
/// a slot in another executor, which the shard's endpoint opens (`ShardNet`).
enum EndPlan<E> {
    Remote(E),
    Local(LocalChannelPlan),
    Net {
        key: Vec<u8>,
        /// The slot at the other end.
        slot: usize,
    },
}

/// Names a channel: (edge, sender subtask, receiver subtask).
type ChannelId = (usize, usize, usize);

/// A channel between two subtasks on one slot: which one, and how to make it.
#[derive(Clone, Copy)]
struct LocalChannelPlan {
    id: ChannelId,
    /// Creates the channel for the edge's record type.
    make: fn(usize) -> Rc<dyn Any>,
}

/// The local channels of one shard, each made once, by whichever end is connected first.
struct LocalChannels {
    credits: usize,
    made: RefCell<HashMap<ChannelId, Rc<dyn Any>>>,
}

impl LocalChannels {
    fn get(&self, plan: LocalChannelPlan) -> Rc<dyn Any> {
        Rc::clone(
            self.made
                .borrow_mut()
                .entry(plan.id)
                .or_insert_with(|| (plan.make)(self.credits)),
        )
    }
}

/// Channel endpoints of one subtask, before connecting.
struct SubtaskPlan {
    /// The subtask's index in the execution graph (its task number for checkpoints).
    index: usize,
    vertex: usize,
    subtask: usize,
    slot: usize,
    /// Per outgoing exchange edge: its senders, in channel order.
    senders: Vec<(usize, Vec<EndPlan<SharedSender<Segment>>>)>,
    receivers: Vec<EndPlan<SharedReceiver<Segment>>>,
    /// Who sends on each of `receivers`.
    channel_sources: Vec<ChannelSource>,
}

/// What every shard shares about the job.
struct JobShared {
    exec: Arc<ExecutionGraph>,
    settings: TaskSettings,
    enumerators: Vec<Option<SharedEnumerator>>,
    metrics: MetricsRegistry,
    cancel: Arc<AtomicBool>,
    state_backend: BackendType,
    /// The slots' RocksDB instances, when state lives there.
    rocksdb: Option<JobRocksDb>,
    /// What tasks share with the checkpoint coordinator, when the job is checkpointed.
    checkpointing: Option<Arc<JobCheckpointing>>,
    /// The checkpoint the job resumes from.
    restored: Option<Arc<RestoredJob>>,
    /// The `sink.*` settings.
    sinks: SinkSettings,
    /// Where the attempt's figures go: each task says when it is ready.
    monitor: crate::monitor::JobMonitor,
    /// How many subtasks run in this executor.
    local_subtasks: usize,
    /// Where the slots are, when the run spans several executors.
    spread: Option<Spread>,
}

impl JobShared {
    /// Where writers announce unaligned checkpoints' barriers to the tasks they feed, when
    /// the job takes unaligned checkpoints.
    fn announcements(&self) -> Option<&Announcements> {
        let checkpointing = self.checkpointing.as_ref()?;
        checkpointing
            .unaligned
            .as_ref()
            .map(|(_, announcements)| announcements)
    }
}

/// A subtask's failure, attributed.
#[derive(Debug)]
struct SubtaskFailure {
    vertex: usize,
    subtask: usize,
    error: TaskError,
    /// The parallelism to report, where it is not the vertex's (the operator named in `error`
    /// runs elsewhere in the job).
    parallelism: Option<usize>,
}

/// The failure a shard reports when it outgrew its heap share: blamed on the operator holding
/// the largest state when that state is most of the heap, else on the shard's first subtask.
fn heap_failure_of(
    slot: usize,
    first_vertex: usize,
    exceeded: state::HeapExceeded,
) -> SubtaskFailure {
    let error = TaskError::user(exceeded.error.to_string());
    match (&exceeded.error.largest_state, exceeded.holder) {
        (Some(state), Some((subtask, parallelism))) if exceeded.error.blames_state() => {
            SubtaskFailure {
                vertex: first_vertex,
                subtask,
                error: error.in_operator(&state.operator),
                parallelism: Some(parallelism),
            }
        }
        _ => SubtaskFailure {
            vertex: first_vertex,
            subtask: slot,
            error,
            parallelism: None,
        },
    }
}

/// Builds one subtask's chain on its shard.
struct ChainBuilder<'a> {
    shared: &'a JobShared,
    /// The task's state for checkpoints (shared by its chain's operators).
    task: TaskStateId,
    subtask: usize,
    slot: usize,
    pool: &'a SegmentPool,
    senders: HashMap<usize, Vec<SenderEnd>>,
    /// The task's own figures, shared by its chain's operators.
    task_metrics: Arc<TaskMetrics>,
    metrics: HashMap<usize, Arc<OperatorMetrics>>,
    /// Each node's operator state in this subtask.
    operator_states: HashMap<usize, OperatorStateId>,
}

impl ChainBuilder<'_> {
    fn context(&mut self, node: usize) -> TaskResult<RuntimeContext> {
        let job = &self.shared.exec.job;
        let graph_node = &job.graph.nodes[node];
        let operator_id = job.operator_ids[node].to_string();
        let operator_state = match self.operator_states.get(&node) {
            Some(&id) => id,
            None => {
                let id = OperatorStateId::fresh();
                let parallelism = job.node_parallelism[node];
                let restored = self.shared.restored.as_ref().map(|restored| {
                    restored.parts_for(&operator_id, PART_OPERATOR_STATE, self.subtask, parallelism)
                });
                if let Some(restored) = restored.filter(|r| !r.parts.is_empty()) {
                    id.restore(&restored, self.subtask, parallelism)
                        .map_err(|error| {
                            TaskError::user(format!("cannot restore its operator state: {error}"))
                                .in_operator(&graph_node.name)
                        })?;
                }
                self.operator_states.insert(node, id);
                id
            }
        };
        Ok(RuntimeContext {
            job_name: job.job_name().into(),
            operator_name: graph_node.name.as_str().into(),
            subtask: self.subtask,
            parallelism: job.node_parallelism[node],
            max_parallelism: job.max_parallelism,
            sinks: self.shared.sinks,
            state: StateEnv {
                backend: self.shared.state_backend,
                rocksdb: self
                    .shared
                    .rocksdb
                    .as_ref()
                    .map(|dbs| Arc::clone(&dbs.slots[self.slot])),
                incremental: self
                    .shared
                    .checkpointing
                    .as_ref()
                    .is_none_or(|checkpointing| checkpointing.incremental),
                checkpointed: self.shared.checkpointing.is_some(),
                operator_id: operator_id.into(),
            },
            operator_state,
            task: self.task,
        })
    }

    /// The task's side of checkpointing, when the job is checkpointed.
    fn checkpointing(&self, index: usize, head: usize) -> TaskResult<Option<TaskCheckpointing>> {
        let Some(job) = self.shared.checkpointing.as_ref().map(Arc::clone) else {
            return Ok(None);
        };
        let operator = self.shared.exec.job.operator_ids[head].to_string();
        // In-flight data restores only into the channels it was recorded on: anything else was
        // refused before the job started (`refuse_rescaled_in_flight`).
        let own = self.shared.restored.as_ref().and_then(|restored| {
            restored
                .parts_of_all(&operator, PART_IN_FLIGHT)
                .into_iter()
                .find(|(old, _)| *old == self.subtask)
        });
        let in_flight = match own {
            Some((_, part)) => {
                let what = format!("the in-flight data of subtask {}", self.subtask);
                let data = decode_in_flight(part, &what).map_err(|error| {
                    TaskError::user(format!("cannot restore its input: {error}"))
                        .in_operator(&self.shared.exec.job.graph.nodes[head].name)
                })?;
                (!data.chunks.is_empty()).then_some(data)
            }
            None => None,
        };
        Ok(Some(TaskCheckpointing {
            job,
            task: index,
            file_name: format!("task-{operator}-{}", self.subtask),
            state: self.task.get(),
            operator: operator.into(),
            in_flight,
            input_layout: input_layout(&self.shared.exec.job, head).into(),
        }))
    }

    fn metrics(&mut self, node: usize) -> Arc<OperatorMetrics> {
        let name = &self.shared.exec.job.graph.nodes[node].name;
        let registry = &self.shared.metrics;
        let task = &self.task_metrics;
        Arc::clone(
            self.metrics
                .entry(node)
                .or_insert_with(|| registry.register_in(task, node, name)),
        )
    }

    /// A `Box<dyn Output<In>>` feeding `node`.
    fn input_of(&mut self, node: usize) -> TaskResult<AnyOutput> {
        let graph = Arc::clone(&self.shared.exec.job.graph);
        let ctx = self.context(node)?;
        let metrics = self.metrics(node);
        match &graph.nodes[node].kind {
            NodeKind::Sink(factory) => factory.create(&ctx, metrics),
            NodeKind::Operator(factory) => {
                let (next, side) = self.outputs_of(node)?;
                Ok(factory.create(&ctx, &self.shared.settings, metrics, next, side))
            }
            NodeKind::Source(_) => Err(TaskError::internal("a source cannot consume a stream")),
        }
    }

    /// The output feeding one consumer of `node` over `edge`: the consumer's own chain if the
    /// edge is chained, else an exchange writer.
    fn edge_output(&mut self, node: usize, index: usize, edge: &JobEdge) -> TaskResult<AnyOutput> {
        if edge.chained {
            return self.input_of(edge.target_node);
        }
        let graph = Arc::clone(&self.shared.exec.job.graph);
        let senders = self
            .senders
            .remove(&index)
            .expect("senders of every outgoing edge");
        let consumer = &graph.nodes[edge.target_node];
        // Unaligned checkpoints: the receiving task of each channel, to announce barriers to.
        let announce = self.shared.announcements().map(|announcements| {
            let exec = &self.shared.exec;
            let to = exec.job.node_vertex[edge.target_node];
            let tasks = exec
                .channels(index)
                .into_iter()
                .filter(|(sender, _)| *sender == self.subtask)
                .map(|(_, receiver)| {
                    exec.subtasks
                        .iter()
                        .position(|s| s.vertex == to && s.subtask == receiver)
                        .expect("every receiving subtask is placed")
                })
                .collect();
            (announcements.clone(), tasks)
        });
        let parts = WriterParts {
            kind: edge.kind,
            senders,
            announce,
            pool: self.pool.clone(),
            settings: &self.shared.settings,
            metrics: self.metrics(node),
            cancel: Arc::clone(&self.shared.cancel),
            consumer: &consumer.name,
        };
        Ok(consumer.inputs[edge.input_index].writer.create(parts))
    }

    /// What takes `node`'s output: its main output (fanned out to every consumer) and its
    /// side outputs (per tag, fanned out to that tag's consumers).
    fn outputs_of(&mut self, node: usize) -> TaskResult<(AnyOutput, SideOutputs)> {
        let job = &self.shared.exec.job;
        let graph = Arc::clone(&job.graph);
        let edges: Vec<(usize, JobEdge)> =
            job.out_edges(node).map(|(i, e)| (i, e.clone())).collect();
        let mut main = Vec::with_capacity(edges.len());
        let mut sides: Vec<(Arc<str>, TypeOps, Vec<AnyOutput>)> = Vec::new();
        for (index, edge) in &edges {
            let output = self.edge_output(node, *index, edge)?;
            let consumer = &graph.nodes[edge.target_node];
            match &consumer.inputs[edge.input_index].side {
                None => main.push(output),
                Some(tag) => {
                    let ops = consumer
                        .input_ops
                        .expect("a consuming node has an input type");
                    match sides.iter_mut().find(|(t, _, _)| t == tag) {
                        Some((_, _, outputs)) => outputs.push(output),
                        None => sides.push((Arc::clone(tag), ops, vec![output])),
                    }
                }
            }
        }
        let ops = graph.nodes[node]
            .output_ops
            .expect("a node with consumers has an output type");
        let mut side_outputs = SideOutputs::default();
        for (tag, side_ops, mut outputs) in sides {
            let output = match outputs.len() {
                1 => outputs.pop().expect("one"),
                _ => (side_ops.fan_out)(outputs),
            };
            (side_ops.side_output)(tag, output, &mut side_outputs);
        }
        let main = match main.len() {
            0 if !side_outputs.is_empty() => (ops.discard)(),
            0 => return Err(TaskError::internal(format!("node {node} has no consumer"))),
            1 => main.pop().expect("one"),
            _ => (ops.fan_out)(main),
        };
        Ok((main, side_outputs))
    }

    /// A `Box<dyn Output<Out>>` taking what a source emits.
    fn output_of_source(&mut self, node: usize) -> TaskResult<AnyOutput> {
        let (main, side) = self.outputs_of(node)?;
        if !side.is_empty() {
            return Err(TaskError::internal("a source has no side outputs"));
        }
        Ok(main)
    }

    fn build(
        mut self,
        index: usize,
        vertex: usize,
        receivers: Vec<ReceiverEnd>,
    ) -> TaskResult<Box<dyn Subtask>> {
        let job = &self.shared.exec.job;
        let head = job.vertices[vertex].head;
        let graph = Arc::clone(&job.graph);
        let node = &graph.nodes[head];
        let checkpointing = self.checkpointing(index, head)?;
        match &node.kind {
            NodeKind::Source(factory) => {
                let chain = self.output_of_source(head)?;
                let ctx = self.context(head)?;
                let metrics = self.metrics(head);
                let enumerator = self.shared.enumerators[head]
                    .as_ref()
                    .expect("enumerator of every source");
                factory.create_task(
                    &ctx,
                    &self.shared.settings,
                    metrics,
                    enumerator,
                    chain,
                    Arc::clone(&self.shared.cancel),
                    checkpointing,
                )
            }
            NodeKind::Operator(_) | NodeKind::Sink(_) => {
                let chain = self.input_of(head)?;
                let ops = node.input_ops.expect("a consuming node has an input type");
                Ok((ops.network_task)(
                    receivers,
                    chain,
                    &self.shared.settings,
                    checkpointing,
                    Arc::clone(&self.shared.cancel),
                    Arc::clone(&self.task_metrics),
                ))
            }
        }
    }
}

async fn run_subtask(
    plan: SubtaskPlan,
    shared: Arc<JobShared>,
    pool: SegmentPool,
    locals: Rc<LocalChannels>,
    net: Option<Rc<ShardNet>>,
) -> Result<(), SubtaskFailure> {
    let SubtaskPlan {
        index,
        vertex,
        subtask,
        slot,
        senders,
        receivers,
        channel_sources,
    } = plan;
    // Connect every endpoint at once: a connect waits for its peer, which may be doing the same.
    let locals = &locals;
    // A channel to another executor that cannot be made (or whose shard's endpoint did not
    // start, which the shard's failure names) is made closed: the task is built and fails at
    // the channel like at any other, so that its channels within the shard end as usual.
    let net = net.as_deref();
    let senders = join_all(senders.into_iter().map(|(edge, txs)| async move {
        let ends = join_all(txs.into_iter().map(|tx| async move {
            match tx {
                EndPlan::Remote(tx) => SenderEnd::Segments(Box::new(tx.connect().await)),
                EndPlan::Local(plan) => SenderEnd::Local(locals.get(plan)),
                EndPlan::Net { key, slot } => SenderEnd::Segments(match net {
                    Some(net) => match net.open(&key, slot) {
                        Ok(sender) => Box::new(net::ToPeer::new(sender, net.peer(slot))),
                        Err(cause) => Box::new(net::Unmade(Some(cause))),
                    },
                    None => Box::new(net::Unmade(None)),
                }),
            }
        }));
        (edge, ends.await)
    }));
    // Unaligned checkpoints: what senders in other processes announce goes to this task.
    let announce = shared
        .announcements()
        .map(|announcements| (announcements.clone(), index));
    let receivers = join_all(receivers.into_iter().map(|rx| {
        let announce = announce.clone();
        async move {
            match rx {
                EndPlan::Remote(rx) => ReceiverEnd::Segments(ring::receiver(rx.connect().await)),
                EndPlan::Local(plan) => ReceiverEnd::Local(locals.get(plan)),
                EndPlan::Net { key, slot } => ReceiverEnd::Segments(match net {
                    Some(net) => match net.receive(&key) {
                        Ok(channel) => net::receiver(channel, net.peer(slot), announce),
                        Err(cause) => net::unmade_receiver(Some(cause)),
                    },
                    None => net::unmade_receiver(None),
                }),
            }
        }
    }));
    let (senders, receivers) = futures::join!(senders, receivers);

    let fail = |error: TaskError| {
        shared.cancel.store(true, Ordering::Relaxed);
        SubtaskFailure {
            vertex,
            subtask,
            error,
            parallelism: None,
        }
    };
    let builder = ChainBuilder {
        shared: &shared,
        task: TaskStateId::create(subtask, shared.restored.clone()),
        subtask,
        slot,
        pool: &pool,
        senders: senders.into_iter().collect(),
        task_metrics: Arc::new(TaskMetrics::new(
            shared.exec.job.vertices[vertex].head,
            subtask,
            channel_sources,
        )),
        metrics: HashMap::new(),
        operator_states: HashMap::new(),
    };
    let outcome = AssertUnwindSafe(async {
        let task = builder.build(index, vertex, receivers)?;
        // Built: its operators opened, their state restored.
        shared.monitor.task_ready(shared.local_subtasks);
        task.run().await
    })
    .catch_unwind()
    .await;
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(fail(error)),
        Err(payload) => {
            // A panic inside an operator's scope comes from its user function; anywhere else it
            // is a bug in Weir or a library it uses.
            let message = panic_message(&*payload);
            let error = match scope::take_culprit() {
                Some(operator) => TaskError::user(format!("a user function panicked: {message}"))
                    .in_operator(&operator),
                None => TaskError::internal(format!("the task panicked: {message}")),
            };
            Err(fail(error))
        }
    }
}

/// What one shard runs: its slot's subtasks, and (in a spread run) the slots in other
/// executors its subtasks send to, which it dials before they start.
struct ShardPlan {
    slot: usize,
    subtasks: Vec<SubtaskPlan>,
    dials: Vec<usize>,
}

/// What a shard runs: its subtasks, and a background loop that samples its load and, with
/// `heap_share`, checks its heap use against the slot's share every 100 ms. In a spread run,
/// its endpoint first: bound, and connected to the shards it sends to.
fn run_shard(
    plan: ShardPlan,
    heap_share: Option<u64>,
    credits: usize,
    shared: Arc<JobShared>,
    pool: SegmentPool,
    load: Arc<ShardLoad>,
) -> impl FnOnce(ShardQueues) -> LocalBoxFuture<'static, Vec<SubtaskFailure>> + Send {
    let ShardPlan {
        slot,
        subtasks: plans,
        dials,
    } = plan;
    move |queues: ShardQueues| {
        Box::pin(async move {
            weir_memory::register_current_thread(&format!("shard-{slot}"));
            load.started_here();
            state::clear_shard_states();
            let sampler_load = Arc::clone(&load);
            let heap_failure = Rc::new(Cell::new(None));
            let sampler_failure = Rc::clone(&heap_failure);
            let sampler_cancel = Arc::clone(&shared.cancel);
            let first_vertex = plans.first().map_or(0, |plan| plan.vertex);
            let sampler = glommio::spawn_local_into(
                async move {
                    loop {
                        queues.sample(&sampler_load);
                        let checked = heap_share.map(|share| state::check_shard_heap(slot, share));
                        if let Some(Err(exceeded)) = checked {
                            sampler_cancel.store(true, Ordering::Relaxed);
                            sampler_failure.set(Some(heap_failure_of(
                                slot,
                                first_vertex,
                                exceeded,
                            )));
                            break;
                        }
                        glommio::timer::sleep(Duration::from_millis(100)).await;
                    }
                },
                queues.background,
            )
            .expect("spawn sampler");
            let locals = Rc::new(LocalChannels {
                credits,
                made: RefCell::default(),
            });
            // An endpoint that does not start fails the shard; its subtasks still run as far
            // as connecting their channels (and then fail as a consequence), so that subtasks
            // of other shards waiting for their rings to them are not left waiting.
            let mut failures = Vec::new();
            let net = match &shared.spread {
                None => None,
                Some(spread) => {
                    match ShardNet::start(spread, slot, &dials, credits, pool.segment_size()).await
                    {
                        Ok(net) => Some(Rc::new(net)),
                        Err(error) => {
                            shared.cancel.store(true, Ordering::Relaxed);
                            failures.push(SubtaskFailure {
                                vertex: first_vertex,
                                subtask: slot,
                                error,
                                parallelism: None,
                            });
                            None
                        }
                    }
                }
            };
            let tasks: Vec<_> = plans
                .into_iter()
                .map(|plan| {
                    let task = run_subtask(
                        plan,
                        Arc::clone(&shared),
                        pool.clone(),
                        Rc::clone(&locals),
                        net.clone(),
                    );
                    glommio::spawn_local_into(task, queues.processing).expect("spawn subtask")
                })
                .collect();
            failures.extend(join_all(tasks).await.into_iter().filter_map(Result::err));
            // Every subtask ended well: let peers receive the ends of its channels.
            if let (Some(net), true) = (&net, failures.is_empty()) {
                net.finish().await;
            }
            crate::checkpoint::driver::finish_shard_writes().await;
            // Dropping a glommio task cancels it: the sampler stops without finishing its sleep.
            drop(sampler);
            queues.sample(&load);
            state::clear_shard_states();
            failures.extend(heap_failure.take());
            failures
        })
    }
}

/// Runs a job to completion on `exec.slots` shards. When a task fails, the job's restart
/// strategy (`restart-strategy.*`) decides whether all its tasks start again — from the latest
/// completed checkpoint when the job is checkpointed, from the beginning otherwise — and
/// after how long; each restart is logged with its cause and listed in
/// [`JobResult::restarts`].
pub fn run_job(
    exec: ExecutionGraph,
    config: &Configuration,
    options: RunOptions,
) -> Result<JobResult, JobError> {
    let job = exec.job.job_name().to_string();
    options.savepoints.open();
    let result = run_attempts(exec, config, &options);
    // Savepoints asked for from now on (or never taken) fail, naming why.
    options.savepoints.close(&match &result {
        Ok(_) => format!("job '{job}' has ended"),
        Err(error) => format!("job '{job}' has ended: {error}"),
    });
    result
}

/// Runs the job's attempts: the first, then one per restart (see [`run_job`]).
fn run_attempts(
    exec: ExecutionGraph,
    config: &Configuration,
    options: &RunOptions,
) -> Result<JobResult, JobError> {
    let exec = Arc::new(exec);
    let checkpointed = config.checkpointing()?.is_some();
    let job = exec.job.job_name().to_string();
    if !checkpointed {
        options.savepoints.close(&format!(
            "job '{job}' takes no checkpoints (a savepoint is one too); set \
             execution.checkpointing.interval and execution.checkpointing.dir"
        ));
    }
    let strategy = config.restart_strategy(checkpointed);
    let mut tracker = RestartTracker::new(strategy);
    let started = Instant::now();
    let mut restarts = Vec::new();
    // Which checkpoint an attempt resumes from: the latest numbered at least this (`None`:
    // none). The first attempt takes any with --resume; a restart only the run's own
    // (numbered from its first attempt's first checkpoint on), else what the run began from.
    let mut resume = options.resume.then_some(0);
    let mut run_first = None;
    loop {
        let error = match run_attempt(&exec, config, options, resume, &mut run_first) {
            Ok(mut result) => {
                result.restarts = restarts;
                return Ok(result);
            }
            Err(error) => error,
        };
        // A spread run's other executors go on without this one's restart: whoever placed
        // the run restarts all of them.
        if !error.is_restartable() || options.cancel.is_requested() || options.spread.is_some() {
            return Err(error);
        }
        let now_ms = started.elapsed().as_millis().min(i64::MAX as u128) as i64;
        let delay_ms = match tracker.on_failure(now_ms, uniform_random()) {
            RestartDecision::RestartAfter(delay_ms) => delay_ms,
            // Attempts run one after another: a failure is never inside an earlier one's wait.
            RestartDecision::AlreadyRestarting => 0,
            RestartDecision::GiveUp(_) if strategy == RestartStrategy::None => return Err(error),
            RestartDecision::GiveUp(reason) => {
                return Err(JobError::RestartsExhausted {
                    restarts: tracker.restarts(),
                    reason,
                    last: Box::new(error),
                })
            }
        };
        let cause = error.to_string();
        tracing::warn!(
            job,
            restart = tracker.restarts(),
            delay_ms,
            %cause,
            "restarting the job{}",
            match (checkpointed, &options.from_savepoint) {
                (true, None) => {
                    " from its latest completed checkpoint (the beginning if none completed)"
                }
                (true, Some(_)) => {
                    " from its latest completed checkpoint (its savepoint if none completed)"
                }
                (false, None) => " from the beginning (checkpointing is off)",
                (false, Some(_)) => " from its savepoint (checkpointing is off)",
            }
        );
        let delay = Duration::from_millis(delay_ms.max(0) as u64);
        let wait_until = Instant::now() + delay;
        while Instant::now() < wait_until && !options.cancel.is_requested() {
            std::thread::sleep(Duration::from_millis(5).min(wait_until - Instant::now()));
        }
        // The failure set the job's stop flag; clear it unless a cancel request came too.
        options.cancel.stop.store(false, Ordering::Relaxed);
        if options.cancel.is_requested() {
            options.cancel.stop.store(true, Ordering::Relaxed);
            return Err(JobError::Cancelled { job });
        }
        options.monitor.restarted();
        restarts.push(Restart { cause, delay });
        if checkpointed {
            resume = Some(if options.resume {
                0
            } else {
                run_first.unwrap_or(0)
            });
        }
    }
}

/// A number uniform in `[0, 1)` for the restart delay's jitter (from the process's random
/// hash keys; no generator needed for this).
fn uniform_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// One run of all the job's tasks, until they end or one fails. `resume`: see
/// `run_attempts`; `run_first` is set to the first attempt's first checkpoint number.
fn run_attempt(
    exec: &Arc<ExecutionGraph>,
    config: &Configuration,
    options: &RunOptions,
    resume: Option<u64>,
    run_first: &mut Option<u64>,
) -> Result<JobResult, JobError> {
    // Where the attempt's readiness counts from: before its checkpoint is read.
    let begun = Instant::now();
    let slots = exec
        .job
        .vertices
        .iter()
        .map(|v| v.parallelism)
        .max()
        .unwrap_or(1);
    let spread = options.spread.as_ref();
    if let Some(spread) = spread {
        spread.check(slots).map_err(JobError::InvalidJob)?;
    }
    let here = |slot: usize| spread.is_none_or(|spread| spread.is_here(slot));
    // This executor's shards: one per slot here, on its cores in slot order.
    let local_slots: Vec<usize> = (0..slots).filter(|&slot| here(slot)).collect();
    if let (Some(spread), true) = (spread, local_slots.len() > exec.cores.len()) {
        return Err(JobError::InvalidJob(format!(
            "{} of the run's slots are on node '{}', but this executor has {} core(s) \
             (taskmanager.numberOfTaskSlots, taskmanager.cpu.cores): one shard per core",
            local_slots.len(),
            spread.node,
            exec.cores.len()
        )));
    }
    let budget = config.worker_budget(exec.cores.len())?.slot;
    let credits = config.buffers_per_channel();
    let needs = exec.required_segments(credits, |sender, receiver| here(sender) != here(receiver));
    for &slot in &local_slots {
        let need = needs[slot];
        if need.sending + need.receiving > budget.segments {
            return Err(JobError::InvalidJob(format!(
                "slot {slot} needs {} network segments ({credits} credits + 2 per channel to another slot of \
                 this executor, 2 × {credits} + 2 per channel to another executor, {credits} per channel from one) but its \
                 pool has {} ({budget}); raise taskmanager.memory.network.fraction (and \
                 taskmanager.memory.network.max if it caps the share) or taskmanager.memory.process.size, \
                 or lower taskmanager.network.memory.buffers-per-channel",
                need.sending + need.receiving,
                budget.segments
            )));
        }
    }
    // Per shard here. Channels from other executors land in pools of their own, taken from
    // the slot's share.
    let pools: Vec<SegmentPool> = local_slots
        .iter()
        .map(|&slot| {
            let segments = budget.segments.saturating_sub(needs[slot].receiving);
            SegmentPool::new(slot, segments.max(1), budget.segment_size)
        })
        .collect();

    // Channels: one per (sender, receiver) pair of every exchange edge — a bounded ring between
    // two shards, a local channel between two subtasks of one shard.
    // Per slot, the slots in other executors its subtasks send to: its shard dials each once.
    let mut dials: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); slots];
    let mut plans: Vec<SubtaskPlan> = exec
        .subtasks
        .iter()
        .enumerate()
        .map(|(index, s)| SubtaskPlan {
            index,
            vertex: s.vertex,
            subtask: s.subtask,
            slot: s.slot,
            senders: Vec::new(),
            receivers: Vec::new(),
            channel_sources: Vec::new(),
        })
        .collect();
    let plan_index: HashMap<(usize, usize), usize> = exec
        .subtasks
        .iter()
        .enumerate()
        .map(|(i, s)| ((s.vertex, s.subtask), i))
        .collect();
    for (index, edge) in exec
        .job
        .edges
        .iter()
        .enumerate()
        .filter(|(_, e)| !e.chained)
    {
        let from = exec.job.node_vertex[edge.source_node];
        let to = exec.job.node_vertex[edge.target_node];
        let make = exec.job.graph.nodes[edge.target_node]
            .input_ops
            .expect("a consuming node has an input type")
            .local_channel;
        let mut per_sender: HashMap<usize, Vec<EndPlan<SharedSender<Segment>>>> = HashMap::new();
        for (sender, receiver) in exec.channels(index) {
            // Subtask `i` runs on slot `i`: a channel's ends are here or in another executor.
            let (tx, rx) = match (here(sender), here(receiver)) {
                (false, false) => continue,
                (true, false) => {
                    dials[sender].insert(receiver);
                    let key = spread.expect("a spread run").key(index, sender, receiver);
                    per_sender.entry(sender).or_default().push(EndPlan::Net {
                        key,
                        slot: receiver,
                    });
                    continue;
                }
                (false, true) => {
                    let key = spread.expect("a spread run").key(index, sender, receiver);
                    let rx = EndPlan::Net { key, slot: sender };
                    (None, rx)
                }
                (true, true) if within_slot(sender, receiver) => {
                    let plan = LocalChannelPlan {
                        id: (index, sender, receiver),
                        make,
                    };
                    (Some(EndPlan::Local(plan)), EndPlan::Local(plan))
                }
                (true, true) => {
                    let (tx, rx) = shared_channel::new_bounded(credits);
                    (Some(EndPlan::Remote(tx)), EndPlan::Remote(rx))
                }
            };
            if let Some(tx) = tx {
                per_sender.entry(sender).or_default().push(tx);
            }
            let plan = &mut plans[plan_index[&(to, receiver)]];
            plan.receivers.push(rx);
            plan.channel_sources.push(ChannelSource {
                head: exec.job.vertices[from].head,
                subtask: sender,
            });
        }
        for (sender, txs) in per_sender {
            plans[plan_index[&(from, sender)]]
                .senders
                .push((index, txs));
        }
    }

    let job_name = exec.job.job_name().to_string();
    let checkpoint_config = config.checkpointing()?;
    if resume.is_some() && checkpoint_config.is_none() {
        return Err(JobError::InvalidJob(format!(
            "cannot resume job '{job_name}': checkpointing is off; set \
             execution.checkpointing.interval and execution.checkpointing.dir as the run that \
             wrote the checkpoints did"
        )));
    }
    let operators = operator_entries(exec);
    let rules = RestoreRules {
        operators: &operators,
        allow_non_restored_state: options.allow_non_restored_state,
    };
    let checkpoints = match &checkpoint_config {
        Some(checkpoint_config) => Some(start_checkpoints(
            exec,
            checkpoint_config,
            &job_name,
            resume,
            rules,
            // Another executor of the run coordinates its checkpoints (`checkpoint::relay`).
            spread.is_some_and(|spread| !spread.is_here(0)),
        )?),
        None => None,
    };
    if let Some(start) = &checkpoints {
        run_first.get_or_insert(start.first);
        if resume.is_none() && options.from_savepoint.is_none() && start.first > 1 {
            tracing::warn!(
                "job '{job_name}' starts from scratch although {} holds checkpoints up to \
                 chk-{}; pass --resume to continue from the latest one (older checkpoints are \
                 deleted as new ones complete)",
                start.storage.dir().display(),
                start.first - 1
            );
        }
    }
    let mut restored = checkpoints.as_ref().and_then(|c| c.restored.clone());
    if let (None, Some(path)) = (&restored, &options.from_savepoint) {
        restored = Some(open_savepoint(path, &job_name, rules)?);
    }
    if let Some(restored) = &restored {
        refuse_other_backend(exec, restored, config.state_backend())?;
        refuse_rescaled_in_flight(exec, restored)?;
    }
    let graph = &exec.job.graph;
    let mut enumerators = Vec::with_capacity(graph.nodes.len());
    for n in &graph.nodes {
        enumerators.push(match &n.kind {
            NodeKind::Source(factory) if exec.job.node_parallelism[n.id] > 0 => {
                let id = exec.job.operator_ids[n.id].to_string();
                let snapshot = restored
                    .as_ref()
                    .and_then(|restored| restored.enumerators.get(&id));
                let enumerator = factory
                    .create_enumerator(
                        exec.job.node_parallelism[n.id],
                        snapshot.map(Vec::as_slice),
                        spread.is_some(),
                    )
                    .map_err(|error| {
                        JobError::InvalidJob(format!(
                            "cannot restore the split enumerator of source '{}': {error}",
                            n.name
                        ))
                    })?;
                Some(enumerator)
            }
            _ => None,
        });
    }
    let source_names: Vec<String> = graph
        .nodes
        .iter()
        .filter(|n| matches!(n.kind, NodeKind::Source(_)) && exec.job.node_parallelism[n.id] > 0)
        .map(|n| n.name.clone())
        .collect();
    let metrics = MetricsRegistry::default();
    let settings = TaskSettings {
        batch_size: config.batch_size(),
        buffer_timeout: config.buffer_timeout(),
        max_parallelism: exec.job.max_parallelism,
        auto_watermark_interval: config.auto_watermark_interval(),
        latency_interval: config.latency_interval(),
    };
    let cores = exec.cores[..local_slots.len()].to_vec();
    let state_backend = config.state_backend();
    let rocksdb = match state_backend {
        BackendType::RocksDb => Some(JobRocksDb::open(
            &config.rocksdb_local_dir(),
            slots,
            budget.rocksdb,
            checkpoint_config.is_some(),
        )?),
        BackendType::Heap => None,
    };
    // A shard's heap figure is its heap use when state lives on the heap. RocksDB allocates
    // memtables on the writing shard and frees them on its flush threads, so with RocksDB the
    // figure drifts; its memory is bounded by its cache instead (`JobRocksDb`).
    let heap_share = (state_backend == BackendType::Heap).then_some(budget.heap);
    let driver = match (checkpoints, &checkpoint_config) {
        (Some(start), Some(checkpoint_config)) => {
            let spread = spread.map(|spread| SpreadPlan {
                relay: spread.relay.clone(),
                leader: spread.is_here(0),
                node: spread.node.clone(),
                followers: spread.nodes() - 1,
                restored: restored.as_ref().map(|restored| restored.checkpoint),
                here: exec.subtasks.iter().map(|s| here(s.slot)).collect(),
            });
            let mut plan = driver_plan(
                exec,
                &enumerators,
                checkpoint_config,
                &job_name,
                &start,
                options,
                config.state_backend(),
            );
            plan.spread = spread;
            Some(CheckpointDriver::start(
                start.storage,
                plan,
                Arc::clone(&options.cancel.stop),
            ))
        }
        _ => None,
    };
    let shared = Arc::new(JobShared {
        exec: Arc::clone(exec),
        settings,
        enumerators,
        metrics: metrics.clone(),
        cancel: Arc::clone(&options.cancel.stop),
        state_backend,
        rocksdb,
        checkpointing: driver.as_ref().map(|driver| Arc::clone(&driver.shared)),
        restored,
        sinks: config.sink_settings(),
        monitor: options.monitor.clone(),
        local_subtasks: exec.subtasks.iter().filter(|s| here(s.slot)).count(),
        spread: spread.cloned(),
    });

    let mut shards: Vec<ShardPlan> = local_slots
        .iter()
        .map(|&slot| ShardPlan {
            slot,
            subtasks: Vec::new(),
            dials: dials[slot].iter().copied().collect(),
        })
        .collect();
    for (plan, placed) in plans.into_iter().zip(&shared.exec.subtasks) {
        if let Some(shard) = local_slots.iter().position(|&slot| slot == placed.slot) {
            shards[shard].subtasks.push(plan);
        }
    }
    let loads: Vec<Arc<ShardLoad>> = local_slots
        .iter()
        .map(|_| Arc::new(ShardLoad::default()))
        .collect();
    let memory = crate::monitor::SlotMemory {
        budget,
        rocksdb: shared
            .rocksdb
            .as_ref()
            .map(|dbs| {
                local_slots
                    .iter()
                    .map(|&slot| dbs.slots[slot].clone())
                    .collect()
            })
            .unwrap_or_default(),
        heap_counted: heap_share.is_some() && weir_memory::is_counting(),
    };
    options.monitor.plan(plan_edges(exec, spread));
    options.monitor.attach(
        metrics.clone(),
        loads.clone(),
        pools.clone(),
        cores.clone(),
        memory,
        begun,
    );
    // Let go of the attempt's pools and counters however it ends.
    let _attached = Detach(&options.monitor);
    let progress = options.progress.map(|interval| {
        ProgressReporter::start(interval, metrics.clone(), source_names, loads.clone())
    });

    let started = Instant::now();
    let mut shards = shards.into_iter();
    let results = run_on_shards(&cores, config.spin_before_park(), |shard| {
        run_shard(
            shards.next().expect("a plan per shard"),
            heap_share,
            credits,
            Arc::clone(&shared),
            pools[shard].clone(),
            Arc::clone(&loads[shard]),
        )
    })?;
    let duration = started.elapsed();
    drop(progress);
    let (checkpoint_failure, checkpoints, stopped_with) = match driver.map(CheckpointDriver::stop) {
        Some(DriverEnd {
            failure,
            stats,
            stopped_with,
        }) => (failure, Some(stats), stopped_with),
        None => (None, None, None),
    };
    if let Some(reason) = checkpoint_failure {
        return Err(JobError::CheckpointsFailed {
            job: job_name,
            reason,
        });
    }

    let mut failures: Vec<SubtaskFailure> = results.into_iter().flatten().collect();
    failures.sort_by_key(|f| f.error.role);
    let requested_stop_only = failures
        .first()
        .is_some_and(|f| f.error.role != Role::Cause);
    if options.cancel.is_requested() && requested_stop_only {
        return Err(JobError::Cancelled { job: job_name });
    }
    if let Some(failure) = failures.into_iter().next() {
        let vertex = &shared.exec.job.vertices[failure.vertex];
        let operator = failure
            .error
            .operator
            .clone()
            .unwrap_or_else(|| vertex.name.clone());
        return Err(JobError::TaskFailed {
            operator,
            subtask: failure.subtask,
            parallelism: failure.parallelism.unwrap_or(vertex.parallelism),
            message: failure.error.message,
            kind: failure.error.kind,
        });
    }
    Ok(JobResult {
        job_name,
        duration,
        operators: metrics.snapshot(),
        pools: pools.iter().map(SegmentPool::stats).collect(),
        checkpoints,
        restarts: Vec::new(),
        savepoint: stopped_with,
    })
}

/// Detaches a job's monitor from its attempt when dropped.
struct Detach<'a>(&'a crate::monitor::JobMonitor);

impl Drop for Detach<'_> {
    fn drop(&mut self) {
        self.0.detach();
    }
}

/// Every operator of the job with its id and parallelism, as checkpoints record them.
fn operator_entries(exec: &ExecutionGraph) -> Vec<OperatorEntry> {
    let job = &exec.job;
    job.graph
        .nodes
        .iter()
        .map(|node| OperatorEntry {
            id: job.operator_ids[node.id].to_string(),
            name: node.name.clone(),
            uid: node.uid.clone(),
            parallelism: job.node_parallelism[node.id],
        })
        .collect()
}

/// Checks that the job can be checkpointed and opens its checkpoint directory (restoring the
/// latest checkpoint with `resume`: see `run_attempts`).
fn start_checkpoints(
    exec: &ExecutionGraph,
    checkpoint_config: &CheckpointConfig,
    job_name: &str,
    resume: Option<u64>,
    rules: RestoreRules<'_>,
    follower: bool,
) -> Result<CheckpointStart, JobError> {
    for node in &exec.job.graph.nodes {
        let unsupported = match &node.kind {
            NodeKind::Operator(factory) => factory.unsupported_state(),
            NodeKind::Source(_) | NodeKind::Sink(_) => None,
        };
        if let Some(what) = unsupported {
            return Err(JobError::InvalidJob(format!(
                "operator '{}' keeps {what}, which checkpoints cannot write yet; run the job \
                 without execution.checkpointing.interval, or build this step from a keyed \
                 process function with keyed state and timers",
                node.name
            )));
        }
    }
    open_checkpoints(&checkpoint_config.dir, job_name, resume, rules, follower)
}

/// Refuses to restore state that `backend` cannot read: RocksDB's own files (an operator's
/// `rocksdb` part, which RocksDB checkpoints hold) on the heap. Everything else restores on
/// either backend: keyed state and windows in the canonical layout (any heap checkpoint, any
/// savepoint), timers, operator state and join buffers.
fn refuse_other_backend(
    exec: &ExecutionGraph,
    restored: &RestoredJob,
    backend: BackendType,
) -> Result<(), JobError> {
    if backend == BackendType::RocksDb {
        return Ok(());
    }
    let native = restored.parts.iter().find(|(_, subtasks)| {
        subtasks
            .iter()
            .any(|(_, parts)| parts.contains_key(PART_ROCKSDB))
    });
    let Some((operator, _)) = native else {
        return Ok(());
    };
    let name = exec
        .job
        .graph
        .nodes
        .iter()
        .find(|node| exec.job.operator_ids[node.id].to_string() == *operator)
        .map_or(operator.as_str(), |node| node.name.as_str());
    Err(JobError::InvalidJob(format!(
        "{} holds the state of operator '{name}' in RocksDB's own files (written by the \
         rocksdb state backend: a checkpoint, or a savepoint of a build before savepoints of \
         windows were canonical), which state.backend.type: {} cannot read; restore it with \
         state.backend.type: rocksdb, or take a savepoint there, which restores on either \
         backend",
        restored.dir.display(),
        backend.config_name(),
    )))
}

/// What feeds the input channels of the task headed by `head`, in the order its gate has them
/// ([`InputLayout`]): per input edge the producing operator's id, the input it feeds, the
/// partitioning and both parallelisms.
fn input_layout(job: &crate::graph::JobGraph, head: usize) -> String {
    job.edges
        .iter()
        .filter(|edge| !edge.chained && edge.target_node == head)
        .map(|edge| {
            format!(
                "{} to input {} by {:?}, {} to {}",
                job.operator_ids[edge.source_node],
                edge.input_index,
                edge.kind,
                job.node_parallelism[edge.source_node],
                job.node_parallelism[head],
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Refuses to restore an unaligned checkpoint's in-flight data into a task whose input
/// channels are not the ones it was recorded on: the operator that recorded it no longer
/// starts a task (it is chained now), or it or an operator feeding it runs at another
/// parallelism than in the checkpoint (a savepoint, always aligned, rescales).
fn refuse_rescaled_in_flight(
    exec: &ExecutionGraph,
    restored: &RestoredJob,
) -> Result<(), JobError> {
    let job = &exec.job;
    let refuse = |operator: &str, why: String| {
        JobError::InvalidJob(format!(
            "{} holds in-flight data of operator '{operator}' (an unaligned checkpoint), which \
             restores only into the job as it was checkpointed: {why}; resume it as it was, or \
             take a savepoint (savepoints are aligned) and change the job from there",
            restored.dir.display(),
        ))
    };
    for (id, subtasks) in &restored.parts {
        // What fed the channels of each old subtask that recorded data (a part that does not
        // read back counts too: its subtask's restore reports why).
        let layouts: Vec<String> = subtasks
            .iter()
            .filter_map(|(_, parts)| parts.get(PART_IN_FLIGHT))
            .filter_map(|part| {
                layout_of_data(part, "in-flight data").unwrap_or(Some(String::new()))
            })
            .collect();
        // An operator the job no longer has is refused (or left out) with its other state.
        let Some(node) = job
            .graph
            .nodes
            .iter()
            .find(|node| job.operator_ids[node.id].to_string() == *id)
        else {
            continue;
        };
        if layouts.is_empty() {
            continue;
        }
        let name = &node.name;
        if job.vertices[job.node_vertex[node.id]].head != node.id {
            return Err(refuse(
                name,
                "it is chained to the operator before it now".into(),
            ));
        }
        let inputs = job
            .edges
            .iter()
            .filter(|edge| !edge.chained && edge.target_node == node.id)
            .map(|edge| edge.source_node);
        for other in std::iter::once(node.id).chain(inputs) {
            let was = restored
                .parallelism
                .get(&job.operator_ids[other].to_string());
            let now = job.node_parallelism[other];
            if let Some(&was) = was.filter(|&&was| was != now) {
                let other = &job.graph.nodes[other].name;
                return Err(refuse(
                    name,
                    format!("'{other}' ran at parallelism {was} and runs at {now} now"),
                ));
            }
        }
        let now = input_layout(job, node.id);
        if let Some(then) = layouts.iter().find(|then| **then != now) {
            return Err(refuse(
                name,
                format!("its inputs were fed as {then} and are fed as {now} now"),
            ));
        }
    }
    Ok(())
}

/// The job's edges as its figures show them: each exchange's channels, and in a spread run
/// those between slots on different nodes.
fn plan_edges(exec: &ExecutionGraph, spread: Option<&Spread>) -> Vec<EdgeFigures> {
    let crosses = |(sender, receiver): &(usize, usize)| {
        spread.is_some_and(|spread| spread.slots[*sender].node != spread.slots[*receiver].node)
    };
    exec.job
        .edges
        .iter()
        .enumerate()
        .map(|(index, edge)| {
            let channels = if edge.chained {
                Vec::new()
            } else {
                exec.channels(index)
            };
            EdgeFigures {
                source: edge.source_node,
                target: edge.target_node,
                partitioning: edge.kind.to_string(),
                chained: edge.chained,
                channels: channels.len(),
                remote_channels: channels.iter().filter(|c| crosses(c)).count(),
            }
        })
        .collect()
}

/// What the coordinator thread needs of the job.
fn driver_plan(
    exec: &ExecutionGraph,
    enumerators: &[Option<SharedEnumerator>],
    checkpoint_config: &CheckpointConfig,
    job_name: &str,
    start: &CheckpointStart,
    options: &RunOptions,
    backend: BackendType,
) -> DriverPlan {
    let job = &exec.job;
    let sources: Vec<(
        String,
        Arc<dyn crate::graph::SourceFactory>,
        SharedEnumerator,
    )> = job
        .graph
        .nodes
        .iter()
        .filter_map(|node| match (&node.kind, &enumerators[node.id]) {
            (NodeKind::Source(factory), Some(enumerator)) => Some((
                job.operator_ids[node.id].to_string(),
                Arc::clone(factory),
                Arc::clone(enumerator),
            )),
            _ => None,
        })
        .collect();
    // In a spread run each executor's enumerators serve its own readers (reader `i` on slot
    // `i`): its snapshots hold their pending splits, which the leader joins with the others'.
    let readers_here: Option<(Vec<bool>, bool)> = options.spread.as_ref().map(|spread| {
        let here = (0..spread.slots.len()).map(|slot| spread.is_here(slot));
        (here.collect(), spread.is_here(0))
    });
    DriverPlan {
        job: job_name.to_string(),
        settings: checkpoint_config.settings,
        retained: checkpoint_config.retained,
        task_subtasks: exec.subtasks.iter().map(|s| s.subtask).collect(),
        sources: exec
            .subtasks
            .iter()
            .map(|s| {
                matches!(
                    job.graph.nodes[job.vertices[s.vertex].head].kind,
                    NodeKind::Source(_)
                )
            })
            .collect(),
        operators: operator_entries(exec),
        enumerators: Box::new(move |checkpoint| {
            sources
                .iter()
                .map(|(id, factory, enumerator)| {
                    let mut bytes = factory.snapshot_enumerator(enumerator, checkpoint)?;
                    if let Some((here, leader)) = &readers_here {
                        let here = |reader: usize| here.get(reader).copied().unwrap_or(false);
                        bytes = keep_splits(&bytes, here, *leader)?;
                    }
                    Ok((id.clone(), bytes))
                })
                .collect()
        }),
        exactly_once: checkpoint_config.exactly_once,
        incremental: checkpoint_config.incremental,
        unaligned: checkpoint_config.unaligned,
        first: start.first,
        savepoints: options.savepoints.clone(),
        // Savepoints go beside the job's checkpoints unless configured elsewhere.
        savepoint_dir: checkpoint_config
            .savepoint_dir
            .clone()
            .unwrap_or_else(|| start.storage.dir().join("savepoints")),
        backend,
        monitor: options.monitor.clone(),
        // This executor's part in a spread run's checkpoints: set by the caller.
        spread: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prelude::*;

    #[test]
    fn the_plans_edges_are_chained_local_or_remote_where_channels_cross_nodes() {
        let config = Configuration::default()
            .with("taskmanager.numberOfTaskSlots", "2")
            .and_then(|c| c.with("parallelism.default", "2"))
            .unwrap();
        let env = StreamEnvironment::new(config).unwrap();
        env.from_sequence(0, 10)
            .map(|n: u64| n + 1)
            .key_by(|n: &u64| *n)
            .reduce(|a: u64, b: u64| a + b)
            .sink_to(DiscardSink::new(), "out");
        let exec = env.plan("edges").unwrap();
        let keyed = |edges: &[EdgeFigures]| {
            let keyed = edges.iter().find(|e| e.partitioning == "HASH").cloned();
            keyed.expect("a keyed exchange")
        };
        let here = plan_edges(&exec, None);
        let exchange = keyed(&here);
        assert_eq!(
            (
                exchange.chained,
                exchange.channels,
                exchange.remote_channels
            ),
            (false, 4, 0)
        );
        assert!(
            here.iter()
                .filter(|e| e.partitioning == "FORWARD")
                .all(|e| e.chained && e.channels == 0),
            "{here:?}"
        );
        // Slot 0 and slot 1 on two nodes: the channels between them cross.
        let spread = super::super::spread::on_loopback("edges", 2).unwrap();
        let over_two = plan_edges(&exec, Some(&spread[0]));
        assert_eq!(keyed(&over_two).remote_channels, 2, "{over_two:?}");
    }
}
