//! What the markup families whose values are not JSON share (Qwen3-Coder, GLM-4.5,
//! MiniMax-M2, Step-3, pythonic): the streaming driver that finds call blocks in the text
//! ([`Blocks`]), the scanner for blocks closed by a fixed token ([`Tagged`]), a cursor to read
//! a closed block with, and the conversion of bare-text values to JSON ([`Args`]).
//!
//! A block is judged whole once it closed: each format's reader then reads it in one pass.
//! While it is open only its close is looked for, from where the last piece's search stopped,
//! so every byte is scanned a bounded number of times however the text is cut.

use std::{borrow::Cow, mem};

use sonic_rs::JsonValueTrait;

use crate::{Call, Parsed, Tool, ToolParser, Tools};

/// How a format finds its blocks in streamed text.
pub(crate) trait Markup: Send {
    /// The tokens that open a block.
    fn begins(&self) -> &[&'static str];
    /// A block opens: `held` starts with one of [`begins`](Markup::begins). Forget the last
    /// block's scan.
    fn open(&mut self, held: &str);
    /// Scan on through the open block (`held`, grown since the last call).
    fn scan(&mut self, held: &str) -> Scan;
    /// The output ended inside the block: its length, if it is whole as it stands.
    fn whole_at_end(&self, held: &str) -> Option<usize> {
        let _ = held;
        None
    }
    /// The calls a closed block holds; None when it is not a valid block of declared calls
    /// (then the whole block is content: a block's calls are all given or none).
    fn read(&self, block: &str, tools: &Tools) -> Option<Vec<Call>>;
}

/// Where the scan of an open block got to.
pub(crate) enum Scan {
    /// Still open: wait for more text.
    More,
    /// The block is the first `n` bytes.
    Closed(usize),
    /// Not a block: the first `n` bytes are content; look for blocks again after them.
    Not(usize),
}

/// Whitespace after a call, held back: dropped if a block or the end follows, given as
/// content with the text that follows otherwise.
#[derive(Default)]
struct Gap {
    after_call: bool,
    space: String,
}

impl Gap {
    fn release(&mut self, text: &str, out: &mut Parsed) {
        if text.is_empty() {
            return;
        }
        if self.after_call {
            if text.trim_start().is_empty() {
                self.space.push_str(text);
                return;
            }
            out.content.push_str(&self.space);
            self.space.clear();
            self.after_call = false;
        }
        out.content.push_str(text);
    }

    fn call(&mut self) {
        self.space.clear();
        self.after_call = true;
    }
}

/// The streaming half every format shares: text outside blocks is content at once (but for a
/// possible begin token at its end), an open block is held until it closes.
pub(crate) struct Blocks<M> {
    tools: Tools,
    markup: M,
    /// Undecided text: a partial begin token, or the open block (from its begin token).
    held: String,
    open: bool,
    gap: Gap,
}

impl<M: Markup + 'static> Blocks<M> {
    pub(crate) fn parser(tools: Tools, markup: M) -> Box<dyn ToolParser> {
        Box::new(Blocks { tools, markup, held: String::new(), open: false, gap: Gap::default() })
    }

    /// Decides what it can of `held`; `base` walks past what is decided, drained once at the end.
    fn run(&mut self, out: &mut Parsed) {
        let mut base = 0;
        loop {
            if self.open {
                let block = &self.held[base..];
                let (n, closed) = match self.markup.scan(block) {
                    Scan::More => break,
                    Scan::Closed(n) => (n, true),
                    Scan::Not(n) => (n, false),
                };
                self.open = false;
                if closed {
                    self.close(base, n, out);
                } else {
                    self.gap.release(&block[..n], out);
                }
                base += n;
            }
            let rest = &self.held[base..];
            match find_begin(rest, self.markup.begins()) {
                Some(i) => {
                    self.gap.release(&rest[..i], out);
                    base += i;
                    self.open = true;
                    self.markup.open(&self.held[base..]);
                }
                None => {
                    let keep = partial_begin(rest, self.markup.begins());
                    self.gap.release(&rest[..rest.len() - keep], out);
                    base += rest.len() - keep;
                    break;
                }
            }
        }
        self.held.drain(..base);
    }

