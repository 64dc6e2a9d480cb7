//! Each policy's distribution, stickiness and edge cases, through `ShardRouter`.

use std::collections::HashMap;
use std::time::Duration;

use super::support::{cands, text_input, urls};
use crate::routing::{AssignmentMode, Candidate, PolicyKind, RouteError, RouteInput, RoutingConfig, ShardRouter};

fn router(policy: PolicyKind) -> ShardRouter {
    ShardRouter::new(&RoutingConfig::for_policy(policy), 0, 1)
}

fn counts(picks: impl IntoIterator<Item = usize>) -> HashMap<usize, usize> {
    let mut m = HashMap::new();
    for p in picks {
        *m.entry(p).or_default() += 1;
    }
    m
}

fn keyed(key: &str) -> RouteInput<'_> {
    RouteInput { model: "m", routing_key: Some(key), ..RouteInput::default() }
}

#[test]
fn policy_names_round_trip() {
    for (kind, name) in PolicyKind::ALL {
        assert_eq!(name.parse::<PolicyKind>(), Ok(kind));
        assert_eq!(kind.to_string(), name);
    }
    assert!("cache-aware".parse::<PolicyKind>().is_err());
    assert!("".parse::<PolicyKind>().is_err());
    assert_eq!("min_group".parse(), Ok(AssignmentMode::MinGroup));
    assert!("minload".parse::<AssignmentMode>().is_err());
}

#[test]
fn defaults_are_smgs() {
    let c = RoutingConfig::default();
    assert_eq!(c.policy, PolicyKind::CacheAware);
    assert_eq!(c.cache_threshold, 0.3);
    assert_eq!(c.balance_abs_threshold, 64);
    assert_eq!(c.balance_rel_threshold, 1.5);
    assert_eq!(c.eviction_interval_secs, 120);
    assert_eq!(c.max_tree_size, 67_108_864);
    assert_eq!(c.prefix_token_count, 256);
    assert_eq!(c.prefix_hash_load_factor, 1.25);
    assert_eq!(c.prefix_hash_balance_abs_threshold, 10);
    assert_eq!(c.routing_key_headers, vec!["x-smg-routing-key".to_string()]);
    assert!(!c.routing_key_override);
    assert_eq!(RoutingConfig::for_policy(PolicyKind::Manual).assignment_mode, AssignmentMode::Random);
    assert_eq!(c.assignment_mode, AssignmentMode::Delegate);
}

#[test]
fn no_candidates_is_no_worker() {
    let now = crate::clock::now();
    for (kind, _) in PolicyKind::ALL {
        let mut r = router(kind);
        assert_eq!(r.pick(&text_input("m", "x"), &[], now), Err(RouteError::NoWorker));
    }
}

#[test]
fn random_spreads_evenly() {
    let u = urls(4);
    let c = cands(&u, &[]);
    let mut r = router(PolicyKind::Random);
    let now = crate::clock::now();
    let m = counts((0..4000).map(|_| r.pick(&RouteInput::default(), &c, now).unwrap()));
    assert_eq!(m.len(), 4);
    assert!(m.values().all(|&n| n > 850), "{m:?}");
}

#[test]
fn round_robin_rotates_from_the_shard_index() {
    let u = urls(3);
    let c = cands(&u, &[]);
    let cfg = RoutingConfig::for_policy(PolicyKind::RoundRobin);
    let now = crate::clock::now();
    let mut a = ShardRouter::new(&cfg, 0, 2);
    let mut b = ShardRouter::new(&cfg, 1, 2);
    let pa: Vec<usize> = (0..6).map(|_| a.pick(&RouteInput::default(), &c, now).unwrap()).collect();
    let pb: Vec<usize> = (0..3).map(|_| b.pick(&RouteInput::default(), &c, now).unwrap()).collect();
    assert_eq!(pa, vec![0, 1, 2, 0, 1, 2]);
    assert_eq!(pb, vec![1, 2, 0]);
}

