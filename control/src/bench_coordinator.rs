//! `weir bench coordinator`: what the way from the control plane to a job's checkpoint
//! coordinator costs a checkpoint — the figure behind where the coordinator runs
//! (`docs/design/control-plane.md`). The same job is checkpointed on request twice in one
//! run: through the REST API (`POST /jobs/:id/checkpoints`, then `GET` of its status until it
//! completed: control plane → worker → executor's coordinator, and the answer back), and
//! asked of its coordinator in this process (`JobClient::trigger_checkpoint`, the job started
//! as `weir run` starts it). Each is timed by the asker, beside the checkpoint's own duration
//! as its coordinator timed it (trigger to commit).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};
use weir_engine::api::RunOptions;
use weir_engine::monitor::{CheckpointRecord, Checkpoints};

use crate::bench_submit::{
    call, poll, poll_every, spawn_embedded, start_cluster, Cleanup, Quantiles,
};
use crate::client::Client;
use crate::control_plane::store::Store;
use crate::endpoint::ControlEndpoint;

/// What `weir bench coordinator` prints.
#[derive(Debug, Serialize)]
pub struct CoordinatorReport {
    /// Checkpoints asked for each way.
    pub checkpoints: usize,
    /// `POST /jobs/:id/checkpoints` → its status `COMPLETED`, ms.
    pub rest_ms: Quantiles,
    /// The same checkpoints as their coordinator timed them (trigger to commit), ms.
    pub rest_own_ms: Quantiles,
    /// Each one's `rest_ms` less its own duration, ms.
    pub rest_beyond_own_ms: Quantiles,
    /// Asked of the coordinator in this process → its answer, ms.
    pub in_process_ms: Quantiles,
    /// The same checkpoints as their coordinator timed them, ms.
    pub in_process_own_ms: Quantiles,
    /// Each one's `in_process_ms` less its own duration, ms.
    pub in_process_beyond_own_ms: Quantiles,
    /// Median of `rest_beyond_own_ms` less median of `in_process_beyond_own_ms`: the way to
    /// the coordinator and back, polling included.
    pub way_ms: f64,
    /// One `GET` of a completed checkpoint's status, ms (the polling's own part of `rest_ms`).
    pub status_get_ms: Quantiles,
    /// One write of the job's file to a control plane's store (the job master keeps each
    /// request and its answer so: two of them are part of `rest_ms`), ms.
    pub store_write_ms: Quantiles,
}

/// The job: the built-in `sequence-check` on one slot, throttled, long enough to outlast
/// the run, with state in 10 000 keys.
const ARGS: [&str; 7] = [
    "--events",
    "1000000000",
    "--keys",
    "10000",
    "--rate",
    "20000",
    "--discard",
];

/// Only checkpoints asked for: the interval is longer than the run.
const INTERVAL: &str = "3600s";

/// The time between a checkpoint's answer and the next request.
const PAUSE: Duration = Duration::from_millis(50);

/// Checkpoints asked for between two readings of their durations: the figures keep the last
/// ten checkpoints, with room for two the benchmark did not ask for.
const BATCH: usize = 8;

/// How often a checkpoint's status is asked for: with a `GET` taking about 0.15 ms, the
/// polling adds up to 0.4 ms to each time through the control plane, and load beside it.
const POLL: Duration = Duration::from_micros(250);

/// Measured checkpoints: how long each took as asked for, and its number.
#[derive(Default)]
struct Asked {
    took: Vec<f64>,
    ids: Vec<u64>,
}

/// The job run through the control plane, and how its checkpoints are asked for.
struct Rest<'a> {
    client: &'a Client,
    job: String,
    gets: Vec<f64>,
}

