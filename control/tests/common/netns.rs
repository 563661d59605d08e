//! Worker processes on a network of their own: a Linux bridge in this namespace (which the
//! control plane listens on) and a network namespace per worker joined to it by a veth pair,
//! so that what workers send each other crosses a real network stack. Needs root and
//! iproute2 (nftables to lose packets, tc to queue them); `Network::start` says why it cannot, and with
//! `WEIR_REQUIRE_NETNS` set (`.ci/run`) that fails the test instead of skipping it.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A bridge and a namespace per worker, removed when dropped.
pub struct Network {
    bridge: String,
    namespaces: Vec<String>,
    /// Each namespace's end of its veth pair.
    links: Vec<String>,
    /// The subnet's first three octets.
    prefix: String,
}

/// Networks made by this process so far (each gets names and a subnet of its own).
static MADE: AtomicU32 = AtomicU32::new(0);

/// Runs `args` (a command and its arguments), or says why it failed.
fn run(args: &[&str]) -> Result<(), String> {
    let output = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Runs `args` (a command and its arguments) in `namespace`, or says why it failed.
fn run_in(namespace: &str, args: &[&str]) -> Result<(), String> {
    let mut all = vec!["ip", "netns", "exec", namespace];
    all.extend_from_slice(args);
    run(&all)
}

impl Network {
    /// A network of `namespaces` namespaces, or `None` (and why, printed) where this process
    /// cannot make one — unless `WEIR_REQUIRE_NETNS` is set, when that fails the test.
    pub fn start(namespaces: usize) -> Option<Network> {
        match Network::make(namespaces) {
            Ok(network) => Some(network),
            Err(why) if std::env::var_os("WEIR_REQUIRE_NETNS").is_none() => {
                eprintln!(
                    "skipped: cannot make network namespaces ({why}); run as root with iproute2"
                );
                None
            }
            Err(why) => panic!("cannot make network namespaces: {why}"),
        }
    }

    fn make(count: usize) -> Result<Network, String> {
        let made = MADE.fetch_add(1, Ordering::Relaxed);
        // The process's pid and the network's number: names no other network has (an
        // interface's name takes 15 bytes at most).
        let tag = format!("{}-{made}", std::process::id());
        let prefix = format!("10.{}.{}", 200 + made % 50, std::process::id() % 250);
        let mut network = Network {
            bridge: String::new(),
            namespaces: Vec::new(),
            links: Vec::new(),
            prefix,
        };
        let bridge = format!("wbr{tag}");
        run(&["ip", "link", "add", &bridge, "type", "bridge"])?;
        // Removed when dropped only once this network made it.
        network.bridge = bridge.clone();
        run(&[
            "ip",
            "addr",
            "add",
            &format!("{}.1/24", network.prefix),
            "dev",
            &bridge,
        ])?;
        run(&["ip", "link", "set", &bridge, "up"])?;
        for i in 0..count {
            let namespace = format!("weir{tag}n{i}");
            run(&["ip", "netns", "add", &namespace])?;
            network.namespaces.push(namespace.clone());
            let (outer, inner) = (format!("wv{tag}-{i}o"), format!("wv{tag}-{i}i"));
            run(&[
                "ip", "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            if let Err(error) = run(&["ip", "link", "set", &inner, "netns", &namespace]) {
                // Both ends still here: removed with either.
                let _ = run(&["ip", "link", "del", &outer]);
                return Err(error);
            }
            network.links.push(inner.clone());
            run(&["ip", "link", "set", &outer, "master", &bridge])?;
            run(&["ip", "link", "set", &outer, "up"])?;
            let inside = |args: &[&str]| run_in(&namespace, args);
            let address = format!("{}/24", network.address(i));
            inside(&["ip", "addr", "add", &address, "dev", &inner])?;
            inside(&["ip", "link", "set", &inner, "up"])?;
            inside(&["ip", "link", "set", "lo", "up"])?;
        }
        Ok(network)
    }

    /// This namespace's address on the bridge (where the control plane listens).
    pub fn host(&self) -> String {
        format!("{}.1", self.prefix)
    }

    /// Namespace `i`'s address.
    pub fn address(&self, i: usize) -> String {
        format!("{}.{}", self.prefix, i + 2)
    }

    /// `program` to run in namespace `i` (`ip netns exec`, which execs it: its pid is the
    /// program's).
    pub fn command(&self, i: usize, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.namespaces[i], program]);
        command
    }

    /// Namespace `i` drops `percent` % of the UDP datagrams it sends, at random (nftables).
    pub fn lose_udp(&self, i: usize, percent: u32) {
        let namespace = &self.namespaces[i];
        let nft = |rest: &[&str]| {
            run_in(namespace, &[&["nft"], rest].concat()).unwrap_or_else(|e| panic!("{e}"));
        };
        nft(&["add", "table", "inet", "weirloss"]);
        nft(&[
            "add",
            "chain",
            "inet",
            "weirloss",
            "out",
            "{ type filter hook output priority 0; policy accept; }",
        ]);
        let below = percent.to_string();
        nft(&[
            "add", "rule", "inet", "weirloss", "out", "meta", "l4proto", "udp", "numgen", "random",
            "mod", "100", "<", &below, "counter", "drop",
        ]);
    }

    /// Namespace `i`'s link sends at most `rate` (tc's notation: `4mbit`) and queues what
    /// comes faster for up to `latency` (`100ms`), dropping the rest: a token bucket (`tbf`),
    /// so that datagrams wait as on a slow link. (This kernel has no `netem` to delay every
    /// datagram by a set time.)
    pub fn queue_to(&self, i: usize, rate: &str, latency: &str) {
        let link = &self.links[i];
        run_in(
            &self.namespaces[i],
            &[
                "tc", "qdisc", "add", "dev", link, "root", "tbf", "rate", rate, "burst", "16kb",
                "latency", latency,
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// How often namespace `i`'s link held a packet back for its rate so far
    /// ([`Network::queue_to`]; tbf's "overlimits").
    pub fn held_back(&self, i: usize) -> u64 {
        let link = &self.links[i];
        self.count_in(
            i,
            &["tc", "-s", "qdisc", "show", "dev", link],
            "overlimits ",
        )
    }

    /// The UDP datagrams namespace `i` dropped so far ([`Network::lose_udp`]).
    pub fn lost_udp(&self, i: usize) -> u64 {
        let list = ["nft", "list", "table", "inet", "weirloss"];
        self.count_in(i, &list, "counter packets ")
    }

    /// The number after `label` in what `command` prints in namespace `i` (0 if none).
    fn count_in(&self, i: usize, command: &[&str], label: &str) -> u64 {
        let output = self
            .command(i, command[0])
            .args(&command[1..])
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", command.join(" ")));
        assert!(
            output.status.success(),
            "{} failed: {}",
            command.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
        let text = String::from_utf8_lossy(&output.stdout);
        text.split_once(label)
            .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth pair, and with it the other.
        for namespace in &self.namespaces {
            let _ = run(&["ip", "netns", "del", namespace]);
        }
        if !self.bridge.is_empty() {
            let _ = run(&["ip", "link", "del", &self.bridge]);
        }
    }
}
