//! Exactly-once state and output under SIGKILL: `weir run sequence-check` is killed at random
//! moments and resumed with `--resume` several times; at the end every key's state has
//! counted each of its records exactly once — no gap (a record lost), no repeat (one counted
//! twice) — at parallelism 1 and 2, on the heap and on RocksDB, which only holds when barriers
//! align and snapshots are consistent. `weir run sequence-echo`, killed the same way, writes
//! every record through the file sink: the committed part files hold each record once, each
//! key's in order, which only holds when the sink commits exactly what its checkpoints hold.

#[path = "common/parts.rs"]
mod parts;

use parts::read_parts;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use weir_examples::sequence_check::{
    echo_problems, problems, EchoCheck, Echoed, KeyReport, SequenceSpec,
};

/// What the job generates (`weir run sequence-check` has 16 splits).
const KEYS: u32 = 64;
const EVENTS: u64 = 960_000;
/// Records per second per reader: a run takes a few seconds, so kills land mid-way.
const RATE: &str = "120000";

/// What the runs generate (the rate only throttles them).
fn spec() -> SequenceSpec {
    SequenceSpec::of_cli(EVENTS, KEYS, None)
}

fn start(checkpoints: &Path, output: &Path, slots: usize, resume: bool) -> Child {
    start_with(CHECK, "hashmap", &[], checkpoints, output, slots, resume)
}

/// The state check, and the output check.
const CHECK: &str = "sequence-check";
const ECHO: &str = "sequence-echo";

/// [`start`] of `job` with state on `backend`, and more settings (`-D` pairs).
fn start_with(
    job: &str,
    backend: &str,
    settings: &[&str],
    checkpoints: &Path,
    output: &Path,
    slots: usize,
    resume: bool,
) -> Child {
    let mut command = command_on(job, backend, checkpoints, output, slots);
    for setting in settings {
        command.args(["-D", setting]);
    }
    if resume {
        command.arg("--resume");
    }
    spawn(command)
}

/// Starts `command`, its standard error piped.
fn spawn(mut command: Command) -> Child {
    command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start weir")
}

/// The command line of `job` on `backend`, checkpointing into `checkpoints`, writing to
/// `output`, on `slots` shards, with RocksDB's working files beside `checkpoints` (in
/// [`rocksdb_local_dir`]), so that what a killed run leaves goes with the test's directory.
fn command_on(
    job: &str,
    backend: &str,
    checkpoints: &Path,
    output: &Path,
    slots: usize,
) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_weir"));
    command.args([
        "run",
        job,
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
        "-D",
        &format!("state.backend.type={backend}"),
        "-D",
        &format!(
            "state.backend.rocksdb.localdir={}",
            rocksdb_local_dir(checkpoints).display()
        ),
    ]);
    command
}

/// Where the runs checkpointing into `checkpoints` keep RocksDB's working files.
fn rocksdb_local_dir(checkpoints: &Path) -> std::path::PathBuf {
    checkpoints.with_file_name("rocksdb")
}

