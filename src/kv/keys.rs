//! The gateway's own key of a block, and the per-worker map that turns an engine's events
//! into changes of the index.
//!
//! A block's key is a chain hash: the key of the block before it (or its namespace, for a
//! sequence's first block) hashed with the block's token ids. Two blocks have the same key
//! exactly when the same tokens lead up to them in the same namespace, whichever engine
//! stored them and however it hashes, so a request's token ids cut into blocks give the keys
//! to look up ([`request_keys`]) and every gateway replica computes the same ones. The
//! engine's own hash is never recomputed: a worker's [`Blocks`] remembers which key each of
//! its hashes stands for, so a removal (which names hashes only) finds its key.
//!
//! Only GPU copies serve a hit. A block may be stored on several media under one hash, and
//! one key may be stored under several hashes (an engine that salts its hashes); the key
//! enters the index with its first GPU copy and leaves with its last.

use ahash::AHashMap as HashMap;

use super::event::{EngineHash, KvEvent};

/// A block's key (module doc).
pub type BlockKey = u64;

/// The key of a block of `tokens` after the block keyed `before` (a namespace, for the
/// first): xxh3 of the tokens' little-endian bytes, seeded with `before`. One pass over a
/// stack copy for the usual block sizes (the streaming hasher, a call per token, applied
/// events at half the rate).
pub fn chain(before: u64, tokens: &[u32]) -> BlockKey {
    const STACK: usize = 64;
    let mut small = [0u8; STACK * 4];
    let mut large = Vec::new();
    let bytes: &mut [u8] = if tokens.len() <= STACK {
        &mut small[..tokens.len() * 4]
    } else {
        large.resize(tokens.len() * 4, 0);
        &mut large
    };
    for (out, t) in bytes.chunks_exact_mut(4).zip(tokens) {
        out.copy_from_slice(&t.to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_64_with_seed(bytes, before)
}

/// The keys of a request's full blocks of `block_size` in `namespace`, in order (a partial
/// last block has none: engines cache full blocks only).
pub fn request_keys(tokens: &[u32], block_size: usize, namespace: u64, out: &mut Vec<BlockKey>) {
    out.clear();
    if block_size == 0 {
        return;
    }
    let mut before = namespace;
    for block in tokens.chunks_exact(block_size) {
        before = chain(before, block);
        out.push(before);
    }
}

/// A change to one worker's blocks in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The worker holds the block on the GPU now.
    Add(BlockKey),
    /// It no longer does.
    Drop(BlockKey),
    /// It holds nothing.
    Clear,
    /// Its events flow, in blocks of this many tokens: routing trusts its blocks.
    Live(u32),
    /// Its events stopped (the stream ended or lags): routing falls back to the gateway's
    /// own guess for it until it is live again. Its blocks stay, for a resumed stream.
    Stale,
}

/// Where one engine hash stands.
#[derive(Debug, Clone, Copy)]
struct Held {
    key: BlockKey,
    gpu: bool,
    /// On another medium (CPU, disk): not a hit, but its key still chains children.
    elsewhere: bool,
}

/// One worker's (one data-parallel rank's) blocks as its events described them.
#[derive(Debug, Default)]
pub struct Blocks {
    by_hash: HashMap<EngineHash, Held>,
    /// GPU copies of each key (a key can stand for several hashes).
    gpu: HashMap<BlockKey, u32>,
    /// Blocks stored after a parent this map has never seen (a gap): skipped until a replay
    /// or a clear brings the state back.
    pub orphans: u64,
    block_size: Option<u32>,
}

impl Blocks {
    /// The engine's block size, once a store said it.
    pub fn block_size(&self) -> Option<u32> {
        self.block_size
    }

    /// Applies one event; the index changes go to `out`.
    pub fn apply(&mut self, e: &KvEvent, out: &mut Vec<Change>) {
        match e {
            KvEvent::Stored { hashes, parent, tokens, block_size, namespace, gpu } => {
                let size = *block_size as usize;
                let mut before = match parent {
                    None => *namespace,
                    Some(p) => match self.by_hash.get(p) {
                        Some(c) => c.key,
                        None => {
                            self.orphans += hashes.len() as u64;
                            return;
                        }
                    },
                };
                self.block_size = Some(*block_size);
                for (h, block) in hashes.iter().zip(tokens.chunks(size)) {
                    let key = chain(before, block);
                    before = key;
                    let c = self.by_hash.entry(*h).or_insert(Held { key, gpu: false, elsewhere: false });
                    // A hash reused for other tokens (an engine restarted without a clear):
                    // the old key's GPU copy goes first.
                    if c.key != key {
                        if c.gpu {
                            drop_gpu(&mut self.gpu, c.key, out);
                        }
                        *c = Held { key, gpu: false, elsewhere: false };
                    }
                    if *gpu && !c.gpu {
                        c.gpu = true;
                        let n = self.gpu.entry(key).or_insert(0);
                        *n += 1;
                        if *n == 1 {
                            out.push(Change::Add(key));
                        }
                    } else if !*gpu {
                        c.elsewhere = true;
                    }
                }
            }
            KvEvent::Removed { hashes, gpu } => {
                for h in hashes {
                    let Some(c) = self.by_hash.get_mut(h) else { continue };
                    if *gpu {
                        if c.gpu {
                            c.gpu = false;
                            drop_gpu(&mut self.gpu, c.key, out);
                        }
                    } else {
                        c.elsewhere = false;
                    }
                    if !c.gpu && !c.elsewhere {
                        self.by_hash.remove(h);
                    }
                }
            }
            KvEvent::Cleared => {
                self.by_hash.clear();
                self.gpu.clear();
                out.push(Change::Clear);
            }
        }
    }

    /// Blocks (engine hashes) known now.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
}

fn drop_gpu(gpu: &mut HashMap<BlockKey, u32>, key: BlockKey, out: &mut Vec<Change>) {
    if let Some(n) = gpu.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            gpu.remove(&key);
            out.push(Change::Drop(key));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32], gpu: bool) -> KvEvent {
        KvEvent::Stored {
            hashes: hashes.iter().map(|&h| EngineHash(h)).collect(),
            parent: parent.map(EngineHash),
            tokens: tokens.to_vec(),
            block_size: 2,
            namespace: 0,
            gpu,
        }
    }

    fn removed(hashes: &[u64], gpu: bool) -> KvEvent {
        KvEvent::Removed { hashes: hashes.iter().map(|&h| EngineHash(h)).collect(), gpu }
    }

    fn apply(b: &mut Blocks, e: KvEvent) -> Vec<Change> {
        let mut out = Vec::new();
        b.apply(&e, &mut out);
        out
    }

    #[test]
    fn stored_blocks_get_the_keys_a_request_computes() {
        let mut b = Blocks::default();
        let first = apply(&mut b, stored(&[10, 11], None, &[1, 2, 3, 4], true));
        // A continuation, stored later, after its parent.
        let next = apply(&mut b, stored(&[12], Some(11), &[5, 6], true));
        let mut keys = Vec::new();
        request_keys(&[1, 2, 3, 4, 5, 6, 7], 2, 0, &mut keys);
        assert_eq!(keys.len(), 3, "the partial last block has no key");
        assert_eq!(first, [Change::Add(keys[0]), Change::Add(keys[1])]);
        assert_eq!(next, [Change::Add(keys[2])]);
        let mut other = Vec::new();
        request_keys(&[1, 2, 3, 4], 2, 7, &mut other);
        assert!(other.iter().all(|k| !keys.contains(k)), "another namespace, other keys");
    }

    #[test]
    fn only_gpu_copies_count_and_a_cpu_removal_leaves_the_gpu_copy() {
        let mut b = Blocks::default();
        assert!(apply(&mut b, stored(&[10], None, &[1, 2], false)).is_empty(), "CPU only: no hit");
        let k = chain(0, &[1, 2]);
        assert_eq!(apply(&mut b, stored(&[10], None, &[1, 2], true)), [Change::Add(k)]);
        assert!(apply(&mut b, removed(&[10], false)).is_empty(), "the GPU copy stays");
        // A child of a CPU-only block still chains (its key is known).
        assert!(apply(&mut b, stored(&[20], None, &[8, 9], false)).is_empty());
        assert_eq!(
            apply(&mut b, stored(&[21], Some(20), &[3, 3], true)),
            [Change::Add(chain(chain(0, &[8, 9]), &[3, 3]))]
        );
        assert_eq!(apply(&mut b, removed(&[10], true)), [Change::Drop(k)]);
        assert!(apply(&mut b, removed(&[10, 999], true)).is_empty(), "twice, or unknown: nothing");
    }

    #[test]
    fn one_key_under_two_hashes_leaves_with_its_last_copy() {
        let mut b = Blocks::default();
        let k = chain(0, &[1, 2]);
        assert_eq!(apply(&mut b, stored(&[10], None, &[1, 2], true)), [Change::Add(k)]);
        assert!(apply(&mut b, stored(&[11], None, &[1, 2], true)).is_empty());
        assert!(apply(&mut b, removed(&[10], true)).is_empty());
        assert_eq!(apply(&mut b, removed(&[11], true)), [Change::Drop(k)]);
        assert!(b.is_empty());
    }

    #[test]
    fn an_unknown_parent_is_an_orphan_and_a_clear_empties() {
        let mut b = Blocks::default();
        assert!(apply(&mut b, stored(&[12], Some(99), &[5, 6], true)).is_empty());
        assert_eq!(b.orphans, 1);
        apply(&mut b, stored(&[10], None, &[1, 2], true));
        assert_eq!(apply(&mut b, KvEvent::Cleared), [Change::Clear]);
        assert!(b.is_empty());
        // A hash reused for other tokens moves its key.
        apply(&mut b, stored(&[10], None, &[1, 2], true));
        assert_eq!(
            apply(&mut b, stored(&[10], None, &[7, 7], true)),
            [Change::Drop(chain(0, &[1, 2])), Change::Add(chain(0, &[7, 7]))]
        );
    }
}
