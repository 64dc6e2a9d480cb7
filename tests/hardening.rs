//! Data-plane hardening: misbehaving workers and clients, resource bounds, and the HTTP/1.1
//! rules a gateway must not bend. Each test runs under io_uring and epoll, beside the others.

// clippy.toml's house rules are the gateway's: a test's threads are not shards and may block and lock.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sonic_rs::JsonValueTrait;
use support::rogue::*;
use support::*;

fn secs(n: u64) -> Duration {
    patience(Duration::from_secs(n))
}

fn gateway(legacy: bool, url: &str, extra: &[&str]) -> Gateway {
    let mut args = vec!["--worker-urls", url];
    if !extra.contains(&"--cores") {
        args.extend_from_slice(&["--cores", "2"]);
    }
    args.extend_from_slice(extra);
    let gw = Gateway::start_with(legacy, &args, None);
    gw.ready();
    gw
}

fn chat(tag: &str, stream: bool) -> String {
    format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi {tag}"}}],"stream":{stream},"tag":"{tag}"}}"#)
}

/// GET /health on a new connection, answered 200 within `within`; closed with RST after.
fn one_health(port: u16, within: Duration) -> Result<(), String> {
    let mut s = connect_with(port, within).map_err(|e| format!("connect: {e}"))?;
    let started = Instant::now();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").map_err(|e| format!("write: {e}"))?;
    let r = read_response(&mut s, &mut Vec::new(), false)
        .map_err(|e| format!("no answer after {:?}: {e}", started.elapsed()))?;
    set_linger_zero(&s);
    if r.status != 200 {
        return Err(format!("status {}", r.status));
    }
    Ok(())
}

