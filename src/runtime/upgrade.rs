//! Zero-downtime binary upgrade: `kill -USR2 <pid>` (nginx's signal for the same job).
//!
//! The running gateway starts its successor (the binary now at its own path, with the same
//! arguments), handing it every shard's listening socket as descriptors 3.. and a pipe to say
//! it is ready on. The successor accepts on the very same sockets, so nothing waiting in an
//! accept queue is lost and no new connection is refused. Once the successor reports ready
//! (its shards accept and a worker is routable), the old gateway stops accepting (cancelling
//! its pending accepts without closing the sockets) and drains as on SIGTERM, except that it
//! also waits for idle keep-alive clients: each gets its next answer with
//! `connection: close` and reconnects to the successor, so none finds its connection closed
//! under a request. If the successor fails or is not ready within 60 s, it is stopped and
//! the old gateway carries on serving.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

/// The successor finds its inherited sockets and its ready pipe here.
pub const LISTEN_FDS_ENV: &str = "SMG_UPGRADE_LISTEN_FDS";
pub const READY_FD_ENV: &str = "SMG_UPGRADE_READY_FD";
const READY_WITHIN: Duration = Duration::from_secs(60);

/// The listening descriptors handed over by a predecessor, if this process is a successor.
/// Read once at start. The variables stay in this process's environment (removing them races
/// with any thread reading it); the one child they matter to, a successor, gets its own values
/// from `hand_over`.
pub fn inherited() -> (Vec<RawFd>, Option<RawFd>) {
    let n = std::env::var(LISTEN_FDS_ENV).ok().and_then(|v| v.parse::<i32>().ok()).unwrap_or(0);
    let ready = std::env::var(READY_FD_ENV).ok().and_then(|v| v.parse::<i32>().ok());
    ((3..3 + n.max(0)).collect(), ready)
}

/// Tells the predecessor this process is ready (one byte on the pipe it passed).
#[allow(unsafe_code)]
pub fn report_ready(fd: RawFd) {
    // SAFETY: the descriptor was passed to us for exactly this; it is owned (and closed) here.
    let mut pipe = unsafe { std::fs::File::from_raw_fd(fd) };
    let _ = std::io::Write::write_all(&mut pipe, b"1");
}

/// The binary now at this process's path (after an upgrade replaced the file, `/proc/self/exe`
/// names the old, deleted inode with a " (deleted)" suffix).
fn successor_path() -> std::io::Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    let s = exe.to_string_lossy();
    Ok(match s.strip_suffix(" (deleted)") {
        Some(p) => p.into(),
        None => exe,
    })
}

/// Starts the successor with `listeners` (one per shard) and waits until it reports ready.
#[allow(unsafe_code)]
pub fn hand_over(listeners: &[RawFd]) -> Result<(), String> {
    let path = successor_path().map_err(|e| format!("cannot find the binary: {e}"))?;
    let (mut ready_rx, ready_tx) = pipe().map_err(|e| format!("pipe: {e}"))?;
    let fds: Vec<RawFd> = listeners.to_vec();
    let ready_fd = ready_tx.as_raw_fd();
    let n = fds.len() as RawFd;
    let mut cmd = Command::new(&path);
    cmd.args(std::env::args_os().skip(1))
        .env(LISTEN_FDS_ENV, n.to_string())
        .env(READY_FD_ENV, (3 + n).to_string())
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID");
    // SAFETY: only dup2/fcntl (async-signal-safe) between fork and exec. Sources are first
    // moved above the target range so a dup2 never overwrites a source still to be copied.
    unsafe {
        cmd.pre_exec(move || {
            let base = 3 + n + 1;
            let mut moved = Vec::with_capacity(fds.len() + 1);
            for &fd in fds.iter().chain(std::iter::once(&ready_fd)) {
                let m = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, base + 64);
                if m < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                moved.push(m);
            }
            for (i, &m) in moved.iter().enumerate() {
                if libc::dup2(m, 3 + i as RawFd) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::fcntl(3 + i as RawFd, libc::F_SETFD, 0);
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("start {}: {e}", path.display()))?;
    drop(ready_tx);
    crate::info!("upgrade: started {} (pid {}); waiting for it to be ready", path.display(), child.id());
    let (tx, rx) = flume::bounded(1);
    std::thread::spawn(move || {
        let mut b = [0u8; 1];
        let _ = tx.send(matches!(ready_rx.read(&mut b), Ok(1)));
    });
    match rx.recv_timeout(READY_WITHIN) {
        Ok(true) => {
            // The successor runs on its own from here; nobody waits for it.
            std::mem::forget(child);
            Ok(())
        }
        outcome => {
            let _ = child.kill();
            let _ = child.wait();
            Err(match outcome {
                Ok(_) => "the successor exited before it was ready".into(),
                Err(_) => format!("the successor was not ready within {READY_WITHIN:?}"),
            })
        }
    }
}

#[allow(unsafe_code)]
fn pipe() -> std::io::Result<(std::fs::File, std::fs::File)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors owned from here on.
    Ok(unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) })
}
