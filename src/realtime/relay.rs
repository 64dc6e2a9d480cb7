//! The relay of an upgraded session: two pumps in the connection's task, one per
//! direction, over the two sockets split into read and write halves (two descriptors a
//! session, no duplicates). A pump's buffer is allocated when its side first has bytes to
//! read (an idle session holds none) and reused for the session's life. A pump reads what its
//! side sent, lets the [`Scanner`] read the frame heads in it, and writes the same bytes to
//! the other side: frames go through verbatim (masks, fragments, pings and close codes
//! included); only a frame head cut short at the end of a read waits for the next one, so
//! that a frame of the gateway's own (a close) can only ever follow a whole frame.
//!
//! How a session ends:
//! - A close frame passed one way: that pump is done; the other side has
//!   [`CLOSE_WAIT`] to answer with its own close, then both sockets close.
//! - A side hung up (EOF or error): the other is closed at once.
//! - A side broke the rules (a message over `--max-payload-size`, or broken framing):
//!   both sides get a close frame with the code (1009 or 1002) where their stream is
//!   at a frame boundary, then both close.
//! - The gateway drains (SIGTERM, or a handover to a successor): likewise with 1001, so
//!   clients reconnect at once instead of holding the old process to its grace period.
//! - Neither side sent a byte for `--websocket-idle-timeout-secs`: likewise with 1001 and
//!   the reason "idle timeout", so an abandoned session stops holding its permit, worker
//!   load and descriptors (nginx's proxy_read_timeout does the same, at 60 s).
//!
//! Writes are never cancelled (a cancelled write could leave half a frame on the wire);
//! only a pump's wait for its next read is, when its direction ends: at a frame boundary
//! once the other pump ended, or when the rest of a frame did not come in time. A read
//! dropped mid-frame could take bytes of that frame with it (io_uring), so a pump stopped
//! mid-frame goes on awaiting the read it has under way.

use std::cell::Cell;
use std::future::poll_fn;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use smg_wire::ws;

use super::scan::{Scan, Scanner};
use crate::io::{sleep, ReadHalf, WriteHalf};

/// Read buffer of one direction. 64 KB reads keep a 1 MB message at 16 reads; a message
/// never needs to fit in it.
pub const RELAY_BUF: usize = 64 * 1024;
/// How long a side has to answer a close frame with its own (websockets' default
/// `close_timeout` is 10 s; a worker is local and quicker).
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// How long a stopped direction may take to pass the rest of the frame it is in.
pub const FINISH_FRAME: Duration = Duration::from_secs(1);

/// How one pump ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// A close frame passed.
    Closed,
    /// Its side hung up or its socket failed.
    Gone,
    /// The other side could not be written to.
    PeerGone,
    /// Its side broke the rules; the session closes with this code.
    Violation(u16),
    /// The other pump ended first.
    Stopped,
}

/// One direction: its buffer (bytes read and not yet forwarded at the front), its scanner,
/// and how many bytes went through.
pub struct Direction {
    pub buf: Vec<u8>,
    pub scan: Scanner,
    pub bytes: u64,
}

impl Direction {
    /// `seed`: bytes its side sent before the relay began (read with the handshake).
    /// No buffer is allocated until its side sends something (see [`next_read`]).
    pub fn new(max_message: u64, seed: &[u8]) -> Self {
        Direction { buf: seed.to_vec(), scan: Scanner::new(max_message), bytes: 0 }
    }
}

/// The next read of a direction. With no buffer yet it first waits for its side to be
/// readable, holding no memory, so idle sessions cost their sockets and little else.
async fn next_read(from: &mut ReadHalf<'_>, mut buf: Vec<u8>) -> (std::io::Result<usize>, Vec<u8>) {
    if buf.capacity() == 0 {
        if let Err(e) = from.readable().await {
            return (Err(e), buf);
        }
        buf = Vec::with_capacity(RELAY_BUF);
    }
    from.read_more(buf, RELAY_BUF / 2).await
}

/// When the session was last heard from (a read on either side), for the idle deadline.
struct Heard(Cell<Instant>);

/// How long a session last heard from at `last` has before it counts as idle under
/// `limit`; None once it does.
fn idle_left(last: Instant, limit: Duration, now: Instant) -> Option<Duration> {
    let left = limit.saturating_sub(now.saturating_duration_since(last));
    (!left.is_zero()).then_some(left)
}

