//! A faster encode for GPT-2-style byte-level BPE (SmolLM2, GPT-2, StarCoder, …), the same
//! ids as the `tokenizers` crate at a fraction of its cost. That crate's pre-tokenizer
//! keeps a byte-alignment table through every split and byte mapping and spends ~80% of an
//! encode there (measured: 325 of 414 µs for a 2 KB prompt); this path splits the `&str`
//! directly and hands each piece to the same BPE model (merges and cache unchanged).
//!
//! Taken only for exactly this shape of tokenizer.json: no normalizer; added tokens without
//! lstrip/rstrip/single_word; pre-tokenizer `ByteLevel` (no prefix space, GPT-2 regex),
//! optionally after `Digits(individual_digits)`; a BPE without dropout, affixes or byte
//! fallback. Anything else keeps the crate's path, and `Tokenizer` also checks both paths
//! agree on a probe corpus at load before it uses this one.

use ahash::AHashMap;
use aho_corasick::{AhoCorasick, MatchKind};
use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use tokenizers::models::bpe::BPE;
use tokenizers::{Model, ModelWrapper, Tokenizer as HfTokenizer};

/// GPT-2's pre-tokenizer regex without its `\s+(?!\S)` lookahead (the `regex` crate has none);
/// the lookahead is applied by hand in `split_gpt2`.
const GPT2_NO_LOOKAHEAD: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+";

pub struct ByteBpe {
    bpe: BPE,
    /// Pieces that are one vocabulary token, by their raw bytes: most words of a prompt
    /// (`Ġthe`) end here with one hash lookup, no byte mapping and no merge loop. Only
    /// tokens the merges themselves produce whole are here (checked at build), so the
    /// shortcut never disagrees with BPE.
    whole: AHashMap<Box<[u8]>, u32>,
    added: Option<(AhoCorasick, Vec<u32>)>,
    digits_first: bool,
    re: regex::Regex,
    /// GPT-2's byte → character map (`Ġ` for a space).
    byte_char: [char; 256],
}

impl std::fmt::Debug for ByteBpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteBpe").field("digits_first", &self.digits_first).finish_non_exhaustive()
    }
}

impl ByteBpe {
    /// The fast path for `tk`, or None when its configuration is not the one handled here.
    pub fn build(tk: &HfTokenizer) -> Option<ByteBpe> {
        if tk.get_normalizer().is_some() {
            return None;
        }
        let pre: sonic_rs::Value = sonic_rs::from_str(&sonic_rs::to_string(tk.get_pre_tokenizer()?).ok()?).ok()?;
        let digits_first = match pre["type"].as_str()? {
            "ByteLevel" if gpt2_byte_level(&pre) => false,
            "Sequence" => {
                let list = pre["pretokenizers"].as_array()?;
                let ok = list.len() == 2
                    && list[0]["type"].as_str() == Some("Digits")
                    && list[0]["individual_digits"].as_bool() == Some(true)
                    && gpt2_byte_level(&list[1]);
                if !ok {
                    return None;
                }
                true
            }
            _ => return None,
        };
        let ModelWrapper::BPE(bpe) = tk.get_model() else { return None };
        let plain = bpe.dropout.is_none_or(|p| p == 0.0)
            && bpe.continuing_subword_prefix.is_none()
            && bpe.end_of_word_suffix.is_none()
            && !bpe.byte_fallback;
        if !plain {
            return None;
        }
        let mut added: Vec<(u32, String)> = Vec::new();
        for (id, tok) in tk.get_added_tokens_decoder() {
            if tok.lstrip || tok.rstrip || tok.single_word {
                return None;
            }
            added.push((id, tok.content));
        }
        added.sort();
        let added = if added.is_empty() {
            None
        } else {
            // HF's added-vocabulary split: leftmost-longest over every added token.
            let ac = AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(added.iter().map(|(_, c)| c.as_str()))
                .ok()?;
            Some((ac, added.iter().map(|(id, _)| *id).collect()))
        };
        let byte_char = byte_chars();
        let mut char_byte = AHashMap::with_capacity(256);
        for (b, c) in byte_char.iter().enumerate() {
            char_byte.insert(*c, b as u8);
        }
        let vocab = bpe.get_vocab();
        let mut whole = AHashMap::with_capacity(vocab.len());
        for (tok, id) in vocab {
            let raw: Option<Vec<u8>> = tok.chars().map(|c| char_byte.get(&c).copied()).collect();
            let Some(raw) = raw else { continue };
            if bpe.tokenize(&tok).is_ok_and(|t| t.len() == 1 && t[0].id == id) {
                whole.insert(raw.into_boxed_slice(), id);
            }
        }
        // The checks above filled the BPE's word cache with words the shortcut now answers.
        bpe.clear_cache();
        let re = regex::Regex::new(GPT2_NO_LOOKAHEAD).ok()?;
        Some(ByteBpe { bpe: bpe.clone(), whole, added, digits_first, re, byte_char })
    }

