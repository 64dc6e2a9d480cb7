//! Mistral (`mistral`): the calls as one JSON array after the `[TOOL_CALLS]` token,
//!
//! ```text
//! [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "search", "arguments": {}}]
//! ```
//!
//! (Mistral 7B v0.3 / Mixtral; any whitespace may follow the token). The calls are given out
//! when the array closes, all of them or, if one is not a declared call, none: then the whole
//! `[TOOL_CALLS] […]` is content. The newer `[TOOL_CALLS]name[ARGS]{…}` form is not read
//! (SMG does not read it either): it comes back as content.

use super::json::{Run, Shape};
use crate::{ToolParser, Tools};

const SHAPE: Shape =
    Shape { token: Some("[TOOL_CALLS]"), bare: b"", values: b"[", separator: None, closes: true, name_keys: &["name"] };

pub(crate) fn new(tools: Tools) -> Box<dyn ToolParser> {
    Box::new(Run::new(SHAPE, tools))
}

#[cfg(test)]
mod tests {
    use crate::testing::every_cut;
    use crate::tools::json_call::{call, tools};
    use crate::{Call, Parsed};

    fn check(text: &str, content: &str, calls: &[Call]) {
        let got = every_cut(|| crate::tools::by_name("mistral", tools()).unwrap(), text);
        assert_eq!(got.content, content, "{text:?}");
        assert_eq!(got.calls, calls, "{text:?}");
    }

    #[test]
    fn single_call() {
        check(
            r#"[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]"#,
            "",
            &[call("get_weather", r#"{"city": "Paris"}"#)],
        );
        check(r#"[TOOL_CALLS][{"name": "search"}]"#, "", &[call("search", "{}")]);
    }

    #[test]
    fn two_calls() {
        let want = [call("get_weather", r#"{"city": "Paris"}"#), call("search", r#"{"q": "[x]"}"#)];
        check(
            r#"[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "search", "arguments": {"q": "[x]"}}]"#,
            "",
            &want,
        );
        check(
            "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]\n[TOOL_CALLS] [{\"name\": \"search\", \"arguments\": {\"q\": \"[x]\"}}]\n",
            "",
            &want,
        );
    }

    #[test]
    fn text_around_calls() {
        check(
            r#"Let me check. [TOOL_CALLS] [{"name": "search", "arguments": {}}] Done."#,
            "Let me check.  Done.",
            &[call("search", "{}")],
        );
    }

    #[test]
    fn undeclared_function_is_content() {
        let text = r#"[TOOL_CALLS] [{"name": "search"}, {"name": "format_disk"}]"#;
        check(text, text, &[]);
    }

    #[test]
    fn invalid_json_is_content() {
        for text in [
            r#"[TOOL_CALLS] [{"name": "search", "arguments": {"q": "x"]}]"#,
            r#"[TOOL_CALLS] []"#,
            r#"[TOOL_CALLS] {"name": "search"}"#,
            "[TOOL_CALLS]search[ARGS]{}",
        ] {
            check(text, text, &[]);
        }
    }

    #[test]
    fn unclosed_is_content() {
        let text = r#"Ok [TOOL_CALLS] [{"name": "search", "arguments": {}}"#;
        check(text, text, &[]);
        check("[TOOL_CAL", "[TOOL_CAL", &[]);
    }

    #[test]
    fn non_ascii_arguments_survive() {
        let args = r#"{"city": "東京", "icon": "⛅️🇯🇵"}"#;
        let text = format!(r#"天気 [TOOL_CALLS] [{{"name": "get_weather", "arguments": {args}}}]"#);
        check(&text, "天気 ", &[call("get_weather", args)]);
    }

    #[test]
    fn split_begin_token() {
        let mut p = crate::tools::by_name("mistral", tools()).unwrap();
        let mut out = Parsed::default();
        p.push("[1] [TOOL_", &mut out);
        assert_eq!(out.content, "[1] ");
        p.push("CALLS] [{\"name\": \"search\"}]", &mut out);
        assert_eq!(out.calls, [call("search", "{}")]);
        p.finish(&mut out);
        assert_eq!(out.content, "[1] ");
    }
}
