//! Qwen3-Coder's tool calls (SMG's `qwen_xml`; Qwen3.5 writes them too): one call a block,
//! its values bare text, one parameter a tag —
//!
//! ```text
//! <tool_call>
//! <function=get_weather>
//! <parameter=city>
//! 東京
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! Names, keys and values are trimmed (the template puts a newline around each value), as SMG
//! does; values are taken literally (no HTML entities: Qwen's own API does not decode them)
//! and converted by the parameter's declared type ([`Args::put`]). The model sometimes leaves
//! out `</function>`: the block is still a call.

use super::bare_values::{Args, Blocks, Cursor, Tagged};
use crate::{Call, ToolParser, Tools};

const BEGIN: &str = "<tool_call>";
const END: &str = "</tool_call>";

pub(crate) fn new(tools: Tools) -> Box<dyn ToolParser> {
    Blocks::parser(tools, Tagged::new([BEGIN, "<function=", END], read))
}

/// A whole block: whitespace may stand between the tags, nothing else.
fn read(block: &str, tools: &Tools) -> Option<Vec<Call>> {
    let mut c = Cursor::new(block);
    c.expect(BEGIN)?;
    c.space();
    c.expect("<function=")?;
    let tool = tools.get(c.until(">")?.trim())?;
    let mut args = Args::new(&tool);
    loop {
        c.space();
        if !c.eat("<parameter=") {
            break;
        }
        let key = c.until(">")?.trim();
        args.put(key, c.until("</parameter>")?.trim());
    }
    if c.eat("</function>") {
        c.space();
    }
    c.expect(END)?;
    c.is_empty().then(|| vec![args.call()])
}

#[cfg(test)]
mod tests {
    use super::super::bare_values::test_support::{assert_parsed, tools};
    use crate::{testing::every_cut, Parsed};

    fn parse(text: &str) -> Parsed {
        every_cut(|| crate::tools::by_name("qwen_coder", tools()).unwrap(), text)
    }

    const WEATHER: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

    #[test]
    fn one_call() {
        assert_parsed(&parse(WEATHER), "", &[("get_weather", r#"{"city":"Paris","days":3}"#)]);
    }

    #[test]
    fn two_calls_whitespace_between_and_after_dropped() {
        let text = format!("{WEATHER}\n<tool_call>\n<function=search>\n<parameter=query>\nrust\n</parameter>\n</function>\n</tool_call>\n");
        assert_parsed(
            &parse(&text),
            "",
            &[("get_weather", r#"{"city":"Paris","days":3}"#), ("search", r#"{"query":"rust"}"#)],
        );
    }

    #[test]
    fn typed_parameters() {
        let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n7\n</parameter>\n<parameter=opts>\n{\"unit\": \"C\", \"n\": [1, 2]}\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=extra>\nnull\n</parameter>\n</function>\n</tool_call>";
        assert_parsed(
            &parse(text),
            "",
            &[("get_weather", r#"{"city":"42","days":7,"opts":{"unit":"C","n":[1,2]},"metric":true,"extra":null}"#)],
        );
        // Written in the model's order, as given.
        let got = parse(text);
        assert!(got.calls[0].arguments.starts_with(r#"{"city":"42","days":7,"opts":"#));
    }

    #[test]
    fn string_with_quotes_backslashes_and_newlines() {
        let text = "<tool_call>\n<function=search>\n<parameter=query>\nsay \"hi\"\\n\nC:\\dir\n</parameter>\n</function>\n</tool_call>";
        assert_parsed(&parse(text), "", &[("search", r#"{"query":"say \"hi\"\\n\nC:\\dir"}"#)]);
    }

    #[test]
    fn text_before_and_after() {
        let text = format!("Let me check.\n{WEATHER}\nIt is sunny.");
        assert_parsed(
            &parse(&text),
            "Let me check.\n\nIt is sunny.",
            &[("get_weather", r#"{"city":"Paris","days":3}"#)],
        );
    }

    #[test]
    fn without_function_close_tag() {
        let text = "<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n</tool_call>";
        assert_parsed(&parse(text), "", &[("search", r#"{"query":"x"}"#)]);
    }

    #[test]
    fn undeclared_function_is_content() {
        let text = "<tool_call>\n<function=delete_all>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call> ok";
        assert_parsed(&parse(text), text, &[]);
    }

    #[test]
    fn malformed_or_unclosed_is_content() {
        for text in [
            "<tool_call>\n<function=search>\n<parameter=query>\nx\n</function>\n</tool_call>",
            "<tool_call>\n<function=search>\njunk<parameter=query>\nx\n</parameter>\n</tool_call>",
            "<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n</function>\n",
            "<tool_call> is the tag, <tool_ca",
            "a <tool_call>b",
        ] {
            assert_parsed(&parse(text), text, &[]);
        }
        let text = format!("<tool_call>oops</tool_call>{WEATHER}");
        assert_parsed(&parse(&text), "<tool_call>oops</tool_call>", &[("get_weather", r#"{"city":"Paris","days":3}"#)]);
    }

    #[test]
    fn non_ascii_values() {
        let text = "天気：<tool_call>\n<function=get_weather>\n<parameter=city>\n東京 🌧️\n</parameter>\n</function>\n</tool_call>";
        assert_parsed(&parse(text), "天気：", &[("get_weather", r#"{"city":"東京 🌧️"}"#)]);
    }
}
