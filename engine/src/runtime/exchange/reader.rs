//! The receiving side of exchange edges: one input gate per subtask merges the channels of all
//! its input edges, tracks each channel's watermark and end of partition, and reports a
//! channel that closed without ending (its sender failed).

use std::cell::{Cell, RefCell};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use futures::stream::{self, LocalBoxStream, SelectAll, Stream, StreamExt};
use weir_memory::Segment;

use super::local::{BatchRecycler, LocalItem, LocalReceiver};
use crate::checkpoint::CheckpointBarrier;
use crate::error::{TaskError, TaskResult};
use crate::graph::ReceiverEnd;
use crate::operator::Batch;
use crate::record::Watermark;

/// What one input channel delivered.
pub(crate) enum Delivery<T> {
    /// A segment from a subtask on another shard.
    Segment(Segment),
    /// Records or an event from a subtask on this shard.
    Local(LocalItem<T>),
}

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
    /// The newest checkpoint whose completion (abort) the task was told of.
    notified_complete: u64,
    notified_aborted: u64,
    /// A channel ended with `Event::Suspend` (the job stops with a savepoint).
    suspended: bool,
}

impl<T: 'static> InputGate<T> {
    pub(crate) fn new(inputs: Vec<ReceiverEnd>, alignment_mode: BarrierAlignment) -> Self {
        let count = inputs.len();
        let mut recyclers = Vec::with_capacity(count);
        let mut holds = Vec::with_capacity(count);
        let channels = stream::select_all(inputs.into_iter().enumerate().map(|(i, input)| {
            let deliveries = match input {
                ReceiverEnd::Remote(receiver) => {
                    recyclers.push(None);
                    receiver.map(Delivery::Segment).boxed_local()
                }
                ReceiverEnd::Local(channel) => {
                    let receiver = LocalReceiver::<T>::from_any(channel);
                    recyclers.push(Some(receiver.recycler()));
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
            notified_complete: 0,
            notified_aborted: 0,
            suspended: false,
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
        self
    }

    /// The next delivery and its channel, or `None` once every channel has ended.
    pub(crate) async fn next(&mut self) -> TaskResult<Option<(usize, Delivery<T>)>> {
        loop {
            match self.channels.next().await {
                None => return Ok(None),
                Some((channel, Some(delivery))) => return Ok(Some((channel, delivery))),
                Some((channel, None)) if self.ended[channel] => continue,
                Some((_, None)) => {
                    return Err(TaskError::cancelled(
                        "an upstream subtask closed its channel without ending it (it failed or was cancelled)",
                    ))
                }
            }
        }
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
    /// and the newer one covers everything it would have.
    pub(crate) fn on_barrier(
        &mut self,
        channel: usize,
        barrier: CheckpointBarrier,
        out: &mut Vec<GateEvent>,
    ) {
        match &mut self.alignment {
            Some(alignment) if alignment.barrier.id > barrier.id => return,
            Some(alignment) if alignment.barrier.id == barrier.id => {
                alignment.arrived[channel] = true;
            }
            _ => {
                // A newer checkpoint ends the older one's alignment.
                self.release_all();
                let mut arrived = vec![false; self.ended.len()];
                arrived[channel] = true;
                self.alignment = Some(Alignment { barrier, arrived });
            }
        }
        if self.alignment_mode == BarrierAlignment::Aligned {
            if let Some(hold) = self.holds.get(channel) {
                hold.held.set(true);
            }
        }
        self.complete_alignment(out);
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
        let complete =
            (0..self.ended.len()).all(|channel| alignment.arrived[channel] || self.ended[channel]);
        if complete {
            out.push(GateEvent::Barrier(alignment.barrier));
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

    use super::super::frame::Event;
    use super::super::local::{LocalChannel, LocalSender};
    use super::*;

    /// What a task reading the gate sees, in order: records by value, and barriers passed.
    fn drain(gate: &mut InputGate<u32>) -> Vec<String> {
        let mut seen = Vec::new();
        let mut events = Vec::new();
        while let Some(next) = gate.next().now_or_never() {
            let Some((channel, delivery)) = next.expect("no channel failed") else {
                break;
            };
            match delivery {
                Delivery::Local(LocalItem::Records(batch)) => {
                    seen.extend(batch.records.iter().map(u32::to_string));
                }
                Delivery::Local(LocalItem::Event(Event::Barrier(barrier))) => {
                    gate.on_barrier(channel, barrier, &mut events);
                }
                Delivery::Local(LocalItem::Event(Event::EndOfPartition)) => {
                    gate.on_end_of_partition(channel, &mut events);
                }
                Delivery::Local(LocalItem::Event(_)) | Delivery::Segment(_) => {}
            }
            for event in events.drain(..) {
                if let GateEvent::Barrier(barrier) = event {
                    seen.push(format!("barrier {}", barrier.id));
                }
            }
        }
        seen
    }

    /// Two local channels: `a` sends 1, barrier 7, 2; `b` sends 10, 11, barrier 7, 12 — and,
    /// with `end_b`, ends instead of sending its barrier.
    fn two_channels(alignment: BarrierAlignment, end_b: bool) -> InputGate<u32> {
        let (a, b) = (
            LocalChannel::<u32>::new_erased(8),
            LocalChannel::<u32>::new_erased(8),
        );
        let send = |channel: &Rc<dyn std::any::Any>, items: Vec<LocalItem<u32>>| {
            let sender = LocalSender::<u32>::from_any(Rc::clone(channel));
            for item in items {
                assert!(sender.try_send(item).is_ok());
            }
            // Keep the channel open: dropping the sender would close it unended.
            std::mem::forget(sender);
        };
        let records = |values: &[u32]| {
            let mut batch = Batch::with_capacity(values.len());
            for &v in values {
                batch.push(v, 0);
            }
            LocalItem::Records(batch)
        };
        send(
            &a,
            vec![
                records(&[1]),
                LocalItem::Event(Event::Barrier(CheckpointBarrier::checkpoint(7))),
                records(&[2]),
            ],
        );
        let last = if end_b {
            LocalItem::Event(Event::EndOfPartition)
        } else {
            LocalItem::Event(Event::Barrier(CheckpointBarrier::checkpoint(7)))
        };
        send(
            &b,
            vec![records(&[10]), records(&[11]), last, records(&[12])],
        );
        InputGate::new(
            vec![ReceiverEnd::Local(a), ReceiverEnd::Local(b)],
            alignment,
        )
    }

    #[test]
    fn an_aligned_barrier_holds_its_channel_until_every_channel_delivered_it() {
        let seen = drain(&mut two_channels(BarrierAlignment::Aligned, false));
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

    fn gate(channels: usize) -> InputGate<()> {
        InputGate::new(Vec::new(), BarrierAlignment::Aligned).with_channels(channels)
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
