//! Chat message objects: roles, content shapes and the per-message rules.

use super::error::ContractError;
use super::fields::{self, Result};
use super::json::{Doc, Kind};
use crate::spare::Spare;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    Function,
    /// MiniMax only; every other profile rejects it.
    Root,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Function => "function",
            Role::Root => "root",
        }
    }

    fn parse(s: &[u8]) -> Option<Role> {
        Some(match s {
            b"system" => Role::System,
            b"developer" => Role::Developer,
            b"user" => Role::User,
            b"assistant" => Role::Assistant,
            b"tool" => Role::Tool,
            b"function" => Role::Function,
            b"root" => Role::Root,
            _ => return None,
        })
    }
}

/// One message, as tape indices into the body.
#[derive(Clone, Copy, Debug)]
pub struct Message {
    pub obj: usize,
    pub role: Role,
    /// The `role` string value (a splice target for MiniMax's root → system).
    pub role_value: usize,
    /// `content`, unless absent or `null`.
    pub content: Option<usize>,
    /// Key index of a `tools` member (Kimi's message extension), `null` included.
    pub tools_key: Option<usize>,
    /// `tool_calls` array, unless absent or `null`.
    pub tool_calls: Option<usize>,
    /// `tool_call_id` string on a `tool` message.
    pub tool_call_id: Option<usize>,
}

impl Message {
    /// The `tools` value unless it is `null` (SMG treats `null` as absent).
    pub fn tools(&self, doc: &Doc<'_>) -> Option<usize> {
        self.tools_key.map(|k| k + 1).filter(|&v| !doc.is_null(v))
    }

    /// Content parts, when content is an array.
    pub fn parts<'d>(&self, doc: &'d Doc<'_>) -> impl Iterator<Item = usize> + 'd {
        let arr = self.content.filter(|&c| doc.kind(c) == Kind::Array);
        arr.into_iter().flat_map(move |a| doc.elements(a))
    }
}

thread_local! {
    /// The message list of the shard's last chat request, for its next (crate::spare).
    static LIST: Spare<Message> = const { Spare::new(256) };
}

/// Gives a list [`scan`] made back for the next request's.
pub fn give_back(list: Vec<Message>) {
    LIST.with(|s| s.give(list));
}

/// Type-check every message (schema mismatches are `json_parse_error`). `declared_tools_ok`
/// lets a `developer` message that declares tools omit `content` (Kimi).
pub fn scan(doc: &Doc<'_>, messages: usize, declared_tools_ok: bool) -> Result<Vec<Message>> {
    let mut out = LIST.with(|s| s.take(8));
    for (i, m) in doc.elements(messages).enumerate() {
        let at = || format!("messages[{i}]");
        if doc.kind(m) != Kind::Object {
            return Err(fields::invalid_type(doc, m, &at(), "a message object"));
        }
        let (mut role, mut content, mut tools_key, mut tool_calls, mut tool_call_id, mut name) =
            (None, None, None, None, None, None);
        for (k, v) in doc.members(m) {
            match &*doc.key(k) {
                b"role" => role = Some(v),
                b"content" => content = Some(v),
                b"tools" => tools_key = Some(k),
                b"tool_calls" => tool_calls = Some(v),
                b"tool_call_id" => tool_call_id = Some(v),
                b"name" => name = Some(v),
                b"reasoning_content" | b"reasoning" if !matches!(doc.kind(v), Kind::String | Kind::Null) => {
                    return Err(fields::invalid_type(doc, v, &format!("{}.{}", at(), doc.str(k)), "a string"));
                }
                _ => {}
            }
        }
        let Some(role_value) = role else {
            return Err(ContractError::data(format!("{}: missing field `role`", at())));
        };
        if doc.kind(role_value) != Kind::String {
            return Err(fields::invalid_type(doc, role_value, &format!("{}.role", at()), "a string"));
        }
        let Some(role) = Role::parse(&doc.key(role_value)) else {
            return Err(ContractError::data(format!(
                "{}: unknown variant `{}`, expected one of `system`, `developer`, `user`, `assistant`, `tool`, `function`, `root`",
                at(),
                doc.str(role_value).chars().take(64).collect::<String>()
            )));
        };
        let content = content.filter(|&c| !doc.is_null(c));
        let declares_tools = tools_key.is_some_and(|k| !doc.is_null(k + 1));
        let content_optional = matches!(role, Role::System | Role::Assistant)
            || (role == Role::Developer && declared_tools_ok && declares_tools);
        match content {
            None if !content_optional => {
                return Err(ContractError::data(format!("{}: missing field `content`", at())));
            }
            Some(c) if role == Role::Function && doc.kind(c) != Kind::String => {
                return Err(fields::invalid_type(doc, c, &format!("{}.content", at()), "a string"));
            }
            Some(c) => check_content(doc, c, i)?,
            None => {}
        }
        if let Some(n) = name.filter(|&n| !matches!(doc.kind(n), Kind::String | Kind::Null)) {
            return Err(fields::invalid_type(doc, n, &format!("{}.name", at()), "a string"));
        }
        if name.is_none() && role == Role::Function {
            return Err(ContractError::data(format!("{}: missing field `name`", at())));
        }
        let tool_call_id = match tool_call_id {
            Some(v) if matches!(doc.kind(v), Kind::String | Kind::Null) => Some(v).filter(|&v| !doc.is_null(v)),
            Some(v) => return Err(fields::invalid_type(doc, v, &format!("{}.tool_call_id", at()), "a string")),
            None => None,
        };
        if role == Role::Tool && tool_call_id.is_none() {
            return Err(ContractError::data(format!("{}: missing field `tool_call_id`", at())));
        }
        let tool_calls = match tool_calls {
            Some(v) => check_tool_calls(doc, v, i)?,
            None => None,
        };
        out.push(Message { obj: m, role, role_value, content, tools_key, tool_calls, tool_call_id });
    }
    Ok(out)
}

