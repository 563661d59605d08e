//! The control plane's view of the cluster: the workers and their slots (the resource manager)
//! and one job master per job (its state, its placement, its restarts). Every change runs
//! under one lock, with no I/O but the store's small atomic writes and messages queued to the
//! workers' links; `tick` does what time decides (heartbeat timeouts, due restarts, slot
//! requests that waited too long).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::UnboundedSender;
use weir_engine::checkpoint::restart::{RestartDecision, RestartTracker};
use weir_engine::checkpoint::{CheckpointMessage, Taken};
use weir_engine::monitor::{Checkpoints, Figures};
use weir_engine::package::{DeploymentId, OperatorTotals, Outcome, RunSpec, Snapshot, Stop};
use weir_engine::runtime::SlotPlace;
pub use weir_engine::time::now_ms;
use weir_engine::Configuration;

use super::store::Store;
use crate::protocol::{
    ControlMessage, ExchangeInfo, ExecutorReport, ExecutorState, Shutdown, WorkerInfo,
};

/// A job's state, with Flink's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobStatus {
    /// Waiting for slots.
    Created,
    /// Deployed.
    Running,
    /// Failed, waiting for its restart.
    Restarting,
    /// Cancel asked of its executor.
    Cancelling,
    /// After a control plane restart: waiting for its worker to report it.
    Reconciling,
    /// Ended: every source ended.
    Finished,
    /// Ended: cancelled.
    Canceled,
    /// Ended: failed for good.
    Failed,
}

impl JobStatus {
    /// Every state.
    pub const ALL: [JobStatus; 8] = [
        JobStatus::Created,
        JobStatus::Running,
        JobStatus::Restarting,
        JobStatus::Cancelling,
        JobStatus::Reconciling,
        JobStatus::Finished,
        JobStatus::Canceled,
        JobStatus::Failed,
    ];

    /// Whether the job has ended.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Finished | JobStatus::Canceled | JobStatus::Failed
        )
    }

    /// The name Flink's REST API gives it.
    pub fn name(self) -> &'static str {
        match self {
            JobStatus::Created => "CREATED",
            JobStatus::Running => "RUNNING",
            JobStatus::Restarting => "RESTARTING",
            JobStatus::Cancelling => "CANCELLING",
            JobStatus::Reconciling => "RECONCILING",
            JobStatus::Finished => "FINISHED",
            JobStatus::Canceled => "CANCELED",
            JobStatus::Failed => "FAILED",
        }
    }
}

/// What a submission asks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Submission {
    /// The package (`weir` for the built-in jobs).
    pub package: String,
    /// The job in it (Flink's entry class).
    pub entry: String,
    /// Its program arguments.
    pub args: Vec<String>,
    /// Slots it runs on, all on one worker.
    pub parallelism: usize,
    /// Start from this savepoint.
    pub savepoint_path: Option<PathBuf>,
    /// Leave out state of operators the job no longer has.
    pub allow_non_restored_state: bool,
}

/// Where a run of a job is: an executor on each worker it spans.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "StoredPlacement")]
pub struct Placement {
    /// Which run.
    pub deployment: DeploymentId,
    /// Its executors, in the job's slot order: the first runs the job's first slots.
    pub executors: Vec<ExecutorPlace>,
    /// Where each of the job's slots runs, when the run spans several workers (every
    /// executor gets it).
    #[serde(default)]
    pub spread: Option<Vec<SlotPlace>>,
}

/// One executor of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecutorPlace {
    /// Its worker.
    pub worker: String,
    /// Its slots there.
    pub slots: Vec<usize>,
    /// Whether it reported its tasks running.
    pub running: bool,
    /// Once it finished (its share of the run's sources all ended): its operators' counts.
    /// The run finishes when every executor did.
    #[serde(default)]
    pub finished: Option<Vec<OperatorTotals>>,
    /// The savepoint it stopped with, if it finished stopped with one (in a run over
    /// several workers, the executor of slot 0 reports it; the others may finish after).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub savepoint: Option<PathBuf>,
    /// Not stored: whether its worker reported it since this control plane started (a run
    /// being reconciled is running again once every executor it has was reported).
    #[serde(skip)]
    pub heard: bool,
}

/// A placement as stored: today's, or one stored before runs spanned workers.
#[derive(Deserialize)]
#[serde(untagged)]
enum StoredPlacement {
    Executors {
        deployment: DeploymentId,
        executors: Vec<ExecutorPlace>,
        #[serde(default)]
        spread: Option<Vec<SlotPlace>>,
    },
    One {
        deployment: DeploymentId,
        worker: String,
        slots: Vec<usize>,
        running: bool,
    },
}

impl TryFrom<StoredPlacement> for Placement {
    type Error = String;

    fn try_from(stored: StoredPlacement) -> Result<Placement, String> {
        Ok(match stored {
            StoredPlacement::Executors {
                deployment,
                executors,
                ..
            } if executors.is_empty() => {
                return Err(format!("the placement of run {deployment} has no executor"));
            }
            StoredPlacement::Executors {
                deployment,
                executors,
                spread,
            } => Placement {
                deployment,
                executors,
                spread,
            },
            StoredPlacement::One {
                deployment,
                worker,
                slots,
                running,
            } => Placement {
                deployment,
                executors: vec![ExecutorPlace {
                    worker,
                    slots,
                    running,
                    finished: None,
                    savepoint: None,
                    heard: false,
                }],
                spread: None,
            },
        })
    }
}

impl Placement {
    /// Its executor on `worker`, if it has one there.
    pub fn on(&self, worker: &str) -> Option<&ExecutorPlace> {
        self.executors.iter().find(|e| e.worker == worker)
    }

    /// Whether every executor reported its tasks running.
    pub fn running(&self) -> bool {
        self.executors
            .iter()
            .all(|e| e.running || e.finished.is_some())
    }

    /// The workers of its executors.
    pub fn workers(&self) -> impl Iterator<Item = &str> {
        self.executors.iter().map(|e| e.worker.as_str())
    }

    /// The job's slots: all its executors' together.
    pub fn slots(&self) -> usize {
        self.executors.iter().map(|e| e.slots.len()).sum()
    }

    /// The worker of its first executor (the only one of a run on one worker).
    pub fn first_worker(&self) -> &str {
        &self.executors[0].worker
    }
}

/// A failure of a job's run, for `/jobs/:id/exceptions`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// When, ms since the epoch.
    pub timestamp: i64,
    /// Why.
    pub cause: String,
    /// Which worker ran it, if one did.
    pub worker: Option<String>,
}

/// A job, as the store keeps it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Job {
    /// 32 hex digits.
    pub id: String,
    /// What was submitted.
    pub submission: Submission,
    /// Its state.
    pub status: JobStatus,
    /// When each state was last entered, ms since the epoch, by Flink's state name.
    pub timestamps: BTreeMap<String, i64>,
    /// Submission time.
    pub start_time: i64,
    /// When it ended.
    pub end_time: Option<i64>,
    /// Runs deployed so far.
    pub attempts: u32,
    /// Where its current run is.
    pub placement: Option<Placement>,
    /// Its failures, oldest first.
    pub failures: Vec<Failure>,
    /// Record counts of its last finished run.
    pub totals: Vec<OperatorTotals>,
    /// Configuration its runs get (the control plane's, with its own checkpoint directory).
    pub config: Vec<(String, String)>,
    /// Whether its runs checkpoint (so that a restart resumes from the latest checkpoint).
    pub checkpointed: bool,
    /// Starts from a savepoint so far after the submission (rescales): each gets a checkpoint
    /// directory of its own, `execution.checkpointing.dir/<job id>/<generation>`, so that a
    /// restart resumes the latest checkpoint taken since, never one from before.
    #[serde(default)]
    pub generation: u32,
    /// Its savepoints, stops and rescales, oldest first.
    #[serde(default)]
    pub operations: Vec<Operation>,
    /// Not stored: the restart strategy's count (a restarted control plane starts it again).
    #[serde(skip)]
    restarts: Option<RestartTracker>,
    /// Not stored: when the pending restart or the reconciliation is due.
    #[serde(skip)]
    due_ms: Option<i64>,
    /// Not stored: since when it waits for slots (`slot.request.timeout` counts from here).
    #[serde(skip)]
    waiting_since: i64,
    /// Not stored: the current run's latest figures (its executors' together).
    #[serde(skip)]
    pub live: Option<Box<Figures>>,
    /// Not stored: each executor's figures before its latest and its latest, by worker,
    /// when the run spans several.
    #[serde(skip)]
    pub parts: BTreeMap<String, (Option<Box<Figures>>, Box<Figures>)>,
    /// Not stored: the current run's figures before those (what the shares of time over the
    /// last interval are measured from).
    #[serde(skip)]
    pub previous: Option<Box<Figures>>,
    /// Not stored: the checkpoints of the last run that ended.
    #[serde(skip)]
    pub last_checkpoints: Option<Checkpoints>,
    /// Not stored: when the latest run's first record was processed, ms since the epoch.
    #[serde(skip)]
    pub first_record: Option<i64>,
    /// Not stored: how long the latest run's tasks took to be ready, s (kept past its end).
    #[serde(skip)]
    pub tasks_ready: Option<f64>,
}

/// What an asynchronous operation on a job does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum OperationKind {
    /// A checkpoint of the job's own, now (Flink's manual checkpoint); the job runs on.
    Checkpoint,
    /// A savepoint; the job runs on.
    Savepoint,
    /// Stop with a savepoint (`drain`: with the final watermark).
    Stop {
        /// Fire every window first.
        drain: bool,
    },
    /// Stop with a savepoint and start again from it at another parallelism.
    Rescale {
        /// The new parallelism.
        parallelism: usize,
    },
    /// Stop with a savepoint and start again from it on other slots: the run's worker is
    /// shutting down (`worker.shutdown.mode: savepoint`).
    Relocate,
}

impl OperationKind {
    /// What the run is asked to take.
    fn take(self) -> Snapshot {
        match self {
            OperationKind::Checkpoint => Snapshot::Checkpoint,
            OperationKind::Savepoint => Snapshot::Savepoint,
            OperationKind::Stop { drain: true } => Snapshot::Stop(Stop::Drain),
            OperationKind::Stop { drain: false }
            | OperationKind::Rescale { .. }
            | OperationKind::Relocate => Snapshot::Stop(Stop::Suspend),
        }
    }

    /// Whether the run stops with it (a stop, a rescale or a relocation).
    fn stops(self) -> bool {
        matches!(self.take(), Snapshot::Stop(_))
    }

    /// Whether the job starts again from its savepoint (a rescale or a relocation).
    fn restarts(self) -> bool {
        matches!(
            self,
            OperationKind::Rescale { .. } | OperationKind::Relocate
        )
    }

    /// A rescale's or relocation's name, in words.
    fn restart_name(self) -> &'static str {
        match self {
            OperationKind::Relocate => "move off its worker",
            _ => "rescale",
        }
    }

    /// What it takes, in words.
    pub fn taken(self) -> &'static str {
        match self {
            OperationKind::Checkpoint => "checkpoint",
            _ => "savepoint",
        }
    }
}

/// A checkpoint, savepoint, stop or rescale asked for over the REST API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Operation {
    /// Its trigger id (`request-id`).
    pub id: String,
    /// What it does.
    pub kind: OperationKind,
    /// When it was asked for, ms since the epoch.
    pub created: i64,
    /// The run it was asked of.
    pub deployment: DeploymentId,
    /// The checkpoint's or savepoint's directory, or why there is none; `None` while in
    /// progress.
    pub result: Option<Result<PathBuf, String>>,
    /// The number of the checkpoint or savepoint taken, once it was.
    #[serde(default)]
    pub checkpoint: Option<u64>,
    /// A rescale or relocation: whether the job was started again from its savepoint.
    #[serde(default)]
    pub rescaled: bool,
}

impl Operation {
    /// Whether it is over (a rescale once the job was deployed again, or failed).
    pub fn done(&self) -> bool {
        match (&self.kind, &self.result) {
            (_, None) => false,
            (kind, Some(Ok(_))) if kind.restarts() => self.rescaled,
            _ => true,
        }
    }
}

