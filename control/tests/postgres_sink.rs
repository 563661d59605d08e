//! The PostgreSQL sink against a real server (a throw-away cluster, `common::postgres`):
//! `weir run sequence-echo --sink postgres://…/TABLE`, SIGKILLed and resumed while the server
//! restarts and the sink's sessions are ended behind its back, leaves every record in the
//! table once, each key's in order; a server that cannot be reached, and a table whose
//! columns do not match, fail the job at once naming what is wrong.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::postgres::Cluster;
use weir_examples::sequence_check::{echo_problems, EchoCheck, Echoed, SequenceSpec};

const KEYS: u32 = 64;
const EVENTS: u64 = 640_000;
const RATE: &str = "80000";

/// What the runs generate (the rate only throttles them).
fn spec() -> SequenceSpec {
    SequenceSpec::of_cli(EVENTS, KEYS, None)
}

/// `weir run sequence-echo` into `sink`, checkpointing into `checkpoints`.
fn echo(sink: &str, backend: &str, settings: &[&str], checkpoints: &Path, slots: usize) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_weir"));
    command
        .args(["run", "sequence-echo", "--quiet", "--events"])
        .arg(EVENTS.to_string())
        .args(["--keys", &KEYS.to_string(), "--rate", RATE, "--sink", sink])
        .args(["-D", "execution.checkpointing.interval=100ms"])
        .arg("-D")
        .arg(format!(
            "execution.checkpointing.dir={}",
            checkpoints.display()
        ))
        .arg("-D")
        .arg(format!("taskmanager.numberOfTaskSlots={slots}"))
        .arg("-D")
        .arg(format!("state.backend.type={backend}"))
        .arg("-D")
        .arg(format!(
            "state.backend.rocksdb.localdir={}",
            checkpoints.with_file_name("rocksdb").display()
        ))
        .arg("-D")
        .arg("restart-strategy.exponential-delay.initial-backoff=100ms");
    for setting in settings {
        command.args(["-D", setting]);
    }
    command.stdout(Stdio::null()).stderr(Stdio::piped());
    command
}

/// The echo job's rows, in the order they were written.
fn echoed(cluster: &Cluster) -> Vec<Echoed> {
    cluster
        .echo_rows()
        .into_iter()
        .map(|(key, seq, count)| Echoed { key, seq, count })
        .collect()
}

/// Kills the job three times at random moments and resumes it; the server restarts during
/// the second run, and the sink's sessions are ended during the third. Then the job runs to
/// its end: what the table holds, checked (`None`: no PostgreSQL on this machine).
fn killed_and_resumed_into_postgres(
    backend: &str,
    settings: &[&str],
    slots: usize,
) -> Option<EchoCheck> {
    let mut cluster = Cluster::start()?;
    cluster.create_echo_table();
    let sink = format!("{}/echo", cluster.url());
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_nanos() as u64;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let checkpoints = dir.path().join("checkpoints");
    for attempt in 0..3u64 {
        let mut command = echo(&sink, backend, settings, &checkpoints, slots);
        if attempt > 0 {
            command.arg("--resume");
        }
        let mut child = command.spawn().expect("start weir");
        let delay = Duration::from_millis(700 + (seed >> (attempt * 8)) % 900);
        let started = Instant::now();
        let mut disturbed = false;
        while started.elapsed() < delay && child.try_wait().expect("poll weir").is_none() {
            if !disturbed && started.elapsed() > delay / 2 {
                disturbed = true;
                match attempt {
                    1 => cluster.restart(),
                    2 => {
                        cluster
                            .client()
                            .batch_execute(
                                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                                 WHERE application_name = 'weir-sink'",
                            )
                            .expect("end the sink's sessions");
                    }
                    _ => {}
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let result = child.wait_with_output().expect("wait for weir");
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(
            !stderr.lines().any(|line| line.starts_with("error:")),
            "attempt {attempt} (seed {seed}) failed:\n{stderr}"
        );
    }
    let result = echo(&sink, backend, settings, &checkpoints, slots)
        .arg("--resume")
        .output()
        .expect("run weir");
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        result.status.success(),
        "the last run (seed {seed}) failed:\n{stderr}"
    );
    let check = echo_problems(spec(), &echoed(&cluster));
    eprintln!("{backend}, {settings:?}, parallelism {slots} (seed {seed}): {check:?}");
    let prepared = cluster.count("SELECT count(*) FROM pg_prepared_xacts");
    assert_eq!(prepared, 0, "prepared transactions are left (seed {seed})");
    Some(check)
}

/// Every row once, each key's in order.
fn exactly_once_into_postgres(backend: &str, settings: &[&str], slots: usize) {
    if let Some(check) = killed_and_resumed_into_postgres(backend, settings, slots) {
        assert!(
            check.is_clean(),
            "{backend}, {settings:?}, {slots}: {check:?}"
        );
    }
}

const UNALIGNED: &[&str] = &["execution.checkpointing.unaligned.enabled=true"];

#[test]
fn sigkill_and_server_restarts_write_every_row_once() {
    for slots in [1, 2] {
        exactly_once_into_postgres("hashmap", &[], slots);
        exactly_once_into_postgres("hashmap", UNALIGNED, slots);
    }
}

#[test]
fn sigkill_and_server_restarts_on_rocksdb_write_every_row_once() {
    for slots in [1, 2] {
        exactly_once_into_postgres("rocksdb", &[], slots);
        exactly_once_into_postgres("rocksdb", UNALIGNED, slots);
    }
}

/// With `sink.delivery-guarantee=at-least-once` (transactions of 16 KiB, each committed as it
/// closes, before a checkpoint holds it) the same check finds rows written twice, and none
/// lost.
#[test]
fn at_least_once_rows_repeat_and_none_is_lost() {
    let settings = [
        "sink.delivery-guarantee=at-least-once",
        "sink.postgres.max-transaction-size=16kb",
    ];
    if let Some(check) = killed_and_resumed_into_postgres("hashmap", &settings, 2) {
        assert!(check.only_duplicates(), "{check:?}");
    }
}

/// Runs the echo job once into `sink`, without checkpoints; its standard error, and whether
/// it succeeded.
fn run_once(sink: &str) -> (bool, String) {
    let started = Instant::now();
    let result = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "run",
            "sequence-echo",
            "--quiet",
            "--events",
            "16000",
            "--sink",
            sink,
        ])
        .output()
        .expect("run weir");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the run took {:?}",
        started.elapsed()
    );
    (
        result.status.success(),
        String::from_utf8_lossy(&result.stderr).into_owned(),
    )
}

