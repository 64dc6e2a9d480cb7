//! A Responses request, read and turned into the chat request the engine runs (sans I/O).
//!
//! `Turn::read` validates the body and gives every input item its stored shape and id;
//! `Turn::chat` builds the chat body from the history the caller loaded (earlier turns'
//! input and output items, oldest first) and this turn's input: `instructions` as a leading
//! system message (an earlier turn's are not carried), messages by role, a `function_call`
//! as an assistant tool call (consecutive ones in one message) and its
//! `function_call_output` as the tool's answer. Sampling fields keep their chat names.

use sonic_rs::{json, JsonContainerTrait, JsonValueTrait, Value};

use crate::api::ApiError;

/// A read Responses request.
#[derive(Debug)]
pub struct Turn {
    pub model: String,
    /// This turn's input items, stored shape, each with its id.
    pub input: Vec<Value>,
    /// The same items as JSON text, as they are stored.
    pub input_text: Vec<String>,
    pub instructions: Option<String>,
    pub previous: Option<String>,
    pub conversation: Option<String>,
    pub store: bool,
    pub stream: bool,
    /// Function tools, Responses shape (as the response object echoes them).
    pub tools: Vec<Value>,
    /// MCP tools (`type: mcp`), as sent.
    pub mcp: Vec<Value>,
    pub tool_choice: Value,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_output_tokens: Option<u64>,
    pub parallel_tool_calls: bool,
    /// `max_tool_calls`: most tool calls the gateway runs in this turn (MCP).
    pub max_tool_calls: Option<u64>,
    pub metadata: Value,
    pub text: Value,
    pub reasoning: Value,
    pub user: Option<String>,
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(400, "invalid_request_error", message)
}

fn opt_str(doc: &Value, key: &str) -> Result<Option<String>, ApiError> {
    match doc.get(key) {
        None => Ok(None),
        Some(v) if v.is_null() => Ok(None),
        Some(v) => v.as_str().map(|s| Some(s.to_string())).ok_or_else(|| bad(format!("'{key}' must be a string"))),
    }
}

fn opt_f64(doc: &Value, key: &str) -> Result<Option<f64>, ApiError> {
    match doc.get(key) {
        None => Ok(None),
        Some(v) if v.is_null() => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| bad(format!("'{key}' must be a number"))),
    }
}

/// `new_id("msg")`: `msg_` and 48 hex digits from the kernel's random source (an id is all a
/// caller needs to read a stored record of its tenant's).
pub(crate) fn new_id(prefix: &str) -> String {
    let bytes = crate::random::buffered::<24>();
    let mut id = String::with_capacity(prefix.len() + 49);
    id.push_str(prefix);
    id.push('_');
    for b in bytes {
        id.push(char::from(b"0123456789abcdef"[(b >> 4) as usize]));
        id.push(char::from(b"0123456789abcdef"[(b & 15) as usize]));
    }
    id
}

/// A content part's text: `input_text`, `output_text`, `text` and `refusal` parts.
fn part_text(part: &Value) -> Option<&str> {
    match part.get("type").and_then(|t| t.as_str()) {
        Some("input_text" | "output_text" | "text") => part.get("text").and_then(|t| t.as_str()),
        Some("refusal") => part.get("refusal").and_then(|t| t.as_str()),
        _ => None,
    }
}

/// A message item's text, its parts joined.
pub(crate) fn message_text(item: &Value) -> std::borrow::Cow<'_, str> {
    match item.get("content") {
        Some(c) if c.is_str() => std::borrow::Cow::Borrowed(c.as_str().unwrap_or("")),
        Some(c) => match c.as_array() {
            // One part (the common case) is borrowed, not joined.
            Some(a) if a.len() == 1 => std::borrow::Cow::Borrowed(a.iter().find_map(part_text).unwrap_or("")),
            Some(a) => std::borrow::Cow::Owned(a.iter().filter_map(part_text).collect::<String>()),
            None => std::borrow::Cow::Borrowed(""),
        },
        None => std::borrow::Cow::Borrowed(""),
    }
}

/// A JSON value's text.
fn text_of(v: &Value) -> String {
    sonic_rs::to_string(v).unwrap_or_default()
}