impl Job {
    fn enter(&mut self, status: JobStatus, now: i64) {
        self.status = status;
        self.timestamps.insert(status.name().to_string(), now);
        if status.is_terminal() {
            self.end_time = Some(now);
        }
        tracing::info!(
            job_id = %self.id,
            job_name = %self.submission.entry,
            status = status.name(),
            attempts = self.attempts,
            "job state changed"
        );
    }
}

/// A registered worker.
#[derive(Debug)]
pub struct Worker {
    /// What it offers.
    pub info: WorkerInfo,
    /// Where the rest API's address saw it connect from.
    pub address: String,
    /// Its link (the WebSocket task's queue).
    link: UnboundedSender<ControlMessage>,
    /// Which connection (a reconnect replaces the worker's entry).
    pub connection: u64,
    /// Whether that connection is open (a closed one gets `heartbeat.timeout` to register
    /// again before the worker is lost; nothing is deployed to it meanwhile).
    pub connected: bool,
    /// When it was last heard from, ms since the epoch.
    pub last_heartbeat: i64,
    /// Set once it said it is shutting down: nothing more is deployed to it.
    pub leaving: Option<Shutdown>,
    /// Slots of executors cancelled here whose runs no longer count (another executor of
    /// theirs ended them) until they end: nothing is placed on them before.
    pub ending: BTreeMap<DeploymentId, Vec<usize>>,
    /// Checkpoint messages of its executors' runs that came while its link was closed: sent
    /// when it registers again (those of runs still current).
    relayed: Vec<ControlMessage>,
}

/// The most checkpoint messages kept for a worker whose link is closed; beyond, the oldest
/// go (the run's checkpoints then expire, and it restarts if too many do).
const RELAYED_KEPT: usize = 10_000;

/// Why a request cannot be done: a client error (4xx) with its message.
#[derive(Debug, PartialEq)]
pub enum Refusal {
    /// 404.
    NotFound(String),
    /// 409: the job is not in a state that allows it.
    Conflict(String),
}

/// The workers and the jobs.
#[derive(Debug)]
pub struct Cluster {
    config: Configuration,
    store: Store,
    /// Workers by id.
    pub workers: BTreeMap<String, Worker>,
    /// Jobs by id.
    pub jobs: BTreeMap<String, Job>,
    /// When this control plane started, ms since the epoch.
    pub started: i64,
    random: u64,
}

impl Cluster {
    /// The cluster of a control plane started with `config`, with the jobs its store holds
    /// (those that were not done wait for their workers to report them).
    pub fn open(config: Configuration, store: Store) -> anyhow::Result<Cluster> {
        let started = now_ms();
        let (jobs, problems) = store.load::<Job>()?;
        for problem in problems {
            tracing::error!("{problem}");
        }
        let (_, timeout) = config.heartbeat();
        let mut cluster = Cluster {
            config,
            store,
            workers: BTreeMap::new(),
            jobs: BTreeMap::new(),
            started,
            random: seed(),
        };
        for mut job in jobs {
            job.restarts = Some(RestartTracker::new(
                cluster.config.restart_strategy(job.checkpointed),
            ));
            if !job.status.is_terminal() {
                // Workers retry every second: give them that on top of the timeout.
                let grace = ms(timeout) + RECONNECT_SLACK_MS;
                let waited = match job.status {
                    JobStatus::Running => {
                        job.enter(JobStatus::Reconciling, started);
                        grace
                    }
                    JobStatus::Reconciling | JobStatus::Cancelling => grace,
                    _ => 0,
                };
                job.due_ms = Some(started + waited);
                job.waiting_since = started;
            }
            cluster.jobs.insert(job.id.clone(), job);
        }
        Ok(cluster)
    }

    /// The control plane's configuration.
    pub fn config(&self) -> &Configuration {
        &self.config
    }

    /// Stores job `id`: whether it was stored. A failure is logged (the change stands in
    /// memory, and the next change of the job stores it again).
    fn store_job(&self, id: &str) -> bool {
        let Some(job) = self.jobs.get(id) else {
            return true;
        };
        match self.store.put(id, job) {
            Ok(()) => true,
            Err(error) => {
                tracing::error!("{error:#}");
                false
            }
        }
    }

    /// The runs with an executor on worker `worker` that has not finished.
    fn placed_on<'a>(&'a self, worker: &'a str) -> impl Iterator<Item = &'a Placement> {
        self.jobs
            .values()
            .filter_map(|j| j.placement.as_ref())
            .filter(move |p| p.on(worker).is_some_and(|e| e.finished.is_none()))
    }

    /// The jobs whose runs are placed on worker `worker`.
    fn jobs_on(&self, worker: &str) -> Vec<String> {
        self.placed_on(worker)
            .map(|p| p.deployment.job_id.clone())
            .collect()
    }

    /// Free slots of each worker: its slots less those its jobs' runs hold (none of a
    /// worker that is shutting down).
    pub fn free_slots(&self, worker: &str) -> Vec<usize> {
        let Some(w) = self.workers.get(worker).filter(|w| w.leaving.is_none()) else {
            return Vec::new();
        };
        // Those of runs placed there (but executors that finished), and of runs that no
        // longer count but whose executors have not ended yet.
        let held: Vec<usize> = self
            .placed_on(worker)
            .filter_map(|p| p.on(worker))
            .flat_map(|e| e.slots.iter().copied())
            .chain(w.ending.values().flatten().copied())
            .collect();
        (0..w.info.cores.len())
            .filter(|s| !held.contains(s))
            .collect()
    }

    /// Accepts a submission: stores the job and deploys it if a worker has the slots.
    pub fn submit(&mut self, submission: Submission) -> anyhow::Result<String> {
        let id = job_id(&mut self.random);
        let now = now_ms();
        let checkpointed = self.config.checkpointing()?.is_some();
        let mut config: Vec<(String, String)> = self
            .config
            .explicit()
            .into_iter()
            .filter(|(key, _)| !CLUSTER_KEYS.iter().any(|prefix| key.starts_with(prefix)))
            .collect();
        for (key, value) in &mut config {
            if key == "execution.checkpointing.dir" {
                *value = PathBuf::from(&*value).join(&id).display().to_string();
            }
        }
        let mut job = Job {
            id: id.clone(),
            submission,
            status: JobStatus::Created,
            timestamps: BTreeMap::new(),
            start_time: now,
            end_time: None,
            attempts: 0,
            placement: None,
            failures: Vec::new(),
            totals: Vec::new(),
            config,
            checkpointed,
            generation: 0,
            operations: Vec::new(),
            restarts: Some(RestartTracker::new(
                self.config.restart_strategy(checkpointed),
            )),
            due_ms: Some(now),
            waiting_since: now,
            live: None,
            parts: BTreeMap::new(),
            previous: None,
            last_checkpoints: None,
            first_record: None,
            tasks_ready: None,
        };
        job.enter(JobStatus::Created, now);
        // A job is accepted only once it is stored.
        self.store.put(&id, &job)?;
        self.jobs.insert(id.clone(), job);
        self.tick();
        Ok(id)
    }

    /// Cancels job `id`.
    pub fn cancel(&mut self, id: &str) -> Result<(), Refusal> {
        let now = now_ms();
        let job = self.jobs.get_mut(id).ok_or_else(|| no_job(id))?;
        match job.status {
            JobStatus::Created | JobStatus::Restarting => {
                job.due_ms = None;
                job.enter(JobStatus::Canceled, now);
            }
            JobStatus::Running | JobStatus::Reconciling => {
                job.enter(JobStatus::Cancelling, now);
                if let Some(placement) = job.placement.clone() {
                    self.cancel_run(&placement.deployment);
                }
            }
            JobStatus::Cancelling => return Ok(()),
            done => {
                return Err(Refusal::Conflict(format!(
                    "job {id} is {} and cannot be cancelled",
                    done.name()
                )))
            }
        }
        self.store_job(id);
        Ok(())
    }

    /// Asks job `id`'s run for a checkpoint or savepoint (and to stop or rescale with the
    /// savepoint): the trigger id.
    pub fn savepoint(
        &mut self,
        id: &str,
        kind: OperationKind,
        trigger: Option<String>,
    ) -> Result<String, Refusal> {
        let now = now_ms();
        let request = trigger.unwrap_or_else(|| job_id(&mut self.random));
        // The most one job can have: one worker's slots, or those of the workers that can
        // share a job together.
        let live = || {
            self.workers
                .values()
                .filter(|w| w.connected && w.leaving.is_none())
        };
        let one = live().map(|w| w.info.cores.len()).max().unwrap_or(0);
        let shared: usize = live()
            .filter(|w| w.info.exchange.is_some())
            .map(|w| w.info.cores.len())
            .sum();
        let most_slots = one.max(shared);
        let job = self.jobs.get_mut(id).ok_or_else(|| no_job(id))?;
        if let Some(known) = job.operations.iter().find(|o| o.id == request) {
            // A client's own trigger id, sent again: the same request.
            if known.kind == kind {
                return Ok(request);
            }
            return Err(Refusal::Conflict(format!(
                "trigger id '{request}' already names a {} request of job {id}; use another",
                known.kind.taken()
            )));
        }
        let placement = match (&job.placement, job.status) {
            (Some(placement), JobStatus::Running) => placement,
            _ => {
                return Err(Refusal::Conflict(format!(
                    "job {id} is {}; {}s are taken of running jobs",
                    job.status.name(),
                    kind.taken()
                )))
            }
        };
        if !job.checkpointed {
            return Err(Refusal::Conflict(format!(
                "job {id} takes no checkpoints, and a {} is one; set \
                 execution.checkpointing.interval and execution.checkpointing.dir on the \
                 control plane",
                kind.taken()
            )));
        }
        // Its first executor coordinates its checkpoints (in a run over several workers, the
        // one running slot 0).
        let holder = placement.first_worker();
        let worker = self
            .workers
            .get(holder)
            .filter(|w| w.connected)
            .ok_or_else(|| {
                Refusal::Conflict(format!(
                    "job {id}'s worker {holder} is reconnecting; ask again in a moment"
                ))
            })?;
        if let Some(pending) = job
            .operations
            .iter()
            .find(|o| !o.done() && o.kind.stops() && o.deployment == placement.deployment)
        {
            if kind.stops() {
                return Err(Refusal::Conflict(format!(
                    "job {id} is already being stopped or rescaled (request {})",
                    pending.id
                )));
            }
        }
        if let OperationKind::Rescale { parallelism } = kind {
            if parallelism > most_slots {
                return Err(Refusal::Conflict(format!(
                    "the cluster has no {parallelism} slots for one job (the most is \
                     {most_slots}: the largest worker's, or those of the workers with a \
                     certificate, security.ssl.internal.dir, together)"
                )));
            }
        }
        let deployment = placement.deployment.clone();
        worker
            .link
            .send(ControlMessage::Snapshot {
                deployment: deployment.clone(),
                request: request.clone(),
                take: kind.take(),
            })
            .map_err(|_| {
                Refusal::Conflict(format!(
                    "job {id}'s worker {holder} is reconnecting; ask again in a moment"
                ))
            })?;
        job.operations.push(Operation {
            id: request.clone(),
            kind,
            created: now,
            deployment,
            result: None,
            checkpoint: None,
            rescaled: false,
        });
        self.store_job(id);
        Ok(request)
    }

