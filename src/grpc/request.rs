//! An OpenAI request (already validated by the contract) as SGLang GenerateRequests: the
//! prompt rendered and tokenized by the gateway, and sampling parameters with an explicit
//! value for every field (proto3's zeros are not the engine's defaults: temperature 0 would
//! be greedy, top_k 0 invalid). The model's own defaults apply under the client's values.

use std::collections::HashMap;

use smg_proto::scheduler::{sampling_params::Constraint, SamplingParams};
use sonic_rs::{JsonContainerTrait, JsonType, JsonValueTrait, Value};

use super::model::GrpcModel;
use super::output::OutputPlan;
use super::refusal::Refusal;
use crate::tokenizer::ThinkingAsk;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completions,
    /// SGLang's native `/generate` (`text` or `input_ids`, `sampling_params`; src/grpc/native.rs).
    Generate,
}

/// What the engine gets and how the gateway shapes its answer.
#[derive(Debug)]
pub struct Prepared {
    /// Token ids of each engine request (a completions prompt array: one per prompt).
    pub prompts: Vec<Vec<u32>>,
    pub params: SamplingParams,
    pub n: u32,
    pub stream: bool,
    pub include_usage: bool,
    pub continuous_usage: bool,
    /// Stop strings, matched by the gateway on the decoded text.
    pub stop: Vec<String>,
    pub no_stop_trim: bool,
    pub skip_special: bool,
    /// The model starts in reasoning mode (the engine then counts reasoning tokens).
    pub reasoning: bool,
    /// Log-probabilities asked for, with this many top alternatives per token.
    pub logprobs: Option<u32>,
    /// `/generate`'s `logprob_start_len`: the prompt's log-probabilities from there (-1: none).
    pub logprob_start: i32,
    /// Completions `echo`: each prompt's text, put before its choices' text.
    pub echo: Vec<String>,
    /// Completions `suffix`: put after each choice's text.
    pub suffix: Option<String>,
    /// The choices' reasoning and tool-call parsing.
    pub output: OutputPlan,
    /// A Harmony model's chat: its special tokens (the gateway counts reasoning tokens).
    pub harmony: Option<super::harmony::HarmonyTokens>,
}

/// The one check of a prompt against the model's context window (chat, completions,
/// `/generate`, each embeddings input, each Decisions question): `what` names the prompt in
/// the refusal.
pub fn within_window(model: &GrpcModel, tokens: usize, what: &str) -> Result<(), Refusal> {
    match model.max_context.filter(|&w| tokens > w as usize) {
        Some(window) => Err(bad(
            "context_length_exceeded",
            format!(
                "This model's maximum context length is {window} tokens. However, {what} has {tokens} input tokens. Please reduce the length of the input."
            ),
        )),
        None => Ok(()),
    }
}

fn bad(code: &'static str, message: impl Into<String>) -> Refusal {
    Refusal::new(400, code, message)
}

