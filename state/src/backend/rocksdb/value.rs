//! The RocksDB value layout, the TTL compaction filter and the list-append merge operator.
//!
//! ```text
//! value frame   0x00, payload                       no TTL
//!               0x01, expires_at i64 LE, payload    TTL: expiry in ms since the epoch
//! list          element*, element = len u32 LE, value frame (len = frame length)
//! ```
//!
//! The payload is the [`crate::StateCodec`] encoding. Value, reducing, aggregating and map
//! entries are one frame; a list is a sequence of length-prefixed frames, so appending is a
//! concatenation (the merge operator) and every element keeps its own expiry.
//!
//! The compaction filter drops a value frame whose expiry has passed, and a list whose every
//! element has expired (a list with some live elements is kept; reads drop its expired
//! elements). Bytes it cannot parse are kept: compaction never destroys what it does not
//! understand.

use std::ffi::CStr;
use std::sync::Arc;

use rocksdb::compaction_filter::{CompactionFilter, Decision};
use rocksdb::compaction_filter_factory::{CompactionFilterContext, CompactionFilterFactory};
use rocksdb::MergeOperands;

use crate::ttl::{is_expired, Clock, NEVER_EXPIRES};

const PLAIN: u8 = 0;
const WITH_EXPIRY: u8 = 1;
const EXPIRY_LEN: usize = 8;
const LEN_PREFIX: usize = 4;

/// How values of a column family are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ColumnLayout {
    /// One value frame per key (value, reducing, aggregating, map).
    Single,
    /// A list of length-prefixed frames per key.
    List,
}

impl ColumnLayout {
    pub(crate) fn tag(self) -> &'static str {
        match self {
            ColumnLayout::Single => "value",
            ColumnLayout::List => "list",
        }
    }

    pub(crate) fn from_tag(tag: &str) -> Option<ColumnLayout> {
        match tag {
            "value" => Some(ColumnLayout::Single),
            "list" => Some(ColumnLayout::List),
            _ => None,
        }
    }
}

/// A parsed value frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Frame<'a> {
    pub(crate) expires_at: i64,
    pub(crate) payload: &'a [u8],
}

/// Why stored bytes do not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LayoutError {
    Empty,
    UnknownTag(u8),
    Truncated { expected: usize, found: usize },
}

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayoutError::Empty => f.write_str("empty value frame"),
            LayoutError::UnknownTag(tag) => write!(f, "unknown value frame tag {tag}"),
            LayoutError::Truncated { expected, found } => {
                write!(f, "truncated: expected {expected} bytes, found {found}")
            }
        }
    }
}

/// Appends a frame header for a value expiring at `expires_at`.
pub(crate) fn write_header(out: &mut Vec<u8>, expires_at: i64) {
    if expires_at == NEVER_EXPIRES {
        out.push(PLAIN);
    } else {
        out.push(WITH_EXPIRY);
        out.extend_from_slice(&expires_at.to_le_bytes());
    }
}

/// Parses one value frame.
pub(crate) fn parse_frame(bytes: &[u8]) -> Result<Frame<'_>, LayoutError> {
    match bytes.split_first() {
        None => Err(LayoutError::Empty),
        Some((&PLAIN, payload)) => Ok(Frame {
            expires_at: NEVER_EXPIRES,
            payload,
        }),
        Some((&WITH_EXPIRY, rest)) => {
            let Some((expiry, payload)) = rest.split_first_chunk::<EXPIRY_LEN>() else {
                return Err(LayoutError::Truncated {
                    expected: 1 + EXPIRY_LEN,
                    found: bytes.len(),
                });
            };
            Ok(Frame {
                expires_at: i64::from_le_bytes(*expiry),
                payload,
            })
        }
        Some((&tag, _)) => Err(LayoutError::UnknownTag(tag)),
    }
}

/// Rewrites the expiry of a frame that has one (a no-TTL frame is left alone).
pub(crate) fn set_expiry(frame: &mut [u8], expires_at: i64) {
    if frame.first() == Some(&WITH_EXPIRY) && frame.len() > EXPIRY_LEN {
        frame[1..1 + EXPIRY_LEN].copy_from_slice(&expires_at.to_le_bytes());
    }
}

/// Starts a list element: reserves its length prefix, to be filled by [`finish_element`].
pub(crate) fn begin_element(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; LEN_PREFIX]);
    start
}

/// Fills the length prefix of the element begun at `start`.
pub(crate) fn finish_element(out: &mut [u8], start: usize) {
    let len = (out.len() - start - LEN_PREFIX) as u32;
    out[start..start + LEN_PREFIX].copy_from_slice(&len.to_le_bytes());
}

/// Iterates the frames of a list value (each as its raw bytes).
pub(crate) fn list_elements(bytes: &[u8]) -> ListElements<'_> {
    ListElements { rest: bytes }
}

/// Iterator over the raw frames of a list value.
pub(crate) struct ListElements<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for ListElements<'a> {
    type Item = Result<&'a [u8], LayoutError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let Some((len, rest)) = self.rest.split_first_chunk::<LEN_PREFIX>() else {
            let found = self.rest.len();
            self.rest = &[];
            return Some(Err(LayoutError::Truncated {
                expected: LEN_PREFIX,
                found,
            }));
        };
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            self.rest = &[];
            return Some(Err(LayoutError::Truncated {
                expected: len,
                found: rest.len(),
            }));
        }
        let (frame, rest) = rest.split_at(len);
        self.rest = rest;
        Some(Ok(frame))
    }
}

