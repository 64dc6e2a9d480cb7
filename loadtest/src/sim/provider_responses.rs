//! `POST /v1/responses` on a `--provider-keys` worker (OpenAI and xAI hosts): OpenAI's Responses
//! API played by a provider that KEEPS NO STATE.
//!
//! Why: a gateway in front of a provider may keep the conversation itself (its own history
//! store, `previous_response_id` and `conversation` resolved on its side) and send the provider
//! the whole input every turn. This provider remembers nothing, so a gateway that leans on the
//! provider's memory fails loudly, and its answer repeats everything it was sent so a test can
//! check the history the gateway rebuilt:
//!
//! - The text is `heard ` and the input items rendered, joined with ` | `, in order: a message
//!   `<role>:<text, parts concatenated>`, a `function_call` `call:<name>(<arguments>)`, a
//!   `function_call_output` `tool:<output>`, `instructions` first as `instructions:<text>`;
//!   `reasoning` items are left out, any other item type is `item:<type>`. Input "hi" →
//!   `heard user:hi`.
//! - A non-empty `previous_response_id`: 400 `previous_response_not_found`; a non-empty
//!   `conversation` (a string or `{"id": ..}`): 404, both in OpenAI's words. `store` is echoed
//!   (default true) but nothing is stored.
//! - Tokens: input is the raw JSON of `input` and `instructions` over `--bytes-per-token`, as the
//!   sim counts prompts (never cached: `cached_tokens` is 0); output tokens are the text's
//!   whitespace-led words (`heard`, ` user:hi`), one per stream delta. A `max_output_tokens`
//!   below the word count cuts the text: status `incomplete`, `incomplete_details`
//!   `{"reason":"max_output_tokens"}` (no minimum of 16 as OpenAI has, so short cuts can be
//!   tested).
//! - Timing, admission and faults as a chat request's (engine.rs): a batch slot, TTFT plus
//!   prefill of every input token, one ITL per word; non-streamed answers wait for the last
//!   word; `--fail-rate`, hangs and truncations apply. Streamed: OpenAI's typed events
//!   (`event: <type>` and `data:` with `type` and a contiguous `sequence_number`), no `[DONE]`.
//!
//! The key, model and `provider_fail` checks are provider.rs's, as for chat; Anthropic and
//! Gemini hosts answer 404 there. Parsing is sonic-rs's lazy iterators and the JSON is written
//! by hand: the sim serves load tests.

use std::io;
use std::rc::Rc;

use monoio::net::TcpStream;
use monoio::time::Instant;
use sonic_rs::{JsonValueTrait, LazyValue};

use crate::rt::write_out;
use crate::sim::faults::{self, Fault};
use crate::sim::pace::stream_tokens;
use crate::sim::render::{flush_events, put_head, put_json_str, put_response, Framing, Scratch};
use crate::sim::timing;
use crate::sim::worker::{bump, Worker};
use crate::wire::{put_u64, LAST_CHUNK};

const JSON: &str = "application/json";

/// A refused request: its status and OpenAI's error body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub body: Vec<u8>,
}

/// OpenAI's error body: `{"error":{"message","type":"invalid_request_error","param","code"}}`.
pub fn error_body(message: &str, param: Option<&str>, code: Option<&str>) -> Vec<u8> {
    let mut b = Vec::with_capacity(96 + message.len());
    b.extend_from_slice(b"{\"error\":{\"message\":");
    put_json_str(&mut b, message);
    b.extend_from_slice(b",\"type\":\"invalid_request_error\",\"param\":");
    put_opt_str(&mut b, param);
    b.extend_from_slice(b",\"code\":");
    put_opt_str(&mut b, code);
    b.extend_from_slice(b"}}");
    b
}

fn put_opt_str(b: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => put_json_str(b, s),
        None => b.extend_from_slice(b"null"),
    }
}

fn refuse(status: u16, message: &str, param: Option<&str>, code: Option<&str>) -> Refusal {
    Refusal { status, body: error_body(message, param, code) }
}

fn missing(param: &str) -> Refusal {
    refuse(400, &format!("Missing required parameter: '{param}'."), Some(param), Some("missing_required_parameter"))
}

fn bad_type(param: &str, want: &str) -> Refusal {
    refuse(400, &format!("Invalid type for '{param}': expected {want}."), Some(param), Some("invalid_type"))
}

fn unparsable() -> Refusal {
    refuse(
        400,
        "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)",
        None,
        None,
    )
}

/// What a request asks. Echoed members are kept as their compact raw JSON; None: absent or
/// null (the answer writes OpenAI's default).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ask {
    /// The answer's whole text: `heard ` and the input rendered.
    pub heard: String,
    /// Raw JSON bytes of `input` and `instructions`: the input tokens' measure.
    pub input_bytes: usize,
    pub stream: bool,
    pub max_output_tokens: Option<u64>,
    pub model: String,
    pub instructions: Option<String>,
    pub parallel_tool_calls: Option<String>,
    pub store: Option<String>,
    pub temperature: Option<String>,
    pub text: Option<String>,
    pub tool_choice: Option<String>,
    pub tools: Option<String>,
    pub top_p: Option<String>,
    pub user: Option<String>,
    pub metadata: Option<String>,
}

