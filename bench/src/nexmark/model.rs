//! Nexmark's records: the three event kinds the generator makes ([`Person`], [`Auction`],
//! [`Bid`], wrapped in [`Event`]) and the output record of every query.
//!
//! Ids, prices, categories and counts are `u64`; times (`date_time`, `expires`, window bounds)
//! are `i64` milliseconds since the epoch. Every type derives rkyv's `Archive`, `Serialize` and
//! `Deserialize`, so it is a `weir_engine::Record` and a `weir_state::StateCodec` (it can flow
//! through a job and be kept in keyed state).
//!
//! | query | output | semantics |
//! |---|---|---|
//! | q0 | [`Bid`] | every bid, unchanged |
//! | q1 | [`CurrencyConversion`] | every bid, `price_milli = price * 908` |
//! | q2 | [`AuctionPrice`] | bids with `auction % 123 == 0` |
//! | q3 | [`LocalItemSuggestion`] | auction ⋈ person (seller = id), category 10, state OR/ID/CA |
//! | q4 | [`CategoryAverage`] | per category, sum and count of the auctions' winning bids |
//! | q5 | [`HotItem`] | HOP 10 s / 2 s, auctions with the most bids of each window |
//! | q7 | [`HighestBid`] | TUMBLE 10 s, the bids with the window's highest price |
//! | q8 | [`NewUser`] | TUMBLE 10 s, persons who opened an auction in the window they joined |
//! | q11 | [`BidderSession`] | SESSION 10 s per bidder, bids per session |
//! | q12 | [`BidderWindowCount`] | processing-time TUMBLE 10 s per bidder, bids per window |
//!
//! All windows are half-open `[start, end)` and aligned to epoch 0.

use rkyv::{Archive, Deserialize, Serialize};

/// A new user of the auction site.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Person {
    /// Person id, sequential from [`super::FIRST_PERSON_ID`].
    pub id: u64,
    /// "First Last".
    pub name: String,
    /// `xxxxxxx@xxxxx.com`.
    pub email_address: String,
    /// `dddd dddd dddd dddd`.
    pub credit_card: String,
    /// A US city.
    pub city: String,
    /// A US state (two letters).
    pub state: String,
    /// Event time, milliseconds since the epoch.
    pub date_time: i64,
    /// Padding to the average person size.
    pub extra: String,
}

/// An item put up for auction.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Auction {
    /// Auction id, sequential from [`super::FIRST_AUCTION_ID`].
    pub id: u64,
    /// Item name (3 to 19 letters).
    pub item_name: String,
    /// Item description (3 to 99 letters).
    pub description: String,
    /// Starting price, in cents.
    pub initial_bid: u64,
    /// Reserve price, in cents (above `initial_bid`).
    pub reserve: u64,
    /// Event time, milliseconds since the epoch.
    pub date_time: i64,
    /// When the auction closes, milliseconds since the epoch (after `date_time`).
    pub expires: i64,
    /// The seller's person id.
    pub seller: u64,
    /// Category, in `10..15`.
    pub category: u64,
    /// Padding to the average auction size.
    pub extra: String,
}

/// A bid on an auction.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Bid {
    /// The auction's id.
    pub auction: u64,
    /// The bidder's person id.
    pub bidder: u64,
    /// Price, in cents.
    pub price: u64,
    /// Where the bid came from: `Google`, `Facebook`, `Baidu`, `Apple` or `channel-N`.
    pub channel: String,
    /// The channel's url.
    pub url: String,
    /// Event time, milliseconds since the epoch.
    pub date_time: i64,
    /// Padding to the average bid size.
    pub extra: String,
}

/// One Nexmark event.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// A new person.
    Person(Person),
    /// A new auction.
    Auction(Auction),
    /// A bid.
    Bid(Bid),
}

impl Event {
    /// The event's time, milliseconds since the epoch (the timestamp every query uses).
    #[inline]
    pub fn date_time(&self) -> i64 {
        match self {
            Event::Person(p) => p.date_time,
            Event::Auction(a) => a.date_time,
            Event::Bid(b) => b.date_time,
        }
    }

