//! Upstream side: per-shard, per-worker keep-alive pools, and the response head parser.
//!
//! The pool is LIFO (the most recently used socket is the one most likely still open) and
//! forgets connections idle longer than `--upstream-pool-idle-timeout-secs` (default 3 s,
//! shorter than engines' 5 s keep-alive so we close first and rarely race their close).

use std::cell::RefCell;
use std::ops::Range;
use std::time::{Duration, Instant};

use monoio::net::TcpStream;

/// Read buffer size of an upstream connection.
pub const UPSTREAM_BUF: usize = 16 * 1024;
/// Largest worker response head we accept.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;

pub struct UpstreamConn {
    pub stream: TcpStream,
    /// Read buffer, owned by the connection so it travels through the pool with it.
    pub buf: Vec<u8>,
    idle_since: Instant,
    /// Came from the pool: a failure before any response byte may be a stale socket.
    pub reused: bool,
}

pub async fn connect(addr: std::net::SocketAddr) -> std::io::Result<UpstreamConn> {
    let stream = TcpStream::connect_addr(addr).await?;
    crate::runtime::io::nodelay(&stream);
    Ok(UpstreamConn { stream, buf: Vec::with_capacity(UPSTREAM_BUF), idle_since: Instant::now(), reused: false })
}

/// Idle connections of one shard, indexed by worker id.
pub struct Pool {
    idle: RefCell<Vec<Vec<UpstreamConn>>>,
    idle_timeout: Duration,
}

// === impl Pool ===

impl Pool {
    pub fn new(idle_timeout: Duration) -> Self {
        Self { idle: RefCell::new(Vec::new()), idle_timeout }
    }

    pub fn take(&self, worker: usize) -> Option<UpstreamConn> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(worker)?;
        let now = Instant::now();
        while let Some(mut c) = list.pop() {
            if now.duration_since(c.idle_since) < self.idle_timeout {
                c.reused = true;
                return Some(c);
            }
            // The newest is too old, so every older one is too.
            list.clear();
        }
        None
    }

    pub fn put(&self, worker: usize, mut conn: UpstreamConn) {
        conn.buf.clear();
        conn.idle_since = Instant::now();
        let mut idle = self.idle.borrow_mut();
        if idle.len() <= worker {
            idle.resize_with(worker + 1, Vec::new);
        }
        idle[worker].push(conn);
    }

    /// Closes connections idle past the timeout (oldest sit at the front).
    pub fn sweep(&self) {
        let now = Instant::now();
        for list in self.idle.borrow_mut().iter_mut() {
            let keep_from =
                list.iter().position(|c| now.duration_since(c.idle_since) < self.idle_timeout).unwrap_or(list.len());
            list.drain(..keep_from);
        }
    }
}

/// How a worker's response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseBody {
    None,
    Length {
        len: u64,
    },
    Chunked,
    /// Read until the worker closes (HTTP/1.0 style); the connection is not reusable.
    Close,
}

#[derive(Debug, Clone)]
pub struct ResponseHead {
    pub len: usize,
    pub status: u16,
    pub reason: Range<usize>,
    pub body: ResponseBody,
    /// Worker allows reuse (HTTP/1.1 without `Connection: close`).
    pub keep_alive: bool,
    /// Headers relayed to the client (hop-by-hop, framing and our own headers removed).
    pub relay: Vec<(Range<usize>, Range<usize>)>,
}

#[derive(Debug)]
pub struct BadResponse(pub &'static str);

/// Headers never relayed from a worker: hop-by-hop ones (RFC 9110 §7.6.1), framing we
/// redo ourselves, and the ones the gateway owns.
fn dropped(name: &[u8]) -> bool {
    const DROP: [&[u8]; 12] = [
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"upgrade",
        b"transfer-encoding",
        b"content-length",
        b"x-smg-error-code",
        b"x-smg-routed-worker-id",
    ];
    DROP.iter().any(|d| name.eq_ignore_ascii_case(d)) || name.eq_ignore_ascii_case(b"x-request-id")
}

fn range(buf: &[u8], part: &[u8]) -> Range<usize> {
    let s = part.as_ptr() as usize - buf.as_ptr() as usize;
    s..s + part.len()
}

/// Parses a worker response head; Ok(None) = need more bytes. 1xx heads are skipped by
/// the caller (they come back with `status < 200`).
pub fn parse_response(buf: &[u8]) -> Result<Option<ResponseHead>, BadResponse> {
    let mut slots = [httparse::EMPTY_HEADER; 96];
    let mut resp = httparse::Response::new(&mut slots);
    let n = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_RESPONSE_HEAD => {
            return Err(BadResponse("response head too large"))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(BadResponse("malformed response head")),
    };
    let status = resp.code.unwrap_or(0);
    let reason = range(buf, resp.reason.unwrap_or("").as_bytes());
    let mut keep_alive = resp.version == Some(1);
    let mut chunked = false;
    let mut length: Option<u64> = None;
    let mut relay = Vec::with_capacity(resp.headers.len());
    for h in resp.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            chunked = h
                .value
                .split(|b| *b == b',')
                .next_back()
                .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            if !chunked {
                return Err(BadResponse("unsupported transfer coding"));
            }
        } else if name.eq_ignore_ascii_case(b"content-length") {
            let v = std::str::from_utf8(h.value).ok().and_then(|v| v.trim().parse::<u64>().ok());
            match (v, length) {
                (None, _) => return Err(BadResponse("invalid content-length")),
                (Some(a), Some(b)) if a != b => return Err(BadResponse("conflicting content-length")),
                (Some(a), _) => length = Some(a),
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            for t in h.value.split(|b| *b == b',') {
                let t = t.trim_ascii();
                if t.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if t.eq_ignore_ascii_case(b"keep-alive") && resp.version == Some(0) {
                    keep_alive = true;
                }
            }
        }
        if !dropped(name) {
            relay.push((range(buf, name), range(buf, h.value)));
        }
    }
    let body = if status < 200 || status == 204 || status == 304 {
        ResponseBody::None
    } else if chunked {
        ResponseBody::Chunked
    } else if let Some(len) = length {
        if len == 0 {
            ResponseBody::None
        } else {
            ResponseBody::Length { len }
        }
    } else {
        keep_alive = false;
        ResponseBody::Close
    };
    Ok(Some(ResponseHead { len: n, status, reason, body, keep_alive, relay }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_filters() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\nX-SMG-Error-Code: x\r\nX-Request-Id: w\r\nX-Other: 1\r\n\r\nrest";
        let h = parse_response(raw).unwrap().unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(h.body, ResponseBody::Chunked);
        assert!(h.keep_alive);
        let names: Vec<&[u8]> = h.relay.iter().map(|(n, _)| &raw[n.clone()]).collect();
        assert_eq!(names, vec![&b"Content-Type"[..], b"X-Other"]);
        assert_eq!(&raw[h.len..], b"rest");
    }

    #[test]
    fn framing_cases() {
        let h = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n").unwrap().unwrap();
        assert_eq!(h.body, ResponseBody::Length { len: 5 });
        let h = parse_response(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\n").unwrap().unwrap();
        assert!(!h.keep_alive);
        let h = parse_response(b"HTTP/1.0 200 OK\r\n\r\n").unwrap().unwrap();
        assert_eq!(h.body, ResponseBody::Close);
        assert!(!h.keep_alive);
        let h = parse_response(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap().unwrap();
        assert_eq!(h.body, ResponseBody::None);
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").unwrap().is_none());
    }
}
