//! `/v1/decisions` on a gRPC worker, without I/O: each question becomes a chat prompt of its
//! own over the shared evidence, rendered with the model's chat template, and the engine
//! scores the question's answer labels at the position right after that prompt, generating
//! nothing (a Generate call with `max_new_tokens: 0` and the labels in `token_ids_logprob`;
//! the servicer answers one row of raw next-token log-probabilities for them). The labels'
//! probabilities, renormalized over the labels, become the contract's answer.
//!
//! The labels are the gateway's, not the client's (whose choice values and level labels are
//! free text): `yes`/`no` for a predicate, option letters (A…Z, then AA, AB…) for a choice,
//! level digits for a score. Each must be one token of its own after the prompt, and the
//! labels of a question distinct tokens; a model whose vocabulary or template cannot give that
//! (or whose template leaves a reasoning block open where the answer goes) is refused with
//! `400 unsupported_decisions_request` before anything is sent.
//!
//! `read` takes what does not depend on the model (once per request); `Questions::prepare`
//! renders and tokenizes for one worker's model; `answer` writes the response body from the
//! engine's rows.

use smg_proto::scheduler::{GenerateComplete, GenerateRequest, SamplingParams, TokenizedInput};
use smg_wire::json::put_str;
use smg_wire::num::put_dec;

use super::model::GrpcModel;
use super::refusal::Refusal;
use crate::contract::decisions::{self, put_f64, QuestionKind};
use crate::contract::json::{self, Kind};
use crate::tokenizer::{TemplateInput, Tokenizer};

/// The request, model-independent: the user turn of each question and what the answer
/// repeats of it.
#[derive(Debug)]
pub struct Questions {
    /// The canonical model, as the answer names it.
    pub model: String,
    items: Vec<Item>,
}

#[derive(Debug)]
struct Item {
    kind: QuestionKind,
    /// The `name` token as sent, or `null`.
    name: Vec<u8>,
    /// Choice: each `value` token as sent (`true` stays a boolean). Score: each `label` token.
    values: Vec<Vec<u8>>,
    /// The question's user message: the evidence, the question and how to answer.
    text: String,
    labels: Vec<String>,
}

/// The engine requests for one model: one prompt per question, with its labels' token ids.
#[derive(Debug)]
pub struct Scoring {
    pub prompts: Vec<Prompt>,
}

#[derive(Debug)]
pub struct Prompt {
    pub ids: Vec<u32>,
    pub labels: Vec<u32>,
}

fn unsupported(message: impl Into<String>) -> Refusal {
    Refusal::new(400, "unsupported_decisions_request", message)
}

/// The (contract-validated) body, with the refusals SGLang Decisions makes before dispatch.
pub fn read(body: &[u8], model: &str) -> Result<Questions, Refusal> {
    let doc = json::parse(body).map_err(|e| Refusal::new(400, "json_parse_error", e.describe(body)))?;
    let d = decisions::read(doc).map_err(|e| Refusal::new(400, "json_parse_error", e.message().to_owned()))?;
    decisions::sglang_refusal(&d).map_err(unsupported)?;
    let doc = &d.doc;
    let evidence = d.texts.iter().map(|&t| doc.str(t)).collect::<Vec<_>>().join("\n\n");
    let text_of = |v: usize| match doc.kind(v) {
        Kind::Bool => if doc.node(v).flag { "true" } else { "false" }.into(),
        _ => doc.str(v),
    };
    let mut items = Vec::with_capacity(d.questions.len());
    for q in &d.questions {
        let mut text = String::with_capacity(evidence.len() + 256);
        text.push_str(&evidence);
        let instructions = doc.str(q.instructions);
        let labels: Vec<String> = match q.kind {
            QuestionKind::Predicate => vec!["yes".into(), "no".into()],
            QuestionKind::Choice => (0..q.options.len()).map(letters).collect(),
            QuestionKind::Score => (0..q.options.len()).map(|i| i.to_string()).collect(),
        };
        match q.kind {
            QuestionKind::Predicate => {
                text.push_str("\n\nStatement: ");
                text.push_str(&instructions);
                text.push_str("\nGiven the text above, is the statement true? Reply with yes or no.");
            }
            QuestionKind::Choice | QuestionKind::Score => {
                text.push_str("\n\nQuestion: ");
                text.push_str(&instructions);
                text.push_str(if q.kind == QuestionKind::Choice {
                    "\nOptions:"
                } else {
                    "\nLevels, from the lowest to the highest:"
                });
                for (label, o) in labels.iter().zip(&q.options) {
                    text.push('\n');
                    text.push_str(label);
                    text.push_str(") ");
                    text.push_str(&text_of(o.value));
                    if let Some(desc) = o.description {
                        text.push_str(" - ");
                        text.push_str(&doc.str(desc));
                    }
                }
                text.push_str(if q.kind == QuestionKind::Choice {
                    "\nReply with the letter of one option."
                } else {
                    "\nReply with the number of one level."
                });
            }
        }
        items.push(Item {
            kind: q.kind,
            name: q.name.map_or_else(|| b"null".to_vec(), |n| doc.raw(n).to_vec()),
            values: q.options.iter().map(|o| doc.raw(o.value).to_vec()).collect(),
            text,
            labels,
        });
    }
    Ok(Questions { model: model.to_owned(), items })
}

