//! Job packages: an executable built against `weir-engine` whose `main` hands a [`Registry`] of
//! named job builders to [`main`]. A worker runs a job by starting the package with a
//! deployment descriptor (`PACKAGE --weir-execute FILE`); `PACKAGE --weir-package-info` prints
//! what the package holds and which protocol it speaks, so that the control plane can check a
//! package before it runs anything from it. The `weir` binary is itself the package of the
//! built-in jobs.
//!
//! A running executor talks to its worker over two channels it inherits:
//! - its standard input carries [`ExecutorCommand`]s, one JSON object a line (end of input
//!   cancels the job: the worker is gone);
//! - the descriptor names a file descriptor the executor writes [`ExecutorEvent`]s to, one
//!   JSON object a line. Standard output and error stay the job's own (its print sinks, its
//!   logs), which the worker keeps in the deployment's log file.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::api::RunOptions;
use crate::checkpoint::{CheckpointMessage, Relay, StopMode, Taken};
use crate::monitor::Figures;
use weir_net::tls::TlsIdentity;

use crate::config::ExchangeConfig;
use crate::runtime::{PeriodicThread, SlotPlace, Spread};
use crate::{Configuration, JobError, StreamEnvironment};

/// The version of the worker ↔ executor protocol (descriptor, commands, events) this engine
/// build speaks. A worker refuses an executor of another version, naming both.
pub const PROTOCOL_VERSION: u32 = 5;

/// How often a running executor reports its job's figures to its worker.
pub const FIGURES_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The engine build's version.
pub const ENGINE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Builds a job into the environment from its program arguments; an error names the argument
/// and the fix.
pub type Builder = Box<dyn Fn(&StreamEnvironment, &[String]) -> Result<(), String> + Send + Sync>;

/// One named job of a package.
struct Entry {
    name: String,
    description: String,
    build: Builder,
}

/// The jobs a package holds, by name.
#[derive(Default)]
pub struct Registry {
    package: String,
    entries: Vec<Entry>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("package", &self.package)
            .field(
                "jobs",
                &self.entries.iter().map(|e| &e.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Registry {
    /// An empty registry for the package named `package`.
    pub fn new(package: &str) -> Registry {
        Registry {
            package: package.to_string(),
            entries: Vec::new(),
        }
    }

    /// Adds the job `name` (its entry class, in Flink's terms), built by `build`.
    pub fn job(
        mut self,
        name: &str,
        description: &str,
        build: impl Fn(&StreamEnvironment, &[String]) -> Result<(), String> + Send + Sync + 'static,
    ) -> Registry {
        assert!(
            self.entries.iter().all(|e| e.name != name),
            "job '{name}' registered twice"
        );
        self.entries.push(Entry {
            name: name.to_string(),
            description: description.to_string(),
            build: Box::new(build),
        });
        self
    }

    /// What the package holds.
    pub fn info(&self) -> PackageInfo {
        PackageInfo {
            package: self.package.clone(),
            protocol: PROTOCOL_VERSION,
            engine_version: ENGINE_VERSION.to_string(),
            jobs: self
                .entries
                .iter()
                .map(|e| JobInfo {
                    name: e.name.clone(),
                    description: e.description.clone(),
                })
                .collect(),
        }
    }

    /// Builds job `name` with `args` into `env`.
    pub fn build(
        &self,
        name: &str,
        env: &StreamEnvironment,
        args: &[String],
    ) -> Result<(), String> {
        let entry = self
            .entries
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| {
                format!(
                    "package '{}' has no job '{name}'; it has {}",
                    self.package,
                    self.names().join(", ")
                )
            })?;
        (entry.build)(env, args)
    }

    fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|e| e.name.as_str()).collect()
    }
}

/// What `PACKAGE --weir-package-info` prints (one JSON object).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PackageInfo {
    /// The package's name.
    pub package: String,
    /// [`PROTOCOL_VERSION`] of the engine it was built with.
    pub protocol: u32,
    /// That engine's version.
    pub engine_version: String,
    /// Its jobs.
    pub jobs: Vec<JobInfo>,
}

/// A job of a package.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobInfo {
    /// The name it is run by (Flink's entry class).
    pub name: String,
    /// What it does.
    pub description: String,
}

/// Which run of which job: a job's id and the attempt (1 for its first deployment, one more
/// for each restart).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeploymentId {
    /// The job's id (32 hex digits, as Flink's).
    pub job_id: String,
    /// The attempt.
    pub attempt: u32,
}