/// Builds the engine requests' contents for `body` on a worker serving `model`.
pub fn prepare(kind: Kind, body: &Value, model: &GrpcModel) -> Result<Prepared, Refusal> {
    let tok = &model.tokenizer;
    let (prompts, reasoning, output) = match kind {
        Kind::Chat if model.harmony.is_some() => {
            check_output_modalities(body)?;
            let ask = ThinkingAsk::of_body(body);
            let text =
                super::harmony::render::prompt(body, &super::harmony::today(), super::harmony::effort(ask.effort))?;
            let ids = tok.encode(&text, false).map_err(|e| Refusal::internal("tokenization_failed", e))?;
            (vec![ids], false, OutputPlan::of_harmony(body))
        }
        Kind::Chat => {
            check_output_modalities(body)?;
            let (text, thinks) = render_chat(body, model)?;
            let ids = tok.encode(&text, false).map_err(|e| Refusal::internal("tokenization_failed", e))?;
            // MiniMax's answers are scanned for calls even when the request offers no tools
            // (the contract's profile rule).
            let scan = model.parsers.tools == Some("minimax_m2");
            // The answer starts inside reasoning when thinking is on, or when the template
            // left the reasoning block open at the prompt's end (DeepSeek-R1's has no toggle and
            // always does).
            let open = model.parsers.reasoning.and_then(smg_parsers::reasoning::markers);
            let opened = open.is_some_and(|(o, _)| text.trim_end().ends_with(o));
            (vec![ids], thinks, OutputPlan::of_chat(body, model.parsers, thinks || opened, scan))
        }
        Kind::Completions => (completion_prompts(body, model)?, false, OutputPlan::default()),
        Kind::Generate => (generate_prompts(body, model)?, false, OutputPlan::default()),
    };
    within_window(model, prompts.iter().map(Vec::len).max().unwrap_or(0), "your request")?;
    // /generate's sampling fields sit in its `sampling_params` object, under SGLang's names.
    let empty = Value::new_object();
    let fields = match kind {
        Kind::Generate => body.get("sampling_params").filter(|v| v.is_object()).unwrap_or(&empty),
        _ => body,
    };
    let stop = strings(fields.get("stop"));
    let n = fields.get("n").and_then(|v| v.as_u64()).unwrap_or(1).max(1) as u32;
    let stream = body.get("stream").and_then(|v| v.as_bool()).unwrap_or(false);
    let opts = body.get("stream_options");
    let flag = |k: &str| opts.and_then(|o| o.get(k)).and_then(|v| v.as_bool()).unwrap_or(false);
    let include_usage = stream && flag("include_usage");
    let mut params = sampling(kind, fields, model, &stop, n)?;
    // Harmony: the answer's special tokens are its structure (the parser reads and drops
    // them), and the engine stops at the answer's end or a call's.
    let harmony = model.harmony.filter(|_| kind == Kind::Chat);
    if let Some(h) = harmony {
        params.skip_special_tokens = false;
        for id in h.stops() {
            if !params.stop_token_ids.contains(&id) {
                params.stop_token_ids.push(id);
            }
        }
    }
    let top = |k: &str| body.get(k).and_then(|v| v.as_u64()).map(|v| v.min(u32::MAX as u64) as u32);
    let logprobs = match kind {
        Kind::Chat => {
            (body.get("logprobs").and_then(|v| v.as_bool()) == Some(true)).then(|| top("top_logprobs").unwrap_or(0))
        }
        Kind::Completions => top("logprobs"),
        Kind::Generate => (body.get("return_logprob").and_then(|v| v.as_bool()) == Some(true))
            .then(|| body.get("top_logprobs_num").and_then(|v| v.as_u64()).unwrap_or(0).min(u32::MAX as u64) as u32),
    };
    let (echo, suffix) = match kind {
        Kind::Chat | Kind::Generate => (Vec::new(), None),
        Kind::Completions => {
            let echo = if body.get("echo").and_then(|v| v.as_bool()) == Some(true) {
                echo_texts(body, &prompts, model)
            } else {
                Vec::new()
            };
            (echo, body.get("suffix").and_then(|v| v.as_str()).filter(|s| !s.is_empty()).map(str::to_string))
        }
    };
    let logprob_start = match kind {
        Kind::Generate if logprobs.is_some() => body
            .get("logprob_start_len")
            .and_then(|v| v.as_i64())
            .map_or(-1, |v| v.clamp(-1, i64::from(i32::MAX)) as i32),
        _ => -1,
    };
    Ok(Prepared {
        logprobs,
        logprob_start,
        echo,
        suffix,
        prompts,
        n,
        stream,
        include_usage,
        // The contract: no running usage for Harmony models (their reasoning tokens are
        // counted by the gateway once the answer is read).
        continuous_usage: include_usage && flag("continuous_usage_stats") && harmony.is_none(),
        harmony,
        no_stop_trim: params.no_stop_trim,
        skip_special: params.skip_special_tokens,
        reasoning,
        stop,
        params,
        output,
    })
}

