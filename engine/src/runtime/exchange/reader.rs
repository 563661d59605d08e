//! The receiving side of exchange edges: one input gate per subtask merges the channels of all
//! its input edges, tracks each channel's watermark and end of partition, lines up checkpoint
//! barriers (aligned, at least once, or unaligned: see `inflight.rs`), and reports a channel
//! that closed without ending (its sender failed).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures::stream::{self, LocalBoxStream, SelectAll, Stream, StreamExt};
use rkyv::ser::allocator::Arena;
use weir_memory::Segment;

use super::channel::{Failure, Origin};
use super::frame::{check_segment, closing_barrier, Event, FrameError};
use super::inflight::{
    chunk_of, chunk_of_local, Announcements, Chunk, InputLayout, Recording, RestoredInFlight,
    SharedRecording,
};
use super::local::{BatchRecycler, LocalItem, LocalReceiver};
use crate::checkpoint::CheckpointBarrier;
use crate::error::{TaskError, TaskResult};
use crate::graph::ReceiverEnd;
use crate::metrics::Counter;
use crate::operator::Batch;
use crate::record::{Record, Scratch, Watermark};

/// What one input channel delivered.
pub(crate) enum Delivery<T> {
    /// A segment from a subtask on another shard, or from another process (checked first).
    Segment(Segment),
    /// Records or an event from a subtask on this shard.
    Local(LocalItem<T>),
    /// In-flight data of an unaligned checkpoint, taken off the channel early.
    Recorded(Chunk),
    /// In-flight data restored from a checkpoint: its barriers and checkpoint notices (of the
    /// checkpoints before it) are passed over.
    Restored(Chunk),
}

/// A delivery and the channel it came from.
pub(crate) type Next<T> = (usize, Delivery<T>);

/// How a task's input lines up checkpoint barriers (`execution.checkpointing.mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BarrierAlignment {
    /// Exactly once: a channel whose barrier came is not read until every channel's has.
    Aligned,
    /// At least once: channels are read on; the barrier passes when the last one brings it.
    AtLeastOnce,
}

/// The checkpoint whose barrier some channels have delivered and others not yet.
#[derive(Debug)]
struct Alignment {
    barrier: CheckpointBarrier,
    /// Per channel: whether its barrier came.
    arrived: Vec<bool>,
    /// When the first channel delivered it (or it was announced).
    started: Instant,
    /// The task snapshotted already: the checkpoint is unaligned, and the gate records the
    /// channels whose barrier has not come.
    unaligned: bool,
}

/// What the gate took off a channel early.
enum Queued<T> {
    /// In-flight data, or a segment read ahead (copied, so that its pool segment goes back).
    Chunk(Chunk),
    /// In-flight data restored from a checkpoint.
    Restored(Chunk),
    /// A local channel's item read ahead.
    Local(LocalItem<T>),
    /// The channel ended (after what is queued before it).
    End,
}

/// How many deliveries per channel the gate reads ahead while it works through a backlog of
/// in-flight data, so that the senders' credit keeps coming (a sender waiting for it could not
/// take its next checkpoint) and memory stays bounded (as many as a channel's default credit).
const READ_AHEAD: usize = 16;

/// Unaligned checkpoints at one gate.
struct Unaligned {
    /// `execution.checkpointing.aligned-checkpoint-timeout`: how long a checkpoint aligns
    /// before it goes unaligned (zero: it never aligns).
    timeout: Duration,
    announcements: Announcements,
    /// This task's index among the job's tasks (where its announcements are).
    task: usize,
    /// What feeds the channels (recorded with the in-flight data).
    layout: InputLayout,
    /// The checkpoint whose in-flight data is being taken, and per channel whether it still
    /// is (its barrier has not come, and it has not ended).
    recording: Option<(SharedRecording, Vec<bool>)>,
    /// The recording of the checkpoint that just went unaligned, until the task takes it.
    started: Option<SharedRecording>,
    /// Archives local channels' records into chunks.
    arena: Arena,
}

impl Drop for Unaligned {
    fn drop(&mut self) {
        if let Some((recording, _)) = self.recording.take() {
            let checkpoint = recording.borrow().checkpoint;
            recording.borrow_mut().fail(format!(
                "the task ended before checkpoint {checkpoint}'s in-flight data was all in"
            ));
        }
    }
}

/// Whether a channel is held for barrier alignment, shared by the gate and the channel's
/// stream: a held stream answers `Pending` without looking at its channel, and is woken when
/// the gate lets it go.
#[derive(Default)]
struct Hold {
    held: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Hold {
    fn release(&self) {
        self.held.set(false);
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }
}

/// A channel's deliveries, unless the gate holds it.
struct Holdable<S> {
    deliveries: S,
    hold: Rc<Hold>,
}

impl<S: Stream + Unpin> Stream for Holdable<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        if self.hold.held.get() {
            *self.hold.waker.borrow_mut() = Some(cx.waker().clone());
            return Poll::Pending;
        }
        self.deliveries.poll_next_unpin(cx)
    }
}

