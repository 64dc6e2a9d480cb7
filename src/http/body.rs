//! Request bodies: a sans-I/O reader (Content-Length or chunked, limits in, [`BodyError`]
//! out) and the async loop that feeds it from the client socket.
//!
//! A Content-Length body stays where it arrived, in the connection buffer, and is forwarded
//! from there without a copy. A chunked body is decoded into its own buffer as it arrives
//! and its raw framing is dropped from the connection buffer, so a long upload holds at most
//! one read of framing at a time.

use std::ops::Range;
use std::time::Duration;

use monoio::net::TcpStream;
use smg_wire::chunked::ChunkedDecoder;

use super::head::{BodyKind, RequestHead};
use super::respond::CONTINUE;
use crate::io::{read_more_within, write_all, Timed};

/// Largest single read while a body is arriving.
const READ_CHUNK: usize = 1 << 20;
/// Reads of a chunked body.
const CHUNKED_READ: usize = 8 * 1024;

/// Where the request body is.
#[derive(Debug, PartialEq, Eq)]
pub enum Body {
    None,
    /// In the connection buffer (Content-Length bodies): forwarded without a copy.
    InBuf(Range<usize>),
    /// De-chunked (or rewritten) into its own buffer.
    Owned(Vec<u8>),
}

impl Body {
    /// The body's bytes; `buf` is the connection buffer an `InBuf` body points into.
    pub fn bytes<'a>(&'a self, buf: &'a [u8]) -> &'a [u8] {
        match self {
            Body::None => &[],
            Body::InBuf(r) => &buf[r.clone()],
            Body::Owned(v) => v,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// `--max-payload-size`.
    pub max: usize,
    /// The whole body must have arrived this long after its reading starts
    /// (`--client-read-timeout-secs`). A total, not a per-read, bound: a client trickling
    /// one byte a second holds an admission permit or scheduler slot while it does, and a
    /// per-read bound let four such clients hold four permits forever.
    pub within: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// Larger than the limit (carried for the message).
    TooLarge(usize),
    /// The body had not arrived within its time.
    Stalled,
    /// Broken chunked framing.
    Malformed(&'static str),
    /// The client closed or the socket failed: nobody to answer.
    Gone,
}

/// What the reader needs next.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// The whole body is in; the next request starts at `next` in the buffer.
    Done { body: Body, next: usize },
    /// Read at least this much more.
    More(usize),
}

/// The sans-I/O body reader: call [`BodyReader::step`] after every read.
pub struct BodyReader {
    start: usize,
    max: usize,
    state: State,
}

enum State {
    Empty,
    Length { end: usize },
    Chunked { dec: ChunkedDecoder, body: Vec<u8> },
    Finished,
}

// === impl BodyReader ===

impl BodyReader {
    /// A reader for the body after `head`. A declared length over `max` fails at once, before
    /// any byte of the body is read.
    pub fn new(head: &RequestHead, max: usize) -> Result<Self, BodyError> {
        let state = match head.body {
            BodyKind::Empty => State::Empty,
            BodyKind::Length { len } if len > max as u64 => return Err(BodyError::TooLarge(max)),
            BodyKind::Length { len } => State::Length { end: head.len + len as usize },
            BodyKind::Chunked => State::Chunked { dec: ChunkedDecoder::new(), body: Vec::new() },
        };
        Ok(Self { start: head.len, max, state })
    }

    /// Looks at what `buf` holds now. Chunked framing already decoded is removed from `buf`
    /// (everything before `start` stays put, so the head's ranges stay valid).
    pub fn step(&mut self, buf: &mut Vec<u8>) -> Result<Step, BodyError> {
        match &mut self.state {
            State::Empty => {
                self.state = State::Finished;
                Ok(Step::Done { body: Body::None, next: self.start })
            }
            State::Length { end } => {
                let end = *end;
                if buf.len() < end {
                    return Ok(Step::More((end - buf.len()).min(READ_CHUNK)));
                }
                self.state = State::Finished;
                Ok(Step::Done { body: Body::InBuf(self.start..end), next: end })
            }
            State::Chunked { dec, body } => {
                let used = dec.feed(&buf[self.start..], Some(body)).map_err(|e| BodyError::Malformed(e.0))?;
                if body.len() > self.max {
                    return Err(BodyError::TooLarge(self.max));
                }
                buf.drain(self.start..self.start + used);
                if !dec.is_done() {
                    return Ok(Step::More(CHUNKED_READ));
                }
                let body = std::mem::take(body);
                self.state = State::Finished;
                Ok(Step::Done { body: Body::Owned(body), next: self.start })
            }
            State::Finished => Err(BodyError::Malformed("body already read")),
        }
    }
}

/// Reads the body of `head` from `client`, answering `Expect: 100-continue` when the body is
/// not already here. Returns the body and where the next request starts in the buffer.
pub async fn read_body(
    client: &mut TcpStream,
    head: &RequestHead,
    mut buf: Vec<u8>,
    limits: BodyLimits,
) -> (Result<(Body, usize), BodyError>, Vec<u8>) {
    let mut reader = match BodyReader::new(head, limits.max) {
        Ok(r) => r,
        Err(e) => return (Err(e), buf),
    };
    let mut continued = !head.expect_continue;
    let deadline = crate::clock::now() + limits.within;
    loop {
        let want = match reader.step(&mut buf) {
            Ok(Step::Done { body, next }) => return (Ok((body, next)), buf),
            Ok(Step::More(want)) => want,
            Err(e) => return (Err(e), buf),
        };
        if !continued {
            continued = true;
            let (res, _) = write_all(client, CONTINUE.to_vec()).await;
            if res.is_err() {
                return (Err(BodyError::Gone), buf);
            }
        }
        let left = deadline.saturating_duration_since(crate::clock::now());
        let (res, b) = read_more_within(client, buf, want, left).await;
        buf = b;
        match res {
            Timed::Done(Ok(n)) if n > 0 => {}
            Timed::Done(_) => return (Err(BodyError::Gone), buf),
            Timed::Expired => return (Err(BodyError::Stalled), buf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::head::parse_request;

    /// Feeds `wire` to a reader, first `cut` bytes then as much as it asks for; returns the
    /// body and what follows it.
    fn read_split(wire: &[u8], cut: usize, max: usize) -> Result<(Vec<u8>, Vec<u8>), BodyError> {
        let head = parse_request(wire).unwrap().unwrap();
        let mut reader = BodyReader::new(&head, max)?;
        let mut buf = wire[..cut.max(head.len)].to_vec();
        let mut fed = buf.len();
        loop {
            match reader.step(&mut buf)? {
                Step::Done { body, next } => {
                    let b = body.bytes(&buf).to_vec();
                    assert_eq!(&buf[..head.len], &wire[..head.len], "head bytes moved");
                    // What follows the body: what the reader left in the buffer, then the
                    // part of the wire it never asked for.
                    return Ok((b, [&buf[next..], &wire[fed..]].concat()));
                }
                Step::More(want) => {
                    assert!(want > 0);
                    assert!(fed < wire.len(), "reader wants more than the wire has");
                    let take = (wire.len() - fed).min(want);
                    buf.extend_from_slice(&wire[fed..fed + take]);
                    fed += take;
                }
            }
        }
    }

    #[test]
    fn length_body_at_every_split() {
        let wire =
            b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello worldGET / HTTP/1.1\r\nHost: a\r\n\r\n";
        for cut in 0..=wire.len() {
            let (body, rest) = read_split(wire, cut, 100).unwrap();
            assert_eq!(body, b"hello world", "cut {cut}");
            assert_eq!(rest, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", "cut {cut}");
        }
    }

    #[test]
    fn chunked_body_at_every_split() {
        let wire = b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n006;e=1\r\n world\r\n0\r\nT: 1\r\n\r\nNEXT";
        for cut in 0..=wire.len() {
            let (body, rest) = read_split(wire, cut, 100).unwrap();
            assert_eq!(body, b"hello world", "cut {cut}");
            assert_eq!(rest, b"NEXT", "cut {cut}");
        }
    }

    #[test]
    fn chunked_body_byte_by_byte() {
        let wire = b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        let head = parse_request(wire).unwrap().unwrap();
        let mut reader = BodyReader::new(&head, 100).unwrap();
        let mut buf = wire[..head.len].to_vec();
        for b in &wire[head.len..] {
            assert!(matches!(reader.step(&mut buf).unwrap(), Step::More(_)));
            buf.push(*b);
        }
        match reader.step(&mut buf).unwrap() {
            Step::Done { body: Body::Owned(v), next } => {
                assert_eq!(v, b"abc");
                assert_eq!(next, buf.len());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn limits_and_framing_errors() {
        let big = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\n\r\n";
        assert_eq!(read_split(big, big.len(), 100).unwrap_err(), BodyError::TooLarge(100));
        let chunked = b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n65\r\n";
        let mut wire = chunked.to_vec();
        wire.extend_from_slice(&[b'a'; 0x65]);
        wire.extend_from_slice(b"\r\n0\r\n\r\n");
        for cut in [chunked.len(), wire.len()] {
            assert_eq!(read_split(&wire, cut, 100).unwrap_err(), BodyError::TooLarge(100));
        }
        let bad = b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        assert!(matches!(read_split(bad, bad.len(), 100), Err(BodyError::Malformed(_))));
        let none = b"GET /x HTTP/1.1\r\nHost: a\r\n\r\nNEXT";
        assert_eq!(read_split(none, none.len(), 100).unwrap(), (Vec::new(), b"NEXT".to_vec()));
    }
}
