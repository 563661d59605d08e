//! Checkpoint storage: where a job's checkpoints are written, and which one a restore may use.
//!
//! **Layout** (Flink's): under the checkpoint directory (`execution.checkpointing.dir`) each job
//! has `<dir>/<job>/`, with one `chk-<n>/` per checkpoint holding its state files and, written
//! last, its `_metadata`.
//!
//! **Writing.** A state file is written through io_uring by [`StateFileWriter`] (glommio's DMA
//! stream writer, on the shard that owns the state), which takes the CRC-32 of its bytes as
//! they pass ([`crate::checksum`]) and syncs the file when it is finished; what it returns,
//! a [`StoredFile`], is the file's name, length and checksum.
//!
//! **Committing.** [`CheckpointStorage::commit`] writes the checkpoint's [`CheckpointMetadata`] —
//! the job, the checkpoint number, every file with its length and checksum, and the
//! coordinator's payload (which state each file holds) — ending with the CRC-32 of all of it,
//! into a temporary file, syncs it, renames it to `_metadata` and syncs the directory. A crash
//! therefore leaves a checkpoint with its whole metadata or none, and one without `_metadata`
//! never completed. The metadata is small and written once per checkpoint, off the shards, so
//! it goes through the standard library.
//!
//! **Restoring.** [`CheckpointStorage::latest`] returns the newest checkpoint whose metadata
//! decodes, is of this job and matches its checksum, and whose every file is there with its
//! length and checksum. Each newer checkpoint it had to pass over comes with it, with the path
//! and the reason (never completed, torn, truncated, damaged, another job's), for the caller to
//! report.
//!
//! **Never completed, or lost?** The first commit also leaves a `.completed` marker in the
//! job's directory ([`CheckpointStorage::has_completed`]): a directory with no usable
//! checkpoint and no marker only holds attempts a crash cut short before any completed (a
//! resume starts from scratch), while one with the marker lost what it had (a resume is
//! refused).
//!
//! **One process per job directory.** [`CheckpointStorage::open`] takes an exclusive `flock` on
//! `<dir>/<job>/.lock` (writing its pid into it) and holds it until the storage is dropped or
//! the process ends, however it ends; a second open fails, naming the directory and the holder.
//!
//! **Shared files.** An incremental checkpoint also consists of files an earlier one wrote:
//! they live in `<dir>/<job>/shared/`, named `<n>-…` after the checkpoint `n` that wrote them
//! ([`StateFileWriter::create_shared`]), and a checkpoint's metadata lists every one it needs
//! among its [`CheckpointMetadata::referenced`] files (as `shared/<name>`), with length and
//! checksum, so a restore checks them like its own. [`CheckpointStorage::retain`] deletes a
//! shared file once no retained checkpoint lists it — Flink's reference counts, recounted from
//! the metadata on each sweep, so a crash can never leave a count wrong. A file of checkpoint
//! `n` is swept only once a checkpoint numbered `n` or later has committed: until then it may
//! belong to a checkpoint still being written.
//!
//! **Savepoints** ([`CheckpointStorage::begin_savepoint`], Flink's): written by the same
//! writers and committed the same way, into `<target>/savepoint-<job>-<n>-<time>/`, but
//! self-contained — a file a checkpoint would share goes into the savepoint's own directory
//! ([`StateFileWriter::create_shared`]) — and outside the job's checkpoints: no retention
//! sweeps them, and they can be moved. [`open_savepoint`] checks one (of whichever job) before
//! a job starts from it.
//!
//! **Metadata format, version 2** (little-endian; never change it, add a version): the magic
//! bytes `WEIRCKPT`, the version (`u32`), the checkpoint number (`u64`), the time it was taken
//! (ms since the epoch, `i64`), the job (a string: `u32` length and UTF-8 bytes), the number of
//! files (`u32`) and per file its name (a string), length (`u64`) and CRC-32 (`u32`), the
//! referenced files the same way (count and files), the payload (`u64` length and its bytes),
//! and the CRC-32 of everything before it (`u32`). Version 1 (no referenced files) is still
//! read.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures_lite::AsyncWriteExt;
use glommio::io::{DmaStreamWriter, DmaStreamWriterBuilder};
use rkyv::util::AlignedVec;

use crate::checksum::{crc32, Crc32};
use crate::error::{StateError, StateErrorKind};

