//! `weir checkpoint inspect`: what a checkpoint holds — its operators by name and id, per
//! subtask the parts of its state file (keyed states with their types, key groups and entry
//! counts; timers; operator states; source splits with their positions; an unaligned
//! checkpoint's in-flight data) and the split
//! enumerators' pending splits — with every checksum verified: the files' against the
//! metadata, each keyed snapshot's own. Reading needs none of the job's types.

use std::path::{Path, PathBuf};

use serde::Serialize;
use weir_state::checkpoint::{read_verified, verify_file, CheckpointMetadata, METADATA_FILE};
use weir_state::{decode_keyed_snapshot, OperatorStateSnapshot};

use super::chain::{expand_parts, is_chain};
use super::driver::decode_payload;
use super::task_state::{decode_file, PART_KEYED, PART_OPERATOR_STATE, PART_OWN_KEYED};
use super::task_state::{PART_SPLITS, PART_TIMERS};
use crate::operator::process::read_timers;
use crate::runtime::exchange::inflight::{decode_in_flight, PART_IN_FLIGHT};
use crate::runtime::factories::read_splits;
use crate::time::TimeDomain;

/// What a checkpoint holds.
#[derive(Clone, Debug, Serialize)]
pub struct CheckpointReport {
    /// Its directory.
    pub path: PathBuf,
    /// The job's name.
    pub job: String,
    /// Its number.
    pub checkpoint: u64,
    /// When it was triggered (ms since the epoch).
    pub timestamp_ms: i64,
    /// The state backend that wrote it (`hashmap` or `rocksdb`; `None` for checkpoints of
    /// builds before it was recorded).
    pub state_backend: Option<String>,
    /// The bytes of the files it consists of (its state files, and RocksDB's, some of them
    /// shared with other checkpoints).
    pub bytes: u64,
    /// Its operators, in the job's order.
    pub operators: Vec<OperatorReport>,
    /// What is wrong with it: damaged files or parts. Empty: every checksum holds.
    pub problems: Vec<String>,
}

/// One operator of a checkpoint.
#[derive(Clone, Debug, Serialize)]
pub struct OperatorReport {
    /// Its name.
    pub name: String,
    /// Its id (the hash of its uid, or of its place in the topology).
    pub id: String,
    /// Its uid, if it has one (checkpoints before payload version 2 do not say).
    pub uid: Option<String>,
    /// Its parallelism when the checkpoint was taken.
    pub parallelism: usize,
    /// The state of each of its subtasks that wrote any.
    pub subtasks: Vec<SubtaskReport>,
    /// A source's split enumerator: the splits not handed out yet.
    pub enumerator: Option<Vec<SplitReport>>,
}

/// What one subtask of an operator wrote.
#[derive(Clone, Debug, Serialize)]
pub struct SubtaskReport {
    /// The subtask.
    pub subtask: usize,
    /// The state file it is in.
    pub file: String,
    /// Its parts.
    pub parts: Vec<PartReport>,
}

/// One part of a subtask's state.
#[derive(Clone, Debug, Serialize)]
pub struct PartReport {
    /// `keyed`, `own-keyed`, `timers`, `operator-state`, `splits` or `rocksdb`.
    pub name: String,
    /// Its encoded size (of a chain, its links').
    pub bytes: u64,
    /// A part checkpointed incrementally: the links of its chain, a full snapshot and the
    /// deltas since (its content is what they add up to).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain_links: Option<u64>,
    /// What it holds.
    pub content: PartContent,
}

/// What a part holds.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PartContent {
    /// Keyed state (canonical keyed snapshot).
    Keyed(KeyedReport),
    /// A keyed operator's timers.
    Timers {
        /// Event-time timers.
        event_time: u64,
        /// Processing-time timers.
        processing_time: u64,
    },
    /// Operator (non-keyed) states.
    OperatorState(Vec<OperatorStateReport>),
    /// A source reader's splits.
    Splits(Vec<SplitReport>),
    /// A keyed operator subtask's RocksDB checkpoint.
    RocksDb {
        /// Its files.
        files: u64,
        /// Their bytes.
        bytes: u64,
        /// Of those, the SST files, which later checkpoints share while they are live.
        sst_files: u64,
        /// Their bytes.
        sst_bytes: u64,
    },
    /// The data an unaligned checkpoint's barrier overtook in the task's input channels,
    /// replayed on restore.
    InFlight {
        /// The task's input channels.
        channels: u64,
        /// Pieces of data (a segment's or a batch's worth each).
        chunks: u64,
        /// Their bytes.
        bytes: u64,
    },
    /// A part this build does not know.
    Unknown,
}

