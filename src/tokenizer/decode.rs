//! Incremental detokenization: token ids arrive one at a time (a gRPC stream) and each
//! step appends only text that is complete — never half a UTF-8 character, so a character
//! whose bytes span two byte-level or byte-fallback tokens appears with the token that ends it.
//!
//! The fast path is a table of each token's raw bytes, built once per tokenizer for the
//! decoders whose output is the concatenation of per-token bytes (GPT-2 byte-level; the
//! SentencePiece family: `▁` as a space, `<0xNN>` byte fallback, first space stripped). A step
//! is a lookup and a UTF-8 check, with no allocation once the caller's `String` has room;
//! the concatenation of all steps equals `decode(all ids)` (invalid bytes become U+FFFD, as
//! `String::from_utf8_lossy` there). Other decoders (WordPiece, CTC, …) go through the
//! `tokenizers` crate's own `DecodeStream`, which re-decodes a window of ids per step.

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use tokenizers::Tokenizer as HfTokenizer;

/// How the table reads a vocabulary entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pieces {
    /// GPT-2's printable-character stand-ins for bytes (`Ġ` = space).
    ByteLevel,
    /// SentencePiece: `▁` is a space, `<0xNN>` one byte (with `byte_fallback`).
    Metaspace { byte_fallback: bool },
}

/// Every token's bytes, laid end to end.
#[derive(Debug)]
pub struct TokenBytes {
    bytes: Vec<u8>,
    /// `ends[id]` is where token `id`'s bytes end; it starts where `id - 1`'s end.
    ends: Vec<u32>,
    special: Vec<bool>,
    /// The decoder drops the first leading space of the output (SentencePiece's `Strip`
    /// or Metaspace's prepend scheme; Metaspace drops every `▁` of the first token, which for
    /// real vocabularies is its leading one).
    strip_first_space: bool,
}

impl TokenBytes {
    /// The table for `tk`'s decoder, or None when that decoder is not a per-token byte map.
    pub fn build(tk: &HfTokenizer) -> Option<TokenBytes> {
        let (pieces, strip_first_space) = classify(tk)?;
        let n = tk.get_vocab_size(true);
        let added = tk.get_added_tokens_decoder();
        let mut t = TokenBytes {
            bytes: Vec::with_capacity(n * 6),
            ends: Vec::with_capacity(n),
            special: vec![false; n],
            strip_first_space,
        };
        for id in 0..n as u32 {
            if let Some(tok) = tk.id_to_token(id) {
                let is_added = added.get(&id);
                if is_added.is_some_and(|a| a.special) {
                    t.special[id as usize] = true;
                }
                match pieces {
                    ByteLevel => push_byte_level(&mut t.bytes, &tok),
                    // Added tokens are their own text; only vocabulary pieces use `▁`/`<0xNN>`.
                    Metaspace { .. } if is_added.is_some() => t.bytes.extend_from_slice(tok.as_bytes()),
                    Metaspace { byte_fallback } => push_metaspace(&mut t.bytes, &tok, byte_fallback),
                }
            }
            t.ends.push(t.bytes.len() as u32);
        }
        t.bytes.shrink_to_fit();
        Some(t)
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Token `id`'s bytes (empty for an id outside the vocabulary).
    pub fn get(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i >= self.ends.len() {
            return &[];
        }
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.bytes[start..self.ends[i] as usize]
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }
}

use Pieces::{ByteLevel, Metaspace};

/// Reads the decoder's configuration (its tokenizer.json form) and tells whether a table
/// reproduces it: `ByteLevel`; `Metaspace`; or a `Sequence` of only `Replace("▁", " ")`,
/// `ByteFallback`, `Fuse` and `Strip(" ", 1, 0)` (Llama's and Mistral's).
fn classify(tk: &HfTokenizer) -> Option<(Pieces, bool)> {
    let dec = sonic_rs::to_string(tk.get_decoder()?).ok()?;
    let dec: sonic_rs::Value = sonic_rs::from_str(&dec).ok()?;
    match dec["type"].as_str()? {
        "ByteLevel" => Some((ByteLevel, false)),
        "Metaspace" => {
            let repl = dec["replacement"].as_str()?;
            let scheme = dec["prepend_scheme"].as_str().unwrap_or("always");
            (repl == "▁").then_some((Metaspace { byte_fallback: false }, scheme != "never"))
        }
        "Sequence" => {
            let (mut replace, mut fallback, mut strip) = (false, false, false);
            for d in dec["decoders"].as_array()?.iter() {
                match d["type"].as_str()? {
                    "Replace" if d["pattern"]["String"].as_str() == Some("▁") && d["content"].as_str() == Some(" ") => {
                        replace = true
                    }
                    "ByteFallback" => fallback = true,
                    "Fuse" => {}
                    "Strip" if d["content"].as_str() == Some(" ") && d["stop"].as_u64() == Some(0) => {
                        strip = d["start"].as_u64() == Some(1)
                    }
                    _ => return None,
                }
            }
            replace.then_some((Metaspace { byte_fallback: fallback }, strip))
        }
        _ => None,
    }
}

/// GPT-2's `bytes_to_unicode` inverted: the printable bytes stand for themselves and the
/// other 68 are numbered from U+0100 in byte order.
fn byte_level_inverse() -> [Option<u8>; 324] {
    let mut inv = [None; 324];
    let mut next = 256usize;
    for b in 0..=255u8 {
        let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        if printable {
            inv[b as usize] = Some(b);
        } else {
            inv[next] = Some(b);
            next += 1;
        }
    }
    inv
}

/// A byte-level piece's bytes; a piece with a character outside the map (an added token
/// such as `<|im_start|>`, or non-ASCII added text) is its own UTF-8, as HF's decoder does.
fn push_byte_level(out: &mut Vec<u8>, tok: &str) {
    thread_local! { static INV: [Option<u8>; 324] = byte_level_inverse(); }
    INV.with(|inv| {
        let start = out.len();
        for c in tok.chars() {
            match inv.get(c as usize).copied().flatten() {
                Some(b) => out.push(b),
                None => {
                    out.truncate(start);
                    out.extend_from_slice(tok.as_bytes());
                    return;
                }
            }
        }
    });
}

fn push_metaspace(out: &mut Vec<u8>, tok: &str, byte_fallback: bool) {
    if byte_fallback && tok.len() == 6 && tok.starts_with("<0x") && tok.ends_with('>') {
        if let Ok(b) = u8::from_str_radix(&tok[3..5], 16) {
            out.push(b);
            return;
        }
    }
    for part in tok.split('▁').enumerate() {
        if part.0 > 0 {
            out.push(b' ');
        }
        out.extend_from_slice(part.1.as_bytes());
    }
}

/// One stream's decoding state (one per sequence being generated).
pub struct IncrementalDecoder<'a> {
    inner: Inner<'a>,
}

