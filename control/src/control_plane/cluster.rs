//! The control plane's view of the cluster: the workers and their slots (the resource manager)
//! and one job master per job (its state, its placement, its restarts). Every change runs
//! under one lock, with no I/O but the store's small atomic writes and messages queued to the
//! workers' links; `tick` does what time decides (heartbeat timeouts, due restarts, slot
//! requests that waited too long).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::UnboundedSender;
use weir_engine::checkpoint::restart::{RestartDecision, RestartTracker};
use weir_engine::package::{DeploymentId, OperatorTotals, Outcome, RunSpec, Stop};
use weir_engine::Configuration;

use super::store::Store;
use crate::protocol::{ControlMessage, ExecutorReport, ExecutorState, WorkerInfo};

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

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

/// Where a run of a job is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    /// Which run.
    pub deployment: DeploymentId,
    /// The worker.
    pub worker: String,
    /// Its slots there.
    pub slots: Vec<usize>,
    /// Whether the executor reported its tasks running.
    pub running: bool,
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
}

/// What an asynchronous operation on a job does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum OperationKind {
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
}

/// A savepoint, stop or rescale asked for over the REST API.
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
    /// The savepoint's directory, or why there is none; `None` while in progress.
    pub result: Option<Result<PathBuf, String>>,
    /// A rescale: whether the job runs again at its new parallelism.
    #[serde(default)]
    pub rescaled: bool,
}

