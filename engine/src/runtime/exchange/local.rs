//! Channels between two subtasks on the same shard. Both ends run on one thread, so records
//! move by value in batches — no archive, no segment, no atomic — through a bounded queue whose
//! capacity is the receiver's credit, as on a channel between shards. Events travel in the
//! same queue, in order with the records.
//!
//! Records that cross shards are archived into segments instead (`writer.rs`), so that the
//! memory a record holds is allocated and freed by the same shard: a shard's heap figure (the
//! counting allocator's, held against its slot's heap share) stays its own.

use std::any::Any;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use futures::Stream;

use super::frame::Event;
use crate::operator::Batch;

/// What a local channel carries.
pub(crate) enum LocalItem<T> {
    Records(Batch<T>),
    Event(Event),
}

struct Queue<T> {
    items: VecDeque<LocalItem<T>>,
    capacity: usize,
    /// Emptied batches the receiver hands back for the sender to fill again.
    spare: Vec<Batch<T>>,
    receiver_waker: Option<Waker>,
    sender_waker: Option<Waker>,
    sender_dropped: bool,
    receiver_dropped: bool,
}

/// A bounded queue between a sender and a receiver on one shard.
pub(crate) struct LocalChannel<T> {
    queue: RefCell<Queue<T>>,
}

/// The receiver is gone: its subtask failed or was cancelled.
#[derive(Debug)]
pub(crate) struct Closed;

impl<T: 'static> LocalChannel<T> {
    /// A channel holding at most `capacity` items, type-erased for the graph: each end takes
    /// it back with [`LocalSender::from_any`] or [`LocalReceiver::from_any`].
    pub(crate) fn new_erased(capacity: usize) -> Rc<dyn Any> {
        Rc::new(LocalChannel::<T> {
            queue: RefCell::new(Queue {
                items: VecDeque::with_capacity(capacity),
                capacity: capacity.max(1),
                spare: Vec::new(),
                receiver_waker: None,
                sender_waker: None,
                sender_dropped: false,
                receiver_dropped: false,
            }),
        })
    }
}

fn downcast<T: 'static>(channel: Rc<dyn Any>) -> Rc<LocalChannel<T>> {
    channel.downcast::<LocalChannel<T>>().unwrap_or_else(|_| {
        panic!(
            "internal error: a local channel of the wrong record type (expected {})",
            std::any::type_name::<T>()
        )
    })
}

/// The sending end.
pub(crate) struct LocalSender<T> {
    channel: Rc<LocalChannel<T>>,
}

impl<T: 'static> LocalSender<T> {
    pub(crate) fn from_any(channel: Rc<dyn Any>) -> Self {
        LocalSender {
            channel: downcast(channel),
        }
    }

    /// Queues `item` if the receiver has credit for it; else hands it back.
    pub(crate) fn try_send(
        &self,
        item: LocalItem<T>,
    ) -> Result<(), (LocalItem<T>, Option<Closed>)> {
        let mut queue = self.channel.queue.borrow_mut();
        if queue.receiver_dropped {
            return Err((item, Some(Closed)));
        }
        if queue.items.len() >= queue.capacity {
            return Err((item, None));
        }
        queue.items.push_back(item);
        if let Some(waker) = queue.receiver_waker.take() {
            drop(queue);
            waker.wake();
        }
        Ok(())
    }

    /// Queues `item`, waiting until the receiver has credit for it.
    pub(crate) async fn send(&self, item: LocalItem<T>) -> Result<(), Closed> {
        let mut item = Some(item);
        std::future::poll_fn(|cx| {
            let mut queue = self.channel.queue.borrow_mut();
            if queue.receiver_dropped {
                return Poll::Ready(Err(Closed));
            }
            if queue.items.len() >= queue.capacity {
                queue.sender_waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
            queue.items.push_back(item.take().expect("queued once"));
            let waker = queue.receiver_waker.take();
            drop(queue);
            if let Some(waker) = waker {
                waker.wake();
            }
            Poll::Ready(Ok(()))
        })
        .await
    }

    /// An empty batch to fill: one the receiver handed back, or a new one.
    pub(crate) fn fresh_batch(&self, capacity: usize) -> Batch<T> {
        self.channel
            .queue
            .borrow_mut()
            .spare
            .pop()
            .unwrap_or_else(|| Batch::with_capacity(capacity))
    }
}

