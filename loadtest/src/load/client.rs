//! Keep-alive HTTP/1.1 client connection for the load generator: send a prebuilt request, read and measure the response.
//!
//! Requests are complete byte strings built once per scenario, so sending is one write of a
//! shared `Bytes`. Responses are framed by Content-Length, chunked coding, or close; SSE bodies
//! are parsed as they arrive so TTFT and inter-token gaps are taken at the moment bytes land.

use std::fmt;
use std::io;
use std::net::SocketAddr;

use bytes::Bytes;
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;
use monoio::time::Instant;

use crate::load::sse::{classify, usage_of, EventKind, SseParser, Usage};
use crate::wire::{self, BodyKind, ChunkedDecoder};

const READ_CHUNK: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;
const MAX_HEAD: usize = 64 * 1024;

/// A transport-level failure (no usable HTTP response).
#[derive(Debug)]
pub enum ClientError {
    Connect(io::Error),
    Io(io::Error),
    /// The peer closed before the response was complete.
    Closed,
    Malformed,
}

// === impl ClientError ===

impl ClientError {
    /// Short name used as a report key.
    pub fn kind(&self) -> &'static str {
        match self {
            ClientError::Connect(_) => "connect",
            ClientError::Io(_) => "io",
            ClientError::Closed => "closed",
            ClientError::Malformed => "malformed",
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Connect(e) => write!(f, "connect: {e}"),
            ClientError::Io(e) => write!(f, "io: {e}"),
            ClientError::Closed => f.write_str("connection closed mid-response"),
            ClientError::Malformed => f.write_str("malformed response"),
        }
    }
}

/// One measured response.
#[derive(Debug, Default)]
pub struct Exchange {
    pub status: u16,
    /// `X-SMG-Error-Code`, when the gateway produced the error.
    pub error_code: Option<String>,
    /// First token event, for streams.
    pub first_token: Option<Instant>,
    pub streamed: bool,
    /// A stream that ended without `[DONE]` or carried an error event.
    pub stream_broken: bool,
    pub usage: Option<Usage>,
    pub token_events: u32,
}

/// What a response head says.
struct RespHead {
    status: u16,
    head_len: usize,
    body: BodyKind,
    keep_alive: bool,
    sse: bool,
    error_code: Option<String>,
}

fn parse_resp_head(buf: &[u8], head_request: bool) -> Result<Option<RespHead>, ClientError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => return Err(ClientError::Malformed),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(ClientError::Malformed),
    };
    let status = resp.code.unwrap_or(0);
    let mut keep_alive = resp.version == Some(1);
    let mut body = BodyKind::UntilClose;
    let mut sse = false;
    let mut error_code = None;
    for h in resp.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            if body != BodyKind::Chunked {
                let len = wire::parse_content_length(h.value).map_err(|_| ClientError::Malformed)?;
                body = BodyKind::Length { len };
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if wire::has_token(h.value, b"chunked") {
                body = BodyKind::Chunked;
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            if wire::has_token(h.value, b"close") {
                keep_alive = false;
            } else if wire::has_token(h.value, b"keep-alive") {
                keep_alive = true;
            }
        } else if name.eq_ignore_ascii_case(b"content-type") {
            sse = memchr::memmem::find(h.value, b"text/event-stream").is_some();
        } else if name.eq_ignore_ascii_case(b"x-smg-error-code") {
            error_code = Some(String::from_utf8_lossy(h.value).into_owned());
        }
    }
    if head_request || status == 204 || status == 304 || (100..200).contains(&status) {
        body = BodyKind::Empty;
    }
    if body == BodyKind::UntilClose {
        keep_alive = false;
    }
    Ok(Some(RespHead { status, head_len, body, keep_alive, sse, error_code }))
}

/// A client connection to one target; reconnects when the previous one cannot be reused.
pub struct Conn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    rbuf: Vec<u8>,
    body: Vec<u8>,
    sse: SseParser,
    /// Read usage from non-streaming bodies (costs a lazy JSON get per response).
    pub parse_usage: bool,
    /// Inter-token gaps of the last exchange, in µs.
    pub itl_us: Vec<u64>,
    pub connects: u64,
}

