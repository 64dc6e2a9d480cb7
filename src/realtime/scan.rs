//! The frame scanner of one relay direction: it reads frame heads as the bytes stream past
//! (a head may be split anywhere across reads), never the payloads, and says how much of
//! what was read may go on. It enforces what a verbatim relay must: `--max-payload-size`
//! per message (the sum over a message's fragments, control frames apart), well-formed
//! fragmentation and control frames, and no RSV bits (the gateway negotiates no extension,
//! so a worker and client that set them disagree with what the handshake said).

use smg_wire::ws::{self, FrameHead};

/// Close codes the gateway sends (RFC 6455 §7.4.1).
pub const CLOSE_PROTOCOL: u16 = 1002;
pub const CLOSE_TOO_BIG: u16 = 1009;

/// What a scan of the bytes read so far allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// `buf[..n]` may be forwarded; the rest (a frame head cut short) waits for more bytes.
    /// `closed`: a close frame ends at `n`, and nothing after it is forwarded.
    Forward { n: usize, closed: bool },
    /// `buf[..n]` may be forwarded (whole frames); the frame at `n` breaks the rules and
    /// the session ends with close `code`.
    Violation { n: usize, code: u16 },
}

#[derive(Debug, Clone)]
pub struct Scanner {
    max: u64,
    /// Payload bytes of the current frame not yet seen.
    left: u64,
    /// Payload bytes of the data message in progress so far (None: between messages).
    message: Option<u64>,
    /// The frame being passed is a close frame.
    in_close: bool,
}

// === impl Scanner ===

impl Scanner {
    pub fn new(max_message: u64) -> Self {
        Scanner { max: max_message, left: 0, message: None, in_close: false }
    }

    /// Nothing of a frame is half passed: a frame of ours may be written next.
    pub fn at_boundary(&self) -> bool {
        self.left == 0
    }

    /// Payload bytes of the current frame still to pass.
    pub fn left(&self) -> u64 {
        self.left
    }

    /// Scans `buf`, which starts where the previous scan's forwarded bytes ended.
    pub fn scan(&mut self, buf: &[u8]) -> Scan {
        let mut pos = 0;
        loop {
            if self.left > 0 {
                let take = self.left.min((buf.len() - pos) as u64);
                pos += take as usize;
                self.left -= take;
                if self.left > 0 {
                    return Scan::Forward { n: pos, closed: false };
                }
                if self.in_close {
                    return Scan::Forward { n: pos, closed: true };
                }
            }
            let Some(h) = ws::parse_head(&buf[pos..]) else { return Scan::Forward { n: pos, closed: false } };
            if let Err(code) = self.admit(&h) {
                return Scan::Violation { n: pos, code };
            }
            pos += h.head_len;
            self.left = h.len;
            if self.left == 0 && self.in_close {
                return Scan::Forward { n: pos, closed: true };
            }
        }
    }

