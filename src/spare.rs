//! Vectors a shard keeps between requests, so a proxied request does not pay malloc and free
//! for the buffers every request needs: the request head's header lists, the JSON tape and
//! the parser's stack, the message list, the upstream head, the response head's relay list,
//! the model name.
//!
//! Measured: `perf record` on chat-1k put mimalloc's malloc and free at about 10% of the
//! gateway's user time, for about eleven allocations a request; each is a few dozen
//! instructions (callgrind) but slower in cycles than that count says. A vector taken here
//! costs a thread-local read, and giving it back a clear.
//!
//! A kind is a `thread_local!` holding a [`Spare`]: each shard is one thread, so there is no
//! sharing to pay for. A kind keeps up to [`KEEP`] vectors, since a shard has many requests
//! in flight at once and a buffer that lives across an await (a head) is out while the next
//! request wants one; with one kept, chat-1k at eight connections a shard found it out one
//! time in five. Past that a take allocates, as before. A vector that grew past the kind's
//! `max` is freed instead of kept, so a rare huge request does not pin its memory.

use std::cell::Cell;

/// Vectors kept per kind and shard.
pub const KEEP: usize = 32;

pub struct Spare<T> {
    kept: Cell<Vec<Vec<T>>>,
    /// Capacity, in elements, past which a given-back vector is freed.
    max: usize,
}

impl<T> Spare<T> {
    pub const fn new(max: usize) -> Self {
        Spare { kept: Cell::new(Vec::new()), max }
    }

    /// An empty vector with room for at least `n`: one given back, or a new one.
    pub fn take(&self, n: usize) -> Vec<T> {
        let mut kept = self.kept.take();
        let mut v = kept.pop().unwrap_or_default();
        self.kept.set(kept);
        v.reserve(n);
        v
    }

    /// Keeps `v`, emptied, for a later [`Spare::take`]; an unallocated or oversized one, or
    /// one past [`KEEP`], is dropped.
    pub fn give(&self, mut v: Vec<T>) {
        if v.capacity() == 0 || v.capacity() > self.max {
            return;
        }
        let mut kept = self.kept.take();
        if kept.len() < KEEP {
            v.clear();
            kept.push(v);
        }
        self.kept.set(kept);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_back_vector_is_the_next_one_taken_emptied() {
        let spare: Spare<u32> = Spare::new(64);
        let mut v = spare.take(8);
        assert!(v.capacity() >= 8);
        v.extend([1, 2, 3]);
        let at = v.as_ptr();
        spare.give(v);
        let again = spare.take(4);
        assert_eq!((again.as_ptr(), again.len()), (at, 0), "the same buffer, empty");
        // Out now: the next take allocates.
        assert_eq!(spare.take(0).capacity(), 0);
    }

    #[test]
    fn oversized_and_unallocated_vectors_are_not_kept() {
        let spare: Spare<u8> = Spare::new(16);
        spare.give(Vec::with_capacity(17));
        assert_eq!(spare.take(0).capacity(), 0, "past max: freed");
        spare.give(Vec::new());
        assert_eq!(spare.take(0).capacity(), 0, "nothing to keep");
    }

    #[test]
    fn requests_in_flight_each_get_one_back_up_to_keep() {
        let spare: Spare<u8> = Spare::new(64);
        let out: Vec<Vec<u8>> = (0..KEEP + 3).map(|_| spare.take(8)).collect();
        let mut at: Vec<*const u8> = out.iter().map(|v| v.as_ptr()).collect();
        for v in out {
            spare.give(v);
        }
        let back: Vec<Vec<u8>> = (0..KEEP).map(|_| spare.take(8)).collect();
        let mut got: Vec<*const u8> = back.iter().map(|v| v.as_ptr()).collect();
        // The first KEEP given back are kept (taken last first); the rest were freed.
        at.truncate(KEEP);
        at.sort();
        got.sort();
        assert_eq!(got, at);
        assert_eq!(spare.take(0).capacity(), 0, "no more than KEEP kept");
    }

    #[test]
    fn a_take_larger_than_the_kept_one_grows_it() {
        let spare: Spare<u64> = Spare::new(1024);
        spare.give(Vec::with_capacity(2));
        assert!(spare.take(100).capacity() >= 100);
    }
}
