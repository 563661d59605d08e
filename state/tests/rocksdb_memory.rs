//! RocksDB-backed state grows far beyond its block cache while the process's resident memory
//! stays near the slot's managed-memory budget.
//!
//! Writes `WEIR_STATE_MEMORY_TEST_MIB` MiB (default 1024) of incompressible 4 KiB values through
//! a `ValueState` with a 64 MiB budget (block cache 64 MiB, of which memtables may take 32 MiB),
//! reads a random sample back, and checks the peak resident set (`VmHWM`, the kernel's
//! high-water mark, so no peak is missed between samples) against the budget plus 200 MiB of
//! slack for the test binary, RocksDB's threads, allocator arenas and compaction buffers. It
//! runs in its own test binary so no other test's memory counts. Run with `--nocapture` to see
//! the numbers.

use std::sync::Arc;
use std::time::Instant;

use weir_state::{
    KeyedBackendConfig, LocalKeyedBackend, RocksDbConfig, RocksDbInstance, SystemClock,
    ValueStateDescriptor,
};

const MIB: u64 = 1 << 20;
const VALUE_BYTES: usize = 4096;
const BUDGET: u64 = 64 * MIB;
const SLACK: u64 = 200 * MIB;

/// A field of `/proc/self/status` in bytes (the kernel reports kB).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|line| line.starts_with(field))
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"));
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|value| value.parse().ok())
        .expect("a number of kB");
    kb * 1024
}

/// Deterministic, incompressible bytes for `key` (xorshift64*).
fn fill(value: &mut [u8], key: u64) {
    let mut state = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in value.chunks_exact_mut(8) {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        chunk.copy_from_slice(&state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
}

fn directory_bytes(path: &std::path::Path) -> u64 {
    std::fs::read_dir(path)
        .expect("database directory")
        .filter_map(Result::ok)
        .filter_map(|entry| entry.metadata().ok())
        .map(|metadata| metadata.len())
        .sum()
}

#[test]
fn rocksdb_state_far_beyond_its_cache_stays_within_budget() {
    let total_mib: u64 = std::env::var("WEIR_STATE_MEMORY_TEST_MIB")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(1024);
    let keys = total_mib * MIB / VALUE_BYTES as u64;
    let start_rss = status_bytes("VmRSS:");

    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("db");
    let slot = RocksDbInstance::open(
        RocksDbConfig::new(&path, BUDGET as usize, (BUDGET / 2) as usize),
        Arc::new(SystemClock),
    )
    .expect("open RocksDB");
    let backend: LocalKeyedBackend<u64> =
        LocalKeyedBackend::rocksdb(KeyedBackendConfig::single(128), Arc::clone(&slot), "memory")
            .expect("RocksDB backend");
    let blobs = backend
        .value_state(&ValueStateDescriptor::<Vec<u8>>::new("blobs"))
        .expect("register state");

    let started = Instant::now();
    let mut value = vec![0u8; VALUE_BYTES];
    let mut sampled_peak = start_rss;
    for key in 0..keys {
        fill(&mut value, key);
        backend.set_current_key(&key).expect("key");
        blobs.update(value.clone()).expect("write");
        if key % 8192 == 0 {
            sampled_peak = sampled_peak.max(status_bytes("VmRSS:"));
        }
    }
    let write_seconds = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let mut expected = vec![0u8; VALUE_BYTES];
    let mut state = 0x1234_5678_u64;
    let reads = 20_000;
    for _ in 0..reads {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        let key = (state >> 33) % keys;
        backend.set_current_key(&key).expect("key");
        let stored = blobs.value().expect("read").expect("present");
        fill(&mut expected, key);
        assert!(stored == expected, "value of key {key} differs");
    }
    let read_seconds = started.elapsed().as_secs_f64();
    let end_rss = status_bytes("VmRSS:");
    let peak_rss = status_bytes("VmHWM:").max(sampled_peak);
    let usage = slot.memory_usage();
    let on_disk = directory_bytes(&path);

    eprintln!(
        "wrote {total_mib} MiB ({keys} values of {VALUE_BYTES} B) in {write_seconds:.1} s \
         ({:.0} MiB/s), read {reads} random values in {read_seconds:.1} s",
        total_mib as f64 / write_seconds
    );
    eprintln!(
        "RSS: start {} MiB, peak {} MiB (+{} MiB), end {} MiB; budget {} MiB + slack {} MiB; \
         on disk {} MiB",
        start_rss / MIB,
        peak_rss / MIB,
        (peak_rss - start_rss) / MIB,
        end_rss / MIB,
        BUDGET / MIB,
        SLACK / MIB,
        on_disk / MIB
    );
    eprintln!("RocksDB accounting: {usage:?}");

    assert!(
        on_disk >= total_mib * MIB * 9 / 10,
        "the state must really be far beyond the cache: {} MiB on disk",
        on_disk / MIB
    );
    assert!(
        peak_rss - start_rss <= BUDGET + SLACK,
        "resident memory grew by {} MiB, more than the {} MiB budget + {} MiB slack",
        (peak_rss - start_rss) / MIB,
        BUDGET / MIB,
        SLACK / MIB
    );
}
