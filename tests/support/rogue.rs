//! A misbehaving worker on a raw std socket, plus the few helpers the hardening tests need
//! around it (a gateway launcher that can lower RLIMIT_NOFILE and reports a start failure at
//! once, bounded polling, patience scaling, RSS).
//!
//! The worker is healthy as far as the gateway's probes go (`GET /health` 200, `GET
//! /v1/models` naming its model, Content-Length framed, keep-alive); its POST answers
//! misbehave in the way its [`Mode`] says. A POST body may carry `"tag"` (echoed back so a
//! client can tell its own answer from another's), `"stream"` (EndlessStream only streams
//! when it is true), `"delay_ms"` (Restartable waits that long before answering) and
//! `"fault"` (PerRequest: which misbehaviour this one answer has).
//!
//! Every wait in here and in the tests is scaled by [`patience`]: `SMG_TEST_PATIENCE_MS`
//! is how long a nominal second lasts (default 1000), so `SMG_TEST_PATIENCE_MS=3000` makes
//! every bound three times as lenient on a slow machine.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sonic_rs::JsonValueTrait;

use super::{patience, read_response, wait_until, Response};

/// How the worker answers POSTs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A correct Content-Length answer naming the request's tag, then at once, in the same
    /// write, a complete second response `{"tag":"STRAY"}` nobody asked for.
    StrayBytes,
    /// Like StrayBytes, but the stray response is written ~50 ms after the real one.
    StrayBytesLate,
    /// A chunked SSE stream with `Connection: keep-alive`, then the socket is closed right
    /// after the final `0\r\n\r\n` (what llama.cpp does).
    CloseAfterStream,
    /// A chunked SSE head and one event, then silence for 30 s without closing.
    StallAfterHead,
    /// A head that says chunked, then the size line `zz`.
    BadFirstChunk,
    /// A well-behaved keep-alive echo worker whose connections [`RogueWorker::restart`] kills.
    Restartable,
    /// 16 KB SSE events as fast as the socket takes them, until a write fails.
    EndlessStream,
    /// Answers with this status line (`HTTP/1.1 <code> <phrase>`; the phrase may be empty).
    Status(u16, &'static str),
    /// Answers with a status line that ends at its code (`HTTP/1.1 <code>`, no space, no
    /// phrase), which RFC 9112 §4 readers should accept.
    BareStatus(u16),
    /// The POST body's `"fault"` field picks the misbehaviour of each answer, so one worker
    /// (and one pooled connection) can go through many of them in a row. See [`FAULTS`].
    PerRequest,
}

/// The `"fault"` values [`Mode::PerRequest`] knows (anything else answers like `ok`):
///
/// - `ok`: a correct keep-alive Content-Length answer `{"tag":…}`.
/// - `ok_stream`: a correct keep-alive chunked SSE stream of three events and `[DONE]`.
/// - `stray`, `stray_late`, `close_after_stream`, `stall`, `bad_chunk`: as
///   [`Mode::StrayBytes`], [`Mode::StrayBytesLate`], [`Mode::CloseAfterStream`],
///   [`Mode::StallAfterHead`] and [`Mode::BadFirstChunk`].
/// - `dup`: the correct answer twice, in one write.
/// - `short_length`: Content-Length covers `{"tag":…}`, but more body bytes follow it in
///   the same write.
/// - `close_after_reply`: the correct keep-alive answer, then the socket is closed without
///   a word.
/// - `close_silent`: the request is read and the socket closed, with no byte of answer.
/// - `die_mid_stream`: a chunked SSE head and two events, then the socket is closed.
/// - `said_close`: the correct answer with `Connection: close`, but the worker leaves the
///   socket open (and would answer on it) until the gateway closes it.
/// - `close_delimited`: a head without Content-Length or chunking, the body, then the close.
pub const FAULTS: [&str; 14] = [
    "ok",
    "ok_stream",
    "stray",
    "stray_late",
    "dup",
    "short_length",
    "close_after_stream",
    "close_after_reply",
    "close_silent",
    "die_mid_stream",
    "bad_chunk",
    "stall",
    "said_close",
    "close_delimited",
];

