//! The data plane through the real binary on loopback, under io_uring and epoll.

// clippy.toml's house rules are the gateway's: a test's threads are not shards and may block.
#![allow(clippy::disallowed_methods)]

mod support;

use std::io::Write;
use std::time::{Duration, Instant};

use sonic_rs::JsonValueTrait;
use support::*;

fn gw_with(legacy: bool, w: &FakeWorker, extra: &[&str]) -> Gateway {
    let url = w.url();
    let mut args = vec!["--worker-urls", url.as_str()];
    if !extra.contains(&"--cores") {
        args.extend_from_slice(&["--cores", "2"]);
    }
    args.extend_from_slice(extra);
    let gw = Gateway::start(legacy, &args);
    gw.ready();
    gw
}

#[test]
fn cli_help_and_bad_flags() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_smg")).args(["launch", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--worker-urls",
        "--host",
        "--port",
        "--policy",
        "--max-payload-size",
        "--request-timeout-secs",
        "--upstream-pool-idle-timeout-secs",
        "--shutdown-grace-period-secs",
        "--request-id-headers",
        "--log-level",
        "--log-json",
        "--cores",
    ] {
        assert!(help.contains(flag), "help lacks {flag}:\n{help}");
    }
    for (args, needle) in [
        (vec!["--policy", "nope"], "--policy"),
        (vec!["--port", "abc"], "--port"),
        (vec!["--worker-urls", "ftp://x:1"], "--worker-urls"),
        (vec!["--cores", "0"], "--cores"),
        (vec!["--max-payload-size", "0"], "--max-payload-size"),
        (vec!["--log-level", "loud"], "--log-level"),
        (vec!["--host", "not-an-ip"], "--host"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_smg")).arg("launch").args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: error does not name {needle}: {err}");
    }
}

#[test]
fn readiness_models_and_health() {
    both_drivers(|legacy| {
        // A worker that is not up yet: readiness 503, models 503 plain text.
        let w = FakeWorker::start("org/model-a");
        w.state.healthy.store(false, std::sync::atomic::Ordering::SeqCst);
        let w2 = FakeWorker::start("org/model-a");
        w2.state.healthy.store(false, std::sync::atomic::Ordering::SeqCst);
        let (u1, u2) = (w.url(), w2.url());
        let gw = Gateway::start(legacy, &["--worker-urls", &u1, &u2]);
        assert_eq!(get(gw.port, "/readiness").status, 503);
        let m = get(gw.port, "/v1/models");
        assert_eq!((m.status, m.text().as_str()), (503, "No models available"));
        assert_eq!(m.header("content-type"), Some("text/plain"));
        assert_eq!(get(gw.port, "/liveness").status, 200);
        assert_eq!(get(gw.port, "/health").status, 200);
        // Not routable yet: no model known → 404 model_not_found.
        let r = post(
            gw.port,
            "/v1/chat/completions",
            r#"{"model":"org/model-a","messages":[{"role":"user","content":"hi"}]}"#,
            &[],
        );
        assert_eq!(r.status, 404);

        w.state.healthy.store(true, std::sync::atomic::Ordering::SeqCst);
        w2.state.healthy.store(true, std::sync::atomic::Ordering::SeqCst);
        gw.ready();
        let m = get(gw.port, "/v1/models");
        assert_eq!(m.status, 200);
        assert_eq!(
            m.text(),
            r#"{"object":"list","data":[{"id":"org/model-a","object":"model","created":0,"owned_by":"self_hosted"}]}"#
        );
        // HEAD gets headers only.
        let mut s = gw.connect();
        s.write_all(b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let r = read_response(&mut s, &mut Vec::new(), true).unwrap();
        assert_eq!(r.status, 200);
        assert!(r.body.is_empty());
        assert_eq!(r.header("content-length"), Some(m.body.len().to_string().as_str()));
    });
}

#[test]
fn forwards_body_bytes_and_only_allowed_headers() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        // Odd spacing and number spellings must reach the worker untouched.
        let body =
            r#"{ "messages":[{"role":"user","content":"hi"}],  "model" : "m", "top_p":0.95, "temperature":1e0 }"#;
        let r = post(
            gw.port,
            "/v1/chat/completions",
            body,
            &[
                "Authorization: Bearer sk-1",
                "Cookie: secret=1",
                "X-Request-ID: req-abc",
                "X-Request-ID-Span: s1",
                "traceparent: 00-1-2-01",
                "X-SMG-Routing-Key: k",
                "X-SMG-Routing-Tokens: 1,2,3",
                "X-Forwarded-For: 10.0.0.1",
                "anthropic-version: 2023-06-01",
            ],
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["sha"].as_str().unwrap(), sha_hex(body.as_bytes()));
        assert_eq!(r.header("x-request-id"), Some("req-abc"));
        assert_eq!(r.header("x-smg-routed-worker-id"), Some(w.url().as_str()));
        assert_eq!(r.header("x-smg-error-code"), None, "worker's X-SMG-Error-Code must be dropped");
        assert_eq!(r.header("keep-alive"), None, "hop-by-hop headers are dropped");
        assert_eq!(r.header("x-worker"), Some("1"));
        let rec = w.requests().pop().unwrap();
        assert_eq!(rec.body, body.as_bytes());
        for (h, want) in [
            ("authorization", Some("Bearer sk-1")),
            ("x-request-id", Some("req-abc")),
            ("x-request-id-span", Some("s1")),
            ("traceparent", Some("00-1-2-01")),
            ("x-smg-routing-key", Some("k")),
            ("anthropic-version", Some("2023-06-01")),
            ("cookie", None),
            ("x-smg-routing-tokens", None),
            ("x-forwarded-for", None),
        ] {
            assert_eq!(rec.header(h), want, "worker saw {h}");
        }
    });
}

