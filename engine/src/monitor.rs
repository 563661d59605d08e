//! Live figures of a running job, read from any thread while it runs (`RunOptions::monitor`):
//! what an executor hands its worker for `/metrics` and the REST API. The shards' counters stay
//! single-writer (a load and a store, no read-modify-write, in the record loop); a reading
//! sums them, off the shards.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use weir_memory::{SegmentPool, SlotBudget};
use weir_state::RocksDbSlot;

use crate::metrics::{ChannelFigures, MetricsRegistry, SplitFigures, TaskMetrics};
use crate::runtime::shard::ShardLoad;
use crate::time::now_ms;

/// Upper bounds, in seconds, of the checkpoint duration histogram's buckets.
pub const CHECKPOINT_SECONDS_BUCKETS: [f64; 10] =
    [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Checkpoints kept in the history.
const HISTORY: usize = 10;

/// A running job's live figures; cloning shares them.
#[derive(Clone, Debug, Default)]
pub struct JobMonitor {
    inner: Arc<Mutex<Monitored>>,
}

#[derive(Debug, Default)]
struct Monitored {
    attempt: Option<Attempt>,
    checkpoints: Checkpoints,
    restarts: u64,
    first_record_at: Option<i64>,
    edges: Vec<EdgeFigures>,
}

/// How far the running attempt's tasks got in starting.
#[derive(Debug)]
struct Readiness {
    /// When the attempt began: before its checkpoint or savepoint was read.
    begun: Instant,
    /// Tasks built so far (their operators open, their state restored).
    ready: usize,
    /// When the last of them was, from `begun`.
    all_ready: Option<Duration>,
}

/// What the running attempt's figures are read from.
#[derive(Debug)]
struct Attempt {
    metrics: MetricsRegistry,
    loads: Vec<Arc<ShardLoad>>,
    pools: Vec<SegmentPool>,
    cores: Vec<usize>,
    memory: SlotMemory,
    started: Instant,
    readiness: Readiness,
}

/// Where an attempt's memory figures per slot come from.
pub(crate) struct SlotMemory {
    /// Each slot's shares.
    pub(crate) budget: SlotBudget,
    /// Each slot's RocksDB (none on the heap backend).
    pub(crate) rocksdb: Vec<Arc<RocksDbSlot>>,
    /// Whether a shard thread's heap use is its slot's: on the heap backend, with Weir's
    /// counting allocator. (With RocksDB a shard's figure drifts: RocksDB frees the memtables
    /// a shard allocated on its own threads.)
    pub(crate) heap_counted: bool,
}

impl std::fmt::Debug for SlotMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotMemory")
            .field("budget", &self.budget)
            .field("rocksdb", &self.rocksdb.len())
            .field("heap_counted", &self.heap_counted)
            .finish()
    }
}

/// A reading of a running job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Per operator and subtask.
    pub subtasks: Vec<SubtaskFigures>,
    /// Per task (a chain of operators in one subtask).
    #[serde(default)]
    pub tasks: Vec<TaskFigures>,
    /// Per shard (slot).
    pub shards: Vec<ShardFigures>,
    /// The job's checkpoints so far (over its restarts).
    pub checkpoints: Checkpoints,
    /// Restarts of the job's tasks inside this run (the engine's own, before a run fails).
    pub restarts: u64,
    /// Seconds since the running attempt's tasks started.
    pub uptime_seconds: f64,
    /// When the run's first record left an operator, ms since the epoch (as its executor
    /// saw it).
    #[serde(default)]
    pub first_record_at: Option<i64>,
    /// Seconds from the running attempt's start — before it read the checkpoint or savepoint
    /// it starts from, if any — to its last task built: its operators open, their state
    /// restored.
    #[serde(default)]
    pub ready_seconds: Option<f64>,
    /// Per sink subtask and source operator, how long latency markers took from one to the
    /// other (`metrics.latency.interval`).
    #[serde(default)]
    pub latency: Vec<LatencyFigures>,
    /// The edges of the job's plan between its operators.
    #[serde(default)]
    pub edges: Vec<EdgeFigures>,
}

