//! HTTP/1.1 framing shared by the simulator (server side) and the load generator (client side): chunked coding and header helpers.
//!
//! Head parsing itself is `httparse`; chunked decoding and header values come from the
//! shared `smg-wire` crate (the gateway uses the same code); this module adds the encoding
//! side and the tools' own framing types.

use std::fmt;

pub use smg_wire::header::{has_token, trim};
pub use smg_wire::ChunkedDecoder;

/// How the body after a head is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// No body at all (GET without Content-Length, 204, 304, HEAD responses).
    Empty,
    /// Exactly this many bytes.
    Length { len: usize },
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Response body runs until the peer closes (no length, not chunked).
    UntilClose,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FramingError {
    BadContentLength,
}

impl fmt::Display for FramingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self {
            FramingError::BadContentLength => "invalid Content-Length",
        };
        f.write_str(what)
    }
}

impl std::error::Error for FramingError {}

/// The chunk that ends a chunked body.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Appends `data` as one chunk.
pub fn put_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        // An empty chunk would end the body.
        return;
    }
    put_hex(out, data.len());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Appends `n` in lowercase hex.
pub fn put_hex(out: &mut Vec<u8>, n: usize) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut tmp = [0u8; 16];
    let mut i = tmp.len();
    let mut v = n;
    loop {
        i -= 1;
        tmp[i] = DIGITS[v & 15];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[i..]);
}

/// Appends a decimal number.
pub fn put_u64(out: &mut Vec<u8>, n: u64) {
    let mut buf = itoa::Buffer::new();
    out.extend_from_slice(buf.format(n).as_bytes());
}

/// Parses a Content-Length value: digits only, no sign, no list.
pub fn parse_content_length(value: &[u8]) -> Result<usize, FramingError> {
    smg_wire::header::parse_content_length(value)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or(FramingError::BadContentLength)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_split(input: &[u8], split: usize) -> (Vec<u8>, usize, bool) {
        let mut dec = ChunkedDecoder::new();
        let mut out = Vec::new();
        let a = dec.decode(&input[..split], |d| out.extend_from_slice(d)).unwrap();
        let mut consumed = a;
        if !dec.is_done() {
            consumed += dec.decode(&input[split..], |d| out.extend_from_slice(d)).unwrap();
        }
        (out, consumed, dec.is_done())
    }

    #[test]
    fn chunked_at_every_split() {
        let body = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT";
        for split in 0..=body.len() {
            let (out, consumed, done) = decode_split(body, split);
            assert_eq!(out, b"hello, world", "split {split}");
            assert!(done, "split {split}");
            assert_eq!(&body[consumed..], b"NEXT", "split {split}");
        }
    }

    #[test]
    fn chunked_rejects_garbage() {
        assert!(ChunkedDecoder::new().decode(b"zz\r\n", |_| {}).is_err());
        assert!(ChunkedDecoder::new().decode(b"2\r\nabX", |_| {}).is_err());
        assert!(ChunkedDecoder::new().decode(b"ffffffffffffffff\r\n", |_| {}).is_err());
    }

    #[test]
    fn encode_roundtrip() {
        let mut out = Vec::new();
        put_chunk(&mut out, &[b'a'; 300]);
        put_chunk(&mut out, b"");
        out.extend_from_slice(LAST_CHUNK);
        assert!(out.starts_with(b"12c\r\n"));
        let mut dec = ChunkedDecoder::new();
        let mut got = Vec::new();
        let n = dec.decode(&out, |d| got.extend_from_slice(d)).unwrap();
        assert_eq!(n, out.len());
        assert_eq!(got.len(), 300);
    }

    #[test]
    fn header_helpers() {
        assert_eq!(parse_content_length(b" 42 ").unwrap(), 42);
        assert!(parse_content_length(b"-1").is_err());
        assert!(parse_content_length(b"1,2").is_err());
        assert!(has_token(b"keep-alive, Close", b"close"));
        assert!(!has_token(b"keep-alive", b"close"));
        let mut v = Vec::new();
        put_hex(&mut v, 0);
        put_hex(&mut v, 255);
        assert_eq!(v, b"0ff");
    }
}
