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
        // The first accept waits once before the loop starts listening for it.
        std::thread::sleep(Duration::from_millis(250));
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
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(http(sim.port(), "GET", "/health", "").status, 200);

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
