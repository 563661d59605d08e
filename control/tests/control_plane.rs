//! The control plane with real worker processes on loopback: jobs submitted over the REST API
//! run in executor processes, finish, cancel and fail over; bad requests get clear 4xx answers;
//! a SIGKILLed worker's job restarts from its checkpoint on another worker with nothing lost or
//! repeated; a SIGKILLed control plane, started again, finds its running job.

#[path = "common/netns.rs"]
mod netns;
#[path = "common/parts.rs"]
mod parts;
#[path = "common/process.rs"]
mod process;

use parts::read_parts;
use process::Process;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use weir_examples::sequence_check::{
    echo_problems, problems, EchoCheck, Echoed, KeyReport, SequenceSpec,
};

const WEIR: &str = env!("CARGO_BIN_EXE_weir");

/// A control plane on a free loopback port, with its store in `dir/control`.
struct ControlPlane {
    _process: Process,
    address: String,
}

/// Settings every process of a test cluster gets: fast heartbeats (a lost worker's jobs fail
/// over after 3 s), with room for a loaded 2-core machine.
const FAST: [&str; 2] = ["heartbeat.interval=200ms", "heartbeat.timeout=3s"];

fn start_control(dir: &Path, port: u16, settings: &[&str]) -> ControlPlane {
    let mut command = Command::new(WEIR);
    command.args([
        "control",
        "-D",
        &format!("control.data-dir={}", dir.join("control").display()),
    ]);
    command.args([
        "-D",
        &format!("rest.port={port}"),
        "-D",
        "rest.address=127.0.0.1",
    ]);
    for setting in FAST.iter().chain(settings) {
        command.args(["-D", setting]);
    }
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start weir control");
    // Its first line names the address it listens on.
    let url = process::word_after(&mut child, "weir control: REST API on ");
    let (_, address) = url.split_once("://").expect("a URL");
    ControlPlane {
        _process: Process(child),
        address: address.to_string(),
    }
}

/// Adds to `command` (`weir` and its global options) a worker with `cores` as its slots,
/// registering with `control`, keeping its data in `dir/name`, with `settings`.
fn worker_args(
    command: &mut Command,
    dir: &Path,
    name: &str,
    control: &ControlPlane,
    cores: &str,
    settings: &[&str],
) {
    command.args(["worker", "--control", &control.address]);
    command.args([
        "-D",
        &format!("worker.data-dir={}", dir.join(name).display()),
    ]);
    command.args(["-D", &format!("taskmanager.cpu.cores={cores}")]);
    // Several workers on one host: each its own /metrics port.
    command.args(["-D", "metrics.reporter.prom.port=0"]);
    command.args(["-D", "metrics.reporter.prom.host=127.0.0.1"]);
    for setting in FAST.iter().chain(settings) {
        command.args(["-D", setting]);
    }
}

/// The address of the `/metrics` a worker printed among `lines`, once it did.
fn worker_metrics_url(lines: &std::sync::Mutex<Vec<String>>) -> String {
    wait_for(
        "the worker's /metrics address",
        Duration::from_secs(30),
        || {
            lines.lock().unwrap().iter().find_map(|line| {
                let (_, url) = line.split_once(": metrics on ")?;
                url.split_whitespace().next().map(str::to_string)
            })
        },
    )
}

/// A worker with `cores` as its slots, registered with `control`.
fn start_worker(
    dir: &Path,
    name: &str,
    control: &ControlPlane,
    cores: &str,
    settings: &[&str],
) -> Process {
    spawn_worker(Command::new(WEIR), dir, name, control, cores, settings)
}

/// [`start_worker`] run by `command` (`weir`, or `weir` inside a network namespace).
fn spawn_worker(
    mut command: Command,
    dir: &Path,
    name: &str,
    control: &ControlPlane,
    cores: &str,
    settings: &[&str],
) -> Process {
    worker_args(&mut command, dir, name, control, cores, settings);
    Process(
        command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start weir worker"),
    )
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

/// Asserts that `answer` (a status and its body) is a refusal with `status` whose first
/// error names `fragment`.
fn refused((got, answer): (u16, Value), status: u16, fragment: &str) {
    assert_eq!(got, status, "{answer}");
    let message = answer["errors"][0].as_str().unwrap_or_default();
    assert!(message.contains(fragment), "{answer}");
}

/// A request's status and JSON answer.
fn call(control: &ControlPlane, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    call_with(control, method, path, body, &[])
}

fn call_with(
    control: &ControlPlane,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let url = format!("http://{}{path}", control.address);
    let agent = agent();
    let mut response = match method {
        "GET" => {
            let mut request = agent.get(&url);
            for (k, v) in headers {
                request = request.header(*k, *v);
            }
            request.call()
        }
        "DELETE" => agent.delete(&url).call(),
        _ => {
            let mut request = match method {
                "POST" => agent.post(&url),
                "PATCH" => agent.patch(&url),
                "PUT" => agent.put(&url),
                other => panic!("no method {other}"),
            };
            let mut json = true;
            for (k, v) in headers {
                json &= !k.eq_ignore_ascii_case("content-type");
                request = request.header(*k, *v);
            }
            if json {
                request = request.header("content-type", "application/json");
            }
            request.send(body.unwrap_or(""))
        }
    }
    .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().expect("a body");
    let value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{method} {path} answered {status} with no JSON ({e}): {text}"));
    (status, value)
}

fn get(control: &ControlPlane, path: &str) -> Value {
    let (status, value) = call(control, "GET", path, None);
    assert_eq!(status, 200, "GET {path}: {value}");
    value
}

/// Runs `command` to its end, killing it after `limit`.
fn output_within(mut command: Command, limit: Duration) -> std::process::Output {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start weir");
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output().expect("wait for weir"));
    });
    finished.recv_timeout(limit).unwrap_or_else(|_| {
        // SAFETY: kill(2) of the child this test started and whose waiter still runs.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        panic!("{command:?} did not end within {limit:?}")
    })
}

/// Runs the CLI command `args` against `control` (`--control` right after the subcommand:
/// the command's own options go before a job's arguments), killed after `limit`.
fn weir_cli(control: &ControlPlane, args: &[&str], limit: Duration) -> std::process::Output {
    // After the (sub)command's name, before its arguments.
    let name = if args[0] == "checkpoint" { 2 } else { 1 };
    let mut command = Command::new(WEIR);
    command
        .args(&args[..name])
        .args(["--control", &control.address])
        .args(&args[name..]);
    output_within(command, limit)
}

/// The first value a Prometheus server on `port` answers `query` with.
fn prometheus_value(port: u16, query: &str) -> Option<f64> {
    let mut response = agent()
        .get(&format!("http://127.0.0.1:{port}/api/v1/query"))
        .query("query", query)
        .call()
        .ok()?;
    let answer: Value = serde_json::from_str(&response.body_mut().read_to_string().ok()?).ok()?;
    answer["data"]["result"][0]["value"][1]
        .as_str()?
        .parse::<f64>()
        .ok()
}

