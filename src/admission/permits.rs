//! How many at once: one shard's share of the gateway-wide admission permits.
//!
//! `--max-concurrent-requests N` is exact across shards without a lock or a shared atomic on
//! the request path. The N permits are split between the shards at start; a shard admits
//! from its own free permits with plain `Cell` arithmetic. Only a shard with none left talks
//! to its peers, through an unbounded channel of its own (a permit in a message must never be
//! dropped, and at most N are ever in flight):
//!
//! - a request that finds no free permit queues (FIFO) and sends `Want` to every peer;
//! - a peer with a free permit answers `Grant` at once; one without remembers the want (a
//!   debt) and pays it with the next permit it frees that no local request is waiting for;
//! - a freed permit goes first to this shard's oldest waiter, then to the oldest debt, else
//!   back to the free pool.
//!
//! So permits are conserved (at most N requests at the workers, ever) and a request waits
//! only while every shard's permits are held, or for one round trip to a peer that has one.
//! Wants outlive the waiter that sent them (it may have been served by another peer, timed
//! out or left): a grant that finds no waiter becomes a free permit where it lands, so the
//! only cost of a stale want is a permit moving between shards. Order is arrival order
//! within a shard; across shards a freed permit serves its own shard's queue first.
//!
//! `--queue-size 0` still asks the peers, with `Want { queue: false }`: a peer with no free
//! permit answers `Deny` instead of recording a debt, and the request is refused (429) once
//! every peer denied. With `--rate-limit-tokens-per-second R > 0` (SMG's token bucket) each
//! shard also mints R / shards permits a second into its free pool, which holds at most its
//! share of N; a permit freed into a full pool is dropped. R = 0 is a pure concurrency cap.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::task::Waker;
use std::time::{Duration, Instant};

/// Shard → shard permit traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitMsg {
    /// `from` has a request waiting for a permit (`ticket` names it for a `Deny`).
    Want { from: usize, ticket: u64, queue: bool },
    /// One permit, moved to the receiver.
    Grant,
    /// The peer has no free permit for this no-queue request.
    Deny { ticket: u64 },
}

/// Where a queued request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    Queued,
    Granted,
    /// Every peer denied (no-queue mode).
    Refused,
    /// Gone (timed out or the client left); skipped when permits are handed out.
    Left,
}

struct Waiter {
    ticket: u64,
    state: Cell<Wait>,
    /// Peers that have not answered a no-queue want yet.
    pending_denials: Cell<usize>,
    waker: Cell<Option<Waker>>,
}

/// The outcome of asking for a permit.
pub enum Admit {
    /// Admitted now.
    Now,
    /// Queued: await [`Permits::wait`] with the ticket.
    Queued(Ticket),
    /// No room in the queue: 429.
    Full,
}

/// A queued request's place. Dropping it leaves the queue (a permit already granted to it
/// is handed on).
pub struct Ticket {
    waiter: Rc<Waiter>,
    permits: Rc<RefCell<Permits>>,
}

pub struct Permits {
    me: usize,
    free: usize,
    /// Most free permits this shard keeps.
    pool_cap: usize,
    waiters: VecDeque<Rc<Waiter>>,
    queue_cap: usize,
    /// Peers waiting for a permit from us, oldest first.
    debts: VecDeque<usize>,
    peers: Vec<(usize, flume::Sender<PermitMsg>)>,
    next_ticket: u64,
    /// Token-bucket refill: permits per second this shard mints, and the fraction owed.
    refill_per_sec: f64,
    minted: f64,
    last_refill: Instant,
}

// === impl Permits ===

impl Permits {
    /// Shard `me` of `shards`, with its share of the permits and of the queue; the token
    /// bucket (if any) starts filling at `now`.
    pub fn new(
        cfg: &AdmissionConfig,
        me: usize,
        shards: usize,
        peers: Vec<(usize, flume::Sender<PermitMsg>)>,
        now: Instant,
    ) -> Self {
        let share = cfg.permits / shards + usize::from(me < cfg.permits % shards);
        let refilling = cfg.refill_per_sec > 0.0;
        Permits {
            me,
            free: share,
            pool_cap: if refilling { share.max(1) } else { cfg.permits },
            waiters: VecDeque::new(),
            queue_cap: cfg.queue_size.div_ceil(shards),
            debts: VecDeque::new(),
            peers,
            next_ticket: 0,
            refill_per_sec: cfg.refill_per_sec / shards as f64,
            minted: 0.0,
            last_refill: now,
        }
    }

