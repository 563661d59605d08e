//! How state values, keys and namespaces become bytes: rkyv's low-level API.
//!
//! [`StateCodec`] is implemented for every type that derives rkyv's `Archive`, `Serialize` and
//! `Deserialize` (with bytecheck, rkyv's default) — the same kind of bounds as the engine's
//! `Record`, with a growable `Vec<u8>` writer instead of a fixed segment and `rancor::Error` so
//! that a decoding failure says what is wrong.
//!
//! The bytes are deterministic: rkyv writes padding as zeros and the low-level API shares no
//! pointers, so equal values give equal bytes. The RocksDB backend relies on that for keys.
//!
//! Decoding is always validated: bytes come from disk, and a damaged file or a changed type must
//! give a [`crate::StateErrorKind::Corrupt`] error, never undefined behaviour.
//!
//! **Integers** (`u8`–`u128`, `i8`–`i128`) are what most keys, namespaces (a window's pane
//! number) and counters are, and rkyv archives one as its little-endian bytes. They are written
//! and read as such here, without rkyv's arena (a thread-local) and validator, which cost ~150
//! instructions for 8 bytes; a test checks the bytes are rkyv's. Reading one checks that the
//! bytes are exactly as long as the integer (stricter than rkyv, which reads its root from the
//! last bytes of a longer buffer). The type is told apart by its `TypeId`, a constant for each
//! `T`: in an optimized build every other type goes straight to rkyv's path (`bytecheck`).

use std::any::{Any, TypeId};
use std::cell::RefCell;

use rkyv::api::low::{LowDeserializer, LowSerializer, LowValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::rancor;
use rkyv::ser::allocator::{Arena, ArenaHandle};
use rkyv::ser::{Positional, Writer};
use rkyv::util::AlignedVec;
use rkyv::{Archive, Deserialize, Serialize};

/// A type that can be stored in a state backend: encoded to deterministic bytes and decoded
/// back with validation. Implemented for every rkyv-archivable type (see the module docs).
pub trait StateCodec: Sized + 'static {
    /// Appends the encoding of `self` to `out`.
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), rancor::Error>;

    /// Decodes a value from exactly the bytes [`StateCodec::encode_into`] appended. The bytes
    /// may sit at any alignment.
    fn decode(bytes: &[u8]) -> Result<Self, rancor::Error>;

    /// The encoding of `self` as a fresh vector.
    fn encode(&self) -> Result<Vec<u8>, rancor::Error> {
        let mut out = Vec::new();
        self.encode_into(&mut out)?;
        Ok(out)
    }
}

/// Archives are decoded from a buffer aligned to this many bytes (rkyv's largest primitive
/// alignment); bytes already aligned to the archived type's needs are read in place.
const DECODE_ALIGN: usize = 16;

thread_local! {
    /// A reusable arena for encoding, so a small value costs no allocation.
    static ENCODE_ARENA: RefCell<Arena> = RefCell::new(Arena::new());
    /// A reusable aligned buffer for decoding bytes that come unaligned (e.g. from RocksDB).
    static DECODE_SCRATCH: RefCell<AlignedVec<DECODE_ALIGN>> = RefCell::new(AlignedVec::new());
}

/// Where [`StateCodec::encode_into`] archives a value: the end of the caller's vector, with
/// positions counted from where the archive begins. rkyv pads by position, so the bytes are
/// those of the value archived on its own (an archive is read back from its first byte).
pub struct Appender<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl Positional for Appender<'_> {
    #[inline]
    fn pos(&self) -> usize {
        self.out.len() - self.start
    }
}

impl<E> Writer<E> for Appender<'_> {
    #[inline]
    fn write(&mut self, bytes: &[u8]) -> Result<(), E> {
        self.out.extend_from_slice(bytes);
        Ok(())
    }
}