/// With peer-shard inbox traffic flowing (cache-aware digests and load reports), every
/// connection the kernel accepted must be served: none may vanish between the listener and
/// a connection task.
#[test]
fn no_accepted_connection_is_lost() {
    both_drivers(|legacy| {
        const CONNS: usize = 20_000;
        let w = FakeWorker::start("m");
        let gw = gateway(legacy, &w.url(), &["--cores", "2"]);
        let port = gw.port;
        let stop = Arc::new(AtomicBool::new(false));
        let posted = Arc::new(AtomicUsize::new(0));
        let background: Vec<_> = (0..3)
            .map(|t| {
                let (stop, posted) = (Arc::clone(&stop), Arc::clone(&posted));
                std::thread::spawn(move || {
                    let mut conn: Option<TcpStream> = None;
                    let mut rest = Vec::new();
                    for i in 0..200_000u64 {
                        if stop.load(Ordering::SeqCst) {
                            return;
                        }
                        if conn.is_none() {
                            conn = connect_with(port, Duration::from_secs(10)).ok();
                            rest.clear();
                        }
                        let Some(s) = conn.as_mut() else { continue };
                        // Varied prompts: every request inserts new prefixes into the shard's tree.
                        let body = format!(
                            r#"{{"model":"m","messages":[{{"role":"user","content":"thread {t} turn {i} {}"}}]}}"#,
                            i.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                        );
                        let ok = s.write_all(post_bytes("/v1/chat/completions", &body, &[]).as_bytes()).is_ok()
                            && read_response(s, &mut rest, false).is_ok_and(|r| r.status == 200);
                        if ok {
                            posted.fetch_add(1, Ordering::SeqCst);
                        } else {
                            conn = None;
                        }
                        // Enough for a digest every tick, without starving the connection storm.
                        std::thread::sleep(Duration::from_millis(1));
                    }
                })
            })
            .collect();
        assert!(
            wait_until(secs(10), || posted.load(Ordering::SeqCst) >= 50),
            "precondition: background chat traffic never got going"
        );
        let next = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::<String>::new()));
        let deadline = Instant::now() + secs(150);
        let clients: Vec<_> = (0..8)
            .map(|_| {
                let (next, failures) = (Arc::clone(&next), Arc::clone(&failures));
                std::thread::spawn(move || loop {
                    if failures.lock().unwrap().len() >= 10 || Instant::now() > deadline {
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= CONNS {
                        return;
                    }
                    if let Err(e) = one_health(port, secs(5)) {
                        failures.lock().unwrap().push(format!("connection {i}: {e}"));
                    }
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
        stop.store(true, Ordering::SeqCst);
        for b in background {
            b.join().unwrap();
        }
        let attempted = next.load(Ordering::SeqCst).min(CONNS);
        let failures = failures.lock().unwrap();
        assert!(
            failures.is_empty(),
            "{} of {attempted} connections were not served (a run stops soon after 10), {} chat requests in the background; first: {:?}",
            failures.len(),
            posted.load(Ordering::SeqCst),
            &failures[..failures.len().min(3)]
        );
        assert_eq!(attempted, CONNS, "only {attempted} connections made it within {:?}", secs(150));
    });
}

/// A worker that closes its keep-alive socket right after each stream's last chunk: the
/// gateway must never hand a request to such a socket and fail it.
#[test]
fn worker_closing_after_each_stream() {
    both_drivers(|legacy| {
        let w = RogueWorker::start("m", Mode::CloseAfterStream);
        let gw = gateway(legacy, &w.url(), &[]);
        let port = gw.port;
        let failures = Arc::new(Mutex::new(Vec::<String>::new()));
        let clients: Vec<_> = (0..8)
            .map(|c| {
                let failures = Arc::clone(&failures);
                std::thread::spawn(move || {
                    let mut conn: Option<TcpStream> = None;
                    let mut rest = Vec::new();
                    for i in 0..50 {
                        if failures.lock().unwrap().len() >= 20 {
                            return;
                        }
                        let tag = format!("t{c}-{i}");
                        if conn.is_none() {
                            match connect_with(port, secs(10)) {
                                Ok(s) => conn = Some(s),
                                Err(e) => {
                                    failures.lock().unwrap().push(format!("{tag}: connect: {e}"));
                                    continue;
                                }
                            }
                            rest.clear();
                        }
                        let s = conn.as_mut().unwrap();
                        let sent = s.write_all(post_bytes("/v1/chat/completions", &chat(&tag, true), &[]).as_bytes());
                        let r = sent.and_then(|_| read_response(s, &mut rest, false));
                        let fail = match &r {
                            Err(e) => Some(format!("{tag}: no response: {e}")),
                            Ok(r) if r.status != 200 => Some(format!("{tag}: {} {}", r.status, r.text())),
                            Ok(r) if !r.complete => Some(format!("{tag}: stream cut short: {:?}", r.text())),
                            Ok(r) => {
                                let t = r.text();
                                let whole = (0..3).all(|k| t.contains(&format!("{{\"tag\":\"{tag}\",\"i\":{k}}}")))
                                    && t.ends_with("data: [DONE]\n\n");
                                (!whole).then(|| format!("{tag}: body incomplete: {t:?}"))
                            }
                        };
                        let reconnect = match &r {
                            Ok(r) => r.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close")),
                            Err(_) => true,
                        };
                        if let Some(f) = fail {
                            failures.lock().unwrap().push(f);
                        }
                        if reconnect || !r.as_ref().is_ok_and(|r| r.complete) {
                            conn = None;
                        }
                    }
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
        let failures = failures.lock().unwrap();
        assert!(
            failures.is_empty(),
            "{} failed of 400 streams (a run stops soon after 20), worker saw {} POSTs; first: {:?}",
            failures.len(),
            w.state.posts.load(Ordering::SeqCst),
            &failures[..failures.len().min(3)]
        );
    });
}

/// Bytes a worker sends past the end of its response (at once or a little later) belong
/// to no request: they must never be read as the next client's response.
#[test]
fn stray_bytes_never_reach_the_next_client() {
    both_drivers(|legacy| {
        for mode in [Mode::StrayBytes, Mode::StrayBytesLate] {
            let w = RogueWorker::start("m", mode);
            let gw = gateway(legacy, &w.url(), &["--cores", "1"]);
            let mut got = Vec::new();
            for (k, tag) in ["c1", "c2", "c3", "c4"].into_iter().enumerate() {
                let r =
                    exchange(gw.port, post_bytes("/v1/chat/completions", &chat(tag, false), &[]).as_bytes(), secs(5));
                let seen = match r {
                    Ok(r) if r.status == 200 => r.json()["tag"].as_str().unwrap_or("?").to_string(),
                    Ok(r) => format!("status {}", r.status),
                    Err(e) => format!("error {e}"),
                };
                got.push((tag, seen));
                // The late variant's stray answer lands while the socket sits in the pool: the
                // next request waits for the worker to have written it. (The other variant's
                // stray bytes came in the answer's own write.)
                if mode == Mode::StrayBytesLate {
                    assert!(
                        wait_until(secs(2), || w.state.late_strays.load(Ordering::SeqCst) > k),
                        "{mode:?}: {tag}: the worker never wrote its late stray answer"
                    );
                }
            }
            assert!(got.iter().all(|(want, seen)| want == seen), "{mode:?}: clients got {got:?}");
        }
    });
}

/// Clients that send a streaming request and never read: once a write to one of them has
/// waited past --client-write-timeout-secs, the gateway gives up on it and closes the
/// worker's connection, so an endless stream cannot pin a socket pair forever.
#[test]
fn non_reading_clients_are_cut_after_the_send_deadline() {
    both_drivers(|legacy| {
        let w = RogueWorker::start("m", Mode::EndlessStream);
        let gw = gateway(legacy, &w.url(), &["--client-write-timeout-secs", "1"]);
        let mut idle = Vec::new();
        for i in 0..5 {
            let mut s = connect_with(gw.port, secs(5)).unwrap();
            s.write_all(post_bytes("/v1/chat/completions", &chat(&format!("deaf{i}"), true), &[]).as_bytes()).unwrap();
            idle.push(s);
        }
        assert!(
            wait_until(secs(5), || w.state.posts.load(Ordering::SeqCst) >= 5),
            "precondition: only {} streams started",
            w.state.posts.load(Ordering::SeqCst)
        );
        let t0 = Instant::now();
        let all_closed = wait_until(secs(10), || w.state.peer_closes() >= 5);
        assert!(
            all_closed,
            "{} of 5 worker connections closed {:?} after the streams started (clients never read)",
            w.state.peer_closes(),
            t0.elapsed()
        );
        let r = exchange(gw.port, post_bytes("/v1/chat/completions", &chat("six", false), &[]).as_bytes(), secs(5))
            .expect("a normal request after the cut");
        assert_eq!((r.status, r.json()["tag"].as_str()), (200, Some("six")), "{}", r.text());
        drop(idle);
    });
}

/// A worker that sends a head and one event, then nothing: after
/// --upstream-read-timeout-secs the client's response is ended without its terminating
/// chunk (so the client knows it was cut) and the worker's connection is closed.
#[test]
fn stalled_worker_body_is_ended() {
    both_drivers(|legacy| {
        let w = RogueWorker::start("m", Mode::StallAfterHead);
        let gw = gateway(legacy, &w.url(), &["--upstream-read-timeout-secs", "1"]);
        // Right: cut after about 1 s; wrong: open for the worker's whole 30 s stall. The
        // bounds sit halfway.
        let mut s = connect_with(gw.port, secs(15)).unwrap();
        let started = Instant::now();
        s.write_all(post_bytes("/v1/chat/completions", &chat("slow", true), &[]).as_bytes()).unwrap();
        let mut raw = Vec::new();
        while !raw.windows(6).any(|x| x == b"\"i\":0}") {
            if let Err(e) = fill(&mut s, &mut raw) {
                panic!("head and first event never arrived: {e}; got {:?}", String::from_utf8_lossy(&raw));
            }
        }
        assert!(raw.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&raw));
        let end = loop {
            if let Err(e) = fill(&mut s, &mut raw) {
                break e;
            }
        };
        let closed = matches!(
            end.kind(),
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        );
        assert!(closed, "client response still open {:?} after the worker stalled ({end})", started.elapsed());
        assert!(started.elapsed() < secs(15), "ended only after {:?}", started.elapsed());
        assert!(!raw.ends_with(b"0\r\n\r\n"), "a cut stream must not end with the terminating chunk");
        assert!(wait_until(secs(3), || w.state.peer_closes() >= 1), "the stalled worker's connection was left open");
    });
}

/// Blank lines before a request line are tolerated, but not without bound: a connection
/// that sends nothing but CRLF must be answered 400 or closed, and must not make the
/// gateway buffer what it sent.
#[test]
fn endless_blank_lines_are_bounded() {
    both_drivers(|legacy| {
        const LIMIT: usize = 200 << 20;
        let w = FakeWorker::start("m");
        let gw = gateway(legacy, &w.url(), &[]);
        assert_eq!(post(gw.port, "/v1/chat/completions", CHAT_M, &[]).status, 200);
        let before = rss_kib(gw.pid()).unwrap();
        let s = connect_with(gw.port, secs(2)).unwrap();
        let mut reader = s.try_clone().unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let got = Arc::new(Mutex::new((Vec::<u8>::new(), false)));
        let r = {
            let (done, got) = (Arc::clone(&done), Arc::clone(&got));
            reader.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            std::thread::spawn(move || {
                let mut tmp = [0u8; 4096];
                while !done.load(Ordering::SeqCst) {
                    match reader.read(&mut tmp) {
                        Ok(0) => break,
                        Ok(n) => got.lock().unwrap().0.extend_from_slice(&tmp[..n]),
                        Err(e)
                            if e.kind() == std::io::ErrorKind::WouldBlock
                                || e.kind() == std::io::ErrorKind::TimedOut => {}
                        Err(_) => break,
                    }
                }
                got.lock().unwrap().1 = true;
            })
        };
        let block = b"\r\n".repeat(32 * 1024);
        let mut writer = s;
        let (mut sent, mut peak) = (0usize, before);
        let started = Instant::now();
        let mut write_err = None;
        while sent < LIMIT && started.elapsed() < secs(30) {
            if got.lock().unwrap().1 || !got.lock().unwrap().0.is_empty() {
                break;
            }
            if let Err(e) = writer.write_all(&block) {
                if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut {
                    continue;
                }
                write_err = Some(e);
                break;
            }
            sent += block.len();
            if sent % (1 << 20) == 0 {
                peak = peak.max(rss_kib(gw.pid()).unwrap_or(0));
                if peak > before + 32 * 1024 {
                    break;
                }
            }
        }
        // The answer (or the close) may trail the last write a little.
        wait_until(secs(2), || got.lock().unwrap().1 || !got.lock().unwrap().0.is_empty());
        peak = peak.max(rss_kib(gw.pid()).unwrap_or(0));
        done.store(true, Ordering::SeqCst);
        r.join().unwrap();
        let (bytes, eof) = std::mem::take(&mut *got.lock().unwrap());
        let answer = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
        let grew_mb = peak.saturating_sub(before) / 1024;
        assert!(
            grew_mb < 32,
            "RSS grew by {grew_mb} MB after {} MB of blank lines in {:?} (answer so far: {answer:?})",
            sent >> 20,
            started.elapsed()
        );
        let closed = eof || write_err.is_some();
        assert!(
            answer.starts_with("HTTP/1.1 400") || (bytes.is_empty() && closed),
            "after {} MB of blank lines in {:?}: answer {answer:?}, closed {closed}",
            sent >> 20,
            started.elapsed()
        );
    });
}

const CHAT_M: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// An HTTP/1.0 client cannot read chunked coding: a streamed answer is sent raw and ended by
/// closing the connection.
#[test]
fn http10_stream_is_not_chunked() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gateway(legacy, &w.url(), &[]);
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"fake":"sse","events":3,"gap_ms":10}"#;
        let mut s = connect_with(gw.port, secs(10)).unwrap();
        let req = format!(
            "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut raw = Vec::new();
        let end = loop {
            if let Err(e) = fill(&mut s, &mut raw) {
                break e;
            }
        };
        assert_eq!(end.kind(), std::io::ErrorKind::UnexpectedEof, "HTTP/1.0 response not ended by a close: {end}");
        let mut h = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut h);
        let Ok(httparse::Status::Complete(n)) = resp.parse(&raw) else {
            panic!("no response head: {:?}", String::from_utf8_lossy(&raw))
        };
        assert_eq!(resp.code, Some(200));
        let te: Vec<String> = resp
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("transfer-encoding"))
            .map(|h| String::from_utf8_lossy(h.value).into_owned())
            .collect();
        assert!(te.is_empty(), "Transfer-Encoding {te:?} sent to an HTTP/1.0 client");
        assert_eq!(
            String::from_utf8_lossy(&raw[n..]),
            "data: {\"i\":0}\n\ndata: {\"i\":1}\n\ndata: {\"i\":2}\n\ndata: [DONE]\n\n",
            "body must be the worker's SSE bytes, unframed"
        );
    });
}

/// A worker whose first chunk size line is garbage sent nothing usable: the client gets a
/// 502 with the error envelope, not a cut connection.
#[test]
fn malformed_first_chunk_is_502() {
    both_drivers(|legacy| {
        let w = RogueWorker::start("m", Mode::BadFirstChunk);
        let gw = gateway(legacy, &w.url(), &[]);
        let r = exchange(gw.port, post_bytes("/v1/chat/completions", &chat("bad", true), &[]).as_bytes(), secs(5))
            .unwrap_or_else(|e| panic!("no response for a worker's malformed first chunk: {e}"));
        assert_eq!(r.status, 502, "{}", r.text());
        let j = r.json();
        assert_eq!(j["error"]["type"].as_str(), Some("Bad Gateway"));
        let code = j["error"]["code"].as_str().expect("error.code").to_string();
        assert_eq!(r.header("x-smg-error-code"), Some(code.as_str()));
        assert!(j["error"]["param"].is_null());
    });
}

/// RFC 9112 rules on Host, the absolute form of the request target and transfer codings.
#[test]
fn host_absolute_form_and_transfer_codings() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gateway(legacy, &w.url(), &[]);
        let len = CHAT_M.len();
        let chunked: String = {
            let b = CHAT_M.as_bytes();
            let (a, rest) = b.split_at(5);
            format!(
                "{:04x}\r\n{}\r\n{:06X}\r\n{}\r\n000\r\n\r\n",
                a.len(),
                String::from_utf8_lossy(a),
                rest.len(),
                String::from_utf8_lossy(rest)
            )
        };
        let cases: Vec<(&str, String, u16)> = vec![
            (
                "HTTP/1.1 without Host",
                format!("POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n{CHAT_M}"),
                400,
            ),
            (
                "two Host headers",
                format!("POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n{CHAT_M}"),
                400,
            ),
            (
                "absolute-form target",
                format!(
                    "POST http://127.0.0.1:{}/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n{CHAT_M}",
                    gw.port, gw.port
                ),
                200,
            ),
            (
                "Transfer-Encoding: gzip",
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip\r\n\r\n".to_string(),
                501,
            ),
            (
                "Transfer-Encoding: gzip, chunked",
                format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\n\r\n{chunked}"),
                501,
            ),
            (
                "chunk sizes with leading zeros",
                format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}"),
                200,
            ),
        ];
        let mut wrong = Vec::new();
        for (name, raw, want) in &cases {
            let before = w.requests().len();
            match exchange(gw.port, raw.as_bytes(), secs(5)) {
                Ok(r) if r.status == *want => {
                    let forwarded = w.requests().len() > before;
                    if *want == 200 {
                        let rec = w.requests().pop().unwrap();
                        if rec.path != "/v1/chat/completions" || rec.body != CHAT_M.as_bytes() {
                            wrong.push(format!(
                                "{name}: worker saw {} {:?}",
                                rec.path,
                                String::from_utf8_lossy(&rec.body)
                            ));
                        }
                    } else if forwarded {
                        wrong.push(format!("{name}: answered {want} but also forwarded"));
                    }
                }
                Ok(r) => wrong.push(format!("{name}: want {want}, got {} {}", r.status, r.text())),
                Err(e) => wrong.push(format!("{name}: want {want}, got no answer: {e}")),
            }
        }
        assert!(wrong.is_empty(), "{} of {} cases wrong:\n{}", wrong.len(), cases.len(), wrong.join("\n"));
    });
}

