//! `passthrough`: no split at all. Everything the model wrote is content, markers included
//! (SMG's choice for `--reasoning-parser passthrough`): for a model that writes no reasoning
//! markup, or a deployment that wants the text untouched.

use crate::{Parsed, ReasoningParser};

pub(crate) const NAME: &str = "passthrough";

/// Gives every piece out as content, holds nothing.
#[derive(Debug, Default)]
pub(crate) struct Passthrough;

impl ReasoningParser for Passthrough {
    fn push(&mut self, text: &str, out: &mut Parsed) {
        out.content.push_str(text);
    }

    fn finish(&mut self, _out: &mut Parsed) {}
}

#[cfg(test)]
mod tests {
    use super::super::think::check::split;

    #[test]
    fn everything_is_content() {
        for thinking in [true, false] {
            let text = "<think>思考 🤔</think>答案 ✅";
            split(super::NAME, thinking, text, "", text);
            split(super::NAME, thinking, "still 思考 </thi", "", "still 思考 </thi");
            split(super::NAME, thinking, "", "", "");
        }
    }
}
