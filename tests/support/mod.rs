//! Test fixtures: the real `smg` binary on loopback, a scriptable fake worker, and a raw
//! HTTP/1.1 client. Every test builds its own world on ephemeral ports.
// clippy.toml's house rules are the gateway's: a test's threads are not shards and may block and lock.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]
#![allow(dead_code)]
pub mod admit;
pub mod gossip;
pub mod pd;
pub mod postgres_server;
pub mod redis_server;
pub mod responses;
pub mod rogue;
pub mod sim;
pub mod ws;

use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sonic_rs::JsonValueTrait;

// === Patience ===

pub mod patience;
pub use patience::{patience, wait_until};

/// Ports this process has handed out or listens on.
static HANDED: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// Records `port` as taken in this process; false if it already was.
pub fn claim(port: u16) -> bool {
    let mut handed = HANDED.lock().unwrap();
    let new = !handed.contains(&port);
    if new {
        handed.push(port);
    }
    new
}

/// A port free now and never handed out before in this process, for a child process to bind
/// (a gateway, redis-server, prometheus): the kernel may give a just-closed ephemeral port to
/// the next bind, and two gateways of one test binary (one's main port, another's metrics
/// port) once got the same one. A listener of this process takes [`local_listener`] instead.
pub fn free_port() -> u16 {
    loop {
        let p = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if claim(p) {
            return p;
        }
    }
}

/// A listener of this test process on the kernel's pick of port, never one [`free_port`]
/// handed out. A handed port is free until its child process binds it, and the kernel may
/// pick it meanwhile: a fake worker once took a port just handed to a simulated worker, whose
/// bind then failed, and the test talked to the fake instead.
pub fn local_listener() -> TcpListener {
    let mut refused = Vec::new();
    loop {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        if claim(l.local_addr().unwrap().port()) {
            return l;
        }
        // Held until a good one is found, so the kernel does not pick it again.
        refused.push(l);
    }
}

/// Runs `f` once per monoio driver: io_uring (where the kernel allows) and epoll.
pub fn both_drivers(f: impl Fn(bool)) {
    for legacy in [false, true] {
        f(legacy);
    }
}

// === Gateway ===

/// `smg launch --host 127.0.0.1 --port <free port> ARGS` under one driver, without the
/// environment variables tests set on purpose (`CONTROL_PLANE_API_KEYS`).
pub fn launch_command(legacy: bool, args: &[&str]) -> (Command, u16) {
    launch_command_at(legacy, free_port(), args)
}

/// [`launch_command`] on a port chosen beforehand (a test that points something at the
/// gateway before it starts).
pub fn launch_command_at(legacy: bool, port: u16, args: &[&str]) -> (Command, u16) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_smg"));
    cmd.arg("launch").args(["--host", "127.0.0.1", "--port", &port.to_string()]).args(args);
    cmd.env_remove("CONTROL_PLANE_API_KEYS");
    if legacy {
        cmd.env("MONOIO_FORCE_LEGACY_DRIVER", "1");
    } else {
        cmd.env_remove("MONOIO_FORCE_LEGACY_DRIVER");
    }
    (cmd, port)
}

pub struct Gateway {
    pub port: u16,
    pub child: Child,
    pub log: std::path::PathBuf,
}

impl Gateway {
    /// Starts `smg launch` with `args` (plus --host/--port) and waits for /liveness.
    pub fn start(legacy: bool, args: &[&str]) -> Gateway {
        Self::start_with(legacy, args, None)
    }