/// A JSON string's text.
fn quoted(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len() + 2);
    smg_wire::json::put_str(&mut out, s);
    String::from_utf8(out).unwrap_or_default()
}

/// `item` written again: `head` first (key, JSON text), then its other keys but `skip`, in
/// its order, then `tail`. Sonic-rs's `insert` turns an object into a hash map (its order
/// lost, and dearer than writing the text and parsing it once).
fn rewritten(item: &Value, head: &[(&str, String)], skip: &[&str], tail: &[(&str, String)]) -> String {
    let mut out = String::with_capacity(128);
    out.push('{');
    let put = |out: &mut String, k: &str, v: &str| {
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str(&quoted(k));
        out.push(':');
        out.push_str(v);
    };
    for (k, v) in head {
        put(&mut out, k, v);
    }
    if let Some(o) = item.as_object() {
        for (k, v) in o.iter().filter(|(k, _)| !skip.contains(k)) {
            put(&mut out, k, &text_of(v));
        }
    }
    for (k, v) in tail {
        put(&mut out, k, v);
    }
    out.push('}');
    out
}

/// A user message of `text` in its stored shape, as JSON text.
fn user_message(text: &str) -> String {
    let mut out = Vec::with_capacity(text.len() + 160);
    out.extend_from_slice(b"{\"type\":\"message\",\"id\":\"");
    out.extend_from_slice(new_id("msg").as_bytes());
    out.extend_from_slice(
        b"\",\"status\":\"completed\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":",
    );
    smg_wire::json::put_str(&mut out, text);
    out.extend_from_slice(b"}]}");
    String::from_utf8(out).unwrap_or_default()
}

/// One input item in its stored shape, as JSON text: a message gets `type`, `id`, `status`
/// and its content as parts; a call and a call's output get an id. None: the item is already
/// in that shape (its own text is stored). `strict`: the gateway runs the turn, so an item
/// it does not know is refused; else (a provider runs it) it is kept as sent.
fn input_item(item: &Value, strict: bool) -> Result<Option<String>, ApiError> {
    if !item.is_object() {
        return Err(bad("input items must be objects"));
    }
    let kind = item.get("type").and_then(|t| t.as_str()).unwrap_or("message");
    let has = |k: &str| item.get(k).is_some_and(|v| v.is_str());
    let with_id = |prefix: &str, skip: &[&str], tail: &[(&str, String)]| {
        let id = item.get("id").filter(|v| v.is_str()).map_or_else(|| quoted(&new_id(prefix)), text_of);
        let mut all = vec!["type", "id"];
        all.extend_from_slice(skip);
        rewritten(item, &[("type", quoted(kind)), ("id", id)], &all, tail)
    };
    let complete = |prefix: &str| (!has("id")).then(|| with_id(prefix, &[], &[]));
    Ok(match kind {
        "message" => {
            let role = item.get("role").and_then(|r| r.as_str()).ok_or_else(|| bad("a message item needs a 'role'"))?;
            if !matches!(role, "user" | "assistant" | "system" | "developer") {
                return Err(bad(format!("unknown role '{role}': user, assistant, system or developer")));
            }
            let part = if role == "assistant" { "output_text" } else { "input_text" };
            let content = match item.get("content") {
                Some(c) if c.is_str() => {
                    let mut parts = format!("[{{\"type\":\"{part}\",\"text\":");
                    parts.push_str(&quoted(c.as_str().unwrap_or("")));
                    parts.push_str("}]");
                    Some(parts)
                }
                Some(c) if c.is_array() => None,
                _ => return Err(bad("a message item's 'content' must be a string or an array of parts")),
            };
            let typed = item.get("type").is_some();
            if content.is_none() && typed && has("id") && has("status") {
                return Ok(None);
            }
            let id = item.get("id").filter(|v| v.is_str()).map_or_else(|| quoted(&new_id("msg")), text_of);
            let status = item.get("status").filter(|v| v.is_str()).map_or_else(|| quoted("completed"), text_of);
            let content = content.unwrap_or_else(|| item.get("content").map(text_of).unwrap_or_default());
            let head = [
                ("type", quoted("message")),
                ("id", id),
                ("status", status),
                ("role", quoted(role)),
                ("content", content),
            ];
            Some(rewritten(item, &head, &["type", "id", "status", "role", "content"], &[]))
        }
        "function_call" => {
            for k in ["call_id", "name", "arguments"] {
                if !has(k) {
                    return Err(bad(format!("a function_call item needs a string '{k}'")));
                }
            }
            match (has("id"), has("status")) {
                (true, true) => None,
                (_, true) => Some(with_id("fc", &[], &[])),
                (_, false) => Some(with_id("fc", &["status"], &[("status", quoted("completed"))])),
            }
        }
        "function_call_output" => {
            if !has("call_id") {
                return Err(bad("a function_call_output item needs a string 'call_id'"));
            }
            match item.get("output") {
                Some(o) if o.is_str() || o.is_array() => {}
                _ => return Err(bad("a function_call_output item needs an 'output' string")),
            }
            complete("fco")
        }
        "reasoning" => complete("rs"),
        // Earlier MCP turns' items, sent back: kept, and replayed as the calls they were.
        "mcp_list_tools" => complete("mcpl"),
        "mcp_call" => complete("mcp"),
        "mcp_approval_request" => complete("mcpr"),
        "mcp_approval_response" => {
            if !has("approval_request_id") || !item.get("approve").is_some_and(|a| a.is_boolean()) {
                return Err(bad("an mcp_approval_response needs 'approval_request_id' and a boolean 'approve'"));
            }
            complete("mcpa")
        }
        _ if !strict => None,
        other => return Err(bad(format!("Unsupported input item type '{other}'"))),
    })
}

