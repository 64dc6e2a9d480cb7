//! The generic JSON parser (`json`), and [`Run`], the engine for calls written as bare JSON
//! values (also Mistral's and Llama 3.2's).
//!
//! `json` is for models that answer a call with JSON alone (SMG maps GPT, Claude, Gemini,
//! Gemma, Llama 3.0/3.1 and GLM-4 ids to it): an output that starts, after whitespace, with
//!
//! ```text
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! [{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "search"}]
//! ```
//!
//! is a call attempt, whole: it is calls only if all of it is (one object, or one array of call
//! objects, then whitespace); otherwise all of it is content. The name may also sit under
//! `function`, the arguments under `parameters` (as SMG reads them).

use super::json_call::{call_array, call_object, find_token, is_blank, skip_ws, JsonEnd};
use crate::{Call, Parsed, ToolParser, Tools};

/// How one family writes its JSON calls.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    /// The token that opens calls anywhere in the text, if the family has one.
    pub token: Option<&'static str>,
    /// The first characters that make an output starting with them (after whitespace) a call
    /// attempt without a token: empty if only the token opens calls.
    pub bare: &'static [u8],
    /// What a value may open with: `{` a call object, `[` an array of call objects.
    pub values: &'static [u8],
    /// What may separate one value from the next (Llama's `;`); None: one value.
    pub separator: Option<u8>,
    /// The calls are final once their value closes (Mistral). Otherwise the rest of the
    /// output must be calls too, so they are given out at the end.
    pub closes: bool,
    /// Where a call object names its function.
    pub name_keys: &'static [&'static str],
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Whitespace only so far, and bare calls are possible.
    Start,
    Text,
    /// In calls: a value comes next.
    Expect,
    /// In a value opened at `start`.
    Value {
        start: usize,
        end: JsonEnd,
    },
    /// In calls, after a value: a separator or the end comes next.
    Between,
}

impl State {
    fn initial(shape: &Shape) -> Self {
        match shape.bare.is_empty() {
            true => State::Text,
            false => State::Start,
        }
    }
}

/// The engine. `buf[base..]` is what is not given out yet (in calls: from the calls' first
/// byte on); `at` is where scanning resumes.
pub(crate) struct Run {
    shape: Shape,
    tools: Tools,
    buf: String,
    base: usize,
    at: usize,
    state: State,
    /// Calls read but held until the whole attempt is known to be calls.
    pending: Vec<Call>,
    /// Calls were just given out: following whitespace is dropped if the end or more calls
    /// follow it.
    after_call: bool,
}

impl Run {
    pub(crate) fn new(shape: Shape, tools: Tools) -> Self {
        Self {
            shape,
            tools,
            buf: String::new(),
            base: 0,
            at: 0,
            state: State::initial(&shape),
            pending: Vec::new(),
            after_call: false,
        }
    }

    fn release(&mut self, upto: usize, out: &mut Parsed) {
        out.content.push_str(&self.buf[self.base..upto]);
        self.base = upto;
    }

    /// The calls were not calls: all of their text so far, up to `at`, is content.
    fn fail(&mut self, at: usize, out: &mut Parsed) -> bool {
        self.release(at, out);
        self.pending.clear();
        self.at = at;
        self.state = State::Text;
        true
    }

    /// One move; false when it needs more text.
    fn step(&mut self, out: &mut Parsed) -> bool {
        match self.state {
            State::Start => {
                self.at = skip_ws(&self.buf, self.at);
                let Some(&first) = self.buf.as_bytes().get(self.at) else {
                    return false;
                };
                // Leading whitespace belongs to the attempt (content if it fails).
                self.state = match self.shape.bare.contains(&first) {
                    true => State::Expect,
                    false => State::Text,
                };
                true
            }
            State::Text => self.text(out),
            State::Expect => {
                self.at = skip_ws(&self.buf, self.at);
                let Some(&first) = self.buf.as_bytes().get(self.at) else {
                    return false;
                };
                if !self.shape.values.contains(&first) {
                    return self.fail(self.at, out);
                }
                self.state = State::Value { start: self.at, end: JsonEnd::default() };
                true
            }
            State::Value { start, mut end } => {
                let Some(n) = end.scan(&self.buf.as_bytes()[self.at..]) else {
                    self.at = self.buf.len();
                    self.state = State::Value { start, end };
                    return false;
                };
                let close = self.at + n;
                let Some(calls) = self.calls(&self.buf[start..close]) else {
                    return self.fail(close, out);
                };
                self.pending.extend(calls);
                self.at = close;
                if self.shape.closes {
                    out.calls.append(&mut self.pending);
                    self.base = close;
                    self.after_call = true;
                    self.state = State::Text;
                } else {
                    self.state = State::Between;
                }
                true
            }
            State::Between => {
                self.at = skip_ws(&self.buf, self.at);
                let Some(&next) = self.buf.as_bytes().get(self.at) else {
                    return false;
                };
                if Some(next) != self.shape.separator {
                    return self.fail(self.at, out);
                }
                self.at += 1;
                self.state = State::Expect;
                true
            }
        }
    }

