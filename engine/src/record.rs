//! What flows through a job: records (rkyv-archivable Rust values), keys and watermarks.

use std::fmt::Debug;
use std::hash::Hash;

use std::alloc::Layout;
use std::ptr::NonNull;

use rkyv::api::low::{LowDeserializer, LowSerializer, LowValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::rancor::{self, Failure};
use rkyv::ser::allocator::{Arena, ArenaHandle};
use rkyv::ser::{Allocator, Positional, Writer};
use rkyv::validation::{archive::ArchiveValidator, Validator};
use rkyv::{Archive, Deserialize, Serialize};

/// Where a record is archived: the free bytes of a segment, filled front to back. (rkyv's own
/// `Buffer` does the same in calls the archiving of a small record cannot inline.)
pub struct RecordWriter<'a> {
    out: &'a mut [u8],
    len: usize,
}

impl Positional for RecordWriter<'_> {
    #[inline]
    fn pos(&self) -> usize {
        self.len
    }
}

impl Writer<Failure> for RecordWriter<'_> {
    #[inline]
    fn write(&mut self, bytes: &[u8]) -> Result<(), Failure> {
        let end = self.len + bytes.len();
        let to = self.out.get_mut(self.len..end).ok_or(Failure)?;
        to.copy_from_slice(bytes);
        self.len = end;
        Ok(())
    }
}

/// Scratch space for archiving records: a handle on an rkyv arena, acquired once for the
/// records of a batch. (Acquiring it per record cost more than archiving a small record: the
/// handle is returned through memory and read back at once, which stalls.) Serializers pop
/// what they push, so the handle's use does not grow from record to record.
pub struct Scratch<'a>(ArenaHandle<'a>);

impl<'a> Scratch<'a> {
    /// Scratch space in `arena`, until it is dropped.
    pub fn new(arena: &'a mut Arena) -> Self {
        Scratch(arena.acquire())
    }
}

// SAFETY: forwards to the arena handle, which upholds the contract.
unsafe impl<E> Allocator<E> for &mut Scratch<'_> {
    #[inline]
    unsafe fn push_alloc(&mut self, layout: Layout) -> Result<NonNull<[u8]>, E> {
        // SAFETY: the caller upholds `push_alloc`'s contract.
        unsafe { <ArenaHandle<'_> as Allocator<E>>::push_alloc(&mut self.0, layout) }
    }

    #[inline]
    unsafe fn pop_alloc(&mut self, ptr: NonNull<u8>, layout: Layout) -> Result<(), E> {
        // SAFETY: the caller upholds `pop_alloc`'s contract.
        unsafe { <ArenaHandle<'_> as Allocator<E>>::pop_alloc(&mut self.0, ptr, layout) }
    }
}

/// A value that can flow through a job. Any `Clone + Send` type deriving rkyv's `Archive`,
/// `Serialize` and `Deserialize` is one (as are primitives, `String`, tuples and `Vec`s of them).
/// Records are archived with rkyv's low-level API (no shared-pointer tracking), which keeps
/// encoding a small struct close to a copy.
///
/// Inside a chain, records move by value; across an exchange edge to another shard they are
/// archived into a network segment and read back on the receiving shard (to a subtask on the
/// same shard they move by value, in batches).
pub trait Record: Clone + Send + 'static {
    /// Archives `self` into the start of `out` (root last) and returns the bytes written, or
    /// `None` if `out` is too small.
    fn encode(&self, out: &mut [u8], scratch: &mut Scratch<'_>) -> Option<usize>;

    /// Reads a record back from bytes written by [`Record::encode`].
    ///
    /// # Safety
    /// `bytes` must be exactly what `encode` wrote for this type, or bytes [`Record::check`]
    /// passed, starting at a 16-byte aligned address.
    unsafe fn decode(bytes: &[u8]) -> Self;

    /// Checks that `bytes` (16-byte aligned) hold a valid archive of this type (rkyv's
    /// `bytecheck`): what bytes from another process must pass before [`Record::decode`]
    /// reads them.
    fn check(bytes: &[u8]) -> Result<(), String>;
}

impl<T> Record for T
where
    T: Archive + Clone + Send + 'static,
    T: for<'a, 's, 'h> Serialize<LowSerializer<RecordWriter<'a>, &'s mut Scratch<'h>, Failure>>,
    T::Archived: Deserialize<T, LowDeserializer<Failure>>
        + for<'a> CheckBytes<LowValidator<'a, rancor::Error>>,
{
    #[inline]
    fn encode(&self, out: &mut [u8], scratch: &mut Scratch<'_>) -> Option<usize> {
        const {
            assert!(
                std::mem::align_of::<T::Archived>() <= 16,
                "segments align record archives to 16 bytes"
            )
        };
        let writer = RecordWriter { out, len: 0 };
        rkyv::api::low::to_bytes_in_with_alloc::<_, _, Failure>(self, writer, scratch)
            .ok()
            .map(|written| written.len)
    }

    #[inline]
    unsafe fn decode(bytes: &[u8]) -> Self {
        // SAFETY: the caller guarantees these are the aligned bytes `encode` wrote for `T`, so
        // the archived root of a valid `T::Archived` sits at the end of the slice.
        let archived = unsafe { rkyv::access_unchecked::<T::Archived>(bytes) };
        rkyv::api::low::deserialize::<T, Failure>(archived).expect("archived record deserializes")
    }

    fn check(bytes: &[u8]) -> Result<(), String> {
        check_archive::<T>(bytes, MAX_RECORD_DEPTH)
    }
}

/// How deeply a record from another process may nest (boxes, vectors, strings inside one
/// another): a recursive type nested deeper would take the shard's stack to check and read.
const MAX_RECORD_DEPTH: usize = 64;

/// Checks that `bytes` hold a valid archive of `T` nested at most `depth` deep.
fn check_archive<T>(bytes: &[u8], depth: usize) -> Result<(), String>
where
    T: Archive,
    T::Archived: for<'a> CheckBytes<LowValidator<'a, rancor::Error>>,
{
    let limit = ArchiveValidator::with_max_depth(bytes, std::num::NonZeroUsize::new(depth));
    let mut validator = Validator::new(limit, ());
    rkyv::api::access_with_context::<T::Archived, _, rancor::Error>(bytes, &mut validator)
        .map(|_| ())
        .map_err(|error| error.to_string())
}

/// A key of a keyed stream: hashed to its key group (with the stable hash, see
/// `weir_state::key_group`) and, on the RocksDB state backend, stored as rkyv bytes — so any
/// type deriving rkyv's `Archive`, `Serialize` and `Deserialize` (with the default bytecheck)
/// plus `Hash + Eq + Clone + Debug` is one: integers, `String`, tuples of them.
pub trait Key: Hash + Eq + Clone + Debug + Send + weir_state::StateCodec + 'static {}

impl<T: Hash + Eq + Clone + Debug + Send + weir_state::StateCodec + 'static> Key for T {}

/// The timestamp of a record that has none (no `WatermarkStrategy` assigned one). User APIs
/// show it as `None`.
pub const NO_TIMESTAMP: i64 = i64::MIN;

/// Flink's latency marker: a source subtask stamps it with the wall clock every
/// `metrics.latency.interval` and sends it down the job beside its records; it passes every
/// operator at once (it waits in no window) and each sink takes its age into its latency
/// histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyMarker {
    /// When the source marked it, ms since the epoch.
    pub marked_ms: i64,
    /// The source operator's stream node id.
    pub source: u32,
    /// The source subtask.
    pub subtask: u32,
}

