//! What an outsider can send — a client, an admin with a key, a worker the gateway trusts —
//! and what must not follow: a process that stops, a control thread that stops answering, a
//! permit held by a request that makes no progress. Each test runs under io_uring and epoll
//! and fails on the build before issue #23.
// A test's threads are not shards: they sleep, and time what the gateway does.
#![allow(clippy::disallowed_methods)]

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::*;

/// 100,000 levels: 200 KB, far past any parser's stack.
const LEVELS: usize = 100_000;

/// `{"model":"m",<field>:[[[…]]]}`, nested `levels` deep.
fn deep_body(field: &str, levels: usize) -> Vec<u8> {
    let mut b = format!(r#"{{"model":"m","{field}":"#).into_bytes();
    b.extend(std::iter::repeat_n(b'[', levels));
    b.extend(std::iter::repeat_n(b']', levels));
    b.push(b'}');
    b
}

fn send(port: u16, method: &str, target: &str, content_type: &str, body: &[u8]) -> Response {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(patience(Duration::from_secs(20)))).unwrap();
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    read_response(&mut s, &mut Vec::new(), false).unwrap_or_else(|e| panic!("{method} {target}: no answer: {e}"))
}

fn chat_ok(port: u16) {
    let r = post(port, "/v1/chat/completions", r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#, &[]);
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Every serving route refuses a body nested 100,000 deep with `400 json_parse_error`
/// before anything recursive reads it; the process, and the connection's shard, go on.
#[test]
fn deep_json_on_every_route_is_a_400() {
    const ROUTES: [&str; 15] = [
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
        "/v1/decisions",
        "/v1/realtime/sessions",
        "/v1/realtime/client_secrets",
        "/v1/realtime/transcription_sessions",
    ];
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let mut gw = Gateway::start(legacy, &["--worker-urls", &w.url(), "--cores", "2"]);
        gw.ready_workers(1);
        let deep = deep_body("input", LEVELS);
        for route in ROUTES {
            let r = send(gw.port, "POST", route, "application/json", &deep);
            assert_eq!(r.status, 400, "{route}: {}", r.text());
            assert_eq!(r.json()["error"]["code"].as_str(), Some("json_parse_error"), "{route}: {}", r.text());
            assert!(r.text().contains("recursion limit exceeded"), "{route}: {}", r.text());
            assert!(gw.alive(), "{route} stopped the gateway");
        }
        // The realtime calls form's `session` part, the one JSON inside a form.
        let mut form = b"--B\r\nContent-Disposition: form-data; name=\"sdp\"\r\n\r\nv=0\r\n\r\n--B\r\nContent-Disposition: form-data; name=\"session\"\r\n\r\n".to_vec();
        form.extend(deep_body("tools", LEVELS));
        form.extend_from_slice(b"\r\n--B--\r\n");
        let r = send(gw.port, "POST", "/v1/realtime/calls", "multipart/form-data; boundary=B", &form);
        assert_eq!((r.status, r.header("x-smg-error-code")), (400, Some("invalid_session_json")), "{}", r.text());
        assert!(r.text().contains("recursion limit exceeded"), "{}", r.text());
        // At the limit, a body still goes through (the object is level 1).
        let r = send(gw.port, "POST", "/v1/embeddings", "application/json", &deep_body("input", 127));
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(w.requests().iter().all(|q| q.body.len() < 1000), "a deep body reached the worker");
        chat_ok(gw.port);
        assert!(gw.alive());
    });
}

/// `/workers` bodies are parsed on the control thread: one nested 100,000 deep is a 400, and
/// the admin API answers on.
#[test]
fn deep_admin_bodies_are_a_400() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let mut gw = Gateway::start(legacy, &["--worker-urls", &w.url(), "--cores", "2"]);
        gw.ready_workers(1);
        let r = send(gw.port, "POST", "/workers", "application/json", &deep_body("labels", LEVELS));
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(r.text().contains("recursion limit exceeded"), "{}", r.text());
        let list = get(gw.port, "/workers");
        assert_eq!(list.status, 200);
        let id = list.json()["workers"][0]["id"].as_str().unwrap().to_owned();
        let r = send(gw.port, "PATCH", &format!("/workers/{id}"), "application/json", &deep_body("labels", LEVELS));
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(get(gw.port, "/workers").status, 200);
        chat_ok(gw.port);
        assert!(gw.alive());
    });
}

/// A worker whose every JSON answer (`/v1/models`, `/get_server_info`, `/v1/loads`, …) is
/// nested 100,000 deep, and that answers `/health` 200.
struct DeepWorker {
    port: u16,
    answered: Arc<AtomicUsize>,
}

