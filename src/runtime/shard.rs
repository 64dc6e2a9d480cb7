//! One shard: the state a pinned reactor owns (listener, pools, routing state, counters)
//! and its accept loop. Everything here is single-threaded (Rc/Cell/RefCell), so sharing it
//! with another core by accident fails to compile.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use monoio::net::{ListenerOpts, TcpListener};

use crate::config::Config;
use crate::http::upstream::Pool;
use crate::routing::{Digest, ShardRouter};
use crate::workers::health::WorkerEvent;
use crate::workers::{Registry, Snapshot};

/// Messages into a shard's bounded inbox: from the control thread, and cache-aware insert
/// digests from peer shards. Always sent with `try_send`, never awaited on a request path.
#[derive(Debug, Clone)]
pub enum ShardMsg {
    /// Stop accepting; finish in-flight requests within the grace period; exit.
    Drain,
    /// A peer's recent cache-aware inserts, replayed into this shard's trees.
    Digest(Arc<Digest>),
    /// A peer's in-flight requests per worker id, as of its last tick.
    Loads { shard: usize, loads: Arc<[usize]> },
}

/// How often a shard hands its cache-aware inserts to its peers. A conversation's next turn
/// arrives seconds later, so 100 ms keeps every shard's tree current (see routing/cache_aware.rs).
const DIGEST_EVERY: Duration = Duration::from_millis(100);