    /// The event's nominal size in bytes, as Nexmark counts it: 8 per number plus the length
    /// of every string. The generator pads `extra` so that these average about 200 (person),
    /// 500 (auction) and 100 (bid).
    pub fn size_bytes(&self) -> usize {
        match self {
            Event::Person(p) => {
                2 * 8
                    + p.name.len()
                    + p.email_address.len()
                    + p.credit_card.len()
                    + p.city.len()
                    + p.state.len()
                    + p.extra.len()
            }
            Event::Auction(a) => 7 * 8 + a.item_name.len() + a.description.len() + a.extra.len(),
            Event::Bid(b) => 4 * 8 + b.channel.len() + b.url.len() + b.extra.len(),
        }
    }

    /// The bid, if this is one.
    #[inline]
    pub fn as_bid(&self) -> Option<&Bid> {
        match self {
            Event::Bid(b) => Some(b),
            _ => None,
        }
    }
}

/// q1's output: a bid with its price converted to another currency (× 0.908), kept exact as
/// thousandths of a cent.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct CurrencyConversion {
    /// The auction's id.
    pub auction: u64,
    /// The bidder's id.
    pub bidder: u64,
    /// `price * 908`: 0.908 × price, in thousandths of a cent.
    pub price_milli: u64,
    /// The bid's event time.
    pub date_time: i64,
    /// The bid's `extra`.
    pub extra: String,
}

impl CurrencyConversion {
    /// q1 applied to one bid.
    #[inline]
    pub fn of(bid: Bid) -> CurrencyConversion {
        CurrencyConversion {
            auction: bid.auction,
            bidder: bid.bidder,
            price_milli: bid.price * 908,
            date_time: bid.date_time,
            extra: bid.extra,
        }
    }
}

/// q2's output: a bid on one of the selected auctions (`auction % 123 == 0`).
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AuctionPrice {
    /// The auction's id.
    pub auction: u64,
    /// The bid's price.
    pub price: u64,
}

impl AuctionPrice {
    /// q2's selection: whether a bid on `auction` is kept.
    #[inline]
    pub fn selects(auction: u64) -> bool {
        auction.is_multiple_of(123)
    }
}

/// q3's output: an auction of category 10 whose seller lives in Oregon, Idaho or California.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct LocalItemSuggestion {
    /// The seller's name.
    pub name: String,
    /// The seller's city.
    pub city: String,
    /// The seller's state.
    pub state: String,
    /// The auction's id.
    pub auction_id: u64,
}

impl LocalItemSuggestion {
    /// The category q3 selects.
    pub const CATEGORY: u64 = 10;

    /// Whether q3 keeps a person from `state`.
    #[inline]
    pub fn selects_state(state: &str) -> bool {
        matches!(state, "OR" | "ID" | "CA")
    }
}

/// q4's output: the average winning bid of a category, as `sum / count` over its auctions
/// that had at least one bid in `[auction.date_time, auction.expires]` (both ends inclusive);
/// an auction's winning bid is its highest such bid. The engine emits an update every time an
/// auction closes; [`super::q4_final`] keeps the final one per category.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CategoryAverage {
    /// The category.
    pub category: u64,
    /// Sum of the winning bids of its closed auctions.
    pub sum: u64,
    /// Number of those auctions.
    pub count: u64,
}

impl CategoryAverage {
    /// The average winning bid (integer division), `0` for no auctions.
    pub fn average(&self) -> u64 {
        self.sum.checked_div(self.count).unwrap_or(0)
    }
}

/// q5's output: an auction with the most bids (ties all reported) in the 10 s window ending
/// at `window_end` (windows every 2 s).
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HotItem {
    /// End of the window (exclusive); the window is `[window_end - 10 s, window_end)`.
    pub window_end: i64,
    /// The auction's id.
    pub auction: u64,
    /// Its bids in the window (the window's maximum).
    pub count: u64,
}

/// q7's output: a bid with the highest price of its 10 s tumbling window (ties all reported).
///
/// Flink's q7 joins bids `BETWEEN window_end - 10 s AND window_end`, inclusive at both ends, so
/// a bid at exactly `window_end` also matches the previous window's maximum; Weir's q7 uses the
/// half-open window `[start, end)` on both sides, so each bid belongs to exactly one window.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct HighestBid {
    /// The auction's id.
    pub auction: u64,
    /// The price (the window's maximum).
    pub price: u64,
    /// The bidder's id.
    pub bidder: u64,
    /// The bid's event time.
    pub date_time: i64,
    /// The bid's `extra`.
    pub extra: String,
}