impl DeepWorker {
    fn start() -> DeepWorker {
        let listener = local_listener();
        let port = listener.local_addr().unwrap().port();
        let answered = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&answered);
        std::thread::spawn(move || {
            let deep = deep_body("data", LEVELS);
            for s in listener.incoming().take(100_000) {
                let Ok(mut s) = s else { continue };
                let deep = deep.clone();
                let counted = Arc::clone(&counted);
                std::thread::spawn(move || {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
                    let mut buf = Vec::new();
                    let mut tmp = [0u8; 4096];
                    loop {
                        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                            match s.read(&mut tmp) {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&tmp[..n]),
                            }
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end + 4);
                        let body: &[u8] = if head.starts_with("GET /health ") { b"{}" } else { &deep };
                        counted.fetch_add(usize::from(body.len() > 2), Ordering::SeqCst);
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                            body.len()
                        );
                        if s.write_all(resp.as_bytes()).and_then(|_| s.write_all(body)).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        DeepWorker { port, answered }
    }
}

/// Discovery, load polls and the `/get_loads` fan-out read a worker's JSON on the control
/// thread: answers nested 100,000 deep fail those probes as bad answers, and the gateway
/// (admin API included) goes on serving its other worker.
#[test]
fn deep_worker_answers_fail_the_probe() {
    both_drivers(|legacy| {
        let good = FakeWorker::start("m");
        let bad = DeepWorker::start();
        let bad_url = format!("http://127.0.0.1:{}", bad.port);
        let args = ["--worker-urls", &good.url(), &bad_url, "--cores", "2", "--load-monitor-interval", "1"];
        let mut gw = Gateway::start(legacy, &args);
        gw.ready_workers(1);
        // The deep worker has been asked (discovery, then again after its failed probe)...
        assert!(
            wait_until(patience(Duration::from_secs(10)), || bad.answered.load(Ordering::SeqCst) >= 2),
            "the deep worker was never probed"
        );
        let r = get(gw.port, "/get_loads");
        assert_eq!(r.status, 200, "{}", r.text());
        // ...and stays unroutable: its model is unknown.
        let r = get(gw.port, "/readiness");
        assert!(r.text().contains("\"healthy_workers\":1"), "{}", r.text());
        chat_ok(gw.port);
        assert_eq!(get(gw.port, "/workers").status, 200);
        assert!(gw.alive());
    });
}

/// The control thread owns every worker's health, loads and breakers: a duration past the
/// range is refused at the edge, and a bug in one admin request or task ends that request
/// with a 500, never the thread.
#[test]
fn the_control_thread_survives_huge_durations_and_panics() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let mut gw = Gateway::start(legacy, &["--worker-urls", &w.url(), "--cores", "2"]);
        gw.ready_workers(1);
        let huge = r#"{"url":"http://127.0.0.1:9","health":{"check_interval_secs":18446744073709551615}}"#;
        let r = post(gw.port, "/workers", huge, &[]);
        assert_eq!(r.status, 422, "{}", r.text());
        assert!(r.text().contains("check_interval_secs"), "{}", r.text());
        let id = get(gw.port, "/workers").json()["workers"][0]["id"].as_str().unwrap().to_owned();
        let patch = br#"{"health":{"check_interval_secs":18446744073709551615}}"#;
        let r = send(gw.port, "PATCH", &format!("/workers/{id}"), "application/json", patch);
        assert_eq!(r.status, 422, "{}", r.text());
        // Debug builds' fault hooks: a panic in the request's handling, and in its task.
        for hook in ["now", "later"] {
            let r = get(gw.port, &format!("/workers?smg_debug_panic={hook}"));
            assert_eq!(r.status, 500, "{hook}: {}", r.text());
            assert!(gw.log_has("panicked: deliberate panic"), "{hook}: nothing logged");
        }
        // The thread is still there: admin answers, health checks and routing go on.
        assert_eq!(get(gw.port, "/workers").status, 200);
        assert_eq!(get(gw.port, "/get_loads").status, 200);
        // A worker registered now is probed and becomes routable.
        let w2 = FakeWorker::start("m2");
        let r = post(gw.port, "/workers", &format!(r#"{{"url":"{}"}}"#, w2.url()), &[]);
        assert_eq!(r.status, 202, "{}", r.text());
        gw.ready_workers(2);
        chat_ok(gw.port);
        assert!(gw.alive());
    });
}

/// A duration flag past the range stops the start with the flag named, instead of a clock
/// overflow later.
#[test]
fn duration_flags_past_the_range_are_start_errors() {
    for flag in ["--health-check-interval-secs", "--shutdown-grace-period-secs", "--request-timeout-secs"] {
        let (mut cmd, _) = launch_command(true, &[flag, "18446744073709551615", "--cores", "1"]);
        let mut child = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
        let exited = wait_until(patience(Duration::from_secs(10)), || child.try_wait().unwrap().is_some());
        if !exited {
            let _ = child.kill();
        }
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(exited && !out.status.success(), "{flag} u64::MAX: the gateway started:\n{err}");
        assert!(err.contains(flag) && err.contains("must be between"), "{flag}:\n{err}");
    }
}

/// A client that sends its body one byte at a time, each read well inside any per-read
/// bound, until the gateway answers or closes; returns the status it got, if any.
fn trickle(port: u16, within: Duration) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{";
    s.write_all(head.as_bytes()).unwrap();
    // The pace: one byte per 200 ms read timeout, not a sleep.
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let until = std::time::Instant::now() + within;
    let mut got = Vec::new();
    let mut tmp = [0u8; 4096];
    while std::time::Instant::now() < until {
        match s.read(&mut tmp) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&tmp[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                if s.write_all(b" ").is_err() {
                    break;
                }
            }
            Err(_) => break,
        }
        if got.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    std::str::from_utf8(&got).ok()?.split(' ').nth(1)?.parse().ok()
}

/// Two clients trickling their bodies hold the two permits (or slots) only until
/// `--client-read-timeout-secs` has passed since their heads: they get 408, and a client
/// queued behind them is served. Per read, each byte came well inside the bound, so with a
/// per-read deadline they held the permits until the queue timed the other client out.
#[test]
fn trickled_bodies_release_their_permits() {
    both_drivers(|legacy| {
        let w = FakeWorker::start_reporting("m", 2);
        let (url, queue) = (w.url(), patience(Duration::from_secs(30)).as_secs().to_string());
        let limits: [(&[&str], &str); 2] = [
            (&["--max-concurrent-requests", "2", "--queue-timeout-secs", &queue], "smg_admission_permits_free 0"),
            (&["--priority-scheduler-enabled"], "smg_scheduler_inflight{class=\"default\"} 2"),
        ];
        for (limit, held) in limits {
            let mport = free_port().to_string();
            let mut args = vec!["--worker-urls", &url, "--cores", "1", "--client-read-timeout-secs", "2"];
            args.extend_from_slice(&["--prometheus-host", "127.0.0.1", "--prometheus-port", &mport]);
            args.extend_from_slice(limit);
            let gw = Gateway::start(legacy, &args);
            gw.ready_workers(1);
            let port = gw.port;
            // Two tricklers take the two permits/slots; wrong behaviour keeps them for the
            // whole queue timeout (30 s), right behaviour for 2 s.
            let tricklers: Vec<_> =
                (0..2).map(|_| std::thread::spawn(move || trickle(port, patience(Duration::from_secs(30))))).collect();
            let scrape = || try_get(mport.parse().unwrap(), "/metrics").map(|r| r.text()).unwrap_or_default();
            assert!(wait_until(patience(Duration::from_secs(5)), || scrape().contains(held)), "{held}:\n{}", scrape());
            let r =
                post(port, "/v1/chat/completions", r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#, &[]);
            assert_eq!(r.status, 200, "{limit:?}: the queued client: {}", r.text());
            for t in tricklers {
                assert_eq!(t.join().unwrap(), Some(408), "{limit:?}: a trickler");
            }
        }
    });
}

/// A worker URL that is the gateway's own listener (serving or metrics, by any local name)
/// is refused at registration; a header value or label with CR, LF or NUL too.
#[test]
fn registrations_that_turn_the_gateway_on_itself_are_refused() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let mport = free_port();
        let mp = mport.to_string();
        let args =
            ["--worker-urls", &w.url(), "--cores", "2", "--prometheus-host", "127.0.0.1", "--prometheus-port", &mp];
        let gw = Gateway::start(legacy, &args);
        gw.ready_workers(1);
        for url in [
            format!("http://127.0.0.1:{}", gw.port),
            format!("http://localhost:{}", gw.port),
            format!("http://127.0.0.1:{mport}"),
        ] {
            let r = post(gw.port, "/workers", &format!(r#"{{"url":"{url}"}}"#), &[]);
            assert_eq!(r.status, 400, "{url}: {}", r.text());
            assert!(r.text().contains("own listener"), "{url}: {}", r.text());
        }
        for (field, body) in [
            ("api_key", format!(r#"{{"url":"{}","api_key":"k\r\nx-injected: 1"}}"#, w.url())),
            ("labels", format!(r#"{{"url":"{}","labels":{{"a":"b\nc"}}}}"#, w.url())),
            ("model_id", format!(r#"{{"url":"{}","model_id":"m\u0000"}}"#, w.url())),
        ] {
            let r = post(gw.port, "/workers", &body, &[]);
            assert_eq!(r.status, 422, "{field}: {}", r.text());
            assert!(r.text().contains("CR, LF or NUL"), "{field}: {}", r.text());
        }
        // Through PATCH too.
        let id = get(gw.port, "/workers").json()["workers"][0]["id"].as_str().unwrap().to_owned();
        let r = send(gw.port, "PATCH", &format!("/workers/{id}"), "application/json", br#"{"api_key":"a\rb"}"#);
        assert_eq!(r.status, 422, "{}", r.text());
        assert_eq!(get(gw.port, "/workers").json()["workers"].as_array().unwrap().len(), 1);
    });
}

/// Relays every connection it accepts to `to` (a proxy in front of the gateway, which the
/// registration check cannot see through); counts the requests that went through it.
fn forwarder(to: u16) -> (u16, Arc<AtomicUsize>) {
    let listener = local_listener();
    let port = listener.local_addr().unwrap().port();
    let posts = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&posts);
    std::thread::spawn(move || {
        for c in listener.incoming().take(10_000) {
            let Ok(mut client) = c else { continue };
            let Ok(mut up) = TcpStream::connect(("127.0.0.1", to)) else { continue };
            let (mut client2, mut up2) = (client.try_clone().unwrap(), up.try_clone().unwrap());
            let counted = Arc::clone(&counted);
            std::thread::spawn(move || {
                let mut tmp = [0u8; 65536];
                while let Ok(n) = client.read(&mut tmp) {
                    // Counted before it is passed on: the answer it leads to cannot reach the
                    // test before the count does.
                    counted.fetch_add(tmp[..n].windows(5).filter(|w| w == b"POST ").count(), Ordering::SeqCst);
                    if n == 0 || up.write_all(&tmp[..n]).is_err() {
                        break;
                    }
                }
                let _ = up.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut up2, &mut client2);
                let _ = client2.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    (port, posts)
}

/// A worker that leads back to the gateway through a proxy: each request sent there comes
/// back once, is recognised by its hop marker and answered 508, instead of going round
/// until something runs out.
#[test]
fn a_request_that_comes_back_is_cut_by_its_hop_marker() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let port = free_port();
        let (fwd, posts) = forwarder(port);
        let fwd_url = format!("http://127.0.0.1:{fwd}");
        let args =
            ["--cores", "2", "--policy", "round_robin", "--disable-retries", "--worker-urls", &w.url(), &fwd_url];
        let (cmd, _) = launch_command_at(legacy, port, &args);
        let gw = Gateway::spawn(cmd, port, "hop");
        // The forwarder is discovered as the gateway itself, serving `m`.
        gw.ready_workers(2);
        let (mut ok, mut looped) = (0, 0);
        for _ in 0..10 {
            let r = post(
                gw.port,
                "/v1/chat/completions",
                r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
                &[],
            );
            match r.status {
                200 => ok += 1,
                508 => {
                    assert_eq!(r.json()["error"]["code"].as_str(), Some("loop_detected"), "{}", r.text());
                    looped += 1;
                }
                s => panic!("{s}: {}", r.text()),
            }
        }
        assert!(ok > 0 && looped > 0, "{ok} served, {looped} looped");
        assert_eq!(posts.load(Ordering::SeqCst), looped, "each looped request went round once");
    });
}

/// 10,000 registrations under a 1,024-descriptor limit: the control thread probes them a
/// bounded number at a time, so the shards keep their descriptors and every client request
/// is served meanwhile.
#[test]
fn mass_registration_leaves_clients_unharmed() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = Gateway::start_with(legacy, &["--worker-urls", &w.url(), "--cores", "2"], Some(1024));
        gw.ready_workers(1);
        let port = gw.port;
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = Arc::clone(&done);
        let client = std::thread::spawn(move || {
            let mut served = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let r = post(
                    port,
                    "/v1/chat/completions",
                    r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
                    &[],
                );
                assert_eq!(r.status, 200, "a client during the registrations: {}", r.text());
                served += 1;
            }
            served
        });
        // Distinct loopback addresses on a closed port: every probe is refused at once.
        let mut s = gw.connect();
        let mut rest = Vec::new();
        for i in 0..10_000u32 {
            let body = format!(r#"{{"url":"http://127.0.{}.{}:9"}}"#, 1 + i / 250, 1 + i % 250);
            s.write_all(post_bytes("/workers", &body, &[]).as_bytes()).unwrap();
            let r = read_response(&mut s, &mut rest, false).unwrap();
            assert_eq!(r.status, 202, "registration {i}: {}", r.text());
        }
        let listed = get(gw.port, "/workers").json()["workers"].as_array().map_or(0, |a| a.len());
        assert_eq!(listed, 10_001);
        done.store(true, Ordering::SeqCst);
        let served = client.join().unwrap();
        assert!(served > 0, "the client was served during the registrations");
        chat_ok(gw.port);
        let log = gw.log_text();
        assert!(!log.contains("Too many open files") && !log.contains("EMFILE"), "{log}");
    });
}
