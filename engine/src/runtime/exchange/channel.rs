//! The exchange contract: what a channel carrying segments is, wherever it leads — a ring to
//! another shard of this process ([`ring`]: glommio's `shared_channel`), or a stream to
//! another process (`weir-net`). Exchange writers and input gates see only this contract;
//! operators and chains see neither.
//!
//! - **Credit.** A segment is sent only when the receiver has granted credit for it:
//!   [`SegmentSender::try_send`] hands it back without credit, [`SegmentSender::send`] waits
//!   for credit. A ring's credit is its free capacity; a network channel's is what its
//!   receiver announced as it freed segments of its own pool.
//! - **Order.** Segments arrive in the order they were sent. Events travel in-band inside them
//!   (`frame.rs`): watermarks, barriers, end of partition keep their place among the records.
//! - **Closed.** A sender learns that its receiver went ([`Closed`]): the receiving subtask
//!   failed or was cancelled. A receiver's stream ends when its sender went: after an
//!   end-of-partition entry if the sender ended the channel, before one if it failed.
//! - **Trust.** A receiver says where its segments were written. Segments written in this
//!   process are read in place, unchecked; segments from another process are checked
//!   ([`super::frame::check_segment`]: every header and every record's archive) before
//!   anything reads them.

use futures::future::LocalBoxFuture;
use futures::stream::{LocalBoxStream, Stream, StreamExt};
use weir_memory::Segment;

/// The receiver is gone: its subtask failed or was cancelled.
#[derive(Debug)]
pub struct Closed;

/// Why [`SegmentSender::try_send`] did not send.
pub enum TrySendError {
    /// The receiver has granted no credit now: the segment, back.
    NoCredit(Segment),
    /// The receiver is gone.
    Closed,
}

/// The sending end of a channel carrying segments.
pub trait SegmentSender {
    /// Sends `segment` if the receiver has credit for it now.
    fn try_send(&self, segment: Segment) -> Result<(), TrySendError>;

    /// Sends `segment` once the receiver grants credit for it. The future may never end if
    /// the receiver goes while the sender waits (a ring's does not notice): a writer waits on
    /// it only until its job is cancelled, which the receiver's failure causes.
    fn send(&self, segment: Segment) -> LocalBoxFuture<'_, Result<(), Closed>>;
}

/// Where a receiver's segments were written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// In this process (another shard): read in place, unchecked.
    ThisProcess,
    /// In another process: checked before anything reads them.
    Peer,
}

/// The receiving end of a channel carrying segments: the segments in the order they were
/// sent, ending when the sender went.
pub struct SegmentReceiver {
    pub(crate) segments: LocalBoxStream<'static, Segment>,
    pub(crate) origin: Origin,
}

impl SegmentReceiver {
    /// The receiving end of a channel from another process: its segments are checked before
    /// anything reads them.
    pub fn from_peer(segments: impl Stream<Item = Segment> + 'static) -> Self {
        SegmentReceiver {
            segments: segments.boxed_local(),
            origin: Origin::Peer,
        }
    }
}

/// Channels between shards of this process: glommio's bounded single-producer
/// single-consumer rings, whose capacity is the receiver's credit. Only the segment's handle
/// crosses shards; it returns to its pool (the sender's slot's) when the receiver drops it.
pub(crate) mod ring {
    use futures::future::LocalBoxFuture;
    use glommio::channels::shared_channel::{ConnectedReceiver, ConnectedSender};
    use glommio::{GlommioError, ResourceType};
    use weir_memory::Segment;

    use super::{Closed, Origin, SegmentReceiver, SegmentSender, TrySendError};

    impl SegmentSender for ConnectedSender<Segment> {
        fn try_send(&self, segment: Segment) -> Result<(), TrySendError> {
            match ConnectedSender::try_send(self, segment) {
                Ok(()) => Ok(()),
                Err(GlommioError::WouldBlock(ResourceType::Channel(segment))) => {
                    Err(TrySendError::NoCredit(segment))
                }
                Err(_) => Err(TrySendError::Closed),
            }
        }

        fn send(&self, segment: Segment) -> LocalBoxFuture<'_, Result<(), Closed>> {
            Box::pin(async move {
                ConnectedSender::send(self, segment)
                    .await
                    .map_err(|_| Closed)
            })
        }
    }

    /// The receiving end of a ring from another shard: the only receiver whose segments are
    /// read unchecked.
    pub(crate) fn receiver(ring: ConnectedReceiver<Segment>) -> SegmentReceiver {
        SegmentReceiver {
            segments: Box::pin(ring),
            origin: Origin::ThisProcess,
        }
    }
}