#[test]
fn power_of_two_prefers_the_lighter_worker() {
    let u = urls(2);
    let now = crate::clock::now();
    let mut r = router(PolicyKind::PowerOfTwo);
    let c = cands(&u, &[50, 3]);
    assert!((0..200).all(|_| r.pick(&RouteInput::default(), &c, now) == Ok(1)));
    let u = urls(4);
    let c = cands(&u, &[]);
    let m = counts((0..4000).map(|_| r.pick(&RouteInput::default(), &c, now).unwrap()));
    assert!(m.values().all(|&n| n > 800), "{m:?}");
    // Engine reports count too.
    let u2 = urls(2);
    let c: Vec<Candidate<'_>> = cands(&u2, &[0, 0])
        .into_iter()
        .enumerate()
        .map(|(i, x)| Candidate { engine_load: Some(if i == 0 { 40 } else { 1 }), ..x })
        .collect();
    assert!((0..100).all(|_| r.pick(&RouteInput::default(), &c, now) == Ok(1)));
}

#[test]
fn least_load_uses_engine_reports_plus_in_flight() {
    let u = urls(3);
    let now = crate::clock::now();
    let mut r = router(PolicyKind::LeastLoad);
    let mk = |loads: [usize; 3], eng: [Option<u64>; 3]| -> Vec<Candidate<'_>> {
        (0..3).map(|i| Candidate { url: &u[i], load: loads[i], engine_load: eng[i], cached: None }).collect()
    };
    // No reports: in-flight decides.
    assert_eq!(r.pick(&RouteInput::default(), &mk([3, 1, 2], [None; 3]), now), Ok(1));
    // Reports dominate: worker 2 has few in flight here but a long engine queue.
    let c = mk([1, 2, 0], [Some(1), Some(0), Some(20)]);
    assert_eq!(r.pick(&RouteInput::default(), &c, now), Ok(1));
    // A silent worker is charged the mean report (10), not zero.
    let c = mk([0, 0, 0], [Some(2), Some(18), None]);
    assert_eq!(r.pick(&RouteInput::default(), &c, now), Ok(0));
    // Ties spread.
    let c = mk([0, 0, 0], [None; 3]);
    let m = counts((0..3000).map(|_| r.pick(&RouteInput::default(), &c, now).unwrap()));
    assert!(m.values().all(|&n| n > 800), "{m:?}");
}

// === cache_aware ===

#[test]
fn cache_aware_sticks_to_the_prefix_holder() {
    let u = urls(4);
    let now = crate::clock::now();
    let mut r = router(PolicyKind::CacheAware);
    let sys = "You are a helpful assistant. ".repeat(20);
    let first = r.pick(&text_input("m", &format!("{sys}question one")), &cands(&u, &[]), now).unwrap();
    // Later turns extend the text; even with the holder busier it stays (below the spill gate).
    let mut loads = vec![0; 4];
    loads[first] = 10;
    for q in ["question two", "question three"] {
        let i = r.pick(&text_input("m", &format!("{sys}{q}")), &cands(&u, &loads), now).unwrap();
        assert_eq!(i, first);
    }
}

/// The engines' KV-cache events win over the tree: a worker whose events say it holds the
/// deepest prefix is chosen though the tree learnt another; a worker without events keeps
/// the tree's depth; over the spill gate the least loaded wins.
#[test]
fn cache_aware_trusts_kv_events_over_its_tree() {
    let u = urls(3);
    let now = crate::clock::now();
    let mut r = router(PolicyKind::CacheAware);
    let ids: Vec<u32> = (0..64).collect();
    let input = RouteInput { model: "m", tokens: Some(&ids), ..RouteInput::default() };
    let with = |cached: [Option<usize>; 3], loads: [usize; 3]| -> Vec<Candidate<'_>> {
        (0..3).map(|i| Candidate { url: &u[i], load: loads[i], engine_load: None, cached: cached[i] }).collect()
    };
    // The tree learns worker 0 (no events anywhere yet).
    let first = r.pick(&input, &cands(&u, &[]), now).unwrap();
    let other = (first + 1) % 3;
    let mut cached = [Some(0); 3];
    cached[other] = Some(48);
    assert_eq!(r.pick(&input, &with(cached, [0; 3]), now).unwrap(), other, "the events' holder");
    // The tree's holder sends no events: its depth (all 64, learnt twice now) is the deepest.
    let mut mixed = [Some(16); 3];
    mixed[first] = None;
    assert_eq!(r.pick(&input, &with(mixed, [0; 3]), now).unwrap(), first);
    // Over the gate: the least loaded.
    let mut loads = [0; 3];
    loads[other] = 100;
    let spilled = r.pick(&input, &with(cached, loads), now).unwrap();
    assert_ne!(spilled, other);
}

