//! The Nexmark queries as Weir jobs, written with the DataStream API: a [`source`] of
//! [`Event`]s and one builder per query that turns the event stream into the query's output
//! stream, with exactly the semantics of [`super::model`] and [`super::baseline`].
//!
//! | query | dataflow |
//! |---|---|
//! | q0 | events → bids |
//! | q1 | events → converted bids |
//! | q2 | events → selected bids |
//! | q3 | events → sellers and auctions by person id → keyed process (value + list state) |
//! | q4 | events → auctions and bids by auction id → keyed process (state, timer at `expires`) → winning bids by category → keyed running sum and count |
//! | q5 | events → auction ids → sliding 10 s / 2 s count per auction → by window end: tumbling 2 s max with ties → hot items |
//! | q7 | events → bids by price bucket → tumbling 10 s max with ties per bucket → by window start: tumbling 10 s max with ties → highest bids |
//! | q8 | events → persons and sellers by person id → tumbling 10 s (names, is a seller) → new users |
//! | q11 | events → bidder ids → session windows (10 s gap) count per bidder |
//! | q12 | events → bidder ids → processing-time tumbling 10 s count per bidder |
//!
//! Every query first turns events into the few fields it needs with a `flat_map` chained to the
//! source, so that only small records cross an exchange; window queries use incremental
//! `aggregate`s on `u64` keys. Output records keep the engine's timestamps: a window's output
//! carries its `max_timestamp()`, a process function's the input record's or the timer's.

use std::time::Duration;

use rkyv::{Archive, Deserialize, Serialize};
use weir_engine::connector::Generator;
use weir_engine::prelude::*;

use super::generator::WATERMARK_DELAY_MS;
use super::model::{
    Auction, AuctionPrice, Bid, BidderSession, BidderWindowCount, CategoryAverage,
    CurrencyConversion, Event, HighestBid, HotItem, LocalItemSuggestion, NewUser, Person,
};

/// q5's window size.
pub const HOP_SIZE: Duration = Duration::from_secs(10);
/// q5's slide.
pub const HOP_SLIDE: Duration = Duration::from_secs(2);
/// q7's and q8's tumbling window size (and q12's, in processing time).
pub const TUMBLE: Duration = Duration::from_secs(10);
/// q11's session gap.
pub const SESSION_GAP: Duration = Duration::from_secs(10);
/// q7's first phase keys bids by `price % Q7_BUCKETS`: few keys per window (a small
/// accumulator each), spread over the subtasks, and all bids of one price in one bucket.
pub const Q7_BUCKETS: u64 = 64;
/// Flat out, the source hands its events out in chunks of this many, each to whichever
/// subtask asks first ([`DataGeneratorSource::with_chunks`]): a shard that the keyed stages
/// load less generates more, and the subtasks end together. 6–7 ms of one shard's work; a
/// bid's auction is then almost always in its own chunk, generated before it by the same
/// subtask. Throttled, each subtask keeps its strided slice, so that event time follows the
/// wall clock on every subtask.
pub const CHUNK: u64 = 1 << 16;

/// The Nexmark source: events `0..events` of `generator` (throttled to `records_per_second`
/// over all subtasks, if given), timestamped with [`Event::date_time`], with a bounded
/// out-of-orderness watermark of [`WATERMARK_DELAY_MS`]. Named `Source: Nexmark`; its
/// parallelism is the environment's default.
pub fn source<G: Generator<Event>>(
    env: &StreamEnvironment,
    generator: G,
    events: u64,
    records_per_second: Option<f64>,
) -> DataStream<Event> {
    let source = DataGeneratorSource::new(Some(events), generator);
    let source = match records_per_second {
        Some(rate) => source.with_rate(rate),
        None => source.with_chunks(CHUNK),
    };
    let watermarks = WatermarkStrategy::for_bounded_out_of_orderness(Duration::from_millis(
        WATERMARK_DELAY_MS as u64,
    ))
    .with_timestamp_assigner(|event: &Event, _| event.date_time());
    env.from_source(source, watermarks, "Nexmark")
        .uid("nexmark")
}