/// The name of a checkpoint's metadata file.
pub const METADATA_FILE: &str = "_metadata";
const METADATA_TEMP: &str = "_metadata.inprogress";
const LOCK_FILE: &str = ".lock";
/// Written into a job's directory when its first checkpoint commits: a directory without a
/// usable checkpoint but with this marker lost what it had (a refused restore), one without
/// it never had one (a fresh start).
const COMPLETED_MARKER: &str = ".completed";
const MAGIC: &[u8; 8] = b"WEIRCKPT";
const METADATA_VERSION: u32 = 2;
/// Where shared files live, relative to the job's directory; their names in metadata start
/// with it.
pub const SHARED_DIR: &str = "shared";

/// One file of a checkpoint, as its metadata records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredFile {
    /// The file's name in its checkpoint's directory.
    pub name: String,
    /// Its length in bytes.
    pub len: u64,
    /// The CRC-32 of its bytes.
    pub crc32: u32,
}

impl StoredFile {
    /// The checkpoint that wrote this file if it is a shared one (`shared/<n>-…`).
    pub fn shared_by(&self) -> Option<u64> {
        self.name
            .strip_prefix(SHARED_DIR)?
            .strip_prefix('/')
            .and_then(written_for)
    }
}

/// The checkpoint a shared file named `name` (in the shared directory) was written for.
fn written_for(name: &str) -> Option<u64> {
    name.split_once('-')?.0.parse().ok()
}

/// What a completed checkpoint is: written last, as `_metadata`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointMetadata {
    /// The job it belongs to.
    pub job: String,
    /// The checkpoint's number.
    pub checkpoint: u64,
    /// When it was triggered, ms since the epoch.
    pub timestamp_ms: i64,
    /// Its task state files.
    pub files: Vec<StoredFile>,
    /// The other files it consists of: files of its own directory, and shared files
    /// (`shared/<name>`) it may have in common with other checkpoints.
    pub referenced: Vec<StoredFile>,
    /// The coordinator's description of what each file holds, opaque here.
    pub payload: Vec<u8>,
}

impl CheckpointMetadata {
    /// The metadata file's bytes (see the module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        fn text(out: &mut Vec<u8>, text: &str) {
            out.extend_from_slice(&(text.len() as u32).to_le_bytes());
            out.extend_from_slice(text.as_bytes());
        }
        let mut out = Vec::with_capacity(64 + self.payload.len() + 32 * self.files.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&METADATA_VERSION.to_le_bytes());
        out.extend_from_slice(&self.checkpoint.to_le_bytes());
        out.extend_from_slice(&self.timestamp_ms.to_le_bytes());
        text(&mut out, &self.job);
        for files in [&self.files, &self.referenced] {
            out.extend_from_slice(&(files.len() as u32).to_le_bytes());
            for file in files {
                text(&mut out, &file.name);
                out.extend_from_slice(&file.len.to_le_bytes());
                out.extend_from_slice(&file.crc32.to_le_bytes());
            }
        }
        out.extend_from_slice(&(self.payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.payload);
        let checksum = crc32(&out);
        out.extend_from_slice(&checksum.to_le_bytes());
        out
    }

    /// Reads the bytes of a metadata file; what is wrong with bad ones, with the values.
    pub fn from_bytes(bytes: &[u8]) -> Result<CheckpointMetadata, String> {
        if bytes.len() < MAGIC.len() + 4 {
            return Err(format!(
                "{METADATA_FILE} is truncated ({} bytes)",
                bytes.len()
            ));
        }
        if &bytes[..MAGIC.len()] != MAGIC {
            return Err(format!(
                "{METADATA_FILE} starts with {:02x?}, not \"WEIRCKPT\": it is not a Weir \
                 checkpoint's metadata",
                &bytes[..MAGIC.len()]
            ));
        }
        let (body, stored) = bytes.split_at(bytes.len() - 4);
        let stored = u32::from_le_bytes(stored.try_into().expect("4 bytes"));
        let computed = crc32(body);
        if stored != computed {
            return Err(format!(
                "{METADATA_FILE}'s CRC-32 is {computed:#010x} but it says {stored:#010x}: the \
                 file is torn or damaged"
            ));
        }
        let mut reader = Reader {
            bytes: body,
            at: MAGIC.len(),
        };
        let version = reader.u32()?;
        if !(1..=METADATA_VERSION).contains(&version) {
            return Err(format!(
                "{METADATA_FILE} has format version {version}; this build reads versions 1 \
                 to {METADATA_VERSION}"
            ));
        }
        let checkpoint = reader.u64()?;
        let timestamp_ms = reader.u64()? as i64;
        let job = reader.text()?;
        let files = reader.files()?;
        let referenced = if version >= 2 {
            reader.files()?
        } else {
            Vec::new()
        };
        let payload_len = reader.u64()?;
        let payload = reader.take(payload_len)?.to_vec();
        if reader.at != body.len() {
            return Err(format!(
                "{METADATA_FILE} has {} bytes after its payload",
                body.len() - reader.at
            ));
        }
        Ok(CheckpointMetadata {
            job,
            checkpoint,
            timestamp_ms,
            files,
            referenced,
            payload,
        })
    }

    /// Every file of the checkpoint: its task state files, then the others.
    pub fn all_files(&self) -> impl Iterator<Item = &StoredFile> {
        self.files.iter().chain(&self.referenced)
    }
}