/// Option `i`'s letters: A…Z, then AA…AZ, BA…, as spreadsheet columns.
fn letters(i: usize) -> String {
    let mut n = i + 1;
    let mut out = Vec::new();
    while n > 0 {
        n -= 1;
        out.push(b'A' + (n % 26) as u8);
        n /= 26;
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

impl Questions {
    /// Renders and tokenizes every question's prompt for `model`, and finds its labels' ids.
    pub fn prepare(&self, model: &GrpcModel) -> Result<Scoring, Refusal> {
        let tok = &model.tokenizer;
        let template = tok
            .chat_template()
            .ok_or_else(|| Refusal::new(500, "chat_template_missing", "The model's tokenizer has no chat template"))?;
        // Thinking off, where the template has a toggle: the answer position must be outside
        // any reasoning block.
        let thinking = template.thinking().key.map(|_| false);
        let mut prompts = Vec::with_capacity(self.items.len());
        for (i, item) in self.items.iter().enumerate() {
            let messages = sonic_rs::json!([{"role": "user", "content": item.text.as_str()}]);
            let input = TemplateInput {
                messages: Some(&messages),
                add_generation_prompt: true,
                tools: None,
                reasoning_effort: None,
                tool_choice: None,
                response_format: None,
                thinking,
                chat_template_kwargs: None,
            };
            let text = template.render(&input).map_err(|e| Refusal::new(400, "chat_template_error", e))?;
            if let Some(open) = open_reasoning(&text, model) {
                return Err(unsupported(format!(
                    "question {i}: the model's chat template leaves a reasoning block ({open}) open where the answer goes"
                )));
            }
            let ids = tok.encode(&text, false).map_err(|e| Refusal::new(500, "tokenization_failed", e))?;
            super::request::within_window(model, ids.len(), &format!("question {i}'s prompt"))?;
            let labels = label_ids(tok, &text, &item.labels).map_err(|label| {
                unsupported(format!(
                    "question {i}: the answer label \"{label}\" is not one distinct token after the chat prompt"
                ))
            })?;
            prompts.push(Prompt { ids, labels });
        }
        Ok(Scoring { prompts })
    }
}

/// The reasoning marker the prompt ends in (the model's parser's, or `<think>`), if any.
fn open_reasoning(prompt: &str, model: &GrpcModel) -> Option<&'static str> {
    let end = prompt.trim_end();
    let parser = model.parsers.reasoning.and_then(smg_parsers::reasoning::markers).map(|(o, _)| o);
    parser.into_iter().chain(["<think>"]).find(|o| end.ends_with(o))
}

/// Each label's token id right after `prompt`; Err: the first label that is not one token of
/// its own there, or repeats another's. Only the prompt's last bytes are tokenized with it:
/// where the label starts, no merge reaches further back.
fn label_ids(tok: &Tokenizer, prompt: &str, labels: &[String]) -> Result<Vec<u32>, String> {
    let mut cut = prompt.len().saturating_sub(64);
    while !prompt.is_char_boundary(cut) {
        cut -= 1;
    }
    let tail = &prompt[cut..];
    let before = tok.encode(tail, false).map_err(|_| labels[0].clone())?;
    let mut ids = Vec::with_capacity(labels.len());
    for label in labels {
        let with = tok.encode(&format!("{tail}{label}"), false).map_err(|_| label.clone())?;
        match with.split_last() {
            Some((&id, rest)) if rest == before.as_slice() && !ids.contains(&id) => ids.push(id),
            _ => return Err(label.clone()),
        }
    }
    Ok(ids)
}

/// The engine request that scores `prompt`'s labels: prefill only, raw log-probabilities of
/// the labels at the next position.
pub fn engine_request(prompt: &Prompt, request_id: String, dp_rank: Option<u32>) -> GenerateRequest {
    GenerateRequest {
        request_id,
        tokenized: Some(TokenizedInput { original_text: String::new(), input_ids: prompt.ids.clone() }),
        sampling_params: Some(SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            repetition_penalty: 1.0,
            max_new_tokens: Some(0),
            n: 1,
            ..Default::default()
        }),
        return_logprob: true,
        logprob_start_len: -1,
        token_ids_logprob: prompt.labels.clone(),
        data_parallel_rank: dp_rank.and_then(|r| i32::try_from(r).ok()),
        stream: false,
        ..Default::default()
    }
}

