//! The request contract: validate a Chat Completions, Completions or Decisions body and plan its rewrites.
//!
//! Bodies are bytes, not objects (DESIGN.md): [`inspect`] scans the body once into a span tape
//! ([`json`]), applies SMG's field, cross-field and provider-profile rules, and returns the
//! routing fields plus a list of byte [`Splice`]s. A body that needs no rewrite yields no
//! splices and is forwarded without copying; otherwise [`apply`] builds the forwarded body,
//! keeping every untouched byte (key order, whitespace, number spellings) as sent.
//!
//! Flow: content type → scan (syntax, UTF-8, depth, duplicate keys) → typed reads (schema
//! mismatches are `json_parse_error`) → field rules → cross-field rules → profile rules
//! (chat only) → splices (alias, numeric `reasoning_effort`, profile defaults and rewrites).

mod chat;
mod completions;
pub mod decisions;
pub mod engine_fields;
mod error;
mod fields;
pub mod json;
mod messages;
mod profiles;
mod sampling;
pub mod span;
mod tools;

#[cfg(test)]
mod tests;

use std::collections::HashMap;

pub use error::ContractError;
pub use profiles::Profile;
pub use span::{apply, apply_into, Splice};

use span::Edits;

use crate::spare::Spare;

/// Which request schema a body is checked against.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Decisions,
}

/// `--model-alias alias=canonical` pairs (the flag is repeatable).
#[derive(Clone, Debug, Default)]
pub struct Aliases {
    map: HashMap<String, String>,
}

// === impl Aliases ===

impl Aliases {
    /// Parse `alias=canonical` pairs. An alias may be given twice only with the same target.
    pub fn parse<S: AsRef<str>>(pairs: &[S]) -> Result<Aliases, String> {
        let mut map = HashMap::new();
        for pair in pairs {
            let pair = pair.as_ref();
            let Some((alias, canonical)) = pair.split_once('=') else {
                return Err(format!("--model-alias expects alias=canonical, got '{pair}'"));
            };
            let (alias, canonical) = (alias.trim(), canonical.trim());
            if alias.is_empty() || canonical.is_empty() {
                return Err(format!("--model-alias expects alias=canonical, got '{pair}'"));
            }
            if alias == canonical {
                return Err(format!("--model-alias '{pair}' maps a name to itself"));
            }
            if let Some(prev) = map.insert(alias.to_string(), canonical.to_string()) {
                if prev != canonical {
                    return Err(format!("--model-alias '{alias}' is given twice ('{prev}' and '{canonical}')"));
                }
            }
        }
        Ok(Aliases { map })
    }