    /// The control plane's figures for `/metrics`: workers and slots, jobs by state, and per
    /// job its state, attempts and checkpoint counts.
    pub fn exposition(&self) -> String {
        let mut exposition = crate::exposition::Exposition::default();
        exposition.gauge(
            "weir_control_taskmanagers",
            "Registered workers.",
            &[],
            self.workers.len() as f64,
        );
        let total: usize = self.workers.values().map(|w| w.info.cores.len()).sum();
        let free: usize = self.workers.keys().map(|w| self.free_slots(w).len()).sum();
        exposition.gauge(
            "weir_control_slots",
            "Slots of the registered workers.",
            &[("state", "total")],
            total as f64,
        );
        exposition.gauge(
            "weir_control_slots",
            "Slots of the registered workers.",
            &[("state", "available")],
            free as f64,
        );
        for status in JobStatus::ALL {
            let count = self.jobs.values().filter(|j| j.status == status).count();
            exposition.gauge(
                "weir_control_jobs",
                "Jobs by state.",
                &[("status", status.name())],
                count as f64,
            );
        }
        let now = now_ms();
        // Ended jobs are counted above; their own series would only grow the scrape.
        for job in self.jobs.values().filter(|j| !j.status.is_terminal()) {
            let labels = [
                ("job_id", job.id.as_str()),
                ("job_name", job.submission.entry.as_str()),
            ];
            for status in JobStatus::ALL {
                let state = [labels[0], labels[1], ("status", status.name())];
                exposition.gauge(
                    "weir_job_status",
                    "1 for the job's state, 0 for the others.",
                    &state,
                    f64::from(u8::from(job.status == status)),
                );
            }
            exposition.counter(
                "weir_job_restarts_total",
                "Runs of the job started after its first (restarts, rescales and moves off a worker that shut down).",
                &labels,
                f64::from(job.attempts.saturating_sub(1)),
            );
            exposition.gauge(
                "weir_job_uptime_seconds",
                "Time since the job was submitted (to its end, once ended).",
                &labels,
                (job.end_time.unwrap_or(now) - job.start_time) as f64 / 1000.0,
            );
        }
        exposition.render()
    }

    /// A run's latest figures, from its executor on `worker`.
    pub fn figures(&mut self, worker: &str, deployment: &DeploymentId, figures: Box<Figures>) {
        if let Some(job) = self.jobs.get_mut(&deployment.job_id) {
            let Some(placement) = job
                .placement
                .as_ref()
                .filter(|p| p.deployment == *deployment && p.on(worker).is_some())
            else {
                return;
            };
            let (previous, live) = if placement.executors.len() > 1 {
                // Each executor's reading against its own before it, all together.
                let before = job.parts.remove(worker).map(|(_, latest)| latest);
                job.parts.insert(worker.to_string(), (before, figures));
                let previous = job
                    .parts
                    .values()
                    .filter_map(|(before, _)| before.as_deref());
                let previous = Figures::merge(previous);
                let live = Figures::merge(job.parts.values().map(|(_, latest)| &**latest));
                (Some(Box::new(previous)), Box::new(live))
            } else {
                (job.live.take(), figures)
            };
            if live.first_record_at.is_some() {
                job.first_record = live.first_record_at;
            }
            if live.ready_seconds.is_some() {
                job.tasks_ready = live.ready_seconds;
            }
            job.previous = previous;
            job.live = Some(live);
        }
    }

    /// Passes on what an executor of a run over several workers, on worker `from`, said to
    /// the run's others (`weir_engine::checkpoint::relay`): to the executor of slot 0 (the
    /// placement's first), or from it to every other. Dropped unless the run is its job's
    /// current one and `from` runs part of it: the executors of a run that is ending take no
    /// further part in its checkpoints.
    pub fn relay(&mut self, from: &str, deployment: &DeploymentId, message: CheckpointMessage) {
        let Some(placement) = self
            .current(deployment)
            .filter(|p| p.spread.is_some() && p.on(from).is_some())
        else {
            tracing::debug!(%deployment, tm_id = %from, ?message, "a checkpoint message of a run that is not running over several workers; dropped");
            return;
        };
        let leader = placement.first_worker();
        let to: Vec<&str> = if message.to_leader() {
            vec![leader]
        } else if from == leader {
            placement.workers().filter(|w| *w != leader).collect()
        } else {
            tracing::warn!(%deployment, tm_id = %from, ?message, "a message for the executors of a run from one that does not coordinate it; dropped");
            return;
        };
        let to: Vec<String> = to.into_iter().map(str::to_string).collect();
        for worker in to {
            let Some(w) = self.workers.get_mut(&worker) else {
                continue;
            };
            let relayed = ControlMessage::Checkpoint {
                deployment: deployment.clone(),
                message: message.clone(),
            };
            if w.connected {
                let _ = w.link.send(relayed);
                continue;
            }
            if w.relayed.len() == RELAYED_KEPT {
                tracing::warn!(%deployment, tm_id = %worker, "worker {worker} has been away for {RELAYED_KEPT} checkpoint messages of its runs; dropping the oldest");
                w.relayed.remove(0);
            }
            w.relayed.push(relayed);
        }
    }

    /// The placement of run `deployment`, if it is its job's current one and the job runs.
    fn current(&self, deployment: &DeploymentId) -> Option<&Placement> {
        self.jobs
            .get(&deployment.job_id)
            .filter(|job| matches!(job.status, JobStatus::Running | JobStatus::Reconciling))
            .and_then(|job| job.placement.as_ref())
            .filter(|p| p.deployment == *deployment)
    }

    /// A run answered a savepoint request.
    pub fn savepoint_done(
        &mut self,
        deployment: &DeploymentId,
        request: &str,
        result: Result<Taken, String>,
    ) {
        let Some(job) = self.jobs.get_mut(&deployment.job_id) else {
            return;
        };
        let Some(operation) = job
            .operations
            .iter_mut()
            .find(|o| o.id == request && o.deployment == *deployment && o.result.is_none())
        else {
            return;
        };
        let what = operation.kind.taken();
        match &result {
            Ok(taken) => {
                tracing::info!(job_id = %job.id, "{what} {request} completed: {}", taken.dir.display())
            }
            Err(error) => tracing::warn!(job_id = %job.id, "{what} {request} failed: {error}"),
        }
        let stop_failed = operation.kind.stops() && result.is_err();
        operation.checkpoint = result.as_ref().ok().map(|taken| taken.checkpoint);
        operation.result = Some(result.map(|taken| taken.dir));
        let id = job.id.clone();
        self.store_job(&id);
        if stop_failed {
            // The run goes on: on a worker that is shutting down it is handed on again (a
            // failed relocation's run is cancelled and restarts from its latest checkpoint).
            let relocation = OperationKind::Relocate;
            let failed_relocation = self.jobs[&id]
                .operations
                .iter()
                .any(|o| o.id == request && o.kind == relocation);
            if failed_relocation {
                self.cancel_run(deployment);
            } else {
                self.hand_on(&id);
            }
        }
    }

    /// Asks the workers of `deployment`, the current run of its job, to cancel its executors
    /// (those that have not finished).
    fn cancel_run(&self, deployment: &DeploymentId) {
        let Some(placement) = self
            .jobs
            .get(&deployment.job_id)
            .and_then(|j| j.placement.as_ref())
            .filter(|p| p.deployment == *deployment)
        else {
            return;
        };
        for executor in placement.executors.iter().filter(|e| e.finished.is_none()) {
            if let Some(worker) = self.workers.get(&executor.worker) {
                let _ = worker.link.send(ControlMessage::Cancel {
                    deployment: deployment.clone(),
                });
            }
        }
    }

    /// Worker `worker` is shutting down: nothing more is deployed to it, and each of its runs
    /// stops with a savepoint to start again elsewhere (`Shutdown::Savepoint`, for runs that
    /// checkpoint and run) or is cancelled (the others, or `Shutdown::Cancel`), unless a stop,
    /// rescale or relocation of it is under way already.
    pub fn leave(&mut self, worker: &str, shutdown: Shutdown) {
        let Some(w) = self.workers.get_mut(worker) else {
            return;
        };
        if w.leaving.is_none() {
            tracing::info!(tm_id = %worker, ?shutdown, "worker shutting down; moving its jobs");
        }
        w.leaving = Some(shutdown);
        for id in self.jobs_on(worker) {
            self.hand_on(&id);
        }
        self.release_if_idle(worker);
    }

    /// Job `id`'s run is on a worker that is shutting down: stops it with a savepoint to
    /// start it again elsewhere (`Shutdown::Savepoint`, for a run that checkpoints and runs),
    /// or cancels it — unless a stop, rescale or relocation of it is under way or done.
    fn hand_on(&mut self, id: &str) {
        let Some(job) = self.jobs.get(id) else {
            return;
        };
        let Some(placement) = job.placement.as_ref() else {
            return;
        };
        let leaving = placement.executors.iter().find_map(|e| {
            let shutdown = self.workers.get(&e.worker)?.leaving?;
            Some((e.worker.clone(), shutdown))
        });
        let Some((worker, shutdown)) = leaving else {
            return;
        };
        if !matches!(job.status, JobStatus::Running | JobStatus::Reconciling) {
            return;
        }
        // A stopping operation still pending, or whose savepoint completed: the run ends.
        let stopping = job.operations.iter().any(|o| {
            o.kind.stops()
                && o.deployment == placement.deployment
                && !matches!(o.result, Some(Err(_)))
        });
        if stopping {
            return;
        }
        let deployment = placement.deployment.clone();
        let movable = job.checkpointed && placement.running() && job.status == JobStatus::Running;
        if shutdown == Shutdown::Savepoint && movable {
            match self.savepoint(id, OperationKind::Relocate, None) {
                Ok(request) => {
                    tracing::info!(job_id = %id, "stopping the run on worker {worker} with savepoint {request} to start it again elsewhere");
                    return;
                }
                Err(refusal) => {
                    tracing::warn!(job_id = %id, "cannot move the run off worker {worker} with a savepoint ({refusal:?}); cancelling it")
                }
            }
        }
        self.cancel_run(&deployment);
    }

    /// Tells a worker that is shutting down, once none of the jobs' runs is placed on it,
    /// that it may exit.
    fn release_if_idle(&self, worker: &str) {
        let Some(w) = self.workers.get(worker).filter(|w| w.leaving.is_some()) else {
            return;
        };
        if self.placed_on(worker).next().is_none() {
            let _ = w.link.send(ControlMessage::Released);
        }
    }

    /// Ends every operation of `job`'s run `deployment` that is not done: one still waiting
    /// for its savepoint, or a rescale that will not start from its savepoint.
    fn fail_operations(job: &mut Job, deployment: &DeploymentId, why: &str) {
        for operation in &mut job.operations {
            if operation.deployment == *deployment && !operation.done() {
                let message = match operation.result {
                    None => format!(
                        "the run ended before the {} completed: {why}",
                        operation.kind.taken()
                    ),
                    Some(_) => format!(
                        "the {} did not happen: {why}",
                        operation.kind.restart_name()
                    ),
                };
                operation.result = Some(Err(message));
            }
        }
    }

    /// A worker registered (or registered again): replaces its entry, adopts the runs it
    /// reports that are still the jobs' current ones and cancels those that are not.
    pub fn register(
        &mut self,
        info: WorkerInfo,
        address: String,
        link: UnboundedSender<ControlMessage>,
        connection: u64,
        executors: Vec<ExecutorReport>,
        leaving: Option<Shutdown>,
    ) {
        let id = info.id.clone();
        tracing::info!(
            tm_id = %id,
            %address,
            slots = info.cores.len(),
            "worker registered"
        );
        let mut info = info;
        if let Some(clash) = self.exchange_clash(&info, &address) {
            tracing::error!(tm_id = %id, "worker {id} takes no part in jobs over several workers: {clash}");
            info.exchange = None;
        }
        let reported: Vec<DeploymentId> = executors.iter().map(|r| r.deployment.clone()).collect();
        // Executors still ending that it no longer reports are gone.
        let (mut ending, relayed) = self
            .workers
            .remove(&id)
            .map(|w| (w.ending, w.relayed))
            .unwrap_or_default();
        ending.retain(|deployment, _| reported.contains(deployment));
        self.workers.insert(
            id.clone(),
            Worker {
                info,
                address,
                link,
                connection,
                connected: true,
                last_heartbeat: now_ms(),
                leaving,
                ending,
                relayed: Vec::new(),
            },
        );
        // The slots of executors it runs that no run counts on are held before any report
        // is taken (one may end a run, and its restart must not land on them).
        for report in &executors {
            let current = self.jobs.get(&report.deployment.job_id).is_some_and(|j| {
                j.placement
                    .as_ref()
                    .is_some_and(|p| p.deployment == report.deployment && p.on(&id).is_some())
            });
            let live = !matches!(report.state, ExecutorState::Ended(_));
            if !current && live && !report.slots.is_empty() {
                let w = self.workers.get_mut(&id).expect("inserted above");
                w.ending
                    .insert(report.deployment.clone(), report.slots.clone());
            }
        }
        for report in executors {
            self.executor(&id, report);
        }
        // Snapshot requests a lost link or a restarted control plane may have dropped: the
        // executor answers a request id once.
        for job in self.jobs.values() {
            let Some(placement) = job.placement.as_ref().filter(|p| p.on(&id).is_some()) else {
                continue;
            };
            for operation in &job.operations {
                if operation.deployment == placement.deployment && operation.result.is_none() {
                    let _ = self.workers[&id].link.send(ControlMessage::Snapshot {
                        deployment: operation.deployment.clone(),
                        request: operation.id.clone(),
                        take: operation.kind.take(),
                    });
                }
            }
        }
        // Checkpoint messages that came for it meanwhile, in order.
        for message in relayed {
            if let ControlMessage::Checkpoint { deployment, .. } = &message {
                if self.current(deployment).is_some() {
                    let _ = self.workers[&id].link.send(message);
                }
            }
        }
        // Deployments sent on a connection the worker had already given up: send them again.
        let unstarted: Vec<String> = self
            .jobs
            .values()
            .filter(|j| {
                j.status == JobStatus::Running
                    && j.placement.as_ref().is_some_and(|p| {
                        p.on(&id)
                            .is_some_and(|e| !e.running && e.finished.is_none())
                            && !reported.contains(&p.deployment)
                    })
            })
            .map(|j| j.id.clone())
            .collect();
        for job in unstarted {
            if leaving.is_some() {
                self.run_failed(
                    &job,
                    format!("worker {id} is shutting down; the run was not deployed to it"),
                    Some(&id),
                );
                continue;
            }
            let job = &self.jobs[&job];
            let placement = job.placement.as_ref().expect("filtered above");
            let message = ControlMessage::Deploy {
                run: run_spec(job, placement),
                slots: placement.on(&id).expect("filtered above").slots.clone(),
            };
            let _ = self.workers[&id].link.send(message);
        }
        if let Some(shutdown) = leaving {
            self.leave(&id, shutdown);
        }
        self.tick();
    }

