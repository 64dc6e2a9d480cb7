//! The fleet: every registered worker with its health status, circuit breaker, load and
//! registration, owned by the control thread alone. Every change goes through a method
//! here, which says whether routing must see it; [`Fleet::snapshot`] is what shards get.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::breaker::{Breaker, BreakerConfig, BreakerState, Verdict};
use super::snapshot::{Runtime, Snapshot, Worker, WorkerMeta};
use super::status::{Health, Status, Thresholds};
use super::{WorkerId, WorkerUrl};
use crate::routing::EngineLoad;

/// How soon a worker that has begun passing its checks is checked again.
const CONFIRM: Duration = Duration::from_millis(100);

/// How the control thread looks after workers.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub health_interval: Duration,
    pub health_timeout: Duration,
    pub health_endpoint: String,
    pub thresholds: Thresholds,
    pub health_checks: bool,
    pub remove_unhealthy: bool,
    pub drain_settle: Duration,
    /// None: `--disable-circuit-breaker`.
    pub breaker: Option<BreakerConfig>,
    /// Poll `/v1/loads` this often (least_load or overload protection); None = never.
    pub load_interval: Option<Duration>,
    /// Overload protection's thresholds; None: `--disable-worker-overload-protection`.
    pub overload: Option<OverloadThresholds>,
    pub dp_aware: bool,
    pub shards: usize,
    /// gRPC workers' tokenizer, when the operator names one (`--tokenizer-path`/`--model-path`).
    pub tokenizer: crate::grpc::model::ModelSource,
    /// The gateway's own listeners (serving, metrics): no worker may be one of them.
    pub own_listeners: Vec<SocketAddr>,
}

/// SMG's overload rule: a worker is overloaded when its waiting requests (summed over its
/// ranks) or its KV token usage (their mean) reach these.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverloadThresholds {
    pub waiting: u64,
    pub token_usage: f64,
}

// === impl OverloadThresholds ===

impl OverloadThresholds {
    pub fn over(&self, l: &EngineLoad) -> bool {
        l.waiting >= self.waiting || l.token_usage.is_some_and(|u| u >= self.token_usage)
    }
}

/// What an operator (or `--worker-urls`) registers.
#[derive(Debug, Clone, Default)]
pub struct WorkerSpec {
    pub url: String,
    pub model_id: Option<String>,
    pub api_key: Option<crate::secret::Secret>,
    pub worker_type: String,
    /// A prefill worker's bootstrap port (SGLang pairs); None: the engine's default.
    pub bootstrap_port: Option<u16>,
    /// The engine's KV connector as registered (`NixlConnector`, `MooncakeConnector`, …):
    /// shown, not acted on (the prefill's runtime says how a pair is driven).
    pub kv_connector: Option<String>,
    /// Where an HTTP worker publishes its KV-cache events (ZMQ), if it does.
    pub kv_events: Option<crate::workers::kv_events_source::KvEventsSource>,
    pub runtime: Option<Runtime>,
    pub labels: Vec<(String, String)>,
    pub priority: u32,
    pub cost: f64,
    /// Per-worker health-check overrides.
    pub health_interval: Option<Duration>,
    pub health_disabled: Option<bool>,
    /// A cloud provider, as `POST /workers` names it (`"provider"`); else the URL's host
    /// says (`provider.rs`).
    pub provider: Option<super::provider::Provider>,
}

// === impl WorkerSpec ===

impl WorkerSpec {
    /// A worker given by URL alone, with SMG's defaults (priority 50, cost 1.0).
    pub fn from_url(url: &str) -> Self {
        WorkerSpec { url: url.to_string(), priority: 50, cost: 1.0, ..WorkerSpec::default() }
    }
}