/// An input item, parsed and as its stored text.
fn stored(item: &Value, strict: bool) -> Result<(Value, String), ApiError> {
    match input_item(item, strict)? {
        None => Ok((item.clone(), text_of(item))),
        Some(text) => Ok((sonic_rs::from_str(&text).map_err(|e| bad(format!("input item: {e}")))?, text)),
    }
}

// === impl Turn ===

impl Turn {
    /// Reads a Responses body (bounded already by the inspect phase) the gateway runs itself.
    pub fn read(body: &[u8]) -> Result<Turn, ApiError> {
        Turn::read_as(body, true)
    }

    /// Reads a Responses body a provider runs (src/responses/provider_turn.rs): its built-in
    /// tools and the items they make (`web_search`, `file_search_call`, …) are the provider's
    /// to judge, so they are passed on and kept as sent rather than refused.
    pub(crate) fn read_for_provider(body: &[u8]) -> Result<Turn, ApiError> {
        Turn::read_as(body, false)
    }

    fn read_as(body: &[u8], strict: bool) -> Result<Turn, ApiError> {
        let doc: Value = sonic_rs::from_slice(body).map_err(|e| bad(format!("request body: {e}")))?;
        if !doc.is_object() {
            return Err(bad("the request body must be a JSON object"));
        }
        let model = opt_str(&doc, "model")?.unwrap_or_default();
        // Read in place: `get_mut` would turn the whole document into sonic-rs's hash map form.
        let (input, input_text): (Vec<Value>, Vec<String>) = match doc.get("input") {
            Some(v) if v.is_str() => {
                let text = user_message(v.as_str().unwrap_or(""));
                let item = sonic_rs::from_str(&text).map_err(|e| bad(format!("input: {e}")))?;
                (vec![item], vec![text])
            }
            Some(v) if v.is_array() => {
                let items = v.as_array().expect("an array");
                items.iter().map(|i| stored(i, strict)).collect::<Result<Vec<_>, _>>()?.into_iter().unzip()
            }
            None => return Err(bad("'input' is required")),
            Some(_) => return Err(bad("'input' must be a string or an array of items")),
        };
        let previous = opt_str(&doc, "previous_response_id")?;
        let conversation = match doc.get("conversation") {
            None => None,
            Some(v) if v.is_null() => None,
            Some(v) if v.is_str() => v.as_str().map(str::to_string),
            Some(v) => match v.get("id").and_then(|i| i.as_str()) {
                Some(id) => Some(id.to_string()),
                None => return Err(bad("'conversation' must be an id or an object with one")),
            },
        };
        if previous.is_some() && conversation.is_some() {
            return Err(ApiError::new(
                400,
                "mutually_exclusive_parameters",
                "Mutually exclusive parameters: 'previous_response_id' and 'conversation' cannot be used together",
            ));
        }
        if let Some(c) = &conversation {
            if !c.starts_with("conv_") {
                return Err(ApiError::new(
                    400,
                    "invalid_conversation_id",
                    format!("Invalid 'conversation': '{c}'. Expected an ID that begins with 'conv_'."),
                ));
            }
        }
        let mut tools = Vec::new();
        let mut mcp = Vec::new();
        if let Some(list) = doc.get("tools").filter(|t| !t.is_null()) {
            let list = list.as_array().ok_or_else(|| bad("'tools' must be an array"))?;
            for t in list.iter() {
                match t.get("type").and_then(|k| k.as_str()) {
                    Some("function") => {
                        if !t.get("name").is_some_and(|n| n.is_str()) {
                            return Err(bad("a function tool needs a 'name'"));
                        }
                        tools.push(t.clone());
                    }
                    Some("mcp") => mcp.push(t.clone()),
                    _ if !strict => {}
                    Some(other) => return Err(bad(format!("Unsupported tool type '{other}'"))),
                    None => return Err(bad("a tool needs a 'type'")),
                }
            }
        }
        let flag = |k: &str, default: bool| doc.get(k).and_then(|v| v.as_bool()).unwrap_or(default);
        let max_output_tokens = match doc.get("max_output_tokens") {
            None => None,
            Some(v) if v.is_null() => None,
            Some(v) => Some(
                v.as_u64().filter(|n| *n > 0).ok_or_else(|| bad("'max_output_tokens' must be a positive integer"))?,
            ),
        };
        // Defaults parsed from text when absent: `json!` builds objects by insert (a hash map each).
        let or = |k: &str, default: &str| {
            doc.get(k)
                .filter(|v| !v.is_null())
                .cloned()
                .unwrap_or_else(|| sonic_rs::from_str(default).unwrap_or_default())
        };
        Ok(Turn {
            model,
            input,
            input_text,
            instructions: opt_str(&doc, "instructions")?,
            previous,
            conversation,
            store: flag("store", true),
            stream: flag("stream", false),
            tools,
            mcp,
            tool_choice: or("tool_choice", r#""auto""#),
            temperature: opt_f64(&doc, "temperature")?,
            top_p: opt_f64(&doc, "top_p")?,
            max_output_tokens,
            parallel_tool_calls: flag("parallel_tool_calls", true),
            max_tool_calls: doc.get("max_tool_calls").and_then(|v| v.as_u64()),
            metadata: or("metadata", "{}"),
            text: or("text", r#"{"format":{"type":"text"}}"#),
            reasoning: or("reasoning", r#"{"effort":null,"summary":null}"#),
            user: opt_str(&doc, "user")?,
        })
    }

    /// The chat body for the engine: `history` (earlier items, oldest first), then this
    /// turn's input; `extra_tools` are chat-shaped tools offered beside the function tools
    /// (the MCP servers' tools).
    pub fn chat(&self, history: &[Value], extra_tools: &[Value], stream: bool) -> Value {
        self.chat_after(history.iter().chain(self.input.iter()), extra_tools, stream)
    }

    /// The chat body for `items`, every item the model reads after the instructions. Written
    /// as JSON text and parsed once (an object built by `insert` is a hash map in sonic-rs).
    pub(crate) fn chat_after<'a>(
        &self,
        items: impl Iterator<Item = &'a Value>,
        extra_tools: &[Value],
        stream: bool,
    ) -> Value {
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(b"{\"model\":");
        smg_wire::json::put_str(&mut out, &self.model);
        out.extend_from_slice(b",\"messages\":[");
        let mut messages = Messages { out, first: true, calls_open: false };
        if let Some(i) = &self.instructions {
            messages.message("system", Some(i));
        }
        for item in items {
            messages.item(item);
        }
        let mut out = messages.close();
        out.extend_from_slice(b"],\"stream\":");
        out.extend_from_slice(if stream { b"true" } else { b"false" });
        if stream {
            out.extend_from_slice(b",\"stream_options\":{\"include_usage\":true}");
        }
        let mut tools = self.tools.iter().map(chat_tool).chain(extra_tools.iter().cloned()).peekable();
        if tools.peek().is_some() {
            out.extend_from_slice(b",\"tools\":[");
            for (i, t) in tools.enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let _ = sonic_rs::to_writer(&mut out, &t);
            }
            out.extend_from_slice(b"],\"tool_choice\":");
            let _ = sonic_rs::to_writer(&mut out, &chat_tool_choice(&self.tool_choice));
            out.extend_from_slice(b",\"parallel_tool_calls\":");
            out.extend_from_slice(if self.parallel_tool_calls { b"true" } else { b"false" });
        }
        let mut num = |key: &[u8], v: Option<f64>| {
            if let Some(v) = v.and_then(Value::new_f64) {
                out.extend_from_slice(key);
                let _ = sonic_rs::to_writer(&mut out, &v);
            }
        };
        num(b",\"temperature\":", self.temperature);
        num(b",\"top_p\":", self.top_p);
        if let Some(m) = self.max_output_tokens {
            out.extend_from_slice(b",\"max_completion_tokens\":");
            smg_wire::num::put_dec(&mut out, m);
        }
        if let Some(format) = self.text.get("format") {
            match format.get("type").and_then(|t| t.as_str()) {
                Some("json_object") => out.extend_from_slice(b",\"response_format\":{\"type\":\"json_object\"}"),
                Some("json_schema") => {
                    let name = Value::from(format.get("name").and_then(|n| n.as_str()).unwrap_or("schema"));
                    let mut schema = vec![("name", &name)];
                    for k in ["schema", "strict"] {
                        if let Some(v) = format.get(k) {
                            schema.push((k, v));
                        }
                    }
                    out.extend_from_slice(b",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":");
                    let _ = sonic_rs::to_writer(&mut out, &super::ordered(&schema));
                    out.push(b'}');
                }
                _ => {}
            }
        }
        if let Some(effort) = self.reasoning.get("effort").and_then(|e| e.as_str()) {
            out.extend_from_slice(b",\"reasoning_effort\":");
            smg_wire::json::put_str(&mut out, effort);
        }
        out.push(b'}');
        sonic_rs::from_slice(&out).unwrap_or_default()
    }
}

/// A Responses function tool as a chat tool, keys in the order SGLang's chat request has.
fn chat_tool(t: &Value) -> Value {
    let name = Value::from(t.get("name").and_then(|n| n.as_str()).unwrap_or(""));
    let mut f: Vec<(&str, &Value)> = vec![("name", &name)];
    for k in ["description", "parameters", "strict"] {
        if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
            f.push((k, v));
        }
    }
    let function = super::ordered(&f);
    super::ordered(&[("type", &Value::from("function")), ("function", &function)])
}

/// `auto`/`none`/`required` as they are; `{type: function, name}` in chat's shape.
fn chat_tool_choice(choice: &Value) -> Value {
    match choice.get("name").and_then(|n| n.as_str()) {
        Some(name) => json!({"type": "function", "function": {"name": name}}),
        None if choice.is_str() => choice.clone(),
        None => Value::from("auto"),
    }
}

/// The chat messages, written as JSON text: an assistant's tool calls right after one
/// another are one message (parallel calls), left open until something else comes.
struct Messages {
    out: Vec<u8>,
    first: bool,
    /// The last message is an assistant's tool calls, its `tool_calls` array not closed.
    calls_open: bool,
}

impl Messages {
    fn start(&mut self) {
        if self.calls_open {
            self.out.extend_from_slice(b"]}");
            self.calls_open = false;
        }
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
    }

