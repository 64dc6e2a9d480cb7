//! Chat templates: a model's Jinja template (from `tokenizer_config.json`, a
//! `chat_template.jinja` file or the GGUF) rendered with minijinja in the environment
//! transformers' `apply_chat_template` gives it: `trim_blocks` and `lstrip_blocks`, loop
//! controls, Python string/dict/list methods (minijinja-contrib's pycompat: `.strip()`,
//! `.startswith()`, `.items()`, …), `raise_exception`, `strftime_now`, a Python `tojson`,
//! and as variables the named special tokens, what the gateway passes (`reasoning_effort`,
//! `tool_choice`, `response_format`, the thinking decision under the template's own toggle),
//! `chat_template_kwargs` over those, then `messages`, `tools` and `add_generation_prompt`.

use std::collections::BTreeMap;

use minijinja::value::ValueKind;
use minijinja::{Environment, Error, ErrorKind, Value};

use super::config::TokenizerConfig;
use super::thinking::ThinkingStyle;

const NAME: &str = "chat";

/// What one chat request puts into the template. JSON values as the gateway parsed them.
#[derive(Debug, Clone, Copy, Default)]
pub struct TemplateInput<'a> {
    /// The `messages` array.
    pub messages: Option<&'a sonic_rs::Value>,
    pub add_generation_prompt: bool,
    pub tools: Option<&'a sonic_rs::Value>,
    pub reasoning_effort: Option<&'a str>,
    pub tool_choice: Option<&'a sonic_rs::Value>,
    pub response_format: Option<&'a sonic_rs::Value>,
    /// Whether the model starts in reasoning mode (None: the template's default), written
    /// under the template's toggle variable.
    pub thinking: Option<bool>,
    /// An object whose keys become template variables (`enable_thinking`, …); an entry
    /// wins over what the gateway passes.
    pub chat_template_kwargs: Option<&'a sonic_rs::Value>,
}

