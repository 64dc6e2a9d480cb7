//! HTTP/1.1 framing shared by the simulator (server side) and the load generator (client side): chunked coding and header helpers.
//!
//! Head parsing itself is `httparse`; this module covers what httparse leaves out: body
//! framing (RFC 9112 §6–7) and the few header values both sides interpret.

use std::fmt;

/// Largest chunk-size line we accept, in hex digits (2^60 bytes is far beyond any body).
const MAX_CHUNK_SIZE_DIGITS: u8 = 15;

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
    BadChunkSize,
    BadChunkDelimiter,
    BadContentLength,
}

impl fmt::Display for FramingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self {
            FramingError::BadChunkSize => "invalid chunk size line",
            FramingError::BadChunkDelimiter => "missing CRLF after chunk data",
            FramingError::BadContentLength => "invalid Content-Length",
        };
        f.write_str(what)
    }
}

impl std::error::Error for FramingError {}

/// One state per step of the chunked grammar:
/// `chunk = chunk-size [ chunk-ext ] CRLF chunk-data CRLF`, ended by `0 CRLF *(trailer CRLF) CRLF`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChunkState {
    Size {
        value: u64,
        digits: u8,
    },
    Extension {
        value: u64,
    },
    SizeLf {
        value: u64,
    },
    Data {
        remaining: u64,
    },
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    TrailerLine,
    EndLf,
    Done,
}

/// Incremental decoder for a chunked body: feed it whatever arrived, it reports payload slices as they complete.
#[derive(Clone, Debug)]
pub struct ChunkedDecoder {
    state: ChunkState,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

// === impl ChunkedDecoder ===

impl ChunkedDecoder {
    pub fn new() -> Self {
        Self { state: ChunkState::Size { value: 0, digits: 0 } }
    }

    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Consumes framing from `input`, handing payload bytes to `sink`; returns bytes consumed.
    ///
    /// Stops early only at the end of the body, so a return value below `input.len()` means the
    /// rest belongs to the next message.
    pub fn decode(&mut self, input: &[u8], mut sink: impl FnMut(&[u8])) -> Result<usize, FramingError> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            self.state = match self.state {
                ChunkState::Size { value, digits } => match hex_val(b) {
                    Some(v) => {
                        if digits >= MAX_CHUNK_SIZE_DIGITS {
                            return Err(FramingError::BadChunkSize);
                        }
                        ChunkState::Size { value: value * 16 + v as u64, digits: digits + 1 }
                    }
                    None if digits == 0 => return Err(FramingError::BadChunkSize),
                    None => match b {
                        b';' | b' ' | b'\t' => ChunkState::Extension { value },
                        b'\r' => ChunkState::SizeLf { value },
                        // Bare LF is tolerated, as most servers do.
                        b'\n' => after_size(value),
                        _ => return Err(FramingError::BadChunkSize),
                    },
                },
                ChunkState::Extension { value } => match b {
                    b'\r' => ChunkState::SizeLf { value },
                    b'\n' => after_size(value),
                    _ => ChunkState::Extension { value },
                },
                ChunkState::SizeLf { value } => match b {
                    b'\n' => after_size(value),
                    _ => return Err(FramingError::BadChunkSize),
                },
                ChunkState::Data { remaining } => {
                    let avail = (input.len() - i) as u64;
                    let take = remaining.min(avail) as usize;
                    sink(&input[i..i + take]);
                    i += take;
                    let left = remaining - take as u64;
                    self.state = if left == 0 { ChunkState::DataCr } else { ChunkState::Data { remaining: left } };
                    continue;
                }
                ChunkState::DataCr => match b {
                    b'\r' => ChunkState::DataLf,
                    b'\n' => ChunkState::Size { value: 0, digits: 0 },
                    _ => return Err(FramingError::BadChunkDelimiter),
                },
                ChunkState::DataLf => match b {
                    b'\n' => ChunkState::Size { value: 0, digits: 0 },
                    _ => return Err(FramingError::BadChunkDelimiter),
                },
                ChunkState::TrailerStart => match b {
                    b'\r' => ChunkState::EndLf,
                    b'\n' => ChunkState::Done,
                    _ => ChunkState::TrailerLine,
                },
                ChunkState::TrailerLine => match b {
                    b'\n' => ChunkState::TrailerStart,
                    _ => ChunkState::TrailerLine,
                },
                ChunkState::EndLf => match b {
                    b'\n' => ChunkState::Done,
                    _ => return Err(FramingError::BadChunkDelimiter),
                },
                ChunkState::Done => return Ok(i),
            };
            i += 1;
            if self.state == ChunkState::Done {
                return Ok(i);
            }
        }
        Ok(i)
    }
}

fn after_size(value: u64) -> ChunkState {
    if value == 0 {
        ChunkState::TrailerStart
    } else {
        ChunkState::Data { remaining: value }
    }
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

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
    let v = trim(value);
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return Err(FramingError::BadContentLength);
    }
    Ok(v.iter().fold(0usize, |acc, d| acc * 10 + (d - b'0') as usize))
}

/// True when a comma-separated header value lists `token` (case-insensitive), e.g. `Connection: keep-alive, close`.
pub fn has_token(value: &[u8], token: &[u8]) -> bool {
    value.split(|&b| b == b',').any(|part| trim(part).eq_ignore_ascii_case(token))
}

pub fn trim(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |e| e + 1);
    &v[start..end]
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
