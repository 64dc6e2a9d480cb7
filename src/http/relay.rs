//! Relay phase: worker response → client, each upstream read written before the next.
//!
//! While we wait on the worker we also watch the client socket for EOF (readiness plus
//! MSG_PEEK, so pipelined bytes stay put). The upstream read is never cancelled to do
//! that: when the client leaves we drop the whole upstream connection, which closes the
//! socket at once and makes the engine abort the generation.
//!
//! The watch is armed only after the worker has been silent for [`WATCH_AFTER`]. Arming it
//! costs a readiness syscall (epoll) or a PollAdd plus its cancel (io_uring); measured with
//! strace on chat-1k, an always-on watch was 0.8 extra syscalls per request (~15% of them),
//! while a response that arrives within 20 ms has no client to lose. A user-space timer
//! costs no syscall, and a client leaving a stalled stream is still seen within ~20 ms.

use std::io;
use std::pin::pin;

use std::time::Duration;

use monoio::net::TcpStream;

use super::chunked::ChunkedDecoder;
use super::upstream::{parse_response, ResponseBody, ResponseHead, UpstreamConn, UPSTREAM_BUF};
use crate::runtime::io::{peer_closed, read_more, write_all, write_range, Pair};

/// How long the worker may be silent before we start watching the client.
pub const WATCH_AFTER: Duration = Duration::from_millis(20);

/// Resolves when the client closed (true) or sent bytes (false), after [`WATCH_AFTER`].
async fn client_left(client: &TcpStream) -> bool {
    monoio::time::sleep(WATCH_AFTER).await;
    peer_closed(client).await
}

/// One read from the worker, raced against the client leaving.
pub enum Read {
    Data(usize),
    Eof,
    Err(io::Error),
    ClientGone,
}

/// Appends the next upstream read to `up.buf`.
pub async fn read_watching(up: &mut UpstreamConn, client: &TcpStream, watch: &mut bool) -> Read {
    let buf = std::mem::take(&mut up.buf);
    let mut fut = pin!(read_more(&mut up.stream, buf, UPSTREAM_BUF / 2));
    if *watch {
        monoio::select! {
            biased;
            r = &mut fut => return finish(&mut up.buf, r),
            closed = client_left(client) => {
                if closed {
                    return Read::ClientGone;
                }
                // The client pipelined its next request; stop watching, keep reading.
                *watch = false;
            }
        }
    }
    let r = fut.await;
    finish(&mut up.buf, r)
}

fn finish(slot: &mut Vec<u8>, (res, buf): (io::Result<usize>, Vec<u8>)) -> Read {
    *slot = buf;
    match res {
        Ok(0) => Read::Eof,
        Ok(n) => Read::Data(n),
        Err(e) => Read::Err(e),
    }
}

