//! A chat request as a Harmony prompt (gpt-oss's format; the text holds the special tokens,
//! which the tokenizer turns into their ids):
//!
//! - a system message: the model's identity, the date, `Reasoning: <effort>`, the valid
//!   channels, and (with tools) that function calls go to `commentary`;
//! - a developer message: the request's system and developer messages as `# Instructions`, and
//!   its functions as a TypeScript namespace `functions` (`# Tools`);
//! - the conversation: user turns; an assistant's earlier answer on `final` (its reasoning
//!   dropped, as Harmony wants), or its calls on `commentary` to `functions.NAME` (with the
//!   reasoning that led to them on `analysis`); a tool's result from `functions.NAME` to the
//!   assistant;
//! - `<|start|>assistant`, where the answer begins.
//!
//! What has no Harmony form is refused with `400 harmony_build_failed`: a content part that is
//! not text, a tool that is not a function, a message of an unknown role.

use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};

use crate::grpc::refusal::Refusal;

fn failed(message: impl Into<String>) -> Refusal {
    Refusal::new(400, "harmony_build_failed", message)
}

/// The prompt of chat request `body`, dated `today` (`YYYY-MM-DD`), at reasoning `effort`.
pub fn prompt(body: &Value, today: &str, effort: &str) -> Result<String, Refusal> {
    let empty = Vec::new();
    let messages: Vec<&Value> = match body.get("messages").and_then(|m| m.as_array()) {
        Some(a) => a.iter().collect(),
        None => empty,
    };
    let functions = functions(body)?;
    let mut out = String::with_capacity(1024);
    out.push_str("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: ");
    out.push_str(today);
    out.push_str("\n\nReasoning: ");
    out.push_str(effort);
    out.push_str("\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.");
    if !functions.is_empty() {
        out.push_str("\nCalls to these tools must go to the commentary channel: 'functions'.");
    }
    out.push_str("<|end|>");

    let mut instructions = Vec::new();
    for m in &messages {
        if matches!(role(m), "system" | "developer") {
            instructions.push(text_of(m)?);
        }
    }
    if !instructions.is_empty() || !functions.is_empty() {
        out.push_str("<|start|>developer<|message|>");
        if !instructions.is_empty() {
            out.push_str("# Instructions\n\n");
            out.push_str(&instructions.join("\n\n"));
            if !functions.is_empty() {
                out.push_str("\n\n");
            }
        }
        if !functions.is_empty() {
            out.push_str("# Tools\n\n## functions\n\nnamespace functions {\n\n");
            out.push_str(&functions);
            out.push_str("} // namespace functions");
        }
        out.push_str("<|end|>");
    }

    // A tool result names its function through the call it answers.
    let mut call_names: Vec<(&str, &str)> = Vec::new();
    for m in messages.iter().filter(|m| role(m) == "assistant") {
        for c in m.get("tool_calls").and_then(|c| c.as_array()).into_iter().flat_map(|a| a.iter()) {
            let id = c.get("id").and_then(|v| v.as_str()).unwrap_or("");
            let name = c.get("function").and_then(|f| f.get("name")).and_then(|v| v.as_str()).unwrap_or("");
            call_names.push((id, name));
        }
    }
    for m in &messages {
        match role(m) {
            "system" | "developer" => {}
            "user" => message(&mut out, "user", &text_of(m)?, "<|end|>"),
            "assistant" => assistant(&mut out, m)?,
            "tool" => {
                let id = m.get("tool_call_id").and_then(|v| v.as_str()).unwrap_or("");
                let name = call_names.iter().find(|(i, _)| *i == id).map_or(id, |(_, n)| n);
                let header = format!("functions.{name} to=assistant<|channel|>commentary");
                message(&mut out, &header, &text_of(m)?, "<|end|>");
            }
            "function" => {
                let name = m.get("name").and_then(|v| v.as_str()).unwrap_or("");
                let header = format!("functions.{name} to=assistant<|channel|>commentary");
                message(&mut out, &header, &text_of(m)?, "<|end|>");
            }
            other => return Err(failed(format!("a message of role '{other}' has no Harmony form"))),
        }
    }
    out.push_str("<|start|>assistant");
    Ok(out)
}

fn role(m: &Value) -> &str {
    m.get("role").and_then(|r| r.as_str()).unwrap_or("")
}

fn message(out: &mut String, header: &str, body: &str, end: &str) {
    out.push_str("<|start|>");
    out.push_str(header);
    out.push_str("<|message|>");
    out.push_str(body);
    out.push_str(end);
}

