//! The file sink (Flink's `FileSink` with row formats): records become lines of part files
//! under the output directory, written through the shard's io_uring (glommio's buffered file
//! streams), and exactly once through the job's checkpoints (`two_phase`).
//!
//! A part file is written hidden, as `<bucket>/.part-<subtask>-<n>.inprogress`. At a
//! checkpoint barrier every open part is closed (flushed and synced) and becomes pending: its
//! name is a committable of the checkpoint. When the checkpoint completes, the part is renamed
//! to `<bucket>/part-<subtask>-<n>` and the bucket's directory synced. A reader of the output
//! directory (skipping names that start with a dot, as Hadoop's and Flink's readers do) never
//! sees a partial or uncommitted part. A job restored from a checkpoint renames the parts
//! the checkpoint holds (again) and deletes the hidden parts no checkpoint holds: their records
//! are replayed.
//!
//! Parts roll at every checkpoint barrier (Flink's `OnCheckpointRollingPolicy`, so that a part
//! never outlives its checkpoint and a restore never truncates one), and between barriers by
//! the [`RollingPolicy`]: size, age and inactivity, checked before each batch is written.
//! Numbers `n` count up per subtask across buckets and runs: a run starts after the highest
//! number it finds in the directory, so a key's parts sort in the order they were written.
//!
//! Buckets (subdirectories) come from a [`BucketAssigner`]: by processing or event time, per
//! hour or day (Flink's `DateTimeBucketAssigner`, `yyyy-MM-dd--HH`, UTC), or by a function of
//! the record. An output directory belongs to one job at a time: a starting job deletes the
//! hidden parts of its subtasks that the checkpoint it restores does not hold.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::fmt::Display;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::time::now_ms;

use futures::future::LocalBoxFuture;
use glommio::io::{BufferedFile, Directory, DmaBuffer, DmaFile};

use super::two_phase::{
    two_phase_writer, CommitError, Committer, DeliveryGuarantee, TransactionWriter,
    TwoPhaseCommitSink,
};
use super::wake_filter::polled_when_woken;
use super::{ConnectorError, Sink, SinkWriter};
use crate::operator::RuntimeContext;
use crate::record::NO_TIMESTAMP;
use crate::time::TimeDomain;

/// Appends one record's line (with its newline) to the buffer; an error names what cannot be
/// written.
type Encoder<T> = Box<dyn FnMut(&T, &mut Vec<u8>) -> Result<(), String>>;

/// How records become lines: makes one encoder per subtask.
type RowFormat<T> = Arc<dyn Fn() -> Encoder<T> + Send + Sync>;

/// Writes records as lines into part files under a directory, exactly once by default (see
/// the module docs).
pub struct FileSink<T> {
    dir: PathBuf,
    format: RowFormat<T>,
    buckets: Option<BucketAssigner<T>>,
    rolling: Option<RollingPolicy>,
    guarantee: Option<DeliveryGuarantee>,
}

impl<T: Display> FileSink<T> {
    /// One line per record, its `Display` form.
    pub fn lines(dir: impl Into<PathBuf>) -> Self {
        FileSink::with_formatter(dir, |record: &T, line: &mut String| {
            use std::fmt::Write;
            // Writing into a String cannot fail.
            let _ = write!(line, "{record}");
        })
    }
}

impl<T: serde::Serialize> FileSink<T> {
    /// One JSON object per line (JSON Lines), by the record's `Serialize`.
    pub fn json_lines(dir: impl Into<PathBuf>) -> Self {
        FileSink::with_format(
            dir,
            Arc::new(|| {
                Box::new(|record: &T, out: &mut Vec<u8>| {
                    serde_json::to_writer(&mut *out, record)
                        .map_err(|e| format!("a record as JSON: {e}"))?;
                    out.push(b'\n');
                    Ok(())
                })
            }),
        )
    }

    /// One CSV row per line (RFC 4180 quoting, no header), by the record's `Serialize`: a
    /// struct or tuple of plain fields.
    pub fn csv(dir: impl Into<PathBuf>) -> Self {
        FileSink::with_format(
            dir,
            Arc::new(|| {
                let row = Rc::new(RefCell::new(Vec::new()));
                let mut rows = csv::WriterBuilder::new()
                    .has_headers(false)
                    .from_writer(RowBuffer(Rc::clone(&row)));
                Box::new(move |record: &T, out: &mut Vec<u8>| {
                    rows.serialize(record)
                        .and_then(|()| rows.flush().map_err(csv::Error::from))
                        .map_err(|e| {
                            format!(
                                "a record as a CSV row: {e}; CSV rows take records of plain \
                                 fields (numbers, strings, booleans), use json_lines for nested ones"
                            )
                        })?;
                    out.append(&mut row.borrow_mut());
                    Ok(())
                })
            }),
        )
    }
}

