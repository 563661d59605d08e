//! The standard Nexmark generator (Beam's `NexmarkGenerator`), deterministic per
//! `(config, seed, index)` and cheap enough to feed a core at several million events per second.
//!
//! **Event numbers.** Event `i` of the stream has the *event number* `n = i` (or, with
//! `out_of_order_group_size = g > 1`, Beam's shuffle within groups of `g`:
//! `n = i - i % g + (i * 953) % g`). The number decides everything: epochs of 50 (offset 0 a
//! [`Person`], 1–3 an [`Auction`], 4–49 a [`Bid`]), the sequential ids, and the event time
//! `base_time_ms + n * 1000 / first_event_rate` (integer milliseconds from a fixed base, never
//! the wall clock). The rest is drawn from a splitmix64 stream seeded by `(seed, n)`, so any
//! event can be generated on its own, in any order, on any subtask.
//!
//! **Beam's rules.** Bidders and sellers are drawn from the last [`NUM_ACTIVE_PEOPLE`] people
//! plus [`PERSON_ID_LEAD`] ids ahead; a non-hot bid's auction from the last
//! [`NUM_IN_FLIGHT_AUCTIONS`] auctions plus [`AUCTION_ID_LEAD`] ahead (ids not generated yet:
//! such records reach a job before the person or auction they name). Half of the bids go to the
//! hot auction (the first id of the latest batch of 100 auctions), 3/4 come from the hot bidder
//! (the *second* id of the latest batch of 100 people, so that hot bidders and hot sellers
//! differ, as in Beam), 3/4 of the auctions from the hot seller (the first id of that batch).
//! Half of the bids come from one of four hot channels, the rest from `channel-N`, N < 10,000;
//! every channel has a fixed url (9 in 10 of the `channel-N` urls carry a `&channel_id=`).
//! Prices are `round(10^(6U) · 100)` cents, U uniform in `[0, 1)`.
//!
//! **Auction horizon.** `expires = date_time + 1 + uniform[0, max(2·horizon, 1))` ms, i.e.
//! uniform in `[1, 2·horizon]` ms after `date_time`. By default the horizon is Beam's: the event
//! time it takes to generate [`NUM_IN_FLIGHT_AUCTIONS`] more auctions
//! (`100 * 50 / 3` events, so 166 ms at 10,000 events/s, and under 1 ms, giving a 1 ms
//! auction, at the benchmarks' 10,000,000 events/s); [`NexmarkConfig::auction_horizon_ms`]
//! overrides it.
//!
//! **Sizes.** `extra` pads every event to the average size of its kind (200 / 500 / 100 bytes
//! as [`Event::size_bytes`] counts), ±20% as in Beam; a bid's channel and url already take
//! about 70 bytes, so most bids get a short or empty `extra`. Strings are slices of a random
//! letter buffer made once per generator (shared by clones), so an event costs its few
//! allocations and no formatting.
//!
//! **Out of order.** Off by default (timestamps never decrease). Beam's two mechanisms can be
//! switched on: the group shuffle above, and delayed events — with probability
//! `delayed_event_probability`, an event's time is moved back by uniform `[0, max_delay_ms]`
//! (it arrives that much later than its time says). The generator refuses settings whose
//! disorder could reach [`MAX_DISORDER_MS`], so that the queries' 4 s bounded-out-of-orderness
//! watermark never makes an event late and every run has the same results.

use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::Arc;

use weir_engine::connector::Generator;

use super::model::{Auction, Bid, Event, Person};

