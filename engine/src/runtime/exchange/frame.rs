//! The layout of records and events inside a network segment.
//!
//! A segment is a sequence of entries. Each entry starts 16-byte aligned with a 16-byte header
//! — payload length (`u32`, little-endian), tag (`u32`) and a value (`i64`) — so that its
//! payload begins 16-byte aligned too, as rkyv's archived types require. Segments themselves
//! are page aligned (see `weir_memory::SegmentPool`).
//!
//! | tag | entry | value | payload |
//! |---|---|---|---|
//! | 0 | record | its event timestamp (`i64::MIN`: none) | the rkyv archive, root last |
//! | 1 | watermark | the watermark | none |
//! | 2 | end of partition | 0 | none: the sender will send nothing more on this channel |
//! | 3 | watermark status | 1 idle, 0 active | none |
//! | 4 | checkpoint barrier | the checkpoint's id | none; always the segment's last entry |
//! | 5 | checkpoint complete | the checkpoint's id | none |
//! | 6 | checkpoint aborted | the checkpoint's id | none |
//! | 7 | savepoint barrier | the savepoint's id | none; always the segment's last entry |
//! | 8 | suspend | 0 | none: the sender stopped with a savepoint and sends nothing more |
//! | 9 | end of data | 0 | none: records end, the channel stays open for the final checkpoint |
//! | 10 | final checkpoint barrier | the checkpoint's id | none; always the segment's last entry |
//! | 11 | latency marker | when its source marked it (ms since the epoch) | the source's node id and subtask (`u32` each) |

use weir_memory::Segment;

use crate::checkpoint::{CheckpointBarrier, SnapshotKind};
use crate::record::{LatencyMarker, Record, Scratch, Watermark};

const TAG_RECORD: u32 = 0;
const TAG_WATERMARK: u32 = 1;
const TAG_END_OF_PARTITION: u32 = 2;
const TAG_WATERMARK_STATUS: u32 = 3;
const TAG_BARRIER: u32 = 4;
const TAG_CHECKPOINT_COMPLETE: u32 = 5;
const TAG_CHECKPOINT_ABORTED: u32 = 6;
const TAG_SAVEPOINT_BARRIER: u32 = 7;
const TAG_SUSPEND: u32 = 8;
const TAG_END_OF_DATA: u32 = 9;
const TAG_FINAL_BARRIER: u32 = 10;
const TAG_LATENCY_MARKER: u32 = 11;
/// A latency marker's payload: its source's node id and subtask.
const MARKER_PAYLOAD: usize = 8;
pub(crate) const HEADER: usize = 16;
const FIRST_ENTRY: usize = 0;

/// Offset of the entry after one at `pos` with a payload of `len` bytes.
#[inline]
pub(crate) fn next_entry(pos: usize, len: usize) -> usize {
    (pos + HEADER + len).next_multiple_of(16)
}

/// Writes the header of an entry at `pos` of `buf` (16-byte aligned, with room for it).
#[inline]
pub(crate) fn write_header(buf: &mut [u8], pos: usize, len: usize, tag: u32, value: i64) {
    buf[pos..pos + 4].copy_from_slice(&(len as u32).to_le_bytes());
    buf[pos + 4..pos + 8].copy_from_slice(&tag.to_le_bytes());
    buf[pos + 8..pos + 16].copy_from_slice(&value.to_le_bytes());
}

/// The record tag.
pub(crate) const fn record_tag() -> u32 {
    TAG_RECORD
}

/// The length of an event's payload (most events have none).
pub(crate) fn event_len(event: Event) -> usize {
    match event {
        Event::LatencyMarker(_) => MARKER_PAYLOAD,
        _ => 0,
    }
}

/// Writes `event`'s entry at `pos` of `buf` (16-byte aligned, with room for its header and
/// [`event_len`] bytes of payload).
pub(crate) fn write_event(buf: &mut [u8], pos: usize, event: Event) {
    let (tag, value) = event_entry(event);
    write_header(buf, pos, event_len(event), tag, value);
    if let Event::LatencyMarker(marker) = event {
        let payload = pos + HEADER;
        buf[payload..payload + 4].copy_from_slice(&marker.source.to_le_bytes());
        buf[payload + 4..payload + 8].copy_from_slice(&marker.subtask.to_le_bytes());
    }
}

