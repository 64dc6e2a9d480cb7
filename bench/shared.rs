//! What the tokenizer and KV benches share (included by path: each bench is a crate of its
//! own): the gateway's allocator, the SmolLM2 model the end-to-end tests use, and a 2 KB
//! conversation.

use std::path::PathBuf;

/// The gateway's allocator (`src/main.rs`), so what the measured code allocates costs what it
/// costs in the gateway: glibc's malloc and free were 14% of a tokenized chat's match here.
#[global_allocator]
static GLOBAL: smg::allocator::Allocator = smg::allocator::Allocator;

/// The GGUF of `.ci/llama-worker.sh` (LLAMA_MODEL, or ~/.cache/smg), if it is there.
pub fn smollm2_gguf() -> Option<PathBuf> {
    let p = std::env::var_os("LLAMA_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/smg/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    p.is_file().then_some(p)
}

/// A chat's `messages` of about `target` bytes of JSON: a system prompt and alternating turns.
pub fn conversation(target: usize) -> String {
    let sentence = "The quick brown fox jumps over the lazy dog, then asks about the weather in Paris. ";
    let mut turns = vec![format!(r#"{{"role":"system","content":"{}"}}"#, sentence.repeat(2))];
    let mut i = 0;
    while turns.iter().map(String::len).sum::<usize>() < target {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        turns.push(format!(r#"{{"role":"{role}","content":"{} caf\u00e9 {i}\n{}"}}"#, sentence.repeat(2), i * 37));
        i += 1;
    }
    format!("[{}]", turns.join(","))
}
