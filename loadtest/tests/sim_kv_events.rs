//! `smg-sim --grpc` publishing its prefix cache as SGLang's KV events (`SubscribeKvEvents`):
//! stored blocks with their prompt's token ids and chained parents, evictions, flushes,
//! replay from a sequence number, the `kv_events_skip` gap, the end of the streams when the
//! worker dies, and a subscriber that reads too slowly being ended with RESOURCE_EXHAUSTED.
//! Every wait is on a message or a stats value, bounded by the patience factor.

mod common;
mod grpc_client;

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use grpc_client::*;
use smg_loadtest::sim::kv_events::KEEP_BATCHES;
use smg_proto::common::kv_cache_event::Data;
use smg_proto::common::{
    FlushCacheRequest, FlushCacheResponse, KvBlocksStored, KvEventBatch, SubscribeKvEventsRequest,
};
use smg_proto::paths::sglang_scheduler as path;
use smg_proto::scheduler as pb;
use sonic_rs::JsonValueTrait;

/// `f`, or a failure naming `what` once the patience bound has passed.
async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    monoio::select! {
        v = f => v,
        _ = monoio::time::sleep(patience(Duration::from_secs(10))) => panic!("{what}: nothing within the patience bound"),
    }
}

async fn subscribe(c: &mut Client, start: u64) -> Streaming {
    let req = SubscribeKvEventsRequest { start_sequence_number: start, ..Default::default() };
    let resp = start_call(c, &req).await;
    // The head comes once the worker has registered the subscription.
    within("the subscription's head", Streaming::open(resp)).await.expect("SubscribeKvEvents answered a status")
}

async fn start_call(c: &mut Client, req: &SubscribeKvEventsRequest) -> h2::client::ResponseFuture {
    start(c, path::SUBSCRIBE_KV_EVENTS, req).await
}

async fn batch(s: &mut Streaming) -> KvEventBatch {
    within("a KV event batch", s.next::<KvEventBatch>()).await.expect("the stream ended")
}

async fn generate(c: &mut Client, id: &str, ids: Vec<u32>) -> u32 {
    let req = pb::GenerateRequest {
        request_id: id.into(),
        tokenized: Some(pb::TokenizedInput { original_text: String::new(), input_ids: ids }),
        sampling_params: Some(pb::SamplingParams { max_new_tokens: Some(1), ..Default::default() }),
        ..Default::default()
    };
    let (_, done) = split(decode(&call(c, path::GENERATE, &req).await));
    done[0].cached_tokens
}

async fn flush(c: &mut Client) {
    let r: Vec<FlushCacheResponse> = decode(&call(c, path::FLUSH_CACHE, &FlushCacheRequest::default()).await);
    assert!(r[0].success);
}

fn stored(e: &Option<Data>) -> &KvBlocksStored {
    match e {
        Some(Data::Stored(s)) => s,
        other => panic!("not a KvBlocksStored: {other:?}"),
    }
}

fn is_cleared(b: &KvEventBatch) -> bool {
    matches!(b.events.as_slice(), [e] if matches!(e.data, Some(Data::Cleared(_))))
}

