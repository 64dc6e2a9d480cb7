//! The one splitter every marker family uses: reasoning sits between an opening and a closing
//! marker (`<think>` … `</think>` and its variants); the families differ only in the markers.
//!
//! Rules, whatever the family:
//! - It starts inside reasoning exactly when the request turned thinking on: then the chat
//!   template has opened the block in the prompt (or the model opens it itself right away),
//!   so text before any marker is reasoning.
//! - An opening marker enters reasoning, a closing one leaves it; both are dropped. An opening
//!   marker while already inside (the model's own `<think>` after the template's) and a closing
//!   one while outside (a stray `</think>`) are dropped too: no field ever carries a marker.
//!   A later think block is split out like the first.
//! - Whitespace is kept as the model wrote it (as SMG does): the newlines around the markers
//!   belong to the text they touch.
//! - Only the end of a piece that may still turn out to be a marker is held back, and it is
//!   kept as a slice of the marker it starts (so holding allocates nothing); it goes out as
//!   soon as it cannot be one, or at `finish` as what the text around it is.

use crate::{Parsed, ReasoningParser};

/// The two markers a family writes around its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Markers {
    pub(crate) open: &'static str,
    pub(crate) close: &'static str,
}

/// `<think>` … `</think>`: what most families write.
pub(crate) const THINK: Markers = Markers { open: "<think>", close: "</think>" };

/// What the text at some position is, as far as markers go.
enum Found {
    /// A whole marker of `len` bytes: the opening one if `open`.
    Whole { len: usize, open: bool },
    /// The text ends before a marker would: this much of it (a prefix of the marker).
    Partial(&'static str),
    /// Not a marker, whatever follows.
    No,
}

/// Splits reasoning from content for one pair of markers.
#[derive(Debug)]
pub(crate) struct Splitter {
    markers: Markers,
    in_reasoning: bool,
    /// The end of the text so far when it may be the start of a marker: a proper prefix of
    /// `open` or `close` (empty when nothing is held).
    held: &'static str,
}

impl Splitter {
    pub(crate) fn new(markers: Markers, thinking: bool) -> Self {
        Self { markers, in_reasoning: thinking, held: "" }
    }

    /// `text` goes to the field of the current mode.
    fn emit(&self, text: &str, out: &mut Parsed) {
        if self.in_reasoning {
            out.reasoning.push_str(text);
        } else {
            out.content.push_str(text);
        }
    }

    /// The markers, opening one first.
    fn both(&self) -> [(&'static str, bool); 2] {
        [(self.markers.open, true), (self.markers.close, false)]
    }

    /// What `tail` (all the text from some position to the end of the piece) starts with.
    fn classify(&self, tail: &str) -> Found {
        for (marker, open) in self.both() {
            if tail.starts_with(marker) {
                return Found::Whole { len: marker.len(), open };
            }
        }
        for (marker, _) in self.both() {
            if tail.len() < marker.len() && marker.starts_with(tail) {
                // `tail` is a str equal to the marker's first bytes: a char boundary.
                return Found::Partial(&marker[..tail.len()]);
            }
        }
        Found::No
    }

    /// What the held text followed by `text` starts with (`held` being its first bytes).
    fn extend(&self, held: &str, text: &str) -> Found {
        for (marker, open) in self.both() {
            if let Some(need) = marker.strip_prefix(held) {
                if text.starts_with(need) {
                    return Found::Whole { len: need.len(), open };
                }
            }
        }
        for (marker, _) in self.both() {
            if let Some(need) = marker.strip_prefix(held) {
                if text.len() < need.len() && need.starts_with(text) {
                    return Found::Partial(&marker[..held.len() + text.len()]);
                }
            }
        }
        Found::No
    }

    /// Whether a marker starts with `text`.
    fn may_start_marker(&self, text: &str) -> bool {
        self.both().iter().any(|(marker, _)| marker.starts_with(text))
    }

    /// Settles the held text against the start of `text`; returns what of `text` is left to
    /// scan (nothing when the held text grew to take it all).
    fn resume<'t>(&mut self, text: &'t str, out: &mut Parsed) -> &'t str {
        while !self.held.is_empty() {
            let held = self.held;
            match self.extend(held, text) {
                Found::Whole { len, open } => {
                    self.held = "";
                    self.in_reasoning = open;
                    return text.get(len..).unwrap_or("");
                }
                Found::Partial(more) => {
                    self.held = more;
                    return "";
                }
                Found::No => {
                    // No marker at the held text's start: release up to the next place inside
                    // it where one could still start (bounded by a marker's length).
                    let restart = held
                        .char_indices()
                        .skip(1)
                        .map(|(i, _)| i)
                        .find(|&i| self.may_start_marker(&held[i..]))
                        .unwrap_or(held.len());
                    self.emit(&held[..restart], out);
                    self.held = &held[restart..];
                }
            }
        }
        text
    }
}

