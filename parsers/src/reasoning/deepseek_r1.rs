//! DeepSeek-R1 (`deepseek_r1`): `<think>` … `</think>`. Its template ends the prompt with
//! `<think>\n`, so the model writes only `</think>` (earlier checkpoints still wrote their
//! own `<think>` first: dropped). SMG always starts it inside reasoning; here that follows
//! `thinking`, which the caller sets for a template that opens the block.

use super::think::{Markers, THINK};

pub(crate) const MARKERS: Markers = THINK;

#[cfg(test)]
mod tests {
    use super::super::think::check::{family, split};

    #[test]
    fn cases() {
        family("deepseek_r1", "<think>", "</think>");
    }

    #[test]
    fn template_opened_output() {
        let text = "嗯，用户问的是 2+2。🤔\n</think>\n\n**4** ✅";
        split("deepseek_r1", true, text, "嗯，用户问的是 2+2。🤔\n", "\n\n**4** ✅");
        // An older checkpoint opening the block again after the template did.
        let text = "<think>\n嗯 🤔\n</think>\n\n4";
        split("deepseek_r1", true, text, "\n嗯 🤔\n", "\n\n4");
    }
}
