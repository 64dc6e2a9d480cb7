//! Cohere Command (`cohere_cmd`): `<|START_THINKING|>` … `<|END_THINKING|>`, both written
//! by the model (SMG starts it outside reasoning).

use super::think::Markers;

pub(crate) const MARKERS: Markers = Markers { open: "<|START_THINKING|>", close: "<|END_THINKING|>" };

#[cfg(test)]
mod tests {
    use super::super::think::check::{family, split};

    #[test]
    fn cases() {
        family("cohere_cmd", "<|START_THINKING|>", "<|END_THINKING|>");
    }

    #[test]
    fn command_output() {
        let text = "<|START_THINKING|>查一下 🔎<|END_THINKING|><|START_RESPONSE|>好的<|END_RESPONSE|>";
        split("cohere_cmd", false, text, "查一下 🔎", "<|START_RESPONSE|>好的<|END_RESPONSE|>");
    }
}
