//! Every tuner against fake `/proc` + `/sys` trees: check finds each problem, apply makes
//! right what a write does, script prints the same writes, and a healthy host has nothing.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use proptest::prelude::*;
use weir_tuning::{all, apply, check, format_cpu_list, parse_cpu_list, script, Checked, Fix, Host};

fn put(root: &Path, path: &str, text: &str) {
    let path = root.join(path.trim_start_matches('/'));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, format!("{text}\n")).unwrap();
}

const LIMITS: &str = "\
Limit                     Soft Limit           Hard Limit           Units
Max open files            1024                 1048576              files
Max locked memory         8388608              8388608              bytes";

/// A four-core host where every tuner finds something off: shards on cores 0 and 1, state
/// in `<root>/data`, on the first partition of a virtual disk.
fn untuned(root: &Path) -> Host {
    put(root, "/sys/devices/system/cpu/online", "0-3");
    for core in 0..4 {
        let cpufreq = format!("/sys/devices/system/cpu/cpu{core}/cpufreq");
        put(root, &format!("{cpufreq}/scaling_governor"), "powersave");
        put(
            root,
            &format!("{cpufreq}/scaling_available_governors"),
            "performance powersave",
        );
    }
    put(
        root,
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "[always] madvise never",
    );
    put(root, "/proc/sys/vm/swappiness", "60");
    // A worker runs, as pid 4242, with a shell's limits.
    put(
        root,
        "/proc/4242/cmdline",
        "/usr/bin/weir\0worker\0--control\0localhost:8081",
    );
    put(root, "/proc/4242/limits", LIMITS);
    put(root, "/proc/4243/cmdline", "/usr/bin/weir\0tune\0check");
    put(root, "/proc/sys/net/core/rmem_max", "212992");
    put(root, "/proc/sys/net/core/wmem_max", "16777216");
    put(root, "/proc/sys/kernel/io_uring_disabled", "2");
    put(
        root,
        "/proc/interrupts",
        "           CPU0       CPU1       CPU2       CPU3
  0:         44          0          0          0   IO-APIC   2-edge      timer
 40:       1000          0          0          0   PCI-MSI 1048576-edge      nvme0q1
 41:          0          0        300          0   PCI-MSI 524288-edge      eth0-rx-0
 42:          0          0          0         10   PCI-MSI 524289-edge      eth0-tx-0
 43:          0          0          0          0   PCI-MSI 49152-edge      virtio0-config
 44:          0          5          0          0   PCI-MSI 49153-edge      virtio0-input.0
 45:          9          0          0          0   PCI-MSI 1048577-edge      nvme0q2
 46:          0          7          0          0   PCI-MSI 2097152-edge      wan0-TxRx-0
 47:          0          3          0          0   PCI-MSI 3145728-edge      sensor-event
NMI:          0          0          0          0   Non-maskable interrupts",
    );
    // The NVMe queue's mask is every core, and the kernel put it on shard core 1.
    put(root, "/proc/irq/40/smp_affinity_list", "0-3");
    put(root, "/proc/irq/40/effective_affinity_list", "1");
    // A queue of shard core 0's own: it fires only for that shard's I/O.
    put(root, "/proc/irq/45/smp_affinity_list", "0");
    put(root, "/proc/irq/41/smp_affinity_list", "1");
    put(root, "/proc/irq/42/smp_affinity_list", "3");
    put(root, "/proc/irq/43/smp_affinity_list", "0-3");
    put(root, "/proc/irq/44/smp_affinity_list", "0-1");
    // A card renamed wan0, whose queues no name pattern knows: its msi_irqs lists them.
    put(root, "/sys/class/net/wan0/device/msi_irqs/46", "msi");
    put(root, "/proc/irq/46/smp_affinity_list", "1");
    // Some other device's interrupt, on a shard core: not a disk's or a network card's.
    put(root, "/proc/irq/47/smp_affinity_list", "1");
    let clocksource = "/sys/devices/system/clocksource/clocksource0";
    put(root, &format!("{clocksource}/current_clocksource"), "hpet");
    put(
        root,
        &format!("{clocksource}/available_clocksource"),
        "hpet tsc acpi_pm",
    );
    put(root, "/sys/devices/system/cpu/isolated", "");
    // The data directory's device, as sysfs links it: a partition of disk vdb.
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let dev = std::fs::metadata(&data).unwrap().dev();
    let disk = "/sys/devices/pci0000:00/virtio4/block/vdb";
    put(root, &format!("{disk}/vdb1/partition"), "1");
    put(
        root,
        &format!("{disk}/queue/scheduler"),
        "[mq-deadline] none",
    );
    put(root, &format!("{disk}/queue/read_ahead_kb"), "4096");
    put(root, &format!("{disk}/queue/rotational"), "0");
    let link = root.join(format!(
        "sys/dev/block/{}:{}",
        libc::major(dev),
        libc::minor(dev)
    ));
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(root.join(disk.trim_start_matches('/')).join("vdb1"), &link)
        .unwrap();
    Host::new(root, Some(vec![0, 1]), vec![data])
}

