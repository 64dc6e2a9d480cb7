//! Reasoning parsers: a model's thinking (`<think>…</think>` and its families' variants)
//! split from its answer.
//!
//! Every family is one pair of markers through the same [`think::Splitter`]; its file says
//! what the model and its chat template write. `passthrough` splits nothing.

use crate::ReasoningParser;

mod cohere_cmd;
mod deepseek_r1;
mod deepseek_v31;
mod glm45;
mod kimi;
mod minimax;
mod nano_v3;
mod passthrough;
mod qwen3;
mod step3;
mod think;

use think::{Markers, Splitter, THINK};

/// The `--reasoning-parser` names, as SMG spells them.
pub const NAMES: &[&str] = &[
    "base",
    "cohere_cmd",
    "deepseek_r1",
    "deepseek_v31",
    "glm45",
    "kimi",
    "kimi_k25",
    "kimi_thinking",
    "minimax",
    "nano_v3",
    "passthrough",
    "qwen3",
    "qwen3_thinking",
    "step3",
];

/// Each marker family's name and markers (every name in [`NAMES`] but `passthrough`).
const FAMILIES: &[(&str, Markers)] = &[
    // SMG's generic `<think>` parser.
    ("base", THINK),
    ("cohere_cmd", cohere_cmd::MARKERS),
    ("deepseek_r1", deepseek_r1::MARKERS),
    ("deepseek_v31", deepseek_v31::MARKERS),
    ("glm45", glm45::MARKERS),
    ("kimi", kimi::MARKERS),
    ("kimi_k25", THINK),
    ("kimi_thinking", THINK),
    ("minimax", minimax::MARKERS),
    ("nano_v3", nano_v3::MARKERS),
    ("qwen3", qwen3::MARKERS),
    ("qwen3_thinking", qwen3::MARKERS),
    ("step3", step3::MARKERS),
];

/// The opening and closing markers family `name` writes (None for `passthrough` and unknown
/// names): what the markup module writes a think block with.
pub fn markers(name: &str) -> Option<(&'static str, &'static str)> {
    FAMILIES.iter().find(|(family, _)| *family == name).map(|(_, m)| (m.open, m.close))
}

/// The parser called `name`; `thinking`: the request turned thinking on (the chat template's
/// decision), so a family whose template opens the reasoning block in the prompt starts
/// inside it. None for an unknown name.
///
/// Every marker family starts inside reasoning exactly when `thinking` (what SMG does when the
/// template's thinking toggle is on), and drops an opening marker the model writes anyway; off,
/// it starts in content and still splits out a think block the model writes.
pub fn by_name(name: &str, thinking: bool) -> Option<Box<dyn ReasoningParser>> {
    if name == passthrough::NAME {
        return Some(Box::new(passthrough::Passthrough));
    }
    let &(_, markers) = FAMILIES.iter().find(|(family, _)| *family == name)?;
    Some(Box::new(Splitter::new(markers, thinking)))
}

/// SMG's model-id patterns, in its order (first substring match wins, so the specific ones
/// come before the ones they contain). None: a family SMG parses with something this crate
/// does not have (Kimi-K3's and Inkling's channel markup): listed so that their ids do not fall
/// through to a broader pattern (`kimi`) and get split wrongly.
const PATTERNS: &[(&str, Option<&str>)] = &[
    ("deepseek-r1", Some("deepseek_r1")),
    ("deepseek-v3.1", Some("deepseek_v31")),
    ("deepseek-v3-1", Some("deepseek_v31")),
    ("qwen3-thinking", Some("qwen3_thinking")),
    ("qwen-thinking", Some("qwen3_thinking")),
    ("qwen3", Some("qwen3")),
    ("qwen", Some("qwen3")),
    ("glm45", Some("glm45")),
    ("glm47", Some("glm45")),
    // Not in SMG's reasoning table (its tool table has them): the ids as Z.ai publishes them.
    ("glm-4.5", Some("glm45")),
    ("glm-4.6", Some("glm45")),
    ("glm-4.7", Some("glm45")),
    ("glm-5", Some("glm45")),
    ("kimi-k2-thinking", Some("kimi_thinking")),
    ("kimi-k2.5", Some("kimi_k25")),
    ("kimi-k3", None),
    ("kimi_k3", None),
    ("kimi", Some("kimi")),
    ("step3", Some("step3")),
    ("minimax", Some("minimax")),
    ("mm-m2", Some("minimax")),
    ("command-r", Some("cohere_cmd")),
    ("command-a", Some("cohere_cmd")),
    ("c4ai-command", Some("cohere_cmd")),
    ("cohere", Some("cohere_cmd")),
    ("nemotron-nano", Some("nano_v3")),
    ("nemotron-super", Some("nano_v3")),
    ("nano-v3", Some("nano_v3")),
    ("inkling", None),
];

