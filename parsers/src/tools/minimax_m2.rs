//! MiniMax-M2's tool calls: a block of one or more invokes, each parameter a named tag —
//!
//! ```text
//! <minimax:tool_call>
//! <invoke name="get_weather">
//! <parameter name="city">東京</parameter>
//! </invoke>
//! </minimax:tool_call>
//! ```
//!
//! Values are written inline, so they are not trimmed for strings (a typed value is read
//! trimmed); the five XML entities in them are decoded, as SMG does (`&lt;` → `<`), then the
//! value is converted by the parameter's declared type ([`Args::put`]).

use super::bare_values::{Args, Blocks, Cursor, Tagged};
use crate::{Call, ToolParser, Tools};

const BEGIN: &str = "<minimax:tool_call>";
const END: &str = "</minimax:tool_call>";

pub(crate) fn new(tools: Tools) -> Box<dyn ToolParser> {
    Blocks::parser(tools, Tagged::new([BEGIN, "<invoke", END], read))
}

/// A whole block: one or more invokes, whitespace between the tags and nothing else. The
/// block's calls are all given or, if one is not a valid declared call, none.
fn read(block: &str, tools: &Tools) -> Option<Vec<Call>> {
    let mut c = Cursor::new(block);
    c.expect(BEGIN)?;
    let mut calls = Vec::new();
    loop {
        c.space();
        if !c.eat("<invoke") {
            break;
        }
        let tool = tools.get(name_attr(&mut c)?)?;
        let mut args = Args::new(&tool);
        loop {
            c.space();
            if !c.eat("<parameter") {
                break;
            }
            let key = name_attr(&mut c)?;
            args.put(key, &decode_entities(c.until("</parameter>")?));
        }
        c.expect("</invoke>")?;
        calls.push(args.call());
    }
    c.expect(END)?;
    (c.is_empty() && !calls.is_empty()).then_some(calls)
}

/// ` name="…">` after a tag's name: the attribute's value, trimmed.
fn name_attr<'a>(c: &mut Cursor<'a>) -> Option<&'a str> {
    c.space().then_some(())?;
    c.expect("name=\"")?;
    let name = c.until("\"")?.trim();
    c.space();
    c.expect(">")?;
    Some(name)
}

/// `&lt;`, `&gt;`, `&amp;`, `&quot;` and `&apos;` as the characters they stand for, in one
/// pass (so `&amp;lt;` is `&lt;`); any other `&` stays.
fn decode_entities(text: &str) -> String {
    const ENTITIES: [(&str, char); 5] =
        [("&lt;", '<'), ("&gt;", '>'), ("&amp;", '&'), ("&quot;", '"'), ("&apos;", '\'')];
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        match ENTITIES.iter().find(|(e, _)| rest.starts_with(e)) {
            Some((e, ch)) => {
                out.push(*ch);
                rest = &rest[e.len()..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::super::bare_values::test_support::{assert_parsed, tools};
    use crate::{testing::every_cut, Parsed};

    fn parse(text: &str) -> Parsed {
        every_cut(|| crate::tools::by_name("minimax_m2", tools()).unwrap(), text)
    }

    const WEATHER: &str = "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">3</parameter>\n</invoke>\n</minimax:tool_call>";
    const SEARCH: &str = "<invoke name=\"search\">\n<parameter name=\"query\">rust</parameter>\n</invoke>";

    #[test]
    fn one_call() {
        assert_parsed(&parse(WEATHER), "", &[("get_weather", r#"{"city":"Paris","days":3}"#)]);
    }

    #[test]
    fn two_calls_in_one_block_and_in_two() {
        let one = format!("<minimax:tool_call>\n{SEARCH}\n{SEARCH}\n</minimax:tool_call>");
        assert_parsed(&parse(&one), "", &[("search", r#"{"query":"rust"}"#), ("search", r#"{"query":"rust"}"#)]);
        let two = format!("{WEATHER}\n\n<minimax:tool_call>{SEARCH}</minimax:tool_call>\n");
        assert_parsed(
            &parse(&two),
            "",
            &[("get_weather", r#"{"city":"Paris","days":3}"#), ("search", r#"{"query":"rust"}"#)],
        );
    }

    #[test]
    fn typed_parameters() {
        let text = "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">007</parameter>\n<parameter name=\"days\"> 2 </parameter>\n<parameter name=\"opts\">{\"deep\": {\"x\": null}}</parameter>\n<parameter name=\"metric\">True</parameter>\n</invoke>\n</minimax:tool_call>";
        assert_parsed(
            &parse(text),
            "",
            &[("get_weather", r#"{"city":"007","days":2,"opts":{"deep":{"x":null}},"metric":true}"#)],
        );
    }

    #[test]
    fn string_with_quotes_backslashes_newlines_and_entities() {
        let text = "<minimax:tool_call><invoke name=\"search\"><parameter name=\"query\"> \"a\"\\b\nc &lt;d&gt; &amp;amp;</parameter></invoke></minimax:tool_call>";
        assert_parsed(&parse(text), "", &[("search", r#"{"query":" \"a\"\\b\nc <d> &amp;"}"#)]);
    }

    #[test]
    fn text_before_and_after() {
        let text = format!("Sure.\n\n{WEATHER}\n\nAnything else?");
        assert_parsed(&parse(&text), "Sure.\n\n\n\nAnything else?", &[("get_weather", r#"{"city":"Paris","days":3}"#)]);
    }

    #[test]
    fn undeclared_function_is_content() {
        let text = format!("<minimax:tool_call>\n{SEARCH}\n<invoke name=\"nope\">\n</invoke>\n</minimax:tool_call>");
        assert_parsed(&parse(&text), &text, &[]);
    }

    #[test]
    fn malformed_or_unclosed_is_content() {
        for text in [
            "<minimax:tool_call>\n<invoke name=\"search\">\n<parameter name=\"query\">x</parameter>\n</minimax:tool_call>",
            "<minimax:tool_call>\n</minimax:tool_call>",
            "<minimax:tool_call>\n<invoke name=\"search\">\n<parameter name=\"query\">x</parameter>\n</invoke>\n",
            "<minimax:tool_call> hello",
            "text <minimax:tool",
        ] {
            assert_parsed(&parse(text), text, &[]);
        }
    }

    #[test]
    fn non_ascii_values() {
        let text = "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">東京🗼</parameter>\n</invoke>\n</minimax:tool_call>";
        assert_parsed(&parse(text), "", &[("get_weather", r#"{"city":"東京🗼"}"#)]);
    }
}
