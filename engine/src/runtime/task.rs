//! Subtasks: the loops that run one chain on one shard — a source task polling its reader, or
//! a network task reading its input gate — plus the output that ends a chain in a sink.

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::{self, Either, LocalBoxFuture};
use futures::FutureExt;

use super::exchange::frame::{Entries, Entry, Event};
use super::exchange::inflight::{RecordingPart, PART_IN_FLIGHT};
use super::exchange::local::LocalItem;
use super::exchange::reader::{Delivery, GateEvent, InputGate};
use super::factories::{snapshot_reader_splits, EnumeratorCell, NextSplit};
use super::shard::ReactorPasses;
use crate::checkpoint::driver::{SourceCommand, SourceMailbox, TaskCheckpointing};
use crate::checkpoint::task_state::{OperatorSnapshot, TaskState, PART_SPLITS};
use crate::checkpoint::{CheckpointBarrier, StopMode};
use crate::connector::{ConnectorError, ReadStatus, SinkWriter, SourceReader, SourceSplit};
use crate::error::{TaskError, TaskResult};
use crate::metrics::{OperatorMetrics, TaskMetrics};
use crate::operator::{nothing_to_do, scope, snapshot_operator, Batch, ChainEvent, Output};
use crate::record::{LatencyMarker, Record, Watermark};
use crate::state::OperatorStateId;
use crate::time::now_ms;
use crate::time::watermark::{SplitWatermarkTracker, WatermarkUpdate};

/// Settings every task of a job shares.
#[derive(Clone, Debug)]
pub struct TaskSettings {
    /// Records per batch between chained operators (`execution.batch-size`).
    pub batch_size: usize,
    /// `execution.buffer-timeout`.
    pub buffer_timeout: Duration,
    /// Number of key groups.
    pub max_parallelism: usize,
    /// `pipeline.auto-watermark-interval` (`None` when 0: no periodic watermarks).
    pub auto_watermark_interval: Option<Duration>,
    /// `metrics.latency.interval` (`None` when 0: no latency markers).
    pub latency_interval: Option<Duration>,
}

impl TaskSettings {
    /// Whether exchange writers send a segment after every record (buffer timeout 0).
    pub fn flush_per_record(&self) -> bool {
        self.buffer_timeout.is_zero()
    }
}

/// A runnable subtask.
pub(crate) trait Subtask {
    fn run(self: Box<Self>) -> LocalBoxFuture<'static, TaskResult>;
}

/// Decides when buffered output must be flushed (Flink's output flusher, inline in the task).
struct FlushTimer {
    timeout: Duration,
    last: Instant,
    dirty: bool,
}

impl FlushTimer {
    fn new(timeout: Duration) -> Self {
        FlushTimer {
            timeout,
            last: Instant::now(),
            dirty: false,
        }
    }

    /// Time until a flush is due, if output is pending and flushing is time-based.
    fn due_in(&self) -> Option<Duration> {
        (self.dirty && !self.timeout.is_zero())
            .then(|| self.timeout.saturating_sub(self.last.elapsed()))
    }

    async fn flush_if_due<T>(&mut self, chain: &mut Box<dyn Output<T>>) -> TaskResult {
        if self.due_in() == Some(Duration::ZERO) {
            self.flush(chain).await?;
        }
        Ok(())
    }

    async fn flush<T>(&mut self, chain: &mut Box<dyn Output<T>>) -> TaskResult {
        chain.event(ChainEvent::Flush).await?;
        self.dirty = false;
        self.last = Instant::now();
        Ok(())
    }
}

/// Fires the chain's processing-time timers that are due.
async fn fire_processing_timers<T>(chain: &mut Box<dyn Output<T>>) -> TaskResult {
    if let Some(due) = chain.next_processing_time() {
        let now = now_ms();
        if due <= now {
            chain.event(ChainEvent::ProcessingTime(now)).await?;
        }
    }
    Ok(())
}

/// How long until the chain's next processing-time timer is due.
fn until_next_timer<T>(chain: &dyn Output<T>) -> Option<Duration> {
    chain
        .next_processing_time()
        .map(|due| Duration::from_millis(due.saturating_sub(now_ms()).max(0) as u64))
}