/// Where a CSV writer puts its rows, for the encoder to take them.
struct RowBuffer(Rc<RefCell<Vec<u8>>>);

impl std::io::Write for RowBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<T> FileSink<T> {
    /// One line per record, written by `format` (without the newline).
    pub fn with_formatter(
        dir: impl Into<PathBuf>,
        format: impl Fn(&T, &mut String) + Send + Sync + 'static,
    ) -> Self {
        let format = Arc::new(format);
        FileSink::with_format(
            dir,
            Arc::new(move || {
                let format = Arc::clone(&format);
                let mut line = String::new();
                Box::new(move |record: &T, out: &mut Vec<u8>| {
                    line.clear();
                    format(record, &mut line);
                    out.extend_from_slice(line.as_bytes());
                    out.push(b'\n');
                    Ok(())
                })
            }),
        )
    }

    fn with_format(dir: impl Into<PathBuf>, format: RowFormat<T>) -> Self {
        let dir = dir.into();
        FileSink {
            // Committables name their files absolutely: a resumed job commits them wherever
            // it runs from.
            dir: std::path::absolute(&dir).unwrap_or(dir),
            format,
            buckets: None,
            rolling: None,
            guarantee: None,
        }
    }

    /// Writes each record into the bucket (subdirectory) `assigner` gives it.
    pub fn with_bucket_assigner(mut self, assigner: BucketAssigner<T>) -> Self {
        self.buckets = Some(assigner);
        self
    }

    /// Rolls parts between checkpoints by `policy`, instead of the job's
    /// `sink.rolling-policy.*`.
    pub fn with_rolling_policy(mut self, policy: RollingPolicy) -> Self {
        self.rolling = Some(policy);
        self
    }

    /// This sink's guarantee, instead of the job's `sink.delivery-guarantee`.
    pub fn with_delivery_guarantee(mut self, guarantee: DeliveryGuarantee) -> Self {
        self.guarantee = Some(guarantee);
        self
    }
}

/// When a part rolls between checkpoint barriers (Flink's `DefaultRollingPolicy`): checked
/// before each batch is written, so a part may pass the size by one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RollingPolicy {
    max_part_size: u64,
    rollover_interval: Duration,
    inactivity_interval: Duration,
}

impl Default for RollingPolicy {
    /// Flink's defaults: 128 MiB, 60 s open, 60 s without a write.
    fn default() -> Self {
        RollingPolicy {
            max_part_size: 128 << 20,
            rollover_interval: Duration::from_secs(60),
            inactivity_interval: Duration::from_secs(60),
        }
    }
}

impl RollingPolicy {
    /// Rolls a part once it holds `bytes`.
    pub fn with_max_part_size(mut self, bytes: u64) -> Self {
        self.max_part_size = bytes.max(1);
        self
    }

    /// Rolls a part open this long.
    pub fn with_rollover_interval(mut self, interval: Duration) -> Self {
        self.rollover_interval = interval;
        self
    }

    /// Rolls a part not written to for this long.
    pub fn with_inactivity_interval(mut self, interval: Duration) -> Self {
        self.inactivity_interval = interval;
        self
    }

    fn rolls(&self, part: &OpenPart, now: Instant) -> bool {
        part.bytes >= self.max_part_size
            || now.duration_since(part.opened) >= self.rollover_interval
            || now.duration_since(part.last_write) >= self.inactivity_interval
    }
}

/// A record's bucket, from the record and its timestamp; an error says why it has none.
type AssignBucket<T> = dyn Fn(&T, i64) -> Result<String, String> + Send + Sync;

/// Gives each record its bucket: a subdirectory of the output directory.
pub struct BucketAssigner<T> {
    assign: Arc<AssignBucket<T>>,
}

impl<T> Clone for BucketAssigner<T> {
    fn clone(&self) -> Self {
        BucketAssigner {
            assign: Arc::clone(&self.assign),
        }
    }
}

/// How finely a time bucket assigner divides time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BucketPeriod {
    /// `yyyy-MM-dd--HH` (Flink's default).
    Hour,
    /// `yyyy-MM-dd`.
    Day,
}