enum Inner<'a> {
    Table {
        table: &'a TokenBytes,
        skip_special: bool,
        /// Bytes of a character whose end has not arrived yet (at most 3 in valid UTF-8).
        pending: Vec<u8>,
        at_start: bool,
    },
    Stream(
        Box<
            tokenizers::tokenizer::DecodeStream<
                'a,
                tokenizers::ModelWrapper,
                tokenizers::NormalizerWrapper,
                tokenizers::PreTokenizerWrapper,
                tokenizers::PostProcessorWrapper,
                tokenizers::DecoderWrapper,
            >,
        >,
    ),
}

impl<'a> IncrementalDecoder<'a> {
    pub(crate) fn with_table(table: &'a TokenBytes, skip_special: bool) -> Self {
        IncrementalDecoder {
            inner: Inner::Table { table, skip_special, pending: Vec::with_capacity(8), at_start: true },
        }
    }

    pub(crate) fn with_stream(tk: &'a HfTokenizer, skip_special: bool) -> Self {
        IncrementalDecoder { inner: Inner::Stream(Box::new(tk.decode_stream(skip_special))) }
    }

    /// A decoder whose output continues text that came before it (a completion continues its
    /// prompt): the first token keeps its leading space, as an engine that decodes with the
    /// prompt's last tokens in front shows it (" Paris" after "The capital of France is").
    /// The crate's `DecodeStream` has no such start; decoders on that path are unchanged.
    pub fn continuing(mut self) -> Self {
        if let Inner::Table { at_start, .. } = &mut self.inner {
            *at_start = false;
        }
        self
    }

    /// Appends to `out` the text that token `id` completes; returns how many bytes that was
    /// (0 when `id` ends inside a character, or is a skipped special token).
    pub fn step(&mut self, id: u32, out: &mut String) -> usize {
        let before = out.len();
        match &mut self.inner {
            Inner::Table { table, skip_special, pending, at_start } => {
                if *skip_special && table.is_special(id) {
                    return 0;
                }
                let mut bytes = table.get(id);
                if *at_start && !bytes.is_empty() {
                    *at_start = false;
                    if table.strip_first_space && bytes[0] == b' ' && pending.is_empty() {
                        bytes = &bytes[1..];
                    }
                }
                if pending.is_empty() {
                    // The common case: a token that is whole characters goes straight out.
                    if let Ok(s) = std::str::from_utf8(bytes) {
                        out.push_str(s);
                        return out.len() - before;
                    }
                }
                pending.extend_from_slice(bytes);
                let used = emit_complete(pending, out);
                pending.drain(..used);
            }
            Inner::Stream(s) => {
                if let Ok(Some(text)) = s.step(id) {
                    out.push_str(&text);
                }
            }
        }
        out.len() - before
    }