/// An earlier assistant turn: its calls (after the reasoning that made them), else its answer.
fn assistant(out: &mut String, m: &Value) -> Result<(), Refusal> {
    let calls: Vec<&Value> =
        m.get("tool_calls").and_then(|c| c.as_array()).map(|a| a.iter().collect()).unwrap_or_default();
    let text = text_of(m)?;
    if calls.is_empty() {
        message(out, "assistant<|channel|>final", &text, "<|end|>");
        return Ok(());
    }
    if let Some(r) = m.get("reasoning_content").and_then(|r| r.as_str()).filter(|r| !r.is_empty()) {
        message(out, "assistant<|channel|>analysis", r, "<|end|>");
    }
    if !text.is_empty() {
        message(out, "assistant<|channel|>commentary", &text, "<|end|>");
    }
    for c in calls {
        let f = c.get("function");
        let name = f.and_then(|f| f.get("name")).and_then(|v| v.as_str()).unwrap_or("");
        let args = f.and_then(|f| f.get("arguments")).and_then(|v| v.as_str()).unwrap_or("{}");
        let header = format!("assistant<|channel|>commentary to=functions.{name} <|constrain|>json");
        message(out, &header, args, "<|call|>");
    }
    Ok(())
}

/// A message's text: a string, or its text parts joined; null is empty.
fn text_of(m: &Value) -> Result<String, Refusal> {
    let Some(content) = m.get("content").filter(|c| !c.is_null()) else { return Ok(String::new()) };
    if let Some(s) = content.as_str() {
        return Ok(s.to_string());
    }
    let Some(parts) = content.as_array() else {
        return Err(failed("message content must be a string or an array of content parts"));
    };
    let mut text = String::new();
    for p in parts.iter() {
        match (p.get("type").and_then(|t| t.as_str()), p.get("text").and_then(|t| t.as_str())) {
            (Some("text"), Some(t)) => text.push_str(t),
            (kind, _) => {
                let kind = kind.unwrap_or("(none)");
                return Err(failed(format!("content part of type '{kind}' cannot be rendered for a Harmony model")));
            }
        }
    }
    Ok(text)
}

/// The request's functions as TypeScript declarations, each followed by a blank line.
fn functions(body: &Value) -> Result<String, Refusal> {
    let mut out = String::new();
    let Some(tools) = body.get("tools").and_then(|t| t.as_array()) else { return Ok(out) };
    for t in tools.iter() {
        let kind = t.get("type").and_then(|k| k.as_str()).unwrap_or("function");
        let f = t.get("function").filter(|_| kind == "function");
        let Some(name) = f.and_then(|f| f.get("name")).and_then(|n| n.as_str()) else {
            return Err(failed(format!("a tool of type '{kind}' has no Harmony form")));
        };
        if let Some(d) = f.and_then(|f| f.get("description")).and_then(|d| d.as_str()).filter(|d| !d.is_empty()) {
            comment(&mut out, d);
        }
        out.push_str("type ");
        out.push_str(name);
        let params = f.and_then(|f| f.get("parameters"));
        let props = params.and_then(|p| p.get("properties")).and_then(|p| p.as_object()).filter(|p| !p.is_empty());
        match (params, props) {
            (Some(p), Some(_)) => {
                out.push_str(" = (_: ");
                ts_type(&mut out, p, 0);
                out.push_str(") => any;\n\n");
            }
            _ => out.push_str(" = () => any;\n\n"),
        }
    }
    Ok(out)
}

/// `// text` lines.
fn comment(out: &mut String, text: &str) {
    for line in text.lines() {
        out.push_str("// ");
        out.push_str(line);
        out.push('\n');
    }
}

/// A JSON Schema as a TypeScript type: objects as `{ … }` with one commented member per
/// line (`name?:` when not required, its default after it), arrays as `T[]`, enums and
/// `anyOf`/`oneOf` as unions, anything unknown as `any`. Nesting is bounded (the contract
/// bounded the body's depth already).
fn ts_type(out: &mut String, schema: &Value, depth: usize) {
    if depth > 16 {
        out.push_str("any");
        return;
    }
    if let Some(values) = schema.get("enum").and_then(|e| e.as_array()) {
        let alts: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        out.push_str(&alts.join(" | "));
        return;
    }
    if let Some(alts) = schema.get("anyOf").or_else(|| schema.get("oneOf")).and_then(|a| a.as_array()) {
        for (i, a) in alts.iter().enumerate() {
            if i > 0 {
                out.push_str(" | ");
            }
            ts_type(out, a, depth + 1);
        }
        return;
    }
    if let Some(types) = schema.get("type").and_then(|t| t.as_array()) {
        let alts: Vec<&str> = types.iter().filter_map(|t| t.as_str()).collect();
        for (i, t) in alts.iter().enumerate() {
            if i > 0 {
                out.push_str(" | ");
            }
            scalar_or_container(out, t, schema, depth);
        }
        return;
    }
    let t = schema.get("type").and_then(|t| t.as_str()).unwrap_or(if schema.get("properties").is_some() {
        "object"
    } else {
        ""
    });
    scalar_or_container(out, t, schema, depth);
}

