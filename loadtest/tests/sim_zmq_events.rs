//! smg-sim's HTTP workers publishing their prefix cache as KV events over ZMQ, in vLLM's wire
//! format (`--kv-events-endpoint`): a zeromq SUB sees stored runs with the prompt's ids (its
//! bytes read as little-endian words of --bytes-per-token) and chained parents, evictions,
//! flushes, the `kv_events_skip` gap, both event layouts and the topic; a DEALER replays from a
//! sequence number up to the -1 end marker; the sockets close when the worker dies.
//!
//! ZMQ's slow joiner: a SUB's subscription reaches the publisher some time after it connects,
//! and PUB drops what no subscription matches. [`join`] flushes the worker (one batch each)
//! until one arrives. Every wait is on a message or a stats value, bounded by the patience
//! factor.

mod common;

use std::future::Future;
use std::net::TcpStream;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::*;
use rmpv::Value;
use sonic_rs::JsonValueTrait;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

/// 4 tokens of 4 bytes: a block is 16 prompt bytes.
const BLOCK_BYTES: usize = 16;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime")
}

/// `f`, or a failure naming `what` once the patience bound has passed.
async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(patience(Duration::from_secs(10)), f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: nothing within the patience bound"),
    }
}

/// The `kv_events=` and `kv_events_replay=` endpoints of a `listening` line.
fn endpoints(line: &str) -> (String, Option<String>) {
    let field = |name: &str| line.split_whitespace().find_map(|f| f.strip_prefix(name)).map(str::to_string);
    (field("kv_events=").unwrap_or_else(|| panic!("no kv_events= in {line:?}")), field("kv_events_replay="))
}

/// One PUB message: [topic, sequence, payload].
#[derive(Debug)]
struct Msg {
    topic: Bytes,
    seq: u64,
    payload: Bytes,
}

impl Msg {
    /// (timestamp, events, data_parallel_rank).
    fn batch(&self) -> (f64, Vec<Value>, Value) {
        let mut r = &self.payload[..];
        let v = rmpv::decode::read_value(&mut r).expect("msgpack payload");
        assert!(r.is_empty(), "one value per payload");
        let Value::Array(top) = v else { panic!("a batch is an array: {v:?}") };
        assert_eq!(top.len(), 3, "{top:?}");
        let events = top[1].as_array().expect("events").clone();
        (top[0].as_f64().expect("f64 timestamp"), events, top[2].clone())
    }

    fn events(&self) -> Vec<Value> {
        self.batch().1
    }
}

fn seq_of(frame: &[u8]) -> u64 {
    u64::from_be_bytes(frame.try_into().expect("an 8-byte sequence number"))
}

async fn next(sub: &mut SubSocket) -> Msg {
    let m = within("a KV event message", sub.recv()).await.expect("SUB recv");
    let f = m.into_vec();
    assert_eq!(f.len(), 3, "[topic, sequence, payload]: {f:?}");
    Msg { topic: f[0].clone(), seq: seq_of(&f[1]), payload: f[2].clone() }
}

/// `/sim/control {"flush_cache": true}`: publishes AllBlocksCleared; returns its number.
fn flush(port: u16) -> u64 {
    let st = http(port, "POST", "/sim/control", r#"{"flush_cache":true}"#).json();
    st["kv_events"]["last_sequence"].as_u64().expect("a flush numbers a batch")
}

/// A SUB on `endpoint` for `topic`, once its subscription is in place: flushes until the
/// flush's batch arrives (older ones still in flight are read past). Returns the SUB, the
/// last sequence number the worker used, and the first flush's number (the worker says it
/// when asked, whether or not a SUB joined in time to see that batch).
async fn join(port: u16, endpoint: &str, topic: &str) -> (SubSocket, u64, u64) {
    let mut sub = SubSocket::new();
    within("SUB connect", sub.connect(endpoint)).await.expect("connect");
    sub.subscribe(topic).await.expect("subscribe");
    let until = Instant::now() + patience(Duration::from_secs(10));
    let mut first_flush = None;
    loop {
        let last = flush(port);
        let first = *first_flush.get_or_insert(last);
        let got = tokio::time::timeout(patience(Duration::from_millis(200)), async {
            loop {
                let m = next(&mut sub).await;
                if m.seq == last {
                    return;
                }
            }
        })
        .await;
        if got.is_ok() {
            return (sub, last, first);
        }
        assert!(Instant::now() < until, "no KV event on {endpoint} within the patience bound");
    }
}

/// A prompt's whole blocks as the simulator reads them: 4-byte little-endian ids.
fn block_ids(prompt: &str) -> Vec<Vec<u64>> {
    prompt
        .as_bytes()
        .chunks_exact(BLOCK_BYTES)
        .map(|b| b.chunks(4).map(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]) as u64).collect())
        .collect()
}

