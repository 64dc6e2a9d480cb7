//! One shard's counts and histograms, written at `finish`, copied for a scrape.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

/// SMG's default `--prometheus-duration-buckets`, in seconds.
pub const DEFAULT_BUCKETS: [f64; 29] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0,
    240.0, 300.0, 480.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0, 5400.0, 7200.0,
];

/// A Prometheus histogram: counts per bucket (not cumulative), count and sum.
#[derive(Debug, Clone, Default)]
pub struct Hist {
    pub buckets: Vec<u64>,
    pub count: u64,
    pub sum_secs: f64,
}

impl Hist {
    fn observe(&mut self, bounds: &[f64], secs: f64) {
        if self.buckets.len() != bounds.len() {
            self.buckets.resize(bounds.len(), 0);
        }
        let i = bounds.partition_point(|b| *b < secs);
        if i < bounds.len() {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum_secs += secs;
    }

    fn merge(&mut self, o: &Hist) {
        if self.buckets.len() < o.buckets.len() {
            self.buckets.resize(o.buckets.len(), 0);
        }
        for (a, b) in self.buckets.iter_mut().zip(&o.buckets) {
            *a += b;
        }
        self.count += o.count;
        self.sum_secs += o.sum_secs;
    }
}

/// Router figures of one (model, endpoint).
#[derive(Debug, Clone, Default)]
pub struct RouterStats {
    /// By `streaming` = false, true.
    pub requests: [u64; 2],
    /// 2xx only, start → response head (SMG's).
    pub duration: Hist,
    /// Streaming requests: start → first bytes of the body at the client.
    pub ttft: Hist,
    pub errors: HashMap<&'static str, u64>,
    pub selections: u64,
}

/// Everything one shard counted; merged at scrape.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    /// (method, path) → requests and duration.
    pub http: HashMap<(&'static str, &'static str), (u64, Hist)>,
    /// (path, status, error code).
    pub responses: HashMap<(&'static str, u16, &'static str), u64>,
    /// allowed, rejected.
    pub rate_limit: [u64; 2],
    /// model → endpoint → figures.
    pub router: HashMap<Box<str>, HashMap<&'static str, RouterStats>>,
    /// (status, error code) of the final upstream attempt.
    pub upstream: HashMap<(u16, &'static str), u64>,
    /// error_type → count.
    pub worker_errors: HashMap<&'static str, u64>,
    /// endpoint → retries.
    pub retries: HashMap<&'static str, u64>,
    pub access_log_dropped: u64,
}

impl Counts {
    pub fn merge(&mut self, o: &Counts) {
        for (k, (n, h)) in &o.http {
            let e = self.http.entry(*k).or_default();
            e.0 += n;
            e.1.merge(h);
        }
        for (k, n) in &o.responses {
            *self.responses.entry(*k).or_default() += n;
        }
        self.rate_limit[0] += o.rate_limit[0];
        self.rate_limit[1] += o.rate_limit[1];
        for (model, eps) in &o.router {
            let mine = self.router.entry(model.clone()).or_default();
            for (ep, s) in eps {
                let m = mine.entry(ep).or_default();
                m.requests[0] += s.requests[0];
                m.requests[1] += s.requests[1];
                m.duration.merge(&s.duration);
                m.ttft.merge(&s.ttft);
                m.selections += s.selections;
                for (t, n) in &s.errors {
                    *m.errors.entry(t).or_default() += n;
                }
            }
        }
        for (k, n) in &o.upstream {
            *self.upstream.entry(*k).or_default() += n;
        }
        for (k, n) in &o.worker_errors {
            *self.worker_errors.entry(k).or_default() += n;
        }
        for (k, n) in &o.retries {
            *self.retries.entry(k).or_default() += n;
        }
        self.access_log_dropped += o.access_log_dropped;
    }
}

/// One finished request, as `finish` tells it.
pub struct Finished<'a> {
    pub method: &'static str,
    pub path: &'static str,
    pub status: u16,
    pub error_code: &'static str,
    /// Start → response head at the client.
    pub to_head: Duration,
    /// Routed requests: model, endpoint label, streaming, final upstream status and error
    /// code, time to first byte, retries.
    pub routed: Option<Routed<'a>>,
    /// Admission decision, when the limit is on: Some(true) admitted, Some(false) shed.
    pub admitted: Option<bool>,
    /// The worker side failed (transport or 5xx): SMG's `error_type` of it.
    pub worker_error: Option<&'static str>,
}