/// The key reports in an output directory's part files.
fn read_reports(dir: &Path) -> Vec<KeyReport> {
    read_parts(dir)
        .iter()
        .map(|line| KeyReport::parse(line).unwrap_or_else(|| panic!("a bad line: {line}")))
        .collect()
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

fn killed_and_resumed(backend: &str, slots: usize) {
    killed_and_resumed_with(backend, &[], slots);
}

/// The number of the newest checkpoint completed under `checkpoints` (`<job>/chk-<n>`).
fn newest_checkpoint(checkpoints: &Path) -> Option<u64> {
    let jobs = std::fs::read_dir(checkpoints)
        .into_iter()
        .flatten()
        .flatten();
    jobs.flat_map(|job| {
        std::fs::read_dir(job.path())
            .into_iter()
            .flatten()
            .flatten()
    })
    .filter(|chk| chk.path().join("_metadata").exists())
    .filter_map(|chk| chk.file_name().to_str()?.strip_prefix("chk-")?.parse().ok())
    .max()
}

/// [`killed_and_resumed`] with more settings (`-D` pairs): every key reported once, with
/// every record counted once.
fn killed_and_resumed_with(backend: &str, settings: &[&str], slots: usize) {
    let (dir, seed) = killed_and_resumed_to_end(CHECK, backend, settings, slots);
    let reported = read_reports(&dir.path().join("out"));
    let problems = problems(spec(), &reported);
    assert!(
        problems.is_empty(),
        "(seed {seed}) {} keys are wrong: {:?}",
        problems.len(),
        &problems[..problems.len().min(10)]
    );
}

/// Runs `job` on `backend` with `settings`, killed four times at random moments and resumed,
/// then resumed to its end, all writing into one output directory (`out` in the directory
/// returned, with the seed of the kills).
fn killed_and_resumed_to_end(
    job: &str,
    backend: &str,
    settings: &[&str],
    slots: usize,
) -> (tempfile::TempDir, u64) {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_nanos() as u64;
    let mut random = Random(seed);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let checkpoints = dir.path().join("checkpoints");
    let output = dir.path().join("out");
    let mut resumed = 0;
    for attempt in 0..4 {
        let mut child = start_with(
            job,
            backend,
            settings,
            &checkpoints,
            &output,
            slots,
            attempt > 0,
        );
        // Killed at a random moment after the run completed a checkpoint of its own (however
        // long a loaded machine takes to start it), so that the next run resumes from one.
        let before = newest_checkpoint(&checkpoints);
        let started = Instant::now();
        while newest_checkpoint(&checkpoints) <= before
            && started.elapsed() < Duration::from_secs(60)
        {
            if child.try_wait().expect("poll weir").is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let delay = Duration::from_millis(random.next() % 900);
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
    assert_eq!(
        resumed, 3,
        "only {resumed} of the 3 killed runs after the first resumed from a checkpoint (seed {seed})"
    );
    let child = start_with(job, backend, settings, &checkpoints, &output, slots, true);
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
    // Each killed run left its RocksDB working files; the run after it removed them.
    let left: Vec<_> = std::fs::read_dir(rocksdb_local_dir(&checkpoints))
        .into_iter()
        .flatten()
        .map(|entry| entry.expect("an entry").file_name())
        .collect();
    assert!(
        left.is_empty(),
        "RocksDB working files of ended runs are left (seed {seed}): {left:?}"
    );
    (dir, seed)
}

/// The echo job killed and resumed on `backend` with `settings`: what its committed output
/// holds, checked.
fn echo_killed_and_resumed(backend: &str, settings: &[&str], slots: usize) -> EchoCheck {
    let (dir, seed) = killed_and_resumed_to_end(ECHO, backend, settings, slots);
    let records: Vec<Echoed> = read_parts(&dir.path().join("out"))
        .iter()
        .map(|line| Echoed::parse(line).unwrap_or_else(|| panic!("a bad line: {line}")))
        .collect();
    let check = echo_problems(spec(), &records);
    eprintln!("{backend}, {settings:?}, parallelism {slots} (seed {seed}): {check:?}");
    check
}

/// The echo job's output holds every record once, in order, for every combination.
fn echo_exactly_once(backend: &str, settings: &[&str], slots: usize) {
    let check = echo_killed_and_resumed(backend, settings, slots);
    assert!(
        check.is_clean(),
        "{backend}, {settings:?}, parallelism {slots}: {check:?}"
    );
}

#[test]
fn sigkill_and_resume_write_every_record_once_at_parallelism_1() {
    echo_exactly_once("hashmap", &[], 1);
}

#[test]
fn sigkill_and_resume_write_every_record_once_at_parallelism_2() {
    echo_exactly_once("hashmap", &[], 2);
}

#[test]
fn sigkill_and_resume_with_unaligned_checkpoints_write_every_record_once() {
    for slots in [1, 2] {
        echo_exactly_once("hashmap", UNALIGNED, slots);
    }
}

#[test]
fn sigkill_and_resume_on_rocksdb_write_every_record_once() {
    for slots in [1, 2] {
        echo_exactly_once("rocksdb", &[], slots);
    }
}

#[test]
fn sigkill_and_resume_on_rocksdb_with_unaligned_checkpoints_write_every_record_once() {
    for slots in [1, 2] {
        echo_exactly_once("rocksdb", UNALIGNED, slots);
    }
}

/// With `sink.delivery-guarantee=at-least-once` (parts rolling every 16 KiB, committed as they
/// roll) the same check finds records written twice, and none lost: the check catches
/// duplicates.
#[test]
fn at_least_once_output_repeats_records_and_loses_none() {
    let check = echo_killed_and_resumed(
        "hashmap",
        &[
            "sink.delivery-guarantee=at-least-once",
            "sink.rolling-policy.file-size=16kb",
        ],
        2,
    );
    assert!(check.only_duplicates(), "{check:?}");
}

#[test]
fn sigkill_and_resume_at_parallelism_1_loses_and_repeats_nothing() {
    killed_and_resumed("hashmap", 1);
}

#[test]
fn sigkill_and_resume_at_parallelism_2_loses_and_repeats_nothing() {
    killed_and_resumed("hashmap", 2);
}

/// Unaligned checkpoints: what their barriers overtook is replayed once after the kill.
#[test]
fn sigkill_and_resume_with_unaligned_checkpoints_loses_and_repeats_nothing() {
    for slots in [1, 2] {
        killed_and_resumed_with("hashmap", UNALIGNED, slots);
    }
}

#[test]
fn sigkill_and_resume_on_rocksdb_with_unaligned_checkpoints_loses_and_repeats_nothing() {
    killed_and_resumed_with("rocksdb", UNALIGNED, 2);
}

const UNALIGNED: &[&str] = &["execution.checkpointing.unaligned.enabled=true"];

#[test]
fn sigkill_and_resume_on_rocksdb_at_parallelism_1_loses_and_repeats_nothing() {
    killed_and_resumed("rocksdb", 1);
}

#[test]
fn sigkill_and_resume_on_rocksdb_at_parallelism_2_loses_and_repeats_nothing() {
    killed_and_resumed("rocksdb", 2);
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

/// Runs the check at parallelism 2 on `backend` until its second checkpoint completed (or
/// it ended), then kills it. On RocksDB it runs without the write-back cache (which would
/// hold this small state whole, so that checkpoints list it as held writes) and on until both
/// subtasks' newest completed checkpoint lists an SST file: the first checkpoints hold the
/// state in RocksDB's logs, and the memtables flushed after a cut show as SST files from a
/// later checkpoint on.
fn killed_after_checkpoints(backend: &str, checkpoints: &Path, output: &Path) {
    let job = checkpoints.join("sequence-check");
    let settings: &[&str] = if backend == "rocksdb" {
        &["state.backend.rocksdb.memory.write-back-ratio=0"]
    } else {
        &[]
    };
    let mut child = start_with(CHECK, backend, settings, checkpoints, output, 2, false);
    let started = Instant::now();
    // The newest completed checkpoint's number.
    let newest = || {
        std::fs::read_dir(&job)
            .ok()?
            .filter_map(Result::ok)
            .filter(|e| e.path().join("_metadata").exists())
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("chk-")?.parse().ok())
            .max()
    };
    // Shared files are named `<checkpoint>-<operator>-<subtask>-<RocksDB's name>`; one that a
    // completed checkpoint uploaded stays listed (compacted, by the file it was compacted into).
    let sst_uploaded = |subtask: &str, by: u64| {
        std::fs::read_dir(job.join("shared"))
            .ok()
            .is_some_and(|entries| {
                entries.filter_map(Result::ok).any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let parts: Vec<&str> = name.splitn(4, '-').collect();
                    matches!(parts.as_slice(), [number, _, s, file]
                    if *s == subtask
                        && file.ends_with(".sst")
                        && number.parse::<u64>().is_ok_and(|n| n <= by))
                })
            })
    };
    let completed = || {
        newest().is_some_and(|n: u64| {
            n >= 2 && (backend != "rocksdb" || (sst_uploaded("0", n) && sst_uploaded("1", n)))
        })
    };
    while !completed() && child.try_wait().expect("poll weir").is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no checkpoint completed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        completed(),
        "the job ended before the checkpoints it waited for"
    );
}

