//! A prefill worker's rooms: those whose prefill finished here (bounded in count and age, the
//! logic taking `now` as an input), and the long-polls waiting for others.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::sync::Event;

/// Finished rooms remembered, at most: a decode that asks later than this many prefills ago
/// gets a 404, as it would from an engine that has freed the KV.
pub(crate) const MAX_ROOMS: usize = 65_536;
/// ... and for at most this long.
pub(crate) const ROOM_TTL: Duration = Duration::from_secs(60);
/// The rooms whose prefill finished, bounded in count and age; the logic takes `now` as input.
pub(crate) struct FinishedRooms {
    cap: usize,
    ttl: Duration,
    /// Finishes in time order as (room, sequence number, when); a room finished twice has two
    /// entries.
    order: VecDeque<(u64, u64, Instant)>,
    /// Each remembered room's latest finish, by sequence number (instants may be equal).
    latest: HashMap<u64, u64>,
    next_seq: u64,
}

// === impl FinishedRooms ===

impl FinishedRooms {
    pub(crate) fn new(cap: usize, ttl: Duration) -> Self {
        Self { cap: cap.max(1), ttl, order: VecDeque::new(), latest: HashMap::new(), next_seq: 0 }
    }

    pub(crate) fn finish(&mut self, room: u64, now: Instant) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.push_back((room, seq, now));
        self.latest.insert(room, seq);
        self.prune(now);
    }

    pub(crate) fn contains(&mut self, room: u64, now: Instant) -> bool {
        self.prune(now);
        self.latest.contains_key(&room)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.latest.len()
    }

    /// Forgets the oldest finishes while there are too many or they are too old.
    fn prune(&mut self, now: Instant) {
        while let Some(&(room, seq, at)) = self.order.front() {
            if self.order.len() <= self.cap && now.saturating_duration_since(at) < self.ttl {
                return;
            }
            self.order.pop_front();
            // A room finished again later keeps its newer entry.
            if self.latest.get(&room) == Some(&seq) {
                self.latest.remove(&room);
            }
        }
    }
}

/// A prefill worker's rooms: what finished, and who waits for what.
pub(crate) struct Rooms {
    finished: RefCell<FinishedRooms>,
    /// Long-polls waiting for a room, one event per room, fired when it finishes.
    waiters: RefCell<HashMap<u64, Rc<Event>>>,
}

impl Default for Rooms {
    fn default() -> Self {
        Self { finished: RefCell::new(FinishedRooms::new(MAX_ROOMS, ROOM_TTL)), waiters: RefCell::default() }
    }
}

// === impl Rooms ===

impl Rooms {
    /// The prefill of `room` is done: its KV can be handed over.
    pub(crate) fn finish(&self, room: u64) {
        self.finished.borrow_mut().finish(room, Instant::now());
        if let Some(ev) = self.waiters.borrow_mut().remove(&room) {
            ev.fire();
        }
    }

    pub(crate) fn is_finished(&self, room: u64) -> bool {
        self.finished.borrow_mut().contains(room, Instant::now())
    }

    /// Long-polls waiting now (reported in /sim/stats, so tests can tell that a decode asked).
    pub(crate) fn pending(&self) -> usize {
        self.waiters.borrow().values().map(|ev| Rc::strong_count(ev) - 1).sum()
    }

    /// Waits at most `within` for `room` to finish; false when it did not or `died` fired.
    pub(crate) async fn wait(&self, room: u64, within: Duration, died: &Event) -> bool {
        if self.is_finished(room) {
            return true;
        }
        let ev = self.waiters.borrow_mut().entry(room).or_default().clone();
        let arrived = monoio::select! {
            _ = ev.wait() => true,
            _ = monoio::time::sleep(within) => false,
            _ = died.wait() => false,
        };
        if !arrived {
            // The last waiter of a room that never came takes its entry away (bounded memory).
            let mut waiters = self.waiters.borrow_mut();
            if waiters.get(&room).is_some_and(|e| Rc::ptr_eq(e, &ev)) && Rc::strong_count(&ev) == 2 {
                waiters.remove(&room);
            }
        }
        arrived
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rooms_are_bounded_by_count() {
        let t0 = Instant::now();
        let mut r = FinishedRooms::new(3, Duration::from_secs(60));
        for room in 1..=4 {
            r.finish(room, t0);
        }
        assert_eq!(r.len(), 3);
        assert!(!r.contains(1, t0), "the oldest went first");
        assert!(r.contains(2, t0) && r.contains(4, t0));
        // Finishing a room again renews it: its old entry no longer removes it.
        r.finish(2, t0);
        r.finish(5, t0);
        r.finish(6, t0);
        assert!(r.contains(2, t0) && !r.contains(3, t0) && !r.contains(4, t0));
        assert!(r.order.len() <= 3 && r.latest.len() <= 3);
    }

    #[test]
    fn rooms_are_bounded_by_age() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(60);
        let mut r = FinishedRooms::new(100, ttl);
        r.finish(1, t0);
        r.finish(2, t0 + Duration::from_secs(30));
        assert!(r.contains(1, t0 + Duration::from_secs(59)));
        assert!(!r.contains(1, t0 + ttl));
        assert!(r.contains(2, t0 + ttl));
        assert!(!r.contains(2, t0 + Duration::from_secs(90)));
        assert_eq!((r.len(), r.order.len()), (0, 0));
    }
}
