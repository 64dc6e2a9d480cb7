//! The control loop: one thread, one single-threaded tokio runtime, for every worker. It
//! owns the [`Fleet`], runs health checks and load polls as tasks of its own, takes shard
//! reports (outcomes for the breakers, in-flight counts) and admin requests, and publishes
//! a new Snapshot whenever routing must see a change. Shards never wait on it, except an
//! admin request waiting for its answer.
//!
//! tokio is here (off the data plane) because the loop is a select over channels, timers
//! and many concurrent probes; a thread per worker did not scale to a thousand workers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::admin::{self, AdminReply, AdminRequest};
use super::breaker::Verdict;
use super::fleet::{Discovery, Fleet, FleetConfig, FleetStats, ProbeResult, WorkerSpec};
use super::{grpc_probe, probe};
use super::{Registry, WorkerId, WorkerUrl};

/// Shards → control.
pub enum ControlMsg {
    /// A connect to this worker failed: check it now.
    ConnectFailed(WorkerId),
    /// A shard's outcomes since its last report, and its in-flight counts per worker id
    /// when they changed.
    Report { shard: usize, outcomes: Vec<(WorkerId, Verdict)>, loads: Option<Arc<[usize]>> },
    /// An admin API request; the answer goes back on `reply`.
    Admin { req: AdminRequest, reply: flume::Sender<AdminReply> },
    /// The metrics listener wants the fleet's figures.
    Stats(flume::Sender<FleetStats>),
    /// `GET /v1/models` with a caller's own key: the registered providers' lists for that
    /// key, the first that is not empty (`provider_models`).
    ProviderModels { key: crate::secret::Secret, reply: flume::Sender<Option<Vec<u8>>> },
}

/// Tasks of the loop → the loop.
enum Done {
    Probe(WorkerId, ProbeResult),
    Load(WorkerId, Option<crate::routing::EngineLoad>),
}

/// Starts the control thread with the `--worker-urls` fleet; returns the channel shards
/// report on.
pub fn start(initial: Vec<WorkerSpec>, registry: Registry, cfg: FleetConfig) -> flume::Sender<ControlMsg> {
    let (tx, rx) = flume::unbounded::<ControlMsg>();
    std::thread::Builder::new()
        .name("smg-control".into())
        .stack_size(crate::bounded_json::THREAD_STACK)
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build();
            match rt {
                Ok(rt) => rt.block_on(run(initial, registry, cfg, rx)),
                Err(e) => crate::error!("control thread: {e}"),
            }
        })
        .expect("spawn control thread");
    tx
}