impl std::fmt::Display for DeploymentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.job_id, self.attempt)
    }
}

/// What an executor runs: the deployment descriptor a worker writes for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deployment {
    /// [`PROTOCOL_VERSION`] of the worker that wrote it.
    pub protocol: u32,
    /// The file descriptor the executor writes its events to.
    pub events_fd: i32,
    /// The run.
    pub run: RunSpec,
}

/// One run of a job, as the control plane decides it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// Which run this is.
    pub id: DeploymentId,
    /// The uploaded package (its id) the run starts from; `None`: the worker's own `weir`
    /// binary, the package of the built-in jobs.
    pub package: Option<String>,
    /// The job (entry) to build.
    pub entry: String,
    /// Its program arguments.
    pub args: Vec<String>,
    /// Configuration keys set for the run (the slots' cores and the parallelism among them).
    pub config: Vec<(String, String)>,
    /// Start from the latest completed checkpoint of the job's checkpoint directory, if it
    /// has one.
    pub resume: bool,
    /// Start from this savepoint (when `resume` finds no checkpoint).
    pub from_savepoint: Option<PathBuf>,
    /// Leave out the state of operators the job no longer has.
    pub allow_non_restored_state: bool,
    /// Where every slot of the job runs when the run spans several executors (the job's
    /// parallelism is then theirs together, and this executor runs the slots on its node,
    /// `security.ssl.internal.node`); `None`: all of them here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<Vec<SlotPlace>>,
}

/// The [`Spread`] of run `run` over `slots` from the executor's configuration: its node, the
/// cluster CA and its certificate, and the exchange's timeouts and buffers.
fn spread_of(
    run: &DeploymentId,
    slots: &[SlotPlace],
    config: &Configuration,
    relay: Relay,
) -> Result<Spread, String> {
    let exchange = config.exchange();
    let (Some(dir), Some(node)) = (&exchange.tls_dir, &exchange.node) else {
        return Err(
            "the run spans several workers but its executor has no certificate: set \
             security.ssl.internal.dir and security.ssl.internal.node on the worker"
                .to_string(),
        );
    };
    let [ca, cert, key] = ExchangeConfig::tls_files(dir, node);
    let identity = TlsIdentity::from_files(&ca, &cert, &key).map_err(|e| e.to_string())?;
    Ok(Spread {
        run: run.to_string(),
        node: node.clone(),
        slots: slots.to_vec(),
        identity,
        idle_timeout: exchange.idle_timeout,
        connect_timeout: exchange.connect_timeout,
        udp_buffers: (exchange.udp_receive_buffer, exchange.udp_send_buffer),
        relay,
    })
}

/// A worker's command to its executor (a line of the executor's standard input).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum ExecutorCommand {
    /// Cancel the job.
    Cancel,
    /// Take a checkpoint or savepoint (and stop the job once it completed, if `take` says
    /// so); answered with [`ExecutorEvent::Snapshot`] carrying the same `request`.
    Snapshot {
        /// The control plane's id of the request.
        request: String,
        /// What to take.
        take: Snapshot,
    },
    /// Another executor of the run (spread over several) said this about its checkpoints.
    Checkpoint {
        /// What it said.
        message: CheckpointMessage,
    },
}

/// What a snapshot request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Snapshot {
    /// A checkpoint of the job's own, now (Flink's manual checkpoint).
    Checkpoint,
    /// A savepoint; the job runs on.
    Savepoint,
    /// A savepoint, then the job stops.
    Stop(Stop),
}

/// How a job stops with its savepoint ([`StopMode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stop {
    /// Without a final watermark: open windows stay in the savepoint (Flink's `stop`).
    Suspend,
    /// With the final watermark: every window fires first (Flink's `stop --drain`).
    Drain,
}

