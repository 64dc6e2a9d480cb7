//! What a choice's decoded text turns into on a gRPC worker: which reasoning and tool-call
//! parsers (smg-parsers) a request gets, and the one `OutputParser` that chains them for the
//! assembler (reasoning first; what is not reasoning goes through the tool parser).
//!
//! The model's parsers are chosen once, at registration (`--reasoning-parser`,
//! `--tool-call-parser`, else from the model's name as SMG does); each request then turns
//! them on or off by what it asks:
//! - reasoning: `separate_reasoning: false` keeps the text whole (think markers included);
//!   `stream_reasoning: false` holds a stream's reasoning and sends it in one piece when it
//!   ends;
//! - tool calls: only when the request offers `tools` (MiniMax's profile scans without them)
//!   and `tool_choice` is not `none`; a call to a function the request does not offer stays
//!   text. `parallel_tool_calls: false` keeps the first call.
//! - `tool_choice` that forces a call (`required`, a named function, `allowed_tools` in
//!   `required` mode) sends the engine one `json_schema` constraint, as SMG does: an array of
//!   `{"name", "parameters"}` objects whose names and parameter schemas are the offered
//!   tools' (required), or the named function's parameter schema (named). The constrained
//!   answer is then read as that JSON, not as the model's own markup.

use smg_parsers::{Call, Parsed, ReasoningParser, Tool, ToolParser, Tools};
use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};

/// Where an output parser plugs in, one per choice: it sees the choice's decoded text as it is
/// released (stop strings already cut, nothing held back by the detokenizer) and appends what
/// that text is to `Parsed`. A parser may hold text back (half a `<think>` tag) and release it
/// on a later call or at `finish`. `PassThrough` keeps the text as it is; `Chain`
/// runs the model's reasoning and tool-call parsers.
pub(crate) trait OutputParser {
    /// Text the choice released. `out` was cleared by the caller.
    fn push(&mut self, text: &str, out: &mut Parsed);
    /// The choice finished: whatever is still held back. Called once, after the last `push`.
    fn finish(&mut self, out: &mut Parsed);
}

/// Every byte of output is the message's content.
pub(crate) struct PassThrough;

impl OutputParser for PassThrough {
    fn push(&mut self, text: &str, out: &mut Parsed) {
        out.content.push_str(text);
    }

    fn finish(&mut self, _: &mut Parsed) {}
}

/// A model's parsers, as registration chose them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelParsers {
    pub reasoning: Option<&'static str>,
    pub tools: Option<&'static str>,
}

impl ModelParsers {
    /// The operator's names where given (already checked at start), else the model's family.
    pub fn choose(reasoning: Option<&str>, tools: Option<&str>, model: &str) -> Self {
        let known = |names: &'static [&'static str], n: &str| names.iter().copied().find(|k| *k == n);
        ModelParsers {
            reasoning: match reasoning {
                Some(n) => known(smg_parsers::reasoning::NAMES, n),
                None => smg_parsers::reasoning::for_model(model),
            },
            tools: match tools {
                Some(n) => known(smg_parsers::tools::NAMES, n),
                None => smg_parsers::tools::for_model(model),
            },
        }
    }
}

/// Checks a `--reasoning-parser` / `--tool-call-parser` value: Err names the known ones.
pub fn check_name(flag: &str, name: &str, known: &[&str]) -> Result<(), String> {
    if known.contains(&name) {
        return Ok(());
    }
    Err(format!("{flag}: unknown parser '{name}' (known: {})", known.join(", ")))
}

/// How a request's answer yields tool calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolPlan {
    /// The model's markup, read by this smg-parsers family, for these offered functions.
    Family(&'static str, Tools),
    /// `tool_choice` named this function: the (constrained) answer is its arguments object.
    Named(String),
    /// A Harmony model's channels: reasoning, calls of these offered functions, content.
    /// `separate: false` (`separate_reasoning: false`) gives the reasoning as content.
    Harmony { tools: Tools, separate: bool },
}