/// Reads the fields of a metadata file.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: u64) -> Result<&'a [u8], String> {
        let left = self.bytes.len() - self.at;
        if len > left as u64 {
            return Err(format!(
                "{METADATA_FILE} is truncated: {len} bytes expected at byte {}, {left} left",
                self.at
            ));
        }
        let taken = &self.bytes[self.at..self.at + len as usize];
        self.at += len as usize;
        Ok(taken)
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn files(&mut self) -> Result<Vec<StoredFile>, String> {
        let count = self.u32()?;
        let mut files = Vec::with_capacity(count.min(1 << 16) as usize);
        for _ in 0..count {
            files.push(StoredFile {
                name: self.text()?,
                len: self.u64()?,
                crc32: self.u32()?,
            });
        }
        Ok(files)
    }

    fn text(&mut self) -> Result<String, String> {
        let len = self.u32()?;
        let at = self.at;
        String::from_utf8(self.take(u64::from(len))?.to_vec())
            .map_err(|_| format!("{METADATA_FILE} has a name at byte {at} that is not UTF-8"))
    }
}

/// A checkpoint (or savepoint) being written: its directory, to which [`StateFileWriter`]s
/// write. Clones name the same checkpoint (each shard's writers hold one).
#[derive(Clone, Debug)]
pub struct PendingCheckpoint {
    checkpoint: u64,
    dir: PathBuf,
    /// A savepoint: every file it consists of is in its own directory (no shared files).
    savepoint: bool,
}

impl PendingCheckpoint {
    /// The checkpoint's number.
    pub fn checkpoint(&self) -> u64 {
        self.checkpoint
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether it is a savepoint (self-contained: see the module docs).
    pub fn is_savepoint(&self) -> bool {
        self.savepoint
    }

    /// Checkpoint `checkpoint` (a savepoint if `savepoint`) in `dir`, which another process
    /// began: the executors of a run spread over several write their state files into the
    /// directory their coordinator began, on storage they share.
    pub fn joined(checkpoint: u64, dir: PathBuf, savepoint: bool) -> PendingCheckpoint {
        PendingCheckpoint {
            checkpoint,
            dir,
            savepoint,
        }
    }

    /// The job's directory of shared files.
    fn shared_dir(&self) -> PathBuf {
        job_dir_of(&self.dir).join(SHARED_DIR)
    }
}

/// The job directory a checkpoint directory is in.
fn job_dir_of(checkpoint_dir: &Path) -> &Path {
    checkpoint_dir.parent().unwrap_or(checkpoint_dir)
}

/// Where the file a checkpoint in `dir` lists as `name` is: in `dir`, or, for `shared/…`, in
/// the job's shared directory.
pub fn resolve(dir: &Path, name: &str) -> PathBuf {
    if name.starts_with(SHARED_DIR) && name[SHARED_DIR.len()..].starts_with('/') {
        job_dir_of(dir).join(name)
    } else {
        dir.join(name)
    }
}

/// A checkpoint a restore can use, with every file checked.
#[derive(Clone, Debug)]
pub struct CompletedCheckpoint {
    /// Its directory.
    pub dir: PathBuf,
    /// Its metadata.
    pub metadata: CheckpointMetadata,
    /// Per task state file (`metadata.files`), its contents where verifying the checkpoint
    /// read them: what a restore reads next, so that it reads each file once.
    state_files: Vec<Option<Bytes>>,
}

impl CompletedCheckpoint {
    /// The path of one of its files.
    pub fn path_of(&self, file: &StoredFile) -> PathBuf {
        resolve(&self.dir, &file.name)
    }

