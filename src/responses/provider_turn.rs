//! A Responses turn on a cloud provider that keeps no state for the gateway (OpenAI's and
//! xAI's Responses API, asked with `store: false`), sans I/O. The gateway keeps the history,
//! as it does for gRPC workers, and the provider is sent it whole each turn, as SMG does:
//!
//! - the body the provider gets is the client's, by splices: `input` becomes the stored
//!   history (the chain of `previous_response_id`, or the conversation's items) and then this
//!   turn's input; `previous_response_id` and `conversation` go; `store` is `false`. Reasoning
//!   items are left out of what is sent (without the provider's own record of them, it refuses
//!   them; SMG leaves them out too);
//! - the provider's response object (its body, or the `response` of a stream's
//!   `response.*` events) is patched to say what the client asked and the gateway kept:
//!   `previous_response_id`, `conversation`, and `store` (true only once it is stored);
//! - the writes keep the response under the provider's id, with this turn's input items and
//!   the provider's output items, and append both to the conversation.

use super::store::{Item, Op, StoredResponse};
use super::turn::Turn;
use crate::contract::json::{parse, Doc, Kind};
use crate::contract::span::{apply, Edits};

/// What the gateway keeps of a turn sent to a provider.
#[derive(Debug)]
pub(crate) struct ProviderTurn {
    /// This turn's input items, stored shape (ids given), as JSON text.
    pub input: Vec<String>,
    /// The history the turn follows, oldest first, as JSON text.
    pub prior: Vec<String>,
    pub previous: Option<String>,
    pub conversation: Option<String>,
    /// `store` asked for, and a backend that stores.
    pub store: bool,
    pub stream: bool,
    pub tenant: Option<String>,
    pub context: Vec<(String, String)>,
}

/// A top-level string member of a JSON object's text. The contract's scanner, not sonic-rs's
/// lazy (recursive) skip: a provider's answer is outside JSON, nested as deep as it likes.
fn member(text: &[u8], key: &str) -> Option<String> {
    let doc = parse(text).ok()?;
    doc.get(0, key).filter(|&v| doc.kind(v) == Kind::String).map(|v| doc.str(v).into_owned())
}

/// The `type` of an item's JSON text.
fn item_type(text: &str) -> Option<String> {
    member(text.as_bytes(), "type")
}

/// An item sent to the provider (reasoning is not: see the module doc).
fn sent(text: &&String) -> bool {
    item_type(text).as_deref() != Some("reasoning")
}

/// Gives `key` in object `obj` the value `raw`: replaced, or added.
fn set(doc: &Doc<'_>, obj: usize, key: &str, raw: &[u8], edits: &mut Edits) {
    match doc.get(obj, key) {
        Some(v) => edits.replace(doc, v, raw),
        None => edits.insert_member(doc, obj, key, raw),
    }
}

/// Bytes of the provider's answer as text (it is UTF-8 unless the provider is broken).
fn text(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(b).into_owned(),
    }
}

fn json_str(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len() + 2);
    smg_wire::json::put_str(&mut out, s);
    out
}

/// The `type` of an SSE event's JSON, and where that JSON is in the event.
fn event_data(event: &[u8]) -> Option<(usize, usize)> {
    let mut at = 0;
    for line in event.split(|&b| b == b'\n') {
        let start = at;
        at += line.len() + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(data) = line.strip_prefix(b"data:") {
            let skip = usize::from(data.first() == Some(&b' '));
            let from = start + 5 + skip;
            return Some((from, start + line.len()));
        }
    }
    None
}

/// A stream's event that ends the response, and whether what it ends is worth keeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ends {
    /// `response.completed` or `response.incomplete`: kept.
    Kept,
    /// `response.failed` (or `error`): not kept.
    Failed,
}

// === impl ProviderTurn ===

impl ProviderTurn {
    /// What the gateway keeps of `turn`, which follows `prior`.
    pub(crate) fn new(turn: &Turn, prior: Vec<String>, tenant: Option<String>, context: Vec<(String, String)>) -> Self {
        ProviderTurn {
            input: turn.input_text.clone(),
            prior,
            previous: turn.previous.clone(),
            conversation: turn.conversation.clone(),
            store: turn.store,
            stream: turn.stream,
            tenant,
            context,
        }
    }

