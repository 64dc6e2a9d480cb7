//! GLM (`glm45`): `<think>` … `</think>`. GLM-4.5 / 4.6 write `<think>` themselves in
//! thinking mode (with thinking off the template writes an empty `<think></think>` block);
//! SMG maps the later GLM-4.7 and GLM-5 ids here too, whose template may open the block in
//! the prompt. Starting inside reasoning when `thinking` and dropping a repeated `<think>`
//! splits both shapes the same.

use super::think::{Markers, THINK};

pub(crate) const MARKERS: Markers = THINK;

#[cfg(test)]
mod tests {
    use super::super::think::check::{family, split};

    #[test]
    fn cases() {
        family("glm45", "<think>", "</think>");
    }

    #[test]
    fn thinking_output_with_a_tool_call_after() {
        let text = "<think>需要查天气 ☁️</think>\n<tool_call>get_weather\n</tool_call>";
        split("glm45", true, text, "需要查天气 ☁️", "\n<tool_call>get_weather\n</tool_call>");
    }
}