/// The first person id.
pub const FIRST_PERSON_ID: u64 = 1000;
/// The first auction id.
pub const FIRST_AUCTION_ID: u64 = 1000;
/// The first category id; categories are `FIRST_CATEGORY_ID..FIRST_CATEGORY_ID + NUM_CATEGORIES`.
pub const FIRST_CATEGORY_ID: u64 = 10;
/// Number of categories.
pub const NUM_CATEGORIES: u64 = 5;
/// Events per epoch: 1 person, 3 auctions, 46 bids.
pub const EVENTS_PER_EPOCH: u64 = 50;
/// Persons per epoch.
pub const PERSONS_PER_EPOCH: u64 = 1;
/// Auctions per epoch.
pub const AUCTIONS_PER_EPOCH: u64 = 3;
/// Bidders and sellers are drawn from this many most recent people.
pub const NUM_ACTIVE_PEOPLE: u64 = 1000;
/// Non-hot bids go to one of this many most recent auctions.
pub const NUM_IN_FLIGHT_AUCTIONS: u64 = 100;
/// Person ids this far beyond the last generated one can be drawn.
pub const PERSON_ID_LEAD: u64 = 10;
/// Auction ids this far beyond the last generated one can be drawn.
pub const AUCTION_ID_LEAD: u64 = 10;
/// One bid in this many goes to a non-hot auction.
pub const HOT_AUCTION_RATIO: u64 = 2;
/// One bid in this many comes from a non-hot bidder.
pub const HOT_BIDDERS_RATIO: u64 = 4;
/// One auction in this many comes from a non-hot seller.
pub const HOT_SELLERS_RATIO: u64 = 4;
/// Hot entities are the first of the latest batch of this many ids.
pub const HOT_BATCH: u64 = 100;
/// The hot channels (half of the bids).
pub const HOT_CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
/// Number of `channel-N` channels.
pub const CHANNELS: u64 = 10_000;
/// Average person size in bytes.
pub const AVG_PERSON_BYTES: usize = 200;
/// Average auction size in bytes.
pub const AVG_AUCTION_BYTES: usize = 500;
/// Average bid size in bytes.
pub const AVG_BID_BYTES: usize = 100;
/// Event time of event number 0: 2023-11-14T22:13:20Z (a multiple of 10 s, so windows start
/// there), in milliseconds since the epoch.
pub const BASE_TIME_MS: i64 = 1_700_000_000_000;
/// The queries' watermark lag: the watermark is the largest event time seen minus this.
pub const WATERMARK_DELAY_MS: i64 = 4_000;
/// The generator's out-of-orderness stays below this (with a margin under
/// [`WATERMARK_DELAY_MS`]).
pub const MAX_DISORDER_MS: i64 = 3_500;

const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const US_CITIES: [&str; 10] = [
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
];
const FIRST_NAMES: [&str; 11] = [
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];
const LAST_NAMES: [&str; 9] = [
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
];
/// Beam's shuffle multiplier within out-of-order groups (a prime).
const SHUFFLE_MULTIPLIER: u64 = 953;
/// Random text is cut from `LETTERS_WINDOW + LETTERS_SLACK` letters at offsets below
/// `LETTERS_WINDOW`; no string is longer than the slack.
const LETTERS_WINDOW: u64 = 1 << 14;
const LETTERS_SLACK: usize = 1 << 10;

/// How to generate: the seed, the event rate (of event time) and the out-of-order settings.
#[derive(Clone, Debug, PartialEq)]
pub struct NexmarkConfig {
    /// Seed of every random choice (0 by default).
    pub seed: u64,
    /// Events per second of event time (Beam's `firstEventRate`); default 10,000,000.
    pub first_event_rate: u64,
    /// Event time of event number 0, milliseconds since the epoch; default [`BASE_TIME_MS`].
    pub base_time_ms: i64,
    /// Beam's `outOfOrderGroupSize`: events are shuffled within groups of this many; 1 (the
    /// default) keeps them in order. Must not be a multiple of 953.
    pub out_of_order_group_size: u64,
    /// Beam's `probDelayedEvent`: the probability that an event's time is moved back (0 by
    /// default).
    pub delayed_event_probability: f64,
    /// The largest such delay, in milliseconds (Beam's `occasionalDelaySec`: 3 s by default).
    pub max_delay_ms: i64,
    /// The auction horizon (see the module docs); `None` (default) for Beam's.
    pub auction_horizon_ms: Option<i64>,
}

