//! One channel between two processes, simulated byte by byte: a sender that keeps to its
//! credit, a receiver with its own small pool whose task frees segments at its own pace, and
//! both directions of the stream cut into arbitrary pieces, announcements mixed in without
//! credit. Every segment and announcement arrives whole, in order, and the receiver's pool is
//! never overrun; a sender that breaks its credit, and bytes
//! that are no frames, are refused with an error, never a panic.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use weir_memory::{Segment, SegmentPool};
use weir_net::credit::{ReceiverCredit, SenderCredit};
use weir_net::wire::{
    announce_frame, credit_frame, data_header, open_frame, FrameReader, Inbound, OpenReader,
    Opened, WireError, HEADER, MAX_KEY,
};

const SEGMENT: usize = 256;

/// xorshift64*: the simulation's choices, from the property's seed.
struct Choices(u64);

impl Choices {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1) as u64) as usize
    }
}

/// Takes up to `most` bytes off the front of `wire` (at least one if it holds any).
fn piece(wire: &mut VecDeque<u8>, most: usize) -> Vec<u8> {
    let n = most.clamp(1, wire.len().max(1)).min(wire.len());
    wire.drain(..n).collect()
}

/// A segment of `pool` holding `bytes`.
fn segment(pool: &SegmentPool, bytes: &[u8]) -> Segment {
    let mut segment = pool.acquire().unwrap();
    segment.buffer_mut()[..bytes.len()].copy_from_slice(bytes);
    segment.set_len(bytes.len());
    segment
}

proptest! {
    #[test]
    fn segments_cross_whole_in_order_and_within_the_receivers_credit(
        credits in 1usize..6,
        messages in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..=SEGMENT), 0..40),
        seed in 1u64..,
    ) {
        let mut choose = Choices(seed);
        let sender_pool = SegmentPool::new(0, 4, SEGMENT);
        let receiver_pool = SegmentPool::new(1, credits, SEGMENT);
        let freed = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&freed);
        let mut data = FrameReader::data(ReceiverCredit::new(receiver_pool.clone(), move || {
            count.fetch_add(1, Ordering::Relaxed);
        }).unwrap());
        let mut grants = FrameReader::credits();
        let mut credit = SenderCredit::new();
        let (mut forward, mut back) = (VecDeque::new(), VecDeque::new());
        let (mut held, mut received) = (VecDeque::new(), Vec::new());
        // Announcements go out whenever, credit or not, numbered up.
        let (mut announced, mut heard) = (Vec::new(), Vec::new());
        let mut inbound = Vec::new();
        let mut next = 0;
        let mut steps = 0;
        // As a driver does: announce at the start, then only when the pool's hook says a
        // segment came back.
        let mut woken = usize::MAX;
        while received.len() < messages.len() {
            steps += 1;
            prop_assert!(steps < 100_000, "no progress: {} of {} received", received.len(), messages.len());
            if freed.load(Ordering::Relaxed) != woken {
                woken = freed.load(Ordering::Relaxed);
                if let Some(more) = data.announce() {
                    back.extend(credit_frame(more));
                }
            }
            for granted in { grants.feed(&piece(&mut back, choose.below(24)), &mut inbound).unwrap(); inbound.drain(..) } {
                match granted {
                    Inbound::Credit(more) => credit.grant(more),
                    _ => prop_assert!(false, "a segment or an announcement on the credit side"),
                }
            }
            if choose.below(4) == 0 {
                let checkpoint = announced.len() as u32 + 1;
                forward.extend(announce_frame(checkpoint));
                announced.push(checkpoint);
            }
            while next < messages.len() && choose.below(3) > 0 && credit.try_take() {
                let sent = segment(&sender_pool, &messages[next]);
                forward.extend(data_header(sent.len()));
                forward.extend(sent.filled());
                next += 1;
            }
            data.feed(&piece(&mut forward, choose.below(3 * SEGMENT)), &mut inbound).unwrap();
            for arrived in inbound.drain(..) {
                match arrived {
                    Inbound::Segment(segment) => held.push_back(segment),
                    Inbound::Announce(checkpoint) => heard.push(checkpoint),
                    Inbound::Credit(_) => prop_assert!(false, "credit on the data side"),
                }
            }
            // The receiving task frees what it read at its own pace.
            for _ in 0..choose.below(held.len() + 1) {
                let segment = held.pop_front().expect("held");
                received.push(segment.filled().to_vec());
            }
        }
        prop_assert_eq!(&received, &messages);
        // What was on the wire once the last segment came: every announcement before it.
        prop_assert!(announced.starts_with(&heard), "{:?} of {:?}", heard, announced);
        prop_assert_eq!(freed.load(Ordering::Relaxed), messages.len());
        prop_assert_eq!(receiver_pool.stats().in_use, 0);
    }

    /// Bytes that are no frames: an error or nothing, never a panic; after an error, the same
    /// error again.
    #[test]
    fn any_bytes_are_frames_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..2000), cut in 0usize..2000) {
        let mut out = Vec::new();
        let cut = cut.min(bytes.len());
        let mut data = receiving(2);
        let first = data.feed(&bytes[..cut], &mut out).and_then(|()| data.feed(&bytes[cut..], &mut out));
        if let Err(error) = first {
            prop_assert_eq!(data.feed(&[0; HEADER], &mut out), Err(error));
        }
        let mut credits = FrameReader::credits();
        let _ = credits.feed(&bytes, &mut out);
    }

    /// A stream's open frame, cut anywhere, gives its key and exactly the bytes after it;
    /// any bytes give a key, nothing yet, or an error, never a panic.
    #[test]
    fn an_open_frame_gives_its_key_and_the_rest_wherever_it_is_cut(
        key in proptest::collection::vec(any::<u8>(), 0..=MAX_KEY),
        rest in proptest::collection::vec(any::<u8>(), 0..64),
        cut in 0usize..400,
        noise in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let mut stream = open_frame(&key);
        stream.extend_from_slice(&rest);
        let cut = cut.min(stream.len());
        let mut open = OpenReader::new();
        let first = open.feed(&stream[..cut]).unwrap();
        let (Opened { key: got, rest: mut after }, whole) = match first {
            Some(found) => (found, false),
            None => (open.feed(&stream[cut..]).unwrap().expect("the whole frame"), true),
        };
        prop_assert_eq!(&got, &key);
        if !whole {
            // Whole within the first piece: the rest of that piece, then the next piece.
            prop_assert_eq!(&after[..], &stream[HEADER + key.len()..cut]);
            after.extend_from_slice(&stream[cut..]);
        }
        prop_assert_eq!(after, rest);
        if let Ok(Some(opened)) = OpenReader::new().feed(&noise) {
            prop_assert!(opened.key.len() <= MAX_KEY);
        }
    }
}

