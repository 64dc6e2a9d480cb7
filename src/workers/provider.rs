//! Cloud providers as workers: which one a URL names, and how each wants its key.
//!
//! A provider is found from the URL's host as SMG does, or named in `POST /workers`
//! (`"provider"`): the facts are smg-wire's (`wire/src/provider.rs`), shared with smg-sim.
//! Here: the key each gets, in its header (OpenAI and xAI `Authorization: Bearer`, Anthropic
//! `x-api-key` with an `anthropic-version`, Gemini `x-goog-api-key`).

/// The `anthropic-version` sent when the caller sent none (the one Anthropic's SDKs send).
const ANTHROPIC_VERSION: &str = "2023-06-01";

pub use smg_wire::provider::Provider;

/// `p`'s key in this process's environment, by the variable the provider's own SDKs read.
pub fn key_from_env(p: Provider) -> Option<String> {
    let var = match p {
        Provider::OpenAi => "OPENAI_API_KEY",
        Provider::Anthropic => "ANTHROPIC_API_KEY",
        Provider::Gemini => "GEMINI_API_KEY",
        Provider::Xai => "XAI_API_KEY",
    };
    std::env::var(var).ok().filter(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_graphic()))
}

/// The request header lines that carry `key` to `p`, in its header. `version_sent`: the
/// caller's own `anthropic-version` is forwarded, so none is added.
pub fn write_key(p: Provider, out: &mut Vec<u8>, key: &[u8], version_sent: bool) {
    out.extend_from_slice(p.key_header().as_bytes());
    out.extend_from_slice(if p.key_header() == "authorization" { b": Bearer " } else { b": " });
    out.extend_from_slice(key);
    if p == Provider::Anthropic && !version_sent {
        out.extend_from_slice(b"\r\nanthropic-version: ");
        out.extend_from_slice(ANTHROPIC_VERSION.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
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
    fn each_provider_gets_the_key_in_its_own_header() {
        let line = |p: Provider, sent: bool| {
            let mut out = Vec::new();
            write_key(p, &mut out, b"K", sent);
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
