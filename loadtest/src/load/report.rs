//! Per-thread measurements (histograms, counters) and the merged report: human table and JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::load::chain::ChainCounts;
use crate::load::client::{ClientError, Exchange};

/// Histograms hold µs from 1 µs to 1 hour at 3 significant digits (0.1% error).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3)
        .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant digits is valid")))
}

/// What one load thread measured. Merged across threads at the end.
pub struct Stats {
    pub latency: Histogram<u64>,
    pub ttft: Histogram<u64>,
    pub itl: Histogram<u64>,
    pub ok: u64,
    pub by_status: BTreeMap<u16, u64>,
    pub by_error_code: BTreeMap<String, u64>,
    pub transport: BTreeMap<&'static str, u64>,
    pub broken_streams: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub with_usage: u64,
    pub connects: u64,
    /// Time the load threads were runnable but waited for a CPU, in µs (their schedstat).
    pub cpu_wait_us: u64,
    /// A chained scenario's turns (load/chain.rs); zero for the others.
    pub chain: ChainCounts,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            latency: new_histogram(),
            ttft: new_histogram(),
            itl: new_histogram(),
            ok: 0,
            by_status: BTreeMap::new(),
            by_error_code: BTreeMap::new(),
            transport: BTreeMap::new(),
            broken_streams: 0,
            prompt_tokens: 0,
            cached_tokens: 0,
            completion_tokens: 0,
            with_usage: 0,
            connects: 0,
            cpu_wait_us: 0,
            chain: ChainCounts::default(),
        }
    }
}

// === impl Stats ===

impl Stats {
    /// Records a response whose clock started at `origin_us_ago` before completion.
    pub fn record(&mut self, ex: &Exchange, latency_us: u64, ttft_us: Option<u64>, itl_us: &[u64]) {
        let _ = self.latency.record(latency_us.max(1));
        *self.by_status.entry(ex.status).or_default() += 1;
        if let Some(code) = &ex.error_code {
            *self.by_error_code.entry(code.clone()).or_default() += 1;
        }
        if ex.stream_broken {
            self.broken_streams += 1;
        }
        if (200..300).contains(&ex.status) && !ex.stream_broken {
            self.ok += 1;
        }
        if let Some(t) = ttft_us {
            let _ = self.ttft.record(t.max(1));
        }
        for &g in itl_us {
            let _ = self.itl.record(g.max(1));
        }
        if let Some(u) = ex.usage {
            self.with_usage += 1;
            self.prompt_tokens += u.prompt_tokens;
            self.cached_tokens += u.cached_tokens;
            self.completion_tokens += u.completion_tokens;
        }
    }

    pub fn record_error(&mut self, e: &ClientError, latency_us: u64) {
        let _ = self.latency.record(latency_us.max(1));
        *self.transport.entry(e.kind()).or_default() += 1;
    }

    pub fn record_timeout(&mut self, latency_us: u64) {
        let _ = self.latency.record(latency_us.max(1));
        *self.transport.entry("timeout").or_default() += 1;
    }

    /// Requests that completed in any way.
    pub fn total(&self) -> u64 {
        self.by_status.values().sum::<u64>() + self.transport.values().sum::<u64>()
    }