/// Merges the input channels of one subtask (only channels that were woken are polled); a
/// channel held for barrier alignment is not read until the gate lets it go.
pub(crate) struct InputGate<T> {
    channels: SelectAll<LocalBoxStream<'static, (usize, Option<Delivery<T>>)>>,
    /// Per channel, the check a segment from another process failed: the channel ended there.
    refusals: Vec<Rc<RefCell<Option<FrameError>>>>,
    /// Per channel, why it failed once it ended (a channel from another process whose
    /// connection was lost).
    failures: Vec<Failure>,
    /// Per channel, the process its sender is in when another (its slot and node), which a
    /// failure names.
    peers: Vec<Option<String>>,
    /// Per channel, whether it is held.
    holds: Vec<Rc<Hold>>,
    /// Per channel, where a local channel's emptied batches go back to.
    recyclers: Vec<Option<BatchRecycler<T>>>,
    watermarks: Vec<Watermark>,
    ended: Vec<bool>,
    /// Per channel, whether its data ended (`Event::EndOfData`, or the channel ended).
    data_ended: Vec<bool>,
    idle: Vec<bool>,
    /// Whether a channel counts towards the minimum (false after it returned from idleness
    /// behind the input watermark, until it catches up).
    aligned: Vec<bool>,
    current: Watermark,
    /// Whether the task's input is idle (all open channels are).
    idle_output: bool,
    alignment_mode: BarrierAlignment,
    alignment: Option<Alignment>,
    /// The last few checkpoints whose barriers lined up here, and how long each took (the
    /// task may take a barrier after the next one lined up).
    alignments: VecDeque<(u64, Duration)>,
    /// The newest checkpoint (or savepoint) whose barrier reached the gate: a barrier of an
    /// older one that comes later (in in-flight data, or replayed after a restore) is passed
    /// over.
    newest: u64,
    /// The newest checkpoint whose completion (abort) the task was told of.
    notified_complete: u64,
    notified_aborted: u64,
    /// A channel ended with `Event::Suspend` (the job stops with a savepoint).
    suspended: bool,
    /// Unaligned checkpoints, when enabled.
    unaligned: Option<Unaligned>,
    /// Deliveries taken off their channels early (in-flight data, and what is read ahead
    /// behind it) and restored ones, in order: delivered before anything else.
    queued: VecDeque<(usize, Queued<T>)>,
    /// Per channel, how many deliveries `queued` holds, and whether one of them ends in a
    /// barrier (the channel is not read ahead past it: an aligned checkpoint holds it there).
    queued_count: Vec<usize>,
    queued_barrier: Vec<bool>,
    /// Per channel, how many deliveries `queued` may hold before the channel is no longer
    /// read ahead: [`READ_AHEAD`] more than its backlog of in-flight data, so that each one the
    /// task takes lets one more in and the sender's credit comes at the task's pace.
    queued_limit: Vec<usize>,
    /// Per channel, whether its stream ended (its end may still wait in `queued`).
    closed: Vec<bool>,
}
impl<T: Record> InputGate<T> {
    /// A gate over `inputs`, adding the bytes of every segment a channel from another shard
    /// delivers to `bytes_in` (as it arrives, whether the task reads it at once or queues it).
    pub(crate) fn new(
        inputs: Vec<ReceiverEnd>,
        alignment_mode: BarrierAlignment,
        bytes_in: Counter,
    ) -> Self {
        let count = inputs.len();
        let mut recyclers = Vec::with_capacity(count);
        let mut holds = Vec::with_capacity(count);
        let mut failures = Vec::with_capacity(count);
        let mut peers = Vec::with_capacity(count);
        let refusals: Vec<Rc<RefCell<Option<FrameError>>>> =
            (0..count).map(|_| Rc::default()).collect();
        let channels = stream::select_all(inputs.into_iter().enumerate().map(|(i, input)| {
            let deliveries = match input {
                ReceiverEnd::Segments(receiver) => {
                    recyclers.push(None);
                    failures.push(receiver.failure.clone());
                    peers.push(receiver.peer.clone());
                    let bytes_in = bytes_in.clone();
                    let segments = receiver
                        .segments
                        .inspect(move |segment| bytes_in.add(segment.len() as u64));
                    match receiver.origin {
                        Origin::ThisProcess => segments.map(Delivery::Segment).boxed_local(),
                        // Nothing reads another process's bytes before they pass the check; the
                        // first that fails ends the channel.
                        Origin::Peer => {
                            let refusal = Rc::clone(&refusals[i]);
                            segments
                                .scan((), move |(), segment| {
                                    let checked = check_segment::<T>(segment.filled());
                                    std::future::ready(match checked {
                                        Ok(()) => Some(Delivery::Segment(segment)),
                                        Err(error) => {
                                            *refusal.borrow_mut() = Some(error);
                                            None
                                        }
                                    })
                                })
                                .boxed_local()
                        }
                    }
                }
                ReceiverEnd::Local(channel) => {
                    let receiver = LocalReceiver::<T>::from_any(channel);
                    recyclers.push(Some(receiver.recycler()));
                    failures.push(Failure::default());
                    peers.push(None);
                    receiver.map(Delivery::Local).boxed_local()
                }
            };
            let hold = Rc::new(Hold::default());
            holds.push(Rc::clone(&hold));
            Holdable { deliveries, hold }
                .map(move |delivery| (i, Some(delivery)))
                .chain(stream::once(async move { (i, None) }))
                .boxed_local()
        }));
        InputGate {
            channels,
            refusals,
            failures,
            peers,
            holds,
            recyclers,
            watermarks: Vec::new(),
            ended: Vec::new(),
            data_ended: Vec::new(),
            idle: Vec::new(),
            aligned: Vec::new(),
            current: Watermark::MIN,
            idle_output: false,
            alignment_mode,
            alignment: None,
            alignments: VecDeque::new(),
            notified_complete: 0,
            notified_aborted: 0,
            suspended: false,
            newest: 0,
            unaligned: None,
            queued: VecDeque::new(),
            queued_count: Vec::new(),
            queued_barrier: Vec::new(),
            queued_limit: Vec::new(),
            closed: Vec::new(),
        }
        .with_channels(count)
    }

    /// Gives a local channel's emptied batch back to its sender.
    pub(crate) fn recycle(&self, channel: usize, batch: Batch<T>) {
        if let Some(recycler) = &self.recyclers[channel] {
            recycler.recycle(batch);
        }
    }

    fn with_channels(mut self, count: usize) -> Self {
        self.watermarks = vec![Watermark::MIN; count];
        self.ended = vec![false; count];
        self.data_ended = vec![false; count];
        self.idle = vec![false; count];
        self.aligned = vec![true; count];
        self.closed = vec![false; count];
        self.queued_count = vec![0; count];
        self.queued_barrier = vec![false; count];
        self.queued_limit = vec![READ_AHEAD; count];
        self
    }

    /// Takes unaligned checkpoints (`execution.checkpointing.unaligned.enabled`): a
    /// checkpoint announced in `announcements` for task `task`, or whose barriers took longer
    /// than `timeout` to align, is snapshotted at once (see [`InputGate::poll_checkpoint`]).
    pub(crate) fn unaligned(
        mut self,
        timeout: Duration,
        announcements: Announcements,
        task: usize,
        layout: InputLayout,
    ) -> Self {
        self.unaligned = Some(Unaligned {
            timeout,
            announcements,
            task,
            layout,
            recording: None,
            started: None,
            arena: Arena::new(),
        });
        self
    }

    /// Restores the in-flight data of an unaligned checkpoint: it is delivered first (as
    /// [`Delivery::Restored`]: the barriers and notices in it, of checkpoints before it, are
    /// passed over).
    pub(crate) fn restoring(mut self, in_flight: RestoredInFlight) -> Self {
        for (channel, chunk) in in_flight.chunks {
            self.enqueue(channel, Queued::Restored(chunk));
        }
        for (limit, count) in self.queued_limit.iter_mut().zip(&self.queued_count) {
            *limit = count + READ_AHEAD;
        }
        self
    }

    /// The next delivery and its channel, or `None` once every channel has ended. While an
    /// unaligned checkpoint takes in-flight data, the channels whose barrier has not come are
    /// emptied first (as far as they hold anything), so that their senders get their credit
    /// back at once.
    pub(crate) async fn next(&mut self) -> TaskResult<Option<Next<T>>> {
        std::future::poll_fn(|cx| self.poll_next_delivery(cx)).await
    }

