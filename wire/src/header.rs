//! Header values both the gateway and the tools interpret.

/// Strips leading and trailing ASCII whitespace.
pub fn trim(v: &[u8]) -> &[u8] {
    let s = v.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(v.len());
    let e = v.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(s, |e| e + 1);
    &v[s..e]
}

/// A Content-Length value: digits only (no sign, no list), at most 19 of them, no overflow.
pub fn parse_content_length(v: &[u8]) -> Option<u64> {
    let v = trim(v);
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    v.iter().try_fold(0u64, |acc, d| acc.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

/// Whether a comma-separated header value (`Connection`, `Transfer-Encoding`, …) has `token`.
pub fn has_token(v: &[u8], token: &[u8]) -> bool {
    v.split(|b| *b == b',').any(|t| trim(t).eq_ignore_ascii_case(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(trim(b"  a b \t"), b"a b");
        assert_eq!(parse_content_length(b" 42 "), Some(42));
        for bad in [&b""[..], b"-1", b"+1", b"1,1", b"4x", b"99999999999999999999"] {
            assert_eq!(parse_content_length(bad), None, "{bad:?}");
        }
        assert!(has_token(b"keep-alive, Close", b"close"));
        assert!(!has_token(b"closed", b"close"));
    }
}
