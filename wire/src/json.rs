//! JSON string literals: the one escaper the gateway (error envelopes, model lists, logs,
//! contract splices) and the tools (simulated responses, scenario bodies) all write with.
//! And the nesting bound every reader of untrusted JSON checks before a recursive parser
//! (sonic-rs's values and lazy skips recurse per level) sees the bytes.

/// Deepest array/object nesting any reader accepts: `serde_json`'s default recursion limit,
/// which SMG's own readers inherit.
pub const MAX_DEPTH: usize = 128;

/// Where `src` first nests an array or object deeper than `max` levels: the offset of the
/// opening bracket that goes past it, or `None` when nothing does. Brackets inside strings do
/// not count. One pass, no allocation, no recursion; the bytes need not be valid JSON (a
/// parser judges that afterwards, on bytes now known to be shallow enough for it).
///
/// Eight bytes at a time where they hold nothing that matters (numbers and spaces outside
/// strings, text inside them): measured on a 2 KB embeddings body, 0.37 µs against 2.2 µs
/// byte by byte (a 2 KB chat body: 0.69 µs against 1.6 µs), beside sonic-rs's own lazy
/// `model` read of 0.06 µs (`cargo bench --bench contract -- depth_bound`).
pub fn too_deep(src: &[u8], max: usize) -> Option<usize> {
    let (mut depth, mut i, n) = (0usize, 0usize, src.len());
    while i < n {
        while i + 8 <= n && !structural(word(src, i)) {
            i += 8;
        }
        if i >= n {
            break;
        }
        match src[i] {
            b'"' => {
                // To the closing quote; an escape takes the byte after it along.
                i += 1;
                loop {
                    while i + 8 <= n && !in_string_special(word(src, i)) {
                        i += 8;
                    }
                    if i >= n {
                        return None;
                    }
                    match src[i] {
                        b'"' => break,
                        b'\\' => i += 2,
                        _ => i += 1,
                    }
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return Some(i);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

const ONES: u64 = 0x0101_0101_0101_0101;

fn word(src: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(src[i..i + 8].try_into().expect("eight bytes"))
}

/// Some byte of `w` is zero (exact as to whether one is; SWAR).
fn has_zero(w: u64) -> bool {
    w.wrapping_sub(ONES) & !w & (ONES << 7) != 0
}

/// Some byte of `w` is `"`, `[`, `]`, `{` or `}` (setting bit 5 folds `[` onto `{` and `]`
/// onto `}`, and no other byte onto either).
fn structural(w: u64) -> bool {
    let folded = w | (ONES * 0x20);
    has_zero(w ^ (ONES * u64::from(b'"')))
        || has_zero(folded ^ (ONES * u64::from(b'{')))
        || has_zero(folded ^ (ONES * u64::from(b'}')))
}

/// Some byte of `w` is `"` or `\`.
fn in_string_special(w: u64) -> bool {
    has_zero(w ^ (ONES * u64::from(b'"'))) || has_zero(w ^ (ONES * u64::from(b'\\')))
}

/// Some byte of `w` is `"`, `\\` or a control byte (below 0x20): one that needs escaping.
fn needs_escape(w: u64) -> bool {
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & (ONES << 7) != 0;
    below_space || in_string_special(w)
}

/// Appends `s` as a quoted JSON string: `"` and `\\` escaped, control bytes as `\n`, `\r`,
/// `\t` or `\u00XX`; everything else (UTF-8 included) as is.
///
/// Eight bytes at a time past those that need nothing: a Responses turn writes its 1.2 KB
/// input twice (the stored item, the chat), measured at 2.4 µs a turn byte by byte
/// (`cargo bench --bench responses -- turn_1k`).
pub fn put_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(s.len() + 2);
    out.push(b'"');
    let bytes = s.as_bytes();
    let (mut start, mut i, n) = (0, 0, bytes.len());
    while i < n {
        if i + 8 <= n && !needs_escape(word(bytes, i)) {
            i += 8;
            continue;
        }
        let b = bytes[i];
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => &[b'\\', b'u', b'0', b'0', HEX[(b >> 4) as usize], HEX[(b & 15) as usize]],
            _ => {
                i += 1;
                continue;
            }
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(esc);
        i += 1;
        start = i;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::{put_str, too_deep};

    #[test]
    fn nesting_is_bounded_outside_strings() {
        assert_eq!(too_deep(b"[[[]]]", 3), None);
        assert_eq!(too_deep(b"[[[[]]]]", 3), Some(3));
        assert_eq!(too_deep(br#"{"a":{"b":[1]}}"#, 3), None);
        assert_eq!(too_deep(br#"{"a":{"b":[{}]}}"#, 3), Some(11));
        // Brackets in strings, escaped quotes included, are text.
        assert_eq!(too_deep(br#"["[[[[\"[[[[", "\\"]"#, 1), None);
        assert_eq!(too_deep(br#"["\\", [[]]]"#, 2), Some(8));
        // Siblings do not add up; closing brackets past zero do not go negative.
        assert_eq!(too_deep(b"[[],[],[]]]]][[", 2), None);
        let deep = "[".repeat(100_000);
        assert_eq!(too_deep(deep.as_bytes(), super::MAX_DEPTH), Some(super::MAX_DEPTH));
        // An unterminated string ends the scan.
        assert_eq!(too_deep(b"\"[[[[", 1), None);
    }

    /// The word-at-a-time scan agrees with a byte-at-a-time one wherever the special bytes
    /// fall relative to the 8-byte words.
    #[test]
    fn words_agree_with_bytes() {
        fn reference(src: &[u8], max: usize) -> Option<usize> {
            let (mut depth, mut i, mut in_str) = (0usize, 0usize, false);
            while i < src.len() {
                let b = src[i];
                if in_str {
                    match b {
                        b'\\' => i += 1,
                        b'"' => in_str = false,
                        _ => {}
                    }
                } else {
                    match b {
                        b'"' => in_str = true,
                        b'[' | b'{' => {
                            depth += 1;
                            if depth > max {
                                return Some(i);
                            }
                        }
                        b']' | b'}' => depth = depth.saturating_sub(1),
                        _ => {}
                    }
                }
                i += 1;
            }
            None
        }
        let alphabet = b"[]{}\"\\a1 ,:\x5b\x7b\xdb\xfd";
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for len in 0..200 {
            for _ in 0..50 {
                let input: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        alphabet[(x % alphabet.len() as u64) as usize]
                    })
                    .collect();
                for max in [0, 1, 3] {
                    assert_eq!(
                        too_deep(&input, max),
                        reference(&input, max),
                        "{:?} max {max}",
                        String::from_utf8_lossy(&input)
                    );
                }
            }
        }
    }

    #[test]
    fn escapes() {
        let mut out = Vec::new();
        put_str(&mut out, "a\"b\\c\nd\r\te\u{1}f é");
        assert_eq!(out, "\"a\\\"b\\\\c\\nd\\r\\te\\u0001f é\"".as_bytes());
    }

    #[test]
    fn escapes_wherever_the_byte_falls_in_a_word() {
        // Byte by byte, the reference.
        let reference = |s: &str| {
            let mut out = vec![b'"'];
            for c in s.bytes() {
                match c {
                    b'"' => out.extend_from_slice(b"\\\""),
                    b'\\' => out.extend_from_slice(b"\\\\"),
                    b'\n' => out.extend_from_slice(b"\\n"),
                    b'\r' => out.extend_from_slice(b"\\r"),
                    b'\t' => out.extend_from_slice(b"\\t"),
                    0..=0x1f => out.extend_from_slice(format!("\\u{c:04x}").as_bytes()),
                    _ => out.push(c),
                }
            }
            out.push(b'"');
            out
        };
        for special in ["\"", "\\", "\n", "\u{1f}", "\u{0}", "é", " ", "\u{7f}"] {
            for at in 0..20 {
                for len in at..24 {
                    let s: String = (0..len).map(|i| if i == at { special.to_string() } else { "x".into() }).collect();
                    let mut out = Vec::new();
                    put_str(&mut out, &s);
                    assert_eq!(out, reference(&s), "{s:?}");
                }
            }
        }
    }
}
