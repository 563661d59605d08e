//! The sending side of an exchange edge: one open buffer per receiving channel. For a channel
//! to another shard or process it serializes records into a segment and hands full (or
//! timed-out) segments to the channel (`channel.rs`); for a channel to a subtask on this shard
//! it moves records into a batch and queues full batches (`local.rs`). A channel without
//! credit makes the writer wait, and with it the whole chain up to the source.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;

use futures::future::LocalBoxFuture;
use rkyv::ser::allocator::Arena;
use weir_memory::SegmentPool;

use super::channel::{Closed as ChannelClosed, SegmentSender, TrySendError};
use super::frame::{Event, SegmentBuilder};
use super::inflight::Announcements;
use super::local::{Closed, LocalItem, LocalSender};
use super::partitioner::Partitioner;
use crate::error::{TaskError, TaskResult};
use crate::graph::{SenderEnd, WriterParts};
use crate::metrics::OperatorMetrics;
use crate::operator::{nothing_to_do, Batch, ChainEvent, Output, Taking};
use crate::record::{Record, Scratch};

/// One receiving channel: to another shard or process (records archived into segments) or to
/// a subtask on this shard (records moved in batches, see `local.rs`).
enum Channel<T> {
    Segments {
        sender: Box<dyn SegmentSender>,
        open: Option<SegmentBuilder>,
    },
    Local {
        sender: LocalSender<T>,
        open: Batch<T>,
    },
}

impl<T> Channel<T> {
    fn has_open_records(&self) -> bool {
        match self {
            Channel::Segments { open, .. } => open.as_ref().is_some_and(|b| !b.is_empty()),
            Channel::Local { open, .. } => !open.is_empty(),
        }
    }
}

/// Where [`ExchangeWriter::put_until_send`] stopped.
enum Stopped<T> {
    /// A put left something to do on a channel.
    Send(usize, Put<T>, i64),
    /// A record goes to every channel.
    Broadcast(T, i64),
}

/// What writing a record left to do.
enum Put<T> {
    /// Nothing: it is in the channel's open buffer.
    Done,
    /// Send the open buffer (full, or flushing per record).
    SendAfter,
    /// The open segment is full: send it, then write the record again.
    SendBefore(T),
}

/// Waits until `ready` says the receiver granted credit; the wait also ends when the job is
/// cancelled (counted as one backpressure wait of the producing operator, and timed as its
/// task's backpressured time).
async fn wait_for_credit<O>(
    metrics: &OperatorMetrics,
    cancel: &AtomicBool,
    mut ready: impl FnMut(&mut std::task::Context<'_>) -> Poll<TaskResult<O>>,
) -> TaskResult<O> {
    metrics.backpressure_waits.add(1);
    let _backpressured = metrics.task.backpressured();
    std::future::poll_fn(|cx| match ready(cx) {
        Poll::Ready(result) => Poll::Ready(result),
        Poll::Pending if cancel.load(Ordering::Relaxed) => Poll::Ready(Err(
            TaskError::consequence("the job was cancelled while waiting for credit"),
        )),
        Poll::Pending => Poll::Pending,
    })
    .await
}

/// The error of a closed channel: a consequence when its receiver went (the receiving
/// subtask failed or was cancelled, or the run of its executor ended), a failure of its own
/// when the channel failed.
fn closed(closed: ChannelClosed) -> TaskError {
    match (closed.cause, closed.peer) {
        (None, None) => TaskError::consequence(
            "the receiving subtask closed its channel (it failed or was cancelled)",
        ),
        (None, Some(peer)) => TaskError::cut_by_peer(format!(
            "the output channel to {peer} was closed there (its subtask failed or was \
             cancelled, or its run ended)"
        )),
        (Some(cause), _) => TaskError::external(format!("an output channel failed: {cause}")),
    }
}

/// Sends a segment channel's open segment (if any), waiting for credit if it has none.
async fn send_segment(
    sender: &dyn SegmentSender,
    open: &mut Option<SegmentBuilder>,
    metrics: &OperatorMetrics,
    cancel: &AtomicBool,
) -> TaskResult {
    let Some(builder) = open.take() else {
        return Ok(());
    };
    let segment = builder.finish();
    metrics.bytes_out.add(segment.len() as u64);
    metrics.task.bytes_out.add(segment.len() as u64);
    match sender.try_send(segment) {
        Ok(()) => Ok(()),
        Err(TrySendError::NoCredit(segment)) => {
            // A wait for credit may not notice that the receiver went (glommio 0.9's ring does
            // not: no space ever frees). A receiver only goes before its senders end when its
            // subtask failed, which sets the job's cancel flag, so the wait also ends when that
            // flag is set.
            let mut send = sender.send(segment);
            wait_for_credit(metrics, cancel, |cx| {
                send.as_mut().poll(cx).map(|sent| sent.map_err(closed))
            })
            .await
        }
        Err(TrySendError::Closed(channel)) => Err(closed(channel)),
    }
}

/// Queues `item` on a local channel, waiting for credit if it has none.
async fn send_local<T: 'static>(
    sender: &LocalSender<T>,
    item: LocalItem<T>,
    metrics: &OperatorMetrics,
    cancel: &AtomicBool,
) -> TaskResult {
    let item = match sender.try_send(item) {
        Ok(()) => return Ok(()),
        Err((_, Some(Closed))) => return Err(closed(ChannelClosed::default())),
        Err((item, None)) => item,
    };
    let mut send = std::pin::pin!(sender.send(item));
    wait_for_credit(metrics, cancel, |cx| {
        send.as_mut()
            .poll(cx)
            .map(|sent| sent.map_err(|Closed| closed(ChannelClosed::default())))
    })
    .await
}

