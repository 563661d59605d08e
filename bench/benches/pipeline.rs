//! Criterion micro-benchmarks: the chained job against the hand-written loop, key-group
//! hashing, and the record codec an exchange edge uses.
//!
//! `cargo bench -p weir-bench`; each group runs 10 samples for a few seconds so the whole
//! suite stays short on a small machine.

mod common;

use std::hint::black_box;

use common::short;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use rkyv::ser::allocator::Arena;
use weir_bench::record::BenchRecord;
use weir_bench::{chain, exchange};
use weir_engine::record::Scratch;
use weir_engine::runtime::available_cores;
use weir_engine::Record;
use weir_state::KeyGroup;

const CHAIN_RECORDS: u64 = 2_000_000;
const EXCHANGE_RECORDS: u64 = 2_000_000;
const MAX_PARALLELISM: u32 = 128;

fn pipelines(c: &mut Criterion) {
    let mut group = short(c, "chain", 4);
    group.throughput(Throughput::Elements(CHAIN_RECORDS));
    group.bench_function("hand_loop", |b| {
        b.iter(|| chain::run_baseline(black_box(CHAIN_RECORDS)))
    });
    group.bench_function("engine_1_shard", |b| {
        b.iter(|| chain::run_engine(black_box(CHAIN_RECORDS)).expect("chain job"))
    });
    group.finish();

    let shards = available_cores().len().min(2);
    let mut group = short(c, "exchange", 4);
    group.throughput(Throughput::Elements(EXCHANGE_RECORDS));
    group.bench_function("hand_off_2_threads", |b| {
        b.iter(|| exchange::run_baseline(black_box(EXCHANGE_RECORDS)))
    });
    group.bench_function(format!("engine_{shards}_shards"), |b| {
        b.iter(|| {
            exchange::run_engine(black_box(EXCHANGE_RECORDS), shards, &[]).expect("exchange job")
        })
    });
    group.finish();
}

fn key_groups(c: &mut Criterion) {
    // Opaque, as in a running job (where it comes from the configuration): a constant would
    // let the compiler turn the `% max_parallelism` into a mask.
    let max_parallelism = black_box(MAX_PARALLELISM);
    let ints: Vec<u64> = (0..1024).map(|i| BenchRecord::generate(i).key).collect();
    let strings: Vec<String> = ints.iter().map(|k| format!("user-{k:08}")).collect();
    let mut group = short(c, "key_group", 2);
    group.throughput(Throughput::Elements(ints.len() as u64));
    group.bench_function("u64", |b| {
        b.iter(|| {
            for key in &ints {
                black_box(KeyGroup::of(black_box(key), max_parallelism));
            }
        })
    });
    group.bench_function("u64_stable_hash_only", |b| {
        b.iter(|| {
            for key in &ints {
                black_box(weir_state::key_group::stable_hash(black_box(key)));
            }
        })
    });
    group.bench_function("u64_to_subtask_of_2", |b| {
        // What the exchange's partitioner does per record.
        b.iter(|| {
            for key in &ints {
                let group = KeyGroup::of(black_box(key), max_parallelism);
                black_box(group.subtask(max_parallelism, black_box(2)));
            }
        })
    });
    group.bench_function("string_13_bytes", |b| {
        b.iter(|| {
            for key in &strings {
                black_box(KeyGroup::of(black_box(key.as_str()), max_parallelism));
            }
        })
    });
    group.finish();
}

/// A buffer with the alignment `Record::encode`/`decode` need.
#[repr(align(16))]
struct Aligned([u8; 256]);

fn codec(c: &mut Criterion) {
    let record = BenchRecord::generate(42);
    let mut arena = Arena::new();
    let mut encoded = Aligned([0; 256]);
    let len = record
        .encode(&mut encoded.0, &mut Scratch::new(&mut arena))
        .expect("fits");

    let mut group = short(c, "codec_bench_record", 2);
    group.throughput(Throughput::Elements(1));
    group.bench_function("encode", |b| {
        let mut out = Aligned([0; 256]);
        let mut scratch = Scratch::new(&mut arena);
        b.iter(|| black_box(black_box(&record).encode(&mut out.0, &mut scratch)))
    });
    group.bench_function("decode", |b| {
        // SAFETY: `encoded` holds exactly what `encode` wrote, 16-byte aligned.
        b.iter(|| black_box(unsafe { BenchRecord::decode(black_box(&encoded.0[..len])) }))
    });
    group.bench_function("encode_fresh_arena", |b| {
        // What an exchange writer pays per record if it makes a new arena each time.
        let mut out = Aligned([0; 256]);
        b.iter_batched_ref(
            Arena::new,
            |arena| black_box(black_box(&record).encode(&mut out.0, &mut Scratch::new(arena))),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, pipelines, key_groups, codec);
criterion_main!(benches);
