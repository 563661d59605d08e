//! The Nexmark baselines: each query's semantics on small hand-made inputs, order independence
//! within the watermark bound, and non-trivial results on generated events.

use weir_bench::nexmark::baseline::{self, q11, q3, q4, q5, q7, q8};
use weir_bench::nexmark::harness::Query;
use weir_bench::nexmark::{
    checksum_of, q4_final, Auction, Bid, BidderSession, CategoryAverage, Event, HighestBid,
    HotItem, LocalItemSuggestion, NewUser, NexmarkConfig, NexmarkGenerator, Person,
};

fn person(id: u64, state: &str, t: i64) -> Event {
    Event::Person(Person {
        id,
        name: format!("person-{id}"),
        email_address: String::new(),
        credit_card: String::new(),
        city: "Bend".into(),
        state: state.into(),
        date_time: t,
        extra: String::new(),
    })
}

fn auction(id: u64, seller: u64, category: u64, t: i64, expires: i64) -> Event {
    Event::Auction(Auction {
        id,
        item_name: String::new(),
        description: String::new(),
        initial_bid: 1,
        reserve: 2,
        date_time: t,
        expires,
        seller,
        category,
        extra: String::new(),
    })
}

fn bid(auction: u64, bidder: u64, price: u64, t: i64) -> Event {
    Event::Bid(Bid {
        auction,
        bidder,
        price,
        channel: "Google".into(),
        url: String::new(),
        date_time: t,
        extra: format!("bid-{auction}-{price}-{t}"),
    })
}

fn collect<T>(query: impl FnOnce(Vec<Event>, &mut dyn FnMut(T)), events: Vec<Event>) -> Vec<T> {
    let mut out = Vec::new();
    query(events, &mut |r| out.push(r));
    out
}

fn sorted<T: Ord>(mut records: Vec<T>) -> Vec<T> {
    records.sort();
    records
}

#[test]
fn q0_to_q2_map_and_filter_bids() {
    let events = vec![person(1, "OR", 0), bid(123, 1, 10, 1), bid(124, 1, 1000, 2)];
    let bids = collect(|e, emit| baseline::q0(e, emit), events.clone());
    assert_eq!(bids.len(), 2);
    let converted = collect(|e, emit| baseline::q1(e, emit), events.clone());
    assert_eq!(
        converted.iter().map(|c| c.price_milli).collect::<Vec<_>>(),
        [9_080, 908_000]
    );
    let selected = collect(|e, emit| baseline::q2(e, emit), events);
    assert_eq!(selected.len(), 1);
    assert_eq!((selected[0].auction, selected[0].price), (123, 10));
}

#[test]
fn q3_joins_in_either_order_and_filters() {
    let events = vec![
        auction(10, 1, 10, 0, 100), // before its seller
        person(1, "OR", 1),
        auction(11, 1, 10, 2, 100),
        auction(12, 1, 11, 3, 100), // wrong category
        person(2, "WA", 4),         // wrong state
        auction(13, 2, 10, 5, 100),
        person(3, "CA", 6),
        auction(14, 3, 10, 7, 100),
    ];
    let out = collect(|e, emit| q3(e, emit), events);
    let ids: Vec<(u64, String)> = sorted(
        out.iter()
            .map(|s| (s.auction_id, s.state.clone()))
            .collect(),
    );
    assert_eq!(
        ids,
        [(10, "OR".into()), (11, "OR".into()), (14, "CA".into())]
    );
    assert_eq!(
        out[0],
        LocalItemSuggestion {
            name: "person-1".into(),
            city: "Bend".into(),
            state: "OR".into(),
            auction_id: 10
        }
    );
}

