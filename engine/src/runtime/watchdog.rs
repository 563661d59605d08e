//! A guard against shards that sleep through their wake-up.
//!
//! A parked glommio executor sleeps in `io_uring_enter` until a completion arrives; its timers
//! reach it through a second ring linked to the first. Rarely (about once in a few thousand
//! short jobs on this project's machines) that wake-up is lost and the shard sleeps on with
//! work due: a job that never ends, its shard in `io_cqring_wait`, until anything interrupts
//! the system call — attaching a debugger was enough to resume it. Every shard therefore runs
//! a heartbeat task on a timer, and a watchdog thread per job checks the beats: a shard that
//! has missed them for [`STALL`] gets a signal whose handler does nothing, which makes
//! `io_uring_enter` return `EINTR`; glommio then processes its timers and shared channels and
//! carries on. A shard that misses its beats because it is running (a window firing millions
//! of keys without yielding) is left alone: the watchdog reads the thread's state in `/proc`
//! first. Other system calls on an interrupted shard restart (`SA_RESTART`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use super::periodic::PeriodicThread;

/// How often a shard's heartbeat task beats.
pub(crate) const BEAT: Duration = Duration::from_millis(50);
/// How often the watchdog looks at the beats.
const LOOK: Duration = Duration::from_millis(100);
/// How long a shard may go without a beat before the watchdog interrupts its sleep.
pub(crate) const STALL: Duration = Duration::from_millis(1_000);

/// The signal that interrupts a stalled shard. Nothing else in the process uses it (its
/// default action is to be ignored; the handler installed here does nothing).
const INTERRUPT: libc::c_int = libc::SIGURG;

/// One shard's heartbeat, shared with the watchdog.
#[derive(Debug, Default)]
pub(crate) struct Pulse {
    beats: AtomicU64,
    /// The shard thread's `pthread_t`, once it runs.
    thread: AtomicU64,
    /// Its kernel thread id (for its state in `/proc`).
    tid: std::sync::atomic::AtomicI32,
    started: AtomicBool,
    /// Whether the shard's work is done. The watchdog holds the lock while it signals, so once
    /// `finish` has returned no signal can reach the thread after it exits.
    finished: Mutex<bool>,
}

impl Pulse {
    /// Called on the shard thread when it starts; the shard is watched until the returned
    /// guard is dropped (on that thread, before it exits — also when unwinding).
    #[must_use = "the shard is watched until the guard is dropped"]
    pub(crate) fn start(&self) -> Watched<'_> {
        install_handler();
        // SAFETY: `pthread_self` and `gettid` have no preconditions.
        let (thread, tid) = unsafe { (libc::pthread_self(), libc::gettid()) };
        #[allow(clippy::unnecessary_cast)] // `pthread_t` is a `c_ulong`: u64 here, not everywhere
        self.thread.store(thread as u64, Ordering::Relaxed);
        self.tid.store(tid, Ordering::Relaxed);
        self.started.store(true, Ordering::Release);
        Watched(self)
    }

    /// One beat of the shard's heartbeat task.
    pub(crate) fn beat(&self) {
        self.beats.fetch_add(1, Ordering::Relaxed);
    }

    /// Called on the shard thread when its work is done: it is no longer watched.
    pub(crate) fn finish(&self) {
        *self.finished.lock().unwrap_or_else(|e| e.into_inner()) = true;
    }
}

/// While it lives, the shard thread that made it is watched; dropping it calls
/// [`Pulse::finish`].
pub(crate) struct Watched<'a>(&'a Pulse);

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        self.0.finish();
    }
}

extern "C" fn ignore(_: libc::c_int) {}

/// Installs the do-nothing handler of [`INTERRUPT`], once per process.
fn install_handler() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: a zeroed `sigaction` is a valid value (empty mask, no flags); the handler
        // is an `extern "C" fn(c_int)` that touches nothing, so it is async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = ignore as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(INTERRUPT, &action, std::ptr::null_mut()) != 0 {
                tracing::warn!(
                    error = %std::io::Error::last_os_error(),
                    "cannot install the shard watchdog's signal handler; a stalled shard will not be woken"
                );
            }
        }
    });
}

/// Whether thread `tid` of this process is running (state `R` in `/proc`); `false` if
/// sleeping or unknown.
fn running(tid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, after_name) = stat.rsplit_once(')')?;
            after_name.trim_start().chars().next()
        })
        == Some('R')
}

/// Interrupts the blocking system call the shard of `pulse` is in (see the module docs),
/// unless it has finished. Returns whether it did.
fn interrupt(pulse: &Pulse) -> bool {
    let finished = pulse.finished.lock().unwrap_or_else(|e| e.into_inner());
    if *finished {
        return false;
    }
    // SAFETY: the thread is a started shard thread that has not called `finish` — and cannot
    // until the lock is released —, which it does before exiting, so the `pthread_t` is that
    // of a live thread; the signal has the handler installed by `Pulse::start`.
    unsafe {
        libc::pthread_kill(
            pulse.thread.load(Ordering::Relaxed) as libc::pthread_t,
            INTERRUPT,
        );
    }
    true
}

