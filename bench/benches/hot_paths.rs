//! Criterion micro-benchmarks of the engine's per-record hot paths, on Nexmark bids where a
//! record is involved:
//!
//! - `codec_bid`: a `Bid` through `weir_engine::Record::encode`/`decode` (what an exchange
//!   edge does per record) and through `weir_state::StateCodec` (what the RocksDB backend does
//!   per value).
//! - `segment`: bids written into a network segment with the exchange's `SegmentBuilder` and
//!   read back with `Entries`.
//! - `spsc_ring`: segments handed over glommio's `shared_channel` — the local exchange's
//!   bounded ring, with the engine's default 4 credits — between two pinned executors and within
//!   one; and the whole exchange edge (write, hand off, read, decode) for bids.
//! - `key_group`: a bid's auction id to its key group and subtask (the `key_by` of Nexmark
//!   q5/q7); more key-group variants are in `benches/pipeline.rs`.
//! - `window`: a timestamp to its tumbling window, its pane, and its sliding windows.
//! - `state`: `ValueState<u64>` get + update per key, heap and RocksDB backends.
//!
//! `cargo bench -p weir-bench --bench hot_paths`; each group runs 10 samples for a few seconds,
//! so the whole file runs in about a minute once built.

mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::short;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use glommio::channels::shared_channel;
use glommio::{LocalExecutorBuilder, Placement};
use rkyv::ser::allocator::Arena;
use tempfile::TempDir;
use weir_bench::nexmark::{Bid, Event, NexmarkConfig, NexmarkGenerator};
use weir_engine::record::Scratch;
use weir_engine::runtime::available_cores;
use weir_engine::runtime::exchange::frame::{Entries, Entry, SegmentBuilder};
use weir_engine::window::TimeWindow;
use weir_engine::Record;
use weir_memory::{MemoryConfig, Segment, SegmentPool};
use weir_state::{
    Clock, KeyGroup, KeyedBackendConfig, LocalKeyedBackend, RocksDbConfig, RocksDbInstance,
    StateCodec, SystemClock, ValueStateDescriptor,
};

/// Bids per batch in the per-record groups.
const BIDS: usize = 1024;
/// `taskmanager.memory.segment-size`'s default.
const SEGMENT_SIZE: usize = 32 << 10;
/// `taskmanager.network.memory.buffers-per-channel`'s default: the ring's capacity.
const CREDITS: usize = 4;
/// `taskmanager.shard.spin-before-park`'s default.
const SPIN_BEFORE_PARK: Duration = Duration::from_millis(1);
/// `pipeline.max-parallelism`'s default.
const MAX_PARALLELISM: u32 = 128;
/// Distinct keys of the state benchmarks (as `weir bench state`).
const STATE_KEYS: u64 = 10_000;
/// Nexmark q5's HOP window: 10 s every 2 s.
const HOP_SIZE_MS: i64 = 10_000;
const HOP_SLIDE_MS: i64 = 2_000;

/// The first `BIDS` bids of the default Nexmark stream (about 100 bytes each, as Nexmark sizes
/// them).
fn bids() -> Vec<Bid> {
    let generator = NexmarkGenerator::new(NexmarkConfig::default()).expect("default config");
    generator
        .events(0..u64::MAX)
        .filter_map(|event| match event {
            Event::Bid(bid) => Some(bid),
            _ => None,
        })
        .take(BIDS)
        .collect()
}

/// A buffer with the alignment `Record::encode`/`decode` need.
#[repr(align(16))]
struct Aligned([u8; 512]);

fn codec(c: &mut Criterion) {
    let bids = bids();
    let mut arena = Arena::new();
    let encoded: Vec<(Aligned, usize)> = bids
        .iter()
        .map(|bid| {
            let mut out = Aligned([0; 512]);
            let len = Record::encode(bid, &mut out.0, &mut Scratch::new(&mut arena))
                .expect("a bid fits 512 bytes");
            (out, len)
        })
        .collect();
    let archived_bytes: usize = encoded.iter().map(|(_, len)| len).sum();

    let mut group = short(c, "codec_bid", 2);
    group.throughput(Throughput::Elements(BIDS as u64));
    group.bench_function("record_encode", |b| {
        let mut out = Aligned([0; 512]);
        let mut scratch = Scratch::new(&mut arena);
        b.iter(|| {
            for bid in &bids {
                black_box(Record::encode(black_box(bid), &mut out.0, &mut scratch));
            }
        })
    });
    group.bench_function("record_decode", |b| {
        b.iter(|| {
            for (bytes, len) in &encoded {
                // SAFETY: `bytes` holds what `encode` wrote for this bid, 16-byte aligned.
                black_box(unsafe { <Bid as Record>::decode(black_box(&bytes.0[..*len])) });
            }
        })
    });
    let state_encoded: Vec<Vec<u8>> = bids
        .iter()
        .map(|bid| StateCodec::encode(bid).expect("encodes"))
        .collect();
    group.bench_function("state_encode", |b| {
        let mut out = Vec::with_capacity(512);
        b.iter(|| {
            for bid in &bids {
                out.clear();
                black_box(black_box(bid).encode_into(&mut out)).expect("encodes");
            }
        })
    });
    group.bench_function("state_decode_validated", |b| {
        b.iter(|| {
            for bytes in &state_encoded {
                black_box(<Bid as StateCodec>::decode(black_box(bytes)).expect("decodes"));
            }
        })
    });
    group.finish();
    eprintln!(
        "codec_bid: {BIDS} bids, {:.1} archived bytes per bid on average",
        archived_bytes as f64 / BIDS as f64
    );
}

