//! What a report is made of, shared by the runs that measure (`run`, `compare`, `sweep`) and
//! the writers of the report directory (`report_dir`: CSV and JSON, `page`: the HTML): one
//! measured run of one target and its latency curves, and what the page says besides.

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::load::records::Records;
use crate::load::report::{Report, Stats};
use crate::load::slo::{Goodput, Slo};

/// A run's report plus what `--report` needs: per-request rows and latency distributions.
pub struct Measured {
    pub report: Report,
    pub records: Records,
    pub curves: Curves,
}

/// Quantiles at which the distributions are drawn: every percent, then the tail.
const QUANTILES: [f64; 8] = [0.995, 0.999, 0.9995, 0.9999, 0.99995, 0.99999, 0.999999, 1.0];

/// Latency distributions as (quantile, ms) points, taken from the run's histograms (ITL is
/// every gap, not per-request means).
#[derive(Clone, Debug, Default)]
pub struct Curves {
    pub e2e: Vec<(f64, f64)>,
    pub ttft: Vec<(f64, f64)>,
    pub itl: Vec<(f64, f64)>,
}

// === impl Curves ===

impl Curves {
    pub fn of(s: &Stats) -> Curves {
        let curve = |h: &Histogram<u64>| -> Vec<(f64, f64)> {
            if h.is_empty() {
                return Vec::new();
            }
            (1..100)
                .map(|p| f64::from(p) / 100.0)
                .chain(QUANTILES)
                .map(|q| (q, h.value_at_quantile(q) as f64 / 1000.0))
                .collect()
        };
        Curves { e2e: curve(&s.latency), ttft: curve(&s.ttft), itl: curve(&s.itl) }
    }

    pub fn get(&self, metric: &str) -> &[(f64, f64)] {
        match metric {
            "ttft" => &self.ttft,
            "itl" => &self.itl,
            _ => &self.e2e,
        }
    }
}

/// One measured run of one target (at one offered rate, or one compare round).
pub struct Entry {
    pub target: String,
    /// Offered rate (open loop), None for closed loop.
    pub rate: Option<f64>,
    /// 1-based round (compare) or step (sweep).
    pub round: usize,
    /// Start of the measured window, seconds after the session started.
    pub t0_s: f64,
    pub report: Report,
    pub records: Records,
    pub curves: Curves,
    pub goodput: Option<Goodput>,
}

// === impl Entry ===

impl Entry {
    pub fn new(target: &str, rate: Option<f64>, round: usize, t0_s: f64, m: Measured) -> Entry {
        Entry {
            target: target.to_string(),
            rate,
            round,
            t0_s,
            report: m.report,
            records: m.records,
            curves: m.curves,
            goodput: None,
        }
    }

    pub fn cpu_us_per_request(&self) -> Option<f64> {
        self.report.target_cpu.first().map(|c| c.cpu_us_per_request)
    }
}

/// A target's capacity: the highest offered rate below its first rate that missed the goodput bar.
#[derive(Serialize, Clone, Debug)]
pub struct Capacity {
    pub target: String,
    /// None when even the lowest rate missed.
    pub rps: Option<f64>,
    /// The first rate that missed (None: none missed, so capacity is at least `rps`).
    pub first_miss_rps: Option<f64>,
    /// capacity ÷ the first target's capacity.
    pub ratio_to_first: Option<f64>,
}

/// What the page says besides the entries.
#[derive(Default)]
pub struct Page {
    pub title: String,
    /// "run", "compare" or "sweep".
    pub kind: &'static str,
    pub slo: Option<Slo>,
    /// Goodput fraction a rate must keep to count toward capacity.
    pub goodput_bar: Option<f64>,
    pub capacity: Vec<Capacity>,
    pub notes: Vec<String>,
}
