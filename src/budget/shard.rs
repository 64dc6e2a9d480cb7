//! A shard's side of tenant budgets: a local allowance per scope, leased from the owner,
//! spent by requests without asking anyone; settles and idle allowance go back in one batch
//! per tick.
//!
//! Exactness: the owner debits a lease from the bucket when it grants it, so a shard can
//! never admit what the bucket did not hold. What a design like this can get wrong is
//! bounded as follows (shards S, budget B tokens/min, chunk B/(400·S) per lease):
//! - over-admission: only settles above their reservation (a response longer than its
//!   estimate) not yet reported, at most one tick (100 ms) of such excess; with the estimate
//!   holding `max_tokens` there is none, since a response cannot be longer;
//! - under-admission: allowance held on other shards, at most 2 chunks each (idle allowance
//!   goes back after one tick unused, a busy shard's beyond 2 chunks every tick), so
//!   2·S·B/(400·S) = B/200 (0.5%). Refunds are spendable at once on the shard that got them.
//!
//! At 2 shards and 100,000 tokens/min that is at most 500 tokens (0.5%) under, and no over.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use super::config::BudgetConfig;
use super::owner::BudgetMsg;
use super::store::{Delta, LeaseAnswer, LeaseAsk, ScopeLimits};

/// Longest wait for a lease; past it the request is admitted (the owner is stuck: fail open).
const LEASE_WITHIN: Duration = Duration::from_secs(1);
/// Tenants whose scopes a shard keeps made.
const SCOPE_CACHE_MAX: usize = 4096;
/// A lease asks for this fraction of the scope's per-minute budget beyond the request's need.
const CHUNK_DIVISOR: u64 = 400;

/// What a lease asks for beyond the request's need, of a per-minute figure.
fn chunk(per_minute: u64, shards: u64) -> u64 {
    (per_minute / (CHUNK_DIVISOR * shards)).max(1)
}

struct Allowance {
    tokens: u64,
    requests: u64,
    limits: ScopeLimits,
    used: bool,
}

pub struct ShardBudgets {
    cfg: Arc<BudgetConfig>,
    owner: flume::Sender<BudgetMsg>,
    shards: u64,
    allowances: RefCell<HashMap<Rc<str>, Allowance>>,
    /// Settles since the last tick.
    pending: RefCell<Vec<Delta>>,
    /// Tenant → its scopes, for policies without model rules.
    scope_cache: RefCell<HashMap<Rc<str>, Rc<[Scope]>>>,
    pub counts: std::cell::Cell<BudgetCounts>,
}

/// What this shard's budgets did, for the metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct BudgetCounts {
    pub admitted: u64,
    pub denied: u64,
    /// Lease requests to the owner, and batches of deltas sent to it.
    pub leases: u64,
    pub reports: u64,
}

/// A scope a reservation debited.
#[derive(Debug, Clone)]
struct Scope {
    key: Rc<str>,
    limits: ScopeLimits,
}

/// A request's reservation: settled at `finish` against the worker's reported usage; left
/// unsettled (dropped), the estimate stands as the charge.
pub struct Reservation {
    budgets: Rc<ShardBudgets>,
    scopes: Rc<[Scope]>,
    estimate: u64,
}

/// Why a reservation was refused: whole seconds until it could fit, None when never.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denied {
    pub retry_after_secs: Option<u64>,
}

// === impl ShardBudgets ===

impl ShardBudgets {
    pub fn new(cfg: Arc<BudgetConfig>, owner: flume::Sender<BudgetMsg>, shards: usize) -> Self {
        ShardBudgets {
            cfg,
            owner,
            shards: shards.max(1) as u64,
            allowances: RefCell::new(HashMap::new()),
            pending: RefCell::new(Vec::new()),
            scope_cache: RefCell::new(HashMap::new()),
            counts: std::cell::Cell::new(BudgetCounts::default()),
        }
    }

    /// The scopes a request of `tenant` for `model` debits. A policy without model rules
    /// depends on the tenant alone: its scopes are made once per tenant and shared, so a
    /// request allocates nothing here.
    fn scopes(&self, tenant: &str, model: &str) -> Rc<[Scope]> {
        if let Some(s) = self.scope_cache.borrow().get(tenant) {
            return Rc::clone(s);
        }
        let p = self.cfg.policy(tenant);
        let mut v = vec![Scope { key: Rc::from(tenant), limits: p.limits }];
        if let Some(r) = p.rule_for(model) {
            v.push(Scope { key: Rc::from(format!("{tenant}#{}", r.id)), limits: r.limits });
        }
        let v: Rc<[Scope]> = Rc::from(v);
        let mut cache = self.scope_cache.borrow_mut();
        // Bounded: a trusted tenant header can name any number of tenants.
        if p.rules.is_empty() && cache.len() < SCOPE_CACHE_MAX {
            cache.insert(Rc::clone(&v[0].key), Rc::clone(&v));
        }
        v
    }

