//! What a shard needs of a gRPC worker's model, found at registration by the control thread
//! and shared by Arc through the Snapshot (`WorkerMeta::grpc`): the tokenizer, the context
//! window, and the sampling defaults the model advertises.

use std::sync::Arc;

use sonic_rs::JsonValueTrait;

use crate::tokenizer::Tokenizer;

/// What the operator says about gRPC workers' models: where the tokenizer comes from
/// (`--tokenizer-path`, else `--model-path`; None: what each worker advertises), and the
/// output parsers (`--reasoning-parser`, `--tool-call-parser`, checked at start; None: from
/// the model's name).
#[derive(Debug, Clone, Default)]
pub struct ModelSource {
    pub path: Option<std::path::PathBuf>,
    pub reasoning_parser: Option<String>,
    pub tool_parser: Option<String>,
}

#[derive(Debug)]
pub struct GrpcModel {
    pub tokenizer: Arc<Tokenizer>,
    /// `max_context_length` from GetModelInfo; None when the worker advertises none.
    pub max_context: Option<u32>,
    pub eos_ids: Vec<u32>,
    pub supports_vision: bool,
    /// GetModelInfo's `is_generation`: false for an embedding model (the engine serves Embed).
    pub is_generation: bool,
    pub defaults: SamplingDefaults,
    /// The reasoning and tool-call parsers of its output.
    pub parsers: super::output::ModelParsers,
    /// A gpt-oss model: its Harmony tokens (its chats are rendered and read as Harmony).
    pub harmony: Option<super::harmony::HarmonyTokens>,
}

/// The model author's sampling defaults (generation_config.json, as the engine reports them):
/// applied under every field the client leaves out. Length limits are not defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

impl SamplingDefaults {
    /// From GetModelInfo's JSON (`default_sampling_params_json`, else
    /// `preferred_sampling_params`); unknown keys, nulls and wrong types are ignored.
    pub fn parse(json: &str) -> Self {
        let Ok(v) = crate::bounded_json::value(json.as_bytes()) else { return Self::default() };
        let f = |k: &str| v.get(k).and_then(|x| x.as_f64()).map(|x| x as f32);
        SamplingDefaults {
            temperature: f("temperature"),
            top_p: f("top_p"),
            top_k: v.get("top_k").and_then(|x| x.as_i64()).and_then(|x| i32::try_from(x).ok()),
            min_p: f("min_p"),
            repetition_penalty: f("repetition_penalty"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_take_known_numbers_only() {
        let d =
            SamplingDefaults::parse(r#"{"temperature":0.7,"top_k":20,"min_p":null,"max_new_tokens":9,"top_p":"x"}"#);
        assert_eq!(d, SamplingDefaults { temperature: Some(0.7), top_k: Some(20), ..Default::default() });
        assert_eq!(SamplingDefaults::parse(""), SamplingDefaults::default());
    }

    #[test]
    fn an_engines_deep_json_is_ignored_not_recursed() {
        let deep = format!(r#"{{"temperature":0.7,"x":{}{}}}"#, "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(SamplingDefaults::parse(&deep), SamplingDefaults::default());
    }
}