    /// [`Gateway::start`] with the descriptor limit (soft and hard) set to `nofile`. A gateway
    /// that exits at start (a bad flag) fails the test at once with its stderr; one that exits
    /// because it cannot listen is started again on another port. Its port is free when handed
    /// out, but a loopback connection's ephemeral port, or a listener of this process bound to
    /// port 0 without SO_REUSEPORT, may take it before the gateway binds it.
    pub fn start_with(legacy: bool, args: &[&str], nofile: Option<u64>) -> Gateway {
        for _ in 0..5 {
            let (mut cmd, port) = launch_command(legacy, args);
            if let Some(n) = nofile {
                use std::os::unix::process::CommandExt;
                // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
                unsafe {
                    cmd.pre_exec(move || {
                        let lim = libc::rlimit { rlim_cur: n as libc::rlim_t, rlim_max: n as libc::rlim_t };
                        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
            if let Some(gw) = Self::try_spawn(cmd, port, &format!("{args:?}")) {
                return gw;
            }
        }
        panic!("gateway {args:?} found no free port in 5 tries");
    }

    /// Spawns a launch command and waits for /liveness; a gateway that exits first fails the
    /// test at once with its stderr.
    pub fn spawn(cmd: Command, port: u16, what: &str) -> Gateway {
        Self::try_spawn(cmd, port, what).unwrap_or_else(|| panic!("gateway {what}: port {port} was taken"))
    }

    /// [`Gateway::spawn`], or None when the gateway exits because it cannot listen on `port`.
    fn try_spawn(mut cmd: Command, port: u16, what: &str) -> Option<Gateway> {
        let log = std::env::temp_dir().join(format!("smg-test-{}-{port}.log", std::process::id()));
        let child = cmd.stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap()).spawn().unwrap();
        let mut gw = Gateway { port, child, log };
        let until = Instant::now() + patience(Duration::from_secs(20));
        loop {
            if let Some(status) = gw.child.try_wait().unwrap() {
                let log = gw.log_text();
                if log.contains(&format!("cannot listen on 127.0.0.1:{port}")) {
                    return None;
                }
                panic!("gateway {what} exited at start ({status}):\n{log}");
            }
            if try_get(port, "/liveness").is_ok_and(|r| r.status == 200) {
                return Some(gw);
            }
            assert!(Instant::now() < until, "gateway never answered /liveness; log:\n{}", gw.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn wait_status(&self, path: &str, want: u16) {
        let until = Instant::now() + patience(Duration::from_secs(20));
        loop {
            if let Ok(r) = try_get(self.port, path) {
                if r.status == want {
                    return;
                }
            }
            assert!(Instant::now() < until, "gateway never answered {want} on {path}; log:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn ready(&self) {
        self.wait_status("/readiness", 200);
    }

    /// Waits until `n` workers are routable. Readiness needs only one, and a request for a
    /// model whose worker has not answered its probe yet is a 404.
    pub fn ready_workers(&self, n: usize) {
        let until = Instant::now() + patience(Duration::from_secs(20));
        let want = format!("\"healthy_workers\":{n}");
        while !try_get(self.port, "/readiness").map(|r| r.text().contains(&want)).unwrap_or(false) {
            if Instant::now() >= until {
                // What the control thread thinks of each worker, for the failure's reader.
                let workers = try_get(self.port, "/workers").map(|r| r.text()).unwrap_or_default();
                panic!("{n} workers never came up; GET /workers: {workers}\nlog:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (bounded) for `needle` in the log: one thread writes it, after the fact.
    pub fn log_has(&self, needle: &str) -> bool {
        wait_until(patience(Duration::from_secs(5)), || self.log_text().contains(needle))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Open file descriptors of the gateway process (sockets included).
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).map(|d| d.count()).unwrap_or(0)
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.pid() as i32, sig) };
    }

    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(patience(Duration::from_secs(10)))).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

// === Fake worker ===

#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub conn: usize,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
pub struct WorkerState {
    pub accepted: AtomicUsize,
    pub requests: Mutex<Vec<Recorded>>,
    /// When each connection saw the gateway close it (EOF or error on read/write).
    pub closed_at: Mutex<Vec<Instant>>,
    pub healthy: AtomicBool,
    /// When each streamed response finished writing its last event.
    pub stream_done_at: Mutex<Vec<Instant>>,
    pub stop: AtomicBool,
    /// Requests being answered right now (probes excluded), see [`Flight`].
    pub in_flight: AtomicUsize,
    /// The most `in_flight` has been since the worker started or [`WorkerState::reset_max_in_flight`].
    pub max_in_flight: AtomicUsize,
    /// `max_running_requests` on `/get_server_info` (0: that route answers 404).
    pub max_running: AtomicUsize,
    /// `GET /health` requests answered (the gateway's health checks).
    pub health_checks: AtomicUsize,
    /// `owned_by` on `/v1/models` (None: "sglang"); set before the gateway discovers it.
    pub owned_by: Mutex<Option<String>>,
}

impl WorkerState {
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    /// Starts a new watermark from what is in flight now.
    pub fn reset_max_in_flight(&self) {
        self.max_in_flight.store(self.in_flight(), Ordering::SeqCst);
    }
}

/// One request in flight at the worker: counted from the moment its body has been read
/// until just before the write that completes its response (or until the worker gives up on
/// it). Leaving before that last write, not after it, keeps the count a lower bound of the
/// gateway's own: a gateway that frees a slot once it has relayed the end of a response and
/// sends the next request at once must not be seen with one request too many.
struct Flight<'a> {
    st: &'a WorkerState,
    left: Cell<bool>,
}

impl<'a> Flight<'a> {
    fn enter(st: &'a WorkerState) -> Self {
        let now = st.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        st.max_in_flight.fetch_max(now, Ordering::SeqCst);
        Flight { st, left: Cell::new(false) }
    }

    fn leave(&self) {
        if !self.left.replace(true) {
            self.st.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

pub struct FakeWorker {
    pub port: u16,
    pub model: String,
    pub state: Arc<WorkerState>,
}

impl FakeWorker {
    /// A worker that serves `model`. Behaviour per request comes from the body's `fake`
    /// field: "echo" (default), "sse" (`events`, `gap_ms`), "die" (SSE cut after `events`
    /// without the terminating chunk), "stall" (never answers), "error" (JSON `status`),
    /// "close" (answer, then close the connection without saying so), "hang" (never
    /// answers, and lets go as soon as the gateway closes the connection, at most 30 s).
    pub fn start(model: &str) -> FakeWorker {
        Self::start_reporting(model, 0)
    }

    /// Like [`FakeWorker::start`], with `max_running_requests: max_running` on
    /// `/get_server_info` (what discovery reads for the priority scheduler's capacity).
    pub fn start_reporting(model: &str, max_running: usize) -> FakeWorker {
        let listener = local_listener();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(WorkerState::default());
        state.max_running.store(max_running, Ordering::SeqCst);
        state.healthy.store(true, Ordering::SeqCst);
        let (st, m) = (Arc::clone(&state), model.to_string());
        std::thread::spawn(move || {
            for (n, s) in listener.incoming().enumerate() {
                if st.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(s) = s else { continue };
                st.accepted.fetch_add(1, Ordering::SeqCst);
                let (st, m) = (Arc::clone(&st), m.clone());
                // sonic-rs reads a body at the gateway's depth limit by recursion: a debug
                // build needs more than the default 2 MiB for it (src/bounded_json.rs).
                let thread = std::thread::Builder::new().stack_size(16 << 20);
                thread.spawn(move || serve(s, n, &st, &m)).unwrap();
            }
        });
        FakeWorker { port, model: model.to_string(), state }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Stops accepting (the listener closes after its next accept).
    pub fn stop(&self) {
        self.state.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(mut s: TcpStream, conn: usize, st: &WorkerState, model: &str) {
    let _ = s.set_nodelay(true);
    let mut buf = Vec::new();
    loop {
        let (path, headers, body, head_len) = loop {
            if let Some(parsed) = parse_req(&buf) {
                break parsed;
            }
            let mut tmp = [0u8; 65536];
            match s.read(&mut tmp) {
                Ok(0) | Err(_) => {
                    st.closed_at.lock().unwrap().push(Instant::now());
                    return;
                }
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        };
        buf.drain(..head_len + body.len());
        let rec = Recorded { path: path.clone(), headers, body: body.clone(), conn };
        let keep = match path.as_str() {
            "/health" => {
                st.health_checks.fetch_add(1, Ordering::SeqCst);
                let code = if st.healthy.load(Ordering::SeqCst) { 200 } else { 503 };
                reply(&mut s, code, "text/plain", b"ok", &[])
            }
            "/get_server_info" if st.max_running.load(Ordering::SeqCst) > 0 => {
                let b = format!(r#"{{"max_running_requests":{}}}"#, st.max_running.load(Ordering::SeqCst));
                reply(&mut s, 200, "application/json", b.as_bytes(), &[])
            }
            // Discovery and the load monitor ask these; this worker has none of them.
            "/server_info" | "/get_server_info" | "/version" | "/v1/loads" => {
                reply(&mut s, 404, "text/plain", b"not found", &[])
            }
            "/v1/models" => {
                let owner = st.owned_by.lock().unwrap().clone().unwrap_or_else(|| "sglang".into());
                let b =
                    format!(r#"{{"object":"list","data":[{{"id":"{model}","object":"model","owned_by":"{owner}"}}]}}"#);
                reply(&mut s, 200, "application/json", b.as_bytes(), &[])
            }
            _ => {
                let flight = Flight::enter(st);
                st.requests.lock().unwrap().push(rec);
                inference(&mut s, &body, st, &flight)
            }
        };
        if !keep {
            st.closed_at.lock().unwrap().push(Instant::now());
            return;
        }
    }
}

/// Path, headers, body and head length of one complete request.
type ParsedRequest = (String, Vec<(String, String)>, Vec<u8>, usize);

fn parse_req(buf: &[u8]) -> Option<ParsedRequest> {
    let mut h = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Request::new(&mut h);
    let n = match r.parse(buf).ok()? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return None,
    };
    let headers: Vec<(String, String)> =
        r.headers.iter().map(|h| (h.name.to_string(), String::from_utf8_lossy(h.value).into_owned())).collect();
    let len = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse::<usize>().unwrap())
        .unwrap_or(0);
    if buf.len() < n + len {
        return None;
    }
    Some((r.path.unwrap().to_string(), headers, buf[n..n + len].to_vec(), n))
}

fn reply(s: &mut TcpStream, code: u16, ct: &str, body: &[u8], extra: &[(&str, &str)]) -> bool {
    let mut out = format!("HTTP/1.1 {code} X\r\nContent-Type: {ct}\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in extra {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    s.write_all(&bytes).is_ok()
}

fn inference(s: &mut TcpStream, body: &[u8], st: &WorkerState, flight: &Flight) -> bool {
    let v: sonic_rs::Value = sonic_rs::from_slice(body).unwrap_or_default();
    let mode = v["fake"].as_str().unwrap_or("echo").to_string();
    let events = v["events"].as_u64().unwrap_or(3) as usize;
    let gap = Duration::from_millis(v["gap_ms"].as_u64().unwrap_or(10));
    let sha = sha_hex(body);
    match mode.as_str() {
        "stall" => {
            std::thread::sleep(Duration::from_secs(30));
            false
        }
        "hang" => {
            let until = Instant::now() + Duration::from_secs(30);
            while Instant::now() < until && !peer_closed_during(s, Duration::from_millis(50)) {}
            false
        }
        "error" => {
            let status = v["status"].as_u64().unwrap_or(400) as u16;
            flight.leave();
            reply(
                s,
                status,
                "application/json",
                br#"{"error":{"message":"bad","type":"BadRequestError","code":400}}"#,
                &[],
            )
        }
        "close" => {
            flight.leave();
            reply(s, 200, "application/json", format!(r#"{{"sha":"{sha}"}}"#).as_bytes(), &[]);
            false
        }
        // A body of `bytes` bytes, declared (Content-Length) or chunked in 8 KB chunks.
        "big" => {
            flight.leave();
            let n = v["bytes"].as_u64().unwrap_or(1 << 20) as usize;
            let chunk = vec![b'x'; 8192];
            if v["chunked"].as_bool() == Some(true) {
                let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
                let mut ok = s.write_all(head.as_bytes()).is_ok();
                let mut left = n;
                while ok && left > 0 {
                    let k = left.min(chunk.len());
                    ok = s.write_all(format!("{k:x}\r\n").as_bytes()).is_ok()
                        && s.write_all(&chunk[..k]).is_ok()
                        && s.write_all(b"\r\n").is_ok();
                    left -= k;
                }
                ok && s.write_all(b"0\r\n\r\n").is_ok()
            } else {
                let head = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n\r\n");
                let mut ok = s.write_all(head.as_bytes()).is_ok();
                let mut left = n;
                while ok && left > 0 {
                    let k = left.min(chunk.len());
                    ok = s.write_all(&chunk[..k]).is_ok();
                    left -= k;
                }
                ok
            }
        }
        "sse" | "die" => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nX-SMG-Error-Code: worker-said\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n";
            if s.write_all(head.as_bytes()).is_err() {
                return false;
            }
            for i in 0..events {
                let ev = format!("data: {{\"i\":{i}}}\n\n");
                if s.write_all(format!("{:x}\r\n{ev}\r\n", ev.len()).as_bytes()).is_err() {
                    return false;
                }
                // Wait for the gap while watching for the gateway closing on us, so the
                // close is stamped when it happens, not at the next write.
                if peer_closed_during(s, gap) {
                    return false;
                }
            }
            if mode == "die" {
                return false;
            }
            let done = "data: [DONE]\n\n";
            // Stamped before the last write: a client that has the whole response must find
            // the stamp already there.
            st.stream_done_at.lock().unwrap().push(Instant::now());
            flight.leave();
            s.write_all(format!("{:x}\r\n{done}\r\n0\r\n\r\n", done.len()).as_bytes()).is_ok()
        }
        _ => {
            flight.leave();
            reply(
                s,
                200,
                "application/json",
                format!(r#"{{"sha":"{sha}","len":{}}}"#, body.len()).as_bytes(),
                &[
                    ("X-SMG-Error-Code", "worker-said"),
                    ("X-Worker", "1"),
                    ("Connection", "keep-alive"),
                    ("Keep-Alive", "timeout=5"),
                ],
            )
        }
    }
}

fn peer_closed_during(s: &mut TcpStream, gap: Duration) -> bool {
    let until = Instant::now() + gap;
    let mut byte = [0u8; 1];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let _ = s.set_read_timeout(None);
            return false;
        }
        let _ = s.set_read_timeout(Some(left));
        match s.peek(&mut byte) {
            Ok(0) => return true,
            Ok(_) => std::thread::sleep(left.min(Duration::from_millis(5))),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return true,
        }
    }
}

pub fn sha_hex(b: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

// === Raw client ===

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Chunked body ended with its zero-size chunk.
    pub complete: bool,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> sonic_rs::Value {
        sonic_rs::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Reads one response from `s`, with `rest` holding bytes already read past earlier ones.
pub fn read_response(s: &mut TcpStream, rest: &mut Vec<u8>, head_only: bool) -> std::io::Result<Response> {
    let (status, headers, n) = loop {
        let mut h = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut h);
        if let Ok(httparse::Status::Complete(n)) = r.parse(rest) {
            let headers: Vec<(String, String)> = r
                .headers
                .iter()
                .map(|h| (h.name.to_ascii_lowercase(), String::from_utf8_lossy(h.value).into_owned()))
                .collect();
            break (r.code.unwrap(), headers, n);
        }
        fill(s, rest)?;
    };
    rest.drain(..n);
    let get = |k: &str| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    if status == 100 {
        return read_response(s, rest, head_only);
    }
    let mut body = Vec::new();
    let mut complete = true;
    #[allow(unused_assignments)]
    if head_only || status == 204 || status == 304 {
    } else if get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        complete = false;
        loop {
            let line_end = loop {
                if let Some(p) = rest.windows(2).position(|w| w == b"\r\n") {
                    break p;
                }
                if fill(s, rest).is_err() {
                    return Ok(Response { status, headers, body, complete: false });
                }
            };
            let size = usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap().trim(), 16).unwrap();
            rest.drain(..line_end + 2);
            while rest.len() < size + 2 {
                if fill(s, rest).is_err() {
                    body.extend_from_slice(rest);
                    return Ok(Response { status, headers, body, complete: false });
                }
            }
            body.extend_from_slice(&rest[..size]);
            rest.drain(..size + 2);
            if size == 0 {
                complete = true;
                break;
            }
        }
    } else if let Some(len) = get("content-length") {
        let len: usize = len.parse().unwrap();
        while rest.len() < len {
            fill(s, rest)?;
        }
        body = rest.drain(..len).collect();
    } else {
        while fill(s, rest).is_ok() {}
        body = std::mem::take(rest);
    }
    Ok(Response { status, headers, body, complete })
}

pub fn fill(s: &mut TcpStream, rest: &mut Vec<u8>) -> std::io::Result<()> {
    let mut tmp = [0u8; 65536];
    // A read with a timeout fails with EINTR when this process is stopped and continued (or
    // a handler runs), as std's read_exact knows: read again.
    let n = loop {
        match s.read(&mut tmp) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => break r?,
        }
    };
    if n == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    rest.extend_from_slice(&tmp[..n]);
    Ok(())
}

pub fn try_get(port: u16, path: &str) -> std::io::Result<Response> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(patience(Duration::from_secs(5))))?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())?;
    read_response(&mut s, &mut Vec::new(), false)
}

pub fn get(port: u16, path: &str) -> Response {
    try_get(port, path).unwrap()
}

/// The value of `series` (a metric's name with its labels, as exposed, e.g.
/// `smg_scheduler_inflight{class="bulk"}`) on the metrics listener at `port`; None when the
/// scrape fails or has no such series.
pub fn metric(port: u16, series: &str) -> Option<f64> {
    let text = try_get(port, "/metrics").ok()?.text();
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// POSTs JSON on a fresh connection with extra header lines ("Name: value").
pub fn post(port: u16, path: &str, body: &str, headers: &[&str]) -> Response {
    post_within(port, path, body, headers, Duration::from_secs(15))
}

/// [`post`] for a request whose answer costs the gateway more than most (a megabyte prompt
/// tokenized by a debug build): silence up to `quiet` (times the patience factor) is allowed.
pub fn post_within(port: u16, path: &str, body: &str, headers: &[&str], quiet: Duration) -> Response {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(patience(quiet))).unwrap();
    s.write_all(post_bytes(path, body, headers).as_bytes()).unwrap();
    read_response(&mut s, &mut Vec::new(), false).unwrap()
}

pub fn post_bytes(path: &str, body: &str, headers: &[&str]) -> String {
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    req.push_str(body);
    req
}

/// True when the peer closed `s` (read returns EOF or reset) within `within`.
pub fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(patience(within))).unwrap();
    let mut tmp = [0u8; 4096];
    loop {
        match s.read(&mut tmp) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                return false
            }
            Err(_) => return true,
        }
    }
}