/// `weir checkpoint inspect` of `job`'s checkpoints, as text or JSON.
fn inspect(job: &Path, json: bool) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_weir"));
    command.args(["checkpoint", "inspect", job.to_str().expect("a UTF-8 path")]);
    if json {
        command.arg("--json");
    }
    command.output().expect("run weir checkpoint inspect")
}

/// `weir checkpoint inspect` on a killed run's checkpoints: the operators, the keyed state with
/// its type and key groups, the readers' split positions, every checksum verified; a flipped
/// byte is found and named.
#[test]
fn inspect_shows_what_a_checkpoint_holds_and_finds_damage() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let checkpoints = dir.path().join("checkpoints");
    let job = checkpoints.join("sequence-check");
    killed_after_checkpoints("hashmap", &checkpoints, &dir.path().join("out"));
    let text = inspect(&job, false);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&text.stderr)
    );
    for expected in [
        "of job 'sequence-check'",
        ", state backend hashmap)",
        "operator 'check sequence' (uid 'check-sequence', id ",
        "'sequence' ValueState<",
        "SequenceState>",
        "key groups 0..=63 of 128",
        "key groups 64..=127 of 128",
        "SequenceSplit { split:",
        "every checksum holds",
    ] {
        assert!(stdout.contains(expected), "'{expected}' in:\n{stdout}");
    }
    let json = inspect(&job, true);
    let report: serde_json::Value =
        serde_json::from_slice(&json.stdout).expect("inspect --json prints JSON");
    let operators = report["operators"].as_array().expect("operators");
    let check = operators
        .iter()
        .find(|o| o["name"] == "check sequence")
        .expect("the keyed operator");
    assert_eq!(check["parallelism"], 2);
    assert_eq!(check["subtasks"].as_array().map(Vec::len), Some(2));
    assert_eq!(report["problems"].as_array().map(Vec::len), Some(0));

    // Damage one state file of the newest checkpoint.
    let newest = std::path::PathBuf::from(report["path"].as_str().expect("a path"));
    let file = std::fs::read_dir(&newest)
        .expect("the checkpoint")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("task-"))
        })
        .expect("a task state file");
    let mut bytes = std::fs::read(&file).expect("the state file");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    std::fs::write(&file, bytes).expect("write it back");
    let damaged = inspect(&job, false);
    let stderr = String::from_utf8_lossy(&damaged.stderr);
    assert!(!damaged.status.success(), "damage went unseen");
    assert!(
        stderr.contains(file.file_name().and_then(|n| n.to_str()).expect("a name"))
            && stderr.contains("CRC-32"),
        "the error names the file and the checksum:\n{stderr}"
    );
}

