//! Prometheus text exposition (the `prometheus` crate's encoder) of figures gathered at
//! scrape time: the control plane's jobs and workers, a worker's executors. Names carry the
//! `weir_` prefix and base units; counters end in `_total`.

use std::collections::BTreeMap;

use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};
use prometheus::{Encoder, TextEncoder};
use weir_engine::metrics::LATENCY_SECONDS_BUCKETS;
use weir_engine::monitor::{self, Figures, CHECKPOINT_SECONDS_BUCKETS};
use weir_engine::time::now_ms;

/// Metric families being filled, by name.
#[derive(Default)]
pub struct Exposition {
    families: BTreeMap<&'static str, MetricFamily>,
}

/// Labels of one series.
pub type Labels<'a> = &'a [(&'static str, &'a str)];

impl Exposition {
    fn family(&mut self, name: &'static str, help: &str, kind: MetricType) -> &mut MetricFamily {
        self.families.entry(name).or_insert_with(|| {
            let mut family = MetricFamily::default();
            family.set_name(name.to_string());
            family.set_help(help.to_string());
            family.set_field_type(kind);
            family
        })
    }

    fn series(labels: Labels<'_>) -> Metric {
        let mut metric = Metric::default();
        metric.set_label(
            labels
                .iter()
                .map(|(name, value)| {
                    let mut pair = LabelPair::default();
                    pair.set_name(name.to_string());
                    pair.set_value(value.to_string());
                    pair
                })
                .collect(),
        );
        metric
    }

    /// A counter (`name` ends in `_total`).
    pub fn counter(&mut self, name: &'static str, help: &str, labels: Labels<'_>, value: f64) {
        debug_assert!(name.ends_with("_total"), "{name}");
        let mut metric = Exposition::series(labels);
        let mut counter = Counter::default();
        counter.set_value(value);
        metric.set_counter(counter);
        self.family(name, help, MetricType::COUNTER)
            .mut_metric()
            .push(metric);
    }

    /// A gauge.
    pub fn gauge(&mut self, name: &'static str, help: &str, labels: Labels<'_>, value: f64) {
        let mut metric = Exposition::series(labels);
        let mut gauge = Gauge::default();
        gauge.set_value(value);
        metric.set_gauge(gauge);
        self.family(name, help, MetricType::GAUGE)
            .mut_metric()
            .push(metric);
    }

    /// A histogram from per-bucket counts (`counts[i]` observations at most `bounds[i]`
    /// and above the bound before; one more entry for those above the last bound).
    pub fn histogram(
        &mut self,
        name: &'static str,
        help: &str,
        labels: Labels<'_>,
        bounds: &[f64],
        counts: &[u64],
        sum: f64,
    ) {
        let mut metric = Exposition::series(labels);
        let mut histogram = Histogram::default();
        let mut cumulative = 0;
        let buckets = bounds
            .iter()
            .enumerate()
            .map(|(i, &bound)| {
                cumulative += counts.get(i).copied().unwrap_or(0);
                let mut bucket = Bucket::default();
                bucket.set_upper_bound(bound);
                bucket.set_cumulative_count(cumulative);
                bucket
            })
            .collect();
        histogram.set_bucket(buckets);
        histogram.set_sample_count(counts.iter().sum());
        histogram.set_sample_sum(sum);
        metric.set_histogram(histogram);
        self.family(name, help, MetricType::HISTOGRAM)
            .mut_metric()
            .push(metric);
    }