impl Default for NexmarkConfig {
    fn default() -> Self {
        NexmarkConfig {
            seed: 0,
            first_event_rate: 10_000_000,
            base_time_ms: BASE_TIME_MS,
            out_of_order_group_size: 1,
            delayed_event_probability: 0.0,
            max_delay_ms: 3_000,
            auction_horizon_ms: None,
        }
    }
}

impl NexmarkConfig {
    /// The largest amount by which an event's time can fall behind the time of an event
    /// generated before it, in milliseconds (0 when out-of-orderness is off).
    pub fn max_disorder_ms(&self) -> i64 {
        let rate = self.first_event_rate.max(1) as i128;
        let group = if self.out_of_order_group_size > 1 {
            ((self.out_of_order_group_size - 1) as i128 * 1000 / rate + 1) as i64
        } else {
            0
        };
        let delay = if self.delayed_event_probability > 0.0 {
            self.max_delay_ms
        } else {
            0
        };
        group.saturating_add(delay)
    }

    /// Checks the settings; [`NexmarkGenerator::new`] calls it.
    pub fn validate(&self) -> Result<(), NexmarkConfigError> {
        let bad = |message: String| Err(NexmarkConfigError { message });
        if self.first_event_rate == 0 {
            return bad("nexmark first_event_rate is 0; use a positive number of events per second (benchmarks use 10000000)".into());
        }
        let group = self.out_of_order_group_size;
        if group == 0 || group.is_multiple_of(SHUFFLE_MULTIPLIER) {
            return bad(format!(
                "nexmark out_of_order_group_size {group} is 0 or a multiple of {SHUFFLE_MULTIPLIER}; use 1 for in-order events or another size"
            ));
        }
        if !(0.0..=1.0).contains(&self.delayed_event_probability) {
            return bad(format!(
                "nexmark delayed_event_probability {} is not a probability; use a value in [0, 1]",
                self.delayed_event_probability
            ));
        }
        if self.max_delay_ms < 0 {
            return bad(format!(
                "nexmark max_delay_ms {} is negative; use a delay in milliseconds >= 0",
                self.max_delay_ms
            ));
        }
        if let Some(horizon) = self.auction_horizon_ms.filter(|h| *h < 0) {
            return bad(format!(
                "nexmark auction_horizon_ms {horizon} is negative; use None for Beam's horizon or a positive number of milliseconds"
            ));
        }
        let disorder = self.max_disorder_ms();
        if disorder >= MAX_DISORDER_MS {
            return bad(format!(
                "nexmark out-of-orderness of up to {disorder} ms (group of {group} events at {} events/s, delays up to {} ms) reaches the {MAX_DISORDER_MS} ms limit under the 4 s watermark; use a smaller out_of_order_group_size or max_delay_ms",
                self.first_event_rate, self.max_delay_ms
            ));
        }
        Ok(())
    }
}

/// Settings the generator refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct NexmarkConfigError {
    /// What is wrong and how to fix it.
    pub message: String,
}

/// A small, fast random stream (splitmix64), seeded per event.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SplitMix64 {
    state: u64,
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline]
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SplitMix64 {
    /// The stream of event number `number` under `seed_key` (a mixed seed).
    #[inline]
    pub(crate) fn new(seed_key: u64, number: u64) -> SplitMix64 {
        SplitMix64 {
            state: mix64(seed_key ^ number.wrapping_mul(GOLDEN_GAMMA)),
        }
    }

    #[inline]
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix64(self.state)
    }

    /// Uniform in `0..n` (`n > 0`), by multiply-high (Lemire); the bias is below `n / 2^64`.
    #[inline]
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    #[inline]
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// What every clone of a generator shares: the random letters and the channel tables.
#[derive(Debug)]
struct Tables {
    /// Lowercase letters and a few spaces, `LETTERS_WINDOW + LETTERS_SLACK` of them.
    letters: String,
    hot_urls: [String; 4],
    channels: Vec<String>,
    channel_urls: Vec<String>,
    /// `2^(j / 64)`, for prices.
    exp2: [f64; 65],
}

