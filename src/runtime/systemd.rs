//! systemd integration without libsystemd: readiness notifications (`Type=notify`), the
//! watchdog, and socket activation. Each is a no-op when systemd did not ask for it.
//!
//! - `NOTIFY_SOCKET`: `READY=1` once the first worker is routable, `STOPPING=1` when the drain
//!   starts, `WATCHDOG=1` every half `WATCHDOG_USEC`, sent only while every shard's reactor
//!   has ticked recently, so a stuck shard stops the pings and systemd restarts the service.
//! - `LISTEN_FDS` / `LISTEN_PID` (socket activation, `smg.socket`): the gateway takes its
//!   listening sockets from systemd instead of binding `--host`/`--port`. With one socket
//!   every shard accepts on it (a duplicate each); with several, shard i takes socket i
//!   modulo their number (give a `.socket` unit one `ListenStream=` per shard with
//!   `ReusePort=yes` to let the kernel spread connections as it does for our own listeners).

use std::os::fd::RawFd;
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// The first descriptor systemd passes (SD_LISTEN_FDS_START).
const LISTEN_FDS_START: RawFd = 3;

/// Sends one notification to `NOTIFY_SOCKET`, if set. Errors are ignored: a missing
/// supervisor must never stop the gateway.
pub fn notify(msg: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let Ok(sock) = UnixDatagram::unbound() else { return };
    let bytes = path.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        if let Ok(addr) = std::os::unix::net::SocketAddr::from_abstract_name(name) {
            let _ = sock.send_to_addr(msg.as_bytes(), &addr);
        }
    } else {
        let _ = sock.send_to(msg.as_bytes(), std::path::Path::new(&path));
    }
}

/// The listening sockets systemd passed to this process, if any.
pub fn listen_fds() -> Vec<RawFd> {
    let pid_ok = std::env::var("LISTEN_PID").ok().and_then(|p| p.parse::<u32>().ok()) == Some(std::process::id());
    let n = std::env::var("LISTEN_FDS").ok().and_then(|n| n.parse::<i32>().ok()).unwrap_or(0);
    if !pid_ok || n <= 0 {
        return Vec::new();
    }
    (LISTEN_FDS_START..LISTEN_FDS_START + n).collect()
}

/// The watchdog interval systemd asked for (`WATCHDOG_USEC`, for this process).
fn watchdog_interval() -> Option<Duration> {
    if let Some(pid) = std::env::var("WATCHDOG_PID").ok().and_then(|p| p.parse::<u32>().ok()) {
        if pid != std::process::id() {
            return None;
        }
    }
    let usec = std::env::var("WATCHDOG_USEC").ok()?.parse::<u64>().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// Starts the readiness and watchdog thread: READY=1 once `ready()` holds, then WATCHDOG=1
/// every half interval while `alive(within)` says every shard ticked within that long.
// The systemd thread, never a shard, paces itself by sleeping: that is its whole job.
#[allow(clippy::disallowed_methods)]
pub fn start(alive: impl Fn(Duration) -> bool + Send + 'static, ready: impl Fn() -> bool + Send + 'static) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let watchdog = watchdog_interval();
    let spawned = std::thread::Builder::new().name("smg-systemd".into()).spawn(move || {
        while !ready() {
            std::thread::sleep(Duration::from_millis(50));
        }
        notify("READY=1\nSTATUS=serving");
        let Some(every) = watchdog else { return };
        let period = every / 2;
        loop {
            std::thread::sleep(period);
            if alive(period.max(Duration::from_millis(500))) {
                notify("WATCHDOG=1");
            } else {
                crate::warn!("a shard has not ticked for {period:?}: withholding the watchdog ping");
            }
        }
    });
    if let Err(e) = spawned {
        crate::error!("systemd notifier: {e}");
    }
}
