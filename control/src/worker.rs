//! `weir worker`: the agent of one server. It registers one slot per pinned core with the
//! control plane, heartbeats, and runs each deployed job in an executor process of its own
//! (the job's package, started with a deployment descriptor), which it supervises and reports
//! on. Executors outlive a lost control plane (the worker reconnects and reports them again)
//! but not their worker: each is started with a parent-death signal.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use weir_engine::checkpoint::{CheckpointMessage, Taken};
use weir_engine::monitor::Figures;
use weir_engine::package::{
    Deployment, DeploymentId, ExecutorCommand, ExecutorEvent, Outcome, RunSpec, ENGINE_VERSION,
    PROTOCOL_VERSION as EXECUTOR_PROTOCOL,
};
use weir_engine::{Configuration, StreamEnvironment};

use crate::endpoint::{hostname, Connect, ControlEndpoint, NodeIdentity};
use crate::exposition::Exposition;

use crate::protocol::{
    ControlMessage, ExchangeInfo, ExecutorReport, ExecutorState, Shutdown, WorkerInfo,
    WorkerMessage, PACKAGES_PATH, PROTOCOL_VERSION, WORKERS_PATH,
};

/// How long an executor asked to cancel may take before it is killed.
const CANCEL_GRACE: Duration = Duration::from_secs(30);

/// What a stopping worker gives the control plane, after its last executor was killed, to
/// acknowledge the runs' ends before it exits anyway.
const EXIT_SLACK: Duration = Duration::from_secs(10);

/// How much longer than a stopping worker's own limit systemd is asked to wait, so that the
/// worker's exit, not systemd's SIGKILL, ends the stop.
const SYSTEMD_MARGIN: Duration = Duration::from_secs(10);

/// How long one attempt to reach and register with the control plane may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The file descriptor executors write their events to.
const EVENTS_FD: i32 = 3;

/// One executor process.
struct Executor {
    state: ExecutorState,
    /// Its standard input (commands); `None` once it ended.
    commands: Option<ChildStdin>,
    /// A pidfd of the process, which signals only it even after it was reaped and its pid
    /// reused; `None` for a run that never started.
    process: Option<OwnedFd>,
    /// Its slots.
    slots: Vec<usize>,
    /// When it was asked to cancel.
    cancelled: Option<Instant>,
    /// What the run's other executors said while this one waited for its package: written
    /// to it once it starts.
    held: Vec<ExecutorCommand>,
}

/// The worker's state: its slots and its executors.
struct Agent {
    info: WorkerInfo,
    data_dir: PathBuf,
    executors: BTreeMap<DeploymentId, Executor>,
    /// Executor threads report here.
    events: mpsc::UnboundedSender<Report>,
    /// What `/metrics` shows: the running executors' latest figures.
    figures: Arc<Mutex<Shown>>,
    /// The control plane (uploaded packages are fetched from it).
    control: ControlEndpoint,
    /// Where fetched packages are kept.
    packages_dir: PathBuf,
    /// Packages being fetched, and the runs waiting for them.
    fetching: std::collections::BTreeSet<String>,
    waiting: BTreeMap<DeploymentId, (RunSpec, Vec<usize>)>,
    /// `worker.shutdown.mode` and `worker.shutdown.timeout`.
    shutdown: Shutdown,
    shutdown_timeout: Duration,
    /// Since when it is shutting down (SIGTERM), handing its jobs to the control plane.
    leaving: Option<Instant>,
    /// The control plane said, on the current link, that no run is placed here any more.
    released: bool,
    /// What a run over several workers' executors get from this worker's configuration
    /// (its certificate, the exchange's timeouts and buffers); `None`: it has no certificate.
    exchange_keys: Option<Vec<(String, String)>>,
}

/// The worker's figures for `/metrics`.
#[derive(Clone, Default)]
struct Shown {
    tm_id: String,
    slots: usize,
    /// Per running executor: its job's name, its slots and its latest figures.
    runs: BTreeMap<DeploymentId, (String, usize, Option<Box<Figures>>)>,
}

impl Shown {
    fn render(&self) -> String {
        let mut exposition = Exposition::default();
        let tm = [("tm_id", self.tm_id.as_str())];
        exposition.gauge(
            "weir_worker_slots",
            "Slots (pinned cores) of the worker.",
            &tm,
            self.slots as f64,
        );
        exposition.gauge(
            "weir_worker_slots_in_use",
            "Slots of the worker its executors hold.",
            &tm,
            self.runs
                .values()
                .map(|(_, slots, _)| *slots)
                .sum::<usize>() as f64,
        );
        exposition.gauge(
            "weir_worker_executors",
            "Executor processes the worker runs.",
            &tm,
            self.runs.len() as f64,
        );
        for (deployment, (job_name, _, figures)) in &self.runs {
            // One run per job: a newer attempt's executor may start here before an older
            // one's cancel took effect, and both would give the same series.
            let newest = self
                .runs
                .range(deployment..)
                .nth(1)
                .is_none_or(|(next, _)| next.job_id != deployment.job_id);
            if let (Some(figures), true) = (figures, newest) {
                exposition.job_figures(&deployment.job_id, job_name, &self.tm_id, figures);
            }
        }
        exposition.render()
    }
}

