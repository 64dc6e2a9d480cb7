//! Criterion benches of the request contract: scan + validation of chat bodies in both key
//! orders (Python SDK: model/stream first; Node SDK: caller order, often messages first), a
//! rewrite-heavy profile body, and applying its splices.
//!
//! Run: `cargo bench --bench contract`.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use smg::contract::{apply, inspect, Aliases, Endpoint};

/// A realistic chat body of about `target` bytes: a system prompt, alternating turns, tools.
fn messages(target: usize) -> String {
    let sentence = "The quick brown fox jumps over the lazy dog, then asks about the weather in Paris. ";
    let mut turns = vec![format!(r#"{{"role":"system","content":"{}"}}"#, sentence.repeat(2))];
    let mut i = 0;
    while turns.iter().map(String::len).sum::<usize>() < target.saturating_sub(700) {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        turns.push(format!(r#"{{"role":"{role}","content":"{} \u00e9\n{}"}}"#, sentence.repeat(3), i));
        i += 1;
    }
    format!("[{}]", turns.join(","))
}

const TOOLS: &str = r#"[{"type":"function","function":{"name":"get_weather","description":"Get the weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]"#;

fn model_first(model: &str, target: usize) -> String {
    format!(
        r#"{{"model":"{model}","stream":true,"messages":{},"temperature":0.7,"top_p":0.95,"max_tokens":512,"tools":{TOOLS},"tool_choice":"auto","stream_options":{{"include_usage":true}}}}"#,
        messages(target)
    )
}

fn messages_first(model: &str, target: usize) -> String {
    format!(
        r#"{{"messages":{},"temperature":0.7,"top_p":0.95,"max_tokens":512,"tools":{TOOLS},"tool_choice":"auto","stream":true,"stream_options":{{"include_usage":true}},"model":"{model}"}}"#,
        messages(target)
    )
}

fn bench(c: &mut Criterion) {
    let aliases = Aliases::parse(&["fast=meta-llama/Llama-3.1-8B-Instruct"]).unwrap();
    let mut group = c.benchmark_group("contract");
    for (size, label) in [(2 * 1024, "2KB"), (200 * 1024, "200KB")] {
        for (order, body) in [
            ("model_first", model_first("meta-llama/Llama-3.1-8B-Instruct", size)),
            ("messages_first", messages_first("meta-llama/Llama-3.1-8B-Instruct", size)),
        ] {
            let insp = inspect(Endpoint::ChatCompletions, body.as_bytes(), true, &aliases).unwrap();
            assert!(insp.edits.is_empty());
            group.throughput(Throughput::Bytes(body.len() as u64));
            group.bench_function(format!("inspect/{label}/{order}"), |b| {
                b.iter(|| inspect(Endpoint::ChatCompletions, black_box(body.as_bytes()), true, &aliases).unwrap())
            });
        }
        // Rewrites: alias + Kimi K3 defaults would not combine (selection reads the alias), so
        // use the K3 profile for defaults and an alias for the model splice separately.
        let k3 = messages_first("kimi-k3", size).replace(r#""temperature":0.7,"top_p":0.95,"#, "");
        let insp = inspect(Endpoint::ChatCompletions, k3.as_bytes(), true, &aliases).unwrap();
        assert!(!insp.edits.is_empty());
        group.throughput(Throughput::Bytes(k3.len() as u64));
        group.bench_function(format!("inspect/{label}/kimi_k3_rewrites"), |b| {
            b.iter(|| inspect(Endpoint::ChatCompletions, black_box(k3.as_bytes()), true, &aliases).unwrap())
        });
        group.bench_function(format!("apply/{label}/kimi_k3_rewrites"), |b| {
            b.iter(|| apply(black_box(k3.as_bytes()), black_box(&insp.edits)))
        });
        let aliased = model_first("fast", size);
        group.bench_function(format!("inspect/{label}/alias"), |b| {
            b.iter(|| inspect(Endpoint::ChatCompletions, black_box(aliased.as_bytes()), true, &aliases).unwrap())
        });
        // The depth bound the routes without a modeled schema pay before their lazy `model`
        // read (src/bounded_json.rs), beside that read itself.
        let embed = format!(
            r#"{{"model":"m","input":[{}]}}"#,
            (0..size / 10).map(|i| format!("{:.6}", i as f64 / 7.0)).collect::<Vec<_>>().join(",")
        );
        group.throughput(Throughput::Bytes(embed.len() as u64));
        group.bench_function(format!("depth_bound/{label}/embeddings_numbers"), |b| {
            b.iter(|| smg::bounded_json::check(black_box(embed.as_bytes())).unwrap())
        });
        group.bench_function(format!("depth_bound/{label}/chat_text"), |b| {
            b.iter(|| smg::bounded_json::check(black_box(aliased.as_bytes())).unwrap())
        });
        group.bench_function(format!("lazy_model/{label}/embeddings_numbers"), |b| {
            b.iter(|| sonic_rs::get(black_box(embed.as_bytes()), ["model"]).unwrap())
        });
        // Reference point from DESIGN.md: one full sonic-rs parse of the same body.
        let plain = model_first("meta-llama/Llama-3.1-8B-Instruct", size);
        group.bench_function(format!("sonic_rs_value/{label}"), |b| {
            b.iter(|| sonic_rs::from_slice::<sonic_rs::Value>(black_box(plain.as_bytes())).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