/// Waits up to `limit` for `done` to return something.
fn wait_for<T>(what: &str, limit: Duration, mut done: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = done() {
            return value;
        }
        assert!(started.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_for_workers(control: &ControlPlane, count: usize) {
    wait_for(
        &format!("{count} worker(s)"),
        Duration::from_secs(20),
        || {
            let workers = get(control, "/taskmanagers");
            (workers["taskmanagers"].as_array().map_or(0, Vec::len) == count).then_some(())
        },
    );
}

/// Submits `job` of the built-in package; returns its id.
fn submit(control: &ControlPlane, job: &str, args: &[&str], parallelism: usize) -> String {
    let body = json!({ "entryClass": job, "programArgsList": args, "parallelism": parallelism });
    let (status, answer) = call(
        control,
        "POST",
        "/jars/weir-builtin/run",
        Some(&body.to_string()),
    );
    assert_eq!(status, 200, "submit {job}: {answer}");
    answer["jobid"].as_str().expect("a job id").to_string()
}

fn state(control: &ControlPlane, job: &str) -> String {
    get(control, &format!("/jobs/{job}"))["state"]
        .as_str()
        .expect("a state")
        .to_string()
}

fn wait_for_state(control: &ControlPlane, job: &str, wanted: &str, limit: Duration) -> Value {
    wait_for(&format!("job {job} to be {wanted}"), limit, || {
        let details = get(control, &format!("/jobs/{job}"));
        let now = details["state"].as_str().unwrap_or_default();
        assert!(
            wanted == now || !matches!(now, "FINISHED" | "FAILED" | "CANCELED"),
            "job {job} ended {now} instead of {wanted}: {details}\n{}",
            get(control, &format!("/jobs/{job}/exceptions"))
        );
        (now == wanted).then_some(details)
    })
}

#[test]
fn jobs_submitted_over_rest_run_finish_and_cancel_on_a_worker() {
    let dir = tempfile::tempdir().unwrap();
    let control = start_control(dir.path(), 0, &[]);
    let _worker = start_worker(dir.path(), "worker", &control, "0,1", &[]);
    wait_for_workers(&control, 1);
    let overview = get(&control, "/overview");
    assert_eq!(overview["slots-total"], 2, "{overview}");
    let workers = get(&control, "/taskmanagers");
    let worker = &workers["taskmanagers"][0];
    assert_eq!(worker["slotsNumber"], 2, "{worker}");
    assert!(
        worker["memoryConfiguration"]["managedMemory"]
            .as_u64()
            .unwrap()
            > 0,
        "{worker}"
    );
    refused(
        upload(&control, "jarfile", "p", b"#!/bin/sh\n"),
        403,
        "web.upload.enabled",
    );
    let jars = get(&control, "/jars");
    let entries: Vec<&str> = jars["files"][0]["entry"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        entries.contains(&"sequence-check") && entries.contains(&"word-count"),
        "{jars}"
    );

    // A bounded job at parallelism 2 runs to its end and reports its counts.
    let out = dir.path().join("out");
    let spec = SequenceSpec::of_cli(64_000, 64, None);
    let finished = submit(
        &control,
        "sequence-check",
        &[
            "--events",
            "64000",
            "--keys",
            "64",
            "--output",
            out.to_str().unwrap(),
        ],
        2,
    );
    let details = wait_for_state(&control, &finished, "FINISHED", Duration::from_secs(60));
    assert_eq!(details["attempts"], 1, "{details}");
    let source = details["vertices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["metrics"]["write-records"] == 64_000)
        .unwrap_or_else(|| panic!("no vertex wrote the 64000 records: {details}"));
    assert_eq!(source["parallelism"], 2, "{details}");
    let reports: Vec<KeyReport> = read_parts(&out)
        .iter()
        .map(|l| KeyReport::parse(l).unwrap_or_else(|| panic!("a bad line: {l}")))
        .collect();
    assert_eq!(problems(spec, &reports), Vec::<String>::new());

    // An unbounded-for-the-test job (throttled) runs until cancelled.
    let slow = submit(
        &control,
        "sequence-check",
        &["--events", "100000000", "--rate", "1000", "--discard"],
        1,
    );
    wait_for(
        "the slow job's tasks to run",
        Duration::from_secs(30),
        || {
            get(&control, &format!("/jobs/{slow}"))["placement"]["running"]
                .as_bool()
                .filter(|&r| r)
        },
    );
    assert_eq!(get(&control, "/overview")["slots-available"], 1);
    // Its plan: at parallelism 1 on one worker every edge is chained, none remote.
    let edges = wait_for("the slow job's plan", Duration::from_secs(30), || {
        let details = get(&control, &format!("/jobs/{slow}"));
        details["plan"]["edges"]
            .as_array()
            .filter(|edges| !edges.is_empty())
            .cloned()
    });
    assert!(
        edges
            .iter()
            .all(|e| e["exchange"] == "chained" && e["remote-channels"] == 0),
        "{edges:?}"
    );
    // Without checkpointing, checkpoints and savepoints are refused, naming the settings.
    for (path, what) in [
        ("/savepoints", "a savepoint"),
        ("/checkpoints", "a checkpoint"),
    ] {
        let (status, answer) = call(&control, "POST", &format!("/jobs/{slow}{path}"), Some("{}"));
        assert_eq!(status, 409, "{answer}");
        let message = answer["errors"][0].as_str().unwrap();
        assert!(
            message.contains(what) && message.contains("execution.checkpointing.interval"),
            "{answer}"
        );
    }
    refused(
        call(
            &control,
            "GET",
            &format!("/jobs/{slow}/checkpoints/no-such-request"),
            None,
        ),
        404,
        "no checkpoint request 'no-such-request'",
    );
    let refusals = [
        (
            "/stop",
            "{\"targetDirectory\": \"/elsewhere\"}",
            "execution.checkpointing.savepoint-dir",
        ),
        ("/rescaling", "", "parallelism"),
        ("/rescaling?parallelism=0", "", "at least 1"),
        ("/savepoints", "{\"formatType\": \"NATIVE\"}", "CANONICAL"),
        ("/savepoints", "{\"colour\": 1}", "unknown field `colour`"),
        (
            "/checkpoints",
            "{\"checkpointType\": \"FULL\"}",
            "CONFIGURED",
        ),
        ("/checkpoints", "{\"checkpointType\": 3}", "invalid type"),
        // curl -d sends a form body: refused, never read as no body.
        ("/stop", "drain=true", "request body"),
    ];
    for (path, body, fragment) in refusals {
        let (status, answer) = call(&control, "POST", &format!("/jobs/{slow}{path}"), Some(body));
        assert_eq!(status, 400, "{path}: {answer}");
        assert!(
            answer["errors"][0].as_str().unwrap().contains(fragment),
            "{path}: {answer}"
        );
    }
    assert_eq!(state(&control, &slow), "RUNNING");
    let (status, answer) = call(
        &control,
        "PATCH",
        &format!("/jobs/{slow}?mode=cancel"),
        None,
    );
    assert_eq!(status, 202, "{answer}");
    wait_for_state(&control, &slow, "CANCELED", Duration::from_secs(30));
    refused(
        call(
            &control,
            "PATCH",
            &format!("/jobs/{slow}?mode=cancel"),
            None,
        ),
        409,
        "is CANCELED",
    );

    let overview = get(&control, "/overview");
    assert_eq!(overview["jobs-finished"], 1, "{overview}");
    assert_eq!(overview["jobs-cancelled"], 1, "{overview}");
    assert_eq!(overview["slots-available"], 2, "{overview}");
    let listed = get(&control, "/jobs/overview");
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 2, "{listed}");

    // The CLI, as a client of the same API.
    let cli = |args: &[&str]| weir_cli(&control, args, Duration::from_secs(60));
    let listing = cli(&["list", "--all"]);
    assert!(listing.status.success());
    let text = String::from_utf8_lossy(&listing.stdout);
    assert!(
        text.contains(&finished) && text.contains("FINISHED") && text.contains("CANCELED"),
        "{text}"
    );
    let status = cli(&["status", &slow]);
    assert!(status.status.success());
    assert!(String::from_utf8_lossy(&status.stdout).contains("CANCELED"));
    let refused = cli(&["cancel", &finished]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("409"));
    let (status, answer) = call(
        &control,
        "POST",
        &format!("/jobs/{finished}/savepoints"),
        Some("{}"),
    );
    assert_eq!(status, 409, "{answer}");
    let submitted = cli(&["submit", "--json", "word-count"]);
    assert!(
        submitted.status.success(),
        "{}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    let id: Value = serde_json::from_slice(&submitted.stdout).unwrap();
    wait_for_state(
        &control,
        id["jobid"].as_str().unwrap(),
        "FINISHED",
        Duration::from_secs(60),
    );
    let mut list = Command::new(WEIR);
    list.args(["list", "--control", "127.0.0.1:1"]);
    let unreachable = output_within(list, Duration::from_secs(60));
    assert_eq!(unreachable.status.code(), Some(69));
}

#[test]
fn bad_requests_get_a_clear_4xx_and_the_control_plane_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let limits = [
        "web.upload.enabled=true",
        "rest.server.max-content-length=1m",
    ];
    let control = start_control(dir.path(), 0, &limits);
    let run = "/jars/weir-builtin/run";
    let cases: [(&str, &str, Option<&str>, u16, &str); 13] = [
        ("POST", run, Some("{\"entryClass\": "), 400, "request body"),
        (
            "POST",
            run,
            Some("{\"entryClass\": \"word-count\", \"colour\": 1}"),
            400,
            "unknown field `colour`",
        ),
        (
            "POST",
            run,
            Some("{\"entryClass\": 7}"),
            400,
            "invalid type",
        ),
        (
            "POST",
            run,
            Some("{\"entryClass\": \"word-count\", \"parallelism\": -1}"),
            400,
            "parallelism",
        ),
        (
            "POST",
            run,
            Some("{\"entryClass\": \"word-count\", \"parallelism\": 0}"),
            400,
            "at least 1",
        ),
        ("POST", run, Some("{}"), 400, "entryClass is missing"),
        (
            "POST",
            run,
            Some("{\"entryClass\": \"nope\"}"),
            400,
            "'nope' is not a job of jar 'weir-builtin'",
        ),
        (
            "POST",
            run,
            Some("{\"entryClass\": \"word-count\", \"programArgs\": \"--colour red\"}"),
            400,
            "'--colour'",
        ),
        (
            "POST",
            run,
            Some("{\"entryClass\": \"word-count\", \"programArgs\": \"--input 'x\"}"),
            400,
            "unclosed",
        ),
        (
            "POST",
            "/jars/nope/run",
            Some("{\"entryClass\": \"word-count\"}"),
            404,
            "no jar 'nope'",
        ),
        ("GET", "/jobs/0123", None, 404, "no job '0123'"),
        ("DELETE", "/jobs", None, 405, "does not take DELETE"),
        (
            "GET",
            "/nothing/here",
            None,
            404,
            "no endpoint GET /nothing/here",
        ),
    ];
    for (method, path, body, status, fragment) in cases {
        let (got, answer) = call(&control, method, path, body);
        let message = answer["errors"][0].as_str().unwrap_or_default();
        assert_eq!(got, status, "{method} {path} {body:?}: {answer}");
        assert!(
            message.contains(fragment),
            "{method} {path} {body:?}: '{message}' lacks '{fragment}'"
        );
    }
    refused(
        call_with(
            &control,
            "POST",
            run,
            Some("entryClass=x"),
            &[("content-type", "text/plain")],
        ),
        400,
        "Content-Type: application/json",
    );
    let (got, answer) = call(&control, "PATCH", "/jobs/0123?mode=stop", None);
    assert_eq!(got, 400, "{answer}");
    let (got, answer) = upload(&control, "jarfile", "big", &vec![0u8; 2 << 20]);
    assert_eq!(got, 413, "{answer}");
    let message = answer["errors"][0].as_str().unwrap();
    assert!(
        message.contains("rest.server.max-content-length"),
        "{message}"
    );
    // Still serving, with nothing accepted.
    assert_eq!(get(&control, "/jobs")["jobs"], json!([]));
}

#[test]
fn a_token_guards_every_request_and_the_workers_link() {
    let dir = tempfile::tempdir().unwrap();
    let token = "rest.auth.token=s3cret";
    let control = start_control(dir.path(), 0, &[token]);
    refused(
        call(&control, "GET", "/overview", None),
        401,
        "no bearer token",
    );
    refused(
        call_with(
            &control,
            "GET",
            "/overview",
            None,
            &[("authorization", "Bearer guess")],
        ),
        401,
        "wrong bearer token",
    );
    let (status, _) = call_with(
        &control,
        "GET",
        "/overview",
        None,
        &[("authorization", "Bearer s3cret")],
    );
    assert_eq!(status, 200);

    // A worker without the token is refused and says why; one with it registers.
    let mut worker = Command::new(WEIR);
    worker
        .args([
            "worker",
            "--control",
            &control.address,
            "-D",
            "taskmanager.cpu.cores=0",
        ])
        .args([
            "-D",
            &format!("worker.data-dir={}", dir.path().join("w0").display()),
        ])
        .args(["-D", "metrics.reporter.prom.port=0"]);
    let refused = output_within(worker, Duration::from_secs(60));
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("rest.auth.token"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let _worker = start_worker(dir.path(), "w1", &control, "0", &[token]);
    wait_for("the worker with the token", Duration::from_secs(20), || {
        let (_, workers) = call_with(
            &control,
            "GET",
            "/taskmanagers",
            None,
            &[("authorization", "Bearer s3cret")],
        );
        (workers["taskmanagers"].as_array().map_or(0, Vec::len) == 1).then_some(())
    });
}

/// The settings of a cluster member reaching or serving the control plane over mutual TLS:
/// node `node`'s certificate in `certs`.
fn rest_tls(certs: &Path, node: &str) -> Vec<String> {
    vec![
        "security.ssl.rest.enabled=true".into(),
        format!("security.ssl.internal.dir={}", certs.display()),
        format!("security.ssl.internal.node={node}"),
    ]
}

/// An HTTPS client trusting the CA in `trusted` (its `ca.pem`) and presenting `presented`'s
/// node certificate, if any (a directory and a node).
fn tls_agent(trusted: &Path, presented: Option<(&Path, &str)>) -> ureq::Agent {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};
    let read = |path: std::path::PathBuf| std::fs::read(path).unwrap();
    let ca = Certificate::from_pem(&read(trusted.join("ca.pem"))).unwrap();
    let client = presented.map(|(dir, node)| {
        let cert = Certificate::from_pem(&read(dir.join(format!("{node}.pem")))).unwrap();
        let key = PrivateKey::from_pem(&read(dir.join(format!("{node}-key.pem")))).unwrap();
        ClientCert::new_with_certs(&[cert], key)
    });
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .tls_config(
            TlsConfig::builder()
                .root_certs(RootCerts::new_with_certs(&[ca]))
                .client_cert(client)
                .unversioned_rustls_crypto_provider(weir_net::tls::provider())
                .build(),
        )
        .build()
        .into()
}

/// `url`'s JSON answer, if it answered 200.
fn answer(agent: &ureq::Agent, url: &str) -> Result<Value, String> {
    let mut response = agent.get(url).call().map_err(|e| e.to_string())?;
    if response.status() != 200 {
        return Err(format!("status {}", response.status()));
    }
    response.body_mut().read_json().map_err(|e| e.to_string())
}

/// With security.ssl.rest.enabled the control plane's port speaks mutual TLS only: a worker
/// and the CLI holding the cluster CA's certificates register, submit and see a job finish;
/// plain HTTP, a client presenting no certificate, and a client or worker whose certificate
/// another CA signed are refused (the refused worker and CLI say why), and the control plane
/// serves its members on.
#[test]
fn over_mutual_tls_only_the_cluster_ca_s_members_reach_the_control_plane() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certificates(dir.path(), &["control=127.0.0.1", "worker-1", "operator"]);
    let other = certificates(&dir.path().join("other"), &["worker-1", "operator"]);
    let control = start_control(dir.path(), 0, &strs(&rest_tls(&certs, "control")));
    let url = |path: &str| format!("https://{}{path}", control.address);
    let member = tls_agent(&certs, Some((&certs, "operator")));
    let _worker = start_worker(
        dir.path(),
        "w1",
        &control,
        "0",
        &strs(&rest_tls(&certs, "worker-1")),
    );
    wait_for("the worker over TLS", Duration::from_secs(30), || {
        let workers = answer(&member, &url("/taskmanagers")).ok()?;
        (workers["taskmanagers"].as_array().map_or(0, Vec::len) == 1).then_some(())
    });

    // The CLI with the operator's certificate: a job submitted runs on the worker to its end.
    let cli = |certs: &Path, args: &[&str]| {
        let mut command = Command::new(WEIR);
        command
            .args(&args[..1])
            .args(["--control", &control.address]);
        for setting in rest_tls(certs, "operator") {
            command.args(["-D", &setting]);
        }
        command.args(&args[1..]);
        output_within(command, Duration::from_secs(60))
    };
    let submitted = cli(&certs, &["submit", "--json", "word-count"]);
    let stderr =
        |output: &std::process::Output| String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let job: Value = serde_json::from_slice(&submitted.stdout).unwrap();
    let job = job["jobid"].as_str().unwrap().to_string();
    wait_for(
        "the job over TLS to finish",
        Duration::from_secs(60),
        || {
            let details = answer(&member, &url(&format!("/jobs/{job}"))).ok()?;
            (details["state"] == "FINISHED").then_some(())
        },
    );

    // Refused: plain HTTP, TLS without a client certificate, another CA's certificate.
    assert!(answer(&agent(), &format!("http://{}/overview", control.address)).is_err());
    let anonymous = tls_agent(&certs, None);
    assert!(answer(&anonymous, &url("/overview")).is_err());
    let foreign = tls_agent(&certs, Some((&other, "operator")));
    assert!(answer(&foreign, &url("/overview")).is_err());
    // The CLI of another cluster does not trust this control plane, and says so.
    let outsider = cli(&other, &["list"]);
    assert_eq!(outsider.status.code(), Some(69), "{}", stderr(&outsider));
    assert!(
        stderr(&outsider).contains("over TLS"),
        "{}",
        stderr(&outsider)
    );
    // A worker trusting this cluster's CA but presenting another's certificate: refused by
    // the control plane, it ends saying so.
    let mixed = dir.path().join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    std::fs::copy(certs.join("ca.pem"), mixed.join("ca.pem")).unwrap();
    for file in ["worker-1.pem", "worker-1-key.pem"] {
        std::fs::copy(other.join(file), mixed.join(file)).unwrap();
    }
    let mut intruder = Command::new(WEIR);
    worker_args(
        &mut intruder,
        dir.path(),
        "w2",
        &control,
        "0",
        &strs(&rest_tls(&mixed, "worker-1")),
    );
    let intruder = output_within(intruder, Duration::from_secs(60));
    assert!(!intruder.status.success());
    assert!(
        stderr(&intruder).contains("refused this side's certificate"),
        "{}",
        stderr(&intruder)
    );

    // And the members are still served: one worker, the finished job.
    let workers = answer(&member, &url("/taskmanagers")).unwrap();
    assert_eq!(
        workers["taskmanagers"].as_array().map_or(0, Vec::len),
        1,
        "{workers}"
    );
    let listed = cli(&certs, &["list", "--all"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(String::from_utf8_lossy(&listed.stdout).contains(&job));
}

/// The run's checkpoint settings: every 100 ms into `dir/checkpoints`, restarts after 200 ms.
fn checkpointed(dir: &Path) -> [String; 5] {
    [
        "execution.checkpointing.interval=100ms".into(),
        format!(
            "execution.checkpointing.dir={}",
            dir.join("checkpoints").display()
        ),
        "restart-strategy.type=fixed-delay".into(),
        "restart-strategy.fixed-delay.attempts=3".into(),
        "restart-strategy.fixed-delay.delay=200ms".into(),
    ]
}

/// Waits until a job completed a checkpoint in `dir` (`execution.checkpointing.dir/<job
/// id>`), of generation `generation` (the starts from a savepoint after its submission),
/// as job `name`.
fn wait_for_checkpoint(dir: &Path, generation: &str, name: &str) {
    let checkpoints = dir.join(generation).join(name);
    wait_for("a completed checkpoint", Duration::from_secs(60), || {
        latest_checkpoint(&checkpoints).map(|_| ())
    });
}

/// The number of the latest checkpoint completed in `dir`, if one did.
fn latest_checkpoint(dir: &Path) -> Option<u64> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.path().join("_metadata").exists())
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("chk-")?.parse().ok())
        .max()
}

