//! What one task's operators write at a barrier, and what they read back when the job
//! resumes from a checkpoint.
//!
//! Every operator of a chain writes named parts (its keyed state, its timers, its operator
//! state, a source's splits) into its task's [`TaskState`] while the barrier passes it; the
//! task then writes them all into one state file of the checkpoint (`task-<operator id of its
//! head>-<subtask>`), layout:
//!
//! | field | |
//! |---|---|
//! | magic, version | `WEIRTASK`, `u32` 2 |
//! | parts | their bytes, back to back |
//! | index | `u64` count, then per part: operator id (text), part name (text), offset (`u64`, from the file's start), length (`u64`) |
//! | index offset | `u64`: where the index starts (the file's last 8 bytes) |
//!
//! (text is a `u64` length and the bytes; integers little-endian). The index comes last so that
//! a part can be written before its length is known. Version 1, which this build still reads,
//! had the count and each part's operator, name and length-prefixed bytes in front. A part is
//! either taken at the barrier or deferred: a copy-on-write snapshot taken at the barrier and
//! encoded by the writer afterwards, in pieces of about [`PIECE_BYTES`] written as they come,
//! while records flow between them — so the encoding never holds the shard for long, and the
//! file is never whole in memory.
//!
//! On restore, an operator finds its parts by its operator id: the keyed parts of every old
//! subtask (each keeps the key groups it owns now); the other parts (operator state, a
//! source's splits) of its own subtask, or, when the job restores at another parallelism, of
//! every old subtask, whose contents the new subtasks share out ([`RestoredParts::share`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::bytes::{ByteReader, ByteWriter};

/// An operator's keyed state (the canonical keyed-snapshot format of `weir_state`).
pub(crate) const PART_KEYED: &str = "keyed";
/// A keyed operator's timers.
pub(crate) const PART_TIMERS: &str = "timers";
/// Keyed state a function keeps in its own fields (the interval join's buffers), in the
/// canonical keyed-snapshot format.
pub(crate) const PART_OWN_KEYED: &str = "own-keyed";
/// An operator subtask's operator state (`OperatorStateStore`).
pub(crate) const PART_OPERATOR_STATE: &str = "operator-state";
/// A source reader's splits with their positions.
pub(crate) const PART_SPLITS: &str = "splits";

const MAGIC: &[u8; 8] = b"WEIRTASK";
const VERSION: u32 = 2;

/// About how many bytes a deferred part's encoding appends between two chances for records to
/// flow (see the module docs).
pub(crate) const PIECE_BYTES: usize = 256 << 10;

/// Encodes a part after the barrier has passed, in pieces: each call appends about `budget`
/// bytes to `out` and says whether more follow.
pub(crate) trait PartEncoder {
    fn encode_next(&mut self, out: &mut Vec<u8>, budget: usize) -> Result<bool, String>;

    /// The longest step of the part's encoding taken outside its writer — by an operator that
    /// writes its keys between its records — which held the shard as the writer's pieces do.
    fn longest_step_elsewhere(&self) -> Duration {
        Duration::ZERO
    }

    /// Whether the last call handed out nothing because the part waits for its operator
    /// (rather than having worked on bytes it will hand out later).
    fn waiting(&self) -> bool {
        false
    }
}

/// A deferred part's encoder.
pub(crate) type DeferredPart = Box<dyn PartEncoder>;

/// A part encoded in one call.
pub(crate) struct Whole<F>(Option<F>);

impl<F: FnOnce(&mut Vec<u8>) -> Result<(), String>> Whole<F> {
    pub(crate) fn part(encode: F) -> DeferredPart
    where
        F: 'static,
    {
        Box::new(Whole(Some(encode)))
    }
}

impl<F: FnOnce(&mut Vec<u8>) -> Result<(), String>> PartEncoder for Whole<F> {
    fn encode_next(&mut self, out: &mut Vec<u8>, _budget: usize) -> Result<bool, String> {
        match self.0.take() {
            Some(encode) => encode(out).map(|()| false),
            None => Ok(false),
        }
    }
}

/// A part its operator writes between records after the barrier: shared between the
/// operator, which writes it in steps on its turns, and the checkpoint writer
/// ([`AfterBarrier`]), which hands it out once the operator is done.
pub(crate) trait WrittenBetweenRecords {
    /// What the writer hands out once the operator has written the part.
    type Written: PartEncoder;
    /// The error when the operator closed before it wrote the part.
    const UNWRITTEN: &'static str;
    /// The part once the operator has written it (taken); `None` while it writes; an error
    /// when it cannot.
    fn take_written(&mut self) -> Result<Option<Self::Written>, String>;
    /// The longest of the operator's steps.
    fn longest_step(&self) -> Duration;
    /// The checkpoint was given up: the operator writes no more of the part.
    fn give_up(&mut self);
}

