//! Responses the gateway writes itself (status line, headers, small bodies, in one buffer),
//! and the headers it stamps on every response to a client, its own or relayed.

use smg_wire::num::put_dec;

/// The standard reason phrase of a status (RFC 9110 §15 and the IANA registry); also the
/// `type` of the contract's error envelope. An unregistered status gets its class's phrase.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        102 => "Processing",
        103 => "Early Hints",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        205 => "Reset Content",
        206 => "Partial Content",
        207 => "Multi-Status",
        208 => "Already Reported",
        226 => "IM Used",
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        305 => "Use Proxy",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Payload Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        418 => "I'm a teapot",
        421 => "Misdirected Request",
        422 => "Unprocessable Entity",
        423 => "Locked",
        424 => "Failed Dependency",
        425 => "Too Early",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        451 => "Unavailable For Legal Reasons",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        506 => "Variant Also Negotiates",
        507 => "Insufficient Storage",
        508 => "Loop Detected",
        510 => "Not Extended",
        511 => "Network Authentication Required",
        _ => class_phrase(status),
    }
}

fn class_phrase(status: u16) -> &'static str {
    match status / 100 {
        1 => "Informational",
        2 => "Success",
        3 => "Redirection",
        4 => "Client Error",
        _ => "Server Error",
    }
}

/// Appends `name: value\r\n`.
pub fn header_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// What the gateway puts on every response it sends a client, its own or a worker's.
#[derive(Debug, Clone, Copy)]
pub struct Stamp<'a> {
    pub request_id: &'a [u8],
    /// IMF-fixdate of this second (RFC 9110 §6.6.1), from the shard's clock.
    pub date: &'a [u8],
    /// The connection closes after this response.
    pub close: bool,
    /// The client spoke HTTP/1.0: a kept connection must say so, and no chunked coding.
    pub http10: bool,
}

impl Stamp<'_> {
    /// Appends `date`, `x-request-id` and the connection header.
    pub fn write(&self, out: &mut Vec<u8>) {
        if !self.date.is_empty() {
            header_line(out, b"date", self.date);
        }
        if !self.request_id.is_empty() {
            header_line(out, b"x-request-id", self.request_id);
        }
        if self.close {
            out.extend_from_slice(b"connection: close\r\n");
        } else if self.http10 {
            out.extend_from_slice(b"connection: keep-alive\r\n");
        }
    }
}

/// Appends a status line with the standard phrase.
pub fn status_line(out: &mut Vec<u8>, status: u16) {
    out.extend_from_slice(b"HTTP/1.1 ");
    put_dec(out, status as u64);
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// A response built by the gateway (health, models, errors).
pub struct Simple<'a> {
    pub status: u16,
    pub content_type: &'a str,
    pub headers: &'a [(&'a str, &'a [u8])],
    pub body: &'a [u8],
}

/// Appends `resp` to `out`. `head_only` answers HEAD.
pub fn write_simple(out: &mut Vec<u8>, resp: &Simple<'_>, head_only: bool, stamp: &Stamp<'_>) {
    status_line(out, resp.status);
    if !resp.content_type.is_empty() {
        out.extend_from_slice(b"content-type: ");
        out.extend_from_slice(resp.content_type.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"content-length: ");
    put_dec(out, resp.body.len() as u64);
    out.extend_from_slice(b"\r\n");
    for (name, value) in resp.headers {
        header_line(out, name.as_bytes(), value);
    }
    stamp.write(out);
    out.extend_from_slice(b"\r\n");
    if !head_only {
        out.extend_from_slice(resp.body);
    }
}

pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_head_and_body() {
        let mut out = Vec::new();
        let r = Simple { status: 404, content_type: "application/json", headers: &[("x-a", b"1")], body: b"{}" };
        let stamp = Stamp { request_id: b"id1", date: b"Tue, 01 Dec 2026 09:00:00 GMT", close: true, http10: false };
        write_simple(&mut out, &r, false, &stamp);
        assert_eq!(
            out,
            &b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\nx-a: 1\r\ndate: Tue, 01 Dec 2026 09:00:00 GMT\r\nx-request-id: id1\r\nconnection: close\r\n\r\n{}"[..]
        );
        out.clear();
        write_simple(&mut out, &r, true, &Stamp { close: false, http10: true, ..stamp });
        assert!(out.ends_with(b"x-request-id: id1\r\nconnection: keep-alive\r\n\r\n"));
    }

    #[test]
    fn every_status_has_a_phrase() {
        for s in 100..600u16 {
            assert!(!reason(s).is_empty() && reason(s) != "Unknown", "{s}");
        }
        assert_eq!(reason(501), "Not Implemented");
        assert_eq!(reason(499), "Client Error");
    }
}
