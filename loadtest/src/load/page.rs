//! report.html: one self-contained page (inline CSS and SVG, one tiny inline script that only marks the page as rendered).
//!
//! Charts: latency percentiles (e2e, TTFT, ITL) against offered rate with the SLO line and
//! each target's knee; throughput and goodput; CPU per request; the latency distributions;
//! completions and errors over time. Without offered rates (closed loop) the x axis is the
//! round. Tables carry the exact figures, errors by status, error code and transport kind.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::load::entry::{Entry, Page};
use crate::load::report::Percentiles;
use crate::load::svg::{esc, num, Chart, Rule, Series, PALETTE};

const METRICS: [(&str, &str); 3] = [("e2e", "end-to-end latency"), ("ttft", "TTFT"), ("itl", "inter-token latency")];

fn pct<'a>(e: &'a Entry, metric: &str) -> Option<&'a Percentiles> {
    match metric {
        "ttft" => e.report.ttft_ms.as_ref(),
        "itl" => e.report.itl_ms.as_ref(),
        _ => e.report.latency_ms.as_ref(),
    }
}

/// Targets in first-seen order, each with its colour.
fn targets(entries: &[Entry]) -> Vec<(&str, &'static str)> {
    let mut out: Vec<(&str, &'static str)> = Vec::new();
    for e in entries {
        if !out.iter().any(|(t, _)| *t == e.target) {
            out.push((&e.target, PALETTE[out.len() % PALETTE.len()]));
        }
    }
    out
}

fn of_target<'a>(entries: &'a [Entry], t: &'a str) -> impl Iterator<Item = &'a Entry> {
    entries.iter().filter(move |e| e.target == t)
}

/// The x value of an entry: offered rate when every entry has one, else its round.
fn x_of(e: &Entry, by_rate: bool) -> f64 {
    if by_rate {
        e.rate.unwrap_or(0.0)
    } else {
        e.round as f64
    }
}

pub fn render(page: &Page, entries: &[Entry]) -> String {
    let tg = targets(entries);
    let by_rate = !entries.is_empty() && entries.iter().all(|e| e.rate.is_some());
    let x_label = if by_rate { "offered rate (req/s)" } else { "round" };
    let (lo, hi) =
        entries.iter().map(|e| x_of(e, by_rate)).fold((f64::INFINITY, 0f64), |(a, b), x| (a.min(x), b.max(x)));
    let log_x = by_rate && lo > 0.0 && hi / lo >= 8.0;
    let knees: Vec<Rule> = page
        .capacity
        .iter()
        .filter_map(|c| {
            let color = tg.iter().find(|(t, _)| *t == c.target)?.1;
            Some(Rule { value: c.rps?, label: format!("knee {} {}", c.target, num(c.rps?)), color })
        })
        .collect();
    let mut charts = Vec::new();

    // Charts against offered rate (or round) need two or more x values to say anything.
    let mut xs: Vec<f64> = entries.iter().map(|e| x_of(e, by_rate)).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    if xs.len() >= 2 {
        // Latency percentiles against offered rate (or round).
        for (metric, name) in METRICS {
            if !entries.iter().any(|e| pct(e, metric).is_some()) {
                continue;
            }
            let mut series = Vec::new();
            for &(t, color) in &tg {
                for (label, dash, f) in [
                    ("p50", Some("2 3"), (|p: &Percentiles| p.p50) as fn(&Percentiles) -> f64),
                    ("p90", Some("6 3"), |p| p.p90),
                    ("p99", None, |p| p.p99),
                ] {
                    let points =
                        of_target(entries, t).filter_map(|e| Some((x_of(e, by_rate), f(pct(e, metric)?)))).collect();
                    series.push(Series { name: format!("{t} {label}"), color, dash, points, markers: true });
                }
            }
            let hlines = page
                .slo
                .and_then(|s| s.limit(metric))
                .map(|v| Rule { value: v, label: format!("SLO {metric} {}", num(v)), color: "#c00" })
                .into_iter()
                .collect();
            let vlines = if by_rate { knees.iter().map(clone_rule).collect() } else { Vec::new() };
            charts.push(Chart {
                title: format!("{name} p50 / p90 / p99 (ms)"),
                x_label: x_label.into(),
                y_label: "ms".into(),
                log_x,
                log_y: true,
                series,
                hlines,
                vlines,
            });
        }

        // Throughput and goodput.
        let mut series = Vec::new();
        for &(t, color) in &tg {
            let thr = of_target(entries, t).map(|e| (x_of(e, by_rate), e.report.rps)).collect();
            series.push(Series { name: format!("{t} throughput"), color, dash: None, points: thr, markers: true });
            let good: Vec<(f64, f64)> =
                of_target(entries, t).filter_map(|e| Some((x_of(e, by_rate), e.goodput?.rps))).collect();
            if !good.is_empty() {
                series.push(Series {
                    name: format!("{t} goodput"),
                    color,
                    dash: Some("6 3"),
                    points: good,
                    markers: true,
                });
            }
        }
        if by_rate {
            series.push(Series {
                name: "offered".into(),
                color: "#999",
                dash: Some("1 3"),
                points: vec![(lo, lo), (hi, hi)],
                markers: false,
            });
        }
        charts.push(Chart {
            title: "throughput and goodput (req/s)".into(),
            x_label: x_label.into(),
            y_label: "req/s".into(),
            log_x,
            series,
            vlines: if by_rate { knees.iter().map(clone_rule).collect() } else { Vec::new() },
            ..Chart::default()
        });

        // CPU per request of the system under test.
        let cpu: Vec<Series> = tg
            .iter()
            .filter_map(|&(t, color)| {
                let points: Vec<(f64, f64)> =
                    of_target(entries, t).filter_map(|e| Some((x_of(e, by_rate), e.cpu_us_per_request()?))).collect();
                (!points.is_empty()).then(|| Series { name: t.to_string(), color, dash: None, points, markers: true })
            })
            .collect();
        if !cpu.is_empty() {
            charts.push(Chart {
                title: "target CPU per request (µs)".into(),
                x_label: x_label.into(),
                y_label: "µs / request".into(),
                log_x,
                series: cpu,
                ..Chart::default()
            });
        }
    }

    // Distributions: percentile against latency, one line per run.
    for (metric, name) in METRICS {
        let mut series = Vec::new();
        for &(t, color) in &tg {
            let runs: Vec<&Entry> = of_target(entries, t).filter(|e| !e.curves.get(metric).is_empty()).collect();
            for (k, e) in runs.iter().enumerate() {
                let dash = [None, Some("6 3"), Some("2 3"), Some("8 2 2 2")][k % 4];
                let points = e.curves.get(metric).iter().map(|&(q, ms)| (ms, q * 100.0)).collect();
                let label = match e.rate {
                    Some(r) => format!("{t} @{}", num(r)),
                    None => format!("{t} #{}", e.round),
                };
                series.push(Series { name: label, color, dash, points, markers: false });
            }
        }
        if series.is_empty() {
            continue;
        }
        let vlines = page
            .slo
            .and_then(|s| s.limit(metric))
            .map(|v| Rule { value: v, label: format!("SLO {}", num(v)), color: "#c00" })
            .into_iter()
            .collect();
        charts.push(Chart {
            title: format!("{name} distribution"),
            x_label: "ms".into(),
            y_label: "percentile".into(),
            log_x: true,
            series,
            vlines,
            ..Chart::default()
        });
    }

    // Completions and errors over the session's time line.
    let span = entries
        .iter()
        .map(|e| {
            e.t0_s + e.records.iter().map(|r| r.start_us + u64::from(r.latency_us)).max().unwrap_or(0) as f64 / 1e6
        })
        .fold(0f64, f64::max);
    if entries.iter().any(|e| !e.records.is_empty()) {
        let bucket = (span / 100.0).max(0.25);
        let n = (span / bucket).ceil() as usize + 1;
        let mut series = Vec::new();
        for &(t, color) in &tg {
            let (mut ok, mut bad) = (vec![0u64; n], vec![0u64; n]);
            for e in of_target(entries, t) {
                for r in e.records.iter() {
                    let at = e.t0_s + (r.start_us + u64::from(r.latency_us)) as f64 / 1e6;
                    let i = ((at / bucket) as usize).min(n - 1);
                    if r.ok() {
                        ok[i] += 1;
                    } else {
                        bad[i] += 1;
                    }
                }
            }
            let pts = |v: &[u64]| v.iter().enumerate().map(|(i, &c)| (i as f64 * bucket, c as f64 / bucket)).collect();
            series.push(Series { name: format!("{t} ok/s"), color, dash: None, points: pts(&ok), markers: false });
            series.push(Series {
                name: format!("{t} errors/s"),
                color,
                dash: Some("2 2"),
                points: pts(&bad),
                markers: false,
            });
        }
        charts.push(Chart {
            title: "completions and errors over time".into(),
            x_label: "seconds since start".into(),
            y_label: "per second".into(),
            series,
            ..Chart::default()
        });
    }

    let mut o = String::new();
    let _ = write!(
        o,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{}</style></head><body>",
        esc(&page.title),
        CSS
    );
    let _ = write!(o, "<h1>{}</h1>", esc(&page.title));
    if let Some(slo) = &page.slo {
        let _ = write!(
            o,
            "<p>SLO: {} — goodput counts the requests that met every objective; capacity is the highest offered rate keeping at least {:.0}% goodput, below the first rate that did not.</p>",
            esc(&slo.describe()),
            page.goodput_bar.unwrap_or(0.99) * 100.0
        );
    }
    if !page.capacity.is_empty() {
        o.push_str(
            "<table><tr><th>target</th><th>capacity req/s</th><th>first miss req/s</th><th>ratio to first</th></tr>",
        );
        for c in &page.capacity {
            let f = |v: Option<f64>| v.map_or_else(|| "-".into(), num);
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&c.target),
                f(c.rps),
                f(c.first_miss_rps),
                c.ratio_to_first.map_or_else(|| "-".into(), |r| format!("{r:.2}"))
            );
        }
        o.push_str("</table>");
    }
    o.push_str("<div class=\"charts\">");
    for c in &charts {
        o.push_str("<figure>");
        o.push_str(&c.render());
        o.push_str("</figure>");
    }
    o.push_str("</div>");
    entries_table(&mut o, entries);
    for n in &page.notes {
        let _ = write!(o, "<p class=\"note\">note: {}</p>", esc(n));
    }
    o.push_str(
        "<p class=\"note\">Raw rows: records.csv (µs; start_us counts from the end of each run's warm-up). Figures: summary.json.</p>",
    );
    o.push_str(SCRIPT);
    o.push_str("</body></html>\n");
    o
}

