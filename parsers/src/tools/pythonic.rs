//! Pythonic tool calls (Llama 4, SMG's `pythonic`): a Python list of calls with keyword
//! arguments whose values are Python literals, anywhere in the text, optionally between
//! `<|python_start|>` and `<|python_end|>` —
//!
//! ```text
//! [get_weather(city="東京", days=3), other(x=[1, 2], y={"a": None}, z=(1, 'two'))]
//! ```
//!
//! As in SMG, a `[` opens a call list when a name and `(` follow it; the list is then held
//! until its brackets balance (quotes respected), and read whole. Values become JSON: strings
//! in either quote with Python's escapes, numbers (`0x`, `_`, `.5`, `5.`), `True`/`False`/
//! `None`, lists, tuples (arrays), dicts (scalar keys as strings), and a bare name as its
//! name (SMG's reading). Declared parameter types play no part: the literal says its type.
//! Not read: positional arguments, `**kwargs`, triple-quoted or prefixed strings, operators,
//! calls as values — a list with any of them is content.

use super::bare_values::{push_string, Args, Blocks, Markup, Scan};
use crate::{Call, ToolParser, Tools};

const START: &str = "<|python_start|>";
const END: &str = "<|python_end|>";
/// Deeper nesting than any arguments need: the list is content (and the reader's recursion
/// stays bounded).
const MAX_DEPTH: usize = 64;

pub(crate) fn new(tools: Tools) -> Box<dyn ToolParser> {
    Blocks::parser(tools, Pythonic::default())
}

/// Where the scan of an open list is.
#[derive(Default, Clone, Copy, PartialEq)]
enum Stage {
    /// After `<|python_start|>`: whitespace, then `[`.
    #[default]
    Bracket,
    /// After `[`: whitespace, then the first name's first character.
    NameStart,
    /// In the first name.
    Name,
    /// After the first name: whitespace, then `(`.
    Paren,
    /// In the list, until its `]`.
    Body,
    /// After the `]` of a list that `<|python_start|>` opened: whitespace, then maybe
    /// `<|python_end|>`.
    After,
}

#[derive(Default)]
struct Pythonic {
    wrapped: bool,
    stage: Stage,
    pos: usize,
    /// The closing brackets the list still owes, innermost last.
    closers: Vec<u8>,
    quote: Option<u8>,
    escaped: bool,
    list_end: usize,
}

impl Pythonic {
    fn begin_len(&self) -> usize {
        if self.wrapped {
            START.len()
        } else {
            1
        }
    }

    fn skip_space(&mut self, held: &str) {
        let bytes = held.as_bytes();
        while bytes.get(self.pos).is_some_and(u8::is_ascii_whitespace) {
            self.pos += 1;
        }
    }

    /// The list's bracket structure, resumed at `pos`; Some once it decided.
    fn body(&mut self, held: &str) -> Option<Scan> {
        for &b in &held.as_bytes()[self.pos..] {
            self.pos += 1;
            if let Some(q) = self.quote {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == q {
                    self.quote = None;
                }
                continue;
            }
            match b {
                b'"' | b'\'' => self.quote = Some(b),
                b'[' => self.closers.push(b']'),
                b'(' => self.closers.push(b')'),
                b'{' => self.closers.push(b'}'),
                b']' | b')' | b'}' => {
                    if self.closers.pop() != Some(b) {
                        return Some(Scan::Not(self.pos));
                    }
                    if self.closers.is_empty() {
                        self.list_end = self.pos;
                        if !self.wrapped {
                            return Some(Scan::Closed(self.pos));
                        }
                        self.stage = Stage::After;
                        return None;
                    }
                }
                _ => {}
            }
            if self.closers.len() > MAX_DEPTH {
                return Some(Scan::Not(self.pos));
            }
        }
        Some(Scan::More)
    }
}

impl Markup for Pythonic {
    fn begins(&self) -> &[&'static str] {
        &["[", START]
    }

    fn open(&mut self, held: &str) {
        let mut closers = std::mem::take(&mut self.closers);
        closers.clear();
        let wrapped = held.starts_with(START);
        *self = Pythonic {
            wrapped,
            stage: if wrapped { Stage::Bracket } else { Stage::NameStart },
            closers,
            ..Pythonic::default()
        };
        self.pos = self.begin_len();
    }

