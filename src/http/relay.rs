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
//!
//! Once a response has paused like that twice (time to first token, then gaps between
//! tokens: an engine streaming 30–50 ms apart), the rest of it is relayed with one watch
//! that stays armed across reads, on a duplicate descriptor of the client socket (monoio's
//! writes need the stream itself exclusively). Re-arming per read cost a timer, a PollAdd
//! and its cancel for every event: on sse-20 with 30 ms between tokens a stream took 70
//! ring operations before and 45 after, and 7–16% less gateway CPU at 1,024 streams.

use std::cell::Cell;
use std::io;
use std::pin::pin;
use std::time::Duration;

use monoio::net::TcpStream;

use super::chunked::ChunkedDecoder;
use super::upstream::{parse_response, ResponseBody, ResponseHead, UpstreamConn, UPSTREAM_BUF};
use crate::runtime::io::{peer_closed, read_more, write_all, write_range, Pair};

/// How long the worker may be silent before we start watching the client.
pub const WATCH_AFTER: Duration = Duration::from_millis(20);

/// Resolves when the client closed (true) or sent bytes (false), after [`WATCH_AFTER`];
/// counts in `quiet` the reads on which the worker was silent that long.
async fn client_left(client: &TcpStream, quiet: &Cell<u32>) -> bool {
    monoio::time::sleep(WATCH_AFTER).await;
    quiet.set(quiet.get() + 1);
    peer_closed(client).await
}

/// One read from the worker, raced against the client leaving.
enum Read {
    Data(usize),
    Eof,
    /// The read failed; callers only need to know it ended the body.
    Err,
    ClientGone,
}

/// Appends the next upstream read to `up.buf`.
async fn read_watching(up: &mut UpstreamConn, client: &TcpStream, watch: &mut bool, quiet: &Cell<u32>) -> Read {
    let buf = std::mem::take(&mut up.buf);
    let mut fut = pin!(read_more(&mut up.stream, buf, UPSTREAM_BUF / 2));
    if *watch {
        monoio::select! {
            biased;
            r = &mut fut => return finish(&mut up.buf, r),
            closed = client_left(client, quiet) => {
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
        Err(_) => Read::Err,
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
            let extra = up.buf.len() - start > first;
            let buf = std::mem::take(&mut up.buf);
            let (res, h, buf) = Pair::write(client, client_head, buf, start, start + first).await;
            up.buf = buf;
            if res.is_err() {
                return (RelayEnd::ClientGone, h);
            }
            let end = relay_rest(client, up, BodyLeft::Length(len - first as u64), extra, watch).await;
            (end.reusable_if(head.keep_alive), h)
        }
        ResponseBody::Chunked => {
            let mut dec = ChunkedDecoder::new();
            let used = match dec.feed(&up.buf[start..], None) {
                Ok(n) => n,
                Err(e) => return (RelayEnd::UpstreamDied(e.0), client_head),
            };
            let extra = start + used < up.buf.len();
            let buf = std::mem::take(&mut up.buf);
            let (res, h, buf) = Pair::write(client, client_head, buf, start, start + used).await;
            up.buf = buf;
            if res.is_err() {
                return (RelayEnd::ClientGone, h);
            }
            let end = relay_rest(client, up, BodyLeft::Chunked(dec), extra, watch).await;
            (end.reusable_if(head.keep_alive), h)
        }
        ResponseBody::Close => {
            // Re-framed as chunked so the client connection survives; rare (HTTP/1.0 workers).
            let mut out = client_head;
            let quiet = Cell::new(0);
            frame_chunk(&mut out, &up.buf[start..]);
            loop {
                let (res, o) = write_all(client, out).await;
                out = o;
                if res.is_err() {
                    return (RelayEnd::ClientGone, out);
                }
                out.clear();
                up.buf.clear();
                match read_watching(up, client, &mut watch, &quiet).await {
                    Read::Data(n) => frame_chunk(&mut out, &up.buf[..n]),
                    Read::Eof => {
                        let (res, o) = write_all(client, b"0\r\n\r\n".to_vec()).await;
                        return (
                            if res.is_ok() { RelayEnd::Done { reusable: false } } else { RelayEnd::ClientGone },
                            o,
                        );
                    }
                    Read::ClientGone => return (RelayEnd::ClientGone, out),
                    Read::Err => return (RelayEnd::UpstreamDied("read error"), out),
                }
            }
        }
    }
}

impl RelayEnd {
    /// `Done` as computed by the body loop says whether bytes followed the body; the
    /// connection is reusable only if the worker also allowed keep-alive.
    fn reusable_if(self, keep_alive: bool) -> RelayEnd {
        match self {
            RelayEnd::Done { reusable } => RelayEnd::Done { reusable: reusable && keep_alive },
            other => other,
        }
    }
}

/// What is left of a response body, by its framing.
enum BodyLeft {
    Length(u64),
    Chunked(ChunkedDecoder),
}

impl BodyLeft {
    fn done(&self) -> bool {
        match self {
            BodyLeft::Length(n) => *n == 0,
            BodyLeft::Chunked(d) => d.is_done(),
        }
    }

    /// How many leading bytes of `data` belong to the body (the rest is past its end).
    fn feed(&mut self, data: &[u8]) -> Result<usize, &'static str> {
        match self {
            BodyLeft::Length(n) => {
                let take = (data.len() as u64).min(*n);
                *n -= take;
                Ok(take as usize)
            }
            BodyLeft::Chunked(d) => d.feed(data, None).map_err(|e| e.0),
        }
    }

    fn cut_short(&self) -> &'static str {
        match self {
            BodyLeft::Length(_) => "closed before the end of its body",
            BodyLeft::Chunked(_) => "closed mid-stream",
        }
    }
}

