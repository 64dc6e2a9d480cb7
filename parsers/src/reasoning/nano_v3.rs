//! NVIDIA Nemotron Nano / Super v3 (`nano_v3`): `<think>` … `</think>`. The template writes
//! `<think>\n` in the prompt when `enable_thinking` is on and an empty `<think></think>` when
//! off; SMG enters reasoning on that toggle, as `thinking` does here.

use super::think::{Markers, THINK};

pub(crate) const MARKERS: Markers = THINK;

#[cfg(test)]
mod tests {
    use super::super::think::check::{family, split};

    #[test]
    fn cases() {
        family("nano_v3", "<think>", "</think>");
    }

    #[test]
    fn template_opened_output() {
        split("nano_v3", true, "Check units 📏.\n</think>\n42", "Check units 📏.\n", "\n42");
    }
}
