//! gpt-oss's Harmony output, read from decoded text with its special tokens kept: a sequence
//! of messages, each a header then `<|message|>`, a body, and an end token —
//!
//! ```text
//! <|channel|>analysis<|message|>The user asks about Paris.<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>
//! <|start|>assistant<|channel|>final<|message|>It is mild in Paris.<|return|>
//! ```
//!
//! The answer starts inside the first header (the prompt ended with `<|start|>assistant`).
//! What each message becomes:
//! - a recipient `functions.NAME` (` to=` before or after the channel): a call of NAME with
//!   the body as its arguments, when the request declares NAME and the body is a JSON object;
//!   otherwise the body is content. The body is held until the message ends; a body the
//!   output ended in (the engine trims its `<|call|>` stop token) is a call if it is whole.
//! - channel `analysis`, channel `commentary` without a recipient (a preamble), or a built-in
//!   tool's recipient (`browser.*`, `python`, `container.*`): reasoning, as SMG files them;
//! - channel `final`, or none: content.
//!
//! Bodies of reasoning and content stream as they arrive (only a possible end token's start
//! is held). Headers are markup and never reach the answer. Text before any header (a model
//! that does not write Harmony) is content. Every message of every channel is kept: SMG keeps
//! only the last analysis message.

use crate::{Call, Parsed, ToolParser, Tools};

pub const START: &str = "<|start|>";
pub const CHANNEL: &str = "<|channel|>";
pub const MESSAGE: &str = "<|message|>";
pub const CONSTRAIN: &str = "<|constrain|>";
pub const END: &str = "<|end|>";
pub const CALL: &str = "<|call|>";
pub const RETURN: &str = "<|return|>";
/// The end of the text (gpt-oss's EOS besides `<|return|>` and `<|call|>`; an engine may
/// leave it in the output ids, and the text is decoded with special tokens kept).
pub const ENDOFTEXT: &str = "<|endoftext|>";
/// The tokens a message body ends at: its own end tokens, the end of the text, or the next
/// message's start (a model that skipped `<|end|>`).
const BODY_ENDS: [&str; 6] = [END, CALL, RETURN, START, CHANNEL, ENDOFTEXT];
const LONGEST_END: usize = ENDOFTEXT.len();
/// Longer than any header a model writes: the text is not a header.
const MAX_HEADER: usize = 512;

/// What a message's body is, by its header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    Reasoning,
    Content,
    /// A call of this function.
    Call(String),
}

/// A header's meaning: the text between a message's start and `<|message|>` (`<|start|>` and
/// the role may lead it).
pub fn body_of(header: &str) -> Body {
    let channel = header.find(CHANNEL).map(|i| word(&header[i + CHANNEL.len()..]));
    let recipient = header.find(" to=").or_else(|| header.starts_with("to=").then_some(0)).map(|i| {
        let rest = &header[i..];
        word(&rest[rest.find("to=").map_or(0, |j| j + 3)..])
    });
    match (channel, recipient) {
        (_, Some(r)) if r.starts_with("functions.") => Body::Call(r["functions.".len()..].to_string()),
        (_, Some(_)) | (Some("analysis" | "commentary"), None) => Body::Reasoning,
        _ => Body::Content,
    }
}

/// The word `text` starts with: up to whitespace or a special token.
fn word(text: &str) -> &str {
    let end = text.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(text.len());
    &text[..end]
}

pub fn parser(tools: Tools) -> Box<dyn ToolParser> {
    Box::new(Harmony { tools, state: State::Header, held: String::new(), searched: 0, at_start: true })
}

enum State {
    /// In a header (held): until `<|message|>`.
    Header,
    /// In a body: reasoning and content stream; a call's body is held.
    Body(Body),
    /// Text that is not Harmony: content to the end.
    Plain,
}

struct Harmony {
    tools: Tools,
    state: State,
    /// The header so far, a call's body so far, or a body's possible end token's start.
    held: String,
    /// How much of a held call body was searched for its end.
    searched: usize,
    /// Nothing was read yet: text that cannot start a header is plain.
    at_start: bool,
}

