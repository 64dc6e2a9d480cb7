//! An HTTP worker's KV-cache events over ZMQ, in vLLM's wire format (what vLLM and SGLang
//! publish with `--kv-events-config`): what its prefix cache stored, evicted and flushed.
//!
//! The worker's thread numbers each batch and hands it to the ZMQ thread over a bounded
//! channel without ever waiting: when the channel is full the batch is dropped (counted as
//! `dropped`) and its number is used all the same, so a subscriber sees a gap. The ZMQ thread
//! (one per process, running a current-thread tokio runtime: zeromq needs tokio, and the
//! workers' monoio threads never run it) encodes each batch as msgpack, keeps the last
//! [`KEEP_BATCHES`] for replay and publishes it.
//!
//! Wire format:
//! - PUB: `[topic, sequence (u64, 8 bytes big-endian), payload]`, numbered from 0, one number
//!   per batch (`kv_events_skip` in /sim/control leaves a gap);
//! - payload: `[timestamp (f64 Unix seconds), [event, ...], data_parallel_rank (nil)]`;
//! - events, array format: `["BlockStored", block_hashes, parent_block_hash | nil, token_ids,
//!   block_size, lora_id (nil), medium ("GPU")]`, `["BlockRemoved", block_hashes, medium]`,
//!   `["AllBlocksCleared"]`; map format: a map per event, `"type"` then the same fields by name;
//! - replay (ROUTER): `[identity, empty, start (u64 big-endian)]` in; each kept batch numbered
//!   `>= start` out as `[identity, empty, sequence, payload]`, then the end marker
//!   `[identity, empty, -1 (i64, 8 bytes big-endian), empty]`.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use clap::ValueEnum;
use rmpv::Value;
use zeromq::{Endpoint, PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::sim::kv_events::{now_secs, stored_runs, KEEP_BATCHES};
use crate::sim::prefix_cache::CacheChanges;

/// Batches the channel from a worker to the ZMQ thread holds before it drops one.
pub const CHANNEL_BATCHES: usize = KEEP_BATCHES;

/// The storage medium every event names: the simulated cache is the GPU's.
const MEDIUM: &str = "GPU";

/// The sequence number of a replay's end marker.
const END_OF_REPLAY: i64 = -1;

/// How events are encoded (`--kv-events-format`): vLLM's default positional arrays, or maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ZmqFormat {
    Array,
    Map,
}

/// A worker's ZMQ publisher, as the command line gave it (PORT+i already applied).
#[derive(Clone, Debug)]
pub struct ZmqSpec {
    /// The PUB socket's endpoint, `tcp://HOST:PORT`.
    pub endpoint: String,
    /// The ROUTER socket's endpoint for replay.
    pub replay: Option<String>,
    pub topic: String,
    pub format: ZmqFormat,
    /// Where the worker sends its batches (set once the ZMQ thread bound the sockets, and
    /// `endpoint` and `replay` then name the ports bound); a worker without one publishes
    /// nothing.
    pub sink: Option<flume::Sender<Batch>>,
}

/// One numbered batch on its way to the ZMQ thread.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub seq: u64,
    /// Unix seconds.
    pub timestamp: f64,
    pub events: Vec<Event>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A run of consecutive blocks: `token_ids` are every block's ids, `block_size` per block.
    Stored {
        block_hashes: Vec<u64>,
        parent: Option<u64>,
        token_ids: Vec<u32>,
        block_size: usize,
    },
    Removed {
        block_hashes: Vec<u64>,
    },
    Cleared,
}

/// The worker's side: numbers batches and passes them on; lives on the worker's thread.
pub struct ZmqPublisher {
    /// The number the next batch takes (before any skip).
    next: Cell<u64>,
    /// The number of the last batch (None: none yet).
    last: Cell<Option<u64>>,
    /// Numbers the next batch skips (`kv_events_skip`).
    pending_skip: Cell<u64>,
    /// Batches handed to the ZMQ thread.
    published: Cell<u64>,
    /// Batches numbered but dropped: the channel was full (or the ZMQ thread gone).
    dropped: Cell<u64>,
    /// None once the worker died.
    sink: RefCell<Option<flume::Sender<Batch>>>,
    /// Where its sockets are, for /sim/stats.
    at: BoundEndpoints,
    /// Reused by every tracked cache lookup of the worker.
    pub scratch: RefCell<CacheChanges>,
}