    /// The contents of its task state file `index` (of `metadata.files`), checked against
    /// the length and CRC-32 the metadata says: the bytes verifying the checkpoint read,
    /// handed over once, or read now (the errors of [`read_verified`]).
    pub fn take_state_file(&mut self, index: usize) -> Result<Bytes, StateError> {
        match self.state_files.get_mut(index).and_then(Option::take) {
            Some(bytes) => Ok(bytes),
            None => read_verified(&self.dir, &self.metadata.files[index]),
        }
    }
}

/// What [`CheckpointStorage::latest`] found: the checkpoint to restore, if any, and the newer
/// ones it passed over, newest first, each with why.
#[derive(Debug)]
pub struct LatestCheckpoint {
    /// The newest usable checkpoint.
    pub usable: Option<CompletedCheckpoint>,
    /// The newer ones that cannot be used ([`StateErrorKind::CorruptCheckpoint`] errors).
    pub skipped: Vec<StateError>,
}

/// One job's checkpoint directory, held by this process (see the module docs).
#[derive(Debug)]
pub struct CheckpointStorage {
    job: String,
    dir: PathBuf,
    /// Holds the `flock` while the storage lives (`None`: opened by [`CheckpointStorage::open_shared`]).
    _lock: Option<File>,
}

impl CheckpointStorage {
    /// Opens (creating it if needed) the directory of `job`'s checkpoints under `root`, and
    /// takes its lock.
    pub fn open(root: &Path, job: &str) -> Result<CheckpointStorage, StateError> {
        let mut storage = CheckpointStorage::open_shared(root, job)?;
        let dir = &storage.dir;
        let lock_path = dir.join(LOCK_FILE);
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|source| StateError::io(&lock_path, "opening", source))?;
        let locked = crate::lock::try_lock_exclusive(&lock)
            .map_err(|source| StateError::io(&lock_path, "locking", source))?;
        if !locked {
            let mut holder = String::new();
            let holder = match lock.read_to_string(&mut holder) {
                Ok(_) if !holder.trim().is_empty() => format!("pid {}", holder.trim()),
                _ => "its lock file names no pid".to_string(),
            };
            return Err(StateErrorKind::CheckpointDirectoryInUse {
                path: dir.clone(),
                holder,
            }
            .into());
        }
        lock.set_len(0)
            .and_then(|()| write!(lock, "{}", std::process::id()))
            .map_err(|source| StateError::io(&lock_path, "writing", source))?;
        storage._lock = Some(lock);
        Ok(storage)
    }

    /// Opens (creating it if needed) the directory of `job`'s checkpoints under `root` without
    /// its lock, to read checkpoints back and write state files into checkpoints another
    /// process begins and commits: the other executors of a run spread over several, whose
    /// coordinator holds the lock. Begin, commit and discard nothing through it.
    pub fn open_shared(root: &Path, job: &str) -> Result<CheckpointStorage, StateError> {
        if !is_plain_name(job) {
            return Err(StateError::invalid_config(
                "checkpoint job name",
                format!("'{job}'"),
                "use a job name that can name a directory: not empty, not '.' or '..', \
                 without '/'",
            ));
        }
        let dir = root.join(job);
        fs::create_dir_all(&dir).map_err(|source| StateError::io(&dir, "creating", source))?;
        Ok(CheckpointStorage {
            job: job.to_string(),
            dir,
            _lock: None,
        })
    }

