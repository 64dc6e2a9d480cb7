//! The priority scheduler (`--priority-scheduler-enabled`) through the binary, both drivers,
//! two shards: preemption before the first byte, reserved floors, starvation promotion, the
//! queue's 429 and 503, and bad configuration files.

// clippy.toml's house rules are the gateway's: a test's threads are not shards and may block.
#![allow(clippy::disallowed_methods)]

mod support;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use sonic_rs::JsonValueTrait;
use support::admit::*;
use support::*;

const HANG: &str = r#"{"model":"m","stream":true,"fake":"hang","messages":[{"role":"user","content":"hi"}]}"#;
const SLOW: &str =
    r#"{"model":"m","stream":true,"fake":"sse","events":3,"gap_ms":150,"messages":[{"role":"user","content":"hi"}]}"#;
const ECHO: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

fn class_line(class: &str, floor: u32, queue: u32, timeout: u64, starve: u64, preempt: bool) -> String {
    format!("  {class}: {{reserved_floor: {floor}, queue_size: {queue}, queue_timeout_secs: {timeout}, starvation_threshold_secs: {starve}, can_preempt: {preempt}}}\n")
}

/// The scheduler's file, removed when the test is done with it.
fn file(name: &str, text: &str) -> tempfile::TempPath {
    let p = tempfile::Builder::new().prefix(&format!("smg-priority-{name}-")).suffix(".yaml").tempfile().unwrap();
    std::fs::write(p.path(), text).unwrap();
    p.into_temp_path()
}

fn gateway(legacy: bool, w: &FakeWorker, cfg: &std::path::Path) -> Gateway {
    let url = w.url();
    let cfg = cfg.display().to_string();
    let args = [
        "--worker-urls",
        &url,
        "--cores",
        "2",
        "--prometheus-port",
        "0",
        "--priority-scheduler-enabled",
        "--priority-scheduler-default-max-class",
        "system",
        "--priority-scheduler-config",
        &cfg,
    ];
    let gw = start_env(legacy, &args, &[]);
    gw.ready_workers(1);
    gw
}

fn send(port: u16, class: &str, body: &str) -> TcpStream {
    use std::io::Write;
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(patience(Duration::from_secs(20)))).unwrap();
    let h = format!("X-SMG-Priority: {class}");
    s.write_all(post_bytes("/v1/chat/completions", body, &[&h]).as_bytes()).unwrap();
    s
}

fn answer(s: &mut TcpStream) -> Response {
    read_response(s, &mut Vec::new(), false).expect("a response")
}

fn hangs(w: &FakeWorker) -> usize {
    w.requests().iter().filter(|r| r.body.windows(6).any(|b| b == b"\"hang\"")).count()
}

#[test]
fn interactive_preempts_bulk_streams_that_have_not_started() {
    let mut yaml = String::from("classes:\n");
    yaml += &class_line("system", 0, 64, 30, 5, true);
    yaml += &class_line("interactive", 0, 64, 30, 5, true);
    yaml += &class_line("default", 0, 64, 30, 30, false);
    yaml += &class_line("bulk", 0, 64, 30, 120, false);
    let cfg = file("preempt", &yaml);
    both_drivers(|legacy| {
        let w = FakeWorker::start_reporting("m", 4);
        let gw = gateway(legacy, &w, &cfg);
        let mut bulks: Vec<TcpStream> = (0..4).map(|_| send(gw.port, "bulk", HANG)).collect();
        assert!(
            wait_until(patience(Duration::from_secs(5)), || w.state.in_flight() == 4),
            "4 bulk streams at the worker"
        );
        let closes_before = w.state.closed_at.lock().unwrap().len();
        let t0 = Instant::now();
        // The interactive requests hold their slots a while (a stream 450 ms long): one that
        // finished at once would free its slot for the next, which then need not preempt.
        let mut inter: Vec<TcpStream> = (0..4).map(|_| send(gw.port, "interactive", SLOW)).collect();
        for b in &mut bulks {
            let r = answer(b);
            assert_eq!(r.status, 503, "{}", r.text());
            assert_eq!(r.header("x-smg-error-code"), Some("scheduler_preempted"));
            assert_eq!(r.header("x-smg-preempted"), Some("true"));
            assert_eq!(r.header("retry-after"), Some("1"));
            assert_eq!(r.json()["error"]["code"].as_str(), Some("scheduler_preempted"));
        }
        for i in &mut inter {
            assert_eq!(answer(i).status, 200);
        }
        // The fake worker notices a close within 50 ms (it polls).
        wait_until(patience(Duration::from_secs(2)), || w.state.closed_at.lock().unwrap().len() >= closes_before + 4);
        let closes: Vec<Duration> = w.state.closed_at.lock().unwrap()[closes_before..]
            .iter()
            .map(|t| t.saturating_duration_since(t0))
            .collect();
        assert!(closes.len() >= 4, "the 4 bulk worker connections closed: {closes:?}");
        let mut sorted = closes.clone();
        sorted.sort();
        assert!(sorted[3] < patience(Duration::from_millis(100)), "worker connections closed at {sorted:?}");
    });
}

