//! gRPC over HTTP/2, the client's half, with no runtime in it (the control thread drives h2
//! on tokio, shards on monoio): length-prefixed messages, the request head, and the call's
//! status from `grpc-status`/`grpc-message`.
//!
//! A message is a 1-byte compressed flag, a 4-byte big-endian length and the protobuf bytes.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, Request};
use prost::Message;

/// Largest response message accepted: a tokenizer bundle chunk or a long completion fits.
pub const MAX_MESSAGE: usize = 64 << 20;

/// gRPC status codes (numbers from the gRPC spec) the gateway tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Code(pub u32);

impl Code {
    pub const OK: Code = Code(0);
    pub const CANCELLED: Code = Code(1);
    pub const UNKNOWN: Code = Code(2);
    pub const INVALID_ARGUMENT: Code = Code(3);
    pub const DEADLINE_EXCEEDED: Code = Code(4);
    pub const RESOURCE_EXHAUSTED: Code = Code(8);
    pub const UNIMPLEMENTED: Code = Code(12);
    pub const INTERNAL: Code = Code(13);
    pub const UNAVAILABLE: Code = Code(14);

    /// The HTTP status a client gets for an engine that did not start generation: the
    /// contract's mapping (invalid argument 400, resource exhausted 429, unavailable 503,
    /// deadline exceeded 504, internal 500), and gRPC's own HTTP table for the rest.
    pub fn http_status(self) -> u16 {
        match self.0 {
            3 | 9 | 11 => 400, // INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE
            4 => 504,
            5 => 404,
            7 => 403,
            8 => 429,
            10 => 409,
            12 => 501,
            14 => 503,
            16 => 401,
            1 => 499,
            _ => 500,
        }
    }

    pub fn name(self) -> &'static str {
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
        NAMES.get(self.0 as usize).copied().unwrap_or("UNKNOWN")
    }
}

/// A call's outcome other than OK (or a transport failure, as UNAVAILABLE/INTERNAL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub message: String,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Status { code, message: message.into() }
    }

    /// The connection or stream failed under the call.
    pub fn transport(e: impl std::fmt::Display) -> Self {
        Status::new(Code::UNAVAILABLE, format!("transport: {e}"))
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.name(), self.message)
    }
}

/// The request head of a call to `path` on `authority`.
pub fn request(authority: &str, path: &str) -> Request<()> {
    let mut r = Request::new(());
    *r.method_mut() = http::Method::POST;
    *r.uri_mut() = http::Uri::builder()
        .scheme("http")
        .authority(authority)
        .path_and_query(path)
        .build()
        .unwrap_or_else(|_| http::Uri::from_static("http://localhost/"));
    let h = r.headers_mut();
    h.insert("content-type", http::HeaderValue::from_static("application/grpc"));
    h.insert("te", http::HeaderValue::from_static("trailers"));
    r
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

/// Reassembles messages from DATA frames as they arrive.
#[derive(Default)]
pub struct Deframer {
    buf: BytesMut,
}

impl Deframer {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole message, if one is buffered.
    pub fn next_message<M: Message + Default>(&mut self) -> Option<Result<M, Status>> {
        if self.buf.len() < 5 {
            return None;
        }
        if self.buf[0] != 0 {
            return Some(Err(Status::new(Code::INTERNAL, "compressed gRPC messages are not supported")));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_MESSAGE {
            return Some(Err(Status::new(Code::RESOURCE_EXHAUSTED, "gRPC message over 64 MiB")));
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
            && (self.buf[0] != 0
                || self.buf.len()
                    >= 5 + u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize)
    }
}

/// The call's status from trailers (or a trailers-only response head); None when absent.
pub fn status_of(h: &HeaderMap) -> Option<Result<(), Status>> {
    let code: u32 = h.get("grpc-status")?.to_str().ok()?.trim().parse().ok()?;
    if code == 0 {
        return Some(Ok(()));
    }
    let message = h.get("grpc-message").map(|v| percent_decode(v.as_bytes())).unwrap_or_default();
    Some(Err(Status::new(Code(code), message)))
}

/// grpc-message is percent-encoded UTF-8.
fn percent_decode(v: &[u8]) -> String {
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
    use smg_proto::scheduler::AbortRequest;

    #[test]
    fn frames_round_trip_across_reads() {
        let m = AbortRequest { request_id: "r-1".into(), reason: "gone".into() };
        let f = frame(&m);
        let mut d = Deframer::default();
        d.push(&f[..3]);
        assert!(d.next_message::<AbortRequest>().is_none());
        d.push(&f[3..]);
        d.push(&f);
        assert_eq!(d.next_message::<AbortRequest>().unwrap().unwrap(), m);
        assert_eq!(d.next_message::<AbortRequest>().unwrap().unwrap(), m);
        assert_eq!(d.pending(), 0);
    }

    #[test]
    fn statuses_map_to_the_contracts_http_statuses() {
        let mut h = HeaderMap::new();
        assert!(status_of(&h).is_none());
        h.insert("grpc-status", "8".parse().unwrap());
        h.insert("grpc-message", "50%25 full%0A".parse().unwrap());
        let s = status_of(&h).unwrap().unwrap_err();
        assert_eq!((s.code, s.message.as_str()), (Code::RESOURCE_EXHAUSTED, "50% full\n"));
        let codes = [(3, 400), (8, 429), (14, 503), (4, 504), (13, 500), (2, 500)];
        for (c, want) in codes {
            assert_eq!(Code(c).http_status(), want, "{c}");
        }
    }
}
