//! Memory budgets: how a worker's process size splits into per-slot shares, how RocksDB uses
//! a slot's managed share, and the budget table `weir run --explain-memory` prints.

use std::fmt;

use crate::units::Mib;

/// The memory settings of one worker (`taskmanager.memory.*`).
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryConfig {
    /// `taskmanager.memory.process.size`: everything the worker process may use, in bytes.
    pub process_size: u64,
    /// `taskmanager.memory.managed.fraction`: share of the process size for state backends.
    pub managed_fraction: f64,
    /// `taskmanager.memory.network.fraction`: share of the process size for exchange segments.
    pub network_fraction: f64,
    /// `taskmanager.memory.network.min`: lower bound of the network share, in bytes.
    pub network_min: u64,
    /// `taskmanager.memory.network.max`: upper bound of the network share, in bytes.
    pub network_max: u64,
    /// `taskmanager.memory.segment-size`: size of one network segment, in bytes.
    pub segment_size: usize,
}

/// Flink's default TaskManager size (`taskmanager.memory.process.size: 1728m` in its shipped
/// configuration): Weir's default for a worker of up to two slots.
pub const BASE_PROCESS_SIZE: u64 = 1728 << 20;

/// Each slot of a larger worker adds this much to the default process size: a 16-core worker
/// gets what eight 2-slot workers would, so the per-slot shares (heap, network segments for
/// an exchange with every other slot) do not shrink as the cores grow.
pub const PROCESS_SIZE_PER_SLOT: u64 = BASE_PROCESS_SIZE / 2;

/// The default `taskmanager.memory.process.size` for a worker of `slots` slots on a host with
/// `host_memory` bytes (`None`: unknown): `BASE_PROCESS_SIZE` for up to two slots, then
/// `PROCESS_SIZE_PER_SLOT` per slot, but at most three quarters of the host's memory (never
/// below `BASE_PROCESS_SIZE`).
pub fn default_process_size(slots: usize, host_memory: Option<u64>) -> u64 {
    let wanted = BASE_PROCESS_SIZE.max(PROCESS_SIZE_PER_SLOT * slots as u64);
    match host_memory {
        Some(host) => wanted.min(host / 4 * 3).max(BASE_PROCESS_SIZE),
        None => wanted,
    }
}

/// This host's memory (`MemTotal` of `/proc/meminfo`), if it can be read.
pub fn host_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            process_size: BASE_PROCESS_SIZE,
            managed_fraction: 0.4,
            network_fraction: 0.1,
            network_min: 64 << 20,
            network_max: 1 << 30,
            segment_size: 32 << 10,
        }
    }
}

/// A memory setting that cannot work.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MemoryConfigError {
    /// The fractions or sizes do not add up.
    #[error("{key} = {value} is invalid: {fix}")]
    Invalid {
        /// The configuration key.
        key: &'static str,
        /// The offending value, as written.
        value: String,
        /// What to set instead.
        fix: String,
    },
}

/// Flink's default of `state.backend.rocksdb.memory.write-buffer-ratio`.
pub const DEFAULT_WRITE_BUFFER_RATIO: f64 = 0.5;
/// Flink's default of `state.backend.rocksdb.memory.high-prio-pool-ratio`.
pub const DEFAULT_HIGH_PRIORITY_POOL_RATIO: f64 = 0.1;
/// The default of `state.backend.rocksdb.memory.write-back-ratio` (Weir's own key).
pub const DEFAULT_WRITE_BACK_RATIO: f64 = 0.25;

/// How RocksDB divides a slot's managed share (`state.backend.rocksdb.memory.*`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RocksDbMemoryRatios {
    /// `state.backend.rocksdb.memory.write-buffer-ratio`: share of the managed memory that
    /// memtables (write buffers) may take.
    pub write_buffer_ratio: f64,
    /// `state.backend.rocksdb.memory.high-prio-pool-ratio`: share of the block cache kept for
    /// index and filter blocks.
    pub high_priority_pool_ratio: f64,
    /// `state.backend.rocksdb.memory.write-back-ratio`: share of the managed memory that the
    /// write-back cache of value states in front of RocksDB may take (0 turns it off); the
    /// block cache gets the rest.
    pub write_back_ratio: f64,
}