/// A compiled chat template; shared by every shard (minijinja's environment is Sync).
pub struct ChatTemplate {
    env: Environment<'static>,
    specials: Vec<(&'static str, String)>,
    thinking: ThinkingStyle,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("specials", &self.specials).finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; the named special tokens come from `config`.
    pub fn new(source: &str, config: &TokenizerConfig) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| e.to_string())?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", super::pyjson::tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        // Jinja's own tests where minijinja differs: None is not iterable (templates guard
        // `tools is iterable and tools | length > 0`), and strings and dicts are sequences.
        env.add_test("iterable", |v: Value| !v.is_none() && v.try_iter().is_ok());
        env.add_test("sequence", |v: Value| {
            v.is_undefined() || matches!(v.kind(), ValueKind::Seq | ValueKind::Map | ValueKind::String)
        });
        env.add_template_owned(NAME, source.to_string()).map_err(|e| format!("chat template: {e:#}"))?;
        let specials = config.special_tokens().map(|(k, v)| (k, v.to_string())).collect();
        Ok(ChatTemplate { env, specials, thinking: ThinkingStyle::detect(source) })
    }

    /// What the template's source says about thinking.
    pub fn thinking(&self) -> &ThinkingStyle {
        &self.thinking
    }

    /// Renders a chat request's prompt as the engine does from its body: `messages`, the
    /// tools (when any), `tool_choice`, `response_format`, the reasoning decision, and the
    /// generation prompt unless `continue_final_message`. Returns the text and whether the
    /// model starts in reasoning mode. One place for both readers: the gRPC request builder
    /// and the HTTP router's prompt ids (`kv/prompt_ids.rs`).
    pub fn render_request(&self, body: &sonic_rs::Value) -> Result<(String, bool), String> {
        use sonic_rs::{JsonContainerTrait, JsonValueTrait};
        let ask = super::thinking::ThinkingAsk::of_body(body);
        let decision = self.thinking.decide(&ask);
        let continue_final = body.get("continue_final_message").and_then(|v| v.as_bool()).unwrap_or(false);
        let input = TemplateInput {
            messages: body.get("messages"),
            add_generation_prompt: !continue_final,
            tools: body.get("tools").filter(|t| t.as_array().is_some_and(|a| !a.is_empty())),
            reasoning_effort: ask.effort,
            tool_choice: body.get("tool_choice"),
            response_format: body.get("response_format"),
            thinking: decision,
            chat_template_kwargs: ask.kwargs,
        };
        Ok((self.render(&input)?, self.thinking.thinks(decision)))
    }

    /// Renders the prompt text for `input`.
    pub fn render(&self, input: &TemplateInput) -> Result<String, String> {
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        for (k, v) in &self.specials {
            ctx.insert((*k).to_string(), Value::from(v.as_str()));
        }
        if let Some(effort) = input.reasoning_effort {
            ctx.insert("reasoning_effort".into(), Value::from(effort));
        }
        for (name, v) in [("tool_choice", input.tool_choice), ("response_format", input.response_format)] {
            if let Some(v) = v {
                ctx.insert(name.into(), super::json_value::to_value(v));
            }
        }
        if let (Some(on), Some(key)) = (input.thinking, self.thinking.key) {
            ctx.insert(key.into(), Value::from(on));
        }
        // transformers: `render(messages=…, tools=…, add_generation_prompt=…,
        // **special_tokens_map, **kwargs)`; a kwarg may replace a special token.
        if let Some(kw) = input.chat_template_kwargs.map(super::json_value::to_value) {
            if let Ok(keys) = kw.try_iter() {
                for k in keys {
                    if let (Some(name), Ok(v)) = (k.as_str(), kw.get_item(&k)) {
                        ctx.insert(name.to_string(), v);
                    }
                }
            }
        }
        let messages =
            input.messages.map(super::json_value::to_value).unwrap_or_else(|| Value::from(Vec::<Value>::new()));
        ctx.insert("messages".into(), messages);
        // Absent tools are `None` to Python templates (`{% if tools %}`, `tools is not none`).
        ctx.insert("tools".into(), input.tools.map(super::json_value::to_value).unwrap_or(Value::from(())));
        ctx.insert("add_generation_prompt".into(), Value::from(input.add_generation_prompt));
        let tmpl = self.env.get_template(NAME).map_err(|e| e.to_string())?;
        tmpl.render(Value::from(ctx)).map_err(|e| describe(&e))
    }
}