#[test]
fn reserved_floors_hold() {
    let mut yaml = String::from("classes:\n");
    yaml += &class_line("system", 0, 64, 30, 5, true);
    yaml += &class_line("interactive", 2, 64, 30, 5, true);
    yaml += &class_line("default", 0, 64, 30, 30, false);
    yaml += &class_line("bulk", 0, 64, 30, 120, false);
    let cfg = file("floors", &yaml);
    both_drivers(|legacy| {
        let w = FakeWorker::start_reporting("m", 4);
        let gw = gateway(legacy, &w, &cfg);
        let _bulks: Vec<TcpStream> = (0..4).map(|_| send(gw.port, "bulk", HANG)).collect();
        assert!(wait_until(patience(Duration::from_secs(5)), || hangs(&w) == 2), "2 bulk requests admitted");
        // The 2 reserved slots are there for interactive, at once, however the shards
        // split the load; bulk never got them.
        let mut inter: Vec<TcpStream> = (0..2).map(|_| send(gw.port, "interactive", ECHO)).collect();
        for i in &mut inter {
            assert_eq!(answer(i).status, 200);
        }
        assert_eq!(hangs(&w), 2, "bulk stayed out of the reserved slots");
    });
}

#[test]
fn a_starving_bulk_request_is_promoted() {
    let mut yaml = String::from("classes:\n");
    // Interactive's floor is every slot (reservations that do not fit would be scaled).
    yaml += &class_line("system", 0, 64, 30, 5, true);
    yaml += &class_line("interactive", 4, 64, 30, 5, true);
    yaml += &class_line("default", 0, 64, 30, 30, false);
    yaml += &class_line("bulk", 0, 64, 30, 1, false);
    let cfg = file("starve", &yaml);
    both_drivers(|legacy| {
        let w = FakeWorker::start_reporting("m", 4);
        let gw = gateway(legacy, &w, &cfg);
        // Every slot is interactive's: bulk only gets one as a starving head.
        let t0 = Instant::now();
        let mut b = send(gw.port, "bulk", ECHO);
        let r = answer(&mut b);
        let waited = t0.elapsed();
        assert_eq!(r.status, 200, "{}", r.text());
        if waited < Duration::from_millis(950) {
            // The log shown is the one with the request's access line in it.
            let _ = gw.log_has("priority=bulk");
            panic!("promoted only after its threshold: {waited:?}; {}", gw.log_text());
        }
        assert!(waited < patience(Duration::from_secs(3)), "promoted in time: {waited:?}");
    });
}

