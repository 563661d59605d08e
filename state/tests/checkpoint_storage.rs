//! Checkpoint storage on a real disk: files written through io_uring on a glommio executor,
//! metadata committed atomically, and every way a checkpoint can be unusable detected with
//! the file and the reason while the previous complete one is used.

use std::fs;
use std::path::Path;

use proptest::prelude::*;
use weir_state::checkpoint::{
    open_savepoint, CheckpointMetadata, CheckpointStorage, CompletedCheckpoint, StateFileWriter,
    StoredFile, METADATA_FILE,
};
use weir_state::checksum::crc32;

const JOB: &str = "orders-job";

/// Bytes that are not all alike, `len` of them.
fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Writes checkpoint `n` with `files` on a glommio executor; commits it unless `commit` is
/// false.
fn write(
    storage: &CheckpointStorage,
    n: u64,
    files: &[(&str, Vec<u8>)],
    commit: bool,
) -> Option<CompletedCheckpoint> {
    let pending = storage.begin(n).expect("begin");
    let stored: Vec<StoredFile> = glommio::LocalExecutor::default().run(async {
        let mut stored = Vec::new();
        for (name, contents) in files {
            let mut writer = StateFileWriter::create(&pending, name)
                .await
                .expect("create");
            // In pieces that straddle the writer's buffers.
            for piece in contents.chunks(100_003) {
                writer.write(piece).await.expect("write");
            }
            stored.push(writer.finish().await.expect("finish"));
        }
        stored
    });
    for ((name, contents), file) in files.iter().zip(&stored) {
        assert_eq!(
            (file.name.as_str(), file.len, file.crc32),
            (*name, contents.len() as u64, crc32(contents)),
            "what the writer reports of {name}"
        );
    }
    let metadata = CheckpointMetadata {
        job: JOB.to_string(),
        checkpoint: n,
        timestamp_ms: 1_700_000_000_000 + n as i64,
        files: stored,
        referenced: Vec::new(),
        payload: format!("handles of {n}").into_bytes(),
    };
    commit.then(|| storage.commit(pending, &metadata).expect("commit"))
}

fn files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("op-a-0", bytes(1_000_000, 1)),
        ("op-b-0", bytes(3, 2)),
        ("empty", Vec::new()),
    ]
}

#[test]
fn a_committed_checkpoint_is_found_and_its_files_read_back() {
    let root = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::open(root.path(), JOB).unwrap();
    assert!(storage.latest().unwrap().usable.is_none(), "nothing yet");
    let mut files = files();
    // Files are read in large aligned steps: one of several steps, its length no multiple
    // of a block, and one of exactly a block.
    files.push(("op-c-0", bytes((17 << 20) + 4097 + 3, 3)));
    files.push(("op-d-0", bytes(4096, 4)));
    write(&storage, 1, &files, false);
    assert!(!storage.has_completed(), "an attempt never committed");
    let committed = write(&storage, 2, &files, true).unwrap();
    assert!(storage.has_completed());
    let latest = storage.latest().unwrap();
    assert!(latest.skipped.is_empty(), "{:?}", latest.skipped);
    let mut usable = latest.usable.expect("checkpoint 1");
    assert_eq!(usable.metadata, committed.metadata);
    assert_eq!(usable.metadata.payload, b"handles of 2");
    let stored = usable.metadata.files.clone();
    for (index, ((_, contents), file)) in files.iter().zip(&stored).enumerate() {
        assert_eq!(&fs::read(usable.path_of(file)).unwrap(), contents);
        // What verifying read, handed over: the same bytes.
        assert_eq!(&usable.take_state_file(index).unwrap()[..], &contents[..]);
        // Read again, once handed over.
        assert_eq!(&usable.take_state_file(index).unwrap()[..], &contents[..]);
    }
    assert!(
        !usable.dir.join("_metadata.inprogress").exists(),
        "the temporary metadata was renamed"
    );
}

/// Damages checkpoint `n`'s file `name` with `damage`.
fn damage(root: &Path, n: u64, name: &str, damage: impl FnOnce(&mut Vec<u8>)) {
    let path = root.join(JOB).join(format!("chk-{n}")).join(name);
    let mut contents = fs::read(&path).unwrap();
    damage(&mut contents);
    fs::write(&path, contents).unwrap();
}

