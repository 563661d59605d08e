//! q5, q7 and q8: the event-time window queries with aligned windows.

use std::collections::{BTreeMap, HashSet};
use std::hash::BuildHasherDefault;

use weir_state::StableHasher;

use super::{window_start, EventClock, FastMap};
use crate::nexmark::model::{Event, HighestBid, HotItem, NewUser};

type FastSet<T> = HashSet<T, BuildHasherDefault<StableHasher>>;

/// q5's window size.
const HOP_SIZE_MS: i64 = 10_000;
/// q5's slide (and pane size).
const HOP_SLIDE_MS: i64 = 2_000;
/// q7's and q8's window size.
const TUMBLE_MS: i64 = 10_000;

/// q5: bids per auction in 10 s windows every 2 s (`[end - 10 s, end)`, ends multiples of 2 s);
/// per window, every auction whose count is the window's largest.
///
/// Counts are kept per 2 s pane; a window sums its five panes when it fires.
pub fn q5(events: impl IntoIterator<Item = Event>, mut emit: impl FnMut(HotItem)) {
    let mut clock = EventClock::new();
    let mut panes: BTreeMap<i64, FastMap<u64, u64>> = BTreeMap::new();
    // Every window ending at or before this has fired.
    let mut fired_until = i64::MIN;
    let mut scratch: FastMap<u64, u64> = FastMap::default();
    let mut fire =
        |panes: &mut BTreeMap<i64, FastMap<u64, u64>>, fired_until: &mut i64, watermark: i64| {
            loop {
                let (Some(&first), Some(&last)) = (panes.keys().next(), panes.keys().next_back())
                else {
                    return;
                };
                let end = (first + HOP_SLIDE_MS).max(fired_until.saturating_add(HOP_SLIDE_MS));
                if end - 1 > watermark || end - HOP_SIZE_MS > last {
                    return;
                }
                scratch.clear();
                for (_, pane) in panes.range(end - HOP_SIZE_MS..end) {
                    for (&auction, &count) in pane {
                        *scratch.entry(auction).or_default() += count;
                    }
                }
                let max = scratch.values().copied().max().unwrap_or(0);
                for (&auction, &count) in &scratch {
                    if count == max {
                        emit(HotItem {
                            window_end: end,
                            auction,
                            count,
                        });
                    }
                }
                *fired_until = end;
                // The next window starts at `end - HOP_SIZE_MS + HOP_SLIDE_MS`.
                while let Some(entry) = panes.first_entry() {
                    if *entry.key() >= end - HOP_SIZE_MS + HOP_SLIDE_MS {
                        break;
                    }
                    entry.remove();
                }
            }
        };
    for event in events {
        let Event::Bid(bid) = event else { continue };
        let pane = window_start(bid.date_time, HOP_SLIDE_MS);
        *panes
            .entry(pane)
            .or_default()
            .entry(bid.auction)
            .or_default() += 1;
        if clock.observe(bid.date_time) {
            fire(&mut panes, &mut fired_until, clock.watermark());
        }
    }
    fire(&mut panes, &mut fired_until, i64::MAX);
}

/// The open q7 windows: start, highest price, and the bids at that price.
type MaxBids = Vec<(i64, u64, Vec<HighestBid>)>;

/// q7: per 10 s tumbling window `[start, start + 10 s)`, every bid whose price is the window's
/// highest (half-open window, see [`HighestBid`]).
pub fn q7(events: impl IntoIterator<Item = Event>, mut emit: impl FnMut(HighestBid)) {
    let mut clock = EventClock::new();
    let mut windows: MaxBids = Vec::new();
    let mut fire = |windows: &mut MaxBids, watermark: i64| {
        windows.retain_mut(|(start, _, bids)| {
            if *start + TUMBLE_MS - 1 > watermark {
                return true;
            }
            for bid in bids.drain(..) {
                emit(bid);
            }
            false
        });
    };
    for event in events {
        let Event::Bid(bid) = event else { continue };
        let start = window_start(bid.date_time, TUMBLE_MS);
        let index = match windows.iter().position(|(s, _, _)| *s == start) {
            Some(index) => index,
            None => {
                windows.push((start, 0, Vec::new()));
                windows.len() - 1
            }
        };
        let (_, max, bids) = &mut windows[index];
        if bids.is_empty() || bid.price >= *max {
            if bid.price > *max {
                bids.clear();
                *max = bid.price;
            }
            bids.push(HighestBid {
                auction: bid.auction,
                price: bid.price,
                bidder: bid.bidder,
                date_time: bid.date_time,
                extra: bid.extra,
            });
        }
        if clock.observe(bid.date_time) {
            fire(&mut windows, clock.watermark());
        }
    }
    windows.sort_unstable_by_key(|(start, _, _)| *start);
    fire(&mut windows, i64::MAX);
}

/// One q8 window: the persons who joined in it and the sellers of its auctions.
#[derive(Default)]
struct NewUserWindow {
    persons: FastSet<(u64, String)>,
    sellers: FastSet<u64>,
}

/// q8: per 10 s tumbling window, the distinct `(id, name)` of the persons who joined in it and
/// are the seller of an auction opened in the same window.
pub fn q8(events: impl IntoIterator<Item = Event>, mut emit: impl FnMut(NewUser)) {
    let mut clock = EventClock::new();
    let mut windows: Vec<(i64, NewUserWindow)> = Vec::new();
    let mut fire = |windows: &mut Vec<(i64, NewUserWindow)>, watermark: i64| {
        windows.retain_mut(|(start, window)| {
            if *start + TUMBLE_MS - 1 > watermark {
                return true;
            }
            for (id, name) in window.persons.drain() {
                if window.sellers.contains(&id) {
                    emit(NewUser {
                        person_id: id,
                        name,
                        window_start: *start,
                    });
                }
            }
            false
        });
    };
    for event in events {
        let date_time = event.date_time();
        let start = window_start(date_time, TUMBLE_MS);
        match event {
            Event::Person(person) => {
                window_at(&mut windows, start)
                    .persons
                    .insert((person.id, person.name));
            }
            Event::Auction(auction) => {
                window_at(&mut windows, start)
                    .sellers
                    .insert(auction.seller);
            }
            Event::Bid(_) => {}
        }
        if clock.observe(date_time) {
            fire(&mut windows, clock.watermark());
        }
    }
    fire(&mut windows, i64::MAX);
}

/// The open q8 window starting at `start`, opened if needed.
fn window_at(windows: &mut Vec<(i64, NewUserWindow)>, start: i64) -> &mut NewUserWindow {
    let index = match windows.iter().position(|(s, _)| *s == start) {
        Some(index) => index,
        None => {
            windows.push((start, NewUserWindow::default()));
            windows.len() - 1
        }
    };
    &mut windows[index].1
}
