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
//! The same point arms the worker's read deadline (`--upstream-read-timeout-secs`): a read
//! that completes within 20 ms needs none.
//!
//! Once a response has paused like that twice (time to first token, then gaps between
//! tokens: an engine streaming 30–50 ms apart), the rest of it is relayed with one watch
//! that stays armed across reads, on a duplicate descriptor of the client socket (monoio's
//! writes need the stream itself exclusively). Re-arming per read cost a timer, a PollAdd
//! and its cancel for every event: on sse-20 with 30 ms between tokens a stream took 70
//! ring operations before and 45 after, and 7–16% less gateway CPU at 1,024 streams.
//!
//! Framing toward the client: a worker's Content-Length and chunked bodies pass through as
//! the bytes they arrived as; a close-delimited body is re-chunked for HTTP/1.1 clients. An
//! HTTP/1.0 client never sees chunked coding (RFC 9112 §6.1): it gets the de-chunked bytes
//! and the end of the body is the close.

use std::cell::Cell;
use std::pin::pin;
use std::time::{Duration, Instant};

use monoio::net::TcpStream;
use smg_wire::chunked::ChunkedDecoder;
use smg_wire::num::put_dec;

use super::pool::{UpstreamConn, UPSTREAM_BUF};
use super::respond::{header_line, reason, Stamp};
use super::response_head::{ResponseBody, ResponseHead, WATCH_AFTER};
use crate::io::{dup_stream, peer_closed, read_more, write_all, write_range, Writev2};

/// The worker's side of the relay's deadlines.
#[derive(Debug, Clone, Copy)]
pub struct RelayLimits {
    /// Longest silence between two reads of the body (`--upstream-read-timeout-secs`).
    pub read_idle: Duration,
    /// End of the whole upstream exchange (`--request-timeout-secs` from the attempt's start).
    pub deadline: Instant,
}

/// What the relay tells the request context.
#[derive(Debug, Default, Clone, Copy)]
pub struct RelayStats {
    /// When the response head (and the first body bytes with it) went to the client.
    pub first_byte: Option<Instant>,
    /// Bytes written to the client, head included.
    pub bytes: u64,
    /// The response was close-delimited toward the client: the connection must close.
    pub close_delimited: bool,
    /// Take `first_byte` (the caller wants it).
    pub timed: bool,
    /// The worker's reported usage, when asked for (`usage.on`).
    pub usage: super::usage::UsageScan,
    /// Body bytes relayed so far, and the most allowed (`--max-payload-size` for a
    /// non-streaming response; past it the response is cut).
    pub body: u64,
    pub cap: Option<u64>,
}

/// How the relay ended.
#[derive(Debug, PartialEq, Eq)]
pub enum RelayEnd {
    /// The whole body reached the client; the upstream connection may be pooled.
    Done {
        reusable: bool,
    },
    ClientGone,
    /// The worker died, stalled or broke framing. `sent` says whether any byte reached the
    /// client: if none did, the caller can still answer with an error.
    Worker {
        why: &'static str,
        sent: bool,
    },
}

/// Extra header lines for the client head (`x-smg-routed-worker-id`, …).
pub type ExtraHeaders<'a> = [(&'a str, &'a [u8])];

/// Resolves when the client closed (true) or sent bytes (false).
enum Read {
    Data(usize),
    Eof,
    /// The read failed; callers only need to know it ended the body.
    Err,
    Stalled,
    ClientGone,
}

impl Read {
    fn from((res, _): &(std::io::Result<usize>, Vec<u8>)) -> Read {
        match res {
            Ok(0) => Read::Eof,
            Ok(n) => Read::Data(*n),
            Err(_) => Read::Err,
        }
    }
}

/// Appends the next upstream read to `up.buf`, watching the client and the read deadline
/// once the worker has been silent for [`WATCH_AFTER`].
async fn read_watching(
    up: &mut UpstreamConn,
    client: &TcpStream,
    watch: &mut bool,
    quiet: &Cell<u32>,
    limits: &RelayLimits,
) -> Read {
    let buf = std::mem::take(&mut up.buf);
    let mut fut = pin!(read_more(&mut up.stream, buf, UPSTREAM_BUF / 2));
    monoio::select! {
        biased;
        r = &mut fut => return land(&mut up.buf, r),
        _ = crate::clock::timer(WATCH_AFTER) => {}
    }
    quiet.set(quiet.get() + 1);
    let left = idle_left(limits);
    let mut stalled = pin!(crate::clock::timer(left));
    loop {
        if !*watch {
            return monoio::select! {
                biased;
                r = &mut fut => land(&mut up.buf, r),
                _ = &mut stalled => Read::Stalled,
            };
        }
        monoio::select! {
            biased;
            r = &mut fut => return land(&mut up.buf, r),
            _ = &mut stalled => return Read::Stalled,
            closed = peer_closed(client) => {
                if closed {
                    return Read::ClientGone;
                }
                // The client pipelined its next request; stop watching, keep reading.
                *watch = false;
            }
        }
    }
}