/// One edge of a job's plan, from one operator to another: how records cross it, and where.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeFigures {
    /// The producing operator's stream node id.
    pub source: usize,
    /// The consuming operator's.
    pub target: usize,
    /// Its partitioning: `FORWARD`, `HASH`, `REBALANCE` or `BROADCAST`.
    pub partitioning: String,
    /// Whether both ends run in one task (records are handed on, through no channel).
    pub chained: bool,
    /// Its channels, one per sending and receiving subtask it connects.
    pub channels: usize,
    /// Of those, the channels between two executors of a run over several (over the
    /// network); the others stay in one process.
    pub remote_channels: usize,
}

/// The ages of one source operator's latency markers at one sink subtask: a histogram over
/// [`crate::metrics::LATENCY_SECONDS_BUCKETS`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatencyFigures {
    /// The sink's name.
    pub sink: String,
    /// Its stream node id.
    pub node: usize,
    /// The sink's subtask.
    pub subtask: usize,
    /// The source operator's name.
    pub source: String,
    /// Its stream node id.
    pub source_node: usize,
    /// Markers per bucket, one more for those above the last bound.
    pub buckets: Vec<u64>,
    /// The sum of their ages, seconds.
    pub sum_seconds: f64,
}

/// One operator in one subtask.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskFigures {
    /// The operator's name.
    pub operator: String,
    /// Its stream node id.
    pub node: usize,
    /// The subtask index.
    pub subtask: usize,
    /// Records received.
    pub records_in: u64,
    /// Records emitted.
    pub records_out: u64,
    /// Times a full segment waited for credit (backpressure from downstream).
    pub backpressure_waits: u64,
    /// Records dropped as too late for their window.
    pub late_records_dropped: u64,
    /// Bytes of the segments it sent to other shards.
    #[serde(default)]
    pub bytes_out: u64,
}

/// One task: a chain of operators in one subtask.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskFigures {
    /// Its chain, `first -> second -> …` (Flink's task name).
    pub name: String,
    /// The stream node id of its first operator, which names the task.
    pub head: usize,
    /// The stream node ids of its operators, the first one first.
    pub operators: Vec<usize>,
    /// The subtask index.
    pub subtask: usize,
    /// Seconds since it started.
    pub elapsed_seconds: f64,
    /// Seconds it worked: neither idle nor backpressured.
    pub busy_seconds: f64,
    /// Seconds it waited for input.
    pub idle_seconds: f64,
    /// Seconds it waited for credit downstream.
    pub backpressured_seconds: f64,
    /// Bytes read from other shards.
    pub bytes_in: u64,
    /// Bytes sent to other shards.
    pub bytes_out: u64,
    /// The event time its chain is at (`None` before the first watermark; `i64::MAX` once
    /// its input ended).
    pub watermark: Option<i64>,
    /// Its input channels (a task reading an exchange).
    pub channels: Vec<ChannelFigures>,
    /// Its splits (a source task whose records get watermarks).
    pub splits: Vec<SplitFigures>,
}

