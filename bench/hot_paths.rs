//! Criterion benches of the data plane's per-request functions: request-head parse, worker
//! response-head parse, chunked framing scan of an SSE response, and the lazy `model` /
//! `stream` gets (bodies in both key orders: the Python SDK sends `model` first, the Node
//! SDK keeps the caller's order). Contract and routing have their own benches.
//!
//! Run: `cargo bench --bench hot_paths` (also `--bench contract`, `--bench routing`).

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use sonic_rs::JsonValueTrait;

use smg::http::chunked::ChunkedDecoder;
use smg::http::head::parse_request;
use smg::http::response_head::parse_response;

fn chat_body(model_first: bool, user_bytes: usize) -> String {
    let messages = format!(
        r#"[{{"role":"system","content":"You are a helpful assistant."}},{{"role":"user","content":"{}"}}]"#,
        "x".repeat(user_bytes)
    );
    if model_first {
        format!(
            r#"{{"model":"meta-llama/Llama-3.1-8B-Instruct","stream":false,"messages":{messages},"max_tokens":64,"temperature":0.7}}"#
        )
    } else {
        format!(
            r#"{{"messages":{messages},"max_tokens":64,"temperature":0.7,"model":"meta-llama/Llama-3.1-8B-Instruct","stream":false}}"#
        )
    }
}

fn request_head() -> Vec<u8> {
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway:30000\r\nAccept-Encoding: gzip, deflate\r\n\
Connection: keep-alive\r\nAccept: application/json\r\nContent-Type: application/json\r\n\
User-Agent: OpenAI/Python 3.57.0\r\nX-Stainless-Lang: python\r\nX-Stainless-Package-Version: 3.57.0\r\n\
X-Stainless-OS: Linux\r\nX-Stainless-Arch: x64\r\nX-Stainless-Runtime: CPython\r\n\
X-Stainless-Runtime-Version: 3.11.7\r\nAuthorization: Bearer sk-not-needed\r\nX-Stainless-Async: false\r\n\
X-Stainless-Retry-Count: 0\r\nX-Stainless-Read-Timeout: 600\r\nContent-Length: 1500\r\n\r\n"
        .to_vec()
}

fn sse_response(events: usize) -> Vec<u8> {
    let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for i in 0..events {
        let ev = format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" tok{i}\"}},\"finish_reason\":null}}]}}\n\n"
        );
        out.extend_from_slice(format!("{:x}\r\n{ev}\r\n", ev.len()).as_bytes());
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

fn benches(c: &mut Criterion) {
    let head = request_head();
    c.bench_function("parse_request_head (17 headers)", |b| {
        b.iter(|| parse_request(black_box(&head)).unwrap().unwrap())
    });

    let resp = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 512\r\ndate: Sun, 29 Nov 2026 13:00:00 GMT\r\nserver: uvicorn\r\n\r\n";
    c.bench_function("parse_response_head", |b| b.iter(|| parse_response(black_box(resp)).unwrap().unwrap()));

    let sse = sse_response(20);
    let body_at = parse_response(&sse).unwrap().unwrap().len;
    c.bench_function("chunked_scan (20 SSE events)", |b| {
        b.iter(|| {
            let mut d = ChunkedDecoder::new();
            let n = d.feed(black_box(&sse[body_at..]), None).unwrap();
            assert!(d.is_done());
            n
        })
    });

    // Tenant budgets: every event of a stream passes the usage scan, read by read; 20 events
    // each read alone, then the usage event (the work per event is the figure to read).
    let events: Vec<Vec<u8>> = (0..20)
        .map(|i| {
            format!("data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" tok{i}\"}},\"finish_reason\":null}}]}}\n\n").into_bytes()
        })
        .chain(std::iter::once(
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":20,\"total_tokens\":29}}\n\n".to_vec(),
        ))
        .collect();
    c.bench_function("usage scan (21 SSE events, one read each)", |b| {
        b.iter(|| {
            let mut u = smg::http::usage::UsageScan { on: true, ..Default::default() };
            for e in &events {
                u.feed(black_box(e));
            }
            assert_eq!(u.total(), Some(29));
        })
    });

    for (name, model_first, size) in
        [("2KB model-first", true, 1500), ("2KB messages-first", false, 1500), ("200KB messages-first", false, 200_000)]
    {
        let body = chat_body(model_first, size);
        c.bench_function(&format!("lazy model+stream ({name})"), |b| {
            b.iter(|| {
                let m = sonic_rs::get(black_box(body.as_bytes()), &["model"]).unwrap();
                let s = sonic_rs::get(black_box(body.as_bytes()), &["stream"]).unwrap();
                (m.as_str().map(str::len), s.as_bool())
            })
        });
    }
}

criterion_group!(hot, benches);
criterion_main!(hot);
