//! The KV-cache events thread: one OS thread with a single-threaded tokio runtime (h2 and
//! zeromq need one; never a shard). It follows every gRPC worker's events (grpc_feed.rs) and
//! every HTTP worker's that declares a ZMQ publisher (zmq_feed.rs),
//! keeps each worker's (each data-parallel rank's) [`Blocks`], and sends every shard the
//! index changes they make, in order, as one [`KvUpdate`] per wakeup through an unbounded
//! channel (a lost change would leave a shard's index wrong for good).
//!
//! Sequence numbers: a batch right after the last one applied continues (the feeds ask for
//! what they missed: a gRPC stream resubscribes from the last number, a ZMQ feed asks the
//! replay socket). Anything else (the engine restarted, or could not replay a gap) means this
//! gateway no longer knows what the engine holds, so the worker's blocks are cleared and
//! rebuilt from what follows. While a worker's stream is
//! down it is stale: routing falls back to the gateway's own guess for it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::feed::Feed;
use super::grpc_feed::follow;
use super::index::KvUpdate;
use super::keys::{Blocks, Change};
use crate::worker_id::WorkerId;
use crate::workers::kv_events_source::KvEventsSource;
use crate::workers::snapshot::{Registry, Snapshot};
use crate::workers::WorkerUrl;

/// How often the worker set is looked at.
const LOOK: Duration = Duration::from_millis(250);