/// q0: every bid, unchanged.
pub fn q0(events: DataStream<Event>) -> DataStream<Bid> {
    events
        .flat_map(|event: Event, out: &mut Collector<'_, Bid>| {
            if let Event::Bid(bid) = event {
                out.collect(bid);
            }
        })
        .name("q0 bids")
}

/// q1: every bid with its price × 0.908 (in thousandths, see [`CurrencyConversion`]).
pub fn q1(events: DataStream<Event>) -> DataStream<CurrencyConversion> {
    events
        .flat_map(
            |event: Event, out: &mut Collector<'_, CurrencyConversion>| {
                if let Event::Bid(bid) = event {
                    out.collect(CurrencyConversion::of(bid));
                }
            },
        )
        .name("q1 currency conversion")
}

/// q2: auction and price of the bids on auctions whose id is a multiple of 123.
pub fn q2(events: DataStream<Event>) -> DataStream<AuctionPrice> {
    events
        .flat_map(|event: Event, out: &mut Collector<'_, AuctionPrice>| {
            if let Event::Bid(bid) = &event {
                if AuctionPrice::selects(bid.auction) {
                    out.collect(AuctionPrice {
                        auction: bid.auction,
                        price: bid.price,
                    });
                }
            }
        })
        .name("q2 selection")
}

/// What q3 needs of a person: the seller's fields of the output.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct Q3Seller {
    /// The person's id.
    id: u64,
    /// Name.
    name: String,
    /// City.
    city: String,
    /// State.
    state: String,
}

/// q3's input: a selected person or a selected auction (id and seller).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
enum Q3Input {
    /// A person from OR, ID or CA.
    Seller(Q3Seller),
    /// A category-10 auction: its id and its seller.
    Auction {
        /// The auction's id.
        id: u64,
        /// The seller's person id.
        seller: u64,
    },
}

impl Q3Input {
    /// The person id the join is on.
    fn person(&self) -> u64 {
        match self {
            Q3Input::Seller(seller) => seller.id,
            Q3Input::Auction { seller, .. } => *seller,
        }
    }
}

/// q3's join, per person id: the seller (if it came) and the ids of its auctions.
#[derive(Clone)]
struct LocalItemJoin {
    seller: ValueStateDescriptor<Q3Seller>,
    auctions: ListStateDescriptor<u64>,
}

fn suggestion(seller: &Q3Seller, auction_id: u64) -> LocalItemSuggestion {
    LocalItemSuggestion {
        name: seller.name.clone(),
        city: seller.city.clone(),
        state: seller.state.clone(),
        auction_id,
    }
}

impl KeyedProcessFunction<u64, Q3Input, LocalItemSuggestion> for LocalItemJoin {
    fn process_element(
        &mut self,
        input: Q3Input,
        ctx: &mut KeyedProcessContext<'_, u64, LocalItemSuggestion>,
    ) {
        let auctions = ctx.list_state(&self.auctions);
        match input {
            Q3Input::Seller(seller) => {
                for auction_id in auctions.get().expect("q3: read the seller's auctions") {
                    ctx.emit(suggestion(&seller, auction_id));
                }
                ctx.value_state(&self.seller)
                    .update(seller)
                    .expect("q3: store the seller");
            }
            Q3Input::Auction { id, .. } => {
                let seller = ctx.value_state(&self.seller);
                if let Some(seller) = seller.value().expect("q3: read the seller") {
                    ctx.emit(suggestion(&seller, id));
                }
                auctions.add(id).expect("q3: store the auction");
            }
        }
    }
}