/// With the engines' events driving, a prompt no worker holds is placed by rendezvous over
/// its head among the workers under the spill gate: two replicas that see different loads
/// place every new conversation alike, and new conversations still spread.
#[test]
fn cache_aware_places_cold_prefixes_alike_on_every_replica() {
    let u = urls(4);
    let now = crate::clock::now();
    let (mut r1, mut r2) = (router(PolicyKind::CacheAware), router(PolicyKind::CacheAware));
    let cold = |loads: [usize; 4]| -> Vec<Candidate<'_>> {
        (0..4).map(|i| Candidate { url: &u[i], load: loads[i], engine_load: None, cached: Some(0) }).collect()
    };
    let mut placed = std::collections::HashSet::new();
    for c in 0..40u32 {
        let ids: Vec<u32> = (0..100).map(|t| t * 31 + c * 1000).collect();
        let input = RouteInput { model: "m", tokens: Some(&ids), ..RouteInput::default() };
        let a = r1.pick(&input, &cold([3, 0, 7, 1]), now).unwrap();
        let b = r2.pick(&input, &cold([0, 5, 2, 9]), now).unwrap();
        assert_eq!(a, b, "conversation {c}");
        placed.insert(a);
    }
    assert_eq!(placed.len(), 4, "new conversations spread");
    // A worker over the gate is passed over: the next in the prompt's order.
    let ids: Vec<u32> = (0..100).collect();
    let input = RouteInput { model: "m", tokens: Some(&ids), ..RouteInput::default() };
    let first = r1.pick(&input, &cold([0; 4]), now).unwrap();
    let mut loads = [0; 4];
    loads[first] = 400;
    assert_ne!(r1.pick(&input, &cold(loads), now).unwrap(), first);
}

#[test]
fn cache_aware_spreads_new_prefixes_in_a_quiet_system() {
    let u = urls(4);
    let now = crate::clock::now();
    let mut r = router(PolicyKind::CacheAware);
    let c = cands(&u, &[]);
    let texts: Vec<String> = (0..200).map(|i| format!("{i} distinct prompt {i}")).collect();
    let m = counts(texts.iter().map(|t| r.pick(&text_input("m", t), &c, now).unwrap()));
    assert_eq!(m.len(), 4, "{m:?}");
    assert!(m.values().all(|&n| n > 25), "{m:?}");
}

#[test]
fn cache_aware_spill_gate() {
    let u = urls(4);
    let now = crate::clock::now();
    let mut r = router(PolicyKind::CacheAware);
    let text = "a long shared document ".repeat(50);
    let holder = r.pick(&text_input("m", &text), &cands(&u, &[]), now).unwrap();
    // mean = 100/4 = 25; holder 100 > 25×1.5 and > 25+64: over the gate, least loaded wins.
    let mut loads = vec![0; 4];
    loads[holder] = 100;
    let spilled = r.pick(&text_input("m", &text), &cands(&u, &loads), now).unwrap();
    assert_ne!(spilled, holder);
    assert_eq!(loads[spilled], 0);
    // 80 is over 1.5×mean (20×1.5) but not over mean+64 (84): stays.
    let mut r = router(PolicyKind::CacheAware);
    let holder = r.pick(&text_input("m", &text), &cands(&u, &[]), now).unwrap();
    let mut loads = vec![0; 4];
    loads[holder] = 80;
    assert_eq!(r.pick(&text_input("m", &text), &cands(&u, &loads), now), Ok(holder));
}

