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
use crate::workers::health::WorkerEvent;
use crate::workers::{Registry, Snapshot};

/// Control → shard messages (bounded inbox, never awaited on the request path).
#[derive(Debug, Clone, Copy)]
pub enum ShardMsg {
    /// Stop accepting; finish in-flight requests within the grace period; exit.
    Drain,
}

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
    /// In-flight requests per worker id on this shard (the policies' load signal).
    pub load: RefCell<Vec<usize>>,
    pub rr: Cell<usize>,
    rng: Cell<u64>,
    /// Requests between head and the end of their response; drain waits for zero.
    pub inflight: Cell<usize>,
    /// Open client connections (tests read it through leak checks on the process).
    pub connections: Cell<usize>,
    pub draining: Cell<bool>,
    pub events: flume::Sender<WorkerEvent>,
}

// === impl Shard ===

impl Shard {
    pub fn new(index: usize, cfg: Arc<Config>, registry: Registry, events: flume::Sender<WorkerEvent>) -> Self {
        let mut cache = arc_swap::Cache::new(registry);
        let local = LocalSnapshot(Rc::new(Arc::clone(cache.load())));
        let seed = (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ std::process::id() as u64;
        Shard {
            index,
            pool: Pool::new(cfg.pool_idle_timeout),
            cfg,
            snapshot: RefCell::new(SnapshotCache { cache, local }),
            load: RefCell::new(Vec::new()),
            rr: Cell::new(index),
            rng: Cell::new(seed | 1),
            inflight: Cell::new(0),
            connections: Cell::new(0),
            draining: Cell::new(false),
            events,
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

    /// xorshift64*: request ids and the random policy; quality is plenty for both.
    pub fn next_random(&self) -> u64 {
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn add_load(&self, worker: usize, delta: isize) {
        let mut l = self.load.borrow_mut();
        if l.len() <= worker {
            l.resize(worker + 1, 0);
        }
        l[worker] = l[worker].saturating_add_signed(delta);
    }

    /// Accepts until drained, then waits for in-flight requests (bounded by the grace period).
    pub async fn serve(self: Rc<Self>, listener: TcpListener, inbox: flume::Receiver<ShardMsg>) {
        let sweeper = {
            let shard = Rc::clone(&self);
            monoio::spawn(async move {
                loop {
                    monoio::time::sleep(Duration::from_secs(1)).await;
                    shard.pool.sweep();
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
        drop(sweeper);
    }
}

pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let opts = ListenerOpts::new().reuse_port(true).reuse_addr(true).backlog(4096);
    TcpListener::bind_with_config(addr, &opts)
}
