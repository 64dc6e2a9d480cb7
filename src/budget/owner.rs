//! The budget owner: one thread for the whole gateway that grants shards their leases and
//! takes their batched deltas. With `--redis-url` the buckets live in Redis (shared by every
//! replica, one round-trip per lease or batch); while Redis is away the owner serves from
//! its own buckets and keeps what was spent, to hand to Redis when it is back.
//!
//! tokio runs here (off the data plane) for the Redis client.

use std::time::Duration;

use super::remote::Remote;
use super::store::{Delta, Lease, LeaseAsk, LocalStore};

/// Shards → owner.
pub enum BudgetMsg {
    Lease {
        asks: Vec<LeaseAsk>,
        reply: flume::Sender<Lease>,
    },
    /// Settles and returned allowance, batched per tick.
    Report(Vec<Delta>),
}

/// Starts the owner thread; shards send on the returned channel.
pub fn start(redis_url: Option<String>) -> flume::Sender<BudgetMsg> {
    let (tx, rx) = flume::unbounded::<BudgetMsg>();
    std::thread::Builder::new()
        .name("smg-budget".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build();
            match rt {
                Ok(rt) => rt.block_on(run(rx, redis_url)),
                Err(e) => crate::error!("budget owner: {e}"),
            }
        })
        .expect("spawn budget owner");
    tx
}

async fn run(rx: flume::Receiver<BudgetMsg>, redis_url: Option<String>) {
    let mut store = Store::new(redis_url).await;
    let mut swept = crate::clock::now();
    while let Ok(m) = rx.recv_async().await {
        match m {
            BudgetMsg::Lease { asks, reply } => {
                let lease = store.lease(&asks).await;
                let _ = reply.try_send(lease);
            }
            BudgetMsg::Report(deltas) => store.apply(deltas).await,
        }
        if swept.elapsed() > Duration::from_secs(60) {
            swept = crate::clock::now();
            store.sweep();
        }
    }
}

/// The buckets: in this process, or in Redis with this process's as the fallback.
struct Store {
    local: LocalStore,
    remote: Option<Remote>,
}

impl Store {
    async fn new(redis_url: Option<String>) -> Self {
        let remote = match redis_url {
            Some(url) => Some(Remote::start(url).await),
            None => None,
        };
        Store { local: LocalStore::default(), remote }
    }

    async fn lease(&mut self, asks: &[LeaseAsk]) -> Lease {
        match &mut self.remote {
            Some(r) => r.lease(asks, &mut self.local).await,
            None => self.local.lease(asks, crate::clock::now()),
        }
    }

    async fn apply(&mut self, deltas: Vec<Delta>) {
        if let Some(r) = &mut self.remote {
            r.apply(deltas, &mut self.local).await;
            return;
        }
        self.local.apply(&deltas, crate::clock::now());
    }

    fn sweep(&mut self) {
        // A bucket the owner has not touched for a minute has refilled: forget it (the
        // limits come with every ask, so nothing else is needed to rebuild it).
        // Two minutes refill even a bucket a full capacity in debt.
        self.local.sweep_idle(crate::clock::now(), Duration::from_secs(120));
    }
}
