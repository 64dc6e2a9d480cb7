//! Streamed request bodies through the real binary, under io_uring and epoll: a large body
//! nothing needs to read reaches the worker while it arrives, unparsed and unchanged, with
//! the gateway's memory bounded; a stall is a 408, a broken upload a 400, an oversize body a
//! 413, each closing the worker connection; streamed bodies get one attempt; and everything
//! that needs the body's text (validation of small bodies, text-routing policies without a
//! hint, a fleet of several models) still buffers.

// clippy.toml's house rules are the gateway's: a test's threads are not shards and may lock.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sonic_rs::JsonValueTrait;
use support::*;

/// A prime, so the pattern's period never lines up with a read or chunk size.
const PERIOD: usize = 65_521;

/// The deterministic body pattern, repeated so any window of up to `16 * PERIOD` bytes at
/// any offset is one slice of it.
fn pattern() -> &'static [u8] {
    static P: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let block: Vec<u8> = (0..PERIOD)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        block.repeat(17)
    })
}

/// The pattern's bytes `[off, off + n)`, `n` at most `16 * PERIOD`.
fn window(off: usize, n: usize) -> &'static [u8] {
    let s = off % PERIOD;
    &pattern()[s..s + n]
}

/// What the sink worker saw.
#[derive(Default)]
struct SinkState {
    /// Body bytes received, across requests.
    received: AtomicUsize,
    /// Inference requests whose body arrived whole.
    requests: AtomicUsize,
    /// Connections that ended in the middle of a body.
    cut: AtomicUsize,
    /// Bodies of up to 64 KiB, kept whole.
    small: Mutex<Vec<Vec<u8>>>,
}

/// A worker that checks large bodies against the pattern as they stream in (never holding
/// them), answers `{"len":N,"pattern":true|false}`, and 503 to bodies whose first 64
/// bytes say `"503"`.
struct Sink {
    port: u16,
    st: Arc<SinkState>,
}