    fn scan(&mut self, held: &str) -> Scan {
        loop {
            let not = Scan::Not(self.begin_len());
            match self.stage {
                Stage::Bracket => {
                    self.skip_space(held);
                    match held.as_bytes().get(self.pos) {
                        None => return Scan::More,
                        Some(b'[') => {
                            self.pos += 1;
                            self.stage = Stage::NameStart;
                        }
                        Some(_) => return not,
                    }
                }
                Stage::NameStart => {
                    self.skip_space(held);
                    match held[self.pos..].chars().next() {
                        None => return Scan::More,
                        Some(c) if c == '_' || c.is_alphabetic() => {
                            self.pos += c.len_utf8();
                            self.stage = Stage::Name;
                        }
                        Some(_) => return not,
                    }
                }
                Stage::Name => {
                    let rest = &held[self.pos..];
                    let len = rest.find(|c: char| !is_name_char(c)).unwrap_or(rest.len());
                    self.pos += len;
                    if self.pos == held.len() {
                        return Scan::More;
                    }
                    self.stage = Stage::Paren;
                }
                Stage::Paren => {
                    self.skip_space(held);
                    match held.as_bytes().get(self.pos) {
                        None => return Scan::More,
                        Some(b'(') => {
                            self.pos += 1;
                            self.closers.extend([b']', b')']);
                            self.stage = Stage::Body;
                        }
                        Some(_) => return not,
                    }
                }
                Stage::Body => {
                    if let Some(scan) = self.body(held) {
                        return scan;
                    }
                }
                Stage::After => {
                    self.skip_space(held);
                    let rest = &held[self.pos..];
                    if rest.starts_with(END) {
                        return Scan::Closed(self.pos + END.len());
                    }
                    return if END.starts_with(rest) { Scan::More } else { Scan::Closed(self.list_end) };
                }
            }
        }
    }

    fn whole_at_end(&self, _held: &str) -> Option<usize> {
        (self.stage == Stage::After).then_some(self.list_end)
    }

    fn read(&self, block: &str, tools: &Tools) -> Option<Vec<Call>> {
        let list = match block.strip_prefix(START) {
            Some(rest) => {
                let rest = rest.trim();
                rest.strip_suffix(END).unwrap_or(rest).trim_end()
            }
            None => block,
        };
        Reader { text: list, at: 0, depth: 0 }.calls(tools)
    }
}

