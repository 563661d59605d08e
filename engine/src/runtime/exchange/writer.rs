//! The sending side of an exchange edge: serializes records into segments, one open segment
//! per receiving channel, and hands full (or timed-out) segments over the channel's bounded
//! ring. A full ring means the receiver has granted no more credit: the writer waits, and with
//! it the whole chain up to the source.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;

use futures::future::LocalBoxFuture;
use glommio::channels::shared_channel::ConnectedSender;
use glommio::{GlommioError, ResourceType};
use rkyv::ser::allocator::Arena;
use weir_memory::{Segment, SegmentPool};

use super::frame::{Event, SegmentBuilder};
use super::partitioner::Partitioner;
use crate::error::{TaskError, TaskResult};
use crate::graph::WriterParts;
use crate::metrics::OperatorMetrics;
use crate::operator::{nothing_to_do, Batch, Output};
use crate::record::{Record, Watermark};

struct Channel {
    sender: ConnectedSender<Segment>,
    open: Option<SegmentBuilder>,
}

/// Writes one subtask's output on one exchange edge.
pub(crate) struct ExchangeWriter<T, P> {
    channels: Vec<Channel>,
    partitioner: P,
    pool: SegmentPool,
    arena: Arena,
    flush_per_record: bool,
    metrics: Arc<OperatorMetrics>,
    /// Set when any subtask of the job fails; ends a wait for credit that can never be granted.
    cancel: Arc<AtomicBool>,
    _record: PhantomData<fn(T)>,
}

impl<T: Record, P: Partitioner<T>> ExchangeWriter<T, P> {
    pub(crate) fn new(parts: WriterParts<'_>, partitioner: P) -> Self {
        ExchangeWriter {
            channels: parts
                .senders
                .into_iter()
                .map(|sender| Channel { sender, open: None })
                .collect(),
            partitioner,
            pool: parts.pool,
            arena: Arena::new(),
            flush_per_record: parts.settings.flush_per_record(),
            metrics: parts.metrics,
            cancel: parts.cancel,
            _record: PhantomData,
        }
    }

