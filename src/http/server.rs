//! The client connection driver. One loop per connection, one pass per request:
//!
//! ```text
//! read_head ──► read_body ──► api::dispatch ──► (inspect ► route ► upstream ► relay) ──► finish
//!    │ 400/414/431   │ 408/413 (close)            │ gateway-made answers (models, errors)
//!    └───────────────┴──────────────────────────► close        keep-alive ──► read_head
//! ```
//!
//! Pipelined requests are answered in order simply because each one is finished before the
//! next head is parsed from the bytes left in the buffer.

use std::ops::Range;
use std::rc::Rc;
use std::time::{Duration, Instant};

use monoio::io::AsyncWriteRent;
use monoio::net::TcpStream;

use super::chunked::ChunkedDecoder;
use super::head::{parse_request, BodyKind, ParseError, RequestHead};
use super::response::CONTINUE;
use crate::api::{self, ApiError};
use crate::runtime::io::{nodelay, read_more, write_all};
use crate::runtime::shard::Shard;

/// Initial per-connection read buffer; grows for large bodies and is shrunk back after.
const READ_BUF: usize = 8 * 1024;
const KEEP_BUF: usize = 64 * 1024;

/// Where the request body is.
pub enum Body {
    None,
    /// In the connection buffer (Content-Length bodies): forwarded without a copy.
    InBuf(Range<usize>),
    /// De-chunked into its own buffer.
    Decoded(Vec<u8>),
}

/// How a request ended, for the keep-alive decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    KeepAlive,
    Close,
}

/// Tracks a request between its head and the end of its response, for drain.
pub struct InflightGuard(Rc<Shard>);
impl InflightGuard {
    fn new(shard: &Rc<Shard>) -> Self {
        shard.inflight.set(shard.inflight.get() + 1);
        Self(Rc::clone(shard))
    }
}
impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.inflight.set(self.0.inflight.get() - 1);
    }
}

pub async fn serve_connection(shard: Rc<Shard>, mut stream: TcpStream) {
    nodelay(&stream);
    let mut buf = Vec::with_capacity(READ_BUF);
    loop {
        // Phase: read_head.
        let head = match read_head(&shard, &mut stream, buf).await {
            HeadRead::Head(h, b) => {
                buf = b;
                h
            }
            HeadRead::Closed => return,
            HeadRead::Reject(err, b) => {
                let mut out = Vec::new();
                let e = match err {
                    ParseError::UriTooLong => ApiError::new(414, "uri_too_long", "Request line too long"),
                    ParseError::HeadTooLarge => {
                        ApiError::new(431, "header_fields_too_large", "Request header fields too large")
                    }
                    ParseError::Malformed(why) => ApiError::new(400, "bad_request", why),
                };
                e.write_response(&mut out, None, false, true);
                let _ = write_all(&mut stream, out).await;
                drop(b);
                linger_close(stream).await;
                return;
            }
        };
        let _inflight = InflightGuard::new(&shard);

        // Phase: read_body.
        let (body, consumed, b) = match read_body(&shard, &mut stream, &head, buf).await {
            BodyRead::Ok { body, consumed, buf } => (body, consumed, buf),
            BodyRead::Reject(e, b) => {
                let mut out = Vec::new();
                e.write_response(&mut out, None, false, true);
                let _ = write_all(&mut stream, out).await;
                drop(b);
                linger_close(stream).await;
                return;
            }
            BodyRead::Closed => return,
        };
        buf = b;

        // Phase: dispatch (inspect, route, upstream, relay live in api::).
        let (finish, b) = api::dispatch(&shard, &mut stream, &head, buf, body).await;
        buf = b;

        // Phase: finish.
        if finish == Finish::Close || head.close || shard.draining.get() {
            let _ = stream.shutdown().await;
            return;
        }
        buf.drain(..consumed.min(buf.len()));
        if buf.capacity() > KEEP_BUF && buf.len() < READ_BUF {
            buf.shrink_to(READ_BUF);
        }
    }
}

enum HeadRead {
    Head(RequestHead, Vec<u8>),
    Closed,
    Reject(ParseError, Vec<u8>),
}

