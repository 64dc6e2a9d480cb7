//! The Realtime API through the real binary, under io_uring and epoll: WebSocket sessions
//! relayed verbatim to a simulated realtime worker (text, binary, a 1 MB message, ping,
//! close codes, sessions kept apart), the refusals before an upgrade, the message-size
//! limit's close 1009, admission and metrics for a session's life, and the REST routes
//! forwarded byte for byte to realtime-labeled workers only; the idle deadline, and what
//! a session costs in descriptors (two, counted against --max-connections).
// A test's threads are not shards: they sleep, and time what the gateway does.
#![allow(clippy::disallowed_methods)]

mod support;

use std::io::Write;
use std::time::Duration;

use smg_wire::ws::{OP_BINARY, OP_CLOSE, OP_CONT, OP_PING, OP_PONG, OP_TEXT};
use sonic_rs::JsonValueTrait;
use support::sim::Sim;
use support::ws::{open, open_raw, upgrade_request};
use support::*;

const RT: &str = "org/realtime-asr";
const PLAIN: &str = "org/plain";

/// A gateway with a plain worker (`PLAIN`, from --worker-urls) and a realtime-labeled one
/// (`RT`, registered through /workers), both routable.
struct World {
    gw: Gateway,
    rt: Sim,
    _plain: Sim,
}

fn world(legacy: bool, extra: &[&str]) -> World {
    world_with(legacy, extra, None)
}