impl<T> BucketAssigner<T> {
    /// A bucket per hour or day (UTC) of the record's event time, or of the time it is
    /// written.
    pub fn date_time(period: BucketPeriod, domain: TimeDomain) -> Self {
        BucketAssigner {
            assign: Arc::new(move |_: &T, timestamp: i64| {
                let ms = match domain {
                    TimeDomain::ProcessingTime => now_ms(),
                    TimeDomain::EventTime if timestamp == NO_TIMESTAMP => {
                        return Err("a record without a timestamp cannot go to an event-time \
                                    bucket; assign timestamps (a WatermarkStrategy) or bucket \
                                    by processing time"
                            .to_string())
                    }
                    TimeDomain::EventTime => timestamp,
                };
                Ok(date_time_bucket(ms, period))
            }),
        }
    }

    /// The bucket `bucket` names for the record (a `/` becomes `_`, and a leading `.` is
    /// prefixed with `_`, so that a bucket is one visible directory).
    pub fn by(bucket: impl Fn(&T) -> String + Send + Sync + 'static) -> Self {
        BucketAssigner {
            assign: Arc::new(move |record: &T, _| Ok(bucket(record))),
        }
    }
}

/// `ms` since the epoch as `yyyy-MM-dd--HH` or `yyyy-MM-dd`, UTC.
fn date_time_bucket(ms: i64, period: BucketPeriod) -> String {
    let days = ms.div_euclid(86_400_000);
    let hour = ms.rem_euclid(86_400_000) / 3_600_000;
    let (year, month, day) = crate::time::civil_from_days(days);
    match period {
        BucketPeriod::Hour => format!("{year:04}-{month:02}-{day:02}--{hour:02}"),
        BucketPeriod::Day => format!("{year:04}-{month:02}-{day:02}"),
    }
}

/// A bucket name as one visible directory name (`%`, `/` and NUL, and a leading `.`, escaped
/// as `%XX`); an empty one is the output directory itself.
fn clean_bucket(bucket: String) -> String {
    if !bucket.contains(['%', '/', '\0']) && !bucket.starts_with('.') {
        return bucket;
    }
    let mut clean = String::with_capacity(bucket.len() + 4);
    for (i, c) in bucket.chars().enumerate() {
        match c {
            '%' => clean.push_str("%25"),
            '/' => clean.push_str("%2F"),
            '\0' => clean.push_str("%00"),
            '.' if i == 0 => clean.push_str("%2E"),
            c => clean.push(c),
        }
    }
    clean
}

/// A part closed for commit, named absolutely.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct PendingPart {
    /// Where it is written: `<bucket>/.part-<subtask>-<n>.inprogress`.
    pub hidden: String,
    /// Its committed name: `<bucket>/part-<subtask>-<n>`.
    pub visible: String,
}

/// Whether `a` and `b` name the same path (relative ones from the working directory).
fn same_path(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::path::absolute(a), std::path::absolute(b)),
            (Ok(a), Ok(b)) if a == b
        )
}

/// A part file name's subtask and number: `part-<s>-<n>` (visible) or
/// `.part-<s>-<n>.inprogress` (hidden).
fn part_name(name: &str) -> Option<(bool, usize, u64)> {
    let (hidden, rest) = match name.strip_prefix(".part-") {
        Some(rest) => (true, rest.strip_suffix(".inprogress")?),
        None => (false, name.strip_prefix("part-")?),
    };
    let (subtask, n) = rest.split_once('-')?;
    Some((hidden, subtask.parse().ok()?, n.parse().ok()?))
}

/// Every part file under `dir` and its buckets (one level down): its path, whether hidden,
/// its subtask and number.
fn scan_parts(dir: &Path) -> std::io::Result<Vec<(PathBuf, bool, usize, u64)>> {
    let mut parts = Vec::new();
    let mut dirs = vec![(dir.to_path_buf(), true)];
    while let Some((dir, top)) = dirs.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some((hidden, subtask, n)) = part_name(&name) {
                parts.push((entry.path(), hidden, subtask, n));
            } else if top && entry.file_type()?.is_dir() {
                dirs.push((entry.path(), false));
            }
        }
    }
    Ok(parts)
}