/// The source subtask loop: poll the reader, push batches down the chain, ask the enumerator
/// for splits, end with the final watermark.
pub(crate) struct SourceTask<T, S> {
    pub(crate) reader: Box<dyn SourceReader<T, S>>,
    pub(crate) enumerator: Arc<Mutex<EnumeratorCell<S>>>,
    pub(crate) subtask: usize,
    pub(crate) chain: Box<dyn Output<T>>,
    pub(crate) settings: TaskSettings,
    pub(crate) metrics: Arc<OperatorMetrics>,
    pub(crate) cancel: Arc<AtomicBool>,
    pub(crate) watermarks: SplitWatermarkTracker<T>,
    /// Where the coordinator asks for checkpoints, when the job is checkpointed.
    pub(crate) mailbox: Option<Arc<SourceMailbox>>,
    pub(crate) checkpointing: Option<TaskCheckpointing>,
    pub(crate) operator_id: Arc<str>,
    pub(crate) operator_state: OperatorStateId,
    /// A savepoint that stops the job: sent, the source reads no more input until it ends.
    pub(crate) stopping: Option<Stopping>,
    /// The final checkpoint, once its barrier was sent: its number, and whether it completed.
    pub(crate) final_checkpoint: Option<(u64, bool)>,
    /// The chain finished (the input ended, or a draining savepoint stops the job).
    pub(crate) finished: bool,
    /// The input ended (the source waits for the final checkpoint).
    pub(crate) input_ended: bool,
    /// When the splits' watermarks are next shown to the task's figures.
    pub(crate) publish_splits_at: Instant,
    /// When the next latency marker is due, if the job sends them.
    pub(crate) next_marker: Option<Instant>,
}

/// A source waiting for the savepoint that stops its job (`checkpoint::savepoint`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stopping {
    savepoint: u64,
    mode: StopMode,
    /// The savepoint completed: the source ends.
    completed: bool,
}

/// How long a source that holds a mailbox waits for data at most before it looks into it.
const MAILBOX_POLL: Duration = Duration::from_millis(5);
/// How often a source shows its splits' watermarks to its figures.
const PUBLISH_SPLITS: Duration = Duration::from_millis(100);
/// How soon a reader the enumerator held back (a checkpoint is being taken: its trigger is in
/// the mailbox, or about to be) asks again.
const HELD_RETRY: Duration = Duration::from_millis(1);

impl ConnectorError {
    /// The task failure this connector error means, raised by `operator`.
    pub(crate) fn in_operator(self, operator: &str) -> TaskError {
        let kind = if self.bad_input {
            TaskError::user
        } else {
            TaskError::external
        };
        kind(self.message).in_operator(operator)
    }
}