/// Raw JSON on one line: an SSE `data:` line must not break (a pretty-printed request's
/// newlines are only ever between tokens, so the rare such value is re-serialized).
fn compact(raw: &str) -> String {
    if raw.contains(['\n', '\r']) {
        sonic_rs::from_str::<sonic_rs::Value>(raw)
            .ok()
            .and_then(|v| sonic_rs::to_string(&v).ok())
            .unwrap_or_else(|| raw.replace(['\n', '\r'], " "))
    } else {
        raw.to_string()
    }
}

/// Reads a request body; the refusals are OpenAI's (400, or 404 for a `conversation`).
pub fn parse(body: &[u8]) -> Result<Ask, Refusal> {
    let mut ask = Ask::default();
    let mut model = false;
    let mut input: Option<LazyValue<'_>> = None;
    let mut instructions: Option<String> = None;
    let mut previous: Option<String> = None;
    let mut conversation: Option<String> = None;
    let mut seen_any = false;
    for entry in sonic_rs::to_object_iter(body) {
        let (key, v) = entry.map_err(|_| unparsable())?;
        seen_any = true;
        if v.is_null() {
            continue;
        }
        let raw = || Some(compact(v.as_raw_str()));
        match key.as_ref() {
            "model" => {
                v.as_str().ok_or_else(|| bad_type("model", "a string"))?;
                ask.model = compact(v.as_raw_str());
                model = true;
            }
            "input" => {
                if !v.is_str() && !v.is_array() {
                    return Err(bad_type("input", "a string or an array of input items"));
                }
                ask.input_bytes += v.as_raw_str().len();
                input = Some(v);
            }
            "instructions" => {
                let s = v.as_str().ok_or_else(|| bad_type("instructions", "a string"))?;
                instructions = Some(s.to_string());
                ask.input_bytes += v.as_raw_str().len();
                ask.instructions = raw();
            }
            "stream" => ask.stream = v.as_bool().ok_or_else(|| bad_type("stream", "a boolean"))?,
            "max_output_tokens" => {
                let n = v.as_u64().ok_or_else(|| bad_type("max_output_tokens", "a non-negative integer"))?;
                ask.max_output_tokens = Some(n);
            }
            "store" => {
                v.as_bool().ok_or_else(|| bad_type("store", "a boolean"))?;
                ask.store = raw();
            }
            "parallel_tool_calls" => {
                v.as_bool().ok_or_else(|| bad_type("parallel_tool_calls", "a boolean"))?;
                ask.parallel_tool_calls = raw();
            }
            "temperature" => {
                v.as_f64().ok_or_else(|| bad_type("temperature", "a number"))?;
                ask.temperature = raw();
            }
            "top_p" => {
                v.as_f64().ok_or_else(|| bad_type("top_p", "a number"))?;
                ask.top_p = raw();
            }
            "user" => {
                v.as_str().ok_or_else(|| bad_type("user", "a string"))?;
                ask.user = raw();
            }
            "metadata" => {
                if !v.is_object() {
                    return Err(bad_type("metadata", "an object"));
                }
                ask.metadata = raw();
            }
            "tools" => {
                if !v.is_array() {
                    return Err(bad_type("tools", "an array"));
                }
                ask.tools = raw();
            }
            "text" => {
                if !v.is_object() {
                    return Err(bad_type("text", "an object"));
                }
                ask.text = raw();
            }
            "tool_choice" => ask.tool_choice = raw(),
            "previous_response_id" => {
                let s = v.as_str().ok_or_else(|| bad_type("previous_response_id", "a string"))?;
                previous = (!s.is_empty()).then(|| s.to_string());
            }
            "conversation" => {
                let id = match v.as_str() {
                    Some(s) => Some(s.to_string()),
                    None => v.get("id").and_then(|id| id.as_str().map(str::to_string)),
                };
                let id = id.ok_or_else(|| bad_type("conversation", "a string or an object with an id"))?;
                conversation = (!id.is_empty()).then_some(id);
            }
            _ => {}
        }
    }
    if !seen_any && sonic_rs::from_slice::<sonic_rs::Value>(body).map_or(true, |v| !v.is_object()) {
        return Err(unparsable());
    }
    if !model {
        return Err(missing("model"));
    }
    // Nothing is kept: whatever the gateway expected the provider to remember is not found.
    if let Some(id) = previous {
        return Err(refuse(
            400,
            &format!("Previous response with id '{id}' not found."),
            Some("previous_response_id"),
            Some("previous_response_not_found"),
        ));
    }
    if let Some(id) = conversation {
        return Err(refuse(404, &format!("Conversation with id '{id}' not found."), None, None));
    }
    let input = input.ok_or_else(|| missing("input"))?;
    let mut parts: Vec<String> = Vec::new();
    if let Some(i) = instructions {
        parts.push(format!("instructions:{i}"));
    }
    render_input(&input, &mut parts)?;
    ask.heard = format!("heard {}", parts.join(" | "));
    Ok(ask)
}

/// Renders `input` (a string, or an array of items) into `parts`, one per item.
fn render_input(input: &LazyValue<'_>, parts: &mut Vec<String>) -> Result<(), Refusal> {
    if let Some(s) = input.as_str() {
        parts.push(format!("user:{s}"));
        return Ok(());
    }
    for (i, item) in sonic_rs::to_array_iter(input.as_raw_str()).enumerate() {
        let item = item.map_err(|_| unparsable())?;
        if let Some(p) = render_item(&item, i)? {
            parts.push(p);
        }
    }
    Ok(())
}

