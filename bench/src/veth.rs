//! Two network namespaces joined by a veth pair, for benchmarks whose two sides should cross
//! a real network stack (addresses, routes, a link of MTU 1500, the kernel's veth driver)
//! rather than loopback. Each side's thread enters its namespace ([`Veth::enter`]) before it
//! opens a socket; threads it starts afterwards are born in it. Needs root and iproute2; the
//! namespaces (and with them the pair) go when the [`Veth`] is dropped, and those of a run
//! killed before it could at the next run's start.

use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::process::Command;

use crate::error::BenchError;

/// Two namespaces, side 0 and side 1, and the veth pair between them.
pub struct Veth {
    namespaces: [String; 2],
    /// The pair's ends (in the namespaces once made; deleting those deletes them).
    ends: [String; 2],
    /// Whether this run made the pair (only then does dropping delete an end left here).
    linked: bool,
    addrs: [IpAddr; 2],
}

/// One side of a [`Veth`]: its namespace and its address (valid while the pair lives).
#[derive(Clone, Debug)]
pub struct VethSide {
    namespace: String,
    addr: IpAddr,
}

/// Runs `ip` with `args`, or says why it failed.
fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e} (install iproute2)", args.join(" ")))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

impl Veth {
    /// Makes both namespaces and the pair, addressed 10.254.N.1 and .2 (N from this
    /// process's pid), each end up.
    pub fn make() -> Result<Veth, BenchError> {
        let pid = std::process::id();
        let namespaces = [format!("weirbench{pid}a"), format!("weirbench{pid}b")];
        // An interface's name takes 15 bytes at most.
        let ends = [format!("wb{pid}a"), format!("wb{pid}b")];
        let subnet = format!("10.254.{}", pid % 250);
        let addrs = [format!("{subnet}.1"), format!("{subnet}.2")];
        remove_abandoned();
        let mut veth = Veth {
            namespaces: [String::new(), String::new()],
            ends: ends.clone(),
            linked: false,
            addrs: [
                addrs[0].parse().expect("an address"),
                addrs[1].parse().expect("an address"),
            ],
        };
        let made = |veth: &mut Veth| -> Result<(), String> {
            for (side, namespace) in namespaces.iter().enumerate() {
                ip(&["netns", "add", namespace])?;
                // Removed when dropped only once made here.
                veth.namespaces[side] = namespace.clone();
            }
            ip(&[
                "link", "add", &ends[0], "type", "veth", "peer", "name", &ends[1],
            ])?;
            veth.linked = true;
            for side in 0..2 {
                let (namespace, end) = (&namespaces[side], &ends[side]);
                ip(&["link", "set", end, "netns", namespace])?;
                let cidr = format!("{}/30", addrs[side]);
                ip(&["-n", namespace, "addr", "add", &cidr, "dev", end])?;
                ip(&["-n", namespace, "link", "set", end, "up"])?;
                ip(&["-n", namespace, "link", "set", "lo", "up"])?;
            }
            Ok(())
        };
        made(&mut veth).map_err(|why| {
            BenchError::Veth(format!(
                "{why}; a run over a veth pair needs root and iproute2"
            ))
        })?;
        Ok(veth)
    }

    /// Side `side` (0 or 1).
    pub fn side(&self, side: usize) -> VethSide {
        VethSide {
            namespace: self.namespaces[side].clone(),
            addr: self.addrs[side],
        }
    }
}

impl VethSide {
    /// The side's address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// Moves the calling thread into the side's namespace: the sockets it opens and the
    /// threads it starts from now on are there.
    pub fn enter(&self) -> Result<(), String> {
        let path = format!("/var/run/netns/{}", self.namespace);
        let namespace = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
        // SAFETY: setns(2) on a descriptor this function holds open for the call; it changes
        // the calling thread's network namespace and nothing else.
        let entered = unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) };
        if entered != 0 {
            return Err(format!(
                "cannot enter {path}: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }
}

/// Removes the namespaces of runs killed before they could (their process is gone): a
/// namespace holds its end of the pair, so that goes too.
fn remove_abandoned() {
    let Ok(listing) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&listing.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let pid = name
            .strip_prefix("weirbench")
            .and_then(|rest| rest.strip_suffix(['a', 'b']))
            .and_then(|pid| pid.parse::<u32>().ok());
        if pid.is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        // Left in this namespace only if moving it failed.
        if self.linked {
            let _ = ip(&["link", "del", &self.ends[0]]);
        }
        for namespace in &self.namespaces {
            if !namespace.is_empty() {
                let _ = ip(&["netns", "del", namespace]);
            }
        }
    }
}