// === impl ZmqPublisher ===

impl ZmqPublisher {
    /// A publisher sending to `sink`, whose sockets are `at`.
    pub fn new(sink: flume::Sender<Batch>, at: BoundEndpoints) -> Self {
        Self {
            at,
            next: Cell::new(0),
            last: Cell::new(None),
            pending_skip: Cell::new(0),
            published: Cell::new(0),
            dropped: Cell::new(0),
            sink: RefCell::new(Some(sink)),
            scratch: RefCell::new(CacheChanges::default()),
        }
    }

    /// The next batch's number is `n` higher than it would be (added to any skip not yet applied).
    pub fn skip(&self, n: u64) {
        self.pending_skip.set(self.pending_skip.get().saturating_add(n));
    }

    pub fn pending_skip(&self) -> u64 {
        self.pending_skip.get()
    }

    pub fn last_sequence(&self) -> Option<u64> {
        self.last.get()
    }

    pub fn published(&self) -> u64 {
        self.published.get()
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    /// Numbers a batch of `events` and hands it to the ZMQ thread; returns its number (None
    /// once the worker died: nothing is published any more). Never waits.
    pub fn publish(&self, events: Vec<Event>) -> Option<u64> {
        let sink = self.sink.borrow();
        let sink = sink.as_ref()?;
        let seq = self.next.get().saturating_add(self.pending_skip.replace(0));
        self.next.set(seq.saturating_add(1));
        self.last.set(Some(seq));
        let batch = Batch { seq, timestamp: now_secs(), events };
        match sink.try_send(batch) {
            Ok(()) => self.published.set(self.published.get() + 1),
            Err(_) => self.dropped.set(self.dropped.get() + 1),
        }
        Some(seq)
    }

    /// Publishes what a cache lookup changed (nothing when it changed nothing); `ids_of(i)`
    /// gives block i's token ids.
    pub fn publish_changes(&self, changes: &CacheChanges, block_tokens: usize, ids_of: impl Fn(usize) -> Vec<u32>) {
        if !changes.is_empty() {
            self.publish(change_events(changes, block_tokens, ids_of));
        }
    }

    /// Publishes that the whole cache was dropped.
    pub fn publish_cleared(&self) {
        self.publish(vec![Event::Cleared]);
    }

    /// The worker died: its sockets close (the ZMQ thread sees the channel end), as a dead
    /// engine's would.
    pub fn close(&self) {
        self.sink.borrow_mut().take();
    }

    /// The `"kv_events":{...}` member of /sim/stats.
    pub fn stats_json(&self) -> String {
        let quoted = |s: &str| {
            let mut v = Vec::new();
            crate::sim::render::put_json_str(&mut v, s);
            String::from_utf8(v).unwrap_or_default()
        };
        format!(
            "{{\"published\":{},\"last_sequence\":{},\"dropped\":{},\"endpoint\":{},\"replay_endpoint\":{}}}",
            self.published.get(),
            self.last.get().map_or_else(|| "null".to_string(), |s| s.to_string()),
            self.dropped.get(),
            quoted(&self.at.endpoint),
            self.at.replay.as_deref().map_or_else(|| "null".to_string(), quoted),
        )
    }
}

/// A lookup's changes as events: one `BlockRemoved` with every evicted block, then one
/// `BlockStored` per run of consecutive stored blocks (all their token ids, in order), parented
/// on the block before the run (nil for a run from the prompt's first block). Hashes are the
/// cache's keys.
pub fn change_events(c: &CacheChanges, block_tokens: usize, ids_of: impl Fn(usize) -> Vec<u32>) -> Vec<Event> {
    let mut out = Vec::new();
    if !c.removed.is_empty() {
        out.push(Event::Removed { block_hashes: c.removed.clone() });
    }
    for run in stored_runs(&c.stored) {
        let mut token_ids = Vec::with_capacity(run.len() * block_tokens);
        for b in run {
            token_ids.extend(ids_of(b.index));
        }
        out.push(Event::Stored {
            block_hashes: run.iter().map(|b| b.key).collect(),
            parent: run[0].parent,
            token_ids,
            block_size: block_tokens,
        });
    }
    out
}

/// A batch's msgpack payload.
pub fn encode(batch: &Batch, format: ZmqFormat) -> Vec<u8> {
    let events = batch.events.iter().map(|e| event_value(e, format)).collect();
    let v = Value::Array(vec![Value::F64(batch.timestamp), Value::Array(events), Value::Nil]);
    let mut out = Vec::with_capacity(64);
    // Writing to a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &v);
    out
}

fn event_value(e: &Event, format: ZmqFormat) -> Value {
    let hashes = |h: &[u64]| Value::Array(h.iter().map(|&k| Value::from(k)).collect());
    let (kind, fields) = match e {
        Event::Stored { block_hashes, parent, token_ids, block_size } => (
            "BlockStored",
            vec![
                ("block_hashes", hashes(block_hashes)),
                ("parent_block_hash", parent.map_or(Value::Nil, Value::from)),
                ("token_ids", Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect())),
                ("block_size", Value::from(*block_size as u64)),
                ("lora_id", Value::Nil),
                ("medium", Value::from(MEDIUM)),
            ],
        ),
        Event::Removed { block_hashes } => {
            ("BlockRemoved", vec![("block_hashes", hashes(block_hashes)), ("medium", Value::from(MEDIUM))])
        }
        Event::Cleared => ("AllBlocksCleared", Vec::new()),
    };
    match format {
        ZmqFormat::Array => {
            Value::Array(std::iter::once(Value::from(kind)).chain(fields.into_iter().map(|(_, v)| v)).collect())
        }
        ZmqFormat::Map => Value::Map(
            std::iter::once((Value::from("type"), Value::from(kind)))
                .chain(fields.into_iter().map(|(k, v)| (Value::from(k), v)))
                .collect(),
        ),
    }
}

