//! Responses the gateway writes itself: status line, headers, small bodies, in one buffer.

use std::io::Write;

/// The reason phrase of a status; also the `type` of the contract's error envelope.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Payload Too Large",
        414 => "URI Too Long",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

/// A response built by the gateway (health, models, errors).
pub struct Simple<'a> {
    pub status: u16,
    pub content_type: &'a str,
    pub headers: &'a [(&'a str, &'a [u8])],
    pub body: &'a [u8],
}

/// Appends `resp` to `out`. `head_only` answers HEAD; `close` adds `connection: close`.
pub fn write_simple(out: &mut Vec<u8>, resp: &Simple<'_>, head_only: bool, close: bool) {
    let _ = write!(out, "HTTP/1.1 {} {}\r\n", resp.status, reason(resp.status));
    if !resp.content_type.is_empty() {
        let _ = write!(out, "content-type: {}\r\n", resp.content_type);
    }
    let _ = write!(out, "content-length: {}\r\n", resp.body.len());
    for (name, value) in resp.headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
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
        write_simple(&mut out, &r, false, true);
        assert_eq!(
            out,
            b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\nx-a: 1\r\nconnection: close\r\n\r\n{}"
        );
        out.clear();
        write_simple(&mut out, &r, true, false);
        assert!(out.ends_with(b"x-a: 1\r\n\r\n"));
    }
}