/// Fills one segment from `bids` (cycling from `*next`), as `ExchangeWriter` does; returns it
/// and the number of records written.
fn fill_segment(
    pool: &SegmentPool,
    bids: &[Bid],
    next: &mut usize,
    scratch: &mut Scratch<'_>,
) -> Segment {
    let mut builder = SegmentBuilder::new(pool.acquire().expect("a free segment"));
    loop {
        let bid = &bids[*next % bids.len()];
        if !builder.try_record(bid, bid.date_time, scratch) {
            return builder.finish();
        }
        *next += 1;
    }
}

/// Decodes every record of a segment; returns how many there were.
fn read_segment(segment: &Segment) -> u64 {
    let mut records = 0;
    for entry in Entries::new(segment) {
        if let Entry::Record(bytes, timestamp) = entry {
            // SAFETY: the segment was filled by `SegmentBuilder::try_record` with bids, and
            // entries start 16-byte aligned in a page-aligned segment.
            black_box((unsafe { <Bid as Record>::decode(bytes) }, timestamp));
            records += 1;
        }
    }
    records
}

fn segment(c: &mut Criterion) {
    let bids = bids();
    let pool = SegmentPool::new(0, 4, SEGMENT_SIZE);
    let mut arena = Arena::new();
    let mut scratch = Scratch::new(&mut arena);
    let mut next = 0;
    let full = fill_segment(&pool, &bids, &mut next, &mut scratch);
    let per_segment = next as u64;

    let mut group = short(c, "segment", 2);
    group.throughput(Throughput::Elements(per_segment));
    group.bench_function("write_bids", |b| {
        let mut next = 0;
        b.iter(|| black_box(fill_segment(&pool, &bids, &mut next, &mut scratch)))
    });
    group.bench_function("read_entries", |b| {
        b.iter(|| black_box(Entries::new(black_box(&full)).count()))
    });
    group.bench_function("read_and_decode_bids", |b| {
        b.iter(|| black_box(read_segment(black_box(&full))))
    });
    group.finish();
    eprintln!(
        "segment: {per_segment} bids per {} KiB segment, {} bytes filled",
        SEGMENT_SIZE >> 10,
        full.len()
    );
}

/// The cores the two ends of a ring run on: two distinct ones if the machine has them.
fn ring_cores() -> (Placement, Placement) {
    match available_cores()[..] {
        [a, b, ..] => (Placement::Fixed(a), Placement::Fixed(b)),
        [a] => (Placement::Fixed(a), Placement::Fixed(a)),
        [] => (Placement::Unbound, Placement::Unbound),
    }
}

/// Hands `segments` empty segments from one executor to another over a ring of [`CREDITS`],
/// taking them from a pool of `CREDITS + 2` (the engine's sizing); returns the time from the
/// first send to the last receipt.
fn ring_two_executors(segments: u64) -> Duration {
    let (tx, rx) = shared_channel::new_bounded::<Segment>(CREDITS);
    let pool = SegmentPool::new(0, CREDITS + 2, SEGMENT_SIZE);
    let (producer_core, consumer_core) = ring_cores();
    let producer = LocalExecutorBuilder::new(producer_core)
        .spin_before_park(SPIN_BEFORE_PARK)
        .spawn(move || produce_segments(tx, pool, segments))
        .expect("producer executor");
    let consumer = LocalExecutorBuilder::new(consumer_core)
        .spin_before_park(SPIN_BEFORE_PARK)
        .spawn(move || consume_segments(rx))
        .expect("consumer executor");
    let started = producer.join().expect("producer");
    let (ended, received) = consumer.join().expect("consumer");
    assert_eq!(received, segments);
    ended.duration_since(started)
}

