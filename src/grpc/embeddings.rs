//! `/v1/embeddings` on a gRPC worker whose model embeds (GetModelInfo's `is_generation:
//! false`, an engine started with `--is-embedding`), without I/O: every input (a string, an
//! array of strings, token ids, or arrays of token ids) becomes one Embed call, and the
//! vectors come back as the OpenAI list, in input order.
//!
//! `encoding_format: "base64"` sends each vector as the base64 of its little-endian f32s, as
//! OpenAI does. `dimensions` keeps a vector's first values and scales them back to unit length
//! (Matryoshka truncation, what vLLM and SGLang do with it); more dimensions than the model
//! has is a 400.

use base64::Engine as _;
use smg_proto::scheduler::{EmbedRequest, EmbedResponse, TokenizedInput};
use smg_wire::json::put_str;
use smg_wire::num::put_dec;
use sonic_rs::{JsonContainerTrait, JsonType, JsonValueTrait, Value};

use super::model::GrpcModel;
use super::refusal::Refusal;

/// The request, model-independent.
#[derive(Debug)]
pub struct Embeddings {
    /// The canonical model, as the answer names it.
    pub model: String,
    inputs: Vec<Input>,
    base64: bool,
    dimensions: Option<usize>,
}

#[derive(Debug)]
enum Input {
    Text(String),
    Ids(Vec<u32>),
}

fn bad(message: impl Into<String>) -> Refusal {
    Refusal::new(400, "invalid_request_error", message)
}

/// The body's `input`, `encoding_format` and `dimensions`.
pub fn read(body: &[u8], model: &str) -> Result<Embeddings, Refusal> {
    let v: Value =
        crate::bounded_json::value(body).map_err(|e| Refusal::new(400, "json_parse_error", e.to_string()))?;
    let input = v.get("input").filter(|i| !i.is_null()).ok_or_else(|| bad("input is required"))?;
    let ids = |x: &Value| -> Option<Vec<u32>> {
        x.as_array()?.iter().map(|n| n.as_u64().and_then(|n| u32::try_from(n).ok())).collect()
    };
    let inputs = match input.get_type() {
        JsonType::String => vec![Input::Text(input.as_str().unwrap_or_default().to_owned())],
        JsonType::Array => {
            let arr = input.as_array().map(|a| a.iter().collect::<Vec<_>>()).unwrap_or_default();
            if arr.is_empty() {
                return Err(bad("input must not be empty"));
            }
            if arr.iter().all(|x| x.is_number()) {
                vec![Input::Ids(ids(input).ok_or_else(|| bad("input token ids must be non-negative integers"))?)]
            } else {
                arr.iter()
                    .map(|x| match x.get_type() {
                        JsonType::String => Ok(Input::Text(x.as_str().unwrap_or_default().to_owned())),
                        JsonType::Array => ids(x)
                            .filter(|i| !i.is_empty())
                            .map(Input::Ids)
                            .ok_or_else(|| bad("each token id array must hold non-negative integers")),
                        _ => Err(bad("each input must be a string or an array of token ids")),
                    })
                    .collect::<Result<_, _>>()?
            }
        }
        _ => return Err(bad("input must be a string, an array of strings, or token ids")),
    };
    if inputs.iter().any(|i| matches!(i, Input::Text(t) if t.is_empty())) {
        return Err(bad("input must not be an empty string"));
    }
    let base64 = match v.get("encoding_format").filter(|f| !f.is_null()) {
        None => false,
        Some(f) => match f.as_str() {
            Some("float") => false,
            Some("base64") => true,
            _ => return Err(bad("encoding_format must be \"float\" or \"base64\"")),
        },
    };
    let dimensions = match v.get("dimensions").filter(|d| !d.is_null()) {
        None => None,
        Some(d) => match d.as_u64().filter(|&n| n > 0) {
            Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            None => return Err(bad("dimensions must be a positive integer")),
        },
    };
    Ok(Embeddings { model: model.to_owned(), inputs, base64, dimensions })
}

