//! The control plane for workers: one prober thread per worker, one publisher.
//!
//! A worker is routable once it answered `GET /health` with 2xx and told us its model.
//! Down (or never-seen) workers are retried every second; routable ones every
//! `--health-check-interval-secs`, or at once when a shard reports a connect failure.
//! Every state change publishes a fresh Snapshot; shards never wait on this thread.

use std::sync::Arc;
use std::time::Duration;

use super::{probe, Registry, Snapshot, Worker, WorkerId, WorkerUrl};

/// Shard → control: something a shard saw that needs a re-probe.
#[derive(Debug, Clone, Copy)]
pub enum WorkerEvent {
    ConnectFailed(WorkerId),
}

const DOWN_RETRY: Duration = Duration::from_secs(1);

/// Prober → publisher.
enum Update {
    Health { id: usize, model: Option<String>, healthy: bool },
    Load { id: usize, load: Option<u64> },
}

/// How often to look at workers.
#[derive(Debug, Clone, Copy)]
pub struct ProbeTimes {
    pub health_interval: Duration,
    pub timeout: Duration,
    /// Poll `/v1/loads` this often (least_load); None = never.
    pub load_interval: Option<Duration>,
}

/// Starts the probers and the publisher; returns the sender shards report events on.
pub fn start(urls: Vec<WorkerUrl>, registry: Registry, times: ProbeTimes) -> flume::Sender<WorkerEvent> {
    let ProbeTimes { health_interval: interval, timeout, load_interval } = times;
    let (event_tx, event_rx) = flume::bounded::<WorkerEvent>(1024);
    let (update_tx, update_rx) = flume::unbounded::<Update>();
    let mut kicks = Vec::new();
    for (id, url) in urls.iter().cloned().enumerate() {
        let (kick_tx, kick_rx) = flume::bounded::<()>(1);
        kicks.push(kick_tx);
        let updates = update_tx.clone();
        std::thread::Builder::new()
            .name(format!("smg-probe-{id}"))
            .spawn({
                let url = url.clone();
                move || prober(id, url, interval, timeout, kick_rx, updates)
            })
            .expect("spawn prober thread");
        if let Some(every) = load_interval {
            let updates = update_tx.clone();
            std::thread::Builder::new()
                .name(format!("smg-loads-{id}"))
                .spawn(move || load_poller(id, url, every, timeout, updates))
                .expect("spawn load poller thread");
        }
    }
    // Shard events become kicks to the right prober (coalesced: a full kick channel
    // means a probe is already pending).
    std::thread::Builder::new()
        .name("smg-events".into())
        .spawn(move || {
            while let Ok(WorkerEvent::ConnectFailed(id)) = event_rx.recv() {
                if let Some(k) = kicks.get(id.index()) {
                    let _ = k.try_send(());
                }
            }
        })
        .expect("spawn events thread");
    std::thread::Builder::new()
        .name("smg-publish".into())
        .spawn(move || {
            let mut workers: Vec<Worker> = urls
                .into_iter()
                .enumerate()
                .map(|(id, url)| Worker {
                    id: WorkerId(id as u32),
                    url,
                    model: None,
                    healthy: false,
                    engine_load: None,
                })
                .collect();
            let mut generation = 0u64;
            while let Ok(u) = update_rx.recv() {
                match u {
                    Update::Health { id, model, healthy } => {
                        let w = &mut workers[id];
                        if model.is_some() {
                            w.model = model;
                        }
                        if w.healthy != healthy {
                            if healthy {
                                crate::info!(
                                    "worker {} is up (model {})",
                                    w.url.url,
                                    w.model.as_deref().unwrap_or("?")
                                );
                            } else {
                                crate::warn!("worker {} is down", w.url.url);
                            }
                        }
                        w.healthy = healthy;
                    }
                    Update::Load { id, load } => workers[id].engine_load = load,
                }
                generation += 1;
                registry.store(Arc::new(Snapshot::new(generation, workers.clone())));
            }
        })
        .expect("spawn publisher thread");
    event_tx
}

fn prober(
    id: usize,
    url: WorkerUrl,
    interval: Duration,
    timeout: Duration,
    kick: flume::Receiver<()>,
    updates: flume::Sender<Update>,
) {
    let mut model: Option<String> = None;
    let mut healthy = false;
    let mut first = true;
    loop {
        let up = match probe::get(&url, "/health", timeout) {
            Ok(r) => (200..300).contains(&r.status),
            // Our process is out of descriptors: that says nothing about the worker, so its
            // state stands until a probe can be made.
            Err(e) if crate::io::is_resource_exhaustion(&e) => {
                crate::debug!("worker {}: probe skipped: {e}", url.url);
                healthy
            }
            Err(_) => false,
        };
        let mut new_model = None;
        if up && model.is_none() {
            new_model = probe::discover_model(&url, timeout);
            model.clone_from(&new_model);
        }
        let now_healthy = up && model.is_some();
        let changed = first || now_healthy != healthy || new_model.is_some();
        if changed && updates.send(Update::Health { id, model: new_model, healthy: now_healthy }).is_err() {
            return;
        }
        first = false;
        healthy = now_healthy;
        let wait = if healthy { interval } else { DOWN_RETRY };
        match kick.recv_timeout(wait) {
            Ok(()) | Err(flume::RecvTimeoutError::Timeout) => {}
            Err(flume::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// least_load: polls the worker's `/v1/loads` (SGLang's schema) on `--load-monitor-interval`.
fn load_poller(id: usize, url: WorkerUrl, every: Duration, timeout: Duration, updates: flume::Sender<Update>) {
    let mut last = None;
    loop {
        let load = probe::get(&url, "/v1/loads", timeout)
            .ok()
            .filter(|r| (200..300).contains(&r.status))
            .and_then(|r| crate::routing::parse_sglang_loads(&r.body));
        if load != last {
            if updates.send(Update::Load { id, load }).is_err() {
                return;
            }
            last = load;
        }
        std::thread::sleep(every);
    }
}
