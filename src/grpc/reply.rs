//! OpenAI bodies the gateway assembles from the engine's messages: the whole response, and
//! the SSE events of a stream (`data: {...}\n\n`), for Chat Completions and Completions.

use smg_wire::json::put_str;
use smg_wire::num::put_dec;

use super::request::Kind;

/// What every body of one response repeats.
pub struct Meta<'a> {
    pub kind: Kind,
    pub id: &'a str,
    pub created: u64,
    pub model: &'a str,
}

/// Token counts from the engine's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt: u64,
    pub completion: u64,
    pub cached: u64,
    pub reasoning: u64,
    /// Speculative decoding: draft tokens proposed, and those the target model accepted.
    pub drafted: u64,
    pub accepted: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.prompt + self.completion
    }
}

/// A tool call as the answer carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallOut {
    /// Its position among the choice's calls.
    pub index: u32,
    pub id: String,
    pub name: String,
    /// The arguments' JSON text.
    pub arguments: String,
}

/// A finished choice.
pub struct Choice<'a> {
    pub index: u32,
    pub text: &'a str,
    /// `reasoning_content` (chat), when the model reasoned.
    pub reasoning: Option<&'a str>,
    pub calls: &'a [CallOut],
    pub finish_reason: &'a str,
    /// Its `logprobs` value as JSON (`null` when None).
    pub logprobs: Option<&'a [u8]>,
}

/// A chunk's `usage` member.
#[derive(Clone, Copy)]
pub enum ChunkUsage<'a> {
    Absent,
    /// `"usage": null` (DeepSeek's format, before the finish chunk).
    Null,
    Of(&'a Usage),
}

/// What one SSE chunk says of its choice.
#[derive(Default)]
pub struct Delta<'a> {
    /// The assistant role (chat's first chunk of a choice).
    pub role: bool,
    pub text: Option<&'a str>,
    pub reasoning: Option<&'a str>,
    pub calls: &'a [CallOut],
    pub finish: Option<&'a str>,
    /// The `logprobs` value as JSON (`null` when None).
    pub logprobs: Option<&'a [u8]>,
}

fn put_usage(out: &mut Vec<u8>, u: &Usage) {
    out.extend_from_slice(b"{\"prompt_tokens\":");
    put_dec(out, u.prompt);
    out.extend_from_slice(b",\"completion_tokens\":");
    put_dec(out, u.completion);
    out.extend_from_slice(b",\"total_tokens\":");
    put_dec(out, u.total());
    out.extend_from_slice(b",\"prompt_tokens_details\":{\"cached_tokens\":");
    put_dec(out, u.cached);
    out.push(b'}');
    // Reasoning tokens when there are any; the speculative counts only when the engine
    // proposed drafts.
    if u.reasoning > 0 || u.drafted > 0 {
        out.extend_from_slice(b",\"completion_tokens_details\":{");
        if u.reasoning > 0 {
            out.extend_from_slice(b"\"reasoning_tokens\":");
            put_dec(out, u.reasoning);
        }
        if u.drafted > 0 {
            if u.reasoning > 0 {
                out.push(b',');
            }
            let accepted = u.accepted.min(u.drafted);
            out.extend_from_slice(b"\"accepted_prediction_tokens\":");
            put_dec(out, accepted);
            out.extend_from_slice(b",\"rejected_prediction_tokens\":");
            put_dec(out, u.drafted - accepted);
        }
        out.push(b'}');
    }
    out.push(b'}');
}

/// `"tool_calls":[…]`; `index`: with each call's index (a stream's deltas).
fn put_calls(out: &mut Vec<u8>, calls: &[CallOut], index: bool) {
    out.extend_from_slice(b"\"tool_calls\":[");
    for (i, c) in calls.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'{');
        if index {
            out.extend_from_slice(b"\"index\":");
            put_dec(out, c.index as u64);
            out.push(b',');
        }
        out.extend_from_slice(b"\"id\":");
        put_str(out, &c.id);
        out.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
        put_str(out, &c.name);
        out.extend_from_slice(b",\"arguments\":");
        put_str(out, &c.arguments);
        out.extend_from_slice(b"}}");
    }
    out.push(b']');
}