impl Rest<'_> {
    /// Asks for one checkpoint and polls its status until it completed.
    fn checkpoint(&mut self, asked: &mut Asked) -> Result<()> {
        let job = &self.job;
        let started = Instant::now();
        let answer = call(
            self.client,
            "POST",
            &format!("/jobs/{job}/checkpoints"),
            Some(&json!({})),
        )?;
        let request = answer["request-id"].as_str().context("a request id")?;
        let path = format!("/jobs/{job}/checkpoints/{request}");
        let status = poll_every(POLL, Duration::from_secs(30), || {
            let status = call(self.client, "GET", &path, None)?;
            match status["status"]["id"].as_str() {
                Some("COMPLETED") => Ok(Some(status)),
                Some("IN_PROGRESS") => Ok(None),
                _ => bail!("checkpoint {path}: {status}"),
            }
        })?;
        asked.took.push(ms(started.elapsed()));
        asked.ids.push(
            status["operation"]["checkpointId"]
                .as_u64()
                .with_context(|| format!("a failed checkpoint: {status}"))?,
        );
        let get = Instant::now();
        call(self.client, "GET", &path, None)?;
        self.gets.push(ms(get.elapsed()));
        Ok(())
    }

    /// The own durations of checkpoints `ids`, once the executor's figures hold them.
    fn own(&self, ids: &[u64]) -> Result<Vec<f64>> {
        let path = format!("/jobs/{}/checkpoints", self.job);
        poll(Duration::from_secs(10), || {
            Ok(own_from_rest(&call(self.client, "GET", &path, None)?, ids))
        })
        .context("the checkpoints' durations in /jobs/:id/checkpoints")
    }
}

/// The completed checkpoints' own durations, by number.
fn own_durations(checkpoints: &Checkpoints, ids: &[u64]) -> Result<Vec<f64>> {
    ids.iter()
        .map(|id| {
            checkpoints
                .history
                .iter()
                .find(|c: &&CheckpointRecord| c.id == *id && c.completed)
                .map(|c| c.duration_us as f64 / 1000.0)
                .with_context(|| format!("checkpoint {id} is not among the completed ones"))
        })
        .collect()
}

/// Each duration less its checkpoint's own.
fn beyond(took: &[f64], own: &[f64]) -> Vec<f64> {
    took.iter().zip(own).map(|(t, o)| t - o).collect()
}

