//! A worker's response body read whole, up to `--max-payload-size`: what the gateway reads
//! rather than relays (a Decisions reply to map, a pair's prefill answer).

use std::time::Duration;

use smg_wire::chunked::ChunkedDecoder;

use super::error::WorkerCause;
use crate::http::pool::UpstreamConn;
use crate::http::response_head::{ResponseBody, ResponseHead};
use crate::io::{read_more_within, Timed};

/// The body of the response whose head is at the start of `conn.buf`, and whether the
/// connection can be pooled after it (the body ended cleanly, nothing after it, and the
/// worker keeps the connection open). `idle`: the longest silence between reads.
pub async fn read_whole(
    conn: &mut UpstreamConn,
    head: &ResponseHead,
    max: usize,
    idle: Duration,
) -> Result<(Vec<u8>, bool), WorkerCause> {
    let mut at = head.len;
    let mut body = Vec::new();
    let mut chunked = ChunkedDecoder::new();
    loop {
        let have = &conn.buf[at..];
        let done = match head.body {
            ResponseBody::None => true,
            ResponseBody::Length { len } => {
                let take = have.len().min(len as usize - body.len());
                body.extend_from_slice(&have[..take]);
                at += take;
                body.len() as u64 == len
            }
            ResponseBody::Chunked => match chunked.feed(have, Some(&mut body)) {
                Ok(n) => {
                    at += n;
                    chunked.is_done()
                }
                Err(e) => return Err(WorkerCause::BadBody(e.0)),
            },
            ResponseBody::Close => {
                body.extend_from_slice(have);
                at += have.len();
                false
            }
        };
        if done {
            return Ok((body, at == conn.buf.len() && head.keep_alive));
        }
        if body.len() > max {
            return Err(WorkerCause::TooLarge { len: body.len() as u64, max });
        }
        conn.buf.drain(head.len.min(at)..at);
        at = head.len.min(at);
        let (res, buf) = read_more_within(&mut conn.stream, std::mem::take(&mut conn.buf), 16 * 1024, idle).await;
        conn.buf = buf;
        match res {
            Timed::Done(Ok(n)) if n > 0 => {}
            Timed::Done(_) if head.body == ResponseBody::Close => return Ok((body, false)),
            _ => return Err(WorkerCause::BadBody("the worker's answer ended early")),
        }
    }
}
