//! DeepSeek V3 (`deepseek`) and V3.1 (`deepseek31`): calls inside a section of DeepSeek's
//! special tokens (fullwidth bars `｜`, `▁` for spaces). V3 types each call and fences its
//! arguments,
//!
//! ```text
//! <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
//! ```json
//! {"city": "Paris"}
//! ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//! ```
//!
//! V3.1 writes the name and the bare arguments:
//! `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>`.
//! Several calls follow each other inside the one section.

use super::json_call::{object_text, trim_json, Markup, Tagged};
use crate::{Call, ToolParser, Tools};

const SECTION: (&str, &str) = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>");
const CALL: (&str, &str) = ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>");
const SEP: &str = "<｜tool▁sep｜>";

/// V3: `function<｜tool▁sep｜>NAME\n```json\nARGS\n```` (the fence's newlines may be any
/// whitespace).
fn body_v3(text: &str) -> Option<Call> {
    let (kind, rest) = text.split_once(SEP)?;
    if kind.trim() != "function" {
        return None;
    }
    let (name, fenced) = rest.split_once("```json")?;
    let arguments = trim_json(fenced).strip_suffix("```")?;
    named(name, arguments)
}

/// V3.1: `NAME<｜tool▁sep｜>ARGS`.
fn body_v31(text: &str) -> Option<Call> {
    let (name, arguments) = text.split_once(SEP)?;
    named(name, arguments)
}

fn named(name: &str, arguments: &str) -> Option<Call> {
    let name = name.trim();
    (!name.is_empty()).then_some(())?;
    Some(Call { name: name.to_owned(), arguments: object_text(arguments)?.to_owned() })
}

pub(crate) fn v3(tools: Tools) -> Box<dyn ToolParser> {
    let markup = Markup { section: Some(SECTION), call: CALL, body: body_v3 };
    Box::new(Tagged::new(markup, tools))
}

pub(crate) fn v31(tools: Tools) -> Box<dyn ToolParser> {
    let markup = Markup { section: Some(SECTION), call: CALL, body: body_v31 };
    Box::new(Tagged::new(markup, tools))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::every_cut;
    use crate::tools::json_call::{call, tools};
    use crate::Parsed;

    fn parse(parser: &str, text: &str) -> Parsed {
        every_cut(|| crate::tools::by_name(parser, tools()).unwrap(), text)
    }

    fn check(parser: &str, text: &str, content: &str, calls: &[Call]) {
        let got = parse(parser, text);
        assert_eq!(got.content, content, "{parser}: {text:?}");
        assert_eq!(got.calls, calls, "{parser}: {text:?}");
    }

    fn v3_call(name: &str, args: &str) -> String {
        format!("{}function{SEP}{name}\n```json\n{args}\n```{}", CALL.0, CALL.1)
    }

    fn v31_call(name: &str, args: &str) -> String {
        format!("{}{name}{SEP}{args}{}", CALL.0, CALL.1)
    }

    fn section(calls: &[String]) -> String {
        format!("{}{}{}", SECTION.0, calls.join("\n"), SECTION.1)
    }

    /// Both versions, each call written by `write`.
    fn both(mut test: impl FnMut(&str, fn(&str, &str) -> String)) {
        test("deepseek", v3_call);
        test("deepseek31", v31_call);
    }

    #[test]
    fn single_call() {
        both(|p, write| {
            let text = section(&[write("get_weather", r#"{"city": "Paris"}"#)]);
            check(p, &text, "", &[call("get_weather", r#"{"city": "Paris"}"#)]);
        });
    }

    #[test]
    fn two_calls_in_a_section_and_two_sections() {
        both(|p, write| {
            let a = write("get_weather", r#"{"city": "Paris"}"#);
            let b = write("search", r#"{"q": "rust", "n": [1, 2]}"#);
            let want = [call("get_weather", r#"{"city": "Paris"}"#), call("search", r#"{"q": "rust", "n": [1, 2]}"#)];
            check(p, &section(&[a.clone(), b.clone()]), "", &want);
            let text = format!("{}\n\n{}\n", section(&[a]), section(&[b]));
            check(p, &text, "", &want);
        });
    }

    #[test]
    fn text_around_calls() {
        both(|p, write| {
            let text = format!("Checking the weather.\n\n{} Done.", section(&[write("get_weather", "{}")]));
            check(p, &text, "Checking the weather.\n\n Done.", &[call("get_weather", "{}")]);
        });
    }

    #[test]
    fn undeclared_function_is_content() {
        both(|p, write| {
            let text = section(&[write("delete_all", "{}")]);
            check(p, &text, &text, &[]);
            // Beside a valid call, only the bad call's own markup comes back.
            let bad = write("delete_all", "{}");
            let text = section(&[write("search", "{}"), bad.clone()]);
            check(p, &text, &bad, &[call("search", "{}")]);
        });
    }

    #[test]
    fn invalid_arguments_are_content() {
        both(|p, write| {
            for args in [r#"{"city": "Paris""#, "[1, 2]", "\"Paris\"", ""] {
                let text = section(&[write("get_weather", args)]);
                check(p, &text, &text, &[]);
            }
        });
    }

    #[test]
    fn malformed_v3_is_content() {
        for body in [
            format!("function{SEP}get_weather\n{{}}"),
            format!("tool{SEP}get_weather\n```json\n{{}}\n```"),
            format!("get_weather{SEP}{{}}"),
        ] {
            let text = section(&[format!("{}{body}{}", CALL.0, CALL.1)]);
            check("deepseek", &text, &text, &[]);
        }
    }

    #[test]
    fn unclosed_is_content() {
        both(|p, write| {
            let whole = write("search", r#"{"q": "x"}"#);
            let open = whole.strip_suffix(CALL.1).unwrap();
            let text = format!("Hi {}{open}", SECTION.0);
            check(p, &text, &text, &[]);
            // A closed call in a section left open is a call; the open one is content.
            let text = format!("{}{whole}\n{open}", SECTION.0);
            check(p, &text, open, &[call("search", r#"{"q": "x"}"#)]);
            let text = format!("{}{whole}\n", SECTION.0);
            check(p, &text, "", &[call("search", r#"{"q": "x"}"#)]);
        });
    }

    #[test]
    fn stray_text_in_a_section_ends_it() {
        both(|p, write| {
            let text = format!("{}oops {}", SECTION.0, write("search", "{}"));
            check(p, &text, &text, &[]);
        });
    }

    #[test]
    fn non_ascii_arguments_survive() {
        both(|p, write| {
            let args = r#"{"city": "東京", "note": "🌸 \u00e9"}"#;
            let text = format!("東京の天気 {}", section(&[write("get_weather", args)]));
            check(p, &text, "東京の天気 ", &[call("get_weather", args)]);
        });
    }

    #[test]
    fn split_begin_token() {
        let text = section(&[v31_call("search", "{}")]);
        let cut = "<｜tool▁ca".len();
        let mut p = crate::tools::by_name("deepseek31", tools()).unwrap();
        let mut out = Parsed::default();
        p.push("ok ", &mut out);
        p.push(&text[..cut], &mut out);
        assert_eq!(out.content, "ok ");
        p.push(&text[cut..], &mut out);
        p.finish(&mut out);
        assert_eq!(out.content, "ok ");
        assert_eq!(out.calls, [call("search", "{}")]);
    }
}
