//! Every smg-sim fault mode and the run-time control endpoint, under both drivers.

mod common;

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use common::*;
use sonic_rs::JsonValueTrait;

#[test]
fn fail_rate_and_status() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--fail-rate", "1", "--fail-status", "503"], legacy);
        let r = http(sim.port(), "POST", "/v1/chat/completions", &chat_body(""));
        assert_eq!(r.status, 503);
        assert!(r.json()["error"]["message"].as_str().is_some());
        // Health and info endpoints are not affected.
        assert_eq!(http(sim.port(), "GET", "/health", "").status, 200);
        // The control endpoint turns failures off at run time.
        let c = http(sim.port(), "POST", "/sim/control", r#"{"fail_rate":0}"#);
        assert_eq!(c.status, 200);
        assert_eq!(c.json()["settings"]["fail_rate"].as_f64(), Some(0.0));
        assert_eq!(http(sim.port(), "POST", "/v1/chat/completions", &chat_body("")).status, 200);
        assert_eq!(http(sim.port(), "POST", "/sim/control", r#"{"nope":1}"#).status, 400);
    }
}

#[test]
fn hang_rate_never_answers() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--hang-rate", "1"], legacy);
        let req = request_bytes("POST", "/v1/chat/completions", &chat_body(""));
        let err = http_raw(sim.port(), &req, Duration::from_millis(300)).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{err:?}");
        http(sim.port(), "POST", "/sim/control", r#"{"hang_rate":0}"#);
        assert_eq!(http(sim.port(), "POST", "/v1/chat/completions", &chat_body("")).status, 200);
        assert_eq!(http(sim.port(), "GET", "/sim/stats", "").json()["hung"].as_u64(), Some(1));
    }
}

#[test]
fn truncated_streams_and_bodies() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--truncate-rate", "1", "--truncate-after-tokens", "3"], legacy);
        let req = request_bytes("POST", "/v1/chat/completions", &chat_body(r#","max_tokens":10,"stream":true"#));
        let raw = http_raw(sim.port(), &req, Duration::from_secs(5)).unwrap();
        let text = String::from_utf8_lossy(&raw);
        assert_eq!(count(&raw, b"\"content\":\" hi\""), 3, "{text}");
        assert!(!text.contains("[DONE]"));
        assert!(!text.ends_with("0\r\n\r\n"), "stream must end without the last chunk");

        let req = request_bytes("POST", "/v1/chat/completions", &chat_body(r#","max_tokens":10"#));
        let raw = http_raw(sim.port(), &req, Duration::from_secs(5)).unwrap();
        let r = parse_response(&raw);
        let head = r.head.to_ascii_lowercase();
        let declared: usize =
            head.split("content-length: ").nth(1).unwrap().split("\r\n").next().unwrap().parse().unwrap();
        assert!(r.body.len() < declared, "body {} of {declared}", r.body.len());
        assert_eq!(http(sim.port(), "GET", "/sim/stats", "").json()["truncated"].as_u64(), Some(2));
    }
}

#[test]
fn die_after_closes_the_port() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0,0", "--die-after", "2"], legacy);
        let p = sim.port();
        for _ in 0..2 {
            assert_eq!(http(p, "POST", "/v1/chat/completions", &chat_body("")).status, 200);
        }
        // The port is closed: connections are refused (allow the accept loop a moment to stop).
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match std::net::TcpStream::connect(("127.0.0.1", p)) {
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => break,
                _ if Instant::now() > deadline => panic!("port {p} still open after die-after"),
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        // Other workers of the process live on.
        assert_eq!(http(sim.ports[1], "GET", "/health", "").status, 200);
    }
}

#[test]
fn die_after_drops_idle_keepalive_connections() {
    use std::io::{Read, Write};
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--die-after", "1"], legacy);
        let mut idle = std::net::TcpStream::connect(("127.0.0.1", sim.port())).unwrap();
        idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        idle.write_all(b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n").unwrap();
        let mut buf = [0u8; 256];
        assert!(idle.read(&mut buf).unwrap() > 0);
        assert_eq!(http(sim.port(), "POST", "/v1/chat/completions", &chat_body("")).status, 200);
        // The idle keep-alive connection is shut down like a crashed process's would be.
        let mut rest = Vec::new();
        let n = idle.read_to_end(&mut rest);
        assert!(matches!(n, Ok(0)) || n.is_err(), "{n:?}");
    }
}

#[test]
fn slow_accept_delays_service() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--accept-delay-ms", "200"], legacy);
        // The first accept waits once before the loop starts listening for it: an untimed
        // request takes that wait, so the timed ones below see only the per-accept delay.
        assert_eq!(http(sim.port(), "GET", "/health", "").status, 200);
        let t0 = Instant::now();
        assert_eq!(http(sim.port(), "GET", "/health", "").status, 200);
        let a = t0.elapsed();
        let t0 = Instant::now();
        assert_eq!(http(sim.port(), "GET", "/health", "").status, 200);
        let b = t0.elapsed();
        assert!(a.max(b) >= Duration::from_millis(150), "{a:?} {b:?}");
    }
}