/// q3: a regular (unbounded) inner join of category-10 auctions with the persons from OR, ID
/// or CA who sell them; both sides stay in keyed state, so each pair is emitted once, when its
/// second side arrives (with that record's timestamp).
pub fn q3(events: DataStream<Event>) -> DataStream<LocalItemSuggestion> {
    events
        .flat_map(
            |event: Event, out: &mut Collector<'_, Q3Input>| match event {
                Event::Person(Person {
                    id,
                    name,
                    city,
                    state,
                    ..
                }) if LocalItemSuggestion::selects_state(&state) => {
                    out.collect(Q3Input::Seller(Q3Seller {
                        id,
                        name,
                        city,
                        state,
                    }));
                }
                Event::Auction(Auction {
                    id,
                    seller,
                    category,
                    ..
                }) if category == LocalItemSuggestion::CATEGORY => {
                    out.collect(Q3Input::Auction { id, seller });
                }
                _ => {}
            },
        )
        .name("q3 sellers and auctions")
        .key_by(|input: &Q3Input| input.person())
        .process(LocalItemJoin {
            seller: ValueStateDescriptor::new("q3-seller"),
            auctions: ListStateDescriptor::new("q3-auctions"),
        })
        .name("q3 join")
        .uid("q3-join")
}

/// A q4 bid: price and time.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
struct Q4Bid {
    /// The bid's time.
    date_time: i64,
    /// Its price.
    price: u64,
}

/// q4's input, keyed by auction id.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
enum Q4Input {
    /// An auction.
    Auction {
        /// Its id.
        id: u64,
        /// When it opens.
        date_time: i64,
        /// When it closes.
        expires: i64,
        /// Its category.
        category: u64,
    },
    /// A bid on auction `auction`.
    Bid {
        /// The auction's id.
        auction: u64,
        /// Time and price.
        bid: Q4Bid,
    },
}

impl Q4Input {
    fn auction(&self) -> u64 {
        match self {
            Q4Input::Auction { id, .. } => *id,
            Q4Input::Bid { auction, .. } => *auction,
        }
    }
}

/// A q4 auction in keyed state while it is open, collecting its highest bid in range.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
struct Q4Auction {
    /// When it opens.
    date_time: i64,
    /// When it closes.
    expires: i64,
    /// Its category.
    category: u64,
    /// The highest bid in `[date_time, expires]` so far.
    max_price: Option<u64>,
}

impl Q4Auction {
    /// Offers a bid; true if it is the new highest.
    fn offer(&mut self, bid: Q4Bid) -> bool {
        let wins = (self.date_time..=self.expires).contains(&bid.date_time)
            && self.max_price.is_none_or(|max| bid.price > max);
        if wins {
            self.max_price = Some(bid.price);
        }
        wins
    }
}

/// An auction's winning bid, for q4's second phase.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
struct WinningBid {
    /// The auction's category.
    category: u64,
    /// The highest bid in the auction's range.
    price: u64,
}

/// Bids that came before their auction: per millisecond the highest price, in time order.
///
/// Whether a bid is in its auction's range depends only on its time, so of the bids at one
/// millisecond only the highest can matter. Bids mostly come in time order, so holding one
/// looks at the last entry first.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
struct EarlyBids {
    /// Ascending by time, one entry per millisecond.
    bids: Vec<Q4Bid>,
}

impl EarlyBids {
    /// Holds `bid` unless a bid at its millisecond is at least as high.
    fn hold(&mut self, bid: Q4Bid) {
        let at = match self.bids.last() {
            Some(last) if last.date_time < bid.date_time => Err(self.bids.len()),
            Some(last) if last.date_time == bid.date_time => Ok(self.bids.len() - 1),
            _ => self
                .bids
                .binary_search_by_key(&bid.date_time, |held| held.date_time),
        };
        match at {
            Ok(index) => {
                let held = &mut self.bids[index];
                held.price = held.price.max(bid.price);
            }
            Err(index) => self.bids.insert(index, bid),
        }
    }

    /// Drops the bids at or before `time` (the watermark: no auction that opens then can
    /// come any more); the time of the last one left, if any.
    fn drop_through(&mut self, time: i64) -> Option<i64> {
        let passed = self.bids.partition_point(|bid| bid.date_time <= time);
        self.bids.drain(..passed);
        self.bids.last().map(|bid| bid.date_time)
    }
}

