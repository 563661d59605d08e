//! Shields a future from wake-ups it did not ask for.
//!
//! glommio 0.9's `StreamReader` and `StreamWriter` assume that they are polled again only once
//! their pending I/O has completed: polled earlier, they unwrap the missing result and panic.
//! A subtask runs as one task, so anything it waited on before (an exchange channel whose
//! wait was abandoned for the buffer timeout, a timer) may wake it while a file read or write
//! is in flight. [`polled_when_woken`] polls the future it runs only on its first poll and
//! after one of the wakers it handed out fired; every other poll is answered `Pending`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// The waker handed to the filtered future: records that the future asked to be polled and
/// wakes the task.
#[derive(Default)]
struct WakeFlag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// Runs `future`, polling it only on the first poll and after it woke its own waker. A fresh
/// waker per call, so a wake-up left over from an earlier call cannot reach this one.
pub(crate) async fn polled_when_woken<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let flag = Arc::new(WakeFlag::default());
    let waker = Waker::from(Arc::clone(&flag));
    let mut first = true;
    std::future::poll_fn(|cx| {
        flag.task.register(cx.waker());
        let woken = flag.woken.swap(false, Ordering::AcqRel);
        if !woken && !std::mem::take(&mut first) {
            return Poll::Pending;
        }
        future.as_mut().poll(&mut Context::from_waker(&waker))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A future that counts its polls and is ready once its own waker was woken twice.
    struct Probe {
        polls: usize,
        wakes: Arc<std::sync::atomic::AtomicUsize>,
        waker: Arc<std::sync::Mutex<Option<Waker>>>,
    }

    impl Future for Probe {
        type Output = usize;
        fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.wakes.load(Ordering::Acquire) >= 2 {
                return Poll::Ready(self.polls);
            }
            *self.waker.lock().expect("probe lock") = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    #[test]
    fn only_its_own_wakes_reach_the_future() {
        let wakes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let inner = Arc::new(std::sync::Mutex::new(None::<Waker>));
        let mut filtered = Box::pin(polled_when_woken(Probe {
            polls: 0,
            wakes: Arc::clone(&wakes),
            waker: Arc::clone(&inner),
        }));
        let mut cx = Context::from_waker(Waker::noop());
        // First poll reaches the future; spurious polls after it do not.
        for _ in 0..5 {
            assert!(filtered.as_mut().poll(&mut cx).is_pending());
        }
        let wake_inner = || {
            wakes.fetch_add(1, Ordering::AcqRel);
            inner
                .lock()
                .expect("probe lock")
                .take()
                .expect("registered")
                .wake();
        };
        wake_inner();
        assert!(filtered.as_mut().poll(&mut cx).is_pending());
        assert!(filtered.as_mut().poll(&mut cx).is_pending(), "spurious");
        wake_inner();
        // Polled three times in all: first, after each of its two wakes.
        assert_eq!(filtered.as_mut().poll(&mut cx), Poll::Ready(3));
    }
}