    /// The body the provider is sent: the client's `body`, spliced (see the module doc).
    pub(crate) fn body(&self, body: &[u8]) -> Vec<u8> {
        let Ok(doc) = parse(body) else { return body.to_vec() };
        if doc.kind(0) != Kind::Object {
            return body.to_vec();
        }
        let mut edits = Edits::default();
        let history = self.previous.is_some() || self.conversation.is_some();
        let reasoning_sent = self.input.iter().any(|i| !sent(&i));
        for (k, v) in doc.members(0) {
            let named = |name: &str| doc.str_is(k, name);
            if named("input") && (history || reasoning_sent) {
                let mut items =
                    Vec::with_capacity(2 + self.prior.iter().chain(&self.input).map(String::len).sum::<usize>());
                items.push(b'[');
                for (i, item) in self.prior.iter().chain(&self.input).filter(sent).enumerate() {
                    if i > 0 {
                        items.push(b',');
                    }
                    items.extend_from_slice(item.as_bytes());
                }
                items.push(b']');
                edits.replace(&doc, v, &items);
            } else if (named("previous_response_id") || named("conversation")) && !doc.is_null(v) {
                // At most one of the two (a turn naming both was refused).
                edits.remove_member(&doc, 0, k);
            }
        }
        set(&doc, 0, "store", b"false", &mut edits);
        apply(body, &edits.finish())
    }

    /// The provider's response `object` (its JSON), patched: `stored` says whether the
    /// gateway kept it.
    pub(crate) fn patched(&self, object: &[u8], stored: bool) -> Vec<u8> {
        let Ok(doc) = parse(object) else { return object.to_vec() };
        let mut edits = Edits::default();
        self.patch(&doc, 0, stored, &mut edits);
        apply(object, &edits.finish())
    }

    fn patch(&self, doc: &Doc<'_>, obj: usize, stored: bool, edits: &mut Edits) {
        if doc.kind(obj) != Kind::Object {
            return;
        }
        if let Some(p) = &self.previous {
            set(doc, obj, "previous_response_id", &json_str(p), edits);
        }
        if let Some(c) = &self.conversation {
            let mut raw = b"{\"id\":".to_vec();
            raw.extend_from_slice(&json_str(c));
            raw.push(b'}');
            set(doc, obj, "conversation", &raw, edits);
        }
        set(doc, obj, "store", if stored { b"true" } else { b"false" }, edits);
    }

    /// Whether a stream's `event` ends the response. Most events (the deltas) name none of
    /// the ending types anywhere, and are not parsed.
    pub(crate) fn ends(event: &[u8]) -> Option<Ends> {
        let (from, to) = event_data(event)?;
        let data = &event[from..to];
        let names = |t: &str| memchr::memmem::find(data, t.as_bytes()).is_some();
        if !["response.completed", "response.incomplete", "response.failed", "error"].iter().any(|t| names(t)) {
            return None;
        }
        match member(data, "type")?.as_str() {
            "response.completed" | "response.incomplete" => Some(Ends::Kept),
            "response.failed" | "error" => Some(Ends::Failed),
            _ => None,
        }
    }

    /// Where the response object an `event` carries is (`response.created`, `.completed`, …).
    pub(crate) fn event_object(event: &[u8]) -> Option<std::ops::Range<usize>> {
        let (from, to) = event_data(event)?;
        let data = &event[from..to];
        // Deltas carry no response object: not parsed.
        memchr::memmem::find(data, b"\"response\"")?;
        let doc = parse(data).ok()?;
        let r = doc.get(0, "response").filter(|&r| doc.kind(r) == Kind::Object)?;
        let n = doc.node(r);
        Some(from + n.start as usize..from + n.end as usize)
    }

    /// `event` as the client gets it, into `out`: the response object it carries patched
    /// (`stored`: whether the gateway kept it); any other event as it came.
    pub(crate) fn patch_event(&self, event: &[u8], stored: bool, out: &mut Vec<u8>) {
        match Self::event_object(event) {
            Some(r) => {
                out.extend_from_slice(&event[..r.start]);
                out.extend_from_slice(&self.patched(&event[r.clone()], stored));
                out.extend_from_slice(&event[r.end..]);
            }
            None => out.extend_from_slice(event),
        }
    }

    /// The provider's response `object` read once: patched as it is kept (`store` as
    /// asked), the writes that keep it, and the usage it reports.
    pub(crate) fn answer(&self, object: &[u8]) -> Answer {
        let Ok(doc) = parse(object) else { return Answer { text: object.to_vec(), ops: None, usage: (0, 0) } };
        let mut edits = Edits::default();
        self.patch(&doc, 0, self.store, &mut edits);
        let text = apply(object, &edits.finish());
        let ops = self.writes(&doc, &text);
        let usage = match doc.get_some(0, "usage") {
            Some(u) => {
                let n = |k: &str| {
                    doc.get_some(u, k).filter(|&v| doc.kind(v) == Kind::Number).map_or(0, |v| doc.number(v) as u64)
                };
                (n("input_tokens"), n("output_tokens"))
            }
            None => (0, 0),
        };
        Answer { text, ops, usage }
    }

