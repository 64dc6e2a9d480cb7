//! WebSocket wire facts (RFC 6455) shared by the gateway's relay, the simulator's realtime
//! worker and the load generator's client: the handshake's accept value, frame heads
//! (parse and write), masking. Payloads are never copied here.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use sha1::{Digest, Sha1};

pub const OP_CONT: u8 = 0x0;
pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

/// The longest frame head: 2 bytes, an 8-byte length, a 4-byte mask.
pub const MAX_HEAD: usize = 14;

/// The GUID every server appends to the client's key (RFC 6455 §1.3).
const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`: base64(SHA-1(key + GUID)).
pub fn accept(key: &[u8]) -> [u8; 28] {
    let digest = Sha1::new().chain_update(key).chain_update(GUID).finalize();
    let mut out = [0u8; 28];
    base64(&digest, &mut out);
    out
}

/// A valid `Sec-WebSocket-Key`: the (canonical, padded) base64 of 16 bytes, 24 characters.
pub fn valid_key(key: &[u8]) -> bool {
    // 18: what the decoder asks room for from 24 characters; 16 of them get written.
    let mut raw = [0u8; 18];
    key.len() == 24 && STANDARD.decode_slice(key, &mut raw) == Ok(16)
}

/// Standard base64 with padding of `src` into `out` (exactly `4 * ceil(len / 3)` long).
pub fn base64(src: &[u8], out: &mut [u8]) {
    debug_assert_eq!(out.len(), src.len().div_ceil(3) * 4);
    let n = STANDARD.encode_slice(src, out).expect("`out` holds the whole encoding");
    debug_assert_eq!(n, out.len());
}

/// A frame's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    pub fin: bool,
    /// The three RSV bits (an extension's; none is negotiated through the gateway).
    pub rsv: u8,
    pub opcode: u8,
    pub mask: Option<[u8; 4]>,
    pub len: u64,
    /// Bytes of the head itself (2 to 14).
    pub head_len: usize,
}

impl FrameHead {
    pub fn is_control(&self) -> bool {
        self.opcode & 0x8 != 0
    }
}

/// Parses the frame head at the start of `b`; None until all of it is there.
#[inline]
pub fn parse_head(b: &[u8]) -> Option<FrameHead> {
    if b.len() < 2 {
        return None;
    }
    let masked = b[1] & 0x80 != 0;
    let (len, at) = match b[1] & 0x7F {
        126 => (u64::from(u16::from_be_bytes([*b.get(2)?, *b.get(3)?])), 4),
        127 => {
            let x: [u8; 8] = b.get(2..10)?.try_into().ok()?;
            (u64::from_be_bytes(x), 10)
        }
        n => (u64::from(n), 2),
    };
    let (mask, head_len) = if masked {
        let m: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        (Some(m), at + 4)
    } else {
        (None, at)
    };
    Some(FrameHead { fin: b[0] & 0x80 != 0, rsv: (b[0] >> 4) & 0x7, opcode: b[0] & 0x0F, mask, len, head_len })
}

/// Appends a frame head (the shortest length encoding, as RFC 6455 §5.2 requires).
pub fn put_head(out: &mut Vec<u8>, fin: bool, opcode: u8, len: u64, mask: Option<[u8; 4]>) {
    out.push(if fin { 0x80 } else { 0 } | (opcode & 0x0F));
    let m = if mask.is_some() { 0x80 } else { 0 };
    if len < 126 {
        out.push(m | len as u8);
    } else if len <= 0xFFFF {
        out.push(m | 126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(m | 127);
        out.extend_from_slice(&len.to_be_bytes());
    }
    if let Some(k) = mask {
        out.extend_from_slice(&k);
    }
}

/// XORs `data` with `mask`, `data` starting `offset` bytes into the payload (masking is
/// its own inverse).
pub fn apply_mask(data: &mut [u8], mask: [u8; 4], offset: u64) {
    let start = (offset % 4) as usize;
    // Word at a time: the mask rotated to this offset, repeated.
    let rotated = [mask[start], mask[(start + 1) % 4], mask[(start + 2) % 4], mask[(start + 3) % 4]];
    let word = u64::from_ne_bytes([
        rotated[0], rotated[1], rotated[2], rotated[3], rotated[0], rotated[1], rotated[2], rotated[3],
    ]);
    let mut chunks = data.chunks_exact_mut(8);
    for c in &mut chunks {
        let v = u64::from_ne_bytes(c.try_into().expect("8 bytes")) ^ word;
        c.copy_from_slice(&v.to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= rotated[i % 4];
    }
}

/// A close frame with `code` and no reason, masked with `mask` when given (a client's).
pub fn close_frame(code: u16, mask: Option<[u8; 4]>) -> ([u8; 8], usize) {
    let mut out = Vec::with_capacity(8);
    put_head(&mut out, true, OP_CLOSE, 2, mask);
    let mut payload = code.to_be_bytes();
    if let Some(k) = mask {
        apply_mask(&mut payload, k, 0);
    }
    out.extend_from_slice(&payload);
    let mut a = [0u8; 8];
    a[..out.len()].copy_from_slice(&out);
    (a, out.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_accept_example() {
        // RFC 6455 §1.3.
        assert_eq!(&accept(b"dGhlIHNhbXBsZSBub25jZQ=="), b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert!(valid_key(b"dGhlIHNhbXBsZSBub25jZQ=="));
        assert!(!valid_key(b"dGhlIHNhbXBsZSBub25jZQ="));
        assert!(!valid_key(b"dGhlIHNhbXBsZSBub25j*Q=="));
        // Not canonical: the last character carries bits past the 16 bytes.
        assert!(!valid_key(b"dGhlIHNhbXBsZSBub25jZR=="));
    }

    #[test]
    fn base64_lengths() {
        let mut o = [0u8; 8];
        base64(b"foob", &mut o);
        assert_eq!(&o, b"Zm9vYg==");
        let mut o = [0u8; 4];
        base64(b"fo", &mut o);
        assert_eq!(&o, b"Zm8=");
        base64(b"foo", &mut o);
        assert_eq!(&o, b"Zm9v");
    }

    #[test]
    fn heads_round_trip_and_need_all_bytes() {
        for len in [0u64, 125, 126, 65535, 65536, 1 << 40] {
            for mask in [None, Some([1, 2, 3, 4])] {
                let mut b = Vec::new();
                put_head(&mut b, true, OP_BINARY, len, mask);
                for cut in 0..b.len() {
                    assert_eq!(parse_head(&b[..cut]), None, "len {len} cut {cut}");
                }
                let h = parse_head(&b).unwrap();
                assert_eq!((h.fin, h.opcode, h.len, h.mask, h.head_len), (true, OP_BINARY, len, mask, b.len()));
            }
        }
    }

    #[test]
    fn mask_at_any_offset() {
        let key = [0x37, 0xfa, 0x21, 0x3d];
        let plain: Vec<u8> = (0..100u8).collect();
        let mut whole = plain.clone();
        apply_mask(&mut whole, key, 0);
        for split in 0..plain.len() {
            let mut parts = plain.clone();
            let (a, b) = parts.split_at_mut(split);
            apply_mask(a, key, 0);
            apply_mask(b, key, split as u64);
            assert_eq!(parts, whole, "split {split}");
        }
        assert_eq!(whole[1], 1 ^ 0xfa);
    }

    #[test]
    fn close_frames() {
        let (f, n) = close_frame(1009, None);
        assert_eq!(&f[..n], &[0x88, 0x02, 0x03, 0xF1]);
        let (f, n) = close_frame(1009, Some([1, 2, 3, 4]));
        assert_eq!(&f[..n], &[0x88, 0x82, 1, 2, 3, 4, 0x03 ^ 1, 0xF1 ^ 2]);
    }
}
