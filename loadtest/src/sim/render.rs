//! Response bytes: HTTP heads and the OpenAI / SGLang JSON bodies and SSE events, written into reused buffers.
//!
//! Nothing here allocates beyond growing the caller's buffer; numbers go through `itoa`.
//!
//! SGLang's `/generate` with `"return_logprob": true` adds two lists to `meta_info`, each entry
//! a `[logprob, token_id, null]` triple (the third, the token's text, stays null as SGLang
//! leaves it without `return_text_in_logprobs`):
//!
//! - `input_token_logprobs`: the prompt's tokens from `logprob_start_len`. SGLang's default
//!   (-1, "output tokens only") starts at the prompt's last token, so by default the list holds
//!   that one entry; a start at or past the prompt's length is a 400. As SGLang pads it, the
//!   first entry's logprob is null. The sim has no tokenizer (the prompt is its bytes over
//!   --bytes-per-token tokens): ids and logprobs are fixed by the position alone
//!   (`prompt_token_id`, `prompt_logprob_milli`).
//! - `output_token_logprobs`: one entry per generated token, all " hi" (`TOKEN_ID`), their
//!   logprobs fixed by the position (`output_logprob_milli`), all in [-4, 0).
//!
//! Streamed, every chunk carries the whole `input_token_logprobs` and the
//! `output_token_logprobs` so far (SGLang's default, non-incremental streaming). A PD decode
//! server computes no prompt log-probabilities: its `input_token_logprobs` is `[]` in every
//! chunk and in a whole answer, while a prefill server answers the prompt's as any worker does;
//! a gateway in front of a pair puts the prefill's list before the decode's.

use crate::sim::request::Api;
use crate::wire::{put_chunk, put_u64};

/// Text of one simulated token.
pub const TOKEN: &str = " hi";
/// Its token id in `/generate`'s log-probabilities (an arbitrary fixed id).
pub const TOKEN_ID: u64 = 15_043;
/// Prompt token ids in log-probabilities are below this (a Llama-sized vocabulary).
const VOCAB: u64 = 32_000;

/// How a response body is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    Length(usize),
    Chunked,
}

pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// Appends a response head. `extra` holds complete header lines (each ending in CRLF).
pub fn put_head(out: &mut Vec<u8>, status: u16, content_type: &str, framing: Framing, keep_alive: bool, extra: &[u8]) {
    out.extend_from_slice(b"HTTP/1.1 ");
    put_u64(out, status as u64);
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\ncontent-type: ");
    out.extend_from_slice(content_type.as_bytes());
    match framing {
        Framing::Length(n) => {
            out.extend_from_slice(b"\r\ncontent-length: ");
            put_u64(out, n as u64);
        }
        Framing::Chunked => out.extend_from_slice(b"\r\ntransfer-encoding: chunked"),
    }
    if !keep_alive {
        out.extend_from_slice(b"\r\nconnection: close");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(extra);
    out.extend_from_slice(b"\r\n");
}

/// A complete response with a body of known length.
pub fn put_response(out: &mut Vec<u8>, status: u16, content_type: &str, body: &[u8], keep_alive: bool, extra: &[u8]) {
    put_head(out, status, content_type, Framing::Length(body.len()), keep_alive, extra);
    out.extend_from_slice(body);
}

/// JSON string literals come from the shared `smg-wire` crate (the gateway uses the same).
pub use smg_wire::json::put_str as put_json_str;

/// An OpenAI-style error body.
pub fn put_error_body(out: &mut Vec<u8>, status: u16, message: &str) {
    out.extend_from_slice(b"{\"error\":{\"message\":");
    put_json_str(out, message);
    out.extend_from_slice(b",\"type\":");
    put_json_str(out, reason(status));
    out.extend_from_slice(b",\"param\":null,\"code\":");
    put_u64(out, status as u64);
    out.extend_from_slice(b"}}");
}

/// Everything a generation response repeats.
#[derive(Clone, Copy, Debug)]
pub struct Gen<'a> {
    pub api: Api,
    pub port: u16,
    pub id: u64,
    pub created: u64,
    /// Already quoted and escaped.
    pub model_json: &'a str,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u32,
    /// "length" or "stop".
    pub finish: &'static str,
    /// `/generate` with `return_logprob`: `input_token_logprobs`, rendered once
    /// (`put_input_logprobs`); None without.
    pub input_logprobs: Option<&'a [u8]>,
}

