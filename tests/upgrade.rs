//! Zero-downtime binary upgrade: 64 clients (keep-alive and new connections, plain and
//! streamed requests) run against a gateway that is upgraded twice with SIGUSR2; no request
//! may fail, no connection may be refused or reset, every stream must end whole.

// clippy.toml's house rules are the gateway's: a test's threads are not shards and may lock.
#![allow(clippy::disallowed_types)]

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;

const PLAIN: &str = r#"{"model":"m","prompt":"hello"}"#;
const STREAM: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"fake":"sse","events":5,"gap_ms":10}"#;

#[derive(Default)]
struct Tally {
    ok: AtomicUsize,
    failures: Mutex<Vec<String>>,
}

/// One client: keep-alive (reconnecting when told `connection: close`) or a fresh connection
/// per request; alternates plain and streamed requests.
fn client(port: u16, keep_alive: bool, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let mut conn: Option<(TcpStream, Vec<u8>)> = None;
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let (path, body) =
            if n.is_multiple_of(3) { ("/v1/chat/completions", STREAM) } else { ("/v1/completions", PLAIN) };
        if conn.is_none() {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => {
                    s.set_read_timeout(Some(patience(Duration::from_secs(10)))).unwrap();
                    conn = Some((s, Vec::new()));
                }
                Err(e) => {
                    tally.failures.lock().unwrap().push(format!("connect: {e}"));
                    continue;
                }
            }
        }
        let (s, rest) = conn.as_mut().unwrap();
        let sent = s.write_all(post_bytes(path, body, &[]).as_bytes());
        let r = sent.and_then(|_| read_response(s, rest, false));
        match r {
            Ok(r) if r.status == 200 && r.complete => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
                if !keep_alive || r.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close")) {
                    conn = None;
                }
            }
            Ok(r) => {
                tally.failures.lock().unwrap().push(format!(
                    "{path}: status {} complete {} body {}",
                    r.status,
                    r.complete,
                    r.text()
                ));
                conn = None;
            }
            Err(e) => {
                tally.failures.lock().unwrap().push(format!("{path} (keep-alive {keep_alive}, request {n}): {e}"));
                conn = None;
            }
        }
    }
}

fn alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped by its parent) counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        .unwrap_or(false)
}

/// The pid the gateway logged for the successor it started, the n-th time.
fn successor_pid(gw: &Gateway, nth: usize) -> Option<u32> {
    gw.log_text().lines().filter_map(|l| l.split("(pid ").nth(1)?.split(')').next()?.parse().ok()).nth(nth)
}

#[test]
fn upgraded_twice_under_load_without_a_failed_request() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = Gateway::start(legacy, &["--worker-urls", &w.url(), "--cores", "2", "--prometheus-port", "0"]);
        gw.ready();
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Tally::default());
        let threads: Vec<_> = (0..64)
            .map(|i| {
                let (stop, tally) = (Arc::clone(&stop), Arc::clone(&tally));
                let port = gw.port;
                std::thread::spawn(move || client(port, i % 4 != 0, stop, tally))
            })
            .collect();
        let mut pids = vec![gw.pid()];
        for round in 0..2 {
            // Let traffic build up on the current generation.
            let before = tally.ok.load(Ordering::Relaxed);
            assert!(
                wait_until(patience(Duration::from_secs(10)), || tally.ok.load(Ordering::Relaxed) > before + 200),
                "no traffic before upgrade {round}"
            );
            let old = *pids.last().unwrap();
            unsafe { libc::kill(old as i32, libc::SIGUSR2) };
            let next = wait_until(patience(Duration::from_secs(30)), || successor_pid(&gw, round).is_some());
            assert!(next, "upgrade {round}: no successor started; log:\n{}", gw.log_text());
            let pid = successor_pid(&gw, round).unwrap();
            pids.push(pid);
            assert!(
                wait_until(patience(Duration::from_secs(30)), || !alive(old)),
                "upgrade {round}: the old gateway (pid {old}) never finished draining"
            );
            assert!(alive(pid), "upgrade {round}: the successor died; log:\n{}", gw.log_text());
        }
        // Traffic keeps flowing on the last generation.
        let before = tally.ok.load(Ordering::Relaxed);
        let flowing = wait_until(patience(Duration::from_secs(10)), || tally.ok.load(Ordering::Relaxed) > before + 200);
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        let last = *pids.last().unwrap();
        unsafe { libc::kill(last as i32, libc::SIGKILL) };
        assert!(flowing, "no traffic after the second upgrade");
        let failures = tally.failures.lock().unwrap();
        assert!(
            failures.is_empty(),
            "{} of {} requests failed across two upgrades, first: {:?}",
            failures.len(),
            failures.len() + tally.ok.load(Ordering::Relaxed),
            &failures[..failures.len().min(5)]
        );
    });
}
