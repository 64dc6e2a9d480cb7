//! gRPC over HTTP/2, the server's half: the request's one message, the response head and
//! trailers (the framing and status types both ends share are `smg_proto::framing`).
//! The outcome travels in trailers (`grpc-status`, `grpc-message`); a call that fails before
//! any message answers "trailers only": one HEADERS frame carrying the status, ending the stream.

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::{HeaderMap, HeaderValue, Response};
use prost::Message;
pub use smg_proto::framing::{frame, Code, Status, MAX_MESSAGE};
use smg_proto::framing::{percent_encode, Deframer};

/// The code an HTTP status stands for, as gRPC's own HTTP-to-gRPC mapping has it (extended to
/// the statuses the simulator's --fail-status tests use).
pub fn code_for_http(status: u16) -> Code {
    match status {
        400 | 413 | 422 => Code::INVALID_ARGUMENT,
        401 => Code::UNAUTHENTICATED,
        403 => Code::PERMISSION_DENIED,
        404 => Code::NOT_FOUND,
        408 | 504 => Code::DEADLINE_EXCEEDED,
        409 => Code::ABORTED,
        412 => Code::FAILED_PRECONDITION,
        429 => Code::RESOURCE_EXHAUSTED,
        501 => Code::UNIMPLEMENTED,
        502 | 503 => Code::UNAVAILABLE,
        499 => Code::CANCELLED,
        500 => Code::INTERNAL,
        _ => Code::UNKNOWN,
    }
}

/// Reads the request body (a unary or server-streaming call carries exactly one message) and
/// decodes it; flow-control credit is returned as data arrives so large prompts never stall.
pub async fn read_request<M: Message + Default>(body: &mut RecvStream) -> Result<M, Status> {
    let mut d = Deframer::default();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| Status::new(Code::CANCELLED, format!("request body: {e}")))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        if d.pending() + chunk.len() > MAX_MESSAGE + 5 {
            return Err(Status::new(Code::RESOURCE_EXHAUSTED, "request message larger than 64 MiB"));
        }
        d.push(&chunk);
    }
    let m = d.next_message::<M>().ok_or_else(|| Status::new(Code::INTERNAL, "request without a message"))??;
    if d.pending() != 0 {
        return Err(Status::new(Code::INTERNAL, "request body is not exactly one message"));
    }
    Ok(m)
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

/// Ends a call with `status` and no message ("trailers only").
pub fn reject(mut respond: SendResponse<Bytes>, status: &Status) {
    let _ = respond.send_response(trailers_only(status), true);
}

fn put_status(h: &mut HeaderMap, status: Option<&Status>) {
    let code = status.map_or(Code::OK, |s| s.code).0;
    h.insert("grpc-status", HeaderValue::from(code));
    if let Some(s) = status.filter(|s| !s.message.is_empty()) {
        if let Ok(v) = HeaderValue::from_str(&percent_encode(&s.message)) {
            h.insert("grpc-message", v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages() {
        assert_eq!(code_for_http(429), Code::RESOURCE_EXHAUSTED);
        assert_eq!(code_for_http(503), Code::UNAVAILABLE);
        assert_eq!(code_for_http(400), Code::INVALID_ARGUMENT);
        let t = trailers(Some(&Status::new(Code::INVALID_ARGUMENT, "50% bad")));
        assert_eq!(t["grpc-status"], "3");
        assert_eq!(t["grpc-message"], "50%25 bad");
    }
}
