//! `--reasoning-markup` / `--tool-call-markup`: the simulated engine answers in a model
//! family's markup (written by `smg_parsers::markup`), so the gateway's output parsers have
//! the work a real reasoning or agent model gives them. An answer: the think block (when a
//! reasoning family is set), a sentence, then a call of `get_weather` with one `city` (when a
//! tool family is set; the families whose calls stand alone answer with the call only). The
//! city depends on the request id, so answers differ and repeat for the same id.
//!
//! After a tool result the model answers as an agent model does: when a tool family is set and
//! the prompt's last message is a tool's (the prompt, read back through the simulator's
//! tokenizer, ends `<|im_start|>tool\n{content}<|im_end|>\n<|im_start|>assistant\n`: the last
//! `<|im_start|>` before the generation prompt opens a `tool` turn), the answer is plain text
//! quoting that output, `The tool said: {content}.` (the content trimmed, and cut at
//! [`QUOTE_MAX`] bytes on a character boundary so an answer stays short; no second full stop
//! when it ends a sentence already), in the reasoning
//! family's think block when one is set (thinking `The tool answered.`), and it calls nothing.
//! It depends on the prompt alone, so the same prompt gets the same answer. Any other prompt
//! (a user's turn last, or a template that renders no `tool` role) is answered as above.

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

/// The most of a tool's output an answer quotes, in bytes.
pub const QUOTE_MAX: usize = 256;

/// The answer's text for request `id` reading `prompt` (its token ids); None when no family is
/// set.
pub fn text(families: &(Option<String>, Option<String>), id: &str, prompt: &[u32]) -> Option<String> {
    let (reasoning, tools) = (families.0.as_deref(), families.1.as_deref());
    if reasoning.is_none() && tools.is_none() {
        return None;
    }
    if let Some(output) = tools.and_then(|_| last_tool_result(prompt)) {
        let quoted = quote(&output);
        let stop = if quoted.ends_with(['.', '!', '?']) { "" } else { "." };
        let answer = format!("The tool said: {quoted}{stop}");
        return match reasoning {
            Some(r) => markup::reasoning(r, "The tool answered.", &answer),
            None => Some(answer),
        };
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

/// The content of the prompt's last message when that message is a tool's: the ChatML
/// prompt ends with the generation prompt, and the turn before it is `<|im_start|>tool\n…<|im_end|>`.
pub fn last_tool_result(prompt: &[u32]) -> Option<String> {
    let text = tokenizer::decode_bytes(prompt);
    let generation = format!("{}assistant\n", tokenizer::IM_START);
    let before = text.strip_suffix(generation.as_bytes())?;
    let opened = memchr::memmem::rfind(before, tokenizer::IM_START.as_bytes())? + tokenizer::IM_START.len();
    let turn = before[opened..].strip_prefix(b"tool\n")?;
    let end = memchr::memmem::rfind(turn, tokenizer::IM_END.as_bytes())?;
    Some(String::from_utf8_lossy(&turn[..end]).into_owned())
}

/// `output` trimmed, at most [`QUOTE_MAX`] bytes of it (cut on a character boundary).
fn quote(output: &str) -> &str {
    let t = output.trim();
    let mut end = t.len().min(QUOTE_MAX);
    while !t.is_char_boundary(end) {
        end -= 1;
    }
    &t[..end]
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
pub fn answer(families: &(Option<String>, Option<String>), id: &str, prompt: &[u32]) -> Option<Vec<u32>> {
    Some(text(families, id, prompt)?.bytes().map(tokenizer::byte_id).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_carry_the_families_markup() {
        let both = (Some("qwen3".to_string()), Some("qwen".to_string()));
        let t = text(&both, "r1", &[]).unwrap();
        assert!(t.starts_with("<think>The user asks about "), "{t}");
        assert!(t.contains("</think>\n\nLet me look that up.<tool_call>\n{\"name\": \"get_weather\""), "{t}");
        assert_eq!(text(&both, "r1", &[]), Some(t), "the same id, the same answer");
        assert_eq!(text(&(None, None), "r1", &[]), None);
        assert!(check(&(Some("nope".into()), None)).unwrap_err().contains("known: "));
        assert!(check(&(None, Some("nope".into()))).unwrap_err().contains("qwen"));
        assert!(check(&both).is_ok());
    }

    /// A prompt as the gateway renders the simulator's ChatML template, in its tokens.
    fn chatml(messages: &[(&str, &str)]) -> Vec<u32> {
        let mut t = String::new();
        for (role, content) in messages {
            t.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
        }
        t.push_str("<|im_start|>assistant\n");
        tokenizer::encode(&t)
    }

    #[test]
    fn after_a_tool_result_the_answer_quotes_it_and_calls_nothing() {
        let qwen = (Some("qwen3".to_string()), Some("qwen".to_string()));
        let tool_last = chatml(&[
            ("user", "Weather in Paris?"),
            (
                "assistant",
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            ),
            ("tool", "{\"temp\":21, \"sky\":\"São Paulo blue\"}"),
        ]);
        assert_eq!(last_tool_result(&tool_last).as_deref(), Some("{\"temp\":21, \"sky\":\"São Paulo blue\"}"));
        let t = text(&qwen, "r1", &tool_last).unwrap();
        assert_eq!(t, "<think>The tool answered.</think>\n\nThe tool said: {\"temp\":21, \"sky\":\"São Paulo blue\"}.");
        assert!(!t.contains("<tool_call>"), "no call after a result: {t}");
        assert_eq!(text(&qwen, "other id", &tool_last), Some(t), "the prompt decides, not the id");
        // Without a reasoning family: the sentence alone; with a stand-alone call family too.
        let plain = text(&(None, Some("qwen".into())), "r1", &tool_last).unwrap();
        assert_eq!(plain, "The tool said: {\"temp\":21, \"sky\":\"São Paulo blue\"}.");
        assert_eq!(text(&(None, Some("json".into())), "r1", &tool_last), Some(plain));
        // The answer as byte tokens spells the same text.
        let ids = answer(&(None, Some("qwen".into())), "r1", &tool_last).unwrap();
        assert_eq!(
            String::from_utf8(tokenizer::decode_bytes(&ids)).unwrap(),
            "The tool said: {\"temp\":21, \"sky\":\"São Paulo blue\"}."
        );
        // A user's turn after the result: the usual call.
        let user_last = chatml(&[("user", "Weather?"), ("tool", "sunny"), ("user", "And tomorrow?")]);
        assert_eq!(last_tool_result(&user_last), None);
        assert_eq!(text(&qwen, "r1", &user_last), text(&qwen, "r1", &[]));
        // A reasoning family alone keeps its answer; a long output is cut on a character boundary.
        assert_eq!(
            text(&(Some("qwen3".into()), None), "r1", &tool_last),
            text(&(Some("qwen3".into()), None), "r1", &[])
        );
        let said = text(&(None, Some("qwen".into())), "r1", &chatml(&[("tool", " It is sunny. \n")]));
        assert_eq!(said.as_deref(), Some("The tool said: It is sunny."), "trimmed, one full stop");
        let long = "é".repeat(QUOTE_MAX);
        let t = text(&(None, Some("qwen".into())), "r1", &chatml(&[("tool", &long)])).unwrap();
        assert_eq!(t, format!("The tool said: {}.", "é".repeat(QUOTE_MAX / 2)));
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
