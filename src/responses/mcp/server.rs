//! Where an MCP server is and what goes with every message to it.

/// An MCP endpoint: `http[s]://host[:port]/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct McpUrl {
    /// `https://`: reached through the egress thread's TLS (src/egress/).
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub path: String,
    /// `host[:port]`, the Host header.
    pub authority: String,
}

impl McpUrl {
    pub(crate) fn parse(url: &str) -> Result<McpUrl, String> {
        let (tls, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
            (Some(r), _) => (true, r),
            (None, Some(r)) => (false, r),
            _ => return Err(format!("MCP server '{url}': not an http:// or https:// URL")),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
                (h, p.parse::<u16>().map_err(|_| format!("MCP server '{url}': bad port"))?)
            }
            _ => (authority, if tls { 443 } else { 80 }),
        };
        if host.is_empty() {
            return Err(format!("MCP server '{url}': no host"));
        }
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        Ok(McpUrl { tls, host, port, path: path.to_string(), authority: authority.to_string() })
    }
}

/// A server a request uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Server {
    pub label: String,
    pub url: McpUrl,
    /// Sent with every message (`Authorization` from `authorization` or a configured token).
    pub headers: Vec<(String, String)>,
}