impl Figures {
    /// The figures of a run spread over several executors, from each one's: their subtasks,
    /// tasks, shards and latencies together, restarts summed, the longest uptime, the
    /// earliest first record, and the tasks ready once every executor's are (the latest).
    /// Checkpoints are the first executor's.
    pub fn merge<'a>(parts: impl IntoIterator<Item = &'a Figures>) -> Figures {
        let mut merged = Figures::default();
        let mut all_ready = true;
        for (i, part) in parts.into_iter().enumerate() {
            // One executor coordinates a run's checkpoints (in a run over several, the one
            // of slot 0): its counts are the run's, the others' are nothing.
            let taken = |c: &Checkpoints| c.completed + c.failed + c.savepoints;
            if i == 0 || taken(&part.checkpoints) > taken(&merged.checkpoints) {
                merged.checkpoints = part.checkpoints.clone();
            }
            // Every executor plans the whole job.
            if merged.edges.is_empty() {
                merged.edges = part.edges.clone();
            }
            merged.subtasks.extend(part.subtasks.iter().cloned());
            merged.tasks.extend(part.tasks.iter().cloned());
            merged.shards.extend(part.shards.iter().cloned());
            merged.latency.extend(part.latency.iter().cloned());
            merged.restarts += part.restarts;
            merged.uptime_seconds = merged.uptime_seconds.max(part.uptime_seconds);
            merged.first_record_at = match (merged.first_record_at, part.first_record_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            all_ready &= part.ready_seconds.is_some();
            merged.ready_seconds = match (merged.ready_seconds, part.ready_seconds) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
        if !all_ready {
            merged.ready_seconds = None;
        }
        merged.subtasks.sort_by_key(|s| (s.node, s.subtask));
        merged.tasks.sort_by_key(|t| (t.head, t.subtask));
        merged
    }

    /// The task that runs operator `node` in `subtask`.
    pub fn task_of(&self, node: usize, subtask: usize) -> Option<&TaskFigures> {
        self.tasks
            .iter()
            .find(|t| t.subtask == subtask && t.operators.contains(&node))
    }
}

/// One shard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardFigures {
    /// The shard (= slot) index.
    pub shard: usize,
    /// The core it is pinned to.
    pub core: usize,
    /// Seconds its record processing queue ran: its subtasks, and in a run spread over
    /// several executors the shard's network driver too.
    pub busy_seconds: f64,
    /// Seconds its checkpoint I/O queue ran.
    pub checkpoint_io_seconds: f64,
    /// Network segments of its pool in use.
    pub segments_used: u64,
    /// Network segments of its pool.
    pub segments_total: u64,
    /// Bytes a segment holds.
    pub segment_bytes: u64,
    /// Its managed memory share, bytes.
    #[serde(default)]
    pub managed_bytes: u64,
    /// Managed memory in use, bytes: RocksDB's block cache (which its memtables are charged
    /// to) and write-back cache; 0 on the heap backend, which uses none.
    #[serde(default)]
    pub managed_used_bytes: u64,
    /// Its heap share, bytes.
    #[serde(default)]
    pub heap_bytes: u64,
    /// Heap its thread holds, bytes: on the heap backend with Weir's counting allocator (see
    /// `SlotMemory::heap_counted`).
    #[serde(default)]
    pub heap_used_bytes: Option<u64>,
    /// Its RocksDB's memory, on the RocksDB backend.
    #[serde(default)]
    pub rocksdb: Option<RocksDbMemory>,
    /// Seconds its thread was ready to run but waited for its core while another thread ran
    /// there (Linux's run-queue delay), where the kernel keeps the figure.
    #[serde(default)]
    pub stalled_seconds: Option<f64>,
}

/// One slot's RocksDB memory, from RocksDB's own accounting.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RocksDbMemory {
    /// The block cache's capacity (memtables included), bytes.
    pub block_cache_capacity_bytes: u64,
    /// What the block cache holds: blocks, index and filter blocks, and the memtables'
    /// reservations, bytes.
    pub block_cache_usage_bytes: u64,
    /// Pinned entries of the block cache, bytes.
    pub block_cache_pinned_bytes: u64,
    /// The memtables' limit (part of the block cache), bytes.
    pub memtable_limit_bytes: u64,
    /// What the memtables hold, bytes.
    pub memtable_bytes: u64,
    /// The write-back cache's capacity (0: none), bytes.
    pub write_back_capacity_bytes: u64,
    /// What the write-back cache holds, bytes.
    pub write_back_bytes: u64,
}

