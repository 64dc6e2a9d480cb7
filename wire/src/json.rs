//! JSON string literals: the one escaper the gateway (error envelopes, model lists, logs,
//! contract splices) and the tools (simulated responses, scenario bodies) all write with.

/// Appends `s` as a quoted JSON string: `"` and `\` escaped, control bytes as `\n`, `\r`,
/// `\t` or `\u00XX`; everything else (UTF-8 included) as is.
pub fn put_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(s.len() + 2);
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => &[b'\\', b'u', b'0', b'0', HEX[(b >> 4) as usize], HEX[(b & 15) as usize]],
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(esc);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::put_str;

    #[test]
    fn escapes() {
        let mut out = Vec::new();
        put_str(&mut out, "a\"b\\c\nd\r\te\u{1}f é");
        assert_eq!(out, "\"a\\\"b\\\\c\\nd\\r\\te\\u0001f é\"".as_bytes());
    }
}
