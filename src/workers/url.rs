//! How a worker is named: its stable id, and its URL as given on the command line.

use std::net::{SocketAddr, ToSocketAddrs};

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
}

// === impl WorkerUrl ===

impl WorkerUrl {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let url = raw.trim_end_matches('/');
        let (rest, grpc) = match (url.strip_prefix("http://"), url.strip_prefix("grpc://")) {
            (Some(r), _) => (r, false),
            (_, Some(r)) => (r, true),
            _ => return Err(format!("'{raw}': only http:// and grpc:// worker URLs are supported")),
        };
        // The authority goes into Host headers: no byte that could end or split a line.
        if rest.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            return Err(format!("'{}': control characters or spaces in a worker URL", raw.escape_debug()));
        }
        if rest.is_empty() || rest.contains('/') || rest.contains('@') {
            return Err(format!("'{raw}': expected http://host[:port] or grpc://host[:port]"));
        }
        let authority = if rest.starts_with('[')
            || rest.rsplit_once(':').is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        {
            rest.to_string()
        } else {
            format!("{rest}:80")
        };
        let addr = authority
            .to_socket_addrs()
            .map_err(|e| format!("'{raw}': cannot resolve: {e}"))?
            .next()
            .ok_or_else(|| format!("'{raw}': no address"))?;
        Ok(Self { url: url.to_string(), authority: rest.to_string(), addr, grpc })
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
        assert!(WorkerUrl::parse("https://x:1").is_err());
        let g = WorkerUrl::parse("grpc://127.0.0.1:9000").unwrap();
        assert!(g.grpc && !w.grpc);
        assert_eq!((g.url.as_str(), g.addr.port()), ("grpc://127.0.0.1:9000", 9000));
        assert!(WorkerUrl::parse("grpc://127.0.0.1:1/x").is_err());
        assert!(WorkerUrl::parse("http://").is_err());
        assert!(WorkerUrl::parse("http://127.0.0.1:1/v1").is_err());
    }
}
