//! A one-pass JSON scanner that records every value's byte span on a flat tape.
//!
//! Why not `sonic_rs::Value`: rewrites are byte splices, so validation needs the offset of every
//! value it may edit, and one pass that yields both the check and the offsets beats a full
//! `sonic_rs` parse followed by a second span scan. The scanner validates the whole body (RFC
//! 8259 grammar, UTF-8, escapes, surrogate pairs, duplicate keys, nesting depth) and allocates one
//! tape entry per value, so memory is bounded by the body length. It never recurses: nesting is an
//! explicit stack capped at [`MAX_DEPTH`], the limit `serde_json` uses.

use std::borrow::Cow;
use std::collections::HashSet;

use crate::spare::Spare;

/// Deepest container nesting accepted (the `serde_json` default recursion limit), the bound
/// every other reader of outside JSON keeps too (`bounded_json.rs`).
pub use smg_wire::json::MAX_DEPTH;

/// Objects with more members than this check duplicates through a hash set instead of pairwise.
const PAIRWISE_DUP_LIMIT: u32 = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

/// One value (or object key) on the tape.
#[derive(Clone, Copy, Debug)]
pub struct Node {
    pub kind: Kind,
    /// String: contains a backslash escape. Number: integer syntax (no fraction, no exponent).
    /// Bool: the value.
    pub flag: bool,
    /// First byte of the token (the opening quote or bracket).
    pub start: u32,
    /// One past the last byte of the token (the closing quote or bracket).
    pub end: u32,
    /// Tape index just past this value's subtree; for a key, the index of its value.
    pub next: u32,
}

/// A scanned body: the source bytes plus the tape. Index 0 is the root value.
pub struct Doc<'a> {
    pub src: &'a [u8],
    pub nodes: Vec<Node>,
}

thread_local! {
    /// The tape of the shard's last document, for its next (crate::spare); past 4096 nodes
    /// (a body of about 250 KB) it is freed instead.
    static TAPE: Spare<Node> = const { Spare::new(4096) };
    /// The parser's stack of open containers, likewise.
    static FRAMES: Spare<Frame> = const { Spare::new(MAX_DEPTH) };
}

impl Drop for Doc<'_> {
    fn drop(&mut self) {
        TAPE.with(|t| t.give(std::mem::take(&mut self.nodes)));
    }
}

/// Where and why the scan failed; rendered `serde_json`-style as "… at line L column C".
#[derive(Debug)]
pub struct SyntaxError {
    pub what: &'static str,
    pub at: usize,
}

impl SyntaxError {
    /// "what at line L column C", lines and columns 1-based as in `serde_json`.
    pub fn describe(&self, src: &[u8]) -> String {
        let at = self.at.min(src.len());
        let before = &src[..at];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        // 1-based column of the offending byte; at end of input, the bytes on the line.
        let col = at - before.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1) + usize::from(at < src.len());
        format!("{} at line {line} column {col}", self.what)
    }
}

/// Scan `src` into a tape. Rejects anything `serde_json` would reject, plus duplicate keys.
pub fn parse(src: &[u8]) -> Result<Doc<'_>, SyntaxError> {
    if src.len() >= u32::MAX as usize {
        return Err(SyntaxError { what: "body too large", at: 0 });
    }
    // simdutf8's SIMD check is a fraction of std's per byte (std's was 3% of a chat-1k
    // request's instructions, `bench/callgrind-per-request`); std says where, on a refusal.
    if simdutf8::basic::from_utf8(src).is_err() {
        let at = std::str::from_utf8(src).err().map_or(0, |e| e.valid_up_to());
        return Err(SyntaxError { what: "invalid UTF-8", at });
    }
    let nodes = TAPE.with(|t| t.take(16 + src.len() / 64));
    let mut p = Parser { src, pos: 0, nodes, stack: FRAMES.with(|f| f.take(16)) };
    let scanned = p.run();
    FRAMES.with(|f| f.give(p.stack));
    let doc = Doc { src, nodes: p.nodes };
    // A refused body's tape goes back too, with its document.
    scanned.map(|()| doc)
}

struct Frame {
    node: u32,
    object: bool,
    members: u32,
}

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
    nodes: Vec<Node>,
    stack: Vec<Frame>,
}