/// One input item's rendering; None for a `reasoning` item.
fn render_item(item: &LazyValue<'_>, i: usize) -> Result<Option<String>, Refusal> {
    if !item.is_object() {
        return Err(bad_type(&format!("input[{i}]"), "an object"));
    }
    let field = |name: &str| item.get(name).filter(|v| !v.is_null());
    let string = |name: &str| -> Result<String, Refusal> {
        let param = format!("input[{i}].{name}");
        let v = field(name).ok_or_else(|| missing(&param))?;
        v.as_str().map(str::to_string).ok_or_else(|| bad_type(&param, "a string"))
    };
    let kind = match field("type") {
        Some(t) => t.as_str().map(str::to_string).ok_or_else(|| bad_type(&format!("input[{i}].type"), "a string"))?,
        None => "message".to_string(),
    };
    Ok(Some(match kind.as_str() {
        "message" => {
            let role = string("role")?;
            let content = field("content").ok_or_else(|| missing(&format!("input[{i}].content")))?;
            format!(
                "{role}:{}",
                content_text(&content)
                    .ok_or_else(|| bad_type(&format!("input[{i}].content"), "a string or an array of parts"))?
            )
        }
        "function_call" => format!("call:{}({})", string("name")?, string("arguments")?),
        "function_call_output" => {
            let out = field("output").ok_or_else(|| missing(&format!("input[{i}].output")))?;
            // A string, or (newer) an array of content parts; anything else as its JSON.
            format!("tool:{}", content_text(&out).unwrap_or_else(|| compact(out.as_raw_str())))
        }
        "reasoning" => return Ok(None),
        other => format!("item:{other}"),
    }))
}

/// A message's content as text: a string, or its parts' `text` (and `refusal`) concatenated;
/// None when it is neither a string nor an array.
fn content_text(content: &LazyValue<'_>) -> Option<String> {
    if let Some(s) = content.as_str() {
        return Some(s.to_string());
    }
    if !content.is_array() {
        return None;
    }
    let mut text = String::new();
    for part in sonic_rs::to_array_iter(content.as_raw_str()).flatten() {
        if let Some(t) = part.get("text").or_else(|| part.get("refusal")) {
            text.push_str(t.as_str().unwrap_or_default());
        }
    }
    Some(text)
}

/// End offsets of the text's tokens: each a run of whitespace, then one of anything else
/// (`heard`, ` user:hi`); trailing whitespace ends the last. Cut at ASCII bytes only, so every
/// token is whole UTF-8.
pub fn token_ends(text: &str) -> Vec<usize> {
    let b = text.as_bytes();
    let mut ends: Vec<usize> =
        (1..b.len()).filter(|&i| b[i].is_ascii_whitespace() && !b[i - 1].is_ascii_whitespace()).collect();
    if b.is_empty() {
        return ends;
    }
    if ends.last().is_some_and(|&e| b[e..].iter().all(u8::is_ascii_whitespace)) {
        ends.pop();
    }
    ends.push(b.len());
    ends
}

/// One answer, planned: everything its body and events say, without I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    pub ask: Ask,
    /// `resp_` and 48 hex digits; the message item's `msg_` and 48.
    pub id: String,
    pub msg_id: String,
    pub created_at: u64,
    pub input_tokens: u64,
    ends: Vec<usize>,
    /// Tokens the answer gives (every one of the text's, or `max_output_tokens`).
    pub output_tokens: u32,
    /// Cut by `max_output_tokens`.
    pub incomplete: bool,
    /// A truncation fault: Some(after) cuts the connection (None: halfway).
    pub truncate: Option<Option<u32>>,
}

/// Which form of the response object to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// In `response.created` / `response.in_progress`: no output, usage null.
    InProgress,
    Done,
}

// === impl Turn ===

impl Turn {
    pub fn new(ask: Ask, id: String, msg_id: String, created_at: u64, input_tokens: u64) -> Self {
        let ends = token_ends(&ask.heard);
        let all = ends.len() as u64;
        let n = ask.max_output_tokens.map_or(all, |m| m.min(all));
        Turn {
            id,
            msg_id,
            created_at,
            input_tokens,
            output_tokens: u32::try_from(n).unwrap_or(u32::MAX),
            incomplete: n < all,
            ends,
            ask,
            truncate: None,
        }
    }

    /// The answer's text (cut when incomplete).
    pub fn text(&self) -> &str {
        &self.ask.heard[..self.end_of(self.output_tokens)]
    }

    /// Where the first `k` tokens end.
    fn end_of(&self, k: u32) -> usize {
        match k {
            0 => 0,
            k => self.ends[k as usize - 1],
        }
    }

    /// Token `k` (0-based), one stream delta.
    pub fn delta(&self, k: u32) -> &str {
        &self.ask.heard[self.end_of(k)..self.end_of(k + 1)]
    }

