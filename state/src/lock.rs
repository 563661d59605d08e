//! Exclusive `flock`s on files: held while the file is open, released by the kernel when the
//! process ends, however it ends, so a lock that can be taken names an owner that is gone.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Takes an exclusive `flock` on `file` without waiting: `Ok(true)` when it is now held (until
/// `file` is closed), `Ok(false)` when another open file holds it, in this process or another.
pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    // SAFETY: `file` owns an open descriptor for the duration of the call.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(error)
    }
}
