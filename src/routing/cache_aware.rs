//! `cache_aware`: route to the worker most likely to hold the request's prefix in its KV cache,
//! unless that worker is overloaded; and keep the shards' private trees in agreement.
//!
//! # The rule (one tree)
//!
//! The routing text (or token ids) is matched against the shard's radix tree under the root of
//! its (model, namespace). With `ratio = matched / length`:
//!
//! * `ratio > --cache-threshold`: the holders of the deepest matched node that are available
//!   now; the least loaded of them wins, unless it is over the spill gate
//!   (`load > mean × --balance-rel-threshold` and `load > mean + --balance-abs-threshold`,
//!   `mean` over all candidates), in which case the least-loaded candidate wins. If no holder
//!   of the deepest node is available, the deepest node that has one counts (with its shorter
//!   match).
//! * otherwise the least-loaded candidate.
//!
//! The chosen worker is then recorded on the whole path (radix.rs: stamps for LRU). Ties
//! between equally loaded workers go to a rendezvous hash of the prompt's head with each URL, so
//! a quiet system spreads new prefixes over all workers (instead of all on the first), and so
//! every shard breaks the same tie the same way.
//!
//! # Coherence between shards
//!
//! Each shard owns its trees and reads and writes them without locks. Left alone, N trees
//! disagree: a conversation whose turn 1 was routed on shard A lands on shard B for turn 2
//! (the kernel spreads connections, and clients reconnect), B has never seen its history, the
//! match ratio is low, and B sends turn 2 to the least-loaded worker, which has none of the
//! conversation's KV cache. Two mechanisms fix that:
//!
//! 1. **Insert digests.** Every routed insert is also appended to the shard's outbox as
//!    (root, key, worker URL). The shard's owner drains it with `ShardRouter::take_digest`
//!    every ~100 ms, shares the [`Digest`] with every other shard (an `Arc` through each
//!    shard's bounded inbox, with `try_send`: a full inbox drops the digest, which costs hit
//!    quality, never latency), and each peer replays it with `ShardRouter::apply_digest`:
//!    a plain insert into its own tree. A conversation's next turn arrives a response time and
//!    a think time after its previous turn was routed (seconds), far longer than the digest
//!    period, so by then every shard's tree holds the path. The outbox is bounded
//!    (`MAX_DIGEST_RECORDS`, `MAX_DIGEST_BYTES`); records past the bound are dropped and
//!    counted.
//! 2. **Deterministic tie-breaks.** Within a digest period two shards can still see related
//!    requests that neither has told the other about (two users of a new system prompt at
//!    once). Ties are broken by a hash of the prompt's head, not by shard-local randomness, so
//!    with the same loads both shards pick the same worker.
//!
//! Cost: a replayed insert costs what a routed insert costs (a tree walk, no routing), paid by
//! each of the N−1 peers, plus one copy of the key into the outbox. Measured in
//! `bench/routing.rs` (`cache_aware/apply_digest_*`).
//!
//! Measured (tests/coherence.rs: 64 users × 8 turns over 8 shared system prompts, 8 workers
//! each with an 80 K-character LRU prefix cache, every request on a random shard, digests every
//! 100 ms; mean of 3 seeds): cached-token ratio 0.875 with one shared tree, 0.864 with 2 shards
//! (98.7 %), 0.882 with 8 shards (100.8 %), 0.417 with 8 shards and no digests, 0.263 for
//! round_robin. Replaying a digest record costs ~0.8 µs at 2 KB and ~14 µs at 200 KB per peer
//! (`bench/routing.rs`).

use std::sync::Arc;

use super::config::RoutingConfig;
use super::hashing::{hash_bytes, hash_str, hash_tokens, mix};
use super::radix::{Elem, RadixTree, TreeStats};
use super::simple::least_loaded_by_key;
use super::types::{Candidate, RouteInput};
use super::workers::{Slots, View};

/// A digest carries at most this many inserts; later ones wait for the next digest... or are
/// dropped if the outbox is full (see `MAX_DIGEST_BYTES`).
pub const MAX_DIGEST_RECORDS: usize = 16_384;
/// A digest carries at most this many key bytes (token ids count 4 each).
pub const MAX_DIGEST_BYTES: usize = 32 << 20;
/// Ties hash at most this many leading elements of the key: enough to tell conversations
/// apart, cheap on a 200 KB prompt, and stable as a conversation grows past it.
const TIE_KEY_ELEMS: usize = 4096;

/// The head of a prompt that places it when no worker holds it and the engines' events
/// drive routing: four 16-token blocks, so conversations that share a system prompt land
/// where its blocks will be.
const COLD_HEAD_ELEMS: usize = 64;

/// One routed insert, as replayed by peers.
#[derive(Debug, Clone)]
pub(crate) struct DigestRecord {
    root: u64,
    key: DigestKey,
    url: Arc<str>,
}

#[derive(Debug, Clone)]
enum DigestKey {
    Text(Box<[u8]>),
    Tokens(Box<[u32]>),
}

