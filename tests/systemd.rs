//! systemd integration without systemd: the test plays the service manager. It listens on a
//! `NOTIFY_SOCKET` for READY / WATCHDOG / STOPPING, and hands the gateway a listening
//! socket as `LISTEN_FDS` (socket activation), the way systemd does.
// A test's threads are not shards: they sleep, and time what the gateway does.
#![allow(clippy::disallowed_methods)]

mod support;

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// Notifications received within `within`, until `until_msg` arrives (if given).
fn collect(sock: &UnixDatagram, within: Duration, until_msg: Option<&str>) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        sock.set_read_timeout(Some(left.max(Duration::from_millis(1)))).unwrap();
        match sock.recv(&mut buf) {
            Ok(n) => {
                let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                let done = until_msg.is_some_and(|m| msg.contains(m));
                got.push(msg);
                if done {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    got
}

#[test]
fn notify_ready_watchdog_and_stopping() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let path = std::env::temp_dir().join(format!("smg-notify-{}-{legacy}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let sock = UnixDatagram::bind(&path).unwrap();
        let port = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_smg"));
        cmd.args(["launch", "--host", "127.0.0.1", "--port", &port.to_string(), "--worker-urls", &w.url()])
            .args(["--cores", "2", "--prometheus-port", "0"])
            .env("NOTIFY_SOCKET", &path)
            .env("WATCHDOG_USEC", "400000")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if legacy {
            cmd.env("MONOIO_FORCE_LEGACY_DRIVER", "1");
        }
        let mut child = cmd.spawn().unwrap();
        let got = collect(&sock, patience(Duration::from_secs(20)), Some("READY=1"));
        assert!(got.iter().any(|m| m.contains("READY=1")), "no READY=1: {got:?}");
        // Readiness means routable: the worker answers through the gateway right away.
        assert_eq!(post(port, "/v1/completions", r#"{"model":"m","prompt":"x"}"#, &[]).status, 200);
        let pings = collect(&sock, patience(Duration::from_millis(1500)), None);
        let n = pings.iter().filter(|m| m.contains("WATCHDOG=1")).count();
        assert!(n >= 2, "expected watchdog pings every 200 ms, got {pings:?}");
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let end = collect(&sock, patience(Duration::from_secs(10)), Some("STOPPING=1"));
        assert!(end.iter().any(|m| m.contains("STOPPING=1")), "no STOPPING=1: {end:?}");
        assert!(child.wait().unwrap().success());
        let _ = std::fs::remove_file(&path);
    });
}

#[test]
fn socket_activation_serves_on_the_passed_socket() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        // The "systemd" side: a bound, listening socket handed over as fd 3.
        let listener = local_listener();
        let port = listener.local_addr().unwrap().port();
        let fd = listener.as_raw_fd();
        let unused = free_port();
        let smg = env!("CARGO_BIN_EXE_smg");
        // LISTEN_PID must be the gateway's own pid: the shell execs into it, keeping $$.
        let script = format!(
            "LISTEN_PID=$$ LISTEN_FDS=1 exec {smg} launch --host 127.0.0.1 --port {unused} --worker-urls {} --cores 2 --prometheus-port 0",
            w.url()
        );
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &script]).stdout(Stdio::null()).stderr(Stdio::null());
        if legacy {
            cmd.env("MONOIO_FORCE_LEGACY_DRIVER", "1");
        }
        // SAFETY: dup2 and fcntl are async-signal-safe; nothing else runs before exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::fcntl(3, libc::F_SETFD, 0);
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        drop(listener);
        let up = wait_until(patience(Duration::from_secs(20)), || {
            try_get(port, "/readiness").is_ok_and(|r| r.status == 200)
        });
        assert!(up, "the activated socket never served /readiness");
        for _ in 0..20 {
            assert_eq!(post(port, "/v1/completions", r#"{"model":"m","prompt":"x"}"#, &[]).status, 200);
        }
        assert!(try_get(unused, "/health").is_err(), "--port must not be bound when activated");
        let _ = child.kill();
        let _ = child.wait();
    });
}