/// What q4 keeps per auction id: the auction while it is open, or the bids that came before
/// it (or after it closed: its id never comes again).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
enum Q4State {
    /// The auction, until its timer at `expires`.
    Open(Q4Auction),
    /// Bids without an open auction, with one timer at the time of the first of them; when
    /// it fires, the bids the watermark passed go and the timer moves to the last one left.
    Early(EarlyBids),
}

/// q4's first phase, per auction id: the auction, bids that came before it, and a timer at
/// `expires` that emits its winning bid.
///
/// One state per auction id holds either the open auction or the early bids, so each bid costs
/// one lookup and changes the stored state in place. At 2 shards a third of the bids can come
/// before their auction (the two source subtasks drift apart by 10⁵–10⁶ events, and bids go to
/// the newest auctions); a key holding early bids has at most one timer, not one per bid or
/// millisecond.
#[derive(Clone)]
struct WinningBids {
    state: ValueStateDescriptor<Q4State>,
}

impl KeyedProcessFunction<u64, Q4Input, WinningBid> for WinningBids {
    fn process_element(
        &mut self,
        input: Q4Input,
        ctx: &mut KeyedProcessContext<'_, u64, WinningBid>,
    ) {
        let state = ctx.value_state(&self.state);
        let mut timer = None;
        match input {
            Q4Input::Auction {
                date_time,
                expires,
                category,
                ..
            } => {
                let mut auction = Q4Auction {
                    date_time,
                    expires,
                    category,
                    max_price: None,
                };
                timer = Some(expires);
                state
                    .update_with(|current| {
                        if let Some(Q4State::Early(early)) = current {
                            for &bid in &early.bids {
                                auction.offer(bid);
                            }
                        }
                        Some(Q4State::Open(auction))
                    })
                    .expect("q4: store the auction");
            }
            Q4Input::Bid { bid, .. } => state
                .update_with(|current| match current {
                    Some(Q4State::Open(auction)) => {
                        auction.offer(bid);
                        None
                    }
                    Some(Q4State::Early(early)) => {
                        early.hold(bid);
                        None
                    }
                    None => {
                        timer = Some(bid.date_time);
                        Some(Q4State::Early(EarlyBids { bids: vec![bid] }))
                    }
                })
                .expect("q4: store a bid"),
        }
        if let Some(time) = timer {
            ctx.register_event_time_timer(time);
        }
    }

    fn on_timer(&mut self, timestamp: i64, ctx: &mut KeyedProcessContext<'_, u64, WinningBid>) {
        let state = ctx.value_state(&self.state);
        match state.value().expect("q4: read the auction") {
            // The auction's own timer (those of bids that came before it find it open).
            Some(Q4State::Open(auction)) if timestamp >= auction.expires => {
                if let Some(price) = auction.max_price {
                    ctx.emit(WinningBid {
                        category: auction.category,
                        price,
                    });
                }
                state.clear().expect("q4: close the auction");
            }
            Some(Q4State::Early(mut early)) => {
                match early.drop_through(timestamp.max(ctx.current_watermark())) {
                    Some(last) => {
                        state
                            .update(Q4State::Early(early))
                            .expect("q4: store the early bids");
                        ctx.register_event_time_timer(last);
                    }
                    None => state.clear().expect("q4: drop passed early bids"),
                }
            }
            Some(Q4State::Open(_)) | None => {}
        }
    }
}

/// q4's second phase, per category: the running sum and count of winning bids.
#[derive(Clone)]
struct CategoryAverages {
    average: ValueStateDescriptor<CategoryAverage>,
}

impl KeyedProcessFunction<u64, WinningBid, CategoryAverage> for CategoryAverages {
    fn process_element(
        &mut self,
        winner: WinningBid,
        ctx: &mut KeyedProcessContext<'_, u64, CategoryAverage>,
    ) {
        let state = ctx.value_state(&self.average);
        let mut average =
            state
                .value()
                .expect("q4: read the category")
                .unwrap_or(CategoryAverage {
                    category: winner.category,
                    sum: 0,
                    count: 0,
                });
        average.sum += winner.price;
        average.count += 1;
        state.update(average).expect("q4: store the category");
        ctx.emit(average);
    }
}