// === impl Conn ===

impl Conn {
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            stream: None,
            rbuf: Vec::with_capacity(READ_CHUNK),
            body: Vec::new(),
            sse: SseParser::default(),
            parse_usage: true,
            itl_us: Vec::new(),
            connects: 0,
        }
    }

    /// The last response's body when it was not a stream (a stream's events are read as they
    /// come and not kept): a chained scenario reads the answer's id here.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// Forgets the connection (after a timeout or error the stream state is unknown).
    pub fn reset(&mut self) {
        self.stream = None;
        self.rbuf.clear();
    }

    async fn connect(&mut self) -> Result<(), ClientError> {
        let s = TcpStream::connect(self.addr).await.map_err(ClientError::Connect)?;
        let _ = s.set_nodelay(true);
        self.stream = Some(s);
        self.rbuf.clear();
        self.connects += 1;
        Ok(())
    }

    /// Sends `req` and reads the whole response. A reused connection that fails before any
    /// response byte is retried once on a fresh one (the server may have closed it while idle).
    pub async fn exchange(&mut self, req: &Bytes) -> Result<Exchange, ClientError> {
        let reused = self.stream.is_some();
        if !reused {
            self.connect().await?;
        }
        match self.try_exchange(req).await {
            Err((e, false)) if reused => {
                let _ = e;
                self.reset();
                self.connect().await?;
                self.try_exchange(req).await.map_err(|(e, _)| e)
            }
            other => other.map_err(|(e, _)| e),
        }
    }

    /// Errors carry whether any response byte had arrived.
    async fn try_exchange(&mut self, req: &Bytes) -> Result<Exchange, (ClientError, bool)> {
        let Some(stream) = self.stream.as_mut() else {
            return Err((ClientError::Closed, false));
        };
        let (res, _) = stream.write_all(req.clone()).await;
        if let Err(e) = res {
            self.reset();
            return Err((ClientError::Io(e), false));
        }
        let head_request = req.starts_with(b"HEAD ");
        self.itl_us.clear();
        let result = self.read_response(head_request).await;
        if result.is_err() {
            self.reset();
        }
        result
    }

    async fn fill(&mut self) -> Result<usize, ClientError> {
        let Some(stream) = self.stream.as_mut() else {
            return Err(ClientError::Closed);
        };
        if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 2 {
            self.rbuf.reserve(READ_CHUNK.max(self.rbuf.len()));
        }
        let buf = std::mem::take(&mut self.rbuf);
        let len = buf.len();
        let (res, slice) = stream.read(buf.slice_mut(len..)).await;
        self.rbuf = slice.into_inner();
        res.map_err(ClientError::Io)
    }

    async fn read_response(&mut self, head_request: bool) -> Result<Exchange, (ClientError, bool)> {
        let mut got_bytes = !self.rbuf.is_empty();
        // Head, skipping any 1xx interim responses.
        let head = loop {
            if !self.rbuf.is_empty() {
                match parse_resp_head(&self.rbuf, head_request) {
                    Ok(Some(h)) if (100..200).contains(&h.status) => {
                        self.rbuf.drain(..h.head_len);
                        continue;
                    }
                    Ok(Some(h)) => break h,
                    Ok(None) => {}
                    Err(e) => return Err((e, true)),
                }
            }
            match self.fill().await {
                Ok(0) => return Err((ClientError::Closed, got_bytes)),
                Ok(_) => got_bytes = true,
                Err(e) => return Err((e, got_bytes)),
            }
        };
        let mut ex =
            Exchange { status: head.status, error_code: head.error_code, streamed: head.sse, ..Exchange::default() };
        let mut last_token: Option<Instant> = None;
        let mut saw_done = false;
        self.sse.reset();
        if self.body.capacity() > 1 << 20 {
            self.body = Vec::new();
        }
        self.body.clear();
        let mut pos = head.head_len;
        let mut dec = ChunkedDecoder::new();
        loop {
            // Take what framing allows from the buffer.
            let done = match head.body {
                BodyKind::Empty => true,
                BodyKind::Length { len } => {
                    let want = len - self.body.len();
                    let take = want.min(self.rbuf.len() - pos);
                    self.body.extend_from_slice(&self.rbuf[pos..pos + take]);
                    pos += take;
                    self.body.len() == len
                }
                BodyKind::Chunked => {
                    let body = &mut self.body;
                    let n = dec
                        .decode(&self.rbuf[pos..], |d| body.extend_from_slice(d))
                        .map_err(|_| (ClientError::Malformed, true))?;
                    pos += n;
                    dec.is_done()
                }
                BodyKind::UntilClose => {
                    self.body.extend_from_slice(&self.rbuf[pos..]);
                    pos = self.rbuf.len();
                    false
                }
            };
            if head.sse && !self.body.is_empty() {
                let now = Instant::now();
                let itl = &mut self.itl_us;
                self.sse.feed(&self.body, |data| match classify(data) {
                    EventKind::Token => {
                        ex.token_events += 1;
                        match last_token {
                            None => ex.first_token = Some(now),
                            Some(prev) => itl.push((now - prev).as_micros() as u64),
                        }
                        last_token = Some(now);
                    }
                    EventKind::Done => saw_done = true,
                    EventKind::Error => ex.stream_broken = true,
                    EventKind::Other => {
                        if let Some(u) = usage_of(data) {
                            ex.usage = Some(u);
                        }
                    }
                });
                self.body.clear();
            }
            // Keep the unread tail (a pipelined or early next response never happens here, but
            // bytes past this body must not be lost).
            self.rbuf.drain(..pos);
            pos = 0;
            if done {
                break;
            }
            match self.fill().await {
                Ok(0) if head.body == BodyKind::UntilClose => {
                    self.stream = None;
                    break;
                }
                Ok(0) => return Err((ClientError::Closed, true)),
                Ok(_) => {}
                Err(e) => return Err((e, true)),
            }
        }
        if head.sse {
            if !saw_done && ex.status == 200 {
                ex.stream_broken = true;
            }
        } else if self.parse_usage && ex.status == 200 && !self.body.is_empty() {
            ex.usage = usage_of(&self.body);
        }
        if !head.keep_alive {
            self.stream = None;
            self.rbuf.clear();
        }
        Ok(ex)
    }
}

