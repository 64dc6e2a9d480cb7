//! Boot: pin one monoio reactor per core, each with its own SO_REUSEPORT listener; start
//! the worker control thread; turn SIGTERM/SIGINT into a drain; exit when shards are done.

mod accept;
mod backlog;
mod systemd;
mod upgrade;

use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::admission::permits::PoolMsg;
use crate::admission::priority::SchedMsg;
use crate::config::{Config, Host};
use crate::kv::index::KvUpdate;
use crate::routing::PolicyKind;
use crate::shard::{Heartbeats, Peers, Shard, ShardMsg};
use crate::workers::control::{self, ControlMsg};
use crate::workers::{Registry, Snapshot};
use accept::UnboundedInbox;

/// Cores this process may run on (respects taskset/cpusets).
pub fn allowed_cores() -> Vec<core_affinity::CoreId> {
    core_affinity::get_core_ids().unwrap_or_default()
}

/// What the configuration needs to know about this machine. Raises the soft descriptor
/// limit to the hard one on the way (once, before any shard starts).
pub fn host() -> Host {
    Host { cores: allowed_cores().len().max(1), descriptors: crate::io::raise_descriptor_limit() }
}

/// One shard's reactor: monoio's fusion driver (io_uring where the kernel allows, epoll
/// otherwise or with MONOIO_FORCE_LEGACY_DRIVER=1).
///
/// The ring is set up with COOP_TASKRUN and SINGLE_ISSUER: a shard is the only thread that
/// submits to its ring, so the kernel need not interrupt it to run completions. Measured on
/// chat-1k (one pinned shard, 64 connections, A/B interleaved, 4 s each): 20.6–30 µs of
/// gateway CPU per request with a plain ring, 14.4–15.2 µs with these flags. DEFER_TASKRUN
/// measured no better and delays completions to the next wait, so it is not used. A kernel
/// that refuses the flags gets a plain ring.
type ShardRuntime = monoio::FusionRuntime<
    monoio::time::TimeDriver<monoio::IoUringDriver>,
    monoio::time::TimeDriver<monoio::LegacyDriver>,
>;

fn build_runtime() -> std::io::Result<ShardRuntime> {
    let mut tuned = io_uring::IoUring::builder();
    tuned.setup_coop_taskrun().setup_single_issuer();
    let base = || monoio::RuntimeBuilder::<monoio::FusionDriver>::new().enable_timer().with_entries(1024);
    base().uring_builder(tuned).build().or_else(|_| base().build())
}

/// Blocks SIGTERM, SIGINT and SIGUSR2 (upgrade) in this thread (and so in every thread
/// spawned after), so only the main thread's sigwait sees them.
#[allow(unsafe_code)]
fn block_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-set manipulation on a zeroed set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGUSR2);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

#[allow(unsafe_code)]
fn wait_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: `set` was built by block_signals.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}

/// What one shard thread is handed.
struct ShardStart {
    index: usize,
    core: Option<core_affinity::CoreId>,
    cfg: Arc<Config>,
    registry: Registry,
    control: flume::Sender<ControlMsg>,
    peers: Peers,
    inbox: flume::Receiver<ShardMsg>,
    unbounded: UnboundedInbox,
    /// A socket from systemd (or a predecessor) to accept on instead of binding
    /// `--host`/`--port`.
    activated: Option<std::os::fd::RawFd>,
    /// `activated` is systemd's: it keeps the socket's queue when we close ours.
    systemd_socket: bool,
    /// A successor in a binary upgrade: accept only once a worker is routable (the
    /// predecessor serves until then).
    accept_when_routable: bool,
}

