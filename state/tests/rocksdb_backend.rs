//! RocksDB-only behaviour: compaction-time TTL, native checkpoints, column families per
//! operator, corrupt data and configuration errors.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::Fixture;
use weir_state::{
    split_key, KeyGroup, KeyedBackendConfig, ListStateDescriptor, LocalKeyedBackend, ManualClock,
    MapStateDescriptor, NativeSource, RocksDbConfig, RocksDbInstance, StateErrorKind,
    StateTtlConfig, ValueStateDescriptor, HELD_WRITES_FILE,
};

/// Operator `op`'s backend over all 128 key groups, on a database opened on the checkpoint
/// files in `dir`.
fn restored_backend(dir: &std::path::Path) -> LocalKeyedBackend<u64> {
    let instance = RocksDbInstance::open(
        RocksDbConfig::new(dir, 8 << 20, 4 << 20),
        Arc::new(ManualClock::new(0)),
    )
    .unwrap();
    LocalKeyedBackend::rocksdb(KeyedBackendConfig::single(128), instance, "op").unwrap()
}

fn raw_count(backend: &LocalKeyedBackend<u64>, state: &str) -> usize {
    let slot = backend.rocksdb_slot().unwrap();
    slot.raw_entries(&backend.column_family(state).unwrap(), backend.key_groups())
        .unwrap()
        .map(Result::unwrap)
        .count()
}

#[test]
fn compaction_drops_expired_entries() {
    compaction_drops_expired(&Fixture::rocksdb());
}

/// The cache holds the values until the compaction writes them back.
#[test]
fn compaction_drops_expired_entries_behind_the_write_back_cache() {
    compaction_drops_expired(&Fixture::rocksdb_cached());
}

fn compaction_drops_expired(f: &Fixture) {
    let backend: LocalKeyedBackend<u64> = f.backend(128);
    let ttl = StateTtlConfig::new(Duration::from_millis(100));
    let value = backend
        .value_state(&ValueStateDescriptor::<u64>::new("v").with_ttl(ttl))
        .unwrap();
    let list = backend
        .list_state(&ListStateDescriptor::<u64>::new("l").with_ttl(ttl))
        .unwrap();
    let map = backend
        .map_state(&MapStateDescriptor::<u64, u64>::new("m").with_ttl(ttl))
        .unwrap();
    let forever = backend
        .value_state(&ValueStateDescriptor::<u64>::new("forever"))
        .unwrap();
    for key in 0..1000u64 {
        backend.set_current_key(&key).unwrap();
        value.update(key).unwrap();
        list.add(key).unwrap();
        map.put_all([(1, key), (2, key)]).unwrap();
        forever.update(key).unwrap();
    }
    // Keys 0..10 get a list element that is still live later: their lists must survive.
    f.clock.advance(Duration::from_millis(50));
    for key in 0..10u64 {
        backend.set_current_key(&key).unwrap();
        list.add(key + 1).unwrap();
    }
    let slot = backend.rocksdb_slot().unwrap();
    slot.compact_all().unwrap();
    assert_eq!(raw_count(&backend, "v"), 1000, "nothing expired yet");
    assert_eq!(raw_count(&backend, "m"), 2000);

    f.clock.advance(Duration::from_millis(60));
    slot.compact_all().unwrap();
    assert_eq!(raw_count(&backend, "v"), 0);
    assert_eq!(raw_count(&backend, "m"), 0);
    assert_eq!(raw_count(&backend, "l"), 10, "partly live lists are kept");
    assert_eq!(raw_count(&backend, "forever"), 1000);
    backend.set_current_key(&3).unwrap();
    assert_eq!(
        list.get().unwrap(),
        [4],
        "the expired element is dropped on read"
    );
    assert_eq!(forever.value().unwrap(), Some(3));
}

#[test]
fn checkpoint_opens_and_holds_the_data() {
    checkpoint_holds_the_data(&Fixture::rocksdb());
}

/// A checkpoint writes the cache back first: values only the cache held are in it.
#[test]
fn checkpoint_holds_what_only_the_write_back_cache_held() {
    checkpoint_holds_the_data(&Fixture::rocksdb_cached());
}

