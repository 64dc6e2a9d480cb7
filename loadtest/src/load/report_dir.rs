//! `--report DIR`: what `run`, `compare` and `sweep` leave behind: records.csv (one row per measured request), summary.json, report.html.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::Path;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::load::page;
use crate::load::records::{Records, CSV_HEADER};
use crate::load::report::{Report, Stats};
use crate::load::run::Measured;
use crate::load::slo::{Goodput, Slo};

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

#[derive(Serialize)]
struct EntryJson<'a> {
    target: &'a str,
    offered_rps: Option<f64>,
    round: usize,
    t0_s: f64,
    goodput: Option<Goodput>,
    cpu_us_per_request: Option<f64>,
    report: &'a Report,
}

#[derive(Serialize)]
struct SummaryJson<'a> {
    title: &'a str,
    kind: &'a str,
    slo: Option<Slo>,
    goodput_bar: Option<f64>,
    capacity: &'a [Capacity],
    notes: &'a [String],
    entries: Vec<EntryJson<'a>>,
}

/// The JSON summary (also what `sweep --json` prints).
pub fn summary_json(page: &Page, entries: &[Entry]) -> String {
    let s = SummaryJson {
        title: &page.title,
        kind: page.kind,
        slo: page.slo,
        goodput_bar: page.goodput_bar,
        capacity: &page.capacity,
        notes: &page.notes,
        entries: entries
            .iter()
            .map(|e| EntryJson {
                target: &e.target,
                offered_rps: e.rate,
                round: e.round,
                t0_s: e.t0_s,
                goodput: e.goodput,
                cpu_us_per_request: e.cpu_us_per_request(),
                report: &e.report,
            })
            .collect(),
    };
    sonic_rs::to_string_pretty(&s).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// Writes records.csv, summary.json and report.html into `dir` (created if needed).
pub fn write(dir: &Path, page: &Page, entries: &[Entry]) -> Result<(), String> {
    let err = |what: &str, e: std::io::Error| format!("report {}: {what}: {e}", dir.display());
    fs::create_dir_all(dir).map_err(|e| err("mkdir", e))?;
    let mut csv = BufWriter::with_capacity(1 << 20, File::create(dir.join("records.csv")).map_err(|e| err("csv", e))?);
    writeln!(csv, "{CSV_HEADER}").map_err(|e| err("csv", e))?;
    for e in entries {
        e.records.write_csv(&e.target, e.rate, &mut csv).map_err(|x| err("csv", x))?;
    }
    csv.flush().map_err(|e| err("csv", e))?;
    fs::write(dir.join("summary.json"), summary_json(page, entries)).map_err(|e| err("json", e))?;
    fs::write(dir.join("report.html"), page::render(page, entries)).map_err(|e| err("html", e))?;
    Ok(())
}
