//! SHA-1 (FIPS 180-4), only for the WebSocket handshake: `Sec-WebSocket-Accept` is the
//! SHA-1 of the client's key and a fixed GUID (RFC 6455 §4.2.2). Not for anything that
//! needs collision resistance.

/// The SHA-1 digest of the concatenation of `parts`.
pub fn sha1(parts: &[&[u8]]) -> [u8; 20] {
    let mut h: [u32; 5] = [0x6745_2301, 0xEFCD_AB89, 0x98BA_DCFE, 0x1032_5476, 0xC3D2_E1F0];
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut block = [0u8; 64];
    let mut fill = 0;
    for b in parts.iter().flat_map(|p| p.iter()) {
        block[fill] = *b;
        fill += 1;
        if fill == 64 {
            compress(&mut h, &block);
            fill = 0;
        }
    }
    // Padding: 0x80, zeros, then the message length in bits, big-endian, in 8 bytes.
    block[fill] = 0x80;
    fill += 1;
    if fill > 56 {
        block[fill..].fill(0);
        compress(&mut h, &block);
        fill = 0;
    }
    block[fill..56].fill(0);
    block[56..].copy_from_slice(&((total as u64) * 8).to_be_bytes());
    compress(&mut h, &block);
    let mut out = [0u8; 20];
    for (i, w) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
    }
    out
}

fn compress(h: &mut [u32; 5], block: &[u8; 64]) {
    let mut w = [0u32; 80];
    for i in 0..16 {
        w[i] = u32::from_be_bytes([block[4 * i], block[4 * i + 1], block[4 * i + 2], block[4 * i + 3]]);
    }
    for i in 16..80 {
        w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
    }
    let [mut a, mut b, mut c, mut d, mut e] = *h;
    for (i, wi) in w.iter().enumerate() {
        let (f, k) = match i {
            0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
            20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
            40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
            _ => (b ^ c ^ d, 0xCA62_C1D6),
        };
        let t = a.rotate_left(5).wrapping_add(f).wrapping_add(e).wrapping_add(k).wrapping_add(*wi);
        e = d;
        d = c;
        c = b.rotate_left(30);
        b = a;
        a = t;
    }
    for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
        *x = x.wrapping_add(y);
    }
}

#[cfg(test)]
mod tests {
    use super::sha1;

    fn hex(d: &[u8]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn fips_vectors() {
        assert_eq!(hex(&sha1(&[b"abc"])), "a9993e364706816aba3e25717850c26c9cd0d89d");
        assert_eq!(hex(&sha1(&[b""])), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        let long = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
        assert_eq!(hex(&sha1(&[long])), "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
        // Split across parts and block boundaries gives the same digest.
        assert_eq!(sha1(&[&long[..10], &long[10..]]), sha1(&[long]));
        let million = vec![b'a'; 1_000_000];
        assert_eq!(hex(&sha1(&[&million])), "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
    }
}
