//! The owner's link to Redis, and what it does when Redis is away.
//!
//! Connected: every lease and every batch of deltas is one script call on the shared
//! buckets. When a call fails the owner logs it once, serves from its own buckets (the same
//! rule, per replica), and keeps what it grants and settles meanwhile; a background task
//! reconnects every second, and on reconnect that spending is applied to Redis as one batch
//! of deltas (debt the tenant pays back from the shared refill) and the local buckets start
//! over. So an outage errs toward serving: for its length each replica admits up to the
//! whole budget on its own (at most N× the budget with N replicas), and the shared budget
//! is charged for it afterwards.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::redis_store::RedisStore;
use super::store::{Delta, Lease, LeaseAnswer, LeaseAsk, LocalStore, ScopeLimits};

pub struct Remote {
    url: String,
    conn: Option<RedisStore>,
    /// A reconnect in progress hands its connection over here.
    reconnected: Option<flume::Receiver<RedisStore>>,
    /// Spent (granted and settled) while Redis was away, per scope.
    away: HashMap<String, (ScopeLimits, i64, i64)>,
    down_since: Option<Instant>,
}

// === impl Remote ===

impl Remote {
    pub async fn start(url: String) -> Remote {
        let mut r = Remote { url, conn: None, reconnected: None, away: HashMap::new(), down_since: None };
        match RedisStore::connect(&r.url).await {
            Ok(c) => {
                crate::info!("tenant budgets shared through {}", r.url);
                r.conn = Some(c);
            }
            Err(e) => r.lost(&e),
        }
        r
    }

    pub async fn lease(&mut self, asks: &[LeaseAsk], local: &mut LocalStore) -> Lease {
        self.poll_reconnect(local).await;
        if let Some(c) = &mut self.conn {
            match c.lease(asks).await {
                Ok(l) => return l,
                Err(e) => self.lost(&e),
            }
        }
        let l = local.lease(asks, crate::clock::now());
        if l.answer == LeaseAnswer::Granted {
            for (a, (t, r)) in asks.iter().zip(&l.granted) {
                self.spent(&a.key, a.limits, *t as i64, *r as i64);
            }
        }
        l
    }

    pub async fn apply(&mut self, deltas: Vec<Delta>, local: &mut LocalStore) {
        self.poll_reconnect(local).await;
        if let Some(c) = &mut self.conn {
            match c.apply(&deltas).await {
                Ok(()) => return,
                Err(e) => self.lost(&e),
            }
        }
        local.apply(&deltas, crate::clock::now());
        for d in &deltas {
            self.spent(&d.key, d.limits, d.tokens, d.requests);
        }
    }

    fn spent(&mut self, key: &str, limits: ScopeLimits, tokens: i64, requests: i64) {
        let e = self.away.entry(key.to_string()).or_insert((limits, 0, 0));
        e.1 += tokens;
        e.2 += requests;
    }

    fn lost(&mut self, why: &str) {
        self.conn = None;
        if self.down_since.is_none() {
            self.down_since = Some(crate::clock::now());
            crate::error!("tenant budgets: Redis at {} unreachable ({why}); serving from this replica's own budget until it is back", self.url);
        }
        if self.reconnected.is_none() {
            let (tx, rx) = flume::bounded(1);
            let url = self.url.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if let Ok(c) = RedisStore::connect(&url).await {
                        let _ = tx.send_async(c).await;
                        return;
                    }
                }
            });
            self.reconnected = Some(rx);
        }
    }

    /// Takes a finished reconnect, and hands Redis what was spent while it was away.
    async fn poll_reconnect(&mut self, local: &mut LocalStore) {
        let Some(rx) = &self.reconnected else { return };
        let Ok(mut c) = rx.try_recv() else { return };
        self.reconnected = None;
        let owed: Vec<Delta> = self
            .away
            .drain()
            .map(|(key, (limits, tokens, requests))| Delta { key, limits, tokens, requests })
            .collect();
        match c.apply(&owed).await {
            Ok(()) => {
                let gone = self.down_since.take().map(|t| t.elapsed()).unwrap_or_default();
                crate::info!(
                    "tenant budgets: Redis at {} is back after {gone:?}; {} scopes reconciled",
                    self.url,
                    owed.len()
                );
                *local = LocalStore::default();
                self.conn = Some(c);
            }
            Err(e) => {
                for d in owed {
                    self.spent(&d.key, d.limits, d.tokens, d.requests);
                }
                self.lost(&e);
            }
        }
    }
}