#[test]
fn cache_aware_threshold_sends_weak_matches_to_the_least_loaded() {
    let u = urls(3);
    let now = crate::clock::now();
    let mut r = router(PolicyKind::CacheAware);
    let head = "0123456789";
    let holder = r.pick(&text_input("m", head), &cands(&u, &[]), now).unwrap();
    // Shares 10 of 40 characters: ratio 0.25 ≤ 0.3, so least loaded, not the holder.
    let mut loads = vec![5, 5, 5];
    let target = (holder + 1) % 3;
    loads[target] = 0;
    let weak = format!("{head}{}", "x".repeat(30));
    assert_eq!(r.pick(&text_input("m", &weak), &cands(&u, &loads), now), Ok(target));
    // Shares 10 of 20: ratio 0.5, so the least loaded of the head's holders (both now).
    let strong = format!("{head}{}", "y".repeat(10));
    assert_eq!(r.pick(&text_input("m", &strong), &cands(&u, &loads), now), Ok(target));
    loads[target] = 9;
    let fresh = format!("{head}{}", "z".repeat(10));
    assert_eq!(r.pick(&text_input("m", &fresh), &cands(&u, &loads), now), Ok(holder));
}

#[test]
fn cache_aware_namespaces_and_models_never_share() {
    let u = urls(2);
    let now = crate::clock::now();
    let mut r = router(PolicyKind::CacheAware);
    let text = "the same prompt text, long enough to matter";
    let holder = r.pick(&text_input("m", text), &cands(&u, &[]), now).unwrap();
    let mut loads = vec![0, 0];
    loads[holder] = 3;
    let other = 1 - holder;
    let salted = RouteInput { namespace: Some("s=tenant-a\u{1f}"), ..text_input("m", text) };
    assert_eq!(r.pick(&salted, &cands(&u, &loads), now), Ok(other));
    assert_eq!(r.pick(&text_input("other-model", text), &cands(&u, &loads), now), Ok(other));
    assert_eq!(r.pick(&text_input("m", text), &cands(&u, &loads), now), Ok(holder));
}

#[test]
fn cache_aware_routes_tokens_hint() {
    let u = urls(4);
    let now = crate::clock::now();
    let mut r = router(PolicyKind::CacheAware);
    let toks: Vec<u32> = (0..64).collect();
    let input = RouteInput { model: "m", tokens: Some(&toks), text: Some("ignored"), ..RouteInput::default() };
    let first = r.pick(&input, &cands(&u, &[]), now).unwrap();
    let mut more = toks.clone();
    more.extend([900, 901]);
    let mut loads = vec![0; 4];
    loads[first] = 5;
    let input = RouteInput { model: "m", tokens: Some(&more), ..RouteInput::default() };
    assert_eq!(r.pick(&input, &cands(&u, &loads), now), Ok(first));
    assert!(r.stats().token_tree.chars >= 66);
    assert_eq!(r.stats().text_tree.chars, 0);
}

#[test]
fn cache_aware_eviction_under_a_small_budget() {
    let u = urls(2);
    let now = crate::clock::now();
    let cfg = RoutingConfig { max_tree_size: 10_000, ..RoutingConfig::default() };
    let mut r = ShardRouter::new(&cfg, 0, 1);
    for i in 0..500 {
        let t = format!("{i:04} {}", "z".repeat(200));
        r.pick(&text_input("m", &t), &cands(&u, &[]), now).unwrap();
        assert!(r.stats().text_tree.cost <= 10_000);
    }
    r.tick(now);
    r.tick(now + Duration::from_secs(121));
    assert!(r.stats().text_tree.cost <= 10_000);
}

