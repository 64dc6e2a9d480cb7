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
//! every peer denied.
//!
//! `--rate-limit-tokens-per-second` mints nothing here: at most N requests are in flight
//! whatever it says, and a request that finds a free permit is admitted. That is what SMG
//! 1.13 does, measured side by side: its token bucket takes a request's token back when the
//! request ends, so with N=1 and 1.2 s requests sent 0.5 s apart it ran one at a time, and
//! with N=2 (a refill of 2 a second) it admitted 20 back-to-back requests in 0.87 s. An
//! earlier version here consumed a token per admission, which throttled such a fleet to N
//! requests a second; one before that minted permits, which broke the cap.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::task::Waker;
use std::time::Duration;

use crate::worker_id::WorkerId;

/// Which pool a permit message is for. Every shard holds its share of each pool, and pools
/// are alike: only their sizes differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pool {
    /// `--max-concurrent-requests` and its queue.
    Admission,
    /// The places in the prefill admission queue (`--prefill-queue-size`), gateway-wide.
    PrefillQueue,
    /// A prefill worker's requests in flight (`--prefill-max-inflight-requests-per-worker`).
    Prefill(WorkerId),
    /// A decode worker's running window: `cap` is its `max_running_requests` (a new figure
    /// makes a new pool; the old one drains).
    Decode { worker: WorkerId, cap: u32 },
}

/// A permit message and the pool it moves in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolMsg {
    pub pool: Pool,
    pub msg: PermitMsg,
}

/// Shard → shard permit traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitMsg {
    /// `from` has a request waiting for a permit (`ticket` names it for a `Deny`).
    Want { from: usize, ticket: u64, queue: bool },
    /// One permit, moved to the receiver.
    Grant,
    /// The peer has no free permit for this no-queue request.
    Deny { ticket: u64 },
    /// `from` has a request that must wait and no queue place of its own left.
    WantPlace { from: usize, ticket: u64 },
    /// One queue place, moved to the receiver for `ticket`.
    GrantPlace { ticket: u64 },
    /// The peer has no free queue place either.
    DenyPlace { ticket: u64 },
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
    /// Peers that have not answered a no-queue want (or, in queue mode, a place want) yet.
    pending_denials: Cell<usize>,
    /// It holds one of the gateway's `--queue-size` places (given back when it stops
    /// waiting). A waiter without one is still asking the peers for a place: it may be
    /// admitted meanwhile, but it is not in the queue.
    placed: Cell<bool>,
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
    pool: Pool,
    me: usize,
    free: usize,
    waiters: VecDeque<Rc<Waiter>>,
    /// `--queue-size` is not 0: requests may wait.
    queue_mode: bool,
    /// Free queue places on this shard: its share of `--queue-size`, moved between shards by
    /// message as permits are, so the queue holds at most that many gateway-wide.
    places: usize,
    /// Peers waiting for a permit from us, oldest first.
    debts: VecDeque<usize>,
    peers: Vec<(usize, flume::Sender<PoolMsg>)>,
    next_ticket: u64,
}

// === impl Permits ===

impl Permits {
    /// Shard `me` of `shards`' part of `pool`, with its share of the permits and of the queue.
    pub fn new(
        pool: Pool,
        cfg: &AdmissionConfig,
        me: usize,
        shards: usize,
        peers: Vec<(usize, flume::Sender<PoolMsg>)>,
    ) -> Self {
        let share = cfg.permits / shards + usize::from(me < cfg.permits % shards);
        Permits {
            pool,
            me,
            free: share,
            waiters: VecDeque::new(),
            queue_mode: cfg.queue_size > 0,
            places: cfg.queue_size / shards + usize::from(me < cfg.queue_size % shards),
            debts: VecDeque::new(),
            peers,
            next_ticket: 0,
        }
    }