/// gRPC workers produce text only.
fn check_output_modalities(body: &Value) -> Result<(), Refusal> {
    if body.get("return_audio").and_then(|v| v.as_bool()) == Some(true) {
        return Err(bad("audio_output_not_supported", "gRPC workers produce text only: return_audio is not supported"));
    }
    if let Some(m) = body.get("modalities").and_then(|v| v.as_array()) {
        if let Some(other) = m.iter().find(|x| x.as_str() != Some("text")) {
            let name = other.as_str().map(str::to_string).unwrap_or_else(|| other.to_string());
            return Err(bad("unsupported_output_modality", format!("gRPC workers produce text only, not '{name}'")));
        }
    }
    Ok(())
}

/// Content parts the template can render are text; media go to engines that accept them
/// (not yet sent over gRPC), and anything else cannot be rendered.
fn check_content_parts(messages: &Value, model: &GrpcModel) -> Result<(), Refusal> {
    let Some(list) = messages.as_array() else { return Ok(()) };
    for m in list.iter() {
        let Some(parts) = m.get("content").and_then(|c| c.as_array()) else { continue };
        for p in parts.iter() {
            match p.get("type").and_then(|t| t.as_str()) {
                Some("text") if p.get("text").is_some_and(|t| t.is_str()) => {}
                Some(media @ ("image_url" | "video_url" | "input_audio" | "audio_url")) => {
                    let why = if model.supports_vision {
                        format!("the gateway does not send '{media}' content to gRPC workers")
                    } else {
                        format!("the selected worker's model does not accept '{media}' input")
                    };
                    return Err(bad("multimodal_not_supported", why));
                }
                other => {
                    let name = other.unwrap_or("(none)");
                    return Err(bad(
                        "unsupported_content_part",
                        format!("content part of type '{name}' cannot be rendered"),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The prompt text, and whether the model starts in reasoning mode.
fn render_chat(body: &Value, model: &GrpcModel) -> Result<(String, bool), Refusal> {
    let messages = body.get("messages").ok_or_else(|| bad("400", "messages is required"))?;
    check_content_parts(messages, model)?;
    let template = model
        .tokenizer
        .chat_template()
        .ok_or_else(|| Refusal::internal("chat_template_missing", "The model's tokenizer has no chat template"))?;
    template.render_request(body).map_err(|e| bad("chat_template_error", e))
}

/// A string, an array of strings, an array of token ids, or an array of such arrays.
fn completion_prompts(body: &Value, model: &GrpcModel) -> Result<Vec<Vec<u32>>, Refusal> {
    let p = body.get("prompt").ok_or_else(|| bad("400", "prompt is required"))?;
    let encode = |s: &str| model.tokenizer.encode(s, true).map_err(|e| Refusal::internal("tokenization_failed", e));
    let ids = |v: &Value| -> Option<Vec<u32>> {
        v.as_array()?.iter().map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok())).collect()
    };
    if let Some(s) = p.as_str() {
        return Ok(vec![encode(s)?]);
    }
    let Some(arr) = p.as_array() else { return Err(bad("400", "prompt must be a string or an array")) };
    if arr.iter().all(|x| x.is_number()) {
        return ids(p).map(|v| vec![v]).ok_or_else(|| bad("400", "prompt token ids must be integers"));
    }
    arr.iter()
        .map(|x| match x.get_type() {
            JsonType::String => encode(x.as_str().unwrap_or("")),
            JsonType::Array => ids(x).ok_or_else(|| bad("400", "prompt token ids must be integers")),
            _ => Err(bad("400", "each prompt must be a string or an array of token ids")),
        })
        .collect()
}

/// `/generate`'s prompts: `text` (a string or strings) or `input_ids` (ids, or lists of ids).
fn generate_prompts(body: &Value, model: &GrpcModel) -> Result<Vec<Vec<u32>>, Refusal> {
    let encode = |s: &str| model.tokenizer.encode(s, true).map_err(|e| Refusal::internal("tokenization_failed", e));
    let ids = |v: &Value| -> Option<Vec<u32>> {
        v.as_array()?.iter().map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok())).collect()
    };
    let prompts = match (body.get("text").filter(|t| !t.is_null()), body.get("input_ids").filter(|t| !t.is_null())) {
        (Some(_), Some(_)) => return Err(bad("400", "Either text or input_ids should be provided, not both")),
        (Some(t), None) => match t.get_type() {
            JsonType::String => vec![encode(t.as_str().unwrap_or(""))?],
            JsonType::Array => t
                .as_array()
                .map(|a| a.iter().collect::<Vec<_>>())
                .unwrap_or_default()
                .into_iter()
                .map(|x| {
                    x.as_str()
                        .ok_or_else(|| bad("400", "text must be a string or an array of strings"))
                        .and_then(encode)
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(bad("400", "text must be a string or an array of strings")),
        },
        (None, Some(v)) => {
            let arr = v.as_array().ok_or_else(|| bad("400", "input_ids must be an array"))?;
            if arr.iter().all(|x| x.is_number()) {
                vec![ids(v).ok_or_else(|| bad("400", "input_ids must be non-negative integers"))?]
            } else {
                arr.iter()
                    .map(|x| ids(x).ok_or_else(|| bad("400", "input_ids must be token ids or lists of token ids")))
                    .collect::<Result<_, _>>()?
            }
        }
        (None, None) => return Err(bad("400", "Either text or input_ids should be provided")),
    };
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        return Err(bad("400", "The input is empty"));
    }
    Ok(prompts)
}

/// Each prompt as text: a string as sent, token ids decoded.
fn echo_texts(body: &Value, prompts: &[Vec<u32>], model: &GrpcModel) -> Vec<String> {
    let p = body.get("prompt");
    let sent: Vec<Option<&str>> = match p {
        Some(s) if s.is_str() => vec![s.as_str()],
        Some(a) if a.as_array().is_some_and(|a| a.iter().any(|x| !x.is_number())) => {
            a.as_array().map(|a| a.iter().map(|x| x.as_str()).collect()).unwrap_or_default()
        }
        _ => Vec::new(),
    };
    prompts
        .iter()
        .enumerate()
        .map(|(i, ids)| match sent.get(i).copied().flatten() {
            Some(s) => s.to_string(),
            None => model.tokenizer.decode(ids, false),
        })
        .collect()
}

fn strings(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(s) if s.is_str() => s.as_str().map(|s| vec![s.to_string()]).unwrap_or_default(),
        Some(a) => a
            .as_array()
            .map(|a| a.iter().filter_map(|x| x.as_str()).filter(|s| !s.is_empty()).map(str::to_string).collect())
            .unwrap_or_default(),
        None => Vec::new(),
    }
}

fn sampling(kind: Kind, body: &Value, model: &GrpcModel, stop: &[String], n: u32) -> Result<SamplingParams, Refusal> {
    let d = &model.defaults;
    let f = |k: &str| body.get(k).and_then(|v| v.as_f64()).map(|x| x as f32);
    let b = |k: &str| body.get(k).and_then(|v| v.as_bool());
    let max_new_tokens = match kind {
        Kind::Chat => body.get("max_completion_tokens").or_else(|| body.get("max_tokens")),
        Kind::Completions => body.get("max_tokens"),
        Kind::Generate => body.get("max_new_tokens"),
    }
    .and_then(|v| v.as_u64())
    .map(|v| v.min(u32::MAX as u64) as u32);
    let stop_token_ids = body
        .get("stop_token_ids")
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|x| x.as_u64()).filter_map(|x| u32::try_from(x).ok()).collect())
        .unwrap_or_default();
    let logit_bias: HashMap<String, f32> = body
        .get("logit_bias")
        .and_then(|v| v.as_object())
        .map(|o| o.iter().filter_map(|(k, v)| Some((k.to_string(), v.as_f64()? as f32))).collect())
        .unwrap_or_default();
    Ok(SamplingParams {
        temperature: f("temperature").or(d.temperature).unwrap_or(1.0),
        top_p: f("top_p").or(d.top_p).unwrap_or(1.0),
        top_k: body.get("top_k").and_then(|v| v.as_i64()).map(|k| k as i32).or(d.top_k).unwrap_or(-1),
        min_p: f("min_p").or(d.min_p).unwrap_or(0.0),
        frequency_penalty: f("frequency_penalty").unwrap_or(0.0),
        presence_penalty: f("presence_penalty").unwrap_or(0.0),
        repetition_penalty: f("repetition_penalty").or(d.repetition_penalty).unwrap_or(1.0),
        max_new_tokens,
        // Sent as well, though the gateway matches them on decoded text itself (an engine
        // that detokenizes may stop earlier; one that does not ignores them).
        stop: stop.to_vec(),
        stop_token_ids,
        skip_special_tokens: b("skip_special_tokens").unwrap_or(true),
        spaces_between_special_tokens: b("spaces_between_special_tokens").unwrap_or(true),
        constraint: constraint(kind, body)?,
        n,
        min_new_tokens: body
            .get(if kind == Kind::Generate { "min_new_tokens" } else { "min_tokens" })
            .and_then(|v| v.as_u64())
            .unwrap_or(0)
            .min(u32::MAX as u64) as u32,
        ignore_eos: b("ignore_eos").unwrap_or(false),
        no_stop_trim: b("no_stop_trim").unwrap_or(false),
        stream_interval: None,
        logit_bias,
        custom_params: body.get("custom_params").and_then(to_struct),
    })
}

/// Structured output: `response_format` (json_schema, json_object), `regex`, `ebnf`, and on
/// completions a `json_schema` string. The contract already refused combinations.
fn constraint(kind: Kind, body: &Value) -> Result<Option<Constraint>, Refusal> {
    let rf = body.get("response_format");
    let rf_type = rf.and_then(|r| r.get("type")).and_then(|t| t.as_str());
    let from_rf = match rf_type {
        Some("json_schema") => {
            let schema = rf.and_then(|r| r.get("json_schema")).and_then(|j| j.get("schema"));
            Some(Constraint::JsonSchema(schema.map(|s| s.to_string()).unwrap_or_else(|| "{}".into())))
        }
        Some("json_object") => Some(Constraint::JsonSchema("{\"type\":\"object\"}".into())),
        _ => None,
    };
    let s = |k: &str| body.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let all = [
        from_rf,
        s("regex").map(Constraint::Regex),
        s("ebnf").map(Constraint::EbnfGrammar),
        if kind != Kind::Chat { s("json_schema").map(Constraint::JsonSchema) } else { None },
        // A tool_choice that forces a call (chat).
        if kind == Kind::Chat { super::output::tool_constraint(body).map(Constraint::JsonSchema) } else { None },
    ];
    let mut set = all.into_iter().flatten();
    let first = set.next();
    if set.next().is_some() {
        return Err(bad(
            "400",
            "Only one of regex, ebnf, a JSON response_format and a tool_choice that forces a call may be set",
        ));
    }
    Ok(first)
}

/// A JSON object as a protobuf Struct (SGLang's `custom_params`).
fn to_struct(v: &Value) -> Option<prost_types::Struct> {
    let o = v.as_object()?;
    Some(prost_types::Struct { fields: o.iter().map(|(k, v)| (k.to_string(), to_proto(v))).collect() })
}

fn to_proto(v: &Value) -> prost_types::Value {
    use prost_types::value::Kind as K;
    let kind = match v.get_type() {
        JsonType::Null => K::NullValue(0),
        JsonType::Boolean => K::BoolValue(v.as_bool().unwrap_or(false)),
        JsonType::Number => K::NumberValue(v.as_f64().unwrap_or(0.0)),
        JsonType::String => K::StringValue(v.as_str().unwrap_or("").to_string()),
        JsonType::Array => K::ListValue(prost_types::ListValue {
            values: v.as_array().map(|a| a.iter().map(to_proto).collect()).unwrap_or_default(),
        }),
        JsonType::Object => K::StructValue(to_struct(v).unwrap_or_default()),
    };
    prost_types::Value { kind: Some(kind) }
}