impl<T: 'static, S: SourceSplit> SourceTask<T, S> {
    /// Carries out what the mailbox holds.
    async fn read_mailbox(&mut self) -> TaskResult {
        while let Some(command) = self.mailbox.as_ref().and_then(|m| m.take()) {
            match command {
                SourceCommand::TriggerCheckpoint(checkpoint) => {
                    self.checkpoint(CheckpointBarrier::checkpoint(checkpoint))
                        .await?
                }
                SourceCommand::TriggerFinalCheckpoint(checkpoint) => {
                    self.checkpoint(CheckpointBarrier::final_checkpoint(checkpoint))
                        .await?;
                    self.final_checkpoint = Some((checkpoint, false));
                }
                SourceCommand::TriggerSavepoint { savepoint, stop } => {
                    if stop == Some(StopMode::Drain) {
                        // Every event-time window and timer fires and every operator
                        // finishes before the barrier, so what they emit is in the savepoint
                        // (Flink's stop --drain).
                        self.finish_chain().await?;
                    }
                    self.checkpoint(CheckpointBarrier::savepoint(savepoint))
                        .await?;
                    self.stopping = stop.map(|mode| Stopping {
                        savepoint,
                        mode,
                        completed: false,
                    });
                }
                SourceCommand::NotifyComplete(checkpoint) => {
                    self.chain
                        .event(ChainEvent::CheckpointComplete(checkpoint))
                        .await?;
                    if let Some(stopping) = &mut self.stopping {
                        stopping.completed |= checkpoint >= stopping.savepoint;
                    }
                    if let Some((last, completed)) = &mut self.final_checkpoint {
                        *completed |= checkpoint >= *last;
                    }
                }
                SourceCommand::NotifyAborted(checkpoint) => {
                    self.chain
                        .event(ChainEvent::CheckpointAborted(checkpoint))
                        .await?;
                    // The job runs on: its sources read again — unless a draining stop
                    // finished the chain already (nothing can be read into it any more).
                    if self.stopping.is_some_and(|s| s.savepoint == checkpoint) {
                        let drained = self.stopping.is_some_and(|s| s.mode == StopMode::Drain);
                        self.stopping = None;
                        if drained && !self.input_ended {
                            return Err(TaskError::external(format!(
                                "savepoint {checkpoint}, which was to stop the job with a drain, \
                                 was aborted after the operators finished: the job restarts \
                                 from its latest checkpoint; stop it again"
                            )));
                        }
                    }
                    // The coordinator triggers the final checkpoint again.
                    if self
                        .final_checkpoint
                        .is_some_and(|(last, _)| last == checkpoint)
                    {
                        self.final_checkpoint = None;
                    }
                }
            }
        }
        Ok(())
    }

    /// Snapshots the reader's splits, sends the barrier down the chain (every operator
    /// snapshots as it passes), lets the enumerator hand this reader splits again, and has the
    /// task's state file written.
    async fn checkpoint(&mut self, barrier: CheckpointBarrier) -> TaskResult {
        let Some(checkpointing) = &self.checkpointing else {
            return Ok(());
        };
        let checkpoint = barrier.id;
        let started = Instant::now();
        let reader = &self.reader;
        snapshot_operator(
            barrier,
            &checkpointing.state,
            &self.operator_id,
            self.operator_state,
            &self.metrics.name,
            |snapshot| {
                snapshot.add(
                    PART_SPLITS,
                    snapshot_reader_splits(reader.snapshot_splits())?,
                );
                Ok(())
            },
        )?;
        self.chain.event(ChainEvent::Barrier(barrier)).await?;
        self.enumerator
            .lock()
            .expect("enumerator lock")
            .release(self.subtask, checkpoint);
        // A source aligns nothing.
        checkpointing.write_snapshot(checkpoint, started.elapsed(), Duration::ZERO);
        Ok(())
    }

    /// Sends on what the watermark tracker decided: status changes and advanced watermarks.
    /// Returns whether anything was sent (it waits in the output buffers until a flush).
    async fn emit_watermarks(&mut self, updates: &mut Vec<WatermarkUpdate>) -> TaskResult<bool> {
        self.watermarks.updates(updates);
        let emitted = !updates.is_empty();
        for update in std::mem::take(updates) {
            self.emit_update(update).await?;
        }
        Ok(emitted)
    }

    async fn emit_update(&mut self, update: WatermarkUpdate) -> TaskResult {
        match update {
            WatermarkUpdate::Advanced(watermark) => {
                self.metrics.task.set_watermark(watermark.0);
                self.chain.event(ChainEvent::Watermark(watermark)).await
            }
            WatermarkUpdate::Idle => {
                self.chain
                    .event(ChainEvent::WatermarkStatus { idle: true })
                    .await
            }
            WatermarkUpdate::Active => {
                self.chain
                    .event(ChainEvent::WatermarkStatus { idle: false })
                    .await
            }
        }
    }

    /// Pushes `batch` down the chain with the watermarks a per-record generator emitted
    /// between its records, each after the records that precede it.
    async fn push_with_cuts(
        &mut self,
        batch: &mut Batch<T>,
        cuts: &mut Vec<(usize, WatermarkUpdate)>,
    ) -> TaskResult {
        let mut part = Batch::with_capacity(batch.len());
        let mut next_cut = 0;
        let mut records = std::mem::take(batch);
        for (position, (record, timestamp)) in records.drain().enumerate() {
            while next_cut < cuts.len() && cuts[next_cut].0 == position {
                if !part.is_empty() {
                    self.chain.push(&mut part).await?;
                }
                self.emit_update(cuts[next_cut].1).await?;
                next_cut += 1;
            }
            part.push(record, timestamp);
        }
        if !part.is_empty() {
            self.chain.push(&mut part).await?;
        }
        for &(_, update) in &cuts[next_cut..] {
            self.emit_update(update).await?;
        }
        cuts.clear();
        *batch = records;
        Ok(())
    }

    async fn run_loop(mut self) -> TaskResult {
        let mut batch = Batch::with_capacity(self.settings.batch_size);
        let mut updates = Vec::new();
        let mut cuts = Vec::new();
        let mut timer = FlushTimer::new(self.settings.buffer_timeout);
        let mut passes = ReactorPasses::new();
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(TaskError::consequence("the job was cancelled"));
            }
            if self.mailbox.is_some() {
                self.read_mailbox().await?;
            }
            if let Some(stopping) = self.stopping {
                match (stopping.completed, stopping.mode) {
                    (true, StopMode::Drain) => break,
                    (true, StopMode::Suspend) => {
                        return self.chain.event(ChainEvent::Suspend).await;
                    }
                    // Nothing more is read until the savepoint completes or is aborted.
                    (false, _) => {
                        let _idle = self.metrics.task.idle();
                        glommio::timer::sleep(MAILBOX_POLL).await;
                        continue;
                    }
                }
            }
            let status = {
                let _scope = scope::enter(&self.metrics.name);
                self.reader
                    .poll_next(&mut batch.records, self.settings.batch_size)
                    .await
            };
            match status.map_err(|e| e.in_operator(&self.metrics.name))? {
                ReadStatus::Records { split } => {
                    if !batch.is_empty() {
                        if self.watermarks.generates() {
                            let _scope = scope::enter(&self.metrics.name);
                            self.watermarks.on_records(
                                split,
                                &batch.records,
                                &mut batch.timestamps,
                                &mut cuts,
                            );
                        } else {
                            batch.stamp_missing();
                        }
                        self.metrics.records_out.add(batch.len() as u64);
                        if cuts.is_empty() {
                            self.chain.push(&mut batch).await?;
                        } else {
                            self.push_with_cuts(&mut batch, &mut cuts).await?;
                        }
                        timer.dirty = true;
                    }
                }
                ReadStatus::SplitFinished { split } => {
                    self.watermarks.on_split_finished(split);
                    self.metrics.task.split_finished(split);
                }
                ReadStatus::NeedSplit => {
                    let next = self
                        .enumerator
                        .lock()
                        .expect("enumerator lock")
                        .next_split(self.subtask);
                    match next {
                        NextSplit::Split(split) => {
                            let number = self.watermarks.on_split_added();
                            self.metrics.task.split_added(number, split.split_id());
                            self.reader.add_split(split);
                        }
                        NextSplit::NoMore => break,
                        NextSplit::Held => {
                            let _idle = self.metrics.task.idle();
                            glommio::timer::sleep(HELD_RETRY).await
                        }
                    }
                }
                ReadStatus::Idle(wait) => {
                    if timer.dirty {
                        timer.flush(&mut self.chain).await?;
                    }
                    let mut wait = wait.min(Duration::from_millis(100));
                    if self.mailbox.is_some() {
                        wait = wait.min(MAILBOX_POLL);
                    }
                    if let Some(periodic) = self.watermarks.next_periodic() {
                        wait = wait.min(periodic.saturating_duration_since(Instant::now()));
                    }
                    if let Some(timer) = until_next_timer(&*self.chain) {
                        wait = wait.min(timer);
                    }
                    if let Some(marker) = self.next_marker {
                        wait = wait.min(marker.saturating_duration_since(Instant::now()));
                    }
                    let _idle = self.metrics.task.idle();
                    glommio::timer::sleep(wait).await;
                }
            }
            // A marker waits in an open segment like a record: the buffer timeout sends it.
            timer.dirty |= self.mark_latency().await?;
            if self.watermarks.generates() {
                let now = Instant::now();
                self.watermarks.on_periodic(now);
                if now >= self.publish_splits_at {
                    self.metrics.task.set_splits(self.watermarks.split_states());
                    self.publish_splits_at = now + PUBLISH_SPLITS;
                }
                timer.dirty |= self.emit_watermarks(&mut updates).await?;
            }
            fire_processing_timers(&mut self.chain).await?;
            timer.flush_if_due(&mut self.chain).await?;
            passes.pass_if_due().await;
            glommio::yield_if_needed().await;
        }
        // A job stopped with a draining savepoint ends with it; otherwise a checkpointed job
        // ends with its final checkpoint.
        let drained = self.stopping.is_some_and(|s| s.completed);
        self.finish_chain().await?;
        let end = match &self.checkpointing {
            Some(checkpointing) if !drained => {
                self.input_ended = true;
                checkpointing.job.input_ended();
                self.await_final_checkpoint().await?
            }
            _ => ChainEvent::End,
        };
        self.chain.event(end).await
    }

    /// Sends a latency marker down the chain if one is due: stamped now, behind the records
    /// sent before it. Whether it sent one.
    async fn mark_latency(&mut self) -> TaskResult<bool> {
        let (Some(due), Some(interval)) = (self.next_marker, self.settings.latency_interval) else {
            return Ok(false);
        };
        let now = Instant::now();
        if now < due {
            return Ok(false);
        }
        self.next_marker = Some(now + interval);
        let marker = LatencyMarker {
            marked_ms: now_ms(),
            source: self.metrics.node as u32,
            subtask: self.subtask as u32,
        };
        self.chain.event(ChainEvent::LatencyMarker(marker)).await?;
        Ok(true)
    }

    /// Sends the final watermark and finishes the chain (operators emit what is left), once.
    async fn finish_chain(&mut self) -> TaskResult {
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        self.metrics.task.set_watermark(Watermark::MAX.0);
        self.chain
            .event(ChainEvent::Watermark(Watermark::MAX))
            .await?;
        self.chain.event(ChainEvent::Finish).await
    }

    /// The input ended and the chain finished: answers the mailbox — checkpoints, with
    /// nothing left to read — until the final checkpoint's completion passed down the chain
    /// (`End` follows), or a savepoint that stops the job completed (`Suspend` or `End`).
    async fn await_final_checkpoint(&mut self) -> TaskResult<ChainEvent> {
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(TaskError::consequence("the job was cancelled"));
            }
            self.read_mailbox().await?;
            if self
                .final_checkpoint
                .is_some_and(|(_, completed)| completed)
            {
                return Ok(ChainEvent::End);
            }
            if let Some(stopping) = self.stopping.filter(|s| s.completed) {
                return Ok(match stopping.mode {
                    StopMode::Suspend => ChainEvent::Suspend,
                    StopMode::Drain => ChainEvent::End,
                });
            }
            let _idle = self.metrics.task.idle();
            glommio::timer::sleep(MAILBOX_POLL).await;
        }
    }
}