/// Seconds since the epoch of an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), None if the
/// value is not exactly that form (weekday included).
fn imf_fixdate(v: &str) -> Option<i64> {
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let b = v.as_bytes();
    if b.len() != 29 || &v[3..5] != ", " || b[7] != b' ' || b[11] != b' ' || b[16] != b' ' || &v[25..] != " GMT" {
        return None;
    }
    if b[19] != b':' || b[22] != b':' {
        return None;
    }
    let digits = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = &v[r];
        if s.bytes().all(|c| c.is_ascii_digit()) {
            s.parse().ok()
        } else {
            None
        }
    };
    let weekday = DAYS.iter().position(|d| *d == &v[0..3])? as i64;
    let day = digits(5..7)?;
    let month = MONTHS.iter().position(|m| *m == &v[8..11])? as i64 + 1;
    let year = digits(12..16)?;
    let (hh, mm, ss) = (digits(17..19)?, digits(20..22)?, digits(23..25)?);
    if !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    // 1970-01-01 was a Thursday (index 3 from Monday).
    if (days + 3).rem_euclid(7) != weekday {
        return None;
    }
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

#[test]
fn imf_fixdate_parser() {
    assert_eq!(imf_fixdate("Sun, 06 Nov 1994 08:49:37 GMT"), Some(784_111_777));
    assert_eq!(imf_fixdate("Mon, 06 Nov 1994 08:49:37 GMT"), None, "wrong weekday");
    assert_eq!(imf_fixdate("Sunday, 06-Nov-94 08:49:37 GMT"), None);
    assert_eq!(imf_fixdate("Sun Nov  6 08:49:37 1994"), None);
}

