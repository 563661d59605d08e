//! File connectors: CSV and JSON-lines sources read the right records (across an exchange, so
//! through rkyv), malformed lines fail the job with file and line or are skipped on request,
//! a directory reads every file in it, and the file sink writes `part-<subtask>` files.

mod common;

use std::io::Write;
use std::path::Path;

use common::assert_same_multiset;
use weir_engine::connector::{BucketAssigner, BucketPeriod, RollingPolicy};
use weir_engine::error::FailureKind;
use weir_engine::prelude::*;

/// A record read from JSON and carried across an exchange.
#[derive(
    Clone,
    Debug,
    PartialEq,
    Eq,
    Hash,
    serde::Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
struct Trade {
    symbol: String,
    price_cents: u64,
    quantity: u32,
    tags: Vec<String>,
    note: Option<String>,
}

fn trade(i: u64) -> Trade {
    Trade {
        symbol: ["ACME", "WEIR", "ÆØÅ", "a \"quoted\" name"][(i % 4) as usize].to_string(),
        price_cents: 10_000 + i * 13,
        quantity: (i % 50) as u32,
        tags: (0..i % 3).map(|t| format!("tag{t}")).collect(),
        note: i.is_multiple_of(5).then(|| format!("note {i}")),
    }
}

fn trade_json(t: &Trade) -> String {
    serde_json::json!({
        "symbol": t.symbol,
        "price_cents": t.price_cents,
        "quantity": t.quantity,
        "tags": t.tags,
        "note": t.note,
    })
    .to_string()
}

fn write_file(path: &Path, text: &str) {
    let mut file = std::fs::File::create(path).expect("create test file");
    file.write_all(text.as_bytes()).expect("write test file");
}

/// Reads every line of every file in `dir`, with the file names found.
fn read_parts(dir: &Path) -> (Vec<String>, Vec<String>) {
    let mut names = Vec::new();
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).expect("output directory") {
        let path = entry.expect("directory entry").path();
        names.push(
            path.file_name()
                .and_then(|n| n.to_str())
                .expect("a UTF-8 name")
                .to_string(),
        );
        let text = std::fs::read_to_string(&path).expect("read a part file");
        lines.extend(text.lines().map(str::to_string));
    }
    names.sort();
    (names, lines)
}

fn read_trades(source: FileSource<Trade>) -> Result<(Vec<Trade>, JobResult), JobError> {
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_source(source, WatermarkStrategy::no_watermarks(), "trades")
        .rebalance()
        .sink_to(sink, "trades");
    let result = env.execute("json lines")?;
    Ok((collected.records(), result))
}

#[test]
fn csv_rows_are_read_with_quoting_and_blank_lines_skipped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("rows.csv");
    write_file(
        &path,
        "symbol,price,qty\n\"ACME, Inc.\",12,3\nWEIR,7,1\n\n\"say \"\"hi\"\"\",0,\r\n   \nlast,1,2",
    );
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_source(
        FileSource::csv(&path),
        WatermarkStrategy::no_watermarks(),
        "csv",
    )
    .rebalance()
    .sink_to(sink, "rows");
    let result = env.execute("csv").expect("the job succeeds");
    let row = |fields: &[&str]| fields.iter().map(|f| f.to_string()).collect::<Vec<_>>();
    let expected = vec![
        row(&["symbol", "price", "qty"]),
        row(&["ACME, Inc.", "12", "3"]),
        row(&["WEIR", "7", "1"]),
        row(&["say \"hi\"", "0", ""]),
        row(&["last", "1", "2"]),
    ];
    assert_same_multiset(&collected.records(), &expected);
    assert_eq!(result.records_out("Source: csv"), 5);
}