    fn poll_next_delivery(&mut self, cx: &mut Context<'_>) -> Poll<TaskResult<Option<Next<T>>>> {
        loop {
            if self.recording_channels().is_some() {
                self.take_in_flight(cx);
            }
            if !self.queued.is_empty() {
                self.read_ahead(cx);
            }
            if let Some((channel, queued)) = self.queued.pop_front() {
                self.queued_count[channel] -= 1;
                if self.queued_count[channel] == 0 {
                    self.queued_barrier[channel] = false;
                    self.queued_limit[channel] = READ_AHEAD;
                }
                let delivery = match queued {
                    Queued::Chunk(chunk) => Delivery::Recorded(chunk),
                    Queued::Restored(chunk) => Delivery::Restored(chunk),
                    Queued::Local(item) => Delivery::Local(item),
                    Queued::End => match self.channel_closed(channel) {
                        Ok(()) => continue,
                        Err(error) => return Poll::Ready(Err(error)),
                    },
                };
                return Poll::Ready(Ok(Some((channel, delivery))));
            }
            match self.channels.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(Ok(None)),
                Poll::Ready(Some((channel, next))) if self.is_recording(channel) => {
                    self.record(channel, next);
                }
                Poll::Ready(Some((channel, Some(delivery)))) => {
                    return Poll::Ready(Ok(Some((channel, delivery))))
                }
                Poll::Ready(Some((channel, None))) => {
                    self.closed[channel] = true;
                    if let Err(error) = self.channel_closed(channel) {
                        return Poll::Ready(Err(error));
                    }
                }
            }
        }
    }

    /// Queues what a channel delivered behind what the gate holds already.
    fn enqueue(&mut self, channel: usize, queued: Queued<T>) {
        let barrier = match &queued {
            Queued::Chunk(chunk) => closing_barrier(chunk).map(|(_, barrier)| barrier),
            Queued::Local(LocalItem::Event(Event::Barrier(barrier))) => Some(*barrier),
            Queued::Restored(_) | Queued::Local(_) | Queued::End => None,
        };
        // A barrier older than the newest one reached is passed over (`on_barrier`).
        self.queued_barrier[channel] |= barrier.is_some_and(|b| b.id >= self.newest);
        self.queued_count[channel] += 1;
        self.queued.push_back((channel, queued));
    }

    /// While the task works through queued deliveries, reads the channels on behind them (up
    /// to each one's `queued_limit`), except channels held for alignment, recorded ones (taken by
    /// `take_in_flight`) and channels whose queued deliveries end in a barrier.
    fn read_ahead(&mut self, cx: &mut Context<'_>) {
        let held: Vec<bool> = self.holds.iter().map(|hold| hold.held.get()).collect();
        let blocked = |gate: &Self, channel: usize| {
            held[channel]
                || gate.is_recording(channel)
                || gate.queued_barrier[channel]
                || gate.queued_count[channel] >= gate.queued_limit[channel]
        };
        for channel in 0..held.len() {
            self.holds[channel].held.set(blocked(self, channel));
        }
        while let Poll::Ready(Some((channel, next))) = self.channels.poll_next_unpin(cx) {
            let queued = match next {
                None => {
                    self.closed[channel] = true;
                    Queued::End
                }
                Some(Delivery::Segment(segment)) => Queued::Chunk(chunk_of(segment.filled())),
                Some(Delivery::Local(item)) => Queued::Local(item),
                Some(Delivery::Recorded(chunk)) => Queued::Chunk(chunk),
                Some(Delivery::Restored(chunk)) => Queued::Restored(chunk),
            };
            self.enqueue(channel, queued);
            if blocked(self, channel) {
                self.holds[channel].held.set(true);
            }
        }
        for (hold, held) in self.holds.iter().zip(held) {
            if !held {
                hold.release();
            }
        }
    }

    /// A channel's stream ended: fine if its sender ended it, a failure if not (or if a
    /// segment from another process failed its check).
    fn channel_closed(&self, channel: usize) -> TaskResult {
        if let Some(error) = self.refusals[channel].borrow().as_ref() {
            return Err(TaskError::external(format!(
                "input channel {channel} brought a segment from another process that is not \
                 valid ({error}); nothing of it was read"
            )));
        }
        if self.ended[channel] {
            return Ok(());
        }
        if let Some(cause) = self.failures[channel].borrow().as_ref() {
            return Err(TaskError::external(format!(
                "input channel {channel} failed before its sender ended it: {cause}"
            )));
        }
        Err(match &self.peers[channel] {
            None => TaskError::consequence(
                "an upstream subtask closed its channel without ending it (it failed or was \
                 cancelled)",
            ),
            Some(peer) => TaskError::cut_by_peer(format!(
                "input channel {channel} from {peer} closed before its sender ended it (its \
                 subtask failed or was cancelled, or its run ended)"
            )),
        })
    }

    /// Per channel, whether its in-flight data is being taken (`None`: no unaligned
    /// checkpoint takes any).
    fn recording_channels(&self) -> Option<&[bool]> {
        let (_, channels) = self.unaligned.as_ref()?.recording.as_ref()?;
        Some(channels)
    }

    /// When the checkpoint aligning now goes unaligned, if it may (see
    /// [`InputGate::poll_checkpoint`]).
    pub(crate) fn alignment_deadline(&self) -> Option<Instant> {
        let timeout = self.unaligned.as_ref()?.timeout;
        let alignment = self.alignment.as_ref()?;
        (!alignment.unaligned && alignment.barrier.may_overtake())
            .then(|| alignment.started + timeout)
    }

    /// The checkpoint whose in-flight data is being taken.
    fn recording_checkpoint(&self) -> Option<u64> {
        let (recording, _) = self.unaligned.as_ref()?.recording.as_ref()?;
        let checkpoint = recording.borrow().checkpoint;
        Some(checkpoint)
    }

    fn is_recording(&self, channel: usize) -> bool {
        self.recording_channels()
            .is_some_and(|channels| channels[channel])
    }

    /// Takes what the recorded channels hold now: the other channels are held meanwhile (a
    /// channel too once its barrier came), so that only in-flight data is taken early. An
    /// unaligned checkpoint holds no channel otherwise, so all are let go after.
    fn take_in_flight(&mut self, cx: &mut Context<'_>) {
        let Some(recording) = self.recording_channels() else {
            return;
        };
        for (hold, recorded) in self.holds.iter().zip(recording) {
            hold.held.set(!recorded);
        }
        while self.recording_channels().is_some() {
            match self.channels.poll_next_unpin(cx) {
                Poll::Ready(Some((channel, next))) => {
                    self.record(channel, next);
                    if !self.is_recording(channel) {
                        self.holds[channel].held.set(true);
                    }
                }
                Poll::Ready(None) | Poll::Pending => break,
            }
        }
        self.release_all();
    }

    /// Records what a recorded channel delivered (`None`: it ended) as in-flight data, up to
    /// the checkpoint's barrier, and queues it for the task.
    fn record(&mut self, channel: usize, next: Option<Delivery<T>>) {
        let Some((recording, _)) = self.unaligned.as_ref().and_then(|u| u.recording.as_ref())
        else {
            return;
        };
        let recording = Rc::clone(recording);
        let checkpoint = recording.borrow().checkpoint;
        let newer = match &next {
            Some(Delivery::Segment(segment)) => closing_barrier(segment.filled()),
            Some(Delivery::Local(LocalItem::Event(Event::Barrier(barrier)))) => Some((0, *barrier)),
            _ => None,
        }
        .filter(|(_, barrier)| barrier.id > checkpoint);
        if let Some((_, barrier)) = newer {
            // The sender gave this checkpoint up (its alignment timed out into a newer one):
            // its barrier will not come on this channel. What came is queued as it is, and
            // the task starts the newer checkpoint when it reaches its barrier.
            self.give_up_recording(format!(
                "checkpoint {checkpoint} was given up upstream for checkpoint {} before its \
                 in-flight data was all in",
                barrier.id
            ));
            let queued = match next {
                Some(Delivery::Segment(segment)) => Queued::Chunk(chunk_of(segment.filled())),
                Some(Delivery::Local(item)) => Queued::Local(item),
                _ => unreachable!("a barrier came in a segment or a local event"),
            };
            self.enqueue(channel, queued);
            return;
        }
        let (chunk, arrived) = match next {
            None => {
                self.closed[channel] = true;
                self.enqueue(channel, Queued::End);
                (None, true)
            }
            Some(Delivery::Segment(segment)) => {
                let bytes = segment.filled();
                match closing_barrier(bytes) {
                    Some((at, barrier)) if barrier.id == checkpoint => {
                        ((at > 0).then(|| chunk_of(&bytes[..at])), true)
                    }
                    _ => (Some(chunk_of(bytes)), false),
                }
            }
            Some(Delivery::Local(LocalItem::Event(Event::Barrier(barrier))))
                if barrier.id == checkpoint =>
            {
                (None, true)
            }
            Some(Delivery::Local(item)) => {
                let arena = &mut self.unaligned.as_mut().expect("recording").arena;
                let chunk = chunk_of_local(&item, &mut Scratch::new(arena));
                if let LocalItem::Records(batch) = item {
                    if let Some(recycler) = &self.recyclers[channel] {
                        recycler.recycle(batch);
                    }
                }
                (Some(chunk), false)
            }
            Some(Delivery::Recorded(chunk) | Delivery::Restored(chunk)) => (Some(chunk), false),
        };
        if let Some(chunk) = chunk {
            recording.borrow_mut().add(channel, Rc::clone(&chunk));
            self.enqueue(channel, Queued::Chunk(chunk));
        }
        drop(recording);
        if arrived {
            if let Some(alignment) = &mut self.alignment {
                alignment.arrived[channel] = true;
            }
            self.stop_recording(channel);
        }
    }

    /// Gives the recording up (its checkpoint is declined at this task) and ends the
    /// checkpoint's alignment.
    fn give_up_recording(&mut self, reason: String) {
        if let Some((recording, channels)) =
            self.unaligned.as_mut().and_then(|u| u.recording.take())
        {
            recording.borrow_mut().fail(reason);
            self.alignment = None;
            // The channels it took data off are read on behind their backlog.
            for (channel, recorded) in channels.into_iter().enumerate() {
                if recorded {
                    self.queued_limit[channel] = self.queued_count[channel] + READ_AHEAD;
                }
            }
        }
    }

    /// `channel`'s in-flight data is all in; the recording is complete once every channel's is.
    fn stop_recording(&mut self, channel: usize) {
        self.queued_limit[channel] = self.queued_count[channel] + READ_AHEAD;
        let Some(unaligned) = self.unaligned.as_mut() else {
            return;
        };
        let Some((recording, channels)) = &mut unaligned.recording else {
            return;
        };
        channels[channel] = false;
        if channels.iter().all(|recorded| !recorded) {
            recording.borrow_mut().complete();
            unaligned.recording = None;
            self.alignment = None;
        }
    }

    /// Looks for an unaligned checkpoint to take before the task reads on: one announced by an
    /// upstream writer, or one whose alignment took longer than the aligned-checkpoint
    /// timeout. Pushes [`GateEvent::Barrier`] when the task snapshots.
    pub(crate) fn poll_checkpoint(&mut self, out: &mut Vec<GateEvent>) {
        let Some(unaligned) = &self.unaligned else {
            return;
        };
        let announced = unaligned.announcements.newest(unaligned.task);
        if announced > self.newest {
            self.start(CheckpointBarrier::checkpoint(announced), out);
        }
        if self
            .alignment_deadline()
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            self.go_unaligned(out);
        }
    }

    /// The in-flight data of unaligned checkpoint `checkpoint`, which the gate has just
    /// started taking (it may be complete already: what the gate had queued may hold every
    /// channel's barrier), for the task's state file; once.
    pub(crate) fn take_recording(&mut self, checkpoint: u64) -> Option<SharedRecording> {
        let started = self.unaligned.as_mut()?.started.take()?;
        let matches = started.borrow().checkpoint == checkpoint;
        matches.then_some(started)
    }

    /// A channel told of checkpoint `checkpoint`'s completion (`complete`) or abort: pushes
    /// [`GateEvent::CheckpointComplete`] (`CheckpointAborted`) the first time any channel
    /// tells of it or of a newer one. Every upstream subtask sends each notice on every
    /// channel, and a newer completion covers an older one (as Flink's notifications do).
    pub(crate) fn on_checkpoint_notice(
        &mut self,
        checkpoint: u64,
        complete: bool,
        out: &mut Vec<GateEvent>,
    ) {
        let (newest, event) = if complete {
            (
                &mut self.notified_complete,
                GateEvent::CheckpointComplete(checkpoint),
            )
        } else {
            (
                &mut self.notified_aborted,
                GateEvent::CheckpointAborted(checkpoint),
            )
        };
        if checkpoint > *newest {
            *newest = checkpoint;
            out.push(event);
        }
    }

    /// Records that `channel` delivered the barrier of `checkpoint`; pushes
    /// [`GateEvent::Barrier`] once every open channel has (the task snapshots then), and stops
    /// reading `channel` until then when aligning. A barrier of a newer checkpoint while an
    /// older one aligns ends the older one: it cannot complete (an upstream task gave it up),
    /// and the newer one covers everything it would have. An unaligned checkpoint pushes its
    /// barrier when it starts instead (at the first barrier, or once it timed out aligning).
    pub(crate) fn on_barrier(
        &mut self,
        channel: usize,
        barrier: CheckpointBarrier,
        out: &mut Vec<GateEvent>,
    ) {
        if barrier.id < self.newest {
            return;
        }
        if barrier.id > self.newest {
            self.start(barrier, out);
        }
        let Some(alignment) = &mut self.alignment else {
            // The checkpoint ended here already.
            return;
        };
        if alignment.barrier.id != barrier.id {
            return;
        }
        alignment.arrived[channel] = true;
        if alignment.unaligned {
            self.stop_recording(channel);
            return;
        }
        if self.alignment_mode == BarrierAlignment::Aligned {
            if let Some(hold) = self.holds.get(channel) {
                hold.held.set(true);
            }
        }
        self.complete_alignment(out);
    }

    /// How long the barriers of `checkpoint` took to line up here: from the first channel's
    /// barrier to the last one's, or until the checkpoint went unaligned (Flink's alignment
    /// duration); `None` if they did not (yet).
    pub(crate) fn alignment_of(&self, checkpoint: u64) -> Option<Duration> {
        self.alignments
            .iter()
            .find(|(id, _)| *id == checkpoint)
            .map(|&(_, took)| took)
    }

    /// Starts the alignment of `barrier`, ending an older one's (and its recording); an
    /// unaligned checkpoint without an alignment timeout goes unaligned at once.
    fn start(&mut self, barrier: CheckpointBarrier, out: &mut Vec<GateEvent>) {
        self.newest = barrier.id;
        self.release_all();
        if let Some(older) = self.recording_checkpoint() {
            self.give_up_recording(format!(
                "checkpoint {older} was given up for checkpoint {} before its in-flight data \
                 was all in",
                barrier.id
            ));
        }
        self.alignment = Some(Alignment {
            barrier,
            arrived: vec![false; self.ended.len()],
            started: Instant::now(),
            unaligned: false,
        });
        if barrier.may_overtake()
            && self
                .unaligned
                .as_ref()
                .is_some_and(|unaligned| unaligned.timeout.is_zero())
        {
            self.go_unaligned(out);
        }
    }

    /// The aligning checkpoint goes unaligned: the task snapshots now, the held channels are
    /// read again, and the data of the channels whose barrier has not come is recorded (with
    /// what the gate had queued still, which the snapshot does not hold either).
    fn go_unaligned(&mut self, out: &mut Vec<GateEvent>) {
        let newest = self.newest;
        let newer_queued = self.queued.iter().any(|(_, queued)| match queued {
            Queued::Chunk(chunk) => closing_barrier(chunk).is_some_and(|(_, b)| b.id > newest),
            Queued::Local(LocalItem::Event(Event::Barrier(barrier))) => barrier.id > newest,
            _ => false,
        });
        if newer_queued {
            // An upstream task gave this checkpoint up for a newer one, whose barrier the
            // task reaches first: it never completes here. The channels it held are read on.
            self.alignment = None;
            self.release_all();
            return;
        }
        let (Some(alignment), Some(unaligned)) = (&mut self.alignment, &mut self.unaligned) else {
            return;
        };
        alignment.unaligned = true;
        let checkpoint = alignment.barrier.id;
        aligned(
            &mut self.alignments,
            checkpoint,
            alignment.started.elapsed(),
        );
        out.push(GateEvent::Barrier(alignment.barrier));
        // What the gate holds queued is in flight too, up to a channel's barrier if one of
        // its queued deliveries ends in it (read ahead, the task has not seen it).
        let recording = Recording::new(checkpoint, self.ended.len(), Arc::clone(&unaligned.layout));
        for (channel, queued) in &mut self.queued {
            let channel = *channel;
            if alignment.arrived[channel] {
                continue;
            }
            let chunk = match queued {
                Queued::Restored(chunk) => Some(Rc::clone(chunk)),
                Queued::Chunk(chunk) => match closing_barrier(chunk) {
                    Some((at, barrier)) if barrier.id == checkpoint => {
                        alignment.arrived[channel] = true;
                        (at > 0).then(|| chunk_of(&chunk[..at]))
                    }
                    _ => Some(Rc::clone(chunk)),
                },
                Queued::Local(LocalItem::Event(Event::Barrier(barrier)))
                    if barrier.id == checkpoint =>
                {
                    alignment.arrived[channel] = true;
                    None
                }
                Queued::Local(item) => Some(chunk_of_local(
                    item,
                    &mut Scratch::new(&mut unaligned.arena),
                )),
                Queued::End => None,
            };
            if let Some(chunk) = chunk {
                recording.borrow_mut().add(channel, chunk);
            }
        }
        let channels: Vec<bool> = (0..self.ended.len())
            .map(|channel| {
                !alignment.arrived[channel] && !self.ended[channel] && !self.closed[channel]
            })
            .collect();
        let done = channels.iter().all(|recorded| !recorded);
        unaligned.started = Some(Rc::clone(&recording));
        unaligned.recording = Some((recording, channels));
        for hold in &self.holds {
            hold.release();
        }
        if done {
            if let Some((recording, _)) = unaligned.recording.take() {
                recording.borrow_mut().complete();
            }
            self.alignment = None;
        }
    }

    fn release_all(&mut self) {
        for hold in &self.holds {
            hold.release();
        }
    }

    /// Ends the alignment once every channel still open has delivered its barrier.
    fn complete_alignment(&mut self, out: &mut Vec<GateEvent>) {
        let Some(alignment) = &self.alignment else {
            return;
        };
        if alignment.unaligned {
            // Its recording ends with the channels (`stop_recording`).
            return;
        }
        let complete =
            (0..self.ended.len()).all(|channel| alignment.arrived[channel] || self.ended[channel]);
        if complete {
            out.push(GateEvent::Barrier(alignment.barrier));
            aligned(
                &mut self.alignments,
                alignment.barrier.id,
                alignment.started.elapsed(),
            );
            self.alignment = None;
            self.release_all();
        }
    }

    /// Recomputes the input watermark — the minimum over channels that are active and aligned
    /// (a channel that returns from idleness behind the current watermark rejoins once it
    /// catches up, as in Flink) — and the idle status: idle when every channel still open is.
    fn advance(&mut self, out: &mut Vec<GateEvent>) {
        let mut min: Option<Watermark> = None;
        let mut all_idle = true;
        for channel in 0..self.watermarks.len() {
            if self.idle[channel] {
                continue;
            }
            all_idle &= self.ended[channel];
            if !self.aligned[channel] && self.watermarks[channel] >= self.current {
                self.aligned[channel] = true;
            }
            if self.aligned[channel] {
                min = Some(min.map_or(self.watermarks[channel], |m| {
                    m.min(self.watermarks[channel])
                }));
            }
        }
        let open_channels = self.ended.iter().filter(|e| !**e).count();
        let idle = open_channels > 0 && all_idle;
        if !idle && self.idle_output {
            self.idle_output = false;
            out.push(GateEvent::Status { idle: false });
        }
        if let Some(min) = min.filter(|m| *m > self.current) {
            self.current = min;
            out.push(GateEvent::Watermark(min));
        }
        if idle && !self.idle_output {
            // The last active channel went idle: event time may go as far as the most
            // advanced channel has seen (Flink's StatusWatermarkValve does the same).
            let highest = (0..self.watermarks.len())
                .filter(|&c| !self.ended[c])
                .map(|c| self.watermarks[c])
                .max();
            if let Some(highest) = highest.filter(|h| *h > self.current) {
                self.current = highest;
                out.push(GateEvent::Watermark(highest));
            }
            self.idle_output = true;
            out.push(GateEvent::Status { idle: true });
        }
    }

    /// Records a channel's watermark; pushes the task's new input watermark if it advanced.
    /// Watermarks never go backwards.
    pub(crate) fn on_watermark(
        &mut self,
        channel: usize,
        watermark: Watermark,
        out: &mut Vec<GateEvent>,
    ) {
        if watermark > self.watermarks[channel] {
            self.watermarks[channel] = watermark;
        }
        if self.idle[channel] {
            // A watermark from an idle channel makes it active again (its sender sends an
            // active status first; the final watermark of an ending input may not).
            self.idle[channel] = false;
            self.aligned[channel] = self.watermarks[channel] >= self.current;
        }
        self.advance(out);
    }

    /// Records that a channel became idle or active again.
    pub(crate) fn on_watermark_status(
        &mut self,
        channel: usize,
        idle: bool,
        out: &mut Vec<GateEvent>,
    ) {
        if self.ended[channel] || self.idle[channel] == idle {
            return;
        }
        self.idle[channel] = idle;
        if !idle {
            self.aligned[channel] = self.watermarks[channel] >= self.current;
        }
        self.advance(out);
    }

    /// Records that a channel ended; it no longer holds event time back.
    /// A channel that ends while a barrier aligns no longer holds it back.
    pub(crate) fn on_end_of_partition(&mut self, channel: usize, out: &mut Vec<GateEvent>) {
        self.ended[channel] = true;
        self.on_end_of_data(channel, out);
        self.complete_alignment(out);
    }

    /// Records that a channel's data ended (its sender finished; the channel stays open for
    /// the final checkpoint): it no longer holds event time back, and once every channel's
    /// data ended pushes [`GateEvent::EndOfData`] (the task finishes its operators).
    pub(crate) fn on_end_of_data(&mut self, channel: usize, out: &mut Vec<GateEvent>) {
        if self.data_ended[channel] {
            return;
        }
        self.data_ended[channel] = true;
        self.idle[channel] = false;
        self.aligned[channel] = true;
        self.watermarks[channel] = Watermark::MAX;
        self.advance(out);
        // Each channel's data ends once: the last one to end pushes the end of data, once.
        if self.data_ended.iter().all(|ended| *ended) {
            out.push(GateEvent::EndOfData);
        }
    }

    /// `channel` ended because the job stops with a savepoint (`Event::Suspend`): it sends
    /// nothing more, and its watermark stays where it was (no final watermark).
    pub(crate) fn on_suspend(&mut self, channel: usize, out: &mut Vec<GateEvent>) {
        self.ended[channel] = true;
        self.suspended = true;
        self.complete_alignment(out);
    }

    /// Whether a channel ended with `Event::Suspend`: the task closes without finishing.
    pub(crate) fn is_suspended(&self) -> bool {
        self.suspended
    }

    /// A channel's watermark (`i64::MIN` before its first) and whether it is idle.
    pub(crate) fn channel_time(&self, channel: usize) -> (i64, bool) {
        (self.watermarks[channel].0, self.idle[channel])
    }
}

