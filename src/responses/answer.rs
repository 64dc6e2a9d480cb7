//! The response object (sans I/O): a turn's echoed fields, the output items made from the
//! engine's chat answer, its status and usage. `Shell` builds the object for every state the
//! stream reports (created, in progress, completed) and for `GET /v1/responses/{id}`.

use sonic_rs::{json, JsonContainerTrait, JsonValueTrait, Value};

use super::ordered;
use super::turn::{new_id, Turn};

/// What every state of one response shares.
#[derive(Debug, Clone)]
pub(crate) struct Shell {
    pub id: String,
    pub created_at: u64,
    /// The object's fields that echo the request, in OpenAI's order, as JSON text
    /// (`,"instructions":…,"conversation":…`), written once per turn.
    echo: Vec<u8>,
}

/// Usage in the Responses shape.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub input: u64,
    pub cached: u64,
    pub output: u64,
    pub reasoning: u64,
}

impl Usage {
    pub(crate) fn add(&mut self, o: Usage) {
        self.input += o.input;
        self.cached += o.cached;
        self.output += o.output;
        self.reasoning += o.reasoning;
    }

    /// From a chat answer's `usage`.
    pub(crate) fn of_chat(u: Option<&Value>) -> Usage {
        let n = |p: &[&str]| {
            let mut v = u;
            for k in p {
                v = v.and_then(|x| x.get(*k));
            }
            v.and_then(|x| x.as_u64()).unwrap_or(0)
        };
        Usage {
            input: n(&["prompt_tokens"]),
            cached: n(&["prompt_tokens_details", "cached_tokens"]),
            output: n(&["completion_tokens"]),
            reasoning: n(&["completion_tokens_details", "reasoning_tokens"]),
        }
    }
}

/// How the engine's answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    Completed,
    /// Cut short: `max_output_tokens` (the engine's `finish_reason: length`), or
    /// `max_tool_calls` (the MCP loop's bound).
    Incomplete(&'static str),
    Failed,
}

impl Ending {
    pub(crate) fn of_finish(reason: Option<&str>) -> Ending {
        match reason {
            Some("length") => Ending::Incomplete("max_output_tokens"),
            _ => Ending::Completed,
        }
    }
}

// === impl Shell ===

impl Shell {
    pub(crate) fn new(turn: &Turn, id: String, created_at: u64, model: &str) -> Shell {
        let opt = |s: &Option<String>| s.as_deref().map_or(Value::new_null(), Value::from);
        let num = |f: Option<f64>, d: f64| Value::new_f64(f.unwrap_or(d)).unwrap_or_default();
        let mut tools: Vec<Value> = turn.tools.clone();
        // An MCP server's credentials are sent to it, never echoed or stored.
        tools.extend(turn.mcp.iter().map(|t| {
            let kept: Vec<(&str, &Value)> = t
                .as_object()
                .map(|o| o.iter().filter(|(k, _)| !matches!(*k, "authorization" | "headers")).collect())
                .unwrap_or_default();
            ordered(&kept)
        }));
        let conversation = turn.conversation.as_deref().map_or(Value::new_null(), |c| json!({"id": c}));
        let echo = vec![
            ("instructions", opt(&turn.instructions)),
            ("max_output_tokens", turn.max_output_tokens.map_or(Value::new_null(), Value::from)),
            ("max_tool_calls", turn.max_tool_calls.map_or(Value::new_null(), Value::from)),
            ("metadata", turn.metadata.clone()),
            ("model", Value::from(model)),
            ("parallel_tool_calls", Value::from(turn.parallel_tool_calls)),
            ("previous_response_id", opt(&turn.previous)),
            ("reasoning", turn.reasoning.clone()),
            ("store", Value::from(turn.store)),
            ("temperature", num(turn.temperature, 1.0)),
            ("text", turn.text.clone()),
            ("tool_choice", turn.tool_choice.clone()),
            ("tools", tools.into()),
            ("top_p", num(turn.top_p, 1.0)),
            ("truncation", Value::from("disabled")),
            ("user", opt(&turn.user)),
            ("conversation", conversation),
        ];
        let mut text = Vec::with_capacity(512);
        for (k, v) in echo {
            text.extend_from_slice(b",\"");
            text.extend_from_slice(k.as_bytes());
            text.extend_from_slice(b"\":");
            let _ = sonic_rs::to_writer(&mut text, &v);
        }
        Shell { id, created_at, echo: text }
    }

