//! A prefill worker's bootstrap listener: the HTTP/1.1 endpoint decode workers long-poll for
//! the rooms whose prefill finished here (`GET /handoff/{room}?wait_ms=N`, see the protocol in
//! pd/mod.rs; the rooms themselves are pd/rooms.rs). Beside pd/, not in it: it reads the
//! worker, which holds pd's state.
//!
//! One request per connection (`connection: close`): a decode asks once per room and the
//! simulator's load is in the inference traffic, not here.

use std::rc::Rc;
use std::time::Duration;

use monoio::buf::IoBufMut;
use monoio::io::AsyncReadRent;
use monoio::net::{TcpListener, TcpStream};

use crate::rt::write_out;
use crate::sim::render::{put_error_body, put_response};
use crate::sim::worker::{bump, Worker};

use crate::sim::pd::rooms::ROOM_TTL;

/// A long-poll without `wait_ms` waits this long.
const DEFAULT_WAIT: Duration = Duration::from_secs(10);
/// The longest long-poll: no room is remembered longer, so waiting longer could not help.
const MAX_WAIT: Duration = ROOM_TTL;
/// A connection that sends no complete head within this is dropped.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_HEAD: usize = 8 * 1024;

/// What a bootstrap request asks.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ask {
    /// `GET /handoff/{room}`, waiting this long at most.
    Handoff {
        room: u64,
        wait: Duration,
    },
    BadMethod,
    NotFound,
}

/// Reads a request line's method and target.
pub(crate) fn ask(method: &str, target: &str) -> Ask {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let Some(room) = path.strip_prefix("/handoff/").and_then(|r| r.parse::<u64>().ok()) else {
        return Ask::NotFound;
    };
    if method != "GET" {
        return Ask::BadMethod;
    }
    let wait = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("wait_ms="))
        .and_then(|ms| ms.parse::<u64>().ok())
        .map_or(DEFAULT_WAIT, Duration::from_millis)
        .min(MAX_WAIT);
    Ask::Handoff { room, wait }
}

/// Accepts bootstrap connections until the worker dies (a dead process's bootstrap server is
/// gone too: decodes asking it then fail to connect).
pub(crate) async fn serve(w: Rc<Worker>, listener: TcpListener) {
    loop {
        let accepted = monoio::select! {
            r = listener.accept() => r,
            _ = w.died.wait() => return,
        };
        match accepted {
            Ok((stream, _)) => {
                monoio::spawn(answer(w.clone(), stream));
            }
            Err(e) => {
                // Out of fds or similar: back off instead of spinning.
                eprintln!("smg-sim: bootstrap accept for port {}: {e}", w.port);
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Answers one request and closes.
async fn answer(w: Rc<Worker>, mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let Ok(Some(ask)) = monoio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream)).await else {
        return;
    };
    let (status, msg) = match ask {
        Ask::Handoff { room, wait } => {
            let Some(pd) = w.pd.as_ref() else { return };
            if pd.rooms.wait(room, wait, &w.died).await {
                bump(&w.stats.handoffs_served, 1);
                (200, String::new())
            } else if w.died.is_fired() {
                return;
            } else {
                (404, format!("room {room} was not prefilled here within {} ms", wait.as_millis()))
            }
        }
        Ask::BadMethod => (405, "method not allowed".into()),
        Ask::NotFound => (404, "not found".into()),
    };
    let mut body = Vec::with_capacity(128);
    if status == 200 {
        body.extend_from_slice(b"{\"status\":\"ready\"}");
    } else {
        put_error_body(&mut body, status, &msg);
    }
    let mut out = Vec::with_capacity(256);
    put_response(&mut out, status, "application/json", &body, false, &w.extra_headers);
    let _ = write_out(&mut stream, &mut out).await;
}

/// Reads until a complete head; None on a closed, unreadable or oversized one.
async fn read_head(stream: &mut TcpStream) -> Option<Ask> {
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => return Some(ask(req.method?, req.path?)),
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => {}
            _ => return None,
        }
        if buf.capacity() - buf.len() < 512 {
            buf.reserve(1024);
        }
        let len = buf.len();
        let (res, slice) = stream.read(buf.slice_mut(len..)).await;
        buf = slice.into_inner();
        match res {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handoff_requests() {
        assert_eq!(ask("GET", "/handoff/42"), Ask::Handoff { room: 42, wait: DEFAULT_WAIT });
        assert_eq!(
            ask("GET", "/handoff/7?x=1&wait_ms=250"),
            Ask::Handoff { room: 7, wait: Duration::from_millis(250) }
        );
        assert_eq!(ask("GET", "/handoff/7?wait_ms=999999999"), Ask::Handoff { room: 7, wait: MAX_WAIT });
        assert_eq!(ask("POST", "/handoff/7"), Ask::BadMethod);
        for bad in ["/handoff/", "/handoff/-1", "/handoff/x", "/health", "/handoff/1/2"] {
            assert_eq!(ask("GET", bad), Ask::NotFound, "{bad}");
        }
    }
}