/// A keyed snapshot.
#[derive(Clone, Debug, Serialize)]
pub struct KeyedReport {
    /// The subtask's key groups, first and last.
    pub key_groups: (u32, u32),
    /// The number of key groups of the job (max parallelism).
    pub max_parallelism: u32,
    /// The key type.
    pub key_type: String,
    /// The namespace type.
    pub namespace_type: String,
    /// Its states.
    pub states: Vec<KeyedStateReport>,
}

/// One keyed state.
#[derive(Clone, Debug, Serialize)]
pub struct KeyedStateReport {
    /// Its name.
    pub name: String,
    /// Kind and types, e.g. `ValueState<u64>`.
    pub state_type: String,
    /// Whether it has a time to live.
    pub ttl: bool,
    /// Entries (list elements and map entries count one each).
    pub entries: u64,
    /// Key groups holding any.
    pub key_groups_with_entries: u64,
}

/// One operator state.
#[derive(Clone, Debug, Serialize)]
pub struct OperatorStateReport {
    /// Its name.
    pub name: String,
    /// How it is distributed and what it holds, e.g. `ListState<u64> (split)`.
    pub state_type: String,
    /// Elements or entries.
    pub entries: u64,
}

/// One split.
#[derive(Clone, Debug, Serialize)]
pub struct SplitReport {
    /// Its id.
    pub id: String,
    /// The split with its position, as its `Debug` shows it.
    pub position: String,
    /// The subtask an enumerator keeps it for (`None`: any).
    pub kept_for: Option<usize>,
}

/// Reads the checkpoint in `path` — a `chk-<n>` directory, or a job's checkpoint directory
/// (its newest completed checkpoint) — and checks every checksum. An error says why nothing
/// could be read; damage found in files or parts is listed in [`CheckpointReport::problems`].
pub fn inspect(path: &Path) -> Result<CheckpointReport, String> {
    let dir = checkpoint_dir(path)?;
    let metadata_path = dir.join(METADATA_FILE);
    let what = metadata_path.display().to_string();
    let bytes = std::fs::read(&metadata_path).map_err(|e| format!("cannot read {what}: {e}"))?;
    let metadata = CheckpointMetadata::from_bytes(&bytes).map_err(|e| format!("{what}: {e}"))?;
    let payload = decode_payload(&metadata.payload, &what)?;
    let mut report = CheckpointReport {
        path: dir.clone(),
        job: metadata.job.clone(),
        checkpoint: metadata.checkpoint,
        timestamp_ms: metadata.timestamp_ms,
        state_backend: payload
            .backend
            .map(|backend| backend.config_name().to_string()),
        bytes: metadata.all_files().map(|file| file.len).sum(),
        operators: payload
            .operators
            .iter()
            .map(|operator| OperatorReport {
                name: operator.name.clone(),
                id: operator.id.clone(),
                uid: operator.uid.clone(),
                parallelism: operator.parallelism,
                subtasks: Vec::new(),
                enumerator: None,
            })
            .collect(),
        problems: Vec::new(),
    };
    if payload.file_subtasks.len() != metadata.files.len() {
        report.problems.push(format!(
            "{what} lists {} state files but the subtasks of {}",
            metadata.files.len(),
            payload.file_subtasks.len()
        ));
    }
    for (file, &subtask) in metadata.files.iter().zip(&payload.file_subtasks) {
        let path = dir.join(&file.name);
        let what = path.display().to_string();
        // Read once: checked against the metadata's length and CRC-32, then decoded.
        let mut parts = match read_verified(&dir, file)
            .map_err(|error| error.to_string())
            .and_then(|bytes| decode_file(&bytes, &what))
        {
            Ok(parts) => parts,
            Err(problem) => {
                report.problems.push(problem);
                continue;
            }
        };
        let chained: Vec<bool> = parts.iter().map(|(_, _, bytes)| is_chain(bytes)).collect();
        let mut chains = match expand_parts(&dir, &mut parts) {
            Ok(chains) => chains.into_iter(),
            Err(problem) => {
                report.problems.push(format!("{what}: {problem}"));
                continue;
            }
        };
        for ((operator, name, bytes), chained) in parts.into_iter().zip(chained) {
            let chain = chained.then(|| chains.next().expect("one per chain part"));
            let part = describe_part(&name, &bytes).map_err(|problem| {
                format!("{what}: operator {operator}'s part '{name}': {problem}")
            });
            let content = match part {
                Ok(content) => content,
                Err(problem) => {
                    report.problems.push(problem);
                    continue;
                }
            };
            let Some(entry) = report.operators.iter_mut().find(|o| o.id == operator) else {
                report.problems.push(format!(
                    "{what} holds state of operator {operator}, which the metadata does not list"
                ));
                continue;
            };
            let part = PartReport {
                name,
                bytes: chain.map_or(bytes.len() as u64, |(_, bytes)| bytes),
                chain_links: chain.map(|(links, _)| links as u64),
                content,
            };
            match entry.subtasks.iter_mut().find(|s| s.subtask == subtask) {
                Some(existing) => existing.parts.push(part),
                None => entry.subtasks.push(SubtaskReport {
                    subtask,
                    file: file.name.clone(),
                    parts: vec![part],
                }),
            }
        }
    }
    for file in &metadata.referenced {
        if let Err(error) = verify_file(&dir, file) {
            report.problems.push(error.to_string());
        }
    }
    for (operator, bytes) in &payload.enumerators {
        let splits = read_splits(bytes, "an enumerator's splits").map(|splits| {
            splits
                .into_iter()
                .map(|split| SplitReport {
                    id: split.id,
                    position: split.shown,
                    kept_for: split.owner,
                })
                .collect()
        });
        match (
            splits,
            report.operators.iter_mut().find(|o| &o.id == operator),
        ) {
            (Ok(splits), Some(entry)) => entry.enumerator = Some(splits),
            (Err(problem), _) => report.problems.push(format!("{what}: {problem}")),
            (_, None) => report.problems.push(format!(
                "{what} holds the enumerator of operator {operator}, which it does not list"
            )),
        }
    }
    for operator in &mut report.operators {
        operator.subtasks.sort_by_key(|subtask| subtask.subtask);
    }
    Ok(report)
}