    /// The job's checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn checkpoint_dir(&self, checkpoint: u64) -> PathBuf {
        self.dir.join(format!("chk-{checkpoint}"))
    }

    /// Starts writing checkpoint `checkpoint`: its directory, empty. What a crash left of an
    /// uncommitted attempt at the same number goes; a committed one is never overwritten.
    pub fn begin(&self, checkpoint: u64) -> Result<PendingCheckpoint, StateError> {
        let dir = self.checkpoint_dir(checkpoint);
        if dir.join(METADATA_FILE).exists() {
            return Err(StateError::invalid_config(
                "checkpoint number",
                checkpoint,
                format!(
                    "{} is already complete; number new checkpoints after the latest one",
                    dir.display()
                ),
            ));
        }
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(|source| StateError::io(&dir, "removing", source))?;
        }
        fs::create_dir(&dir).map_err(|source| StateError::io(&dir, "creating", source))?;
        Ok(PendingCheckpoint {
            checkpoint,
            dir,
            savepoint: false,
        })
    }

    /// Starts writing savepoint `checkpoint` of the job into a new directory under `target`
    /// (`savepoint-<job>-<checkpoint>-<time>`, made with `target` if needed).
    pub fn begin_savepoint(
        &self,
        target: &Path,
        checkpoint: u64,
        timestamp_ms: i64,
    ) -> Result<PendingCheckpoint, StateError> {
        fs::create_dir_all(target).map_err(|source| StateError::io(target, "creating", source))?;
        let dir = target.join(format!(
            "savepoint-{}-{checkpoint}-{:x}",
            self.job, timestamp_ms
        ));
        fs::create_dir(&dir).map_err(|source| StateError::io(&dir, "creating", source))?;
        Ok(PendingCheckpoint {
            checkpoint,
            dir,
            savepoint: true,
        })
    }

    /// Deletes what an attempt at a savepoint wrote (it never completed).
    pub fn discard_savepoint(&self, pending: &PendingCheckpoint) -> Result<(), StateError> {
        if pending.savepoint && !pending.dir.join(METADATA_FILE).exists() {
            fs::remove_dir_all(&pending.dir)
                .map_err(|source| StateError::io(&pending.dir, "removing", source))?;
        }
        Ok(())
    }

    /// Completes `pending` with `metadata` (see the module docs): from here on a restore may
    /// use it.
    pub fn commit(
        &self,
        pending: PendingCheckpoint,
        metadata: &CheckpointMetadata,
    ) -> Result<CompletedCheckpoint, StateError> {
        if metadata.job != self.job
            || metadata.checkpoint != pending.checkpoint
            || pending.savepoint
        {
            return Err(StateError::invalid_config(
                "checkpoint metadata",
                format!("job '{}', checkpoint {}", metadata.job, metadata.checkpoint),
                format!(
                    "commit checkpoint {} of job '{}' with its own metadata",
                    pending.checkpoint, self.job
                ),
            ));
        }
        let completed = write_metadata(pending, metadata)?;
        // After the metadata: a process killed between the two leaves a checkpoint that is
        // complete without the marker (the next commit writes it), never the marker with no
        // complete checkpoint, which a restore would take for damage and refuse.
        if !self.has_completed() {
            let marker = self.dir.join(COMPLETED_MARKER);
            File::create(&marker)
                .and_then(|file| file.sync_all())
                .and_then(|()| File::open(&self.dir)?.sync_all())
                .map_err(|source| StateError::io(&marker, "writing", source))?;
        }
        Ok(completed)
    }

    /// Completes savepoint `pending` with `metadata` (its files all in its own directory):
    /// written like a checkpoint's, but outside the job's checkpoints (no retention, no
    /// marker).
    pub fn commit_savepoint(
        &self,
        pending: PendingCheckpoint,
        metadata: &CheckpointMetadata,
    ) -> Result<CompletedCheckpoint, StateError> {
        let own = metadata.all_files().all(|file| file.shared_by().is_none());
        if !pending.savepoint
            || metadata.job != self.job
            || metadata.checkpoint != pending.checkpoint
            || !own
        {
            return Err(StateError::invalid_config(
                "savepoint metadata",
                format!("job '{}', checkpoint {}", metadata.job, metadata.checkpoint),
                format!(
                    "commit a savepoint begun with begin_savepoint, of job '{}', listing only \
                     files of its own directory",
                    self.job
                ),
            ));
        }
        write_metadata(pending, metadata)
    }

    /// Whether a checkpoint of the job ever completed in this directory (its newest usable
    /// one may still be gone or damaged since).
    pub fn has_completed(&self) -> bool {
        self.dir.join(COMPLETED_MARKER).exists()
    }

    /// The job's checkpoints that are committed or were begun, by number, oldest first.
    fn numbered(&self) -> Result<Vec<(u64, PathBuf)>, StateError> {
        let mut found = Vec::new();
        let entries = fs::read_dir(&self.dir)
            .map_err(|source| StateError::io(&self.dir, "reading", source))?;
        for entry in entries {
            let entry = entry.map_err(|source| StateError::io(&self.dir, "reading", source))?;
            let name = entry.file_name();
            let number = name
                .to_str()
                .and_then(|name| name.strip_prefix("chk-"))
                .and_then(|number| number.parse::<u64>().ok());
            if let Some(number) = number {
                found.push((number, entry.path()));
            }
        }
        found.sort_unstable();
        Ok(found)
    }

    /// The highest checkpoint number in the job's directory, committed or not: a new run
    /// numbers its checkpoints after it.
    pub fn highest_number(&self) -> Result<Option<u64>, StateError> {
        Ok(self.numbered()?.last().map(|(number, _)| *number))
    }

    /// Deletes what an attempt at `checkpoint` wrote, unless it was committed.
    pub fn discard(&self, checkpoint: u64) -> Result<(), StateError> {
        let dir = self.checkpoint_dir(checkpoint);
        if dir.exists() && !dir.join(METADATA_FILE).exists() {
            fs::remove_dir_all(&dir).map_err(|source| StateError::io(&dir, "removing", source))?;
        }
        Ok(())
    }

    /// The newest checkpoint a restore can use (see the module docs).
    pub fn latest(&self) -> Result<LatestCheckpoint, StateError> {
        let mut skipped = Vec::new();
        for (_, dir) in self.numbered()?.into_iter().rev() {
            match self.verify(&dir) {
                Ok(completed) => {
                    return Ok(LatestCheckpoint {
                        usable: Some(completed),
                        skipped,
                    })
                }
                Err(problem) => skipped.push(problem),
            }
        }
        Ok(LatestCheckpoint {
            usable: None,
            skipped,
        })
    }

    /// The metadata of a committed checkpoint of this job in `dir`.
    fn committed_metadata(&self, dir: &Path) -> Result<CheckpointMetadata, StateError> {
        let metadata = read_metadata(dir)?;
        if metadata.job != self.job {
            return Err(corrupt(
                dir,
                format!("it belongs to job '{}', not '{}'", metadata.job, self.job),
            ));
        }
        Ok(metadata)
    }

    /// Checks one checkpoint directory: its metadata and every file it lists.
    fn verify(&self, dir: &Path) -> Result<CompletedCheckpoint, StateError> {
        verify_dir(dir, self.committed_metadata(dir)?)
    }

    /// Keeps the `keep` newest committed checkpoints (at least one) and any attempt newer than
    /// all of them (it may be in progress), and deletes the rest: older committed ones and
    /// attempts that never completed (`execution.checkpointing.num-retained`). Committed means
    /// its metadata is this job's and intact; its files are checked when it is restored.
    ///
    /// Then it sweeps the shared files (see the module docs): one that no retained checkpoint
    /// lists goes, unless it was written for a checkpoint newer than the newest committed one.
    pub fn retain(&self, keep: usize) -> Result<(), StateError> {
        let keep = keep.max(1);
        let mut committed = 0;
        let mut newest = None;
        let mut referenced = std::collections::HashSet::new();
        for (number, dir) in self.numbered()?.into_iter().rev() {
            let remove = match self.committed_metadata(&dir) {
                Ok(metadata) => {
                    committed += 1;
                    newest = newest.or(Some(number));
                    if committed <= keep {
                        referenced.extend(metadata.referenced.into_iter().map(|file| file.name));
                    }
                    committed > keep
                }
                Err(_) => committed > 0,
            };
            if remove {
                fs::remove_dir_all(&dir)
                    .map_err(|source| StateError::io(&dir, "removing", source))?;
            }
        }
        match newest {
            Some(newest) => self.sweep_shared(newest, &referenced),
            None => Ok(()),
        }
    }

    /// Deletes the shared files of checkpoints up to `newest` that are not `referenced`.
    fn sweep_shared(
        &self,
        newest: u64,
        referenced: &std::collections::HashSet<String>,
    ) -> Result<(), StateError> {
        let shared = self.dir.join(SHARED_DIR);
        let entries = match fs::read_dir(&shared) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(StateError::io(&shared, "reading", source)),
        };
        for entry in entries {
            let entry = entry.map_err(|source| StateError::io(&shared, "reading", source))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let listed = referenced.contains(&format!("{SHARED_DIR}/{name}"));
            if written_for(&name).is_some_and(|n| n <= newest) && !listed {
                let path = entry.path();
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                    Err(source) => return Err(StateError::io(&path, "removing", source)),
                }
            }
        }
        Ok(())
    }
}