    pub fn merge(&mut self, other: &Stats) {
        let _ = self.latency.add(&other.latency);
        let _ = self.ttft.add(&other.ttft);
        let _ = self.itl.add(&other.itl);
        self.ok += other.ok;
        for (k, v) in &other.by_status {
            *self.by_status.entry(*k).or_default() += v;
        }
        for (k, v) in &other.by_error_code {
            *self.by_error_code.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.transport {
            *self.transport.entry(k).or_default() += v;
        }
        self.broken_streams += other.broken_streams;
        self.prompt_tokens += other.prompt_tokens;
        self.cached_tokens += other.cached_tokens;
        self.completion_tokens += other.completion_tokens;
        self.with_usage += other.with_usage;
        self.connects += other.connects;
        self.cpu_wait_us += other.cpu_wait_us;
        self.chain.first_turns += other.chain.first_turns;
        self.chain.chained_turns += other.chain.chained_turns;
        self.chain.cut_short += other.chain.cut_short;
    }
}

/// Percentiles of one histogram, in milliseconds.
#[derive(Serialize, Clone, Debug, Default)]
pub struct Percentiles {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(h: &Histogram<u64>) -> Option<Self> {
        if h.is_empty() {
            return None;
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Some(Self {
            count: h.len(),
            mean: h.mean() / 1000.0,
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        })
    }
}

/// CPU used by a process tree during the measured window.
#[derive(Serialize, Clone, Debug)]
pub struct CpuUse {
    pub pid: u32,
    pub cpu_ms: f64,
    pub cpu_us_per_request: f64,
    /// The same split into user and system (kernel) time.
    pub user_us_per_request: f64,
    pub system_us_per_request: f64,
    /// Share of one core over the window, in percent.
    pub cpu_percent: f64,
}

/// Everything a run reports.
#[derive(Serialize, Clone, Debug)]
pub struct Report {
    pub scenario: String,
    pub url: String,
    pub mode: String,
    pub threads: usize,
    pub duration_s: f64,
    pub requests: u64,
    pub ok: u64,
    pub errors: u64,
    pub rps: f64,
    pub latency_ms: Option<Percentiles>,
    pub ttft_ms: Option<Percentiles>,
    pub itl_ms: Option<Percentiles>,
    pub status: BTreeMap<String, u64>,
    pub error_codes: BTreeMap<String, u64>,
    pub transport_errors: BTreeMap<String, u64>,
    pub broken_streams: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// cached_tokens / prompt_tokens over responses that reported usage.
    pub cache_ratio: Option<f64>,
    pub completion_tokens: u64,
    pub connections_opened: u64,
    /// How long the load threads were ready to run but waited for a CPU another process (or
    /// the host) held, summed over threads: a send due in that time went out late through no
    /// fault of the generator's timer. A figure near the run's length means the generator
    /// shared its cores and its latencies and send times say so. None where the kernel keeps
    /// no schedstat.
    pub sender_cpu_wait_ms: Option<f64>,
    pub target_cpu: Vec<CpuUse>,
    /// A chained scenario's turns: first, chained by `previous_response_id`, and the
    /// conversations cut short (absent for other scenarios).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain: Option<ChainCounts>,
}

// === impl Report ===

impl Report {
    pub fn build(
        scenario: &str,
        url: &str,
        mode: &str,
        threads: usize,
        duration_s: f64,
        s: &Stats,
        target_cpu: Vec<CpuUse>,
    ) -> Self {
        let requests = s.total();
        Self {
            scenario: scenario.into(),
            url: url.into(),
            mode: mode.into(),
            threads,
            duration_s,
            requests,
            ok: s.ok,
            errors: requests - s.ok,
            rps: if duration_s > 0.0 { requests as f64 / duration_s } else { 0.0 },
            latency_ms: Percentiles::of(&s.latency),
            ttft_ms: Percentiles::of(&s.ttft),
            itl_ms: Percentiles::of(&s.itl),
            status: s.by_status.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            error_codes: s.by_error_code.clone(),
            transport_errors: s.transport.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            broken_streams: s.broken_streams,
            prompt_tokens: s.prompt_tokens,
            cached_tokens: s.cached_tokens,
            cache_ratio: (s.prompt_tokens > 0).then(|| s.cached_tokens as f64 / s.prompt_tokens as f64),
            completion_tokens: s.completion_tokens,
            connections_opened: s.connects,
            sender_cpu_wait_ms: crate::load::cpu::schedstat_available().then(|| s.cpu_wait_us as f64 / 1000.0),
            target_cpu,
            chain: (s.chain != ChainCounts::default()).then_some(s.chain),
        }
    }

