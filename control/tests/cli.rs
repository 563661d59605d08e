//! The `weir` binary end to end: every subcommand, and the errors a user can cause.

use std::collections::HashMap;
use std::process::{Command, Output};

fn weir(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .output()
        .expect("run weir")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `weir` expecting success, and returns its stdout and stderr.
fn succeeds(args: &[&str]) -> (String, String) {
    let result = weir(args);
    let (stdout, stderr) = (text(&result.stdout), text(&result.stderr));
    assert!(result.status.success(), "{args:?} failed:\n{stderr}");
    (stdout, stderr)
}

/// Runs `weir` expecting failure, and returns its stderr after checking it names `needle`.
fn fails_naming(args: &[&str], needle: &str) -> String {
    let result = weir(args);
    let stderr = text(&result.stderr);
    assert!(
        !result.status.success(),
        "expected failure of {args:?}, got:\n{stderr}"
    );
    assert!(stderr.contains(needle), "expected '{needle}' in:\n{stderr}");
    stderr
}

/// Runs a `weir bench ... --json` command and checks it printed one JSON object with `fields`.
fn bench_json(args: &[&str], fields: &[&str]) -> serde_json::Value {
    let (stdout, _) = succeeds(args);
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    for field in fields {
        assert!(json.get(field).is_some(), "missing {field}: {json}");
    }
    json
}

#[test]
fn word_count_writes_the_right_counts() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "the cat and the hat\nThe end\n").unwrap();
    let out = dir.path().join("out");
    let (_, stderr) = succeeds(&[
        "run",
        "word-count",
        "--quiet",
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    let mut counts: HashMap<String, u64> = HashMap::new();
    for entry in std::fs::read_dir(&out).unwrap() {
        for line in std::fs::read_to_string(entry.unwrap().path())
            .unwrap()
            .lines()
        {
            let (word, count) = line.rsplit_once(',').unwrap();
            let best = counts.entry(word.into()).or_default();
            *best = (*best).max(count.parse().unwrap());
        }
    }
    let expected: HashMap<String, u64> =
        [("the", 3), ("cat", 1), ("and", 1), ("hat", 1), ("end", 1)]
            .map(|(w, c)| (w.to_string(), c))
            .into();
    assert_eq!(counts, expected);
    assert!(stderr.contains("job 'word-count' finished"), "{stderr}");
}

#[test]
fn word_count_prints_and_reports_progress() {
    let (stdout, stderr) = succeeds(&["run", "word-count"]);
    // The bundled sample has "a" many times; its running count reaches at least 10.
    assert!(
        stdout.lines().any(|l| l.ends_with("(\"a\", 10)")),
        "{stdout}"
    );
    assert!(stderr.contains("Sink: print"), "{stderr}");
}

#[test]
fn keyed_aggregation_runs_and_counts_every_event() {
    let (_, stderr) = succeeds(&[
        "run",
        "keyed-aggregation",
        "--events",
        "200000",
        "--discard",
    ]);
    // The summary comes last; progress lines (printed when the run takes over a second)
    // name the source too.
    let source = stderr
        .lines()
        .rfind(|l| l.contains("Source: sensor readings"))
        .expect(&stderr);
    assert!(source.contains("out       200000"), "{source}");
}

#[test]
fn explain_prints_the_three_graphs() {
    let (stdout, _) = succeeds(&["run", "word-count", "--explain"]);
    for part in [
        "== StreamGraph",
        "== JobGraph",
        "== ExecutionGraph",
        "HASH",
        "Source: lines -> Tokenize",
    ] {
        assert!(stdout.contains(part), "missing {part} in\n{stdout}");
    }
}

#[test]
fn explain_memory_prints_the_per_slot_budget_without_running() {
    let (stdout, stderr) = succeeds(&[
        "run",
        "word-count",
        "--explain-memory",
        "-D",
        "taskmanager.memory.process.size=2g",
        "-D",
        "taskmanager.numberOfTaskSlots=2",
    ]);
    // 2 GiB over 2 slots: managed 0.4 -> 409.6 MiB a slot, all of it RocksDB's block cache,
    // half of that its write buffers; network 0.1 -> 102.4 MiB = 3276 segments of 32 KiB;
    // heap the remaining 1 GiB -> 512 MiB a slot.
    assert!(stdout.contains("with 2 slot(s)"), "{stdout}");
    let rows = [
        // (row, worker, per slot, the key that sets it)
        (
            "process ",
            "2048 MiB",
            "1024 MiB",
            "taskmanager.memory.process.size = 2048 MiB",
        ),
        (
            "managed ",
            "819.2 MiB",
            "409.6 MiB",
            "taskmanager.memory.managed.fraction = 0.4",
        ),
        (
            "  RocksDB block cache ",
            "",
            "307.2 MiB",
            "the managed share less the write-back cache",
        ),
        (
            "  RocksDB write buffers ",
            "",
            "204.8 MiB",
            "write-buffer-ratio = 0.5",
        ),
        (
            "  RocksDB write-back ",
            "",
            "102.4 MiB",
            "write-back-ratio = 0.25",
        ),
        (
            "network ",
            "204.8 MiB",
            "102.4 MiB",
            "taskmanager.memory.network.fraction = 0.1",
        ),
        (
            "  segments ",
            "6552 x 32 KiB",
            "3276 x 32 KiB",
            "taskmanager.memory.segment-size",
        ),
        (
            "heap ",
            "1024.0 MiB",
            "512 MiB",
            "the rest of taskmanager.memory.process.size",
        ),
    ];
    for (label, worker, per_slot, key) in rows {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no '{label}' row in\n{stdout}"));
        for part in [worker, per_slot, key] {
            assert!(line.contains(part), "'{part}' missing in: {line}");
        }
    }
    // Nothing ran.
    assert!(!stderr.contains("finished"), "{stderr}");
}

#[test]
fn bad_settings_exit_nonzero_with_a_clear_message() {
    fails_naming(
        &["run", "word-count", "-D", "taskmanager.numberOfTaskSlot=2"],
        "did you mean 'taskmanager.numberOfTaskSlots'",
    );
    fails_naming(
        &[
            "run",
            "word-count",
            "-D",
            "taskmanager.numberOfTaskSlots=4096",
        ],
        "taskmanager.numberOfTaskSlots",
    );
    fails_naming(
        &["run", "word-count", "-D", "execution.buffer-timeout=soon"],
        "a duration",
    );
    fails_naming(
        &[
            "run",
            "word-count",
            "--input",
            "/nonexistent/weir-input.txt",
        ],
        "/nonexistent/weir-input.txt",
    );
}

#[test]
fn a_failing_job_exits_nonzero_naming_the_operator_and_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("broken.txt");
    std::fs::write(&input, b"fine line\nnot \xff utf-8\n").unwrap();
    let stderr = fails_naming(
        &[
            "run",
            "word-count",
            "--quiet",
            "--input",
            input.to_str().unwrap(),
        ],
        "Source: lines",
    );
    assert!(stderr.contains("line 2"), "{stderr}");
    assert!(stderr.contains("broken.txt"), "{stderr}");
}