/// Worker `i`'s endpoint for a `--kv-events-*-endpoint` of `tcp://HOST:PORT`: PORT+i (port 0
/// stays 0: a free port each). `*` (ZMQ's every interface) becomes 0.0.0.0.
pub fn nth_endpoint(base: &str, i: usize) -> Result<String, String> {
    let bad = |why: &str| format!("KV events endpoint {base:?}: {why} (want tcp://HOST:PORT)");
    let rest = base.strip_prefix("tcp://").ok_or_else(|| bad("only tcp:// is served"))?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    let port: u16 = port.parse().map_err(|_| bad("bad port"))?;
    let host = if host == "*" { "0.0.0.0" } else { host };
    let port = match port {
        0 => 0,
        p => u16::try_from(p as usize + i).map_err(|_| bad(&format!("no room for worker {i} at PORT+{i}")))?,
    };
    let endpoint = format!("tcp://{host}:{port}");
    match endpoint.parse::<Endpoint>() {
        Ok(Endpoint::Tcp(..)) => Ok(endpoint),
        Ok(_) => Err(bad("only tcp:// is served")),
        Err(e) => Err(bad(&e.to_string())),
    }
}

/// A worker's sockets to bind and the batches to publish on them.
pub struct Binding {
    pub endpoint: String,
    pub replay: Option<String>,
    pub topic: String,
    pub format: ZmqFormat,
    pub batches: flume::Receiver<Batch>,
}

/// Where a worker's sockets were bound (ports resolved).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BoundEndpoints {
    pub endpoint: String,
    pub replay: Option<String>,
}

/// Starts the ZMQ thread, which binds every binding's sockets (in order) before this returns,
/// then publishes each worker's batches until that worker's channel ends.
pub fn start(bindings: Vec<Binding>) -> Result<Vec<BoundEndpoints>, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("smg-sim-zmq".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(format!("KV events: tokio runtime: {e}")));
                    return;
                }
            };
            rt.block_on(async move {
                let mut opened = Vec::new();
                let mut bound = Vec::new();
                for b in bindings {
                    match open(b).await {
                        Ok((o, at)) => {
                            opened.push(o);
                            bound.push(at);
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    }
                }
                let _ = tx.send(Ok(bound));
                let tasks: Vec<_> = opened.into_iter().map(|o| tokio::spawn(serve(o))).collect();
                for t in tasks {
                    let _ = t.await;
                }
            });
        })
        .map_err(|e| format!("spawn the KV events thread: {e}"))?;
    rx.recv().map_err(|_| "the KV events thread exited during start-up".to_string())?
}