impl HighestBid {
    /// The q7 record of a bid.
    pub fn of(bid: &Bid) -> HighestBid {
        HighestBid {
            auction: bid.auction,
            price: bid.price,
            bidder: bid.bidder,
            date_time: bid.date_time,
            extra: bid.extra.clone(),
        }
    }
}

/// q8's output: a person who opened an auction in the 10 s tumbling window in which they
/// joined (one record per person and window, however many auctions).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct NewUser {
    /// The person's id.
    pub person_id: u64,
    /// The person's name.
    pub name: String,
    /// Start of the window.
    pub window_start: i64,
}

/// q11's output: a session of one bidder — bids separated by at most 10 s (a bid exactly 10 s
/// after the previous one continues the session, as in Flink) — closed 10 s after its last bid.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BidderSession {
    /// The bidder's id.
    pub bidder: u64,
    /// Bids in the session.
    pub count: u64,
    /// Time of the first bid.
    pub start: i64,
    /// Time of the last bid + 10 s (exclusive end).
    pub end: i64,
}

/// q12's output: the bids of one bidder in a 10 s processing-time window. Nondeterministic;
/// only the total per bidder is checked (see [`super::q12_totals`]).
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BidderWindowCount {
    /// The bidder's id.
    pub bidder: u64,
    /// Bids in the window.
    pub count: u64,
    /// End of the processing-time window, milliseconds since the epoch.
    pub window_end: i64,
}

/// A bidder's total number of bids: what q12's outputs must add up to per bidder.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BidderTotal {
    /// The bidder's id.
    pub bidder: u64,
    /// Bids by the bidder.
    pub count: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_engine::Record;
    use weir_state::StateCodec;

    fn round_trip<T: Record + StateCodec + PartialEq + std::fmt::Debug>(value: T) {
        #[repr(align(16))]
        struct Aligned([u8; 1024]);
        let mut buf = Aligned([0; 1024]);
        let mut arena = rkyv::ser::allocator::Arena::new();
        let mut scratch = weir_engine::record::Scratch::new(&mut arena);
        let len = Record::encode(&value, &mut buf.0, &mut scratch).expect("fits");
        // SAFETY: decoding exactly what `encode` wrote, from a 16-byte aligned buffer.
        let back: T = unsafe { Record::decode(&buf.0[..len]) };
        assert_eq!(back, value);
        let bytes = StateCodec::encode(&value).unwrap();
        assert_eq!(<T as StateCodec>::decode(&bytes).unwrap(), value);
    }

    #[test]
    fn records_are_engine_records_and_state_values() {
        let bid = Bid {
            auction: 1000,
            bidder: 1001,
            price: 12_345,
            channel: "Google".into(),
            url: "https://www.nexmark.com/a/b/c/item.htm?query=1".into(),
            date_time: 1_700_000_000_000,
            extra: "xyz".into(),
        };
        round_trip(Event::Bid(bid.clone()));
        round_trip(bid.clone());
        round_trip(Event::Person(Person {
            id: 1000,
            name: "Peter Smith".into(),
            email_address: "abc@def.com".into(),
            credit_card: "1234 5678 9012 3456".into(),
            city: "Boise".into(),
            state: "ID".into(),
            date_time: 5,
            extra: String::new(),
        }));
        round_trip(CurrencyConversion::of(bid.clone()));
        round_trip(HighestBid::of(&bid));
        round_trip(CategoryAverage {
            category: 10,
            sum: 7,
            count: 2,
        });
        round_trip(NewUser {
            person_id: 1,
            name: "n".into(),
            window_start: 10_000,
        });
    }

    #[test]
    fn q1_converts_exactly() {
        let bid = Bid {
            auction: 1,
            bidder: 2,
            price: 1_000,
            channel: String::new(),
            url: String::new(),
            date_time: 0,
            extra: String::new(),
        };
        assert_eq!(CurrencyConversion::of(bid).price_milli, 908_000);
        assert!(AuctionPrice::selects(1107) && !AuctionPrice::selects(1108));
    }
}