fn findings(host: &Host, name: &str) -> Vec<weir_tuning::Finding> {
    let tuner = all().into_iter().find(|t| t.name() == name).unwrap();
    match check(tuner.as_ref(), host) {
        Checked::Findings(findings) => findings,
        Checked::Unsupported(why) => panic!("{name} unsupported: {why}"),
    }
}

fn write_of(finding: &weir_tuning::Finding) -> (&str, &str) {
    match &finding.fix {
        Fix::Write { path, value } => (path, value),
        Fix::Manual(what) => panic!("a manual fix: {what}"),
    }
}

#[test]
fn each_tuner_finds_what_is_off_on_an_untuned_host() {
    let dir = tempfile::tempdir().unwrap();
    let host = untuned(dir.path());
    for tuner in all() {
        let Checked::Findings(found) = check(tuner.as_ref(), &host) else {
            panic!("{} is unsupported on the fake host", tuner.name());
        };
        assert!(!found.is_empty(), "{} found nothing", tuner.name());
    }
    let governors = findings(&host, "cpu-governor");
    assert_eq!(governors.len(), 4);
    assert_eq!(
        write_of(&governors[2]),
        (
            "/sys/devices/system/cpu/cpu2/cpufreq/scaling_governor",
            "performance"
        )
    );
    assert_eq!(
        write_of(&findings(&host, "transparent-hugepages")[0]).1,
        "madvise"
    );
    assert_eq!(
        write_of(&findings(&host, "swappiness")[0]),
        ("/proc/sys/vm/swappiness", "1")
    );
    // Only the receive buffer is short.
    let udp = findings(&host, "udp-buffers");
    assert_eq!(
        udp.iter().map(write_of).collect::<Vec<_>>(),
        [("/proc/sys/net/core/rmem_max", "8388608")]
    );
    // A policy is said, never undone.
    let io_uring = findings(&host, "io-uring");
    assert!(io_uring[0].problem.contains("is 2"), "{io_uring:?}");
    assert!(matches!(io_uring[0].fix, Fix::Manual(_)), "{io_uring:?}");
    // eth0-rx-0 on shard core 1, virtio's network input on both and wan0's queue (known by
    // its card's msi_irqs) move to the two spare cores; eth0-tx-0 is on spare core 3 already,
    // and the timer, virtio's configuration interrupt and the sensor's are no queue's. The
    // NVMe I/O queue is the kernel's to place: isolcpus.
    let irqs = findings(&host, "irq-affinity");
    assert_eq!(
        irqs[..3].iter().map(write_of).collect::<Vec<_>>(),
        [
            ("/proc/irq/41/smp_affinity_list", "2-3"),
            ("/proc/irq/44/smp_affinity_list", "2-3"),
            ("/proc/irq/46/smp_affinity_list", "2-3")
        ]
    );
    assert_eq!(irqs.len(), 4, "{irqs:?}");
    assert!(irqs[3].problem.contains("40 (nvme0q1)"), "{irqs:?}");
    assert!(
        matches!(&irqs[3].fix, Fix::Manual(what) if what.contains("isolcpus=managed_irq,domain,0-1")),
        "{irqs:?}"
    );
    assert_eq!(write_of(&findings(&host, "clocksource")[0]).1, "tsc");
    // The partition's disk: its scheduler and its read-ahead.
    let disk = findings(&host, "disk-queues");
    assert_eq!(
        disk.iter().map(write_of).collect::<Vec<_>>(),
        [
            (
                "/sys/devices/pci0000:00/virtio4/block/vdb/queue/scheduler",
                "none"
            ),
            (
                "/sys/devices/pci0000:00/virtio4/block/vdb/queue/read_ahead_kb",
                "128"
            )
        ]
    );
    for (name, says) in [
        ("memlock", "LimitMEMLOCK=infinity"),
        ("open-files", "ulimit -n 1048576"),
        (
            "isolated-cores",
            "isolcpus=managed_irq,domain,0-1 nohz_full=0-1",
        ),
    ] {
        match &findings(&host, name)[0].fix {
            Fix::Manual(what) => assert!(what.contains(says), "{name}: {what}"),
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn apply_makes_right_what_a_write_does_and_script_prints_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let host = untuned(dir.path());
    let mut scripted = Vec::new();
    let mut written = Vec::new();
    let mut manual = Vec::new();
    for tuner in all() {
        scripted.extend(script(tuner.as_ref(), &host));
        let applied = apply(tuner.as_ref(), &host);
        assert!(applied.failed.is_empty(), "{:?}", applied.failed);
        written.extend(applied.written);
        manual.extend(applied.manual);
    }
    // The script's commands are apply's writes, in order, and the rest are comments.
    let echoes: Vec<String> = written
        .iter()
        .map(|(path, value)| format!("echo {value} > {}", host.shown(path)))
        .collect();
    let (commands, comments): (Vec<String>, Vec<String>) = scripted
        .into_iter()
        .partition(|line| !line.starts_with('#'));
    assert_eq!(commands, echoes);
    assert_eq!(comments.len(), manual.len());
    // The limits, the isolation, io_uring's policy and the NVMe queue are the operator's.
    assert_eq!(manual.len(), 5, "{manual:?}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("proc/irq/41/smp_affinity_list")).unwrap(),
        "2-3\n"
    );
    // Checked again, only what an operator must do is left.
    for tuner in all() {
        let Checked::Findings(found) = check(tuner.as_ref(), &host) else {
            panic!("{} became unsupported", tuner.name());
        };
        assert!(
            found.iter().all(|f| matches!(f.fix, Fix::Manual(_))),
            "{}: {found:?}",
            tuner.name()
        );
    }
    // An operator did it: nothing is left.
    put(
        dir.path(),
        "/proc/4242/limits",
        &LIMITS.replace("1024    ", "1048576 ").replace(
            "8388608              8388608",
            "unlimited            unlimited",
        ),
    );
    put(dir.path(), "/sys/devices/system/cpu/isolated", "0-1");
    put(dir.path(), "/proc/sys/kernel/io_uring_disabled", "0");
    // Rebooted with isolcpus=managed_irq: the kernel moved the NVMe queue within its mask.
    put(dir.path(), "/proc/irq/40/effective_affinity_list", "2");
    for tuner in all() {
        let Checked::Findings(found) = check(tuner.as_ref(), &host) else {
            panic!("{} became unsupported", tuner.name());
        };
        assert!(found.is_empty(), "{}: {found:?}", tuner.name());
    }
}

#[test]
fn every_tuner_says_why_it_cannot_run_on_a_host_without_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let host = Host::new(dir.path(), Some(vec![0]), vec![dir.path().to_path_buf()]);
    for tuner in all() {
        match check(tuner.as_ref(), &host) {
            Checked::Unsupported(why) => assert!(!why.is_empty()),
            Checked::Findings(found) => panic!("{} ran: {found:?}", tuner.name()),
        }
    }
}

#[test]
fn with_a_shard_on_every_core_interrupts_and_isolation_are_left_to_the_operator() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = untuned(dir.path());
    host.shard_cores = vec![0, 1, 2, 3];
    let isolated = findings(&host, "isolated-cores");
    assert_eq!(isolated.len(), 1, "{isolated:?}");
    assert!(matches!(&isolated[0].fix, Fix::Manual(what) if what.contains("leave one out")));
    // Nothing can be moved anywhere: one finding, the kernel's queues among them.
    let irqs = findings(&host, "irq-affinity");
    assert_eq!(irqs.len(), 1, "{irqs:?}");
    assert!(
        matches!(&irqs[0].fix, Fix::Manual(what) if what.contains("leave one out")),
        "{irqs:?}"
    );
    assert!(
        irqs[0].problem.contains(
            "40 (nvme0q1), 41 (eth0-rx-0), 42 (eth0-tx-0), 44 (virtio0-input.0), 45 (nvme0q2), \
             46 (wan0-TxRx-0) run"
        ),
        "{irqs:?}"
    );
}

