//! Per-request records for `--report`: one fixed-size row per measured request, kept in preallocated chunks, written as CSV after the run.
//!
//! The hot path only copies a 32-byte struct into a chunk that already has room: no
//! formatting, no allocation per request (a new 64 Ki-row chunk every 65,536 requests, never a
//! copy of the rows already stored). Strings (`X-SMG-Error-Code` values) are interned per
//! thread into a small table and stored as an index.

use std::io::{self, Write};

use crate::load::client::{ClientError, Exchange};

/// Rows per chunk (2 MiB of records).
const CHUNK: usize = 64 * 1024;
/// Rows kept per thread at most (640 MiB); beyond that rows are counted as dropped.
const MAX_ROWS: usize = 20_000_000;
/// "No value" in the u32 µs columns.
pub const NONE: u32 = u32::MAX;

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Outcome {
    Ok = 0,
    /// A non-2xx status.
    Http = 1,
    /// 2xx, but the stream ended without `[DONE]` or carried an error event.
    Broken = 2,
    Connect = 3,
    Io = 4,
    Closed = 5,
    Malformed = 6,
    Timeout = 7,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Http => "http",
            Outcome::Broken => "broken",
            Outcome::Connect => "connect",
            Outcome::Io => "io",
            Outcome::Closed => "closed",
            Outcome::Malformed => "malformed",
            Outcome::Timeout => "timeout",
        }
    }

    fn of_error(e: &ClientError) -> Self {
        match e {
            ClientError::Connect(_) => Outcome::Connect,
            ClientError::Io(_) => Outcome::Io,
            ClientError::Closed => Outcome::Closed,
            ClientError::Malformed => Outcome::Malformed,
        }
    }
}

/// One measured request. Times are µs; `start_us` counts from the end of the warm-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub start_us: u64,
    pub latency_us: u32,
    /// Time to the first token event (streams only), else `NONE`.
    pub ttft_us: u32,
    /// Mean gap between token events (streams with two or more tokens), else `NONE`.
    pub itl_mean_us: u32,
    pub itl_max_us: u32,
    pub tokens: u32,
    /// HTTP status (0 for transport errors and timeouts).
    pub status: u16,
    pub outcome: Outcome,
    /// Index into `Records::codes` + 1 (0: no `X-SMG-Error-Code`).
    pub code: u8,
}

impl Record {
    pub fn ok(&self) -> bool {
        self.outcome == Outcome::Ok
    }
}

fn clamp32(v: u64) -> u32 {
    v.min(u64::from(NONE - 1)) as u32
}

/// One thread's records (and, after `merge`, a whole run's).
#[derive(Default)]
pub struct Records {
    pub enabled: bool,
    chunks: Vec<Vec<Record>>,
    /// Interned error codes (at most 255 distinct; later ones are stored as "other").
    pub codes: Vec<String>,
    pub dropped: u64,
}

// === impl Records ===

impl Records {
    pub fn new(enabled: bool) -> Self {
        let mut r = Self { enabled, ..Self::default() };
        if enabled {
            r.chunks.push(Vec::with_capacity(CHUNK));
        }
        r
    }

