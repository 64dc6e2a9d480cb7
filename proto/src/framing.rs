//! gRPC's message framing and statuses, for both ends of a call (the gateway's client, the
//! simulator's server) and no runtime or HTTP/2 library: each end carries the bytes and the
//! `grpc-status` / `grpc-message` headers on its own h2.
//!
//! A message is a 1-byte compressed flag, a 4-byte big-endian length and the protobuf bytes.
//! `grpc-message` is percent-encoded UTF-8.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;

/// Largest message accepted either way unless a call says otherwise: a tokenizer bundle
/// chunk, a long prompt of token ids or a long completion fits (gRPC's usual default is
/// 4 MiB).
pub const MAX_MESSAGE: usize = 64 << 20;

/// How a message over the limit is reported (the start of its status message).
const TOO_LARGE: &str = "gRPC message too large";

/// The status says a message was over the receiver's limit (see [`Deframer`]).
pub fn too_large(s: &Status) -> bool {
    s.code == Code::RESOURCE_EXHAUSTED && s.message.starts_with(TOO_LARGE)
}

/// A gRPC status code (numbers and names from the gRPC spec).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Code(pub u32);

const NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

impl Code {
    pub const OK: Code = Code(0);
    pub const CANCELLED: Code = Code(1);
    pub const UNKNOWN: Code = Code(2);
    pub const INVALID_ARGUMENT: Code = Code(3);
    pub const DEADLINE_EXCEEDED: Code = Code(4);
    pub const NOT_FOUND: Code = Code(5);
    pub const PERMISSION_DENIED: Code = Code(7);
    pub const RESOURCE_EXHAUSTED: Code = Code(8);
    pub const FAILED_PRECONDITION: Code = Code(9);
    pub const ABORTED: Code = Code(10);
    pub const UNIMPLEMENTED: Code = Code(12);
    pub const INTERNAL: Code = Code(13);
    pub const UNAVAILABLE: Code = Code(14);
    pub const UNAUTHENTICATED: Code = Code(16);

    pub fn name(self) -> &'static str {
        NAMES.get(self.0 as usize).copied().unwrap_or("UNKNOWN")
    }

    /// A code by its spec name (`RESOURCE_EXHAUSTED`, any case) or number.
    pub fn parse(s: &str) -> Option<Code> {
        let s = s.trim();
        if let Ok(n) = s.parse::<u32>() {
            return (n < NAMES.len() as u32).then_some(Code(n));
        }
        NAMES.iter().position(|n| n.eq_ignore_ascii_case(s)).map(|i| Code(i as u32))
    }
}

/// A call's outcome other than OK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub message: String,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Status { code, message: message.into() }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.name(), self.message)
    }
}

/// One length-prefixed message.
pub fn frame<M: Message>(msg: &M) -> Bytes {
    let len = msg.encoded_len();
    let mut b = BytesMut::with_capacity(5 + len);
    b.put_u8(0);
    b.put_u32(len as u32);
    // Encoding into a buffer with room for `len` bytes cannot fail.
    let _ = msg.encode(&mut b);
    b.freeze()
}

/// Reassembles messages from DATA frames as they arrive. A message whose declared length is
/// over the limit is an error as soon as its 5-byte prefix is here: its bytes are never
/// gathered (what a caller pushed of them is dropped with the deframer).
pub struct Deframer {
    buf: BytesMut,
    limit: usize,
}

impl Default for Deframer {
    fn default() -> Self {
        Deframer { buf: BytesMut::new(), limit: MAX_MESSAGE }
    }
}