    /// Checks a frame head against the rules and the message being built.
    fn admit(&mut self, h: &FrameHead) -> Result<(), u16> {
        if h.rsv != 0 {
            return Err(CLOSE_PROTOCOL);
        }
        if h.is_control() {
            // Control frames may come between fragments; they are short and never split.
            if !h.fin || h.len > 125 || !matches!(h.opcode, ws::OP_CLOSE | ws::OP_PING | ws::OP_PONG) {
                return Err(CLOSE_PROTOCOL);
            }
            self.in_close = h.opcode == ws::OP_CLOSE;
            return Ok(());
        }
        let so_far = match (h.opcode, self.message) {
            (ws::OP_CONT, Some(n)) => n,
            (ws::OP_TEXT | ws::OP_BINARY, None) => 0,
            _ => return Err(CLOSE_PROTOCOL),
        };
        let total = so_far.saturating_add(h.len);
        if total > self.max {
            return Err(CLOSE_TOO_BIG);
        }
        self.message = if h.fin { None } else { Some(total) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smg_wire::ws::{put_head, OP_BINARY, OP_CLOSE, OP_CONT, OP_PING, OP_TEXT};

    fn frame(out: &mut Vec<u8>, fin: bool, op: u8, len: usize) {
        put_head(out, fin, op, len as u64, Some([9, 8, 7, 6]));
        out.extend(std::iter::repeat_n(b'x', len));
    }

    /// Feeds `bytes` in pieces of `step` as a relay would (keeping held-back bytes at the
    /// front) and returns the bytes forwarded and the last scan.
    fn feed(s: &mut Scanner, bytes: &[u8], step: usize) -> (Vec<u8>, Scan) {
        let mut buf = Vec::new();
        let mut out = Vec::new();
        let mut last = Scan::Forward { n: 0, closed: false };
        for piece in bytes.chunks(step) {
            buf.extend_from_slice(piece);
            last = s.scan(&buf);
            match last {
                Scan::Forward { n, closed } => {
                    out.extend_from_slice(&buf[..n]);
                    buf.drain(..n);
                    if closed {
                        break;
                    }
                }
                Scan::Violation { n, .. } => {
                    out.extend_from_slice(&buf[..n]);
                    break;
                }
            }
        }
        (out, last)
    }

    #[test]
    fn frames_pass_whole_at_every_split() {
        let mut b = Vec::new();
        frame(&mut b, true, OP_TEXT, 5);
        frame(&mut b, false, OP_BINARY, 300);
        frame(&mut b, true, OP_PING, 3);
        frame(&mut b, true, OP_CONT, 70_000);
        frame(&mut b, true, OP_CLOSE, 2);
        let mut after = b.clone();
        frame(&mut after, true, OP_TEXT, 1);
        for step in [1, 2, 3, 7, 13, 14, 100, 4096, after.len()] {
            let mut s = Scanner::new(1 << 20);
            let (out, last) = feed(&mut s, &after, step);
            assert_eq!(out, b, "step {step}: everything up to the close, nothing after");
            assert!(matches!(last, Scan::Forward { closed: true, .. }), "step {step}");
            assert!(s.at_boundary());
        }
    }

    #[test]
    fn a_message_over_the_limit_stops_at_its_frame() {
        // 60 + 50 over a limit of 100: the second fragment's head is where it stops.
        let mut b = Vec::new();
        frame(&mut b, true, OP_TEXT, 100);
        frame(&mut b, false, OP_BINARY, 60);
        frame(&mut b, true, OP_PING, 0);
        let ok = b.len();
        frame(&mut b, true, OP_CONT, 50);
        for step in [1, 5, 64, b.len()] {
            let mut s = Scanner::new(100);
            let (out, last) = feed(&mut s, &b, step);
            assert_eq!(out.len(), ok, "step {step}");
            assert!(matches!(last, Scan::Violation { code: CLOSE_TOO_BIG, .. }));
        }
    }

    #[test]
    fn broken_fragmentation_and_control_frames_are_protocol_errors() {
        type Case<'a> = &'a dyn Fn(&mut Vec<u8>);
        let cases: [Case<'_>; 4] = [
            &|b| frame(b, true, OP_CONT, 1),
            &|b| {
                frame(b, false, OP_TEXT, 1);
                frame(b, true, OP_TEXT, 1);
            },
            &|b| frame(b, false, OP_PING, 1),
            &|b| frame(b, true, OP_PING, 126),
        ];
        for (i, make) in cases.iter().enumerate() {
            let mut b = Vec::new();
            make(&mut b);
            let (_, last) = feed(&mut Scanner::new(1 << 20), &b, b.len());
            assert!(matches!(last, Scan::Violation { code: CLOSE_PROTOCOL, .. }), "case {i}: {last:?}");
        }
        let rsv = [0xC1u8, 0x80, 0, 0, 0, 0];
        assert_eq!(Scanner::new(10).scan(&rsv), Scan::Violation { n: 0, code: CLOSE_PROTOCOL });
    }
}
