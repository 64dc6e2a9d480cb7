//! `--max-concurrent-requests N` is a concurrency cap on every shard count, whatever
//! `--rate-limit-tokens-per-second` says (its default is N, as SMG's): slow requests arriving
//! half a second apart never put more than N at the worker at once, and the queue's places
//! hold gateway-wide. As in SMG 1.13 the rate's tokens come back when requests end, so it
//! never throttles what the cap admits.
// clippy.toml's house rules are the gateway's: a test's threads are not shards and may sleep.
#![allow(clippy::disallowed_methods)]

mod support;

use std::io::Write;
use std::time::Duration;

use support::rogue::connect_with;
use support::*;

/// A stream of `events` events `gap_ms` apart.
fn slow_chat(events: usize, gap_ms: u64) -> String {
    format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"stream":true,"fake":"sse","events":{events},"gap_ms":{gap_ms}}}"#
    )
}

#[test]
fn the_cap_holds_with_the_default_rate_on_one_and_two_shards() {
    both_drivers(|legacy| {
        for (cap, cores) in [(1, 1), (1, 2), (2, 1), (2, 2)] {
            let w = FakeWorker::start("m");
            let (n, c, url) = (cap.to_string(), cores.to_string(), w.url());
            let gw = Gateway::start(legacy, &["--worker-urls", &url, "--max-concurrent-requests", &n, "--cores", &c]);
            gw.ready();
            // Each holds its permit for 1.5 s; one arrives every 0.5 s (the pacing of the load,
            // not a wait for the gateway), so the rate's tokens come while permits are held.
            let clients: Vec<_> = (0..cap + 2)
                .map(|i| {
                    if i > 0 {
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    let port = gw.port;
                    std::thread::spawn(move || {
                        let mut s = connect_with(port, patience(Duration::from_secs(60))).unwrap();
                        s.write_all(post_bytes("/v1/chat/completions", &slow_chat(5, 300), &[]).as_bytes()).unwrap();
                        read_response(&mut s, &mut Vec::new(), false).map(|r| r.status)
                    })
                })
                .collect();
            for t in clients {
                let status = t.join().unwrap().expect("an answer");
                assert_eq!(status, 200, "N={cap}, {cores} shard(s): every request is served in turn");
            }
            assert_eq!(w.state.max_in_flight(), cap, "N={cap} on {cores} shard(s): requests at the worker at once");
        }
    });
}

/// One permit and one queue place on two shards: while a stream holds the permit, exactly one
/// of six requests (on fresh connections, so on either shard) waits and the rest are refused
/// at once, 429. Split per shard, each shard would have queued one.
#[test]
fn one_permit_and_one_queue_place_hold_across_two_shards() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let url = w.url();
        let gw = Gateway::start(
            legacy,
            &[
                "--worker-urls",
                &url,
                "--max-concurrent-requests",
                "1",
                "--queue-size",
                "1",
                "--rate-limit-tokens-per-second",
                "0",
                "--queue-timeout-secs",
                "60",
                "--cores",
                "2",
            ],
        );
        gw.ready();
        // Held until the test closes it: the worker answers only once the client leaves.
        let mut held = connect_with(gw.port, patience(Duration::from_secs(60))).unwrap();
        let hang = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"fake":"hang"}"#;
        held.write_all(post_bytes("/v1/chat/completions", hang, &[]).as_bytes()).unwrap();
        assert!(wait_until(patience(Duration::from_secs(5)), || w.state.in_flight() == 1), "the held request");
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..6 {
            let (tx, port) = (tx.clone(), gw.port);
            std::thread::spawn(move || {
                let mut s = connect_with(port, patience(Duration::from_secs(60))).unwrap();
                let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
                s.write_all(post_bytes("/v1/chat/completions", body, &[]).as_bytes()).unwrap();
                let _ = tx.send(read_response(&mut s, &mut Vec::new(), false).map(|r| r.status).unwrap_or(0));
            });
        }
        // Five are refused at once; the one in the queue answers only after the permit frees.
        for k in 0..5 {
            let status = rx.recv_timeout(patience(Duration::from_secs(10)));
            assert_eq!(status, Ok(429), "answer {k}: one request queued, the others refused");
        }
        drop(held);
        // (The worker's own in-flight count is not read here: it notices the held request's
        // client gone up to 50 ms after the gateway has freed the permit.)
        assert_eq!(rx.recv_timeout(patience(Duration::from_secs(10))), Ok(200), "the queued request, admitted");
    });
}

/// The rate never throttles requests the cap admits: with N=1 (a refill of 1 a second by
/// default) and no queue, 20 back-to-back requests are all admitted, as SMG 1.13 admits them
/// (its bucket takes a request's token back when the request ends). Consuming a token per
/// admission would refuse most of them with 429.
#[test]
fn back_to_back_requests_are_not_throttled_by_the_default_rate() {
    both_drivers(|legacy| {
        let w = FakeWorker::start("m");
        let url = w.url();
        let gw =
            Gateway::start(legacy, &["--worker-urls", &url, "--max-concurrent-requests", "1", "--queue-size", "0"]);
        gw.ready();
        let mut s = gw.connect();
        let mut rest = Vec::new();
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        for i in 0..20 {
            s.write_all(post_bytes("/v1/chat/completions", body, &[]).as_bytes()).unwrap();
            let r = read_response(&mut s, &mut rest, false).unwrap();
            assert_eq!(r.status, 200, "request {i}: {}", r.text());
        }
    });
}