/// Checks the records the job wrote into `out`: every one of `events` over `keys`, once, in
/// order.
fn every_record_once(out: &Path, events: u64, keys: u32) {
    let records: Vec<Echoed> = read_parts(out)
        .iter()
        .map(|l| Echoed::parse(l).unwrap_or_else(|| panic!("a bad line: {l}")))
        .collect();
    assert_eq!(
        echo_problems(SequenceSpec::of_cli(events, keys, None), &records),
        EchoCheck::default(),
        "lost, duplicated, out of order or miscounted records"
    );
}

/// Checks that attempt `attempt` of job `job`, on the worker keeping its data in `dir/worker`,
/// resumed from a checkpoint.
fn assert_resumed(dir: &Path, worker: &str, job: &str, attempt: u32) {
    let log = dir
        .join(worker)
        .join("deployments")
        .join(format!("{job}-{attempt}"))
        .join("executor.log");
    let log = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    assert!(
        log.contains("resumes from checkpoint"),
        "the restart did not resume:\n{log}"
    );
}

#[test]
fn a_killed_workers_job_restarts_on_another_from_its_checkpoint_losing_and_repeating_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let settings = checkpointed(dir.path());
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let control = start_control(dir.path(), 0, &settings);
    let mut workers = [
        Some(start_worker(dir.path(), "a", &control, "0", &[])),
        Some(start_worker(dir.path(), "b", &control, "1", &[])),
    ];
    wait_for_workers(&control, 2);
    let out = dir.path().join("out");
    let (events, keys) = (200_000, 64);
    let job = submit(
        &control,
        "sequence-echo",
        &[
            "--events",
            "200000",
            "--keys",
            "64",
            "--rate",
            "20000",
            "--output",
            out.to_str().unwrap(),
        ],
        1,
    );
    wait_for_checkpoint(
        &dir.path().join("checkpoints").join(&job),
        "0",
        "sequence-echo",
    );
    let details = get(&control, &format!("/jobs/{job}"));
    let holder = details["placement"]["executors"][0]["taskmanager"]
        .as_str()
        .unwrap()
        .to_string();
    let pids = worker_pids(&control);
    let pid = pids.iter().find(|(id, _)| *id == holder).unwrap().1;
    let index = workers
        .iter()
        .position(|w| w.as_ref().is_some_and(|p| p.0.id() == pid))
        .expect("the job's worker is one this test started");
    // SIGKILL: its executor dies with it (parent-death signal).
    drop(workers[index].take());

    let details = wait_for_state(&control, &job, "FINISHED", Duration::from_secs(120));
    assert_eq!(details["attempts"], 2, "{details}");
    let exceptions = get(&control, &format!("/jobs/{job}/exceptions"));
    assert!(
        exceptions["root-exception"]
            .as_str()
            .unwrap()
            .contains(&format!("worker {holder}")),
        "{exceptions}"
    );
    assert_resumed(dir.path(), ["a", "b"][1 - index], &job, 2);
    every_record_once(&out, events, keys);
}

/// Certificates of a cluster CA for nodes `nodes`, in `dir/certs` (`weir tune certs`).
fn certificates(dir: &Path, nodes: &[&str]) -> std::path::PathBuf {
    let certs = dir.join("certs");
    let mut command = Command::new(WEIR);
    command.args(["tune", "certs", "--dir", certs.to_str().unwrap()]);
    for node in nodes {
        command.args(["--node", node]);
    }
    let output = command.output().expect("run weir tune certs");
    assert!(output.status.success(), "{output:?}");
    certs
}

/// A worker's settings to take part in runs over several workers: node `node`'s
/// certificate in `certs`, its slots' exchange on `host` (default: where the control plane
/// sees it from) from `port`, and a short idle timeout (a lost peer fails the run quickly).
fn exchange_settings(certs: &Path, node: &str, host: Option<&str>, port: u16) -> Vec<String> {
    let mut settings = vec![
        format!("security.ssl.internal.dir={}", certs.display()),
        format!("security.ssl.internal.node={node}"),
        format!("taskmanager.data.port={port}"),
        "taskmanager.network.idle-timeout=2s".into(),
        "taskmanager.network.connect-timeout=20s".into(),
    ];
    settings.extend(host.map(|host| format!("taskmanager.host={host}")));
    settings
}

/// A free UDP port of loopback (free when asked: a worker's executor binds it again).
fn free_udp_port() -> u16 {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap().port()
}

/// Settings of a worker with one slot on loopback taking part in runs over several workers.
fn loopback_exchange(certs: &Path, node: &str) -> Vec<String> {
    exchange_settings(certs, node, Some("127.0.0.1"), free_udp_port())
}

fn strs(settings: &[String]) -> Vec<&str> {
    settings.iter().map(String::as_str).collect()
}

/// The workers of job `job`'s running executors, once every one runs, with the job's
/// details.
fn wait_for_executors(control: &ControlPlane, job: &str, count: usize) -> (Vec<String>, Value) {
    wait_for(
        &format!("{count} running executors of job {job}"),
        Duration::from_secs(60),
        || {
            let details = get(control, &format!("/jobs/{job}"));
            let executors = details["placement"]["executors"].as_array()?.clone();
            let running = details["placement"]["running"] == true;
            (running && executors.len() == count).then(|| {
                let workers = executors
                    .iter()
                    .map(|e| e["taskmanager"].as_str().unwrap().to_string())
                    .collect();
                (workers, details)
            })
        },
    )
}

/// Workers a and b of `control` on loopback (cores 0 and 1, a slot each, certificates
/// from `certs`).
fn loopback_workers(dir: &Path, certs: &Path, control: &ControlPlane) -> [Option<Process>; 2] {
    let workers = [("a", "0"), ("b", "1")].map(|(name, core)| {
        let settings = loopback_exchange(certs, name);
        Some(start_worker(dir, name, control, core, &strs(&settings)))
    });
    wait_for_workers(control, 2);
    workers
}

/// Sequence-echo at parallelism 2 on `control`'s two workers of a slot each — over both,
/// keyed both ways: each source subtask's records go to both count subtasks — at `rate`
/// records/s per source subtask into `dir/out`, once both executors run: the job and its
/// output directory.
fn echo_over_two(dir: &Path, control: &ControlPlane, rate: &str) -> (String, std::path::PathBuf) {
    let out = dir.join("out");
    let job = submit(
        control,
        "sequence-echo",
        &[
            "--events",
            &ECHO_EVENTS.to_string(),
            "--keys",
            &ECHO_KEYS.to_string(),
            "--rate",
            rate,
            "--output",
            out.to_str().unwrap(),
        ],
        2,
    );
    wait_for_executors(control, &job, 2);
    (job, out)
}

/// What [`echo_over_two`] echoes: records, over keys.
const ECHO_EVENTS: u64 = 200_000;
const ECHO_KEYS: u32 = 64;

#[test]
fn a_job_wider_than_one_worker_runs_over_two_and_writes_every_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certificates(dir.path(), &["a", "b"]);
    let control = start_control(dir.path(), 0, &[]);
    let workers = loopback_workers(dir.path(), &certs, &control);
    let (job, out) = echo_over_two(dir.path(), &control, "25000");
    let (running, details) = wait_for_executors(&control, &job, 2);
    let ids = workers
        .each_ref()
        .map(|w| worker_id(&control, w.as_ref().unwrap()));
    assert!(
        running.iter().all(|w| ids.contains(w)) && running[0] != running[1],
        "{details}"
    );
    let exchange = details["placement"]["exchange"]
        .as_array()
        .expect("a run over two workers");
    assert_eq!(exchange.len(), 2, "{details}");
    // Every subtask shows the worker of its slot, once both executors' figures came.
    let details = wait_for("both executors' figures", Duration::from_secs(30), || {
        let details = get(&control, &format!("/jobs/{job}"));
        let vertices = details["vertices"].as_array()?;
        let both = !vertices.is_empty() && vertices.iter().all(|v| v["parallelism"] == 2);
        both.then_some(details)
    });
    let subtasks: Vec<&Value> = details["vertices"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|v| v["subtasks"].as_array().unwrap())
        .collect();
    for subtask in subtasks {
        let slot = subtask["subtask"].as_u64().unwrap() as usize;
        assert_eq!(subtask["taskmanager"], running[slot], "{details}");
    }
    // The keyed exchange is remote: of its four channels, the two between the slots cross
    // the network; the edges within a task are chained.
    let edges = details["plan"]["edges"]
        .as_array()
        .expect("a running job's plan");
    let keyed: Vec<&Value> = edges
        .iter()
        .filter(|e| e["partitioning"] == "HASH")
        .collect();
    assert!(!keyed.is_empty(), "{details}");
    for edge in keyed {
        assert_eq!(
            (
                &edge["exchange"],
                &edge["channels"],
                &edge["remote-channels"]
            ),
            (&json!("remote"), &json!(4), &json!(2)),
            "{details}"
        );
    }
    assert!(
        edges
            .iter()
            .filter(|e| e["partitioning"] == "FORWARD")
            .all(|e| e["exchange"] == "chained"),
        "{details}"
    );
    let details = wait_for_state(&control, &job, "FINISHED", Duration::from_secs(120));
    assert_eq!(details["attempts"], 1, "{details}");
    every_record_once(&out, ECHO_EVENTS, ECHO_KEYS);
    // Each worker ran an executor of the run.
    for worker in ["a", "b"] {
        let log = dir
            .path()
            .join(worker)
            .join("deployments")
            .join(format!("{job}-1"));
        assert!(log.join("executor.log").exists(), "{}", log.display());
    }
}

