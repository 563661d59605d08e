//! Host checks and tuners (`weir tune`), as `rpk redpanda tune` and ScyllaDB's perftune do
//! for theirs: each [`Tuner`] checks one thing about the host that costs a worker throughput
//! or latency when it is off, says how to make it right, and makes it right where writing a
//! file under `/proc` or `/sys` does; what needs a reboot or a service's limits is said, for
//! an operator to do.
//!
//! [`systemd`] renders the units a host runs Weir under.
//!
//! Every tuner reads and writes through a [`Host`]: the files under a root directory, `/` on
//! a real server and a fake `/proc` + `/sys` tree in tests, which never change the machine
//! they run on.
#![warn(missing_docs)]

mod host;
pub mod systemd;
mod tuners;

pub use host::{format_cpu_list, parse_cpu_list, Host};
pub use tuners::{all, Finding, Fix, Tuner};

/// What a check of one tuner found.
#[derive(Debug)]
pub enum Checked {
    /// It cannot run on this host, saying why (a VM without cpufreq, say).
    Unsupported(String),
    /// What is off; empty when nothing is.
    Findings(Vec<Finding>),
}

/// Checks `tuner` on `host`.
pub fn check(tuner: &dyn Tuner, host: &Host) -> Checked {
    match tuner.unsupported(host) {
        Some(why) => Checked::Unsupported(why),
        None => Checked::Findings(tuner.check(host)),
    }
}

/// What applying one tuner did.
#[derive(Debug, Default)]
pub struct Applied {
    /// Files written: the path and the value.
    pub written: Vec<(String, String)>,
    /// What only an operator can do, said.
    pub manual: Vec<String>,
    /// Writes that failed: the path and why.
    pub failed: Vec<(String, String)>,
}

/// Makes right what `tuner` finds off on `host`, where a write does.
pub fn apply(tuner: &dyn Tuner, host: &Host) -> Applied {
    let mut applied = Applied::default();
    let Checked::Findings(findings) = check(tuner, host) else {
        return applied;
    };
    for finding in findings {
        match finding.fix {
            Fix::Write { path, value } => match host.write(&path, &value) {
                Ok(()) => applied.written.push((path, value)),
                Err(error) => applied.failed.push((path, error.to_string())),
            },
            Fix::Manual(what) => applied.manual.push(what),
        }
    }
    applied
}

/// The shell commands that would make right what `tuner` finds off on `host` (what
/// [`apply`] writes, as `echo` lines; what only an operator can do, as comments).
pub fn script(tuner: &dyn Tuner, host: &Host) -> Vec<String> {
    let Checked::Findings(findings) = check(tuner, host) else {
        return Vec::new();
    };
    findings
        .into_iter()
        .map(|finding| match finding.fix {
            Fix::Write { path, value } => echo(host, &path, &value),
            Fix::Manual(what) => format!("# {}: {what}", tuner.name()),
        })
        .collect()
}

/// The shell command that writes `value` to `path` on `host`.
pub fn echo(host: &Host, path: &str, value: &str) -> String {
    format!("echo {} > {}", shell_word(value), host.shown(path))
}

/// `text` as one shell word.
fn shell_word(text: &str) -> String {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.,/:".contains(c))
    {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}
