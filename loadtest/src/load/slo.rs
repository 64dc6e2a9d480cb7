//! Service-level objectives (`--slo ttft=500ms,itl=50ms,e2e=10s`) and goodput: the requests that met every one.
//!
//! A request is good when it succeeded (2xx, stream complete) and each limit that applies to it
//! holds: `ttft` against its first token event, `itl` against its mean gap between token events
//! (time per output token, as vLLM's benchmark defines goodput; one stall inside a long stream
//! does not fail it), `e2e` against its whole latency. A non-streaming response has no TTFT or
//! ITL, so only `e2e` applies to it.

use serde::Serialize;

use crate::load::records::{Record, Records, NONE};
use crate::rt;

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub itl_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
}

/// Good requests of one run.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Goodput {
    pub good: u64,
    pub total: u64,
    /// good / total (1 when nothing was measured).
    pub fraction: f64,
    /// good requests per second of the measured window.
    pub rps: f64,
}

// === impl Slo ===

impl Slo {
    pub fn parse(spec: &str) -> Result<Slo, String> {
        let mut slo = Slo::default();
        for part in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| format!("--slo: expected key=duration, got {part:?}"))?;
            let ms = rt::parse_duration(v.trim())?.as_secs_f64() * 1000.0;
            match k.trim() {
                "ttft" => slo.ttft_ms = Some(ms),
                "itl" | "tpot" => slo.itl_ms = Some(ms),
                "e2e" | "latency" => slo.e2e_ms = Some(ms),
                other => return Err(format!("--slo: unknown key {other:?} (ttft, itl, e2e)")),
            }
        }
        Ok(slo)
    }

    /// The limit for a metric name used in the report ("ttft", "itl", "e2e").
    pub fn limit(&self, metric: &str) -> Option<f64> {
        match metric {
            "ttft" => self.ttft_ms,
            "itl" => self.itl_ms,
            _ => self.e2e_ms,
        }
    }

    pub fn meets(&self, r: &Record) -> bool {
        let within = |us: u32, ms: Option<f64>| us == NONE || ms.is_none_or(|m| f64::from(us) <= m * 1000.0);
        r.ok()
            && within(r.ttft_us, self.ttft_ms)
            && within(r.itl_mean_us, self.itl_ms)
            && within(r.latency_us, self.e2e_ms)
    }

    pub fn goodput(&self, records: &Records, secs: f64) -> Goodput {
        let (mut good, mut total) = (0u64, 0u64);
        for r in records.iter() {
            total += 1;
            good += u64::from(self.meets(r));
        }
        Goodput {
            good,
            total,
            fraction: if total > 0 { good as f64 / total as f64 } else { 1.0 },
            rps: if secs > 0.0 { good as f64 / secs } else { 0.0 },
        }
    }

    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (k, v) in [("ttft", self.ttft_ms), ("itl", self.itl_ms), ("e2e", self.e2e_ms)] {
            if let Some(ms) = v {
                parts.push(format!("{k}<={ms}ms"));
            }
        }
        if parts.is_empty() {
            "none (every successful request is good)".into()
        } else {
            parts.join(" ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::client::Exchange;

    #[test]
    fn parse_and_meet() {
        let s = Slo::parse("ttft=500ms,itl=50ms,e2e=10s").unwrap();
        assert_eq!(s, Slo { ttft_ms: Some(500.0), itl_ms: Some(50.0), e2e_ms: Some(10_000.0) });
        assert!(Slo::parse("foo=1s").is_err());
        assert!(Slo::parse("ttft").is_err());
        let mut recs = Records::new(true);
        let ok = Exchange { status: 200, ..Exchange::default() };
        recs.response(0, &ok, 400_000, Some(100_000), &[40_000, 50_000]); // good
        recs.response(0, &ok, 400_000, Some(600_000), &[]); // ttft too late
        recs.response(0, &ok, 400_000, Some(100_000), &[70_000, 60_000]); // itl mean 65 ms
        recs.response(0, &ok, 11_000_000, None, &[]); // e2e
        recs.response(0, &ok, 9_000_000, None, &[]); // non-streaming, good
        let bad = Exchange { status: 500, ..Exchange::default() };
        recs.response(0, &bad, 1, None, &[]);
        let g = s.goodput(&recs, 2.0);
        assert_eq!((g.good, g.total), (2, 6));
        assert_eq!(g.rps, 1.0);
        assert!(s.describe().contains("ttft<=500ms"));
    }
}