#[test]
fn a_killed_worker_ends_the_whole_run_over_two_which_starts_again_on_others() {
    let dir = tempfile::tempdir().unwrap();
    let certs = certificates(dir.path(), &["a", "b", "c"]);
    let settings = [
        "restart-strategy.type=fixed-delay",
        "restart-strategy.fixed-delay.attempts=3",
        "restart-strategy.fixed-delay.delay=200ms",
    ];
    let control = start_control(dir.path(), 0, &settings);
    let mut workers = loopback_workers(dir.path(), &certs, &control);
    let (job, out) = echo_over_two(dir.path(), &control, "10000");
    wait_for(
        "records through both executors",
        Duration::from_secs(30),
        || {
            let details = get(&control, &format!("/jobs/{job}"));
            let counted = details["vertices"]
                .as_array()?
                .iter()
                .flat_map(|v| v["subtasks"].as_array().cloned().unwrap_or_default())
                .filter(|s| s["read-records"].as_u64() > Some(0))
                .count();
            (counted >= 4).then_some(())
        },
    );
    // A third worker, for the restart; then b goes (SIGKILL, its executor with it).
    let settings_c = loopback_exchange(&certs, "c");
    let _c = start_worker(dir.path(), "c", &control, "1", &strs(&settings_c));
    wait_for_workers(&control, 3);
    let killed = worker_id(&control, workers[1].as_ref().unwrap());
    drop(workers[1].take());
    let details = wait_for_state(&control, &job, "FINISHED", Duration::from_secs(120));
    assert_eq!(details["attempts"], 2, "{details}");
    let exceptions = get(&control, &format!("/jobs/{job}/exceptions"));
    let root = exceptions["root-exception"].as_str().unwrap();
    // a's executor lost its channels to b's (or the control plane lost b) first.
    assert!(
        root.contains("node 'b'") || root.contains(&killed),
        "{exceptions}"
    );
    // Without checkpoints the run starts over; its file sinks commit at their end, which
    // the first run's never reached.
    every_record_once(&out, ECHO_EVENTS, ECHO_KEYS);
}

/// Workers a and b of `control`, each in namespace 0 and 1 of `network` (cores 0 and 1, a
/// slot each, certificates from `certs`), registered.
fn namespace_workers(
    network: &netns::Network,
    dir: &Path,
    certs: &Path,
    control: &ControlPlane,
) -> Vec<Process> {
    let workers = ["a", "b"]
        .iter()
        .enumerate()
        .map(|(i, name)| namespace_worker(network, i, name, dir, certs, control))
        .collect();
    wait_for_workers(control, 2);
    workers
}

/// Worker `name` of `control` in namespace `i` of `network` (a slot, on core `i` mod 2),
/// with node `name`'s certificate from `certs`.
fn namespace_worker(
    network: &netns::Network,
    i: usize,
    name: &str,
    dir: &Path,
    certs: &Path,
    control: &ControlPlane,
) -> Process {
    // No taskmanager.host: the address the control plane sees it connect from.
    let settings = exchange_settings(certs, name, None, 6121);
    let command = network.command(i, WEIR);
    let core = (i % 2).to_string();
    spawn_worker(command, dir, name, control, &core, &strs(&settings))
}

#[test]
fn a_job_over_workers_in_network_namespaces_of_their_own_writes_every_record_once_losing_and_queueing_datagrams(
) {
    let Some(network) = netns::Network::start(2) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = certificates(dir.path(), &["a", "b"]);
    let rest = format!("rest.address={}", network.host());
    let control = start_control(dir.path(), 0, &[&rest]);
    let _workers = namespace_workers(&network, dir.path(), &certs, &control);
    // Every namespace drops 2 % of the datagrams it sends (QUIC sends them again), and its link
    // sends 4 Mbit/s, holding what comes faster for up to 100 ms: less than the job sends.
    for i in 0..2 {
        network.lose_udp(i, 2);
        network.queue_to(i, "4mbit", "100ms");
    }
    let (job, out) = echo_over_two(dir.path(), &control, "50000");
    let details = get(&control, &format!("/jobs/{job}"));
    let addresses: Vec<&str> = details["placement"]["exchange"]
        .as_array()
        .expect("a run over two workers")
        .iter()
        .map(|slot| slot["address"].as_str().unwrap())
        .collect();
    let mut expected = [0, 1].map(|i| format!("{}:6121", network.address(i)));
    expected.sort();
    let mut addresses = addresses.clone();
    addresses.sort();
    assert_eq!(addresses, expected, "{details}");
    let details = wait_for_state(&control, &job, "FINISHED", Duration::from_secs(120));
    assert_eq!(details["attempts"], 1, "{details}");
    every_record_once(&out, ECHO_EVENTS, ECHO_KEYS);
    let lost = network.lost_udp(0) + network.lost_udp(1);
    assert!(lost > 0, "no datagram was dropped: the test lost nothing");
    let held = network.held_back(0) + network.held_back(1);
    assert!(
        held > 0,
        "no packet waited for its link: the test queued nothing"
    );
}

#[test]
fn a_killed_worker_of_a_checkpointed_run_over_namespaces_restarts_it_from_its_checkpoint_losing_and_repeating_nothing(
) {
    let Some(network) = netns::Network::start(3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = certificates(dir.path(), &["a", "b", "c"]);
    let mut settings = checkpointed(dir.path()).to_vec();
    settings.push(format!("rest.address={}", network.host()));
    let control = start_control(dir.path(), 0, &strs(&settings));
    let mut workers: Vec<Option<Process>> =
        namespace_workers(&network, dir.path(), &certs, &control)
            .into_iter()
            .map(Some)
            .collect();
    let (job, out) = echo_over_two(dir.path(), &control, "10000");
    let checkpoints = dir.path().join("checkpoints").join(&job);
    wait_for_checkpoint(&checkpoints, "0", "sequence-echo");
    // The executors of both workers wrote into the checkpoint slot 0's executor committed:
    // the state files of subtasks 0 and 1 (`task-<operator>-<subtask>`).
    let latest = latest_checkpoint(&checkpoints.join("0").join("sequence-echo")).unwrap();
    let files: Vec<String> = std::fs::read_dir(
        checkpoints
            .join("0")
            .join("sequence-echo")
            .join(format!("chk-{latest}")),
    )
    .unwrap()
    .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
    .collect();
    for subtask in ["-0", "-1"] {
        assert!(
            files
                .iter()
                .any(|name| name.starts_with("task-") && name.ends_with(subtask)),
            "no state file of subtask {subtask} in checkpoint {latest}: {files:?}"
        );
    }
    // A third worker for the restart; then the coordinating executor's worker goes
    // (SIGKILL, its executor with it).
    let _c = namespace_worker(&network, 2, "c", dir.path(), &certs, &control);
    wait_for_workers(&control, 3);
    let details = get(&control, &format!("/jobs/{job}"));
    let leader = details["placement"]["executors"][0]["taskmanager"]
        .as_str()
        .unwrap()
        .to_string();
    let index = workers
        .iter()
        .position(|w| w.as_ref().is_some_and(|w| worker_id(&control, w) == leader))
        .expect("slot 0 runs on a or b");
    drop(workers[index].take());
    let details = wait_for_state(&control, &job, "FINISHED", Duration::from_secs(120));
    assert_eq!(details["attempts"], 2, "{details}");
    // Both executors of the second run resumed from the checkpoint.
    for worker in [["a", "b"][1 - index], "c"] {
        assert_resumed(dir.path(), worker, &job, 2);
    }
    every_record_once(&out, ECHO_EVENTS, ECHO_KEYS);
}

/// Resident memory of process `pid` and of its children (a worker and its executors),
/// bytes.
fn resident_with_children(pid: u32) -> u64 {
    let resident = |pid: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|status| {
                let line = status
                    .lines()
                    .find(|l| l.starts_with("VmRSS:"))?
                    .to_string();
                line.split_whitespace().nth(1)?.parse::<u64>().ok()
            })
            .map_or(0, |kib| kib * 1024)
    };
    let parent = pid.to_string();
    let children: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // After the command's closing parenthesis: state, then the parent's pid.
            let (_, rest) = stat.rsplit_once(')')?;
            (rest.split_whitespace().nth(1)? == parent).then_some(name)
        })
        .collect();
    resident(&parent) + children.iter().map(|c| resident(c)).sum::<u64>()
}

#[test]
fn a_slow_subtask_on_one_worker_backpressures_the_source_on_the_other_with_bounded_memory() {
    let Some(network) = netns::Network::start(2) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = certificates(dir.path(), &["a", "b"]);
    let rest = format!("rest.address={}", network.host());
    let control = start_control(dir.path(), 0, &[&rest, "web.upload.enabled=true"]);
    let workers = namespace_workers(&network, dir.path(), &certs, &control);
    let jar = upload_example(&control, dir.path());
    let job = run_uploaded(&control, &jar, "slow-subtask", "--sleep-us 1000", 2);
    let (running, _) = wait_for_executors(&control, &job, 2);
    // Which worker runs subtask 0 (the fast one) and which subtask 1 (the slow one).
    let fast = workers
        .iter()
        .find(|w| worker_id(&control, w) == running[0])
        .expect("one of this test's workers");
    // Source subtask 0, on the fast worker, waits for the credit of its channel to the
    // slow subtask on the other worker.
    let source = wait_for("both executors' figures", Duration::from_secs(30), || {
        let details = get(&control, &format!("/jobs/{job}"));
        vertex(&details, "Source: numbers").filter(|source| source["parallelism"] == 2)
    });
    wait_for(
        "source subtask 0 backpressured",
        Duration::from_secs(60),
        || {
            let answer = get(
                &control,
                &format!("/jobs/{job}/vertices/{}/backpressure", source["id"]),
            );
            let subtasks = answer["subtasks"].as_array()?.clone();
            let first = subtasks.iter().find(|s| s["subtask"] == 0)?;
            (first["backpressuredRatio"].as_f64()? > 0.5).then_some(())
        },
    );
    // What is in flight between the sources and the maps stays within the channels' credit,
    // and the fast worker's memory stays put, however long the sources would run ahead.
    let in_flight = || {
        let details = get(&control, &format!("/jobs/{job}"));
        let sent = must_vertex(&details, "Source: numbers")["metrics"]["write-records"]
            .as_u64()
            .unwrap();
        let received = must_vertex(&details, "slow on subtask 1")["metrics"]["read-records"]
            .as_u64()
            .unwrap();
        sent.saturating_sub(received)
    };
    let (before, resident_before) = (in_flight(), resident_with_children(fast.0.id()));
    std::thread::sleep(Duration::from_secs(5));
    let (after, resident_after) = (in_flight(), resident_with_children(fast.0.id()));
    // Four channels, the two to the other worker each at most its sending pool and its
    // receiver's credit (50 segments of 32 KiB, a few thousand 8-byte numbers each): under a
    // million records (about 20 thousand here), where unbounded buffering would hold the
    // tens of millions the sources make in these seconds.
    for records in [before, after] {
        assert!(records < 1_000_000, "{records} records in flight");
    }
    assert!(
        resident_after < resident_before + (32 << 20),
        "the fast worker grew from {resident_before} to {resident_after} bytes"
    );
    let (status, _) = call(&control, "PATCH", &format!("/jobs/{job}?mode=cancel"), None);
    assert_eq!(status, 202);
    wait_for_state(&control, &job, "CANCELED", Duration::from_secs(60));
}

/// Every worker's id and pid, as the control plane lists them.
fn worker_pids(control: &ControlPlane) -> Vec<(String, u32)> {
    get(control, "/taskmanagers")["taskmanagers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["id"].as_str().unwrap().to_string(),
                w["pid"].as_u64().unwrap() as u32,
            )
        })
        .collect()
}

/// The id of the worker whose process is `worker`.
fn worker_id(control: &ControlPlane, worker: &Process) -> String {
    let pid = worker.0.id();
    wait_for("the worker's registration", Duration::from_secs(20), || {
        worker_pids(control)
            .into_iter()
            .find_map(|(id, p)| (p == pid).then_some(id))
    })
}

/// Waits until job `job` runs attempt `attempt` on worker `worker`.
fn wait_for_run(control: &ControlPlane, job: &str, attempt: u64, worker: &str) -> Value {
    wait_for(
        &format!("attempt {attempt} of job {job} on {worker}"),
        Duration::from_secs(60),
        || {
            let details = get(control, &format!("/jobs/{job}"));
            let placement = &details["placement"];
            (placement["attempt"] == attempt
                && placement["executors"][0]["taskmanager"] == worker
                && placement["running"] == true)
                .then_some(details)
        },
    )
}

