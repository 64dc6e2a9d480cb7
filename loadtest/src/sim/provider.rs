//! `--provider-keys FILE`: every worker answers as the cloud provider its request's `Host`
//! names (api.openai.com, api.anthropic.com, generativelanguage.googleapis.com, api.x.ai;
//! any other host: OpenAI), so a gateway's provider support can be tested on one box.
//!
//! - Keys: FILE is `{"KEY": {"provider": "openai|anthropic|gemini|xai", "models": [...]}}`.
//!   A request must carry a key of that provider in its style (OpenAI and xAI
//!   `Authorization: Bearer`; Anthropic `x-api-key`; Gemini `x-goog-api-key`), else 401 in the
//!   provider's error shape.
//! - `GET /v1/models` lists that key's models (Anthropic's list shape for Anthropic).
//! - An inference request for a model the key does not list: 404 in the provider's shape;
//!   one with a self-hosted engine's field (`top_k`, `min_p`, …): 400, as OpenAI refuses an
//!   argument it does not know.
//! - `POST /v1/responses` (OpenAI and xAI hosts; Anthropic and Gemini: 404 in their shape):
//!   OpenAI's Responses API from a provider that keeps no state, its answer echoing the whole
//!   input it was sent, after the same key and model checks as chat (provider_responses.rs).
//! - `/sim/control {"provider_fail": 401|429, "retry_after": N}`: every provider request is
//!   answered that way (429 with `Retry-After: N`); `{"provider_fail": null}` ends it.
//!
//! The simulator's own routes (`/sim/*`, `/health`) are not checked.

use std::collections::HashMap;

use sonic_rs::{JsonContainerTrait, JsonValueTrait};

use crate::sim::render::{put_json_str, put_response};

pub use smg_wire::provider::Provider;

/// The provider a request's `Host` names; any other host is answered as OpenAI.
pub fn of_host(host: &[u8]) -> Provider {
    std::str::from_utf8(host).ok().and_then(Provider::of_host).unwrap_or(Provider::OpenAi)
}

/// The `request_log::HEADERS` index of the header `p`'s key travels in.
fn key_index(p: Provider) -> usize {
    crate::sim::request_log::HEADERS.iter().position(|h| *h == p.key_header()).unwrap_or(1)
}

/// `p`'s error body for `status`, in its own shape.
fn error_body(p: Provider, status: u16, message: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(160);
    match p {
        Provider::Anthropic => {
            let kind = match status {
                401 => "authentication_error",
                404 => "not_found_error",
                429 => "rate_limit_error",
                _ => "api_error",
            };
            b.extend_from_slice(
                format!("{{\"type\":\"error\",\"error\":{{\"type\":\"{kind}\",\"message\":").as_bytes(),
            );
            put_json_str(&mut b, message);
            b.extend_from_slice(b"}}");
        }
        Provider::Gemini => {
            let st = match status {
                401 => "UNAUTHENTICATED",
                404 => "NOT_FOUND",
                429 => "RESOURCE_EXHAUSTED",
                _ => "INTERNAL",
            };
            b.extend_from_slice(format!("{{\"error\":{{\"code\":{status},\"message\":").as_bytes());
            put_json_str(&mut b, message);
            b.extend_from_slice(format!(",\"status\":\"{st}\"}}}}").as_bytes());
        }
        Provider::OpenAi | Provider::Xai => {
            let code = match status {
                400 => "null",
                401 => "\"invalid_api_key\"",
                404 => "\"model_not_found\"",
                429 => "\"rate_limit_exceeded\"",
                _ => "\"server_error\"",
            };
            b.extend_from_slice(b"{\"error\":{\"message\":");
            put_json_str(&mut b, message);
            b.extend_from_slice(
                format!(",\"type\":\"invalid_request_error\",\"param\":null,\"code\":{code}}}}}").as_bytes(),
            );
        }
    }
    b
}

/// Self-hosted engines' request fields a provider refuses (a sample of SGLang's).
const ENGINE_ONLY: [&str; 10] = [
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "regex",
    "ebnf",
    "ignore_eos",
    "stop_token_ids",
    "lora_path",
    "chat_template_kwargs",
];

#[derive(Debug, Clone)]
pub struct KeyInfo {
    pub provider: Provider,
    pub models: Vec<String>,
}

/// The keys of `--provider-keys`.
#[derive(Debug, Clone, Default)]
pub struct ProviderKeys(pub HashMap<String, KeyInfo>);

