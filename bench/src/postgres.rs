//! The PostgreSQL sink benchmark: generated rows written by the PostgreSQL sink (exactly once
//! unless asked otherwise; appended, or upserted on their unique id) from one shard (one
//! subtask) into a table of a running server, against a hand-written `COPY` of the same rows
//! over one connection in one transaction (the fastest way a client loads rows). Rows per
//! second of each; the table is emptied between rounds and dropped at the end.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Instant;

use serde::Serialize;
use weir_engine::connector::{DeliveryGuarantee, PgType, PostgresSink};

use crate::error::BenchError;
use crate::measure::{alternate, generated_into, one_shard, Measurement, Versus};

const JOB: &str = "bench-postgres";

/// What `weir bench postgres --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct PostgresReport {
    /// Rows written (each run).
    pub records: u64,
    /// The checkpoint interval of the engine's runs (none: the rows commit at the end).
    pub checkpoint_interval_ms: Option<u64>,
    /// The sink's `sink.delivery-guarantee`.
    pub delivery_guarantee: &'static str,
    /// Whether the sink upserted (on `id`, the table's primary key) instead of appending.
    pub upsert: bool,
    /// The engine against the hand-written COPY, in rows per second (one subtask).
    #[serde(flatten)]
    pub versus: Versus,
    /// Checkpoints the engine's best round completed.
    pub checkpoints_completed: u64,
    /// Whether every engine round left exactly `records` rows, and no prepared transaction.
    pub results_match: bool,
}

const COLUMNS: [(&str, PgType); 4] = [
    ("id", PgType::BigInt),
    ("sensor", PgType::Integer),
    ("reading", PgType::DoublePrecision),
    ("label", PgType::Text),
];

/// Row `i`'s values.
fn row(i: u64) -> (i64, i32, f64, String) {
    (
        i as i64,
        (i % 997) as i32,
        (i % 10_000) as f64 / 8.0,
        format!("sensor-{}", i % 97),
    )
}

fn failed(what: &str) -> impl Fn(postgres::Error) -> BenchError + '_ {
    move |e| BenchError::Postgres(format!("{what}: {e}"))
}

/// How the engine writes.
#[derive(Clone, Copy, Debug)]
pub struct SinkMode {
    /// `sink.delivery-guarantee`.
    pub guarantee: DeliveryGuarantee,
    /// Upsert on `id` instead of appending.
    pub upsert: bool,
}

/// Runs the engine job on one shard into `table`.
fn run_engine(
    url: &str,
    table: &str,
    records: u64,
    checkpoint_interval_ms: Option<u64>,
    mode: SinkMode,
) -> Result<(Measurement, u64), BenchError> {
    let checkpoints = tempfile::tempdir().map_err(|source| BenchError::TempDir {
        dir: std::env::temp_dir(),
        error: source,
    })?;
    let config = one_shard(
        checkpoint_interval_ms,
        checkpoints.path(),
        mode.guarantee,
        JOB,
    )?;
    let sink = PostgresSink::new(url, table, &COLUMNS, |i: &u64, out| {
        let (id, sensor, reading, label) = row(*i);
        out.int(id)
            .int(i64::from(sensor))
            .float(reading)
            .text(&label);
    })
    .map_err(|e| BenchError::Postgres(e.message))?;
    let sink = if mode.upsert {
        sink.upsert(&["id"])
    } else {
        sink
    };
    let result = generated_into(config, records, sink, "postgres", JOB)?;
    let completed = result.checkpoints.as_ref().map_or(0, |c| c.completed);
    Ok((
        Measurement {
            duration: result.duration,
            surviving_records: records,
        },
        completed,
    ))
}

