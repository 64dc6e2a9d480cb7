//! Stable hashing and the consistent-hash ring shared by `consistent_hashing`, `prefix_hash`
//! and `manual`'s key placement.
//!
//! Every hash here is a fixed function of its input (no per-process seed), so every shard, and
//! every replica that sees the same workers, builds the same ring and sends a key to the same
//! worker without exchanging anything.

use std::hash::{BuildHasherDefault, Hasher};

const P0: u64 = 0xa076_1d64_78bd_642f;
const P1: u64 = 0xe703_7ed1_a0b4_28db;
const P2: u64 = 0x8ebc_6af0_9c88_c6e3;

/// Virtual nodes per worker on the ring (SMG's figure).
pub const VIRTUAL_NODES: usize = 150;

#[inline]
pub(crate) fn mum(a: u64, b: u64) -> u64 {
    let r = u128::from(a).wrapping_mul(u128::from(b));
    (r as u64) ^ ((r >> 64) as u64)
}

/// splitmix64's finalizer: every input bit flips about half the output bits.
#[inline]
pub(crate) fn avalanche(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Combines two hashes (order matters). Fully mixed, because ring points are `mix(url, 0..150)`
/// and rendezvous scores `mix(key, url)`: a weak mix of consecutive inputs skews both.
#[inline]
pub(crate) fn mix(a: u64, b: u64) -> u64 {
    avalanche(a ^ avalanche(b.wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

#[inline]
fn read_u64(b: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    buf[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(buf)
}

/// A stable 64-bit hash of bytes (wyhash-style: one 128-bit multiply per 16 bytes).
pub fn hash_bytes(seed: u64, bytes: &[u8]) -> u64 {
    let len = bytes.len() as u64;
    let mut h = mum(seed ^ P0, len ^ P1);
    let mut chunks = bytes.chunks_exact(16);
    for c in &mut chunks {
        h = mum(read_u64(&c[..8]) ^ h, read_u64(&c[8..]) ^ P1);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let (a, b) = rest.split_at(rest.len().min(8));
        h = mum(read_u64(a) ^ h, read_u64(b) ^ P2);
    }
    avalanche(mum(h ^ P0, len ^ P2))
}

/// A stable 64-bit hash of token ids; equal to no byte hash by construction of the seed.
pub fn hash_tokens(seed: u64, tokens: &[u32]) -> u64 {
    let len = tokens.len() as u64;
    let mut h = mum(seed ^ P2, len ^ P1);
    let mut chunks = tokens.chunks_exact(4);
    for c in &mut chunks {
        let a = u64::from(c[0]) | (u64::from(c[1]) << 32);
        let b = u64::from(c[2]) | (u64::from(c[3]) << 32);
        h = mum(a ^ h, b ^ P1);
    }
    let mut tail = [0u32; 4];
    let rest = chunks.remainder();
    if !rest.is_empty() {
        tail[..rest.len()].copy_from_slice(rest);
        let a = u64::from(tail[0]) | (u64::from(tail[1]) << 32);
        let b = u64::from(tail[2]) | (u64::from(tail[3]) << 32);
        h = mum(a ^ h, b ^ P2);
    }
    avalanche(mum(h ^ P0, len ^ P2))
}

/// A stable hash of a string.
pub fn hash_str(s: &str) -> u64 {
    hash_bytes(0, s.as_bytes())
}

/// Fast hasher for the small integer keys of internal maps (child ids, slots). Not for
/// attacker-chosen strings: those go through `hash_bytes` first.
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        mum(self.0 ^ P0, P1)
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0 = hash_bytes(self.0, bytes);
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(P2);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

pub(crate) type FastBuild = BuildHasherDefault<FastHasher>;
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, FastBuild>;

/// The consistent-hash ring over one candidate list: `VIRTUAL_NODES` points per worker, placed
/// by a hash of the worker's URL and the point's number, so it depends only on the set of URLs.
///
/// A lookup does not binary-search the points: `index` splits the hash space into as many
/// equal buckets as there are points (rounded up to a power of two) and stores, per bucket,
/// the first point at or after its start. Keys and points are uniform hashes, so a lookup
/// reads one index slot and scans about one point: the same cost at 2 and at 1,000 workers,
/// where a binary search over 150,000 points takes 17 dependent cache misses.
#[derive(Debug, Clone, Default)]
pub(crate) struct HashRing {
    /// (point, candidate index), sorted.
    points: Vec<(u64, u32)>,
    workers: usize,
    /// Per bucket (the top `64 - shift` bits of a key), the first point at or after its start.
    index: Vec<u32>,
    shift: u32,
}

// === impl HashRing ===

impl HashRing {
    /// Builds the ring from each candidate's URL hash (index = candidate index).
    pub(crate) fn build(url_hashes: &[u64]) -> Self {
        let mut points = Vec::with_capacity(url_hashes.len() * VIRTUAL_NODES);
        for (idx, &uh) in url_hashes.iter().enumerate() {
            for v in 0..VIRTUAL_NODES as u64 {
                points.push((mix(uh, v), idx as u32));
            }
        }
        // Ties between points (vanishingly rare) resolve by URL hash so order never matters.
        points.sort_unstable_by_key(|&(p, i)| (p, url_hashes[i as usize]));
        let bits = points.len().next_power_of_two().trailing_zeros().max(1);
        let shift = 64 - bits;
        let mut index = Vec::with_capacity(1 << bits);
        let mut next = 0usize;
        for b in 0..(1u64 << bits) {
            let start = b << shift;
            while next < points.len() && points[next].0 < start {
                next += 1;
            }
            index.push(next as u32);
        }
        HashRing { points, workers: url_hashes.len(), index, shift }
    }

    /// The ring position of a key hash: the first point at or after it, wrapping.
    fn position(&self, key: u64) -> usize {
        let Some(&first) = self.index.get((key >> self.shift) as usize) else {
            return 0;
        };
        let mut pos = first as usize;
        while pos < self.points.len() && self.points[pos].0 < key {
            pos += 1;
        }
        if pos == self.points.len() {
            0
        } else {
            pos
        }
    }

    /// The worker that owns `key`.
    pub(crate) fn lookup(&self, key: u64) -> Option<usize> {
        self.points.get(self.position(key)).map(|&(_, i)| i as usize)
    }

    /// Distinct workers clockwise from `key`'s position: the owner first, then the next ones a
    /// bounded-load walk would try. Every shard walks in the same order.
    pub(crate) fn walk(&self, key: u64) -> RingWalk<'_> {
        RingWalk { ring: self, pos: self.position(key), steps: 0, first: None, seen: Vec::new() }
    }
}

/// Iterator of distinct workers clockwise from a position.
pub(crate) struct RingWalk<'a> {
    ring: &'a HashRing,
    pos: usize,
    steps: usize,
    /// The owner, kept out of `seen` so the common one-step walk never allocates.
    first: Option<u32>,
    seen: Vec<u32>,
}

impl Iterator for RingWalk<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let n = self.ring.points.len();
        loop {
            let distinct = usize::from(self.first.is_some()) + self.seen.len();
            if self.steps >= n || distinct >= self.ring.workers {
                return None;
            }
            let (_, idx) = self.ring.points[(self.pos + self.steps) % n];
            self.steps += 1;
            match self.first {
                None => {
                    self.first = Some(idx);
                    return Some(idx as usize);
                }
                Some(f) if f == idx || self.seen.contains(&idx) => {}
                Some(_) => {
                    self.seen.push(idx);
                    return Some(idx as usize);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bucket index must find exactly what a binary search over the points finds.
    #[test]
    fn indexed_position_matches_binary_search() {
        for workers in [0usize, 1, 2, 3, 10, 100, 1000] {
            let urls: Vec<u64> = (0..workers as u64).map(|i| mix(0x5eed, i)).collect();
            let ring = HashRing::build(&urls);
            let mut probes: Vec<u64> = (0..20_000u64).map(|i| mix(i, 0xabc)).collect();
            // Exact points, their neighbours, and the ends of the hash space.
            for &(p, _) in ring.points.iter().step_by(37) {
                probes.extend([p, p.wrapping_sub(1), p.wrapping_add(1)]);
            }
            probes.extend([0, 1, u64::MAX, u64::MAX - 1, 1 << 63]);
            for key in probes {
                let searched = ring.points.partition_point(|&(p, _)| p < key);
                let expect = if searched == ring.points.len() { 0 } else { searched };
                assert_eq!(ring.position(key), expect, "workers {workers} key {key:#x}");
            }
        }
    }
}