impl<T: 'static, S: SourceSplit> Subtask for SourceTask<T, S> {
    fn run(self: Box<Self>) -> LocalBoxFuture<'static, TaskResult> {
        Box::pin(self.run_loop())
    }
}

/// The loop of a subtask whose chain starts at an exchange: read deliveries from the input
/// gate — segments decoded in place into batches, local batches pushed as they come — and
/// forward watermarks and end of input.
pub(crate) struct NetworkTask<T> {
    pub(crate) gate: InputGate<T>,
    pub(crate) chain: Box<dyn Output<T>>,
    pub(crate) settings: TaskSettings,
    pub(crate) checkpointing: Option<TaskCheckpointing>,
    /// Set when the job stops (a subtask failed, or it is cancelled): the task stops at its
    /// next delivery rather than working through the input queued for it.
    pub(crate) cancel: Arc<AtomicBool>,
    /// Its time, bytes read and event time.
    pub(crate) metrics: Arc<TaskMetrics>,
}

impl<T: Record> NetworkTask<T> {
    async fn on_gate_events(&mut self, events: &mut Vec<GateEvent>) -> TaskResult {
        for event in events.drain(..) {
            match event {
                GateEvent::Watermark(watermark) => {
                    self.metrics.set_watermark(watermark.0);
                    self.chain.event(ChainEvent::Watermark(watermark)).await?
                }
                GateEvent::Status { idle } => {
                    self.chain
                        .event(ChainEvent::WatermarkStatus { idle })
                        .await?
                }
                GateEvent::Barrier(barrier) => {
                    let started = Instant::now();
                    if let (Some(checkpointing), Some(recording)) =
                        (&self.checkpointing, self.gate.take_recording(barrier.id))
                    {
                        // An unaligned checkpoint: the data its barrier overtook is written
                        // once it is all in.
                        let mut snapshot = OperatorSnapshot::new(barrier.kind);
                        snapshot.add_deferred(PART_IN_FLIGHT, RecordingPart::part(recording));
                        checkpointing.state.add(&checkpointing.operator, snapshot);
                    }
                    self.chain.event(ChainEvent::Barrier(barrier)).await?;
                    if let Some(checkpointing) = &self.checkpointing {
                        let alignment = self.gate.alignment_of(barrier.id).unwrap_or_default();
                        checkpointing.write_snapshot(barrier.id, started.elapsed(), alignment);
                    }
                }
                GateEvent::CheckpointComplete(checkpoint) => {
                    self.chain
                        .event(ChainEvent::CheckpointComplete(checkpoint))
                        .await?
                }
                GateEvent::CheckpointAborted(checkpoint) => {
                    self.chain
                        .event(ChainEvent::CheckpointAborted(checkpoint))
                        .await?
                }
                GateEvent::EndOfData => self.chain.event(ChainEvent::Finish).await?,
            }
        }
        Ok(())
    }