    /// The writes that keep the provider's response (read as `doc`; `kept` as it is stored):
    /// the response under its id, and the turn's input and output items appended to its
    /// conversation. None: the object names no id. What is stored is read again by recursive
    /// parsers (a later turn's history, GET); the contract's scanner that read `doc` refused
    /// anything nested past `MAX_DEPTH`.
    fn writes(&self, doc: &Doc<'_>, kept: &[u8]) -> Option<Vec<Op>> {
        let id = doc.get_some(0, "id").filter(|&v| doc.kind(v) == Kind::String)?;
        let created_at = doc.get_some(0, "created_at").map_or(0, |v| doc.number(v) as u64);
        let output: Vec<String> = match doc.get_some(0, "output") {
            Some(o) if doc.kind(o) == Kind::Array => doc.elements(o).map(|e| text(doc.raw(e))).collect(),
            _ => Vec::new(),
        };
        let mut ops = Vec::with_capacity(2);
        let items = self.conversation.as_ref().map(|c| (c, output.clone()));
        if self.store {
            ops.push(Op::PutResponse(Box::new(StoredResponse {
                id: doc.str(id).into_owned(),
                tenant: self.tenant.clone(),
                previous: self.previous.clone(),
                conversation: self.conversation.clone(),
                created_at,
                input: self.input.clone(),
                output,
                body: text(kept),
                context: self.context.clone(),
            })));
        }
        if let Some((c, output)) = items {
            let item = |json: String| Item { id: member(json.as_bytes(), "id").unwrap_or_default(), json, created_at };
            let items = self.input.iter().cloned().chain(output).map(item).collect();
            ops.push(Op::AppendItems { conversation: c.clone(), items });
        }
        Some(ops)
    }
}