/// The silence allowed from now: the read deadline, or what is left of the exchange.
fn idle_left(limits: &RelayLimits) -> Duration {
    limits.read_idle.min(limits.deadline.saturating_duration_since(crate::clock::now())).saturating_sub(WATCH_AFTER)
}

fn land(slot: &mut Vec<u8>, r: (std::io::Result<usize>, Vec<u8>)) -> Read {
    let read = Read::from(&r);
    *slot = r.1;
    read
}

/// How the body is framed toward the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientFraming {
    /// `content-length` (or no body): the worker's framing.
    Length,
    /// The worker's chunks, byte for byte.
    Chunked,
    /// A close-delimited worker body, chunked by us for an HTTP/1.1 client.
    Rechunk,
    /// Raw body bytes ended by the close, for an HTTP/1.0 client.
    Raw,
}

fn framing(body: ResponseBody, http10: bool) -> ClientFraming {
    match body {
        ResponseBody::None | ResponseBody::Length { .. } => ClientFraming::Length,
        ResponseBody::Chunked if http10 => ClientFraming::Raw,
        ResponseBody::Chunked => ClientFraming::Chunked,
        ResponseBody::Close if http10 => ClientFraming::Raw,
        ResponseBody::Close => ClientFraming::Rechunk,
    }
}

/// The client's response head: the worker's status line (its phrase kept, the standard one
/// if it sent none), the headers that may be relayed, framing, `extra`, then the stamp.
fn client_head(
    out: &mut Vec<u8>,
    up: &[u8],
    h: &ResponseHead,
    framing: ClientFraming,
    extra: &ExtraHeaders<'_>,
    stamp: &Stamp<'_>,
) {
    let phrase = &up[h.reason.clone()];
    out.extend_from_slice(b"HTTP/1.1 ");
    put_dec(out, h.status as u64);
    out.push(b' ');
    if phrase.is_empty() {
        out.extend_from_slice(reason(h.status).as_bytes());
    } else {
        out.extend_from_slice(phrase);
    }
    out.extend_from_slice(b"\r\n");
    for (n, v) in &h.relay {
        header_line(out, &up[n.clone()], &up[v.clone()]);
    }
    match (h.body, framing) {
        (ResponseBody::Length { len }, _) => {
            out.extend_from_slice(b"content-length: ");
            put_dec(out, len);
            out.extend_from_slice(b"\r\n");
        }
        (ResponseBody::None, _) if h.status != 204 && h.status != 304 => {
            out.extend_from_slice(b"content-length: 0\r\n")
        }
        (_, ClientFraming::Chunked | ClientFraming::Rechunk) => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n")
        }
        _ => {}
    }
    for (name, value) in extra {
        header_line(out, name.as_bytes(), value);
    }
    stamp.write(out);
    out.extend_from_slice(b"\r\n");
}

