//! Llama 3.2 (`llama`): a call is a JSON object with the arguments under `parameters`,
//!
//! ```text
//! <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}
//! ```
//!
//! after the `<|python_tag|>` token, or bare when the output starts (after whitespace) with
//! `{`. Several calls are separated by `;`. The model stops after its calls, so they are the
//! rest of the output: all of it must be calls (given out at the end), or all of it — the tag
//! and what follows, or the whole bare output — is content. `arguments` is read too when
//! `parameters` is missing (SMG's streaming path does).

use super::json::{Run, Shape};
use crate::{ToolParser, Tools};

const SHAPE: Shape = Shape {
    token: Some("<|python_tag|>"),
    bare: b"{",
    values: b"{",
    separator: Some(b';'),
    closes: false,
    name_keys: &["name"],
};

pub(crate) fn new(tools: Tools) -> Box<dyn ToolParser> {
    Box::new(Run::new(SHAPE, tools))
}

#[cfg(test)]
mod tests {
    use crate::testing::every_cut;
    use crate::tools::json_call::{call, tools};
    use crate::{Call, Parsed};

    fn check(text: &str, content: &str, calls: &[Call]) {
        let got = every_cut(|| crate::tools::by_name("llama", tools()).unwrap(), text);
        assert_eq!(got.content, content, "{text:?}");
        assert_eq!(got.calls, calls, "{text:?}");
    }

    #[test]
    fn single_call() {
        let want = [call("get_weather", r#"{"city": "Paris"}"#)];
        check(r#"<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}"#, "", &want);
        check(r#" {"name": "get_weather", "parameters": {"city": "Paris"}} "#, "", &want);
        check(r#"{"name": "search", "arguments": {}}"#, "", &[call("search", "{}")]);
    }

    #[test]
    fn two_calls() {
        check(
            r#"<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris; France"}}; {"name": "search", "parameters": {"q": "x"}};"#,
            "",
            &[call("get_weather", r#"{"city": "Paris; France"}"#), call("search", r#"{"q": "x"}"#)],
        );
    }

    #[test]
    fn text_before_a_call() {
        check(
            r#"I'll look it up.<|python_tag|>{"name": "search", "parameters": {"q": "x"}}"#,
            "I'll look it up.",
            &[call("search", r#"{"q": "x"}"#)],
        );
        let text = r#"Answer: {"name": "search", "parameters": {}}"#;
        check(text, text, &[]);
    }

    #[test]
    fn trailing_text_makes_it_content() {
        let text = r#"<|python_tag|>{"name": "search", "parameters": {}} done"#;
        check(text, text, &[]);
        let text = r#"{"name": "search", "parameters": {}} done"#;
        check(text, text, &[]);
    }

    #[test]
    fn undeclared_function_is_content() {
        let text = r#"{"name": "search", "parameters": {}}; {"name": "reboot", "parameters": {}}"#;
        check(text, text, &[]);
    }

    #[test]
    fn invalid_json_is_content() {
        for text in [
            r#"<|python_tag|>{"name": "search", "parameters": {"q": "x}}"#,
            r#"<|python_tag|>{"name": "search", "parameters": {"q": x}}"#,
            r#"{"name": "search", "parameters": "x"}"#,
            r#"<|python_tag|>[{"name": "search"}]"#,
            "<|python_tag|>",
        ] {
            check(text, text, &[]);
        }
    }

    #[test]
    fn unclosed_is_content() {
        let text = r#"<|python_tag|>{"name": "search", "parameters": {}"#;
        check(text, text, &[]);
    }

    #[test]
    fn non_ascii_arguments_survive() {
        let args = r#"{"city": "東京", "emoji": "🍣"}"#;
        let text = format!(r#"<|python_tag|>{{"name": "get_weather", "parameters": {args}}}"#);
        check(&text, "", &[call("get_weather", args)]);
    }

    #[test]
    fn split_begin_token() {
        let mut p = crate::tools::by_name("llama", tools()).unwrap();
        let mut out = Parsed::default();
        p.push("Sure<|python", &mut out);
        assert_eq!(out.content, "Sure");
        p.push("_tag|>{\"name\": \"search\"}", &mut out);
        p.finish(&mut out);
        assert_eq!(out.content, "Sure");
        assert_eq!(out.calls, [call("search", "{}")]);
    }
}