#[test]
fn request_ids_generated_per_endpoint_and_from_configured_headers() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        for (path, prefix) in [
            ("/v1/chat/completions", "chatcmpl-"),
            ("/v1/completions", "cmpl-"),
            ("/generate", "gnt-"),
            ("/v1/embeddings", "embd-"),
        ] {
            let r =
                post(gw.port, path, r#"{"model":"m","prompt":"x","messages":[{"role":"user","content":"hi"}]}"#, &[]);
            assert_eq!(r.status, 200);
            assert!(r.header("x-request-id").unwrap().starts_with(prefix), "{path}: {:?}", r.header("x-request-id"));
        }
        let r = post(
            gw.port,
            "/v1/completions",
            r#"{"model":"m","prompt":"x"}"#,
            &["X-Correlation-ID: corr-1", "request-id: later"],
        );
        assert_eq!(r.header("x-request-id"), Some("corr-1"));
        drop(gw);
        let gw = gw_with(legacy, &w, &["--request-id-headers", "x-my-id"]);
        let r = post(
            gw.port,
            "/v1/completions",
            r#"{"model":"m","prompt":"x"}"#,
            &["X-Request-ID: ignored", "X-My-Id: mine"],
        );
        assert_eq!(r.header("x-request-id"), Some("mine"));
        // A head refused for its framing (two Content-Lengths) was still read whole: its 400
        // carries the client's own id, as SMG's does.
        let raw = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-My-Id: framed-1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}";
        let r = support::rogue::exchange(gw.port, raw.as_bytes(), Duration::from_secs(5)).unwrap();
        assert_eq!((r.status, r.header("x-request-id")), (400, Some("framed-1")), "{}", r.text());
        // A head that cannot be read gets a generated one.
        let r = support::rogue::exchange(gw.port, b"\x01\x02 junk\r\n\r\n", Duration::from_secs(5)).unwrap();
        assert_eq!(r.status, 400);
        assert!(r.header("x-request-id").is_some_and(|id| id.starts_with("req-")), "{:?}", r.header("x-request-id"));
    });
}

/// `min_tokens: 0` is forwarded as it came (the contract sets no lower bound); `max_tokens: 0`
/// stays a 400 (it becomes `max_completion_tokens`, which must be at least 1).
#[test]
fn min_tokens_zero_is_forwarded_and_max_tokens_zero_refused() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"min_tokens":0}"#;
        let r = post(gw.port, "/v1/chat/completions", body, &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(w.requests().pop().unwrap().body, body.as_bytes(), "forwarded as it came");
        let r = post(
            gw.port,
            "/v1/chat/completions",
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":0}"#,
            &[],
        );
        assert_eq!(r.status, 400, "{}", r.text());
    });
}

