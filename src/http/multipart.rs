//! A sans-I/O `multipart/form-data` reader (RFC 7578 over RFC 2046 §5.1): bytes in, events
//! out. [`FormReader::feed`] takes slices of any size, cut anywhere (a boundary split across
//! two reads, or one byte at a time), and reports each part's start (its `name` and
//! `filename`), its content as it goes, and its end with the content's byte range in the
//! whole body; [`FormReader::finish`] says whether the form was complete.
//!
//! Memory is bounded whatever the body's size: inside a part's content the reader keeps at
//! most a delimiter's length minus one byte (the tail that may be the start of a boundary cut
//! by a read), and content is handed out as borrowed slices of what was fed, never copied;
//! a part's header block is held up to [`MAX_PART_HEADERS`]. Collecting small fields is the
//! caller's business, with its own bound (see `api::transcriptions`).
//!
//! A buffered transcription body is fed to this reader in one call; a large one streamed to
//! the worker is fed read by read as it passes (`serve::stream_form`). The reader does not
//! care, and its tests feed it at every split.

use memchr::memmem;

/// The most bytes a part's header block may take.
pub const MAX_PART_HEADERS: usize = 8 * 1024;
/// RFC 2046 caps a boundary at 70 characters.
pub const MAX_BOUNDARY: usize = 70;

/// Why a form is malformed (the message names the rule broken).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormError(pub &'static str);

/// What the reader found, in body order.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// A part starts: the `name` and `filename` of its `Content-Disposition` (raw, unquoted).
    Part { name: Option<&'a [u8]>, filename: Option<&'a [u8]> },
    /// Some of the current part's content.
    Data(&'a [u8]),
    /// The current part ended; its content is `start..end` of the whole body.
    End { start: usize, end: usize },
}

enum State {
    /// Before the first delimiter (a preamble, discarded).
    Preamble,
    /// Just after a delimiter: `--` closes the form, else padding and CRLF start a part.
    AfterDelimiter,
    /// Padding after a delimiter, up to its CRLF.
    Padding,
    /// A part's header block, collected in `held`.
    Headers,
    /// A part's content, from `start` in the body.
    Content { start: usize },
    /// After the close delimiter (an epilogue, discarded).
    Closed,
}

/// The reader for one body. See the module docs.
pub struct FormReader {
    /// `\r\n--boundary`.
    delim: Vec<u8>,
    state: State,
    /// Bytes held between feeds: a possible partial delimiter, or a header block.
    held: Vec<u8>,
    /// Body offset of the next byte fed, counting the virtual CRLF the body starts with (so
    /// a body opening with `--boundary` needs no special case).
    at: usize,
}

/// The boundary of a `multipart/form-data` Content-Type value; None when the type is
/// another, or the boundary is missing, empty, or too long.
pub fn form_boundary(content_type: &[u8]) -> Option<&[u8]> {
    let mut params = content_type.split(|b| *b == b';');
    let mime = trim(params.next()?);
    if !mime.eq_ignore_ascii_case(b"multipart/form-data") {
        return None;
    }
    let b = params.find_map(|p| {
        let (k, v) = split_once(trim(p), b'=')?;
        trim(k).eq_ignore_ascii_case(b"boundary").then(|| unquote(trim(v)))
    })?;
    (!b.is_empty() && b.len() <= MAX_BOUNDARY).then_some(b)
}

impl FormReader {
    pub fn new(boundary: &[u8]) -> Self {
        let mut delim = Vec::with_capacity(boundary.len() + 4);
        delim.extend_from_slice(b"\r\n--");
        delim.extend_from_slice(boundary);
        let mut held = Vec::with_capacity(delim.len() * 2);
        held.extend_from_slice(b"\r\n");
        Self { delim, state: State::Preamble, held, at: 2 }
    }

