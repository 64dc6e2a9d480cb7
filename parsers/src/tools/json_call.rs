//! What the families whose arguments are JSON share: reading a call object, finding where a
//! JSON value ends in text that arrives in pieces, spotting a token cut across pieces, and
//! [`Tagged`], the engine for calls framed by begin and end tokens (Qwen, DeepSeek, Kimi K2).

use sonic_rs::{JsonValueTrait, Value};

use crate::{Call, Parsed, ToolParser, Tools};

/// JSON's own whitespace: the only kind allowed around a JSON text.
pub(crate) fn trim_json(text: &str) -> &str {
    text.trim_matches([' ', '\t', '\n', '\r'])
}

/// `text`, trimmed, if it is one JSON object: arguments are given out as the model wrote them.
pub(crate) fn object_text(text: &str) -> Option<&str> {
    let text = trim_json(text);
    let value: Value = sonic_rs::from_str(text).ok()?;
    value.is_object().then_some(text)
}

/// A call written as one JSON object: the function's name (a string) under the first of
/// `name_keys` that holds one, the arguments (an object, as written) under `arguments` or,
/// for the shapes that say so, `parameters`. No arguments: `{}`.
pub(crate) fn call_object(text: &str, name_keys: &[&str]) -> Option<Call> {
    let text = trim_json(text);
    let value: Value = sonic_rs::from_str(text).ok()?;
    let name = name_keys.iter().find_map(|key| value.get(*key).and_then(|v| v.as_str()))?;
    let arguments = match ["arguments", "parameters"].into_iter().find(|key| value.get(*key).is_some()) {
        None => "{}".to_owned(),
        Some(key) if value.get(key).is_some_and(|v| v.is_object()) => raw_member(text, key)?,
        Some(_) => return None,
    };
    Some(Call { name: name.to_owned(), arguments })
}

/// The text of the member `key` of the (valid) object `text`, as written.
fn raw_member(text: &str, key: &str) -> Option<String> {
    for member in sonic_rs::to_object_iter(text) {
        let (name, value) = member.ok()?;
        if name == key {
            return Some(value.as_raw_str().to_owned());
        }
    }
    None
}

/// Calls written as a JSON array of call objects (see [`call_object`]): all of them, or None
/// if the array is empty or one element is not a call.
pub(crate) fn call_array(text: &str, name_keys: &[&str]) -> Option<Vec<Call>> {
    let text = trim_json(text);
    // Validated whole first: the lazy iterator below would stop early, not fail, on some
    // malformed tails.
    let value: Value = sonic_rs::from_str(text).ok()?;
    if !value.is_array() {
        return None;
    }
    let mut calls = Vec::new();
    for element in sonic_rs::to_array_iter(text) {
        calls.push(call_object(element.ok()?.as_raw_str(), name_keys)?);
    }
    (!calls.is_empty()).then_some(calls)
}

/// Finds where a JSON object or array ends in text that arrives in pieces, each byte looked at
/// once: brackets are counted outside strings. What lies between is validated afterwards,
/// whole, so a mismatched bracket only makes a value end early and fail validation.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct JsonEnd {
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl JsonEnd {
    /// Scans on from where the last call stopped; `bytes` must start the value with its `{` or
    /// `[` the first time. The index just past the closing bracket, if it is in `bytes`.
    pub(crate) fn scan(&mut self, bytes: &[u8]) -> Option<usize> {
        for (i, &b) in bytes.iter().enumerate() {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
        }
        None
    }
}

/// How many bytes at the end of `text` are a proper prefix of `token`: they may become the
/// token with the next piece, so they are held back. (A token starts with an ASCII byte, so
/// the held part starts on a character boundary.)
pub(crate) fn partial_len(text: &str, token: &str) -> usize {
    let (text, token) = (text.as_bytes(), token.as_bytes());
    let longest = token.len().saturating_sub(1).min(text.len());
    // Only where the token's first byte sits is a full comparison made.
    (1..=longest).rev().find(|&n| text[text.len() - n] == token[0] && text[text.len() - n..] == token[..n]).unwrap_or(0)
}

/// The first index at or after `from` that is not JSON whitespace.
pub(crate) fn skip_ws(text: &str, from: usize) -> usize {
    text.as_bytes()[from..]
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .map_or(text.len(), |n| from + n)
}

/// Whether `text` is whitespace only (what is dropped after a call).
pub(crate) fn is_blank(text: &str) -> bool {
    skip_ws(text, 0) == text.len()
}

