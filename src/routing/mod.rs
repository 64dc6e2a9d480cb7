//! Routing policies: which worker serves a request, decided by each shard on its own tables.
//!
//! One [`ShardRouter`] per shard (core) holds every policy's state: the cache-aware radix
//! trees, the hash rings, the sticky maps, counters and an RNG. It is read and written with
//! plain `&mut self` calls: no locks, no atomics, no awaits. What crosses shards is explicit
//! and optional: cache-aware insert digests ([`ShardRouter::take_digest`] /
//! [`ShardRouter::apply_digest`]); everything else agrees across shards by construction
//! (stable hashes, the same ring everywhere). The coherence design and its measurement are in
//! `cache_aware.rs`.
//!
//! Per request, the caller:
//! 1. reads the hints: [`parse_routing_tokens`] (`X-SMG-Routing-Tokens`), [`first_routing_key`]
//!    over `--routing-key-headers`, and if the policy needs it ([`PolicyKind::uses_text`]) or
//!    the override is on, the body: [`scan_body`] for text or ids, namespace and `rid`;
//! 2. lists the model's available workers in registration order as [`Candidate`]s;
//! 3. calls [`ShardRouter::pick`] (or [`ShardRouter::pick_versioned`] with the snapshot's
//!    generation, which makes the hash policies' cost independent of the worker count);
//! 4. calls [`ShardRouter::tick`] about once a second, and [`ShardRouter::remove_worker`] when
//!    a worker leaves the registry.
//!
//! Policy / key matrix (the contract's "Routing Hint Headers"): without
//! `--routing-key-override`, `consistent_hashing` and `prefix_hash` hash the routing key
//! instead of their other inputs and `manual` pins it; the others ignore it. With the override,
//! every policy except `consistent_hashing` pins the key (body `rid` first, lineage suffixes
//! stripped) in a sticky map; `consistent_hashing` hashes the `rid`-derived key first.

use std::time::Instant;

mod cache_aware;
mod config;
mod consistent;
mod hashing;
mod headers;
mod loads;
mod manual;
mod prefix_hash;
mod radix;
mod simple;
mod text;
mod types;
mod workers;

#[cfg(test)]
mod tests;

pub use cache_aware::{Digest, MAX_DIGEST_BYTES, MAX_DIGEST_RECORDS};
pub use config::{AssignmentMode, PolicyKind, RoutingConfig};
pub use hashing::{hash_bytes, hash_str, VIRTUAL_NODES};
pub use headers::{
    first_routing_key, parse_routing_tokens, parse_target_worker, rid_key, sticky_rid, valid_routing_key,
    MAX_ROUTING_KEY_BYTES, MAX_ROUTING_TOKENS, MAX_ROUTING_TOKENS_BYTES,
};
pub use loads::{parse_engine_load, parse_sglang_loads, EngineLoad};
pub use prefix_hash::CHARS_PER_TOKEN;
pub use radix::{TreeStats, NODE_CHARGE};
pub use text::{body_rid, namespace, routing_text, scan_body, BodyFields, RoutingSignal, TextSource};
pub use types::{Candidate, RouteError, RouteInput};

use manual::StickyMap;
use workers::{Slots, View, Views};

/// Size figures of one shard's routing state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouterStats {
    pub text_tree: TreeStats,
    pub token_tree: TreeStats,
    /// Keys pinned by `manual`.
    pub manual_keys: usize,
    /// Keys pinned by `--routing-key-override`.
    pub sticky_keys: usize,
    /// Cache-aware inserts not put in a digest because the outbox was full.
    pub digest_dropped: u64,
    /// cache_aware decisions that went to a holder of the prefix, and the others.
    pub cache_hits: u64,
    pub cache_misses: u64,
}

/// One shard's routing state. Not shared: each shard owns one and calls it from its own thread.
#[derive(Debug)]
pub struct ShardRouter {
    cfg: RoutingConfig,
    shard_index: usize,
    /// More than one shard routes for this gateway: new pinned keys must be placed the same
    /// way on every shard.
    sharded: bool,
    rng: fastrand::Rng,
    rr: usize,
    slots: Slots,
    views: Views,
    cache: cache_aware::CacheAware,
    /// `--policy manual`'s map (not scoped by model, as in SMG).
    manual: StickyMap,
    /// `--routing-key-override`'s map (scoped by model).
    sticky: StickyMap,
    last_sweep: Option<Instant>,
}