#[test]
fn unhealthy_start_and_health_flip() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--unhealthy-for-ms", "400"], legacy);
        assert_eq!(http(sim.port(), "GET", "/health", "").status, 503);
        // Healthy from 400 ms after the start; one that never flips is given 2 s.
        assert!(
            wait_until(patience(Duration::from_secs(2)), || http(sim.port(), "GET", "/health", "").status == 200),
            "still unhealthy after --unhealthy-for-ms 400"
        );

        let sim = Sim::start(&["--ports", "0", "--start-unhealthy"], legacy);
        assert_eq!(http(sim.port(), "GET", "/health", "").status, 503);
        // Inference still works: only the probe reports unhealthy.
        assert_eq!(http(sim.port(), "POST", "/v1/chat/completions", &chat_body("")).status, 200);
        http(sim.port(), "POST", "/sim/control", r#"{"healthy":true}"#);
        assert_eq!(http(sim.port(), "GET", "/health", "").status, 200);
        http(sim.port(), "POST", "/sim/control", r#"{"healthy":false}"#);
        assert_eq!(http(sim.port(), "GET", "/health", "").status, 503);
        assert_eq!(http(sim.port(), "GET", "/health_generate", "").status, 503);
    }
}

#[test]
fn control_changes_timing_at_run_time() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0"], legacy);
        http(sim.port(), "POST", "/sim/control", r#"{"ttft_ms":150}"#);
        let t0 = Instant::now();
        assert_eq!(http(sim.port(), "POST", "/v1/chat/completions", &chat_body("")).status, 200);
        assert!(t0.elapsed() >= Duration::from_millis(140), "{:?}", t0.elapsed());
    }
}

