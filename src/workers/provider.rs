//! Cloud providers as workers: which one a URL names, and how each wants its key.
//!
//! A provider is found from the URL's host as SMG does (a host ending in `openai.com`,
//! `anthropic.com`, `googleapis.com` or `x.ai`), or named in `POST /workers` (`"provider"`).
//! Each has its own key header: OpenAI and xAI `Authorization: Bearer`, Anthropic `x-api-key`
//! with an `anthropic-version`, Gemini `x-goog-api-key`.

/// The `anthropic-version` sent when the caller sent none (the one Anthropic's SDKs send).
const ANTHROPIC_VERSION: &str = "2023-06-01";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    OpenAi,
    Anthropic,
    Gemini,
    Xai,
}

impl Provider {
    /// The provider a host belongs to, if any (case-insensitive; a trailing dot ignored).
    pub fn of_host(host: &str) -> Option<Provider> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let under = |domain: &str| host == domain || host.ends_with(&format!(".{domain}"));
        if under("openai.com") {
            Some(Provider::OpenAi)
        } else if under("anthropic.com") {
            Some(Provider::Anthropic)
        } else if under("googleapis.com") {
            Some(Provider::Gemini)
        } else if under("x.ai") {
            Some(Provider::Xai)
        } else {
            None
        }
    }

    /// By name, as `POST /workers` and SMG's `--backend` spell them.
    pub fn parse(name: &str) -> Option<Provider> {
        match name.to_ascii_lowercase().as_str() {
            "openai" => Some(Provider::OpenAi),
            "anthropic" | "claude" => Some(Provider::Anthropic),
            "gemini" | "google" => Some(Provider::Gemini),
            "xai" | "grok" => Some(Provider::Xai),
            _ => None,
        }
    }

    /// The key in this process's environment, by the variable the provider's own SDKs read.
    pub fn key_from_env(self) -> Option<String> {
        let var = match self {
            Provider::OpenAi => "OPENAI_API_KEY",
            Provider::Anthropic => "ANTHROPIC_API_KEY",
            Provider::Gemini => "GEMINI_API_KEY",
            Provider::Xai => "XAI_API_KEY",
        };
        std::env::var(var).ok().filter(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_graphic()))
    }

    /// The name in `owned_by` and in `GET /workers`.
    pub fn name(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
            Provider::Gemini => "gemini",
            Provider::Xai => "xai",
        }
    }

    /// The request header lines that carry `key` in this provider's style. `version_sent`:
    /// the caller's own `anthropic-version` is forwarded, so none is added.
    pub fn write_key(self, out: &mut Vec<u8>, key: &[u8], version_sent: bool) {
        match self {
            Provider::OpenAi | Provider::Xai => {
                out.extend_from_slice(b"authorization: Bearer ");
                out.extend_from_slice(key);
            }
            Provider::Anthropic => {
                out.extend_from_slice(b"x-api-key: ");
                out.extend_from_slice(key);
                if !version_sent {
                    out.extend_from_slice(b"\r\nanthropic-version: ");
                    out.extend_from_slice(ANTHROPIC_VERSION.as_bytes());
                }
            }
            Provider::Gemini => {
                out.extend_from_slice(b"x-goog-api-key: ");
                out.extend_from_slice(key);
            }
        }
        out.extend_from_slice(b"\r\n");
    }
}

/// The key in an `Authorization` value: what follows `Bearer ` (any case), else the value.
pub fn bearer(value: &[u8]) -> &[u8] {
    let v = value.trim_ascii();
    match v.get(..7) {
        Some(p) if p.eq_ignore_ascii_case(b"bearer ") => v[7..].trim_ascii_start(),
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn providers_by_host_and_name() {
        assert_eq!(Provider::of_host("api.openai.com"), Some(Provider::OpenAi));
        assert_eq!(Provider::of_host("API.Anthropic.com."), Some(Provider::Anthropic));
        assert_eq!(Provider::of_host("generativelanguage.googleapis.com"), Some(Provider::Gemini));
        assert_eq!(Provider::of_host("api.x.ai"), Some(Provider::Xai));
        // Not a suffix match on the bare string: notopenai.com is not OpenAI's.
        assert_eq!(Provider::of_host("notopenai.com"), None);
        assert_eq!(Provider::of_host("127.0.0.1"), None);
        assert_eq!(Provider::parse("Claude"), Some(Provider::Anthropic));
        assert_eq!(Provider::parse("sglang"), None);
    }

    #[test]
    fn each_provider_gets_the_key_in_its_own_header() {
        let line = |p: Provider, sent: bool| {
            let mut out = Vec::new();
            p.write_key(&mut out, b"K", sent);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(line(Provider::OpenAi, false), "authorization: Bearer K\r\n");
        assert_eq!(line(Provider::Xai, false), "authorization: Bearer K\r\n");
        assert_eq!(line(Provider::Anthropic, false), "x-api-key: K\r\nanthropic-version: 2023-06-01\r\n");
        assert_eq!(line(Provider::Anthropic, true), "x-api-key: K\r\n");
        assert_eq!(line(Provider::Gemini, false), "x-goog-api-key: K\r\n");
        assert_eq!(bearer(b"Bearer sk-1 "), b"sk-1");
        assert_eq!(bearer(b"bearer  sk-1"), b"sk-1");
        assert_eq!(bearer(b"sk-1"), b"sk-1");
    }
}