/// Resolves once the session has been silent both ways for `limit`: one timer, re-armed
/// only when it fires, so a busy session pays a clock read per read and nothing more.
async fn idle(heard: &Heard, limit: Duration) {
    while let Some(left) = idle_left(heard.0.get(), limit, crate::clock::now()) {
        sleep(left).await;
    }
}

/// One-shot "stop at `at`" from one pump to the other, within one task.
#[derive(Default)]
struct Stop {
    at: Cell<Option<Instant>>,
    waker: Cell<Option<Waker>>,
}

impl Stop {
    fn fire_at(&self, at: Instant) {
        if self.at.get().is_none() {
            self.at.set(Some(at));
            if let Some(w) = self.waker.take() {
                w.wake();
            }
        }
    }

    async fn wait(&self) {
        poll_fn(|cx| {
            if self.at.get().is_some() {
                return Poll::Ready(());
            }
            self.waker.set(Some(cx.waker().clone()));
            Poll::Pending
        })
        .await;
        let at = self.at.get().expect("fired");
        let left = at.saturating_duration_since(crate::clock::now());
        if !left.is_zero() {
            sleep(left).await;
        }
    }
}

/// Forwards `from` → `to` until the direction ends. Told to stop in the middle of a frame,
/// it first passes the rest of that frame (for at most [`FINISH_FRAME`]), so that the close
/// frame the gateway may send next lands on a frame boundary.
async fn pump(from: &mut ReadHalf<'_>, to: &mut WriteHalf<'_>, d: &mut Direction, stop: &Stop, heard: &Heard) -> End {
    let mut finish_by: Option<Instant> = None;
    loop {
        if !d.buf.is_empty() {
            let upto = match finish_by {
                Some(_) => d.buf.len().min(usize::try_from(d.scan.left()).unwrap_or(usize::MAX)),
                None => d.buf.len(),
            };
            let (n, end) = match d.scan.scan(&d.buf[..upto]) {
                Scan::Forward { n, closed } => (n, closed.then_some(End::Closed)),
                Scan::Violation { n, code } => (n, Some(End::Violation(code))),
            };
            if n > 0 {
                let (res, buf) = to.write_range(std::mem::take(&mut d.buf), 0, n).await;
                d.buf = buf;
                if res.is_err() {
                    return End::PeerGone;
                }
                d.bytes += n as u64;
                // At most a cut-short frame head (13 bytes) moves to the front.
                d.buf.drain(..n);
            }
            if let Some(e) = end {
                return e;
            }
        }
        if finish_by.is_some() && d.scan.at_boundary() {
            return End::Stopped;
        }
        let mut read = std::pin::pin!(next_read(from, std::mem::take(&mut d.buf)));
        let by = match finish_by {
            Some(by) => by,
            None => {
                monoio::select! {
                    (res, buf) = &mut read => {
                        d.buf = buf;
                        match res {
                            Ok(n) if n > 0 => heard.0.set(crate::clock::now()),
                            _ => return End::Gone,
                        }
                        continue;
                    }
                    _ = stop.wait() => {}
                }
                // At a boundary the read may go: what it took lies past the last frame
                // passed, and nothing past that goes on.
                if d.scan.at_boundary() {
                    return End::Stopped;
                }
                *finish_by.insert(crate::clock::now() + FINISH_FRAME)
            }
        };
        // Mid-frame, the read under way is awaited, never dropped for a fresh one: under
        // io_uring it may already have taken bytes from the socket (the kernel completes it
        // before the reactor reaps it), and dropped it would lose them. The frame would come
        // out short, its end would wait for bytes that never come, and the close frame that
        // was to follow it would never be sent.
        let left = by.saturating_duration_since(crate::clock::now());
        match crate::clock::timeout(left, read).await {
            Ok((Ok(n), buf)) if n > 0 => d.buf = buf,
            Ok(_) => return End::Gone,
            Err(_) => return End::Stopped,
        }
    }
}

/// The two sides of a session, each socket split into its halves so both directions can
/// wait at once.
pub(crate) struct Sides<'a> {
    pub(crate) client_read: ReadHalf<'a>,
    pub(crate) client_write: WriteHalf<'a>,
    pub(crate) worker_read: ReadHalf<'a>,
    pub(crate) worker_write: WriteHalf<'a>,
}

