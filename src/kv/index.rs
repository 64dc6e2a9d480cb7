//! Which workers hold which blocks on the GPU, and how long a prefix of a request's block
//! keys each one holds. A shard keeps one, changed only by [`Change`]s (keys.rs), so routing
//! reads it without a lock; every shard that applies the same changes holds the same index.

use std::sync::Arc;

use ahash::AHashMap;

use super::keys::{BlockKey, Change};
use crate::worker_id::WorkerId;

#[derive(Debug, Default)]
pub struct BlockIndex {
    /// A key's holders: the workers of one model, most often one, kept inline.
    holders: AHashMap<BlockKey, Holders>,
    /// Keys each worker holds (metrics). A clear walks `holders`: clears are rare, and a map
    /// of each worker's keys would double the work of every store and eviction.
    held: AHashMap<WorkerId, usize>,
    /// Workers whose events flow, with their block size in tokens.
    live: AHashMap<WorkerId, u32>,
}

/// The holders of one key: one inline (no allocation for the usual block), or a list.
#[derive(Debug)]
enum Holders {
    One(WorkerId),
    Many(Vec<WorkerId>),
}

impl Holders {
    fn contains(&self, w: WorkerId) -> bool {
        match self {
            Holders::One(x) => *x == w,
            Holders::Many(v) => v.contains(&w),
        }
    }

    /// Adds `w`; false when it held the key already.
    fn add(&mut self, w: WorkerId) -> bool {
        if self.contains(w) {
            return false;
        }
        match self {
            Holders::One(x) => *self = Holders::Many(vec![*x, w]),
            Holders::Many(v) => v.push(w),
        }
        true
    }

    /// Removes `w`: (it held the key, nobody holds it now).
    fn remove(&mut self, w: WorkerId) -> (bool, bool) {
        match self {
            Holders::One(x) => (*x == w, *x == w),
            Holders::Many(v) => {
                let before = v.len();
                v.retain(|x| *x != w);
                (v.len() < before, v.is_empty())
            }
        }
    }
}

/// What the events thread sends every shard: changes in the order they happened.
#[derive(Debug, Default)]
pub struct KvUpdate {
    pub changes: Vec<(WorkerId, Change)>,
    /// `--tokenizer-path`'s tokenizer, once the events thread has loaded it (sent once):
    /// HTTP requests are tokenized with it to match their workers' blocks.
    pub tokenizer: Option<Arc<crate::tokenizer::Tokenizer>>,
}

impl BlockIndex {
    pub fn apply(&mut self, worker: WorkerId, c: Change) {
        match c {
            Change::Add(key) => {
                let added = match self.holders.entry(key) {
                    std::collections::hash_map::Entry::Occupied(mut h) => h.get_mut().add(worker),
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(Holders::One(worker));
                        true
                    }
                };
                if added {
                    *self.held.entry(worker).or_insert(0) += 1;
                }
            }
            Change::Drop(key) => {
                let Some(h) = self.holders.get_mut(&key) else { return };
                let (held, empty) = h.remove(worker);
                if empty {
                    self.holders.remove(&key);
                }
                if held {
                    if let Some(n) = self.held.get_mut(&worker) {
                        *n -= 1;
                    }
                }
            }
            Change::Clear => {
                if self.held.remove(&worker).is_some_and(|n| n > 0) {
                    self.holders.retain(|_, h| !h.remove(worker).1);
                }
            }
            Change::Live(block_size) => {
                self.live.insert(worker, block_size.max(1));
            }
            Change::Stale => {
                self.live.remove(&worker);
            }
        }
    }

    /// The block size of a worker whose events flow; None: route it by the gateway's guess.
    pub fn live(&self, worker: WorkerId) -> Option<u32> {
        self.live.get(&worker).copied()
    }

    /// Any worker's events flow.
    pub fn any_live(&self) -> bool {
        !self.live.is_empty()
    }

    /// For each of `candidates`, the number of `keys` from the first that it holds, in
    /// `out` (same order). One lookup per key, until no candidate holds the next.
    pub fn prefixes(&self, keys: &[BlockKey], candidates: &[WorkerId], out: &mut Vec<usize>) {
        out.clear();
        out.resize(candidates.len(), 0);
        for (depth, key) in keys.iter().enumerate() {
            let Some(holders) = self.holders.get(key) else { break };
            let mut alive = false;
            for (i, w) in candidates.iter().enumerate() {
                // Still matching at this depth and holding this block: one deeper.
                if out[i] == depth && holders.contains(*w) {
                    out[i] = depth + 1;
                    alive = true;
                }
            }
            if !alive {
                break;
            }
        }
    }

    /// (worker, blocks it holds, its events flow) for every worker the events named.
    pub fn per_worker(&self) -> Vec<(WorkerId, usize, bool)> {
        let mut out: Vec<(WorkerId, usize, bool)> =
            self.held.iter().map(|(w, n)| (*w, *n, self.live.contains_key(w))).collect();
        out.extend(self.live.keys().filter(|w| !self.held.contains_key(w)).map(|w| (*w, 0, true)));
        out
    }

    /// Blocks held, by anyone (metrics).
    pub fn len(&self) -> usize {
        self.holders.len()
    }

    pub fn is_empty(&self) -> bool {
        self.holders.is_empty()
    }

    /// Blocks `worker` holds (metrics).
    pub fn held_by(&self, worker: WorkerId) -> usize {
        self.held.get(&worker).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::keys::request_keys;

    #[test]
    fn each_candidate_gets_its_own_prefix() {
        let mut ix = BlockIndex::default();
        let mut keys = Vec::new();
        request_keys(&[1, 2, 3, 4, 5, 6, 7, 8], 2, 0, &mut keys);
        let (a, b, c) = (WorkerId(0), WorkerId(1), WorkerId(2));
        for k in &keys[..3] {
            ix.apply(a, Change::Add(*k));
        }
        ix.apply(b, Change::Add(keys[0]));
        // A hole: b's third block without its second is no prefix.
        ix.apply(b, Change::Add(keys[2]));
        let mut out = Vec::new();
        ix.prefixes(&keys, &[a, b, c], &mut out);
        assert_eq!(out, [3, 1, 0]);
        ix.apply(a, Change::Drop(keys[1]));
        ix.prefixes(&keys, &[a, b, c], &mut out);
        assert_eq!(out, [1, 1, 0]);
        ix.apply(a, Change::Clear);
        ix.prefixes(&keys, &[a, b], &mut out);
        assert_eq!(out, [0, 1]);
        assert_eq!((ix.held_by(a), ix.held_by(b), ix.len()), (0, 2, 2));
        ix.apply(b, Change::Add(keys[0]));
        assert_eq!(ix.held_by(b), 2, "adding twice holds once");
        assert_eq!(ix.live(b), None);
        ix.apply(b, Change::Live(16));
        assert_eq!((ix.live(b), ix.any_live()), (Some(16), true));
        ix.apply(b, Change::Stale);
        assert_eq!((ix.live(b), ix.held_by(b)), (None, 2), "a stale worker keeps its blocks");
    }
}
