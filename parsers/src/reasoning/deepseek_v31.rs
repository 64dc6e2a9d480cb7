//! DeepSeek-V3.1 (`deepseek_v31`): `<think>` … `</think>`. Its template writes `<think>`
//! after the assistant tag when `thinking` is on and `</think>` when off, so the model itself
//! writes at most the closing marker. SMG starts it outside reasoning and enters on the
//! template's toggle; `thinking` is that toggle here.

use super::think::{Markers, THINK};

pub(crate) const MARKERS: Markers = THINK;

#[cfg(test)]
mod tests {
    use super::super::think::check::{family, split};

    #[test]
    fn cases() {
        family("deepseek_v31", "<think>", "</think>");
    }

    #[test]
    fn both_modes() {
        split("deepseek_v31", true, "先算一下 🧮</think>答案是 4", "先算一下 🧮", "答案是 4");
        split("deepseek_v31", false, "答案是 4 🙂", "", "答案是 4 🙂");
    }
}
