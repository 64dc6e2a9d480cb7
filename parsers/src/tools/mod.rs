//! Tool-call parsers: a model's tool-call markup turned into calls.
//!
//! Shared rules, every family:
//! - A call is given out whole, once its markup closed and its arguments are a valid JSON
//!   object; markup that is malformed, unclosed at the end, or names a function the request
//!   does not declare comes back as content, exactly as the model wrote it.
//! - Text before, between and after calls is content; whitespace alone between two calls (or
//!   between a call and the end) is dropped.
//! - Work is linear in the output: a piece is scanned once, never the whole held text again.

use crate::{ToolParser, Tools};

mod bare_values;
mod deepseek;
mod glm45;
mod json;
mod json_call;
mod kimik2;
mod llama;
mod minimax_m2;
mod mistral;
mod pythonic;
mod qwen;
mod qwen_coder;
mod step3;

/// The `--tool-call-parser` names, as SMG spells them.
pub const NAMES: &[&str] = &[
    "deepseek",
    "deepseek31",
    "glm45_moe",
    "json",
    "kimik2",
    "llama",
    "minimax_m2",
    "mistral",
    "pythonic",
    "qwen",
    "qwen_coder",
    "step3",
];

/// The parser called `name`, for a request offering `tools`. None for an unknown name.
pub fn by_name(name: &str, tools: Tools) -> Option<Box<dyn ToolParser>> {
    Some(match name {
        "deepseek" => deepseek::v3(tools),
        "deepseek31" => deepseek::v31(tools),
        "glm45_moe" => glm45::new(tools),
        "json" => json::new(tools),
        "kimik2" => kimik2::new(tools),
        "llama" => llama::new(tools),
        "minimax_m2" => minimax_m2::new(tools),
        "mistral" => mistral::new(tools),
        "pythonic" => pythonic::new(tools),
        "qwen" => qwen::new(tools),
        "qwen_coder" => qwen_coder::new(tools),
        "step3" => step3::new(tools),
        _ => return None,
    })
}

/// The parser name SMG picks for a model id with no `--tool-call-parser`. None: no calls
/// are parsed.
pub fn for_model(model: &str) -> Option<&'static str> {
    // SMG's model table, its patterns' stems lowercased. SMG lowercases the id too and picks
    // the longest stem the id contains anywhere, so `org/Name` and a bare `Name` match alike,
    // whatever their case; its org-prefixed patterns (`deepseek-ai/DeepSeek-V3*`) add nothing
    // over the bare ones kept here. None: SMG's parser for that family is not in this crate
    // (listed so the id does not fall through to a shorter stem, `deepseek-v3`, `glm-`).
    const MODELS: &[(&str, Option<&str>)] = &[
        ("gpt-4", Some("json")),
        ("gpt-3.5", Some("json")),
        ("claude-", Some("json")),
        ("gemini-", Some("json")),
        ("palm-", Some("json")),
        ("gemma-", Some("json")),
        ("mistral-", Some("mistral")),
        ("mixtral-", Some("mistral")),
        // Qwen3.5+ and Qwen3-Coder write XML calls (SMG's `qwen_xml`).
        ("qwen3.5", Some("qwen_coder")),
        ("qwen3-coder", Some("qwen_coder")),
        ("qwen", Some("qwen")),
        ("llama-4", Some("pythonic")),
        ("llama-3.2", Some("llama")),
        ("llama-", Some("json")),
        ("deepseek-v3", Some("deepseek")),
        ("deepseek-v3.1", Some("deepseek31")),
        ("deepseek-v3.2-exp", Some("deepseek31")),
        ("deepseek-v3.2", None),
        ("deepseek-v4", None),
        ("deepseek-", Some("pythonic")),
        ("glm-4.5", Some("glm45_moe")),
        ("glm-4.6", Some("glm45_moe")),
        ("glm-4.7", None),
        ("glm-5", None),
        ("glm-", Some("json")),
        ("step3", Some("step3")),
        ("step-3", Some("step3")),
        ("kimi-k2", Some("kimik2")),
        ("kimi-k3", None),
        ("kimi_k3", None),
        ("minimax", Some("minimax_m2")),
        ("sarashina", None),
        ("inkling", None),
        ("command-r", None),
        ("command-a", None),
        ("c4ai-command", None),
        ("cohere", None),
    ];
    let model = model.to_lowercase();
    let mut best: Option<(&str, Option<&'static str>)> = None;
    for &(stem, name) in MODELS {
        if model.contains(stem) && best.is_none_or(|(b, _)| stem.len() > b.len()) {
            best = Some((stem, name));
        }
    }
    best.and_then(|(_, name)| name)
}

#[cfg(test)]
mod tests {
    use crate::{testing::run, Tool, Tools, SCANNED};

    /// The token searches read each byte of the output a bounded number of times, whatever
    /// the output repeats: a begin token, its first byte, an opened call that never closes.
    /// Linear costs up to 12 reads a byte here (a begin token's length, re-read while it
    /// arrives one byte a piece); quadratic costs thousands a byte at this size: pythonic's
    /// `[[[[…` once read the rest of the text for every `[`, 33 M reads for 8 KB. The bound
    /// sits between the two, at 200 (about their geometric middle).
    #[test]
    fn token_searches_are_linear_in_the_output() {
        let tools = || Tools::new(vec![Tool { name: "get_weather".into(), params: vec![] }]);
        let units = [
            "[",
            "<",
            "[get_weather(",
            "<|python_start|>",
            "<tool_call>",
            "<minimax:tool_call>",
            "<|tool_calls_section_begin|>",
            "<｜tool▁calls▁begin｜>",
            "[TOOL_CALLS]",
            "<|python_tag|>",
            "{",
            "<|channel|>commentary to=functions.get_weather<|message|>{",
            "<|channel|>",
        ];
        let make = |name: &str| match name {
            "harmony" => crate::harmony::parser(tools()),
            _ => super::by_name(name, tools()).unwrap(),
        };
        for name in super::NAMES.iter().copied().chain(["harmony"]) {
            for unit in units {
                let text = unit.repeat(8192 / unit.len() + 1);
                for piece in [text.len(), 1, 7] {
                    let pieces: Vec<&str> = chunks(&text, piece);
                    SCANNED.with(|s| s.set(0));
                    let mut p = make(name);
                    run(&mut p, &pieces);
                    let read = SCANNED.with(|s| s.get());
                    assert!(
                        read <= 200 * text.len(),
                        "{name} on {unit:?}×, pieces of {piece}: {read} reads for {} bytes",
                        text.len()
                    );
                }
            }
        }
    }

    /// `text` in pieces of `n` bytes (widened to character boundaries).
    fn chunks(text: &str, n: usize) -> Vec<&str> {
        let mut pieces = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let mut end = (at + n).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            pieces.push(&text[at..end]);
            at = end;
        }
        pieces
    }
}
