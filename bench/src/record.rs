//! The benchmark record (64 bytes) and the map and filter functions that both the engine jobs
//! and the hand-written baselines apply to it, so that both sides do exactly the same work.

use rkyv::{Archive, Deserialize, Serialize};

/// Distinct keys the generator produces (a power of two).
pub const KEY_SPACE: u64 = 1 << 20;

/// A 64-byte record: an id, a key, a value, an event timestamp and an opaque payload.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct BenchRecord {
    /// Index of the record in the generated sequence.
    pub id: u64,
    /// The key the exchange benchmark partitions by, in `0..KEY_SPACE`.
    pub key: u64,
    /// The value the map function transforms and the filter tests.
    pub value: i64,
    /// Event time, milliseconds since the epoch.
    pub timestamp: i64,
    /// Opaque bytes that make the record 64 bytes long.
    pub payload: [u8; 32],
}

const _: () = assert!(std::mem::size_of::<BenchRecord>() == 64);

/// Event time of record 0 (2023-11-14T22:13:20Z), in milliseconds.
const EPOCH_MS: i64 = 1_700_000_000_000;

impl BenchRecord {
    /// Record `i`: a few multiplies and shifts of `i`, cheap but not something the compiler can
    /// fold away, with keys and values spread by a Fibonacci hash of `i`.
    #[inline]
    pub fn generate(i: u64) -> BenchRecord {
        let mixed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mixed = mixed ^ (mixed >> 29);
        BenchRecord {
            id: i,
            key: mixed & (KEY_SPACE - 1),
            value: (mixed >> 20) as i64,
            timestamp: EPOCH_MS + i as i64,
            payload: [i as u8; 32],
        }
    }

    /// The benchmark's map function: a little arithmetic on `value`.
    #[inline]
    pub fn mapped(mut self) -> BenchRecord {
        self.value = self.value.wrapping_mul(3).wrapping_add(7);
        self
    }

    /// The benchmark's filter predicate: keeps about 90% of mapped records, in an order the
    /// branch predictor cannot learn.
    #[inline]
    pub fn survives(&self) -> bool {
        self.value % 10 != 0
    }
}

/// A 1 KiB record: a [`BenchRecord`] and opaque bytes, for the benchmarks that compare how
/// record width changes a cost.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct WideRecord {
    /// The fields the map, filter and key read.
    pub record: BenchRecord,
    /// Opaque bytes that make the record 1 KiB long.
    pub padding: [u8; 960],
}

const _: () = assert!(std::mem::size_of::<WideRecord>() == 1024);

/// What the exchange benchmarks generate, map, filter and key, at either width.
pub trait ExchangeRecord: weir_engine::Record + Clone + Send + Sync + 'static {
    /// Record `i` (see [`BenchRecord::generate`]).
    fn generate(i: u64) -> Self;
    /// The map function.
    fn mapped(self) -> Self;
    /// The filter predicate.
    fn survives(&self) -> bool;
    /// The key the exchange partitions by.
    fn key(&self) -> u64;
}

impl ExchangeRecord for BenchRecord {
    fn generate(i: u64) -> Self {
        BenchRecord::generate(i)
    }
    fn mapped(self) -> Self {
        BenchRecord::mapped(self)
    }
    fn survives(&self) -> bool {
        BenchRecord::survives(self)
    }
    fn key(&self) -> u64 {
        self.key
    }
}

impl ExchangeRecord for WideRecord {
    fn generate(i: u64) -> Self {
        WideRecord {
            record: BenchRecord::generate(i),
            padding: [i as u8; 960],
        }
    }
    fn mapped(mut self) -> Self {
        self.record = self.record.mapped();
        self
    }
    fn survives(&self) -> bool {
        self.record.survives()
    }
    fn key(&self) -> u64 {
        self.record.key
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_engine::Record;

    #[test]
    fn is_64_bytes_and_round_trips_through_the_engine_codec() {
        assert_eq!(std::mem::size_of::<BenchRecord>(), 64);
        #[repr(align(16))]
        struct Aligned([u8; 256]);
        let mut buf = Aligned([0; 256]);
        let mut arena = rkyv::ser::allocator::Arena::new();
        let record = BenchRecord::generate(12_345);
        let mut scratch = weir_engine::record::Scratch::new(&mut arena);
        let len = record.encode(&mut buf.0, &mut scratch).expect("fits");
        // SAFETY: decoding exactly what `encode` wrote, from a 16-byte aligned buffer.
        let back = unsafe { BenchRecord::decode(&buf.0[..len]) };
        assert_eq!(back, record);
    }

    #[test]
    fn filter_keeps_about_ninety_percent() {
        let kept = (0..100_000)
            .filter(|&i| BenchRecord::generate(i).mapped().survives())
            .count();
        assert!((88_000..=92_000).contains(&kept), "kept {kept}");
    }
}