fn checkpoint_holds_the_data(f: &Fixture) {
    let backend: LocalKeyedBackend<u64> = f.backend(128);
    let value = backend
        .value_state(&ValueStateDescriptor::<String>::new("v"))
        .unwrap();
    let list = backend
        .list_state(&ListStateDescriptor::<u64>::new("l"))
        .unwrap();
    let map = backend
        .map_state(&MapStateDescriptor::<u64, u64>::new("m"))
        .unwrap();
    for key in 0..500u64 {
        backend.set_current_key(&key).unwrap();
        value.update(format!("v{key}")).unwrap();
        list.add_all([key, key + 1]).unwrap();
        list.add(key + 2).unwrap();
        map.put(key, key * 3).unwrap();
    }
    let checkpoint = f.dir.as_ref().unwrap().path().join("chk-1");
    let slot = backend.rocksdb_slot().unwrap();
    let cached_before = slot.write_back_stats();
    slot.create_checkpoint(&checkpoint).unwrap();
    if let (Some(before), Some(after)) = (cached_before, slot.write_back_stats()) {
        assert_eq!(before.written, 0, "the cache held every value");
        assert_eq!(after.written, 500, "the checkpoint wrote them back");
    }
    // Writes after the checkpoint do not reach it.
    for key in 0..500u64 {
        backend.set_current_key(&key).unwrap();
        value.update("later".into()).unwrap();
        list.add(99).unwrap();
    }
    // The checkpoint directory holds SST files (hard links) and opens as a database.
    let files: Vec<String> = std::fs::read_dir(&checkpoint)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(files.iter().any(|name| name.ends_with(".sst")), "{files:?}");
    assert!(
        files.iter().any(|name| name.starts_with("MANIFEST")),
        "{files:?}"
    );

    let restored = restored_backend(&checkpoint);
    let value = restored
        .value_state(&ValueStateDescriptor::<String>::new("v"))
        .unwrap();
    let list = restored
        .list_state(&ListStateDescriptor::<u64>::new("l"))
        .unwrap();
    let map = restored
        .map_state(&MapStateDescriptor::<u64, u64>::new("m"))
        .unwrap();
    for key in 0..500u64 {
        restored.set_current_key(&key).unwrap();
        assert_eq!(value.value().unwrap(), Some(format!("v{key}")));
        assert_eq!(list.get().unwrap(), [key, key + 1, key + 2]);
        assert_eq!(map.get(&key).unwrap(), Some(key * 3));
    }
    // The restored database takes list appends (its merge operator came back with it).
    restored.set_current_key(&0).unwrap();
    list.add(5).unwrap();
    assert_eq!(list.get().unwrap(), [0, 1, 2, 5]);
}

