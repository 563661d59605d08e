//! The Nexmark generator: deterministic per (seed, index), Beam's event mix, ids, hot ratios and
//! sizes, in-order or boundedly disordered timestamps, and strided slices on the engine.

use std::collections::HashMap;

use futures::executor::block_on;
use proptest::prelude::*;
use weir_bench::nexmark::generator::{
    AUCTION_ID_LEAD, HOT_BATCH, HOT_CHANNELS, NUM_IN_FLIGHT_AUCTIONS, PERSON_ID_LEAD,
};
use weir_bench::nexmark::{
    Event, NexmarkConfig, NexmarkGenerator, FIRST_AUCTION_ID, FIRST_PERSON_ID,
};
use weir_engine::connector::{GeneratorSplit, ReadStatus, Source};
use weir_engine::prelude::*;

fn generator(config: NexmarkConfig) -> NexmarkGenerator {
    NexmarkGenerator::new(config).expect("valid config")
}

fn default_generator() -> NexmarkGenerator {
    generator(NexmarkConfig::default())
}

#[test]
fn same_seed_and_index_give_the_same_event_and_seeds_differ() {
    let a = default_generator();
    let b = default_generator();
    let other = generator(NexmarkConfig {
        seed: 42,
        ..NexmarkConfig::default()
    });
    let mut differ = 0;
    for i in (0..100_000).step_by(997) {
        assert_eq!(a.generate(i), b.generate(i), "event {i}");
        if a.generate(i) != other.generate(i) {
            differ += 1;
        }
    }
    assert!(
        differ > 95,
        "only {differ} of 101 events differ across seeds"
    );
}

#[test]
fn epochs_hold_one_person_three_auctions_and_46_bids() {
    let generator = default_generator();
    for epoch in 0..200u64 {
        let kinds: Vec<char> = generator
            .events(epoch * 50..(epoch + 1) * 50)
            .map(|e| match e {
                Event::Person(_) => 'P',
                Event::Auction(_) => 'A',
                Event::Bid(_) => 'B',
            })
            .collect();
        let expected: Vec<char> = "PAAA".chars().chain(std::iter::repeat_n('B', 46)).collect();
        assert_eq!(kinds, expected, "epoch {epoch}");
    }
}

/// Walks events in order, tracking the last person and auction generated.
struct Walk {
    last_person: u64,
    last_auction: u64,
}

#[test]
fn ids_are_sequential_and_bids_reference_existing_or_lead_ids() {
    let generator = default_generator();
    let mut walk = Walk {
        last_person: FIRST_PERSON_ID - 1,
        last_auction: FIRST_AUCTION_ID - 1,
    };
    for event in generator.events(0..100_000) {
        match event {
            Event::Person(p) => {
                assert_eq!(p.id, walk.last_person + 1);
                walk.last_person = p.id;
            }
            Event::Auction(a) => {
                assert_eq!(a.id, walk.last_auction + 1);
                walk.last_auction = a.id;
                assert!(a.seller >= FIRST_PERSON_ID);
                assert!(a.seller <= walk.last_person + PERSON_ID_LEAD, "{a:?}");
                assert!((10..15).contains(&a.category));
                assert!(a.expires > a.date_time);
                assert!(a.reserve > a.initial_bid);
            }
            Event::Bid(b) => {
                assert!(b.auction >= FIRST_AUCTION_ID);
                assert!(b.auction <= walk.last_auction + AUCTION_ID_LEAD, "{b:?}");
                let hot_auction = (walk.last_auction - FIRST_AUCTION_ID) / HOT_BATCH * HOT_BATCH
                    + FIRST_AUCTION_ID;
                assert!(
                    b.auction == hot_auction
                        || b.auction + NUM_IN_FLIGHT_AUCTIONS >= walk.last_auction,
                    "{b:?} is neither hot nor in flight"
                );
                assert!(b.bidder >= FIRST_PERSON_ID);
                assert!(b.bidder <= walk.last_person + PERSON_ID_LEAD, "{b:?}");
                assert!(b.bidder + 1000 >= walk.last_person, "{b:?} is not active");
                assert!((100..=100_000_000).contains(&b.price));
            }
        }
    }
    assert_eq!(walk.last_person, FIRST_PERSON_ID + 2_000 - 1);
    assert_eq!(walk.last_auction, FIRST_AUCTION_ID + 6_000 - 1);
}

