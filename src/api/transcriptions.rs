//! `POST /v1/audio/transcriptions`: the contract's form rules (openai-compatible-api.md,
//! "Audio Transcriptions"), checked by streaming the body through the multipart reader
//! ([`crate::http::multipart`]). A missing or empty `file`, a missing `model`, a
//! `temperature` outside 0.0–1.0, a `stream` other than `true`/`false`/`1`/`0`, or a malformed
//! form is refused with a plain-text message; every other field is ignored. The `file`
//! part is counted, never kept; `model`, `temperature` and `stream` are collected up to
//! [`MAX_FIELD`] bytes each. The form is forwarded as received.

use std::ops::Range;

use crate::http::multipart::{form_boundary, Event, FormError, FormReader};

pub const PATH: &str = "/v1/audio/transcriptions";
/// The most bytes kept of a small field (`model`, `temperature`, `stream`).
pub const MAX_FIELD: usize = 4096;

/// What routing needs from a valid form.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcription {
    pub model: String,
    /// Where the `model` value is in the body (for an alias's splice).
    pub model_at: Range<usize>,
    pub stream: bool,
    pub temperature: Option<f64>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    File,
    Model,
    Temperature,
    Stream,
    Other,
}

#[derive(Default)]
struct Collected {
    /// Length of the last `file` part, if one came.
    file: Option<u64>,
    model: Option<(Vec<u8>, Range<usize>)>,
    temperature: Option<Vec<u8>>,
    stream: Option<Vec<u8>>,
}

/// Checks a transcription form whose Content-Type header is `content_type`; Err is the
/// plain-text message of the `400`.
pub fn validate(content_type: Option<&[u8]>, body: &[u8]) -> Result<Transcription, String> {
    let malformed = |why: &str| format!("Malformed multipart form: {why}");
    let Some(boundary) = content_type.and_then(form_boundary) else {
        return Err(malformed("Content-Type must be multipart/form-data with a boundary"));
    };
    let mut reader = FormReader::new(boundary);
    let mut got = Collected::default();
    let mut field = Field::Other;
    let mut value: Vec<u8> = Vec::new();
    let mut file_len = 0u64;
    let mut sink = |e: Event<'_>| -> Result<(), FormError> {
        match e {
            Event::Part { name, .. } => {
                field = match name.unwrap_or(b"") {
                    b"file" => Field::File,
                    b"model" => Field::Model,
                    b"temperature" => Field::Temperature,
                    b"stream" => Field::Stream,
                    _ => Field::Other,
                };
                value.clear();
                file_len = 0;
            }
            Event::Data(d) => match field {
                Field::File => file_len += d.len() as u64,
                Field::Other => {}
                _ if value.len() + d.len() > MAX_FIELD => return Err(FormError("a form field is too large")),
                _ => value.extend_from_slice(d),
            },
            Event::End { start, end } => match field {
                Field::File => got.file = Some(file_len),
                Field::Model => got.model = Some((std::mem::take(&mut value), start..end)),
                Field::Temperature => got.temperature = Some(std::mem::take(&mut value)),
                Field::Stream => got.stream = Some(std::mem::take(&mut value)),
                Field::Other => {}
            },
        }
        Ok(())
    };
    reader.feed(body, &mut sink).and_then(|()| reader.finish()).map_err(|e| malformed(e.0))?;
    match got.file {
        None => return Err("Missing required field: file".into()),
        Some(0) => return Err("The file field is empty".into()),
        Some(_) => {}
    }
    let (model, model_at) = match got.model {
        Some((m, at)) if !m.is_empty() => {
            (String::from_utf8(m).map_err(|_| "The model field is not valid UTF-8".to_string())?, at)
        }
        _ => return Err("Missing required field: model".into()),
    };
    let temperature = match got.temperature {
        None => None,
        Some(t) => {
            let t = std::str::from_utf8(&t).ok().and_then(|s| s.trim().parse::<f64>().ok());
            match t {
                Some(t) if (0.0..=1.0).contains(&t) => Some(t),
                _ => return Err("temperature must be a number between 0.0 and 1.0".into()),
            }
        }
    };
    let stream = match got.stream.as_deref() {
        None | Some(b"false" | b"0") => false,
        Some(b"true" | b"1") => true,
        Some(_) => return Err("stream must be one of true, false, 1 or 0".into()),
    };
    Ok(Transcription { model, model_at, stream, temperature })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CT: &[u8] = b"multipart/form-data; boundary=B";

    fn form(fields: &[(&str, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, v) in fields {
            let file = if *k == "file" { "; filename=\"a.wav\"" } else { "" };
            out.extend_from_slice(
                format!("--B\r\nContent-Disposition: form-data; name=\"{k}\"{file}\r\n\r\n{v}\r\n").as_bytes(),
            );
        }
        out.extend_from_slice(b"--B--\r\n");
        out
    }

    #[test]
    fn valid_forms() {
        let body = form(&[("file", "RIFF"), ("model", "org/asr"), ("language", "en"), ("temperature", "0.5")]);
        let t = validate(Some(CT), &body).unwrap();
        assert_eq!((t.model.as_str(), t.stream, t.temperature), ("org/asr", false, Some(0.5)));
        assert_eq!(&body[t.model_at], b"org/asr");
        for (s, want) in [("true", true), ("1", true), ("false", false), ("0", false)] {
            let body = form(&[("model", "m"), ("stream", s), ("file", "x")]);
            assert_eq!(validate(Some(CT), &body).unwrap().stream, want, "{s}");
        }
        for t in ["0", "1", "1.0", "0.0"] {
            assert!(validate(Some(CT), &form(&[("model", "m"), ("temperature", t), ("file", "x")])).is_ok(), "{t}");
        }
    }

    #[test]
    fn each_rule() {
        let cases: [(Vec<u8>, &str); 10] = [
            (form(&[("model", "m")]), "Missing required field: file"),
            (form(&[("model", "m"), ("file", "")]), "The file field is empty"),
            (form(&[("file", "x")]), "Missing required field: model"),
            (form(&[("file", "x"), ("model", "")]), "Missing required field: model"),
            (form(&[("file", "x"), ("model", "m"), ("temperature", "1.5")]), "temperature"),
            (form(&[("file", "x"), ("model", "m"), ("temperature", "-0.1")]), "temperature"),
            (form(&[("file", "x"), ("model", "m"), ("temperature", "hot")]), "temperature"),
            (form(&[("file", "x"), ("model", "m"), ("stream", "yes")]), "stream"),
            (b"--B\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nx".to_vec(), "Malformed multipart form"),
            (form(&[("file", "x"), ("model", &"m".repeat(MAX_FIELD + 1))]), "too large"),
        ];
        for (body, why) in cases {
            let e = validate(Some(CT), &body).unwrap_err();
            assert!(e.contains(why), "{}: {e}", String::from_utf8_lossy(&body));
        }
        let ok = form(&[("file", "x"), ("model", "m")]);
        for ct in [None, Some(&b"application/json"[..]), Some(b"multipart/form-data")] {
            assert!(validate(ct, &ok).unwrap_err().starts_with("Malformed multipart form"));
        }
    }
}
