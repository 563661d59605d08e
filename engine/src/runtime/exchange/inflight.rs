//! The in-flight data of unaligned checkpoints (`execution.checkpointing.unaligned.enabled`).
//!
//! An unaligned checkpoint's barrier overtakes the data queued in a task's input channels: the
//! upstream writer announces it ahead of its data (`Announcements`), the task snapshots its
//! operators at once and passes the barrier on, and what each input channel still delivers up
//! to the barrier's in-band copy is the checkpoint's in-flight data. The input gate takes that
//! data off its channels as soon as it can — so the senders' credit is free again and the
//! checkpoint does not wait for the task to work through a backlog — into chunks kept in
//! arrival order: the task reads them before anything else of their channel, and the
//! checkpoint's state file holds them (part [`PART_IN_FLIGHT`] of the task's head operator).
//! A restore hands them back to the gate, which delivers them first.
//!
//! A chunk is entries in the segment layout (`frame.rs`), 16-byte aligned: a segment's bytes
//! up to the barrier, or a local channel's batch or event archived the same way.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rkyv::util::AlignedVec;

use super::frame::{event_len, next_entry, record_tag, write_event, write_header, Event, HEADER};
use super::local::LocalItem;
use crate::checkpoint::bytes::ByteReader;
use crate::checkpoint::task_state::PartEncoder;
use crate::record::{Record, Scratch};

/// The part of a task's head operator that holds its input channels' in-flight data.
pub(crate) const PART_IN_FLIGHT: &str = "in-flight";

const MAGIC: &[u8; 8] = b"WEIRINFL";
const VERSION: u32 = 2;

/// Entries in the segment layout, 16-byte aligned.
pub(crate) type Chunk = Rc<AlignedVec<16>>;

/// A chunk holding a copy of `bytes` (entries in the segment layout).
pub(crate) fn chunk_of(bytes: &[u8]) -> Chunk {
    let mut chunk = AlignedVec::<16>::with_capacity(bytes.len());
    chunk.extend_from_slice(bytes);
    Rc::new(chunk)
}

/// A local channel's item archived as segment entries (a batch's records, or an event).
pub(crate) fn chunk_of_local<T: Record>(item: &LocalItem<T>, scratch: &mut Scratch<'_>) -> Chunk {
    let mut chunk = AlignedVec::<16>::new();
    match item {
        LocalItem::Records(batch) => {
            for (record, &timestamp) in batch.records.iter().zip(&batch.timestamps) {
                put_record(&mut chunk, record, timestamp, scratch);
            }
        }
        LocalItem::Event(event) => put_event(&mut chunk, *event),
    }
    Rc::new(chunk)
}

fn put_record<T: Record>(
    chunk: &mut AlignedVec<16>,
    record: &T,
    timestamp: i64,
    scratch: &mut Scratch<'_>,
) {
    let pos = chunk.len();
    let mut room = 256;
    loop {
        chunk.resize(pos + HEADER + room, 0);
        if let Some(len) = record.encode(&mut chunk.as_mut_slice()[pos + HEADER..], scratch) {
            write_header(chunk.as_mut_slice(), pos, len, record_tag(), timestamp);
            chunk.resize(next_entry(pos, len), 0);
            return;
        }
        room *= 2;
    }
}

fn put_event(chunk: &mut AlignedVec<16>, event: Event) {
    let pos = chunk.len();
    chunk.resize(next_entry(pos, event_len(event)), 0);
    write_event(chunk.as_mut_slice(), pos, event);
}

/// Where upstream writers announce an unaligned checkpoint's barrier to the tasks they feed,
/// ahead of the data queued in their channels: per task of the job, the newest checkpoint
/// announced to it. The task looks before it reads its next delivery.
#[derive(Clone, Debug)]
pub(crate) struct Announcements(Arc<[AtomicU64]>);

impl Announcements {
    pub(crate) fn new(tasks: usize) -> Self {
        Announcements((0..tasks).map(|_| AtomicU64::new(0)).collect())
    }

    /// Announces `checkpoint`'s barrier to `task`.
    pub(crate) fn announce(&self, task: usize, checkpoint: u64) {
        self.0[task].fetch_max(checkpoint, Ordering::Release);
    }

    /// The newest checkpoint announced to `task`.
    pub(crate) fn newest(&self, task: usize) -> u64 {
        self.0[task].load(Ordering::Acquire)
    }
}

/// One unaligned checkpoint's in-flight data at one task: chunks by input channel, in the
/// order they arrived, complete once every channel delivered the barrier (or ended).
pub(crate) struct Recording {
    pub(crate) checkpoint: u64,
    /// The gate's number of input channels.
    channels: usize,
    /// What feeds the gate's channels ([`InputLayout`]): a restore into other channels is
    /// refused.
    layout: Arc<str>,
    chunks: Vec<(u32, Chunk)>,
    complete: bool,
    /// Why the data will never be complete (the checkpoint was given up at this task).
    failed: Option<String>,
}

