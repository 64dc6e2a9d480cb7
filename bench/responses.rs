//! Criterion bench of a chained Responses turn's own cost (src/responses/): what loading a
//! 10-turn history from the memory store costs a turn beyond a fresh turn that sends the same
//! history as its input. Both then render and tokenize the same prompt, which is left out.
//!
//! - `fresh_with_history`: the body (twenty history items and the new input) read, and the
//!   chat built from it;
//! - `chained_10`: the small body read, the stored chain of ten responses taken from the
//!   memory store (as its thread answers `Op::Chain`), their items parsed, and the chat built.
//!
//! - `turn_1k` against `chat_1k_parse`: a non-streamed responses-1k turn's own work (the
//!   body read, the chat built, the answer made the response object, the record stored in
//!   memory) against what a chat-1k turn does in its place (its body parsed).
//!
//! The chain's one message to the storage thread and back is not in it (a few µs of two
//! threads' CPU). Run: `cargo bench --bench responses`.

use std::hint::black_box;

// For the gateway's allocator; the model and conversation helpers are the other benches'.
#[allow(dead_code)]
#[path = "shared.rs"]
mod shared;

use criterion::{criterion_group, criterion_main, Criterion};
use smg::responses::store::{Memory, MemoryLimits, Op, Reply, StoredResponse};
use smg::responses::turn::{chain_items, parsed, Turn};

const TURNS: usize = 10;

fn words(n: usize, seed: usize) -> String {
    const W: &[&str] = &["the", "gateway", "answers", "every", "turn", "with", "its", "history", "stored", "model"];
    (0..n).map(|i| W[(i * 7 + seed) % W.len()]).collect::<Vec<_>>().join(" ")
}

fn user_item(i: usize) -> String {
    format!(
        r#"{{"type":"message","role":"user","content":[{{"type":"input_text","text":"{}"}}],"id":"msg_in{i:044}","status":"completed"}}"#,
        words(34, i)
    )
}

fn answer_item(i: usize) -> String {
    format!(
        r#"{{"type":"message","id":"msg_out{i:043}","status":"completed","role":"assistant","content":[{{"type":"output_text","text":"{}","annotations":[],"logprobs":[]}}]}}"#,
        words(16, i + 3)
    )
}

fn store() -> Memory {
    let mut m = Memory::new(MemoryLimits::default());
    for i in 0..TURNS {
        let r = StoredResponse {
            id: format!("resp_{i}"),
            tenant: None,
            previous: (i > 0).then(|| format!("resp_{}", i - 1)),
            conversation: None,
            created_at: 0,
            input: vec![user_item(i)],
            output: vec![answer_item(i)],
            body: format!(r#"{{"id":"resp_{i}","object":"response","output":[{}]}}"#, answer_item(i)),
            context: vec![],
        };
        m.apply(Op::PutResponse(Box::new(r)), 0);
    }
    m
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("responses");
    let input = format!(r#""{}""#, words(34, 99));
    let mut items: Vec<String> = (0..TURNS).flat_map(|i| [user_item(i), answer_item(i)]).collect();
    items.push(format!(r#"{{"type":"message","role":"user","content":{input}}}"#));
    let fresh = format!(r#"{{"model":"m","input":[{}]}}"#, items.join(","));
    g.bench_function("fresh_with_history", |b| {
        b.iter(|| {
            let turn = Turn::read(black_box(fresh.as_bytes())).unwrap();
            black_box(turn.chat(&[], &[], false))
        })
    });
    let mut m = store();
    let chained = format!(r#"{{"model":"m","input":{input},"previous_response_id":"resp_{}"}}"#, TURNS - 1);
    g.bench_function("chained_10", |b| {
        b.iter(|| {
            let turn = Turn::read(black_box(chained.as_bytes())).unwrap();
            let Reply::Chain(Some(chain)) = m.apply(Op::Chain(format!("resp_{}", TURNS - 1)), 0) else { panic!() };
            let prior = parsed(&chain_items(chain));
            black_box(turn.chat(&prior, &[], false))
        })
    });
    // A responses-1k turn's own work against what a chat-1k turn does in its place (its body
    // parsed): the load harness's same 1,200-byte user message, a 60-word answer.
    let user = words(240, 7);
    let turn_body = format!(r#"{{"model":"m","input":"{user}","max_output_tokens":64,"store":true}}"#);
    let chat_body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{user}"}}],"max_tokens":64}}"#);
    let answer = words(60, 3);
    let mut sink = Memory::new(MemoryLimits::default());
    g.bench_function("turn_1k", |b| {
        b.iter(|| {
            let (chat, body, ops) = smg::responses::own_work::turn_work(black_box(turn_body.as_bytes()), &answer);
            for op in ops {
                sink.apply(op, 0);
            }
            black_box((chat, body))
        })
    });
    g.bench_function("chat_1k_parse", |b| {
        b.iter(|| black_box(sonic_rs::from_slice::<sonic_rs::Value>(black_box(chat_body.as_bytes())).unwrap()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
