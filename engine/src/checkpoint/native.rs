//! Checkpoints of the RocksDB state backend: RocksDB's own checkpoints, uploaded
//! incrementally.
//!
//! Each keyed operator subtask has a RocksDB instance of its own in its slot
//! (`weir_state::RocksDbSlot`), so its state can be cut at its own barrier. The instances of a
//! checkpointed job write RocksDB's write-ahead log, and at the barrier an instance marks the
//! write-back cache's dirty entries of its states as held by the cut (held writes, which an
//! instance opened on the checkpoint's files writes into RocksDB) and lists its live files as
//! they are at that moment, hard-linking them into a directory beside it with RocksDB's file
//! deletions paused meanwhile (`RocksDbInstance::cut`): that is the whole pause. Its memtables
//! are not flushed; the logs that hold them are part of the checkpoint, up to their length at
//! the barrier. The task's checkpoint writer then, after the barrier has moved on, first
//! writes the held writes, copied from the cache in pieces between records (a change to an
//! entry not yet copied copies it first), and uploads the files through io_uring: an SST file
//! (immutable)
//! into the job's `shared/` directory, unless an earlier checkpoint of the instance uploaded it
//! already — then the checkpoint lists that file again — and the others (logs, manifest,
//! options, `CURRENT`) into the checkpoint's own directory, each up to its length at the
//! barrier. The operator's `rocksdb` part lists every file: RocksDB's name,
//! where it is stored, its length and CRC-32; the checkpoint's metadata lists them too, so a
//! restore checks them and the storage's sweep keeps the shared ones that a retained
//! checkpoint still needs. That is `execution.checkpointing.incremental: true`, the default;
//! with `false` every checkpoint uploads every file (and shares none).
//!
//! **Restore.** A subtask whose key groups are exactly one old subtask's copies that
//! subtask's files into its instance's directory (hard-linking the SST files where it can)
//! and opens it (and, restored from one of the job's own checkpoints, knows its SST files are
//! uploaded already, so its first checkpoint is incremental too). A rescaled subtask opens
//! each old subtask's checkpoint whose key groups overlap its own as an instance of its own
//! and copies the entries of its key groups over (Flink's restore by key-group ranges).
//!
//! One upload runs at a time per instance, in checkpoint order, so the record of uploaded
//! files always matches what committed checkpoints list.
//!
//! **Savepoints** of a keyed operator's state are canonical keyed snapshots, restorable on
//! either backend: at the barrier the instance writes its cache back, flushes its memtables and
//! hard-links its files (`RocksDbInstance::create_checkpoint`: a longer pause than a cut's), and
//! the writer opens it as an instance of its own and reads it out
//! (`RocksDbInstance::write_keyed_snapshot`); a job restoring that on RocksDB loads it into a
//! fresh instance (`LocalKeyedBackend::restore`). A window operator's savepoint reads its
//! panes' contents out of the instance at the barrier into the windows' canonical layout
//! (`window::stored`). So a savepoint holds no RocksDB file, and restores on either backend.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glommio::io::BufferedFile;
use weir_state::checkpoint::{PendingCheckpoint, StateFileWriter, StoredFile};
use weir_state::{
    KeyGroupRange, NativeCheckpoint, NativeFile, NativeSource, RocksDbInstance, RocksDbSlot,
    SnapshotShape, StateError, HELD_WRITES_FILE,
};

use super::bytes::{ByteReader, ByteWriter};
use super::task_state::{write_in_pieces, OperatorSnapshot};
use crate::operator::RuntimeContext;

/// An operator's RocksDB files in a checkpoint (see the module docs).
pub(crate) const PART_ROCKSDB: &str = "rocksdb";

const MAGIC: &[u8; 8] = b"WEIRRDB\0";
/// Version 2 lists held writes (`weir_state::HELD_WRITES_FILE`), which a build that reads only
/// version 1 would pass over, losing them; a part without them is written as version 1.
const VERSION: u32 = 2;
/// Bytes read and written at a time when a file is uploaded.
const COPY_CHUNK: usize = 256 << 10;