    /// Takes a permit, or a place in the queue.
    pub fn admit(this: &Rc<RefCell<Permits>>) -> Admit {
        let mut p = this.borrow_mut();
        let queue = p.queue_mode;
        if p.free > 0 && p.live_waiters() == 0 {
            p.free -= 1;
            return Admit::Now;
        }
        let placed = queue && p.places > 0;
        if queue && !placed && p.peers.is_empty() {
            return Admit::Full;
        }
        if !queue && p.peers.is_empty() {
            return Admit::Full;
        }
        if placed {
            p.places -= 1;
        }
        p.next_ticket += 1;
        let ticket = p.next_ticket;
        let waiter = Rc::new(Waiter {
            ticket,
            state: Cell::new(Wait::Queued),
            pending_denials: Cell::new(p.peers.len()),
            placed: Cell::new(placed),
            waker: Cell::new(None),
        });
        p.waiters.push_back(Rc::clone(&waiter));
        let from = p.me;
        for (_, peer) in &p.peers {
            // Unbounded: never fails while the peer shard lives. A waiter with a place asks
            // for a permit; one without asks for a place first.
            let msg = if queue && !placed {
                PermitMsg::WantPlace { from, ticket }
            } else {
                PermitMsg::Want { from, ticket, queue }
            };
            let _ = peer.send(PoolMsg { pool: p.pool, msg });
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
            PermitMsg::Deny { ticket } | PermitMsg::DenyPlace { ticket } => {
                let w = self.waiters.iter().find(|w| w.ticket == ticket && w.state.get() == Wait::Queued);
                if let Some(w) = w.filter(|w| !w.placed.get()) {
                    let left = w.pending_denials.get().saturating_sub(1);
                    w.pending_denials.set(left);
                    if left == 0 {
                        w.state.set(Wait::Refused);
                        wake(w);
                    }
                }
                self.prune();
            }
            PermitMsg::WantPlace { from, ticket } => {
                if self.places > 0 {
                    self.places -= 1;
                    self.send(from, PermitMsg::GrantPlace { ticket });
                } else {
                    self.send(from, PermitMsg::DenyPlace { ticket });
                }
            }
            PermitMsg::GrantPlace { ticket } => {
                let w = self.waiters.iter().find(|w| w.ticket == ticket && w.state.get() == Wait::Queued);
                match w.filter(|w| !w.placed.get()).cloned() {
                    Some(w) => {
                        // Placed: now it asks for a permit like any queued request.
                        w.placed.set(true);
                        let (from, ticket) = (self.me, w.ticket);
                        for (_, peer) in &self.peers {
                            let msg = PermitMsg::Want { from, ticket, queue: true };
                            let _ = peer.send(PoolMsg { pool: self.pool, msg });
                        }
                    }
                    // Admitted, gone, or placed by another peer already: the place is ours.
                    None => self.places += 1,
                }
            }
        }
    }

    /// Permits free on this shard now (tests and metrics).
    pub fn free(&self) -> usize {
        self.free
    }

    /// Requests in this shard's queue now, each holding a place (metrics).
    pub fn queued(&self) -> usize {
        self.waiters.iter().filter(|w| w.state.get() == Wait::Queued && w.placed.get()).count()
    }

    /// A waiter stopped waiting (admitted, refused or gone): its queue place is free again.
    fn unplace(&mut self, w: &Waiter) {
        if w.placed.replace(false) {
            self.places += 1;
        }
    }

    /// Gives one permit to this shard's oldest waiter, else the oldest debt, else the pool.
    fn place_permit(&mut self) {
        self.prune();
        if self.live_waiters() > 0 {
            self.grant_oldest();
            return;
        }
        if let Some(peer) = self.debts.pop_front() {
            self.send(peer, PermitMsg::Grant);
            return;
        }
        self.free += 1;
    }

    fn grant_oldest(&mut self) {
        while let Some(w) = self.waiters.pop_front() {
            if w.state.get() == Wait::Queued {
                w.state.set(Wait::Granted);
                self.unplace(&w);
                wake(&w);
                return;
            }
        }
    }

