//! systemd's service notifications (`sd_notify(3)`), for the units `weir tune systemd`
//! renders (`Type=notify`): `READY=1` once a process serves, `STOPPING=1` when it begins to
//! stop, `STATUS=` lines, and `WATCHDOG=1` at half of `WatchdogSec`. Outside systemd
//! (no `NOTIFY_SOCKET`) they are nothing.

use std::ffi::OsStr;
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// The variables systemd gives a service, which the processes a worker starts must not take
/// for theirs.
pub(crate) const VARIABLES: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

/// Sends `state` (`READY=1`, `STATUS=…`) to systemd, if it listens.
pub(crate) fn notify(state: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(error) = notify_to(&socket, state) {
        tracing::warn!("cannot tell systemd '{state}' at {socket:?}: {error}");
    }
}

/// Sends `state` to the notify socket `socket`: a path, or `@` and an abstract name.
fn notify_to(socket: &OsStr, state: &str) -> std::io::Result<usize> {
    use std::os::unix::ffi::OsStrExt;
    let datagram = UnixDatagram::unbound()?;
    match socket.as_bytes().strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            datagram.send_to_addr(state.as_bytes(), &address)
        }
        None => datagram.send_to(state.as_bytes(), socket),
    }
}

/// Tells systemd this process serves, saying `status`, and pings its watchdog from now on.
pub(crate) fn ready(status: &str) {
    notify(&format!("READY=1\nSTATUS={status}"));
    spawn_watchdog(watchdog(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
    ));
}

/// The watchdog's interval (`WatchdogSec`) from `WATCHDOG_USEC` and `WATCHDOG_PID`, if
/// systemd watches this process.
fn watchdog(usec: Option<&str>, pid: Option<&str>) -> Option<Duration> {
    let usec: u64 = usec?.parse().ok()?;
    if let Some(pid) = pid {
        if pid.parse::<u32>().ok()? != std::process::id() {
            return None;
        }
    }
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// Pings systemd's watchdog at half `interval` from the current tokio runtime: a runtime
/// that stops turning stops the pings, and systemd restarts the process.
fn spawn_watchdog(interval: Option<Duration>) {
    let Some(interval) = interval else {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reaches_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("weir-notify-test-{}", std::process::id());
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&address).unwrap();
        notify_to(OsStr::new(&format!("@{name}")), "READY=1").unwrap();
        let mut buffer = [0u8; 64];
        let n = listener.recv(&mut buffer).unwrap();
        assert_eq!(&buffer[..n], b"READY=1");
    }

    #[test]
    fn the_watchdog_is_this_process_s_only() {
        let me = std::process::id().to_string();
        assert_eq!(
            watchdog(Some("2000000"), Some(&me)),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            watchdog(Some("2000000"), None),
            Some(Duration::from_secs(2))
        );
        assert_eq!(watchdog(Some("2000000"), Some("1")), None);
        assert_eq!(watchdog(Some("0"), None), None);
        assert_eq!(watchdog(None, None), None);
    }
}