// === impl ShardRouter ===

impl ShardRouter {
    pub fn new(cfg: &RoutingConfig, shard_index: usize, shard_count: usize) -> Self {
        ShardRouter {
            cfg: cfg.clone(),
            shard_index,
            sharded: shard_count > 1,
            // Seeded per shard: shards draw independent streams, and runs are reproducible.
            rng: fastrand::Rng::with_seed(
                0x5eed_0000_0000_0000 ^ (shard_index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ),
            rr: shard_index,
            slots: Slots::default(),
            views: Views::default(),
            cache: cache_aware::CacheAware::new(cfg, shard_count > 1),
            manual: StickyMap::default(),
            sticky: StickyMap::default(),
            last_sweep: None,
        }
    }

    pub fn config(&self) -> &RoutingConfig {
        &self.cfg
    }

    /// Chooses a candidate for `input`. The candidate list is fingerprinted (one hash of its
    /// URLs) to notice worker-set changes; see [`Self::pick_versioned`] to skip that.
    pub fn pick(
        &mut self,
        input: &RouteInput<'_>,
        candidates: &[Candidate<'_>],
        now: Instant,
    ) -> Result<usize, RouteError> {
        self.pick_inner(input, candidates, None, now)
    }

    /// Like [`Self::pick`], with `epoch` identifying the candidate list (e.g. the worker
    /// snapshot's generation, changed whenever the model's available workers change): an
    /// unchanged epoch skips the fingerprint, so the hash policies cost the same at 2 or 1,000
    /// workers.
    pub fn pick_versioned(
        &mut self,
        input: &RouteInput<'_>,
        candidates: &[Candidate<'_>],
        epoch: u64,
        now: Instant,
    ) -> Result<usize, RouteError> {
        self.pick_inner(input, candidates, Some(epoch), now)
    }

    fn pick_inner(
        &mut self,
        input: &RouteInput<'_>,
        cands: &[Candidate<'_>],
        epoch: Option<u64>,
        now: Instant,
    ) -> Result<usize, RouteError> {
        if cands.is_empty() {
            return Err(RouteError::NoWorker);
        }
        let Self { cfg, rng, rr, slots, views, cache, manual, sticky, sharded, .. } = self;
        let view = views.get(input.model, cands, epoch, slots);
        match cfg.policy {
            PolicyKind::ConsistentHashing => consistent::pick(cfg, view, cands.len(), input, rng),
            PolicyKind::Manual => Ok(pick_manual(cfg, view, cands, input, manual, rng, now)),
            policy => {
                let key = if cfg.routing_key_override { override_key(input) } else { None };
                let Some(key) = key else {
                    return Ok(place(policy, cfg, view, slots, cands, input, cache, rng, rr));
                };
                if let Some(i) = sticky.lookup(input.model, key, view, now) {
                    if policy == PolicyKind::CacheAware {
                        cache.record(input, view.slot_of[i], slots);
                    }
                    return Ok(i);
                }
                // `delegate` lets the policy place a new key. With several shards each shard
                // keeps its own sticky map, and a shard-local draw (round_robin's counter, an
                // RNG, local loads) would pin the same key to different workers on different
                // shards; the key's hash places it identically everywhere instead.
                let mode = match cfg.assignment_mode {
                    AssignmentMode::Delegate if *sharded => AssignmentMode::Random,
                    mode => mode,
                };
                let i = match mode {
                    AssignmentMode::Delegate => place(policy, cfg, view, slots, cands, input, cache, rng, rr),
                    mode => {
                        let i = manual::assign(mode, manual::key_hash(key), view, cands, sticky);
                        if policy == PolicyKind::CacheAware {
                            cache.record(input, view.slot_of[i], slots);
                        }
                        i
                    }
                };
                let promote = cfg.assignment_mode == AssignmentMode::Delegate;
                sticky.record(input.model, key, view.slot_of[i], now, promote);
                Ok(i)
            }
        }
    }

    /// Purges a removed worker from every table: tree marks, pins, ring and views.
    pub fn remove_worker(&mut self, url: &str) {
        let Some(slot) = self.slots.get(url) else {
            return;
        };
        self.cache.remove_slot(slot, url);
        self.manual.remove_slot(slot);
        self.sticky.remove_slot(slot);
        self.views.clear();
        self.slots.release(url);
    }

    /// Periodic work, called by the shard about once a second: every `--eviction-interval`,
    /// evicts the trees to their budget and idle pins older than `--max-idle-secs`.
    pub fn tick(&mut self, now: Instant) {
        let last = *self.last_sweep.get_or_insert(now);
        let interval = self.cfg.eviction_interval_secs;
        if interval == 0 || now.saturating_duration_since(last).as_secs() < interval {
            return;
        }
        self.last_sweep = Some(now);
        self.cache.evict(self.cfg.max_tree_size);
        self.manual.evict_idle(now, self.cfg.max_idle_secs);
        self.sticky.evict_idle(now, self.cfg.max_idle_secs);
    }

    /// Drains this shard's cache-aware inserts since the last call, for the other shards
    /// (`None` when there are none, or with one shard). Call it every ~100 ms and send the
    /// result, as `Arc<Digest>`, to every other shard's inbox with `try_send`.
    pub fn take_digest(&mut self) -> Option<Digest> {
        self.cache.take_digest(self.shard_index)
    }

    /// Replays another shard's digest into this shard's trees (own digests are ignored).
    pub fn apply_digest(&mut self, digest: &Digest) {
        if digest.from_shard != self.shard_index {
            self.cache.apply_digest(digest, &mut self.slots);
        }
    }

    pub fn stats(&self) -> RouterStats {
        let (text_tree, token_tree) = self.cache.stats();
        RouterStats {
            text_tree,
            token_tree,
            manual_keys: self.manual.len(),
            sticky_keys: self.sticky.len(),
            digest_dropped: self.cache.digest_dropped,
            cache_hits: self.cache.hits,
            cache_misses: self.cache.misses,
        }
    }
}

/// The sticky key under `--routing-key-override`: the body `rid`, else the header key, both
/// with lineage suffixes stripped.
fn override_key<'a>(input: &RouteInput<'a>) -> Option<&'a str> {
    input.rid.and_then(rid_key).or_else(|| input.routing_key.and_then(rid_key))
}

/// The configured policy's own placement (no pins).
#[allow(clippy::too_many_arguments)]
fn place(
    policy: PolicyKind,
    cfg: &RoutingConfig,
    view: &mut View,
    slots: &Slots,
    cands: &[Candidate<'_>],
    input: &RouteInput<'_>,
    cache: &mut cache_aware::CacheAware,
    rng: &mut fastrand::Rng,
    rr: &mut usize,
) -> usize {
    match policy {
        PolicyKind::Random => simple::random(rng, cands.len()),
        PolicyKind::RoundRobin => simple::round_robin(rr, cands.len()),
        PolicyKind::PowerOfTwo => simple::power_of_two(rng, cands),
        PolicyKind::LeastLoad => simple::least_load(rng, cands),
        PolicyKind::CacheAware => cache.pick(cfg, view, slots, cands, input),
        PolicyKind::PrefixHash => prefix_hash::pick(cfg, view, cands, input, rng),
        // Not reached: both are dispatched before `place`; a stable answer all the same.
        PolicyKind::ConsistentHashing | PolicyKind::Manual => 0,
    }
}

/// `manual`: pin the key (body `rid` first with the override; the header key unstripped);
/// without a key, place by the assignment mode without pinning.
fn pick_manual(
    cfg: &RoutingConfig,
    view: &mut View,
    cands: &[Candidate<'_>],
    input: &RouteInput<'_>,
    map: &mut StickyMap,
    rng: &mut fastrand::Rng,
    now: Instant,
) -> usize {
    let rid = if cfg.routing_key_override { input.rid.and_then(rid_key) } else { None };
    let Some(key) = rid.or(input.routing_key).filter(|k| !k.is_empty()) else {
        return match cfg.assignment_mode {
            AssignmentMode::Random => rng.usize(..cands.len()),
            mode => manual::assign(mode, rng.u64(..), view, cands, map),
        };
    };
    if let Some(i) = map.lookup("", key, view, now) {
        return i;
    }
    let i = manual::assign(cfg.assignment_mode, manual::key_hash(key), view, cands, map);
    map.record("", key, view.slot_of[i], now, false);
    i
}