/// One keyed operator subtask's RocksDB instance, with what its checkpoints uploaded.
pub(crate) struct NativeState {
    instance: Arc<RocksDbInstance>,
    slot: Arc<RocksDbSlot>,
    /// The instance's name in its slot: `<operator id>-<subtask>`.
    name: String,
    /// The operator id, which names its states' column families.
    operator: String,
    uploads: Rc<Uploads>,
    /// Snapshots taken, for naming their directories.
    snapshots: Cell<u64>,
    /// Whether a checkpoint lists the SST files an earlier one uploaded (else it uploads
    /// every file).
    incremental: bool,
}

/// The SST files of an instance that shared storage holds, by RocksDB's name, and whether an
/// upload is running.
#[derive(Default)]
struct Uploads {
    uploaded: RefCell<HashMap<String, StoredFile>>,
    busy: Cell<bool>,
}

impl NativeState {
    /// Opens subtask `ctx.subtask`'s instance in `slot`, restored from the checkpoint the job
    /// resumes from, if it holds RocksDB state of the operator.
    pub(crate) fn open(
        ctx: &RuntimeContext,
        slot: &Arc<RocksDbSlot>,
    ) -> Result<NativeState, StateError> {
        let name = format!("{}-{}", ctx.state.operator_id, ctx.subtask);
        let path = slot.instance_path(&name);
        remove_dir(&path)?;
        let ours = KeyGroupRange::for_subtask(
            ctx.max_parallelism as u32,
            ctx.parallelism as u32,
            ctx.subtask as u32,
        );
        let uploads = Rc::new(Uploads::default());
        let instance = match ctx.restored_native(PART_ROCKSDB) {
            None => slot.open_instance(&name)?,
            Some(restored) => {
                let overlapping: Vec<(KeyGroupRange, Manifest)> = restored
                    .parts
                    .iter()
                    .map(|(old, bytes)| {
                        let range = KeyGroupRange::for_subtask(
                            ctx.max_parallelism as u32,
                            restored.old_parallelism as u32,
                            *old as u32,
                        );
                        Ok((range, Manifest::decode(bytes).map_err(corrupt)?))
                    })
                    .collect::<Result<Vec<_>, StateError>>()?
                    .into_iter()
                    .filter(|(range, _)| overlaps(*range, ours))
                    .collect();
                match overlapping.as_slice() {
                    [(range, manifest)] if *range == ours => {
                        manifest.copy_into(&restored.dir, &path)?;
                        if restored.own {
                            uploads
                                .uploaded
                                .borrow_mut()
                                .extend(manifest.shared_files());
                        }
                        slot.open_instance(&name)?
                    }
                    _ => {
                        let instance = slot.open_instance(&name)?;
                        for (old, (_, manifest)) in overlapping.iter().enumerate() {
                            let staged = format!("{name}.restore-{old}");
                            let staged_path = slot.instance_path(&staged);
                            remove_dir(&staged_path)?;
                            manifest.copy_into(&restored.dir, &staged_path)?;
                            let copied = {
                                let old = slot.open_instance(&staged)?;
                                instance.copy_key_groups_from(&old, ours)?
                            };
                            remove_dir(&staged_path)?;
                            tracing::debug!(instance = %name, copied, "restored RocksDB key groups from an old subtask");
                        }
                        instance
                    }
                }
            }
        };
        Ok(NativeState {
            instance,
            slot: Arc::clone(slot),
            name,
            operator: ctx.state.operator_id.to_string(),
            uploads,
            snapshots: Cell::new(0),
            incremental: ctx.state.incremental,
        })
    }

    /// The instance.
    pub(crate) fn instance(&self) -> &Arc<RocksDbInstance> {
        &self.instance
    }