#[test]
fn unusable_checkpoints_are_skipped_with_the_file_and_the_reason() {
    let root = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::open(root.path(), JOB).unwrap();
    for n in 1..=8 {
        write(&storage, n, &files(), n != 8);
    }
    // 8 never committed. 7: a flipped byte in a state file; 6: a truncated one; 5: one gone.
    damage(root.path(), 7, "op-a-0", |c| c[123_456] ^= 0x40);
    damage(root.path(), 6, "op-b-0", |c| c.truncate(2));
    fs::remove_file(root.path().join(JOB).join("chk-5").join("op-b-0")).unwrap();
    // 4: a flipped byte in the metadata; 3: the metadata cut short.
    damage(root.path(), 4, METADATA_FILE, |c| c[20] ^= 1);
    damage(root.path(), 3, METADATA_FILE, |c| c.truncate(10));
    // 2: another job's checkpoint copied in.
    let other_root = tempfile::tempdir().unwrap();
    let other = CheckpointStorage::open(other_root.path(), "other-job").unwrap();
    let pending = other.begin(2).unwrap();
    other
        .commit(
            pending,
            &CheckpointMetadata {
                job: "other-job".into(),
                checkpoint: 2,
                timestamp_ms: 0,
                files: Vec::new(),
                referenced: Vec::new(),
                payload: Vec::new(),
            },
        )
        .unwrap();
    fs::copy(
        other_root
            .path()
            .join("other-job/chk-2")
            .join(METADATA_FILE),
        root.path().join(JOB).join("chk-2").join(METADATA_FILE),
    )
    .unwrap();

    let latest = storage.latest().unwrap();
    assert_eq!(latest.usable.expect("checkpoint 1").metadata.checkpoint, 1);
    let reasons: Vec<String> = latest.skipped.iter().map(ToString::to_string).collect();
    let expected = [
        ("chk-8", "it never completed"),
        ("chk-7/op-a-0", "its CRC-32 is"),
        ("chk-6/op-b-0", "it has 2 bytes, the metadata says 3"),
        ("chk-5/op-b-0", "reading it failed"),
        ("chk-4/_metadata", "torn or damaged"),
        ("chk-3/_metadata", "_metadata is truncated (10 bytes)"),
        ("chk-2", "it belongs to job 'other-job', not 'orders-job'"),
    ];
    assert_eq!(reasons.len(), expected.len(), "{reasons:#?}");
    for (reason, (path, why)) in reasons.iter().zip(expected) {
        assert!(
            reason.contains(&format!("{JOB}/{path} cannot be restored")) && reason.contains(why),
            "expected {path}: {why} in {reason}"
        );
        assert!(reason.contains("passes over it"), "{reason}");
    }

    // With checkpoint 1 damaged too, none is usable and all eight are reported.
    damage(root.path(), 1, "empty", |c| c.push(0));
    let latest = storage.latest().unwrap();
    assert!(latest.usable.is_none());
    assert_eq!(latest.skipped.len(), 8);
}

#[test]
fn a_second_process_on_the_directory_is_refused_until_the_first_lets_go() {
    let root = tempfile::tempdir().unwrap();
    let first = CheckpointStorage::open(root.path(), JOB).unwrap();
    // flock locks belong to the open file, so a second open in one process conflicts as a
    // second process would.
    let refused = CheckpointStorage::open(root.path(), JOB)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains(&format!("{} is in use", first.dir().display()))
            && refused.contains(&format!("pid {}", std::process::id())),
        "{refused}"
    );
    // Another job's directory is its own.
    CheckpointStorage::open(root.path(), "another-job").unwrap();
    drop(first);
    CheckpointStorage::open(root.path(), JOB).expect("free again");
}

#[test]
fn retaining_keeps_the_newest_committed_checkpoints() {
    let root = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::open(root.path(), JOB).unwrap();
    let small = [("f", bytes(10, 0))];
    for n in 1..=5 {
        write(&storage, n, &small, n != 4);
    }
    write(&storage, 6, &small, false);
    storage.retain(2).unwrap();
    let mut left: Vec<String> = fs::read_dir(storage.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("chk-"))
        .collect();
    left.sort();
    // 6 (uncommitted, newer than the kept ones), 5 and 3 kept; 4 (uncommitted, older) and
    // 1, 2 gone.
    assert_eq!(left, ["chk-3", "chk-5", "chk-6"]);
}

#[test]
fn begin_clears_an_uncommitted_attempt_and_never_a_committed_one() {
    let root = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::open(root.path(), JOB).unwrap();
    write(&storage, 1, &files(), false);
    let pending = storage.begin(1).expect("leftovers cleared");
    assert_eq!(fs::read_dir(pending.dir()).unwrap().count(), 0);
    write(&storage, 2, &files(), true);
    let refused = storage.begin(2).unwrap_err().to_string();
    assert!(refused.contains("already complete"), "{refused}");
}

