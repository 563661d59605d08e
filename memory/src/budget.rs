//! Memory budgets: how a worker's process size splits into per-slot shares.

use std::fmt;

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

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            process_size: 1728 << 20,
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

/// The shares of one slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotBudget {
    /// Bytes for the state backend (RocksDB cache and write buffers).
    pub managed: u64,
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

    /// The per-slot shares for a worker with `slots` slots.
    pub fn slot_budget(&self, slots: usize) -> SlotBudget {
        let slots = slots.max(1) as u64;
        let managed_total = (self.process_size as f64 * self.managed_fraction) as u64;
        let network_total = self.network_total();
        let heap_total = self
            .process_size
            .saturating_sub(managed_total + network_total);
        let network = network_total / slots;
        SlotBudget {
            managed: managed_total / slots,
            network,
            heap: heap_total / slots,
            segments: (network / self.segment_size as u64) as usize,
            segment_size: self.segment_size,
        }
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