    /// Takes the instance's checkpoint at the barrier into a directory beside it and adds its
    /// upload to `snapshot`: a cut of its live files when it writes its log (a checkpointed
    /// job's instances do), else a checkpoint with its memtables flushed.
    pub(crate) fn snapshot(&self, snapshot: &mut OperatorSnapshot) -> Result<(), StateError> {
        // Both callers write savepoints canonical; uploading RocksDB's files into one would
        // also take them as the base of the next checkpoint.
        assert!(
            !snapshot.is_savepoint(),
            "internal error: a savepoint holds the canonical layout, not RocksDB's files"
        );
        let number = self.snapshots.get();
        self.snapshots.set(number + 1);
        let dir = self
            .slot
            .instance_path(&format!("{}.checkpoint-{number}", self.name));
        remove_dir(&dir)?;
        let native = if self.instance.config().write_ahead_log {
            self.instance.cut(&dir)?
        } else {
            self.instance.create_checkpoint(&dir)?
        };
        snapshot.add_native(
            PART_ROCKSDB,
            NativeUpload {
                native,
                name: self.name.clone(),
                uploads: Rc::clone(&self.uploads),
                incremental: self.incremental,
            },
        );
        Ok(())
    }
}

impl NativeState {
    /// Takes the instance's checkpoint at a savepoint's barrier (write-back, flush and hard
    /// links: a longer pause than a cut's) for the writer to read out as a canonical keyed snapshot of the operator's state
    /// of `shape`: it opens the checkpoint as an instance of its own, so records flow
    /// meanwhile, and removes it after.
    pub(crate) fn canonical_export(
        &self,
        shape: SnapshotShape<'static>,
    ) -> Result<CanonicalExport, StateError> {
        let number = self.snapshots.get();
        self.snapshots.set(number + 1);
        let name = format!("{}.savepoint-{number}", self.name);
        let dir = self.slot.instance_path(&name);
        remove_dir(&dir)?;
        self.instance.create_checkpoint(&dir)?;
        Ok(CanonicalExport {
            slot: Arc::clone(&self.slot),
            name,
            dir,
            operator: self.operator.clone(),
            shape,
        })
    }
}

/// A RocksDB checkpoint taken at a savepoint's barrier, to be written in the canonical
/// keyed-snapshot format ([`NativeState::canonical_export`]).
pub(crate) struct CanonicalExport {
    slot: Arc<RocksDbSlot>,
    name: String,
    dir: PathBuf,
    operator: String,
    shape: SnapshotShape<'static>,
}

impl CanonicalExport {
    /// Appends the canonical snapshot to `out`.
    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<(), String> {
        let copy = self
            .slot
            .open_instance(&self.name)
            .map_err(|e| e.to_string())?;
        copy.write_keyed_snapshot(&self.operator, self.shape, crate::time::now_ms(), out)
            .map_err(|e| e.to_string())
    }
}

impl Drop for CanonicalExport {
    /// Removes the checkpoint: written out, or its savepoint aborted first.
    fn drop(&mut self) {
        if let Err(error) = remove_dir(&self.dir) {
            tracing::warn!(%error, "cannot remove a RocksDB checkpoint taken for a savepoint");
        }
    }
}

/// A native checkpoint taken at a barrier, to be uploaded by the task's checkpoint writer.
pub(crate) struct NativeUpload {
    native: NativeCheckpoint,
    name: String,
    uploads: Rc<Uploads>,
    incremental: bool,
}

