//! The two opening handshakes of a relayed session (RFC 6455 §4): the client's upgrade
//! request checked, our own upgrade request to the worker, the worker's `101` checked
//! against the key we sent, and the `101` the client gets, whose accept is computed from
//! the client's key. No extension is offered to the worker (the relay reads frame heads
//! and must see every RSV bit clear); a subprotocol the client asks for goes to the worker,
//! and the worker's choice comes back.

use std::ops::Range;

use smg_wire::ws;

use super::query;
use crate::http::head::{Method, RequestHead};
use crate::http::respond::header_line;

/// What the client's upgrade request says, as ranges into its read buffer.
#[derive(Debug, Clone)]
pub struct ClientUpgrade {
    pub key: Range<usize>,
    pub protocol: Option<Range<usize>>,
}

fn has_token(v: &[u8], token: &[u8]) -> bool {
    v.split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

fn range_of(head: &RequestHead, buf: &[u8], name: &str) -> Option<Range<usize>> {
    head.headers.iter().find(|h| buf[h.name.clone()].eq_ignore_ascii_case(name.as_bytes())).map(|h| h.value.clone())
}

/// Checks the client's upgrade request; Err is the plain-text message of the `400`
/// (axum's, which answers SMG's upgrades).
pub fn client_upgrade(head: &RequestHead, buf: &[u8]) -> Result<ClientUpgrade, &'static str> {
    if head.method != Method::Get || head.http10 {
        return Err("WebSocket request must be an HTTP/1.1 GET");
    }
    if !head.header(buf, "connection").is_some_and(|v| has_token(v, b"upgrade")) {
        return Err("Connection header did not include 'upgrade'");
    }
    if !head.header(buf, "upgrade").is_some_and(|v| has_token(v, b"websocket")) {
        return Err("`Upgrade` header did not include 'websocket'");
    }
    if head.header(buf, "sec-websocket-version").map(|v| v.trim_ascii()) != Some(b"13") {
        return Err("`Sec-WebSocket-Version` header did not include '13'");
    }
    let key = range_of(head, buf, "sec-websocket-key").ok_or("`Sec-WebSocket-Key` header missing")?;
    if !ws::valid_key(buf[key.clone()].trim_ascii()) {
        return Err("`Sec-WebSocket-Key` header is not the base64 of 16 bytes");
    }
    Ok(ClientUpgrade { key, protocol: range_of(head, buf, "sec-websocket-protocol") })
}

/// What goes into the worker's upgrade request besides the fixed lines.
pub struct WorkerRequest<'a> {
    pub model: &'a str,
    pub authority: &'a str,
    /// The `Authorization` value: the client's own, else `Bearer <worker key>`.
    pub authorization: &'a [u8],
    /// The key we made for this handshake (base64 of 16 random bytes).
    pub key: &'a [u8; 24],
}

/// The worker's upgrade request: `GET /v1/realtime?model=…` (SMG's target: the model it
/// routed on, form-encoded), the client's subprotocol and the contract's forwarded headers.
pub fn worker_request(out: &mut Vec<u8>, r: &WorkerRequest<'_>, head: &RequestHead, buf: &[u8], up: &ClientUpgrade) {
    out.extend_from_slice(b"GET /v1/realtime?model=");
    query::put_encoded(out, r.model);
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(r.authority.as_bytes());
    out.extend_from_slice(
        b"\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: ",
    );
    out.extend_from_slice(r.key);
    out.extend_from_slice(b"\r\nauthorization: ");
    out.extend_from_slice(r.authorization);
    out.extend_from_slice(b"\r\n");
    if let Some(p) = &up.protocol {
        header_line(out, b"sec-websocket-protocol", &buf[p.clone()]);
    }
    for h in &head.forward {
        let name = &buf[h.name.clone()];
        if !name.eq_ignore_ascii_case(b"authorization") {
            header_line(out, name, &buf[h.value.clone()]);
        }
    }
    crate::http::hop::write(out, head.hop.clone().map(|r| &buf[r]));
    out.extend_from_slice(b"\r\n");
}

/// A `Sec-WebSocket-Key` from 16 random bytes (a nonce: RFC 6455 §4.1 asks for randomly
/// chosen ones).
pub fn fresh_key(raw: [u8; 16]) -> [u8; 24] {
    let mut key = [0u8; 24];
    ws::base64(&raw, &mut key);
    key
}