#[test]
fn malformed_csv_fails_with_file_and_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("broken.csv");
    write_file(&path, "a,b\nc,d\n\"unterminated,e\nf,g\n");
    let env = common::env();
    let (sink, _collected) = CollectSink::new();
    env.from_source(
        FileSource::csv(&path),
        WatermarkStrategy::no_watermarks(),
        "csv",
    )
    .sink_to(sink, "rows");
    let err = env.execute("csv").expect_err("line 3 is malformed");
    let text = err.to_string();
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(text.contains("line 3"), "{text}");
}

#[test]
fn json_lines_are_deserialized_into_structs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("trades.jsonl");
    let trades: Vec<Trade> = (0..2_000).map(trade).collect();
    let mut text = String::new();
    for (i, t) in trades.iter().enumerate() {
        text.push_str(&trade_json(t));
        text.push('\n');
        if i % 500 == 0 {
            text.push('\n');
        }
    }
    write_file(&path, &text);
    let (records, result) = read_trades(FileSource::json_lines(&path)).expect("the job succeeds");
    assert_same_multiset(&records, &trades);
    assert_eq!(result.records_out("Source: trades"), 2_000);
}

/// A JSON-lines file of `lines` lines whose line `bad` (1-based) is not JSON; returns the
/// trades on the other lines.
fn write_trades_with_bad_line(path: &Path, lines: u64, bad: u64) -> Vec<Trade> {
    let mut text = String::new();
    let mut good = Vec::new();
    for line in 1..=lines {
        if line == bad {
            text.push_str("{\"symbol\": \"BROKEN\", \"price_cents\": \n");
        } else {
            let t = trade(line);
            text.push_str(&trade_json(&t));
            text.push('\n');
            good.push(t);
        }
    }
    write_file(path, &text);
    good
}

#[test]
fn a_malformed_json_line_fails_the_job_naming_file_and_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("trades.jsonl");
    write_trades_with_bad_line(&path, 3_000, 2_345);
    let err = read_trades(FileSource::json_lines(&path)).expect_err("line 2345 is malformed");
    match &err {
        JobError::TaskFailed {
            operator,
            message,
            kind,
            ..
        } => {
            assert_eq!(operator, "Source: trades", "{err}");
            assert_eq!(*kind, FailureKind::User, "bad input is a user error: {err}");
            assert!(message.contains(&path.display().to_string()), "{message}");
            assert!(message.contains("line 2345"), "{message}");
            assert!(
                message.contains("skip_malformed"),
                "names the fix: {message}"
            );
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("trades.jsonl line 2345"), "{text}");
}

#[test]
fn skip_malformed_skips_the_bad_line_and_keeps_the_rest() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("trades.jsonl");
    let good = write_trades_with_bad_line(&path, 3_000, 2_345);
    let (records, result) = read_trades(FileSource::json_lines(&path).skip_malformed())
        .expect("the bad line is skipped");
    assert_eq!(records.len(), 2_999);
    assert_same_multiset(&records, &good);
    assert_eq!(result.records_out("Source: trades"), 2_999);
}

#[test]
fn a_json_value_of_the_wrong_shape_is_malformed_too() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("trades.jsonl");
    let mut text = trade_json(&trade(1));
    text.push('\n');
    text.push_str("{\"symbol\": \"X\", \"price_cents\": -5, \"quantity\": 1, \"tags\": []}\n");
    write_file(&path, &text);
    let err = read_trades(FileSource::json_lines(&path)).expect_err("a negative price");
    assert!(err.to_string().contains("line 2"), "{err}");
}

#[test]
fn a_missing_file_fails_naming_the_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("does-not-exist.txt");
    let env = common::env();
    let (sink, _collected) = CollectSink::new();
    env.from_source(
        FileSource::text_lines(&path),
        WatermarkStrategy::no_watermarks(),
        "missing",
    )
    .sink_to(sink, "lines");
    let err = env.execute("missing").expect_err("no such file");
    let text = err.to_string();
    assert!(text.contains("Source: missing"), "{text}");
    assert!(text.contains(&path.display().to_string()), "{text}");
}