#[test]
fn kv_events_follow_the_prefix_cache() {
    for legacy in DRIVERS {
        // 4-token blocks, room for 8 of them.
        let args = ["--grpc", "--ports", "0", "--block-tokens", "4", "--cache-tokens", "32"];
        let sim = Sim::start(&args, legacy);
        let port = sim.port();
        block_on(async {
            let mut c = connect(port).await;
            let mut live = subscribe(&mut connect(port).await, 0).await;

            // A 10-token prompt: two whole blocks, the first without a parent.
            let p1: Vec<u32> = (1..=10).collect();
            assert_eq!(generate(&mut c, "p1", p1.clone()).await, 0);
            let b1 = batch(&mut live).await;
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
            assert_eq!((b1.sequence_number, b1.dp_rank, b1.events.len()), (1, None, 1));
            assert!((b1.timestamp - now).abs() < 60.0, "timestamp {} vs now {now}", b1.timestamp);
            let s1 = stored(&b1.events[0].data);
            assert_eq!(s1.parent_block_hash, None);
            assert_eq!(
                s1.blocks.iter().map(|b| b.token_ids.clone()).collect::<Vec<_>>(),
                [vec![1, 2, 3, 4], vec![5, 6, 7, 8]]
            );
            assert!(s1.blocks.iter().all(|b| b.block_size == 4));
            let (h0, h1) = (s1.blocks[0].block_hash, s1.blocks[1].block_hash);
            assert_ne!(h0, h1);

            // Sharing those two blocks: only the new ones, parented on the last shared one.
            let p2: Vec<u32> = (1..=8).chain(100..=107).collect();
            assert_eq!(generate(&mut c, "p2", p2).await, 8);
            let b2 = batch(&mut live).await;
            assert_eq!(b2.sequence_number, 2);
            assert!(b2.events[0].event_id > b1.events[0].event_id);
            let s2 = stored(&b2.events[0].data);
            assert_eq!(s2.parent_block_hash, Some(h1));
            assert_eq!(s2.blocks[0].token_ids, [100, 101, 102, 103]);
            assert_eq!(s2.blocks[1].token_ids, [104, 105, 106, 107]);
            let h2 = s2.blocks[0].block_hash;

            // All cached: nothing published (the next batch is the next change's).
            assert_eq!(generate(&mut c, "p1-again", p1).await, 8);
            // Five new blocks in a cache of eight holding four: the least recently used block
            // (p2's first own block) goes, reported before the stores in the same batch.
            let p3: Vec<u32> = (200..220).collect();
            generate(&mut c, "p3", p3).await;
            let b3 = batch(&mut live).await;
            assert_eq!((b3.sequence_number, b3.events.len()), (3, 2));
            match &b3.events[0].data {
                Some(Data::Removed(r)) => assert_eq!(r.block_hashes, [h2]),
                other => panic!("expected a removal first: {other:?}"),
            }
            let s3 = stored(&b3.events[1].data);
            assert_eq!((s3.parent_block_hash, s3.blocks.len()), (None, 5));
            assert_eq!(s3.blocks[4].token_ids, [216, 217, 218, 219]);
            assert!(b3.events[1].event_id > b3.events[0].event_id);

            // FlushCache, then a skip of 5 and /sim/control's flush: a gap the subscriber sees.
            flush(&mut c).await;
            let b4 = batch(&mut live).await;
            assert!(b4.sequence_number == 4 && is_cleared(&b4), "{b4:?}");
            let st = http(port, "POST", "/sim/control", r#"{"kv_events_skip":5}"#).json();
            assert_eq!(st["settings"]["kv_events_skip"].as_u64(), Some(5));
            assert_eq!(http(port, "POST", "/sim/control", r#"{"flush_cache":true}"#).status, 200);
            let b10 = batch(&mut live).await;
            assert!(b10.sequence_number == 10 && is_cleared(&b10), "{b10:?}");
            let kv = &http(port, "GET", "/sim/stats", "").json()["kv_events"];
            assert_eq!(kv["published"].as_u64(), Some(5));
            assert_eq!(kv["last_sequence"].as_u64(), Some(10));
            assert_eq!(kv["subscribers"].as_u64(), Some(1));

            // Resubscribing from 2 replays what followed (3, 4, 10), then goes live; a new
            // subscription from 0 gets only what comes next.
            let mut resumed = subscribe(&mut connect(port).await, 2).await;
            assert_eq!(batch(&mut resumed).await, b3, "a replayed batch is the batch itself");
            for want in [4, 10] {
                assert_eq!(batch(&mut resumed).await.sequence_number, want);
            }
            let mut fresh = subscribe(&mut connect(port).await, 0).await;
            let p4: Vec<u32> = (300..304).collect();
            generate(&mut c, "p4", p4).await;
            for s in [&mut live, &mut resumed, &mut fresh] {
                let b = batch(s).await;
                assert_eq!(b.sequence_number, 11);
                assert_eq!(stored(&b.events[0].data).blocks[0].token_ids, [300, 301, 302, 303]);
            }
            let kv = &http(port, "GET", "/sim/stats", "").json()["kv_events"];
            assert_eq!(kv["subscribers"].as_u64(), Some(3));

            // The worker dies: every stream is cut, with no status.
            let _ = http_raw(port, &request_bytes("POST", "/sim/control", r#"{"die":true}"#), Duration::from_secs(5));
            for s in [&mut live, &mut resumed, &mut fresh] {
                assert!(within("the stream's end", s.next::<KvEventBatch>()).await.is_none());
                assert_eq!(within("the stream's end", s.status()).await, None);
            }
        });
    }
}

/// A subscriber that does not read: its batches wait in its queue (the stream's window is
/// full), and once more than the worker keeps are waiting, its stream ends with
/// RESOURCE_EXHAUSTED after the batches it got. Generate and FlushCache never wait for it. It
/// resubscribes from the last batch it got: the kept batches follow, after a gap.
#[test]
fn a_slow_subscriber_is_ended_and_resumes() {
    let sim = Sim::start(&["--grpc", "--ports", "0"], false);
    let port = sim.port();
    block_on(async {
        let mut slow = subscribe(&mut connect_with_window(port, 64).await, 0).await;
        let mut c = connect(port).await;
        let total = KEEP_BATCHES as u64 + 100;
        for _ in 0..total {
            flush(&mut c).await;
        }
        let kv = &http(port, "GET", "/sim/stats", "").json()["kv_events"];
        assert_eq!(kv["overflowed"].as_u64(), Some(1), "{kv:?}");
        assert_eq!(kv["last_sequence"].as_u64(), Some(total));
        // Reading now: the few batches the window let through, then the status.
        let mut last = 0;
        while let Some(b) = within("the slow stream", slow.next::<KvEventBatch>()).await {
            assert_eq!(b.sequence_number, last + 1);
            last = b.sequence_number;
        }
        let (code, msg) = within("the slow stream's status", slow.status()).await.expect("a status");
        assert_eq!(code, 8, "RESOURCE_EXHAUSTED: {msg}");
        assert!((1..100).contains(&last), "{last} batches before the end");
        // Resubscribing from there: the oldest kept batch is past `last + 1`.
        let mut again = subscribe(&mut connect(port).await, last).await;
        let oldest = total - KEEP_BATCHES as u64 + 1;
        for want in oldest..=total {
            let b = batch(&mut again).await;
            assert!(b.sequence_number == want && is_cleared(&b), "{b:?}");
        }
        flush(&mut c).await;
        assert_eq!(batch(&mut again).await.sequence_number, total + 1);
    });
}
