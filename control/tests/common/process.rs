//! A process a test started, SIGKILLed and reaped when dropped, however the test ends, or
//! stopped with SIGTERM.

use std::process::Child;

/// A process this test started, SIGKILLed when dropped.
pub struct Process(pub Child);

impl Process {
    /// Sends SIGTERM and waits for a clean exit within `limit`.
    pub fn terminate(&mut self, limit: std::time::Duration) {
        // SAFETY: kill(2) on a child this test started and has not reaped.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let started = std::time::Instant::now();
        loop {
            if let Some(status) = self.0.try_wait().expect("the child's status") {
                assert!(status.success(), "exited {status} on SIGTERM");
                return;
            }
            assert!(
                started.elapsed() < limit,
                "still running {limit:?} after SIGTERM"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The word after `marker` in the first line of `child`'s standard error (piped) holding it
/// (a log line's message ends there, its fields follow), within 30 s; the rest of its log is
/// drained, so that the child never blocks on a full pipe.
pub fn word_after(child: &mut Child, marker: &str) -> String {
    use std::io::{BufRead, BufReader};
    let lines = BufReader::new(child.stderr.take().expect("a piped standard error")).lines();
    let (found, wait) = std::sync::mpsc::channel();
    let sought = marker.to_string();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if let Some((_, rest)) = line.split_once(&sought) {
                let word = rest.split_whitespace().next().unwrap_or_default();
                let _ = found.send(word.to_string());
            }
        }
    });
    wait.recv_timeout(std::time::Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("no '{marker}' in its log within 30 s"))
}