/// Writes `metadata` into `pending`'s directory as its `_metadata`: a temporary file, synced,
/// renamed, and the directory synced (see the module docs).
fn write_metadata(
    pending: PendingCheckpoint,
    metadata: &CheckpointMetadata,
) -> Result<CompletedCheckpoint, StateError> {
    let temp = pending.dir.join(METADATA_TEMP);
    let mut file =
        File::create(&temp).map_err(|source| StateError::io(&temp, "creating", source))?;
    file.write_all(&metadata.to_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| StateError::io(&temp, "writing", source))?;
    let path = pending.dir.join(METADATA_FILE);
    fs::rename(&temp, &path).map_err(|source| StateError::io(&path, "renaming into", source))?;
    File::open(&pending.dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|source| StateError::io(&pending.dir, "syncing", source))?;
    Ok(CompletedCheckpoint {
        dir: pending.dir,
        metadata: metadata.clone(),
        state_files: Vec::new(),
    })
}

/// The metadata of the committed checkpoint or savepoint in `dir`, of whichever job.
fn read_metadata(dir: &Path) -> Result<CheckpointMetadata, StateError> {
    let path = dir.join(METADATA_FILE);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Err(corrupt(
                dir,
                format!("it has no {METADATA_FILE}: it never completed"),
            ))
        }
        Err(error) => return Err(corrupt(&path, format!("reading it failed: {error}"))),
    };
    CheckpointMetadata::from_bytes(&bytes).map_err(|problem| corrupt(&path, problem))
}