#[test]
fn text_lines_keep_empty_lines_strip_line_ends_and_read_an_unterminated_last_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("lines.txt");
    write_file(
        &path,
        "first\r\n\nthird  \r\n  fourth\nlast without newline",
    );
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_source(
        FileSource::text_lines(&path),
        WatermarkStrategy::no_watermarks(),
        "text",
    )
    .sink_to(sink, "lines");
    env.execute("text").expect("the job succeeds");
    let lines: Vec<String> = collected.records();
    assert_eq!(
        lines,
        ["first", "", "third  ", "  fourth", "last without newline"],
        "one reader, in file order"
    );
}

#[test]
fn a_directory_path_reads_every_file_in_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut expected = Vec::new();
    for file in 0..5 {
        let lines: Vec<String> = (0..(200 * file + 1))
            .map(|i| format!("f{file}-l{i}"))
            .collect();
        write_file(
            &dir.path().join(format!("input-{file}.txt")),
            &(lines.join("\n") + "\n"),
        );
        expected.extend(lines);
    }
    // Hidden and underscore files (`.crc`, `_SUCCESS` markers) are not input.
    write_file(&dir.path().join(".hidden"), "not input\n");
    write_file(&dir.path().join("_SUCCESS"), "not input\n");
    for parallelism in common::parallelisms() {
        let env = common::env();
        let (sink, collected) = CollectSink::new();
        env.from_source(
            FileSource::text_lines(dir.path()),
            WatermarkStrategy::no_watermarks(),
            "dir",
        )
        .parallelism(parallelism)
        .rebalance()
        .sink_to(sink, "lines");
        let result = env.execute("directory").expect("the job succeeds");
        assert_same_multiset(&collected.records(), &expected);
        assert_eq!(result.records_out("Source: dir"), expected.len() as u64);
    }
}

#[test]
fn file_sink_writes_one_part_per_subtask_with_every_record() {
    let parallelism = common::slots();
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out");
    let env = common::env();
    env.from_sequence(0, 20_000)
        .map(|n: u64| n * 3)
        .rebalance()
        .sink_to(FileSink::lines(&out), "files")
        .parallelism(parallelism);
    let result = env.execute("file sink").expect("the job succeeds");
    assert_eq!(result.records_in("Sink: files"), 20_000);
    let (names, lines) = read_parts(&out);
    let expected_names: Vec<String> = (0..parallelism).map(|s| format!("part-{s}-0")).collect();
    assert_eq!(names, expected_names);
    let expected: Vec<String> = (0..20_000u64).map(|n| (n * 3).to_string()).collect();
    assert_same_multiset(&lines, &expected);
}

#[test]
fn file_sink_writes_no_part_for_a_subtask_that_got_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out");
    let env = common::env();
    // One record: only one subtask receives it, and only it leaves a part.
    env.from_collection(vec![42u64])
        .sink_to(FileSink::lines(&out), "files");
    env.execute("one record").expect("the job succeeds");
    let (names, lines) = read_parts(&out);
    assert_eq!(names.len(), 1, "{names:?}");
    assert_eq!(lines, ["42"]);
}

/// The part files of one subtask under `dir`, by number: (number, size, lines).
fn parts_of(dir: &Path, subtask: usize) -> Vec<(u64, u64, Vec<String>)> {
    let mut parts: Vec<(u64, u64, Vec<String>)> = std::fs::read_dir(dir)
        .expect("output directory")
        .filter_map(|entry| {
            let path = entry.expect("an entry").path();
            let name = path.file_name()?.to_str()?.to_string();
            let (s, n) = name.strip_prefix("part-")?.split_once('-')?;
            (s.parse::<usize>().ok()? == subtask).then(|| {
                let text = std::fs::read_to_string(&path).expect("a part");
                let lines = text.lines().map(str::to_string).collect();
                (n.parse().expect("a number"), text.len() as u64, lines)
            })
        })
        .collect();
    parts.sort();
    parts
}