impl ReasoningParser for Splitter {
    fn push(&mut self, text: &str, out: &mut Parsed) {
        let text = self.resume(text, out);
        let (open_first, close_first) = (first_char(self.markers.open), first_char(self.markers.close));
        // `start`: where the text not yet given out begins; `from`: where to look next.
        let (mut start, mut from) = (0, 0);
        while let Some(offset) = text[from..].find([open_first, close_first]) {
            let at = from + offset;
            match self.classify(&text[at..]) {
                Found::Whole { len, open } => {
                    self.emit(&text[start..at], out);
                    self.in_reasoning = open;
                    start = at + len;
                    from = start;
                }
                Found::Partial(held) => {
                    self.emit(&text[start..at], out);
                    self.held = held;
                    return;
                }
                Found::No => from = at + text[at..].chars().next().map_or(1, char::len_utf8),
            }
        }
        self.emit(&text[start..], out);
    }

    fn finish(&mut self, out: &mut Parsed) {
        let held = std::mem::take(&mut self.held);
        self.emit(held, out);
    }
}

/// A marker's first character (markers are never empty).
fn first_char(marker: &str) -> char {
    marker.chars().next().unwrap_or('\0')
}

/// Test support for the families' files.
#[cfg(test)]
pub(crate) mod check {
    use crate::testing::every_cut;

    /// `text` through the parser `name`, cut every way: asserts the reasoning and content.
    pub(crate) fn split(name: &str, thinking: bool, text: &str, reasoning: &str, content: &str) {
        let got = every_cut(|| super::super::by_name(name, thinking).unwrap(), text);
        assert_eq!(
            (got.reasoning.as_str(), got.content.as_str()),
            (reasoning, content),
            "{name} (thinking: {thinking}) on {text:?}"
        );
        assert!(got.calls.is_empty());
    }