/// Event time has progressed to `0` (milliseconds since the epoch): no record with a smaller
/// timestamp is expected any more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Watermark(pub i64);

impl Watermark {
    /// The watermark sent when an input ends: all of event time has passed.
    pub const MAX: Watermark = Watermark(i64::MAX);
    /// The watermark before any has been received.
    pub const MIN: Watermark = Watermark(i64::MIN);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip<T: Record + PartialEq + Debug>(value: &T) {
        #[repr(align(16))]
        struct Aligned([u8; 4096]);
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
        fn records_round_trip(n in any::<u64>(), s in ".{0,200}", v in proptest::collection::vec(any::<i32>(), 0..100)) {
            round_trip(&n);
            round_trip(&s);
            round_trip(&(s.clone(), n));
            round_trip(&v);
        }
    }

    #[test]
    fn a_checked_record_may_nest_only_so_deep() {
        #[repr(align(16))]
        struct Aligned([u8; 4096]);
        let mut buf = Aligned([0; 4096]);
        let mut arena = Arena::new();
        let nested = vec![vec![vec![7u8; 3]; 2]; 2];
        let len = nested
            .encode(&mut buf.0, &mut Scratch::new(&mut arena))
            .expect("fits");
        let bytes = &buf.0[..len];
        assert_eq!(<Vec<Vec<Vec<u8>>>>::check(bytes), Ok(()));
        // Three vectors inside one another take five levels as rkyv's validator counts them:
        // refused below that, passed from it on.
        let passes = |depth| check_archive::<Vec<Vec<Vec<u8>>>>(bytes, depth).is_ok();
        let least = (1..MAX_RECORD_DEPTH).find(|&depth| passes(depth));
        assert_eq!(least, Some(5), "the least depth that passes");
        assert!(passes(MAX_RECORD_DEPTH));
    }

    #[test]
    fn too_small_buffer_is_refused() {
        let mut arena = Arena::new();
        let mut small = [0u8; 8];
        assert_eq!(
            "a longer string than eight bytes"
                .to_string()
                .encode(&mut small, &mut Scratch::new(&mut arena)),
            None
        );
    }
}