#[test]
fn queue_full_and_queue_timeout() {
    let mut yaml = String::from("classes:\n");
    yaml += &class_line("system", 0, 64, 30, 5, true);
    yaml += &class_line("interactive", 4, 64, 30, 5, true);
    yaml += &class_line("default", 0, 64, 30, 30, false);
    yaml += &class_line("bulk", 0, 2, 1, 100, false);
    let cfg = file("queue", &yaml);
    both_drivers(|legacy| {
        let w = FakeWorker::start_reporting("m", 4);
        let gw = gateway(legacy, &w, &cfg);
        // A queue of 2 over 2 shards: of 3 bulk requests at least one finds its shard's
        // place taken.
        let mut bulks: Vec<TcpStream> = (0..3).map(|_| send(gw.port, "bulk", ECHO)).collect();
        let answers: Vec<Response> = bulks.iter_mut().map(answer).collect();
        let full = answers.iter().filter(|r| r.status == 429).count();
        assert!(full >= 1, "{:?}", answers.iter().map(|r| r.status).collect::<Vec<_>>());
        for r in &answers {
            assert_eq!(r.header("retry-after"), Some("2"));
            match r.status {
                429 => assert_eq!(r.header("x-smg-error-code"), Some("scheduler_queue_full")),
                503 => assert_eq!(r.header("x-smg-error-code"), Some("scheduler_queue_timeout")),
                s => panic!("unexpected {s}: {}", r.text()),
            }
        }
        assert!(answers.iter().any(|r| r.status == 503), "the queued ones time out");
        assert_eq!(w.requests().len(), 0, "no bulk request reached the worker");
    });
}

#[test]
fn bad_config_files_fail_at_start_naming_file_and_line() {
    let cases = [
        ("malformed", "classes:\n  bulk:\n    reserved_floor: [1,\n", "line"),
        ("unknown-class", "classes:\n  vip:\n    reserved_floor: 1\n", "line 2"),
        (
            "negative",
            "classes:\n  bulk:\n    reserved_floor: -3\n    queue_size: 1\n    queue_timeout_secs: 1\n    starvation_threshold_secs: 1\n    can_preempt: false\n",
            "line 3",
        ),
        ("unknown-max-class", "tenant_policies:\n  \"auth:acme\":\n    max_class: gold\n", "line 3"),
    ];
    for (name, text, line) in cases {
        let p = file(name, text);
        let path = p.display().to_string();
        let (status, err) = launch_outcome(
            false,
            &[
                "--worker-urls",
                "http://127.0.0.1:9",
                "--priority-scheduler-enabled",
                "--priority-scheduler-config",
                &path,
            ],
            &[],
        );
        assert!(!status.success(), "{name}: started");
        assert!(err.contains(&path) && err.contains(line), "{name}: {err}");
    }
}

#[test]
fn classes_are_counted_in_metrics_and_the_access_log() {
    let mut yaml = String::from("classes:\n");
    for c in ["system", "interactive", "default", "bulk"] {
        yaml += &class_line(c, 0, 64, 30, 30, c != "bulk");
    }
    let cfg = file("metrics", &yaml);
    let w = FakeWorker::start_reporting("m", 4);
    let (url, cfg, mport) = (w.url(), cfg.display().to_string(), free_port().to_string());
    let args = [
        "--worker-urls",
        &url,
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        &mport,
        "--priority-scheduler-enabled",
        "--priority-scheduler-default-max-class",
        "system",
        "--priority-scheduler-config",
        &cfg,
    ];
    let gw = start_env(false, &args, &[]);
    gw.ready_workers(1);
    for class in ["interactive", "interactive", "bulk", "no-such-class"] {
        assert_eq!(answer(&mut send(gw.port, class, ECHO)).status, 200);
    }
    let scrape = || try_get(mport.parse().unwrap(), "/metrics").map(|r| r.text()).unwrap_or_default();
    for line in [
        r#"smg_scheduler_admit_total{class="interactive",result="admitted"} 2"#,
        r#"smg_scheduler_admit_total{class="bulk",result="admitted"} 1"#,
        r#"smg_scheduler_admit_total{class="default",result="admitted"} 1"#,
        r#"smg_scheduler_inflight{class="interactive"} 0"#,
        r#"smg_scheduler_queue_depth{class="bulk"} 0"#,
    ] {
        assert!(wait_until(patience(Duration::from_secs(5)), || scrape().contains(line)), "{line}:\n{}", scrape());
    }
    assert!(gw.log_has("priority=interactive") && gw.log_has("priority=default"), "{}", gw.log_text());
}