/// Checkpoint counts, the duration histogram and the latest ones.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Checkpoints {
    /// Completed checkpoints (savepoints not counted).
    pub completed: u64,
    /// Checkpoints aborted (expired, declined, not committed; not those a newer one
    /// subsumed, nor savepoints).
    pub failed: u64,
    /// Completed savepoints.
    pub savepoints: u64,
    /// Completed checkpoints per duration bucket ([`CHECKPOINT_SECONDS_BUCKETS`]; not
    /// cumulative), the last entry over the highest bound.
    pub duration_buckets: Vec<u64>,
    /// Sum of the completed checkpoints' durations, seconds.
    pub duration_seconds_sum: f64,
    /// The latest checkpoints and savepoints, newest last.
    pub history: VecDeque<CheckpointRecord>,
    /// The latest completed checkpoint (kept when it falls out of the history).
    pub latest_completed: Option<CheckpointRecord>,
}

/// What a completed checkpoint's tasks took and wrote.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Completed {
    /// From trigger to commit.
    pub(crate) took: Duration,
    /// All its files' bytes.
    pub(crate) full_bytes: u64,
    /// What it wrote itself.
    pub(crate) incremental_bytes: u64,
    /// The longest any task's shard paused for its snapshot.
    pub(crate) max_pause: Duration,
    /// The longest any task's input took to align.
    pub(crate) max_alignment: Duration,
}

/// One checkpoint or savepoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// Its number.
    pub id: u64,
    /// Whether it is a savepoint.
    pub savepoint: bool,
    /// Whether it completed (else it was aborted).
    pub completed: bool,
    /// When it ended, ms since the epoch.
    pub end_timestamp: i64,
    /// From trigger to commit, ms (completed ones).
    pub duration_ms: u64,
    /// The same, µs.
    #[serde(default)]
    pub duration_us: u64,
    /// All its files, bytes.
    pub full_bytes: u64,
    /// What it wrote itself, bytes (less files shared with earlier checkpoints).
    pub incremental_bytes: u64,
    /// The longest any task's shard paused for its snapshot, ms.
    pub max_sync_pause_ms: f64,
    /// The longest any task's input took to line its barriers up, ms (Flink's alignment
    /// duration).
    #[serde(default)]
    pub max_alignment_ms: f64,
    /// Why it was aborted.
    pub failure: Option<String>,
}

impl JobMonitor {
    fn lock(&self) -> std::sync::MutexGuard<'_, Monitored> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An attempt of the job's tasks starts: read its counters from now on.
    pub(crate) fn attach(
        &self,
        metrics: MetricsRegistry,
        loads: Vec<Arc<ShardLoad>>,
        pools: Vec<SegmentPool>,
        cores: Vec<usize>,
        memory: SlotMemory,
        begun: Instant,
    ) {
        self.lock().attempt = Some(Attempt {
            metrics,
            loads,
            pools,
            cores,
            memory,
            started: Instant::now(),
            readiness: Readiness {
                begun,
                ready: 0,
                all_ready: None,
            },
        });
    }

    /// The job's plan: its edges, as figures show them.
    pub(crate) fn plan(&self, edges: Vec<EdgeFigures>) {
        self.lock().edges = edges;
    }

    /// A task of the running attempt, one of `tasks`, is built: its operators are open and
    /// their state is restored.
    pub(crate) fn task_ready(&self, tasks: usize) {
        let mut monitored = self.lock();
        if let Some(attempt) = monitored.attempt.as_mut() {
            let readiness = &mut attempt.readiness;
            readiness.ready += 1;
            if readiness.ready == tasks {
                readiness.all_ready = Some(readiness.begun.elapsed());
            }
        }
    }

    /// The attempt's tasks ended: its counters and pools are let go (a restart attaches the
    /// next attempt's).
    pub(crate) fn detach(&self) {
        let mut monitored = self.lock();
        // A run that emitted and ended between two polls of the first-record watcher: late,
        // but never missing.
        if monitored.first_record_at.is_none()
            && monitored
                .attempt
                .as_ref()
                .is_some_and(|a| a.metrics.subtasks().iter().any(|m| m.records_out.get() > 0))
        {
            monitored.first_record_at = Some(now_ms());
        }
        monitored.attempt = None;
    }

