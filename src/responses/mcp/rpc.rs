//! MCP's JSON-RPC 2.0 messages over Streamable HTTP (sans I/O): the bodies the gateway
//! POSTs (`initialize`, the `notifications/initialized` notification, `tools/list`,
//! `tools/call`), and the reply read from a response that is one JSON message or an SSE
//! stream of them (the server may send requests and notifications before our reply).

use sonic_rs::{json, JsonContainerTrait, JsonValueTrait, Value};

/// The protocol revision the gateway speaks (MCP 2025-06-18).
pub(crate) const PROTOCOL_VERSION: &str = "2025-06-18";

pub(crate) fn initialize(id: u64) -> Vec<u8> {
    let v = json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "smg", "version": env!("CARGO_PKG_VERSION")},
        },
    });
    sonic_rs::to_vec(&v).unwrap_or_default()
}

pub(crate) fn initialized() -> Vec<u8> {
    br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_vec()
}

pub(crate) fn list_tools(id: u64, cursor: Option<&str>) -> Vec<u8> {
    let params = match cursor {
        Some(c) => json!({"cursor": c}),
        None => json!({}),
    };
    sonic_rs::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params})).unwrap_or_default()
}

pub(crate) fn call_tool(id: u64, name: &str, arguments: &Value) -> Vec<u8> {
    let v =
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}});
    sonic_rs::to_vec(&v).unwrap_or_default()
}

/// What a reply said.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reply {
    Result(Value),
    /// A JSON-RPC error: its message.
    Error(String),
}

/// The reply to request `id` in `body`, a JSON message or an SSE stream (`sse`); None
/// while it has not arrived (an SSE stream read so far).
pub(crate) fn reply(body: &[u8], sse: bool, id: u64) -> Option<Reply> {
    if !sse {
        let v: Value = sonic_rs::from_slice(body).ok()?;
        // A batch answers with an array.
        if let Some(a) = v.as_array() {
            return a.iter().find_map(|m| of_message(m, id));
        }
        return of_message(&v, id);
    }
    // SSE: events end with a blank line; each event's `data:` lines joined by newlines.
    let text = String::from_utf8_lossy(body);
    for event in text.replace("\r\n", "\n").split("\n\n") {
        let data: Vec<&str> =
            event.lines().filter_map(|l| l.strip_prefix("data:")).map(|d| d.strip_prefix(' ').unwrap_or(d)).collect();
        if data.is_empty() {
            continue;
        }
        if let Ok(v) = sonic_rs::from_str::<Value>(&data.join("\n")) {
            if let Some(r) = of_message(&v, id) {
                return Some(r);
            }
        }
    }
    None
}

fn of_message(v: &Value, id: u64) -> Option<Reply> {
    if v.get("id").and_then(|i| i.as_u64()) != Some(id) {
        return None;
    }
    if let Some(e) = v.get("error") {
        let msg = e.get("message").and_then(|m| m.as_str()).unwrap_or("error");
        return Some(Reply::Error(msg.to_string()));
    }
    Some(Reply::Result(v.get("result").cloned().unwrap_or_default()))
}

/// A tool as `tools/list` describes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of its arguments.
    pub input_schema: Value,
    pub annotations: Value,
}

/// The tools of a `tools/list` result, and the next page's cursor.
pub(crate) fn tools(result: &Value) -> (Vec<Tool>, Option<String>) {
    let list = result.get("tools").and_then(|t| t.as_array());
    let tools = list
        .map(|a| {
            a.iter()
                .filter_map(|t| {
                    Some(Tool {
                        name: t.get("name")?.as_str()?.to_string(),
                        description: t.get("description").and_then(|d| d.as_str()).map(str::to_string),
                        input_schema: t.get("inputSchema").cloned().unwrap_or_else(|| json!({"type": "object"})),
                        annotations: t.get("annotations").cloned().unwrap_or_default(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let next = result.get("nextCursor").and_then(|c| c.as_str()).map(str::to_string);
    (tools, next)
}

/// A `tools/call` result as the model reads it: its text content joined, and whether the
/// tool said it failed (`isError`).
pub(crate) fn call_output(result: &Value) -> (String, bool) {
    let mut text = String::new();
    if let Some(parts) = result.get("content").and_then(|c| c.as_array()) {
        for p in parts.iter() {
            match p.get("type").and_then(|t| t.as_str()) {
                Some("text") => text.push_str(p.get("text").and_then(|t| t.as_str()).unwrap_or("")),
                // Other content (images, resources) is given to the model as its JSON.
                _ => text.push_str(&sonic_rs::to_string(p).unwrap_or_default()),
            }
        }
    }
    if text.is_empty() {
        if let Some(s) = result.get("structuredContent") {
            text = sonic_rs::to_string(s).unwrap_or_default();
        }
    }
    (text, result.get("isError").and_then(|e| e.as_bool()).unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_found_in_json_and_in_an_sse_stream_after_other_messages() {
        let json = br#"{"jsonrpc":"2.0","id":3,"result":{"tools":[{"name":"t","inputSchema":{"type":"object"}}],"nextCursor":"p2"}}"#;
        let Some(Reply::Result(r)) = reply(json, false, 3) else { panic!() };
        let (tools, next) = tools(&r);
        assert_eq!(tools[0].name, "t");
        assert_eq!(next.as_deref(), Some("p2"));
        assert_eq!(reply(json, false, 4), None);
        let sse = b"event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\r\n\r\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\n\
data: \"error\":{\"code\":-32601,\"message\":\"no such tool\"}}\n\n";
        assert_eq!(reply(sse, true, 7), Some(Reply::Error("no such tool".into())));
        assert_eq!(reply(&sse[..40], true, 7), None, "not arrived yet");
    }

    #[test]
    fn a_call_result_is_its_text() {
        let r: Value = sonic_rs::from_str(
            r#"{"content":[{"type":"text","text":"21C"},{"type":"text","text":" sunny"}],"isError":false}"#,
        )
        .unwrap();
        assert_eq!(call_output(&r), ("21C sunny".to_string(), false));
        let r: Value = sonic_rs::from_str(r#"{"content":[{"type":"text","text":"bad city"}],"isError":true}"#).unwrap();
        assert_eq!(call_output(&r), ("bad city".to_string(), true));
    }
}
