//! Checkpointing a job run embedded (local mode): the coordinator on a thread of its own,
//! the sources' mailboxes, the tasks' acknowledgements, and reading a checkpoint back when a
//! job resumes.
//!
//! A checkpoint goes like this. The coordinator thread's [`Coordinator`] says trigger `n`; the
//! thread begins `chk-n/` in the job's [`CheckpointStorage`], snapshots every source's split
//! enumerator (holding back further splits from each reader until it has passed barrier `n`,
//! so that a split is in the enumerator's snapshot or in one reader's, never both) and posts
//! "trigger `n`" to every source subtask's [`SourceMailbox`]. A source reads its mailbox
//! between batches, snapshots its splits, sends the barrier down its chain — every operator
//! writes its state as the barrier passes it — and writes its task's state file. Downstream,
//! each input gate aligns the barrier over its channels ([`crate::runtime`]'s input gate) and
//! the task does the same. Each task's file is written by a glommio task on its shard while
//! records flow again, and acknowledged over a channel to the coordinator thread; when every
//! task has acknowledged, the thread commits `_metadata` (with this module's payload: which
//! file holds which subtask, each operator's parallelism, the enumerators' snapshots) and
//! deletes what `num-retained` no longer needs.
//!
//! A source whose bounded input ended sends the final watermark, finishes its chain (its
//! operators emit what is left, `Event::EndOfData` downstream, where each task finishes once
//! all its inputs did) and keeps answering its mailbox, taking part in checkpoints with
//! nothing left to read. Once every source's has, the coordinator triggers the final
//! checkpoint ([`Coordinator::end_of_input`]); the sources end their channels when its
//! completion passed down their chains, so every sink hears of it after its last record
//! (Flink's checkpoints after tasks finish, where a transactional sink commits its last
//! transaction).

use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use weir_state::checkpoint::{
    CheckpointMetadata, CheckpointStorage, PendingCheckpoint, StateFileWriter, StoredFile,
    METADATA_FILE,
};

use super::bytes::{ByteReader, ByteWriter};
use super::coordinator::{CheckpointSettings, Command, Coordinator};
use super::relay::{CheckpointMessage, FileRecord, Relay, Take};
use super::savepoint::{Requested, SavepointHandle, SavepointRequest, StopMode, Taken, Wake};
use super::task_state::{decode_file, write_in_pieces, FileEncoder, Part, RestoredJob, TaskState};
use super::CheckpointStats;
use crate::error::{panic_message, JobError};
use crate::runtime::exchange::inflight::{Announcements, InputLayout, RestoredInFlight};
use crate::time::now_ms;
use weir_state::BackendType;

/// What a source subtask is asked between batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SourceCommand {
    /// Snapshot and inject the barrier of this checkpoint.
    TriggerCheckpoint(u64),
    /// Likewise for the final checkpoint (every source's input ended): once it completed,
    /// the source ends.
    TriggerFinalCheckpoint(u64),
    /// Snapshot and inject the barrier of this savepoint; with `stop`, read no more input
    /// until it completed (then end) or was aborted (then read on): see `savepoint.rs`.
    TriggerSavepoint {
        savepoint: u64,
        stop: Option<StopMode>,
    },
    /// This checkpoint completed: tell the chain, and send the notice downstream.
    NotifyComplete(u64),
    /// This checkpoint was aborted: likewise.
    NotifyAborted(u64),
}

/// A source subtask's mailbox: the coordinator thread posts, the source reads between
/// batches (one atomic load when empty) and at least every few milliseconds while it waits
/// for data (not while it waits for credit: a barrier could not go out then anyway).
#[derive(Debug, Default)]
pub(crate) struct SourceMailbox {
    has_mail: AtomicBool,
    mail: Mutex<VecDeque<SourceCommand>>,
}

impl SourceMailbox {
    fn post(&self, command: SourceCommand) {
        self.mail.lock().expect("mailbox lock").push_back(command);
        self.has_mail.store(true, Ordering::Release);
    }

    /// The next command, if one was posted.
    pub(crate) fn take(&self) -> Option<SourceCommand> {
        if !self.has_mail.load(Ordering::Acquire) {
            return None;
        }
        let mut mail = self.mail.lock().expect("mailbox lock");
        let command = mail.pop_front();
        if mail.is_empty() {
            self.has_mail.store(false, Ordering::Release);
        }
        command
    }
}

/// What a task tells the coordinator thread.
#[derive(Debug)]
pub(crate) enum TaskReport {
    /// Its state file for the checkpoint is written.
    Acknowledge {
        checkpoint: u64,
        task: usize,
        files: TaskFiles,
        /// The longest its shard worked on the snapshot instead of records at once (the
        /// barrier's part plus the longest piece of the encoding after it).
        pause: Duration,
        /// How long its input's barriers took to line up.
        alignment: Duration,
    },
    /// It could not write its state for the checkpoint.
    Decline {
        checkpoint: u64,
        task: usize,
        reason: String,
    },
    /// A source's input ended and its chain finished: it waits for the final checkpoint.
    InputEnded,
    /// A checkpoint or savepoint was asked for.
    Asked,
    /// Another executor of a spread run said this (`relay.rs`).
    Relayed(CheckpointMessage),
}

/// What every task of a checkpointed job shares with the coordinator thread.
#[derive(Debug)]
pub(crate) struct JobCheckpointing {
    reports: Mutex<Sender<TaskReport>>,
    /// The directories of checkpoints being written, by number, and how many task state
    /// files are being written into each.
    pending: Mutex<Pending>,
    /// Per task (index in the execution graph's subtasks), its mailbox if it is a source.
    mailboxes: Vec<Option<Arc<SourceMailbox>>>,
    /// Barrier alignment (`execution.checkpointing.mode: EXACTLY_ONCE`).
    pub(crate) exactly_once: bool,
    /// RocksDB checkpoints list the files earlier ones wrote (`execution.checkpointing.incremental`).
    pub(crate) incremental: bool,
    /// Unaligned checkpoints: the aligned-checkpoint timeout, and where writers announce
    /// barriers to the tasks they feed (`runtime::exchange::inflight`).
    pub(crate) unaligned: Option<(Duration, Announcements)>,
    /// The job's stop flag (a task failed, or the job is cancelled): a checkpoint still being
    /// written stops at its next file (the shard, which waits for its writes before it ends,
    /// ends sooner, and the restart with it).
    stopping: Arc<AtomicBool>,
}

/// Checkpoints being written (see [`JobCheckpointing::pending`]).
#[derive(Debug, Default)]
struct Pending {
    dirs: HashMap<u64, PendingCheckpoint>,
    writers: HashMap<u64, usize>,
    /// The highest checkpoint this executor triggered (heard of, in a spread run's follower):
    /// one at or below it without a directory has ended.
    triggered: u64,
}

impl Pending {
    /// Checkpoint `checkpoint` is being written into `dir`.
    fn begin(&mut self, checkpoint: u64, dir: PendingCheckpoint) {
        self.dirs.insert(checkpoint, dir);
        self.triggered = self.triggered.max(checkpoint);
    }
}

impl JobCheckpointing {
    fn report(&self, report: TaskReport) {
        // The coordinator thread is gone only when the job is over.
        let _ = self.reports.lock().expect("reports lock").send(report);
    }

    /// The mailbox of task `task`, if it is a source.
    pub(crate) fn mailbox(&self, task: usize) -> Option<Arc<SourceMailbox>> {
        self.mailboxes.get(task).cloned().flatten()
    }

    /// Posts `command` to the mailbox of every source subtask of this executor.
    fn post(&self, command: SourceCommand) {
        for mailbox in self.mailboxes.iter().flatten() {
            mailbox.post(command);
        }
    }

    /// A source's input ended and its chain finished.
    pub(crate) fn input_ended(&self) {
        self.report(TaskReport::InputEnded);
    }
}

