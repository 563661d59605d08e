//! `weir bench control`: what a control plane's CPU spends on jobs that run and do nothing
//! else — their workers' heartbeats and their executors' figures, once a second each, kept
//! for the REST API. A real control plane process (`weir control`) on loopback serves
//! simulated workers in this process: each registers as a real worker does (the same
//! messages, over the same WebSocket), heartbeats at the control plane's
//! `heartbeat.interval`, reports every run it is sent as running, and sends each run's figures
//! every second — a real reading, taken once from the built-in job running here. No executor
//! runs: with one slot per job, 100 jobs would need 100 cores.
//!
//! The control plane's CPU time comes from `/proc/<pid>/stat` over the same wall time twice
//! in one run: with the workers connected and no job (the baseline), then with every job
//! running.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use weir_engine::api::RunOptions;
use weir_engine::monitor::Figures;

use crate::bench_submit::{call, poll, settings, spawn_embedded, start, Cleanup};
use crate::client::Client;
use crate::endpoint::ControlEndpoint;
use crate::protocol::{
    ControlMessage, ExecutorReport, ExecutorState, WorkerInfo, WorkerMessage, PROTOCOL_VERSION,
    WORKERS_PATH,
};

/// What `weir bench control` prints.
#[derive(Debug, Serialize)]
pub struct ControlReport {
    /// Jobs running in the second window.
    pub jobs: usize,
    /// Simulated workers, and slots each.
    pub workers: usize,
    pub slots_per_worker: usize,
    /// `heartbeat.interval`, ms.
    pub heartbeat_interval_ms: u64,
    /// Wall time of each window, s.
    pub seconds: f64,
    /// The control plane's CPU with the workers and no job, % of one core.
    pub idle_cpu_percent: f64,
    /// With every job running, % of one core.
    pub jobs_cpu_percent: f64,
    /// The difference, per job: µs of CPU per second.
    pub per_job_cpu_us_per_second: f64,
    /// Bytes of one run's figures, as sent every second.
    pub figures_bytes: usize,
}

/// The user and system CPU ticks of a `/proc/<pid>/stat` line.
fn cpu_ticks(stat: &str) -> Option<u64> {
    // The fields after the command, which is in parentheses and may hold any character.
    let (_, after) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime: fields 14 and 15 of the line, 12 and 13 after the command.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// The control plane's CPU time so far (user and system), from `/proc/<pid>/stat`.
fn cpu_time(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let ticks = cpu_ticks(&stat).with_context(|| format!("a /proc stat line: {stat}"))?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_nanos(ticks * 1_000_000_000 / per_second))
}

/// The control plane's CPU over `window`, % of one core.
fn cpu_percent(pid: u32, window: Duration) -> Result<f64> {
    let before = cpu_time(pid)?;
    std::thread::sleep(window);
    let spent = cpu_time(pid)? - before;
    Ok(spent.as_secs_f64() / window.as_secs_f64() * 100.0)
}

/// The jobs' arguments: the built-in `sequence-check`, long enough to outlast the run.
const ARGS: [&str; 5] = ["--events", "100000000", "--keys", "64", "--discard"];

/// One reading of the built-in job's figures, as its executor sends them every second.
fn real_figures() -> Result<Figures> {
    let options = RunOptions::default();
    let (monitor, cancel) = (options.monitor.clone(), options.cancel.clone());
    let (_, run) = spawn_embedded(&ARGS, &[], options)?;
    let figures = poll(Duration::from_secs(60), || {
        Ok(monitor
            .figures()
            .filter(|f| f.uptime_seconds > 0.5 && !f.tasks.is_empty()))
    });
    cancel.cancel();
    // Cancelled: how it ended does not matter, only that it was built.
    let _ended = run.join().expect("the job's thread")?;
    figures.context("the job's figures")
}