    /// The closed block `held[at..at + n]`: its calls, or content.
    fn close(&mut self, at: usize, n: usize, out: &mut Parsed) {
        let block = &self.held[at..at + n];
        match self.markup.read(block, &self.tools) {
            Some(calls) => {
                out.calls.extend(calls);
                self.gap.call();
            }
            None => self.gap.release(block, out),
        }
    }
}

impl<M: Markup + 'static> ToolParser for Blocks<M> {
    fn push(&mut self, text: &str, out: &mut Parsed) {
        self.held.push_str(text);
        self.run(out);
    }

    fn finish(&mut self, out: &mut Parsed) {
        let mut at = 0;
        if mem::take(&mut self.open) {
            if let Some(n) = self.markup.whole_at_end(&self.held) {
                self.close(0, n, out);
                at = n;
            }
        }
        let rest = mem::take(&mut self.held);
        self.gap.release(&rest[at..], out);
        self.gap = Gap::default();
    }
}

/// Where the earliest of `begins` starts in `text`: one pass that stops at the first, so
/// text after it is not read. (Searching each token through the whole text and keeping the
/// minimum read all of it for every `[` of pythonic's `[[[[…`: quadratic, found by fuzzing.)
fn find_begin(text: &str, begins: &[&str]) -> Option<usize> {
    let bytes = text.as_bytes();
    let at = (0..bytes.len()).find(|&i| begins.iter().any(|b| bytes[i..].starts_with(b.as_bytes())));
    crate::scanned(at.map_or(bytes.len(), |i| i + 1));
    at
}

/// Where `token` first starts in `text`. Pieces are a few bytes: a scan for the token's first
/// byte costs less than setting up `str::find`'s searcher for each.
pub(crate) fn find(text: &str, token: &str) -> Option<usize> {
    let first = *token.as_bytes().first()?;
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(i) = bytes[from..].iter().position(|&b| b == first) {
        if bytes[from + i..].starts_with(token.as_bytes()) {
            crate::scanned(from + i + 1);
            return Some(from + i);
        }
        from += i + 1;
    }
    crate::scanned(bytes.len());
    None
}

/// The length of the longest end of `text` that one of `begins` starts with (and is not whole).
fn partial_begin(text: &str, begins: &[&str]) -> usize {
    let bytes = text.as_bytes();
    let mut keep = 0;
    for begin in begins {
        let first = begin.as_bytes()[0];
        let longest = (begin.len() - 1).min(text.len());
        for n in (keep + 1..=longest).rev() {
            let at = text.len() - n;
            if bytes[at] == first && text.is_char_boundary(at) && begin.starts_with(&text[at..]) {
                keep = n;
                break;
            }
        }
    }
    keep
}

/// Scans blocks that open with one token and close with another: after the begin token (and
/// any whitespace) must come `lead`, else the begin token is only text; then the block runs
/// to the first `end`.
pub(crate) struct Tagged {
    begin: &'static str,
    lead: &'static str,
    end: &'static str,
    read: fn(&str, &Tools) -> Option<Vec<Call>>,
    /// Where the check of `lead` resumes (after the whitespace skipped so far); None once it
    /// passed.
    lead_at: Option<usize>,
    /// Up to where `end` was looked for.
    searched: usize,
}

impl Tagged {
    pub(crate) fn new([begin, lead, end]: [&'static str; 3], read: fn(&str, &Tools) -> Option<Vec<Call>>) -> Tagged {
        Tagged { begin, lead, end, read, lead_at: None, searched: 0 }
    }
}

impl Markup for Tagged {
    fn begins(&self) -> &[&'static str] {
        std::slice::from_ref(&self.begin)
    }

    fn open(&mut self, _held: &str) {
        self.lead_at = Some(self.begin.len());
        self.searched = self.begin.len();
    }

