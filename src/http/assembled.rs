//! A response the gateway writes itself while it assembles it (a gRPC worker's answer): SSE
//! events as they come, chunked (or close-delimited for HTTP/1.0), or one JSON body. The
//! client-side framing of relayed responses is in `relay.rs`; both frame chunks with
//! `smg_wire::chunked::put_chunk`.

use monoio::net::TcpStream;
use smg_wire::num::put_dec;

use super::relay::{RelayEnd, RelayStats};
use super::respond::{header_line, status_line, Stamp};
use super::usage::UsageScan;
use crate::io::write_all;

pub struct Assembled {
    head: Vec<u8>,
    head_sent: bool,
    streaming: bool,
    /// HTTP/1.0 stream: the body ends when the connection closes.
    raw: bool,
    close: bool,
    bytes: u64,
    first_byte: Option<std::time::Instant>,
    body: Option<Vec<u8>>,
}

// === impl Assembled ===

impl Assembled {
    /// A 200 naming `worker_url` (unless empty); `close`: the response says `connection: close`.
    pub fn new(streaming: bool, close: bool, worker_url: &str, stamp: Stamp<'_>) -> Self {
        let raw = streaming && stamp.http10;
        let close = close || raw;
        let mut h = Vec::with_capacity(256);
        status_line(&mut h, 200);
        if streaming {
            h.extend_from_slice(b"content-type: text/event-stream\r\ncache-control: no-cache\r\n");
            if !raw {
                h.extend_from_slice(b"transfer-encoding: chunked\r\n");
            }
        } else {
            h.extend_from_slice(b"content-type: application/json\r\n");
        }
        // Responses API answers do not name their worker (SMG's rule): they pass "".
        if !worker_url.is_empty() {
            header_line(&mut h, b"x-smg-routed-worker-id", worker_url.as_bytes());
        }
        Stamp { close, ..stamp }.write(&mut h);
        Assembled { head: h, head_sent: false, streaming, raw, close, bytes: 0, first_byte: None, body: None }
    }

    /// Some of the response reached the client.
    pub fn head_sent(&self) -> bool {
        self.head_sent
    }

    /// Writes SSE `events` (with the head first time); false when the client is gone.
    pub async fn send(&mut self, stream: &mut TcpStream, events: &[u8]) -> bool {
        if !self.streaming || events.is_empty() {
            return true;
        }
        let mut buf = Vec::with_capacity(events.len() + 16 + if self.head_sent { 0 } else { self.head.len() + 2 });
        if !self.head_sent {
            buf.extend_from_slice(&self.head);
            buf.extend_from_slice(b"\r\n");
            self.head_sent = true;
            self.first_byte = Some(crate::clock::now());
        }
        if self.raw {
            buf.extend_from_slice(events);
        } else {
            smg_wire::chunked::put_chunk(&mut buf, events);
        }
        write(stream, buf, &mut self.bytes).await
    }

    /// The whole JSON body, written by `finish`.
    pub fn whole(&mut self, body: Vec<u8>) {
        self.body = Some(body);
    }

    /// Ends the response (the last chunk, or the JSON body): how it ended, and its figures,
    /// with the engine's token counts as the usage a tenant budget settles on (and its cached
    /// prompt tokens, which the KV precision metric reads).
    pub async fn finish(
        mut self,
        stream: &mut TcpStream,
        end: RelayEnd,
        prompt: u64,
        completion: u64,
        cached: Option<u64>,
    ) -> (RelayEnd, RelayStats) {
        let mut buf = Vec::new();
        if let Some(body) = self.body.take() {
            buf.extend_from_slice(&self.head);
            buf.extend_from_slice(b"content-length: ");
            put_dec(&mut buf, body.len() as u64);
            buf.extend_from_slice(b"\r\n\r\n");
            buf.extend_from_slice(&body);
            self.first_byte = Some(crate::clock::now());
        } else if self.streaming && !self.raw && self.head_sent {
            buf.extend_from_slice(b"0\r\n\r\n");
        }
        let ok = buf.is_empty() || write(stream, buf, &mut self.bytes).await;
        let end = if ok { end } else { RelayEnd::ClientGone };
        let stats = RelayStats {
            first_byte: self.first_byte,
            bytes: self.bytes,
            close_delimited: self.raw || self.close,
            usage: UsageScan { on: true, prompt: Some(prompt), completion: Some(completion), cached },
            ..RelayStats::default()
        };
        (end, stats)
    }
}

async fn write(stream: &mut TcpStream, buf: Vec<u8>, bytes: &mut u64) -> bool {
    let len = buf.len() as u64;
    let (res, _) = write_all(stream, buf).await;
    if res.is_ok() {
        *bytes += len;
    }
    res.is_ok()
}