/// q4: per auction, the highest bid in `[date_time, expires]`, emitted when the watermark
/// passes `expires` (with that time); per category, the running sum and count of those winning
/// bids, one update per closed auction that had a bid (see [`super::q4_final`]).
pub fn q4(events: DataStream<Event>) -> DataStream<CategoryAverage> {
    events
        .flat_map(
            |event: Event, out: &mut Collector<'_, Q4Input>| match event {
                Event::Auction(auction) => out.collect(Q4Input::Auction {
                    id: auction.id,
                    date_time: auction.date_time,
                    expires: auction.expires,
                    category: auction.category,
                }),
                Event::Bid(bid) => out.collect(Q4Input::Bid {
                    auction: bid.auction,
                    bid: Q4Bid {
                        date_time: bid.date_time,
                        price: bid.price,
                    },
                }),
                Event::Person(_) => {}
            },
        )
        .name("q4 auctions and bids")
        .key_by(|input: &Q4Input| input.auction())
        .process(WinningBids {
            state: ValueStateDescriptor::new("q4-auctions"),
        })
        .name("q4 winning bids")
        .uid("q4-winning-bids")
        .key_by(|winner: &WinningBid| winner.category)
        .process(CategoryAverages {
            average: ValueStateDescriptor::new("q4-category"),
        })
        .name("q4 category averages")
        .uid("q4-category-averages")
}

/// Counts a window's records.
#[derive(Clone, Copy, Debug)]
struct Count;

impl<T> AggregateFunction<T, u64, u64> for Count {
    fn create_accumulator(&self) -> u64 {
        0
    }
    #[inline]
    fn add(&self, _: T, count: &mut u64) {
        *count += 1;
    }
    fn get_result(&self, count: &u64) -> u64 {
        *count
    }
    fn merge(&self, into: &mut u64, other: &u64) {
        *into += other;
    }
}

/// q5's first phase: an auction's bids in the window ending at `window_end`.
#[derive(Archive, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
struct AuctionCount {
    /// The window's end.
    window_end: i64,
    /// The auction's id.
    auction: u64,
    /// Its bids in the window.
    count: u64,
}

/// The auctions with the most bids in one window (ties all kept).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
struct TopAuctions {
    /// The window's end.
    window_end: i64,
    /// The largest count.
    count: u64,
    /// The auctions with that count.
    auctions: Vec<u64>,
}

/// Keeps the auctions with the largest count.
#[derive(Clone, Copy, Debug)]
struct MaxCount;

impl AggregateFunction<AuctionCount, TopAuctions, TopAuctions> for MaxCount {
    fn create_accumulator(&self) -> TopAuctions {
        TopAuctions::default()
    }
    fn add(&self, value: AuctionCount, top: &mut TopAuctions) {
        if top.auctions.is_empty() || value.count > top.count {
            top.window_end = value.window_end;
            top.count = value.count;
            top.auctions.clear();
        }
        if value.count == top.count {
            top.auctions.push(value.auction);
        }
    }
    fn get_result(&self, top: &TopAuctions) -> TopAuctions {
        top.clone()
    }
    fn merge(&self, into: &mut TopAuctions, other: &TopAuctions) {
        if other.auctions.is_empty() {
            return;
        }
        if into.auctions.is_empty() || other.count > into.count {
            *into = other.clone();
        } else if other.count == into.count {
            into.auctions.extend_from_slice(&other.auctions);
        }
    }
}

