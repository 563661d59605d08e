//! The exchange benchmark: `DataGeneratorSource` → `map` → `filter` → `key_by(key)` → keyed
//! `process` (forwards each record) → `DiscardSink`, on `S` shards. The `key_by` edge is a hash
//! exchange: each source subtask archives its records into network segments and hands them to
//! the shard that owns the record's key group, which reads them back and sinks them.
//!
//! The same job without the `key_by` (every operator chained on its shard, nothing crosses)
//! runs at the same shard count in the same rounds: what the exchange costs on this machine at
//! this shard count, whatever the machine's cores give together.
//!
//! The baseline is a hand-written two-thread hand-off of the same records: a producer thread
//! generates, maps and filters, and pushes batches of [`BATCH`] records through a bounded
//! channel (buffers recycled, like the engine's segments) to a consumer thread that
//! `black_box`es each record.

use std::hint::black_box;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::{Duration, Instant};

use serde::Serialize;
use weir_engine::prelude::*;
use weir_engine::runtime::{available_cores, on_loopback, RunOptions};

use crate::error::BenchError;
use crate::measure::{alternate, best, rate, Measurement, ROUNDS};
use crate::record::{BenchRecord, ExchangeRecord, WideRecord};
use crate::veth::{Veth, VethSide};

const JOB: &str = "bench-exchange";
const SINK: &str = "discard";
const REMOTE_JOB: &str = "bench-remote-exchange";

/// Records per batch the baseline hands from producer to consumer.
pub const BATCH: usize = 1024;

/// Batches the baseline's channel holds before the producer waits (the engine's default
/// credits per channel).
const IN_FLIGHT: usize = 4;

/// What `weir bench exchange --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct ExchangeReport {
    /// Records generated (each run, over all shards).
    pub records: u64,
    /// Shards the engine ran on (= source and sink parallelism).
    pub shards: usize,
    /// Rounds run; the best round of each side is reported.
    pub rounds: usize,
    /// The engine's best wall time, in seconds.
    pub seconds: f64,
    /// The engine's throughput: generated records per second, all shards together.
    pub records_per_second: f64,
    /// `records_per_second / shards`.
    pub records_per_second_per_shard: f64,
    /// The same job without the exchange (chained on every shard), same shards, best round:
    /// generated records per second, all shards together.
    pub chained_records_per_second: f64,
    /// `chained_records_per_second / records_per_second`: how many times the job's time the
    /// exchange takes at this shard count (1 would be free).
    pub exchange_cost: f64,
    /// Further engine settings the runs had (`-D KEY=VALUE`).
    pub settings: Vec<String>,
    /// The two-thread hand-off's best wall time, in seconds.
    pub baseline_seconds: f64,
    /// The two-thread hand-off's throughput: generated records per second.
    pub baseline_records_per_second: f64,
    /// Records that passed the filter (the engine's sink input, all shards together).
    pub surviving_records: u64,
    /// Whether the engine's sinks (with and without the exchange) received as many records as
    /// the baseline's consumer.
    pub results_match: bool,
}

/// Checks `shards` against the cores this process may run on.
fn check_shards(shards: usize) -> Result<(), BenchError> {
    let cores = available_cores().len();
    match shards {
        0 => Err(BenchError::NoShards),
        s if s > cores => Err(BenchError::TooManyShards { shards, cores }),
        _ => Ok(()),
    }
}

/// The engine's configuration for `shards` shards and the further `settings` (`KEY=VALUE`).
fn config(shards: usize, settings: &[String]) -> Result<Configuration, BenchError> {
    let mut config = Configuration::default()
        .with("taskmanager.numberOfTaskSlots", shards.to_string())
        .map_err(|e| BenchError::job(JOB)(e.into()))?;
    config
        .apply_pairs(settings.iter().map(String::as_str))
        .map_err(|e| BenchError::job(JOB)(e.into()))?;
    Ok(config)
}

/// Runs the exchange job on `shards` shards with `records` records and returns what it
/// measured.
pub fn run_engine(
    records: u64,
    shards: usize,
    settings: &[String],
) -> Result<Measurement, BenchError> {
    run_job(records, shards, settings, true)
}

