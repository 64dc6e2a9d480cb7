//! What every load thread shares: the request pool, counters, and the one-request step that measures and records.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use monoio::time::Instant;

use crate::load::chain::{response_id, Chain, Users};
use crate::load::client::{ClientError, Conn};
use crate::load::records::Records;
use crate::load::report::Stats;

/// Counters the main thread reads for the live progress line.
#[derive(Default)]
pub struct Progress {
    pub done: AtomicU64,
    pub errors: AtomicU64,
}

/// One thread's share of the work.
#[derive(Clone)]
pub struct ThreadPlan {
    pub addr: SocketAddr,
    pub requests: Arc<Vec<Bytes>>,
    pub thread_index: usize,
    pub threads: usize,
    /// Stop issuing after this long (None: until `count`).
    pub duration: Option<Duration>,
    /// Stop after issuing this many requests on this thread.
    pub count: Option<u64>,
    /// Requests whose clock starts earlier than this after start are not recorded.
    pub warmup: Duration,
    pub timeout: Duration,
    pub parse_usage: bool,
    pub progress: Arc<Progress>,
    /// Set by another thread to end an open-ended run (failover keeps load up while it works).
    pub stop: Option<Arc<AtomicBool>>,
    /// Keep a row per measured request (`--report`).
    pub record: bool,
    /// A chained scenario's turns: requests are built per send, off the answers (load/chain.rs),
    /// and `requests` is not sent.
    pub chain: Option<Arc<Chain>>,
}

/// Per-thread run state.
pub struct Ctx {
    pub plan: ThreadPlan,
    pub stats: RefCell<Stats>,
    pub records: RefCell<Records>,
    pub started: Instant,
    pub measure_from: Instant,
    pub stop_at: Option<Instant>,
    /// This thread's virtual users, for a chained scenario.
    users: Option<Users>,
    next: Cell<usize>,
    issued: Cell<u64>,
    last_done: Cell<Instant>,
}

// === impl Ctx ===

impl Ctx {
    pub fn new(plan: ThreadPlan) -> Self {
        let started = Instant::now();
        Self {
            measure_from: started + plan.warmup,
            stop_at: plan.duration.map(|d| started + plan.warmup + d),
            stats: RefCell::new(Stats::default()),
            records: RefCell::new(Records::new(plan.record)),
            started,
            users: plan.chain.clone().map(|c| Users::new(c, plan.thread_index, plan.threads)),
            next: Cell::new(0),
            issued: Cell::new(0),
            last_done: Cell::new(started),
            plan,
        }
    }

    /// Claims the next request to send, or None when the run is over (time or count).
    pub fn claim(&self, at: Instant) -> Option<usize> {
        if self.stop_at.is_some_and(|s| at >= s) {
            return None;
        }
        if self.plan.stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed)) {
            return None;
        }
        let issued = self.issued.get();
        if self.plan.count.is_some_and(|c| issued >= c) {
            return None;
        }
        self.issued.set(issued + 1);
        // Thread t takes t, t+T, t+2T…: together the threads walk the pool in order, which
        // keeps multi-turn conversations in turn order.
        let n = self.next.get();
        self.next.set(n + 1);
        let len = self.plan.requests.len().max(1);
        Some((n * self.plan.threads + self.plan.thread_index) % len)
    }

    /// Position in the whole run (all threads) of the request this thread claims next: its index
    /// in the pool before wrapping, which is how a trace finds its send time.
    pub fn next_global(&self) -> usize {
        self.next.get() * self.plan.threads + self.plan.thread_index
    }

    /// Seconds of the measured window (from the end of warm-up to the last completion).
    pub fn measured_secs(&self) -> f64 {
        let last = self.last_done.get();
        if last > self.measure_from {
            (last - self.measure_from).as_secs_f64()
        } else {
            0.0
        }
    }

    /// Sends request `idx` on `conn` and records it against `origin`, the time its clock started
    /// (the intended send time in open loop, so queueing delay counts). A chained scenario
    /// sends its next user's turn instead of request `idx`, and hands the user back with the
    /// answer's id.
    pub async fn send_one(&self, conn: &mut Conn, origin: Instant, idx: usize) {
        let turn = self.users.as_ref().map(|u| {
            let user = u.take();
            let req = u.chain().request(&user);
            (user, req)
        });
        let req = match &turn {
            Some((_, req)) => req,
            None => &self.plan.requests[idx],
        };
        let res = monoio::time::timeout(self.plan.timeout, conn.exchange(req)).await;
        let now = Instant::now();
        self.last_done.set(now);
        let latency_us = (now - origin).as_micros() as u64;
        let record = origin >= self.measure_from;
        let start_us = if record { (origin - self.measure_from).as_micros() as u64 } else { 0 };
        let failed = match res {
            Ok(Ok(ex)) => {
                let ok = (200..300).contains(&ex.status) && !ex.stream_broken;
                if record {
                    let ttft = ex.first_token.map(|t| (t.saturating_duration_since(origin)).as_micros() as u64);
                    self.stats.borrow_mut().record(&ex, latency_us, ttft, &conn.itl_us);
                    self.records.borrow_mut().response(start_us, &ex, latency_us, ttft, &conn.itl_us);
                }
                !ok
            }
            Ok(Err(e)) => {
                if record {
                    self.stats.borrow_mut().record_error(&e, latency_us);
                    self.records.borrow_mut().failure(start_us, Some(&e), latency_us);
                }
                if matches!(e, ClientError::Connect(_)) {
                    // A refused connect returns at once; do not spin on a dead target.
                    monoio::time::sleep(Duration::from_millis(1)).await;
                }
                true
            }
            Err(_) => {
                conn.reset();
                if record {
                    self.stats.borrow_mut().record_timeout(latency_us);
                    self.records.borrow_mut().failure(start_us, None, latency_us);
                }
                true
            }
        };
        if let (Some((user, _)), Some(users)) = (turn, &self.users) {
            let chained = user.previous.is_some();
            let id = if failed { None } else { response_id(conn.body()) };
            let cut_short = users.give_back(user, id);
            if record {
                let mut stats = self.stats.borrow_mut();
                let c = &mut stats.chain;
                if chained {
                    c.chained_turns += 1;
                } else {
                    c.first_turns += 1;
                }
                c.cut_short += u64::from(cut_short);
            }
        }
        self.plan.progress.done.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.plan.progress.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn add_connects(&self, n: u64) {
        self.stats.borrow_mut().connects += n;
    }
}