/// Checks the metadata of the checkpoint in `dir` and every file it lists.
fn verify_dir(dir: &Path, metadata: CheckpointMetadata) -> Result<CompletedCheckpoint, StateError> {
    // The task state files are kept as read: a restore reads them next.
    let state_files = metadata
        .files
        .iter()
        .map(|file| read_verified(dir, file).map(Some))
        .collect::<Result<Vec<_>, _>>()?;
    for file in &metadata.referenced {
        verify_file(dir, file)?;
    }
    Ok(CompletedCheckpoint {
        dir: dir.to_path_buf(),
        metadata,
        state_files,
    })
}

/// Opens the savepoint (or retained checkpoint) at `path` — its directory or its `_metadata`
/// file — of whichever job, checking its metadata and every file it lists: what a job started
/// with `--from-savepoint` restores. A savepoint is self-contained; a checkpoint's shared
/// files are found in its job's directory beside it.
pub fn open_savepoint(path: &Path) -> Result<CompletedCheckpoint, StateError> {
    let dir = if path.file_name().is_some_and(|name| name == METADATA_FILE) {
        path.parent().unwrap_or(path)
    } else {
        path
    };
    if !dir.is_dir() {
        return Err(corrupt(
            dir,
            "it is not a directory: pass a savepoint's directory (savepoint-…) or a \
             checkpoint's (chk-<n>)"
                .to_string(),
        ));
    }
    verify_dir(dir, read_metadata(dir)?)
}

/// Checks that `file` of the checkpoint in `dir` has the length and CRC-32 its metadata says
/// (a [`StateErrorKind::CorruptCheckpoint`] error naming the file and what is wrong).
pub fn verify_file(dir: &Path, file: &StoredFile) -> Result<(), StateError> {
    let path = resolve(dir, &file.name);
    let (len, crc) = checksum_file(&path)
        .map_err(|error| corrupt(&path, format!("reading it failed: {error}")))?;
    check_stored(&path, file, len, crc)
}

/// The contents of `file` of the checkpoint in `dir`, read once and checked against the length
/// and CRC-32 its metadata says (the errors of [`verify_file`]).
pub fn read_verified(dir: &Path, file: &StoredFile) -> Result<Bytes, StateError> {
    let path = resolve(dir, &file.name);
    let contents =
        read_whole(&path).map_err(|error| corrupt(&path, format!("reading it failed: {error}")))?;
    check_stored(&path, file, contents.len() as u64, crc32(&contents))?;
    Ok(contents)
}

/// Reads a whole file past the page cache where its file system allows (`O_DIRECT`, in large
/// aligned reads), through it where not. A restore reads each state file once, right after
/// it was written past the cache: through the cache, in its small read-ahead steps and with a
/// copy out of it, 1.1 GB took 2.5 s to read on a disk that delivers it in 0.7 s.
fn read_whole(path: &Path) -> std::io::Result<Bytes> {
    /// The alignment `O_DIRECT` asks of the buffer, offsets and lengths (a page covers every
    /// block size in use).
    const ALIGN: usize = 4096;
    /// Bytes per read: enough for the device to work on several requests at once.
    const STEP: usize = 8 << 20;
    let refused = |error: &std::io::Error| error.raw_os_error() == Some(libc::EINVAL);
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(file) => file,
        Err(error) if refused(&error) => return fs::read(path).map(Bytes::from),
        Err(error) => return Err(error),
    };
    let len = usize::try_from(file.metadata()?.len())
        .map_err(|_| std::io::Error::other("the file is larger than this machine's memory"))?;
    let mut buffer = AlignedVec::<ALIGN>::with_capacity(len.next_multiple_of(ALIGN));
    buffer.resize(len.next_multiple_of(ALIGN), 0);
    let mut read = 0;
    while read < len {
        let end = (read + STEP).min(buffer.len());
        match file.read_at(&mut buffer.as_mut_slice()[read..end], read as u64) {
            // The file ended early (it shrank): its length check says so.
            Ok(0) => break,
            Ok(count) => read += count,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            // The file system refuses direct reads after all (or a short read left the offset
            // unaligned): read it through the cache.
            Err(error) if refused(&error) => return fs::read(path).map(Bytes::from),
            Err(error) => return Err(error),
        }
    }
    Ok(Bytes::from_owner(buffer).slice(..read.min(len)))
}

