//! Blocking HTTP/1.1 GETs for the control thread: health checks and model discovery.
//!
//! These run on the control thread's own prober threads, never on a shard, so plain
//! std::net with timeouts is the simplest correct tool.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use sonic_rs::JsonValueTrait;

use super::WorkerUrl;
use smg_wire::chunked::ChunkedDecoder;

/// Largest probe response we read.
const MAX_PROBE_RESPONSE: usize = 1 << 20;

pub struct ProbeResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// GET `path` on the worker with a connection of its own.
pub fn get(worker: &WorkerUrl, path: &str, timeout: Duration) -> std::io::Result<ProbeResponse> {
    let mut s = TcpStream::connect_timeout(&worker.addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
        worker.authority
    );
    s.write_all(req.as_bytes())?;
    // Read until the framed body is complete, not until EOF: a worker that ignores
    // `Connection: close` must not stall the probe until its timeout.
    let mut raw = Vec::new();
    let mut tmp = [0u8; 16 * 1024];
    loop {
        match parse(&raw) {
            Parsed::Done(r) => return Ok(r),
            Parsed::Bad => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed response")),
            Parsed::Partial if raw.len() > MAX_PROBE_RESPONSE => {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "response too large"))
            }
            Parsed::Partial => {}
        }
        let n = s.read(&mut tmp)?;
        if n == 0 {
            return match parse_at_eof(&raw) {
                Some(r) => Ok(r),
                None => Err(std::io::ErrorKind::UnexpectedEof.into()),
            };
        }
        raw.extend_from_slice(&tmp[..n]);
    }
}

enum Parsed {
    Done(ProbeResponse),
    Partial,
    Bad,
}

fn parse(raw: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let n = match resp.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Bad,
    };
    let Some(status) = resp.code else { return Parsed::Bad };
    let chunked = resp
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("transfer-encoding") && h.value.eq_ignore_ascii_case(b"chunked"));
    let len = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse::<usize>().ok());
    let rest = &raw[n..];
    if chunked {
        let mut body = Vec::new();
        let mut dec = ChunkedDecoder::new();
        return match dec.feed(rest, Some(&mut body)) {
            Ok(_) if dec.is_done() => Parsed::Done(ProbeResponse { status, body }),
            Ok(_) => Parsed::Partial,
            Err(_) => Parsed::Bad,
        };
    }
    match len {
        Some(len) if rest.len() >= len => Parsed::Done(ProbeResponse { status, body: rest[..len].to_vec() }),
        _ => Parsed::Partial,
    }
}

/// A response without Content-Length or chunking ends at EOF.
fn parse_at_eof(raw: &[u8]) -> Option<ProbeResponse> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(raw).ok()? {
        httparse::Status::Complete(n) => Some(ProbeResponse { status: resp.code?, body: raw[n..].to_vec() }),
        httparse::Status::Partial => None,
    }
}

/// The worker's model id: `/v1/models` `data[0].id`, else `model_path` from
/// `/get_model_info`, then `/model_info`.
pub fn discover_model(worker: &WorkerUrl, timeout: Duration) -> Option<String> {
    if let Ok(r) = get(worker, "/v1/models", timeout) {
        if (200..300).contains(&r.status) {
            if let Ok(v) = sonic_rs::from_slice::<sonic_rs::Value>(&r.body) {
                if let Some(id) = v["data"][0]["id"].as_str().filter(|s| !s.is_empty()) {
                    return Some(id.to_string());
                }
            }
        }
    }
    for path in ["/get_model_info", "/model_info"] {
        if let Ok(r) = get(worker, path, timeout) {
            if (200..300).contains(&r.status) {
                if let Ok(v) = sonic_rs::from_slice::<sonic_rs::Value>(&r.body) {
                    if let Some(p) = v["model_path"].as_str().filter(|s| !s.is_empty()) {
                        return Some(p.to_string());
                    }
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_length_chunked_and_close_delimited() {
        let Parsed::Done(r) = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokXX") else { panic!() };
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
        let Parsed::Done(r) = parse(b"HTTP/1.1 503 X\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nno\r\n0\r\n\r\n") else {
            panic!()
        };
        assert_eq!((r.status, r.body.as_slice()), (503, &b"no"[..]));
        assert!(matches!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nok"), Parsed::Partial));
        assert!(matches!(parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok"), Parsed::Partial));
        assert_eq!(parse_at_eof(b"HTTP/1.0 200 OK\r\n\r\nall").unwrap().body, b"all");
        assert!(matches!(parse(b"garbage"), Parsed::Bad));
    }
}