/// Every response carries a Date header (RFC 9110 §6.6.1) in IMF-fixdate form, close to now.
#[test]
fn date_header_everywhere() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gateway(legacy, &w.url(), &[]);
        let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        let mut wrong = Vec::new();
        let answers = [
            ("gateway 404", exchange(gw.port, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", secs(5)).unwrap()),
            ("/health", exchange(gw.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", secs(5)).unwrap()),
            ("relayed worker answer", post(gw.port, "/v1/chat/completions", CHAT_M, &[])),
        ];
        for (name, r) in &answers {
            match r.header("date") {
                None => wrong.push(format!("{name} ({}): no Date", r.status)),
                Some(d) => match imf_fixdate(d) {
                    None => wrong.push(format!("{name}: Date {d:?} is not an IMF-fixdate")),
                    Some(t) if (t - now()).abs() > 10 => wrong.push(format!("{name}: Date {d:?} is not now")),
                    Some(_) => {}
                },
            }
        }
        assert!(wrong.is_empty(), "{wrong:?}");
    });
}

/// With few descriptors and many idle clients, the gateway must keep what it needs to reach
/// workers (health checks included) and serve again as soon as clients leave.
#[test]
fn descriptor_limit() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let url = w.url();
        let mut gw = Gateway::start_with(
            legacy,
            &["--worker-urls", &url, "--cores", "2", "--health-check-interval-secs", "1"],
            Some(256),
        );
        gw.ready();
        let mut idle = Vec::new();
        for i in 0..400 {
            match connect_with(gw.port, secs(5)) {
                Ok(s) => idle.push(s),
                Err(e) => panic!("client connection {i}: {e}"),
            }
        }
        // Several health-check rounds go by with more clients than the cap: the ones past
        // it wait in the kernel's backlog, and the gateway keeps descriptors in reserve.
        // Three rounds take 3 s at one a second; a gateway out of descriptors never gets its
        // checks to the worker (or marks it down): waited for up to 10 s.
        let checks = || w.state.health_checks.load(Ordering::SeqCst);
        let before = checks();
        let rounds = wait_until(secs(10), || checks() >= before + 3 || gw.log_text().contains("is down"));
        assert!(gw.alive(), "gateway died under descriptor pressure; log tail:\n{}", tail(&gw.log_text()));
        assert!(
            rounds,
            "{} health checks reached the worker in {:?} under descriptor pressure",
            checks() - before,
            secs(10)
        );
        let open = gw.fd_count();
        assert!(open < 256 - 64, "the gateway holds {open} of 256 descriptors: no reserve kept");
        let log = gw.log_text();
        assert!(!log.contains("is down"), "a healthy worker was marked down:\n{}", tail(&log));
        drop(idle);
        let r = exchange(gw.port, b"GET /readiness HTTP/1.1\r\nHost: x\r\n\r\n", secs(5))
            .unwrap_or_else(|e| panic!("/readiness after the idle clients left: {e}"));
        assert_eq!(
            (r.status, r.text().contains("\"healthy_workers\":1")),
            (200, true),
            "worker not healthy after descriptor pressure: {}",
            r.text()
        );
        let recovered = wait_until(secs(5), || {
            exchange(gw.port, post_bytes("/v1/chat/completions", CHAT_M, &[]).as_bytes(), secs(2))
                .is_ok_and(|r| r.status == 200)
        });
        assert!(recovered, "no request succeeded after the idle clients left");
        for i in 0..20 {
            let r = exchange(gw.port, post_bytes("/v1/chat/completions", CHAT_M, &[]).as_bytes(), secs(5))
                .unwrap_or_else(|e| panic!("request {i} after recovery: {e}"));
            assert_eq!(r.status, 200, "request {i} after recovery: {}", r.text());
        }
        assert!(gw.alive());
    });
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// What a client must get for one [`Mode::PerRequest`] fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// 200, whole (a stream ends with its terminating chunk and `[DONE]`), naming its tag.
    Own,
    /// 200 with the head and some of its own events, then cut short (no terminating chunk).
    CutShort,
    /// 502 with the error envelope and `x-smg-error-code`.
    BadGateway,
}