impl Parser<'_> {
    fn err<T>(&self, what: &'static str) -> Result<T, SyntaxError> {
        Err(SyntaxError { what, at: self.pos })
    }

    fn skip_ws(&mut self) {
        while let Some(&b) = self.src.get(self.pos) {
            if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                break;
            }
            self.pos += 1;
        }
    }

    fn push(&mut self, kind: Kind, flag: bool, start: usize) {
        let idx = self.nodes.len() as u32;
        self.nodes.push(Node { kind, flag, start: start as u32, end: self.pos as u32, next: idx + 1 });
    }

    fn run(&mut self) -> Result<(), SyntaxError> {
        self.skip_ws();
        self.value()?;
        while let Some(frame) = self.stack.last() {
            let (object, members) = (frame.object, frame.members);
            self.skip_ws();
            let close = if object { b'}' } else { b']' };
            match self.src.get(self.pos) {
                None => {
                    return self.err(if object { "EOF while parsing an object" } else { "EOF while parsing a list" })
                }
                Some(&b) if b == close => {
                    self.close()?;
                    continue;
                }
                Some(&b',') if members > 0 => {
                    self.pos += 1;
                    self.skip_ws();
                }
                Some(_) if members > 0 => {
                    return self.err(if object { "expected `,` or `}`" } else { "expected `,` or `]`" })
                }
                Some(_) => {}
            }
            if object {
                if self.src.get(self.pos) != Some(&b'"') {
                    return self.err("key must be a string");
                }
                self.string()?;
                self.skip_ws();
                if self.src.get(self.pos) != Some(&b':') {
                    return self.err("expected `:`");
                }
                self.pos += 1;
                self.skip_ws();
            }
            if let Some(frame) = self.stack.last_mut() {
                frame.members += 1;
            }
            self.value()?;
        }
        self.skip_ws();
        if self.pos != self.src.len() {
            return self.err("trailing characters");
        }
        Ok(())
    }

    fn value(&mut self) -> Result<(), SyntaxError> {
        let start = self.pos;
        match self.src.get(self.pos) {
            None => self.err("EOF while parsing a value"),
            Some(&b'{') | Some(&b'[') => {
                if self.stack.len() >= MAX_DEPTH {
                    return self.err("recursion limit exceeded");
                }
                let object = self.src[self.pos] == b'{';
                self.pos += 1;
                let idx = self.nodes.len() as u32;
                self.push(if object { Kind::Object } else { Kind::Array }, false, start);
                self.stack.push(Frame { node: idx, object, members: 0 });
                Ok(())
            }
            Some(&b'"') => self.string(),
            Some(&b't') => self.literal(b"true", Kind::Bool, true),
            Some(&b'f') => self.literal(b"false", Kind::Bool, false),
            Some(&b'n') => self.literal(b"null", Kind::Null, false),
            Some(&b) if b == b'-' || b.is_ascii_digit() => self.number(),
            Some(_) => self.err("expected value"),
        }
    }

    fn literal(&mut self, word: &[u8], kind: Kind, flag: bool) -> Result<(), SyntaxError> {
        let start = self.pos;
        if self.src[self.pos..].starts_with(word) {
            self.pos += word.len();
            self.push(kind, flag, start);
            Ok(())
        } else {
            self.err("expected value")
        }
    }

    fn digits(&mut self) -> usize {
        let from = self.pos;
        while self.src.get(self.pos).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
        }
        self.pos - from
    }

    fn number(&mut self) -> Result<(), SyntaxError> {
        let start = self.pos;
        if self.src[self.pos] == b'-' {
            self.pos += 1;
        }
        let int_digits = match self.src.get(self.pos) {
            Some(b'0') => {
                self.pos += 1;
                1
            }
            Some(b) if b.is_ascii_digit() => self.digits(),
            _ => return self.err("invalid number"),
        };
        let mut integer = true;
        if self.src.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            integer = false;
            if self.digits() == 0 {
                return self.err("invalid number");
            }
        }
        let mut exponent = false;
        if matches!(self.src.get(self.pos), Some(b'e') | Some(b'E')) {
            self.pos += 1;
            integer = false;
            exponent = true;
            if matches!(self.src.get(self.pos), Some(b'+') | Some(b'-')) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return self.err("invalid number");
            }
        }
        // Only an exponent or a very long mantissa can overflow f64; serde_json rejects those.
        if exponent || int_digits > 300 {
            let text = std::str::from_utf8(&self.src[start..self.pos]).unwrap_or("x");
            if !text.parse::<f64>().is_ok_and(f64::is_finite) {
                return Err(SyntaxError { what: "number out of range", at: start });
            }
        }
        self.push(Kind::Number, integer, start);
        Ok(())
    }

    fn string(&mut self) -> Result<(), SyntaxError> {
        let start = self.pos;
        self.pos += 1;
        let mut escaped = false;
        let src = self.src;
        loop {
            // 32 bytes per step while nothing special shows up, then word by word near the end
            // (where the special byte, if it is there, is found at once).
            self.pos = skip_plain(src, self.pos);
            if src.len() - self.pos < 32 {
                while let Some(chunk) = src.get(self.pos..self.pos + 8) {
                    let hit = special_bytes(word(chunk));
                    if hit != 0 {
                        self.pos += (hit.trailing_zeros() / 8) as usize;
                        break;
                    }
                    self.pos += 8;
                }
            }
            match src.get(self.pos) {
                None => return self.err("EOF while parsing a string"),
                Some(b'"') => {
                    self.pos += 1;
                    self.push(Kind::String, escaped, start);
                    return Ok(());
                }
                Some(b'\\') => {
                    escaped = true;
                    self.escape()?;
                }
                Some(&b) if b < 0x20 => {
                    return self.err("control character (\\u0000-\\u001F) found while parsing a string")
                }
                Some(_) => self.pos += 1,
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, SyntaxError> {
        let Some(hex) = self.src.get(self.pos..self.pos + 4) else {
            return self.err("EOF while parsing a string");
        };
        let mut v = 0u32;
        for &h in hex {
            let d = match h {
                b'0'..=b'9' => h - b'0',
                b'a'..=b'f' => h - b'a' + 10,
                b'A'..=b'F' => h - b'A' + 10,
                _ => return self.err("invalid escape"),
            };
            v = v * 16 + u32::from(d);
        }
        self.pos += 4;
        Ok(v)
    }

    fn escape(&mut self) -> Result<(), SyntaxError> {
        self.pos += 1; // the backslash
        match self.src.get(self.pos) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                self.pos += 1;
                Ok(())
            }
            Some(b'u') => {
                self.pos += 1;
                let unit = self.hex4()?;
                if (0xDC00..0xE000).contains(&unit) {
                    return self.err("lone trailing surrogate in hex escape");
                }
                if (0xD800..0xDC00).contains(&unit) {
                    if self.src.get(self.pos..self.pos + 2) != Some(b"\\u") {
                        return self.err("lone leading surrogate in hex escape");
                    }
                    self.pos += 2;
                    let low = self.hex4()?;
                    if !(0xDC00..0xE000).contains(&low) {
                        return self.err("lone leading surrogate in hex escape");
                    }
                }
                Ok(())
            }
            None => self.err("EOF while parsing a string"),
            Some(_) => self.err("invalid escape"),
        }
    }

    fn close(&mut self) -> Result<(), SyntaxError> {
        let Some(frame) = self.stack.pop() else {
            return self.err("unbalanced container");
        };
        self.pos += 1;
        let next = self.nodes.len() as u32;
        let node = &mut self.nodes[frame.node as usize];
        node.end = self.pos as u32;
        node.next = next;
        if frame.object && frame.members > 1 {
            self.check_duplicates(frame.node as usize, frame.members)?;
        }
        Ok(())
    }

    /// Duplicate keys are a smuggling risk (we validate one value, a worker may read the other),
    /// so they are rejected rather than resolved last-wins.
    fn check_duplicates(&self, obj: usize, members: u32) -> Result<(), SyntaxError> {
        let doc = DocRef { src: self.src, nodes: &self.nodes };
        let dup = |key: usize| SyntaxError { what: "duplicate key", at: doc.nodes[key].start as usize };
        if members <= PAIRWISE_DUP_LIMIT {
            let mut a = obj + 1;
            while a < doc.nodes[obj].next as usize {
                let mut b = doc.nodes[a + 1].next as usize;
                while b < doc.nodes[obj].next as usize {
                    if doc.key_eq(a, b) {
                        return Err(dup(b));
                    }
                    b = doc.nodes[b + 1].next as usize;
                }
                a = doc.nodes[a + 1].next as usize;
            }
        } else {
            let mut seen: HashSet<Cow<'_, [u8]>> = HashSet::with_capacity(members as usize);
            let mut k = obj + 1;
            while k < doc.nodes[obj].next as usize {
                if !seen.insert(doc.key_bytes(k)) {
                    return Err(dup(k));
                }
                k = doc.nodes[k + 1].next as usize;
            }
        }
        Ok(())
    }
}

