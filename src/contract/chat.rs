//! `/v1/chat/completions`: read the request once, apply SMG's field and cross-field rules.

use std::borrow::Cow;

use super::error::ContractError;
use super::fields::{self, Result};
use super::json::{Doc, Kind};
use super::messages::{self, Message, Role};
use super::sampling::Sampling;
use super::tools::{self, ResponseFormat, Tool, ToolChoice};

/// `thinking.type` values.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ThinkingType {
    Enabled,
    Disabled,
    Adaptive,
}

/// A chat request as tape indices plus the typed values the rules need.
pub struct Chat<'a> {
    pub doc: Doc<'a>,
    /// The `model` string value, as sent.
    pub model: usize,
    pub model_name: Cow<'a, str>,
    pub messages_value: usize,
    pub messages: Vec<Message>,
    pub s: Sampling,
    pub logprobs: bool,
    pub top_logprobs: Option<u32>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub tools_value: Option<usize>,
    pub tools: Vec<Tool<'a>>,
    pub tool_choice: Option<ToolChoice<'a>>,
    pub response_format: Option<ResponseFormat>,
    /// `reasoning_effort` value: a string or a number.
    pub reasoning_effort: Option<usize>,
    /// `thinking` object.
    pub thinking: Option<usize>,
    pub thinking_type: Option<ThinkingType>,
    /// `thinking.effort` string value.
    pub thinking_effort: Option<usize>,
    /// `thinking.clear_thinking` value.
    pub clear_thinking: Option<usize>,
    /// `chat_template_kwargs` object.
    pub chat_template_kwargs: Option<usize>,
    /// Key index of a top-level `tool_stream` member (z.ai drops it).
    pub tool_stream_key: Option<usize>,
}

impl Drop for Chat<'_> {
    fn drop(&mut self) {
        messages::give_back(std::mem::take(&mut self.messages));
    }
}