    async fn on_event(
        &mut self,
        channel: usize,
        event: Event,
        events: &mut Vec<GateEvent>,
    ) -> TaskResult {
        // What changes the channel's event time, shown to the task's figures.
        let timed = matches!(
            event,
            Event::Watermark(_)
                | Event::WatermarkStatus { .. }
                | Event::EndOfPartition
                | Event::EndOfData
        );
        match event {
            // It passes at once, ahead of what the gate may still hold of other channels.
            Event::LatencyMarker(marker) => {
                return self.chain.event(ChainEvent::LatencyMarker(marker)).await;
            }
            Event::Watermark(w) => self.gate.on_watermark(channel, w, events),
            Event::WatermarkStatus { idle } => self.gate.on_watermark_status(channel, idle, events),
            Event::EndOfPartition => self.gate.on_end_of_partition(channel, events),
            Event::EndOfData => self.gate.on_end_of_data(channel, events),
            Event::Suspend => self.gate.on_suspend(channel, events),
            Event::Barrier(barrier) => self.gate.on_barrier(channel, barrier, events),
            Event::CheckpointComplete(checkpoint) => {
                self.gate.on_checkpoint_notice(checkpoint, true, events)
            }
            Event::CheckpointAborted(checkpoint) => {
                self.gate.on_checkpoint_notice(checkpoint, false, events)
            }
        }
        if timed {
            let (watermark, idle) = self.gate.channel_time(channel);
            self.metrics.set_channel(channel, watermark, idle);
        }
        self.on_gate_events(events).await
    }