/// A request's handle on the Snapshot. The extra Rc is the point: cloning it per request
/// touches only this core's memory, where cloning the Arc would bounce one refcount cache
/// line between every core on every request.
#[derive(Clone)]
pub struct LocalSnapshot(#[allow(clippy::redundant_allocation)] Rc<Arc<Snapshot>>);

impl std::ops::Deref for LocalSnapshot {
    type Target = Snapshot;
    fn deref(&self) -> &Snapshot {
        &self.0
    }
}

/// The shard-local view of the worker Snapshot: arc-swap's Cache reads the shared pointer
/// without writing to it, and requests clone a shard-local Rc, never the shared Arc.
struct SnapshotCache {
    cache: arc_swap::Cache<Registry, Arc<Snapshot>>,
    local: LocalSnapshot,
}

pub struct Shard {
    pub index: usize,
    pub cfg: Arc<Config>,
    snapshot: RefCell<SnapshotCache>,
    pub pool: Pool,
    /// In-flight requests per worker id on this shard.
    load: RefCell<Vec<usize>>,
    /// Each peer shard's last reported in-flight counts (indexed by shard; this shard's own
    /// slot stays empty). Routing sees own live counts plus these, at most one tick old: the
    /// gateway's load without a shared counter between cores.
    peer_loads: RefCell<Vec<Arc<[usize]>>>,
    /// What this shard last reported, so an unchanged load is not sent again.
    reported: RefCell<Arc<[usize]>>,
    /// Own live counts plus the peers' reports, kept up to date on every change so a
    /// routing decision reads one number per worker, not one per shard (with 1,000
    /// workers the per-request sum showed as +5.8 µs of user CPU per request).
    total: RefCell<Vec<usize>>,
    pub router: RefCell<ShardRouter>,
    peers: Vec<flume::Sender<ShardMsg>>,
    rng: Cell<u64>,
    /// Requests between head and the end of their response; drain waits for zero.
    pub inflight: Cell<usize>,
    pub draining: Cell<bool>,
    pub events: flume::Sender<WorkerEvent>,
}

// === impl Shard ===

impl Shard {
    pub fn new(
        index: usize,
        cfg: Arc<Config>,
        registry: Registry,
        events: flume::Sender<WorkerEvent>,
        peers: Vec<flume::Sender<ShardMsg>>,
    ) -> Self {
        let mut cache = arc_swap::Cache::new(registry);
        let local = LocalSnapshot(Rc::new(Arc::clone(cache.load())));
        let seed = (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ std::process::id() as u64;
        Shard {
            index,
            pool: Pool::new(cfg.pool_idle_timeout),
            snapshot: RefCell::new(SnapshotCache { cache, local }),
            load: RefCell::new(Vec::new()),
            peer_loads: RefCell::new(vec![Arc::from(Vec::new()); cfg.cores]),
            reported: RefCell::new(Arc::from(Vec::new())),
            total: RefCell::new(Vec::new()),
            router: RefCell::new(ShardRouter::new(&cfg.routing, index, cfg.cores)),
            peers,
            rng: Cell::new(seed | 1),
            inflight: Cell::new(0),
            draining: Cell::new(false),
            events,
            cfg,
        }
    }

    /// The current worker Snapshot.
    pub fn snapshot(&self) -> LocalSnapshot {
        let mut s = self.snapshot.borrow_mut();
        let SnapshotCache { cache, local } = &mut *s;
        let cur = cache.load();
        if !Arc::ptr_eq(cur, &local.0) {
            *local = LocalSnapshot(Rc::new(Arc::clone(cur)));
        }
        local.clone()
    }

    /// xorshift64*: request ids; quality is plenty for that.
    pub fn next_random(&self) -> u64 {
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// The gateway's in-flight requests per worker id: this shard's live counts plus every
    /// peer's last report. Borrowed for one routing decision.
    pub fn worker_loads(&self) -> std::cell::Ref<'_, Vec<usize>> {
        self.total.borrow()
    }

    pub fn add_load(&self, worker: usize, delta: isize) {
        for table in [&self.load, &self.total] {
            let mut l = table.borrow_mut();
            if l.len() <= worker {
                l.resize(worker + 1, 0);
            }
            l[worker] = l[worker].saturating_add_signed(delta);
        }
    }

    /// A peer's new in-flight report replaces its last one in the totals.
    fn apply_peer_loads(&self, peer: usize, loads: Arc<[usize]>) {
        let mut peers = self.peer_loads.borrow_mut();
        let Some(slot) = peers.get_mut(peer) else { return };
        let mut total = self.total.borrow_mut();
        if total.len() < loads.len() {
            total.resize(loads.len(), 0);
        }
        for (w, t) in total.iter_mut().enumerate() {
            let old = slot.get(w).copied().unwrap_or(0);
            let new = loads.get(w).copied().unwrap_or(0);
            *t = (*t + new).saturating_sub(old);
        }
        *slot = loads;
    }

    /// Accepts until drained, then waits for in-flight requests (bounded by the grace period).
    pub async fn serve(self: Rc<Self>, listener: TcpListener, inbox: flume::Receiver<ShardMsg>) {
        let ticker = {
            let shard = Rc::clone(&self);
            monoio::spawn(async move {
                let mut n = 0u32;
                loop {
                    monoio::time::sleep(DIGEST_EVERY).await;
                    shard.share_digest();
                    n += 1;
                    if n.is_multiple_of(10) {
                        shard.pool.sweep();
                        shard.router.borrow_mut().tick(std::time::Instant::now());
                    }
                }
            })
        };
        loop {
            monoio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _peer)) => {
                        let shard = Rc::clone(&self);
                        monoio::spawn(crate::http::server::serve_connection(shard, stream));
                    }
                    Err(e) => {
                        // EMFILE and friends: back off briefly instead of spinning.
                        crate::warn!("shard {}: accept failed: {e}", self.index);
                        monoio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
                msg = inbox.recv_async() => match msg {
                    Ok(ShardMsg::Digest(d)) => self.router.borrow_mut().apply_digest(&d),
                    Ok(ShardMsg::Loads { shard, loads }) => self.apply_peer_loads(shard, loads),
                    Ok(ShardMsg::Drain) | Err(_) => break,
                },
            }
        }
        drop(listener);
        self.draining.set(true);
        let deadline = std::time::Instant::now() + self.cfg.shutdown_grace;
        while self.inflight.get() > 0 && std::time::Instant::now() < deadline {
            monoio::time::sleep(Duration::from_millis(10)).await;
        }
        if self.inflight.get() > 0 {
            crate::warn!("shard {}: grace period over with {} requests in flight", self.index, self.inflight.get());
        }
        drop(ticker);
    }

    /// Sends this shard's recent cache-aware inserts, and its per-worker in-flight counts when
    /// they changed, to every peer. A full peer inbox drops the message for that peer: routing
    /// quality degrades a little, nothing blocks.
    fn share_digest(&self) {
        if self.peers.is_empty() {
            return;
        }
        let changed = **self.reported.borrow() != **self.load.borrow();
        if changed {
            let loads: Arc<[usize]> = Arc::from(self.load.borrow().as_slice());
            for p in &self.peers {
                let _ = p.try_send(ShardMsg::Loads { shard: self.index, loads: Arc::clone(&loads) });
            }
            *self.reported.borrow_mut() = loads;
        }
        let Some(d) = self.router.borrow_mut().take_digest() else { return };
        let d = Arc::new(d);
        for p in &self.peers {
            let _ = p.try_send(ShardMsg::Digest(Arc::clone(&d)));
        }
    }
}

pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let opts = ListenerOpts::new().reuse_port(true).reuse_addr(true).backlog(4096);
    TcpListener::bind_with_config(addr, &opts)
}