    /// A worker was heard from.
    pub fn heartbeat(&mut self, worker: &str, connection: u64) {
        if let Some(w) = self.workers.get_mut(worker) {
            if w.connection == connection {
                w.last_heartbeat = now_ms();
            }
        }
    }

    /// A worker's link closed: unless it registers again within `heartbeat.timeout` of its
    /// last heartbeat, it is lost (its executors keep running that long, and no longer).
    pub fn disconnected(&mut self, worker: &str, connection: u64) {
        let holds_runs = self.placed_on(worker).next().is_some();
        if let Some(w) = self
            .workers
            .get_mut(worker)
            .filter(|w| w.connection == connection)
        {
            w.connected = false;
            if w.leaving.is_some() && !holds_runs {
                tracing::info!(tm_id = %worker, "worker shut down");
                self.workers.remove(worker);
            } else {
                tracing::warn!(tm_id = %worker, "worker link closed; waiting for it to register again");
            }
        }
    }

    fn lose_worker(&mut self, worker: &str, cause: String) {
        tracing::warn!(tm_id = %worker, "{cause}");
        // While its link (if it still has one) can take the cancels of its runs.
        for id in self.jobs_on(worker) {
            self.run_failed(&id, cause.clone(), Some(worker));
        }
        // Dropping the link's queue closes the link: a worker still alive registers again.
        self.workers.remove(worker);
    }

    /// A worker reported one of its executors.
    pub fn executor(&mut self, worker: &str, report: ExecutorReport) {
        let current = self.jobs.get(&report.deployment.job_id).and_then(|j| {
            j.placement
                .as_ref()
                .filter(|p| p.deployment == report.deployment && p.on(worker).is_some())
                .map(|_| j.id.clone())
        });
        let link = self.workers.get(worker).map(|w| w.link.clone());
        let Some(id) = current else {
            // A run the control plane no longer counts on (its job was restarted elsewhere
            // or is gone): end it, or forget its end (and free its slots).
            let message = match report.state {
                ExecutorState::Ended(_) => {
                    if let Some(w) = self.workers.get_mut(worker) {
                        if w.ending.remove(&report.deployment).is_some() {
                            self.tick();
                        }
                    }
                    self.release_if_idle(worker);
                    ControlMessage::Forget {
                        deployment: report.deployment,
                    }
                }
                // (Its slots, if a registration reported it, are held already: `register`.)
                _ => ControlMessage::Cancel {
                    deployment: report.deployment,
                },
            };
            if let Some(link) = link {
                let _ = link.send(message);
            }
            return;
        };
        let now = now_ms();
        match report.state {
            ExecutorState::Deploying | ExecutorState::Running => {
                let job = self.jobs.get_mut(&id).expect("found above");
                let placement = job.placement.as_mut().expect("found above");
                if let Some(executor) = placement.executors.iter_mut().find(|e| e.worker == worker)
                {
                    executor.running |= report.state == ExecutorState::Running;
                    executor.heard = true;
                }
                // After a control plane restart: found again once every executor was.
                let all_heard = placement
                    .executors
                    .iter()
                    .all(|e| e.heard || e.finished.is_some());
                match job.status {
                    JobStatus::Reconciling if all_heard => {
                        job.due_ms = None;
                        job.enter(JobStatus::Running, now);
                    }
                    // A cancel asked before the control plane restarted.
                    JobStatus::Cancelling => {
                        if all_heard {
                            job.due_ms = None;
                        }
                        if let Some(link) = &link {
                            let _ = link.send(ControlMessage::Cancel {
                                deployment: report.deployment.clone(),
                            });
                        }
                    }
                    _ => {}
                }
                self.store_job(&id);
            }
            ExecutorState::Ended(outcome) => {
                let end = match outcome {
                    Outcome::Finished {
                        operators,
                        savepoint,
                        ..
                    } => {
                        // The run finishes once every executor of it did.
                        let placement = self
                            .jobs
                            .get_mut(&id)
                            .and_then(|j| j.placement.as_mut())
                            .expect("found above");
                        let executor = placement
                            .executors
                            .iter_mut()
                            .find(|e| e.worker == worker)
                            .expect("found above");
                        executor.finished = Some(operators);
                        executor.savepoint = savepoint;
                        if placement.executors.iter().any(|e| e.finished.is_none()) {
                            let stored = self.store_job(&id);
                            if let (Some(link), true) = (link, stored) {
                                let _ = link.send(ControlMessage::Forget {
                                    deployment: report.deployment,
                                });
                            }
                            self.tick();
                            self.release_if_idle(worker);
                            return;
                        }
                        RunEnd::Finished {
                            operators: merge_totals(
                                placement
                                    .executors
                                    .iter()
                                    .filter_map(|e| e.finished.as_deref()),
                            ),
                            savepoint: placement.executors.iter().find_map(|e| e.savepoint.clone()),
                        }
                    }
                    Outcome::Canceled => RunEnd::Canceled,
                    Outcome::Failed { cause } => RunEnd::Failed(cause),
                };
                let workers: Vec<String> = self.jobs[&id]
                    .placement
                    .iter()
                    .flat_map(|p| p.workers().map(str::to_string))
                    .collect();
                let stored = self.run_ended(&id, end, Some(worker));
                // Acknowledged only once stored: otherwise the worker reports it again.
                if let (Some(link), true) = (link, stored) {
                    let _ = link.send(ControlMessage::Forget {
                        deployment: report.deployment,
                    });
                }
                self.tick();
                for worker in &workers {
                    self.release_if_idle(worker);
                }
            }
        }
    }

    /// The current run of job `id` failed (on `worker`, which was lost or will not run it;
    /// or no worker reported it): cancel what is left of it and go on as its end says.
    fn run_failed(&mut self, id: &str, cause: String, worker: Option<&str>) {
        let placement = self.jobs.get(id).and_then(|j| j.placement.clone());
        let Some(placement) = placement else {
            return;
        };
        // Its executor there, if the worker is still linked; the others are cancelled as the
        // run ends.
        if let Some(w) = worker
            .filter(|w| placement.on(w).is_some())
            .and_then(|w| self.workers.get(w))
        {
            let _ = w.link.send(ControlMessage::Cancel {
                deployment: placement.deployment.clone(),
            });
        }
        self.run_ended(id, RunEnd::Failed(cause), worker);
        for executor in &placement.executors {
            self.release_if_idle(&executor.worker);
        }
    }

    /// Job `id`'s current run ended (on `worker`, if one said so): the job finishes, is
    /// cancelled, rescales, or restarts as its strategy says (or fails); its executors on
    /// other workers are cancelled, their slots held until they end. Returns whether the
    /// change was stored.
    fn run_ended(&mut self, id: &str, end: RunEnd, worker: Option<&str>) -> bool {
        let now = now_ms();
        let random = next_random(&mut self.random);
        let Some(placement) = self.jobs.get_mut(id).and_then(|j| j.placement.take()) else {
            return true;
        };
        // A worker of the run shutting down (then its cancel is why the run ended).
        let leaving_worker = placement
            .workers()
            .find(|w| self.workers.get(*w).is_some_and(|w| w.leaving.is_some()))
            .map(str::to_string);
        let leaving = leaving_worker.is_some();
        let ended_on = match (&end, leaving_worker) {
            (RunEnd::Canceled, Some(leaving)) => leaving,
            _ => worker.unwrap_or(placement.first_worker()).to_string(),
        };
        // Whatever is left of the run must not run beside its restart.
        for executor in &placement.executors {
            if executor.finished.is_some() || Some(executor.worker.as_str()) == worker {
                continue;
            }
            if let Some(w) = self.workers.get_mut(&executor.worker) {
                let _ = w.link.send(ControlMessage::Cancel {
                    deployment: placement.deployment.clone(),
                });
                // (One not reported since this control plane started is not known to run:
                // it ends the run by not being reported.)
                if executor.heard {
                    w.ending
                        .insert(placement.deployment.clone(), executor.slots.clone());
                }
            }
        }
        let job = self.jobs.get_mut(id).expect("placed above");
        job.due_ms = None;
        job.previous = None;
        job.parts.clear();
        if let Some(live) = job.live.take() {
            job.last_checkpoints = Some(live.checkpoints);
        }
        let deployment = placement.deployment.clone();
        if let RunEnd::Finished {
            operators,
            savepoint,
        } = &end
        {
            job.totals = operators.clone();
            // The stop's answer may come after the end it caused.
            if let Some(path) = savepoint {
                for operation in &mut job.operations {
                    if operation.deployment == deployment
                        && operation.kind.stops()
                        && operation.result.is_none()
                    {
                        operation.result = Some(Ok(path.clone()));
                    }
                }
            }
        }
        let failure = match &end {
            RunEnd::Finished { .. } => None,
            RunEnd::Canceled if leaving => Some(format!(
                "its worker {ended_on} is shutting down and cancelled it"
            )),
            RunEnd::Canceled => Some("its executor was cancelled".to_string()),
            RunEnd::Failed(cause) => Some(cause.clone()),
        };
        // A stop or rescale whose savepoint completed settles the run whatever else it did
        // after: its sinks committed at that savepoint, so only it may be resumed.
        let settled = job
            .operations
            .iter()
            .filter(|o| o.deployment == deployment && !o.rescaled)
            .find_map(|o| match &o.result {
                Some(Ok(path)) if o.kind.stops() => Some((o.id.clone(), o.kind, path.clone())),
                _ => None,
            });
        if job.status == JobStatus::Cancelling {
            Cluster::fail_operations(job, &deployment, "the job was cancelled");
            job.enter(JobStatus::Canceled, now);
            return self.store_job(id);
        }
        if leaving && !placement.running() && settled.is_none() && failure.is_some() {
            // It never ran, on a worker that is shutting down (cancelled, or refused there):
            // it goes elsewhere, no failure of its own.
            tracing::info!(job_id = %id, "deploying again: worker {ended_on} is shutting down");
            Cluster::fail_operations(job, &deployment, "its worker is shutting down");
            job.due_ms = Some(now);
            job.waiting_since = now;
            job.enter(JobStatus::Created, now);
            return self.store_job(id);
        }
        match settled {
            Some((request, kind, path)) if kind.restarts() => {
                let parallelism = match kind {
                    OperationKind::Rescale { parallelism } => parallelism,
                    _ => job.submission.parallelism,
                };
                let why = kind.restart_name();
                if let Some(cause) = failure {
                    job.failures.push(Failure {
                        timestamp: now,
                        cause: format!("the run failed after the savepoint of its {why}: {cause}"),
                        worker: Some(ended_on.clone()),
                    });
                }
                for operation in &mut job.operations {
                    if operation.id == request {
                        operation.rescaled = true;
                    }
                }
                Cluster::fail_operations(
                    job,
                    &deployment,
                    &format!("the run was stopped for a {why}"),
                );
                tracing::info!(job_id = %id, "starting again at parallelism {parallelism} from {} ({why})", path.display());
                job.submission.parallelism = parallelism;
                job.submission.savepoint_path = Some(path);
                job.submission.allow_non_restored_state = false;
                job.generation += 1;
                job.due_ms = Some(now);
                job.waiting_since = now;
                job.enter(JobStatus::Created, now);
            }
            Some((_, _, path)) => {
                if let Some(cause) = failure {
                    job.failures.push(Failure {
                        timestamp: now,
                        cause: format!(
                            "the run failed while stopping, after its savepoint {} completed: \
                             {cause}",
                            path.display()
                        ),
                        worker: Some(ended_on.clone()),
                    });
                }
                Cluster::fail_operations(job, &deployment, "the job stopped");
                job.enter(JobStatus::Finished, now);
            }
            None => match failure {
                None => {
                    Cluster::fail_operations(job, &deployment, "the job finished");
                    job.enter(JobStatus::Finished, now);
                }
                Some(cause) => {
                    Cluster::fail_operations(job, &deployment, &cause);
                    job.failures.push(Failure {
                        timestamp: now,
                        cause: cause.clone(),
                        worker: Some(ended_on.clone()),
                    });
                    let tracker = job.restarts.as_mut().expect("set when the job was made");
                    match tracker.on_failure(now, random) {
                        RestartDecision::RestartAfter(delay) => {
                            tracing::warn!(job_id = %id, "restarting in {delay} ms after: {cause}");
                            job.due_ms = Some(now + delay);
                            job.waiting_since = now + delay;
                            job.enter(JobStatus::Restarting, now);
                        }
                        RestartDecision::AlreadyRestarting => {
                            job.due_ms = Some(now);
                            job.waiting_since = now;
                            job.enter(JobStatus::Restarting, now);
                        }
                        RestartDecision::GiveUp(reason) => {
                            if let Some(last) = job.failures.last_mut() {
                                last.cause = format!("{cause}; not restarted: {reason}");
                            }
                            job.enter(JobStatus::Failed, now);
                        }
                    }
                }
            },
        }
        self.store_job(id)
    }