    /// Decodes a segment's records (or in-flight data's) into `batch` and pushes them down
    /// the chain, with its events in order.
    async fn on_entries(
        &mut self,
        channel: usize,
        filled: &[u8],
        replayed: bool,
        batch: &mut Batch<T>,
        events: &mut Vec<GateEvent>,
    ) -> TaskResult {
        let mut barrier = false;
        for entry in Entries::of(filled) {
            if barrier {
                return Err(TaskError::internal(
                    "a segment holds entries after a checkpoint barrier (a barrier ends its segment)",
                ));
            }
            match entry {
                Entry::Record(bytes, timestamp) => {
                    // SAFETY: the sender wrote these bytes with `T::encode` at a 16-byte
                    // aligned offset of a page-aligned segment (see `frame`), or of a 16-byte
                    // aligned chunk of in-flight data (`inflight`); a segment from another
                    // process passed `frame::check_segment::<T>` in the input gate before it
                    // was delivered. Both ends of an edge are built from one typed API call
                    // (`DataStream<T>` feeding an operator of input `T`), so the sender's
                    // type is this task's `T`.
                    batch.push(unsafe { T::decode(bytes) }, timestamp);
                    if batch.len() >= self.settings.batch_size {
                        self.chain.push(batch).await?;
                    }
                }
                Entry::Event(event) => {
                    if !batch.is_empty() {
                        self.chain.push(batch).await?;
                    }
                    barrier = matches!(event, Event::Barrier(_));
                    // Restored in-flight data holds the barriers and notices of checkpoints
                    // before the one restored, and latency markers of the run before: passed
                    // over.
                    let stale = barrier
                        || matches!(
                            event,
                            Event::CheckpointComplete(_)
                                | Event::CheckpointAborted(_)
                                | Event::LatencyMarker(_)
                        );
                    if !(replayed && stale) {
                        self.on_event(channel, event, events).await?;
                    }
                }
            }
        }
        if !batch.is_empty() {
            self.chain.push(batch).await?;
        }
        Ok(())
    }