/// The parser name SMG picks for a model id with no `--reasoning-parser` (matched on the
/// model's name, case-insensitively). None: the model's text is kept as it is.
pub fn for_model(model: &str) -> Option<&'static str> {
    let model = model.to_lowercase();
    PATTERNS.iter().find(|(pattern, _)| model.contains(pattern)).and_then(|&(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_name() {
        for name in ["", "Qwen3", "qwen", "kimi_k3", "inkling", "deepseek-r1"] {
            assert!(by_name(name, true).is_none(), "{name}");
            assert!(by_name(name, false).is_none(), "{name}");
        }
    }

    #[test]
    fn every_name_constructs() {
        for name in NAMES {
            assert!(by_name(name, true).is_some(), "{name}");
            assert!(by_name(name, false).is_some(), "{name}");
        }
        let families: Vec<&str> = FAMILIES.iter().map(|(name, _)| *name).collect();
        let mut expected: Vec<&str> = NAMES.iter().copied().filter(|n| *n != "passthrough").collect();
        expected.sort_unstable();
        assert_eq!(families, expected);
    }

    #[test]
    fn every_pattern_names_a_parser() {
        for (pattern, name) in PATTERNS {
            assert_eq!(pattern.to_lowercase(), *pattern);
            if let Some(name) = name {
                assert!(NAMES.contains(name), "{pattern} -> {name}");
            }
        }
    }

    #[test]
    fn model_ids() {
        for (model, name) in [
            ("Qwen/Qwen3-8B", Some("qwen3")),
            ("Qwen/QwQ-32B", Some("qwen3")),
            ("Qwen/Qwen3-Thinking", Some("qwen3_thinking")),
            // SMG's `qwen3-thinking` pattern misses the published thinking-only ids.
            ("Qwen/Qwen3-235B-A22B-Thinking-2507", Some("qwen3")),
            ("deepseek-ai/DeepSeek-R1", Some("deepseek_r1")),
            ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", Some("deepseek_r1")),
            ("deepseek-ai/DeepSeek-V3.1", Some("deepseek_v31")),
            ("deepseek-ai/DeepSeek-V3.1-Terminus", Some("deepseek_v31")),
            ("moonshotai/Kimi-K2-Instruct", Some("kimi")),
            ("moonshotai/Kimi-K2-Thinking", Some("kimi_thinking")),
            ("moonshotai/Kimi-K2.5", Some("kimi_k25")),
            ("moonshotai/Kimi-K3", None),
            ("zai-org/GLM-4.5", Some("glm45")),
            ("zai-org/GLM-4.5-Air", Some("glm45")),
            ("zai-org/GLM-4.7", Some("glm45")),
            ("zai-org/GLM-5", Some("glm45")),
            ("MiniMaxAI/MiniMax-M2", Some("minimax")),
            ("stepfun-ai/step3", Some("step3")),
            ("CohereLabs/c4ai-command-a-03-2025", Some("cohere_cmd")),
            ("nvidia/NVIDIA-Nemotron-Nano-9B-v2", Some("nano_v3")),
            ("meta-llama/Llama-3.1-8B-Instruct", None),
            ("deepseek-ai/DeepSeek-V3", None),
            ("", None),
        ] {
            assert_eq!(for_model(model), name, "{model}");
        }
    }
}
