//! `--reasoning-markup` / `--tool-call-markup`: the simulated engine answers in a model
//! family's markup (written by `smg_parsers::markup`), so the gateway's output parsers have
//! the work a real reasoning or agent model gives them. An answer: the think block (when a
//! reasoning family is set), a sentence, then a call of `get_weather` with one `city` (when a
//! tool family is set; the families whose calls stand alone answer with the call only). The
//! city depends on the request id, so answers differ and repeat for the same id.

use smg_parsers::markup;

use super::tokenizer;

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
    let h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    let city = CITIES[(h % CITIES.len() as u64) as usize];
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
}
