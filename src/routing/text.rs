//! What routing reads from a request body: the routing text or token ids, the prefix-cache
//! namespace (`lora_path`, `cache_salt`, `extra_key`) and the `rid`, in one pass.
//!
//! One top-level walk with sonic-rs' lazy object iterator: values of fields routing does not
//! need are skipped, not parsed, whatever the key order (the Node SDK may put `messages` first).

use sonic_rs::{JsonType, JsonValueTrait, LazyValue};

/// Which endpoint's body this is; each keeps its prompt under a different field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextSource {
    /// `/v1/chat/completions`: the text of `messages`, in order.
    Chat,
    /// `/v1/completions`: `prompt` (a string, strings, or token ids).
    Completion,
    /// SGLang `/generate`: `text`, or `input_ids` as tokens.
    Generate,
}

/// The prompt signal routing keys on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutingSignal {
    Text(String),
    Tokens(Vec<u32>),
}

/// Everything routing wants from a body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BodyFields {
    pub signal: Option<RoutingSignal>,
    /// See [`namespace`].
    pub namespace: Option<String>,
    /// The body `rid` (the first one when it is a list), unstripped.
    pub rid: Option<String>,
}

// Separates messages and prompts so `["ab","c"]` and `["a","bc"]` never look alike.
const PART_SEP: char = '\n';
// Separates the namespace fields; a control character no sane adapter name contains.
const NS_SEP: char = '\u{1f}';

/// Reads the routing signal, namespace and `rid` of a JSON body in one pass. `None` when the
/// body is not a JSON object (validation reports that; routing then falls back).
pub fn scan_body(kind: TextSource, body: &[u8]) -> Option<BodyFields> {
    let mut out = BodyFields::default();
    let (mut lora, mut salt, mut extra) = (None, None, None);
    for item in sonic_rs::to_object_iter(body) {
        let (key, value) = item.ok()?;
        match (kind, &*key) {
            (TextSource::Chat, "messages") => out.signal = chat_text(value).map(RoutingSignal::Text),
            // A token-id prompt counts even if "text" came first: it is what the engine sees.
            (TextSource::Completion, "prompt") | (TextSource::Generate, "text")
                if !matches!(out.signal, Some(RoutingSignal::Tokens(_))) =>
            {
                out.signal = prompt_signal(value);
            }
            (TextSource::Generate, "input_ids") => {
                if let Some(t) = token_ids(&value) {
                    out.signal = Some(RoutingSignal::Tokens(t));
                }
            }
            (_, "lora_path") => lora = raw_field(&value),
            (_, "cache_salt") => salt = raw_field(&value),
            (_, "extra_key") => extra = raw_field(&value),
            (_, "rid") => out.rid = first_string(value),
            _ => {}
        }
    }
    if lora.is_some() || salt.is_some() || extra.is_some() {
        let mut ns = String::new();
        for (tag, v) in [("l=", lora), ("s=", salt), ("k=", extra)] {
            if let Some(v) = v {
                ns.push_str(tag);
                ns.push_str(&v);
            }
            ns.push(NS_SEP);
        }
        out.namespace = Some(ns);
    }
    Some(out)
}

/// The routing text of a body: chat messages' text in order (string content and text parts),
/// the completion prompt, or `/generate` text. Token-id prompts are not text: see [`scan_body`].
pub fn routing_text(kind: TextSource, body: &[u8]) -> Option<String> {
    match scan_body(kind, body)?.signal? {
        RoutingSignal::Text(t) => Some(t),
        RoutingSignal::Tokens(_) => None,
    }
}

/// The prefix-cache namespace of a body: `lora_path`, `cache_salt` and `extra_key` combined, so
/// requests that differ in any of them never share a prefix in the cache-aware tree (the
/// engine keeps separate caches for them too). `None` when none is set.
pub fn namespace(body: &[u8]) -> Option<String> {
    scan_body(TextSource::Chat, body)?.namespace
}

/// The body `rid` (unstripped; see [`sticky_rid`](super::headers::sticky_rid)).
pub fn body_rid(body: &[u8]) -> Option<String> {
    scan_body(TextSource::Chat, body)?.rid
}

/// A string field as text; any other JSON value by its raw spelling (e.g. a list of adapters).
fn raw_field(v: &LazyValue<'_>) -> Option<String> {
    match v.get_type() {
        JsonType::Null => None,
        JsonType::String => v.as_str().map(str::to_owned),
        _ => Some(v.as_raw_str().to_owned()),
    }
}

/// A string, or the first string of a list (rerank's list of ids).
fn first_string(v: LazyValue<'_>) -> Option<String> {
    match v.get_type() {
        JsonType::String => v.as_str().map(str::to_owned),
        JsonType::Array => v.into_array_iter()?.filter_map(Result::ok).find_map(|e| e.as_str().map(str::to_owned)),
        _ => None,
    }
}

fn chat_text(messages: LazyValue<'_>) -> Option<String> {
    let mut text = String::with_capacity(messages.as_raw_str().len());
    for msg in messages.into_array_iter()? {
        let msg = msg.ok()?;
        let Some(fields) = msg.into_object_iter() else {
            continue;
        };
        for field in fields {
            let (k, v) = field.ok()?;
            if &*k != "content" {
                continue;
            }
            match v.get_type() {
                JsonType::String => text.push_str(v.as_str()?),
                JsonType::Array => {
                    for part in v.into_array_iter()? {
                        let part = part.ok()?;
                        // Text parts only: an image URL is not a prefix the engine caches as text.
                        if let Some(t) = part.get("text").as_str() {
                            text.push_str(t);
                        }
                    }
                }
                _ => {}
            }
        }
        text.push(PART_SEP);
    }
    (!text.is_empty()).then_some(text)
}

/// A completion `prompt` or `/generate` `text`: a string, a list of strings (joined), token ids,
/// or a list of token-id lists (the first one: each is its own engine request, and they
/// usually share their head).
fn prompt_signal(v: LazyValue<'_>) -> Option<RoutingSignal> {
    match v.get_type() {
        JsonType::String => Some(RoutingSignal::Text(v.as_str()?.to_owned())),
        JsonType::Array => {
            if let Some(t) = token_ids(&v) {
                return Some(RoutingSignal::Tokens(t));
            }
            let mut text = String::new();
            for item in v.into_array_iter()? {
                let item = item.ok()?;
                if let Some(s) = item.as_str() {
                    if !text.is_empty() {
                        text.push(PART_SEP);
                    }
                    text.push_str(s);
                }
            }
            (!text.is_empty()).then_some(RoutingSignal::Text(text))
        }
        _ => None,
    }
}

/// Token ids: `[1,2,3]`, or the first list of `[[1,2],[3]]`. Ids outside `u32` are not tokens.
fn token_ids(v: &LazyValue<'_>) -> Option<Vec<u32>> {
    let raw = v.as_raw_str();
    let mut items = sonic_rs::to_array_iter(raw).peekable();
    let first = items.peek()?.as_ref().ok()?;
    if first.get_type() == JsonType::Array {
        let first = items.next()?.ok()?;
        return token_ids(&first);
    }
    let mut out = Vec::with_capacity(raw.len() / 4);
    for item in items {
        let n = item.ok()?.as_u64()?;
        out.push(u32::try_from(n).ok()?);
    }
    (!out.is_empty()).then_some(out)
}
