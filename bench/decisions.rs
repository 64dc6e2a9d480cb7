//! Criterion bench of the Decisions translation for SGLang workers, 3 questions (the
//! contract's example request): scan + rules + System One body, and the reply mapped back.
//!
//! Run: `cargo bench --bench decisions`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use smg::api::decisions::{map_reply, translate};
use smg::contract::{decisions, json};

const REQUEST: &str = r#"{"model":"Qwen/Qwen3-4B-Instruct-2507","input":"The delivery arrived a day late, but the package was intact and support was friendly.","questions":[{"type":"predicate","instructions":"Did the delivery arrive on time?"},{"type":"choice","name":"sentiment","instructions":"What is the overall sentiment?","choices":[{"value":"positive"},{"value":"negative"}]},{"type":"score","instructions":"Rate the customer experience.","levels":[{"label":"poor"},{"label":"fair"},{"label":"good"}]}]}"#;

const REPLY: &str = r#"{"model":"Qwen/Qwen3-4B-Instruct-2507","answers":{"0":{"type":"noul","noul":0.11,"x_label_mass":0.98},"1":{"type":"choice","choice":"positive","confidence":0.74,"probabilities":{"positive":0.87,"negative":0.13},"x_label_mass":0.97},"2":{"type":"score","score":1.62,"confidence":0.55,"legend":{"0":"poor","1":"fair","2":"good"},"probabilities":{"0":0.08,"1":0.22,"2":0.7},"x_label_mass":0.96}},"usage":{"input_tokens":182,"output_tokens":0}}"#;

fn bench(c: &mut Criterion) {
    let model = "Qwen/Qwen3-4B-Instruct-2507";
    let req = REQUEST.as_bytes();
    let one = |req: &[u8]| {
        let d = decisions::read(json::parse(req).unwrap()).unwrap();
        translate(&d, model).unwrap()
    };
    let (_, plan) = one(req);
    c.bench_function("decisions/request (scan+rules+systemone body, 3 questions)", |b| {
        b.iter(|| black_box(one(black_box(req))))
    });
    c.bench_function("decisions/reply (map back, 3 questions)", |b| {
        b.iter(|| black_box(map_reply(black_box(REPLY.as_bytes()), &plan).unwrap()))
    });
    c.bench_function("decisions/translation total (validate + request + reply, 3 questions)", |b| {
        b.iter(|| {
            let d = decisions::read(json::parse(black_box(req)).unwrap()).unwrap();
            black_box(&d);
            let (body, plan) = one(black_box(req));
            black_box(body);
            black_box(map_reply(black_box(REPLY.as_bytes()), &plan).unwrap())
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