    /// `{"role":…,"content":…}` (`content` null when None).
    fn message(&mut self, role: &str, content: Option<&str>) {
        self.start();
        self.out.extend_from_slice(b"{\"role\":");
        smg_wire::json::put_str(&mut self.out, role);
        self.out.extend_from_slice(b",\"content\":");
        match content {
            Some(c) => smg_wire::json::put_str(&mut self.out, c),
            None => self.out.extend_from_slice(b"null"),
        }
        self.out.push(b'}');
    }

    /// A tool's answer to the call `id`.
    fn tool(&mut self, id: &str, content: &str) {
        self.start();
        self.out.extend_from_slice(b"{\"role\":\"tool\",\"tool_call_id\":");
        smg_wire::json::put_str(&mut self.out, id);
        self.out.extend_from_slice(b",\"content\":");
        smg_wire::json::put_str(&mut self.out, content);
        self.out.push(b'}');
    }

    /// An assistant tool call; a call right after another joins its message.
    fn call(&mut self, id: &str, name: &str, arguments: &str) {
        if self.calls_open {
            self.out.push(b',');
        } else {
            self.start();
            self.out.extend_from_slice(b"{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[");
            self.calls_open = true;
        }
        self.out.extend_from_slice(b"{\"id\":");
        smg_wire::json::put_str(&mut self.out, id);
        self.out.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
        smg_wire::json::put_str(&mut self.out, name);
        self.out.extend_from_slice(b",\"arguments\":");
        smg_wire::json::put_str(&mut self.out, arguments);
        self.out.extend_from_slice(b"}}");
    }