/// Queues a local channel's open batch (if it holds records) and opens a fresh one.
async fn send_batch<T: 'static>(
    sender: &LocalSender<T>,
    open: &mut Batch<T>,
    batch_size: usize,
    metrics: &OperatorMetrics,
    cancel: &AtomicBool,
) -> TaskResult {
    if open.is_empty() {
        return Ok(());
    }
    let batch = std::mem::replace(open, sender.fresh_batch(batch_size));
    send_local(sender, LocalItem::Records(batch), metrics, cancel).await
}

/// Whether a channel within the shard sends its batch once it holds `len` records: after every
/// record without a buffer timeout, else when the batch is full.
#[inline(always)]
fn local_batch_due(len: usize, batch_size: usize, flush_per_record: bool) -> bool {
    flush_per_record || len >= batch_size
}

/// Writes one subtask's output on one exchange edge.
pub(crate) struct ExchangeWriter<T, P> {
    channels: Vec<Channel<T>>,
    partitioner: P,
    pool: SegmentPool,
    arena: Arena,
    flush_per_record: bool,
    batch_size: usize,
    metrics: Arc<OperatorMetrics>,
    /// Set when any subtask of the job fails; ends a wait for credit that can never be granted.
    cancel: Arc<AtomicBool>,
    /// Unaligned checkpoints: where a checkpoint's barrier is announced to each channel's
    /// receiving task before it goes in-band, behind the data queued before it.
    announce: Option<(Announcements, Vec<usize>)>,
    /// The channel the next latency marker takes (each goes to one channel, in turn).
    next_marker: usize,
    _record: PhantomData<fn(T)>,
}

impl<T: Record, P: Partitioner<T>> ExchangeWriter<T, P> {
    pub(crate) fn new(parts: WriterParts<'_>, partitioner: P) -> Self {
        let batch_size = parts.settings.batch_size.max(1);
        ExchangeWriter {
            channels: parts
                .senders
                .into_iter()
                .map(|end| match end {
                    SenderEnd::Segments(sender) => Channel::Segments { sender, open: None },
                    SenderEnd::Local(channel) => {
                        let sender = LocalSender::from_any(channel);
                        let open = sender.fresh_batch(batch_size);
                        Channel::Local { sender, open }
                    }
                })
                .collect(),
            partitioner,
            pool: parts.pool,
            arena: Arena::new(),
            flush_per_record: parts.settings.flush_per_record(),
            batch_size,
            metrics: parts.metrics,
            cancel: parts.cancel,
            announce: parts.announce,
            next_marker: 0,
            _record: PhantomData,
        }
    }