/// `parts` (of one subtask, by number) hold the numbers `0..records` in order, each once, and
/// `out` holds nothing else (no hidden part).
fn hold_in_order(parts: Vec<(u64, u64, Vec<String>)>, records: u64, out: &Path) {
    let lines: Vec<String> = parts.into_iter().flat_map(|(_, _, lines)| lines).collect();
    let expected: Vec<String> = (0..records).map(|n| n.to_string()).collect();
    assert_eq!(lines, expected);
    let (names, _) = read_parts(out);
    assert!(
        names.iter().all(|name| name.starts_with("part-")),
        "{names:?}"
    );
}

#[test]
fn file_sink_rolls_parts_by_size_numbered_in_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out");
    let env = common::env_with(1, &[("execution.batch-size", "64")]);
    env.from_sequence(0, 20_000).sink_to(
        FileSink::lines(&out)
            .with_rolling_policy(RollingPolicy::default().with_max_part_size(4096)),
        "files",
    );
    env.execute("rolling").expect("the job succeeds");
    let parts = parts_of(&out, 0);
    assert!(parts.len() > 20, "{} parts", parts.len());
    let numbers: Vec<u64> = parts.iter().map(|(n, _, _)| *n).collect();
    assert_eq!(numbers, (0..parts.len() as u64).collect::<Vec<_>>());
    // A part rolls before the batch that would find it full: at most one batch over.
    for (n, size, _) in &parts {
        assert!(*size < 4096 + 64 * 6, "part {n} holds {size} bytes");
    }
    hold_in_order(parts, 20_000, &out);
}

#[test]
fn file_sink_writes_each_record_into_its_bucket() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out");
    let env = common::env();
    env.from_sequence(0, 3_000).rebalance().sink_to(
        FileSink::lines(&out)
            .with_bucket_assigner(BucketAssigner::by(|n: &u64| format!("mod-{}", n % 3))),
        "files",
    );
    env.execute("buckets").expect("the job succeeds");
    let mut buckets: Vec<String> = std::fs::read_dir(&out)
        .expect("output directory")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    buckets.sort();
    assert_eq!(buckets, ["mod-0", "mod-1", "mod-2"]);
    for residue in 0..3u64 {
        let (_, lines) = read_parts(&out.join(format!("mod-{residue}")));
        let expected: Vec<String> = (0..3_000u64)
            .filter(|n| n % 3 == residue)
            .map(|n| n.to_string())
            .collect();
        assert_same_multiset(&lines, &expected);
    }
}

#[test]
fn an_event_time_bucket_needs_timestamps() {
    let dir = tempfile::tempdir().expect("temp dir");
    let env = common::env();
    env.from_sequence(0, 10).sink_to(
        FileSink::lines(dir.path().join("out")).with_bucket_assigner(BucketAssigner::date_time(
            BucketPeriod::Hour,
            TimeDomain::EventTime,
        )),
        "files",
    );
    let error = env
        .execute("no timestamps")
        .expect_err("the job fails")
        .to_string();
    assert!(
        error.contains("without a timestamp") && error.contains("WatermarkStrategy"),
        "{error}"
    );
}

#[test]
fn file_sink_fails_naming_an_output_directory_it_cannot_create() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("a-file");
    write_file(&file, "not a directory");
    let out = file.join("out");
    let env = common::env();
    env.from_sequence(0, 10)
        .sink_to(FileSink::lines(&out), "files");
    let error = env
        .execute("unwritable")
        .expect_err("the job fails")
        .to_string();
    assert!(
        error.contains(&out.display().to_string()) && error.contains("writable output directory"),
        "{error}"
    );
}

