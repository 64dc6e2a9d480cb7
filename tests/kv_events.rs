//! Routing on the engines' KV-cache events through the binary, both drivers, against smg-sim
//! gRPC workers publishing `SubscribeKvEvents`: a gateway that never routed a prompt sends
//! it to the worker whose events say it holds the prefix, and two gateway processes agree;
//! the index follows stores, evictions, a flush and a sequence gap, as the metrics show.

// clippy.toml's house rules are the gateway's: a test's threads are not shards and may block.
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::Duration;

use sonic_rs::{JsonValueTrait, Value};
use support::sim::{grpc_gateway, Sim};
use support::{both_drivers, free_port, metric, patience, post, wait_until, Gateway};

const MODEL: &str = "sim-model";

fn completion(prompt: &str) -> String {
    format!(r#"{{"model":"{MODEL}","prompt":"{prompt}","max_tokens":1}}"#)
}

/// A prompt of many blocks, distinct from its first words on.
fn prompt(i: usize) -> String {
    format!("conversation number {i} begins here. {}", "the quick brown fox jumps over the lazy dog ".repeat(12))
}

/// A cache_aware gateway in front of `sims` with its metrics on a port of its own; returns
/// it and that port once it follows every worker's events.
fn following(legacy: bool, sims: &[&Sim], extra: &[&str]) -> (Gateway, u16) {
    let mport = free_port();
    let m = mport.to_string();
    let mut args = vec!["--policy", "cache_aware", "--log-level", "debug", "--prometheus-host", "127.0.0.1"];
    args.extend(["--prometheus-port", &m]);
    args.extend_from_slice(extra);
    let gw = grpc_gateway(legacy, sims, &args);
    for s in sims {
        let subscribed = format!("KV-cache events of {}: subscribed", s.grpc_url());
        assert!(wait_until(patience(Duration::from_secs(10)), || gw.log_has(&subscribed)), "{subscribed}");
    }
    (gw, mport)
}

/// A cache_aware gateway in front of the HTTP workers `sims`, following the ZMQ publishers
/// `kv_events` (`--kv-events` values), with its metrics on a port of its own; returns it and
/// that port once it follows every publisher.
fn following_zmq(legacy: bool, sims: &[&Sim], kv_events: &[String], extra: &[&str]) -> (Gateway, u16) {
    let mport = free_port();
    let m = mport.to_string();
    let urls: Vec<String> = sims.iter().map(|s| s.url()).collect();
    let mut args: Vec<&str> = vec!["--worker-urls"];
    args.extend(urls.iter().map(String::as_str));
    for k in kv_events {
        args.extend(["--kv-events", k.as_str()]);
    }
    args.extend(["--policy", "cache_aware", "--cores", "2", "--log-level", "debug"]);
    args.extend(["--prometheus-host", "127.0.0.1", "--prometheus-port", &m]);
    args.extend_from_slice(extra);
    let gw = Gateway::start(legacy, &args);
    gw.ready_workers(sims.len());
    for u in &urls {
        let subscribed = format!("KV-cache events of {u}: subscribed");
        assert!(wait_until(patience(Duration::from_secs(10)), || gw.log_has(&subscribed)), "{subscribed}");
    }
    (gw, mport)
}

/// The blocks `sim`'s cache holds now (16 tokens a block, the simulator's default).
fn cached_blocks(sim: &Sim) -> u64 {
    sim.stats()["cache_used_tokens"].as_u64().unwrap_or(0) / 16
}

/// Waits until every shard of the gateway whose metrics are on `mport` holds what `sim`'s
/// cache holds, by its events.
fn mirrors(mport: u16, sim: &Sim) -> bool {
    let series = format!(r#"smg_kv_index_blocks{{worker="{}"}}"#, sim.grpc_url());
    wait_until(patience(Duration::from_secs(10)), || metric(mport, &series) == Some(cached_blocks(sim) as f64))
}

fn routed(port: u16, body: &str) -> String {
    let r = post(port, "/v1/completions", body, &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-smg-routed-worker-id").unwrap_or_default().to_string()
}

/// Eight prompts warmed on two workers behind gateways of their own: two other gateways,
/// which never routed them, each send every prompt's continuation to the worker that holds
/// it (a guess would match all eight one time in 256), so they agree on each.
#[test]
fn warm_prefixes_go_where_the_events_say_and_replicas_agree() {
    both_drivers(|legacy| {
        let w = [Sim::start(MODEL, &["--grpc"]), Sim::start(MODEL, &["--grpc"])];
        let (a, am) = following(legacy, &[&w[0], &w[1]], &[]);
        let (b, bm) = following(legacy, &[&w[0], &w[1]], &[]);
        let warm = [grpc_gateway(legacy, &[&w[0]], &[]), grpc_gateway(legacy, &[&w[1]], &[])];
        for i in 0..8 {
            assert_eq!(routed(warm[i % 2].port, &completion(&prompt(i))), w[i % 2].grpc_url());
        }
        for (gw, m) in [(&a, am), (&b, bm)] {
            for s in &w {
                assert!(mirrors(m, s), "gateway {} mirrors {}", gw.port, s.grpc_url());
            }
        }
        for i in 0..8 {
            let next = completion(&format!("{} and then", prompt(i)));
            let want = w[i % 2].grpc_url();
            assert_eq!((routed(a.port, &next), routed(b.port, &next)), (want.clone(), want), "prompt {i}");
        }
        let live = format!(r#"smg_kv_events_live{{worker="{}"}}"#, w[0].grpc_url());
        assert_eq!(metric(am, &live), Some(1.0));
        // The engine's cached_tokens (GenerateComplete) confirm every predicted prefix.
        for s in &w {
            let series = |name: &str| metric(bm, &format!(r#"{name}{{worker="{}"}}"#, s.grpc_url()));
            assert!(series("smg_kv_predicted_cached_tokens_total").unwrap_or(0.0) >= 4.0 * 16.0);
            assert_eq!(series("smg_kv_prediction_precision"), Some(1.0));
        }
    });
}

/// One worker with a small cache: its stores and evictions, a flush, and a gap in its
/// sequence numbers (the gateway clears what it knew and rebuilds from what follows) all
/// leave every shard's index equal to the cache.
#[test]
fn the_index_follows_stores_evictions_a_flush_and_a_gap() {
    both_drivers(|legacy| {
        // 64 blocks; a prompt is 26 (421 tokens): the third evicts the first's oldest blocks.
        let w = Sim::start(MODEL, &["--grpc", "--cache-tokens", "1024"]);
        let (gw, m) = following(legacy, &[&w], &[]);
        for i in 0..5 {
            routed(gw.port, &completion(&prompt(i)));
            let series = format!(r#"smg_kv_index_blocks{{worker="{}"}}"#, w.grpc_url());
            assert!(
                mirrors(m, &w),
                "after prompt {i}: gateway {:?}, sim {} blocks, {:?} prompt tokens",
                metric(m, &series),
                cached_blocks(&w),
                w.stats()["prompt_tokens"]
            );
        }
        let published = |s: &Value| s["kv_events"]["published"].as_u64().unwrap_or(0);
        assert!(published(&w.stats()) >= 5);
        w.control(r#"{"flush_cache":true}"#);
        let series = format!(r#"smg_kv_index_blocks{{worker="{}"}}"#, w.grpc_url());
        assert!(wait_until(patience(Duration::from_secs(10)), || metric(m, &series) == Some(0.0)), "cleared");
        w.control(r#"{"kv_events_skip":5}"#);
        routed(gw.port, &completion(&prompt(7)));
        assert!(
            wait_until(patience(Duration::from_secs(10)), || gw.log_has("rebuilding its blocks")),
            "the gap is seen"
        );
        assert!(mirrors(m, &w), "rebuilt from the batch after the gap");
    });
}

/// A publisher that restarts (a new engine on the same port, its sequence numbers from 1
/// again): the gateway subscribes again, sees the sequence go back, and rebuilds the worker's
/// blocks from the new engine's events instead of keeping the dead one's.
#[test]
fn a_restarted_publisher_is_rebuilt_not_trusted() {
    both_drivers(|legacy| {
        let w = Sim::start(MODEL, &["--grpc"]);
        let (gw, m) = following(legacy, &[&w], &[]);
        routed(gw.port, &completion(&prompt(0)));
        routed(gw.port, &completion(&prompt(1)));
        assert!(mirrors(m, &w));
        let port = w.port;
        w.die();
        let w = Sim::start_on(port, MODEL, &["--grpc"]);
        let again = format!("KV-cache events of {}: subscribed after sequence 2", w.grpc_url());
        assert!(wait_until(patience(Duration::from_secs(15)), || gw.log_has(&again)), "subscribes again");
        // Routable again (its health checks), then one prompt the new engine caches.
        let body = completion(&prompt(2));
        assert!(wait_until(patience(Duration::from_secs(15)), || post(gw.port, "/v1/completions", &body, &[]).status
            == 200));
        assert!(gw.log_has("rebuilding its blocks"), "the sequence went back");
        assert_eq!(cached_blocks(&w), 26, "the new engine holds one prompt");
        assert!(mirrors(m, &w), "the dead engine's blocks are gone");
    });
}

/// Token ids of a completions `prompt` as smg-sim's HTTP workers count them (its raw JSON
/// text, 4 bytes to an id, little-endian), for `X-SMG-Routing-Tokens`.
fn sim_ids(prompt: &str) -> String {
    let raw = sonic_rs::to_string(prompt).unwrap();
    let ids = smg_loadtest::sim::kv_events::ids_from_bytes(raw.as_bytes(), 4);
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// HTTP workers publishing over ZMQ (vLLM's format, both event shapes, with a replay socket): two gateways that
/// never routed eight prompts each send every continuation, its token ids in
/// `X-SMG-Routing-Tokens`, to the worker whose events say it holds the prompt; `/workers`
/// shows each worker's publisher.
#[test]
fn http_workers_events_over_zmq_route_hinted_prompts() {
    both_drivers(|legacy| {
        let zmq = ["--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0"];
        // One publishes positional events, the other events by name: both shapes engines send.
        let by_name: Vec<&str> = zmq.iter().copied().chain(["--kv-events-format", "map"]).collect();
        let w = [Sim::start("m", &zmq), Sim::start("m", &by_name)];
        let endpoint = |s: &Sim, k: &str| s.stats()["kv_events"][k].as_str().unwrap_or_default().to_string();
        let flags: Vec<String> = w
            .iter()
            .map(|s| format!("{}={};replay={}", s.url(), endpoint(s, "endpoint"), endpoint(s, "replay_endpoint")))
            .collect();
        let start = || following_zmq(legacy, &[&w[0], &w[1]], &flags, &[]);
        let (a, am) = start();
        let (b, bm) = start();
        let shown = support::get(a.port, "/workers").text();
        assert!(shown.contains(&format!(r#""endpoint":"{}""#, endpoint(&w[0], "endpoint"))), "{shown}");
        let warm = [
            Gateway::start(legacy, &["--worker-urls", &w[0].url()]),
            Gateway::start(legacy, &["--worker-urls", &w[1].url()]),
        ];
        for g in &warm {
            g.ready_workers(1);
        }
        let long = |i: usize| format!("{} {}", prompt(i), "and a few more words to fill the blocks ".repeat(4));
        for i in 0..8 {
            let r = post(
                warm[i % 2].port,
                "/v1/completions",
                &format!(r#"{{"model":"m","prompt":"{}","max_tokens":1}}"#, long(i)),
                &[],
            );
            assert_eq!(r.status, 200, "{}", r.text());
        }
        for m in [am, bm] {
            for s in &w {
                let series = format!(r#"smg_kv_index_blocks{{worker="{}"}}"#, s.url());
                let want = cached_blocks(s) as f64;
                assert!(
                    wait_until(patience(Duration::from_secs(10)), || metric(m, &series) == Some(want)),
                    "{series}: {:?} against {want}",
                    metric(m, &series)
                );
            }
        }
        for i in 0..8 {
            let next = format!("{} and then", long(i));
            let body = format!(r#"{{"model":"m","prompt":"{next}","max_tokens":1}}"#);
            let hint = format!("X-SMG-Routing-Tokens: {}", sim_ids(&next));
            let route = |port: u16| {
                let r = post(port, "/v1/completions", &body, &[&hint]);
                assert_eq!(r.status, 200, "{}", r.text());
                r.header("x-smg-routed-worker-id").unwrap_or_default().to_string()
            };
            assert_eq!((route(a.port), route(b.port)), (w[i % 2].url(), w[i % 2].url()), "prompt {i}");
        }
    });
}

/// A chat of `turns` exchanges in conversation `i` (each user turn long enough for blocks).
fn chat(i: usize, turns: usize) -> String {
    let mut msgs = vec![format!(r#"{{"role":"user","content":"{}"}}"#, prompt(i))];
    for t in 1..turns {
        msgs.push(format!(r#"{{"role":"assistant","content":"the answer {t} is a simple story"}}"#));
        msgs.push(format!(r#"{{"role":"user","content":"and then the river {t} and the mountain"}}"#));
    }
    format!(r#"{{"model":"m","messages":[{}],"max_tokens":1}}"#, msgs.join(","))
}

/// `--tokenizer-path`: HTTP workers that count and cache prompts in their model's tokens
/// (smg-sim --tokenize-http, the chat rendered with its template) are matched on the ids the
/// gateway computes from the same tokenizer, with no hint: two gateways that never routed
/// eight conversations send each next turn to the worker that holds the earlier ones.
#[test]
fn http_chats_are_tokenized_and_matched_on_their_engines_blocks() {
    let dir = smg_loadtest::sim::tokenizer::ensure_dir(None).unwrap();
    let dir = dir.to_str().unwrap().to_string();
    both_drivers(|legacy| {
        let flags = ["--tokenize-http", "--kv-events-endpoint", "tcp://127.0.0.1:0"];
        let w = [Sim::start("m", &flags), Sim::start("m", &flags)];
        let at = |s: &Sim| format!("{}={}", s.url(), s.stats()["kv_events"]["endpoint"].as_str().unwrap_or_default());
        let (k0, k1) = (at(&w[0]), at(&w[1]));
        let start = || {
            let (gw, m) =
                following_zmq(legacy, &[&w[0], &w[1]], &[k0.clone(), k1.clone()], &["--tokenizer-path", &dir]);
            let loaded =
                wait_until(patience(Duration::from_secs(10)), || gw.log_has("HTTP requests are tokenized with"));
            assert!(loaded, "tokenizer not loaded");
            (gw, m)
        };
        let (a, am) = start();
        let (b, bm) = start();
        // Warmed on the workers themselves: no gateway saw these conversations.
        for i in 0..8 {
            let r = post(w[i % 2].port, "/v1/chat/completions", &chat(i, 1), &[]);
            assert_eq!(r.status, 200, "{}", r.text());
        }
        for m in [am, bm] {
            for s in &w {
                let series = format!(r#"smg_kv_index_blocks{{worker="{}"}}"#, s.url());
                let want = cached_blocks(s) as f64;
                assert!(want > 0.0);
                assert!(
                    wait_until(patience(Duration::from_secs(10)), || metric(m, &series) == Some(want)),
                    "{series}: {:?} against {want}",
                    metric(m, &series)
                );
            }
        }
        for i in 0..8 {
            let body = chat(i, 2);
            let route = |port: u16| {
                let r = post(port, "/v1/chat/completions", &body, &[]);
                assert_eq!(r.status, 200, "{}", r.text());
                let v: Value = sonic_rs::from_str(&r.text()).unwrap();
                let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
                (r.header("x-smg-routed-worker-id").unwrap_or_default().to_string(), cached > 0)
            };
            let want = (w[i % 2].url(), true);
            assert_eq!((route(a.port), route(b.port)), (want.clone(), want), "conversation {i}");
        }
        // The precision metric: every prefix predicted was the engine's cached_tokens.
        for m in [am, bm] {
            for s in &w {
                let series = |name: &str| metric(m, &format!(r#"{name}{{worker="{}"}}"#, s.url()));
                let predicted = series("smg_kv_predicted_cached_tokens_total").unwrap_or(0.0);
                assert!(predicted >= 4.0 * 16.0, "{predicted}");
                assert_eq!(series("smg_kv_confirmed_cached_tokens_total"), Some(predicted));
                assert_eq!(series("smg_kv_prediction_precision"), Some(1.0));
            }
        }
    });
}

/// Two completions prompts in pair `i` whose first 48 token ids (three 16-token blocks) are
/// the same and whose next ones differ, so their first 64 ids (a cold prompt's rendezvous
/// head) differ; about 100 ids each.
fn diverging_pair(i: usize) -> (String, String) {
    use smg_loadtest::sim::tokenizer::encode;
    let mut shared = format!("pair {i:02} opens");
    while encode(&shared).len() < 50 {
        shared.push_str(" the river");
    }
    let fill = |word: &str| {
        let mut p = format!("{shared} {word} {i}");
        while encode(&p).len() < 100 {
            p.push_str(" and the mountain");
        }
        p
    };
    (fill("alpha"), fill("omega"))
}

/// `--selection-accounting-ttl-ms`: a request's blocks count as held by the worker it was
/// sent to until the events say so. The workers fail every request here (nothing is stored,
/// so no event ever confirms), and a prompt sharing the first request's first blocks still
/// follows it for the TTL; without bookings it is placed by its own head, and at least one
/// of 16 lands elsewhere (all 16 alike by chance: one time in 65,536). Two replicas without
/// bookings place every one of these cold prefixes on the same worker, and not all on one.
#[test]
fn bookings_hold_a_new_prefix_until_the_events_arrive() {
    both_drivers(|legacy| {
        let w = [Sim::start(MODEL, &["--grpc"]), Sim::start(MODEL, &["--grpc"])];
        let strict = ["--cores", "1", "--disable-retries", "--disable-circuit-breaker"];
        let booking: Vec<&str> = strict.iter().copied().chain(["--selection-accounting-ttl-ms", "600000"]).collect();
        let (with, wm) = following(legacy, &[&w[0], &w[1]], &booking);
        let (without, om) = following(legacy, &[&w[0], &w[1]], &strict);
        let (other, xm) = following(legacy, &[&w[0], &w[1]], &strict);
        // Each worker stores a block first, so its events are live (their block size known).
        let warm = [grpc_gateway(legacy, &[&w[0]], &[]), grpc_gateway(legacy, &[&w[1]], &[])];
        for (g, s) in warm.iter().zip(&w) {
            assert_eq!(routed(g.port, &completion(&prompt(99))), s.grpc_url());
        }
        for (m, s) in [(wm, &w[0]), (wm, &w[1]), (om, &w[0]), (om, &w[1]), (xm, &w[0]), (xm, &w[1])] {
            let live = format!(r#"smg_kv_events_live{{worker="{}"}}"#, s.grpc_url());
            assert!(wait_until(patience(Duration::from_secs(10)), || metric(m, &live) == Some(1.0)), "{live}");
        }
        for s in &w {
            assert_eq!(s.control(r#"{"fail_rate":1.0}"#).status, 200);
        }
        // A failed answer names no worker: the one whose failure count rose served it.
        let failed = |s: &Sim| s.stats()["failed"].as_u64().unwrap_or(0);
        let sent_to = |port: u16, p: &str| {
            let before: Vec<u64> = w.iter().map(failed).collect();
            let r = post(port, "/v1/completions", &completion(p), &[]);
            assert!(r.status >= 500, "{} {}", r.status, r.text());
            let rose: Vec<usize> = (0..2).filter(|&k| failed(&w[k]) > before[k]).collect();
            assert_eq!(rose.len(), 1, "{rose:?}");
            w[rose[0]].grpc_url()
        };
        let (mut elsewhere, mut placed) = (0, Vec::new());
        for i in 0..16 {
            let (first, second) = diverging_pair(i);
            let held = sent_to(with.port, &first);
            assert_eq!(sent_to(with.port, &second), held, "pair {i}: the booking holds");
            let guessed = sent_to(without.port, &first);
            // A cold prefix (no worker holds it): two replicas place it alike.
            assert_eq!(sent_to(other.port, &first), guessed, "pair {i}: replicas disagree on a cold prefix");
            placed.push(guessed.clone());
            if sent_to(without.port, &second) != guessed {
                elsewhere += 1;
            }
        }
        assert!(elsewhere > 0, "without bookings every second prompt followed the first");
        assert!(w.iter().all(|s| placed.contains(&s.grpc_url())), "cold prefixes spread over both: {placed:?}");
    });
}

/// An engine started without KV events answers SubscribeKvEvents with UNIMPLEMENTED: the
/// gateway says so once, asks no more, and routes that worker by its own view.
#[test]
fn an_engine_without_events_is_routed_by_the_gateways_view() {
    both_drivers(|legacy| {
        let w = Sim::start(MODEL, &["--grpc", "--no-kv-events"]);
        let mport = free_port().to_string();
        let gw = grpc_gateway(
            legacy,
            &[&w],
            &["--policy", "cache_aware", "--prometheus-host", "127.0.0.1", "--prometheus-port", &mport],
        );
        let said = format!("KV-cache events of {}: the engine does not serve SubscribeKvEvents", w.grpc_url());
        assert!(wait_until(patience(Duration::from_secs(10)), || gw.log_has(&said)), "{said}");
        for i in 0..4 {
            assert_eq!(routed(gw.port, &completion(&prompt(i))), w.grpc_url());
        }
        let asked = w.stats()["grpc"]["rpcs"]["SubscribeKvEvents"].as_u64();
        assert_eq!(asked, Some(1), "asked once, not again");
        let live = format!(r#"smg_kv_events_live{{worker="{}"}}"#, w.grpc_url());
        assert_ne!(metric(mport.parse().unwrap(), &live), Some(1.0));
    });
}

/// A gateway that joins an HTTP worker's ZMQ publisher after it published asks its replay
/// socket for what it missed, in vLLM's replay protocol: its index then equals the worker's
/// whole cache, where a gateway that only rebuilt from the next batch would hold that batch's
/// blocks alone (without the replay socket this test fails so).
#[test]
fn a_late_subscriber_replays_what_it_missed() {
    both_drivers(|legacy| {
        let zmq = ["--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0"];
        let w = Sim::start("m", &zmq);
        let at = |k: &str| w.stats()["kv_events"][k].as_str().unwrap_or_default().to_string();
        let flag = format!("{}={};replay={}", w.url(), at("endpoint"), at("replay_endpoint"));
        let body = |i: usize| format!(r#"{{"model":"m","prompt":"{}","max_tokens":1}}"#, prompt(i));
        // Published before any gateway listens.
        for i in 0..4 {
            assert_eq!(post(w.port, "/v1/completions", &body(i), &[]).status, 200);
        }
        let (gw, m) = following_zmq(legacy, &[&w], &[flag], &[]);
        let u = w.url();
        // One more batch shows the gateway how far the publisher has counted. The subscription
        // reaches the publisher some time after the connect (ZMQ's slow joiner): until a batch
        // arrives, the worker is sent prompts its cache has not seen.
        let series = format!(r#"smg_kv_index_blocks{{worker="{u}"}}"#);
        let mut i = 4;
        let mirrored = wait_until(patience(Duration::from_secs(10)), || {
            if metric(m, &series).is_none() {
                assert_eq!(post(w.port, "/v1/completions", &body(i), &[]).status, 200);
                i += 1;
            }
            metric(m, &series) == Some(cached_blocks(&w) as f64)
        });
        assert!(mirrored, "{series}: {:?} against the cache's {}", metric(m, &series), cached_blocks(&w));
        // Read now, not waited for: a rebuild would have been logged before the index caught up.
        assert!(!gw.log_text().contains("rebuilding its blocks"), "replayed, not rebuilt");
    });
}