/// Eight bytes as a little-endian word (`bytes` is exactly eight long).
#[inline(always)]
fn word(bytes: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(w)
}

/// Bit 7 of each byte lane is set where the byte is `"`, `\` or below 0x20. Lanes above the
/// first hit may be false positives (borrow propagation), so callers use only the lowest hit.
/// Quote and control bytes share one test: `b ^ 0x02` is at most 0x20 exactly for them.
#[inline(always)]
fn special_bytes(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = |v: u64, n: u64| v.wrapping_sub(ONES * n) & !v & HIGH;
    below(w ^ (ONES * 0x02), 0x21) | below(w ^ (ONES * u64::from(b'\\')), 1)
}

/// From `pos`, skips 32 bytes at a time while none of them is a quote, a backslash or a control
/// byte. Returns the first such byte's offset, or where fewer than 32 bytes are left.
///
/// SIMD, because this loop is most of the scanner's time on a chat body: AVX2 where the CPU
/// has it, else SSE2 (every x86-64 has it), else words. The word-at-a-time test took about 40
/// instructions for 32 bytes, SSE2 21 and AVX2 12: a chat-1k request's string scan went from
/// 2,200 instructions to about 1,100 with SSE2 (`bench/callgrind-per-request`).
fn skip_plain(src: &[u8], pos: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX2, checked just above.
            return unsafe { simd::skip_plain_avx2(src, pos) };
        }
        simd::skip_plain_sse2(src, pos)
    }
    #[cfg(not(target_arch = "x86_64"))]
    skip_plain_words(src, pos)
}

