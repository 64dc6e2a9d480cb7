//! Qwen: `<think>` … `</think>`.
//!
//! - `qwen3`: the hybrid Qwen3 checkpoints write `<think>` themselves when the template's
//!   `enable_thinking` is on (off, the template writes an empty `<think></think>` block in
//!   the prompt). SMG also maps every other `qwen` id here (QwQ, the thinking-only
//!   checkpoints whose id lacks `-thinking`), whose template opens the block itself.
//! - `qwen3_thinking`: thinking-only checkpoints; the template always opens the block, so
//!   the model writes only `</think>`.
//!
//! With thinking on, both start inside reasoning and drop the `<think>` a hybrid model writes,
//! so either template shape splits the same.

use super::think::{Markers, THINK};

pub(crate) const MARKERS: Markers = THINK;

#[cfg(test)]
mod tests {
    use super::super::think::check::{family, split};

    #[test]
    fn cases() {
        family("qwen3", "<think>", "</think>");
        family("qwen3_thinking", "<think>", "</think>");
    }

    #[test]
    fn hybrid_thinking_output() {
        let text = "<think>\nThe user asks 2+2. 很简单 🧮\n</think>\n\nThe answer is 4.";
        for thinking in [true, false] {
            split("qwen3", thinking, text, "\nThe user asks 2+2. 很简单 🧮\n", "\n\nThe answer is 4.");
        }
    }

    #[test]
    fn thinking_only_output() {
        let text = "Let me see. 思考\n</think>\n\n4 ✅";
        split("qwen3_thinking", true, text, "Let me see. 思考\n", "\n\n4 ✅");
        // Thinking off: the block was never opened; the stray marker is dropped.
        split("qwen3_thinking", false, text, "", "Let me see. 思考\n\n\n4 ✅");
    }
}
