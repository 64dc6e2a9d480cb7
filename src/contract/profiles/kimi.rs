//! Kimi / Moonshot: message-declared tools, stream usage by default, and the K3 contract.

use std::collections::HashSet;

use super::super::chat::{Chat, ThinkingType};
use super::super::error::ContractError;
use super::super::fields::Result;
use super::super::json::Kind;
use super::super::messages::Role;
use super::super::span::Edits;
use super::super::tools::{tool_shape, Tool};
use super::compare::{approx_eq, starts_with_ci};

/// Tool names longer than this are rejected.
const MAX_TOOL_NAME_LEN: usize = 256;

/// K3 sampling values the contract accepts.
const K3_TEMPERATURES: [f32; 3] = [0.0, 0.6, 1.0];
const K3_TOP_P: f32 = 0.95;
const K3_EFFORTS: [&str; 3] = ["low", "high", "max"];

pub fn is_k3(model: &str) -> bool {
    model.split('/').any(|s| starts_with_ci(s, "kimi-k3") || starts_with_ci(s, "kimi_k3"))
}

/// Well-formed tools declared on system and developer messages, in message order; malformed
/// declarations are [`validate`]'s business and are skipped here.
pub fn declared_tools<'a>(chat: &Chat<'a>) -> Vec<Tool<'a>> {
    let doc = &chat.doc;
    let mut out = Vec::new();
    for m in &chat.messages {
        if !matches!(m.role, Role::System | Role::Developer) {
            continue;
        }
        let Some(arr) = m.tools(doc).filter(|&t| doc.kind(t) == Kind::Array) else {
            continue;
        };
        let parsed: std::result::Result<Vec<_>, _> = doc.elements(arr).map(|t| tool_shape(doc, t)).collect();
        if let Ok(tools) = parsed {
            out.extend(tools);
        }
    }
    out
}

pub fn validate(chat: &Chat<'_>, k3: bool) -> Result<()> {
    if k3 {
        validate_sampling(chat)?;
        validate_thinking(chat)?;
    }
    validate_message_tools(chat)
}

fn pinned(field: &str, allowed: &str) -> ContractError {
    ContractError::rule(format!("invalid {field}: only {allowed} is allowed for this model"))
}

fn validate_sampling(chat: &Chat<'_>) -> Result<()> {
    let s = &chat.s;
    if s.temperature.is_some_and(|t| !K3_TEMPERATURES.iter().any(|&a| approx_eq(t, a))) {
        return Err(pinned("temperature", "0, 0.6 or 1"));
    }
    if s.top_p.is_some_and(|p| !approx_eq(p, K3_TOP_P)) {
        return Err(pinned("top_p", "0.95"));
    }
    if s.presence_penalty.is_some_and(|p| !approx_eq(p, 0.0)) {
        return Err(pinned("presence_penalty", "0"));
    }
    if s.frequency_penalty.is_some_and(|p| !approx_eq(p, 0.0)) {
        return Err(pinned("frequency_penalty", "0"));
    }
    if s.n.is_some_and(|n| n != 1) {
        return Err(pinned("n", "1"));
    }
    Ok(())
}

fn validate_thinking(chat: &Chat<'_>) -> Result<()> {
    if chat.thinking_type == Some(ThinkingType::Adaptive) {
        return Err(pinned("thinking.type", "enabled or disabled"));
    }
    if chat.thinking_effort_text().is_some_and(|e| !K3_EFFORTS.contains(&&*e)) {
        return Err(pinned("thinking.effort", "low, high or max"));
    }
    Ok(())
}

fn on_role(role: Role, rule: &str) -> ContractError {
    ContractError::rule(format!("'tools' on a message with role '{}' {rule}", role.name()))
}

/// `[A-Za-z_][A-Za-z0-9_]*`, at most [`MAX_TOOL_NAME_LEN`] bytes.
fn valid_tool_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    name.len() <= MAX_TOOL_NAME_LEN
        && bytes.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && bytes.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Message `tools`: refused on user/assistant; on system/developer a list of unique `function`
/// tools with identifier names, on a message without content.
fn validate_message_tools(chat: &Chat<'_>) -> Result<()> {
    let doc = &chat.doc;
    let mut seen: HashSet<String> = chat.tools.iter().map(|t| t.name.to_string()).collect();
    for (i, m) in chat.messages.iter().enumerate() {
        let Some(tools) = m.tools(doc) else { continue };
        match m.role {
            Role::User | Role::Assistant => return Err(on_role(m.role, "is not allowed")),
            Role::System | Role::Developer => {}
            _ => continue,
        }
        let malformed = || on_role(m.role, "must be a list of tool declarations");
        if doc.kind(tools) != Kind::Array {
            return Err(malformed());
        }
        let mut declared = Vec::new();
        for t in doc.elements(tools) {
            declared.push(tool_shape(doc, t).map_err(|_| malformed())?);
        }
        // An empty list renders as a plain system message, so its content stays legal.
        if declared.is_empty() {
            continue;
        }
        let has_content = m.content.is_some_and(|c| {
            let n = doc.node(c);
            match n.kind {
                Kind::String => n.end - n.start > 2,
                Kind::Array => n.next as usize > c + 1,
                _ => true,
            }
        });
        if has_content {
            return Err(on_role(m.role, "requires empty content"));
        }
        for (j, tool) in declared.iter().enumerate() {
            let at = format!("messages[{i}].tools[{j}]");
            if tool.kind != "function" {
                return Err(ContractError::rule(format!("{at}: tool type must be 'function'")));
            }
            if !valid_tool_name(&tool.name) {
                return Err(ContractError::rule(format!(
                    "{at}: tool name must match [A-Za-z_][A-Za-z0-9_]* and be at most {MAX_TOOL_NAME_LEN} characters"
                )));
            }
            if !seen.insert(tool.name.to_string()) {
                return Err(ContractError::rule(format!("{at}: duplicate tool name '{}'", tool.name)));
            }
        }
    }
    Ok(())
}

/// Streams get `stream_options.include_usage: true` unless set; K3 gets its contract
/// sampling values for omitted fields.
pub fn rewrite(chat: &Chat<'_>, k3: bool, edits: &mut Edits) {
    let doc = &chat.doc;
    if chat.s.stream {
        match chat.s.stream_options {
            Some(obj) => edits.default_member(doc, obj, "include_usage", b"true"),
            None => match doc.get(0, "stream_options") {
                Some(null) => edits.replace(doc, null, b"{\"include_usage\":true}"),
                None => edits.insert_member(doc, 0, "stream_options", b"{\"include_usage\":true}"),
            },
        }
    }
    if k3 {
        for (key, value) in [
            ("temperature", &b"1.0"[..]),
            ("top_p", b"0.95"),
            ("presence_penalty", b"0"),
            ("frequency_penalty", b"0"),
            ("n", b"1"),
        ] {
            edits.default_member(doc, 0, key, value);
        }
    }
}