/// A recording shared by the gate, which fills it, and the checkpoint's writer.
pub(crate) type SharedRecording = Rc<RefCell<Recording>>;

impl Recording {
    pub(crate) fn new(checkpoint: u64, channels: usize, layout: Arc<str>) -> SharedRecording {
        Rc::new(RefCell::new(Recording {
            checkpoint,
            channels,
            layout,
            chunks: Vec::new(),
            complete: false,
            failed: None,
        }))
    }

    pub(crate) fn add(&mut self, channel: usize, chunk: Chunk) {
        self.chunks.push((channel as u32, chunk));
    }

    pub(crate) fn complete(&mut self) {
        self.complete = true;
    }

    pub(crate) fn fail(&mut self, reason: String) {
        if !self.complete {
            self.failed = Some(reason);
        }
    }
}

/// Writes a recording into the task's state file once it is complete.
pub(crate) struct RecordingPart {
    recording: SharedRecording,
    /// The next chunk to write; `None` before the header.
    next: Option<usize>,
    waiting: bool,
}

impl RecordingPart {
    pub(crate) fn part(recording: SharedRecording) -> Box<dyn PartEncoder> {
        Box::new(RecordingPart {
            recording,
            next: None,
            waiting: false,
        })
    }
}

impl PartEncoder for RecordingPart {
    fn encode_next(&mut self, out: &mut Vec<u8>, budget: usize) -> Result<bool, String> {
        let recording = self.recording.borrow();
        if let Some(reason) = &recording.failed {
            return Err(reason.clone());
        }
        self.waiting = !recording.complete;
        if self.waiting {
            return Ok(true);
        }
        let start = out.len();
        let mut next = match self.next {
            Some(next) => next,
            None => {
                out.extend_from_slice(MAGIC);
                out.extend_from_slice(&VERSION.to_le_bytes());
                out.extend_from_slice(&(recording.channels as u32).to_le_bytes());
                out.extend_from_slice(&(recording.layout.len() as u64).to_le_bytes());
                out.extend_from_slice(recording.layout.as_bytes());
                out.extend_from_slice(&(recording.chunks.len() as u64).to_le_bytes());
                0
            }
        };
        while next < recording.chunks.len() && out.len() - start < budget {
            let (channel, chunk) = &recording.chunks[next];
            out.extend_from_slice(&channel.to_le_bytes());
            out.extend_from_slice(&(chunk.len() as u64).to_le_bytes());
            out.extend_from_slice(chunk);
            next += 1;
        }
        self.next = Some(next);
        Ok(next < recording.chunks.len())
    }

    fn waiting(&self) -> bool {
        self.waiting
    }
}

/// In-flight data read back from a checkpoint.
#[derive(Debug, Default)]
pub(crate) struct RestoredInFlight {
    /// The gate's number of input channels when it was written.
    pub(crate) channels: usize,
    /// The chunks, by channel, in the order they arrived.
    pub(crate) chunks: Vec<(usize, Chunk)>,
}

/// Reads the header of a part written by [`RecordingPart`]: the channels, their layout and
/// the number of chunks that follow.
fn read_header(reader: &mut ByteReader<'_>) -> Result<(usize, String, usize), String> {
    reader.header(MAGIC, VERSION)?;
    let channels = reader.u32()? as usize;
    let layout = reader.text()?;
    let count = reader.count(12)?;
    Ok((channels, layout, count))
}

/// What fed the channels of a part written by [`RecordingPart`], if it holds any data (its
/// chunks are not read).
pub(crate) fn layout_of_data(bytes: &[u8], what: &str) -> Result<Option<String>, String> {
    let (_, layout, count) = read_header(&mut ByteReader::new(bytes, what))?;
    Ok((count > 0).then_some(layout))
}

/// Reads a part written by [`RecordingPart`]; `what` names it in errors.
pub(crate) fn decode_in_flight(bytes: &[u8], what: &str) -> Result<RestoredInFlight, String> {
    let mut reader = ByteReader::new(bytes, what);
    // What fed the channels is checked before the job starts (`layout_of_data`).
    let (channels, _layout, count) = read_header(&mut reader)?;
    let mut chunks = Vec::with_capacity(count);
    for _ in 0..count {
        let channel = reader.u32()? as usize;
        if channel >= channels {
            return Err(format!(
                "{what} holds data of input channel {channel} of {channels}"
            ));
        }
        chunks.push((channel, chunk_of(reader.bytes()?)));
    }
    if !reader.is_empty() {
        return Err(format!("{what} has bytes after its last chunk"));
    }
    Ok(RestoredInFlight { channels, chunks })
}

/// What feeds a task's input channels, in the gate's channel order: per input edge the
/// producing operator's id, which of the task's inputs it feeds, the partitioning and both
/// parallelisms. In-flight data restores only into the same channels.
pub(crate) type InputLayout = Arc<str>;
