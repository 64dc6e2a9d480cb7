//! The `model` query parameter of `GET /v1/realtime` and `POST /v1/realtime/calls`:
//! read from the form-urlencoded query (percent escapes and `+` decoded), and written back
//! encoded on the worker's request.

/// The decoded value of the first `name` parameter in `target`'s query, if any. Invalid
/// escapes are kept as written; bytes that are not UTF-8 are replaced.
pub fn param(target: &[u8], name: &[u8]) -> Option<String> {
    let q = target.iter().position(|&b| b == b'?').map(|i| &target[i + 1..])?;
    let q = q.split(|&b| b == b'#').next().unwrap_or(b"");
    for pair in q.split(|&b| b == b'&') {
        let (k, v) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &b""[..]),
        };
        if decode(k) == name {
            return Some(String::from_utf8_lossy(&decode(v)).into_owned());
        }
    }
    None
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

fn decode(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < s.len() => match (hex(s[i + 1]), hex(s[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// Appends `v` form-urlencoded (unreserved bytes as they are, space as `+`, the rest as
/// `%XX`), as SMG builds the worker's `?model=`.
pub fn put_encoded(out: &mut Vec<u8>, v: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in v.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => out.push(b),
            b' ' => out.push(b'+'),
            _ => out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_and_decodes() {
        assert_eq!(param(b"/v1/realtime?model=Qwen%2FQwen3-ASR", b"model").as_deref(), Some("Qwen/Qwen3-ASR"));
        assert_eq!(param(b"/v1/realtime?a=1&model=gpt+4o&model=x", b"model").as_deref(), Some("gpt 4o"));
        assert_eq!(param(b"/v1/realtime?model", b"model").as_deref(), Some(""));
        assert_eq!(param(b"/v1/realtime?models=x", b"model"), None);
        assert_eq!(param(b"/v1/realtime", b"model"), None);
        assert_eq!(param(b"/v1/realtime?model=100%", b"model").as_deref(), Some("100%"));
        assert_eq!(param(b"/v1/realtime?model=%zz", b"model").as_deref(), Some("%zz"));
    }

    #[test]
    fn encodes_as_smg_does() {
        let mut out = Vec::new();
        put_encoded(&mut out, "gpt 4o/Qwen:1");
        assert_eq!(out, b"gpt+4o%2FQwen%3A1");
    }
}
