//! An exactly-once check, the shape of Flink's checkpointing ITCases: a bounded source of
//! sequence numbers, keyed; each key's state counts its records and the gaps and repeats in
//! its sequence; when the input ends (the final watermark fires each key's timer) every key
//! reports its state. Killed and resumed from its checkpoints any number of times, a run
//! still reports, for every key, every record counted once: no gap, no repeat.
//!
//! Split `s` of `splits` generates records `j = 0, 1, …` for keys `s·keys_per_split + j mod
//! keys_per_split`, key by key in turn, each key's sequence numbers counting up from 0: a key
//! comes from one split, in order, so the state can tell a lost record (a gap) from one seen
//! twice (a repeat).

use std::fmt;
use std::time::{Duration, Instant};

use weir_engine::connector::{
    Boundedness, ConnectorError, LocalBoxFuture, PgType, PostgresSink, ReadStatus, Row, Source,
    SourceReader, SourceSplit, SplitEnumerator, StaticSplits,
};
use weir_engine::prelude::*;

use crate::Output;

/// One generated record.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Numbered {
    /// The key.
    pub key: u32,
    /// Its position in the key's sequence.
    pub seq: u64,
}

/// What a key's state says at the end.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct KeyReport {
    /// The key.
    pub key: u32,
    /// Records counted.
    pub count: u64,
    /// The sequence number expected next.
    pub next: u64,
    /// Sequence numbers skipped (records lost).
    pub gaps: u64,
    /// Sequence numbers seen again (records counted twice).
    pub repeats: u64,
}

impl fmt::Display for KeyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "key {} count {} next {} gaps {} repeats {}",
            self.key, self.count, self.next, self.gaps, self.repeats
        )
    }
}

impl KeyReport {
    /// Reads a line written by `Display`.
    pub fn parse(line: &str) -> Option<KeyReport> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["key", key, "count", count, "next", next, "gaps", gaps, "repeats", repeats] => {
                Some(KeyReport {
                    key: key.parse().ok()?,
                    count: count.parse().ok()?,
                    next: next.parse().ok()?,
                    gaps: gaps.parse().ok()?,
                    repeats: repeats.parse().ok()?,
                })
            }
            _ => None,
        }
    }
}

/// The source's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SequenceSpec {
    /// Splits (readers take whole splits).
    pub splits: u32,
    /// Keys each split generates.
    pub keys_per_split: u32,
    /// Records each key gets.
    pub per_key: u64,
    /// Records per second per reader at most (unthrottled if `None`).
    pub rate: Option<f64>,
}

impl SequenceSpec {
    /// The shape `weir run sequence-check|sequence-echo --events N --keys K [--rate R]` runs:
    /// 16 splits, `keys` rounded down to a multiple of 16 (at least 16), `events` shared
    /// evenly among them.
    pub fn of_cli(events: u64, keys: u32, rate: Option<f64>) -> SequenceSpec {
        let splits = 16;
        let keys_per_split = (keys / splits).max(1);
        SequenceSpec {
            splits,
            keys_per_split,
            per_key: (events / u64::from(splits * keys_per_split)).max(1),
            rate,
        }
    }

    /// Every key.
    pub fn keys(&self) -> u32 {
        self.splits * self.keys_per_split
    }

    /// Records in all.
    pub fn records(&self) -> u64 {
        u64::from(self.keys()) * self.per_key
    }
}

/// One split and how far it has been read.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct SequenceSplit {
    /// The split.
    pub split: u32,
    /// The next record index.
    pub next: u64,
}

impl SourceSplit for SequenceSplit {
    fn split_id(&self) -> String {
        format!("sequence-{}", self.split)
    }
}

/// The bounded source of [`Numbered`] records.
#[derive(Clone, Debug)]
pub struct SequenceSource {
    spec: SequenceSpec,
}

impl SequenceSource {
    /// A source of this shape.
    pub fn new(spec: SequenceSpec) -> Self {
        SequenceSource { spec }
    }
}

impl Source<Numbered> for SequenceSource {
    type Split = SequenceSplit;

    fn boundedness(&self) -> Boundedness {
        Boundedness::Bounded
    }