/// Runs the benchmark: `checkpoints` through the control plane, then as many in process,
/// each job alone on the machine (one running beside the other slows the first's way: its
/// shard keeps a core, and the processes on the way share the other).
pub fn run(checkpoints: usize) -> Result<CoordinatorReport> {
    let count = checkpoints.max(1);
    let dir = std::env::temp_dir().join(format!(
        "weir-bench-coordinator-{:x}",
        crate::control_plane::nonce()
    ));
    std::fs::create_dir_all(&dir)?;
    // Declared first, so dropped after the processes.
    let _cleanup = Cleanup(dir.clone());
    let checkpoint_dir = dir.join("checkpoints");
    let (_control, _worker, address) = start_cluster(
        &dir,
        &[
            format!("execution.checkpointing.interval={INTERVAL}"),
            format!("execution.checkpointing.dir={}", checkpoint_dir.display()),
        ],
    )?;
    let client = Client::new(ControlEndpoint::plain(&address));
    let body = json!({ "entryClass": "sequence-check", "programArgsList": ARGS });
    let answer = call(&client, "POST", "/jars/weir-builtin/run", Some(&body))?;
    let job = answer["jobid"].as_str().context("a job id")?.to_string();
    poll(Duration::from_secs(60), || {
        let details = call(&client, "GET", &format!("/jobs/{job}"), None)?;
        Ok(details["firstRecordTime"].as_i64())
    })
    .with_context(|| format!("job {job} reported no first record"))?;
    let mut rest = Rest {
        client: &client,
        job,
        gets: Vec::new(),
    };
    let (mut through_rest, mut rest_own) = (Asked::default(), Vec::new());
    while through_rest.took.len() < count {
        let batch = through_rest.took.len();
        for _ in batch..count.min(batch + BATCH) {
            std::thread::sleep(PAUSE);
            rest.checkpoint(&mut through_rest)?;
        }
        rest_own.extend(rest.own(&through_rest.ids[batch..])?);
    }
    let cancelled = format!("/jobs/{}?mode=cancel", rest.job);
    call(&client, "PATCH", &cancelled, None)?;
    poll(Duration::from_secs(30), || {
        let details = call(&client, "GET", &format!("/jobs/{}", rest.job), None)?;
        Ok((details["state"] == "CANCELED").then_some(()))
    })
    .context("the job through the control plane did not end")?;

    let options = RunOptions::default();
    let (monitor, cancel, savepoints) = (
        options.monitor.clone(),
        options.cancel.clone(),
        options.savepoints.clone(),
    );
    let embedded_dir = checkpoint_dir.join("embedded").display().to_string();
    let config = [
        ("taskmanager.cpu.cores", "0"),
        ("execution.checkpointing.interval", INTERVAL),
        ("execution.checkpointing.dir", embedded_dir.as_str()),
    ];
    let (_, running) = spawn_embedded(&ARGS, &config, options)?;
    poll(Duration::from_secs(60), || {
        Ok(monitor.emitted_any().then_some(()))
    })
    .context("the embedded job's first record was not seen")?;

    let (mut in_process, mut in_process_own) = (Asked::default(), Vec::new());
    while in_process.took.len() < count {
        let batch = in_process.took.len();
        for _ in batch..count.min(batch + BATCH) {
            std::thread::sleep(PAUSE);
            let started = Instant::now();
            let taken = savepoints
                .checkpoint()
                .wait()
                .map_err(|e| anyhow::anyhow!("a checkpoint asked for in process: {e}"))?;
            in_process.took.push(ms(started.elapsed()));
            in_process.ids.push(taken.checkpoint);
        }
        let figures = monitor.figures().context("the embedded job's figures")?;
        in_process_own.extend(own_durations(
            &figures.checkpoints,
            &in_process.ids[batch..],
        )?);
    }
    cancel.cancel();
    // Cancelled: how it ended does not matter, only that it ran.
    let _ended = running.join().expect("the job's thread")?;

    let stored: Value = serde_json::from_slice(&std::fs::read(
        dir.join("control")
            .join("jobs")
            .join(format!("{}.json", rest.job)),
    )?)?;
    let store = Store::open(&dir.join("store"))?;
    let writes = (0..count)
        .map(|_| {
            let write = Instant::now();
            store.put(&rest.job, &stored)?;
            Ok(ms(write.elapsed()))
        })
        .collect::<Result<Vec<f64>>>()?;

    let rest_beyond = Quantiles::of(beyond(&through_rest.took, &rest_own));
    let in_process_beyond = Quantiles::of(beyond(&in_process.took, &in_process_own));
    Ok(CoordinatorReport {
        checkpoints: count,
        way_ms: rest_beyond.p50 - in_process_beyond.p50,
        rest_ms: Quantiles::of(through_rest.took),
        rest_own_ms: Quantiles::of(rest_own),
        rest_beyond_own_ms: rest_beyond,
        in_process_ms: Quantiles::of(in_process.took),
        in_process_own_ms: Quantiles::of(in_process_own),
        in_process_beyond_own_ms: in_process_beyond,
        status_get_ms: Quantiles::of(rest.gets),
        store_write_ms: Quantiles::of(writes),
    })
}

/// The durations of checkpoints `ids` in a `/jobs/:id/checkpoints` answer, once it holds
/// them all.
fn own_from_rest(history: &Value, ids: &[u64]) -> Option<Vec<f64>> {
    let entries = history["history"].as_array().cloned().unwrap_or_default();
    ids.iter()
        .map(|id| {
            entries
                .iter()
                .find(|e| e["id"].as_u64() == Some(*id) && e["status"] == "COMPLETED")
                .and_then(|e| e["end_to_end_duration_us"].as_f64())
                .map(|us| us / 1000.0)
        })
        .collect()
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
