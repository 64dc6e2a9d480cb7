//! Kimi.
//!
//! - `kimi`: `◁think▷` … `◁/think▷` (plain Unicode text, not special tokens): SMG's legacy
//!   Kimi parser, which it picks for every `kimi` id no more specific pattern takes
//!   (Kimi-K2-Instruct among them).
//! - `kimi_thinking` (Kimi-K2-Thinking) and `kimi_k25` (Kimi-K2.5): `<think>` … `</think>`.
//!   SMG starts `kimi_thinking` inside reasoning always, `kimi_k25` on the template's
//!   `thinking` toggle; here both follow `thinking`.

use super::think::Markers;

/// `◁think▷` … `◁/think▷`.
pub(crate) const MARKERS: Markers = Markers { open: "◁think▷", close: "◁/think▷" };

#[cfg(test)]
mod tests {
    use super::super::think::check::{family, split};

    #[test]
    fn cases() {
        family("kimi", "◁think▷", "◁/think▷");
        family("kimi_thinking", "<think>", "</think>");
        family("kimi_k25", "<think>", "</think>");
    }

    #[test]
    fn unicode_markers_only() {
        // `<think>` is plain text to the `kimi` markers, and the reverse.
        let text = "◁think▷想 <think> 🤔◁/think▷答 </think>";
        split("kimi", false, text, "想 <think> 🤔", "答 </think>");
        let text = "<think>想 ◁think▷</think>答 ◁/think▷";
        split("kimi_k25", false, text, "想 ◁think▷", "答 ◁/think▷");
    }

    #[test]
    fn marker_lookalikes() {
        // `◁` alone, or followed by something else, is text.
        split("kimi", false, "a ◁ b ◁/thin ◁◁think▷r", "r", "a ◁ b ◁/thin ◁");
    }
}