/// Where a `token` starts in `text` at or after `from`: `Ok(index)`; or, not there yet,
/// `Err(index)` where the part that may still become it starts (`text.len()` if none).
pub(crate) fn find_token(text: &str, from: usize, token: &str) -> Result<usize, usize> {
    find(text, from, token).ok_or_else(|| text.len() - partial_len(&text[from..], token))
}

/// Where `token` first occurs in `text` at or after `from`. A scan for its first byte, where
/// `str::find` would pay a set-up per call larger than the few bytes a piece brings. Each
/// token here holds its first byte nowhere else, so candidate matches cannot overlap and the
/// scan stays linear.
pub(crate) fn find(text: &str, from: usize, token: &str) -> Option<usize> {
    let (hay, token) = (text.as_bytes(), token.as_bytes());
    let first = *token.first()?;
    let start = from;
    let mut from = from;
    while let Some(skip) = hay[from..].iter().position(|&b| b == first) {
        let at = from + skip;
        if hay[at..].starts_with(token) {
            crate::scanned(at + 1 - start);
            return Some(at);
        }
        from = at + 1;
    }
    crate::scanned(hay.len() - start);
    None
}

/// A family's token-framed markup: calls `call.0 … call.1`, optionally all inside a section
/// `section.0 … section.1`.
#[derive(Clone, Copy)]
pub(crate) struct Markup {
    pub section: Option<(&'static str, &'static str)>,
    pub call: (&'static str, &'static str),
    /// Reads the text between a call's tokens: the call if it is well formed (its arguments
    /// a JSON object); whether the request declares it is checked after.
    pub body: fn(&str) -> Option<Call>,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Text,
    /// Inside a section; `calls`: one of its calls was given out.
    Section {
        calls: bool,
    },
    /// Inside a call whose begin token is at `start`; `section`: the enclosing section's
    /// `calls`, None outside a section.
    Call {
        start: usize,
        section: Option<bool>,
    },
}

/// The engine for token-framed markup. `buf[base..]` is what is not given out yet; `at` is
/// where scanning resumes, so no byte is looked at twice (bar a token's length held back).
pub(crate) struct Tagged {
    markup: Markup,
    tools: Tools,
    buf: String,
    base: usize,
    at: usize,
    state: State,
    /// A call was just given out: whitespace that follows is held, and dropped if another
    /// call or the end follows it.
    after_call: bool,
}

impl Tagged {
    pub(crate) fn new(markup: Markup, tools: Tools) -> Self {
        Self { markup, tools, buf: String::new(), base: 0, at: 0, state: State::Text, after_call: false }
    }

    fn release(&mut self, upto: usize, out: &mut Parsed) {
        out.content.push_str(&self.buf[self.base..upto]);
        self.base = upto;
    }

    /// The token that opens markup from plain text.
    fn opener(&self) -> &'static str {
        self.markup.section.map_or(self.markup.call.0, |s| s.0)
    }

    /// One move; false when it needs more text.
    fn step(&mut self, out: &mut Parsed) -> bool {
        match self.state {
            State::Text => self.text(out),
            State::Section { calls } => self.section(calls, out),
            State::Call { start, section } => self.call(start, section, out),
        }
    }

    fn text(&mut self, out: &mut Parsed) -> bool {
        let opener = self.opener();
        if self.after_call {
            self.at = skip_ws(&self.buf, self.at);
            let rest = &self.buf[self.at..];
            if rest.is_empty() || (opener.starts_with(rest) && rest != opener) {
                return false;
            }
            if rest.starts_with(opener) {
                self.base = self.at;
            }
            // Otherwise plain text follows, and the whitespace goes out with it.
            self.after_call = false;
        }
        match find_token(&self.buf, self.at, opener) {
            Ok(i) => {
                self.release(i, out);
                self.at = i + opener.len();
                self.state = match self.markup.section {
                    Some(_) => State::Section { calls: false },
                    None => State::Call { start: i, section: None },
                };
                true
            }
            Err(held) => {
                self.release(held, out);
                self.at = held;
                false
            }
        }
    }

    fn section(&mut self, calls: bool, out: &mut Parsed) -> bool {
        let (Some((_, close)), (begin, _)) = (self.markup.section, self.markup.call) else {
            return false;
        };
        self.at = skip_ws(&self.buf, self.at);
        let rest = &self.buf[self.at..];
        if rest.starts_with(begin) {
            if calls {
                // Whitespace between two calls' markup (this one valid or not) is dropped.
                self.base = self.at;
            }
            self.state = State::Call { start: self.at, section: Some(calls) };
            self.at += begin.len();
        } else if rest.starts_with(close) {
            let end = self.at + close.len();
            if calls {
                self.base = end;
            } else {
                self.release(end, out);
            }
            self.after_call = calls;
            self.at = end;
            self.state = State::Text;
        } else if rest.is_empty() || begin.starts_with(rest) || close.starts_with(rest) {
            return false;
        } else {
            // Plain text inside a section ends it: what was held goes out as written.
            self.release(self.at, out);
            self.state = State::Text;
        }
        true
    }

    fn call(&mut self, start: usize, section: Option<bool>, out: &mut Parsed) -> bool {
        let (begin, close) = self.markup.call;
        let Some(close_at) = find(&self.buf, self.at, close) else {
            let mut resume = (self.buf.len() + 1).saturating_sub(close.len()).max(start + begin.len());
            while !self.buf.is_char_boundary(resume) {
                resume -= 1;
            }
            self.at = resume;
            return false;
        };
        let end = close_at + close.len();
        let call =
            (self.markup.body)(&self.buf[start + begin.len()..close_at]).filter(|call| self.tools.declares(&call.name));
        let valid = call.is_some();
        match call {
            Some(call) => {
                out.calls.push(call);
                self.base = end;
            }
            None => self.release(end, out),
        }
        self.state = match section {
            Some(calls) => State::Section { calls: calls || valid },
            None => {
                self.after_call = valid;
                State::Text
            }
        };
        self.at = end;
        true
    }
}