/// A worker's bound sockets.
struct Opened {
    publisher: PubSocket,
    replay: Option<RouterSocket>,
    topic: Bytes,
    format: ZmqFormat,
    batches: flume::Receiver<Batch>,
}

async fn open(b: Binding) -> Result<(Opened, BoundEndpoints), String> {
    let mut publisher = PubSocket::new();
    let at = publisher.bind(&b.endpoint).await.map_err(|e| format!("KV events: bind {}: {e}", b.endpoint))?;
    let (replay, replay_at) = match &b.replay {
        Some(r) => {
            let mut router = RouterSocket::new();
            let at = router.bind(r).await.map_err(|e| format!("KV events replay: bind {r}: {e}"))?;
            (Some(router), Some(at.to_string()))
        }
        None => (None, None),
    };
    let opened =
        Opened { publisher, replay, topic: Bytes::from(b.topic.into_bytes()), format: b.format, batches: b.batches };
    Ok((opened, BoundEndpoints { endpoint: at.to_string(), replay: replay_at }))
}

/// The last batches published, oldest first, for replay.
type Kept = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// Publishes a worker's batches until its channel ends (the worker died), then closes its sockets.
async fn serve(o: Opened) {
    let Opened { mut publisher, replay, topic, format, batches } = o;
    let kept: Kept = Arc::new(Mutex::new(VecDeque::new()));
    let replaying = replay.map(|r| tokio::spawn(serve_replay(r, kept.clone())));
    while let Ok(batch) = batches.recv_async().await {
        let payload = Bytes::from(encode(&batch, format));
        {
            let mut k = kept.lock().unwrap_or_else(|e| e.into_inner());
            if k.len() == KEEP_BATCHES {
                k.pop_front();
            }
            k.push_back((batch.seq, payload.clone()));
        }
        let frames = vec![topic.clone(), Bytes::copy_from_slice(&batch.seq.to_be_bytes()), payload];
        // PUB never waits for a subscriber: a slow one loses messages (and replays).
        let _ = publisher.send(message(frames)).await;
    }
    if let Some(r) = replaying {
        r.abort();
    }
    let _ = publisher.close().await;
}