    fn create_enumerator(&self, _parallelism: usize) -> Box<dyn SplitEnumerator<SequenceSplit>> {
        Box::new(StaticSplits::shared(
            (0..self.spec.splits)
                .map(|split| SequenceSplit { split, next: 0 })
                .collect(),
        ))
    }

    fn create_reader(
        &self,
        _ctx: &RuntimeContext,
    ) -> Box<dyn SourceReader<Numbered, SequenceSplit>> {
        Box::new(SequenceReader {
            spec: self.spec,
            splits: Vec::new(),
            throttle: Throttle::new(self.spec.rate),
        })
    }
}

struct SequenceReader {
    spec: SequenceSpec,
    /// Unfinished splits, with their number in the order they came.
    splits: Vec<(u32, SequenceSplit)>,
    throttle: Throttle,
}

/// Caps a reader at `rate` records per second since it started (no cap: `None`).
pub(crate) struct Throttle {
    rate: Option<f64>,
    started: Instant,
    emitted: u64,
}

impl Throttle {
    pub(crate) fn new(rate: Option<f64>) -> Self {
        Throttle {
            rate,
            started: Instant::now(),
            emitted: 0,
        }
    }

    /// How many of `max` records may go now; 0: wait.
    pub(crate) fn room(&self, max: usize) -> u64 {
        let max = max as u64;
        match self.rate {
            None => max,
            Some(rate) => {
                let allowed = (self.started.elapsed().as_secs_f64() * rate) as u64;
                max.min(allowed.saturating_sub(self.emitted))
            }
        }
    }

    /// `records` went.
    pub(crate) fn took(&mut self, records: u64) {
        self.emitted += records;
    }
}

impl SourceReader<Numbered, SequenceSplit> for SequenceReader {
    fn add_split(&mut self, split: SequenceSplit) {
        let number = self.splits.last().map_or(0, |(n, _)| n + 1);
        self.splits.push((number, split));
    }

    fn poll_next<'a>(
        &'a mut self,
        out: &'a mut Vec<Numbered>,
        max: usize,
    ) -> LocalBoxFuture<'a, Result<ReadStatus, ConnectorError>> {
        Box::pin(async move {
            let Some((number, split)) = self.splits.first_mut() else {
                return Ok(ReadStatus::NeedSplit);
            };
            let end = u64::from(self.spec.keys_per_split) * self.spec.per_key;
            if split.next >= end {
                let number = *number;
                self.splits.remove(0);
                return Ok(ReadStatus::SplitFinished { split: number });
            }
            let room = self.throttle.room(max);
            if room == 0 {
                return Ok(ReadStatus::Idle(Duration::from_millis(1)));
            }
            let first_key = split.split * self.spec.keys_per_split;
            let keys = u64::from(self.spec.keys_per_split);
            let until = end.min(split.next + room);
            for j in split.next..until {
                out.push(Numbered {
                    key: first_key + (j % keys) as u32,
                    seq: j / keys,
                });
            }
            self.throttle.took(until - split.next);
            split.next = until;
            Ok(ReadStatus::Records { split: *number })
        })
    }

    fn snapshot_splits(&self) -> Vec<SequenceSplit> {
        self.splits.iter().map(|(_, split)| split.clone()).collect()
    }
}

/// A key's state.
#[derive(Clone, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct SequenceState {
    count: u64,
    next: u64,
    gaps: u64,
    repeats: u64,
}

/// Counts each key's records, gaps and repeats; reports at the end of input.
#[derive(Clone)]
struct CheckSequence {
    state: ValueStateDescriptor<SequenceState>,
}

impl KeyedProcessFunction<u32, Numbered, KeyReport> for CheckSequence {
    fn process_element(
        &mut self,
        record: Numbered,
        ctx: &mut KeyedProcessContext<'_, u32, KeyReport>,
    ) {
        let state = ctx.value_state(&self.state);
        let mut seen = state.value().expect("read state").unwrap_or_default();
        if seen.count == 0 {
            // Fires when the input ends (the final watermark).
            ctx.register_event_time_timer(i64::MAX);
        }
        seen.count += 1;
        if record.seq >= seen.next {
            seen.gaps += record.seq - seen.next;
            seen.next = record.seq + 1;
        } else {
            seen.repeats += 1;
        }
        state.update(seen).expect("write state");
    }

