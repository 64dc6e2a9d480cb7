//! The simulator's realtime worker: `GET /v1/realtime` as a WebSocket echo server, and the
//! Realtime REST routes as echoes of what they were sent.
//!
//! A session first sends `{"type":"session.created","session":{"id":"<unique>"}}` (so a
//! test can tell sessions apart), then answers every data frame with the same frame
//! (opcode, FIN bit and payload: fragments come back as fragments), a ping with a pong of
//! its payload, and a close with a close of the same payload (its code), after which it
//! closes the connection. Pongs are ignored. Payloads stream through one reused buffer as
//! they arrive, unmasked in place, so a message of any size costs no allocation.

use std::io;

use monoio::buf::IoBufMut;
use monoio::io::AsyncReadRent;
use monoio::net::TcpStream;
use smg_wire::ws;

use crate::rt::write_out;
use crate::sim::render::{put_json_str, put_response};
use crate::sim::worker::{bump, Worker};

pub const WS_PATH: &str = "/v1/realtime";
/// The REST routes the simulator echoes.
pub const REST_PATHS: [&str; 4] = [
    "/v1/realtime/calls",
    "/v1/realtime/sessions",
    "/v1/realtime/client_secrets",
    "/v1/realtime/transcription_sessions",
];

const READ: usize = 64 * 1024;

/// A REST route's answer: `{"object":"sim.realtime","path":…,"content_type":…,"body":…}`,
/// the body as a JSON string, so a test can check it arrived byte for byte.
pub fn rest_reply(w: &Worker, path: &str, content_type: &str, body: &[u8], keep_alive: bool, out: &mut Vec<u8>) {
    bump(&w.stats.inference, 1);
    let mut json = Vec::with_capacity(body.len() + 96);
    json.extend_from_slice(b"{\"object\":\"sim.realtime\",\"path\":");
    put_json_str(&mut json, path);
    json.extend_from_slice(b",\"content_type\":");
    put_json_str(&mut json, content_type);
    json.extend_from_slice(b",\"body\":");
    put_json_str(&mut json, &String::from_utf8_lossy(body));
    json.push(b'}');
    put_response(out, 200, "application/json", &json, keep_alive, &w.extra_headers);
}

/// Serves one upgraded connection: the `101` for `key`, then the echo until a close or EOF.
/// `buf` holds what the client sent after its upgrade request.
pub async fn session(w: &Worker, stream: &mut TcpStream, key: &[u8], mut buf: Vec<u8>) -> io::Result<()> {
    bump(&w.stats.inference, 1);
    let id = w.next_id.get();
    w.next_id.set(id + 1);
    let mut out = Vec::with_capacity(READ + ws::MAX_HEAD);
    out.extend_from_slice(
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: ",
    );
    out.extend_from_slice(&ws::accept(key));
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&w.extra_headers);
    out.extend_from_slice(b"\r\n");
    let event = format!("{{\"type\":\"session.created\",\"session\":{{\"id\":\"sess_{}_{id}\"}}}}", w.port);
    ws::put_head(&mut out, true, ws::OP_TEXT, event.len() as u64, None);
    out.extend_from_slice(event.as_bytes());
    write_out(stream, &mut out).await?;
    let mut echo = Echo::default();
    buf.reserve(READ);
    loop {
        let closing = echo.feed(&mut buf, &mut out);
        write_out(stream, &mut out).await?;
        if closing {
            return Ok(());
        }
        if buf.capacity() - buf.len() < READ / 2 {
            buf.reserve(READ);
        }
        let len = buf.len();
        let (res, slice) = stream.read(std::mem::take(&mut buf).slice_mut(len..)).await;
        buf = slice.into_inner();
        if res? == 0 {
            return Ok(());
        }
    }
}

/// The echo's place in the client's frame stream.
#[derive(Default)]
struct Echo {
    /// Payload bytes of the current data frame still to come, its mask and offset.
    left: u64,
    mask: Option<[u8; 4]>,
    offset: u64,
}

impl Echo {
    /// Turns what `buf` holds into the answers in `out`, leaving in `buf` only a frame head
    /// (or a control frame) not yet complete. True once a close was answered.
    fn feed(&mut self, buf: &mut Vec<u8>, out: &mut Vec<u8>) -> bool {
        let mut pos = 0;
        let mut closing = false;
        while pos < buf.len() {
            if self.left > 0 {
                let take = self.left.min((buf.len() - pos) as u64) as usize;
                let part = &mut buf[pos..pos + take];
                if let Some(m) = self.mask {
                    ws::apply_mask(part, m, self.offset);
                }
                out.extend_from_slice(part);
                self.offset += take as u64;
                self.left -= take as u64;
                pos += take;
                continue;
            }
            let Some(h) = ws::parse_head(&buf[pos..]) else { break };
            if h.is_control() {
                let end = pos + h.head_len + h.len as usize;
                if h.len > 125 || end > buf.len() {
                    // Control payloads are short; a too-long one is answered by closing.
                    closing = h.len > 125;
                    break;
                }
                let payload = &mut buf[pos + h.head_len..end];
                if let Some(m) = h.mask {
                    ws::apply_mask(payload, m, 0);
                }
                let reply = match h.opcode {
                    ws::OP_PING => Some(ws::OP_PONG),
                    ws::OP_CLOSE => Some(ws::OP_CLOSE),
                    _ => None,
                };
                if let Some(op) = reply {
                    ws::put_head(out, true, op, h.len, None);
                    out.extend_from_slice(payload);
                }
                pos = end;
                if h.opcode == ws::OP_CLOSE {
                    closing = true;
                    break;
                }
                continue;
            }
            ws::put_head(out, h.fin, h.opcode, h.len, None);
            (self.left, self.mask, self.offset) = (h.len, h.mask, 0);
            pos += h.head_len;
        }
        buf.drain(..pos);
        closing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoes_at_every_split() {
        let mask = [1, 2, 3, 4];
        let mut input = Vec::new();
        let mut want = Vec::new();
        for (fin, op, payload) in [
            (true, ws::OP_TEXT, &b"hello"[..]),
            (false, ws::OP_BINARY, &[7u8; 300][..]),
            (true, ws::OP_PING, b"p"),
            (true, ws::OP_CONT, &[9u8; 70_000][..]),
            (true, ws::OP_PONG, b""),
            (true, ws::OP_CLOSE, &[0x03, 0xE8][..]),
        ] {
            ws::put_head(&mut input, fin, op, payload.len() as u64, Some(mask));
            let mut masked = payload.to_vec();
            ws::apply_mask(&mut masked, mask, 0);
            input.extend_from_slice(&masked);
            if op != ws::OP_PONG {
                let op = if op == ws::OP_PING { ws::OP_PONG } else { op };
                ws::put_head(&mut want, fin, op, payload.len() as u64, None);
                want.extend_from_slice(payload);
            }
        }
        for step in [1, 3, 14, 1000, input.len()] {
            let (mut e, mut buf, mut out) = (Echo::default(), Vec::new(), Vec::new());
            let mut closed = false;
            for piece in input.chunks(step) {
                buf.extend_from_slice(piece);
                closed = e.feed(&mut buf, &mut out);
                if closed {
                    break;
                }
            }
            assert!(closed, "step {step}");
            assert_eq!(out, want, "step {step}");
        }
    }
}
