//! The receiving side of exchange edges: one input gate per subtask merges the channels of all
//! its input edges, tracks each channel's watermark and end of partition, and reports a
//! channel that closed without ending (its sender failed).

use futures::stream::{self, LocalBoxStream, SelectAll, StreamExt};
use weir_memory::Segment;

use super::local::{BatchRecycler, LocalItem, LocalReceiver};
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

/// Merges the input channels of one subtask.
pub(crate) struct InputGate<T> {
    channels: SelectAll<LocalBoxStream<'static, (usize, Option<Delivery<T>>)>>,
    /// Per channel, where a local channel's emptied batches go back to.
    recyclers: Vec<Option<BatchRecycler<T>>>,
    watermarks: Vec<Watermark>,
    ended: Vec<bool>,
    idle: Vec<bool>,
    /// Whether a channel counts towards the minimum (false after it returned from idleness
    /// behind the input watermark, until it catches up).
    aligned: Vec<bool>,
    current: Watermark,
    /// Whether the task's input is idle (all open channels are).
    idle_output: bool,
}

impl<T: 'static> InputGate<T> {
    pub(crate) fn new(inputs: Vec<ReceiverEnd>) -> Self {
        let count = inputs.len();
        let mut recyclers = Vec::with_capacity(count);
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
            deliveries
                .map(move |delivery| (i, Some(delivery)))
                .chain(stream::once(async move { (i, None) }))
                .boxed_local()
        }));
        InputGate {
            channels,
            recyclers,
            watermarks: Vec::new(),
            ended: Vec::new(),
            idle: Vec::new(),
            aligned: Vec::new(),
            current: Watermark::MIN,
            idle_output: false,
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
    pub(crate) fn on_end_of_partition(&mut self, channel: usize, out: &mut Vec<GateEvent>) {
        self.ended[channel] = true;
        self.idle[channel] = false;
        self.aligned[channel] = true;
        self.watermarks[channel] = Watermark::MAX;
        self.advance(out);
    }
}

/// What the gate tells its task's chain about event time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GateEvent {
    Watermark(Watermark),
    Status { idle: bool },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(channels: usize) -> InputGate<()> {
        InputGate::new(Vec::new()).with_channels(channels)
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