    fn status(&self) -> &'static str {
        if self.incomplete {
            "incomplete"
        } else {
            "completed"
        }
    }

    /// The non-streamed body: the final response object.
    pub fn put_body(&self, out: &mut Vec<u8>) {
        self.put_object(out, Phase::Done);
    }

    fn put_object(&self, out: &mut Vec<u8>, phase: Phase) {
        let a = &self.ask;
        let or = |out: &mut Vec<u8>, v: &Option<String>, default: &str| {
            out.extend_from_slice(v.as_deref().unwrap_or(default).as_bytes());
        };
        let done = phase == Phase::Done;
        out.extend_from_slice(b"{\"id\":");
        put_json_str(out, &self.id);
        out.extend_from_slice(b",\"object\":\"response\",\"created_at\":");
        put_u64(out, self.created_at);
        out.extend_from_slice(b",\"status\":\"");
        out.extend_from_slice(if done { self.status() } else { "in_progress" }.as_bytes());
        out.extend_from_slice(b"\",\"error\":null,\"incomplete_details\":");
        out.extend_from_slice(if done && self.incomplete {
            b"{\"reason\":\"max_output_tokens\"}".as_slice()
        } else {
            b"null"
        });
        out.extend_from_slice(b",\"instructions\":");
        or(out, &a.instructions, "null");
        out.extend_from_slice(b",\"max_output_tokens\":");
        match a.max_output_tokens {
            Some(n) => put_u64(out, n),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"model\":");
        out.extend_from_slice(a.model.as_bytes());
        out.extend_from_slice(b",\"output\":[");
        if done {
            self.put_item(out, true);
        }
        out.extend_from_slice(b"],\"parallel_tool_calls\":");
        or(out, &a.parallel_tool_calls, "true");
        out.extend_from_slice(
            b",\"previous_response_id\":null,\"reasoning\":{\"effort\":null,\"summary\":null},\"store\":",
        );
        or(out, &a.store, "true");
        out.extend_from_slice(b",\"temperature\":");
        or(out, &a.temperature, "1.0");
        out.extend_from_slice(b",\"text\":");
        or(out, &a.text, "{\"format\":{\"type\":\"text\"}}");
        out.extend_from_slice(b",\"tool_choice\":");
        or(out, &a.tool_choice, "\"auto\"");
        out.extend_from_slice(b",\"tools\":");
        or(out, &a.tools, "[]");
        out.extend_from_slice(b",\"top_p\":");
        or(out, &a.top_p, "1.0");
        out.extend_from_slice(b",\"truncation\":\"disabled\",\"usage\":");
        if done {
            out.extend_from_slice(b"{\"input_tokens\":");
            put_u64(out, self.input_tokens);
            out.extend_from_slice(b",\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":");
            put_u64(out, self.output_tokens as u64);
            out.extend_from_slice(b",\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":");
            put_u64(out, self.input_tokens + self.output_tokens as u64);
            out.push(b'}');
        } else {
            out.extend_from_slice(b"null");
        }
        out.extend_from_slice(b",\"user\":");
        or(out, &a.user, "null");
        out.extend_from_slice(b",\"metadata\":");
        or(out, &a.metadata, "{}");
        out.push(b'}');
    }

    /// The message item: in progress with no content, or done with the text.
    fn put_item(&self, out: &mut Vec<u8>, done: bool) {
        out.extend_from_slice(b"{\"type\":\"message\",\"id\":");
        put_json_str(out, &self.msg_id);
        out.extend_from_slice(b",\"status\":\"");
        out.extend_from_slice(if done { self.status() } else { "in_progress" }.as_bytes());
        out.extend_from_slice(b"\",\"role\":\"assistant\",\"content\":[");
        if done {
            put_part(out, self.text());
        }
        out.extend_from_slice(b"]}");
    }

    /// `"item_id":..,"output_index":0,"content_index":0`.
    fn put_where(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b",\"item_id\":");
        put_json_str(out, &self.msg_id);
        out.extend_from_slice(b",\"output_index\":0,\"content_index\":0");
    }

    /// The stream's first events, due at admission: `response.created`,
    /// `response.in_progress`, `response.output_item.added`, `response.content_part.added`.
    pub fn put_opening(&self, out: &mut Vec<u8>, seq: &mut u64) {
        for kind in ["response.created", "response.in_progress"] {
            open_event(out, kind, seq);
            out.extend_from_slice(b",\"response\":");
            self.put_object(out, Phase::InProgress);
            close_event(out);
        }
        open_event(out, "response.output_item.added", seq);
        out.extend_from_slice(b",\"output_index\":0,\"item\":");
        self.put_item(out, false);
        close_event(out);
        open_event(out, "response.content_part.added", seq);
        self.put_where(out);
        out.extend_from_slice(b",\"part\":");
        put_part(out, "");
        close_event(out);
    }

    /// `response.output_text.delta` for token `k`.
    pub fn put_delta(&self, out: &mut Vec<u8>, seq: &mut u64, k: u32) {
        open_event(out, "response.output_text.delta", seq);
        self.put_where(out);
        out.extend_from_slice(b",\"delta\":");
        put_json_str(out, self.delta(k));
        out.extend_from_slice(b",\"logprobs\":[]");
        close_event(out);
    }

    /// The stream's last events: the text, part and item done, then `response.completed` (or
    /// `response.incomplete`) with the final object.
    pub fn put_closing(&self, out: &mut Vec<u8>, seq: &mut u64) {
        open_event(out, "response.output_text.done", seq);
        self.put_where(out);
        out.extend_from_slice(b",\"text\":");
        put_json_str(out, self.text());
        out.extend_from_slice(b",\"logprobs\":[]");
        close_event(out);
        open_event(out, "response.content_part.done", seq);
        self.put_where(out);
        out.extend_from_slice(b",\"part\":");
        put_part(out, self.text());
        close_event(out);
        open_event(out, "response.output_item.done", seq);
        out.extend_from_slice(b",\"output_index\":0,\"item\":");
        self.put_item(out, true);
        close_event(out);
        open_event(out, if self.incomplete { "response.incomplete" } else { "response.completed" }, seq);
        out.extend_from_slice(b",\"response\":");
        self.put_object(out, Phase::Done);
        close_event(out);
    }
}