async fn run(initial: Vec<WorkerSpec>, registry: Registry, cfg: FleetConfig, rx: flume::Receiver<ControlMsg>) {
    let mut fleet = Fleet::new(cfg);
    let now = crate::clock::now();
    for spec in initial {
        if let Err(e) = fleet.register(spec, now) {
            crate::warn!("--worker-urls: {e:?}");
        }
    }
    let (done_tx, done_rx) = flume::unbounded::<Done>();
    registry.store(Arc::new(fleet.snapshot()));
    // An admin request is answered from the state routing already sees: what is pending is
    // published first. (`GET /workers` saying a breaker is open while the shards still route
    // to that worker is a state a client can act on and be wrong.)
    let apply = |fleet: &mut Fleet, m: ControlMsg, dirty: &mut bool| {
        if *dirty && matches!(m, ControlMsg::Admin { .. }) {
            registry.store(Arc::new(fleet.snapshot()));
            *dirty = false;
        }
        *dirty |= on_message(fleet, m, &done_tx);
    };
    loop {
        let now = crate::clock::now();
        start_due(&mut fleet, now, &done_tx);
        let mut dirty = fleet.on_time(now);
        let wake = fleet.next_deadline().unwrap_or(now + Duration::from_secs(1)).max(now);
        tokio::select! {
            m = rx.recv_async() => match m {
                Ok(m) => apply(&mut fleet, m, &mut dirty),
                Err(_) => return,
            },
            d = done_rx.recv_async() => {
                let now = crate::clock::now();
                dirty |= match d.expect("the loop holds a sender") {
                    Done::Probe(id, r) => fleet.on_probe(id, r, now),
                    Done::Load(id, l) => fleet.on_load(id, l),
                };
            }
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
        // Everything already waiting is applied before one publish.
        while let Ok(m) = rx.try_recv() {
            apply(&mut fleet, m, &mut dirty);
        }
        if dirty {
            registry.store(Arc::new(fleet.snapshot()));
        }
    }
}

fn on_message(fleet: &mut Fleet, m: ControlMsg, done: &flume::Sender<Done>) -> bool {
    let now = crate::clock::now();
    match m {
        ControlMsg::ConnectFailed(id) => {
            if let Some(e) = fleet.get_mut(id) {
                e.next_probe = e.next_probe.min(now);
            }
            start_due(fleet, now, done);
            false
        }
        ControlMsg::Report { shard, outcomes, loads } => {
            if let Some(l) = loads {
                fleet.on_loads(shard, &l);
            }
            fleet.on_outcomes(&outcomes, now)
        }
        ControlMsg::Stats(reply) => {
            let _ = reply.try_send(fleet.stats());
            false
        }
        ControlMsg::ProviderModels { key, reply } => {
            let (providers, timeout) = (fleet.providers(), fleet.cfg.health_timeout);
            spawn_caught("provider models".into(), provider_models(providers, key, timeout), None, move |r| {
                let _ = reply.try_send(r);
            });
            false
        }
        ControlMsg::Admin { req, reply } => {
            let what = format!("{:?} {}", req.method, req.path);
            // A bug in one admin request ends that request with a 500, never this thread:
            // every worker's health, loads and breakers live here.
            let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| admin::handle(fleet, req, now)));
            let (answer, changed) = handled.unwrap_or_else(|p| {
                crate::error!("control thread: admin request {what} panicked: {}", panic_text(&p));
                (admin::Answer::Now(admin::panicked()), true)
            });
            match answer {
                admin::Answer::Now(r) => {
                    let _ = reply.try_send(r);
                }
                admin::Answer::Later(task) => {
                    spawn_caught(what, task, admin::panicked(), move |r| {
                        let _ = reply.try_send(r);
                    });
                }
            }
            start_due(fleet, now, done);
            changed
        }
    }
}

/// Spawns the health checks and load polls that are due.
fn start_due(fleet: &mut Fleet, now: Instant, done: &flume::Sender<Done>) {
    let timeout = fleet.cfg.health_timeout;
    let endpoint = fleet.cfg.health_endpoint.clone();
    let load_every = fleet.cfg.load_interval;
    let checks = fleet.cfg.health_checks;
    let source = fleet.cfg.tokenizer.clone();
    for e in &mut fleet.entries {
        if e.draining_since.is_some() {
            continue;
        }
        if !e.probing && e.next_probe <= now {
            e.probing = true;
            let (id, url, done) = (e.id, e.base.clone(), done.clone());
            let discover = !e.discovered;
            let provider = e.provider();
            let key = provider.and(e.spec.api_key.clone());
            let check = checks && !e.spec.health_disabled.unwrap_or(false) && provider.is_none();
            let endpoint = endpoint.clone();
            let source = source.clone();
            let what = format!("health check of {}", url.url);
            let probe = async move {
                let _place = super::sockets::place().await;
                if let Some(p) = provider {
                    // Not health-checked (fleet.rs); its models are asked for once.
                    let key = key.as_ref().map(crate::secret::Secret::expose);
                    let discovery = if discover { probe::provider_discover(&url, p, key, timeout).await } else { None };
                    return ProbeResult { passed: true, discovery, skipped: false };
                }
                if url.grpc {
                    check_grpc_worker(&url, &source, check, discover, timeout).await
                } else {
                    check_worker(&url, &endpoint, check, discover, timeout).await
                }
            };
            // A probe that panics counts as failed, so the worker is probed again.
            spawn_caught(what, probe, ProbeResult::default(), move |r| {
                let _ = done.send(Done::Probe(id, r));
            });
        }
        // A provider publishes no load.
        if let (Some(every), None) = (load_every, e.provider()) {
            if e.next_load_poll <= now {
                e.next_load_poll = now + every;
                let (id, url, done) = (e.id, e.base.clone(), done.clone());
                let rank = e.dp_rank;
                let what = format!("load poll of {}", url.url);
                let poll = async move {
                    let _place = super::sockets::place().await;
                    if url.grpc {
                        return grpc_probe::loads(&url, rank, timeout).await;
                    }
                    probe::get(&url, "/v1/loads", timeout)
                        .await
                        .ok()
                        .filter(|r| (200..300).contains(&r.status))
                        .and_then(|r| crate::routing::parse_engine_load(&r.body, rank))
                };
                spawn_caught(what, poll, None, move |load| {
                    let _ = done.send(Done::Load(id, load));
                });
            }
        }
    }
}