impl Embeddings {
    /// Every input's token ids for `model` (strings tokenized as the engine would, with the
    /// model's special tokens).
    pub fn prepare(&self, model: &GrpcModel) -> Result<Vec<Vec<u32>>, Refusal> {
        let mut out = Vec::with_capacity(self.inputs.len());
        for (i, input) in self.inputs.iter().enumerate() {
            let ids = match input {
                Input::Text(t) => {
                    model.tokenizer.encode(t, true).map_err(|e| Refusal::new(500, "tokenization_failed", e))?
                }
                Input::Ids(ids) => ids.clone(),
            };
            super::request::within_window(model, ids.len(), &format!("input {i}"))?;
            out.push(ids);
        }
        Ok(out)
    }
}

pub fn engine_request(ids: &[u32], request_id: String, dp_rank: Option<u32>) -> EmbedRequest {
    EmbedRequest {
        request_id,
        tokenized: Some(TokenizedInput { original_text: String::new(), input_ids: ids.to_vec() }),
        data_parallel_rank: dp_rank.and_then(|r| i32::try_from(r).ok()).unwrap_or(0),
        ..Default::default()
    }
}

/// The OpenAI list from one engine answer per input (in input order), and the prompt tokens
/// it counts; Err: what the request asked cannot be made of the vectors.
pub fn answer(req: &Embeddings, vectors: &[EmbedResponse]) -> Result<(Vec<u8>, u64), Refusal> {
    let mut out = Vec::with_capacity(64 + vectors.iter().map(|v| v.embedding.len() * 12 + 48).sum::<usize>());
    out.extend_from_slice(b"{\"object\":\"list\",\"data\":[");
    let mut tokens = 0u64;
    for (i, v) in vectors.iter().enumerate() {
        tokens += u64::from(v.prompt_tokens);
        let mut values = std::borrow::Cow::Borrowed(v.embedding.as_slice());
        if let Some(d) = req.dimensions {
            if d > values.len() {
                return Err(bad(format!("dimensions is {d}, but the model's embeddings have {}", values.len())));
            }
            values = std::borrow::Cow::Owned(truncated(&values, d));
        }
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"object\":\"embedding\",\"index\":");
        put_dec(&mut out, i as u64);
        out.extend_from_slice(b",\"embedding\":");
        if req.base64 {
            let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
            put_str(&mut out, &base64::engine::general_purpose::STANDARD.encode(bytes));
        } else {
            out.push(b'[');
            for (j, x) in values.iter().enumerate() {
                if j > 0 {
                    out.push(b',');
                }
                put_f32(&mut out, *x);
            }
            out.push(b']');
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"model\":");
    put_str(&mut out, &req.model);
    out.extend_from_slice(b",\"usage\":{\"prompt_tokens\":");
    put_dec(&mut out, tokens);
    out.extend_from_slice(b",\"total_tokens\":");
    put_dec(&mut out, tokens);
    out.extend_from_slice(b"}}");
    Ok((out, tokens))
}

/// The first `d` values, scaled back to unit length (left as they are when all zero).
fn truncated(values: &[f32], d: usize) -> Vec<f32> {
    let head = &values[..d];
    let norm = head.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    if norm == 0.0 || !norm.is_finite() {
        return head.to_vec();
    }
    head.iter().map(|x| (f64::from(*x) / norm) as f32).collect()
}

