//! The worker admin API and the routes that need the fleet, through the binary with
//! simulated workers: add a worker under load, drain one under open streams, PATCH, the
//! error shapes, auth on every admin route, fan-outs, runtime detection, data-parallel
//! ranks, and overload protection.

mod support;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::sim::Sim;
use support::*;

fn chat(stream: bool, tokens: u32) -> String {
    format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"max_tokens":{tokens},"stream":{stream}}}"#)
}

/// A request with a method, body and header lines on a fresh connection.
fn call(port: u16, method: &str, path: &str, body: &str, headers: &[&str]) -> Response {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n", body.len());
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    read_response(&mut s, &mut Vec::new(), false).unwrap()
}

fn register(port: u16, json: &str) -> String {
    let r = call(port, "POST", "/workers", json, &[]);
    assert_eq!(r.status, 202, "{}", r.text());
    let v = r.json();
    assert_eq!(v["status"].as_str(), Some("accepted"));
    let id = v["worker_id"].as_str().unwrap().to_string();
    assert_eq!(r.header("location"), Some(format!("/workers/{id}").as_str()));
    id
}

fn status_of(port: u16, id: &str) -> Option<String> {
    let r = get(port, &format!("/workers/{id}"));
    (r.status == 200).then(|| r.json()["status"].as_str().unwrap_or("?").to_string())
}

fn id_of(port: u16, url: &str) -> String {
    let list = get(port, "/workers").json();
    let w = list["workers"].as_array().unwrap().iter().find(|w| w["url"].as_str() == Some(url)).cloned();
    w.unwrap_or_else(|| panic!("{url} not listed: {list:?}"))["id"].as_str().unwrap().to_string()
}