#[cfg(any(test, not(target_arch = "x86_64")))]
fn skip_plain_words(src: &[u8], mut pos: usize) -> usize {
    while let Some(chunk) = src.get(pos..pos + 32) {
        let hit = chunk.chunks_exact(8).enumerate().find_map(|(i, w)| {
            let hit = special_bytes(word(w));
            (hit != 0).then(|| i * 8 + (hit.trailing_zeros() / 8) as usize)
        });
        if let Some(at) = hit {
            return pos + at;
        }
        pos += 32;
    }
    pos
}

/// The quote, backslash and control test on 16 or 32 bytes at once. `b ^ 0x02` is at most 0x20
/// exactly for the quote and the control bytes, so two compares cover the three cases.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod simd {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2")]
    pub(super) fn skip_plain_avx2(src: &[u8], mut pos: usize) -> usize {
        while let Some(chunk) = src.get(pos..pos + 32) {
            // SAFETY: an unaligned load of the 32 bytes `chunk` borrows.
            let v = unsafe { _mm256_loadu_si256(chunk.as_ptr().cast::<__m256i>()) };
            let quote_or_control = _mm256_cmpeq_epi8(
                _mm256_subs_epu8(_mm256_xor_si256(v, _mm256_set1_epi8(0x02)), _mm256_set1_epi8(0x20)),
                _mm256_setzero_si256(),
            );
            let backslash = _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'\\' as i8));
            let mask = _mm256_movemask_epi8(_mm256_or_si256(quote_or_control, backslash)) as u32;
            if mask != 0 {
                return pos + mask.trailing_zeros() as usize;
            }
            pos += 32;
        }
        pos
    }

    pub(super) fn skip_plain_sse2(src: &[u8], mut pos: usize) -> usize {
        let half = |bytes: &[u8]| {
            // SAFETY: SSE2 is part of every x86-64 target (the intrinsics are `unsafe` only for
            // CPUs that could lack it), and the load reads 16 of the bytes `bytes` borrows
            // (`bytes` is 16 long).
            unsafe {
                let v = _mm_loadu_si128(bytes[..16].as_ptr().cast::<__m128i>());
                let quote_or_control = _mm_cmpeq_epi8(
                    _mm_subs_epu8(_mm_xor_si128(v, _mm_set1_epi8(0x02)), _mm_set1_epi8(0x20)),
                    _mm_setzero_si128(),
                );
                let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
                _mm_movemask_epi8(_mm_or_si128(quote_or_control, backslash)) as u32 & 0xFFFF
            }
        };
        while let Some(chunk) = src.get(pos..pos + 32) {
            let mask = half(&chunk[..16]) | half(&chunk[16..]) << 16;
            if mask != 0 {
                return pos + mask.trailing_zeros() as usize;
            }
            pos += 32;
        }
        pos
    }
}