/// Starts the thread. It runs for the life of the process.
/// `tokenizer`: `--tokenizer-path`, loaded here (off the shards, before any event) and sent to
/// every shard, which then tokenizes HTTP requests to match their workers' blocks.
pub fn start(registry: Registry, shards: Vec<flume::Sender<Arc<KvUpdate>>>, tokenizer: Option<PathBuf>) {
    let spawned = std::thread::Builder::new().name("smg-kv-events".into()).spawn(move || {
        if let Some(path) = tokenizer {
            send_tokenizer(&path, &shards);
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build();
        match rt {
            Ok(rt) => rt.block_on(run(registry, shards)),
            Err(e) => crate::error!("KV-cache events: no runtime: {e}"),
        }
    });
    if let Err(e) = spawned {
        crate::error!("KV-cache events: no thread: {e}");
    }
}

fn send_tokenizer(path: &Path, shards: &[flume::Sender<Arc<KvUpdate>>]) {
    match crate::tokenizer::Tokenizer::load(path) {
        Ok(tk) => {
            crate::info!(
                "KV-cache events: HTTP requests are tokenized with {} to match the blocks their workers report",
                path.display()
            );
            let u = Arc::new(KvUpdate { changes: Vec::new(), tokenizer: Some(Arc::new(tk)) });
            for s in shards {
                let _ = s.send(Arc::clone(&u));
            }
        }
        Err(e) => crate::warn!(
            "KV-cache events: --tokenizer-path {}: {e}; HTTP workers are matched on X-SMG-Routing-Tokens only",
            path.display()
        ),
    }
}

/// Where a worker's events come from.
#[derive(Debug, Clone, PartialEq)]
enum Source {
    Grpc(WorkerUrl),
    Zmq(KvEventsSource),
}

/// One followed worker (its registered base URL).
struct Followed {
    source: Source,
    task: tokio::task::JoinHandle<()>,
    /// The last sequence number applied (0: none), read by the feed when it subscribes.
    last: Arc<AtomicU64>,
    /// Its ranks (None: not data-parallel), each a worker of the snapshot.
    ranks: HashMap<Option<u32>, Rank>,
}

struct Rank {
    id: WorkerId,
    blocks: Blocks,
    live: bool,
}

async fn run(registry: Registry, shards: Vec<flume::Sender<Arc<KvUpdate>>>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Feed>();
    let mut followed: HashMap<String, Followed> = HashMap::new();
    let mut generation = None;
    let mut look = tokio::time::interval(LOOK);
    let mut update = KvUpdate::default();
    loop {
        tokio::select! {
            _ = look.tick() => {
                let snap = registry.load();
                if generation != Some(snap.generation) {
                    generation = Some(snap.generation);
                    follow_workers(&snap, &mut followed, &tx, &mut update);
                }
            }
            feed = rx.recv() => {
                let Some(feed) = feed else { return };
                apply(feed, &mut followed, &mut update);
                // Whatever else is in: one update for all of it.
                while let Ok(more) = rx.try_recv() {
                    apply(more, &mut followed, &mut update);
                }
            }
        }
        if !update.changes.is_empty() {
            let u = Arc::new(std::mem::take(&mut update));
            for s in &shards {
                let _ = s.send(Arc::clone(&u));
            }
        }
    }
}

/// Follows the gRPC workers of `snap` not followed yet, and forgets the ones gone.
fn follow_workers(
    snap: &Snapshot,
    followed: &mut HashMap<String, Followed>,
    tx: &mpsc::UnboundedSender<Feed>,
    update: &mut KvUpdate,
) {
    let mut now: HashMap<String, (Source, HashMap<Option<u32>, WorkerId>)> = HashMap::new();
    for w in &snap.workers {
        let rank = w.meta.dp_rank;
        let base = match rank {
            Some(_) => w.url.url.rsplit_once('@').map_or(w.url.url.as_str(), |(b, _)| b),
            None => w.url.url.as_str(),
        };
        let source = match (&w.meta.kv_events, w.url.grpc) {
            (_, true) => {
                let mut url = w.url.clone();
                url.url = base.to_string();
                Source::Grpc(url)
            }
            (Some(src), false) => Source::Zmq((**src).clone()),
            (None, false) => continue,
        };
        now.entry(base.to_string()).or_insert_with(|| (source, HashMap::new())).1.insert(rank, w.id);
    }
    followed.retain(|base, f| {
        let keep = now.get(base).is_some_and(|(source, ranks)| {
            *source == f.source && f.ranks.iter().all(|(r, x)| ranks.get(r) == Some(&x.id))
        });
        if !keep {
            f.task.abort();
            for r in f.ranks.values() {
                update.changes.extend([(r.id, Change::Clear), (r.id, Change::Stale)]);
            }
        }
        keep
    });
    for (base, (source, ranks)) in now {
        if followed.contains_key(&base) {
            continue;
        }
        let last = Arc::new(AtomicU64::new(0));
        let seen = Arc::clone(&last);
        let task = match &source {
            Source::Grpc(url) => tokio::spawn(follow(url.clone(), tx.clone(), move || seen.load(Ordering::Relaxed))),
            Source::Zmq(src) => tokio::spawn(super::zmq_feed::follow(base.clone(), src.clone(), tx.clone())),
        };
        let ranks = ranks.into_iter().map(|(r, id)| (r, Rank { id, blocks: Blocks::default(), live: false })).collect();
        followed.insert(base, Followed { source, task, last, ranks });
    }
}

fn apply(feed: Feed, followed: &mut HashMap<String, Followed>, update: &mut KvUpdate) {
    match feed {
        Feed::Up { url } => {
            if let Some(f) = followed.get(&url) {
                crate::debug!("KV-cache events of {url}: subscribed after sequence {}", f.last.load(Ordering::Relaxed));
            }
        }
        Feed::Down { url, why } => {
            let Some(f) = followed.get_mut(&url) else { return };
            for r in f.ranks.values_mut().filter(|r| r.live) {
                r.live = false;
                update.changes.push((r.id, Change::Stale));
            }
            crate::debug!("KV-cache events of {url}: {why}; subscribing again");
        }
        Feed::Batch { url, seq, batch } => {
            let Some(f) = followed.get_mut(&url) else { return };
            let last = f.last.load(Ordering::Relaxed);
            if last != 0 && seq != last + 1 {
                // The engine restarted, or a gap it could not replay: start over.
                crate::info!("KV-cache events of {url}: sequence {seq} after {last}; rebuilding its blocks");
                for r in f.ranks.values_mut() {
                    r.blocks = Blocks::default();
                    update.changes.push((r.id, Change::Clear));
                }
            }
            f.last.store(seq, Ordering::Relaxed);
            let only = f.ranks.len() == 1;
            let key = if only { f.ranks.keys().next().copied().flatten() } else { batch.dp_rank };
            let key = if f.ranks.contains_key(&key) { key } else { None };
            let Some(r) = f.ranks.get_mut(&key) else { return };
            let mut changes = Vec::new();
            for e in &batch.events {
                r.blocks.apply(e, &mut changes);
            }
            update.changes.extend(changes.into_iter().map(|c| (r.id, c)));
            if !r.live {
                if let Some(bs) = r.blocks.block_size() {
                    r.live = true;
                    update.changes.push((r.id, Change::Live(bs)));
                }
            }
        }
    }
}