fn put_part(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(b"{\"type\":\"output_text\",\"text\":");
    put_json_str(out, text);
    out.extend_from_slice(b",\"annotations\":[],\"logprobs\":[]}");
}

/// `event: <kind>\ndata: {"type":"<kind>","sequence_number":N` (the caller adds the rest).
fn open_event(out: &mut Vec<u8>, kind: &str, seq: &mut u64) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\ndata: {\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"sequence_number\":");
    put_u64(out, *seq);
    *seq += 1;
}

fn close_event(out: &mut Vec<u8>) {
    out.extend_from_slice(b"}\n\n");
}

/// `prefix` and 48 hex digits: 32 random, then the worker's port (4) and its answer count (12),
/// so no two answers of one simulator share an id.
fn new_id(w: &Worker, prefix: &str, serial: u64) -> String {
    format!(
        "{prefix}{:016x}{:016x}{:04x}{:012x}",
        w.rng.next_u64(),
        w.rng.next_u64(),
        w.port,
        serial & 0xffff_ffff_ffff
    )
}

/// What [`dispatch`] made of a request.
#[derive(Debug, PartialEq)]
pub enum Opening {
    /// Answered at once (a refusal or a simulated failure), in `out`.
    Replied,
    /// A simulated hang: no answer.
    Hang,
    /// To be served by [`run`].
    Turn(Box<Turn>),
}

/// Answers `POST /v1/responses` past provider.rs's checks: a refusal or a fault at once, else
/// a [`Turn`] for [`run`].
pub fn dispatch(w: &Worker, body: &[u8], keep_alive: bool, out: &mut Vec<u8>) -> Opening {
    let mut reply = |status: u16, body: &[u8]| {
        put_response(out, status, JSON, body, keep_alive, &w.extra_headers);
        Opening::Replied
    };
    let ask = match parse(body) {
        Ok(a) => a,
        Err(r) => return reply(r.status, &r.body),
    };
    let truncate = match faults::draw(&w.faults.get(), &w.rng) {
        Fault::Fail { status } => {
            bump(&w.stats.failed, 1);
            let kind = if status == 429 { Some("rate_limit_exceeded") } else { Some("server_error") };
            return reply(status, &error_body("simulated worker failure", None, kind));
        }
        Fault::Hang => {
            bump(&w.stats.hung, 1);
            return Opening::Hang;
        }
        Fault::Truncate { after_tokens } => Some(after_tokens),
        Fault::None => None,
    };
    bump(&w.stats.inference, 1);
    let input_tokens = w.cache.borrow().tokens_for(ask.input_bytes);
    bump(&w.stats.prompt_tokens, input_tokens);
    let serial = w.next_id();
    let (id, msg_id) = (new_id(w, "resp_", serial), new_id(w, "msg_", serial));
    let created_at =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut turn = Turn::new(ask, id, msg_id, created_at, input_tokens);
    turn.truncate = truncate;
    Opening::Turn(Box::new(turn))
}

async fn sleep_until(deadline: Instant) {
    if deadline > Instant::now() {
        monoio::time::sleep_until(deadline).await;
    }
}

/// Serves `turn` on the timing model, as engine.rs serves a chat: admission, TTFT, one ITL per
/// token. Returns whether the connection may be reused.
pub async fn run(
    w: &Rc<Worker>,
    turn: Turn,
    stream: &mut TcpStream,
    s: &mut Scratch,
    keep_alive: bool,
) -> io::Result<bool> {
    let n = turn.output_tokens;
    let held = turn.input_tokens + n as u64;
    let permit = w.gate.admit(held).await;
    let admitted = Instant::now();
    bump(&w.stats.used_tokens, held);
    let t = w.timing.get();
    let sched = timing::schedule(&t, turn.input_tokens, w.running(), w.max_running);
    let result = if turn.ask.stream {
        stream_turn(w, &turn, sched, admitted, stream, s, keep_alive).await
    } else {
        if !sched.is_instant() {
            sleep_until(admitted + sched.done_after(n)).await;
        }
        s.events.clear();
        turn.put_body(&mut s.events);
        bump(&w.stats.output_tokens, n as u64);
        let cut = turn.truncate.is_some();
        put_head(&mut s.out, 200, JSON, Framing::Length(s.events.len()), keep_alive && !cut, &w.extra_headers);
        if cut {
            // Promise the whole length, deliver half, hang up.
            bump(&w.stats.truncated, 1);
            s.out.extend_from_slice(&s.events[..s.events.len() / 2]);
        } else {
            s.out.extend_from_slice(&s.events);
        }
        write_out(stream, &mut s.out).await.map(|()| keep_alive && !cut)
    };
    w.stats.used_tokens.set(w.stats.used_tokens.get() - held);
    drop(permit);
    if result.is_ok() {
        bump(&w.stats.completed, 1);
    }
    if w.reached_die_after() && !w.died.is_fired() {
        w.die();
        return Ok(false);
    }
    result
}