/// One request's output plan: what each of its choices' parsers are.
#[derive(Debug, Clone)]
pub struct OutputPlan {
    /// The reasoning parser, and whether the request turned thinking on.
    pub reasoning: Option<(&'static str, bool)>,
    /// A stream sends reasoning as it comes (true) or in one piece when it ends.
    pub stream_reasoning: bool,
    /// How the answer's tool calls are read.
    pub tools: Option<ToolPlan>,
    /// More than one call per choice may be returned.
    pub parallel_calls: bool,
    /// Kimi K2's call ids count the calls already in the conversation: that count. None: ids
    /// are `call_…`.
    pub kimi_ids_from: Option<usize>,
}

impl Default for OutputPlan {
    /// No parser; the request fields' own defaults.
    fn default() -> Self {
        OutputPlan { reasoning: None, stream_reasoning: true, tools: None, parallel_calls: true, kimi_ids_from: None }
    }
}

impl OutputPlan {
    /// The plan of a chat request `body` on a model with `parsers`; `thinks`: the template
    /// turned thinking on. `scan_without_tools`: the profile looks for calls even when the
    /// request offers no tools (MiniMax).
    pub fn of_chat(body: &Value, parsers: ModelParsers, thinks: bool, scan_without_tools: bool) -> Self {
        let flag = |k: &str, default: bool| body.get(k).and_then(|v| v.as_bool()).unwrap_or(default);
        let reasoning = parsers.reasoning.filter(|_| flag("separate_reasoning", true)).map(|n| (n, thinks));
        let offered = body.get("tools").and_then(|t| t.as_array()).filter(|a| !a.is_empty());
        // Kimi's profile: tools declared on system and developer messages join the request's.
        let mut declared = offered.map(tools_of).unwrap_or_default();
        if parsers.tools == Some("kimik2") {
            declared.extend(message_tools(body));
        }
        let any_offered = offered.is_some() || !declared.is_empty();
        let tools = match (forced_choice(body), parsers.tools, any_offered) {
            (Forced::No, ..) => None,
            (Forced::Named(name), ..) => Some(ToolPlan::Named(name)),
            (Forced::Required(_), _, true) => Some(ToolPlan::Family("json", Tools::new(declared))),
            (Forced::Auto, Some(name), true) => Some(ToolPlan::Family(name, Tools::new(declared))),
            (Forced::Auto, Some(name), false) if scan_without_tools => Some(ToolPlan::Family(name, Tools::any())),
            _ => None,
        };
        let kimi = matches!(&tools, Some(ToolPlan::Family("kimik2", _)));
        let kimi_ids_from = kimi.then(|| calls_in_history(body));
        OutputPlan {
            reasoning,
            stream_reasoning: flag("stream_reasoning", true),
            tools,
            parallel_calls: flag("parallel_tool_calls", true),
            kimi_ids_from,
        }
    }

    /// The plan of a chat request `body` on a Harmony model: its channels are read (with
    /// `separate_reasoning: false` the reasoning is content, its markers gone: they are
    /// special tokens), unless `tool_choice` forces a call, whose constrained answer is that
    /// call's JSON as on other models.
    pub fn of_harmony(body: &Value) -> Self {
        let flag = |k: &str, default: bool| body.get(k).and_then(|v| v.as_bool()).unwrap_or(default);
        let offered = body.get("tools").and_then(|t| t.as_array()).map(tools_of).unwrap_or_default();
        let tools = match forced_choice(body) {
            Forced::Named(name) => ToolPlan::Named(name),
            Forced::Required(_) if !offered.is_empty() => ToolPlan::Family("json", Tools::new(offered)),
            Forced::No => ToolPlan::Harmony { tools: Tools::default(), separate: flag("separate_reasoning", true) },
            _ => ToolPlan::Harmony { tools: Tools::new(offered), separate: flag("separate_reasoning", true) },
        };
        OutputPlan {
            reasoning: None,
            stream_reasoning: flag("stream_reasoning", true),
            tools: Some(tools),
            parallel_calls: flag("parallel_tool_calls", true),
            kimi_ids_from: None,
        }
    }

    /// Whether any parser runs (else the text passes as it is).
    pub fn parses(&self) -> bool {
        self.reasoning.is_some() || self.tools.is_some()
    }