/// Why no response head arrived.
pub enum HeadError {
    ClientGone,
    /// The worker closed or failed before sending any byte (a stale pooled socket looks
    /// exactly like this, which is what makes the silent retry safe).
    NothingReceived(io::Error),
    /// The worker sent something unusable or stopped mid-head.
    Bad(&'static str),
    /// No head within the request timeout.
    TimedOut,
}

/// Reads until a final (non-1xx) response head is in `up.buf`, for at most `limit`.
///
/// Most heads arrive within [`WATCH_AFTER`], so the fast path arms one timer; only a
/// silent worker gets the client watch and the request-timeout timer.
pub async fn read_head(
    up: &mut UpstreamConn,
    client: &TcpStream,
    watch: &mut bool,
    limit: Duration,
) -> Result<ResponseHead, HeadError> {
    let mut head = pin!(read_head_unwatched(up));
    monoio::select! {
        biased;
        r = &mut head => return r,
        _ = monoio::time::sleep(WATCH_AFTER) => {}
    }
    let mut expired = pin!(monoio::time::sleep(limit.saturating_sub(WATCH_AFTER)));
    loop {
        if !*watch {
            monoio::select! {
                biased;
                r = &mut head => return r,
                _ = &mut expired => return Err(HeadError::TimedOut),
            }
        }
        monoio::select! {
            biased;
            r = &mut head => return r,
            _ = &mut expired => return Err(HeadError::TimedOut),
            closed = peer_closed(client) => {
                if closed {
                    return Err(HeadError::ClientGone);
                }
                // The client pipelined its next request; stop watching, keep waiting.
                *watch = false;
            }
        }
    }
}

async fn read_head_unwatched(up: &mut UpstreamConn) -> Result<ResponseHead, HeadError> {
    let mut received = false;
    loop {
        if !up.buf.is_empty() {
            match parse_response(&up.buf) {
                Ok(Some(h)) if h.status < 200 => {
                    up.buf.drain(..h.len);
                    continue;
                }
                Ok(Some(h)) => return Ok(h),
                Ok(None) => {}
                Err(e) => return Err(HeadError::Bad(e.0)),
            }
        }
        let (res, buf) = read_more(&mut up.stream, std::mem::take(&mut up.buf), UPSTREAM_BUF / 2).await;
        up.buf = buf;
        match res {
            Ok(n) if n > 0 => received = true,
            Ok(_) if !received => return Err(HeadError::NothingReceived(io::ErrorKind::UnexpectedEof.into())),
            Err(e) if !received => return Err(HeadError::NothingReceived(e)),
            _ => return Err(HeadError::Bad("connection closed mid-head")),
        }
    }
}

pub enum RelayEnd {
    /// The whole body reached the client; the upstream connection may be pooled.
    Done {
        reusable: bool,
    },
    ClientGone,
    /// The worker died or broke framing mid-body: the client's response is cut short.
    UpstreamDied(&'static str),
}

/// Writes `client_head` plus the body as it arrives. Returns the head buffer for reuse.
pub async fn relay_body(
    client: &mut TcpStream,
    up: &mut UpstreamConn,
    head: &ResponseHead,
    client_head: Vec<u8>,
    mut watch: bool,
) -> (RelayEnd, Vec<u8>) {
    let start = head.len;
    match head.body {
        ResponseBody::None => {
            let reusable = head.keep_alive && up.buf.len() == start;
            let (res, h) = write_all(client, client_head).await;
            (if res.is_ok() { RelayEnd::Done { reusable } } else { RelayEnd::ClientGone }, h)
        }
        ResponseBody::Length { len } => {
            let first = (up.buf.len() - start).min(len as usize);
            let mut extra = up.buf.len() - start > first;
            let buf = std::mem::take(&mut up.buf);
            let (res, h, buf) = Pair::write(client, client_head, buf, start, start + first).await;
            up.buf = buf;
            if res.is_err() {
                return (RelayEnd::ClientGone, h);
            }
            let mut remaining = len - first as u64;
            while remaining > 0 {
                up.buf.clear();
                let n = match read_watching(up, client, &mut watch).await {
                    Read::Data(n) => n,
                    Read::ClientGone => return (RelayEnd::ClientGone, h),
                    Read::Eof | Read::Err(_) => {
                        return (RelayEnd::UpstreamDied("closed before the end of its body"), h)
                    }
                };
                let take = (n as u64).min(remaining) as usize;
                extra |= n > take;
                remaining -= take as u64;
                let (res, buf) = write_range(client, std::mem::take(&mut up.buf), 0, take).await;
                up.buf = buf;
                if res.is_err() {
                    return (RelayEnd::ClientGone, h);
                }
            }
            (RelayEnd::Done { reusable: head.keep_alive && !extra }, h)
        }
        ResponseBody::Chunked => {
            let mut dec = ChunkedDecoder::new();
            let used = match dec.feed(&up.buf[start..], None) {
                Ok(n) => n,
                Err(e) => return (RelayEnd::UpstreamDied(e.0), client_head),
            };
            let mut extra = start + used < up.buf.len();
            let buf = std::mem::take(&mut up.buf);
            let (res, h, buf) = Pair::write(client, client_head, buf, start, start + used).await;
            up.buf = buf;
            if res.is_err() {
                return (RelayEnd::ClientGone, h);
            }
            while !dec.is_done() {
                up.buf.clear();
                let n = match read_watching(up, client, &mut watch).await {
                    Read::Data(n) => n,
                    Read::ClientGone => return (RelayEnd::ClientGone, h),
                    Read::Eof | Read::Err(_) => return (RelayEnd::UpstreamDied("closed mid-stream"), h),
                };
                let used = match dec.feed(&up.buf[..n], None) {
                    Ok(u) => u,
                    Err(e) => return (RelayEnd::UpstreamDied(e.0), h),
                };
                extra |= used < n;
                let (res, buf) = write_range(client, std::mem::take(&mut up.buf), 0, used).await;
                up.buf = buf;
                if res.is_err() {
                    return (RelayEnd::ClientGone, h);
                }
            }
            (RelayEnd::Done { reusable: head.keep_alive && !extra }, h)
        }
        ResponseBody::Close => {
            // Re-framed as chunked so the client connection survives; rare (HTTP/1.0 workers).
            let mut out = client_head;
            frame_chunk(&mut out, &up.buf[start..]);
            loop {
                let (res, o) = write_all(client, out).await;
                out = o;
                if res.is_err() {
                    return (RelayEnd::ClientGone, out);
                }
                out.clear();
                up.buf.clear();
                match read_watching(up, client, &mut watch).await {
                    Read::Data(n) => frame_chunk(&mut out, &up.buf[..n]),
                    Read::Eof => {
                        let (res, o) = write_all(client, b"0\r\n\r\n".to_vec()).await;
                        return (
                            if res.is_ok() { RelayEnd::Done { reusable: false } } else { RelayEnd::ClientGone },
                            o,
                        );
                    }
                    Read::ClientGone => return (RelayEnd::ClientGone, out),
                    Read::Err(_) => return (RelayEnd::UpstreamDied("read error"), out),
                }
            }
        }
    }
}

fn frame_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if !data.is_empty() {
        smg_wire::num::put_hex(out, data.len() as u64);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    }
}