#[test]
fn a_worker_stopped_by_sigterm_hands_its_job_on_by_savepoint_or_cancel_losing_and_repeating_nothing(
) {
    let dir = tempfile::tempdir().unwrap();
    let settings = checkpointed(dir.path());
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let control = start_control(dir.path(), 0, &settings);
    // Worker a stops its jobs with savepoints (the default), under a notify socket as
    // systemd would start it; b cancels them.
    let notify_path = dir.path().join("a.notify");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    let mut command = Command::new(WEIR);
    worker_args(
        &mut command,
        dir.path(),
        "a",
        &control,
        "0",
        &["worker.shutdown.timeout=60s"],
    );
    let mut a = Process(
        command
            .env("NOTIFY_SOCKET", &notify_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start weir worker"),
    );
    wait_for_workers(&control, 1);
    let out = dir.path().join("out");
    let (events, keys) = (300_000, 64);
    let job = submit(
        &control,
        "sequence-echo",
        &[
            "--events",
            "300000",
            "--keys",
            "64",
            "--rate",
            "15000",
            "--output",
            out.to_str().unwrap(),
        ],
        1,
    );
    let checkpoints = dir.path().join("checkpoints").join(&job);
    wait_for_checkpoint(&checkpoints, "0", "sequence-echo");
    let mut b = start_worker(
        dir.path(),
        "b",
        &control,
        "1",
        &["worker.shutdown.mode=cancel"],
    );
    let b_id = worker_id(&control, &b);

    // SIGTERM: a's run stops with a savepoint and the job starts again from it on b, in a new
    // generation of checkpoints, with no failure; a exits once that is done.
    a.terminate(Duration::from_secs(60));
    let mut said = String::new();
    notify.set_nonblocking(true).unwrap();
    let mut buffer = [0u8; 4096];
    while let Ok(n) = notify.recv(&mut buffer) {
        said.push_str(&String::from_utf8_lossy(&buffer[..n]));
        said.push('\n');
    }
    assert!(
        said.lines().any(|l| l == "STOPPING=1")
            && said.lines().any(|l| l == "EXTEND_TIMEOUT_USEC=110000000"),
        "worker a told systemd it stops, for up to worker.shutdown.timeout, the cancel's 40 s \
         and 10 s more: {said}"
    );
    let details = wait_for_run(&control, &job, 2, &b_id);
    let restored = details["restoredFrom"].as_str().unwrap_or_default();
    assert!(
        restored.contains("savepoint"),
        "the job starts again from a's savepoint: {details}"
    );
    let exceptions = get(&control, &format!("/jobs/{job}/exceptions"));
    assert!(
        exceptions["root-exception"].is_null(),
        "a move is no failure: {exceptions}"
    );
    wait_for_checkpoint(&checkpoints, "1", "sequence-echo");

    // SIGTERM with worker.shutdown.mode=cancel: b's run is cancelled and the job restarts
    // from its latest checkpoint on c.
    let c = start_worker(dir.path(), "c", &control, "0", &[]);
    let c_id = worker_id(&control, &c);
    b.terminate(Duration::from_secs(60));
    wait_for_run(&control, &job, 3, &c_id);
    let details = wait_for_state(&control, &job, "FINISHED", Duration::from_secs(120));
    assert_eq!(details["attempts"], 3, "{details}");
    let exceptions = get(&control, &format!("/jobs/{job}/exceptions"));
    let root = exceptions["root-exception"].as_str().unwrap_or_default();
    assert!(
        root.contains(&b_id) && root.contains("shutting down"),
        "the restart names b's shutdown: {exceptions}"
    );
    assert_resumed(dir.path(), "c", &job, 3);
    every_record_once(&out, events, keys);
}

/// The part files a file sink committed (made visible) in `dir`.
fn committed_parts(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("part-"))
        .count()
}

#[test]
fn a_restarted_control_plane_finds_its_running_job_which_checkpointed_and_committed_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = checkpointed(dir.path()).to_vec();
    // The worker keeps its executors for this long without a control plane.
    settings.push("heartbeat.timeout=30s".into());
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let control = start_control(dir.path(), 0, &settings);
    let port: u16 = control.address.rsplit(':').next().unwrap().parse().unwrap();
    let _worker = start_worker(dir.path(), "w", &control, "0,1", &[]);
    wait_for_workers(&control, 1);
    let out = dir.path().join("out");
    // Two readers of 1000 records/s: 24 s, running on while the control plane is away.
    let (events, keys) = (48_000, 64);
    let job = submit(
        &control,
        "sequence-echo",
        &[
            "--events",
            "48000",
            "--keys",
            "64",
            "--rate",
            "1000",
            "--output",
            out.to_str().unwrap(),
        ],
        2,
    );
    let job_checkpoints = dir.path().join("checkpoints").join(&job);
    wait_for_checkpoint(&job_checkpoints, "0", "sequence-echo");
    let checkpoints = job_checkpoints.join("0").join("sequence-echo");
    drop(control);
    // The job's checkpoint coordinator runs in its executor: without a control plane, its
    // checkpoints go on completing and its sink commits their output.
    let latest = latest_checkpoint(&checkpoints).expect("a completed checkpoint");
    let committed = committed_parts(&out);
    wait_for(
        "checkpoints completed and output committed without a control plane",
        Duration::from_secs(8),
        || {
            (latest_checkpoint(&checkpoints).is_some_and(|n| n >= latest + 3)
                && committed_parts(&out) > committed)
                .then_some(())
        },
    );
    let control = start_control(dir.path(), port, &settings);
    let listed = state(&control, &job);
    assert!(
        matches!(listed.as_str(), "RECONCILING" | "RUNNING"),
        "{listed}"
    );
    wait_for_state(&control, &job, "RUNNING", Duration::from_secs(20));
    let details = wait_for_state(&control, &job, "FINISHED", Duration::from_secs(120));
    assert_eq!(
        details["attempts"], 1,
        "the run went on without a restart: {details}"
    );
    every_record_once(&out, events, keys);
}

#[test]
fn a_job_failing_at_every_start_ends_failed_while_another_on_its_worker_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let settings = [
        "restart-strategy.type=fixed-delay",
        "restart-strategy.fixed-delay.attempts=2",
        "restart-strategy.fixed-delay.delay=100ms",
    ];
    let control = start_control(dir.path(), 0, &settings);
    let _worker = start_worker(dir.path(), "w", &control, "0,1", &[]);
    wait_for_workers(&control, 1);
    let steady = submit(
        &control,
        "sequence-check",
        &["--events", "100000000", "--rate", "1000", "--discard"],
        1,
    );
    wait_for_state(&control, &steady, "RUNNING", Duration::from_secs(30));
    let missing = dir.path().join("no-such-input");
    let failing = submit(
        &control,
        "word-count",
        &["--input", missing.to_str().unwrap()],
        1,
    );
    let details = wait_for_state(&control, &failing, "FAILED", Duration::from_secs(60));
    assert_eq!(
        details["attempts"], 3,
        "the first run and 2 restarts: {details}"
    );
    let exceptions = get(&control, &format!("/jobs/{failing}/exceptions"));
    let root = exceptions["root-exception"].as_str().unwrap();
    assert!(
        root.contains("does not exist") && root.contains("fixed-delay.attempts"),
        "{root}"
    );
    assert_eq!(
        exceptions["exceptionHistory"]["entries"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert_eq!(state(&control, &steady), "RUNNING");
    let (status, _) = call(
        &control,
        "PATCH",
        &format!("/jobs/{steady}?mode=cancel"),
        None,
    );
    assert_eq!(status, 202);
    wait_for_state(&control, &steady, "CANCELED", Duration::from_secs(30));
}

#[test]
fn savepoint_rescale_stop_and_resubmit_keep_every_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let settings = checkpointed(dir.path());
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let control = start_control(dir.path(), 0, &settings);
    let _worker = start_worker(dir.path(), "w", &control, "0,1", &[]);
    wait_for_workers(&control, 1);
    let out = dir.path().join("out");
    // Throttled so that it is still running when it is stopped, on a loaded machine too.
    let (events, keys) = (400_000, 64);
    let spec = [
        "--events",
        "400000",
        "--keys",
        "64",
        "--output",
        out.to_str().unwrap(),
    ];
    let args: Vec<&str> = spec.iter().copied().chain(["--rate", "8000"]).collect();
    let job = submit(&control, "sequence-echo", &args, 1);
    wait_for_checkpoint(
        &dir.path().join("checkpoints").join(&job),
        "0",
        "sequence-echo",
    );
    let cli = |args: &[&str]| {
        let output = weir_cli(&control, args, Duration::from_secs(120));
        assert!(
            output.status.success(),
            "weir {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };

    // A savepoint: the job runs on.
    let printed = cli(&["savepoint", &job]);
    let path = printed
        .trim()
        .strip_prefix("Savepoint completed. Path: ")
        .unwrap_or_else(|| panic!("{printed}"));
    assert!(Path::new(path).join("_metadata").exists(), "{path}");
    assert_eq!(state(&control, &job), "RUNNING");

    // A checkpoint now, one of the job's own: its number and directory.
    let printed = cli(&["checkpoint", "trigger", "--json", &job]);
    let answer: Value = serde_json::from_str(&printed).unwrap();
    let number = answer["operation"]["checkpointId"].as_u64().unwrap();
    let chk = dir
        .path()
        .join("checkpoints")
        .join(&job)
        .join("0")
        .join("sequence-echo")
        .join(format!("chk-{number}"));
    assert_eq!(
        answer["operation"]["location"].as_str(),
        chk.to_str(),
        "{answer}"
    );
    let printed = cli(&["checkpoint", "trigger", &job]);
    let later: u64 = printed
        .trim()
        .strip_prefix("Checkpoint ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{printed}"));
    assert!(later > number, "{printed}");
    assert_eq!(state(&control, &job), "RUNNING");

    // Rescaled to 2: stopped with a savepoint and started from it, under the same id.
    let printed = cli(&["rescale", &job, "-p", "2"]);
    assert!(printed.contains("rescaled to parallelism 2"), "{printed}");
    let details = wait_for_state(&control, &job, "RUNNING", Duration::from_secs(30));
    assert_eq!(details["parallelism"], 2, "{details}");
    assert_eq!(details["attempts"], 2, "{details}");
    let log = dir
        .path()
        .join(format!("w/deployments/{job}-2/executor.log"));
    let log = wait_for(
        "the rescaled run's restore",
        Duration::from_secs(30),
        || {
            let text = std::fs::read_to_string(&log).ok()?;
            text.contains("from savepoint").then_some(text)
        },
    );
    assert!(
        log.contains("starts from savepoint") && !log.contains("resumes from checkpoint"),
        "the rescaled run did not start from its savepoint:\n{log}"
    );
    wait_for_checkpoint(
        &dir.path().join("checkpoints").join(&job),
        "1",
        "sequence-echo",
    );

    // Stopped with a savepoint, and submitted again from it as a new job.
    let printed = cli(&["stop", &job]);
    let path = printed
        .trim()
        .strip_prefix("Savepoint completed. Path: ")
        .unwrap_or_else(|| panic!("{printed}"))
        .to_string();
    wait_for_state(&control, &job, "FINISHED", Duration::from_secs(30));
    let mut resubmit = vec![
        "submit",
        "--json",
        "-p",
        "2",
        "--from-savepoint",
        &path,
        "sequence-echo",
    ];
    // The rest unthrottled (the rate is no part of the job's state).
    resubmit.extend(spec);
    let answer: Value = serde_json::from_str(&cli(&resubmit)).unwrap();
    let resumed = answer["jobid"].as_str().unwrap();
    wait_for_state(&control, resumed, "FINISHED", Duration::from_secs(120));

    every_record_once(&out, events, keys);
}

/// `promtool check metrics` of an exposition: its complaints (empty when it passes). Without
/// promtool (Debian's `prometheus` package) the check is skipped, unless
/// `WEIR_REQUIRE_PROMETHEUS` is set (as `.ci/run` does).
fn promtool_problems(text: &str) -> Option<String> {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(_) if std::env::var_os("WEIR_REQUIRE_PROMETHEUS").is_none() => {
            eprintln!("promtool is not installed: the exposition check is skipped");
            return None;
        }
        Err(error) => panic!("promtool: {error} (install Debian's prometheus package)"),
    };
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    Some(if output.status.success() {
        String::new()
    } else {
        said
    })
}

fn scrape(url: &str) -> String {
    agent()
        .get(url)
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .body_mut()
        .read_to_string()
        .unwrap()
}