/// On RocksDB a checkpoint is the instances' files, most of them shared with earlier
/// checkpoints: inspect shows them, checks the shared ones too, and names a damaged one; a
/// resume from such a checkpoint is refused on the heap backend, naming both backends.
#[test]
fn inspect_checks_the_shared_files_of_rocksdb_checkpoints() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let checkpoints = dir.path().join("checkpoints");
    let job = checkpoints.join("sequence-check");
    killed_after_checkpoints("rocksdb", &checkpoints, &dir.path().join("out"));
    let json = inspect(&job, true);
    let report: serde_json::Value =
        serde_json::from_slice(&json.stdout).expect("inspect --json prints JSON");
    assert_eq!(
        report["problems"].as_array().map(Vec::len),
        Some(0),
        "{report}"
    );
    assert_eq!(report["state_backend"], "rocksdb", "{report}");
    let check = report["operators"]
        .as_array()
        .expect("operators")
        .iter()
        .find(|o| o["name"] == "check sequence")
        .expect("the keyed operator");
    for subtask in check["subtasks"].as_array().expect("subtasks") {
        let rocksdb = subtask["parts"]
            .as_array()
            .expect("parts")
            .iter()
            .find(|part| part["name"] == "rocksdb")
            .unwrap_or_else(|| panic!("a rocksdb part in {subtask}"));
        assert!(
            rocksdb["content"]["rocks_db"]["sst_files"].as_u64() > Some(0),
            "{rocksdb}"
        );
    }
    let text = String::from_utf8_lossy(&inspect(&job, false).stdout).to_string();
    assert!(
        text.contains("RocksDB checkpoint of") && text.contains("every checksum holds"),
        "{text}"
    );

    let resumed_on_heap = start(&checkpoints, &dir.path().join("out-heap"), 2, true)
        .wait_with_output()
        .expect("wait for weir");
    let stderr = String::from_utf8_lossy(&resumed_on_heap.stderr);
    assert!(
        !resumed_on_heap.status.success(),
        "resumed on the heap:\n{stderr}"
    );
    assert!(
        stderr.contains("state.backend.type") && stderr.contains("rocksdb"),
        "the refusal names the backend to use:\n{stderr}"
    );

    // Damage a shared SST file the newest checkpoint lists.
    let shared = std::fs::read_dir(job.join("shared"))
        .expect("shared files")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "sst"))
        .expect("a shared SST file");
    let mut bytes = std::fs::read(&shared).expect("the SST file");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    std::fs::write(&shared, bytes).expect("write it back");
    let damaged = inspect(&job, false);
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&damaged.stdout),
        String::from_utf8_lossy(&damaged.stderr)
    );
    assert!(
        output.contains(shared.file_name().and_then(|n| n.to_str()).expect("a name"))
            && output.contains("CRC-32"),
        "the damaged shared file is named:\n{output}"
    );
}