/// One fault the fuzz loop can pick: its `"fault"` name, its weight (of 100), whether the
/// request asks for a stream, and what the client must get.
struct FaultCase {
    name: &'static str,
    weight: u64,
    stream: bool,
    expect: Expect,
}

const FAULT_CASES: [FaultCase; 14] = [
    FaultCase { name: "ok", weight: 17, stream: false, expect: Expect::Own },
    FaultCase { name: "ok_stream", weight: 10, stream: true, expect: Expect::Own },
    FaultCase { name: "stray", weight: 8, stream: false, expect: Expect::Own },
    FaultCase { name: "stray_late", weight: 5, stream: false, expect: Expect::Own },
    FaultCase { name: "dup", weight: 7, stream: false, expect: Expect::Own },
    FaultCase { name: "short_length", weight: 8, stream: false, expect: Expect::Own },
    FaultCase { name: "close_after_stream", weight: 8, stream: true, expect: Expect::Own },
    FaultCase { name: "close_after_reply", weight: 8, stream: false, expect: Expect::Own },
    FaultCase { name: "close_silent", weight: 5, stream: false, expect: Expect::BadGateway },
    FaultCase { name: "die_mid_stream", weight: 6, stream: true, expect: Expect::CutShort },
    FaultCase { name: "bad_chunk", weight: 6, stream: true, expect: Expect::BadGateway },
    // Each stall costs --upstream-read-timeout-secs (1 s): rare, to keep the test short.
    FaultCase { name: "stall", weight: 5, stream: true, expect: Expect::CutShort },
    FaultCase { name: "said_close", weight: 4, stream: false, expect: Expect::Own },
    FaultCase { name: "close_delimited", weight: 3, stream: false, expect: Expect::Own },
];