fn chat(port: u16, messages: &str) {
    let body = format!(r#"{{"model":"sim-model","messages":{messages},"max_tokens":1}}"#);
    assert_eq!(http(port, "POST", "/v1/chat/completions", &body).status, 200);
}

fn completion(port: u16, prompt: &str) {
    let body = format!(r#"{{"model":"sim-model","prompt":{prompt},"max_tokens":1}}"#);
    assert_eq!(http(port, "POST", "/v1/completions", &body).status, 200);
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array().expect("an array").iter().map(|x| x.as_u64().expect("an unsigned int")).collect()
}

fn kind(e: &Value) -> &str {
    match e {
        Value::Array(a) => a[0].as_str().expect("a type tag"),
        other => panic!("an array event: {other:?}"),
    }
}

/// An array-format BlockStored: (block_hashes, parent, token_ids).
fn stored(e: &Value) -> (Vec<u64>, Option<u64>, Vec<u64>) {
    let a = e.as_array().expect("an array event");
    assert_eq!(a.len(), 7, "{a:?}");
    assert_eq!(a[0].as_str(), Some("BlockStored"));
    assert_eq!(a[4].as_u64(), Some(4), "block_size");
    assert!(a[5].is_nil(), "lora_id");
    assert_eq!(a[6].as_str(), Some("GPU"), "medium");
    (u64s(&a[1]), a[2].as_u64(), u64s(&a[3]))
}

fn cleared(m: &Msg) -> bool {
    matches!(m.events().as_slice(), [Value::Array(a)] if a.len() == 1 && a[0].as_str() == Some("AllBlocksCleared"))
}

async fn replay(dealer: &mut DealerSocket, start: u64) -> Vec<(u64, Bytes)> {
    let req = ZmqMessage::try_from(vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())]).unwrap();
    within("replay request", dealer.send(req)).await.expect("DEALER send");
    let mut out = Vec::new();
    loop {
        let f = within("a replayed batch", dealer.recv()).await.expect("DEALER recv").into_vec();
        assert_eq!(f.len(), 3, "[empty, sequence, payload]: {f:?}");
        assert!(f[0].is_empty(), "the empty delimiter");
        if i64::from_be_bytes(f[1][..].try_into().unwrap()) == -1 {
            assert!(f[2].is_empty(), "the end marker's payload is empty");
            return out;
        }
        out.push((seq_of(&f[1]), f[2].clone()));
    }
}