    /// Whether any operator of the running attempt emitted a record (a cheap poll).
    pub fn emitted_any(&self) -> bool {
        let monitored = self.lock();
        monitored.attempt.as_ref().is_some_and(|attempt| {
            attempt
                .metrics
                .subtasks()
                .iter()
                .any(|m| m.records_out.get() > 0)
        })
    }

    /// Whether every task of the running attempt is built (a cheap poll).
    pub fn all_ready(&self) -> bool {
        self.lock()
            .attempt
            .as_ref()
            .is_some_and(|a| a.readiness.all_ready.is_some())
    }

    /// Notes when the run's first record was emitted (the first call counts).
    pub fn first_record(&self, at_ms: i64) {
        self.lock().first_record_at.get_or_insert(at_ms);
    }

    /// The job's tasks restart.
    pub(crate) fn restarted(&self) {
        self.lock().restarts += 1;
    }

    /// A checkpoint (or savepoint) completed.
    pub(crate) fn completed(&self, id: u64, savepoint: bool, figures: Completed) {
        let Completed {
            took,
            full_bytes,
            incremental_bytes,
            max_pause,
            max_alignment,
        } = figures;
        let mut monitored = self.lock();
        let checkpoints = &mut monitored.checkpoints;
        if savepoint {
            checkpoints.savepoints += 1;
        } else {
            checkpoints.completed += 1;
            let seconds = took.as_secs_f64();
            checkpoints
                .duration_buckets
                .resize(CHECKPOINT_SECONDS_BUCKETS.len() + 1, 0);
            let bucket = CHECKPOINT_SECONDS_BUCKETS
                .iter()
                .position(|&bound| seconds <= bound)
                .unwrap_or(CHECKPOINT_SECONDS_BUCKETS.len());
            checkpoints.duration_buckets[bucket] += 1;
            checkpoints.duration_seconds_sum += seconds;
        }
        let record = CheckpointRecord {
            id,
            savepoint,
            completed: true,
            end_timestamp: now_ms(),
            duration_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            duration_us: u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            full_bytes,
            incremental_bytes,
            max_sync_pause_ms: max_pause.as_secs_f64() * 1000.0,
            max_alignment_ms: max_alignment.as_secs_f64() * 1000.0,
            failure: None,
        };
        if !savepoint {
            checkpoints.latest_completed = Some(record.clone());
        }
        checkpoints.remember(record);
    }

    /// A checkpoint was aborted.
    pub(crate) fn aborted(&self, id: u64, savepoint: bool, reason: &str) {
        let mut monitored = self.lock();
        if !savepoint {
            monitored.checkpoints.failed += 1;
        }
        monitored.checkpoints.remember(CheckpointRecord {
            id,
            savepoint,
            completed: false,
            end_timestamp: now_ms(),
            duration_ms: 0,
            duration_us: 0,
            full_bytes: 0,
            incremental_bytes: 0,
            max_sync_pause_ms: 0.0,
            max_alignment_ms: 0.0,
            failure: Some(reason.to_string()),
        });
    }

