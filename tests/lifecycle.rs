//! Request life-cycle: what the gateway answers before a body arrives, what every answer it
//! makes carries, status lines, upstream sockets that die while pooled, and a drain that
//! resets none of the connections the kernel completed. Each test runs under io_uring and
//! epoll, beside the others.
// A test's threads are not shards: they sleep, and time what the gateway does.
#![allow(clippy::disallowed_methods)]

mod support;

use std::io::Write;
use std::time::Duration;

use sonic_rs::JsonValueTrait;
use support::rogue::*;
use support::*;

fn secs(n: u64) -> Duration {
    patience(Duration::from_secs(n))
}

fn gateway(legacy: bool, urls: &[String], extra: &[&str]) -> Gateway {
    let mut args: Vec<&str> = vec!["--worker-urls"];
    args.extend(urls.iter().map(String::as_str));
    if !extra.contains(&"--cores") {
        args.extend_from_slice(&["--cores", "2"]);
    }
    args.extend_from_slice(extra);
    Gateway::start_with(legacy, &args, None)
}

/// A request the gateway can answer from its head alone must be answered at once, however
/// large the body it announces, and the connection then closed (its body was never read).
#[test]
fn unknown_path_with_huge_body_is_answered_before_the_body() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gateway(legacy, &[w.url()], &[]);
        gw.ready();
        for (line, want, code) in [
            ("POST /nope HTTP/1.1", 404, Some("not_found")),
            ("GET /v1/models HTTP/1.1", 200, None),
            ("GET /v1/chat/completions HTTP/1.1", 405, Some("method_not_allowed")),
        ] {
            let mut s = connect_with(gw.port, secs(5)).unwrap();
            let head =
                format!("{line}\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 104857600\r\n\r\n");
            s.write_all(head.as_bytes()).unwrap();
            // A few KB of the 100 MB: far below 1 MB sent when the answer must be there.
            s.write_all(&[b'x'; 4096]).unwrap();
            let r = read_response(&mut s, &mut Vec::new(), false).unwrap_or_else(|e| {
                panic!("{line}: no answer within {:?} with 4 KB of a 100 MB body sent: {e}", secs(5))
            });
            assert_eq!(r.status, want, "{line}: {}", r.text());
            if let Some(code) = code {
                assert_eq!(r.json()["error"]["code"].as_str(), Some(code), "{line}");
                assert_eq!(r.header("x-smg-error-code"), Some(code), "{line}");
            } else {
                assert!(r.text().contains("\"object\":\"list\""), "{line}: {}", r.text());
            }
            assert!(closed_within(&mut s, secs(3)), "{line}: connection left open with an unread 100 MB body");
        }
        assert!(w.requests().is_empty(), "nothing may reach the worker");
    });
}

/// Every answer the gateway makes itself carries `x-request-id`, the client's own when it
/// sent one, whatever the status and however early the request failed.
#[test]
fn x_request_id_on_every_gateway_answer() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = gateway(
            legacy,
            &[w.url()],
            &["--max-payload-size", "1000", "--client-read-timeout-secs", "1", "--stream-body-stall-timeout-secs", "1"],
        );
        gw.ready();
        let cases: Vec<(&str, Vec<u8>, u16)> = vec![
            ("404", b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 404),
            ("405", b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 405),
            ("400 malformed head", b"GARBAGE\r\n\r\n".to_vec(), 400),
            ("413", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n".to_vec(), 413),
            ("431", format!("GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "b".repeat(40_000)).into_bytes(), 431),
            ("414", format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(9000)).into_bytes(), 414),
            (
                "408",
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":".to_vec(),
                408,
            ),
            ("/health", b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 200),
            ("/v1/models", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 200),
            ("/readiness", b"GET /readiness HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 200),
        ];
        let mut missing = Vec::new();
        for (name, raw, want) in &cases {
            let r = exchange(gw.port, raw, secs(5)).unwrap_or_else(|e| panic!("{name}: no answer: {e}"));
            assert_eq!(r.status, *want, "{name}: {}", r.text());
            if r.header("x-request-id").is_none_or(str::is_empty) {
                missing.push(*name);
            }
        }
        // The client's own id is echoed on gateway-made answers too.
        let mut echoed = Vec::new();
        for (name, line) in [("404", "GET /nope"), ("405", "GET /v1/chat/completions")] {
            let raw = format!("{line} HTTP/1.1\r\nHost: x\r\nX-Request-ID: mine-{name}\r\n\r\n");
            let r = exchange(gw.port, raw.as_bytes(), secs(5)).unwrap();
            if r.header("x-request-id") != Some(format!("mine-{name}").as_str()) {
                echoed.push(format!("{name}: {:?}", r.header("x-request-id")));
            }
        }
        assert!(
            missing.is_empty() && echoed.is_empty(),
            "answers without x-request-id: {missing:?}; client id not echoed: {echoed:?}"
        );
    });
}

