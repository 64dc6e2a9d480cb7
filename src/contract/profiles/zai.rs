//! z.ai (GLM): thinking and effort rules, function-only tools, no `file_url`, vendor defaults.

use super::super::chat::{Chat, ThinkingType};
use super::super::error::ContractError;
use super::super::fields::Result;
use super::super::json::Kind;
use super::super::span::Edits;
use super::compare::segment_matches;

/// Models docs.z.ai gives `temperature` 1.0 / `top_p` 0.95 defaults.
const DEFAULTS_MARKERS: [&str; 5] = ["glm-5", "glm5", "glm_5", "glm-4.6", "glm-4.7"];
/// The GLM-5.3 series: thinking always on, efforts low/high/max.
const GLM53_MARKERS: [&str; 5] = ["glm-5.3", "glm5.3", "glm_5.3", "glm-5-3", "glm5-3"];
const GLM53_EFFORTS: [&str; 3] = ["low", "high", "max"];
const EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

pub fn is_glm53(model: &str) -> bool {
    segment_matches(model, &GLM53_MARKERS)
}

pub fn has_sampling_defaults(model: &str) -> bool {
    segment_matches(model, &DEFAULTS_MARKERS)
}

fn pinned(field: &str, allowed: &str) -> ContractError {
    ContractError::rule(format!("invalid {field}: only {allowed} is allowed for this model"))
}

pub fn validate(chat: &Chat<'_>, glm53: bool) -> Result<()> {
    if chat.thinking_type == Some(ThinkingType::Adaptive) {
        return Err(pinned("thinking.type", if glm53 { "enabled" } else { "enabled or disabled" }));
    }
    if glm53 && chat.thinking_type == Some(ThinkingType::Disabled) {
        return Err(ContractError::rule("thinking cannot be disabled for this model"));
    }
    let (allowed, hint): (&[&str], &str) = if glm53 {
        (&GLM53_EFFORTS, "low, high or max")
    } else {
        (&EFFORTS, "none, minimal, low, medium, high, xhigh or max")
    };
    // Both spellings are forwarded, so a bad one shadowed by the other still counts.
    for (field, effort) in
        [("thinking.effort", chat.thinking_effort_text()), ("reasoning_effort", chat.reasoning_effort_text())]
    {
        if effort.is_some_and(|e| !allowed.contains(&&*e)) {
            return Err(pinned(field, hint));
        }
    }
    if let Some(tool) = chat.tools.iter().find(|t| t.kind != "function") {
        return Err(ContractError::rule(format!("invalid tools[].type '{}': only 'function' is supported", tool.kind)));
    }
    let doc = &chat.doc;
    for m in &chat.messages {
        for part in m.parts(doc) {
            if doc.get(part, "type").is_some_and(|t| doc.kind(t) == Kind::String && doc.str_is(t, "file_url")) {
                return Err(ContractError::rule("file_url content blocks are not supported"));
            }
        }
    }
    Ok(())
}

/// `thinking.clear_thinking` → `chat_template_kwargs.clear_thinking` (an explicit kwarg wins),
/// `tool_stream` dropped, GLM sampling defaults for omitted fields.
pub fn rewrite(chat: &Chat<'_>, sampling_defaults: bool, edits: &mut Edits) {
    let doc = &chat.doc;
    if sampling_defaults {
        edits.default_member(doc, 0, "temperature", b"1.0");
        edits.default_member(doc, 0, "top_p", b"0.95");
    }
    if let Some(clear) = chat.clear_thinking {
        let raw = doc.raw(clear);
        match chat.chat_template_kwargs {
            Some(kw) if doc.get(kw, "clear_thinking").is_some() => {}
            Some(kw) => edits.insert_member(doc, kw, "clear_thinking", raw),
            None => {
                let mut obj = b"{\"clear_thinking\":".to_vec();
                obj.extend_from_slice(raw);
                obj.push(b'}');
                match doc.get(0, "chat_template_kwargs") {
                    Some(null) => edits.replace(doc, null, &obj),
                    None => edits.insert_member(doc, 0, "chat_template_kwargs", &obj),
                }
            }
        }
    }
    if let Some(key) = chat.tool_stream_key {
        edits.remove_member(doc, 0, key);
    }
}