#[test]
fn every_inference_endpoint_is_forwarded() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        let paths = [
            "/v1/chat/completions",
            "/v1/completions",
            "/generate",
            "/v1/embeddings",
            "/v1/rerank",
            "/rerank",
            "/v1/responses",
            "/v1/messages",
            "/v1/classify",
            "/v1/tokenize",
            "/v1/detokenize",
        ];
        for p in paths {
            let r = post(
                gw.port,
                p,
                r#"{"model":"m","input":"x","prompt":"x","messages":[{"role":"user","content":"hi"}]}"#,
                &[],
            );
            assert_eq!(r.status, 200, "{p}");
        }
        let seen: Vec<String> = w.requests().into_iter().map(|r| r.path).collect();
        assert_eq!(seen, paths);
        // /generate without a model may go to any worker.
        assert_eq!(post(gw.port, "/generate", r#"{"text":"hi"}"#, &[]).status, 200);
    });
}

#[test]
fn gateway_errors_use_the_envelope() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        let r = post(
            gw.port,
            "/v1/chat/completions",
            r#"{"model":"other","messages":[{"role":"user","content":"hi"}]}"#,
            &[],
        );
        assert_eq!(r.status, 404);
        assert_eq!(r.header("x-smg-error-code"), Some("model_not_found"));
        let j = r.json();
        assert_eq!(j["error"]["type"].as_str(), Some("Not Found"));
        assert_eq!(j["error"]["code"].as_str(), Some("model_not_found"));
        assert!(j["error"]["param"].is_null());
        assert!(j["error"]["message"].as_str().unwrap().contains("other"));
        let r = get(gw.port, "/v1/nothing");
        assert_eq!(r.status, 404);
        assert_eq!(r.json()["error"]["type"].as_str(), Some("Not Found"));
        assert_eq!(r.header("x-smg-error-code"), Some(r.json()["error"]["code"].as_str().unwrap()));
        let r = get(gw.port, "/v1/chat/completions");
        assert_eq!(r.status, 405);
        assert_eq!(r.json()["error"]["type"].as_str(), Some("Method Not Allowed"));
    });
}

#[test]
fn chunked_upload_is_forwarded_byte_identical() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        let mut body = String::from(r#"{"model":"m","messages":[{"role":"user","content":""#);
        let mut seed = 7u64;
        for _ in 0..20_000 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            body.push((b'a' + (seed >> 59) as u8 % 26) as char);
        }
        body.push_str(r#""}]}"#);
        let mut s = gw.connect();
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n").unwrap();
        let bytes = body.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let n = (1 + (seed >> 52) as usize % 3000).min(bytes.len() - i);
            s.write_all(format!("{n:X};ext=1\r\n").as_bytes()).unwrap();
            s.write_all(&bytes[i..i + n]).unwrap();
            s.write_all(b"\r\n").unwrap();
            i += n;
        }
        s.write_all(b"0\r\nX-Trailer: 1\r\n\r\n").unwrap();
        let r = read_response(&mut s, &mut Vec::new(), false).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["sha"].as_str().unwrap(), sha_hex(bytes));
        let rec = w.requests().pop().unwrap();
        assert_eq!(rec.header("content-length"), Some(bytes.len().to_string().as_str()));
        assert_eq!(rec.header("transfer-encoding"), None);
    });
}

#[test]
fn sse_events_arrive_before_the_worker_finishes() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        let mut s = gw.connect();
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"fake":"sse","events":5,"gap_ms":150}"#;
        s.write_all(post_bytes("/v1/chat/completions", body, &[]).as_bytes()).unwrap();
        // Read the head and the first event as raw bytes, stamping when the event arrived.
        let mut raw = Vec::new();
        let first_event_at = loop {
            fill(&mut s, &mut raw).unwrap();
            if raw.windows(8).any(|x| x == b"\"i\":0}\n\n") {
                break Instant::now();
            }
        };
        let head = String::from_utf8_lossy(&raw).to_string();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.to_ascii_lowercase().contains("content-type: text/event-stream"));
        assert!(!head.to_ascii_lowercase().contains("x-smg-error-code"));
        let r = read_response(&mut s, &mut raw, false).unwrap();
        assert!(r.complete);
        let done = *w.state.stream_done_at.lock().unwrap().last().unwrap();
        assert!(done > first_event_at, "first event reached the client only after the worker finished");
        assert!(
            done - first_event_at >= Duration::from_millis(400),
            "events were held back: {:?}",
            done - first_event_at
        );
        let text = r.text();
        for i in 0..5 {
            assert!(text.contains(&format!("data: {{\"i\":{i}}}\n\n")), "{text}");
        }
        assert!(text.ends_with("data: [DONE]\n\n"));
    });
}

