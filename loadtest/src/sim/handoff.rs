//! A decode worker's wait for the KV of a request's rooms: it asks each room's prefill
//! bootstrap server (`GET /handoff/{room}?wait_ms=N`, protocol in pd/mod.rs) within one budget,
//! `--handoff-timeout-ms`, shared by every room of the request.
//!
//! Beside pd/, not in it: it counts in the worker's stats, and the worker holds pd's state.
//! Each ask is one `GET` on a connection of its own, which the bootstrap server answers and
//! closes; only the status line matters. (Not the load generator's client: the simulator sits
//! below the load tools, which start it.)

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;
use monoio::time::Instant;

use crate::sim::pd::fields::Leg;
use crate::sim::worker::{bump, Worker};

/// The bootstrap port a null `bootstrap_port` means: SGLang's default
/// `--disaggregation-bootstrap-port`.
pub(crate) const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// Waits for every leg's KV; Err carries the reason for the 500 ("KV transfer failed: ...").
/// Counts the rooms received and the one that failed, and the time spent, in the worker's stats.
pub(crate) async fn receive(w: &Worker, legs: &[Leg], budget: Duration) -> Result<(), String> {
    let start = Instant::now();
    let deadline = start + budget;
    let mut result = Ok(());
    for leg in legs {
        if let Err(e) = receive_one(leg, deadline).await {
            bump(&w.stats.handoffs_failed, 1);
            result = Err(format!("KV transfer failed: room {}: {e}", leg.room));
            break;
        }
        bump(&w.stats.handoffs_waited, 1);
    }
    bump(&w.stats.handoff_wait_us, start.elapsed().as_micros() as u64);
    result
}

/// Asks for one room until it is ready, the bootstrap server cannot be reached, or `deadline`.
async fn receive_one(leg: &Leg, deadline: Instant) -> Result<(), String> {
    let addr = resolve(&leg.host, leg.port.unwrap_or(DEFAULT_BOOTSTRAP_PORT))?;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("timed out waiting for the prefill".into());
        }
        // Rounded up, so the prefill never gets a 0 ms wait and answers 404 at once.
        let wait_ms = left.as_micros().div_ceil(1000);
        let path = format!("/handoff/{}?wait_ms={wait_ms}", leg.room);
        match monoio::time::timeout(left, ask(addr, &path, &leg.host)).await {
            Ok(Ok(200)) => return Ok(()),
            // The prefill's long-poll ended before our budget (it caps its wait): ask again.
            Ok(Ok(404)) if Instant::now() < deadline => {}
            Ok(Ok(404)) => return Err("the prefill never had it".into()),
            Ok(Ok(status)) => return Err(format!("bootstrap server {addr} answered {status}")),
            Ok(Err(e)) => return Err(format!("bootstrap server {addr}: {e}")),
            Err(_) => return Err("timed out waiting for the prefill".into()),
        }
    }
}

/// One `GET path` to the bootstrap server at `addr`: its answer's status.
async fn ask(addr: SocketAddr, path: &str, host: &str) -> std::io::Result<u16> {
    let mut stream = TcpStream::connect(addr).await?;
    let head = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let (res, _) = stream.write_all(head.into_bytes()).await;
    res?;
    let mut buf: Vec<u8> = Vec::with_capacity(256);
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => return resp.code.ok_or_else(|| std::io::Error::other("no status")),
            Ok(httparse::Status::Partial) if buf.len() < 8192 => {}
            _ => return Err(std::io::Error::other("not an HTTP answer")),
        }
        if buf.capacity() - buf.len() < 256 {
            buf.reserve(1024);
        }
        let len = buf.len();
        let (res, slice) = stream.read(buf.slice_mut(len..)).await;
        buf = slice.into_inner();
        if res? == 0 {
            return Err(std::io::Error::other("closed before its answer"));
        }
    }
}

/// The bootstrap server's address. An IP literal (what gateways send) needs no resolver; a name
/// goes through the system's, which blocks this thread while it runs ("localhost" is instant).
fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (bare, port)
        .to_socket_addrs()
        .map_err(|e| format!("bootstrap host {host:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("bootstrap host {host:?} has no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(resolve("10.1.2.3", 9).unwrap(), "10.1.2.3:9".parse().unwrap());
        assert_eq!(resolve("[::1]", 9).unwrap(), "[::1]:9".parse().unwrap());
        assert_eq!(resolve("::1", 9).unwrap(), "[::1]:9".parse().unwrap());
    }
}
