//! Order-independent checksums of query outputs, shared by the baselines and the engine jobs so
//! that a parallel engine run can be compared with a single-threaded loop.
//!
//! A record's [`StableHash`] feeds its fields, in declared order, to a [`FieldHasher`]
//! ("Nexmark checksum v1", fixed forever, independent of std's randomly keyed SipHash): the
//! state starts at 0, a number `w` is folded as `h = (h.rotl(5) ^ w) * 0x517cc1b727220a95`
//! (signed numbers as their two's-complement `u64`), a string folds its byte length and then its
//! bytes as little-endian 8-byte words (the last one zero-padded), and the result goes through
//! MurmurHash3's 64-bit finalizer. A [`Checksum`] is the number of records and the wrapping sum
//! of their hashes.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use serde::Serialize;
use weir_state::StableHasher;

use super::model::{
    AuctionPrice, Bid, BidderSession, BidderTotal, BidderWindowCount, CategoryAverage,
    CurrencyConversion, HighestBid, HotItem, LocalItemSuggestion, NewUser,
};

const FOLD_MULTIPLIER: u64 = 0x517c_c1b7_2722_0a95;

/// Folds a record's fields into a 64-bit hash (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct FieldHasher {
    state: u64,
}

impl FieldHasher {
    /// Folds one number.
    #[inline]
    pub fn u64(&mut self, word: u64) -> &mut Self {
        self.state = (self.state.rotate_left(5) ^ word).wrapping_mul(FOLD_MULTIPLIER);
        self
    }

    /// Folds one signed number (as its two's complement).
    #[inline]
    pub fn i64(&mut self, word: i64) -> &mut Self {
        self.u64(word as u64)
    }

    /// Folds a string: its length, then its bytes 8 at a time.
    #[inline]
    pub fn str(&mut self, text: &str) -> &mut Self {
        let bytes = text.as_bytes();
        self.u64(bytes.len() as u64);
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.u64(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.u64(u64::from_le_bytes(last));
        }
        self
    }

    /// The hash.
    #[inline]
    pub fn finish(&self) -> u64 {
        let mut k = self.state;
        k ^= k >> 33;
        k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
        k ^= k >> 33;
        k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        k ^ (k >> 33)
    }
}

/// A record with a fixed 64-bit hash over its fields (every Nexmark output type).
pub trait StableHash {
    /// Feeds the fields, in declared order.
    fn hash_fields(&self, hasher: &mut FieldHasher);

    /// The record's hash.
    #[inline]
    fn stable_hash(&self) -> u64 {
        let mut hasher = FieldHasher::default();
        self.hash_fields(&mut hasher);
        hasher.finish()
    }
}

macro_rules! stable_hash {
    ($type:ty { $($field:ident: $kind:ident),* $(,)? }) => {
        impl StableHash for $type {
            #[inline]
            fn hash_fields(&self, hasher: &mut FieldHasher) {
                $( hasher.$kind(stable_hash!(@arg $kind, self.$field)); )*
            }
        }
    };
    (@arg str, $value:expr) => { &$value };
    (@arg $kind:ident, $value:expr) => { $value };
}

stable_hash!(Bid {
    auction: u64,
    bidder: u64,
    price: u64,
    channel: str,
    url: str,
    date_time: i64,
    extra: str
});
stable_hash!(CurrencyConversion {
    auction: u64,
    bidder: u64,
    price_milli: u64,
    date_time: i64,
    extra: str
});
stable_hash!(AuctionPrice {
    auction: u64,
    price: u64
});
stable_hash!(LocalItemSuggestion {
    name: str,
    city: str,
    state: str,
    auction_id: u64
});
stable_hash!(CategoryAverage {
    category: u64,
    sum: u64,
    count: u64
});
stable_hash!(HotItem {
    window_end: i64,
    auction: u64,
    count: u64
});
stable_hash!(HighestBid {
    auction: u64,
    price: u64,
    bidder: u64,
    date_time: i64,
    extra: str
});
stable_hash!(NewUser {
    person_id: u64,
    name: str,
    window_start: i64
});
stable_hash!(BidderSession {
    bidder: u64,
    count: u64,
    start: i64,
    end: i64
});
stable_hash!(BidderWindowCount {
    bidder: u64,
    count: u64,
    window_end: i64
});
stable_hash!(BidderTotal {
    bidder: u64,
    count: u64
});

/// An order-independent digest of a query's output: the number of records and the wrapping sum
/// of their [`StableHash`]es. Digests of disjoint parts (e.g. one per subtask) [`merge`] into the
/// digest of the whole.
///
/// [`merge`]: Checksum::merge
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Checksum {
    /// Records added.
    pub count: u64,
    /// Wrapping sum of their hashes.
    pub sum: u64,
}

