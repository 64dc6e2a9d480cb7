//! A blocking keep-alive HTTP/1.1 client for control-plane calls (the gateway's `/workers`,
//! the simulator's `/sim/*`), and the worker-info fields `failover` reads.
//!
//! Blocking on purpose: these calls run one at a time on the orchestrating thread, beside the
//! monoio load threads, and a poll every millisecond needs no runtime. Bodies must carry a
//! Content-Length (both servers answer these routes so); anything else is an error, not a guess.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use sonic_rs::{JsonValueTrait, Value};

/// One answer.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub body: Vec<u8>,
}

/// A head parsed off the front of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    /// Bytes of the head, blank line included.
    pub len: usize,
    pub content_length: usize,
    /// The server said `Connection: close`: do not reuse the connection.
    pub close: bool,
}

/// Parses a response head; None while it is incomplete.
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut headers);
    let len = match r.parse(buf).map_err(|e| format!("bad response head: {e}"))? {
        httparse::Status::Partial => return Ok(None),
        httparse::Status::Complete(n) => n,
    };
    let status = r.code.ok_or("response without status")?;
    let mut content_length = None;
    let mut close = false;
    for h in r.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            content_length = Some(crate::wire::parse_content_length(h.value).map_err(|e| e.to_string())?);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err("chunked response: this client reads Content-Length bodies only".into());
        } else if h.name.eq_ignore_ascii_case("connection") {
            close = crate::wire::has_token(h.value, b"close");
        }
    }
    // 204 and 304 have no body whatever the headers say.
    let content_length = if status == 204 || status == 304 { 0 } else { content_length.unwrap_or(0) };
    Ok(Some(Head { status, len, content_length, close }))
}

/// A keep-alive connection to one server, reopened when the server closed it.
pub struct Client {
    addr: SocketAddr,
    conn: Option<TcpStream>,
    timeout: Duration,
}

// === impl Client ===

impl Client {
    pub fn new(addr: SocketAddr, timeout: Duration) -> Self {
        Self { addr, conn: None, timeout }
    }

    /// One request; a reused connection that turns out closed is retried once on a fresh one
    /// (these calls are idempotent reads, or writes whose repeat the server rejects cleanly).
    pub fn call(&mut self, method: &str, path: &str, body: Option<&str>) -> Result<Resp, String> {
        let req = request(method, path, &self.addr.to_string(), body);
        let reused = self.conn.is_some();
        match self.exchange(&req) {
            Ok(r) => Ok(r),
            Err(_) if reused => self.exchange(&req),
            Err(e) => Err(e),
        }
    }

    fn exchange(&mut self, req: &[u8]) -> Result<Resp, String> {
        let res = self.exchange_inner(req);
        if res.is_err() {
            self.conn = None;
        }
        res
    }

    fn exchange_inner(&mut self, req: &[u8]) -> Result<Resp, String> {
        if self.conn.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, self.timeout)
                .map_err(|e| format!("connect {}: {e}", self.addr))?;
            s.set_nodelay(true).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(self.timeout)).map_err(|e| e.to_string())?;
            s.set_write_timeout(Some(self.timeout)).map_err(|e| e.to_string())?;
            self.conn = Some(s);
        }
        let s = self.conn.as_mut().expect("just connected");
        s.write_all(req).map_err(|e| format!("write {}: {e}", self.addr))?;
        let mut buf = Vec::with_capacity(1024);
        let mut chunk = [0u8; 4096];
        let head = loop {
            let n = s.read(&mut chunk).map_err(|e| format!("read {}: {e}", self.addr))?;
            if n == 0 {
                return Err(format!("{} closed the connection", self.addr));
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(h) = parse_head(&buf)? {
                break h;
            }
        };
        let want = head.len + head.content_length;
        while buf.len() < want {
            let n = s.read(&mut chunk).map_err(|e| format!("read {}: {e}", self.addr))?;
            if n == 0 {
                return Err(format!("{} closed the connection mid-body", self.addr));
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        if head.close {
            self.conn = None;
        }
        Ok(Resp { status: head.status, body: buf[head.len..want].to_vec() })
    }
}

/// A request's bytes (keep-alive; a JSON body when given).
pub fn request(method: &str, path: &str, host: &str, body: Option<&str>) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nhost: {host}\r\n");
    if let Some(b) = body {
        r.push_str(&format!("content-type: application/json\r\ncontent-length: {}\r\n\r\n{b}", b.len()));
    } else {
        r.push_str("\r\n");
    }
    r.into_bytes()
}

