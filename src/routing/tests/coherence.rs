//! Shard coherence of `cache_aware`, measured: a multi-turn, shared-system-prompt workload
//! routed by 1 shared tree, by 2 and 8 shards exchanging insert digests, by 8 shards without
//! digests, and by round_robin, against simulated workers with bounded LRU prefix caches.
//!
//! Run with `cargo test coherence -- --nocapture` to see the figures.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use crate::routing::hashing::{hash_bytes, mix};
use crate::routing::{Candidate, PolicyKind, RouteInput, RoutingConfig, ShardRouter};

/// The engine caches whole blocks of this many characters (like a KV page).
const BLOCK: usize = 32;

/// A worker's prefix cache: LRU over block-chain hashes, bounded in blocks.
struct PrefixCache {
    capacity: usize,
    stamp: u64,
    by_hash: HashMap<u64, u64>,
    by_stamp: BTreeMap<u64, u64>,
}

impl PrefixCache {
    fn new(capacity_chars: usize) -> Self {
        PrefixCache { capacity: capacity_chars / BLOCK, stamp: 0, by_hash: HashMap::new(), by_stamp: BTreeMap::new() }
    }

    /// Cached leading characters of `blocks`, then caches all of them (most recent last).
    fn serve(&mut self, blocks: &[u64]) -> usize {
        let hit = blocks.iter().take_while(|h| self.by_hash.contains_key(h)).count();
        for &h in blocks {
            self.stamp += 1;
            if let Some(old) = self.by_hash.insert(h, self.stamp) {
                self.by_stamp.remove(&old);
            }
            self.by_stamp.insert(self.stamp, h);
        }
        while self.by_hash.len() > self.capacity {
            let Some((_, h)) = self.by_stamp.pop_first() else {
                break;
            };
            self.by_hash.remove(&h);
        }
        hit * BLOCK
    }
}

/// Block-chain hashes of a text's full blocks: block k's hash covers the whole prefix.
fn blocks(text: &str) -> Vec<u64> {
    let mut h = 0u64;
    text.as_bytes()
        .chunks_exact(BLOCK)
        .map(|c| {
            h = mix(h, hash_bytes(7, c));
            h
        })
        .collect()
}

fn words(rng: &mut fastrand::Rng, len: usize) -> String {
    (0..len)
        .map(|_| {
            let r = rng.usize(..32);
            if r < 5 {
                ' '
            } else {
                (b'a' + (r % 26) as u8) as char
            }
        })
        .collect()
}

#[derive(Clone, Copy)]
pub(crate) struct Scenario {
    pub groups: usize,
    pub users: usize,
    pub turns: usize,
    pub workers: usize,
    pub system_chars: usize,
    pub cache_chars: usize,
    pub digest_ms: u64,
}

impl Scenario {
    pub(crate) fn small() -> Self {
        Scenario { groups: 8, users: 64, turns: 8, workers: 8, system_chars: 600, cache_chars: 80_000, digest_ms: 100 }
    }
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A user's next turn (user index).
    Turn(usize),
    /// A request finished on a worker.
    Done(usize),
}

