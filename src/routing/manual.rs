//! Routing-key pins: the `manual` policy's key → worker map, and the same map under
//! `--routing-key-override` (sticky sessions) on every other policy.
//!
//! Each key remembers up to two workers, a primary and a failover candidate; a request goes to
//! the first one that is a candidate now. Unused keys are evicted after `--max-idle-secs`.
//!
//! Shards: each shard keeps its own map. A new key is placed by `--assignment-mode`; `random`
//! places by the key's hash on the shared ring, so every shard puts a key on the same worker
//! without talking (and a worker set change moves only the keys the ring moves). `min_load` and
//! `min_group` read shard-local figures and break ties by the key's hash, so shards agree
//! while loads agree; `delegate` inherits the delegated policy's coherence (see
//! `cache_aware`'s digests).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::config::AssignmentMode;
use super::hashing::{hash_str, mix};
use super::simple::least_loaded_by_key;
use super::types::Candidate;
use super::workers::View;

const NO_SLOT: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Pin {
    /// Primary, then failover (`NO_SLOT` when empty).
    workers: [u32; 2],
    last_used: Instant,
}

/// One key → worker map.
#[derive(Debug, Default)]
pub(crate) struct StickyMap {
    map: HashMap<Box<str>, Pin>,
    /// Keys whose primary is each slot (`min_group`).
    groups: Vec<u32>,
    /// Reused buffer for "scope \0 key" lookups, so a lookup does not allocate.
    scratch: String,
}

// === impl StickyMap ===

impl StickyMap {
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    fn scoped(&mut self, scope: &str, key: &str) {
        self.scratch.clear();
        self.scratch.push_str(scope);
        self.scratch.push('\0');
        self.scratch.push_str(key);
    }

    fn group_add(&mut self, slot: u32, delta: i32) {
        if slot == NO_SLOT {
            return;
        }
        let s = slot as usize;
        if self.groups.len() <= s {
            self.groups.resize(s + 1, 0);
        }
        self.groups[s] = self.groups[s].saturating_add_signed(delta);
    }

    /// Keys pinned (as primary) to `slot`.
    pub(crate) fn group(&self, slot: u32) -> u32 {
        self.groups.get(slot as usize).copied().unwrap_or(0)
    }

    /// The first remembered worker of `key` that is a candidate now; refreshes the pin.
    pub(crate) fn lookup(&mut self, scope: &str, key: &str, view: &View, now: Instant) -> Option<usize> {
        self.scoped(scope, key);
        let pin = self.map.get_mut(self.scratch.as_str())?;
        pin.last_used = now;
        pin.workers.iter().filter(|&&s| s != NO_SLOT).find_map(|&s| view.idx(s))
    }

    /// Records that `key` went to `slot`. `promote`: the new worker becomes the primary and the
    /// old primary the failover (delegate mode: the policy's fresh choice leads). Otherwise the
    /// new worker queues behind the existing primary, so the key returns to it once it is back.
    pub(crate) fn record(&mut self, scope: &str, key: &str, slot: u32, now: Instant, promote: bool) {
        self.scoped(scope, key);
        let old = self.map.get(self.scratch.as_str()).map(|p| p.workers);
        let workers = match old {
            None => [slot, NO_SLOT],
            Some(w) if w[0] == slot || w[1] == slot && !promote => w,
            Some(w) if promote => [slot, w[0]],
            Some(w) if w[1] == NO_SLOT => [w[0], slot],
            // Two remembered, both gone: drop the older failover, keep the primary first.
            Some(w) => [w[0], slot],
        };
        if let Some(w) = old {
            self.group_add(w[0], -1);
        }
        self.group_add(workers[0], 1);
        let pin = Pin { workers, last_used: now };
        match self.map.get_mut(self.scratch.as_str()) {
            Some(p) => *p = pin,
            None => {
                self.map.insert(self.scratch.as_str().into(), pin);
            }
        }
    }

    /// Evicts pins unused for `max_idle` (0 = never).
    pub(crate) fn evict_idle(&mut self, now: Instant, max_idle_secs: u64) {
        if max_idle_secs == 0 {
            return;
        }
        let max_idle = Duration::from_secs(max_idle_secs);
        let mut freed = Vec::new();
        self.map.retain(|_, p| {
            let keep = now.saturating_duration_since(p.last_used) < max_idle;
            if !keep {
                freed.push(p.workers[0]);
            }
            keep
        });
        for s in freed {
            self.group_add(s, -1);
        }
    }

    /// Forgets a removed worker: pins keep their other worker, pins with none left go.
    pub(crate) fn remove_slot(&mut self, slot: u32) {
        self.map.retain(|_, p| {
            p.workers = match p.workers {
                [a, b] if a == slot => [b, NO_SLOT],
                [a, b] if b == slot => [a, NO_SLOT],
                w => w,
            };
            p.workers[0] != NO_SLOT
        });
        // Recount rather than patch: removal is rare and this cannot drift.
        self.groups.clear();
        let primaries: Vec<u32> = self.map.values().map(|p| p.workers[0]).collect();
        for s in primaries {
            self.group_add(s, 1);
        }
    }
}

/// The key's placement hash (shared by every shard).
pub(crate) fn key_hash(key: &str) -> u64 {
    mix(hash_str(key), 0x6d)
}

/// Places a key by an assignment mode (`Delegate` is the caller's; here it means `MinLoad`).
pub(crate) fn assign(
    mode: AssignmentMode,
    key: u64,
    view: &mut View,
    cands: &[Candidate<'_>],
    map: &StickyMap,
) -> usize {
    match mode {
        AssignmentMode::Random => view.ring().lookup(key).unwrap_or(0),
        AssignmentMode::MinLoad | AssignmentMode::Delegate => {
            least_loaded_by_key(cands, &view.url_hash, || key, 0..cands.len()).unwrap_or(0)
        }
        AssignmentMode::MinGroup => {
            let min = (0..cands.len()).map(|i| map.group(view.slot_of[i])).min().unwrap_or(0);
            let tied = (0..cands.len()).filter(|&i| map.group(view.slot_of[i]) == min);
            // Equal group counts: rendezvous by key (loads are not the criterion here).
            tied.max_by_key(|&i| mix(key, view.url_hash[i])).unwrap_or(0)
        }
    }
}