#[test]
fn cache_aware_worker_removal_and_readd() {
    let now = crate::clock::now();
    let mut r = router(PolicyKind::CacheAware);
    let u = urls(3);
    let text = "conversation history that is long enough ".repeat(10);
    let holder = r.pick(&text_input("m", &text), &cands(&u, &[]), now).unwrap();
    r.remove_worker(&u[holder]);
    let rest: Vec<String> = u.iter().enumerate().filter(|&(i, _)| i != holder).map(|(_, s)| s.clone()).collect();
    let next = r.pick(&text_input("m", &text), &cands(&rest, &[]), now).unwrap();
    // With the holder gone, the text lands on a surviving worker and sticks there.
    let mut loads = vec![0, 0];
    loads[next] = 4;
    assert_eq!(r.pick(&text_input("m", &text), &cands(&rest, &loads), now), Ok(next));
    // Re-added, the old worker holds nothing: the prefix stays where it is now.
    let all = cands(&u, &[]);
    let again = r.pick(&text_input("m", &text), &all, now).unwrap();
    assert_eq!(u[again], rest[next]);
    // Nothing in the tree names the removed worker after removal alone.
    r.remove_worker(&u[again]);
    assert!(r.stats().text_tree.nodes == 0 || r.pick(&text_input("m", &text), &cands(&rest, &[]), now).is_ok());
}

#[test]
fn digests_carry_inserts_between_shards() {
    let u = urls(4);
    let now = crate::clock::now();
    let cfg = RoutingConfig::default();
    let mut a = ShardRouter::new(&cfg, 0, 2);
    let mut b = ShardRouter::new(&cfg, 1, 2);
    let text = "a conversation that started on shard a ".repeat(8);
    let w = a.pick(&text_input("m", &text), &cands(&u, &[]), now).unwrap();
    let d = a.take_digest().unwrap();
    assert_eq!(d.len(), 1);
    assert!(a.take_digest().is_none());
    b.apply_digest(&d);
    a.apply_digest(&d); // own digest: ignored
                        // Shard b now sends the next turn to the same worker, even when it is busier.
    let mut loads = vec![0; 4];
    loads[w] = 6;
    let turn2 = format!("{text} and continued on shard b");
    assert_eq!(b.pick(&text_input("m", &turn2), &cands(&u, &loads), now), Ok(w));
    // One shard alone never fills an outbox.
    let mut solo = ShardRouter::new(&cfg, 0, 1);
    solo.pick(&text_input("m", &text), &cands(&u, &[]), now).unwrap();
    assert!(solo.take_digest().is_none());
}

// === consistent_hashing ===

#[test]
fn consistent_hashing_key_priority() {
    let u = urls(5);
    let c = cands(&u, &[]);
    let now = crate::clock::now();
    let mut r = router(PolicyKind::ConsistentHashing);
    // Target worker first, even with a routing key.
    let t = RouteInput { target_worker: Some("3"), routing_key: Some("k"), ..RouteInput::default() };
    assert_eq!(r.pick(&t, &c, now), Ok(3));
    for bad in ["5", "x", "-1", ""] {
        let t = RouteInput { target_worker: Some(bad), ..RouteInput::default() };
        assert_eq!(r.pick(&t, &c, now), Err(RouteError::NoWorker), "{bad}");
    }
    // Each key source is sticky, and the routing key outranks the implicit ones.
    let by_key = r.pick(&keyed("user-1"), &c, now).unwrap();
    let both = RouteInput { authorization: Some("Bearer zzz"), ..keyed("user-1") };
    assert_eq!(r.pick(&both, &c, now), Ok(by_key));
    for input in [
        RouteInput { authorization: Some("Bearer abc"), ..RouteInput::default() },
        RouteInput { forwarded_for: Some("10.0.0.1"), ..RouteInput::default() },
        RouteInput { cookie: Some("sid=1"), ..RouteInput::default() },
    ] {
        let first = r.pick(&input, &c, now).unwrap();
        assert!((0..20).all(|_| r.pick(&input, &c, now) == Ok(first)));
    }
    // No key at all: random.
    let m = counts((0..500).map(|_| r.pick(&RouteInput::default(), &c, now).unwrap()));
    assert_eq!(m.len(), 5);
}