/// Runs `task` as a task of the loop and hands its result to `then`; a task that panics
/// (tokio catches it) is logged and hands over `on_panic` instead, so whoever waits on it
/// (an admin client, the loop's probe bookkeeping) is answered.
fn spawn_caught<T: Send + 'static>(
    what: String,
    task: impl std::future::Future<Output = T> + Send + 'static,
    on_panic: T,
    then: impl FnOnce(T) + Send + 'static,
) {
    let handle = tokio::spawn(task);
    tokio::spawn(async move {
        match handle.await {
            Ok(v) => then(v),
            Err(e) => {
                let why = e.try_into_panic().map(|p| panic_text(&p)).unwrap_or_else(|e| e.to_string());
                crate::error!("control thread: {what} panicked: {why}");
                then(on_panic);
            }
        }
    });
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default()
}

/// A caller's own key's models: each provider asked in turn (in registration order), the
/// first non-empty list rendered as `GET /v1/models` answers, `owned_by` the provider. None
/// when every provider refuses the key or lists nothing: the caller gets the keyless list.
async fn provider_models(
    providers: Vec<(WorkerUrl, super::provider::Provider)>,
    key: crate::secret::Secret,
    timeout: Duration,
) -> Option<Vec<u8>> {
    for (url, p) in providers {
        let _place = super::sockets::place().await;
        match probe::provider_models(&url, p, Some(key.expose().as_bytes()), timeout).await {
            Ok(ids) if !ids.is_empty() => return Some(super::snapshot::render_models(&ids, p.name())),
            Ok(_) => {}
            Err(e) => crate::debug!("caller's key at {}: {e}", url.url),
        }
    }
    None
}

/// One health check: the endpoint (unless checks are off), then discovery until it has
/// succeeded once.
async fn check_worker(url: &WorkerUrl, endpoint: &str, check: bool, discover: bool, timeout: Duration) -> ProbeResult {
    let passed = if check {
        match probe::get(url, endpoint, timeout).await {
            Ok(r) => (200..300).contains(&r.status),
            // Our process is out of descriptors: that says nothing about the worker.
            Err(e) if crate::io::is_resource_exhaustion(&e) => {
                return ProbeResult { skipped: true, ..ProbeResult::default() }
            }
            Err(_) => false,
        }
    } else {
        true
    };
    let discovery: Option<Discovery> = if passed && discover { probe::discover(url, timeout).await } else { None };
    ProbeResult { passed, discovery, skipped: false }
}

/// The same for a `grpc://` worker: HealthCheck, then discovery (model info and the
/// tokenizer) until it has succeeded once.
async fn check_grpc_worker(
    url: &WorkerUrl,
    source: &crate::grpc::model::ModelSource,
    check: bool,
    discover: bool,
    timeout: Duration,
) -> ProbeResult {
    let passed = if check {
        match grpc_probe::health(url, timeout).await {
            Ok(healthy) => healthy,
            Err(e) => {
                crate::debug!("worker {}: HealthCheck: {e}", url.url);
                false
            }
        }
    } else {
        true
    };
    let discovery = if passed && discover { grpc_probe::discover(url, timeout, source).await } else { None };
    ProbeResult { passed, discovery, skipped: false }
}