impl Tables {
    fn new(seed: u64) -> Tables {
        let mut rng = SplitMix64::new(mix64(seed ^ 0x6C65_7474_6572_7321), u64::MAX);
        let letters: String = (0..LETTERS_WINDOW as usize + LETTERS_SLACK)
            .map(|_| {
                // Beam's strings: letters with a space now and then.
                if rng.below(13) == 0 {
                    ' '
                } else {
                    char::from(b'a' + rng.below(26) as u8)
                }
            })
            .collect();
        let word = |rng: &mut SplitMix64| -> String {
            let len = 3 + rng.below(2);
            (0..len)
                .map(|_| char::from(b'a' + rng.below(26) as u8))
                .collect()
        };
        let base_url = |rng: &mut SplitMix64| -> String {
            format!(
                "https://www.nexmark.com/{}/{}/{}/item.htm?query=1",
                word(rng),
                word(rng),
                word(rng)
            )
        };
        let hot_urls = [(); 4].map(|()| base_url(&mut rng));
        let channels = (0..CHANNELS).map(|n| format!("channel-{n}")).collect();
        let channel_urls = (0..CHANNELS)
            .map(|n| {
                let url = base_url(&mut rng);
                if rng.below(10) > 0 {
                    // Flink's nexmark: Math.abs(Integer.reverse(channel)).
                    format!(
                        "{url}&channel_id={}",
                        (n as i32).reverse_bits().unsigned_abs()
                    )
                } else {
                    url
                }
            })
            .collect();
        Tables {
            letters,
            hot_urls,
            channels,
            channel_urls,
            exp2: exp2_table(),
        }
    }
}

/// The Nexmark generator: event `i` is [`NexmarkGenerator::generate`]`(i)`. Cloning is cheap
/// (the tables are shared). As a [`Generator`], `DataGeneratorSource::new(Some(n), generator)`
/// is the Nexmark source (`queries::source` says how its subtasks share it).
#[derive(Clone, Debug)]
pub struct NexmarkGenerator {
    config: NexmarkConfig,
    seed_key: u64,
    horizon_ms: i64,
    /// `next_u64() < delay_threshold` delays an event (0: never).
    delay_threshold: u64,
    tables: Arc<Tables>,
}

impl NexmarkGenerator {
    /// A generator for `config`, or why the config is refused.
    pub fn new(config: NexmarkConfig) -> Result<NexmarkGenerator, NexmarkConfigError> {
        config.validate()?;
        let events_for_auctions = NUM_IN_FLIGHT_AUCTIONS * EVENTS_PER_EPOCH / AUCTIONS_PER_EPOCH;
        let horizon_ms = config.auction_horizon_ms.unwrap_or(
            (u128::from(events_for_auctions) * 1000 / u128::from(config.first_event_rate)) as i64,
        );
        let delay_threshold = if config.delayed_event_probability >= 1.0 {
            u64::MAX
        } else {
            (config.delayed_event_probability * 18_446_744_073_709_551_616.0) as u64
        };
        Ok(NexmarkGenerator {
            seed_key: mix64(config.seed),
            horizon_ms,
            delay_threshold,
            tables: Arc::new(Tables::new(config.seed)),
            config,
        })
    }

    /// The settings.
    pub fn config(&self) -> &NexmarkConfig {
        &self.config
    }

    /// The auction horizon in use, milliseconds.
    pub fn auction_horizon_ms(&self) -> i64 {
        self.horizon_ms
    }

    /// The event number of stream position `index` (see the module docs).
    #[inline]
    pub fn event_number(&self, index: u64) -> u64 {
        let group = self.config.out_of_order_group_size;
        if group <= 1 {
            index
        } else {
            index - index % group + (index % group) * SHUFFLE_MULTIPLIER % group
        }
    }

    /// The undelayed event time of event number `number`.
    #[inline]
    pub fn timestamp(&self, number: u64) -> i64 {
        self.config.base_time_ms
            + (u128::from(number) * 1000 / u128::from(self.config.first_event_rate)) as i64
    }