impl Sink {
    fn start(model: &'static str) -> Sink {
        let listener = local_listener();
        let port = listener.local_addr().unwrap().port();
        let st = Arc::new(SinkState::default());
        let s2 = Arc::clone(&st);
        std::thread::spawn(move || {
            for c in listener.incoming().flatten() {
                let st = Arc::clone(&s2);
                std::thread::spawn(move || sink_conn(c, &st, model));
            }
        });
        Sink { port, st }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

fn sink_conn(mut s: TcpStream, st: &SinkState, model: &str) {
    let mut buf = Vec::new();
    loop {
        let (path, len, head_len) = loop {
            let mut h = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Request::new(&mut h);
            if let Ok(httparse::Status::Complete(n)) = r.parse(&buf) {
                let find = |name: &str| {
                    r.headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .map(|h| String::from_utf8_lossy(h.value).into_owned())
                };
                let len = find("content-length").map_or(0, |v| v.parse().unwrap());
                break (r.path.unwrap().to_string(), len, n);
            }
            let mut tmp = [0u8; 65536];
            match s.read(&mut tmp) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        };
        buf.drain(..head_len);
        // The body, checked window by window as it arrives.
        let (mut got, mut same) = (0usize, true);
        let mut small = Vec::new();
        let mut first = Vec::new();
        loop {
            let take = buf.len().min(len - got);
            if take > 0 {
                let mut off = 0;
                while off < take {
                    let n = (take - off).min(16 * PERIOD);
                    same &= buf[off..off + n] == *window(got + off, n);
                    off += n;
                }
                if first.len() < 64 {
                    let k = (64 - first.len()).min(take);
                    first.extend_from_slice(&buf[..k]);
                }
                if len <= 65536 {
                    small.extend_from_slice(&buf[..take]);
                }
                buf.drain(..take);
                got += take;
                st.received.fetch_add(take, Ordering::SeqCst);
            }
            if got == len {
                break;
            }
            let mut tmp = vec![0u8; 256 * 1024];
            match s.read(&mut tmp) {
                Ok(0) | Err(_) => {
                    st.cut.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                Ok(n) => buf.extend_from_slice(&tmp[..n]),
            }
        }
        let status = if first.windows(5).any(|w| w == b"\"503\"") { 503 } else { 200 };
        let body = match path.as_str() {
            "/health" => "ok".to_string(),
            "/v1/models" => format!(r#"{{"object":"list","data":[{{"id":"{model}","object":"model"}}]}}"#),
            "/server_info" | "/get_server_info" | "/version" | "/v1/loads" => {
                let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
                continue;
            }
            _ => {
                st.requests.fetch_add(1, Ordering::SeqCst);
                st.small.lock().unwrap().push(small);
                format!(r#"{{"len":{len},"pattern":{same}}}"#)
            }
        };
        let out = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(out.as_bytes()).is_err() {
            return;
        }
    }
}

fn gateway(legacy: bool, sinks: &[&Sink], extra: &[&str]) -> Gateway {
    let urls: Vec<String> = sinks.iter().map(|s| s.url()).collect();
    let mut args = vec!["--worker-urls"];
    args.extend(urls.iter().map(String::as_str));
    args.extend_from_slice(&["--cores", "2"]);
    if !extra.contains(&"--policy") {
        args.extend_from_slice(&["--policy", "round_robin"]);
    }
    args.extend_from_slice(extra);
    let gw = Gateway::start(legacy, &args);
    gw.ready_workers(sinks.len());
    gw
}

/// `VmRSS` or `VmHWM` of a process, in bytes.
fn mem(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

fn head(path: &str, len: usize, extra: &str) -> String {
    format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}Content-Length: {len}\r\n\r\n")
}

/// Writes pattern bytes `[from, to)` of a body.
fn send_pattern(s: &mut TcpStream, from: usize, to: usize) {
    let mut off = from;
    while off < to {
        let n = (to - off).min(16 * PERIOD);
        s.write_all(window(off, n)).unwrap();
        off += n;
    }
}

/// Uploads a 200 MB body, pausing once part of it is sent until the worker has bytes and
/// another client has been served; returns the gateway's peak RSS above idle, and the
/// upload's time.
fn upload(gw: &Gateway, sink: &Sink, streams: bool) -> (u64, Duration) {
    const LEN: usize = 200 << 20;
    let idle = mem(gw.pid(), "VmRSS:");
    let before = sink.st.received.load(Ordering::SeqCst);
    let mut c = gw.connect();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let started = Instant::now();
    // Embeddings: a route with no request schema, so the buffered run reaches the worker too.
    c.write_all(head("/v1/embeddings", LEN, "").as_bytes()).unwrap();
    send_pattern(&mut c, 0, 16 << 20);
    if streams {
        assert!(
            wait_until(Duration::from_secs(10), || sink.st.received.load(Ordering::SeqCst) > before),
            "the worker saw no byte of a streamed body while it was being sent"
        );
    }
    // Another client is served while the upload is half-way.
    let r = post(gw.port, "/v1/completions", r#"{"model":"m","prompt":"hi"}"#, &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    send_pattern(&mut c, 16 << 20, LEN);
    let r = read_response(&mut c, &mut Vec::new(), false).unwrap();
    let took = started.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["len"].as_u64(), Some(LEN as u64));
    assert_eq!(r.json()["pattern"].as_bool(), Some(true), "the body changed on the way");
    (mem(gw.pid(), "VmHWM:").saturating_sub(idle), took)
}

#[test]
fn a_200_mb_upload_streams_with_bounded_memory() {
    both_drivers(|legacy| {
        let sink = Sink::start("m");
        let gw = gateway(legacy, &[&sink], &[]);
        let (peak, took) = upload(&gw, &sink, true);
        println!("streamed 200 MB: peak RSS +{} MiB, {:.0} MB/s", peak >> 20, 200.0 / took.as_secs_f64());
        assert!(peak < 64 << 20, "peak RSS grew {} MiB during a streamed upload", peak >> 20);
        // The same upload buffered (retries keep it when the limit allows) holds the body:
        // the measurement above can see it.
        let gw = gateway(legacy, &[&sink], &["--max-buffered-request-bytes", "268435456"]);
        let (peak, took) = upload(&gw, &sink, false);
        println!("buffered 200 MB: peak RSS +{} MiB, {:.0} MB/s", peak >> 20, 200.0 / took.as_secs_f64());
        assert!(peak > 150 << 20, "a buffered 200 MB body should show in RSS, saw +{} MiB", peak >> 20);
    });
}

#[test]
fn a_stall_is_408_and_closes_the_worker_connection() {
    both_drivers(|legacy| {
        let sink = Sink::start("m");
        let gw = gateway(
            legacy,
            &[&sink],
            &["--max-buffered-request-bytes", "1000", "--stream-body-stall-timeout-secs", "1"],
        );
        let mut c = gw.connect();
        c.write_all(head("/v1/completions", 100_000, "").as_bytes()).unwrap();
        send_pattern(&mut c, 0, 5000);
        let r = read_response(&mut c, &mut Vec::new(), false).unwrap();
        assert_eq!(r.status, 408, "{}", r.text());
        assert_eq!(r.header("x-smg-error-code"), Some("request_body_stalled"));
        assert_eq!(r.json()["error"]["code"].as_str(), Some("request_body_stalled"));
        assert!(
            wait_until(Duration::from_secs(5), || sink.st.cut.load(Ordering::SeqCst) == 1),
            "worker connection left open"
        );
        assert!(closed_within(&mut c, Duration::from_secs(5)), "client connection left open mid-body");
        assert_eq!(sink.st.requests.load(Ordering::SeqCst), 0);
    });
}

#[test]
fn an_aborted_upload_is_400_and_closes_the_worker_connection() {
    both_drivers(|legacy| {
        let sink = Sink::start("m");
        let gw = gateway(legacy, &[&sink], &["--max-buffered-request-bytes", "1000"]);
        let mut c = gw.connect();
        c.write_all(head("/v1/completions", 100_000, "").as_bytes()).unwrap();
        send_pattern(&mut c, 0, 5000);
        assert!(wait_until(Duration::from_secs(5), || sink.st.received.load(Ordering::SeqCst) > 0));
        c.shutdown(Shutdown::Write).unwrap();
        let r = read_response(&mut c, &mut Vec::new(), false).unwrap();
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.header("x-smg-error-code"), Some("request_body_aborted"));
        assert!(
            wait_until(Duration::from_secs(5), || sink.st.cut.load(Ordering::SeqCst) == 1),
            "worker connection left open"
        );
    });
}

#[test]
fn an_oversize_body_is_413_with_nothing_forwarded() {
    both_drivers(|legacy| {
        let sink = Sink::start("m");
        let gw = gateway(legacy, &[&sink], &["--max-buffered-request-bytes", "1000", "--max-payload-size", "1000000"]);
        let mut c = gw.connect();
        c.write_all(head("/v1/completions", 2_000_000, "").as_bytes()).unwrap();
        let _ = c.write_all(window(0, 100_000));
        let r = read_response(&mut c, &mut Vec::new(), false).unwrap();
        assert_eq!(r.status, 413, "{}", r.text());
        assert_eq!(r.json()["error"]["code"].as_str(), Some("request_body_too_large"));
        assert_eq!(sink.st.received.load(Ordering::SeqCst), 0, "an oversize body reached the worker");
    });
}

/// Small bodies are validated as before; a large one goes to the worker byte for byte,
/// invalid JSON included (the worker validates it), and a request pipelined after it is
/// answered in order.
#[test]
fn large_bodies_go_verbatim_and_small_ones_are_still_validated() {
    both_drivers(|legacy| {
        let sink = Sink::start("m");
        let gw = gateway(legacy, &[&sink], &["--max-buffered-request-bytes", "4096"]);
        let r = post(gw.port, "/v1/chat/completions", "{not json", &[]);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(sink.st.requests.load(Ordering::SeqCst), 0);
        let large = window(7, 10_000);
        let small = br#"{"model":"m","prompt":"after"}"#;
        let mut c = gw.connect();
        let mut wire = head("/v1/chat/completions", large.len(), "").into_bytes();
        wire.extend_from_slice(large);
        wire.extend_from_slice(head("/v1/completions", small.len(), "").as_bytes());
        wire.extend_from_slice(small);
        c.write_all(&wire).unwrap();
        let mut rest = Vec::new();
        let first = read_response(&mut c, &mut rest, false).unwrap();
        assert_eq!(first.status, 200, "{}", first.text());
        assert_eq!(first.json()["len"].as_u64(), Some(10_000));
        assert_eq!(first.json()["pattern"].as_bool(), Some(false), "offset 7 is not the pattern's start");
        assert_eq!(sink.st.small.lock().unwrap()[0], large, "the streamed body changed on the way");
        assert!(first.header("x-smg-routed-worker-id").is_some());
        let second = read_response(&mut c, &mut rest, false).unwrap();
        assert_eq!(second.status, 200, "{}", second.text());
        assert_eq!(sink.st.small.lock().unwrap()[1], small, "the pipelined request lost its bytes");
    });
}

#[test]
fn streamed_bodies_get_one_attempt() {
    both_drivers(|legacy| {
        let (a, b) = (Sink::start("m"), Sink::start("m"));
        let gw =
            gateway(legacy, &[&a, &b], &["--max-buffered-request-bytes", "4096", "--retry-initial-backoff-ms", "1"]);
        let sent = |s: &Sink| s.st.requests.load(Ordering::SeqCst);
        let big = format!("\"503\"{}", " ".repeat(10_000));
        let r = post(gw.port, "/v1/completions", &big, &[]);
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(sent(&a) + sent(&b), 1, "a streamed body was retried");
        // The same refusal of a buffered body is retried on the other worker.
        let r = post(gw.port, "/v1/completions", r#"{"model":"m","prompt":"503"}"#, &[]);
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(sent(&a) + sent(&b) > 2, "a buffered body was not retried");
    });
}

/// What needs the body's text keeps it buffered: a text-routing policy without a routing
/// hint (with one, the body streams), and a fleet of more than one model.
#[test]
fn bodies_that_must_be_read_are_buffered() {
    both_drivers(|legacy| {
        let sink = Sink::start("m");
        let big = String::from_utf8(vec![b'x'; 10_000]).unwrap();
        let mport = free_port().to_string();
        let flags = [
            "--max-buffered-request-bytes",
            "4096",
            "--policy",
            "cache_aware",
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            &mport,
        ];
        let gw = gateway(legacy, &[&sink], &flags);
        let r = post(gw.port, "/v1/completions", &big, &[]);
        assert_eq!(r.status, 400, "cache_aware without a hint must read the body: {}", r.text());
        let r = post(gw.port, "/v1/completions", &big, &["X-SMG-Routing-Tokens: 1,2,3"]);
        assert_eq!(r.status, 200, "a valid hint lets the body stream: {}", r.text());
        assert_eq!(sink.st.requests.load(Ordering::SeqCst), 1);
        // Each decision is counted with the rule that made it.
        let want = [
            r#"smg_router_request_body_path_total{path="buffered",reason="policy_needs_text"} 1"#,
            r#"smg_router_request_body_path_total{path="streamed",reason="retry_forfeited"} 1"#,
        ];
        let scrape = || get(mport.parse().unwrap(), "/metrics").text();
        assert!(
            wait_until(Duration::from_secs(5), || want.iter().all(|w| scrape().contains(w))),
            "{}",
            scrape().lines().filter(|l| l.contains("body_path")).collect::<Vec<_>>().join("\n")
        );
        drop(gw);
        let other = Sink::start("m2");
        let gw = gateway(legacy, &[&sink, &other], &["--max-buffered-request-bytes", "4096"]);
        let r = post(gw.port, "/v1/completions", &big, &[]);
        assert_eq!(r.status, 400, "with two models the body names the model: {}", r.text());
    });
}