#[test]
fn q4_takes_the_max_bid_within_the_auction_time_range() {
    let events = vec![
        bid(2, 9, 40, 1_000), // before its auction arrives, in range
        auction(1, 5, 10, 1_000, 2_000),
        auction(2, 5, 10, 1_000, 3_000),
        auction(3, 5, 11, 1_000, 3_000),
        bid(1, 9, 500, 999), // before the auction started
        bid(1, 9, 5, 1_000),
        bid(1, 9, 7, 2_000), // at expires: in range
        bid(2, 9, 30, 2_500),
        bid(1, 9, 900, 2_001), // after expiry
        bid(3, 9, 1, 10_000),  // after expiry: auction 3 has no winning bid
        bid(4, 9, 1, 20_000),
    ];
    let updates = collect(|e, emit| q4(e, emit), events);
    // Auctions 1 and 2 close with winners 7 and 40; auction 3 has none.
    assert_eq!(updates.len(), 2);
    assert_eq!(
        q4_final(updates),
        [CategoryAverage {
            category: 10,
            sum: 47,
            count: 2
        }]
    );
}

#[test]
fn q5_reports_every_auction_with_the_window_maximum() {
    let events = vec![
        bid(1, 9, 1, 0),
        bid(1, 9, 1, 100),
        bid(2, 9, 1, 1_999),
        bid(2, 9, 1, 2_500),
        bid(2, 9, 1, 3_999),
        bid(3, 9, 1, 30_000), // a tie, alone
        bid(4, 9, 1, 30_001),
    ];
    let out = sorted(
        collect(|e, emit| q5(e, emit), events)
            .into_iter()
            .map(|h: HotItem| (h.window_end, h.auction, h.count))
            .collect(),
    );
    let mut expected = vec![(2_000, 1, 2)];
    for end in [4_000, 6_000, 8_000, 10_000] {
        expected.push((end, 2, 3));
    }
    // [2 s, 12 s) holds two bids of auction 2.
    expected.push((12_000, 2, 2));
    for end in (32_000..=40_000).step_by(2_000) {
        expected.push((end, 3, 1));
        expected.push((end, 4, 1));
    }
    assert_eq!(out, sorted(expected));
}

#[test]
fn q7_reports_the_highest_bids_of_each_half_open_window() {
    let events = vec![
        bid(1, 9, 5, 0),
        bid(2, 9, 9, 3_000),
        bid(3, 9, 9, 9_999),
        bid(4, 9, 3, 9_000),
        bid(5, 9, 1, 10_000), // the next window, although Flink's BETWEEN would include it
        bid(6, 9, 2, 25_000),
    ];
    let out: Vec<(u64, u64, i64)> = sorted(
        collect(|e, emit| q7(e, emit), events)
            .into_iter()
            .map(|h: HighestBid| (h.auction, h.price, h.date_time))
            .collect(),
    );
    assert_eq!(
        out,
        [(2, 9, 3_000), (3, 9, 9_999), (5, 1, 10_000), (6, 2, 25_000)]
    );
}

#[test]
fn q8_needs_person_and_auction_in_the_same_window() {
    let events = vec![
        person(1, "OR", 1_000),
        auction(100, 1, 10, 9_999, 20_000), // same window as person 1
        person(2, "OR", 9_000),
        auction(101, 2, 10, 10_000, 20_000), // the next window
        auction(102, 3, 10, 12_000, 20_000), // before person 3, same window
        person(3, "OR", 15_000),
        auction(103, 3, 10, 16_000, 20_000), // a second auction: still one record
    ];
    let out: Vec<(u64, i64)> = sorted(
        collect(|e, emit| q8(e, emit), events)
            .into_iter()
            .map(|u: NewUser| (u.person_id, u.window_start))
            .collect(),
    );
    assert_eq!(out, [(1, 0), (3, 10_000)]);
}

