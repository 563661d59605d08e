//! Credit-based flow control of one channel between two processes, on top of the transport's
//! own (QUIC's stream and connection windows): the receiver gives each channel a pool of its
//! own (Flink's exclusive buffers) and announces a credit for every segment of it that is free
//! and not yet announced; a sender sends a segment only against a credit. A receiver whose
//! task is slow holds its segments, announces nothing, and so stops only its own channel's
//! sender: the other channels of the connection flow on.
//!
//! Both sides are bookkeeping only (no I/O), for whatever drives the transport: it sends
//! [`super::wire::credit_frame`]s for what the receiver's [`super::wire::FrameReader::announce`]
//! says (when the pool's `freed` hook wakes it, and at the start), and grants the sender what
//! its reader of credit frames reads. The receiver's reader counts a credit used when a data
//! frame's header arrives and refuses a frame the sender had no credit for.

use weir_memory::SegmentPool;

/// The sender's side: how many segments the receiver can take now.
#[derive(Debug, Default)]
pub struct SenderCredit {
    available: u64,
    /// Whether the receiver announced any credit yet (it registered for the channel).
    heard: bool,
}

impl SenderCredit {
    /// No credit until the receiver announces some.
    pub fn new() -> SenderCredit {
        SenderCredit::default()
    }

    /// The receiver announced `credits` more.
    pub fn grant(&mut self, credits: u32) {
        self.available += u64::from(credits);
        self.heard = true;
    }

    /// Whether the receiver announced credit ever: it took the channel (before that, the
    /// stream may carry nothing but its open frame).
    pub fn heard(&self) -> bool {
        self.heard
    }

    /// Takes one credit for a segment to send: false when there is none.
    pub fn try_take(&mut self) -> bool {
        let has = self.available > 0;
        self.available -= u64::from(has);
        has
    }

    /// Credits not yet used.
    pub fn available(&self) -> u64 {
        self.available
    }
}

/// The receiver's side: the channel's pool and the credit announced but not yet used.
pub struct ReceiverCredit {
    pool: SegmentPool,
    /// Credits announced that no data frame has used yet.
    outstanding: usize,
}

impl ReceiverCredit {
    /// The receiving end of a channel whose segments come from `pool` (the channel's own:
    /// its size is the most the sender may have in flight). `freed` runs each time a segment
    /// goes back to the pool, on the thread that dropped it: it wakes whatever announces.
    /// `None` when the pool serves another channel already (it has a return hook).
    pub fn new(
        pool: SegmentPool,
        freed: impl Fn() + Send + Sync + 'static,
    ) -> Option<ReceiverCredit> {
        pool.on_return(freed).then_some(ReceiverCredit {
            pool,
            outstanding: 0,
        })
    }

    /// The channel's pool.
    pub(crate) fn pool(&self) -> &SegmentPool {
        &self.pool
    }

    /// A data frame's header arrived: uses one announced credit; false if the sender had none.
    pub(crate) fn take(&mut self) -> bool {
        let has = self.outstanding > 0;
        self.outstanding -= usize::from(has);
        has
    }

    /// The credit to announce now: the pool's free segments beyond those announced already
    /// (`None` when there are none).
    pub(crate) fn announce(&mut self) -> Option<u32> {
        let stats = self.pool.stats();
        let free = stats.segments.saturating_sub(stats.in_use);
        let more = free.saturating_sub(self.outstanding);
        if more == 0 {
            return None;
        }
        self.outstanding += more;
        Some(u32::try_from(more).expect("a channel's pool is smaller than 4 G segments"))
    }
}