/// The fault case a roll in 0..100 lands on.
fn fault_case(roll: u64) -> &'static FaultCase {
    let mut acc = 0;
    for c in &FAULT_CASES {
        acc += c.weight;
        if roll < acc {
            return c;
        }
    }
    &FAULT_CASES[0]
}

/// Every complete `"tag":"…"` value in `text`.
fn tags_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(r#""tag":""#) {
        rest = &rest[i + 7..];
        match rest.find('"') {
            Some(j) => {
                out.push(rest[..j].to_string());
                rest = &rest[j..];
            }
            None => break,
        }
    }
    out
}

/// Sends one request on `s` and reads its response; a reader that chokes on the bytes
/// (a malformed chunk relayed as is, say) is a failure, not a panic of the test.
fn request_on(s: &mut TcpStream, rest: &mut Vec<u8>, body: &str) -> Result<Response, String> {
    s.write_all(post_bytes("/v1/chat/completions", body, &[]).as_bytes()).map_err(|e| format!("write: {e}"))?;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_response(s, rest, false))) {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(format!("no (complete) response: {e}; unparsed bytes {:?}", String::from_utf8_lossy(rest))),
        Err(_) => Err(format!("unreadable response; unparsed bytes {:?}", String::from_utf8_lossy(rest))),
    }
}