async fn stream_turn(
    w: &Worker,
    turn: &Turn,
    sched: timing::Schedule,
    admitted: Instant,
    stream: &mut TcpStream,
    s: &mut Scratch,
    keep_alive: bool,
) -> io::Result<bool> {
    let n = turn.output_tokens;
    let each = w.timing.get().write_each_event;
    let cut_after = turn.truncate.map(|after| after.unwrap_or(n / 2).min(n));
    put_head(
        &mut s.out,
        200,
        "text/event-stream",
        Framing::Chunked,
        keep_alive && cut_after.is_none(),
        &w.extra_headers,
    );
    s.events.clear();
    let mut seq = 0;
    // The opening events go out at admission, as OpenAI sends them before the first token.
    turn.put_opening(&mut s.events, &mut seq);
    if each {
        flush_events(&mut s.out, &mut s.events);
        write_out(stream, &mut s.out).await?;
    }
    if !stream_tokens(w, sched, admitted, stream, s, n, cut_after, |events, _, k| turn.put_delta(events, &mut seq, k))
        .await?
    {
        return Ok(false);
    }
    bump(&w.stats.output_tokens, n as u64);
    if cut_after == Some(n) {
        bump(&w.stats.truncated, 1);
        flush_events(&mut s.out, &mut s.events);
        write_out(stream, &mut s.out).await?;
        return Ok(false);
    }
    // OpenAI's Responses stream has no `data: [DONE]`.
    turn.put_closing(&mut s.events, &mut seq);
    flush_events(&mut s.out, &mut s.events);
    s.out.extend_from_slice(LAST_CHUNK);
    write_out(stream, &mut s.out).await?;
    Ok(keep_alive)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonic_rs::JsonContainerTrait;

    fn heard(body: &str) -> String {
        parse(body.as_bytes()).unwrap().heard
    }

    fn turn(body: &str) -> Turn {
        let ask = parse(body.as_bytes()).unwrap();
        let id = format!("resp_{}", "ab".repeat(24));
        let msg = format!("msg_{}", "cd".repeat(24));
        Turn::new(ask, id, msg, 1_700_000_000, 7)
    }

    fn refusal(body: &str) -> (u16, String) {
        let r = parse(body.as_bytes()).unwrap_err();
        (r.status, String::from_utf8(r.body).unwrap())
    }

    #[test]
    fn input_items_are_rendered_in_order() {
        assert_eq!(heard(r#"{"model":"m","input":"hi"}"#), "heard user:hi");
        let body = r#"{"model":"m","instructions":"be \"brief\"","input":[
            {"role":"user","content":"what is 2+2?"},
            {"type":"reasoning","id":"rs_1","summary":[]},
            {"type":"function_call","call_id":"c1","name":"add","arguments":"{\"a\":2,\"b\":2}"},
            {"type":"function_call_output","call_id":"c1","output":"4"},
            {"type":"message","role":"assistant","content":[{"type":"output_text","text":"It is "},{"type":"output_text","text":"4."}]},
            {"type":"message","role":"user","content":[{"type":"input_text","text":"thanks"}]},
            {"type":"web_search_call","id":"ws"}
        ]}"#;
        assert_eq!(
            heard(body),
            r#"heard instructions:be "brief" | user:what is 2+2? | call:add({"a":2,"b":2}) | tool:4 | assistant:It is 4. | user:thanks | item:web_search_call"#
        );
        assert_eq!(heard(r#"{"model":"m","input":[]}"#), "heard ");
    }

    #[test]
    fn nothing_is_kept() {
        let (status, body) = refusal(r#"{"model":"m","input":"x","previous_response_id":"resp_123"}"#);
        assert_eq!(status, 400);
        assert_eq!(
            body,
            r#"{"error":{"message":"Previous response with id 'resp_123' not found.","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}"#
        );
        for conv in [r#""conv_9""#, r#"{"id":"conv_9"}"#] {
            let (status, body) = refusal(&format!(r#"{{"model":"m","input":"x","conversation":{conv}}}"#));
            assert_eq!(status, 404);
            assert_eq!(
                body,
                r#"{"error":{"message":"Conversation with id 'conv_9' not found.","type":"invalid_request_error","param":null,"code":null}}"#
            );
        }
        // Empty or null: absent.
        assert!(parse(br#"{"model":"m","input":"x","previous_response_id":"","conversation":null}"#).is_ok());
    }

    #[test]
    fn malformed_requests_are_400s() {
        for body in ["", "[1]", "{\"model\":", "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":\"x\"}"] {
            let (status, text) = refusal(body);
            assert_eq!(status, 400, "{body}");
            assert!(text.contains("could not parse the JSON body"), "{text}");
        }
        let (status, text) = refusal(r#"{"model":"m"}"#);
        assert_eq!(status, 400);
        assert!(text.contains(r#""param":"input","code":"missing_required_parameter""#), "{text}");
        assert!(refusal(r#"{"input":"x"}"#).1.contains(r#""param":"model""#));
        assert!(refusal(r#"{"model":"m","input":5}"#).1.contains("invalid_type"));
        assert!(refusal(r#"{"model":"m","input":[{"type":"message","content":"x"}]}"#).1.contains("input[0].role"));
        assert!(refusal(r#"{"model":"m","input":["x"]}"#).1.contains("input[0]"));
        assert!(refusal(r#"{"model":"m","input":"x","stream":"yes"}"#).1.contains("'stream'"));
    }

    /// The top-level keys of a JSON object, in order.
    fn keys(json: &[u8]) -> Vec<String> {
        sonic_rs::to_object_iter(json).map(|e| e.unwrap().0.to_string()).collect()
    }

    const KEYS: [&str; 23] = [
        "id",
        "object",
        "created_at",
        "status",
        "error",
        "incomplete_details",
        "instructions",
        "max_output_tokens",
        "model",
        "output",
        "parallel_tool_calls",
        "previous_response_id",
        "reasoning",
        "store",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_p",
        "truncation",
        "usage",
        "user",
        "metadata",
    ];

    #[test]
    fn the_object_has_openais_keys_in_order() {
        let t = turn(r#"{"model":"gpt-4o","input":"hi","store":false,"temperature":0.5,"metadata":{"k":"v"}}"#);
        let mut b = Vec::new();
        t.put_body(&mut b);
        assert_eq!(keys(&b), KEYS);
        let v: sonic_rs::Value = sonic_rs::from_slice(&b).unwrap();
        assert_eq!(v["id"].as_str().unwrap().len(), 5 + 48);
        assert_eq!(v["status"].as_str(), Some("completed"));
        assert_eq!(v["model"].as_str(), Some("gpt-4o"));
        assert_eq!(v["store"].as_bool(), Some(false), "the provider says what it was asked");
        assert_eq!(v["temperature"].as_f64(), Some(0.5));
        assert_eq!(v["top_p"].as_f64(), Some(1.0));
        assert_eq!(v["metadata"]["k"].as_str(), Some("v"));
        assert_eq!(v["tool_choice"].as_str(), Some("auto"));
        assert_eq!(v["text"]["format"]["type"].as_str(), Some("text"));
        assert!(v["instructions"].is_null() && v["user"].is_null() && v["previous_response_id"].is_null());
        let item = &v["output"][0];
        assert_eq!(keys(item.to_string().as_bytes()), ["type", "id", "status", "role", "content"]);
        assert_eq!(item["content"][0]["text"].as_str(), Some("heard user:hi"));
        assert_eq!(item["content"][0]["annotations"].as_array().map(|a| a.len()), Some(0));
        let u = &v["usage"];
        assert_eq!((u["input_tokens"].as_u64(), u["output_tokens"].as_u64()), (Some(7), Some(2)));
        assert_eq!(u["total_tokens"].as_u64(), Some(9));
        assert_eq!(u["input_tokens_details"]["cached_tokens"].as_u64(), Some(0));
        // Defaults, and pretty-printed echoes on one line.
        let t = turn("{\"model\":\"m\",\"input\":\"hi\",\"tools\":[\n {\"type\":\"function\",\"name\":\"f\"}\n]}");
        let mut b = Vec::new();
        t.put_body(&mut b);
        assert!(!b.contains(&b'\n'));
        let v: sonic_rs::Value = sonic_rs::from_slice(&b).unwrap();
        assert_eq!(v["store"].as_bool(), Some(true));
        assert_eq!(v["parallel_tool_calls"].as_bool(), Some(true));
        assert_eq!(v["tools"][0]["name"].as_str(), Some("f"));
        assert_eq!(v["metadata"].as_object().map(|o| o.len()), Some(0));
    }

    #[test]
    fn max_output_tokens_cuts_the_text() {
        let t = turn(r#"{"model":"m","input":"one two three four","max_output_tokens":3}"#);
        assert!(t.incomplete);
        assert_eq!((t.text(), t.output_tokens), ("heard user:one two", 3));
        let mut b = Vec::new();
        t.put_body(&mut b);
        let v: sonic_rs::Value = sonic_rs::from_slice(&b).unwrap();
        assert_eq!(v["status"].as_str(), Some("incomplete"));
        assert_eq!(v["incomplete_details"]["reason"].as_str(), Some("max_output_tokens"));
        assert_eq!(v["max_output_tokens"].as_u64(), Some(3));
        assert_eq!(v["output"][0]["content"][0]["text"].as_str(), Some("heard user:one two"));
        assert_eq!(v["usage"]["output_tokens"].as_u64(), Some(3));
        let t = turn(r#"{"model":"m","input":"one two","max_output_tokens":3}"#);
        assert!(!t.incomplete && t.text() == "heard user:one two");
    }

    #[test]
    fn tokens_are_whitespace_led_words() {
        let text = "heard  user:a\nb | ü ";
        let ends = token_ends(text);
        let starts = std::iter::once(0).chain(ends.iter().copied());
        let words: Vec<&str> = starts.zip(ends.iter()).map(|(a, &b)| &text[a..b]).collect();
        assert_eq!(words, ["heard", "  user:a", "\nb", " |", " ü "]);
        assert!(token_ends("").is_empty());
        assert_eq!(token_ends("heard "), [6]);
        assert_eq!(token_ends(" "), [1]);
    }

    #[test]
    fn only_provider_workers_route_it() {
        use crate::sim::config::SimArgs;
        use crate::sim::routes::{dispatch as route, resolve, Action, Route};
        use clap::Parser;
        let args = SimArgs::parse_from(["smg-sim", "--ports", "1"]);
        let mut spec = args.worker_specs().unwrap().remove(0);
        let plain = Worker::new(&spec, 1);
        let keys = r#"{"sk":{"provider":"openai","models":["m"]}}"#;
        spec.providers = Some(std::sync::Arc::new(crate::sim::provider::ProviderKeys::parse(keys).unwrap()));
        let w = Worker::new(&spec, 1);
        let r = resolve("/v1/responses", w.runtime);
        assert_eq!(r, Route::Responses);
        let mut out = Vec::new();
        match route(&w, r, true, br#"{"model":"m","input":"hi"}"#, true, &mut out) {
            Action::Responses(t) => {
                assert_eq!((t.text(), t.input_tokens), ("heard user:hi", 1), "\"hi\" over 4 bytes a token");
                assert!(t.id.starts_with("resp_") && t.id.len() == 53 && t.msg_id.len() == 52, "{t:?}");
                assert!(t.id[5..].bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
            }
            other => panic!("{other:?}"),
        }
        let Action::Responses(again) = route(&w, r, true, br#"{"model":"m","input":"hi"}"#, true, &mut out) else {
            panic!()
        };
        assert!(out.is_empty() && again.text() == "heard user:hi");
        let body = br#"{"model":"m","input":"hi","previous_response_id":"resp_1"}"#;
        assert_eq!(route(&w, r, true, body, true, &mut out), Action::Reply { keep_alive: true });
        assert!(out.starts_with(b"HTTP/1.1 400") && out.ends_with(b"\"previous_response_not_found\"}}"));
        out.clear();
        route(&w, r, false, b"", true, &mut out);
        assert!(out.starts_with(b"HTTP/1.1 405"));
        out.clear();
        route(&plain, r, true, body, true, &mut out);
        assert!(out.starts_with(b"HTTP/1.1 404"), "not a provider: no such route");
    }

    /// Splits a stream into (event line's type, data JSON).
    fn events(b: &[u8]) -> Vec<(String, sonic_rs::Value)> {
        let text = std::str::from_utf8(b).unwrap();
        assert!(text.ends_with("\n\n") && !text.contains("[DONE]"));
        text.trim_end()
            .split("\n\n")
            .map(|e| {
                let (ev, data) = e.split_once('\n').unwrap();
                let ev = ev.strip_prefix("event: ").unwrap().to_string();
                (ev, sonic_rs::from_str(data.strip_prefix("data: ").unwrap()).unwrap())
            })
            .collect()
    }

    fn streamed(t: &Turn) -> Vec<(String, sonic_rs::Value)> {
        let (mut b, mut seq) = (Vec::new(), 0);
        t.put_opening(&mut b, &mut seq);
        for k in 0..t.output_tokens {
            t.put_delta(&mut b, &mut seq, k);
        }
        t.put_closing(&mut b, &mut seq);
        events(&b)
    }

    #[test]
    fn stream_events_are_numbered_and_deltas_make_the_text() {
        let t = turn(r#"{"model":"m","input":"tell me \"more\" please","stream":true}"#);
        let evs = streamed(&t);
        let kinds: Vec<&str> = evs.iter().map(|(k, _)| k.as_str()).collect();
        let mut want = vec![
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ];
        want.extend(std::iter::repeat_n("response.output_text.delta", t.output_tokens as usize));
        want.extend([
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]);
        assert_eq!(kinds, want);
        let mut text = String::new();
        for (i, (kind, v)) in evs.iter().enumerate() {
            assert_eq!(v["type"].as_str(), Some(kind.as_str()));
            assert_eq!(v["sequence_number"].as_u64(), Some(i as u64));
            assert_eq!(keys(v.to_string().as_bytes())[..2], ["type", "sequence_number"]);
            if kind == "response.output_text.delta" {
                assert_eq!((v["item_id"].as_str(), v["content_index"].as_u64()), (Some(t.msg_id.as_str()), Some(0)));
                text.push_str(v["delta"].as_str().unwrap());
            }
        }
        assert_eq!(text, r#"heard user:tell me "more" please"#);
        assert_eq!(text, t.text());
        let (created, done) = (&evs[0].1["response"], &evs.last().unwrap().1["response"]);
        assert_eq!(created["status"].as_str(), Some("in_progress"));
        assert!(created["usage"].is_null() && created["output"].as_array().unwrap().is_empty());
        assert_eq!(keys(created.to_string().as_bytes()), KEYS);
        assert_eq!((created["id"].as_str(), done["id"].as_str()), (Some(t.id.as_str()), Some(t.id.as_str())));
        assert_eq!(done["output"][0]["content"][0]["text"].as_str(), Some(text.as_str()));
        assert_eq!(evs[2].1["item"]["status"].as_str(), Some("in_progress"));
        assert_eq!(evs[3].1["part"]["text"].as_str(), Some(""));
        let n = evs.len();
        assert_eq!(evs[n - 4].1["text"].as_str(), Some(text.as_str()));
        assert_eq!(evs[n - 3].1["part"]["text"].as_str(), Some(text.as_str()));
        assert_eq!(evs[n - 2].1["item"]["status"].as_str(), Some("completed"));
        // Cut: the last event says so.
        let t = turn(r#"{"model":"m","input":"a b c","stream":true,"max_output_tokens":2}"#);
        let evs = streamed(&t);
        let last = &evs.last().unwrap().1;
        assert_eq!(last["type"].as_str(), Some("response.incomplete"));
        assert_eq!(last["response"]["output"][0]["content"][0]["text"].as_str(), Some("heard user:a"));
    }
}