/// The producer of the ring benchmarks: sends `segments` 64-byte segments from `pool`; returns
/// when it started.
async fn produce_segments(
    tx: shared_channel::SharedSender<Segment>,
    pool: SegmentPool,
    segments: u64,
) -> Instant {
    let tx = tx.connect().await;
    let started = Instant::now();
    for _ in 0..segments {
        let mut segment = pool.acquire().expect("a free segment");
        segment.set_len(64);
        tx.send(segment).await.expect("receiver connected");
    }
    started
}

/// The consumer of the ring benchmarks: receives until the sender is gone; returns when it
/// ended and how many segments came.
async fn consume_segments(rx: shared_channel::SharedReceiver<Segment>) -> (Instant, u64) {
    let rx = rx.connect().await;
    let mut received = 0u64;
    while let Some(segment) = rx.recv().await {
        received += black_box(segment).len() as u64 / 64;
    }
    (Instant::now(), received)
}

/// As [`ring_two_executors`], both ends on one executor (sender and receiver subtasks on the
/// same shard).
fn ring_one_executor(segments: u64) -> Duration {
    let (tx, rx) = shared_channel::new_bounded::<Segment>(CREDITS);
    let pool = SegmentPool::new(0, CREDITS + 2, SEGMENT_SIZE);
    let (core, _) = ring_cores();
    LocalExecutorBuilder::new(core)
        .spin_before_park(SPIN_BEFORE_PARK)
        .spawn(move || async move {
            let producer = glommio::spawn_local(produce_segments(tx, pool, segments));
            let consumer = glommio::spawn_local(consume_segments(rx));
            let started = producer.await;
            let (ended, received) = consumer.await;
            assert_eq!(received, segments);
            ended.duration_since(started)
        })
        .expect("executor")
        .join()
        .expect("ring on one executor")
}

/// The whole exchange edge for `records` bids between two executors: serialize into segments,
/// hand them over the ring, read and decode them; returns the time from the first record
/// written to the last one decoded.
fn exchange_bids(bids: Arc<Vec<Bid>>, records: u64) -> Duration {
    let (tx, rx) = shared_channel::new_bounded::<Segment>(CREDITS);
    let pool = SegmentPool::new(0, CREDITS + 2, SEGMENT_SIZE);
    let (producer_core, consumer_core) = ring_cores();
    let producer = LocalExecutorBuilder::new(producer_core)
        .spin_before_park(SPIN_BEFORE_PARK)
        .spawn(move || async move {
            let tx = tx.connect().await;
            let mut arena = Arena::new();
            let mut scratch = Scratch::new(&mut arena);
            let started = Instant::now();
            let mut builder = SegmentBuilder::new(pool.acquire().expect("a free segment"));
            for i in 0..records as usize {
                let bid = &bids[i % bids.len()];
                if !builder.try_record(bid, bid.date_time, &mut scratch) {
                    // Send first, then take a fresh segment, as `ExchangeWriter` does: the
                    // pool holds only the credits and 2 more.
                    tx.send(builder.finish()).await.expect("receiver connected");
                    builder = SegmentBuilder::new(pool.acquire().expect("a free segment"));
                    assert!(builder.try_record(bid, bid.date_time, &mut scratch));
                }
            }
            tx.send(builder.finish()).await.expect("receiver connected");
            started
        })
        .expect("producer executor");
    let consumer = LocalExecutorBuilder::new(consumer_core)
        .spin_before_park(SPIN_BEFORE_PARK)
        .spawn(move || async move {
            let rx = rx.connect().await;
            let mut received = 0;
            while let Some(segment) = rx.recv().await {
                received += read_segment(&segment);
            }
            (Instant::now(), received)
        })
        .expect("consumer executor");
    let started = producer.join().expect("producer");
    let (ended, received) = consumer.join().expect("consumer");
    assert_eq!(received, records);
    ended.duration_since(started)
}

fn spsc_ring(c: &mut Criterion) {
    let mut group = short(c, "spsc_ring", 3);
    group.throughput(Throughput::Elements(1));
    group.bench_function("segment_2_executors", |b| b.iter_custom(ring_two_executors));
    group.bench_function("segment_1_executor", |b| b.iter_custom(ring_one_executor));
    let bids = Arc::new(bids());
    group.bench_function("exchange_bid_2_executors", |b| {
        b.iter_custom(|records| exchange_bids(Arc::clone(&bids), records))
    });
    group.finish();
}