/// An event's tag and value.
fn event_entry(event: Event) -> (u32, i64) {
    match event {
        Event::LatencyMarker(marker) => (TAG_LATENCY_MARKER, marker.marked_ms),
        Event::Watermark(w) => (TAG_WATERMARK, w.0),
        Event::WatermarkStatus { idle } => (TAG_WATERMARK_STATUS, i64::from(idle)),
        Event::EndOfPartition => (TAG_END_OF_PARTITION, 0),
        Event::EndOfData => (TAG_END_OF_DATA, 0),
        Event::Suspend => (TAG_SUSPEND, 0),
        Event::Barrier(barrier) => match (barrier.kind, barrier.is_final) {
            (SnapshotKind::Checkpoint, false) => (TAG_BARRIER, barrier.id as i64),
            (SnapshotKind::Checkpoint, true) => (TAG_FINAL_BARRIER, barrier.id as i64),
            (SnapshotKind::Savepoint, _) => (TAG_SAVEPOINT_BARRIER, barrier.id as i64),
        },
        Event::CheckpointComplete(checkpoint) => (TAG_CHECKPOINT_COMPLETE, checkpoint as i64),
        Event::CheckpointAborted(checkpoint) => (TAG_CHECKPOINT_ABORTED, checkpoint as i64),
    }
}

/// Where the filled bytes of a segment end in a barrier (its last entry, see the table):
/// the barrier's offset, and the barrier.
pub(crate) fn closing_barrier(bytes: &[u8]) -> Option<(usize, CheckpointBarrier)> {
    let mut entries = Entries::of(bytes);
    let mut last = None;
    loop {
        let at = entries.pos;
        match entries.next() {
            Some(Entry::Event(Event::Barrier(barrier))) => last = Some((at, barrier)),
            Some(_) => last = None,
            None => return last,
        }
    }
}

/// Why bytes from another process are not a segment this process may read: the entry's
/// offset, and what is wrong there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameError {
    /// Where the entry starts, in bytes from the segment's start.
    pub offset: usize,
    /// What is wrong with it.
    pub problem: String,
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "entry at byte {}: {}", self.offset, self.problem)
    }
}

impl std::error::Error for FrameError {}

/// Checks filled segment bytes that came from another process before anything reads them:
/// every header whole and in bounds, every tag known, every event's payload its own length, a
/// barrier only as the last entry, and every record a valid archive of `T` (rkyv's
/// `bytecheck`). Bytes that pass read as [`Entries`] without a panic, and their records
/// decode with [`Record::decode`]. Bytes written in this process need no check.
pub fn check_segment<T: Record>(bytes: &[u8]) -> Result<(), FrameError> {
    let error = |offset: usize, problem: String| Err(FrameError { offset, problem });
    if !(bytes.as_ptr() as usize).is_multiple_of(16) {
        return error(0, "the segment's bytes are not 16-byte aligned".into());
    }
    let mut pos = FIRST_ENTRY;
    while pos < bytes.len() {
        let Some(header) = bytes.get(pos..pos + HEADER) else {
            return error(
                pos,
                format!("{} bytes left, too few for a header", bytes.len() - pos),
            );
        };
        let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
        let tag = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        let end = (pos + HEADER).saturating_add(len);
        let Some(payload) = bytes.get(pos + HEADER..end) else {
            return error(
                pos,
                format!(
                    "a payload of {len} bytes runs past the segment's {} bytes",
                    bytes.len()
                ),
            );
        };
        let last = end.next_multiple_of(16) >= bytes.len();
        match tag {
            TAG_RECORD => {
                if let Err(problem) = T::check(payload) {
                    return error(pos, format!("not a valid record: {problem}"));
                }
            }
            TAG_LATENCY_MARKER if len != MARKER_PAYLOAD => {
                return error(
                    pos,
                    format!("a latency marker with {len} payload bytes, not {MARKER_PAYLOAD}"),
                );
            }
            TAG_BARRIER | TAG_SAVEPOINT_BARRIER | TAG_FINAL_BARRIER if !last => {
                return error(pos, "a barrier that is not the segment's last entry".into());
            }
            TAG_WATERMARK..=TAG_LATENCY_MARKER if tag != TAG_LATENCY_MARKER && len != 0 => {
                return error(
                    pos,
                    format!("event tag {tag} with {len} payload bytes, not 0"),
                );
            }
            TAG_WATERMARK..=TAG_LATENCY_MARKER => {}
            other => return error(pos, format!("unknown entry tag {other}")),
        }
        pos = next_entry(pos, len);
    }
    Ok(())
}