/// SMG's class defaults reserve at least 160 slots; one worker that reports no capacity
/// counts for 64. Idle, a `default` and a `bulk` request are answered at once (they used to
/// wait 30 s and 120 s for starvation promotion); under a bulk flood the scaled
/// reservations still keep slots for interactive traffic, without preempting anyone.
#[test]
fn class_defaults_on_a_small_fleet_serve_idle_and_protect_under_contention() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let url = w.url();
        let args = ["--worker-urls", &url, "--cores", "2", "--priority-scheduler-enabled"];
        let gw = start_env(legacy, &args, &[]);
        gw.ready_workers(1);
        assert!(gw.log_has("capacity 64 slots, reserved [0, 2, 19, 9]"), "{}", gw.log_text());
        // Idle: answered at once. Wrong would be the class's starvation threshold (30 s,
        // 120 s); the bound sits halfway to the shorter one.
        for class in ["default", "bulk"] {
            let mut s = send(gw.port, class, ECHO);
            s.set_read_timeout(Some(patience(Duration::from_secs(15)))).unwrap();
            let r = read_response(&mut s, &mut Vec::new(), false);
            assert_eq!(r.map(|r| r.status).ok(), Some(200), "{class} on an idle gateway");
        }
        // Contention: bulk takes what is not reserved (64 - 30) and queues the rest.
        let _bulks: Vec<TcpStream> = (0..40).map(|_| send(gw.port, "bulk", HANG)).collect();
        assert!(
            wait_until(patience(Duration::from_secs(10)), || hangs(&w) == 34),
            "34 bulk requests admitted, got {}",
            hangs(&w)
        );
        let mut inter: Vec<TcpStream> = (0..2).map(|_| send(gw.port, "interactive", ECHO)).collect();
        for i in &mut inter {
            assert_eq!(answer(i).status, 200);
        }
        assert_eq!(hangs(&w), 34, "bulk stayed out of the reserved slots");
        assert!(!gw.log_text().contains("preempting"), "served from the reservation, not by preemption");
    });
}

/// A class's `queue_size` holds gateway-wide: bulk's one place on two shards queues one
/// request while the slot is held, and every other bulk request (on fresh connections, so on
/// either shard) is refused at once, 429 `scheduler_queue_full`, instead of queueing per
/// shard and timing out with 503.
#[test]
fn a_class_queue_size_holds_across_shards() {
    let mut yaml = String::from("classes:\n");
    yaml += &class_line("system", 0, 8, 30, 30, false);
    yaml += &class_line("interactive", 0, 8, 30, 30, false);
    yaml += &class_line("default", 0, 8, 30, 30, false);
    yaml += &class_line("bulk", 0, 1, 30, 120, false);
    let cfg = file("bulk-queue-1", &yaml);
    both_drivers(|legacy| {
        let w = FakeWorker::start_reporting("m", 1);
        let gw = gateway(legacy, &w, &cfg);
        let held = send(gw.port, "system", HANG);
        assert!(wait_until(patience(Duration::from_secs(5)), || w.state.in_flight() == 1), "the held request");
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..4 {
            let (tx, port) = (tx.clone(), gw.port);
            std::thread::spawn(move || {
                let mut s = send(port, "bulk", ECHO);
                let r = read_response(&mut s, &mut Vec::new(), false).ok();
                let _ = tx.send(r.map(|r| (r.status, r.header("x-smg-error-code").map(str::to_string))));
            });
        }
        for k in 0..3 {
            let got = rx.recv_timeout(patience(Duration::from_secs(10)));
            assert_eq!(
                got,
                Ok(Some((429, Some("scheduler_queue_full".into())))),
                "answer {k}: one queued, the others refused"
            );
        }
        drop(held);
        let got = rx.recv_timeout(patience(Duration::from_secs(10)));
        assert_eq!(got.map(|r| r.map(|(s, _)| s)), Ok(Some(200)), "the queued bulk request, admitted");
    });
}