    /// A choice's parser chain.
    pub(crate) fn parser(&self) -> Box<dyn OutputParser> {
        let tools: Option<Box<dyn ToolParser>> = match &self.tools {
            Some(ToolPlan::Family(n, t)) => smg_parsers::tools::by_name(n, t.clone()),
            Some(ToolPlan::Named(name)) => Some(Box::new(NamedCall { name: name.clone(), text: String::new() })),
            Some(ToolPlan::Harmony { tools, separate: true }) => Some(smg_parsers::harmony::parser(tools.clone())),
            Some(ToolPlan::Harmony { tools, separate: false }) => {
                Some(Box::new(Merged(smg_parsers::harmony::parser(tools.clone()))))
            }
            None => None,
        };
        Box::new(Chain {
            reasoning: self.reasoning.and_then(|(n, thinks)| smg_parsers::reasoning::by_name(n, thinks)),
            tools,
            mid: Parsed::default(),
        })
    }

    /// The id of a choice's `k`-th call (from 0).
    pub fn call_id(&self, call: &Call, k: usize) -> String {
        match self.kimi_ids_from {
            Some(before) => format!("functions.{}:{}", call.name, before + k),
            None => {
                let mut id = String::with_capacity(29);
                id.push_str("call_");
                let hex = uuid::Uuid::now_v7().simple().to_string();
                id.push_str(&hex[..24]);
                id
            }
        }
    }
}

/// What `tool_choice` asks.
enum Forced {
    /// `none`: no calls are read.
    No,
    /// `auto` (or absent): calls in the model's own markup.
    Auto,
    /// A call is required, of one of these functions (None: any offered one).
    Required(Option<Vec<String>>),
    /// This function must be called.
    Named(String),
}

fn forced_choice(body: &Value) -> Forced {
    let Some(choice) = body.get("tool_choice") else { return Forced::Auto };
    match choice.as_str() {
        Some("none") => return Forced::No,
        Some("required") => return Forced::Required(None),
        Some(_) => return Forced::Auto,
        None => {}
    }
    let kind = choice.get("type").and_then(|t| t.as_str());
    match kind {
        Some("function") => {
            let name = choice.get("function").and_then(|f| f.get("name")).and_then(|n| n.as_str());
            name.map_or(Forced::Auto, |n| Forced::Named(n.to_string()))
        }
        Some("allowed_tools") => {
            let spec = choice.get("allowed_tools").unwrap_or(choice);
            if spec.get("mode").and_then(|m| m.as_str()) != Some("required") {
                return Forced::Auto;
            }
            let names = spec.get("tools").and_then(|t| t.as_array()).map(|refs| {
                refs.iter()
                    .filter_map(|r| {
                        r.get("function").and_then(|f| f.get("name")).or(r.get("name")).and_then(|n| n.as_str())
                    })
                    .map(str::to_string)
                    .collect()
            });
            Forced::Required(names)
        }
        _ => Forced::Auto,
    }
}

/// The `json_schema` constraint a `tool_choice` that forces a call puts on the answer (as
/// SMG builds it); None when it forces none or no offered tool matches.
pub fn tool_constraint(body: &Value) -> Option<String> {
    let offered = body.get("tools").and_then(|t| t.as_array())?;
    fn function(t: &Value) -> Option<&Value> {
        t.get("function").filter(|f| f.get("name").and_then(|n| n.as_str()).is_some())
    }
    let params = |f: &Value| f.get("parameters").map_or_else(|| "{}".to_string(), |p| p.to_string());
    match forced_choice(body) {
        Forced::Named(name) => {
            let f =
                offered.iter().filter_map(function).find(|f| f.get("name").and_then(|n| n.as_str()) == Some(&name))?;
            Some(params(f))
        }
        Forced::Required(names) => {
            let wanted = |n: &str| names.as_ref().is_none_or(|ns| ns.iter().any(|w| w == n));
            let mut alternatives = Vec::new();
            let mut defs: Vec<(String, String)> = Vec::new();
            for f in offered.iter().filter_map(function) {
                let name = f.get("name").and_then(|n| n.as_str()).unwrap_or_default();
                if !wanted(name) {
                    continue;
                }
                let mut quoted = Vec::new();
                smg_wire::json::put_str(&mut quoted, name);
                alternatives.push(format!(
                    r#"{{"properties":{{"name":{{"type":"string","enum":[{}]}},"parameters":{}}},"required":["name","parameters"]}}"#,
                    String::from_utf8_lossy(&quoted),
                    params(f)
                ));
                // Shared definitions go to the top, where the parameters' `$ref`s point.
                if let Some(d) = f.get("parameters").and_then(|p| p.get("$defs")).and_then(|d| d.as_object()) {
                    for (k, v) in d.iter() {
                        if !defs.iter().any(|(dk, _)| dk == k) {
                            defs.push((k.to_string(), v.to_string()));
                        }
                    }
                }
            }
            if alternatives.is_empty() {
                return None;
            }
            let mut schema = format!(
                r#"{{"type":"array","minItems":1,"items":{{"type":"object","anyOf":[{}]}}"#,
                alternatives.join(",")
            );
            if !defs.is_empty() {
                let members: Vec<String> = defs
                    .iter()
                    .map(|(k, v)| {
                        let mut q = Vec::new();
                        smg_wire::json::put_str(&mut q, k);
                        format!("{}:{v}", String::from_utf8_lossy(&q))
                    })
                    .collect();
                schema.push_str(&format!(r#","$defs":{{{}}}"#, members.join(",")));
            }
            schema.push('}');
            Some(schema)
        }
        Forced::No | Forced::Auto => None,
    }
}

/// A named function's constrained answer: the whole text is its arguments object. Held to
/// the end; text that is not a JSON object comes back as content.
struct NamedCall {
    name: String,
    text: String,
}

impl ToolParser for NamedCall {
    fn push(&mut self, text: &str, _: &mut Parsed) {
        self.text.push_str(text);
    }

    fn finish(&mut self, out: &mut Parsed) {
        let text = std::mem::take(&mut self.text);
        let args = text.trim();
        let object = sonic_rs::from_str::<Value>(args).is_ok_and(|v| v.is_object());
        if object {
            out.calls.push(Call { name: self.name.clone(), arguments: args.to_string() });
        } else {
            out.content.push_str(&text);
        }
    }
}

/// A parser whose reasoning is given as content, in front of the content of the same piece
/// (Harmony with `separate_reasoning: false`: its reasoning comes first).
struct Merged(Box<dyn ToolParser>);

impl Merged {
    fn merge(out: &mut Parsed) {
        if !out.reasoning.is_empty() {
            let reasoning = std::mem::take(&mut out.reasoning);
            out.content.insert_str(0, &reasoning);
        }
    }
}

impl ToolParser for Merged {
    fn push(&mut self, text: &str, out: &mut Parsed) {
        self.0.push(text, out);
        Merged::merge(out);
    }

    fn finish(&mut self, out: &mut Parsed) {
        self.0.finish(out);
        Merged::merge(out);
    }
}

/// Functions declared in system and developer messages' own `tools` (Kimi's profile).
fn message_tools(body: &Value) -> Vec<Tool> {
    let Some(messages) = body.get("messages").and_then(|m| m.as_array()) else { return Vec::new() };
    messages
        .iter()
        .filter(|m| matches!(m.get("role").and_then(|r| r.as_str()), Some("system" | "developer")))
        .filter_map(|m| m.get("tools").and_then(|t| t.as_array()))
        .flat_map(tools_of)
        .collect()
}

/// The offered functions: each `tools[i].function`'s name and its parameters' types.
fn tools_of(list: &sonic_rs::Array) -> Vec<Tool> {
    list.iter()
        .filter_map(|t| {
            let f = t.get("function")?;
            let name = f.get("name")?.as_str()?.to_string();
            let params = f
                .get("parameters")
                .and_then(|p| p.get("properties"))
                .and_then(|p| p.as_object())
                .map(|props| {
                    props
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.get("type").and_then(|t| t.as_str()).unwrap_or("").to_string()))
                        .collect()
                })
                .unwrap_or_default();
            Some(Tool { name, params })
        })
        .collect()
}

/// Tool calls the assistant already made in the conversation.
fn calls_in_history(body: &Value) -> usize {
    let Some(messages) = body.get("messages").and_then(|m| m.as_array()) else { return 0 };
    messages
        .iter()
        .filter(|m| m.get("role").and_then(|r| r.as_str()) == Some("assistant"))
        .filter_map(|m| m.get("tool_calls").and_then(|c| c.as_array()).map(|c| c.len()))
        .sum()
}

/// Reasoning first, then tool calls on what is not reasoning.
struct Chain {
    reasoning: Option<Box<dyn ReasoningParser>>,
    tools: Option<Box<dyn ToolParser>>,
    /// The reasoning parser's output before the tool parser sees its content.
    mid: Parsed,
}

impl Chain {
    fn step(&mut self, text: &str, out: &mut Parsed, end: bool) {
        let Some(r) = &mut self.reasoning else {
            match &mut self.tools {
                Some(t) if end => {
                    t.push(text, out);
                    t.finish(out)
                }
                Some(t) => t.push(text, out),
                None => out.content.push_str(text),
            }
            return;
        };
        self.mid.clear();
        r.push(text, &mut self.mid);
        if end {
            r.finish(&mut self.mid);
        }
        out.reasoning.push_str(&self.mid.reasoning);
        match &mut self.tools {
            Some(t) => {
                if !self.mid.content.is_empty() {
                    t.push(&self.mid.content, out);
                }
                if end {
                    t.finish(out);
                }
            }
            None => out.content.push_str(&self.mid.content),
        }
    }
}

impl OutputParser for Chain {
    fn push(&mut self, text: &str, out: &mut Parsed) {
        self.step(text, out, false);
    }