    /// Appends `text`'s ids to `out`.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        let mut piece = String::with_capacity(64);
        self.encode_by_segment(text, out, |seg, out| self.encode_segment(seg, &mut piece, out))
    }

    /// Appends `text`'s ids to `out`: each added token's id, and what `segment` appends for
    /// the text between them (which encodes on its own: [`Self::encode_plain`]).
    pub fn encode_by_segment(
        &self,
        text: &str,
        out: &mut Vec<u32>,
        mut segment: impl FnMut(&str, &mut Vec<u32>) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut start = 0;
        if let Some((ac, ids)) = &self.added {
            for m in ac.find_iter(text) {
                segment(&text[start..m.start()], out)?;
                out.push(ids[m.pattern().as_usize()]);
                start = m.end();
            }
        }
        segment(&text[start..], out)
    }

    /// Appends the ids of text that holds no added token.
    pub fn encode_plain(&self, seg: &str, out: &mut Vec<u32>) -> Result<(), String> {
        self.encode_segment(seg, &mut String::with_capacity(64), out)
    }

    /// Text between added tokens: digits split off one by one (when configured), then the
    /// GPT-2 split, then BPE on each piece's byte-level form.
    fn encode_segment(&self, seg: &str, piece: &mut String, out: &mut Vec<u32>) -> Result<(), String> {
        if !self.digits_first {
            return self.split_gpt2(seg, piece, out);
        }
        let mut run = 0;
        for (i, c) in seg.char_indices() {
            if c.is_numeric() {
                self.split_gpt2(&seg[run..i], piece, out)?;
                self.split_gpt2(&seg[i..i + c.len_utf8()], piece, out)?;
                run = i + c.len_utf8();
            }
        }
        self.split_gpt2(&seg[run..], piece, out)
    }

    fn split_gpt2(&self, s: &str, piece: &mut String, out: &mut Vec<u32>) -> Result<(), String> {
        let mut pos = 0;
        while pos < s.len() {
            let Some(end) = piece_end(&self.re, s, pos, true) else { break };
            self.bpe_piece(&s[pos..end], piece, out)?;
            pos = end;
        }
        Ok(())
    }

    fn bpe_piece(&self, s: &str, piece: &mut String, out: &mut Vec<u32>) -> Result<(), String> {
        if let Some(&id) = self.whole.get(s.as_bytes()) {
            out.push(id);
            return Ok(());
        }
        piece.clear();
        for &b in s.as_bytes() {
            piece.push(self.byte_char[b as usize]);
        }
        let toks = self.bpe.tokenize(piece).map_err(|e| format!("tokenize: {e}"))?;
        out.extend(toks.iter().map(|t| t.id));
        Ok(())
    }
}

/// The end of the GPT-2 piece that starts at `pos`. Some alternative of the regex matches at
/// every position (`\s+` or `[^\s\p{L}\p{N}]+` or a letter/number run), so the match starts
/// at `pos`. `ascii`: decide on ASCII bytes where they settle it ([`ascii_match_end`]), the
/// regex otherwise: the regex's `find_at` costs ~60 ns a piece, about all of a 2 KB prompt's
/// encode (measured in `cargo bench --bench kv`: kv_match/2KB_chat_tokenized).
fn piece_end(re: &regex::Regex, s: &str, pos: usize, ascii: bool) -> Option<usize> {
    let found = if ascii { ascii_match_end(s.as_bytes(), pos) } else { None };
    let mut end = match found {
        Some(end) => end,
        None => re.find_at(s, pos)?.end(),
    };
    // `\s+(?!\S)`: a run of two or more whitespace characters followed by more text leaves
    // its last one to start the next piece (" word").
    let matched = &s[pos..end];
    if end < s.len() && matched.chars().all(char::is_whitespace) {
        if let Some(last) = matched.chars().next_back() {
            if matched.len() > last.len_utf8() {
                end -= last.len_utf8();
            }
        }
    }
    Some(end)
}

