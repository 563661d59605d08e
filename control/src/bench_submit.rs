//! `weir bench submit`: how long a job takes from its submission over the REST API to its
//! first record processed, on a control plane and a worker started for the purpose on
//! loopback; against the same job started embedded (`weir run`'s path, in this process) in
//! the same run; and from a savepoint holding state.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};
use weir_engine::api::RunOptions;
use weir_engine::time::now_ms;
use weir_engine::{Configuration, StreamEnvironment};

use crate::builtin::{self, Job};
use crate::client::Client;
use crate::endpoint::ControlEndpoint;

/// What `weir bench submit` prints.
#[derive(Debug, Serialize)]
pub struct SubmitReport {
    /// Rounds of each measurement.
    pub rounds: usize,
    /// POST /jars/:id/run → the first record, through the control plane, a worker and a new
    /// executor process, ms.
    pub submit_to_first_record_ms: Quantiles,
    /// The same job started in this process (`weir run`'s path) → its first record, ms.
    pub embedded_to_first_record_ms: Quantiles,
    /// Median over median.
    pub ratio: f64,
    /// The executor's tasks from their start to the last one built (its operators open), in
    /// the submitted rounds, ms.
    pub tasks_ready_ms: Quantiles,
    /// POST /jars/:id/run with a savepoint → the first record, ms.
    pub restore_submit_to_first_record_ms: Quantiles,
    /// The restoring executor's tasks from their start to the last one built, its state
    /// restored from the savepoint, ms.
    pub restore_tasks_ready_ms: Quantiles,
    /// Keys whose state the savepoint holds (those the job had read when it stopped).
    pub savepoint_keys: u64,
    /// Bytes of that savepoint.
    pub savepoint_bytes: u64,
}

/// The median and the largest of a set of durations.
#[derive(Debug, Serialize)]
pub struct Quantiles {
    /// Median.
    pub p50: f64,
    /// Largest.
    pub max: f64,
}

impl Quantiles {
    pub(crate) fn of(mut values: Vec<f64>) -> Quantiles {
        values.sort_by(f64::total_cmp);
        let n = values.len();
        Quantiles {
            p50: (values[(n - 1) / 2] + values[n / 2]) / 2.0,
            max: *values.last().expect("at least one round"),
        }
    }
}

/// A process this benchmark started, killed when dropped.
pub(crate) struct Started(pub(crate) Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `weir ARGS` and waits for the stderr line holding `marker`; returns what follows it.
pub(crate) fn start(args: &[String], marker: &'static str) -> Result<(Started, String)> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(args)
        // The marker is read from text lines, whatever this process logs in.
        .env(weir_engine::logging::FORMAT_VARIABLE, "text")
        // The benchmark's cluster on loopback speaks plain HTTP, as its client does.
        .env_remove("WEIR_SECURITY_SSL_REST_ENABLED")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let lines = BufReader::new(child.stderr.take().expect("piped")).lines();
    let (found, wait) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            // What follows the marker, up to the fields a log line carries after its message.
            if let Some((_, rest)) = line.split_once(marker) {
                let rest = rest.split_whitespace().next().unwrap_or_default();
                let _ = found.send(rest.to_string());
            }
        }
    });
    let started = Started(child);
    let rest = wait
        .recv_timeout(Duration::from_secs(60))
        .with_context(|| format!("weir {} did not print '{marker}'", args[0]))?;
    Ok((started, rest))
}

pub(crate) fn settings(pairs: &[String]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|p| ["-D".to_string(), p.clone()])
        .collect()
}

/// Polls `what` every millisecond until it gives a value, for `limit` at most.
pub(crate) fn poll<T>(limit: Duration, what: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    poll_every(Duration::from_millis(1), limit, what)
}

/// Polls `what` every `every` until it gives a value, for `limit` at most.
pub(crate) fn poll_every<T>(
    every: Duration,
    limit: Duration,
    mut what: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let started = Instant::now();
    loop {
        if let Some(value) = what()? {
            return Ok(value);
        }
        if started.elapsed() > limit {
            bail!("nothing within {limit:?}");
        }
        std::thread::sleep(every);
    }
}

