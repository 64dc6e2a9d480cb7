//! gRPC over HTTP/2, the client's half, with no runtime in it (the control thread drives h2
//! on tokio, shards on monoio): the request head, the call's status from
//! `grpc-status`/`grpc-message`, and what a status means to an HTTP client. The framing and
//! status types both ends share are `smg_proto::framing`.

use http::{HeaderMap, Request};
pub use smg_proto::framing::{frame, too_large, Code, Deframer, Status, MAX_MESSAGE};

/// The HTTP status a client gets for an engine that did not start generation: the
/// contract's mapping (invalid argument 400, resource exhausted 429, unavailable 503,
/// deadline exceeded 504, internal 500), and gRPC's own HTTP table for the rest.
pub fn http_status(code: Code) -> u16 {
    match code.0 {
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

/// The connection or stream failed under the call.
pub fn transport(e: impl std::fmt::Display) -> Status {
    Status::new(Code::UNAVAILABLE, format!("transport: {e}"))
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

/// The call's status from trailers (or a trailers-only response head); None when absent.
pub fn status_of(h: &HeaderMap) -> Option<Result<(), Status>> {
    let code: u32 = h.get("grpc-status")?.to_str().ok()?.trim().parse().ok()?;
    if code == 0 {
        return Some(Ok(()));
    }
    let message = h.get("grpc-message").map(|v| smg_proto::framing::percent_decode(v.as_bytes())).unwrap_or_default();
    Some(Err(Status::new(Code(code), message)))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert_eq!(http_status(Code(c)), want, "{c}");
        }
    }
}