/// Runs the scenario and returns the cached-character ratio over all requests.
pub(crate) fn run(s: Scenario, policy: PolicyKind, shards: usize, digests: bool, seed: u64) -> f64 {
    let mut rng = fastrand::Rng::with_seed(seed);
    let systems: Vec<String> = (0..s.groups).map(|_| words(&mut rng, s.system_chars)).collect();
    let urls: Vec<String> = (0..s.workers).map(|i| format!("http://w{i}:8000")).collect();
    let cfg = RoutingConfig::for_policy(policy);
    let mut routers: Vec<ShardRouter> = (0..shards).map(|i| ShardRouter::new(&cfg, i, shards)).collect();
    let mut caches: Vec<PrefixCache> = (0..s.workers).map(|_| PrefixCache::new(s.cache_chars)).collect();
    let mut load = vec![0usize; s.workers];
    // Each user's conversation so far, and turns left.
    let mut convo: Vec<String> = (0..s.users).map(|u| systems[u % s.groups].clone()).collect();
    let mut left = vec![s.turns; s.users];
    let mut events = BinaryHeap::new();
    for u in 0..s.users {
        events.push(Reverse((rng.usize(..20_000) as u64, Event::Turn(u))));
    }
    let (mut cached, mut total) = (0usize, 0usize);
    let mut next_digest = s.digest_ms;
    let now = crate::clock::now();
    while let Some(Reverse((t, ev))) = events.pop() {
        if digests {
            while t >= next_digest {
                let ds: Vec<_> = routers.iter_mut().filter_map(|r| r.take_digest()).collect();
                for d in &ds {
                    for r in routers.iter_mut() {
                        r.apply_digest(d);
                    }
                }
                next_digest += s.digest_ms;
            }
        }
        match ev {
            Event::Done(w) => load[w] -= 1,
            Event::Turn(u) => {
                let n = 150 + rng.usize(..200);
                let msg = words(&mut rng, n);
                convo[u].push_str(&msg);
                let prompt = convo[u].clone();
                let cands: Vec<Candidate<'_>> = urls
                    .iter()
                    .zip(&load)
                    .map(|(url, &l)| Candidate { url, load: l, engine_load: None, cached: None })
                    .collect();
                let input = RouteInput { model: "m", text: Some(&prompt), ..RouteInput::default() };
                // The kernel spreads connections: any shard may get any turn.
                let shard = rng.usize(..shards);
                let w = routers[shard].pick(&input, &cands, now).unwrap_or(0);
                let n = 500 + rng.usize(..400);
                let reply = words(&mut rng, n);
                convo[u].push_str(&reply);
                // The engine caches the prompt and what it generated.
                let served = caches[w].serve(&blocks(&convo[u]));
                cached += served.min(prompt.len());
                total += prompt.len();
                load[w] += 1;
                let service = 1000 + rng.usize(..2000) as u64;
                events.push(Reverse((t + service, Event::Done(w))));
                left[u] -= 1;
                if left[u] > 0 {
                    let think = 2000 + rng.usize(..6000) as u64;
                    events.push(Reverse((t + service + think, Event::Turn(u))));
                }
            }
        }
    }
    cached as f64 / total as f64
}

/// The mean ratio over a few seeds, so one lucky placement does not decide the comparison.
pub(crate) fn mean_run(s: Scenario, policy: PolicyKind, shards: usize, digests: bool) -> f64 {
    const SEEDS: [u64; 3] = [1, 2, 3];
    SEEDS.iter().map(|&seed| run(s, policy, shards, digests, seed)).sum::<f64>() / SEEDS.len() as f64
}

#[test]
fn shards_with_digests_match_one_shared_tree() {
    let s = Scenario::small();
    let one = mean_run(s, PolicyKind::CacheAware, 1, true);
    let two = mean_run(s, PolicyKind::CacheAware, 2, true);
    let eight = mean_run(s, PolicyKind::CacheAware, 8, true);
    let eight_alone = mean_run(s, PolicyKind::CacheAware, 8, false);
    let rr = mean_run(s, PolicyKind::RoundRobin, 2, true);
    eprintln!(
        "cached-token ratio: 1 tree {one:.3}, 2 shards {two:.3} ({:.1}%), 8 shards {eight:.3} \
         ({:.1}%), 8 shards without digests {eight_alone:.3}, round_robin {rr:.3}",
        100.0 * two / one,
        100.0 * eight / one
    );
    assert!(two >= 0.95 * one, "2 shards {two} vs one tree {one}");
    assert!(eight >= 0.95 * one, "8 shards {eight} vs one tree {one}");
    assert!(two >= 3.0 * rr, "2 shards {two} vs round_robin {rr}");
    assert!(eight >= 3.0 * rr, "8 shards {eight} vs round_robin {rr}");
    // The digests are what keeps 8 trees coherent.
    assert!(eight_alone < eight, "without digests {eight_alone} vs with {eight}");
}