/// A cut lists the files that hold the state at the cut without flushing the memtables first
/// (the logs up to their length then) and without writing the write-back cache back (its dirty
/// entries are copied into a file of their own), hard-linked into its directory. Later writes
/// and a compaction make the instance's files obsolete and RocksDB deletes them, but the
/// cut's links keep them; copied out up to their listed lengths, they open as the state at
/// the cut.
#[test]
fn a_cut_holds_the_state_at_the_cut_without_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    let config = RocksDbConfig::new(dir.path().join("db"), 16 << 20, 8 << 20)
        .with_write_back(8 << 20)
        .with_write_ahead_log(true);
    let instance = RocksDbInstance::open(config, Arc::new(ManualClock::new(0))).unwrap();
    let backend: LocalKeyedBackend<u64> =
        LocalKeyedBackend::rocksdb(KeyedBackendConfig::single(128), Arc::clone(&instance), "op")
            .unwrap();
    let value = backend
        .value_state(&ValueStateDescriptor::<String>::new("v"))
        .unwrap();
    let list = backend
        .list_state(&ListStateDescriptor::<u64>::new("l"))
        .unwrap();
    let write = |keys: std::ops::Range<u64>, round: u64| {
        for key in keys {
            backend.set_current_key(&key).unwrap();
            value.update(format!("{key}-{round}")).unwrap();
            list.add(round).unwrap();
        }
    };
    // Round 0 in SST files, round 1 for half the keys in memtables (and the log) only.
    write(0..500, 0);
    instance.compact_all().unwrap();
    write(0..250, 1);
    let sst_files = |dir: &std::path::Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".sst"))
            .collect();
        names.sort();
        names
    };
    let before = sst_files(instance.path());

    let written = instance.write_back_stats().unwrap().written;
    let mut cut = instance.cut(&dir.path().join("cut")).unwrap();
    assert_eq!(
        instance.write_back_stats().unwrap().written,
        written,
        "the cut wrote nothing back"
    );
    let listed: Vec<&str> = cut.files.iter().map(|file| file.name.as_str()).collect();
    let listed_sst: Vec<String> = listed
        .iter()
        .filter(|name| name.ends_with(".sst"))
        .map(|name| name.to_string())
        .collect();
    assert_eq!(
        listed_sst, before,
        "the cut lists the SST files as they were: no flush"
    );
    assert!(
        listed.iter().any(|name| name.ends_with(".log")),
        "{listed:?}"
    );
    assert!(listed.contains(&"CURRENT"), "{listed:?}");
    let mut held = cut
        .held
        .take()
        .expect("the cache held dirty entries at the cut");

    // Later writes, flushed and compacted, make the cut's files obsolete; the held entries
    // they change are copied as they were at the cut first.
    write(0..500, 2);
    instance.compact_all().unwrap();
    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    let mut held_bytes = Vec::new();
    while held.next_piece(&mut held_bytes).unwrap() {}
    std::fs::write(copy.join(HELD_WRITES_FILE), held_bytes).unwrap();
    for file in &cut.files {
        let bytes = match &file.source {
            NativeSource::Bytes(bytes) => bytes.clone(),
            NativeSource::File(path) => {
                assert!(
                    path.starts_with(&cut.dir),
                    "{} is a link in the cut",
                    file.name
                );
                let mut bytes = std::fs::read(path).expect("the cut keeps its files");
                assert!(
                    bytes.len() as u64 >= file.len,
                    "{} is shorter than listed",
                    file.name
                );
                bytes.truncate(file.len as usize);
                bytes
            }
        };
        assert_eq!(bytes.len() as u64, file.len, "{}", file.name);
        std::fs::write(copy.join(&file.name), bytes).unwrap();
    }
    assert!(
        listed_sst
            .iter()
            .all(|name| !instance.path().join(name).exists()),
        "RocksDB deleted the SST files compacted away: the cut pauses deletions only while it \
         links"
    );

    let restored = restored_backend(&copy);
    assert!(
        !copy.join(HELD_WRITES_FILE).exists(),
        "the held entries were written into RocksDB and their file removed"
    );
    let value = restored
        .value_state(&ValueStateDescriptor::<String>::new("v"))
        .unwrap();
    let list = restored
        .list_state(&ListStateDescriptor::<u64>::new("l"))
        .unwrap();
    for key in 0..500u64 {
        restored.set_current_key(&key).unwrap();
        let (round, rounds) = if key < 250 {
            (1, vec![0, 1])
        } else {
            (0, vec![0])
        };
        assert_eq!(
            value.value().unwrap(),
            Some(format!("{key}-{round}")),
            "key {key}"
        );
        assert_eq!(list.get().unwrap(), rounds, "key {key}");
    }
}

/// Only an instance that writes its log can be cut; the error says what to do instead.
#[test]
fn an_instance_without_its_log_is_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let instance = RocksDbInstance::open(
        RocksDbConfig::new(dir.path().join("db"), 8 << 20, 4 << 20),
        Arc::new(ManualClock::new(0)),
    )
    .unwrap();
    let error = instance
        .cut(&dir.path().join("cut"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("write-ahead log"), "{error}");
    assert!(error.contains("create_checkpoint"), "{error}");
}

#[test]
fn operators_sharing_a_slot_are_isolated() {
    let f = Fixture::rocksdb();
    let a: LocalKeyedBackend<u64> = f.backend_for(KeyedBackendConfig::single(128), "a");
    let b: LocalKeyedBackend<u64> = f.backend_for(KeyedBackendConfig::single(128), "b");
    let va = a
        .value_state(&ValueStateDescriptor::<u64>::new("s"))
        .unwrap();
    let vb = b.list_state(&ListStateDescriptor::<u64>::new("s")).unwrap();
    a.set_current_key(&1).unwrap();
    b.set_current_key(&1).unwrap();
    va.update(10).unwrap();
    vb.add(20).unwrap();
    assert_eq!(va.value().unwrap(), Some(10));
    assert_eq!(vb.get().unwrap(), [20]);
    a.delete_key_groups(a.key_groups()).unwrap();
    assert_eq!(va.value().unwrap(), None);
    assert_eq!(vb.get().unwrap(), [20]);
    let names = f.slot.as_ref().unwrap().column_families().unwrap();
    assert!(names.contains(&"value:a:s".to_string()), "{names:?}");
    assert!(names.contains(&"list:b:s".to_string()), "{names:?}");
}