    /// The channel's open segment, taking a fresh one from the pool if none is open.
    fn open_segment<'s>(
        channels: &'s mut [Channel],
        pool: &SegmentPool,
        channel: usize,
    ) -> TaskResult<&'s mut SegmentBuilder> {
        let open = &mut channels[channel].open;
        if open.is_none() {
            let segment = pool
                .acquire()
                .map_err(|e| TaskError::internal(e.to_string()))?;
            *open = Some(SegmentBuilder::new(segment));
        }
        Ok(open.as_mut().expect("set above"))
    }

    fn builder(&mut self, channel: usize) -> TaskResult<&mut SegmentBuilder> {
        Self::open_segment(&mut self.channels, &self.pool, channel)
    }

    /// Appends to the channel's open segment; `false` if the segment is full.
    #[inline]
    fn try_write(&mut self, channel: usize, record: &T, timestamp: i64) -> TaskResult<bool> {
        let builder = Self::open_segment(&mut self.channels, &self.pool, channel)?;
        if builder.try_record(record, timestamp, &mut self.arena) {
            return Ok(true);
        }
        if builder.is_empty() {
            return Err(TaskError::user(format!(
                "a record does not fit in a network segment of {} bytes; raise \
                 taskmanager.memory.segment-size",
                self.pool.segment_size()
            ))
            .in_operator(&self.metrics.name));
        }
        Ok(false)
    }

    /// Sends the channel's open segment, waiting for credit if the receiver has none to give.
    async fn send(&mut self, channel: usize) -> TaskResult {
        let Some(builder) = self.channels[channel].open.take() else {
            return Ok(());
        };
        let sender = &self.channels[channel].sender;
        let closed = || {
            TaskError::cancelled(
                "the receiving subtask closed its channel (it failed or was cancelled)",
            )
        };
        match sender.try_send(builder.finish()) {
            Ok(()) => Ok(()),
            Err(GlommioError::WouldBlock(ResourceType::Channel(segment))) => {
                self.metrics.backpressure_waits.add(1);
                // glommio 0.9's `send` waits for free space only: if the receiver goes away
                // while the ring is full, no space ever frees and `send` never returns (its
                // waker is woken over and over). A receiver only goes before its senders end
                // when its subtask failed, which sets the job's cancel flag, so the wait also
                // ends when that flag is set.
                let mut send = std::pin::pin!(sender.send(segment));
                let cancel = &self.cancel;
                std::future::poll_fn(|cx| match send.as_mut().poll(cx) {
                    Poll::Ready(sent) => Poll::Ready(sent.map_err(|_| closed())),
                    Poll::Pending if cancel.load(Ordering::Relaxed) => Poll::Ready(Err(
                        TaskError::cancelled("the job was cancelled while waiting for credit"),
                    )),
                    Poll::Pending => Poll::Pending,
                })
                .await
            }
            Err(_) => Err(closed()),
        }
    }

    /// Writes a record to a channel. The common case — it fits the open segment — is
    /// synchronous and builds no future; only a full segment (or per-record flushing) awaits.
    #[inline]
    async fn write(&mut self, channel: usize, record: &T, timestamp: i64) -> TaskResult {
        let written = self.try_write(channel, record, timestamp)?;
        if !written || self.flush_per_record {
            self.write_slow(channel, record, timestamp, written).await?;
        }
        Ok(())
    }

    /// Sends what must be sent before (a full segment) or after (per-record flushing) `record`.
    async fn write_slow(
        &mut self,
        channel: usize,
        record: &T,
        timestamp: i64,
        written: bool,
    ) -> TaskResult {
        if !written {
            self.send(channel).await?;
            let fitted = self.try_write(channel, record, timestamp)?;
            debug_assert!(
                fitted,
                "an empty segment takes any record that fits a segment"
            );
        }
        if self.flush_per_record {
            self.send(channel).await?;
        }
        Ok(())
    }

    async fn write_event(&mut self, event: Event) -> TaskResult {
        for channel in 0..self.channels.len() {
            if !self.builder(channel)?.try_event(event) {
                self.send(channel).await?;
                let fitted = self.builder(channel)?.try_event(event);
                debug_assert!(fitted, "an empty segment takes any event");
            }
            if self.flush_per_record {
                self.send(channel).await?;
            }
        }
        Ok(())
    }

    async fn flush_all(&mut self) -> TaskResult {
        for channel in 0..self.channels.len() {
            if self.channels[channel]
                .open
                .as_ref()
                .is_some_and(|b| !b.is_empty())
            {
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
            // Records are serialized from where they lie, then dropped together.
            for (record, &timestamp) in batch.records.iter().zip(&batch.timestamps) {
                match self.partitioner.channel(record, channels) {
                    Some(channel) => {
                        let written = self.try_write(channel, record, timestamp)?;
                        if !written || self.flush_per_record {
                            self.write_slow(channel, record, timestamp, written).await?;
                        }
                    }
                    None => {
                        for channel in 0..channels {
                            self.write(channel, record, timestamp).await?;
                        }
                    }
                }
            }
            batch.clear();
            Ok(())
        })
    }

    fn watermark(&mut self, watermark: Watermark) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(self.write_event(Event::Watermark(watermark)))
    }

    fn watermark_status(&mut self, idle: bool) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(self.write_event(Event::WatermarkStatus { idle }))
    }

    /// Timers live in operators; an exchange writer ends its chain.
    fn processing_time(&mut self, _now: i64) -> LocalBoxFuture<'_, TaskResult> {
        nothing_to_do()
    }

    fn next_processing_time(&self) -> Option<i64> {
        None
    }

    fn flush(&mut self) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(self.flush_all())
    }

    fn finish(&mut self) -> LocalBoxFuture<'_, TaskResult> {
        Box::pin(async move {
            self.write_event(Event::EndOfPartition).await?;
            for channel in 0..self.channels.len() {
                self.send(channel).await?;
            }
            Ok(())
        })
    }
}
