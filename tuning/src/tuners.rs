//! The tuners: each checks one thing, says how to make it right, and says why it cannot run
//! where it cannot.

use crate::host::{format_cpu_list, parse_cpu_list, Host};

/// How to make a finding right.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fix {
    /// Write `value` to the file `path` (absolute on the host).
    Write {
        /// The file.
        path: String,
        /// What to write.
        value: String,
    },
    /// What only an operator can do (a kernel command line, a service's limits), said.
    Manual(String),
}

/// One thing a tuner found off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// What is off, and what it costs.
    pub problem: String,
    /// How to make it right.
    pub fix: Fix,
}

impl Finding {
    fn write(problem: String, path: impl Into<String>, value: impl Into<String>) -> Finding {
        Finding {
            problem,
            fix: Fix::Write {
                path: path.into(),
                value: value.into(),
            },
        }
    }

    fn manual(problem: String, what: String) -> Finding {
        Finding {
            problem,
            fix: Fix::Manual(what),
        }
    }
}

/// One check of the host, and how to make it right.
pub trait Tuner {
    /// Its name in `weir tune list`.
    fn name(&self) -> &'static str;
    /// What it looks at, and why.
    fn about(&self) -> &'static str;
    /// Why it cannot run on this host, if it cannot.
    fn unsupported(&self, host: &Host) -> Option<String>;
    /// What is off (nothing when all is right). Called only where it is supported.
    fn check(&self, host: &Host) -> Vec<Finding>;
}

/// Every tuner, in the order `weir tune` runs them.
pub fn all() -> Vec<Box<dyn Tuner>> {
    vec![
        Box::new(CpuGovernor),
        Box::new(TransparentHugePages),
        Box::new(Swappiness),
        Box::new(Limit::MEMLOCK),
        Box::new(Limit::OPEN_FILES),
        Box::new(UdpBuffers),
        Box::new(IoUring),
        Box::new(IrqAffinity),
        Box::new(Clocksource),
        Box::new(DiskQueues),
        Box::new(IsolatedCores),
    ]
}

/// `Some(reason)` when `path` is missing.
fn needs(host: &Host, path: &str, what: &str) -> Option<String> {
    (!host.exists(path)).then(|| format!("{path} is missing ({what})"))
}

/// The word a kernel selector file (`always [madvise] never`) has selected.
fn selected(text: &str) -> Option<&str> {
    text.split_whitespace()
        .find_map(|word| word.strip_prefix('[')?.strip_suffix(']'))
}

struct CpuGovernor;

const CPUS: &str = "/sys/devices/system/cpu";

impl CpuGovernor {
    fn governors(host: &Host) -> Vec<String> {
        host.online_cores()
            .into_iter()
            .map(|core| format!("{CPUS}/cpu{core}/cpufreq/scaling_governor"))
            .filter(|path| host.exists(path))
            .collect()
    }
}

impl Tuner for CpuGovernor {
    fn name(&self) -> &'static str {
        "cpu-governor"
    }
    fn about(&self) -> &'static str {
        "every core's frequency governor is performance: a shard that waits for its core to clock up after an idle moment adds that to every record's latency"
    }
    fn unsupported(&self, host: &Host) -> Option<String> {
        CpuGovernor::governors(host).is_empty().then(|| {
            "no core has a cpufreq governor (a VM, or the frequency is the firmware's)".into()
        })
    }
    fn check(&self, host: &Host) -> Vec<Finding> {
        CpuGovernor::governors(host)
            .into_iter()
            .filter_map(|path| {
                let governor = host.read(&path)?;
                let available = host
                    .read(&path.replace("scaling_governor", "scaling_available_governors"))
                    .unwrap_or_default();
                (governor != "performance"
                    && available.split_whitespace().any(|g| g == "performance"))
                .then(|| {
                    Finding::write(
                        format!("{path} is {governor}, not performance"),
                        path,
                        "performance",
                    )
                })
            })
            .collect()
    }
}

struct TransparentHugePages;

const THP: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

impl Tuner for TransparentHugePages {
    fn name(&self) -> &'static str {
        "transparent-hugepages"
    }
    fn about(&self) -> &'static str {
        "transparent huge pages are madvise or never, not always: the kernel zeroes a 2 MiB page at a first touch and compacts memory behind processes' backs (weir turns them off for itself; the other processes on the host still pay)"
    }
    fn unsupported(&self, host: &Host) -> Option<String> {
        needs(host, THP, "a kernel without transparent huge pages")
    }
    fn check(&self, host: &Host) -> Vec<Finding> {
        let text = host.read(THP).unwrap_or_default();
        match selected(&text) {
            Some("always") => vec![Finding::write(format!("{THP} is always"), THP, "madvise")],
            _ => Vec::new(),
        }
    }
}