fn is_name_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Reads a whole call list, writing values as JSON.
struct Reader<'a> {
    text: &'a str,
    at: usize,
    depth: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn space(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        let ate = self.peek() == Some(b);
        self.at += usize::from(ate);
        ate
    }

    fn expect(&mut self, b: u8) -> Option<()> {
        self.eat(b).then_some(())
    }

    fn name(&mut self) -> Option<&'a str> {
        let rest = &self.text[self.at..];
        let first = rest.chars().next()?;
        if first != '_' && !first.is_alphabetic() {
            return None;
        }
        let len = rest.find(|c: char| !is_name_char(c)).unwrap_or(rest.len());
        self.at += len;
        Some(&rest[..len])
    }

    /// `[call, call, …]` and nothing after it.
    fn calls(mut self, tools: &Tools) -> Option<Vec<Call>> {
        self.expect(b'[')?;
        let mut calls = Vec::new();
        loop {
            self.space();
            if !calls.is_empty() && self.eat(b']') {
                break;
            }
            calls.push(self.call(tools)?);
            self.space();
            if !self.eat(b',') {
                self.expect(b']')?;
                break;
            }
        }
        (self.at == self.text.len()).then_some(calls)
    }

    /// `name(key=value, …)`, the name declared.
    fn call(&mut self, tools: &Tools) -> Option<Call> {
        let tool = tools.get(self.name()?)?;
        self.space();
        self.expect(b'(')?;
        let mut args = Args::new(&tool);
        loop {
            self.space();
            if self.eat(b')') {
                break;
            }
            let key = self.name()?;
            self.space();
            self.expect(b'=')?;
            self.space();
            let mut json = String::new();
            self.value(&mut json)?;
            args.put_json(key, json);
            self.space();
            if !self.eat(b',') {
                self.expect(b')')?;
                break;
            }
        }
        Some(args.call())
    }

    fn value(&mut self, out: &mut String) -> Option<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' | b'\'' => self.string(out)?,
            b'[' => {
                self.at += 1;
                out.push('[');
                self.items(b']', out, false)?;
            }
            b'(' => self.tuple(out)?,
            b'{' => self.dict(out)?,
            b'-' | b'+' | b'.' | b'0'..=b'9' => self.number(out)?,
            _ => match self.name()? {
                "True" => out.push_str("true"),
                "False" => out.push_str("false"),
                "None" => out.push_str("null"),
                name => push_string(out, name),
            },
        }
        self.depth -= 1;
        Some(())
    }

    /// The rest of a sequence (its opener read and written) up to `close`, written as the
    /// rest of an array.
    fn items(&mut self, close: u8, out: &mut String, mut any: bool) -> Option<()> {
        loop {
            self.space();
            if self.eat(close) {
                break;
            }
            if any {
                out.push(',');
            }
            self.value(out)?;
            any = true;
            self.space();
            if !self.eat(b',') {
                self.expect(close)?;
                break;
            }
        }
        out.push(']');
        Some(())
    }

    /// `()`, `(x,)`, `(x, y)` are arrays; `(x)` is `x`.
    fn tuple(&mut self, out: &mut String) -> Option<()> {
        self.at += 1;
        self.space();
        if self.eat(b')') {
            out.push_str("[]");
            return Some(());
        }
        let mut first = String::new();
        self.value(&mut first)?;
        self.space();
        if self.eat(b')') {
            out.push_str(&first);
            return Some(());
        }
        self.expect(b',')?;
        out.push('[');
        out.push_str(&first);
        self.items(b')', out, true)
    }

    /// `{key: value, …}`: keys are strings, numbers, `True`/`False`/`None` or names, written
    /// as strings.
    fn dict(&mut self, out: &mut String) -> Option<()> {
        self.at += 1;
        out.push('{');
        let mut any = false;
        loop {
            self.space();
            if self.eat(b'}') {
                break;
            }
            if any {
                out.push(',');
            }
            let mut key = String::new();
            self.value(&mut key)?;
            match key.as_bytes().first()? {
                b'"' => out.push_str(&key),
                b'[' | b'{' => return None,
                _ => push_string(out, &key),
            }
            self.space();
            self.expect(b':')?;
            self.space();
            out.push(':');
            self.value(out)?;
            any = true;
            self.space();
            if !self.eat(b',') {
                self.expect(b'}')?;
                break;
            }
        }
        out.push('}');
        Some(())
    }

    /// A Python int or float as a JSON number.
    fn number(&mut self, out: &mut String) -> Option<()> {
        if self.eat(b'-') {
            out.push('-');
        } else {
            self.eat(b'+');
        }
        let bytes = self.text.as_bytes();
        let start = self.at;
        let digits = |at: &mut usize, ok: fn(&u8) -> bool| {
            while bytes.get(*at).is_some_and(|b| ok(b) || *b == b'_') {
                *at += 1;
            }
        };
        let mut at = start;
        let radix = match bytes.get(start..start + 2) {
            Some(b"0x" | b"0X") => 16,
            Some(b"0o" | b"0O") => 8,
            Some(b"0b" | b"0B") => 2,
            _ => 10,
        };
        if radix == 10 {
            digits(&mut at, u8::is_ascii_digit);
            if bytes.get(at) == Some(&b'.') {
                at += 1;
                digits(&mut at, u8::is_ascii_digit);
            }
            if matches!(bytes.get(at), Some(b'e' | b'E')) {
                at += 1;
                if matches!(bytes.get(at), Some(b'+' | b'-')) {
                    at += 1;
                }
                digits(&mut at, u8::is_ascii_digit);
            }
        } else {
            at += 2;
            digits(&mut at, u8::is_ascii_hexdigit);
        }
        self.at = at;
        // `1j`, `2x`: not a number this reader knows.
        if self.text[at..].starts_with(is_name_char) {
            return None;
        }
        let literal = self.text[start..at].replace('_', "");
        if radix == 10 {
            return decimal(&literal, out);
        }
        let n = u128::from_str_radix(&literal[2..], radix).ok()?;
        out.push_str(&n.to_string());
        Some(())
    }

    /// A quoted string, Python's escapes decoded.
    fn string(&mut self, out: &mut String) -> Option<()> {
        let quote = self.text.as_bytes()[self.at] as char;
        self.at += 1;
        let rest = &self.text[self.at..];
        let mut text = String::new();
        let mut chars = rest.char_indices();
        loop {
            let (i, c) = chars.next()?;
            match c {
                '\n' => return None,
                '\\' => escape(&mut chars, &mut text)?,
                c if c == quote => {
                    // `''` then a quote: a triple-quoted string.
                    if i == 0 && rest[1..].starts_with(quote) {
                        return None;
                    }
                    self.at += i + 1;
                    break;
                }
                c => text.push(c),
            }
        }
        push_string(out, &text);
        Some(())
    }
}

