//! The last accepts of a drain. Closing a listener resets every connection still in its
//! accept queue, and clients that connected a moment before SIGTERM had their connect()
//! succeed: they read ECONNRESET (about one in 128 of a tight connect loop did). So before a
//! shard lets go of a listener only it holds, it refuses new handshakes (see
//! [`io::refuse_handshakes`]), lets the ones under way land, and serves everything the queue
//! holds; those connections are answered with `connection: close`.
//!
//! Not on a handover (the successor keeps accepting on the same socket) nor on a socket
//! systemd holds (systemd keeps its queue for the next start).

use std::rc::Rc;
use std::time::Duration;

use crate::io::{self, TcpListener};
use crate::shard::Shard;

/// A pause between sweeps of the queue: a handshake whose SYN-ACK left before the filter
/// completes within a round trip (microseconds on loopback, a LAN's fraction of one).
const SETTLE: Duration = Duration::from_millis(10);
/// Sweeps in a row that must find the queue empty before the listener closes.
const QUIET_SWEEPS: u32 = 2;
/// The most a drain spends here, however steadily handshakes keep landing.
const MAX_SETTLE: Duration = Duration::from_millis(500);
/// One accept of a connection the queue is known to hold.
const ACCEPT_WAIT: Duration = Duration::from_millis(100);

/// Empties the listener's accept queue, serving what it held, before the caller closes it.
pub(crate) async fn drain(shard: &Rc<Shard>, listener: &TcpListener) {
    if let Err(e) = io::refuse_handshakes(listener) {
        crate::warn!("shard {}: cannot stop new handshakes before closing the listener: {e}", shard.index());
    }
    let until = crate::clock::now() + MAX_SETTLE;
    let mut quiet = 0;
    loop {
        let mut took = 0;
        while io::backlog_ready(listener) {
            match crate::clock::timeout(ACCEPT_WAIT, listener.accept()).await {
                Ok(Ok((stream, _peer))) => {
                    took += 1;
                    let slot = shard.open_connection_in_drain();
                    monoio::spawn(crate::serve::connection(Rc::clone(shard), stream, slot));
                }
                _ => break,
            }
        }
        quiet = if took == 0 { quiet + 1 } else { 0 };
        if quiet >= QUIET_SWEEPS || crate::clock::now() >= until {
            return;
        }
        io::sleep(SETTLE).await;
    }
}