fn check_stored(path: &Path, file: &StoredFile, len: u64, crc: u32) -> Result<(), StateError> {
    if len != file.len {
        return Err(corrupt(
            path,
            format!(
                "it has {len} bytes, the metadata says {}: it is truncated or was changed",
                file.len
            ),
        ));
    }
    if crc != file.crc32 {
        return Err(corrupt(
            path,
            format!(
                "its CRC-32 is {crc:#010x}, the metadata says {:#010x}: it is damaged",
                file.crc32
            ),
        ));
    }
    Ok(())
}

/// The length and CRC-32 of a file, read in 64 KiB pieces.
fn checksum_file(path: &Path) -> std::io::Result<(u64, u32)> {
    let mut file = File::open(path)?;
    let mut buffer = vec![0u8; 64 << 10];
    let mut crc = Crc32::default();
    let mut len = 0u64;
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            return Ok((len, crc.finish()));
        }
        crc.update(&buffer[..read]);
        len += read as u64;
    }
}

/// Whether `name` names one entry of a directory: not empty, not `.` or `..`, no `/` or NUL.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

fn corrupt(path: &Path, problem: String) -> StateError {
    StateErrorKind::CorruptCheckpoint {
        path: path.to_path_buf(),
        problem,
    }
    .into()
}

/// Writes one state file of a pending checkpoint through io_uring; call on a glommio shard.
pub struct StateFileWriter {
    name: String,
    path: PathBuf,
    writer: DmaStreamWriter,
    crc: Crc32,
    len: u64,
}

impl std::fmt::Debug for StateFileWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateFileWriter")
            .field("path", &self.path)
            .field("len", &self.len)
            .finish()
    }
}

impl StateFileWriter {
    /// Creates the file `name` in `pending`'s directory.
    pub async fn create(
        pending: &PendingCheckpoint,
        name: &str,
    ) -> Result<StateFileWriter, StateError> {
        if !is_plain_name(name) || name.starts_with(METADATA_FILE) {
            return Err(StateError::invalid_config(
                "checkpoint file name",
                format!("'{name}'"),
                format!("use a plain file name, without '/', not starting with {METADATA_FILE}"),
            ));
        }
        StateFileWriter::create_at(name.to_string(), pending.dir.join(name)).await
    }

    /// Creates the shared file `<checkpoint>-<name>` of `pending`'s job (see the module docs);
    /// the metadata lists it as `shared/<checkpoint>-<name>`. A savepoint's goes into its own
    /// directory, listed as `<checkpoint>-<name>`.
    pub async fn create_shared(
        pending: &PendingCheckpoint,
        name: &str,
    ) -> Result<StateFileWriter, StateError> {
        if !is_plain_name(name) {
            return Err(StateError::invalid_config(
                "shared checkpoint file name",
                format!("'{name}'"),
                "use a plain file name, without '/'",
            ));
        }
        let name = format!("{}-{name}", pending.checkpoint);
        if pending.savepoint {
            // A savepoint shares nothing: the file goes into its own directory.
            let path = pending.dir.join(&name);
            return StateFileWriter::create_at(name, path).await;
        }
        let dir = pending.shared_dir();
        fs::create_dir_all(&dir).map_err(|source| StateError::io(&dir, "creating", source))?;
        let path = dir.join(&name);
        StateFileWriter::create_at(format!("{SHARED_DIR}/{name}"), path).await
    }

    /// Creates the file at `path`, which the metadata will list as `name`.
    async fn create_at(name: String, path: PathBuf) -> Result<StateFileWriter, StateError> {
        // Readable too: glommio probes each device's polled I/O with a read on the first file
        // it opens there, and logs an error when that read is refused.
        let file = glommio::io::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .dma_open(&path)
            .await
            .map_err(|error| StateError::io(&path, "creating", error.into()))?;
        Ok(StateFileWriter {
            name,
            path,
            writer: DmaStreamWriterBuilder::new(file)
                .with_buffer_size(256 << 10)
                .with_write_behind(2)
                .build(),
            crc: Crc32::default(),
            len: 0,
        })
    }

    /// Appends `bytes`.
    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        self.writer
            .write_all(bytes)
            .await
            .map_err(|error| StateError::io(&self.path, "writing", error))?;
        self.crc.update(bytes);
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// Syncs and closes the file: what the metadata records of it.
    pub async fn finish(mut self) -> Result<StoredFile, StateError> {
        self.writer
            .close()
            .await
            .map_err(|error| StateError::io(&self.path, "closing", error))?;
        Ok(StoredFile {
            name: self.name,
            len: self.len,
            crc32: self.crc.finish(),
        })
    }
}
