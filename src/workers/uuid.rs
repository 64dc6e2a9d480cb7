//! Worker ids for the admin API: UUIDv7 strings, as SMG hands out.

/// A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random bits.
pub fn uuid_v7() -> String {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let mut r = [0u8; 10];
    // SAFETY: getrandom writes at most `r.len()` bytes into `r`.
    let n = unsafe { libc::getrandom(r.as_mut_ptr().cast(), r.len(), 0) };
    if n != r.len() as isize {
        let seed = ms ^ u64::from(std::process::id()).rotate_left(32);
        r[..8].copy_from_slice(&seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
    }
    let mut u = [0u8; 16];
    u[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    u[6..].copy_from_slice(&r);
    u[6] = (u[6] & 0x0F) | 0x70;
    u[8] = (u[8] & 0x3F) | 0x80;
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}