/// A shard thread: pin, build the reactor, bind, report ready, serve until drained.
fn shard_main(s: ShardStart, ready: flume::Sender<Result<(usize, RawFd), String>>) {
    if let Some(core) = s.core {
        core_affinity::set_for_current(core);
    }
    let mut rt = match build_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(format!("shard {}: runtime: {e}", s.index)));
            return;
        }
    };
    rt.block_on(async move {
        let bound = match s.activated {
            Some(fd) => crate::io::listener_from_fd(fd).map_err(|e| format!("socket {fd} from systemd: {e}")),
            None => crate::io::bind(s.cfg.listen).map_err(|e| format!("cannot listen on {}: {e}", s.cfg.listen)),
        };
        let listener = match bound {
            Ok(l) => l,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let _ = ready.send(Ok((s.index, listener.as_raw_fd())));
        let shard = Rc::new(Shard::new(s.index, s.cfg, s.registry, s.control, s.peers));
        if s.accept_when_routable {
            while !shard.snapshot().workers.iter().any(|w| w.healthy) {
                crate::clock::timer(Duration::from_millis(20)).await;
            }
        }
        accept::serve(shard, listener, s.inbox, s.unbounded, s.systemd_socket).await;
    });
}

/// Runs the gateway until SIGTERM/SIGINT and the drain that follows. Err = start failed.
pub fn run(cfg: Config) -> Result<(), String> {
    // Sockets from a predecessor (binary upgrade): read, and their variables removed, before
    // any thread exists (changing the environment is only safe then).
    let (inherited, upgrade_ready) = upgrade::inherited();
    let sigset = block_signals();
    let cfg = Arc::new(cfg);
    let registry = Arc::new(ArcSwap::from_pointee(Snapshot::default()));
    let initial = cfg.workers.clone();
    let control = control::start(initial, Arc::clone(&registry), cfg.fleet.clone());

    let cores = allowed_cores();
    let (ready_tx, ready_rx) = flume::unbounded::<Result<(usize, RawFd), String>>();
    let (inboxes, receivers): (Vec<_>, Vec<_>) = (0..cfg.cores).map(|_| flume::bounded::<ShardMsg>(64)).unzip();
    let (permit_txs, permit_rxs): (Vec<_>, Vec<_>) = (0..cfg.cores).map(|_| flume::unbounded::<PoolMsg>()).unzip();
    let (sched_txs, sched_rxs): (Vec<_>, Vec<_>) = (0..cfg.cores).map(|_| flume::unbounded::<SchedMsg>()).unzip();
    // From here on one thread writes the log. The access log is on at --log-level info and
    // up (SMG logs each request at info).
    let writer = crate::log::start_writer();
    let access_log = crate::log::enabled(crate::log::LogLevel::Info).then_some(writer);
    for e in &cfg.startup_errors {
        crate::error!("{e}");
    }
    let budget_owner = cfg.budgets.is_some().then(|| crate::budget::owner::start(cfg.redis_url.clone()));
    let history = crate::responses::store::start(cfg.history.backend.clone(), cfg.history.within)?;
    let mcp = crate::responses::mcp::Mcp::start()?;
    let from_predecessor = !inherited.is_empty();
    let activated = if from_predecessor { inherited } else { systemd::listen_fds() };
    let traces = cfg.trace_endpoint.clone().map(crate::trace::exporter::start);
    let heartbeats = Heartbeats::new(cfg.cores);
    let mut threads = Vec::new();
    // The KV-cache events thread runs when a policy reads what engines cached.
    let (kv_txs, kv_rxs): (Vec<_>, Vec<_>) = (0..cfg.cores).map(|_| flume::unbounded::<Arc<KvUpdate>>()).unzip();
    if [&cfg.routing, &cfg.prefill_routing].iter().any(|r| r.policy == PolicyKind::CacheAware) {
        crate::kv::thread::start(Arc::clone(&registry), kv_txs, cfg.fleet.tokenizer.path.clone());
    } else if cfg.workers.iter().any(|w| w.kv_events.is_some()) {
        crate::warn!(
            "--kv-events: no policy routes on KV-cache events (cache_aware does); the publishers are not followed"
        );
    }
    let unbounded = permit_rxs.into_iter().zip(sched_rxs).zip(kv_rxs).map(|((permits, sched), kv)| UnboundedInbox {
        permits,
        sched,
        kv,
    });
    for (index, (rx, unbounded)) in receivers.into_iter().zip(unbounded).enumerate() {
        let core = (!cores.is_empty()).then(|| cores[index % cores.len()]);
        let others = |i: &usize| *i != index;
        let peers = Peers {
            inboxes: inboxes.iter().enumerate().filter(|(i, _)| others(i)).map(|(_, tx)| tx.clone()).collect(),
            permits: permit_txs.iter().enumerate().filter(|(i, _)| others(i)).map(|(i, tx)| (i, tx.clone())).collect(),
            sched: sched_txs.iter().enumerate().filter(|(i, _)| others(i)).map(|(i, tx)| (i, tx.clone())).collect(),
            access_log: access_log.clone(),
            heartbeats: heartbeats.clone(),
            traces: traces.clone(),
            budget_owner: budget_owner.clone(),
            history: history.clone(),
            mcp: mcp.clone(),
        };
        let shard_cfg = ShardStart {
            index,
            core,
            cfg: Arc::clone(&cfg),
            registry: Arc::clone(&registry),
            control: control.clone(),
            peers,
            inbox: rx,
            unbounded,
            activated: (!activated.is_empty()).then(|| activated[index % activated.len()]),
            systemd_socket: !from_predecessor && !activated.is_empty(),
            accept_when_routable: upgrade_ready.is_some(),
        };
        let ready = ready_tx.clone();
        let t = std::thread::Builder::new()
            .name(format!("smg-shard-{index}"))
            .stack_size(crate::bounded_json::THREAD_STACK)
            .spawn(move || shard_main(shard_cfg, ready))
            .map_err(|e| format!("spawn shard: {e}"))?;
        threads.push(t);
    }
    drop(ready_tx);
    let mut listeners = vec![-1; cfg.cores];
    for _ in 0..cfg.cores {
        match ready_rx.recv() {
            Ok(Ok((i, fd))) => listeners[i] = fd,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err("a shard failed to start".into()),
        }
    }
    let driver = if monoio::utils::detect_uring() && std::env::var_os("MONOIO_FORCE_LEGACY_DRIVER").is_none() {
        "io_uring"
    } else {
        "epoll"
    };
    let on = if activated.is_empty() {
        cfg.listen.to_string()
    } else {
        format!("{} socket(s) from systemd", activated.len())
    };
    crate::info!("smg listening on {on} with {} shard(s) ({driver}), {} worker(s)", cfg.cores, cfg.workers.len());
    let routable = {
        let registry = Arc::clone(&registry);
        move || registry.load().workers.iter().any(|w| w.healthy)
    };
    if let Some(fd) = upgrade_ready {
        let routable = routable.clone();
        std::thread::spawn(move || {
            while !routable() {
                // A helper thread, not a shard: the snapshot it polls has no change signal.
                #[allow(clippy::disallowed_methods)]
                std::thread::sleep(Duration::from_millis(20));
            }
            upgrade::report_ready(fd);
        });
    }
    systemd::start(move |within| heartbeats.all_within(within), routable);

    if let Some(m) = &cfg.metrics {
        let ask = inboxes
            .iter()
            .map(|tx| {
                let tx = tx.clone();
                Box::new(move |reply| tx.send_timeout(ShardMsg::Scrape(reply), Duration::from_secs(1)).is_ok())
                    as Box<dyn Fn(flume::Sender<crate::metrics::ShardReport>) -> bool + Send>
            })
            .collect();
        let scraper = crate::metrics::server::Scraper {
            ask,
            registry: Arc::clone(&registry),
            control: control.clone(),
            bounds: m.buckets.clone(),
            policy: cfg.routing.policy.as_str().to_string(),
        };
        crate::metrics::server::start(m.listen, scraper);
    }

    let (sig, handover) = loop {
        let sig = wait_signal(&sigset);
        if sig != libc::SIGUSR2 {
            break (sig, false);
        }
        match upgrade::hand_over(&listeners) {
            Ok(()) => break (sig, true),
            Err(e) => crate::error!("upgrade failed, still serving: {e}"),
        }
    };
    crate::info!(
        "signal {sig}: draining (grace {}s){}",
        cfg.shutdown_grace.as_secs(),
        if handover { ", handing over to the successor" } else { "" }
    );
    systemd::notify("STOPPING=1");
    for tx in &inboxes {
        let _ = tx.try_send(ShardMsg::Drain { handover });
    }
    for t in threads {
        let _ = t.join();
    }
    crate::info!("drained; exiting");
    Ok(())
}