fn scalar_or_container(out: &mut String, t: &str, schema: &Value, depth: usize) {
    match t {
        "string" => out.push_str("string"),
        "integer" | "number" => out.push_str("number"),
        "boolean" => out.push_str("boolean"),
        "null" => out.push_str("null"),
        "array" => {
            match schema.get("items") {
                Some(items) => {
                    let mut inner = String::new();
                    ts_type(&mut inner, items, depth + 1);
                    if inner.contains(' ') {
                        out.push('(');
                        out.push_str(&inner);
                        out.push(')');
                    } else {
                        out.push_str(&inner);
                    }
                }
                None => out.push_str("any"),
            }
            out.push_str("[]");
        }
        "object" => match schema.get("properties").and_then(|p| p.as_object()) {
            Some(props) => {
                let required: Vec<&str> = schema
                    .get("required")
                    .and_then(|r| r.as_array())
                    .map(|r| r.iter().filter_map(|x| x.as_str()).collect())
                    .unwrap_or_default();
                out.push_str("{\n");
                for (name, prop) in props.iter() {
                    if let Some(d) = prop.get("description").and_then(|d| d.as_str()).filter(|d| !d.is_empty()) {
                        comment(out, d);
                    }
                    out.push_str(name);
                    if !required.contains(&name) {
                        out.push('?');
                    }
                    out.push_str(": ");
                    ts_type(out, prop, depth + 1);
                    out.push(',');
                    if let Some(d) = prop.get("default") {
                        out.push_str(" // default: ");
                        match d.as_str() {
                            Some(s) => out.push_str(s),
                            None => out.push_str(&d.to_string()),
                        }
                    }
                    out.push('\n');
                }
                out.push('}');
            }
            None => out.push_str("object"),
        },
        _ => out.push_str("any"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(json: &str) -> Result<String, Refusal> {
        prompt(&sonic_rs::from_str(json).unwrap(), "2026-12-04", "medium")
    }

    #[test]
    fn a_plain_conversation() {
        let p =
            render(r#"{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}"#).unwrap();
        assert_eq!(
            p,
            "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2026-12-04\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>\
             <|start|>developer<|message|># Instructions\n\nBe brief.<|end|>\
             <|start|>user<|message|>Hi<|end|><|start|>assistant"
        );
    }

    #[test]
    fn tools_calls_and_results() {
        let p = render(
            r#"{"tools":[{"type":"function","function":{"name":"get_weather","description":"The weather in a city",
                 "parameters":{"type":"object","properties":{"city":{"type":"string","description":"Its name"},
                   "unit":{"type":"string","enum":["c","f"],"default":"c"},"days":{"type":["integer","null"]},
                   "tags":{"type":"array","items":{"type":"string"}}},"required":["city"]}}},
                 {"type":"function","function":{"name":"now"}}],
               "messages":[{"role":"user","content":[{"type":"text","text":"Weather?"}]},
                 {"role":"assistant","content":null,"reasoning_content":"Need it.","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
                 {"role":"tool","tool_call_id":"c1","content":"mild"},
                 {"role":"assistant","content":"It is mild.","reasoning_content":"dropped"},
                 {"role":"user","content":"Thanks"}]}"#,
        )
        .unwrap();
        assert!(p.contains("Channel must be included for every message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>"), "{p}");
        assert!(p.contains(
            "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n// The weather in a city\ntype get_weather = (_: {\n// Its name\ncity: string,\nunit?: \"c\" | \"f\", // default: c\ndays?: number | null,\ntags?: string[],\n}) => any;\n\ntype now = () => any;\n\n} // namespace functions<|end|>"
        ), "{p}");
        assert!(p.contains(
            "<|start|>user<|message|>Weather?<|end|>\
             <|start|>assistant<|channel|>analysis<|message|>Need it.<|end|>\
             <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>\
             <|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>mild<|end|>\
             <|start|>assistant<|channel|>final<|message|>It is mild.<|end|>\
             <|start|>user<|message|>Thanks<|end|><|start|>assistant"
        ), "{p}");
        assert!(!p.contains("dropped"), "an answered turn's reasoning is dropped");
    }

    #[test]
    fn what_has_no_harmony_form_is_refused() {
        for body in [
            r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}"#,
            r#"{"messages":[{"role":"user","content":{"a":1}}]}"#,
            r#"{"messages":[{"role":"critic","content":"x"}]}"#,
            r#"{"tools":[{"type":"custom","custom":{"name":"x"}}],"messages":[{"role":"user","content":"x"}]}"#,
        ] {
            let e = render(body).unwrap_err();
            assert_eq!((e.status, e.code), (400, "harmony_build_failed"), "{body}: {e:?}");
        }
    }
}
