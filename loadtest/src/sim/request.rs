//! Reads the few fields of an inference request the simulator acts on, in one lazy pass over the top-level keys.
//!
//! The prompt is taken as its raw JSON text (`messages`, `prompt`, `text`, `input_ids`,
//! `input`): no unescaping or allocation, and the same conversation prefix gives the same bytes,
//! which is all the prefix cache needs.

use std::borrow::Cow;

use sonic_rs::JsonValueTrait;

/// Inference endpoint families.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
    /// SGLang native `/generate`.
    Generate,
    Embeddings,
    /// Anthropic's `/v1/messages` (`--provider-keys` workers play Anthropic with it).
    Messages,
}

/// What the simulator needs from a request body.
#[derive(Debug, PartialEq, Eq)]
pub struct GenRequest<'a> {
    pub stream: bool,
    pub include_usage: bool,
    pub max_tokens: Option<u64>,
    pub prompt: Cow<'a, str>,
    /// Top-level "data_parallel_rank" (SGLang's DP routing field); null or absent is None.
    /// Signed so that a negative rank reaches the range check and gets its 400 there.
    pub dp_rank: Option<i64>,
    /// `/generate`'s "return_logprob" (a batch's list: its first entry).
    pub return_logprob: bool,
    /// `/generate`'s "logprob_start_len"; null or absent is None (SGLang's default, -1).
    pub logprob_start_len: Option<i64>,
}

/// Parses `body`; the error text goes into a 400 response.
pub fn parse(api: Api, body: &[u8]) -> Result<GenRequest<'_>, String> {
    let mut req = GenRequest {
        stream: false,
        include_usage: false,
        max_tokens: None,
        prompt: Cow::Borrowed(""),
        dp_rank: None,
        return_logprob: false,
        logprob_start_len: None,
    };
    let mut max_completion_tokens = None;
    let mut seen_any = false;
    for entry in sonic_rs::to_object_iter(body) {
        let (key, value) = entry.map_err(|e| format!("invalid JSON body: {e}"))?;
        seen_any = true;
        match (api, key.as_ref()) {
            (_, "data_parallel_rank") if !value.is_null() => {
                req.dp_rank = Some(value.as_i64().ok_or("data_parallel_rank must be an integer")?);
            }
            (_, "stream") => req.stream = value.as_bool().unwrap_or(false),
            (_, "stream_options") => {
                req.include_usage = sonic_rs::get(value.as_raw_str(), ["include_usage"])
                    .ok()
                    .and_then(|v| v.as_bool())
                    .unwrap_or(false);
            }
            (Api::Chat | Api::Completions | Api::Messages, "max_tokens") => req.max_tokens = value.as_u64(),
            (Api::Chat, "max_completion_tokens") => max_completion_tokens = value.as_u64(),
            (Api::Generate, "return_logprob") => {
                req.return_logprob =
                    value.as_bool().or_else(|| value.get(0).and_then(|v| v.as_bool())).unwrap_or(false);
            }
            (Api::Generate, "logprob_start_len") if !value.is_null() => {
                let v = value.as_i64().or_else(|| value.get(0).and_then(|v| v.as_i64()));
                req.logprob_start_len = Some(v.ok_or("logprob_start_len must be an integer")?);
            }
            (Api::Generate, "sampling_params") => {
                req.max_tokens = sonic_rs::get(value.as_raw_str(), ["max_new_tokens"]).ok().and_then(|v| v.as_u64());
            }
            (Api::Chat | Api::Messages, "messages")
            | (Api::Completions, "prompt")
            | (Api::Generate, "text" | "input_ids")
            | (Api::Embeddings, "input") => req.prompt = value.as_raw_cow(),
            _ => {}
        }
    }
    if !seen_any && sonic_rs::from_slice::<sonic_rs::Value>(body).map_or(true, |v| !v.is_object()) {
        return Err("request body must be a JSON object".into());
    }
    // OpenAI's newer name wins over the deprecated one.
    if max_completion_tokens.is_some() {
        req.max_tokens = max_completion_tokens;
    }
    if api == Api::Embeddings {
        req.stream = false;
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_fields_in_any_order() {
        let body = br#"{"messages":[{"role":"user","content":"hi \"x\""}],"stream":true,
            "stream_options":{"include_usage":true},"max_tokens":7,"model":"m"}"#;
        let r = parse(Api::Chat, body).unwrap();
        assert!(r.stream && r.include_usage);
        assert_eq!(r.max_tokens, Some(7));
        assert_eq!(r.prompt, r#"[{"role":"user","content":"hi \"x\""}]"#);
        let body = br#"{"model":"m","max_tokens":7,"max_completion_tokens":3,"messages":[]}"#;
        let r = parse(Api::Chat, body).unwrap();
        assert_eq!(r.max_tokens, Some(3));
        assert!(!r.stream);
    }

    #[test]
    fn generate_and_embeddings() {
        let r =
            parse(Api::Generate, br#"{"text":"abc","sampling_params":{"max_new_tokens":9,"temperature":0}}"#).unwrap();
        assert_eq!((r.max_tokens, r.prompt.as_ref()), (Some(9), "\"abc\""));
        assert!(!r.return_logprob && r.logprob_start_len.is_none());
        let r = parse(Api::Generate, br#"{"text":"a","return_logprob":true,"logprob_start_len":2}"#).unwrap();
        assert_eq!((r.return_logprob, r.logprob_start_len), (true, Some(2)));
        let r = parse(Api::Generate, br#"{"text":["a"],"return_logprob":[true],"logprob_start_len":null}"#).unwrap();
        assert_eq!((r.return_logprob, r.logprob_start_len), (true, None));
        assert!(parse(Api::Generate, br#"{"text":"a","logprob_start_len":"0"}"#).is_err());
        // Not /generate's: ignored elsewhere.
        assert!(!parse(Api::Completions, br#"{"prompt":"p","return_logprob":true}"#).unwrap().return_logprob);
        let r = parse(Api::Embeddings, br#"{"input":"abc","stream":true}"#).unwrap();
        assert!(!r.stream);
        let r = parse(Api::Completions, br#"{"prompt":"p","max_tokens":2}"#).unwrap();
        assert_eq!(r.max_tokens, Some(2));
    }

    #[test]
    fn data_parallel_rank() {
        let r = parse(Api::Chat, br#"{"messages":[],"data_parallel_rank":3}"#).unwrap();
        assert_eq!(r.dp_rank, Some(3));
        assert_eq!(parse(Api::Generate, br#"{"text":"a","data_parallel_rank":-1}"#).unwrap().dp_rank, Some(-1));
        assert_eq!(parse(Api::Chat, br#"{"data_parallel_rank":null}"#).unwrap().dp_rank, None);
        assert_eq!(parse(Api::Chat, br#"{"messages":[]}"#).unwrap().dp_rank, None);
        assert!(parse(Api::Chat, br#"{"data_parallel_rank":"0"}"#).is_err());
        assert!(parse(Api::Chat, br#"{"data_parallel_rank":1.5}"#).is_err());
    }

    #[test]
    fn rejects_non_objects() {
        assert!(parse(Api::Chat, b"").is_err());
        assert!(parse(Api::Chat, b"[1]").is_err());
        assert!(parse(Api::Chat, br#"{"messages": [1,"#).is_err());
        assert!(parse(Api::Chat, b"{}").is_ok());
    }
}