impl Deframer {
    /// Messages longer than `limit` bytes are refused from now on.
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
    }

    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole message, if one is buffered.
    pub fn next_message<M: Message + Default>(&mut self) -> Option<Result<M, Status>> {
        if self.buf.len() < 5 {
            return None;
        }
        if self.buf[0] != 0 {
            // Neither side asks for compression (no grpc-accept-encoding), so a compressed
            // message is the peer's protocol fault: INTERNAL, which the gateway maps to 500
            // (UNIMPLEMENTED would read as 501, an endpoint the engine lacks).
            return Some(Err(Status::new(Code::INTERNAL, "compressed gRPC messages are not supported")));
        }
        let len = self.declared();
        if len > self.limit {
            // RESOURCE_EXHAUSTED, as gRPC's own receivers report it.
            let why = format!("{TOO_LARGE}: {len} bytes declared, the limit is {}", self.limit);
            return Some(Err(Status::new(Code::RESOURCE_EXHAUSTED, why)));
        }
        if self.buf.len() < 5 + len {
            return None;
        }
        self.buf.advance(5);
        let body = self.buf.split_to(len);
        Some(M::decode(body).map_err(|e| Status::new(Code::INTERNAL, format!("undecodable message: {e}"))))
    }

    /// Bytes of a message still incomplete (a stream must not end with any).
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// A whole message (or a malformed prefix `next_message` will report) is buffered.
    pub fn has_message(&self) -> bool {
        self.buf.len() >= 5
            && (self.buf[0] != 0 || self.declared() > self.limit || self.buf.len() >= 5 + self.declared())
    }

    fn declared(&self) -> usize {
        u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize
    }
}

/// `grpc-message`'s encoding: printable ASCII other than '%' stays as it is.
pub fn percent_encode(s: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7E).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

pub fn percent_decode(v: &[u8]) -> String {
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if v[i] == b'%' && i + 2 < v.len() {
            if let (Some(h), Some(l)) = (hex(v[i + 1]), hex(v[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(v[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::AbortRequest;

    #[test]
    fn frames_round_trip_across_reads() {
        let m = AbortRequest { request_id: "r-1".into(), reason: "gone".into() };
        let f = frame(&m);
        assert_eq!(&f[..5], &[0, 0, 0, 0, 11]);
        let mut d = Deframer::default();
        d.push(&f[..3]);
        assert!(!d.has_message() && d.next_message::<AbortRequest>().is_none());
        d.push(&f[3..]);
        d.push(&f);
        assert!(d.has_message());
        assert_eq!(d.next_message::<AbortRequest>().unwrap().unwrap(), m);
        assert_eq!(d.next_message::<AbortRequest>().unwrap().unwrap(), m);
        assert_eq!(d.pending(), 0);
        let mut big = Deframer::default();
        big.push(&[0, 0xFF, 0xFF, 0xFF, 0xFF]);
        assert!(big.has_message());
        assert!(too_large(&big.next_message::<AbortRequest>().unwrap().unwrap_err()));
        let mut small = Deframer::default();
        small.set_limit(11);
        small.push(&f);
        assert_eq!(small.next_message::<AbortRequest>().unwrap().unwrap(), m);
        // Refused from the prefix and one byte of the message.
        small.push(&frame(&AbortRequest { request_id: "r-22".into(), reason: "gone".into() })[..6]);
        let s = small.next_message::<AbortRequest>().unwrap().unwrap_err();
        assert!(too_large(&s) && s.message.contains("12 bytes declared, the limit is 11"), "{s}");
    }

    #[test]
    fn codes_and_messages() {
        assert_eq!(Code::parse("RESOURCE_EXHAUSTED"), Some(Code::RESOURCE_EXHAUSTED));
        assert_eq!(Code::parse("unavailable"), Some(Code::UNAVAILABLE));
        assert_eq!(Code::parse("14"), Some(Code::UNAVAILABLE));
        assert_eq!(Code::parse("nope"), None);
        assert_eq!(Code::parse("99"), None);
        assert_eq!(Code(8).name(), "RESOURCE_EXHAUSTED");
        assert_eq!(percent_encode("50% off\n"), "50%25 off%0A");
        assert_eq!(percent_decode(b"50%25 full%0A"), "50% full\n");
        assert_eq!(Status::new(Code::INTERNAL, "x").to_string(), "INTERNAL: x");
    }
}