#[test]
fn consistent_hashing_agrees_across_shards_and_moves_few_keys() {
    let u = urls(8);
    let c = cands(&u, &[]);
    let now = crate::clock::now();
    let cfg = RoutingConfig::for_policy(PolicyKind::ConsistentHashing);
    let mut a = ShardRouter::new(&cfg, 0, 2);
    let mut b = ShardRouter::new(&cfg, 1, 2);
    let keys: Vec<String> = (0..1000).map(|i| format!("user-{i}")).collect();
    let before: Vec<usize> = keys.iter().map(|k| a.pick(&keyed(k), &c, now).unwrap()).collect();
    let on_b: Vec<usize> = keys.iter().map(|k| b.pick(&keyed(k), &c, now).unwrap()).collect();
    assert_eq!(before, on_b);
    let m = counts(before.iter().copied());
    assert!(m.values().all(|&n| n > 60 && n < 200), "{m:?}");
    // Drop worker 3: only its keys move.
    let rest: Vec<String> = u.iter().enumerate().filter(|&(i, _)| i != 3).map(|(_, s)| s.clone()).collect();
    let c2 = cands(&rest, &[]);
    let mut moved = 0;
    for (k, &old) in keys.iter().zip(&before) {
        let new = a.pick(&keyed(k), &c2, now).unwrap();
        if old == 3 {
            moved += 1;
        } else {
            assert_eq!(rest[new], u[old], "{k} moved off a surviving worker");
        }
    }
    assert_eq!(moved, m[&3]);
}

#[test]
fn consistent_hashing_rid_outranks_header_with_override() {
    let u = urls(6);
    let c = cands(&u, &[]);
    let now = crate::clock::now();
    let cfg = RoutingConfig { routing_key_override: true, ..RoutingConfig::for_policy(PolicyKind::ConsistentHashing) };
    let mut r = ShardRouter::new(&cfg, 0, 1);
    let base = r.pick(&keyed("conv"), &c, now).unwrap();
    // Different header values per turn cannot split a conversation that carries a rid.
    for (i, rid) in ["conv_t1", "conv_t2", "conv_t2_r1"].iter().enumerate() {
        let k = format!("proxy-stamp-{i}");
        let input = RouteInput { rid: Some(rid), ..keyed(&k) };
        assert_eq!(r.pick(&input, &c, now), Ok(base));
    }
}

// === prefix_hash ===

#[test]
fn prefix_hash_groups_by_head_and_walks_past_overload() {
    let u = urls(4);
    let now = crate::clock::now();
    let cfg = RoutingConfig { prefix_token_count: 8, ..RoutingConfig::for_policy(PolicyKind::PrefixHash) };
    let mut r = ShardRouter::new(&cfg, 0, 1);
    // 8 tokens × 4 = the first 32 bytes decide.
    let head = "h".repeat(32);
    let a = r.pick(&text_input("m", &format!("{head}one")), &cands(&u, &[]), now).unwrap();
    let b = r.pick(&text_input("m", &format!("{head}two")), &cands(&u, &[]), now).unwrap();
    assert_eq!(a, b);
    // Overloaded owner (20 > mean 6.25×1.25 and > mean+10): the next worker on the ring.
    let mut loads = vec![1, 1, 1, 1];
    loads[a] = 20;
    let next = r.pick(&text_input("m", &format!("{head}three")), &cands(&u, &loads), now).unwrap();
    assert_ne!(next, a);
    // Every worker overloaded cannot happen with a mean; owner under the abs threshold stays.
    loads[a] = 12;
    assert_eq!(r.pick(&text_input("m", &head), &cands(&u, &loads), now), Ok(a));
    // Different heads spread.
    let m = counts(
        (0..400).map(|i| r.pick(&text_input("m", &format!("{i:08}{}", "x".repeat(40))), &cands(&u, &[]), now).unwrap()),
    );
    assert_eq!(m.len(), 4, "{m:?}");
}

