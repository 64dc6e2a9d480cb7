//! `POST /v1/audio/transcriptions`: the contract's form rules (openai-compatible-api.md,
//! "Audio Transcriptions"), checked by streaming the body through the multipart reader
//! ([`crate::http::multipart`]). A missing or empty `file`, a missing `model`, a
//! `temperature` outside 0.0–1.0, a `stream` other than `true`/`false`/`1`/`0`, or a malformed
//! form is refused with a plain-text message; every other field is ignored. The `file`
//! part is counted, never kept; `model`, `temperature` and `stream` are collected up to
//! [`MAX_FIELD`] bytes each. The form is forwarded as received: whole after the check when
//! it was buffered, piece by piece behind the check when it streams
//! (`serve::stream_form`).

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

/// What the form said so far, from its events.
#[derive(Default)]
struct Collected {
    /// The part being read.
    field: Option<Field>,
    /// The current small field's bytes.
    value: Vec<u8>,
    /// Bytes of the current `file` part.
    file_len: u64,
    /// A `file` part has started.
    file_started: bool,
    /// Length of the last `file` part, if one came.
    file: Option<u64>,
    model: Option<(Vec<u8>, Range<usize>)>,
    temperature: Option<Vec<u8>>,
    stream: Option<Vec<u8>>,
}

impl Collected {
    fn on(&mut self, e: Event<'_>) -> Result<(), FormError> {
        match e {
            Event::Part { name, .. } => {
                let field = match name.unwrap_or(b"") {
                    b"file" => Field::File,
                    b"model" => Field::Model,
                    b"temperature" => Field::Temperature,
                    b"stream" => Field::Stream,
                    _ => Field::Other,
                };
                self.file_started |= field == Field::File;
                self.field = Some(field);
                self.value.clear();
                self.file_len = 0;
            }
            Event::Data(d) => match self.field {
                Some(Field::File) => self.file_len += d.len() as u64,
                Some(Field::Other) | None => {}
                _ if self.value.len() + d.len() > MAX_FIELD => return Err(FormError("a form field is too large")),
                _ => self.value.extend_from_slice(d),
            },
            Event::End { start, end } => {
                let value = std::mem::take(&mut self.value);
                match self.field.take() {
                    Some(Field::File) => self.file = Some(self.file_len),
                    Some(Field::Model) => self.model = Some((value, start..end)),
                    Some(Field::Temperature) => self.temperature = Some(value),
                    Some(Field::Stream) => self.stream = Some(value),
                    Some(Field::Other) | None => {}
                }
            }
        }
        Ok(())
    }
}

/// A transcription form checked as its bytes pass: [`FormCheck::feed`] takes the body in
/// pieces of any size (the whole of it at once for a buffered body, a pump's reads for a
/// streamed one), [`FormCheck::finish`] applies the rules that need the whole form. Memory
/// is the reader's bound plus [`MAX_FIELD`] per small field, whatever the file's size.
pub struct FormCheck {
    reader: FormReader,
    got: Collected,
}

fn malformed(why: &str) -> String {
    format!("Malformed multipart form: {why}")
}

impl FormCheck {
    /// A check for a body whose Content-Type header is `content_type`; Err is the plain-text
    /// message of the `400` (not a form, or no boundary).
    pub fn new(content_type: Option<&[u8]>) -> Result<Self, String> {
        let Some(boundary) = content_type.and_then(form_boundary) else {
            return Err(malformed("Content-Type must be multipart/form-data with a boundary"));
        };
        Ok(Self { reader: FormReader::new(boundary), got: Collected::default() })
    }

    /// The next bytes of the body.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), String> {
        let got = &mut self.got;
        self.reader.feed(bytes, &mut |e| got.on(e)).map_err(|e| malformed(e.0))
    }

    /// The `model` field, once its part has ended: its value (refused when empty or not
    /// UTF-8) and where it is in the body.
    pub fn model(&self) -> Option<Result<(&str, Range<usize>), String>> {
        let (m, at) = self.got.model.as_ref()?;
        Some(model_value(m).map(|m| (m, at.clone())))
    }

    /// A `file` part has started (what comes after it may be very far away).
    pub fn file_started(&self) -> bool {
        self.got.file_started
    }

    /// The form asks for a streamed answer, as far as it was read.
    pub fn streaming(&self) -> bool {
        matches!(self.got.stream.as_deref(), Some(b"true" | b"1"))
    }

    /// The body ended: the form's verdict.
    pub fn finish(&self) -> Result<Transcription, String> {
        self.reader.finish().map_err(|e| malformed(e.0))?;
        let got = &self.got;
        match got.file {
            None => return Err("Missing required field: file".into()),
            Some(0) => return Err("The file field is empty".into()),
            Some(_) => {}
        }
        let (model, model_at) = match &got.model {
            Some((m, at)) => (model_value(m)?.to_owned(), at.clone()),
            None => return Err("Missing required field: model".into()),
        };
        let temperature = match &got.temperature {
            None => None,
            Some(t) => {
                let t = std::str::from_utf8(t).ok().and_then(|s| s.trim().parse::<f64>().ok());
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
}

fn model_value(m: &[u8]) -> Result<&str, String> {
    if m.is_empty() {
        return Err("Missing required field: model".into());
    }
    std::str::from_utf8(m).map_err(|_| "The model field is not valid UTF-8".to_string())
}

/// Checks a whole transcription form whose Content-Type header is `content_type`; Err is
/// the plain-text message of the `400`.
pub fn validate(content_type: Option<&[u8]>, body: &[u8]) -> Result<Transcription, String> {
    let mut check = FormCheck::new(content_type)?;
    check.feed(body)?;
    check.finish()
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
    fn fed_in_pieces_it_knows_the_model_before_the_end() {
        let body = form(&[("model", "org/asr"), ("file", "RIFFxxxx"), ("stream", "1")]);
        let file_at = body.windows(4).position(|w| w == b"RIFF").unwrap();
        let mut check = FormCheck::new(Some(CT)).unwrap();
        check.feed(&body[..file_at - 10]).unwrap();
        let (m, at) = check.model().unwrap().unwrap();
        assert_eq!((m, &body[at]), ("org/asr", &b"org/asr"[..]));
        assert!(!check.file_started());
        check.feed(&body[file_at - 10..file_at + 2]).unwrap();
        assert!(check.file_started());
        assert!(check.finish().is_err(), "the form is not complete");
        check.feed(&body[file_at + 2..]).unwrap();
        assert!(check.streaming());
        assert_eq!(check.finish().unwrap(), validate(Some(CT), &body).unwrap());
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