impl Harmony {
    fn run(&mut self, out: &mut Parsed) {
        loop {
            match &self.state {
                State::Plain => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return;
                }
                State::Header => {
                    if self.at_start && !self.held.is_empty() {
                        let could_be = |t: &str| self.held.starts_with(t) || t.starts_with(self.held.as_str());
                        if ![START, CHANNEL, "assistant", " to="].into_iter().any(could_be) {
                            self.state = State::Plain;
                            continue;
                        }
                    }
                    let Some(i) = self.held.find(MESSAGE) else {
                        if self.held.len() > MAX_HEADER {
                            // Not a header: drop what cannot be one, read on as plain text.
                            self.state = State::Plain;
                            continue;
                        }
                        return;
                    };
                    self.at_start = false;
                    let body = body_of(&self.held[..i]);
                    self.held.drain(..i + MESSAGE.len());
                    self.state = State::Body(body);
                    self.searched = 0;
                }
                State::Body(body) => {
                    // A call's body is held: look where the last search did not.
                    let mut from = self.searched.saturating_sub(LONGEST_END - 1).min(self.held.len());
                    while !self.held.is_char_boundary(from) {
                        from -= 1;
                    }
                    let rest = &self.held[from..];
                    let end = earliest(rest).map(|(i, t)| (from + i, t));
                    self.searched = self.held.len();
                    let Some((i, token)) = end else {
                        if !matches!(body, Body::Call(_)) {
                            let n = self.held.len() - partial_end(&self.held);
                            push(body, &self.held[..n], out);
                            self.held.drain(..n);
                            self.searched = 0;
                        }
                        return;
                    };
                    let text: String = self.held.drain(..i).collect();
                    self.end_body(&text, out);
                    // The next message's own tokens stay to start its header.
                    if token == END || token == CALL || token == RETURN || token == ENDOFTEXT {
                        self.held.drain(..token.len());
                    }
                    self.state = State::Header;
                    self.searched = 0;
                }
            }
        }
    }

    /// The body `text` (its last part, for reasoning and content) ended.
    fn end_body(&mut self, text: &str, out: &mut Parsed) {
        let State::Body(body) = &self.state else { return };
        match body {
            Body::Call(name) => {
                let args = text.trim();
                let object = args.starts_with('{')
                    && sonic_rs::from_str::<sonic_rs::Value>(args)
                        .is_ok_and(|v| sonic_rs::JsonValueTrait::is_object(&v));
                if object && self.tools.declares(name) {
                    out.calls.push(Call { name: name.clone(), arguments: args.to_string() });
                } else {
                    out.content.push_str(text);
                }
            }
            other => push(other, text, out),
        }
    }
}

fn push(body: &Body, text: &str, out: &mut Parsed) {
    match body {
        Body::Reasoning => out.reasoning.push_str(text),
        _ => out.content.push_str(text),
    }
}

/// The first body end token in `text`, and where it starts: one pass, stopping there.
fn earliest(text: &str) -> Option<(usize, &'static str)> {
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(i) = bytes[from..].iter().position(|&b| b == b'<') {
        let at = from + i;
        if let Some(t) = BODY_ENDS.iter().find(|t| bytes[at..].starts_with(t.as_bytes())) {
            crate::scanned(at + 1);
            return Some((at, t));
        }
        from = at + 1;
    }
    crate::scanned(bytes.len());
    None
}

/// The length of the longest end of `text` that a body's end token starts with.
fn partial_end(text: &str) -> usize {
    let Some(i) = text.rfind('<') else { return 0 };
    let tail = &text[i..];
    if BODY_ENDS.iter().any(|t| t.starts_with(tail)) {
        tail.len()
    } else {
        0
    }
}

impl ToolParser for Harmony {
    fn push(&mut self, text: &str, out: &mut Parsed) {
        self.held.push_str(text);
        self.run(out);
    }

