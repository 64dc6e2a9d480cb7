//! Criterion benches of the gateway's tokenizer on the real SmolLM2 vocabulary (rebuilt
//! from the end-to-end test's GGUF): chat template render + tokenize of a 2 KB conversation
//! (and each half alone), and incremental detokenization per token (ASCII prose, and text
//! whose characters span tokens), beside the `tokenizers` crate's own `DecodeStream`.
//!
//! Needs the GGUF of `.ci/llama-worker.sh` (LLAMA_MODEL, or ~/.cache/smg).
//! Run: `cargo bench --bench tokenizer`.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use smg::tokenizer::{TemplateInput, Tokenizer};

#[path = "shared.rs"]
mod shared;
use shared::{conversation, smollm2_gguf as model};

fn bench(c: &mut Criterion) {
    let Some(path) = model() else {
        eprintln!("SKIPPED: no SmolLM2 GGUF (run `bash .ci/llama-worker.sh`)");
        return;
    };
    let tok = Tokenizer::from_gguf(&path).unwrap();
    let template = tok.chat_template().unwrap();
    let conv = conversation(2 * 1024);
    let messages: sonic_rs::Value = sonic_rs::from_str(&conv).unwrap();
    let input = TemplateInput { messages: Some(&messages), add_generation_prompt: true, ..Default::default() };
    let prompt = template.render(&input).unwrap();
    let mut ids = Vec::with_capacity(1024);

    let mut g = c.benchmark_group("tokenizer");
    g.throughput(Throughput::Bytes(conv.len() as u64));
    g.bench_function("render+tokenize/2KB", |b| {
        b.iter(|| {
            let p = template.render(black_box(&input)).unwrap();
            tok.encode_into(&p, false, &mut ids).unwrap();
            ids.len()
        })
    });
    g.bench_function("render/2KB", |b| b.iter(|| template.render(black_box(&input)).unwrap().len()));
    g.bench_function("tokenize/2KB", |b| {
        b.iter(|| {
            tok.encode_into(black_box(&prompt), false, &mut ids).unwrap();
            ids.len()
        })
    });

    let texts = [
        ("ascii", prompt.clone()),
        ("cjk_emoji", "你好，世界！日本語のテキスト 🤗🦀 naïve e\u{301} 안녕하세요 ".repeat(20)),
    ];
    for (label, text) in &texts {
        let stream = tok.encode(text, false).unwrap();
        let mut out = String::with_capacity(text.len() + 16);
        g.throughput(Throughput::Elements(stream.len() as u64));
        g.bench_function(format!("detokenize/{label}"), |b| {
            b.iter(|| {
                out.clear();
                let mut d = tok.decoder(false);
                for &id in &stream {
                    d.step(black_box(id), &mut out);
                }
                d.finish(&mut out);
                out.len()
            })
        });
        g.bench_function(format!("detokenize_hf_decode_stream/{label}"), |b| {
            b.iter(|| {
                out.clear();
                let mut d = tok.hf().decode_stream(false);
                for &id in &stream {
                    if let Ok(Some(s)) = d.step(black_box(id)) {
                        out.push_str(&s);
                    }
                }
                out.len()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