#[test]
fn a_logical_volume_is_tuned_on_its_physical_disks_and_a_paravirtual_clock_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let host = untuned(root);
    // The data directory's device is now dm-0, over two partitions of two disks.
    let data = root.join("data");
    let dev = std::fs::metadata(&data).unwrap().dev();
    let link = root.join(format!(
        "sys/dev/block/{}:{}",
        libc::major(dev),
        libc::minor(dev)
    ));
    std::fs::remove_file(&link).unwrap();
    let dm = root.join("sys/devices/virtual/block/dm-0");
    for (disk, part) in [("vdb", "vdb1"), ("vdc", "vdc1")] {
        let disk_dir = format!("/sys/devices/pci0000:00/virtio4/block/{disk}");
        put(root, &format!("{disk_dir}/{part}/partition"), "1");
        put(
            root,
            &format!("{disk_dir}/queue/scheduler"),
            "[none] mq-deadline",
        );
        put(root, &format!("{disk_dir}/queue/read_ahead_kb"), "512");
        std::fs::create_dir_all(dm.join("slaves")).unwrap();
        let _ = std::fs::remove_file(dm.join("slaves").join(part));
        std::os::unix::fs::symlink(
            root.join(disk_dir.trim_start_matches('/')).join(part),
            dm.join("slaves").join(part),
        )
        .unwrap();
    }
    put(
        root,
        "/sys/devices/virtual/block/dm-0/queue/scheduler",
        "none",
    );
    std::os::unix::fs::symlink(&dm, &link).unwrap();
    let found = findings(&host, "disk-queues");
    assert_eq!(
        found.iter().map(write_of).collect::<Vec<_>>(),
        [
            (
                "/sys/devices/pci0000:00/virtio4/block/vdb/queue/read_ahead_kb",
                "128"
            ),
            (
                "/sys/devices/pci0000:00/virtio4/block/vdc/queue/read_ahead_kb",
                "128"
            )
        ]
    );
    // kvm-clock reads through the vDSO as tsc does: nothing to change.
    put(
        root,
        "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        "kvm-clock",
    );
    assert!(findings(&host, "clocksource").is_empty());
}

#[test]
fn a_rotational_disk_keeps_its_scheduler() {
    let dir = tempfile::tempdir().unwrap();
    let host = untuned(dir.path());
    put(
        dir.path(),
        "/sys/devices/pci0000:00/virtio4/block/vdb/queue/rotational",
        "1",
    );
    let found = findings(&host, "disk-queues");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(write_of(&found[0]).0.ends_with("read_ahead_kb"));
}

proptest! {
    #[test]
    fn cpu_lists_read_back_what_was_written(cores in proptest::collection::btree_set(0usize..256, 0..40)) {
        let cores: Vec<usize> = cores.into_iter().collect();
        let text = format_cpu_list(&cores);
        prop_assert_eq!(parse_cpu_list(&text), Some(cores));
    }
}
