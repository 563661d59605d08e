//! The window benchmark: a keyed count per window — tumbling (10 s), sliding (10 s every 2 s)
//! or session (1 s gap) — on one shard, against a hand-written single-threaded loop over the
//! same records that keeps the same counts in hash maps — hashed with the same fast hasher as
//! the engine's window operators (`weir_state::StableHasher`), not std's SipHash: a hand-written
//! loop would not pay for SipHash either.
//!
//! Records are `(key, timestamp)` pairs: keys spread by a Fibonacci hash, event time advancing
//! 0.01 ms per record (100 000 records per second of event time, in order), watermarks
//! monotonous and emitted every `pipeline.auto-watermark-interval`. Both sides reduce their
//! output (key, window start, count) to an order-independent checksum, which must agree.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use weir_engine::prelude::*;
use weir_engine::window::{
    AggregateFunction, EventTimeSessionWindows, SlidingEventTimeWindows, TimeWindow,
    TumblingEventTimeWindows,
};

use weir_state::StableHasher;

use crate::error::BenchError;
use crate::measure::{alternate, Digest, DigestSink, Measurement, Versus};

/// The loop's maps: the window operators' hasher.
type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<StableHasher>>;

const JOB: &str = "bench-window";
/// Records per millisecond of event time.
const RECORDS_PER_MS: u64 = 100;
const SIZE_MS: i64 = 10_000;
const SLIDE_MS: i64 = 2_000;
const GAP_MS: i64 = 1_000;

/// Which windows to benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WindowKind {
    /// 10 s tumbling windows.
    Tumbling,
    /// 10 s windows every 2 s.
    Sliding,
    /// Sessions closed by 1 s without records of the key.
    Session,
}

impl std::str::FromStr for WindowKind {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "tumbling" => Ok(WindowKind::Tumbling),
            "sliding" => Ok(WindowKind::Sliding),
            "session" => Ok(WindowKind::Session),
            other => Err(format!(
                "unknown window kind '{other}'; use tumbling, sliding or session"
            )),
        }
    }
}

/// What `weir bench window --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct WindowReport {
    /// The window kind.
    pub kind: WindowKind,
    /// Records generated (each run).
    pub records: u64,
    /// Distinct keys.
    pub keys: u64,
    /// The engine against the loop, in records per second.
    #[serde(flatten)]
    pub versus: Versus,
    /// Window results (key, window, count) the engine emitted.
    pub windows: u64,
    /// Whether the engine's results equal the loop's (same checksum and number of windows).
    pub results_match: bool,
}

/// Record `i`: its key and event timestamp.
#[inline]
fn record(i: u64, keys: u64) -> (u64, i64) {
    let mixed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((mixed ^ (mixed >> 29)) % keys, (i / RECORDS_PER_MS) as i64)
}

/// An order-independent digest of window results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Checksum {
    windows: u64,
    digest: u64,
}

impl Checksum {
    #[inline]
    fn add(&mut self, key: u64, start: i64, count: u64) {
        let mut h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (start as u64).rotate_left(17);
        h = (h ^ count.wrapping_mul(0xC2B2_AE3D_27D4_EB4F)).wrapping_mul(0x1656_67B1_9E37_79F9);
        self.windows += 1;
        self.digest = self.digest.wrapping_add(h);
    }
}

impl Digest<(u64, i64, u64)> for Checksum {
    #[inline]
    fn add(&mut self, (key, start, count): (u64, i64, u64)) {
        Checksum::add(self, key, start, count);
    }

    fn merge(&mut self, other: Checksum) {
        self.windows += other.windows;
        self.digest = self.digest.wrapping_add(other.digest);
    }
}

#[derive(Clone)]
struct Count;

impl AggregateFunction<(u64, i64), u64, u64> for Count {
    fn create_accumulator(&self) -> u64 {
        0
    }
    #[inline]
    fn add(&self, _: (u64, i64), acc: &mut u64) {
        *acc += 1;
    }
    fn get_result(&self, acc: &u64) -> u64 {
        *acc
    }
    fn merge(&self, into: &mut u64, other: &u64) {
        *into += other;
    }
}

fn label(key: &u64, window: &TimeWindow, count: u64) -> (u64, i64, u64) {
    (*key, window.start, count)
}

