//! One HTTP worker's KV-cache events over ZMQ, in vLLM's wire format (SGLang's is the same):
//! a SUB socket on the worker's publisher, each message `[topic, sequence (8 bytes,
//! big-endian), msgpack payload]`. A gap in the sequence asks the replay socket (a ROUTER)
//! for what was missed, as vLLM's replay protocol defines: `[empty, first missing sequence]`
//! goes out, `[empty, sequence, payload]` batches come back, ending with sequence -1. What
//! replay cannot return is passed on as a jump, and the events thread rebuilds the worker. A
//! feed that joins a publisher already counting asks for what it sent before, from 0.
//! A socket that fails is opened again after a backoff.

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc::UnboundedSender;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use super::event::from_msgpack;
use super::feed::{back_off, Feed, BACKOFF};
use crate::workers::kv_events_source::KvEventsSource;

/// The longest a replay may take before what it returned so far is used.
const REPLAY_WITHIN: Duration = Duration::from_secs(5);

/// Follows `src` for the worker registered as `url` until the thread drops the receiver.
pub async fn follow(url: String, src: KvEventsSource, tx: UnboundedSender<Feed>) {
    let mut backoff = BACKOFF.0;
    // The last sequence passed on, across reconnections (None: none yet).
    let mut last: Option<u64> = None;
    loop {
        let why = match subscribe(&url, &src, &tx, &mut last, &mut backoff).await {
            Ok(()) => return,
            Err(e) => e,
        };
        if tx.send(Feed::Down { url: url.clone(), why }).is_err() {
            return;
        }
        back_off(&mut backoff).await;
    }
}

/// One SUB socket, until it fails (Err) or the thread is gone (Ok).
async fn subscribe(
    url: &str,
    src: &KvEventsSource,
    tx: &UnboundedSender<Feed>,
    last: &mut Option<u64>,
    backoff: &mut Duration,
) -> Result<(), String> {
    let mut sub = SubSocket::new();
    sub.connect(&src.endpoint).await.map_err(|e| format!("connect {}: {e}", src.endpoint))?;
    sub.subscribe(&src.topic).await.map_err(|e| format!("subscribe: {e}"))?;
    if tx.send(Feed::Up { url: url.to_string() }).is_err() {
        return Ok(());
    }
    loop {
        let m = sub.recv().await.map_err(|e| format!("receive: {e}"))?;
        *backoff = BACKOFF.0;
        let Some((seq, payload)) = batch_of(&m, 1) else { continue };
        // Missed: after the last one passed on, or, on joining, what the publisher sent
        // before (its sequence starts at 0).
        let missed_from = match *last {
            Some(l) => l + 1,
            None => 0,
        };
        if let Some(replay) = src.replay.as_ref().filter(|_| seq > missed_from) {
            for (s, p) in replayed(replay, missed_from, seq).await {
                if !pass(url, s, &p, tx, last) {
                    return Ok(());
                }
            }
        }
        // A sequence that goes back is a restarted publisher: passed on, and the events
        // thread rebuilds the worker from it.
        if !pass(url, seq, &payload, tx, last) {
            return Ok(());
        }
    }
}

/// `(sequence, payload)` of a message whose sequence frame is at `at`.
fn batch_of(m: &ZmqMessage, at: usize) -> Option<(u64, Bytes)> {
    let seq = m.get(at)?;
    let seq = u64::from_be_bytes(seq.as_ref().try_into().ok()?);
    Some((seq, m.get(at + 1)?.clone()))
}

/// Decodes and hands one batch on; false when the thread is gone.
fn pass(url: &str, seq: u64, payload: &[u8], tx: &UnboundedSender<Feed>, last: &mut Option<u64>) -> bool {
    *last = Some(seq);
    match from_msgpack(payload) {
        Ok(batch) => tx.send(Feed::Batch { url: url.to_string(), seq, batch }).is_ok(),
        Err(e) => {
            crate::debug!("KV-cache events of {url}: batch {seq} skipped: {}", e.0);
            true
        }
    }
}

