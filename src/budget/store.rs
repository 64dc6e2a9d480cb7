//! Where a budget owner keeps the buckets: [`LocalStore`] in this process, or Redis (shared
//! by every gateway replica; see `redis_store.rs`). Both implement SMG's bucket: capacity =
//! the per-minute figure, continuous refill of capacity/60 per second, starting full; a
//! settle may take it below zero (debt), paid back by the refill.
//!
//! The owner asks for *leases*: all scopes of one request (tenant-global, and the matching
//! model rule) are granted together or not at all, each at least its `need` and at most its
//! `want` (the extra is the shard's local allowance, spent without asking).

use std::collections::HashMap;
use std::time::Instant;

/// A scope's configured limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScopeLimits {
    pub tokens_per_minute: u64,
    pub requests_per_minute: u64,
}

/// One scope of a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseAsk {
    /// `tenant` for the tenant-global scope, `tenant#rule_id` for a model rule.
    pub key: String,
    pub limits: ScopeLimits,
    pub need_tokens: u64,
    pub want_tokens: u64,
    pub need_requests: u64,
    pub want_requests: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAnswer {
    /// Per scope, in the order asked.
    Granted,
    /// Whole seconds until every scope could afford its need; None when one never can
    /// (the need is above the scope's capacity).
    Denied { retry_after_secs: Option<u64> },
}

/// What each scope got (empty when denied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub answer: LeaseAnswer,
    /// (tokens, requests) per scope, in the order asked.
    pub granted: Vec<(u64, u64)>,
}

/// A signed change to a scope: a settle (`tokens` > 0: the response used more than was
/// reserved) or a return of unspent allowance (negative figures give back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    pub key: String,
    pub limits: ScopeLimits,
    pub tokens: i64,
    pub requests: i64,
}

/// SMG's bucket, in tokens and requests.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    pub tokens: f64,
    pub requests: f64,
    pub at: Instant,
}

// === impl Bucket ===

impl Bucket {
    pub fn full(l: &ScopeLimits, now: Instant) -> Self {
        Bucket { tokens: l.tokens_per_minute as f64, requests: l.requests_per_minute as f64, at: now }
    }

    pub fn refill(&mut self, l: &ScopeLimits, now: Instant) {
        let secs = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + secs * l.tokens_per_minute as f64 / 60.0).min(l.tokens_per_minute as f64);
        self.requests = (self.requests + secs * l.requests_per_minute as f64 / 60.0).min(l.requests_per_minute as f64);
    }

    /// Seconds until this bucket holds `tokens` and `requests`; None if it never can.
    pub fn wait_for(&self, l: &ScopeLimits, tokens: u64, requests: u64) -> Option<f64> {
        if tokens > l.tokens_per_minute || requests > l.requests_per_minute {
            return None;
        }
        let short_t = (tokens as f64 - self.tokens).max(0.0);
        let short_r = (requests as f64 - self.requests).max(0.0);
        Some((short_t * 60.0 / l.tokens_per_minute as f64).max(short_r * 60.0 / l.requests_per_minute as f64))
    }
}

/// The rule both stores follow for one lease over refilled buckets.
pub fn lease_from(buckets: &mut [&mut Bucket], asks: &[LeaseAsk]) -> Lease {
    let mut wait: Option<f64> = Some(0.0);
    for (b, a) in buckets.iter().zip(asks) {
        wait = match (wait, b.wait_for(&a.limits, a.need_tokens, a.need_requests)) {
            (Some(w), Some(x)) => Some(w.max(x)),
            _ => None,
        };
    }
    match wait {
        Some(w) if w <= 0.0 => {
            let granted = buckets
                .iter_mut()
                .zip(asks)
                .map(|(b, a)| {
                    let t = (b.tokens.floor().max(0.0) as u64).clamp(a.need_tokens, a.want_tokens.max(a.need_tokens));
                    let r = (b.requests.floor().max(0.0) as u64)
                        .clamp(a.need_requests, a.want_requests.max(a.need_requests));
                    b.tokens -= t as f64;
                    b.requests -= r as f64;
                    (t, r)
                })
                .collect();
            Lease { answer: LeaseAnswer::Granted, granted }
        }
        w => Lease {
            answer: LeaseAnswer::Denied { retry_after_secs: w.map(|s| s.ceil().max(1.0) as u64) },
            granted: Vec::new(),
        },
    }
}

