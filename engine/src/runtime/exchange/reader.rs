//! The receiving side of exchange edges: one input gate per subtask merges the channels of all
//! its input edges, tracks each channel's watermark and end of partition, and reports a
//! channel that closed without ending (its sender failed).

use futures::stream::{self, LocalBoxStream, SelectAll, StreamExt};
use glommio::channels::shared_channel::ConnectedReceiver;
use weir_memory::Segment;

use crate::error::{TaskError, TaskResult};
use crate::record::Watermark;

/// Merges the input channels of one subtask.
pub(crate) struct InputGate {
    channels: SelectAll<LocalBoxStream<'static, (usize, Option<Segment>)>>,
    watermarks: Vec<Watermark>,
    ended: Vec<bool>,
    current: Watermark,
}

impl InputGate {
    pub(crate) fn new(receivers: Vec<ConnectedReceiver<Segment>>) -> Self {
        let count = receivers.len();
        let channels =
            stream::select_all(receivers.into_iter().enumerate().map(|(i, receiver)| {
                receiver
                    .map(move |segment| (i, Some(segment)))
                    .chain(stream::once(async move { (i, None) }))
                    .boxed_local()
            }));
        InputGate {
            channels,
            watermarks: vec![Watermark::MIN; count],
            ended: vec![false; count],
            current: Watermark::MIN,
        }
    }

    /// The next segment and its channel, or `None` once every channel has ended.
    pub(crate) async fn next(&mut self) -> TaskResult<Option<(usize, Segment)>> {
        loop {
            match self.channels.next().await {
                None => return Ok(None),
                Some((channel, Some(segment))) => return Ok(Some((channel, segment))),
                Some((channel, None)) if self.ended[channel] => continue,
                Some((_, None)) => {
                    return Err(TaskError::cancelled(
                        "an upstream subtask closed its channel without ending it (it failed or was cancelled)",
                    ))
                }
            }
        }
    }

    fn advance(&mut self) -> Option<Watermark> {
        let min = self
            .watermarks
            .iter()
            .copied()
            .min()
            .unwrap_or(Watermark::MAX);
        (min > self.current).then(|| {
            self.current = min;
            min
        })
    }

    /// Records a channel's watermark; returns the task's new input watermark (the minimum over
    /// all channels) if it advanced. Watermarks never go backwards.
    pub(crate) fn on_watermark(
        &mut self,
        channel: usize,
        watermark: Watermark,
    ) -> Option<Watermark> {
        if watermark > self.watermarks[channel] {
            self.watermarks[channel] = watermark;
        }
        self.advance()
    }

    /// Records that a channel ended; it no longer holds event time back.
    pub(crate) fn on_end_of_partition(&mut self, channel: usize) -> Option<Watermark> {
        self.ended[channel] = true;
        self.watermarks[channel] = Watermark::MAX;
        self.advance()
    }
}
