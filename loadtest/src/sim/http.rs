//! The simulator's HTTP/1.1 server connection: read a request (head, then Content-Length or chunked body), dispatch, answer, repeat.
//!
//! Keep-alive and pipelining are supported; buffers live as long as the connection.

use std::io;
use std::rc::Rc;

use monoio::buf::IoBufMut;
use monoio::io::AsyncReadRent;
use monoio::net::TcpStream;

use crate::rt::write_out;
use crate::sim::engine;
use crate::sim::provider;
use crate::sim::provider_responses;
use crate::sim::realtime;
use crate::sim::render::Scratch;
use crate::sim::render::{put_error_body, put_response};
use crate::sim::request_log;
use crate::sim::routes::{self, Action, Route};
use crate::sim::worker::{ConnGuard, Worker};
use crate::wire::{self, BodyKind, ChunkedDecoder};

/// Largest request head accepted.
const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 64;
const READ_CHUNK: usize = 16 * 1024;
/// Read buffers above this are shrunk back after a large request, so idle connections stay small.
const SHRINK_ABOVE: usize = 1 << 20;

/// What the head says about the request.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    route: Route,
    is_post: bool,
    keep_alive: bool,
    body: BodyKind,
    head_len: usize,
    expect_continue: bool,
    is_get: bool,
    /// Where `Sec-WebSocket-Key` and `Content-Type` are in the read buffer, when sent.
    ws_key: Option<std::ops::Range<usize>>,
    content_type: Option<std::ops::Range<usize>>,
    /// The method and path, and the logged headers it carried (`request_log::HEADERS`
    /// index, value's place in the read buffer), for `/sim/requests`.
    method: &'static str,
    path: std::ops::Range<usize>,
    logged: Vec<(usize, std::ops::Range<usize>)>,
}

/// Where `part` (a slice of `buf`) sits in it.
fn range_in(buf: &[u8], part: &[u8]) -> std::ops::Range<usize> {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    start..start + part.len()
}

/// Why a head was refused; each maps to one status.
#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    Malformed,
    TooLarge,
}

/// Parses a complete head from `buf`, or returns None when more bytes are needed.
fn parse_head(buf: &[u8], w: &Worker) -> Result<Option<Head>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => return Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(_) => return Err(HeadError::Malformed),
    };
    let http11 = req.version == Some(1);
    let mut keep_alive = http11;
    let mut body = BodyKind::Empty;
    let mut expect_continue = false;
    let mut ws_key = None;
    let mut content_type = None;
    let mut logged = Vec::new();
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            if body == BodyKind::Chunked {
                continue;
            }
            let len = wire::parse_content_length(h.value).map_err(|_| HeadError::Malformed)?;
            body = BodyKind::Length { len };
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // Chunked wins over Content-Length (RFC 9112 §6.3).
            if wire::has_token(h.value, b"chunked") {
                body = BodyKind::Chunked;
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            if wire::has_token(h.value, b"close") {
                keep_alive = false;
            } else if wire::has_token(h.value, b"keep-alive") {
                keep_alive = true;
            }
        } else if name.eq_ignore_ascii_case(b"expect") {
            expect_continue = wire::has_token(h.value, b"100-continue");
        } else if name.eq_ignore_ascii_case(b"sec-websocket-key") {
            ws_key = Some(range_in(buf, h.value.trim_ascii()));
        } else if name.eq_ignore_ascii_case(b"content-type") {
            content_type = Some(range_in(buf, h.value));
        }
        if let Some(i) = request_log::HEADERS.iter().position(|l| name.eq_ignore_ascii_case(l.as_bytes())) {
            logged.push((i, range_in(buf, h.value)));
        }
    }
    let path = req.path.unwrap_or("/");
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    let method = match req.method {
        Some("GET") => "GET",
        Some("POST") => "POST",
        Some("PATCH") => "PATCH",
        Some("DELETE") => "DELETE",
        Some("PUT") => "PUT",
        _ => "OTHER",
    };
    Ok(Some(Head {
        method,
        path: range_in(buf, path.as_bytes()),
        logged,
        route: routes::resolve(path, w.runtime),
        is_post: req.method == Some("POST"),
        keep_alive,
        body,
        head_len,
        expect_continue,
        is_get: req.method == Some("GET"),
        ws_key,
        content_type,
    }))
}

