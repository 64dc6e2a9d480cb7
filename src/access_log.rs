//! The access log: one line per request, written at `finish`, at `--log-level info` and up.
//!
//! A shard formats lines into its own buffer and hands full buffers (or, every tick, what it
//! has) to the log's one writer thread (`log::start_writer`) over its bounded channel. When the writer falls behind (a slow
//! disk) the channel is full, the lines are dropped and counted
//! (`smg_access_log_dropped_total`); a shard never blocks on the log. Keys, bodies and
//! query strings never appear.
//!
//! A line costs about what nginx's buffered access log does (issue 25). Measured with
//! callgrind (user-space instructions per proxied chat-1k request, one shard, 10,000
//! requests, on against `--log-level warn`): 1,650 before this shape, of which about 900
//! checked values byte by byte and 800 grew each handed-over buffer again from empty. Values
//! are now checked eight bytes a step, a buffer starts at its full size, and the line's time
//! comes from the request's monotonic `now` plus a wall-clock anchor taken each tick, not
//! from a clock read per line.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use smg_wire::num::put_dec;

/// A buffer this large is handed to the writer without waiting for the tick.
const FLUSH_AT: usize = 64 * 1024;
/// A buffer's capacity: room for the line that takes it past [`FLUSH_AT`] without growing
/// (a longer line, with a long path, grows it once).
const BUF_CAPACITY: usize = FLUSH_AT + 4 * 1024;

/// One request, as the access line tells it.
pub struct Entry<'a> {
    pub request_id: &'a [u8],
    pub tenant: &'a str,
    /// The priority class ("" without the scheduler).
    pub priority: &'a str,
    pub method: &'a str,
    pub path: &'a [u8],
    pub model: &'a str,
    pub worker: &'a str,
    pub status: u16,
    pub error_code: &'a str,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub duration_us: u64,
    /// Until the worker's response head arrived.
    pub upstream_us: Option<u64>,
    pub ttfb_us: Option<u64>,
    pub retries: u8,
}

pub struct AccessLog {
    tx: Option<flume::Sender<Vec<u8>>>,
    json: bool,
    buf: RefCell<Vec<u8>>,
    lines: Cell<u64>,
    /// The last second a line was stamped with, as "YYYY-MM-DDTHH:MM:SS": lines of one
    /// second share it, so only the milliseconds are formatted per line.
    second: Cell<(u64, [u8; 19])>,
    /// The wall clock at a monotonic instant, taken again at each flush (every tick): a
    /// line's time is the anchor plus the monotonic time since, so a step of the wall clock
    /// shows within a tick.
    anchor: Cell<(Instant, Duration)>,
}