    /// Takes a permit, or a place in the queue, for a request that arrived at `now`.
    pub fn admit(this: &Rc<RefCell<Permits>>, now: Instant) -> Admit {
        let mut p = this.borrow_mut();
        p.refill(now);
        if p.free > 0 && p.live_waiters() == 0 {
            p.free -= 1;
            return Admit::Now;
        }
        let queue = p.queue_cap > 0;
        if queue && p.live_waiters() >= p.queue_cap {
            return Admit::Full;
        }
        if !queue && p.peers.is_empty() {
            return Admit::Full;
        }
        p.next_ticket += 1;
        let ticket = p.next_ticket;
        let waiter = Rc::new(Waiter {
            ticket,
            state: Cell::new(Wait::Queued),
            pending_denials: Cell::new(p.peers.len()),
            waker: Cell::new(None),
        });
        p.waiters.push_back(Rc::clone(&waiter));
        let from = p.me;
        for (_, peer) in &p.peers {
            // Unbounded: never fails while the peer shard lives.
            let _ = peer.send(PermitMsg::Want { from, ticket, queue });
        }
        drop(p);
        Admit::Queued(Ticket { waiter, permits: Rc::clone(this) })
    }

    /// Resolves when the ticket's request is admitted (true) or refused (false).
    pub async fn wait(ticket: &Ticket) -> bool {
        std::future::poll_fn(|cx| match ticket.waiter.state.get() {
            Wait::Granted => std::task::Poll::Ready(true),
            Wait::Refused | Wait::Left => std::task::Poll::Ready(false),
            Wait::Queued => {
                ticket.waiter.waker.set(Some(cx.waker().clone()));
                std::task::Poll::Pending
            }
        })
        .await
    }

    /// A permit is free again (a request finished).
    pub fn release(&mut self) {
        self.place_permit();
    }

    /// Applies a peer's message.
    pub fn on_message(&mut self, msg: PermitMsg) {
        match msg {
            PermitMsg::Want { from, ticket, queue } => {
                if self.free > 0 {
                    self.free -= 1;
                    self.send(from, PermitMsg::Grant);
                } else if queue {
                    self.debts.push_back(from);
                } else {
                    self.send(from, PermitMsg::Deny { ticket });
                }
            }
            PermitMsg::Grant => self.place_permit(),
            PermitMsg::Deny { ticket } => {
                if let Some(w) = self.waiters.iter().find(|w| w.ticket == ticket && w.state.get() == Wait::Queued) {
                    let left = w.pending_denials.get().saturating_sub(1);
                    w.pending_denials.set(left);
                    if left == 0 {
                        w.state.set(Wait::Refused);
                        wake(w);
                    }
                }
                self.prune();
            }
        }
    }

    /// Permits free on this shard now (tests and metrics).
    pub fn free(&self) -> usize {
        self.free
    }

    /// Requests waiting in this shard's queue now (metrics).
    pub fn queued(&self) -> usize {
        self.live_waiters()
    }

    /// Gives one permit to this shard's oldest waiter, else the oldest debt, else the pool.
    fn place_permit(&mut self) {
        while let Some(w) = self.waiters.pop_front() {
            if w.state.get() == Wait::Queued {
                w.state.set(Wait::Granted);
                wake(&w);
                return;
            }
        }
        if let Some(peer) = self.debts.pop_front() {
            self.send(peer, PermitMsg::Grant);
            return;
        }
        if self.free < self.pool_cap {
            self.free += 1;
        }
    }

    fn send(&self, to: usize, msg: PermitMsg) {
        if let Some((_, tx)) = self.peers.iter().find(|(i, _)| *i == to) {
            let _ = tx.send(msg);
        }
    }

    fn live_waiters(&self) -> usize {
        self.waiters.iter().filter(|w| w.state.get() == Wait::Queued).count()
    }