/// A control plane (its store in `dir/control`, with `settings` besides) and one worker
/// with one slot on core 0 (its data in `dir/worker`), started on loopback: the processes,
/// killed when dropped, and the control plane's address.
pub(crate) fn start_cluster(dir: &Path, extra: &[String]) -> Result<(Started, Started, String)> {
    let mut args = vec!["control".to_string()];
    args.extend(settings(&[
        format!("control.data-dir={}", dir.join("control").display()),
        "rest.address=127.0.0.1".into(),
        "rest.port=0".into(),
    ]));
    args.extend(settings(extra));
    let (control, address) = start(&args, "REST API on http://")?;
    let mut args = vec!["worker".to_string(), "--control".into(), address.clone()];
    args.extend(settings(&[
        format!("worker.data-dir={}", dir.join("worker").display()),
        "taskmanager.cpu.cores=0".into(),
        "metrics.reporter.prom.host=127.0.0.1".into(),
        "metrics.reporter.prom.port=0".into(),
    ]));
    let (worker, _) = start(&args, "registered with")?;
    Ok((control, worker, address))
}

pub(crate) fn call(
    client: &Client,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Value> {
    client
        .call(method, path, body)
        .map_err(|f| anyhow::anyhow!("{}", f.message))
}

/// Submits `body` and returns (ms from the request to the first record, the job id).
fn first_record(client: &Client, body: &Value) -> Result<(f64, String)> {
    let sent = now_ms();
    let answer = call(client, "POST", "/jars/weir-builtin/run", Some(body))?;
    let job = answer["jobid"].as_str().context("a job id")?.to_string();
    let mut last = Value::Null;
    let first = poll(Duration::from_secs(60), || {
        let details = call(client, "GET", &format!("/jobs/{job}"), None)?;
        let first = details["firstRecordTime"].as_i64();
        if first.is_none()
            && matches!(
                details["state"].as_str(),
                Some("FAILED" | "FINISHED" | "CANCELED")
            )
        {
            bail!("job {job} ended without a first record: {details}");
        }
        last = details;
        Ok(first)
    })
    .with_context(|| format!("job {job} reported no first record: {last}"))?;
    Ok(((first - sent) as f64, job))
}

/// How long job `job`'s running attempt took from its tasks' start to the last one built, ms
/// (its executor reports it with its next figures).
fn tasks_ready(client: &Client, job: &str) -> Result<f64> {
    poll(Duration::from_secs(30), || {
        let details = call(client, "GET", &format!("/jobs/{job}"), None)?;
        Ok(details["tasksReadyMs"].as_f64())
    })
    .with_context(|| format!("job {job} reported no tasks ready"))
}

fn wait_for_end(client: &Client, job: &str) -> Result<()> {
    poll(Duration::from_secs(120), || {
        let details = call(client, "GET", &format!("/jobs/{job}"), None)?;
        Ok(matches!(details["state"].as_str(), Some("FINISHED" | "CANCELED")).then_some(()))
    })
    .with_context(|| format!("job {job} did not end"))
}

/// Long enough (about a second) that the first record is seen while the job still runs.
const ARGS: [&str; 5] = ["--events", "1000000", "--keys", "64", "--discard"];

/// The same job in this process, as `weir run` starts it (the environment made, the job
/// built, its tasks deployed) → its first record.
fn embedded_first_record() -> Result<f64> {
    let options = RunOptions::default();
    let monitor = options.monitor.clone();
    let (started, run) = spawn_embedded(&ARGS, &[], options)?;
    let first = poll(Duration::from_secs(60), || {
        Ok(monitor
            .emitted_any()
            .then(|| started.elapsed().as_secs_f64() * 1000.0))
    })
    .context("the embedded job's first record was not seen")?;
    run.join().expect("the job's thread")??;
    Ok(first)
}

/// The job's thread: `Err` if the job could not be built, else how it ended.
pub(crate) type Embedded = std::thread::JoinHandle<Result<Result<(), weir_engine::JobError>>>;

/// Starts `sequence-check` with `args` on one slot in this process, as `weir run` starts it
/// (the environment made with the configuration `config` adds to the default, the job
/// built, its tasks deployed), on a thread of its own: when it started (its arguments
/// read), and the thread.
pub(crate) fn spawn_embedded(
    args: &[&str],
    config: &[(&str, &str)],
    options: RunOptions,
) -> Result<(Instant, Embedded)> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let args = builtin::parse_args(&args).map_err(anyhow::Error::msg)?;
    let mut configuration = Configuration::default().with("taskmanager.numberOfTaskSlots", "1")?;
    for &(key, value) in config {
        configuration = configuration.with(key, value)?;
    }
    let started = Instant::now();
    let run = std::thread::spawn(move || {
        let env = StreamEnvironment::new(configuration)?;
        let name = builtin::build(&env, Job::SequenceCheck, &args)?;
        Ok(env.execute_with(name, options).map(|_| ()))
    });
    Ok((started, run))
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Runs the benchmark: `rounds` submissions, as many embedded starts alternating with them,
/// and `rounds` submissions from one savepoint of a job of `keys` keys, taken when it had read
/// 90 % of its input (the state of about 90 % of its keys).
pub fn run(rounds: usize, keys: u32) -> Result<SubmitReport> {
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "weir-bench-submit-{:x}",
        crate::control_plane::nonce()
    ));
    std::fs::create_dir_all(&dir)?;
    // Declared first, so dropped after the processes.
    let _cleanup = Cleanup(dir.clone());
    let checkpoints = dir.join("checkpoints");
    let (_control, _worker, address) = start_cluster(
        &dir,
        &[
            "heartbeat.interval=1s".into(),
            "heartbeat.timeout=10s".into(),
            "execution.checkpointing.interval=1s".into(),
            format!("execution.checkpointing.dir={}", checkpoints.display()),
        ],
    )?;
    let client = Client::new(ControlEndpoint::plain(&address));

    let body = json!({ "entryClass": "sequence-check", "programArgsList": ARGS });
    let (mut submitted, mut embedded, mut ready) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (ms, job) = first_record(&client, &body)?;
        submitted.push(ms);
        ready.push(tasks_ready(&client, &job)?);
        wait_for_end(&client, &job)?;
        embedded.push(embedded_first_record()?);
    }

    // A savepoint of a job that read 90 % of its input: two records of each of `keys` keys,
    // in 10 s. Its one reader reads its splits one after another, so the keys it has seen
    // are those of the splits it has read — 90 % of them when it stops after 9 s.
    let stateful = [
        "--events".to_string(),
        (2 * u64::from(keys)).to_string(),
        "--keys".into(),
        keys.to_string(),
        "--rate".into(),
        (u64::from(keys) / 5).max(1).to_string(),
        "--discard".into(),
    ];
    let body = json!({ "entryClass": "sequence-check", "programArgsList": stateful });
    let (_, job) = first_record(&client, &body)?;
    std::thread::sleep(Duration::from_secs(9));
    let stopped = call(
        &client,
        "POST",
        &format!("/jobs/{job}/stop"),
        Some(&json!({})),
    )?;
    let request = stopped["request-id"].as_str().context("a request id")?;
    let savepoint = client
        .wait_for(
            &job,
            &format!("/jobs/{job}/savepoints/{request}"),
            Duration::from_secs(120),
        )
        .map_err(|f| anyhow::anyhow!("{}", f.message))?;
    let path = savepoint["operation"]["location"]
        .as_str()
        .context("the savepoint's location")?
        .to_string();
    // Its slot is free once the stopped run ended.
    wait_for_end(&client, &job)?;
    let details = call(&client, "GET", &format!("/jobs/{job}"), None)?;
    let read = details["vertices"][0]["metrics"]["write-records"]
        .as_u64()
        .with_context(|| format!("the stopped job's records read: {details}"))?;
    let (mut restored, mut restore_ready) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let body = json!({
            "entryClass": "sequence-check",
            "programArgsList": stateful,
            "savepointPath": path,
        });
        let (ms, job) = first_record(&client, &body)?;
        restored.push(ms);
        restore_ready.push(tasks_ready(&client, &job)?);
        // It reads the rest of its input in about a second: it may have ended already.
        if let Err(error) = call(&client, "PATCH", &format!("/jobs/{job}?mode=cancel"), None) {
            let details = call(&client, "GET", &format!("/jobs/{job}"), None)?;
            if details["state"] != "FINISHED" {
                return Err(error);
            }
        }
        wait_for_end(&client, &job)?;
    }
    let submit = Quantiles::of(submitted);
    let embed = Quantiles::of(embedded);
    Ok(SubmitReport {
        rounds,
        ratio: submit.p50 / embed.p50,
        submit_to_first_record_ms: submit,
        embedded_to_first_record_ms: embed,
        tasks_ready_ms: Quantiles::of(ready),
        restore_submit_to_first_record_ms: Quantiles::of(restored),
        restore_tasks_ready_ms: Quantiles::of(restore_ready),
        savepoint_keys: keys_read(keys, read),
        savepoint_bytes: dir_bytes(Path::new(&path)),
    })
}

/// The keys of the stateful job (`keys` keys, two records each) whose records are among the
/// first `read`: its reader reads split after split, each split's keys in turn.
fn keys_read(keys: u32, read: u64) -> u64 {
    let spec = weir_examples::sequence_check::SequenceSpec::of_cli(2 * u64::from(keys), keys, None);
    let per_split = u64::from(spec.keys_per_split);
    let split_records = per_split * spec.per_key;
    let (whole, part) = (read / split_records, read % split_records);
    (whole * per_split + part.min(per_split)).min(u64::from(spec.keys()))
}

/// Removes the benchmark's directory when dropped.
pub(crate) struct Cleanup(pub(crate) PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