#[test]
fn an_empty_directory_is_an_empty_input() {
    let dir = tempfile::tempdir().unwrap();
    let (_, stderr) = succeeds(&[
        "run",
        "word-count",
        "--quiet",
        "--discard",
        "--input",
        dir.path().to_str().unwrap(),
    ]);
    assert!(stderr.contains("Sink: discard"), "{stderr}");
}

#[test]
fn config_lists_every_key() {
    let (stdout, _) = succeeds(&["config", "-D", "execution.buffer-timeout=5 ms"]);
    assert!(
        stdout.contains("execution.buffer-timeout = 5 ms"),
        "{stdout}"
    );
    assert!(
        stdout.contains("taskmanager.memory.segment-size = 32kb"),
        "{stdout}"
    );
}

#[test]
fn bench_commands_print_one_json_object() {
    let json = bench_json(
        &["bench", "chain", "--records", "200000", "--json"],
        &[
            "records",
            "seconds",
            "records_per_second",
            "baseline_records_per_second",
        ],
    );
    assert_eq!(json["records"], 200000);

    let shards = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(2)
        .to_string();
    let json = bench_json(
        &[
            "bench",
            "exchange",
            "--records",
            "200000",
            "--shards",
            &shards,
            "--json",
        ],
        &[
            "records",
            "seconds",
            "records_per_second",
            "records_per_second_per_shard",
            "shards",
            "baseline_records_per_second",
        ],
    );
    assert_eq!(json["shards"].to_string(), shards);

    for kind in ["tumbling", "sliding", "session"] {
        let json = bench_json(
            &[
                "bench",
                "window",
                "--kind",
                kind,
                "--records",
                "200000",
                "--keys",
                "100",
                "--json",
            ],
            &[
                "records",
                "seconds",
                "records_per_second",
                "baseline_records_per_second",
                "results_match",
            ],
        );
        assert_eq!(json["results_match"], true, "{json}");
    }
    fails_naming(&["bench", "window", "--kind", "hopping"], "hopping");

    for backend in ["heap", "rocksdb"] {
        let json = bench_json(
            &[
                "bench",
                "state",
                "--backend",
                backend,
                "--keys",
                "100",
                "--ops",
                "20000",
                "--json",
            ],
            &[
                "benchmark",
                "backend",
                "keys",
                "ops",
                "seconds",
                "ops_per_second",
                "baseline_ops_per_second",
                "ratio",
                "results_match",
            ],
        );
        assert_eq!(json["backend"], backend, "{json}");
        assert_eq!(json["ops"], 20000, "{json}");
        assert_eq!(json["results_match"], true, "{json}");
    }
    fails_naming(&["bench", "state", "--backend", "memory"], "memory");
    fails_naming(&["bench", "state", "--ops", "0"], "--ops");

    for backend in ["heap", "rocksdb"] {
        let json = bench_json(
            &[
                "bench",
                "join",
                "--backend",
                backend,
                "--records",
                "20000",
                "--keys",
                "100",
                "--bound-ms",
                "300",
                "--checkpoint-interval-ms",
                "20",
                "--json",
            ],
            &[
                "benchmark",
                "backend",
                "records",
                "seconds",
                "records_per_second",
                "baseline_records_per_second",
                "pairs",
                "results_match",
                "checkpoints",
            ],
        );
        assert_eq!(json["backend"], backend, "{json}");
        assert!(json["pairs"].as_u64() > Some(20000), "{json}");
        assert_eq!(json["results_match"], true, "{json}");
        // At least the final checkpoint, taken when both inputs end.
        let checkpoints = &json["checkpoints"];
        assert!(
            checkpoints["checkpoints_completed"].as_u64() >= Some(1),
            "{json}"
        );
        assert!(
            checkpoints["sync_pause_ms"]["max"].as_f64().is_some(),
            "{json}"
        );
    }
    fails_naming(&["bench", "join", "--backend", "memory"], "memory");
    fails_naming(&["bench", "join", "--records", "0"], "--records");

    let dir = tempfile::tempdir().unwrap();
    let json = bench_json(
        &[
            "bench",
            "file-sink",
            "--records",
            "100000",
            "--checkpoint-interval-ms",
            "20",
            "--dir",
            dir.path().to_str().unwrap(),
            "--json",
        ],
        &[
            "bytes",
            "megabytes_per_second",
            "baseline_megabytes_per_second",
            "parts",
            "slowdown",
        ],
    );
    assert_eq!(json["results_match"], true, "{json}");
    assert_eq!(json["checkpoint_interval_ms"], 20, "{json}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "rounds leave nothing"
    );

    fails_naming(
        &[
            "bench",
            "exchange",
            "--records",
            "1000",
            "--shards",
            "4096",
            "--json",
        ],
        "4096",
    );
}