/// What an executor tells its worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum ExecutorEvent {
    /// The first line: the protocol and engine the executor was built with.
    Hello {
        /// Its [`PROTOCOL_VERSION`].
        protocol: u32,
        /// Its engine version.
        engine_version: String,
    },
    /// The job is built and its tasks are starting.
    Running,
    /// The job's live figures, every [`FIGURES_INTERVAL`] while it runs.
    Figures(Box<Figures>),
    /// A checkpoint or savepoint asked for by [`ExecutorCommand::Snapshot`] completed or
    /// failed.
    Snapshot {
        /// The request's id.
        request: String,
        /// Its number and directory, or why there is none.
        result: Result<Taken, String>,
    },
    /// For the other executors of the run (spread over several), about its checkpoints: to
    /// the one running slot 0, or from it to every other, as [`CheckpointMessage::to_leader`]
    /// says.
    Checkpoint {
        /// What it says.
        message: CheckpointMessage,
    },
    /// The run ended.
    Ended(Outcome),
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Outcome {
    /// Every source ended and every record was processed.
    Finished {
        /// Wall time of the run, ms.
        duration_ms: u64,
        /// Records in and out per operator.
        operators: Vec<OperatorTotals>,
        /// The savepoint the job stopped with, if it was stopped with one.
        savepoint: Option<PathBuf>,
    },
    /// Cancelled on request.
    Canceled,
    /// The run failed (after the job's own restarts, if any, gave up).
    Failed {
        /// Why, as the engine reports it.
        cause: String,
    },
}

/// An operator's record counts at the end of a run, summed over its subtasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorTotals {
    /// The operator's name.
    pub name: String,
    /// Its subtasks.
    pub parallelism: usize,
    /// Records received.
    pub records_in: u64,
    /// Records emitted.
    pub records_out: u64,
}

/// The entry point of a job package: call it from `main` with the package's jobs.
/// `--weir-package-info` prints [`PackageInfo`]; `--weir-execute FILE` runs a deployment (what a
/// worker does); anything else prints how to use the package.
pub fn main(registry: Registry) -> ExitCode {
    if let Some(code) = run_if_asked(&registry) {
        return code;
    }
    let info = registry.info();
    eprintln!(
        "{} is a Weir job package (engine {}, protocol {}) holding: {}.\nUpload it to a control \
         plane (POST /jars/upload, with web.upload.enabled) and run a job with `weir submit \
         --jar ID JOB [ARGS…]`; a worker starts it.",
        info.package,
        info.engine_version,
        info.protocol,
        registry.names().join(", "),
    );
    ExitCode::from(2)
}

/// Handles `--weir-package-info` and `--weir-execute FILE` as [`main`] does and returns the
/// exit code, or `None` when the process was started with other arguments (the `weir` binary
/// goes on with its own command line).
pub fn run_if_asked(registry: &Registry) -> Option<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--weir-package-info") => {
            let info = serde_json::to_string(&registry.info()).expect("serializable");
            // The package's answer to the control plane, on stdout by design.
            match writeln!(std::io::stdout().lock(), "{info}") {
                Ok(()) => Some(ExitCode::SUCCESS),
                Err(_) => Some(ExitCode::FAILURE),
            }
        }
        Some("--weir-execute") => {
            let Some(path) = args.get(1) else {
                eprintln!("--weir-execute needs the deployment descriptor's path");
                return Some(ExitCode::from(2));
            };
            Some(execute(registry, Path::new(path)))
        }
        _ => None,
    }
}

/// Writes events to the worker, one line each; shared by the job's thread and the threads
/// answering savepoint requests.
#[derive(Clone)]
struct Events(Arc<Mutex<std::fs::File>>);

impl Events {
    fn send(&self, event: &ExecutorEvent) {
        let mut line = serde_json::to_vec(event).expect("serializable");
        line.push(b'\n');
        let mut file = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // The worker reads until the executor ends; if it is gone, the executor dies with it
        // (it was started with a parent-death signal), so a failed write needs no handling.
        let _ = file.write_all(&line);
    }
}

fn execute(registry: &Registry, path: &Path) -> ExitCode {
    // In the format the worker logs in (it hands its executors WEIR_LOG_FORMAT), unless the
    // package set up logging of its own.
    crate::logging::init(crate::logging::LogFormat::from_env().unwrap_or_default());
    let deployment: Deployment = match std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| e.to_string()))
    {
        Ok(deployment) => deployment,
        Err(error) => {
            tracing::error!(
                "cannot read deployment descriptor {}: {error}",
                path.display()
            );
            return ExitCode::from(2);
        }
    };
    tracing::info!(
        run_id = %deployment.run.id,
        job_name = %deployment.run.entry,
        "executor of job '{}' started (engine {ENGINE_VERSION}, protocol {PROTOCOL_VERSION})",
        deployment.run.entry
    );
    let events = Events(Arc::new(Mutex::new(events_file(deployment.events_fd))));
    events.send(&ExecutorEvent::Hello {
        protocol: PROTOCOL_VERSION,
        engine_version: ENGINE_VERSION.to_string(),
    });
    let outcome = run_deployment(registry, &deployment.run, &events);
    let code = match &outcome {
        Outcome::Failed { cause } => {
            let run = &deployment.run;
            tracing::error!(run_id = %run.id, "job '{}' failed: {cause}", run.entry);
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    };
    events.send(&ExecutorEvent::Ended(outcome));
    code
}

