//! Step-3 (`step3`): `<think>` … `</think>`; SMG treats it as DeepSeek-R1 (the block open
//! before the model speaks, so it writes only `</think>`) and always starts it inside
//! reasoning; here that follows `thinking`.

use super::think::{Markers, THINK};

pub(crate) const MARKERS: Markers = THINK;

#[cfg(test)]
mod tests {
    use super::super::think::check::{family, split};

    #[test]
    fn cases() {
        family("step3", "<think>", "</think>");
    }

    #[test]
    fn template_opened_output() {
        split("step3", true, "推理 🧠</think>结论", "推理 🧠", "结论");
    }
}