#[test]
fn hot_ratios_match_beam() {
    let generator = default_generator();
    let (mut bids, mut hot_auction, mut hot_bidder, mut hot_channel) = (0u64, 0u64, 0u64, 0u64);
    let (mut auctions, mut hot_seller) = (0u64, 0u64);
    let (mut last_person, mut last_auction) = (FIRST_PERSON_ID, FIRST_AUCTION_ID);
    let hot = |last: u64, first: u64| (last - first) / HOT_BATCH * HOT_BATCH + first;
    for event in generator.events(0..100_000) {
        match event {
            Event::Person(p) => last_person = p.id,
            Event::Auction(a) => {
                last_auction = a.id;
                auctions += 1;
                hot_seller += u64::from(a.seller == hot(last_person, FIRST_PERSON_ID));
            }
            Event::Bid(b) => {
                bids += 1;
                hot_auction += u64::from(b.auction == hot(last_auction, FIRST_AUCTION_ID));
                hot_bidder += u64::from(b.bidder == hot(last_person, FIRST_PERSON_ID) + 1);
                hot_channel += u64::from(HOT_CHANNELS.contains(&b.channel.as_str()));
            }
        }
    }
    let share = |n: u64, of: u64| n as f64 / of as f64;
    // Non-hot draws hit the hot id now and then too: a little above 1/2 and 3/4.
    let auction_share = share(hot_auction, bids);
    assert!((0.49..0.53).contains(&auction_share), "{auction_share}");
    let bidder_share = share(hot_bidder, bids);
    assert!((0.74..0.77).contains(&bidder_share), "{bidder_share}");
    let seller_share = share(hot_seller, auctions);
    assert!((0.72..0.79).contains(&seller_share), "{seller_share}");
    let channel_share = share(hot_channel, bids);
    assert!((0.49..0.51).contains(&channel_share), "{channel_share}");
}

#[test]
fn channels_have_fixed_urls() {
    let generator = default_generator();
    let mut urls: HashMap<String, String> = HashMap::new();
    let mut channels = 0;
    for event in generator.events(0..200_000) {
        if let Event::Bid(b) = event {
            assert!(
                HOT_CHANNELS.contains(&b.channel.as_str()) || b.channel.starts_with("channel-")
            );
            let url = urls.entry(b.channel.clone()).or_insert_with(|| {
                channels += 1;
                b.url.clone()
            });
            assert_eq!(*url, b.url, "channel {}", b.channel);
        }
    }
    assert!(channels > 5_000, "{channels} channels");
}

#[test]
fn sizes_average_200_500_and_100_bytes() {
    let generator = default_generator();
    let mut totals = [(0usize, 0usize); 3];
    for event in generator.events(0..100_000) {
        let kind = match event {
            Event::Person(_) => 0,
            Event::Auction(_) => 1,
            Event::Bid(_) => 2,
        };
        totals[kind].0 += event.size_bytes();
        totals[kind].1 += 1;
    }
    for ((bytes, count), target) in totals.into_iter().zip([200.0, 500.0, 100.0]) {
        let average = bytes as f64 / count as f64;
        assert!(
            (average - target).abs() <= 0.12 * target,
            "average {average} bytes, expected about {target}"
        );
    }
}

#[test]
fn in_order_timestamps_never_decrease_and_follow_the_rate() {
    let config = NexmarkConfig {
        first_event_rate: 10_000,
        ..NexmarkConfig::default()
    };
    let base = config.base_time_ms;
    let generator = generator(config);
    let mut last = i64::MIN;
    for (i, event) in generator.events(0..50_000).enumerate() {
        assert!(event.date_time() >= last);
        assert_eq!(event.date_time(), base + i as i64 / 10);
        last = event.date_time();
    }
}

#[test]
fn out_of_order_timestamps_stay_within_the_bound() {
    for config in [
        NexmarkConfig {
            first_event_rate: 10_000,
            out_of_order_group_size: 500,
            ..NexmarkConfig::default()
        },
        NexmarkConfig {
            first_event_rate: 10_000,
            delayed_event_probability: 0.1,
            ..NexmarkConfig::default()
        },
        NexmarkConfig {
            out_of_order_group_size: 1_000,
            delayed_event_probability: 0.5,
            max_delay_ms: 2_000,
            ..NexmarkConfig::default()
        },
    ] {
        let bound = config.max_disorder_ms();
        assert!(bound > 0 && bound < 4_000, "{bound}");
        let generator = generator(config.clone());
        let (mut max, mut worst, mut disordered) = (i64::MIN, 0, 0);
        for event in generator.events(0..100_000) {
            let t = event.date_time();
            if t < max {
                disordered += 1;
                worst = worst.max(max - t);
            }
            max = max.max(t);
        }
        assert!(
            disordered > 1_000,
            "{config:?}: only {disordered} events out of order"
        );
        assert!(
            worst <= bound,
            "{config:?}: disorder {worst} ms over the bound {bound}"
        );
    }
}

