//! Weir under systemd: the units `weir tune systemd` renders pass `systemd-analyze verify`,
//! and the control plane and a worker started under a notify socket (as `Type=notify` starts
//! them) say READY=1, ping the watchdog, and stop cleanly on SIGTERM, saying STOPPING=1.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "common/process.rs"]
mod process;

use process::Process;

const WEIR: &str = env!("CARGO_BIN_EXE_weir");

#[test]
fn rendered_units_pass_systemd_analyze_verify() {
    let dir = tempfile::tempdir().unwrap();
    for role in ["control", "worker", "tune"] {
        let output = Command::new(WEIR)
            .args([
                "tune",
                "systemd",
                "--role",
                role,
                "--binary",
                WEIR,
                "--watchdog-sec",
                "30",
                "--cpu-affinity",
                "0-1",
            ])
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let unit = String::from_utf8(output.stdout).unwrap();
        std::fs::write(dir.path().join(format!("weir-{role}.service")), &unit).unwrap();
        match role {
            "tune" => assert!(
                unit.contains("Type=oneshot") && unit.contains("Before=weir-worker.service"),
                "{unit}"
            ),
            _ => {
                for line in [
                    "Type=notify",
                    "WatchdogSec=30",
                    "LimitNOFILE=1048576",
                    "Restart=on-abnormal",
                    "OOMScoreAdjust=-500",
                    "User=weir",
                ] {
                    assert!(unit.contains(line), "{role}: no {line}:\n{unit}");
                }
            }
        }
        if role == "worker" {
            for line in [
                "LimitMEMLOCK=infinity",
                "KillMode=mixed",
                "TimeoutStopSec=60",
                "CPUAffinity=0-1",
                "After=network-online.target weir-tune.service",
            ] {
                assert!(unit.contains(line), "worker: no {line}:\n{unit}");
            }
        }
    }
    let units: Vec<String> = ["control", "worker", "tune"]
        .iter()
        .map(|role| {
            dir.path()
                .join(format!("weir-{role}.service"))
                .display()
                .to_string()
        })
        .collect();
    let verified = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .output()
        .expect("systemd-analyze (Debian's systemd package; .ci/run installs it)");
    assert!(
        verified.status.success(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&verified.stderr)
    );
    let stderr = String::from_utf8_lossy(&verified.stderr);
    assert!(
        !stderr.contains("weir-"),
        "systemd-analyze found problems in the units:\n{stderr}"
    );
}

/// A notify socket, as systemd makes one for a `Type=notify` service.
struct NotifySocket {
    socket: UnixDatagram,
    path: std::path::PathBuf,
}

impl NotifySocket {
    fn new(dir: &Path, name: &str) -> NotifySocket {
        let path = dir.join(name);
        let socket = UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        NotifySocket { socket, path }
    }

    /// Waits for pings of the watchdog, and checks that they come more often than its 1 s
    /// interval (at half of it).
    fn watchdog_pings(&self) {
        // What came while the test waited is not timed: drain it, then time from one ping
        // received now to the next.
        self.socket.set_nonblocking(true).unwrap();
        let mut buffer = [0u8; 4096];
        while self.socket.recv(&mut buffer).is_ok() {}
        self.socket.set_nonblocking(false).unwrap();
        self.wait_for("WATCHDOG=1", Duration::from_secs(5));
        let mut gaps: Vec<Duration> = (0..3)
            .map(|_| {
                let since = Instant::now();
                self.wait_for("WATCHDOG=1", Duration::from_secs(5));
                since.elapsed()
            })
            .collect();
        gaps.sort();
        // A loaded machine delays some, but the median is half the interval.
        assert!(
            gaps[1] < Duration::from_millis(900),
            "pings {gaps:?} apart, against a 1 s watchdog"
        );
    }

    /// Waits for a datagram holding `line`, for `limit` at most; returns every line seen.
    fn wait_for(&self, line: &str, limit: Duration) -> Vec<String> {
        let started = Instant::now();
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4096];
        while started.elapsed() < limit {
            if let Ok(n) = self.socket.recv(&mut buffer) {
                let text = String::from_utf8_lossy(&buffer[..n]).into_owned();
                let found = text.lines().any(|l| l == line);
                seen.extend(text.lines().map(str::to_string));
                if found {
                    return seen;
                }
            }
        }
        panic!("no '{line}' within {limit:?}; saw {seen:?}");
    }
}

/// Starts `weir ARGS` as systemd would under `socket`, with a 1 s watchdog; returns the
/// process and the word after `marker` in its log.
fn start_notified(args: &[&str], socket: &NotifySocket, marker: &str) -> (Process, String) {
    let mut child = Command::new(WEIR)
        .args(args)
        .env("NOTIFY_SOCKET", &socket.path)
        .env("WATCHDOG_USEC", "1000000")
        .env("WEIR_LOG_FORMAT", "text")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let word = process::word_after(&mut child, marker);
    (Process(child), word)
}

#[test]
fn control_plane_and_worker_tell_systemd_ready_ping_its_watchdog_and_stop_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let control_socket = NotifySocket::new(dir.path(), "control.sock");
    let data = format!("control.data-dir={}", dir.path().join("control").display());
    let (mut control, address) = start_notified(
        &[
            "control",
            "-D",
            &data,
            "-D",
            "rest.address=127.0.0.1",
            "-D",
            "rest.port=0",
        ],
        &control_socket,
        "REST API on http://",
    );
    control_socket.wait_for("READY=1", Duration::from_secs(10));
    control_socket.watchdog_pings();

    let worker_socket = NotifySocket::new(dir.path(), "worker.sock");
    let worker_data = format!("worker.data-dir={}", dir.path().join("worker").display());
    let (mut worker, _) = start_notified(
        &[
            "worker",
            "--control",
            &address,
            "-D",
            &worker_data,
            "-D",
            "taskmanager.cpu.cores=0",
            "-D",
            "metrics.reporter.prom.host=127.0.0.1",
            "-D",
            "metrics.reporter.prom.port=0",
        ],
        &worker_socket,
        "registered with",
    );
    let seen = worker_socket.wait_for("READY=1", Duration::from_secs(10));
    assert!(
        seen.iter().any(|l| l.starts_with("STATUS=")),
        "the worker says what it does: {seen:?}"
    );
    worker_socket.watchdog_pings();
    worker.terminate(Duration::from_secs(40));
    worker_socket.wait_for("STOPPING=1", Duration::from_secs(5));
    control.terminate(Duration::from_secs(10));
    control_socket.wait_for("STOPPING=1", Duration::from_secs(5));
}