/// Whether compaction may drop this value at `now` (see the module docs).
pub(crate) fn compaction_decision(layout: ColumnLayout, value: &[u8], now: i64) -> Decision {
    let all_expired = match layout {
        ColumnLayout::Single => {
            parse_frame(value).is_ok_and(|frame| is_expired(frame.expires_at, now))
        }
        ColumnLayout::List => {
            !value.is_empty()
                && list_elements(value).all(|element| {
                    element
                        .and_then(parse_frame)
                        .is_ok_and(|frame| is_expired(frame.expires_at, now))
                })
        }
    };
    if all_expired {
        Decision::Remove
    } else {
        Decision::Keep
    }
}

const TTL_FILTER_NAME: &CStr = c"weir-state-ttl";

/// Creates a [`TtlCompactionFilter`] per compaction, reading the clock once for it.
///
/// A factory rather than a single filter because RocksDB keeps the factory alive itself (a
/// shared pointer in the column family options); the single-filter setter of rocksdb 0.25 leaves
/// the column family with a dangling filter once the `Options` value is dropped after
/// `create_cf`.
pub(crate) struct TtlFilterFactory {
    pub(crate) layout: ColumnLayout,
    pub(crate) clock: Arc<dyn Clock>,
}

impl CompactionFilterFactory for TtlFilterFactory {
    type Filter = TtlCompactionFilter;

    fn create(&mut self, _context: CompactionFilterContext) -> TtlCompactionFilter {
        TtlCompactionFilter {
            layout: self.layout,
            now: self.clock.now_ms(),
        }
    }

    fn name(&self) -> &CStr {
        TTL_FILTER_NAME
    }
}

/// Drops expired values during one compaction (see the module docs).
pub(crate) struct TtlCompactionFilter {
    layout: ColumnLayout,
    now: i64,
}

impl CompactionFilter for TtlCompactionFilter {
    fn filter(&mut self, _level: u32, _key: &[u8], value: &[u8]) -> Decision {
        compaction_decision(self.layout, value, self.now)
    }

    fn name(&self) -> &CStr {
        TTL_FILTER_NAME
    }
}

/// The list merge operator: appends operands (themselves element sequences) to the value.
pub(crate) fn list_append(
    _key: &[u8],
    existing: Option<&[u8]>,
    operands: &MergeOperands,
) -> Option<Vec<u8>> {
    let len = existing.map_or(0, <[u8]>::len) + operands.iter().map(<[u8]>::len).sum::<usize>();
    let mut merged = Vec::with_capacity(len);
    if let Some(existing) = existing {
        merged.extend_from_slice(existing);
    }
    for operand in operands {
        merged.extend_from_slice(operand);
    }
    Some(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(expires_at: i64, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_header(&mut out, expires_at);
        out.extend_from_slice(payload);
        out
    }

    fn element(out: &mut Vec<u8>, expires_at: i64, payload: &[u8]) {
        let start = begin_element(out);
        write_header(out, expires_at);
        out.extend_from_slice(payload);
        finish_element(out, start);
    }

    #[test]
    fn frames_round_trip() {
        let plain = frame(NEVER_EXPIRES, b"abc");
        assert_eq!(plain.len(), 4);
        assert_eq!(
            parse_frame(&plain).unwrap(),
            Frame {
                expires_at: NEVER_EXPIRES,
                payload: b"abc"
            }
        );
        let mut timed = frame(1_000, b"xyz");
        assert_eq!(parse_frame(&timed).unwrap().expires_at, 1_000);
        set_expiry(&mut timed, 2_000);
        assert_eq!(
            parse_frame(&timed).unwrap(),
            Frame {
                expires_at: 2_000,
                payload: b"xyz"
            }
        );
        assert_eq!(parse_frame(&[7]), Err(LayoutError::UnknownTag(7)));
        assert!(parse_frame(&[1, 0, 0]).is_err());
    }

    #[test]
    fn list_elements_split_and_detect_truncation() {
        let mut list = Vec::new();
        element(&mut list, NEVER_EXPIRES, b"a");
        element(&mut list, 5, b"bb");
        let frames: Vec<_> = list_elements(&list).map(Result::unwrap).collect();
        assert_eq!(parse_frame(frames[0]).unwrap().payload, b"a");
        assert_eq!(parse_frame(frames[1]).unwrap().expires_at, 5);
        assert!(list_elements(&list[..list.len() - 1]).any(|element| element.is_err()));
    }

    #[test]
    fn compaction_drops_only_fully_expired() {
        let expired = frame(10, b"x");
        let live = frame(100, b"x");
        let forever = frame(NEVER_EXPIRES, b"x");
        assert!(matches!(
            compaction_decision(ColumnLayout::Single, &expired, 50),
            Decision::Remove
        ));
        assert!(matches!(
            compaction_decision(ColumnLayout::Single, &live, 50),
            Decision::Keep
        ));
        assert!(matches!(
            compaction_decision(ColumnLayout::Single, &forever, 50),
            Decision::Keep
        ));
        assert!(matches!(
            compaction_decision(ColumnLayout::Single, &[9, 9], 50),
            Decision::Keep
        ));
        let mut list = Vec::new();
        element(&mut list, 10, b"a");
        element(&mut list, 20, b"b");
        assert!(matches!(
            compaction_decision(ColumnLayout::List, &list, 50),
            Decision::Remove
        ));
        element(&mut list, 100, b"c");
        assert!(matches!(
            compaction_decision(ColumnLayout::List, &list, 50),
            Decision::Keep
        ));
    }
}
