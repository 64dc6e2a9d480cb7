//! The Responses event stream (sans I/O), made from the chat stream the engine's answer is
//! assembled into: chat SSE bytes go in (`feed`), Responses events come out in `out`.
//!
//! `response.created` and `response.in_progress` open it; each output item is
//! `output_item.added`, its deltas (`output_text.delta` in a `content_part`,
//! `reasoning_text.delta`, `function_call_arguments.delta`), its `.done` events and
//! `output_item.done`, one item open at a time (a new kind of delta closes the open one);
//! `end` closes the last item and says the final object, which the caller stores before
//! `completed` writes `response.completed`. SSE event names equal `type`;
//! `sequence_number` counts from 0.

use sonic_rs::{json, JsonContainerTrait, JsonValueMutTrait, JsonValueTrait, Value};

use super::answer::{
    approval_request_item, call_item, mcp_call_item, message_item, reasoning_item, Ending, Shell, Usage,
};
use super::turn::new_id;

#[derive(Debug, PartialEq)]
enum Open {
    None,
    Message {
        id: String,
        text: String,
    },
    Reasoning {
        id: String,
        text: String,
    },
    /// A chat tool call (`index`), as a `function_call` item, or an `mcp_call` item when it
    /// names an MCP server's tool (`mcp`: the server's label).
    Call {
        index: u64,
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        mcp: Option<String>,
    },
}

/// An MCP call the model made, for the relay to run (`mcp_done` reports it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PendingCall {
    pub index: usize,
    pub id: String,
    pub label: String,
    pub name: String,
    pub arguments: String,
}

/// One response's event stream.
pub(crate) struct Events {
    shell: Shell,
    seq: u64,
    open: Open,
    output: Vec<Value>,
    usage: Usage,
    finish: Option<String>,
    failed: bool,
    started: bool,
    /// MCP tools the model was offered: (tool name, server label, a call waits for approval).
    mcp: Vec<(String, String, bool)>,
    /// This round's MCP calls, not run yet.
    pending: Vec<PendingCall>,
    /// This round made a call of a function the client runs.
    plain_calls: bool,
    /// How the response ends when the relay decided it (the MCP loop's bound).
    ending: Option<Ending>,
    /// Chat SSE bytes not yet a whole event.
    partial: Vec<u8>,
}

// === impl Events ===

impl Events {
    pub(crate) fn new(shell: Shell) -> Self {
        Events {
            shell,
            seq: 0,
            open: Open::None,
            output: Vec::new(),
            usage: Usage::default(),
            finish: None,
            failed: false,
            started: false,
            mcp: Vec::new(),
            pending: Vec::new(),
            plain_calls: false,
            ending: None,
            partial: Vec::new(),
        }
    }

    /// One event: `type` and `sequence_number` first, then `body`'s fields.
    fn emit(&mut self, out: &mut Vec<u8>, kind: &str, body: Value) {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\ndata: {\"type\":");
        smg_wire::json::put_str(out, kind);
        out.extend_from_slice(b",\"sequence_number\":");
        smg_wire::num::put_dec(out, self.seq);
        self.seq += 1;
        let rest = sonic_rs::to_string(&body).unwrap_or_default();
        match rest.strip_prefix('{').filter(|r| *r != "}") {
            Some(fields) => {
                out.push(b',');
                out.extend_from_slice(fields.as_bytes());
            }
            None => out.push(b'}'),
        }
        out.extend_from_slice(b"\n\n");
    }

