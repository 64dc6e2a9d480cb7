//! Routing hint headers and sticky keys: `X-SMG-Routing-Tokens`, `X-SMG-Routing-Key`,
//! `X-SMG-Target-Worker` and the body `rid` lineage.
//!
//! Every parser here returns `None` for a bad value: a malformed hint routes as if the header
//! were absent and never fails the request (the contract's "Routing Hint Headers").

/// `X-SMG-Routing-Tokens` carries at most this many ids.
pub const MAX_ROUTING_TOKENS: usize = 512;
/// `X-SMG-Routing-Tokens` is at most this many bytes.
pub const MAX_ROUTING_TOKENS_BYTES: usize = 4096;
/// A routing key (header value or stripped `rid`) is at most this many bytes.
pub const MAX_ROUTING_KEY_BYTES: usize = 128;

/// Strips the optional whitespace that frames an HTTP field value (RFC 9110 §5.5). Only the
/// frame: a space inside a value still makes it malformed.
fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// Parses `X-SMG-Routing-Tokens`: comma-separated decimal ids in `0..=4294967295` with no
/// spaces, signs or empty items, at most 512 ids and 4096 bytes. Anything else is `None`.
pub fn parse_routing_tokens(value: &[u8]) -> Option<Vec<u32>> {
    let v = trim_ows(value);
    if v.is_empty() || v.len() > MAX_ROUTING_TOKENS_BYTES {
        return None;
    }
    // Each id takes at least two bytes ("0,") except the last, so this bounds the allocation.
    let mut ids = Vec::with_capacity(v.len().div_ceil(2).min(MAX_ROUTING_TOKENS));
    // One pass, no per-item slicing: a u64 accumulator cannot overflow before the u32 check.
    let (mut n, mut digits) = (0u64, 0usize);
    for &b in v {
        if b == b',' {
            if digits == 0 || ids.len() == MAX_ROUTING_TOKENS {
                return None;
            }
            ids.push(n as u32);
            (n, digits) = (0, 0);
            continue;
        }
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        n = n * 10 + u64::from(d);
        if n > u64::from(u32::MAX) {
            return None;
        }
        digits += 1;
    }
    if digits == 0 || ids.len() == MAX_ROUTING_TOKENS {
        return None;
    }
    ids.push(n as u32);
    Some(ids)
}

/// Validates an `X-SMG-Routing-Key` (or any `--routing-key-headers`) value: non-empty UTF-8 of
/// at most 128 bytes.
pub fn valid_routing_key(value: &[u8]) -> Option<&str> {
    let v = trim_ows(value);
    if v.is_empty() || v.len() > MAX_ROUTING_KEY_BYTES {
        return None;
    }
    std::str::from_utf8(v).ok()
}

/// The first valid routing key among `names` (the `--routing-key-headers` list, in order),
/// looked up with `get` (case-insensitive on the caller's side). An invalid value is skipped
/// and the next name tried.
pub fn first_routing_key<'a>(names: &[String], mut get: impl FnMut(&str) -> Option<&'a [u8]>) -> Option<&'a str> {
    names.iter().filter_map(|n| get(n)).find_map(valid_routing_key)
}

/// Removes one trailing `_<tag><digits>` from `s`, unless nothing would be left.
fn strip_tag(s: &str, tag: u8) -> &str {
    let Some(us) = s.rfind('_') else { return s };
    let tail = &s.as_bytes()[us + 1..];
    match tail.split_first() {
        Some((&t, digits)) if t == tag && !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) => &s[..us],
        _ => s,
    }
}

/// The conversation key of a `rid` for `--routing-key-override`: one trailing retry suffix
/// `_r<n>` is removed, then one trailing turn suffix `_t<n>` (`conv_t2_r1` → `conv`). When
/// nothing would be left, the whole `rid` is the key (`_t1` stays `_t1`).
pub fn sticky_rid(rid: &str) -> &str {
    let stripped = strip_tag(strip_tag(rid, b'r'), b't');
    if stripped.is_empty() {
        rid
    } else {
        stripped
    }
}

/// The sticky key for a body `rid`, or `None` when the stripped key is empty or over 128
/// bytes (the caller then falls back to the routing-key headers).
pub fn rid_key(rid: &str) -> Option<&str> {
    let key = sticky_rid(rid);
    (!key.is_empty() && key.len() <= MAX_ROUTING_KEY_BYTES).then_some(key)
}

/// Parses `X-SMG-Target-Worker`: a 0-based decimal index. `None` when the header is present but
/// not an index: `consistent_hashing` answers both that and an index with no available worker
/// with 503, as SMG does.
pub fn parse_target_worker(value: &str) -> Option<usize> {
    let v = value.trim_matches([' ', '\t']);
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse::<usize>().ok()
}