/// The exchange job (`exchange`), or the same operators chained on every shard.
fn run_job(
    records: u64,
    shards: usize,
    settings: &[String],
    exchange: bool,
) -> Result<Measurement, BenchError> {
    check_shards(shards)?;
    let env = exchange_job::<BenchRecord>(records, shards, config(shards, settings)?, exchange)?;
    let result = env.execute(JOB).map_err(BenchError::job(JOB))?;
    Ok(measured(&result))
}

/// What a run of the exchange job measured.
fn measured(result: &JobResult) -> Measurement {
    Measurement {
        duration: result.duration,
        surviving_records: result.records_in(&format!("Sink: {SINK}")),
    }
}

/// The exchange job over records `R` at `parallelism` (with `exchange`; else its operators
/// chained on every shard), built on `config` and not run.
fn exchange_job<R: ExchangeRecord>(
    records: u64,
    parallelism: usize,
    config: Configuration,
    exchange: bool,
) -> Result<StreamEnvironment, BenchError> {
    let shards = parallelism;
    // Every operator at the job's parallelism, whatever this executor's own slots are.
    let config = config
        .with("parallelism.default", parallelism.to_string())
        .map_err(|e| BenchError::job(JOB)(e.into()))?;
    let env = StreamEnvironment::new(config).map_err(BenchError::job(JOB))?;
    let survivors = env
        .from_source(
            DataGeneratorSource::new(Some(records), R::generate),
            WatermarkStrategy::no_watermarks(),
            "generator",
        )
        .uid("generator")
        .parallelism(shards)
        .map(R::mapped)
        .filter(R::survives);
    let forwarded = if exchange {
        survivors
            .key_by(R::key)
            .process(|record: R, ctx: &mut KeyedProcessContext<'_, u64, R>| ctx.emit(record))
            .uid("forward")
    } else {
        survivors.map(|record: R| record).uid("forward")
    };
    forwarded
        .sink_to(DiscardSink::new(), SINK)
        .parallelism(shards);
    Ok(env)
}

/// The exchange job over records `R` on two slots, spread over two executors side by side
/// in this process, each with one slot on a core of its own (QUIC with mutual TLS between
/// them, on loopback or, with `veth`, across a veth pair: each executor in a namespace of its
/// own): the later of their ends, and what reached both sinks.
fn run_spread<R: ExchangeRecord>(
    records: u64,
    settings: &[String],
    veth: Option<&Veth>,
) -> Result<Measurement, BenchError> {
    let mut spreads = on_loopback(REMOTE_JOB, 2).map_err(BenchError::Remote)?;
    let sides: Vec<Option<VethSide>> = (0..2).map(|i| veth.map(|veth| veth.side(i))).collect();
    for spread in &mut spreads {
        for (slot, side) in spread.slots.iter_mut().zip(&sides) {
            if let Some(side) = side {
                slot.addr.set_ip(side.addr());
            }
        }
    }
    let cores = available_cores();
    // Each executor from a thread of its own, which enters its side's namespace first: its
    // shards, started from there, open their sockets in it. Both are waited for, whatever the
    // first did (a failure on one side ends the other too).
    let results: Vec<_> = std::thread::scope(|scope| {
        let runs: Vec<_> = spreads
            .into_iter()
            .zip(cores)
            .zip(&sides)
            .map(|((spread, core), side)| {
                scope.spawn(move || {
                    if let Some(side) = side {
                        side.enter().map_err(BenchError::Veth)?;
                    }
                    let config = config(1, settings)?
                        .with("taskmanager.cpu.cores", core.to_string())
                        .map_err(|e| BenchError::job(REMOTE_JOB)(e.into()))?;
                    let options = RunOptions {
                        spread: Some(spread),
                        ..RunOptions::default()
                    };
                    exchange_job::<R>(records, 2, config, true)?
                        .execute_async(REMOTE_JOB, options)
                        .and_then(|run| run.wait())
                        .map_err(BenchError::job(REMOTE_JOB))
                })
            })
            .collect();
        runs.into_iter()
            .map(|run| run.join().expect("an executor's thread does not panic"))
            .collect()
    });
    let mut total = Measurement {
        duration: Duration::ZERO,
        surviving_records: 0,
    };
    for result in results {
        let side = measured(&result?);
        total.duration = total.duration.max(side.duration);
        total.surviving_records += side.surviving_records;
    }
    Ok(total)
}

/// What `weir bench remote-exchange --json` prints: the exchange job on two slots with its
/// keyed exchange between two shards of one executor, and spread over two executors.
#[derive(Clone, Debug, Serialize)]
pub struct RemoteExchangeReport {
    /// Records generated (each run, both slots together).
    pub records: u64,
    /// Bytes per record.
    pub record_bytes: usize,
    /// Rounds run, alternating; the best round of each side is reported.
    pub rounds: usize,
    /// Both slots in one executor, records crossing between its shards (rings): generated
    /// records per second.
    pub local_records_per_second: f64,
    /// What the two executors' QUIC crosses: `loopback`, or `veth` (a veth pair between a
    /// network namespace for each).
    pub link: &'static str,
    /// One slot in each of two executors, records crossing over QUIC: generated records per
    /// second (from each executor's start, the connection's set-up included, to the later
    /// end).
    pub remote_records_per_second: f64,
    /// `local_records_per_second / remote_records_per_second`: how many times the local
    /// exchange's time the remote one takes.
    pub remote_cost: f64,
    /// Further engine settings the runs had (`-D KEY=VALUE`).
    pub settings: Vec<String>,
    /// Whether both sides' sinks received the same number of records.
    pub results_match: bool,
}

/// Runs the exchange job over `record_bytes`-byte records (64 or 1024) on two slots, on one
/// executor and spread over two (on loopback, or with `veth` across a veth pair between two
/// network namespaces), alternately.
pub fn run_remote(
    records: u64,
    record_bytes: usize,
    settings: &[String],
    veth: bool,
) -> Result<RemoteExchangeReport, BenchError> {
    match record_bytes {
        64 => run_remote_of::<BenchRecord>(records, settings, veth),
        1024 => run_remote_of::<WideRecord>(records, settings, veth),
        other => Err(BenchError::RecordBytes(other)),
    }
}

fn run_remote_of<R: ExchangeRecord>(
    records: u64,
    settings: &[String],
    veth: bool,
) -> Result<RemoteExchangeReport, BenchError> {
    if records == 0 {
        return Err(BenchError::NoRecords);
    }
    check_shards(2)?;
    config(2, settings)?;
    let veth = veth.then(Veth::make).transpose()?;
    let mut locals = Vec::with_capacity(ROUNDS);
    let mut remotes = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let env = exchange_job::<R>(records, 2, config(2, settings)?, true)?;
        locals.push(measured(&env.execute(JOB).map_err(BenchError::job(JOB))?));
        remotes.push(run_spread::<R>(records, settings, veth.as_ref())?);
    }
    let (local, remote) = (best(&locals), best(&remotes));
    let local_records_per_second = rate(records, local.duration);
    let remote_records_per_second = rate(records, remote.duration);
    Ok(RemoteExchangeReport {
        records,
        record_bytes: std::mem::size_of::<R>(),
        rounds: ROUNDS,
        local_records_per_second,
        link: if veth.is_some() { "veth" } else { "loopback" },
        remote_records_per_second,
        remote_cost: local_records_per_second / remote_records_per_second,
        settings: settings.to_vec(),
        results_match: locals
            .iter()
            .chain(&remotes)
            .all(|m| m.surviving_records == local.surviving_records),
    })
}

