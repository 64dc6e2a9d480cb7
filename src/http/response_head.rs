//! Worker response heads: reading one (with the client watched while the worker is silent),
//! parsing it (httparse plus the framing rules), and which headers reach the client.

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use monoio::net::TcpStream;

use super::head::offset;
use super::pool::{UpstreamConn, UPSTREAM_BUF};
use crate::io::{peer_closed, read_more};
use crate::spare::Spare;

/// How long the worker may be silent before we start watching the client, here and in the
/// relay (see relay.rs for why the watch waits).
pub const WATCH_AFTER: Duration = Duration::from_millis(20);

/// Largest worker response head we accept.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;

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

/// Most headers a worker's response head may carry.
const HEADER_SLOTS: usize = 96;

thread_local! {
    /// The relay list of the shard's last response head, for its next (crate::spare).
    static RELAY: Spare<(Range<usize>, Range<usize>)> = const { Spare::new(HEADER_SLOTS) };
}

impl Drop for ResponseHead {
    fn drop(&mut self) {
        RELAY.with(|s| s.give(std::mem::take(&mut self.relay)));
    }
}

#[derive(Debug)]
pub struct BadResponse(pub &'static str);

/// Headers never relayed from a worker: hop-by-hop ones (RFC 9110 §7.6.1), framing we
/// redo ourselves, and the ones the gateway owns (`date` too: the client gets the gateway's
/// clock once, as nginx does, not two `Date` lines).
fn dropped(name: &[u8]) -> bool {
    const DROP: [&[u8]; 13] = [
        b"date",
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

/// Parses a worker response head; Ok(None) = need more bytes. 1xx heads are skipped by
/// the caller (they come back with `status < 200`).
pub fn parse_response(buf: &[u8]) -> Result<Option<ResponseHead>, BadResponse> {
    // Slots left uninitialized: filling 96 empty ones (3 KB) cost 270 instructions a head.
    let mut slots = [const { MaybeUninit::<httparse::Header>::uninit() }; HEADER_SLOTS];
    let mut resp = httparse::Response::new(&mut []);
    let n = match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut resp, buf, &mut slots) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_RESPONSE_HEAD => {
            return Err(BadResponse("response head too large"))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(BadResponse("malformed response head")),
    };
    let status = resp.code.unwrap_or(0);
    // A status line may end at its code (`HTTP/1.1 200` then the line end), and httparse
    // then gives an empty reason that is not in `buf`: an empty range instead. (Measured
    // from that `""`, the range pointed anywhere: AFL found it, and the relay would have
    // panicked on every such answer.)
    let reason = resp.reason.filter(|r| !r.is_empty()).map_or(0..0, |r| offset(buf, r.as_bytes()));
    let mut keep_alive = resp.version == Some(1);
    let mut chunked = false;
    let mut length: Option<u64> = None;
    let mut relay = RELAY.with(|s| s.take(resp.headers.len()));
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
            relay.push((offset(buf, name), offset(buf, h.value)));
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

/// Why no response head arrived.
#[derive(Debug)]
pub enum HeadError {
    ClientGone,
    /// The worker closed or failed before sending any byte (a stale pooled socket looks
    /// exactly like this, which is what makes a retry on a fresh connection safe).
    NothingReceived(io::Error),
    /// The worker sent something unusable or stopped mid-head.
    Bad(&'static str),
    /// No head within the request timeout.
    TimedOut,
}

/// Reads until a final (non-1xx) response head is in `up.buf`, for at most `limit`.
///
/// Most heads arrive within [`WATCH_AFTER`], so the fast path arms one timer; only a
/// silent worker gets the client watch and the request-timeout timer.
pub async fn read_response_head(
    up: &mut UpstreamConn,
    client: &TcpStream,
    watch: &mut bool,
    limit: Duration,
) -> Result<ResponseHead, HeadError> {
    let mut head = pin!(read_unwatched(up));
    // The fast path polls the read and one timer in place (`select!` copied the futures).
    let mut early = pin!(crate::clock::timer(WATCH_AFTER));
    let answered = std::future::poll_fn(|cx| match head.as_mut().poll(cx) {
        Poll::Ready(r) => Poll::Ready(Some(r)),
        Poll::Pending => early.as_mut().poll(cx).map(|()| None),
    })
    .await;
    if let Some(r) = answered {
        return r;
    }
    let mut expired = pin!(crate::clock::timer(limit.saturating_sub(WATCH_AFTER)));
    loop {
        if !*watch {
            monoio::select! {
                biased;
                r = &mut head => return r,
                _ = &mut expired => return Err(HeadError::TimedOut),
            }
        }
        monoio::select! {
            biased;
            r = &mut head => return r,
            _ = &mut expired => return Err(HeadError::TimedOut),
            closed = peer_closed(client) => {
                if closed {
                    return Err(HeadError::ClientGone);
                }
                // The client pipelined its next request; stop watching, keep waiting.
                *watch = false;
            }
        }
    }
}

async fn read_unwatched(up: &mut UpstreamConn) -> Result<ResponseHead, HeadError> {
    let mut received = false;
    loop {
        if !up.buf.is_empty() {
            match parse_response(&up.buf) {
                Ok(Some(h)) if h.status < 200 => {
                    up.buf.drain(..h.len);
                    continue;
                }
                Ok(Some(h)) => return Ok(h),
                Ok(None) => {}
                Err(e) => return Err(HeadError::Bad(e.0)),
            }
        }
        let (res, buf) = read_more(&mut up.stream, std::mem::take(&mut up.buf), UPSTREAM_BUF / 2).await;
        up.buf = buf;
        match res {
            Ok(n) if n > 0 => received = true,
            Ok(_) if !received => return Err(HeadError::NothingReceived(io::ErrorKind::UnexpectedEof.into())),
            Err(e) if !received => return Err(HeadError::NothingReceived(e)),
            _ => return Err(HeadError::Bad("connection closed mid-head")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_filters() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\nX-SMG-Error-Code: x\r\nX-Request-Id: w\r\nDate: Tue, 01 Dec 2026 09:00:00 GMT\r\nX-Other: 1\r\n\r\nrest";
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

    #[test]
    fn head_split_at_every_offset() {
        let raw: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello";
        let interim = 25;
        for cut in 0..raw.len() {
            match parse_response(&raw[..cut]).unwrap() {
                None => assert!(cut < interim, "cut {cut}"),
                Some(h) => {
                    assert!(cut >= interim, "cut {cut}");
                    assert_eq!(h.status, 100);
                    assert_eq!(h.len, interim);
                }
            }
        }
        let rest = &raw[interim..];
        let full = rest.len() - 5;
        for cut in 0..rest.len() {
            let got = parse_response(&rest[..cut]).unwrap();
            assert_eq!(got.is_some(), cut >= full, "cut {cut}");
        }
        let h = parse_response(rest).unwrap().unwrap();
        assert_eq!((h.status, h.body, &rest[h.len..]), (200, ResponseBody::Length { len: 5 }, &b"hello"[..]));
        assert_eq!(&rest[h.reason.clone()], b"OK");
    }

    #[test]
    fn a_status_line_without_a_reason_has_an_empty_one() {
        for raw in [&b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok"[..], b"HTTP/1.1 100\n\n"] {
            let h = parse_response(raw).unwrap().unwrap();
            assert!(h.reason.is_empty() && h.reason.end <= h.len, "{:?}", h.reason);
        }
    }
}
