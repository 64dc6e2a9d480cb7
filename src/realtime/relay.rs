//! The relay of an upgraded session: two pumps in the connection's task, one per
//! direction, each with one buffer reused for the session's life. A pump reads what its
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
//!
//! Writes are never cancelled (a cancelled write could leave half a frame on the wire);
//! only a pump's wait for its next read is, when the other pump ended.

use std::cell::Cell;
use std::future::poll_fn;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use monoio::net::TcpStream;
use smg_wire::ws;

use super::scan::{Scan, Scanner};
use crate::io::{read_more, sleep, write_range};

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
    pub fn new(max_message: u64, seed: &[u8]) -> Self {
        let mut buf = Vec::with_capacity(RELAY_BUF.max(seed.len()));
        buf.extend_from_slice(seed);
        Direction { buf, scan: Scanner::new(max_message), bytes: 0 }
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
        let left = at.saturating_duration_since(Instant::now());
        if !left.is_zero() {
            sleep(left).await;
        }
    }
}

/// Forwards `from` → `to` until the direction ends. Told to stop in the middle of a frame,
/// it first passes the rest of that frame (for at most [`FINISH_FRAME`]), so that the close
/// frame the gateway may send next lands on a frame boundary.
async fn pump(from: &mut TcpStream, to: &mut TcpStream, d: &mut Direction, stop: &Stop) -> End {
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
                let (res, buf) = write_range(to, std::mem::take(&mut d.buf), 0, n).await;
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
        if let Some(by) = finish_by {
            if d.scan.at_boundary() {
                return End::Stopped;
            }
            let left = by.saturating_duration_since(Instant::now());
            match monoio::time::timeout(left, read_more(from, std::mem::take(&mut d.buf), RELAY_BUF / 2)).await {
                Ok((Ok(n), buf)) if n > 0 => d.buf = buf,
                Ok(_) => return End::Gone,
                Err(_) => return End::Stopped,
            }
            continue;
        }
        monoio::select! {
            (res, buf) = read_more(from, std::mem::take(&mut d.buf), RELAY_BUF / 2) => {
                d.buf = buf;
                match res {
                    Ok(n) if n > 0 => {}
                    _ => return End::Gone,
                }
            }
            _ = stop.wait() => {
                if d.scan.at_boundary() {
                    return End::Stopped;
                }
                // Mid-payload, so nothing was held back: only the buffer went with the
                // cancelled read.
                d.buf = Vec::with_capacity(RELAY_BUF);
                finish_by = Some(Instant::now() + FINISH_FRAME);
            }
        }
    }
}

/// The two sides of a session: each socket twice, a reader (a duplicate descriptor) and a
/// writer, so both directions can wait at once.
pub struct Sides<'a> {
    pub client_read: &'a mut TcpStream,
    pub client_write: &'a mut TcpStream,
    pub worker_read: &'a mut TcpStream,
    pub worker_write: &'a mut TcpStream,
}

/// How the session ended, for the log and the access line.
#[derive(Debug, Clone, Copy)]
pub struct Ended {
    pub client: End,
    pub worker: End,
    /// The close code the gateway sent, if it ended the session itself.
    pub sent_close: Option<u16>,
}

/// Close code for a session the gateway ends because it is shutting down ("going away").
pub const CLOSE_GOING_AWAY: u16 = 1001;

/// Relays until the session ends, or `drain` resolves (the gateway shuts down: both sides
/// get close 1001 once at a frame boundary); `mask` masks the close frame the gateway may
/// send the worker (a client's frames are masked).
pub async fn run(
    s: Sides<'_>,
    up: &mut Direction,
    down: &mut Direction,
    mask: [u8; 4],
    drain: impl std::future::Future<Output = ()>,
) -> Ended {
    let (client, worker, draining) = {
        let (stop_up, stop_down) = (Stop::default(), Stop::default());
        let grace = |e: End| if e == End::Closed { Instant::now() + CLOSE_WAIT } else { Instant::now() };
        let client_side = async {
            let e = pump(s.client_read, s.worker_write, up, &stop_up).await;
            stop_down.fire_at(grace(e));
            e
        };
        let worker_side = async {
            let e = pump(s.worker_read, s.client_write, down, &stop_down).await;
            stop_up.fire_at(grace(e));
            e
        };
        let mut pumps = std::pin::pin!(async { monoio::join!(client_side, worker_side) });
        monoio::select! {
            (c, w) = &mut pumps => (c, w, false),
            _ = drain => {
                stop_up.fire_at(Instant::now());
                stop_down.fire_at(Instant::now());
                let (c, w) = pumps.await;
                (c, w, true)
            }
        }
    };
    let code = match (client, worker) {
        (End::Violation(c), _) | (_, End::Violation(c)) => Some(c),
        _ if draining => Some(CLOSE_GOING_AWAY),
        _ => None,
    };
    if let Some(c) = code {
        // Each side that has not closed and whose stream is at a frame boundary hears why.
        if !matches!(client, End::Closed | End::PeerGone) && up.scan.at_boundary() {
            let (f, n) = ws::close_frame(c, Some(mask));
            let _ = write_range(s.worker_write, f[..n].to_vec(), 0, n).await;
        }
        if !matches!(worker, End::Closed | End::PeerGone) && down.scan.at_boundary() {
            let (f, n) = ws::close_frame(c, None);
            let _ = write_range(s.client_write, f[..n].to_vec(), 0, n).await;
        }
    }
    Ended { client, worker, sent_close: code }
}
