//! Admission per role of prefill/decode pairs through the binary, both drivers, against
//! smg-sim pairs: the prefill's legs in flight (`--prefill-max-inflight-requests-per-worker`)
//! exact across two shards on SGLang, vLLM and gRPC pairs, its queue (full, timed out), and
//! the decode's running window (`--pd-admission-wait-secs`): held, then shed.

// clippy.toml's house rules are the gateway's: a test's threads are not shards and may block.
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::Duration;

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::pd::{chat, decode, decode_of, pd_gateway, prefill, prefill_of, stat};
use support::sim::Sim;
use support::{both_drivers, patience, post, wait_until, Gateway, Response};

/// `n` requests of `body` at once, each from its own client.
fn at_once(port: u16, n: usize, body: &str) -> Vec<std::thread::JoinHandle<Response>> {
    (0..n).map(|_| sent(port, body, None)).collect()
}

/// One request of `body` (with `x-request-id: id`) from a client of its own.
fn sent(port: u16, body: &str, id: Option<&str>) -> std::thread::JoinHandle<Response> {
    let (body, header) = (body.to_string(), id.map(|id| format!("x-request-id: {id}")));
    std::thread::spawn(move || {
        post(
            port,
            "/v1/chat/completions",
            &body,
            header.as_slice().iter().map(String::as_str).collect::<Vec<_>>().as_slice(),
        )
    })
}

/// A shed: its status, code and `Retry-After`, in the contract's envelope (`type` is the
/// status's reason phrase) with `X-SMG-Error-Code`.
fn assert_shed(r: &Response, status: u16, code: &str, retry_after: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(r.header("x-smg-error-code"), Some(code));
    assert_eq!(r.header("retry-after"), Some(retry_after), "{code}");
    let e = &r.json()["error"];
    assert_eq!(e["code"].as_str(), Some(code));
    let reason = if status == 429 { "Too Many Requests" } else { "Service Unavailable" };
    assert_eq!(e["type"].as_str(), Some(reason));
    assert!(e["param"].is_null() && e["message"].as_str().is_some_and(|m| !m.is_empty()));
}

