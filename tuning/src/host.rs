//! The host a tuner looks at: files under a root directory.

use std::path::{Path, PathBuf};

/// A host's `/proc` and `/sys` under `root`, the cores its shards are pinned to, and the
/// directories its state and checkpoints are written to.
#[derive(Clone, Debug)]
pub struct Host {
    root: PathBuf,
    /// The cores the worker's shards are pinned to (`taskmanager.cpu.cores`).
    pub shard_cores: Vec<usize>,
    /// The directories RocksDB and checkpoints write to, as the host names them.
    pub data_dirs: Vec<PathBuf>,
}

impl Host {
    /// The host under `root` (`/` for this machine), with its shards on `shard_cores` (all
    /// online cores when `None`) writing state and checkpoints to `data_dirs`.
    pub fn new(root: &Path, shard_cores: Option<Vec<usize>>, data_dirs: Vec<PathBuf>) -> Host {
        let mut host = Host {
            root: root.to_path_buf(),
            shard_cores: Vec::new(),
            data_dirs,
        };
        host.shard_cores = shard_cores.unwrap_or_else(|| host.online_cores());
        host
    }

    /// `path` (absolute on the host) under the root.
    pub fn path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// `path` as a command run on the host would name it (under the root, when it is not
    /// `/`).
    pub fn shown(&self, path: &str) -> String {
        self.path(path).display().to_string()
    }

    /// The contents of `path`, trimmed; `None` when it cannot be read.
    pub fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.path(path))
            .ok()
            .map(|text| text.trim().to_string())
    }

    /// Whether `path` exists.
    pub fn exists(&self, path: &str) -> bool {
        self.path(path).exists()
    }

    /// Writes `value` to `path` (as `echo VALUE > PATH` does).
    pub fn write(&self, path: &str, value: &str) -> std::io::Result<()> {
        std::fs::write(self.path(path), format!("{value}\n"))
    }

    /// The names in directory `path`, sorted.
    pub fn list(&self, path: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path(path))
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// The online cores (`/sys/devices/system/cpu/online`).
    pub fn online_cores(&self) -> Vec<usize> {
        self.read("/sys/devices/system/cpu/online")
            .and_then(|list| parse_cpu_list(&list))
            .unwrap_or_default()
    }

    /// The host's paths of the sysfs directories of the physical disks `dir` is on: its
    /// partition's disk, or those under a logical volume, an encrypted or a RAID device
    /// (their `slaves`); none for a file system on no block device (tmpfs, overlay, btrfs's
    /// anonymous device).
    pub fn disks_of(&self, dir: &Path) -> Vec<String> {
        use std::os::unix::fs::MetadataExt;
        let (Ok(metadata), Ok(root)) = (std::fs::metadata(dir), std::fs::canonicalize(&self.root))
        else {
            return Vec::new();
        };
        let (major, minor) = (libc::major(metadata.dev()), libc::minor(metadata.dev()));
        let device = self.path(&format!("/sys/dev/block/{major}:{minor}"));
        let mut disks = Vec::new();
        if let Ok(resolved) = std::fs::canonicalize(device) {
            physical_disks(&resolved, &root, &mut disks, 0);
        }
        disks.sort();
        disks.dedup();
        disks
    }

    /// The pid of the weir worker running here (`weir worker …`), if one does.
    pub fn worker_pid(&self) -> Option<u32> {
        self.list("/proc").into_iter().find_map(|name| {
            let pid: u32 = name.parse().ok()?;
            let cmdline = std::fs::read(self.path(&format!("/proc/{pid}/cmdline"))).ok()?;
            let mut args = cmdline.split(|&b| b == 0);
            let program = Path::new(std::str::from_utf8(args.next()?).ok()?);
            (program.file_name()? == "weir" && args.next()? == b"worker").then_some(pid)
        })
    }
}

/// Adds to `disks` the physical disks under the sysfs block device directory `device`.
fn physical_disks(device: &Path, root: &Path, disks: &mut Vec<String>, depth: usize) {
    // A partition's queue is its disk's: the directory above it.
    let device = if device.join("partition").exists() {
        match device.parent() {
            Some(disk) => disk,
            None => return,
        }
    } else {
        device
    };
    let slaves: Vec<PathBuf> = std::fs::read_dir(device.join("slaves"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| std::fs::canonicalize(entry.path()).ok())
        .collect();
    if slaves.is_empty() || depth > 8 {
        if let Ok(relative) = device.strip_prefix(root) {
            disks.push(format!("/{}", relative.display()));
        }
        return;
    }
    for slave in slaves {
        physical_disks(&slave, root, disks, depth + 1);
    }
}

/// Reads a kernel CPU list (`0-3,8,10-11`).
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cores = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((from, to)) => {
                let (from, to): (usize, usize) = (from.parse().ok()?, to.parse().ok()?);
                cores.extend(from..=to);
            }
            None => cores.push(part.parse().ok()?),
        }
    }
    cores.sort_unstable();
    cores.dedup();
    Some(cores)
}

/// Writes a kernel CPU list, runs folded (`0-3,8`).
pub fn format_cpu_list(cores: &[usize]) -> String {
    let mut sorted = cores.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut index = 0;
    while index < sorted.len() {
        let start = sorted[index];
        let mut end = start;
        while index + 1 < sorted.len() && sorted[index + 1] == end + 1 {
            index += 1;
            end = sorted[index];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        index += 1;
    }
    parts.join(",")
}