#[test]
fn metrics_of_the_control_plane_and_a_worker_pass_promtool_and_prometheus_scrapes_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = checkpointed(dir.path()).to_vec();
    settings.push("metrics.latency.interval=100ms".into());
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let control = start_control(dir.path(), 0, &settings);
    let mut worker = Command::new(WEIR);
    worker_args(&mut worker, dir.path(), "w", &control, "0,1", &[]);
    let (_worker, lines) = spawn_logging(worker);
    let worker_metrics = worker_metrics_url(&lines);
    wait_for_workers(&control, 1);
    let job = submit(
        &control,
        "sequence-check",
        &["--events", "100000000", "--rate", "5000", "--discard"],
        2,
    );

    // Figures flow: the worker's counters, the REST API's vertices and checkpoints.
    let text = wait_for(
        "the job's figures on the worker",
        Duration::from_secs(60),
        || {
            let text = scrape(&worker_metrics);
            let ready = text.contains(&format!(
                "weir_operator_records_out_total{{job_id=\"{job}\""
            )) && text.contains("weir_job_checkpoints_total{")
                && text.contains("status=\"completed\"} ")
                && !text.contains("status=\"completed\"} 0")
                && text.contains("weir_operator_latency_seconds_bucket{");
            ready.then_some(text)
        },
    );
    for family in [
        "weir_worker_slots",
        "weir_task_busy_seconds_total{",
        "weir_task_idle_seconds_total{",
        "weir_task_backpressured_seconds_total{",
        "weir_task_bytes_out_total{",
        "task_name=\"Source: sequence\"",
        "weir_shard_busy_seconds_total",
        "weir_slot_network_memory_bytes",
        "weir_slot_managed_memory_bytes{",
        "weir_slot_managed_memory_used_bytes{",
        "weir_slot_heap_memory_bytes{",
        "weir_slot_heap_memory_used_bytes{",
        "weir_shard_stalled_seconds_total{",
        "weir_job_checkpoint_duration_seconds_bucket",
        "weir_job_last_checkpoint_size_bytes",
        "weir_job_last_checkpoint_alignment_seconds{",
        "source_name=\"Source: sequence\"",
    ] {
        assert!(text.contains(family), "{family} missing:\n{text}");
    }
    let details = wait_for(
        "the job's figures on the control plane",
        Duration::from_secs(30),
        || {
            let details = get(&control, &format!("/jobs/{job}"));
            (details["vertices"][0]["subtasks"]
                .as_array()
                .map_or(0, Vec::len)
                == 2)
                .then_some(details)
        },
    );
    let source = &details["vertices"][0];
    assert_eq!(source["parallelism"], 2, "{details}");
    assert!(
        source["metrics"]["write-records"].as_u64().unwrap() > 0,
        "{details}"
    );
    assert_eq!(source["subtasks"].as_array().unwrap().len(), 2, "{details}");
    let checkpoints = get(&control, &format!("/jobs/{job}/checkpoints"));
    assert!(
        checkpoints["counts"]["completed"].as_u64().unwrap() > 0,
        "{checkpoints}"
    );
    assert_eq!(
        checkpoints["latest"]["completed"]["status"], "COMPLETED",
        "{checkpoints}"
    );
    // The keyed task's two channels line their barriers up: it took some time.
    assert!(
        checkpoints["latest"]["completed"]["max_alignment_ms"]
            .as_f64()
            .is_some_and(|ms| ms > 0.0),
        "{checkpoints}"
    );
    let control_metrics = format!("http://{}/metrics", control.address);
    let control_text = scrape(&control_metrics);
    assert!(
        control_text.contains(&format!(
            "weir_job_status{{job_id=\"{job}\",job_name=\"sequence-check\",status=\"RUNNING\"}} 1"
        )),
        "{control_text}"
    );
    for (what, text) in [("worker", &text), ("control plane", &control_text)] {
        if let Some(problems) = promtool_problems(text) {
            assert!(
                problems.is_empty(),
                "promtool on the {what}'s /metrics:\n{problems}\n{text}"
            );
        }
    }

    // A real Prometheus server scrapes both and answers a query for the job's records/s.
    let Some((_prometheus, port)) = start_prometheus(
        dir.path(),
        &[
            &worker_metrics,
            &format!("http://{}/metrics", control.address),
        ],
    ) else {
        return;
    };
    let query = format!("sum(rate(weir_operator_records_out_total{{job_id=\"{job}\",operator_name=\"Source: sequence\"}}[5s]))");
    let rate = wait_for(
        "Prometheus to answer the job's records/s",
        Duration::from_secs(90),
        || {
            let value = prometheus_value(port, &query)?;
            (value > 0.0).then_some(value)
        },
    );
    eprintln!("Prometheus: {rate} records/s");
    // Two subtasks at 5000 records/s each.
    assert!((2_000.0..20_000.0).contains(&rate), "{rate} records/s");
    let up = wait_for("both targets up", Duration::from_secs(30), || {
        let value = prometheus_value(port, "sum(up)")?;
        (value == 2.0).then_some(value)
    });
    assert_eq!(up, 2.0);
    let (status, _) = call(&control, "PATCH", &format!("/jobs/{job}?mode=cancel"), None);
    assert_eq!(status, 202);
}

/// A Prometheus server on a free loopback port scraping the `/metrics` URLs `targets` every
/// second, with its data in `dir`; `None` where Debian's prometheus is not installed (a
/// failure under `WEIR_REQUIRE_PROMETHEUS`, as in CI).
fn start_prometheus(dir: &Path, targets: &[&str]) -> Option<(Process, u16)> {
    let Ok(prometheus) = Command::new("prometheus").arg("--version").output() else {
        assert!(
            std::env::var_os("WEIR_REQUIRE_PROMETHEUS").is_none(),
            "prometheus is not installed (Debian's prometheus package)"
        );
        return None;
    };
    assert!(prometheus.status.success());
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let targets: Vec<String> = targets
        .iter()
        .map(|url| {
            let host = url
                .trim_start_matches("http://")
                .trim_end_matches("/metrics");
            format!("'{host}'")
        })
        .collect();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: weir\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ),
    )
    .unwrap();
    let process = Process(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    Some((process, port))
}

/// `POST /jars/upload` of `bytes` as the multipart field `field`, named `file_name`.
fn upload(control: &ControlPlane, field: &str, file_name: &str, bytes: &[u8]) -> (u16, Value) {
    let boundary = "weir-test-boundary-7f3a9c";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{file_name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let mut response = agent()
        .post(&format!("http://{}/jars/upload", control.address))
        .header(
            "content-type",
            &format!("multipart/form-data; boundary={boundary}"),
        )
        .send(&body[..])
        .expect("POST /jars/upload");
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{status} {text}: {e}")),
    )
}

/// The example package (examples/src/bin), stripped of its debug information as one would
/// ship it.
fn example_package(dir: &Path) -> Vec<u8> {
    let built = Path::new(WEIR).with_file_name("weir-example-package");
    let stripped = dir.join("weir-example-package");
    let status = Command::new("strip")
        .args(["--strip-debug", "-o"])
        .arg(&stripped)
        .arg(&built)
        .status()
        .expect("strip (binutils)");
    assert!(status.success(), "strip {}", built.display());
    std::fs::read(&stripped).unwrap()
}

/// Uploads the example package (the control plane has `web.upload.enabled`): its jar id.
fn upload_example(control: &ControlPlane, dir: &Path) -> String {
    let (status, answer) = upload(
        control,
        "jarfile",
        "weir-example-package",
        &example_package(dir),
    );
    assert_eq!(status, 200, "{answer}");
    answer["filename"].as_str().unwrap().to_string()
}

/// The vertex named `name` of a job's `details`, if they list it.
fn vertex(details: &Value, name: &str) -> Option<Value> {
    let vertices = details["vertices"].as_array()?;
    vertices.iter().find(|v| v["name"] == name).cloned()
}

/// The vertex named `name` of a job's `details`, which must list it.
fn must_vertex(details: &Value, name: &str) -> Value {
    vertex(details, name).unwrap_or_else(|| panic!("no vertex {name}: {details}"))
}

/// Runs job `entry` of uploaded package `jar` with `args` at `parallelism`: its id.
fn run_uploaded(
    control: &ControlPlane,
    jar: &str,
    entry: &str,
    args: &str,
    parallelism: usize,
) -> String {
    let body = json!({ "entryClass": entry, "programArgs": args, "parallelism": parallelism });
    let (status, answer) = call(
        control,
        "POST",
        &format!("/jars/{jar}/run"),
        Some(&body.to_string()),
    );
    assert_eq!(status, 200, "{answer}");
    answer["jobid"].as_str().unwrap().to_string()
}