/// With checkpoints, parts roll at every barrier and are renamed when the checkpoint
/// completes: the job leaves several parts per subtask, every record once, nothing hidden.
#[test]
fn a_checkpointed_file_sink_commits_a_part_per_checkpoint() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out");
    let checkpoints = dir.path().join("checkpoints");
    let env = common::env_with(
        1,
        &[
            ("execution.checkpointing.interval", "50 ms"),
            ("execution.checkpointing.dir", checkpoints.to_str().unwrap()),
        ],
    );
    env.from_source(
        DataGeneratorSource::new(Some(20_000), |i| i).with_rate(40_000.0),
        WatermarkStrategy::no_watermarks(),
        "trickle",
    )
    .sink_to(FileSink::lines(&out), "files");
    let result = env.execute("checkpointed").expect("the job succeeds");
    let completed = result.checkpoints.as_ref().map_or(0, |c| c.completed);
    assert!(completed >= 3, "{:?}", result.checkpoints);
    let parts = parts_of(&out, 0);
    assert!(parts.len() >= 3, "{} parts", parts.len());
    hold_in_order(parts, 20_000, &out);
}

#[derive(
    Clone,
    Debug,
    PartialEq,
    serde::Serialize,
    serde::Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
struct Row {
    name: String,
    amount: i64,
    ok: bool,
}

fn row(i: u64) -> Row {
    Row {
        name: ["plain", "with, comma", "with \"quotes\"", "ÆØÅ"][(i % 4) as usize].to_string(),
        amount: i as i64 - 50,
        ok: i.is_multiple_of(2),
    }
}

#[test]
fn file_sink_writes_json_lines_and_csv_rows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rows: Vec<Row> = (0..200).map(row).collect();
    let env = common::env();
    let stream = env.from_collection(rows.clone());
    stream
        .clone()
        .sink_to(FileSink::json_lines(dir.path().join("json")), "json");
    stream.sink_to(FileSink::csv(dir.path().join("csv")), "csv");
    env.execute("formats").expect("the job succeeds");

    let (_, json) = read_parts(&dir.path().join("json"));
    let read: Vec<Row> = json
        .iter()
        .map(|line| serde_json::from_str(line).expect("a JSON row"))
        .collect();
    assert_same_multiset(
        &read.iter().map(|r| format!("{r:?}")).collect::<Vec<_>>(),
        &rows.iter().map(|r| format!("{r:?}")).collect::<Vec<_>>(),
    );

    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_source(
        FileSource::csv(dir.path().join("csv")),
        WatermarkStrategy::no_watermarks(),
        "csv",
    )
    .sink_to(sink, "rows");
    env.execute("read csv").expect("the job succeeds");
    let expected: Vec<Vec<String>> = rows
        .iter()
        .map(|r| vec![r.name.clone(), r.amount.to_string(), r.ok.to_string()])
        .collect();
    assert_same_multiset(&collected.records(), &expected);
}

#[test]
fn file_sink_output_reads_back_through_the_file_source() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("round-trip");
    let trades: Vec<Trade> = (0..1_000).map(trade).collect();

    let env = common::env();
    env.from_collection(trades.clone()).sink_to(
        FileSink::with_formatter(&out, |t: &Trade, line: &mut String| {
            line.push_str(&trade_json(t))
        }),
        "json",
    );
    env.execute("write json").expect("the job succeeds");

    let (records, _) = read_trades(FileSource::json_lines(&out)).expect("the job succeeds");
    assert_same_multiset(&records, &trades);
}

#[test]
fn file_sink_survives_flushes_racing_with_arriving_records() {
    // A throttled source keeps records trickling across the exchange while the sink's buffer
    // timeout flushes its file: the sink's task is woken by arriving segments while a file
    // write is still in flight, and must wait for that write rather than fail.
    let parallelism = common::slots();
    for round in 0..3 {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("out");
        let env = common::env();
        env.from_source(
            DataGeneratorSource::new(Some(20_000), |i| i).with_rate(100_000.0),
            WatermarkStrategy::no_watermarks(),
            "trickle",
        )
        .rebalance()
        .sink_to(FileSink::lines(&out), "files")
        .parallelism(parallelism);
        let result = env
            .execute("trickling file sink")
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(result.records_in("Sink: files"), 20_000);
        let (_, lines) = read_parts(&out);
        let expected: Vec<String> = (0..20_000u64).map(|n| n.to_string()).collect();
        assert_same_multiset(&lines, &expected);
    }
}