impl Operation {
    /// Whether it is over (a rescale once the job was deployed again, or failed).
    pub fn done(&self) -> bool {
        match (&self.kind, &self.result) {
            (_, None) => false,
            (OperationKind::Rescale { .. }, Some(Ok(_))) => self.rescaled,
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
}

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

    /// Stores job `id`; a failure is logged (the change stands in memory, and the next
    /// change of the job stores it again).
    fn store_job(&self, id: &str) {
        if let Some(job) = self.jobs.get(id) {
            if let Err(error) = self.store.put(id, job) {
                tracing::error!("{error:#}");
            }
        }
    }

    /// Free slots of each worker: its slots less those its jobs' runs hold.
    pub fn free_slots(&self, worker: &str) -> Vec<usize> {
        let Some(w) = self.workers.get(worker) else {
            return Vec::new();
        };
        let held: Vec<usize> = self
            .jobs
            .values()
            .filter_map(|j| j.placement.as_ref())
            .filter(|p| p.worker == worker)
            .flat_map(|p| p.slots.iter().copied())
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
                if let Some(placement) = &job.placement {
                    if let Some(worker) = self.workers.get(&placement.worker) {
                        let _ = worker.link.send(ControlMessage::Cancel {
                            deployment: placement.deployment.clone(),
                        });
                    }
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

    /// Asks job `id`'s run for a savepoint (and to stop or rescale with it): the trigger id.
    pub fn savepoint(&mut self, id: &str, kind: OperationKind) -> Result<String, Refusal> {
        let request = job_id(&mut self.random);
        let now = now_ms();
        let job = self.jobs.get_mut(id).ok_or_else(|| no_job(id))?;
        let placement = match (&job.placement, job.status) {
            (Some(placement), JobStatus::Running) => placement,
            _ => {
                return Err(Refusal::Conflict(format!(
                    "job {id} is {}; savepoints are taken of running jobs",
                    job.status.name()
                )))
            }
        };
        if let Some(pending) = job
            .operations
            .iter()
            .find(|o| !o.done() && o.kind != OperationKind::Savepoint)
        {
            if kind != OperationKind::Savepoint {
                return Err(Refusal::Conflict(format!(
                    "job {id} is already being stopped or rescaled (request {})",
                    pending.id
                )));
            }
        }
        let stop = match kind {
            OperationKind::Savepoint => None,
            OperationKind::Stop { drain: true } => Some(Stop::Drain),
            OperationKind::Stop { drain: false } | OperationKind::Rescale { .. } => {
                Some(Stop::Suspend)
            }
        };
        let deployment = placement.deployment.clone();
        if let Some(worker) = self.workers.get(&placement.worker) {
            let _ = worker.link.send(ControlMessage::Savepoint {
                deployment: deployment.clone(),
                request: request.clone(),
                stop,
            });
        }
        job.operations.push(Operation {
            id: request.clone(),
            kind,
            created: now,
            deployment,
            result: None,
            rescaled: false,
        });
        self.store_job(id);
        Ok(request)
    }

    /// A run answered a savepoint request.
    pub fn savepoint_done(
        &mut self,
        deployment: &DeploymentId,
        request: &str,
        result: Result<PathBuf, String>,
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
        match &result {
            Ok(path) => {
                tracing::info!(job_id = %job.id, "savepoint {request} completed: {}", path.display())
            }
            Err(error) => tracing::warn!(job_id = %job.id, "savepoint {request} failed: {error}"),
        }
        operation.result = Some(result);
        let id = job.id.clone();
        self.store_job(&id);
    }

    /// Ends every operation of `job`'s run `deployment` still waiting for its savepoint.
    fn fail_operations(job: &mut Job, deployment: &DeploymentId, why: &str) {
        for operation in &mut job.operations {
            if operation.deployment == *deployment && operation.result.is_none() {
                operation.result = Some(Err(format!(
                    "the run ended before the savepoint completed: {why}"
                )));
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
    ) {
        let id = info.id.clone();
        tracing::info!(
            tm_id = %id,
            %address,
            slots = info.cores.len(),
            "worker registered"
        );
        self.workers.insert(
            id.clone(),
            Worker {
                info,
                address,
                link,
                connection,
                connected: true,
                last_heartbeat: now_ms(),
            },
        );
        let reported: Vec<DeploymentId> = executors.iter().map(|r| r.deployment.clone()).collect();
        for report in executors {
            self.executor(&id, report);
        }
        // Deployments sent on a connection the worker had already given up: send them again.
        let unstarted: Vec<String> = self
            .jobs
            .values()
            .filter(|j| {
                j.status == JobStatus::Running
                    && j.placement.as_ref().is_some_and(|p| {
                        p.worker == id && !p.running && !reported.contains(&p.deployment)
                    })
            })
            .map(|j| j.id.clone())
            .collect();
        for job in unstarted {
            let job = &self.jobs[&job];
            let placement = job.placement.as_ref().expect("filtered above");
            let message = ControlMessage::Deploy {
                run: run_spec(job, placement.deployment.clone()),
                slots: placement.slots.clone(),
            };
            let _ = self.workers[&id].link.send(message);
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
        if let Some(w) = self
            .workers
            .get_mut(worker)
            .filter(|w| w.connection == connection)
        {
            tracing::warn!(tm_id = %worker, "worker link closed; waiting for it to register again");
            w.connected = false;
        }
    }

    fn lose_worker(&mut self, worker: &str, cause: String) {
        tracing::warn!(tm_id = %worker, "{cause}");
        let affected: Vec<String> = self
            .jobs
            .values()
            .filter(|j| j.placement.as_ref().is_some_and(|p| p.worker == worker))
            .map(|j| j.id.clone())
            .collect();
        // While its link (if it still has one) can take the cancels of its runs.
        for id in affected {
            self.run_failed(&id, cause.clone());
        }
        // Dropping the link's queue closes the link: a worker still alive registers again.
        self.workers.remove(worker);
    }

    /// A worker reported one of its executors.
    pub fn executor(&mut self, worker: &str, report: ExecutorReport) {
        let current = self.jobs.get(&report.deployment.job_id).and_then(|j| {
            j.placement
                .as_ref()
                .filter(|p| p.deployment == report.deployment && p.worker == worker)
                .map(|_| j.id.clone())
        });
        let link = self.workers.get(worker).map(|w| w.link.clone());
        let Some(id) = current else {
            // A run the control plane no longer counts on (its job was restarted elsewhere
            // or is gone): end it, or forget its end.
            let message = match report.state {
                ExecutorState::Ended(_) => ControlMessage::Forget {
                    deployment: report.deployment,
                },
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
                if let Some(placement) = &mut job.placement {
                    placement.running |= report.state == ExecutorState::Running;
                }
                match job.status {
                    JobStatus::Reconciling => {
                        job.due_ms = None;
                        job.enter(JobStatus::Running, now);
                    }
                    // A cancel asked before the control plane restarted.
                    JobStatus::Cancelling => {
                        job.due_ms = None;
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
                match outcome {
                    Outcome::Finished {
                        operators,
                        savepoint,
                        ..
                    } => {
                        let job = self.jobs.get_mut(&id).expect("found above");
                        job.placement = None;
                        job.due_ms = None;
                        job.totals = operators;
                        // The stop's answer may come after the end it caused.
                        if let Some(path) = &savepoint {
                            for operation in &mut job.operations {
                                if operation.deployment == report.deployment
                                    && operation.kind != OperationKind::Savepoint
                                    && operation.result.is_none()
                                {
                                    operation.result = Some(Ok(path.clone()));
                                }
                            }
                        }
                        let rescale = job.operations.iter_mut().find(|o| {
                            o.deployment == report.deployment
                                && matches!(o.kind, OperationKind::Rescale { .. })
                                && matches!(o.result, Some(Ok(_)))
                        });
                        match (rescale, savepoint) {
                            (Some(operation), Some(path)) => {
                                let OperationKind::Rescale { parallelism } = operation.kind else {
                                    unreachable!("matched above")
                                };
                                operation.rescaled = true;
                                job.submission.parallelism = parallelism;
                                job.submission.savepoint_path = Some(path);
                                job.submission.allow_non_restored_state = false;
                                job.generation += 1;
                                job.due_ms = Some(now);
                                job.waiting_since = now;
                                job.enter(JobStatus::Created, now);
                            }
                            _ => {
                                Cluster::fail_operations(job, &report.deployment, "it finished");
                                job.enter(JobStatus::Finished, now);
                            }
                        }
                        self.store_job(&id);
                    }
                    Outcome::Canceled => {
                        let job = self.jobs.get_mut(&id).expect("found above");
                        if matches!(job.status, JobStatus::Cancelling) {
                            Cluster::fail_operations(job, &report.deployment, "it was cancelled");
                            job.placement = None;
                            job.due_ms = None;
                            job.enter(JobStatus::Canceled, now);
                            self.store_job(&id);
                        } else {
                            self.run_failed(&id, "its executor was cancelled".into());
                        }
                    }
                    Outcome::Failed { cause } => self.run_failed(&id, cause),
                }
                if let Some(link) = link {
                    let _ = link.send(ControlMessage::Forget {
                        deployment: report.deployment,
                    });
                }
                self.tick();
            }
        }
    }

    /// The current run of job `id` failed: restart it as its strategy says, or fail it.
    fn run_failed(&mut self, id: &str, cause: String) {
        let now = now_ms();
        let random = next_random(&mut self.random);
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        let placement = job.placement.take();
        if let Some(placement) = &placement {
            Cluster::fail_operations(job, &placement.deployment, &cause);
            // Whatever is left of the run must not run beside its restart.
            if let Some(worker) = self.workers.get(&placement.worker) {
                let _ = worker.link.send(ControlMessage::Cancel {
                    deployment: placement.deployment.clone(),
                });
            }
        }
        let worker = placement.map(|p| p.worker);
        job.failures.push(Failure {
            timestamp: now,
            cause: cause.clone(),
            worker,
        });
        if job.status == JobStatus::Cancelling {
            job.due_ms = None;
            job.enter(JobStatus::Canceled, now);
        } else {
            let tracker = job.restarts.as_mut().expect("set when the job was made");
            match tracker.on_failure(now, random) {
                RestartDecision::RestartAfter(delay) => {
                    tracing::warn!(job_id = %id, "restarting in {delay} ms after: {cause}");
                    job.due_ms = Some(now + delay);
                    job.waiting_since = now + delay;
                    job.enter(JobStatus::Restarting, now);
                }
                RestartDecision::AlreadyRestarting => {
                    job.waiting_since = *job.due_ms.get_or_insert(now);
                    job.enter(JobStatus::Restarting, now);
                }
                RestartDecision::GiveUp(reason) => {
                    if let Some(last) = job.failures.last_mut() {
                        last.cause = format!("{cause}; not restarted: {reason}");
                    }
                    job.due_ms = None;
                    job.enter(JobStatus::Failed, now);
                }
            }
        }
        self.store_job(id);
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
            );
        }
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

    /// Deploys job `id` on the first worker with enough free slots, or fails it when it has
    /// waited for them longer than `slot.request.timeout`.
    fn deploy(&mut self, id: &str, now: i64) {
        let job = &self.jobs[id];
        let wanted = job.submission.parallelism;
        let found = self
            .workers
            .iter()
            .filter(|(_, w)| w.connected)
            .find_map(|(w, _)| {
                let free = self.free_slots(w);
                (free.len() >= wanted).then(|| (w.clone(), free[..wanted].to_vec()))
            });
        let Some((worker, slots)) = found else {
            let timeout = self.config.slot_request_timeout();
            if now - job.waiting_since > ms(timeout) {
                let most = self
                    .workers
                    .keys()
                    .map(|w| self.free_slots(w).len())
                    .max()
                    .unwrap_or(0);
                let cause = format!(
                    "no worker had {wanted} free slot(s) within slot.request.timeout ({} s); \
                     the most free on one worker was {most}: start a worker with more slots, \
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
        let job = self.jobs.get_mut(id).expect("looked up above");
        job.attempts += 1;
        let deployment = DeploymentId {
            job_id: id.to_string(),
            attempt: job.attempts,
        };
        let run = run_spec(job, deployment.clone());
        job.placement = Some(Placement {
            deployment,
            worker: worker.clone(),
            slots: slots.clone(),
            running: false,
        });
        job.due_ms = None;
        job.enter(JobStatus::Running, now);
        // Stored before it is sent: a control plane that restarts knows every run it started.
        self.store_job(id);
        let _ = self.workers[&worker]
            .link
            .send(ControlMessage::Deploy { run, slots });
    }
}

/// Keys of the control plane and the workers themselves, not handed to a job's runs (the
/// worker sets the slots' cores and their memory).
const CLUSTER_KEYS: [&str; 8] = [
    "rest.",
    "heartbeat.",
    "slot.",
    "control.",
    "worker.",
    "taskmanager.numberOfTaskSlots",
    "taskmanager.cpu.cores",
    "taskmanager.memory.process.size",
];

/// What a worker needs beyond `heartbeat.timeout` to register again: it retries every second.
const RECONNECT_SLACK_MS: i64 = 3_000;

/// Run `deployment` of `job`: its configuration with the checkpoint directory of its
/// generation and its parallelism.
fn run_spec(job: &Job, deployment: DeploymentId) -> RunSpec {
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
        id: deployment,
        entry: job.submission.entry.clone(),
        args: job.submission.args.clone(),
        config,
        resume: job.checkpointed,
        from_savepoint: job.submission.savepoint_path.clone(),
        allow_non_restored_state: job.submission.allow_non_restored_state,
    }
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