    /// Does what time decides: loses workers not heard from, restarts jobs whose run no
    /// worker reported after a control plane restart, deploys jobs waiting for slots, and
    /// fails those that waited too long.
    pub fn tick(&mut self) {
        let now = now_ms();
        let (_, timeout) = self.config.heartbeat();
        let silent: Vec<(String, bool)> = self
            .workers
            .iter()
            .filter(|(_, w)| now - w.last_heartbeat > ms(timeout))
            .map(|(id, w)| (id.clone(), w.connected))
            .collect();
        for (worker, connected) in silent {
            let how = if connected {
                "not heard from"
            } else {
                "its link closed and it did not register again"
            };
            self.lose_worker(
                &worker,
                format!(
                    "worker {worker} lost: {how} within heartbeat.timeout ({} ms)",
                    ms(timeout)
                ),
            );
        }
        let unreported: Vec<String> = self
            .jobs
            .values()
            .filter(|j| {
                matches!(j.status, JobStatus::Reconciling | JobStatus::Cancelling)
                    && j.due_ms.is_some_and(|d| d <= now)
            })
            .map(|j| j.id.clone())
            .collect();
        for id in unreported {
            self.run_failed(
                &id,
                "no worker reported the job's run within heartbeat.timeout after the control \
                 plane restarted"
                    .into(),
                None,
            );
        }
        // A savepoint not answered within the checkpoint timeout (and a minute for the
        // answer's way back) is given up; the run goes on.
        let deadline = self
            .config
            .checkpointing()
            .ok()
            .flatten()
            .map_or(600_000, |c| c.settings.timeout_ms)
            + 60_000;
        let mut overdue = Vec::new();
        for job in self.jobs.values_mut() {
            for operation in &mut job.operations {
                if operation.result.is_none() && now - operation.created > deadline {
                    operation.result = Some(Err(format!(
                        "no answer from the run within execution.checkpointing.timeout and a \
                         minute ({deadline} ms)"
                    )));
                    overdue.push(job.id.clone());
                }
            }
        }
        for id in overdue {
            self.store_job(&id);
        }
        // Restarts decided above are due from a later instant than this tick's start.
        let now = now_ms();
        let waiting: Vec<String> = self
            .jobs
            .values()
            .filter(|j| {
                matches!(j.status, JobStatus::Created | JobStatus::Restarting)
                    && j.due_ms.is_some_and(|d| d <= now)
            })
            .map(|j| j.id.clone())
            .collect();
        for id in waiting {
            self.deploy(&id, now);
        }
    }

    /// Where a run of `wanted` slots goes: its workers and their slots, in the job's slot
    /// order. Packed (`cluster.evenly-spread-out-slots` false): the first worker with enough
    /// free slots, else workers with the most free slots first; spread out: one slot at a time
    /// round the workers. Only workers with a certificate take part in a run over several
    /// (one per node name).
    fn place(&self, wanted: usize) -> Option<Vec<(String, Vec<usize>)>> {
        let open: Vec<(String, Vec<usize>)> = self
            .workers
            .iter()
            .filter(|(_, w)| w.connected && w.leaving.is_none())
            .map(|(id, _)| (id.clone(), self.free_slots(id)))
            .filter(|(_, free)| !free.is_empty())
            .collect();
        let one = || {
            open.iter()
                .find(|(_, free)| free.len() >= wanted)
                .map(|(w, free)| vec![(w.clone(), free[..wanted].to_vec())])
        };
        let spread_out = self.config.spread_out_slots();
        if !spread_out {
            if let Some(found) = one() {
                return Some(found);
            }
        }
        let mut nodes = Vec::new();
        let mut able: Vec<(String, Vec<usize>)> = open
            .iter()
            .filter(|(w, _)| {
                let Some(exchange) = &self.workers[w].info.exchange else {
                    return false;
                };
                let fresh = !nodes.contains(&exchange.node);
                nodes.push(exchange.node.clone());
                fresh
            })
            .cloned()
            .collect();
        if able.iter().map(|(_, free)| free.len()).sum::<usize>() < wanted {
            return one();
        }
        let mut counts = vec![0; able.len()];
        if spread_out {
            let mut taken = 0;
            while taken < wanted {
                for (count, (_, free)) in counts.iter_mut().zip(&able) {
                    if taken < wanted && *count < free.len() {
                        *count += 1;
                        taken += 1;
                    }
                }
            }
        } else {
            able.sort_by_key(|(_, free)| std::cmp::Reverse(free.len()));
            let mut left = wanted;
            for (count, (_, free)) in counts.iter_mut().zip(&able) {
                *count = left.min(free.len());
                left -= *count;
            }
        }
        Some(
            able.into_iter()
                .zip(counts)
                .filter(|(_, count)| *count > 0)
                .map(|((w, free), count)| (w, free[..count].to_vec()))
                .collect(),
        )
    }

    /// Why a worker registering with `info` from `address` cannot take part in runs over
    /// several workers beside those registered: another (by another id) has its node name,
    /// or data ports of its own on the same address.
    fn exchange_clash(&self, info: &WorkerInfo, address: &str) -> Option<String> {
        let exchange = info.exchange.as_ref()?;
        let host = exchange_host(exchange, address);
        let ports = |first: u16, slots: usize| {
            let first = usize::from(first);
            first..first + slots
        };
        let mine = ports(exchange.port, info.cores.len());
        self.workers
            .values()
            .filter(|w| w.info.id != info.id)
            .find_map(|other| {
                let theirs = other.info.exchange.as_ref()?;
                if theirs.node == exchange.node {
                    return Some(format!(
                        "worker {} has its node name '{}' (security.ssl.internal.node): give \
                         each worker a certificate of its own",
                        other.info.id, exchange.node
                    ));
                }
                let overlap = exchange_host(theirs, &other.address) == host
                    && ports(theirs.port, other.info.cores.len()).any(|p| mine.contains(&p));
                overlap.then(|| {
                    format!(
                        "worker {} on {host} has data ports from {} for {} slot(s), which \
                         overlap this one's from {}: give each worker on a host its own \
                         taskmanager.data.port range",
                        other.info.id,
                        theirs.port,
                        other.info.cores.len(),
                        exchange.port
                    )
                })
            })
    }

    /// Where each slot of a run over `executors` (several workers) runs: the worker's
    /// certificate name, and its address with the slot's port.
    fn slot_places(&self, executors: &[(String, Vec<usize>)]) -> Vec<SlotPlace> {
        let mut places = Vec::new();
        for (worker, slots) in executors {
            let w = &self.workers[worker];
            let exchange = w.info.exchange.as_ref().expect("placed with a certificate");
            let host = exchange_host(exchange, &w.address);
            for &slot in slots {
                let port = exchange.port.saturating_add(slot as u16);
                places.push(SlotPlace {
                    node: exchange.node.clone(),
                    addr: std::net::SocketAddr::new(host, port),
                });
            }
        }
        places
    }

    /// Deploys job `id` on free slots (see [`Cluster::place`]), or fails it when it has waited
    /// for them longer than `slot.request.timeout`.
    fn deploy(&mut self, id: &str, now: i64) {
        let job = &self.jobs[id];
        let wanted = job.submission.parallelism;
        let Some(executors) = self.place(wanted) else {
            let timeout = self.config.slot_request_timeout();
            if now - job.waiting_since > ms(timeout) {
                let free: Vec<usize> = self
                    .workers
                    .keys()
                    .map(|w| self.free_slots(w).len())
                    .collect();
                let most = free.iter().max().copied().unwrap_or(0);
                let able: usize = self
                    .workers
                    .iter()
                    .filter(|(_, w)| w.info.exchange.is_some())
                    .map(|(id, _)| self.free_slots(id).len())
                    .sum();
                let spanning = format!(
                    "; workers that can share a job (security.ssl.internal.dir set) had {able} \
                     free together"
                );
                let cause = format!(
                    "no {wanted} free slot(s) within slot.request.timeout ({} s): the most \
                     free on one worker was {most}{spanning}; start workers with more slots, \
                     free some, or submit with a lower parallelism",
                    timeout.as_secs()
                );
                let job = self.jobs.get_mut(id).expect("looked up above");
                job.failures.push(Failure {
                    timestamp: now,
                    cause,
                    worker: None,
                });
                job.due_ms = None;
                job.enter(JobStatus::Failed, now);
                self.store_job(id);
            }
            return;
        };
        let spread = (executors.len() > 1).then(|| self.slot_places(&executors));
        let job = self.jobs.get_mut(id).expect("looked up above");
        job.attempts += 1;
        let placement = Placement {
            deployment: DeploymentId {
                job_id: id.to_string(),
                attempt: job.attempts,
            },
            executors: executors
                .iter()
                .map(|(worker, slots)| ExecutorPlace {
                    worker: worker.clone(),
                    slots: slots.clone(),
                    running: false,
                    finished: None,
                    savepoint: None,
                    heard: true,
                })
                .collect(),
            spread,
        };
        let run = run_spec(job, &placement);
        job.first_record = None;
        job.tasks_ready = None;
        job.parts.clear();
        job.placement = Some(placement);
        job.due_ms = None;
        job.enter(JobStatus::Running, now);
        // Stored before it is sent: a control plane that restarts knows every run it started.
        self.store_job(id);
        for (worker, slots) in executors {
            let _ = self.workers[&worker].link.send(ControlMessage::Deploy {
                run: run.clone(),
                slots,
            });
        }
    }
}

/// Keys of the control plane and the workers themselves, not handed to a job's runs (the
/// worker sets the slots' cores and their memory, and for a run over several workers its
/// certificate and the exchange's timeouts and buffers).
const CLUSTER_KEYS: [&str; 15] = [
    "rest.",
    "heartbeat.",
    "slot.",
    "control.",
    "worker.",
    "cluster.",
    "security.",
    "taskmanager.numberOfTaskSlots",
    "taskmanager.cpu.cores",
    "taskmanager.memory.process.size",
    "taskmanager.host",
    "taskmanager.data.port",
    "taskmanager.network.connect-timeout",
    "taskmanager.network.idle-timeout",
    "taskmanager.network.udp.",
];