    fn on_timer(&mut self, _timestamp: i64, ctx: &mut KeyedProcessContext<'_, u32, KeyReport>) {
        let key = *ctx.current_key();
        let seen = ctx.value_state(&self.state).value().expect("read state");
        if let Some(seen) = seen {
            ctx.emit(KeyReport {
                key,
                count: seen.count,
                next: seen.next,
                gaps: seen.gaps,
                repeats: seen.repeats,
            });
        }
    }
}

/// The source's records, over `spec`.
fn sequence(env: &StreamEnvironment, spec: SequenceSpec) -> DataStream<Numbered> {
    env.from_source(
        SequenceSource::new(spec),
        WatermarkStrategy::no_watermarks(),
        "sequence",
    )
    .uid("sequence")
}

/// The reports of the check over a source of shape `spec`.
pub fn reports(env: &StreamEnvironment, spec: SequenceSpec) -> DataStream<KeyReport> {
    reports_with(env, spec, |records| records)
}

/// [`reports`], with `between` applied to the source's records before the keyed check (a
/// failure injector, in the recovery tests).
pub fn reports_with(
    env: &StreamEnvironment,
    spec: SequenceSpec,
    between: impl FnOnce(DataStream<Numbered>) -> DataStream<Numbered>,
) -> DataStream<KeyReport> {
    let records = sequence(env, spec);
    between(records)
        .key_by(|record: &Numbered| record.key)
        .process(CheckSequence {
            state: ValueStateDescriptor::new("sequence"),
        })
        .name("check sequence")
        .uid("check-sequence")
}

/// Adds the check to `env`, writing its reports to `output`.
pub fn build(env: &StreamEnvironment, spec: SequenceSpec, output: Output) {
    let reports = reports(env, spec);
    match output {
        Output::Print => reports.sink_to(PrintSink::new(), "print"),
        Output::Files(dir) => reports.sink_to(FileSink::lines(dir), "files"),
        Output::Discard => reports.sink_to(DiscardSink::new(), "discard"),
    };
}

/// One record as the echo job writes it: the record, and its key's count of records
/// (itself included) in the keyed state.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Echoed {
    /// The key.
    pub key: u32,
    /// Its position in the key's sequence.
    pub seq: u64,
    /// The key's records counted so far, this one included: `seq + 1` when the state is
    /// exactly once.
    pub count: u64,
}

impl fmt::Display for Echoed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.key, self.seq, self.count)
    }
}

impl Echoed {
    /// Reads a line written by `Display`.
    pub fn parse(line: &str) -> Option<Echoed> {
        let mut fields = line.split(' ');
        let echoed = Echoed {
            key: fields.next()?.parse().ok()?,
            seq: fields.next()?.parse().ok()?,
            count: fields.next()?.parse().ok()?,
        };
        fields.next().is_none().then_some(echoed)
    }
}

/// Counts each key's records and passes every record on with the count.
#[derive(Clone)]
struct EchoSequence {
    count: ValueStateDescriptor<u64>,
}

impl KeyedProcessFunction<u32, Numbered, Echoed> for EchoSequence {
    fn process_element(
        &mut self,
        record: Numbered,
        ctx: &mut KeyedProcessContext<'_, u32, Echoed>,
    ) {
        let state = ctx.value_state(&self.count);
        let count = state.value().expect("read state").unwrap_or(0) + 1;
        state.update(count).expect("write state");
        ctx.emit(Echoed {
            key: record.key,
            seq: record.seq,
            count,
        });
    }
}

/// The echo job: every record of the source over `spec`, after a keyed count, written to
/// `output` as a line `key seq count`. Killed and resumed any number of times with the file
/// sink's exactly-once guarantee, the committed output holds every record once, each key's
/// in order ([`echo_problems`]).
pub fn build_echo(env: &StreamEnvironment, spec: SequenceSpec, output: Output) {
    let echoed = echoed(env, spec);
    match output {
        Output::Print => echoed.sink_to(PrintSink::new(), "print"),
        Output::Files(dir) => echoed.sink_to(FileSink::lines(dir), "files").uid("files"),
        Output::Discard => echoed.sink_to(DiscardSink::new(), "discard"),
    };
}

