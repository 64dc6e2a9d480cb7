//! `--reasoning-markup` / `--tool-call-markup`: the simulated engine answers in a model
//! family's markup (written by `smg_parsers::markup`), so the gateway's output parsers have
//! the work a real reasoning or agent model gives them. An answer: the think block (when a
//! reasoning family is set), a sentence, then a call of `get_weather` with one `city` (when a
//! tool family is set; the families whose calls stand alone answer with the call only). The
//! city depends on the request id, so answers differ and repeat for the same id.

use smg_parsers::markup;

use crate::sim::tokenizer;

const CITIES: &[&str] = &["Paris", "東京", "São Paulo", "Zürich", "New York"];

/// The tool the answers call, as a request offers it (smg-load's scenarios with `tools`).
pub const WEATHER_TOOL: &str = r#"{"type":"function","function":{"name":"get_weather","description":"The weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}"#;

/// Refuses families `smg_parsers::markup` cannot write, naming those it can.
pub fn check(families: &(Option<String>, Option<String>)) -> Result<(), String> {
    if let Some(r) = &families.0 {
        if markup::reasoning(r, "", "").is_none() {
            let known: Vec<&str> = smg_parsers::reasoning::NAMES
                .iter()
                .copied()
                .filter(|n| markup::reasoning(n, "", "").is_some())
                .collect();
            return Err(format!("--reasoning-markup: unknown family '{r}' (known: {})", known.join(", ")));
        }
    }
    if let Some(t) = &families.1 {
        if markup::call(t, "f", &[], 0).is_none() {
            let known: Vec<&str> =
                smg_parsers::tools::NAMES.iter().copied().filter(|n| markup::call(n, "f", &[], 0).is_some()).collect();
            return Err(format!("--tool-call-markup: unknown family '{t}' (known: {})", known.join(", ")));
        }
    }
    Ok(())
}

/// The answer's text for request `id`; None when no family is set.
pub fn text(families: &(Option<String>, Option<String>), id: &str) -> Option<String> {
    let (reasoning, tools) = (families.0.as_deref(), families.1.as_deref());
    if reasoning.is_none() && tools.is_none() {
        return None;
    }
    let city = city_of(id);
    let mut answer = match tools {
        Some(t) => {
            let arg = format!("\"{city}\"");
            let call = markup::call(t, "get_weather", &[("city", &arg)], 0)?;
            if markup::stands_alone(t) {
                call
            } else {
                format!("Let me look that up.{call}")
            }
        }
        None => format!("The weather in {city} is mild today."),
    };
    if let Some(r) = reasoning {
        answer = markup::reasoning(r, &format!("The user asks about {city}."), &answer)?;
    }
    Some(answer)
}

/// Whether a served model name is a gpt-oss model's (as a gateway detects it): the simulator
/// then answers in Harmony.
pub fn is_harmony_model(name: &str) -> bool {
    name.to_ascii_lowercase().contains("gpt-oss")
}

/// A gpt-oss answer in Harmony for request `id`: its reasoning on `analysis`, then a call of
/// `get_weather` on `commentary` when the prompt declares that function (ending with the
/// `<|call|>` stop token), else the answer on `final` (ending with `<|return|>`).
pub fn harmony_text(id: &str, prompt: &[u32]) -> String {
    let city = city_of(id);
    let mut t = format!("<|channel|>analysis<|message|>The user asks about {city}.<|end|><|start|>assistant");
    if tokenizer::prompt_holds(prompt, "type get_weather") {
        t.push_str(&format!(
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{{\"city\":\"{city}\"}}<|call|>"
        ));
    } else {
        t.push_str(&format!("<|channel|>final<|message|>The weather in {city} is mild today.<|return|>"));
    }
    t
}

/// [`harmony_text`] as the model's tokens.
pub fn harmony_answer(id: &str, prompt: &[u32]) -> Vec<u32> {
    tokenizer::encode_harmony(&harmony_text(id, prompt))
}

fn city_of(id: &str) -> &'static str {
    let h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    CITIES[(h % CITIES.len() as u64) as usize]
}

/// [`text`] as the simulator's byte tokens.
pub fn answer(families: &(Option<String>, Option<String>), id: &str) -> Option<Vec<u32>> {
    Some(text(families, id)?.bytes().map(tokenizer::byte_id).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_carry_the_families_markup() {
        let both = (Some("qwen3".to_string()), Some("qwen".to_string()));
        let t = text(&both, "r1").unwrap();
        assert!(t.starts_with("<think>The user asks about "), "{t}");
        assert!(t.contains("</think>\n\nLet me look that up.<tool_call>\n{\"name\": \"get_weather\""), "{t}");
        assert_eq!(text(&both, "r1"), Some(t), "the same id, the same answer");
        assert_eq!(text(&(None, None), "r1"), None);
        assert!(check(&(Some("nope".into()), None)).unwrap_err().contains("known: "));
        assert!(check(&(None, Some("nope".into()))).unwrap_err().contains("qwen"));
        assert!(check(&both).is_ok());
    }

    #[test]
    fn gpt_oss_answers_in_harmony_calling_only_what_the_prompt_declares() {
        let plain = harmony_text("r1", &tokenizer::encode_harmony("<|start|>user<|message|>Hi<|end|>"));
        assert!(plain.starts_with("<|channel|>analysis<|message|>The user asks about "), "{plain}");
        assert!(
            plain.contains("<|start|>assistant<|channel|>final<|message|>The weather in ")
                && plain.ends_with("<|return|>"),
            "{plain}"
        );
        let prompt =
            tokenizer::encode_harmony("namespace functions {\n\ntype get_weather = (_: {\ncity: string,\n}) => any;");
        let call = harmony_text("r1", &prompt);
        assert!(
            call.contains("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\""),
            "{call}"
        );
        assert!(call.ends_with("<|call|>"), "{call}");
        let ids = harmony_answer("r1", &prompt);
        assert_eq!(ids.last().copied(), tokenizer::harmony_id("<|call|>"), "special tokens are their own ids");
        assert!(is_harmony_model("openai/gpt-oss-20b") && !is_harmony_model("Qwen/Qwen3-8B"));
    }
}