impl Default for RocksDbMemoryRatios {
    fn default() -> Self {
        RocksDbMemoryRatios {
            write_buffer_ratio: DEFAULT_WRITE_BUFFER_RATIO,
            high_priority_pool_ratio: DEFAULT_HIGH_PRIORITY_POOL_RATIO,
            write_back_ratio: DEFAULT_WRITE_BACK_RATIO,
        }
    }
}

impl RocksDbMemoryRatios {
    /// Checks that the ratios are fractions RocksDB can use, and that the memtables fit the
    /// block cache the write-back cache leaves.
    pub fn validate(&self) -> Result<(), MemoryConfigError> {
        let invalid = |key: &'static str, value: f64, fix: &str| {
            Err(MemoryConfigError::Invalid {
                key,
                value: value.to_string(),
                fix: fix.to_string(),
            })
        };
        if !(self.write_buffer_ratio > 0.0 && self.write_buffer_ratio < 1.0) {
            return invalid(
                "state.backend.rocksdb.memory.write-buffer-ratio",
                self.write_buffer_ratio,
                "use a fraction in (0, 1), e.g. 0.5",
            );
        }
        if !(0.0..1.0).contains(&self.high_priority_pool_ratio) {
            return invalid(
                "state.backend.rocksdb.memory.high-prio-pool-ratio",
                self.high_priority_pool_ratio,
                "use a fraction in [0, 1), e.g. 0.1",
            );
        }
        if !(0.0..1.0).contains(&self.write_back_ratio) {
            return invalid(
                "state.backend.rocksdb.memory.write-back-ratio",
                self.write_back_ratio,
                "use a fraction in [0, 1), e.g. 0.1 (0 turns the write-back cache off)",
            );
        }
        if self.write_buffer_ratio + self.write_back_ratio >= 1.0 {
            return invalid(
                "state.backend.rocksdb.memory.write-back-ratio",
                self.write_back_ratio,
                &format!(
                    "memtables (state.backend.rocksdb.memory.write-buffer-ratio = {}) are charged \
                     to the block cache, which gets what the write-back cache leaves: keep the \
                     two ratios' sum below 1",
                    self.write_buffer_ratio
                ),
            );
        }
        Ok(())
    }
}

/// RocksDB's use of one slot's managed share: a write-back cache of value states in front of
/// RocksDB, and one block cache per slot with a write buffer manager charged to it.
///
/// The memtables' memory is charged to the cache, and the cache has a strict capacity, so
/// the cache's capacity bounds blocks, index and filter blocks and memtables together: it is
/// the managed share less the write-back cache. (Flink sizes its cache to `(3 - ratio) / 3` of the share and the
/// write buffer manager to `2 * ratio / 3`, leaving room for overshoot, because its cache is
/// not strict, FLINK-15532.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RocksDbBudget {
    /// Capacity of the slot's block cache, in bytes.
    pub block_cache: u64,
    /// Limit of the slot's write buffer manager (all memtables of the slot), in bytes; part
    /// of the cache, not in addition to it.
    pub write_buffers: u64,
    /// Part of the cache kept for index and filter blocks (the high-priority pool), in bytes.
    pub high_priority_pool: u64,
    /// Capacity of the write-back cache of value states, in bytes; beside the block cache.
    pub write_back_cache: u64,
}

impl RocksDbBudget {
    /// RocksDB's budget for a managed share of `managed` bytes.
    pub fn new(managed: u64, ratios: RocksDbMemoryRatios) -> RocksDbBudget {
        let share = |ratio: f64| (managed as f64 * ratio) as u64;
        let write_back_cache = share(ratios.write_back_ratio);
        RocksDbBudget {
            block_cache: managed - write_back_cache,
            write_buffers: share(ratios.write_buffer_ratio),
            high_priority_pool: share(ratios.high_priority_pool_ratio),
            write_back_cache,
        }
    }
}

/// The shares of one slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotBudget {
    /// Bytes for the state backend (RocksDB cache and write buffers).
    pub managed: u64,
    /// How RocksDB divides `managed`.
    pub rocksdb: RocksDbBudget,
    /// Bytes for network segments.
    pub network: u64,
    /// Bytes left for the heap (operators, heap state, user code).
    pub heap: u64,
    /// Number of network segments in the slot's pool.
    pub segments: usize,
    /// Size of one network segment, in bytes.
    pub segment_size: usize,
}