/// A template's own error (`raise_exception`) is its message; others keep minijinja's detail.
fn describe(e: &Error) -> String {
    match e.kind() {
        ErrorKind::InvalidOperation if e.detail().is_some() => e.detail().unwrap_or_default().to_string(),
        _ => format!("chat template: {e:#}"),
    }
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(fmt)`: the current UTC time in C's strftime format (templates show the
/// date to the model: `%d %b %Y`). The fields templates use are supported.
fn strftime_now(fmt: String) -> String {
    strftime(&fmt, crate::civil::from_unix(crate::civil::now_unix()))
}

fn strftime(fmt: &str, t: crate::civil::Civil) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
    let month = MONTHS[(t.month as usize).clamp(1, 12) - 1];
    let day = DAYS[(t.weekday as usize) % 7];
    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&t.year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", t.year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{:02}", t.month)),
            Some('d') => out.push_str(&format!("{:02}", t.day)),
            Some('-') => match chars.next() {
                Some('d') => out.push_str(&t.day.to_string()),
                Some('m') => out.push_str(&t.month.to_string()),
                Some(o) => {
                    out.push_str("%-");
                    out.push(o)
                }
                None => out.push_str("%-"),
            },
            Some('H') => out.push_str(&format!("{:02}", t.hour)),
            Some('M') => out.push_str(&format!("{:02}", t.minute)),
            Some('S') => out.push_str(&format!("{:02}", t.second)),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(day),
            Some('a') => out.push_str(&day[..3]),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o)
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> TokenizerConfig {
        TokenizerConfig { bos_token: Some("<s>".into()), eos_token: Some("</s>".into()), ..Default::default() }
    }

    fn json(s: &str) -> sonic_rs::Value {
        sonic_rs::from_str(s).unwrap()
    }

    #[test]
    fn python_methods_loop_controls_and_whitespace_control() {
        let src = "{{ bos_token }}{% for m in messages %}\n  {% if m.role == 'skip' %}{% continue %}{% endif %}\n{{ m['role'] | upper }}:{{ m.content.strip() }}{% if m.content.startswith(' ') %}!{% endif %}\n{% endfor %}{% if add_generation_prompt %}A:{% endif %}";
        let t = ChatTemplate::new(src, &cfg()).unwrap();
        let msgs = json(
            r#"[{"role":"user","content":" hi "},{"role":"skip","content":"x"},{"role":"assistant","content":"yo"}]"#,
        );
        let out = t
            .render(&TemplateInput { messages: Some(&msgs), add_generation_prompt: true, ..Default::default() })
            .unwrap();
        // trim_blocks eats the newline after each block tag, as Jinja does.
        assert_eq!(out, "<s>USER:hi!ASSISTANT:yoA:");
    }

    #[test]
    fn tools_kwargs_effort_and_raise_exception() {
        let src = "{% if tools %}{{ tools | tojson }}{% endif %}|{{ enable_thinking }}|{{ reasoning_effort | default('none') }}{% if messages | length == 0 %}{{ raise_exception('no messages') }}{% endif %}";
        let t = ChatTemplate::new(src, &cfg()).unwrap();
        let tools = json(r#"[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}]"#);
        let kw = json(r#"{"enable_thinking": false}"#);
        let msgs = json(r#"[{"role":"user","content":"q"}]"#);
        let input = TemplateInput {
            messages: Some(&msgs),
            tools: Some(&tools),
            reasoning_effort: Some("high"),
            chat_template_kwargs: Some(&kw),
            ..Default::default()
        };
        assert_eq!(
            t.render(&input).unwrap(),
            r#"[{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}]|False|high"#
        );
        let empty = json("[]");
        let err = t.render(&TemplateInput { messages: Some(&empty), ..Default::default() }).unwrap_err();
        assert_eq!(err, "no messages");
    }

    #[test]
    fn the_thinking_decision_goes_under_the_templates_toggle_and_kwargs_win() {
        let src = "{{ enable_thinking | default('unset') }}|{{ thinking | default('unset') }}|{{ tool_choice | default('-') }}|{{ reasoning_effort | default('-') }}";
        let t = ChatTemplate::new(src, &cfg()).unwrap();
        assert_eq!(t.thinking().key, Some("enable_thinking"));
        let choice = json(r#""auto""#);
        let input = TemplateInput { thinking: Some(false), tool_choice: Some(&choice), ..Default::default() };
        assert_eq!(t.render(&input).unwrap(), "False|unset|auto|-");
        let kw = json(r#"{"enable_thinking": true, "tool_choice": "none", "reasoning_effort": "low"}"#);
        let input = TemplateInput {
            thinking: Some(false),
            tool_choice: Some(&choice),
            reasoning_effort: Some("high"),
            chat_template_kwargs: Some(&kw),
            ..Default::default()
        };
        assert_eq!(t.render(&input).unwrap(), "True|unset|none|low");
        assert_eq!(t.render(&TemplateInput::default()).unwrap(), "unset|unset|-|-");
    }

    #[test]
    fn jinja_tests_follow_python() {
        let src =
            "{{ tools is iterable }}{{ x is iterable }}{{ 'ab' is sequence }}{{ {} is sequence }}{{ 1 is sequence }}";
        let t = ChatTemplate::new(src, &cfg()).unwrap();
        assert_eq!(t.render(&TemplateInput::default()).unwrap(), "FalseTrueTrueTrueFalse");
    }

    #[test]
    fn syntax_errors_are_reported_at_load() {
        assert!(ChatTemplate::new("{% for %}", &cfg()).unwrap_err().contains("chat template"));
    }

    #[test]
    fn strftime_fields() {
        let t = crate::civil::from_unix(1_735_787_045); // 2025-01-02 03:04:05 UTC, a Thursday
        assert_eq!(strftime("%d %b %Y %H:%M:%S %A %-d %B %%", t), "02 Jan 2025 03:04:05 Thursday 2 January %");
    }
}