/// One routable entry: a worker, or one rank of a data-parallel worker.
#[derive(Debug)]
pub struct Entry {
    pub id: WorkerId,
    /// The admin API's id (SMG's: a UUIDv7).
    pub uuid: String,
    /// The routed name (`base@rank` for a rank) with the base's address.
    pub url: WorkerUrl,
    /// Where probes go: the URL as registered.
    pub base: WorkerUrl,
    pub spec: WorkerSpec,
    pub model: Option<String>,
    pub runtime: Runtime,
    pub dp_rank: Option<u32>,
    pub dp_size: Option<u32>,
    pub max_running: Option<u64>,
    pub health: Health,
    pub breaker: Breaker,
    pub engine_load: Option<u64>,
    pub overloaded: bool,
    /// In-flight requests on each shard, as of its last report.
    pub inflight: Vec<usize>,
    /// Requests with an outcome (every verdict, 429 included).
    pub processed: u64,
    /// When it started draining (DELETE).
    pub draining_since: Option<Instant>,
    /// Discovery (model, runtime, data-parallel size) has succeeded.
    pub discovered: bool,
    pub next_probe: Instant,
    pub probing: bool,
    pub next_load_poll: Instant,
    pub created: std::time::SystemTime,
    /// What discovery found of a gRPC worker's model (None for HTTP workers).
    pub grpc: Option<Arc<crate::grpc::model::GrpcModel>>,
    /// A provider's models after `model`, as its `/v1/models` listed them.
    pub more_models: Vec<String>,
    /// An `https://` worker's way for shards to reach it (`egress/`).
    tls: Option<Arc<crate::egress::TlsRoute>>,
    meta: Arc<WorkerMeta>,
}

// === impl Entry ===

impl Entry {
    pub fn routable(&self) -> bool {
        self.health.status() == Status::Ready
            && self.model.is_some()
            && !matches!(self.breaker.state(), BreakerState::Open)
    }

    pub fn inflight_total(&self) -> usize {
        self.inflight.iter().sum()
    }

    fn refresh_meta(&mut self) {
        self.meta = Arc::new(WorkerMeta {
            runtime: self.runtime,
            labels: self.spec.labels.clone(),
            api_key: self.spec.api_key.clone(),
            dp_rank: self.dp_rank,
            grpc: self.grpc.clone(),
            role: super::snapshot::Role::of(&self.spec.worker_type, self.spec.bootstrap_port),
            kv_events: self.spec.kv_events.clone().map(Arc::new),
            provider: self.provider(),
            more_models: self.more_models.clone(),
            tls: self.tls.clone(),
        });
    }

    /// The cloud provider it is, if any: named at registration, or by its URL's host.
    pub fn provider(&self) -> Option<super::provider::Provider> {
        self.spec.provider.or(self.base.provider)
    }

    /// A provider is not health-checked (its API has no health endpoint, and a check with the
    /// stored key would be billed traffic); it is Ready once its models are known.
    fn health_checked(&self, cfg: &FleetConfig) -> bool {
        cfg.health_checks && !self.spec.health_disabled.unwrap_or(false) && self.provider().is_none()
    }

    /// When the next health check is due: Ready workers every interval, others every
    /// second (or the interval, if shorter) so a worker coming up is noticed soon, and one
    /// that has begun passing is confirmed within 100 ms (a gateway starting in front of
    /// live workers should not take S seconds to route).
    pub fn probe_every(&self, cfg: &FleetConfig) -> Duration {
        let interval = self.spec.health_interval.unwrap_or(cfg.health_interval);
        // A provider's only probe asks for its models, which its API bills and rate-limits:
        // a refused key is asked again at the interval, not every second.
        if self.health.status() == Status::Ready && self.discovered || self.provider().is_some() {
            interval
        } else if self.health.confirming() {
            interval.min(CONFIRM)
        } else {
            interval.min(Duration::from_secs(1))
        }
    }
}

/// What a health probe found.
#[derive(Debug, Clone, Default)]
pub struct ProbeResult {
    pub passed: bool,
    /// Set when discovery ran and succeeded.
    pub discovery: Option<Discovery>,
    /// The probe could not be made (this process is out of descriptors): nothing learned.
    pub skipped: bool,
}

#[derive(Debug, Clone, Default)]
pub struct Discovery {
    pub model: String,
    pub runtime: Runtime,
    pub dp_size: Option<u32>,
    pub max_running: Option<u64>,
    /// A gRPC worker's model: its tokenizer, context window and sampling defaults.
    pub grpc: Option<Arc<crate::grpc::model::GrpcModel>>,
    /// A provider's other models (its `/v1/models` after the first, which is `model`).
    pub more_models: Vec<String>,
}

/// Why a registration was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum RegisterError {
    Duplicate(WorkerId),
    BadUrl(String),
    /// The URL is one of the gateway's own listeners: every request would loop.
    OwnListener(String),
    /// [`MAX_WORKERS`] entries are registered already.
    Full,
}

