//! smg-sim's timing model (TTFT, ITL, prefill, batching) and prefix-cache accounting, under both drivers.
//!
//! Timing checks run at light load (one request at a time) and test the model's arithmetic
//! end to end, not machine speed. Each bound sits halfway between the right delay and the
//! nearest wrong one (a knob ignored, a delay counted twice, no queueing), and a busy host
//! only adds delay, so the upper slack goes through the patience factor. (At ±20% a fresh-clone
//! CI run beside a release build read a 100 ms TTFT as 149 ms.)

mod common;

use std::time::{Duration, Instant};

use common::*;
use sonic_rs::JsonValueTrait;

/// Whether `actual` tells the right delay (`right` ms) from the wrong ones nearest it,
/// `below` and `above` ms.
fn tells(actual: Duration, below: f64, right: f64, above: f64) -> bool {
    let ms = |v: f64| Duration::from_secs_f64(v / 1000.0);
    actual >= ms((below + right) / 2.0) && actual <= ms(right) + patience(ms((above - right) / 2.0))
}

#[test]
fn ttft_and_itl_follow_the_flags() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--ttft-ms", "200", "--itl-ms", "40"], legacy);
        let (start, times, _) =
            token_times(sim.port(), "/v1/chat/completions", &chat_body(r#","max_tokens":11,"stream":true"#));
        assert_eq!(times.len(), 11);
        // Wrong: the flag ignored (the default, 0), or counted twice.
        let ttft = times[0] - start;
        assert!(tells(ttft, 0.0, 200.0, 400.0), "ttft {ttft:?}");
        let itl = (times[10] - times[0]) / 10;
        assert!(tells(itl, 0.0, 40.0, 80.0), "itl {itl:?}");

        // Non-streaming: the answer comes when the last token is due (wrong: at the first
        // token's time, or with each token counted twice).
        let t0 = Instant::now();
        let r = http(sim.port(), "POST", "/v1/chat/completions", &chat_body(r#","max_tokens":6"#));
        assert_eq!(r.status, 200);
        assert!(tells(t0.elapsed(), 200.0, 200.0 + 5.0 * 40.0, 200.0 + 10.0 * 40.0), "{:?}", t0.elapsed());
    }
}

#[test]
fn prefix_cache_accounting_and_cheaper_prefill() {
    for legacy in DRIVERS {
        // 100 µs per uncached token; 4 bytes per token, 16-token blocks.
        let sim = Sim::start(
            &["--ports", "0", "--ttft-ms", "20", "--prefill-us-per-token", "100", "--output-tokens", "1"],
            legacy,
        );
        let p = sim.port();
        let prompt = "abcd".repeat(1000); // 1000 tokens of text
        let body = format!(r#"{{"model":"m","prompt":"{prompt}"}}"#);
        // Raw prompt JSON is the quoted string: 4002 bytes -> 1001 tokens; 62 whole blocks = 992 tokens.
        let t0 = Instant::now();
        let cold = http(p, "POST", "/v1/completions", &body).json();
        let cold_t = t0.elapsed();
        assert_eq!(cold["usage"]["prompt_tokens"].as_u64(), Some(1001));
        assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(0));
        // Wrong: the prefill not charged, or charged twice.
        assert!(tells(cold_t, 20.0, 20.0 + 100.1, 20.0 + 200.2), "cold {cold_t:?}");

        let t0 = Instant::now();
        let warm = http(p, "POST", "/v1/completions", &body).json();
        let warm_t = t0.elapsed();
        assert_eq!(warm["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(992));
        // 9 uncached tokens: 20 ms + 0.9 ms. Wrong: the 992 cached tokens charged too (99 ms
        // more), or no TTFT at all.
        assert!(tells(warm_t, 0.9, 20.9, 20.0 + 100.1), "warm {warm_t:?}");

        // A shared prefix hits up to the first differing block.
        let other = format!(r#"{{"model":"m","prompt":"{}{}"}}"#, &prompt[..2000], "z".repeat(2000));
        let j = http(p, "POST", "/v1/completions", &other).json();
        // The quote plus 2000 shared bytes: 31 whole 64-byte blocks match (the 32nd mixes in 'z').
        assert_eq!(j["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(31 * 16));

        let stats = http(p, "GET", "/sim/stats", "").json();
        assert_eq!(stats["cached_tokens"].as_u64(), Some(992 + 31 * 16));
        let loads = http(p, "GET", "/v1/loads", "").json();
        assert!(loads["loads"][0]["cache_hit_rate"].as_f64().unwrap() > 0.3);

        // Flushing empties the cache.
        assert_eq!(http(p, "POST", "/flush_cache", "").status, 200);
        let j = http(p, "POST", "/v1/completions", &body).json();
        assert_eq!(j["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(0));

        // --cache-tokens 0 disables caching.
        let nocache = Sim::start(&["--ports", "0", "--cache-tokens", "0"], legacy);
        for _ in 0..2 {
            let j = http(nocache.port(), "POST", "/v1/completions", &body).json();
            assert_eq!(j["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(0));
        }
    }
}

#[test]
fn continuous_batching_queues_beyond_max_running() {
    for legacy in DRIVERS {
        let sim =
            Sim::start(&["--ports", "0", "--max-running", "2", "--ttft-ms", "150", "--output-tokens", "1"], legacy);
        let port = sim.port();
        let t0 = Instant::now();
        let handles: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    let r = http(port, "POST", "/v1/chat/completions", &chat_body(""));
                    assert_eq!(r.status, 200);
                    t0.elapsed()
                })
            })
            .collect();
        // Read once all four have arrived (the first two take 150 ms: well before then).
        let mut loads = sonic_rs::Value::default();
        let arrived = wait_until(patience(Duration::from_millis(100)), || {
            loads = http(port, "GET", "/v1/loads", "").json();
            let l = &loads["loads"][0];
            l["num_running_reqs"].as_u64().unwrap_or(0) + l["num_waiting_reqs"].as_u64().unwrap_or(0) >= 4
        });
        assert!(arrived, "the four requests never were all at the worker: {loads:?}");
        assert_eq!(loads["loads"][0]["num_running_reqs"].as_u64(), Some(2), "{loads:?}");
        assert_eq!(loads["loads"][0]["num_waiting_reqs"].as_u64(), Some(2), "{loads:?}");
        assert!(loads["loads"][0]["num_used_tokens"].as_u64().unwrap() > 0);
        let mut done: Vec<Duration> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        done.sort();
        // The first pair at 150 ms; the second queued behind it, at 300 ms. Wrong: no
        // queueing (all at 150), or one at a time (the fourth at 600).
        assert!(tells(done[1], 0.0, 150.0, 300.0), "{done:?}");
        assert!(tells(done[3], 150.0, 300.0, 600.0), "{done:?}");
        let loads = http(port, "GET", "/v1/loads", "").json();
        assert_eq!(loads["loads"][0]["num_running_reqs"].as_u64(), Some(0));
    }
}

#[test]
fn kv_capacity_makes_requests_wait() {
    for legacy in DRIVERS {
        // chat_body's prompt is 9 tokens; with max_tokens 91 each request holds 100 KV tokens,
        // so a 250-token cache runs two at a time although 8 slots are free.
        let sim =
            Sim::start(&["--ports", "0", "--ttft-ms", "150", "--kv-cache-tokens", "250", "--max-running", "8"], legacy);
        let p = sim.port();
        let body = chat_body(r#","max_tokens":91"#);
        let t0 = Instant::now();
        let handles: Vec<_> = (0..6)
            .map(|i| {
                let body = body.clone();
                std::thread::spawn(move || {
                    // Staggered by 5 ms so the FIFO order is the spawn order.
                    std::thread::sleep(Duration::from_millis(5 * i));
                    let r = http(p, "POST", "/v1/chat/completions", &body);
                    assert_eq!(r.status, 200);
                    Instant::now()
                })
            })
            .collect();
        // Read once all six have arrived (the first two take 150 ms: well before then).
        let mut loads = sonic_rs::Value::default();
        let arrived = wait_until(patience(Duration::from_millis(120)), || {
            loads = http(p, "GET", "/v1/loads", "").json();
            let l = &loads["loads"][0];
            l["num_running_reqs"].as_u64().unwrap_or(0) + l["num_waiting_reqs"].as_u64().unwrap_or(0) >= 6
        });
        assert!(arrived, "the six requests never were all at the worker: {loads:?}");
        let l = &loads["loads"][0];
        assert_eq!(l["num_running_reqs"].as_u64(), Some(2), "{l:?}");
        assert_eq!(l["num_waiting_reqs"].as_u64(), Some(4), "{l:?}");
        assert_eq!(l["num_used_tokens"].as_u64(), Some(200), "{l:?}");
        assert_eq!(l["max_total_num_tokens"].as_u64(), Some(250), "{l:?}");
        assert!((l["token_usage"].as_f64().unwrap() - 0.8).abs() < 1e-3, "{l:?}");
        let mut done: Vec<Duration> = handles.into_iter().map(|h| h.join().unwrap() - t0).collect();
        done.sort();
        // Two at a time, 150 ms each: pairs finish at ~150, ~300, ~450 ms. Wrong: a pair
        // earlier or later than its turn.
        for (i, d) in done.iter().enumerate() {
            let expected = 150.0 * (i / 2 + 1) as f64 + 5.0 * i as f64;
            assert!(
                tells(*d, expected - 150.0, expected, expected + 150.0),
                "request {i} done after {d:?}, expected ~{expected} ms"
            );
        }
        let stats = http(p, "GET", "/sim/stats", "").json();
        assert_eq!(stats["settings"]["kv_cache_tokens"].as_u64(), Some(250));
        assert_eq!(stats["waiting"].as_u64(), Some(0));
    }
}

#[test]
fn profile_preset_shows_in_settings() {
    for legacy in DRIVERS {
        let sim = Sim::start(&["--ports", "0", "--profile", "llama3.1-8b-h100", "--ttft-ms", "1"], legacy);
        let st = http(sim.port(), "GET", "/sim/stats", "").json();
        let s = &st["settings"];
        assert_eq!(s["profile"].as_str(), Some("llama3.1-8b-h100"), "{s:?}");
        // The explicit flag wins over the preset; the rest come from the preset.
        assert_eq!(s["ttft_ms"].as_f64(), Some(1.0));
        assert_eq!(s["itl_ms"].as_f64(), Some(6.0));
        assert_eq!(s["prefill_us_per_token"].as_f64(), Some(32.0));
        assert_eq!(s["itl_batch_factor"].as_f64(), Some(7.0));
        assert_eq!(s["prefill_batch_factor"].as_f64(), Some(1.0));
        assert_eq!(s["max_running"].as_u64(), Some(256));
        assert_eq!(s["kv_cache_tokens"].as_u64(), Some(400_000));
        let l = http(sim.port(), "GET", "/v1/loads", "").json();
        assert_eq!(l["loads"][0]["max_total_num_tokens"].as_u64(), Some(400_000));
        let info = http(sim.port(), "GET", "/server_info", "").json();
        assert_eq!(info["max_total_num_tokens"].as_u64(), Some(400_000));
        // 32 µs per uncached token plus 1 ms: a 6,000-token prompt answers one token in
        // ~193 ms. Wrong: the preset's prefill ignored, or counted twice.
        let prompt = "abcd".repeat(6000);
        let t0 = Instant::now();
        let r = http(sim.port(), "POST", "/v1/completions", &format!(r#"{{"prompt":"{prompt}","max_tokens":1}}"#));
        assert_eq!(r.status, 200);
        assert!(tells(t0.elapsed(), 1.0, 1.0 + 6001.0 * 0.032, 1.0 + 2.0 * 6001.0 * 0.032), "{:?}", t0.elapsed());
    }
}