impl NativeUpload {
    /// Uploads the checkpoint's files into `pending` (see the module docs), adds every file it
    /// consists of to `referenced`, and returns the part listing them, with the longest step
    /// of copying the held writes (on the shard, which processes no records meanwhile) — or
    /// stops before the next file once `stopping` is set (the job fails or is cancelled: the
    /// checkpoint will not complete). The checkpoint's directory goes with `self`, uploaded or
    /// not.
    pub(crate) async fn upload(
        mut self,
        pending: &PendingCheckpoint,
        referenced: &mut Vec<StoredFile>,
        stopping: &AtomicBool,
    ) -> Result<(Vec<u8>, Duration), String> {
        // The held writes first, before waiting for an earlier upload (they touch no file of
        // its): until every held entry is copied, a change to one copies it first, and the
        // instance's next cut would copy what is left at its barrier.
        let mut longest = Duration::ZERO;
        let mut files = Vec::with_capacity(self.native.files.len() + 1);
        if let Some(mut held) = self.native.held.take() {
            let mut writer = self.writer(pending, HELD_WRITES_FILE).await?;
            longest = write_in_pieces(&mut writer, Some(stopping), |piece| {
                let more = held.next_piece(piece).map_err(|e| e.to_string())?;
                Ok((more, false))
            })
            .await?;
            let stored = writer.finish().await.map_err(|e| e.to_string())?;
            files.push((HELD_WRITES_FILE.to_string(), stored));
        }
        while self.uploads.busy.get() {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        let manifest = {
            let _busy = Busy::take(&self.uploads);
            self.upload_files(pending, files, stopping).await?
        };
        referenced.extend(manifest.files.iter().map(|(_, stored)| stored.clone()));
        Ok((manifest.encode(), longest))
    }

    /// A writer of the instance's file `name` (RocksDB's name) in `pending`: an SST file into
    /// the job's shared files, any other into the checkpoint's own directory.
    async fn writer(
        &self,
        pending: &PendingCheckpoint,
        name: &str,
    ) -> Result<StateFileWriter, String> {
        let stored_name = format!("{}-{name}", self.name);
        if NativeFile::is_sst_name(name) {
            StateFileWriter::create_shared(pending, &stored_name).await
        } else {
            StateFileWriter::create(pending, &format!("rocksdb-{stored_name}")).await
        }
        .map_err(|e| e.to_string())
    }

    /// Uploads the listed files after `files` (written already), into the manifest.
    async fn upload_files(
        &self,
        pending: &PendingCheckpoint,
        mut files: Vec<(String, StoredFile)>,
        stopping: &AtomicBool,
    ) -> Result<Manifest, String> {
        let mut uploaded = HashMap::new();
        for file in &self.native.files {
            let known = (self.incremental && file.is_sst())
                .then(|| self.uploads.uploaded.borrow().get(&file.name).cloned())
                .flatten();
            let stored = match known {
                Some(stored) => stored,
                None if stopping.load(Ordering::Relaxed) => {
                    return Err(
                        "the job is stopping: the rest of its files are not uploaded".into(),
                    )
                }
                None => copy_file(file, self.writer(pending, &file.name).await?).await?,
            };
            if file.is_sst() {
                uploaded.insert(file.name.clone(), stored.clone());
            }
            files.push((file.name.clone(), stored));
        }
        // Only the files still live: one compacted away is never listed again.
        *self.uploads.uploaded.borrow_mut() = uploaded;
        Ok(Manifest { files })
    }
}

impl Drop for NativeUpload {
    /// Removes the checkpoint's local directory (hard links and copies): after its upload, or
    /// when the checkpoint was aborted before it.
    fn drop(&mut self) {
        if let Err(error) = remove_dir(&self.native.dir) {
            tracing::warn!(%error, "cannot remove a RocksDB checkpoint's local files");
        }
    }
}

/// An instance's upload in progress: the next one waits until this is dropped, however the
/// upload ends.
struct Busy<'a>(&'a Uploads);

impl<'a> Busy<'a> {
    fn take(uploads: &'a Uploads) -> Busy<'a> {
        uploads.busy.set(true);
        Busy(uploads)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.busy.set(false);
    }
}

/// Copies `file`'s bytes — the first `file.len` bytes of its source file — into `writer`,
/// through io_uring (buffered reads: the files sit beside the instance, on whatever file
/// system it has, which may not take direct I/O).
async fn copy_file(file: &NativeFile, mut writer: StateFileWriter) -> Result<StoredFile, String> {
    match &file.source {
        NativeSource::Bytes(bytes) => {
            for chunk in bytes.chunks(COPY_CHUNK) {
                writer.write(chunk).await.map_err(|e| e.to_string())?;
            }
        }
        NativeSource::File(from) => {
            let failed =
                |error: glommio::GlommioError<()>| format!("reading {}: {error}", from.display());
            let source = BufferedFile::open(from).await.map_err(failed)?;
            let mut at = 0;
            while at < file.len {
                let want = COPY_CHUNK.min(usize::try_from(file.len - at).unwrap_or(COPY_CHUNK));
                let chunk = source.read_at(at, want).await.map_err(failed)?;
                if chunk.is_empty() {
                    return Err(format!(
                        "{} ends after {at} bytes, before the {} bytes the checkpoint holds",
                        from.display(),
                        file.len
                    ));
                }
                writer.write(&chunk).await.map_err(|e| e.to_string())?;
                at += chunk.len() as u64;
            }
            source.close().await.map_err(failed)?;
        }
    }
    writer.finish().await.map_err(|e| e.to_string())
}

/// What an operator subtask's `rocksdb` part says: each file by RocksDB's name, with the
/// file a checkpoint stores it as.
struct Manifest {
    files: Vec<(String, StoredFile)>,
}

impl Manifest {
    fn encode(&self) -> Vec<u8> {
        let mut out = ByteWriter::default();
        out.out.extend_from_slice(MAGIC);
        let held = self.files.iter().any(|(name, _)| name == HELD_WRITES_FILE);
        out.u32(if held { VERSION } else { 1 });
        out.u64(self.files.len() as u64);
        for (name, stored) in &self.files {
            out.text(name);
            out.text(&stored.name);
            out.u64(stored.len);
            out.u32(stored.crc32);
        }
        out.out
    }

