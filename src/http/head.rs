//! Request-head parsing: httparse plus the framing rules that keep us safe from smuggling.
//!
//! The head is parsed in place from the connection's read buffer; everything the later
//! phases need is kept as byte ranges into that buffer, so no header is copied.

use std::ops::Range;

use smg_wire::header::{has_token, parse_content_length, trim};

/// Longest request line we accept before answering 414.
pub const MAX_REQUEST_LINE: usize = 8 * 1024;
/// Largest request head (line + headers) before answering 431.
pub const MAX_HEAD: usize = 32 * 1024;
/// Most headers in one request before answering 431.
pub const MAX_HEADERS: usize = 96;

/// How the request body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// No body (no Content-Length and no Transfer-Encoding).
    Empty,
    /// `Content-Length: n`.
    Length { len: u64 },
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Other,
}

/// Why a head could not be accepted; `status()` maps each to its answer in one place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Request line longer than [`MAX_REQUEST_LINE`].
    UriTooLong,
    /// Head larger than [`MAX_HEAD`] or more than [`MAX_HEADERS`] headers.
    HeadTooLarge,
    /// Anything malformed, including ambiguous framing.
    Malformed(&'static str),
}

impl ParseError {
    pub fn status(&self) -> u16 {
        match self {
            ParseError::UriTooLong => 414,
            ParseError::HeadTooLarge => 431,
            ParseError::Malformed(_) => 400,
        }
    }
}

/// A header the gateway forwards or reads, kept as ranges into the read buffer.
#[derive(Debug, Clone)]
pub struct HeaderRange {
    pub name: Range<usize>,
    pub value: Range<usize>,
}

/// Everything the later phases need from a request head.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// Bytes of the head including the blank line.
    pub len: usize,
    pub method: Method,
    /// The request target as sent (path and query).
    pub target: Range<usize>,
    /// Path without the query.
    pub path: Range<usize>,
    pub http10: bool,
    pub body: BodyKind,
    pub expect_continue: bool,
    /// Client asked to close (or HTTP/1.0 without keep-alive).
    pub close: bool,
    pub content_type_json: bool,
    /// Client headers the contract allows us to forward to workers.
    pub forward: Vec<HeaderRange>,
    /// All headers, for lookups by name (request id, routing keys, auth).
    pub headers: Vec<HeaderRange>,
}

impl RequestHead {
    /// The value of the first header called `name` (lowercase ASCII).
    pub fn header<'b>(&self, buf: &'b [u8], name: &str) -> Option<&'b [u8]> {
        self.headers
            .iter()
            .find(|h| buf[h.name.clone()].eq_ignore_ascii_case(name.as_bytes()))
            .map(|h| &buf[h.value.clone()])
    }
}

/// Headers a worker may see, per the contract's "Request Headers" section.
pub fn is_forwarded_header(name: &[u8]) -> bool {
    const EXACT: [&[u8]; 8] = [
        b"authorization",
        b"anthropic-version",
        b"anthropic-beta",
        b"x-request-id",
        b"x-correlation-id",
        b"traceparent",
        b"tracestate",
        b"x-smg-routing-key",
    ];
    EXACT.iter().any(|e| name.eq_ignore_ascii_case(e))
        || (name.len() > 13 && name[..13].eq_ignore_ascii_case(b"x-request-id-"))
}

fn offset(buf: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    start..start + part.len()
}