    fn scan(&mut self, held: &str) -> Scan {
        if let Some(at) = self.lead_at {
            let rest = &held[at..];
            let text = rest.trim_start();
            let at = at + rest.len() - text.len();
            self.lead_at = Some(at);
            if text.len() < self.lead.len() {
                return if self.lead.starts_with(text) { Scan::More } else { Scan::Not(self.begin.len()) };
            }
            if !text.starts_with(self.lead) {
                return Scan::Not(self.begin.len());
            }
            self.lead_at = None;
            self.searched = at + self.lead.len();
        }
        // `end` may have begun in the part already searched.
        let mut from = self.searched.saturating_sub(self.end.len() - 1).max(self.begin.len());
        while !held.is_char_boundary(from) {
            from -= 1;
        }
        match find(&held[from..], self.end) {
            Some(i) => Scan::Closed(from + i + self.end.len()),
            None => {
                self.searched = held.len();
                Scan::More
            }
        }
    }

    fn read(&self, block: &str, tools: &Tools) -> Option<Vec<Call>> {
        (self.read)(block, tools)
    }
}

/// Reads a closed block front to back.
pub(crate) struct Cursor<'a> {
    rest: &'a str,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Cursor { rest: text }
    }

    /// Skips whitespace; whether there was any.
    pub(crate) fn space(&mut self) -> bool {
        let before = self.rest.len();
        self.rest = self.rest.trim_start();
        self.rest.len() < before
    }

    /// Takes `token` if the text goes on with it.
    pub(crate) fn eat(&mut self, token: &str) -> bool {
        match self.rest.strip_prefix(token) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    /// Takes `token`, which must come next.
    pub(crate) fn expect(&mut self, token: &str) -> Option<()> {
        self.eat(token).then_some(())
    }

    /// The text up to `token`, and the token.
    pub(crate) fn until(&mut self, token: &str) -> Option<&'a str> {
        let i = self.rest.find(token)?;
        let text = &self.rest[..i];
        self.rest = &self.rest[i + token.len()..];
        Some(text)
    }

    pub(crate) fn rest(&self) -> &'a str {
        self.rest
    }

    pub(crate) fn skip(&mut self, n: usize) {
        self.rest = &self.rest[n..];
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}

/// A call's arguments, as the model wrote them: a JSON object in its order. A key written
/// twice keeps its first place and its last value.
pub(crate) struct Args<'t> {
    tool: &'t Tool,
    pairs: Vec<(String, String)>,
}

impl<'t> Args<'t> {
    pub(crate) fn new(tool: &'t Tool) -> Self {
        Args { tool, pairs: Vec::new() }
    }

    /// A bare-text value, converted by its parameter's declared type.
    pub(crate) fn put(&mut self, key: &str, value: &str) {
        let ty = self.tool.params.iter().find(|(k, _)| k == key).map(|(_, t)| t.as_str());
        let mut json = String::new();
        push_value(&mut json, value, ty);
        self.put_json(key, json);
    }

    /// A value already written as JSON.
    pub(crate) fn put_json(&mut self, key: &str, json: String) {
        match self.pairs.iter_mut().find(|(k, _)| k == key) {
            Some(pair) => pair.1 = json,
            None => self.pairs.push((key.to_owned(), json)),
        }
    }

    pub(crate) fn call(self) -> Call {
        let mut arguments = String::from("{");
        for (i, (key, value)) in self.pairs.iter().enumerate() {
            if i > 0 {
                arguments.push(',');
            }
            push_string(&mut arguments, key);
            arguments.push(':');
            arguments.push_str(value);
        }
        arguments.push('}');
        Call { name: self.tool.name.clone(), arguments }
    }
}