    /// The open segment of a segment channel, taking a fresh one from the pool if none is open.
    /// Inlined: it runs per record, and only the first record of a segment takes the pool.
    #[inline]
    fn open_segment<'s>(
        open: &'s mut Option<SegmentBuilder>,
        pool: &SegmentPool,
    ) -> TaskResult<&'s mut SegmentBuilder> {
        match open {
            Some(builder) => Ok(builder),
            None => Self::open_fresh_segment(open, pool),
        }
    }

    #[cold]
    #[inline(never)]
    fn open_fresh_segment<'s>(
        open: &'s mut Option<SegmentBuilder>,
        pool: &SegmentPool,
    ) -> TaskResult<&'s mut SegmentBuilder> {
        let segment = pool
            .acquire()
            .map_err(|e| TaskError::internal(e.to_string()))?;
        Ok(open.insert(SegmentBuilder::new(segment)))
    }

    /// Puts a record into the channel's open buffer. The common case — it fits — is
    /// synchronous and builds no future; what is left to do comes back as a [`Put`].
    #[inline]
    fn put(&mut self, channel: usize, record: T, timestamp: i64) -> TaskResult<Put<T>> {
        let flush = self.flush_per_record;
        match &mut self.channels[channel] {
            Channel::Local { open, .. } => {
                open.push(record, timestamp);
                Ok(if local_batch_due(open.len(), self.batch_size, flush) {
                    Put::SendAfter
                } else {
                    Put::Done
                })
            }
            Channel::Segments { open, .. } => {
                let builder = Self::open_segment(open, &self.pool)?;
                if builder.try_record(&record, timestamp, &mut Scratch::new(&mut self.arena)) {
                    return Ok(if flush { Put::SendAfter } else { Put::Done });
                }
                self.refused(channel, record)
            }
        }
    }

    /// Puts records from `records` into their channels' buffers until one leaves a send to do
    /// (or goes to every channel), which it returns; `None` once `records` is empty. Plain
    /// synchronous code that reads each record in its slot of the batch: a record for another
    /// shard is archived from there, one for this shard moves once, into the channel's batch.
    /// (Moving each record out first and passing it on by value cost a copy through the stack,
    /// which the next read of it stalled on: the largest single cost of the exchange.)
    #[inline]
    fn put_until_send(&mut self, records: &mut Taking<'_, T>) -> TaskResult<Option<Stopped<T>>> {
        let channels = self.channels.len();
        let flush = self.flush_per_record;
        let mut scratch = Scratch::new(&mut self.arena);
        while let Some((record, timestamp)) = records.peek() {
            let Some(channel) = self.partitioner.channel(record, channels) else {
                let (record, timestamp) = records.next().expect("peeked");
                return Ok(Some(Stopped::Broadcast(record, timestamp)));
            };
            let done = match &mut self.channels[channel] {
                Channel::Local { open, .. } => {
                    let (record, timestamp) = records.next().expect("peeked");
                    open.push(record, timestamp);
                    !local_batch_due(open.len(), self.batch_size, flush)
                }
                Channel::Segments { open, .. } => {
                    let builder = Self::open_segment(open, &self.pool)?;
                    if !builder.try_record(record, timestamp, &mut scratch) {
                        // Full: it goes on after the segment is sent (or cannot go at all).
                        let (record, timestamp) = records.next().expect("peeked");
                        let put = self.refused(channel, record)?;
                        return Ok(Some(Stopped::Send(channel, put, timestamp)));
                    }
                    records.discard();
                    !flush
                }
            };
            if !done {
                return Ok(Some(Stopped::Send(channel, Put::SendAfter, timestamp)));
            }
        }
        Ok(None)
    }

    /// What is left to do with a record the channel's open segment refused: send the segment
    /// and write the record again, or — when the segment was empty — fail, naming the setting.
    fn refused(&self, channel: usize, record: T) -> TaskResult<Put<T>> {
        match &self.channels[channel] {
            Channel::Segments {
                open: Some(builder),
                ..
            } if builder.is_empty() => Err(TaskError::user(format!(
                "a record does not fit in a network segment of {} bytes; raise \
                 taskmanager.memory.segment-size",
                self.pool.segment_size()
            ))
            .in_operator(&self.metrics.name)),
            _ => Ok(Put::SendBefore(record)),
        }
    }

    /// Does what [`ExchangeWriter::put`] left to do.
    async fn finish_put(&mut self, channel: usize, put: Put<T>, timestamp: i64) -> TaskResult {
        match put {
            Put::Done => Ok(()),
            Put::SendAfter => self.send(channel).await,
            Put::SendBefore(record) => {
                self.send(channel).await?;
                match self.put(channel, record, timestamp)? {
                    Put::Done => Ok(()),
                    Put::SendAfter => self.send(channel).await,
                    Put::SendBefore(_) => Err(TaskError::internal(
                        "an empty segment refused a record that fits a segment",
                    )),
                }
            }
        }
    }

    /// Writes a record to a channel, sending (and waiting for credit) when a buffer fills.
    #[inline]
    async fn write(&mut self, channel: usize, record: T, timestamp: i64) -> TaskResult {
        match self.put(channel, record, timestamp)? {
            Put::Done => Ok(()),
            put => self.finish_put(channel, put, timestamp).await,
        }
    }

    /// Sends the channel's open buffer (if it holds anything), waiting for credit if the
    /// receiver has none to give.
    async fn send(&mut self, channel: usize) -> TaskResult {
        match &mut self.channels[channel] {
            Channel::Segments { sender, open } => {
                send_segment(sender.as_ref(), open, &self.metrics, &self.cancel).await
            }
            Channel::Local { sender, open } => {
                send_batch(sender, open, self.batch_size, &self.metrics, &self.cancel).await
            }
        }
    }

    /// Writes `event` to every channel.
    async fn write_event(&mut self, event: Event) -> TaskResult {
        for channel in 0..self.channels.len() {
            self.write_event_to(channel, event).await?;
        }
        Ok(())
    }

    /// Writes `event` to `channel`, behind the records written to it before.
    async fn write_event_to(&mut self, channel: usize, event: Event) -> TaskResult {
        let (metrics, cancel) = (&self.metrics, &self.cancel);
        match &mut self.channels[channel] {
            Channel::Segments { sender, open } => {
                if !Self::open_segment(open, &self.pool)?.try_event(event) {
                    send_segment(sender.as_ref(), open, metrics, cancel).await?;
                    let fitted = Self::open_segment(open, &self.pool)?.try_event(event);
                    debug_assert!(fitted, "an empty segment takes any event");
                }
                // A barrier leaves at once (a checkpoint must not wait for the buffer
                // timeout) and ends its segment, so the receiver never holds records
                // behind a barrier of a channel it has stopped reading.
                if self.flush_per_record || matches!(event, Event::Barrier(_)) {
                    send_segment(sender.as_ref(), open, metrics, cancel).await?;
                }
            }
            Channel::Local { sender, open } => {
                // Records written before the event go first.
                send_batch(sender, open, self.batch_size, metrics, cancel).await?;
                send_local(sender, LocalItem::Event(event), metrics, cancel).await?;
            }
        }
        Ok(())
    }

    async fn flush_all(&mut self) -> TaskResult {
        for channel in 0..self.channels.len() {
            if self.channels[channel].has_open_records() {
                self.send(channel).await?;
            }
        }
        Ok(())
    }
}