/// Prefill legs in flight are capped per prefill worker across both shards, whichever pair
/// shape carries them: 12 requests at once, one prefill slot, all answered, and the
/// prefill never ran two. Each shape gives its slot back when its prefill leg ends (else
/// the queue would stall).
#[test]
fn prefill_legs_in_flight_are_exact_gateway_wide_on_every_pair_shape() {
    both_drivers(|legacy| {
        let limit = ["--cores", "2", "--prefill-max-inflight-requests-per-worker", "1"];
        let handoff = patience(Duration::from_secs(20));
        let run = |p: &Sim, gw: &Gateway, body: &str, shape: &str| {
            let answers: Vec<Response> = at_once(gw.port, 12, body).into_iter().map(|h| h.join().unwrap()).collect();
            for r in &answers {
                assert_eq!(r.status, 200, "{shape}: {}", r.text());
            }
            assert_eq!(stat(p, "peak_running"), 1, "{shape}: one prefill leg at a time, gateway-wide");
        };
        {
            let (p, b) = prefill(&["--ttft-ms", "20"]);
            let d = decode(handoff, &[]);
            let gw = pd_gateway(legacy, &[(p.url(), Some(b))], &[d.url()], &limit);
            run(&p, &gw, &chat(""), "sglang");
        }
        {
            let (p, _) = prefill(&["--ttft-ms", "20", "--runtime", "vllm"]);
            let d = decode(handoff, &["--runtime", "vllm"]);
            let gw = pd_gateway(legacy, &[(p.url(), None)], &[d.url()], &limit);
            run(&p, &gw, &chat(""), "vllm");
        }
        {
            const MODEL: &str = "sim-model";
            let (p, b) = prefill_of(MODEL, &["--grpc", "--ttft-ms", "20"]);
            let d = decode_of(MODEL, handoff, &["--grpc"]);
            let gw = pd_gateway(legacy, &[(p.grpc_url(), Some(b))], &[d.grpc_url()], &limit);
            run(&p, &gw, &chat("").replace(r#""model":"m""#, &format!(r#""model":"{MODEL}""#)), "grpc");
        }
    });
}

/// A prefill at its limit: without a queue the next pair is refused at once; with one, a
/// pair waits, the next finds no place, and the waiting one times out. Nothing reaches a
/// worker for a refused pair, and every slot and place is back afterwards.
#[test]
fn a_full_prefill_refuses_or_queues_and_the_queue_times_out() {
    both_drivers(|legacy| {
        // The prefill leg that holds the slot: far past the 1 s queue timeout.
        let hold = patience(Duration::from_secs(4));
        let ms = hold.as_millis().to_string();
        let (p, b) = prefill(&["--ttft-ms", &ms]);
        let d = decode(hold * 3, &[]);
        let prefills = [(p.url(), Some(b))];
        let flags = |queue: &'static str| {
            let mut f = vec!["--cores", "2", "--log-level", "debug", "--prefill-max-inflight-requests-per-worker", "1"];
            f.extend(["--prefill-queue-size", queue, "--prefill-queue-timeout-secs", "1"]);
            f
        };
        {
            let gw = pd_gateway(legacy, &prefills, &[d.url()], &flags("0"));
            let first = at_once(gw.port, 1, &chat(""));
            assert!(wait_until(hold, || stat(&p, "running") == 1), "the first prefill leg runs");
            let r = post(gw.port, "/v1/chat/completions", &chat(""), &[]);
            assert_shed(&r, 429, "pd_prefill_queue_full", "2");
            for h in first {
                assert_eq!(h.join().unwrap().status, 200);
            }
            assert_eq!(stat(&p, "inference_requests"), 1, "nothing sent for the refused pair");
        }
        let served = stat(&p, "inference_requests");
        let gw = pd_gateway(legacy, &prefills, &[d.url()], &flags("1"));
        let first = at_once(gw.port, 1, &chat(""));
        assert!(wait_until(hold, || stat(&p, "running") == 1), "the first prefill leg runs");
        let queued = sent(gw.port, &chat(""), Some("queued-pair"));
        let waits = "request queued-pair: waiting in the prefill queue";
        assert!(wait_until(hold, || gw.log_has(waits)), "the second pair queues");
        let r = post(gw.port, "/v1/chat/completions", &chat(""), &[]);
        assert_shed(&r, 429, "pd_prefill_queue_full", "2");
        assert_shed(&queued.join().unwrap(), 429, "pd_prefill_queue_timeout", "2");
        for h in first {
            assert_eq!(h.join().unwrap().status, 200);
        }
        assert_eq!(stat(&p, "inference_requests"), served + 1, "only the admitted pair reached the prefill");
        // Its slot and the queue's place are back: the next pair is served.
        p.control(r#"{"ttft_ms":5}"#);
        let r = post(gw.port, "/v1/chat/completions", &chat(""), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
    });
}

/// A decode that reports a running window of one takes one pair at a time from the
/// gateway: with no wait, the next pair is shed (503, Retry-After the load-monitor
/// interval) and nothing is sent; with the default wait, pairs are held until the slot
/// frees, so the decode never queues one itself.
#[test]
fn a_decode_running_window_holds_pairs_then_sheds_them() {
    both_drivers(|legacy| {
        let hold = patience(Duration::from_secs(2));
        let ms = hold.as_millis().to_string();
        let (p, b) = prefill(&["--ttft-ms", &ms]);
        let d = decode(hold * 3, &["--max-running", "1"]);
        let prefills = [(p.url(), Some(b))];
        {
            let flags = ["--cores", "2", "--pd-admission-wait-secs", "0", "--load-monitor-interval", "7"];
            let gw = pd_gateway(legacy, &prefills, &[d.url()], &flags);
            let w = support::get(gw.port, "/workers").json();
            let workers = w["workers"].as_array().map(|a| a.iter().collect::<Vec<_>>()).unwrap_or_default();
            let reported = workers.iter().any(|w| w["max_running_requests"].as_u64() == Some(1));
            assert!(reported, "the decode's window was discovered: {w:?}");
            let first = at_once(gw.port, 1, &chat(""));
            assert!(wait_until(hold, || stat(&p, "running") == 1), "the first pair is dispatched");
            let r = post(gw.port, "/v1/chat/completions", &chat(""), &[]);
            assert_shed(&r, 503, "worker_overload_protection_shed", "7");
            for h in first {
                assert_eq!(h.join().unwrap().status, 200);
            }
            assert_eq!(
                (stat(&p, "inference_requests"), stat(&d, "inference_requests")),
                (1, 1),
                "nothing sent for the shed pair"
            );
        }
        p.control(r#"{"ttft_ms":5}"#);
        let gw = pd_gateway(legacy, &prefills, &[d.url()], &["--cores", "2"]);
        for h in at_once(gw.port, 6, &chat("")) {
            let r = h.join().unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
        }
        assert_eq!(stat(&d, "peak_running"), 1);
        assert_eq!(stat(&d, "peak_waiting"), 0, "the gateway held the pairs, not the decode");
    });
}