/// Relays the rest of a framed body, each read written before the next. `extra` says bytes
/// already followed the body. The returned `Done` carries "nothing followed the body".
async fn relay_rest(
    client: &mut TcpStream,
    up: &mut UpstreamConn,
    mut left: BodyLeft,
    mut extra: bool,
    mut watch: bool,
) -> RelayEnd {
    // The first quiet read is usually time to first token; a second one means the worker
    // streams with gaps over WATCH_AFTER, and holding one watch pays off from then on.
    let quiet = Cell::new(0);
    let mut can_hold_watch = true;
    while !left.done() {
        if watch && quiet.get() >= 2 && can_hold_watch {
            match watch_handle(client) {
                Ok(handle) => match relay_watched(client, &handle, up, &mut left, &mut extra).await {
                    Watched::Done => break,
                    Watched::ClientGone => return RelayEnd::ClientGone,
                    Watched::Died(why) => return RelayEnd::UpstreamDied(why),
                    Watched::Pipelined => watch = false,
                },
                // Out of descriptors: keep re-arming per read, which needs none.
                Err(_) => can_hold_watch = false,
            }
            continue;
        }
        up.buf.clear();
        let n = match read_watching(up, client, &mut watch, &quiet).await {
            Read::Data(n) => n,
            Read::ClientGone => return RelayEnd::ClientGone,
            Read::Eof | Read::Err => return RelayEnd::UpstreamDied(left.cut_short()),
        };
        match forward_read(client, up, n, &mut left, &mut extra).await {
            Some(end) => return end,
            None => continue,
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
) -> Option<RelayEnd> {
    let used = match left.feed(&up.buf[..n]) {
        Ok(u) => u,
        Err(e) => return Some(RelayEnd::UpstreamDied(e)),
    };
    *extra |= used < n;
    let (res, buf) = write_range(client, std::mem::take(&mut up.buf), 0, used).await;
    up.buf = buf;
    res.is_err().then_some(RelayEnd::ClientGone)
}

/// A second descriptor for the client socket (`dup`), registered with the reactor on its
/// own. A watch armed on it can stay pending while the relay writes through `client`,
/// which monoio's writes need exclusively. One dup, registration and close per slow
/// response, instead of a PollAdd and its cancel per event.
fn watch_handle(client: &TcpStream) -> io::Result<TcpStream> {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: dup of a descriptor we own; the new one is owned by the std stream at once.
    let fd = unsafe { libc::fcntl(client.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let std = unsafe { std::net::TcpStream::from_raw_fd(fd) };
    TcpStream::from_std(std)
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
/// dropped, with the whole connection, when the client has gone.
async fn relay_watched(
    client: &mut TcpStream,
    handle: &TcpStream,
    up: &mut UpstreamConn,
    left: &mut BodyLeft,
    extra: &mut bool,
) -> Watched {
    let mut gone = pin!(peer_closed(handle));
    while !left.done() {
        up.buf.clear();
        let (read, pipelined) = {
            let buf = std::mem::take(&mut up.buf);
            let mut fut = pin!(read_more(&mut up.stream, buf, UPSTREAM_BUF / 2));
            let first = monoio::select! {
                biased;
                r = &mut fut => Some(r),
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
            (finish(&mut up.buf, r), pipelined)
        };
        let Read::Data(n) = read else {
            return Watched::Died(left.cut_short());
        };
        match forward_read(client, up, n, left, extra).await {
            Some(RelayEnd::UpstreamDied(why)) => return Watched::Died(why),
            Some(_) => return Watched::ClientGone,
            None if pipelined => return Watched::Pipelined,
            None => {}
        }
    }
    Watched::Done
}

fn frame_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if !data.is_empty() {
        smg_wire::num::put_hex(out, data.len() as u64);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    }
}