impl AccessLog {
    /// `tx` None: the access log is off.
    pub fn new(tx: Option<flume::Sender<Vec<u8>>>, json: bool) -> Self {
        Self {
            tx,
            json,
            buf: RefCell::new(Vec::new()),
            lines: Cell::new(0),
            second: Cell::new((u64::MAX, [0; 19])),
            anchor: Cell::new(wall_anchor()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Appends the line of a request that ended at `now`; returns how many lines were
    /// dropped handing a full buffer over.
    pub fn write(&self, e: &Entry<'_>, now: Instant) -> u64 {
        if !self.enabled() {
            return 0;
        }
        {
            let mut b = self.buf.borrow_mut();
            if b.capacity() == 0 {
                b.reserve_exact(BUF_CAPACITY);
            }
            let (at, wall) = self.anchor.get();
            let now = wall + now.saturating_duration_since(at);
            let second = self.stamp(now.as_secs());
            let ts = Stamp { second: &second, millis: now.subsec_millis() };
            if self.json {
                json_line(&mut b, e, ts);
            } else {
                text_line(&mut b, e, ts);
            }
        }
        self.lines.set(self.lines.get() + 1);
        if self.buf.borrow().len() >= FLUSH_AT {
            self.flush()
        } else {
            0
        }
    }

    /// Hands the buffered lines to the writer; returns how many were dropped.
    pub fn flush(&self) -> u64 {
        let Some(tx) = &self.tx else { return 0 };
        self.anchor.set(wall_anchor());
        let lines = self.lines.replace(0);
        if lines == 0 {
            return 0;
        }
        let chunk = std::mem::take(&mut *self.buf.borrow_mut());
        match tx.try_send(chunk) {
            Ok(()) => 0,
            Err(flume::TrySendError::Full(mut back)) | Err(flume::TrySendError::Disconnected(mut back)) => {
                // Keep the allocation for the next lines.
                back.clear();
                *self.buf.borrow_mut() = back;
                lines
            }
        }
    }
}

impl AccessLog {
    /// "YYYY-MM-DDTHH:MM:SS" of `unix` seconds, formatted once per second.
    fn stamp(&self, unix: u64) -> [u8; 19] {
        let (cached, text) = self.second.get();
        if cached == unix {
            return text;
        }
        let mut out = Vec::with_capacity(19);
        let c = crate::civil::from_unix(unix as i64);
        let two = |out: &mut Vec<u8>, v: u32| {
            out.push(b'0' + (v / 10 % 10) as u8);
            out.push(b'0' + (v % 10) as u8);
        };
        let year = c.year.clamp(0, 9999) as u32;
        two(&mut out, year / 100);
        two(&mut out, year % 100);
        out.push(b'-');
        two(&mut out, c.month);
        out.push(b'-');
        two(&mut out, c.day);
        out.push(b'T');
        two(&mut out, c.hour);
        out.push(b':');
        two(&mut out, c.minute);
        out.push(b':');
        two(&mut out, c.second);
        let mut text = [0u8; 19];
        text.copy_from_slice(&out);
        self.second.set((unix, text));
        text
    }
}

/// The wall clock (since the Unix epoch) now, and the monotonic instant it was read at.
fn wall_anchor() -> (Instant, Duration) {
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (crate::clock::now(), wall)
}

/// A line's time: its second, formatted, and its milliseconds.
#[derive(Clone, Copy)]
struct Stamp<'a> {
    second: &'a [u8; 19],
    millis: u32,
}

fn timestamp(out: &mut Vec<u8>, ts: Stamp<'_>) {
    out.extend_from_slice(ts.second);
    let ms = ts.millis.min(999);
    out.extend_from_slice(&[b'.', b'0' + (ms / 100) as u8, b'0' + (ms / 10 % 10) as u8, b'0' + (ms % 10) as u8, b'Z']);
}

/// Whether every byte is printable ASCII (0x21..=0x7E), tested eight bytes a step.
fn all_graphic(v: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut words = v.chunks_exact(8);
    for c in &mut words {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        // Some byte below 0x21: the borrow test, exact for "any byte" (though not for which).
        let low = w.wrapping_sub(ONES * 0x21) & !w & HIGH;
        // Some byte at 0x7F or above: its own high bit, or the one adding 1 sets. A carry
        // out of a byte only starts at 0xFF, which has its high bit already.
        let high = (w | w.wrapping_add(ONES)) & HIGH;
        if low | high != 0 {
            return false;
        }
    }
    words.remainder().iter().all(u8::is_ascii_graphic)
}

/// A value for a text line: printable ASCII kept, anything else `?`, empty as `-`.
fn text_value(out: &mut Vec<u8>, v: &[u8]) {
    if v.is_empty() {
        out.push(b'-');
    } else if all_graphic(v) {
        // The usual case, copied whole.
        out.extend_from_slice(v);
    } else {
        out.extend(v.iter().map(|b| if b.is_ascii_graphic() { *b } else { b'?' }));
    }
}

fn text_line(out: &mut Vec<u8>, e: &Entry<'_>, ts: Stamp<'_>) {
    timestamp(out, ts);
    out.extend_from_slice(b" INFO  request request_id=");
    text_value(out, e.request_id);
    let fields: [(&[u8], &[u8]); 7] = [
        (b" tenant=", e.tenant.as_bytes()),
        (b" priority=", e.priority.as_bytes()),
        (b" method=", e.method.as_bytes()),
        (b" path=", e.path),
        (b" model=", e.model.as_bytes()),
        (b" worker=", e.worker.as_bytes()),
        (b" error_code=", e.error_code.as_bytes()),
    ];
    for (k, v) in fields {
        out.extend_from_slice(k);
        text_value(out, v);
    }
    for (k, v) in [(&b" status="[..], e.status as u64), (b" bytes_in=", e.bytes_in), (b" bytes_out=", e.bytes_out)] {
        out.extend_from_slice(k);
        put_dec(out, v);
    }
    out.extend_from_slice(b" duration_us=");
    put_dec(out, e.duration_us);
    for (k, v) in [(&b" upstream_us="[..], e.upstream_us), (b" ttfb_us=", e.ttfb_us)] {
        out.extend_from_slice(k);
        match v {
            Some(t) => put_dec(out, t),
            None => out.push(b'-'),
        }
    }
    out.extend_from_slice(b" retries=");
    put_dec(out, e.retries as u64);
    out.push(b'\n');
}

fn json_line(out: &mut Vec<u8>, e: &Entry<'_>, ts: Stamp<'_>) {
    out.extend_from_slice(b"{\"ts\":\"");
    timestamp(out, ts);
    out.extend_from_slice(b"\",\"level\":\"INFO\",\"msg\":\"request\",\"request_id\":");
    smg_wire::json::put_str(out, &String::from_utf8_lossy(e.request_id));
    for (k, v) in [
        ("tenant", e.tenant),
        ("priority", e.priority),
        ("method", e.method),
        ("path", &String::from_utf8_lossy(e.path)),
        ("model", e.model),
        ("worker", e.worker),
        ("error_code", e.error_code),
    ] {
        out.extend_from_slice(b",\"");
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(b"\":");
        smg_wire::json::put_str(out, v);
    }
    for (k, v) in [
        ("status", e.status as u64),
        ("bytes_in", e.bytes_in),
        ("bytes_out", e.bytes_out),
        ("duration_us", e.duration_us),
        ("retries", e.retries as u64),
    ] {
        out.extend_from_slice(b",\"");
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(b"\":");
        put_dec(out, v);
    }
    for (k, v) in [(&b",\"upstream_us\":"[..], e.upstream_us), (b",\"ttfb_us\":", e.ttfb_us)] {
        out.extend_from_slice(k);
        match v {
            Some(t) => put_dec(out, t),
            None => out.extend_from_slice(b"null"),
        }
    }
    out.extend_from_slice(b"}\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry<'static> {
        Entry {
            request_id: b"chatcmpl-1",
            tenant: "auth:red",
            priority: "interactive",
            method: "POST",
            path: b"/v1/chat/completions",
            model: "m x",
            worker: "http://127.0.0.1:1",
            status: 200,
            error_code: "",
            bytes_in: 10,
            bytes_out: 20,
            duration_us: 1234,
            upstream_us: Some(90),
            ttfb_us: Some(99),
            retries: 0,
        }
    }

    const SECOND: Stamp<'static> = Stamp { second: b"2026-12-04T10:59:07", millis: 42 };

    #[test]
    fn text_and_json_lines() {
        let mut t = Vec::new();
        text_line(&mut t, &entry(), SECOND);
        let t = String::from_utf8(t).unwrap();
        assert!(t.starts_with("2026-12-04T10:59:07.042Z INFO  request"), "{t}");
        assert!(t.ends_with(" INFO  request request_id=chatcmpl-1 tenant=auth:red priority=interactive method=POST path=/v1/chat/completions model=m?x worker=http://127.0.0.1:1 error_code=- status=200 bytes_in=10 bytes_out=20 duration_us=1234 upstream_us=90 ttfb_us=99 retries=0\n"), "{t}");
        assert_eq!(t.as_bytes()[4], b'-');
        let mut j = Vec::new();
        json_line(&mut j, &entry(), SECOND);
        let v: sonic_rs::Value = sonic_rs::from_slice(&j).unwrap();
        use sonic_rs::JsonValueTrait;
        assert_eq!(v["model"].as_str(), Some("m x"));
        assert_eq!(v["status"].as_u64(), Some(200));
        assert_eq!(v["ttfb_us"].as_u64(), Some(99));
        assert_eq!(v["priority"].as_str(), Some("interactive"));
    }

    #[test]
    fn a_second_is_formatted_once_and_as_the_calendar_says() {
        let log = AccessLog::new(None, false);
        // 2026-12-04T10:59:07Z, and a leap day with one-digit fields.
        assert_eq!(&log.stamp(1_796_381_947), b"2026-12-04T10:59:07");
        assert_eq!(&log.stamp(1_709_168_645), b"2024-02-29T01:04:05");
        assert_eq!(log.second.get().0, 1_709_168_645, "the last second is kept");
    }

    #[test]
    fn the_word_test_agrees_with_the_byte_test() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for len in 0..40 {
            for _ in 0..2000 {
                // Mostly printable, with the edges (0x20, 0x21, 0x7E, 0x7F, 0x80, 0xFF) and
                // anything else mixed in.
                let v: Vec<u8> = (0..len)
                    .map(|_| match next() % 16 {
                        0 => [0x20, 0x21, 0x7e, 0x7f, 0x80, 0xff, 0x00, 0x0a][(next() % 8) as usize],
                        1 => next() as u8,
                        _ => 0x21 + (next() % 94) as u8,
                    })
                    .collect();
                assert_eq!(all_graphic(&v), v.iter().all(u8::is_ascii_graphic), "{v:?}");
            }
        }
    }

    #[test]
    fn a_line_is_stamped_with_its_requests_end() {
        let (tx, rx) = flume::bounded(4);
        let log = AccessLog::new(Some(tx), false);
        let (at, _) = log.anchor.get();
        // 2026-12-04T10:59:07Z at the anchor: a request that ended 1.5 s later.
        log.anchor.set((at, Duration::from_secs(1_796_381_947)));
        log.write(&entry(), at + Duration::from_millis(1_500));
        assert_eq!(log.flush(), 0);
        let line = String::from_utf8(rx.recv().unwrap()).unwrap();
        assert!(line.starts_with("2026-12-04T10:59:08.500Z INFO  request"), "{line}");
        let (again, wall) = log.anchor.get();
        assert!(again >= at && wall > Duration::from_secs(1_700_000_000), "a flush takes the anchor again");
    }

    #[test]
    fn a_full_writer_drops_and_counts() {
        let (tx, rx) = flume::bounded(1);
        let log = AccessLog::new(Some(tx), false);
        let now = crate::clock::now();
        log.write(&entry(), now);
        assert_eq!(log.flush(), 0);
        log.write(&entry(), now);
        log.write(&entry(), now);
        assert_eq!(log.flush(), 2, "the writer holds one chunk already");
        assert_eq!(rx.len(), 1);
    }
}