#[derive(Default)]
pub struct RogueState {
    /// Every accepted connection (probes included).
    pub accepted: AtomicUsize,
    /// POST requests read.
    pub posts: AtomicUsize,
    /// Connections that carried at least one POST (the gateway's proxy connections).
    pub post_conns: AtomicUsize,
    /// When a POST-carrying connection ended because of the other side: EOF or an error on
    /// read or write (for EndlessStream: the write error that stopped the stream).
    pub closed_at: Mutex<Vec<Instant>>,
    /// POST-carrying connections the worker closed itself (CloseAfterStream, give-ups).
    pub self_closed: AtomicUsize,
    /// POSTs that arrived on a connection after the worker had written bytes past the end of
    /// an answer on it (stray, duplicated or beyond Content-Length) or answered on it with
    /// `Connection: close`: the gateway reused a connection it should have known was not
    /// reusable. One line per such POST.
    pub dirty_reuse: Mutex<Vec<String>>,
    /// Late stray answers written (or tried: the gateway may have closed the socket).
    pub late_strays: AtomicUsize,
    /// Serving threads still running.
    live: AtomicUsize,
    /// A clone of every open connection, so they can be killed from outside.
    conns: Mutex<Vec<(usize, TcpStream)>>,
    stop: AtomicBool,
    generation: AtomicUsize,
}

impl RogueState {
    pub fn peer_closes(&self) -> usize {
        self.closed_at.lock().unwrap().len()
    }
}

pub struct RogueWorker {
    pub port: u16,
    pub model: String,
    pub mode: Mode,
    pub state: Arc<RogueState>,
    acceptor: Mutex<Option<JoinHandle<()>>>,
}

impl RogueWorker {
    pub fn start(model: &str, mode: Mode) -> RogueWorker {
        let listener = super::local_listener();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(RogueState::default());
        let h = spawn_acceptor(listener, Arc::clone(&state), mode, model.to_string(), 0);
        RogueWorker { port, model: model.to_string(), mode, state, acceptor: Mutex::new(Some(h)) }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Kills every open connection (the gateway's pooled ones included) and the listener,
    /// then listens again on the same port: a worker process restart, as the gateway sees it.
    pub fn restart(&self) {
        let gen = self.state.generation.fetch_add(1, Ordering::SeqCst) + 1;
        // Wake the acceptor so it sees the new generation and drops the old listener.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(h) = self.acceptor.lock().unwrap().take() {
            let _ = h.join();
        }
        self.kill_connections();
        wait_until(patience(Duration::from_secs(3)), || self.state.live.load(Ordering::SeqCst) == 0);
        let until = Instant::now() + patience(Duration::from_secs(3));
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", self.port)) {
                Ok(l) => break l,
                Err(e) => {
                    assert!(Instant::now() < until, "rogue worker could not re-bind port {}: {e}", self.port);
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        };
        let h = spawn_acceptor(listener, Arc::clone(&self.state), self.mode, self.model.clone(), gen);
        *self.acceptor.lock().unwrap() = Some(h);
    }

    fn kill_connections(&self) {
        let conns: Vec<(usize, TcpStream)> = std::mem::take(&mut *self.state.conns.lock().unwrap());
        for (_, s) in conns {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for RogueWorker {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        self.kill_connections();
    }
}

fn spawn_acceptor(listener: TcpListener, st: Arc<RogueState>, mode: Mode, model: String, gen: usize) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut next_id = 0usize;
        for s in listener.incoming() {
            if st.stop.load(Ordering::SeqCst) || st.generation.load(Ordering::SeqCst) != gen {
                return;
            }
            let Ok(s) = s else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            st.accepted.fetch_add(1, Ordering::SeqCst);
            next_id += 1;
            let id = gen << 32 | next_id;
            if let Ok(c) = s.try_clone() {
                st.conns.lock().unwrap().push((id, c));
            }
            st.live.fetch_add(1, Ordering::SeqCst);
            let (st, model) = (Arc::clone(&st), model.clone());
            std::thread::spawn(move || {
                serve(s, id, &st, mode, &model);
                st.conns.lock().unwrap().retain(|(i, _)| *i != id);
                st.live.fetch_sub(1, Ordering::SeqCst);
            });
        }
    })
}

struct Req {
    method: String,
    path: String,
    close: bool,
    body: Vec<u8>,
}