    /// One item's chat message(s).
    fn item(&mut self, item: &Value) {
        let s = |k: &str| item.get(k).and_then(|v| v.as_str()).unwrap_or("");
        match item.get("type").and_then(|t| t.as_str()).unwrap_or("message") {
            "message" => {
                let role = match s("role") {
                    "assistant" => "assistant",
                    "system" | "developer" => "system",
                    _ => "user",
                };
                self.message(role, Some(message_text(item).as_ref()));
            }
            "function_call" => self.call(s("call_id"), s("name"), s("arguments")),
            "function_call_output" => {
                let output = match item.get("output") {
                    Some(o) if o.is_str() => std::borrow::Cow::Borrowed(o.as_str().unwrap_or("")),
                    Some(o) => std::borrow::Cow::Owned(message_text(&json!({"content": o})).into_owned()),
                    None => std::borrow::Cow::Borrowed(""),
                };
                self.tool(s("call_id"), &output);
            }
            // An MCP call the gateway ran: the call, then its output, as the model saw them.
            "mcp_call" => {
                let id = s("id");
                self.call(id, s("name"), s("arguments"));
                let output =
                    item.get("output").and_then(|o| o.as_str()).or_else(|| item.get("error").and_then(|e| e.as_str()));
                self.tool(id, output.unwrap_or(""));
            }
            // Reasoning and tool listings are not replayed (chat templates drop earlier reasoning).
            _ => {}
        }
    }