/// Reads more bytes into the spare capacity of `rbuf`; Ok(0) means the peer closed.
async fn fill(stream: &mut TcpStream, rbuf: &mut Vec<u8>) -> io::Result<usize> {
    if rbuf.capacity() - rbuf.len() < READ_CHUNK / 2 {
        rbuf.reserve(READ_CHUNK.max(rbuf.len()));
    }
    let buf = std::mem::take(rbuf);
    let len = buf.len();
    let (res, slice) = stream.read(buf.slice_mut(len..)).await;
    *rbuf = slice.into_inner();
    res
}

/// Serves one connection until the peer leaves, an error occurs, or keep-alive ends.
/// `guard` lists the connection for [`Worker::die`] (taken at accept).
pub async fn serve(w: Rc<Worker>, stream: TcpStream, guard: ConnGuard) {
    serve_prefixed(w, stream, Vec::with_capacity(READ_CHUNK), guard).await
}

/// As [`serve`], for a connection whose first bytes were already read into `rbuf` (the gRPC
/// mode reads them to tell HTTP/2 from HTTP/1.1).
pub async fn serve_prefixed(w: Rc<Worker>, mut stream: TcpStream, mut rbuf: Vec<u8>, guard: ConnGuard) {
    let _ = stream.set_nodelay(true);
    let mut body: Vec<u8> = Vec::new();
    let mut s = Scratch::default();
    loop {
        // 1. Head.
        let head = loop {
            if !rbuf.is_empty() {
                match parse_head(&rbuf, &w) {
                    Ok(Some(h)) => break h,
                    Ok(None) => {}
                    Err(e) => {
                        let status = if e == HeadError::TooLarge { 431 } else { 400 };
                        let _ = reject(&w, &mut stream, &mut s.out, status, "bad request head").await;
                        return;
                    }
                }
            }
            match fill(&mut stream, &mut rbuf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        };

        // A WebSocket session takes the connection over.
        if let (Route::Realtime, true, Some(key)) = (head.route, head.is_get, head.ws_key.clone()) {
            let key = rbuf[key].to_vec();
            rbuf.drain(..head.head_len);
            let _ = realtime::session(&w, &mut stream, &key, rbuf).await;
            return;
        }

        // 2. Body.
        let head_len = head.head_len;
        let consumed;
        let from_rbuf;
        match head.body {
            BodyKind::Length { len } => {
                if len > w.max_body {
                    let _ = reject(&w, &mut stream, &mut s.out, 413, "request body too large").await;
                    return;
                }
                let need = head_len + len;
                if rbuf.len() < need {
                    if head.expect_continue {
                        s.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                        if write_out(&mut stream, &mut s.out).await.is_err() {
                            return;
                        }
                    }
                    rbuf.reserve(need - rbuf.len());
                    while rbuf.len() < need {
                        match fill(&mut stream, &mut rbuf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                    }
                }
                consumed = need;
                from_rbuf = true;
            }
            BodyKind::Chunked => {
                body.clear();
                let mut dec = ChunkedDecoder::new();
                let mut pos = head_len;
                let mut sent_continue = false;
                loop {
                    match dec.decode(&rbuf[pos..], |d| body.extend_from_slice(d)) {
                        Ok(n) => pos += n,
                        Err(_) => {
                            let _ = reject(&w, &mut stream, &mut s.out, 400, "bad chunked body").await;
                            return;
                        }
                    }
                    if dec.is_done() {
                        break;
                    }
                    if body.len() > w.max_body {
                        let _ = reject(&w, &mut stream, &mut s.out, 413, "request body too large").await;
                        return;
                    }
                    if head.expect_continue && !sent_continue {
                        sent_continue = true;
                        s.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                        if write_out(&mut stream, &mut s.out).await.is_err() {
                            return;
                        }
                    }
                    match fill(&mut stream, &mut rbuf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
                consumed = pos;
                from_rbuf = false;
            }
            BodyKind::Empty | BodyKind::UntilClose => {
                consumed = head_len;
                from_rbuf = true;
            }
        }

        // 3. Dispatch. --close-after-response answers as if the client had asked to close.
        let keep_alive = head.keep_alive && !w.faults.get().close_after_response;
        if !matches!(head.route, Route::SimControl | Route::SimStats | Route::SimRequests | Route::SimConnects) {
            let path = std::str::from_utf8(&rbuf[head.path.clone()]).unwrap_or("");
            let logged: Vec<(usize, &[u8])> = head.logged.iter().map(|(i, r)| (*i, &rbuf[r.clone()])).collect();
            w.requests.record(head.method, path, &logged);
        }
        let action = {
            let req_body: &[u8] = if from_rbuf { &rbuf[head_len..consumed] } else { &body };
            let provider_said = w.providers.as_ref().is_some_and(|keys| {
                let ask = match head.route {
                    Route::SimControl | Route::SimStats | Route::SimRequests | Route::SimConnects | Route::Health => {
                        None
                    }
                    Route::Models => Some(provider::Ask::Models),
                    Route::Infer(_) | Route::Decisions => Some(provider::Ask::Infer(req_body)),
                    Route::Responses => Some(provider::Ask::Responses(req_body)),
                    _ => Some(provider::Ask::Other),
                };
                let header = |i: usize| head.logged.iter().find(|(h, _)| *h == i).map(|(_, r)| &rbuf[r.clone()]);
                ask.is_some_and(|ask| {
                    let host = header(0).unwrap_or(b"");
                    let fail = w.provider_fail.get();
                    provider::answer(keys, fail, host, header, ask, keep_alive, &w.extra_headers, &mut s.out)
                })
            });
            match head.route {
                _ if provider_said => Action::Reply { keep_alive },
                Route::RealtimeRest(path) if head.is_post => {
                    let ct = head.content_type.clone().map_or(&b""[..], |r| &rbuf[r]);
                    let ct = std::str::from_utf8(ct).unwrap_or("");
                    realtime::rest_reply(&w, path, ct, req_body, keep_alive, &mut s.out);
                    Action::Reply { keep_alive }
                }
                _ => routes::dispatch(&w, head.route, head.is_post, req_body, keep_alive, &mut s.out),
            }
        };
        rbuf.drain(..consumed);
        if rbuf.is_empty() && rbuf.capacity() > SHRINK_ABOVE {
            rbuf.shrink_to(READ_CHUNK);
        }
        if body.capacity() > SHRINK_ABOVE {
            body = Vec::new();
        }

        // 4. Answer.
        let keep = match action {
            Action::Reply { keep_alive } => match write_out(&mut stream, &mut s.out).await {
                Ok(()) => keep_alive,
                Err(_) => false,
            },
            Action::Generate(job) => engine::run(&w, job, &mut stream, &mut s, keep_alive).await.unwrap_or(false),
            Action::Responses(turn) => {
                provider_responses::run(&w, *turn, &mut stream, &mut s, keep_alive).await.unwrap_or(false)
            }
            Action::Hang => {
                // Swallow whatever the client sends until it gives up.
                loop {
                    rbuf.clear();
                    match fill(&mut stream, &mut rbuf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            }
            Action::Close => false,
            Action::Die => {
                w.die_except(Some(guard.id()));
                let _ = write_out(&mut stream, &mut s.out).await;
                return;
            }
        };
        if !keep || w.died.is_fired() {
            return;
        }
    }
}

/// Answers an unreadable request with `status` and closes.
async fn reject(w: &Worker, stream: &mut TcpStream, out: &mut Vec<u8>, status: u16, msg: &str) -> io::Result<()> {
    let mut body = Vec::with_capacity(128);
    put_error_body(&mut body, status, msg);
    put_response(out, status, "application/json", &body, false, &w.extra_headers);
    write_out(stream, out).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::config::SimArgs;
    use clap::Parser;

    fn worker() -> Rc<Worker> {
        let args = SimArgs::parse_from(["smg-sim", "--ports", "1"]);
        Worker::new(&args.worker_specs().unwrap()[0], 1)
    }

    #[test]
    fn heads_at_every_split() {
        let w = worker();
        let req =
            b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n{}";
        let full_head = req.len() - 2;
        for split in 0..req.len() {
            let got = parse_head(&req[..split], &w).unwrap();
            if split < full_head {
                assert_eq!(got, None, "split {split}");
            } else {
                let h = got.unwrap();
                assert_eq!(h.route, Route::Infer(crate::sim::request::Api::Chat));
                assert_eq!(h.body, BodyKind::Length { len: 2 });
                assert!(h.keep_alive && h.is_post && h.expect_continue);
                assert_eq!(h.head_len, full_head);
            }
        }
    }

    #[test]
    fn head_framing_rules() {
        let w = worker();
        let h = parse_head(b"GET /health HTTP/1.0\r\n\r\n", &w).unwrap().unwrap();
        assert!(!h.keep_alive);
        assert_eq!(h.body, BodyKind::Empty);
        let h = parse_head(
            b"POST /generate HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
            &w,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.body, BodyKind::Chunked);
        assert!(!h.keep_alive);
        assert_eq!(parse_head(b"BAD\x01 / HTTP/1.1\r\n\r\n", &w), Err(HeadError::Malformed));
        assert_eq!(parse_head(b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n", &w), Err(HeadError::Malformed));
    }
}
