//! The Realtime API's REST routes: where each one carries its model (SMG's request types),
//! read without changing the body, which is forwarded as received.
//!
//! - `sessions`, `transcription_sessions`: the body's `model`.
//! - `client_secrets`: `session.model`.
//! - `calls`: an `application/sdp` offer names it in the `model` query parameter; a
//!   `multipart/form-data` body in the `model` of its `session` part (JSON), next to its
//!   `sdp` part. Either way the offer must start `v=0`, as SMG checks before anything else.

use std::ops::Range;

use sonic_rs::JsonValueTrait;

use super::error::ApiError;
use crate::http::multipart::{form_boundary, Event, FormReader};

pub const CALLS: &str = "/v1/realtime/calls";
pub const CLIENT_SECRETS: &str = "/v1/realtime/client_secrets";

/// Where the model of a JSON realtime body is.
pub fn model_path(path: &str) -> &'static [&'static str] {
    if path == CLIENT_SECRETS {
        &["session", "model"]
    } else {
        &["model"]
    }
}

/// The model of a `/v1/realtime/calls` request (SMG's codes and messages on refusal).
pub fn calls_model(content_type: Option<&[u8]>, body: &[u8], query_model: Option<&str>) -> Result<String, ApiError> {
    let ct = content_type.unwrap_or(b"");
    let mime = ct.split(|&b| b == b';').next().unwrap_or(b"").trim_ascii();
    if mime.eq_ignore_ascii_case(b"application/sdp") {
        let model = query_model.map(str::trim).unwrap_or("");
        if model.is_empty() {
            return Err(bad("missing_model", "query parameter 'model' is required for application/sdp requests"));
        }
        check_sdp(body)?;
        return Ok(model.to_owned());
    }
    if !mime.eq_ignore_ascii_case(b"multipart/form-data") {
        return Err(bad("invalid_content_type", "Expected Content-Type: multipart/form-data or application/sdp"));
    }
    let boundary =
        form_boundary(ct).ok_or_else(|| bad("invalid_multipart", "Missing or invalid multipart boundary"))?;
    let parts = form_parts(boundary, body)?;
    let sdp = parts.sdp.ok_or_else(|| bad("missing_sdp", "multipart 'sdp' field is required"))?;
    check_sdp(&body[sdp])?;
    let model = match parts.session {
        None => None,
        Some(r) => {
            let part = &body[r];
            if let Err(e) = crate::bounded_json::check(part) {
                return Err(bad("invalid_session_json", format!("Invalid JSON in 'session' field: {e}")));
            }
            match sonic_rs::get(part, &["model"]) {
                Ok(v) => v.as_str().map(|m| m.trim().to_owned()),
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(bad("invalid_session_json", format!("Invalid JSON in 'session' field: {e}"))),
            }
        }
    };
    match model {
        Some(m) if !m.is_empty() => Ok(m),
        _ => Err(bad("missing_model", "session.model is required")),
    }
}

fn bad(code: &'static str, msg: impl Into<String>) -> ApiError {
    ApiError::new(400, code, msg)
}

fn check_sdp(sdp: &[u8]) -> Result<(), ApiError> {
    let text = std::str::from_utf8(sdp).map_err(|_| bad("invalid_sdp", "SDP is not valid UTF-8"))?;
    if !text.starts_with("v=0") {
        return Err(bad("invalid_sdp", "SDP offer must start with 'v=0'"));
    }
    Ok(())
}

#[derive(Default)]
struct CallParts {
    sdp: Option<Range<usize>>,
    session: Option<Range<usize>>,
}

/// The `sdp` and `session` parts of a calls form, as ranges of the body (the last of each).
fn form_parts(boundary: &[u8], body: &[u8]) -> Result<CallParts, ApiError> {
    #[derive(Clone, Copy, PartialEq)]
    enum Part {
        Sdp,
        Session,
        Other,
    }
    let mut reader = FormReader::new(boundary);
    let mut got = CallParts::default();
    let mut part = Part::Other;
    let mut sink = |e: Event<'_>| {
        match e {
            Event::Part { name, .. } => {
                part = match name.unwrap_or(b"") {
                    b"sdp" => Part::Sdp,
                    b"session" => Part::Session,
                    _ => Part::Other,
                }
            }
            Event::Data(_) => {}
            Event::End { start, end } => match part {
                Part::Sdp => got.sdp = Some(start..end),
                Part::Session => got.session = Some(start..end),
                Part::Other => {}
            },
        }
        Ok(())
    };
    reader
        .feed(body, &mut sink)
        .and_then(|()| reader.finish())
        .map_err(|e| bad("malformed_multipart", format!("Failed to read multipart field: {}", e.0)))?;
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SDP: &str = "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\n";

    fn form(session: &str) -> Vec<u8> {
        format!(
            "--b\r\nContent-Disposition: form-data; name=\"sdp\"\r\n\r\n{SDP}\r\n--b\r\nContent-Disposition: form-data; name=\"session\"\r\n\r\n{session}\r\n--b--\r\n"
        )
        .into_bytes()
    }

    #[test]
    fn calls_models() {
        let ct = Some(&b"multipart/form-data; boundary=b"[..]);
        assert_eq!(calls_model(ct, &form(r#"{"type":"realtime","model":" m1 "}"#), None).unwrap(), "m1");
        assert_eq!(calls_model(ct, &form(r#"{"type":"realtime"}"#), Some("q")).unwrap_err().code, "missing_model");
        assert_eq!(calls_model(ct, &form("{nope"), None).unwrap_err().code, "invalid_session_json");
        let sdp = Some(&b"application/sdp"[..]);
        assert_eq!(calls_model(sdp, SDP.as_bytes(), Some("m2")).unwrap(), "m2");
        assert_eq!(calls_model(sdp, SDP.as_bytes(), None).unwrap_err().code, "missing_model");
        assert_eq!(calls_model(sdp, b"x=1", Some("m2")).unwrap_err().code, "invalid_sdp");
        assert_eq!(calls_model(Some(b"text/plain"), b"", None).unwrap_err().code, "invalid_content_type");
        assert_eq!(model_path(CLIENT_SECRETS), &["session", "model"]);
    }
}