/// Parses a request head from the start of `buf`.
///
/// `Ok(None)` means more bytes are needed. Limits are checked on partial input too, so a
/// client cannot make us buffer an unbounded head.
pub fn parse_request(buf: &[u8]) -> Result<Option<RequestHead>, ParseError> {
    // Tolerate (RFC 9112 §2.2) blank lines before a request line.
    let lead = buf.iter().take_while(|b| **b == b'\r' || **b == b'\n').count();
    let data = &buf[lead..];
    let line_end = data.iter().position(|b| *b == b'\n');
    match line_end {
        None if data.len() > MAX_REQUEST_LINE => return Err(ParseError::UriTooLong),
        Some(n) if n > MAX_REQUEST_LINE => return Err(ParseError::UriTooLong),
        _ => {}
    }
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    let status = match req.parse(data) {
        Ok(s) => s,
        Err(httparse::Error::TooManyHeaders) => return Err(ParseError::HeadTooLarge),
        Err(httparse::Error::Version) => return Err(ParseError::Malformed("bad HTTP version")),
        Err(_) => return Err(ParseError::Malformed("malformed request head")),
    };
    let head_len = match status {
        httparse::Status::Partial => {
            if data.len() > MAX_HEAD {
                return Err(ParseError::HeadTooLarge);
            }
            return Ok(None);
        }
        httparse::Status::Complete(n) => n,
    };
    if head_len > MAX_HEAD {
        return Err(ParseError::HeadTooLarge);
    }
    let method = match req.method.unwrap_or("") {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        _ => Method::Other,
    };
    let target_str = req.path.unwrap_or("");
    if target_str.is_empty() || !(target_str.starts_with('/') || target_str == "*") {
        return Err(ParseError::Malformed("bad request target"));
    }
    let target = offset(buf, target_str.as_bytes());
    let path_len = target_str.find('?').unwrap_or(target_str.len());
    let path = target.start..target.start + path_len;
    let http10 = req.version == Some(0);

    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut transfer_encoding = false;
    let mut expect_continue = false;
    let mut conn_close = false;
    let mut conn_keep_alive = false;
    let mut content_type_json = false;
    let mut forward = Vec::new();
    let mut headers = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        let value = h.value;
        let range = HeaderRange { name: offset(buf, name), value: offset(buf, value) };
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_content_length(value).ok_or(ParseError::Malformed("invalid Content-Length"))?;
            if content_length.is_some_and(|m| m != n) {
                return Err(ParseError::Malformed("conflicting Content-Length"));
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // Only a lone `chunked` is acceptable: any other coding (or chunked not last)
            // leaves the body length ambiguous between us and the next hop.
            if transfer_encoding || !trim(value).eq_ignore_ascii_case(b"chunked") {
                return Err(ParseError::Malformed("unsupported Transfer-Encoding"));
            }
            transfer_encoding = true;
            chunked = true;
        } else if name.eq_ignore_ascii_case(b"expect") {
            if trim(value).eq_ignore_ascii_case(b"100-continue") {
                expect_continue = true;
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            conn_close |= has_token(value, b"close");
            conn_keep_alive |= has_token(value, b"keep-alive");
        } else if name.eq_ignore_ascii_case(b"content-type") {
            let v = trim(value);
            let mime = v.split(|b| *b == b';').next().map(trim).unwrap_or(b"");
            content_type_json = mime.eq_ignore_ascii_case(b"application/json");
        } else if is_forwarded_header(name) {
            forward.push(range.clone());
        }
        headers.push(range);
    }
    if transfer_encoding && content_length.is_some() {
        return Err(ParseError::Malformed("both Content-Length and Transfer-Encoding"));
    }
    if transfer_encoding && http10 {
        return Err(ParseError::Malformed("Transfer-Encoding on HTTP/1.0"));
    }
    let body = if chunked {
        BodyKind::Chunked
    } else {
        match content_length {
            Some(0) | None => BodyKind::Empty,
            Some(len) => BodyKind::Length { len },
        }
    };
    Ok(Some(RequestHead {
        len: lead + head_len,
        method,
        target,
        path,
        http10,
        body,
        expect_continue,
        close: conn_close || (http10 && !conn_keep_alive),
        content_type_json,
        forward,
        headers,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Option<RequestHead>, ParseError> {
        parse_request(s.as_bytes())
    }

    #[test]
    fn simple_post() {
        let raw = "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Type: application/json; charset=utf-8\r\nAuthorization: Bearer k\r\nX-Request-ID-Foo: 1\r\nCookie: c\r\n\r\nhello";
        let h = parse(raw).unwrap().unwrap();
        assert_eq!(h.method, Method::Post);
        assert_eq!(&raw.as_bytes()[h.path.clone()], b"/v1/chat/completions");
        assert_eq!(&raw.as_bytes()[h.target.clone()], b"/v1/chat/completions?x=1");
        assert_eq!(h.body, BodyKind::Length { len: 5 });
        assert!(h.content_type_json);
        assert_eq!(h.forward.len(), 2);
        assert_eq!(&raw.as_bytes()[h.len..], b"hello");
        assert!(!h.close);
    }

    #[test]
    fn partial_at_every_offset() {
        let raw = b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n";
        for cut in 0..raw.len() {
            assert!(parse_request(&raw[..cut]).unwrap().is_none(), "cut {cut}");
        }
        assert!(parse_request(raw).unwrap().is_some());
    }

    #[test]
    fn smuggling_shapes_are_rejected() {
        for raw in [
            "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: -3\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 3x\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\nBad Header: x\r\n\r\n",
            "POST nopath HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(parse(raw).unwrap_err().status(), 400, "{raw:?}");
        }
    }

    #[test]
    fn limits() {
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_REQUEST_LINE));
        assert_eq!(parse(&long).unwrap_err(), ParseError::UriTooLong);
        let partial = format!("GET /{}", "a".repeat(MAX_REQUEST_LINE + 1));
        assert_eq!(parse(&partial).unwrap_err(), ParseError::UriTooLong);
        let many: String = (0..MAX_HEADERS + 1).map(|i| format!("X-{i}: v\r\n")).collect();
        let raw = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(parse(&raw).unwrap_err(), ParseError::HeadTooLarge);
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n", "v".repeat(MAX_HEAD));
        assert_eq!(parse(&big).unwrap_err(), ParseError::HeadTooLarge);
    }

    #[test]
    fn http10_defaults_to_close() {
        let h = parse("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(h.close);
        let h = parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").unwrap().unwrap();
        assert!(!h.close);
        let h = parse("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap().unwrap();
        assert!(h.close);
    }

    #[test]
    fn forwarded_header_allowlist() {
        for n in [
            "Authorization",
            "anthropic-version",
            "anthropic-beta",
            "X-Request-ID",
            "x-correlation-id",
            "X-Request-ID-Span",
            "traceparent",
            "tracestate",
            "X-SMG-Routing-Key",
        ] {
            assert!(is_forwarded_header(n.as_bytes()), "{n}");
        }
        for n in [
            "Cookie",
            "X-SMG-Routing-Tokens",
            "X-Forwarded-For",
            "x-request-id-",
            "Host",
            "Content-Length",
            "X-SMG-Target-Worker",
        ] {
            assert!(!is_forwarded_header(n.as_bytes()), "{n}");
        }
    }
}