#[test]
fn a_worker_added_under_load_takes_traffic() {
    both_drivers(|legacy| {
        let a = Sim::start("m", &[]);
        let b = Sim::start("m", &[]);
        let gw = Gateway::start(legacy, &["--worker-urls", &a.url(), "--cores", "2", "--policy", "round_robin"]);
        gw.ready_workers(1);
        let stop = Arc::new(AtomicBool::new(false));
        let bad = Arc::new(AtomicUsize::new(0));
        let load: Vec<_> = (0..8)
            .map(|_| {
                let (stop, bad, port) = (stop.clone(), bad.clone(), gw.port);
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if post(port, "/v1/chat/completions", &chat(false, 2), &[]).status != 200 {
                            bad.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        let id = register(gw.port, &format!(r#"{{"url":"{}","labels":{{"zone":"b"}}}}"#, b.url()));
        assert!(wait_until(patience(Duration::from_secs(10)), || status_of(gw.port, &id).as_deref() == Some("ready")));
        assert!(wait_until(patience(Duration::from_secs(10)), || b.served() > 20), "the new worker got no traffic");
        stop.store(true, Ordering::Relaxed);
        load.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(bad.load(Ordering::Relaxed), 0, "a request failed while the fleet grew");
        let info = get(gw.port, &format!("/workers/{id}")).json();
        assert_eq!(info["url"].as_str(), Some(b.url().as_str()));
        assert_eq!(info["model_id"].as_str(), Some("m"));
        assert_eq!(info["runtime_type"].as_str(), Some("sglang"), "detected from owned_by");
        assert_eq!(info["labels"]["zone"].as_str(), Some("b"));
        assert_eq!(info["is_healthy"].as_bool(), Some(true));
        assert_eq!(info["circuit_breaker"]["state"].as_str(), Some("closed"));
        // Shards report outcomes on their next tick.
        let processed = || get(gw.port, &format!("/workers/{id}")).json()["processed"].as_u64();
        assert!(wait_until(patience(Duration::from_secs(5)), || processed() == Some(b.served())), "{:?}", processed());
    });
}

#[test]
fn delete_drains_every_open_stream_then_removes_and_closes() {
    both_drivers(|legacy| {
        // Streams of 50 tokens at 60 ms: three seconds, long enough to all be open at once.
        let a = Sim::start("m", &["--itl-ms", "60"]);
        let b = Sim::start("m", &["--itl-ms", "60"]);
        let gw = Gateway::start(
            legacy,
            &[
                "--worker-urls",
                &a.url(),
                &b.url(),
                "--cores",
                "2",
                "--policy",
                "round_robin",
                "--drain-settle-secs",
                "1",
            ],
        );
        gw.ready_workers(2);
        let port = gw.port;
        // 64 streams, half of them on b.
        let streams: Vec<_> = (0..64)
            .map(|_| std::thread::spawn(move || post(port, "/v1/chat/completions", &chat(true, 50), &[])))
            .collect();
        // Every stream has reached its worker before the delete: one still on its way to b was
        // picked before the drain and would count as "a new request" below.
        assert!(
            wait_until(patience(Duration::from_secs(5)), || a.served() + b.served() == 64),
            "{} + {} of 64 streams arrived",
            a.served(),
            b.served()
        );
        assert!(b.stats()["running"].as_u64() >= Some(16), "{:?}", b.stats());
        let id = id_of(gw.port, &b.url());
        let r = call(gw.port, "DELETE", &format!("/workers/{id}"), "", &[]);
        assert_eq!(r.status, 202, "{}", r.text());
        assert_eq!(r.json()["worker_id"].as_str(), Some(id.as_str()));
        assert_eq!(status_of(gw.port, &id).as_deref(), Some("draining"));
        let served = b.served();
        for _ in 0..20 {
            let r = post(gw.port, "/v1/chat/completions", &chat(false, 2), &[]);
            assert_eq!(r.status, 200);
            assert_eq!(r.header("x-smg-routed-worker-id"), Some(a.url().as_str()), "a draining worker was picked");
        }
        assert_eq!(b.served(), served, "a new request reached the draining worker");
        let mut on_b = 0;
        for t in streams {
            let r = t.join().unwrap();
            assert!(
                r.status == 200 && r.complete && r.text().contains("data: [DONE]"),
                "a stream was cut: {}",
                r.text()
            );
            on_b += usize::from(r.header("x-smg-routed-worker-id") == Some(b.url().as_str()));
        }
        assert!(on_b >= 16, "only {on_b} streams were on the drained worker");
        assert!(wait_until(patience(Duration::from_secs(5)), || status_of(gw.port, &id).is_none()), "never removed");
        assert_eq!(get(gw.port, &format!("/workers/{id}")).status, 404);
        // Its pooled connections are closed (the stats request is the only one left).
        assert!(
            wait_until(patience(Duration::from_secs(5)), || b.stats()["connections_open"].as_u64() == Some(1)),
            "{:?}",
            b.stats()
        );
    });
}

#[test]
fn patch_errors_and_worker_shapes() {
    let a = Sim::start("m", &["--runtime", "vllm"]);
    let gw = Gateway::start(false, &["--worker-urls", &a.url()]);
    gw.ready_workers(1);
    let id = id_of(gw.port, &a.url());
    assert_eq!(id.len(), 36, "a UUID: {id}");
    assert_eq!(&id[14..15], "7", "UUIDv7");
    let r = call(gw.port, "PATCH", &format!("/workers/{id}"), r#"{"labels":{"realtime":"true"},"priority":9}"#, &[]);
    assert_eq!(r.status, 202, "{}", r.text());
    let info = get(gw.port, &format!("/workers/{id}")).json();
    assert_eq!(info["labels"]["realtime"].as_str(), Some("true"));
    assert_eq!(info["priority"].as_u64(), Some(9));
    assert_eq!(info["runtime_type"].as_str(), Some("vllm"), "detected from /v1/models owned_by");
    let list = get(gw.port, "/workers").json();
    assert_eq!(list["total"].as_u64(), Some(1));
    assert_eq!(list["stats"]["regular_count"].as_u64(), Some(1));
    assert_eq!(get(gw.port, "/workers?model=other").json()["total"].as_u64(), Some(0));
    assert_eq!(get(gw.port, "/workers?model=m").json()["total"].as_u64(), Some(1));

    let dup = call(gw.port, "POST", "/workers", &format!(r#"{{"url":"{}/"}}"#, a.url()), &[]);
    assert_eq!(dup.status, 409);
    assert_eq!(dup.json()["code"].as_str(), Some("WORKER_ALREADY_EXISTS"));
    assert!(dup.json()["error"].as_str().unwrap().contains(&id));
    let cases = [
        ("GET", "/workers/not-a-uuid".to_string(), "", 400, "BAD_REQUEST"),
        ("GET", "/workers/0190b7a0-0000-7000-8000-000000000000".into(), "", 404, "WORKER_NOT_FOUND"),
        ("DELETE", "/workers/0190b7a0-0000-7000-8000-000000000000".into(), "", 404, "WORKER_NOT_FOUND"),
        ("POST", "/workers".into(), "{", 400, "BAD_REQUEST"),
        ("POST", "/workers".into(), r#"{"models":[]}"#, 422, "BAD_REQUEST"),
        ("POST", "/workers".into(), r#"{"url":"ftp://x"}"#, 400, "BAD_REQUEST"),
        ("PATCH", format!("/workers/{id}"), r#"{"priority":"high"}"#, 422, "BAD_REQUEST"),
    ];
    for (m, p, b, status, code) in cases {
        let r = call(gw.port, m, &p, b, &[]);
        assert_eq!(r.status, status, "{m} {p} {b}: {}", r.text());
        assert_eq!(r.json()["code"].as_str(), Some(code), "{m} {p}");
    }
}

#[test]
fn admin_routes_take_control_plane_credentials_only() {
    let a = Sim::start("m", &[]);
    let gw = Gateway::start(
        false,
        &[
            "--worker-urls",
            &a.url(),
            "--control-plane-api-keys",
            "1:ops:admin:adm,2:dev:user:usr",
            "--api-key",
            "shared",
        ],
    );
    gw.ready_workers(1);
    let id = id_of_with(gw.port, &a.url(), "Authorization: Bearer adm");
    let routes = [
        ("GET", "/workers".to_string(), ""),
        ("GET", format!("/workers/{id}"), ""),
        ("PATCH", format!("/workers/{id}"), r#"{"cost":2}"#),
        ("POST", "/flush_cache".into(), ""),
        ("GET", "/get_loads".into(), ""),
        ("GET", "/v1/workers".into(), ""),
    ];
    for (m, p, b) in &routes {
        for (key, want) in [(None, 401), (Some("shared"), 401), (Some("usr"), 403), (Some("nope"), 401)] {
            let h = key.map(|k| format!("Authorization: Bearer {k}"));
            let r = call(gw.port, m, p, b, &h.iter().map(String::as_str).collect::<Vec<_>>());
            assert_eq!(r.status, want, "{m} {p} with {key:?}");
        }
        let r = call(gw.port, m, p, b, &["Authorization: Bearer adm"]);
        assert!(r.status == 200 || r.status == 202, "{m} {p} as admin: {} {}", r.status, r.text());
    }
    // Worker info is public, as SMG's.
    assert_eq!(get(gw.port, "/get_server_info").status, 200);
}

fn id_of_with(port: u16, url: &str, auth: &str) -> String {
    let list = call(port, "GET", "/workers", "", &[auth]).json();
    let w = list["workers"].as_array().unwrap().iter().find(|w| w["url"].as_str() == Some(url)).cloned();
    w.unwrap()["id"].as_str().unwrap().to_string()
}

#[test]
fn fan_outs_and_pass_through() {
    let a = Sim::start("m", &["--dp-size", "1"]);
    let b = Sim::start("m", &[]);
    let gw = Gateway::start(false, &["--worker-urls", &a.url(), &b.url()]);
    gw.ready_workers(2);
    let r = call(gw.port, "POST", "/flush_cache", "", &[]);
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["successful"].as_array().unwrap().len(), 2, "{v:?}");
    assert_eq!(v["total_workers"].as_u64(), Some(2));
    assert_eq!(v["message"].as_str(), Some("Successfully flushed cache on all 2 workers"));
    let loads = get(gw.port, "/get_loads").json();
    assert_eq!(loads["total_workers"].as_u64(), Some(2), "{loads:?}");
    assert!(loads["loads"][0]["details"]["loads"].is_array());
    let info = get(gw.port, "/get_server_info");
    assert_eq!(info.status, 200);
    assert!(info.json()["max_running_requests"].is_number(), "{}", info.text());
    assert_eq!(call(gw.port, "POST", "/get_server_info", "", &[]).status, 405);
    assert_eq!(call(gw.port, "GET", "/flush_cache", "", &[]).status, 405);
}

#[test]
fn dp_aware_routes_ranks_and_splices_the_rank_into_the_body() {
    both_drivers(|legacy| {
        let a = Sim::start("m", &["--dp-size", "2"]);
        let gw = Gateway::start(legacy, &["--worker-urls", &a.url(), "--dp-aware", "--policy", "round_robin"]);
        gw.ready_workers(2);
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..20 {
            // An empty-looking and a spaced body both take the splice.
            let body = if i % 2 == 0 { chat(false, 2) } else { format!("  {} ", chat(false, 2)) };
            let r = post(gw.port, "/v1/chat/completions", &body, &[]);
            assert_eq!(r.status, 200, "{}", r.text());
            seen.insert(r.header("x-smg-routed-worker-id").unwrap().to_string());
        }
        let want: std::collections::BTreeSet<_> = [format!("{}@0", a.url()), format!("{}@1", a.url())].into();
        assert_eq!(seen, want);
        let st = a.stats();
        let ranks: Vec<u64> = st["dp_rank_requests"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect();
        assert_eq!(ranks, [10, 10], "each rank got its spliced requests: {st:?}");
        let list = get(gw.port, "/workers").json();
        assert_eq!(list["total"].as_u64(), Some(2));
        assert_eq!(list["workers"][1]["dp_rank"].as_u64(), Some(1));
    });
}

#[test]
fn overload_protection_skips_overloaded_workers_and_sheds_when_all_are() {
    let a = Sim::start("m", &["--max-running", "4"]);
    let b = Sim::start("m", &["--max-running", "4"]);
    let gw = Gateway::start(
        false,
        &["--worker-urls", &a.url(), &b.url(), "--load-monitor-interval", "1", "--worker-overload-shed"],
    );
    gw.ready_workers(2);
    // 4 running + 8 waiting: at the default threshold of 8 waiting requests.
    a.control(r#"{"reported_load":12}"#);
    let shed_a = |gw: &Gateway| get(gw.port, "/workers").json()["workers"][0]["overloaded"].as_bool() == Some(true);
    assert!(wait_until(patience(Duration::from_secs(5)), || shed_a(&gw)));
    for _ in 0..10 {
        let r = post(gw.port, "/v1/chat/completions", &chat(false, 2), &[]);
        assert_eq!(r.header("x-smg-routed-worker-id"), Some(b.url().as_str()));
    }
    b.control(r#"{"reported_load":40}"#);
    let all = |gw: &Gateway| post(gw.port, "/v1/chat/completions", &chat(false, 2), &[]).status == 503;
    assert!(wait_until(patience(Duration::from_secs(5)), || all(&gw)));
    let r = post(gw.port, "/v1/chat/completions", &chat(false, 2), &[]);
    assert_eq!(r.json()["error"]["code"].as_str(), Some("worker_overload_protection_shed"));
    assert_eq!(r.header("x-smg-error-code"), Some("worker_overload_protection_shed"));
    assert_eq!(r.header("retry-after"), Some("1"), "Retry-After is --load-monitor-interval");
    a.control(r#"{"reported_load":null}"#);
    assert!(wait_until(patience(Duration::from_secs(5)), || {
        let r = post(gw.port, "/v1/chat/completions", &chat(false, 2), &[]);
        r.status == 200 && r.header("x-smg-routed-worker-id") == Some(a.url().as_str())
    }));
}

#[test]
fn without_shed_an_overloaded_fleet_still_serves() {
    let a = Sim::start("m", &["--max-running", "4"]);
    let gw = Gateway::start(false, &["--worker-urls", &a.url(), "--load-monitor-interval", "1"]);
    gw.ready_workers(1);
    a.control(r#"{"reported_load":40}"#);
    let over = |gw: &Gateway| get(gw.port, "/workers").json()["workers"][0]["overloaded"].as_bool() == Some(true);
    assert!(wait_until(patience(Duration::from_secs(5)), || over(&gw)));
    assert_eq!(post(gw.port, "/v1/chat/completions", &chat(false, 2), &[]).status, 200, "SMG's least-loaded fallback");
}

/// A worker registered with a key of its own: the key goes to that worker in its
/// `Authorization`, and nowhere else: not in `GET /workers`, not in `GET /workers/{id}`, not in
/// the gateway's log (at debug level).
#[test]
fn a_stored_key_reaches_its_worker_and_is_never_shown() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let gw = Gateway::start(legacy, &["--log-level", "debug"]);
        let key = "sk-stored-5f3a9c";
        let id = register(gw.port, &format!(r#"{{"url":"{}","api_key":"{key}"}}"#, w.url()));
        gw.ready_workers(1);
        let r = post(gw.port, "/v1/chat/completions", &chat(false, 2), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        let seen = w.requests();
        assert_eq!(seen.last().and_then(|q| q.header("authorization")), Some(format!("Bearer {key}").as_str()));
        for path in ["/workers".to_string(), format!("/workers/{id}")] {
            let shown = get(gw.port, &path);
            assert_eq!(shown.status, 200);
            assert!(!shown.text().contains(key), "{path}: {}", shown.text());
        }
        assert!(!gw.log_text().contains(key), "the log shows the key");
    });
}
