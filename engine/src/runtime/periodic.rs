//! A thread that does something every period until dropped: the progress line of `weir run`,
//! the shard watchdog, benchmark progress.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Runs `tick` every `period` on a named thread; dropping it stops the thread (at once, not
/// after the current period) and joins it.
#[derive(Debug)]
pub struct PeriodicThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PeriodicThread {
    /// Starts the thread; `tick` first runs one `period` after the start.
    pub fn spawn(
        name: &str,
        period: Duration,
        mut tick: impl FnMut() + Send + 'static,
    ) -> std::io::Result<PeriodicThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || loop {
                std::thread::park_timeout(period);
                if stopped.load(Ordering::Relaxed) {
                    break;
                }
                tick();
            })?;
        Ok(PeriodicThread {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for PeriodicThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::time::Instant;

    #[test]
    fn ticks_until_dropped_and_stops_at_once() {
        let ticks = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&ticks);
        let thread = PeriodicThread::spawn("test-periodic", Duration::from_millis(5), move || {
            counted.fetch_add(1, Ordering::Relaxed);
        })
        .expect("spawn");
        while ticks.load(Ordering::Relaxed) < 3 {
            std::thread::yield_now();
        }
        let slow =
            PeriodicThread::spawn("test-slow", Duration::from_secs(3_600), || {}).expect("spawn");
        let dropping = Instant::now();
        drop(slow);
        assert!(
            dropping.elapsed() < Duration::from_secs(60),
            "not a period later"
        );
        drop(thread);
        let after = ticks.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            ticks.load(Ordering::Relaxed),
            after,
            "no tick after the drop"
        );
    }
}