/// A batch of one shard's inserts for its peers. `Send + Sync`: share it as `Arc<Digest>`.
#[derive(Debug, Clone)]
pub struct Digest {
    pub(crate) from_shard: usize,
    pub(crate) records: Vec<DigestRecord>,
}

// === impl Digest ===

impl Digest {
    /// The shard that produced it (peers skip their own).
    pub fn from_shard(&self) -> usize {
        self.from_shard
    }

    /// Inserts carried.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

/// The routing key of one request.
enum Key<'a> {
    Text(&'a [u8]),
    Tokens(&'a [u32]),
}

/// One shard's cache-aware state: a byte tree, a token tree, and the digest outbox.
#[derive(Debug)]
pub(crate) struct CacheAware {
    text: RadixTree<u8>,
    tokens: RadixTree<u32>,
    outbox: Vec<DigestRecord>,
    outbox_bytes: usize,
    /// Whether peers exist to send digests to.
    share: bool,
    pub(crate) digest_dropped: u64,
    /// Decisions that went to a worker holding the prefix (match above --cache-threshold),
    /// and the rest: the routing-side cache hit ratio.
    pub(crate) hits: u64,
    pub(crate) misses: u64,
}

/// The tree root of a (model, namespace): requests in different namespaces never share a prefix.
pub(crate) fn root_key(model: &str, namespace: Option<&str>) -> u64 {
    mix(hash_str(model), namespace.map_or(0, hash_str))
}

// === impl CacheAware ===

impl CacheAware {
    pub(crate) fn new(cfg: &RoutingConfig, share: bool) -> Self {
        CacheAware {
            text: RadixTree::new(cfg.max_tree_size),
            tokens: RadixTree::new(cfg.max_tree_size),
            outbox: Vec::new(),
            outbox_bytes: 0,
            share,
            digest_dropped: 0,
            hits: 0,
            misses: 0,
        }
    }

    fn key<'a>(input: &RouteInput<'a>) -> Option<Key<'a>> {
        // A routing-tokens hint replaces the body's text and ids (the contract).
        match (input.tokens, input.text) {
            (Some(t), _) if !t.is_empty() => Some(Key::Tokens(t)),
            (_, Some(s)) if !s.is_empty() => Some(Key::Text(s.as_bytes())),
            _ => None,
        }
    }