    /// The events at stream positions `range`, in order.
    pub fn events(&self, range: Range<u64>) -> impl Iterator<Item = Event> + '_ {
        range.map(move |i| self.generate(i))
    }

    /// The event at stream position `index`, always a call: the baselines keep the call the
    /// compiler gave each of them before [`generate_into`](Self::generate_into) was split off
    /// (with it inlined there, q12's baseline ran 841 instructions per event instead of 778,
    /// cachegrind).
    #[inline(never)]
    pub fn generate(&self, index: u64) -> Event {
        let (mut rng, number, date_time) = self.draw(index, |_| ());
        let offset = number % EVENTS_PER_EPOCH;
        if offset < PERSONS_PER_EPOCH {
            Event::Person(self.person(&mut rng, number, date_time))
        } else if offset < PERSONS_PER_EPOCH + AUCTIONS_PER_EPOCH {
            Event::Auction(self.auction(&mut rng, number, date_time))
        } else {
            Event::Bid(self.bid(&mut rng, number, date_time))
        }
    }

    /// [`generate`](Self::generate) into `slot`, always inlined: a caller that stores the event
    /// (the engine's source, into its batch) gets a bid built where it is stored. A returned
    /// event is put together on the stack and copied over (160 bytes per event), even inlined:
    /// its kinds meet in one value before the store. `reached` is given the event's time before
    /// any delay, first (the benchmark's timeline), so that it is not worked out twice.
    #[inline(always)]
    pub fn generate_into<'a>(
        &self,
        index: u64,
        slot: &'a mut MaybeUninit<Event>,
        reached: impl FnOnce(i64),
    ) -> &'a mut Event {
        let (mut rng, number, date_time) = self.draw(index, reached);
        let offset = number % EVENTS_PER_EPOCH;
        if offset < PERSONS_PER_EPOCH {
            slot.write(Event::Person(self.person(&mut rng, number, date_time)))
        } else if offset < PERSONS_PER_EPOCH + AUCTIONS_PER_EPOCH {
            slot.write(Event::Auction(self.auction(&mut rng, number, date_time)))
        } else {
            slot.write(Event::Bid(self.bid(&mut rng, number, date_time)))
        }
    }

    /// The random stream, number and (delayed) time the event at stream position `index` is
    /// drawn from; which kind it is follows from its number. `reached` is given the time
    /// before the delay.
    #[inline(always)]
    fn draw(&self, index: u64, reached: impl FnOnce(i64)) -> (SplitMix64, u64, i64) {
        let number = self.event_number(index);
        let mut rng = SplitMix64::new(self.seed_key, number);
        let mut date_time = self.timestamp(number);
        reached(date_time);
        if self.delay_threshold > 0 && rng.next_u64() < self.delay_threshold {
            date_time -= rng.below(self.config.max_delay_ms as u64 + 1) as i64;
        }
        (rng, number, date_time)
    }

    #[inline]
    fn letters(&self, rng: &mut SplitMix64, len: usize) -> &str {
        let from = rng.below(LETTERS_WINDOW) as usize;
        &self.tables.letters[from..from + len]
    }

    /// Beam's `nextString(maxLength)`: 3 to `max - 1` characters.
    #[inline]
    fn string(&self, rng: &mut SplitMix64, max: u64) -> String {
        let len = 3 + rng.below(max - 3) as usize;
        self.letters(rng, len).to_owned()
    }

    /// Beam's `nextExtra`: pads `current` bytes to `average` on average, ±20%.
    #[inline]
    fn extra(&self, rng: &mut SplitMix64, current: usize, average: usize) -> String {
        if current >= average {
            return String::new();
        }
        let target = (average - current) as u64;
        let delta = (target + 2) / 5;
        let len = target - delta + if delta > 0 { rng.below(2 * delta) } else { 0 };
        self.letters(rng, len as usize).to_owned()
    }

    fn person(&self, rng: &mut SplitMix64, number: u64, date_time: i64) -> Person {
        let id = last_base0_person_id(number) + FIRST_PERSON_ID;
        let first = FIRST_NAMES[rng.below(FIRST_NAMES.len() as u64) as usize];
        let last = LAST_NAMES[rng.below(LAST_NAMES.len() as u64) as usize];
        let mut name = String::with_capacity(first.len() + 1 + last.len());
        name.push_str(first);
        name.push(' ');
        name.push_str(last);
        let mut email_address = String::with_capacity(17);
        email_address.push_str(self.letters(rng, 7));
        email_address.push('@');
        email_address.push_str(self.letters(rng, 5));
        email_address.push_str(".com");
        let mut credit_card = String::with_capacity(19);
        for group in 0..4 {
            if group > 0 {
                credit_card.push(' ');
            }
            let mut digits = rng.below(10_000);
            let mut buf = [b'0'; 4];
            for slot in buf.iter_mut().rev() {
                *slot = b'0' + (digits % 10) as u8;
                digits /= 10;
            }
            credit_card.extend(buf.iter().map(|&b| char::from(b)));
        }
        let city = US_CITIES[rng.below(US_CITIES.len() as u64) as usize].to_owned();
        let state = US_STATES[rng.below(US_STATES.len() as u64) as usize].to_owned();
        let current =
            2 * 8 + name.len() + email_address.len() + credit_card.len() + city.len() + state.len();
        let extra = self.extra(rng, current, AVG_PERSON_BYTES);
        Person {
            id,
            name,
            email_address,
            credit_card,
            city,
            state,
            date_time,
            extra,
        }
    }

    fn auction(&self, rng: &mut SplitMix64, number: u64, date_time: i64) -> Auction {
        let id = last_base0_auction_id(number) + FIRST_AUCTION_ID;
        let seller = if rng.below(HOT_SELLERS_RATIO) > 0 {
            last_base0_person_id(number) / HOT_BATCH * HOT_BATCH
        } else {
            next_base0_person_id(rng, number)
        } + FIRST_PERSON_ID;
        let category = FIRST_CATEGORY_ID + rng.below(NUM_CATEGORIES);
        let initial_bid = price(rng, &self.tables.exp2);
        let expires = date_time + 1 + rng.below((2 * self.horizon_ms).max(1) as u64) as i64;
        let item_name = self.string(rng, 20);
        let description = self.string(rng, 100);
        let reserve = initial_bid + price(rng, &self.tables.exp2);
        let current = 7 * 8 + item_name.len() + description.len();
        let extra = self.extra(rng, current, AVG_AUCTION_BYTES);
        Auction {
            id,
            item_name,
            description,
            initial_bid,
            reserve,
            date_time,
            expires,
            seller,
            category,
            extra,
        }
    }

    #[inline(always)]
    fn bid(&self, rng: &mut SplitMix64, number: u64, date_time: i64) -> Bid {
        let auction = if rng.below(HOT_AUCTION_RATIO) > 0 {
            last_base0_auction_id(number) / HOT_BATCH * HOT_BATCH
        } else {
            next_base0_auction_id(rng, number)
        } + FIRST_AUCTION_ID;
        let bidder = if rng.below(HOT_BIDDERS_RATIO) > 0 {
            last_base0_person_id(number) / HOT_BATCH * HOT_BATCH + 1
        } else {
            next_base0_person_id(rng, number)
        } + FIRST_PERSON_ID;
        let price = price(rng, &self.tables.exp2);
        let (channel, url) = if rng.below(2) > 0 {
            let i = rng.below(HOT_CHANNELS.len() as u64) as usize;
            (HOT_CHANNELS[i], self.tables.hot_urls[i].as_str())
        } else {
            let n = rng.below(CHANNELS) as usize;
            (
                self.tables.channels[n].as_str(),
                self.tables.channel_urls[n].as_str(),
            )
        };
        let current = 4 * 8 + channel.len() + url.len();
        let extra = self.extra(rng, current, AVG_BID_BYTES);
        Bid {
            auction,
            bidder,
            price,
            channel: channel.to_owned(),
            url: url.to_owned(),
            date_time,
            extra,
        }
    }
}