fn clone_rule(r: &Rule) -> Rule {
    Rule { value: r.value, label: r.label.clone(), color: r.color }
}

fn entries_table(o: &mut String, entries: &[Entry]) {
    o.push_str(
        "<table><tr><th>target</th><th>offered</th><th>round</th><th>requests</th><th>req/s</th><th>goodput</th>\
<th>e2e p50/p90/p99 ms</th><th>TTFT p50/p90/p99 ms</th><th>ITL p50/p90/p99 ms</th><th>CPU µs/req</th><th>errors</th></tr>",
    );
    for e in entries {
        let r = &e.report;
        let p = |p: &Option<Percentiles>| {
            p.as_ref().map_or_else(|| "-".into(), |p| format!("{} / {} / {}", num(p.p50), num(p.p90), num(p.p99)))
        };
        let mut errs: BTreeMap<String, u64> = BTreeMap::new();
        for (k, v) in r.status.iter().filter(|(k, _)| !k.starts_with('2')) {
            errs.insert(format!("status {k}"), *v);
        }
        for (k, v) in &r.error_codes {
            errs.insert(format!("code {k}"), *v);
        }
        for (k, v) in &r.transport_errors {
            errs.insert(k.clone(), *v);
        }
        if r.broken_streams > 0 {
            errs.insert("broken streams".into(), r.broken_streams);
        }
        let errs = if errs.is_empty() {
            "0".to_string()
        } else {
            errs.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", ")
        };
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&e.target),
            e.rate.map_or_else(|| "closed".into(), num),
            e.round,
            r.requests,
            num(r.rps),
            e.goodput.map_or_else(|| "-".into(), |g| format!("{} ({:.1}%)", num(g.rps), g.fraction * 100.0)),
            p(&r.latency_ms),
            p(&r.ttft_ms),
            p(&r.itl_ms),
            e.cpu_us_per_request().map_or_else(|| "-".into(), |c| format!("{c:.2}")),
            esc(&errs)
        );
    }
    o.push_str("</table>");
}

const CSS: &str = "body{font-family:sans-serif;margin:20px;color:#222}h1{font-size:20px}\
table{border-collapse:collapse;margin:12px 0;font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}\
td:first-child,th:first-child{text-align:left}.charts{display:flex;flex-wrap:wrap;gap:8px}figure{margin:0}.note{color:#666;font-size:12px}";

/// Marks the body once the page parsed and its charts are in the DOM, so a headless browser
/// test can tell a page that rendered from one whose script failed.
const SCRIPT: &str = "<script>(function(){var s=document.querySelectorAll('svg.chart');\
var p=document.querySelectorAll('svg.chart polyline').length;document.body.setAttribute('data-charts',String(s.length));\
document.body.setAttribute('data-rendered',s.length>0&&p>0?'ok':'empty');})();</script>";