#[test]
fn an_unreachable_server_fails_the_job_naming_it() {
    // Port 1 on loopback: nothing listens there.
    let (succeeded, stderr) = run_once("postgres://weir:secret@127.0.0.1:1/postgres/echo");
    assert!(!succeeded, "{stderr}");
    assert!(
        stderr.contains("cannot connect to postgres://weir:***@127.0.0.1:1/postgres")
            && stderr.contains("tries")
            && !stderr.contains("secret"),
        "{stderr}"
    );
}

#[test]
fn a_table_that_does_not_match_fails_the_job_naming_the_column() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    cluster.execute("CREATE TABLE echo (key text, seq bigint, count bigint)");
    let (succeeded, stderr) = run_once(&format!("{}/echo", cluster.url()));
    assert!(!succeeded, "{stderr}");
    assert!(
        stderr.contains("column 'key' of table 'echo' is text, the record's is integer"),
        "{stderr}"
    );
    // An identity column the mapping leaves out is filled by the server.
    cluster.execute(
        "CREATE TABLE withid (id bigint GENERATED ALWAYS AS IDENTITY, key integer NOT NULL, \
         seq bigint NOT NULL, count bigint NOT NULL)",
    );
    let (succeeded, stderr) = run_once(&format!("{}/withid", cluster.url()));
    assert!(succeeded, "{stderr}");
    // Created when missing: a bounded job without checkpoints commits at its end.
    let (succeeded, stderr) = run_once(&format!("{}/fresh", cluster.url()));
    assert!(succeeded, "{stderr}");
    let rows: i64 = cluster
        .client()
        .query_one("SELECT count(*) FROM fresh", &[])
        .expect("count rows")
        .get(0);
    assert_eq!(rows, 16_000);
}

#[test]
fn the_postgres_benchmark_prints_one_json_object() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let result = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "bench",
            "postgres",
            "--url",
            &cluster.url(),
            "--records",
            "20000",
        ])
        .args(["--checkpoint-interval-ms", "20", "--json"])
        .output()
        .expect("run weir");
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(
        result.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    for field in [
        "records_per_second",
        "baseline_records_per_second",
        "slowdown",
    ] {
        assert!(json.get(field).is_some(), "missing {field}: {json}");
    }
    assert_eq!(json["results_match"], true, "{json}");
    let tables: i64 = cluster
        .client()
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'weir_bench_%'",
            &[],
        )
        .expect("count tables")
        .get(0);
    assert_eq!(tables, 0, "the benchmark drops its table");
}