/// Notes in `alignments` (the last few) that `checkpoint`'s barriers took `took` to line up.
fn aligned(alignments: &mut VecDeque<(u64, Duration)>, checkpoint: u64, took: Duration) {
    if alignments.len() == 4 {
        alignments.pop_front();
    }
    alignments.push_back((checkpoint, took));
}

/// What the gate tells its task's chain about event time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GateEvent {
    Watermark(Watermark),
    Status {
        idle: bool,
    },
    /// Every channel delivered this checkpoint's (or savepoint's) barrier.
    Barrier(CheckpointBarrier),
    /// The first channel told of this checkpoint's completion (a notice arrives once per
    /// channel; the task hears of it once).
    CheckpointComplete(u64),
    /// The first channel told of this checkpoint's abort.
    CheckpointAborted(u64),
    /// Every channel's data ended: the task finishes its operators (`ChainEvent::Finish`).
    EndOfData,
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::super::channel::SegmentReceiver;
    use super::super::frame::Event;
    use super::super::local::{LocalChannel, LocalSender};
    use super::*;

    /// What a task reading the gate sees, in order: records by value (`r` before those read
    /// from in-flight data), and barriers passed. Looks for unaligned checkpoints before each
    /// delivery, as the task does.
    fn drain(gate: &mut InputGate<u32>) -> Vec<String> {
        let mut seen = Vec::new();
        let mut events = Vec::new();
        loop {
            gate.poll_checkpoint(&mut events);
            seen.extend(passed(&mut events));
            let Some(next) = gate.next().now_or_never() else {
                break;
            };
            let Some((channel, delivery)) = next.expect("no channel failed") else {
                break;
            };
            let mut on_event = |gate: &mut InputGate<u32>, event| match event {
                Event::Barrier(barrier) => gate.on_barrier(channel, barrier, &mut events),
                Event::EndOfPartition => gate.on_end_of_partition(channel, &mut events),
                _ => {}
            };
            match delivery {
                Delivery::Local(LocalItem::Records(batch)) => {
                    seen.extend(batch.records.iter().map(u32::to_string));
                }
                Delivery::Local(LocalItem::Event(event)) => on_event(gate, event),
                Delivery::Recorded(chunk) | Delivery::Restored(chunk) => {
                    for entry in super::super::frame::Entries::of(&chunk) {
                        match entry {
                            super::super::frame::Entry::Record(bytes, _) => {
                                // SAFETY: archived as `u32` by the gate, 16-byte aligned.
                                let record = unsafe { u32::decode(bytes) };
                                seen.push(format!("r{record}"));
                            }
                            super::super::frame::Entry::Event(event) => on_event(gate, event),
                        }
                    }
                }
                Delivery::Segment(_) => {}
            }
            seen.extend(passed(&mut events));
        }
        seen
    }

    fn passed(events: &mut Vec<GateEvent>) -> Vec<String> {
        events
            .drain(..)
            .filter_map(|event| match event {
                GateEvent::Barrier(barrier) => Some(format!("barrier {}", barrier.id)),
                _ => None,
            })
            .collect()
    }

    /// Looks for an unaligned checkpoint before the next delivery, as the task does: checkpoint
    /// `id`'s barrier passes at once, and its recording is taken.
    fn snapshot_at_once(gate: &mut InputGate<u32>, id: u64) -> SharedRecording {
        let mut events = Vec::new();
        gate.poll_checkpoint(&mut events);
        assert_eq!(
            events,
            vec![GateEvent::Barrier(CheckpointBarrier::checkpoint(id))]
        );
        gate.take_recording(id).expect("the recording")
    }

    /// A recording written as its checkpoint part and read back.
    fn written(recording: SharedRecording) -> RestoredInFlight {
        let mut part = super::super::inflight::RecordingPart::part(recording);
        let bytes = crate::checkpoint::task_state::encode_whole(&mut part, 1 << 20);
        super::super::inflight::decode_in_flight(&bytes, "part").unwrap()
    }

    /// What the task read from in-flight data (`r…`) and what it read otherwise, each sorted.
    fn in_flight_and_after(seen: &[String]) -> (Vec<&str>, Vec<&str>) {
        let (mut in_flight, mut after): (Vec<&str>, Vec<&str>) = seen
            .iter()
            .map(String::as_str)
            .partition(|s| s.starts_with('r'));
        in_flight.sort_unstable();
        after.sort_unstable();
        (in_flight, after)
    }

    /// A segment holding `values` as records, then end of partition.
    fn segment_of(pool: &weir_memory::SegmentPool, values: &[u32]) -> Segment {
        let mut arena = Arena::new();
        let mut scratch = Scratch::new(&mut arena);
        let mut builder = super::super::frame::SegmentBuilder::new(pool.acquire().unwrap());
        for value in values {
            assert!(builder.try_record(value, 0, &mut scratch));
        }
        assert!(builder.try_event(Event::EndOfPartition));
        builder.finish()
    }

    #[test]
    fn a_peers_segments_are_read_once_checked_and_a_bad_one_fails_the_task_unread() {
        let pool = weir_memory::SegmentPool::new(0, 4, 4096);
        let good = segment_of(&pool, &[1, 2, 3]);
        let peer = |segments: Vec<Segment>| {
            let receiver = SegmentReceiver::from_peer(stream::iter(segments));
            InputGate::<u32>::new(
                vec![ReceiverEnd::Segments(receiver)],
                BarrierAlignment::Aligned,
                Counter::default(),
            )
        };
        let mut gate = peer(vec![good]);
        let (channel, delivery) = gate.next().now_or_never().unwrap().unwrap().unwrap();
        assert_eq!(channel, 0);
        assert!(
            matches!(delivery, Delivery::Segment(_)),
            "the checked segment, in place"
        );

        // Its first entry's tag damaged: the channel ends there, the task fails naming why,
        // and the damaged segment is never delivered.
        let mut bad = segment_of(&pool, &[4]);
        bad.buffer_mut()[4] = 42;
        let mut gate = peer(vec![bad]);
        let error = match gate.next().now_or_never().unwrap() {
            Err(error) => error,
            Ok(next) => panic!("delivered {:?}", next.map(|(channel, _)| channel)),
        };
        assert!(
            error
                .message
                .contains("not valid (entry at byte 0: unknown entry tag 42)"),
            "{}",
            error.message
        );
    }

    /// A batch of `values` for a local channel.
    fn records(values: &[u32]) -> LocalItem<u32> {
        let mut batch = Batch::with_capacity(values.len());
        for &v in values {
            batch.push(v, 0);
        }
        LocalItem::Records(batch)
    }

    /// Checkpoint `id`'s barrier on a local channel.
    fn barrier(id: u64) -> LocalItem<u32> {
        LocalItem::Event(Event::Barrier(CheckpointBarrier::checkpoint(id)))
    }

    /// Queues `items` on a local channel.
    fn send(sender: &LocalSender<u32>, items: impl IntoIterator<Item = LocalItem<u32>>) {
        for item in items {
            assert!(sender.try_send(item).is_ok());
        }
    }

    /// Two local channels `a` and `b`: their senders (dropping one closes its channel
    /// unended) and the gate's inputs.
    fn two_senders() -> (LocalSender<u32>, LocalSender<u32>, Vec<ReceiverEnd>) {
        let (a, b) = (
            LocalChannel::<u32>::new_erased(8),
            LocalChannel::<u32>::new_erased(8),
        );
        let to_a = LocalSender::<u32>::from_any(Rc::clone(&a));
        let to_b = LocalSender::<u32>::from_any(Rc::clone(&b));
        (
            to_a,
            to_b,
            vec![ReceiverEnd::Local(a), ReceiverEnd::Local(b)],
        )
    }

    /// Two local channels: `a` sends 1, barrier 7, 2; `b` sends 10, 11, barrier 7, 12 — and,
    /// with `end_b`, ends instead of sending its barrier.
    fn two_channels(alignment: BarrierAlignment, end_b: bool) -> InputGate<u32> {
        let (to_a, to_b, inputs) = two_senders();
        send(&to_a, [records(&[1]), barrier(7), records(&[2])]);
        let last = if end_b {
            LocalItem::Event(Event::EndOfPartition)
        } else {
            barrier(7)
        };
        send(
            &to_b,
            [records(&[10]), records(&[11]), last, records(&[12])],
        );
        // Keep the channels open: dropping a sender would close its channel unended.
        std::mem::forget((to_a, to_b));
        InputGate::new(inputs, alignment, Counter::default())
    }

    #[test]
    fn an_aligned_barrier_holds_its_channel_until_every_channel_delivered_it() {
        let mut gate = two_channels(BarrierAlignment::Aligned, false);
        assert_eq!(gate.alignment_of(7), None);
        let seen = drain(&mut gate);
        assert!(gate.alignment_of(7).is_some(), "its alignment is timed");
        assert_eq!(gate.alignment_of(8), None);
        let barrier = seen
            .iter()
            .position(|s| s == "barrier 7")
            .expect("barrier passed");
        let mut before: Vec<_> = seen[..barrier].to_vec();
        before.sort();
        assert_eq!(
            before,
            vec!["1", "10", "11"],
            "what precedes the barrier: {seen:?}"
        );
        let mut after: Vec<_> = seen[barrier + 1..].to_vec();
        after.sort();
        assert_eq!(after, vec!["12", "2"], "what follows it: {seen:?}");
    }

    #[test]
    fn a_channel_that_ends_no_longer_holds_the_barrier_back() {
        let seen = drain(&mut two_channels(BarrierAlignment::Aligned, true));
        let barrier = seen
            .iter()
            .position(|s| s == "barrier 7")
            .expect("barrier passed");
        assert!(!seen[..barrier].contains(&"2".to_string()), "{seen:?}");
        assert!(seen[barrier + 1..].contains(&"2".to_string()), "{seen:?}");
    }

    #[test]
    fn at_least_once_reads_on_after_a_barrier() {
        let seen = drain(&mut two_channels(BarrierAlignment::AtLeastOnce, false));
        let barrier = seen
            .iter()
            .position(|s| s == "barrier 7")
            .expect("barrier passed");
        assert!(
            seen[..barrier].contains(&"2".to_string()),
            "channel a was read on past its barrier: {seen:?}"
        );
    }

    /// Unaligned: the barrier is announced, the gate snapshots before reading anything, and
    /// what each channel held before its barrier is in-flight data, read from the recording
    /// (`r…`) and recorded in arrival order; what follows a barrier is not.
    #[test]
    fn an_unaligned_barrier_overtakes_the_queued_data_which_is_recorded() {
        let announcements = Announcements::new(1);
        let mut gate = two_channels(BarrierAlignment::Aligned, false).unaligned(
            Duration::ZERO,
            announcements.clone(),
            0,
            "test".into(),
        );
        announcements.announce(0, 7);
        let recording = snapshot_at_once(&mut gate, 7);
        let seen = drain(&mut gate);
        let (in_flight, after) = in_flight_and_after(&seen);
        assert_eq!(in_flight, vec!["r1", "r10", "r11"], "{seen:?}");
        assert_eq!(after, vec!["12", "2"], "no second barrier: {seen:?}");
        // The part holds the in-flight data once every barrier came, and reads back.
        let restored = written(recording);
        assert_eq!(restored.channels, 2);
        let channels: Vec<usize> = restored.chunks.iter().map(|(c, _)| *c).collect();
        assert_eq!(
            channels.iter().filter(|c| **c == 0).count(),
            1,
            "{channels:?}"
        );
        assert_eq!(
            channels.iter().filter(|c| **c == 1).count(),
            2,
            "{channels:?}"
        );
        // Restored, it is delivered first, and the restored checkpoint's barrier in it is
        // passed over.
        let (to_a, to_b, inputs) = two_senders();
        send(&to_a, [records(&[99])]);
        let mut gate = InputGate::<u32>::new(inputs, BarrierAlignment::Aligned, Counter::default())
            .restoring(restored);
        let seen = drain(&mut gate);
        let mut first: Vec<_> = seen[..3].to_vec();
        first.sort();
        assert_eq!(first, vec!["r1", "r10", "r11"], "{seen:?}");
        assert_eq!(seen[3..], ["99".to_string()], "{seen:?}");
        drop((to_a, to_b));
    }

    /// With an aligned-checkpoint timeout, a checkpoint aligns until it times out; then the
    /// held channel is read again and the others' data up to their barrier is recorded.
    #[test]
    fn an_aligned_checkpoint_that_times_out_goes_unaligned() {
        let (to_a, to_b, inputs) = two_senders();
        send(&to_a, [records(&[1]), barrier(7), records(&[2])]);
        let mut gate = InputGate::<u32>::new(inputs, BarrierAlignment::Aligned, Counter::default())
            .unaligned(
                Duration::from_millis(30),
                Announcements::new(1),
                0,
                "test".into(),
            );
        // Channel a's barrier came: a is held, and b has nothing yet.
        assert_eq!(drain(&mut gate), vec!["1"]);
        send(
            &to_b,
            [records(&[10]), records(&[11]), barrier(7), records(&[12])],
        );
        std::thread::sleep(Duration::from_millis(40));
        let recording = snapshot_at_once(&mut gate, 7);
        let seen = drain(&mut gate);
        let (in_flight, after) = in_flight_and_after(&seen);
        assert_eq!(in_flight, vec!["r10", "r11"], "{seen:?}");
        assert_eq!(after, vec!["12", "2"], "a is read again: {seen:?}");
        let restored = written(recording);
        assert_eq!(restored.chunks.len(), 2, "complete, with b's two batches");
        drop((to_a, to_b));
    }

    /// A checkpoint that goes unaligned while the gate works through a backlog (restored
    /// in-flight data here) behind which it read every channel's barrier: complete at once,
    /// its in-flight data is what was still queued before the barriers.
    #[test]
    fn a_checkpoint_going_unaligned_records_what_is_queued_before_the_barriers() {
        let (to_a, to_b, inputs) = two_senders();
        for (sender, value) in [(&to_a, 2), (&to_b, 12)] {
            send(sender, [barrier(7), records(&[value])]);
        }
        let mut arena = Arena::new();
        let mut chunk = |value| chunk_of_local(&records(&[value]), &mut Scratch::new(&mut arena));
        let backlog = RestoredInFlight {
            channels: 2,
            chunks: vec![(0, chunk(1)), (1, chunk(10))],
        };
        let announcements = Announcements::new(1);
        let mut gate = InputGate::<u32>::new(inputs, BarrierAlignment::Aligned, Counter::default())
            .unaligned(
                Duration::from_millis(30),
                announcements.clone(),
                0,
                "test".into(),
            )
            .restoring(backlog);
        announcements.announce(0, 7);
        let mut events = Vec::new();
        gate.poll_checkpoint(&mut events);
        assert_eq!(events, vec![], "aligning");
        // The first restored chunk; both barriers are read ahead behind the backlog.
        let (channel, first) = gate.next().now_or_never().unwrap().unwrap().unwrap();
        assert!(matches!((channel, first), (0, Delivery::Restored(_))));
        std::thread::sleep(Duration::from_millis(40));
        let restored = written(snapshot_at_once(&mut gate, 7));
        let channels: Vec<usize> = restored.chunks.iter().map(|(c, _)| *c).collect();
        assert_eq!(
            channels,
            vec![1],
            "b's restored chunk, not yet read by the task"
        );
        let mut seen = drain(&mut gate);
        assert_eq!(seen.remove(0), "r10");
        seen.sort();
        assert_eq!(seen, vec!["12", "2"], "no second barrier");
        drop((to_a, to_b));
    }

    /// A recorded channel that brings a newer checkpoint's barrier instead of the recorded
    /// one's (its sender gave that one up): the recording is given up, and what follows the
    /// newer barrier is neither recorded nor read before the newer checkpoint's snapshot.
    #[test]
    fn a_newer_barrier_on_a_recorded_channel_gives_the_recording_up() {
        let (to_a, to_b, inputs) = two_senders();
        send(&to_a, [records(&[1]), barrier(7), records(&[2])]);
        send(
            &to_b,
            [records(&[10]), barrier(8), records(&[12]), records(&[13])],
        );
        let announcements = Announcements::new(1);
        let mut gate = InputGate::<u32>::new(inputs, BarrierAlignment::Aligned, Counter::default())
            .unaligned(Duration::ZERO, announcements.clone(), 0, "test".into());
        announcements.announce(0, 7);
        let mut events = Vec::new();
        gate.poll_checkpoint(&mut events);
        let seven = gate.take_recording(7).expect("recording 7");
        let seen = drain(&mut gate);
        let eight = seen
            .iter()
            .position(|s| s == "barrier 8")
            .expect("checkpoint 8 snapshotted");
        for late in ["12", "13"] {
            let at = seen.iter().position(|s| s == late);
            assert!(
                at.is_some_and(|at| at > eight),
                "{late} after barrier 8: {seen:?}"
            );
        }
        let mut part = super::super::inflight::RecordingPart::part(seven);
        assert!(
            part.encode_next(&mut Vec::new(), 1 << 20).is_err(),
            "7 is given up"
        );
        drop((to_a, to_b));
    }

    fn gate(channels: usize) -> InputGate<()> {
        InputGate::new(Vec::new(), BarrierAlignment::Aligned, Counter::default())
            .with_channels(channels)
    }

    fn wm(gate: &mut InputGate<()>, channel: usize, w: i64) -> Vec<GateEvent> {
        let mut out = Vec::new();
        gate.on_watermark(channel, Watermark(w), &mut out);
        out
    }

    fn status(gate: &mut InputGate<()>, channel: usize, idle: bool) -> Vec<GateEvent> {
        let mut out = Vec::new();
        gate.on_watermark_status(channel, idle, &mut out);
        out
    }

    #[test]
    fn the_end_of_data_comes_once_every_channel_finished_and_barriers_still_align_after_it() {
        let mut g = gate(2);
        let mut out = Vec::new();
        g.on_end_of_data(0, &mut out);
        assert_eq!(out, vec![], "channel 1 still sends data");
        g.on_end_of_data(0, &mut out);
        g.on_end_of_data(1, &mut out);
        assert_eq!(
            out,
            vec![GateEvent::Watermark(Watermark::MAX), GateEvent::EndOfData],
            "once, with event time at its end"
        );
        // The final checkpoint's barrier aligns over the channels, still open.
        out.clear();
        g.on_barrier(1, CheckpointBarrier::checkpoint(3), &mut out);
        assert_eq!(out, vec![]);
        g.on_barrier(0, CheckpointBarrier::checkpoint(3), &mut out);
        assert_eq!(
            out,
            vec![GateEvent::Barrier(CheckpointBarrier::checkpoint(3))]
        );
        out.clear();
        g.on_end_of_partition(0, &mut out);
        g.on_end_of_partition(1, &mut out);
        assert_eq!(out, vec![], "no second end of data");
        // A channel that ends without an end of data (an older sender) ends its data too.
        let mut g = gate(2);
        g.on_end_of_data(0, &mut out);
        g.on_end_of_partition(1, &mut out);
        assert_eq!(out.last(), Some(&GateEvent::EndOfData));
    }

    #[test]
    fn the_input_watermark_is_the_minimum_over_channels() {
        let mut g = gate(2);
        assert_eq!(wm(&mut g, 0, 10), vec![]);
        assert_eq!(wm(&mut g, 1, 5), vec![GateEvent::Watermark(Watermark(5))]);
        assert_eq!(wm(&mut g, 1, 20), vec![GateEvent::Watermark(Watermark(10))]);
        assert_eq!(
            wm(&mut g, 0, 8),
            vec![],
            "a channel's watermark never goes back"
        );
        assert_eq!(wm(&mut g, 0, 30), vec![GateEvent::Watermark(Watermark(20))]);
        let mut out = Vec::new();
        g.on_end_of_partition(1, &mut out);
        assert_eq!(out, vec![GateEvent::Watermark(Watermark(30))]);
    }

    #[test]
    fn idle_channels_do_not_hold_time_back_and_rejoin_when_caught_up() {
        let mut g = gate(2);
        wm(&mut g, 0, 10);
        assert_eq!(wm(&mut g, 1, 5), vec![GateEvent::Watermark(Watermark(5))]);
        assert_eq!(
            status(&mut g, 1, true),
            vec![GateEvent::Watermark(Watermark(10))]
        );
        assert_eq!(wm(&mut g, 0, 40), vec![GateEvent::Watermark(Watermark(40))]);
        // Channel 1 returns behind the input watermark: it does not pull it back, and it does
        // not hold channel 0 back until it has caught up.
        assert_eq!(status(&mut g, 1, false), vec![]);
        assert_eq!(wm(&mut g, 0, 50), vec![GateEvent::Watermark(Watermark(50))]);
        assert_eq!(wm(&mut g, 1, 60), vec![]);
        assert_eq!(wm(&mut g, 0, 70), vec![GateEvent::Watermark(Watermark(60))]);
    }

    #[test]
    fn all_channels_idle_makes_the_task_idle_until_one_returns() {
        let mut g = gate(2);
        assert_eq!(status(&mut g, 0, true), vec![]);
        assert_eq!(
            status(&mut g, 1, true),
            vec![GateEvent::Status { idle: true }]
        );
        assert_eq!(
            wm(&mut g, 1, 7),
            vec![
                GateEvent::Status { idle: false },
                GateEvent::Watermark(Watermark(7))
            ]
        );
    }

    #[test]
    fn when_the_last_active_channel_goes_idle_time_advances_to_the_highest_watermark() {
        let mut g = gate(2);
        wm(&mut g, 0, 19_999);
        assert_eq!(
            wm(&mut g, 1, 9_999),
            vec![GateEvent::Watermark(Watermark(9_999))]
        );
        assert_eq!(
            status(&mut g, 0, true),
            vec![],
            "channel 1 is still active and holds time at 9 999"
        );
        assert_eq!(
            status(&mut g, 1, true),
            vec![
                GateEvent::Watermark(Watermark(19_999)),
                GateEvent::Status { idle: true }
            ]
        );
    }
}