#[test]
fn file_source_survives_backpressure_while_reading() {
    // The source's task waits for credit between reads of its files; a wake-up left over from
    // such a wait must not disturb a file read in flight.
    let dir = tempfile::tempdir().expect("temp dir");
    let mut expected = Vec::new();
    for file in 0..4 {
        let lines: Vec<String> = (0..20_000).map(|i| format!("{file}-{i:06}")).collect();
        write_file(
            &dir.path().join(format!("part-{file}")),
            &(lines.join("\n") + "\n"),
        );
        expected.extend(lines);
    }
    let parallelism = common::slots();
    let env = common::env_with(
        parallelism,
        &[
            ("taskmanager.network.memory.buffers-per-channel", "1"),
            ("taskmanager.memory.segment-size", "4kb"),
        ],
    );
    let (sink, collected) = CollectSink::new();
    let sink = sink.with_delay_per_batch(std::time::Duration::from_micros(100));
    env.from_source(
        FileSource::text_lines(dir.path()),
        WatermarkStrategy::no_watermarks(),
        "files",
    )
    .rebalance()
    .sink_to(sink, "slow");
    let result = env
        .execute("backpressured file source")
        .expect("the job succeeds");
    assert!(result.backpressure_waits("Source: files") > 0);
    assert_same_multiset(&collected.records(), &expected);
}

/// A full disk (a 256 KiB tmpfs; needs root to mount): the job fails naming the part file and
/// the reason, and the parts committed before stay whole — every record of them once, in
/// order.
#[test]
fn a_full_disk_fails_the_job_and_keeps_what_was_committed() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: mounting a small tmpfs needs root");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let disk = dir.path().join("disk");
    std::fs::create_dir(&disk).expect("the mount point");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&disk)
        .status()
        .expect("run mount");
    assert!(mounted.success(), "mount a tmpfs");
    let out = disk.join("out");
    let checkpoints = dir.path().join("checkpoints");
    let env = common::env_with(
        1,
        &[
            ("execution.checkpointing.interval", "20 ms"),
            ("execution.checkpointing.dir", checkpoints.to_str().unwrap()),
            ("restart-strategy.type", "none"),
        ],
    );
    env.from_source(
        DataGeneratorSource::new(Some(200_000), |i| i).with_rate(200_000.0),
        WatermarkStrategy::no_watermarks(),
        "numbers",
    )
    .sink_to(FileSink::lines(&out), "files");
    let error = env
        .execute("full disk")
        .map(|_| ())
        .map_err(|e| e.to_string());
    let parts = parts_of(&out, 0);
    let _ = std::process::Command::new("umount").arg(&disk).status();
    let error = error.expect_err("the job fails");
    assert!(
        error.contains(&out.display().to_string())
            && (error.contains("No space left on device") || error.contains("the disk is full")),
        "{error}"
    );
    assert!(
        !parts.is_empty(),
        "parts were committed before the disk filled"
    );
    let lines: Vec<String> = parts
        .iter()
        .flat_map(|(_, _, lines)| lines.clone())
        .collect();
    let wrong = lines
        .iter()
        .enumerate()
        .find(|(i, line)| **line != i.to_string());
    assert!(
        wrong.is_none(),
        "the committed parts hold a prefix, whole: line {wrong:?} of {} in parts {:?}",
        lines.len(),
        parts
            .iter()
            .map(|(n, size, lines)| (n, size, lines.len()))
            .collect::<Vec<_>>()
    );
}