/// The batches from `from` up to (not including) `until` that the replay socket still has.
async fn replayed(endpoint: &str, from: u64, until: u64) -> Vec<(u64, Bytes)> {
    let ask = async {
        let mut d = DealerSocket::new();
        d.connect(endpoint).await.ok()?;
        let mut req = ZmqMessage::from(Bytes::new());
        req.push_back(Bytes::copy_from_slice(&from.to_be_bytes()));
        d.send(req).await.ok()?;
        let mut out = Vec::new();
        loop {
            let m = d.recv().await.ok()?;
            // [empty, sequence, payload]; -1 ends.
            let seq = m.get(1).and_then(|s| <[u8; 8]>::try_from(s.as_ref()).ok()).map(i64::from_be_bytes)?;
            if seq < 0 {
                return Some(out);
            }
            if let Some((s, p)) = batch_of(&m, 1).filter(|(s, _)| *s >= from && *s < until) {
                out.push((s, p));
            }
        }
    };
    tokio::time::timeout(REPLAY_WITHIN, ask).await.ok().flatten().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use zeromq::{PubSocket, RouterSocket, SocketRecv};

    fn payload(hash: u64) -> Bytes {
        use rmpv::Value;
        let ev = Value::Array(vec![
            Value::from("BlockStored"),
            Value::Array(vec![Value::from(hash)]),
            Value::Nil,
            Value::Array(vec![Value::from(1u32), Value::from(2u32)]),
            Value::from(2u32),
            Value::Nil,
            Value::from("GPU"),
        ]);
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &Value::Array(vec![Value::F64(0.0), Value::Array(vec![ev]), Value::Nil]))
            .unwrap();
        Bytes::from(out)
    }

    fn message(frames: Vec<Bytes>) -> ZmqMessage {
        let mut it = frames.into_iter();
        let mut m = ZmqMessage::from(it.next().unwrap());
        for f in it {
            m.push_back(f);
        }
        m
    }

    fn port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// A gap asks the replay socket for the missed batches, which arrive in order before the
    /// batch that showed the gap; a topic other than the subscribed one is never seen.
    #[test]
    fn a_gap_is_replayed_in_order() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (p, r) = (port(), port());
            let mut publisher = PubSocket::new();
            publisher.bind(&format!("tcp://127.0.0.1:{p}")).await.unwrap();
            let mut router = RouterSocket::new();
            router.bind(&format!("tcp://127.0.0.1:{r}")).await.unwrap();
            let src = KvEventsSource {
                endpoint: format!("tcp://127.0.0.1:{p}"),
                replay: Some(format!("tcp://127.0.0.1:{r}")),
                topic: "kv".into(),
            };
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let feed = tokio::spawn(follow("w".into(), src, tx));
            let send = |seq: u64, topic: &'static str| {
                message(vec![Bytes::from(topic), Bytes::copy_from_slice(&seq.to_be_bytes()), payload(seq)])
            };
            // Until the subscription has joined (ZMQ drops what a publisher sends before).
            let mut seqs = Vec::new();
            loop {
                publisher.send(send(0, "kv")).await.unwrap();
                match tokio::time::timeout(Duration::from_millis(50), rx.recv()).await {
                    Ok(Some(Feed::Batch { seq, .. })) => {
                        seqs.push(seq);
                        break;
                    }
                    _ => continue,
                }
            }
            publisher.send(send(1, "other")).await.unwrap();
            publisher.send(send(4, "kv")).await.unwrap();
            // The replay request: [identity, empty, 1].
            let ask = router.recv().await.unwrap();
            assert_eq!(ask.get(2).map(|b| b.as_ref()), Some(&1u64.to_be_bytes()[..]));
            let id = ask.get(0).unwrap().clone();
            for s in 1..4u64 {
                router
                    .send(message(vec![id.clone(), Bytes::new(), Bytes::copy_from_slice(&s.to_be_bytes()), payload(s)]))
                    .await
                    .unwrap();
            }
            router
                .send(message(vec![id, Bytes::new(), Bytes::copy_from_slice(&(-1i64).to_be_bytes()), Bytes::new()]))
                .await
                .unwrap();
            while seqs.last() != Some(&4) {
                if let Some(Feed::Batch { seq, .. }) = rx.recv().await {
                    seqs.push(seq);
                }
            }
            // (A second 0 may have joined in time too.)
            let after: Vec<u64> = seqs.into_iter().filter(|&s| s != 0).collect();
            assert_eq!(after, [1, 2, 3, 4]);
            feed.abort();
        });
    }
}