#[test]
fn flapping_health() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--flap-health-ms", "300"], legacy);
        let p = sim.port();
        assert_eq!(http(p, "GET", "/sim/stats", "").json()["settings"]["flap_health_ms"].as_u64(), Some(300));
        // Over 1.2 s (four phases) the probe must see both answers.
        let (mut ok, mut down) = (0, 0);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(1200) {
            match http(p, "GET", "/health", "").status {
                200 => ok += 1,
                503 => down += 1,
                s => panic!("status {s}"),
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        assert!(ok > 0 && down > 0, "ok {ok} down {down}");

        // The knob restarts the phase, healthy first: up for 500 ms, down for 500 ms, up again.
        let at = |ms: u64, t0: Instant| {
            std::thread::sleep((t0 + Duration::from_millis(ms)).saturating_duration_since(Instant::now()))
        };
        let t0 = Instant::now();
        http(p, "POST", "/sim/control", r#"{"flap_health_ms":500}"#);
        assert_eq!(http(p, "GET", "/health", "").status, 200);
        at(700, t0);
        assert_eq!(http(p, "GET", "/health", "").status, 503);
        // Forcing wins over flapping; null hands health back to the flap.
        http(p, "POST", "/sim/control", r#"{"healthy":true}"#);
        assert_eq!(http(p, "GET", "/health", "").status, 200);
        http(p, "POST", "/sim/control", r#"{"healthy":null}"#);
        assert_eq!(http(p, "GET", "/health", "").status, 503);
        at(1250, t0);
        assert_eq!(http(p, "GET", "/health", "").status, 200);
        // 0 turns flapping off: healthy from then on.
        http(p, "POST", "/sim/control", r#"{"flap_health_ms":0}"#);
        at(1750, t0);
        assert_eq!(http(p, "GET", "/health", "").status, 200);
    }
}

/// Sends `req` on a keep-alive connection and reads exactly one response; returns its head
/// (lower-cased) and whether the server closed the connection right after it.
fn one_keepalive_response(s: &mut std::net::TcpStream, req: &[u8]) -> (String, bool) {
    use std::io::{Read, Write};
    s.write_all(req).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed before a full response: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
        let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4) else { continue };
        let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
        let complete = match head.split("content-length: ").nth(1) {
            Some(v) => raw.len() - end >= v.split("\r\n").next().unwrap().parse::<usize>().unwrap(),
            None => raw.ends_with(b"0\r\n\r\n"),
        };
        if complete {
            s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
            let closed = matches!(s.read(&mut buf), Ok(0));
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            return (head, closed);
        }
    }
}

#[test]
fn close_after_every_response() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--close-after-response"], legacy);
        let p = sim.port();
        let body = chat_body(r#","max_tokens":3"#);
        let stream_body = chat_body(r#","max_tokens":3,"stream":true"#);
        let reqs = [
            "GET /health HTTP/1.1\r\nhost: t\r\n\r\n".to_string(),
            format!("POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}", body.len()),
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{stream_body}",
                stream_body.len()
            ),
        ];
        for req in &reqs {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", p)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let (head, closed) = one_keepalive_response(&mut s, req.as_bytes());
            assert!(head.starts_with("http/1.1 200") && head.contains("connection: close"), "{head}");
            assert!(closed, "connection left open after {req:?}");
        }
        // The knob turns it off: the same connection then serves every request.
        let c = http(p, "POST", "/sim/control", r#"{"close_after_response":false}"#).json();
        assert_eq!(c["settings"]["close_after_response"].as_bool(), Some(false));
        let mut s = std::net::TcpStream::connect(("127.0.0.1", p)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        for req in &reqs {
            let (head, closed) = one_keepalive_response(&mut s, req.as_bytes());
            assert!(!head.contains("connection: close") && !closed, "{head}");
        }
        http(p, "POST", "/sim/control", r#"{"close_after_response":true}"#);
        let (head, closed) = one_keepalive_response(&mut s, reqs[0].as_bytes());
        assert!(head.contains("connection: close") && closed, "{head}");
    }
}

/// Starts a long stream (200 tokens, 20 ms apart) and reads until its first token arrived.
fn start_long_stream(port: u16) -> (std::net::TcpStream, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&request_bytes("POST", "/v1/chat/completions", &chat_body(r#","max_tokens":200,"stream":true"#)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while count(&got, b"\"content\":\" hi\"") == 0 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    (s, got)
}

/// Reads the rest of a stream that must be cut soon: returns everything received, asserting it
/// ended early, without [DONE] or the last chunk.
fn assert_cut(mut s: std::net::TcpStream, mut got: Vec<u8>) {
    use std::io::Read;
    let t0 = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            // A reset is as good as a FIN for a killed worker.
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("stream not cut: {e}"),
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert!(t0.elapsed() < patience(Duration::from_secs(2)), "cut took {:?}", t0.elapsed());
    assert!(count(&got, b"\"content\":\" hi\"") < 200, "{text}");
    assert!(!text.contains("[DONE]") && !text.ends_with("0\r\n\r\n"), "stream finished: {text}");
}

fn wait_refused(p: u16) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::net::TcpStream::connect(("127.0.0.1", p)) {
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => break,
            _ if Instant::now() > deadline => panic!("port {p} still open after dying"),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

#[test]
fn die_now_cuts_streams_mid_body() {
    use std::io::{Read, Write};
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0,0", "--itl-ms", "20"], legacy);
        let p = sim.port();
        let streams: Vec<_> = (0..3).map(|_| start_long_stream(p)).collect();
        let mut idle = std::net::TcpStream::connect(("127.0.0.1", p)).unwrap();
        idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        idle.write_all(b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n").unwrap();
        let mut buf = [0u8; 256];
        assert!(idle.read(&mut buf).unwrap() > 0);

        // The control request itself is answered, then its connection closes too.
        let r = http(p, "POST", "/sim/control", r#"{"die":true}"#);
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["dead"].as_bool(), Some(true));
        for (s, got) in streams {
            assert_cut(s, got);
        }
        let n = idle.read(&mut buf);
        assert!(matches!(n, Ok(0)) || n.is_err(), "{n:?}");
        wait_refused(p);
        assert_eq!(http(sim.ports[1], "GET", "/health", "").status, 200);
    }
}

#[test]
fn die_after_cuts_streams_mid_body() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--itl-ms", "20", "--die-after", "2"], legacy);
        let p = sim.port();
        let (s, got) = start_long_stream(p);
        // The second request reaches die-after; when it completes the worker dies mid-way through the first.
        let r = http(p, "POST", "/v1/chat/completions", &chat_body(r#","max_tokens":1"#));
        assert_eq!(r.status, 200);
        assert_cut(s, got);
        wait_refused(p);
    }
}

#[test]
fn reported_load_makes_a_worker_look_busy() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--worker", "0:m:vllm", "--max-running", "8"], legacy);
        let (p, v) = (sim.ports[0], sim.ports[1]);
        let c = http(p, "POST", "/sim/control", r#"{"reported_load":50}"#).json();
        assert_eq!(c["settings"]["reported_load"].as_u64(), Some(50));
        let l = http(p, "GET", "/v1/loads", "").json();
        assert_eq!(l["loads"][0]["num_running_reqs"].as_u64(), Some(8));
        assert_eq!(l["loads"][0]["num_waiting_reqs"].as_u64(), Some(42));
        assert_eq!(l["loads"][0]["num_total_reqs"].as_u64(), Some(50));
        assert_eq!(l["aggregate"]["total_reqs"].as_u64(), Some(50));
        assert_eq!(http(p, "GET", "/get_load", "").json()[0]["num_reqs"].as_u64(), Some(50));
        // Real traffic is unaffected, and the real /sim/stats figures stay real.
        assert_eq!(http(p, "POST", "/v1/chat/completions", &chat_body("")).status, 200);
        assert_eq!(http(p, "GET", "/sim/stats", "").json()["running"].as_u64(), Some(0));
        http(p, "POST", "/sim/control", r#"{"reported_load":null}"#);
        assert_eq!(http(p, "GET", "/v1/loads", "").json()["loads"][0]["num_total_reqs"].as_u64(), Some(0));
        http(v, "POST", "/sim/control", r#"{"reported_load":5}"#);
        assert_eq!(http(v, "GET", "/load", "").json()["server_load"].as_u64(), Some(5));
    }
}