/// A bare-text value as JSON, by SMG's rules (`coerce_by_schema_type`, then inference):
/// - `string`: the text as a string (a JSON string literal is unquoted: `"4"` → `4`);
/// - `integer`: a 64-bit integer; `number`: a JSON number; `boolean`: `true`/`True`,
///   `false`/`False`; `object`/`array`: any JSON — each tried on the trimmed text;
/// - anything else, or a typed value that is not of its type: JSON if the trimmed text is
///   JSON, the Python literals `True`/`False`/`None` as JSON, else the text as a string.
///
/// JSON is copied as the model wrote it (trimmed), so numbers keep their precision.
pub(crate) fn push_value(out: &mut String, value: &str, ty: Option<&str>) {
    let text = value.trim();
    let typed: Option<Cow<'_, str>> = match ty {
        Some("string") => {
            let unquoted = if text.starts_with('"') { sonic_rs::from_str::<String>(text).ok() } else { None };
            return push_string(out, unquoted.as_deref().unwrap_or(value));
        }
        Some("integer") => text.parse::<i64>().ok().map(|n| n.to_string().into()),
        Some("number") => json(text).filter(|v| v.is_number()).map(|_| text.into()),
        Some("boolean") => match text {
            "true" | "True" => Some("true".into()),
            "false" | "False" => Some("false".into()),
            _ => None,
        },
        Some("object" | "array") => json(text).map(|_| text.into()),
        _ => None,
    };
    if let Some(typed) = typed {
        return out.push_str(&typed);
    }
    if json(text).is_some() {
        return out.push_str(text);
    }
    match text {
        "True" => out.push_str("true"),
        "False" => out.push_str("false"),
        "None" => out.push_str("null"),
        _ => push_string(out, value),
    }
}

fn json(text: &str) -> Option<sonic_rs::Value> {
    sonic_rs::from_str(text).ok()
}

/// `text` as a JSON string: quotes, backslashes and control characters escaped, the rest
/// (non-ASCII too) as it is.
pub(crate) fn push_string(out: &mut String, text: &str) {
    out.push('"');
    let mut from = 0;
    for (i, b) in text.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&text[from..i]);
        if escape.is_empty() {
            out.push_str(&format!("\\u{b:04x}"));
        } else {
            out.push_str(escape);
        }
        from = i + 1;
    }
    out.push_str(&text[from..]);
    out.push('"');
}

#[cfg(test)]
pub(crate) mod test_support {
    use crate::{Parsed, Tool, Tools};

    /// The functions the bare-value families' tests offer: one of each parameter type, a
    /// search, and one without parameters.
    pub(crate) fn tools() -> Tools {
        let params = |ps: &[(&str, &str)]| ps.iter().map(|(k, t)| (k.to_string(), t.to_string())).collect();
        Tools::new(vec![
            Tool {
                name: "get_weather".into(),
                params: params(&[("city", "string"), ("days", "integer"), ("opts", "object"), ("metric", "boolean")]),
            },
            Tool { name: "search".into(), params: params(&[("query", "string")]) },
            Tool { name: "now".into(), params: vec![] },
        ])
    }

