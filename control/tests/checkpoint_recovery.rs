//! Exactly-once state under SIGKILL: `weir run sequence-check` is killed at random moments and
//! resumed with `--resume` several times; at the end every key's state has counted each of its
//! records exactly once — no gap (a record lost), no repeat (one counted twice) — at
//! parallelism 1 and 2, which only holds when barriers align and snapshots are consistent.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use weir_examples::sequence_check::{problems, KeyReport, SequenceSpec};

/// What the job generates (`weir run sequence-check` has 16 splits).
const KEYS: u32 = 64;
const EVENTS: u64 = 960_000;
/// Records per second per reader: a run takes a few seconds, so kills land mid-way.
const RATE: &str = "120000";

fn spec() -> SequenceSpec {
    SequenceSpec {
        splits: 16,
        keys_per_split: KEYS / 16,
        per_key: EVENTS / u64::from(KEYS),
        rate: None,
    }
}

fn start(checkpoints: &Path, output: &Path, slots: usize, resume: bool) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_weir"));
    command.args([
        "run",
        "sequence-check",
        "--quiet",
        "--events",
        &EVENTS.to_string(),
        "--keys",
        &KEYS.to_string(),
        "--rate",
        RATE,
        "--output",
        output.to_str().expect("a UTF-8 path"),
        "-D",
        "execution.checkpointing.interval=50ms",
        "-D",
        &format!(
            "execution.checkpointing.dir={}",
            checkpoints.to_str().expect("a UTF-8 path")
        ),
        "-D",
        &format!("taskmanager.numberOfTaskSlots={slots}"),
    ]);
    if resume {
        command.arg("--resume");
    }
    command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start weir")
}

/// The key reports in an output directory's part files.
fn read_reports(dir: &Path) -> Vec<KeyReport> {
    let mut reports = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the output directory") {
        let text = std::fs::read_to_string(entry.expect("an entry").path()).expect("a part file");
        for line in text.lines() {
            reports.push(KeyReport::parse(line).unwrap_or_else(|| panic!("a bad line: {line}")));
        }
    }
    reports
}

/// A small deterministic generator, seeded per run (the seed is in every failure message).
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

fn killed_and_resumed(slots: usize) {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_nanos() as u64;
    let mut random = Random(seed);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let checkpoints = dir.path().join("checkpoints");
    let mut resumed = 0;
    for attempt in 0..4 {
        let output = dir.path().join(format!("out-{attempt}"));
        let mut child = start(&checkpoints, &output, slots, attempt > 0);
        let delay = Duration::from_millis(400 + random.next() % 900);
        let started = Instant::now();
        while started.elapsed() < delay {
            if child.try_wait().expect("poll weir").is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // SIGKILL: no chance to clean up.
        let _ = child.kill();
        let result = child.wait_with_output().expect("wait for weir");
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(
            !stderr.lines().any(|line| line.starts_with("error:")),
            "attempt {attempt} (seed {seed}) failed:\n{stderr}"
        );
        resumed += usize::from(stderr.contains("resumes from checkpoint"));
    }
    assert!(
        resumed >= 2,
        "only {resumed} of the 3 killed runs after the first resumed from a checkpoint (seed {seed})"
    );
    let output = dir.path().join("out-final");
    let child = start(&checkpoints, &output, slots, true);
    let result = child.wait_with_output().expect("wait for weir");
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        result.status.success(),
        "the last run (seed {seed}) failed:\n{stderr}"
    );
    assert!(
        stderr.contains("resumes from checkpoint"),
        "the last run (seed {seed}) did not resume from a checkpoint:\n{stderr}"
    );
    let problems = problems(spec(), &read_reports(&output));
    assert!(
        problems.is_empty(),
        "after {} resumed runs (seed {seed}), {} keys are wrong: {:?}",
        resumed + 1,
        problems.len(),
        &problems[..problems.len().min(10)]
    );
}

#[test]
fn sigkill_and_resume_at_parallelism_1_loses_and_repeats_nothing() {
    killed_and_resumed(1);
}

#[test]
fn sigkill_and_resume_at_parallelism_2_loses_and_repeats_nothing() {
    killed_and_resumed(2);
}

#[test]
fn a_second_process_on_the_same_checkpoint_directory_is_refused() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let checkpoints = dir.path().join("checkpoints");
    let mut first = start(&checkpoints, &dir.path().join("out-1"), 1, false);
    // Wait until the first run holds the directory's lock.
    let lock = checkpoints.join("sequence-check").join(".lock");
    let started = Instant::now();
    while !lock.exists() && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let second = start(&checkpoints, &dir.path().join("out-2"), 1, true)
        .wait_with_output()
        .expect("wait for weir");
    let _ = first.kill();
    let _ = first.wait();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success(),
        "the second run started:\n{stderr}"
    );
    assert!(
        stderr.contains("in use") && stderr.contains(&format!("pid {}", first.id())),
        "the refusal names the directory's holder:\n{stderr}"
    );
}
