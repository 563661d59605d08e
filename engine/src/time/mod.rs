//! Event time and processing time: watermark strategies, the per-split watermark tracking of
//! sources, and the timer queues keyed operators and windows fire from.

pub(crate) mod timers;
pub mod watermark;

pub use timers::TimeDomain;
pub(crate) use timers::TimerQueue;
pub use watermark::{
    BoundedOutOfOrderness, WatermarkGenerator, WatermarkOutput, WatermarkStrategy,
};

/// The wall clock in milliseconds since the Unix epoch: processing time.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