impl MemoryConfig {
    /// Checks that the settings can be satisfied at all.
    pub fn validate(&self) -> Result<(), MemoryConfigError> {
        let invalid = |key: &'static str, value: String, fix: &str| {
            Err(MemoryConfigError::Invalid {
                key,
                value,
                fix: fix.to_string(),
            })
        };
        if !(0.0..1.0).contains(&self.managed_fraction) {
            return invalid(
                "taskmanager.memory.managed.fraction",
                self.managed_fraction.to_string(),
                "use a fraction in [0, 1), e.g. 0.4",
            );
        }
        if !(0.0..1.0).contains(&self.network_fraction) || self.network_fraction == 0.0 {
            return invalid(
                "taskmanager.memory.network.fraction",
                self.network_fraction.to_string(),
                "use a fraction in (0, 1), e.g. 0.1",
            );
        }
        if self.managed_fraction + self.network_fraction >= 0.9 {
            return invalid(
                "taskmanager.memory.managed.fraction",
                self.managed_fraction.to_string(),
                "managed + network fractions must leave at least 10% for the heap",
            );
        }
        if self.network_min > self.network_max {
            return invalid(
                "taskmanager.memory.network.min",
                self.network_min.to_string(),
                "it must not exceed taskmanager.memory.network.max",
            );
        }
        if self.segment_size < 4096 || !self.segment_size.is_power_of_two() {
            return invalid(
                "taskmanager.memory.segment-size",
                self.segment_size.to_string(),
                "use a power of two of at least 4kb, e.g. 32kb",
            );
        }
        Ok(())
    }

    /// The network share of the whole process, after min/max clamping.
    pub fn network_total(&self) -> u64 {
        let wanted = (self.process_size as f64 * self.network_fraction) as u64;
        wanted
            .clamp(self.network_min, self.network_max)
            .min(self.process_size)
    }

    /// The per-slot shares for a worker with `slots` slots, with RocksDB's default ratios.
    pub fn slot_budget(&self, slots: usize) -> SlotBudget {
        self.worker_budget(slots).slot
    }

    /// The whole worker's budget for `slots` slots, with RocksDB's default ratios.
    pub fn worker_budget(&self, slots: usize) -> WorkerBudget {
        self.worker_budget_with(slots, RocksDbMemoryRatios::default())
    }

    /// The whole worker's budget for `slots` slots (at least 1).
    pub fn worker_budget_with(&self, slots: usize, rocksdb: RocksDbMemoryRatios) -> WorkerBudget {
        let slots = slots.max(1);
        let per_slot = |total: u64| total / slots as u64;
        let managed_total = (self.process_size as f64 * self.managed_fraction) as u64;
        let network_total = self.network_total();
        let heap_total = self
            .process_size
            .saturating_sub(managed_total + network_total);
        let managed = per_slot(managed_total);
        let network = per_slot(network_total);
        WorkerBudget {
            config: self.clone(),
            rocksdb_ratios: rocksdb,
            slots,
            managed_total,
            network_total,
            heap_total,
            slot: SlotBudget {
                managed,
                rocksdb: RocksDbBudget::new(managed, rocksdb),
                network,
                heap: per_slot(heap_total),
                segments: (network / self.segment_size as u64) as usize,
                segment_size: self.segment_size,
            },
        }
    }
}

/// A worker's memory: the totals of each share and what one slot gets. Its `Display` is the
/// table `weir run --explain-memory` prints, naming the key that sets each number.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerBudget {
    /// The settings the budget comes from.
    pub config: MemoryConfig,
    /// How RocksDB divides the managed share.
    pub rocksdb_ratios: RocksDbMemoryRatios,
    /// Number of slots sharing the worker.
    pub slots: usize,
    /// Managed memory of the whole worker, in bytes.
    pub managed_total: u64,
    /// Network memory of the whole worker, in bytes.
    pub network_total: u64,
    /// Heap of the whole worker, in bytes.
    pub heap_total: u64,
    /// What each slot gets.
    pub slot: SlotBudget,
}