#[test]
fn bad_job_and_file_names_are_refused_naming_them() {
    let root = tempfile::tempdir().unwrap();
    for job in ["", "..", "a/b"] {
        let refused = CheckpointStorage::open(root.path(), job)
            .unwrap_err()
            .to_string();
        assert!(refused.contains(&format!("'{job}'")), "{refused}");
    }
    let storage = CheckpointStorage::open(root.path(), JOB).unwrap();
    let pending = storage.begin(1).unwrap();
    glommio::LocalExecutor::default().run(async {
        for name in ["../escape", "_metadata", ""] {
            let refused = StateFileWriter::create(&pending, name).await.unwrap_err();
            assert!(
                refused.to_string().contains(&format!("'{name}'")),
                "{refused}"
            );
        }
    });
}

/// Checkpoint `n` with one task state file and the shared files `shared` (each written unless
/// an earlier checkpoint wrote it: `(name, written by)`), committed.
fn write_with_shared(
    storage: &CheckpointStorage,
    n: u64,
    shared: &[(&str, u64)],
    written: &mut Vec<StoredFile>,
) -> CompletedCheckpoint {
    let pending = storage.begin(n).expect("begin");
    let (file, referenced) = glommio::LocalExecutor::default().run(async {
        let mut referenced = Vec::new();
        for &(name, by) in shared {
            let stored = if by == n {
                let mut writer = StateFileWriter::create_shared(&pending, name)
                    .await
                    .expect("create shared");
                writer.write(&bytes(5_000, by as u8)).await.expect("write");
                let stored = writer.finish().await.expect("finish");
                written.push(stored.clone());
                stored
            } else {
                written
                    .iter()
                    .find(|file| file.name == format!("shared/{by}-{name}"))
                    .cloned()
                    .expect("written earlier")
            };
            referenced.push(stored);
        }
        let mut writer = StateFileWriter::create(&pending, "task-0")
            .await
            .expect("create");
        writer.write(b"task").await.expect("write");
        (writer.finish().await.expect("finish"), referenced)
    });
    let metadata = CheckpointMetadata {
        job: JOB.to_string(),
        checkpoint: n,
        timestamp_ms: 0,
        files: vec![file],
        referenced,
        payload: Vec::new(),
    };
    storage.commit(pending, &metadata).expect("commit")
}

/// A savepoint: its "shared" files go into its own directory, it commits outside the job's
/// checkpoints (no retention, not found by `latest`), it opens from anywhere once moved, and
/// damage or a missing metadata file is named.
#[test]
fn a_savepoint_is_self_contained_and_opens_wherever_it_is() {
    let root = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::open(&root.path().join("checkpoints"), JOB).unwrap();
    let target = root.path().join("savepoints");
    let pending = storage
        .begin_savepoint(&target, 7, 1_700_000_000_123)
        .unwrap();
    assert!(pending.is_savepoint());
    assert!(pending.dir().starts_with(&target));
    let (task, link) = glommio::LocalExecutor::default().run(async {
        let mut writer = StateFileWriter::create(&pending, "task-0").await.unwrap();
        writer.write(b"task").await.unwrap();
        let task = writer.finish().await.unwrap();
        let mut writer = StateFileWriter::create_shared(&pending, "op-0-keyed-1")
            .await
            .unwrap();
        writer.write(&bytes(5_000, 9)).await.unwrap();
        (task, writer.finish().await.unwrap())
    });
    assert_eq!(link.name, "7-op-0-keyed-1", "listed as a file of its own");
    assert!(pending.dir().join(&link.name).is_file());
    assert!(!root
        .path()
        .join("checkpoints")
        .join(JOB)
        .join("shared")
        .exists());
    let metadata = CheckpointMetadata {
        job: JOB.to_string(),
        checkpoint: 7,
        timestamp_ms: 1_700_000_000_123,
        files: vec![task],
        referenced: vec![link],
        payload: b"handles".to_vec(),
    };
    // A savepoint does not commit as a checkpoint.
    assert!(storage.commit(pending.clone(), &metadata).is_err());
    let committed = storage.commit_savepoint(pending, &metadata).unwrap();
    assert!(
        storage.latest().unwrap().usable.is_none(),
        "not a checkpoint"
    );
    storage.retain(1).unwrap();
    assert!(
        committed.dir.join(METADATA_FILE).is_file(),
        "retention leaves it"
    );

    let moved = root.path().join("elsewhere");
    fs::rename(&committed.dir, &moved).unwrap();
    drop(storage);
    fs::remove_dir_all(root.path().join("checkpoints")).unwrap();
    let opened = open_savepoint(&moved.join(METADATA_FILE)).unwrap();
    assert_eq!(opened.metadata, metadata);
    assert_eq!(opened.dir, moved);

    let link = moved.join("7-op-0-keyed-1");
    let mut contents = fs::read(&link).unwrap();
    contents[10] ^= 1;
    fs::write(&link, contents).unwrap();
    let error = open_savepoint(&moved).unwrap_err().to_string();
    assert!(
        error.contains("7-op-0-keyed-1") && error.contains("damaged"),
        "{error}"
    );
    fs::remove_file(moved.join(METADATA_FILE)).unwrap();
    let error = open_savepoint(&moved).unwrap_err().to_string();
    assert!(error.contains("never completed"), "{error}");
    let error = open_savepoint(&root.path().join("nothing"))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("nothing") && error.contains("not a directory"),
        "{error}"
    );
}