impl<T: 'static> TwoPhaseCommitSink<T> for FileSink<T> {
    type Committable = PendingPart;

    fn create_writer(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Box<dyn TransactionWriter<T, PendingPart>>, ConnectorError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| {
            ConnectorError::external(format!(
                "file sink cannot create directory '{}': {e}; choose a writable output directory",
                self.dir.display()
            ))
        })?;
        let parts = scan_parts(&self.dir).map_err(|e| {
            ConnectorError::external(format!(
                "file sink cannot read directory '{}': {e}",
                self.dir.display()
            ))
        })?;
        let next = parts
            .iter()
            .filter(|(_, _, subtask, _)| *subtask == ctx.subtask)
            .map(|(_, _, _, n)| n + 1)
            .max()
            .unwrap_or(0);
        Ok(Box::new(FileWriter {
            dir: self.dir.clone(),
            subtask: ctx.subtask,
            encode: (self.format)(),
            buckets: self.buckets.clone(),
            rolling: self.rolling.unwrap_or(ctx.sinks.rolling_policy),
            parts: HashMap::new(),
            closed: Vec::new(),
            next,
            batch: Vec::new(),
        }))
    }

    fn create_committer(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Box<dyn Committer<PendingPart>>, ConnectorError> {
        Ok(Box::new(FileCommitter {
            dir: self.dir.clone(),
            subtask: ctx.subtask,
            parallelism: ctx.parallelism,
        }))
    }

    fn delivery_guarantee(&self) -> Option<DeliveryGuarantee> {
        self.guarantee
    }
}

impl<T: 'static> Sink<T> for FileSink<T> {
    fn create_writer(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Box<dyn SinkWriter<T>>, ConnectorError> {
        two_phase_writer(self, ctx)
    }
}

fn io_error(what: &str, path: &Path, e: impl Display) -> ConnectorError {
    ConnectorError::external(format!("file sink cannot {what} '{}': {e}", path.display()))
}

/// A part being written.
struct OpenPart {
    part: PendingPart,
    writer: PartFile,
    bytes: u64,
    opened: Instant,
    last_write: Instant,
}

struct FileWriter<T> {
    dir: PathBuf,
    subtask: usize,
    encode: Encoder<T>,
    buckets: Option<BucketAssigner<T>>,
    rolling: RollingPolicy,
    /// The open part of each bucket.
    parts: HashMap<String, OpenPart>,
    /// Parts rolled since the last `prepare_commit` or `take_closed`.
    closed: Vec<PendingPart>,
    /// The next part's number.
    next: u64,
    /// A batch's lines, per bucket.
    batch: Vec<(String, Vec<u8>)>,
}

impl<T> FileWriter<T> {
    /// Encodes `records` into `self.batch`, by bucket.
    fn encode(&mut self, records: &mut Vec<T>, timestamps: &[i64]) -> Result<(), ConnectorError> {
        let fail =
            |what: String| ConnectorError::bad_input(format!("file sink cannot write {what}"));
        match &self.buckets {
            None => {
                if self.batch.is_empty() {
                    self.batch.push((String::new(), Vec::new()));
                }
                let lines = &mut self.batch[0].1;
                for record in records.iter() {
                    (self.encode)(record, lines).map_err(fail)?;
                }
            }
            Some(assigner) => {
                for (record, &timestamp) in records.iter().zip(timestamps) {
                    let bucket = clean_bucket((assigner.assign)(record, timestamp).map_err(fail)?);
                    let lines = match self.batch.iter().position(|(b, _)| *b == bucket) {
                        Some(at) => &mut self.batch[at].1,
                        None => {
                            self.batch.push((bucket, Vec::new()));
                            &mut self.batch.last_mut().expect("pushed").1
                        }
                    };
                    (self.encode)(record, lines).map_err(fail)?;
                }
            }
        }
        records.clear();
        Ok(())
    }

    async fn write_batch(
        &mut self,
        records: &mut Vec<T>,
        timestamps: &[i64],
    ) -> Result<(), ConnectorError> {
        self.encode(records, timestamps)?;
        let now = Instant::now();
        let mut batch = std::mem::take(&mut self.batch);
        for (bucket, lines) in &mut batch {
            if lines.is_empty() {
                continue;
            }
            let result = self.append(bucket, lines, now).await;
            lines.clear();
            result?;
        }
        // Keep the buckets' buffers for the next batch, unless buckets come and go.
        if batch.len() > 16 {
            batch.clear();
        }
        self.batch = batch;
        Ok(())
    }

    async fn append(
        &mut self,
        bucket: &str,
        lines: &[u8],
        now: Instant,
    ) -> Result<(), ConnectorError> {
        if let Some(part) = self.parts.get(bucket) {
            if self.rolling.rolls(part, now) {
                let part = self.parts.remove(bucket).expect("found");
                self.closed.push(close(part).await?);
            }
        }
        if !self.parts.contains_key(bucket) {
            let part = self.open(bucket, now).await?;
            self.parts.insert(bucket.to_string(), part);
        }
        let part = self.parts.get_mut(bucket).expect("opened");
        part.writer
            .write_all(lines)
            .await
            .map_err(|e| io_error("write", Path::new(&part.part.hidden), e))?;
        part.bytes += lines.len() as u64;
        part.last_write = now;
        Ok(())
    }