    pub fn len(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = &Record> {
        self.chunks.iter().flatten()
    }

    #[inline]
    fn push(&mut self, r: Record) {
        let full = self.chunks.last().is_none_or(|c| c.len() == c.capacity());
        if full {
            if self.chunks.len() * CHUNK >= MAX_ROWS {
                self.dropped += 1;
                return;
            }
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        if let Some(c) = self.chunks.last_mut() {
            c.push(r);
        }
    }

    fn intern(&mut self, code: &str) -> u8 {
        if let Some(i) = self.codes.iter().position(|c| c == code) {
            return i as u8 + 1;
        }
        if self.codes.len() >= 254 {
            return self.intern_slow("other");
        }
        self.codes.push(code.to_string());
        self.codes.len() as u8
    }

    fn intern_slow(&mut self, code: &str) -> u8 {
        match self.codes.iter().position(|c| c == code) {
            Some(i) => i as u8 + 1,
            None => {
                self.codes.push(code.to_string());
                self.codes.len() as u8
            }
        }
    }

    /// Records a response. `start_us` is the request's clock start after the warm-up.
    #[inline]
    pub fn response(&mut self, start_us: u64, ex: &Exchange, latency_us: u64, ttft_us: Option<u64>, itl_us: &[u64]) {
        if !self.enabled {
            return;
        }
        let (mut sum, mut max) = (0u64, 0u64);
        for &g in itl_us {
            sum += g;
            max = max.max(g);
        }
        let outcome = if !(200..300).contains(&ex.status) {
            Outcome::Http
        } else if ex.stream_broken {
            Outcome::Broken
        } else {
            Outcome::Ok
        };
        let code = match &ex.error_code {
            Some(c) => self.intern(c),
            None => 0,
        };
        let n = itl_us.len() as u64;
        self.push(Record {
            start_us,
            latency_us: clamp32(latency_us),
            ttft_us: ttft_us.map_or(NONE, clamp32),
            itl_mean_us: sum.checked_div(n).map_or(NONE, clamp32),
            itl_max_us: if n > 0 { clamp32(max) } else { NONE },
            tokens: ex.token_events.max(ex.usage.map_or(0, |u| u.completion_tokens as u32)),
            status: ex.status,
            outcome,
            code,
        });
    }

    /// Records a transport error (`None`: a timeout).
    #[inline]
    pub fn failure(&mut self, start_us: u64, e: Option<&ClientError>, latency_us: u64) {
        if !self.enabled {
            return;
        }
        self.push(Record {
            start_us,
            latency_us: clamp32(latency_us),
            ttft_us: NONE,
            itl_mean_us: NONE,
            itl_max_us: NONE,
            tokens: 0,
            status: 0,
            outcome: e.map_or(Outcome::Timeout, Outcome::of_error),
            code: 0,
        });
    }

    /// Appends another thread's records (re-interning its codes), so a run has one set.
    pub fn merge(&mut self, other: Records) {
        self.enabled |= other.enabled;
        self.dropped += other.dropped;
        let map: Vec<u8> = other.codes.iter().map(|c| self.intern(c)).collect();
        for mut chunk in other.chunks {
            for r in &mut chunk {
                if r.code > 0 {
                    r.code = map[r.code as usize - 1];
                }
            }
            self.chunks.push(chunk);
        }
    }

    /// All rows in start order (after the run; threads interleave in time).
    pub fn sorted(&self) -> Vec<Record> {
        let mut v: Vec<Record> = self.iter().copied().collect();
        v.sort_by_key(|r| r.start_us);
        v
    }

    pub fn code_name(&self, r: &Record) -> &str {
        match r.code {
            0 => "",
            i => self.codes.get(i as usize - 1).map_or("", String::as_str),
        }
    }

    /// Writes the rows as CSV (times in µs; empty cells where a value does not apply).
    pub fn write_csv(&self, target: &str, rate: Option<f64>, out: &mut impl Write) -> io::Result<()> {
        let rate = rate.map(|r| format!("{r}")).unwrap_or_default();
        let opt = |v: u32| if v == NONE { String::new() } else { v.to_string() };
        for r in self.sorted() {
            writeln!(
                out,
                "{target},{rate},{},{},{},{},{},{},{},{},{}",
                r.start_us,
                r.latency_us,
                opt(r.ttft_us),
                opt(r.itl_mean_us),
                opt(r.itl_max_us),
                r.tokens,
                r.status,
                r.outcome.name(),
                self.code_name(&r)
            )?;
        }
        Ok(())
    }
}

pub const CSV_HEADER: &str =
    "target,offered_rps,start_us,latency_us,ttft_us,itl_mean_us,itl_max_us,tokens,status,outcome,error_code";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_chunks_merge_and_csv() {
        let mut a = Records::new(true);
        let ok = Exchange { status: 200, token_events: 3, ..Exchange::default() };
        for i in 0..(CHUNK as u64 + 10) {
            a.response(i * 2, &ok, 100, Some(40), &[10, 30]);
        }
        assert_eq!(a.len(), CHUNK + 10);
        assert_eq!(a.chunks.len(), 2);
        let mut b = Records::new(true);
        let err = Exchange { status: 503, error_code: Some("no_available_workers".into()), ..Exchange::default() };
        b.response(1, &err, 5, None, &[]);
        b.failure(3, None, 7);
        a.merge(b);
        let rows = a.sorted();
        assert_eq!(rows[1].status, 503);
        assert_eq!(a.code_name(&rows[1]), "no_available_workers");
        assert_eq!(rows[3].outcome, Outcome::Timeout);
        assert_eq!(rows[0].itl_mean_us, 20);
        assert_eq!(rows[0].itl_max_us, 30);
        let mut csv = Vec::new();
        let small = {
            let mut s = Records::new(true);
            s.response(0, &ok, 100, Some(40), &[10, 30]);
            s.response(5, &err, 5, None, &[]);
            s
        };
        small.write_csv("direct", Some(100.0), &mut csv).unwrap();
        assert_eq!(
            String::from_utf8(csv).unwrap(),
            "direct,100,0,100,40,20,30,3,200,ok,\ndirect,100,5,5,,,,0,503,http,no_available_workers\n"
        );
        let off = {
            let mut r = Records::new(false);
            r.response(0, &ok, 1, None, &[]);
            r
        };
        assert!(off.is_empty());
    }
}