pub struct Routed<'a> {
    pub model: &'a str,
    pub endpoint: &'static str,
    pub streaming: bool,
    pub first_byte: Option<Duration>,
    pub retries: u8,
}

/// SMG's `error_type` of a status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 => "validation_error",
        404 => "no_workers",
        408 | 504 => "timeout",
        500..=599 => "backend_error",
        _ => "internal_error",
    }
}

/// One shard's metrics.
pub struct ShardMetrics {
    bounds: Rc<[f64]>,
    counts: std::cell::RefCell<Counts>,
}

impl ShardMetrics {
    pub fn new(bounds: &[f64]) -> Self {
        Self { bounds: Rc::from(bounds), counts: Default::default() }
    }

    pub fn record(&self, f: &Finished<'_>) {
        let mut c = self.counts.borrow_mut();
        let secs = f.to_head.as_secs_f64();
        let e = c.http.entry((f.method, f.path)).or_default();
        e.0 += 1;
        e.1.observe(&self.bounds, secs);
        *c.responses.entry((f.path, f.status, f.error_code)).or_default() += 1;
        if let Some(a) = f.admitted {
            c.rate_limit[usize::from(!a)] += 1;
        }
        if let Some(t) = f.worker_error {
            *c.worker_errors.entry(t).or_default() += 1;
        }
        let Some(r) = &f.routed else { return };
        *c.upstream.entry((f.status, f.error_code)).or_default() += 1;
        if r.retries > 0 {
            *c.retries.entry(r.endpoint).or_default() += r.retries as u64;
        }
        let by_model = match c.router.get_mut(r.model) {
            Some(m) => m,
            None => c.router.entry(Box::from(r.model)).or_default(),
        };
        let s = by_model.entry(r.endpoint).or_default();
        s.requests[usize::from(r.streaming)] += 1;
        s.selections += 1;
        if (200..300).contains(&f.status) {
            s.duration.observe(&self.bounds, secs);
        } else if !matches!(f.status, 408 | 429 | 500 | 502 | 503 | 504) {
            // SMG's router counts only errors a retry would not have fixed.
            *s.errors.entry(error_type(f.status)).or_default() += 1;
        }
        if let (true, Some(t)) = (r.streaming, r.first_byte) {
            s.ttft.observe(&self.bounds, t.as_secs_f64());
        }
    }

    pub fn access_log_dropped(&self) {
        self.counts.borrow_mut().access_log_dropped += 1;
    }

    /// A copy for a scrape.
    pub fn snapshot(&self) -> Counts {
        self.counts.borrow().clone()
    }
}

/// What a shard answers a scrape with: its counts and its gauges.
#[derive(Debug, Clone, Default)]
pub struct ShardReport {
    pub counts: Counts,
    /// Requests between head and the end of their response.
    pub inflight: usize,
    /// This shard's in-flight requests per worker id.
    pub worker_loads: Vec<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_prometheus_le() {
        let mut h = Hist::default();
        for s in [0.0005, 0.001, 0.002, 7200.0, 9000.0] {
            h.observe(&DEFAULT_BUCKETS, s);
        }
        assert_eq!(h.buckets[0], 2, "le=0.001 holds 0.0005 and 0.001 itself");
        assert_eq!(h.buckets[1], 1);
        assert_eq!(h.buckets[28], 1);
        assert_eq!(h.count, 5, "9000 s is counted only in +Inf");
    }
}