    /// Reads the figures now (`None` before the first attempt's tasks started).
    pub fn figures(&self) -> Option<Figures> {
        let monitored = self.lock();
        let attempt = monitored.attempt.as_ref()?;
        let operators = attempt.metrics.subtasks();
        let subtasks = operators
            .iter()
            .map(|m| SubtaskFigures {
                operator: m.name.clone(),
                node: m.node,
                subtask: m.subtask,
                records_in: m.records_in.get(),
                records_out: m.records_out.get(),
                backpressure_waits: m.backpressure_waits.get(),
                late_records_dropped: m.late_records_dropped.get(),
                bytes_out: m.bytes_out.get(),
            })
            .collect();
        let seconds = |ns: u64| ns as f64 / 1e9;
        let memory = &attempt.memory;
        let shards = attempt
            .loads
            .iter()
            .zip(&attempt.pools)
            .enumerate()
            .map(|(shard, (load, pool))| {
                let pool = pool.stats();
                let rocksdb = memory.rocksdb.get(shard).map(|slot| {
                    let usage = slot.memory_usage();
                    RocksDbMemory {
                        block_cache_capacity_bytes: usage.block_cache_capacity as u64,
                        block_cache_usage_bytes: usage.block_cache_usage as u64,
                        block_cache_pinned_bytes: usage.block_cache_pinned as u64,
                        memtable_limit_bytes: usage.write_buffer_limit as u64,
                        memtable_bytes: usage.write_buffer_usage as u64,
                        write_back_capacity_bytes: usage.write_back_capacity as u64,
                        write_back_bytes: usage.write_back_usage as u64,
                    }
                });
                let heap_used = memory
                    .heap_counted
                    .then(|| load.heap_bytes.load(Ordering::Relaxed));
                ShardFigures {
                    shard,
                    core: attempt.cores.get(shard).copied().unwrap_or(shard),
                    busy_seconds: seconds(load.processing_ns.load(Ordering::Relaxed)),
                    checkpoint_io_seconds: seconds(load.checkpoint_io_ns.load(Ordering::Relaxed)),
                    segments_used: pool.in_use as u64,
                    segments_total: pool.segments as u64,
                    segment_bytes: pool.segment_size as u64,
                    managed_bytes: memory.budget.managed,
                    managed_used_bytes: rocksdb
                        .as_ref()
                        .map_or(0, |r| r.block_cache_usage_bytes + r.write_back_bytes),
                    heap_bytes: memory.budget.heap,
                    heap_used_bytes: heap_used,
                    rocksdb,
                    stalled_seconds: load.stalled_ns().map(seconds),
                }
            })
            .collect();
        let latency = operators
            .iter()
            .flat_map(|sink| {
                let histograms = sink.latency.lock().unwrap_or_else(|e| e.into_inner());
                histograms
                    .iter()
                    .map(|histogram| LatencyFigures {
                        sink: sink.name.clone(),
                        node: sink.node,
                        subtask: sink.subtask,
                        source: operators
                            .iter()
                            .find(|o| o.node == histogram.source)
                            .map_or_else(|| histogram.source.to_string(), |o| o.name.clone()),
                        source_node: histogram.source,
                        buckets: histogram.buckets.clone(),
                        sum_seconds: histogram.sum_seconds,
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        Some(Figures {
            latency,
            subtasks,
            tasks: task_figures(&operators),
            shards,
            checkpoints: monitored.checkpoints.clone(),
            restarts: monitored.restarts,
            uptime_seconds: attempt.started.elapsed().as_secs_f64(),
            first_record_at: monitored.first_record_at,
            ready_seconds: attempt.readiness.all_ready.map(|ready| ready.as_secs_f64()),
            edges: monitored.edges.clone(),
        })
    }
}

/// Whether a task's, channel's or split's watermark says its input ended
/// (`Watermark::MAX`): it holds no event time back, and has none to show.
pub fn ended(watermark: Option<i64>) -> bool {
    watermark == Some(crate::record::Watermark::MAX.0)
}

/// The figures of each task the operators run in, in the order their first operators were
/// registered.
fn task_figures(operators: &[Arc<crate::metrics::OperatorMetrics>]) -> Vec<TaskFigures> {
    /// A task and its operators' (node id, name).
    type Chain<'a> = (&'a Arc<TaskMetrics>, Vec<(usize, &'a str)>);
    let mut tasks: Vec<Chain<'_>> = Vec::new();
    for operator in operators {
        let entry = (operator.node, operator.name.as_str());
        match tasks
            .iter_mut()
            .find(|(t, _)| Arc::ptr_eq(t, &operator.task))
        {
            Some((_, chain)) => chain.push(entry),
            None => tasks.push((&operator.task, vec![entry])),
        }
    }
    tasks
        .into_iter()
        .map(|(task, mut chain)| {
            // Chains run from lower to higher node ids; the head first in any case.
            chain.sort_by_key(|&(node, _)| (node != task.head, node));
            let time = task.time();
            TaskFigures {
                name: chain
                    .iter()
                    .map(|(_, name)| *name)
                    .collect::<Vec<_>>()
                    .join(" -> "),
                head: task.head,
                operators: chain.iter().map(|&(node, _)| node).collect(),
                subtask: task.subtask,
                elapsed_seconds: time.elapsed,
                busy_seconds: time.busy,
                idle_seconds: time.idle,
                backpressured_seconds: time.backpressured,
                bytes_in: task.bytes_in.get(),
                bytes_out: task.bytes_out.get(),
                watermark: task.watermark(),
                channels: task.channels(),
                splits: task.splits(),
            }
        })
        .collect()
}

impl Checkpoints {
    fn remember(&mut self, record: CheckpointRecord) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_figures_take_the_coordinating_executors_checkpoints_and_one_plan() {
        let edge = EdgeFigures {
            source: 0,
            target: 1,
            partitioning: "HASH".into(),
            chained: false,
            channels: 4,
            remote_channels: 2,
        };
        // A follower's figures first: no checkpoints of its own.
        let follower = Figures {
            edges: vec![edge.clone()],
            restarts: 1,
            ..Figures::default()
        };
        let leader = Figures {
            checkpoints: Checkpoints {
                completed: 3,
                failed: 1,
                ..Checkpoints::default()
            },
            edges: vec![edge.clone()],
            ..Figures::default()
        };
        let merged = Figures::merge([&follower, &leader]);
        assert_eq!(
            (merged.checkpoints.completed, merged.checkpoints.failed),
            (3, 1)
        );
        assert_eq!(merged.edges, vec![edge]);
        assert_eq!(merged.restarts, 1);
    }

    #[test]
    fn checkpoints_fill_their_buckets_and_keep_the_latest_ten() {
        let monitor = JobMonitor::default();
        let figures = |took, bytes, max_alignment| Completed {
            took,
            full_bytes: bytes,
            incremental_bytes: bytes / 10,
            max_pause: Duration::from_millis(2),
            max_alignment,
        };
        for id in 1..=12 {
            let took = Duration::from_millis(if id % 2 == 0 { 80 } else { 3000 });
            let aligned = Duration::from_millis(id);
            monitor.completed(id, false, figures(took, 100, aligned));
        }
        let savepoint = figures(Duration::from_millis(1), 5, Duration::ZERO);
        monitor.completed(13, true, savepoint);
        monitor.aborted(14, false, "expired");
        let checkpoints = monitor.lock().checkpoints.clone();
        assert_eq!(
            (
                checkpoints.completed,
                checkpoints.savepoints,
                checkpoints.failed
            ),
            (12, 1, 1)
        );
        // 80 ms falls in the 0.1 s bucket, 3 s in the 5 s one.
        assert_eq!(checkpoints.duration_buckets[1], 6);
        assert_eq!(checkpoints.duration_buckets[6], 6);
        assert_eq!(checkpoints.duration_buckets.iter().sum::<u64>(), 12);
        assert!((checkpoints.duration_seconds_sum - (6.0 * 0.08 + 6.0 * 3.0)).abs() < 1e-9);
        assert_eq!(checkpoints.history.len(), HISTORY);
        assert_eq!(
            checkpoints.history.back().unwrap().failure.as_deref(),
            Some("expired")
        );
        assert_eq!(checkpoints.history.front().unwrap().id, 5);
        let latest = checkpoints.latest_completed.as_ref().unwrap();
        assert_eq!((latest.id, latest.max_alignment_ms), (12, 12.0));
        assert_eq!((latest.full_bytes, latest.incremental_bytes), (100, 10));
        monitor.aborted(15, true, "declined");
        assert_eq!(
            monitor.lock().checkpoints.failed,
            1,
            "a savepoint's abort is no failed checkpoint"
        );
        assert!(monitor.figures().is_none(), "no attempt yet");
    }
}