    /// Drops waiters that are no longer queued from the front.
    fn prune(&mut self) {
        while self.waiters.front().is_some_and(|w| w.state.get() != Wait::Queued) {
            self.waiters.pop_front();
        }
    }

    /// Token-bucket refill (R > 0 only): mints whole permits owed between the last call and
    /// `now` (an earlier `now`, a request that arrived before the last tick, mints nothing).
    pub fn refill(&mut self, now: Instant) {
        if self.refill_per_sec <= 0.0 || now <= self.last_refill {
            return;
        }
        self.minted += now.duration_since(self.last_refill).as_secs_f64() * self.refill_per_sec;
        self.last_refill = now;
        while self.minted >= 1.0 {
            self.minted -= 1.0;
            if self.free >= self.pool_cap && self.live_waiters() == 0 && self.debts.is_empty() {
                self.minted = 0.0;
                break;
            }
            self.place_permit();
        }
    }
}

fn wake(w: &Waiter) {
    if let Some(k) = w.waker.take() {
        k.wake();
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut p = self.permits.borrow_mut();
        match self.waiter.state.replace(Wait::Left) {
            // Granted but never used (the request went away at the last moment).
            Wait::Granted => p.release(),
            _ => p.prune(),
        }
    }
}

impl Ticket {
    /// The permit the ticket was granted, now held by the request.
    pub fn into_held(self) {
        self.waiter.state.set(Wait::Left);
        std::mem::forget(self);
    }
}

/// `--max-concurrent-requests` and its queue, validated.
#[derive(Debug, Clone)]
pub struct AdmissionConfig {
    /// Requests at the workers at once, gateway-wide.
    pub permits: usize,
    /// Token-bucket refill, permits per second, gateway-wide (0 = a pure concurrency cap).
    pub refill_per_sec: f64,
    /// Requests that may wait, gateway-wide (0 = refuse at once).
    pub queue_size: usize,
    pub queue_timeout: Duration,
}

/// An admitted request's permit, given back when the request finishes (its response fully
/// relayed, or the client gone): dropped with the request context in `finish`.
pub struct Permit(Rc<RefCell<Permits>>);

impl Permit {
    pub fn new(permits: &Rc<RefCell<Permits>>) -> Self {
        Permit(Rc::clone(permits))
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.borrow_mut().release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// One start per test thread: every time below is an offset from it.
        static T0: Instant = crate::clock::now();
    }

    fn at(ms: u64) -> Instant {
        T0.with(|t| *t) + std::time::Duration::from_millis(ms)
    }

    fn cfg(permits: usize, queue: usize) -> AdmissionConfig {
        AdmissionConfig {
            permits,
            refill_per_sec: 0.0,
            queue_size: queue,
            queue_timeout: std::time::Duration::from_secs(1),
        }
    }

    /// Two shards wired to each other; messages are delivered by `pump`.
    fn pair(permits: usize, queue: usize) -> [(Rc<RefCell<Permits>>, flume::Receiver<PermitMsg>); 2] {
        let (t0, r0) = flume::unbounded();
        let (t1, r1) = flume::unbounded();
        let a = Rc::new(RefCell::new(Permits::new(&cfg(permits, queue), 0, 2, vec![(1, t1)], T0.with(|t| *t))));
        let b = Rc::new(RefCell::new(Permits::new(&cfg(permits, queue), 1, 2, vec![(0, t0)], T0.with(|t| *t))));
        [(a, r0), (b, r1)]
    }

    fn pump(shards: &[(Rc<RefCell<Permits>>, flume::Receiver<PermitMsg>); 2]) {
        loop {
            let mut moved = false;
            for (p, rx) in shards {
                while let Ok(m) = rx.try_recv() {
                    p.borrow_mut().on_message(m);
                    moved = true;
                }
            }
            if !moved {
                return;
            }
        }
    }

    fn granted(t: &Ticket) -> bool {
        t.waiter.state.get() == Wait::Granted
    }

