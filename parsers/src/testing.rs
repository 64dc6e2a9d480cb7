//! Test support: feed a parser its text in every way it can arrive.

use crate::{Parsed, ReasoningParser, ToolParser};

/// Either kind of parser, for the helpers below.
pub(crate) trait Feed {
    fn feed(&mut self, text: &str, out: &mut Parsed);
    fn end(&mut self, out: &mut Parsed);
}

impl Feed for Box<dyn ReasoningParser> {
    fn feed(&mut self, text: &str, out: &mut Parsed) {
        self.push(text, out)
    }
    fn end(&mut self, out: &mut Parsed) {
        self.finish(out)
    }
}

impl Feed for Box<dyn ToolParser> {
    fn feed(&mut self, text: &str, out: &mut Parsed) {
        self.push(text, out)
    }
    fn end(&mut self, out: &mut Parsed) {
        self.finish(out)
    }
}

/// The pieces through one parser, then its finish: everything it gave, merged (texts
/// concatenated, calls in order).
pub(crate) fn run<F: Feed>(p: &mut F, pieces: &[&str]) -> Parsed {
    let mut all = Parsed::default();
    let mut out = Parsed::default();
    for piece in pieces {
        out.clear();
        p.feed(piece, &mut out);
        merge(&mut all, &out);
    }
    out.clear();
    p.end(&mut out);
    merge(&mut all, &out);
    all
}

fn merge(all: &mut Parsed, out: &Parsed) {
    all.content.push_str(&out.content);
    all.reasoning.push_str(&out.reasoning);
    all.calls.extend(out.calls.iter().cloned());
}

/// Parses `text` whole, then cut in two at every character boundary, then one character a
/// piece, then in pieces of 2, 3 and 5 characters, then with an empty piece at every
/// boundary: asserts every way gives the same, and returns it.
pub(crate) fn every_cut<F: Feed>(make: impl Fn() -> F, text: &str) -> Parsed {
    let whole = run(&mut make(), &[text]);
    let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
    for &cut in &bounds {
        let got = run(&mut make(), &[&text[..cut], &text[cut..]]);
        assert_eq!(got, whole, "cut at byte {cut} of {text:?}");
    }
    for step in [1, 2, 3, 5] {
        let pieces: Vec<&str> = bounds
            .iter()
            .step_by(step)
            .zip(bounds.iter().step_by(step).skip(1).chain([&text.len()]))
            .map(|(&a, &b)| &text[a..b])
            .filter(|p| !p.is_empty())
            .collect();
        assert_eq!(pieces.concat(), text);
        let got = run(&mut make(), &pieces);
        assert_eq!(got, whole, "pieces of {step} characters of {text:?}");
    }
    // An empty piece anywhere changes nothing.
    for &cut in &bounds {
        let got = run(&mut make(), &[&text[..cut], "", &text[cut..]]);
        assert_eq!(got, whole, "an empty piece at byte {cut} of {text:?}");
    }
    whole
}