/// An event travelling in-band with the records of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Watermark(Watermark),
    /// The sender's stream became idle (`true`) or active again.
    WatermarkStatus {
        idle: bool,
    },
    EndOfPartition,
    /// The sender's input ended and its operators finished: no records follow, but the
    /// channel stays open for the final checkpoint's barrier and notice (then
    /// `EndOfPartition`).
    EndOfData,
    /// The end of the channel when the job stops with a savepoint without draining: no final
    /// watermark follows, and the receiver does not finish its operators.
    Suspend,
    /// Checkpoint (or savepoint) barrier: what came before belongs to its state.
    Barrier(CheckpointBarrier),
    /// This checkpoint completed (the sources pass the coordinator's notice downstream).
    CheckpointComplete(u64),
    /// This checkpoint was aborted.
    CheckpointAborted(u64),
    /// A latency marker, on its way to the sinks.
    LatencyMarker(LatencyMarker),
}

/// One entry read from a segment.
#[derive(Debug, PartialEq, Eq)]
pub enum Entry<'a> {
    /// The archived bytes of one record, 16-byte aligned, and its timestamp.
    Record(&'a [u8], i64),
    Event(Event),
}

/// Zeroes the padding after the entry at `pos` with a payload of `len` bytes, and returns
/// where the next entry goes: no byte of a segment's earlier use stays between entries (a
/// segment may leave the process).
#[inline]
fn pad(buf: &mut [u8], pos: usize, len: usize) -> usize {
    let end = pos + HEADER + len;
    let next = next_entry(pos, len).min(buf.len());
    match buf.get_mut(end..end + 16) {
        // One 16-byte store, past the padding into what the next entry overwrites.
        Some(tail) => tail.copy_from_slice(&[0; 16]),
        None => buf[end..next].fill(0),
    }
    next
}

/// Fills a segment with entries.
pub struct SegmentBuilder {
    segment: Segment,
    pos: usize,
}

impl SegmentBuilder {
    pub fn new(segment: Segment) -> Self {
        SegmentBuilder {
            segment,
            pos: FIRST_ENTRY,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos == FIRST_ENTRY
    }

    fn put_header(&mut self, len: usize, tag: u32, value: i64) {
        let pos = self.pos;
        let buf = self.segment.buffer_mut();
        write_header(buf, pos, len, tag, value);
        self.pos = pad(buf, pos, len);
    }

    /// Appends a record; `false` if it does not fit in what is left of the segment.
    #[inline]
    pub fn try_record<T: Record>(
        &mut self,
        record: &T,
        timestamp: i64,
        scratch: &mut Scratch<'_>,
    ) -> bool {
        let start = self.pos + HEADER;
        let buf = self.segment.buffer_mut();
        if start >= buf.len() {
            return false;
        }
        match record.encode(&mut buf[start..], scratch) {
            Some(len) => {
                self.put_header(len, TAG_RECORD, timestamp);
                true
            }
            None => false,
        }
    }

    /// Appends an event; `false` if it does not fit.
    pub(crate) fn try_event(&mut self, event: Event) -> bool {
        let len = event_len(event);
        if self.pos + HEADER + len > self.segment.capacity() {
            return false;
        }
        let pos = self.pos;
        let buf = self.segment.buffer_mut();
        write_event(buf, pos, event);
        self.pos = pad(buf, pos, len);
        true
    }

    /// The filled segment, ready to send.
    pub fn finish(mut self) -> Segment {
        let len = self.pos.min(self.segment.capacity());
        self.segment.set_len(len);
        self.segment
    }
}

/// Reads the entries of a filled segment.
pub struct Entries<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Entries<'a> {
    pub fn new(segment: &'a Segment) -> Self {
        Entries::of(segment.filled())
    }

