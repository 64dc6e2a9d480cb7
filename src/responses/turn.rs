//! A Responses request, read and turned into the chat request the engine runs (sans I/O).
//!
//! `Turn::read` validates the body and gives every input item its stored shape and id;
//! `Turn::chat` builds the chat body from the history the caller loaded (earlier turns'
//! input and output items, oldest first) and this turn's input: `instructions` as a leading
//! system message (an earlier turn's are not carried), messages by role, a `function_call`
//! as an assistant tool call (consecutive ones in one message) and its
//! `function_call_output` as the tool's answer. Sampling fields keep their chat names.

use sonic_rs::{json, JsonContainerTrait, JsonValueMutTrait, JsonValueTrait, Value};

use crate::api::ApiError;

/// A read Responses request.
#[derive(Debug)]
pub struct Turn {
    pub model: String,
    /// This turn's input items, stored shape, each with its id.
    pub input: Vec<Value>,
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

/// One input item in its stored shape (taken, not copied): a message gets `type`, `id`,
/// `status` and its content as parts; a call and a call's output get an id.
fn input_item(mut item: Value) -> Result<Value, ApiError> {
    if !item.is_object() {
        return Err(bad("input items must be objects"));
    }
    let kind = item.get("type").and_then(|t| t.as_str()).unwrap_or("message").to_string();
    let has = |item: &Value, k: &str| item.get(k).is_some_and(|v| v.is_str());
    let needs_status = !has(&item, "status");
    match kind.as_str() {
        "message" => {
            let role = item.get("role").and_then(|r| r.as_str()).ok_or_else(|| bad("a message item needs a 'role'"))?;
            if !matches!(role, "user" | "assistant" | "system" | "developer") {
                return Err(bad(format!("unknown role '{role}': user, assistant, system or developer")));
            }
            let part = if role == "assistant" { "output_text" } else { "input_text" };
            let obj = item.as_object_mut().expect("an object");
            match obj.get_mut(&"content") {
                Some(c) if c.is_str() => {
                    let text = c.take();
                    obj.insert("content", json!([{"type": part, "text": text}]));
                }
                Some(c) if c.is_array() => {}
                _ => return Err(bad("a message item's 'content' must be a string or an array of parts")),
            }
            obj.insert("type", "message");
            if needs_status {
                obj.insert("status", "completed");
            }
            ensure_id(obj, "msg");
        }
        "function_call" => {
            for k in ["call_id", "name", "arguments"] {
                if !has(&item, k) {
                    return Err(bad(format!("a function_call item needs a string '{k}'")));
                }
            }
            let obj = item.as_object_mut().expect("an object");
            if needs_status {
                obj.insert("status", "completed");
            }
            ensure_id(obj, "fc");
        }
        "function_call_output" => {
            if !has(&item, "call_id") {
                return Err(bad("a function_call_output item needs a string 'call_id'"));
            }
            match item.get("output") {
                Some(o) if o.is_str() || o.is_array() => {}
                _ => return Err(bad("a function_call_output item needs an 'output' string")),
            }
            ensure_id(item.as_object_mut().expect("an object"), "fco");
        }
        "reasoning" => ensure_id(item.as_object_mut().expect("an object"), "rs"),
        // Earlier MCP turns' items, sent back: kept, and replayed as the calls they were.
        "mcp_list_tools" => ensure_id(item.as_object_mut().expect("an object"), "mcpl"),
        "mcp_call" => ensure_id(item.as_object_mut().expect("an object"), "mcp"),
        "mcp_approval_request" => ensure_id(item.as_object_mut().expect("an object"), "mcpr"),
        "mcp_approval_response" => {
            if !has(&item, "approval_request_id") || !item.get("approve").is_some_and(|a| a.is_boolean()) {
                return Err(bad("an mcp_approval_response needs 'approval_request_id' and a boolean 'approve'"));
            }
            ensure_id(item.as_object_mut().expect("an object"), "mcpa")
        }
        other => return Err(bad(format!("Unsupported input item type '{other}'"))),
    }
    Ok(item)
}

fn ensure_id(obj: &mut sonic_rs::Object, prefix: &str) {
    if !obj.get(&"id").is_some_and(|v| v.is_str()) {
        obj.insert("id", new_id(prefix).as_str());
    }
}

// === impl Turn ===

impl Turn {
    /// Reads a Responses body (bounded already by the inspect phase).
    pub fn read(body: &[u8]) -> Result<Turn, ApiError> {
        let mut doc: Value = sonic_rs::from_slice(body).map_err(|e| bad(format!("request body: {e}")))?;
        if !doc.is_object() {
            return Err(bad("the request body must be a JSON object"));
        }
        let model = opt_str(&doc, "model")?.unwrap_or_default();
        // The input is taken out of the document, not copied (a turn's largest part).
        let input = match doc.get_mut("input").map(Value::take) {
            Some(v) if v.is_str() => {
                vec![input_item(json!({"type": "message", "role": "user", "content": v}))?]
            }
            Some(mut v) if v.is_array() => {
                let items = v.as_array_mut().expect("an array");
                items.iter_mut().map(|i| input_item(i.take())).collect::<Result<Vec<_>, _>>()?
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
        let or = |k: &str, default: Value| doc.get(k).filter(|v| !v.is_null()).cloned().unwrap_or(default);
        Ok(Turn {
            model,
            input,
            instructions: opt_str(&doc, "instructions")?,
            previous,
            conversation,
            store: flag("store", true),
            stream: flag("stream", false),
            tools,
            mcp,
            tool_choice: or("tool_choice", Value::from("auto")),
            temperature: opt_f64(&doc, "temperature")?,
            top_p: opt_f64(&doc, "top_p")?,
            max_output_tokens,
            parallel_tool_calls: flag("parallel_tool_calls", true),
            max_tool_calls: doc.get("max_tool_calls").and_then(|v| v.as_u64()),
            metadata: or("metadata", Value::new_object()),
            text: or("text", json!({"format": {"type": "text"}})),
            reasoning: or("reasoning", json!({"effort": null, "summary": null})),
            user: opt_str(&doc, "user")?,
        })
    }

    /// The chat body for the engine: `history` (earlier items, oldest first), then this
    /// turn's input; `extra_tools` are chat-shaped tools offered beside the function tools
    /// (the MCP servers' tools).
    pub fn chat(&self, history: &[Value], extra_tools: &[Value], stream: bool) -> Value {
        self.chat_after(history.iter().chain(self.input.iter()), extra_tools, stream)
    }

    /// The chat body for `items`, every item the model reads after the instructions.
    pub(crate) fn chat_after<'a>(
        &self,
        items: impl Iterator<Item = &'a Value>,
        extra_tools: &[Value],
        stream: bool,
    ) -> Value {
        let mut messages: Vec<Value> = Vec::with_capacity(8);
        if let Some(i) = &self.instructions {
            messages.push(json!({"role": "system", "content": i.as_str()}));
        }
        for item in items {
            push_message(&mut messages, item);
        }
        let mut chat = json!({"model": self.model.as_str(), "messages": messages, "stream": stream});
        let obj = chat.as_object_mut().expect("an object");
        if stream {
            obj.insert("stream_options", json!({"include_usage": true}));
        }
        let tools: Vec<Value> = self.tools.iter().map(chat_tool).chain(extra_tools.iter().cloned()).collect();
        if !tools.is_empty() {
            obj.insert("tools", tools);
            obj.insert("tool_choice", chat_tool_choice(&self.tool_choice));
            obj.insert("parallel_tool_calls", self.parallel_tool_calls);
        }
        if let Some(t) = self.temperature {
            obj.insert("temperature", Value::new_f64(t).unwrap_or_default());
        }
        if let Some(p) = self.top_p {
            obj.insert("top_p", Value::new_f64(p).unwrap_or_default());
        }
        if let Some(m) = self.max_output_tokens {
            obj.insert("max_completion_tokens", m);
        }
        if let Some(format) = self.text.get("format") {
            match format.get("type").and_then(|t| t.as_str()) {
                Some("json_object") => {
                    obj.insert("response_format", json!({"type": "json_object"}));
                }
                Some("json_schema") => {
                    let mut schema = json!({"name": format.get("name").and_then(|n| n.as_str()).unwrap_or("schema")});
                    let s = schema.as_object_mut().expect("an object");
                    if let Some(v) = format.get("schema") {
                        s.insert("schema", v.clone());
                    }
                    if let Some(v) = format.get("strict") {
                        s.insert("strict", v.clone());
                    }
                    obj.insert("response_format", json!({"type": "json_schema", "json_schema": schema}));
                }
                _ => {}
            }
        }
        if let Some(effort) = self.reasoning.get("effort").and_then(|e| e.as_str()) {
            obj.insert("reasoning_effort", effort);
        }
        chat
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

/// Appends one item's chat message(s).
fn push_message(messages: &mut Vec<Value>, item: &Value) {
    let s = |k: &str| item.get(k).and_then(|v| v.as_str()).unwrap_or("");
    match item.get("type").and_then(|t| t.as_str()).unwrap_or("message") {
        "message" => {
            let role = match s("role") {
                "assistant" => "assistant",
                "system" | "developer" => "system",
                _ => "user",
            };
            messages.push(json!({"role": role, "content": message_text(item).as_ref()}));
        }
        "function_call" => push_call(messages, s("call_id"), s("name"), s("arguments")),
        "function_call_output" => {
            let output = match item.get("output") {
                Some(o) if o.is_str() => o.as_str().unwrap_or("").to_string(),
                Some(o) => message_text(&json!({"content": o})).into_owned(),
                None => String::new(),
            };
            messages.push(json!({"role": "tool", "tool_call_id": s("call_id"), "content": output}));
        }
        // An MCP call the gateway ran: the call, then its output, as the model saw them.
        "mcp_call" => {
            let id = s("id");
            push_call(messages, id, s("name"), s("arguments"));
            let output =
                item.get("output").and_then(|o| o.as_str()).or_else(|| item.get("error").and_then(|e| e.as_str()));
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": output.unwrap_or("")}));
        }
        // Reasoning and tool listings are not replayed (chat templates drop earlier reasoning).
        _ => {}
    }
}

/// An assistant tool call; a call right after another joins its message (parallel calls).
fn push_call(messages: &mut Vec<Value>, id: &str, name: &str, arguments: &str) {
    let call = json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}});
    if let Some(last) = messages.last_mut() {
        let joins = last.get("role").and_then(|r| r.as_str()) == Some("assistant")
            && last.get("tool_calls").is_some_and(|c| c.is_array());
        if joins {
            if let Some(calls) = last.get_mut("tool_calls").and_then(|c| c.as_array_mut()) {
                calls.push(call);
                return;
            }
        }
    }
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
}

/// A stored chain's items as the next turn's history: each turn's input, then its output.
pub fn chain_items(chain: &[crate::responses::store::StoredResponse]) -> Vec<Value> {
    chain
        .iter()
        .flat_map(|r| r.input.iter().chain(r.output.iter()))
        .map(|s| sonic_rs::from_str(s).unwrap_or_default())
        .collect()
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
