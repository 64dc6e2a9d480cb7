//! Criterion benches of the routing module: cache_aware match+insert at 2 KB and 200 KB, digest
//! replay, the hash policies from 2 to 1,000 workers, header and body parsing, and tree memory
//! per stored character (printed before the benches run).
//!
//! Run: `cd /work/scratch/routing && CARGO_TARGET_DIR=/work/target-routing cargo bench --bench routing`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use smg::routing::{
    parse_routing_tokens, scan_body, Candidate, PolicyKind, RouteInput, RoutingConfig, ShardRouter, TextSource,
};

fn text(seed: u64, len: usize) -> String {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let r = (x % 32) as u8;
            if r < 5 {
                ' '
            } else {
                (b'a' + r % 26) as char
            }
        })
        .collect()
}

fn urls(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("http://10.0.{}.{}:8000", i / 256, i % 256)).collect()
}

fn cands(urls: &[String]) -> Vec<Candidate<'_>> {
    urls.iter().enumerate().map(|(i, u)| Candidate { url: u, load: i % 3, engine_load: None, cached: None }).collect()
}

/// A router whose tree already holds 64 conversations sharing 8 system prompts, each
/// `len` long; returns one stored conversation to extend.
fn populated(len: usize, shards: usize, c: &[Candidate<'_>]) -> (ShardRouter, String) {
    let mut r = ShardRouter::new(&RoutingConfig::default(), 0, shards);
    let now = smg::clock::now();
    let mut last = String::new();
    for conv in 0..64u64 {
        let mut t = text(conv % 8, len / 2);
        t.push_str(&text(1000 + conv, len - len / 2));
        r.pick(&input(&t), c, now).unwrap();
        last = t;
    }
    let _ = r.take_digest();
    (r, last)
}

fn input(t: &str) -> RouteInput<'_> {
    RouteInput { model: "m", text: Some(t), ..RouteInput::default() }
}

fn cache_aware(c: &mut Criterion) {
    let u = urls(8);
    let cs = cands(&u);
    let now = smg::clock::now();
    for (name, len) in [("2KB", 2 * 1024), ("200KB", 200 * 1024)] {
        for shards in [1usize, 2] {
            let (mut r, conv) = populated(len, shards, &cs);
            let suffix = if shards == 1 { "" } else { "_with_digest" };
            // The same prompt again: full match, stamps the path.
            c.bench_function(&format!("cache_aware/{name}_repeat{suffix}"), |b| {
                b.iter(|| {
                    let i = r.pick(black_box(&input(&conv)), &cs, now).unwrap();
                    if shards > 1 {
                        let _ = r.take_digest();
                    }
                    i
                })
            });
            // A new turn: the stored conversation's first 95 % plus a new 5 % tail (a split
            // and a new leaf per request).
            let keep = len * 95 / 100;
            let mut n = 0u64;
            let mut drained = 0u64;
            c.bench_function(&format!("cache_aware/{name}_new_turn{suffix}"), |b| {
                b.iter_batched(
                    || {
                        n += 1;
                        let mut t = String::with_capacity(len);
                        t.push_str(&conv[..keep]);
                        t.push_str(&format!("{n:016}"));
                        t.push_str(&text(n, len - keep - 16));
                        t
                    },
                    |t| {
                        let i = r.pick(&input(&t), &cs, now).unwrap();
                        // Drain the outbox as the shard would every ~100 ms.
                        drained += 1;
                        if shards > 1 && drained.is_multiple_of(256) {
                            let _ = r.take_digest();
                        }
                        i
                    },
                    BatchSize::SmallInput,
                )
            });
        }
        // A prompt nothing shares: a miss and a whole new leaf.
        let (mut r, _) = populated(len, 1, &cs);
        let mut n = 0u64;
        c.bench_function(&format!("cache_aware/{name}_miss"), |b| {
            b.iter_batched(
                || {
                    n += 1;
                    format!("{n:016}{}", text(n, len - 16))
                },
                |t| r.pick(&input(&t), &cs, now).unwrap(),
                BatchSize::SmallInput,
            )
        });
        // A peer replaying one digest record of a new turn.
        let (mut sender, conv) = populated(len, 2, &cs);
        let mut receiver = ShardRouter::new(&RoutingConfig::default(), 1, 2);
        let mut m = 0u64;
        c.bench_function(&format!("cache_aware/{name}_apply_digest_record"), |b| {
            b.iter_batched(
                || {
                    m += 1;
                    let t = format!("{}{m:016}", &conv[..len - 16]);
                    sender.pick(&input(&t), &cs, now).unwrap();
                    sender.take_digest().unwrap()
                },
                |d| receiver.apply_digest(&d),
                BatchSize::SmallInput,
            )
        });
    }
}

