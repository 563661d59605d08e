//! Event time and processing time: watermark strategies, the per-split watermark tracking of
//! sources, and the timer queues keyed operators and windows fire from.

pub(crate) mod timers;
pub mod watermark;

pub use timers::TimeDomain;
pub(crate) use timers::TimerQueue;
pub use watermark::{
    BoundedOutOfOrderness, WatermarkGenerator, WatermarkOutput, WatermarkStrategy,
};

use std::cell::Cell;

/// The civil date (year, month, day; UTC) of `days` days since 1970-01-01 (Howard Hinnant's
/// days-to-civil).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// The wall clock in milliseconds since the Unix epoch: processing time.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

thread_local! {
    /// The processing time of the current stretch (see [`stretch_now_ms`]), once read.
    static STRETCH_NOW: Cell<Option<i64>> = const { Cell::new(None) };
}

/// The processing time a processing-time window files a record under: the wall clock, read
/// once per stretch — the records a chain link hands its operator between two awaits, which
/// take microseconds — instead of once per record (a clock read costs as much as filing the
/// record). Millisecond windows cannot tell the difference.
#[inline]
pub(crate) fn stretch_now_ms() -> i64 {
    STRETCH_NOW.with(|now| {
        now.get().unwrap_or_else(|| {
            let read = now_ms();
            now.set(Some(read));
            read
        })
    })
}

/// Starts a new stretch: the next [`stretch_now_ms`] reads the clock. A chain link calls this
/// before it hands over records and after every await (the shard may have run other tasks,
/// or waited, meanwhile).
#[inline]
pub(crate) fn new_stretch() {
    STRETCH_NOW.with(|now| now.set(None));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stretch_reads_the_clock_once_and_a_new_one_reads_it_again() {
        new_stretch();
        let first = stretch_now_ms();
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(stretch_now_ms(), first, "same stretch, same time");
        new_stretch();
        assert!(
            stretch_now_ms() >= first + 5,
            "a new stretch sees the clock move"
        );
    }
}