    /// Asserts the content and the calls (arguments compared as JSON values).
    pub(crate) fn assert_parsed(got: &Parsed, content: &str, calls: &[(&str, &str)]) {
        assert_eq!(got.content, content, "content of {got:?}");
        assert_eq!(got.calls.len(), calls.len(), "calls of {got:?}");
        for (call, (name, args)) in got.calls.iter().zip(calls) {
            assert_eq!(call.name, *name);
            let got: sonic_rs::Value =
                sonic_rs::from_str(&call.arguments).unwrap_or_else(|e| panic!("arguments {:?}: {e}", call.arguments));
            let want: sonic_rs::Value = sonic_rs::from_str(args).unwrap();
            assert_eq!(got, want, "arguments {:?}", call.arguments);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, ty: Option<&str>) -> String {
        let mut out = String::new();
        push_value(&mut out, text, ty);
        out
    }

    #[test]
    fn values_convert_by_declared_type() {
        assert_eq!(value("4", Some("string")), r#""4""#);
        assert_eq!(value(r#""4""#, Some("string")), r#""4""#);
        assert_eq!(value("a\"b\\c\nd\u{1}", Some("string")), r#""a\"b\\c\nd\u0001""#);
        assert_eq!(value("東京 🌧", Some("string")), "\"東京 🌧\"");
        assert_eq!(value(" 5 ", Some("integer")), "5");
        assert_eq!(value("+5", Some("integer")), "5");
        assert_eq!(value("five", Some("integer")), r#""five""#);
        assert_eq!(value("2.5", Some("integer")), "2.5");
        assert_eq!(value("9007199254740993", Some("number")), "9007199254740993");
        assert_eq!(value("True", Some("boolean")), "true");
        assert_eq!(value("false", Some("boolean")), "false");
        assert_eq!(value(r#"{"a": [1]}"#, Some("object")), r#"{"a": [1]}"#);
        assert_eq!(value("{oops", Some("object")), r#""{oops""#);
    }

    #[test]
    fn undeclared_values_are_json_or_strings() {
        assert_eq!(value("10", None), "10");
        assert_eq!(value("null", None), "null");
        assert_eq!(value("None", None), "null");
        assert_eq!(value("[1, 2]", None), "[1, 2]");
        assert_eq!(value("hello world", None), r#""hello world""#);
        assert_eq!(value("", None), r#""""#);
        // Not JSON: a raw newline may not stand in a JSON string.
        assert_eq!(value("\"a\nb\"", None), r#""\"a\nb\"""#);
    }
}

/// Random strings of a format's fragments: every cut gives the same, text without calls comes
/// back whole, arguments are JSON.
#[cfg(test)]
mod fuzz {
    use crate::{Tool, Tools};

    /// Each format's fragments, `§` between them.
    const FRAGMENTS: &[(&str, &str)] = &[
        ("qwen_coder", "<tool_call><function=f>§</function></tool_call>§<tool_call>§</tool_call>§\n§<function=f>§</function>§<parameter=k>§</parameter>§1§x§ §東§<tool_"),
        ("glm45_moe", "<tool_call>f\n§</tool_call>§<tool_call>§\n§f§<arg_key>§k§</arg_key>§<arg_value>§</arg_value>§1§ §東§<tool_"),
        ("minimax_m2", "<minimax:tool_call><invoke name=\"f\">§</invoke></minimax:tool_call>§<minimax:tool_call>§</minimax:tool_call>§\n§<invoke name=\"f\">§</invoke>§<parameter name=\"k\">§</parameter>§1§ §東§<mini"),
        ("step3", "<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"f\">§</steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>§<｜tool_calls_begin｜>§<｜tool_calls_end｜>§<｜tool_call_begin｜>§function§<｜tool_sep｜>§<steptml:invoke name=\"f\">§</steptml:invoke>§<steptml:parameter name=\"k\">§</steptml:parameter>§<｜tool_call_end｜>§1§ §東"),
        ("pythonic", "[f(§k=§)]§'東\\'x'§, §[§]§(§)§f§k§=§1§'§\"§,§ §東§<|python_start|>§<|python_end|>§<|py§\\§{§}§:"),
    ];

    #[test]
    fn random_fragments() {
        let tools = Tools::new(vec![Tool { name: "f".into(), params: vec![("k".into(), "integer".into())] }]);
        let mut seed = 0x2545f4914f6cdd1du64;
        let mut rand = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for (name, fragments) in FRAGMENTS {
            let fragments: Vec<&str> = fragments.split('§').collect();
            let mut calls = 0;
            for _ in 0..400 {
                let text: String = (0..1 + rand(14)).map(|_| fragments[rand(fragments.len())]).collect();
                let got = crate::testing::every_cut(|| crate::tools::by_name(name, tools.clone()).unwrap(), &text);
                if got.calls.is_empty() {
                    assert_eq!(got.content, text, "{name}");
                }
                for call in &got.calls {
                    assert!(sonic_rs::from_str::<sonic_rs::Value>(&call.arguments).is_ok(), "{call:?}");
                }
                calls += got.calls.len();
            }
            assert!(calls > 0, "{name}: no calls in the sample");
        }
    }
}