    fn finish(&mut self, out: &mut Parsed) {
        let held = std::mem::take(&mut self.held);
        match &self.state {
            // A header cut short is markup: dropped.
            State::Header => {}
            State::Plain => out.content.push_str(&held),
            State::Body(_) => self.end_body(&held, out),
        }
        self.state = State::Header;
        self.at_start = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{testing::every_cut, Tool};

    fn tools() -> Tools {
        Tools::new(vec![Tool { name: "get_weather".into(), params: vec![("city".into(), "string".into())] }])
    }

    fn parse(text: &str) -> Parsed {
        every_cut(|| parser(tools()), text)
    }

    #[test]
    fn analysis_then_final() {
        let p = parse("<|channel|>analysis<|message|>Think < about it.<|end|><|start|>assistant<|channel|>final<|message|>Hello <b>!<|return|>");
        assert_eq!(p.reasoning, "Think < about it.");
        assert_eq!(p.content, "Hello <b>!");
        assert!(p.calls.is_empty());
    }

    #[test]
    fn a_call_in_either_header_order() {
        let want = vec![Call { name: "get_weather".into(), arguments: r#"{"city":"東京"}"#.into() }];
        for text in [
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"東京\"}<|call|>",
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"東京\"}<|call|>",
            // The engine trimmed its <|call|> stop token.
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"東京\"}",
        ] {
            let p = parse(text);
            assert_eq!(p.calls, want, "{text}");
            assert_eq!((p.reasoning.as_str(), p.content.as_str()), ("Need weather.", ""), "{text}");
        }
    }

    #[test]
    fn undeclared_or_malformed_calls_are_content() {
        let p = parse("<|channel|>commentary to=functions.rm <|constrain|>json<|message|>{\"path\":\"/\"}<|call|>");
        assert_eq!((p.content.as_str(), p.calls.len()), ("{\"path\":\"/\"}", 0));
        let p = parse("<|channel|>commentary to=functions.get_weather<|message|>{\"city\": <|call|>");
        assert_eq!((p.content.as_str(), p.calls.len()), ("{\"city\": ", 0));
        let p = parse("<|channel|>commentary to=functions.get_weather<|message|>[1]<|call|>");
        assert_eq!((p.content.as_str(), p.calls.len()), ("[1]", 0));
    }

    #[test]
    fn preambles_and_builtin_tools_are_reasoning() {
        let p = parse("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>analysis to=browser.search<|message|>{\"q\":1}<|call|>");
        assert_eq!(p.reasoning, "Checking.{\"q\":1}");
        assert_eq!(p.content, "");
    }

    #[test]
    fn text_that_is_not_harmony_is_content() {
        for text in ["Plain answer.", "a<|end|>b", "<b>bold</b>"] {
            assert_eq!(parse(text).content, text);
        }
        // A final message without its end, and a header cut short (dropped: it is markup).
        assert_eq!(parse("<|channel|>final<|message|>Cut off").content, "Cut off");
        let p = parse("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>fin");
        assert_eq!((p.reasoning.as_str(), p.content.as_str()), ("x", ""));
    }

    #[test]
    fn an_eos_left_in_the_output_ends_the_message_and_is_not_text() {
        let p = parse("<|channel|>final<|message|>Done.<|endoftext|>");
        assert_eq!(p.content, "Done.");
        let p = parse("<|channel|>commentary to=functions.get_weather<|message|>{\"city\":\"x\"}<|endoftext|>");
        assert_eq!((p.calls.len(), p.content.as_str()), (1, ""));
    }

    #[test]
    fn a_body_ends_at_the_next_message_when_its_end_is_missing() {
        let p = parse("<|channel|>analysis<|message|>think<|start|>assistant<|channel|>final<|message|>done");
        assert_eq!((p.reasoning.as_str(), p.content.as_str()), ("think", "done"));
    }

    #[test]
    fn headers_mean_what_they_say() {
        assert_eq!(body_of("<|channel|>final"), Body::Content);
        assert_eq!(body_of(""), Body::Content);
        assert_eq!(body_of("assistant<|channel|>analysis"), Body::Reasoning);
        assert_eq!(body_of("<|channel|>commentary to=functions.f <|constrain|>json"), Body::Call("f".into()));
        assert_eq!(body_of("assistant to=functions.f<|channel|>commentary"), Body::Call("f".into()));
        assert_eq!(body_of("<|channel|>commentary to=python"), Body::Reasoning);
    }
}