    fn send(&self, to: usize, msg: PermitMsg) {
        if let Some((_, tx)) = self.peers.iter().find(|(i, _)| *i == to) {
            let _ = tx.send(PoolMsg { pool: self.pool, msg });
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
}

fn wake(w: &Waiter) {
    if let Some(k) = w.waker.take() {
        k.wake();
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut p = self.permits.borrow_mut();
        p.unplace(&self.waiter);
        match self.waiter.state.replace(Wait::Left) {
            // Granted but never used (the request went away at the last moment).
            Wait::Granted => p.release(),
            _ => p.prune(),
        }
    }
}

impl Ticket {
    /// A permit has reached the ticket already.
    pub fn granted(&self) -> bool {
        self.waiter.state.get() == Wait::Granted
    }

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

    fn cfg(permits: usize, queue: usize) -> AdmissionConfig {
        AdmissionConfig { permits, queue_size: queue, queue_timeout: std::time::Duration::from_secs(1) }
    }

    /// Two shards wired to each other; messages are delivered by `pump`.
    fn pair(permits: usize, queue: usize) -> [(Rc<RefCell<Permits>>, flume::Receiver<PoolMsg>); 2] {
        let (t0, r0) = flume::unbounded();
        let (t1, r1) = flume::unbounded();
        let a = Rc::new(RefCell::new(Permits::new(Pool::Admission, &cfg(permits, queue), 0, 2, vec![(1, t1)])));
        let b = Rc::new(RefCell::new(Permits::new(Pool::Admission, &cfg(permits, queue), 1, 2, vec![(0, t0)])));
        [(a, r0), (b, r1)]
    }

    fn pump(shards: &[(Rc<RefCell<Permits>>, flume::Receiver<PoolMsg>); 2]) {
        loop {
            let mut moved = false;
            for (p, rx) in shards {
                while let Ok(m) = rx.try_recv() {
                    p.borrow_mut().on_message(m.msg);
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
        assert!(matches!(Permits::admit(&s[0].0), Admit::Now));
        let Admit::Queued(t) = Permits::admit(&s[0].0) else { panic!() };
        pump(&s);
        assert!(granted(&t));
        t.into_held();
        // Gateway-wide at 2: a third request on either shard waits.
        let Admit::Queued(t3) = Permits::admit(&s[1].0) else { panic!() };
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
        let Admit::Queued(t) = Permits::admit(&s[1].0) else { panic!() };
        drop(t);
        pump(&s);
        // The grant landed where no one waits: it is a free permit there now.
        assert_eq!(s[0].0.borrow().free() + s[1].0.borrow().free(), 1);
        assert!(matches!(Permits::admit(&s[1].0), Admit::Now));
    }

    #[test]
    fn no_queue_asks_peers_then_refuses() {
        let s = pair(1, 0);
        let Admit::Queued(t) = Permits::admit(&s[1].0) else { panic!() };
        pump(&s);
        assert!(granted(&t), "shard 0's free permit is used, not refused");
        t.into_held();
        let Admit::Queued(t2) = Permits::admit(&s[0].0) else { panic!() };
        pump(&s);
        assert_eq!(t2.waiter.state.get(), Wait::Refused);
    }

    #[test]
    fn queue_is_fifo_and_bounded_gateway_wide() {
        let s = pair(2, 4);
        assert!(matches!(Permits::admit(&s[0].0), Admit::Now));
        assert!(matches!(Permits::admit(&s[1].0), Admit::Now));
        pump(&s);
        let queued = |s: &[(Rc<RefCell<Permits>>, _); 2]| s[0].0.borrow().queued() + s[1].0.borrow().queued();
        // Shard 0's two places, then two borrowed from shard 1: a queue of 4, wherever they arrive.
        let mut t: Vec<Ticket> = Vec::new();
        for k in 0..4 {
            let Admit::Queued(x) = Permits::admit(&s[0].0) else { panic!("request {k} queues") };
            pump(&s);
            t.push(x);
        }
        assert_eq!(queued(&s), 4);
        let Admit::Queued(fifth) = Permits::admit(&s[1].0) else { panic!("asks for a place") };
        pump(&s);
        assert_eq!(fifth.waiter.state.get(), Wait::Refused, "no place left anywhere: 429");
        drop(fifth);
        assert_eq!(queued(&s), 4);
        s[0].0.borrow_mut().release();
        pump(&s);
        assert!(granted(&t[0]) && !granted(&t[1]), "first come, first served");
        assert_eq!(queued(&s), 3);
        // The admitted request's place is free again: one more may queue.
        let Admit::Queued(again) = Permits::admit(&s[1].0) else { panic!() };
        pump(&s);
        assert_eq!(queued(&s), 4);
        drop(again);
        assert_eq!(queued(&s), 3, "a request that left gives its place back");
    }

    /// Random arrivals, departures, releases and message deliveries (in any order across
    /// shards) for every cap 1..=8 on 1..=4 shards and queue sizes 0..=4: never more than N
    /// admitted at once nor more than the queue size queued, and every permit and queue place
    /// back in a pool once everyone has gone.
    #[test]
    fn exact_for_every_cap_and_shard_count_in_any_order() {
        for permits in 1..=8usize {
            for shards in 1..=4usize {
                for seed in 0..20u64 {
                    let mut rng = fastrand::Rng::with_seed(seed * 1000 + (permits * 10 + shards) as u64);
                    let queue = rng.usize(0..=4);
                    let c = cfg(permits, queue);
                    let (txs, rxs): (Vec<_>, Vec<_>) = (0..shards).map(|_| flume::unbounded::<PoolMsg>()).unzip();
                    let s: Vec<Rc<RefCell<Permits>>> = (0..shards)
                        .map(|me| {
                            let peers = (0..shards).filter(|&i| i != me).map(|i| (i, txs[i].clone())).collect();
                            Rc::new(RefCell::new(Permits::new(Pool::Admission, &c, me, shards, peers)))
                        })
                        .collect();
                    let mut held: Vec<usize> = Vec::new();
                    let mut waiting: Vec<(usize, Ticket)> = Vec::new();
                    for _ in 0..400 {
                        match rng.u8(0..4) {
                            0 => {
                                let at_shard = rng.usize(0..shards);
                                match Permits::admit(&s[at_shard]) {
                                    Admit::Now => held.push(at_shard),
                                    Admit::Queued(t) => waiting.push((at_shard, t)),
                                    Admit::Full => {}
                                }
                            }
                            1 if !held.is_empty() => {
                                let i = held.swap_remove(rng.usize(0..held.len()));
                                s[i].borrow_mut().release();
                            }
                            2 if !waiting.is_empty() => drop(waiting.swap_remove(rng.usize(0..waiting.len()))),
                            _ => {
                                let i = rng.usize(0..shards);
                                if let Ok(m) = rxs[i].try_recv() {
                                    s[i].borrow_mut().on_message(m.msg);
                                }
                            }
                        }
                        // Granted tickets become held permits.
                        let mut k = 0;
                        while k < waiting.len() {
                            if granted(&waiting[k].1) {
                                let (i, t) = waiting.swap_remove(k);
                                t.into_held();
                                held.push(i);
                            } else {
                                k += 1;
                            }
                        }
                        assert!(held.len() <= permits, "{} admitted with N={permits} on {shards} shards", held.len());
                        let q: usize = s.iter().map(|p| p.borrow().queued()).sum();
                        assert!(q <= queue, "{q} queued with --queue-size {queue} on {shards} shards");
                    }
                    waiting.clear();
                    for i in held.drain(..) {
                        s[i].borrow_mut().release();
                    }
                    loop {
                        let mut moved = false;
                        for (i, rx) in rxs.iter().enumerate() {
                            while let Ok(m) = rx.try_recv() {
                                s[i].borrow_mut().on_message(m.msg);
                                moved = true;
                            }
                        }
                        if !moved {
                            break;
                        }
                    }
                    let free: usize = s.iter().map(|p| p.borrow().free()).sum();
                    assert_eq!(free, permits, "a permit was lost or made (N={permits}, {shards} shards, seed {seed})");
                    let places: usize = s.iter().map(|p| p.borrow().places).sum();
                    assert_eq!(
                        places, queue,
                        "a queue place was lost or made (N={permits}, {shards} shards, seed {seed})"
                    );
                }
            }
        }
    }
}