fn keyed(k: &str) -> RouteInput<'_> {
    RouteInput { model: "m", routing_key: Some(k), ..RouteInput::default() }
}

fn hash_policies(c: &mut Criterion) {
    let now = smg::clock::now();
    let keys: Vec<String> = (0..1024).map(|i| format!("session-{i}")).collect();
    let prompts: Vec<String> = (0..1024).map(|i| text(i, 2048)).collect();
    for n in [2usize, 10, 100, 1000] {
        let u = urls(n);
        let cs = cands(&u);
        for policy in [PolicyKind::ConsistentHashing, PolicyKind::PrefixHash, PolicyKind::Manual] {
            let mut r = ShardRouter::new(&RoutingConfig::for_policy(policy), 0, 1);
            let mut i = 0usize;
            c.bench_function(&format!("{policy}/versioned/{n}_workers"), |b| {
                b.iter(|| {
                    i = (i + 1) % 1024;
                    let inp = if policy == PolicyKind::PrefixHash { input(&prompts[i]) } else { keyed(&keys[i]) };
                    r.pick_versioned(black_box(&inp), &cs, 1, now).unwrap()
                })
            });
            if policy == PolicyKind::ConsistentHashing {
                c.bench_function(&format!("{policy}/fingerprinted/{n}_workers"), |b| {
                    b.iter(|| {
                        i = (i + 1) % 1024;
                        r.pick(black_box(&keyed(&keys[i])), &cs, now).unwrap()
                    })
                });
            }
        }
    }
}

fn parsing(c: &mut Criterion) {
    let hint: String = (0..512).map(|i| (i * 7919 % 150_000).to_string()).collect::<Vec<_>>().join(",");
    let hint = &hint[..hint[..4096.min(hint.len())].rfind(',').unwrap_or(0)];
    c.bench_function("headers/routing_tokens_4KB", |b| b.iter(|| parse_routing_tokens(black_box(hint.as_bytes()))));
    let content = text(5, 2000);
    let body = format!(
        r#"{{"model":"m","stream":true,"messages":[{{"role":"system","content":"{}"}},{{"role":"user","content":"hi"}}],"cache_salt":"t1"}}"#,
        content
    );
    c.bench_function("text/scan_body_chat_2KB", |b| b.iter(|| scan_body(TextSource::Chat, black_box(body.as_bytes()))));
}

fn memory_report() {
    let u = urls(8);
    let cs = cands(&u);
    let now = smg::clock::now();
    let mut r = ShardRouter::new(&RoutingConfig::default(), 0, 1);
    // 400 chats of 8 turns over 8 system prompts of 4 KB; turns add ~1.5 KB each.
    for conv in 0..400u64 {
        let mut t = text(conv % 8, 4096);
        for turn in 0..8u64 {
            t.push_str(&text(conv * 100 + turn, 1500));
            r.pick(&input(&t), &cs, now).unwrap();
        }
    }
    let s = r.stats().text_tree;
    eprintln!(
        "tree memory: {} chars, {} nodes, cost {} (budget {}), ~{} heap bytes = {:.2} bytes/char",
        s.chars,
        s.nodes,
        s.cost,
        RoutingConfig::default().max_tree_size,
        s.heap_bytes,
        s.heap_bytes as f64 / s.chars as f64
    );
    let small = RoutingConfig { max_tree_size: 1 << 20, ..RoutingConfig::default() };
    let mut r = ShardRouter::new(&small, 0, 1);
    for conv in 0..400u64 {
        let t = format!("{}{}", text(conv % 8, 4096), text(conv + 7, 6000));
        r.pick(&input(&t), &cs, now).unwrap();
    }
    let s = r.stats().text_tree;
    eprintln!(
        "tree under a 1 MiB budget after 4 MB of prompts: cost {} chars+charges, {} heap bytes",
        s.cost, s.heap_bytes
    );
}

fn all(c: &mut Criterion) {
    memory_report();
    cache_aware(c);
    hash_policies(c);
    parsing(c);
}

criterion_group!(benches, all);
criterion_main!(benches);
