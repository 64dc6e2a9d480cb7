//! Step-3's tool calls: a block of calls between DeepSeek-style tokens (full-width bars), each
//! call a `function`-typed steptml invoke —
//!
//! ```text
//! <｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">
//! <steptml:parameter name="city">東京</steptml:parameter>
//! </steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>
//! ```
//!
//! Names, keys and values are trimmed, as SMG does; values are converted by the parameter's
//! declared type ([`Args::put`]) — SMG's Step-3 parser ignores the declared types.

use super::bare_values::{Args, Blocks, Cursor, Tagged};
use crate::{Call, ToolParser, Tools};

const BEGIN: &str = "<｜tool_calls_begin｜>";
const END: &str = "<｜tool_calls_end｜>";
const CALL_BEGIN: &str = "<｜tool_call_begin｜>";
const CALL_END: &str = "<｜tool_call_end｜>";
const SEP: &str = "<｜tool_sep｜>";

pub(crate) fn new(tools: Tools) -> Box<dyn ToolParser> {
    Blocks::parser(tools, Tagged::new([BEGIN, CALL_BEGIN, END], read))
}

/// A whole block: one or more calls, whitespace between the tokens and tags and nothing
/// else. The block's calls are all given or, if one is not a valid declared call, none.
fn read(block: &str, tools: &Tools) -> Option<Vec<Call>> {
    let mut c = Cursor::new(block);
    c.expect(BEGIN)?;
    let mut calls = Vec::new();
    loop {
        c.space();
        if !c.eat(CALL_BEGIN) {
            break;
        }
        if c.until(SEP)?.trim() != "function" {
            return None;
        }
        c.space();
        c.expect("<steptml:invoke name=\"")?;
        let tool = tools.get(c.until("\">")?.trim())?;
        let mut args = Args::new(&tool);
        loop {
            c.space();
            if !c.eat("<steptml:parameter name=\"") {
                break;
            }
            let key = c.until("\">")?.trim();
            args.put(key, c.until("</steptml:parameter>")?.trim());
        }
        c.expect("</steptml:invoke>")?;
        c.space();
        c.expect(CALL_END)?;
        calls.push(args.call());
    }
    c.expect(END)?;
    (c.is_empty() && !calls.is_empty()).then_some(calls)
}

#[cfg(test)]
mod tests {
    use super::super::bare_values::test_support::{assert_parsed, tools};
    use crate::{testing::every_cut, Parsed};

    fn parse(text: &str) -> Parsed {
        every_cut(|| crate::tools::by_name("step3", tools()).unwrap(), text)
    }

    fn call(name: &str, params: &str) -> String {
        format!("<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"{name}\">{params}</steptml:invoke><｜tool_call_end｜>")
    }

    fn block(calls: &[String]) -> String {
        format!("<｜tool_calls_begin｜>\n{}\n<｜tool_calls_end｜>", calls.join("\n"))
    }

    fn weather() -> String {
        call(
            "get_weather",
            "\n<steptml:parameter name=\"city\">Paris</steptml:parameter>\n<steptml:parameter name=\"days\">3</steptml:parameter>\n",
        )
    }

    #[test]
    fn one_call() {
        assert_parsed(&parse(&block(&[weather()])), "", &[("get_weather", r#"{"city":"Paris","days":3}"#)]);
    }

    #[test]
    fn two_calls_in_one_block_and_in_two() {
        let search = call("search", "<steptml:parameter name=\"query\">rust</steptml:parameter>");
        let want = [("get_weather", r#"{"city":"Paris","days":3}"#), ("search", r#"{"query":"rust"}"#)];
        assert_parsed(&parse(&block(&[weather(), search.clone()])), "", &want);
        let two = format!("{}\n{}\n", block(&[weather()]), block(&[search]));
        assert_parsed(&parse(&two), "", &want);
    }

    #[test]
    fn typed_parameters() {
        let text = block(&[call(
            "get_weather",
            "<steptml:parameter name=\"city\">10</steptml:parameter><steptml:parameter name=\"days\">4</steptml:parameter><steptml:parameter name=\"opts\">{\"a\": [true]}</steptml:parameter><steptml:parameter name=\"metric\">false</steptml:parameter><steptml:parameter name=\"x\">2.5</steptml:parameter>",
        )]);
        assert_parsed(
            &parse(&text),
            "",
            &[("get_weather", r#"{"city":"10","days":4,"opts":{"a":[true]},"metric":false,"x":2.5}"#)],
        );
    }

    #[test]
    fn string_with_quotes_backslashes_and_newlines() {
        let text = block(&[call("search", "<steptml:parameter name=\"query\">\"q\" a\\b\nc</steptml:parameter>")]);
        assert_parsed(&parse(&text), "", &[("search", r#"{"query":"\"q\" a\\b\nc"}"#)]);
    }

    #[test]
    fn text_before_and_after() {
        let text = format!("Let me help you.\n{}\nHere are the results.", block(&[weather()]));
        assert_parsed(
            &parse(&text),
            "Let me help you.\n\nHere are the results.",
            &[("get_weather", r#"{"city":"Paris","days":3}"#)],
        );
    }

    #[test]
    fn undeclared_function_is_content() {
        let text = block(&[weather(), call("nope", "")]);
        assert_parsed(&parse(&text), &text, &[]);
    }

    #[test]
    fn malformed_or_unclosed_is_content() {
        let unclosed = format!("<｜tool_calls_begin｜>{}", weather());
        let not_function = block(&[weather().replace(">function<", ">code<")]);
        for text in [unclosed.as_str(), not_function.as_str(), "<｜tool_calls_begin｜>hi", "a <｜tool_calls"] {
            assert_parsed(&parse(text), text, &[]);
        }
    }

    #[test]
    fn non_ascii_values() {
        let text = block(&[call("get_weather", "<steptml:parameter name=\"city\">東京 🍣</steptml:parameter>")]);
        assert_parsed(&parse(&text), "", &[("get_weather", r#"{"city":"東京 🍣"}"#)]);
    }
}
