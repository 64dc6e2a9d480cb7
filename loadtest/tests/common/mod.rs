//! Test fixtures: start the real binaries on free loopback ports under either monoio driver, and a tiny blocking HTTP client.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use smg_loadtest::wire::ChunkedDecoder;

/// Both drivers: io_uring (when the kernel allows) and epoll.
pub const DRIVERS: [bool; 2] = [false, true];

// The gateway's own patience factor and signal wait, shared by path (another crate).
#[path = "../../../tests/support/patience.rs"]
mod patience;
#[allow(unused_imports)] // not every test binary waits
pub use patience::{patience, wait_until};

pub fn driver_env(cmd: &mut Command, legacy: bool) {
    if legacy {
        cmd.env("MONOIO_FORCE_LEGACY_DRIVER", "1");
    } else {
        cmd.env_remove("MONOIO_FORCE_LEGACY_DRIVER");
    }
}

/// A loopback port nothing listens on, for tests of an unreachable peer. A port picked with
/// bind(0) and closed is no such port: another test's simulator may be given it next. Port 1
/// sits below the ephemeral range, where the kernel's picks for port 0 never fall.
pub fn refused_port() -> u16 {
    const PORT: u16 = 1;
    assert!(TcpStream::connect(("127.0.0.1", PORT)).is_err(), "something listens on 127.0.0.1:{PORT}");
    PORT
}

/// Starts a child process on a port picked here, again on another port while `start` says the
/// child exited at start (None). The port is free when picked, but until the child binds it a
/// simulator binding port 0, or a loopback connection's ephemeral port, may take it.
pub fn on_a_free_port<T>(what: &str, mut start: impl FnMut(u16) -> Option<T>) -> T {
    for _ in 0..5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if let Some(started) = start(port) {
            return started;
        }
    }
    panic!("{what} exited at start on 5 ports in a row");
}

/// A running smg-sim, killed on drop.
pub struct Sim {
    pub child: Child,
    pub ports: Vec<u16>,
    /// The `listening` lines, one per worker, in port order.
    pub lines: Vec<String>,
    /// The CONNECT proxy's port (`--connect-proxy-port`), from its `proxy` line.
    pub proxy: Option<u16>,
}

impl Sim {
    pub fn start(args: &[&str], legacy: bool) -> Sim {
        Self::try_start(args, legacy).unwrap_or_else(|| panic!("smg-sim did not start with {args:?}"))
    }

    /// [`Sim::start`], or None when the simulator exits before it is ready (a port it was
    /// told to bind was taken meanwhile).
    pub fn try_start(args: &[&str], legacy: bool) -> Option<Sim> {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_smg-sim"));
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::inherit());
        driver_env(&mut cmd, legacy);
        let mut child = cmd.spawn().expect("spawn smg-sim");
        let stdout = child.stdout.take().unwrap();
        let mut ports = Vec::new();
        let mut lines = Vec::new();
        let mut proxy = None;
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(rest) = line.strip_prefix("listening ") {
                let addr = rest.split_whitespace().next().unwrap();
                ports.push(addr.rsplit(':').next().unwrap().parse().unwrap());
                lines.push(line.clone());
            } else if let Some(addr) = line.strip_prefix("proxy ") {
                proxy = addr.rsplit(':').next().and_then(|p| p.parse().ok());
            } else if line.starts_with("ready") {
                break;
            }
        }
        if ports.is_empty() {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        Some(Sim { child, ports, lines, proxy })
    }

    pub fn port(&self) -> u16 {
        self.ports[0]
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A parsed response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> sonic_rs::Value {
        sonic_rs::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }
}

pub fn request_bytes(method: &str, path: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Parses one complete response out of `raw` (Content-Length, chunked, or until close).
pub fn parse_response(raw: &[u8]) -> Resp {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("no head") + 4;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let status = head[9..12].parse().unwrap();
    let lower = head.to_ascii_lowercase();
    let rest = &raw[end..];
    let body = if lower.contains("transfer-encoding: chunked") {
        let mut out = Vec::new();
        let mut dec = ChunkedDecoder::new();
        dec.decode(rest, |d| out.extend_from_slice(d)).unwrap();
        out
    } else if let Some(i) = lower.find("content-length: ") {
        let n: usize = lower[i + 16..].split("\r\n").next().unwrap().trim().parse().unwrap();
        rest[..n.min(rest.len())].to_vec()
    } else {
        rest.to_vec()
    };
    Resp { status, head, body }
}

/// One request on a fresh connection (Connection: close), read to EOF.
pub fn http(port: u16, method: &str, path: &str, body: &str) -> Resp {
    http_within(port, method, path, body, Duration::from_secs(10))
}

/// [`http`] with its own bound (scaled by the patience factor): a real model's generation on a
/// host a CI run shares takes longer than the simulator's answers.
pub fn http_within(port: u16, method: &str, path: &str, body: &str, within: Duration) -> Resp {
    let raw = http_raw(port, &request_bytes(method, path, body), patience(within)).expect("request failed");
    parse_response(&raw)
}

/// Writes `req` and reads until EOF or `timeout`; Err on timeout or connect failure.
pub fn http_raw(port: u16, req: &[u8], timeout: Duration) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(req)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    Ok(out)
}

/// Sends a request and returns the instants at which each content token arrived.
pub fn token_times(port: u16, path: &str, body: &str) -> (Instant, Vec<Instant>, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let start = Instant::now();
    s.write_all(&request_bytes("POST", path, body)).unwrap();
    let mut all = Vec::new();
    let mut times = Vec::new();
    let mut buf = [0u8; 65536];
    let needle = b"\"content\":\" hi\"";
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        let before = count(&all, needle);
        all.extend_from_slice(&buf[..n]);
        let after = count(&all, needle);
        let now = Instant::now();
        for _ in before..after {
            times.push(now);
        }
    }
    (start, times, all)
}

pub fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

pub fn chat_body(extra: &str) -> String {
    format!(r#"{{"model":"sim-model","messages":[{{"role":"user","content":"hello"}}]{extra}}}"#)
}

/// Runs smg-load with `args` and returns its parsed JSON report (or the compare rows).
pub fn smg_load(args: &[&str], legacy: bool) -> sonic_rs::Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_smg-load"));
    cmd.args(args).stderr(Stdio::inherit());
    driver_env(&mut cmd, legacy);
    let out = cmd.output().expect("run smg-load");
    assert!(out.status.success(), "smg-load {args:?} failed: {}", String::from_utf8_lossy(&out.stdout));
    sonic_rs::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// The gateway binary for tests that run it: `$SMG_BIN`, else `smg` in this test's own target
/// profile directory (present after `cargo build --bin smg`); None when neither exists. The
/// gateway is another package, so Cargo gives no `CARGO_BIN_EXE_smg`.
pub fn gateway_bin() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("SMG_BIN").map(std::path::PathBuf::from) {
        return p.is_file().then_some(p);
    }
    // target/<profile>/deps/<test>-<hash> → target/<profile>/smg
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("smg");
    p.is_file().then_some(p)
}