/// Digits, `.` and an exponent as JSON: `5.` is `5.0`, `.5` is `0.5`, leading zeros go. A
/// number past f64's range (`1e400`: Python's `inf`) has no JSON spelling that JSON readers
/// take, so the call list holding it is not a call (found by fuzzing).
fn decimal(literal: &str, out: &mut String) -> Option<()> {
    if !literal.parse::<f64>().is_ok_and(f64::is_finite) {
        return None;
    }
    let (mantissa, exponent) = match literal.find(['e', 'E']) {
        Some(i) => (&literal[..i], Some(&literal[i + 1..])),
        None => (literal, None),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((int, frac)) => (int, Some(frac)),
        None => (mantissa, None),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if !digits(int) || !frac.is_none_or(digits) || (int.is_empty() && frac.is_none_or(str::is_empty)) {
        return None;
    }
    let int = int.trim_start_matches('0');
    out.push_str(if int.is_empty() { "0" } else { int });
    if let Some(frac) = frac {
        out.push('.');
        out.push_str(if frac.is_empty() { "0" } else { frac });
    }
    if let Some(exponent) = exponent {
        let unsigned = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
        if unsigned.is_empty() || !digits(unsigned) {
            return None;
        }
        out.push('e');
        out.push_str(exponent);
    }
    Some(())
}

/// One escape after a backslash, decoded onto `text`: Python's, an unknown one kept as
/// written.
fn escape(chars: &mut std::str::CharIndices<'_>, text: &mut String) -> Option<()> {
    let (_, c) = chars.next()?;
    let hex = |chars: &mut std::str::CharIndices<'_>, n: usize| -> Option<char> {
        let mut code = 0;
        for _ in 0..n {
            code = code * 16 + chars.next()?.1.to_digit(16)?;
        }
        char::from_u32(code)
    };
    match c {
        '\n' => {}
        '\\' | '\'' | '"' => text.push(c),
        'a' => text.push('\x07'),
        'b' => text.push('\x08'),
        'f' => text.push('\x0c'),
        'n' => text.push('\n'),
        'r' => text.push('\r'),
        't' => text.push('\t'),
        'v' => text.push('\x0b'),
        'x' => text.push(hex(chars, 2)?),
        'u' => text.push(hex(chars, 4)?),
        'U' => text.push(hex(chars, 8)?),
        '0'..='7' => {
            let mut code = c.to_digit(8)?;
            for _ in 0..2 {
                let mut ahead = chars.clone();
                match ahead.next().and_then(|(_, d)| d.to_digit(8)) {
                    Some(d) => {
                        code = code * 8 + d;
                        *chars = ahead;
                    }
                    None => break,
                }
            }
            text.push(char::from_u32(code)?);
        }
        'N' => return None,
        c => {
            text.push('\\');
            text.push(c);
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::super::bare_values::test_support::assert_parsed;
    use crate::{testing::every_cut, Parsed, Tool, Tools};

    fn tools() -> Tools {
        let tool = |name: &str| Tool { name: name.into(), params: vec![("city".into(), "string".into())] };
        Tools::new(vec![tool("get_weather"), tool("other"), tool("ping")])
    }

    fn parse(text: &str) -> Parsed {
        every_cut(|| crate::tools::by_name("pythonic", tools()).unwrap(), text)
    }

    #[test]
    fn one_call() {
        assert_parsed(
            &parse(r#"[get_weather(city="Paris", days=3)]"#),
            "",
            &[("get_weather", r#"{"city":"Paris","days":3}"#)],
        );
        assert_parsed(&parse("[ping()]"), "", &[("ping", "{}")]);
    }

    #[test]
    fn two_calls_in_one_list_and_in_two() {
        let want = [("get_weather", r#"{"city":"Paris"}"#), ("other", r#"{"x":[1,2],"y":{"a":null}}"#)];
        assert_parsed(&parse(r#"[get_weather(city='Paris'), other(x=[1, 2], y={"a": None})]"#), "", &want);
        assert_parsed(&parse("[get_weather(city='Paris')]\n[other(x=[1,2,],y={'a':None},)]\n"), "", &want);
    }

    #[test]
    fn python_literals() {
        let text = "[other(t=True, f=False, n=None, i=-42, big=0xFF, u=1_000, x=.5, y=5., e=1e-3, \
                    tup=(1, 'two'), one=(1,), paren=(7), empty=(), d={1: 'a', 'k': [True]}, name=celsius)]";
        assert_parsed(
            &parse(text),
            "",
            &[(
                "other",
                r#"{"t":true,"f":false,"n":null,"i":-42,"big":255,"u":1000,"x":0.5,"y":5.0,"e":1e-3,
                    "tup":[1,"two"],"one":[1],"paren":7,"empty":[],"d":{"1":"a","k":[true]},"name":"celsius"}"#,
            )],
        );
    }

    #[test]
    fn strings_with_quotes_backslashes_and_newlines() {
        let text = r#"[other(a="She said \"hi\"", b='It\'s', c="C:\\dir\nnext", d="\x41\u00e9\101\t")]"#;
        assert_parsed(
            &parse(text),
            "",
            &[("other", r#"{"a":"She said \"hi\"","b":"It's","c":"C:\\dir\nnext","d":"AéA\t"}"#)],
        );
        // Brackets and quotes of the other kind inside strings do not close anything.
        assert_parsed(
            &parse(r#"[other(p=["[a-z]+", "(x"], q='"]')]"#),
            "",
            &[("other", r#"{"p":["[a-z]+","(x"],"q":"\"]"}"#)],
        );
    }

    #[test]
    fn text_before_and_after() {
        let text = "Let me check: [get_weather(city='Tokyo')] Here's the forecast.";
        assert_parsed(&parse(text), "Let me check:  Here's the forecast.", &[("get_weather", r#"{"city":"Tokyo"}"#)]);
    }

    #[test]
    fn python_start_and_end_tokens() {
        let want = [("get_weather", r#"{"city":"Mars"}"#)];
        let text = "Weather: <|python_start|>[get_weather(city='Mars')]<|python_end|> done";
        assert_parsed(&parse(text), "Weather:  done", &want);
        assert_parsed(&parse("<|python_start|>\n[get_weather(city='Mars')]\n"), "", &want);
        assert_parsed(&parse("<|python_start|>[get_weather(city='Mars')] after"), " after", &want);
        let code = "<|python_start|>print('hi')<|python_end|>";
        assert_parsed(&parse(code), code, &[]);
    }

    #[test]
    fn brackets_in_prose_are_content() {
        for text in ["see [1] and [link](url)", "[Note (important)]: x", "a[i] = b[j(k)]", "x = [", "[]"] {
            assert_parsed(&parse(text), text, &[]);
        }
    }

    #[test]
    fn undeclared_function_is_content() {
        let text = "[get_weather(city='Paris'), rm(path='/')]";
        assert_parsed(&parse(text), text, &[]);
    }

    #[test]
    fn a_number_past_f64s_range_is_not_a_call() {
        let text = "[get_weather(city=\"Paris\", days=1e0724235893)]";
        let p = parse(text);
        assert!(p.calls.is_empty(), "{p:?}");
        assert_eq!(p.content, text);
        assert_eq!(parse("[get_weather(days=1e30)]").calls.len(), 1, "in range: a call");
    }

    #[test]
    fn malformed_or_unclosed_is_content() {
        for text in [
            "[get_weather('Paris')]",
            "[get_weather(city=)]",
            "[get_weather(=1)]",
            "[get_weather(city='Paris'",
            "[get_weather(city='Paris') x]",
            "[get_weather(city='Paris')) ]",
            "[get_weather(city=1j)]",
            "[get_weather(city=a + b)]",
            "[get_weather(**kw)]",
            "[get_weather(city='''x''')]",
        ] {
            assert_parsed(&parse(text), text, &[]);
        }
        // A mismatched bracket ends the attempt there; a list after it is read.
        assert_parsed(&parse("[ping(] [ping()]"), "[ping(] ", &[("ping", "{}")]);
    }

    #[test]
    fn non_ascii_values() {
        let text = "天気は？[get_weather(city='東京', note=\"🌧️ rain\", d={'キー': '値'})]";
        assert_parsed(
            &parse(text),
            "天気は？",
            &[("get_weather", r#"{"city":"東京","note":"🌧️ rain","d":{"キー":"値"}}"#)],
        );
    }
}