#[test]
fn bench_submit_measures_a_submission_through_a_control_plane_and_a_worker() {
    let json = bench_json(
        &[
            "bench", "submit", "--rounds", "1", "--keys", "1000", "--json",
        ],
        &[
            "submit_to_first_record_ms",
            "embedded_to_first_record_ms",
            "ratio",
            "tasks_ready_ms",
            "restore_submit_to_first_record_ms",
            "restore_tasks_ready_ms",
            "savepoint_keys",
            "savepoint_bytes",
        ],
    );
    for figure in [
        "submit_to_first_record_ms",
        "tasks_ready_ms",
        "restore_tasks_ready_ms",
    ] {
        assert!(json[figure]["p50"].as_f64().unwrap() > 0.0, "{json}");
    }
    // Stopped after 9 of its 10 s: most of its keys, never more than it has.
    let keys = json["savepoint_keys"].as_u64().unwrap();
    assert!((500..=1000).contains(&keys), "{json}");
    assert!(json["savepoint_bytes"].as_u64().unwrap() > 0, "{json}");
}

#[test]
fn bench_coordinator_times_checkpoints_asked_through_the_control_plane_and_in_process() {
    let json = bench_json(
        &["bench", "coordinator", "--checkpoints", "12", "--json"],
        &[
            "rest_ms",
            "rest_own_ms",
            "rest_beyond_own_ms",
            "in_process_ms",
            "in_process_own_ms",
            "in_process_beyond_own_ms",
            "way_ms",
            "status_get_ms",
            "store_write_ms",
        ],
    );
    // Twelve: a batch of ten, then two more, each checkpoint's own duration found.
    assert_eq!(json["checkpoints"], 12, "{json}");
    for figure in [
        "rest_ms",
        "in_process_ms",
        "status_get_ms",
        "store_write_ms",
    ] {
        assert!(json[figure]["p50"].as_f64().unwrap() > 0.0, "{json}");
    }
    // Asked through the control plane, a checkpoint took its own time and the way there.
    assert!(
        json["rest_ms"]["p50"].as_f64() >= json["rest_own_ms"]["p50"].as_f64(),
        "{json}"
    );
}