    fn close(mut self) -> Vec<u8> {
        if self.calls_open {
            self.out.extend_from_slice(b"]}");
        }
        self.out
    }
}

/// A stored chain's items as the next turn's history, as JSON text: each turn's input, then
/// its output.
pub fn chain_items(chain: Vec<crate::responses::store::StoredResponse>) -> Vec<String> {
    chain.into_iter().flat_map(|r| r.input.into_iter().chain(r.output)).collect()
}

/// History items parsed, for the chat a turn the gateway runs is built from.
pub fn parsed(items: &[String]) -> Vec<Value> {
    items.iter().map(|s| sonic_rs::from_str(s).unwrap_or_default()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(body: &str) -> Result<Turn, ApiError> {
        Turn::read(body.as_bytes())
    }

    fn roles(chat: &Value) -> Vec<String> {
        chat["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap().to_string()).collect()
    }

    #[test]
    fn a_string_input_is_one_user_message_with_the_instructions_first() {
        let t = turn(r#"{"model":"m","input":"hi","instructions":"be brief","max_output_tokens":5,"temperature":0.5}"#)
            .unwrap();
        assert!(t.store && !t.stream);
        assert_eq!(t.input.len(), 1);
        assert!(t.input[0]["id"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(t.input[0]["content"][0]["type"].as_str(), Some("input_text"));
        let chat = t.chat(&[], &[], false);
        assert_eq!(roles(&chat), ["system", "user"]);
        assert_eq!(chat["messages"][1]["content"].as_str(), Some("hi"));
        assert_eq!(chat["max_completion_tokens"].as_u64(), Some(5));
        assert_eq!(chat["temperature"].as_f64(), Some(0.5));
        assert!(chat.get("tools").is_none());
    }

    #[test]
    fn history_comes_first_and_calls_become_tool_messages() {
        let t = turn(
            r#"{"model":"m","input":[{"type":"function_call_output","call_id":"c1","output":"42"}],
                "tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]}"#,
        )
        .unwrap();
        let history = [
            json!({"type":"message","role":"user","content":[{"type":"input_text","text":"q"}]}),
            json!({"type":"function_call","call_id":"c1","name":"f","arguments":"{}"}),
            json!({"type":"function_call","call_id":"c2","name":"f","arguments":"{}"}),
        ];
        let chat = t.chat(&history, &[], true);
        assert_eq!(roles(&chat), ["user", "assistant", "tool"]);
        assert_eq!(chat["messages"][1]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(chat["messages"][2]["tool_call_id"].as_str(), Some("c1"));
        assert_eq!(chat["tools"][0]["function"]["name"].as_str(), Some("f"));
        assert_eq!(chat["stream_options"]["include_usage"].as_bool(), Some(true));
    }

    #[test]
    fn input_items_are_stored_in_openais_shape_with_their_own_ids_kept() {
        let t = turn(
            r#"{"model":"m","input":[{"role":"user","content":"hi","phase":"x"},
                {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
                {"type":"function_call","id":"fc_mine","call_id":"c2","name":"f","arguments":"{}","status":"completed"},
                {"type":"function_call_output","call_id":"c1","output":"42"}]}"#,
        )
        .unwrap();
        let keys = |i: usize| {
            let v: Value = sonic_rs::from_str(&t.input_text[i]).unwrap();
            v.as_object().unwrap().iter().map(|(k, _)| k.to_string()).collect::<Vec<_>>()
        };
        assert_eq!(keys(0), ["type", "id", "status", "role", "content", "phase"]);
        assert_eq!(t.input[0]["content"][0]["text"].as_str(), Some("hi"));
        assert_eq!(keys(1), ["type", "id", "call_id", "name", "arguments", "status"]);
        assert!(t.input[1]["id"].as_str().unwrap().starts_with("fc_"));
        // Already complete: stored as sent.
        assert_eq!(t.input[2]["id"].as_str(), Some("fc_mine"));
        assert!(t.input_text[2].contains(r#""id":"fc_mine""#));
        assert!(t.input[3]["id"].as_str().unwrap().starts_with("fco_"));
        for (v, text) in t.input.iter().zip(&t.input_text) {
            assert_eq!(&sonic_rs::from_str::<Value>(text).unwrap(), v);
        }
    }

    #[test]
    fn a_provider_turn_keeps_the_tools_and_items_only_the_provider_knows() {
        let body = r#"{"model":"m","tools":[{"type":"web_search"}],
            "input":[{"type":"web_search_call","id":"ws_1","status":"completed"},{"role":"user","content":"x"}]}"#;
        assert_eq!(turn(body).unwrap_err().code, "invalid_request_error", "the gateway runs only what it knows");
        let t = Turn::read_for_provider(body.as_bytes()).unwrap();
        assert_eq!(t.input_text[0], r#"{"type":"web_search_call","id":"ws_1","status":"completed"}"#);
        assert_eq!(t.input[1]["content"][0]["text"].as_str(), Some("x"));
    }

    #[test]
    fn refusals_name_their_codes() {
        let code = |b: &str| turn(b).unwrap_err().code;
        assert_eq!(
            code(r#"{"model":"m","input":"x","previous_response_id":"resp_1","conversation":"conv_1"}"#),
            "mutually_exclusive_parameters"
        );
        assert_eq!(code(r#"{"model":"m","input":"x","conversation":"invalid-id"}"#), "invalid_conversation_id");
        assert_eq!(code(r#"{"model":"m"}"#), "invalid_request_error");
        assert_eq!(code(r#"{"model":"m","input":[{"type":"computer_call"}]}"#), "invalid_request_error");
        assert_eq!(code(r#"{"model":"m","input":[{"role":"wizard","content":"x"}]}"#), "invalid_request_error");
        assert_eq!(code(r#"[1]"#), "invalid_request_error");
    }
}
