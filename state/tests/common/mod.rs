//! Backend fixtures shared by the integration tests: the same test body runs against the heap
//! backend, the RocksDB backend, and the RocksDB backend behind a write-back cache so small
//! that it evicts all the time.

#![allow(dead_code)]

use std::sync::Arc;

use tempfile::TempDir;
use weir_state::{
    KeyedBackendConfig, LocalKeyedBackend, ManualClock, RocksDbConfig, RocksDbInstance, StateCodec,
    StateKey,
};

/// Which backend a fixture builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Heap,
    RocksDb,
}

/// A clock, and for RocksDB a slot database in a temporary directory.
pub struct Fixture {
    pub kind: Kind,
    pub clock: ManualClock,
    pub slot: Option<Arc<RocksDbInstance>>,
    pub dir: Option<TempDir>,
}

impl Fixture {
    pub fn heap() -> Fixture {
        Fixture {
            kind: Kind::Heap,
            clock: ManualClock::new(1_000_000),
            slot: None,
            dir: None,
        }
    }

    pub fn rocksdb() -> Fixture {
        Fixture::rocksdb_with_write_back(0)
    }

    /// RocksDB behind a write-back cache of a few entries: every test body then also reads
    /// entries back that eviction wrote to RocksDB.
    pub fn rocksdb_evicting() -> Fixture {
        Fixture::rocksdb_with_write_back(4 << 10)
    }

    /// RocksDB behind a write-back cache that holds everything a test writes: RocksDB sees the
    /// values only when something flushes the cache.
    pub fn rocksdb_cached() -> Fixture {
        Fixture::rocksdb_with_write_back(8 << 20)
    }

    fn rocksdb_with_write_back(write_back_bytes: usize) -> Fixture {
        let clock = ManualClock::new(1_000_000);
        let dir = tempfile::tempdir().expect("temporary directory");
        let config = RocksDbConfig::new(dir.path().join("db"), 16 << 20, 8 << 20)
            .with_write_back(write_back_bytes);
        let slot = RocksDbInstance::open(config, Arc::new(clock.clone())).expect("open RocksDB");
        Fixture {
            kind: Kind::RocksDb,
            clock,
            slot: Some(slot),
            dir: Some(dir),
        }
    }

    /// A backend over all key groups of `max_parallelism`.
    pub fn backend<K, N>(&self, max_parallelism: u32) -> LocalKeyedBackend<K, N>
    where
        K: StateKey + StateCodec,
        N: StateKey + StateCodec,
    {
        self.backend_for(KeyedBackendConfig::single(max_parallelism), "op")
    }

    /// A backend for `config`; on RocksDB, for operator `operator`.
    pub fn backend_for<K, N>(
        &self,
        config: KeyedBackendConfig,
        operator: &str,
    ) -> LocalKeyedBackend<K, N>
    where
        K: StateKey + StateCodec,
        N: StateKey + StateCodec,
    {
        match &self.slot {
            None => {
                LocalKeyedBackend::heap(config, Arc::new(self.clock.clone())).expect("heap backend")
            }
            Some(slot) => LocalKeyedBackend::rocksdb(config, Arc::clone(slot), operator)
                .expect("RocksDB backend"),
        }
    }
}
