//! A blocking WebSocket client for tests: the handshake as a browser sends it, masked
//! frames out, whole messages (or single frames) in.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use smg_wire::ws;

use super::{patience, read_response, Response};

pub struct Ws {
    pub s: TcpStream,
    rest: Vec<u8>,
    seed: u32,
}

/// A frame as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub fin: bool,
    pub opcode: u8,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.payload).into_owned()
    }
    pub fn close_code(&self) -> Option<u16> {
        (self.opcode == ws::OP_CLOSE && self.payload.len() >= 2)
            .then(|| u16::from_be_bytes([self.payload[0], self.payload[1]]))
    }
}

pub const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// The upgrade request for `target` with extra header lines.
pub fn upgrade_request(target: &str, headers: &[&str]) -> String {
    let mut r = format!(
        "GET {target} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {KEY}\r\n"
    );
    for h in headers {
        r.push_str(h);
        r.push_str("\r\n");
    }
    r.push_str("\r\n");
    r
}

/// Sends `request` and reads the answer: Ok(session) on a valid `101`, Err(answer) otherwise.
pub fn open_raw(port: u16, request: &str) -> Result<Ws, Response> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(patience(Duration::from_secs(20)))).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut rest = Vec::new();
    let r = read_response(&mut s, &mut rest, true).unwrap();
    if r.status != 101 {
        // The head was read alone: read the body the answer declares.
        let mut full = r;
        if let Some(len) = full.header("content-length").and_then(|v| v.parse::<usize>().ok()) {
            while rest.len() < len {
                if super::fill(&mut s, &mut rest).is_err() {
                    break;
                }
            }
            full.body = rest[..len.min(rest.len())].to_vec();
        }
        return Err(full);
    }
    let accept = std::str::from_utf8(&ws::accept(KEY.as_bytes())).unwrap().to_owned();
    assert_eq!(r.header("sec-websocket-accept"), Some(accept.as_str()), "accept for our key");
    assert!(r.header("upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket")));
    Ok(Ws { s, rest, seed: 0x9e37_79b9 })
}

/// Opens a session to `model` with a bearer token.
pub fn open(port: u16, model: &str) -> Ws {
    match open_raw(port, &upgrade_request(&format!("/v1/realtime?model={model}"), &["Authorization: Bearer t"])) {
        Ok(ws) => ws,
        Err(r) => panic!("no upgrade: {} {}", r.status, r.text()),
    }
}

impl Ws {
    fn mask(&mut self) -> [u8; 4] {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 17;
        self.seed ^= self.seed << 5;
        self.seed.to_ne_bytes()
    }

    /// Sends one frame, masked as a client must.
    pub fn send_frame(&mut self, fin: bool, opcode: u8, payload: &[u8]) {
        let mask = self.mask();
        let mut out = Vec::with_capacity(payload.len() + ws::MAX_HEAD);
        ws::put_head(&mut out, fin, opcode, payload.len() as u64, Some(mask));
        let at = out.len();
        out.extend_from_slice(payload);
        ws::apply_mask(&mut out[at..], mask, 0);
        // The gateway may close on us mid-write (an oversize message): that is the test's to judge.
        let _ = self.s.write_all(&out);
    }

    pub fn send(&mut self, opcode: u8, payload: &[u8]) {
        self.send_frame(true, opcode, payload);
    }

    /// The next frame, or None when the connection closed first.
    pub fn recv_frame(&mut self) -> Option<Frame> {
        loop {
            if let Some(h) = ws::parse_head(&self.rest) {
                assert!(h.mask.is_none(), "frames to a client are never masked");
                let end = h.head_len + h.len as usize;
                if self.rest.len() >= end {
                    let payload = self.rest[h.head_len..end].to_vec();
                    self.rest.drain(..end);
                    return Some(Frame { fin: h.fin, opcode: h.opcode, payload });
                }
            }
            let mut tmp = vec![0u8; 256 * 1024];
            match self.s.read(&mut tmp) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.rest.extend_from_slice(&tmp[..n]),
            }
        }
    }

    pub fn recv(&mut self) -> Frame {
        self.recv_frame().expect("a frame before the connection closed")
    }

    /// True when the peer closed the TCP connection (after any frames still buffered).
    pub fn closed(&mut self) -> bool {
        self.rest.clear();
        super::closed_within(&mut self.s, Duration::from_secs(10))
    }
}