/// The checkpoint writer's side of a [`WrittenBetweenRecords`] part.
pub(crate) struct AfterBarrier<W: WrittenBetweenRecords> {
    shared: Rc<RefCell<W>>,
    written: Option<W::Written>,
}

impl<W: WrittenBetweenRecords + 'static> AfterBarrier<W> {
    pub(crate) fn part(shared: Rc<RefCell<W>>) -> DeferredPart {
        Box::new(AfterBarrier {
            shared,
            written: None,
        })
    }
}

impl<W: WrittenBetweenRecords> PartEncoder for AfterBarrier<W> {
    fn encode_next(&mut self, out: &mut Vec<u8>, budget: usize) -> Result<bool, String> {
        if self.written.is_none() {
            let written = self.shared.borrow_mut().take_written()?;
            match written {
                Some(written) => self.written = Some(written),
                None if Rc::strong_count(&self.shared) == 1 => return Err(W::UNWRITTEN.into()),
                // Nothing yet: the operator writes the part between records.
                None => return Ok(true),
            }
        }
        let written = self.written.as_mut().expect("taken above");
        written.encode_next(out, budget)
    }

    fn longest_step_elsewhere(&self) -> Duration {
        self.shared
            .try_borrow()
            .map_or(Duration::ZERO, |shared| shared.longest_step())
    }

    fn waiting(&self) -> bool {
        self.written.is_none()
    }
}

impl<W: WrittenBetweenRecords> Drop for AfterBarrier<W> {
    /// A part whose checkpoint was given up (its writer dropped it) is no longer written.
    fn drop(&mut self) {
        if let Ok(mut shared) = self.shared.try_borrow_mut() {
            shared.give_up();
        }
    }
}

/// Bytes written whole, handed out in pieces of the writer's budget.
pub(crate) struct InPieces {
    bytes: Vec<u8>,
    handed: usize,
}

impl InPieces {
    pub(crate) fn of(bytes: Vec<u8>) -> InPieces {
        InPieces { bytes, handed: 0 }
    }
}

impl PartEncoder for InPieces {
    fn encode_next(&mut self, out: &mut Vec<u8>, budget: usize) -> Result<bool, String> {
        let left = &self.bytes[self.handed..];
        let piece = &left[..left.len().min(budget)];
        out.extend_from_slice(piece);
        self.handed += piece.len();
        Ok(self.handed < self.bytes.len())
    }
}

/// A keyed snapshot written whole, handed out in pieces.
impl PartEncoder for weir_state::KeyedSnapshotPieces {
    fn encode_next(&mut self, out: &mut Vec<u8>, budget: usize) -> Result<bool, String> {
        weir_state::KeyedSnapshotPieces::encode_next(self, out, budget).map_err(|e| e.to_string())
    }
}

/// A heap backend's keyed state, encoded in pieces.
impl<K, N, S> PartEncoder for weir_state::KeyedSnapshotEncoder<K, N, S>
where
    K: weir_state::StateKey + weir_state::StateCodec,
    N: weir_state::StateKey + weir_state::StateCodec,
    S: std::borrow::Borrow<weir_state::HeapSnapshot<K, N>>,
{
    fn encode_next(&mut self, out: &mut Vec<u8>, budget: usize) -> Result<bool, String> {
        weir_state::KeyedSnapshotEncoder::encode_next(self, out, budget).map_err(|e| e.to_string())
    }
}

/// One part of an operator's snapshot.
pub(crate) enum Part {
    /// Taken at the barrier.
    Bytes(Vec<u8>),
    /// Encoded by the writer from a snapshot taken at the barrier.
    Deferred(DeferredPart),
    /// A RocksDB checkpoint taken at the barrier, uploaded by the writer (`native.rs`).
    Native(super::native::NativeUpload),
    /// A link of a keyed part's chain taken at the barrier, stored by the writer (`chain.rs`).
    Chained(super::chain::ChainLink),
}

/// What one operator wrote at a barrier.
#[derive(Default)]
pub(crate) struct OperatorSnapshot {
    pub(crate) parts: Vec<(&'static str, Part)>,
    /// What the barrier cuts: a savepoint's parts are whole (no chain links).
    pub(crate) kind: super::SnapshotKind,
}

impl OperatorSnapshot {
    /// An empty snapshot for a barrier of `kind`.
    pub(crate) fn new(kind: super::SnapshotKind) -> OperatorSnapshot {
        OperatorSnapshot {
            parts: Vec::new(),
            kind,
        }
    }