/// Most entries (workers, or data-parallel ranks) the fleet holds. Every change rebuilds a
/// Snapshot of all of them for the shards, so the table is kept to a size where that stays
/// cheap; a registration past it is refused (503).
pub const MAX_WORKERS: usize = 16_384;

pub struct Fleet {
    pub cfg: FleetConfig,
    pub entries: Vec<Entry>,
    next_id: u32,
    generation: u64,
    /// Breaker transitions so far: (worker, from, to) → count.
    transitions: Vec<(String, BreakerState, BreakerState, u64)>,
    /// Health checks made: passed, failed.
    health_checks: [u64; 2],
    /// TLS to `https://` workers (`egress/`), started with the first of them.
    egress: Option<crate::egress::Egress>,
}

/// What the metrics listener shows of the fleet.
#[derive(Debug, Clone, Default)]
pub struct FleetStats {
    pub workers: Vec<WorkerStats>,
    pub transitions: Vec<(String, BreakerState, BreakerState, u64)>,
    pub health_checks: [u64; 2],
    /// model → overloaded workers.
    pub overloaded: Vec<(String, usize)>,
}

#[derive(Debug, Clone)]
pub struct WorkerStats {
    pub url: String,
    pub breaker: BreakerState,
    pub consecutive: u32,
    pub successes: u64,
    pub failures: u64,
}

// === impl Fleet ===

impl Fleet {
    pub fn new(cfg: FleetConfig) -> Self {
        Fleet {
            cfg,
            entries: Vec::new(),
            next_id: 0,
            generation: 0,
            transitions: Vec::new(),
            health_checks: [0; 2],
            egress: None,
        }
    }

    /// Each registered provider once (by base URL), in registration order.
    pub fn providers(&self) -> Vec<(WorkerUrl, super::provider::Provider)> {
        let mut out: Vec<(WorkerUrl, super::provider::Provider)> = Vec::new();
        for e in self.entries.iter().filter(|e| e.draining_since.is_none()) {
            if let Some(p) = e.provider().filter(|_| !out.iter().any(|(u, _)| u.url == e.base.url)) {
                out.push((e.base.clone(), p));
            }
        }
        out
    }

    /// The egress thread's loopback port for a TLS origin; the thread starts with the first.
    fn egress_port(&mut self, origin: &crate::egress::Origin) -> Result<SocketAddr, String> {
        if self.egress.is_none() {
            self.egress = Some(crate::egress::Egress::start()?);
        }
        self.egress.as_mut().map_or(Err(String::new()), |e| e.port(origin))
    }

    fn fresh_id(&mut self) -> WorkerId {
        let id = WorkerId(self.next_id);
        self.next_id += 1;
        id
    }

    pub fn get(&self, id: WorkerId) -> Option<&Entry> {
        self.entries.binary_search_by_key(&id, |e| e.id).ok().map(|i| &self.entries[i])
    }

    pub fn get_mut(&mut self, id: WorkerId) -> Option<&mut Entry> {
        self.entries.binary_search_by_key(&id, |e| e.id).ok().map(|i| &mut self.entries[i])
    }

    /// Registers a worker (Pending until its first health check passes, Ready at once with
    /// health checks off once discovery found its model).
    pub fn register(&mut self, spec: WorkerSpec, now: Instant) -> Result<WorkerId, RegisterError> {
        if self.entries.len() >= MAX_WORKERS {
            return Err(RegisterError::Full);
        }
        let mut url = WorkerUrl::parse(&spec.url).map_err(RegisterError::BadUrl)?;
        if let Some(origin) = &url.tls {
            url.addr = self.egress_port(origin).map_err(RegisterError::BadUrl)?;
        }
        if let Some(own) = self.cfg.own_listeners.iter().find(|own| is_listener(own, url.addr)) {
            return Err(RegisterError::OwnListener(format!(
                "worker URL '{}' is this gateway's own listener {own}: every request would come back to it",
                url.url
            )));
        }
        if let Some(e) = self.entries.iter().find(|e| e.base.url == url.url) {
            return Err(RegisterError::Duplicate(e.id));
        }
        let id = self.fresh_id();
        let entry = self.entry(id, url.clone(), url, spec, None, now);
        self.entries.push(entry);
        Ok(id)
    }