fn produce(records: u64, full: SyncSender<Vec<BenchRecord>>, empty: Receiver<Vec<BenchRecord>>) {
    let mut batch = Vec::with_capacity(BATCH);
    for i in 0..records {
        let record = BenchRecord::generate(i).mapped();
        if record.survives() {
            batch.push(record);
            if batch.len() == BATCH {
                let next = empty
                    .try_recv()
                    .unwrap_or_else(|_| Vec::with_capacity(BATCH));
                full.send(std::mem::replace(&mut batch, next))
                    .expect("consumer alive");
            }
        }
    }
    if !batch.is_empty() {
        full.send(batch).expect("consumer alive");
    }
}

fn consume(full: Receiver<Vec<BenchRecord>>, empty: SyncSender<Vec<BenchRecord>>) -> u64 {
    let mut surviving = 0u64;
    for mut batch in full {
        surviving += batch.len() as u64;
        for record in batch.drain(..) {
            black_box(record);
        }
        // The producer may have finished and dropped its end: then the buffer is not needed.
        let _ = empty.try_send(batch);
    }
    surviving
}

/// The hand-written two-thread hand-off: one producer thread generates, maps and filters,
/// a consumer thread `black_box`es each record.
pub fn run_baseline(records: u64) -> Measurement {
    let (full_tx, full_rx) = sync_channel(IN_FLIGHT);
    let (empty_tx, empty_rx) = sync_channel(IN_FLIGHT + 1);
    let started = Instant::now();
    let consumer = std::thread::spawn(move || consume(full_rx, empty_tx));
    produce(records, full_tx, empty_rx);
    let surviving = consumer.join().expect("baseline consumer thread");
    Measurement {
        duration: started.elapsed(),
        surviving_records: surviving,
    }
}

