//! MiniMax-M2 (`minimax`): `<think>` … `</think>`. Its template always writes `<think>` in
//! the prompt, so the model writes only `</think>`; SMG always starts it inside reasoning,
//! here that follows `thinking`.

use super::think::{Markers, THINK};

pub(crate) const MARKERS: Markers = THINK;

#[cfg(test)]
mod tests {
    use super::super::think::check::{family, split};

    #[test]
    fn cases() {
        family("minimax", "<think>", "</think>");
    }

    #[test]
    fn template_opened_output() {
        let text = "The user wants 天气 ☀️.\n</think>\n\n<minimax:tool_call>";
        split("minimax", true, text, "The user wants 天气 ☀️.\n", "\n\n<minimax:tool_call>");
    }
}