/// Whether `got` is what a client whose request carried `tag` and `case.name` may get.
fn check_answer(tag: &str, case: &FaultCase, got: &Result<Response, String>) -> Result<(), String> {
    let r = got.as_ref().map_err(|e| e.clone())?;
    let text = r.text();
    let tags = tags_in(&text);
    if let Some(other) = tags.iter().find(|t| *t != tag) {
        return Err(format!("bytes of another answer: tag {other:?} in {} {text:?}", r.status));
    }
    match (r.status, case.expect) {
        (200, Expect::Own) if !r.complete => Err(format!("cut short: {text:?}")),
        (200, Expect::Own) if case.stream => {
            let whole = (0..3).all(|k| text.contains(&format!("{{\"tag\":\"{tag}\",\"i\":{k}}}")))
                && text.ends_with("data: [DONE]\n\n");
            if whole {
                Ok(())
            } else {
                Err(format!("stream incomplete: {text:?}"))
            }
        }
        (200, Expect::Own) if text == format!(r#"{{"tag":"{tag}"}}"#) => Ok(()),
        (200, Expect::Own) => Err(format!("body is not its answer: {text:?}")),
        (200, Expect::CutShort) if r.complete => Err(format!("a broken stream ended as if whole: {text:?}")),
        (200, Expect::CutShort) if tags.is_empty() => Err(format!("cut short before its own events: {text:?}")),
        (200, Expect::CutShort) => Ok(()),
        (502 | 504, _) => {
            let v: sonic_rs::Value = sonic_rs::from_slice(&r.body)
                .map_err(|e| format!("{} without a JSON envelope ({e}): {text:?}", r.status))?;
            let want_type = if r.status == 502 { "Bad Gateway" } else { "Gateway Timeout" };
            let code = v["error"]["code"].as_str();
            if v["error"]["type"].as_str() != Some(want_type) || code.is_none() || r.header("x-smg-error-code") != code
            {
                return Err(format!(
                    "{} envelope wrong (x-smg-error-code {:?}): {text:?}",
                    r.status,
                    r.header("x-smg-error-code")
                ));
            }
            if case.expect == Expect::BadGateway && r.status == 502 {
                Ok(())
            } else {
                Err(format!("want {:?}, got {} {text:?}", case.expect, r.status))
            }
        }
        (status, want) => Err(format!("want {want:?}, got {status} {text:?}")),
    }
}

/// Pooled upstream connections meet workers that misbehave per request: a seeded RNG picks,
/// for each of a few hundred sequential requests, the worker's fault (stray bytes at once or
/// late, a duplicated response, a short Content-Length, a close after a reply or a stream, a
/// close without a reply, a stream dying mid-body, a malformed first chunk, a stall after
/// the head, `Connection: close` on a socket left open, a close-delimited body, or a
/// correct answer; see [`FAULT_CASES`]) and whether the request rides the client's
/// keep-alive connection or a new one. One shard, so every request shares one pool. Each request must
/// get its own answer, a 502 with the envelope, or (a fault mid-body) its own answer cut
/// short, within the bound: never another request's bytes. The worker reports any request
/// that arrived on a connection after bytes past an answer, and at the end the gateway is
/// alive, serves, and holds no more descriptors than before.
///
/// `SMG_FUZZ_SEED` (decimal or 0x-hex) replays another sequence.
#[test]
fn pooled_reuse_survives_per_request_faults() {
    const STEPS: usize = 300;
    let seed0 = std::env::var("SMG_FUZZ_SEED")
        .ok()
        .and_then(|v| match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        })
        .unwrap_or(0x5eed_c0de);
    for c in &FAULT_CASES {
        assert!(FAULTS.contains(&c.name), "the rogue worker knows no fault {:?}", c.name);
    }
    both_drivers(|legacy| {
        let t0 = Instant::now();
        let driver = if legacy { "epoll" } else { "io_uring" };
        let w = RogueWorker::start("m", Mode::PerRequest);
        let mut gw = gateway(
            legacy,
            &w.url(),
            // One attempt per request: each scripted fault must meet exactly one request, so
            // retries and the breaker (tests/fleet_faults.rs) stay out of this one.
            &[
                "--cores",
                "1",
                "--upstream-read-timeout-secs",
                "1",
                "--request-timeout-secs",
                "5",
                "--disable-retries",
                "--disable-circuit-breaker",
            ],
        );
        let port = gw.port;
        let body = |tag: &str, case: &FaultCase| {
            format!(
                r#"{{"model":"m","messages":[{{"role":"user","content":"hi {tag}"}}],"stream":{},"tag":"{tag}","fault":"{}"}}"#,
                case.stream, case.name
            )
        };
        let clean = |tag: &str| {
            let mut s = connect_with(port, secs(6)).map_err(|e| format!("connect: {e}"))?;
            let got = request_on(&mut s, &mut Vec::new(), &body(tag, &FAULT_CASES[0]));
            check_answer(tag, &FAULT_CASES[0], &got)
        };
        // Warm up the pool and lazily made state before the baseline, which waits for the
        // gateway to have closed the warm-up connection (it closes on the client's FIN).
        let mut warm = connect_with(port, secs(6)).expect("precondition: connect");
        let got = request_on(&mut warm, &mut Vec::new(), &body("warm", &FAULT_CASES[0]));
        check_answer("warm", &FAULT_CASES[0], &got)
            .unwrap_or_else(|e| panic!("precondition: a clean request failed: {e}"));
        warm.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(closed_within(&mut warm, Duration::from_secs(5)), "precondition: the warm-up connection stayed open");
        drop(warm);
        let baseline = gw.fd_count();

        let mut seed = seed0;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        // The client's keep-alive connection: socket, bytes read past the last answer, its
        // number, and requests it carried so far.
        let mut conn: Option<(TcpStream, Vec<u8>, usize, usize)> = None;
        let (mut conns, mut reused_client) = (0usize, 0usize);
        let mut history: Vec<String> = Vec::new();
        let mut failures: Vec<String> = Vec::new();
        let deadline = Instant::now() + secs(25);
        let (mut steps, mut late) = (0, 0);
        let mut picked = [0usize; FAULT_CASES.len()];
        for i in 0..STEPS {
            if failures.len() >= 5 || Instant::now() > deadline {
                break;
            }
            steps += 1;
            let case = fault_case(next() % 100);
            picked[FAULT_CASES.iter().position(|c| c.name == case.name).unwrap()] += 1;
            let keep_alive = next() % 3 != 0;
            let tag = format!("q{i}");
            let started = Instant::now();
            let (got, how) = if keep_alive {
                if conn.is_none() {
                    conns += 1;
                    match connect_with(port, secs(6)) {
                        Ok(s) => conn = Some((s, Vec::new(), conns, 0)),
                        Err(e) => {
                            failures.push(format!("step {i} ({}): connect: {e}", case.name));
                            continue;
                        }
                    }
                }
                let (s, rest, n, used) = conn.as_mut().unwrap();
                *used += 1;
                if *used > 1 {
                    reused_client += 1;
                }
                let how = format!("client connection {n}, request {used} on it");
                (request_on(s, rest, &body(&tag, case)), how)
            } else {
                let got = connect_with(port, secs(6))
                    .map_err(|e| format!("connect: {e}"))
                    .and_then(|mut s| request_on(&mut s, &mut Vec::new(), &body(&tag, case)));
                (got, "new client connection".to_string())
            };
            let took = started.elapsed();
            let verdict = check_answer(&tag, case, &got).and_then(|()| {
                if took > secs(6) {
                    Err(format!("answered only after {took:?}"))
                } else {
                    Ok(())
                }
            });
            let summary = match &got {
                Ok(r) => format!("{} complete={} {:?}", r.status, r.complete, r.header("x-smg-error-code")),
                Err(e) => e.clone(),
            };
            history.push(format!("step {i}: {tag} {} on {how}: {summary} in {took:?}", case.name));
            if let Err(e) = verdict {
                let recent = history[history.len().saturating_sub(8)..].join("\n  ");
                failures.push(format!("step {i}: {tag} {} on {how}: {e}\n  last steps:\n  {recent}", case.name));
            }
            // The client's connection goes on only after a whole answer that did not close it,
            // and not always: the RNG also retires it.
            let whole = got
                .as_ref()
                .is_ok_and(|r| r.complete && !r.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close")));
            if keep_alive && (!whole || next() % 6 == 0) {
                conn = None;
            }
            // A stray answer written 50 ms late must land while its socket sits in the pool,
            // where the gateway can see it; one landing after the gateway reused the socket
            // would be a valid-looking answer to the next request, which no HTTP/1.1 client
            // can tell apart. So the next request waits for it.
            if case.name == "stray_late" {
                late += 1;
                let written = wait_until(secs(2), || w.state.late_strays.load(Ordering::SeqCst) >= late);
                assert!(written, "{driver}, seed {seed0:#x}: {tag}: the worker never wrote its late stray answer");
            }
        }
        drop(conn);
        let ran = t0.elapsed();
        let dirty = w.state.dirty_reuse.lock().unwrap().clone();
        let (posts, post_conns) = (w.state.posts.load(Ordering::SeqCst), w.state.post_conns.load(Ordering::SeqCst));
        eprintln!(
            "{driver}: {steps} steps in {ran:?}; worker saw {posts} POSTs on {post_conns} connections; \
             {reused_client} requests on a reused client connection; faults {:?}",
            FAULT_CASES.iter().map(|c| c.name).zip(picked).collect::<Vec<_>>()
        );
        let log = gw.log_text();
        assert!(
            failures.is_empty(),
            "{driver}, seed {seed0:#x} (SMG_FUZZ_SEED): {} of {steps} steps failed (a run stops after 5):\n{}\n\
             dirty reuse seen by the worker ({}): {:?}\ngateway log tail:\n{}",
            failures.len(),
            failures.join("\n"),
            dirty.len(),
            &dirty[..dirty.len().min(5)],
            tail(&log)
        );
        assert!(
            dirty.is_empty(),
            "{driver}, seed {seed0:#x}: the gateway reused {} dirty connections; first: {:?}",
            dirty.len(),
            &dirty[..dirty.len().min(5)]
        );
        assert_eq!(steps, STEPS, "{driver}, seed {seed0:#x}: only {steps} of {STEPS} steps within {:?}", secs(25));
        // The run must have exercised what it is about.
        assert!(
            posts >= post_conns + STEPS / 6,
            "precondition: only {posts} POSTs on {post_conns} worker connections: the pool was rarely reused"
        );
        assert!(reused_client >= STEPS / 5, "precondition: only {reused_client} requests on reused client connections");
        assert!(gw.alive(), "{driver}: gateway died; log:\n{}", tail(&gw.log_text()));
        clean("final").unwrap_or_else(|e| panic!("{driver}, seed {seed0:#x}: a clean request after the run: {e}"));
        let mut now = gw.fd_count();
        let settled = wait_until(secs(8), || {
            now = gw.fd_count();
            now <= baseline + 2
        });
        assert!(settled, "{driver}, seed {seed0:#x}: descriptors: baseline {baseline}, still {now} after the run");
    });
}

/// A bug in one request (a debug-build fault hook panics after admission) ends that request
/// with 500 internal_error; the permit it held, the other connections and the shard go on.
#[test]
fn a_panicking_request_costs_only_itself() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gateway(
            legacy,
            &w.url(),
            &["--cores", "1", "--max-concurrent-requests", "1", "--rate-limit-tokens-per-second", "0"],
        );
        let chat = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        for _ in 0..3 {
            let r = post(gw.port, "/v1/chat/completions", chat, &["X-SMG-Debug-Panic: 1"]);
            assert_eq!(r.status, 500, "{}", r.text());
            assert_eq!(r.header("x-smg-error-code"), Some("internal_error"));
            // The one permit came back: the next request is admitted at once.
            assert_eq!(post(gw.port, "/v1/chat/completions", chat, &[]).status, 200);
        }
        assert!(gw.log_has("panicked"), "the panic is logged");
        let mut gw = gw;
        assert!(gw.alive());
    });
}