    fn entry(
        &self,
        id: WorkerId,
        url: WorkerUrl,
        base: WorkerUrl,
        spec: WorkerSpec,
        dp_rank: Option<u32>,
        now: Instant,
    ) -> Entry {
        // A cloud provider is an external runtime, however it was named.
        let provider = spec.provider.or(url.provider).is_some();
        let runtime = if provider { Runtime::External } else { spec.runtime.unwrap_or_default() };
        let tls = url.tls.as_ref().and_then(|o| self.egress.as_ref().map(|e| Arc::new(e.route(o))));
        let mut e = Entry {
            id,
            uuid: crate::uuid::uuid_v7(),
            url,
            base,
            model: spec.model_id.clone(),
            runtime,
            dp_rank,
            dp_size: None,
            max_running: None,
            health: Health::new(),
            breaker: Breaker::new(),
            engine_load: None,
            overloaded: false,
            inflight: vec![0; self.cfg.shards],
            processed: 0,
            draining_since: None,
            discovered: false,
            next_probe: now,
            probing: false,
            next_load_poll: now,
            created: std::time::SystemTime::now(),
            grpc: None,
            more_models: Vec::new(),
            tls,
            meta: Arc::default(),
            spec,
        };
        e.refresh_meta();
        e
    }

    /// Applies a probe's result; true when routing must see the change.
    pub fn on_probe(&mut self, id: WorkerId, r: ProbeResult, now: Instant) -> bool {
        let cfg = self.cfg.clone();
        let Some(e) = self.get_mut(id) else { return false };
        e.probing = false;
        if r.skipped {
            e.next_probe = now + Duration::from_secs(1);
            return false;
        }
        let before = e.routable();
        if let Some(d) = r.discovery {
            e.discovered = true;
            if e.spec.model_id.is_none() {
                e.model = Some(d.model.clone());
            }
            if e.spec.runtime.is_none() {
                e.runtime = d.runtime;
            }
            e.dp_size = d.dp_size;
            e.max_running = d.max_running;
            e.grpc = d.grpc;
            e.more_models = d.more_models;
            e.refresh_meta();
        }
        let checked = e.health_checked(&cfg);
        let passed = r.passed && e.discovered;
        if checked {
            self.health_checks[usize::from(!passed)] += 1;
        }
        let Some(e) = self.get_mut(id) else { return false };
        let changed = if checked {
            e.health.record(passed, &cfg.thresholds)
        } else if e.discovered {
            e.health.set(Status::Ready)
        } else {
            None
        };
        if let Some(s) = changed {
            log_status(e, s);
        }
        e.next_probe = now + e.probe_every(&cfg);
        let expand = cfg.dp_aware && e.dp_rank.is_none() && e.dp_size.is_some_and(|n| n > 1);
        let remove = cfg.remove_unhealthy && e.health.status() == Status::Failed;
        let after = e.routable();
        if expand {
            self.expand_ranks(id, now);
            return true;
        }
        if remove {
            crate::warn!("worker {}: failed its health checks; removed (--remove-unhealthy-workers)", self.url_of(id));
            self.entries.retain(|e| e.id != id);
            return true;
        }
        before != after
    }

    /// `--dp-aware`: a worker that reported `dp_size` N becomes N routable ranks
    /// `url@0…url@N-1`, each with an id of its own; probes go to the shared base URL.
    fn expand_ranks(&mut self, id: WorkerId, now: Instant) {
        let Some(pos) = self.entries.iter().position(|e| e.id == id) else { return };
        let base = self.entries.remove(pos);
        let n = base.dp_size.unwrap_or(1);
        for rank in 0..n {
            let rid = self.fresh_id();
            let mut url = base.base.clone();
            url.url = format!("{}@{rank}", base.base.url);
            let mut e = self.entry(rid, url, base.base.clone(), base.spec.clone(), Some(rank), now);
            e.model.clone_from(&base.model);
            e.runtime = base.runtime;
            e.dp_size = base.dp_size;
            e.max_running = base.max_running;
            e.grpc.clone_from(&base.grpc);
            e.discovered = true;
            e.health = base.health.clone();
            e.next_probe = base.next_probe;
            e.refresh_meta();
            self.entries.push(e);
        }
        crate::info!("worker {}: data-parallel, registered as {n} ranks", base.base.url);
    }

    /// The URL whose health decides entry `id` (ranks share their base's).
    fn url_of(&self, id: WorkerId) -> String {
        self.get(id).map(|e| e.url.url.clone()).unwrap_or_default()
    }