    /// Chooses a worker for `input` and records it in the tree.
    pub(crate) fn pick(
        &mut self,
        cfg: &RoutingConfig,
        view: &View,
        slots: &Slots,
        cands: &[Candidate<'_>],
        input: &RouteInput<'_>,
    ) -> usize {
        let root = root_key(input.model, input.namespace);
        match Self::key(input) {
            Some(Key::Text(k)) => {
                let (i, hit) = decide(&mut self.text, root, k, cfg, view, cands, tie_bytes);
                self.count(hit);
                self.record_after_match(root, Key::Text(k), view.slot_of[i], slots);
                i
            }
            Some(Key::Tokens(k)) => {
                let (i, hit) = decide(&mut self.tokens, root, k, cfg, view, cands, tie_tokens);
                self.count(hit);
                self.record_after_match(root, Key::Tokens(k), view.slot_of[i], slots);
                i
            }
            None => {
                // Nothing to match: the least-loaded worker, ties by the model name.
                least_loaded_by_key(cands, &view.url_hash, || root, 0..cands.len()).unwrap_or(0)
            }
        }
    }

    /// Records that `slot` was sent `input`'s prefix without routing it (a sticky pin chose the
    /// worker), so the tree still learns where the conversation lives.
    pub(crate) fn record(&mut self, input: &RouteInput<'_>, slot: u32, slots: &Slots) {
        let root = root_key(input.model, input.namespace);
        match Self::key(input) {
            Some(Key::Text(k)) => {
                self.text.match_prefix(root, k);
                self.record_after_match(root, Key::Text(k), slot, slots);
            }
            Some(Key::Tokens(k)) => {
                self.tokens.match_prefix(root, k);
                self.record_after_match(root, Key::Tokens(k), slot, slots);
            }
            None => {}
        }
    }

    fn record_after_match(&mut self, root: u64, key: Key<'_>, slot: u32, slots: &Slots) {
        let bytes = match key {
            Key::Text(k) => {
                self.text.insert_matched(root, k, slot);
                k.len()
            }
            Key::Tokens(k) => {
                self.tokens.insert_matched(root, k, slot);
                k.len() * 4
            }
        };
        if !self.share {
            return;
        }
        if self.outbox.len() >= MAX_DIGEST_RECORDS || self.outbox_bytes + bytes > MAX_DIGEST_BYTES {
            self.digest_dropped += 1;
            return;
        }
        let Some(url) = slots.url(slot) else { return };
        self.outbox_bytes += bytes;
        self.outbox.push(DigestRecord {
            root,
            key: match key {
                Key::Text(k) => DigestKey::Text(k.into()),
                Key::Tokens(k) => DigestKey::Tokens(k.into()),
            },
            url: url.clone(),
        });
    }

    /// Drains the outbox into a digest for the peers.
    pub(crate) fn take_digest(&mut self, from_shard: usize) -> Option<Digest> {
        if self.outbox.is_empty() {
            return None;
        }
        self.outbox_bytes = 0;
        Some(Digest { from_shard, records: std::mem::take(&mut self.outbox) })
    }

    /// Replays a peer's inserts into this shard's trees.
    pub(crate) fn apply_digest(&mut self, digest: &Digest, slots: &mut Slots) {
        for r in &digest.records {
            let slot = slots.intern(&r.url);
            match &r.key {
                DigestKey::Text(k) => self.text.insert(r.root, k, slot),
                DigestKey::Tokens(k) => self.tokens.insert(r.root, k, slot),
            }
        }
    }

    /// Purges a removed worker's marks (and the outbox's records of it).
    pub(crate) fn remove_slot(&mut self, slot: u32, url: &str) {
        self.text.remove_slot(slot);
        self.tokens.remove_slot(slot);
        self.outbox.retain(|r| &*r.url != url);
    }

    /// Periodic eviction down to the budget (inserts already never leave it exceeded).
    pub(crate) fn evict(&mut self, budget: usize) {
        self.text.evict_to(budget);
        self.tokens.evict_to(budget);
    }

    fn count(&mut self, hit: bool) {
        if hit {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
    }

    pub(crate) fn stats(&self) -> (TreeStats, TreeStats) {
        (self.text.stats(), self.tokens.stats())
    }
}

fn tie_bytes(k: &[u8]) -> u64 {
    hash_bytes(1, &k[..k.len().min(TIE_KEY_ELEMS)])
}

fn tie_tokens(k: &[u32]) -> u64 {
    hash_tokens(1, &k[..k.len().min(TIE_KEY_ELEMS)])
}

/// The cache-aware rule (module docs) over one tree; leaves the match in the tree's scratch
/// for `insert_matched`. Returns the pick and whether it went to a holder of the prefix.
fn decide<T: Elem>(
    tree: &mut RadixTree<T>,
    root: u64,
    key: &[T],
    cfg: &RoutingConfig,
    view: &View,
    cands: &[Candidate<'_>],
    tie: fn(&[T]) -> u64,
) -> (usize, bool) {
    let tie_key = || mix(root, tie(key));
    tree.match_prefix(root, key);
    let len = key.len() as f32;
    let total: usize = cands.iter().map(|c| c.load).sum();
    let mean = total as f32 / cands.len() as f32;
    let over_gate = |load: usize| {
        let l = load as f32;
        l > mean * cfg.balance_rel_threshold && l > mean + cfg.balance_abs_threshold as f32
    };
    if cands.iter().any(|c| c.cached.is_some()) {
        // The engines' own word (KV-cache events) for the workers that send it, the tree's
        // guess for the others: each candidate's depth, and the deepest ones hold the prefix.
        let mut depth: Vec<usize> = cands.iter().map(|c| c.cached.unwrap_or(0)).collect();
        for (matched, marks) in tree.path_marks() {
            for i in marks.iter().filter_map(|m| view.idx(m.slot)) {
                if cands[i].cached.is_none() {
                    depth[i] = depth[i].max(matched);
                }
            }
        }
        let best = depth.iter().copied().max().unwrap_or(0);
        if best > 0 && best as f32 / len > cfg.cache_threshold {
            let holders = (0..cands.len()).filter(|&i| depth[i] == best);
            if let Some(i) = least_loaded_by_key(cands, &view.url_hash, tie_key, holders) {
                if !over_gate(cands[i].load) {
                    return (i, true);
                }
            }
        }
        // Cold (no worker holds it), or its holder over the gate: the first worker in the
        // rendezvous order of the prompt's first blocks that is not over the gate. Replicas
        // see different loads, but while no worker is over the gate they all place a new
        // conversation on the same worker, and its events take over from there.
        let head = mix(root, tie(&key[..key.len().min(COLD_HEAD_ELEMS)]));
        let first_fit =
            (0..cands.len()).filter(|&i| !over_gate(cands[i].load)).max_by_key(|&i| mix(head, view.url_hash[i]));
        let i = first_fit.or_else(|| least_loaded_by_key(cands, &view.url_hash, tie_key, 0..cands.len()));
        return (i.unwrap_or(0), false);
    }
    for (matched, marks) in tree.path_marks() {
        if matched as f32 / len <= cfg.cache_threshold {
            break;
        }
        // This node's holders that are available now; none: try the next shallower node.
        let holders = marks.iter().filter_map(|m| view.idx(m.slot));
        let Some(i) = least_loaded_by_key(cands, &view.url_hash, tie_key, holders) else {
            continue;
        };
        if !over_gate(cands[i].load) {
            return (i, true);
        }
        break;
    }
    (least_loaded_by_key(cands, &view.url_hash, tie_key, 0..cands.len()).unwrap_or(0), false)
}