#[test]
fn worker_error_on_streaming_request_keeps_status_and_type() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        let r = post(
            gw.port,
            "/v1/chat/completions",
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"fake":"error","status":422}"#,
            &[],
        );
        assert_eq!(r.status, 422);
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.json()["error"]["message"].as_str(), Some("bad"));
        assert_eq!(r.header("x-smg-error-code"), None);
    });
}

#[test]
fn sequential_requests_reuse_upstream_connections() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        let before = w.state.accepted.load(std::sync::atomic::Ordering::SeqCst);
        let mut s = gw.connect();
        let mut rest = Vec::new();
        let req = post_bytes("/v1/completions", r#"{"model":"m","prompt":"x"}"#, &[]);
        for _ in 0..1000 {
            s.write_all(req.as_bytes()).unwrap();
            assert_eq!(read_response(&mut s, &mut rest, false).unwrap().status, 200);
        }
        let used = w.state.accepted.load(std::sync::atomic::Ordering::SeqCst) - before;
        assert!(used <= 2, "1000 sequential requests opened {used} upstream connections");
        assert_eq!(w.requests().len(), 1000);
    });
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        let mut s = gw.connect();
        let mut all = String::new();
        let bodies: Vec<String> = (0..8).map(|i| format!(r#"{{"model":"m","prompt":"p{i}"}}"#)).collect();
        for (i, b) in bodies.iter().enumerate() {
            if i == 3 {
                all.push_str("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
            }
            all.push_str(&post_bytes("/v1/completions", b, &[]));
        }
        s.write_all(all.as_bytes()).unwrap();
        let mut rest = Vec::new();
        for (i, b) in bodies.iter().enumerate() {
            if i == 3 {
                let m = read_response(&mut s, &mut rest, false).unwrap();
                assert!(m.text().contains("\"object\":\"list\""));
            }
            let r = read_response(&mut s, &mut rest, false).unwrap();
            assert_eq!(r.json()["sha"].as_str().unwrap(), sha_hex(b.as_bytes()), "response {i} out of order");
        }
    });
}

#[test]
fn expect_continue_and_keep_alive() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        let mut s = gw.connect();
        let body = r#"{"model":"m","prompt":"x"}"#;
        s.write_all(
            format!(
                "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .unwrap();
        let mut raw = Vec::new();
        fill(&mut s, &mut raw).unwrap();
        assert!(raw.starts_with(b"HTTP/1.1 100 Continue\r\n\r\n"), "{}", String::from_utf8_lossy(&raw));
        raw.drain(..25);
        s.write_all(body.as_bytes()).unwrap();
        assert_eq!(read_response(&mut s, &mut raw, false).unwrap().status, 200);
        // Same connection still usable; then Connection: close is honoured.
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let r = read_response(&mut s, &mut raw, false).unwrap();
        assert_eq!(r.header("connection"), Some("close"));
        assert!(closed_within(&mut s, Duration::from_secs(2)));
    });
}

#[test]
fn framing_errors_get_400_414_431_and_close() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        let cases: Vec<(Vec<u8>, u16)> = vec![
            (
                b"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                    .to_vec(),
                400,
            ),
            (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n".to_vec(), 400),
            (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(), 400),
            (b"GARBAGE\r\n\r\n".to_vec(), 400),
            (format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(9000)).into_bytes(), 414),
            (format!("GET / HTTP/1.1\r\nX-Big: {}\r\n\r\n", "b".repeat(40_000)).into_bytes(), 431),
            (
                (0..120)
                    .map(|i| format!("X-{i}: v\r\n"))
                    .fold(String::from("GET / HTTP/1.1\r\n"), |a, b| a + &b)
                    .into_bytes(),
                431,
            ),
        ];
        for (raw, want) in cases {
            let mut s = gw.connect();
            let _ = s.write_all(&raw);
            let r = read_response(&mut s, &mut Vec::new(), false).unwrap();
            assert_eq!(r.status, want, "{}", String::from_utf8_lossy(&raw[..raw.len().min(80)]));
            assert!(closed_within(&mut s, Duration::from_secs(3)), "connection must close after a framing error");
        }
        assert!(w.requests().is_empty(), "nothing malformed may reach the worker");
    });
}