    /// Feeds the next bytes of the body; `sink` gets the events they complete (and may
    /// refuse one, which stops the reader with its error).
    pub fn feed(
        &mut self,
        mut data: &[u8],
        sink: &mut impl FnMut(Event<'_>) -> Result<(), FormError>,
    ) -> Result<(), FormError> {
        while !data.is_empty() {
            let used = self.step(data, sink)?;
            data = &data[used..];
        }
        Ok(())
    }

    /// The body ended: Ok only for a form closed by its final delimiter.
    pub fn finish(&self) -> Result<(), FormError> {
        match self.state {
            State::Closed => Ok(()),
            State::Preamble => Err(FormError("no multipart boundary in the body")),
            _ => Err(FormError("the form ends before its closing boundary")),
        }
    }

    /// Consumes a prefix of `data` and returns its length (0 only when it moved held bytes
    /// out, so the next step reads `data` in place).
    fn step(
        &mut self,
        data: &[u8],
        sink: &mut impl FnMut(Event<'_>) -> Result<(), FormError>,
    ) -> Result<usize, FormError> {
        match self.state {
            State::Preamble | State::Content { .. } => self.content(data, sink),
            State::AfterDelimiter | State::Padding => {
                self.held.push(data[0]);
                self.at += 1;
                self.after_delimiter()?;
                Ok(1)
            }
            State::Headers => self.headers(data, sink),
            State::Closed => {
                self.at += data.len();
                Ok(data.len())
            }
        }
    }

    /// After a delimiter, in `held`: `--` closes the form; otherwise transport padding
    /// (spaces and tabs) and CRLF start a part's headers.
    fn after_delimiter(&mut self) -> Result<(), FormError> {
        let h = &self.held[..];
        if let State::AfterDelimiter = self.state {
            match h {
                b"-" => return Ok(()),
                b"--" => {
                    self.held.clear();
                    self.state = State::Closed;
                    return Ok(());
                }
                _ => self.state = State::Padding,
            }
        }
        let (pad, done) = match h.strip_suffix(b"\r\n") {
            Some(pad) => (pad, true),
            None => (h.strip_suffix(b"\r").unwrap_or(h), false),
        };
        if !pad.iter().all(|c| *c == b' ' || *c == b'\t') {
            return Err(FormError("a multipart boundary is not followed by CRLF"));
        }
        if pad.len() > 64 {
            return Err(FormError("a multipart boundary is followed by too much padding"));
        }
        if done {
            self.held.clear();
            self.state = State::Headers;
        }
        Ok(())
    }

    /// A part's header block: held until its blank line, then parsed.
    fn headers(
        &mut self,
        data: &[u8],
        sink: &mut impl FnMut(Event<'_>) -> Result<(), FormError>,
    ) -> Result<usize, FormError> {
        let before = self.held.len();
        let room = MAX_PART_HEADERS + 1 - before;
        let take = data.len().min(room);
        self.held.extend_from_slice(&data[..take]);
        let end = if self.held.starts_with(b"\r\n") {
            Some(2)
        } else {
            let from = before.saturating_sub(3);
            memmem::find(&self.held[from..], b"\r\n\r\n").map(|p| from + p + 4)
        };
        let Some(end) = end else {
            if self.held.len() > MAX_PART_HEADERS {
                return Err(FormError("a part's headers are too large"));
            }
            self.at += take;
            return Ok(take);
        };
        let used = end - before;
        self.at += used;
        let mut hs = [httparse::EMPTY_HEADER; 16];
        let parsed = match httparse::parse_headers(&self.held[..end], &mut hs) {
            Ok(httparse::Status::Complete((_, hs))) => hs,
            _ => return Err(FormError("a part's headers are malformed")),
        };
        let (mut name, mut filename) = (None, None);
        if let Some(cd) = parsed.iter().find(|h| h.name.eq_ignore_ascii_case("content-disposition")) {
            let mut params = cd.value.split(|b| *b == b';');
            if trim(params.next().unwrap_or(b"")).eq_ignore_ascii_case(b"form-data") {
                for p in params {
                    let Some((k, v)) = split_once(trim(p), b'=') else { continue };
                    let k = trim(k);
                    if k.eq_ignore_ascii_case(b"name") {
                        name = Some(unquote(trim(v)));
                    } else if k.eq_ignore_ascii_case(b"filename") {
                        filename = Some(unquote(trim(v)));
                    }
                }
            }
        }
        sink(Event::Part { name, filename })?;
        self.held.clear();
        self.state = State::Content { start: self.at - 2 };
        Ok(used)
    }

    /// Content (or preamble) up to the next delimiter. Held bytes are a possible start of a
    /// delimiter cut by the last feed: up to a delimiter's length of `data` joins them, and
    /// a delimiter starting in them is then either whole in `held` or still possible.
    fn content(
        &mut self,
        data: &[u8],
        sink: &mut impl FnMut(Event<'_>) -> Result<(), FormError>,
    ) -> Result<usize, FormError> {
        let dlen = self.delim.len();
        if self.held.is_empty() {
            return Ok(match scan(data, &self.delim) {
                Scan::Found(p) => {
                    self.emit(&data[..p], sink)?;
                    self.at += p;
                    self.delimiter(sink)?;
                    self.at += dlen;
                    p + dlen
                }
                Scan::Partial(i) => {
                    self.emit(&data[..i], sink)?;
                    self.held.extend_from_slice(&data[i..]);
                    self.at += data.len();
                    data.len()
                }
            });
        }
        // `at` counts `held` as already fed.
        let old = self.held.len();
        let moved = data.len().min(dlen);
        let mut held = std::mem::take(&mut self.held);
        held.extend_from_slice(&data[..moved]);
        let used = match scan(&held, &self.delim) {
            Scan::Found(p) => {
                self.at = self.at - old + p;
                self.emit(&held[..p], sink)?;
                self.delimiter(sink)?;
                self.at += dlen;
                held.clear();
                p + dlen - old
            }
            Scan::Partial(i) if i >= old => {
                // No delimiter starts in what was held: it is all content, and the next
                // step scans `data` in place from its start.
                self.emit(&held[..old], sink)?;
                held.clear();
                0
            }
            Scan::Partial(i) => {
                // A delimiter may still start at `i`; all of `data` is in `held` (a
                // delimiter starting before `old` would otherwise be whole in it).
                self.emit(&held[..i], sink)?;
                held.drain(..i);
                self.at += moved;
                moved
            }
        };
        self.held = held;
        Ok(used)
    }

    fn emit(&self, bytes: &[u8], sink: &mut impl FnMut(Event<'_>) -> Result<(), FormError>) -> Result<(), FormError> {
        if bytes.is_empty() || !matches!(self.state, State::Content { .. }) {
            return Ok(());
        }
        sink(Event::Data(bytes))
    }

    /// A delimiter starts at `at`: the part (if any) ends there. (`at` counts the virtual
    /// CRLF, so the body's own offset is 2 less; `start` is already the body's.)
    fn delimiter(&mut self, sink: &mut impl FnMut(Event<'_>) -> Result<(), FormError>) -> Result<(), FormError> {
        if let State::Content { start } = self.state {
            sink(Event::End { start, end: self.at - 2 })?;
        }
        self.state = State::AfterDelimiter;
        Ok(())
    }
}

enum Scan {
    /// The delimiter starts here.
    Found(usize),
    /// No delimiter; one may start at this index (the buffer's length when none can).
    Partial(usize),
}

fn scan(buf: &[u8], delim: &[u8]) -> Scan {
    if let Some(p) = memmem::find(buf, delim) {
        return Scan::Found(p);
    }
    let longest = (delim.len() - 1).min(buf.len());
    for k in (1..=longest).rev() {
        if buf[buf.len() - k..] == delim[..k] {
            return Scan::Partial(buf.len() - k);
        }
    }
    Scan::Partial(buf.len())
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|c| !c.is_ascii_whitespace()).unwrap_or(b.len());
    let end = b.iter().rposition(|c| !c.is_ascii_whitespace()).map_or(start, |e| e + 1);
    &b[start..end.max(start)]
}

fn split_once(b: &[u8], at: u8) -> Option<(&[u8], &[u8])> {
    let i = b.iter().position(|c| *c == at)?;
    Some((&b[..i], &b[i + 1..]))
}

/// A parameter value without its quotes (escapes are left as sent: names compared here
/// never contain them).
fn unquote(v: &[u8]) -> &[u8] {
    if v.len() >= 2 && v[0] == b'"' && v[v.len() - 1] == b'"' {
        &v[1..v.len() - 1]
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a form reads as: (name, filename, content, range) per part.
    type Parts = Vec<(Vec<u8>, Option<Vec<u8>>, Vec<u8>, (usize, usize))>;

    fn read(boundary: &[u8], pieces: &[&[u8]]) -> Result<Parts, FormError> {
        let mut r = FormReader::new(boundary);
        let mut parts: Parts = Vec::new();
        let mut sink = |e: Event<'_>| {
            match e {
                Event::Part { name, filename } => {
                    parts.push((name.unwrap_or(b"").to_vec(), filename.map(<[u8]>::to_vec), Vec::new(), (0, 0)))
                }
                Event::Data(d) => parts.last_mut().unwrap().2.extend_from_slice(d),
                Event::End { start, end } => parts.last_mut().unwrap().3 = (start, end),
            }
            Ok(())
        };
        for p in pieces {
            r.feed(p, &mut sink)?;
        }
        r.finish()?;
        Ok(parts)
    }

    const FORM: &[u8] = b"preamble\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF\r\n--XyW\r\n--Xy\r\r\n--XyZ  \r\ncontent-disposition: form-data; name=model\r\n\r\nm/x\r\n--XyZ\r\nContent-Disposition: form-data; name=\"empty\"\r\n\r\n\r\n--XyZ--\r\nepilogue";

    fn expected() -> Parts {
        let file = b"RIFF\r\n--XyW\r\n--Xy\r".to_vec();
        let at = |needle: &[u8]| FORM.windows(needle.len()).position(|w| w == needle).unwrap();
        let f0 = at(b"RIFF");
        let m0 = at(b"m/x");
        let e0 = at(b"\r\n\r\n\r\n--XyZ--") + 4;
        vec![
            (b"file".to_vec(), Some(b"a.wav".to_vec()), file.clone(), (f0, f0 + file.len())),
            (b"model".to_vec(), None, b"m/x".to_vec(), (m0, m0 + 3)),
            (b"empty".to_vec(), None, Vec::new(), (e0, e0)),
        ]
    }

    #[test]
    fn boundary_tricks_at_every_split() {
        // Content that starts like the delimiter (`\r\n--XyW`, `\r\n--Xy\r`) right up to
        // the real one, padding after a delimiter, an unquoted name, an empty part.
        let form = FORM;
        let want = expected();
        assert_eq!(read(b"XyZ", &[form]).unwrap(), want);
        for cut in 0..=form.len() {
            assert_eq!(read(b"XyZ", &[&form[..cut], &form[cut..]]).unwrap(), want, "cut {cut}");
        }
        for a in 0..form.len() {
            for b in a..=form.len() {
                let got = read(b"XyZ", &[&form[..a], &form[a..b], &form[b..]]).unwrap();
                assert_eq!(got, want, "cuts {a} {b}");
            }
        }
        let bytes: Vec<&[u8]> = form.chunks(1).collect();
        assert_eq!(read(b"XyZ", &bytes).unwrap(), want);
    }

    #[test]
    fn opens_without_preamble_and_holds_little() {
        let form = b"--b\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nabc\r\n--b--";
        let parts = read(b"b", &[form]).unwrap();
        assert_eq!(parts[0].2, b"abc");
        assert_eq!(&form[parts[0].3 .0..parts[0].3 .1], b"abc");
        // A large part fed in pieces: the reader holds less than a delimiter between feeds.
        let boundary = b"----formdata-0123456789";
        let mut body = Vec::new();
        body.extend_from_slice(b"--");
        body.extend_from_slice(boundary);
        body.extend_from_slice(b"\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n");
        let content: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        body.extend_from_slice(&content);
        body.extend_from_slice(b"\r\n--");
        body.extend_from_slice(boundary);
        body.extend_from_slice(b"--\r\n");
        let mut r = FormReader::new(boundary);
        let mut got = Vec::new();
        for piece in body.chunks(4093) {
            r.feed(piece, &mut |e| {
                if let Event::Data(d) = e {
                    got.extend_from_slice(d);
                }
                Ok(())
            })
            .unwrap();
            assert!(r.held.len() < MAX_PART_HEADERS.max(boundary.len() + 4));
            if let State::Content { .. } = r.state {
                assert!(r.held.len() < boundary.len() + 4);
            }
        }
        r.finish().unwrap();
        assert!(got == content);
    }

    #[test]
    fn malformed_forms() {
        let cd = "Content-Disposition: form-data; name=\"f\"\r\n\r\nx";
        for (form, why) in [
            ("".to_string(), "no multipart boundary"),
            ("no boundary here".to_string(), "no multipart boundary"),
            (format!("--b\r\n{cd}"), "ends before"),
            (format!("--b\r\n{cd}\r\n--b"), "ends before"),
            (format!("--b\r\n{cd}\r\n--b\r\n"), "ends before"),
            (format!("--bx\r\n{cd}\r\n--b--"), "not followed by CRLF"),
            (format!("--b -\r\n{cd}\r\n--b--"), "not followed by CRLF"),
            (format!("--b\r\nContent-Disposition: form-data\r\n{}", "x".repeat(MAX_PART_HEADERS)), "too large"),
            ("--b\r\nno colon\r\n\r\nx\r\n--b--".to_string(), "malformed"),
        ] {
            let bytes = form.as_bytes();
            let whole = read(b"b", &[bytes]).unwrap_err();
            assert!(whole.0.contains(why), "{form:?}: {whole:?}");
            for cut in 0..=bytes.len() {
                assert_eq!(read(b"b", &[&bytes[..cut], &bytes[cut..]]).unwrap_err(), whole, "{form:?} cut {cut}");
            }
        }
    }

    #[test]
    fn boundaries_from_content_type() {
        assert_eq!(form_boundary(b"multipart/form-data; boundary=abc"), Some(&b"abc"[..]));
        assert_eq!(form_boundary(b"Multipart/Form-Data;charset=x; Boundary=\"a b\""), Some(&b"a b"[..]));
        assert_eq!(form_boundary(b"multipart/form-data"), None);
        assert_eq!(form_boundary(b"multipart/form-data; boundary="), None);
        assert_eq!(form_boundary(b"multipart/mixed; boundary=abc"), None);
        assert_eq!(form_boundary(b"application/json"), None);
        let long = format!("multipart/form-data; boundary={}", "a".repeat(MAX_BOUNDARY + 1));
        assert_eq!(form_boundary(long.as_bytes()), None);
    }
}