/// [`world`] with the gateway's descriptor limit set to `nofile`.
fn world_with(legacy: bool, extra: &[&str], nofile: Option<u64>) -> World {
    let plain = Sim::start(PLAIN, &[]);
    let rt = Sim::start(RT, &[]);
    let url = plain.url();
    let mut args = vec!["--worker-urls", url.as_str(), "--cores", "2"];
    args.extend_from_slice(extra);
    let gw = Gateway::start_with(legacy, &args, nofile);
    let body = format!(r#"{{"url":"{}","labels":{{"realtime":"true"}}}}"#, rt.url());
    let r = post(gw.port, "/workers", &body, &[]);
    assert_eq!(r.status, 202, "{}", r.text());
    gw.ready_workers(2);
    World { gw, rt, _plain: plain }
}

/// The worker's first event: `session.created` with the session's id.
fn session_id(ws: &mut support::ws::Ws) -> String {
    let f = ws.recv();
    assert_eq!(f.opcode, OP_TEXT);
    let v: sonic_rs::Value = sonic_rs::from_str(&f.text()).unwrap();
    assert_eq!(v["type"].as_str(), Some("session.created"));
    v["session"]["id"].as_str().unwrap().to_owned()
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn frames_pass_verbatim_both_ways() {
    both_drivers(|legacy| {
        let w = world(legacy, &[]);
        let mut ws = open(w.gw.port, RT);
        session_id(&mut ws);
        ws.send(OP_TEXT, br#"{"type":"input_audio_buffer.append","audio":"AAAA"}"#);
        let f = ws.recv();
        assert_eq!((f.opcode, f.text().as_str()), (OP_TEXT, r#"{"type":"input_audio_buffer.append","audio":"AAAA"}"#));
        let bin = pattern(4000);
        ws.send(OP_BINARY, &bin);
        assert_eq!(ws.recv(), support::ws::Frame { fin: true, opcode: OP_BINARY, payload: bin });
        // A 1 MB message, and a fragmented one: frames come back as they were sent.
        let big = pattern(1 << 20);
        ws.send(OP_BINARY, &big);
        let f = ws.recv();
        assert!(f.payload == big && f.opcode == OP_BINARY, "1 MB echoed intact");
        ws.send_frame(false, OP_TEXT, b"hel");
        ws.send(OP_PING, b"between");
        ws.send_frame(true, OP_CONT, b"lo");
        let got: Vec<_> = (0..3).map(|_| ws.recv()).map(|f| (f.fin, f.opcode, f.text())).collect();
        assert_eq!(
            got,
            [(false, OP_TEXT, "hel".into()), (true, OP_PONG, "between".into()), (true, OP_CONT, "lo".into())]
        );
        // A close with its code: echoed with the same code, then the connection closes.
        ws.send(OP_CLOSE, &[0x0F, 0xA0, b'b', b'y', b'e']);
        let f = ws.recv();
        assert_eq!((f.close_code(), &f.payload[2..]), (Some(4000), &b"bye"[..]));
        assert!(ws.closed(), "the gateway closes after the close handshake");
    });
}

#[test]
fn concurrent_sessions_are_kept_apart() {
    both_drivers(|legacy| {
        let w = world(legacy, &[]);
        let (mut a, mut b) = (open(w.gw.port, RT), open(w.gw.port, RT));
        let (ia, ib) = (session_id(&mut a), session_id(&mut b));
        assert_ne!(ia, ib);
        for i in 0..20 {
            a.send(OP_TEXT, format!("a{i}").as_bytes());
            b.send(OP_TEXT, format!("b{i}").as_bytes());
        }
        for i in 0..20 {
            assert_eq!(a.recv().text(), format!("a{i}"));
            assert_eq!(b.recv().text(), format!("b{i}"));
        }
        // One side's end leaves the other going.
        drop(a);
        b.send(OP_TEXT, b"still here");
        assert_eq!(b.recv().text(), "still here");
    });
}

#[test]
fn refusals_before_the_upgrade() {
    both_drivers(|legacy| {
        let w = world(legacy, &[]);
        let port = w.gw.port;
        let auth = &["Authorization: Bearer t"][..];
        let refuse =
            |target: &str, headers: &[&str]| open_raw(port, &upgrade_request(target, headers)).err().expect("refused");
        let r = refuse("/v1/realtime", auth);
        assert_eq!((r.status, r.text().as_str()), (400, "Missing required 'model' query parameter"));
        assert_eq!(refuse("/v1/realtime?model=%20", auth).status, 400);
        // Only an unlabeled worker serves it: never routed there.
        let r = refuse(&format!("/v1/realtime?model={PLAIN}"), auth);
        assert_eq!((r.status, r.header("x-smg-error-code")), (404, Some("model_not_found")));
        assert_eq!(refuse("/v1/realtime?model=nobody", auth).status, 404);
        // Nothing to authenticate the worker session with (SMG's rule).
        let r = refuse(&format!("/v1/realtime?model={RT}"), &[]);
        assert_eq!((r.status, r.body.len()), (401, 0));
        let bad = upgrade_request(&format!("/v1/realtime?model={RT}"), auth).replace("Version: 13", "Version: 8");
        assert_eq!(open_raw(port, &bad).err().unwrap().status, 400);
        let r = post(port, "/v1/realtime", "{}", &[]);
        assert_eq!(r.status, 405);
        assert_eq!(w.rt.served(), 0, "nothing reached the realtime worker");
    });
}

#[test]
fn an_oversize_message_closes_the_session_with_1009() {
    both_drivers(|legacy| {
        let w = world(legacy, &["--max-payload-size", "1048576"]);
        let mut ws = open(w.gw.port, RT);
        session_id(&mut ws);
        // Exactly the limit, in two fragments, passes.
        let half = pattern(1 << 19);
        ws.send_frame(false, OP_BINARY, &half);
        ws.send_frame(true, OP_CONT, &half);
        assert_eq!(ws.recv().payload.len(), 1 << 19);
        assert_eq!(ws.recv().payload.len(), 1 << 19);
        // One byte more, over three fragments: the third is never forwarded.
        ws.send_frame(false, OP_TEXT, &half);
        ws.send_frame(false, OP_CONT, &half[..(1 << 19) - 1]);
        ws.send_frame(true, OP_CONT, b"xy");
        let mut got = Vec::new();
        let close = loop {
            let f = ws.recv();
            if f.opcode == OP_CLOSE {
                break f;
            }
            got.push(f.payload.len());
        };
        assert_eq!(close.close_code(), Some(1009));
        assert!(got.len() <= 2, "at most the two fragments within the limit came back: {got:?}");
        assert!(ws.closed());
        // The worker's session ended too: a fresh one works.
        let mut again = open(w.gw.port, RT);
        session_id(&mut again);
    });
}

#[test]
fn a_session_holds_its_admission_and_counts_in_metrics() {
    both_drivers(|legacy| {
        let mport = free_port().to_string();
        let w = world(
            legacy,
            &[
                "--max-concurrent-requests",
                "1",
                "--queue-size",
                "0",
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                &mport,
            ],
        );
        let mport: u16 = mport.parse().unwrap();
        let mut ws = open(w.gw.port, RT);
        session_id(&mut ws);
        let r =
            post(w.gw.port, "/v1/realtime/sessions", &format!(r#"{{"model":"{RT}"}}"#), &["Authorization: Bearer t"]);
        assert_eq!(r.status, 429, "the one permit is the session's: {}", r.text());
        let active = format!("smg_worker_requests_active{{worker=\"{}\"}} 1", w.rt.url());
        let scrape = || get(mport, "/metrics").text();
        assert!(scrape().contains(&active), "{}", scrape());
        ws.send(OP_CLOSE, &1000u16.to_be_bytes());
        assert_eq!(ws.recv().close_code(), Some(1000));
        assert!(ws.closed());
        let series = format!(
            "smg_router_requests_total{{router_type=\"http\",backend_type=\"regular\",connection_mode=\"websocket\",model=\"{RT}\",endpoint=\"realtime\",streaming=\"false\"}} 1"
        );
        assert!(wait_until(patience(Duration::from_secs(5)), || scrape().contains(&series)), "{}", scrape());
        assert!(
            scrape().contains("smg_http_responses_total{path=\"/v1/realtime\",status_code=\"101\",error_code=\"\"} 1")
        );
        let idle = format!("smg_worker_requests_active{{worker=\"{}\"}} 0", w.rt.url());
        assert!(scrape().contains(&idle));
        // The permit came back with the session's end.
        let r =
            post(w.gw.port, "/v1/realtime/sessions", &format!(r#"{{"model":"{RT}"}}"#), &["Authorization: Bearer t"]);
        assert_eq!(r.status, 200, "{}", r.text());
    });
}

/// POSTs `body` with `content_type` and a bearer token.
fn post_raw(port: u16, target: &str, content_type: &str, body: &[u8]) -> Response {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let head = format!(
        "POST {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    read_response(&mut s, &mut Vec::new(), false).unwrap()
}

#[test]
fn rest_routes_reach_a_realtime_worker_byte_for_byte() {
    both_drivers(|legacy| {
        let w = world(legacy, &[]);
        let port = w.gw.port;
        let json = "application/json";
        let cases = [
            ("/v1/realtime/sessions", format!(r#"{{ "modalities":["text"], "model" : "{RT}" }}"#)),
            ("/v1/realtime/client_secrets", format!(r#"{{"session":{{"type":"realtime","model":"{RT}"}}}}"#)),
            ("/v1/realtime/transcription_sessions", format!(r#"{{"model":"{RT}","x":1.50}}"#)),
        ];
        for (path, body) in &cases {
            let r = post_raw(port, path, json, body.as_bytes());
            assert_eq!(r.status, 200, "{path}: {}", r.text());
            let v = r.json();
            assert_eq!((v["path"].as_str(), v["body"].as_str()), (Some(*path), Some(body.as_str())), "{path}");
            assert_eq!(r.header("x-sim-port"), Some(w.rt.port.to_string().as_str()));
        }
        let sdp = "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\n";
        let r = post_raw(port, &format!("/v1/realtime/calls?model={RT}"), "application/sdp", sdp.as_bytes());
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            (r.json()["body"].as_str(), r.json()["content_type"].as_str()),
            (Some(sdp), Some("application/sdp"))
        );
        let form = format!(
            "--B\r\nContent-Disposition: form-data; name=\"sdp\"\r\n\r\n{sdp}\r\n--B\r\nContent-Disposition: form-data; name=\"session\"\r\n\r\n{{\"type\":\"realtime\",\"model\":\"{RT}\"}}\r\n--B--\r\n"
        );
        let r = post_raw(port, "/v1/realtime/calls", "multipart/form-data; boundary=B", form.as_bytes());
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["body"].as_str(), Some(form.as_str()));
        // Refused: unlabeled-only models, calls without a model, other content types.
        let r = post_raw(port, "/v1/realtime/sessions", json, format!(r#"{{"model":"{PLAIN}"}}"#).as_bytes());
        assert_eq!((r.status, r.header("x-smg-error-code")), (404, Some("model_not_found")));
        let r = post_raw(port, "/v1/realtime/calls", "application/sdp", sdp.as_bytes());
        assert_eq!((r.status, r.header("x-smg-error-code")), (400, Some("missing_model")));
        let r = post_raw(port, "/v1/realtime/calls", "text/plain", b"x");
        assert_eq!((r.status, r.header("x-smg-error-code")), (400, Some("invalid_content_type")));
    });
}

#[test]
fn a_side_that_goes_closes_the_other() {
    both_drivers(|legacy| {
        let w = world(legacy, &[]);
        // The client hangs up mid-session: its worker session ends, and another one opens.
        let mut a = open(w.gw.port, RT);
        session_id(&mut a);
        a.send(OP_TEXT, b"x");
        assert_eq!(a.recv().text(), "x");
        drop(a);
        let mut b = open(w.gw.port, RT);
        session_id(&mut b);
        // The worker dies: the client's connection is closed.
        w.rt.die();
        assert!(b.closed(), "the client is closed when its worker goes");
    });
}

#[test]
fn a_draining_gateway_closes_sessions_with_1001() {
    both_drivers(|legacy| {
        let w = world(legacy, &["--shutdown-grace-period-secs", "60"]);
        let mut ws = open(w.gw.port, RT);
        session_id(&mut ws);
        let started = std::time::Instant::now();
        w.gw.signal(libc::SIGTERM);
        let f = ws.recv();
        assert_eq!(f.close_code(), Some(1001), "going away");
        assert!(ws.closed());
        assert!(started.elapsed() < patience(Duration::from_secs(10)), "not held to the grace period");
    });
}

/// Reads the close frame the gateway sends a silent session, bounded by `within`; returns
/// the frame (None if the connection ended or the bound passed first) and when it came.
fn idle_close(ws: &mut support::ws::Ws, within: Duration) -> (Option<support::ws::Frame>, Duration) {
    ws.s.set_read_timeout(Some(within)).unwrap();
    let started = std::time::Instant::now();
    let f = ws.recv_frame();
    (f, started.elapsed())
}

#[test]
fn an_idle_session_is_closed_after_the_deadline() {
    both_drivers(|legacy| {
        let w = world(legacy, &["--websocket-idle-timeout-secs", "1"]);
        let mut ws = open(w.gw.port, RT);
        session_id(&mut ws);
        // Right: a close about 1 s after the last byte; wrong: none at all (a session held
        // forever). 5 s sits between them with room for a slow host.
        let (f, took) = idle_close(&mut ws, patience(Duration::from_secs(5)));
        let f = f.expect("a close frame before the bound");
        assert_eq!(f.close_code(), Some(1001), "going away: {f:?}");
        assert_eq!(&f.payload[2..], b"idle timeout");
        // Not early either: halfway between 0 and the deadline.
        assert!(took >= Duration::from_millis(500), "closed after {took:?}");
        assert!(ws.closed());
        // A session that keeps talking is not idle: round trips for 1.5 s outlive the 1 s
        // deadline, each echoed (a close would come instead of an echo).
        let mut ws = open(w.gw.port, RT);
        session_id(&mut ws);
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(1500) {
            ws.send(OP_TEXT, b"still here");
            assert_eq!(ws.recv().text(), "still here");
        }
    });
}

#[test]
fn a_bad_idle_deadline_is_a_start_error() {
    for bad in ["0", "31536001"] {
        let (mut cmd, _) = launch_command(false, &["--websocket-idle-timeout-secs", bad]);
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{bad} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--websocket-idle-timeout-secs: must be between 1 and 31536000"), "{bad}: {err}");
    }
}

#[test]
fn an_idle_close_frees_the_permit_and_the_load() {
    both_drivers(|legacy| {
        let mport = free_port().to_string();
        let w = world(
            legacy,
            &[
                "--max-concurrent-requests",
                "1",
                "--queue-size",
                "0",
                "--websocket-idle-timeout-secs",
                "1",
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                &mport,
            ],
        );
        let mport: u16 = mport.parse().unwrap();
        let load = |n: usize| format!("smg_worker_requests_active{{worker=\"{}\"}} {n}", w.rt.url());
        let mut ws = open(w.gw.port, RT);
        session_id(&mut ws);
        assert!(get(mport, "/metrics").text().contains(&load(1)));
        let ask = || {
            post(w.gw.port, "/v1/realtime/sessions", &format!(r#"{{"model":"{RT}"}}"#), &["Authorization: Bearer t"])
        };
        assert_eq!(ask().status, 429, "the one permit is the session's");
        let (f, _) = idle_close(&mut ws, patience(Duration::from_secs(5)));
        assert_eq!(f.and_then(|f| f.close_code()), Some(1001));
        assert!(ws.closed());
        assert!(wait_until(patience(Duration::from_secs(5)), || ask().status == 200), "the permit came back");
        assert!(get(mport, "/metrics").text().contains(&load(0)), "and the worker load");
        // And the session's slot: a new session opens.
        let mut again = open(w.gw.port, RT);
        session_id(&mut again);
    });
}

#[test]
fn a_session_costs_two_descriptors() {
    both_drivers(|legacy| {
        let w = world(legacy, &[]);
        // One session first, so whatever a first session opens once is in the base.
        let mut warm = open(w.gw.port, RT);
        session_id(&mut warm);
        drop(warm);
        let base = w.gw.fd_count();
        let n = 100;
        let sessions: Vec<_> = (0..n)
            .map(|_| {
                let mut ws = open(w.gw.port, RT);
                session_id(&mut ws);
                ws
            })
            .collect();
        let delta = w.gw.fd_count().saturating_sub(base);
        // Right: 2 per session (client and worker sockets); wrong: 4 (a dup per read half).
        // (The warm session may still be closing when the base is read: a little under 2n.)
        assert!((3 * n / 2..3 * n).contains(&delta), "{delta} descriptors for {n} sessions");
        drop(sessions);
        assert!(
            wait_until(patience(Duration::from_secs(10)), || w.gw.fd_count() <= base),
            "descriptors back to {base}: {}",
            w.gw.fd_count()
        );
    });
}

#[test]
fn five_thousand_sessions_under_1024_descriptors() {
    both_drivers(|legacy| {
        let w = world_with(legacy, &[], Some(1024));
        let chat = || {
            post(
                w.gw.port,
                "/v1/chat/completions",
                &format!(r#"{{"model":"{PLAIN}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":4}}"#),
                &[],
            )
        };
        assert_eq!(chat().status, 200);
        let base = w.gw.fd_count();
        let request = upgrade_request(&format!("/v1/realtime?model={RT}"), &["Authorization: Bearer t"]);
        // Four clients, 1,250 attempts each: a session either opens (and is kept) or is
        // refused with the cap's 503; nothing else.
        let (open_ones, refused) = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        let (mut kept, mut refused) = (Vec::new(), 0usize);
                        for _ in 0..1250 {
                            match open_raw(w.gw.port, &request) {
                                Ok(ws) => kept.push(ws),
                                Err(r) => {
                                    assert_eq!(
                                        (r.status, r.header("x-smg-error-code")),
                                        (503, Some("connection_limit")),
                                        "{}",
                                        r.text()
                                    );
                                    refused += 1;
                                }
                            }
                        }
                        (kept, refused)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).fold((Vec::new(), 0), |(mut k, r), (k2, r2)| {
                k.extend(k2);
                (k, r + r2)
            })
        });
        eprintln!("{} sessions open, {refused} refused", open_ones.len());
        assert_eq!(open_ones.len() + refused, 5000);
        assert!(refused > 0, "the cap refused some of {} sessions", open_ones.len());
        // With the sessions still open, the gateway answers the rest.
        assert_eq!(get(w.gw.port, "/health").status, 200);
        assert_eq!(chat().status, 200);
        let log = w.gw.log_text();
        assert!(!log.contains("Too many open files") && !log.contains("descriptors"), "{log}");
        drop(open_ones);
        assert!(
            wait_until(patience(Duration::from_secs(10)), || w.gw.fd_count() <= base),
            "descriptors back to {base}: {}",
            w.gw.fd_count()
        );
    });
}
