//! Helpers for the authentication and admission tests: a launcher that sets environment
//! variables, a check that a launch fails, raw requests whose `Authorization` value may be
//! any bytes, which shard serves a connection, and how much a peer that does not read can
//! be sent on this machine.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::rogue::{connect_with, exchange};
use super::{launch_command, patience, read_response, Gateway, Response};

/// [`Gateway::start`] with `env` set in the gateway's environment (and
/// `CONTROL_PLANE_API_KEYS` removed unless `env` sets it). A gateway that exits at start
/// fails the test at once with its stderr.
pub fn start_env(legacy: bool, args: &[&str], env: &[(&str, &str)]) -> Gateway {
    let (mut cmd, port) = launch_command(legacy, args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Gateway::spawn(cmd, port, &format!("{args:?} (env {env:?})"))
}

/// Launches the gateway with `args` (and `env`) and expects it to exit on its own within
/// 10 s; returns its exit status and stderr. Panics (after killing it) if it keeps running.
pub fn launch_outcome(legacy: bool, args: &[&str], env: &[(&str, &str)]) -> (ExitStatus, String) {
    let (mut cmd, _) = launch_command(legacy, args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let until = Instant::now() + patience(Duration::from_secs(10));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= until {
            let _ = child.kill();
            let _ = child.wait();
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            panic!("gateway {args:?} (env {env:?}) was still running after 10 s; stderr:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    (status, err)
}

/// A raw request: `method path`, `Authorization: <auth>` when given (any bytes), a JSON
/// body when given (Content-Length framed; `Content-Length: 0` for an empty one), and any
/// extra header lines.
pub fn raw_request(method: &str, path: &str, body: Option<&str>, auth: Option<&[u8]>, extra: &[&str]) -> Vec<u8> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\n").into_bytes();
    if let Some(a) = auth {
        req.extend_from_slice(b"Authorization: ");
        req.extend_from_slice(a);
        req.extend_from_slice(b"\r\n");
    }
    for h in extra {
        req.extend_from_slice(h.as_bytes());
        req.extend_from_slice(b"\r\n");
    }
    if let Some(b) = body {
        req.extend_from_slice(format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()).as_bytes());
        req.extend_from_slice(b"\r\n");
        req.extend_from_slice(b.as_bytes());
    } else {
        req.extend_from_slice(b"\r\n");
    }
    req
}

/// Sends `raw` on a fresh connection; a response, or why there was none.
pub fn ask(port: u16, raw: &[u8]) -> Result<Response, String> {
    exchange(port, raw, patience(Duration::from_secs(10))).map_err(|e| format!("no response: {e}"))
}

/// `Authorization: Bearer <key>`, as bytes for [`raw_request`].
pub fn bearer(key: &str) -> Vec<u8> {
    format!("Bearer {key}").into_bytes()
}

// === Shards ===

/// CPU time (ms) each shard thread (`smg-shard-<n>`) of `pid` has used, indexed by shard.
pub fn shard_cpu_ms(pid: u32) -> Vec<f64> {
    let mut out: Vec<(usize, f64)> = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    for t in tasks.flatten() {
        let dir = t.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let Some(idx) = comm.trim().strip_prefix("smg-shard-").and_then(|n| n.parse::<usize>().ok()) else {
            continue;
        };
        out.push((idx, thread_cpu_ms(&dir)));
    }
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, ms)| ms).collect()
}

/// A thread's CPU time: `se.sum_exec_runtime` from `sched` (µs resolution), else utime +
/// stime from `stat` (clock ticks, 10 ms).
fn thread_cpu_ms(dir: &std::path::Path) -> f64 {
    if let Ok(s) = std::fs::read_to_string(dir.join("sched")) {
        if let Some(v) = s
            .lines()
            .find(|l| l.starts_with("se.sum_exec_runtime"))
            .and_then(|l| l.split(':').nth(1))
            .and_then(|v| v.trim().parse::<f64>().ok())
        {
            return v;
        }
    }
    let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
    // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) * 10.0
}

/// Which shard serves the keep-alive connection `s`: sends `GET /liveness` on it for about
/// 150 ms and picks the shard thread whose CPU time grew (the other one stays near idle).
/// Panics when no shard stands out after a few tries.
pub fn shard_of(gw: &Gateway, s: &mut TcpStream) -> usize {
    let mut seen = Vec::new();
    for _ in 0..5 {
        let before = shard_cpu_ms(gw.pid());
        assert!(before.len() >= 2, "the gateway has {} smg-shard-* threads, want 2", before.len());
        let started = Instant::now();
        let mut rest = Vec::new();
        for _ in 0..50_000 {
            if started.elapsed() > Duration::from_millis(150) {
                break;
            }
            s.write_all(b"GET /liveness HTTP/1.1\r\nHost: x\r\n\r\n").expect("write /liveness");
            let r = read_response(s, &mut rest, false).expect("read /liveness");
            assert_eq!(r.status, 200, "/liveness: {}", r.text());
        }
        let after = shard_cpu_ms(gw.pid());
        let grew: Vec<f64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        let (best, most) = grew.iter().enumerate().fold((0, f64::MIN), |m, (i, g)| if *g > m.1 { (i, *g) } else { m });
        let others = grew.iter().enumerate().filter(|(i, _)| *i != best).map(|(_, g)| *g).fold(0.0, f64::max);
        if most >= 10.0 && most > 5.0 * others.max(0.5) {
            return best;
        }
        seen.push(grew);
    }
    panic!("cannot tell which shard serves the connection; shard CPU growth (ms) per try: {seen:?}");
}

/// Opens connections to the gateway (at most `max`) and sorts them by shard until `enough`
/// holds for the groups (indexed by shard). Panics when `max` connections were not enough.
pub fn conns_by_shard(gw: &Gateway, max: usize, enough: impl Fn(&[Vec<TcpStream>]) -> bool) -> Vec<Vec<TcpStream>> {
    let mut groups: Vec<Vec<TcpStream>> = vec![Vec::new(), Vec::new()];
    for _ in 0..max {
        if enough(&groups) {
            return groups;
        }
        let mut s = connect_with(gw.port, patience(Duration::from_secs(30))).expect("connect to the gateway");
        let shard = shard_of(gw, &mut s);
        if groups.len() <= shard {
            groups.resize_with(shard + 1, Vec::new);
        }
        groups[shard].push(s);
    }
    assert!(
        enough(&groups),
        "{max} connections landed on shards as {:?}",
        groups.iter().map(Vec::len).collect::<Vec<_>>()
    );
    groups
}

// === Kernel buffering ===

/// Bytes a client can write to a peer that read its first 64 KB and then stopped reading,
/// before the writes block: what socket buffers on this machine hold for one connection.
pub fn unread_capacity() -> usize {
    let l = super::local_listener();
    let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut peer, _) = l.accept().unwrap();
    let chunk = vec![b'x'; 64 * 1024];
    c.write_all(&chunk).unwrap();
    let mut got = vec![0u8; 64 * 1024];
    peer.read_exact(&mut got).unwrap();
    c.set_write_timeout(Some(Duration::from_millis(300))).unwrap();
    let started = Instant::now();
    let mut n = 0usize;
    while started.elapsed() < Duration::from_secs(5) && n < (512 << 20) {
        match c.write(&chunk) {
            Ok(k) => n += k,
            Err(_) => break,
        }
    }
    n
}
