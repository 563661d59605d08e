//! The layout of records and events inside a network segment.
//!
//! A segment is a sequence of entries. Each entry starts at an offset `≡ 8 (mod 16)` with an
//! 8-byte header — payload length (`u32`, little-endian) and tag (`u32`) — so that its payload
//! begins 16-byte aligned, as rkyv's archived types require. Segments themselves are page
//! aligned (see `weir_memory::SegmentPool`).
//!
//! | tag | entry | payload |
//! |---|---|---|
//! | 0 | record | the rkyv archive of the record, root last |
//! | 1 | watermark | `i64` little-endian |
//! | 2 | end of partition | none: the sender will send nothing more on this channel |

use rkyv::ser::allocator::Arena;
use weir_memory::Segment;

use crate::record::{Record, Watermark};

const TAG_RECORD: u32 = 0;
const TAG_WATERMARK: u32 = 1;
const TAG_END_OF_PARTITION: u32 = 2;
const HEADER: usize = 8;
const FIRST_ENTRY: usize = 8;

/// Offset of the entry after one at `pos` with a payload of `len` bytes.
#[inline]
fn next_entry(pos: usize, len: usize) -> usize {
    (pos + HEADER + len + HEADER).next_multiple_of(16) - HEADER
}

/// An event travelling in-band with the records of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    Watermark(Watermark),
    EndOfPartition,
}

/// One entry read from a segment.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Entry<'a> {
    /// The archived bytes of one record, 16-byte aligned.
    Record(&'a [u8]),
    Event(Event),
}

/// Fills a segment with entries.
pub(crate) struct SegmentBuilder {
    segment: Segment,
    pos: usize,
}

impl SegmentBuilder {
    pub(crate) fn new(segment: Segment) -> Self {
        SegmentBuilder {
            segment,
            pos: FIRST_ENTRY,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos == FIRST_ENTRY
    }

    fn put_header(&mut self, len: usize, tag: u32) {
        let pos = self.pos;
        let buf = self.segment.buffer_mut();
        buf[pos..pos + 4].copy_from_slice(&(len as u32).to_le_bytes());
        buf[pos + 4..pos + 8].copy_from_slice(&tag.to_le_bytes());
        self.pos = next_entry(pos, len).min(buf.len());
    }

    /// Appends a record; `false` if it does not fit in what is left of the segment.
    #[inline]
    pub(crate) fn try_record<T: Record>(&mut self, record: &T, arena: &mut Arena) -> bool {
        let start = self.pos + HEADER;
        let buf = self.segment.buffer_mut();
        if start >= buf.len() {
            return false;
        }
        match record.encode(&mut buf[start..], arena) {
            Some(len) => {
                self.put_header(len, TAG_RECORD);
                true
            }
            None => false,
        }
    }

    /// Appends an event; `false` if it does not fit.
    pub(crate) fn try_event(&mut self, event: Event) -> bool {
        let watermark_bytes;
        let (tag, payload): (u32, &[u8]) = match event {
            Event::Watermark(w) => {
                watermark_bytes = w.0.to_le_bytes();
                (TAG_WATERMARK, &watermark_bytes)
            }
            Event::EndOfPartition => (TAG_END_OF_PARTITION, &[]),
        };
        let start = self.pos + HEADER;
        if start + payload.len() > self.segment.capacity() {
            return false;
        }
        self.segment.buffer_mut()[start..start + payload.len()].copy_from_slice(payload);
        self.put_header(payload.len(), tag);
        true
    }

    /// The filled segment, ready to send.
    pub(crate) fn finish(mut self) -> Segment {
        let len = self.pos.min(self.segment.capacity());
        self.segment.set_len(len);
        self.segment
    }
}

/// Reads the entries of a filled segment.
pub(crate) struct Entries<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Entries<'a> {
    pub(crate) fn new(segment: &'a Segment) -> Self {
        Entries {
            bytes: segment.filled(),
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
        let payload = &self.bytes[pos + HEADER..pos + HEADER + len];
        self.pos = next_entry(pos, len);
        Some(match tag {
            TAG_RECORD => Entry::Record(payload),
            TAG_WATERMARK => Entry::Event(Event::Watermark(Watermark(i64::from_le_bytes(
                payload.try_into().expect("8-byte watermark"),
            )))),
            TAG_END_OF_PARTITION => Entry::Event(Event::EndOfPartition),
            other => panic!("corrupt segment: unknown entry tag {other} at offset {pos}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use weir_memory::SegmentPool;

    fn decode_all(segment: &Segment) -> (Vec<String>, Vec<Event>) {
        let mut records = Vec::new();
        let mut events = Vec::new();
        for entry in Entries::new(segment) {
            match entry {
                Entry::Record(bytes) => {
                    assert_eq!(bytes.as_ptr() as usize % 16, 0, "payload aligned");
                    // SAFETY: written by `try_record::<String>` into an aligned segment.
                    records.push(unsafe { String::decode(bytes) });
                }
                Entry::Event(e) => events.push(e),
            }
        }
        (records, events)
    }

    proptest! {
        #[test]
        fn entries_round_trip_in_order(records in proptest::collection::vec(".{0,300}", 0..200)) {
            let pool = SegmentPool::new(0, 64, 4096);
            let mut arena = Arena::new();
            let mut segments = Vec::new();
            let mut builder = SegmentBuilder::new(pool.acquire().unwrap());
            for r in &records {
                if !builder.try_record(r, &mut arena) {
                    segments.push(builder.finish());
                    builder = SegmentBuilder::new(pool.acquire().unwrap());
                    prop_assert!(builder.try_record(r, &mut arena));
                }
            }
            let wm = Event::Watermark(Watermark(-17));
            if !builder.try_event(wm) {
                segments.push(builder.finish());
                builder = SegmentBuilder::new(pool.acquire().unwrap());
                prop_assert!(builder.try_event(wm));
            }
            if !builder.try_event(Event::EndOfPartition) {
                segments.push(builder.finish());
                builder = SegmentBuilder::new(pool.acquire().unwrap());
                prop_assert!(builder.try_event(Event::EndOfPartition));
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
            prop_assert_eq!(all_events, vec![wm, Event::EndOfPartition]);
        }
    }

    #[test]
    fn record_larger_than_segment_does_not_fit() {
        let pool = SegmentPool::new(0, 1, 4096);
        let mut builder = SegmentBuilder::new(pool.acquire().unwrap());
        assert!(!builder.try_record(&"x".repeat(5000), &mut Arena::new()));
        assert!(builder.is_empty());
    }
}
