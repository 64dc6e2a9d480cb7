//! Remembered encodings of the text between added tokens, for a caller that tokenizes the
//! same conversations again and again (the router matching HTTP chats to KV-cache events:
//! every turn re-sends the earlier ones). On the byte-level fast path the text between two
//! added tokens (`<|im_start|>`, `<|im_end|>`, …) encodes on its own, exactly as within the
//! whole prompt, so each such segment is looked up by its hash and length and only new ones
//! are encoded. A 64-bit hash collision would give a wrong routing guess, never a wrong
//! request: the ids only choose a worker.
//!
//! Bounded: two generations of at most [`GENERATION_IDS`] ids each; when the young one is
//! full it becomes the old one and the old one is dropped. A hit in the old generation moves
//! up. One per shard (no locks).

use ahash::AHashMap;

/// Ids per generation (4 bytes each: at most 2 × 4 MiB a shard, plus the maps).
pub const GENERATION_IDS: usize = 1 << 20;

/// Segments shorter than this are encoded every time (cheaper than hashing and a lookup).
const MIN_BYTES: usize = 32;

#[derive(Debug, Default)]
pub struct SegmentCache {
    young: AHashMap<(u64, usize), Box<[u32]>>,
    old: AHashMap<(u64, usize), Box<[u32]>>,
    young_ids: usize,
    pub hits: u64,
    pub misses: u64,
}

impl SegmentCache {
    /// Appends `seg`'s ids to `out`: remembered, or made by `encode` (which appends) and
    /// remembered.
    pub fn encode(
        &mut self,
        seg: &str,
        out: &mut Vec<u32>,
        encode: impl FnOnce(&str, &mut Vec<u32>) -> Result<(), String>,
    ) -> Result<(), String> {
        if seg.len() < MIN_BYTES {
            return encode(seg, out);
        }
        let key = (xxhash_rust::xxh3::xxh3_64(seg.as_bytes()), seg.len());
        if let Some(ids) = self.young.get(&key) {
            self.hits += 1;
            out.extend_from_slice(ids);
            return Ok(());
        }
        if let Some(ids) = self.old.remove(&key) {
            self.hits += 1;
            out.extend_from_slice(&ids);
            self.keep(key, ids);
            return Ok(());
        }
        self.misses += 1;
        let from = out.len();
        encode(seg, out)?;
        self.keep(key, out[from..].into());
        Ok(())
    }

    fn keep(&mut self, key: (u64, usize), ids: Box<[u32]>) {
        if ids.len() > GENERATION_IDS {
            return;
        }
        if self.young_ids + ids.len() > GENERATION_IDS {
            self.old = std::mem::take(&mut self.young);
            self.young_ids = 0;
        }
        self.young_ids += ids.len();
        self.young.insert(key, ids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &str, out: &mut Vec<u32>) -> Result<(), String> {
        out.extend(s.bytes().map(u32::from));
        Ok(())
    }

    #[test]
    fn a_segment_seen_before_is_not_encoded_again() {
        let mut c = SegmentCache::default();
        let seg = "a segment long enough to be remembered by the cache";
        let mut out = vec![7];
        c.encode(seg, &mut out, bytes).unwrap();
        let mut again = vec![7];
        c.encode(seg, &mut again, |_, _| Err("encoded twice".into())).unwrap();
        assert_eq!(out, again);
        assert_eq!((c.hits, c.misses), (1, 1));
        // Short ones are always encoded.
        let mut short = Vec::new();
        c.encode("hi", &mut short, bytes).unwrap();
        assert!(c.encode("hi", &mut short, |_, _| Err("encoded".into())).is_err());
    }

    #[test]
    fn generations_bound_it_and_a_hit_in_the_old_one_moves_up() {
        let mut c = SegmentCache::default();
        let big = |i: usize| format!("{i:08}{}", "x".repeat(GENERATION_IDS / 3));
        let first = big(0);
        c.encode(&first, &mut Vec::new(), bytes).unwrap();
        c.encode(&big(1), &mut Vec::new(), bytes).unwrap();
        c.encode(&big(2), &mut Vec::new(), bytes).unwrap(); // young is full: 0 and 1 are old now.
        assert!(c.old.contains_key(&(xxhash_rust::xxh3::xxh3_64(first.as_bytes()), first.len())));
        c.encode(&first, &mut Vec::new(), |_, _| Err("old hit".into())).unwrap();
        c.encode(&big(3), &mut Vec::new(), bytes).unwrap();
        c.encode(&big(4), &mut Vec::new(), bytes).unwrap(); // 2 and 0 old; 1 gone.
        assert!(c.encode(&big(1), &mut Vec::new(), |_, _| Err("gone".into())).is_err());
        assert!(c.young_ids <= GENERATION_IDS);
    }
}