impl WorkerBudget {
    /// Which setting decided the network share: the fraction, or a bound it was clamped to.
    fn network_source(&self) -> String {
        let config = &self.config;
        let fraction = format!(
            "taskmanager.memory.network.fraction = {}",
            config.network_fraction
        );
        let wanted = (config.process_size as f64 * config.network_fraction) as u64;
        if self.network_total == wanted {
            format!(
                "{fraction} (within .min {} and .max {})",
                Mib(config.network_min),
                Mib(config.network_max)
            )
        } else if self.network_total == config.network_min {
            format!(
                "taskmanager.memory.network.min = {} (the fraction gives less)",
                Mib(config.network_min)
            )
        } else if self.network_total == config.network_max {
            format!(
                "taskmanager.memory.network.max = {} (the fraction gives more)",
                Mib(config.network_max)
            )
        } else {
            "taskmanager.memory.process.size (the network minimum does not fit)".to_string()
        }
    }
}

impl fmt::Display for WorkerBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.config;
        let slot = &self.slot;
        let slots = self.slots as u64;
        let ratios = &self.rocksdb_ratios;
        writeln!(
            f,
            "Memory of one worker with {} slot(s) (taskmanager.numberOfTaskSlots):",
            self.slots
        )?;
        writeln!(f)?;
        let row =
            |f: &mut fmt::Formatter<'_>, share: &str, worker: &str, per_slot: &str, key: &str| {
                writeln!(f, "{share:<24} {worker:>14} {per_slot:>14}   {key}")
            };
        row(f, "share", "worker", "per slot", "set by")?;
        row(
            f,
            "process",
            &Mib(config.process_size).to_string(),
            &Mib(config.process_size / slots).to_string(),
            &format!(
                "taskmanager.memory.process.size = {}",
                Mib(config.process_size)
            ),
        )?;
        row(
            f,
            "managed",
            &Mib(self.managed_total).to_string(),
            &Mib(slot.managed).to_string(),
            &format!(
                "taskmanager.memory.managed.fraction = {}",
                config.managed_fraction
            ),
        )?;
        row(
            f,
            "  RocksDB block cache",
            "",
            &Mib(slot.rocksdb.block_cache).to_string(),
            "the managed share less the write-back cache (write buffers are charged to it)",
        )?;
        row(
            f,
            "  RocksDB write buffers",
            "",
            &Mib(slot.rocksdb.write_buffers).to_string(),
            &format!(
                "state.backend.rocksdb.memory.write-buffer-ratio = {}",
                ratios.write_buffer_ratio
            ),
        )?;
        row(
            f,
            "  RocksDB high-prio pool",
            "",
            &Mib(slot.rocksdb.high_priority_pool).to_string(),
            &format!(
                "state.backend.rocksdb.memory.high-prio-pool-ratio = {} (index and filter blocks)",
                ratios.high_priority_pool_ratio
            ),
        )?;
        row(
            f,
            "  RocksDB write-back",
            "",
            &Mib(slot.rocksdb.write_back_cache).to_string(),
            &format!(
                "state.backend.rocksdb.memory.write-back-ratio = {} (hot value state)",
                ratios.write_back_ratio
            ),
        )?;
        row(
            f,
            "network",
            &Mib(self.network_total).to_string(),
            &Mib(slot.network).to_string(),
            &self.network_source(),
        )?;
        let segment_size = Mib(slot.segment_size as u64);
        row(
            f,
            "  segments",
            &format!("{} x {segment_size}", slot.segments as u64 * slots),
            &format!("{} x {segment_size}", slot.segments),
            &format!("taskmanager.memory.segment-size = {segment_size}"),
        )?;
        row(
            f,
            "heap",
            &Mib(self.heap_total).to_string(),
            &Mib(slot.heap).to_string(),
            "the rest of taskmanager.memory.process.size",
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "The managed share is RocksDB's (state.backend.type: rocksdb); with the heap backend, \
             state lives in the heap share."
        )?;
        writeln!(
            f,
            "Each shard's heap use is counted per thread by the counting allocator."
        )
    }
}