    /// Whether the barrier is a savepoint's.
    pub(crate) fn is_savepoint(&self) -> bool {
        self.kind == super::SnapshotKind::Savepoint
    }

    pub(crate) fn add(&mut self, name: &'static str, bytes: Vec<u8>) {
        self.parts.push((name, Part::Bytes(bytes)));
    }

    pub(crate) fn add_deferred(&mut self, name: &'static str, encode: DeferredPart) {
        self.parts.push((name, Part::Deferred(encode)));
    }

    pub(crate) fn add_native(&mut self, name: &'static str, upload: super::native::NativeUpload) {
        self.parts.push((name, Part::Native(upload)));
    }
}

/// The parts of one checkpoint's state file: (operator id, part name, bytes).
pub(crate) type FileParts = Vec<(String, String, Bytes)>;

/// One old subtask's parts of one operator, by part name.
pub(crate) type SubtaskParts = (usize, HashMap<String, Bytes>);

/// What a job restores from: per operator id, per old subtask, its parts by name.
#[derive(Debug, Default)]
pub(crate) struct RestoredJob {
    /// The checkpoint restored.
    pub(crate) checkpoint: u64,
    /// Its directory (files it lists are found from there: `weir_state::checkpoint::resolve`).
    pub(crate) dir: std::path::PathBuf,
    /// It is one of the job's own checkpoints (not a savepoint): its shared files are the
    /// ones the job's next checkpoints may list again.
    pub(crate) own: bool,
    pub(crate) parts: HashMap<String, Vec<SubtaskParts>>,
    /// Each operator's parallelism in the checkpoint, by operator id.
    pub(crate) parallelism: HashMap<String, usize>,
    /// Each source's split enumerator, by operator id: its pending splits, encoded.
    pub(crate) enumerators: HashMap<String, Vec<u8>>,
}

impl RestoredJob {
    /// The part `name` of every old subtask of `operator` that wrote one, with the old
    /// subtask, in old subtask order.
    pub(crate) fn parts_of_all(&self, operator: &str, name: &str) -> Vec<(usize, &[u8])> {
        self.shared_parts_of_all(operator, name)
            .into_iter()
            .map(|(old, part)| (old, &part[..]))
            .collect()
    }

    /// [`RestoredJob::parts_of_all`] as the bytes the state files were read into, for a
    /// restore that keeps them (shares, not copies).
    pub(crate) fn shared_parts_of_all(&self, operator: &str, name: &str) -> Vec<(usize, &Bytes)> {
        let mut parts: Vec<(usize, &Bytes)> =
            self.parts.get(operator).map_or_else(Vec::new, |subtasks| {
                subtasks
                    .iter()
                    .filter_map(|(old, parts)| Some((*old, parts.get(name)?)))
                    .collect()
            });
        parts.sort_by_key(|(old, _)| *old);
        parts
    }

    /// The parts `name` of `operator` that subtask `subtask` of `parallelism` restores its
    /// unkeyed state from (every old subtask's: union and broadcast state need them all even
    /// at an unchanged parallelism).
    pub(crate) fn parts_for(
        &self,
        operator: &str,
        name: &str,
        subtask: usize,
        parallelism: usize,
    ) -> RestoredParts<'_> {
        let old_parallelism = self
            .parallelism
            .get(operator)
            .copied()
            .unwrap_or(parallelism);
        RestoredParts {
            old_parallelism,
            subtask,
            parallelism,
            parts: self.parts_of_all(operator, name),
        }
    }

    /// Copies every part out of the state file it was read with (see `read_restored`).
    pub(crate) fn detach_parts(&mut self) {
        for (_, parts) in self.parts.values_mut().flatten() {
            for bytes in parts.values_mut() {
                *bytes = Bytes::copy_from_slice(bytes);
            }
        }
    }

    /// Adds the parts of one old subtask's state file.
    pub(crate) fn add_file(&mut self, subtask: usize, parts: FileParts) {
        for (operator, name, bytes) in parts {
            let subtasks = self.parts.entry(operator).or_default();
            let at = match subtasks.iter().position(|(s, _)| *s == subtask) {
                Some(at) => at,
                None => {
                    subtasks.push((subtask, HashMap::new()));
                    subtasks.len() - 1
                }
            };
            subtasks[at].1.insert(name, bytes);
        }
    }
}

