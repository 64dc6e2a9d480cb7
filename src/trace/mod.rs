//! Traces (`--enable-trace`): each request is a server span that continues the caller's W3C
//! `traceparent` (or starts a trace), and the worker gets a `traceparent` naming that span as
//! its parent. Spans are exported over OTLP/gRPC (`--otlp-traces-endpoint`) by one control
//! thread (`exporter.rs`).
//!
//! On a shard a span is two random ids at the head and one small record at `finish`, kept
//! in the shard's buffer; the ticker hands the buffer to the exporter over a bounded channel
//! and a full channel drops the batch (counted), so an unreachable collector costs the
//! request path nothing but the record. Off, it costs one `Option` check per request.

pub mod exporter;
mod otlp;

use std::cell::{Cell, RefCell};
use std::time::{Duration, SystemTime};

/// Spans a shard buffers before handing them over without waiting for the tick.
const FLUSH_AT: usize = 512;

/// A request's place in a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanIds {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The caller's span, from its `traceparent`.
    pub parent: Option<[u8; 8]>,
    pub flags: u8,
}

fn hex_into(out: &mut [u8], s: &[u8]) -> Option<()> {
    if s.len() != out.len() * 2 {
        return None;
    }
    for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
        let d = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        *o = d(pair[0])? << 4 | d(pair[1])?;
    }
    Some(())
}

/// Parses `traceparent` (W3C Trace Context, version 00): `00-<trace>-<parent>-<flags>`, lower
/// hex, ids not all zero. Anything else is ignored (a new trace starts).
pub fn parse_traceparent(v: &[u8]) -> Option<([u8; 16], [u8; 8], u8)> {
    let v = v.trim_ascii();
    if v.len() < 55 || &v[..3] != b"00-" || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let (mut trace, mut parent, mut flags) = ([0u8; 16], [0u8; 8], [0u8; 1]);
    hex_into(&mut trace, &v[3..35])?;
    hex_into(&mut parent, &v[36..52])?;
    hex_into(&mut flags, &v[53..55])?;
    if v.len() > 55 && v[55] != b'-' {
        return None;
    }
    (trace != [0; 16] && parent != [0; 8]).then_some((trace, parent, flags[0]))
}

impl SpanIds {
    /// This request's span: a child of the caller's, or the root of a new trace.
    pub fn new(traceparent: Option<&[u8]>, mut random: impl FnMut() -> u64) -> SpanIds {
        let span_id = random().max(1).to_be_bytes();
        match traceparent.and_then(parse_traceparent) {
            Some((trace_id, parent, flags)) => SpanIds { trace_id, span_id, parent: Some(parent), flags },
            None => {
                let mut trace_id = [0u8; 16];
                trace_id[..8].copy_from_slice(&random().to_be_bytes());
                trace_id[8..].copy_from_slice(&random().max(1).to_be_bytes());
                SpanIds { trace_id, span_id, parent: None, flags: 1 }
            }
        }
    }

    /// The `traceparent` the worker gets: this span as its parent.
    pub fn write_traceparent(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"00-");
        put_hex(out, &self.trace_id);
        out.push(b'-');
        put_hex(out, &self.span_id);
        out.push(b'-');
        put_hex(out, &[self.flags]);
    }
}

fn put_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(HEX[(b >> 4) as usize]);
        out.push(HEX[(b & 15) as usize]);
    }
}

/// One finished request's span.
#[derive(Debug, Clone)]
pub struct SpanRecord {
    pub ids: SpanIds,
    pub name: String,
    pub start: SystemTime,
    pub duration: Duration,
    pub status: u16,
    pub request_id: String,
    pub worker: String,
    pub model: String,
}

/// One shard's spans waiting for the exporter.
pub struct ShardTraces {
    tx: flume::Sender<Vec<SpanRecord>>,
    buf: RefCell<Vec<SpanRecord>>,
    dropped: Cell<u64>,
}

impl ShardTraces {
    pub fn new(tx: flume::Sender<Vec<SpanRecord>>) -> Self {
        Self { tx, buf: RefCell::new(Vec::new()), dropped: Cell::new(0) }
    }

    pub fn record(&self, s: SpanRecord) {
        let full = {
            let mut b = self.buf.borrow_mut();
            b.push(s);
            b.len() >= FLUSH_AT
        };
        if full {
            self.flush();
        }
    }

    /// Hands the buffered spans to the exporter; a full queue drops them (counted).
    pub fn flush(&self) {
        if self.buf.borrow().is_empty() {
            return;
        }
        let batch = std::mem::take(&mut *self.buf.borrow_mut());
        let n = batch.len() as u64;
        if self.tx.try_send(batch).is_err() {
            self.dropped.set(self.dropped.get() + n);
        }
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trip_and_rejects() {
        let tp = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (t, p, f) = parse_traceparent(tp).unwrap();
        assert_eq!(t[0], 0x4b);
        assert_eq!(p[7], 0xb7);
        assert_eq!(f, 1);
        let mut n = 0u64;
        let ids = SpanIds::new(Some(tp), || {
            n += 1;
            n
        });
        assert_eq!(ids.parent, Some(p));
        let mut out = Vec::new();
        ids.write_traceparent(&mut out);
        assert_eq!(&out, b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000001-01");
        for bad in [
            &b"00-00000000000000000000000000000000-00f067aa0ba902b7-01"[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"garbage",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
        let root = SpanIds::new(None, || 7);
        assert!(root.parent.is_none() && root.trace_id != [0; 16]);
    }
}