struct Swappiness;

const SWAPPINESS: &str = "/proc/sys/vm/swappiness";

impl Tuner for Swappiness {
    fn name(&self) -> &'static str {
        "swappiness"
    }
    fn about(&self) -> &'static str {
        "vm.swappiness is at most 1: a shard's memory swapped out stops it for a disk read"
    }
    fn unsupported(&self, host: &Host) -> Option<String> {
        needs(host, SWAPPINESS, "no vm sysctls")
    }
    fn check(&self, host: &Host) -> Vec<Finding> {
        match host.read(SWAPPINESS).and_then(|v| v.parse::<u64>().ok()) {
            Some(value) if value > 1 => vec![Finding::write(
                format!("vm.swappiness is {value}"),
                SWAPPINESS,
                "1",
            )],
            _ => Vec::new(),
        }
    }
}

/// A resource limit of the running worker (`/proc/<pid>/limits`).
struct Limit {
    name: &'static str,
    about: &'static str,
    /// Its row's name in `/proc/self/limits`.
    row: &'static str,
    /// The least soft limit wanted; `None`: unlimited.
    least: Option<u64>,
    /// The systemd setting and the shell command that raise it.
    unit: &'static str,
    ulimit: &'static str,
}

impl Limit {
    const MEMLOCK: Limit = Limit {
        name: "memlock",
        about: "the locked-memory limit is unlimited: io_uring's rings and glommio's registered buffers are locked memory, and a shard that cannot lock them does not start",
        row: "Max locked memory",
        least: None,
        unit: "LimitMEMLOCK=infinity",
        ulimit: "ulimit -l unlimited",
    };

    const OPEN_FILES: Limit = Limit {
        name: "open-files",
        about: "the open-file limit is at least 1048576: RocksDB keeps its SST files open, checkpoints and connections add theirs",
        row: "Max open files",
        least: Some(1_048_576),
        unit: "LimitNOFILE=1048576",
        ulimit: "ulimit -n 1048576",
    };

    /// The running worker's soft limit: `None` for unlimited.
    fn soft(&self, host: &Host) -> Option<Option<u64>> {
        let text = host.read(&format!("/proc/{}/limits", host.worker_pid()?))?;
        let line = text.lines().find(|line| line.starts_with(self.row))?;
        let soft = line[self.row.len()..].split_whitespace().next()?;
        match soft {
            "unlimited" => Some(None),
            number => number.parse().ok().map(Some),
        }
    }
}

impl Tuner for Limit {
    fn name(&self) -> &'static str {
        self.name
    }
    fn about(&self) -> &'static str {
        self.about
    }
    fn unsupported(&self, host: &Host) -> Option<String> {
        match host.worker_pid() {
            None => Some("no weir worker runs here: its limits are checked while it runs".into()),
            Some(pid) => self
                .soft(host)
                .is_none()
                .then(|| format!("/proc/{pid}/limits has no '{}' row", self.row)),
        }
    }
    fn check(&self, host: &Host) -> Vec<Finding> {
        let Some(Some(soft)) = self.soft(host) else {
            return Vec::new();
        };
        if self.least.is_some_and(|least| soft >= least) {
            return Vec::new();
        }
        let wanted = self
            .least
            .map_or_else(|| "unlimited".to_string(), |least| least.to_string());
        vec![Finding::manual(
            format!(
                "the worker's {} is {soft}, not {wanted}",
                self.row.to_lowercase()
            ),
            format!(
                "run the worker under the unit `weir tune systemd --role worker` renders ({}), or start it after `{}`",
                self.unit, self.ulimit
            ),
        )]
    }
}

struct UdpBuffers;

/// What QUIC's socket buffers may grow to: 8 MiB.
const UDP_BUFFER: u64 = 8 << 20;