/// The echo job writing into PostgreSQL: `url_and_table` is `postgres://…/database/TABLE`;
/// the table (created if missing) takes `key integer, seq bigint, count bigint`.
pub fn build_echo_to_postgres(
    env: &StreamEnvironment,
    spec: SequenceSpec,
    url_and_table: &str,
) -> Result<(), ConnectorError> {
    let sink =
        PostgresSink::from_url(url_and_table, &ECHO_COLUMNS, echo_row)?.create_table_if_missing();
    echoed(env, spec).sink_to(sink, "postgres").uid("postgres");
    Ok(())
}

/// A record's row in the echo job's table ([`ECHO_COLUMNS`]).
pub fn echo_row(echoed: &Echoed, row: &mut Row<'_>) {
    row.int(i64::from(echoed.key))
        .int(echoed.seq as i64)
        .int(echoed.count as i64);
}

/// The echo job's columns in PostgreSQL.
pub const ECHO_COLUMNS: [(&str, PgType); 3] = [
    ("key", PgType::Integer),
    ("seq", PgType::BigInt),
    ("count", PgType::BigInt),
];

/// The echo job's records before its sink.
fn echoed(env: &StreamEnvironment, spec: SequenceSpec) -> DataStream<Echoed> {
    echoed_with(env, spec, |echoed| echoed)
}

/// [`echoed`], with `after` applied to the keyed count's output (a failure injector, in the
/// recovery tests).
pub fn echoed_with(
    env: &StreamEnvironment,
    spec: SequenceSpec,
    after: impl FnOnce(DataStream<Echoed>) -> DataStream<Echoed>,
) -> DataStream<Echoed> {
    after(
        sequence(env, spec)
            .key_by(|record: &Numbered| record.key)
            .process(EchoSequence {
                count: ValueStateDescriptor::new("count"),
            })
            .name("count")
            .uid("echo-count"),
    )
}

/// What a check of the echo job's output found: records counted by what is wrong with them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EchoCheck {
    /// Records the source generated that the output does not hold.
    pub lost: u64,
    /// Records the output holds more than once (each repeat counted).
    pub duplicated: u64,
    /// Records that come after a later record of their key (not counting repeats).
    pub out_of_order: u64,
    /// Records whose count is not their position plus one: the state counted a record twice
    /// or lost one.
    pub miscounted: u64,
    /// Lines that are no record of the source.
    pub unknown: u64,
}

impl EchoCheck {
    /// Nothing lost, duplicated, out of order or miscounted.
    pub fn is_clean(&self) -> bool {
        *self == EchoCheck::default()
    }

    /// Records written twice, and nothing else wrong: what at-least-once leaves after a
    /// failure.
    pub fn only_duplicates(&self) -> bool {
        self.duplicated > 0
            && EchoCheck {
                duplicated: 0,
                ..self.clone()
            }
            .is_clean()
    }
}

/// Checks the echo job's output over `spec`: `records`, in the order the output holds them
/// (each key's part files in the order they were written).
pub fn echo_problems(spec: SequenceSpec, records: &[Echoed]) -> EchoCheck {
    let mut check = EchoCheck::default();
    let keys = spec.keys() as usize;
    let mut seen = vec![vec![false; spec.per_key as usize]; keys];
    let mut highest: Vec<Option<u64>> = vec![None; keys];
    for record in records {
        let Some(slot) = seen
            .get_mut(record.key as usize)
            .and_then(|key| key.get_mut(record.seq as usize))
        else {
            check.unknown += 1;
            continue;
        };
        if *slot {
            check.duplicated += 1;
            continue;
        }
        *slot = true;
        let highest = &mut highest[record.key as usize];
        if highest.is_some_and(|h| h > record.seq) {
            check.out_of_order += 1;
        }
        *highest = (*highest).max(Some(record.seq));
        if record.count != record.seq + 1 {
            check.miscounted += 1;
        }
    }
    check.lost = seen.iter().flatten().filter(|seen| !**seen).count() as u64;
    check
}