/// q5: bids per auction in 10 s windows every 2 s; per window, every auction whose count is
/// the window's largest. Phase one counts per auction (sliding, one accumulator per 2 s pane);
/// phase two keys the counts by window end and keeps the maximum in a tumbling 2 s window (a
/// count of the window ending at `end` carries `end - 1`, in the 2 s window that ends there).
pub fn q5(events: DataStream<Event>) -> DataStream<HotItem> {
    events
        .flat_map(|event: Event, out: &mut Collector<'_, u64>| {
            if let Event::Bid(bid) = &event {
                out.collect(bid.auction);
            }
        })
        .name("q5 bid auctions")
        .key_by(|auction: &u64| *auction)
        .window(SlidingEventTimeWindows::of(HOP_SIZE, HOP_SLIDE))
        .aggregate_with(Count, |auction: &u64, window: &TimeWindow, count| {
            AuctionCount {
                window_end: window.end,
                auction: *auction,
                count,
            }
        })
        .name("q5 counts")
        .uid("q5-counts")
        .key_by(|count: &AuctionCount| count.window_end)
        .window(TumblingEventTimeWindows::of(HOP_SLIDE))
        .aggregate(MaxCount)
        .name("q5 max count")
        .uid("q5-max-count")
        .flat_map(|top: TopAuctions, out: &mut Collector<'_, HotItem>| {
            for auction in top.auctions {
                out.collect(HotItem {
                    window_end: top.window_end,
                    auction,
                    count: top.count,
                });
            }
        })
        .name("q5 hot items")
}

/// The bids with the highest price of a window (of a q7 bucket, then of all of them).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
struct MaxBids {
    /// The window's start (set when the first phase fires).
    window_start: i64,
    /// The highest price.
    price: u64,
    /// The bids at that price.
    bids: Vec<HighestBid>,
}

impl MaxBids {
    fn offer(&mut self, bid: HighestBid) {
        if self.bids.is_empty() || bid.price > self.price {
            self.price = bid.price;
            self.bids.clear();
            self.bids.push(bid);
        } else if bid.price == self.price {
            self.bids.push(bid);
        }
    }

    fn merge(&mut self, other: &MaxBids) {
        if other.bids.is_empty() {
            return;
        }
        if self.bids.is_empty() || other.price > self.price {
            self.price = other.price;
            self.bids.clear();
        }
        if other.price == self.price {
            self.bids.extend_from_slice(&other.bids);
        }
    }
}

/// q7's first phase: the highest bids of a bucket.
#[derive(Clone, Copy, Debug)]
struct MaxBid;

impl AggregateFunction<HighestBid, MaxBids, MaxBids> for MaxBid {
    fn create_accumulator(&self) -> MaxBids {
        MaxBids::default()
    }
    #[inline]
    fn add(&self, bid: HighestBid, max: &mut MaxBids) {
        max.offer(bid);
    }
    fn get_result(&self, max: &MaxBids) -> MaxBids {
        max.clone()
    }
    fn merge(&self, into: &mut MaxBids, other: &MaxBids) {
        into.merge(other);
    }
}

/// q7's second phase: the highest bids of all buckets.
#[derive(Clone, Copy, Debug)]
struct MergeMaxBids;

impl AggregateFunction<MaxBids, MaxBids, MaxBids> for MergeMaxBids {
    fn create_accumulator(&self) -> MaxBids {
        MaxBids::default()
    }
    fn add(&self, partial: MaxBids, max: &mut MaxBids) {
        max.window_start = partial.window_start;
        max.merge(&partial);
    }
    fn get_result(&self, max: &MaxBids) -> MaxBids {
        max.clone()
    }
    fn merge(&self, into: &mut MaxBids, other: &MaxBids) {
        into.merge(other);
    }
}