    /// The text exposition.
    pub fn render(self) -> String {
        let families: Vec<MetricFamily> = self.families.into_values().collect();
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&families, &mut out)
            .expect("the text encoder writes to memory");
        String::from_utf8(out).expect("the text encoder writes UTF-8")
    }

    /// The figures of one job's run on a worker: labels `job_id`, `job_name`, `tm_id`, and
    /// `operator_name`, `task_name`, `subtask_index` or `shard` where they apply.
    pub fn job_figures(&mut self, job_id: &str, job_name: &str, tm_id: &str, figures: &Figures) {
        let job: [(&'static str, &str); 3] =
            [("job_id", job_id), ("job_name", job_name), ("tm_id", tm_id)];
        for s in &figures.subtasks {
            let subtask = s.subtask.to_string();
            // Names repeat ("Map"); the id tells operators apart.
            let operator = s.node.to_string();
            let task = figures
                .task_of(s.node, s.subtask)
                .map_or(s.operator.as_str(), |t| t.name.as_str());
            let labels = [
                job[0],
                job[1],
                job[2],
                ("operator_id", operator.as_str()),
                ("operator_name", s.operator.as_str()),
                ("task_name", task),
                ("subtask_index", subtask.as_str()),
            ];
            self.counter(
                "weir_operator_records_in_total",
                "Records the operator received.",
                &labels,
                s.records_in as f64,
            );
            self.counter(
                "weir_operator_records_out_total",
                "Records the operator emitted.",
                &labels,
                s.records_out as f64,
            );
            self.counter(
                "weir_operator_bytes_out_total",
                "Bytes of the network segments the operator sent to other shards.",
                &labels,
                s.bytes_out as f64,
            );
            self.counter(
                "weir_operator_backpressure_waits_total",
                "Times a full network segment of the operator waited for credit downstream.",
                &labels,
                s.backpressure_waits as f64,
            );
            self.counter(
                "weir_operator_late_records_dropped_total",
                "Records dropped as later than their window's allowed lateness.",
                &labels,
                s.late_records_dropped as f64,
            );
        }
        for l in &figures.latency {
            let (sink, subtask, source) = (
                l.node.to_string(),
                l.subtask.to_string(),
                l.source_node.to_string(),
            );
            let labels = [
                job[0],
                job[1],
                job[2],
                ("operator_id", sink.as_str()),
                ("operator_name", l.sink.as_str()),
                ("subtask_index", subtask.as_str()),
                ("source_id", source.as_str()),
                ("source_name", l.source.as_str()),
            ];
            self.histogram(
                "weir_operator_latency_seconds",
                "How long latency markers took from the source operator to this sink \
                 (metrics.latency.interval).",
                &labels,
                &LATENCY_SECONDS_BUCKETS,
                &l.buckets,
                l.sum_seconds,
            );
        }
        let now = now_ms();
        for t in &figures.tasks {
            let subtask = t.subtask.to_string();
            let head = t.head.to_string();
            let labels = [
                job[0],
                job[1],
                job[2],
                ("task_id", head.as_str()),
                ("task_name", t.name.as_str()),
                ("subtask_index", subtask.as_str()),
            ];
            self.counter(
                "weir_task_busy_seconds_total",
                "Time the task worked: neither waiting for input nor for credit downstream.",
                &labels,
                t.busy_seconds,
            );
            self.counter(
                "weir_task_idle_seconds_total",
                "Time the task waited for input.",
                &labels,
                t.idle_seconds,
            );
            self.counter(
                "weir_task_backpressured_seconds_total",
                "Time the task waited for credit downstream (backpressure).",
                &labels,
                t.backpressured_seconds,
            );
            self.counter(
                "weir_task_bytes_in_total",
                "Bytes of the network segments the task read from other shards.",
                &labels,
                t.bytes_in as f64,
            );
            self.counter(
                "weir_task_bytes_out_total",
                "Bytes of the network segments the task sent to other shards.",
                &labels,
                t.bytes_out as f64,
            );
            // Before its first watermark and after its input ended a task has no event time
            // to show.
            if let Some(watermark) = t.watermark.filter(|&w| !monitor::ended(Some(w))) {
                self.gauge(
                    "weir_task_input_watermark_seconds",
                    "The event time the task is at (its input watermark; a source's, the \
                     watermark it emitted), seconds since the epoch.",
                    &labels,
                    watermark as f64 / 1000.0,
                );
                self.gauge(
                    "weir_task_watermark_lag_seconds",
                    "How far the task's event time trails the wall clock.",
                    &labels,
                    (now - watermark) as f64 / 1000.0,
                );
            }
        }
        for shard in &figures.shards {
            let index = shard.shard.to_string();
            let core = shard.core.to_string();
            let labels = [job[0], job[1], job[2], ("shard", &index), ("core", &core)];
            self.counter(
                "weir_shard_busy_seconds_total",
                "Time the shard spent processing records.",
                &labels,
                shard.busy_seconds,
            );
            self.counter(
                "weir_shard_checkpoint_io_seconds_total",
                "Time the shard spent writing checkpoints.",
                &labels,
                shard.checkpoint_io_seconds,
            );
            self.gauge(
                "weir_slot_network_memory_used_bytes",
                "Network segment memory of the slot in use.",
                &labels,
                (shard.segments_used * shard.segment_bytes) as f64,
            );
            self.gauge(
                "weir_slot_network_memory_bytes",
                "Network segment memory of the slot.",
                &labels,
                (shard.segments_total * shard.segment_bytes) as f64,
            );
            self.gauge(
                "weir_slot_managed_memory_bytes",
                "Managed memory of the slot (the state backend's share).",
                &labels,
                shard.managed_bytes as f64,
            );
            self.gauge(
                "weir_slot_managed_memory_used_bytes",
                "Managed memory of the slot in use: RocksDB's block cache (memtables charged \
                 to it) and write-back cache; 0 on the heap backend.",
                &labels,
                shard.managed_used_bytes as f64,
            );
            self.gauge(
                "weir_slot_heap_memory_bytes",
                "Heap share of the slot.",
                &labels,
                shard.heap_bytes as f64,
            );
            if let Some(used) = shard.heap_used_bytes {
                self.gauge(
                    "weir_slot_heap_memory_used_bytes",
                    "Heap the slot's shard holds (heap backend, counted by Weir's allocator).",
                    &labels,
                    used as f64,
                );
            }
            if let Some(stalled) = shard.stalled_seconds {
                self.counter(
                    "weir_shard_stalled_seconds_total",
                    "Time the shard's thread was ready to run but waited for its core while \
                     another thread ran there (Linux's run-queue delay).",
                    &labels,
                    stalled,
                );
            }
            if let Some(rocksdb) = &shard.rocksdb {
                for (name, help, value) in [
                    (
                        "weir_rocksdb_block_cache_capacity_bytes",
                        "Capacity of the slot's RocksDB block cache (memtables included).",
                        rocksdb.block_cache_capacity_bytes,
                    ),
                    (
                        "weir_rocksdb_block_cache_usage_bytes",
                        "What the slot's RocksDB block cache holds: blocks, index and filter \
                         blocks, memtable reservations.",
                        rocksdb.block_cache_usage_bytes,
                    ),
                    (
                        "weir_rocksdb_block_cache_pinned_usage_bytes",
                        "Pinned entries of the slot's RocksDB block cache.",
                        rocksdb.block_cache_pinned_bytes,
                    ),
                    (
                        "weir_rocksdb_memtable_bytes",
                        "What the slot's RocksDB memtables hold.",
                        rocksdb.memtable_bytes,
                    ),
                    (
                        "weir_rocksdb_memtable_limit_bytes",
                        "Limit of the slot's RocksDB memtables (part of the block cache).",
                        rocksdb.memtable_limit_bytes,
                    ),
                    (
                        "weir_rocksdb_write_back_cache_bytes",
                        "What the slot's write-back cache of value states holds.",
                        rocksdb.write_back_bytes,
                    ),
                    (
                        "weir_rocksdb_write_back_cache_capacity_bytes",
                        "Capacity of the slot's write-back cache of value states (0: none).",
                        rocksdb.write_back_capacity_bytes,
                    ),
                ] {
                    self.gauge(name, help, &labels, value as f64);
                }
            }
        }
        let checkpoints = &figures.checkpoints;
        for (status, count) in [
            ("completed", checkpoints.completed),
            ("failed", checkpoints.failed),
        ] {
            let labels = [job[0], job[1], job[2], ("status", status)];
            self.counter(
                "weir_job_checkpoints_total",
                "Checkpoints of the job's run, by how they ended.",
                &labels,
                count as f64,
            );
        }
        self.counter(
            "weir_job_savepoints_total",
            "Savepoints the job's run completed.",
            &job,
            checkpoints.savepoints as f64,
        );
        let mut counts = checkpoints.duration_buckets.clone();
        counts.resize(CHECKPOINT_SECONDS_BUCKETS.len() + 1, 0);
        self.histogram(
            "weir_job_checkpoint_duration_seconds",
            "Completed checkpoints' time from trigger to commit.",
            &job,
            &CHECKPOINT_SECONDS_BUCKETS,
            &counts,
            checkpoints.duration_seconds_sum,
        );
        if let Some(last) = &checkpoints.latest_completed {
            self.gauge(
                "weir_job_last_checkpoint_timestamp_seconds",
                "When the job's latest completed checkpoint completed, seconds since the epoch.",
                &job,
                last.end_timestamp as f64 / 1000.0,
            );
            self.gauge(
                "weir_job_last_checkpoint_size_bytes",
                "All files of the job's latest completed checkpoint.",
                &job,
                last.full_bytes as f64,
            );
            self.gauge(
                "weir_job_last_checkpoint_incremental_size_bytes",
                "What the job's latest completed checkpoint wrote itself.",
                &job,
                last.incremental_bytes as f64,
            );
            self.gauge(
                "weir_job_last_checkpoint_sync_pause_seconds",
                "The longest a shard paused for the latest completed checkpoint's snapshot.",
                &job,
                last.max_sync_pause_ms / 1000.0,
            );
            self.gauge(
                "weir_job_last_checkpoint_alignment_seconds",
                "The longest any task's input took to line up the latest completed \
                 checkpoint's barriers (from its first channel's barrier to its last).",
                &job,
                last.max_alignment_ms / 1000.0,
            );
        }
        self.counter(
            "weir_job_task_restarts_total",
            "Restarts of the job's tasks inside the run (the engine's, before the run fails).",
            &job,
            figures.restarts as f64,
        );
        self.gauge(
            "weir_job_run_uptime_seconds",
            "Time since the run's tasks started.",
            &job,
            figures.uptime_seconds,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_of_one_name_are_distinct_series() {
        use weir_engine::monitor::SubtaskFigures;
        let subtask = |node| SubtaskFigures {
            operator: "Map".into(),
            node,
            subtask: 0,
            records_in: 1,
            records_out: 1,
            backpressure_waits: 0,
            late_records_dropped: 0,
            bytes_out: 0,
        };
        let figures = Figures {
            subtasks: vec![subtask(1), subtask(2)],
            ..Figures::default()
        };
        let mut exposition = Exposition::default();
        exposition.job_figures("j", "job", "tm", &figures);
        let text = exposition.render();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("weir_operator_records_in_total{"))
            .collect();
        assert_eq!(series.len(), 2, "{text}");
        assert_ne!(series[0], series[1]);
        assert!(text.contains("operator_id=\"2\""), "{text}");
    }

    #[test]
    fn counters_gauges_and_histograms_render_as_prometheus_text() {
        let mut exposition = Exposition::default();
        exposition.counter("weir_x_total", "X.", &[("job_id", "a\"b")], 3.0);
        exposition.gauge("weir_y_bytes", "Y.", &[], 1.5);
        exposition.histogram("weir_z_seconds", "Z.", &[], &[0.1, 1.0], &[1, 2, 3], 9.5);
        let text = exposition.render();
        assert!(
            text.contains("# TYPE weir_x_total counter\nweir_x_total{job_id=\"a\\\"b\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("weir_y_bytes 1.5"), "{text}");
        assert!(
            text.contains("weir_z_seconds_bucket{le=\"0.1\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("weir_z_seconds_bucket{le=\"1\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("weir_z_seconds_bucket{le=\"+Inf\"} 6\n"),
            "{text}"
        );
        assert!(text.contains("weir_z_seconds_count 6\n"), "{text}");
    }
}
