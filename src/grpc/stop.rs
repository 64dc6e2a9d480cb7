//! Stop strings on decoded text: text that might be the start of a stop string is held back
//! until the next token says whether it is, so a stop split across tokens is still found and
//! never reaches the client (unless `no_stop_trim` keeps it).

pub struct StopMatcher<'a> {
    stops: &'a [String],
    keep_stop: bool,
    held: String,
    stopped: bool,
    /// The stop string that ended the text.
    matched: Option<&'a str>,
}

impl<'a> StopMatcher<'a> {
    pub fn new(stops: &'a [String], keep_stop: bool) -> Self {
        StopMatcher { stops, keep_stop, held: String::new(), stopped: false, matched: None }
    }

    /// The stop string that ended the text, once one did.
    pub fn matched(&self) -> Option<&'a str> {
        self.matched
    }

    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Feeds decoded text; appends to `out` what is certain. True when a stop string ended
    /// the text (nothing after it is ever emitted).
    pub fn push(&mut self, text: &str, out: &mut String) -> bool {
        if self.stopped {
            return true;
        }
        if self.stops.is_empty() {
            out.push_str(text);
            return false;
        }
        self.held.push_str(text);
        let stops = self.stops;
        let found = stops.iter().filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s.len(), s))).min();
        if let Some((at, len, s)) = found {
            self.matched = Some(s.as_str());
            let end = if self.keep_stop { at + len } else { at };
            out.push_str(&self.held[..end]);
            self.held.clear();
            self.stopped = true;
            return true;
        }
        // Hold the longest tail that is a proper prefix of some stop string.
        let hold = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len().min(self.held.len() + 1))
                    .rev()
                    .find(|&k| s.is_char_boundary(k) && self.held.ends_with(&s[..k]))
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let emit = self.held.len() - hold;
        out.push_str(&self.held[..emit]);
        self.held.drain(..emit);
        false
    }

    /// The stream ended: what was held back was not a stop after all.
    pub fn finish(&mut self, out: &mut String) {
        if !self.stopped {
            out.push_str(&self.held);
        }
        self.held.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], keep: bool, pieces: &[&str]) -> (Vec<String>, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops, keep);
        let mut outs = Vec::new();
        let mut stopped = false;
        for p in pieces {
            let mut o = String::new();
            stopped = m.push(p, &mut o);
            outs.push(o);
            if stopped {
                break;
            }
        }
        let mut o = String::new();
        m.finish(&mut o);
        outs.push(o);
        (outs, stopped)
    }

    #[test]
    fn a_stop_split_across_tokens_is_held_and_cut() {
        let (outs, stopped) = run(&["END"], false, &["hello E", "N", "D and more"]);
        assert!(stopped);
        assert_eq!(outs, ["hello ", "", "", ""]);
        let (outs, _) = run(&["END"], true, &["a EN", "D!"]);
        assert_eq!(outs.concat(), "a END");
    }

    #[test]
    fn a_false_start_is_released() {
        let (outs, stopped) = run(&["END"], false, &["x E", "Nx", "y"]);
        assert!(!stopped);
        assert_eq!(outs, ["x ", "ENx", "y", ""]);
        let (outs, _) = run(&["ab"], false, &["a"]);
        assert_eq!(outs, ["", "a"], "held text comes out at the end");
        let (outs, _) = run(&[], false, &["as is"]);
        assert_eq!(outs.concat(), "as is");
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_multibyte_is_safe() {
        let (outs, _) = run(&["é!", "zz"], false, &["caf", "é", "! zz"]);
        assert_eq!(outs.concat(), "caf");
        let (outs, _) = run(&["second", "first"], false, &["a first then second"]);
        assert_eq!(outs.concat(), "a ");
    }
}