/// Checks the worker's `101` head (`head` is exactly its bytes): it upgrades to websocket
/// and accepts our `key`. Ok is the subprotocol it chose, as a range into `head`.
pub fn worker_accepts(head: &[u8], key: &[u8; 24]) -> Result<Option<Range<usize>>, &'static str> {
    let mut slots = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut slots);
    match resp.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err("malformed 101 head"),
    }
    let find = |name: &str| resp.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value);
    if !find("upgrade").is_some_and(|v| has_token(v, b"websocket")) {
        return Err("101 without Upgrade: websocket");
    }
    if !find("connection").is_some_and(|v| has_token(v, b"upgrade")) {
        return Err("101 without Connection: upgrade");
    }
    if find("sec-websocket-accept").map(|v| v.trim_ascii()) != Some(&ws::accept(key)[..]) {
        return Err("101 with a wrong Sec-WebSocket-Accept");
    }
    if find("sec-websocket-extensions").is_some() {
        return Err("101 with an extension nobody offered");
    }
    Ok(find("sec-websocket-protocol").map(|v| crate::http::head::offset(head, v)))
}

/// The client's `101`: its accept, the worker's subprotocol, our request id and the worker.
pub fn client_101(out: &mut Vec<u8>, client_key: &[u8], protocol: Option<&[u8]>, request_id: &[u8], worker: &str) {
    out.extend_from_slice(
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: ",
    );
    out.extend_from_slice(&ws::accept(client_key.trim_ascii()));
    out.extend_from_slice(b"\r\n");
    if let Some(p) = protocol {
        header_line(out, b"sec-websocket-protocol", p);
    }
    header_line(out, b"x-request-id", request_id);
    header_line(out, b"x-smg-routed-worker-id", worker.as_bytes());
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::head::parse_request;

    fn head(raw: &str) -> (RequestHead, Vec<u8>) {
        let buf = raw.as_bytes().to_vec();
        (parse_request(&buf).unwrap().unwrap(), buf)
    }

    const OK: &str = "GET /v1/realtime?model=m HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: realtime\r\n\r\n";

    #[test]
    fn client_requests() {
        let (h, b) = head(OK);
        let up = client_upgrade(&h, &b).unwrap();
        assert_eq!(&b[up.key.clone()], b"dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(&b[up.protocol.clone().unwrap()], b"realtime");
        for (from, to) in [
            ("Sec-WebSocket-Version: 13", "Sec-WebSocket-Version: 8"),
            ("keep-alive, Upgrade", "keep-alive"),
            ("Upgrade: websocket", "Upgrade: h2c"),
            ("dGhlIHNhbXBsZSBub25jZQ==", "short"),
        ] {
            let (h, b) = head(&OK.replace(from, to));
            assert!(client_upgrade(&h, &b).is_err(), "{to}");
        }
    }

    #[test]
    fn worker_side() {
        let (h, b) = head(OK);
        let up = client_upgrade(&h, &b).unwrap();
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&1u64.to_le_bytes());
        raw[8..].copy_from_slice(&2u64.to_le_bytes());
        let key = fresh_key(raw);
        let mut out = Vec::new();
        let r = WorkerRequest { model: "org/m 1", authority: "w:1", authorization: b"Bearer k", key: &key };
        worker_request(&mut out, &r, &h, &b, &up);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("GET /v1/realtime?model=org%2Fm+1 HTTP/1.1\r\nhost: w:1\r\n"), "{text}");
        assert!(text.contains("sec-websocket-protocol: realtime\r\n"));
        assert!(text.ends_with("\r\n\r\n") && !text.contains("keep-alive"));
        let accept = std::str::from_utf8(&ws::accept(&key)).unwrap().to_owned();
        let good = format!("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n");
        assert_eq!(worker_accepts(good.as_bytes(), &key), Ok(None));
        let bad = good.replace(&accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert!(worker_accepts(bad.as_bytes(), &key).is_err());
        let mut out = Vec::new();
        client_101(&mut out, b"dGhlIHNhbXBsZSBub25jZQ==", None, b"req-1", "http://w:1");
        assert!(String::from_utf8(out).unwrap().contains("sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
    }
}
