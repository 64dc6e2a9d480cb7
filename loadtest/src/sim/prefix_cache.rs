//! Bounded LRU prefix cache over prompt blocks: decides `cached_tokens` and how much prefill a request skips.
//!
//! Like a paged KV cache, the prompt is cut into fixed-size blocks and only whole blocks are
//! cached. Block i's key hashes block i together with block i-1's key, so a key stands for the
//! entire prefix up to that block and a hit run always starts at the first block.
//!
//! `lookup_insert_tracked` also reports what the lookup changed (blocks stored, blocks
//! evicted), for a worker's KV events (a gRPC worker's in sim/kv_events.rs, an HTTP worker's
//! over ZMQ in sim/zmq_events.rs); `lookup_insert` pays nothing for that.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Keys are already well-mixed hashes; hashing them again would be wasted work.
#[derive(Default)]
struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Node {
    key: u64,
    prev: u32,
    next: u32,
}

/// What a lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CacheResult {
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// What one tracked lookup changed: the blocks it stored and the blocks it evicted, netted so
/// that applying `removed` then `stored` to a mirror of the cache gives the cache's new state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheChanges {
    /// Blocks the lookup stored and still holds, in prompt order.
    pub stored: Vec<StoredBlock>,
    /// Keys of blocks held before the lookup that it evicted (LRU), in eviction order.
    pub removed: Vec<u64>,
    /// Every eviction of the lookup: the key and how many blocks had been stored by then.
    evictions: Vec<(u64, usize)>,
}

/// A block a lookup stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredBlock {
    /// Its position in the prompt: block i is prompt bytes i·block_bytes..(i+1)·block_bytes.
    pub index: usize,
    pub key: u64,
    /// The key of block index-1 (held or not); None for the prompt's first block.
    pub parent: Option<u64>,
}

// === impl CacheChanges ===

impl CacheChanges {
    pub fn is_empty(&self) -> bool {
        self.stored.is_empty() && self.removed.is_empty()
    }

    pub fn clear(&mut self) {
        self.stored.clear();
        self.removed.clear();
        self.evictions.clear();
    }

    /// Sorts the lookup's evictions: a block the lookup itself stored and then evicted (a prompt
    /// longer than the cache) is neither stored nor removed; any other evicted block is removed.
    fn settle(&mut self) {
        if self.evictions.is_empty() {
            return;
        }
        let position: HashMap<u64, usize> = self.stored.iter().enumerate().map(|(i, b)| (b.key, i)).collect();
        let mut gone = vec![false; self.stored.len()];
        for &(key, stored_before) in &self.evictions {
            match position.get(&key) {
                Some(&i) if i < stored_before => gone[i] = true,
                _ => self.removed.push(key),
            }
        }
        self.evictions.clear();
        if gone.contains(&true) {
            let mut i = 0;
            self.stored.retain(|_| {
                i += 1;
                !gone[i - 1]
            });
        }
    }
}

pub struct PrefixCache {
    block_bytes: usize,
    block_tokens: usize,
    bytes_per_token: usize,
    capacity: usize,
    map: HashMap<u64, u32, BuildHasherDefault<IdentityHasher>>,
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// Most recently used end.
    head: u32,
    /// Least recently used end; evicted first.
    tail: u32,
    hits: u64,
    lookups: u64,
}

// === impl PrefixCache ===

impl PrefixCache {
    /// `capacity_tokens` of 0 disables caching (every lookup misses, nothing is stored).
    pub fn new(capacity_tokens: usize, block_tokens: usize, bytes_per_token: usize) -> Self {
        let block_tokens = block_tokens.max(1);
        let capacity = capacity_tokens / block_tokens;
        Self {
            block_bytes: block_tokens * bytes_per_token.max(1),
            block_tokens,
            bytes_per_token: bytes_per_token.max(1),
            capacity,
            map: HashMap::with_capacity_and_hasher(capacity.min(1 << 16), Default::default()),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            hits: 0,
            lookups: 0,
        }
    }

    /// Tokens a prompt of `len` bytes counts as.
    pub fn tokens_for(&self, len: usize) -> u64 {
        len.div_ceil(self.bytes_per_token) as u64
    }

    /// Looks the prompt up, then stores all of its whole blocks as most recently used.
    pub fn lookup_insert(&mut self, prompt: &[u8]) -> CacheResult {
        self.lookup(prompt, None)
    }

    /// As [`Self::lookup_insert`], also reporting in `changes` (cleared first) the blocks it
    /// stored and evicted.
    pub fn lookup_insert_tracked(&mut self, prompt: &[u8], changes: &mut CacheChanges) -> CacheResult {
        changes.clear();
        let r = self.lookup(prompt, Some(&mut *changes));
        changes.settle();
        r
    }