async fn read_head(shard: &Shard, stream: &mut TcpStream, mut buf: Vec<u8>) -> HeadRead {
    let mut deadline: Option<Instant> = None;
    loop {
        if !buf.is_empty() {
            match parse_request(&buf) {
                Ok(Some(h)) => return HeadRead::Head(h, buf),
                Ok(None) => {}
                Err(e) => return HeadRead::Reject(e, buf),
            }
        }
        // Idle keep-alive wait before the first byte; slow-client deadline after it.
        let wait = match deadline {
            None if buf.is_empty() => shard.cfg.client_idle_timeout,
            None => {
                let d = Instant::now() + shard.cfg.client_read_timeout;
                deadline = Some(d);
                shard.cfg.client_read_timeout
            }
            Some(d) => d.saturating_duration_since(Instant::now()),
        };
        if buf.is_empty() && shard.draining.get() {
            return HeadRead::Closed;
        }
        match monoio::time::timeout(wait, read_more(stream, buf, READ_BUF / 2)).await {
            Ok((Ok(n), b)) if n > 0 => {
                buf = b;
                if deadline.is_none() {
                    deadline = Some(Instant::now() + shard.cfg.client_read_timeout);
                }
            }
            // EOF, error, or timeout: nothing to answer.
            _ => return HeadRead::Closed,
        }
    }
}

enum BodyRead {
    Ok { body: Body, consumed: usize, buf: Vec<u8> },
    Reject(ApiError, Vec<u8>),
    Closed,
}

async fn read_body(shard: &Shard, stream: &mut TcpStream, head: &RequestHead, mut buf: Vec<u8>) -> BodyRead {
    let max = shard.cfg.max_payload_size;
    let stall = shard.cfg.client_read_timeout;
    match head.body {
        BodyKind::Empty => BodyRead::Ok { body: Body::None, consumed: head.len, buf },
        BodyKind::Length { len } => {
            if len > max as u64 {
                return BodyRead::Reject(ApiError::body_too_large(max), buf);
            }
            let end = head.len + len as usize;
            if buf.len() < end && head.expect_continue {
                let (res, _) = write_all(stream, CONTINUE.to_vec()).await;
                if res.is_err() {
                    return BodyRead::Closed;
                }
            }
            while buf.len() < end {
                let want = (end - buf.len()).min(1 << 20);
                match read_with_stall(stream, buf, want, stall).await {
                    (Step::Data, b) => buf = b,
                    (Step::Stalled, b) => return BodyRead::Reject(ApiError::body_stalled(), b),
                    (Step::Gone, _) => return BodyRead::Closed,
                }
            }
            BodyRead::Ok { body: Body::InBuf(head.len..end), consumed: end, buf }
        }
        BodyKind::Chunked => {
            let mut dec = ChunkedDecoder::new();
            let mut body = Vec::new();
            let mut pos = head.len;
            let mut continued = false;
            loop {
                match dec.feed(&buf[pos..], Some(&mut body)) {
                    Ok(n) => pos += n,
                    Err(e) => return BodyRead::Reject(ApiError::new(400, "bad_request", e.0), buf),
                }
                if body.len() > max {
                    return BodyRead::Reject(ApiError::body_too_large(max), buf);
                }
                if dec.is_done() {
                    return BodyRead::Ok { body: Body::Decoded(body), consumed: pos, buf };
                }
                if head.expect_continue && !continued {
                    continued = true;
                    let (res, _) = write_all(stream, CONTINUE.to_vec()).await;
                    if res.is_err() {
                        return BodyRead::Closed;
                    }
                }
                // Raw chunk bytes already decoded need not stay in the buffer.
                buf.drain(head.len..pos);
                pos = head.len;
                match read_with_stall(stream, buf, READ_BUF, stall).await {
                    (Step::Data, b) => buf = b,
                    (Step::Stalled, b) => return BodyRead::Reject(ApiError::body_stalled(), b),
                    (Step::Gone, _) => return BodyRead::Closed,
                }
            }
        }
    }
}

enum Step {
    Data,
    Stalled,
    Gone,
}

async fn read_with_stall(stream: &mut TcpStream, buf: Vec<u8>, want: usize, stall: Duration) -> (Step, Vec<u8>) {
    match monoio::time::timeout(stall, read_more(stream, buf, want)).await {
        Ok((Ok(n), b)) if n > 0 => (Step::Data, b),
        Ok((_, b)) => (Step::Gone, b),
        Err(_) => (Step::Stalled, Vec::new()),
    }
}

/// Closes after an early answer (413, 400…) without resetting the connection under the
/// client's unread response: stop writing, discard what the client still sends for a
/// short while, then close (what nginx calls lingering close).
async fn linger_close(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let until = Instant::now() + Duration::from_millis(500);
    let mut scratch = Vec::with_capacity(16 * 1024);
    let mut discarded = 0usize;
    while discarded < (4 << 20) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        scratch.clear();
        match monoio::time::timeout(left, read_more(&mut stream, scratch, 16 * 1024)).await {
            Ok((Ok(n), b)) if n > 0 => {
                discarded += n;
                scratch = b;
            }
            _ => break,
        }
    }
}
