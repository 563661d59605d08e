//! A process a test started, SIGKILLed and reaped when dropped, however the test ends.

use std::process::Child;

/// A process this test started, SIGKILLed when dropped.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