impl Tuner for UdpBuffers {
    fn name(&self) -> &'static str {
        "udp-buffers"
    }
    fn about(&self) -> &'static str {
        "net.core.rmem_max and wmem_max are at least 8 MiB, for the exchange between servers (QUIC over UDP, weir-net asks 8 MiB per shard socket): a socket's buffer is capped there, and a capped one drops datagrams at line rate"
    }
    fn unsupported(&self, host: &Host) -> Option<String> {
        needs(host, "/proc/sys/net/core/rmem_max", "no network sysctls")
    }
    fn check(&self, host: &Host) -> Vec<Finding> {
        ["rmem_max", "wmem_max"]
            .into_iter()
            .filter_map(|name| {
                let path = format!("/proc/sys/net/core/{name}");
                let value: u64 = host.read(&path)?.parse().ok()?;
                (value < UDP_BUFFER).then(|| {
                    Finding::write(
                        format!("net.core.{name} is {value}, under {UDP_BUFFER}"),
                        path,
                        UDP_BUFFER.to_string(),
                    )
                })
            })
            .collect()
    }
}

struct IoUring;

const IO_URING_DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";

impl Tuner for IoUring {
    fn name(&self) -> &'static str {
        "io-uring"
    }
    fn about(&self) -> &'static str {
        "io_uring is allowed for the worker (kernel.io_uring_disabled): shards do all their I/O through it; a host that restricts it by policy is told what to change, never changed"
    }
    fn unsupported(&self, host: &Host) -> Option<String> {
        needs(host, "/proc/sys/kernel", "no kernel sysctls")
    }
    fn check(&self, host: &Host) -> Vec<Finding> {
        // Kernels before 6.6 have no such switch: io_uring is on.
        match host.read(IO_URING_DISABLED).as_deref() {
            Some("1") => vec![Finding::manual(
                "kernel.io_uring_disabled is 1: io_uring is only for the group kernel.io_uring_group".into(),
                "make the worker's user a member of that group (or set kernel.io_uring_group to its group), or set kernel.io_uring_disabled to 0 if the host's policy allows".into(),
            )],
            Some("2") => vec![Finding::manual(
                "kernel.io_uring_disabled is 2: io_uring is off for every process".into(),
                "set kernel.io_uring_disabled to 0 (or to 1 with kernel.io_uring_group) if the host's policy allows: a worker cannot run without io_uring".into(),
            )],
            _ => Vec::new(),
        }
    }
}

struct IrqAffinity;

const INTERRUPTS: &str = "/proc/interrupts";

/// Interrupt names of disks' and network cards' queues (for devices whose interrupts
/// `msi_irqs` does not list).
const DEVICE_IRQS: [&str; 9] = [
    "nvme", "eth", "ens", "enp", "eno", "mlx", "ixgbe", "i40e", "ice",
];

/// The kernel command line that isolates `cores` (a CPU list): no other thread, no timer
/// tick, no RCU callbacks, and none of the kernel's managed interrupts where it can help it.
fn isolation(cores: &str) -> String {
    format!("isolcpus=managed_irq,domain,{cores} nohz_full={cores} rcu_nocbs={cores}")
}

/// Whether interrupt `name` is one the kernel places itself, one per core's queue (managed:
/// its affinity cannot be written): an NVMe I/O queue's (`nvme0q1`, not the admin queue
/// `nvme0q0`) or virtio-blk's (`virtio1-req.0`).
fn managed_queue(name: &str) -> bool {
    let nvme_io = name
        .strip_prefix("nvme")
        .and_then(|rest| rest.split_once('q'))
        .and_then(|(_, queue)| queue.parse::<u32>().ok())
        .is_some_and(|queue| queue >= 1);
    let virtio_blk = name
        .split_once('-')
        .is_some_and(|(device, queue)| device.starts_with("virtio") && queue.starts_with("req"));
    nvme_io || virtio_blk
}

/// The interrupts of the host's network cards and NVMe controllers, exactly: the numbers in
/// `/sys/class/{net,nvme}/*/device/msi_irqs` (whatever the interfaces are named).
fn device_irqs(host: &Host) -> std::collections::BTreeSet<u32> {
    let mut irqs = std::collections::BTreeSet::new();
    for class in ["/sys/class/net", "/sys/class/nvme"] {
        for device in host.list(class) {
            let listed = host.list(&format!("{class}/{device}/device/msi_irqs"));
            irqs.extend(listed.iter().filter_map(|irq| irq.parse::<u32>().ok()));
        }
    }
    irqs
}

/// Whether interrupt `name` is a disk's or a network card's queue (virtio's: `virtio3-input.0`,
/// `virtio3-output.0`, `virtio1-req.0`; not its configuration or balloon interrupts).
fn device_queue(name: &str) -> bool {
    if let Some((device, queue)) = name.split_once('-') {
        if device.starts_with("virtio") {
            return ["input", "output", "req"]
                .iter()
                .any(|kind| queue.starts_with(kind));
        }
    }
    DEVICE_IRQS.iter().any(|prefix| name.starts_with(prefix))
}

