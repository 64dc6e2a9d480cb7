//! The priority scheduler (`--priority-scheduler-enabled`): SMG's four classes admitted by
//! priority over the workers' capacity, with reserved slots, per-class queues, starvation
//! promotion and preemption of requests that have sent nothing to their client yet. It
//! replaces the plain limiter (`permits.rs`) when on; off, nothing here exists.
//!
//! Design: one scheduler per shard over a leased share of the slots, the shards trading
//! slots by message (the permits.rs scheme, with classes). No lock or shared atomic; the
//! request path touches only this shard's `RefCell`.
//!
//! - Capacity C = Σ over routable workers of `max_running_requests` (discovered from
//!   `/get_server_info`; a worker that reports none counts as 64 slots, SMG's estimate; with
//!   no routable worker, `--max-concurrent-requests` or 1,024). Each shard holds `cap_i`
//!   slots, `Σ cap_i = C`: C/N at start, and every change of C moves each shard by the
//!   change of its own share, so the sum stays C (a shard may go below its in-flight count;
//!   it then admits nothing until enough finish).
//! - Reservations R[h] (`max(reserved_floor, ceil(reserved_per_slot × C))`, clamped so the
//!   highest classes stay whole) are split over the shards the same way. A class-c request
//!   is admitted on shard i when `used_i + Σ_{h>c} max(0, r_i[h] − n_i[h]) < cap_i`. Summed
//!   over the shards this implies the gateway-wide rule, so **reservations and the
//!   capacity are never exceeded** (except while a capacity drop drains). The error is on
//!   the safe side: a lower class can be refused while the reservation it would eat is
//!   already used on another shard; the most slots so withheld is Σ_h R[h]·(N−1)/N.
//! - A shard that cannot admit a request queues it (per class, FIFO) in one of the class's
//!   `queue_size` places. The places are split over the shards like the slots (a shard may
//!   own none) and move by message: with none left here the request asks the peers
//!   (`WantPlace`) and is refused, 429, once they all said no, so a class's queue holds at
//!   most its `queue_size` gateway-wide. Queued, when it has no slot that class may use, it sends `Want{class}`
//!   to its peers. A peer with a slot that class may use by the rule above sends `Grant`
//!   (the slot moves: `cap` −1 there, +1 here); else it records a debt. A freed slot goes to
//!   the most urgent of this shard's waiters and debts: first a starving head (older than
//!   its class's `starvation_threshold_secs`, lowest class first, reservations ignored),
//!   then by class from `system` down (a waiter before a debt of the same class).
//!   A slot lent out of a class's unused reservation takes that reservation with it.
//!   A waiter served (or gone) tells the peers it asked, which forget its debt; a grant
//!   names the waiter it is for, so a slot given to a starving waiter goes to it. A grant
//!   that crosses a cancel becomes a spare slot where it lands (the only inexactness: the
//!   reservations of the shard it left may then be short by that slot until one moves back).
//! - Preemption (classes with `can_preempt`): a request that cannot be admitted, once every
//!   peer has answered its want `Busy` (no slot it may use anywhere), marks one in-flight
//!   request of a lower class that has not sent its first byte (the lowest class, newest
//!   first) on this shard; with none here, it asks the one peer whose last report shows
//!   lower-class requests in flight (`Want{preempt}`), which preempts one of its own. At
//!   most one victim per preemptor. The victim's task is woken, drops its upstream attempt
//!   (the worker connection closes, the engine aborts) and answers 503; its slot, freed
//!   where the request context drops in `finish`, goes to the preemptor itself (lent to its
//!   shard if need be), never to another waiter: otherwise a peer's waiter could take it,
//!   and the preemptor would wait while a lower-class request it should have displaced runs.

pub mod config;
pub mod msg;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Instant;

pub use config::{Class, SchedulerConfig};
pub use msg::SchedMsg;

use crate::clock::Clock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Asking the peers for a place in its class's queue (not in the queue yet).
    Placing,
    Queued,
    Granted,
    /// Every peer had no place: 429.
    Refused,
    Left,
}

struct Waiter {
    ticket: u64,
    /// Peers were asked for a slot for it (they are told when it needs none any more).
    wanted: Cell<bool>,
    /// Peers that have not answered its want; when all said busy, it preempts.
    pending: Cell<usize>,
    preempt: Cell<bool>,
    class: Class,
    since: Instant,
    state: Cell<Wait>,
    /// It holds one of its class's queue places (given back when it stops waiting).
    placed: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

/// A request holding a slot: what preemption needs to find it and stop it.
pub struct Held {
    class: Class,
    admitted: Instant,
    /// Its first byte reached the client: no longer preemptible.
    started: Cell<bool>,
    preempted: Cell<bool>,
    /// Who preempted it (shard, ticket): its slot goes to that request when it frees, not
    /// to whoever else is waiting, so every preemption serves the request that made it.
    for_whom: Cell<Option<(usize, u64)>>,
    waker: Cell<Option<Waker>>,
    index: Cell<usize>,
}

impl Held {
    /// The response is about to reach the client: from here on it is not preempted.
    pub fn start(&self) {
        self.started.set(true);
    }