    /// The calls a closed value holds, if it is all declared calls.
    fn calls(&self, value: &str) -> Option<Vec<Call>> {
        let calls = match value.as_bytes().first() {
            Some(b'[') => call_array(value, self.shape.name_keys)?,
            _ => vec![call_object(value, self.shape.name_keys)?],
        };
        calls.iter().all(|call| self.tools.declares(&call.name)).then_some(calls)
    }

    fn text(&mut self, out: &mut Parsed) -> bool {
        let Some(token) = self.shape.token else {
            self.release(self.buf.len(), out);
            self.at = self.base;
            return false;
        };
        if self.after_call {
            self.at = skip_ws(&self.buf, self.at);
            let rest = &self.buf[self.at..];
            if rest.is_empty() || (token.starts_with(rest) && rest != token) {
                return false;
            }
            if rest.starts_with(token) {
                self.base = self.at;
            }
            self.after_call = false;
        }
        match find_token(&self.buf, self.at, token) {
            Ok(i) => {
                self.release(i, out);
                self.at = i + token.len();
                self.state = State::Expect;
                true
            }
            Err(held) => {
                self.release(held, out);
                self.at = held;
                false
            }
        }
    }
}

impl ToolParser for Run {
    fn push(&mut self, text: &str, out: &mut Parsed) {
        self.buf.push_str(text);
        while self.step(out) {}
        self.buf.drain(..self.base);
        self.at -= self.base;
        if let State::Value { start, .. } = &mut self.state {
            *start -= self.base;
        }
        self.base = 0;
    }

    fn finish(&mut self, out: &mut Parsed) {
        let rest = &self.buf[self.base..];
        match self.state {
            State::Expect | State::Between if !self.pending.is_empty() => {
                out.calls.append(&mut self.pending);
            }
            State::Text if self.after_call && is_blank(rest) => {}
            _ => out.content.push_str(rest),
        }
        self.buf.clear();
        (self.base, self.at) = (0, 0);
        self.pending.clear();
        self.after_call = false;
        self.state = State::initial(&self.shape);
    }
}

const SHAPE: Shape =
    Shape { token: None, bare: b"{[", values: b"{[", separator: None, closes: false, name_keys: &["name", "function"] };

pub(crate) fn new(tools: Tools) -> Box<dyn ToolParser> {
    Box::new(Run::new(SHAPE, tools))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::every_cut;
    use crate::tools::json_call::{call, tools};

    fn check(text: &str, content: &str, calls: &[Call]) {
        let got = every_cut(|| crate::tools::by_name("json", tools()).unwrap(), text);
        assert_eq!(got.content, content, "{text:?}");
        assert_eq!(got.calls, calls, "{text:?}");
    }

    #[test]
    fn single_call() {
        check(
            r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
            "",
            &[call("get_weather", r#"{"city": "Paris"}"#)],
        );
        check(
            "\n {\"function\": \"search\", \"parameters\": {\"q\": \"x\"}}\n",
            "",
            &[call("search", r#"{"q": "x"}"#)],
        );
    }

    #[test]
    fn two_calls() {
        check(
            r#"[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "search"}]"#,
            "",
            &[call("get_weather", r#"{"city": "Paris"}"#), call("search", "{}")],
        );
    }

    #[test]
    fn text_first_is_content() {
        let text = r#"Here: {"name": "search", "arguments": {}}"#;
        check(text, text, &[]);
    }

    #[test]
    fn trailing_text_makes_it_content() {
        let text = r#"{"name": "search", "arguments": {}} and more"#;
        check(text, text, &[]);
        let text = r#"{"name": "search"}{"name": "search"}"#;
        check(text, text, &[]);
    }

    #[test]
    fn undeclared_function_is_content() {
        let text = r#"[{"name": "search"}, {"name": "shutdown"}]"#;
        check(text, text, &[]);
    }

    #[test]
    fn invalid_json_is_content() {
        for text in [
            r#"{"name": "search", "arguments": {"q": }}"#,
            r#"{"answer": 42}"#,
            "[]",
            "[1, 2]",
            r#" {"name": "search", "arguments": [1]}"#,
        ] {
            check(text, text, &[]);
        }
    }

    #[test]
    fn unclosed_is_content() {
        let text = r#"{"name": "search", "arguments": {"q": "x"}"#;
        check(text, text, &[]);
        check("  ", "  ", &[]);
    }

    #[test]
    fn non_ascii_arguments_survive() {
        let args = r#"{"city": "東京", "note": "🎌 \"quoted\" }]"}"#;
        let text = format!(r#"{{"name": "get_weather", "arguments": {args}}}"#);
        check(&text, "", &[call("get_weather", args)]);
    }

    #[test]
    fn plain_text_streams_at_once() {
        let mut p = crate::tools::by_name("json", tools()).unwrap();
        let mut out = Parsed::default();
        p.push("  The answer", &mut out);
        assert_eq!(out.content, "  The answer");
        out.clear();
        p.push(" is {\"x\": 1}", &mut out);
        assert_eq!(out.content, " is {\"x\": 1}");
    }
}