fn put_head(out: &mut Vec<u8>, m: &Meta<'_>, chunk: bool) {
    out.extend_from_slice(b"{\"id\":");
    put_str(out, m.id);
    out.extend_from_slice(match (m.kind, chunk) {
        (Kind::Chat, false) => b",\"object\":\"chat.completion\",\"created\":".as_slice(),
        (Kind::Chat, true) => b",\"object\":\"chat.completion.chunk\",\"created\":",
        // `/generate` is written by native.rs, never here.
        (Kind::Completions | Kind::Generate, _) => b",\"object\":\"text_completion\",\"created\":",
    });
    put_dec(out, m.created);
    out.extend_from_slice(b",\"model\":");
    put_str(out, m.model);
    out.extend_from_slice(b",\"choices\":[");
}

fn put_finish(out: &mut Vec<u8>, logprobs: Option<&[u8]>, finish: Option<&str>) {
    out.extend_from_slice(b",\"logprobs\":");
    out.extend_from_slice(logprobs.unwrap_or(b"null"));
    out.extend_from_slice(b",\"finish_reason\":");
    match finish {
        Some(f) => put_str(out, f),
        None => out.extend_from_slice(b"null"),
    }
    out.push(b'}');
}

/// The whole non-streaming body.
pub fn full(m: &Meta<'_>, choices: &[Choice<'_>], usage: &Usage) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + choices.iter().map(|c| c.text.len() + 96).sum::<usize>());
    put_head(&mut out, m, false);
    for (i, c) in choices.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"index\":");
        put_dec(&mut out, c.index as u64);
        match m.kind {
            Kind::Chat => {
                out.extend_from_slice(b",\"message\":{\"role\":\"assistant\",\"content\":");
                // A reply that is only calls has no content (OpenAI's null).
                if c.text.is_empty() && !c.calls.is_empty() {
                    out.extend_from_slice(b"null");
                } else {
                    put_str(&mut out, c.text);
                }
                if let Some(r) = c.reasoning {
                    out.extend_from_slice(b",\"reasoning_content\":");
                    put_str(&mut out, r);
                }
                if !c.calls.is_empty() {
                    out.push(b',');
                    put_calls(&mut out, c.calls, false);
                }
                out.push(b'}');
            }
            Kind::Completions | Kind::Generate => {
                out.extend_from_slice(b",\"text\":");
                put_str(&mut out, c.text);
            }
        }
        put_finish(&mut out, c.logprobs, Some(c.finish_reason));
    }
    out.extend_from_slice(b"],\"usage\":");
    put_usage(&mut out, usage);
    out.push(b'}');
    out
}

/// One SSE event for choice `index`; `usage` for continuous usage stats and DeepSeek's format.
pub fn chunk(out: &mut Vec<u8>, m: &Meta<'_>, index: u32, d: &Delta<'_>, usage: ChunkUsage<'_>) {
    let (role, text) = (d.role, d.text);
    out.extend_from_slice(b"data: ");
    put_head(out, m, true);
    out.extend_from_slice(b"{\"index\":");
    put_dec(out, index as u64);
    match m.kind {
        Kind::Chat => {
            out.extend_from_slice(b",\"delta\":{");
            let mut first = true;
            if role {
                out.extend_from_slice(b"\"role\":\"assistant\"");
                first = false;
            }
            if let Some(t) = text.or(if role { Some("") } else { None }) {
                if !first {
                    out.push(b',');
                }
                out.extend_from_slice(b"\"content\":");
                put_str(out, t);
                first = false;
            }
            if let Some(r) = d.reasoning {
                if !first {
                    out.push(b',');
                }
                out.extend_from_slice(b"\"reasoning_content\":");
                put_str(out, r);
                first = false;
            }
            if !d.calls.is_empty() {
                if !first {
                    out.push(b',');
                }
                put_calls(out, d.calls, true);
            }
            out.push(b'}');
        }
        Kind::Completions | Kind::Generate => {
            out.extend_from_slice(b",\"text\":");
            put_str(out, text.unwrap_or(""));
        }
    }
    put_finish(out, d.logprobs, d.finish);
    out.push(b']');
    match usage {
        ChunkUsage::Absent => {}
        ChunkUsage::Null => out.extend_from_slice(b",\"usage\":null"),
        ChunkUsage::Of(u) => {
            out.extend_from_slice(b",\"usage\":");
            put_usage(out, u);
        }
    }
    out.extend_from_slice(b"}\n\n");
}

