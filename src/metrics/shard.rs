//! One shard's counts and histograms, written at `finish`, copied for a scrape.

use std::rc::Rc;
use std::time::Duration;

/// A handful of entries keyed by labels the gateway made itself (`&'static str`s, small
/// numbers, the workers' model names), looked up on every request. A linear scan over a few
/// entries beats hashing them: with std's HashMap the five lookups per request cost
/// ~0.35 µs, scanning costs a fraction.
#[derive(Debug, Clone)]
pub struct Small<K, V>(Vec<(K, V)>);

impl<K, V> Default for Small<K, V> {
    fn default() -> Self {
        Small(Vec::new())
    }
}

impl<K, V: Default> Small<K, V> {
    /// The entry whose key `is` picks, made with `make` on first use.
    fn find_or(&mut self, is: impl Fn(&K) -> bool, make: impl FnOnce() -> K) -> &mut V {
        let i = match self.0.iter().position(|(x, _)| is(x)) {
            Some(i) => i,
            None => {
                self.0.push((make(), V::default()));
                self.0.len() - 1
            }
        };
        &mut self.0[i].1
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<K: Key, V: Default> Small<K, V> {
    pub fn at(&mut self, k: K) -> &mut V {
        self.find_or(|x| x.same(&k), || k)
    }
}

/// Key equality that first asks whether two labels are the same static string (they
/// nearly always are: labels come from the gateway's tables), so the common case compares
/// two pointers instead of calling `memcmp` (which profiled at ~45 ns a call on this host).
pub trait Key: Copy {
    fn same(&self, o: &Self) -> bool;
}

#[inline]
fn same_label(a: Label, b: Label) -> bool {
    a.len() == b.len() && (std::ptr::eq(a.as_ptr(), b.as_ptr()) || a == b)
}

impl Key for Label {
    fn same(&self, o: &Self) -> bool {
        same_label(self, o)
    }
}

impl Key for (Label, Label) {
    fn same(&self, o: &Self) -> bool {
        same_label(self.1, o.1) && same_label(self.0, o.0)
    }
}

impl Key for (Label, u16, Label) {
    fn same(&self, o: &Self) -> bool {
        self.1 == o.1 && same_label(self.0, o.0) && same_label(self.2, o.2)
    }
}

impl Key for (u16, Label) {
    fn same(&self, o: &Self) -> bool {
        self.0 == o.0 && same_label(self.1, o.1)
    }
}

impl<V: Default> Small<Box<str>, V> {
    pub fn at_name(&mut self, k: &str) -> &mut V {
        self.find_or(|x| &**x == k, || Box::from(k))
    }
}

/// SMG's default `--prometheus-duration-buckets`, in seconds.
pub const DEFAULT_BUCKETS: [f64; 29] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0,
    240.0, 300.0, 480.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0, 5400.0, 7200.0,
];

/// A label value the gateway chose (a route template, a code, an endpoint name).
pub type Label = &'static str;

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
    pub errors: Small<Label, u64>,
}

/// Everything one shard counted; merged at scrape.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    /// (method, path) → requests and duration.
    pub http: Small<(Label, Label), (u64, Hist)>,
    /// (path, status, error code).
    pub responses: Small<(Label, u16, Label), u64>,
    /// allowed, rejected.
    pub rate_limit: [u64; 2],
    /// model → endpoint → figures.
    pub router: Small<Box<str>, Small<Label, RouterStats>>,
    /// (status, error code) of the final upstream attempt.
    pub upstream: Small<(u16, Label), u64>,
    /// error_type → count.
    pub worker_errors: Small<Label, u64>,
    /// endpoint → retries.
    pub retries: Small<Label, u64>,
    /// endpoint → requests that failed with every attempt used.
    pub retries_exhausted: Small<Label, u64>,
    /// (priority class, result) → requests, with the scheduler on.
    pub scheduler: Small<(Label, Label), u64>,
    /// (path, reason) → requests.
    pub body_path: Small<(Label, Label), u64>,
    /// worker URL → KV prediction tokens: [predicted cached, of those the engine confirmed,
    /// the engine's cached].
    pub kv_precision: Small<Box<str>, [u64; 3]>,
    pub access_log_dropped: u64,
}

