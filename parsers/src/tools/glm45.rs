//! GLM-4.5's (and 4.6's) tool calls (SMG's `glm45_moe`): one call a block, the name on the
//! block's first line, then key and value tag pairs —
//!
//! ```text
//! <tool_call>get_weather
//! <arg_key>city</arg_key>
//! <arg_value>東京</arg_value>
//! </tool_call>
//! ```
//!
//! The name runs to the first newline or tag (a call without arguments may close on the same
//! line); names, keys and values are trimmed, as SMG does, and values converted by the
//! parameter's declared type ([`Args::put`]).

use super::bare_values::{Args, Blocks, Cursor, Tagged};
use crate::{Call, ToolParser, Tools};

const BEGIN: &str = "<tool_call>";
const END: &str = "</tool_call>";

pub(crate) fn new(tools: Tools) -> Box<dyn ToolParser> {
    // No lead: the block goes straight on with the name.
    Blocks::parser(tools, Tagged::new([BEGIN, "", END], read))
}

/// A whole block: whitespace may stand between the tags, nothing else.
fn read(block: &str, tools: &Tools) -> Option<Vec<Call>> {
    let mut c = Cursor::new(block);
    c.expect(BEGIN)?;
    c.space();
    let name_len = c.rest().find(['\n', '<'])?;
    let tool = tools.get(c.rest()[..name_len].trim())?;
    c.skip(name_len);
    let mut args = Args::new(&tool);
    loop {
        c.space();
        if !c.eat("<arg_key>") {
            break;
        }
        let key = c.until("</arg_key>")?.trim();
        c.space();
        c.expect("<arg_value>")?;
        args.put(key, c.until("</arg_value>")?.trim());
    }
    c.expect(END)?;
    c.is_empty().then(|| vec![args.call()])
}

#[cfg(test)]
mod tests {
    use super::super::bare_values::test_support::{assert_parsed, tools};
    use crate::{testing::every_cut, Parsed};

    fn parse(text: &str) -> Parsed {
        every_cut(|| crate::tools::by_name("glm45_moe", tools()).unwrap(), text)
    }

    const WEATHER: &str = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";

    #[test]
    fn one_call() {
        assert_parsed(&parse(WEATHER), "", &[("get_weather", r#"{"city":"Paris","days":3}"#)]);
    }

    #[test]
    fn two_calls_whitespace_between_and_after_dropped() {
        let text = format!(
            "{WEATHER}\n<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>rust</arg_value>\n</tool_call>\n\n"
        );
        assert_parsed(
            &parse(&text),
            "",
            &[("get_weather", r#"{"city":"Paris","days":3}"#), ("search", r#"{"query":"rust"}"#)],
        );
    }

    #[test]
    fn call_without_arguments() {
        assert_parsed(&parse("<tool_call>now\n</tool_call>"), "", &[("now", "{}")]);
        assert_parsed(&parse("<tool_call>now</tool_call>"), "", &[("now", "{}")]);
        assert_parsed(&parse("<tool_call>\nnow\n</tool_call>"), "", &[("now", "{}")]);
    }

    #[test]
    fn typed_parameters() {
        let text = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>10</arg_value>\n<arg_key>days</arg_key>\n<arg_value>5</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{\"unit\": \"C\"}</arg_value>\n<arg_key>metric</arg_key>\n<arg_value>false</arg_value>\n<arg_key>other</arg_key>\n<arg_value>[1, 2]</arg_value>\n</tool_call>";
        assert_parsed(
            &parse(text),
            "",
            &[("get_weather", r#"{"city":"10","days":5,"opts":{"unit":"C"},"metric":false,"other":[1,2]}"#)],
        );
    }

    #[test]
    fn string_with_quotes_backslashes_and_newlines() {
        let text = "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>a \"b\"\nc\\d</arg_value>\n</tool_call>";
        assert_parsed(&parse(text), "", &[("search", r#"{"query":"a \"b\"\nc\\d"}"#)]);
    }

    #[test]
    fn text_before_and_after() {
        let text = format!("Checking.{WEATHER} Done.");
        assert_parsed(&parse(&text), "Checking. Done.", &[("get_weather", r#"{"city":"Paris","days":3}"#)]);
    }

    #[test]
    fn undeclared_function_is_content() {
        let text = "<tool_call>rm_rf\n<arg_key>path</arg_key>\n<arg_value>/</arg_value>\n</tool_call>";
        assert_parsed(&parse(text), text, &[]);
    }

    #[test]
    fn malformed_or_unclosed_is_content() {
        for text in [
            "<tool_call>search\n<arg_key>query</arg_key>\n</tool_call>",
            "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>x</arg_value>\nstray</tool_call>",
            "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>x</arg_value>\n",
            "see <tool_call",
        ] {
            assert_parsed(&parse(text), text, &[]);
        }
    }

    #[test]
    fn non_ascii_values() {
        let text = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>東京 😀</arg_value>\n</tool_call>晴れ";
        assert_parsed(&parse(text), "晴れ", &[("get_weather", r#"{"city":"東京 😀"}"#)]);
    }
}