#[test]
fn key_group_deletion_reaches_states_not_registered_in_this_run() {
    let f = Fixture::rocksdb();
    let before: LocalKeyedBackend<u64> = f.backend(128);
    let old = before
        .value_state(&ValueStateDescriptor::<u64>::new("old"))
        .unwrap();
    for key in 0..100u64 {
        before.set_current_key(&key).unwrap();
        old.update(key).unwrap();
    }
    let column_family = before.column_family("old").unwrap();
    drop((old, before));
    // After a restart only "new" is registered; the key groups still go away entirely.
    let after: LocalKeyedBackend<u64> = f.backend(128);
    after
        .value_state(&ValueStateDescriptor::<u64>::new("new"))
        .unwrap();
    let slot = after.rocksdb_slot().unwrap();
    let everything = after.key_groups();
    assert_eq!(
        slot.raw_entries(&column_family, everything)
            .unwrap()
            .count(),
        100
    );
    after.delete_key_groups(everything).unwrap();
    assert_eq!(
        slot.raw_entries(&column_family, everything)
            .unwrap()
            .count(),
        0
    );
}

/// A value created, updated and cleared while the write-back cache holds it never reaches
/// RocksDB: a window pane's life on the RocksDB path.
#[test]
fn short_lived_values_stay_in_the_write_back_cache() {
    let f = Fixture::rocksdb_cached();
    let backend: LocalKeyedBackend<u64, u64> = f.backend(128);
    let count = backend
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    for pane in 0..50u64 {
        backend.set_current_namespace(pane).unwrap();
        for key in 0..100u64 {
            backend.set_current_key(&key).unwrap();
            for _ in 0..5 {
                let n = count.value().unwrap().unwrap_or(0);
                count.update(n + 1).unwrap();
            }
            assert_eq!(count.value().unwrap(), Some(5), "pane {pane}, key {key}");
            count.clear().unwrap();
        }
    }
    let slot = backend.rocksdb_slot().unwrap();
    let stats = slot.write_back_stats().unwrap();
    assert_eq!(
        stats.misses, 5000,
        "one RocksDB read per pane and key: {stats:?}"
    );
    assert_eq!(stats.written, 0, "{stats:?}");
    let usage = slot.memory_usage();
    assert!(
        usage.write_back_usage <= usage.write_back_capacity,
        "{usage:?}"
    );
    assert_eq!(usage.write_back_entries, 0, "{usage:?}");
    let column_family = backend.column_family("count").unwrap();
    assert_eq!(
        slot.raw_entries(&column_family, backend.key_groups())
            .unwrap()
            .count(),
        0
    );
}

/// Deleting key groups drops what the write-back cache holds of them, written back or not, and
/// later writes to the same keys are seen.
#[test]
fn deleting_key_groups_drops_cached_values() {
    let f = Fixture::rocksdb_cached();
    let backend: LocalKeyedBackend<u64> = f.backend(128);
    let value = backend
        .value_state(&ValueStateDescriptor::<u64>::new("v"))
        .unwrap();
    let slot = backend.rocksdb_slot().unwrap();
    for key in 0..100u64 {
        backend.set_current_key(&key).unwrap();
        value.update(key + 1).unwrap();
        if key == 49 {
            slot.flush_write_back().unwrap();
        }
    }
    backend.delete_key_groups(backend.key_groups()).unwrap();
    for key in 0..100u64 {
        backend.set_current_key(&key).unwrap();
        assert_eq!(value.value().unwrap(), None, "key {key}");
        value.update(key + 7).unwrap();
    }
    assert_eq!(raw_count(&backend, "v"), 100);
    for key in 0..100u64 {
        backend.set_current_key(&key).unwrap();
        assert_eq!(value.value().unwrap(), Some(key + 7), "key {key}");
    }
}

