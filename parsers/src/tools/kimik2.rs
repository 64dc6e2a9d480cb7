//! Kimi K2 (`kimik2`): calls inside a section, each named by an id `functions.NAME:INDEX`,
//!
//! ```text
//! <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>
//! ```
//!
//! The index counts the answer's calls; it is not needed (calls are given out in order). As
//! SMG does, the `functions.` prefix may be missing and whitespace may surround the id.

use super::json_call::{object_text, Markup, Tagged};
use crate::{Call, ToolParser, Tools};

const MARKUP: Markup = Markup {
    section: Some(("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")),
    call: ("<|tool_call_begin|>", "<|tool_call_end|>"),
    body,
};

const ARGUMENTS: &str = "<|tool_call_argument_begin|>";

fn body(text: &str) -> Option<Call> {
    let (id, arguments) = text.split_once(ARGUMENTS)?;
    let id = id.trim();
    let (name, index) = id.strip_prefix("functions.").unwrap_or(id).rsplit_once(':')?;
    if name.is_empty() || index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Call { name: name.to_owned(), arguments: object_text(arguments)?.to_owned() })
}

pub(crate) fn new(tools: Tools) -> Box<dyn ToolParser> {
    Box::new(Tagged::new(MARKUP, tools))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::every_cut;
    use crate::tools::json_call::{call, tools};
    use crate::Parsed;

    const BEGIN: &str = "<|tool_calls_section_begin|>";
    const END: &str = "<|tool_calls_section_end|>";

    fn check(text: &str, content: &str, calls: &[Call]) {
        let got = every_cut(|| crate::tools::by_name("kimik2", tools()).unwrap(), text);
        assert_eq!(got.content, content, "{text:?}");
        assert_eq!(got.calls, calls, "{text:?}");
    }

    fn one(id: &str, args: &str) -> String {
        format!("<|tool_call_begin|>{id}{ARGUMENTS}{args}<|tool_call_end|>")
    }

    #[test]
    fn single_call() {
        let text = format!("{BEGIN}{}{END}", one("functions.get_weather:0", r#"{"city": "Paris"}"#));
        check(&text, "", &[call("get_weather", r#"{"city": "Paris"}"#)]);
    }

    #[test]
    fn two_calls() {
        let text = format!(
            "{BEGIN}{}\n{}{END}",
            one("functions.get_weather:0", r#"{"city": "Paris"}"#),
            one(" search:1 ", r#" {"q": "x"} "#)
        );
        check(&text, "", &[call("get_weather", r#"{"city": "Paris"}"#), call("search", r#"{"q": "x"}"#)]);
    }

    #[test]
    fn text_around_calls() {
        let text = format!("Let me look.{BEGIN}{}{END}\nFound it.", one("functions.search:0", "{}"));
        check(&text, "Let me look.\nFound it.", &[call("search", "{}")]);
    }

    #[test]
    fn undeclared_function_is_content() {
        let text = format!("{BEGIN}{}{END}", one("functions.launch:0", "{}"));
        check(&text, &text, &[]);
    }

    #[test]
    fn malformed_is_content() {
        for (id, args) in [
            ("functions.search:0", r#"{"q": "#),
            ("functions.search:0", "[]"),
            ("functions.search", "{}"),
            ("functions.search:x", "{}"),
            ("functions.:0", "{}"),
        ] {
            let text = format!("{BEGIN}{}{END}", one(id, args));
            check(&text, &text, &[]);
        }
        let text = format!("{BEGIN}<|tool_call_begin|>functions.search:0{{}}<|tool_call_end|>{END}");
        check(&text, &text, &[]);
    }

    #[test]
    fn unclosed_is_content() {
        let text = format!("{BEGIN}<|tool_call_begin|>functions.search:0{ARGUMENTS}{{\"q\": 1}}");
        check(&text, &text, &[]);
        check("<|tool_calls_sec", "<|tool_calls_sec", &[]);
    }

    #[test]
    fn non_ascii_arguments_survive() {
        let args = r#"{"city": "東京", "emoji": "🗼✨"}"#;
        let text = format!("{BEGIN}{}{END}", one("functions.get_weather:0", args));
        check(&text, "", &[call("get_weather", args)]);
    }

    #[test]
    fn split_begin_token() {
        let mut p = crate::tools::by_name("kimik2", tools()).unwrap();
        let mut out = Parsed::default();
        p.push("a<|tool_calls_", &mut out);
        assert_eq!(out.content, "a");
        p.push(&format!("section_begin|>{}{END}", one("search:0", "{}")), &mut out);
        p.finish(&mut out);
        assert_eq!(out.content, "a");
        assert_eq!(out.calls, [call("search", "{}")]);
    }
}