/// Waits until job `job`'s directory holds a completed checkpoint (or `child` ended).
fn wait_for_a_checkpoint(job: &Path, child: &mut Child) {
    let started = Instant::now();
    let completed = || {
        std::fs::read_dir(job).ok().is_some_and(|entries| {
            entries
                .filter_map(Result::ok)
                .any(|e| e.path().join("_metadata").exists())
        })
    };
    while !completed() && child.try_wait().expect("poll weir").is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no checkpoint completed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGTERM on `weir run` with checkpointing stops the job with a savepoint and prints the
/// command that resumes it; run so, every key has counted each of its records once.
/// Waits for a checkpoint of `job` (its checkpoint directory), sends `child` SIGTERM, and
/// returns the savepoint it stopped with, and its standard error.
fn stopped_with_savepoint(mut child: Child, job: &Path) -> (std::path::PathBuf, String) {
    wait_for_a_checkpoint(job, &mut child);
    // SAFETY: kill() sends a signal to the process this test started, by its pid.
    let sent = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(sent, 0, "SIGTERM sent");
    let result = child.wait_with_output().expect("wait for weir");
    let stderr = String::from_utf8_lossy(&result.stderr).into_owned();
    assert!(result.status.success(), "the stopped run failed:\n{stderr}");
    let savepoint = stderr
        .lines()
        .find_map(|line| {
            line.split_once("stopped with savepoint ")?
                .1
                .split_once(" after ")
        })
        .map(|(path, _)| std::path::PathBuf::from(path))
        .unwrap_or_else(|| panic!("no savepoint named in:\n{stderr}"));
    (savepoint, stderr)
}

#[test]
fn sigterm_stops_with_a_savepoint_and_the_printed_command_resumes_it() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let checkpoints = dir.path().join("checkpoints");
    let child = start(&checkpoints, &dir.path().join("out-1"), 2, false);
    let (savepoint, stderr) = stopped_with_savepoint(child, &checkpoints.join(CHECK));
    assert!(
        stderr.contains(&format!("--from-savepoint {}", savepoint.display())),
        "the resume command is printed:\n{stderr}"
    );
    let inspected = inspect(&savepoint, false);
    let stdout = String::from_utf8_lossy(&inspected.stdout);
    assert!(
        inspected.status.success() && stdout.contains("every checksum holds"),
        "weir checkpoint inspect of the savepoint:\n{stdout}"
    );

    let output = dir.path().join("out-final");
    let mut command = command_on(CHECK, "hashmap", &checkpoints, &output, 1);
    command.arg("--from-savepoint").arg(&savepoint);
    let result = spawn(command).wait_with_output().expect("wait for weir");
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "the resumed run failed:\n{stderr}");
    assert!(stderr.contains("starts from savepoint"), "{stderr}");
    let problems = problems(spec(), &read_reports(&output));
    assert!(
        problems.is_empty(),
        "{:?}",
        &problems[..problems.len().min(10)]
    );
}