impl<T> StateCodec for T
where
    T: Archive + 'static,
    T: for<'a, 'b> Serialize<LowSerializer<Appender<'b>, ArenaHandle<'a>, rancor::Error>>,
    T::Archived: for<'a> CheckBytes<LowValidator<'a, rancor::Error>>
        + Deserialize<T, LowDeserializer<rancor::Error>>,
{
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), rancor::Error> {
        if integer::encode(self, out) {
            return Ok(());
        }
        let start = out.len();
        let archive = |out: &mut Vec<u8>, arena: &mut Arena| {
            let writer = Appender { out, start };
            rkyv::api::low::to_bytes_in_with_alloc::<_, _, rancor::Error>(
                self,
                writer,
                arena.acquire(),
            )
            .map(|_| ())
        };
        let result = ENCODE_ARENA.with(|arena| match arena.try_borrow_mut() {
            Ok(mut arena) => archive(out, &mut arena),
            // A Serialize impl that itself encodes state (re-entrant): a fresh arena.
            Err(_) => archive(out, &mut Arena::new()),
        });
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    fn decode(bytes: &[u8]) -> Result<Self, rancor::Error> {
        if let Some(decoded) = integer::decode(bytes) {
            return decoded;
        }
        let needed = std::mem::align_of::<T::Archived>();
        if (bytes.as_ptr() as usize).is_multiple_of(needed) {
            return decode_aligned::<T>(bytes);
        }
        if needed > DECODE_ALIGN {
            let mut copy = AlignedVec::<64>::with_capacity(bytes.len());
            copy.extend_from_slice(bytes);
            return decode_aligned::<T>(&copy);
        }
        DECODE_SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut aligned) => {
                aligned.clear();
                aligned.extend_from_slice(bytes);
                decode_aligned::<T>(&aligned)
            }
            Err(_) => {
                let mut aligned = AlignedVec::<DECODE_ALIGN>::with_capacity(bytes.len());
                aligned.extend_from_slice(bytes);
                decode_aligned::<T>(&aligned)
            }
        })
    }
}

/// Integers as rkyv archives them: their little-endian bytes (see the module docs).
mod integer {
    use super::*;

    /// The encoded integer was not as long as its type.
    #[derive(Debug)]
    struct WrongLength {
        type_name: &'static str,
        expected: usize,
        found: usize,
    }

    impl std::fmt::Display for WrongLength {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "an encoded {} is {} bytes, found {}",
                self.type_name, self.expected, self.found
            )
        }
    }

    impl std::error::Error for WrongLength {}

    macro_rules! integers {
        ($($int:ty),*) => {
            /// Appends `value`'s bytes if it is an integer; `false` if it is not.
            #[inline(always)]
            pub(super) fn encode<T: 'static>(value: &T, out: &mut Vec<u8>) -> bool {
                $(
                    if TypeId::of::<T>() == TypeId::of::<$int>() {
                        let int = (value as &dyn Any)
                            .downcast_ref::<$int>()
                            .expect(concat!("T is ", stringify!($int)));
                        out.extend_from_slice(&int.to_le_bytes());
                        return true;
                    }
                )*
                false
            }

            /// The integer `T` in `bytes`; `None` if `T` is not an integer.
            #[inline(always)]
            pub(super) fn decode<T: 'static>(bytes: &[u8]) -> Option<Result<T, rancor::Error>> {
                $(
                    if TypeId::of::<T>() == TypeId::of::<$int>() {
                        let decoded = match bytes.try_into() {
                            Ok(array) => Ok(<$int>::from_le_bytes(array)),
                            Err(_) => Err(<rancor::Error as rancor::Source>::new(WrongLength {
                                type_name: stringify!($int),
                                expected: size_of::<$int>(),
                                found: bytes.len(),
                            })),
                        };
                        // `T` is `$int`: the value moves across as an `Option<T>`.
                        let mut decoded = Some(decoded);
                        let slot = &mut decoded as &mut dyn Any;
                        return slot
                            .downcast_mut::<Option<Result<T, rancor::Error>>>()
                            .and_then(Option::take);
                    }
                )*
                None
            }
        };
    }

    integers!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128);
}

