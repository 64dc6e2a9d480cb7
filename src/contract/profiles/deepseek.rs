//! DeepSeek V4 / V4.1: effort vocabulary and mapping, thinking on by default, and no forced
//! tool choice while thinking.

use super::super::chat::{Chat, ThinkingType};
use super::super::error::ContractError;
use super::super::fields::Result;
use super::super::json::Kind;
use super::super::span::Edits;

const MODELS: [&str; 4] = ["deepseek-flash", "deepseek-v4-flash", "deepseek-v4-pro", "deepseek-v4.1-flash"];
const V41: &str = "deepseek-v4.1-flash";
const EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

pub fn matches_segment(segment: &str) -> bool {
    MODELS.iter().any(|m| segment.eq_ignore_ascii_case(m))
}

pub fn is_v41(model: &str) -> bool {
    model.split('/').any(|s| s.eq_ignore_ascii_case(V41))
}

/// The effort the renderer receives: `minimal` → `low`, `medium` → `high`, and on V4 (not
/// V4.1, which has its own budget) `xhigh` → `high`.
fn mapped(effort: &str, v41: bool) -> Option<&'static str> {
    match effort {
        "minimal" => Some("low"),
        "medium" => Some("high"),
        "xhigh" if !v41 => Some("high"),
        _ => None,
    }
}

/// Template overrides first, then `thinking.type`, then the effective effort; on by default.
fn thinking_enabled(chat: &Chat<'_>, v41: bool) -> bool {
    let doc = &chat.doc;
    let kw = |key: &str| chat.chat_template_kwargs.and_then(|k| doc.get_some(k, key));
    let as_bool = |v: usize| (doc.kind(v) == Kind::Bool).then(|| doc.node(v).flag);
    if let Some(b) = kw("thinking").and_then(as_bool).or_else(|| kw("enable_thinking").and_then(as_bool)) {
        return b;
    }
    if let Some(e) = kw("reasoning_effort").filter(|&v| doc.kind(v) == Kind::String) {
        match &*doc.str(e) {
            "none" | "minimal" => return false,
            "low" | "high" | "xhigh" | "max" => return true,
            _ => {}
        }
    }
    match chat.thinking_type {
        Some(ThinkingType::Enabled) => return true,
        Some(ThinkingType::Disabled) => return false,
        _ => {}
    }
    let effort = chat.effective_effort();
    effort.as_deref().map(|e| mapped(e, v41).unwrap_or(e)) != Some("none")
}

fn rule(message: &str) -> ContractError {
    ContractError::rule(message)
}

pub fn validate(chat: &Chat<'_>, v41: bool) -> Result<()> {
    let doc = &chat.doc;
    if let Some(kw) = chat.chat_template_kwargs {
        let flag = |key: &str| doc.get(kw, key);
        for key in ["thinking", "enable_thinking"] {
            if flag(key).is_some_and(|v| !matches!(doc.kind(v), Kind::Null | Kind::Bool)) {
                return Err(rule("DeepSeek thinking template overrides must be booleans or null"));
            }
        }
        let as_bool = |v: usize| (doc.kind(v) == Kind::Bool).then(|| doc.node(v).flag);
        if let (Some(a), Some(b)) = (flag("thinking").and_then(as_bool), flag("enable_thinking").and_then(as_bool)) {
            if a != b {
                return Err(rule("DeepSeek thinking and enable_thinking template overrides must agree"));
            }
        }
    }
    if chat.thinking_type == Some(ThinkingType::Adaptive) {
        return Err(rule("thinking.type must be enabled or disabled for DeepSeek V4"));
    }
    for effort in [chat.reasoning_effort_text(), chat.thinking_effort_text()].into_iter().flatten() {
        let budget = v41
            && effort.bytes().all(|b| b.is_ascii_digit())
            && effort.parse::<u8>().is_ok_and(|n| (1..=100).contains(&n));
        if !EFFORTS.contains(&&*effort) && !budget {
            return Err(rule(if v41 {
                "DeepSeek V4.1 reasoning effort must be none, low, high, xhigh, max or an integer budget from 1 to 100 (minimal and medium aliases are accepted)"
            } else {
                "DeepSeek V4 reasoning effort must be none, low, high or max (minimal, medium and xhigh aliases are accepted)"
            }));
        }
    }
    if chat.tool_choice.as_ref().is_some_and(|c| c.is_forced()) && thinking_enabled(chat, v41) {
        return Err(rule("DeepSeek V4 requires thinking to be disabled for forced tool choice"));
    }
    Ok(())
}

/// Map effort aliases in place and write the thinking decision to
/// `chat_template_kwargs.thinking` when that is unset.
pub fn rewrite(chat: &Chat<'_>, v41: bool, edits: &mut Edits) {
    let doc = &chat.doc;
    for v in [chat.reasoning_effort, chat.thinking_effort].into_iter().flatten() {
        if doc.kind(v) == Kind::String {
            if let Some(to) = mapped(&doc.str(v), v41) {
                edits.replace_with_string(doc, v, to);
            }
        }
    }
    let value: &[u8] = if thinking_enabled(chat, v41) { b"true" } else { b"false" };
    match chat.chat_template_kwargs {
        Some(kw) => edits.default_member(doc, kw, "thinking", value),
        None => {
            let obj = [&b"{\"thinking\":"[..], value, b"}"].concat();
            match doc.get(0, "chat_template_kwargs") {
                Some(null) => edits.replace(doc, null, &obj),
                None => edits.insert_member(doc, 0, "chat_template_kwargs", &obj),
            }
        }
    }
}