/// The restored parts a subtask takes its unkeyed state from (see [`RestoredJob::parts_for`]).
pub(crate) struct RestoredParts<'a> {
    /// The operator's parallelism in the checkpoint.
    pub(crate) old_parallelism: usize,
    subtask: usize,
    parallelism: usize,
    /// (old subtask, part) of every old subtask that wrote one, in old subtask order.
    pub(crate) parts: Vec<(usize, &'a [u8])>,
}

impl RestoredParts<'_> {
    /// Whether the operator restores at another parallelism than it was checkpointed at.
    pub(crate) fn rescaled(&self) -> bool {
        self.old_parallelism != self.parallelism
    }

    /// This subtask's share of list-like contents: each part decoded to its elements by
    /// `decode`; at an unchanged parallelism the own subtask's elements, else a contiguous
    /// share of all of them in old subtask order (Flink's even split of list state).
    pub(crate) fn share<T, E>(
        &self,
        mut decode: impl FnMut(&[u8]) -> Result<Vec<T>, E>,
    ) -> Result<Vec<T>, E> {
        let rescaled = self.rescaled();
        let mut all = Vec::new();
        for (old, part) in &self.parts {
            if rescaled || *old == self.subtask {
                all.extend(decode(part)?);
            }
        }
        if !rescaled {
            return Ok(all);
        }
        let range = weir_state::split_range(all.len(), self.subtask, self.parallelism);
        Ok(all.drain(range).collect())
    }
}

/// One task's parts for the barrier passing its chain, and what it restores from.
pub(crate) struct TaskState {
    written: RefCell<Vec<(Arc<str>, &'static str, Part)>>,
    restored: Option<Arc<RestoredJob>>,
    subtask: usize,
}

impl TaskState {
    /// Takes what an operator wrote at the barrier.
    pub(crate) fn add(&self, operator: &Arc<str>, snapshot: OperatorSnapshot) {
        let mut written = self.written.borrow_mut();
        for (name, part) in snapshot.parts {
            written.push((Arc::clone(operator), name, part));
        }
    }

    /// Everything written at the barrier, taken.
    pub(crate) fn take(&self) -> Vec<(Arc<str>, &'static str, Part)> {
        std::mem::take(&mut self.written.borrow_mut())
    }

    /// The parts `name` that this subtask of `parallelism` takes unkeyed state from (`None`:
    /// the job does not resume).
    pub(crate) fn restored_for(
        &self,
        operator: &str,
        name: &str,
        parallelism: usize,
    ) -> Option<RestoredParts<'_>> {
        let restored = self.restored.as_ref()?;
        Some(restored.parts_for(operator, name, self.subtask, parallelism))
    }

    /// The part `name` of every old subtask of `operator`, with the old subtask, the old
    /// parallelism and the checkpoint's directory (`None`: no old subtask wrote one).
    pub(crate) fn restored_native(&self, operator: &str, name: &str) -> Option<RestoredNative> {
        let job = self.restored.as_ref()?;
        let parts: Vec<(usize, Vec<u8>)> = job
            .parts_of_all(operator, name)
            .into_iter()
            .map(|(old, part)| (old, part.to_vec()))
            .collect();
        if parts.is_empty() {
            return None;
        }
        Some(RestoredNative {
            old_parallelism: job.parallelism.get(operator).copied().unwrap_or(1),
            dir: job.dir.clone(),
            own: job.own,
            parts,
        })
    }

    /// The part `name` of every old subtask of this operator (keyed state: each backend keeps
    /// the key groups it owns), shared with the restored job.
    pub(crate) fn restored_of_all(&self, operator: &str, name: &str) -> Vec<Bytes> {
        self.restored.as_ref().map_or_else(Vec::new, |job| {
            job.shared_parts_of_all(operator, name)
                .into_iter()
                .map(|(_, part)| part.clone())
                .collect()
        })
    }
}

/// An operator's parts that stand for files of the checkpoint (RocksDB's).
pub(crate) struct RestoredNative {
    pub(crate) old_parallelism: usize,
    /// The checkpoint's directory.
    pub(crate) dir: std::path::PathBuf,
    /// See [`RestoredJob::own`].
    pub(crate) own: bool,
    /// Per old subtask that wrote one, its part.
    pub(crate) parts: Vec<(usize, Vec<u8>)>,
}