    async fn open(&mut self, bucket: &str, now: Instant) -> Result<OpenPart, ConnectorError> {
        let dir = if bucket.is_empty() {
            self.dir.clone()
        } else {
            let dir = self.dir.join(bucket);
            std::fs::create_dir_all(&dir).map_err(|e| io_error("create directory", &dir, e))?;
            dir
        };
        let (subtask, n) = (self.subtask, self.next);
        self.next += 1;
        let hidden = dir.join(format!(".part-{subtask}-{n}.inprogress"));
        let visible = dir.join(format!("part-{subtask}-{n}"));
        let writer = PartFile::create(&hidden)
            .await
            .map_err(|e| io_error("create", &hidden, e))?;
        Ok(OpenPart {
            part: PendingPart {
                hidden: hidden.to_string_lossy().into_owned(),
                visible: visible.to_string_lossy().into_owned(),
            },
            writer,
            bytes: 0,
            opened: now,
            last_write: now,
        })
    }

    async fn prepare(&mut self) -> Result<Vec<PendingPart>, ConnectorError> {
        let mut closed = std::mem::take(&mut self.closed);
        for (_, part) in self.parts.drain() {
            closed.push(close(part).await?);
        }
        Ok(closed)
    }
}

/// Bytes a part buffers before a write, and writes in flight at once.
const PART_BUFFER: usize = 128 << 10;
const PART_WRITES_IN_FLIGHT: usize = 4;

/// A part file being written: in buffers of `PART_BUFFER` bytes, up to `PART_WRITES_IN_FLIGHT`
/// of them at once, with direct I/O where the file system has it (the shard's writes go to
/// the device without a copy into the page cache: 2.5× the throughput of one buffered write
/// at a time, `bench/RESULTS.md`), buffered where it has not. Every write's length is
/// checked: a short write (a disk that filled up) fails the part, never leaves a hole in it.
struct PartFile {
    path: PathBuf,
    file: PartKind,
    /// The buffer being filled, and how far.
    staged: Staged,
    filled: usize,
    /// Where the staged buffer goes in the file.
    offset: u64,
    in_flight: VecDeque<glommio::Task<std::io::Result<()>>>,
}

enum PartKind {
    Direct(Rc<DmaFile>),
    Buffered(Rc<BufferedFile>),
}

enum Staged {
    Direct(DmaBuffer),
    Buffered(Vec<u8>),
}

impl PartFile {
    async fn create(path: &Path) -> glommio::Result<PartFile, ()> {
        let file = match DmaFile::create(path).await {
            Ok(file) => PartKind::Direct(Rc::new(file)),
            Err(glommio::GlommioError::IoError(e)) if e.raw_os_error() == Some(libc::EINVAL) => {
                PartKind::Buffered(Rc::new(BufferedFile::create(path).await?))
            }
            Err(e) => return Err(e),
        };
        let staged = Self::buffer(&file);
        Ok(PartFile {
            path: path.to_path_buf(),
            file,
            staged,
            filled: 0,
            offset: 0,
            in_flight: VecDeque::new(),
        })
    }

    fn buffer(file: &PartKind) -> Staged {
        match file {
            PartKind::Direct(file) => Staged::Direct(file.alloc_dma_buffer(PART_BUFFER)),
            PartKind::Buffered(_) => Staged::Buffered(vec![0; PART_BUFFER]),
        }
    }

    fn staged_mut(&mut self) -> &mut [u8] {
        match &mut self.staged {
            Staged::Direct(buffer) => buffer.as_bytes_mut(),
            Staged::Buffered(buffer) => buffer,
        }
    }

