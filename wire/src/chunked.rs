//! Chunked transfer coding (RFC 9112 §7.1): one state machine for every direction, and
//! the one encoder ([`put_chunk`]) for bodies the gateway frames itself.
//!
//! The gateway decodes request bodies into a buffer (the worker receives the same payload
//! bytes with a Content-Length) and scans worker responses without output, only to find where
//! the message ends while the raw bytes are relayed untouched. The simulator and the load
//! generator decode through a sink.

/// Appends `data` as one chunk (nothing for empty data: an empty chunk would end the body).
pub fn put_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    crate::num::put_hex(out, data.len() as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Longest chunk extension we skip before calling the framing malformed.
const MAX_EXTENSION: usize = 1024;
/// Most hex digits in a chunk size, leading zeros included.
const MAX_SIZE_DIGITS: u8 = 32;
/// Largest trailer section we skip.
const MAX_TRAILERS: usize = 8 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Hex digits of the chunk size; `digits` counts them to cap the value.
    Size {
        size: u64,
        digits: u8,
    },
    /// Optional whitespace after the size, before `;` or CR.
    SizeWs {
        size: u64,
    },
    /// Skipping a chunk extension up to CR.
    Extension {
        size: u64,
    },
    /// CR seen after the size line, expecting LF.
    SizeLf {
        size: u64,
    },
    /// Inside chunk data.
    Data {
        remaining: u64,
    },
    /// Expecting CR after chunk data.
    DataCr,
    /// Expecting LF after chunk data.
    DataLf,
    /// At the start of a trailer line (or the final CRLF).
    TrailerStart,
    /// Inside a trailer field line.
    TrailerLine,
    /// CR seen at the end of a trailer line.
    TrailerLf,
    /// CR of the final empty line seen, expecting LF.
    EndLf,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkError(pub &'static str);

impl std::fmt::Display for ChunkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for ChunkError {}

#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    ext_len: usize,
    trailer_len: usize,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

// === impl ChunkedDecoder ===

impl ChunkedDecoder {
    pub fn new() -> Self {
        Self { state: State::Size { size: 0, digits: 0 }, ext_len: 0, trailer_len: 0 }
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes framing from `input`, appending chunk data to `out` when given.
    /// Returns how many bytes of `input` belong to this message (it stops at the end).
    pub fn feed(&mut self, input: &[u8], out: Option<&mut Vec<u8>>) -> Result<usize, ChunkError> {
        match out {
            Some(out) => self.decode(input, |d| out.extend_from_slice(d)),
            None => self.decode(input, |_| {}),
        }
    }

    /// Consumes framing from `input`, handing each run of chunk data to `sink`.
    /// Returns how many bytes of `input` belong to this message (it stops at the end).
    pub fn decode(&mut self, input: &[u8], mut sink: impl FnMut(&[u8])) -> Result<usize, ChunkError> {
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            self.state = match self.state {
                State::Size { size, digits } => match hex(b) {
                    Some(d) => {
                        // Leading zeros are legal (RFC 9112 §7.1): the cap is on the value,
                        // plus a bound on the digits so a line of zeros cannot run forever.
                        if size >= 1 << 56 {
                            return Err(ChunkError("chunk size too large"));
                        }
                        if digits >= MAX_SIZE_DIGITS {
                            return Err(ChunkError("chunk size line too long"));
                        }
                        State::Size { size: size << 4 | u64::from(d), digits: digits + 1 }
                    }
                    None if digits == 0 => return Err(ChunkError("missing chunk size")),
                    None => after_size(b, size)?,
                },
                State::SizeWs { size } => after_size(b, size)?,
                State::Extension { size } => {
                    self.ext_len += 1;
                    if self.ext_len > MAX_EXTENSION {
                        return Err(ChunkError("chunk extension too long"));
                    }
                    match b {
                        b'\r' => State::SizeLf { size },
                        b'\n' => return Err(ChunkError("bare LF in chunk line")),
                        _ => State::Extension { size },
                    }
                }
                State::SizeLf { size } => {
                    if b != b'\n' {
                        return Err(ChunkError("expected LF after chunk size"));
                    }
                    self.ext_len = 0;
                    if size == 0 {
                        State::TrailerStart
                    } else {
                        State::Data { remaining: size }
                    }
                }
                State::Data { remaining } => {
                    let take = remaining.min((input.len() - i) as u64) as usize;
                    if take > 0 {
                        sink(&input[i..i + take]);
                    }
                    i += take;
                    let left = remaining - take as u64;
                    self.state = if left == 0 { State::DataCr } else { State::Data { remaining: left } };
                    continue;
                }
                State::DataCr if b == b'\r' => State::DataLf,
                State::DataLf if b == b'\n' => State::Size { size: 0, digits: 0 },
                State::DataCr | State::DataLf => return Err(ChunkError("missing CRLF after chunk data")),
                State::TrailerStart => match b {
                    b'\r' => State::EndLf,
                    b'\n' => return Err(ChunkError("bare LF in trailer")),
                    _ => self.trailer_byte(State::TrailerLine)?,
                },
                State::TrailerLine => match b {
                    b'\r' => self.trailer_byte(State::TrailerLf)?,
                    b'\n' => return Err(ChunkError("bare LF in trailer")),
                    _ => self.trailer_byte(State::TrailerLine)?,
                },
                State::TrailerLf if b == b'\n' => self.trailer_byte(State::TrailerStart)?,
                State::TrailerLf => return Err(ChunkError("expected LF in trailer")),
                State::EndLf if b == b'\n' => {
                    self.state = State::Done;
                    return Ok(i + 1);
                }
                State::EndLf => return Err(ChunkError("expected final LF")),
                State::Done => return Ok(i),
            };
            i += 1;
        }
        Ok(i)
    }

    fn trailer_byte(&mut self, next: State) -> Result<State, ChunkError> {
        self.trailer_len += 1;
        if self.trailer_len > MAX_TRAILERS {
            return Err(ChunkError("trailers too large"));
        }
        Ok(next)
    }
}

fn after_size(b: u8, size: u64) -> Result<State, ChunkError> {
    match b {
        b' ' | b'\t' => Ok(State::SizeWs { size }),
        b';' => Ok(State::Extension { size }),
        b'\r' => Ok(State::SizeLf { size }),
        _ => Err(ChunkError("invalid chunk size line")),
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WIRE: &[u8] = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-T: 1\r\n\r\nNEXT";

    #[test]
    fn the_encoder_writes_what_the_decoder_reads() {
        let mut wire = Vec::new();
        for piece in [&b"hello"[..], b"", &[7u8; 300][..]] {
            put_chunk(&mut wire, piece);
        }
        assert!(wire.starts_with(b"5\r\nhello\r\n12c\r\n"), "{:?}", String::from_utf8_lossy(&wire[..12]));
        wire.extend_from_slice(b"0\r\n\r\n");
        let (mut d, mut out) = (ChunkedDecoder::new(), Vec::new());
        assert_eq!(d.feed(&wire, Some(&mut out)).unwrap(), wire.len());
        assert!(d.is_done());
        assert_eq!(out.len(), 305);
    }

    #[test]
    fn decodes_split_at_every_offset() {
        for cut in 0..=WIRE.len() - 4 {
            let mut d = ChunkedDecoder::new();
            let mut out = Vec::new();
            let a = d.feed(&WIRE[..cut], Some(&mut out)).unwrap();
            assert_eq!(a, cut);
            let b = d.feed(&WIRE[cut..], Some(&mut out)).unwrap();
            assert!(d.is_done());
            assert_eq!(out, b"hello world");
            assert_eq!(&WIRE[cut + b..], b"NEXT", "cut {cut}");
        }
    }

    #[test]
    fn byte_by_byte() {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        let mut used = 0;
        for b in WIRE {
            used += d.feed(std::slice::from_ref(b), Some(&mut out)).unwrap();
            if d.is_done() {
                break;
            }
        }
        assert_eq!(used, WIRE.len() - 4);
        assert_eq!(out, b"hello world");
    }

    #[test]
    fn scan_without_output() {
        let mut d = ChunkedDecoder::new();
        let n = d.feed(WIRE, None).unwrap();
        assert!(d.is_done());
        assert_eq!(n, WIRE.len() - 4);
    }

    #[test]
    fn rejects_bad_framing() {
        for bad in
            [&b"x\r\n"[..], b"\r\n", b"5\nhello", b"5\r\nhelloXX", b"5 x\r\n", b"ffffffffffffffffff\r\n", b"0\r\nX\n"]
        {
            let mut d = ChunkedDecoder::new();
            assert!(d.feed(bad, None).is_err(), "{bad:?}");
        }
        let mut d = ChunkedDecoder::new();
        let ext = [b"1;".to_vec(), vec![b'a'; MAX_EXTENSION + 1]].concat();
        assert!(d.feed(&ext, None).is_err());
    }

    #[test]
    fn leading_zeros_are_sizes_too() {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        let wire = b"0005\r\nhello\r\n0000000000000000000000001\r\n!\r\n000\r\n\r\n";
        assert_eq!(d.feed(wire, Some(&mut out)).unwrap(), wire.len());
        assert!(d.is_done());
        assert_eq!(out, b"hello!");
        let mut d = ChunkedDecoder::new();
        let zeros = [vec![b'0'; MAX_SIZE_DIGITS as usize + 1], b"5\r\n".to_vec()].concat();
        assert!(d.feed(&zeros, None).is_err());
        // 2^60 does not fit the cap; 2^56 - 1 does.
        assert!(ChunkedDecoder::new().feed(b"1000000000000000\r\n", None).is_err());
        assert!(ChunkedDecoder::new().feed(b"00ffffffffffffff\r\n", None).is_ok());
    }
}