/// A task's state file, encoded in pieces ([`FileEncoder::encode_next`]) so that its writer
/// can write each as it comes and let records flow between them.
pub(crate) struct FileEncoder {
    parts: std::vec::IntoIter<(Arc<str>, &'static str, Part)>,
    /// The deferred part being encoded: its encoder, operator, name, and where it began.
    encoding: Option<(DeferredPart, Arc<str>, &'static str, u64)>,
    /// The index: per part written, its operator, name, offset and length.
    index: Vec<(Arc<str>, &'static str, u64, u64)>,
    /// Bytes handed out so far.
    emitted: u64,
    done: bool,
    /// The longest step of a deferred part taken outside the writer.
    elsewhere: Duration,
}

impl FileEncoder {
    /// The encoder of the file of `parts`; their RocksDB checkpoints and chain links must
    /// already be written (each is bytes by now).
    pub(crate) fn new(parts: Vec<(Arc<str>, &'static str, Part)>) -> Result<FileEncoder, String> {
        if let Some((operator, name, _)) = parts
            .iter()
            .find(|(_, _, part)| matches!(part, Part::Native(_) | Part::Chained(_)))
        {
            return Err(format!(
                "internal error: the files of operator {operator}'s part '{name}' were not \
                 written before its task's state file was"
            ));
        }
        Ok(FileEncoder {
            index: Vec::with_capacity(parts.len()),
            parts: parts.into_iter(),
            encoding: None,
            emitted: 0,
            done: false,
            elsewhere: Duration::ZERO,
        })
    }

    /// The longest step of its deferred parts' encoding taken outside the writer.
    pub(crate) fn longest_step_elsewhere(&self) -> Duration {
        self.elsewhere
    }

    /// Whether the deferred part being encoded waits for its operator.
    pub(crate) fn waiting(&self) -> bool {
        self.encoding
            .as_ref()
            .is_some_and(|(encoder, _, _, _)| encoder.waiting())
    }

    /// Appends the next piece of the file to `out` — one step of a deferred part's encoding
    /// (about [`PIECE_BYTES`]), or the parts taken at the barrier up to the next deferred one,
    /// or the index — and returns whether more follow.
    pub(crate) fn encode_next(&mut self, out: &mut Vec<u8>) -> Result<bool, String> {
        let start = out.len();
        let more = self.encode_into(out, start);
        self.emitted += (out.len() - start) as u64;
        more
    }

    fn encode_into(&mut self, out: &mut Vec<u8>, start: usize) -> Result<bool, String> {
        let at = |out: &Vec<u8>| self.emitted + (out.len() - start) as u64;
        if self.emitted == 0 && out.len() == start {
            out.extend_from_slice(MAGIC);
            out.extend_from_slice(&VERSION.to_le_bytes());
        }
        loop {
            if let Some((encoder, _, _, _)) = &mut self.encoding {
                let more = encoder.encode_next(out, PIECE_BYTES)?;
                if !more {
                    self.elsewhere = self.elsewhere.max(encoder.longest_step_elsewhere());
                    let (_, operator, name, began) = self.encoding.take().expect("encoding");
                    self.index.push((operator, name, began, at(out) - began));
                }
                return Ok(true);
            }
            let Some((operator, name, part)) = self.parts.next() else {
                if self.done {
                    return Ok(false);
                }
                let index_at = at(out);
                let mut index = ByteWriter::default();
                index.u64(self.index.len() as u64);
                for (operator, name, offset, len) in &self.index {
                    index.text(operator);
                    index.text(name);
                    index.u64(*offset);
                    index.u64(*len);
                }
                index.u64(index_at);
                out.extend_from_slice(&index.out);
                self.done = true;
                return Ok(false);
            };
            let began = at(out);
            match part {
                Part::Bytes(bytes) => {
                    out.extend_from_slice(&bytes);
                    self.index.push((operator, name, began, bytes.len() as u64));
                }
                Part::Deferred(encoder) => self.encoding = Some((encoder, operator, name, began)),
                Part::Native(_) | Part::Chained(_) => unreachable!("refused by FileEncoder::new"),
            }
        }
    }
}

/// Writes a file with `writer` piece by piece, `next` appending each piece and saying whether
/// more follow and whether it waits for an operator, with records flowing between pieces
/// (unless `stopping` says the job stops); returns the longest `next` held the shard.
pub(crate) async fn write_in_pieces(
    writer: &mut weir_state::checkpoint::StateFileWriter,
    stopping: Option<&std::sync::atomic::AtomicBool>,
    mut next: impl FnMut(&mut Vec<u8>) -> Result<(bool, bool), String>,
) -> Result<Duration, String> {
    let mut piece = Vec::new();
    let mut longest = Duration::ZERO;
    loop {
        piece.clear();
        let started = Instant::now();
        let (more, waiting) = next(&mut piece)?;
        longest = longest.max(started.elapsed());
        writer.write(&piece).await.map_err(|e| e.to_string())?;
        if !more {
            return Ok(longest);
        }
        if stopping.is_some_and(|stopping| stopping.load(Ordering::Relaxed)) {
            return Err("the job is stopping".into());
        }
        if waiting {
            // The operator writes its snapshot between its records: look again shortly.
            glommio::timer::sleep(WAIT_FOR_PIECE).await;
        } else {
            // Records flow before the next piece.
            futures_lite::future::yield_now().await;
        }
    }
}

/// How long a writer waits for a part whose operator is writing it.
const WAIT_FOR_PIECE: Duration = Duration::from_millis(1);

/// Every piece of `encoder`, in a test where its operator (if it writes the part's keys
/// itself) has written them all; panics if it hands out nothing for long.
#[cfg(test)]
pub(crate) fn encode_whole(encoder: &mut DeferredPart, budget: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut idle = 0;
    loop {
        let before = bytes.len();
        if !encoder.encode_next(&mut bytes, budget).expect("it encodes") {
            return bytes;
        }
        idle = if bytes.len() == before { idle + 1 } else { 0 };
        assert!(
            idle < 1000,
            "a deferred part hands out nothing: its operator never wrote it"
        );
    }
}

/// Encodes the parts taken from a task into the bytes of its state file, all at once (see
/// [`FileEncoder`] for the encoding in pieces).
#[cfg(test)]
pub(crate) fn encode_file(parts: Vec<(Arc<str>, &'static str, Part)>) -> Result<Vec<u8>, String> {
    let mut encoder = FileEncoder::new(parts)?;
    let mut out = Vec::new();
    while encoder.encode_next(&mut out)? {}
    Ok(out)
}

/// Reads a state file written by [`encode_file`]; `what` names it in errors.
pub(crate) fn decode_file(bytes: &Bytes, what: &str) -> Result<FileParts, String> {
    let mut reader = ByteReader::new(bytes, what);
    if reader.header_versions(MAGIC, 1..=VERSION)? == 1 {
        return decode_version_1(bytes, reader, what);
    }
    let header = MAGIC.len() as u64 + 4;
    let len = bytes.len() as u64;
    let index_at = match bytes.len().checked_sub(8) {
        Some(at) if at as u64 >= header => {
            u64::from_le_bytes(bytes[at..].try_into().expect("8 bytes"))
        }
        _ => return Err(format!("{what} is truncated: {len} bytes hold no index")),
    };
    if index_at < header || index_at > len - 8 {
        return Err(format!(
            "{what} is damaged or truncated: its index would start at byte {index_at} of {len}"
        ));
    }
    let mut index = ByteReader::new(&bytes[index_at as usize..bytes.len() - 8], what);
    let count = index.count(32)?;
    let mut parts = Vec::with_capacity(count);
    for _ in 0..count {
        let operator = index.text()?;
        let name = index.text()?;
        let (offset, part_len) = (index.u64()?, index.u64()?);
        let end = offset
            .checked_add(part_len)
            .filter(|&end| offset >= header && end <= index_at);
        let Some(end) = end else {
            return Err(format!(
                "{what} is damaged: its index puts part '{name}' of operator {operator} at \
                 {part_len} bytes from byte {offset}, outside the {} bytes of parts",
                index_at - header
            ));
        };
        parts.push((operator, name, bytes.slice(offset as usize..end as usize)));
    }
    if !index.is_empty() {
        return Err(format!("{what} has bytes after its index's last part"));
    }
    Ok(parts)
}

/// The rest of a version 1 state file, after its header.
fn decode_version_1(
    file: &Bytes,
    mut reader: ByteReader<'_>,
    what: &str,
) -> Result<FileParts, String> {
    let count = reader.count(24)?;
    let mut parts = Vec::with_capacity(count);
    for _ in 0..count {
        let operator = reader.text()?;
        let name = reader.text()?;
        let bytes = file.slice_ref(reader.bytes()?);
        parts.push((operator, name, bytes));
    }
    if !reader.is_empty() {
        return Err(format!("{what} has bytes after its last part"));
    }
    Ok(parts)
}

/// Names one task's [`TaskState`] on its shard, so that the `RuntimeContext` carrying it stays
/// `Send` (as [`crate::state::OperatorStateId`] does for operator state).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TaskStateId(u64);

thread_local! {
    static SHARD_TASK_STATES: RefCell<HashMap<TaskStateId, Rc<TaskState>>> = RefCell::default();
}

impl TaskStateId {
    /// A task's state on this shard, restoring from `restored` if the job resumes.
    pub(crate) fn create(subtask: usize, restored: Option<Arc<RestoredJob>>) -> TaskStateId {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = TaskStateId(NEXT.fetch_add(1, Ordering::Relaxed));
        let state = Rc::new(TaskState {
            written: RefCell::default(),
            restored,
            subtask,
        });
        SHARD_TASK_STATES.with(|states| states.borrow_mut().insert(id, state));
        id
    }

    /// The task state of operators outside any job (built by a unit test): never restoring.
    pub(crate) fn detached() -> TaskStateId {
        TaskStateId(u64::MAX)
    }

    /// The task's state; one outside any job where this shard has none by that id.
    pub(crate) fn get(self) -> Rc<TaskState> {
        SHARD_TASK_STATES.with(|states| {
            Rc::clone(states.borrow_mut().entry(self).or_insert_with(|| {
                Rc::new(TaskState {
                    written: RefCell::default(),
                    restored: None,
                    subtask: 0,
                })
            }))
        })
    }
}

/// Forgets this shard's task states (the job on it ended or begins).
pub(crate) fn clear_shard_task_states() {
    SHARD_TASK_STATES.with(|states| states.borrow_mut().clear());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_file_reads_back_and_damage_is_named() {
        let parts = vec![
            (Arc::from("a1"), PART_KEYED, Part::Bytes(vec![1, 2, 3])),
            (
                Arc::from("a1"),
                PART_TIMERS,
                Part::Deferred(Whole::part(|out: &mut Vec<u8>| {
                    out.extend_from_slice(b"later");
                    Ok(())
                })),
            ),
        ];
        let bytes = Bytes::from(encode_file(parts).unwrap());
        let back = decode_file(&bytes, "task-a1-0").unwrap();
        assert_eq!(
            back,
            vec![
                ("a1".to_string(), "keyed".to_string(), vec![1, 2, 3].into()),
                ("a1".into(), "timers".into(), Bytes::from_static(b"later"))
            ]
        );
        let error = decode_file(&bytes.slice(..bytes.len() - 2), "task-a1-0").unwrap_err();
        assert!(
            error.contains("task-a1-0 is damaged or truncated"),
            "{error}"
        );
        let mut job = RestoredJob::default();
        job.add_file(1, back);
        job.parallelism.insert("a1".into(), 2);
        let elements = |bytes: &[u8]| Ok::<_, ()>(bytes.to_vec());
        // At an unchanged parallelism a subtask's share is what it wrote itself.
        let own = |subtask| job.parts_for("a1", "keyed", subtask, 2).share(elements);
        assert_eq!(own(1), Ok(vec![1, 2, 3]));
        assert_eq!(own(0), Ok(vec![]));
        assert_eq!(
            job.parts_for("a1", "keyed", 0, 2).parts,
            vec![(1, &[1u8, 2, 3][..])]
        );
        // At another parallelism every old subtask's part is shared out.
        let rescaled = job.parts_for("a1", "keyed", 0, 1);
        assert!(rescaled.rescaled());
        assert_eq!(rescaled.parts, vec![(1, &[1u8, 2, 3][..])]);
        assert_eq!(rescaled.share(elements), Ok(vec![1, 2, 3]));
        let thirds = [0, 1].map(|subtask| job.parts_for("a1", "keyed", subtask, 3).share(elements));
        assert_eq!(thirds, [Ok(vec![1]), Ok(vec![2])]);
        assert_eq!(job.parts_of_all("a1", "timers"), vec![(1, &b"later"[..])]);
    }

    /// Steps of `sizes` bytes each (0: a step that read without writing), bytes counting up;
    /// its operator took steps of up to `elsewhere` ms.
    struct Steps {
        sizes: Vec<usize>,
        next: u8,
        elsewhere: u64,
    }

    impl PartEncoder for Steps {
        fn encode_next(&mut self, out: &mut Vec<u8>, _budget: usize) -> Result<bool, String> {
            let size = self.sizes.remove(0);
            for _ in 0..size {
                out.push(self.next);
                self.next = self.next.wrapping_add(1);
            }
            Ok(!self.sizes.is_empty())
        }

        fn longest_step_elsewhere(&self) -> Duration {
            Duration::from_millis(self.elsewhere)
        }
    }

    #[test]
    fn a_part_encoded_in_pieces_reads_back_whole() {
        let sizes = vec![3, 0, 0, 1000, 0, 7, 0];
        let total: usize = sizes.iter().sum();
        let parts = vec![
            (
                Arc::from("a1"),
                PART_KEYED,
                Part::Deferred(Box::new(Steps {
                    sizes,
                    next: 0,
                    elsewhere: 3,
                })),
            ),
            (Arc::from("a1"), PART_TIMERS, Part::Bytes(Vec::new())),
            (
                Arc::from("b2"),
                PART_KEYED,
                Part::Deferred(Box::new(Steps {
                    sizes: vec![0],
                    next: 0,
                    elsewhere: 5,
                })),
            ),
            (Arc::from("b2"), PART_TIMERS, Part::Bytes(vec![9])),
        ];
        let mut encoder = FileEncoder::new(parts).unwrap();
        let (mut bytes, mut pieces) = (Vec::new(), 1);
        let mut piece = Vec::new();
        while encoder.encode_next(&mut piece).unwrap() {
            bytes.append(&mut piece);
            pieces += 1;
        }
        bytes.append(&mut piece);
        // One per step of the deferred parts, and one for the part after the last.
        assert_eq!(pieces, 9);
        // The parts' operators' longest step counts as the file's.
        assert_eq!(encoder.longest_step_elsewhere(), Duration::from_millis(5));
        let bytes = Bytes::from(bytes);
        let back = decode_file(&bytes, "task-a1-0").unwrap();
        let counting: Vec<u8> = (0..total).map(|i| i as u8).collect();
        assert_eq!(
            back,
            vec![
                ("a1".to_string(), "keyed".to_string(), counting.into()),
                ("a1".into(), "timers".into(), Bytes::new()),
                ("b2".into(), "keyed".into(), Bytes::new()),
                ("b2".into(), "timers".into(), vec![9].into()),
            ]
        );
        for cut in [bytes.len() - 1, bytes.len() - 9, 200, 15] {
            // Whatever the cut leaves as the index offset, the error names the file.
            let error = decode_file(&bytes.slice(..cut), "task-a1-0").unwrap_err();
            assert!(error.starts_with("task-a1-0 "), "{error}");
        }
        // An index that puts a part beyond the parts' bytes.
        let index_at = u64::from_le_bytes(bytes[bytes.len() - 8..].try_into().unwrap()) as usize;
        let mut damaged = bytes.to_vec();
        let first_len_at = index_at + 8 + (8 + 2) + (8 + 5) + 8;
        damaged[first_len_at..first_len_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let error = decode_file(&damaged.into(), "task-a1-0").unwrap_err();
        assert!(
            error.contains("task-a1-0 is damaged: its index puts part 'keyed' of operator a1"),
            "{error}"
        );
    }

    /// Parts are slices of the state file read; detached, they let it go.
    #[test]
    fn detached_parts_let_their_state_file_go() {
        let parts = vec![
            (Arc::from("a1"), PART_KEYED, Part::Bytes(vec![1, 2, 3])),
            (Arc::from("b2"), PART_KEYED, Part::Bytes(vec![4; 1000])),
        ];
        let file = Bytes::from(encode_file(parts).unwrap());
        let mut job = RestoredJob::default();
        job.add_file(0, decode_file(&file, "task-a1-0").unwrap());
        assert!(!file.is_unique(), "the parts share the file's bytes");
        job.parts.remove("b2");
        job.detach_parts();
        assert!(file.is_unique(), "no part holds the file any more");
        assert_eq!(
            job.parts_of_all("a1", PART_KEYED),
            vec![(0, &[1u8, 2, 3][..])]
        );
    }

    #[test]
    fn a_version_1_state_file_still_reads() {
        let mut v1 = ByteWriter::default();
        v1.out.extend_from_slice(MAGIC);
        v1.u32(1);
        v1.u64(2);
        for (operator, name, bytes) in [("a1", "keyed", &b"whole"[..]), ("a1", "timers", b"")] {
            v1.text(operator);
            v1.text(name);
            v1.bytes(bytes);
        }
        assert_eq!(
            decode_file(&v1.out.into(), "old").unwrap(),
            vec![
                (
                    "a1".to_string(),
                    "keyed".to_string(),
                    Bytes::from_static(b"whole")
                ),
                ("a1".into(), "timers".into(), Bytes::new()),
            ]
        );
    }
}