#[test]
fn raw_entries_follow_the_key_layout() {
    let f = Fixture::rocksdb();
    let backend: LocalKeyedBackend<u64> = f.backend(128);
    let map = backend
        .map_state(&MapStateDescriptor::<u64, u64>::new("m"))
        .unwrap();
    for key in 0..50u64 {
        backend.set_current_key(&key).unwrap();
        map.put(key + 1, key).unwrap();
    }
    let slot = backend.rocksdb_slot().unwrap();
    let range = weir_state::KeyGroupRange { start: 10, end: 40 };
    let mut groups = BTreeMap::new();
    for entry in slot
        .raw_entries(&backend.column_family("m").unwrap(), range)
        .unwrap()
    {
        let (key, _value) = entry.unwrap();
        let parts = split_key(&key).unwrap();
        assert!(range.contains(parts.key_group));
        let decoded = <u64 as weir_state::StateCodec>::decode(parts.key).unwrap();
        assert_eq!(KeyGroup::of(&decoded, 128), parts.key_group);
        assert_eq!(
            <u64 as weir_state::StateCodec>::decode(parts.user_key).unwrap(),
            decoded + 1
        );
        assert!(parts.namespace.is_none());
        groups.insert(decoded, parts.key_group);
    }
    let expected = (0..50u64)
        .filter(|key| range.contains(KeyGroup::of(key, 128)))
        .count();
    assert_eq!(groups.len(), expected);
}

/// The instance records each state's types at registration: registering it again with
/// another type (a changed job on the same RocksDB files) is refused, naming both.
#[test]
fn a_changed_type_is_refused_naming_both() {
    let f = Fixture::rocksdb();
    let first: LocalKeyedBackend<u64> = f.backend(128);
    let small = first
        .value_state(&ValueStateDescriptor::<u8>::new("x"))
        .unwrap();
    first.set_current_key(&1).unwrap();
    small.update(7).unwrap();
    drop((small, first));
    let second: LocalKeyedBackend<u64> = f.backend(128);
    let err = second
        .value_state(&ValueStateDescriptor::<u64>::new("x"))
        .expect_err("another type is refused");
    assert!(
        matches!(err.kind(), StateErrorKind::IncompatibleKeyedRestore { .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains("'x'"), "{text}");
    assert!(
        text.contains("ValueState<u8>") && text.contains("ValueState<u64>"),
        "{text}"
    );
    // The same type is welcome, with what was written.
    let again = second
        .value_state(&ValueStateDescriptor::<u8>::new("x"))
        .unwrap();
    second.set_current_key(&1).unwrap();
    assert_eq!(again.value().unwrap(), Some(7));
}

#[test]
fn bad_settings_are_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(0));
    let err = RocksDbInstance::open(
        RocksDbConfig::new(dir.path(), 1 << 20, 1 << 19),
        clock.clone(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("block cache") && err.contains("at least 4 MiB"),
        "{err}"
    );
    let err = RocksDbInstance::open(
        RocksDbConfig::new(dir.path(), 8 << 20, 16 << 20),
        clock.clone(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("write buffer") && err.contains("charged to the cache"),
        "{err}"
    );
    let err = RocksDbInstance::open(
        RocksDbConfig::new(dir.path().join("small"), 8 << 20, 4 << 20).with_write_back(1000),
        clock.clone(),
    )
    .unwrap_err()
    .to_string();
    let slot = RocksDbInstance::open(
        RocksDbConfig::from_managed_memory(dir.path(), 64 << 20),
        clock,
    )
    .unwrap();
    assert!(
        err.contains("1000") && err.contains("state.backend.rocksdb.memory.write-back-ratio"),
        "{err}"
    );
    assert_eq!(slot.config().write_buffer_bytes, 32 << 20);
    let usage = slot.memory_usage();
    let write_back = (64 << 20) / 4;
    assert_eq!(usage.write_back_capacity, write_back);
    assert_eq!(usage.block_cache_capacity, (64 << 20) - write_back);
    let err = LocalKeyedBackend::<u64>::rocksdb(
        KeyedBackendConfig::single(128),
        Arc::clone(&slot),
        "a:b",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("without ':'"), "{err}");
    let err = LocalKeyedBackend::<u64>::rocksdb(KeyedBackendConfig::single(1 << 16), slot, "a")
        .unwrap_err()
        .to_string();
    assert!(err.contains("pipeline.max-parallelism = 65536"), "{err}");
    let usage = RocksDbInstance::open(
        RocksDbConfig::new(dir.path().join("other"), 8 << 20, 4 << 20),
        Arc::new(ManualClock::new(0)),
    )
    .unwrap()
    .memory_usage();
    assert_eq!(usage.block_cache_capacity, 8 << 20);
    assert_eq!(usage.write_buffer_limit, 4 << 20);
}

#[test]
fn the_slot_database_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    // The engine may create checkpoints or compact from a blocking thread.
    assert_send_sync::<RocksDbInstance>();
    assert_send_sync::<RocksDbConfig>();
}