/// q7: per 10 s tumbling window, every bid whose price is the window's highest. Two phases, so
/// that it scales past one subtask and never keeps every bid: bids (without channel and url)
/// keyed by `price % `[`Q7_BUCKETS`] keep the highest bids per bucket and window; those
/// partials, keyed by window start, merge in a second tumbling window (they carry the window's
/// `end - 1`, so they land in the same window).
pub fn q7(events: DataStream<Event>) -> DataStream<HighestBid> {
    events
        .flat_map(|event: Event, out: &mut Collector<'_, HighestBid>| {
            if let Event::Bid(bid) = event {
                out.collect(HighestBid {
                    auction: bid.auction,
                    price: bid.price,
                    bidder: bid.bidder,
                    date_time: bid.date_time,
                    extra: bid.extra,
                });
            }
        })
        .name("q7 bids")
        .key_by(|bid: &HighestBid| bid.price % Q7_BUCKETS)
        .window(TumblingEventTimeWindows::of(TUMBLE))
        .aggregate_with(MaxBid, |_: &u64, window: &TimeWindow, mut max: MaxBids| {
            max.window_start = window.start;
            max
        })
        .name("q7 max per bucket")
        .uid("q7-max-per-bucket")
        .key_by(|max: &MaxBids| max.window_start)
        .window(TumblingEventTimeWindows::of(TUMBLE))
        .aggregate(MergeMaxBids)
        .name("q7 max per window")
        .uid("q7-max-per-window")
        .flat_map(|max: MaxBids, out: &mut Collector<'_, HighestBid>| {
            for bid in max.bids {
                out.collect(bid);
            }
        })
        .name("q7 highest bids")
}

/// q8's input, keyed by person id: a person (with its name) or an auction's seller.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct Q8Input {
    /// The person's id (the seller's, for an auction).
    person: u64,
    /// The person's name; `None` for an auction.
    name: Option<String>,
}

/// A person id's q8 window: the names it joined with and whether it sold something.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
struct Q8Window {
    /// Distinct names of the persons with this id that joined in the window.
    names: Vec<String>,
    /// Whether an auction of this seller opened in the window.
    sold: bool,
}

/// Folds q8's input into a [`Q8Window`].
#[derive(Clone, Copy, Debug)]
struct NewUserWindow;

impl AggregateFunction<Q8Input, Q8Window, Q8Window> for NewUserWindow {
    fn create_accumulator(&self) -> Q8Window {
        Q8Window::default()
    }
    fn add(&self, input: Q8Input, window: &mut Q8Window) {
        match input.name {
            Some(name) => {
                if !window.names.contains(&name) {
                    window.names.push(name);
                }
            }
            None => window.sold = true,
        }
    }
    fn get_result(&self, window: &Q8Window) -> Q8Window {
        window.clone()
    }
    fn merge(&self, into: &mut Q8Window, other: &Q8Window) {
        into.sold |= other.sold;
        for name in &other.names {
            if !into.names.contains(name) {
                into.names.push(name.clone());
            }
        }
    }
}

/// q8: per 10 s tumbling window, the distinct `(id, name)` of the persons who joined in it and
/// sold an auction opened in the same window: persons and sellers keyed by person id, folded
/// per window into a tiny accumulator (names, sold or not), so no record is kept.
pub fn q8(events: DataStream<Event>) -> DataStream<NewUser> {
    events
        .flat_map(
            |event: Event, out: &mut Collector<'_, Q8Input>| match event {
                Event::Person(person) => out.collect(Q8Input {
                    person: person.id,
                    name: Some(person.name),
                }),
                Event::Auction(auction) => out.collect(Q8Input {
                    person: auction.seller,
                    name: None,
                }),
                Event::Bid(_) => {}
            },
        )
        .name("q8 persons and sellers")
        .key_by(|input: &Q8Input| input.person)
        .window(TumblingEventTimeWindows::of(TUMBLE))
        .aggregate_with(
            NewUserWindow,
            |person: &u64, window: &TimeWindow, joined: Q8Window| {
                if !joined.sold {
                    return Vec::new();
                }
                joined
                    .names
                    .into_iter()
                    .map(|name| NewUser {
                        person_id: *person,
                        name,
                        window_start: window.start,
                    })
                    .collect::<Vec<NewUser>>()
            },
        )
        .name("q8 join")
        .uid("q8-join")
        .flat_map(|users: Vec<NewUser>, out: &mut Collector<'_, NewUser>| {
            for user in users {
                out.collect(user);
            }
        })
        .name("q8 new users")
}