    pub fn is_preempted(&self) -> bool {
        self.preempted.get()
    }

    /// Resolves when a higher class preempts this request.
    pub async fn preempted(&self) {
        std::future::poll_fn(|cx| {
            if self.preempted.get() {
                Poll::Ready(())
            } else {
                self.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await
    }
}

struct Debt {
    from: usize,
    ticket: u64,
    class: Class,
    since: Instant,
}

pub struct Scheduler {
    cfg: Rc<SchedulerConfig>,
    me: usize,
    shards: usize,
    /// Gateway-wide capacity C, and the Snapshot generation it was computed from.
    capacity: usize,
    generation: u64,
    /// This shard's slots (moves with grants and capacity changes; may dip below `used`).
    cap: isize,
    /// This shard's share of each class's reservation.
    reserved: [usize; 4],
    /// Slots held (or granted and about to be held) per class on this shard.
    own: [usize; 4],
    reported: [u32; 4],
    peer_counts: Vec<[u32; 4]>,
    queues: [VecDeque<Rc<Waiter>>; 4],
    /// Free places in each class's queue on this shard.
    places: [usize; 4],
    /// Waiters asking the peers for a place.
    placing: Vec<Rc<Waiter>>,
    debts: VecDeque<Debt>,
    peers: Vec<(usize, flume::Sender<SchedMsg>)>,
    held: Vec<Option<Rc<Held>>>,
    vacant: Vec<usize>,
    next_peer: usize,
    next_ticket: u64,
    /// Starving heads promoted past the reservations, per class (for the metrics).
    promoted: [u64; 4],
    /// Read at every decision by time (queue ages, starvation, debts): hand-moved in tests.
    clock: Clock,
}

/// The outcome of asking for a slot.
pub enum Admission {
    Now(Slot),
    Queued(Ticket),
    Full,
}

/// A queued request's place; dropping it leaves the queue (a slot already granted to it
/// is handed on).
pub struct Ticket {
    waiter: Rc<Waiter>,
    sched: Rc<RefCell<Scheduler>>,
}

/// An admitted request's slot, given back when the request context drops in `finish`.
pub struct Slot {
    held: Rc<Held>,
    sched: Rc<RefCell<Scheduler>>,
}

fn share(total: usize, me: usize, shards: usize) -> usize {
    total / shards + usize::from(me < total % shards)
}

// === impl Scheduler ===

impl Scheduler {
    pub fn new(
        cfg: Rc<SchedulerConfig>,
        me: usize,
        shards: usize,
        peers: Vec<(usize, flume::Sender<SchedMsg>)>,
    ) -> Self {
        let capacity = cfg.fallback_capacity;
        let places = Class::ALL.map(|c| share(cfg.class(c).queue_size as usize, me, shards));
        let mut s = Scheduler {
            me,
            shards,
            capacity,
            generation: u64::MAX,
            cap: share(capacity, me, shards) as isize,
            reserved: [0; 4],
            own: [0; 4],
            reported: [0; 4],
            peer_counts: vec![[0; 4]; shards],
            queues: Default::default(),
            places,
            placing: Vec::new(),
            debts: VecDeque::new(),
            peers,
            held: Vec::new(),
            vacant: Vec::new(),
            next_peer: 0,
            next_ticket: 0,
            promoted: [0; 4],
            cfg,
            clock: Clock::Real,
        };
        s.reserved = s.split_reservations(capacity);
        s
    }

    /// The same scheduler on another clock (tests move a manual one).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    fn split_reservations(&self, capacity: usize) -> [usize; 4] {
        self.cfg.reservations(capacity).map(|r| share(r, self.me, self.shards))
    }

    /// Applies the capacity of a new worker Snapshot (same on every shard, so the shares
    /// still sum to C).
    pub fn observe_capacity(&mut self, generation: u64, capacity: impl FnOnce() -> usize) {
        if generation == self.generation {
            return;
        }
        self.generation = generation;
        let c = match capacity() {
            0 => self.cfg.fallback_capacity,
            c => c,
        };
        if c == self.capacity {
            return;
        }
        let (old, new) = (share(self.capacity, self.me, self.shards), share(c, self.me, self.shards));
        self.cap += new as isize - old as isize;
        self.capacity = c;
        self.reserved = self.split_reservations(c);
        if self.me == 0 {
            crate::info!(
                "priority scheduler: capacity {c} slots, reserved {:?} (bulk..system)",
                self.cfg.reservations(c)
            );
        }
        self.dispatch();
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn used(&self) -> usize {
        self.own.iter().sum()
    }

    /// Slots a `class` request may take here now: free ones not reserved for a higher
    /// class; `starving` ignores the reservations.
    fn available_to(&self, class: Class, starving: bool) -> isize {
        let free = self.cap - self.used() as isize;
        if starving {
            return free;
        }
        let held_back: usize = Class::ALL[class.index() + 1..]
            .iter()
            .map(|h| self.reserved[h.index()].saturating_sub(self.own[h.index()]))
            .sum();
        free - held_back as isize
    }

    fn live(&self, class: Class) -> usize {
        self.queues[class.index()].iter().filter(|w| w.state.get() == Wait::Queued).count()
    }

    fn prune(&mut self) {
        for q in &mut self.queues {
            while q.front().is_some_and(|w| w.state.get() != Wait::Queued) {
                q.pop_front();
            }
        }
    }

    /// Takes a slot, or a place in the class's queue.
    pub fn admit(this: &Rc<RefCell<Scheduler>>, class: Class) -> Admission {
        let mut s = this.borrow_mut();
        let ahead = Class::ALL[class.index()..].iter().any(|c| !s.queues[c.index()].is_empty());
        if !ahead && s.available_to(class, false) > 0 {
            s.own[class.index()] += 1;
            drop(s);
            return Admission::Now(Slot::hold(this, class));
        }
        s.prune();
        let placed = s.places[class.index()] > 0;
        if !placed && s.peers.is_empty() {
            return Admission::Full;
        }
        let now = s.clock.now();
        s.next_ticket += 1;
        let ticket = s.next_ticket;
        let waiter = Rc::new(Waiter {
            ticket,
            wanted: Cell::new(false),
            pending: Cell::new(0),
            preempt: Cell::new(false),
            class,
            since: now,
            state: Cell::new(Wait::Placing),
            placed: Cell::new(false),
            waker: Cell::new(None),
        });
        if placed {
            s.places[class.index()] -= 1;
            s.enqueue(&waiter);
        } else {
            waiter.pending.set(s.peers.len());
            s.placing.push(Rc::clone(&waiter));
            let from = s.me;
            for (_, peer) in &s.peers {
                let _ = peer.send(SchedMsg::WantPlace { from, ticket, class });
            }
        }
        drop(s);
        Admission::Queued(Ticket { waiter, sched: Rc::clone(this) })
    }

    /// Puts a waiter that holds a place into its class's queue, asking the peers for a slot
    /// when this shard has none its class may use.
    fn enqueue(&mut self, waiter: &Rc<Waiter>) {
        waiter.placed.set(true);
        waiter.state.set(Wait::Queued);
        let (class, ticket, now) = (waiter.class, waiter.ticket, waiter.since);
        let s = self;
        s.queues[class.index()].push_back(Rc::clone(waiter));
        if s.available_to(class, false) <= 0 {
            // Preempt only when no peer has a slot this class may use: first ask them all.
            let can_preempt = s.cfg.class(class).can_preempt;
            if s.peers.is_empty() {
                if can_preempt {
                    let me = s.me;
                    s.preempt_local(class, me, ticket);
                }
            } else {
                waiter.wanted.set(true);
                waiter.preempt.set(can_preempt);
                waiter.pending.set(s.peers.len());
                let from = s.me;
                for (_, peer) in &s.peers {
                    let _ = peer.send(SchedMsg::Want { from, ticket, class, since: now, preempt: false });
                }
            }
        }
    }

    /// A waiter stopped waiting: its queue place is free again.
    fn unplace(&mut self, w: &Waiter) {
        if w.placed.replace(false) {
            self.places[w.class.index()] += 1;
        }
    }

    /// Resolves when the ticket's request holds a slot (true), or was refused a place in
    /// its class's queue (false).
    pub async fn wait(ticket: &Ticket) -> bool {
        std::future::poll_fn(|cx| match ticket.waiter.state.get() {
            Wait::Granted => Poll::Ready(true),
            Wait::Refused => Poll::Ready(false),
            _ => {
                ticket.waiter.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await
    }

    /// Marks one local lower-class request that has sent nothing: the lowest class, the
    /// newest. False when there is none.
    fn preempt_local(&mut self, class: Class, from: usize, ticket: u64) -> bool {
        let victim = self
            .held
            .iter()
            .flatten()
            .filter(|h| h.class < class && !h.started.get() && !h.preempted.get())
            .max_by_key(|h| (std::cmp::Reverse(h.class), h.admitted));
        let Some(v) = victim else { return false };
        crate::info!("priority scheduler: preempting a {} request for a {} one", v.class.as_str(), class.as_str());
        v.preempted.set(true);
        v.for_whom.set(Some((from, ticket)));
        if let Some(w) = v.waker.take() {
            w.wake();
        }
        true
    }

    /// The peer to ask for a preemption: one whose last report has lower-class requests
    /// in flight, else the next in turn.
    fn preempt_peer(&mut self, class: Class) -> Option<usize> {
        if self.peers.is_empty() {
            return None;
        }
        let lower = |counts: &[u32; 4]| counts[..class.index()].iter().any(|&n| n > 0);
        if let Some((i, _)) = self.peers.iter().find(|(i, _)| lower(&self.peer_counts[*i])) {
            return Some(*i);
        }
        self.next_peer = (self.next_peer + 1) % self.peers.len();
        Some(self.peers[self.next_peer].0)
    }

    /// Hands free slots to the most urgent waiters and debts; see the module doc.
    fn dispatch(&mut self) {
        loop {
            self.prune();
            let now = self.clock.now();
            let starving = |c: Class, since: Instant| now.saturating_duration_since(since) > self.cfg.starvation(c);
            // Starving heads, lowest class first (system does not starve).
            let mut pick: Option<(Class, bool, bool)> = None; // (class, local, starving)
            for c in &Class::ALL[..3] {
                let local = self.queues[c.index()].front().is_some_and(|w| starving(*c, w.since));
                let debt = self.debts.iter().any(|d| d.class == *c && starving(*c, d.since));
                if (local || debt) && self.available_to(*c, true) > 0 {
                    pick = Some((*c, local, true));
                    break;
                }
            }
            if pick.is_none() {
                for c in Class::ALL.iter().rev() {
                    if self.available_to(*c, false) <= 0 {
                        continue;
                    }
                    if !self.queues[c.index()].is_empty() {
                        pick = Some((*c, true, false));
                        break;
                    }
                    if self.debts.iter().any(|d| d.class == *c) {
                        pick = Some((*c, false, false));
                        break;
                    }
                }
            }
            let Some((class, local, starved)) = pick else { return };
            if local {
                let w = self.queues[class.index()].pop_front().expect("head");
                if starved {
                    self.promoted[class.index()] += 1;
                    crate::debug!("priority scheduler: a starving {} request promoted", class.as_str());
                }
                self.grant(&w);
            } else {
                let i = self.debts.iter().position(|d| d.class == class).expect("debt");
                let d = self.debts.remove(i).expect("debt");
                self.lend(d.from, d.ticket);
            }
        }
    }

    /// Moves a free slot to a peer. A slot that was some class's unused reservation (the
    /// lowest such class: a class may use the reservations of those below it) takes that
    /// reservation along, so the shards' reservations still sum to R.
    fn lend(&mut self, to: usize, ticket: u64) {
        let unused = |s: &Self, c: Class| s.reserved[c.index()].saturating_sub(s.own[c.index()]);
        let unreserved =
            self.cap - self.used() as isize - Class::ALL.iter().map(|c| unused(self, *c)).sum::<usize>() as isize;
        let reserved = if unreserved > 0 { None } else { Class::ALL.into_iter().find(|c| unused(self, *c) > 0) };
        if let Some(c) = reserved {
            self.reserved[c.index()] -= 1;
        }
        self.cap -= 1;
        self.send(to, SchedMsg::Grant { ticket, reserved });
    }

    /// Gives a queued waiter its slot.
    fn grant(&mut self, w: &Waiter) {
        self.own[w.class.index()] += 1;
        w.state.set(Wait::Granted);
        self.unplace(w);
        self.cancel_wants(w);
        if let Some(k) = w.waker.take() {
            k.wake();
        }
    }

    fn cancel_wants(&self, w: &Waiter) {
        if w.wanted.replace(false) {
            let (from, ticket) = (self.me, w.ticket);
            for (_, tx) in &self.peers {
                let _ = tx.send(SchedMsg::Cancel { from, ticket });
            }
        }
    }

    fn send(&self, to: usize, msg: SchedMsg) {
        if let Some((_, tx)) = self.peers.iter().find(|(i, _)| *i == to) {
            let _ = tx.send(msg);
        }
    }

    /// Applies a peer's message.
    pub fn on_message(&mut self, msg: SchedMsg) {
        match msg {
            SchedMsg::Want { from, ticket, class, since, preempt } => {
                if self.available_to(class, false) > 0 {
                    self.lend(from, ticket);
                    return;
                }
                if preempt {
                    self.preempt_local(class, from, ticket);
                } else {
                    self.debts.push_back(Debt { from, ticket, class, since });
                    self.send(from, SchedMsg::Busy { ticket });
                }
            }
            SchedMsg::Grant { ticket, reserved } => {
                self.cap += 1;
                if let Some(c) = reserved {
                    self.reserved[c.index()] += 1;
                }
                // The slot was given for that waiter (perhaps starving, past reservations):
                // it goes to it, else to whoever is most urgent here.
                let w =
                    self.queues.iter().flatten().find(|w| w.ticket == ticket && w.state.get() == Wait::Queued).cloned();
                match w {
                    Some(w) => self.grant(&w),
                    None => self.dispatch(),
                }
            }
            SchedMsg::Busy { ticket } => {
                let w =
                    self.queues.iter().flatten().find(|w| w.ticket == ticket && w.state.get() == Wait::Queued).cloned();
                let Some(w) = w else { return };
                w.pending.set(w.pending.get().saturating_sub(1));
                if w.pending.get() == 0 && w.preempt.replace(false) && !self.preempt_local(w.class, self.me, ticket) {
                    if let Some(peer) = self.preempt_peer(w.class) {
                        let (from, class, since) = (self.me, w.class, w.since);
                        self.send(peer, SchedMsg::Want { from, ticket, class, since, preempt: true });
                    }
                }
            }
            SchedMsg::Cancel { from, ticket } => self.debts.retain(|d| d.from != from || d.ticket != ticket),
            SchedMsg::Counts { from, counts } => {
                if let Some(c) = self.peer_counts.get_mut(from) {
                    *c = counts;
                }
            }
            SchedMsg::WantPlace { from, ticket, class } => {
                if self.places[class.index()] > 0 {
                    self.places[class.index()] -= 1;
                    self.send(from, SchedMsg::GrantPlace { ticket, class });
                } else {
                    self.send(from, SchedMsg::DenyPlace { ticket });
                }
            }
            SchedMsg::GrantPlace { ticket, class } => {
                let at = self.placing.iter().position(|w| w.ticket == ticket && w.state.get() == Wait::Placing);
                match at {
                    Some(i) => {
                        let w = self.placing.swap_remove(i);
                        self.enqueue(&w);
                        self.dispatch();
                    }
                    // Gone, or placed by another peer already: the place stays here.
                    None => self.places[class.index()] += 1,
                }
            }
            SchedMsg::DenyPlace { ticket } => {
                let at = self.placing.iter().position(|w| w.ticket == ticket && w.state.get() == Wait::Placing);
                if let Some(i) = at {
                    let w = &self.placing[i];
                    w.pending.set(w.pending.get().saturating_sub(1));
                    if w.pending.get() == 0 {
                        let w = self.placing.swap_remove(i);
                        w.state.set(Wait::Refused);
                        if let Some(k) = w.waker.take() {
                            k.wake();
                        }
                    }
                }
            }
        }
    }

    /// Every tick: starvation promotion, stale debts, and this shard's counts to peers.
    pub fn tick(&mut self) {
        self.dispatch();
        // A debt whose waiter was served elsewhere would hold a slot hostage only while
        // this shard has none to give; debts older than the longest queue timeout go.
        let oldest = Class::ALL.iter().map(|c| self.cfg.queue_timeout(*c)).max().unwrap_or_default();
        let now = self.clock.now();
        self.debts.retain(|d| now.saturating_duration_since(d.since) <= oldest);
        let counts = self.own.map(|n| n as u32);
        if counts != self.reported {
            self.reported = counts;
            let from = self.me;
            for (_, tx) in &self.peers {
                let _ = tx.send(SchedMsg::Counts { from, counts });
            }
        }
    }

    /// A preempted request's slot goes to the request that preempted it: a waiter here, or
    /// one on a peer (the slot moves there); if that request is gone, to whoever is next.
    fn hand_over(&mut self, class: Class, to: usize, ticket: u64) {
        self.own[class.index()] -= 1;
        if to != self.me {
            self.debts.retain(|d| d.from != to || d.ticket != ticket);
            self.lend(to, ticket);
            return;
        }
        let w = self.queues.iter().flatten().find(|w| w.ticket == ticket && w.state.get() == Wait::Queued).cloned();
        match w {
            Some(w) => self.grant(&w),
            None => self.dispatch(),
        }
    }

    fn release(&mut self, class: Class) {
        self.own[class.index()] -= 1;
        self.dispatch();
    }

    /// Per class (lowest first): queued, in flight, starving heads promoted so far.
    pub fn by_class(&self) -> [(usize, usize, u64); 4] {
        Class::ALL.map(|c| (self.live(c), self.own[c.index()], self.promoted[c.index()]))
    }

    /// (queued, in flight) on this shard, for tests and metrics.
    pub fn depth(&self) -> (usize, usize) {
        (Class::ALL.iter().map(|c| self.live(*c)).sum(), self.used())
    }
}

impl Slot {
    fn hold(sched: &Rc<RefCell<Scheduler>>, class: Class) -> Slot {
        let held = Rc::new(Held {
            class,
            admitted: sched.borrow().clock.now(),
            started: Cell::new(false),
            preempted: Cell::new(false),
            for_whom: Cell::new(None),
            waker: Cell::new(None),
            index: Cell::new(0),
        });
        let mut s = sched.borrow_mut();
        let i = match s.vacant.pop() {
            Some(i) => {
                s.held[i] = Some(Rc::clone(&held));
                i
            }
            None => {
                s.held.push(Some(Rc::clone(&held)));
                s.held.len() - 1
            }
        };
        held.index.set(i);
        Slot { held, sched: Rc::clone(sched) }
    }

    pub fn held(&self) -> &Rc<Held> {
        &self.held
    }

    pub fn class(&self) -> Class {
        self.held.class
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.sched.borrow_mut();
        let i = self.held.index.get();
        s.held[i] = None;
        s.vacant.push(i);
        match self.held.for_whom.get() {
            Some((to, ticket)) => s.hand_over(self.held.class, to, ticket),
            None => s.release(self.held.class),
        }
    }
}

impl Ticket {
    /// The granted slot, now held by the request.
    pub fn into_slot(self) -> Slot {
        self.waiter.state.set(Wait::Left);
        let slot = Slot::hold(&self.sched, self.waiter.class);
        std::mem::forget(self);
        slot
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut s = self.sched.borrow_mut();
        s.unplace(&self.waiter);
        match self.waiter.state.replace(Wait::Left) {
            Wait::Granted => s.release(self.waiter.class),
            Wait::Placing => s.placing.retain(|w| w.ticket != self.waiter.ticket),
            _ => {
                s.cancel_wants(&self.waiter);
                s.prune();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(yaml: &str) -> Rc<SchedulerConfig> {
        // One file per call (tests run in parallel), removed once it is read.
        let p = tempfile::Builder::new().prefix("smg-sched-").tempfile().unwrap().into_temp_path();
        std::fs::write(&p, yaml).unwrap();
        Rc::new(SchedulerConfig::new("system", Some(&*p), -1).unwrap())
    }

    const OPEN: &str = "classes:\n  system: {reserved_floor: 0, queue_size: 8, queue_timeout_secs: 5, starvation_threshold_secs: 5, can_preempt: true}\n  interactive: {reserved_floor: 2, queue_size: 8, queue_timeout_secs: 5, starvation_threshold_secs: 5, can_preempt: true}\n  default: {reserved_floor: 0, queue_size: 8, queue_timeout_secs: 5, starvation_threshold_secs: 5, can_preempt: false}\n  bulk: {reserved_floor: 0, queue_size: 8, queue_timeout_secs: 5, starvation_threshold_secs: 5, can_preempt: false}\n";

    type Pair = [(Rc<RefCell<Scheduler>>, flume::Receiver<SchedMsg>); 2];

    fn pair(capacity: usize) -> Pair {
        let c = cfg(OPEN);
        let (t0, r0) = flume::unbounded();
        let (t1, r1) = flume::unbounded();
        let a = Rc::new(RefCell::new(Scheduler::new(Rc::clone(&c), 0, 2, vec![(1, t1)])));
        let b = Rc::new(RefCell::new(Scheduler::new(c, 1, 2, vec![(0, t0)])));
        a.borrow_mut().observe_capacity(1, || capacity);
        b.borrow_mut().observe_capacity(1, || capacity);
        [(a, r0), (b, r1)]
    }

    fn pump(s: &Pair) {
        loop {
            let mut moved = false;
            for (p, rx) in s {
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

    fn now(a: Admission) -> Slot {
        match a {
            Admission::Now(s) => s,
            _ => panic!("not admitted"),
        }
    }

    fn queued(a: Admission) -> Ticket {
        match a {
            Admission::Queued(t) => t,
            _ => panic!("not queued"),
        }
    }

    #[test]
    fn reservations_hold_across_shards() {
        let s = pair(4);
        // Interactive keeps 2 of 4 (1 per shard): bulk gets at most 2, wherever it lands.
        let b1 = now(Scheduler::admit(&s[0].0, Class::Bulk));
        let t = queued(Scheduler::admit(&s[0].0, Class::Bulk));
        pump(&s);
        assert_eq!(t.waiter.state.get(), Wait::Granted, "shard 1's unreserved slot moved");
        let b2 = t.into_slot();
        let t3 = queued(Scheduler::admit(&s[1].0, Class::Bulk));
        pump(&s);
        assert_eq!(t3.waiter.state.get(), Wait::Queued);
        // Interactive gets both reserved slots.
        let i1 = now(Scheduler::admit(&s[0].0, Class::Interactive));
        let i2 = now(Scheduler::admit(&s[1].0, Class::Interactive));
        drop((b1, b2, i1, i2));
        pump(&s);
        assert_eq!(t3.waiter.state.get(), Wait::Granted);
    }

    #[test]
    fn preemption_local_and_remote() {
        let s = pair(4);
        let b0 = now(Scheduler::admit(&s[0].0, Class::Bulk));
        let b1 = now(Scheduler::admit(&s[1].0, Class::Bulk));
        let i0 = now(Scheduler::admit(&s[0].0, Class::Interactive));
        let i1 = now(Scheduler::admit(&s[1].0, Class::Interactive));
        b1.held().start();
        i1.held().start();
        // Nothing on shard 1 may be preempted: it asks shard 0, which preempts its bulk
        // request (the lowest class), not the interactive one.
        let t = queued(Scheduler::admit(&s[1].0, Class::System));
        pump(&s);
        assert!(b0.held().is_preempted() && !i0.held().is_preempted());
        assert_eq!(t.waiter.state.get(), Wait::Queued);
        drop(b0);
        pump(&s);
        assert_eq!(t.waiter.state.get(), Wait::Granted, "the victim's slot moved to the preemptor");
        // Locally: a default request cannot preempt (can_preempt false); interactive can.
        let d = queued(Scheduler::admit(&s[0].0, Class::Default));
        assert!(!b1.held().is_preempted());
        let t2 = queued(Scheduler::admit(&s[1].0, Class::Interactive));
        assert!(!b1.held().is_preempted(), "started requests are never preempted");
        drop((t, d, t2, i0, i1, b1));
    }

    #[test]
    fn starving_head_ignores_reservations() {
        let c = cfg("classes:\n  system: {reserved_floor: 0, queue_size: 8, queue_timeout_secs: 5, starvation_threshold_secs: 5, can_preempt: true}\n  default: {reserved_floor: 0, queue_size: 8, queue_timeout_secs: 5, starvation_threshold_secs: 5, can_preempt: false}\n  interactive: {reserved_floor: 4, queue_size: 8, queue_timeout_secs: 5, starvation_threshold_secs: 1, can_preempt: true}\n  bulk: {reserved_floor: 0, queue_size: 8, queue_timeout_secs: 5, starvation_threshold_secs: 1, can_preempt: false}\n");
        let clock = Clock::manual();
        let s = Rc::new(RefCell::new(Scheduler::new(c, 0, 1, vec![]).with_clock(clock.clone())));
        s.borrow_mut().observe_capacity(1, || 4);
        let t = queued(Scheduler::admit(&s, Class::Bulk));
        s.borrow_mut().tick();
        assert_eq!(t.waiter.state.get(), Wait::Queued, "all 4 slots are interactive's");
        // At its threshold (1 s) it is not starving yet; past it, it is.
        clock.advance(std::time::Duration::from_secs(1));
        s.borrow_mut().tick();
        assert_eq!(t.waiter.state.get(), Wait::Queued, "not past its threshold");
        clock.advance(std::time::Duration::from_millis(1));
        s.borrow_mut().tick();
        assert_eq!(t.waiter.state.get(), Wait::Granted, "promoted after its threshold");
    }

    #[test]
    fn queue_is_bounded_per_class() {
        let c = cfg("classes:\n  system: {reserved_floor: 0, queue_size: 8, queue_timeout_secs: 5, starvation_threshold_secs: 5, can_preempt: true}\n  default: {reserved_floor: 0, queue_size: 8, queue_timeout_secs: 5, starvation_threshold_secs: 5, can_preempt: false}\n  interactive: {reserved_floor: 1, queue_size: 8, queue_timeout_secs: 5, starvation_threshold_secs: 5, can_preempt: true}\n  bulk: {reserved_floor: 0, queue_size: 1, queue_timeout_secs: 5, starvation_threshold_secs: 5, can_preempt: false}\n");
        let s = Rc::new(RefCell::new(Scheduler::new(c, 0, 1, vec![])));
        s.borrow_mut().observe_capacity(1, || 1);
        // Interactive's floor keeps the one slot: bulk queues, then is refused.
        let _t = queued(Scheduler::admit(&s, Class::Bulk));
        assert!(matches!(Scheduler::admit(&s, Class::Bulk), Admission::Full));
    }

    #[test]
    fn a_class_queue_holds_its_size_gateway_wide() {
        let c = cfg("classes:\n  system: {reserved_floor: 0, queue_size: 8, queue_timeout_secs: 5, starvation_threshold_secs: 5, can_preempt: true}\n  default: {reserved_floor: 0, queue_size: 8, queue_timeout_secs: 5, starvation_threshold_secs: 5, can_preempt: false}\n  interactive: {reserved_floor: 2, queue_size: 8, queue_timeout_secs: 5, starvation_threshold_secs: 5, can_preempt: true}\n  bulk: {reserved_floor: 0, queue_size: 1, queue_timeout_secs: 5, starvation_threshold_secs: 5, can_preempt: false}\n");
        let (t0, r0) = flume::unbounded();
        let (t1, r1) = flume::unbounded();
        let a = Rc::new(RefCell::new(Scheduler::new(Rc::clone(&c), 0, 2, vec![(1, t1)])));
        let b = Rc::new(RefCell::new(Scheduler::new(c, 1, 2, vec![(0, t0)])));
        a.borrow_mut().observe_capacity(1, || 2);
        b.borrow_mut().observe_capacity(1, || 2);
        let s: Pair = [(a, r0), (b, r1)];
        let depth = |s: &Pair| s[0].0.borrow().depth().0 + s[1].0.borrow().depth().0;
        // Interactive's floor keeps both slots: bulk waits. The one place is shard 0's.
        let first = queued(Scheduler::admit(&s[1].0, Class::Bulk));
        pump(&s);
        assert_eq!(first.waiter.state.get(), Wait::Queued, "shard 1 borrowed shard 0's place");
        assert_eq!(depth(&s), 1);
        for shard in [0, 1] {
            let t = queued(Scheduler::admit(&s[shard].0, Class::Bulk));
            pump(&s);
            assert_eq!(t.waiter.state.get(), Wait::Refused, "shard {shard}: the class's one place is taken");
        }
        drop(first);
        pump(&s);
        let again = queued(Scheduler::admit(&s[0].0, Class::Bulk));
        pump(&s);
        assert_eq!(again.waiter.state.get(), Wait::Queued, "the place came back when its waiter left");
        assert_eq!(depth(&s), 1);
    }

    /// Random arrivals of every class, releases, departures, ticks and message deliveries
    /// in any order, for capacities 1..=8 on 1..=4 shards with small class queues and random
    /// reserved floors (0..=2 per class; no preemption): never more requests holding slots
    /// than the capacity, never more queued in a class than its size, and every slot, place
    /// and reserved slot back where it can be used once everyone has gone.
    #[test]
    fn exact_for_every_capacity_and_shard_count_in_any_order() {
        for capacity in 1..=8usize {
            for shards in 1..=4usize {
                for seed in 0..10u64 {
                    let mut rng = fastrand::Rng::with_seed(seed * 1000 + (capacity * 10 + shards) as u64);
                    let sizes: Vec<usize> = (0..4).map(|_| rng.usize(0..=3)).collect();
                    let floors: Vec<usize> = (0..4).map(|_| rng.usize(0..=2)).collect();
                    let mut yaml = String::from("classes:\n");
                    for (c, name) in ["bulk", "default", "interactive", "system"].iter().enumerate() {
                        yaml += &format!("  {name}: {{reserved_floor: {}, queue_size: {}, queue_timeout_secs: 5, starvation_threshold_secs: 60, can_preempt: false}}\n", floors[c], sizes[c]);
                    }
                    let c = cfg(&yaml);
                    let (txs, rxs): (Vec<_>, Vec<_>) = (0..shards).map(|_| flume::unbounded::<SchedMsg>()).unzip();
                    let s: Vec<Rc<RefCell<Scheduler>>> = (0..shards)
                        .map(|me| {
                            let peers = (0..shards).filter(|&i| i != me).map(|i| (i, txs[i].clone())).collect();
                            let sc = Rc::new(RefCell::new(Scheduler::new(Rc::clone(&c), me, shards, peers)));
                            sc.borrow_mut().observe_capacity(1, || capacity);
                            sc
                        })
                        .collect();
                    let reserved = |s: &[Rc<RefCell<Scheduler>>]| -> [usize; 4] {
                        let mut r = [0; 4];
                        for x in s {
                            for (k, v) in x.borrow().reserved.iter().enumerate() {
                                r[k] += v;
                            }
                        }
                        r
                    };
                    let reserved_at_start = reserved(&s);
                    let mut held: Vec<Slot> = Vec::new();
                    let mut waiting: Vec<Ticket> = Vec::new();
                    for _ in 0..300 {
                        match rng.u8(0..5) {
                            0 => match Scheduler::admit(&s[rng.usize(0..shards)], Class::ALL[rng.usize(0..4)]) {
                                Admission::Now(slot) => held.push(slot),
                                Admission::Queued(t) => waiting.push(t),
                                Admission::Full => {}
                            },
                            1 if !held.is_empty() => drop(held.swap_remove(rng.usize(0..held.len()))),
                            2 if !waiting.is_empty() => drop(waiting.swap_remove(rng.usize(0..waiting.len()))),
                            3 => s[rng.usize(0..shards)].borrow_mut().tick(),
                            _ => {
                                let i = rng.usize(0..shards);
                                if let Ok(m) = rxs[i].try_recv() {
                                    s[i].borrow_mut().on_message(m);
                                }
                            }
                        }
                        let mut k = 0;
                        while k < waiting.len() {
                            if waiting[k].waiter.state.get() == Wait::Granted {
                                held.push(waiting.swap_remove(k).into_slot());
                            } else {
                                k += 1;
                            }
                        }
                        assert!(held.len() <= capacity, "{} hold slots of {capacity} on {shards} shards", held.len());
                        for class in Class::ALL {
                            let q: usize = s.iter().map(|x| x.borrow().live(class)).sum();
                            assert!(q <= sizes[class.index()], "{q} {class:?} queued, size {}", sizes[class.index()]);
                        }
                    }
                    waiting.clear();
                    held.clear();
                    loop {
                        let mut moved = false;
                        for (i, rx) in rxs.iter().enumerate() {
                            while let Ok(m) = rx.try_recv() {
                                s[i].borrow_mut().on_message(m);
                                moved = true;
                            }
                        }
                        if !moved {
                            break;
                        }
                    }
                    let cap: isize = s.iter().map(|x| x.borrow().cap).sum();
                    assert_eq!(
                        cap, capacity as isize,
                        "a slot was lost or made (C={capacity}, {shards} shards, seed {seed})"
                    );
                    assert_eq!(reserved(&s), reserved_at_start, "a reserved slot was lost or made (seed {seed})");
                    for class in Class::ALL {
                        let places: usize = s.iter().map(|x| x.borrow().places[class.index()]).sum();
                        assert_eq!(
                            places,
                            sizes[class.index()],
                            "a {class:?} queue place was lost or made (seed {seed})"
                        );
                    }
                }
            }
        }
    }
}