impl Generator<Event> for NexmarkGenerator {
    #[inline]
    fn generate(&self, index: u64) -> Event {
        NexmarkGenerator::generate(self, index)
    }

    #[inline]
    fn generate_into<'a>(&self, index: u64, slot: &'a mut MaybeUninit<Event>) -> &'a mut Event {
        NexmarkGenerator::generate_into(self, index, slot, |_| ())
    }
}

/// `2^(j / 64)` for `j` in `0..=64`.
fn exp2_table() -> [f64; 65] {
    std::array::from_fn(|j| {
        // A long Taylor series of e^(j/64 · ln 2): plain IEEE arithmetic, the same everywhere.
        let x = j as f64 / 64.0 * std::f64::consts::LN_2;
        let mut sum = 1.0;
        for n in (1..=24).rev() {
            sum = 1.0 + sum * x / n as f64;
        }
        sum
    })
}

/// Beam's `PriceGenerator.nextPrice`: `round(10^(6U) * 100)` cents (Java's `Math.round`,
/// half up). `10^(6U) = 2^(n/64 + g)` with `n` an integer and `|g| <= 1/128`: `2^(n/64)` from a
/// 65-entry table, `2^g` by a cubic (relative error under 1e-10) — a few multiplications
/// instead of a libm call, with the same bits on every platform.
#[inline]
fn price(rng: &mut SplitMix64, exp2: &[f64; 65]) -> u64 {
    let x = rng.unit() * (6.0 * 64.0 * std::f64::consts::LOG2_10);
    let n = (x + 0.5) as u64;
    let g = (x - n as f64) * (std::f64::consts::LN_2 / 64.0);
    let fraction = 1.0 + g + g * g * (0.5 + g * (1.0 / 6.0));
    let power = f64::from_bits(((n >> 6) + 1023) << 52);
    (fraction * exp2[(n & 63) as usize] * power * 100.0 + 0.5) as u64
}

