//! One MCP message over Streamable HTTP, on the MCP thread's tokio runtime: a POST on a
//! connection of its own, the reply read as it arrives. An SSE answer is read only until
//! the reply to our request is in it (a server may keep the stream open after it).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::rpc::{self, Reply};
use super::server::Server;
use smg_wire::chunked::ChunkedDecoder;

/// Largest answer read from an MCP server.
const MAX_ANSWER: usize = 8 << 20;

/// What came back.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The reply to our request (None for a notification).
    pub reply: Option<Reply>,
    /// `Mcp-Session-Id`, when the server gave one.
    pub session: Option<String>,
}

/// POSTs `body` (request `id`, or a notification when None) within `within`.
pub(crate) async fn post(
    server: &Server,
    to: Option<std::net::SocketAddr>,
    session: Option<&str>,
    body: &[u8],
    id: Option<u64>,
    within: Duration,
) -> Result<Answer, String> {
    match tokio::time::timeout(within, exchange(server, to, session, body, id)).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} s", within.as_secs_f64())),
    }
}

async fn exchange(
    server: &Server,
    to: Option<std::net::SocketAddr>,
    session: Option<&str>,
    body: &[u8],
    id: Option<u64>,
) -> Result<Answer, String> {
    let url = &server.url;
    let connected = match to {
        // https://: the egress thread's loopback port, piped to TLS.
        Some(addr) => TcpStream::connect(addr).await,
        None => TcpStream::connect((url.host.as_str(), url.port)).await,
    };
    let mut s = connected.map_err(|e| format!("connect: {e}"))?;
    let mut req = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n",
        url.path,
        url.authority,
        body.len()
    );
    if let Some(sid) = session {
        req.push_str(&format!("Mcp-Session-Id: {sid}\r\nMCP-Protocol-Version: {}\r\n", rpc::PROTOCOL_VERSION));
    }
    for (k, v) in &server.headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut out = req.into_bytes();
    out.extend_from_slice(body);
    s.write_all(&out).await.map_err(|e| format!("write: {e}"))?;

    let mut raw = Vec::new();
    let mut tmp = vec![0u8; 16 * 1024];
    let mut head: Option<Head> = None;
    let mut decoded = Vec::new();
    let mut chunks = ChunkedDecoder::new();
    let mut consumed = 0;
    loop {
        let n = s.read(&mut tmp).await.map_err(|e| format!("read: {e}"))?;
        let eof = n == 0;
        raw.extend_from_slice(&tmp[..n]);
        if raw.len() > MAX_ANSWER {
            return Err("answer too large".into());
        }
        if head.is_none() {
            match parse_head(&raw)? {
                Some(h) => {
                    consumed = h.len;
                    head = Some(h);
                }
                None if eof => return Err("the server closed before its answer".into()),
                None => continue,
            }
        }
        let Some(h) = head.as_ref() else { continue };
        if !(200..300).contains(&h.status) {
            return Err(format!("HTTP {}", h.status));
        }
        // A notification is accepted (202) with no body to wait for.
        let Some(id) = id else { return Ok(Answer { reply: None, session: h.session.clone() }) };
        let fresh = &raw[consumed..];
        consumed = raw.len();
        let complete = if h.chunked {
            chunks.feed(fresh, Some(&mut decoded)).map_err(|_| "bad chunked framing".to_string())?;
            chunks.is_done()
        } else {
            decoded.extend_from_slice(fresh);
            h.length.is_some_and(|l| decoded.len() >= l)
        };
        if h.sse || complete || eof {
            if let Some(r) = rpc::reply(&decoded, h.sse, id) {
                return Ok(Answer { reply: Some(r), session: h.session.clone() });
            }
        }
        if complete || eof {
            return Err("the answer holds no reply to the request".into());
        }
    }
}

struct Head {
    len: usize,
    status: u16,
    session: Option<String>,
    sse: bool,
    chunked: bool,
    length: Option<usize>,
}

fn parse_head(raw: &[u8]) -> Result<Option<Head>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("malformed answer: {e}")),
    };
    let find = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
            .map(str::trim)
    };
    Ok(Some(Head {
        len,
        status: resp.code.unwrap_or(0),
        session: find("mcp-session-id").map(str::to_string),
        sse: find("content-type").is_some_and(|c| c.starts_with("text/event-stream")),
        chunked: find("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")),
        length: find("content-length").and_then(|l| l.parse().ok()),
    }))
}
