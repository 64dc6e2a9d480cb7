//! Qwen 2.5 / Qwen3 (`qwen`): each call is one JSON object between its own tags,
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! and several calls are several such blocks, one after another. The chat template writes the
//! newlines; any JSON whitespace is accepted there. `parameters` is read when `arguments` is
//! missing (SMG's streaming path accepts it too).

use super::json_call::{call_object, Markup, Tagged};
use crate::{Call, ToolParser, Tools};

const MARKUP: Markup = Markup { section: None, call: ("<tool_call>", "</tool_call>"), body };

fn body(text: &str) -> Option<Call> {
    call_object(text, &["name"])
}

pub(crate) fn new(tools: Tools) -> Box<dyn ToolParser> {
    Box::new(Tagged::new(MARKUP, tools))
}

#[cfg(test)]
mod tests {
    use crate::testing::every_cut;
    use crate::tools::json_call::{call, tools};
    use crate::{Call, Parsed};

    fn parse(text: &str) -> Parsed {
        every_cut(|| crate::tools::by_name("qwen", tools()).unwrap(), text)
    }

    fn check(text: &str, content: &str, calls: &[Call]) {
        let got = parse(text);
        assert_eq!(got.content, content, "{text:?}");
        assert_eq!(got.calls, calls, "{text:?}");
        assert!(got.reasoning.is_empty());
    }

    const WEATHER: &str =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

    #[test]
    fn single_call() {
        check(WEATHER, "", &[call("get_weather", r#"{"city": "Paris"}"#)]);
    }

    #[test]
    fn two_calls() {
        let text = format!(
            "{WEATHER}\n<tool_call>\n{{\"name\": \"search\", \"arguments\": {{\"q\": \"rust\"}}}}\n</tool_call>\n"
        );
        check(&text, "", &[call("get_weather", r#"{"city": "Paris"}"#), call("search", r#"{"q": "rust"}"#)]);
    }

    #[test]
    fn text_around_calls() {
        let text = format!("Let me check.\n{WEATHER}\nIt is sunny.");
        check(&text, "Let me check.\n\nIt is sunny.", &[call("get_weather", r#"{"city": "Paris"}"#)]);
    }

    #[test]
    fn parameters_and_no_arguments() {
        check(
            "<tool_call>{\"name\": \"search\", \"parameters\": {\"q\": 1}}</tool_call><tool_call>{\"name\": \"search\"}</tool_call>",
            "",
            &[call("search", r#"{"q": 1}"#), call("search", "{}")],
        );
    }

    #[test]
    fn undeclared_function_is_content() {
        let text = "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>";
        check(text, text, &[]);
    }

    #[test]
    fn malformed_is_content() {
        for text in [
            "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": }\n</tool_call>",
            "<tool_call>\n{\"name\": \"search\", \"arguments\": \"q\"}\n</tool_call>",
            "<tool_call>\n[\"search\"]\n</tool_call>",
            "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
        ] {
            check(text, text, &[]);
        }
    }

    #[test]
    fn bad_call_between_good_ones() {
        let bad = "<tool_call>{\"name\": \"nope\"}</tool_call>";
        let text = format!("{WEATHER}\n{bad}\n{WEATHER}");
        let weather = call("get_weather", r#"{"city": "Paris"}"#);
        check(&text, &format!("{bad}\n"), &[weather.clone(), weather]);
    }

    #[test]
    fn unclosed_is_content() {
        let text = "Sure. <tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}\n</tool_ca";
        check(text, text, &[]);
        let text = format!("{WEATHER}\n<tool_call>\n{{\"name\"");
        check(&text, "<tool_call>\n{\"name\"", &[call("get_weather", r#"{"city": "Paris"}"#)]);
    }

    #[test]
    fn non_ascii_arguments_survive() {
        let text = "天気: <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京\", \"mood\": \"☀️🌧\"}}\n</tool_call>";
        check(text, "天気: ", &[call("get_weather", r#"{"city": "東京", "mood": "☀️🌧"}"#)]);
    }

    #[test]
    fn near_miss_tokens_are_text() {
        check("a <tool_calls> b < c </tool_call>", "a <tool_calls> b < c </tool_call>", &[]);
        check("ends with <tool_c", "ends with <tool_c", &[]);
    }

    #[test]
    fn split_begin_token() {
        let mut p = crate::tools::by_name("qwen", tools()).unwrap();
        let mut out = Parsed::default();
        p.push("Hi <tool_", &mut out);
        assert_eq!(out.content, "Hi ");
        out.clear();
        p.push("call>{\"name\": \"search\"}</tool_call>", &mut out);
        assert_eq!(out.calls, [call("search", "{}")]);
        assert!(out.content.is_empty());
    }
}