/// The checkpoint directory `path` names: itself if it has metadata, else the newest
/// `chk-<n>` in it that has.
fn checkpoint_dir(path: &Path) -> Result<PathBuf, String> {
    if path.join(METADATA_FILE).is_file() {
        return Ok(path.to_path_buf());
    }
    let entries =
        std::fs::read_dir(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let newest = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            let number: u64 = name.to_str()?.strip_prefix("chk-")?.parse().ok()?;
            entry
                .path()
                .join(METADATA_FILE)
                .is_file()
                .then(|| (number, entry.path()))
        })
        .max_by_key(|(number, _)| *number);
    newest.map(|(_, dir)| dir).ok_or_else(|| {
        format!(
            "{} is neither a checkpoint or savepoint (a chk-<n> or savepoint-… directory with \
             {METADATA_FILE}) nor a job's \
             checkpoint directory holding a completed one; give one of those",
            path.display()
        )
    })
}

fn describe_part(name: &str, bytes: &[u8]) -> Result<PartContent, String> {
    Ok(match name {
        PART_KEYED | PART_OWN_KEYED => {
            let snapshot = decode_keyed_snapshot(bytes).map_err(|e| e.to_string())?;
            PartContent::Keyed(KeyedReport {
                key_groups: (snapshot.key_groups.start, snapshot.key_groups.end),
                max_parallelism: snapshot.max_parallelism,
                key_type: snapshot.key_type,
                namespace_type: snapshot.namespace_type,
                states: snapshot
                    .states
                    .into_iter()
                    .map(|state| {
                        let mut groups: Vec<u32> =
                            state.entries.iter().map(|e| e.key_group.0).collect();
                        groups.dedup();
                        KeyedStateReport {
                            state_type: match &state.user_key_type {
                                Some(user_key) => {
                                    format!("{}<{user_key}, {}>", state.kind, state.value_type)
                                }
                                None => format!("{}<{}>", state.kind, state.value_type),
                            },
                            name: state.name,
                            ttl: state.has_ttl,
                            entries: state.entries.len() as u64,
                            key_groups_with_entries: groups.len() as u64,
                        }
                    })
                    .collect(),
            })
        }
        PART_TIMERS => {
            let timers = read_timers(bytes)?;
            let event_time = timers
                .iter()
                .filter(|timer| timer.domain == TimeDomain::EventTime)
                .count() as u64;
            let processing_time = timers.len() as u64 - event_time;
            PartContent::Timers {
                event_time,
                processing_time,
            }
        }
        PART_OPERATOR_STATE => {
            let snapshot = OperatorStateSnapshot::from_bytes(bytes).map_err(|e| e.to_string())?;
            PartContent::OperatorState(
                snapshot
                    .states()
                    .iter()
                    .map(|state| OperatorStateReport {
                        name: state.name().to_string(),
                        state_type: state.describe(),
                        entries: state.len() as u64,
                    })
                    .collect(),
            )
        }
        PART_SPLITS => PartContent::Splits(
            read_splits(bytes, "the splits")?
                .into_iter()
                .map(|split| SplitReport {
                    id: split.id,
                    position: split.shown,
                    kept_for: split.owner,
                })
                .collect(),
        ),
        super::native::PART_ROCKSDB => {
            let files = super::native::describe(bytes)?;
            let sst: Vec<&(String, u64)> = files
                .iter()
                .filter(|(name, _)| weir_state::NativeFile::is_sst_name(name))
                .collect();
            PartContent::RocksDb {
                files: files.len() as u64,
                bytes: files.iter().map(|(_, len)| len).sum(),
                sst_files: sst.len() as u64,
                sst_bytes: sst.iter().map(|(_, len)| len).sum(),
            }
        }
        PART_IN_FLIGHT => {
            let data = decode_in_flight(bytes, "the in-flight data")?;
            PartContent::InFlight {
                channels: data.channels as u64,
                chunks: data.chunks.len() as u64,
                bytes: data
                    .chunks
                    .iter()
                    .map(|(_, chunk)| chunk.len() as u64)
                    .sum(),
            }
        }
        _ => PartContent::Unknown,
    })
}