/// Borrowed view used both while parsing (duplicate checks) and by [`Doc`].
struct DocRef<'a, 'n> {
    src: &'a [u8],
    nodes: &'n [Node],
}

impl<'a> DocRef<'a, '_> {
    fn inner(&self, i: usize) -> &'a [u8] {
        let n = self.nodes[i];
        &self.src[n.start as usize + 1..n.end as usize - 1]
    }

    fn key_bytes(&self, i: usize) -> Cow<'a, [u8]> {
        if self.nodes[i].flag {
            Cow::Owned(unescape(self.inner(i)).into_bytes())
        } else {
            Cow::Borrowed(self.inner(i))
        }
    }

    fn key_eq(&self, a: usize, b: usize) -> bool {
        if !self.nodes[a].flag && !self.nodes[b].flag {
            return self.inner(a) == self.inner(b);
        }
        self.key_bytes(a) == self.key_bytes(b)
    }
}

/// Decode the escapes of a scanned (already validated) string body.
pub fn unescape(raw: &[u8]) -> String {
    let mut out: Vec<u8> = Vec::with_capacity(raw.len());
    let mut i = 0;
    let hex = |s: &[u8]| s.iter().fold(0u32, |v, &h| v * 16 + (h as char).to_digit(16).unwrap_or(0));
    while i < raw.len() {
        if raw[i] != b'\\' {
            out.push(raw[i]);
            i += 1;
            continue;
        }
        let c = raw.get(i + 1).copied().unwrap_or(b'\\');
        i += 2;
        let simple = match c {
            b'b' => Some(0x08),
            b'f' => Some(0x0c),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            b'u' => None,
            other => Some(other),
        };
        if let Some(b) = simple {
            out.push(b);
            continue;
        }
        let mut cp = hex(raw.get(i..i + 4).unwrap_or(b"0000"));
        i += 4;
        if (0xD800..0xDC00).contains(&cp) {
            let low = hex(raw.get(i + 2..i + 6).unwrap_or(b"DC00"));
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low.wrapping_sub(0xDC00) & 0x3FF);
            i += 6;
        }
        let ch = char::from_u32(cp).unwrap_or('\u{FFFD}');
        let mut buf = [0u8; 4];
        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
    }
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

// === impl Doc ===

impl<'a> Doc<'a> {
    pub fn node(&self, i: usize) -> Node {
        self.nodes[i]
    }

    pub fn kind(&self, i: usize) -> Kind {
        self.nodes[i].kind
    }

    pub fn is_null(&self, i: usize) -> bool {
        self.nodes[i].kind == Kind::Null
    }

    /// The value's token exactly as sent.
    pub fn raw(&self, i: usize) -> &'a [u8] {
        let n = self.nodes[i];
        &self.src[n.start as usize..n.end as usize]
    }

    /// A string's text, unescaped only when it has escapes.
    pub fn str(&self, i: usize) -> Cow<'a, str> {
        let r = DocRef { src: self.src, nodes: &self.nodes };
        let inner = r.inner(i);
        if self.nodes[i].flag {
            Cow::Owned(unescape(inner))
        } else {
            // The whole body passed UTF-8 validation, and quotes are ASCII boundaries.
            Cow::Borrowed(std::str::from_utf8(inner).unwrap_or(""))
        }
    }

    /// Whether a string (or key) node equals `s`.
    pub fn str_is(&self, i: usize, s: &str) -> bool {
        let r = DocRef { src: self.src, nodes: &self.nodes };
        if self.nodes[i].flag {
            unescape(r.inner(i)) == s
        } else {
            r.inner(i) == s.as_bytes()
        }
    }

    pub fn number(&self, i: usize) -> f64 {
        std::str::from_utf8(self.raw(i)).ok().and_then(|t| t.parse().ok()).unwrap_or(f64::NAN)
    }

    /// Members of an object as (key index, value index).
    pub fn members(&self, obj: usize) -> Members<'_, 'a> {
        Members { doc: self, at: obj + 1, end: self.nodes[obj].next as usize }
    }

    /// Elements of an array.
    pub fn elements(&self, arr: usize) -> Elements<'_, 'a> {
        Elements { doc: self, at: arr + 1, end: self.nodes[arr].next as usize }
    }

    /// Value of `key` in an object, if present.
    pub fn get(&self, obj: usize, key: &str) -> Option<usize> {
        if self.nodes[obj].kind != Kind::Object {
            return None;
        }
        self.members(obj).find(|&(k, _)| self.str_is(k, key)).map(|(_, v)| v)
    }

    /// Value of `key`, treating `null` as absent (how `Option` fields deserialize).
    pub fn get_some(&self, obj: usize, key: &str) -> Option<usize> {
        self.get(obj, key).filter(|&v| !self.is_null(v))
    }

    /// A key's text (for dispatch); borrowed unless it has escapes.
    pub fn key(&self, k: usize) -> Cow<'a, [u8]> {
        DocRef { src: self.src, nodes: &self.nodes }.key_bytes(k)
    }
}