#[test]
fn bench_control_measures_a_control_plane_serving_simulated_workers() {
    let json = bench_json(
        &[
            "bench",
            "control",
            "--jobs",
            "3",
            "--slots-per-worker",
            "2",
            "--seconds",
            "1",
            "--json",
        ],
        &[
            "idle_cpu_percent",
            "jobs_cpu_percent",
            "per_job_cpu_us_per_second",
        ],
    );
    assert_eq!(
        (json["jobs"].as_u64(), json["workers"].as_u64()),
        (Some(3), Some(2))
    );
    assert_eq!(json["heartbeat_interval_ms"], 10_000, "the default: {json}");
    assert!(
        json["figures_bytes"].as_u64().unwrap() > 500,
        "a real reading: {json}"
    );
    assert!(json["jobs_cpu_percent"].as_f64().unwrap() >= 0.0, "{json}");
}

#[test]
fn weir_tune_checks_applies_and_scripts_against_a_host_tree_and_computes_memory() {
    let (listed, _) = succeeds(&["tune", "list"]);
    for name in [
        "cpu-governor",
        "transparent-hugepages",
        "swappiness",
        "memlock",
        "open-files",
        "udp-buffers",
        "io-uring",
        "irq-affinity",
        "clocksource",
        "disk-queues",
        "isolated-cores",
    ] {
        assert!(listed.contains(name), "{name} not listed:\n{listed}");
    }
    // A host tree whose one readable setting is off.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let swappiness = dir.path().join("proc/sys/vm/swappiness");
    std::fs::create_dir_all(swappiness.parent().unwrap()).unwrap();
    std::fs::write(&swappiness, "60\n").unwrap();
    let checked = weir(&["tune", "check", "--root", root]);
    let out = text(&checked.stdout);
    assert_eq!(checked.status.code(), Some(1), "{out}");
    assert!(out.contains("swappiness: vm.swappiness is 60"), "{out}");
    assert!(out.contains("clocksource: skipped"), "{out}");
    let (script, _) = succeeds(&["tune", "script", "--root", root]);
    assert!(
        script.contains(&format!("echo 1 > {}", swappiness.display())),
        "{script}"
    );
    succeeds(&["tune", "apply", "--root", root]);
    assert_eq!(std::fs::read_to_string(&swappiness).unwrap(), "1\n");
    let checked = weir(&["tune", "check", "--root", root, "--tuner", "swappiness"]);
    assert_eq!(checked.status.code(), Some(0), "{}", text(&checked.stdout));
    let wrong = weir(&["tune", "check", "--tuner", "governor"]);
    assert_eq!(wrong.status.code(), Some(2));
    assert!(text(&wrong.stderr).contains("no tuner 'governor'; the tuners: cpu-governor"));

    // The budgets a worker of 64 GiB with 16 slots computes, per slot.
    let (memory, _) = succeeds(&["tune", "memory", "--process-size", "64g", "--slots", "16"]);
    let (explained, _) = succeeds(&[
        "run",
        "word-count",
        "--explain-memory",
        "-D",
        "taskmanager.memory.process.size=64g",
        "-D",
        "taskmanager.numberOfTaskSlots=16",
    ]);
    assert_eq!(memory, explained);
    assert!(memory.contains("16"), "{memory}");
    fails_naming(
        &["tune", "memory", "--process-size", "lots"],
        "taskmanager.memory.process.size",
    );
}