    /// Applies outcomes from a shard; true when routing must see a change.
    pub fn on_outcomes(&mut self, outcomes: &[(WorkerId, Verdict)], now: Instant) -> bool {
        let breaker = self.cfg.breaker;
        let mut changed = false;
        for &(id, v) in outcomes {
            let Some(e) = self.get_mut(id) else { continue };
            e.processed += 1;
            let Some(cfg) = &breaker else { continue };
            let from = e.breaker.state();
            if let Some(s) = e.breaker.record(v, cfg, now) {
                log_breaker(e, s);
                let url = e.url.url.clone();
                count_transition(&mut self.transitions, url, from, s);
                changed = true;
            }
        }
        changed
    }

    /// A shard's in-flight counts per worker id.
    pub fn on_loads(&mut self, shard: usize, loads: &[usize]) {
        for e in &mut self.entries {
            if let Some(slot) = e.inflight.get_mut(shard) {
                *slot = loads.get(e.id.index()).copied().unwrap_or(0);
            }
        }
    }

    /// A worker's `/v1/loads` figure; true when routing must see a change.
    pub fn on_load(&mut self, id: WorkerId, figures: Option<EngineLoad>) -> bool {
        let thresholds = self.cfg.overload;
        let Some(e) = self.get_mut(id) else { return false };
        let over = matches!((figures, thresholds), (Some(l), Some(t)) if t.over(&l));
        let load = figures.map(|l| l.total);
        let changed = e.engine_load != load || e.overloaded != over;
        if e.overloaded != over {
            if over {
                crate::warn!("worker {} is overloaded ({} requests)", e.url.url, load.unwrap_or(0));
            } else {
                crate::info!("worker {} is no longer overloaded", e.url.url);
            }
        }
        e.engine_load = load;
        e.overloaded = over;
        changed
    }

    /// Timers: open breakers past their timeout turn half-open, and drained workers whose
    /// requests are done are removed. True when routing must see a change.
    pub fn on_time(&mut self, now: Instant) -> bool {
        let mut changed = false;
        if let Some(cfg) = self.cfg.breaker {
            for e in &mut self.entries {
                let from = e.breaker.state();
                if let Some(s) = e.breaker.poll(&cfg, now) {
                    log_breaker(e, s);
                    count_transition(&mut self.transitions, e.url.url.clone(), from, s);
                    changed = true;
                }
            }
        }
        let settle = self.cfg.drain_settle;
        let before = self.entries.len();
        self.entries.retain(|e| {
            let done = e.draining_since.is_some_and(|t| now.duration_since(t) >= settle) && e.inflight_total() == 0;
            if done {
                crate::info!("worker {}: drained; removed", e.url.url);
            }
            !done
        });
        changed || self.entries.len() != before
    }

    /// The next time `on_time` or a probe has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let breaker = self.cfg.breaker;
        let settle = self.cfg.drain_settle;
        self.entries
            .iter()
            .flat_map(|e| {
                let probe = (!e.probing && e.draining_since.is_none()).then_some(e.next_probe);
                let reopen = breaker.as_ref().and_then(|c| e.breaker.reopens_at(c));
                // A draining worker is looked at every 100 ms until its requests are done.
                let drain =
                    e.draining_since.map(|t| (t + settle).max(crate::clock::now() + Duration::from_millis(100)));
                let load = self.cfg.load_interval.map(|_| e.next_load_poll);
                [probe, reopen, drain, load]
            })
            .flatten()
            .min()
    }

    /// Starts draining `id` and every rank registered with it: no new requests; removed
    /// once in-flight ones finish. True when it was registered.
    pub fn drain(&mut self, id: WorkerId, now: Instant) -> bool {
        let Some(base) = self.get(id).map(|e| e.base.url.clone()) else { return false };
        for e in self.entries.iter_mut().filter(|e| e.base.url == base) {
            if e.health.set(Status::Draining).is_some() {
                crate::info!("worker {}: draining", e.url.url);
            }
            e.draining_since.get_or_insert(now);
        }
        true
    }

    /// Re-applies the spec after an admin PATCH.
    pub fn respec(&mut self, id: WorkerId, f: impl FnOnce(&mut WorkerSpec)) -> bool {
        let Some(e) = self.get_mut(id) else { return false };
        f(&mut e.spec);
        if let Some(m) = &e.spec.model_id {
            e.model = Some(m.clone());
        }
        if let Some(r) = e.spec.runtime {
            e.runtime = r;
        }
        e.refresh_meta();
        true
    }

    pub fn stats(&self) -> FleetStats {
        let mut overloaded: Vec<(String, usize)> = Vec::new();
        for e in self.entries.iter().filter(|e| e.overloaded) {
            let m = e.model.clone().unwrap_or_default();
            match overloaded.iter_mut().find(|(x, _)| *x == m) {
                Some((_, n)) => *n += 1,
                None => overloaded.push((m, 1)),
            }
        }
        FleetStats {
            workers: self
                .entries
                .iter()
                .map(|e| WorkerStats {
                    url: e.url.url.clone(),
                    breaker: e.breaker.state(),
                    consecutive: e.breaker.consecutive_failures(),
                    successes: e.breaker.total_successes,
                    failures: e.breaker.total_failures,
                })
                .collect(),
            transitions: self.transitions.clone(),
            health_checks: self.health_checks,
            overloaded,
        }
    }

    /// The Snapshot shards route from.
    pub fn snapshot(&mut self) -> Snapshot {
        self.generation += 1;
        let workers = self
            .entries
            .iter()
            .map(|e| Worker {
                id: e.id,
                url: e.url.clone(),
                model: e.model.clone(),
                healthy: e.routable(),
                engine_load: e.engine_load,
                overloaded: e.overloaded,
                max_running: e.max_running,
                meta: Arc::clone(&e.meta),
            })
            .collect();
        Snapshot::new(self.generation, workers)
    }
}

