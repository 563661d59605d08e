//! q11 (event-time sessions per bidder) and q12's invariant (bids per bidder).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{EventClock, FastMap};
use crate::nexmark::checksum::sorted_totals;
use crate::nexmark::model::{BidderSession, BidderTotal, Event};

/// q11's session gap.
const GAP_MS: i64 = 10_000;

/// One open session: `[start, end)` with `end` = last bid + gap.
#[derive(Clone, Copy, Debug)]
struct Session {
    start: i64,
    end: i64,
    count: u64,
}

/// A bidder's open sessions (usually one) and the time of its pending closing check, which is
/// never after the earliest session end.
struct Bidder {
    sessions: Vec<Session>,
    check_at: i64,
}

/// q11: sessions of bids per bidder with a 10 s gap, Flink's merging session windows: each bid
/// at `t` opens `[t, t + 10 s)`, and windows that overlap or touch merge. A session fires once
/// the watermark reaches `end - 1`.
pub fn q11(events: impl IntoIterator<Item = Event>, mut emit: impl FnMut(BidderSession)) {
    let mut clock = EventClock::new();
    let mut bidders: FastMap<u64, Bidder> = FastMap::default();
    // (check time, bidder); stale entries (not the bidder's `check_at`) are skipped.
    let mut checks: BinaryHeap<Reverse<(i64, u64)>> = BinaryHeap::new();
    let mut fire = |bidders: &mut FastMap<u64, Bidder>,
                    checks: &mut BinaryHeap<Reverse<(i64, u64)>>,
                    watermark: i64| {
        while let Some(&Reverse((check_at, id))) = checks.peek() {
            if check_at - 1 > watermark {
                break;
            }
            checks.pop();
            let Some(bidder) = bidders.get_mut(&id) else {
                continue;
            };
            if bidder.check_at != check_at {
                continue;
            }
            bidder.sessions.retain(|s| {
                if s.end - 1 > watermark {
                    return true;
                }
                emit(BidderSession {
                    bidder: id,
                    count: s.count,
                    start: s.start,
                    end: s.end,
                });
                false
            });
            match bidder.sessions.iter().map(|s| s.end).min() {
                Some(next) => {
                    bidder.check_at = next;
                    checks.push(Reverse((next, id)));
                }
                None => {
                    bidders.remove(&id);
                }
            }
        }
    };
    for event in events {
        let Event::Bid(bid) = event else { continue };
        let mut session = Session {
            start: bid.date_time,
            end: bid.date_time + GAP_MS,
            count: 1,
        };
        let bidder = bidders.entry(bid.bidder).or_insert_with(|| Bidder {
            sessions: Vec::new(),
            check_at: i64::MAX,
        });
        // Merge every session that overlaps or touches the new one.
        bidder.sessions.retain(|s| {
            if s.start <= session.end && s.end >= session.start {
                session.start = session.start.min(s.start);
                session.end = session.end.max(s.end);
                session.count += s.count;
                false
            } else {
                true
            }
        });
        bidder.sessions.push(session);
        if session.end < bidder.check_at {
            bidder.check_at = session.end;
            checks.push(Reverse((session.end, bid.bidder)));
        }
        if clock.observe(bid.date_time) {
            fire(&mut bidders, &mut checks, clock.watermark());
        }
    }
    fire(&mut bidders, &mut checks, i64::MAX);
}

/// q12's invariant: the number of bids per bidder (what its processing-time windows must add
/// up to), sorted by bidder.
pub fn q12(events: impl IntoIterator<Item = Event>) -> Vec<BidderTotal> {
    let mut totals: FastMap<u64, u64> = FastMap::default();
    for event in events {
        if let Event::Bid(bid) = event {
            *totals.entry(bid.bidder).or_default() += 1;
        }
    }
    sorted_totals(totals)
}