fn decode_aligned<T>(bytes: &[u8]) -> Result<T, rancor::Error>
where
    T: Archive,
    T::Archived: for<'a> CheckBytes<LowValidator<'a, rancor::Error>>
        + Deserialize<T, LowDeserializer<rancor::Error>>,
{
    let archived = rkyv::api::low::access::<T::Archived, rancor::Error>(bytes)?;
    rkyv::api::low::deserialize::<T, rancor::Error>(archived)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Archive, Serialize, Deserialize, Debug, PartialEq, Clone)]
    struct Window {
        start: i64,
        end: i64,
        tag: u8,
    }

    fn round_trip<T: StateCodec + PartialEq + std::fmt::Debug>(value: &T) {
        let bytes = value.encode().unwrap();
        assert_eq!(&T::decode(&bytes).unwrap(), value);
        // Unaligned input decodes too.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&bytes);
        assert_eq!(&T::decode(&shifted[1..]).unwrap(), value);
        // Deterministic.
        assert_eq!(value.encode().unwrap(), bytes);
    }

    /// What rkyv writes for `value` archived on its own, into a fresh buffer.
    fn archived_alone<T>(value: &T) -> Vec<u8>
    where
        T: for<'a> Serialize<LowSerializer<Vec<u8>, ArenaHandle<'a>, rancor::Error>>,
    {
        let mut arena = Arena::new();
        rkyv::api::low::to_bytes_in_with_alloc::<_, _, rancor::Error>(
            value,
            Vec::new(),
            arena.acquire(),
        )
        .unwrap()
    }

    /// Appended after `prefix` bytes, `value`'s encoding is its archive on its own: the
    /// padding counts from where the archive begins, not from the vector's start.
    fn appends_as_archived_alone<T>(value: &T, prefix: usize)
    where
        T: StateCodec + for<'a> Serialize<LowSerializer<Vec<u8>, ArenaHandle<'a>, rancor::Error>>,
    {
        let mut out = vec![0xee; prefix];
        value.encode_into(&mut out).unwrap();
        assert_eq!(out[..prefix], vec![0xee; prefix][..]);
        assert_eq!(out[prefix..], archived_alone(value)[..]);
    }

    #[test]
    fn struct_with_padding_is_deterministic() {
        round_trip(&Window {
            start: -5,
            end: 10,
            tag: 3,
        });
    }

    #[test]
    fn garbage_is_an_error_not_ub() {
        // A String archive whose relative pointer points outside the buffer.
        let long = "a string too long to be stored inline"
            .to_string()
            .encode()
            .unwrap();
        assert!(String::decode(&long[long.len() - 8..]).is_err());
        // Bytes that are not UTF-8.
        let mut short = "abc".to_string().encode().unwrap();
        let at = short.iter().position(|&b| b == b'a').unwrap();
        short[at] = 0xc0;
        assert!(String::decode(&short).is_err());
        assert!(u64::decode(&[1, 2, 3]).is_err());
        let message = i32::decode(&[1, 2, 3, 4, 5]).unwrap_err().to_string();
        assert!(message.contains("i32 is 4 bytes, found 5"), "{message}");
    }

    /// An integer's bytes are those rkyv archives it as, taken apart by the arena and
    /// validator: state written before the integers' own path reads back the same.
    fn integer_is_archived_by_rkyv<T>(value: T)
    where
        T: StateCodec
            + PartialEq
            + std::fmt::Debug
            + Archive
            + for<'a> Serialize<LowSerializer<Vec<u8>, ArenaHandle<'a>, rancor::Error>>,
        T::Archived: for<'a> CheckBytes<LowValidator<'a, rancor::Error>>
            + Deserialize<T, LowDeserializer<rancor::Error>>,
    {
        let bytes = value.encode().unwrap();
        assert_eq!(bytes, archived_alone(&value));
        let mut aligned = rkyv::util::AlignedVec::<16>::new();
        aligned.extend_from_slice(&bytes);
        assert_eq!(decode_aligned::<T>(&aligned).unwrap(), value);
        round_trip(&value);
    }

    proptest! {
        #[test]
        fn values_round_trip(n in any::<u64>(), s in ".{0,100}", v in proptest::collection::vec(any::<i32>(), 0..50)) {
            round_trip(&n);
            round_trip(&s);
            round_trip(&(s.clone(), n));
            round_trip(&v);
            round_trip(&Some(s));
        }

        #[test]
        fn integers_are_encoded_as_rkyv_archives_them(
            (a, b, c, d, e) in (any::<u8>(), any::<u16>(), any::<u32>(), any::<u64>(), any::<u128>()),
            (f, g, h, i, j) in (any::<i8>(), any::<i16>(), any::<i32>(), any::<i64>(), any::<i128>()),
        ) {
            integer_is_archived_by_rkyv(a);
            integer_is_archived_by_rkyv(b);
            integer_is_archived_by_rkyv(c);
            integer_is_archived_by_rkyv(d);
            integer_is_archived_by_rkyv(e);
            integer_is_archived_by_rkyv(f);
            integer_is_archived_by_rkyv(g);
            integer_is_archived_by_rkyv(h);
            integer_is_archived_by_rkyv(i);
            integer_is_archived_by_rkyv(j);
        }

        #[test]
        fn values_append_as_archived_alone(
            prefix in 0usize..24,
            n in any::<u64>(),
            s in ".{0,100}",
            v in proptest::collection::vec(any::<i32>(), 0..50),
            (start, end, tag) in (any::<i64>(), any::<i64>(), any::<u8>()),
        ) {
            appends_as_archived_alone(&n, prefix);
            appends_as_archived_alone(&s, prefix);
            appends_as_archived_alone(&(tag, s.clone(), n), prefix);
            appends_as_archived_alone(&v, prefix);
            appends_as_archived_alone(&Window { start, end, tag }, prefix);
        }
    }
}