impl<T> Drop for LocalSender<T> {
    fn drop(&mut self) {
        let mut queue = self.channel.queue.borrow_mut();
        queue.sender_dropped = true;
        if let Some(waker) = queue.receiver_waker.take() {
            drop(queue);
            waker.wake();
        }
    }
}

/// The receiving end: a stream of items that ends when the sender is dropped.
pub(crate) struct LocalReceiver<T> {
    channel: Rc<LocalChannel<T>>,
}

impl<T: 'static> LocalReceiver<T> {
    pub(crate) fn from_any(channel: Rc<dyn Any>) -> Self {
        LocalReceiver {
            channel: downcast(channel),
        }
    }

    /// A handle that gives emptied batches back to the sender.
    pub(crate) fn recycler(&self) -> BatchRecycler<T> {
        BatchRecycler {
            channel: Rc::clone(&self.channel),
        }
    }
}

impl<T> Stream for LocalReceiver<T> {
    type Item = LocalItem<T>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<LocalItem<T>>> {
        let mut queue = self.channel.queue.borrow_mut();
        match queue.items.pop_front() {
            Some(item) => {
                if let Some(waker) = queue.sender_waker.take() {
                    drop(queue);
                    waker.wake();
                }
                Poll::Ready(Some(item))
            }
            None if queue.sender_dropped => Poll::Ready(None),
            None => {
                queue.receiver_waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl<T> Drop for LocalReceiver<T> {
    fn drop(&mut self) {
        let mut queue = self.channel.queue.borrow_mut();
        queue.receiver_dropped = true;
        let undelivered = std::mem::take(&mut queue.items);
        let waker = queue.sender_waker.take();
        drop(queue);
        drop(undelivered);
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// Hands a receiver's emptied batches back to its sender, so a steady stream allocates none.
pub(crate) struct BatchRecycler<T> {
    channel: Rc<LocalChannel<T>>,
}

impl<T> BatchRecycler<T> {
    pub(crate) fn recycle(&self, mut batch: Batch<T>) {
        batch.clear();
        let mut queue = self.channel.queue.borrow_mut();
        if queue.spare.len() < queue.capacity {
            queue.spare.push(batch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn batch(values: &[u32]) -> Batch<u32> {
        let mut batch = Batch::with_capacity(values.len());
        for &v in values {
            batch.push(v, i64::from(v));
        }
        batch
    }

    #[test]
    fn items_arrive_in_order_and_credit_bounds_the_queue() {
        let channel = LocalChannel::<u32>::new_erased(2);
        let sender = LocalSender::<u32>::from_any(Rc::clone(&channel));
        let mut receiver = LocalReceiver::<u32>::from_any(channel);
        assert!(sender.try_send(LocalItem::Records(batch(&[1, 2]))).is_ok());
        assert!(sender
            .try_send(LocalItem::Event(Event::EndOfPartition))
            .is_ok());
        let refused = sender.try_send(LocalItem::Records(batch(&[3])));
        assert!(matches!(refused, Err((_, None))), "no credit left");
        drop(sender);
        let items: Vec<_> = futures::executor::block_on(async {
            let mut items = Vec::new();
            while let Some(item) = receiver.next().await {
                items.push(match item {
                    LocalItem::Records(b) => format!("{:?}", b.records),
                    LocalItem::Event(e) => format!("{e:?}"),
                });
            }
            items
        });
        assert_eq!(items, vec!["[1, 2]".to_string(), "EndOfPartition".into()]);
    }

    #[test]
    fn a_dropped_receiver_closes_the_channel_and_recycled_batches_come_back() {
        let channel = LocalChannel::<u32>::new_erased(4);
        let sender = LocalSender::<u32>::from_any(Rc::clone(&channel));
        let receiver = LocalReceiver::<u32>::from_any(channel);
        let recycler = receiver.recycler();
        let mut used = batch(&[7; 100]);
        used.records.reserve(1000);
        let capacity = used.records.capacity();
        recycler.recycle(used);
        let again = sender.fresh_batch(8);
        assert!(again.is_empty());
        assert_eq!(again.records.capacity(), capacity, "the recycled batch");
        drop(receiver);
        assert!(matches!(
            sender.try_send(LocalItem::Event(Event::EndOfPartition)),
            Err((_, Some(Closed)))
        ));
    }
}