    /// The canonical model for `model`, when `model` is an alias.
    pub fn resolve(&self, model: &str) -> Option<&str> {
        self.map.get(model).map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// What the gateway needs from a valid body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspection {
    /// Canonical (alias-resolved) model id, used for routing.
    pub model: String,
    pub stream: bool,
    /// Most output tokens the request allows per choice (`max_completion_tokens`, else
    /// `max_tokens`), and its choices (`n`): a token budget's estimate reads them.
    pub max_output: Option<u32>,
    pub choices: u32,
    /// Sorted, non-overlapping; empty when the body is forwarded as received.
    pub edits: Vec<Splice>,
    /// Things worth one log line for this request (e.g. dropped foreign-profile fields).
    pub warnings: Vec<String>,
    /// The provider profile (chat; the OpenAI baseline elsewhere): gRPC replies follow its
    /// stream format.
    pub profile: Profile,
}

/// Validate `body` for `endpoint` and plan its rewrites.
pub fn inspect(
    endpoint: Endpoint,
    body: &[u8],
    content_type_is_json: bool,
    aliases: &Aliases,
) -> Result<Inspection, ContractError> {
    if !content_type_is_json {
        return Err(ContractError::JsonParse("Missing Content-Type: application/json header".into()));
    }
    let doc = json::parse(body).map_err(|e| {
        ContractError::JsonParse(format!(
            "JSON syntax error: Failed to parse the request body as JSON: {}",
            e.describe(body)
        ))
    })?;
    match endpoint {
        Endpoint::ChatCompletions => inspect_chat(doc, aliases),
        Endpoint::Completions => inspect_completion(doc, aliases),
        Endpoint::Decisions => inspect_decision(doc, aliases),
    }
}

fn inspect_chat(doc: json::Doc<'_>, aliases: &Aliases) -> Result<Inspection, ContractError> {
    let mut chat = chat::read(doc)?;
    // Selection reads the model as sent, before alias resolution.
    let profile = Profile::select(&chat.model_name);
    chat.scan_messages(profile.is_kimi())?;
    chat.check_fields()?;
    let declared = profile.declared_tools(&chat);
    if declared.is_empty() {
        chat.check_cross(&chat.tools)?;
    } else {
        let mut all = profile.declared_tools(&chat);
        all.splice(0..0, chat.tools.iter().map(|t| tools::Tool { kind: t.kind.clone(), name: t.name.clone() }));
        chat.check_cross(&all)?;
    }
    profile.validate(&chat)?;

    let mut edits = Edits::default();
    let mut warnings = Vec::new();
    let model = resolve_model(&chat.doc, chat.model, &chat.model_name, aliases, &mut edits);
    if let Some(v) = chat.reasoning_effort.filter(|&v| chat.doc.kind(v) == json::Kind::Number) {
        edits.replace_with_string(&chat.doc, v, &chat::decimal(&chat.doc, v));
    }
    profile.rewrite(&chat, &mut edits, &mut warnings);
    Ok(Inspection {
        model,
        stream: chat.s.stream,
        max_output: chat.max_completion_tokens.or(chat.max_tokens),
        choices: chat.s.n.unwrap_or(1).max(1),
        edits: edits.finish(),
        warnings,
        profile,
    })
}

fn inspect_completion(doc: json::Doc<'_>, aliases: &Aliases) -> Result<Inspection, ContractError> {
    let c = completions::read(doc)?;
    let mut edits = Edits::default();
    let name = c.doc.str(c.model);
    let model = resolve_model(&c.doc, c.model, &name, aliases, &mut edits);
    Ok(Inspection {
        model,
        stream: c.s.stream,
        max_output: c.max_tokens,
        choices: c.s.n.unwrap_or(1).max(1),
        edits: edits.finish(),
        warnings: Vec::new(),
        profile: Profile::OpenAi,
    })
}

/// Decisions: schema and limits only; the body is forwarded as sent (an alias spliced).
fn inspect_decision(doc: json::Doc<'_>, aliases: &Aliases) -> Result<Inspection, ContractError> {
    let d = decisions::read(doc)?;
    let mut edits = Edits::default();
    let name = d.doc.str(d.model);
    let model = resolve_model(&d.doc, d.model, &name, aliases, &mut edits);
    Ok(Inspection {
        model,
        stream: false,
        max_output: None,
        choices: 1,
        edits: edits.finish(),
        warnings: Vec::new(),
        profile: Profile::OpenAi,
    })
}

thread_local! {
    /// Model names' buffers, kept from one request to the next (crate::spare).
    static MODEL_NAMES: Spare<u8> = const { Spare::new(256) };
}

/// `name` in a buffer a finished request gave back.
fn model_name(name: &str) -> String {
    let mut s = String::from_utf8(MODEL_NAMES.with(|m| m.take(name.len()))).unwrap_or_default();
    s.push_str(name);
    s
}

/// Keeps a model name's buffer for the next request's.
pub fn give_back_model_name(name: String) {
    MODEL_NAMES.with(|m| m.give(name.into_bytes()));
}

/// The canonical model; an alias also gets a splice over the `model` string token.
fn resolve_model(doc: &json::Doc<'_>, v: usize, name: &str, aliases: &Aliases, edits: &mut Edits) -> String {
    match aliases.resolve(name) {
        Some(canonical) => {
            edits.replace_with_string(doc, v, canonical);
            model_name(canonical)
        }
        None => model_name(name),
    }
}
