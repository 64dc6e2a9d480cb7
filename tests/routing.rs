//! Routing policies through the real binary: stickiness, spread and routing headers, with
//! requests on fresh connections so they land on either shard.

// clippy.toml's house rules are the gateway's: a test's threads are not shards and may block.
#![allow(clippy::disallowed_methods)]

mod support;

use std::collections::{HashMap, HashSet};

use sonic_rs::JsonValueTrait;
use support::*;

struct World {
    workers: Vec<FakeWorker>,
    gw: Gateway,
}

fn world(legacy: bool, n: usize, args: &[&str]) -> World {
    let workers: Vec<FakeWorker> = (0..n).map(|_| FakeWorker::start("m")).collect();
    let urls: Vec<String> = workers.iter().map(FakeWorker::url).collect();
    let mut all: Vec<&str> = vec!["--worker-urls"];
    all.extend(urls.iter().map(String::as_str));
    all.extend_from_slice(args);
    let gw = Gateway::start(legacy, &all);
    // Every worker must be routable before distribution is measured.
    gw.ready_workers(n);
    World { workers, gw }
}

fn chat(turns: &[(&str, &str)]) -> String {
    let msgs: Vec<String> = turns
        .iter()
        .map(|(role, text)| format!(r#"{{"role":"{role}","content":{}}}"#, sonic_rs::to_string(text).unwrap()))
        .collect();
    format!(r#"{{"model":"m","messages":[{}]}}"#, msgs.join(","))
}

fn routed(r: &Response) -> String {
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-smg-routed-worker-id").unwrap().to_string()
}

#[test]
fn cache_aware_keeps_conversations_on_one_worker_across_shards() {
    both_drivers(|legacy| {
        let mport = free_port().to_string();
        let w = world(legacy, 3, &["--cores", "2", "--prometheus-host", "127.0.0.1", "--prometheus-port", &mport]);
        let mut used = HashSet::new();
        let system =
            |conv: usize| format!("You are assistant number {conv}. {}", "Follow the house style. ".repeat(40));
        for conv in 0..6 {
            let mut turns: Vec<(String, String)> = vec![("system".into(), system(conv))];
            let mut first: Option<String> = None;
            for turn in 0..4 {
                turns.push(("user".into(), format!("question {turn} of conversation {conv}")));
                let refs: Vec<(&str, &str)> = turns.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
                let who = routed(&post(w.gw.port, "/v1/chat/completions", &chat(&refs), &[]));
                match &first {
                    None => first = Some(who.clone()),
                    Some(f) => assert_eq!(&who, f, "conversation {conv} moved at turn {turn}"),
                }
                turns.push(("assistant".into(), format!("answer {turn}")));
                // Real turns are seconds apart, long after the digests crossed shards.
                gossip::gossip_round(mport.parse().unwrap());
            }
            used.insert(first.unwrap());
        }
        // A prefix no worker holds goes where a hash of the prompt's head says, so new
        // conversations spread. Six could all land on one of three workers by chance (3 in
        // 3^6: one run in 243), so 18 more first turns join them: all 24 on one is 3 in 3^24.
        for conv in 6..24 {
            let body = chat(&[("system", &system(conv)), ("user", &format!("question 0 of conversation {conv}"))]);
            used.insert(routed(&post(w.gw.port, "/v1/chat/completions", &body, &[])));
        }
        assert!(used.len() >= 2, "a quiet system piled every conversation onto {used:?}");
        assert_eq!(w.workers.iter().map(|x| x.requests().len()).sum::<usize>(), 24 + 18);
    });
}

#[test]
fn consistent_hashing_keys_and_target_worker() {
    both_drivers(|legacy| {
        let w = world(legacy, 3, &["--policy", "consistent_hashing", "--cores", "2"]);
        let body = chat(&[("user", "hi")]);
        let mut by_key: HashMap<String, HashSet<String>> = HashMap::new();
        // 24 keys, three requests each: all on one of three workers by chance is 3 in 3^24
        // (with 8 keys it was one run in 2,187).
        for i in 0..72 {
            let key = format!("user-{}", i % 24);
            let who = routed(&post(w.gw.port, "/v1/chat/completions", &body, &[&format!("X-SMG-Routing-Key: {key}")]));
            by_key.entry(key).or_default().insert(who);
        }
        assert!(by_key.values().all(|s| s.len() == 1), "a key moved between workers: {by_key:?}");
        let distinct: HashSet<_> = by_key.values().flatten().collect();
        assert!(distinct.len() >= 2, "24 keys all hashed to one worker");
        // Authorization is the next key in priority.
        let a = routed(&post(w.gw.port, "/v1/chat/completions", &body, &["Authorization: Bearer tenant-1"]));
        for _ in 0..5 {
            assert_eq!(routed(&post(w.gw.port, "/v1/chat/completions", &body, &["Authorization: Bearer tenant-1"])), a);
        }
        // X-SMG-Target-Worker: index among the model's available workers, in registration order.
        for (i, wk) in w.workers.iter().enumerate() {
            let r = post(
                w.gw.port,
                "/v1/chat/completions",
                &body,
                &[&format!("X-SMG-Target-Worker: {i}"), "X-SMG-Routing-Key: k"],
            );
            assert_eq!(routed(&r), wk.url());
        }
        let r = post(w.gw.port, "/v1/chat/completions", &body, &["X-SMG-Target-Worker: 7"]);
        assert_eq!(r.status, 503);
        assert_eq!(r.header("x-smg-error-code"), Some("no_available_workers"));
        assert_eq!(r.json()["error"]["type"].as_str(), Some("Service Unavailable"));
    });
}

#[test]
fn round_robin_and_random_spread_load() {
    both_drivers(|legacy| {
        let w = world(legacy, 3, &["--policy", "round_robin", "--cores", "1"]);
        let body = chat(&[("user", "hi")]);
        let mut count: HashMap<String, usize> = HashMap::new();
        for _ in 0..30 {
            *count.entry(routed(&post(w.gw.port, "/v1/chat/completions", &body, &[]))).or_default() += 1;
        }
        assert_eq!(count.len(), 3);
        assert!(count.values().all(|c| *c == 10), "{count:?}");
        drop(w);
        let w = world(legacy, 3, &["--policy", "random"]);
        let mut seen = HashSet::new();
        for _ in 0..60 {
            seen.insert(routed(&post(w.gw.port, "/v1/chat/completions", &body, &[])));
        }
        assert_eq!(seen.len(), 3, "random never picked some worker in 60 tries");
    });
}

#[test]
fn routing_hints_are_ignored_when_malformed_and_never_forwarded() {
    both_drivers(|legacy| {
        let w = world(legacy, 2, &[]);
        let body = chat(&[("user", "hi")]);
        for hint in ["1,2,3", "1,,2", "-1", "4294967296", "a,b", " 1 , 2", &"1,".repeat(600)] {
            let r = post(w.gw.port, "/v1/chat/completions", &body, &[&format!("X-SMG-Routing-Tokens: {hint}")]);
            assert_eq!(r.status, 200, "hint {hint:?}");
        }
        let r = post(w.gw.port, "/v1/chat/completions", &body, &[&format!("X-SMG-Routing-Key: {}", "k".repeat(200))]);
        assert_eq!(r.status, 200, "an over-long routing key is ignored, not an error");
        for wk in &w.workers {
            assert!(wk.requests().iter().all(|r| r.header("x-smg-routing-tokens").is_none()));
        }
    });
}

#[test]
fn manual_and_routing_key_override_pin_keys_across_shards() {
    both_drivers(|legacy| {
        let w = world(legacy, 3, &["--policy", "manual", "--cores", "2"]);
        let body = chat(&[("user", "hi")]);
        for k in 0..6 {
            let hdr = format!("X-SMG-Routing-Key: session-{k}");
            let first = routed(&post(w.gw.port, "/v1/chat/completions", &body, &[&hdr]));
            for _ in 0..5 {
                assert_eq!(routed(&post(w.gw.port, "/v1/chat/completions", &body, &[&hdr])), first);
            }
        }
        drop(w);
        // With the override, the body's rid pins (lineage suffixes _r<n>/_t<n> stripped).
        let w = world(legacy, 3, &["--policy", "round_robin", "--routing-key-override", "--cores", "2"]);
        for conv in 0..4 {
            let mut seen = HashSet::new();
            for (i, suffix) in ["", "_r1", "_r2", "_t1", "_r3"].iter().enumerate() {
                let b = format!(
                    r#"{{"model":"m","messages":[{{"role":"user","content":"hi {i}"}}],"rid":"conv-{conv}{suffix}"}}"#
                );
                seen.insert(routed(&post(w.gw.port, "/v1/chat/completions", &b, &[])));
            }
            assert_eq!(seen.len(), 1, "rid conv-{conv} spread over {seen:?}");
        }
    });
}

#[test]
fn load_is_gateway_wide_across_shards() {
    both_drivers(|legacy| {
        let a = FakeWorker::start("m");
        let b = FakeWorker::start("m");
        b.state.healthy.store(false, std::sync::atomic::Ordering::SeqCst);
        let (ua, ub) = (a.url(), b.url());
        let mport = free_port().to_string();
        let gw = Gateway::start(
            legacy,
            &[
                "--worker-urls",
                &ua,
                &ub,
                "--policy",
                "least_load",
                "--cores",
                "2",
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                &mport,
            ],
        );
        let mport: u16 = mport.parse().unwrap();
        gw.ready();
        // One long stream on A, held by whichever shard accepted it.
        let mut held = gw.connect();
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"fake":"sse","events":5,"gap_ms":2000}"#;
        std::io::Write::write_all(&mut held, post_bytes("/v1/chat/completions", body, &[]).as_bytes()).unwrap();
        let mut raw = Vec::new();
        fill(&mut held, &mut raw).unwrap();
        assert!(String::from_utf8_lossy(&raw).contains(&ua), "the stream must be on A");
        b.state.healthy.store(true, std::sync::atomic::Ordering::SeqCst);
        gw.ready_workers(2);
        // Both shards know A's stream.
        gossip::gossip_round(mport);
        let short = chat(&[("user", "hi")]);
        for i in 0..12 {
            let who = routed(&post(gw.port, "/v1/chat/completions", &short, &[]));
            assert_eq!(who, ub, "request {i} went to the worker already serving a stream");
            // Both shards know the finished request is gone, or the other shard may still
            // see B=1 and tie.
            gossip::gossip_round(mport);
        }
        drop(held);
    });
}
