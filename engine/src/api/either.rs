//! `Either`: a record of one of two types — how two-input constructs (`connect`, window joins,
//! `co_group`, interval joins) carry both inputs through one single-input operator.
//!
//! Flink builds its window joins the same way (`CoGroupedStreams` tags each side into a
//! `TaggedUnion`, unions the two streams, keys them and windows them). Here the tagging map is
//! chained to each input, the union's input gate takes the minimum watermark over all its
//! channels — Flink's two-input rule `min(wm1, wm2)`, with the same idleness handling — and
//! the keyed operator behind it sees records of both sides with equal keys on one subtask.

use rkyv::rancor::{self, Source};
use weir_state::StateCodec;

use crate::record::{Record, Scratch};

/// A record from the left (first) or the right (second) input of a two-input construct.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Either<L, R> {
    /// A record of the first input (`process_element1`, the left side of a join).
    Left(L),
    /// A record of the second input (`process_element2`, the right side of a join).
    Right(R),
}

const LEFT: u8 = 0;
const RIGHT: u8 = 1;

/// On an exchange, the side's own archive comes first (so it starts at the 16-byte aligned
/// address its `decode` needs), followed by one byte that says which side it is.
impl<L: Record, R: Record> Record for Either<L, R> {
    #[inline]
    fn encode(&self, out: &mut [u8], scratch: &mut Scratch<'_>) -> Option<usize> {
        let (len, tag) = match self {
            Either::Left(value) => (value.encode(out, scratch)?, LEFT),
            Either::Right(value) => (value.encode(out, scratch)?, RIGHT),
        };
        *out.get_mut(len)? = tag;
        Some(len + 1)
    }

    #[inline]
    unsafe fn decode(bytes: &[u8]) -> Self {
        let (&tag, inner) = bytes
            .split_last()
            .expect("an Either archive ends in its tag");
        match tag {
            // SAFETY: `encode` wrote the side's archive at the start of these (aligned) bytes
            // and the tag after it, so `inner` is exactly what the side's `encode` wrote.
            LEFT => Either::Left(unsafe { L::decode(inner) }),
            // SAFETY: as above.
            RIGHT => Either::Right(unsafe { R::decode(inner) }),
            other => unreachable!("internal error: Either archive with tag {other}"),
        }
    }

    fn check(bytes: &[u8]) -> Result<(), String> {
        match bytes.split_last() {
            Some((&LEFT, inner)) => L::check(inner),
            Some((&RIGHT, inner)) => R::check(inner),
            other => Err(format!(
                "an Either archive ends in side byte {LEFT} or {RIGHT}, found {:?}",
                other.map(|(tag, _)| tag)
            )),
        }
    }
}

/// In a state backend (records of a window join's windows): one byte for the side, then the
/// side's own encoding.
impl<L: StateCodec, R: StateCodec> StateCodec for Either<L, R> {
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), rancor::Error> {
        match self {
            Either::Left(value) => {
                out.push(LEFT);
                value.encode_into(out)
            }
            Either::Right(value) => {
                out.push(RIGHT);
                value.encode_into(out)
            }
        }
    }

    fn decode(bytes: &[u8]) -> Result<Self, rancor::Error> {
        match bytes.split_first() {
            Some((&LEFT, side)) => Ok(Either::Left(L::decode(side)?)),
            Some((&RIGHT, side)) => Ok(Either::Right(R::decode(side)?)),
            _ => Err(rancor::Error::new(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "an Either in state starts with side byte {LEFT} or {RIGHT}, found {:?}",
                    bytes.first()
                ),
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rkyv::ser::allocator::Arena;

    #[repr(align(16))]
    struct Aligned([u8; 4096]);

    fn round_trip<T: Record + PartialEq + std::fmt::Debug>(value: &T) {
        let mut buf = Aligned([0; 4096]);
        let mut arena = Arena::new();
        let len = value
            .encode(&mut buf.0, &mut Scratch::new(&mut arena))
            .expect("fits");
        // SAFETY: decoding exactly what `encode` wrote, from a 16-byte aligned buffer.
        let back = unsafe { T::decode(&buf.0[..len]) };
        assert_eq!(&back, value);
    }

    proptest! {
        #[test]
        fn either_round_trips(n in any::<u64>(), s in ".{0,200}", left in any::<bool>()) {
            let value: Either<(String, u64), Vec<u8>> = if left {
                Either::Left((s, n))
            } else {
                Either::Right(s.into_bytes())
            };
            round_trip(&value);
            round_trip(&Either::<Either<u8, String>, i64>::Left(Either::Right("nested".into())));
        }
    }

    #[test]
    fn no_room_for_the_tag_is_refused() {
        let mut arena = Arena::new();
        let mut scratch = Scratch::new(&mut arena);
        let value: Either<u64, u64> = Either::Left(7);
        let mut buf = Aligned([0; 4096]);
        let len = Record::encode(&value, &mut buf.0, &mut scratch).expect("fits");
        assert_eq!(
            Record::encode(&value, &mut buf.0[..len - 1], &mut scratch),
            None
        );
    }

    #[test]
    fn state_bytes_round_trip_and_a_bad_side_byte_is_refused() {
        let values: [Either<u64, String>; 2] = [Either::Left(7), Either::Right("seven".into())];
        for value in values {
            let bytes = StateCodec::encode(&value).expect("encodes");
            assert_eq!(
                <Either<u64, String> as StateCodec>::decode(&bytes).ok(),
                Some(value)
            );
        }
        let error = <Either<u64, u64> as StateCodec>::decode(&[9, 0, 0, 0, 0, 0, 0, 0, 0])
            .expect_err("9 is no side");
        assert!(error.to_string().contains("found Some(9)"), "{error}");
    }
}