/// What is wrong with `reports` for a run over `spec`: keys missing or reported twice, counts,
/// gaps and repeats — empty when every record was counted exactly once.
pub fn problems(spec: SequenceSpec, reports: &[KeyReport]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen = vec![0u32; spec.keys() as usize];
    for report in reports {
        match seen.get_mut(report.key as usize) {
            Some(times) => *times += 1,
            None => problems.push(format!(
                "key {} is not one the source generates",
                report.key
            )),
        }
        let expected = KeyReport {
            key: report.key,
            count: spec.per_key,
            next: spec.per_key,
            gaps: 0,
            repeats: 0,
        };
        if *report != expected {
            problems.push(format!("{report} (expected {expected})"));
        }
    }
    for (key, times) in seen.iter().enumerate() {
        if *times != 1 {
            problems.push(format!("key {key} reported {times} times"));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_counts_every_record_once() {
        let spec = SequenceSpec {
            splits: 3,
            keys_per_split: 5,
            per_key: 2_000,
            rate: None,
        };
        let env = StreamEnvironment::new(Configuration::default()).unwrap();
        let (sink, collected) = CollectSink::new();
        reports(&env, spec).sink_to(sink, "collect");
        env.execute("sequence-check").unwrap();
        assert_eq!(problems(spec, &collected.records()), Vec::<String>::new());
    }

    #[test]
    fn the_echo_job_writes_every_record_once_in_order() {
        let spec = SequenceSpec {
            splits: 4,
            keys_per_split: 3,
            per_key: 500,
            rate: None,
        };
        let dir = tempfile::tempdir().unwrap();
        let env = StreamEnvironment::new(Configuration::default()).unwrap();
        build_echo(&env, spec, Output::Files(dir.path().to_path_buf()));
        env.execute("sequence-echo").unwrap();
        let mut parts: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect();
        parts.sort();
        let mut records = Vec::new();
        for part in parts {
            let name = part.file_name().unwrap().to_string_lossy().into_owned();
            assert!(name.starts_with("part-"), "{name} is left in the output");
            let text = std::fs::read_to_string(&part).unwrap();
            records.extend(text.lines().map(|line| Echoed::parse(line).unwrap()));
        }
        assert_eq!(records.len() as u64, spec.records());
        assert!(echo_problems(spec, &records).is_clean());
    }

    #[test]
    fn the_echo_check_counts_what_is_wrong() {
        let spec = SequenceSpec {
            splits: 1,
            keys_per_split: 2,
            per_key: 3,
            rate: None,
        };
        let at = |key, seq| Echoed {
            key,
            seq,
            count: seq + 1,
        };
        let good = [at(0, 0), at(1, 0), at(0, 1), at(1, 1), at(0, 2), at(1, 2)];
        assert!(echo_problems(spec, &good).is_clean());
        assert!(!echo_problems(spec, &good).only_duplicates());
        let mut repeated = good.to_vec();
        repeated.push(at(0, 1));
        assert!(echo_problems(spec, &repeated).only_duplicates());
        let bad = [
            at(0, 0),
            at(0, 2),
            at(0, 1),
            at(0, 2),
            Echoed {
                count: 5,
                ..at(1, 0)
            },
            at(7, 0),
        ];
        assert_eq!(
            echo_problems(spec, &bad),
            EchoCheck {
                lost: 2,
                duplicated: 1,
                out_of_order: 1,
                miscounted: 1,
                unknown: 1,
            }
        );
        assert_eq!(
            Echoed::parse("3 4 5"),
            Some(Echoed {
                key: 3,
                seq: 4,
                count: 5
            })
        );
        assert_eq!(Echoed::parse("3 4"), None);
        assert_eq!(Echoed::parse("3 4 5 6"), None);
    }

    #[test]
    fn the_check_sees_lost_and_repeated_records() {
        let spec = SequenceSpec {
            splits: 1,
            keys_per_split: 2,
            per_key: 10,
            rate: None,
        };
        let good = |key| KeyReport {
            key,
            count: 10,
            next: 10,
            gaps: 0,
            repeats: 0,
        };
        assert!(problems(spec, &[good(0), good(1)]).is_empty());
        let lost = KeyReport {
            count: 9,
            gaps: 1,
            ..good(1)
        };
        assert_eq!(problems(spec, &[good(0), lost]).len(), 1);
        assert_eq!(problems(spec, &[good(0)]), vec!["key 1 reported 0 times"]);
        let line = good(1).to_string();
        assert_eq!(KeyReport::parse(&line), Some(good(1)));
    }
}