    pub fn to_json(&self) -> String {
        sonic_rs::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The human-readable table.
    pub fn to_table(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "scenario {}  target {}  mode {}  threads {}",
            self.scenario, self.url, self.mode, self.threads
        );
        let _ = writeln!(
            o,
            "requests {}  ok {}  errors {}  duration {:.2}s  throughput {:.0} req/s",
            self.requests, self.ok, self.errors, self.duration_s, self.rps
        );
        let _ = writeln!(
            o,
            "{:<10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "ms", "p50", "p90", "p99", "p99.9", "max", "mean"
        );
        for (name, p) in [("latency", &self.latency_ms), ("ttft", &self.ttft_ms), ("itl", &self.itl_ms)] {
            if let Some(p) = p {
                let _ = writeln!(
                    o,
                    "{:<10} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                    name, p.p50, p.p90, p.p99, p.p999, p.max, p.mean
                );
            }
        }
        let join = |m: &BTreeMap<String, u64>| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
        let _ = writeln!(o, "status     {}", join(&self.status));
        if !self.error_codes.is_empty() {
            let _ = writeln!(o, "smg codes  {}", join(&self.error_codes));
        }
        if !self.transport_errors.is_empty() {
            let _ = writeln!(o, "transport  {}", join(&self.transport_errors));
        }
        if self.broken_streams > 0 {
            let _ = writeln!(o, "broken streams {}", self.broken_streams);
        }
        if let Some(r) = self.cache_ratio {
            let _ = writeln!(
                o,
                "prefix cache  cached/prompt tokens {}/{} = {:.1}%",
                self.cached_tokens,
                self.prompt_tokens,
                r * 100.0
            );
        }
        for c in &self.target_cpu {
            let _ = writeln!(
                o,
                "target pid {}  cpu {:.0} ms  {:.2} µs/request (user {:.2}, system {:.2})  {:.1}% of a core",
                c.pid, c.cpu_ms, c.cpu_us_per_request, c.user_us_per_request, c.system_us_per_request, c.cpu_percent
            );
        }
        if let Some(c) = &self.chain {
            let _ = writeln!(
                o,
                "chain      first turns {}  chained turns {}  conversations cut short {}",
                c.first_turns, c.chained_turns, c.cut_short
            );
        }
        let _ = writeln!(o, "connections opened {}", self.connections_opened);
        if let Some(w) = self.sender_cpu_wait_ms {
            let _ = writeln!(o, "load threads waited for a CPU {w:.1} ms");
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::sse::Usage;

    #[test]
    fn histogram_percentiles_and_merge() {
        let mut a = Stats::default();
        let mut b = Stats::default();
        let ex = Exchange {
            status: 200,
            usage: Some(Usage { prompt_tokens: 100, cached_tokens: 25, completion_tokens: 5 }),
            ..Exchange::default()
        };
        for us in 1..=1000u64 {
            a.record(&ex, us * 1000, Some(us), &[10, 20]);
        }
        let err = Exchange { status: 503, error_code: Some("no_available_workers".into()), ..Exchange::default() };
        b.record(&err, 5, None, &[]);
        b.record_timeout(2_000_000);
        a.merge(&b);
        let r = Report::build("s", "u", "closed", 1, 2.0, &a, vec![]);
        assert_eq!(r.requests, 1002);
        assert_eq!(r.ok, 1000);
        assert_eq!(r.errors, 2);
        assert_eq!(r.rps, 501.0);
        let lat = r.latency_ms.clone().unwrap();
        assert!((lat.p50 - 500.0).abs() < 1.0, "{}", lat.p50);
        assert!((lat.p99 - 990.0).abs() < 2.0, "{}", lat.p99);
        assert!((lat.max - 2000.0).abs() < 3.0, "{}", lat.max);
        assert_eq!(r.error_codes.get("no_available_workers"), Some(&1));
        assert_eq!(r.transport_errors.get("timeout"), Some(&1));
        assert_eq!(r.cache_ratio, Some(0.25));
        assert_eq!(r.itl_ms.as_ref().unwrap().count, 2000);
        let json = r.to_json();
        let v: sonic_rs::Value = sonic_rs::from_str(&json).unwrap();
        assert!(sonic_rs::JsonValueTrait::is_object(&v));
        assert!(r.to_table().contains("no_available_workers=1"));
    }
}
