//! gpt-oss models (OpenAI's Harmony format) on gRPC workers. Their chat template is not used:
//! the gateway renders the conversation as Harmony messages itself (`render`), the engine stops
//! at `<|return|>` or `<|call|>`, and the answer's channels are read from the decoded text with
//! its special tokens kept (`smg_parsers::harmony`): `analysis` is reasoning, calls to
//! `functions.*` on `commentary` are tool calls, `final` is content. The engine does not count
//! reasoning tokens for them; [`ReasoningCount`] does, from the token ids.
//!
//! A model is Harmony when GetModelInfo names the architecture `GptOssForCausalLM` or the
//! model type `gpt_oss`, or its name holds `gpt-oss` (as SMG detects it), and its tokenizer
//! has Harmony's special tokens (a tokenizer without them keeps the template path).

pub mod render;

use crate::tokenizer::Tokenizer;
use smg_parsers::harmony as markup;

/// The ids of Harmony's special tokens in a model's vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HarmonyTokens {
    pub start: u32,
    pub channel: u32,
    pub message: u32,
    pub end: u32,
    pub call: u32,
    pub ret: u32,
}

impl HarmonyTokens {
    /// The model's Harmony tokens when it is a gpt-oss model (by `names`, `architectures` or
    /// `model_type`) and its tokenizer has them all.
    pub fn detect(names: &[&str], architectures: &[String], model_type: &str, tok: &Tokenizer) -> Option<Self> {
        let named = names.iter().any(|n| n.to_ascii_lowercase().contains("gpt-oss"));
        let declared = architectures.iter().any(|a| a == "GptOssForCausalLM") || model_type == "gpt_oss";
        if !named && !declared {
            return None;
        }
        let id = |t: &str| tok.token_to_id(t);
        let found = (|| {
            Some(HarmonyTokens {
                start: id(markup::START)?,
                channel: id(markup::CHANNEL)?,
                message: id(markup::MESSAGE)?,
                end: id(markup::END)?,
                call: id(markup::CALL)?,
                ret: id(markup::RETURN)?,
            })
        })();
        if found.is_none() {
            crate::warn!("model {names:?} is gpt-oss but its tokenizer lacks Harmony's special tokens: its chat template is used");
        }
        found
    }

    /// The tokens the engine stops at: the answer's end, and a tool call's.
    pub fn stops(&self) -> [u32; 2] {
        [self.ret, self.call]
    }
}

/// `reasoning_effort` as Harmony's three levels (the contract's clamp): `none` and `minimal`
/// are `low`, `xhigh` and `max` are `high`, anything else unknown is `medium`, as is none given.
pub fn effort(asked: Option<&str>) -> &'static str {
    match asked {
        Some("none" | "minimal" | "low") => "low",
        Some("high" | "xhigh" | "max") => "high",
        _ => "medium",
    }
}

/// Counts a choice's reasoning tokens from its token ids: the body tokens of messages whose
/// header makes them reasoning (the same reading as the text parser's).
pub(crate) struct ReasoningCount<'a> {
    tokens: HarmonyTokens,
    tok: &'a Tokenizer,
    /// In a header (the answer starts in one): its ids so far.
    header: Option<Vec<u32>>,
    reasoning: bool,
    pub count: u64,
}

impl<'a> ReasoningCount<'a> {
    pub(crate) fn new(tokens: HarmonyTokens, tok: &'a Tokenizer) -> Self {
        ReasoningCount { tokens, tok, header: Some(Vec::new()), reasoning: false, count: 0 }
    }

    pub(crate) fn step(&mut self, id: u32) {
        let t = self.tokens;
        if id == t.end || id == t.call || id == t.ret {
            self.header = Some(Vec::new());
        } else if id == t.start || (id == t.channel && self.header.is_none()) {
            self.header = Some(vec![id]);
        } else if id == t.message {
            if let Some(h) = self.header.take() {
                let text = self.tok.decode(&h, false);
                self.reasoning = markup::body_of(&text) == markup::Body::Reasoning;
            }
        } else if let Some(h) = &mut self.header {
            // Headers are a few tokens; a runaway one stops growing (and counts nothing).
            if h.len() < 64 {
                h.push(id);
            }
        } else if self.reasoning {
            self.count += 1;
        }
    }
}

/// Today's date (UTC) as Harmony's system message writes it, `YYYY-MM-DD`.
pub fn today() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    date_of(secs)
}

/// The UTC date of a Unix time, `YYYY-MM-DD` (days to a civil date: the proleptic Gregorian
/// calendar's 400-year cycle, counted from 0000-03-01 so leap days fall at a cycle's years' end).
pub fn date_of(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let doe = days.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effort_is_clamped_to_three_levels() {
        for (asked, want) in [
            (None, "medium"),
            (Some("none"), "low"),
            (Some("minimal"), "low"),
            (Some("low"), "low"),
            (Some("medium"), "medium"),
            (Some("high"), "high"),
            (Some("xhigh"), "high"),
            (Some("max"), "high"),
            (Some("turbo"), "medium"),
            (Some("7"), "medium"),
        ] {
            assert_eq!(effort(asked), want, "{asked:?}");
        }
    }

    #[test]
    fn a_model_is_harmony_by_name_architecture_or_type_when_its_vocabulary_has_the_tokens() {
        use smg_loadtest::sim::tokenizer as sim;
        let with = Tokenizer::from_parts(sim::tokenizer_json().as_bytes(), Some(&sim::tokenizer_config_json()), None)
            .expect("the simulator's tokenizer");
        let arch = |a: &str| vec![a.to_string()];
        assert!(HarmonyTokens::detect(&["openai/GPT-OSS-120b"], &[], "", &with).is_some(), "by name, any case");
        assert!(HarmonyTokens::detect(&["house-model"], &arch("GptOssForCausalLM"), "", &with).is_some());
        assert!(HarmonyTokens::detect(&["house-model"], &[], "gpt_oss", &with).is_some());
        assert!(HarmonyTokens::detect(&["Qwen/Qwen3-8B"], &arch("Qwen3ForCausalLM"), "qwen3", &with).is_none());
        let t = HarmonyTokens::detect(&["gpt-oss"], &[], "", &with).unwrap();
        assert_eq!(Some(t.call), with.token_to_id("<|call|>"));
        assert_eq!(t.stops(), [t.ret, t.call]);
        // A gpt-oss model whose vocabulary lacks Harmony's tokens keeps its template.
        let json = sim::tokenizer_json().replace("<|call|>", "<|not_call|>");
        let without = Tokenizer::from_parts(json.as_bytes(), Some(&sim::tokenizer_config_json()), None).unwrap();
        assert!(HarmonyTokens::detect(&["openai/gpt-oss-20b"], &[], "", &without).is_none());
    }

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(date_of(0), "1970-01-01");
        assert_eq!(date_of(951_782_400), "2000-02-29");
        assert_eq!(date_of(1_796_428_799), "2026-12-04");
        assert_eq!(date_of(4_107_542_400), "2100-03-01");
    }
}