impl ToolParser for Tagged {
    fn push(&mut self, text: &str, out: &mut Parsed) {
        self.buf.push_str(text);
        while self.step(out) {}
        // Forget what was given out, once a piece: positions move down with the text.
        self.buf.drain(..self.base);
        self.at -= self.base;
        if let State::Call { start, .. } = &mut self.state {
            *start -= self.base;
        }
        self.base = 0;
    }

    fn finish(&mut self, out: &mut Parsed) {
        let rest = &self.buf[self.base..];
        let drop_blank = match self.state {
            State::Text => self.after_call,
            State::Section { calls } => calls,
            State::Call { .. } => false,
        };
        if !(drop_blank && is_blank(rest)) {
            out.content.push_str(rest);
        }
        self.buf.clear();
        (self.base, self.at) = (0, 0);
        self.state = State::Text;
        self.after_call = false;
    }
}

/// The request's functions for the tests: `get_weather` and `search`.
#[cfg(test)]
pub(crate) fn tools() -> Tools {
    use crate::Tool;
    Tools::new(
        ["get_weather", "search"].into_iter().map(|name| Tool { name: name.to_owned(), params: Vec::new() }).collect(),
    )
}

/// A call, for the tests.
#[cfg(test)]
pub(crate) fn call(name: &str, arguments: &str) -> Call {
    Call { name: name.to_owned(), arguments: arguments.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_end_across_pieces() {
        let mut end = JsonEnd::default();
        assert_eq!(end.scan(br#"{"a": "}\"]"#), None);
        assert_eq!(end.scan(br#"", "b": [1, {}]"#), None);
        assert_eq!(end.scan(b"} tail"), Some(1));
    }

    #[test]
    fn partial_tokens() {
        assert_eq!(partial_len("text <tool", "<tool_call>"), 5);
        assert_eq!(partial_len("text <tool_call>", "<tool_call>"), 0);
        assert_eq!(partial_len("<", "<tool_call>"), 1);
        assert_eq!(partial_len("a < b", "<tool_call>"), 0);
        assert_eq!(find_token("ab<to", 0, "<tool_call>"), Err(2));
        assert_eq!(find_token("ab<tool_call>", 1, "<tool_call>"), Ok(2));
    }

    #[test]
    fn call_objects() {
        let keys = &["name"];
        assert_eq!(
            call_object(r#" {"name": "f", "arguments": {"a": "東京"}} "#, keys),
            Some(call("f", r#"{"a": "東京"}"#))
        );
        assert_eq!(call_object(r#"{"name": "f", "parameters": {"b": 1}}"#, keys), Some(call("f", r#"{"b": 1}"#)));
        assert_eq!(call_object(r#"{"name": "f"}"#, keys), Some(call("f", "{}")));
        assert_eq!(call_object(r#"{"name": "f", "arguments": "{}"}"#, keys), None);
        assert_eq!(call_object(r#"{"arguments": {}}"#, keys), None);
        assert_eq!(call_object(r#"{"name": 1, "arguments": {}}"#, keys), None);
        assert_eq!(call_object(r#"{"name": "f", "arguments": {}"#, keys), None);
        assert_eq!(call_object(r#"["f"]"#, keys), None);
        assert_eq!(
            call_array(r#"[{"name": "f"}, {"name": "g", "arguments": {"x": [1]}}]"#, keys),
            Some(vec![call("f", "{}"), call("g", r#"{"x": [1]}"#)])
        );
        assert_eq!(call_array("[]", keys), None);
        assert_eq!(call_array(r#"[{"name": "f"}, 1]"#, keys), None);
        assert_eq!(call_array(r#"[{"name": "f"}] x"#, keys), None);
    }
}

/// What `crate::markup` writes for these families (as the simulator answers) reads back.
#[cfg(test)]
mod markup_tests {
    use super::{call, tools};
    use crate::testing::every_cut;

    #[test]
    fn written_calls_read_back() {
        let args = [("city", "\"東京 🗼\""), ("days", "3")];
        let want = call("get_weather", r#"{"city": "東京 🗼", "days": 3}"#);
        for name in ["qwen", "deepseek", "deepseek31", "kimik2", "mistral", "llama", "json"] {
            let first = crate::markup::call(name, "get_weather", &args, 0).unwrap();
            let second = crate::markup::call(name, "get_weather", &args, 1).unwrap();
            let make = || crate::tools::by_name(name, tools()).unwrap();
            let got = every_cut(make, &first);
            assert_eq!((got.content.as_str(), got.calls), ("", vec![want.clone()]), "{name}");
            if crate::markup::stands_alone(name) {
                continue;
            }
            let text = format!("Let me check.\n\n{first}\n{second}\n");
            let got = every_cut(make, &text);
            assert_eq!(got.content, "Let me check.\n\n", "{name}");
            assert_eq!(got.calls, [want.clone(), want.clone()], "{name}");
        }
    }
}

/// `tools::for_model` (its tests live here: tools/mod.rs holds no tests of its own).
#[cfg(test)]
mod for_model_tests {
    use crate::tools::{by_name, for_model, NAMES};

    #[test]
    fn model_ids() {
        for (model, name) in [
            ("Qwen/Qwen3-8B", Some("qwen")),
            ("Qwen/Qwen2.5-7B-Instruct", Some("qwen")),
            ("Qwen/Qwen2.5-Coder-7B-Instruct", Some("qwen")),
            ("Qwen/Qwen3-Coder-30B-A3B-Instruct", Some("qwen_coder")),
            ("qwen3-coder-480b", Some("qwen_coder")),
            ("Qwen/Qwen3.5-397B-A17B", Some("qwen_coder")),
            ("deepseek-ai/DeepSeek-V3", Some("deepseek")),
            ("deepseek-ai/DeepSeek-V3-0324", Some("deepseek")),
            ("deepseek-ai/DeepSeek-V3.1", Some("deepseek31")),
            ("DeepSeek-V3.1-Terminus", Some("deepseek31")),
            ("deepseek-ai/DeepSeek-V3.2-Exp", Some("deepseek31")),
            ("deepseek-ai/DeepSeek-V3.2", None),
            ("deepseek-ai/DeepSeek-R1", Some("pythonic")),
            ("moonshotai/Kimi-K2-Instruct", Some("kimik2")),
            ("kimi-k2-instruct-0905", Some("kimik2")),
            ("moonshotai/Kimi-K3", None),
            ("meta-llama/Llama-4-Scout-17B-16E-Instruct", Some("pythonic")),
            ("meta-llama/Llama-3.2-3B-Instruct", Some("llama")),
            ("LLAMA-3.2-1B", Some("llama")),
            ("meta-llama/Llama-3.1-8B-Instruct", Some("json")),
            ("mistralai/Mistral-7B-Instruct-v0.3", Some("mistral")),
            ("mistralai/Mixtral-8x7B-Instruct-v0.1", Some("mistral")),
            ("zai-org/GLM-4.5", Some("glm45_moe")),
            ("zai-org/GLM-4.6", Some("glm45_moe")),
            ("zai-org/GLM-4.7", None),
            ("MiniMaxAI/MiniMax-M2", Some("minimax_m2")),
            ("stepfun-ai/step3", Some("step3")),
            ("gpt-4o", Some("json")),
            ("google/gemma-3-27b-it", Some("json")),
            ("CohereLabs/c4ai-command-a-03-2025", None),
            ("my-own-model", None),
            ("", None),
        ] {
            assert_eq!(for_model(model), name, "{model}");
            if let Some(name) = name {
                assert!(NAMES.contains(&name) && by_name(name, Default::default()).is_some());
            }
        }
    }
}