/// The usage-only chunk after every choice finished (`include_usage`).
pub fn usage_chunk(out: &mut Vec<u8>, m: &Meta<'_>, usage: &Usage) {
    out.extend_from_slice(b"data: ");
    put_head(out, m, true);
    out.extend_from_slice(b"],\"usage\":");
    put_usage(out, usage);
    out.extend_from_slice(b"}\n\n");
}

/// Generation failed after the stream started: the contract's error event, then `[DONE]`.
pub fn error_event(out: &mut Vec<u8>, message: &str) {
    out.extend_from_slice(b"data: {\"error\":{\"message\":");
    put_str(out, message);
    out.extend_from_slice(b",\"type\":\"internal_error\"}}\n\n");
}

pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// The client-facing finish reason: the OpenAI values pass, `error` never does (the caller
/// turns it into an error), anything else an engine says is passed as said.
pub fn finish_reason(engine: &str) -> Option<&str> {
    match engine {
        "error" => None,
        "" => Some("stop"),
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_openai_json() {
        let m = Meta { kind: Kind::Chat, id: "chatcmpl-1", created: 7, model: "m" };
        let u = Usage { prompt: 3, completion: 2, cached: 1, ..Usage::default() };
        let body = full(
            &m,
            &[Choice {
                index: 0,
                text: "hi \"x\"",
                reasoning: None,
                calls: &[],
                finish_reason: "stop",
                logprobs: None,
            }],
            &u,
        );
        let v: sonic_rs::Value = sonic_rs::from_slice(&body).unwrap();
        use sonic_rs::{JsonContainerTrait, JsonValueTrait};
        assert_eq!(v["choices"][0]["message"]["content"].as_str(), Some("hi \"x\""));
        assert_eq!(v["usage"]["total_tokens"].as_u64(), Some(5));
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(1));
        let mut out = Vec::new();
        chunk(&mut out, &m, 1, &Delta { role: true, ..Delta::default() }, ChunkUsage::Of(&u));
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("data: {") && s.ends_with("}\n\n"), "{s}");
        let v: sonic_rs::Value = sonic_rs::from_str(&s[6..]).unwrap();
        assert_eq!(v["choices"][0]["delta"]["role"].as_str(), Some("assistant"));
        assert_eq!(v["choices"][0]["delta"]["content"].as_str(), Some(""));
        assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(2));
        let c = Meta { kind: Kind::Completions, ..m };
        let mut out = Vec::new();
        usage_chunk(&mut out, &c, &u);
        let v: sonic_rs::Value = sonic_rs::from_slice(&out[6..]).unwrap();
        assert_eq!(v["object"].as_str(), Some("text_completion"));
        assert!(v["choices"].as_array().unwrap().is_empty());
        assert_eq!(finish_reason("error"), None);
        let mut out = Vec::new();
        put_usage(&mut out, &Usage { drafted: 10, accepted: 7, ..u });
        let v: sonic_rs::Value = sonic_rs::from_slice(&out).unwrap();
        let d = &v["completion_tokens_details"];
        assert_eq!(
            (d["accepted_prediction_tokens"].as_u64(), d["rejected_prediction_tokens"].as_u64()),
            (Some(7), Some(3))
        );
        assert!(d.get("reasoning_tokens").is_none());
    }
}
