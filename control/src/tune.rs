//! `weir tune`: check and tune this host for a worker (`weir_tuning`), and a worker's memory
//! budgets per slot.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use weir_tuning::{systemd, Checked, Fix, Host, Tuner};

use crate::ConfigArgs;

#[derive(Subcommand)]
pub(crate) enum TuneCommand {
    /// Every tuner: what it looks at, and whether it can run on this host.
    List {
        #[command(flatten)]
        host: HostArgs,
    },
    /// Check the host; exits 1 when something that costs throughput or latency is off,
    /// saying what and how to make it right.
    Check {
        #[command(flatten)]
        host: HostArgs,
    },
    /// Make right what a write under /proc or /sys does (as root; until the next boot), and
    /// say what is left for an operator; exits 1 when a write failed.
    Apply {
        #[command(flatten)]
        host: HostArgs,
    },
    /// Print the shell commands `apply` would run (what is left for an operator, as
    /// comments).
    Script {
        #[command(flatten)]
        host: HostArgs,
    },
    /// Print a systemd unit: the control plane's or a worker's (Type=notify, restarts,
    /// limits, an optional watchdog), or the oneshot `weir tune apply` ordered before the
    /// worker.
    Systemd {
        /// Which unit: control, worker or tune.
        #[arg(long, value_parser = ["control", "worker", "tune"])]
        role: String,
        /// The weir binary [default: /usr/bin/weir].
        #[arg(long)]
        binary: Option<PathBuf>,
        /// The configuration file the processes read [default: /etc/weir/weir.toml].
        #[arg(long)]
        config: Option<PathBuf>,
        /// An environment file of WEIR_<KEY> settings, read if present [default:
        /// /etc/default/weir].
        #[arg(long)]
        environment_file: Option<PathBuf>,
        /// The user the control plane and the worker run as [default: weir].
        #[arg(long)]
        user: Option<String>,
        /// The control plane a worker registers with [default: localhost:8081].
        #[arg(long, value_name = "HOST:PORT")]
        control: Option<String>,
        /// The cores the worker may run on (CPUAffinity=), e.g. 0-15.
        #[arg(long)]
        cpu_affinity: Option<String>,
        /// WatchdogSec=: the process pings systemd at half of it.
        #[arg(long)]
        watchdog_sec: Option<u64>,
    },
    /// Make the cluster's certificates for mutual TLS: a cluster CA (made once, in DIR; kept
    /// and reused when it is there) and a certificate and key per node, which every member
    /// presents and whose CA it requires of its peers.
    Certs {
        /// Where the certificates go: ca.pem, ca-key.pem (keep it off the cluster), and
        /// NAME.pem and NAME-key.pem per node.
        #[arg(long)]
        dir: PathBuf,
        /// A node: the name its peers dial it by, then any further host names or IP
        /// addresses they may use, e.g. worker-1=10.0.0.11,worker-1.example (repeatable).
        #[arg(long = "node", value_name = "NAME[=ALSO,...]", required = true)]
        nodes: Vec<String>,
        /// The cluster CA's name, for a new CA.
        #[arg(long, default_value = "weir cluster CA")]
        cluster: String,
    },
    /// A worker's memory per slot (managed: RocksDB's block cache and write buffers; network
    /// segments; heap), computed by the code the worker runs, naming the key behind each.
    Memory {
        /// The worker's process size (`taskmanager.memory.process.size`), e.g. 64g.
        #[arg(long, value_name = "SIZE")]
        process_size: Option<String>,
        /// Its slots (`taskmanager.numberOfTaskSlots`); default: every available core.
        #[arg(long)]
        slots: Option<usize>,
        #[command(flatten)]
        config: ConfigArgs,
    },
}

#[derive(Args)]
pub(crate) struct HostArgs {
    /// The directory the host's /proc and /sys are under (a copy of them, to try).
    #[arg(long, default_value = "/")]
    root: PathBuf,
    /// Only this tuner (repeatable); default: every one (`weir tune list`).
    #[arg(long = "tuner", value_name = "NAME")]
    tuners: Vec<String>,
    /// The worker's configuration: its shard cores (`taskmanager.cpu.cores`) and the
    /// directories its state and checkpoints go to.
    #[command(flatten)]
    config: ConfigArgs,
}

