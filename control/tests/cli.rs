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

#[test]
fn word_count_writes_the_right_counts() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "the cat and the hat\nThe end\n").unwrap();
    let out = dir.path().join("out");
    let result = weir(&[
        "run",
        "word-count",
        "--quiet",
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(result.status.success(), "{}", text(&result.stderr));
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
    assert!(
        text(&result.stderr).contains("job 'word-count' finished"),
        "{}",
        text(&result.stderr)
    );
}

#[test]
fn word_count_prints_and_reports_progress() {
    let result = weir(&["run", "word-count"]);
    assert!(result.status.success(), "{}", text(&result.stderr));
    let stdout = text(&result.stdout);
    // The bundled sample has "a" many times; its running count reaches at least 10.
    assert!(
        stdout.lines().any(|l| l.ends_with("(\"a\", 10)")),
        "{stdout}"
    );
    assert!(text(&result.stderr).contains("Sink: print"));
}

#[test]
fn keyed_aggregation_runs_and_counts_every_event() {
    let result = weir(&[
        "run",
        "keyed-aggregation",
        "--events",
        "200000",
        "--discard",
    ]);
    assert!(result.status.success(), "{}", text(&result.stderr));
    let stderr = text(&result.stderr);
    let source = stderr
        .lines()
        .find(|l| l.contains("Source: sensor readings"))
        .expect(&stderr);
    assert!(source.contains("out       200000"), "{source}");
}

#[test]
fn explain_prints_the_three_graphs() {
    let result = weir(&["run", "word-count", "--explain"]);
    assert!(result.status.success(), "{}", text(&result.stderr));
    let stdout = text(&result.stdout);
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
    let result = weir(&[
        "run",
        "word-count",
        "--quiet",
        "--discard",
        "--input",
        dir.path().to_str().unwrap(),
    ]);
    assert!(result.status.success(), "{}", text(&result.stderr));
    assert!(
        text(&result.stderr).contains("Sink: discard"),
        "{}",
        text(&result.stderr)
    );
}

#[test]
fn config_lists_every_key() {
    let result = weir(&["config", "-D", "execution.buffer-timeout=5 ms"]);
    assert!(result.status.success(), "{}", text(&result.stderr));
    let stdout = text(&result.stdout);
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
    let result = weir(&["bench", "chain", "--records", "200000", "--json"]);
    assert!(result.status.success(), "{}", text(&result.stderr));
    let json: serde_json::Value = serde_json::from_str(text(&result.stdout).trim()).unwrap();
    for field in [
        "records",
        "seconds",
        "records_per_second",
        "baseline_records_per_second",
    ] {
        assert!(json.get(field).is_some(), "missing {field}: {json}");
    }
    assert_eq!(json["records"], 200000);

    let result = weir(&[
        "bench",
        "exchange",
        "--records",
        "200000",
        "--shards",
        "2",
        "--json",
    ]);
    assert!(result.status.success(), "{}", text(&result.stderr));
    let json: serde_json::Value = serde_json::from_str(text(&result.stdout).trim()).unwrap();
    for field in [
        "records",
        "seconds",
        "records_per_second",
        "records_per_second_per_shard",
        "shards",
        "baseline_records_per_second",
    ] {
        assert!(json.get(field).is_some(), "missing {field}: {json}");
    }

    let result = weir(&[
        "bench",
        "exchange",
        "--records",
        "1000",
        "--shards",
        "4096",
        "--json",
    ]);
    assert!(!result.status.success());
}