    /// Ends the stream: bytes of a character that never completed become U+FFFD.
    pub fn finish(&mut self, out: &mut String) -> usize {
        let before = out.len();
        if let Inner::Table { pending, .. } = &mut self.inner {
            if !pending.is_empty() {
                out.push_str(&String::from_utf8_lossy(pending));
                pending.clear();
            }
        }
        out.len() - before
    }
}

/// Appends the complete characters at the front of `buf` to `out` (an invalid sequence as
/// U+FFFD, as `from_utf8_lossy`) and returns how many bytes were consumed; an incomplete
/// character at the end stays.
fn emit_complete(buf: &[u8], out: &mut String) -> usize {
    let mut at = 0;
    loop {
        match std::str::from_utf8(&buf[at..]) {
            Ok(s) => {
                out.push_str(s);
                return buf.len();
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(std::str::from_utf8(&buf[at..at + valid]).unwrap_or_default());
                at += valid;
                match e.error_len() {
                    None => return at,
                    Some(n) => {
                        out.push('\u{FFFD}');
                        at += n;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_map_inverts_gpt2() {
        let inv = byte_level_inverse();
        assert_eq!(inv['Ġ' as usize], Some(b' '));
        assert_eq!(inv['Ċ' as usize], Some(b'\n'));
        assert_eq!(inv['ĉ' as usize], Some(b'\t'));
        assert_eq!(inv['!' as usize], Some(b'!'));
        assert_eq!(inv.iter().flatten().count(), 256);
    }

    #[test]
    fn emits_only_complete_characters() {
        let mut out = String::new();
        // "é" = C3 A9 split in two, then an invalid byte, then "a".
        assert_eq!(emit_complete(b"x\xC3", &mut out), 1);
        assert_eq!(out, "x");
        assert_eq!(emit_complete(b"\xC3\xA9\xFFa", &mut out), 4);
        assert_eq!(out, "xé\u{FFFD}a");
    }

    #[test]
    fn metaspace_pieces() {
        let mut b = Vec::new();
        push_metaspace(&mut b, "▁Hello▁", false);
        push_metaspace(&mut b, "<0xE2>", true);
        assert_eq!(b, b" Hello \xE2");
    }

    fn stepwise(tok: &crate::tokenizer::Tokenizer, ids: &[u32]) -> Vec<String> {
        let mut d = tok.decoder(false);
        ids.iter()
            .map(|&id| {
                let mut out = String::new();
                d.step(id, &mut out);
                out
            })
            .collect()
    }

    #[test]
    fn sentencepiece_byte_fallback_and_first_space() {
        let tj = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
            "pre_tokenizer":null,"post_processor":null,
            "decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},
                {"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]},
            "model":{"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,
                "end_of_word_suffix":null,"fuse_unk":true,"byte_fallback":true,"ignore_merges":false,
                "vocab":{"<unk>":0,"▁hi":1,"▁there":2,"<0xC3>":3,"<0xA9>":4,"▁":5},"merges":[]}}"#;
        let tok = crate::tokenizer::Tokenizer::from_parts(tj.as_bytes(), None, None).unwrap();
        let ids = [1, 2, 5, 3, 4];
        assert_eq!(stepwise(&tok, &ids), ["hi", " there", " ", "", "é"]);
        assert_eq!(tok.decode(&ids, false), tok.hf().decode(&ids, false).unwrap());
        let mut d = tok.decoder(false).continuing();
        let mut out = String::new();
        for id in ids {
            d.step(id, &mut out);
        }
        assert_eq!(out, " hi there é", "a continuation keeps its first space");
    }

    #[test]
    fn other_decoders_go_through_decode_stream() {
        let tj = r###"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
            "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,
            "decoder":{"type":"WordPiece","prefix":"##","cleanup":false},
            "model":{"type":"WordLevel","vocab":{"hello":0,"##s":1,"world":2,"[UNK]":3},"unk_token":"[UNK]"}}"###;
        let tok = crate::tokenizer::Tokenizer::from_parts(tj.as_bytes(), None, None).unwrap();
        assert!(TokenBytes::build(tok.hf()).is_none());
        assert_eq!(stepwise(&tok, &[0, 1, 2]), ["hello", "s", " world"]);
    }
}