/// A finite f32 as its shortest round-trip decimal; a non-finite one (no JSON number) as 0.
fn put_f32(out: &mut Vec<u8>, x: f32) {
    use std::io::Write;
    let x = if x.is_finite() { x } else { 0.0 };
    let _ = write!(out, "{x}");
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use smg_loadtest::sim::tokenizer as sim;

    use super::*;
    use crate::tokenizer::Tokenizer;

    fn model() -> GrpcModel {
        let tok = Tokenizer::from_parts(sim::tokenizer_json().as_bytes(), Some(&sim::tokenizer_config_json()), None)
            .expect("the simulator's tokenizer");
        GrpcModel {
            tokenizer: Arc::new(tok),
            max_context: Some(8),
            eos_ids: vec![sim::IM_END_ID],
            supports_vision: false,
            is_generation: false,
            defaults: Default::default(),
            parsers: Default::default(),
            harmony: None,
        }
    }

    fn vectors(n: usize) -> Vec<EmbedResponse> {
        (0..n)
            .map(|i| EmbedResponse { embedding_dim: 3, embedding: vec![3.0, 4.0, i as f32], prompt_tokens: 2 })
            .collect()
    }

    #[test]
    fn every_input_shape_is_one_engine_call_in_order() {
        let m = model();
        let one = read(br#"{"input":"hello world"}"#, "m").unwrap().prepare(&m).unwrap();
        assert_eq!(one, vec![m.tokenizer.encode("hello world", true).unwrap()]);
        let texts = read(br#"{"input":["hello","world"]}"#, "m").unwrap().prepare(&m).unwrap();
        assert_eq!(texts.len(), 2);
        assert_eq!(read(br#"{"input":[5,6,7]}"#, "m").unwrap().prepare(&m).unwrap(), vec![vec![5, 6, 7]]);
        assert_eq!(read(br#"{"input":[[5],[6,7]]}"#, "m").unwrap().prepare(&m).unwrap(), vec![vec![5], vec![6, 7]]);
        let long = read(br#"{"input":[1,2,3,4,5,6,7,8,9]}"#, "m").unwrap().prepare(&m).unwrap_err();
        assert_eq!((long.status, long.code), (400, "context_length_exceeded"));
        let r = engine_request(&[5, 6], "embd-1-0".into(), Some(2));
        assert_eq!((r.tokenized.unwrap().input_ids, r.data_parallel_rank), (vec![5, 6], 2));
    }

    #[test]
    fn malformed_inputs_are_400s() {
        for body in [
            &br#"{"model":"m"}"#[..],
            br#"{"input":[]}"#,
            br#"{"input":""}"#,
            br#"{"input":["a",""]}"#,
            br#"{"input":[-1]}"#,
            br#"{"input":[[]]}"#,
            br#"{"input":{"a":1}}"#,
            br#"{"input":"a","encoding_format":"hex"}"#,
            br#"{"input":"a","dimensions":0}"#,
        ] {
            let e = read(body, "m").unwrap_err();
            assert_eq!(e.status, 400, "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn the_list_keeps_input_order_and_counts_prompt_tokens() {
        let req = read(br#"{"input":["a","b"]}"#, "org/m").unwrap();
        let (body, tokens) = answer(&req, &vectors(2)).unwrap();
        assert_eq!(tokens, 4);
        let v: Value = sonic_rs::from_slice(&body).unwrap();
        assert_eq!(v["object"].as_str(), Some("list"));
        assert_eq!(v["model"].as_str(), Some("org/m"));
        assert_eq!(v["data"][1]["index"].as_u64(), Some(1));
        assert_eq!(v["data"][1]["embedding"][2].as_f64(), Some(1.0));
        assert_eq!((v["usage"]["prompt_tokens"].as_u64(), v["usage"]["total_tokens"].as_u64()), (Some(4), Some(4)));
    }

    #[test]
    fn base64_is_the_little_endian_floats_and_dimensions_truncate_to_unit_length() {
        let req = read(br#"{"input":"a","encoding_format":"base64","dimensions":2}"#, "m").unwrap();
        let (body, _) = answer(&req, &vectors(1)).unwrap();
        let v: Value = sonic_rs::from_slice(&body).unwrap();
        let bytes =
            base64::engine::general_purpose::STANDARD.decode(v["data"][0]["embedding"].as_str().unwrap()).unwrap();
        let floats: Vec<f32> = bytes.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        assert_eq!(floats, [0.6, 0.8]);
        let too_many = read(br#"{"input":"a","dimensions":4}"#, "m").unwrap();
        assert_eq!(answer(&too_many, &vectors(1)).unwrap_err().status, 400);
    }
}