impl Checksum {
    /// Adds one record.
    #[inline]
    pub fn add<T: StableHash + ?Sized>(&mut self, record: &T) {
        self.count += 1;
        self.sum = self.sum.wrapping_add(record.stable_hash());
    }

    /// Adds another digest.
    pub fn merge(&mut self, other: Checksum) {
        self.count += other.count;
        self.sum = self.sum.wrapping_add(other.sum);
    }

    /// The digest as a [`BaselineResult`].
    pub fn result(&self) -> BaselineResult {
        BaselineResult {
            results: self.count,
            checksum: self.sum,
        }
    }
}

/// What a query run produced: the number of output records and their checksum (see
/// [`Checksum`]). For q4 the records are the final value per category ([`q4_final`]); for q12,
/// the total per bidder ([`q12_totals`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct BaselineResult {
    /// Output records.
    pub results: u64,
    /// Wrapping sum of their stable hashes.
    pub checksum: u64,
}

/// The checksum of `records`.
pub fn checksum_of<'a, T: StableHash + 'a>(records: impl IntoIterator<Item = &'a T>) -> Checksum {
    let mut sum = Checksum::default();
    for record in records {
        sum.add(record);
    }
    sum
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<StableHasher>>;

/// q4's final result from its stream of updates: per category, the update with the largest
/// count (the one made when its last auction closed), sorted by category.
pub fn q4_final(updates: impl IntoIterator<Item = CategoryAverage>) -> Vec<CategoryAverage> {
    let mut latest: FastMap<u64, CategoryAverage> = FastMap::default();
    for update in updates {
        let slot = latest.entry(update.category).or_insert(update);
        if update.count > slot.count {
            *slot = update;
        }
    }
    let mut finals: Vec<CategoryAverage> = latest.into_values().collect();
    finals.sort_unstable_by_key(|c| c.category);
    finals
}

/// q12's invariant: the bids per bidder its windows add up to, sorted by bidder.
pub fn q12_totals<'a>(
    outputs: impl IntoIterator<Item = &'a BidderWindowCount>,
) -> Vec<BidderTotal> {
    let mut totals: FastMap<u64, u64> = FastMap::default();
    for output in outputs {
        *totals.entry(output.bidder).or_default() += output.count;
    }
    sorted_totals(totals)
}

pub(crate) fn sorted_totals(totals: FastMap<u64, u64>) -> Vec<BidderTotal> {
    let mut totals: Vec<BidderTotal> = totals
        .into_iter()
        .map(|(bidder, count)| BidderTotal { bidder, count })
        .collect();
    totals.sort_unstable_by_key(|t| t.bidder);
    totals
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_fixed_and_field_sensitive() {
        let a = AuctionPrice {
            auction: 1,
            price: 2,
        };
        let b = AuctionPrice {
            auction: 2,
            price: 1,
        };
        assert_ne!(a.stable_hash(), b.stable_hash());
        // Nexmark checksum v1 must never change.
        let mut h = FieldHasher::default();
        h.u64(1).u64(2);
        assert_eq!(a.stable_hash(), h.finish());
        let user = |name: &str| NewUser {
            person_id: 7,
            name: name.into(),
            window_start: 0,
        };
        assert_ne!(
            user("abcdefgh").stable_hash(),
            user("abcdefgh\0").stable_hash()
        );
        assert_ne!(user("").stable_hash(), user("\0").stable_hash());
    }

    #[test]
    fn checksum_ignores_order_and_merges() {
        let records: Vec<HotItem> = (0..10)
            .map(|i| HotItem {
                window_end: i,
                auction: i as u64 * 3,
                count: 1,
            })
            .collect();
        let forward = checksum_of(&records);
        let backward = checksum_of(records.iter().rev());
        assert_eq!(forward, backward);
        let mut halves = checksum_of(&records[..4]);
        halves.merge(checksum_of(&records[4..]));
        assert_eq!(halves, forward);
        assert_eq!(forward.result().results, 10);
    }

    #[test]
    fn q4_final_keeps_the_latest_update() {
        let update = |category, sum, count| CategoryAverage {
            category,
            sum,
            count,
        };
        let finals = q4_final([
            update(11, 5, 1),
            update(10, 3, 1),
            update(11, 9, 2),
            update(10, 10, 2),
            update(11, 12, 3),
        ]);
        assert_eq!(finals, vec![update(10, 10, 2), update(11, 12, 3)]);
    }
}
