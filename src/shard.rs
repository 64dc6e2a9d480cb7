//! One shard: the state a pinned reactor owns (upstream pools, routing tables, load counts,
//! the Snapshot cache, the clock for `Date`) behind methods. Everything here is
//! single-threaded (Rc/Cell/RefCell), so sharing it with another core by accident fails to
//! compile. What crosses cores arrives as a [`ShardMsg`] and leaves with `try_send`.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::task::Waker;
use std::time::Instant;

use smallvec::SmallVec;

use crate::access_log::{AccessLog, Entry};
use crate::admission::pd::PdPools;
use crate::admission::permits::{Permits, Pool as PermitPool, PoolMsg};
use crate::admission::priority::config::SLOTS_PER_UNREPORTED_WORKER;
use crate::admission::priority::{SchedMsg, Scheduler};
use crate::budget::shard::ShardBudgets;
use crate::config::Config;
use crate::http::date::{DateCache, LEN as DATE_LEN};
use crate::http::pool::{Pool, UpstreamConn};
use crate::kv::index::{BlockIndex, KvUpdate};
use crate::kv::keys::request_keys;
use crate::kv::prompt_ids::prompt_ids;
use crate::metrics::{Finished, ShardMetrics, ShardReport};
use crate::routing::{Candidate, Digest, RouteError, RouteInput, ShardRouter};
use crate::trace::{ShardTraces, SpanRecord};
use crate::workers::breaker::Verdict;
use crate::workers::control::ControlMsg;
use crate::workers::{Registry, Snapshot, WorkerId};

/// Messages into a shard's bounded inbox: from the control thread, and cache-aware insert
/// digests from peer shards. Always sent with `try_send`, never awaited on a request path.
#[derive(Debug, Clone)]
pub enum ShardMsg {
    /// Stop accepting; finish in-flight requests within the grace period; exit. With
    /// `handover` (a binary upgrade: the listening sockets live on in the successor) also
    /// wait for idle keep-alive clients to send their next request, which is answered with
    /// `connection: close`, so no client ever finds its connection closed under it.
    Drain { handover: bool },
    /// A peer's recent cache-aware inserts, replayed into this shard's trees.
    Digest(Arc<Digest>),
    /// A peer's cache-aware inserts among prefill workers.
    PrefillDigest(Arc<Digest>),
    /// A peer's in-flight requests per worker id, as of its last tick.
    Loads { shard: usize, loads: Arc<[usize]> },
    /// The metrics listener wants this shard's report.
    Scrape(flume::Sender<ShardReport>),
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

/// In-flight requests per worker id: this shard's own, each peer's last report, and their
/// sum. The sum is kept current on every change so a routing decision reads one number per
/// worker, not one per shard (with 1,000 workers the per-request sum showed as +5.8 µs of
/// user CPU per request). Peers' counts are at most one tick old: the gateway's load
/// without a counter shared between cores.
#[derive(Default)]
struct Loads {
    own: Vec<usize>,
    peers: Vec<Arc<[usize]>>,
    /// What this shard last reported, so an unchanged load is not sent again.
    reported: Arc<[usize]>,
    total: Vec<usize>,
}

impl Loads {
    fn add(&mut self, worker: WorkerId, delta: isize) {
        let i = worker.index();
        for table in [&mut self.own, &mut self.total] {
            if table.len() <= i {
                table.resize(i + 1, 0);
            }
            table[i] = table[i].saturating_add_signed(delta);
        }
    }