/// The operator counts of a run over several executors, from each one's (in stream order;
/// an operator is matched by its name and how many of that name came before it).
fn merge_totals<'a>(parts: impl Iterator<Item = &'a [OperatorTotals]>) -> Vec<OperatorTotals> {
    let mut merged: Vec<OperatorTotals> = Vec::new();
    for part in parts {
        for (i, totals) in part.iter().enumerate() {
            let nth = part[..i].iter().filter(|t| t.name == totals.name).count();
            match merged.iter_mut().filter(|t| t.name == totals.name).nth(nth) {
                Some(known) => {
                    known.parallelism += totals.parallelism;
                    known.records_in += totals.records_in;
                    known.records_out += totals.records_out;
                }
                None => merged.push(totals.clone()),
            }
        }
    }
    merged
}

/// How a run ended.
enum RunEnd {
    /// Every source ended, or it stopped with a savepoint.
    Finished {
        operators: Vec<OperatorTotals>,
        savepoint: Option<PathBuf>,
    },
    /// Its executor was cancelled.
    Canceled,
    /// It failed, or its worker was lost.
    Failed(String),
}

/// What a worker needs beyond `heartbeat.timeout` to register again: it retries every second.
const RECONNECT_SLACK_MS: i64 = 3_000;

/// Run `deployment` of `job`: its configuration with the checkpoint directory of its
/// generation and its parallelism.
fn run_spec(job: &Job, placement: &Placement) -> RunSpec {
    let mut config = job.config.clone();
    for (key, value) in &mut config {
        if key == "execution.checkpointing.dir" {
            *value = PathBuf::from(&*value)
                .join(job.generation.to_string())
                .display()
                .to_string();
        }
    }
    config.push((
        "parallelism.default".into(),
        job.submission.parallelism.to_string(),
    ));
    RunSpec {
        id: placement.deployment.clone(),
        // ("weir": the built-in package's name in jobs stored before packages were uploaded.)
        package: (![super::packages::BUILTIN, "weir"].contains(&job.submission.package.as_str()))
            .then(|| job.submission.package.clone()),
        entry: job.submission.entry.clone(),
        args: job.submission.args.clone(),
        config,
        resume: job.checkpointed,
        from_savepoint: job.submission.savepoint_path.clone(),
        allow_non_restored_state: job.submission.allow_non_restored_state,
        spread: placement.spread.clone(),
    }
}

/// The address a worker's slots are reached at: the one it names (`taskmanager.host`), else
/// the one it connects to the control plane from (`address`).
fn exchange_host(exchange: &ExchangeInfo, address: &str) -> std::net::IpAddr {
    let seen = address.parse::<std::net::SocketAddr>().map(|a| a.ip());
    exchange
        .host
        .or(seen.ok())
        .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into())
}

fn no_job(id: &str) -> Refusal {
    Refusal::NotFound(format!("no job '{id}'; GET /jobs lists the jobs"))
}