/// Relays the response whose head is at the start of `up.buf` to the client. `out` is a
/// spare buffer for the client head; it comes back for reuse.
#[allow(clippy::too_many_arguments)]
pub async fn relay(
    client: &mut TcpStream,
    up: &mut UpstreamConn,
    head: &ResponseHead,
    extra: &ExtraHeaders<'_>,
    stamp: Stamp<'_>,
    mut out: Vec<u8>,
    watch: bool,
    limits: RelayLimits,
    stats: &mut RelayStats,
) -> (RelayEnd, Vec<u8>) {
    let start = head.len;
    let framing = framing(head.body, stamp.http10);
    let stamp = Stamp { close: stamp.close || framing == ClientFraming::Raw, ..stamp };
    stats.close_delimited = framing == ClientFraming::Raw;
    out.clear();
    client_head(&mut out, &up.buf, head, framing, extra, &stamp);
    let mut left = match (head.body, framing) {
        (ResponseBody::None, _) => BodyLeft::Length(0),
        (ResponseBody::Length { len }, _) => BodyLeft::Length(len),
        (ResponseBody::Chunked, ClientFraming::Chunked) => BodyLeft::Chunked(ChunkedDecoder::new()),
        (ResponseBody::Chunked, _) => BodyLeft::Dechunk(ChunkedDecoder::new()),
        (ResponseBody::Close, ClientFraming::Rechunk) => BodyLeft::UntilClose { rechunk: true },
        (ResponseBody::Close, _) => BodyLeft::UntilClose { rechunk: false },
    };
    // The body bytes that came with the head: checked before the head goes out, so a worker
    // whose framing is broken from its first byte still gets the client a 502.
    let mut transformed = Vec::new();
    let first = match left.take(&up.buf[start..], &mut transformed) {
        Ok(t) => t,
        Err(why) => return (RelayEnd::Worker { why, sent: false }, out),
    };
    stats.usage.feed(&up.buf[start..start + first.used]);
    stats.body = first.used as u64;
    let extra_bytes = start + first.used < up.buf.len();
    let written = if left.passes_through() {
        let buf = std::mem::take(&mut up.buf);
        let (res, h, buf) = Writev2::write(client, out, buf, start, start + first.used).await;
        up.buf = buf;
        out = h;
        stats.bytes += (out.len() + first.used) as u64;
        res
    } else {
        // Transformed framings (rare: HTTP/1.0 clients, close-delimited workers) copy.
        out.extend_from_slice(&transformed);
        let (res, h) = write_all(client, out).await;
        out = h;
        stats.bytes += out.len() as u64;
        res
    };
    if written.is_err() {
        return (RelayEnd::ClientGone, out);
    }
    if stats.timed {
        stats.first_byte = Some(crate::clock::now());
    }
    let end = relay_rest(client, up, left, extra_bytes, watch, &limits, stats).await;
    let end = match end {
        RelayEnd::Done { reusable } => RelayEnd::Done { reusable: reusable && head.keep_alive },
        other => other,
    };
    (end, out)
}

/// What one read contributed to the body.
struct Taken {
    /// Leading bytes of the input that belong to the body.
    used: usize,
}

/// What is left of a response body, by its framing.
enum BodyLeft {
    Length(u64),
    /// Chunked, passed through: the decoder only finds the end.
    Chunked(ChunkedDecoder),
    /// Chunked, decoded for an HTTP/1.0 client.
    Dechunk(ChunkedDecoder),
    /// Until the worker closes; chunked by us or raw.
    UntilClose {
        rechunk: bool,
    },
}

impl BodyLeft {
    fn done(&self) -> bool {
        match self {
            BodyLeft::Length(n) => *n == 0,
            BodyLeft::Chunked(d) | BodyLeft::Dechunk(d) => d.is_done(),
            BodyLeft::UntilClose { .. } => false,
        }
    }

    /// The worker's bytes reach the client as they are.
    fn passes_through(&self) -> bool {
        matches!(self, BodyLeft::Length(_) | BodyLeft::Chunked(_))
    }

    /// Takes the body's part of `data`; for transformed framings, appends what the client
    /// gets to `out`.
    fn take(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<Taken, &'static str> {
        match self {
            BodyLeft::Length(n) => {
                let take = (data.len() as u64).min(*n);
                *n -= take;
                Ok(Taken { used: take as usize })
            }
            BodyLeft::Chunked(d) => d.feed(data, None).map(|used| Taken { used }).map_err(|e| e.0),
            BodyLeft::Dechunk(d) => d.feed(data, Some(out)).map(|used| Taken { used }).map_err(|e| e.0),
            BodyLeft::UntilClose { rechunk } => {
                if *rechunk {
                    smg_wire::chunked::put_chunk(out, data);
                } else {
                    out.extend_from_slice(data);
                }
                Ok(Taken { used: data.len() })
            }
        }
    }

    /// The worker closed: the end of the body, or a body cut short.
    fn at_eof(&self) -> Result<&'static [u8], &'static str> {
        match self {
            BodyLeft::UntilClose { rechunk: true } => Ok(b"0\r\n\r\n"),
            BodyLeft::UntilClose { rechunk: false } => Ok(b""),
            BodyLeft::Length(_) => Err("closed before the end of its body"),
            BodyLeft::Chunked(_) | BodyLeft::Dechunk(_) => Err("closed mid-stream"),
        }
    }
}