    fn decode(bytes: &[u8]) -> Result<Manifest, String> {
        let mut reader = ByteReader::new(bytes, "a RocksDB checkpoint part");
        reader.header_versions(MAGIC, 1..=VERSION)?;
        let count = reader.count(28)?;
        let mut files = Vec::with_capacity(count);
        for _ in 0..count {
            let name = reader.text()?;
            let stored = StoredFile {
                name: reader.text()?,
                len: reader.u64()?,
                crc32: reader.u32()?,
            };
            if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                return Err(format!(
                    "a RocksDB checkpoint part names the file '{name}', which is not a file name"
                ));
            }
            files.push((name, stored));
        }
        if !reader.is_empty() {
            return Err("a RocksDB checkpoint part has bytes after its files".into());
        }
        Ok(Manifest { files })
    }

    /// The SST files and where they are stored.
    fn shared_files(&self) -> impl Iterator<Item = (String, StoredFile)> + '_ {
        self.files
            .iter()
            .filter(|(name, _)| NativeFile::is_sst_name(name))
            .map(|(name, stored)| (name.clone(), stored.clone()))
    }

    /// Copies the files of a checkpoint in `checkpoint_dir` into a new database directory
    /// `to` (checked already, when the checkpoint was chosen). SST files, which RocksDB never
    /// changes, are hard-linked where the file system allows it (deleting the link after a
    /// compaction leaves the checkpoint's file as it is); the others are copied, since RocksDB
    /// writes to them.
    fn copy_into(&self, checkpoint_dir: &Path, to: &Path) -> Result<(), StateError> {
        std::fs::create_dir_all(to).map_err(|source| io(to, "creating", source))?;
        for (name, stored) in &self.files {
            let from: PathBuf = weir_state::checkpoint::resolve(checkpoint_dir, &stored.name);
            let target = to.join(name);
            let linked =
                NativeFile::is_sst_name(name) && std::fs::hard_link(&from, &target).is_ok();
            if !linked {
                std::fs::copy(&from, &target).map_err(|source| io(&from, "copying", source))?;
            }
        }
        Ok(())
    }
}

/// The files a `rocksdb` part lists, by RocksDB's name, with their lengths (for inspection).
pub(crate) fn describe(bytes: &[u8]) -> Result<Vec<(String, u64)>, String> {
    Ok(Manifest::decode(bytes)?
        .files
        .into_iter()
        .map(|(name, stored)| (name, stored.len))
        .collect())
}

fn overlaps(a: KeyGroupRange, b: KeyGroupRange) -> bool {
    !a.is_empty() && !b.is_empty() && a.start <= b.end && b.start <= a.end
}

/// Removes `dir` if it is there.
fn remove_dir(dir: &Path) -> Result<(), StateError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(io(dir, "removing", source)),
    }
}

fn io(path: &Path, action: &'static str, source: std::io::Error) -> StateError {
    weir_state::StateErrorKind::Io {
        path: path.to_path_buf(),
        action,
        error: source,
    }
    .into()
}

fn corrupt(problem: String) -> StateError {
    weir_state::StateErrorKind::CorruptSnapshot {
        what: "RocksDB checkpoint part",
        problem,
    }
    .into()
}
