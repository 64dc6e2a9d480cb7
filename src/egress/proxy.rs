//! The proxy between this host and the internet, as every HTTP client finds it:
//! `https_proxy`/`HTTPS_PROXY` (an `http://[user:pass@]host[:port]` proxy that tunnels with
//! CONNECT) and `no_proxy`/`NO_PROXY` (hosts reached directly: `*`, a name and its
//! subdomains, with or without a leading `.`, or an address).

use base64::Engine as _;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyConfig {
    /// The proxy's `host:port`, and its `Proxy-Authorization` value when it has credentials.
    proxy: Option<(String, Option<String>)>,
    /// `no_proxy`'s entries, lowercase, without a leading `.` or `*.`.
    bypass: Vec<String>,
    /// A `no_proxy` of `*`.
    bypass_all: bool,
}

impl ProxyConfig {
    /// From this process's environment (the lowercase names first, as curl reads them).
    pub fn from_env() -> Result<ProxyConfig, String> {
        let var = |a: &str, b: &str| std::env::var(a).ok().or_else(|| std::env::var(b).ok()).filter(|v| !v.is_empty());
        ProxyConfig::parse(var("https_proxy", "HTTPS_PROXY").as_deref(), var("no_proxy", "NO_PROXY").as_deref())
    }

    pub fn parse(proxy: Option<&str>, no_proxy: Option<&str>) -> Result<ProxyConfig, String> {
        let proxy = match proxy {
            None => None,
            Some(p) => Some(proxy_url(p).map_err(|e| format!("HTTPS_PROXY '{}': {e}", redacted(p)))?),
        };
        let mut cfg = ProxyConfig { proxy, ..ProxyConfig::default() };
        for entry in no_proxy.unwrap_or("").split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if entry == "*" {
                cfg.bypass_all = true;
            } else {
                let e = entry.trim_start_matches("*.").trim_start_matches('.');
                // A port in an entry is not matched on: the host decides.
                let e = match e.rsplit_once(':') {
                    Some((h, p)) if !h.contains(':') && p.bytes().all(|b| b.is_ascii_digit()) => h,
                    _ => e,
                };
                cfg.bypass.push(e.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase());
            }
        }
        Ok(cfg)
    }

    /// The proxy to tunnel through to `host` (its `host:port`, and `Proxy-Authorization`),
    /// or None to connect directly.
    pub fn for_host(&self, host: &str) -> Option<(&str, Option<&str>)> {
        let (addr, auth) = self.proxy.as_ref()?;
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let bypassed = self.bypass_all
            || self.bypass.iter().any(|b| {
                host == *b
                    || (host.len() > b.len()
                        && host.ends_with(b.as_str())
                        && host.as_bytes()[host.len() - b.len() - 1] == b'.')
            });
        (!bypassed).then_some((addr.as_str(), auth.as_deref()))
    }
}

/// `http://[user:pass@]host[:port][/]` → (`host:port`, `Basic …`).
fn proxy_url(raw: &str) -> Result<(String, Option<String>), &'static str> {
    let rest = match raw.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
        Some(_) => return Err("only http:// proxies are supported"),
        None => raw,
    };
    let rest = rest.trim_end_matches('/');
    if rest.contains('/') {
        return Err("a proxy URL has no path");
    }
    let (creds, hostport) = match rest.rsplit_once('@') {
        Some((c, h)) => (Some(c), h),
        None => (None, rest),
    };
    if hostport.is_empty() || hostport.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err("expected http://host[:port]");
    }
    let has_port = hostport
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.ends_with(':') && p.bytes().all(|b| b.is_ascii_digit()) && !p.is_empty())
        && !hostport.ends_with(']');
    let hostport = if has_port { hostport.to_string() } else { format!("{hostport}:80") };
    let auth = creds.map(|c| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(percent_decoded(c))));
    Ok((hostport, auth))
}

/// `%XX` escapes in a URL's user info, decoded (a password may hold `@` or `:`).
fn percent_decoded(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// A proxy URL for an error message: credentials left out.
fn redacted(raw: &str) -> String {
    match (raw.split_once("://"), raw.rsplit_once('@')) {
        (Some((scheme, _)), Some((_, host))) => format!("{scheme}://…@{host}"),
        (None, Some((_, host))) => format!("…@{host}"),
        _ => raw.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxies_and_their_exceptions() {
        let none = ProxyConfig::parse(None, Some("*")).unwrap();
        assert_eq!(none.for_host("api.openai.com"), None);
        let p = ProxyConfig::parse(
            Some("http://127.0.0.1:3128/"),
            Some("localhost, .internal.example,10.0.0.5:443,*.corp"),
        )
        .unwrap();
        assert_eq!(p.for_host("api.openai.com"), Some(("127.0.0.1:3128", None)));
        for direct in ["localhost", "a.internal.example", "internal.example", "10.0.0.5", "x.corp", "CORP."] {
            assert_eq!(p.for_host(direct), None, "{direct}");
        }
        // A suffix is matched on a dot: notcorp is not under corp.
        assert!(p.for_host("notcorp").is_some());
        let all = ProxyConfig::parse(Some("proxy:8080"), Some("*")).unwrap();
        assert_eq!(all.for_host("api.openai.com"), None);
        let bare = ProxyConfig::parse(Some("proxy"), None).unwrap();
        assert_eq!(bare.for_host("api.x.ai"), Some(("proxy:80", None)));
    }

    #[test]
    fn credentials_become_basic_auth_and_stay_out_of_errors() {
        let p = ProxyConfig::parse(Some("http://u%40x:p%3Aw@proxy:3128"), None).unwrap();
        let want = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("u@x:p:w"));
        assert_eq!(p.for_host("api.openai.com"), Some(("proxy:3128", Some(want.as_str()))));
        let e = ProxyConfig::parse(Some("https://user:secret@proxy:3128"), None).unwrap_err();
        assert!(e.contains("only http://") && !e.contains("secret"), "{e}");
        assert!(ProxyConfig::parse(Some("http://proxy:1/x"), None).is_err());
    }
}