#[test]
fn the_packaged_units_are_what_weir_tune_systemd_renders() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/debian");
    for role in ["control", "worker", "tune"] {
        let (rendered, _) = succeeds(&["tune", "systemd", "--role", role]);
        let path = format!("{dir}/weir-{role}.service");
        let packaged = std::fs::read_to_string(&path).unwrap();
        assert!(
            packaged == rendered,
            "{path} differs from `weir tune systemd --role {role}`: regenerate it with \
             `weir tune systemd --role {role} > control/debian/weir-{role}.service`"
        );
    }
}

#[test]
fn weir_tune_certs_makes_the_cluster_ca_once_and_a_certificate_per_node() {
    use std::os::unix::fs::PermissionsExt;
    use weir_net::tls::TlsIdentity;

    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let path = certs.to_str().unwrap();
    let (wrote, _) = succeeds(&[
        "tune",
        "certs",
        "--dir",
        path,
        "--node",
        "control",
        "--node",
        "worker-1=10.0.0.11,worker-1.example",
    ]);
    assert!(
        wrote.contains("ca.pem") && wrote.contains("worker-1-key.pem"),
        "{wrote}"
    );
    let mode = |file: &str| {
        std::fs::metadata(certs.join(file))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("ca-key.pem"), 0o600);
    assert_eq!(mode("worker-1-key.pem"), 0o600);
    assert_eq!(mode("worker-1.pem"), 0o644);
    let load = |node: &str| {
        TlsIdentity::from_files(
            &certs.join("ca.pem"),
            &certs.join(format!("{node}.pem")),
            &certs.join(format!("{node}-key.pem")),
        )
    };
    load("control").unwrap();
    load("worker-1").unwrap();

    // A later node is issued by the same CA, which stays as it was.
    let ca = std::fs::read_to_string(certs.join("ca.pem")).unwrap();
    let (wrote, _) = succeeds(&["tune", "certs", "--dir", path, "--node", "worker-2"]);
    assert!(wrote.contains("issuing with the cluster CA"), "{wrote}");
    assert_eq!(std::fs::read_to_string(certs.join("ca.pem")).unwrap(), ca);
    load("worker-2").unwrap();

    // A node's key with another node's certificate is refused, naming the files.
    let mismatched = TlsIdentity::from_files(
        &certs.join("ca.pem"),
        &certs.join("worker-1.pem"),
        &certs.join("worker-2-key.pem"),
    )
    .unwrap_err()
    .to_string();
    assert!(mismatched.contains("worker-2-key.pem"), "{mismatched}");
    let missing = load("worker-3").unwrap_err().to_string();
    assert!(
        missing.contains("worker-3.pem") && missing.contains("weir tune certs"),
        "{missing}"
    );

    // An existing node is not overwritten; a bad name is refused before anything is written.
    fails_naming(
        &["tune", "certs", "--dir", path, "--node", "worker-2"],
        "remove worker-2.pem and worker-2-key.pem first",
    );
    fails_naming(
        &[
            "tune", "certs", "--dir", path, "--node", "ok", "--node", "../evil",
        ],
        "--node ../evil",
    );
    assert!(!certs.join("ok.pem").exists());
}