impl ProviderKeys {
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("--provider-keys {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("--provider-keys {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let v: sonic_rs::Value = sonic_rs::from_str(text).map_err(|e| e.to_string())?;
        let obj = v.as_object().ok_or("expected an object of keys")?;
        let mut keys = HashMap::new();
        for (k, info) in obj.iter() {
            let provider = info["provider"]
                .as_str()
                .and_then(|p| Provider::parse(p).filter(|q| q.name() == p))
                .ok_or_else(|| format!("key {k:?}: provider must be openai, anthropic, gemini or xai"))?;
            let models = info["models"]
                .as_array()
                .map(|a| a.iter().filter_map(|m| m.as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            keys.insert(k.to_string(), KeyInfo { provider, models });
        }
        Ok(ProviderKeys(keys))
    }
}

/// A failure every provider request gets (`/sim/control` `provider_fail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderFail {
    pub status: u16,
    pub retry_after: Option<u64>,
}

/// What the request is, for the check.
pub enum Ask<'a> {
    Models,
    /// An inference request's body.
    Infer(&'a [u8]),
    /// `POST /v1/responses`'s body: OpenAI's and xAI's, checked as `Infer`; other providers
    /// have no such route.
    Responses(&'a [u8]),
    Other,
}

/// Answers the request as the provider would when it is refused or is `/v1/models`: writes the
/// reply to `out` and returns true. False: the worker serves it as usual.
#[allow(clippy::too_many_arguments)] // the request's parts, as the connection loop has them
pub fn answer<'h>(
    keys: &ProviderKeys,
    fail: Option<ProviderFail>,
    host: &[u8],
    header: impl Fn(usize) -> Option<&'h [u8]>,
    ask: Ask<'_>,
    keep_alive: bool,
    extra: &[u8],
    out: &mut Vec<u8>,
) -> bool {
    let p = of_host(host);
    let reply = |out: &mut Vec<u8>, status: u16, message: &str, more: &[u8]| {
        let mut ex = extra.to_vec();
        ex.extend_from_slice(more);
        put_response(out, status, "application/json", &error_body(p, status, message), keep_alive, &ex);
        true
    };
    if let Some(f) = fail {
        let more = f.retry_after.map(|s| format!("retry-after: {s}\r\n").into_bytes()).unwrap_or_default();
        return reply(out, f.status, "simulated provider failure", &more);
    }
    let sent = header(key_index(p)).map(|v| {
        let v = v.trim_ascii();
        if p.key_header() == "authorization" {
            v.strip_prefix(b"Bearer ").unwrap_or(v)
        } else {
            v
        }
    });
    let info = sent.and_then(|k| std::str::from_utf8(k).ok()).and_then(|k| keys.0.get(k)).filter(|i| i.provider == p);
    let Some(info) = info else {
        return reply(out, 401, "invalid API key", b"");
    };
    match ask {
        Ask::Models => {
            put_response(out, 200, "application/json", &models_body(p, &info.models), keep_alive, extra);
            true
        }
        Ask::Responses(_) if matches!(p, Provider::Anthropic | Provider::Gemini) => reply(out, 404, "Not Found", b""),
        Ask::Infer(body) | Ask::Responses(body) => {
            // As OpenAI does, a field the API does not know is refused (SGLang's extensions).
            if let Some(f) = ENGINE_ONLY.iter().find(|f| sonic_rs::get(body, [**f]).is_ok()) {
                return reply(out, 400, &format!("Unrecognized request argument supplied: {f}"), b"");
            }
            let model = sonic_rs::get(body, &["model"]).ok().and_then(|m| m.as_str().map(str::to_string));
            match model {
                Some(m) if info.models.contains(&m) => false,
                Some(m) => {
                    reply(out, 404, &format!("The model `{m}` does not exist or you do not have access to it."), b"")
                }
                None => false,
            }
        }
        Ask::Other => false,
    }
}

fn models_body(p: Provider, models: &[String]) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + models.len() * 96);
    match p {
        Provider::Anthropic => {
            b.extend_from_slice(b"{\"data\":[");
            for (i, m) in models.iter().enumerate() {
                if i > 0 {
                    b.push(b',');
                }
                b.extend_from_slice(b"{\"type\":\"model\",\"id\":");
                put_json_str(&mut b, m);
                b.extend_from_slice(b",\"display_name\":");
                put_json_str(&mut b, m);
                b.extend_from_slice(b",\"created_at\":\"2025-01-01T00:00:00Z\"}");
            }
            b.extend_from_slice(b"],\"has_more\":false,\"first_id\":");
            match models.first() {
                Some(m) => put_json_str(&mut b, m),
                None => b.extend_from_slice(b"null"),
            }
            b.extend_from_slice(b",\"last_id\":");
            match models.last() {
                Some(m) => put_json_str(&mut b, m),
                None => b.extend_from_slice(b"null"),
            }
            b.push(b'}');
        }
        _ => {
            let owner = match p {
                Provider::Gemini => "google",
                Provider::Xai => "xai",
                _ => "openai",
            };
            b.extend_from_slice(b"{\"object\":\"list\",\"data\":[");
            for (i, m) in models.iter().enumerate() {
                if i > 0 {
                    b.push(b',');
                }
                b.extend_from_slice(b"{\"id\":");
                put_json_str(&mut b, m);
                b.extend_from_slice(
                    format!(",\"object\":\"model\",\"created\":1735689600,\"owned_by\":\"{owner}\"}}").as_bytes(),
                );
            }
            b.extend_from_slice(b"]}");
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> ProviderKeys {
        ProviderKeys::parse(
            r#"{"sk-o":{"provider":"openai","models":["gpt-4o"]},"sk-a":{"provider":"anthropic","models":["claude-x"]}}"#,
        )
        .unwrap()
    }

    fn ask(host: &str, h: &[(usize, &'static str)], a: Ask<'_>, fail: Option<ProviderFail>) -> Option<String> {
        let mut out = Vec::new();
        let lookup = |i: usize| h.iter().find(|x| x.0 == i).map(|x| x.1.as_bytes());
        answer(&keys(), fail, host.as_bytes(), lookup, a, true, b"", &mut out)
            .then(|| String::from_utf8_lossy(&out).into_owned())
    }

    #[test]
    fn keys_in_each_providers_style() {
        let r = ask("api.openai.com", &[(1, "Bearer sk-o")], Ask::Models, None).unwrap();
        assert!(r.starts_with("HTTP/1.1 200") && r.contains(r#""id":"gpt-4o""#) && r.contains("owned_by"), "{r}");
        let r = ask("api.anthropic.com:443", &[(2, "sk-a")], Ask::Models, None).unwrap();
        assert!(r.contains(r#""type":"model","id":"claude-x""#) && r.contains("has_more"), "{r}");
        // The right key in the wrong style, or another provider's key: 401 in the host's shape.
        let r = ask("api.anthropic.com", &[(1, "Bearer sk-a")], Ask::Models, None).unwrap();
        assert!(r.starts_with("HTTP/1.1 401") && r.contains("authentication_error"), "{r}");
        let r = ask("api.openai.com", &[(1, "Bearer sk-a")], Ask::Models, None).unwrap();
        assert!(r.starts_with("HTTP/1.1 401") && r.contains("invalid_api_key"), "{r}");
        let r = ask("generativelanguage.googleapis.com", &[], Ask::Other, None).unwrap();
        assert!(r.contains("UNAUTHENTICATED"), "{r}");
        // A listed model goes on to the worker; another is a 404.
        assert!(ask("api.openai.com", &[(1, "Bearer sk-o")], Ask::Infer(br#"{"model":"gpt-4o"}"#), None).is_none());
        let r = ask("api.openai.com", &[(1, "Bearer sk-o")], Ask::Infer(br#"{"model":"gpt-5"}"#), None).unwrap();
        assert!(r.starts_with("HTTP/1.1 404") && r.contains("model_not_found"), "{r}");
    }

    #[test]
    fn responses_is_openais_route() {
        let body = Ask::Responses(br#"{"model":"gpt-4o","input":"hi"}"#);
        assert!(ask("api.openai.com", &[(1, "Bearer sk-o")], body, None).is_none(), "on to provider_responses");
        let r = ask("api.openai.com", &[(1, "Bearer sk-o")], Ask::Responses(br#"{"model":"gpt-5"}"#), None).unwrap();
        assert!(r.starts_with("HTTP/1.1 404") && r.contains("model_not_found"), "{r}");
        let r = ask("api.openai.com", &[(1, "Bearer sk-o")], Ask::Responses(br#"{"top_k":1}"#), None).unwrap();
        assert!(r.starts_with("HTTP/1.1 400") && r.contains("top_k"), "{r}");
        let r = ask("api.openai.com", &[], Ask::Responses(b"{}"), None).unwrap();
        assert!(r.starts_with("HTTP/1.1 401"), "{r}");
        let r = ask("api.anthropic.com", &[(2, "sk-a")], Ask::Responses(br#"{"model":"claude-x"}"#), None).unwrap();
        assert!(r.starts_with("HTTP/1.1 404") && r.contains("not_found_error"), "{r}");
        let fail = Some(ProviderFail { status: 401, retry_after: None });
        let r = ask("api.openai.com", &[(1, "Bearer sk-o")], Ask::Responses(b"{}"), fail).unwrap();
        assert!(r.starts_with("HTTP/1.1 401"), "{r}");
    }

    #[test]
    fn a_failure_mode_answers_everything() {
        let fail = Some(ProviderFail { status: 429, retry_after: Some(7) });
        let r = ask("api.x.ai", &[(1, "Bearer sk-o")], Ask::Models, fail).unwrap();
        assert!(r.starts_with("HTTP/1.1 429") && r.to_ascii_lowercase().contains("retry-after: 7\r\n"), "{r}");
        assert!(r.contains("rate_limit_exceeded"), "{r}");
    }
}
