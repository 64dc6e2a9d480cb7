//! Criterion benches of the KV-cache event index (src/kv/): events applied per second on the
//! events thread (a worker's hash map and the index change, decode of vLLM's msgpack too),
//! and the request path's match: a 2 KB chat's token ids cut into 16-token blocks, keyed, and
//! matched against 8 workers holding 100 k blocks.
//!
//! With the SmolLM2 GGUF of `.ci/llama-worker.sh` (LLAMA_MODEL, or ~/.cache/smg), also an
//! HTTP chat's whole request-path cost with `--tokenizer-path`: the 2 KB body parsed, its
//! template rendered, tokenized, keyed and matched.
//!
//! Run: `cargo bench --bench kv` (events/s = 1 / the per-event time printed).

use std::hint::black_box;

#[path = "shared.rs"]
mod shared;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use smg::kv::event::{from_msgpack, EngineHash, KvEvent};
use smg::kv::index::BlockIndex;
use smg::kv::keys::{request_keys, Blocks};
use smg::kv::prompt_ids::prompt_ids;
use smg::routing::TextSource;
use smg::tokenizer::segment_cache::SegmentCache;
use smg::worker_id::WorkerId;

const BLOCK: usize = 16;

/// A stream of `n` events as an engine publishes them: stores of 4-block continuations
/// (each after the last), and now and then the oldest blocks evicted.
fn stream(n: usize) -> Vec<KvEvent> {
    let mut out = Vec::with_capacity(n);
    let mut next = 1u64;
    let mut parent: Option<u64> = None;
    let mut stored: std::collections::VecDeque<u64> = Default::default();
    while out.len() < n {
        if out.len() % 5 == 4 && stored.len() > 8 {
            let gone: Vec<EngineHash> = (0..4).filter_map(|_| stored.pop_front()).map(EngineHash).collect();
            out.push(KvEvent::Removed { hashes: gone, gpu: true });
            continue;
        }
        let hashes: Vec<u64> = (0..4).map(|i| next + i).collect();
        let tokens: Vec<u32> = (0..4 * BLOCK as u32).map(|t| t.wrapping_mul(next as u32 | 1)).collect();
        out.push(KvEvent::Stored {
            hashes: hashes.iter().map(|&h| EngineHash(h)).collect(),
            parent: parent.map(EngineHash),
            tokens,
            block_size: BLOCK as u32,
            namespace: 0,
            gpu: true,
        });
        stored.extend(&hashes);
        // A new conversation every 8 stores.
        parent = if out.len() % 8 == 0 { None } else { hashes.last().copied() };
        next += 4;
    }
    out
}

fn msgpack(e: &KvEvent) -> Vec<u8> {
    use rmpv::Value;
    let ints = |h: &[EngineHash]| Value::Array(h.iter().map(|h| Value::from(h.0)).collect());
    let ev = match e {
        KvEvent::Stored { hashes, parent, tokens, block_size, .. } => Value::Array(vec![
            Value::from("BlockStored"),
            ints(hashes),
            parent.map_or(Value::Nil, |p| Value::from(p.0)),
            Value::Array(tokens.iter().map(|&t| Value::from(t)).collect()),
            Value::from(*block_size),
            Value::Nil,
            Value::from("GPU"),
        ]),
        KvEvent::Removed { hashes, .. } => {
            Value::Array(vec![Value::from("BlockRemoved"), ints(hashes), Value::from("GPU")])
        }
        KvEvent::Cleared => Value::Array(vec![Value::from("AllBlocksCleared")]),
    };
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &Value::Array(vec![Value::F64(0.0), Value::Array(vec![ev]), Value::Nil]))
        .unwrap();
    out
}