/// Whether a test may make network namespaces: `.ci/run` runs the tests as root with iproute2
/// and says so (`WEIR_REQUIRE_NETNS`); elsewhere the parts that need them are skipped.
fn namespaces_allowed() -> bool {
    let allowed = std::env::var_os("WEIR_REQUIRE_NETNS").is_some();
    if !allowed {
        eprintln!("skipped the runs over a veth pair: WEIR_REQUIRE_NETNS is not set");
    }
    allowed
}

#[test]
fn weir_bench_net_moves_every_byte_over_the_exchange_and_over_bare_quinn() {
    let json = bench_json(
        &[
            "bench",
            "net",
            "--bytes",
            "4m",
            "--channels",
            "2",
            "--credits",
            "4",
            "--json",
        ],
        &[
            "bytes_per_second",
            "quinn_bytes_per_second",
            "ratio_to_quinn",
        ],
    );
    // 4 MiB in 32 KiB segments over two channels: 64 per channel, every byte received (the
    // benchmark fails a round that lost any).
    assert_eq!(json["bytes"], 4 << 20, "{json}");
    assert!(json["bytes_per_second"].as_f64().unwrap() > 0.0, "{json}");
    assert_eq!(json["link"], "loopback", "{json}");
    if namespaces_allowed() {
        // Across a veth pair between two namespaces, both sides: every byte again.
        let json = bench_json(
            &["bench", "net", "--bytes", "4m", "--veth", "--json"],
            &["bytes_per_second", "quinn_bytes_per_second"],
        );
        assert_eq!(
            (json["bytes"].as_u64(), json["link"].as_str()),
            (Some(4 << 20), Some("veth"))
        );
    }
    fails_naming(
        &["bench", "net", "--segment-size", "1000"],
        "--segment-size a power of two",
    );
}

#[test]
fn weir_bench_remote_exchange_runs_the_job_on_one_executor_and_spread_over_two() {
    if weir_engine::runtime::available_cores().len() < 2 {
        return;
    }
    for bytes in ["64", "1024"] {
        let json = bench_json(
            &[
                "bench",
                "remote-exchange",
                "--records",
                "20000",
                "--record-bytes",
                bytes,
                "--json",
            ],
            &[
                "local_records_per_second",
                "remote_records_per_second",
                "remote_cost",
            ],
        );
        assert_eq!(json["record_bytes"].to_string(), bytes, "{json}");
        // Every round, local and spread, sank as many records as the first local one.
        assert_eq!(json["results_match"], true, "{json}");
    }
    if namespaces_allowed() {
        // The executors in two namespaces, their records across a veth pair.
        let json = bench_json(
            &[
                "bench",
                "remote-exchange",
                "--records",
                "20000",
                "--veth",
                "--json",
            ],
            &["remote_records_per_second"],
        );
        assert_eq!(json["link"], "veth", "{json}");
        assert_eq!(json["results_match"], true, "{json}");
    }
    fails_naming(
        &["bench", "remote-exchange", "--record-bytes", "100"],
        "--record-bytes must be 64 or 1024 (got 100)",
    );
}