// === impl Gen ===

impl Gen<'_> {
    fn put_id(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(match self.api {
            Api::Chat => b"\"chatcmpl-sim",
            Api::Messages => b"\"msg_sim",
            Api::Completions => b"\"cmpl-sim",
            Api::Generate | Api::Embeddings => b"\"sim",
        });
        put_u64(out, self.port as u64);
        out.push(b'-');
        put_u64(out, self.id);
        out.push(b'"');
    }

    fn put_usage(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"prompt_tokens\":");
        put_u64(out, self.prompt_tokens);
        out.extend_from_slice(b",\"completion_tokens\":");
        put_u64(out, self.completion_tokens as u64);
        out.extend_from_slice(b",\"total_tokens\":");
        put_u64(out, self.prompt_tokens + self.completion_tokens as u64);
        out.extend_from_slice(b",\"prompt_tokens_details\":{\"cached_tokens\":");
        put_u64(out, self.cached_tokens);
        out.extend_from_slice(b"}}");
    }

    fn put_text(out: &mut Vec<u8>, tokens: u32) {
        for _ in 0..tokens {
            out.extend_from_slice(TOKEN.as_bytes());
        }
    }

    /// The non-streaming body.
    pub fn put_full_body(&self, out: &mut Vec<u8>) {
        match self.api {
            Api::Chat | Api::Completions => {
                out.extend_from_slice(b"{\"id\":");
                self.put_id(out);
                out.extend_from_slice(if self.api == Api::Chat {
                    b",\"object\":\"chat.completion\",\"created\":".as_slice()
                } else {
                    b",\"object\":\"text_completion\",\"created\":".as_slice()
                });
                put_u64(out, self.created);
                out.extend_from_slice(b",\"model\":");
                out.extend_from_slice(self.model_json.as_bytes());
                if self.api == Api::Chat {
                    out.extend_from_slice(
                        b",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"",
                    );
                } else {
                    out.extend_from_slice(b",\"choices\":[{\"index\":0,\"text\":\"");
                }
                Self::put_text(out, self.completion_tokens);
                out.extend_from_slice(b"\"");
                if self.api == Api::Chat {
                    out.push(b'}');
                }
                out.extend_from_slice(b",\"logprobs\":null,\"finish_reason\":\"");
                out.extend_from_slice(self.finish.as_bytes());
                out.extend_from_slice(b"\"}],\"usage\":");
                self.put_usage(out);
                out.push(b'}');
            }
            Api::Generate => self.put_generate(out, self.completion_tokens, true),
            Api::Messages => {
                self.put_message_open(out, "[{\"type\":\"text\",\"text\":\"");
                Self::put_text(out, self.completion_tokens);
                out.extend_from_slice(b"\"}],\"stop_reason\":\"");
                out.extend_from_slice(self.stop_reason().as_bytes());
                out.extend_from_slice(b"\",\"stop_sequence\":null,\"usage\":");
                self.put_message_usage(out, self.completion_tokens);
                out.push(b'}');
            }
            Api::Embeddings => {}
        }
    }

    /// Anthropic's stop reason for the finish.
    fn stop_reason(&self) -> &'static str {
        if self.finish == "length" {
            "max_tokens"
        } else {
            "end_turn"
        }
    }

    /// `{"id":…,"type":"message","role":"assistant","model":…,"content":` and `content`.
    fn put_message_open(&self, out: &mut Vec<u8>, content: &str) {
        out.extend_from_slice(b"{\"id\":");
        self.put_id(out);
        out.extend_from_slice(b",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
        out.extend_from_slice(self.model_json.as_bytes());
        out.extend_from_slice(b",\"content\":");
        out.extend_from_slice(content.as_bytes());
    }

    fn put_message_usage(&self, out: &mut Vec<u8>, output: u32) {
        out.extend_from_slice(b"{\"input_tokens\":");
        put_u64(out, self.prompt_tokens);
        out.extend_from_slice(b",\"cache_read_input_tokens\":");
        put_u64(out, self.cached_tokens);
        out.extend_from_slice(b",\"output_tokens\":");
        put_u64(out, output as u64);
        out.push(b'}');
    }

    /// A Messages stream's opening: `message_start`, the text block's `content_block_start`, a
    /// `ping`, as Anthropic sends them before the first token.
    pub fn put_message_start(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":");
        self.put_message_open(out, "[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":");
        self.put_message_usage(out, 1);
        out.extend_from_slice(b"}}\n\n");
        out.extend_from_slice(b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
        out.extend_from_slice(b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
    }

    /// A Messages stream's end: `content_block_stop`, `message_delta` with the stop reason and
    /// the output tokens, `message_stop`.
    pub fn put_message_end(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n");
        out.extend_from_slice(b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"");
        out.extend_from_slice(self.stop_reason().as_bytes());
        out.extend_from_slice(b"\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":");
        put_u64(out, self.completion_tokens as u64);
        out.extend_from_slice(b"}}\n\n");
        out.extend_from_slice(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    }

    /// `data: {...,"choices":[` — the part of every chat/completions chunk before the choice.
    pub fn put_chunk_prefix(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"data: {\"id\":");
        self.put_id(out);
        out.extend_from_slice(if self.api == Api::Chat {
            b",\"object\":\"chat.completion.chunk\",\"created\":".as_slice()
        } else {
            b",\"object\":\"text_completion\",\"created\":".as_slice()
        });
        put_u64(out, self.created);
        out.extend_from_slice(b",\"model\":");
        out.extend_from_slice(self.model_json.as_bytes());
        out.extend_from_slice(b",\"choices\":[");
    }

    /// The first chat event: the assistant role, no text yet.
    pub fn put_role_event(&self, out: &mut Vec<u8>, prefix: &[u8]) {
        out.extend_from_slice(prefix);
        out.extend_from_slice(
            b"{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
        );
    }

    /// One token. For /generate, `done` is the count so far (SGLang streams the cumulative text).
    pub fn put_token_event(&self, out: &mut Vec<u8>, prefix: &[u8], done: u32) {
        match self.api {
            Api::Chat => {
                out.extend_from_slice(prefix);
                out.extend_from_slice(b"{\"index\":0,\"delta\":{\"content\":\"");
                out.extend_from_slice(TOKEN.as_bytes());
                out.extend_from_slice(b"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
            }
            Api::Completions => {
                out.extend_from_slice(prefix);
                out.extend_from_slice(b"{\"index\":0,\"text\":\"");
                out.extend_from_slice(TOKEN.as_bytes());
                out.extend_from_slice(b"\",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
            }
            Api::Generate => {
                out.extend_from_slice(b"data: ");
                self.put_generate(out, done, done == self.completion_tokens);
                out.extend_from_slice(b"\n\n");
            }
            Api::Messages => {
                out.extend_from_slice(b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"");
                out.extend_from_slice(TOKEN.as_bytes());
                out.extend_from_slice(b"\"}}\n\n");
            }
            Api::Embeddings => {}
        }
    }

    /// The chunk carrying finish_reason (chat and completions only).
    pub fn put_finish_event(&self, out: &mut Vec<u8>, prefix: &[u8]) {
        out.extend_from_slice(prefix);
        if self.api == Api::Chat {
            out.extend_from_slice(b"{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"");
        } else {
            out.extend_from_slice(b"{\"index\":0,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"");
        }
        out.extend_from_slice(self.finish.as_bytes());
        out.extend_from_slice(b"\"}]}\n\n");
    }

    /// `stream_options.include_usage`: empty choices plus the whole request's usage.
    pub fn put_usage_event(&self, out: &mut Vec<u8>, prefix: &[u8]) {
        out.extend_from_slice(prefix);
        out.extend_from_slice(b"],\"usage\":");
        self.put_usage(out);
        out.extend_from_slice(b"}\n\n");
    }

    fn put_generate(&self, out: &mut Vec<u8>, tokens: u32, finished: bool) {
        out.extend_from_slice(b"{\"text\":\"");
        Self::put_text(out, tokens);
        out.extend_from_slice(b"\",\"meta_info\":{\"id\":");
        self.put_id(out);
        out.extend_from_slice(b",\"finish_reason\":");
        if finished {
            if self.finish == "length" {
                out.extend_from_slice(b"{\"type\":\"length\",\"length\":");
                put_u64(out, tokens as u64);
                out.push(b'}');
            } else {
                out.extend_from_slice(b"{\"type\":\"stop\",\"matched\":null}");
            }
        } else {
            out.extend_from_slice(b"null");
        }
        out.extend_from_slice(b",\"prompt_tokens\":");
        put_u64(out, self.prompt_tokens);
        out.extend_from_slice(b",\"completion_tokens\":");
        put_u64(out, tokens as u64);
        out.extend_from_slice(b",\"cached_tokens\":");
        put_u64(out, self.cached_tokens);
        if let Some(input) = self.input_logprobs {
            out.extend_from_slice(b",\"input_token_logprobs\":");
            out.extend_from_slice(input);
            out.extend_from_slice(b",\"output_token_logprobs\":[");
            for k in 0..tokens as u64 {
                if k > 0 {
                    out.push(b',');
                }
                put_triple(out, Some(output_logprob_milli(k)), TOKEN_ID);
            }
            out.push(b']');
        }
        out.extend_from_slice(b"}}");
    }
}

/// `input_token_logprobs` for the prompt positions `positions` (empty: `[]`): the first entry's
/// logprob is null, as SGLang pads it.
pub fn put_input_logprobs(out: &mut Vec<u8>, positions: std::ops::Range<u64>) {
    out.push(b'[');
    let first = positions.start;
    for k in positions {
        if k > first {
            out.push(b',');
        }
        put_triple(out, (k > first).then(|| prompt_logprob_milli(k)), prompt_token_id(k));
    }
    out.push(b']');
}

/// `[logprob, token_id, null]`, the logprob given in thousandths below 0 (None: null).
fn put_triple(out: &mut Vec<u8>, milli: Option<u64>, id: u64) {
    out.push(b'[');
    match milli {
        Some(m) => {
            out.push(b'-');
            put_u64(out, m / 1000);
            out.push(b'.');
            let frac = m % 1000;
            out.extend_from_slice(&[
                b'0' + (frac / 100) as u8,
                b'0' + (frac / 10 % 10) as u8,
                b'0' + (frac % 10) as u8,
            ]);
        }
        None => out.extend_from_slice(b"null"),
    }
    out.push(b',');
    put_u64(out, id);
    out.extend_from_slice(b",null]");
}

/// splitmix64's finalizer: neighbouring positions give unrelated values.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The id the simulated tokenizer gives prompt position `k`.
pub fn prompt_token_id(k: u64) -> u64 {
    mix(k.wrapping_add(0x9E37_79B9_7F4A_7C15)) % VOCAB
}

/// Minus the logprob of prompt position `k`, in thousandths: in [1, 4000].
pub fn prompt_logprob_milli(k: u64) -> u64 {
    1 + mix(k ^ 0x5151_5151_5151_5151) % 4000
}

/// Minus the logprob of output position `k`, in thousandths: in [1, 2000].
pub fn output_logprob_milli(k: u64) -> u64 {
    1 + mix(k ^ 0x0A0A_0A0A_0A0A_0A0A) % 2000
}

pub const DONE_EVENT: &[u8] = b"data: [DONE]\n\n";

/// Wraps the SSE bytes in `events` as one HTTP chunk on `out` and clears `events`.
pub fn flush_events(out: &mut Vec<u8>, events: &mut Vec<u8>) {
    put_chunk(out, events);
    events.clear();
}

/// `/v1/embeddings` body; `vector` is the precomputed JSON array.
pub fn put_embeddings_body(out: &mut Vec<u8>, model_json: &str, vector: &str, prompt_tokens: u64) {
    out.extend_from_slice(b"{\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":0,\"embedding\":");
    out.extend_from_slice(vector.as_bytes());
    out.extend_from_slice(b"}],\"model\":");
    out.extend_from_slice(model_json.as_bytes());
    out.extend_from_slice(b",\"usage\":{\"prompt_tokens\":");
    put_u64(out, prompt_tokens);
    out.extend_from_slice(b",\"total_tokens\":");
    put_u64(out, prompt_tokens);
    out.extend_from_slice(b"}}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonic_rs::{JsonContainerTrait, JsonValueTrait};

    fn gen(api: Api) -> Gen<'static> {
        Gen {
            api,
            port: 1,
            id: 7,
            created: 100,
            model_json: "\"m\\\"x\"",
            prompt_tokens: 10,
            cached_tokens: 4,
            completion_tokens: 3,
            finish: "length",
            input_logprobs: None,
        }
    }

    fn json(bytes: &[u8]) -> sonic_rs::Value {
        sonic_rs::from_slice(bytes).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(bytes)))
    }

    #[test]
    fn full_bodies_are_valid_json() {
        for api in [Api::Chat, Api::Completions, Api::Generate] {
            let mut out = Vec::new();
            gen(api).put_full_body(&mut out);
            let v = json(&out);
            match api {
                Api::Chat => {
                    assert_eq!(v["choices"][0]["message"]["content"].as_str(), Some(" hi hi hi"));
                    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(4));
                    assert_eq!(v["usage"]["total_tokens"].as_u64(), Some(13));
                    assert_eq!(v["model"].as_str(), Some("m\"x"));
                }
                Api::Completions => assert_eq!(v["choices"][0]["text"].as_str(), Some(" hi hi hi")),
                _ => assert_eq!(v["meta_info"]["finish_reason"]["length"].as_u64(), Some(3)),
            }
        }
        let mut out = Vec::new();
        put_embeddings_body(&mut out, "\"m\"", "[0.1,0.2]", 5);
        assert_eq!(json(&out)["usage"]["prompt_tokens"].as_u64(), Some(5));
    }

    #[test]
    fn stream_events_are_valid_json() {
        for api in [Api::Chat, Api::Completions] {
            let g = gen(api);
            let mut prefix = Vec::new();
            g.put_chunk_prefix(&mut prefix);
            let mut ev = Vec::new();
            g.put_role_event(&mut ev, &prefix);
            g.put_token_event(&mut ev, &prefix, 1);
            g.put_finish_event(&mut ev, &prefix);
            g.put_usage_event(&mut ev, &prefix);
            let text = String::from_utf8(ev).unwrap();
            let events: Vec<_> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
            assert_eq!(events.len(), 4);
            for e in &events {
                json(e.strip_prefix("data: ").unwrap().as_bytes());
            }
            let usage = json(events[3].strip_prefix("data: ").unwrap().as_bytes());
            assert_eq!(usage["choices"].as_array().map(|a| a.len()), Some(0));
            assert_eq!(usage["usage"]["completion_tokens"].as_u64(), Some(3));
        }
        let g = gen(Api::Generate);
        let mut ev = Vec::new();
        g.put_token_event(&mut ev, &[], 2);
        let v = json(ev.strip_prefix(b"data: ").unwrap().strip_suffix(b"\n\n").unwrap());
        assert_eq!(v["text"].as_str(), Some(" hi hi"));
        assert!(v["meta_info"]["finish_reason"].is_null());
    }

    #[test]
    fn generate_logprobs() {
        let mut input = Vec::new();
        put_input_logprobs(&mut input, 7..10);
        let g = Gen { input_logprobs: Some(&input), ..gen(Api::Generate) };
        let mut out = Vec::new();
        g.put_full_body(&mut out);
        let v = json(&out);
        let meta = &v["meta_info"];
        let inp = meta["input_token_logprobs"].as_array().unwrap();
        assert_eq!(inp.len(), 3);
        assert!(inp[0][0].is_null(), "the window's first is padded with null");
        for (i, t) in inp.iter().enumerate() {
            let k = 7 + i as u64;
            assert_eq!(t[1].as_u64(), Some(prompt_token_id(k)));
            assert!(t[2].is_null());
            if i > 0 {
                let lp = t[0].as_f64().unwrap();
                assert!((lp + prompt_logprob_milli(k) as f64 / 1000.0).abs() < 1e-9 && lp < 0.0, "{lp}");
            }
        }
        let outp = meta["output_token_logprobs"].as_array().unwrap();
        assert_eq!(outp.len(), 3);
        for (k, t) in outp.iter().enumerate() {
            assert_eq!(t[1].as_u64(), Some(TOKEN_ID));
            let lp = t[0].as_f64().unwrap();
            assert!((-2.0..0.0).contains(&lp), "{lp}");
            assert_eq!((-lp * 1000.0).round() as u64, output_logprob_milli(k as u64));
        }
        // A streamed chunk: the whole input list, the output ones so far; a decode's input list is [].
        let mut empty = Vec::new();
        put_input_logprobs(&mut empty, 5..5);
        assert_eq!(empty, b"[]");
        let g = Gen { input_logprobs: Some(&empty), ..gen(Api::Generate) };
        let mut ev = Vec::new();
        g.put_token_event(&mut ev, &[], 2);
        let v = json(ev.strip_prefix(b"data: ").unwrap().strip_suffix(b"\n\n").unwrap());
        assert_eq!(v["meta_info"]["input_token_logprobs"].as_array().map(|a| a.len()), Some(0));
        assert_eq!(v["meta_info"]["output_token_logprobs"].as_array().map(|a| a.len()), Some(2));
        // Without return_logprob, neither list.
        let mut out = Vec::new();
        gen(Api::Generate).put_full_body(&mut out);
        assert!(json(&out)["meta_info"].get("output_token_logprobs").is_none());
        let mut t = Vec::new();
        put_triple(&mut t, Some(4000), 1);
        put_triple(&mut t, Some(7), 2);
        assert_eq!(t, b"[-4.000,1,null][-0.007,2,null]");
    }

    #[test]
    fn heads() {
        let mut out = Vec::new();
        put_response(&mut out, 503, "application/json", b"{}", false, b"x-a: 1\r\n");
        assert_eq!(
            out,
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\nx-a: 1\r\n\r\n{}"
        );
        let mut out = Vec::new();
        put_error_body(&mut out, 500, "bad \"x\"");
        assert_eq!(json(&out)["error"]["code"].as_u64(), Some(500));
    }
}

/// Per-connection scratch buffers, reused across requests.
#[derive(Default)]
pub struct Scratch {
    /// Bytes about to be written to the socket.
    pub out: Vec<u8>,
    /// SSE events (or a JSON body) being assembled.
    pub events: Vec<u8>,
    /// The repeated start of every chunk of one stream.
    pub prefix: Vec<u8>,
}