    async fn write_all(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let n = (PART_BUFFER - self.filled).min(bytes.len());
            let filled = self.filled;
            self.staged_mut()[filled..filled + n].copy_from_slice(&bytes[..n]);
            self.filled += n;
            bytes = &bytes[n..];
            if self.filled == PART_BUFFER {
                self.submit().await?;
            }
        }
        Ok(())
    }

    /// Writes the staged bytes (padded to the direct I/O alignment) at their offset, once
    /// fewer than `PART_WRITES_IN_FLIGHT` writes are in flight.
    async fn submit(&mut self) -> std::io::Result<()> {
        while self.in_flight.len() >= PART_WRITES_IN_FLIGHT {
            self.wait_one().await?;
        }
        let fresh = Self::buffer(&self.file);
        let staged = std::mem::replace(&mut self.staged, fresh);
        let (offset, filled) = (self.offset, self.filled);
        self.offset += filled as u64;
        self.filled = 0;
        let path = self.path.clone();
        let short = move |written: usize| {
            std::io::Error::other(format!(
                "wrote {written} of {filled} bytes at offset {offset} of '{}': the disk is full, \
                 or the file reached the process's size limit",
                path.display()
            ))
        };
        let write = match (&self.file, staged) {
            (PartKind::Direct(file), Staged::Direct(mut buffer)) => {
                let file = Rc::clone(file);
                let alignment = file.alignment() as usize;
                buffer.trim_to_size(filled.div_ceil(alignment) * alignment);
                glommio::spawn_local(async move {
                    // The padding past `filled` is cut off when the part closes.
                    let written = file.write_at(buffer, offset).await?;
                    if written < filled {
                        return Err(short(written));
                    }
                    Ok(())
                })
            }
            (PartKind::Buffered(file), Staged::Buffered(mut buffer)) => {
                let file = Rc::clone(file);
                buffer.truncate(filled);
                glommio::spawn_local(async move {
                    let written = file.write_at(buffer, offset).await?;
                    if written < filled {
                        return Err(short(written));
                    }
                    Ok(())
                })
            }
            _ => unreachable!("a part stages buffers of its own kind"),
        };
        self.in_flight.push_back(write);
        Ok(())
    }

    async fn wait_one(&mut self) -> std::io::Result<()> {
        match self.in_flight.pop_front() {
            Some(write) => write.await,
            None => Ok(()),
        }
    }

    /// Writes what is staged, waits for every write, cuts the padding off, syncs the file and
    /// closes it.
    async fn close(mut self) -> std::io::Result<()> {
        let length = self.offset + self.filled as u64;
        if self.filled > 0 {
            self.submit().await?;
        }
        while !self.in_flight.is_empty() {
            self.wait_one().await?;
        }
        let held = || std::io::Error::other("a part's writes still hold its file");
        match self.file {
            PartKind::Direct(file) => {
                file.truncate(length).await?;
                file.fdatasync().await?;
                Rc::try_unwrap(file).map_err(|_| held())?.close().await?;
            }
            PartKind::Buffered(file) => {
                file.fdatasync().await?;
                Rc::try_unwrap(file).map_err(|_| held())?.close().await?;
            }
        }
        Ok(())
    }
}

/// Flushes, syncs and closes `part`: it is pending.
async fn close(part: OpenPart) -> Result<PendingPart, ConnectorError> {
    part.writer
        .close()
        .await
        .map_err(|e| io_error("close", Path::new(&part.part.hidden), e))?;
    Ok(part.part)
}

impl<T: 'static> TransactionWriter<T, PendingPart> for FileWriter<T> {
    fn write<'a>(
        &'a mut self,
        batch: &'a mut Vec<T>,
        timestamps: &'a [i64],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
        Box::pin(polled_when_woken(self.write_batch(batch, timestamps)))
    }

    fn prepare_commit(
        &mut self,
        _checkpoint: Option<u64>,
    ) -> LocalBoxFuture<'_, Result<Vec<PendingPart>, ConnectorError>> {
        Box::pin(polled_when_woken(self.prepare()))
    }

    fn take_closed(&mut self) -> Vec<PendingPart> {
        std::mem::take(&mut self.closed)
    }
}

/// Renames pending parts to their visible names.
struct FileCommitter {
    dir: PathBuf,
    subtask: usize,
    parallelism: usize,
}

