//! `StreamEnvironment`: the entry point of a job.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

use super::stream::{DataStream, Upstream};
use crate::checkpoint::{PendingSavepoint, SavepointHandle, StopMode};
use crate::config::Configuration;
use crate::connector::{CollectionSource, DataGeneratorSource, Source};
use crate::error::JobError;
use crate::graph::{
    ExecutionGraph, JobGraph, NodeKind, StreamEdge, StreamGraph, StreamNode, TypeOps,
};
use crate::record::Record;
use crate::runtime::factories::{type_ops, SourceNode};
use crate::runtime::{resolve_cores, run_job, CancelHandle, JobResult, RunOptions};
use crate::time::WatermarkStrategy;

pub(crate) struct EnvState {
    pub(crate) config: Configuration,
    pub(crate) cores: Vec<usize>,
    pub(crate) nodes: Vec<StreamNode>,
    pub(crate) errors: Vec<String>,
}

/// Collects a job's sources, transformations and sinks, and runs them embedded (local mode):
/// one pinned shard per configured core. Cloning shares the job being built.
#[derive(Clone)]
pub struct StreamEnvironment {
    pub(crate) state: Rc<RefCell<EnvState>>,
}

impl std::fmt::Debug for StreamEnvironment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.borrow();
        f.debug_struct("StreamEnvironment")
            .field("cores", &state.cores)
            .field("nodes", &state.nodes.len())
            .finish()
    }
}

/// A node's description before it is added.
pub(crate) struct NodeSpec {
    pub(crate) name: String,
    pub(crate) kind: NodeKind,
    pub(crate) inputs: Vec<StreamEdge>,
    pub(crate) input_ops: Option<TypeOps>,
    pub(crate) output_ops: Option<TypeOps>,
}

impl StreamEnvironment {
    /// An environment for `config`. Refuses settings the machine cannot honour (more shards
    /// than cores, unknown cores, bad memory settings).
    pub fn new(config: Configuration) -> Result<StreamEnvironment, JobError> {
        let cores = resolve_cores(config.slots(), config.cores())?;
        config
            .memory(cores.len())
            .validate()
            .map_err(crate::config::ConfigError::from)?;
        Ok(StreamEnvironment {
            state: Rc::new(RefCell::new(EnvState {
                config,
                cores,
                nodes: Vec::new(),
                errors: Vec::new(),
            })),
        })
    }

    /// Number of slots (= shards = cores) the job runs on.
    pub fn slots(&self) -> usize {
        self.state.borrow().cores.len()
    }

    /// Parallelism of operators that set none (`parallelism.default`, else the slot count).
    pub fn default_parallelism(&self) -> usize {
        let state = self.state.borrow();
        state
            .config
            .default_parallelism()
            .unwrap_or(state.cores.len())
    }

    /// The configuration.
    pub fn config(&self) -> Configuration {
        self.state.borrow().config.clone()
    }

    pub(crate) fn add_node(&self, spec: NodeSpec) -> usize {
        let mut state = self.state.borrow_mut();
        let id = state.nodes.len();
        state.nodes.push(StreamNode {
            id,
            name: spec.name,
            uid: None,
            parallelism: None,
            chaining_allowed: true,
            kind: spec.kind,
            inputs: spec.inputs,
            input_ops: spec.input_ops,
            output_ops: spec.output_ops,
        });
        id
    }

    pub(crate) fn record_error(&self, message: String) {
        self.state.borrow_mut().errors.push(message);
    }

    /// Reads from `source`; `watermarks` stamps each record with its event time and derives
    /// watermarks per split (`WatermarkStrategy::no_watermarks()` for none). The node is named
    /// `Source: <name>`.
    pub fn from_source<T: Record, S: Source<T>>(
        &self,
        source: S,
        watermarks: WatermarkStrategy<T>,
        name: &str,
    ) -> DataStream<T> {
        let node = self.add_node(NodeSpec {
            name: format!("Source: {name}"),
            kind: NodeKind::Source(Arc::new(SourceNode::new(source, watermarks))),
            inputs: Vec::new(),
            input_ops: None,
            output_ops: Some(type_ops::<T>()),
        });
        DataStream::new(self.clone(), Upstream::main(node))
    }

    /// Reads the elements of `elements`.
    pub fn from_collection<T: Record + Sync>(&self, elements: Vec<T>) -> DataStream<T> {
        self.from_source(
            CollectionSource::new(elements),
            WatermarkStrategy::no_watermarks(),
            "Collection",
        )
    }

    /// The numbers `from..to`.
    pub fn from_sequence(&self, from: u64, to: u64) -> DataStream<u64> {
        self.from_source(
            DataGeneratorSource::sequence(from, to),
            WatermarkStrategy::no_watermarks(),
            "Sequence",
        )
    }