#[test]
fn a_response_over_the_payload_cap_is_refused() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = Gateway::start(legacy, &["--worker-urls", &w.url(), "--max-payload-size", "100000"]);
        gw.ready_workers(1);
        // Declared over the cap: the gateway can still say so.
        let r = post(gw.port, "/v1/completions", r#"{"model":"m","prompt":"x","fake":"big","bytes":200000}"#, &[]);
        assert_eq!(r.status, 502, "{}", r.text());
        assert_eq!(r.json()["error"]["code"].as_str(), Some("upstream_response_too_large"));
        assert_eq!(w.requests().len(), 1, "not retried: another worker would answer the same");
        // Within the cap: whole.
        let r = post(gw.port, "/v1/completions", r#"{"model":"m","prompt":"x","fake":"big","bytes":90000}"#, &[]);
        assert_eq!((r.status, r.body.len()), (200, 90000));
        // Chunked, so only known once it is over: read whole before a byte goes out, and
        // refused as the declared one is (chat and completions alike), never cut after a 200.
        for (path, body) in [
            ("/v1/completions", r#"{"model":"m","prompt":"x","fake":"big","bytes":300000,"chunked":true}"#),
            (
                "/v1/chat/completions",
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"fake":"big","bytes":300000,"chunked":true}"#,
            ),
        ] {
            let sent = w.requests().len();
            let r = post(gw.port, path, body, &[]);
            assert_eq!(r.status, 502, "{path}: {}", r.text());
            assert_eq!(r.json()["error"]["code"].as_str(), Some("upstream_response_too_large"), "{path}");
            assert_eq!(w.requests().len(), sent + 1, "{path}: not retried");
        }
        // A chunked answer within the cap arrives whole.
        let r = post(
            gw.port,
            "/v1/completions",
            r#"{"model":"m","prompt":"x","fake":"big","bytes":99000,"chunked":true}"#,
            &[],
        );
        assert!(r.status == 200 && r.complete && r.body.len() == 99000, "{} {} bytes", r.status, r.body.len());
        // The gateway goes on.
        assert_eq!(post(gw.port, "/v1/completions", r#"{"model":"m","prompt":"x"}"#, &[]).status, 200);
    });
}
