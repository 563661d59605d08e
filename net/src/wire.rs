//! What one channel's byte stream between two processes carries (a stream per channel, both
//! ways: a QUIC stream, or any ordered byte stream): frames with an 8-byte header, a tag and a
//! value (`u32` each, little-endian).
//!
//! | tag | frame | direction | value | body |
//! |---|---|---|---|---|
//! | 1 | data | sender → receiver | the segment's filled length | that many bytes: one whole segment |
//! | 2 | credit | receiver → sender | segments the receiver can take beyond those it announced before | none |
//! | 3 | open | sender → receiver, first on the stream | the channel's key length (at most [`MAX_KEY`]) | the key |
//! | 4 | announce | sender → receiver | an unaligned checkpoint's number | none |
//!
//! The open frame names the channel the stream carries; the receiving side matches it to a
//! receiver registered under that key and grants credit only then.
//! A data frame lands in a segment of the receiver's own pool for the channel, whose size is
//! the credit the receiver grants (see `credit.rs`): a sender that keeps to its credit always
//! finds one free. The segment's bytes are not checked here; the engine checks every segment
//! from another process before anything reads it.
//! An announce frame says the sender passed an unaligned checkpoint's barrier into the
//! channel. It takes no credit, so it goes out behind only what already had credit, ahead of
//! the barrier's own segment (which waits for credit): the receiver starts the checkpoint
//! without first working through what the channel holds, and the barrier follows in-band
//! (see the engine's `inflight.rs`).

use weir_memory::Segment;

use crate::credit::ReceiverCredit;

/// Bytes of a frame header.
pub const HEADER: usize = 8;
const TAG_DATA: u32 = 1;
const TAG_CREDIT: u32 = 2;
const TAG_OPEN: u32 = 3;
const TAG_ANNOUNCE: u32 = 4;
/// The longest channel key an open frame carries.
pub const MAX_KEY: usize = 256;

/// The header of a data frame carrying `len` bytes of a segment.
pub fn data_header(len: usize) -> [u8; HEADER] {
    header(
        TAG_DATA,
        u32::try_from(len).expect("a segment is smaller than 4 GiB"),
    )
}

/// A credit frame granting `credits` more segments.
pub fn credit_frame(credits: u32) -> [u8; HEADER] {
    header(TAG_CREDIT, credits)
}

/// An announce frame: the sender passed checkpoint `checkpoint`'s barrier into the channel.
pub fn announce_frame(checkpoint: u32) -> [u8; HEADER] {
    header(TAG_ANNOUNCE, checkpoint)
}

/// The open frame naming the channel `key` (at most [`MAX_KEY`] bytes).
pub fn open_frame(key: &[u8]) -> Vec<u8> {
    assert!(key.len() <= MAX_KEY, "a channel key of {} bytes", key.len());
    let mut frame = header(TAG_OPEN, key.len() as u32).to_vec();
    frame.extend_from_slice(key);
    frame
}

fn header(tag: u32, value: u32) -> [u8; HEADER] {
    let mut bytes = [0; HEADER];
    bytes[..4].copy_from_slice(&tag.to_le_bytes());
    bytes[4..].copy_from_slice(&value.to_le_bytes());
    bytes
}

/// What a [`FrameReader`] read.
#[derive(Debug)]
pub enum Inbound {
    /// A whole segment, in the receiver's pool.
    Segment(Segment),
    /// Credit for this many more segments.
    Credit(u32),
    /// The sender passed this checkpoint's barrier into the channel.
    Announce(u32),
}

/// A stream that breaks the protocol: the channel fails (nothing after it is read).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A tag this side does not take.
    #[error("byte {at} of the channel's stream: frame tag {tag}, expected {expected}")]
    Tag {
        /// Where the frame starts in the stream.
        at: u64,
        /// Its tag.
        tag: u32,
        /// What this side takes.
        expected: &'static str,
    },
    /// A data frame longer than a segment.
    #[error(
        "byte {at} of the channel's stream: a data frame of {len} bytes, longer than a segment \
         ({segment_size} bytes); both ends must have the same taskmanager.memory.segment-size"
    )]
    TooLong {
        /// Where the frame starts in the stream.
        at: u64,
        /// Its length.
        len: usize,
        /// The receiver's segment size.
        segment_size: usize,
    },
    /// An open frame whose key is longer than [`MAX_KEY`].
    #[error(
        "the channel's open frame names a key of {len} bytes, longer than {MAX_KEY}: the peer \
         speaks another protocol"
    )]
    KeyTooLong {
        /// The key's length.
        len: usize,
    },
    /// A data frame the receiver had granted no credit for.
    #[error(
        "byte {at} of the channel's stream: a data frame beyond the credit granted (the \
         channel has {segments} segments)"
    )]
    OverCredit {
        /// Where the frame starts in the stream.
        at: u64,
        /// The channel's segments.
        segments: usize,
    },
}

/// Reads one direction of a channel's stream, fed bytes in whatever pieces they arrive:
/// a receiver's data frames (into segments of its pool, each against a credit it announced)
/// and announce frames, or a sender's credit frames. After an error it reads nothing more.
pub struct FrameReader {
    /// The receiver's credit and pool for the channel; `None` on the sender's side.
    credit: Option<ReceiverCredit>,
    header: [u8; HEADER],
    have: usize,
    /// The data frame being read: its segment and its length.
    body: Option<(Segment, usize)>,
    /// Bytes of the stream read so far.
    offset: u64,
    /// Where the current frame started.
    frame_start: u64,
    failed: Option<WireError>,
}