/// Buckets in this process: one gateway's budgets (and the fallback when Redis is away).
#[derive(Debug, Default)]
pub struct LocalStore {
    buckets: HashMap<String, Bucket>,
}

// === impl LocalStore ===

impl LocalStore {
    fn bucket(&mut self, key: &str, l: &ScopeLimits, now: Instant) -> &mut Bucket {
        let b = self.buckets.entry(key.to_string()).or_insert_with(|| Bucket::full(l, now));
        b.refill(l, now);
        b
    }

    pub fn lease(&mut self, asks: &[LeaseAsk], now: Instant) -> Lease {
        let mut taken: Vec<(String, Bucket)> =
            asks.iter().map(|a| (a.key.clone(), *self.bucket(&a.key, &a.limits, now))).collect();
        let mut refs: Vec<&mut Bucket> = taken.iter_mut().map(|(_, b)| b).collect();
        let lease = lease_from(&mut refs, asks);
        for (k, b) in taken {
            self.buckets.insert(k, b);
        }
        lease
    }

    pub fn apply(&mut self, deltas: &[Delta], now: Instant) {
        for d in deltas {
            let b = self.bucket(&d.key, &d.limits, now);
            b.tokens -= d.tokens as f64;
            b.requests -= d.requests as f64;
            b.tokens = b.tokens.min(d.limits.tokens_per_minute as f64);
            b.requests = b.requests.min(d.limits.requests_per_minute as f64);
        }
    }

    /// Forgets buckets untouched for `idle` (a minute refills any bucket: a new one, full,
    /// is the same).
    pub fn sweep_idle(&mut self, now: Instant, idle: std::time::Duration) {
        self.buckets.retain(|_, b| now.saturating_duration_since(b.at) < idle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const L: ScopeLimits = ScopeLimits { tokens_per_minute: 600, requests_per_minute: 60 };

    fn ask(key: &str, need: u64, want: u64) -> LeaseAsk {
        LeaseAsk {
            key: key.into(),
            limits: L,
            need_tokens: need,
            want_tokens: want,
            need_requests: 1,
            want_requests: 5,
        }
    }

    #[test]
    fn leases_all_or_nothing_and_says_how_long_to_wait() {
        let t = crate::clock::now();
        let mut s = LocalStore::default();
        let l = s.lease(&[ask("a", 100, 500)], t);
        assert_eq!((l.answer, l.granted), (LeaseAnswer::Granted, vec![(500, 5)]));
        let l = s.lease(&[ask("a", 100, 100), ask("a#r", 10, 10)], t);
        assert_eq!(l.granted, vec![(100, 5), (10, 5)], "both scopes");
        // 0 tokens left in "a": 10 tokens refill per second.
        let l = s.lease(&[ask("a", 25, 25)], t);
        assert_eq!(l.answer, LeaseAnswer::Denied { retry_after_secs: Some(3) });
        assert!(s.lease(&[ask("a", 601, 601)], t).answer == LeaseAnswer::Denied { retry_after_secs: None });
        let l = s.lease(&[ask("a", 25, 25)], t + Duration::from_secs(3));
        assert_eq!(l.answer, LeaseAnswer::Granted);
        // A settle above the reservation is debt; a return gives back.
        s.apply(&[Delta { key: "b".into(), limits: L, tokens: 700, requests: 0 }], t);
        assert_eq!(s.lease(&[ask("b", 1, 1)], t).answer, LeaseAnswer::Denied { retry_after_secs: Some(11) });
        s.apply(&[Delta { key: "b".into(), limits: L, tokens: -650, requests: 0 }], t);
        assert_eq!(s.lease(&[ask("b", 550, 550)], t).answer, LeaseAnswer::Granted);
    }
}