/// What the engine scored for one question.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The labels' probabilities, in label order, renormalized over the labels.
    pub probabilities: Vec<f64>,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
}

/// The row of `complete` for `prompt`'s labels; None when the engine sent none (an older
/// servicer), several, or one that misses a label or holds no finite value.
pub fn row(prompt: &Prompt, complete: &GenerateComplete) -> Option<Row> {
    let rows = &complete.output_logprobs.as_ref()?.token_ids_logprobs;
    let [only] = rows.as_slice() else { return None };
    let mut lps = Vec::with_capacity(prompt.labels.len());
    for id in &prompt.labels {
        let at = only.token_ids.iter().position(|t| t == id)?;
        lps.push(f64::from(*only.values.get(at)?));
    }
    let top = lps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !top.is_finite() || lps.iter().any(|l| l.is_nan()) {
        return None;
    }
    let weights: Vec<f64> = lps.iter().map(|l| (l - top).exp()).collect();
    let sum: f64 = weights.iter().sum();
    Some(Row {
        probabilities: weights.iter().map(|w| w / sum).collect(),
        prompt_tokens: complete.prompt_tokens,
        cached_tokens: complete.cached_tokens,
    })
}

/// The Decisions body from one row per question (in question order), and its input tokens.
pub fn answer(q: &Questions, rows: &[Row]) -> (Vec<u8>, u64) {
    let mut out = Vec::with_capacity(160 + 128 * q.items.len());
    out.extend_from_slice(b"{\"model\":");
    put_str(&mut out, &q.model);
    out.extend_from_slice(b",\"answers\":[");
    for (i, (item, row)) in q.items.iter().zip(rows).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let ps = &row.probabilities;
        out.extend_from_slice(match item.kind {
            QuestionKind::Predicate => b"{\"type\":\"predicate\"",
            QuestionKind::Choice => b"{\"type\":\"choice\"",
            QuestionKind::Score => b"{\"type\":\"score\"",
        });
        out.extend_from_slice(b",\"name\":");
        out.extend_from_slice(&item.name);
        if item.kind == QuestionKind::Predicate {
            out.extend_from_slice(b",\"probability\":");
            put_f64(&mut out, ps[0]);
            out.push(b'}');
            continue;
        }
        decisions::put_verdict(
            &mut out,
            item.kind,
            &item.values,
            ps,
            |o, j| put_f64(o, ps[j]),
            |o, top| put_f64(o, ps[top]),
        );
        out.push(b'}');
    }
    let input: u64 = rows.iter().map(|r| u64::from(r.prompt_tokens)).sum();
    let cached: u64 = rows.iter().map(|r| u64::from(r.cached_tokens)).sum();
    out.extend_from_slice(b"],\"usage\":{\"input_tokens\":");
    put_dec(&mut out, input);
    out.extend_from_slice(b",\"output_tokens\":0,\"total_tokens\":");
    put_dec(&mut out, input);
    out.extend_from_slice(b",\"input_tokens_details\":{\"cached_tokens\":");
    put_dec(&mut out, cached);
    out.extend_from_slice(b",\"cache_write_tokens\":0},\"output_tokens_details\":{\"reasoning_tokens\":0}}}");
    (out, input)
}

#[cfg(test)]
mod tests;