impl Tuner for IrqAffinity {
    fn name(&self) -> &'static str {
        "irq-affinity"
    }
    fn about(&self) -> &'static str {
        "disk and network interrupts stay off the cores shards are pinned to: an interrupt on a shard's core stops its records. Network queues are moved (stop irqbalance, or it moves them back); NVMe and virtio-blk queues are the kernel's own, kept off by isolcpus=managed_irq"
    }
    fn unsupported(&self, host: &Host) -> Option<String> {
        needs(host, INTERRUPTS, "no interrupt table")
    }
    fn check(&self, host: &Host) -> Vec<Finding> {
        let text = host.read(INTERRUPTS).unwrap_or_default();
        let spare: Vec<usize> = host
            .online_cores()
            .into_iter()
            .filter(|core| !host.shard_cores.contains(core))
            .collect();
        let devices = device_irqs(host);
        let mut findings = Vec::new();
        let (mut stuck, mut managed) = (Vec::new(), Vec::new());
        for line in text.lines() {
            let Some((irq, rest)) = line.trim_start().split_once(':') else {
                continue;
            };
            let Ok(irq) = irq.parse::<u32>() else {
                continue;
            };
            let device = rest.split_whitespace().last().unwrap_or_default();
            if !devices.contains(&irq) && !device_queue(device) {
                continue;
            }
            let path = format!("/proc/irq/{irq}/smp_affinity_list");
            let Some(cores) = host.read(&path).and_then(|list| parse_cpu_list(&list)) else {
                continue;
            };
            let on_shards: Vec<usize> = cores
                .iter()
                .copied()
                .filter(|core| host.shard_cores.contains(core))
                .collect();
            if on_shards.is_empty() {
                continue;
            }
            if spare.is_empty() {
                stuck.push(format!("{irq} ({device})"));
                continue;
            }
            if managed_queue(device) {
                // The kernel places it within its mask (`effective_affinity_list`); with
                // isolcpus=managed_irq it keeps off isolated cores where the mask allows. A
                // queue whose whole mask is shard cores fires only for their own I/O.
                let effective = host
                    .read(&format!("/proc/irq/{irq}/effective_affinity_list"))
                    .and_then(|list| parse_cpu_list(&list))
                    .unwrap_or_else(|| cores.clone());
                let movable = cores.iter().any(|core| !host.shard_cores.contains(core));
                if movable && effective.iter().any(|core| host.shard_cores.contains(core)) {
                    managed.push(format!("{irq} ({device})"));
                }
                continue;
            }
            findings.push(Finding::write(
                format!(
                    "interrupt {irq} ({device}) may run on shard cores {}",
                    format_cpu_list(&on_shards)
                ),
                path,
                format_cpu_list(&spare),
            ));
        }
        if !managed.is_empty() {
            let cores = format_cpu_list(&host.shard_cores);
            findings.push(Finding::manual(
                format!(
                    "interrupts {} are the kernel's per-core queues and may run on shard cores",
                    managed.join(", ")
                ),
                format!(
                    "add {} to the kernel command line and reboot: the kernel then keeps its managed interrupts off those cores",
                    isolation(&cores)
                ),
            ));
        }
        if !stuck.is_empty() {
            findings.push(Finding::manual(
                format!("interrupts {} run on shard cores", stuck.join(", ")),
                "every online core runs a shard: leave one out of taskmanager.cpu.cores for interrupts".into(),
            ));
        }
        findings
    }
}

struct Clocksource;

const CLOCKSOURCE: &str = "/sys/devices/system/clocksource/clocksource0";

/// Clocksources read with a system call, not through the vDSO.
const SLOW_CLOCKS: [&str; 2] = ["hpet", "acpi_pm"];

impl Tuner for Clocksource {
    fn name(&self) -> &'static str {
        "clocksource"
    }
    fn about(&self) -> &'static str {
        "the clocksource is not hpet or acpi_pm where tsc is offered: every timer, watermark and latency figure reads the clock, and those two cost a system call each (tsc and a hypervisor's paravirtual clocks read through the vDSO)"
    }
    fn unsupported(&self, host: &Host) -> Option<String> {
        needs(
            host,
            &format!("{CLOCKSOURCE}/current_clocksource"),
            "no clocksource in sysfs",
        )
    }
    fn check(&self, host: &Host) -> Vec<Finding> {
        let current = host
            .read(&format!("{CLOCKSOURCE}/current_clocksource"))
            .unwrap_or_default();
        let available = host
            .read(&format!("{CLOCKSOURCE}/available_clocksource"))
            .unwrap_or_default();
        if !SLOW_CLOCKS.contains(&current.as_str())
            || !available.split_whitespace().any(|c| c == "tsc")
        {
            return Vec::new();
        }
        vec![Finding::write(
            format!("the clocksource is {current}, and tsc is offered"),
            format!("{CLOCKSOURCE}/current_clocksource"),
            "tsc",
        )]
    }
}