impl FileCommitter {
    async fn commit_all(&mut self, parts: &[PendingPart]) -> Result<(), CommitError> {
        let mut dirs: Vec<&Path> = Vec::new();
        for part in parts {
            let (hidden, visible) = (Path::new(&part.hidden), Path::new(&part.visible));
            if let Err(e) = glommio::io::rename(hidden, visible).await {
                let gone = matches!(&e, glommio::GlommioError::IoError(io) if io.kind() == ErrorKind::NotFound);
                if !gone {
                    return Err(CommitError::Retry(format!(
                        "cannot rename '{}' to '{}': {e}",
                        hidden.display(),
                        visible.display()
                    )));
                }
                // Committed before (a commit repeated after a restore), unless the visible
                // part is missing too.
                if std::fs::metadata(visible).is_err() {
                    return Err(CommitError::Fail(ConnectorError::external(format!(
                        "file sink cannot commit part '{}': it is gone, and '{}' does not \
                         exist; the output directory was changed behind the job's back (its \
                         records are lost to this checkpoint: restore an older one)",
                        hidden.display(),
                        visible.display()
                    ))));
                }
            }
            let dir = visible.parent().unwrap_or(Path::new("."));
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        for dir in dirs {
            let synced = async { Directory::open(dir).await?.sync().await }.await;
            synced.map_err(|e| {
                CommitError::Retry(format!("cannot sync directory '{}': {e}", dir.display()))
            })?;
        }
        Ok(())
    }

    /// Deletes the hidden parts this subtask owns in its directory and in `earlier` ones
    /// (where the restored run wrote), except `keep`.
    async fn abort(
        &mut self,
        keep: &[PendingPart],
        earlier: &[String],
    ) -> Result<(), ConnectorError> {
        self.abort_in(&self.dir.clone(), keep).await?;
        for dir in earlier.iter().map(Path::new) {
            if dir.exists() {
                self.abort_in(dir, keep).await?;
            }
        }
        Ok(())
    }

    async fn abort_in(&self, dir: &Path, keep: &[PendingPart]) -> Result<(), ConnectorError> {
        let parts = scan_parts(dir).map_err(|e| io_error("read directory", dir, e))?;
        for (path, hidden, subtask, _) in parts {
            if !hidden || subtask % self.parallelism != self.subtask {
                continue;
            }
            // Kept parts as the restored run spelled them (its directory may have been
            // relative, and `dir` an absolute scope).
            let kept = keep
                .iter()
                .any(|part| same_path(Path::new(&part.hidden), &path));
            if kept {
                continue;
            }
            match glommio::io::remove(&path).await {
                Ok(()) => {}
                Err(glommio::GlommioError::IoError(e)) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("delete the uncommitted part", &path, e)),
            }
        }
        Ok(())
    }
}