#[test]
fn prefix_hash_hashes_the_routing_key_instead_without_override() {
    let u = urls(8);
    let c = cands(&u, &[]);
    let now = crate::clock::now();
    let mut r = router(PolicyKind::PrefixHash);
    let m = counts((0..50).map(|i| {
        let t = format!("prompt {i}");
        let input = RouteInput { text: Some(&t), ..keyed("one-key") };
        r.pick(&input, &c, now).unwrap()
    }));
    assert_eq!(m.len(), 1);
    let toks = [1u32, 2, 3];
    let a = RouteInput { model: "m", tokens: Some(&toks), ..RouteInput::default() };
    let first = r.pick(&a, &c, now).unwrap();
    assert!((0..10).all(|_| r.pick(&a, &c, now) == Ok(first)));
}

// === manual and sticky sessions ===

#[test]
fn manual_pins_keys_and_agrees_across_shards() {
    let u = urls(6);
    let c = cands(&u, &[]);
    let now = crate::clock::now();
    let cfg = RoutingConfig::for_policy(PolicyKind::Manual);
    let mut a = ShardRouter::new(&cfg, 0, 2);
    let mut b = ShardRouter::new(&cfg, 1, 2);
    let keys: Vec<String> = (0..300).map(|i| format!("session-{i}")).collect();
    let on_a: Vec<usize> = keys.iter().map(|k| a.pick(&keyed(k), &c, now).unwrap()).collect();
    let on_b: Vec<usize> = keys.iter().map(|k| b.pick(&keyed(k), &c, now).unwrap()).collect();
    assert_eq!(on_a, on_b);
    let m = counts(on_a.iter().copied());
    assert_eq!(m.len(), 6);
    // Sticky even when its worker gets busy.
    let busy = cands(&u, &[50, 50, 50, 50, 50, 50]);
    assert!(keys.iter().zip(&on_a).all(|(k, &w)| a.pick(&keyed(k), &busy, now) == Ok(w)));
    assert_eq!(a.stats().manual_keys, 300);
    // No key: spread, not pinned.
    let m = counts((0..600).map(|_| a.pick(&RouteInput::default(), &c, now).unwrap()));
    assert_eq!(m.len(), 6);
    assert_eq!(a.stats().manual_keys, 300);
}

#[test]
fn manual_failover_and_return() {
    let u = urls(3);
    let now = crate::clock::now();
    let mut r = router(PolicyKind::Manual);
    let w = r.pick(&keyed("k"), &cands(&u, &[]), now).unwrap();
    let rest: Vec<String> = u.iter().enumerate().filter(|&(i, _)| i != w).map(|(_, s)| s.clone()).collect();
    // Worker unavailable (not a candidate, not removed): the key fails over and sticks.
    let f = r.pick(&keyed("k"), &cands(&rest, &[]), now).unwrap();
    assert!((0..5).all(|_| r.pick(&keyed("k"), &cands(&rest, &[]), now) == Ok(f)));
    // Back: the key returns to its primary.
    assert_eq!(r.pick(&keyed("k"), &cands(&u, &[]), now), Ok(w));
}

#[test]
fn manual_idle_eviction_and_worker_removal() {
    let u = urls(3);
    let c = cands(&u, &[]);
    let t0 = crate::clock::now();
    let cfg = RoutingConfig { max_idle_secs: 300, ..RoutingConfig::for_policy(PolicyKind::Manual) };
    let mut r = ShardRouter::new(&cfg, 0, 1);
    r.pick(&keyed("old"), &c, t0).unwrap();
    r.tick(t0);
    r.pick(&keyed("fresh"), &c, t0 + Duration::from_secs(200)).unwrap();
    r.tick(t0 + Duration::from_secs(360));
    assert_eq!(r.stats().manual_keys, 1);
    let w = r.pick(&keyed("fresh"), &c, t0 + Duration::from_secs(361)).unwrap();
    r.remove_worker(&u[w]);
    assert_eq!(r.stats().manual_keys, 0);
}