/// Gateway-made answers use the standard reason phrase; a worker's phrase is relayed as the
/// worker wrote it, and an empty one is replaced by the standard phrase.
#[test]
fn reason_phrases() {
    both_drivers(|legacy| {
        let mut wrong = Vec::new();
        // 503: no healthy worker.
        {
            let w = FakeWorker::start("m");
            w.state.healthy.store(false, std::sync::atomic::Ordering::SeqCst);
            let gw = gateway(legacy, &[w.url()], &[]);
            let line = status_line(gw.port, b"GET /readiness HTTP/1.1\r\nHost: x\r\n\r\n", secs(5)).unwrap();
            if line != "HTTP/1.1 503 Service Unavailable" {
                wrong.push(format!("gateway 503: {line:?}"));
            }
        }
        let teapot = RogueWorker::start("teapot", Mode::Status(418, "I'm a teapot"));
        let blank = RogueWorker::start("blank", Mode::Status(422, ""));
        let bare = RogueWorker::start("bare", Mode::BareStatus(200));
        let gw = gateway(legacy, &[teapot.url(), blank.url(), bare.url()], &[]);
        gw.ready_workers(3);
        // 501: a transfer coding the gateway does not implement.
        let raw = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip\r\n\r\n";
        let line = status_line(gw.port, raw.as_bytes(), secs(5)).unwrap();
        if line != "HTTP/1.1 501 Not Implemented" {
            wrong.push(format!("gateway 501 (Transfer-Encoding: gzip): {line:?}"));
        }
        let chat = |model: &str| {
            let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"tag":"t"}}"#);
            status_line(gw.port, post_bytes("/v1/chat/completions", &body, &[]).as_bytes(), secs(5)).unwrap()
        };
        let line = chat("teapot");
        if line != "HTTP/1.1 418 I'm a teapot" {
            wrong.push(format!("worker's 418 I'm a teapot: {line:?}"));
        }
        let line = chat("blank");
        if line != "HTTP/1.1 422 Unprocessable Content" && line != "HTTP/1.1 422 Unprocessable Entity" {
            wrong.push(format!("worker's 422 without a phrase: {line:?}"));
        }
        // A status line that ends at its code: relayed with the standard phrase (before, its
        // reason was a range from outside the buffer, and the relay panicked).
        let line = chat("bare");
        if line != "HTTP/1.1 200 OK" {
            wrong.push(format!("worker's 200 without a phrase or its space: {line:?}"));
        }
        assert!(wrong.is_empty(), "wrong status lines: {wrong:?}");
    });
}

/// Every pooled connection to a worker dies at once (the worker restarted): requests after
/// that must all succeed on fresh connections, however many stale sockets the pool holds.
#[test]
fn restarted_worker_with_stale_pooled_sockets() {
    both_drivers(|legacy| {
        let w = RogueWorker::start("m", Mode::Restartable);
        let gw = gateway(legacy, &[w.url()], &["--cores", "1", "--upstream-pool-idle-timeout-secs", "30"]);
        gw.ready();
        // 8 overlapping requests on 8 client connections: 8 upstream connections, all pooled after.
        let port = gw.port;
        let fill: Vec<_> = (0..8)
            .map(|i| {
                std::thread::spawn(move || {
                    let body = format!(
                        r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"tag":"fill{i}","delay_ms":400}}"#
                    );
                    exchange(port, post_bytes("/v1/chat/completions", &body, &[]).as_bytes(), secs(10))
                        .map(|r| r.status)
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        for (i, t) in fill.into_iter().enumerate() {
            assert_eq!(t.join().unwrap(), Ok(200), "filling request {i}");
        }
        let conns = w.state.post_conns.load(std::sync::atomic::Ordering::SeqCst);
        assert!(conns >= 8, "precondition: 8 concurrent requests used only {conns} upstream connections");
        w.restart();
        let mut failures = Vec::new();
        for i in 0..100 {
            let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"tag":"after{i}"}}"#);
            match exchange(gw.port, post_bytes("/v1/chat/completions", &body, &[]).as_bytes(), secs(10)) {
                Ok(r) if r.status == 200 && r.json()["tag"].as_str() == Some(format!("after{i}").as_str()) => {}
                Ok(r) => failures.push(format!("#{i}: {} {}", r.status, r.text())),
                Err(e) => failures.push(format!("#{i}: {e}")),
            }
        }
        assert!(
            failures.is_empty(),
            "{} of 100 requests after the restart failed; first: {:?}",
            failures.len(),
            &failures[..failures.len().min(3)]
        );
    });
}

