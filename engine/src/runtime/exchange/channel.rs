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
//!   failed or was cancelled, or the channel itself failed (a lost connection: [`Closed`]
//!   says why). A receiver's stream ends when its sender went: after an end-of-partition
//!   entry if the sender ended the channel, before one if it failed; a channel that failed
//!   says why (the input gate names it).
//! - **Trust.** A receiver says where its segments were written. Segments written in this
//!   process are read in place, unchecked; segments from another process are checked
//!   ([`super::frame::check_segment`]: every header and every record's archive) before
//!   anything reads them.

use std::cell::RefCell;
use std::rc::Rc;

use futures::future::LocalBoxFuture;
use futures::stream::{LocalBoxStream, Stream, StreamExt};
use weir_memory::Segment;

/// The channel is closed: its receiver went (its subtask failed or was cancelled, or the run
/// of its executor ended), or the channel failed, and then `cause` says why (a lost
/// connection).
#[derive(Debug, Default)]
pub struct Closed {
    /// Why the channel failed; `None`: its receiver went.
    pub cause: Option<String>,
    /// Where the receiver is when it is another process (its slot and node), which the
    /// failure names; `None` within this process.
    pub peer: Option<String>,
}

/// Why [`SegmentSender::try_send`] did not send.
pub enum TrySendError {
    /// The receiver has granted no credit now: the segment, back.
    NoCredit(Segment),
    /// The channel is closed.
    Closed(Closed),
}

/// The sending end of a channel carrying segments.
pub trait SegmentSender {
    /// Sends `segment` if the receiver has credit for it now.
    fn try_send(&self, segment: Segment) -> Result<(), TrySendError>;

    /// Sends `segment` once the receiver grants credit for it. The future may never end if
    /// the receiver goes while the sender waits (a ring's does not notice): a writer waits on
    /// it only until its job is cancelled, which the receiver's failure causes.
    fn send(&self, segment: Segment) -> LocalBoxFuture<'_, Result<(), Closed>>;

    /// Tells the receiver, ahead of the data waiting for credit, that the barrier of unaligned
    /// checkpoint `checkpoint` went into the channel. A ring does nothing: its receiver is in
    /// this process, and learns it from the job's announcements (`inflight.rs`).
    fn announce(&self, _checkpoint: u64) {}
}

/// Where a receiver's segments were written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// In this process (another shard): read in place, unchecked.
    ThisProcess,
    /// In another process: checked before anything reads them.
    Peer,
}

/// Why a channel failed, noted when its stream ends (`None`: it did not fail).
pub(crate) type Failure = Rc<RefCell<Option<String>>>;

/// The receiving end of a channel carrying segments: the segments in the order they were
/// sent, ending when the sender went.
pub struct SegmentReceiver {
    pub(crate) segments: LocalBoxStream<'static, Segment>,
    pub(crate) origin: Origin,
    pub(crate) failure: Failure,
    /// Where the sender is when it is another process (its slot and node), which a failure
    /// names.
    pub(crate) peer: Option<String>,
}

impl SegmentReceiver {
    /// The receiving end of a channel from another process: its segments are checked before
    /// anything reads them.
    pub fn from_peer(segments: impl Stream<Item = Segment> + 'static) -> Self {
        Self::peer(segments, Failure::default(), None)
    }

    /// From another process (`peer`, when known), saying in `failure` why the channel failed
    /// once it ended.
    fn peer(
        segments: impl Stream<Item = Segment> + 'static,
        failure: Failure,
        peer: Option<String>,
    ) -> Self {
        SegmentReceiver {
            segments: segments.boxed_local(),
            origin: Origin::Peer,
            failure,
            peer,
        }
    }
}

/// Channels to and from other processes: `weir-net`'s QUIC streams, whose credit their
/// receivers announce as they free segments of their own pools.
pub(crate) mod net {
    use futures::future::LocalBoxFuture;
    use futures::StreamExt;
    use weir_memory::Segment;
    use weir_net::{ChannelReceiver, ChannelSender, NetError, TrySend};

    use super::super::inflight::Announcements;

    use super::{Closed, Failure, SegmentReceiver, SegmentSender, TrySendError};

    /// Why a channel failed, if it did: `None` when its other end went (its subtask failed or
    /// was cancelled, or its executor's run ended), which is a consequence of another failure.
    fn cause(error: NetError) -> Option<String> {
        match error {
            NetError::ReceiverGone { .. } | NetError::PeerEnded { .. } => None,
            error => Some(error.to_string()),
        }
    }