#[test]
fn an_uploaded_package_runs_its_jobs_on_a_worker_and_bad_uploads_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let settings = [
        "web.upload.enabled=true",
        "restart-strategy.type=fixed-delay",
        "restart-strategy.fixed-delay.attempts=2",
        "restart-strategy.fixed-delay.delay=100ms",
    ];
    let control = start_control(dir.path(), 0, &settings);
    let _worker = start_worker(dir.path(), "w", &control, "0,1", &[]);
    wait_for_workers(&control, 1);

    let jar = upload_example(&control, dir.path());
    let jars = get(&control, "/jars");
    let listed = jars["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == jar.as_str())
        .unwrap_or_else(|| panic!("{jars}"));
    assert_eq!(listed["package"], "weir-example-package");
    assert_eq!(listed["entry"][0]["name"], "even-squares", "{listed}");

    // Its job runs in an executor started from the uploaded file, fetched by the worker.
    // Two runs at once, both waiting for the worker's first fetch of the package.
    let body = json!({ "entryClass": "even-squares", "programArgs": "--to 100000" });
    let runs: Vec<String> = (0..2)
        .map(|_| {
            let run = format!("/jars/{jar}/run");
            let (status, answer) = call(&control, "POST", &run, Some(&body.to_string()));
            assert_eq!(status, 200, "{answer}");
            answer["jobid"].as_str().unwrap().to_string()
        })
        .collect();
    let job = runs[0].clone();
    let details = wait_for_state(&control, &job, "FINISHED", Duration::from_secs(60));
    let written = |name: &str| {
        details["vertices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no vertex {name}: {details}"))["metrics"]["write-records"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(written("Source: numbers"), 100_000, "{details}");
    assert_eq!(written("even numbers"), 50_000, "{details}");
    assert!(
        dir.path().join(format!("w/packages/{jar}")).exists(),
        "the worker keeps the package"
    );
    wait_for_state(&control, &runs[1], "FINISHED", Duration::from_secs(60));

    // A package job that fails at every start ends FAILED; a job beside it runs on.
    let steady = submit(
        &control,
        "sequence-check",
        &["--events", "100000000", "--rate", "1000", "--discard"],
        1,
    );
    wait_for_state(&control, &steady, "RUNNING", Duration::from_secs(30));
    let body = json!({ "entryClass": "fail-at-start" });
    let (_, answer) = call(
        &control,
        "POST",
        &format!("/jars/{jar}/run"),
        Some(&body.to_string()),
    );
    let failing = answer["jobid"].as_str().unwrap().to_string();
    let details = wait_for_state(&control, &failing, "FAILED", Duration::from_secs(60));
    assert_eq!(details["attempts"], 3, "{details}");
    let exceptions = get(&control, &format!("/jobs/{failing}/exceptions"));
    assert!(
        exceptions["root-exception"]
            .as_str()
            .unwrap()
            .contains("fail-at-start fails on record"),
        "{exceptions}"
    );
    assert_eq!(state(&control, &steady), "RUNNING");

    // Bad arguments fail the package's job naming them (the package parses its own).
    let body = json!({ "entryClass": "even-squares", "programArgs": "--to lots" });
    let (_, answer) = call(
        &control,
        "POST",
        &format!("/jars/{jar}/run"),
        Some(&body.to_string()),
    );
    let bad = answer["jobid"].as_str().unwrap().to_string();
    wait_for_state(&control, &bad, "FAILED", Duration::from_secs(60));
    let exceptions = get(&control, &format!("/jobs/{bad}/exceptions"));
    assert!(
        exceptions["root-exception"]
            .as_str()
            .unwrap()
            .contains("--to takes a whole number, not 'lots'"),
        "{exceptions}"
    );

    // Uploads that are no package for this Weir are refused, naming why.
    refused(
        upload(&control, "jarfile", "notes.txt", b"not a program"),
        400,
        "'notes.txt' is not a Weir job package",
    );
    let other = b"#!/bin/sh\necho '{\"package\":\"old\",\"protocol\":99,\"engine_version\":\"0.0.1\",\"jobs\":[{\"name\":\"x\",\"description\":\"\"}]}'\n";
    let (status, answer) = upload(&control, "jarfile", "old-package", other);
    assert_eq!(status, 400, "{answer}");
    let message = answer["errors"][0].as_str().unwrap();
    assert!(
        message.contains("protocol 99") && message.contains("rebuild it"),
        "{message}"
    );
    refused(
        upload(&control, "file", "x", b"x"),
        400,
        "no field 'jarfile'",
    );
    assert_eq!(
        get(&control, "/jars")["files"].as_array().unwrap().len(),
        2,
        "nothing else kept"
    );
    let kept: Vec<String> = std::fs::read_dir(dir.path().join("control/jars"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        kept,
        std::slice::from_ref(&jar),
        "refused uploads leave nothing behind"
    );

    // A package a running job uses stays (its restarts need it); once its jobs ended it can go.
    let body = json!({ "entryClass": "even-squares", "programArgs": "--to 100000000000" });
    let (_, answer) = call(
        &control,
        "POST",
        &format!("/jars/{jar}/run"),
        Some(&body.to_string()),
    );
    let long = answer["jobid"].as_str().unwrap().to_string();
    refused(
        call(&control, "DELETE", &format!("/jars/{jar}"), None),
        409,
        &long,
    );
    let (status, _) = call(
        &control,
        "PATCH",
        &format!("/jobs/{long}?mode=cancel"),
        None,
    );
    assert_eq!(status, 202);
    wait_for_state(&control, &long, "CANCELED", Duration::from_secs(60));
    let (status, answer) = call(&control, "DELETE", &format!("/jars/{jar}"), None);
    assert_eq!(status, 200, "{answer}");
    let (status, _) = call(&control, "DELETE", "/jars/weir-builtin", None);
    assert_eq!(status, 400);
    assert_eq!(get(&control, "/jars")["files"].as_array().unwrap().len(), 1);
    let (status, _) = call(
        &control,
        "PATCH",
        &format!("/jobs/{steady}?mode=cancel"),
        None,
    );
    assert_eq!(status, 202);
}

#[test]
fn the_slow_task_is_the_bottleneck_and_the_lagging_split_holds_event_time_back() {
    let dir = tempfile::tempdir().unwrap();
    let control = start_control(dir.path(), 0, &["web.upload.enabled=true"]);
    let _worker = start_worker(dir.path(), "w", &control, "0,1", &[]);
    wait_for_workers(&control, 1);
    let jar = upload_example(&control, dir.path());
    // Two sources, split 1's event time a minute behind split 0's, feeding a map that sleeps
    // 200 µs per record.
    let job = run_uploaded(
        &control,
        &jar,
        "lagging-split",
        "--lag-ms 60000 --sleep-us 200",
        2,
    );
    let (status, answer) = call(&control, "GET", &format!("/jobs/{job}/bottleneck"), None);
    assert!(
        status == 200 || status == 409,
        "before its first figures a job's bottleneck is a 409: {status} {answer}"
    );

    // The map's task cannot keep up: once the sources used up their credit they wait for
    // more, and the map works. (Until then, the map is only the busiest task: a source that
    // shares its shard with a map sleeping through a batch is ready to run, not waiting.)
    wait_for(
        "the map named the bottleneck of backpressured sources",
        Duration::from_secs(60),
        || {
            let (status, answer) = call(&control, "GET", &format!("/jobs/{job}/bottleneck"), None);
            let backpressured = answer["reason"].as_str().is_some_and(|reason| {
                reason.contains("'Source: numbers' is backpressured by 'slow map -> Sink: discard'")
            });
            (status == 200
                && answer["bottleneck"]["name"] == "slow map -> Sink: discard"
                && backpressured)
                .then_some(())
        },
    );
    // Records cross shards in segments (a first reading may show only those that stayed
    // on their shard, which carry no bytes).
    let (source, map) = wait_for("records across shards", Duration::from_secs(30), || {
        let details = get(&control, &format!("/jobs/{job}"));
        let source = must_vertex(&details, "Source: numbers");
        let map = must_vertex(&details, "slow map");
        let crossed = source["metrics"]["write-bytes"].as_u64() > Some(0)
            && map["metrics"]["read-bytes"].as_u64() > Some(0);
        crossed.then_some((source, map))
    });
    let backpressure = |vertex: &Value| {
        get(
            &control,
            &format!("/jobs/{job}/vertices/{}/backpressure", vertex["id"]),
        )
    };
    // Over one second's reading (a loaded machine may take a second to show it).
    wait_for("the sources backpressured", Duration::from_secs(30), || {
        let sources = backpressure(&source);
        assert_eq!(sources["subtasks"].as_array().unwrap().len(), 2);
        (sources["backpressure-level"] == "high").then_some(())
    });
    wait_for(
        "the maps busy and free of backpressure",
        Duration::from_secs(30),
        || {
            let maps = backpressure(&map);
            let busy = maps["subtasks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s["busyRatio"].as_f64().unwrap() > 0.5);
            (maps["backpressure-level"] == "ok" && busy).then_some(())
        },
    );

    // Event time: the map's input watermark is split 1's, which the holdback names.
    let watermarks = wait_for("the map's watermarks", Duration::from_secs(30), || {
        let path = format!("/jobs/{job}/vertices/{}/watermarks", map["id"]);
        let watermarks = get(&control, &path);
        let none = i64::MIN.to_string();
        (watermarks
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["value"] != none.as_str()))
        .then_some(watermarks)
    });
    let now = weir_engine::time::now_ms();
    for entry in watermarks.as_array().unwrap() {
        let value: i64 = entry["value"].as_str().unwrap().parse().unwrap();
        assert!(
            (now - 120_000..now - 55_000).contains(&value),
            "a minute behind: {watermarks}"
        );
    }
    let holdback = wait_for(
        "a split named the holdback",
        Duration::from_secs(30),
        || {
            let holdback = get(&control, &format!("/jobs/{job}/watermarks/holdback"));
            (holdback["holdback"]["kind"] == "split").then_some(holdback)
        },
    );
    let hold = &holdback["holdback"];
    assert_eq!(hold["split"], "generator-1-of-2", "{holdback}");
    assert_eq!(hold["task"]["name"], "Source: numbers", "{holdback}");
    let behind = hold["behindMs"].as_i64().unwrap();
    assert!((50_000..70_000).contains(&behind), "{holdback}");

    // What cannot be answered gets a 4xx naming why.
    refused(
        call(
            &control,
            "GET",
            &format!("/jobs/{job}/vertices/999/backpressure"),
            None,
        ),
        404,
        "no vertex '999' in this job",
    );
    let (status, _) = call(&control, "GET", "/jobs/0000/bottleneck", None);
    assert_eq!(status, 404);
    let (status, _) = call(&control, "PATCH", &format!("/jobs/{job}?mode=cancel"), None);
    assert_eq!(status, 202);
    wait_for_state(&control, &job, "CANCELED", Duration::from_secs(60));
    refused(
        call(
            &control,
            "GET",
            &format!("/jobs/{job}/watermarks/holdback"),
            None,
        ),
        409,
        "is CANCELED",
    );
}

/// Starts `command` with its standard error read into lines (kept, in order), and returns the
/// process and the lines so far.
fn spawn_logging(mut command: Command) -> (Process, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start weir");
    let lines = BufReader::new(child.stderr.take().expect("piped")).lines();
    let kept = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let into = std::sync::Arc::clone(&kept);
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            into.lock().unwrap().push(line);
        }
    });
    (Process(child), kept)
}

/// Each line as a JSON object with a timestamp, a level and a message, or a panic naming the
/// line that is not.
fn json_lines(lines: &[String], whose: &str) -> Vec<Value> {
    lines
        .iter()
        .map(|line| {
            let value: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{whose} wrote a line that is not JSON ({e}): {line}"));
            for field in ["timestamp", "level", "message", "target"] {
                assert!(value.get(field).is_some(), "{whose}: no {field} in {line}");
            }
            value
        })
        .collect()
}

#[test]
fn json_logs_carry_one_line_per_job_state_change_down_to_the_executors() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(WEIR);
    command.args(["--log-format", "json", "control"]);
    let data = format!("control.data-dir={}", dir.path().join("control").display());
    let checkpoints = checkpointed(dir.path());
    for setting in [data.as_str(), "rest.port=0", "rest.address=127.0.0.1"]
        .into_iter()
        .chain(FAST)
        .chain(checkpoints.iter().map(String::as_str))
    {
        command.args(["-D", setting]);
    }
    let (process, control_lines) = spawn_logging(command);
    let address = wait_for(
        "the control plane's address",
        Duration::from_secs(30),
        || {
            let lines = control_lines.lock().unwrap().clone();
            json_lines(&lines, "weir control")
                .iter()
                .find_map(|line| line["address"].as_str().map(str::to_string))
        },
    );
    let control = ControlPlane {
        _process: process,
        address,
    };
    let mut command = Command::new(WEIR);
    command.arg("--log-format=json");
    worker_args(&mut command, dir.path(), "w", &control, "0", &[]);
    let (_worker, worker_lines) = spawn_logging(command);
    wait_for_workers(&control, 1);
    let job = submit(
        &control,
        "sequence-check",
        &["--events", "200000", "--rate", "100000", "--discard"],
        1,
    );
    let details = wait_for_state(&control, &job, "FINISHED", Duration::from_secs(60));

    // One line per state the job entered, in order, with its id, name and state as fields.
    let lines = wait_for(
        "the job's last state change logged",
        Duration::from_secs(10),
        || {
            let lines = json_lines(&control_lines.lock().unwrap(), "weir control");
            let changes: Vec<Value> = lines
                .into_iter()
                .filter(|l| l["message"] == "job state changed" && l["job_id"] == job.as_str())
                .collect();
            (changes.last().is_some_and(|l| l["status"] == "FINISHED")).then_some(changes)
        },
    );
    let states: Vec<&str> = lines
        .iter()
        .map(|l| l["status"].as_str().unwrap())
        .collect();
    assert_eq!(states.first(), Some(&"CREATED"), "{states:?}");
    assert!(states.contains(&"RUNNING"), "{states:?}");
    assert_eq!(
        states.len(),
        details["timestamps"].as_object().unwrap().len(),
        "one line per state entered: {states:?} {details}"
    );
    assert!(lines
        .iter()
        .all(|l| l["job_name"] == "sequence-check" && l["level"] == "INFO"));

    // The worker's lines, and its executor's (which inherits the format), are JSON too.
    let worker = json_lines(&worker_lines.lock().unwrap(), "weir worker");
    assert!(
        worker.iter().any(
            |l| l["message"].as_str().unwrap().contains("registered with")
                && l["tm_id"].is_string()
        ),
        "{worker:?}"
    );
    let deployments = std::fs::read_dir(dir.path().join("w/deployments")).unwrap();
    let run = deployments
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with(job.as_str()))
        .expect("the run's deployment directory");
    let log = std::fs::read_to_string(run.path().join("executor.log")).unwrap();
    let executor: Vec<String> = log.lines().map(str::to_string).collect();
    let executor = json_lines(&executor, "the executor");
    assert!(
        executor
            .iter()
            .any(|l| l["target"] == "weir_engine::package"
                && l["run_id"].as_str().unwrap().starts_with(job.as_str())),
        "an executor logs its start: {log}"
    );

    // A format nobody knows is refused before anything starts.
    let output = Command::new(WEIR)
        .args(["--log-format", "yaml", "list"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("unknown log format 'yaml'; the formats are text and json"),
        "{stderr}"
    );
}

/// The metric names a PromQL expression reads (`weir_…`), each with the exact label matchers
/// (`label="value"`) its selector has.
fn selectors(expr: &str) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("weir_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..end].to_string();
        let mut matchers = Vec::new();
        if let Some(inside) = tail[end..].strip_prefix('{') {
            let inside = &inside[..inside.find('}').expect("a closed selector")];
            for matcher in inside.split(',') {
                // Exact matchers only: `=~` ones hold template variables.
                if let Some((label, value)) = matcher.split_once('=') {
                    if !value.starts_with('~') {
                        matchers.push(format!("{}={}", label.trim(), value.trim()));
                    }
                }
            }
        }
        found.push((name, matchers));
        rest = &tail[end..];
    }
    found
}