/// Relays the rest of a body, each read written before the next. `extra` says bytes
/// already followed the body. The returned `Done` carries "nothing followed the body".
async fn relay_rest(
    client: &mut TcpStream,
    up: &mut UpstreamConn,
    mut left: BodyLeft,
    mut extra: bool,
    mut watch: bool,
    limits: &RelayLimits,
    stats: &mut RelayStats,
) -> RelayEnd {
    // The first quiet read is usually time to first token; a second one means the worker
    // streams with gaps over WATCH_AFTER, and holding one watch pays off from then on.
    let quiet = Cell::new(0);
    let mut can_hold_watch = true;
    let mut out = Vec::new();
    while !left.done() {
        if crate::clock::now() >= limits.deadline {
            return RelayEnd::Worker { why: "still sending at --request-timeout-secs", sent: true };
        }
        if watch && quiet.get() >= 2 && can_hold_watch && left.passes_through() {
            match dup_stream(client) {
                Ok(handle) => match relay_watched(client, &handle, up, &mut left, &mut extra, limits, stats).await {
                    Watched::Done => break,
                    Watched::ClientGone => return RelayEnd::ClientGone,
                    Watched::Died(why) => return RelayEnd::Worker { why, sent: true },
                    Watched::Pipelined => watch = false,
                },
                // Out of descriptors: keep re-arming per read, which needs none.
                Err(_) => can_hold_watch = false,
            }
            continue;
        }
        up.buf.clear();
        let n = match read_watching(up, client, &mut watch, &quiet, limits).await {
            Read::Data(n) => n,
            Read::ClientGone => return RelayEnd::ClientGone,
            Read::Stalled => return RelayEnd::Worker { why: "stalled mid-body", sent: true },
            Read::Eof | Read::Err => match left.at_eof() {
                Ok(tail) => {
                    let (res, _) = write_all(client, tail.to_vec()).await;
                    return if res.is_ok() { RelayEnd::Done { reusable: false } } else { RelayEnd::ClientGone };
                }
                Err(why) => return RelayEnd::Worker { why, sent: true },
            },
        };
        if let Some(end) = forward_read(client, up, n, &mut left, &mut extra, &mut out, stats).await {
            return end;
        }
    }
    RelayEnd::Done { reusable: !extra }
}

/// Writes the body part of the `n` bytes just read into `up.buf`; `Some` ends the relay.
async fn forward_read(
    client: &mut TcpStream,
    up: &mut UpstreamConn,
    n: usize,
    left: &mut BodyLeft,
    extra: &mut bool,
    out: &mut Vec<u8>,
    stats: &mut RelayStats,
) -> Option<RelayEnd> {
    out.clear();
    let used = match left.take(&up.buf[..n], out) {
        Ok(t) => t.used,
        Err(why) => return Some(RelayEnd::Worker { why, sent: true }),
    };
    *extra |= used < n;
    stats.body += used as u64;
    if stats.cap.is_some_and(|cap| stats.body > cap) {
        return Some(RelayEnd::Worker { why: "response body over --max-payload-size; cut", sent: true });
    }
    stats.usage.feed(&up.buf[..used]);
    let res = if left.passes_through() {
        let (res, buf) = write_range(client, std::mem::take(&mut up.buf), 0, used).await;
        up.buf = buf;
        stats.bytes += used as u64;
        res
    } else {
        let (res, o) = write_all(client, std::mem::take(out)).await;
        stats.bytes += o.len() as u64;
        *out = o;
        res
    };
    res.is_err().then_some(RelayEnd::ClientGone)
}

