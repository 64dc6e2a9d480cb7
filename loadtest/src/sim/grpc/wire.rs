//! gRPC over HTTP/2, the server's half: length-prefixed messages, status codes and trailers.
//!
//! A message is a 1-byte compressed flag, a 4-byte big-endian length and the protobuf bytes.
//! The outcome travels in trailers (`grpc-status`, `grpc-message`); a call that fails before
//! any message answers "trailers only": one HEADERS frame carrying the status, ending the stream.

use bytes::{BufMut, Bytes, BytesMut};
use h2::RecvStream;
use http::{HeaderMap, HeaderValue, Response};
use prost::Message;

/// gRPC status codes the simulator answers with (numbers from the gRPC spec).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

// === impl Code ===

impl Code {
    /// The code an HTTP status stands for, as gRPC's own HTTP-to-gRPC mapping has it (extended to
    /// the statuses the simulator's --fail-status tests use).
    pub fn from_http(status: u16) -> Code {
        match status {
            400 | 413 | 422 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::NotFound,
            408 | 504 => Code::DeadlineExceeded,
            409 => Code::Aborted,
            412 => Code::FailedPrecondition,
            429 => Code::ResourceExhausted,
            501 => Code::Unimplemented,
            502 | 503 => Code::Unavailable,
            499 => Code::Cancelled,
            500 => Code::Internal,
            _ => Code::Unknown,
        }
    }

    /// Parses a code by its spec name (`RESOURCE_EXHAUSTED`, any case) or number.
    pub fn parse(s: &str) -> Option<Code> {
        const ALL: [(Code, &str); 14] = [
            (Code::Ok, "ok"),
            (Code::Cancelled, "cancelled"),
            (Code::Unknown, "unknown"),
            (Code::InvalidArgument, "invalid_argument"),
            (Code::DeadlineExceeded, "deadline_exceeded"),
            (Code::NotFound, "not_found"),
            (Code::PermissionDenied, "permission_denied"),
            (Code::ResourceExhausted, "resource_exhausted"),
            (Code::FailedPrecondition, "failed_precondition"),
            (Code::Aborted, "aborted"),
            (Code::Unimplemented, "unimplemented"),
            (Code::Internal, "internal"),
            (Code::Unavailable, "unavailable"),
            (Code::Unauthenticated, "unauthenticated"),
        ];
        let lower = s.trim().to_ascii_lowercase();
        ALL.iter().find(|(c, name)| *name == lower || (*c as u32).to_string() == lower).map(|(c, _)| *c)
    }
}

/// A call's outcome other than OK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub message: String,
}

// === impl Status ===

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
}

/// Largest request message accepted (gRPC's usual default is 4 MiB; prompts of token ids fit).
pub const MAX_MESSAGE: usize = 64 << 20;

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

/// Reads the request body (a unary or server-streaming call carries exactly one message) and
/// decodes it; flow-control credit is returned as data arrives so large prompts never stall.
pub async fn read_request<M: Message + Default>(body: &mut RecvStream) -> Result<M, Status> {
    let mut buf = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| Status::new(Code::Cancelled, format!("request body: {e}")))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        if buf.len() + chunk.len() > MAX_MESSAGE + 5 {
            return Err(Status::new(Code::ResourceExhausted, "request message larger than 64 MiB"));
        }
        buf.extend_from_slice(&chunk);
    }
    if buf.len() < 5 {
        return Err(Status::new(Code::Internal, "request without a message"));
    }
    if buf[0] != 0 {
        return Err(Status::new(Code::Unimplemented, "compressed messages are not supported"));
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if buf.len() != 5 + len {
        return Err(Status::new(Code::Internal, "request body is not exactly one message"));
    }
    M::decode(&buf[5..]).map_err(|e| Status::new(Code::Internal, format!("undecodable request: {e}")))
}

/// Response headers of a call that will send messages.
pub fn response_head() -> Response<()> {
    let mut r = Response::new(());
    r.headers_mut().insert("content-type", HeaderValue::from_static("application/grpc"));
    r
}

/// Trailers ending a call with `status` (None: OK).
pub fn trailers(status: Option<&Status>) -> HeaderMap {
    let mut h = HeaderMap::new();
    put_status(&mut h, status);
    h
}

/// The single HEADERS frame of a call that fails before any message.
pub fn trailers_only(status: &Status) -> Response<()> {
    let mut r = response_head();
    put_status(r.headers_mut(), Some(status));
    r
}

fn put_status(h: &mut HeaderMap, status: Option<&Status>) {
    let code = status.map_or(Code::Ok, |s| s.code) as u32;
    h.insert("grpc-status", HeaderValue::from(code));
    if let Some(s) = status.filter(|s| !s.message.is_empty()) {
        if let Ok(v) = HeaderValue::from_str(&percent_encode(&s.message)) {
            h.insert("grpc-message", v);
        }
    }
}

/// grpc-message is percent-encoded UTF-8: printable ASCII other than '%' stays as it is.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7E).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_length_prefixed() {
        let m = smg_proto::scheduler::AbortRequest { request_id: "r".into(), reason: String::new() };
        let f = frame(&m);
        assert_eq!(&f[..5], &[0, 0, 0, 0, 3]);
        assert_eq!(smg_proto::scheduler::AbortRequest::decode(&f[5..]).unwrap(), m);
    }

    #[test]
    fn codes_and_messages() {
        assert_eq!(Code::from_http(429), Code::ResourceExhausted);
        assert_eq!(Code::from_http(503), Code::Unavailable);
        assert_eq!(Code::from_http(400), Code::InvalidArgument);
        assert_eq!(Code::parse("RESOURCE_EXHAUSTED"), Some(Code::ResourceExhausted));
        assert_eq!(Code::parse("14"), Some(Code::Unavailable));
        assert_eq!(Code::parse("nope"), None);
        assert_eq!(percent_encode("50% off\n"), "50%25 off%0A");
        let t = trailers(Some(&Status::new(Code::InvalidArgument, "bad")));
        assert_eq!(t["grpc-status"], "3");
        assert_eq!(t["grpc-message"], "bad");
    }
}
