//! systemd units for a Weir host (`weir tune systemd`): the control plane, a worker, and a
//! oneshot `weir tune apply` ordered before the worker.

use std::fmt::Write;
use std::path::PathBuf;

/// Which unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `weir-control.service`: the control plane.
    Control,
    /// `weir-worker.service`: a worker.
    Worker,
    /// `weir-tune.service`: `weir tune apply` at boot, before the worker.
    Tune,
}

impl Role {
    /// Every role, by its name.
    pub const NAMES: [(&'static str, Role); 3] = [
        ("control", Role::Control),
        ("worker", Role::Worker),
        ("tune", Role::Tune),
    ];

    /// Its name (`--role`).
    pub fn name(self) -> &'static str {
        match self {
            Role::Control => "control",
            Role::Worker => "worker",
            Role::Tune => "tune",
        }
    }

    /// The role named `name`.
    pub fn named(name: &str) -> Option<Role> {
        Role::NAMES
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, role)| role)
    }

    /// The unit's file name.
    pub fn unit_name(self) -> &'static str {
        match self {
            Role::Control => "weir-control.service",
            Role::Worker => "weir-worker.service",
            Role::Tune => "weir-tune.service",
        }
    }
}

/// What the units run, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitOptions {
    /// The `weir` binary.
    pub binary: PathBuf,
    /// The configuration file every process reads (`-c`).
    pub config: PathBuf,
    /// An environment file (`WEIR_<KEY>` settings), read if present.
    pub environment_file: PathBuf,
    /// The user the control plane and the worker run as (the tuner runs as root).
    pub user: String,
    /// The control plane a worker registers with.
    pub control: String,
    /// The cores the worker may run on (`CPUAffinity=`), if limited.
    pub cpu_affinity: Option<String>,
    /// `WatchdogSec=`: the processes ping systemd at half of it; none when `None`.
    pub watchdog_sec: Option<u64>,
}

impl Default for UnitOptions {
    fn default() -> UnitOptions {
        UnitOptions {
            binary: "/usr/bin/weir".into(),
            config: "/etc/weir/weir.toml".into(),
            environment_file: "/etc/default/weir".into(),
            user: "weir".into(),
            control: "localhost:8081".into(),
            cpu_affinity: None,
            watchdog_sec: None,
        }
    }
}

/// How long a worker's stop may take before it says more: one that runs jobs extends it by
/// `worker.shutdown.timeout` and the time to cancel (`EXTEND_TIMEOUT_USEC`) as it hands them
/// to the control plane; one without a control plane cancels its executors and kills those
/// still running after 30 s.
const WORKER_STOP_SEC: u64 = 60;

/// The unit file of `role`.
pub fn render(role: Role, options: &UnitOptions) -> String {
    let binary = options.binary.display();
    let config = options.config.display();
    let mut unit = format!(
        "# {}, rendered by `weir tune systemd --role {}`\n",
        role.unit_name(),
        role.name()
    );
    let (description, after, exec) = match role {
        Role::Control => (
            "Weir control plane: REST API, the workers' registry, one job master per job",
            "network-online.target",
            format!("{binary} control -c {config}"),
        ),
        Role::Worker => (
            "Weir worker: runs its jobs' subtasks in executors pinned to this host's cores",
            "network-online.target weir-tune.service",
            format!("{binary} worker --control {} -c {config}", options.control),
        ),
        // After the network cards' queues exist, and after irqbalance placed them.
        Role::Tune => (
            "Weir host tuning (weir tune apply) before the worker starts",
            "network-online.target irqbalance.service",
            format!("{binary} tune apply -c {config}"),
        ),
    };
    let _ = writeln!(unit, "[Unit]\nDescription={description}");
    let _ = writeln!(unit, "After={after}");
    match role {
        Role::Tune => {
            let _ = writeln!(
                unit,
                "Wants=network-online.target\nBefore=weir-worker.service"
            );
        }
        Role::Control | Role::Worker => {
            let _ = writeln!(unit, "Wants={after}");
        }
    }
    let _ = writeln!(unit, "\n[Service]");
    let _ = writeln!(
        unit,
        "EnvironmentFile=-{}\nExecStart={exec}",
        options.environment_file.display()
    );
    match role {
        Role::Tune => {
            let _ = writeln!(unit, "Type=oneshot\nRemainAfterExit=yes");
        }
        Role::Control | Role::Worker => {
            let _ = writeln!(
                unit,
                "Type=notify\nNotifyAccess=main\nUser={user}\nGroup={user}\n\
                 StateDirectory=weir\nRestart=on-abnormal\nRestartSec=5s\nLimitNOFILE=1048576\n\
                 OOMScoreAdjust=-500",
                user = options.user
            );
            if let Some(seconds) = options.watchdog_sec {
                let _ = writeln!(unit, "WatchdogSec={seconds}");
            }
        }
    }
    if role == Role::Worker {
        // SIGTERM goes to the worker alone, which stops its executors itself; whatever is
        // left when the stop times out is killed.
        let _ = writeln!(
            unit,
            "KillMode=mixed\nTimeoutStopSec={WORKER_STOP_SEC}\nLimitMEMLOCK=infinity"
        );
        if let Some(cores) = &options.cpu_affinity {
            let _ = writeln!(unit, "CPUAffinity={cores}");
        }
    }
    let _ = writeln!(unit, "\n[Install]\nWantedBy=multi-user.target");
    unit
}
