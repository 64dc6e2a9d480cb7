//! MiniMax: strict tool-call history (the `root` role move lives with the message rewrites).

use std::borrow::Cow;
use std::collections::HashSet;

use super::super::chat::Chat;
use super::super::error::ContractError;
use super::super::fields::Result;
use super::super::json::{self, Kind};
use super::super::messages::Role;

/// Every tool call is declared once, answered once by a `tool` message, and carries
/// arguments that are empty or a JSON object.
pub fn validate(chat: &Chat<'_>) -> Result<()> {
    let doc = &chat.doc;
    let mut seen: HashSet<Cow<'_, str>> = HashSet::new();
    let mut pending: HashSet<Cow<'_, str>> = HashSet::new();
    // Declaration order, so "no matching tool message" names the first unanswered call.
    let mut order: Vec<Cow<'_, str>> = Vec::new();
    for m in &chat.messages {
        match m.role {
            Role::Assistant => {
                let Some(calls) = m.tool_calls else { continue };
                for call in doc.elements(calls) {
                    let id = doc.get_some(call, "id").map(|v| doc.str(v)).unwrap_or(Cow::Borrowed(""));
                    if !seen.insert(id.clone()) {
                        return Err(ContractError::rule(format!("duplicate tool_call id '{id}'")));
                    }
                    check_arguments(chat, call, &id)?;
                    pending.insert(id.clone());
                    order.push(id);
                }
            }
            Role::Tool => {
                let id = m.tool_call_id.map(|v| doc.str(v)).unwrap_or(Cow::Borrowed(""));
                if !pending.remove(&id) {
                    return Err(ContractError::rule(format!("tool message references unknown tool_call id '{id}'")));
                }
            }
            _ => {}
        }
    }
    if let Some(id) = order.iter().find(|id| pending.contains(*id)) {
        return Err(ContractError::rule(format!("tool_call '{id}' has no matching tool message")));
    }
    Ok(())
}

/// Absent, blank, or a JSON object; anything else in the history is refused.
fn check_arguments(chat: &Chat<'_>, call: usize, id: &str) -> Result<()> {
    let doc = &chat.doc;
    let Some(args) = doc.get_some(call, "function").and_then(|f| doc.get_some(f, "arguments")) else {
        return Ok(());
    };
    let ok = match doc.kind(args) {
        Kind::Object => true,
        Kind::String => {
            let text = doc.str(args);
            let trimmed = text.trim();
            trimmed.is_empty() || json::parse(trimmed.as_bytes()).is_ok_and(|d| d.kind(0) == Kind::Object)
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(ContractError::rule(format!("tool_call '{id}' arguments must be empty or a JSON object")))
    }
}