#[test]
fn oversize_body_gets_413_and_next_connection_is_served() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &["--max-payload-size", "1000"]);
        let big = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(5000));
        let mut s = gw.connect();
        // Only the head is sent: the answer must not wait for the body.
        s.write_all(
            format!("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", big.len()).as_bytes(),
        )
        .unwrap();
        let r = read_response(&mut s, &mut Vec::new(), false).unwrap();
        assert_eq!(r.status, 413);
        assert_eq!(r.header("x-smg-error-code"), Some("request_body_too_large"));
        assert_eq!(r.json()["error"]["type"].as_str(), Some("Payload Too Large"));
        // Chunked bodies are cut off once they pass the limit.
        let mut s = gw.connect();
        s.write_all(format!("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{big}\r\n0\r\n\r\n", big.len()).as_bytes()).unwrap();
        assert_eq!(read_response(&mut s, &mut Vec::new(), false).unwrap().status, 413);
        let ok = post(gw.port, "/v1/completions", r#"{"model":"m","prompt":"x"}"#, &[]);
        assert_eq!(ok.status, 200);
        assert_eq!(w.requests().len(), 1);
    });
}

#[test]
fn client_abort_mid_stream_closes_upstream_quickly() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        let took = upstream_close_after_abort(&w, &gw, 1000, 0);
        assert!(took < patience(Duration::from_millis(100)), "upstream closed after {took:?}");
    });
}

/// Starts a 100-event stream with `gap_ms` between events, drops the client once event
/// `after` arrived, and returns how long the gateway took to close the worker's socket.
fn upstream_close_after_abort(w: &FakeWorker, gw: &Gateway, gap_ms: u64, after: usize) -> Duration {
    let mut s = gw.connect();
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"stream":true,"fake":"sse","events":100,"gap_ms":{gap_ms}}}"#
    );
    s.write_all(post_bytes("/v1/chat/completions", &body, &[]).as_bytes()).unwrap();
    let mut raw = Vec::new();
    let marker = format!("\"i\":{after}}}\n\n");
    while !raw.windows(marker.len()).any(|x| x == marker.as_bytes()) {
        fill(&mut s, &mut raw).unwrap();
    }
    let closes_before = w.state.closed_at.lock().unwrap().len();
    let t0 = Instant::now();
    drop(s);
    // The worker watches its socket between events and stamps the gateway's close.
    let until = t0 + patience(Duration::from_secs(3));
    let closed = loop {
        if w.state.closed_at.lock().unwrap().len() > closes_before {
            break *w.state.closed_at.lock().unwrap().last().unwrap();
        }
        assert!(Instant::now() < until, "gateway never closed the upstream connection");
        std::thread::sleep(Duration::from_millis(2));
    };
    closed.saturating_duration_since(t0)
}

/// Gaps over 20 ms put the relay into its watched mode (one client watch held across
/// reads on a dup of the client socket): the stream must still arrive whole, a request
/// pipelined mid-stream must be answered after it, and a client leaving must close the
/// worker's socket at once.
#[test]
fn slow_stream_is_relayed_whole_and_still_watched() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        let slow = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"fake":"sse","events":6,"gap_ms":60}"#;

        let mut s = gw.connect();
        s.write_all(post_bytes("/v1/chat/completions", slow, &[]).as_bytes()).unwrap();
        let mut raw = Vec::new();
        while !raw.windows(8).any(|x| x == b"\"i\":3}\n\n") {
            fill(&mut s, &mut raw).unwrap();
        }
        let next = r#"{"model":"m","prompt":"after the stream"}"#;
        s.write_all(post_bytes("/v1/completions", next, &[]).as_bytes()).unwrap();
        let r = read_response(&mut s, &mut raw, false).unwrap();
        assert!(r.complete);
        let text = r.text();
        for i in 0..6 {
            assert!(text.contains(&format!("data: {{\"i\":{i}}}\n\n")), "{text}");
        }
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        let r2 = read_response(&mut s, &mut raw, false).unwrap();
        assert_eq!(r2.status, 200);
        assert_eq!(r2.json()["sha"].as_str().unwrap(), sha_hex(next.as_bytes()));

        // By event 3 two reads have waited past 20 ms: the relay holds one watch.
        let took = upstream_close_after_abort(&w, &gw, 60, 3);
        assert!(took < patience(Duration::from_millis(100)), "upstream closed after {took:?}");
    });
}