/// What `GET /workers/{id}` says about routing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerState {
    pub status: String,
    pub breaker: String,
}

// === impl WorkerState ===

impl WorkerState {
    pub fn parse(body: &[u8]) -> Result<Self, String> {
        let v: Value = sonic_rs::from_slice(body).map_err(|e| format!("worker info: {e}"))?;
        let status = v.get("status").and_then(|s| s.as_str()).ok_or("worker info without status")?;
        let breaker = v
            .get("circuit_breaker")
            .and_then(|c| c.get("state"))
            .and_then(|s| s.as_str())
            .ok_or("worker info without circuit_breaker.state")?;
        Ok(Self { status: status.to_string(), breaker: breaker.to_string() })
    }

    /// The gateway routes to a worker exactly when it is Ready and its breaker is not open.
    pub fn routable(&self) -> bool {
        self.status == "ready" && self.breaker != "open"
    }

    /// Which mechanism took the worker out: "breaker" when it is open, else the status.
    pub fn cause(&self) -> &str {
        if self.breaker == "open" {
            "breaker"
        } else {
            &self.status
        }
    }
}

/// A top-level string field of a JSON body (`worker_id` of `POST /workers`).
pub fn json_str(body: &[u8], field: &str) -> Option<String> {
    let v: Value = sonic_rs::from_slice(body).ok()?;
    v.get(field).and_then(|s| s.as_str()).map(str::to_string)
}

/// A top-level unsigned field of a JSON body (`inference_requests` of `/sim/stats`).
pub fn json_u64(body: &[u8], field: &str) -> Option<u64> {
    let v: Value = sonic_rs::from_slice(body).ok()?;
    v.get(field).and_then(|n| n.as_u64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads() {
        let r = b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
        let h = parse_head(r).unwrap().unwrap();
        assert_eq!(h, Head { status: 202, len: r.len() - 2, content_length: 2, close: false });
        assert_eq!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Le").unwrap(), None);
        let h =
            parse_head(b"HTTP/1.1 404 Not Found\r\nconnection: close\r\ncontent-length: 5\r\n\r\n").unwrap().unwrap();
        assert!(h.close);
        assert_eq!(h.content_length, 5);
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").is_err());
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
    }

    #[test]
    fn worker_states() {
        let ready = br#"{"id":"x","status":"ready","is_healthy":true,"circuit_breaker":{"state":"closed","consecutive_failures":0}}"#;
        let w = WorkerState::parse(ready).unwrap();
        assert!(w.routable());
        let half = br#"{"status":"ready","circuit_breaker":{"state":"half_open"}}"#;
        assert!(WorkerState::parse(half).unwrap().routable());
        let open = WorkerState::parse(br#"{"status":"ready","circuit_breaker":{"state":"open"}}"#).unwrap();
        assert!(!open.routable());
        assert_eq!(open.cause(), "breaker");
        let down = WorkerState::parse(br#"{"status":"not_ready","circuit_breaker":{"state":"closed"}}"#).unwrap();
        assert!(!down.routable());
        assert_eq!(down.cause(), "not_ready");
        assert!(!WorkerState::parse(br#"{"status":"pending","circuit_breaker":{"state":"closed"}}"#)
            .unwrap()
            .routable());
        assert!(WorkerState::parse(br#"{"status":"ready"}"#).is_err());
        assert!(WorkerState::parse(b"not json").is_err());
    }

    #[test]
    fn fields_and_requests() {
        assert_eq!(
            json_str(br#"{"status":"accepted","worker_id":"0190-ab"}"#, "worker_id").as_deref(),
            Some("0190-ab")
        );
        assert_eq!(json_u64(br#"{"inference_requests":7}"#, "inference_requests"), Some(7));
        assert_eq!(json_u64(b"{}", "inference_requests"), None);
        let r = request("POST", "/workers", "127.0.0.1:1", Some("{}"));
        assert!(r.ends_with(b"content-length: 2\r\n\r\n{}"));
        assert!(request("GET", "/x", "h", None).ends_with(b"host: h\r\n\r\n"));
    }
}