/// The end of the regex's match at `pos` (before the lookahead rule), when ASCII bytes decide
/// it; None when a non-ASCII character could (a Unicode letter, digit or space may continue a
/// run, or start one after a space).
fn ascii_match_end(b: &[u8], pos: usize) -> Option<usize> {
    // 0 whitespace, 1 letter, 2 digit, 3 other; None: not ASCII.
    let class = |c: u8| match c {
        b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ' => Some(0u8),
        b'a'..=b'z' | b'A'..=b'Z' => Some(1),
        b'0'..=b'9' => Some(2),
        0x80.. => None,
        _ => Some(3),
    };
    if b[pos] == b'\'' {
        let rest = &b[pos + 1..];
        for c in [&b"s"[..], b"t", b"re", b"ve", b"m", b"ll", b"d"] {
            if rest.starts_with(c) {
                return Some(pos + 1 + c.len());
            }
        }
    }
    // ` ?X+` for letters, digits and others: a space followed by one of them leads its run.
    let (run, k) = match (b[pos], b.get(pos + 1)) {
        (b' ', Some(&n)) => match class(n)? {
            0 => (pos, 0),
            k => (pos + 1, k),
        },
        (c, _) => (pos, class(c)?),
    };
    let mut end = run + 1;
    while end < b.len() {
        match class(b[end])? {
            c if c == k => end += 1,
            _ => break,
        }
    }
    Some(end)
}

fn gpt2_byte_level(v: &sonic_rs::Value) -> bool {
    v["type"].as_str() == Some("ByteLevel")
        && v["add_prefix_space"].as_bool() == Some(false)
        && v["use_regex"].as_bool() != Some(false)
}

/// GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the other 68 are
/// numbered from U+0100 in byte order.
pub fn byte_chars() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        map[b as usize] = if printable {
            b as char
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or('\0')
        };
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ASCII shortcut splits exactly as the regex does, on text mixing every class
    /// with non-ASCII letters, digits, spaces and symbols.
    #[test]
    fn the_ascii_split_is_the_regexs() {
        let re = regex::Regex::new(GPT2_NO_LOOKAHEAD).unwrap();
        let alphabet = [
            "a",
            "Z",
            "the",
            "7",
            "42",
            " ",
            "  ",
            "\t",
            "\n",
            "\r\n",
            "\u{b}",
            "'",
            "'s",
            "'re",
            "'ll",
            "'d",
            "'x",
            "!",
            "?.",
            "-",
            "_",
            "\"",
            "(",
            "\u{e9}",
            "\u{663}",
            "\u{bd}",
            "\u{a0}",
            "\u{3000}",
            "\u{4f60}",
            "\u{1f917}",
            "\u{2028}",
            "\u{85}",
            "<|im_end|>",
        ];
        let pieces = |text: &str, ascii: bool| {
            let (mut pos, mut out) = (0, Vec::new());
            while pos < text.len() {
                let end = piece_end(&re, text, pos, ascii).unwrap();
                out.push(text[pos..end].to_string());
                pos = end;
            }
            out
        };
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            let mut text = String::new();
            for _ in 0..(x % 24) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                text.push_str(alphabet[(x % alphabet.len() as u64) as usize]);
            }
            assert_eq!(pieces(&text, true), pieces(&text, false), "{text:?}");
        }
    }

    #[test]
    fn byte_chars_is_gpt2s() {
        let m = byte_chars();
        assert_eq!((m[b' ' as usize], m[b'\n' as usize], m[b'a' as usize], m[0xC3]), ('Ġ', 'Ċ', 'a', 'Ã'));
    }
}