/// What an executor's supervising thread tells the worker.
enum Report {
    /// The executor's new state.
    State(DeploymentId, ExecutorState),
    /// Its job's latest figures.
    Figures(DeploymentId, Box<Figures>),
    /// A package was fetched (or not).
    Fetched {
        package: String,
        result: Result<(), String>,
    },
    /// The answer to a checkpoint or savepoint request.
    Snapshot {
        deployment: DeploymentId,
        request: String,
        result: Result<Taken, String>,
    },
    /// For the other executors of its run.
    Checkpoint {
        deployment: DeploymentId,
        message: CheckpointMessage,
    },
}

type Link =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Runs the worker until SIGINT or SIGTERM, which cancel its executors first.
pub fn serve(config: Configuration, control: String) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(run(config, control));
    // A package download a cancelled run waited for must not hold the exit.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

fn worker_info(config: &Configuration) -> Result<WorkerInfo> {
    let cores = match config.cores() {
        Some(cores) => cores,
        None => (0..StreamEnvironment::new(config.clone())?.slots()).collect(),
    };
    let budget = config.worker_budget(cores.len())?;
    let host = hostname();
    let pid = std::process::id();
    let exchange = exchange_info(config, cores.len(), &host)?;
    Ok(WorkerInfo {
        exchange,
        id: format!("{host}-{pid}-{:x}", crate::control_plane::nonce()),
        host,
        pid,
        cores,
        physical_memory: physical_memory(),
        process_memory: budget.config.process_size,
        managed_memory: budget.managed_total,
        network_memory: budget.network_total,
        heap_memory: budget.heap_total,
        engine_version: ENGINE_VERSION.to_string(),
    })
}

