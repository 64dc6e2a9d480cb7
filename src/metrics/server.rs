//! The metrics listener (`--prometheus-host`:`--prometheus-port`, `GET /metrics`), on a
//! control thread of its own: a scrape asks every shard for its report through the shard's
//! inbox, waits for the answers here (never on a shard), merges and renders.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use crate::worker_id::WorkerId;

use super::exposition::{render, Gauges};
use super::shard::{Counts, ShardReport};
use crate::workers::control::ControlMsg;
use crate::workers::Registry;

/// What a scrape needs from the running gateway.
pub struct Scraper {
    /// Asks shard i for its report; the report comes back on the given channel.
    pub ask: Vec<Box<dyn Fn(flume::Sender<ShardReport>) -> bool + Send>>,
    pub registry: Registry,
    /// Asks the worker control thread for the fleet's figures.
    pub control: flume::Sender<ControlMsg>,
    pub bounds: Vec<f64>,
    pub policy: String,
}

impl Scraper {
    /// Every shard's report merged; a shard that does not answer within a second is left out.
    pub fn scrape(&self) -> String {
        let (tx, rx) = flume::bounded(self.ask.len().max(1));
        let asked = self.ask.iter().filter(|ask| ask(tx.clone())).count();
        drop(tx);
        let mut counts = Counts::default();
        let mut inflight = 0;
        let mut loads: Vec<usize> = Vec::new();
        let mut routers = Vec::new();
        let mut admission: Option<(usize, usize)> = None;
        let mut spans_dropped = 0;
        let mut budget: Option<crate::budget::shard::BudgetCounts> = None;
        let mut scheduler: Option<[(usize, usize, u64); 4]> = None;
        let mut shard_ticks = Vec::with_capacity(asked);
        let mut kv_by_shard = Vec::with_capacity(asked);
        for _ in 0..asked {
            let Ok(r) = rx.recv_timeout(Duration::from_secs(1)) else { break };
            kv_by_shard.push(r.kv);
            shard_ticks.push((r.shard, r.ticks));
            counts.merge(&r.counts);
            routers.push(r.router);
            spans_dropped += r.spans_dropped;
            if let Some(per) = r.scheduler {
                let t = scheduler.get_or_insert([(0, 0, 0); 4]);
                for (a, b) in t.iter_mut().zip(per) {
                    a.0 += b.0;
                    a.1 += b.1;
                    a.2 += b.2;
                }
            }
            if let Some(b) = r.budget {
                let t = budget.get_or_insert_with(Default::default);
                t.admitted += b.admitted;
                t.denied += b.denied;
                t.leases += b.leases;
                t.reports += b.reports;
            }
            if let Some((q, f)) = r.admission {
                let a = admission.get_or_insert((0, 0));
                a.0 += q;
                a.1 += f;
            }
            inflight += r.inflight;
            if loads.len() < r.worker_loads.len() {
                loads.resize(r.worker_loads.len(), 0);
            }
            for (a, b) in loads.iter_mut().zip(&r.worker_loads) {
                *a += b;
            }
        }
        let snap = self.registry.load();
        let (tx, rx) = flume::bounded(1);
        let asked = self.control.send(ControlMsg::Stats(tx)).is_ok();
        let fleet = if asked { rx.recv_timeout(Duration::from_secs(1)).ok() } else { None };
        shard_ticks.sort_unstable();
        let kv = kv_agreed(&kv_by_shard);
        let g = Gauges {
            snapshot: &snap,
            inflight,
            worker_loads: &loads,
            routers: &routers,
            admission,
            spans_dropped,
            budget,
            scheduler,
            fleet: fleet.as_ref(),
            shard_ticks: &shard_ticks,
            kv: &kv,
        };
        render(&counts, &g, &self.bounds, &self.policy)
    }
}

/// What every shard's KV index agrees on, per worker: the fewest blocks any shard holds for
/// it (a shard that names it not at all holds none), live only where all say so. Shards
/// apply the same changes in the same order, so this is what they all have applied.
fn kv_agreed(shards: &[Vec<(WorkerId, usize, bool)>]) -> Vec<(WorkerId, usize, bool)> {
    let mut ids: Vec<WorkerId> = shards.iter().flatten().map(|e| e.0).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.into_iter()
        .map(|id| {
            let each = shards.iter().map(|s| s.iter().find(|e| e.0 == id).map_or((0, false), |e| (e.1, e.2)));
            let (blocks, live) = each.fold((usize::MAX, true), |(b, l), (sb, sl)| (b.min(sb), l && sl));
            (id, if blocks == usize::MAX { 0 } else { blocks }, live)
        })
        .collect()
}

/// Binds and serves until the process exits. A port still held (by the gateway this one is
/// replacing in a binary upgrade) is retried every half second; any other bind failure is
/// logged, not fatal: the gateway serves without metrics rather than not at all.
pub fn start(addr: SocketAddr, scraper: Scraper) {
    let spawned = std::thread::Builder::new().name("smg-metrics".into()).spawn(move || {
        let mut waited = false;
        let listener = loop {
            match TcpListener::bind(addr) {
                Ok(l) => break l,
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    if !waited {
                        crate::warn!("metrics listener on {addr}: {e}; retrying until it is free");
                        waited = true;
                    }
                    // The metrics thread, never a shard: it has nothing else to do until the port is free.
                    #[allow(clippy::disallowed_methods)]
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => {
                    crate::error!("metrics listener on {addr}: {e}; serving without metrics");
                    return;
                }
            }
        };
        crate::info!("metrics on http://{addr}/metrics");
        for conn in listener.incoming() {
            let Ok(s) = conn else { continue };
            serve(s, &scraper);
        }
    });
    if let Err(e) = spawned {
        crate::error!("metrics listener: {e}");
    }
}

fn serve(mut s: TcpStream, scraper: &Scraper) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
    let mut buf = Vec::with_capacity(1024);
    let mut tmp = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
    let line = buf.split(|b| *b == b'\n').next().unwrap_or(b"");
    let (status, ctype, body) = if line.starts_with(b"GET /metrics ") || line.starts_with(b"GET /metrics?") {
        ("200 OK", "text/plain; version=0.0.4; charset=utf-8", scraper.scrape())
    } else {
        ("404 Not Found", "text/plain", "not found\n".to_string())
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body.as_bytes());
}
