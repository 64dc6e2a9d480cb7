//! Blocking HTTP/1.1 GETs for the control thread: health checks and model discovery.
//!
//! These run on the control thread's own prober threads, never on a shard, so plain
//! std::net with timeouts is the simplest correct tool.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use sonic_rs::JsonValueTrait;

use super::WorkerUrl;
use crate::http::chunked::ChunkedDecoder;

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
    let mut raw = Vec::new();
    s.take(MAX_PROBE_RESPONSE as u64).read_to_end(&mut raw)?;
    parse(&raw).ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed response"))
}

fn parse(raw: &[u8]) -> Option<ProbeResponse> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let n = match resp.parse(raw).ok()? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return None,
    };
    let status = resp.code?;
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
    let body = if chunked {
        let mut out = Vec::new();
        ChunkedDecoder::new().feed(rest, Some(&mut out)).ok()?;
        out
    } else if let Some(len) = len {
        rest.get(..len)?.to_vec()
    } else {
        rest.to_vec()
    };
    Some(ProbeResponse { status, body })
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
        let r = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokXX").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
        let r = parse(b"HTTP/1.1 503 X\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nno\r\n0\r\n\r\n").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (503, &b"no"[..]));
        let r = parse(b"HTTP/1.0 200 OK\r\n\r\nall").unwrap();
        assert_eq!(r.body, b"all");
        assert!(parse(b"garbage").is_none());
    }
}