/// The bidder of each bid.
fn bidders(events: DataStream<Event>, name: &str) -> DataStream<u64> {
    events
        .flat_map(|event: Event, out: &mut Collector<'_, u64>| {
            if let Event::Bid(bid) = &event {
                out.collect(bid.bidder);
            }
        })
        .name(name)
}

/// q11: per bidder, sessions of bids with a 10 s gap (merging event-time session windows) and
/// their bid counts.
pub fn q11(events: DataStream<Event>) -> DataStream<BidderSession> {
    bidders(events, "q11 bidders")
        .key_by(|bidder: &u64| *bidder)
        .window(EventTimeSessionWindows::<u64>::with_gap(SESSION_GAP))
        .aggregate_with(Count, |bidder: &u64, window: &TimeWindow, count| {
            BidderSession {
                bidder: *bidder,
                count,
                start: window.start,
                end: window.end,
            }
        })
        .name("q11 sessions")
        .uid("q11-sessions")
}

/// q12: per bidder, bids per 10 s processing-time tumbling window.
pub fn q12(events: DataStream<Event>) -> DataStream<BidderWindowCount> {
    bidders(events, "q12 bidders")
        .key_by(|bidder: &u64| *bidder)
        .window(TumblingProcessingTimeWindows::of(TUMBLE))
        .aggregate_with(Count, |bidder: &u64, window: &TimeWindow, count| {
            BidderWindowCount {
                bidder: *bidder,
                count,
                window_end: window.end,
            }
        })
        .name("q12 counts")
        .uid("q12-counts")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn highest(price: u64, auction: u64) -> HighestBid {
        HighestBid {
            auction,
            price,
            bidder: 1,
            date_time: 0,
            extra: String::new(),
        }
    }

    #[test]
    fn max_bids_keep_ties_and_merge() {
        let mut a = MaxBids::default();
        a.offer(highest(5, 1));
        a.offer(highest(3, 2));
        a.offer(highest(5, 3));
        assert_eq!(a.price, 5);
        assert_eq!(a.bids.len(), 2);
        let mut b = MaxBids::default();
        b.offer(highest(7, 4));
        a.merge(&b);
        assert_eq!((a.price, a.bids.len()), (7, 1));
        let mut c = MaxBids::default();
        c.offer(highest(7, 5));
        a.merge(&c);
        a.merge(&MaxBids::default());
        assert_eq!((a.price, a.bids.len()), (7, 2));
    }

    #[test]
    fn early_bids_keep_the_highest_per_millisecond_in_time_order() {
        let bid = |date_time, price| Q4Bid { date_time, price };
        let mut early = EarlyBids::default();
        for held in [
            bid(5, 1),
            bid(7, 3),
            bid(7, 2),
            bid(6, 9),
            bid(3, 4),
            bid(7, 8),
        ] {
            early.hold(held);
        }
        assert_eq!(
            early.bids,
            [bid(3, 4), bid(5, 1), bid(6, 9), bid(7, 8)],
            "one per millisecond, the highest, ascending"
        );
        assert_eq!(early.drop_through(2), Some(7), "nothing passed");
        assert_eq!(early.drop_through(5), Some(7));
        assert_eq!(early.bids, [bid(6, 9), bid(7, 8)]);
        assert_eq!(early.drop_through(7), None, "all passed");
        assert!(early.bids.is_empty());
    }

    #[test]
    fn q4_offers_only_bids_in_range() {
        let mut auction = Q4Auction {
            date_time: 10,
            expires: 20,
            category: 10,
            max_price: None,
        };
        let bid = |date_time, price| Q4Bid { date_time, price };
        assert!(!auction.offer(bid(9, 100)));
        assert!(auction.offer(bid(10, 5)));
        assert!(auction.offer(bid(20, 6)));
        assert!(!auction.offer(bid(21, 100)));
        assert!(!auction.offer(bid(15, 6)));
        assert_eq!(auction.max_price, Some(6));
    }
}
