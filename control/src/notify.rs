//! systemd's service notifications (`sd_notify(3)`), for the units `weir tune systemd`
//! renders (`Type=notify`): `READY=1` once a process serves, `STOPPING=1` when it begins to
//! stop, `STATUS=` lines, and `WATCHDOG=1` at half of `WatchdogSec`. Outside systemd
//! (no `NOTIFY_SOCKET`) they are nothing.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Sends `state` (`READY=1`, `STATUS=…`) to systemd, if it listens.
pub(crate) fn notify(state: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = UnixDatagram::unbound().and_then(|datagram| {
        use std::os::unix::ffi::OsStrExt;
        match socket.as_bytes().strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                datagram.send_to_addr(state.as_bytes(), &address)
            }
            None => datagram.send_to(state.as_bytes(), &socket),
        }
    });
    if let Err(error) = sent {
        tracing::warn!("cannot tell systemd '{state}' at {socket:?}: {error}");
    }
}

/// The watchdog's interval (`WatchdogSec`), if systemd watches this process.
fn watchdog() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse::<u32>().ok()? != std::process::id() {
            return None;
        }
    }
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// Pings systemd's watchdog at half its interval from the current tokio runtime: a runtime
/// that stops turning stops the pings, and systemd restarts the process.
pub(crate) fn spawn_watchdog() {
    let Some(interval) = watchdog() else {
        return;
    };
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval / 2);
        loop {
            ticks.tick().await;
            notify("WATCHDOG=1");
        }
    });
}