/// One simulated worker: registers with `slots` slots, heartbeats, reports each run it is
/// sent as running and sends its figures every second, until the link closes.
async fn simulated_worker(
    address: String,
    index: usize,
    slots: usize,
    figures: Figures,
) -> Result<()> {
    let request = format!("ws://{address}{WORKERS_PATH}").into_client_request()?;
    let (mut link, _) = tokio_tungstenite::connect_async(request).await?;
    let info = WorkerInfo {
        id: format!("simulated-{index}"),
        host: "localhost".into(),
        pid: std::process::id(),
        cores: (0..slots).collect(),
        physical_memory: 1 << 34,
        process_memory: 1 << 31,
        managed_memory: 1 << 30,
        network_memory: 1 << 27,
        heap_memory: 1 << 29,
        engine_version: weir_engine::package::ENGINE_VERSION.into(),
        exchange: None,
    };
    let text = |message: &WorkerMessage| {
        Message::text(serde_json::to_string(message).expect("messages encode"))
    };
    link.send(text(&WorkerMessage::Register {
        protocol: PROTOCOL_VERSION,
        worker: info,
        executors: Vec::new(),
        leaving: None,
    }))
    .await?;
    let mut heartbeat = tokio::time::interval(Duration::from_secs(1));
    let mut figures_due = tokio::time::interval(Duration::from_secs(1));
    let mut runs = Vec::new();
    loop {
        tokio::select! {
            message = link.next() => {
                let message = match message {
                    Some(Ok(Message::Text(message))) => message,
                    Some(Ok(_)) => continue,
                    Some(Err(error)) => bail!("the link failed: {error}"),
                    None => bail!("the control plane closed the link"),
                };
                match serde_json::from_str::<ControlMessage>(message.as_str())? {
                    ControlMessage::Registered { heartbeat_interval_ms, .. } => {
                        heartbeat = tokio::time::interval(Duration::from_millis(heartbeat_interval_ms));
                    }
                    ControlMessage::Refused { reason } => bail!("refused: {reason}"),
                    ControlMessage::Deploy { run, .. } => {
                        let report = ExecutorReport::new(run.id.clone(), ExecutorState::Running);
                        link.send(text(&WorkerMessage::Executor(report))).await?;
                        runs.push(run.id);
                    }
                    _ => {}
                }
            }
            _ = heartbeat.tick() => link.send(text(&WorkerMessage::Heartbeat)).await?,
            _ = figures_due.tick() => {
                for deployment in &runs {
                    let message = WorkerMessage::Figures {
                        deployment: deployment.clone(),
                        figures: Box::new(figures.clone()),
                    };
                    link.send(text(&message)).await?;
                }
            }
        }
    }
}

/// Runs the benchmark: `jobs` jobs on simulated workers of `slots_per_worker` slots, each
/// window `seconds` long, with the control plane's default heartbeat settings.
pub fn run(jobs: usize, slots_per_worker: usize, seconds: u64) -> Result<ControlReport> {
    let slots_per_worker = slots_per_worker.max(1);
    let workers = jobs.div_ceil(slots_per_worker).max(1);
    let dir = std::env::temp_dir().join(format!(
        "weir-bench-control-{:x}",
        crate::control_plane::nonce()
    ));
    std::fs::create_dir_all(&dir)?;
    let _cleanup = Cleanup(dir.clone());
    let mut args = vec!["control".to_string()];
    args.extend(settings(&[
        format!("control.data-dir={}", dir.join("control").display()),
        "rest.address=127.0.0.1".into(),
        "rest.port=0".into(),
    ]));
    let (control, address) = start(&args, "REST API on http://")?;
    let pid = control.0.id();
    let client = Client::new(ControlEndpoint::plain(&address));
    let heartbeat_interval_ms = call(&client, "GET", "/config", None)?["heartbeat-interval"]
        .as_u64()
        .unwrap_or(10_000);
    let figures = real_figures()?;
    let figures_bytes = serde_json::to_vec(&figures)?.len();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    for index in 0..workers {
        let (address, figures) = (address.clone(), figures.clone());
        runtime.spawn(async move {
            if let Err(error) = simulated_worker(address, index, slots_per_worker, figures).await {
                eprintln!("simulated worker {index}: {error:#}");
            }
        });
    }
    poll(Duration::from_secs(30), || {
        let overview = call(&client, "GET", "/overview", None)?;
        Ok((overview["taskmanagers"].as_u64() == Some(workers as u64)).then_some(()))
    })
    .context("the simulated workers did not all register")?;
    let window = Duration::from_secs(seconds.max(1));
    let idle_cpu_percent = cpu_percent(pid, window)?;

    let body = json!({ "entryClass": "sequence-check", "programArgsList": ARGS });
    for _ in 0..jobs {
        call(&client, "POST", "/jars/weir-builtin/run", Some(&body))?;
    }
    poll(Duration::from_secs(60), || {
        let overview = call(&client, "GET", "/jobs/overview", None)?;
        let running = overview["jobs"].as_array().map_or(0, |all| {
            all.iter().filter(|j| j["state"] == "RUNNING").count()
        });
        Ok((running == jobs).then_some(()))
    })
    .context("the jobs did not all run")?;
    // Every run's figures have come at least once.
    std::thread::sleep(Duration::from_secs(2));
    let started = Instant::now();
    let jobs_cpu_percent = cpu_percent(pid, window)?;
    let seconds = started.elapsed().as_secs_f64();
    runtime.shutdown_background();
    Ok(ControlReport {
        jobs,
        workers,
        slots_per_worker,
        heartbeat_interval_ms,
        seconds,
        idle_cpu_percent,
        jobs_cpu_percent,
        per_job_cpu_us_per_second: (jobs_cpu_percent - idle_cpu_percent) / 100.0 * 1e6
            / jobs.max(1) as f64,
        figures_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::cpu_ticks;

    #[test]
    fn cpu_ticks_are_read_after_a_command_holding_parentheses_and_spaces() {
        let stat = "42 (we (i) r) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 3 0 99 0 0";
        assert_eq!(cpu_ticks(stat), Some(12));
        assert_eq!(cpu_ticks("42 (cut) S 1"), None);
    }
}