/// Runs the window job on one shard.
fn run_engine(
    kind: WindowKind,
    records: u64,
    keys: u64,
) -> Result<(Measurement, Checksum), BenchError> {
    let config = Configuration::default()
        .with("taskmanager.numberOfTaskSlots", "1")
        .map_err(|e| BenchError::job(JOB)(e.into()))?;
    let env = StreamEnvironment::new(config).map_err(BenchError::job(JOB))?;
    let keyed = env
        .from_source(
            DataGeneratorSource::new(Some(records), move |i| record(i, keys)),
            WatermarkStrategy::for_monotonous_timestamps()
                .with_timestamp_assigner(|r: &(u64, i64), _| r.1),
            "generator",
        )
        .key_by(|r: &(u64, i64)| r.0);
    let counts = match kind {
        WindowKind::Tumbling => keyed
            .window(TumblingEventTimeWindows::of(Duration::from_millis(
                SIZE_MS as u64,
            )))
            .aggregate_with(Count, label),
        WindowKind::Sliding => keyed
            .window(SlidingEventTimeWindows::of(
                Duration::from_millis(SIZE_MS as u64),
                Duration::from_millis(SLIDE_MS as u64),
            ))
            .aggregate_with(Count, label),
        WindowKind::Session => keyed
            .window(EventTimeSessionWindows::with_gap(Duration::from_millis(
                GAP_MS as u64,
            )))
            .aggregate_with(Count, label),
    };
    let total = Arc::new(Mutex::new(Checksum::default()));
    counts.sink_to(
        DigestSink {
            total: Arc::clone(&total),
        },
        "checksum",
    );
    let result = env.execute(JOB).map_err(BenchError::job(JOB))?;
    let checksum = *total.lock().expect("checksum lock");
    Ok((
        Measurement {
            duration: result.duration,
            surviving_records: checksum.windows,
        },
        checksum,
    ))
}

/// The hand-written loop: the same records, counted per key and window in hash maps, in one
/// pass (it knows the input is in timestamp order, which the engine may not assume).
fn run_baseline(kind: WindowKind, records: u64, keys: u64) -> (Measurement, Checksum) {
    let started = Instant::now();
    let mut sum = Checksum::default();
    match kind {
        WindowKind::Tumbling | WindowKind::Sliding => {
            let slide = if kind == WindowKind::Tumbling {
                SIZE_MS
            } else {
                SLIDE_MS
            };
            // Per key: counts of the last `panes_per_window` panes, newest last.
            let mut panes: FastMap<u64, Vec<(i64, u64)>> = FastMap::default();
            let mut pane_end = slide;
            let flush =
                |panes: &mut FastMap<u64, Vec<(i64, u64)>>, end: i64, sum: &mut Checksum| {
                    // Windows ending at `end`: sum each key's panes inside [end - size, end).
                    panes.retain(|key, list| {
                        let count: u64 = list
                            .iter()
                            .filter(|(start, _)| *start >= end - SIZE_MS)
                            .map(|(_, c)| c)
                            .sum();
                        if count > 0 {
                            sum.add(*key, end - SIZE_MS, count);
                        }
                        list.retain(|(start, _)| *start >= end - SIZE_MS + slide);
                        !list.is_empty()
                    });
                };
            for i in 0..records {
                let (key, ts) = record(i, keys);
                while ts >= pane_end {
                    flush(&mut panes, pane_end, &mut sum);
                    pane_end += slide;
                }
                let pane = ts - ts.rem_euclid(slide);
                let list = panes.entry(key).or_default();
                match list.last_mut() {
                    Some((start, count)) if *start == pane => *count += 1,
                    _ => list.push((pane, 1)),
                }
            }
            while !panes.is_empty() {
                flush(&mut panes, pane_end, &mut sum);
                pane_end += slide;
            }
        }
        WindowKind::Session => {
            // Per key: (session start, last timestamp, count).
            let mut sessions: FastMap<u64, (i64, i64, u64)> = FastMap::default();
            for i in 0..records {
                let (key, ts) = record(i, keys);
                let session = sessions.entry(key).or_insert((ts, ts, 0));
                // A record at exactly `last + gap` still touches the session (as in Flink).
                if ts > session.1 + GAP_MS {
                    sum.add(key, session.0, session.2);
                    *session = (ts, ts, 0);
                }
                session.1 = ts;
                session.2 += 1;
            }
            for (key, (start, _, count)) in sessions {
                sum.add(key, start, count);
            }
        }
    }
    black_box(&sum);
    (
        Measurement {
            duration: started.elapsed(),
            surviving_records: sum.windows,
        },
        sum,
    )
}

/// Runs the loop and the engine alternately, [`ROUNDS`] times each; reports the best rounds.
pub fn run(kind: WindowKind, records: u64, keys: u64) -> Result<WindowReport, BenchError> {
    if records == 0 {
        return Err(BenchError::NoRecords);
    }
    let keys = keys.max(1);
    let mut engine_sum = Checksum::default();
    let mut baseline_sum = Checksum::default();
    let (engine, baseline) = alternate(
        || {
            let (m, s) = run_baseline(kind, records, keys);
            baseline_sum = s;
            m
        },
        || {
            run_engine(kind, records, keys).map(|(m, s)| {
                engine_sum = s;
                m
            })
        },
    )?;
    Ok(WindowReport {
        kind,
        records,
        keys,
        versus: Versus::of(records, &engine, &baseline),
        windows: engine_sum.windows,
        results_match: engine_sum == baseline_sum,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_matches_its_baseline() {
        for kind in [
            WindowKind::Tumbling,
            WindowKind::Sliding,
            WindowKind::Session,
        ] {
            let report = run(kind, 300_000, 100).unwrap();
            assert!(report.results_match, "{report:?}");
            assert!(report.windows > 0, "{report:?}");
            let json = serde_json::to_value(&report).unwrap();
            for field in [
                "records",
                "seconds",
                "records_per_second",
                "baseline_records_per_second",
                "results_match",
            ] {
                assert!(json.get(field).is_some(), "missing {field} in {json}");
            }
        }
    }
}