/// How the session ended, for the log and the access line.
#[derive(Debug, Clone, Copy)]
pub struct Ended {
    pub client: End,
    pub worker: End,
    /// The close code the gateway sent, if it ended the session itself.
    pub sent_close: Option<u16>,
}

/// Close code for a session the gateway ends because it is shutting down or the session
/// idled out ("going away").
pub const CLOSE_GOING_AWAY: u16 = 1001;
/// The reason the client reads in the close frame of an idle session.
const IDLE_REASON: &str = "idle timeout";

/// Why the gateway ended a session that broke no rule.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cut {
    Drain,
    Idle,
}

/// A close frame with a reason (`ws::close_frame` has none), masked when `mask` is given.
fn close_with_reason(code: u16, reason: &str, mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend_from_slice(reason.as_bytes());
    let mut out = Vec::with_capacity(8 + payload.len());
    ws::put_head(&mut out, true, ws::OP_CLOSE, payload.len() as u64, mask);
    if let Some(k) = mask {
        ws::apply_mask(&mut payload, k, 0);
    }
    out.extend_from_slice(&payload);
    out
}

/// Relays until the session ends, `drain` resolves (the gateway shuts down), or neither
/// side sends a byte for `idle_limit`: in the last two cases both sides get close 1001 once
/// at a frame boundary.
pub(crate) async fn run(
    s: Sides<'_>,
    up: &mut Direction,
    down: &mut Direction,
    drain: impl std::future::Future<Output = ()>,
    idle_limit: Duration,
) -> Ended {
    let Sides { mut client_read, mut client_write, mut worker_read, mut worker_write } = s;
    let (client, worker, cut) = {
        let (stop_up, stop_down) = (Stop::default(), Stop::default());
        let heard = Heard(Cell::new(crate::clock::now()));
        let grace = |e: End| if e == End::Closed { crate::clock::now() + CLOSE_WAIT } else { crate::clock::now() };
        let client_side = async {
            let e = pump(&mut client_read, &mut worker_write, up, &stop_up, &heard).await;
            stop_down.fire_at(grace(e));
            e
        };
        let worker_side = async {
            let e = pump(&mut worker_read, &mut client_write, down, &stop_down, &heard).await;
            stop_up.fire_at(grace(e));
            e
        };
        let mut pumps = std::pin::pin!(async { monoio::join!(client_side, worker_side) });
        let cut = monoio::select! {
            (c, w) = &mut pumps => Err((c, w)),
            _ = drain => Ok(Cut::Drain),
            _ = idle(&heard, idle_limit) => Ok(Cut::Idle),
        };
        match cut {
            Err((c, w)) => (c, w, None),
            Ok(cut) => {
                stop_up.fire_at(crate::clock::now());
                stop_down.fire_at(crate::clock::now());
                let (c, w) = pumps.await;
                (c, w, Some(cut))
            }
        }
    };
    let code = match (client, worker) {
        (End::Violation(c), _) | (_, End::Violation(c)) => Some(c),
        _ if cut.is_some() => Some(CLOSE_GOING_AWAY),
        _ => None,
    };
    if let Some(c) = code {
        let reason = if cut == Some(Cut::Idle) { IDLE_REASON } else { "" };
        // Each side that has not closed and whose stream is at a frame boundary hears why.
        if !matches!(client, End::Closed | End::PeerGone) && up.scan.at_boundary() {
            // The one frame the gateway writes to a worker itself: as a client's, it is masked
            // with a key fresh from the kernel (RFC 6455 §5.3), drawn for this frame alone.
            let f = close_with_reason(c, reason, Some(crate::random::bytes()));
            let n = f.len();
            let _ = worker_write.write_range(f, 0, n).await;
        }
        if !matches!(worker, End::Closed | End::PeerGone) && down.scan.at_boundary() {
            let f = close_with_reason(c, reason, None);
            let n = f.len();
            let _ = client_write.write_range(f, 0, n).await;
        }
    }
    Ended { client, worker, sent_close: code }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_deadline_counts_from_the_last_byte() {
        let t0 = crate::clock::now();
        let limit = Duration::from_secs(60);
        assert_eq!(idle_left(t0, limit, t0), Some(limit));
        assert_eq!(idle_left(t0, limit, t0 + Duration::from_secs(59)), Some(Duration::from_secs(1)));
        assert_eq!(idle_left(t0, limit, t0 + limit), None);
        assert_eq!(idle_left(t0 + Duration::from_secs(30), limit, t0 + limit), Some(Duration::from_secs(30)));
    }

    /// A socket of the gateway's (monoio) and its peer (std, so a test writes into the kernel
    /// at once, between two polls of the relay).
    async fn socket_pair() -> (monoio::net::TcpStream, std::net::TcpStream) {
        let listener = crate::io::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (ours, _) = listener.accept().await.unwrap();
        (ours, peer)
    }

    /// Reads from `s` (non-blocking) until it holds `want` bytes.
    async fn read_until(s: &mut std::net::TcpStream, got: &mut Vec<u8>, want: usize) {
        use std::io::Read;
        let mut tmp = [0u8; 8192];
        while got.len() < want {
            match s.read(&mut tmp) {
                Ok(0) => panic!("closed"),
                Ok(n) => got.extend_from_slice(&tmp[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => sleep(Duration::from_millis(1)).await,
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// One direction told to stop while its read waits for the rest of a frame. Returns how
    /// the pump ended, whether it ended on a frame boundary, the frame and what was forwarded.
    async fn stop_mid_frame() -> (End, bool, Vec<u8>, Vec<u8>) {
        use std::io::Write;
        let (mut from, mut from_peer) = socket_pair().await;
        let (mut to, mut to_peer) = socket_pair().await;
        to_peer.set_nonblocking(true).unwrap();
        let mut frame = Vec::new();
        ws::put_head(&mut frame, true, ws::OP_BINARY, 4000, None);
        let first = frame.len() + 1000;
        frame.extend((0..4000u32).map(|i| (i % 251) as u8));
        from_peer.write_all(&frame[..first]).unwrap();
        let mut d = Direction::new(1 << 20, &[]);
        let (stop, heard) = (Stop::default(), Heard(Cell::new(crate::clock::now())));
        let mut got = Vec::new();
        let (mut from_read, _) = crate::io::split(&mut from);
        let (_, mut to_write) = crate::io::split(&mut to);
        let (end, ()) = monoio::join!(pump(&mut from_read, &mut to_write, &mut d, &stop, &heard), async {
            read_until(&mut to_peer, &mut got, first).await;
            // The pump's next read goes to the kernel at the reactor's next turn.
            sleep(Duration::from_millis(20)).await;
            // The rest of the frame lands (under io_uring the waiting read completes with it in
            // the kernel, unseen by the reactor until its next turn), and in this same poll the
            // pump is told to stop: a pump that dropped that read would lose those bytes.
            from_peer.write_all(&frame[first..]).unwrap();
            stop.fire_at(crate::clock::now());
        });
        let rest = frame.len().min(usize::try_from(d.bytes).unwrap_or(usize::MAX));
        read_until(&mut to_peer, &mut got, rest).await;
        (end, d.scan.at_boundary(), frame, got)
    }

    #[test]
    fn a_stop_mid_frame_passes_the_whole_frame_under_both_drivers() {
        let uring = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new().enable_timer().build();
        match uring {
            Ok(mut rt) => {
                let (end, boundary, frame, got) = rt.block_on(stop_mid_frame());
                assert_eq!((end, boundary, got.len()), (End::Stopped, true, frame.len()), "io_uring");
                assert!(got == frame, "io_uring: the frame went through intact");
            }
            Err(e) => eprintln!("no io_uring here ({e}): the epoll driver alone is tested"),
        }
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build().unwrap();
        let (end, boundary, frame, got) = rt.block_on(stop_mid_frame());
        assert_eq!((end, boundary, got.len()), (End::Stopped, true, frame.len()), "epoll");
        assert!(got == frame, "epoll: the frame went through intact");
    }

    #[test]
    fn an_idle_close_frame_carries_its_reason() {
        let f = close_with_reason(1001, IDLE_REASON, None);
        assert_eq!(f[0], 0x88);
        assert_eq!(usize::from(f[1]), 2 + IDLE_REASON.len());
        assert_eq!(&f[2..4], &1001u16.to_be_bytes());
        assert_eq!(&f[4..], IDLE_REASON.as_bytes());
    }
}
