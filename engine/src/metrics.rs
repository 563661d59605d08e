//! Per-subtask operator metrics: counters written by one shard without atomic read-modify-write
//! on the hot path, read from any thread when a report or a scrape asks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A counter with a single writer (the shard running the subtask) and any number of readers.
/// `add` is a plain load and store, not a locked increment.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Adds `n`. Only the owning subtask may call this.
    #[inline]
    pub fn add(&self, n: u64) {
        let cell = &self.0;
        cell.store(cell.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The counters of one operator in one subtask.
#[derive(Debug)]
pub struct OperatorMetrics {
    /// The stream node id of the operator.
    pub node: usize,
    /// The operator's name.
    pub name: String,
    /// The subtask index.
    pub subtask: usize,
    /// Records the operator received.
    pub records_in: Counter,
    /// Records the operator emitted.
    pub records_out: Counter,
    /// Times a full segment found no credit on its channel and the task had to wait
    /// (backpressure from downstream).
    pub backpressure_waits: Counter,
    /// Records that arrived after their window's allowed lateness and were dropped (Flink's
    /// `numLateRecordsDropped`).
    pub late_records_dropped: Counter,
}

/// A reading of one operator's counters, summed over its subtasks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorCounts {
    /// The stream node id of the operator.
    pub node: usize,
    /// The operator's name.
    pub name: String,
    /// Number of subtasks.
    pub subtasks: usize,
    /// Records received.
    pub records_in: u64,
    /// Records emitted.
    pub records_out: u64,
    /// Waits for credit.
    pub backpressure_waits: u64,
    /// Late records dropped, summed over subtasks.
    pub late_records_dropped: u64,
}

/// All operator metrics of a job.
#[derive(Clone, Debug, Default)]
pub struct MetricsRegistry {
    operators: Arc<Mutex<Vec<Arc<OperatorMetrics>>>>,
}

impl MetricsRegistry {
    /// Registers the counters of `name` in `subtask`.
    pub fn register(&self, node: usize, name: &str, subtask: usize) -> Arc<OperatorMetrics> {
        let metrics = Arc::new(OperatorMetrics {
            node,
            name: name.to_string(),
            subtask,
            records_in: Counter::default(),
            records_out: Counter::default(),
            backpressure_waits: Counter::default(),
            late_records_dropped: Counter::default(),
        });
        self.operators
            .lock()
            .expect("metrics lock")
            .push(Arc::clone(&metrics));
        metrics
    }

    /// The counters of every operator in every subtask, as registered.
    pub fn subtasks(&self) -> Vec<Arc<OperatorMetrics>> {
        self.operators.lock().expect("metrics lock").clone()
    }

    /// Current counts per operator, in stream node order.
    pub fn snapshot(&self) -> Vec<OperatorCounts> {
        let operators = self.operators.lock().expect("metrics lock");
        let mut counts: Vec<OperatorCounts> = Vec::new();
        for m in operators.iter() {
            let entry = match counts.iter_mut().find(|c| c.node == m.node) {
                Some(entry) => entry,
                None => {
                    counts.push(OperatorCounts {
                        node: m.node,
                        name: m.name.clone(),
                        subtasks: 0,
                        records_in: 0,
                        records_out: 0,
                        backpressure_waits: 0,
                        late_records_dropped: 0,
                    });
                    counts.last_mut().expect("just pushed")
                }
            };
            entry.subtasks += 1;
            entry.records_in += m.records_in.get();
            entry.records_out += m.records_out.get();
            entry.backpressure_waits += m.backpressure_waits.get();
            entry.late_records_dropped += m.late_records_dropped.get();
        }
        counts.sort_by_key(|c| c.node);
        counts
    }
}