#[test]
fn zmq_events_follow_the_prefix_cache() {
    for legacy in DRIVERS {
        // 4-token blocks of 4 bytes, room for 8 of them.
        let args = [
            "--ports",
            "0",
            "--block-tokens",
            "4",
            "--bytes-per-token",
            "4",
            "--cache-tokens",
            "32",
            "--kv-events-endpoint",
            "tcp://127.0.0.1:0",
            "--kv-events-replay-endpoint",
            "tcp://127.0.0.1:0",
        ];
        let sim = Sim::start(&args, legacy);
        let port = sim.port();
        let (endpoint, replay_at) = endpoints(&sim.lines[0]);
        let replay_at = replay_at.expect("a replay endpoint");
        let kv = &http(port, "GET", "/sim/stats", "").json()["kv_events"];
        assert_eq!(kv["endpoint"].as_str(), Some(endpoint.as_str()));
        assert_eq!(kv["replay_endpoint"].as_str(), Some(replay_at.as_str()));
        runtime().block_on(async {
            let (mut sub, joined, _) = join(port, &endpoint, "").await;

            // A chat prompt (its cache bytes: the raw `messages` JSON) of two whole blocks and
            // a tail: one BlockStored, no parent, every block's ids.
            let m1 = r#"[{"role":"user","content":"hello world"}]"#;
            chat(port, m1);
            let b1 = next(&mut sub).await;
            assert_eq!((b1.topic.as_ref(), b1.seq), (&b""[..], joined + 1));
            let (ts, events, rank) = b1.batch();
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
            assert!((ts - now).abs() < 60.0, "timestamp {ts} vs now {now}");
            assert!(rank.is_nil(), "data_parallel_rank");
            assert_eq!(events.len(), 1);
            let (h1, parent, ids) = stored(&events[0]);
            assert_eq!((h1.len(), parent), (2, None));
            assert_eq!(ids, block_ids(m1).concat());

            // Sharing those two blocks: only the new ones, parented on the last shared one.
            let m2 = r#"[{"role":"user","content":"hello there, a longer prompt than the first one"}]"#;
            assert_eq!(&m2.as_bytes()[..2 * BLOCK_BYTES], &m1.as_bytes()[..2 * BLOCK_BYTES]);
            assert_eq!(block_ids(m2).len(), 4);
            chat(port, m2);
            let b2 = next(&mut sub).await;
            assert_eq!(b2.seq, joined + 2);
            let events = b2.events();
            let (h2, parent, ids) = stored(&events[0]);
            assert_eq!((h2.len(), parent), (2, Some(h1[1])));
            assert_eq!(ids, block_ids(m2)[2..].concat());

            // All cached: nothing published. Then six new blocks in a cache of eight holding
            // four: the two least recently used (m1's, touched before m2's own) go, reported
            // first in the batch. A completion's cache bytes: the raw `prompt` JSON.
            chat(port, m2);
            let p3 =
                r#""a completion prompt of six whole blocks of sixteen bytes each, sharing no prefix with the chats.""#;
            assert_eq!(block_ids(p3).len(), 6);
            completion(port, p3);
            let b3 = next(&mut sub).await;
            assert_eq!(b3.seq, joined + 3, "the all-cached request published nothing");
            let events = b3.events();
            assert_eq!(events.len(), 2);
            let removed = events[0].as_array().unwrap();
            assert_eq!((kind(&events[0]), removed.len()), ("BlockRemoved", 3));
            assert_eq!((u64s(&removed[1]), removed[2].as_str()), (h1.clone(), Some("GPU")));
            let (h3, parent, ids) = stored(&events[1]);
            assert_eq!((h3.len(), parent), (6, None));
            assert_eq!(ids, block_ids(p3).concat());

            // /flush_cache publishes AllBlocksCleared; a skip of 5 leaves a gap before the next.
            assert_eq!(http(port, "POST", "/flush_cache", "").status, 200);
            let b4 = next(&mut sub).await;
            assert!(b4.seq == joined + 4 && cleared(&b4), "{b4:?}");
            let st = http(port, "POST", "/sim/control", r#"{"kv_events_skip":5}"#).json();
            assert_eq!(st["settings"]["kv_events_skip"].as_u64(), Some(5));
            let gap_end = flush(port);
            assert_eq!(gap_end, joined + 10);
            let b10 = next(&mut sub).await;
            assert!(b10.seq == gap_end && cleared(&b10), "{b10:?}");
            let kv = &http(port, "GET", "/sim/stats", "").json()["kv_events"];
            assert_eq!(kv["last_sequence"].as_u64(), Some(gap_end));
            assert_eq!(kv["dropped"].as_u64(), Some(0));
            // Every number but the skipped ones was published.
            assert_eq!(kv["published"].as_u64(), Some(gap_end + 1 - 5));

            // Replay from b2: the kept batches from there on, byte for byte, then -1. From a
            // skipped number: what follows the gap. Past the last: the end marker alone.
            let mut dealer = DealerSocket::new();
            within("DEALER connect", dealer.connect(&replay_at)).await.expect("connect");
            let got = replay(&mut dealer, b2.seq).await;
            let want: Vec<(u64, Bytes)> = [&b2, &b3, &b4, &b10].iter().map(|m| (m.seq, m.payload.clone())).collect();
            assert_eq!(got, want);
            let got = replay(&mut dealer, b4.seq + 1).await;
            assert_eq!(got.iter().map(|b| b.0).collect::<Vec<_>>(), [gap_end]);
            assert!(replay(&mut dealer, gap_end + 1).await.is_empty());
            // From 0: every batch since start, the join's flushes included, in order.
            let all = replay(&mut dealer, 0).await;
            assert_eq!(all.first().map(|b| b.0), Some(0));
            assert_eq!(all.last().map(|b| b.0), Some(gap_end));
            assert_eq!(all.len() as u64, gap_end + 1 - 5);

            // The worker dies: its ZMQ sockets close with it.
            let _ = http_raw(port, &request_bytes("POST", "/sim/control", r#"{"die":true}"#), Duration::from_secs(5));
            for at in [&endpoint, &replay_at] {
                let addr = at.strip_prefix("tcp://").unwrap().to_string();
                let closed = wait_until(patience(Duration::from_secs(10)), || TcpStream::connect(&addr).is_err());
                assert!(closed, "{at} still accepts after the worker died");
            }
        });
    }
}

/// `--kv-events-format map` and `--kv-events-topic`: the same events as maps, under the topic;
/// a SUB for another topic gets none of them. Two workers in one process bind PORT and PORT+1.
#[test]
fn zmq_events_map_format_topic_and_ports() {
    // Two consecutive free ports for the PUB sockets. Another test (or process) may take one
    // between the check and the simulator's bind: then the simulator exits, and it is tried
    // again on other ports.
    let free_pair = || {
        for _ in 0..50 {
            let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let p = a.local_addr().unwrap().port();
            if p < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
                return p;
            }
        }
        panic!("no two consecutive free ports");
    };
    let (base, sim) = (0..20)
        .find_map(|_| {
            let base = free_pair();
            let endpoint = format!("tcp://127.0.0.1:{base}");
            let args = [
                "--ports",
                "0,0",
                "--threads",
                "2",
                "--block-tokens",
                "4",
                "--bytes-per-token",
                "4",
                "--kv-events-endpoint",
                &endpoint,
                "--kv-events-topic",
                "kv-a",
                "--kv-events-format",
                "map",
            ];
            Sim::try_start(&args, false).map(|sim| (base, sim))
        })
        .expect("smg-sim never bound two consecutive free ports");
    let ends: Vec<String> = sim.lines.iter().map(|l| endpoints(l).0).collect();
    assert_eq!(ends, [format!("tcp://127.0.0.1:{base}"), format!("tcp://127.0.0.1:{}", base + 1)]);
    assert!(sim.lines.iter().all(|l| endpoints(l).1.is_none()), "no replay socket without the flag");
    let port = sim.ports[1];
    runtime().block_on(async {
        let mut other = SubSocket::new();
        within("SUB connect", other.connect(&ends[1])).await.expect("connect");
        other.subscribe("kv-b").await.expect("subscribe");
        let (mut sub, joined, _) = join(port, &ends[1], "kv-a").await;

        let m = r#"[{"role":"user","content":"hello world, twice over"}]"#;
        chat(port, m);
        let b = next(&mut sub).await;
        assert_eq!((b.topic.as_ref(), b.seq), (&b"kv-a"[..], joined + 1));
        let events = b.events();
        let Value::Map(fields) = &events[0] else { panic!("a map event: {events:?}") };
        let field = |name: &str| fields.iter().find(|(k, _)| k.as_str() == Some(name)).map(|(_, v)| v.clone());
        let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str().unwrap()).collect();
        assert_eq!(
            names,
            ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"]
        );
        assert_eq!(field("type").unwrap().as_str(), Some("BlockStored"));
        assert_eq!(u64s(&field("block_hashes").unwrap()).len(), 3);
        assert!(field("parent_block_hash").unwrap().is_nil());
        assert_eq!(u64s(&field("token_ids").unwrap()), block_ids(m).concat());
        assert_eq!(field("block_size").unwrap().as_u64(), Some(4));
        assert!(field("lora_id").unwrap().is_nil());
        assert_eq!(field("medium").unwrap().as_str(), Some("GPU"));
        let last = flush(port);
        let c = next(&mut sub).await;
        assert_eq!(c.seq, last);
        let Value::Map(fields) = &c.events()[0] else { panic!("a map event") };
        assert_eq!(fields.len(), 1);
        assert_eq!(fields[0].1.as_str(), Some("AllBlocksCleared"));

        // The other topic's SUB: nothing queued once its peer got every batch and one more
        // round trip (a message sent to it would have been sent with those).
        assert!(futures_now(other.recv()).is_none(), "a SUB for kv-b got a kv-a message");
        // The first worker publishes on its own port, from its own sequence.
        // Numbered from 0: the worker's first batch. Not the batch the SUB first saw: on a busy
        // host the SUB may join after that batch went out (ZeroMQ drops a PUB's messages
        // until the subscription arrives), and join then flushes again.
        let (mut first, _, first_flush) = join(sim.ports[0], &ends[0], "kv-a").await;
        assert_eq!(first_flush, 0, "numbered from 0");
        // A worker that dies closes its sockets; the other worker's stay open.
        let _ = http_raw(port, &request_bytes("POST", "/sim/control", r#"{"die":true}"#), Duration::from_secs(5));
        let addr = |e: &str| e.strip_prefix("tcp://").unwrap().to_string();
        let closed = wait_until(patience(Duration::from_secs(10)), || TcpStream::connect(addr(&ends[1])).is_err());
        assert!(closed, "{} still accepts after its worker died", ends[1]);
        assert!(TcpStream::connect(addr(&ends[0])).is_ok());
        let last = flush(sim.ports[0]);
        assert_eq!(next(&mut first).await.seq, last);
    });
}

/// Polls `f` once: its output if it is ready now.
fn futures_now<F: Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}