    /// A peer's new report replaces its last one in the totals.
    fn apply_peer(&mut self, peer: usize, loads: Arc<[usize]>) {
        let Some(slot) = self.peers.get_mut(peer) else { return };
        if self.total.len() < loads.len() {
            self.total.resize(loads.len(), 0);
        }
        for (w, t) in self.total.iter_mut().enumerate() {
            let old = slot.get(w).copied().unwrap_or(0);
            let new = loads.get(w).copied().unwrap_or(0);
            *t = (*t + new).saturating_sub(old);
        }
        *slot = loads;
    }
}

pub struct Shard {
    index: usize,
    cfg: Arc<Config>,
    snapshot: RefCell<SnapshotCache>,
    pool: Pool,
    /// gRPC workers: one multiplexed h2 connection each.
    grpc: crate::grpc::conn::Channels,
    loads: RefCell<Loads>,
    router: RefCell<ShardRouter>,
    /// Prefill workers' routing state: picked beside a decode worker, by `--prefill-policy`.
    prefill_router: RefCell<ShardRouter>,
    peers: Vec<flume::Sender<ShardMsg>>,
    rng: RefCell<fastrand::Rng>,
    date: DateCache,
    /// Requests between head and the end of their response; drain waits for zero.
    inflight: Cell<usize>,
    /// Open client connections, against this shard's share of `--max-connections`.
    connections: Cell<usize>,
    /// Connections whose first request head has not arrived yet: a drain waits a moment for
    /// them (they may have been accepted from the backlog as it began).
    unread: Cell<usize>,
    /// The accept loop, parked while the shard is at its connection cap.
    accept_waiter: Cell<Option<Waker>>,
    draining: Cell<bool>,
    /// The drain hands the listeners to a successor (see ShardMsg::Drain).
    handover: Cell<bool>,
    /// Cancels the pending accept when the drain starts.
    accept_cancel: RefCell<monoio::io::Canceller>,
    /// To the control thread: connect failures, outcomes and loads, admin requests.
    control: flume::Sender<ControlMsg>,
    /// Outcomes per worker since the last report (the breakers' input). Failures are sent
    /// at once, so a breaker opens within one message; successes wait for the tick.
    outcomes: RefCell<Vec<(WorkerId, Verdict)>>,
    /// What the control thread last got of this shard's loads.
    control_loads: RefCell<Arc<[usize]>>,
    /// The Snapshot generation the pool was last pruned for.
    pruned_for: Cell<u64>,
    /// Ticks run: each one gossips, so a peer that has seen a later tick's report has its
    /// digests and loads (`smg_shard_ticks_total`).
    ticks: Cell<u64>,
    /// This shard's share of the admission permits (None without `--max-concurrent-requests`).
    permits: Option<Rc<RefCell<Permits>>>,
    /// This shard's share of the prefill/decode pairs' per-worker pools.
    pd_pools: PdPools,
    /// What the engines' KV-cache events say each worker holds (kv/), as the events thread
    /// told this shard.
    kv: RefCell<BlockIndex>,
    /// The tokenizer HTTP requests are matched with (`--tokenizer-path`), from the events
    /// thread once loaded.
    prompt_tokenizer: RefCell<Option<Arc<crate::tokenizer::Tokenizer>>>,
    /// Its encodings of the conversations' earlier turns (`tokenizer/segment_cache.rs`).
    prompt_segments: RefCell<crate::tokenizer::segment_cache::SegmentCache>,
    /// What this shard just routed by the events, held for `--selection-accounting-ttl-ms`.
    bookings: RefCell<Option<crate::kv::bookings::Bookings>>,
    /// The priority scheduler (None without `--priority-scheduler-enabled`).
    scheduler: Option<Rc<RefCell<Scheduler>>>,
    /// None with `--prometheus-port 0`.
    metrics: Option<ShardMetrics>,
    access: AccessLog,
    heartbeats: Heartbeats,
    traces: Option<ShardTraces>,
    /// Tenant budgets: this shard's leased allowances (None: no tenant rate limits).
    budgets: Option<Rc<ShardBudgets>>,
    /// The Responses API's stored responses and conversations (src/responses/store/).
    history: crate::responses::store::History,
    mcp: crate::responses::mcp::Mcp,
}

/// A shard's channels to its peers: the bounded inbox (digests, loads, drain; may drop) and
/// the unbounded admission channels (never drop: a lost message would be a lost permit or
/// slot). One admission kind is on at a time: permits, or the scheduler that replaces them.
pub struct Peers {
    pub inboxes: Vec<flume::Sender<ShardMsg>>,
    /// (peer shard index, its permit channel: the admission permits and the PD pools)
    pub permits: Vec<(usize, flume::Sender<PoolMsg>)>,
    /// (peer shard index, its scheduler channel)
    pub sched: Vec<(usize, flume::Sender<SchedMsg>)>,
    /// The access log writer (None: access log off).
    pub access_log: Option<flume::Sender<Vec<u8>>>,
    pub heartbeats: Heartbeats,
    /// The trace exporter (None: tracing off).
    pub traces: Option<flume::Sender<Vec<SpanRecord>>>,
    /// The tenant budget owner (None: no tenant rate limits).
    pub budget_owner: Option<flume::Sender<crate::budget::owner::BudgetMsg>>,
    /// The Responses API's storage thread.
    pub history: crate::responses::store::History,
    /// The MCP thread (the Responses API's MCP tools).
    pub mcp: crate::responses::mcp::Mcp,
}

/// How often a long-lived session looks for the drain.
pub const DRAIN_LOOK: std::time::Duration = std::time::Duration::from_secs(1);

// === impl Shard ===

impl Shard {
    pub fn new(
        index: usize,
        cfg: Arc<Config>,
        registry: Registry,
        control: flume::Sender<ControlMsg>,
        peers: Peers,
    ) -> Self {
        let mut cache = arc_swap::Cache::new(registry);
        let local = LocalSnapshot(Rc::new(Arc::clone(cache.load())));
        let seed = (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ std::process::id() as u64;
        let loads = Loads { peers: vec![Arc::from(Vec::new()); cfg.cores], ..Loads::default() };
        let (permits, scheduler) = match (&cfg.admission, &cfg.priority) {
            (_, Some(p)) => {
                let s = Scheduler::new(Rc::new(p.clone()), index, cfg.cores, peers.sched);
                (None, Some(Rc::new(RefCell::new(s))))
            }
            (Some(a), None) => {
                let p = Permits::new(PermitPool::Admission, a, index, cfg.cores, peers.permits.clone());
                (Some(Rc::new(RefCell::new(p))), None)
            }
            (None, None) => (None, None),
        };
        let pd_pools = PdPools::new(cfg.pd_admission, index, cfg.cores, peers.permits);
        Shard {
            index,
            pool: Pool::new(cfg.pool_idle_timeout),
            grpc: Default::default(),
            snapshot: RefCell::new(SnapshotCache { cache, local }),
            loads: RefCell::new(loads),
            router: RefCell::new(ShardRouter::new(&cfg.routing, index, cfg.cores)),
            prefill_router: RefCell::new(ShardRouter::new(&cfg.prefill_routing, index, cfg.cores)),
            peers: peers.inboxes,
            rng: RefCell::new(fastrand::Rng::with_seed(seed)),
            date: DateCache::default(),
            inflight: Cell::new(0),
            connections: Cell::new(0),
            unread: Cell::new(0),
            accept_waiter: Cell::new(None),
            draining: Cell::new(false),
            handover: Cell::new(false),
            accept_cancel: RefCell::new(monoio::io::Canceller::new()),
            control,
            outcomes: RefCell::new(Vec::new()),
            control_loads: RefCell::new(Arc::from(Vec::new())),
            pruned_for: Cell::new(0),
            ticks: Cell::new(0),
            permits,
            pd_pools,
            kv: RefCell::new(BlockIndex::default()),
            prompt_tokenizer: RefCell::new(None),
            prompt_segments: RefCell::default(),
            bookings: RefCell::new(crate::kv::bookings::Bookings::new(cfg.routing.selection_accounting_ttl)),
            scheduler,
            metrics: cfg.metrics.as_ref().map(|m| ShardMetrics::new(&m.buckets)),
            access: AccessLog::new(peers.access_log, cfg.log_json),
            heartbeats: peers.heartbeats,
            traces: peers.traces.map(ShardTraces::new),
            budgets: match (&cfg.budgets, peers.budget_owner) {
                (Some(b), Some(owner)) => Some(Rc::new(ShardBudgets::new(Arc::clone(b), owner, cfg.cores))),
                _ => None,
            },
            history: peers.history,
            mcp: peers.mcp,
            cfg,
        }
    }

    // --- metrics and the access log ---

    /// Anything to count or log at `finish`.
    pub fn accounting(&self) -> bool {
        self.metrics.is_some() || self.access.enabled() || self.traces.is_some()
    }

    pub fn tracing(&self) -> bool {
        self.traces.is_some()
    }

    pub fn record_span(&self, s: SpanRecord) {
        if let Some(t) = &self.traces {
            t.record(s);
        }
    }

    pub fn record(&self, f: &Finished<'_>) {
        if let Some(m) = &self.metrics {
            m.record(f);
        }
    }

    pub fn access_line(&self, e: &Entry<'_>, now: Instant) {
        let dropped = self.access.write(e, now);
        self.count_dropped(dropped);
    }

    fn count_dropped(&self, n: u64) {
        if let Some(m) = &self.metrics {
            for _ in 0..n {
                m.access_log_dropped();
            }
        }
    }

    fn report(&self) -> ShardReport {
        ShardReport {
            shard: self.index,
            ticks: self.ticks.get(),
            counts: self.metrics.as_ref().map(|m| m.snapshot()).unwrap_or_default(),
            inflight: self.inflight.get(),
            worker_loads: self.loads.borrow().own.clone(),
            router: self.router.borrow().stats(),
            spans_dropped: self.traces.as_ref().map_or(0, |t| t.dropped()),
            budget: self.budgets.as_ref().map(|b| b.counts.get()),
            scheduler: self.scheduler.as_ref().map(|s| s.borrow().by_class()),
            admission: self.permits.as_ref().map(|p| {
                let p = p.borrow();
                (p.queued(), p.free())
            }),
            kv: self.kv.borrow().per_worker(),
        }
    }

    /// This shard's admission permits, when admission is limited.
    pub fn budgets(&self) -> Option<&Rc<ShardBudgets>> {
        self.budgets.as_ref()
    }

    pub fn permits(&self) -> Option<&Rc<RefCell<Permits>>> {
        self.permits.as_ref()
    }

    /// The prefill/decode pairs' per-worker pools.
    pub fn pd_pools(&self) -> &PdPools {
        &self.pd_pools
    }

    /// A peer's permit message, for the admission permits or a PD pool.
    pub fn on_permit_message(&self, m: PoolMsg) {
        match m.pool {
            PermitPool::Admission => {
                if let Some(p) = &self.permits {
                    p.borrow_mut().on_message(m.msg);
                }
            }
            _ => self.pd_pools.on_message(m),
        }
    }

    /// A peer's scheduler message.
    pub fn on_sched_message(&self, msg: SchedMsg) {
        // Judged against the current capacity, as the sender's was.
        if let Some(s) = self.scheduler() {
            s.borrow_mut().on_message(msg);
        }
    }

    /// The priority scheduler, when on; its capacity follows the current Snapshot.
    pub fn scheduler(&self) -> Option<&Rc<RefCell<Scheduler>>> {
        let s = self.scheduler.as_ref()?;
        let snap = self.snapshot();
        s.borrow_mut().observe_capacity(snap.generation, || capacity(&snap));
        Some(s)
    }

    pub fn index(&self) -> usize {
        self.index
    }

    pub fn cfg(&self) -> &Config {
        &self.cfg
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
        self.rng.borrow_mut().u64(..)
    }

    /// The `Date` header value for this second.
    pub fn date(&self) -> [u8; DATE_LEN] {
        self.date.get()
    }

    // --- routing ---

    /// Picks one of `candidates` by this shard's policy state; loads are filled in here.
    pub fn pick(
        &self,
        input: &RouteInput<'_>,
        snap: &Snapshot,
        positions: &[usize],
        now: Instant,
    ) -> Result<Choice, RouteError> {
        self.pick_by(&self.router, input, snap, positions, now)
    }

    /// Picks one of the prefill workers at `positions`, by the prefill policy's state.
    pub fn pick_prefill(
        &self,
        input: &RouteInput<'_>,
        snap: &Snapshot,
        positions: &[usize],
        now: Instant,
    ) -> Result<Choice, RouteError> {
        self.pick_by(&self.prefill_router, input, snap, positions, now)
    }

    fn pick_by(
        &self,
        router: &RefCell<ShardRouter>,
        input: &RouteInput<'_>,
        snap: &Snapshot,
        positions: &[usize],
        now: Instant,
    ) -> Result<Choice, RouteError> {
        let mut cands = SmallVec::new();
        self.candidates(snap, positions, &mut cands);
        // A request under a LoRA adapter (or salt) is not in the base model's blocks.
        let kv_ids = input.tokens.filter(|_| input.namespace.is_none());
        if let Some(tokens) = kv_ids {
            self.kv_prefixes(tokens, snap, positions, &mut cands, now);
        }
        let index = router.borrow_mut().pick_versioned(input, &cands, snap.generation, now)?;
        if let (Some(tokens), Some(_)) = (kv_ids, cands[index].cached) {
            self.book(tokens, snap.workers[positions[index]].id, now);
        }
        Ok(Choice { index, cached: cands[index].cached })
    }

    /// `--selection-accounting-ttl-ms`: `tokens`' blocks count as held by `worker` (its events
    /// flow) until its events catch up or the TTL passes.
    fn book(&self, tokens: &[u32], worker: crate::workers::WorkerId, now: Instant) {
        let mut bookings = self.bookings.borrow_mut();
        let Some(b) = bookings.as_mut() else { return };
        let Some(bs) = self.kv.borrow().live(worker) else { return };
        let mut keys = Vec::new();
        request_keys(tokens, bs as usize, 0, &mut keys);
        b.book(worker, &keys, now);
    }

    /// On the stack for up to eight workers, filled where it is kept: a heap allocation per
    /// request cost more than the pick (mimalloc's malloc and free were 10% of the gateway's
    /// user time under `perf`, for about eleven allocations a request), and a list returned
    /// by value was copied whole (callgrind).
    fn candidates<'s>(&self, snap: &'s Snapshot, positions: &[usize], out: &mut SmallVec<[Candidate<'s>; 8]>) {
        let loads = self.loads.borrow();
        out.extend(positions.iter().map(|&p| {
            let w = &snap.workers[p];
            Candidate {
                url: &w.url.url,
                load: loads.total.get(w.id.index()).copied().unwrap_or(0),
                engine_load: w.engine_load,
                cached: None,
            }
        }));
    }

    /// An HTTP request's token ids as its engine will compute them, when they can be matched:
    /// a tokenizer is loaded and one of the workers at `positions` sends KV-cache events.
    /// None otherwise (nothing is parsed: a fleet without events pays nothing).
    pub fn prompt_ids(
        &self,
        field: crate::routing::TextSource,
        body: &[u8],
        snap: &Snapshot,
        positions: &[usize],
    ) -> Option<Vec<u32>> {
        let kv = self.kv.borrow();
        if !kv.any_live() || !positions.iter().any(|&p| kv.live(snap.workers[p].id).is_some()) {
            return None;
        }
        drop(kv);
        // Borrowed, not cloned: an Arc's count is a cache line every shard would write.
        let tk = self.prompt_tokenizer.borrow();
        prompt_ids(tk.as_ref()?, field, body, &mut self.prompt_segments.borrow_mut())
    }

    /// Fills in the prefix of `tokens` each candidate's engine holds by its KV-cache events
    /// (the candidates whose events flow; one key chain per block size among them).
    fn kv_prefixes(
        &self,
        tokens: &[u32],
        snap: &Snapshot,
        positions: &[usize],
        cands: &mut [Candidate<'_>],
        now: Instant,
    ) {
        let kv = self.kv.borrow();
        let bookings = self.bookings.borrow();
        if !kv.any_live() {
            return;
        }
        let live: Vec<(usize, crate::workers::WorkerId, u32)> = positions
            .iter()
            .enumerate()
            .filter_map(|(i, &p)| kv.live(snap.workers[p].id).map(|bs| (i, snap.workers[p].id, bs)))
            .collect();
        let (mut keys, mut ids, mut out) = (Vec::new(), Vec::new(), Vec::new());
        let mut sizes: Vec<u32> = live.iter().map(|l| l.2).collect();
        sizes.sort_unstable();
        sizes.dedup();
        for bs in sizes {
            // The base model's namespace: a LoRA's blocks never serve it.
            request_keys(tokens, bs as usize, 0, &mut keys);
            ids.clear();
            ids.extend(live.iter().filter(|l| l.2 == bs).map(|l| l.1));
            kv.prefixes(&keys, &ids, &mut out);
            for (l, &blocks) in live.iter().filter(|l| l.2 == bs).zip(&out) {
                let blocks = bookings.as_ref().map_or(blocks, |b| b.extend(l.1, &keys, blocks, now));
                cands[l.0].cached = Some(blocks * bs as usize);
            }
        }
    }

    /// Changes from the KV-cache events thread.
    pub fn on_kv_update(&self, u: &KvUpdate) {
        if let Some(tk) = &u.tokenizer {
            *self.prompt_tokenizer.borrow_mut() = Some(Arc::clone(tk));
        }
        let mut kv = self.kv.borrow_mut();
        for &(worker, change) in &u.changes {
            kv.apply(worker, change);
        }
    }

    /// Requests this shard counts against `worker` now.
    pub fn load_of(&self, worker: WorkerId) -> usize {
        self.loads.borrow().total.get(worker.index()).copied().unwrap_or(0)
    }

    /// Counts a request against `worker` until the guard drops.
    pub fn hold_load(self: &Rc<Self>, worker: WorkerId) -> LoadGuard {
        self.loads.borrow_mut().add(worker, 1);
        LoadGuard { shard: Rc::clone(self), worker }
    }

    // --- upstream connections ---

    pub fn take_conn(&self, worker: WorkerId) -> Option<UpstreamConn> {
        self.pool.take(worker, crate::clock::now())
    }

    pub fn put_conn(&self, worker: WorkerId, conn: UpstreamConn) {
        self.pool.put(worker, conn, crate::clock::now())
    }

    /// The gRPC connections (one per gRPC worker).
    pub fn grpc(&self) -> &crate::grpc::conn::Channels {
        &self.grpc
    }

    /// A pooled connection to `worker` proved stale: its siblings are dropped too.
    pub fn forget_conns(&self, worker: WorkerId) {
        self.pool.clear(worker)
    }

    /// Asks the control thread to re-probe a worker we could not connect to.
    pub fn report_connect_failed(&self, worker: WorkerId) {
        let _ = self.control.send(ControlMsg::ConnectFailed(worker));
    }

    /// One finished attempt's verdict on its worker, for the breakers and the admin API's
    /// counts. A failure is reported at once (with what was pending, in order).
    pub fn record_outcome(&self, worker: WorkerId, v: Verdict) {
        self.outcomes.borrow_mut().push((worker, v));
        if v == Verdict::Failure {
            self.report_to_control(false);
        }
    }

    /// Hands the control thread the pending outcomes, and the loads when they changed and
    /// `with_loads`.
    fn report_to_control(&self, with_loads: bool) {
        let loads = with_loads
            .then(|| {
                let l = self.loads.borrow();
                (**self.control_loads.borrow() != *l.own).then(|| Arc::<[usize]>::from(l.own.as_slice()))
            })
            .flatten();
        let outcomes = std::mem::take(&mut *self.outcomes.borrow_mut());
        if outcomes.is_empty() && loads.is_none() {
            return;
        }
        if let Some(l) = &loads {
            *self.control_loads.borrow_mut() = Arc::clone(l);
        }
        // Unbounded: an outcome is never dropped, and at most one message per tick plus one
        // per failure is sent.
        let _ = self.control.send(ControlMsg::Report { shard: self.index, outcomes, loads });
    }

    /// The Responses API's storage.
    pub(crate) fn history(&self) -> &crate::responses::store::History {
        &self.history
    }

    /// The MCP thread.
    pub(crate) fn mcp(&self) -> &crate::responses::mcp::Mcp {
        &self.mcp
    }

    /// A message for the control thread that carries its own reply channel.
    pub fn tell_control(&self, m: ControlMsg) {
        let _ = self.control.send(m);
    }

    /// An admin request for the control thread; the answer comes back on the channel.
    pub fn ask_control(
        &self,
        req: crate::workers::admin::AdminRequest,
    ) -> flume::Receiver<crate::workers::admin::AdminReply> {
        let (tx, rx) = flume::bounded(1);
        let _ = self.control.send(ControlMsg::Admin { req, reply: tx });
        rx
    }

    // --- life cycle ---

    /// Counts a request in flight until the guard drops (drain waits for zero).
    pub fn begin_request(self: &Rc<Self>) -> InflightGuard {
        self.inflight.set(self.inflight.get() + 1);
        InflightGuard(Rc::clone(self))
    }

    pub fn inflight(&self) -> usize {
        self.inflight.get()
    }

    pub fn is_draining(&self) -> bool {
        self.draining.get()
    }

    /// Stops accepting: cancels the pending accept (an accept the kernel already completed
    /// still comes back, and is served) and wakes an accept loop parked at the cap.
    pub fn start_drain(&self) {
        self.draining.set(true);
        let c = std::mem::take(&mut *self.accept_cancel.borrow_mut());
        drop(c.cancel());
        self.wake_accept();
    }

    /// Resolves within [`DRAIN_LOOK`] of the shard's drain: a session that may outlive any
    /// request (a WebSocket) ends itself then, instead of holding the drain to its grace
    /// period. A timer per session, not a list of wakers: nothing to register or clean up,
    /// and a pending timer costs its session nothing per message.
    pub async fn drained(&self) {
        while !self.draining.get() {
            crate::io::sleep(DRAIN_LOOK).await;
        }
    }

    /// What the accept loop passes to `cancelable_accept`.
    pub fn accept_handle(&self) -> monoio::io::CancelHandle {
        self.accept_cancel.borrow().handle()
    }

    pub fn hands_over(&self) -> bool {
        self.handover.get()
    }

    /// Open client connections on this shard.
    pub fn connections(&self) -> usize {
        self.connections.get()
    }

    /// This shard's share of `--max-connections`.
    fn connection_cap(&self) -> usize {
        self.cfg.max_connections.div_ceil(self.cfg.cores).max(1)
    }

    /// A connection slot, if the shard is below its cap.
    pub fn open_connection(self: &Rc<Self>) -> Option<ConnectionSlot> {
        if self.connections.get() >= self.connection_cap() {
            return None;
        }
        self.connections.set(self.connections.get() + 1);
        Some(ConnectionSlot(Rc::clone(self)))
    }

    /// A connection taken from the backlog while the shard drains: over the cap if need be,
    /// since closing it unread would reset it (the backlog bounds how many there are).
    pub(crate) fn open_connection_in_drain(self: &Rc<Self>) -> ConnectionSlot {
        self.connections.set(self.connections.get() + 1);
        ConnectionSlot(Rc::clone(self))
    }

    /// Counts a connection as unread until the guard drops (its first head arrived, or it
    /// closed).
    pub(crate) fn unread_connection(self: &Rc<Self>) -> UnreadGuard {
        self.unread.set(self.unread.get() + 1);
        UnreadGuard(Rc::clone(self))
    }

    /// Connections that have not sent their first request head yet.
    pub(crate) fn unread(&self) -> usize {
        self.unread.get()
    }

    /// The second unit of the cap a WebSocket session holds, for its worker socket (so the
    /// cap counts the descriptors a session holds: two). Granted only below three quarters
    /// of the shard's share: the last quarter stays for connections that are not sessions,
    /// so a flood of sessions is refused while `/health` and requests are still accepted.
    pub(crate) fn open_session_unit(self: &Rc<Self>) -> Option<ConnectionSlot> {
        let cap = self.connection_cap();
        if self.connections.get() >= cap - cap / 4 {
            return None;
        }
        self.connections.set(self.connections.get() + 1);
        Some(ConnectionSlot(Rc::clone(self)))
    }

    /// Resolves when a connection slot is free or the shard drains.
    pub async fn slot_free(&self) {
        std::future::poll_fn(|cx| {
            if self.connections.get() < self.connection_cap() || self.draining.get() {
                std::task::Poll::Ready(())
            } else {
                self.accept_waiter.set(Some(cx.waker().clone()));
                std::task::Poll::Pending
            }
        })
        .await
    }

    fn wake_accept(&self) {
        if let Some(w) = self.accept_waiter.take() {
            w.wake();
        }
    }

    // --- messages and ticks ---

    /// Applies one inbox message; false means drain.
    pub fn on_message(&self, msg: ShardMsg) -> bool {
        match msg {
            ShardMsg::Digest(d) => self.router.borrow_mut().apply_digest(&d),
            ShardMsg::PrefillDigest(d) => self.prefill_router.borrow_mut().apply_digest(&d),
            ShardMsg::Loads { shard, loads } => self.loads.borrow_mut().apply_peer(shard, loads),
            ShardMsg::Scrape(reply) => {
                let _ = reply.try_send(self.report());
            }
            ShardMsg::Drain { handover } => {
                self.handover.set(handover);
                return false;
            }
        }
        true
    }

    /// Periodic work: every tick, hand peers this shard's digest and loads; about once a
    /// second (`slow`), sweep idle pooled connections and age routing state.
    pub fn tick(&self, slow: bool) {
        let now = crate::clock::now();
        self.ticks.set(self.ticks.get() + 1);
        self.heartbeats.beat(self.index);
        self.date.refresh();
        self.gossip();
        self.report_to_control(true);
        self.prune_pool();
        if let Some(b) = &self.budgets {
            b.tick();
        }
        let dropped = self.access.flush();
        self.count_dropped(dropped);
        if let Some(t) = &self.traces {
            t.flush();
        }
        if let Some(s) = self.scheduler() {
            s.borrow_mut().tick();
        }
        if slow {
            self.pool.sweep(now);
            self.router.borrow_mut().tick(now);
            self.prefill_router.borrow_mut().tick(now);
        }
    }

    /// Closes pooled connections to workers the Snapshot no longer has.
    fn prune_pool(&self) {
        let snap = self.snapshot();
        if snap.generation != self.pruned_for.get() {
            self.pruned_for.set(snap.generation);
            self.pool.retain(|id| snap.worker(id).is_some());
            self.grpc.retain(|id| snap.worker(id).is_some());
        }
    }

    /// Sends this shard's recent cache-aware inserts, and its per-worker in-flight counts when
    /// they changed, to every peer. A full peer inbox drops the message for that peer: routing
    /// quality degrades a little, nothing blocks.
    fn gossip(&self) {
        if self.peers.is_empty() {
            return;
        }
        let changed = {
            let l = self.loads.borrow();
            *l.reported != *l.own
        };
        if changed {
            let loads: Arc<[usize]> = Arc::from(self.loads.borrow().own.as_slice());
            for p in &self.peers {
                let _ = p.try_send(ShardMsg::Loads { shard: self.index, loads: Arc::clone(&loads) });
            }
            self.loads.borrow_mut().reported = loads;
        }
        if let Some(d) = self.router.borrow_mut().take_digest() {
            let d = Arc::new(d);
            for p in &self.peers {
                let _ = p.try_send(ShardMsg::Digest(Arc::clone(&d)));
            }
        }
        if let Some(d) = self.prefill_router.borrow_mut().take_digest() {
            let d = Arc::new(d);
            for p in &self.peers {
                let _ = p.try_send(ShardMsg::PrefillDigest(Arc::clone(&d)));
            }
        }
    }
}

/// The priority scheduler's capacity: Σ over routable workers of `max_running_requests`,
/// [`SLOTS_PER_UNREPORTED_WORKER`] for one that reports none (0: no routable worker).
fn capacity(snap: &Snapshot) -> usize {
    snap.workers
        .iter()
        .filter(|w| w.healthy && !w.meta.role.is_prefill())
        .map(|w| w.max_running.map_or(SLOTS_PER_UNREPORTED_WORKER, |n| n.min(1 << 20) as usize))
        .sum()
}

/// Shard liveness for the systemd watchdog: each shard stamps its slot on every tick (every
/// 100 ms, off the request path).
#[derive(Clone)]
pub struct Heartbeats {
    start: std::time::Instant,
    slots: Arc<Vec<std::sync::atomic::AtomicU64>>,
}

impl Heartbeats {
    pub fn new(shards: usize) -> Self {
        Self {
            start: crate::clock::now(),
            slots: Arc::new((0..shards).map(|_| std::sync::atomic::AtomicU64::new(0)).collect()),
        }
    }

    fn beat(&self, i: usize) {
        if let Some(s) = self.slots.get(i) {
            s.store(self.start.elapsed().as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Every shard ticked within `limit`.
    pub fn all_within(&self, limit: std::time::Duration) -> bool {
        let now = self.start.elapsed().as_millis() as u64;
        self.slots
            .iter()
            .all(|s| now.saturating_sub(s.load(std::sync::atomic::Ordering::Relaxed)) <= limit.as_millis() as u64)
    }
}

/// What the router chose: the candidate's index, and the prompt tokens its engine holds by
/// its KV-cache events (None: it sends none, or the request had no ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub index: usize,
    pub cached: Option<usize>,
}

/// A request's count on one worker's load, released when the request finishes.
pub struct LoadGuard {
    shard: Rc<Shard>,
    worker: WorkerId,
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.shard.loads.borrow_mut().add(self.worker, -1);
    }
}

/// A request between its head and the end of its response, for drain.
pub struct InflightGuard(Rc<Shard>);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.inflight.set(self.0.inflight.get() - 1);
    }
}

/// A connection before its first request head (see [`Shard::unread_connection`]).
pub(crate) struct UnreadGuard(Rc<Shard>);

impl Drop for UnreadGuard {
    fn drop(&mut self) {
        self.0.unread.set(self.0.unread.get() - 1);
    }
}

/// An open client connection's place under the cap; freeing it wakes a parked accept.
pub struct ConnectionSlot(Rc<Shard>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections.set(self.0.connections.get() - 1);
        self.0.wake_accept();
    }
}