/// Runs the hand-off baseline, the engine job and the job without its exchange alternately,
/// [`ROUNDS`] times each, and reports the best round of each. Refuses more shards than cores.
pub fn run(records: u64, shards: usize, settings: &[String]) -> Result<ExchangeReport, BenchError> {
    if records == 0 {
        return Err(BenchError::NoRecords);
    }
    check_shards(shards)?;
    // Refuse bad settings before the first round.
    config(shards, settings)?;
    let mut chained = Vec::with_capacity(ROUNDS);
    let (engine, baseline) = alternate(
        || run_baseline(records),
        || {
            chained.push(run_job(records, shards, settings, false)?);
            run_engine(records, shards, settings)
        },
    )?;
    let chained = best(&chained);
    let records_per_second = rate(records, engine.duration);
    let chained_records_per_second = rate(records, chained.duration);
    Ok(ExchangeReport {
        records,
        shards,
        rounds: ROUNDS,
        seconds: engine.duration.as_secs_f64(),
        records_per_second,
        records_per_second_per_shard: records_per_second / shards as f64,
        chained_records_per_second,
        exchange_cost: chained_records_per_second / records_per_second,
        settings: settings.to_vec(),
        baseline_seconds: baseline.duration.as_secs_f64(),
        baseline_records_per_second: rate(records, baseline.duration),
        surviving_records: engine.surviving_records,
        results_match: engine.surviving_records == baseline.surviving_records
            && chained.surviving_records == baseline.surviving_records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_run_matches_the_baseline() {
        let shards = available_cores().len().min(2);
        let report = run(10_000, shards, &[]).unwrap();
        assert!(report.results_match, "{report:?}");
        assert!(report.chained_records_per_second > 0.0, "{report:?}");
        assert!(report.exchange_cost > 0.0, "{report:?}");
        assert!(report.surviving_records > 8_000, "{report:?}");
        assert!(report.records_per_second > 0.0, "{report:?}");
        assert!(report.records_per_second_per_shard > 0.0, "{report:?}");
        assert!(report.baseline_records_per_second > 0.0, "{report:?}");
        let json = serde_json::to_value(&report).unwrap();
        for field in [
            "records",
            "seconds",
            "records_per_second",
            "records_per_second_per_shard",
            "shards",
            "baseline_records_per_second",
            "chained_records_per_second",
            "exchange_cost",
            "settings",
        ] {
            assert!(json.get(field).is_some(), "missing {field} in {json}");
        }
    }

    #[test]
    fn more_shards_than_cores_is_refused() {
        let cores = available_cores().len();
        let err = run(1_000, cores + 1, &[]).unwrap_err();
        assert!(matches!(err, BenchError::TooManyShards { .. }), "{err}");
        assert!(
            err.to_string().contains(&format!("--shards {cores}")),
            "{err}"
        );
        assert!(matches!(run(1_000, 0, &[]), Err(BenchError::NoShards)));
    }

    #[test]
    fn settings_reach_the_engine() {
        let shards = available_cores().len().min(2);
        let bad = ["execution.batch-size=lots".to_string()];
        let err = run(1_000, shards, &bad).unwrap_err().to_string();
        assert!(
            err.contains("execution.batch-size") && err.contains("lots"),
            "{err}"
        );
        // More credits than a slot's segments can back: the engine refuses the job up front.
        let greedy = ["taskmanager.network.memory.buffers-per-channel=100000".to_string()];
        if shards > 1 {
            let err = run_engine(1_000, shards, &greedy).unwrap_err().to_string();
            assert!(err.contains("buffers-per-channel"), "{err}");
        }
        let fine = ["execution.batch-size=64".to_string()];
        let report = run(1_000, shards, &fine).unwrap();
        assert!(report.results_match, "{report:?}");
        assert_eq!(report.settings, fine, "{report:?}");
    }
}