/// The hand-written load: one connection, one transaction, `COPY` of the same rows in text,
/// formatted as the sink formats them (upserting: into a temporary table, then one
/// `INSERT … ON CONFLICT DO UPDATE` from it).
fn run_baseline(
    url: &str,
    table: &str,
    records: u64,
    upsert: bool,
) -> Result<Measurement, BenchError> {
    let mut client = postgres::Client::connect(url, postgres::NoTls).map_err(failed("connect"))?;
    let started = Instant::now();
    let mut transaction = client.transaction().map_err(failed("begin"))?;
    let into = if upsert {
        transaction
            .batch_execute(&format!(
                "CREATE TEMP TABLE upserts (LIKE {table}) ON COMMIT DROP"
            ))
            .map_err(failed("create the temporary table"))?;
        "upserts"
    } else {
        table
    };
    let mut copy = transaction
        .copy_in(&format!(
            "COPY {into} (id, sensor, reading, label) FROM STDIN"
        ))
        .map_err(failed("copy"))?;
    let mut line = String::new();
    let mut chunk = Vec::with_capacity(1 << 20);
    for i in 0..records {
        let (id, sensor, reading, label) = row(i);
        line.clear();
        let _ = writeln!(line, "{id}\t{sensor}\t{reading}\t{label}");
        chunk.extend_from_slice(line.as_bytes());
        if chunk.len() >= 1 << 20 {
            copy.write_all(&chunk)
                .map_err(|e| BenchError::Postgres(format!("copy: {e}")))?;
            chunk.clear();
        }
    }
    copy.write_all(&chunk)
        .map_err(|e| BenchError::Postgres(format!("copy: {e}")))?;
    copy.finish().map_err(failed("finish the copy"))?;
    if upsert {
        transaction
            .batch_execute(&format!(
                "INSERT INTO {table} SELECT * FROM upserts ON CONFLICT (id) DO UPDATE SET \
                 sensor = EXCLUDED.sensor, reading = EXCLUDED.reading, label = EXCLUDED.label"
            ))
            .map_err(failed("upsert"))?;
    }
    transaction.commit().map_err(failed("commit"))?;
    Ok(Measurement {
        duration: started.elapsed(),
        surviving_records: records,
    })
}

/// Runs the hand-written COPY and the engine job alternately, [`crate::ROUNDS`] times each,
/// into a table of their own in the database `url`, and reports the best round of each.
pub fn run(
    url: &str,
    records: u64,
    checkpoint_interval_ms: Option<u64>,
    mode: SinkMode,
) -> Result<PostgresReport, BenchError> {
    if records == 0 {
        return Err(BenchError::NoRecords);
    }
    let table = format!("weir_bench_{}", std::process::id());
    let mut admin = postgres::Client::connect(url, postgres::NoTls).map_err(failed("connect"))?;
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id bigint NOT NULL{}, \
             sensor integer NOT NULL, reading double precision NOT NULL, label text NOT NULL)",
            if mode.upsert { " PRIMARY KEY" } else { "" }
        ))
        .map_err(failed("create the table"))?;
    let mut counts_match = true;
    let mut checkpoints = Vec::new();
    let empty = |admin: &mut postgres::Client| {
        admin
            .batch_execute(&format!("TRUNCATE {table}"))
            .map_err(failed("empty the table"))
    };
    let mut baseline_error = None;
    let outcome = alternate(
        || {
            let result =
                empty(&mut admin).and_then(|()| run_baseline(url, &table, records, mode.upsert));
            result.unwrap_or_else(|e| {
                baseline_error = Some(e);
                Measurement {
                    duration: std::time::Duration::MAX,
                    surviving_records: 0,
                }
            })
        },
        || {
            let mut check =
                postgres::Client::connect(url, postgres::NoTls).map_err(failed("connect"))?;
            empty(&mut check)?;
            let (measurement, completed) =
                run_engine(url, &table, records, checkpoint_interval_ms, mode)?;
            let rows: i64 = check
                .query_one(&format!("SELECT count(*) FROM {table}"), &[])
                .map_err(failed("count rows"))?
                .get(0);
            let prepared: i64 = check
                .query_one("SELECT count(*) FROM pg_prepared_xacts", &[])
                .map_err(failed("count prepared transactions"))?
                .get(0);
            counts_match &= rows == records as i64 && prepared == 0;
            checkpoints.push((measurement.duration, completed));
            Ok::<_, BenchError>(measurement)
        },
    );
    let _ = admin.batch_execute(&format!("DROP TABLE IF EXISTS {table}"));
    // And the sink's staging tables of upserts into it (`weir_staged_<table>_<hash>`).
    if let Ok(rows) = admin.query(
        "SELECT quote_ident(tablename) FROM pg_tables WHERE starts_with(tablename, $1)",
        &[&format!("weir_staged_{table}_")],
    ) {
        for row in rows {
            let name: String = row.get(0);
            let _ = admin.batch_execute(&format!("DROP TABLE IF EXISTS {name}"));
        }
    }
    let (engine, baseline) = outcome?;
    if let Some(error) = baseline_error {
        return Err(error);
    }
    let completed = checkpoints
        .iter()
        .find(|(duration, _)| *duration == engine.duration)
        .map_or(0, |(_, completed)| *completed);
    Ok(PostgresReport {
        records,
        checkpoint_interval_ms,
        delivery_guarantee: mode.guarantee.name(),
        upsert: mode.upsert,
        versus: Versus::of(records, &engine, &baseline),
        checkpoints_completed: completed,
        results_match: counts_match,
    })
}