fn ms(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

pub(super) fn seed() -> u64 {
    let mut bytes = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_err()
    {
        bytes = now_ms().to_le_bytes();
    }
    u64::from_le_bytes(bytes) | 1
}

/// xorshift64*: uniform enough for job ids and restart jitter.
fn next_u64(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

fn next_random(state: &mut u64) -> f64 {
    (next_u64(state) >> 11) as f64 / (1u64 << 53) as f64
}

fn job_id(state: &mut u64) -> String {
    format!("{:016x}{:016x}", next_u64(state), next_u64(state))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

    use super::*;

    /// A cluster with no checkpointing, and `extra` keys.
    fn plain_cluster(dir: &Path, extra: &[(&str, &str)]) -> Cluster {
        let mut config = Configuration::default()
            .with("restart-strategy.type", "fixed-delay")
            .and_then(|c| c.with("restart-strategy.fixed-delay.attempts", "5"))
            .and_then(|c| c.with("restart-strategy.fixed-delay.delay", "0"))
            .unwrap();
        for (key, value) in extra {
            config = config.with(key, *value).unwrap();
        }
        Cluster::open(config, Store::open(dir).unwrap()).unwrap()
    }

    /// A worker with a certificate (node `id`, data ports from 7000).
    fn able_worker(
        cluster: &mut Cluster,
        id: &str,
        slots: usize,
    ) -> UnboundedReceiver<ControlMessage> {
        let (link, messages) = unbounded_channel();
        let info = WorkerInfo {
            // Ports of their own, on one address.
            exchange: Some(ExchangeInfo {
                node: id.into(),
                host: None,
                port: 7000 + 100 * u16::from(id.as_bytes()[0] - b'a'),
            }),
            ..worker_info(id, slots)
        };
        cluster.register(info, "10.0.0.9:1".into(), link, 1, Vec::new(), None);
        messages
    }

    fn worker_info(id: &str, slots: usize) -> WorkerInfo {
        WorkerInfo {
            id: id.into(),
            host: "host".into(),
            pid: 1,
            cores: (0..slots).collect(),
            physical_memory: 0,
            process_memory: 0,
            managed_memory: 0,
            network_memory: 0,
            heap_memory: 0,
            engine_version: "0".into(),
            exchange: None,
        }
    }

    fn cluster(dir: &Path) -> Cluster {
        let config = Configuration::default()
            .with("execution.checkpointing.interval", "1s")
            .and_then(|c| {
                c.with(
                    "execution.checkpointing.dir",
                    dir.join("chk").display().to_string(),
                )
            })
            .and_then(|c| c.with("restart-strategy.type", "fixed-delay"))
            .and_then(|c| c.with("restart-strategy.fixed-delay.attempts", "5"))
            .and_then(|c| c.with("restart-strategy.fixed-delay.delay", "0"))
            .unwrap();
        Cluster::open(config, Store::open(dir).unwrap()).unwrap()
    }

    fn worker(cluster: &mut Cluster, id: &str, slots: usize) -> UnboundedReceiver<ControlMessage> {
        let (link, messages) = unbounded_channel();
        let info = worker_info(id, slots);
        cluster.register(info, "127.0.0.1:1".into(), link, 1, Vec::new(), None);
        messages
    }

    fn submitted(cluster: &mut Cluster, parallelism: usize) -> String {
        cluster
            .submit(Submission {
                package: crate::control_plane::packages::BUILTIN.into(),
                entry: "sequence-echo".into(),
                args: Vec::new(),
                parallelism,
                savepoint_path: None,
                allow_non_restored_state: false,
            })
            .unwrap()
    }

    /// The next deployment sent, skipping other messages.
    fn deployed(messages: &mut UnboundedReceiver<ControlMessage>) -> Option<(RunSpec, Vec<usize>)> {
        while let Ok(message) = messages.try_recv() {
            if let ControlMessage::Deploy { run, slots } = message {
                return Some((run, slots));
            }
        }
        None
    }

    fn report(cluster: &mut Cluster, run: &RunSpec, state: ExecutorState) {
        report_from(cluster, "w", run, state);
    }

    fn report_from(cluster: &mut Cluster, worker: &str, run: &RunSpec, state: ExecutorState) {
        cluster.executor(worker, ExecutorReport::new(run.id.clone(), state));
    }

    fn setting<'a>(run: &'a RunSpec, key: &str) -> &'a str {
        &run.config.iter().find(|(k, _)| k == key).unwrap().1
    }

    fn failed(cause: &str) -> ExecutorState {
        ExecutorState::Ended(Outcome::Failed {
            cause: cause.into(),
        })
    }

    /// Savepoint 7, in `/sp`.
    fn sp() -> Taken {
        Taken {
            checkpoint: 7,
            dir: PathBuf::from("/sp"),
        }
    }

    /// A job at parallelism 1, running, with a rescale to 2 whose savepoint completed.
    fn rescale_answered(
        cluster: &mut Cluster,
        messages: &mut UnboundedReceiver<ControlMessage>,
    ) -> (String, RunSpec, String) {
        let job = submitted(cluster, 1);
        let (run, _) = deployed(messages).expect("deployed");
        report(cluster, &run, ExecutorState::Running);
        let request = cluster
            .savepoint(&job, OperationKind::Rescale { parallelism: 2 }, None)
            .unwrap();
        cluster.savepoint_done(&run.id, &request, Ok(sp()));
        (job, run, request)
    }

    #[test]
    fn a_rescale_starts_from_its_savepoint_in_a_new_generation_even_if_the_run_then_fails() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = cluster(dir.path());
        let mut messages = worker(&mut cluster, "w", 2);
        let (job, run, request) = rescale_answered(&mut cluster, &mut messages);
        assert!(setting(&run, "execution.checkpointing.dir").ends_with(&format!("{job}/0")));
        report(&mut cluster, &run, failed("boom while stopping"));
        let (again, slots) = deployed(&mut messages).expect("deployed again");
        assert_eq!(slots.len(), 2);
        assert_eq!(setting(&again, "parallelism.default"), "2");
        assert!(setting(&again, "execution.checkpointing.dir").ends_with(&format!("{job}/1")));
        assert_eq!(again.from_savepoint, Some(PathBuf::from("/sp")));
        assert!(
            again.resume,
            "restarts of the new run resume its own checkpoints"
        );
        let job = &cluster.jobs[&job];
        let operation = job.operations.iter().find(|o| o.id == request).unwrap();
        assert!(operation.done() && operation.result == Some(Ok(PathBuf::from("/sp"))));
        assert_eq!(job.status, JobStatus::Running);
        assert_eq!(
            job.restarts.as_ref().unwrap().restarts(),
            0,
            "not a restart"
        );
    }

    #[test]
    fn a_stop_whose_savepoint_completed_ends_the_job_whatever_the_run_did_after() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = cluster(dir.path());
        let mut messages = worker(&mut cluster, "w", 1);
        let job = submitted(&mut cluster, 1);
        let (run, _) = deployed(&mut messages).unwrap();
        report(&mut cluster, &run, ExecutorState::Running);
        let request = cluster
            .savepoint(&job, OperationKind::Stop { drain: false }, None)
            .unwrap();
        cluster.savepoint_done(&run.id, &request, Ok(sp()));
        report(&mut cluster, &run, failed("boom"));
        assert_eq!(cluster.jobs[&job].status, JobStatus::Finished);
        assert!(deployed(&mut messages).is_none(), "not restarted");
        assert!(cluster.jobs[&job].failures[0]
            .cause
            .contains("after its savepoint /sp completed"));
    }

    #[test]
    fn a_stop_answered_only_by_the_runs_end_completes_with_the_ends_savepoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = cluster(dir.path());
        let mut messages = worker(&mut cluster, "w", 1);
        let job = submitted(&mut cluster, 1);
        let (run, _) = deployed(&mut messages).unwrap();
        let request = cluster
            .savepoint(&job, OperationKind::Stop { drain: true }, None)
            .unwrap();
        let end = ExecutorState::Ended(Outcome::Finished {
            duration_ms: 1,
            operators: Vec::new(),
            savepoint: Some(PathBuf::from("/sp")),
        });
        report(&mut cluster, &run, end);
        // The answer, after the end: ignored.
        cluster.savepoint_done(&run.id, &request, Err("late".into()));
        let job = &cluster.jobs[&job];
        assert_eq!(job.status, JobStatus::Finished);
        assert_eq!(job.operations[0].result, Some(Ok(PathBuf::from("/sp"))));
    }

    #[test]
    fn a_cancel_during_a_rescale_cancels_the_job_and_fails_the_rescale() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = cluster(dir.path());
        let mut messages = worker(&mut cluster, "w", 2);
        let (job, run, request) = rescale_answered(&mut cluster, &mut messages);
        cluster.cancel(&job).unwrap();
        let end = ExecutorState::Ended(Outcome::Finished {
            duration_ms: 1,
            operators: Vec::new(),
            savepoint: Some(PathBuf::from("/sp")),
        });
        report(&mut cluster, &run, end);
        let job = &cluster.jobs[&job];
        assert_eq!(job.status, JobStatus::Canceled);
        assert!(deployed(&mut messages).is_none(), "not deployed again");
        let operation = job.operations.iter().find(|o| o.id == request).unwrap();
        assert!(matches!(&operation.result, Some(Err(e)) if e.contains("cancelled")));
    }

    #[test]
    fn a_plain_savepoint_pending_when_a_rescale_ends_the_run_fails_and_refusals_name_why() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = cluster(dir.path());
        let mut messages = worker(&mut cluster, "w", 2);
        let job = submitted(&mut cluster, 1);
        let (run, _) = deployed(&mut messages).unwrap();
        let plain = cluster
            .savepoint(&job, OperationKind::Savepoint, None)
            .unwrap();
        let too_wide = cluster.savepoint(&job, OperationKind::Rescale { parallelism: 3 }, None);
        assert!(matches!(too_wide, Err(Refusal::Conflict(m)) if m.contains("the most is 2")));
        let rescale = cluster
            .savepoint(&job, OperationKind::Rescale { parallelism: 2 }, None)
            .unwrap();
        let again = cluster.savepoint(&job, OperationKind::Stop { drain: false }, None);
        assert!(matches!(again, Err(Refusal::Conflict(m)) if m.contains(&rescale)));
        // The same trigger id again is the same request; of another kind, refused.
        assert_eq!(
            cluster.savepoint(&job, OperationKind::Savepoint, Some(plain.clone())),
            Ok(plain.clone())
        );
        let reused = cluster.savepoint(&job, OperationKind::Checkpoint, Some(plain.clone()));
        assert!(
            matches!(&reused, Err(Refusal::Conflict(m)) if m.contains("already names a savepoint")),
            "{reused:?}"
        );
        cluster.savepoint_done(&run.id, &rescale, Ok(sp()));
        report(&mut cluster, &run, failed("stopped"));
        let operation = |id: &str| {
            cluster.jobs[&job]
                .operations
                .iter()
                .find(|o| o.id == id)
                .unwrap()
                .clone()
        };
        assert!(matches!(operation(&plain).result, Some(Err(e)) if e.contains("rescale")));
        assert!(operation(&rescale).done());
    }

    /// The request id of the next snapshot request sent, skipping other messages; `take`
    /// checked.
    fn asked(messages: &mut UnboundedReceiver<ControlMessage>, wanted: Snapshot) -> String {
        while let Ok(message) = messages.try_recv() {
            if let ControlMessage::Snapshot { request, take, .. } = message {
                assert_eq!(take, wanted);
                return request;
            }
        }
        panic!("no snapshot request");
    }

    /// Whether a cancel of `run` was sent, skipping other messages.
    fn cancel_sent(messages: &mut UnboundedReceiver<ControlMessage>, run: &RunSpec) -> bool {
        std::iter::from_fn(|| messages.try_recv().ok())
            .any(|m| matches!(m, ControlMessage::Cancel { deployment } if deployment == run.id))
    }

    #[test]
    fn a_leaving_workers_run_moves_by_savepoint_or_cancel_and_nothing_more_lands_on_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = cluster(dir.path());
        let mut on_w = worker(&mut cluster, "w", 2);
        let job = submitted(&mut cluster, 1);
        let (run, _) = deployed(&mut on_w).unwrap();
        report(&mut cluster, &run, ExecutorState::Running);
        let mut on_x = worker(&mut cluster, "x", 1);

        // Savepoint: the run stops with one, and the job starts again from it on x, in a
        // new generation, with no failure; w, holding no run, is released.
        cluster.leave("w", Shutdown::Savepoint);
        assert!(cluster.free_slots("w").is_empty(), "nothing lands on w");
        let request = asked(&mut on_w, Snapshot::Stop(Stop::Suspend));
        cluster.savepoint_done(&run.id, &request, Ok(sp()));
        let end = ExecutorState::Ended(Outcome::Finished {
            duration_ms: 1,
            operators: Vec::new(),
            savepoint: Some(PathBuf::from("/sp")),
        });
        report(&mut cluster, &run, end);
        let (moved, _) = deployed(&mut on_x).expect("started again on x");
        assert_eq!(moved.from_savepoint, Some(PathBuf::from("/sp")));
        assert!(setting(&moved, "execution.checkpointing.dir").ends_with(&format!("{job}/1")));
        assert!(
            cluster.jobs[&job].failures.is_empty(),
            "a move is no failure"
        );
        assert!(released(&mut on_w));
        cluster.disconnected("w", 1);
        assert!(
            !cluster.workers.contains_key("w"),
            "gone once its link closed"
        );

        // Cancel: the run is cancelled, and the job restarts from its latest checkpoint on y,
        // naming x's shutdown.
        let mut on_y = worker(&mut cluster, "y", 1);
        report_from(&mut cluster, "x", &moved, ExecutorState::Running);
        cluster.leave("x", Shutdown::Cancel);
        assert!(cancel_sent(&mut on_x, &moved));
        report_from(
            &mut cluster,
            "x",
            &moved,
            ExecutorState::Ended(Outcome::Canceled),
        );
        let (restarted, _) = deployed(&mut on_y).expect("restarted on y");
        assert!(
            setting(&restarted, "execution.checkpointing.dir").ends_with(&format!("{job}/1")),
            "a restart, from the generation's latest checkpoint"
        );
        let cause = &cluster.jobs[&job].failures[0].cause;
        assert!(cause.contains("worker x is shutting down"), "{cause}");

        // A move whose savepoint fails cancels the run instead.
        report_from(&mut cluster, "y", &restarted, ExecutorState::Running);
        cluster.leave("y", Shutdown::Savepoint);
        let request = asked(&mut on_y, Snapshot::Stop(Stop::Suspend));
        cluster.savepoint_done(&restarted.id, &request, Err("boom".into()));
        assert!(cancel_sent(&mut on_y, &restarted));
    }

    /// Whether `released` was sent, skipping other messages.
    fn released(messages: &mut UnboundedReceiver<ControlMessage>) -> bool {
        std::iter::from_fn(|| messages.try_recv().ok()).any(|m| m == ControlMessage::Released)
    }

    #[test]
    fn a_run_that_never_ran_on_a_leaving_worker_goes_elsewhere_with_no_failure() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = cluster(dir.path());
        let mut on_w = worker(&mut cluster, "w", 1);
        let job = submitted(&mut cluster, 1);
        let (run, _) = deployed(&mut on_w).unwrap();
        let mut on_x = worker(&mut cluster, "x", 1);
        // Still deploying: nothing to take a savepoint of, so it is cancelled.
        cluster.leave("w", Shutdown::Savepoint);
        assert!(cancel_sent(&mut on_w, &run));
        report(&mut cluster, &run, ExecutorState::Ended(Outcome::Canceled));
        let (again, _) = deployed(&mut on_x).expect("deployed on x");
        assert_eq!(again.id.attempt, 2);
        let job = &cluster.jobs[&job];
        assert!(job.failures.is_empty(), "{:?}", job.failures);
        assert_eq!(
            job.restarts.as_ref().unwrap().restarts(),
            0,
            "not a restart"
        );
        assert!(released(&mut on_w));
    }

    #[test]
    fn a_silent_worker_is_lost_its_run_cancelled_and_the_job_redeployed_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = cluster(dir.path());
        let mut first = worker(&mut cluster, "w", 1);
        let job = submitted(&mut cluster, 1);
        let (run, _) = deployed(&mut first).unwrap();
        let mut second = worker(&mut cluster, "v", 1);
        // Its link closed: it gets heartbeat.timeout to come back.
        cluster.disconnected("w", 1);
        cluster.tick();
        assert_eq!(cluster.jobs[&job].status, JobStatus::Running);
        cluster.workers.get_mut("w").unwrap().last_heartbeat = 0;
        cluster.tick();
        let (again, _) = deployed(&mut second).expect("deployed on the other worker");
        assert_eq!(again.id.attempt, 2);
        assert!(std::iter::from_fn(|| first.try_recv().ok())
            .any(|m| matches!(m, ControlMessage::Cancel { deployment } if deployment == run.id)));
        assert!(cluster.jobs[&job].failures[0]
            .cause
            .contains("worker w lost"));
    }

    #[test]
    fn a_worker_registering_again_without_a_deployed_run_gets_it_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = cluster(dir.path());
        let mut lost = worker(&mut cluster, "w", 1);
        let job = submitted(&mut cluster, 1);
        let (run, _) = deployed(&mut lost).unwrap();
        // The same worker, on a new link, reporting no executor.
        let mut messages = worker(&mut cluster, "w", 1);
        let (again, _) = deployed(&mut messages).expect("sent again");
        assert_eq!(again.id, run.id);
        assert_eq!(cluster.jobs[&job].attempts, 1);
    }

    fn finished(records: u64) -> ExecutorState {
        ExecutorState::Ended(Outcome::Finished {
            duration_ms: 1,
            operators: vec![OperatorTotals {
                name: "Source".into(),
                parallelism: 1,
                records_in: 0,
                records_out: records,
            }],
            savepoint: None,
        })
    }

    #[test]
    fn a_job_wider_than_any_worker_spans_workers_with_certificates_packed_or_spread_out() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = plain_cluster(dir.path(), &[]);
        let mut on_a = able_worker(&mut cluster, "a", 3);
        let mut on_b = able_worker(&mut cluster, "b", 2);
        let mut on_c = worker(&mut cluster, "c", 4);
        // Packed: one worker while one has the slots, none of the others told.
        submitted(&mut cluster, 4);
        let (run, slots) = deployed(&mut on_c).expect("on c, which has 4");
        assert_eq!((run.spread, slots), (None, vec![0, 1, 2, 3]));
        // Then the workers with certificates, the most free first; c takes no part.
        let wide = submitted(&mut cluster, 4);
        let (run, on_a_slots) = deployed(&mut on_a).expect("on a");
        let (same, on_b_slots) = deployed(&mut on_b).expect("and on b");
        assert_eq!(run, same, "every executor gets the same run");
        assert_eq!((on_a_slots, on_b_slots), (vec![0, 1, 2], vec![0]));
        let places = run.spread.clone().expect("spread");
        let shown: Vec<(String, String)> = places
            .iter()
            .map(|p| (p.node.clone(), p.addr.to_string()))
            .collect();
        let expected = [
            ("a", "10.0.0.9:7000"),
            ("a", "10.0.0.9:7001"),
            ("a", "10.0.0.9:7002"),
            ("b", "10.0.0.9:7100"),
        ];
        assert_eq!(
            shown,
            expected
                .map(|(n, a)| (n.to_string(), a.to_string()))
                .to_vec()
        );
        assert_eq!(setting(&run, "parallelism.default"), "4");
        assert_eq!(cluster.jobs[&wide].placement.as_ref().unwrap().slots(), 4);

        // Spread out: a slot at a time round the workers.
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = plain_cluster(dir.path(), &[("cluster.evenly-spread-out-slots", "true")]);
        let mut on_a = able_worker(&mut cluster, "a", 3);
        let mut on_b = able_worker(&mut cluster, "b", 2);
        submitted(&mut cluster, 4);
        assert_eq!(deployed(&mut on_a).unwrap().1, vec![0, 1]);
        assert_eq!(deployed(&mut on_b).unwrap().1, vec![0, 1]);
        // The one slot left: a run on one worker.
        submitted(&mut cluster, 1);
        let (run, slots) = deployed(&mut on_a).expect("on a");
        assert_eq!((run.spread, slots), (None, vec![2]));
    }

    #[test]
    fn a_job_that_checkpoints_is_spread_and_its_executors_checkpoint_messages_reach_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = cluster(dir.path());
        let mut on_a = able_worker(&mut cluster, "a", 1);
        let mut on_b = able_worker(&mut cluster, "b", 1);
        let job = submitted(&mut cluster, 2);
        let (run, _) = deployed(&mut on_a).expect("slot 0 on a");
        assert!(run.resume && run.spread.is_some(), "{run:?}");
        assert_eq!(deployed(&mut on_b).unwrap().0, run);
        let relayed = |messages: &mut UnboundedReceiver<ControlMessage>| {
            let mut got = Vec::new();
            while let Ok(message) = messages.try_recv() {
                if let ControlMessage::Checkpoint {
                    deployment,
                    message,
                } = message
                {
                    assert_eq!(deployment, run.id);
                    got.push(message);
                }
            }
            got
        };
        let joined = CheckpointMessage::Joined {
            node: "b".into(),
            restored: None,
        };
        let complete = CheckpointMessage::Complete { checkpoint: 1 };
        // b's to the leader (slot 0's executor, on a); a's to the others.
        cluster.relay("b", &run.id, joined.clone());
        cluster.relay("a", &run.id, complete.clone());
        assert_eq!(relayed(&mut on_a), vec![joined.clone()]);
        assert_eq!(relayed(&mut on_b), vec![complete.clone()]);
        // Dropped: from a worker without an executor of the run, for another run, a
        // follower's to the others.
        cluster.relay("c", &run.id, joined.clone());
        let stale = DeploymentId {
            attempt: run.id.attempt + 1,
            ..run.id.clone()
        };
        cluster.relay("b", &stale, joined);
        cluster.relay("b", &run.id, complete.clone());
        assert!(relayed(&mut on_a).is_empty() && relayed(&mut on_b).is_empty());
        // Kept for a worker whose link is closed, sent when it registers again.
        let connection = cluster.workers["b"].connection;
        cluster.disconnected("b", connection);
        cluster.relay("a", &run.id, complete.clone());
        assert!(relayed(&mut on_b).is_empty());
        let mut on_b = able_worker(&mut cluster, "b", 1);
        assert_eq!(relayed(&mut on_b), vec![complete]);

        // Stopped with a savepoint, which slot 0's executor (a) reports as it finishes, before
        // b finishes: the stop is answered with it.
        report_from(&mut cluster, "a", &run, ExecutorState::Running);
        report_from(&mut cluster, "b", &run, ExecutorState::Running);
        let request = cluster
            .savepoint(&job, OperationKind::Stop { drain: false }, None)
            .unwrap();
        assert!(
            std::iter::from_fn(|| on_a.try_recv().ok())
                .any(|m| matches!(m, ControlMessage::Snapshot { .. })),
            "the stop goes to slot 0's executor"
        );
        report_from(
            &mut cluster,
            "a",
            &run,
            ExecutorState::Ended(Outcome::Finished {
                duration_ms: 1,
                operators: Vec::new(),
                savepoint: Some(PathBuf::from("/sp")),
            }),
        );
        report_from(&mut cluster, "b", &run, finished(1));
        let job = &cluster.jobs[&job];
        assert_eq!(job.status, JobStatus::Finished);
        let operation = job.operations.iter().find(|o| o.id == request).unwrap();
        assert_eq!(operation.result, Some(Ok(PathBuf::from("/sp"))));
    }

    /// A cluster; the links of its workers a and b, a slot each; a job (its id) running at
    /// parallelism 2 over both, as run.
    type OverTwo = (
        Cluster,
        UnboundedReceiver<ControlMessage>,
        UnboundedReceiver<ControlMessage>,
        String,
        RunSpec,
    );

    fn over_two(dir: &Path) -> OverTwo {
        let mut cluster = plain_cluster(dir, &[]);
        let mut on_a = able_worker(&mut cluster, "a", 1);
        let mut on_b = able_worker(&mut cluster, "b", 1);
        let job = submitted(&mut cluster, 2);
        let (run, _) = deployed(&mut on_a).unwrap();
        assert_eq!(deployed(&mut on_b).unwrap().0, run);
        (cluster, on_a, on_b, job, run)
    }

    #[test]
    fn a_failed_executor_ends_the_spread_run_and_the_restart_waits_for_the_others_slots() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cluster, mut on_a, mut on_b, job, run) = over_two(dir.path());
        report_from(&mut cluster, "a", &run, ExecutorState::Running);
        assert!(!cluster.jobs[&job].placement.as_ref().unwrap().running());
        report_from(&mut cluster, "b", &run, ExecutorState::Running);
        assert!(cluster.jobs[&job].placement.as_ref().unwrap().running());

        report_from(&mut cluster, "a", &run, failed("boom on a"));
        assert!(cancel_sent(&mut on_b, &run), "b's executor is cancelled");
        assert_eq!(cluster.jobs[&job].status, JobStatus::Restarting);
        assert!(
            deployed(&mut on_a).is_none(),
            "not restarted while b's executor still holds its slot"
        );
        assert!(cluster.free_slots("b").is_empty());
        report_from(
            &mut cluster,
            "b",
            &run,
            ExecutorState::Ended(Outcome::Canceled),
        );
        let (again, _) = deployed(&mut on_a).expect("restarted on a");
        assert_eq!(deployed(&mut on_b).expect("and on b").0, again);
        assert_eq!(again.id.attempt, 2);
        let job = &cluster.jobs[&job];
        assert_eq!(job.status, JobStatus::Running);
        assert_eq!(job.failures.len(), 1);
        assert_eq!(job.failures[0].worker.as_deref(), Some("a"));
        assert!(job.failures[0].cause.contains("boom on a"));
    }

    #[test]
    fn a_spread_run_finishes_once_every_executor_did_with_their_counts_together() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cluster, mut on_a, _, job, run) = over_two(dir.path());
        report_from(&mut cluster, "a", &run, finished(10));
        assert_eq!(cluster.jobs[&job].status, JobStatus::Running);
        assert!(
            std::iter::from_fn(|| on_a.try_recv().ok()).any(
                |m| matches!(m, ControlMessage::Forget { deployment } if deployment == run.id)
            ),
            "a's end is acknowledged"
        );
        assert!(
            !cluster.free_slots("a").is_empty(),
            "a finished executor holds no slot"
        );
        report_from(&mut cluster, "b", &run, finished(5));
        let job = &cluster.jobs[&job];
        assert_eq!(job.status, JobStatus::Finished);
        assert_eq!(
            job.totals,
            vec![OperatorTotals {
                name: "Source".into(),
                parallelism: 2,
                records_in: 0,
                records_out: 15,
            }]
        );
    }

    #[test]
    fn a_placement_stored_before_runs_spanned_workers_still_loads() {
        let stored = r#"{"deployment":{"job_id":"j","attempt":3},"worker":"w","slots":[1,2],"running":true}"#;
        let placement: Placement = serde_json::from_str(stored).unwrap();
        assert_eq!(placement.first_worker(), "w");
        assert_eq!(placement.executors[0].slots, vec![1, 2]);
        assert!(placement.running() && placement.spread.is_none());
        let again: Placement =
            serde_json::from_str(&serde_json::to_string(&placement).unwrap()).unwrap();
        assert_eq!(again, placement);
    }

    #[test]
    fn a_lost_worker_ends_the_spread_run_unless_its_executor_had_finished() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cluster, mut on_a, mut on_b, job, run) = over_two(dir.path());
        // a's executor finished: losing a changes nothing for the run, and frees nothing
        // of b's.
        report_from(&mut cluster, "a", &run, finished(10));
        cluster.workers.get_mut("a").unwrap().last_heartbeat = 0;
        cluster.tick();
        assert_eq!(cluster.jobs[&job].status, JobStatus::Running);
        assert!(!cancel_sent(&mut on_b, &run));
        // b lost while its executor runs: the run fails (b's executor is told to go, if b
        // still hears), and the job waits for slots.
        let mut on_c = able_worker(&mut cluster, "c", 1);
        let mut on_d = able_worker(&mut cluster, "d", 1);
        cluster.workers.get_mut("b").unwrap().last_heartbeat = 0;
        cluster.tick();
        assert!(cancel_sent(&mut on_b, &run));
        let (again, _) = deployed(&mut on_c).expect("restarted on c");
        assert_eq!(deployed(&mut on_d).expect("and d").0, again);
        assert!(cluster.jobs[&job].failures[0]
            .cause
            .contains("worker b lost"));
        assert!(deployed(&mut on_a).is_none());
    }

    #[test]
    fn a_leaving_workers_spread_run_is_cancelled_whole_and_the_worker_released() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cluster, mut on_a, mut on_b, job, run) = over_two(dir.path());
        report_from(&mut cluster, "a", &run, ExecutorState::Running);
        report_from(&mut cluster, "b", &run, ExecutorState::Running);
        cluster.leave("b", Shutdown::Savepoint);
        assert!(cancel_sent(&mut on_a, &run) && cancel_sent(&mut on_b, &run));
        // a's end first: the run ended because b is shutting down, and b may go.
        report_from(
            &mut cluster,
            "a",
            &run,
            ExecutorState::Ended(Outcome::Canceled),
        );
        let cause = &cluster.jobs[&job].failures[0];
        assert!(
            cause.cause.contains("worker b is shutting down"),
            "{cause:?}"
        );
        assert_eq!(cause.worker.as_deref(), Some("b"));
        assert!(released(&mut on_b));
    }

    #[test]
    fn a_worker_whose_data_ports_or_node_clash_with_anothers_runs_only_jobs_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = plain_cluster(dir.path(), &[]);
        able_worker(&mut cluster, "a", 2);
        let same_ports = WorkerInfo {
            exchange: Some(ExchangeInfo {
                node: "b".into(),
                host: None,
                port: 7001,
            }),
            ..worker_info("b", 2)
        };
        let same_node = WorkerInfo {
            exchange: Some(ExchangeInfo {
                node: "a".into(),
                host: Some("10.0.0.7".parse().unwrap()),
                port: 7000,
            }),
            ..worker_info("c", 2)
        };
        let elsewhere = WorkerInfo {
            exchange: Some(ExchangeInfo {
                node: "d".into(),
                host: Some("10.0.0.8".parse().unwrap()),
                port: 7000,
            }),
            ..worker_info("d", 2)
        };
        for info in [same_ports, same_node, elsewhere] {
            let (link, _) = unbounded_channel();
            cluster.register(info, "10.0.0.9:2".into(), link, 1, Vec::new(), None);
        }
        let able: Vec<&str> = cluster
            .workers
            .values()
            .filter(|w| w.info.exchange.is_some())
            .map(|w| w.info.id.as_str())
            .collect();
        assert_eq!(able, ["a", "d"]);
    }

    #[test]
    fn an_executor_reported_at_registration_that_no_run_counts_on_holds_its_slots_until_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = plain_cluster(dir.path(), &[]);
        let mut first = worker(&mut cluster, "w", 2);
        let stale = submitted(&mut cluster, 1);
        let (stale_run, slots) = deployed(&mut first).unwrap();
        assert_eq!(slots, vec![0]);
        let job = submitted(&mut cluster, 1);
        let (run, slots) = deployed(&mut first).unwrap();
        assert_eq!(slots, vec![1]);
        // The first job's run no longer counts (as if the control plane had forgotten it).
        let forgotten = cluster.jobs.get_mut(&stale).unwrap();
        forgotten.placement = None;
        forgotten.enter(JobStatus::Canceled, now_ms());
        // The worker registers again reporting the second job's run failed, then the first
        // job's executor, still running on slot 0: the restart must not land there.
        let (link, mut messages) = unbounded_channel();
        let reports = vec![
            ExecutorReport {
                slots: vec![1],
                ..ExecutorReport::new(run.id.clone(), failed("boom"))
            },
            ExecutorReport {
                slots: vec![0],
                ..ExecutorReport::new(stale_run.id.clone(), ExecutorState::Running)
            },
        ];
        let info = worker_info("w", 2);
        cluster.register(info, "10.0.0.9:1".into(), link, 2, reports, None);
        let sent: Vec<ControlMessage> = std::iter::from_fn(|| messages.try_recv().ok()).collect();
        let cancel = ControlMessage::Cancel {
            deployment: stale_run.id.clone(),
        };
        assert!(sent.contains(&cancel), "it is cancelled: {sent:?}");
        let restarted = sent.iter().find_map(|m| match m {
            ControlMessage::Deploy { run, slots } => Some((run.id.attempt, slots.clone())),
            _ => None,
        });
        assert_eq!(restarted, Some((2, vec![1])), "{sent:?}");
        assert_eq!(cluster.jobs[&job].attempts, 2);
        assert!(
            cluster.free_slots("w").is_empty(),
            "slot 0 waits for its end"
        );
        let ended = ExecutorReport::new(stale_run.id, ExecutorState::Ended(Outcome::Canceled));
        cluster.executor("w", ended);
        assert_eq!(cluster.free_slots("w"), vec![0]);
    }
}