/// How one connection of the drain test ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    Answered,
    /// Closed with no byte of an answer: the gateway declined it cleanly.
    CleanClose,
    /// ECONNRESET (or EPIPE after one), a half answer, or no end within the bound.
    Broken(String),
}

/// One connect-and-ask: None when connect() itself failed (the kernel never completed the
/// connection, which a closed listener may do).
fn ask_once(port: u16) -> Option<Ended> {
    use std::io::Read;
    let mut s = connect_with(port, secs(5)).ok()?;
    if let Err(e) = s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") {
        return Some(Ended::Broken(format!("write: {e}")));
    }
    let mut got = Vec::new();
    Some(match s.read_to_end(&mut got) {
        Ok(_) if got.is_empty() => Ended::CleanClose,
        Ok(_) if got.starts_with(b"HTTP/1.1 200") => Ended::Answered,
        Ok(_) => Ended::Broken(format!("answer: {:?}", String::from_utf8_lossy(&got))),
        Err(e) => Ended::Broken(format!("read after {} bytes: {e}", got.len())),
    })
}

/// Clients connect in a tight loop while SIGTERM arrives: every connection whose connect()
/// succeeded gets its answer or a clean close, never a reset (closing a listener resets the
/// connections in its accept queue; about one in 128 of such a loop was).
#[test]
fn a_drain_resets_no_completed_connection() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        // Three drains per driver: each catches a few connections in the accept queue.
        for round in 0..3 {
            let mut gw = gateway(legacy, &[w.url()], &["--shutdown-grace-period-secs", "5"]);
            gw.ready();
            let port = gw.port;
            let asked = std::sync::atomic::AtomicUsize::new(0);
            let (ends, status) = std::thread::scope(|scope| {
                let clients: Vec<_> = (0..16)
                    .map(|_| {
                        let asked = &asked;
                        scope.spawn(move || {
                            let mut ends = Vec::new();
                            let until = std::time::Instant::now() + secs(20);
                            // Until connect() fails (the gateway is gone), bounded by count and time.
                            for _ in 0..5000 {
                                let Some(e) = ask_once(port) else { break };
                                asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                ends.push(e);
                                if std::time::Instant::now() > until {
                                    break;
                                }
                            }
                            ends
                        })
                    })
                    .collect();
                // The signal lands while the loop is in full swing.
                assert!(wait_until(secs(10), || asked.load(std::sync::atomic::Ordering::Relaxed) >= 500));
                gw.signal(libc::SIGTERM);
                // (std keeps the status once reaped: the second try_wait returns it again.)
                wait_until(secs(10), || gw.child.try_wait().is_ok_and(|s| s.is_some()));
                let status = gw.child.try_wait().unwrap();
                let ends: Vec<Ended> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
                (ends, status)
            });
            assert!(status.is_some_and(|s| s.success()), "round {round}: exit {status:?}");
            let broken: Vec<_> = ends.iter().filter(|e| matches!(e, Ended::Broken(_))).collect();
            let answered = ends.iter().filter(|e| **e == Ended::Answered).count();
            assert!(
                broken.is_empty(),
                "round {round}: {} of {} completed connections broken ({answered} answered); first: {:?}",
                broken.len(),
                ends.len(),
                &broken[..broken.len().min(3)]
            );
        }
    });
}