    /// Translates the job built so far into its execution graph (without running it).
    pub fn plan(&self, job_name: &str) -> Result<ExecutionGraph, JobError> {
        self.plan_over(job_name, None)
    }

    /// The execution graph of a run over `options`' spread, if any: the job's slots are then
    /// all the spread's, this executor's shards (its cores) running those on its node.
    fn plan_for(&self, job_name: &str, options: &RunOptions) -> Result<ExecutionGraph, JobError> {
        self.plan_over(job_name, options.spread.as_ref().map(|s| s.slots.len()))
    }

    /// The execution graph on `slots` slots (default: one per core of this executor).
    fn plan_over(&self, job_name: &str, slots: Option<usize>) -> Result<ExecutionGraph, JobError> {
        let state = self.state.borrow();
        if let Some(error) = state.errors.first() {
            return Err(JobError::InvalidJob(error.clone()));
        }
        let graph = StreamGraph {
            job_name: job_name.to_string(),
            nodes: state.nodes.iter().map(StreamNode::share).collect(),
        };
        let job = JobGraph::from_stream_graph(
            graph,
            self.default_parallelism(),
            state.config.max_parallelism(),
            state.config.chaining_enabled(),
        )?;
        let slots = slots.unwrap_or(state.cores.len());
        ExecutionGraph::new(job, slots, state.cores.clone())
    }

    /// The StreamGraph, JobGraph and ExecutionGraph of the job built so far, as text.
    pub fn explain(&self, job_name: &str) -> Result<String, JobError> {
        Ok(self.plan(job_name)?.explain())
    }

    /// Runs the job to completion (a bounded job ends when all its sources do).
    pub fn execute(&self, job_name: &str) -> Result<JobResult, JobError> {
        self.execute_with(job_name, RunOptions::default())
    }

    /// Runs the job with options (e.g. a live progress report on stderr).
    pub fn execute_with(&self, job_name: &str, options: RunOptions) -> Result<JobResult, JobError> {
        let exec = self.plan_for(job_name, &options)?;
        let config = self.config();
        run_job(exec, &config, options)
    }

    /// Starts the job on a thread of its own and returns at once: an unbounded job runs until
    /// [`JobClient::cancel`]. The job is translated and checked before this returns.
    pub fn execute_async(
        &self,
        job_name: &str,
        options: RunOptions,
    ) -> Result<JobClient, JobError> {
        let exec = self.plan_for(job_name, &options)?;
        let config = self.config();
        let cancel = options.cancel.clone();
        let savepoints = options.savepoints.clone();
        let thread = std::thread::Builder::new()
            .name(format!("weir-job-{job_name}"))
            .spawn(move || run_job(exec, &config, options))
            .map_err(|e| {
                JobError::InvalidJob(format!("cannot start a thread for job '{job_name}': {e}"))
            })?;
        Ok(JobClient {
            thread,
            cancel,
            savepoints,
        })
    }
}

/// A job running on its own thread (see [`StreamEnvironment::execute_async`]).
#[derive(Debug)]
pub struct JobClient {
    thread: std::thread::JoinHandle<Result<JobResult, JobError>>,
    cancel: CancelHandle,
    savepoints: SavepointHandle,
}

impl JobClient {
    /// Asks the job to stop; [`JobClient::wait`] then returns [`JobError::Cancelled`] (or the
    /// job's result, if it finished first).
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Takes a savepoint while the job runs on (`crate::checkpoint::savepoint`); the job must
    /// be checkpointed (`execution.checkpointing.interval` and `.dir`).
    pub fn trigger_savepoint(&self) -> PendingSavepoint {
        self.savepoints.trigger()
    }

    /// Takes a savepoint and stops the job once it completed ([`JobClient::wait`] then returns
    /// the result, with [`JobResult::savepoint`]); if the savepoint fails, the job runs on.
    pub fn stop_with_savepoint(&self, mode: StopMode) -> PendingSavepoint {
        self.savepoints.stop_with_savepoint(mode)
    }

    /// Takes a checkpoint now, without waiting for the interval (Flink's manual checkpoint):
    /// one of the job's own, retained and subsumed like the periodic ones.
    pub fn trigger_checkpoint(&self) -> PendingSavepoint {
        self.savepoints.checkpoint()
    }

    /// Whether the job has ended.
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits for the job to end.
    pub fn wait(self) -> Result<JobResult, JobError> {
        self.thread
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }
}

/// Ties a stream to its record type without holding a record.
pub(crate) type StreamMarker<T> = PhantomData<fn() -> T>;
