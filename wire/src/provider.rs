//! The cloud providers' facts both sides need: which provider a host is (as SMG finds it),
//! their names, and the header each takes its API key in. The gateway routes and keys
//! requests by them (`src/workers/provider.rs`); smg-sim plays the providers by them.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    OpenAi,
    Anthropic,
    Gemini,
    Xai,
}

impl Provider {
    /// The provider a host belongs to, if any: a host ending in `openai.com`,
    /// `anthropic.com`, `googleapis.com` or `x.ai` (whole labels; case and a trailing dot
    /// ignored; a `:port` aside).
    pub fn of_host(host: &str) -> Option<Provider> {
        let host = match host.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') && p.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => host,
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let under = |domain: &str| {
            host == domain
                || (host.len() > domain.len()
                    && host.ends_with(domain)
                    && host.as_bytes()[host.len() - domain.len() - 1] == b'.')
        };
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

    /// The name in `owned_by` and in `GET /workers`.
    pub fn name(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
            Provider::Gemini => "gemini",
            Provider::Xai => "xai",
        }
    }

    /// The request header its API key travels in (lowercase): `authorization` (as `Bearer
    /// KEY`) for OpenAI and xAI, `x-api-key` for Anthropic, `x-goog-api-key` for Gemini.
    pub fn key_header(self) -> &'static str {
        match self {
            Provider::OpenAi | Provider::Xai => "authorization",
            Provider::Anthropic => "x-api-key",
            Provider::Gemini => "x-goog-api-key",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn providers_by_host_and_name() {
        assert_eq!(Provider::of_host("api.openai.com"), Some(Provider::OpenAi));
        assert_eq!(Provider::of_host("API.Anthropic.com."), Some(Provider::Anthropic));
        assert_eq!(Provider::of_host("api.anthropic.com:443"), Some(Provider::Anthropic));
        assert_eq!(Provider::of_host("generativelanguage.googleapis.com"), Some(Provider::Gemini));
        assert_eq!(Provider::of_host("api.x.ai"), Some(Provider::Xai));
        // Whole labels: notopenai.com is not OpenAI's.
        assert_eq!(Provider::of_host("notopenai.com"), None);
        assert_eq!(Provider::of_host("127.0.0.1:8080"), None);
        assert_eq!(Provider::parse("Claude"), Some(Provider::Anthropic));
        assert_eq!(Provider::parse("sglang"), None);
        assert_eq!(Provider::Gemini.key_header(), "x-goog-api-key");
    }
}
