//! `prefix_hash`: hash the prompt's head (`--prefix-token-count` tokens, or 4× as many bytes of
//! untokenized text) onto the ring, then walk clockwise past overloaded workers.
//!
//! Lighter than `cache_aware` (no tree, an O(1) ring lookup) and coherent across shards for free:
//! the ring and the hash are the same everywhere. A worker is overloaded when its in-flight
//! load exceeds both `mean × --prefix-hash-load-factor` and `mean +
//! --prefix-hash-balance-abs-threshold` (mean counting this request); when every worker is,
//! the ring's owner takes it anyway.

use super::cache_aware::root_key;
use super::config::RoutingConfig;
use super::hashing::{hash_bytes, hash_str, hash_tokens, mix};
use super::simple::least_load;
use super::types::{Candidate, RouteInput};
use super::workers::View;

/// Bytes of text per token when the prompt is not tokenized (SMG's estimate).
pub const CHARS_PER_TOKEN: usize = 4;

/// The hash `prefix_hash` places a request by; `None` when it has neither key nor prompt.
pub(crate) fn prefix_key(cfg: &RoutingConfig, input: &RouteInput<'_>) -> Option<u64> {
    // Without the override, a routing key replaces the prompt (the contract). With it, the
    // sticky map has handled keyed requests before this runs.
    if !cfg.routing_key_override {
        if let Some(k) = input.routing_key {
            return Some(mix(hash_str(k), 0x6b));
        }
    }
    let ns = root_key(input.model, input.namespace);
    if let Some(t) = input.tokens.filter(|t| !t.is_empty()) {
        let n = t.len().min(cfg.prefix_token_count.max(1));
        return Some(mix(ns, hash_tokens(0, &t[..n])));
    }
    let text = input.text.filter(|t| !t.is_empty())?.as_bytes();
    let n = text.len().min(cfg.prefix_token_count.max(1).saturating_mul(CHARS_PER_TOKEN));
    Some(mix(ns, hash_bytes(0, &text[..n])))
}

pub(crate) fn pick(
    cfg: &RoutingConfig,
    view: &mut View,
    cands: &[Candidate<'_>],
    input: &RouteInput<'_>,
    rng: &mut fastrand::Rng,
) -> usize {
    let Some(key) = prefix_key(cfg, input) else {
        return least_load(rng, cands);
    };
    // The mean (an O(workers) sum) is needed only for a worker above the absolute threshold:
    // at or below it, `load > mean + threshold` cannot hold. So a quiet ring decides in
    // O(1), flat from 2 to 1,000 workers, and the sum is paid only under real load.
    let mut mean: Option<f32> = None;
    let mut overloaded = |load: usize| {
        if load <= cfg.prefix_hash_balance_abs_threshold {
            return false;
        }
        let mean = *mean.get_or_insert_with(|| {
            let total: usize = cands.iter().map(|c| c.load).sum();
            (total + 1) as f32 / cands.len() as f32
        });
        let l = load as f32;
        l > mean * cfg.prefix_hash_load_factor && l > mean + cfg.prefix_hash_balance_abs_threshold as f32
    };
    let ring = view.ring();
    let mut owner = None;
    for i in ring.walk(key) {
        owner.get_or_insert(i);
        if !overloaded(cands[i].load) {
            return i;
        }
    }
    owner.unwrap_or(0)
}