/// One task's side of checkpointing, on its shard.
pub(crate) struct TaskCheckpointing {
    pub(crate) job: Arc<JobCheckpointing>,
    /// The task's index in the execution graph's subtasks.
    pub(crate) task: usize,
    /// Its state file's name in each checkpoint.
    pub(crate) file_name: String,
    pub(crate) state: Rc<TaskState>,
    /// The id of the task's first operator (the part of the task's own state goes there: its
    /// input channels' in-flight data).
    pub(crate) operator: Arc<str>,
    /// The in-flight data restored for the task's input channels.
    pub(crate) in_flight: Option<RestoredInFlight>,
    /// What feeds the task's input channels (recorded with their in-flight data).
    pub(crate) input_layout: InputLayout,
}

impl TaskCheckpointing {
    /// The barrier of `checkpoint` has passed the task's whole chain: writes what its
    /// operators put into the task state to the checkpoint's directory, on a glommio task of
    /// this shard, and acknowledges (or declines) to the coordinator.
    /// `pause` is how long the barrier took through the chain (the operators' snapshots),
    /// `alignment` how long the barriers of its input took to line up before.
    pub(crate) fn write_snapshot(&self, checkpoint: u64, pause: Duration, alignment: Duration) {
        let parts = self.state.take();
        let job = Arc::clone(&self.job);
        let task = self.task;
        let name = self.file_name.clone();
        WRITES_IN_FLIGHT.with(|writes| writes.set(writes.get() + 1));
        glommio::spawn_local(async move {
            // Counted as a writer under the same lock, so that an abort does not remove the
            // directory under the file being created (glommio's open panics when it
            // vanishes). In a spread run a barrier from another executor's source may come
            // before this executor heard of its checkpoint: the file waits for that.
            let pending = loop {
                {
                    let mut pending = job.pending.lock().expect("pending lock");
                    if let Some(dir) = pending.dirs.get(&checkpoint).cloned() {
                        *pending.writers.entry(checkpoint).or_default() += 1;
                        break Some(dir);
                    }
                    if pending.triggered >= checkpoint || job.stopping.load(Ordering::Relaxed) {
                        break None;
                    }
                }
                glommio::timer::sleep(Duration::from_millis(1)).await;
            };
            let result = match pending {
                None => Err("the checkpoint was aborted before the task's barrier".to_string()),
                Some(pending) => {
                    let written = write_file(&pending, &name, parts, &job.stopping).await;
                    let mut pending = job.pending.lock().expect("pending lock");
                    if let Some(writers) = pending.writers.get_mut(&checkpoint) {
                        *writers -= 1;
                        if *writers == 0 {
                            pending.writers.remove(&checkpoint);
                        }
                    }
                    written
                }
            };
            // With the job going down (a task failed, or it is cancelled) a write that stopped
            // is abandoned with the attempt: no checkpoint failure of its own.
            let abandoned = result.is_err() && job.stopping.load(Ordering::Relaxed);
            if !abandoned {
                job.report(match result {
                    Ok((files, encoding)) => TaskReport::Acknowledge {
                        checkpoint,
                        task,
                        files,
                        pause: pause + encoding,
                        alignment,
                    },
                    Err(reason) => TaskReport::Decline {
                        checkpoint,
                        task,
                        reason,
                    },
                });
            }
            WRITES_IN_FLIGHT.with(|writes| writes.set(writes.get() - 1));
        })
        .detach();
    }
}

thread_local! {
    /// State files this shard is still writing.
    static WRITES_IN_FLIGHT: Cell<usize> = const { Cell::new(0) };
}

/// Waits until the state files this shard began writing are written (or failed): a shard
/// ends only then, since dropping a DMA writer mid-close aborts the process (glommio 0.9).
pub(crate) async fn finish_shard_writes() {
    while WRITES_IN_FLIGHT.with(Cell::get) > 0 {
        glommio::timer::sleep(Duration::from_millis(1)).await;
    }
}

/// The files a task wrote (or listed again) for a checkpoint: its state file, and the files
/// its parts stand for (RocksDB's, `native.rs`).
#[derive(Debug)]
pub(crate) struct TaskFiles {
    pub(crate) file: StoredFile,
    pub(crate) referenced: Vec<StoredFile>,
}

/// Writes a task's state file, after uploading the RocksDB checkpoints among its parts, in
/// pieces with records flowing between them: the files, and the longest piece's encoding (on
/// the shard, which processes no records meanwhile; the writing does not hold it).
async fn write_file(
    pending: &PendingCheckpoint,
    name: &str,
    parts: Vec<(Arc<str>, &'static str, Part)>,
    stopping: &AtomicBool,
) -> Result<(TaskFiles, Duration), String> {
    let mut referenced = Vec::new();
    let mut resolved = Vec::with_capacity(parts.len());
    let mut longest = Duration::ZERO;
    for (operator, part_name, part) in parts {
        let part = match part {
            Part::Native(upload) => {
                let (bytes, step) = upload.upload(pending, &mut referenced, stopping).await?;
                longest = longest.max(step);
                Part::Bytes(bytes)
            }
            Part::Chained(link) => {
                let (bytes, step) = link.store(pending, &mut referenced).await?;
                longest = longest.max(step);
                Part::Bytes(bytes)
            }
            part => part,
        };
        resolved.push((operator, part_name, part));
    }
    let mut encoder = FileEncoder::new(resolved)?;
    let mut writer = StateFileWriter::create(pending, name)
        .await
        .map_err(|e| e.to_string())?;
    let step = write_in_pieces(&mut writer, Some(stopping), |out| {
        let more = encoder.encode_next(out)?;
        Ok((more, encoder.waiting()))
    })
    .await?;
    let file = writer.finish().await.map_err(|e| e.to_string())?;
    let longest = longest.max(step).max(encoder.longest_step_elsewhere());
    Ok((TaskFiles { file, referenced }, longest))
}

/// The snapshots of a checkpoint's split enumerators: (operator id, bytes) each.
type SplitSnapshots = Vec<(String, Vec<u8>)>;

/// Snapshots every source's split enumerator for a checkpoint: (operator id, bytes) each.
pub(crate) type EnumeratorSnapshots = Box<dyn Fn(u64) -> Result<SplitSnapshots, String> + Send>;

/// One operator as the payload records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OperatorEntry {
    pub(crate) id: String,
    pub(crate) name: String,
    /// The uid the id was derived from, if the operator has one.
    pub(crate) uid: Option<String>,
    pub(crate) parallelism: usize,
}

/// What the coordinator thread needs to know of the job.
pub(crate) struct DriverPlan {
    pub(crate) job: String,
    pub(crate) settings: CheckpointSettings,
    pub(crate) retained: usize,
    /// Per task, its subtask index (the payload records which file is which subtask's).
    pub(crate) task_subtasks: Vec<usize>,
    /// Which tasks are sources (they get mailboxes).
    pub(crate) sources: Vec<bool>,
    pub(crate) operators: Vec<OperatorEntry>,
    pub(crate) enumerators: EnumeratorSnapshots,
    pub(crate) exactly_once: bool,
    pub(crate) incremental: bool,
    /// `CheckpointConfig::unaligned`.
    pub(crate) unaligned: Option<Duration>,
    /// The first checkpoint number to use.
    pub(crate) first: u64,
    /// Where savepoints asked for come from, and where they go.
    pub(crate) savepoints: SavepointHandle,
    pub(crate) savepoint_dir: PathBuf,
    /// The state backend the job runs on (the payload records it).
    pub(crate) backend: BackendType,
    /// Where completed and aborted checkpoints are counted for the job's live figures.
    pub(crate) monitor: crate::monitor::JobMonitor,
    /// In a run spread over several executors: this one's part (`relay.rs`).
    pub(crate) spread: Option<SpreadPlan>,
}

/// An executor's part in the checkpoints of a run spread over several (`relay.rs`).
pub(crate) struct SpreadPlan {
    pub(crate) relay: Relay,
    /// Whether this executor coordinates (it runs slot 0).
    pub(crate) leader: bool,
    /// This executor's node.
    pub(crate) node: String,
    /// How many executors follow the leader.
    pub(crate) followers: usize,
    /// The checkpoint (or savepoint) this executor restored, which every executor must have
    /// restored alike.
    pub(crate) restored: Option<u64>,
    /// Per task, whether it runs in this executor.
    pub(crate) here: Vec<bool>,
}

