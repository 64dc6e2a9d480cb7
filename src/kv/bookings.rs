//! Tentative placements (`--selection-accounting-ttl-ms`, SMG's flag): the blocks of a
//! request just sent to a worker whose events flow count as held by that worker for a short
//! time, until its engine's events say so (then the index holds them anyway) or the booking
//! expires. Without it, a burst of one new prefix is matched against an index that does not
//! show the first request's blocks yet (the engine has not stored, or the events are in
//! flight), and the second request may land elsewhere. Set a little above the engine's event
//! lag. Each shard books what it routed; nothing crosses shards.
//!
//! Time is an input: every call takes `now`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use ahash::AHashMap;

use super::keys::BlockKey;
use crate::worker_id::WorkerId;

/// Most bookings kept per shard; past it the oldest go first, expired or not.
const MAX_BOOKINGS: usize = 1 << 16;

#[derive(Debug)]
pub struct Bookings {
    ttl: Duration,
    /// key → (worker, until); the latest booking of a key wins.
    held: AHashMap<BlockKey, (WorkerId, Instant)>,
    /// Bookings in the order they were made, for expiry.
    order: VecDeque<(Instant, BlockKey)>,
}

impl Bookings {
    /// None when the TTL is zero (off: routing reads the events alone).
    pub fn new(ttl: Duration) -> Option<Self> {
        (!ttl.is_zero()).then(|| Bookings { ttl, held: AHashMap::new(), order: VecDeque::new() })
    }

    /// Books `keys` for `worker` until `now` + TTL.
    pub fn book(&mut self, worker: WorkerId, keys: &[BlockKey], now: Instant) {
        self.expire(now);
        let until = now + self.ttl;
        for &k in keys {
            self.held.insert(k, (worker, until));
            self.order.push_back((until, k));
        }
        while self.order.len() > MAX_BOOKINGS {
            if let Some((t, k)) = self.order.pop_front() {
                self.forget(k, t);
            }
        }
    }

    /// How far `worker`'s prefix of `keys` reaches from `from` (the depth its events give)
    /// with its bookings counted.
    pub fn extend(&self, worker: WorkerId, keys: &[BlockKey], from: usize, now: Instant) -> usize {
        let mut d = from;
        while let Some(k) = keys.get(d) {
            match self.held.get(k) {
                Some(&(w, until)) if w == worker && until > now => d += 1,
                _ => break,
            }
        }
        d
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(until, k)) = self.order.front() {
            if until > now {
                break;
            }
            self.order.pop_front();
            self.forget(k, until);
        }
    }

    /// Drops `k`'s booking if it is the one made with `until` (a later one stands).
    fn forget(&mut self, k: BlockKey, until: Instant) {
        if self.held.get(&k).is_some_and(|&(_, u)| u == until) {
            self.held.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(n: u64) -> Vec<BlockKey> {
        (1..=n).collect()
    }

    #[test]
    fn zero_is_off() {
        assert!(Bookings::new(Duration::ZERO).is_none());
    }

    #[test]
    fn a_booking_extends_its_workers_prefix_until_it_expires() {
        let t0 = crate::clock::now();
        let mut b = Bookings::new(Duration::from_millis(100)).unwrap();
        let k = keys(4);
        b.book(WorkerId(1), &k[..3], t0);
        assert_eq!(b.extend(WorkerId(1), &k, 0, t0), 3);
        assert_eq!(b.extend(WorkerId(1), &k, 1, t0 + Duration::from_millis(99)), 3);
        assert_eq!(b.extend(WorkerId(2), &k, 0, t0), 0, "another worker's booking");
        assert_eq!(b.extend(WorkerId(1), &k, 0, t0 + Duration::from_millis(100)), 0, "expired");
        // A later booking of the same key for another worker wins, and survives the first's expiry.
        b.book(WorkerId(2), &k[..1], t0 + Duration::from_millis(50));
        b.book(WorkerId(3), &k[3..], t0 + Duration::from_millis(120));
        assert_eq!(b.len(), 2, "expired bookings are dropped on the next booking; the later one of key 1 stands");
        assert_eq!(b.extend(WorkerId(3), &k, 3, t0 + Duration::from_millis(121)), 4);
    }

    #[test]
    fn the_book_is_bounded() {
        let t0 = crate::clock::now();
        let mut b = Bookings::new(Duration::from_secs(60)).unwrap();
        let k: Vec<BlockKey> = (0..(MAX_BOOKINGS as u64 + 10)).collect();
        b.book(WorkerId(1), &k, t0);
        assert_eq!(b.len(), MAX_BOOKINGS);
        assert_eq!(b.extend(WorkerId(1), &k, 0, t0), 0, "the oldest went first");
        assert_eq!(b.extend(WorkerId(1), &k, 10, t0), k.len());
    }
}