/// Watches the shards of one job until dropped.
pub(crate) struct Watchdog {
    interrupts: Arc<AtomicU64>,
    _thread: Option<PeriodicThread>,
}

impl Watchdog {
    /// Starts watching `pulses` (shard `i` has `pulses[i]`).
    pub(crate) fn start(pulses: Vec<Arc<Pulse>>) -> Watchdog {
        let interrupts = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&interrupts);
        let mut last: Vec<(u64, Duration)> = vec![(0, Duration::ZERO); pulses.len()];
        let thread = PeriodicThread::spawn("weir-watchdog", LOOK, move || {
            look(&pulses, &mut last, &counted)
        })
        .map_err(|error| tracing::warn!(%error, "cannot start the shard watchdog"))
        .ok();
        Watchdog {
            interrupts,
            _thread: thread,
        }
    }

    /// How many times this watchdog has interrupted a stalled shard.
    pub(crate) fn interrupts(&self) -> u64 {
        self.interrupts.load(Ordering::Relaxed)
    }
}

/// One look at every shard's beats: interrupts those quiet for [`STALL`].
fn look(pulses: &[Arc<Pulse>], last: &mut [(u64, Duration)], interrupts: &AtomicU64) {
    for (shard, (pulse, (beats, quiet))) in pulses.iter().zip(last).enumerate() {
        if !pulse.started.load(Ordering::Acquire) {
            continue;
        }
        let now = pulse.beats.load(Ordering::Relaxed);
        if now != *beats {
            (*beats, *quiet) = (now, Duration::ZERO);
            continue;
        }
        *quiet += LOOK;
        if *quiet < STALL {
            continue;
        }
        // A shard running without yielding (a large window firing) is busy, not asleep.
        if running(pulse.tid.load(Ordering::Relaxed)) {
            *quiet = Duration::ZERO;
            continue;
        }
        if interrupt(pulse) {
            tracing::warn!(
                shard,
                quiet_ms = quiet.as_millis() as u64,
                "shard asleep past its heartbeat; interrupted its wait (a lost io_uring wake-up)"
            );
            interrupts.fetch_add(1, Ordering::Relaxed);
            *quiet = Duration::ZERO;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interrupt wakes a thread out of a wait that nothing else would end: an
    /// `epoll_wait` on an empty set without a timeout (never restarted, like `io_uring_enter`).
    #[test]
    fn an_interrupt_ends_a_wait_without_timeout() {
        let pulse = Arc::new(Pulse::default());
        let waiter = {
            let pulse = Arc::clone(&pulse);
            std::thread::spawn(move || {
                let watched = pulse.start();
                // SAFETY: plain system calls on a fresh epoll fd and a local event buffer.
                unsafe {
                    let fd = libc::epoll_create1(0);
                    assert!(fd >= 0);
                    let mut event: libc::epoll_event = std::mem::zeroed();
                    let ready = libc::epoll_wait(fd, &mut event, 1, -1);
                    let error = std::io::Error::last_os_error();
                    libc::close(fd);
                    drop(watched);
                    (ready, error.raw_os_error())
                }
            })
        };
        while !pulse.started.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        // No beats: the watchdog interrupts the waiter after `STALL`.
        let watchdog = Watchdog::start(vec![Arc::clone(&pulse)]);
        let (ready, error) = waiter.join().expect("the waiter returns");
        assert_eq!((ready, error), (-1, Some(libc::EINTR)));
        assert_eq!(watchdog.interrupts(), 1);
    }

    #[test]
    fn a_busy_thread_reads_as_running_and_a_parked_one_does_not() {
        // SAFETY: `gettid` has no preconditions.
        let me = unsafe { libc::gettid() };
        assert!(running(me), "this thread is running while it asks");
        let (tx, rx) = std::sync::mpsc::channel();
        let parked = std::thread::spawn(move || {
            // SAFETY: as above.
            tx.send(unsafe { libc::gettid() }).expect("send");
            std::thread::park();
        });
        let tid = rx.recv().expect("tid");
        std::thread::sleep(Duration::from_millis(50));
        assert!(!running(tid), "a parked thread sleeps");
        parked.thread().unpark();
        parked.join().expect("joins");
    }

    /// A shard that beats is left alone.
    #[test]
    fn a_beating_shard_is_not_interrupted() {
        let pulse = Arc::new(Pulse::default());
        let watched = pulse.start();
        let watchdog = Watchdog::start(vec![Arc::clone(&pulse)]);
        let until = std::time::Instant::now() + STALL * 2;
        while std::time::Instant::now() < until {
            pulse.beat();
            std::thread::sleep(BEAT);
        }
        drop(watched);
        std::thread::sleep(STALL + LOOK * 2);
        assert_eq!(
            watchdog.interrupts(),
            0,
            "beating, then finished: never stalled"
        );
    }
}