fn all(c: &mut Criterion) {
    let events = stream(20_000);
    let mut g = c.benchmark_group("kv_events");
    g.throughput(Throughput::Elements(events.len() as u64));
    g.bench_function("apply_20k_events", |b| {
        b.iter_batched(
            || (Blocks::default(), BlockIndex::default(), Vec::new()),
            |(mut blocks, mut index, mut changes)| {
                for e in &events {
                    changes.clear();
                    blocks.apply(e, &mut changes);
                    for c in &changes {
                        index.apply(WorkerId(0), *c);
                    }
                }
                black_box(index.len())
            },
            BatchSize::LargeInput,
        )
    });
    let payloads: Vec<Vec<u8>> = events.iter().take(2_000).map(msgpack).collect();
    g.throughput(Throughput::Elements(payloads.len() as u64));
    g.bench_function("decode_2k_msgpack_events", |b| {
        b.iter(|| {
            for p in &payloads {
                black_box(from_msgpack(p).unwrap());
            }
        })
    });
    g.finish();

    // The request path: 8 workers with 100 k blocks between them; a 2 KB chat's 512 token
    // ids, whose first 24 blocks one worker holds.
    let mut index = BlockIndex::default();
    let prompt: Vec<u32> = (0..512u32).map(|t| t * 7 + 1).collect();
    let mut keys = Vec::new();
    request_keys(&prompt, BLOCK, 0, &mut keys);
    for k in &keys[..24] {
        index.apply(WorkerId(3), smg::kv::keys::Change::Add(*k));
    }
    for (i, e) in stream(40_000).iter().enumerate() {
        let mut blocks = Blocks::default();
        let mut changes = Vec::new();
        blocks.apply(e, &mut changes);
        for c in changes {
            index.apply(WorkerId((i % 8) as u32), c);
        }
    }
    let workers: Vec<WorkerId> = (0..8).map(WorkerId).collect();
    let mut out = Vec::new();
    c.bench_function("kv_match/512_tokens_8_workers", |b| {
        b.iter(|| {
            request_keys(black_box(&prompt), BLOCK, 0, &mut keys);
            index.prefixes(&keys, &workers, &mut out);
            black_box(out[3])
        })
    });
    let Some(tk) = smollm2() else {
        eprintln!("SKIPPED kv_match/2KB_chat_tokenized: no SmolLM2 GGUF (run `bash .ci/llama-worker.sh`)");
        return;
    };
    // Cold: no segment seen before (a new cache each time). Next turn: the conversation's
    // earlier messages were tokenized on this shard before (its last message is new).
    let body = chat_body(2 * 1024);
    let earlier = chat_body_without_last(&body);
    let mut warm = SegmentCache::default();
    prompt_ids(&tk, TextSource::Chat, earlier.as_bytes(), &mut warm).unwrap();
    // The same two, in this thread's CPU time (CLOCK_THREAD_CPUTIME_ID): what the call costs
    // the core, without the time a busy host keeps the thread waiting (criterion's wall-clock
    // figures above include that).
    for (name, keep) in [("cold", false), ("next_turn", true)] {
        let n = 20_000u32;
        let start = thread_cpu();
        for _ in 0..n {
            let mut fresh = SegmentCache::default();
            let cache = if keep { &mut warm } else { &mut fresh };
            let ids = prompt_ids(&tk, TextSource::Chat, black_box(body.as_bytes()), cache).unwrap();
            request_keys(&ids, BLOCK, 0, &mut keys);
            index.prefixes(&keys, &workers, &mut out);
            black_box(out[3]);
        }
        let per = (thread_cpu() - start).as_secs_f64() * 1e6 / f64::from(n);
        println!("kv_match/2KB_chat_tokenized_8_workers/{name}: {per:.2} µs of thread CPU a call ({n} calls)");
    }
    for (name, keep) in [("cold", false), ("next_turn", true)] {
        c.bench_function(&format!("kv_match/2KB_chat_tokenized_8_workers/{name}"), |b| {
            b.iter(|| {
                let mut fresh = SegmentCache::default();
                let cache = if keep { &mut warm } else { &mut fresh };
                let ids = prompt_ids(&tk, TextSource::Chat, black_box(body.as_bytes()), cache).unwrap();
                request_keys(&ids, BLOCK, 0, &mut keys);
                index.prefixes(&keys, &workers, &mut out);
                black_box(out[3])
            })
        });
    }
}

/// This thread's CPU time so far.
fn thread_cpu() -> std::time::Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which `ts` is.
    #[allow(unsafe_code)]
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
    }
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The same request without its last message (the turn before).
fn chat_body_without_last(body: &str) -> String {
    let cut = body.rfind(r#",{"role""#).unwrap();
    format!("{}],\"max_tokens\":16}}", &body[..cut])
}

fn smollm2() -> Option<smg::tokenizer::Tokenizer> {
    shared::smollm2_gguf().map(|p| smg::tokenizer::Tokenizer::from_gguf(&p).unwrap())
}

/// A chat request body of about `target` bytes (`shared.rs`'s conversation).
fn chat_body(target: usize) -> String {
    format!(r#"{{"model":"m","messages":{},"max_tokens":16}}"#, shared::conversation(target))
}

criterion_group!(benches, all);
criterion_main!(benches);