#[test]
fn an_open_frame_with_another_tag_or_a_key_too_long_is_refused() {
    let data = data_header(4);
    assert!(matches!(
        OpenReader::new().feed(&data),
        Err(WireError::Tag { tag: 1, .. })
    ));
    let mut long = open_frame(&[7; MAX_KEY]);
    long[4..8].copy_from_slice(&(MAX_KEY as u32 + 1).to_le_bytes());
    assert_eq!(
        OpenReader::new().feed(&long),
        Err(WireError::KeyTooLong { len: MAX_KEY + 1 })
    );
}

/// The receiving side of a channel with a pool of `segments`, its credit announced.
fn receiving(segments: usize) -> FrameReader {
    let pool = SegmentPool::new(0, segments, SEGMENT);
    let mut data = FrameReader::data(ReceiverCredit::new(pool.clone(), || {}).unwrap());
    // A pool serves one channel.
    assert!(ReceiverCredit::new(pool, || {}).is_none());
    assert_eq!(data.announce(), Some(segments as u32));
    data
}

/// `frames` data frames of 4 bytes.
fn frames(frames: usize) -> Vec<u8> {
    let mut wire = Vec::new();
    for _ in 0..frames {
        wire.extend(data_header(4));
        wire.extend([1, 2, 3, 4]);
    }
    wire
}

#[test]
fn a_sender_beyond_its_credit_a_frame_longer_than_a_segment_and_a_wrong_tag_are_refused() {
    let mut out = Vec::new();
    // Two credits, three frames: the third is refused, wherever the stream was cut.
    let wire = frames(3);
    for cut in [0, 5, 12, 30] {
        let mut data = receiving(2);
        let error = data
            .feed(&wire[..cut], &mut out)
            .and_then(|()| data.feed(&wire[cut..], &mut out))
            .unwrap_err();
        assert_eq!(
            error,
            WireError::OverCredit {
                at: 24,
                segments: 2
            }
        );
    }
    // Freed segments not yet announced are no credit either.
    let mut data = receiving(2);
    out.clear();
    data.feed(&frames(2), &mut out).unwrap();
    out.clear();
    assert!(data.feed(&frames(1), &mut out).is_err());

    let mut data = receiving(2);
    let error = data.feed(&data_header(SEGMENT + 1), &mut out).unwrap_err();
    assert!(
        error.to_string().contains("longer than a segment"),
        "{error}"
    );

    let mut data = receiving(2);
    let error = data.feed(&credit_frame(3), &mut out).unwrap_err();
    assert_eq!(
        error.to_string(),
        "byte 0 of the channel's stream: frame tag 2, expected data (1) or announce (4)"
    );
    // An announcement takes no credit: two frames after three announcements are taken.
    let mut data = receiving(2);
    out.clear();
    let mut wire: Vec<u8> = [7, 8, 9].into_iter().flat_map(announce_frame).collect();
    wire.extend(frames(2));
    data.feed(&wire, &mut out).unwrap();
    let announced: Vec<u32> = out
        .iter()
        .filter_map(|inbound| match inbound {
            Inbound::Announce(checkpoint) => Some(*checkpoint),
            _ => None,
        })
        .collect();
    assert_eq!(announced, [7, 8, 9]);
    assert_eq!(out.len(), 5);
    let mut credits = FrameReader::credits();
    let error = credits.feed(&data_header(0), &mut out).unwrap_err();
    assert!(error.to_string().contains("expected credit (2)"), "{error}");
    let mut credits = FrameReader::credits();
    let error = credits.feed(&announce_frame(1), &mut out).unwrap_err();
    assert!(error.to_string().contains("expected credit (2)"), "{error}");
}
