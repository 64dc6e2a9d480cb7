//! Admission per role of a prefill/decode pair: one shard's share of the per-worker pools.
//!
//! - A decode worker that reports a running window (`max_running_requests`) takes at most
//!   that many of this gateway's pairs at once. A pair that finds its decode's window full
//!   waits `--pd-admission-wait-secs` for a slot, then is shed (503).
//! - With `--prefill-max-inflight-requests-per-worker M`, a prefill worker takes at most M
//!   prefill legs at once. A pair that finds its prefill full waits in the prefill queue
//!   (`--prefill-queue-size` places gateway-wide, `--prefill-queue-timeout-secs`), or is
//!   refused (429) when no place is left.
//!
//! Each limit is exact gateway-wide: every pool is a [`Permits`] (permits.rs), split between
//! the shards and moved between them by message, as the admission permits are. Pools are
//! made on first use, on every shard alike (a shard's share follows from the pool's size and
//! the shard's index alone), so a message for a pool a shard has not used yet makes its
//! share there first. A pool outlives its worker (a few hundred bytes per worker ever
//! registered): worker ids are never reused, so a stale pool is never asked again.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use super::permits::Permits;
use super::permits::{AdmissionConfig, Pool, PoolMsg};

/// The PD admission flags, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PdAdmission {
    /// `--pd-admission-wait-secs` (0: shed at once).
    pub decode_wait: Duration,
    /// `--prefill-max-inflight-requests-per-worker` (0: no limit).
    pub prefill_inflight: u32,
    /// `--prefill-queue-size` (0: none wait).
    pub prefill_queue: usize,
    pub prefill_queue_timeout: Duration,
}

impl Default for PdAdmission {
    fn default() -> Self {
        PdAdmission {
            decode_wait: Duration::from_secs(30),
            prefill_inflight: 0,
            prefill_queue: 100,
            prefill_queue_timeout: Duration::from_secs(60),
        }
    }
}

/// A queue with no bound of its own: another pool bounds it (the prefill queue's places) or
/// nothing needs to (a decode wait is bounded by its time). Shards' shares of it never
/// overflow when a place comes back.
const UNBOUNDED: usize = usize::MAX / 4;

/// One shard's part of every PD pool.
pub struct PdPools {
    cfg: PdAdmission,
    me: usize,
    shards: usize,
    peers: Vec<(usize, flume::Sender<PoolMsg>)>,
    pools: RefCell<HashMap<Pool, Rc<RefCell<Permits>>>>,
}

// === impl PdPools ===

impl PdPools {
    pub fn new(cfg: PdAdmission, me: usize, shards: usize, peers: Vec<(usize, flume::Sender<PoolMsg>)>) -> Self {
        PdPools { cfg, me, shards, peers, pools: RefCell::new(HashMap::new()) }
    }

    pub fn config(&self) -> &PdAdmission {
        &self.cfg
    }

    /// This shard's part of `pool`, made on first use.
    pub fn pool(&self, pool: Pool) -> Rc<RefCell<Permits>> {
        let mut pools = self.pools.borrow_mut();
        let made = pools.entry(pool).or_insert_with(|| {
            let c = self.sizes(pool);
            Rc::new(RefCell::new(Permits::new(pool, &c, self.me, self.shards, self.peers.clone())))
        });
        Rc::clone(made)
    }

    /// A peer's message for one of the pools.
    pub fn on_message(&self, m: PoolMsg) {
        self.pool(m.pool).borrow_mut().on_message(m.msg);
    }

    /// A pool's permits and queue places, gateway-wide.
    fn sizes(&self, pool: Pool) -> AdmissionConfig {
        let queue_timeout = self.cfg.prefill_queue_timeout;
        let (permits, queue_size) = match pool {
            // Places are taken, never waited for: a request that finds none is refused.
            Pool::PrefillQueue => (self.cfg.prefill_queue, 0),
            Pool::Prefill(_) => {
                (self.cfg.prefill_inflight as usize, if self.cfg.prefill_queue > 0 { UNBOUNDED } else { 0 })
            }
            Pool::Decode { cap, .. } => (cap as usize, if self.cfg.decode_wait.is_zero() { 0 } else { UNBOUNDED }),
            Pool::Admission => unreachable!("the admission permits are the shard's own"),
        };
        AdmissionConfig { permits, queue_size, queue_timeout }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::permits::Admit;
    use crate::worker_id::WorkerId;
    use std::future::Future;

    fn shards(n: usize, cfg: PdAdmission) -> (Vec<PdPools>, Vec<flume::Receiver<PoolMsg>>) {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| flume::unbounded::<PoolMsg>()).unzip();
        let pools = (0..n)
            .map(|me| {
                let peers = (0..n).filter(|&i| i != me).map(|i| (i, txs[i].clone())).collect();
                PdPools::new(cfg, me, n, peers)
            })
            .collect();
        (pools, rxs)
    }