    fn finish(&mut self, out: &mut Parsed) {
        self.step("", out, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: &str) -> Value {
        sonic_rs::from_str(json).unwrap()
    }

    #[test]
    fn unknown_names_are_refused_with_the_known_ones() {
        let e = check_name("--tool-call-parser", "nope", smg_parsers::tools::NAMES).unwrap_err();
        assert!(e.starts_with("--tool-call-parser: unknown parser 'nope' (known: "), "{e}");
        assert!(e.contains("qwen") && e.contains("kimik2"), "{e}");
        assert!(check_name("--reasoning-parser", "qwen3", smg_parsers::reasoning::NAMES).is_ok());
    }

    #[test]
    fn requests_turn_the_models_parsers_on_and_off() {
        let p = ModelParsers { reasoning: Some("qwen3"), tools: Some("qwen") };
        let tools = r#""tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer"}}}}}]"#;
        let plan = OutputPlan::of_chat(&body(&format!("{{{tools}}}")), p, true, false);
        assert_eq!(plan.reasoning, Some(("qwen3", true)));
        let Some(ToolPlan::Family(name, t)) = plan.tools.clone() else { panic!("{plan:?}") };
        assert_eq!(name, "qwen");
        assert_eq!(t.list(), &[Tool { name: "f".into(), params: vec![("a".into(), "integer".into())] }]);
        assert!(plan.stream_reasoning && plan.parallel_calls && plan.kimi_ids_from.is_none());

        let off = OutputPlan::of_chat(
            &body(&format!(
                r#"{{{tools},"tool_choice":"none","separate_reasoning":false,"parallel_tool_calls":false,"stream_reasoning":false}}"#
            )),
            p,
            true,
            false,
        );
        assert!(off.reasoning.is_none() && off.tools.is_none() && !off.parallel_calls && !off.stream_reasoning);
        assert!(OutputPlan::of_chat(&body("{}"), p, false, false).tools.is_none(), "no tools offered");
        let minimax = ModelParsers { reasoning: None, tools: Some("minimax_m2") };
        let scan = OutputPlan::of_chat(&body("{}"), minimax, false, true);
        assert_eq!(scan.tools, Some(ToolPlan::Family("minimax_m2", Tools::any())), "MiniMax scans without tools");
        let mut chain = scan.parser();
        let mut out = Parsed::default();
        let call = smg_parsers::markup::call("minimax_m2", "anything", &[("n", "1")], 0).unwrap();
        chain.push(&call, &mut out);
        chain.finish(&mut out);
        assert_eq!(out.calls.len(), 1, "{out:?}");
        assert_eq!(out.calls[0].name, "anything");
        let args: Value = sonic_rs::from_str(&out.calls[0].arguments).unwrap();
        assert_eq!(args["n"].as_u64(), Some(1), "a value of no declared type is read as JSON");
    }

    #[test]
    fn a_forced_call_is_one_json_schema_of_the_offered_tools() {
        let tools = r##""tools":[
            {"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"$ref":"#/$defs/A"}},"$defs":{"A":{"type":"integer"}}}}},
            {"type":"function","function":{"name":"g"}}]"##;
        let req = |choice: &str| body(&format!("{{{tools},\"tool_choice\":{choice}}}"));
        let schema: Value = sonic_rs::from_str(&tool_constraint(&req(r#""required""#)).unwrap()).unwrap();
        assert_eq!(schema["type"].as_str(), Some("array"));
        assert_eq!(schema["minItems"].as_u64(), Some(1));
        let any = schema["items"]["anyOf"].as_array().unwrap();
        assert_eq!(any.len(), 2);
        assert_eq!(any[0]["properties"]["name"]["enum"][0].as_str(), Some("f"));
        assert_eq!(any[0]["properties"]["parameters"]["properties"]["a"]["$ref"].as_str(), Some("#/$defs/A"));
        assert_eq!(any[1]["properties"]["parameters"].as_object().map(|o| o.len()), Some(0), "no parameters: {{}}");
        assert_eq!(schema["$defs"]["A"]["type"].as_str(), Some("integer"));

        let named = tool_constraint(&req(r#"{"type":"function","function":{"name":"g"}}"#)).unwrap();
        assert_eq!(named, "{}");
        let only_f = r#"{"type":"allowed_tools","allowed_tools":{"mode":"required","tools":[{"type":"function","function":{"name":"f"}}]}}"#;
        let schema: Value = sonic_rs::from_str(&tool_constraint(&req(only_f)).unwrap()).unwrap();
        assert_eq!(schema["items"]["anyOf"].as_array().unwrap().len(), 1);
        for free in [r#""auto""#, r#""none""#] {
            assert_eq!(tool_constraint(&req(free)), None, "{free}");
        }

        // The constrained answers are read as that JSON.
        let p = ModelParsers { reasoning: None, tools: Some("qwen") };
        let plan = OutputPlan::of_chat(&req(r#"{"type":"function","function":{"name":"g"}}"#), p, false, false);
        assert_eq!(plan.tools, Some(ToolPlan::Named("g".into())));
        let mut chain = plan.parser();
        let mut out = Parsed::default();
        chain.push(" {\"x\": 1}", &mut out);
        chain.finish(&mut out);
        assert_eq!(out.calls, vec![Call { name: "g".into(), arguments: "{\"x\": 1}".into() }]);
        let plan = OutputPlan::of_chat(&req(r#""required""#), p, false, false);
        assert!(matches!(plan.tools, Some(ToolPlan::Family("json", _))));
        let mut out = Parsed::default();
        let mut chain =
            OutputPlan::of_chat(&req(r#"{"type":"function","function":{"name":"g"}}"#), p, false, false).parser();
        chain.push("not json", &mut out);
        chain.finish(&mut out);
        assert_eq!((out.content.as_str(), out.calls.len()), ("not json", 0));
    }

    #[test]
    fn kimi_tools_declared_on_a_system_message_join_the_requests() {
        let p = ModelParsers { reasoning: None, tools: Some("kimik2") };
        let b = body(
            r#"{"messages":[{"role":"system","tools":[{"type":"function","function":{"name":"f"}}]},{"role":"user","content":"x"}]}"#,
        );
        let plan = OutputPlan::of_chat(&b, p, false, false);
        let Some(ToolPlan::Family("kimik2", t)) = &plan.tools else { panic!("{plan:?}") };
        assert!(t.declares("f") && !t.declares("g"));
        let qwen = ModelParsers { reasoning: None, tools: Some("qwen") };
        assert!(OutputPlan::of_chat(&b, qwen, false, false).tools.is_none(), "only Kimi's profile reads them");
    }

    #[test]
    fn kimi_ids_count_the_calls_already_made() {
        let p = ModelParsers { reasoning: None, tools: Some("kimik2") };
        let b = body(
            r#"{"tools":[{"type":"function","function":{"name":"f"}}],"messages":[
            {"role":"user","content":"x"},
            {"role":"assistant","tool_calls":[{"id":"functions.f:0","type":"function","function":{"name":"f","arguments":"{}"}},
                                              {"id":"functions.f:1","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","content":"1"}]}"#,
        );
        let plan = OutputPlan::of_chat(&b, p, false, false);
        let call = Call { name: "f".into(), arguments: "{}".into() };
        assert_eq!(plan.call_id(&call, 0), "functions.f:2");
        assert_eq!(plan.call_id(&call, 1), "functions.f:3");
        let other = OutputPlan::default().call_id(&call, 0);
        assert!(other.starts_with("call_") && other.len() == 29, "{other}");
    }
}