    fn lookup(&mut self, prompt: &[u8], mut changes: Option<&mut CacheChanges>) -> CacheResult {
        let prompt_tokens = self.tokens_for(prompt.len());
        if self.capacity == 0 {
            return CacheResult { prompt_tokens, cached_tokens: 0 };
        }
        let mut key = 0x243F_6A88_85A3_08D3u64;
        let mut hit_blocks = 0u64;
        let mut still_hitting = true;
        for (index, block) in prompt.chunks_exact(self.block_bytes).enumerate() {
            let parent = key;
            key = hash_block(key, block);
            match self.map.get(&key).copied() {
                Some(idx) => {
                    if still_hitting {
                        hit_blocks += 1;
                    }
                    self.touch(idx);
                }
                None => {
                    still_hitting = false;
                    let evicted = self.insert(key);
                    if let Some(c) = changes.as_deref_mut() {
                        if let Some(victim) = evicted {
                            c.evictions.push((victim, c.stored.len()));
                        }
                        c.stored.push(StoredBlock { index, key, parent: (index > 0).then_some(parent) });
                    }
                }
            }
        }
        let cached_tokens = (hit_blocks * self.block_tokens as u64).min(prompt_tokens);
        self.lookups += prompt_tokens;
        self.hits += cached_tokens;
        CacheResult { prompt_tokens, cached_tokens }
    }

    /// Tokens per block.
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Prompt bytes counted as one token.
    pub fn bytes_per_token(&self) -> usize {
        self.bytes_per_token
    }

    /// Cached tokens over looked-up prompt tokens since start (or the last flush).
    pub fn hit_rate(&self) -> f64 {
        if self.lookups == 0 {
            0.0
        } else {
            self.hits as f64 / self.lookups as f64
        }
    }

    /// Tokens currently held.
    pub fn used_tokens(&self) -> u64 {
        (self.map.len() * self.block_tokens) as u64
    }

    pub fn capacity_tokens(&self) -> u64 {
        (self.capacity * self.block_tokens) as u64
    }

    pub fn flush(&mut self) {
        self.map.clear();
        self.nodes.clear();
        self.free.clear();
        self.head = NIL;
        self.tail = NIL;
        self.hits = 0;
        self.lookups = 0;
    }

    /// Stores `key` as most recently used; returns the key it evicted to make room.
    fn insert(&mut self, key: u64) -> Option<u64> {
        let mut evicted = None;
        let idx = if self.map.len() >= self.capacity {
            // Evict the LRU block and reuse its node.
            let victim = self.tail;
            self.unlink(victim);
            let old = self.nodes[victim as usize].key;
            self.map.remove(&old);
            evicted = Some(old);
            victim
        } else if let Some(i) = self.free.pop() {
            i
        } else {
            self.nodes.push(Node { key, prev: NIL, next: NIL });
            (self.nodes.len() - 1) as u32
        };
        self.nodes[idx as usize].key = key;
        self.push_front(idx);
        self.map.insert(key, idx);
        evicted
    }

    fn touch(&mut self, idx: u32) {
        if self.head != idx {
            self.unlink(idx);
            self.push_front(idx);
        }
    }

    fn unlink(&mut self, idx: u32) {
        let Node { prev, next, .. } = self.nodes[idx as usize];
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.head = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.tail = prev;
        }
    }

    fn push_front(&mut self, idx: u32) {
        let old = self.head;
        self.nodes[idx as usize].prev = NIL;
        self.nodes[idx as usize].next = old;
        if old != NIL {
            self.nodes[old as usize].prev = idx;
        }
        self.head = idx;
        if self.tail == NIL {
            self.tail = idx;
        }
    }
}

/// Word-at-a-time multiply-xorshift mix: ~8 bytes per step, so a 200 KB prompt hashes in tens of µs.
/// A prompt of token ids as the cache's bytes: `bytes_per_token` bytes per id, so the cache
/// counts exactly one token per id.
pub fn ids_key(ids: &[u32], bytes_per_token: usize) -> Vec<u8> {
    let mut key = Vec::with_capacity(ids.len() * bytes_per_token);
    for id in ids {
        let b = id.to_le_bytes();
        key.extend((0..bytes_per_token).map(|i| b[i % 4]));
    }
    key
}