async fn run(config: Configuration, control: String) -> Result<()> {
    let info = worker_info(&config)?;
    let data_dir = config.worker_data_dir().join("deployments");
    std::fs::create_dir_all(&data_dir).with_context(|| {
        format!(
            "cannot create {}; set worker.data-dir to a writable directory",
            data_dir.display()
        )
    })?;
    let (events, mut executor_events) = mpsc::unbounded_channel();
    config.check()?;
    let (interval, timeout) = config.heartbeat();
    let endpoint = ControlEndpoint::from_config(&config, &control)?;
    let figures = Arc::new(Mutex::new(Shown {
        tm_id: info.id.clone(),
        slots: info.cores.len(),
        runs: BTreeMap::new(),
    }));
    let (host, port) = config.metrics_endpoint();
    let listener = tokio::net::TcpListener::bind((host.as_str(), port))
        .await
        .with_context(|| {
            format!(
                "cannot serve /metrics on {host}:{port}; set metrics.reporter.prom.host and \
                 metrics.reporter.prom.port to a free address"
            )
        })?;
    tracing::info!(
        tm_id = %info.id,
        "weir worker {}: metrics on http://{}/metrics",
        info.id,
        listener.local_addr()?
    );
    let shown = Arc::clone(&figures);
    let metrics = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            // Rendered outside the lock, which the worker's loop takes.
            let text = shown
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .render();
            async move {
                (
                    [(axum::http::header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
                    text,
                )
            }
        }),
    );
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, metrics).await {
            tracing::error!("the worker's /metrics stopped: {error}");
        }
    });
    let packages_dir = config.worker_data_dir().join("packages");
    std::fs::create_dir_all(&packages_dir)
        .with_context(|| format!("cannot create {}", packages_dir.display()))?;
    let mut agent = Agent {
        info,
        data_dir,
        executors: BTreeMap::new(),
        events,
        figures,
        control: endpoint.clone(),
        packages_dir,
        fetching: Default::default(),
        waiting: BTreeMap::new(),
        shutdown: Shutdown::of(&config),
        shutdown_timeout: config.worker_shutdown().1,
        leaving: None,
        released: false,
        exchange_keys: None,
    };
    agent.exchange_keys = exchange_keys(&config, &agent.info);
    tracing::info!(
        tm_id = %agent.info.id,
        "weir worker {}: {} slot(s) on cores {:?}, control plane {control}",
        agent.info.id,
        agent.info.cores.len(),
        agent.info.cores
    );
    let mut link: Option<Link> = None;
    let mut heard = Instant::now();
    let mut silence_limit = timeout;
    let mut heartbeats = tokio::time::interval(interval);
    let mut retries = tokio::time::interval(Duration::from_secs(1));
    let mut last_problem = String::new();
    let mut registered_once = false;
    let mut answers: Vec<WorkerMessage> = Vec::new();
    let mut stop = crate::signals::stop_signals()?;
    let mut stopping = tokio::time::interval(Duration::from_secs(1));
    stopping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Serving: its /metrics answers and it registers with the control plane (a systemd start
    // does not wait for a control plane that may be down).
    crate::notify::ready(&format!(
        "{} slot(s); connecting to the control plane at {control}",
        agent.info.cores.len()
    ));
    loop {
        tokio::select! {
            _ = retries.tick(), if link.is_none() => {
                let attempt = tokio::time::timeout(CONNECT_TIMEOUT, connect(&endpoint, &agent));
                let outcome = attempt.await.unwrap_or_else(|_| {
                    Err(Connect::Failed(format!("no registration within {CONNECT_TIMEOUT:?}")))
                });
                match outcome {
                    Ok((connected, interval, timeout)) => {
                        tracing::info!(tm_id = %agent.info.id, "weir worker {}: registered with {control}", agent.info.id);
                        crate::notify::notify(&format!("STATUS=registered with {control}; {} slot(s)", agent.info.cores.len()));
                        link = Some(connected);
                        agent.released = false;
                        heard = Instant::now();
                        silence_limit = timeout;
                        heartbeats = tokio::time::interval(interval);
                        last_problem.clear();
                        registered_once = true;
                        flush(&mut link, &mut answers).await;
                    }
                    // At start, a refusal is a setting to fix; later (a token or version
                    // changed under a running worker) its executors are worth more than an
                    // exit, so it keeps trying.
                    Err(Connect::Refused(reason)) if !registered_once => bail!("the control plane at {control} refused this worker: {reason}"),
                    Err(Connect::Refused(reason)) => {
                        if reason != last_problem {
                            tracing::warn!(tm_id = %agent.info.id, "weir worker {}: the control plane at {control} refuses this worker now: {reason}; retrying every second", agent.info.id);
                            last_problem = reason;
                        }
                    }
                    Err(Connect::Failed(problem)) => {
                        if problem != last_problem {
                            tracing::warn!(tm_id = %agent.info.id, "weir worker {}: cannot reach the control plane at {control} ({problem}); retrying every second", agent.info.id);
                            last_problem = problem;
                        }
                    }
                }
            }
            incoming = next_message(&mut link) => {
                match incoming {
                    Some(message) => {
                        heard = Instant::now();
                        agent.handle(message, &mut link).await;
                    }
                    None => {
                        tracing::warn!(tm_id = %agent.info.id, "weir worker {}: lost the control plane at {control}; reconnecting", agent.info.id);
                        crate::notify::notify(&format!("STATUS=lost the control plane at {control}; reconnecting"));
                        link = None;
                    }
                }
            }
            Some(report) = executor_events.recv() => match report {
                Report::State(deployment, state) => agent.update(deployment, state, &mut link).await,
                Report::Fetched { package, result } => agent.fetched(package, result, &mut link).await,
                Report::Figures(deployment, figures) => {
                    if let Some(run) = agent.shown().runs.get_mut(&deployment) {
                        run.2 = Some(figures.clone());
                    }
                    send(&mut link, &WorkerMessage::Figures { deployment, figures }).await;
                }
                Report::Snapshot { deployment, request, result } => {
                    // Kept until a link takes it (a lost link's answers go after the next
                    // registration).
                    answers.push(WorkerMessage::Snapshot { deployment, request, result });
                    flush(&mut link, &mut answers).await;
                }
                Report::Checkpoint { deployment, message } => {
                    // In order with the answers, and kept like them over a lost link.
                    answers.push(WorkerMessage::Checkpoint { deployment, message });
                    flush(&mut link, &mut answers).await;
                }
            },
            _ = heartbeats.tick() => {
                agent.kill_overdue();
                if link.is_none() && heard.elapsed() > silence_limit {
                    // The control plane fails this worker's jobs over after the same time:
                    // they must not run twice.
                    agent.cancel_all(&format!("no control plane for {silence_limit:?}"));
                }
                if link.is_some() {
                    if heard.elapsed() > silence_limit {
                        tracing::warn!(tm_id = %agent.info.id, "weir worker {}: no word from the control plane for {silence_limit:?}; reconnecting", agent.info.id);
                        link = None;
                    } else {
                        send(&mut link, &WorkerMessage::Heartbeat).await;
                    }
                }
            }
            _ = stop.recv() => {
                if agent.leaving.is_none() {
                    agent.leave(&mut link).await;
                    if link.is_none() {
                        // No control plane to hand the jobs to: it restarts them from their
                        // checkpoints when it finds the worker gone.
                        agent.cancel_all("the worker stops without a control plane");
                    }
                } else {
                    agent.cancel_all("a second stop signal");
                }
            }
            _ = stopping.tick(), if agent.leaving.is_some() => {}
        }
        // Checkpoint messages of runs being cancelled hold nothing up: only savepoint answers.
        let answered = !answers
            .iter()
            .any(|answer| matches!(answer, WorkerMessage::Snapshot { .. }));
        if agent.may_exit(link.is_some(), answered) {
            tracing::info!(tm_id = %agent.info.id, "weir worker {}: stopped", agent.info.id);
            return Ok(());
        }
    }
}