fn parse(buf: &[u8]) -> Option<(Req, usize)> {
    let mut h = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Request::new(&mut h);
    let n = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return None,
    };
    let mut len = 0usize;
    let mut close = false;
    for h in r.headers.iter() {
        let v = String::from_utf8_lossy(h.value);
        if h.name.eq_ignore_ascii_case("content-length") {
            len = v.trim().parse().unwrap_or(0);
        } else if h.name.eq_ignore_ascii_case("connection") {
            close = v.to_ascii_lowercase().contains("close");
        }
    }
    if buf.len() < n + len {
        return None;
    }
    let req = Req {
        method: r.method.unwrap_or("").to_string(),
        path: r.path.unwrap_or("").to_string(),
        close,
        body: buf[n..n + len].to_vec(),
    };
    Some((req, n + len))
}

/// How one answer left the connection.
enum Next {
    Keep,
    /// The gateway closed, or a read or write failed.
    PeerGone,
    /// The worker closes the connection itself.
    SelfClose,
}

fn serve(mut s: TcpStream, id: usize, st: &RogueState, mode: Mode, model: &str) {
    let _ = s.set_nodelay(true);
    let mut buf = Vec::new();
    let mut carried_post = false;
    // Set once this connection carries bytes that belong to no request.
    let mut dirty: Option<&'static str> = None;
    let end = 'conn: loop {
        let (req, used) = loop {
            if let Some(p) = parse(&buf) {
                break p;
            }
            let mut tmp = [0u8; 65536];
            match s.read(&mut tmp) {
                Ok(0) | Err(_) => break 'conn Next::PeerGone,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
            if st.stop.load(Ordering::SeqCst) {
                break 'conn Next::SelfClose;
            }
        };
        buf.drain(..used);
        let next = match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/health") => plain(&mut s, "200 OK", "text/plain", b"ok"),
            ("GET", "/v1/models") => {
                let b = format!(r#"{{"object":"list","data":[{{"id":"{model}","object":"model","owned_by":"x"}}]}}"#);
                plain(&mut s, "200 OK", "application/json", b.as_bytes())
            }
            ("POST", _) => {
                if !carried_post {
                    carried_post = true;
                    st.post_conns.fetch_add(1, Ordering::SeqCst);
                }
                st.posts.fetch_add(1, Ordering::SeqCst);
                if let Some(why) = dirty {
                    let line = format!("connection {id}: POST tag {} after {why}", tag_of(&req.body));
                    st.dirty_reuse.lock().unwrap().push(line);
                }
                answer_post(&mut s, id, st, mode, &req.body, &mut dirty)
            }
            _ => plain(&mut s, "404 Not Found", "text/plain", b"no"),
        };
        match next {
            Next::Keep if req.close => break Next::SelfClose,
            Next::Keep => {}
            other => break other,
        }
    };
    if carried_post {
        match end {
            Next::PeerGone => st.closed_at.lock().unwrap().push(Instant::now()),
            _ => {
                st.self_closed.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    // Dropping `s` closes this side; the clone kept for kill_connections is removed by the
    // caller right after.
}

fn plain(s: &mut TcpStream, status: &str, ct: &str, body: &[u8]) -> Next {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ct}\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    if s.write_all(&out).is_ok() {
        Next::Keep
    } else {
        Next::PeerGone
    }
}

fn tag_of(body: &[u8]) -> String {
    let v: sonic_rs::Value = sonic_rs::from_slice(body).unwrap_or_default();
    v["tag"].as_str().unwrap_or("none").to_string()
}

fn chunk(data: &str) -> String {
    format!("{:x}\r\n{data}\r\n", data.len())
}

const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n";

fn answer_post(
    s: &mut TcpStream,
    id: usize,
    st: &RogueState,
    mode: Mode,
    body: &[u8],
    dirty: &mut Option<&'static str>,
) -> Next {
    let tag = tag_of(body);
    let v: sonic_rs::Value = sonic_rs::from_slice(body).unwrap_or_default();
    let json = format!(r#"{{"tag":"{tag}"}}"#);
    let write = |s: &mut TcpStream, b: &[u8]| if s.write_all(b).is_ok() { Next::Keep } else { Next::PeerGone };
    match mode {
        Mode::StrayBytes | Mode::StrayBytesLate => {
            let real = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n{json}",
                json.len()
            );
            let stray_body = r#"{"tag":"STRAY"}"#;
            let stray = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{stray_body}",
                stray_body.len()
            );
            if mode == Mode::StrayBytes {
                *dirty = Some("a stray response in the same write");
                return write(s, format!("{real}{stray}").as_bytes());
            }
            if let Next::PeerGone = write(s, real.as_bytes()) {
                return Next::PeerGone;
            }
            std::thread::sleep(Duration::from_millis(50));
            *dirty = Some("a stray response written 50 ms late");
            let next = write(s, stray.as_bytes());
            st.late_strays.fetch_add(1, Ordering::SeqCst);
            next
        }
        Mode::CloseAfterStream => {
            if let Next::PeerGone = write(s, SSE_HEAD.as_bytes()) {
                return Next::PeerGone;
            }
            for i in 0..3 {
                let ev = format!("data: {{\"tag\":\"{tag}\",\"i\":{i}}}\n\n");
                if let Next::PeerGone = write(s, chunk(&ev).as_bytes()) {
                    return Next::PeerGone;
                }
            }
            let end = format!("{}0\r\n\r\n", chunk("data: [DONE]\n\n"));
            match write(s, end.as_bytes()) {
                Next::Keep => Next::SelfClose,
                other => other,
            }
        }
        Mode::StallAfterHead => {
            let first = format!("{SSE_HEAD}{}", chunk(&format!("data: {{\"tag\":\"{tag}\",\"i\":0}}\n\n")));
            if let Next::PeerGone = write(s, first.as_bytes()) {
                return Next::PeerGone;
            }
            if peer_closes_within(s, st, Duration::from_secs(30)) {
                Next::PeerGone
            } else {
                Next::SelfClose
            }
        }
        Mode::BadFirstChunk => {
            let raw = format!("{SSE_HEAD}zz\r\ndata: {{\"tag\":\"{tag}\"}}\n\n\r\n");
            if let Next::PeerGone = write(s, raw.as_bytes()) {
                return Next::PeerGone;
            }
            if peer_closes_within(s, st, Duration::from_secs(10)) {
                Next::PeerGone
            } else {
                Next::SelfClose
            }
        }
        Mode::Restartable => {
            let delay = v["delay_ms"].as_u64().unwrap_or(0).min(5000);
            if delay > 0 {
                std::thread::sleep(Duration::from_millis(delay));
            }
            let b = format!(r#"{{"tag":"{tag}","conn":{id}}}"#);
            plain(s, "200 OK", "application/json", b.as_bytes())
        }
        Mode::EndlessStream => {
            if !v["stream"].as_bool().unwrap_or(false) {
                return plain(s, "200 OK", "application/json", json.as_bytes());
            }
            if let Next::PeerGone = write(s, SSE_HEAD.as_bytes()) {
                return Next::PeerGone;
            }
            let pad = "x".repeat(16 * 1024 - 64);
            let ev = chunk(&format!("data: {{\"tag\":\"{tag}\",\"pad\":\"{pad}\"}}\n\n"));
            let until = Instant::now() + Duration::from_secs(120);
            loop {
                if let Next::PeerGone = write(s, ev.as_bytes()) {
                    return Next::PeerGone;
                }
                if st.stop.load(Ordering::SeqCst) || Instant::now() > until {
                    return Next::SelfClose;
                }
            }
        }
        Mode::Status(..) | Mode::BareStatus(_) => {
            let line = match mode {
                Mode::Status(code, phrase) => format!("HTTP/1.1 {code} {phrase}"),
                Mode::BareStatus(code) => format!("HTTP/1.1 {code}"),
                _ => unreachable!(),
            };
            let mut out = format!(
                "{line}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n",
                json.len()
            )
            .into_bytes();
            out.extend_from_slice(json.as_bytes());
            write(s, &out)
        }
        Mode::PerRequest => per_request(s, id, st, &v, &tag, body, dirty),
    }
}

/// One [`Mode::PerRequest`] answer, by the body's `"fault"` (see [`FAULTS`]).
fn per_request(
    s: &mut TcpStream,
    id: usize,
    st: &RogueState,
    v: &sonic_rs::Value,
    tag: &str,
    body: &[u8],
    dirty: &mut Option<&'static str>,
) -> Next {
    let json = format!(r#"{{"tag":"{tag}"}}"#);
    let write = |s: &mut TcpStream, b: &[u8]| if s.write_all(b).is_ok() { Next::Keep } else { Next::PeerGone };
    let length_answer = |len: usize, body: &str| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nConnection: keep-alive\r\n\r\n{body}"
        )
    };
    let events =
        |n: usize| -> String { (0..n).map(|i| chunk(&format!("data: {{\"tag\":\"{tag}\",\"i\":{i}}}\n\n"))).collect() };
    let fault = v["fault"].as_str().unwrap_or("ok");
    let as_mode = match fault {
        "stray" => Some(Mode::StrayBytes),
        "stray_late" => Some(Mode::StrayBytesLate),
        "close_after_stream" => Some(Mode::CloseAfterStream),
        "stall" => Some(Mode::StallAfterHead),
        "bad_chunk" => Some(Mode::BadFirstChunk),
        _ => None,
    };
    if let Some(mode) = as_mode {
        return answer_post(s, id, st, mode, body, dirty);
    }
    match fault {
        "ok_stream" => {
            let all = format!("{SSE_HEAD}{}{}0\r\n\r\n", events(3), chunk("data: [DONE]\n\n"));
            write(s, all.as_bytes())
        }
        "dup" => {
            *dirty = Some("a duplicated response in the same write");
            let one = length_answer(json.len(), &json);
            write(s, format!("{one}{one}").as_bytes())
        }
        "short_length" => {
            *dirty = Some("body bytes beyond Content-Length");
            let over = format!(r#"{json},"beyond":"the declared length"}}"#);
            write(s, length_answer(json.len(), &over).as_bytes())
        }
        "close_after_reply" => match write(s, length_answer(json.len(), &json).as_bytes()) {
            Next::Keep => Next::SelfClose,
            other => other,
        },
        "close_silent" => Next::SelfClose,
        "said_close" => {
            *dirty = Some("an answer that said Connection: close");
            let out = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{json}",
                json.len()
            );
            write(s, out.as_bytes())
        }
        "close_delimited" => {
            let out = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{json}");
            match write(s, out.as_bytes()) {
                Next::Keep => Next::SelfClose,
                other => other,
            }
        }
        "die_mid_stream" => match write(s, format!("{SSE_HEAD}{}", events(2)).as_bytes()) {
            Next::Keep => Next::SelfClose,
            other => other,
        },
        _ => write(s, length_answer(json.len(), &json).as_bytes()),
    }
}

/// Watches `s` for the peer closing it, for at most `within` (or until the worker stops).
fn peer_closes_within(s: &mut TcpStream, st: &RogueState, within: Duration) -> bool {
    let until = Instant::now() + within;
    let mut byte = [0u8; 1];
    let closed = loop {
        if st.stop.load(Ordering::SeqCst) {
            break false;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break false;
        }
        let _ = s.set_read_timeout(Some(left.min(Duration::from_millis(100))));
        match s.peek(&mut byte) {
            Ok(0) => break true,
            Ok(_) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break true,
        }
    };
    let _ = s.set_read_timeout(None);
    closed
}

// === Helpers for the hardening tests ===

/// Connects to the gateway with `timeout` as read and write timeout.
pub fn connect_with(port: u16, timeout: Duration) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&std::net::SocketAddr::from(([127, 0, 0, 1], port)), timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Sends `raw` on a fresh connection and reads one response (errors are returned, not
/// unwrapped, so a test can count them).
pub fn exchange(port: u16, raw: &[u8], timeout: Duration) -> std::io::Result<Response> {
    let mut s = connect_with(port, timeout)?;
    s.write_all(raw)?;
    read_response(&mut s, &mut Vec::new(), false)
}

/// Sends `raw` on a fresh connection and returns the status line of the answer.
pub fn status_line(port: u16, raw: &[u8], timeout: Duration) -> std::io::Result<String> {
    let mut s = connect_with(port, timeout)?;
    s.write_all(raw)?;
    let mut got = Vec::new();
    while !got.windows(2).any(|w| w == b"\r\n") {
        super::fill(&mut s, &mut got)?;
    }
    let end = got.windows(2).position(|w| w == b"\r\n").unwrap();
    Ok(String::from_utf8_lossy(&got[..end]).into_owned())
}

/// Closes with RST instead of FIN, so tens of thousands of short connections leave no
/// TIME_WAIT behind on the loopback port range.
pub fn set_linger_zero(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let l = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: plain setsockopt on a socket we own, with a correctly sized option.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Resident set size of `pid` in KiB (VmRSS in /proc/<pid>/status).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