#[test]
fn upstream_dying_mid_stream_ends_the_client_response() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        let mut s = gw.connect();
        s.write_all(
            post_bytes(
                "/v1/chat/completions",
                r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"fake":"die","events":2}"#,
                &[],
            )
            .as_bytes(),
        )
        .unwrap();
        let r = read_response(&mut s, &mut Vec::new(), false).unwrap();
        assert_eq!(r.status, 200);
        assert!(!r.complete, "a cut stream must not end with a clean terminator");
        assert!(r.text().contains("\"i\":1"));
        assert!(closed_within(&mut s, Duration::from_secs(3)));
        assert!(gw.log_has("client response cut short"), "{}", gw.log_text());
        // The shard is fine.
        assert_eq!(post(gw.port, "/v1/completions", r#"{"model":"m","prompt":"x"}"#, &[]).status, 200);
    });
}

#[test]
fn stale_pooled_connection_is_retried_silently() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &["--cores", "1"]);
        let mut s = gw.connect();
        let mut rest = Vec::new();
        let closed = || w.state.closed_at.lock().unwrap().len();
        for i in 0..20 {
            // "close" answers, then drops the connection the gateway just pooled.
            let before = closed();
            let body = format!(r#"{{"model":"m","prompt":"x","fake":"close","i":{i}}}"#);
            s.write_all(post_bytes("/v1/completions", &body, &[]).as_bytes()).unwrap();
            let r = read_response(&mut s, &mut rest, false).unwrap();
            assert_eq!(r.status, 200, "request {i}: {}", r.text());
            // The next request goes once the worker has dropped that connection: the pooled
            // one is stale by then.
            assert!(
                wait_until(patience(Duration::from_secs(5)), || closed() > before),
                "precondition: the worker never closed the connection of request {i}"
            );
        }
    });
}

#[test]
fn connect_failure_is_502_then_503_once_marked_down() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &[]);
        w.stop();
        assert!(
            wait_until(patience(Duration::from_secs(5)), || std::net::TcpStream::connect(("127.0.0.1", w.port))
                .is_err()),
            "precondition: the stopped worker still accepts connections"
        );
        let r = post(gw.port, "/v1/completions", r#"{"model":"m","prompt":"x"}"#, &[]);
        assert!(r.status == 502 || r.status == 503, "{} {}", r.status, r.text());
        if r.status == 502 {
            assert_eq!(r.json()["error"]["type"].as_str(), Some("Bad Gateway"));
            assert_eq!(r.header("x-smg-error-code"), Some(r.json()["error"]["code"].as_str().unwrap()));
        }
        // The connect failure triggers a re-probe; the worker is then down → 503.
        let until = Instant::now() + patience(Duration::from_secs(10));
        loop {
            let r = post(gw.port, "/v1/completions", r#"{"model":"m","prompt":"x"}"#, &[]);
            if r.status == 503 {
                assert_eq!(r.header("x-smg-error-code"), Some("no_available_workers"));
                assert_eq!(r.json()["error"]["type"].as_str(), Some("Service Unavailable"));
                break;
            }
            assert!(Instant::now() < until, "never became 503: {}", r.status);
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(get(gw.port, "/readiness").status, 503);
    });
}

#[test]
fn no_response_head_within_timeout_is_504() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(legacy, &w, &["--request-timeout-secs", "1"]);
        let r = post(gw.port, "/v1/completions", r#"{"model":"m","prompt":"x","fake":"stall"}"#, &[]);
        assert_eq!(r.status, 504);
        assert_eq!(r.json()["error"]["type"].as_str(), Some("Gateway Timeout"));
        assert_eq!(r.header("x-smg-error-code"), Some(r.json()["error"]["code"].as_str().unwrap()));
    });
}

#[test]
fn idle_and_slow_clients_are_timed_out() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gw_with(
            legacy,
            &w,
            &[
                "--client-idle-timeout-secs",
                "1",
                "--client-read-timeout-secs",
                "1",
                "--stream-body-stall-timeout-secs",
                "1",
            ],
        );
        // Idle keep-alive connection.
        let mut idle = gw.connect();
        assert!(closed_within(&mut idle, Duration::from_secs(4)));
        // Slow head: a few bytes, then silence.
        let mut slow = gw.connect();
        slow.write_all(b"POST /v1/completions HTTP/1.1\r\nHo").unwrap();
        assert!(closed_within(&mut slow, Duration::from_secs(4)));
        // Stalled body: 408 request_body_stalled.
        let mut stalled = gw.connect();
        stalled
            .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\"")
            .unwrap();
        let r = read_response(&mut stalled, &mut Vec::new(), false).unwrap();
        assert_eq!(r.status, 408);
        assert_eq!(r.header("x-smg-error-code"), Some("request_body_stalled"));
    });
}