impl fmt::Display for SlotBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "managed {} MiB, network {} MiB ({} segments of {} KiB), heap {} MiB",
            self.managed >> 20,
            self.network >> 20,
            self.segments,
            self.segment_size >> 10,
            self.heap >> 20
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_process_size_grows_with_slots_within_the_host() {
        const GIB: u64 = 1 << 30;
        // Up to two slots: Flink's TaskManager default, whatever the host.
        assert_eq!(default_process_size(1, Some(64 * GIB)), BASE_PROCESS_SIZE);
        assert_eq!(default_process_size(2, None), BASE_PROCESS_SIZE);
        // Beyond: each slot keeps a 2-slot worker's shares.
        assert_eq!(
            default_process_size(16, Some(128 * GIB)),
            16 * PROCESS_SIZE_PER_SLOT
        );
        let per_slot = |slots: usize| {
            let config = MemoryConfig {
                process_size: default_process_size(slots, None),
                ..MemoryConfig::default()
            };
            config.slot_budget(slots)
        };
        // The heap share per slot does not shrink; the network share is capped by
        // taskmanager.memory.network.max (1 GiB: 64 MiB a slot of 16).
        assert!(per_slot(16).heap >= per_slot(2).heap);
        assert_eq!(per_slot(16).segments, (64 << 20) / (32 << 10));
        // A host smaller than that: three quarters of it, never below the base.
        assert_eq!(default_process_size(16, Some(8 * GIB)), 6 * GIB);
        assert_eq!(default_process_size(16, Some(GIB)), BASE_PROCESS_SIZE);
        assert!(host_memory().is_some_and(|bytes| bytes > BASE_PROCESS_SIZE / 4));
    }

    #[test]
    fn default_budget_splits_by_fraction() {
        let config = MemoryConfig::default();
        config.validate().unwrap();
        let budget = config.slot_budget(2);
        // 10% of 1728 MiB = 172.8 MiB network, split over 2 slots.
        assert_eq!(budget.network, ((1728u64 << 20) / 10) / 2);
        assert_eq!(budget.segments, (budget.network / (32 << 10)) as usize);
        assert_eq!(budget.managed, ((1728u64 << 20) as f64 * 0.4) as u64 / 2);
        assert!(budget.heap > 0);
    }

    #[test]
    fn network_share_is_clamped() {
        let config = MemoryConfig {
            process_size: 100 << 20,
            ..MemoryConfig::default()
        };
        assert_eq!(config.network_total(), 64 << 20);
        let config = MemoryConfig {
            process_size: 100 << 30,
            ..MemoryConfig::default()
        };
        assert_eq!(config.network_total(), 1 << 30);
    }

    /// 2 GiB over 2 slots, worked by hand:
    /// managed 0.4 x 2147483648 = 858993459 (819.2 MiB), 429496729 per slot (409.6 MiB);
    /// network 0.1 x 2147483648 = 214748364 (204.8 MiB, inside [64 MiB, 1 GiB]), 107374182
    /// per slot = 3276 segments of 32 KiB; heap 2147483648 - 858993459 - 214748364 =
    /// 1073741825, 536870912 per slot (512 MiB). RocksDB per slot: write-back cache 0.25 x =
    /// 107374182 (102.4 MiB), block cache the rest = 322122547 (307.2 MiB), write buffers 0.5 x =
    /// 214748364 (204.8 MiB), high-priority pool 0.1 x = 42949672 (41.0 MiB).
    fn two_gib_two_slots() -> WorkerBudget {
        MemoryConfig {
            process_size: 2 << 30,
            ..MemoryConfig::default()
        }
        .worker_budget(2)
    }

    #[test]
    fn rocksdb_gets_the_managed_share_with_flink_ratios() {
        let budget = two_gib_two_slots();
        assert_eq!(budget.managed_total, 858_993_459);
        assert_eq!(budget.network_total, 214_748_364);
        assert_eq!(budget.heap_total, 1_073_741_825);
        assert_eq!(
            budget.slot,
            SlotBudget {
                managed: 429_496_729,
                rocksdb: RocksDbBudget {
                    block_cache: 322_122_547,
                    write_buffers: 214_748_364,
                    high_priority_pool: 42_949_672,
                    write_back_cache: 107_374_182,
                },
                network: 107_374_182,
                heap: 536_870_912,
                segments: 3276,
                segment_size: 32 << 10,
            }
        );
        let custom = RocksDbMemoryRatios {
            write_buffer_ratio: 0.25,
            high_priority_pool_ratio: 0.0,
            write_back_ratio: 0.0,
        };
        assert_eq!(
            RocksDbBudget::new(400 << 20, custom),
            RocksDbBudget {
                block_cache: 400 << 20,
                write_buffers: 100 << 20,
                high_priority_pool: 0,
                write_back_cache: 0,
            }
        );
        assert_eq!(
            MemoryConfig::default().slot_budget(0),
            MemoryConfig::default().slot_budget(1)
        );
    }

    #[test]
    fn the_table_shows_every_figure_and_its_key() {
        let table = two_gib_two_slots().to_string();
        let expected = [
            "Memory of one worker with 2 slot(s) (taskmanager.numberOfTaskSlots):",
            "",
            "share                            worker       per slot   set by",
            "process                        2048 MiB       1024 MiB   taskmanager.memory.process.size = 2048 MiB",
            "managed                       819.2 MiB      409.6 MiB   taskmanager.memory.managed.fraction = 0.4",
            "  RocksDB block cache                        307.2 MiB   the managed share less the write-back cache (write buffers are charged to it)",
            "  RocksDB write buffers                      204.8 MiB   state.backend.rocksdb.memory.write-buffer-ratio = 0.5",
            "  RocksDB high-prio pool                      41.0 MiB   state.backend.rocksdb.memory.high-prio-pool-ratio = 0.1 (index and filter blocks)",
            "  RocksDB write-back                         102.4 MiB   state.backend.rocksdb.memory.write-back-ratio = 0.25 (hot value state)",
            "network                       204.8 MiB      102.4 MiB   taskmanager.memory.network.fraction = 0.1 (within .min 64 MiB and .max 1024 MiB)",
            "  segments                6552 x 32 KiB  3276 x 32 KiB   taskmanager.memory.segment-size = 32 KiB",
            "heap                         1024.0 MiB        512 MiB   the rest of taskmanager.memory.process.size",
            "",
        ];
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[..expected.len()], expected, "\n{table}");
        assert!(table.contains("state.backend.type: rocksdb"), "{table}");
    }

    #[test]
    fn the_table_says_when_the_network_share_is_clamped() {
        let small = MemoryConfig {
            process_size: 100 << 20,
            ..MemoryConfig::default()
        };
        let table = small.worker_budget(1).to_string();
        assert!(
            table.contains("taskmanager.memory.network.min = 64 MiB (the fraction gives less)"),
            "{table}"
        );
        let big = MemoryConfig {
            process_size: 100 << 30,
            ..MemoryConfig::default()
        };
        let table = big.worker_budget(4).to_string();
        assert!(
            table.contains("taskmanager.memory.network.max = 1024 MiB (the fraction gives more)"),
            "{table}"
        );
    }

    #[test]
    fn bad_rocksdb_ratios_name_key_and_fix() {
        RocksDbMemoryRatios::default().validate().unwrap();
        let err = RocksDbMemoryRatios {
            write_buffer_ratio: 1.0,
            ..RocksDbMemoryRatios::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("state.backend.rocksdb.memory.write-buffer-ratio = 1 is invalid"),
            "{err}"
        );
        let err = RocksDbMemoryRatios {
            high_priority_pool_ratio: -0.1,
            ..RocksDbMemoryRatios::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(err.contains("high-prio-pool-ratio = -0.1"), "{err}");
        let err = RocksDbMemoryRatios {
            write_buffer_ratio: 0.6,
            write_back_ratio: 0.4,
            ..RocksDbMemoryRatios::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(err.contains("write-back-ratio = 0.4 is invalid"), "{err}");
        assert!(err.contains("write-buffer-ratio = 0.6"), "{err}");
        RocksDbMemoryRatios {
            write_back_ratio: 0.0,
            ..RocksDbMemoryRatios::default()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn bad_settings_name_key_and_fix() {
        let config = MemoryConfig {
            segment_size: 1000,
            ..MemoryConfig::default()
        };
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("taskmanager.memory.segment-size = 1000"),
            "{err}"
        );
        assert!(err.contains("power of two"), "{err}");
        let config = MemoryConfig {
            network_fraction: 0.0,
            ..MemoryConfig::default()
        };
        assert!(config.validate().is_err());
    }
}