    #[test]
    fn permits_move_to_the_shard_that_waits() {
        let s = pair(2, 10);
        // One permit each; shard 0 takes its own, then queues and gets shard 1's.
        assert!(matches!(Permits::admit(&s[0].0, at(0)), Admit::Now));
        let Admit::Queued(t) = Permits::admit(&s[0].0, at(0)) else { panic!() };
        pump(&s);
        assert!(granted(&t));
        t.into_held();
        // Gateway-wide at 2: a third request on either shard waits.
        let Admit::Queued(t3) = Permits::admit(&s[1].0, at(0)) else { panic!() };
        pump(&s);
        assert!(!granted(&t3));
        // Shard 0 frees one: it pays shard 1's debt.
        s[0].0.borrow_mut().release();
        pump(&s);
        assert!(granted(&t3));
        t3.into_held();
        let total = |s: &[(Rc<RefCell<Permits>>, _); 2]| s[0].0.borrow().free() + s[1].0.borrow().free();
        assert_eq!(total(&s), 0);
        s[0].0.borrow_mut().release();
        s[1].0.borrow_mut().release();
        pump(&s);
        assert_eq!(total(&s), 2, "permits are conserved");
    }

    #[test]
    fn a_waiter_that_left_passes_its_grant_on() {
        let s = pair(1, 10);
        // Shard 1 has no permit of its own (1 permit, 2 shards).
        let Admit::Queued(t) = Permits::admit(&s[1].0, at(0)) else { panic!() };
        drop(t);
        pump(&s);
        // The grant landed where no one waits: it is a free permit there now.
        assert_eq!(s[0].0.borrow().free() + s[1].0.borrow().free(), 1);
        assert!(matches!(Permits::admit(&s[1].0, at(0)), Admit::Now));
    }

    #[test]
    fn no_queue_asks_peers_then_refuses() {
        let s = pair(1, 0);
        let Admit::Queued(t) = Permits::admit(&s[1].0, at(0)) else { panic!() };
        pump(&s);
        assert!(granted(&t), "shard 0's free permit is used, not refused");
        t.into_held();
        let Admit::Queued(t2) = Permits::admit(&s[0].0, at(0)) else { panic!() };
        pump(&s);
        assert_eq!(t2.waiter.state.get(), Wait::Refused);
    }

    #[test]
    fn queue_is_fifo_and_bounded() {
        let s = pair(2, 4);
        assert!(matches!(Permits::admit(&s[0].0, at(0)), Admit::Now));
        assert!(matches!(Permits::admit(&s[1].0, at(0)), Admit::Now));
        pump(&s);
        let a = match Permits::admit(&s[0].0, at(0)) {
            Admit::Queued(t) => t,
            _ => panic!(),
        };
        let b = match Permits::admit(&s[0].0, at(0)) {
            Admit::Queued(t) => t,
            _ => panic!(),
        };
        assert!(matches!(Permits::admit(&s[0].0, at(0)), Admit::Full), "share of a queue of 4 over 2 shards");
        pump(&s);
        s[0].0.borrow_mut().release();
        pump(&s);
        assert!(granted(&a) && !granted(&b));
    }

    #[test]
    fn the_token_bucket_mints_by_elapsed_time_up_to_the_shards_share() {
        // 2 permits, 4 a second, one shard: the pool holds at most 2.
        let c = AdmissionConfig { refill_per_sec: 4.0, ..cfg(2, 4) };
        let p = Rc::new(RefCell::new(Permits::new(&c, 0, 1, Vec::new(), at(0))));
        assert!(matches!(Permits::admit(&p, at(0)), Admit::Now));
        assert!(matches!(Permits::admit(&p, at(0)), Admit::Now));
        let Admit::Queued(t) = Permits::admit(&p, at(100)) else { panic!("0.4 permits minted by 100 ms") };
        assert!(!granted(&t));
        p.borrow_mut().refill(at(250));
        assert!(granted(&t), "the permit minted at 250 ms goes to the waiter");
        t.into_held();
        p.borrow_mut().refill(at(10_000));
        assert_eq!(p.borrow().free(), 2, "ten seconds mint 39, the pool holds 2");
        p.borrow_mut().refill(at(5_000));
        assert_eq!(p.borrow().free(), 2, "an earlier time mints nothing");
        p.borrow_mut().release();
        assert_eq!(p.borrow().free(), 2, "a permit freed into a full pool is dropped");
    }
}
