//! The file sink benchmark: generated records written as text lines by the transactional file
//! sink on one shard (exactly once: parts hidden while written, renamed when the checkpoint
//! after them completes, or at the end without checkpoints), against a plain buffered write of
//! the same bytes into one file (`std::io::BufWriter` of 128 KiB, synced at the end as the sink
//! syncs each part it closes). The sink writes its parts with direct I/O where the file
//! system has it.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use weir_engine::connector::DeliveryGuarantee;
use weir_engine::prelude::*;

use crate::error::BenchError;
use crate::measure::{alternate, generated_into, one_shard, Measurement, Versus};

const JOB: &str = "bench-file-sink";
const SINK: &str = "files";

/// What `weir bench file-sink --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct FileSinkReport {
    /// Records written (each run).
    pub records: u64,
    /// Bytes of text they make.
    pub bytes: u64,
    /// The checkpoint interval of the engine's runs (none: the parts commit at the end).
    pub checkpoint_interval_ms: Option<u64>,
    /// The sink's `sink.delivery-guarantee`.
    pub delivery_guarantee: &'static str,
    /// The engine against the plain write, in records per second.
    #[serde(flatten)]
    pub versus: Versus,
    /// The engine's best round in MB/s (10^6 bytes).
    pub megabytes_per_second: f64,
    /// The plain write's best round in MB/s.
    pub baseline_megabytes_per_second: f64,
    /// Part files the engine's last round committed.
    pub parts: u64,
    /// Whether the engine's committed parts hold exactly the plain write's bytes, line for
    /// line, and nothing else is left in its directory.
    pub results_match: bool,
}

/// Record `i`'s line, without its newline.
#[inline]
fn format(i: &u64, line: &mut String) {
    let _ = write!(
        line,
        "{i},{},sensor-{},{}.{:02}",
        i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 44,
        i % 997,
        i % 1000,
        i % 100
    );
}

/// A fresh directory under `base`, removed when dropped.
fn temp_dir(base: &Path) -> Result<tempfile::TempDir, BenchError> {
    tempfile::tempdir_in(base).map_err(|source| BenchError::TempDir {
        dir: base.to_path_buf(),
        error: source,
    })
}

/// What a round of the engine committed: parts, bytes and lines; and whether anything else
/// is left (a hidden part).
struct Committed {
    parts: u64,
    bytes: u64,
    lines: u64,
    others: u64,
}

fn committed(dir: &Path) -> std::io::Result<Committed> {
    let mut found = Committed {
        parts: 0,
        bytes: 0,
        lines: 0,
        others: 0,
    };
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_name().to_string_lossy().starts_with("part-") {
            found.others += 1;
            continue;
        }
        let text = std::fs::read(entry.path())?;
        found.parts += 1;
        found.bytes += text.len() as u64;
        found.lines += text.iter().filter(|&&b| b == b'\n').count() as u64;
    }
    Ok(found)
}

/// Runs the job on one shard, writing under `base`.
fn run_engine(
    records: u64,
    checkpoint_interval_ms: Option<u64>,
    guarantee: DeliveryGuarantee,
    base: &Path,
) -> Result<(Measurement, Committed), BenchError> {
    let out = temp_dir(base)?;
    let checkpoints = temp_dir(base)?;
    let config = one_shard(checkpoint_interval_ms, checkpoints.path(), guarantee, JOB)?;
    let sink = FileSink::with_formatter(out.path(), format);
    let result = generated_into(config, records, sink, SINK, JOB)?;
    let found = committed(out.path()).map_err(|source| BenchError::TempDir {
        dir: out.path().to_path_buf(),
        error: source,
    })?;
    Ok((
        Measurement {
            duration: result.duration,
            surviving_records: found.lines,
        },
        found,
    ))
}

/// The plain write: format each record into a line and write it through a 128 KiB
/// `BufWriter`, then sync the file. Returns its time and the bytes written.
fn run_baseline(records: u64, base: &Path) -> std::io::Result<(Measurement, u64)> {
    let dir = tempfile::tempdir_in(base)?;
    let path: PathBuf = dir.path().join("plain");
    let started = Instant::now();
    let mut out = std::io::BufWriter::with_capacity(128 << 10, std::fs::File::create(&path)?);
    let mut line = String::new();
    let mut bytes = 0u64;
    for i in 0..records {
        line.clear();
        format(&i, &mut line);
        line.push('\n');
        out.write_all(line.as_bytes())?;
        bytes += line.len() as u64;
    }
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok((
        Measurement {
            duration: started.elapsed(),
            surviving_records: records,
        },
        bytes,
    ))
}

/// Runs the plain write and the engine job alternately, [`crate::ROUNDS`] times each, under
/// `base`, and reports the best round of each.
pub fn run(
    records: u64,
    checkpoint_interval_ms: Option<u64>,
    guarantee: DeliveryGuarantee,
    base: &Path,
) -> Result<FileSinkReport, BenchError> {
    if records == 0 {
        return Err(BenchError::NoRecords);
    }
    let mut bytes = 0;
    let mut baseline_error = None;
    let mut last = None;
    let (engine, baseline) = alternate(
        || match run_baseline(records, base) {
            Ok((measurement, written)) => {
                bytes = written;
                measurement
            }
            Err(error) => {
                baseline_error = Some(error);
                Measurement {
                    duration: std::time::Duration::MAX,
                    surviving_records: 0,
                }
            }
        },
        || {
            let (measurement, found) =
                run_engine(records, checkpoint_interval_ms, guarantee, base)?;
            last = Some(found);
            Ok::<_, BenchError>(measurement)
        },
    )?;
    if let Some(source) = baseline_error {
        return Err(BenchError::TempDir {
            dir: base.to_path_buf(),
            error: source,
        });
    }
    let found = last.expect("at least one round");
    let mb_per_s = |m: &Measurement| bytes as f64 / 1e6 / m.duration.as_secs_f64().max(1e-9);
    Ok(FileSinkReport {
        records,
        bytes,
        checkpoint_interval_ms,
        delivery_guarantee: guarantee.name(),
        versus: Versus::of(records, &engine, &baseline),
        megabytes_per_second: mb_per_s(&engine),
        baseline_megabytes_per_second: mb_per_s(&baseline),
        parts: found.parts,
        results_match: found.bytes == bytes && found.lines == records && found.others == 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_commits_the_same_bytes_as_the_plain_write() {
        let base = tempfile::tempdir().unwrap();
        let report = run(20_000, None, DeliveryGuarantee::ExactlyOnce, base.path()).unwrap();
        assert!(report.results_match, "{report:?}");
        assert_eq!(report.parts, 1, "{report:?}");
        assert!(report.bytes > 20_000 * 20, "{report:?}");
        assert!(report.megabytes_per_second > 0.0, "{report:?}");
        let json = serde_json::to_value(&report).unwrap();
        for field in [
            "bytes",
            "megabytes_per_second",
            "baseline_megabytes_per_second",
            "slowdown",
        ] {
            assert!(json.get(field).is_some(), "missing {field} in {json}");
        }
        // Every round removed what it wrote.
        assert_eq!(std::fs::read_dir(base.path()).unwrap().count(), 0);
    }

    #[test]
    fn zero_records_is_refused() {
        let base = tempfile::tempdir().unwrap();
        assert!(matches!(
            run(0, None, DeliveryGuarantee::ExactlyOnce, base.path()),
            Err(BenchError::NoRecords)
        ));
    }
}