    /// `response.created`, `response.in_progress` (once; `feed` and `end` start the stream
    /// if nothing did).
    pub(crate) fn start(&mut self, out: &mut Vec<u8>) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        let o = self.shell.object(None, &[], None);
        self.emit(out, "response.created", super::ordered(&[("response", &o)]));
        self.emit(out, "response.in_progress", super::ordered(&[("response", &o)]));
    }

    /// The chat stream's bytes, as the assembler wrote them.
    pub(crate) fn feed(&mut self, chat: &[u8], out: &mut Vec<u8>) {
        self.start(out);
        self.partial.extend_from_slice(chat);
        let mut start = 0;
        while let Some(end) = find(&self.partial[start..], b"\n\n") {
            let event = self.partial[start..start + end].to_vec();
            start += end + 2;
            for line in event.split(|b| *b == b'\n') {
                if let Some(data) = line.strip_prefix(b"data: ") {
                    self.chunk(data, out);
                }
            }
        }
        self.partial.drain(..start);
    }

    fn chunk(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if data == b"[DONE]" {
            return;
        }
        let Ok(v) = sonic_rs::from_slice::<Value>(data) else { return };
        if v.get("error").is_some() {
            self.failed = true;
            return;
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            // One usage chunk per generation; an MCP loop's generations add up.
            self.usage.add(Usage::of_chat(Some(u)));
        }
        let Some(choice) = v.get("choices").and_then(|c| c.get(0)) else { return };
        if let Some(f) = choice.get("finish_reason").and_then(|f| f.as_str()) {
            self.finish = Some(f.to_string());
        }
        let Some(delta) = choice.get("delta") else { return };
        if let Some(r) = delta.get("reasoning_content").and_then(|t| t.as_str()).filter(|t| !t.is_empty()) {
            self.reasoning(r, out);
        }
        if let Some(t) = delta.get("content").and_then(|t| t.as_str()).filter(|t| !t.is_empty()) {
            self.text(t, out);
        }
        if let Some(calls) = delta.get("tool_calls").and_then(|c| c.as_array()) {
            for c in calls.iter() {
                self.call(c, out);
            }
        }
    }

    fn index(&self) -> usize {
        self.output.len()
    }

    fn reasoning(&mut self, delta: &str, out: &mut Vec<u8>) {
        if !matches!(self.open, Open::Reasoning { .. }) {
            self.close(out);
            let id = new_id("rs");
            let item = json!({"type": "reasoning", "id": id.as_str(), "summary": [], "content": []});
            self.emit(out, "response.output_item.added", json!({"output_index": self.index(), "item": item}));
            self.open = Open::Reasoning { id, text: String::new() };
        }
        let Open::Reasoning { id, text } = &mut self.open else { unreachable!() };
        text.push_str(delta);
        let body =
            json!({"item_id": id.as_str(), "output_index": self.output.len(), "content_index": 0, "delta": delta});
        self.emit(out, "response.reasoning_text.delta", body);
    }

    fn text(&mut self, delta: &str, out: &mut Vec<u8>) {
        if !matches!(self.open, Open::Message { .. }) {
            self.close(out);
            let id = new_id("msg");
            let item = json!({"type": "message", "id": id.as_str(), "status": "in_progress", "role": "assistant", "content": []});
            let index = self.index();
            self.emit(out, "response.output_item.added", json!({"output_index": index, "item": item}));
            let part = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
            let body = json!({"item_id": id.as_str(), "output_index": index, "content_index": 0, "part": part});
            self.emit(out, "response.content_part.added", body);
            self.open = Open::Message { id, text: String::new() };
        }
        let Open::Message { id, text } = &mut self.open else { unreachable!() };
        text.push_str(delta);
        let body = json!({"item_id": id.as_str(), "output_index": self.output.len(), "content_index": 0, "delta": delta, "logprobs": []});
        self.emit(out, "response.output_text.delta", body);
    }

    fn call(&mut self, c: &Value, out: &mut Vec<u8>) {
        let index = c.get("index").and_then(|i| i.as_u64()).unwrap_or(0);
        let f = |k: &str| c.get("function").and_then(|f| f.get(k)).and_then(|v| v.as_str()).unwrap_or("");
        let same = matches!(&self.open, Open::Call { index: i, .. } if *i == index);
        if !same {
            self.close(out);
            let call_id = c.get("id").and_then(|v| v.as_str()).unwrap_or("").to_string();
            let name = f("name").to_string();
            let found = self.mcp.iter().find(|(t, _, _)| *t == name);
            let asks = found.is_some_and(|(_, _, a)| *a);
            let mcp = found.map(|(_, l, _)| l.clone());
            let at = self.index();
            let id = match &mcp {
                // A call that waits for approval is said whole when it ends (`close`).
                Some(_) if asks => {
                    self.plain_calls = true;
                    new_id("mcpr")
                }
                Some(label) => {
                    let id = new_id("mcp");
                    let item = mcp_call_item(&id, label, &name, "", None);
                    self.emit(out, "response.output_item.added", json!({"output_index": at, "item": item}));
                    self.emit(
                        out,
                        "response.mcp_call.in_progress",
                        json!({"output_index": at, "item_id": id.as_str()}),
                    );
                    id
                }
                None => {
                    self.plain_calls = true;
                    let id = new_id("fc");
                    let item = call_item(&id, &call_id, &name, "", "in_progress");
                    self.emit(out, "response.output_item.added", json!({"output_index": at, "item": item}));
                    id
                }
            };
            self.open = Open::Call { index, id, call_id, name, arguments: String::new(), mcp };
        }
        let delta = f("arguments");
        if delta.is_empty() {
            return;
        }
        let asks = matches!(&self.open, Open::Call { id, .. } if id.starts_with("mcpr_"));
        let Open::Call { id, arguments, mcp, .. } = &mut self.open else { unreachable!() };
        arguments.push_str(delta);
        if asks {
            return;
        }
        let kind =
            if mcp.is_some() { "response.mcp_call_arguments.delta" } else { "response.function_call_arguments.delta" };
        let body = json!({"item_id": id.as_str(), "output_index": self.output.len(), "delta": delta});
        self.emit(out, kind, body);
    }

    /// Closes the open item: its `.done` events.
    fn close(&mut self, out: &mut Vec<u8>) {
        let index = self.index();
        let item = match std::mem::replace(&mut self.open, Open::None) {
            Open::None => return,
            Open::Message { id, text } => {
                let part = json!({"type": "output_text", "text": text.as_str(), "annotations": [], "logprobs": []});
                let body = json!({"item_id": id.as_str(), "output_index": index, "content_index": 0, "text": text.as_str(), "logprobs": []});
                self.emit(out, "response.output_text.done", body);
                let body = json!({"item_id": id.as_str(), "output_index": index, "content_index": 0, "part": part});
                self.emit(out, "response.content_part.done", body);
                message_item(&id, &text, "completed")
            }
            Open::Reasoning { id, text } => {
                let body =
                    json!({"item_id": id.as_str(), "output_index": index, "content_index": 0, "text": text.as_str()});
                self.emit(out, "response.reasoning_text.done", body);
                reasoning_item(&id, &text)
            }
            Open::Call { id, call_id, name, arguments, mcp: None, .. } => {
                let body = json!({"item_id": id.as_str(), "output_index": index, "name": name.as_str(), "arguments": arguments.as_str()});
                self.emit(out, "response.function_call_arguments.done", body);
                call_item(&id, &call_id, &name, &arguments, "completed")
            }
            Open::Call { id, name, arguments, mcp: Some(label), .. } if id.starts_with("mcpr_") => {
                // The client approves it (or not) in its next turn.
                let item = approval_request_item(&id, &label, &name, &arguments);
                self.emit(
                    out,
                    "response.output_item.added",
                    super::ordered(&[("output_index", &index.into()), ("item", &item)]),
                );
                item
            }
            Open::Call { id, name, arguments, mcp: Some(label), .. } => {
                // Run by the relay after the generation; `mcp_done` finishes the item.
                let body = json!({"item_id": id.as_str(), "output_index": index, "arguments": arguments.as_str()});
                self.emit(out, "response.mcp_call_arguments.done", body);
                let item = mcp_call_item(&id, &label, &name, &arguments, None);
                self.pending.push(PendingCall { index, id, label, name, arguments });
                self.output.push(item);
                return;
            }
        };
        self.emit(out, "response.output_item.done", json!({"output_index": index, "item": item.clone()}));
        self.output.push(item);
    }

    /// The MCP tools offered (tool name, server label), and their servers' listings, which
    /// open the output.
    pub(crate) fn mcp(&mut self, tools: Vec<(String, String, bool)>, listings: &[Value], out: &mut Vec<u8>) {
        self.start(out);
        self.mcp = tools;
        for item in listings {
            let index = self.index();
            let id = item.get("id").and_then(|i| i.as_str()).unwrap_or("").to_string();
            let mut added = item.clone();
            if let Some(o) = added.as_object_mut() {
                o.insert("tools", Value::new_array());
            }
            self.emit(
                out,
                "response.output_item.added",
                super::ordered(&[("output_index", &index.into()), ("item", &added)]),
            );
            let body = json!({"output_index": index, "item_id": id.as_str()});
            self.emit(out, "response.mcp_list_tools.in_progress", body.clone());
            self.emit(out, "response.mcp_list_tools.completed", body);
            self.emit(
                out,
                "response.output_item.done",
                super::ordered(&[("output_index", &index.into()), ("item", item)]),
            );
            self.output.push(item.clone());
        }
    }

    /// Items made before the first generation (calls the client answered), said whole.
    pub(crate) fn items(&mut self, items: &[Value], out: &mut Vec<u8>) {
        for item in items {
            let index = self.index();
            self.emit(
                out,
                "response.output_item.added",
                super::ordered(&[("output_index", &index.into()), ("item", item)]),
            );
            self.emit(
                out,
                "response.output_item.done",
                super::ordered(&[("output_index", &index.into()), ("item", item)]),
            );
            self.output.push(item.clone());
        }
    }

    /// A generation of the MCP loop ended: its open item closed; the MCP calls it made, to
    /// run, and whether it also called a function the client runs.
    pub(crate) fn round(&mut self, out: &mut Vec<u8>) -> (Vec<PendingCall>, bool) {
        self.close(out);
        (std::mem::take(&mut self.pending), std::mem::replace(&mut self.plain_calls, false))
    }

    /// An MCP call's outcome: `response.mcp_call.completed` (or `.failed`) and its item done.
    pub(crate) fn mcp_done(&mut self, call: &PendingCall, result: &Result<String, String>, out: &mut Vec<u8>) {
        let item = mcp_call_item(&call.id, &call.label, &call.name, &call.arguments, Some(result));
        let kind = if result.is_ok() { "response.mcp_call.completed" } else { "response.mcp_call.failed" };
        self.emit(out, kind, json!({"output_index": call.index, "item_id": call.id.as_str()}));
        self.emit(
            out,
            "response.output_item.done",
            super::ordered(&[("output_index", &call.index.into()), ("item", &item)]),
        );
        if let Some(slot) = self.output.get_mut(call.index) {
            *slot = item;
        }
    }

    /// The output so far (what the next generation of the MCP loop reads).
    pub(crate) fn output(&self) -> &[Value] {
        &self.output
    }

    /// The response ends so, whatever the engine said last.
    pub(crate) fn set_ending(&mut self, ending: Ending) {
        self.ending = Some(ending);
    }

    /// The chat stream ended: closes the open item; the final object, its items and usage.
    pub(crate) fn end(&mut self, out: &mut Vec<u8>) -> (Value, Vec<Value>, Usage) {
        self.start(out);
        self.close(out);
        let ending = match self.ending {
            _ if self.failed => Ending::Failed,
            Some(e) => e,
            None => Ending::of_finish(self.finish.as_deref()),
        };
        let o = self.shell.object(Some(ending), &self.output, Some(self.usage));
        (o, self.output.clone(), self.usage)
    }

    /// The last event: `response.completed` (or `.incomplete`, `.failed`) with the object.
    pub(crate) fn completed(&mut self, response: Value, out: &mut Vec<u8>) {
        let kind = match response.get("status").and_then(|s| s.as_str()) {
            Some("incomplete") => "response.incomplete",
            Some("failed") => "response.failed",
            _ => "response.completed",
        };
        self.emit(out, kind, super::ordered(&[("response", &response)]));
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::responses::turn::Turn;

    fn events(out: &[u8]) -> Vec<Value> {
        let text = std::str::from_utf8(out).unwrap();
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let mut lines = e.lines();
                let name = lines.next().unwrap().strip_prefix("event: ").unwrap();
                let data: Value = sonic_rs::from_str(lines.next().unwrap().strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(data["type"].as_str(), Some(name), "the event name is its type");
                data
            })
            .collect()
    }

    fn chunk(delta: &str, finish: Option<&str>) -> String {
        let f = finish.map_or("null".to_string(), |f| format!("\"{f}\""));
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{f}}}]}}\n\n")
    }

    fn run(chat: &[String], cut: usize) -> Vec<Value> {
        let turn = Turn::read(br#"{"model":"m","input":"x"}"#).unwrap();
        let mut e = Events::new(Shell::new(&turn, "resp_1".into(), 1, "m"));
        let mut out = Vec::new();
        e.start(&mut out);
        let all: Vec<u8> = chat.concat().into_bytes();
        // Fed cut in pieces of `cut` bytes: events must not depend on where reads end.
        for piece in all.chunks(cut) {
            e.feed(piece, &mut out);
        }
        let (o, _, _) = e.end(&mut out);
        e.completed(o, &mut out);
        events(&out)
    }

    #[test]
    fn text_deltas_make_one_message_item_in_order_wherever_the_bytes_are_cut() {
        let chat = [
            chunk(r#"{"role":"assistant","content":""}"#, None),
            chunk(r#"{"content":"Hel"}"#, None),
            chunk(r#"{"content":"lo"}"#, Some("stop")),
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2,\"total_tokens\":6}}\n\n"
                .into(),
            "data: [DONE]\n\n".into(),
        ];
        let whole = run(&chat, usize::MAX);
        for cut in [1, 7, 64] {
            let cut_run = run(&chat, cut);
            let kinds = |v: &[Value]| v.iter().map(|e| e["type"].as_str().unwrap().to_string()).collect::<Vec<_>>();
            assert_eq!(kinds(&cut_run), kinds(&whole));
        }
        let kinds: Vec<_> = whole.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        for (i, e) in whole.iter().enumerate() {
            assert_eq!(e["sequence_number"].as_u64(), Some(i as u64));
        }
        let done = &whole[9]["response"];
        assert_eq!(done["id"].as_str(), Some("resp_1"));
        assert_eq!(whole[0]["response"]["id"].as_str(), Some("resp_1"));
        assert_eq!(done["output"][0]["content"][0]["text"].as_str(), Some("Hello"));
        assert_eq!(done["usage"]["total_tokens"].as_u64(), Some(6));
        assert_eq!(whole[6]["text"].as_str(), Some("Hello"));
    }

    #[test]
    fn reasoning_then_text_then_a_call_close_each_item_before_the_next() {
        let chat = [
            chunk(r#"{"reasoning_content":"hmm"}"#, None),
            chunk(r#"{"content":"ok"}"#, None),
            chunk(
                r#"{"tool_calls":[{"index":0,"id":"call_9","type":"function","function":{"name":"f","arguments":""}}]}"#,
                None,
            ),
            chunk(r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":"}}]}"#, None),
            chunk(r#"{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}"#, Some("tool_calls")),
        ];
        let ev = run(&chat, 5);
        let done: Vec<_> = ev.iter().filter(|e| e["type"].as_str() == Some("response.output_item.done")).collect();
        let types: Vec<_> = done.iter().map(|e| e["item"]["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["reasoning", "message", "function_call"]);
        assert_eq!(done[2]["item"]["arguments"].as_str(), Some("{\"a\":1}"));
        assert_eq!(done[2]["item"]["call_id"].as_str(), Some("call_9"));
        assert_eq!(done[2]["output_index"].as_u64(), Some(2));
        let last = ev.last().unwrap();
        assert_eq!(last["response"]["output"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn an_error_event_fails_the_response() {
        let chat = [chunk(r#"{"content":"a"}"#, None), "data: {\"error\":{\"message\":\"x\"}}\n\n".into()];
        let ev = run(&chat, 3);
        assert_eq!(ev.last().unwrap()["type"].as_str(), Some("response.failed"));
    }

    #[test]
    fn an_mcp_call_is_held_until_run_and_then_reported_in_place() {
        let turn = Turn::read(br#"{"model":"m","input":"x"}"#).unwrap();
        let mut e = Events::new(Shell::new(&turn, "resp_1".into(), 1, "m"));
        let mut out = Vec::new();
        let listing = sonic_rs::json!({"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "wx", "tools": []});
        e.mcp(vec![("get_weather".into(), "wx".into(), false)], &[listing], &mut out);
        let chat = [
            chunk(r#"{"content":"Let me see."}"#, None),
            chunk(
                r#"{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}"#,
                Some("tool_calls"),
            ),
        ];
        e.feed(chat.concat().as_bytes(), &mut out);
        let (pending, plain) = e.round(&mut out);
        assert!(!plain);
        assert_eq!(pending.len(), 1);
        assert_eq!((pending[0].index, pending[0].label.as_str()), (2, "wx"));
        e.mcp_done(&pending[0], &Ok("21 C".into()), &mut out);
        e.feed(chunk(r#"{"content":"It is 21 C."}"#, Some("stop")).as_bytes(), &mut out);
        let (o, output, _) = e.end(&mut out);
        e.completed(o, &mut out);
        let ev = events(&out);
        let kinds: Vec<&str> = ev.iter().map(|v| v["type"].as_str().unwrap()).collect();
        let mcp: Vec<&str> = kinds.iter().copied().filter(|k| k.contains("mcp")).collect();
        assert_eq!(
            mcp,
            [
                "response.mcp_list_tools.in_progress",
                "response.mcp_list_tools.completed",
                "response.mcp_call.in_progress",
                "response.mcp_call_arguments.delta",
                "response.mcp_call_arguments.done",
                "response.mcp_call.completed"
            ]
        );
        let types: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["mcp_list_tools", "message", "mcp_call", "message"]);
        assert_eq!(output[2]["output"].as_str(), Some("21 C"));
        assert_eq!(output[2]["status"].as_str(), Some("completed"));
    }
}