struct DiskQueues;

/// The most read-ahead wanted on state and checkpoint disks, KiB.
const READ_AHEAD_KB: u64 = 128;

impl DiskQueues {
    /// The disks (their sysfs directories) the data directories are on, each once.
    fn disks(host: &Host) -> Vec<String> {
        let mut disks: Vec<String> = host
            .data_dirs
            .iter()
            .flat_map(|dir| host.disks_of(dir))
            .filter(|disk| host.exists(&format!("{disk}/queue/scheduler")))
            .collect();
        disks.sort();
        disks.dedup();
        disks
    }
}

impl Tuner for DiskQueues {
    fn name(&self) -> &'static str {
        "disk-queues"
    }
    fn about(&self) -> &'static str {
        "the disks under the state and checkpoint directories use the none scheduler (solid-state) and read ahead at most 128 KiB: io_uring already orders shards' I/O, and RocksDB's point reads do not want the next 2 MiB"
    }
    fn unsupported(&self, host: &Host) -> Option<String> {
        DiskQueues::disks(host)
            .is_empty()
            .then(|| "no state or checkpoint directory is on a block device with a queue".into())
    }
    fn check(&self, host: &Host) -> Vec<Finding> {
        let mut findings = Vec::new();
        for disk in DiskQueues::disks(host) {
            let scheduler_path = format!("{disk}/queue/scheduler");
            let schedulers = host.read(&scheduler_path).unwrap_or_default();
            let rotational = host.read(&format!("{disk}/queue/rotational")).as_deref() == Some("1");
            let offers_none = schedulers
                .split_whitespace()
                .any(|s| s.trim_matches(['[', ']']) == "none");
            if let Some(current) = selected(&schedulers) {
                if current != "none" && offers_none && !rotational {
                    findings.push(Finding::write(
                        format!("{disk} schedules with {current}, not none"),
                        scheduler_path,
                        "none",
                    ));
                }
            }
            let read_ahead_path = format!("{disk}/queue/read_ahead_kb");
            if let Some(kb) = host
                .read(&read_ahead_path)
                .and_then(|v| v.parse::<u64>().ok())
            {
                if kb > READ_AHEAD_KB {
                    findings.push(Finding::write(
                        format!("{disk} reads ahead {kb} KiB"),
                        read_ahead_path,
                        READ_AHEAD_KB.to_string(),
                    ));
                }
            }
        }
        findings
    }
}

struct IsolatedCores;

const ISOLATED: &str = "/sys/devices/system/cpu/isolated";

impl Tuner for IsolatedCores {
    fn name(&self) -> &'static str {
        "isolated-cores"
    }
    fn about(&self) -> &'static str {
        "the shards' cores are isolated from other load (isolcpus, nohz_full): the scheduler puts no other thread there and the timer tick stays away"
    }
    fn unsupported(&self, host: &Host) -> Option<String> {
        needs(host, ISOLATED, "a kernel without CPU isolation")
    }
    fn check(&self, host: &Host) -> Vec<Finding> {
        let isolated = host
            .read(ISOLATED)
            .and_then(|list| parse_cpu_list(&list))
            .unwrap_or_default();
        let shared: Vec<usize> = host
            .shard_cores
            .iter()
            .copied()
            .filter(|core| !isolated.contains(core))
            .collect();
        if shared.is_empty() {
            return Vec::new();
        }
        let problem = format!(
            "shard cores {} are not isolated: other threads run there",
            format_cpu_list(&shared)
        );
        let online = host.online_cores();
        let what = if host.shard_cores.len() >= online.len() {
            "every online core runs a shard, and the host needs one for itself: leave one out of taskmanager.cpu.cores, then isolate the rest".to_string()
        } else {
            let cores = format_cpu_list(&host.shard_cores);
            format!(
                "add {} to the kernel command line (GRUB_CMDLINE_LINUX in /etc/default/grub, then update-grub) and reboot",
                isolation(&cores)
            )
        };
        vec![Finding::manual(problem, what)]
    }
}