    /// The object in a state: `in_progress` (no output, no usage yet) or ended.
    pub(crate) fn object(&self, ending: Option<Ending>, output: &[Value], usage: Option<Usage>) -> Value {
        let output: Vec<String> = output.iter().map(|v| sonic_rs::to_string(v).unwrap_or_default()).collect();
        sonic_rs::from_str(&self.object_json(ending, &output, usage)).unwrap_or_default()
    }

    /// [`Shell::object`] as the JSON text, written once in OpenAI's key order, from its
    /// output items' JSON (what a non-streamed turn answers, and stores with those items).
    pub(crate) fn object_json(&self, ending: Option<Ending>, output: &[String], usage: Option<Usage>) -> String {
        let status = match ending {
            None => "in_progress",
            Some(Ending::Completed) => "completed",
            Some(Ending::Incomplete(_)) => "incomplete",
            Some(Ending::Failed) => "failed",
        };
        let mut s: Vec<u8> = Vec::with_capacity(1024 + output.iter().map(String::len).sum::<usize>());
        s.extend_from_slice(b"{\"id\":");
        smg_wire::json::put_str(&mut s, &self.id);
        s.extend_from_slice(b",\"object\":\"response\",\"created_at\":");
        smg_wire::num::put_dec(&mut s, self.created_at);
        s.extend_from_slice(b",\"status\":\"");
        s.extend_from_slice(status.as_bytes());
        s.extend_from_slice(b"\",\"error\":");
        match ending {
            Some(Ending::Failed) => {
                s.extend_from_slice(br#"{"code":"server_error","message":"the engine failed the response"}"#)
            }
            _ => s.extend_from_slice(b"null"),
        }
        s.extend_from_slice(b",\"incomplete_details\":");
        match ending {
            Some(Ending::Incomplete(reason)) => {
                s.extend_from_slice(b"{\"reason\":\"");
                s.extend_from_slice(reason.as_bytes());
                s.extend_from_slice(b"\"}");
            }
            _ => s.extend_from_slice(b"null"),
        }
        s.extend_from_slice(&self.echo);
        s.extend_from_slice(b",\"output\":[");
        for (i, item) in output.iter().enumerate() {
            if i > 0 {
                s.push(b',');
            }
            s.extend_from_slice(item.as_bytes());
        }
        s.extend_from_slice(b"],\"usage\":");
        match usage {
            Some(u) => {
                let n = |s: &mut Vec<u8>, k: &[u8], v: u64| {
                    s.extend_from_slice(k);
                    smg_wire::num::put_dec(s, v);
                };
                n(&mut s, b"{\"input_tokens\":", u.input);
                n(&mut s, b",\"input_tokens_details\":{\"cached_tokens\":", u.cached);
                n(&mut s, b"},\"output_tokens\":", u.output);
                n(&mut s, b",\"output_tokens_details\":{\"reasoning_tokens\":", u.reasoning);
                n(&mut s, b"},\"total_tokens\":", u.input + u.output);
                s.push(b'}');
            }
            None => s.extend_from_slice(b"null"),
        }
        s.push(b'}');
        String::from_utf8(s).unwrap_or_default()
    }
}

/// The output items of a chat answer's first choice: reasoning, then the message, then
/// each tool call as a `function_call` item.
pub(crate) fn output_of_chat(chat: &Value) -> (Vec<Value>, Ending) {
    let choice = chat.get("choices").and_then(|c| c.get(0));
    let message = choice.and_then(|c| c.get("message"));
    let s = |k: &str| message.and_then(|m| m.get(k)).and_then(|v| v.as_str()).filter(|t| !t.is_empty());
    let mut out = Vec::new();
    if let Some(r) = s("reasoning_content") {
        out.push(reasoning_item(&new_id("rs"), r));
    }
    if let Some(text) = s("content") {
        out.push(message_item(&new_id("msg"), text, "completed"));
    }
    if let Some(calls) = message.and_then(|m| m.get("tool_calls")).and_then(|c| c.as_array()) {
        for call in calls.iter() {
            let f = |k: &str| call.get("function").and_then(|f| f.get(k)).and_then(|v| v.as_str()).unwrap_or("");
            let call_id = call.get("id").and_then(|v| v.as_str()).unwrap_or("");
            out.push(call_item(&new_id("fc"), call_id, f("name"), f("arguments"), "completed"));
        }
    }
    let finish = choice.and_then(|c| c.get("finish_reason")).and_then(|f| f.as_str());
    (out, Ending::of_finish(finish))
}

/// An item from its JSON text, written in OpenAI's key order (one parse, where building it
/// key by key would lose the order).
fn item(text: &[u8]) -> Value {
    sonic_rs::from_slice(text).unwrap_or_default()
}

fn put(out: &mut Vec<u8>, key: &[u8], value: &str) {
    out.extend_from_slice(key);
    smg_wire::json::put_str(out, value);
}

/// The output items of a turn's answer taken from the assembler (its first choice): as
/// [`output_of_chat`], without a chat JSON in between.
pub(crate) fn output_of_parts(
    text: &str,
    reasoning: &str,
    calls: &[crate::grpc::reply::CallOut],
    finish: &str,
) -> (Vec<Value>, Ending) {
    let mut out = Vec::new();
    if !reasoning.is_empty() {
        out.push(reasoning_item(&new_id("rs"), reasoning));
    }
    if !text.is_empty() {
        out.push(message_item(&new_id("msg"), text, "completed"));
    }
    for c in calls {
        out.push(call_item(&new_id("fc"), &c.id, &c.name, &c.arguments, "completed"));
    }
    (out, Ending::of_finish(crate::grpc::reply::finish_reason(finish)))
}

/// A generation's usage in the Responses shape.
pub(crate) fn usage_of(u: &crate::grpc::reply::Usage) -> Usage {
    Usage { input: u.prompt, cached: u.cached, output: u.completion, reasoning: u.reasoning }
}

pub(crate) fn message_item(id: &str, text: &str, status: &str) -> Value {
    let mut s = Vec::with_capacity(128 + text.len());
    put(&mut s, b"{\"type\":\"message\",\"id\":", id);
    put(&mut s, b",\"status\":", status);
    put(&mut s, b",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":", text);
    s.extend_from_slice(b",\"annotations\":[],\"logprobs\":[]}]}");
    item(&s)
}

pub(crate) fn reasoning_item(id: &str, text: &str) -> Value {
    let mut s = Vec::with_capacity(96 + text.len());
    put(&mut s, b"{\"type\":\"reasoning\",\"id\":", id);
    put(&mut s, b",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":", text);
    s.extend_from_slice(b"}]}");
    item(&s)
}

pub(crate) fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    let mut s = Vec::with_capacity(128 + arguments.len());
    put(&mut s, b"{\"type\":\"function_call\",\"id\":", id);
    put(&mut s, b",\"call_id\":", call_id);
    put(&mut s, b",\"name\":", name);
    put(&mut s, b",\"arguments\":", arguments);
    put(&mut s, b",\"status\":", status);
    s.push(b'}');
    item(&s)
}

/// A server's tools as the response lists them (`mcp_list_tools`).
pub(crate) fn listing_item(id: &str, label: &str, tools: &[crate::responses::mcp::Tool]) -> Value {
    let tools: Vec<Value> = tools
        .iter()
        .map(|t| {
            let description = t.description.as_deref().map_or(Value::new_null(), Value::from);
            ordered(&[
                ("name", &Value::from(t.name.as_str())),
                ("description", &description),
                ("input_schema", &t.input_schema),
                ("annotations", &t.annotations),
            ])
        })
        .collect();
    ordered(&[
        ("type", &Value::from("mcp_list_tools")),
        ("id", &Value::from(id)),
        ("server_label", &Value::from(label)),
        ("tools", &tools.into()),
        ("error", &Value::new_null()),
    ])
}

/// A call the gateway ran on an MCP server (`mcp_call`): its output, or its error.
pub(crate) fn mcp_call_item(
    id: &str,
    label: &str,
    name: &str,
    arguments: &str,
    result: Option<&Result<String, String>>,
) -> Value {
    mcp_call_item_approved(id, label, name, arguments, result, None)
}

/// An approval request's item: the call the model made, waiting for the client's answer.
pub(crate) fn approval_request_item(id: &str, label: &str, name: &str, arguments: &str) -> Value {
    let mut s = Vec::with_capacity(128 + arguments.len());
    put(&mut s, b"{\"type\":\"mcp_approval_request\",\"id\":", id);
    put(&mut s, b",\"server_label\":", label);
    put(&mut s, b",\"name\":", name);
    put(&mut s, b",\"arguments\":", arguments);
    s.push(b'}');
    item(&s)
}

/// [`mcp_call_item`] of a call the client answered (`approval_request_id`).
pub(crate) fn mcp_call_item_approved(
    id: &str,
    label: &str,
    name: &str,
    arguments: &str,
    result: Option<&Result<String, String>>,
    approval: Option<&str>,
) -> Value {
    let (output, error, status) = match result {
        None => (Value::new_null(), Value::new_null(), "in_progress"),
        Some(Ok(o)) => (Value::from(o.as_str()), Value::new_null(), "completed"),
        Some(Err(e)) => (Value::new_null(), Value::from(e.as_str()), "failed"),
    };
    ordered(&[
        ("type", &Value::from("mcp_call")),
        ("id", &Value::from(id)),
        ("server_label", &Value::from(label)),
        ("name", &Value::from(name)),
        ("arguments", &Value::from(arguments)),
        ("output", &output),
        ("error", &error),
        ("status", &Value::from(status)),
        ("approval_request_id", &approval.map_or(Value::new_null(), Value::from)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_answer_becomes_reasoning_message_and_calls() {
        let chat: Value = sonic_rs::from_str(
            r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"hi","reasoning_content":"think",
                "tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
                "finish_reason":"tool_calls"}],
                "usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":2}}}"#,
        )
        .unwrap();
        let (out, ending) = output_of_chat(&chat);
        let types: Vec<_> = out.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["reasoning", "message", "function_call"]);
        assert_eq!(out[2]["call_id"].as_str(), Some("call_1"));
        assert_eq!(out[2]["arguments"].as_str(), Some("{\"a\":1}"));
        assert_eq!(ending, Ending::Completed);
        let u = Usage::of_chat(chat.get("usage"));
        assert_eq!(u, Usage { input: 7, cached: 2, output: 3, reasoning: 0 });
    }

    #[test]
    fn the_object_echoes_the_request_and_says_why_it_is_incomplete() {
        let turn = Turn::read(br#"{"model":"m","input":"x","max_output_tokens":3,"metadata":{"k":"v"}}"#).unwrap();
        let shell = Shell::new(&turn, "resp_1".into(), 5, "m");
        let o = shell.object(Some(Ending::Incomplete("max_output_tokens")), &[], Some(Usage::default()));
        assert_eq!(o["status"].as_str(), Some("incomplete"));
        assert_eq!(o["incomplete_details"]["reason"].as_str(), Some("max_output_tokens"));
        assert_eq!(o["max_output_tokens"].as_u64(), Some(3));
        assert_eq!(o["metadata"]["k"].as_str(), Some("v"));
        assert_eq!(o["store"].as_bool(), Some(true));
        assert!(shell.object(None, &[], None)["usage"].is_null());
    }
}