pub struct Members<'d, 'a> {
    doc: &'d Doc<'a>,
    at: usize,
    end: usize,
}

impl Iterator for Members<'_, '_> {
    type Item = (usize, usize);
    fn next(&mut self) -> Option<(usize, usize)> {
        if self.at >= self.end {
            return None;
        }
        let key = self.at;
        self.at = self.doc.nodes[key + 1].next as usize;
        Some((key, key + 1))
    }
}

pub struct Elements<'d, 'a> {
    doc: &'d Doc<'a>,
    at: usize,
    end: usize,
}

impl Iterator for Elements<'_, '_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.at >= self.end {
            return None;
        }
        let el = self.at;
        self.at = self.doc.nodes[el].next as usize;
        Some(el)
    }
}

#[cfg(test)]
mod scan_tests {
    use super::*;

    type Skip = fn(&[u8], usize) -> usize;

    /// Every implementation this CPU can run, each named.
    fn skippers() -> Vec<(&'static str, Skip)> {
        let mut all: Vec<(&'static str, Skip)> = vec![("words", skip_plain_words)];
        #[cfg(target_arch = "x86_64")]
        {
            all.push(("sse2", simd::skip_plain_sse2));
            if std::is_x86_feature_detected!("avx2") {
                #[allow(unsafe_code)]
                fn avx2(src: &[u8], pos: usize) -> usize {
                    // SAFETY: only pushed when the CPU has AVX2.
                    unsafe { simd::skip_plain_avx2(src, pos) }
                }
                all.push(("avx2", avx2));
            }
        }
        all
    }

    #[test]
    fn skip_plain_stops_at_the_first_quote_backslash_or_control_byte_at_every_offset() {
        let plain = |i: usize| [b'a', b'~', 0x7f, 0x80, 0xff, b'!', b'#', b' '][i % 8];
        for (name, skip) in skippers() {
            for special in [b'"', b'\\', 0x00, 0x01, 0x1f] {
                for at in 0..100 {
                    let mut src: Vec<u8> = (0..100).map(plain).collect();
                    src[at] = special;
                    if at + 3 < 100 {
                        src[at + 3] = b'"';
                    }
                    let got = skip(&src, 0);
                    // Found where it is, or left in the last 32 bytes for the word loop.
                    assert_eq!(got, if at < 96 { at } else { 96 }, "{name}: byte {special:#x} at {at}");
                    assert_eq!(skip(&src, at), at, "{name}: from {at}");
                }
            }
            let none: Vec<u8> = (0..100).map(plain).collect();
            assert_eq!(skip(&none, 0), 96, "{name}: nothing special");
            assert_eq!(skip(&none, 70), 70, "{name}: under 32 bytes left");
            // Every byte value, alone: special exactly below 0x20, or a quote or backslash.
            for b in 0..=255u8 {
                let mut src = [b'x'; 40];
                src[17] = b;
                let want = if b < 0x20 || b == b'"' || b == b'\\' { 17 } else { 32 };
                assert_eq!(skip(&src, 0), want, "{name}: byte {b:#x}");
            }
        }
    }

    #[test]
    fn strings_end_or_fail_where_the_special_byte_is_at_every_length() {
        for len in 0..100 {
            let text = "x".repeat(len);
            let body = format!(r#"{{"k":"{text}","n":"{text}\n"}}"#);
            let doc = parse(body.as_bytes()).unwrap_or_else(|e| panic!("{len}: {e:?}"));
            assert_eq!(doc.nodes[2].end as usize, 7 + len, "{len}");
            let bad = format!("{{\"k\":\"{text}\u{1}\"}}");
            let err = parse(bad.as_bytes()).err().unwrap_or_else(|| panic!("{len}: accepted"));
            assert_eq!(err.at, 6 + len, "{len}");
        }
    }
}