    /// Waits for the next delivery, firing processing-time timers (and sending what they
    /// emit) when they come due meanwhile.
    /// A checkpoint whose alignment times out meanwhile goes unaligned then.
    async fn wait(&mut self, timer: &mut FlushTimer) -> TaskResult<Option<(usize, Delivery<T>)>> {
        let mut events = Vec::new();
        loop {
            let deadline = self
                .gate
                .alignment_deadline()
                .map(|deadline| deadline.saturating_duration_since(Instant::now()));
            let wait = match (until_next_timer(&*self.chain), deadline) {
                (None, None) => {
                    let _idle = self.metrics.idle();
                    return self.gate.next().await;
                }
                (timer, deadline) => timer
                    .unwrap_or(Duration::MAX)
                    .min(deadline.unwrap_or(Duration::MAX)),
            };
            let sleep = glommio::timer::sleep(wait);
            let woken = {
                let _idle = self.metrics.idle();
                match future::select(Box::pin(self.gate.next()), Box::pin(sleep)).await {
                    Either::Left((next, _)) => Some(next),
                    Either::Right(_) => None,
                }
            };
            if let Some(next) = woken {
                return next;
            }
            self.gate.poll_checkpoint(&mut events);
            self.on_gate_events(&mut events).await?;
            fire_processing_timers(&mut self.chain).await?;
            timer.flush(&mut self.chain).await?;
        }
    }

    async fn run_loop(mut self) -> TaskResult {
        let mut batch: Batch<T> = Batch::with_capacity(self.settings.batch_size);
        let mut events = Vec::new();
        let mut timer = FlushTimer::new(self.settings.buffer_timeout);
        loop {
            self.gate.poll_checkpoint(&mut events);
            if !events.is_empty() {
                self.on_gate_events(&mut events).await?;
            }
            let next = match self.gate.next().now_or_never() {
                Some(next) => next?,
                None => {
                    // Nothing to read: send what is buffered now rather than at the buffer
                    // timeout (as a source does when it idles). A task that keeps up with its
                    // input so arms no flush timer: arming and cancelling one each time its
                    // input ran dry cost more than the records it moved.
                    if timer.dirty {
                        timer.flush(&mut self.chain).await?;
                    }
                    self.wait(&mut timer).await?
                }
            };
            let Some((channel, delivery)) = next else {
                break;
            };
            match delivery {
                Delivery::Segment(segment) => {
                    self.on_entries(channel, segment.filled(), false, &mut batch, &mut events)
                        .await?
                }
                Delivery::Recorded(chunk) => {
                    self.on_entries(channel, &chunk, false, &mut batch, &mut events)
                        .await?
                }
                Delivery::Restored(chunk) => {
                    self.on_entries(channel, &chunk, true, &mut batch, &mut events)
                        .await?
                }
                Delivery::Local(LocalItem::Records(mut records)) => {
                    self.chain.push(&mut records).await?;
                    self.gate.recycle(channel, records);
                }
                Delivery::Local(LocalItem::Event(event)) => {
                    self.on_event(channel, event, &mut events).await?
                }
            }
            if self.cancel.load(Ordering::Relaxed) {
                return Err(TaskError::consequence("the job was cancelled"));
            }
            timer.dirty = true;
            fire_processing_timers(&mut self.chain).await?;
            timer.flush_if_due(&mut self.chain).await?;
            // A task whose input never runs dry would otherwise keep its shard from the other
            // tasks there: a source feeding it (and reading its mailbox), checkpoint writers.
            glommio::yield_if_needed().await;
        }
        if self.gate.is_suspended() {
            // The job stops with a savepoint: close without finishing (see `ChainEvent`).
            return self.chain.event(ChainEvent::Suspend).await;
        }
        // The chain finished when every channel's data ended (`GateEvent::EndOfData`, pushed
        // at the latest as the last channel ended).
        self.chain.event(ChainEvent::End).await
    }
}

impl<T: Record> Subtask for NetworkTask<T> {
    fn run(self: Box<Self>) -> LocalBoxFuture<'static, TaskResult> {
        Box::pin(self.run_loop())
    }
}