impl FrameReader {
    /// The receiver's side of a channel: data frames, each into a segment of the credit's
    /// pool.
    pub fn data(credit: ReceiverCredit) -> FrameReader {
        FrameReader::with(Some(credit))
    }

    /// The sender's side of a channel: credit frames.
    pub fn credits() -> FrameReader {
        FrameReader::with(None)
    }

    fn with(credit: Option<ReceiverCredit>) -> FrameReader {
        FrameReader {
            credit,
            header: [0; HEADER],
            have: 0,
            body: None,
            offset: 0,
            frame_start: 0,
            failed: None,
        }
    }

    /// The receiver's credit to announce now (see [`ReceiverCredit`]); `None` on the
    /// sender's side or when there is none.
    pub fn announce(&mut self) -> Option<u32> {
        self.credit.as_mut()?.announce()
    }

    /// Whether the stream read so far ends where a frame ends (a stream that ends elsewhere
    /// lost the rest of a frame).
    pub fn between_frames(&self) -> bool {
        self.body.is_none() && self.have == 0
    }

    /// Reads `bytes`, the stream's next, appending each whole frame to `out`.
    pub fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<Inbound>) -> Result<(), WireError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        while !bytes.is_empty() {
            let taken = match self.body.as_mut() {
                Some((segment, len)) => {
                    let filled = segment.len();
                    let take = (*len - filled).min(bytes.len());
                    segment.buffer_mut()[filled..filled + take].copy_from_slice(&bytes[..take]);
                    segment.set_len(filled + take);
                    if segment.len() == *len {
                        let (segment, _) = self.body.take().expect("a body is being read");
                        out.push(Inbound::Segment(segment));
                        self.frame_start = self.offset + take as u64;
                    }
                    take
                }
                None => {
                    let take = (HEADER - self.have).min(bytes.len());
                    self.header[self.have..self.have + take].copy_from_slice(&bytes[..take]);
                    self.have += take;
                    if self.have == HEADER {
                        self.have = 0;
                        if let Err(error) = self.frame(out) {
                            self.failed = Some(error.clone());
                            return Err(error);
                        }
                        if self.body.is_none() {
                            self.frame_start = self.offset + take as u64;
                        }
                    }
                    take
                }
            };
            self.offset += taken as u64;
            bytes = &bytes[taken..];
        }
        Ok(())
    }

    /// A whole header came: a credit frame is done, a data frame's body begins.
    fn frame(&mut self, out: &mut Vec<Inbound>) -> Result<(), WireError> {
        let tag = u32::from_le_bytes(self.header[..4].try_into().expect("4 bytes"));
        let value = u32::from_le_bytes(self.header[4..].try_into().expect("4 bytes"));
        let at = self.frame_start;
        match (&mut self.credit, tag) {
            (None, TAG_CREDIT) => {
                out.push(Inbound::Credit(value));
                Ok(())
            }
            (Some(credit), TAG_DATA) => {
                let len = value as usize;
                let pool = credit.pool();
                let (segment_size, segments) = (pool.segment_size(), pool.capacity());
                if len > segment_size {
                    return Err(WireError::TooLong {
                        at,
                        len,
                        segment_size,
                    });
                }
                let over = WireError::OverCredit { at, segments };
                if !credit.take() {
                    return Err(over);
                }
                // A credit stands for a free segment (announced only for those).
                let mut segment = credit.pool().acquire().map_err(|_| over)?;
                segment.set_len(0);
                if len == 0 {
                    out.push(Inbound::Segment(segment));
                } else {
                    self.body = Some((segment, len));
                }
                Ok(())
            }
            (Some(_), TAG_ANNOUNCE) => {
                out.push(Inbound::Announce(value));
                Ok(())
            }
            (credit, tag) => Err(WireError::Tag {
                at,
                tag,
                expected: if credit.is_some() {
                    "data (1) or announce (4)"
                } else {
                    "credit (2)"
                },
            }),
        }
    }
}

/// An open frame read whole: the channel's key, and the stream's bytes after the frame (the
/// channel's data frames, for its [`FrameReader`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Opened {
    /// The channel's key.
    pub key: Vec<u8>,
    /// The bytes read after the frame.
    pub rest: Vec<u8>,
}

/// Reads the open frame at the start of a stream, fed bytes in whatever pieces they arrive.
#[derive(Debug, Default)]
pub struct OpenReader {
    bytes: Vec<u8>,
}

impl OpenReader {
    /// A reader waiting for the stream's first bytes.
    pub fn new() -> OpenReader {
        OpenReader::default()
    }

    /// Reads `bytes`, the stream's next: the open frame once it is whole, `None` until then.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Option<Opened>, WireError> {
        self.bytes.extend_from_slice(bytes);
        if self.bytes.len() < HEADER {
            return Ok(None);
        }
        let tag = u32::from_le_bytes(self.bytes[..4].try_into().expect("4 bytes"));
        let len = u32::from_le_bytes(self.bytes[4..HEADER].try_into().expect("4 bytes")) as usize;
        if tag != TAG_OPEN {
            return Err(WireError::Tag {
                at: 0,
                tag,
                expected: "open (3)",
            });
        }
        if len > MAX_KEY {
            return Err(WireError::KeyTooLong { len });
        }
        if self.bytes.len() < HEADER + len {
            return Ok(None);
        }
        let rest = self.bytes.split_off(HEADER + len);
        let key = self.bytes.split_off(HEADER);
        Ok(Some(Opened { key, rest }))
    }
}