    /// The cases every marker family must get right, written in its markers `o` and `c`.
    pub(crate) fn family(name: &str, o: &str, c: &str) {
        // Reasoning then answer, the model opening the block itself, thinking on or off.
        for thinking in [true, false] {
            split(name, thinking, &format!("{o}思考 🤔 a<b{c}答案 ✅"), "思考 🤔 a<b", "答案 ✅");
        }
        // The template opened the block: the model writes only the closing marker.
        split(name, true, &format!("思考 step{c}\n\nanswer 🎉"), "思考 step", "\n\nanswer 🎉");
        // Answer only.
        split(name, false, "just the answer, 答案 🙂", "", "just the answer, 答案 🙂");
        // Unclosed reasoning is reasoning, opened by the template or by the model.
        split(name, true, "still 思考 🤔", "still 思考 🤔", "");
        split(name, false, &format!("{o}still 思考 🤔"), "still 思考 🤔", "");
        split(name, true, &format!("{o}\nstill 思考"), "\nstill 思考", "");
        // An empty think block (thinking switched off inside the answer).
        split(name, true, &format!("{o}\n\n{c}\n\nhi"), "\n\n", "\n\nhi");
        // A marker's start that never completes is text of the field it sits in.
        let partial_close = &c[..c.len() - c.chars().last().map_or(1, char::len_utf8)];
        split(name, false, &format!("a {partial_close}"), "", &format!("a {partial_close}"));
        split(name, true, &format!("r {partial_close}"), &format!("r {partial_close}"), "");
        split(name, true, &format!("r {partial_close}x{c}a"), &format!("r {partial_close}x"), "a");
        // A stray closing marker outside reasoning is dropped, the text kept.
        split(name, false, &format!("a{c}b"), "", "ab");
        // The same text, thinking on or off: only the start differs.
        let text = format!("思考 🤔{c}answer ✅");
        split(name, true, &text, "思考 🤔", "answer ✅");
        split(name, false, &text, "", "思考 🤔answer ✅");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::run;

    fn think(thinking: bool) -> Box<dyn ReasoningParser> {
        Box::new(Splitter::new(THINK, thinking))
    }

    #[test]
    fn holds_only_a_possible_marker() {
        let mut p = Splitter::new(THINK, false);
        let mut out = Parsed::default();
        p.push("a </thi", &mut out);
        assert_eq!(out.content, "a ");
        out.clear();
        p.push("s", &mut out);
        assert_eq!(out.content, "</this");
        out.clear();
        p.push("<", &mut out);
        assert!(out.is_empty());
        p.push("<", &mut out);
        assert_eq!(out.content, "<");
        out.clear();
        p.finish(&mut out);
        assert_eq!(out.content, "<");
    }

    #[test]
    fn overlapping_starts() {
        for (text, reasoning, content) in [
            ("<<think>r</think>a", "r", "<a"),
            ("<</think>a", "", "<a"),
            ("</<think>r", "r", "</"),
            ("<think<think>r</thin</think>a", "r</thin", "<thinka"),
            ("x<thin<", "", "x<thin<"),
        ] {
            let got = crate::testing::every_cut(|| think(false), text);
            assert_eq!((got.reasoning.as_str(), got.content.as_str()), (reasoning, content), "{text:?}");
        }
    }

    #[test]
    fn every_block_is_split_out() {
        let got = crate::testing::every_cut(|| think(false), "a<think>r1</think>b<think>r2</think>c");
        assert_eq!((got.reasoning.as_str(), got.content.as_str()), ("r1r2", "abc"));
        let got = crate::testing::every_cut(|| think(true), "<think>r<think>s</think>a</think>b");
        assert_eq!((got.reasoning.as_str(), got.content.as_str()), ("rs", "ab"));
    }

    #[test]
    fn shared_marker_prefix() {
        let cohere = Markers { open: "<|START_THINKING|>", close: "<|END_THINKING|>" };
        let make = || -> Box<dyn ReasoningParser> { Box::new(Splitter::new(cohere, false)) };
        let got = crate::testing::every_cut(make, "<|<|START_THINKING|>r<|END<|END_THINKING|><|STARTa");
        assert_eq!((got.reasoning.as_str(), got.content.as_str()), ("r<|END", "<|<|STARTa"));
    }

    #[test]
    fn marker_starting_inside_a_held_one() {
        // None of the real markers repeats its first character, so a held marker start never
        // hides another one; a made-up pair does, and is split the same however it is cut.
        let made_up = Markers { open: "aab", close: "abc" };
        let make = || -> Box<dyn ReasoningParser> { Box::new(Splitter::new(made_up, false)) };
        let got = crate::testing::every_cut(make, "xaaab yabc zaa");
        assert_eq!((got.reasoning.as_str(), got.content.as_str()), (" y", "xa zaa"));
    }

    #[test]
    fn long_runs_of_marker_starts() {
        let text = "<".repeat(10_000) + "</think>" + &"</thin".repeat(1_000);
        let got = run(&mut think(true), &text.split_inclusive('<').collect::<Vec<_>>());
        assert_eq!(got.reasoning, "<".repeat(10_000));
        assert_eq!(got.content, "</thin".repeat(1_000));
    }
}
