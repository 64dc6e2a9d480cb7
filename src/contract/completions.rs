//! `/v1/completions`: SMG's field and cross-field rules for the legacy text API.

use super::error::ContractError;
use super::fields::{self, Result};
use super::json::{Doc, Kind};
use super::sampling::{self, Sampling};

/// A completions request as tape indices plus the values the rules need.
pub struct Completion<'a> {
    pub doc: Doc<'a>,
    pub model: usize,
    pub s: Sampling,
    pub max_tokens: Option<u32>,
}

pub fn read(doc: Doc<'_>) -> Result<Completion<'_>> {
    if doc.kind(0) != Kind::Object {
        return Err(fields::invalid_type(&doc, 0, "request", "struct CompletionRequest"));
    }
    let (mut model, mut prompt) = (None, None);
    let (mut best_of, mut logprobs, mut max_tokens, mut json_schema) = (None, None, None, false);
    let mut s = Sampling::default();
    for (k, v) in doc.members(0) {
        let key = doc.key(k);
        if s.read(&doc, &key, v)? {
            continue;
        }
        match &*key {
            b"model" => model = fields::string_idx(&doc, v, "model")?,
            b"prompt" => prompt = Some(v),
            b"best_of" => best_of = fields::uint32(&doc, v, "best_of")?,
            b"logprobs" => logprobs = fields::uint32(&doc, v, "logprobs")?,
            b"max_tokens" => max_tokens = fields::uint32(&doc, v, "max_tokens")?,
            b"json_schema" => json_schema = fields::string_idx(&doc, v, "json_schema")?.is_some(),
            b"echo" => {
                fields::boolean(&doc, v, "echo")?;
            }
            b"suffix" => {
                fields::string_idx(&doc, v, "suffix")?;
            }
            b"seed" => {
                fields::integer(&doc, v, "seed", "i64", i64::MIN as i128, i64::MAX as i128)?;
            }
            _ => {}
        }
    }
    let model = model.ok_or_else(|| fields::missing("model"))?;
    let prompt = prompt.filter(|&p| !doc.is_null(p)).ok_or_else(|| fields::missing("prompt"))?;
    check_prompt_type(&doc, prompt)?;

    // Field rules, in SMG's struct order.
    if doc.kind(prompt) == Kind::Array && doc.node(prompt).next as usize == prompt + 1 {
        return Err(ContractError::field("prompt array cannot be empty"));
    }
    if best_of.is_some_and(|b| b > 20) {
        return Err(ContractError::field("best_of must be between 0 and 20"));
    }
    sampling::range("frequency_penalty", s.frequency_penalty, -2.0, 2.0)?;
    if logprobs.is_some_and(|l| l > 5) {
        return Err(ContractError::field("logprobs must be between 0 and 5"));
    }
    s.check_n(128)?;
    sampling::range("presence_penalty", s.presence_penalty, -2.0, 2.0)?;
    s.check_stop(&doc)?;
    s.check_temperature()?;
    s.check_top_p()?;
    s.check_extensions()?;

    // Cross-field rules.
    s.check_stream_options()?;
    if let (Some(min), Some(max)) = (s.min_tokens, max_tokens) {
        if min > max {
            return Err(ContractError::rule("min_tokens cannot exceed max_tokens"));
        }
    }
    if u8::from(s.regex) + u8::from(s.ebnf) + u8::from(json_schema) > 1 {
        return Err(ContractError::rule(
            "only one structured output constraint (regex, ebnf, or json_schema) can be active at a time",
        ));
    }
    if let (Some(best_of), Some(n)) = (best_of, s.n) {
        if best_of <= n {
            return Err(ContractError::rule("best_of must be greater than n"));
        }
    }
    if s.stream && best_of.is_some() {
        return Err(ContractError::rule("best_of is not supported when stream is enabled"));
    }
    Ok(Completion { doc, model, s, max_tokens })
}

/// A string, or an array of prompts: strings, token ids, or arrays of token ids.
fn check_prompt_type(doc: &Doc<'_>, prompt: usize) -> Result<()> {
    let expected = "a string or an array of prompts";
    match doc.kind(prompt) {
        Kind::String => Ok(()),
        Kind::Array => {
            for el in doc.elements(prompt) {
                match doc.kind(el) {
                    Kind::String => {}
                    Kind::Number => {
                        fields::uint32(doc, el, "prompt")?;
                    }
                    Kind::Array => {
                        for tok in doc.elements(el) {
                            if doc.kind(tok) != Kind::Number {
                                return Err(fields::invalid_type(doc, tok, "prompt", "a token id"));
                            }
                            fields::uint32(doc, tok, "prompt")?;
                        }
                    }
                    _ => return Err(fields::invalid_type(doc, el, "prompt", expected)),
                }
            }
            Ok(())
        }
        _ => Err(fields::invalid_type(doc, prompt, "prompt", expected)),
    }
}
