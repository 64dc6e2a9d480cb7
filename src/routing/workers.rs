//! Worker identities inside one shard: URLs interned to small slots, and a cached per-model view
//! of the candidate list (slot ↔ index, URL hashes, the hash ring).
//!
//! The view is rebuilt only when the candidate list changes; with a caller-supplied epoch
//! (`ShardRouter::pick_versioned`) checking that is O(1), otherwise it costs one hash of the
//! URLs per request.

// aHash, not SipHash: these maps are looked up by the request's model on every request (SipHash
// was 1.4% of a chat-1k request's instructions, `bench/callgrind-per-request`); its keys are
// still randomized per process.
use ahash::AHashMap as HashMap;
use std::sync::Arc;

use super::hashing::{hash_str, mix, HashRing};
use super::types::Candidate;

/// "No candidate index" in `View::idx_of`.
pub(crate) const NO_IDX: u32 = u32::MAX;

/// URL ↔ slot. Slots are what trees and sticky maps store: 4 bytes instead of a string, and
/// stable while the worker exists (a removed worker's slot is reused only after every mark of
/// it was purged).
#[derive(Debug, Default)]
pub(crate) struct Slots {
    by_url: HashMap<Arc<str>, u32>,
    urls: Vec<Option<Arc<str>>>,
    free: Vec<u32>,
}

// === impl Slots ===

impl Slots {
    pub(crate) fn intern(&mut self, url: &str) -> u32 {
        if let Some(&s) = self.by_url.get(url) {
            return s;
        }
        let url: Arc<str> = Arc::from(url);
        let slot = match self.free.pop() {
            Some(s) => {
                self.urls[s as usize] = Some(url.clone());
                s
            }
            None => {
                self.urls.push(Some(url.clone()));
                (self.urls.len() - 1) as u32
            }
        };
        self.by_url.insert(url, slot);
        slot
    }

    pub(crate) fn get(&self, url: &str) -> Option<u32> {
        self.by_url.get(url).copied()
    }

    pub(crate) fn url(&self, slot: u32) -> Option<&Arc<str>> {
        self.urls.get(slot as usize).and_then(Option::as_ref)
    }

    /// Forgets a URL; the caller has purged every reference to its slot.
    pub(crate) fn release(&mut self, url: &str) -> Option<u32> {
        let slot = self.by_url.remove(url)?;
        self.urls[slot as usize] = None;
        self.free.push(slot);
        Some(slot)
    }

    pub(crate) fn capacity(&self) -> usize {
        self.urls.len()
    }
}

/// One model's candidate list as this shard last saw it.
#[derive(Debug, Default)]
pub(crate) struct View {
    fingerprint: u64,
    epoch: Option<u64>,
    /// Candidate index → slot.
    pub(crate) slot_of: Vec<u32>,
    /// Slot → candidate index (`NO_IDX` when the worker is not a candidate now).
    idx_of: Vec<u32>,
    /// Candidate index → stable URL hash (ring points, deterministic tie-breaks).
    pub(crate) url_hash: Vec<u64>,
    ring: Option<HashRing>,
}

// === impl View ===

impl View {
    /// The candidate index of a slot, if that worker is a candidate now.
    pub(crate) fn idx(&self, slot: u32) -> Option<usize> {
        match self.idx_of.get(slot as usize) {
            Some(&i) if i != NO_IDX => Some(i as usize),
            _ => None,
        }
    }

    /// The hash ring over the candidates, built on first use after a change.
    pub(crate) fn ring(&mut self) -> &HashRing {
        let hashes = &self.url_hash;
        self.ring.get_or_insert_with(|| HashRing::build(hashes))
    }

    fn rebuild(&mut self, cands: &[Candidate<'_>], slots: &mut Slots) {
        self.slot_of.clear();
        self.url_hash.clear();
        for c in cands {
            self.slot_of.push(slots.intern(c.url));
            self.url_hash.push(hash_str(c.url));
        }
        self.idx_of.clear();
        self.idx_of.resize(slots.capacity(), NO_IDX);
        for (i, &s) in self.slot_of.iter().enumerate() {
            // A URL listed twice keeps its first index.
            if self.idx_of[s as usize] == NO_IDX {
                self.idx_of[s as usize] = i as u32;
            }
        }
        self.ring = None;
    }
}

/// Per-model views of one shard.
#[derive(Debug, Default)]
pub(crate) struct Views {
    by_model: HashMap<Box<str>, usize>,
    views: Vec<View>,
}

/// Change detection only (not placement), so a cheap word-at-a-time fold suffices:
/// about 1 ns per 8 bytes of URL.
fn fingerprint(cands: &[Candidate<'_>]) -> u64 {
    let mut h = cands.len() as u64;
    for c in cands {
        let mut words = c.url.as_bytes().chunks_exact(8);
        for w in &mut words {
            let x = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
            h = (h.rotate_left(5) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
        let mut tail = [0u8; 8];
        tail[..words.remainder().len()].copy_from_slice(words.remainder());
        // The length separates URLs, so ["ab", "c"] and ["a", "bc"] differ.
        let x = u64::from_le_bytes(tail) ^ ((c.url.len() as u64) << 56);
        h = (h.rotate_left(5) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    mix(h, 0)
}

// === impl Views ===

impl Views {
    /// The view of `model` for this candidate list, rebuilt if the list changed. With an epoch,
    /// an unchanged epoch is trusted without looking at the list.
    pub(crate) fn get(
        &mut self,
        model: &str,
        cands: &[Candidate<'_>],
        epoch: Option<u64>,
        slots: &mut Slots,
    ) -> &mut View {
        let i = match self.by_model.get(model) {
            Some(&i) => i,
            None => {
                self.views.push(View::default());
                self.by_model.insert(model.into(), self.views.len() - 1);
                self.views.len() - 1
            }
        };
        let view = &mut self.views[i];
        let fresh = match epoch {
            Some(e) => view.epoch == Some(e) && view.slot_of.len() == cands.len(),
            None => {
                let fp = fingerprint(cands);
                let same = view.epoch.is_none() && view.fingerprint == fp && view.slot_of.len() == cands.len();
                view.fingerprint = fp;
                same
            }
        };
        if !fresh {
            view.rebuild(cands, slots);
            view.epoch = epoch;
        }
        view
    }

    /// Drops every view (a worker was removed and its slot may be reused).
    pub(crate) fn clear(&mut self) {
        self.by_model.clear();
        self.views.clear();
    }
}