impl<T: Record, P: Partitioner<T>> Output<T> for ExchangeWriter<T, P> {
    fn push<'a>(&'a mut self, batch: &'a mut Batch<T>) -> LocalBoxFuture<'a, TaskResult> {
        Box::pin(async move {
            let channels = self.channels.len();
            let mut records = batch.drain();
            while let Some(stopped) = self.put_until_send(&mut records)? {
                match stopped {
                    Stopped::Send(channel, put, timestamp) => {
                        self.finish_put(channel, put, timestamp).await?;
                    }
                    Stopped::Broadcast(record, timestamp) => {
                        for channel in 0..channels - 1 {
                            self.write(channel, record.clone(), timestamp).await?;
                        }
                        self.write(channels - 1, record, timestamp).await?;
                    }
                }
            }
            Ok(())
        })
    }

    fn event(&mut self, event: ChainEvent) -> LocalBoxFuture<'_, TaskResult> {
        match event {
            ChainEvent::Watermark(watermark) => {
                Box::pin(self.write_event(Event::Watermark(watermark)))
            }
            ChainEvent::WatermarkStatus { idle } => {
                Box::pin(self.write_event(Event::WatermarkStatus { idle }))
            }
            ChainEvent::Barrier(barrier) => {
                // Savepoints and the final checkpoint align always.
                let overtaking = self.announce.as_ref().filter(|_| barrier.may_overtake());
                if let Some((announcements, tasks)) = overtaking {
                    for &task in tasks {
                        announcements.announce(task, barrier.id);
                    }
                    // A channel to another process tells its receiver itself.
                    for channel in &self.channels {
                        if let Channel::Segments { sender, .. } = channel {
                            sender.announce(barrier.id);
                        }
                    }
                }
                Box::pin(self.write_event(Event::Barrier(barrier)))
            }
            ChainEvent::CheckpointComplete(checkpoint) => {
                Box::pin(self.write_event(Event::CheckpointComplete(checkpoint)))
            }
            ChainEvent::CheckpointAborted(checkpoint) => {
                Box::pin(self.write_event(Event::CheckpointAborted(checkpoint)))
            }
            // Down one channel, each in turn (Flink sends each marker down one random
            // channel): a marker takes one path, and the markers every path in turn (a
            // fan-out or side outputs inside a chain do the same).
            ChainEvent::LatencyMarker(_) if self.channels.is_empty() => nothing_to_do(),
            ChainEvent::LatencyMarker(marker) => {
                let channel = self.next_marker % self.channels.len();
                self.next_marker = channel + 1;
                Box::pin(self.write_event_to(channel, Event::LatencyMarker(marker)))
            }
            // Timers live in operators; an exchange writer ends its chain.
            ChainEvent::ProcessingTime(_) => nothing_to_do(),
            ChainEvent::Flush => Box::pin(self.flush_all()),
            ChainEvent::Finish | ChainEvent::End | ChainEvent::Suspend => Box::pin(async move {
                let end = match event {
                    ChainEvent::Finish => Event::EndOfData,
                    ChainEvent::Suspend => Event::Suspend,
                    _ => Event::EndOfPartition,
                };
                self.write_event(end).await?;
                for channel in 0..self.channels.len() {
                    self.send(channel).await?;
                }
                Ok(())
            }),
        }
    }

    fn next_processing_time(&self) -> Option<i64> {
        None
    }
}