impl std::fmt::Display for CheckpointReport {
    /// The report for people: one line per operator, subtask part and state.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "checkpoint {} of job '{}' at {} ({} bytes, taken at {} ms{})",
            self.checkpoint,
            self.job,
            self.path.display(),
            self.bytes,
            self.timestamp_ms,
            self.state_backend
                .as_ref()
                .map_or_else(String::new, |backend| format!(", state backend {backend}"))
        )?;
        for operator in &self.operators {
            let uid = operator
                .uid
                .as_ref()
                .map_or_else(String::new, |uid| format!("uid '{uid}', "));
            writeln!(
                f,
                "operator '{}' ({uid}id {}, parallelism {})",
                operator.name, operator.id, operator.parallelism
            )?;
            for subtask in &operator.subtasks {
                for part in &subtask.parts {
                    let chain = part
                        .chain_links
                        .map_or_else(String::new, |links| format!(" in a chain of {links} links"));
                    write!(
                        f,
                        "  subtask {} {} ({} bytes{chain}, {}):",
                        subtask.subtask, part.name, part.bytes, subtask.file
                    )?;
                    match &part.content {
                        PartContent::Keyed(keyed) => {
                            writeln!(
                                f,
                                " key groups {}..={} of {}, keys {}, namespaces {}",
                                keyed.key_groups.0,
                                keyed.key_groups.1,
                                keyed.max_parallelism,
                                keyed.key_type,
                                keyed.namespace_type
                            )?;
                            for state in &keyed.states {
                                writeln!(
                                    f,
                                    "    '{}' {}{}: {} entries in {} key groups",
                                    state.name,
                                    state.state_type,
                                    if state.ttl { " with TTL" } else { "" },
                                    state.entries,
                                    state.key_groups_with_entries
                                )?;
                            }
                        }
                        PartContent::Timers {
                            event_time,
                            processing_time,
                        } => writeln!(
                            f,
                            " {event_time} event-time and {processing_time} processing-time timers"
                        )?,
                        PartContent::OperatorState(states) => {
                            writeln!(f)?;
                            for state in states {
                                writeln!(
                                    f,
                                    "    '{}' {}: {} entries",
                                    state.name, state.state_type, state.entries
                                )?;
                            }
                        }
                        PartContent::Splits(splits) => {
                            writeln!(f)?;
                            for split in splits {
                                writeln!(f, "    {}: {}", split.id, split.position)?;
                            }
                        }
                        PartContent::RocksDb {
                            files,
                            bytes,
                            sst_files,
                            sst_bytes,
                        } => writeln!(
                            f,
                            " RocksDB checkpoint of {files} files, {bytes} bytes \
                             ({sst_files} SST files, {sst_bytes} bytes, shared while live)"
                        )?,
                        PartContent::InFlight {
                            channels,
                            chunks,
                            bytes,
                        } => writeln!(
                            f,
                            " in-flight data of {channels} input channels: {chunks} chunks, \
                             {bytes} bytes"
                        )?,
                        PartContent::Unknown => writeln!(f, " a part this build does not read")?,
                    }
                }
            }
            if let Some(splits) = &operator.enumerator {
                writeln!(f, "  enumerator: {} splits not handed out", splits.len())?;
                for split in splits {
                    writeln!(f, "    {}: {}", split.id, split.position)?;
                }
            }
        }
        if self.problems.is_empty() {
            writeln!(f, "every checksum holds")
        } else {
            for problem in &self.problems {
                writeln!(f, "PROBLEM: {problem}")?;
            }
            Ok(())
        }
    }
}