/// Seeded generator of hostile heads: truncations, bit flips, junk bytes, huge values.
fn hostile(seed: &mut u64) -> Vec<u8> {
    let mut next = || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    let base = post_bytes(
        "/v1/chat/completions",
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        &["Authorization: Bearer x"],
    )
    .into_bytes();
    let mut b = base.clone();
    match next() % 7 {
        0 => b.truncate((next() as usize) % b.len()),
        1 => {
            for _ in 0..(1 + next() % 8) {
                let i = (next() as usize) % b.len();
                b[i] ^= 1 << (next() % 8);
            }
        }
        2 => {
            let i = (next() as usize) % b.len();
            let junk: Vec<u8> = (0..(next() % 64)).map(|_| next() as u8).collect();
            b.splice(i..i, junk);
        }
        3 => b = (0..(next() % 2048)).map(|_| next() as u8).collect(),
        4 => b = format!("POST /v1/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n", next()).into_bytes(),
        5 => {
            b = format!("POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\nab", next())
                .into_bytes()
        }
        _ => b = [b"GET /".to_vec(), vec![b'a'; (next() % 20_000) as usize], b" HTTP/1.1\r\n\r\n".to_vec()].concat(),
    }
    b
}

#[test]
fn hostile_heads_never_crash_or_leak() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let mut gw = gw_with(legacy, &w, &["--client-read-timeout-secs", "1", "--client-idle-timeout-secs", "1"]);
        // Warm up pools and lazily created state before taking the baseline, which waits for
        // the gateway to have closed the warm-up connection (it closes on the client's FIN).
        let mut warm = gw.connect();
        warm.write_all(post_bytes("/v1/completions", r#"{"model":"m","prompt":"x"}"#, &[]).as_bytes()).unwrap();
        assert_eq!(read_response(&mut warm, &mut Vec::new(), false).unwrap().status, 200);
        warm.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(closed_within(&mut warm, Duration::from_secs(5)), "precondition: the warm-up connection stayed open");
        drop(warm);
        let baseline = gw.fd_count();
        let mut seed = 0x5eed_u64;
        let mut conns = Vec::new();
        for i in 0..300 {
            let mut s = gw.connect();
            let _ = s.write_all(&hostile(&mut seed));
            if i % 3 == 0 {
                let _ = s.shutdown(std::net::Shutdown::Write);
            }
            conns.push(s);
            if conns.len() >= 50 {
                conns.clear();
            }
        }
        drop(conns);
        assert!(gw.alive(), "gateway died; log:\n{}", gw.log_text());
        // Valid traffic is still served.
        assert_eq!(post(gw.port, "/v1/completions", r#"{"model":"m","prompt":"x"}"#, &[]).status, 200);
        // Every hostile connection is closed within the client timeouts; fds return to baseline.
        let until = Instant::now() + patience(Duration::from_secs(8));
        loop {
            let now = gw.fd_count();
            if now <= baseline + 2 {
                break;
            }
            assert!(Instant::now() < until, "fd leak: baseline {baseline}, now {now}");
            std::thread::sleep(Duration::from_millis(100));
        }
    });
}

#[test]
fn sigterm_drains_in_flight_streams_and_exits_zero() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let mut gw = gw_with(legacy, &w, &["--shutdown-grace-period-secs", "10"]);
        let mut s = gw.connect();
        s.write_all(
            post_bytes(
                "/v1/chat/completions",
                r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"fake":"sse","events":6,"gap_ms":100}"#,
                &[],
            )
            .as_bytes(),
        )
        .unwrap();
        let mut raw = Vec::new();
        fill(&mut s, &mut raw).unwrap();
        gw.signal(libc::SIGTERM);
        let r = read_response(&mut s, &mut raw, false).unwrap();
        assert!(r.complete, "in-flight stream must finish: {}", r.text());
        assert!(r.text().contains("[DONE]"));
        let until = Instant::now() + patience(Duration::from_secs(10));
        let status = loop {
            if let Some(st) = gw.child.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < until, "gateway did not exit after draining");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "exit status {status:?}");
        assert!(std::net::TcpStream::connect(("127.0.0.1", gw.port)).is_err(), "still accepting after drain");
    });
}