async fn connect(
    control: &ControlEndpoint,
    agent: &Agent,
) -> Result<(Link, Duration, Duration), Connect> {
    let failed = |e: &dyn std::fmt::Display| Connect::Failed(e.to_string());
    let mut link = control.websocket(WORKERS_PATH).await?;
    let register = WorkerMessage::Register {
        protocol: PROTOCOL_VERSION,
        worker: agent.info.clone(),
        executors: agent.reports(),
        leaving: agent.leaving.map(|_| agent.shutdown),
    };
    link.send(text(&register)).await.map_err(|e| failed(&e))?;
    let answer = tokio::time::timeout(Duration::from_secs(10), link.next())
        .await
        .map_err(|_| Connect::Failed("no answer to the registration in 10 s".into()))?;
    match answer {
        Some(Ok(Message::Text(answer))) => match serde_json::from_str(answer.as_str()) {
            Ok(ControlMessage::Registered {
                heartbeat_interval_ms,
                heartbeat_timeout_ms,
            }) => Ok((
                link,
                Duration::from_millis(heartbeat_interval_ms),
                Duration::from_millis(heartbeat_timeout_ms),
            )),
            Ok(ControlMessage::Refused { reason }) => Err(Connect::Refused(reason)),
            Ok(other) => Err(Connect::Failed(format!(
                "unexpected first answer {other:?}"
            ))),
            Err(error) => Err(Connect::Refused(format!(
                "its answer does not parse ({error}): {answer}"
            ))),
        },
        Some(Err(e)) => Err(failed(&e)),
        _ => Err(Connect::Failed("closed before answering".into())),
    }
}

fn text(message: &WorkerMessage) -> Message {
    Message::Text(serde_json::to_string(message).expect("serializable").into())
}

async fn send(link: &mut Option<Link>, message: &WorkerMessage) {
    if let Some(connected) = link {
        if connected.send(text(message)).await.is_err() {
            *link = None;
        }
    }
}

/// Sends the savepoint answers and checkpoint messages waiting for a link, keeping those it
/// could not send.
async fn flush(link: &mut Option<Link>, answers: &mut Vec<WorkerMessage>) {
    while let Some(answer) = answers.first() {
        send(link, answer).await;
        if link.is_none() {
            return;
        }
        answers.remove(0);
    }
}