    /// The sending end of a channel to `peer` (its slot and node, which a failure names).
    pub(crate) struct ToPeer {
        channel: ChannelSender,
        peer: String,
    }

    impl ToPeer {
        pub(crate) fn new(channel: ChannelSender, peer: String) -> ToPeer {
            ToPeer { channel, peer }
        }

        fn closed(&self, error: NetError) -> Closed {
            Closed {
                cause: cause(error).map(|cause| format!("{}: {cause}", self.peer)),
                peer: Some(self.peer.clone()),
            }
        }
    }

    impl SegmentSender for ToPeer {
        fn try_send(&self, segment: Segment) -> Result<(), TrySendError> {
            self.channel.try_send(segment).map_err(|error| match error {
                TrySend::NoCredit(segment) => TrySendError::NoCredit(segment),
                TrySend::Closed(error) => TrySendError::Closed(self.closed(error)),
            })
        }

        fn send(&self, segment: Segment) -> LocalBoxFuture<'_, Result<(), Closed>> {
            Box::pin(async move {
                let sent = self.channel.send(segment).await;
                sent.map_err(|error| self.closed(error))
            })
        }

        fn announce(&self, checkpoint: u64) {
            // The wire carries 32 bits: a later checkpoint is told by its in-band barrier
            // alone (at one a second, after 136 years).
            if let Ok(checkpoint) = u32::try_from(checkpoint) {
                self.channel.announce(checkpoint);
            }
        }
    }

    /// The receiving end of a channel from `peer` (its slot and node, which a failure
    /// names): checked before anything reads it; when it ends, why it failed (if it did) is
    /// noted before the channel goes. With `announce`, the unaligned checkpoints its sender
    /// announces are announced to the receiving task there (its announcements and its task).
    pub(crate) fn receiver(
        channel: ChannelReceiver,
        peer: String,
        announce: Option<(Announcements, usize)>,
    ) -> SegmentReceiver {
        if let Some((announcements, task)) = announce {
            channel.on_announce(move |checkpoint| {
                announcements.announce(task, u64::from(checkpoint));
            });
        }
        let failure = Failure::default();
        let state = Some((channel, failure.clone(), peer.clone()));
        let segments = futures::stream::unfold(state, |state| async move {
            let (mut channel, noted, peer) = state?;
            match channel.next().await {
                Some(segment) => Some((segment, Some((channel, noted, peer)))),
                None => {
                    *noted.borrow_mut() = channel
                        .failure()
                        .and_then(cause)
                        .map(|cause| format!("{peer}: {cause}"));
                    None
                }
            }
        });
        SegmentReceiver::peer(segments, failure, Some(peer))
    }

    /// A channel to another process that could not be made: closed for `cause` (`None`: a
    /// consequence of a failure reported elsewhere).
    pub(crate) struct Unmade(pub(crate) Option<String>);

    impl SegmentSender for Unmade {
        fn try_send(&self, _segment: Segment) -> Result<(), TrySendError> {
            Err(TrySendError::Closed(Closed {
                cause: self.0.clone(),
                peer: None,
            }))
        }

        fn send(&self, _segment: Segment) -> LocalBoxFuture<'_, Result<(), Closed>> {
            let cause = self.0.clone();
            Box::pin(async move { Err(Closed { cause, peer: None }) })
        }
    }

    /// The receiving end of a channel from another process that could not be made: it ends
    /// at once, failed for `cause` (`None`: a consequence of a failure reported elsewhere).
    pub(crate) fn unmade_receiver(cause: Option<String>) -> SegmentReceiver {
        let failure = Failure::new(std::cell::RefCell::new(cause));
        SegmentReceiver::peer(futures::stream::empty(), failure, None)
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
                Err(_) => Err(TrySendError::Closed(Closed::default())),
            }
        }

        fn send(&self, segment: Segment) -> LocalBoxFuture<'_, Result<(), Closed>> {
            Box::pin(async move {
                ConnectedSender::send(self, segment)
                    .await
                    .map_err(|_| Closed::default())
            })
        }
    }

    /// The receiving end of a ring from another shard: the only receiver whose segments are
    /// read unchecked.
    pub(crate) fn receiver(ring: ConnectedReceiver<Segment>) -> SegmentReceiver {
        SegmentReceiver {
            segments: Box::pin(ring),
            origin: Origin::ThisProcess,
            failure: super::Failure::default(),
            peer: None,
        }
    }
}
