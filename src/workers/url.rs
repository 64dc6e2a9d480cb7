//! How a worker is named: its stable id, and its URL as given on the command line.

use std::net::{SocketAddr, ToSocketAddrs};

use super::provider::Provider;
use crate::egress::Origin;
pub use crate::worker_id::WorkerId;

/// A worker as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerUrl {
    /// The registered URL (as given, without a trailing slash): the value of
    /// `x-smg-routed-worker-id`.
    pub url: String,
    /// `host:port` for the Host header.
    pub authority: String,
    pub addr: SocketAddr,
    /// `grpc://`: SGLang's scheduler protocol (token ids in, token ids out) instead of HTTP.
    pub grpc: bool,
    /// `https://`: reached over TLS, which the egress thread originates (`egress/`). `addr` is
    /// then the egress's loopback port for this origin, set when the fleet registers the
    /// worker (unspecified until then: the host is not resolved here, a proxy may be the only
    /// way to it).
    pub tls: Option<Origin>,
    /// The cloud provider its host belongs to (`https://` URLs only).
    pub provider: Option<Provider>,
}

// === impl WorkerUrl ===

impl WorkerUrl {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let url = raw.trim_end_matches('/');
        let (rest, scheme) = match url.split_once("://") {
            Some((s @ ("http" | "grpc" | "https"), r)) => (r, s),
            _ => return Err(format!("'{raw}': only http://, https:// and grpc:// worker URLs are supported")),
        };
        // The authority goes into Host headers: no byte that could end or split a line.
        if rest.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            return Err(format!("'{}': control characters or spaces in a worker URL", raw.escape_debug()));
        }
        if rest.is_empty() || rest.contains('/') || rest.contains('@') {
            return Err(format!("'{raw}': expected {scheme}://host[:port]"));
        }
        let explicit_port = rest.starts_with('[')
            || rest.rsplit_once(':').is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if scheme == "https" {
            let (host, port) = match rest.rsplit_once(':').filter(|_| explicit_port && !rest.ends_with(']')) {
                Some((h, p)) => (h, p.parse::<u16>().map_err(|_| format!("'{raw}': bad port"))?),
                None => (rest, 443),
            };
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if host.is_empty() {
                return Err(format!("'{raw}': expected https://host[:port]"));
            }
            return Ok(Self {
                url: url.to_string(),
                authority: rest.to_string(),
                addr: SocketAddr::from(([0, 0, 0, 0], 0)),
                grpc: false,
                tls: Some(Origin { host: host.to_string(), port }),
                provider: Provider::of_host(host),
            });
        }
        let authority = if explicit_port { rest.to_string() } else { format!("{rest}:80") };
        let addr = authority
            .to_socket_addrs()
            .map_err(|e| format!("'{raw}': cannot resolve: {e}"))?
            .next()
            .ok_or_else(|| format!("'{raw}': no address"))?;
        Ok(Self {
            url: url.to_string(),
            authority: rest.to_string(),
            addr,
            grpc: scheme == "grpc",
            tls: None,
            provider: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_worker_urls() {
        let w = WorkerUrl::parse("http://127.0.0.1:8000/").unwrap();
        assert_eq!(w.url, "http://127.0.0.1:8000");
        assert_eq!(w.addr.port(), 8000);
        assert_eq!(w.authority, "127.0.0.1:8000");
        assert_eq!(WorkerUrl::parse("http://127.0.0.1").unwrap().addr.port(), 80);
        assert!(WorkerUrl::parse("http://127.0.0.1:80\r\nx-a: b").is_err());
        assert!(WorkerUrl::parse("http://127.0.0.1:80\0").is_err());
        // https: not resolved here (the egress thread, or a proxy, reaches the host).
        let t = WorkerUrl::parse("https://api.openai.com/").unwrap();
        assert_eq!(t.tls, Some(crate::egress::Origin { host: "api.openai.com".into(), port: 443 }));
        assert_eq!((t.authority.as_str(), t.provider), ("api.openai.com", Some(Provider::OpenAi)));
        let t = WorkerUrl::parse("https://no-such-host.invalid:8443").unwrap();
        assert_eq!(t.tls, Some(crate::egress::Origin { host: "no-such-host.invalid".into(), port: 8443 }));
        assert_eq!((t.authority.as_str(), t.provider), ("no-such-host.invalid:8443", None));
        assert!(WorkerUrl::parse("https://api.openai.com/v1").is_err());
        assert!(WorkerUrl::parse("ftp://x:1").is_err());
        let g = WorkerUrl::parse("grpc://127.0.0.1:9000").unwrap();
        assert!(g.grpc && !w.grpc);
        assert_eq!((g.url.as_str(), g.addr.port()), ("grpc://127.0.0.1:9000", 9000));
        assert!(WorkerUrl::parse("grpc://127.0.0.1:1/x").is_err());
        assert!(WorkerUrl::parse("http://").is_err());
        assert!(WorkerUrl::parse("http://127.0.0.1:1/v1").is_err());
    }
}