fn multiset(events: impl IntoIterator<Item = Event>) -> HashMap<Event, usize> {
    let mut counts = HashMap::new();
    for event in events {
        *counts.entry(event).or_default() += 1;
    }
    counts
}

/// Reads a slice through the source API: a few records, a snapshot, and the rest from a fresh
/// reader restored from that snapshot.
fn read_slice(
    source: &DataGeneratorSource<Event, NexmarkGenerator>,
    split: GeneratorSplit,
    subtask: usize,
    parallelism: usize,
) -> Vec<Event> {
    let ctx = RuntimeContext::new("nexmark", subtask, parallelism, 128);
    let mut reader = source.create_reader(&ctx);
    reader.add_split(split);
    let mut out = Vec::new();
    let status = block_on(reader.poll_next(&mut out, 37)).expect("reads");
    assert_eq!(status, ReadStatus::Records { split: 0 });
    let mut resumed = source.create_reader(&ctx);
    for split in reader.snapshot_splits() {
        resumed.add_split(split);
    }
    loop {
        match block_on(resumed.poll_next(&mut out, 1_000)).expect("reads") {
            ReadStatus::NeedSplit => return out,
            ReadStatus::Idle(_) => unreachable!("not throttled"),
            _ => {}
        }
    }
}

#[test]
fn strided_slices_cover_every_event_once_and_resume_from_a_snapshot() {
    const EVENTS: u64 = 10_000;
    let generator = default_generator();
    let expected = multiset(generator.events(0..EVENTS));
    for parallelism in [2usize, 3] {
        let source = DataGeneratorSource::new(Some(EVENTS), generator.clone());
        let mut enumerator = source.create_enumerator(parallelism);
        let mut all = Vec::new();
        for subtask in 0..parallelism {
            let split = enumerator
                .next_split(subtask)
                .expect("one split per subtask");
            let slice = read_slice(&source, split, subtask, parallelism);
            // Subtask s generates events s, s + p, s + 2p, ...
            let strided: Vec<Event> = (subtask as u64..EVENTS)
                .step_by(parallelism)
                .map(|i| generator.generate(i))
                .collect();
            assert!(slice == strided, "subtask {subtask} of {parallelism}");
            all.extend(slice);
        }
        assert!(multiset(all) == expected, "parallelism {parallelism}");
    }
}

#[test]
fn the_engine_runs_the_source_in_parallel() {
    const EVENTS: u64 = 20_000;
    let generator = default_generator();
    let parallelism = weir_engine::runtime::available_cores().len().min(2);
    let config = Configuration::default()
        .with("taskmanager.numberOfTaskSlots", parallelism.to_string())
        .expect("slots");
    let env = StreamEnvironment::new(config).expect("environment");
    let (sink, collected) = CollectSink::new();
    env.from_source(
        DataGeneratorSource::new(Some(EVENTS), generator.clone()),
        WatermarkStrategy::for_bounded_out_of_orderness(std::time::Duration::from_secs(4))
            .with_timestamp_assigner(|e: &Event, _| e.date_time()),
        "nexmark",
    )
    .parallelism(parallelism)
    .sink_to(sink, "collect");
    env.execute("nexmark-source").expect("the job runs");
    assert!(multiset(collected.records()) == multiset(generator.events(0..EVENTS)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// `generate(i)` is a pure function of (config, seed, i): repeated calls, clones and fresh
    /// generators agree, in any order.
    #[test]
    fn generate_is_pure(seed in any::<u64>(), index in 0u64..1 << 40, group in 1u64..200, delayed in any::<bool>()) {
        let config = NexmarkConfig {
            seed,
            out_of_order_group_size: group,
            delayed_event_probability: if delayed { 0.3 } else { 0.0 },
            ..NexmarkConfig::default()
        };
        let first = generator(config.clone());
        let event = first.generate(index);
        let _ = first.generate(index.wrapping_add(1));
        prop_assert_eq!(&first.generate(index), &event);
        prop_assert_eq!(&first.clone().generate(index), &event);
        prop_assert_eq!(&generator(config).generate(index), &event);
    }
}