    /// The entries of filled segment bytes (16-byte aligned, as a segment's are).
    pub(crate) fn of(bytes: &'a [u8]) -> Self {
        Entries {
            bytes,
            pos: FIRST_ENTRY,
        }
    }
}

impl<'a> Iterator for Entries<'a> {
    type Item = Entry<'a>;

    #[inline]
    fn next(&mut self) -> Option<Entry<'a>> {
        let pos = self.pos;
        if pos + HEADER > self.bytes.len() {
            return None;
        }
        let len =
            u32::from_le_bytes(self.bytes[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        let tag = u32::from_le_bytes(self.bytes[pos + 4..pos + 8].try_into().expect("4 bytes"));
        let value = i64::from_le_bytes(self.bytes[pos + 8..pos + 16].try_into().expect("8 bytes"));
        let payload = &self.bytes[pos + HEADER..pos + HEADER + len];
        self.pos = next_entry(pos, len);
        Some(match tag {
            TAG_RECORD => Entry::Record(payload, value),
            TAG_WATERMARK => Entry::Event(Event::Watermark(Watermark(value))),
            TAG_WATERMARK_STATUS => Entry::Event(Event::WatermarkStatus { idle: value != 0 }),
            TAG_END_OF_PARTITION => Entry::Event(Event::EndOfPartition),
            TAG_END_OF_DATA => Entry::Event(Event::EndOfData),
            TAG_SUSPEND => Entry::Event(Event::Suspend),
            TAG_BARRIER => {
                Entry::Event(Event::Barrier(CheckpointBarrier::checkpoint(value as u64)))
            }
            TAG_SAVEPOINT_BARRIER => {
                Entry::Event(Event::Barrier(CheckpointBarrier::savepoint(value as u64)))
            }
            TAG_FINAL_BARRIER => Entry::Event(Event::Barrier(CheckpointBarrier::final_checkpoint(
                value as u64,
            ))),
            TAG_CHECKPOINT_COMPLETE => Entry::Event(Event::CheckpointComplete(value as u64)),
            TAG_CHECKPOINT_ABORTED => Entry::Event(Event::CheckpointAborted(value as u64)),
            TAG_LATENCY_MARKER if len == MARKER_PAYLOAD => {
                let field = |at: usize| {
                    u32::from_le_bytes(payload[at..at + 4].try_into().expect("4 bytes"))
                };
                Entry::Event(Event::LatencyMarker(LatencyMarker {
                    marked_ms: value,
                    source: field(0),
                    subtask: field(4),
                }))
            }
            other => panic!("corrupt segment: unknown entry tag {other} at offset {pos}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rkyv::ser::allocator::Arena;
    use weir_memory::SegmentPool;

    fn decode_all(segment: &Segment) -> (Vec<(String, i64)>, Vec<Event>) {
        let mut records = Vec::new();
        let mut events = Vec::new();
        for entry in Entries::new(segment) {
            match entry {
                Entry::Record(bytes, timestamp) => {
                    assert_eq!(bytes.as_ptr() as usize % 16, 0, "payload aligned");
                    // SAFETY: written by `try_record::<String>` into an aligned segment.
                    records.push((unsafe { String::decode(bytes) }, timestamp));
                }
                Entry::Event(e) => events.push(e),
            }
        }
        (records, events)
    }

    proptest! {
        #[test]
        fn entries_round_trip_in_order(records in proptest::collection::vec((".{0,300}", any::<i64>()), 0..200)) {
            let pool = SegmentPool::new(0, 64, 4096);
            let mut arena = Arena::new();
            let mut arena = Scratch::new(&mut arena);
            let mut segments = Vec::new();
            let mut builder = SegmentBuilder::new(pool.acquire().unwrap());
            for (r, ts) in &records {
                if !builder.try_record(r, *ts, &mut arena) {
                    segments.push(builder.finish());
                    builder = SegmentBuilder::new(pool.acquire().unwrap());
                    prop_assert!(builder.try_record(r, *ts, &mut arena));
                }
            }
            let wm = Event::Watermark(Watermark(-17));
            let events = [wm, Event::WatermarkStatus { idle: true }, Event::WatermarkStatus { idle: false }, Event::Barrier(CheckpointBarrier::checkpoint(u64::MAX - 3)), Event::Barrier(CheckpointBarrier::savepoint(12)), Event::Barrier(CheckpointBarrier::final_checkpoint(13)), Event::CheckpointComplete(u64::MAX - 4), Event::CheckpointAborted(9), Event::LatencyMarker(LatencyMarker { marked_ms: 1_700_000_000_123, source: 7, subtask: u32::MAX }), Event::Suspend, Event::EndOfData, Event::EndOfPartition];
            for event in events {
                if !builder.try_event(event) {
                    segments.push(builder.finish());
                    builder = SegmentBuilder::new(pool.acquire().unwrap());
                    prop_assert!(builder.try_event(event));
                }
            }
            segments.push(builder.finish());
            let mut all_records = Vec::new();
            let mut all_events = Vec::new();
            for s in &segments {
                let (r, e) = decode_all(s);
                all_records.extend(r);
                all_events.extend(e);
            }
            prop_assert_eq!(all_records, records);
            prop_assert_eq!(all_events, events.to_vec());
        }
    }

    proptest! {
        /// Records whose archiving takes scratch space (a vector of strings needs its
        /// resolvers), many through one `Scratch` as the writer does for a batch, some of them
        /// refused half-archived by a full segment and written again into the next.
        #[test]
        fn one_scratch_serves_many_records_and_refusals(records in proptest::collection::vec(proptest::collection::vec(".{0,40}", 0..12), 0..150)) {
            let pool = SegmentPool::new(0, 256, 4096);
            let mut arena = Arena::new();
            let mut scratch = Scratch::new(&mut arena);
            let mut segments = Vec::new();
            let mut builder = SegmentBuilder::new(pool.acquire().unwrap());
            for record in &records {
                if !builder.try_record(record, 0, &mut scratch) {
                    segments.push(builder.finish());
                    builder = SegmentBuilder::new(pool.acquire().unwrap());
                    prop_assert!(builder.try_record(record, 0, &mut scratch));
                }
            }
            segments.push(builder.finish());
            let mut back: Vec<Vec<String>> = Vec::new();
            for segment in &segments {
                for entry in Entries::new(segment) {
                    if let Entry::Record(bytes, _) = entry {
                        // SAFETY: written by `try_record::<Vec<String>>` into an aligned segment.
                        back.push(unsafe { <Vec<String> as Record>::decode(bytes) });
                    }
                }
            }
            prop_assert_eq!(back, records);
        }
    }

    /// Bytes copied to a 16-byte aligned buffer, as a segment's are.
    fn aligned(bytes: &[u8]) -> rkyv::util::AlignedVec<16> {
        let mut out = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len());
        out.extend_from_slice(bytes);
        out
    }

    /// What a receiver does with bytes from a peer: check them, and read them only if they
    /// pass — every entry, every record decoded. Returns whether they passed.
    fn receive<T: Record>(bytes: &[u8]) -> bool {
        if check_segment::<T>(bytes).is_err() {
            return false;
        }
        for entry in Entries::of(bytes) {
            if let Entry::Record(payload, _) = entry {
                // SAFETY: `check_segment` passed: the payload is a valid archive of `T`.
                let _ = unsafe { T::decode(payload) };
            }
        }
        true
    }

    /// A segment of `records` and every kind of event, as a writer fills one.
    fn written(records: &[(u64, String)]) -> Segment {
        let pool = SegmentPool::new(0, 1, 8192);
        let mut arena = Arena::new();
        let mut scratch = Scratch::new(&mut arena);
        let mut builder = SegmentBuilder::new(pool.acquire().unwrap());
        for record in records {
            assert!(builder.try_record(record, 5, &mut scratch));
        }
        for event in [
            Event::Watermark(Watermark(3)),
            Event::LatencyMarker(LatencyMarker {
                marked_ms: 1,
                source: 2,
                subtask: 3,
            }),
            Event::Barrier(CheckpointBarrier::checkpoint(4)),
        ] {
            assert!(builder.try_event(event));
        }
        builder.finish()
    }

    proptest! {
        /// Random bytes: an error, never a panic, and nothing read that did not pass.
        #[test]
        fn random_bytes_from_a_peer_are_refused_or_read_whole(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            receive::<(u64, String)>(&aligned(&bytes));
            receive::<Vec<String>>(&aligned(&bytes));
        }

        /// A segment as a writer makes it, then damaged: each mutation is refused or yields
        /// records that decode; the undamaged segment always passes.
        #[test]
        fn mutated_segments_are_refused_or_read_whole(
            records in proptest::collection::vec((any::<u64>(), ".{0,24}"), 0..12),
            mutations in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
            cut in any::<usize>(),
        ) {
            let segment = written(&records);
            let bytes = segment.filled();
            prop_assert!(receive::<(u64, String)>(bytes));
            let mut damaged = bytes.to_vec();
            for (at, value) in mutations {
                let len = damaged.len();
                damaged[at % len] ^= value;
            }
            receive::<(u64, String)>(&aligned(&damaged));
            let cut = cut % (bytes.len() + 1);
            receive::<(u64, String)>(&aligned(&bytes[..cut]));
        }
    }

    #[test]
    fn no_stale_byte_of_a_reused_segment_stays_between_entries() {
        let pool = SegmentPool::new(0, 1, 4096);
        let mut used = pool.acquire().unwrap();
        used.buffer_mut().fill(0xaa);
        drop(used);
        let mut arena = Arena::new();
        let mut scratch = Scratch::new(&mut arena);
        let mut builder = SegmentBuilder::new(pool.acquire().unwrap());
        for record in [(1u64, "a".to_string()), (2, "bb".repeat(9))] {
            assert!(builder.try_record(&record, 0, &mut scratch));
        }
        assert!(builder.try_event(Event::LatencyMarker(LatencyMarker {
            marked_ms: 1,
            source: 2,
            subtask: 3
        })));
        assert!(builder.try_event(Event::EndOfPartition));
        let segment = builder.finish();
        let bytes = segment.filled();
        // Every byte outside the headers and payloads is zero.
        let mut pos = 0;
        while pos < bytes.len() {
            let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
            let next = next_entry(pos, len).min(bytes.len());
            assert!(
                bytes[pos + HEADER + len..next].iter().all(|&b| b == 0),
                "padding after the entry at {pos}: {:?}",
                &bytes[pos + HEADER + len..next]
            );
            pos = next;
        }
    }

    #[test]
    fn a_bad_segment_is_refused_naming_the_entry_and_the_problem() {
        let segment = written(&[(1, "one".into())]);
        let bytes = segment.filled().to_vec();
        let refused = |bytes: &[u8]| check_segment::<(u64, String)>(&aligned(bytes)).unwrap_err();
        let mut tag = bytes.clone();
        tag[4] = 99;
        assert_eq!(
            refused(&tag).to_string(),
            "entry at byte 0: unknown entry tag 99"
        );
        let mut long = bytes.clone();
        long[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            refused(&long).problem.contains("runs past"),
            "{:?}",
            refused(&long)
        );
        let mut record = bytes.clone();
        // The string, inline after the number: invalid UTF-8 (0xff pads an inline string).
        record[HEADER + 8..HEADER + 16]
            .copy_from_slice(&[0xc3, 0x28, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        assert!(
            refused(&record).problem.starts_with("not a valid record"),
            "{:?}",
            refused(&record)
        );
        // The barrier moved before the marker: no longer the last entry.
        let barrier = bytes.len() - HEADER;
        let marker = barrier - next_entry(0, MARKER_PAYLOAD);
        let mut early = bytes.clone();
        early[marker..marker + HEADER].copy_from_slice(&bytes[barrier..]);
        let problem = refused(&early);
        assert!(
            problem.problem.contains("not the segment's last"),
            "{problem:?}"
        );
        assert!(refused(&bytes[..bytes.len() - 3])
            .problem
            .contains("too few for a header"));
    }

    #[test]
    fn record_larger_than_segment_does_not_fit() {
        let pool = SegmentPool::new(0, 1, 4096);
        let mut builder = SegmentBuilder::new(pool.acquire().unwrap());
        let mut arena = Arena::new();
        assert!(!builder.try_record(&"x".repeat(5000), 0, &mut Scratch::new(&mut arena)));
        assert!(builder.is_empty());
    }
}