/// The echo job stopped by SIGTERM commits what its savepoint holds (nothing is left hidden,
/// nothing written twice or out of order); started from the savepoint into the same output
/// directory, it writes the rest: every record once.
#[test]
fn a_job_stopped_with_a_savepoint_commits_its_output_and_resumes_it() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let checkpoints = dir.path().join("checkpoints");
    let output = dir.path().join("out");
    let child = start_with(ECHO, "hashmap", &[], &checkpoints, &output, 2, false);
    let (savepoint, _) = stopped_with_savepoint(child, &checkpoints.join(ECHO));
    let echoed = |output: &Path| -> Vec<Echoed> {
        read_parts(output)
            .iter()
            .map(|line| Echoed::parse(line).unwrap_or_else(|| panic!("a bad line: {line}")))
            .collect()
    };
    let stopped = echoed(&output);
    let check = echo_problems(spec(), &stopped);
    assert!(
        !stopped.is_empty() && check.lost > 0,
        "the stopped run committed {} records: {check:?}",
        stopped.len()
    );
    assert_eq!(
        EchoCheck {
            lost: 0,
            ..check.clone()
        },
        EchoCheck::default(),
        "{check:?}"
    );

    let mut command = command_on(ECHO, "hashmap", &checkpoints, &output, 2);
    command.arg("--from-savepoint").arg(&savepoint);
    let result = spawn(command).wait_with_output().expect("wait for weir");
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "the resumed run failed:\n{stderr}");
    let check = echo_problems(spec(), &echoed(&output));
    assert!(check.is_clean(), "{check:?}");
}

/// A savepoint written by an earlier build, committed as a golden fixture: `weir run
/// sequence-check` with 16 keys and 32 000 records at parallelism 1, stopped by SIGTERM after
/// its source read 3 001 records. This build must restore it — at parallelism 1 and 2, read
/// exactly the records after it, and count every record once — so a format change is never
/// silent.
#[test]
fn a_committed_savepoint_restores_in_this_build() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
        .join("savepoint-sequence-check-v1");
    let spec = SequenceSpec {
        splits: 16,
        keys_per_split: 1,
        per_key: 2_000,
        rate: None,
    };
    let inspected = inspect(&fixture, false);
    assert!(
        inspected.status.success(),
        "{}",
        String::from_utf8_lossy(&inspected.stderr)
    );
    for slots in [1, 2] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let output = dir.path().join("out");
        let result = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args([
                "run",
                "sequence-check",
                "--quiet",
                "--events",
                "32000",
                "--keys",
                "16",
            ])
            .arg("--output")
            .arg(&output)
            .arg("-D")
            .arg(format!("taskmanager.numberOfTaskSlots={slots}"))
            .arg("--from-savepoint")
            .arg(&fixture)
            .output()
            .expect("run weir");
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(result.status.success(), "slots {slots}:\n{stderr}");
        let read = stderr
            .lines()
            .find_map(|line| line.trim().strip_prefix("Source: sequence"))
            .and_then(|counts| counts.split_whitespace().nth(3))
            .unwrap_or_else(|| panic!("no source counts in:\n{stderr}"));
        assert_eq!(
            read, "28999",
            "slots {slots}: the records after the savepoint"
        );
        let problems = problems(spec, &read_reports(&output));
        assert!(problems.is_empty(), "slots {slots}: {problems:?}");
    }
}
