//! Workers that fail, through the binary: a fleet of one faulty and one healthy simulated
//! worker, 100 concurrent clients per case, both drivers, two shards. Every client gets a
//! complete answer (retries land on the healthy worker) or, for a stream the dying worker
//! was already sending, a cut stream from that worker; none waits past its bound; the
//! circuit breaker opens and closes as configured, one state for both shards.

// clippy.toml's house rules are the gateway's: a test's threads are not shards and may block.
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::{Duration, Instant};

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::sim::Sim;
use support::*;

const CLIENTS: usize = 100;

struct Answer {
    started: Instant,
    took: Duration,
    result: Result<Response, String>,
}

fn body(stream: bool, tokens: u32) -> String {
    format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"max_tokens":{tokens},"stream":{stream}}}"#)
}

fn ask(port: u16, stream: bool, tokens: u32) -> Result<Response, String> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(post_bytes("/v1/chat/completions", &body(stream, tokens), &[]).as_bytes())
        .map_err(|e| e.to_string())?;
    read_response(&mut s, &mut Vec::new(), false).map_err(|e| e.to_string())
}

/// `CLIENTS` threads, each making `each` requests one after another.
fn wave(port: u16, each: usize, stream: bool, tokens: u32) -> Vec<Answer> {
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            std::thread::spawn(move || {
                (0..each)
                    .map(|_| {
                        let started = Instant::now();
                        let result = ask(port, stream, tokens);
                        Answer { started, took: started.elapsed(), result }
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
}

fn complete(r: &Response, stream: bool) -> bool {
    if r.status != 200 || !r.complete {
        return false;
    }
    if stream {
        r.text().contains("data: [DONE]")
    } else {
        sonic_rs::from_slice::<sonic_rs::Value>(&r.body).is_ok_and(|v| v["choices"].is_array())
    }
}

/// Every answer complete, each within `bound`.
fn all_complete(answers: &[Answer], stream: bool, bound: Duration, case: &str) {
    let bad: Vec<String> = answers
        .iter()
        .filter(|a| !a.result.as_ref().is_ok_and(|r| complete(r, stream)) || a.took > bound)
        .take(5)
        .map(|a| match &a.result {
            Ok(r) => format!("{} after {:?}: {}", r.status, a.took, r.text().chars().take(200).collect::<String>()),
            Err(e) => format!("{e} after {:?}", a.took),
        })
        .collect();
    assert!(bad.is_empty(), "{case}: {} of {} answers wrong, e.g. {bad:#?}", bad.len(), answers.len());
}

fn gateway(legacy: bool, bad: &Sim, good: &Sim, extra: &[&str]) -> Gateway {
    let (b, g) = (bad.url(), good.url());
    let mut args = vec!["--worker-urls", &b, &g, "--cores", "2", "--policy", "round_robin"];
    args.extend_from_slice(extra);
    let gw = Gateway::start(legacy, &args);
    gw.ready_workers(2);
    gw
}

/// The worker's entry in GET /workers.
fn worker_info(gw: &Gateway, url: &str) -> sonic_rs::Value {
    let list = get(gw.port, "/workers").json();
    let found = list["workers"].as_array().unwrap().iter().find(|w| w["url"].as_str() == Some(url)).cloned();
    found.unwrap_or_else(|| panic!("{url} not in GET /workers: {list:?}"))
}

fn breaker(gw: &Gateway, url: &str) -> String {
    worker_info(gw, url)["circuit_breaker"]["state"].as_str().unwrap_or("?").to_string()
}

#[test]
fn always_503_retries_on_the_healthy_worker_and_the_breaker_opens_then_closes() {
    both_drivers(|legacy| {
        let bad = Sim::start("m", &["--fail-rate", "1", "--fail-status", "503"]);
        let good = Sim::start("m", &[]);
        let mport = free_port().to_string();
        let gw = gateway(
            legacy,
            &bad,
            &good,
            &[
                "--cb-failure-threshold",
                "5",
                "--cb-success-threshold",
                "2",
                "--cb-timeout-duration-secs",
                "2",
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                &mport,
            ],
        );
        all_complete(&wave(gw.port, 3, false, 4), false, Duration::from_secs(5), "503");
        assert_eq!(breaker(&gw, &bad.url()), "open");
        let metrics = || try_get(mport.parse().unwrap(), "/metrics").map(|r| r.text()).unwrap_or_default();
        let (b, g) = (bad.url(), good.url());
        for line in [
            format!("smg_worker_cb_state{{worker=\"{b}\"}} 1"),
            format!("smg_worker_cb_state{{worker=\"{g}\"}} 0"),
            format!("smg_worker_cb_transitions_total{{worker=\"{b}\",from=\"closed\",to=\"open\"}} 1"),
        ] {
            assert!(
                wait_until(patience(Duration::from_secs(5)), || metrics().contains(&line)),
                "{line}:\n{}",
                metrics()
            );
        }
        assert!(metrics().contains("smg_worker_retries_total{worker_type=\"regular\",endpoint=\"chat\"}"));
        // One breaker for both shards: 100 new connections (spread over both) reach only
        // the healthy worker.
        let before = bad.served();
        all_complete(&wave(gw.port, 2, false, 4), false, Duration::from_secs(5), "503, breaker open");
        assert_eq!(bad.served(), before, "a request reached the worker whose breaker is open");
        // Healed, it is let back on probation after the timeout and closes after 2 successes.
        bad.control(r#"{"fail_rate":0}"#);
        assert!(wait_until(patience(Duration::from_secs(6)), || breaker(&gw, &bad.url()) == "half_open"));
        assert!(wait_until(patience(Duration::from_secs(6)), || {
            let _ = ask(gw.port, false, 2);
            breaker(&gw, &bad.url()) == "closed"
        }));
        let closed = format!("smg_worker_cb_transitions_total{{worker=\"{b}\",from=\"half_open\",to=\"closed\"}} 1");
        assert!(metrics().contains(&closed), "{}", metrics());
        let before = bad.served();
        all_complete(&wave(gw.port, 1, false, 4), false, Duration::from_secs(5), "healed");
        assert!(bad.served() > before, "a closed breaker takes traffic again");
    });
}

/// A 500 is the worker's answer to this request (an image sent to a text-only model is
/// enough): given once, as is, and one failure per request on the breaker, as SMG 1.13 does.
/// Retried and counted per attempt, two such requests would take the model offline.
#[test]
fn a_500_is_answered_once_and_counts_once_against_the_breaker() {
    both_drivers(|legacy| {
        let bad = Sim::start("m", &["--fail-rate", "1", "--fail-status", "500"]);
        let mport = free_port().to_string();
        // The default breaker (10 failures) and retries (5 attempts).
        let url = bad.url();
        let gw = Gateway::start(
            legacy,
            &["--worker-urls", &url, "--cores", "2", "--prometheus-host", "127.0.0.1", "--prometheus-port", &mport],
        );
        gw.ready_workers(1);
        let metrics = || try_get(mport.parse().unwrap(), "/metrics").map(|r| r.text()).unwrap_or_default();
        let failures = |n: u32| format!("smg_worker_cb_consecutive_failures{{worker=\"{url}\"}} {n}");
        let ask = || post(gw.port, "/v1/chat/completions", &body(false, 2), &[]);
        let failed = || bad.stats()["failed"].as_u64().unwrap_or(0);
        for i in 1..=9 {
            let r = ask();
            assert_eq!(r.status, 500, "request {i}: the worker's 500, as is: {}", r.text());
            assert_eq!(failed(), i, "request {i}: one attempt per request");
        }
        assert!(
            wait_until(patience(Duration::from_secs(5)), || metrics().contains(&failures(9))),
            "nine requests, nine failures:\n{}",
            metrics()
        );
        assert_eq!(breaker(&gw, &url), "closed", "nine bad requests took the model offline");
        // The tenth opens it, as SMG's breaker of 10 does.
        assert_eq!(ask().status, 500);
        assert!(wait_until(patience(Duration::from_secs(5)), || breaker(&gw, &url) == "open"));
        let r = ask();
        assert_eq!((r.status, r.header("x-smg-error-code")), (503, Some("no_available_workers")), "{}", r.text());
        assert_eq!(failed(), 10);
    });
}

#[test]
fn a_worker_killed_mid_stream_cuts_only_its_own_streams() {
    both_drivers(|legacy| {
        let bad = Sim::start("m", &["--itl-ms", "10"]);
        let good = Sim::start("m", &["--itl-ms", "10"]);
        let gw = gateway(legacy, &bad, &good, &[]);
        let port = gw.port;
        let clients = std::thread::spawn(move || wave(port, 2, true, 30));
        // Killed once streams are under way on it: the signal is the worker's own count.
        assert!(wait_until(patience(Duration::from_secs(5)), || bad.served() > 0), "no stream reached it");
        let killed = Instant::now();
        bad.die();
        let answers = clients.join().unwrap();
        let mut cut = 0;
        for a in &answers {
            let r = a.result.as_ref().unwrap_or_else(|e| panic!("no answer: {e}"));
            if complete(r, true) {
                continue;
            }
            cut += 1;
            assert_eq!(r.status, 200, "only a stream already under way may end short: {}", r.text());
            assert_eq!(r.header("x-smg-routed-worker-id"), Some(bad.url().as_str()), "cut by the healthy worker?");
            assert!(a.started < killed, "a request sent after the kill was cut");
        }
        assert!(cut < answers.len() / 2, "{cut} of {} cut", answers.len());
        all_complete(&wave(gw.port, 1, true, 5), true, Duration::from_secs(5), "after the kill");
    });
}

#[test]
fn a_worker_that_hangs_before_its_head_is_timed_out_and_retried() {
    both_drivers(|legacy| {
        let bad = Sim::start("m", &["--hang-rate", "1"]);
        let good = Sim::start("m", &[]);
        let gw = gateway(legacy, &bad, &good, &["--request-timeout-secs", "1", "--cb-failure-threshold", "3"]);
        // One timeout (1 s) and a retry at most: the breaker opens after 3.
        all_complete(&wave(gw.port, 2, false, 4), false, Duration::from_secs(4), "hang");
        assert_eq!(breaker(&gw, &bad.url()), "open");
    });
}

#[test]
fn flapping_health_never_fails_a_request() {
    both_drivers(|legacy| {
        let bad = Sim::start("m", &["--flap-health-ms", "300"]);
        let good = Sim::start("m", &[]);
        let flags =
            ["--health-check-interval-secs", "1", "--health-failure-threshold", "1", "--health-success-threshold", "1"];
        let gw = gateway(legacy, &bad, &good, &flags);
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            all_complete(&wave(gw.port, 1, false, 4), false, Duration::from_secs(5), "flapping");
        }
        assert!(wait_until(patience(Duration::from_secs(5)), || gw.log_has("is not_ready")), "{}", gw.log_text());
        assert!(wait_until(patience(Duration::from_secs(5)), || gw.log_has("is ready")));
    });
}

#[test]
fn connection_refused_is_retried_and_takes_the_worker_out() {
    both_drivers(|legacy| {
        let bad = Sim::start("m", &[]);
        let good = Sim::start("m", &[]);
        // Health checks would notice only in a minute: the breaker and retries must cover.
        let gw = gateway(legacy, &bad, &good, &[]);
        bad.die();
        all_complete(&wave(gw.port, 2, false, 4), false, Duration::from_secs(5), "refused");
        // Taken out by whichever notices first: the breaker, or the health checks a refused
        // connect triggers at once.
        let w = worker_info(&gw, &bad.url());
        let out = w["circuit_breaker"]["state"].as_str() == Some("open") || w["status"].as_str() != Some("ready");
        assert!(out, "a dead worker is still routable: {w:?}");
    });
}

#[test]
fn slow_accept_and_closing_keep_alive_still_answer_every_client() {
    both_drivers(|legacy| {
        let slow = Sim::start("m", &["--accept-delay-ms", "20"]);
        let closing = Sim::start("m", &["--close-after-response"]);
        let gw = gateway(legacy, &slow, &closing, &[]);
        all_complete(&wave(gw.port, 3, false, 4), false, Duration::from_secs(10), "slow accept / closing");
        all_complete(&wave(gw.port, 1, true, 8), true, Duration::from_secs(10), "streams");
        assert!(slow.served() > 0 && closing.served() > 0, "both took traffic");
    });
}

#[test]
fn a_response_broken_before_its_first_byte_is_retried_elsewhere() {
    both_drivers(|legacy| {
        let rogue = support::rogue::RogueWorker::start("m", support::rogue::Mode::BadFirstChunk);
        let good = Sim::start("m", &[]);
        let (r, g) = (rogue.url(), good.url());
        let gw = Gateway::start(legacy, &["--worker-urls", &r, &g, "--cores", "2", "--policy", "round_robin"]);
        gw.ready_workers(2);
        // The head arrived, then a chunk that is not one: nothing went to the client yet, so
        // the request may still go to the healthy worker.
        all_complete(&wave(gw.port, 2, false, 4), false, Duration::from_secs(5), "bad first chunk");
        assert!(rogue.state.posts.load(std::sync::atomic::Ordering::SeqCst) > 0, "the rogue worker was never tried");
    });
}