#[test]
fn q11_sessions_close_after_the_gap_and_merge_when_touching() {
    let session = |bidder, count, start, end| BidderSession {
        bidder,
        count,
        start,
        end,
    };
    let events = vec![
        bid(1, 1, 1, 0),
        bid(1, 1, 1, 10_000), // exactly the gap after: same session
        bid(1, 3, 1, 10_500), // bidder 3: a separate session from its bid at 0 ...
        bid(1, 3, 1, 0),
        bid(1, 3, 1, 9_000), // ... until this late bid bridges them
        bid(1, 2, 1, 12_000),
        bid(1, 1, 1, 20_001), // over the gap: a new session
    ];
    let out = collect(|e, emit| q11(e, emit), events);
    let mut out: Vec<_> = out
        .into_iter()
        .map(|s| (s.bidder, s.start, s.count, s.end))
        .collect();
    out.sort();
    let expected: Vec<_> = [
        session(1, 2, 0, 20_000),
        session(1, 1, 20_001, 30_001),
        session(2, 1, 12_000, 22_000),
        session(3, 3, 0, 20_500),
    ]
    .into_iter()
    .map(|s| (s.bidder, s.start, s.count, s.end))
    .collect();
    assert_eq!(out, expected);
}

#[test]
fn q12_totals_count_bids_per_bidder() {
    let totals = baseline::q12(vec![bid(1, 7, 1, 0), bid(2, 7, 1, 5), bid(1, 8, 1, 9)]);
    let totals: Vec<(u64, u64)> = totals.iter().map(|t| (t.bidder, t.count)).collect();
    assert_eq!(totals, [(7, 2), (8, 1)]);
}

/// Generated events at 10,000 events/s: 200,000 of them span 20 s of event time.
fn slow_generator() -> NexmarkGenerator {
    NexmarkGenerator::new(NexmarkConfig {
        first_event_rate: 10_000,
        ..NexmarkConfig::default()
    })
    .unwrap()
}

/// Swaps events within blocks of 64 (a few ms of disorder, inside the watermark bound).
fn shuffled(events: &[Event]) -> Vec<Event> {
    let mut out = events.to_vec();
    for block in out.chunks_mut(64) {
        block.reverse();
        let half = block.len() / 2;
        block[..half].rotate_left(half.min(7));
    }
    out
}

#[test]
fn results_do_not_depend_on_arrival_order_within_the_bound() {
    let generator = slow_generator();
    let events: Vec<Event> = generator.events(0..120_000).collect();
    let reordered = shuffled(&events);
    assert_ne!(events, reordered);
    macro_rules! same {
        ($query:ident) => {{
            let a = checksum_of(&collect(|e, emit| $query(e, emit), events.clone()));
            let b = checksum_of(&collect(|e, emit| $query(e, emit), reordered.clone()));
            assert_eq!(a, b, stringify!($query));
            assert!(a.count > 0, stringify!($query));
        }};
    }
    same!(q3);
    same!(q5);
    same!(q7);
    same!(q8);
    same!(q11);
    let finals = |events: Vec<Event>| q4_final(collect(|e, emit| q4(e, emit), events));
    assert_eq!(finals(events.clone()), finals(reordered));
}

#[test]
fn runners_produce_results_on_generated_events() {
    let generator = slow_generator();
    let events = 200_000;
    let bids = events * 46 / 50;
    assert_eq!(baseline::run_q0(&generator, events).results, bids);
    assert_eq!(baseline::run_q1(&generator, events).results, bids);
    let q2 = baseline::run_q2(&generator, events).results;
    assert!(q2 > 0 && q2 < bids / 50, "{q2}");
    let checked_above = [Query::Q0, Query::Q1, Query::Q2];
    for query in Query::ALL
        .into_iter()
        .filter(|q| !checked_above.contains(q))
    {
        let (name, run) = (query.name(), query.baseline());
        let result = run(&generator, events);
        assert!(result.results > 0, "{name}: {result:?}");
        assert_eq!(run(&generator, events), result, "{name} is deterministic");
    }
    // q4: one final value per category; q5: at least one per 2 s window (about 10 + 5).
    assert_eq!(baseline::run_q4(&generator, events).results, 5);
    assert!(baseline::run_q5(&generator, events).results >= 14);
}
