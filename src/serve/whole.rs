//! A worker's response body read by the gateway rather than relayed: piece by piece as the
//! framing gives it ([`BodyReader`]: a pair's answer with the prefill's logprobs merged in),
//! or whole up to `--max-payload-size` ([`read_whole`]: a Decisions reply to map, a pair's
//! prefill answer).

use std::time::Duration;

use smg_wire::chunked::ChunkedDecoder;

use super::error::WorkerCause;
use crate::http::pool::UpstreamConn;
use crate::http::response_head::{ResponseBody, ResponseHead};
use crate::io::{read_more_within, Timed};

/// Reads the body of the response whose head is at the start of `conn.buf`, undoing its
/// framing.
pub struct BodyReader {
    /// Where unread bytes start in `conn.buf`.
    at: usize,
    /// Body bytes given so far (a Content-Length body).
    given: u64,
    chunked: ChunkedDecoder,
    piece: Vec<u8>,
    /// The body ended, and whether the connection can be pooled after it.
    ended: Option<bool>,
}

impl BodyReader {
    pub fn new(head: &ResponseHead) -> Self {
        BodyReader { at: head.len, given: 0, chunked: ChunkedDecoder::new(), piece: Vec::new(), ended: None }
    }

    /// The next body bytes; None once the body has ended. `idle`: the longest silence.
    pub async fn next(
        &mut self,
        conn: &mut UpstreamConn,
        head: &ResponseHead,
        idle: Duration,
    ) -> Result<Option<&[u8]>, WorkerCause> {
        self.piece.clear();
        loop {
            if self.ended.is_some() {
                return Ok(None);
            }
            let have = &conn.buf[self.at..];
            let done = match head.body {
                ResponseBody::None => true,
                ResponseBody::Length { len } => {
                    let take = have.len().min((len - self.given) as usize);
                    self.piece.extend_from_slice(&have[..take]);
                    self.at += take;
                    self.given += take as u64;
                    self.given == len
                }
                ResponseBody::Chunked => {
                    let n = self.chunked.feed(have, Some(&mut self.piece)).map_err(|e| WorkerCause::BadBody(e.0))?;
                    self.at += n;
                    self.chunked.is_done()
                }
                ResponseBody::Close => {
                    self.piece.extend_from_slice(have);
                    self.at += have.len();
                    false
                }
            };
            if done {
                self.ended = Some(self.at == conn.buf.len() && head.keep_alive);
            }
            if !self.piece.is_empty() {
                return Ok(Some(&self.piece));
            }
            if done {
                return Ok(None);
            }
            // What was consumed goes; a partial chunk header stays for the next read.
            conn.buf.drain(head.len.min(self.at)..self.at);
            self.at = head.len.min(self.at);
            let (res, buf) = read_more_within(&mut conn.stream, std::mem::take(&mut conn.buf), 16 * 1024, idle).await;
            conn.buf = buf;
            match res {
                Timed::Done(Ok(n)) if n > 0 => {}
                Timed::Done(_) if head.body == ResponseBody::Close => self.ended = Some(false),
                _ => return Err(WorkerCause::BadBody("the worker's answer ended early")),
            }
        }
    }

    /// After the end: the connection can be pooled.
    pub fn reusable(&self) -> bool {
        self.ended == Some(true)
    }
}

/// The body of the response whose head is at the start of `conn.buf`, and whether the
/// connection can be pooled after it (the body ended cleanly, nothing after it, and the
/// worker keeps the connection open).
pub async fn read_whole(
    conn: &mut UpstreamConn,
    head: &ResponseHead,
    max: usize,
    idle: Duration,
) -> Result<(Vec<u8>, bool), WorkerCause> {
    let mut reader = BodyReader::new(head);
    let mut body = Vec::new();
    while let Some(piece) = reader.next(conn, head, idle).await? {
        body.extend_from_slice(piece);
        if body.len() > max {
            return Err(WorkerCause::TooLarge { len: body.len() as u64, max });
        }
    }
    Ok((body, reader.reusable()))
}
