//! `--report DIR`: what `run`, `compare` and `sweep` leave behind: records.csv (one row per measured request), summary.json, report.html.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::Path;

use serde::Serialize;

use crate::load::entry::{Capacity, Entry, Page};
use crate::load::page;
use crate::load::records::CSV_HEADER;
use crate::load::report::Report;
use crate::load::slo::{Goodput, Slo};

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