impl HostArgs {
    /// The host, and the tuners asked for.
    fn load(&self) -> anyhow::Result<(Host, Vec<Box<dyn Tuner>>)> {
        let config = self.config.load()?;
        let mut dirs = vec![config.rocksdb_local_dir(), config.worker_data_dir()];
        if let Some(checkpoints) = config.checkpointing()? {
            dirs.push(checkpoints.dir);
        }
        // One not made yet (before the worker's first start) is on its parent's disk.
        let dirs = dirs
            .into_iter()
            .filter_map(|dir| dir.ancestors().find(|d| d.exists()).map(PathBuf::from))
            .collect();
        let host = Host::new(&self.root, config.cores(), dirs);
        let mut tuners = weir_tuning::all();
        if !self.tuners.is_empty() {
            for name in &self.tuners {
                if !tuners.iter().any(|t| t.name() == name) {
                    let names: Vec<&str> = tuners.iter().map(|t| t.name()).collect();
                    anyhow::bail!("no tuner '{name}'; the tuners: {}", names.join(", "));
                }
            }
            tuners.retain(|t| self.tuners.iter().any(|name| name == t.name()));
        }
        Ok((host, tuners))
    }
}

/// Runs a `weir tune` command: its exit code.
pub(crate) fn run(command: &TuneCommand) -> ExitCode {
    match run_command(command) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run_command(command: &TuneCommand) -> anyhow::Result<ExitCode> {
    match command {
        TuneCommand::List { host } => {
            let (host, tuners) = host.load()?;
            for tuner in tuners {
                let here = match tuner.unsupported(&host) {
                    Some(why) => format!("cannot run here: {why}"),
                    None => "runs here".into(),
                };
                println!("{}  ({here})\n    {}", tuner.name(), tuner.about());
            }
            Ok(ExitCode::SUCCESS)
        }
        TuneCommand::Check { host } => {
            let (host, tuners) = host.load()?;
            let mut off = 0;
            for tuner in tuners {
                match weir_tuning::check(tuner.as_ref(), &host) {
                    Checked::Unsupported(why) => println!("{}: skipped: {why}", tuner.name()),
                    Checked::Findings(found) if found.is_empty() => {
                        println!("{}: ok", tuner.name())
                    }
                    Checked::Findings(found) => {
                        for finding in found {
                            off += 1;
                            let fix = match finding.fix {
                                Fix::Write { path, value } => format!(
                                    "{} (weir tune apply does it)",
                                    weir_tuning::echo(&host, &path, &value)
                                ),
                                Fix::Manual(what) => what,
                            };
                            println!("{}: {}\n    fix: {fix}", tuner.name(), finding.problem);
                        }
                    }
                }
            }
            Ok(if off == 0 {
                ExitCode::SUCCESS
            } else {
                println!("{off} thing(s) off");
                ExitCode::FAILURE
            })
        }
        TuneCommand::Apply { host } => {
            let (host, tuners) = host.load()?;
            let mut failed = false;
            for tuner in tuners {
                let applied = weir_tuning::apply(tuner.as_ref(), &host);
                for (path, value) in &applied.written {
                    println!("{}: wrote {value} to {}", tuner.name(), host.shown(path));
                }
                for what in &applied.manual {
                    println!("{}: left for you: {what}", tuner.name());
                }
                for (path, why) in &applied.failed {
                    failed = true;
                    println!(
                        "{}: could not write {}: {why} (run as root)",
                        tuner.name(),
                        host.shown(path)
                    );
                }
            }
            Ok(if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        TuneCommand::Script { host } => {
            let (host, tuners) = host.load()?;
            println!("#!/bin/sh\n# weir tune script: what weir tune apply would do\nset -e");
            for tuner in tuners {
                for line in weir_tuning::script(tuner.as_ref(), &host) {
                    println!("{line}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        TuneCommand::Systemd {
            role,
            binary,
            config,
            environment_file,
            user,
            control,
            cpu_affinity,
            watchdog_sec,
        } => {
            let role = systemd::Role::named(role).expect("clap checks the role");
            let defaults = systemd::UnitOptions::default();
            let options = systemd::UnitOptions {
                binary: binary.clone().unwrap_or(defaults.binary),
                config: config.clone().unwrap_or(defaults.config),
                environment_file: environment_file
                    .clone()
                    .unwrap_or(defaults.environment_file),
                user: user.clone().unwrap_or(defaults.user),
                control: control.clone().unwrap_or(defaults.control),
                cpu_affinity: cpu_affinity.clone(),
                watchdog_sec: *watchdog_sec,
            };
            print!("{}", systemd::render(role, &options));
            Ok(ExitCode::SUCCESS)
        }
        TuneCommand::Certs {
            dir,
            nodes,
            cluster,
        } => {
            certs(dir, nodes, cluster)?;
            Ok(ExitCode::SUCCESS)
        }
        TuneCommand::Memory {
            process_size,
            slots,
            config,
        } => {
            let mut config = config.load()?;
            if let Some(size) = process_size {
                config = config.with("taskmanager.memory.process.size", size.as_str())?;
            }
            if let Some(slots) = slots {
                config = config.with("taskmanager.numberOfTaskSlots", slots.to_string())?;
            }
            print!("{}", crate::memory_budget(&config)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `weir tune certs`: the cluster CA in `dir` (made when absent) and a certificate per node.
fn certs(dir: &std::path::Path, nodes: &[String], cluster: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    use weir_net::tls::ClusterCa;

    // Every node first: a bad one is refused before anything is written.
    let mut issue = Vec::new();
    for node in nodes {
        let (name, also) = node.split_once('=').unwrap_or((node, ""));
        let valid = |n: &str| {
            !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':'))
        };
        let also: Vec<String> = also
            .split(',')
            .filter(|a| !a.is_empty())
            .map(String::from)
            .collect();
        if !valid(name) || name.starts_with('.') || !also.iter().all(|a| valid(a)) {
            anyhow::bail!(
                "--node {node}: a node is NAME[=ALSO,...], each a host name or an IP address \
                 (letters, digits, '-', '.', ':'), e.g. worker-1=10.0.0.11"
            );
        }
        for file in [format!("{name}.pem"), format!("{name}-key.pem")] {
            let path = dir.join(&file);
            if path.exists() {
                anyhow::bail!(
                    "{} exists: node {name} has a certificate; remove {name}.pem and \
                     {name}-key.pem first to issue a new one",
                    path.display()
                );
            }
        }
        issue.push((name.to_string(), also));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let write = |file: &str, text: &str, mode: u32| -> anyhow::Result<()> {
        let path = dir.join(file);
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        std::io::Write::write_all(&mut out, text.as_bytes())
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("wrote {}", path.display());
        Ok(())
    };
    let (ca_path, key_path) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
    let ca = if ca_path.exists() || key_path.exists() {
        let read = |path: &std::path::Path| {
            std::fs::read_to_string(path).with_context(|| {
                format!(
                    "cannot read {}: the cluster CA is ca.pem and ca-key.pem together",
                    path.display()
                )
            })
        };
        let ca = ClusterCa::from_pem(
            &read(&ca_path)?,
            &read(&key_path)?,
            &format!("{} and {}", ca_path.display(), key_path.display()),
        )?;
        println!("issuing with the cluster CA in {}", ca_path.display());
        ca
    } else {
        let ca = ClusterCa::generate(cluster)?;
        write("ca.pem", ca.cert_pem(), 0o644)?;
        write("ca-key.pem", ca.key_pem(), 0o600)?;
        ca
    };
    for (name, also) in issue {
        let node = ca.issue(&name, &also)?;
        write(&format!("{name}.pem"), &node.cert_pem, 0o644)?;
        write(&format!("{name}-key.pem"), &node.key_pem, 0o600)?;
    }
    Ok(())
}
