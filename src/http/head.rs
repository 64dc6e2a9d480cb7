//! Request-head parsing: httparse plus the framing rules that keep us safe from smuggling.
//!
//! The head is parsed in place from the connection's read buffer; everything the later
//! phases need is kept as byte ranges into that buffer, so no header is copied.

use std::mem::MaybeUninit;
use std::ops::Range;

use smg_wire::header::{has_token, parse_content_length, trim};

use crate::spare::Spare;

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
    Put,
    Delete,
    Patch,
    Options,
    Other,
}

impl Method {
    /// The method's name, as metrics label it (`OTHER` for the rest).
    pub fn name(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
            Method::Patch => "PATCH",
            Method::Options => "OPTIONS",
            Method::Other => "OTHER",
        }
    }
}

/// Why a head could not be accepted. The driver maps each to its answer in one place
/// (`serve::error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Request line longer than [`MAX_REQUEST_LINE`]: 414.
    UriTooLong,
    /// Head larger than [`MAX_HEAD`] or more than [`MAX_HEADERS`] headers: 431.
    HeadTooLarge,
    /// A transfer coding we do not implement (RFC 9112 §6.1): 501.
    UnknownCoding,
    /// Anything malformed, including ambiguous framing: 400.
    Malformed(&'static str),
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
    /// The authority of an absolute-form target (`POST http://host/path`), if one was sent.
    pub absolute_authority: Option<Range<usize>>,
    pub body: BodyKind,
    pub expect_continue: bool,
    /// Client asked to close (or HTTP/1.0 without keep-alive).
    pub close: bool,
    pub content_type_json: bool,
    /// Client headers the contract allows us to forward to workers.
    pub forward: Vec<HeaderRange>,
    /// All headers, for lookups by name (request id, routing keys, auth).
    pub headers: Vec<HeaderRange>,
    /// `x-smg-hop`: the gateways the request has been through (`hop.rs`).
    pub hop: Option<Range<usize>>,
}

thread_local! {
    /// The header lists of the shard's last request head, for its next (crate::spare).
    static HEADERS: Spare<HeaderRange> = const { Spare::new(MAX_HEADERS) };
    static FORWARD: Spare<HeaderRange> = const { Spare::new(MAX_HEADERS) };
}