#[test]
fn manual_min_load_and_min_group() {
    let u = urls(3);
    let now = crate::clock::now();
    let cfg =
        RoutingConfig { assignment_mode: AssignmentMode::MinLoad, ..RoutingConfig::for_policy(PolicyKind::Manual) };
    let mut r = ShardRouter::new(&cfg, 0, 1);
    assert_eq!(r.pick(&keyed("a"), &cands(&u, &[4, 1, 3]), now), Ok(1));
    let cfg =
        RoutingConfig { assignment_mode: AssignmentMode::MinGroup, ..RoutingConfig::for_policy(PolicyKind::Manual) };
    let mut r = ShardRouter::new(&cfg, 0, 1);
    let c = cands(&u, &[9, 0, 0]);
    let m = counts((0..30).map(|i| r.pick(&keyed(&format!("k{i}")), &c, now).unwrap()));
    assert_eq!(m.values().copied().collect::<Vec<_>>(), vec![10, 10, 10]);
}

#[test]
fn override_pins_conversations_on_any_policy() {
    let u = urls(4);
    let c = cands(&u, &[]);
    let now = crate::clock::now();
    for policy in [
        PolicyKind::RoundRobin,
        PolicyKind::Random,
        PolicyKind::CacheAware,
        PolicyKind::PrefixHash,
        PolicyKind::LeastLoad,
        PolicyKind::PowerOfTwo,
    ] {
        let cfg = RoutingConfig { routing_key_override: true, ..RoutingConfig::for_policy(policy) };
        let mut r = ShardRouter::new(&cfg, 0, 1);
        let first = r.pick(&RouteInput { rid: Some("chat-7f3a_t1"), ..text_input("m", "hello") }, &c, now).unwrap();
        for (rid, key) in [("chat-7f3a_t2", None), ("chat-7f3a_t2_r1", Some("other")), ("x_t1", Some("chat-7f3a_t9"))] {
            let input = RouteInput { rid: Some(rid), routing_key: key, ..text_input("m", "hello again") };
            if rid == "x_t1" {
                // A different rid is a different conversation, whatever the header says.
                let _ = r.pick(&input, &c, now).unwrap();
            } else {
                assert_eq!(r.pick(&input, &c, now), Ok(first), "{policy} {rid}");
            }
        }
        // Header keys are stripped too: `chat-7f3a_t9` pins with the rid's conversation.
        let by_header = RouteInput { routing_key: Some("chat-7f3a_t9"), ..text_input("m", "hi") };
        assert_eq!(r.pick(&by_header, &c, now), Ok(first), "{policy}");
        assert!(r.stats().sticky_keys >= 1);
    }
}

#[test]
fn without_override_load_policies_ignore_the_key() {
    let u = urls(3);
    let c = cands(&u, &[]);
    let now = crate::clock::now();
    let mut r = router(PolicyKind::RoundRobin);
    let picks: Vec<usize> = (0..3).map(|_| r.pick(&keyed("same"), &c, now).unwrap()).collect();
    assert_eq!(picks, vec![0, 1, 2]);
    assert_eq!(r.stats().sticky_keys, 0);
}

#[test]
fn versioned_pick_matches_fingerprinted_pick() {
    let u = urls(16);
    let c = cands(&u, &[]);
    let now = crate::clock::now();
    let mut a = router(PolicyKind::ConsistentHashing);
    let mut b = router(PolicyKind::ConsistentHashing);
    for i in 0..200 {
        let k = format!("k{i}");
        assert_eq!(a.pick(&keyed(&k), &c, now), b.pick_versioned(&keyed(&k), &c, 7, now));
    }
    // A new epoch with a different list rebuilds.
    let fewer = cands(&u[..8], &[]);
    for i in 0..200 {
        let k = format!("k{i}");
        assert!(b.pick_versioned(&keyed(&k), &fewer, 8, now).unwrap() < 8);
    }
}