/// Answers replay requests until aborted: each on a task of its own, so a client that does
/// not read holds up neither the publisher nor other clients.
async fn serve_replay(router: RouterSocket, kept: Kept) {
    let (send, mut recv) = router.split();
    loop {
        let Ok(m) = recv.recv().await else { continue };
        let Some((identity, start)) = replay_request(&m) else { continue };
        let batches: Vec<(u64, Bytes)> = {
            let k = kept.lock().unwrap_or_else(|e| e.into_inner());
            let from = k.partition_point(|(seq, _)| *seq < start);
            k.range(from..).cloned().collect()
        };
        let mut send = send.clone();
        tokio::spawn(async move {
            for (seq, payload) in batches {
                let frames = vec![identity.clone(), Bytes::new(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
                if send.send(message(frames)).await.is_err() {
                    return;
                }
            }
            let end = vec![identity, Bytes::new(), Bytes::copy_from_slice(&END_OF_REPLAY.to_be_bytes()), Bytes::new()];
            let _ = send.send(message(end)).await;
        });
    }
}

fn message(frames: Vec<Bytes>) -> ZmqMessage {
    // Never empty: the frames are built above.
    ZmqMessage::try_from(frames).unwrap_or_else(|_| ZmqMessage::from(Bytes::new()))
}

/// `[identity, empty, start]` (start: up to 8 bytes, big-endian) as (identity, start); None
/// for anything else, which is ignored.
fn replay_request(m: &ZmqMessage) -> Option<(Bytes, u64)> {
    if m.len() != 3 || !m.get(1)?.is_empty() {
        return None;
    }
    let start = m.get(2)?;
    if start.len() > 8 {
        return None;
    }
    let start = start.iter().fold(0u64, |n, &b| n << 8 | b as u64);
    Some((m.get(0)?.clone(), start))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::prefix_cache::{PrefixCache, StoredBlock};

    fn decode(payload: &[u8]) -> Value {
        let mut r = payload;
        let v = rmpv::decode::read_value(&mut r).unwrap();
        assert!(r.is_empty(), "one value");
        v
    }

    fn u64s(v: &Value) -> Vec<u64> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
    }

    #[test]
    fn numbering_skips_drops_and_close() {
        let (tx, rx) = flume::bounded(2);
        let at = BoundEndpoints { endpoint: "tcp://127.0.0.1:1".into(), replay: None };
        let p = ZmqPublisher::new(tx, at);
        assert_eq!(p.last_sequence(), None);
        assert!(p.stats_json().contains("\"last_sequence\":null"), "{}", p.stats_json());
        assert_eq!(p.publish(vec![Event::Cleared]), Some(0));
        p.skip(3);
        p.skip(2);
        assert_eq!(p.pending_skip(), 5);
        assert_eq!(p.publish(vec![Event::Cleared]), Some(6));
        assert_eq!(p.pending_skip(), 0);
        // The channel holds 2: the third is dropped, its number used all the same.
        assert_eq!(p.publish(vec![Event::Cleared]), Some(7));
        assert_eq!((p.published(), p.dropped(), p.last_sequence()), (2, 1, Some(7)));
        assert_eq!(rx.try_iter().map(|b| b.seq).collect::<Vec<_>>(), [0, 6]);
        assert_eq!(p.publish(vec![Event::Cleared]), Some(8));
        assert_eq!(rx.try_recv().unwrap().seq, 8);
        assert_eq!(
            p.stats_json(),
            r#"{"published":3,"last_sequence":8,"dropped":1,"endpoint":"tcp://127.0.0.1:1","replay_endpoint":null}"#
        );
        p.close();
        assert_eq!(p.publish(vec![Event::Cleared]), None);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn changes_become_removed_then_stored_runs() {
        let block = |index: usize, key: u64, parent: Option<u64>| StoredBlock { index, key, parent };
        let mut c = CacheChanges::default();
        c.stored = vec![block(0, 10, None), block(1, 11, Some(10)), block(3, u64::MAX, Some(12))];
        c.removed = vec![7, 8];
        let ids = |i: usize| vec![i as u32 * 2, i as u32 * 2 + 1];
        let ev = change_events(&c, 2, ids);
        assert_eq!(
            ev,
            [
                Event::Removed { block_hashes: vec![7, 8] },
                Event::Stored { block_hashes: vec![10, 11], parent: None, token_ids: vec![0, 1, 2, 3], block_size: 2 },
                Event::Stored { block_hashes: vec![u64::MAX], parent: Some(12), token_ids: vec![6, 7], block_size: 2 },
            ]
        );
    }

    #[test]
    fn array_and_map_payloads() {
        let batch = Batch {
            seq: 4,
            timestamp: 1.5,
            events: vec![
                Event::Removed { block_hashes: vec![1] },
                Event::Stored {
                    block_hashes: vec![u64::MAX, 2],
                    parent: Some(9),
                    token_ids: vec![5, 6],
                    block_size: 1,
                },
                Event::Stored { block_hashes: vec![3], parent: None, token_ids: vec![7], block_size: 1 },
                Event::Cleared,
            ],
        };
        let v = decode(&encode(&batch, ZmqFormat::Array));
        let top = v.as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!((top[0].as_f64(), top[2].is_nil()), (Some(1.5), true));
        let ev = top[1].as_array().unwrap();
        let removed = ev[0].as_array().unwrap();
        assert_eq!(
            (removed[0].as_str(), u64s(&removed[1]), removed[2].as_str()),
            (Some("BlockRemoved"), vec![1], Some("GPU"))
        );
        let stored = ev[1].as_array().unwrap();
        assert_eq!(stored.len(), 7);
        assert_eq!(stored[0].as_str(), Some("BlockStored"));
        assert_eq!(u64s(&stored[1]), [u64::MAX, 2], "unsigned 64-bit hashes");
        assert_eq!(stored[2].as_u64(), Some(9));
        assert_eq!(u64s(&stored[3]), [5, 6]);
        assert_eq!(stored[4].as_u64(), Some(1));
        assert!(stored[5].is_nil());
        assert_eq!(stored[6].as_str(), Some("GPU"));
        assert!(ev[2].as_array().unwrap()[2].is_nil(), "no parent at the prompt's start");
        assert_eq!(ev[3], Value::Array(vec![Value::from("AllBlocksCleared")]));

        let v = decode(&encode(&batch, ZmqFormat::Map));
        let ev = v.as_array().unwrap()[1].as_array().unwrap().clone();
        let field = |e: &Value, name: &str| {
            e.as_map().unwrap().iter().find(|(k, _)| k.as_str() == Some(name)).map(|(_, v)| v.clone())
        };
        assert_eq!(field(&ev[0], "type").unwrap().as_str(), Some("BlockRemoved"));
        assert_eq!(ev[0].as_map().unwrap().len(), 3);
        assert_eq!(field(&ev[1], "type").unwrap().as_str(), Some("BlockStored"));
        assert_eq!(ev[1].as_map().unwrap().len(), 7);
        assert_eq!(u64s(&field(&ev[1], "block_hashes").unwrap()), [u64::MAX, 2]);
        assert_eq!(field(&ev[1], "parent_block_hash").unwrap().as_u64(), Some(9));
        assert_eq!(u64s(&field(&ev[1], "token_ids").unwrap()), [5, 6]);
        assert_eq!(field(&ev[1], "block_size").unwrap().as_u64(), Some(1));
        assert!(field(&ev[1], "lora_id").unwrap().is_nil());
        assert_eq!(field(&ev[1], "medium").unwrap().as_str(), Some("GPU"));
        assert!(field(&ev[2], "parent_block_hash").unwrap().is_nil());
        assert_eq!(ev[3], Value::Map(vec![(Value::from("type"), Value::from("AllBlocksCleared"))]));
    }

    #[test]
    fn a_cache_lookup_published_with_ids_from_bytes() {
        let mut cache = PrefixCache::new(1000, 2, 4);
        let (tx, rx) = flume::bounded(8);
        let p = ZmqPublisher::new(tx, BoundEndpoints::default());
        let ids: Vec<u32> = (1..=5).collect();
        let key: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        let mut ch = p.scratch.borrow_mut();
        cache.lookup_insert_tracked(&key, &mut ch);
        p.publish_changes(&ch, 2, |i| crate::sim::kv_events::ids_from_bytes(&key[i * 8..(i + 1) * 8], 4));
        let b = rx.try_recv().unwrap();
        let Event::Stored { token_ids, parent, block_hashes, .. } = &b.events[0] else { panic!("{b:?}") };
        assert_eq!((token_ids.as_slice(), *parent, block_hashes.len()), (&[1, 2, 3, 4][..], None, 2));
        // Nothing changed: nothing published.
        cache.lookup_insert_tracked(&key, &mut ch);
        p.publish_changes(&ch, 2, |_| unreachable!());
        assert_eq!((p.published(), rx.try_recv().is_err()), (1, true));
    }

    #[test]
    fn endpoints_per_worker() {
        assert_eq!(nth_endpoint("tcp://127.0.0.1:5557", 0).unwrap(), "tcp://127.0.0.1:5557");
        assert_eq!(nth_endpoint("tcp://127.0.0.1:5557", 3).unwrap(), "tcp://127.0.0.1:5560");
        assert_eq!(nth_endpoint("tcp://127.0.0.1:0", 3).unwrap(), "tcp://127.0.0.1:0");
        assert_eq!(nth_endpoint("tcp://*:5557", 1).unwrap(), "tcp://0.0.0.0:5558");
        assert_eq!(nth_endpoint("tcp://[::1]:5557", 1).unwrap(), "tcp://[::1]:5558");
        for bad in ["ipc:///tmp/x", "tcp://127.0.0.1", "tcp://127.0.0.1:x", "127.0.0.1:5557", "tcp://:5"] {
            assert!(nth_endpoint(bad, 0).is_err(), "{bad}");
        }
        assert!(nth_endpoint("tcp://127.0.0.1:65535", 1).is_err());
    }

    #[test]
    fn replay_requests() {
        let req = |frames: Vec<&[u8]>| {
            ZmqMessage::try_from(frames.into_iter().map(Bytes::copy_from_slice).collect::<Vec<_>>()).unwrap()
        };
        let got = replay_request(&req(vec![b"id", b"", &5u64.to_be_bytes()]));
        assert_eq!(got, Some((Bytes::from_static(b"id"), 5)));
        assert_eq!(replay_request(&req(vec![b"id", b"", &[1, 0]])).map(|r| r.1), Some(256));
        assert_eq!(replay_request(&req(vec![b"id", b"x", &[1]])), None);
        assert_eq!(replay_request(&req(vec![b"id", &[1]])), None);
        assert_eq!(replay_request(&req(vec![b"id", b"", &[0; 9]])), None);
    }
}