/// The 0-based id of the last person generated at or before event number `number`.
#[inline]
pub(crate) fn last_base0_person_id(number: u64) -> u64 {
    let epoch = number / EVENTS_PER_EPOCH;
    let offset = number % EVENTS_PER_EPOCH;
    // Past the persons of the epoch: its last person.
    let offset = if offset >= PERSONS_PER_EPOCH {
        PERSONS_PER_EPOCH - 1
    } else {
        offset
    };
    epoch * PERSONS_PER_EPOCH + offset
}

/// The 0-based id of the last auction generated at or before event number `number` (for a
/// person, the last auction of the previous epoch; `u64::MAX` wraps for event 0).
#[inline]
pub(crate) fn last_base0_auction_id(number: u64) -> u64 {
    let epoch = number / EVENTS_PER_EPOCH;
    let offset = number % EVENTS_PER_EPOCH;
    if offset < PERSONS_PER_EPOCH {
        (epoch * AUCTIONS_PER_EPOCH).wrapping_sub(1)
    } else if offset >= PERSONS_PER_EPOCH + AUCTIONS_PER_EPOCH {
        epoch * AUCTIONS_PER_EPOCH + AUCTIONS_PER_EPOCH - 1
    } else {
        epoch * AUCTIONS_PER_EPOCH + offset - PERSONS_PER_EPOCH
    }
}

/// A random active person (0-based), possibly a few ids ahead of the last one generated.
#[inline]
fn next_base0_person_id(rng: &mut SplitMix64, number: u64) -> u64 {
    let people = last_base0_person_id(number) + 1;
    let active = people.min(NUM_ACTIVE_PEOPLE);
    people - active + rng.below(active + PERSON_ID_LEAD)
}