/// How the coordinator thread ended.
#[derive(Debug, Default)]
pub(crate) struct DriverEnd {
    /// Why it failed the job, if it did.
    pub(crate) failure: Option<String>,
    pub(crate) stats: CheckpointStats,
    /// The savepoint the job was stopped with, if it was.
    pub(crate) stopped_with: Option<PathBuf>,
}

/// The coordinator thread of one job run.
pub(crate) struct CheckpointDriver {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<DriverEnd>>,
    pub(crate) shared: Arc<JobCheckpointing>,
}

impl CheckpointDriver {
    /// Starts the coordinator thread for a job whose checkpoints go to `storage`; `stopping`
    /// is the job's stop flag, which the thread sets if too many checkpoints fail in a row.
    pub(crate) fn start(
        storage: CheckpointStorage,
        plan: DriverPlan,
        stopping: Arc<AtomicBool>,
    ) -> CheckpointDriver {
        let (sender, receiver) = mpsc::channel();
        let asked = sender.clone();
        plan.savepoints.wake_with(Some(Wake(Box::new(move || {
            let _ = asked.send(TaskReport::Asked);
        }))));
        if let Some(spread) = &plan.spread {
            spread.relay.open(sender.clone());
        }
        let here = |task: usize| plan.spread.as_ref().is_none_or(|spread| spread.here[task]);
        let shared = Arc::new(JobCheckpointing {
            reports: Mutex::new(sender),
            pending: Mutex::default(),
            // Only this executor's sources read theirs.
            mailboxes: plan
                .sources
                .iter()
                .enumerate()
                .map(|(task, &source)| {
                    (source && here(task)).then(|| Arc::new(SourceMailbox::default()))
                })
                .collect(),
            exactly_once: plan.exactly_once,
            incremental: plan.incremental,
            unaligned: plan
                .unaligned
                .map(|timeout| (timeout, Announcements::new(plan.task_subtasks.len()))),
            stopping,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let shared = Arc::clone(&shared);
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("checkpoint-coordinator".into())
                .spawn(move || {
                    if plan.spread.as_ref().is_some_and(|spread| !spread.leader) {
                        return follow(&plan, &shared, &receiver, &stop);
                    }
                    let mut host = Host {
                        coordinator: Coordinator::new(
                            plan.settings,
                            plan.task_subtasks.len(),
                            plan.first,
                        ),
                        storage,
                        plan,
                        shared,
                        enumerators: HashMap::new(),
                        inputs_ended: 0,
                        triggered: HashMap::new(),
                        aborted: Vec::new(),
                        stats: CheckpointStats::default(),
                        savepoint: None,
                        deferred: None,
                        savepoint_dirs: HashMap::new(),
                        stopped_with: None,
                        joined: HashSet::new(),
                        input_ended: false,
                        splits: HashMap::new(),
                        releases: HashMap::new(),
                    };
                    let failure = host.run(&receiver, &stop);
                    if failure.is_some() {
                        host.shared.stopping.store(true, Ordering::Relaxed);
                        // The tasks are going down; their last writes end before the stop.
                        while !stop.load(Ordering::Relaxed) {
                            let _ = receiver.recv_timeout(Duration::from_millis(10));
                        }
                    }
                    host.plan.savepoints.wake_with(None);
                    host.discard_pending();
                    host.await_releases(&receiver);
                    host.discard_aborted();
                    // A checkpoint asked for that never started waits for the next attempt.
                    if let Some(request) = host.deferred.take() {
                        host.plan.savepoints.put_back(request);
                    }
                    DriverEnd {
                        failure,
                        stats: host.stats,
                        stopped_with: host.stopped_with,
                    }
                })
                .expect("spawn the checkpoint coordinator thread")
        };
        CheckpointDriver {
            stop,
            thread: Some(thread),
            shared,
        }
    }

    /// Stops the coordinator thread: the reason it failed the job, if it did, what its
    /// checkpoints did, and the savepoint the job stopped with.
    pub(crate) fn stop(mut self) -> DriverEnd {
        self.join()
    }

    fn join(&mut self) -> DriverEnd {
        self.stop.store(true, Ordering::Relaxed);
        let Some(thread) = self.thread.take() else {
            return DriverEnd::default();
        };
        match thread.join() {
            Ok(ended) => ended,
            Err(panic) => DriverEnd {
                failure: Some(format!(
                    "the checkpoint coordinator failed: {}",
                    panic_message(&*panic)
                )),
                ..DriverEnd::default()
            },
        }
    }
}

impl Drop for CheckpointDriver {
    /// A run that ends early (its shards could not start, or it panicked) stops the thread
    /// too, releasing the checkpoint directory.
    fn drop(&mut self) {
        self.join();
    }
}

/// The coordinator thread's state.
struct Host {
    coordinator: Coordinator<TaskFiles>,
    storage: CheckpointStorage,
    plan: DriverPlan,
    shared: Arc<JobCheckpointing>,
    /// The enumerators' snapshots of each pending checkpoint.
    enumerators: HashMap<u64, SplitSnapshots>,
    /// Source subtasks whose input ended (the final checkpoint is due once all have).
    inputs_ended: usize,
    /// When each pending checkpoint was triggered, and what its tasks reported so far.
    triggered: HashMap<u64, Triggered>,
    /// Aborted checkpoints whose directories tasks were still writing into.
    aborted: Vec<u64>,
    stats: CheckpointStats,
    /// The savepoint (or checkpoint) being taken on request, and who asked for it.
    savepoint: Option<(u64, SavepointRequest)>,
    /// A checkpoint asked for that waits for a pending one to end.
    deferred: Option<SavepointRequest>,
    /// The directories of savepoints being written (they are not the storage's `chk-<n>`).
    savepoint_dirs: HashMap<u64, PendingCheckpoint>,
    /// The savepoint that stops the job, once it completed.
    stopped_with: Option<PathBuf>,
    /// In a spread run: the nodes of the followers that joined (no checkpoint is triggered
    /// before all did).
    joined: HashSet<String>,
    /// In a spread run: every source's input ended before every follower joined (the final
    /// checkpoint waits for them too).
    input_ended: bool,
    /// In a spread run: the followers' readers' pending splits of each pending checkpoint.
    splits: HashMap<u64, Vec<SplitSnapshots>>,
    /// In a spread run: per aborted checkpoint, the followers that may still write into its
    /// directory.
    releases: HashMap<u64, usize>,
}

impl Host {
    /// Runs until stopped; the reason the job must fail, if checkpoints failed too often.
    fn run(&mut self, reports: &Receiver<TaskReport>, stop: &AtomicBool) -> Option<String> {
        while !stop.load(Ordering::Relaxed) {
            let now = now_ms();
            let next = [
                Some(self.coordinator.next_trigger()),
                self.coordinator.next_expiry(),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(now + 50);
            let wait = next.saturating_sub(now).clamp(1, 50);
            let commands = match reports.recv_timeout(Duration::from_millis(wait as u64)) {
                Ok(report) => {
                    self.discard_aborted();
                    self.on_report(report)
                }
                Err(RecvTimeoutError::Timeout) => Vec::new(),
                Err(RecvTimeoutError::Disconnected) => return None,
            };
            let mut commands = commands;
            if self.all_joined() {
                commands.extend(self.coordinator.tick(now_ms()));
                commands.extend(self.take_savepoint_requests());
            }
            for command in commands {
                if let Some(failure) = self.execute(command) {
                    return Some(failure);
                }
            }
        }
        None
    }

    /// Whether every follower of a spread run joined (always, in a run on one executor).
    fn all_joined(&self) -> bool {
        self.plan
            .spread
            .as_ref()
            .is_none_or(|spread| self.joined.len() >= spread.followers)
    }

    /// Tells the followers of a spread run `message`.
    fn tell_followers(&self, message: CheckpointMessage) {
        if let Some(spread) = &self.plan.spread {
            spread.relay.send(message);
        }
    }

    /// Triggers a savepoint (or checkpoint) for the next request, if one waits and none is
    /// being taken (the rest wait their turn); refuses requests that cannot be served.
    fn take_savepoint_requests(&mut self) -> Vec<Command<TaskFiles>> {
        if self.savepoint.is_some() {
            return Vec::new();
        }
        let Some(request) = self.deferred.take().or_else(|| self.plan.savepoints.take()) else {
            return Vec::new();
        };
        let now = now_ms();
        let triggered = match request.requested {
            Requested::Checkpoint => self.coordinator.trigger_checkpoint(now),
            Requested::Savepoint { stop } => self
                .coordinator
                .trigger_savepoint(now, stop.is_some())
                .map(Some),
        };
        match triggered {
            Ok(None) => {
                self.deferred = Some(request);
                Vec::new()
            }
            Ok(Some(checkpoint)) => {
                self.savepoint = Some((checkpoint, request));
                vec![Command::Trigger {
                    checkpoint,
                    timestamp_ms: now,
                }]
            }
            Err(reason) => {
                request.fail(reason);
                Vec::new()
            }
        }
    }

    /// The request being served, if `checkpoint` is its.
    fn savepoint_of(&self, checkpoint: u64) -> Option<&SavepointRequest> {
        self.savepoint
            .as_ref()
            .filter(|(number, _)| *number == checkpoint)
            .map(|(_, request)| request)
    }

    /// Answers the request served by `checkpoint`, if there is one.
    fn answer_savepoint(&mut self, checkpoint: u64, result: Result<PathBuf, String>) {
        if self.savepoint_of(checkpoint).is_none() {
            return;
        }
        let (_, request) = self.savepoint.take().expect("checked");
        let what = match request.requested {
            Requested::Checkpoint => "checkpoint",
            Requested::Savepoint { .. } => "savepoint",
        };
        match result {
            Ok(dir) => {
                tracing::info!(job = %self.plan.job, checkpoint, "{what} asked for stored in {}", dir.display());
                if request.stop().is_some() {
                    self.stopped_with = Some(dir.clone());
                }
                request.answer(Ok(Taken { checkpoint, dir }));
            }
            Err(reason) => {
                tracing::warn!(job = %self.plan.job, checkpoint, "{what} asked for failed: {reason}");
                request.fail(reason);
            }
        }
    }

    fn on_report(&mut self, report: TaskReport) -> Vec<Command<TaskFiles>> {
        let now = now_ms();
        match report {
            TaskReport::Acknowledge {
                checkpoint,
                task,
                files,
                pause,
                alignment,
            } => {
                if let Some(triggered) = self.triggered.get_mut(&checkpoint) {
                    triggered.pauses.push(pause);
                    triggered.alignment = triggered.alignment.max(alignment);
                }
                self.coordinator.acknowledge(checkpoint, task, files, now)
            }
            TaskReport::Decline {
                checkpoint,
                task,
                reason,
            } => self.coordinator.decline(checkpoint, task, &reason, now),
            TaskReport::InputEnded => {
                self.inputs_ended += 1;
                let sources = self.plan.sources.iter().filter(|&&source| source).count();
                if self.inputs_ended < sources {
                    return Vec::new();
                }
                tracing::debug!(job = %self.plan.job, "every source's input ended: the final checkpoint is due");
                if !self.all_joined() {
                    // Triggered once every follower joined.
                    self.input_ended = true;
                    return Vec::new();
                }
                self.coordinator.end_of_input(now)
            }
            // The loop takes it next.
            TaskReport::Asked => Vec::new(),
            TaskReport::Relayed(message) => self.on_follower(message),
        }
    }

    /// What a follower of a spread run said.
    fn on_follower(&mut self, message: CheckpointMessage) -> Vec<Command<TaskFiles>> {
        let now = now_ms();
        match message {
            CheckpointMessage::Joined { node, restored } => {
                let ours = self.plan.spread.as_ref().and_then(|spread| spread.restored);
                if restored != ours {
                    let show = |restored: Option<u64>| {
                        restored.map_or("nothing".to_string(), |n| format!("checkpoint {n}"))
                    };
                    return vec![Command::FailJob {
                        reason: format!(
                            "the executor on node '{node}' restored {} but the coordinating \
                             executor restored {} (a checkpoint completed while the run \
                             started); the run starts again",
                            show(restored),
                            show(ours)
                        ),
                    }];
                }
                // A follower says it again until it hears from this executor.
                if !self.joined.insert(node.clone()) {
                    return Vec::new();
                }
                tracing::debug!(job = %self.plan.job, %node, "an executor of the run joined its checkpoints");
                if self.input_ended && self.all_joined() {
                    return self.coordinator.end_of_input(now);
                }
                Vec::new()
            }
            CheckpointMessage::Splits {
                checkpoint,
                node,
                enumerators,
            } => match enumerators {
                Ok(snapshots) => {
                    if self.triggered.contains_key(&checkpoint) {
                        self.splits.entry(checkpoint).or_default().push(snapshots);
                    }
                    Vec::new()
                }
                Err(reason) => self.coordinator.decline(
                    checkpoint,
                    0,
                    &format!("the split enumerators on node '{node}' failed: {reason}"),
                    now,
                ),
            },
            CheckpointMessage::Acknowledge {
                checkpoint,
                task,
                file,
                referenced,
                pause_us,
                alignment_us,
            } => self.on_report(TaskReport::Acknowledge {
                checkpoint,
                task,
                files: TaskFiles {
                    file: file.into(),
                    referenced: referenced.into_iter().map(Into::into).collect(),
                },
                pause: Duration::from_micros(pause_us),
                alignment: Duration::from_micros(alignment_us),
            }),
            CheckpointMessage::Decline {
                checkpoint,
                task,
                reason,
            } => self.on_report(TaskReport::Decline {
                checkpoint,
                task,
                reason,
            }),
            CheckpointMessage::InputEnded => self.on_report(TaskReport::InputEnded),
            CheckpointMessage::Released { checkpoint } => {
                self.released(checkpoint);
                self.discard_aborted();
                Vec::new()
            }
            CheckpointMessage::Trigger { .. }
            | CheckpointMessage::Complete { .. }
            | CheckpointMessage::Aborted { .. } => {
                tracing::warn!(job = %self.plan.job, ?message, "the coordinating executor was sent a message for the others; ignored");
                Vec::new()
            }
        }
    }

    /// Carries out one command; the job's failure reason for `FailJob`.
    fn execute(&mut self, command: Command<TaskFiles>) -> Option<String> {
        match command {
            Command::Trigger { checkpoint, .. } => {
                if let Err(reason) = self.trigger(checkpoint) {
                    tracing::warn!(job = %self.plan.job, checkpoint, "checkpoint not triggered: {reason}");
                    self.answer_savepoint(
                        checkpoint,
                        Err(format!("it could not be started: {reason}")),
                    );
                    let commands = self.coordinator.decline(checkpoint, 0, &reason, now_ms());
                    for command in commands {
                        if let Some(failure) = self.execute(command) {
                            return Some(failure);
                        }
                    }
                }
            }
            Command::Persist {
                checkpoint,
                timestamp_ms,
                handles,
            } => {
                // Completed only once committed: the tasks hear of it after that (or of its
                // abort, the coordinator counting the failure).
                let commands = match self.persist(checkpoint, timestamp_ms, handles) {
                    Ok(dir) => {
                        self.answer_savepoint(checkpoint, Ok(dir));
                        self.coordinator.committed(checkpoint)
                    }
                    Err(reason) => self.coordinator.not_committed(checkpoint, reason, now_ms()),
                };
                for command in commands {
                    if let Some(failure) = self.execute(command) {
                        return Some(failure);
                    }
                }
            }
            // The notices go to the sources, which pass them through their chains and
            // downstream in-band, so that every task hears of them after the data before them
            // (and without a channel of its own to the coordinator).
            Command::NotifyComplete { checkpoint } => {
                tracing::debug!(job = %self.plan.job, checkpoint, "checkpoint complete");
                self.tell_followers(CheckpointMessage::Complete { checkpoint });
                self.shared.post(SourceCommand::NotifyComplete(checkpoint));
            }
            Command::NotifyAborted { checkpoint, reason } => {
                tracing::warn!(job = %self.plan.job, checkpoint, ?reason, "checkpoint aborted");
                let why = describe_abort(&reason);
                // A checkpoint a newer one subsumed did not fail.
                if !matches!(reason, super::AbortReason::Subsumed { .. }) {
                    let savepoint = self.savepoint_dirs.contains_key(&checkpoint);
                    self.plan.monitor.aborted(checkpoint, savepoint, &why);
                }
                self.answer_savepoint(checkpoint, Err(why));
                self.forget(checkpoint);
                self.tell_followers(CheckpointMessage::Aborted { checkpoint });
                self.shared.post(SourceCommand::NotifyAborted(checkpoint));
            }
            Command::FailJob { reason } => return Some(reason),
        }
        None
    }

    fn trigger(&mut self, checkpoint: u64) -> Result<(), String> {
        self.triggered.insert(checkpoint, Triggered::new());
        let stop = self
            .savepoint_of(checkpoint)
            .and_then(|request| match request.requested {
                Requested::Checkpoint => None,
                Requested::Savepoint { stop } => Some(stop),
            });
        let pending = match stop {
            None => self.storage.begin(checkpoint),
            Some(_) => self
                .storage
                .begin_savepoint(&self.plan.savepoint_dir, checkpoint, now_ms()),
        }
        .map_err(|e| e.to_string())?;
        if pending.is_savepoint() {
            self.savepoint_dirs.insert(checkpoint, pending.clone());
        }
        let dir = pending.dir().to_path_buf();
        self.shared
            .pending
            .lock()
            .expect("pending lock")
            .begin(checkpoint, pending);
        // Enumerators first (they hold splits back until each reader passed the barrier),
        // then the sources' mailboxes — even when an enumerator failed, so that every reader
        // passes the barrier and is let go (the checkpoint is declined).
        let enumerators = (self.plan.enumerators)(checkpoint);
        let last = self.coordinator.final_checkpoint() == Some(checkpoint);
        let take = match stop {
            None if last => Take::Final,
            None => Take::Checkpoint,
            Some(stop) => Take::Savepoint { stop },
        };
        self.tell_followers(CheckpointMessage::Trigger {
            checkpoint,
            dir,
            take,
        });
        self.shared.post(take.trigger(checkpoint));
        self.enumerators.insert(checkpoint, enumerators?);
        Ok(())
    }

    /// Commits a checkpoint (or savepoint) every task acknowledged: its directory.
    fn persist(
        &mut self,
        checkpoint: u64,
        timestamp_ms: i64,
        handles: Vec<TaskFiles>,
    ) -> Result<PathBuf, String> {
        let mut files = Vec::with_capacity(handles.len());
        let mut referenced = Vec::new();
        for handle in handles {
            files.push(handle.file);
            referenced.extend(handle.referenced);
        }
        let pending = self
            .shared
            .pending
            .lock()
            .expect("pending lock")
            .dirs
            .remove(&checkpoint)
            .ok_or("its directory is gone")?;
        if self.plan.spread.is_some() {
            check_shared(pending.dir(), files.iter().chain(&referenced))?;
        }
        let enumerators = self.all_enumerators(checkpoint)?;
        let payload = encode_payload(&self.plan, &enumerators);
        let metadata = CheckpointMetadata {
            job: self.plan.job.clone(),
            checkpoint,
            timestamp_ms,
            files,
            referenced,
            payload,
        };
        let full = metadata.all_files().map(|file| file.len).sum();
        let earlier = metadata
            .referenced
            .iter()
            .filter(|file| file.shared_by().is_some_and(|by| by != checkpoint))
            .map(|file| file.len)
            .sum::<u64>();
        let bytes = (full, full - earlier);
        let triggered = self.triggered.remove(&checkpoint);
        // Its duration runs to its commit; counted once committed: a commit that fails is an
        // abort.
        if pending.is_savepoint() {
            self.savepoint_dirs.remove(&checkpoint);
            let completed = self
                .storage
                .commit_savepoint(pending, &metadata)
                .map_err(|e| e.to_string())?;
            if let Some(triggered) = &triggered {
                let figures = triggered.figures(bytes);
                self.plan.monitor.completed(checkpoint, true, figures);
            }
            return Ok(completed.dir);
        }
        let completed = self
            .storage
            .commit(pending, &metadata)
            .map_err(|e| e.to_string())?;
        tracing::debug!(job = %self.plan.job, checkpoint, "checkpoint committed");
        if let Some(triggered) = triggered {
            let figures = triggered.figures(bytes);
            self.plan.monitor.completed(checkpoint, false, figures);
            self.stats.completed(figures.took, bytes, triggered.pauses);
        }
        // Committed, it completed: older checkpoints that cannot be removed now stay until the
        // next one removes them.
        if let Err(error) = self.storage.retain(self.plan.retained) {
            tracing::warn!(job = %self.plan.job, checkpoint, %error, "cannot remove older checkpoints");
        }
        Ok(completed.dir)
    }

    /// The split enumerators' snapshots of `checkpoint`: in a spread run, each joins this
    /// executor's readers' pending splits with every follower's.
    fn all_enumerators(&mut self, checkpoint: u64) -> Result<SplitSnapshots, String> {
        let own = self.enumerators.remove(&checkpoint).unwrap_or_default();
        let Some(spread) = &self.plan.spread else {
            return Ok(own);
        };
        let parts = self.splits.remove(&checkpoint).unwrap_or_default();
        if parts.len() < spread.followers {
            return Err(format!(
                "the split enumerators of {} of the run's {} other executors did not report",
                spread.followers - parts.len(),
                spread.followers
            ));
        }
        own.into_iter()
            .map(|(id, bytes)| {
                let mut all = vec![bytes];
                for part in &parts {
                    let (_, theirs) =
                        part.iter().find(|(other, _)| *other == id).ok_or_else(|| {
                            format!("an executor's split enumerators lack source {id}")
                        })?;
                    all.push(theirs.clone());
                }
                let joined = crate::runtime::factories::join_splits(&all)?;
                Ok((id, joined))
            })
            .collect()
    }

    fn forget(&mut self, checkpoint: u64) {
        self.enumerators.remove(&checkpoint);
        self.splits.remove(&checkpoint);
        if let Some(spread) = &self.plan.spread {
            // Removed once every follower's writers are done too (each says so).
            self.releases.insert(checkpoint, spread.followers);
        }
        if self.triggered.remove(&checkpoint).is_some() {
            self.stats.aborted += 1;
        }
        let writing = {
            let mut pending = self.shared.pending.lock().expect("pending lock");
            pending.dirs.remove(&checkpoint);
            pending.writers.contains_key(&checkpoint)
        };
        if writing || self.releases.contains_key(&checkpoint) {
            // Removed once its writers are done (each reports then).
            self.aborted.push(checkpoint);
        } else {
            self.discard(checkpoint);
        }
    }

    fn discard(&mut self, checkpoint: u64) {
        let discarded = match self.savepoint_dirs.remove(&checkpoint) {
            Some(savepoint) => self.storage.discard_savepoint(&savepoint),
            None => self.storage.discard(checkpoint),
        };
        if let Err(error) = discarded {
            tracing::warn!(job = %self.plan.job, checkpoint, %error, "cannot remove an aborted checkpoint");
        }
    }

    /// Removes the directories of aborted checkpoints no task writes into any more.
    fn discard_aborted(&mut self) {
        if self.aborted.is_empty() {
            return;
        }
        let done: Vec<u64> = {
            let pending = self.shared.pending.lock().expect("pending lock");
            self.aborted
                .iter()
                .copied()
                .filter(|checkpoint| !pending.writers.contains_key(checkpoint))
                .filter(|checkpoint| self.releases.get(checkpoint).is_none_or(|&n| n == 0))
                .collect()
        };
        self.aborted.retain(|checkpoint| !done.contains(checkpoint));
        for checkpoint in done {
            self.releases.remove(&checkpoint);
            self.discard(checkpoint);
        }
    }

    /// Removes what checkpoints still pending at the job's end wrote (in a spread run, once
    /// the followers said their tasks write no more into them: [`Host::await_releases`]).
    fn discard_pending(&mut self) {
        let pending: Vec<u64> = self.coordinator.pending().collect();
        for checkpoint in pending {
            self.answer_savepoint(
                checkpoint,
                Err("the job ended before every task had written its state".into()),
            );
            self.forget(checkpoint);
            self.tell_followers(CheckpointMessage::Aborted { checkpoint });
        }
    }

    /// A follower's tasks write no more into aborted `checkpoint`'s directory.
    fn released(&mut self, checkpoint: u64) {
        if let Some(writing) = self.releases.get_mut(&checkpoint) {
            *writing = writing.saturating_sub(1);
        }
    }

    /// In a spread run at its end: waits a little for the followers to release the aborted
    /// checkpoints they may still write into. One that does not (it is gone, or ending
    /// without a word) leaves its directory for a later run's retention to sweep.
    fn await_releases(&mut self, reports: &Receiver<TaskReport>) {
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.releases.values().any(|&writing| writing > 0) {
            let left = deadline.saturating_duration_since(Instant::now());
            match reports.recv_timeout(left) {
                Ok(TaskReport::Relayed(CheckpointMessage::Released { checkpoint })) => {
                    self.released(checkpoint);
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    }
}

/// Checks that the files a spread run's executors acknowledged for the checkpoint in `dir`
/// are there as they wrote them: each wrote into the directory at its own path, which only
/// names the same storage when the checkpoint directory is shared.
fn check_shared<'a>(
    dir: &std::path::Path,
    files: impl Iterator<Item = &'a StoredFile>,
) -> Result<(), String> {
    for file in files {
        let path = weir_state::checkpoint::resolve(dir, &file.name);
        let found = std::fs::metadata(&path).map(|found| found.len());
        if found.as_ref().ok() != Some(&file.len) {
            let found = match found {
                Ok(len) => format!("holds {len} bytes"),
                Err(error) => format!("cannot be read ({error})"),
            };
            return Err(format!(
                "{} {found} where an executor of the run wrote {} bytes: \
                 execution.checkpointing.dir must be storage every worker sees at one path \
                 (a shared file system) when a job runs over several workers",
                path.display(),
                file.len
            ));
        }
    }
    Ok(())
}

impl Take {
    /// What a source is asked to trigger `checkpoint` as.
    fn trigger(self, checkpoint: u64) -> SourceCommand {
        match self {
            Take::Checkpoint => SourceCommand::TriggerCheckpoint(checkpoint),
            Take::Final => SourceCommand::TriggerFinalCheckpoint(checkpoint),
            Take::Savepoint { stop } => SourceCommand::TriggerSavepoint {
                savepoint: checkpoint,
                stop,
            },
        }
    }
}

/// A follower's coordination thread in a spread run (`relay.rs`): joins the leader, passes its
/// tasks' reports on to it, and triggers and notifies its sources as the leader says, until
/// stopped.
fn follow(
    plan: &DriverPlan,
    shared: &JobCheckpointing,
    reports: &Receiver<TaskReport>,
    stop: &AtomicBool,
) -> DriverEnd {
    let spread = plan.spread.as_ref().expect("a follower of a spread run");
    let relay = &spread.relay;
    // Completed once: by the leader's word, or by its metadata in the shared directory when
    // that word was lost on the way (a control plane that went down).
    let complete = |checkpoint: u64| {
        let pending = shared
            .pending
            .lock()
            .expect("pending lock")
            .dirs
            .remove(&checkpoint);
        if pending.is_some() {
            shared.post(SourceCommand::NotifyComplete(checkpoint));
        }
    };
    let micros = |took: Duration| u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    // Aborted checkpoints whose directories this executor's tasks may still write into.
    let mut aborted: Vec<u64> = Vec::new();
    // Joined again every second until the leader was heard (a message may be lost on the
    // way); committed checkpoints looked for as often.
    let mut heard = false;
    let mut looked: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        if looked.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
            looked = Some(Instant::now());
            if !heard {
                relay.send(CheckpointMessage::Joined {
                    node: spread.node.clone(),
                    restored: spread.restored,
                });
            }
            let committed: Vec<u64> = {
                let pending = shared.pending.lock().expect("pending lock");
                pending
                    .dirs
                    .iter()
                    .filter(|(_, dir)| dir.dir().join(METADATA_FILE).exists())
                    .map(|(&checkpoint, _)| checkpoint)
                    .collect()
            };
            for checkpoint in committed {
                complete(checkpoint);
            }
        }
        let report = match reports.recv_timeout(Duration::from_millis(10)) {
            Ok(report) => Some(report),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        heard |= matches!(report, Some(TaskReport::Relayed(_)));
        match report {
            None => {}
            Some(TaskReport::Acknowledge {
                checkpoint,
                task,
                files,
                pause,
                alignment,
            }) => relay.send(CheckpointMessage::Acknowledge {
                checkpoint,
                task,
                file: files.file.into(),
                referenced: files.referenced.into_iter().map(FileRecord::from).collect(),
                pause_us: micros(pause),
                alignment_us: micros(alignment),
            }),
            Some(TaskReport::Decline {
                checkpoint,
                task,
                reason,
            }) => relay.send(CheckpointMessage::Decline {
                checkpoint,
                task,
                reason,
            }),
            Some(TaskReport::InputEnded) => relay.send(CheckpointMessage::InputEnded),
            Some(TaskReport::Asked) => {
                while let Some(request) = plan.savepoints.take() {
                    request.fail(format!(
                        "this executor (node '{}') does not coordinate the run's checkpoints; \
                         ask the one that runs slot 0",
                        spread.node
                    ));
                }
            }
            Some(TaskReport::Relayed(CheckpointMessage::Trigger {
                checkpoint,
                dir,
                take,
            })) => {
                let savepoint = matches!(take, Take::Savepoint { .. });
                shared.pending.lock().expect("pending lock").begin(
                    checkpoint,
                    PendingCheckpoint::joined(checkpoint, dir, savepoint),
                );
                // As the leader does: enumerators first, then the sources, even when an
                // enumerator failed (the leader declines the checkpoint).
                relay.send(CheckpointMessage::Splits {
                    checkpoint,
                    node: spread.node.clone(),
                    enumerators: (plan.enumerators)(checkpoint),
                });
                shared.post(take.trigger(checkpoint));
            }
            Some(TaskReport::Relayed(CheckpointMessage::Complete { checkpoint })) => {
                complete(checkpoint);
            }
            Some(TaskReport::Relayed(CheckpointMessage::Aborted { checkpoint })) => {
                let mut pending = shared.pending.lock().expect("pending lock");
                pending.dirs.remove(&checkpoint);
                drop(pending);
                aborted.push(checkpoint);
                shared.post(SourceCommand::NotifyAborted(checkpoint));
            }
            Some(TaskReport::Relayed(message)) => {
                tracing::warn!(job = %plan.job, ?message, "an executor that does not coordinate the run's checkpoints was sent a message for the one that does; ignored");
            }
        }
        let released: Vec<u64> = {
            let pending = shared.pending.lock().expect("pending lock");
            aborted
                .extract_if(.., |checkpoint| !pending.writers.contains_key(checkpoint))
                .collect()
        };
        for checkpoint in released {
            relay.send(CheckpointMessage::Released { checkpoint });
        }
    }
    plan.savepoints.wake_with(None);
    DriverEnd::default()
}

/// A pending checkpoint: when it was triggered, and what its tasks reported so far.
#[derive(Debug)]
struct Triggered {
    at: Instant,
    /// Each task's longest pause.
    pauses: Vec<Duration>,
    /// The longest any task's input took to align.
    alignment: Duration,
}

impl Triggered {
    fn new() -> Triggered {
        Triggered {
            at: Instant::now(),
            pauses: Vec::new(),
            alignment: Duration::ZERO,
        }
    }

    /// Its figures, completed now, with `bytes` (full, incremental).
    fn figures(&self, (full, incremental): (u64, u64)) -> crate::monitor::Completed {
        crate::monitor::Completed {
            took: self.at.elapsed(),
            full_bytes: full,
            incremental_bytes: incremental,
            max_pause: self.pauses.iter().max().copied().unwrap_or_default(),
            max_alignment: self.alignment,
        }
    }
}

/// Why a savepoint was aborted, for whoever asked for it.
fn describe_abort(reason: &super::AbortReason) -> String {
    match reason {
        super::AbortReason::Expired => {
            "it did not complete within execution.checkpointing.timeout".into()
        }
        super::AbortReason::Declined { task, reason } => {
            format!("task {task} could not write its state: {reason}")
        }
        super::AbortReason::Subsumed { by } => format!("checkpoint {by} subsumed it"),
        super::AbortReason::NotCommitted { reason } => {
            format!("it could not be committed: {reason}")
        }
    }
}

const PAYLOAD_MAGIC: &[u8; 8] = b"WEIRJOB\0";
/// Version 2 adds each operator's uid (empty: none), version 3 the state backend that wrote
/// the checkpoint; versions 1 and 2 are still read.
const PAYLOAD_VERSION: u32 = 3;

/// The coordinator's part of `_metadata`: the operators with their uid and parallelism, which
/// subtask each state file (in the metadata's file order) belongs to, and the enumerators'
/// snapshots.
fn encode_payload(plan: &DriverPlan, enumerators: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = ByteWriter::default();
    out.out.extend_from_slice(PAYLOAD_MAGIC);
    out.u32(PAYLOAD_VERSION);
    out.u64(plan.operators.len() as u64);
    for operator in &plan.operators {
        out.text(&operator.id);
        out.text(&operator.name);
        out.text(operator.uid.as_deref().unwrap_or_default());
        out.u64(operator.parallelism as u64);
    }
    out.u64(plan.task_subtasks.len() as u64);
    for &subtask in &plan.task_subtasks {
        out.u64(subtask as u64);
    }
    out.u64(enumerators.len() as u64);
    for (id, bytes) in enumerators {
        out.text(id);
        out.bytes(bytes);
    }
    out.text(plan.backend.config_name());
    out.out
}

/// What [`encode_payload`] wrote.
#[derive(Debug)]
pub(crate) struct Payload {
    pub(crate) operators: Vec<OperatorEntry>,
    /// Per state file, in the metadata's order, the subtask it is of.
    pub(crate) file_subtasks: Vec<usize>,
    pub(crate) enumerators: Vec<(String, Vec<u8>)>,
    /// The state backend that wrote the checkpoint (`None`: a version before 3).
    pub(crate) backend: Option<BackendType>,
}

pub(crate) fn decode_payload(bytes: &[u8], what: &str) -> Result<Payload, String> {
    let mut reader = ByteReader::new(bytes, what);
    let version = reader.header_versions(PAYLOAD_MAGIC, 1..=PAYLOAD_VERSION)?;
    let count = reader.count(24)?;
    let mut operators = Vec::with_capacity(count);
    for _ in 0..count {
        let id = reader.text()?;
        let name = reader.text()?;
        let uid = match version {
            1 => None,
            _ => Some(reader.text()?).filter(|uid| !uid.is_empty()),
        };
        operators.push(OperatorEntry {
            id,
            name,
            uid,
            parallelism: reader.u64()? as usize,
        });
    }
    let count = reader.count(8)?;
    let mut file_subtasks = Vec::with_capacity(count);
    for _ in 0..count {
        file_subtasks.push(reader.u64()? as usize);
    }
    let count = reader.count(16)?;
    let mut enumerators = Vec::with_capacity(count);
    for _ in 0..count {
        enumerators.push((reader.text()?, reader.bytes()?.to_vec()));
    }
    let backend = match version {
        1 | 2 => None,
        _ => {
            let name = reader.text()?;
            Some(
                [BackendType::Heap, BackendType::RocksDb]
                    .into_iter()
                    .find(|backend| backend.config_name() == name)
                    .ok_or_else(|| format!("{what} names the unknown state backend '{name}'"))?,
            )
        }
    };
    if !reader.is_empty() {
        return Err(format!("{what} has bytes after its payload"));
    }
    Ok(Payload {
        operators,
        file_subtasks,
        enumerators,
        backend,
    })
}

/// Where a run's checkpoints go and what it starts from.
pub(crate) struct CheckpointStart {
    pub(crate) storage: CheckpointStorage,
    pub(crate) restored: Option<Arc<RestoredJob>>,
    /// The number of the run's first checkpoint.
    pub(crate) first: u64,
}

/// What a job restores from, and what it does with state the job no longer has a place for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RestoreRules<'a> {
    /// The job's operators now.
    pub(crate) operators: &'a [OperatorEntry],
    /// `--allow-non-restored-state`: state of an operator the job no longer has is left out
    /// (with a warning) instead of refusing the restore.
    pub(crate) allow_non_restored_state: bool,
}

/// Opens job `job`'s checkpoint directory under `root` (taking its lock, unless this executor
/// is a `follower` in a spread run, which only writes into checkpoints its leader begins)
/// and, with `resume: Some(at_least)`, reads back its latest completed checkpoint numbered
/// `at_least` or later (checked against `rules`: see [`read_restored`]); `restored` is `None`
/// when there is no such checkpoint yet.
pub(crate) fn open_checkpoints(
    root: &std::path::Path,
    job: &str,
    resume: Option<u64>,
    rules: RestoreRules<'_>,
    follower: bool,
) -> Result<CheckpointStart, JobError> {
    let refuse = |message: String| JobError::InvalidJob(message);
    let storage = if follower {
        CheckpointStorage::open_shared(root, job)
    } else {
        CheckpointStorage::open(root, job)
    }
    .map_err(|e| refuse(e.to_string()))?;
    let highest = storage
        .highest_number()
        .map_err(|e| refuse(e.to_string()))?;
    let first = highest.map_or(1, |n| n + 1);
    let restored = match resume {
        Some(at_least) => latest_restorable(&storage, job, at_least, rules)?.map(Arc::new),
        None => None,
    };
    Ok(CheckpointStart {
        storage,
        restored,
        first,
    })
}

/// The latest completed checkpoint in `storage` numbered `at_least` or later, read back
/// (see [`open_checkpoints`]); `None` when there is none yet.
fn latest_restorable(
    storage: &CheckpointStorage,
    job: &str,
    at_least: u64,
    rules: RestoreRules<'_>,
) -> Result<Option<RestoredJob>, JobError> {
    let refuse = |message: String| JobError::InvalidJob(message);
    let latest = storage.latest().map_err(|e| refuse(e.to_string()))?;
    for skipped in &latest.skipped {
        tracing::warn!("passing over a checkpoint that cannot be restored: {skipped}");
    }
    let Some(mut completed) = latest.usable else {
        // Attempts cut short before any checkpoint of the job completed hold no state to
        // lose (a kill during the first one): the job has no checkpoint yet.
        if latest.skipped.is_empty() || !storage.has_completed() || at_least > 0 {
            tracing::info!(
                "job '{job}' has no completed checkpoint in {} yet",
                storage.dir().display()
            );
            return Ok(None);
        }
        let reasons: Vec<String> = latest.skipped.iter().map(ToString::to_string).collect();
        return Err(refuse(format!(
            "cannot resume job '{job}': no checkpoint in {} can be restored ({}); remove the \
             directory to start from scratch",
            storage.dir().display(),
            reasons.join("; ")
        )));
    };
    if completed.metadata.checkpoint < at_least {
        // An older run's: this run's restarts take its own checkpoints (or what it began from).
        return Ok(None);
    }
    let mut restored = read_restored(&mut completed, &format!("job '{job}'"), rules)?;
    restored.own = true;
    tracing::info!(
        "job '{job}' resumes from checkpoint {} ({})",
        restored.checkpoint,
        completed.dir.display()
    );
    Ok(Some(restored))
}

/// Reads the savepoint (or retained checkpoint) at `path` back for job `job`, checked against
/// `rules` (see [`read_restored`]). A savepoint of another job is restored by operator ids
/// (uids), as Flink does.
pub(crate) fn open_savepoint(
    path: &std::path::Path,
    job: &str,
    rules: RestoreRules<'_>,
) -> Result<Arc<RestoredJob>, JobError> {
    let mut completed = weir_state::checkpoint::open_savepoint(path).map_err(|error| {
        JobError::InvalidJob(format!(
            "cannot start job '{job}' from savepoint {}: {error}",
            path.display()
        ))
    })?;
    if completed.metadata.job != job {
        tracing::info!(
            "job '{job}' starts from a savepoint of job '{}'; its state goes to the operators \
             with the same ids (uids)",
            completed.metadata.job
        );
    }
    let restored = read_restored(&mut completed, &format!("job '{job}'"), rules)?;
    tracing::info!(
        "job '{job}' starts from savepoint {} (checkpoint {})",
        completed.dir.display(),
        restored.checkpoint
    );
    Ok(Arc::new(restored))
}

/// Reads a completed checkpoint's state files back: refuses state of an operator the job no
/// longer has (or, with `allow_non_restored_state`, leaves it out with a warning); an operator
/// at another parallelism is rescaled (its subtasks share out the old ones' state).
fn read_restored(
    completed: &mut weir_state::checkpoint::CompletedCheckpoint,
    job: &str,
    rules: RestoreRules<'_>,
) -> Result<RestoredJob, JobError> {
    let refuse = |message: String| JobError::InvalidJob(message);
    let metadata_path = completed.dir.join(weir_state::checkpoint::METADATA_FILE);
    let what = metadata_path.display().to_string();
    let payload = decode_payload(&completed.metadata.payload, &what).map_err(refuse)?;
    if payload.file_subtasks.len() != completed.metadata.files.len() {
        return Err(refuse(format!(
            "{what} lists {} state files but says which subtask {} of them belong to; the \
             checkpoint is damaged",
            completed.metadata.files.len(),
            payload.file_subtasks.len()
        )));
    }
    let mut restored = RestoredJob {
        checkpoint: completed.metadata.checkpoint,
        dir: completed.dir.clone(),
        ..RestoredJob::default()
    };
    let subtasks = payload.operators.iter().map(|o| o.parallelism).max();
    for (index, &subtask) in payload.file_subtasks.iter().enumerate() {
        let file = &completed.metadata.files[index];
        if subtask >= subtasks.unwrap_or(0) {
            return Err(refuse(format!(
                "{what} says {} belongs to subtask {subtask}, which no operator of the job has",
                file.name
            )));
        }
        let path: PathBuf = completed.path_of(file);
        let bytes = completed
            .take_state_file(index)
            .map_err(|e| refuse(e.to_string()))?;
        let mut parts = decode_file(&bytes, &path.display().to_string()).map_err(refuse)?;
        super::chain::expand_parts(&completed.dir, &mut parts).map_err(refuse)?;
        restored.add_file(subtask, parts);
    }
    for (id, bytes) in payload.enumerators {
        restored.enumerators.insert(id, bytes);
    }
    let mut left_out = false;
    for old in &payload.operators {
        let has_state =
            restored.parts.contains_key(&old.id) || restored.enumerators.contains_key(&old.id);
        if !has_state {
            continue;
        }
        match rules.operators.iter().find(|now| now.id == old.id) {
            None if rules.allow_non_restored_state => {
                tracing::warn!(
                    "{job} leaves out the state of operator '{}' (id {}) in {}, which the job \
                     no longer has (--allow-non-restored-state)",
                    old.name,
                    old.id,
                    completed.dir.display()
                );
                restored.parts.remove(&old.id);
                restored.enumerators.remove(&old.id);
                left_out = true;
                continue;
            }
            None => {
                return Err(refuse(format!(
                    "{} holds state of operator '{}' (id {}{}), which {job} no longer has; give \
                     the operator that should take it over the same uid, pass \
                     --allow-non-restored-state to start without it, or start from scratch",
                    completed.dir.display(),
                    old.name,
                    old.id,
                    old.uid
                        .as_ref()
                        .map_or_else(String::new, |uid| format!(", uid '{uid}'"))
                )))
            }
            Some(now) if now.parallelism != old.parallelism => tracing::info!(
                "operator '{}' rescales from parallelism {} to {}",
                old.name,
                old.parallelism,
                now.parallelism
            ),
            Some(_) => {}
        }
        restored.parallelism.insert(old.id.clone(), old.parallelism);
    }
    if left_out {
        // The parts left out share their state files' buffers with the parts kept, which
        // the job holds for as long as it runs: the kept ones are copied out, so that the
        // state left out goes now.
        restored.detach_parts();
    }
    Ok(restored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mailbox_delivers_in_order() {
        let mailbox = SourceMailbox::default();
        assert_eq!(mailbox.take(), None);
        mailbox.post(SourceCommand::TriggerCheckpoint(1));
        mailbox.post(SourceCommand::TriggerCheckpoint(2));
        assert_eq!(mailbox.take(), Some(SourceCommand::TriggerCheckpoint(1)));
        assert_eq!(mailbox.take(), Some(SourceCommand::TriggerCheckpoint(2)));
        assert_eq!(mailbox.take(), None);
    }

    #[test]
    fn payload_reads_back() {
        let plan = DriverPlan {
            job: "j".into(),
            settings: CheckpointSettings::every(10),
            retained: 1,
            task_subtasks: vec![0, 1, 0],
            sources: vec![true, true, false],
            operators: vec![OperatorEntry {
                id: "abc".into(),
                name: "source".into(),
                uid: Some("the-source".into()),
                parallelism: 2,
            }],
            enumerators: Box::new(|_| Ok(Vec::new())),
            exactly_once: true,
            incremental: true,
            unaligned: None,
            first: 1,
            savepoints: SavepointHandle::default(),
            savepoint_dir: PathBuf::new(),
            backend: BackendType::RocksDb,
            monitor: crate::monitor::JobMonitor::default(),
            spread: None,
        };
        let bytes = encode_payload(&plan, &[("abc".into(), vec![9, 8])]);
        let payload = decode_payload(&bytes, "_metadata").unwrap();
        assert_eq!(payload.operators, plan.operators);
        assert_eq!(payload.file_subtasks, vec![0, 1, 0]);
        assert_eq!(payload.enumerators, vec![("abc".to_string(), vec![9, 8])]);
        assert_eq!(payload.backend, Some(BackendType::RocksDb));
        assert!(decode_payload(&bytes[..bytes.len() - 1], "_metadata")
            .unwrap_err()
            .contains("_metadata is truncated"));

        // Version 1, before uids: still read, without them.
        let mut v1 = ByteWriter::default();
        v1.out.extend_from_slice(PAYLOAD_MAGIC);
        v1.u32(1);
        v1.u64(1);
        v1.text("abc");
        v1.text("source");
        v1.u64(2);
        v1.u64(0);
        v1.u64(0);
        let payload = decode_payload(&v1.out, "_metadata").unwrap();
        assert_eq!(payload.operators[0].uid, None);
        assert_eq!(payload.operators[0].parallelism, 2);
        assert_eq!(payload.backend, None);
        let mut v4 = v1.out.clone();
        v4[8] = 4;
        assert!(decode_payload(&v4, "_metadata")
            .unwrap_err()
            .contains("format version 4; this build reads versions 1 to 3"));
    }
}