/// The files in the job's shared directory.
fn shared_files(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(root.join(JOB).join("shared"))
        .map(|entries| {
            entries
                .map(|entry| entry.unwrap().file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Shared files are found and checked from every checkpoint that lists them, and swept once
/// no retained checkpoint does — but never one a checkpoint newer than the newest committed
/// one may still need.
#[test]
fn shared_files_live_as_long_as_a_retained_checkpoint_lists_them() {
    let root = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::open(root.path(), JOB).unwrap();
    let mut written = Vec::new();
    write_with_shared(&storage, 1, &[("a.sst", 1), ("b.sst", 1)], &mut written);
    // Checkpoint 2 keeps a (written by 1), drops b, adds c.
    let second = write_with_shared(&storage, 2, &[("a.sst", 1), ("c.sst", 2)], &mut written);
    assert_eq!(
        second.path_of(&second.metadata.referenced[0]),
        root.path().join(JOB).join("shared/1-a.sst")
    );
    // An attempt at 3 in progress has written its own shared file already.
    let pending = storage.begin(3).unwrap();
    glommio::LocalExecutor::default().run(async {
        let mut writer = StateFileWriter::create_shared(&pending, "d.sst")
            .await
            .unwrap();
        writer.write(b"in progress").await.unwrap();
        writer.finish().await.unwrap();
    });
    storage.retain(1).unwrap();
    assert_eq!(
        shared_files(root.path()),
        ["1-a.sst", "2-c.sst", "3-d.sst"],
        "b went with checkpoint 1; a is still listed by 2; d may belong to 3"
    );
    let latest = storage.latest().unwrap();
    assert_eq!(latest.usable.expect("2").metadata.checkpoint, 2);

    // A damaged shared file makes every checkpoint listing it unusable, naming the file.
    let path = root.path().join(JOB).join("shared/1-a.sst");
    let mut contents = fs::read(&path).unwrap();
    contents[17] ^= 8;
    fs::write(&path, contents).unwrap();
    let latest = storage.latest().unwrap();
    assert!(latest.usable.is_none());
    let reasons: Vec<String> = latest.skipped.iter().map(ToString::to_string).collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("shared/1-a.sst") && r.contains("damaged")),
        "{reasons:?}"
    );

    // Once 4 commits without 1-a and 3-d, the sweep takes them.
    write_with_shared(&storage, 4, &[("c.sst", 2)], &mut written);
    storage.retain(1).unwrap();
    assert_eq!(shared_files(root.path()), ["2-c.sst"]);
}

fn metadata() -> impl Strategy<Value = CheckpointMetadata> {
    (
        "[a-z-]{1,12}",
        any::<u64>(),
        any::<i64>(),
        proptest::collection::vec(("[a-z0-9-]{1,10}", any::<u64>(), any::<u32>()), 0..5),
        proptest::collection::vec(("shared/[a-z0-9-]{1,10}", any::<u64>(), any::<u32>()), 0..5),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(
            |(job, checkpoint, timestamp_ms, files, referenced, payload)| {
                let stored = |files: Vec<(String, u64, u32)>| {
                    files
                        .into_iter()
                        .map(|(name, len, crc32)| StoredFile { name, len, crc32 })
                        .collect()
                };
                CheckpointMetadata {
                    job,
                    checkpoint,
                    timestamp_ms,
                    files: stored(files),
                    referenced: stored(referenced),
                    payload,
                }
            },
        )
}

proptest! {
    #[test]
    fn metadata_round_trips_and_any_flipped_byte_or_cut_is_caught(
        metadata in metadata(),
        at in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let bytes = metadata.to_bytes();
        prop_assert_eq!(CheckpointMetadata::from_bytes(&bytes), Ok(metadata));
        let at = at.index(bytes.len());
        let mut flipped = bytes.clone();
        flipped[at] ^= 1 << bit;
        prop_assert!(CheckpointMetadata::from_bytes(&flipped).is_err());
        prop_assert!(CheckpointMetadata::from_bytes(&bytes[..at]).is_err());
    }
}