/// Read and type-check every modeled top-level field (mismatches are `json_parse_error`).
pub fn read(doc: Doc<'_>) -> Result<Chat<'_>> {
    if doc.kind(0) != Kind::Object {
        return Err(fields::invalid_type(&doc, 0, "request", "struct ChatCompletionRequest"));
    }
    let mut model = None;
    let mut messages_value = None;
    let mut c = Fields::default();
    for (k, v) in doc.members(0) {
        let key = doc.key(k);
        if c.s.read(&doc, &key, v)? {
            continue;
        }
        match &*key {
            b"model" => model = fields::string_idx(&doc, v, "model")?,
            b"messages" => messages_value = fields::array(&doc, v, "messages")?,
            b"logprobs" => c.logprobs = fields::boolean(&doc, v, "logprobs")?.unwrap_or(false),
            b"top_logprobs" => c.top_logprobs = fields::uint32(&doc, v, "top_logprobs")?,
            b"max_tokens" => c.max_tokens = fields::uint32(&doc, v, "max_tokens")?,
            b"max_completion_tokens" => c.max_completion_tokens = fields::uint32(&doc, v, "max_completion_tokens")?,
            b"tools" => c.tools_value = Some(v),
            b"tool_choice" => c.tool_choice = Some(v),
            b"response_format" => c.response_format = Some(v),
            b"reasoning_effort" => {
                c.reasoning_effort = match doc.kind(v) {
                    Kind::Null => None,
                    Kind::String | Kind::Number => Some(v),
                    _ => return Err(fields::invalid_type(&doc, v, "reasoning_effort", "a string or a number")),
                }
            }
            b"thinking" => c.thinking = fields::object(&doc, v, "thinking")?,
            b"chat_template_kwargs" => c.chat_template_kwargs = fields::object(&doc, v, "chat_template_kwargs")?,
            b"tool_stream" => c.tool_stream_key = Some(k),
            b"parallel_tool_calls" | b"continue_final_message" | b"separate_reasoning" | b"stream_reasoning" => {
                fields::boolean(&doc, v, std::str::from_utf8(&key).unwrap_or("field"))?;
            }
            b"seed" => {
                fields::integer(&doc, v, "seed", "i64", i64::MIN as i128, i64::MAX as i128)?;
            }
            _ => {}
        }
    }
    let model = model.ok_or_else(|| fields::missing("model"))?;
    let messages_value = messages_value.ok_or_else(|| fields::missing("messages"))?;
    let tools = match c.tools_value {
        Some(v) => tools::scan_tools(&doc, v)?,
        None => Vec::new(),
    };
    let tool_choice = match c.tool_choice {
        Some(v) => tools::parse_tool_choice(&doc, v)?,
        None => None,
    };
    let response_format = match c.response_format {
        Some(v) => tools::parse_response_format(&doc, v)?,
        None => None,
    };
    let (mut thinking_type, mut thinking_effort, mut clear_thinking) = (None, None, None);
    if let Some(t) = c.thinking {
        for (k, v) in doc.members(t) {
            match &*doc.key(k) {
                b"type" => {
                    thinking_type = match fields::string(&doc, v, "thinking.type")?.as_deref() {
                        None => None,
                        Some("enabled") => Some(ThinkingType::Enabled),
                        Some("disabled") => Some(ThinkingType::Disabled),
                        Some("adaptive") => Some(ThinkingType::Adaptive),
                        Some(other) => {
                            return Err(ContractError::data(format!(
                            "thinking.type: unknown variant `{}`, expected one of `enabled`, `disabled`, `adaptive`",
                            other.chars().take(64).collect::<String>()
                        )))
                        }
                    }
                }
                b"effort" => thinking_effort = fields::string_idx(&doc, v, "thinking.effort")?,
                b"keep" => {
                    fields::string_idx(&doc, v, "thinking.keep")?;
                }
                b"clear_thinking" => {
                    clear_thinking = fields::boolean(&doc, v, "thinking.clear_thinking")?.map(|_| v);
                }
                _ => {}
            }
        }
    }
    let model_name = doc.str(model);
    Ok(Chat {
        model,
        model_name,
        messages_value,
        messages: Vec::new(),
        s: c.s,
        logprobs: c.logprobs,
        top_logprobs: c.top_logprobs,
        max_tokens: c.max_tokens,
        max_completion_tokens: c.max_completion_tokens,
        tools_value: c.tools_value,
        tools,
        tool_choice,
        response_format,
        reasoning_effort: c.reasoning_effort,
        thinking: c.thinking,
        thinking_type,
        thinking_effort,
        clear_thinking,
        chat_template_kwargs: c.chat_template_kwargs,
        tool_stream_key: c.tool_stream_key,
        doc,
    })
}

/// Scratch for [`read`]'s single pass.
#[derive(Default)]
struct Fields {
    s: Sampling,
    logprobs: bool,
    top_logprobs: Option<u32>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    tools_value: Option<usize>,
    tool_choice: Option<usize>,
    response_format: Option<usize>,
    reasoning_effort: Option<usize>,
    thinking: Option<usize>,
    chat_template_kwargs: Option<usize>,
    tool_stream_key: Option<usize>,
}

// === impl Chat ===

impl<'a> Chat<'a> {
    pub fn scan_messages(&mut self, declared_tools_ok: bool) -> Result<()> {
        self.messages = messages::scan(&self.doc, self.messages_value, declared_tools_ok)?;
        Ok(())
    }

    /// SMG's per-field rules, in its struct order; the first failure is reported.
    pub fn check_fields(&self) -> Result<()> {
        messages::validate(&self.doc, &self.messages)?;
        let s = &self.s;
        super::sampling::range("frequency_penalty", s.frequency_penalty, -2.0, 2.0)?;
        if self.max_tokens == Some(0) {
            return Err(ContractError::field("max_tokens must be at least 1"));
        }
        if self.max_completion_tokens == Some(0) {
            return Err(ContractError::field("max_completion_tokens must be at least 1"));
        }
        s.check_n(10)?;
        super::sampling::range("presence_penalty", s.presence_penalty, -2.0, 2.0)?;
        s.check_stop(&self.doc)?;
        s.check_temperature()?;
        if self.top_logprobs.is_some_and(|t| t > 20) {
            return Err(ContractError::field("top_logprobs must be between 0 and 20"));
        }
        s.check_top_p()?;
        s.check_extensions()?;
        // `min_tokens: 0` is allowed: the contract sets no lower bound (SMG accepts it).
        Ok(())
    }

    /// SMG's cross-field rules. `tools` includes any profile-declared message tools.
    pub fn check_cross(&self, tools: &[Tool<'_>]) -> Result<()> {
        if self.top_logprobs.is_some() && !self.logprobs {
            return Err(ContractError::rule("top_logprobs is only allowed when logprobs is enabled"));
        }
        self.s.check_stream_options()?;
        // `max_tokens` is migrated into `max_completion_tokens` when that is unset.
        let max = self.max_completion_tokens.or(self.max_tokens);
        if let (Some(min), Some(max)) = (self.s.min_tokens, max) {
            if min > max {
                return Err(ContractError::rule("min_tokens cannot exceed max_tokens/max_completion_tokens"));
            }
        }
        let json_format =
            matches!(self.response_format, Some(ResponseFormat::JsonObject | ResponseFormat::JsonSchema(_)));
        if json_format && self.s.regex {
            return Err(ContractError::rule("cannot use regex constraint with JSON response format"));
        }
        if json_format && self.s.ebnf {
            return Err(ContractError::rule("cannot use EBNF constraint with JSON response format"));
        }
        let schema = matches!(self.response_format, Some(ResponseFormat::JsonSchema(_)));
        if u8::from(self.s.regex) + u8::from(self.s.ebnf) + u8::from(schema) > 1 {
            return Err(ContractError::rule(
                "only one structured output constraint (regex, ebnf, or json_schema) can be active at a time",
            ));
        }
        if let Some(ResponseFormat::JsonSchema(js)) = self.response_format {
            tools::check_json_schema(&self.doc, js)?;
        }
        if let Some(choice) = &self.tool_choice {
            tools::check_tool_choice(choice, tools)?;
        }
        Ok(())
    }

    /// `reasoning_effort` as a string: a number becomes its decimal string.
    pub fn reasoning_effort_text(&self) -> Option<Cow<'a, str>> {
        let v = self.reasoning_effort?;
        Some(match self.doc.kind(v) {
            Kind::Number => Cow::Owned(decimal(&self.doc, v)),
            _ => self.doc.str(v),
        })
    }

    pub fn thinking_effort_text(&self) -> Option<Cow<'a, str>> {
        self.thinking_effort.map(|v| self.doc.str(v))
    }

    /// `thinking.effort` when present, otherwise `reasoning_effort`.
    pub fn effective_effort(&self) -> Option<Cow<'a, str>> {
        self.thinking_effort_text().or_else(|| self.reasoning_effort_text())
    }

    pub fn messages_with(&self, role: Role) -> impl Iterator<Item = &Message> {
        self.messages.iter().filter(move |m| m.role == role)
    }
}

/// A number token as a decimal string: as sent unless it uses an exponent.
pub fn decimal(doc: &Doc<'_>, v: usize) -> String {
    let raw = std::str::from_utf8(doc.raw(v)).unwrap_or("0");
    if raw.bytes().any(|b| b == b'e' || b == b'E') {
        format!("{}", doc.number(v))
    } else {
        raw.to_string()
    }
}