#[test]
fn the_grafana_dashboard_queries_only_what_real_scrapes_hold() {
    let dashboard: Value =
        serde_json::from_str(include_str!("../../docs/grafana/weir.json")).unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|panel| panel["targets"].as_array())
        .flatten()
        .map(|target| target["expr"].as_str().unwrap().to_string())
        .collect();
    assert!(exprs.len() > 15, "{exprs:?}");

    // A checkpointed job with event time, backpressure and bytes across shards.
    let dir = tempfile::tempdir().unwrap();
    let mut settings = checkpointed(dir.path()).to_vec();
    settings.push("web.upload.enabled=true".into());
    settings.push("metrics.latency.interval=100ms".into());
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let control = start_control(dir.path(), 0, &settings);
    let mut command = Command::new(WEIR);
    worker_args(&mut command, dir.path(), "w", &control, "0,1", &[]);
    let (_worker, lines) = spawn_logging(command);
    let worker_metrics = worker_metrics_url(&lines);
    wait_for_workers(&control, 1);
    let jar = upload_example(&control, dir.path());
    let body = json!({
        "entryClass": "lagging-split",
        "programArgs": "--lag-ms 1000 --sleep-us 20",
        "parallelism": 2,
    });
    let run = format!("/jars/{jar}/run");
    let (status, answer) = call(&control, "POST", &run, Some(&body.to_string()));
    assert_eq!(status, 200, "{answer}");
    let job = answer["jobid"].as_str().unwrap().to_string();
    let control_metrics = format!("http://{}/metrics", control.address);
    let (worker_text, control_text) = wait_for(
        "a completed checkpoint and watermarks in the scrapes",
        Duration::from_secs(90),
        || {
            let text = scrape(&worker_metrics);
            (text.contains("weir_job_last_checkpoint_size_bytes{")
                && text.contains("weir_task_watermark_lag_seconds{"))
            .then(|| (text, scrape(&control_metrics)))
        },
    );

    // Every metric a panel reads is in a scrape, with the label values it selects.
    for expr in &exprs {
        for (name, matchers) in selectors(expr) {
            let series: Vec<&str> = worker_text
                .lines()
                .chain(control_text.lines())
                .filter(|line| {
                    line.strip_prefix(name.as_str())
                        .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
                })
                .collect();
            assert!(!series.is_empty(), "{name} (in {expr}) is in no scrape");
            for matcher in &matchers {
                assert!(
                    series.iter().any(|line| line.contains(matcher.as_str())),
                    "no {name} series has {matcher} (in {expr})"
                );
            }
        }
    }

    // And a real Prometheus answers every panel's query with data.
    if let Some((_prometheus, port)) =
        start_prometheus(dir.path(), &[&worker_metrics, &control_metrics])
    {
        for expr in &exprs {
            let query = expr
                .replace("$job", ".*")
                .replace("$__rate_interval", "10s");
            wait_for(
                &format!("data for {query}"),
                Duration::from_secs(60),
                || {
                    let mut response = agent()
                        .get(&format!("http://127.0.0.1:{port}/api/v1/query"))
                        .query("query", &query)
                        .call()
                        .ok()?;
                    let answer: Value =
                        serde_json::from_str(&response.body_mut().read_to_string().ok()?).ok()?;
                    assert_ne!(answer["status"], "error", "{query}: {answer}");
                    (!answer["data"]["result"].as_array()?.is_empty()).then_some(())
                },
            );
        }
    }
    let (status, _) = call(&control, "PATCH", &format!("/jobs/{job}?mode=cancel"), None);
    assert_eq!(status, 202);
}

/// A JSON value of any shape, its objects' keys mostly the API's own field names.
fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e12f64..1e12).prop_map(Value::from),
        "\\PC{0,24}".prop_map(Value::from),
        Just(Value::from("sequence-check")),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        let key = prop_oneof![
            Just("entryClass".to_string()),
            Just("programArgs".to_string()),
            Just("programArgsList".to_string()),
            Just("parallelism".to_string()),
            Just("savepointPath".to_string()),
            Just("allowNonRestoredState".to_string()),
            Just("target-directory".to_string()),
            Just("cancel-job".to_string()),
            Just("drain".to_string()),
            Just("triggerId".to_string()),
            "[a-zA-Z-]{1,12}",
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key, inner, 0..5)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

#[test]
fn generated_requests_to_every_documented_endpoint_get_no_5xx() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let dir = tempfile::tempdir().unwrap();
    // No worker: jobs submitted wait for slots, and a job's paths reach its handlers.
    let control = start_control(dir.path(), 0, &["web.upload.enabled=true"]);
    let job = submit(
        &control,
        "sequence-check",
        &["--events", "1000", "--discard"],
        1,
    );
    let document = get(&control, "/openapi.json");
    assert!(
        document["openapi"].as_str().unwrap().starts_with("3."),
        "{document}"
    );
    let endpoints: Vec<(String, String)> = document["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .filter(|m| ["get", "post", "put", "patch", "delete"].contains(&m.as_str()))
                .map(move |m| (m.to_uppercase(), path.clone()))
        })
        .collect();
    assert!(endpoints.len() >= 25, "{endpoints:?}");

    let segment = prop_oneof![
        Just(job.clone()),
        Just("weir-builtin".to_string()),
        Just("0".to_string()),
        Just("999999999999999999999".to_string()),
        "[a-zA-Z0-9._~-]{0,40}",
        "%[0-9A-F]{2}[a-z]{0,3}",
    ];
    let query = prop_oneof![
        Just(String::new()),
        Just("?mode=cancel".to_string()),
        Just("?mode=stop".to_string()),
        Just("?parallelism=0".to_string()),
        Just("?parallelism=2".to_string()),
        Just("?parallelism=-1".to_string()),
        "\\?[a-z]{1,8}=[a-zA-Z0-9%]{0,8}",
    ];
    let body = prop_oneof![
        Just(Vec::new()),
        prop::collection::vec(any::<u8>(), 0..256),
        any_json().prop_map(|value| value.to_string().into_bytes()),
    ];
    let content_type = prop_oneof![
        Just("application/json"),
        Just("text/plain"),
        Just("multipart/form-data; boundary=x"),
    ];
    let requests = (
        0..endpoints.len(),
        segment.clone(),
        segment,
        query,
        body,
        content_type,
    );
    let mut runner = TestRunner::new(Config {
        cases: 600,
        failure_persistence: None,
        ..Config::default()
    });
    let outcome = runner.run(
        &requests,
        |(index, first, second, query, body, content_type)| {
            let (method, template) = &endpoints[index];
            // The template's parameters, in order, take the generated segments.
            let mut path = String::new();
            let mut values = [first.as_str(), second.as_str()].into_iter();
            for (i, part) in template.split('{').enumerate() {
                match part.split_once('}') {
                    Some((_, rest)) if i > 0 => {
                        path.push_str(values.next().unwrap_or("x"));
                        path.push_str(rest);
                    }
                    _ => path.push_str(part),
                }
            }
            let url = format!("http://{}{path}{query}", control.address);
            let request = ureq::http::Request::builder()
                .method(method.as_str())
                .uri(&url)
                .header("content-type", content_type)
                .body(body.clone())
                .unwrap();
            let mut response = match agent().run(request) {
                Ok(response) => response,
                Err(ureq::Error::Io(error)) => {
                    prop_assert!(
                        false,
                        "{method} {path}{query}: the control plane is gone: {error}"
                    );
                    unreachable!()
                }
                // A URI the client itself refuses to send reaches no endpoint.
                Err(_) => return Ok(()),
            };
            let status = response.status().as_u16();
            let text = response.body_mut().read_to_string().unwrap_or_default();
            prop_assert!(
                status < 500,
                "{method} {path}{query} with {} bytes ({content_type}): {status} {text}",
                body.len()
            );
            if status >= 400 {
                let answer: Value = serde_json::from_str(&text).unwrap_or_default();
                prop_assert!(
                    answer["errors"][0].as_str().is_some_and(|e| !e.is_empty()),
                    "{method} {path}{query}: {status} without an error message: {text}"
                );
            }
            Ok(())
        },
    );
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
    // It serves on, its jobs kept.
    let jobs = get(&control, "/jobs");
    assert!(
        jobs["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j["id"] == job.as_str()),
        "{jobs}"
    );
}

/// The issue's first proof in one flow: a control plane and two workers; the example package
/// uploaded over HTTP and run; records flow; a savepoint; a stop with a savepoint; a new
/// submission from it; a rescale; a cancel.
#[test]
fn an_uploaded_job_is_savepointed_stopped_resubmitted_rescaled_and_cancelled_on_two_workers() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = checkpointed(dir.path()).to_vec();
    settings.push("web.upload.enabled=true".into());
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let control = start_control(dir.path(), 0, &settings);
    let _workers = [
        start_worker(dir.path(), "a", &control, "0,1", &[]),
        start_worker(dir.path(), "b", &control, "0,1", &[]),
    ];
    wait_for_workers(&control, 2);
    let jar = upload_example(&control, dir.path());
    let run = |savepoint: Option<&str>| {
        let mut body = json!({
            "entryClass": "lagging-split",
            "programArgs": "--lag-ms 0 --sleep-us 20",
            "parallelism": 1,
        });
        if let Some(path) = savepoint {
            body["savepointPath"] = path.into();
        }
        let (status, answer) = call(
            &control,
            "POST",
            &format!("/jars/{jar}/run"),
            Some(&body.to_string()),
        );
        assert_eq!(status, 200, "{answer}");
        answer["jobid"].as_str().unwrap().to_string()
    };
    let records_flow = |job: &str| {
        wait_for("records to flow", Duration::from_secs(60), || {
            let details = get(&control, &format!("/jobs/{job}"));
            (details["vertices"][0]["metrics"]["write-records"]
                .as_u64()
                .unwrap_or(0)
                > 0)
            .then_some(details)
        })
    };
    // Asks for an asynchronous operation and waits for its outcome's location.
    let operation = |job: &str, post: &str, status_path: &str| {
        let (status, answer) = call(&control, "POST", &format!("/jobs/{job}{post}"), Some("{}"));
        assert_eq!(status, 202, "{answer}");
        let request = answer["request-id"].as_str().unwrap().to_string();
        let done = wait_for("the operation", Duration::from_secs(60), || {
            let result = get(&control, &format!("/jobs/{job}{status_path}/{request}"));
            (result["status"]["id"] == "COMPLETED").then_some(result)
        });
        done["operation"]["location"]
            .as_str()
            .unwrap_or_else(|| panic!("{done}"))
            .to_string()
    };

    let job = run(None);
    records_flow(&job);
    let savepoint = operation(&job, "/savepoints", "/savepoints");
    assert!(
        Path::new(&savepoint).join("_metadata").exists(),
        "{savepoint}"
    );
    assert_eq!(
        state(&control, &job),
        "RUNNING",
        "a savepoint leaves it running"
    );
    let stopped = operation(&job, "/stop", "/savepoints");
    wait_for_state(&control, &job, "FINISHED", Duration::from_secs(30));

    let resumed = run(Some(&stopped));
    records_flow(&resumed);
    // On either worker.
    let text = wait_for("the resumed run's log", Duration::from_secs(30), || {
        ["a", "b"].iter().find_map(|worker| {
            let log = dir
                .path()
                .join(worker)
                .join(format!("deployments/{resumed}-1/executor.log"));
            let text = std::fs::read_to_string(log).ok()?;
            text.contains("starts from savepoint").then_some(text)
        })
    });
    assert!(text.contains(&stopped), "{text}");

    let (status, answer) = call(
        &control,
        "POST",
        &format!("/jobs/{resumed}/rescaling?parallelism=2"),
        None,
    );
    assert_eq!(status, 202, "{answer}");
    let request = answer["request-id"].as_str().unwrap().to_string();
    wait_for("the rescale", Duration::from_secs(60), || {
        let result = get(&control, &format!("/jobs/{resumed}/rescaling/{request}"));
        (result["status"]["id"] == "COMPLETED").then_some(result)
    });
    let details = wait_for_state(&control, &resumed, "RUNNING", Duration::from_secs(30));
    assert_eq!(details["parallelism"], 2, "{details}");
    wait_for("two subtasks' records", Duration::from_secs(60), || {
        let details = get(&control, &format!("/jobs/{resumed}"));
        let subtasks = details["vertices"][0]["subtasks"].as_array()?.clone();
        (subtasks.len() == 2).then_some(())
    });

    let (status, answer) = call(
        &control,
        "PATCH",
        &format!("/jobs/{resumed}?mode=cancel"),
        None,
    );
    assert_eq!(status, 202, "{answer}");
    wait_for_state(&control, &resumed, "CANCELED", Duration::from_secs(30));
}
