//! Hand-written single-threaded baselines of the Nexmark queries: what plain Rust does on one
//! core — Weir's COST reference for each query.
//!
//! Each query has a core, `qN(events, emit)`, that reads any iterator of [`Event`]s (so tests can
//! feed hand-made ones) and calls `emit` with each output record, and a runner, `run_qN(generator,
//! events)`, that feeds it events `0..events` of a [`NexmarkGenerator`] and returns the count and
//! [`Checksum`] of the outputs. Maps use the engine's fast [`StableHasher`], not std's SipHash.
//!
//! Event time works as in an engine with a 4 s bounded-out-of-orderness watermark: the
//! watermark is the largest event time seen so far minus 4 s minus 1 ms (Weir's and Flink's
//! `for_bounded_out_of_orderness`), a window `[start, end)` fires once the watermark reaches
//! `end - 1`, and its state is dropped then, so memory stays bounded; at the end of the input the
//! watermark jumps to the end of time and everything left fires. The generator keeps its
//! out-of-orderness below that bound, so no event is ever late and the results are exactly the
//! queries' definitions (see [`super::model`]), whatever the arrival order within the bound.

mod join;
mod session;
mod window;

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use weir_state::StableHasher;

pub use join::{q3, q4};
pub use session::{q11, q12};
pub use window::{q5, q7, q8};

use super::checksum::{BaselineResult, Checksum};
use super::generator::{NexmarkGenerator, WATERMARK_DELAY_MS};
use super::model::{AuctionPrice, Bid, CategoryAverage, CurrencyConversion, Event};

/// The baselines' maps: the engine's fast, unseeded hasher.
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<StableHasher>>;

/// Tracks event time: the largest timestamp seen and the watermark it implies.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EventClock {
    max_timestamp: i64,
}

impl EventClock {
    pub(crate) fn new() -> EventClock {
        EventClock {
            max_timestamp: i64::MIN,
        }
    }

    /// Notes an event's time; true if the watermark moved.
    #[inline]
    pub(crate) fn observe(&mut self, timestamp: i64) -> bool {
        if timestamp > self.max_timestamp {
            self.max_timestamp = timestamp;
            true
        } else {
            false
        }
    }

    /// The watermark: no event at or before it is expected any more.
    #[inline]
    pub(crate) fn watermark(&self) -> i64 {
        self.max_timestamp.saturating_sub(WATERMARK_DELAY_MS + 1)
    }
}

/// The start of the `size`-aligned window (or pane) holding `timestamp`.
#[inline]
pub(crate) fn window_start(timestamp: i64, size: i64) -> i64 {
    timestamp - timestamp.rem_euclid(size)
}

/// q0: every bid, unchanged.
#[inline]
pub fn q0(events: impl IntoIterator<Item = Event>, mut emit: impl FnMut(Bid)) {
    for event in events {
        if let Event::Bid(bid) = event {
            emit(bid);
        }
    }
}

/// q1: every bid with its price × 0.908 (in thousandths).
#[inline]
pub fn q1(events: impl IntoIterator<Item = Event>, mut emit: impl FnMut(CurrencyConversion)) {
    for event in events {
        if let Event::Bid(bid) = event {
            emit(CurrencyConversion::of(bid));
        }
    }
}

/// q2: auction and price of the bids on auctions whose id is a multiple of 123.
#[inline]
pub fn q2(events: impl IntoIterator<Item = Event>, mut emit: impl FnMut(AuctionPrice)) {
    for event in events {
        if let Event::Bid(bid) = event {
            if AuctionPrice::selects(bid.auction) {
                emit(AuctionPrice {
                    auction: bid.auction,
                    price: bid.price,
                });
            }
        }
    }
}

macro_rules! runner {
    ($(#[$doc:meta])* $name:ident, $query:ident) => {
        $(#[$doc])*
        pub fn $name(generator: &NexmarkGenerator, events: u64) -> BaselineResult {
            let mut sum = Checksum::default();
            $query(generator.events(0..events), |record| sum.add(&record));
            sum.result()
        }
    };
}

runner!(
    /// q0 over events `0..events`: count and checksum of the bids.
    run_q0, q0
);
runner!(
    /// q1 over events `0..events`.
    run_q1, q1
);
runner!(
    /// q2 over events `0..events`.
    run_q2, q2
);
runner!(
    /// q3 over events `0..events`.
    run_q3, q3
);
runner!(
    /// q5 over events `0..events`.
    run_q5, q5
);
runner!(
    /// q7 over events `0..events`.
    run_q7, q7
);
runner!(
    /// q8 over events `0..events`.
    run_q8, q8
);
runner!(
    /// q11 over events `0..events`.
    run_q11, q11
);

/// q4 over events `0..events`: the checksum of the final value per category (the update with
/// the largest count, see [`super::q4_final`]), `results` being the number of categories.
pub fn run_q4(generator: &NexmarkGenerator, events: u64) -> BaselineResult {
    let mut latest: FastMap<u64, CategoryAverage> = FastMap::default();
    q4(generator.events(0..events), |update| {
        let slot = latest.entry(update.category).or_insert(update);
        if update.count > slot.count {
            *slot = update;
        }
    });
    let mut sum = Checksum::default();
    for value in latest.values() {
        sum.add(value);
    }
    sum.result()
}

/// q12's invariant over events `0..events`: the checksum of the bids per bidder
/// ([`super::BidderTotal`]), which q12's windows must add up to (see [`super::q12_totals`]).
pub fn run_q12(generator: &NexmarkGenerator, events: u64) -> BaselineResult {
    let mut sum = Checksum::default();
    for total in q12(generator.events(0..events)) {
        sum.add(&total);
    }
    sum.result()
}
