//! q3 and q4: the queries that join auctions with persons or bids.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{EventClock, FastMap};
use crate::nexmark::model::{CategoryAverage, Event, LocalItemSuggestion};

/// A q3 seller: what the output needs of a person.
struct Seller {
    name: String,
    city: String,
    state: String,
}

/// q3: a regular (unbounded) inner join of category-10 auctions with the persons from OR, ID
/// or CA who sell them. Both sides are kept forever, so every pair is output once, whichever
/// arrives first. Person ids are assumed unique (as generated): a later person with the same id
/// replaces the earlier one.
pub fn q3(events: impl IntoIterator<Item = Event>, mut emit: impl FnMut(LocalItemSuggestion)) {
    let mut sellers: FastMap<u64, Seller> = FastMap::default();
    let mut auctions: FastMap<u64, Vec<u64>> = FastMap::default();
    for event in events {
        match event {
            Event::Person(person) if LocalItemSuggestion::selects_state(&person.state) => {
                let seller = Seller {
                    name: person.name,
                    city: person.city,
                    state: person.state,
                };
                for &auction_id in auctions.get(&person.id).into_iter().flatten() {
                    emit(suggestion(&seller, auction_id));
                }
                sellers.insert(person.id, seller);
            }
            Event::Auction(auction) if auction.category == LocalItemSuggestion::CATEGORY => {
                if let Some(seller) = sellers.get(&auction.seller) {
                    emit(suggestion(seller, auction.id));
                }
                auctions.entry(auction.seller).or_default().push(auction.id);
            }
            _ => {}
        }
    }
}

fn suggestion(seller: &Seller, auction_id: u64) -> LocalItemSuggestion {
    LocalItemSuggestion {
        name: seller.name.clone(),
        city: seller.city.clone(),
        state: seller.state.clone(),
        auction_id,
    }
}

/// A q4 auction still accepting bids.
struct OpenAuction {
    date_time: i64,
    expires: i64,
    category: u64,
    /// The highest bid in `[date_time, expires]` so far.
    max_price: Option<u64>,
}

impl OpenAuction {
    #[inline]
    fn offer(&mut self, date_time: i64, price: u64) {
        if (self.date_time..=self.expires).contains(&date_time) {
            self.max_price = Some(self.max_price.map_or(price, |max| max.max(price)));
        }
    }
}

/// Running q4 state per category: sum and count of winning bids.
fn close(
    auction: OpenAuction,
    categories: &mut FastMap<u64, CategoryAverage>,
    emit: &mut impl FnMut(CategoryAverage),
) {
    if let Some(max) = auction.max_price {
        let average = categories
            .entry(auction.category)
            .or_insert(CategoryAverage {
                category: auction.category,
                sum: 0,
                count: 0,
            });
        average.sum += max;
        average.count += 1;
        emit(*average);
    }
}

/// q4: per auction, the highest bid with `auction.date_time <= bid.date_time <=
/// auction.expires` (Flink's `BETWEEN`); per category, the sum and count of those winning bids.
/// An auction closes once the watermark passes `expires` (no bid in its range can come any
/// more), and then, if it had a bid in range, `emit` gets its category's new sum and count.
///
/// Bids may come before their auction (the generator draws auction ids a little ahead): such
/// bids wait, and are dropped once the watermark passes them (no auction that starts at or
/// before them can come any more).
pub fn q4(events: impl IntoIterator<Item = Event>, mut emit: impl FnMut(CategoryAverage)) {
    let mut clock = EventClock::new();
    let mut open: FastMap<u64, OpenAuction> = FastMap::default();
    let mut closing: BinaryHeap<Reverse<(i64, u64)>> = BinaryHeap::new();
    let mut early: FastMap<u64, Vec<(i64, u64)>> = FastMap::default();
    let mut early_purged_at = i64::MIN;
    let mut categories: FastMap<u64, CategoryAverage> = FastMap::default();
    for event in events {
        let date_time = event.date_time();
        match event {
            Event::Auction(auction) => {
                let mut state = OpenAuction {
                    date_time: auction.date_time,
                    expires: auction.expires,
                    category: auction.category,
                    max_price: None,
                };
                for (date_time, price) in early.remove(&auction.id).into_iter().flatten() {
                    state.offer(date_time, price);
                }
                closing.push(Reverse((auction.expires, auction.id)));
                open.insert(auction.id, state);
            }
            Event::Bid(bid) => match open.get_mut(&bid.auction) {
                Some(auction) => auction.offer(bid.date_time, bid.price),
                None => early
                    .entry(bid.auction)
                    .or_default()
                    .push((bid.date_time, bid.price)),
            },
            Event::Person(_) => {}
        }
        if clock.observe(date_time) {
            let watermark = clock.watermark();
            while let Some(&Reverse((expires, id))) = closing.peek() {
                if expires > watermark {
                    break;
                }
                closing.pop();
                if let Some(auction) = open.remove(&id) {
                    close(auction, &mut categories, &mut emit);
                }
            }
            if watermark >= early_purged_at.saturating_add(1_000) {
                early.retain(|_, bids| {
                    bids.retain(|(date_time, _)| *date_time > watermark);
                    !bids.is_empty()
                });
                early_purged_at = watermark;
            }
        }
    }
    while let Some(Reverse((_, id))) = closing.pop() {
        if let Some(auction) = open.remove(&id) {
            close(auction, &mut categories, &mut emit);
        }
    }
}