/// The events' file: the descriptor's fd, which the worker set up for this process.
fn events_file(fd: i32) -> std::fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: the worker starts the executor with `fd` open for writing and names it in the
    // descriptor; nothing else in this process opens, uses or closes that number, so the
    // file takes sole ownership of it. FD_CLOEXEC keeps it out of processes the job starts,
    // which would otherwise hold the worker's end of the pipe open after the executor ended.
    unsafe {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        std::fs::File::from_raw_fd(fd)
    }
}

fn run_deployment(registry: &Registry, deployment: &RunSpec, events: &Events) -> Outcome {
    let failed = |cause: String| Outcome::Failed { cause };
    let mut config = Configuration::default();
    for (key, value) in &deployment.config {
        if let Err(error) = config.set(key, value.as_str()) {
            return failed(error.to_string());
        }
    }
    let env = match StreamEnvironment::new(config) {
        Ok(env) => env,
        Err(error) => return failed(error.to_string()),
    };
    if let Err(error) = registry.build(&deployment.entry, &env, &deployment.args) {
        return failed(format!(
            "job '{}' cannot be built: {error}",
            deployment.entry
        ));
    }
    let relay = Relay::new({
        let events = events.clone();
        move |message| events.send(&ExecutorEvent::Checkpoint { message })
    });
    let spread = match &deployment.spread {
        Some(slots) => match spread_of(&deployment.id, slots, &env.config(), relay.clone()) {
            Ok(spread) => Some(spread),
            Err(error) => return failed(error),
        },
        None => None,
    };
    let options = RunOptions {
        spread,
        resume: deployment.resume,
        from_savepoint: deployment.from_savepoint.clone(),
        allow_non_restored_state: deployment.allow_non_restored_state,
        ..RunOptions::default()
    };
    let cancel = options.cancel.clone();
    let savepoints = options.savepoints.clone();
    let answers = events.clone();
    // Commands come on standard input; its end means the worker is gone.
    std::thread::Builder::new()
        .name("commands".into())
        .spawn(move || {
            // A control plane that lost a request's answer asks again: one snapshot each.
            let mut requests = std::collections::HashSet::new();
            let stdin = std::io::stdin();
            for line in stdin.lock().lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<ExecutorCommand>(&line) {
                    Ok(ExecutorCommand::Cancel) => cancel.cancel(),
                    Ok(ExecutorCommand::Checkpoint { message }) => relay.deliver(message),
                    Ok(ExecutorCommand::Snapshot { request, take }) => {
                        if !requests.insert(request.clone()) {
                            continue;
                        }
                        let pending = match take {
                            Snapshot::Checkpoint => savepoints.checkpoint(),
                            Snapshot::Savepoint => savepoints.trigger(),
                            Snapshot::Stop(Stop::Suspend) => {
                                savepoints.stop_with_savepoint(StopMode::Suspend)
                            }
                            Snapshot::Stop(Stop::Drain) => {
                                savepoints.stop_with_savepoint(StopMode::Drain)
                            }
                        };
                        let answers = answers.clone();
                        std::thread::spawn(move || {
                            let result = pending.wait().map_err(|e| e.0);
                            answers.send(&ExecutorEvent::Snapshot { request, result });
                        });
                    }
                    Err(error) => {
                        eprintln!("ignoring a command that does not parse ({error}): {line}")
                    }
                }
            }
            cancel.cancel();
        })
        .expect("a thread for the worker's commands");
    events.send(&ExecutorEvent::Running);
    let monitor = options.monitor.clone();
    let reporter = events.clone();
    // Off the shards: it sums their single-writer counters. Stopped (dropped) at the end.
    let _figures = PeriodicThread::spawn("figures", FIGURES_INTERVAL, move || {
        if let Some(figures) = monitor.figures() {
            reporter.send(&ExecutorEvent::Figures(Box::new(figures)));
        }
    })
    .expect("a thread for the job's figures");
    // The first record, to the millisecond (what submission-to-first-record is measured by),
    // and the tasks all ready: polled off the shards until both came, for a minute at most,
    // then reported at once (a short run may end before its next figures).
    let watched = options.monitor.clone();
    let announcer = events.clone();
    std::thread::Builder::new()
        .name("first-record".into())
        .spawn(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            let mut first = false;
            while std::time::Instant::now() < deadline {
                if !first && watched.emitted_any() {
                    watched.first_record(crate::time::now_ms());
                    first = true;
                }
                if first && watched.all_ready() {
                    if let Some(figures) = watched.figures() {
                        announcer.send(&ExecutorEvent::Figures(Box::new(figures)));
                    }
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        })
        .expect("a thread watching for the first record");
    match env.execute_with(&deployment.entry, options) {
        Ok(result) => Outcome::Finished {
            duration_ms: u64::try_from(result.duration.as_millis()).unwrap_or(u64::MAX),
            operators: result
                .operators
                .iter()
                .map(|o| OperatorTotals {
                    name: o.name.clone(),
                    parallelism: o.subtasks,
                    records_in: o.records_in,
                    records_out: o.records_out,
                })
                .collect(),
            savepoint: result.savepoint,
        },
        Err(JobError::Cancelled { .. }) => Outcome::Canceled,
        Err(error) => failed(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_events_and_commands_round_trip_as_json() {
        let deployment = Deployment {
            protocol: PROTOCOL_VERSION,
            events_fd: 3,
            run: RunSpec {
                id: DeploymentId {
                    job_id: "0123456789abcdef0123456789abcdef".into(),
                    attempt: 2,
                },
                package: Some("p".into()),
                entry: "word-count".into(),
                args: vec!["--input".into(), "x y".into()],
                config: vec![("parallelism.default".into(), "2".into())],
                resume: true,
                from_savepoint: Some(PathBuf::from("/sp")),
                allow_non_restored_state: false,
                spread: Some(vec![SlotPlace {
                    node: "worker-1".into(),
                    addr: "10.0.0.1:6121".parse().unwrap(),
                }]),
            },
        };
        let text = serde_json::to_string(&deployment).unwrap();
        assert_eq!(
            serde_json::from_str::<Deployment>(&text).unwrap(),
            deployment
        );
        let unknown = text.replacen('{', "{\"extra\":1,", 1);
        let error = serde_json::from_str::<Deployment>(&unknown).unwrap_err();
        assert!(
            error.to_string().contains("unknown field `extra`"),
            "{error}"
        );

        let ended = ExecutorEvent::Ended(Outcome::Failed {
            cause: "boom".into(),
        });
        let line = serde_json::to_string(&ended).unwrap();
        assert_eq!(
            line,
            r#"{"event":"ended","outcome":"failed","cause":"boom"}"#
        );
        assert_eq!(serde_json::from_str::<ExecutorEvent>(&line).unwrap(), ended);
        assert_eq!(
            serde_json::to_string(&ExecutorCommand::Cancel).unwrap(),
            r#"{"command":"cancel"}"#
        );
        for (take, json) in [
            (Snapshot::Checkpoint, r#""checkpoint""#),
            (Snapshot::Savepoint, r#""savepoint""#),
            (Snapshot::Stop(Stop::Drain), r#"{"stop":"drain"}"#),
        ] {
            let command = ExecutorCommand::Snapshot {
                request: "r".into(),
                take,
            };
            let line = serde_json::to_string(&command).unwrap();
            assert_eq!(
                line,
                format!(r#"{{"command":"snapshot","request":"r","take":{json}}}"#)
            );
            assert_eq!(
                serde_json::from_str::<ExecutorCommand>(&line).unwrap(),
                command
            );
        }
    }

    #[test]
    fn a_registry_builds_its_jobs_by_name_and_names_them_when_asked_for_another() {
        let registry = Registry::new("p")
            .job("a", "job a", |_, args| {
                if args.is_empty() {
                    Ok(())
                } else {
                    Err(format!("unexpected argument '{}'", args[0]))
                }
            })
            .job("b", "job b", |_, _| Ok(()));
        let env = StreamEnvironment::new(
            Configuration::default()
                .with("taskmanager.numberOfTaskSlots", "1")
                .unwrap(),
        )
        .unwrap();
        assert_eq!(registry.build("a", &env, &[]), Ok(()));
        assert_eq!(
            registry.build("a", &env, &["x".into()]),
            Err("unexpected argument 'x'".into())
        );
        assert_eq!(
            registry.build("c", &env, &[]),
            Err("package 'p' has no job 'c'; it has a, b".into())
        );
        let info = registry.info();
        assert_eq!(info.protocol, PROTOCOL_VERSION);
        assert_eq!(
            info.jobs
                .iter()
                .map(|j| j.name.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
    }
}