    /// Debits `estimate` tokens and one request from every scope of the request, leasing
    /// from the owner when this shard's allowance is short.
    pub async fn reserve(self: &Rc<Self>, tenant: &str, model: &str, estimate: u64) -> Result<Reservation, Denied> {
        let scopes = self.scopes(tenant, model);
        if !self.take_local(&scopes, estimate) {
            let asks: Vec<LeaseAsk> = scopes
                .iter()
                .map(|s| {
                    let chunk_t = chunk(s.limits.tokens_per_minute, self.shards);
                    let chunk_r = chunk(s.limits.requests_per_minute, self.shards);
                    LeaseAsk {
                        key: s.key.to_string(),
                        limits: s.limits,
                        need_tokens: estimate,
                        want_tokens: estimate + chunk_t,
                        need_requests: 1,
                        want_requests: chunk_r.max(1),
                    }
                })
                .collect();
            let (tx, rx) = flume::bounded(1);
            self.count(|c| c.leases += 1);
            let sent = self.owner.send(BudgetMsg::Lease { asks, reply: tx }).is_ok();
            let answer = if sent {
                monoio::select! {
                    r = rx.recv_async() => r.ok(),
                    _ = crate::io::sleep(LEASE_WITHIN) => None,
                }
            } else {
                None
            };
            match answer {
                Some(lease) if lease.answer == LeaseAnswer::Granted => {
                    let mut a = self.allowances.borrow_mut();
                    for (s, (t, r)) in scopes.iter().zip(&lease.granted) {
                        let e = a.entry(Rc::clone(&s.key)).or_insert(Allowance {
                            tokens: 0,
                            requests: 0,
                            limits: s.limits,
                            used: true,
                        });
                        e.tokens += t;
                        e.requests += r;
                    }
                    drop(a);
                    let took = self.take_local(&scopes, estimate);
                    debug_assert!(took, "a granted lease covers its need");
                }
                Some(lease) => {
                    let LeaseAnswer::Denied { retry_after_secs } = lease.answer else { unreachable!() };
                    self.count(|c| c.denied += 1);
                    return Err(Denied { retry_after_secs });
                }
                None => crate::warn!("tenant budgets: no lease within {LEASE_WITHIN:?}; admitting {tenant}"),
            }
        }
        self.count(|c| c.admitted += 1);
        Ok(Reservation { budgets: Rc::clone(self), scopes, estimate })
    }

    fn count(&self, f: impl FnOnce(&mut BudgetCounts)) {
        let mut c = self.counts.get();
        f(&mut c);
        self.counts.set(c);
    }

    /// Spends from the local allowance if every scope has enough.
    fn take_local(&self, scopes: &[Scope], tokens: u64) -> bool {
        let mut a = self.allowances.borrow_mut();
        let enough = scopes.iter().all(|s| a.get(&s.key).is_some_and(|x| x.tokens >= tokens && x.requests >= 1));
        if enough {
            for s in scopes {
                let x = a.get_mut(&s.key).expect("checked");
                x.tokens -= tokens;
                x.requests -= 1;
                x.used = true;
            }
        }
        enough
    }

    /// Once per tick: settles, and allowance unused since the last tick, go to the owner.
    pub fn tick(&self) {
        let mut deltas = std::mem::take(&mut *self.pending.borrow_mut());
        let shards = self.shards;
        self.allowances.borrow_mut().retain(|key, x| {
            if std::mem::take(&mut x.used) {
                // A busy scope keeps about a chunk; refunds beyond twice that go back, so
                // budget does not pile up on one shard while another is refused.
                let chunk = chunk(x.limits.tokens_per_minute, shards);
                if x.tokens > 2 * chunk {
                    let extra = x.tokens - chunk;
                    x.tokens = chunk;
                    deltas.push(Delta { key: key.to_string(), limits: x.limits, tokens: -(extra as i64), requests: 0 });
                }
                return true;
            }
            if x.tokens > 0 || x.requests > 0 {
                deltas.push(Delta {
                    key: key.to_string(),
                    limits: x.limits,
                    tokens: -(x.tokens as i64),
                    requests: -(x.requests as i64),
                });
            }
            false
        });
        if !deltas.is_empty() {
            self.count(|c| c.reports += 1);
            let _ = self.owner.send(BudgetMsg::Report(deltas));
        }
    }
}

// === impl Reservation ===

impl Reservation {
    /// Trues the reservation up to what the worker reported (prompt + completion tokens).
    pub fn settle(self, actual: u64) {
        let delta = actual as i64 - self.estimate as i64;
        if delta == 0 {
            return;
        }
        // A refund goes straight back to this shard's allowance (the bucket gave those
        // tokens out already), so it is spendable at once; a response that used more than
        // its estimate is debt for the owner, sent with the tick.
        let mut a = self.budgets.allowances.borrow_mut();
        let mut p = self.budgets.pending.borrow_mut();
        for s in self.scopes.iter() {
            match a.get_mut(&s.key) {
                Some(x) if delta < 0 => x.tokens += delta.unsigned_abs(),
                _ => p.push(Delta { key: s.key.to_string(), limits: s.limits, tokens: delta, requests: 0 }),
            }
        }
    }

    pub fn estimate(&self) -> u64 {
        self.estimate
    }
}