/// The provider's response, read ([`ProviderTurn::answer`]).
#[derive(Debug)]
pub(crate) struct Answer {
    /// The object as kept: the client's answer when it is stored as asked.
    pub text: Vec<u8>,
    /// None: not to be kept (see [`ProviderTurn::answer`]).
    pub ops: Option<Vec<Op>>,
    /// (input, output) tokens.
    pub usage: (u64, u64),
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};

    fn turn(body: &str, prior: &[&str]) -> ProviderTurn {
        let t = Turn::read(body.as_bytes()).unwrap();
        ProviderTurn::new(&t, prior.iter().map(|s| s.to_string()).collect(), None, Vec::new())
    }

    const USER: &str = r#"{"type":"message","id":"msg_1","status":"completed","role":"user","content":[{"type":"input_text","text":"q"}]}"#;
    const THOUGHT: &str = r#"{"type":"reasoning","id":"rs_1","summary":[]}"#;
    const ANSWER: &str = r#"{"type":"message","id":"msg_2","status":"completed","role":"assistant","content":[{"type":"output_text","text":"a"}]}"#;

    #[test]
    fn the_provider_is_sent_the_history_then_the_input_and_store_false() {
        let body = r#"{"model":"gpt", "input":"again","previous_response_id":"resp_1", "temperature":0.5}"#;
        let t = turn(body, &[USER, THOUGHT, ANSWER]);
        let sent: Value = sonic_rs::from_slice(&t.body(body.as_bytes())).unwrap();
        let input = sent["input"].as_array().unwrap();
        let types: Vec<_> = input.iter().map(|i| i["id"].as_str().unwrap()[..4].to_string()).collect();
        assert_eq!(types, ["msg_", "msg_", "msg_"], "reasoning left out: {sent:?}");
        assert_eq!(input[2]["content"][0]["text"].as_str(), Some("again"));
        assert!(sent.get("previous_response_id").is_none());
        assert_eq!(sent["store"].as_bool(), Some(false));
        // Everything else as the client wrote it.
        assert_eq!(sent["temperature"].as_f64(), Some(0.5));
        let text = String::from_utf8(t.body(body.as_bytes())).unwrap();
        assert!(text.starts_with(r#"{"model":"gpt", "input":["#), "{text}");
    }

    #[test]
    fn a_turn_without_history_is_sent_as_written_but_for_store() {
        let body = r#"{"model":"gpt","input":"hi","store":true,"conversation":null}"#;
        let t = turn(body, &[]);
        assert_eq!(t.body(body.as_bytes()), br#"{"model":"gpt","input":"hi","store":false,"conversation":null}"#);
        let body = r#"{"model":"gpt","input":"hi"}"#;
        assert_eq!(turn(body, &[]).body(body.as_bytes()), br#"{"model":"gpt","input":"hi","store":false}"#);
    }

    #[test]
    fn a_conversation_turn_drops_the_conversation_and_sends_its_items() {
        let body = r#"{"conversation":{"id":"conv_1"},"model":"gpt","input":[{"role":"user","content":"x"}]}"#;
        let t = turn(body, &[USER, ANSWER]);
        let sent: Value = sonic_rs::from_slice(&t.body(body.as_bytes())).unwrap();
        assert!(sent.get("conversation").is_none(), "{sent:?}");
        assert_eq!(sent["input"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn the_answer_says_what_the_client_asked_and_whether_it_was_kept() {
        let t = turn(r#"{"model":"gpt","input":"again","previous_response_id":"resp_1"}"#, &[USER, ANSWER]);
        let object = br#"{"id":"resp_2","object":"response","created_at":7,"previous_response_id":null,"store":false,"output":[{"type":"message","id":"msg_9"}],"usage":{"input_tokens":5,"output_tokens":2}}"#;
        let kept: Value = sonic_rs::from_slice(&t.patched(object, true)).unwrap();
        assert_eq!(kept["previous_response_id"].as_str(), Some("resp_1"));
        assert_eq!(kept["store"].as_bool(), Some(true));
        let unkept: Value = sonic_rs::from_slice(&t.patched(object, false)).unwrap();
        assert_eq!(unkept["store"].as_bool(), Some(false));
        let answer = t.answer(object);
        assert_eq!(answer.usage, (5, 2));
        assert_eq!(answer.text, t.patched(object, true));
        let deep = format!(r#"{{"id":"resp_3","output":[{}{}]}}"#, "[".repeat(200), "]".repeat(200));
        assert!(t.answer(deep.as_bytes()).ops.is_none(), "too deep to keep");
        let ops = answer.ops.unwrap();
        let [Op::PutResponse(r)] = &ops[..] else { panic!("{ops:?}") };
        assert_eq!((r.id.as_str(), r.created_at, r.previous.as_deref()), ("resp_2", 7, Some("resp_1")));
        assert_eq!(r.output, [r#"{"type":"message","id":"msg_9"}"#]);
        assert_eq!(r.input, t.input);
    }

    #[test]
    fn a_conversation_turn_appends_its_input_and_output() {
        let t = turn(r#"{"model":"gpt","input":"x","conversation":"conv_1","store":false}"#, &[]);
        let object = br#"{"id":"resp_2","created_at":7,"output":[{"type":"message","id":"msg_9"}]}"#;
        let patched: Value = sonic_rs::from_slice(&t.patched(object, false)).unwrap();
        assert_eq!(patched["conversation"]["id"].as_str(), Some("conv_1"));
        let ops = t.answer(object).ops.unwrap();
        let [Op::AppendItems { conversation, items }] = &ops[..] else { panic!("{ops:?}") };
        assert_eq!(conversation, "conv_1");
        let ids: Vec<_> = items.iter().map(|i| i.id.as_str()).collect();
        assert!(ids[0].starts_with("msg_") && ids[1] == "msg_9", "{ids:?}");
    }

    #[test]
    fn stream_events_are_patched_and_the_last_one_found() {
        let t = turn(r#"{"model":"gpt","input":"x","previous_response_id":"resp_1","stream":true}"#, &[]);
        let created = b"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_2\",\"store\":false,\"previous_response_id\":null}}\n\n";
        let mut out = Vec::new();
        t.patch_event(created, true, &mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("event: response.created\ndata: {") && text.ends_with("}}\n\n"), "{text}");
        assert!(text.contains(r#""store":true"#) && text.contains(r#""previous_response_id":"resp_1""#), "{text}");
        assert_eq!(ProviderTurn::ends(created), None);
        let delta = b"event: response.output_text.delta\r\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\r\n\r\n";
        let mut out = Vec::new();
        t.patch_event(delta, true, &mut out);
        assert_eq!(out, delta);
        let done = b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_2\",\"output\":[]}}\n\n";
        assert_eq!(ProviderTurn::ends(done), Some(Ends::Kept));
        let r = ProviderTurn::event_object(done).unwrap();
        assert_eq!(&done[r], br#"{"id":"resp_2","output":[]}"#);
        let failed = b"event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{}}\n\n";
        assert_eq!(ProviderTurn::ends(failed), Some(Ends::Failed));
    }
}