/// Builds a complete request: head plus body, as one buffer sent per request.
pub fn build_request(method: &str, path: &str, host: &str, extra_headers: &[String], body: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\n");
    for h in extra_headers {
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !body.is_empty() || method == "POST" {
        out.extend_from_slice(b"content-type: application/json\r\ncontent-length: ");
        wire::put_u64(&mut out, body.len() as u64);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_heads() {
        let h = parse_resp_head(
            b"HTTP/1.1 503 Service Unavailable\r\nX-SMG-Error-Code: no_available_workers\r\ncontent-length: 2\r\n\r\n{}",
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.status, 503);
        assert_eq!(h.error_code.as_deref(), Some("no_available_workers"));
        assert_eq!(h.body, BodyKind::Length { len: 2 });
        assert!(h.keep_alive);
        let h = parse_resp_head(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
            false,
        )
        .unwrap()
        .unwrap();
        assert!(h.sse && h.body == BodyKind::Chunked);
        let h = parse_resp_head(b"HTTP/1.0 200 OK\r\n\r\n", false).unwrap().unwrap();
        assert!(!h.keep_alive && h.body == BodyKind::UntilClose);
        assert!(parse_resp_head(b"HTTP/1.1 200 OK\r\n", false).unwrap().is_none());
        assert!(parse_resp_head(b"garbage\r\n\r\n", false).is_err());
    }

    #[test]
    fn request_bytes() {
        let r = build_request("POST", "/v1/x", "h:1", &["authorization: Bearer k".into()], b"{}");
        assert_eq!(
            &r[..],
            b"POST /v1/x HTTP/1.1\r\nhost: h:1\r\nauthorization: Bearer k\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        );
    }
}