fn key_groups(c: &mut Criterion) {
    let auctions: Vec<u64> = bids().iter().map(|bid| bid.auction).collect();
    // Opaque, as in a running job: a constant would turn `% max_parallelism` into a mask.
    let max_parallelism = black_box(MAX_PARALLELISM);
    let mut group = short(c, "key_group", 2);
    group.throughput(Throughput::Elements(auctions.len() as u64));
    group.bench_function("bid_auction_to_subtask_of_2", |b| {
        b.iter(|| {
            for auction in &auctions {
                let group = KeyGroup::of(black_box(auction), max_parallelism);
                black_box(group.subtask(max_parallelism, black_box(2)));
            }
        })
    });
    group.finish();
}

/// The windows of `size` every `slide` (aligned to `offset`) that hold `timestamp`, latest
/// first — Flink's `SlidingEventTimeWindows.assignWindows`.
#[inline]
fn sliding_windows(
    timestamp: i64,
    offset: i64,
    size: i64,
    slide: i64,
) -> impl Iterator<Item = TimeWindow> {
    let last = TimeWindow::start_with_offset(timestamp, offset, slide);
    (0..)
        .map(move |i| last - i * slide)
        .take_while(move |start| start + size > timestamp)
        .map(move |start| TimeWindow::new(start, start + size))
}

fn window(c: &mut Criterion) {
    let timestamps: Vec<i64> = bids().iter().map(|bid| bid.date_time).collect();
    // Opaque, as they come from the job's assigner.
    let (offset, size, slide) = black_box((0, HOP_SIZE_MS, HOP_SLIDE_MS));
    let pane = black_box(HOP_SLIDE_MS); // gcd(size, slide)
    let mut group = short(c, "window", 2);
    group.throughput(Throughput::Elements(timestamps.len() as u64));
    group.bench_function("tumbling_start", |b| {
        b.iter(|| {
            for &ts in &timestamps {
                black_box(TimeWindow::start_with_offset(black_box(ts), offset, size));
            }
        })
    });
    group.bench_function("sliding_pane_start", |b| {
        // What the aligned window operator computes per record: its pane.
        b.iter(|| {
            for &ts in &timestamps {
                black_box(TimeWindow::start_with_offset(black_box(ts), offset, pane));
            }
        })
    });
    group.bench_function("sliding_windows_of_record_10s_2s", |b| {
        b.iter(|| {
            for &ts in &timestamps {
                for window in sliding_windows(black_box(ts), offset, size, slide) {
                    black_box(window);
                }
            }
        })
    });
    group.finish();
}

/// Operation `i`'s key: a Fibonacci hash of `i` modulo the key count (as `weir bench state`).
#[inline]
fn key_of(i: u64) -> u64 {
    let mixed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed ^ (mixed >> 29)) % STATE_KEYS
}

/// A keyed backend over all key groups and, for RocksDB, the directory of its database
/// (dropped after the backend).
fn backend(rocksdb: bool) -> (LocalKeyedBackend<u64>, Option<TempDir>) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let config = KeyedBackendConfig::single(MAX_PARALLELISM);
    if !rocksdb {
        return (LocalKeyedBackend::heap(config, clock).expect("heap"), None);
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    // One slot's share of the default worker memory.
    let budget = MemoryConfig::default().slot_budget(1).rocksdb;
    let rocks = RocksDbConfig::from_budget(dir.path().join("db"), &budget);
    let slot = RocksDbInstance::open(rocks, clock).expect("open RocksDB");
    let backend =
        LocalKeyedBackend::rocksdb(config, slot, "bench-hot-paths").expect("RocksDB backend");
    (backend, Some(dir))
}

fn state(c: &mut Criterion) {
    const OPS: u64 = 1024;
    let mut group = short(c, "state_value_u64", 3);
    group.throughput(Throughput::Elements(OPS));
    for (name, rocksdb) in [("heap_get_update", false), ("rocksdb_get_update", true)] {
        let (backend, dir) = backend(rocksdb);
        let sums = backend
            .value_state(&ValueStateDescriptor::<u64>::new("sum"))
            .expect("value state");
        // Every key present, so that each get finds a value.
        for key in 0..STATE_KEYS {
            backend.set_current_key(&key).expect("key");
            sums.update(0).expect("update");
        }
        let mut i = 0u64;
        group.bench_function(name, |b| {
            b.iter(|| {
                for _ in 0..OPS {
                    backend.set_current_key(&key_of(i)).expect("key");
                    let sum = sums.value().expect("get").unwrap_or(0);
                    sums.update(sum.wrapping_add(i)).expect("update");
                    i += 1;
                }
            })
        });
        drop(sums);
        drop(backend);
        drop(dir);
    }
    group.finish();
}

criterion_group!(benches, codec, segment, spsc_ring, key_groups, window, state);
criterion_main!(benches);