/// Text, or an array of part objects. Parts of unknown `type`, or known types with odd
/// payloads, are forwarded as sent, so only the object shape is required.
fn check_content(doc: &Doc<'_>, c: usize, i: usize) -> Result<()> {
    // Paths are formatted only on failure: this runs once per message on the hot path.
    match doc.kind(c) {
        Kind::String => Ok(()),
        Kind::Array => {
            for (j, part) in doc.elements(c).enumerate() {
                if doc.kind(part) != Kind::Object {
                    return Err(fields::invalid_type(
                        doc,
                        part,
                        &format!("messages[{i}].content[{j}]"),
                        "a content part object",
                    ));
                }
            }
            Ok(())
        }
        _ => Err(fields::invalid_type(
            doc,
            c,
            &format!("messages[{i}].content"),
            "a string or an array of content parts",
        )),
    }
}

fn check_tool_calls(doc: &Doc<'_>, v: usize, i: usize) -> Result<Option<usize>> {
    let at = || format!("messages[{i}].tool_calls");
    let Some(arr) = fields::array(doc, v, &at())? else {
        return Ok(None);
    };
    let is_str = |x: usize| matches!(doc.kind(x), Kind::String | Kind::Null);
    for (j, call) in doc.elements(arr).enumerate() {
        if doc.kind(call) != Kind::Object {
            return Err(fields::invalid_type(doc, call, &format!("{}[{j}]", at()), "a tool call object"));
        }
        if let Some(id) = doc.get(call, "id").filter(|&id| !is_str(id)) {
            return Err(fields::invalid_type(doc, id, &format!("{}[{j}].id", at()), "a string"));
        }
        let Some(f) = doc.get_some(call, "function") else { continue };
        if doc.kind(f) != Kind::Object {
            return Err(fields::invalid_type(doc, f, &format!("{}[{j}].function", at()), "a map"));
        }
        if let Some(name) = doc.get(f, "name").filter(|&n| !is_str(n)) {
            return Err(fields::invalid_type(doc, name, &format!("{}[{j}].function.name", at()), "a string"));
        }
    }
    Ok(Some(arr))
}

/// SMG's message rules: a non-empty list, and no empty `user` content.
pub fn validate(doc: &Doc<'_>, messages: &[Message]) -> Result<()> {
    if messages.is_empty() {
        return Err(ContractError::field("messages cannot be empty"));
    }
    for m in messages.iter().filter(|m| m.role == Role::User) {
        if let Some(c) = m.content {
            let n = doc.node(c);
            match n.kind {
                Kind::String if n.end - n.start == 2 => {
                    return Err(ContractError::field("message content cannot be empty"));
                }
                Kind::Array if n.next as usize == c + 1 => {
                    return Err(ContractError::field("message content parts cannot be empty"));
                }
                _ => {}
            }
        }
    }
    Ok(())
}
