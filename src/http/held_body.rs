//! A non-streaming chunked answer read whole before any byte of it reaches the client.
//!
//! A worker's Content-Length is checked against `--max-payload-size` from its head; a chunked
//! answer says nothing of its size up front. Relayed as it arrives, an answer over the cap
//! would be cut after its 200 head had gone out, a truncated body the client cannot tell
//! from a whole one. So a non-streaming chunked answer is held here until its last chunk is
//! in the connection's buffer (the relay then sends it as it would any buffered answer), and
//! one over the cap is refused while the client has seen nothing: SMG's `502
//! upstream_response_too_large`. Streams are exempt: they are as long as the generation.

use std::time::Duration;

use smg_wire::chunked::ChunkedDecoder;

use super::pool::{UpstreamConn, UPSTREAM_BUF};
use crate::io::{read_more_within, Timed};

/// Why a held body did not arrive whole.
#[derive(Debug, PartialEq, Eq)]
pub enum Unheld {
    /// Its chunks carry more than the cap (bytes counted so far).
    TooLarge(u64),
    /// Broken chunk framing, a close before the end, or no byte for the read timeout.
    Bad(&'static str),
}

/// Reads until the chunked body that starts at `up.buf[start..]` has ended, holding its data
/// to `max` bytes; each read waits at most `idle`.
pub async fn hold_chunked(up: &mut UpstreamConn, start: usize, max: u64, idle: Duration) -> Result<(), Unheld> {
    let mut decoder = ChunkedDecoder::new();
    let (mut at, mut data) = (start, 0u64);
    loop {
        at += scan(&mut decoder, &up.buf[at..], &mut data, max)?;
        if decoder.is_done() {
            return Ok(());
        }
        let (res, buf) = read_more_within(&mut up.stream, std::mem::take(&mut up.buf), UPSTREAM_BUF / 2, idle).await;
        up.buf = buf;
        match res {
            Timed::Done(Ok(n)) if n > 0 => {}
            Timed::Done(_) => return Err(Unheld::Bad("worker closed mid-body")),
            Timed::Expired => return Err(Unheld::Bad("no body bytes within --upstream-read-timeout-secs")),
        }
    }
}

/// Feeds `input` to the decoder, counting chunk data into `data`; how much of it was framing
/// or data of this body.
fn scan(decoder: &mut ChunkedDecoder, input: &[u8], data: &mut u64, max: u64) -> Result<usize, Unheld> {
    let used = decoder.decode(input, |d| *data += d.len() as u64).map_err(|e| Unheld::Bad(e.0))?;
    if *data > max {
        return Err(Unheld::TooLarge(*data));
    }
    Ok(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_all(wire: &[u8], max: u64, cut: usize) -> Result<bool, Unheld> {
        let mut d = ChunkedDecoder::new();
        let mut data = 0;
        let n = scan(&mut d, &wire[..cut], &mut data, max)?;
        scan(&mut d, &wire[n..], &mut data, max)?;
        Ok(d.is_done())
    }

    #[test]
    fn counts_data_not_framing_at_any_split() {
        let wire = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
        for cut in 0..=wire.len() {
            assert_eq!(scan_all(wire, 11, cut), Ok(true), "cut at {cut}");
            assert_eq!(scan_all(wire, 10, cut), Err(Unheld::TooLarge(11)), "cut at {cut}");
        }
        assert_eq!(scan_all(b"zz\r\n", 10, 0), Err(Unheld::Bad("missing chunk size")));
    }
}