impl Drop for RequestHead {
    fn drop(&mut self) {
        HEADERS.with(|s| s.give(std::mem::take(&mut self.headers)));
        FORWARD.with(|s| s.give(std::mem::take(&mut self.forward)));
    }
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

/// Where `part`, a sub-slice of `buf`, sits in it. An empty `part` that is not in `buf` (a
/// parser's `""` for a missing piece) is the empty range at 0.
pub(crate) fn offset(buf: &[u8], part: &[u8]) -> Range<usize> {
    let start = (part.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
    if start > buf.len() || part.len() > buf.len() - start {
        debug_assert!(part.is_empty(), "offset of a slice outside its buffer");
        return 0..0;
    }
    start..start + part.len()
}

/// The target as forwarded (origin form: path and query), the path alone, and the authority
/// of an absolute-form target (RFC 9112 §3.2.2), as ranges into `buf`.
type Target = (Range<usize>, Range<usize>, Option<Range<usize>>);

fn split_target(buf: &[u8], raw: &str) -> Result<Target, ParseError> {
    let bad = ParseError::Malformed("bad request target");
    let all = offset(buf, raw.as_bytes());
    let (origin, authority) = if raw.starts_with('/') || raw == "*" {
        (all, None)
    } else {
        // Bytes, not `raw[..7]`: a target may hold UTF-8 whose character straddles the cut.
        let b = raw.as_bytes();
        let scheme = if b.len() > 7 && b[..7].eq_ignore_ascii_case(b"http://") {
            7
        } else if b.len() > 8 && b[..8].eq_ignore_ascii_case(b"https://") {
            8
        } else {
            return Err(bad);
        };
        let rest = &raw[scheme..];
        let slash = rest.find(['/', '?']).unwrap_or(rest.len());
        if slash == 0 {
            return Err(bad);
        }
        let auth = all.start + scheme..all.start + scheme + slash;
        // `http://host` and `http://host?q` mean the path `/`: only a path can be forwarded.
        if !rest[slash..].starts_with('/') {
            return Err(ParseError::Malformed("absolute-form target without a path"));
        }
        (auth.end..all.end, Some(auth))
    };
    let target = &buf[origin.clone()];
    let path_len = target.iter().position(|b| *b == b'?').unwrap_or(target.len());
    let path = origin.start..origin.start + path_len;
    Ok((origin, path, authority))
}

/// Parses a request head from the start of `buf`.
///
/// `Ok(None)` means more bytes are needed. Limits are checked on partial input too, so a
/// client cannot make us buffer an unbounded head.
pub fn parse_request(buf: &[u8]) -> Result<Option<RequestHead>, ParseError> {
    // Tolerate (RFC 9112 §2.2) blank lines before a request line, but no more of them than
    // a head may hold: they are bytes that belong to no request.
    let lead = buf.iter().take_while(|b| **b == b'\r' || **b == b'\n').count();
    if lead > MAX_HEAD {
        return Err(ParseError::Malformed("too many empty lines before the request line"));
    }
    let data = &buf[lead..];
    let line_end = data.iter().position(|b| *b == b'\n');
    match line_end {
        None if data.len() > MAX_REQUEST_LINE => return Err(ParseError::UriTooLong),
        Some(n) if n > MAX_REQUEST_LINE => return Err(ParseError::UriTooLong),
        _ => {}
    }
    // Slots left uninitialized: filling MAX_HEADERS empty ones (3 KB) cost 270 instructions a head.
    let mut slots = [const { MaybeUninit::<httparse::Header>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let status = match req.parse_with_uninit_headers(data, &mut slots) {
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
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "PATCH" => Method::Patch,
        "OPTIONS" => Method::Options,
        _ => Method::Other,
    };
    let (target, path, absolute_authority) = split_target(buf, req.path.unwrap_or(""))?;
    let http10 = req.version == Some(0);

    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut transfer_encoding = false;
    let mut expect_continue = false;
    let mut conn_close = false;
    let mut conn_keep_alive = false;
    let mut content_type_json = false;
    let mut hosts = 0u32;
    let mut forward = FORWARD.with(|s| s.take(0));
    let mut hop = None;
    let mut headers = HEADERS.with(|s| s.take(req.headers.len()));
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
            // Only a lone `chunked` frames a body we can read. Any other coding is one we do
            // not implement (501); a second Transfer-Encoding line is ambiguous (400).
            if transfer_encoding {
                return Err(ParseError::Malformed("more than one Transfer-Encoding"));
            }
            if !trim(value).eq_ignore_ascii_case(b"chunked") {
                return Err(ParseError::UnknownCoding);
            }
            transfer_encoding = true;
            chunked = true;
        } else if name.eq_ignore_ascii_case(b"host") {
            hosts += 1;
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
        } else if name.eq_ignore_ascii_case(b"x-smg-hop") {
            hop = Some(range.value.clone());
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
    // RFC 9112 §3.2: an HTTP/1.1 request has exactly one Host.
    if hosts > 1 || (hosts == 0 && !http10) {
        return Err(ParseError::Malformed(if hosts == 0 {
            "missing Host header"
        } else {
            "more than one Host header"
        }));
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
        absolute_authority,
        body,
        expect_continue,
        close: conn_close || (http10 && !conn_keep_alive),
        content_type_json,
        forward,
        headers,
        hop,
    }))
}

/// For a head refused after it arrived whole (bad or ambiguous framing, say): the value of
/// header `name`, read again without the framing rules, so the error answer can still carry
/// the client's own request id. None when the head itself cannot be read.
pub fn header_of_refused<'a>(buf: &'a [u8], name: &str) -> Option<&'a [u8]> {
    let lead = buf.iter().take_while(|b| **b == b'\r' || **b == b'\n').count();
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    match req.parse(buf.get(lead..)?) {
        Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD => {}
        _ => return None,
    }
    req.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value)
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
        // Cuts land inside the blank lines before the request line, the Content-Length value
        // and the Transfer-Encoding name and value, where an off-by-one would live.
        for raw in [
            &b"\r\n\r\nGET /health HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 12345\r\n\r\n",
            b"POST /v1/x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
        ] {
            let whole = parse_request(raw).unwrap().unwrap();
            for cut in 0..raw.len() {
                assert!(parse_request(&raw[..cut]).unwrap().is_none(), "cut {cut} of {raw:?}");
            }
            assert_eq!(whole.len, raw.len());
        }
        let h = parse_request(b"POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 12345\r\n\r\n").unwrap().unwrap();
        assert_eq!(h.body, BodyKind::Length { len: 12345 });
    }

    #[test]
    fn host_rules() {
        assert_eq!(parse("GET / HTTP/1.1\r\n\r\n").unwrap_err(), ParseError::Malformed("missing Host header"));
        assert_eq!(
            parse("GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n").unwrap_err(),
            ParseError::Malformed("more than one Host header")
        );
        assert!(parse("GET / HTTP/1.0\r\n\r\n").unwrap().is_some());
    }

    #[test]
    fn absolute_form_targets() {
        let raw = "POST http://gw.example:30000/v1/chat/completions?x=1 HTTP/1.1\r\nHost: gw\r\n\r\n";
        let h = parse(raw).unwrap().unwrap();
        let b = raw.as_bytes();
        assert_eq!(&b[h.target.clone()], b"/v1/chat/completions?x=1");
        assert_eq!(&b[h.path.clone()], b"/v1/chat/completions");
        assert_eq!(&b[h.absolute_authority.clone().unwrap()], b"gw.example:30000");
        assert!(parse("GET HTTP://a/ HTTP/1.1\r\nHost: a\r\n\r\n").unwrap().is_some());
        for bad in ["GET http:/// HTTP/1.1", "GET http://a HTTP/1.1", "GET ftp://a/ HTTP/1.1", "GET a/b HTTP/1.1"] {
            assert!(matches!(parse(&format!("{bad}\r\nHost: a\r\n\r\n")), Err(ParseError::Malformed(_))), "{bad}");
        }
    }

    #[test]
    fn a_multibyte_character_across_the_scheme_cut_is_a_bad_target() {
        // Found by fuzz/run (body target): `raw[..7]` cut inside the second character and
        // panicked.
        for bad in ["POST 333333\u{4cdf}/ HTTP/1.1", "POST 3333333\u{e9}/ HTTP/1.1", "GET https:/\u{e9}/a HTTP/1.1"] {
            assert!(matches!(parse(&format!("{bad}\r\nHost: a\r\n\r\n")), Err(ParseError::Malformed(_))), "{bad}");
        }
    }

    #[test]
    fn transfer_codings() {
        for te in ["gzip", "gzip, chunked", "chunked, gzip", "identity"] {
            let raw = format!("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: {te}\r\n\r\n");
            assert_eq!(parse(&raw).unwrap_err(), ParseError::UnknownCoding, "{te}");
        }
        let h = parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:  Chunked \r\n\r\n").unwrap().unwrap();
        assert_eq!(h.body, BodyKind::Chunked);
    }

    #[test]
    fn blank_lines_before_the_request_are_bounded() {
        let ok = format!("{}GET / HTTP/1.1\r\nHost: a\r\n\r\n", "\r\n".repeat(100));
        assert!(parse(&ok).unwrap().is_some());
        let flood = "\r\n".repeat(MAX_HEAD);
        assert!(matches!(parse(&flood), Err(ParseError::Malformed(_))));
        assert!(parse(&"\r\n".repeat(MAX_HEAD / 2)).unwrap().is_none());
    }

    #[test]
    fn smuggling_shapes_are_rejected() {
        for raw in [
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -3\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3x\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nBad Header: x\r\n\r\n",
            "POST nopath HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            assert!(matches!(parse(raw).unwrap_err(), ParseError::Malformed(_)), "{raw:?}");
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
        let h = parse("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").unwrap().unwrap();
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

    #[test]
    fn a_refused_heads_request_id_is_still_read() {
        let bad = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: mine-1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert!(parse_request(bad).is_err());
        assert_eq!(header_of_refused(bad, "x-request-id"), Some(&b"mine-1"[..]));
        assert_eq!(header_of_refused(b"\x01\x02 garbage\r\n\r\n", "x-request-id"), None);
        assert_eq!(header_of_refused(b"POST / HTTP/1.1\r\nX-Request-Id: cut", "x-request-id"), None);
    }
}