impl Committer<PendingPart> for FileCommitter {
    fn commit<'a>(
        &'a mut self,
        committables: &'a [PendingPart],
    ) -> LocalBoxFuture<'a, Result<(), CommitError>> {
        Box::pin(self.commit_all(committables))
    }

    fn abort_lingering<'a>(
        &'a mut self,
        keep: &'a [PendingPart],
        earlier: &'a [String],
    ) -> LocalBoxFuture<'a, Result<(), ConnectorError>> {
        Box::pin(self.abort(keep, earlier))
    }

    fn writer_of(&self, part: &PendingPart) -> Option<usize> {
        let name = Path::new(&part.hidden).file_name()?.to_str()?;
        part_name(name).map(|(_, subtask, _)| subtask)
    }

    fn scope(&self) -> Option<String> {
        let dir = std::path::absolute(&self.dir).unwrap_or_else(|_| self.dir.clone());
        Some(dir.to_string_lossy().into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::CheckpointBarrier;
    use crate::connector::two_phase::COMMITTABLES;
    use crate::state::ListStateDescriptor;

    /// What the sink's state holds now: the committables a snapshot would write.
    fn committables(ctx: &RuntimeContext) -> Vec<Vec<u8>> {
        ctx.operator_state()
            .union_list_state(&ListStateDescriptor::<Vec<u8>>::new(COMMITTABLES))
            .unwrap()
            .get()
    }

    /// A writer of a subtask restored with `held` as its committables.
    fn restored(dir: &Path, held: &[Vec<u8>]) -> (RuntimeContext, Box<dyn SinkWriter<u64>>) {
        let ctx = RuntimeContext::new("files", 0, 1, 128);
        ctx.operator_state()
            .union_list_state(&ListStateDescriptor::<Vec<u8>>::new(COMMITTABLES))
            .unwrap()
            .update(held.iter().cloned());
        let writer = Sink::create_writer(&FileSink::<u64>::lines(dir), &ctx).unwrap();
        (ctx, writer)
    }

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// A writer killed after a barrier and restored from the checkpoint before it: the
    /// checkpoint's part is committed (again, idempotently), the part after it deleted, and
    /// numbering goes on; a part closed when the input ended is in the final checkpoint's
    /// state, and a writer restored from that commits it.
    #[test]
    fn a_restored_writer_commits_what_its_checkpoint_holds_and_deletes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().to_path_buf();
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let none = [NO_TIMESTAMP; 2];
                let (ctx, mut writer) = restored(&out, &[]);
                writer.write(&mut vec![1, 2], &none).await.unwrap();
                writer
                    .flush(&CheckpointBarrier::checkpoint(1))
                    .await
                    .unwrap();
                let checkpoint_1 = committables(&ctx);
                assert_eq!(checkpoint_1.len(), 1);
                writer.write(&mut vec![3], &none[..1]).await.unwrap();
                writer
                    .flush(&CheckpointBarrier::checkpoint(2))
                    .await
                    .unwrap();
                // Killed before either checkpoint completed: nothing visible.
                drop(writer);
                assert_eq!(
                    names(&out),
                    [".part-0-0.inprogress", ".part-0-1.inprogress"]
                );

                for _ in 0..2 {
                    let (_, mut writer) = restored(&out, &checkpoint_1);
                    writer.write(&mut Vec::new(), &[]).await.unwrap();
                    assert_eq!(names(&out), ["part-0-0"]);
                }
                assert_eq!(
                    std::fs::read_to_string(out.join("part-0-0")).unwrap(),
                    "1\n2\n"
                );

                let (ctx, mut writer) = restored(&out, &checkpoint_1);
                writer.write(&mut vec![4], &none[..1]).await.unwrap();
                writer.finish().await.unwrap();
                // The final checkpoint's snapshot; killed before the job's end.
                let last = committables(&ctx);
                drop(writer);
                assert_eq!(names(&out), [".part-0-1.inprogress", "part-0-0"]);
                let (_, mut writer) = restored(&out, &last);
                writer.finish().await.unwrap();
                writer.close(false).await.unwrap();
                assert_eq!(names(&out), ["part-0-0", "part-0-1"]);
                assert_eq!(
                    std::fs::read_to_string(out.join("part-0-1")).unwrap(),
                    "4\n"
                );
            })
            .unwrap()
            .join()
            .unwrap();
    }

    /// A job restored with another output directory deletes the uncommitted parts its
    /// checkpoint's run left in the old one (the checkpoint keeps the directory).
    #[test]
    fn a_restore_into_another_directory_deletes_what_the_old_one_holds_uncommitted() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (dir.path().join("old"), dir.path().join("new"));
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let (ctx, mut writer) = restored(&old, &[]);
                writer.write(&mut vec![1], &[NO_TIMESTAMP]).await.unwrap();
                writer
                    .flush(&CheckpointBarrier::checkpoint(1))
                    .await
                    .unwrap();
                writer.write(&mut vec![2], &[NO_TIMESTAMP]).await.unwrap();
                drop(writer);
                // Restored from a checkpoint before the first (nothing to commit).
                ctx.operator_state()
                    .union_list_state(&ListStateDescriptor::<Vec<u8>>::new(COMMITTABLES))
                    .unwrap()
                    .clear();
                assert_eq!(names(&old).len(), 2, "{:?}", names(&old));
                let mut writer = Sink::create_writer(&FileSink::<u64>::lines(&new), &ctx).unwrap();
                writer.write(&mut vec![3], &[NO_TIMESTAMP]).await.unwrap();
                assert!(names(&old).is_empty(), "{:?}", names(&old));
                writer.finish().await.unwrap();
                writer.close(false).await.unwrap();
                assert_eq!(names(&new), ["part-0-0"]);
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn buckets_name_the_hour_and_day_in_utc() {
        // 2026-12-05T20:41:07Z
        let ms = 1_796_503_267_000;
        assert_eq!(date_time_bucket(ms, BucketPeriod::Hour), "2026-12-05--20");
        assert_eq!(date_time_bucket(ms, BucketPeriod::Day), "2026-12-05");
        assert_eq!(date_time_bucket(0, BucketPeriod::Hour), "1970-01-01--00");
        // The last millisecond of a leap day, and one before the epoch.
        assert_eq!(
            date_time_bucket(951_868_799_999, BucketPeriod::Hour),
            "2000-02-29--23"
        );
        assert_eq!(date_time_bucket(-1, BucketPeriod::Hour), "1969-12-31--23");
    }

    #[test]
    fn a_bucket_is_one_visible_directory() {
        assert_eq!(clean_bucket("a/b".into()), "a%2Fb");
        assert_eq!(clean_bucket(".hidden".into()), "%2Ehidden");
        assert_eq!(clean_bucket("..".into()), "%2E.");
        assert_eq!(clean_bucket("50%/x".into()), "50%25%2Fx");
        assert_eq!(clean_bucket(String::new()), "");
        assert_eq!(clean_bucket("eu-west.1".into()), "eu-west.1");
    }

    #[test]
    fn part_names_read_back() {
        assert_eq!(part_name("part-3-17"), Some((false, 3, 17)));
        assert_eq!(part_name(".part-0-2.inprogress"), Some((true, 0, 2)));
        assert_eq!(part_name(".part-0-2"), None);
        assert_eq!(part_name("part-x-2"), None);
        assert_eq!(part_name("other"), None);
    }
}
