//! The messages between a worker and the control plane: JSON text frames of a WebSocket the
//! worker opens to `ws://<rest.address>:<rest.port>/v1/workers` (with the REST API's bearer
//! token, if one is set). The worker's first message is [`WorkerMessage::Register`], carrying
//! [`PROTOCOL_VERSION`]; the control plane answers [`ControlMessage::Registered`], or
//! [`ControlMessage::Refused`] naming both versions when they differ.

use serde::{Deserialize, Serialize};

use weir_engine::checkpoint::{CheckpointMessage, Taken};
use weir_engine::monitor::Figures;
use weir_engine::package::{DeploymentId, Outcome, RunSpec, Snapshot};

/// The version of these messages. Raised with any change to them.
pub const PROTOCOL_VERSION: u32 = 7;

/// Where workers fetch uploaded packages' executables (`{jar}`: the package's id).
pub const PACKAGES_PATH: &str = "/v1/packages/{jar}";

/// The path workers connect to.
pub const WORKERS_PATH: &str = "/v1/workers";

/// A worker's message to the control plane.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum WorkerMessage {
    /// The first message on every connection (also after a reconnect): who the worker is and
    /// what its executors are doing, so that a restarted control plane finds its jobs again.
    Register {
        /// The worker's [`PROTOCOL_VERSION`].
        protocol: u32,
        /// The worker.
        worker: WorkerInfo,
        /// Its executors, running or ended but not yet acknowledged.
        executors: Vec<ExecutorReport>,
        /// Set when the worker is shutting down (it registers again after a lost link).
        leaving: Option<Shutdown>,
    },
    /// The worker is shutting down (SIGTERM): deploy nothing more to it and end its runs as
    /// `shutdown` says. It exits once the control plane acknowledged every run's end.
    Leaving {
        /// What becomes of its runs (`worker.shutdown.mode`).
        shutdown: Shutdown,
    },
    /// Sent every `heartbeat.interval`.
    Heartbeat,
    /// An executor changed state.
    Executor(ExecutorReport),
    /// A run's live figures (about once a second while it runs).
    Figures {
        /// Which run.
        deployment: DeploymentId,
        /// Its figures.
        figures: Box<Figures>,
    },
    /// A checkpoint or savepoint asked for by [`ControlMessage::Snapshot`] completed or
    /// failed.
    Snapshot {
        /// Of which run.
        deployment: DeploymentId,
        /// The request's id.
        request: String,
        /// Its number and directory, or why there is none.
        result: Result<Taken, String>,
    },
    /// An executor of a run spread over several workers said this to the others of the run
    /// (to the one running slot 0, or from it to every other: [`CheckpointMessage::to_leader`]).
    Checkpoint {
        /// Of which run.
        deployment: DeploymentId,
        /// What it said.
        message: CheckpointMessage,
    },
}

/// What a worker that is shutting down asks for its runs (`worker.shutdown.mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shutdown {
    /// Each checkpointed run stops with a savepoint, and its job starts again from it on
    /// other slots; a run without checkpoints is cancelled.
    Savepoint,
    /// Each run is cancelled; its job restarts from its latest checkpoint elsewhere.
    Cancel,
}

impl Shutdown {
    /// The worker's, from `worker.shutdown.mode`.
    pub fn of(config: &weir_engine::Configuration) -> Shutdown {
        if config.worker_shutdown().0 {
            Shutdown::Savepoint
        } else {
            Shutdown::Cancel
        }
    }
}

/// What a worker offers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerInfo {
    /// Its id (Flink's TaskManager id): stable across the worker's reconnects.
    pub id: String,
    /// The host it runs on.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// Its slots: the CPU core each is pinned to, in slot order.
    pub cores: Vec<usize>,
    /// The host's memory, bytes.
    pub physical_memory: u64,
    /// `taskmanager.memory.process.size` of the worker's executors, all slots together, bytes.
    pub process_memory: u64,
    /// Of that, managed memory (state backends), bytes.
    pub managed_memory: u64,
    /// Network segments, bytes.
    pub network_memory: u64,
    /// Heap, bytes.
    pub heap_memory: u64,
    /// Its engine's version.
    pub engine_version: String,
    /// Where its slots take part in runs over several workers, if it can (it has a
    /// certificate of the cluster CA: `security.ssl.internal.dir`).
    #[serde(default)]
    pub exchange: Option<ExchangeInfo>,
}

/// How a worker's slots are reached by other workers' in a run over several.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExchangeInfo {
    /// The name its certificate was issued for (`security.ssl.internal.node`).
    pub node: String,
    /// Its address (`taskmanager.host`, resolved); `None`: the address the control plane
    /// sees it connect from.
    pub host: Option<std::net::IpAddr>,
    /// Its first slot's port (`taskmanager.data.port`); slot i listens on this + i.
    pub port: u16,
}

/// An executor's state, as its worker reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorReport {
    /// Which run it is.
    pub deployment: DeploymentId,
    /// Where it is.
    pub state: ExecutorState,
    /// Its slots on the worker (in the reports of a registration; empty in the others): a
    /// restarted control plane holds them until an executor it no longer counts on ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slots: Vec<usize>,
}

impl ExecutorReport {
    /// A change of an executor's state.
    pub fn new(deployment: DeploymentId, state: ExecutorState) -> ExecutorReport {
        ExecutorReport {
            deployment,
            state,
            slots: Vec::new(),
        }
    }
}

/// Where an executor is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum ExecutorState {
    /// Its process started.
    Deploying,
    /// Its job is built and its tasks run.
    Running,
    /// It ended; the worker reports it until the control plane acknowledges it.
    Ended(Outcome),
}

/// The control plane's message to a worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ControlMessage {
    /// The registration is accepted.
    Registered {
        /// How often the worker heartbeats, ms.
        heartbeat_interval_ms: u64,
        /// How long the worker waits for the control plane before it reconnects, ms.
        heartbeat_timeout_ms: u64,
    },
    /// The registration is refused (another protocol version): why.
    Refused {
        /// The reason, naming both versions.
        reason: String,
    },
    /// Sent every `heartbeat.interval` in answer to the worker's heartbeats.
    Heartbeat,
    /// Start an executor on these slots.
    Deploy {
        /// What it runs.
        run: RunSpec,
        /// The slots (indexes into the worker's `cores`).
        slots: Vec<usize>,
    },
    /// Take a checkpoint or savepoint of this run (and stop it with the savepoint if `take`
    /// says so).
    Snapshot {
        /// Which run.
        deployment: DeploymentId,
        /// The request's id, which the answer carries.
        request: String,
        /// What to take.
        take: Snapshot,
    },
    /// Cancel this run (and kill its process if it does not end in time).
    Cancel {
        /// Which run.
        deployment: DeploymentId,
    },
    /// Another executor of this run (spread over several workers) said this to the worker's.
    Checkpoint {
        /// Which run.
        deployment: DeploymentId,
        /// What it said.
        message: CheckpointMessage,
    },
    /// The control plane stored this run's end; the worker may forget it.
    Forget {
        /// Which run.
        deployment: DeploymentId,
    },
    /// To a worker that is shutting down: no run of a job is placed on it any more, and none
    /// will be; it may exit.
    Released,
}