/// Ends a chain in a sink writer.
pub(crate) struct SinkOutput<T> {
    pub(crate) writer: Box<dyn SinkWriter<T>>,
    pub(crate) metrics: Arc<OperatorMetrics>,
    /// Where the sink's operator state goes at a barrier.
    pub(crate) task: Rc<TaskState>,
    pub(crate) operator_id: Arc<str>,
    pub(crate) operator_state: OperatorStateId,
    /// `finish` was called: the final checkpoint's barrier finds nothing to flush.
    pub(crate) finished: bool,
}

impl<T: 'static> Output<T> for SinkOutput<T> {
    fn push<'a>(&'a mut self, batch: &'a mut Batch<T>) -> LocalBoxFuture<'a, TaskResult> {
        Box::pin(async move {
            let _scope = scope::enter(&self.metrics.name);
            self.metrics.records_in.add(batch.len() as u64);
            let result = self
                .writer
                .write(&mut batch.records, &batch.timestamps)
                .await;
            // A writer must take every record; one that only looked at them must not see them
            // again with the next batch.
            batch.clear();
            result.map_err(|e| e.in_operator(&self.metrics.name))
        })
    }

    /// The buffer timeout bounds how long records wait in network segments (as in Flink), not
    /// in a sink's own buffers: a sink writes out what it buffered when its input ends.
    fn event(&mut self, event: ChainEvent) -> LocalBoxFuture<'_, TaskResult> {
        match event {
            ChainEvent::Finish => Box::pin(async move {
                let _scope = scope::enter(&self.metrics.name);
                self.finished = true;
                let result = self.writer.finish().await;
                result.map_err(|e| e.in_operator(&self.metrics.name))
            }),
            // What the sink buffered goes out (at least once: transactional sinks will make
            // it part of the checkpoint); its operator state is snapshotted.
            ChainEvent::Barrier(barrier) => Box::pin(async move {
                if !self.finished {
                    let _scope = scope::enter(&self.metrics.name);
                    let result = self.writer.flush(&barrier).await;
                    result.map_err(|e| e.in_operator(&self.metrics.name))?;
                }
                snapshot_operator(
                    barrier,
                    &self.task,
                    &self.operator_id,
                    self.operator_state,
                    &self.metrics.name,
                    |_| Ok(()),
                )
            }),
            ChainEvent::CheckpointComplete(checkpoint) => Box::pin(async move {
                let _scope = scope::enter(&self.metrics.name);
                let result = self.writer.notify_checkpoint_complete(checkpoint).await;
                result.map_err(|e| e.in_operator(&self.metrics.name))
            }),
            ChainEvent::CheckpointAborted(checkpoint) => Box::pin(async move {
                let _scope = scope::enter(&self.metrics.name);
                let result = self.writer.notify_checkpoint_aborted(checkpoint).await;
                result.map_err(|e| e.in_operator(&self.metrics.name))
            }),
            // The subtask ends: after `Finish` and the final checkpoint's notice (`End`), or
            // stopped with a savepoint (`Suspend`: not finished, it goes on after the
            // savepoint is restored). A transactional sink commits what is due here.
            ChainEvent::Suspend | ChainEvent::End => Box::pin(async move {
                let _scope = scope::enter(&self.metrics.name);
                let result = self.writer.close(event == ChainEvent::Suspend).await;
                result.map_err(|e| e.in_operator(&self.metrics.name))
            }),
            ChainEvent::LatencyMarker(marker) => {
                self.metrics
                    .record_latency(marker.source as usize, now_ms() - marker.marked_ms);
                nothing_to_do()
            }
            ChainEvent::Watermark(_)
            | ChainEvent::WatermarkStatus { .. }
            | ChainEvent::ProcessingTime(_)
            | ChainEvent::Flush => nothing_to_do(),
        }
    }

    fn next_processing_time(&self) -> Option<i64> {
        None
    }
}

/// Drops every record: the main output of an operator whose side outputs alone are read.
pub(crate) struct DiscardOutput;

impl<T: 'static> Output<T> for DiscardOutput {
    fn push<'a>(&'a mut self, batch: &'a mut Batch<T>) -> LocalBoxFuture<'a, TaskResult> {
        batch.clear();
        nothing_to_do()
    }

    fn event(&mut self, _event: ChainEvent) -> LocalBoxFuture<'_, TaskResult> {
        nothing_to_do()
    }

    fn next_processing_time(&self) -> Option<i64> {
        None
    }
}