/// The next control message; `None` when the link broke. Pending forever without a link.
async fn next_message(link: &mut Option<Link>) -> Option<ControlMessage> {
    let Some(connected) = link else {
        return std::future::pending().await;
    };
    loop {
        match connected.next().await? {
            Ok(Message::Text(text)) => match serde_json::from_str(text.as_str()) {
                Ok(message) => return Some(message),
                Err(error) => {
                    tracing::warn!(
                        "ignoring a control message that does not parse ({error}): {text}"
                    );
                }
            },
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

impl Agent {
    fn reports(&self) -> Vec<ExecutorReport> {
        self.executors
            .iter()
            .map(|(deployment, e)| ExecutorReport {
                deployment: deployment.clone(),
                state: e.state.clone(),
                slots: e.slots.clone(),
            })
            .collect()
    }

    async fn handle(&mut self, message: ControlMessage, link: &mut Option<Link>) {
        match message {
            ControlMessage::Heartbeat
            | ControlMessage::Registered { .. }
            | ControlMessage::Refused { .. } => {}
            ControlMessage::Released => self.released = true,
            ControlMessage::Deploy { run, slots } => {
                let deployment = run.id.clone();
                if self.leaving.is_some() && !self.executors.contains_key(&deployment) {
                    let cause = format!("worker {} is shutting down", self.info.id);
                    self.ended(deployment, Outcome::Failed { cause }, link)
                        .await;
                    return;
                }
                if let Some(executor) = self.executors.get(&deployment) {
                    // Sent again (the control plane restarted, or the first one was lost):
                    // say where it is.
                    let state = executor.state.clone();
                    let report = ExecutorReport::new(deployment, state);
                    send(link, &WorkerMessage::Executor(report)).await;
                    return;
                }
                let busy: Vec<usize> = self
                    .executors
                    .values()
                    .filter(|e| !matches!(e.state, ExecutorState::Ended(_)))
                    .flat_map(|e| e.slots.iter().copied())
                    .filter(|s| slots.contains(s))
                    .collect();
                if !busy.is_empty() {
                    let cause = format!(
                        "slots {busy:?} of worker {} still run another job's executor",
                        self.info.id
                    );
                    self.ended(deployment, Outcome::Failed { cause }, link)
                        .await;
                    return;
                }
                match &run.package {
                    // An uploaded package this worker has not run yet: fetched off the
                    // loop, the run holding its slots meanwhile.
                    Some(package) if !self.package_path(package).exists() => {
                        self.executors.insert(
                            deployment.clone(),
                            Executor {
                                state: ExecutorState::Deploying,
                                commands: None,
                                process: None,
                                slots: slots.clone(),
                                cancelled: None,
                                held: Vec::new(),
                            },
                        );
                        self.fetch(run, slots);
                        let state = ExecutorState::Deploying;
                        send(
                            link,
                            &WorkerMessage::Executor(ExecutorReport::new(deployment, state)),
                        )
                        .await;
                    }
                    _ => self.launch(run, slots, link).await,
                }
            }
            ControlMessage::Cancel { deployment } => {
                if let Some(executor) = self.executors.get_mut(&deployment) {
                    if executor.cancel() {
                        let state = executor.state.clone();
                        let report = ExecutorReport::new(deployment, state);
                        send(link, &WorkerMessage::Executor(report)).await;
                    }
                }
            }
            ControlMessage::Snapshot {
                deployment,
                request,
                take,
            } => {
                let sent = self.executors.get_mut(&deployment).is_some_and(|e| {
                    e.command(&ExecutorCommand::Snapshot {
                        request: request.clone(),
                        take,
                    })
                });
                if !sent {
                    let result = Err(format!("run {deployment} is not running on this worker"));
                    send(
                        link,
                        &WorkerMessage::Snapshot {
                            deployment,
                            request,
                            result,
                        },
                    )
                    .await;
                }
            }
            ControlMessage::Checkpoint {
                deployment,
                message,
            } => {
                // An executor that is gone no longer takes part: its run is ending.
                if let Some(executor) = self.executors.get_mut(&deployment) {
                    let command = ExecutorCommand::Checkpoint { message };
                    let fetching = executor.process.is_none()
                        && !matches!(executor.state, ExecutorState::Ended(_));
                    if fetching {
                        executor.held.push(command);
                    } else {
                        executor.command(&command);
                    }
                }
            }
            ControlMessage::Forget { deployment } => {
                if self
                    .executors
                    .get(&deployment)
                    .is_some_and(|e| matches!(e.state, ExecutorState::Ended(_)))
                {
                    self.executors.remove(&deployment);
                }
            }
        }
    }

    /// Starts run `run` on `slots` and reports it.
    async fn launch(&mut self, run: RunSpec, slots: Vec<usize>, link: &mut Option<Link>) {
        let deployment = run.id.clone();
        match self.start(run, &slots) {
            Ok(()) => {
                let state = ExecutorState::Deploying;
                send(
                    link,
                    &WorkerMessage::Executor(ExecutorReport::new(deployment, state)),
                )
                .await;
            }
            Err(error) => {
                let cause = format!("{error:#}");
                self.ended(deployment, Outcome::Failed { cause }, link)
                    .await;
            }
        }
    }

    /// Records and reports a run that ended without (or before) its executor.
    async fn ended(&mut self, deployment: DeploymentId, outcome: Outcome, link: &mut Option<Link>) {
        let state = ExecutorState::Ended(outcome);
        self.executors.insert(
            deployment.clone(),
            Executor {
                state: state.clone(),
                commands: None,
                process: None,
                slots: Vec::new(),
                cancelled: None,
                held: Vec::new(),
            },
        );
        send(
            link,
            &WorkerMessage::Executor(ExecutorReport::new(deployment, state)),
        )
        .await;
    }

    /// Where uploaded package `id` is kept on this worker.
    fn package_path(&self, id: &str) -> PathBuf {
        self.packages_dir.join(id)
    }

    /// Makes run `run` wait for its package, fetching it from the control plane on a blocking
    /// thread unless a fetch of it is under way; the result comes back as
    /// [`Report::Fetched`].
    fn fetch(&mut self, run: RunSpec, slots: Vec<usize>) {
        let package = run.package.clone().expect("an uploaded package");
        self.waiting.insert(run.id.clone(), (run, slots));
        if !self.fetching.insert(package.clone()) {
            return;
        }
        let control = self.control.clone();
        let url = control.url(&PACKAGES_PATH.replace("{jar}", &package));
        let target = self.package_path(&package);
        let reports = self.events.clone();
        tokio::task::spawn_blocking(move || {
            let result = download(&control, &url, &target)
                .map_err(|e| format!("cannot fetch package {package} from {url}: {e:#}"));
            let _ = reports.send(Report::Fetched { package, result });
        });
    }

    /// A package's fetch ended: start the runs waiting for it, but those cancelled meanwhile.
    async fn fetched(
        &mut self,
        package: String,
        result: Result<(), String>,
        link: &mut Option<Link>,
    ) {
        self.fetching.remove(&package);
        let runs: Vec<DeploymentId> = self
            .waiting
            .iter()
            .filter(|(_, (run, _))| run.package.as_deref() == Some(package.as_str()))
            .map(|(id, _)| id.clone())
            .collect();
        for id in runs {
            let (run, slots) = self.waiting.remove(&id).expect("listed above");
            let still_waiting = self
                .executors
                .get(&id)
                .is_some_and(|e| !matches!(e.state, ExecutorState::Ended(_)));
            if !still_waiting {
                continue;
            }
            self.executors.remove(&id);
            match &result {
                Ok(()) => self.launch(run, slots, link).await,
                Err(cause) => {
                    let cause = cause.clone();
                    self.ended(id, Outcome::Failed { cause }, link).await;
                }
            }
        }
    }

    async fn update(
        &mut self,
        deployment: DeploymentId,
        state: ExecutorState,
        link: &mut Option<Link>,
    ) {
        let Some(executor) = self.executors.get_mut(&deployment) else {
            return;
        };
        if let ExecutorState::Ended(outcome) = &state {
            executor.commands = None;
            tracing::info!(%deployment, ?outcome, "executor ended");
            self.figures
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .runs
                .remove(&deployment);
        }
        executor.state = state.clone();
        send(
            link,
            &WorkerMessage::Executor(ExecutorReport::new(deployment, state)),
        )
        .await;
    }

    /// Writes the descriptor and starts the executor on `slots`.
    fn start(&mut self, mut run: RunSpec, slots: &[usize]) -> Result<()> {
        let cores: Vec<String> = slots
            .iter()
            .map(|&s| {
                self.info
                    .cores
                    .get(s)
                    .map(ToString::to_string)
                    .with_context(|| {
                        format!(
                            "slot {s} is not a slot of this worker ({} slots)",
                            self.info.cores.len()
                        )
                    })
            })
            .collect::<Result<_>>()?;
        let share = self.info.process_memory / self.info.cores.len().max(1) as u64;
        run.config.extend([
            ("taskmanager.cpu.cores".to_string(), cores.join(",")),
            (
                "taskmanager.numberOfTaskSlots".to_string(),
                slots.len().to_string(),
            ),
            (
                "taskmanager.memory.process.size".to_string(),
                (share * slots.len() as u64).to_string(),
            ),
        ]);
        if run.spread.is_some() {
            let Some(keys) = &self.exchange_keys else {
                bail!(
                    "the run spans several workers and worker {} has no certificate to take \
                     part: set security.ssl.internal.dir on it",
                    self.info.id
                );
            };
            run.config.extend(keys.iter().cloned());
        }
        let dir = self.data_dir.join(run.id.to_string());
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let deployment = run.id.clone();
        let job_name = run.entry.clone();
        let package = match &run.package {
            Some(id) => self.package_path(id),
            None => std::env::current_exe().context("cannot find the weir executable")?,
        };
        let descriptor = dir.join("deployment.json");
        let body = serde_json::to_vec_pretty(&Deployment {
            protocol: EXECUTOR_PROTOCOL,
            events_fd: EVENTS_FD,
            run,
        })?;
        std::fs::write(&descriptor, body)
            .with_context(|| format!("cannot write {}", descriptor.display()))?;

        let (mut child, events) = spawn_executor(&package, &descriptor, &dir.join("executor.log"))?;
        let pid = child.id();
        let process = match pidfd(pid) {
            Ok(process) => process,
            Err(error) => {
                // Not supervised, so not left running.
                let _ = child.kill();
                let _ = child.wait();
                return Err(error);
            }
        };
        let commands = child.stdin.take();
        self.shown()
            .runs
            .insert(deployment.clone(), (job_name, slots.len(), None));
        let held = self
            .executors
            .get_mut(&deployment)
            .map(|waiting| std::mem::take(&mut waiting.held))
            .unwrap_or_default();
        let mut executor = Executor {
            state: ExecutorState::Deploying,
            commands,
            process: Some(process),
            slots: slots.to_vec(),
            cancelled: None,
            held: Vec::new(),
        };
        for command in held {
            executor.command(&command);
        }
        self.executors.insert(deployment.clone(), executor);
        let reports = self.events.clone();
        let log = dir.join("executor.log");
        std::thread::Builder::new()
            .name(format!("executor-{pid}"))
            .spawn(move || supervise(deployment, child, events, &log, &reports))
            .context("cannot start a thread to supervise the executor")?;
        Ok(())
    }

    /// Kills executors that did not end within [`CANCEL_GRACE`] of their cancel.
    fn kill_overdue(&mut self) {
        for (deployment, executor) in &mut self.executors {
            if executor
                .cancelled
                .is_some_and(|at| at.elapsed() > CANCEL_GRACE)
                && !matches!(executor.state, ExecutorState::Ended(_))
            {
                tracing::warn!(%deployment, "executor did not end within {CANCEL_GRACE:?} of its cancel; killing it");
                executor.kill();
                executor.cancelled = None;
            }
        }
    }

    fn shown(&self) -> std::sync::MutexGuard<'_, Shown> {
        self.figures.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Cancels every executor still running that was not asked to already.
    fn cancel_all(&mut self, why: &str) {
        for (deployment, executor) in &mut self.executors {
            let live = !matches!(executor.state, ExecutorState::Ended(_));
            if live && executor.cancelled.is_none() {
                tracing::warn!(
                    tm_id = %self.info.id,
                    "weir worker {}: cancelling {deployment}: {why}",
                    self.info.id
                );
                executor.cancel();
            }
        }
    }

    /// Begins the worker's stop (the first SIGTERM): tells systemd how long it may take and the
    /// control plane that the worker is going, which then stops each job's run with a
    /// savepoint to start it again elsewhere, or cancels it (`worker.shutdown.mode`).
    async fn leave(&mut self, link: &mut Option<Link>) {
        let most = self.shutdown_timeout + CANCEL_GRACE + EXIT_SLACK + SYSTEMD_MARGIN;
        crate::notify::notify(&format!(
            "STOPPING=1\nEXTEND_TIMEOUT_USEC={}\nSTATUS=stopping: handing its jobs to the \
             control plane ({:?})",
            most.as_micros(),
            self.shutdown
        ));
        tracing::info!(
            tm_id = %self.info.id,
            "weir worker {}: stopping; its jobs {} (worker.shutdown.mode), within {:?} \
             (worker.shutdown.timeout); a second signal cancels them",
            self.info.id,
            match self.shutdown {
                Shutdown::Savepoint => "stop with savepoints and start again elsewhere",
                Shutdown::Cancel => "are cancelled and restart elsewhere",
            },
            self.shutdown_timeout
        );
        self.leaving = Some(Instant::now());
        let shutdown = self.shutdown;
        send(link, &WorkerMessage::Leaving { shutdown }).await;
    }

    /// While the worker stops: cancels what outstays `worker.shutdown.timeout` and kills
    /// what outstays its cancel; true once it may exit. That is when the control plane
    /// acknowledged every run's end and said no run is placed here any more (`released`), or
    /// — without a link — when every run was cancelled or failed and no savepoint's answer
    /// waits to be sent (the control plane restarts those runs from a checkpoint when it finds
    /// the worker gone; a savepoint's end waits for it, as its job must start from that
    /// savepoint), or when even the kills' time is over.
    fn may_exit(&mut self, linked: bool, answered: bool) -> bool {
        let Some(since) = self.leaving else {
            return false;
        };
        let elapsed = since.elapsed();
        if elapsed > self.shutdown_timeout {
            self.cancel_all("it did not stop within worker.shutdown.timeout");
            self.kill_overdue();
        }
        if elapsed > self.shutdown_timeout + CANCEL_GRACE + EXIT_SLACK {
            tracing::warn!(tm_id = %self.info.id, "weir worker {}: exiting with runs whose end the control plane did not acknowledge", self.info.id);
            return true;
        }
        if linked {
            return self.released && self.executors.is_empty();
        }
        answered
            && self.executors.values().all(|e| {
                matches!(
                    e.state,
                    ExecutorState::Ended(Outcome::Canceled | Outcome::Failed { .. })
                )
            })
    }
}

impl Executor {
    /// Writes `command` to the executor; false when it has ended or cannot be written to.
    fn command(&mut self, command: &ExecutorCommand) -> bool {
        let Some(commands) = &mut self.commands else {
            return false;
        };
        let mut line = serde_json::to_vec(command).expect("serializable");
        line.push(b'\n');
        commands
            .write_all(&line)
            .and_then(|()| commands.flush())
            .is_ok()
    }

    /// Asks the executor to end; a run still waiting for its package ends here and now
    /// (returns true: its end is to be reported).
    fn cancel(&mut self) -> bool {
        if self.commands.is_some() {
            if !self.command(&ExecutorCommand::Cancel) {
                self.kill();
            }
            self.cancelled.get_or_insert_with(Instant::now);
            return false;
        }
        let fetching = self.process.is_none() && !matches!(self.state, ExecutorState::Ended(_));
        if fetching {
            self.state = ExecutorState::Ended(Outcome::Canceled);
            self.slots.clear();
        }
        fetching
    }

    fn kill(&mut self) {
        if let Some(process) = &self.process {
            // SAFETY: pidfd_send_signal on a pidfd this executor owns, with no siginfo; a
            // process that already ended (reaped or not) gets nothing, and no other can.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    process.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            }
        }
    }
}

/// A pidfd of process `pid` (a child not yet reaped: its supervising thread starts after).
fn pidfd(pid: u32) -> Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("pidfd_open of the executor");
    }
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Starts `package --weir-execute descriptor` with its events on [`EVENTS_FD`], its output in
/// `log`, and SIGKILL when this worker dies.
fn spawn_executor(package: &Path, descriptor: &Path, log: &Path) -> Result<(Child, File)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the local array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error())
            .context("cannot make the executor's event pipe");
    }
    // SAFETY: both descriptors were just created by pipe2 and are owned by nothing else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let output = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let write_fd = write.as_raw_fd();
    let worker = std::process::id();
    let mut command = Command::new(package);
    command
        .arg("--weir-execute")
        .arg(descriptor)
        .stdin(Stdio::piped())
        .stdout(output.try_clone()?)
        .stderr(output);
    // systemd's notify socket and watchdog are the worker's.
    for variable in crate::notify::VARIABLES {
        command.env_remove(variable);
    }
    // SAFETY: the closure runs in the child between fork and exec and calls only
    // async-signal-safe functions (prctl, getppid, dup2, fcntl) on descriptors it owns.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The worker may have died between fork and prctl (the child was reparented).
            if libc::getppid() as u32 != worker {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            if write_fd == EVENTS_FD {
                if libc::fcntl(EVENTS_FD, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(write_fd, EVENTS_FD) != EVENTS_FD {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command
        .spawn()
        .with_context(|| format!("cannot start executor {}", package.display()))?;
    drop(write);
    Ok((child, File::from(read)))
}

/// Reads an executor's events until it ends, then reaps it, reporting each state change.
fn supervise(
    deployment: DeploymentId,
    mut child: Child,
    events: File,
    log: &Path,
    reports: &mpsc::UnboundedSender<Report>,
) {
    let mut ended: Option<Outcome> = None;
    let mut refused: Option<String> = None;
    for line in BufReader::new(events).lines() {
        let Ok(line) = line else { break };
        match serde_json::from_str::<ExecutorEvent>(&line) {
            Ok(ExecutorEvent::Hello {
                protocol,
                engine_version,
            }) => {
                if protocol != EXECUTOR_PROTOCOL {
                    refused = Some(format!(
                        "the job's package speaks executor protocol {protocol} (engine \
                         {engine_version}), this worker {EXECUTOR_PROTOCOL} (engine \
                         {ENGINE_VERSION}); rebuild the package against this Weir release"
                    ));
                    let _ = child.kill();
                }
            }
            Ok(ExecutorEvent::Running) => {
                let _ = reports.send(Report::State(deployment.clone(), ExecutorState::Running));
            }
            Ok(ExecutorEvent::Figures(figures)) => {
                let _ = reports.send(Report::Figures(deployment.clone(), figures));
            }
            Ok(ExecutorEvent::Snapshot { request, result }) => {
                let _ = reports.send(Report::Snapshot {
                    deployment: deployment.clone(),
                    request,
                    result,
                });
            }
            Ok(ExecutorEvent::Checkpoint { message }) => {
                let _ = reports.send(Report::Checkpoint {
                    deployment: deployment.clone(),
                    message,
                });
            }
            Ok(ExecutorEvent::Ended(outcome)) => ended = Some(outcome),
            Err(error) => {
                tracing::warn!(%deployment, "ignoring an executor event that does not parse ({error}): {line}")
            }
        }
    }
    let status = child.wait();
    let outcome = match (refused, ended) {
        (Some(cause), _) => Outcome::Failed { cause },
        (None, Some(outcome)) => outcome,
        (None, None) => Outcome::Failed {
            cause: format!(
                "the executor ended without reporting ({}); the end of its log {}:\n{}",
                match status {
                    Ok(status) => status.to_string(),
                    Err(error) => error.to_string(),
                },
                log.display(),
                tail(log, 20)
            ),
        },
    };
    let _ = reports.send(Report::State(deployment, ExecutorState::Ended(outcome)));
}

/// Downloads a package's executable into `target` (written beside it, then renamed).
fn download(control: &ControlEndpoint, url: &str, target: &Path) -> Result<()> {
    let agent = control.agent(Duration::from_secs(300), true);
    let mut request = agent.get(url);
    if let Some(authorization) = control.authorization() {
        request = request.header("Authorization", &authorization);
    }
    let mut response = request.call()?;
    // A name of its own: nothing else writes it, and it is never taken for the package.
    let partial = target.with_file_name(format!(
        ".{}.{:x}.partial",
        target.file_name().unwrap_or_default().to_string_lossy(),
        crate::control_plane::nonce()
    ));
    let mut write = || -> std::io::Result<()> {
        let mut file = File::create(&partial)?;
        std::io::copy(&mut response.body_mut().as_reader(), &mut file)?;
        file.sync_all()?;
        std::fs::set_permissions(
            &partial,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        std::fs::rename(&partial, target)
    };
    let written = write();
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    Ok(written?)
}

/// The last `lines` lines of a file.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// How other workers reach this one's slots, if it has a certificate: checked now, so that a
/// missing or bad one is refused at start, naming the files.
fn exchange_info(
    config: &Configuration,
    slots: usize,
    hostname: &str,
) -> Result<Option<ExchangeInfo>> {
    let exchange = config.exchange();
    let Some(NodeIdentity { node, .. }) = NodeIdentity::of(config, hostname)? else {
        return Ok(None);
    };
    let last = usize::from(exchange.port) + slots.saturating_sub(1);
    if last > usize::from(u16::MAX) {
        bail!(
            "taskmanager.data.port {}: its {slots} slots would need ports up to {last}; set a \
             port of at most {}",
            exchange.port,
            usize::from(u16::MAX) + 1 - slots
        );
    }
    let host = match &exchange.host {
        Some(name) => {
            use std::net::ToSocketAddrs;
            let resolved = (name.as_str(), exchange.port)
                .to_socket_addrs()
                .ok()
                .and_then(|mut addrs| addrs.next());
            let Some(addr) = resolved else {
                bail!(
                    "taskmanager.host '{name}' does not resolve; set it to this worker's address"
                );
            };
            Some(addr.ip())
        }
        None => None,
    };
    for (sysctl, key, wanted) in [
        ("rmem_max", "receive-buffer", exchange.udp_receive_buffer),
        ("wmem_max", "send-buffer", exchange.udp_send_buffer),
    ] {
        let path = format!("/proc/sys/net/core/{sysctl}");
        let limit = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| text.trim().parse::<usize>().ok());
        if let Some(limit) = limit.filter(|&limit| limit < wanted) {
            tracing::warn!(
                "net.core.{sysctl} is {limit} bytes, less than taskmanager.network.udp.{key} \
                 ({wanted}): the kernel caps the exchange's UDP buffers at it; raise it with \
                 `sysctl -w net.core.{sysctl}={wanted}` (`weir tune apply` sets it)"
            );
        }
    }
    Ok(Some(ExchangeInfo {
        node,
        host,
        port: exchange.port,
    }))
}

/// What an executor of a run over several workers gets from `config` on top of the run's
/// configuration.
fn exchange_keys(config: &Configuration, info: &WorkerInfo) -> Option<Vec<(String, String)>> {
    let node = &info.exchange.as_ref()?.node;
    let exchange = config.exchange();
    let dir = exchange.tls_dir?;
    Some(vec![
        (
            "security.ssl.internal.dir".into(),
            dir.display().to_string(),
        ),
        ("security.ssl.internal.node".into(), node.clone()),
        (
            "taskmanager.network.connect-timeout".into(),
            format!("{}us", exchange.connect_timeout.as_micros()),
        ),
        (
            "taskmanager.network.idle-timeout".into(),
            format!("{}us", exchange.idle_timeout.as_micros()),
        ),
        (
            "taskmanager.network.udp.receive-buffer".into(),
            exchange.udp_receive_buffer.to_string(),
        ),
        (
            "taskmanager.network.udp.send-buffer".into(),
            exchange.udp_send_buffer.to_string(),
        ),
    ])
}

fn physical_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}