fn count_transition(
    t: &mut Vec<(String, BreakerState, BreakerState, u64)>,
    url: String,
    from: BreakerState,
    to: BreakerState,
) {
    match t.iter_mut().find(|(u, f, x, _)| *u == url && *f == from && *x == to) {
        Some(row) => row.3 += 1,
        None => t.push((url, from, to, 1)),
    }
}

fn log_status(e: &Entry, s: Status) {
    match s {
        Status::Ready => {
            crate::info!("worker {} is ready (model {})", e.url.url, e.model.as_deref().unwrap_or("?"))
        }
        s => crate::warn!("worker {} is {}", e.url.url, s.as_str()),
    }
}

fn log_breaker(e: &Entry, s: BreakerState) {
    match s {
        BreakerState::Open => crate::warn!("worker {}: circuit breaker open", e.url.url),
        s => crate::info!("worker {}: circuit breaker {}", e.url.url, s.as_str()),
    }
}

/// Whether `addr` reaches the listener `own`: the same port, and the same address, or any
/// address of this host when the listener is bound to all of them (an address is this
/// host's when a socket can be bound to it).
fn is_listener(own: &SocketAddr, addr: SocketAddr) -> bool {
    if own.port() != addr.port() {
        return false;
    }
    let ip = addr.ip();
    if own.ip() == ip || (own.ip().is_loopback() && ip.is_loopback()) {
        return true;
    }
    own.ip().is_unspecified()
        && (ip.is_loopback() || ip.is_unspecified() || std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateways_own_listeners_are_not_workers() {
        let mut f = Fleet::new(cfg());
        let t = crate::clock::now();
        for url in
            ["http://127.0.0.1:30000", "http://localhost:30000", "http://127.0.0.2:30000", "http://0.0.0.0:30000"]
        {
            assert!(matches!(f.register(WorkerSpec::from_url(url), t), Err(RegisterError::OwnListener(_))), "{url}");
        }
        assert!(f.register(WorkerSpec::from_url("http://127.0.0.1:30001"), t).is_ok());
        // A listener on one address leaves the others' same port to workers.
        let one: SocketAddr = "127.0.0.1:30000".parse().unwrap();
        assert!(!is_listener(&"10.9.9.9:30000".parse().unwrap(), one.to_string().parse().unwrap()));
        assert!(is_listener(&one, "127.0.0.3:30000".parse().unwrap()), "loopback is one host");
    }

    fn cfg() -> FleetConfig {
        FleetConfig {
            health_interval: Duration::from_secs(60),
            health_timeout: Duration::from_secs(5),
            health_endpoint: "/health".into(),
            thresholds: Thresholds { failures: 3, successes: 2 },
            health_checks: true,
            remove_unhealthy: false,
            drain_settle: Duration::from_secs(5),
            breaker: Some(BreakerConfig {
                failure_threshold: 2,
                success_threshold: 1,
                timeout: Duration::from_secs(10),
            }),
            load_interval: None,
            overload: Some(OverloadThresholds { waiting: 8, token_usage: 0.8 }),
            dp_aware: true,
            shards: 2,
            tokenizer: Default::default(),
            own_listeners: vec!["0.0.0.0:30000".parse().unwrap()],
        }
    }

    fn up(model: &str, dp: Option<u32>) -> ProbeResult {
        ProbeResult {
            passed: true,
            discovery: Some(Discovery {
                model: model.into(),
                runtime: Runtime::Sglang,
                dp_size: dp,
                max_running: None,
                grpc: None,
                more_models: Vec::new(),
            }),
            skipped: false,
        }
    }

    fn spec(url: &str) -> WorkerSpec {
        WorkerSpec { url: url.into(), ..WorkerSpec::default() }
    }

    #[test]
    fn registers_once_routes_when_ready_and_breaker_takes_it_out() {
        let t = crate::clock::now();
        let mut f = Fleet::new(cfg());
        let a = f.register(spec("http://127.0.0.1:9001"), t).unwrap();
        assert_eq!(f.register(spec("http://127.0.0.1:9001/"), t), Err(RegisterError::Duplicate(a)));
        assert!(!f.get(a).unwrap().routable(), "pending");
        assert!(!f.on_probe(a, up("m", None), t), "one pass of S = 2");
        assert_eq!(f.get(a).unwrap().probe_every(&f.cfg), CONFIRM, "confirmed soon");
        assert!(f.on_probe(a, up("m", None), t));
        assert!(f.get(a).unwrap().routable());
        assert!(!f.on_outcomes(&[(a, Verdict::Failure)], t));
        assert!(f.on_outcomes(&[(a, Verdict::Failure)], t), "breaker opened");
        let s = f.snapshot();
        assert!(matches!(s.candidates(Some("m")), crate::workers::Candidates::AllDown));
        assert!(f.on_time(t + Duration::from_secs(10)), "half-open");
        assert!(f.get(a).unwrap().routable());
        assert_eq!(f.get(a).unwrap().processed, 2);
    }

    #[test]
    fn dp_ranks_drain_and_overload() {
        let t = crate::clock::now();
        let mut f = Fleet::new(cfg());
        let a = f.register(spec("http://127.0.0.1:9002"), t).unwrap();
        assert!(f.on_probe(a, up("m", Some(2)), t), "expanded into ranks");
        let names: Vec<_> = f.entries.iter().map(|e| e.url.url.clone()).collect();
        assert_eq!(names, ["http://127.0.0.1:9002@0", "http://127.0.0.1:9002@1"]);
        let ranks: Vec<_> = f.entries.iter().map(|e| e.id).collect();
        for r in &ranks {
            assert!(f.on_probe(*r, up("m", Some(2)), t));
        }
        assert!(f.entries.iter().all(|e| e.routable()));
        assert!(f.entries.iter().all(|e| e.meta.dp_rank.is_some()));
        let r0 = f.entries[0].id;
        let busy = |w| Some(EngineLoad { total: w + 1, waiting: w, token_usage: None });
        assert!(f.on_load(r0, busy(8)));
        let s = f.snapshot();
        match s.candidates(Some("m")) {
            crate::workers::Candidates::Healthy(p) => assert_eq!(p, [1], "the overloaded rank is skipped"),
            _ => panic!(),
        }
        let usage = Some(EngineLoad { total: 1, waiting: 0, token_usage: Some(0.9) });
        assert!(f.on_load(f.entries[1].id, usage));
        match f.snapshot().candidates(Some("m")) {
            crate::workers::Candidates::Overloaded(p) => assert_eq!(p, [0, 1]),
            _ => panic!(),
        }
        f.on_loads(0, &[0, 0, 1]);
        assert!(f.drain(r0, t));
        assert!(f.entries.iter().all(|e| !e.routable()), "every rank drains");
        assert!(!f.on_time(t + Duration::from_secs(5)) || f.entries.len() == 1);
        assert_eq!(f.entries.len(), 1, "rank 1 still has a request");
        f.on_loads(0, &[0, 0, 0]);
        assert!(f.on_time(t + Duration::from_secs(6)));
        assert!(f.entries.is_empty());
    }
}