fn hash_block(seed: u64, block: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = seed ^ (block.len() as u64).wrapping_mul(K);
    let mut words = block.chunks_exact(8);
    for w in &mut words {
        let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        h = (h ^ v).wrapping_mul(K);
        h ^= h >> 29;
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(K);
    }
    h ^= h >> 32;
    h.wrapping_mul(K)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| b'a' + ((i as u8).wrapping_add(seed)) % 26).collect()
    }

    #[test]
    fn repeated_prompt_hits_whole_blocks() {
        // 4 tokens per block at 1 byte per token: blocks of 4 bytes.
        let mut c = PrefixCache::new(1000, 4, 1);
        let p = text(10, 0);
        assert_eq!(c.lookup_insert(&p), CacheResult { prompt_tokens: 10, cached_tokens: 0 });
        // Two whole blocks (8 tokens) are cached; the 2-byte tail never is.
        assert_eq!(c.lookup_insert(&p).cached_tokens, 8);
        assert!((c.hit_rate() - 8.0 / 20.0).abs() < 1e-9);
    }

    #[test]
    fn shared_prefix_then_divergence() {
        let mut c = PrefixCache::new(1000, 4, 1);
        let mut a = text(12, 0);
        c.lookup_insert(&a);
        // Same first 8 bytes, different third block.
        a[9] = b'Z';
        assert_eq!(c.lookup_insert(&a).cached_tokens, 8);
        // A change in the first block breaks every later block too (chained keys).
        a[0] = b'Z';
        assert_eq!(c.lookup_insert(&a).cached_tokens, 0);
    }

    #[test]
    fn lru_evicts_oldest_and_respects_capacity() {
        // Room for 2 blocks of 4 tokens.
        let mut c = PrefixCache::new(8, 4, 1);
        let a = text(8, 0);
        let b = text(8, 5);
        c.lookup_insert(&a);
        assert_eq!(c.used_tokens(), 8);
        c.lookup_insert(&b);
        assert_eq!(c.used_tokens(), 8);
        // a was evicted by b.
        assert_eq!(c.lookup_insert(&a).cached_tokens, 0);
        // Touching keeps a block alive: a is now resident; re-read it, then add one block of c.
        assert_eq!(c.lookup_insert(&a).cached_tokens, 8);
        c.flush();
        assert_eq!(c.used_tokens(), 0);
        assert_eq!(c.lookup_insert(&a).cached_tokens, 0);
    }

    #[test]
    fn disabled_cache_counts_tokens_only() {
        let mut c = PrefixCache::new(0, 16, 4);
        let p = text(100, 0);
        c.lookup_insert(&p);
        assert_eq!(c.lookup_insert(&p), CacheResult { prompt_tokens: 25, cached_tokens: 0 });
    }

    #[test]
    fn tracked_lookup_reports_stored_blocks_with_parents() {
        let mut c = PrefixCache::new(1000, 4, 1);
        let mut ch = CacheChanges::default();
        let a = text(10, 0);
        let r = c.lookup_insert_tracked(&a, &mut ch);
        assert_eq!(r, CacheResult { prompt_tokens: 10, cached_tokens: 0 });
        // Two whole blocks; the 2-byte tail is never stored.
        assert_eq!(ch.stored.len(), 2);
        assert!(ch.removed.is_empty());
        let (b0, b1) = (ch.stored[0], ch.stored[1]);
        assert_eq!((b0.index, b0.parent), (0, None));
        assert_eq!((b1.index, b1.parent), (1, Some(b0.key)));
        // The same prompt again: nothing changes.
        assert_eq!(c.lookup_insert_tracked(&a, &mut ch).cached_tokens, 8);
        assert!(ch.is_empty());
        // A prompt sharing the first block stores only its own, after the shared one.
        let mut b = a.clone();
        b[5] = b'Z';
        let tracked = c.lookup_insert_tracked(&b, &mut ch);
        assert_eq!(ch.stored.len(), 1);
        assert_eq!((ch.stored[0].index, ch.stored[0].parent), (1, Some(b0.key)));
        assert_ne!(ch.stored[0].key, b1.key);
        // Tracking does not change what the cache decides.
        let mut plain = PrefixCache::new(1000, 4, 1);
        plain.lookup_insert(&a);
        plain.lookup_insert(&a);
        assert_eq!(plain.lookup_insert(&b), tracked);
    }

    #[test]
    fn tracked_lookup_reports_evictions() {
        // Room for 3 blocks of 4 tokens.
        let mut c = PrefixCache::new(12, 4, 1);
        let mut ch = CacheChanges::default();
        c.lookup_insert_tracked(&text(8, 0), &mut ch);
        let old: Vec<u64> = ch.stored.iter().map(|b| b.key).collect();
        // Two new blocks: one free slot, then the LRU block (the first of the old prompt) goes.
        c.lookup_insert_tracked(&text(8, 7), &mut ch);
        assert_eq!(ch.removed, vec![old[0]]);
        assert_eq!(ch.stored.iter().map(|b| b.index).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(c.used_tokens(), 12);
        let new: Vec<u64> = ch.stored.iter().map(|b| b.key).collect();
        // The old prompt again: its first block evicts the LRU one, its own second block, which
        // is then stored again (removed, then stored: what a mirror applying them in order needs).
        c.lookup_insert_tracked(&text(8, 0), &mut ch);
        assert_eq!(ch.removed, vec![old[1], new[0]]);
        assert_eq!(ch.stored.iter().map(|b| b.key).collect::<Vec<_>>(), old);
        assert_eq!(ch.stored[1].parent, Some(old[0]));
    }

    #[test]
    fn a_prompt_longer_than_the_cache_nets_its_own_evictions() {
        // Room for 2 blocks; a 5-block prompt keeps only its last 2.
        let mut c = PrefixCache::new(8, 4, 1);
        let mut ch = CacheChanges::default();
        c.lookup_insert_tracked(&text(4, 3), &mut ch);
        let before = ch.stored[0].key;
        c.lookup_insert_tracked(&text(20, 0), &mut ch);
        assert_eq!(ch.removed, vec![before], "only the block held before the lookup is removed");
        assert_eq!(ch.stored.iter().map(|b| b.index).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(c.used_tokens(), 8);
        // What is reported stored is exactly what is held.
        for b in &ch.stored {
            assert!(c.map.contains_key(&b.key));
        }
        assert!(!c.map.contains_key(&before));
    }
}