    fn pump(pools: &[PdPools], rxs: &[flume::Receiver<PoolMsg>]) {
        loop {
            let mut moved = false;
            for (p, rx) in pools.iter().zip(rxs) {
                while let Ok(m) = rx.try_recv() {
                    p.on_message(m);
                    moved = true;
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// A worker's pool is exact across shards, though only one shard ever admits: the
    /// other's share is made by the first message that asks for it.
    #[test]
    fn a_pool_is_exact_across_shards_and_made_where_it_is_asked_for() {
        let cfg = PdAdmission { prefill_inflight: 3, prefill_queue: 0, ..PdAdmission::default() };
        let (pools, rxs) = shards(2, cfg);
        let pool = Pool::Prefill(WorkerId(7));
        let mut held = 0;
        let mut refused = 0;
        for _ in 0..5 {
            match Permits::admit(&pools[0].pool(pool)) {
                Admit::Now => held += 1,
                Admit::Queued(t) => {
                    pump(&pools, &rxs);
                    let granted = futures_lite_poll(&t);
                    if granted == Some(true) {
                        t.into_held();
                        held += 1;
                    } else {
                        assert_eq!(granted, Some(false), "no queue: refused once every peer said no");
                        refused += 1;
                    }
                }
                Admit::Full => refused += 1,
            }
        }
        assert_eq!((held, refused), (3, 2), "three in flight gateway-wide, whichever shard holds them");
        // Another worker's pool is its own.
        assert!(matches!(Permits::admit(&pools[1].pool(Pool::Prefill(WorkerId(8)))), Admit::Now));
    }

    /// Polls a ticket's wait once (messages are pumped by hand, so it is ready or never).
    fn futures_lite_poll(t: &crate::admission::permits::Ticket) -> Option<bool> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = std::pin::pin!(Permits::wait(t));
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(b) => Some(b),
            std::task::Poll::Pending => None,
        }
    }

    /// The queue's one place, taken on one shard, is gone for the other.
    #[test]
    fn a_queue_place_is_exact_across_shards() {
        let cfg = PdAdmission { prefill_inflight: 1, prefill_queue: 1, ..PdAdmission::default() };
        for first in 0..2 {
            let (pools, rxs) = shards(2, cfg);
            let take = |at: usize| match Permits::admit(&pools[at].pool(Pool::PrefillQueue)) {
                Admit::Now => Some(true),
                Admit::Full => Some(false),
                Admit::Queued(t) => {
                    pump(&pools, &rxs);
                    let got = futures_lite_poll(&t);
                    if got == Some(true) {
                        t.into_held();
                    }
                    got
                }
            };
            assert_eq!(take(first), Some(true), "the place, from shard {first}");
            assert_eq!(take(1 - first), Some(false), "none left for shard {}", 1 - first);
            assert_eq!(take(first), Some(false), "none left for shard {first}");
        }
    }

    #[test]
    fn sizes_follow_the_flags() {
        let cfg = PdAdmission { prefill_inflight: 2, prefill_queue: 5, ..PdAdmission::default() };
        let (pools, _rxs) = shards(1, cfg);
        let p = pools[0].sizes(Pool::Prefill(WorkerId(0)));
        assert_eq!((p.permits, p.queue_size), (2, UNBOUNDED));
        let q = pools[0].sizes(Pool::PrefillQueue);
        assert_eq!((q.permits, q.queue_size), (5, 0));
        let d = pools[0].sizes(Pool::Decode { worker: WorkerId(1), cap: 9 });
        assert_eq!((d.permits, d.queue_size), (9, UNBOUNDED));
        let (now, _rxs) = shards(1, PdAdmission { decode_wait: Duration::ZERO, ..cfg });
        assert_eq!(now[0].sizes(Pool::Decode { worker: WorkerId(1), cap: 9 }).queue_size, 0);
    }
}
