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
    /// The object's fields that echo the request, in OpenAI's order.
    echo: Vec<(&'static str, Value)>,
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
    fn json(&self) -> Value {
        json!({
            "input_tokens": self.input,
            "input_tokens_details": {"cached_tokens": self.cached},
            "output_tokens": self.output,
            "output_tokens_details": {"reasoning_tokens": self.reasoning},
            "total_tokens": self.input + self.output,
        })
    }

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
        Shell { id, created_at, echo }
    }

    /// The object in a state: `in_progress` (no output, no usage yet) or ended.
    pub(crate) fn object(&self, ending: Option<Ending>, output: &[Value], usage: Option<Usage>) -> Value {
        let status = match ending {
            None => "in_progress",
            Some(Ending::Completed) => "completed",
            Some(Ending::Incomplete(_)) => "incomplete",
            Some(Ending::Failed) => "failed",
        };
        let error = match ending {
            Some(Ending::Failed) => json!({"code": "server_error", "message": "the engine failed the response"}),
            _ => Value::new_null(),
        };
        let incomplete = match ending {
            Some(Ending::Incomplete(reason)) => json!({"reason": reason}),
            _ => Value::new_null(),
        };
        let (id, created, output) =
            (Value::from(self.id.as_str()), Value::from(self.created_at), output.to_vec().into());
        let usage = usage.map_or(Value::new_null(), |u| u.json());
        let status = Value::from(status);
        let object = Value::from("response");
        let mut pairs: Vec<(&str, &Value)> = vec![
            ("id", &id),
            ("object", &object),
            ("created_at", &created),
            ("status", &status),
            ("error", &error),
            ("incomplete_details", &incomplete),
        ];
        pairs.extend(self.echo.iter().map(|(k, v)| (*k, v)));
        pairs.push(("output", &output));
        pairs.push(("usage", &usage));
        ordered(&pairs)
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

pub(crate) fn message_item(id: &str, text: &str, status: &str) -> Value {
    let part = ordered(&[
        ("type", &Value::from("output_text")),
        ("text", &Value::from(text)),
        ("annotations", &Value::new_array()),
        ("logprobs", &Value::new_array()),
    ]);
    let content: Value = vec![part].into();
    ordered(&[
        ("type", &Value::from("message")),
        ("id", &Value::from(id)),
        ("status", &Value::from(status)),
        ("role", &Value::from("assistant")),
        ("content", &content),
    ])
}

pub(crate) fn reasoning_item(id: &str, text: &str) -> Value {
    let part = ordered(&[("type", &Value::from("reasoning_text")), ("text", &Value::from(text))]);
    let content: Value = vec![part].into();
    ordered(&[
        ("type", &Value::from("reasoning")),
        ("id", &Value::from(id)),
        ("summary", &Value::new_array()),
        ("content", &content),
    ])
}

pub(crate) fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    ordered(&[
        ("type", &Value::from("function_call")),
        ("id", &Value::from(id)),
        ("call_id", &Value::from(call_id)),
        ("name", &Value::from(name)),
        ("arguments", &Value::from(arguments)),
        ("status", &Value::from(status)),
    ])
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
        ("approval_request_id", &Value::new_null()),
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