/// A random in-flight auction (0-based), possibly a few ids ahead of the last one generated.
#[inline]
fn next_base0_auction_id(rng: &mut SplitMix64, number: u64) -> u64 {
    let max = last_base0_auction_id(number);
    let min = max.saturating_sub(NUM_IN_FLIGHT_AUCTIONS);
    min + rng.below(max - min + 1 + AUCTION_ID_LEAD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_built_in_place_are_the_events_returned() {
        // Delays, shuffling and every kind of event: the engine's source builds each event in
        // its batch (`generate_into`), the baselines take it returned (`generate`).
        let generator = NexmarkGenerator::new(NexmarkConfig {
            out_of_order_group_size: 7,
            delayed_event_probability: 0.3,
            ..NexmarkConfig::default()
        })
        .expect("valid settings");
        for index in 0..5_000 {
            let mut slot = MaybeUninit::uninit();
            let mut reached = None;
            let built = generator
                .generate_into(index, &mut slot, |time| reached = Some(time))
                .clone();
            assert_eq!(built, generator.generate(index), "event {index}");
            assert_eq!(
                reached,
                Some(generator.timestamp(generator.event_number(index))),
                "event {index}'s time before any delay"
            );
            // SAFETY: written by `generate_into` above.
            unsafe { slot.assume_init_drop() };
        }
    }

    #[test]
    fn base0_ids_follow_the_epochs() {
        assert_eq!(last_base0_person_id(0), 0);
        assert_eq!(last_base0_person_id(49), 0);
        assert_eq!(last_base0_person_id(50), 1);
        assert_eq!(last_base0_auction_id(1), 0);
        assert_eq!(last_base0_auction_id(3), 2);
        assert_eq!(last_base0_auction_id(4), 2);
        assert_eq!(last_base0_auction_id(50), 2);
        assert_eq!(last_base0_auction_id(51), 3);
    }

    #[test]
    fn group_shuffle_is_a_permutation() {
        let generator = NexmarkGenerator::new(NexmarkConfig {
            out_of_order_group_size: 64,
            ..NexmarkConfig::default()
        })
        .unwrap();
        let mut numbers: Vec<u64> = (0..640).map(|i| generator.event_number(i)).collect();
        assert_ne!(numbers, (0..640).collect::<Vec<_>>());
        numbers.sort_unstable();
        assert_eq!(numbers, (0..640).collect::<Vec<_>>());
    }

    #[test]
    fn refuses_bad_settings() {
        for config in [
            NexmarkConfig {
                first_event_rate: 0,
                ..NexmarkConfig::default()
            },
            NexmarkConfig {
                out_of_order_group_size: 953,
                ..NexmarkConfig::default()
            },
            NexmarkConfig {
                delayed_event_probability: 0.1,
                max_delay_ms: 3_600,
                ..NexmarkConfig::default()
            },
            NexmarkConfig {
                first_event_rate: 1_000,
                out_of_order_group_size: 10_000,
                ..NexmarkConfig::default()
            },
        ] {
            let error = NexmarkGenerator::new(config).unwrap_err();
            assert!(error.message.contains("use"), "{error}");
        }
    }

    #[test]
    fn prices_are_log_uniform_in_range() {
        let exp2 = exp2_table();
        for (j, value) in exp2.iter().enumerate() {
            assert!((value / (j as f64 / 64.0).exp2() - 1.0).abs() < 1e-15);
        }
        let mut rng = SplitMix64::new(1, 2);
        let prices: Vec<u64> = (0..100_000).map(|_| price(&mut rng, &exp2)).collect();
        for _ in 0..10_000 {
            let mut a = rng;
            let mut b = rng;
            let exact = (10f64.powf(b.unit() * 6.0) * 100.0 + 0.5).floor() as u64;
            let fast = price(&mut a, &exp2);
            assert!(fast.abs_diff(exact) <= 1, "{fast} vs {exact}");
            rng.next_u64();
        }
        assert!(prices.iter().all(|p| (100..=100_000_000).contains(p)));
        // Each decade gets about a sixth.
        let below_1000 = prices.iter().filter(|&&p| p < 1_000).count();
        assert!((15_000..18_500).contains(&below_1000), "{below_1000}");
    }
}