impl Counts {
    pub fn merge(&mut self, o: &Counts) {
        for (k, (n, h)) in o.http.iter() {
            let e = self.http.at(*k);
            e.0 += n;
            e.1.merge(h);
        }
        for (k, n) in o.responses.iter() {
            *self.responses.at(*k) += n;
        }
        self.rate_limit[0] += o.rate_limit[0];
        self.rate_limit[1] += o.rate_limit[1];
        for (model, eps) in o.router.iter() {
            let mine = self.router.at_name(model);
            for (ep, s) in eps.iter() {
                let m = mine.at(*ep);
                m.requests[0] += s.requests[0];
                m.requests[1] += s.requests[1];
                m.duration.merge(&s.duration);
                m.ttft.merge(&s.ttft);
                for (t, n) in s.errors.iter() {
                    *m.errors.at(*t) += n;
                }
            }
        }
        for (k, n) in o.upstream.iter() {
            *self.upstream.at(*k) += n;
        }
        for (k, n) in o.worker_errors.iter() {
            *self.worker_errors.at(*k) += n;
        }
        for (k, n) in o.retries.iter() {
            *self.retries.at(*k) += n;
        }
        for (k, n) in o.retries_exhausted.iter() {
            *self.retries_exhausted.at(*k) += n;
        }
        for (k, n) in o.scheduler.iter() {
            *self.scheduler.at(*k) += n;
        }
        for (k, n) in o.body_path.iter() {
            *self.body_path.at(*k) += n;
        }
        for (w, n) in o.kv_precision.iter() {
            let m = self.kv_precision.at_name(w);
            for i in 0..3 {
                m[i] += n[i];
            }
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
    /// The priority class, with the scheduler on.
    pub class: Option<&'static str>,
    /// Streamed or buffered, and why (the routes whose bodies may stream).
    pub body_path: Option<(&'static str, &'static str)>,
    /// A request routed on its worker's KV-cache events whose engine reported cached
    /// tokens: (worker URL, tokens predicted cached, tokens the engine says were cached).
    pub kv_precision: Option<(&'a str, u64, u64)>,
}

pub struct Routed<'a> {
    pub model: &'a str,
    pub endpoint: &'static str,
    pub streaming: bool,
    pub first_byte: Option<Duration>,
    pub retries: u8,
    /// It failed with every attempt `--retry-max-retries` allows used.
    pub retries_exhausted: bool,
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
        let e = c.http.at((f.method, f.path));
        e.0 += 1;
        e.1.observe(&self.bounds, secs);
        *c.responses.at((f.path, f.status, f.error_code)) += 1;
        if let Some(a) = f.admitted {
            c.rate_limit[usize::from(!a)] += 1;
        }
        if let Some(t) = f.worker_error {
            *c.worker_errors.at(t) += 1;
        }
        if let Some(class) = f.class {
            let result = match f.error_code {
                "scheduler_queue_full" => "rejected",
                "scheduler_queue_timeout" => "timeout",
                "scheduler_preempted" => "preempted",
                _ => "admitted",
            };
            *c.scheduler.at((class, result)) += 1;
        }
        if let Some(k) = f.body_path {
            *c.body_path.at(k) += 1;
        }
        if let Some((worker, predicted, engine)) = f.kv_precision {
            let m = c.kv_precision.at_name(worker);
            m[0] += predicted;
            m[1] += predicted.min(engine);
            m[2] += engine;
        }
        let Some(r) = &f.routed else { return };
        *c.upstream.at((f.status, f.error_code)) += 1;
        if r.retries > 0 {
            *c.retries.at(r.endpoint) += r.retries as u64;
        }
        if r.retries_exhausted {
            *c.retries_exhausted.at(r.endpoint) += 1;
        }
        let s = c.router.at_name(r.model).at(r.endpoint);
        s.requests[usize::from(r.streaming)] += 1;
        if (200..300).contains(&f.status) {
            s.duration.observe(&self.bounds, secs);
        } else if !matches!(f.status, 408 | 429 | 500 | 502 | 503 | 504) {
            // SMG's router counts only errors a retry would not have fixed.
            *s.errors.at(error_type(f.status)) += 1;
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
    pub shard: usize,
    /// Ticks this shard has run.
    pub ticks: u64,
    pub counts: Counts,
    /// Requests between head and the end of their response.
    pub inflight: usize,
    /// This shard's in-flight requests per worker id.
    pub worker_loads: Vec<usize>,
    /// This shard's routing state: tree sizes, cache-aware hits.
    pub router: crate::routing::RouterStats,
    /// Admission: (requests queued, permits free), when the limit is on.
    pub admission: Option<(usize, usize)>,
    /// Spans dropped because the trace exporter fell behind (tracing on).
    pub spans_dropped: u64,
    /// Tenant budgets, when on.
    pub budget: Option<crate::budget::shard::BudgetCounts>,
    /// The priority scheduler per class (lowest first): queued, in flight, promoted.
    pub scheduler: Option<[(usize, usize, u64); 4]>,
    /// The KV-cache events index: (worker, blocks it holds, its events flow).
    pub kv: Vec<(crate::worker_id::WorkerId, usize, bool)>,
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