/// How a stretch of watched relaying ended.
enum Watched {
    Done,
    ClientGone,
    Died(&'static str),
    /// The client sent its next request: its chunk went out, stop watching.
    Pipelined,
}

/// Relays with one client watch, on `handle`, armed for the whole stretch. The upstream
/// read is never cancelled for a pipelined client (its bytes would be lost); it is only
/// dropped, with the whole connection, when the client has gone or the worker stalled.
async fn relay_watched(
    client: &mut TcpStream,
    handle: &TcpStream,
    up: &mut UpstreamConn,
    left: &mut BodyLeft,
    extra: &mut bool,
    limits: &RelayLimits,
    stats: &mut RelayStats,
) -> Watched {
    let mut gone = pin!(peer_closed(handle));
    let mut out = Vec::new();
    while !left.done() {
        up.buf.clear();
        let (read, pipelined) = {
            let buf = std::mem::take(&mut up.buf);
            let mut fut = pin!(read_more(&mut up.stream, buf, UPSTREAM_BUF / 2));
            let stalled = crate::clock::timer(idle_left(limits) + WATCH_AFTER);
            let first = monoio::select! {
                biased;
                r = &mut fut => Some(r),
                _ = stalled => return Watched::Died("stalled mid-body"),
                closed = &mut gone => {
                    if closed {
                        return Watched::ClientGone;
                    }
                    None
                }
            };
            let pipelined = first.is_none();
            let r = match first {
                Some(r) => r,
                None => fut.await,
            };
            (land(&mut up.buf, r), pipelined)
        };
        let Read::Data(n) = read else {
            return Watched::Died(left.at_eof().err().unwrap_or("closed mid-stream"));
        };
        match forward_read(client, up, n, left, extra, &mut out, stats).await {
            Some(RelayEnd::Worker { why, .. }) => return Watched::Died(why),
            Some(_) => return Watched::ClientGone,
            None if pipelined => return Watched::Pipelined,
            None => {}
        }
    }
    Watched::Done
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `wire` to `left` in two reads cut at `cut`, like `relay` and `forward_read` do:
    /// returns (bytes of the input that belong to the body, what the client gets when the
    /// framing is transformed, done).
    fn feed_split(mut left: BodyLeft, wire: &[u8], cut: usize) -> (usize, Vec<u8>, bool) {
        let mut out = Vec::new();
        let a = left.take(&wire[..cut], &mut out).unwrap().used;
        assert!(a == cut || left.done(), "stopped early at {a} of {cut}");
        let b = if left.done() { 0 } else { left.take(&wire[cut..], &mut out).unwrap().used };
        (a + b, out, left.done())
    }

    const CHUNKED: &[u8] = b"6\r\ndata: \r\n3;x=y\r\nhi\n\r\n0\r\n\r\nSTRAY";

    #[test]
    fn chunked_passthrough_ends_where_the_body_ends() {
        for cut in 0..=CHUNKED.len() {
            let (used, out, done) = feed_split(BodyLeft::Chunked(ChunkedDecoder::new()), CHUNKED, cut);
            assert_eq!((used, done), (CHUNKED.len() - 5, true), "cut {cut}");
            assert!(out.is_empty(), "passthrough copies nothing");
        }
    }

    #[test]
    fn chunked_is_decoded_for_http10_clients() {
        for cut in 0..=CHUNKED.len() {
            let (used, out, done) = feed_split(BodyLeft::Dechunk(ChunkedDecoder::new()), CHUNKED, cut);
            assert_eq!((used, out.as_slice(), done), (CHUNKED.len() - 5, &b"data: hi\n"[..], true), "cut {cut}");
        }
    }

    #[test]
    fn length_stops_at_its_end() {
        let wire = b"0123456789extra";
        for cut in 0..=wire.len() {
            let (used, _, done) = feed_split(BodyLeft::Length(10), wire, cut);
            assert_eq!((used, done), (10, true), "cut {cut}");
        }
    }

    #[test]
    fn close_delimited_is_rechunked_or_raw() {
        let wire = b"abcdef";
        for cut in 1..wire.len() {
            let (_, out, done) = feed_split(BodyLeft::UntilClose { rechunk: true }, wire, cut);
            let want = format!("{cut:x}\r\n{}\r\n{:x}\r\n{}\r\n", &"abcdef"[..cut], 6 - cut, &"abcdef"[cut..]);
            assert_eq!((String::from_utf8(out).unwrap(), done), (want, false), "cut {cut}");
            let (_, raw, _) = feed_split(BodyLeft::UntilClose { rechunk: false }, wire, cut);
            assert_eq!(raw, wire);
        }
        assert_eq!(BodyLeft::UntilClose { rechunk: true }.at_eof(), Ok(&b"0\r\n\r\n"[..]));
        assert!(BodyLeft::Length(3).at_eof().is_err());
    }

    #[test]
    fn broken_first_chunk_is_an_error_before_any_byte() {
        let mut left = BodyLeft::Chunked(ChunkedDecoder::new());
        assert!(left.take(b"zz\r\n", &mut Vec::new()).is_err());
    }

    #[test]
    fn client_framing_by_version() {
        assert_eq!(framing(ResponseBody::Chunked, true), ClientFraming::Raw);
        assert_eq!(framing(ResponseBody::Chunked, false), ClientFraming::Chunked);
        assert_eq!(framing(ResponseBody::Close, false), ClientFraming::Rechunk);
        assert_eq!(framing(ResponseBody::Length { len: 3 }, true), ClientFraming::Length);
    }
}
