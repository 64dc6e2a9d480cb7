//! A small line-chart renderer for the HTML report: axes, nice ticks (linear or log), series as polylines, labelled rules; SVG text only.
//!
//! Written here rather than pulled in so the report opens anywhere with no network and no
//! third-party script: each chart is a self-contained `<svg>` string with `<title>` tooltips.

use std::fmt::Write as _;

const W: f64 = 600.0;
const H: f64 = 320.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 44.0;
const LEGEND_ROW: f64 = 16.0;

/// Distinct colours for targets (Tableau 10).
pub const PALETTE: [&str; 10] =
    ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

pub struct Series {
    pub name: String,
    pub color: &'static str,
    /// SVG `stroke-dasharray`, e.g. "4 3".
    pub dash: Option<&'static str>,
    pub points: Vec<(f64, f64)>,
    pub markers: bool,
}

/// A horizontal (y) or vertical (x) reference line, e.g. an SLO or a knee.
pub struct Rule {
    pub value: f64,
    pub label: String,
    pub color: &'static str,
}

#[derive(Default)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub log_y: bool,
    pub series: Vec<Series>,
    pub hlines: Vec<Rule>,
    pub vlines: Vec<Rule>,
}

/// One axis' mapping from data to pixels.
struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
    px_lo: f64,
    px_hi: f64,
}

// === impl Scale ===

impl Scale {
    fn new(values: impl Iterator<Item = f64>, log: bool, from_zero: bool, px: (f64, f64)) -> Scale {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            (lo, hi) = if log { (1.0, 10.0) } else { (0.0, 1.0) };
        }
        if log {
            lo = 10f64.powf(lo.log10().floor());
            hi = 10f64.powf(hi.log10().ceil());
            if hi <= lo {
                hi = lo * 10.0;
            }
        } else {
            if from_zero && lo > 0.0 {
                lo = 0.0;
            }
            if hi <= lo {
                hi = lo + if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
            }
            let step = nice_step((hi - lo) / 5.0);
            lo = (lo / step).floor() * step;
            hi = (hi / step).ceil() * step;
        }
        Scale { lo, hi, log, px_lo: px.0, px_hi: px.1 }
    }

    fn map(&self, v: f64) -> f64 {
        let f = if self.log {
            (v.max(self.lo * 1e-3).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        };
        self.px_lo + f * (self.px_hi - self.px_lo)
    }

    fn contains(&self, v: f64) -> bool {
        v.is_finite() && v >= self.lo && v <= self.hi && (!self.log || v > 0.0)
    }

    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let decades = (self.hi / self.lo).log10().round() as i32;
            let mults: &[f64] = if decades <= 2 { &[1.0, 2.0, 5.0] } else { &[1.0] };
            let mut out = Vec::new();
            let mut p = self.lo;
            while p <= self.hi * 1.0001 {
                for m in mults {
                    if p * m <= self.hi * 1.0001 {
                        out.push(p * m);
                    }
                }
                p *= 10.0;
            }
            out
        } else {
            let step = nice_step((self.hi - self.lo) / 5.0);
            let mut out = Vec::new();
            let mut v = self.lo;
            while v <= self.hi + step * 1e-6 {
                out.push(v);
                v += step;
            }
            out
        }
    }
}

/// 1, 2 or 5 × 10^k at or above `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    p * if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    }
}

/// Short tick label: 0.05, 2.5, 250, 12k, 1.5M.
pub fn num(v: f64) -> String {
    let a = v.abs();
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if a >= 1e6 {
        trim(format!("{:.1}", v / 1e6)) + "M"
    } else if a >= 1e4 {
        trim(format!("{:.1}", v / 1e3)) + "k"
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        trim(format!("{v:.2}"))
    } else {
        trim(format!("{v:.3}"))
    }
}

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

// === impl Chart ===

impl Chart {
    pub fn render(&self) -> String {
        let legend_rows = self.series.len().div_ceil(3) as f64;
        let total_h = H + 8.0 + legend_rows * LEGEND_ROW;
        let plot_bottom = H - BOTTOM;
        let xs = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
        let xs = xs.chain(self.vlines.iter().map(|r| r.value));
        let x = Scale::new(xs, self.log_x, false, (LEFT, W - RIGHT));
        let ys = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
        let ys = ys.chain(self.hlines.iter().map(|r| r.value));
        let y = Scale::new(ys, self.log_y, true, (plot_bottom, TOP));
        let mut o = String::new();
        let _ = write!(
            o,
            r#"<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {total_h}" width="{W}" height="{total_h}" font-family="sans-serif" font-size="11">"#
        );
        let _ = write!(o, r#"<text x="{}" y="18" font-size="13" font-weight="bold">{}</text>"#, LEFT, esc(&self.title));
        // Grid and tick labels.
        for t in y.ticks() {
            let py = y.map(t);
            let _ = write!(
                o,
                r##"<line x1="{LEFT}" x2="{}" y1="{py:.1}" y2="{py:.1}" stroke="#e5e5e5"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                W - RIGHT,
                LEFT - 4.0,
                py + 4.0,
                num(t)
            );
        }
        for t in x.ticks() {
            let px = x.map(t);
            let _ = write!(
                o,
                r##"<line x1="{px:.1}" x2="{px:.1}" y1="{TOP}" y2="{plot_bottom}" stroke="#f0f0f0"/><text x="{px:.1}" y="{}" text-anchor="middle">{}</text>"##,
                plot_bottom + 14.0,
                num(t)
            );
        }
        let _ = write!(
            o,
            r##"<rect x="{LEFT}" y="{TOP}" width="{}" height="{}" fill="none" stroke="#999"/>"##,
            W - RIGHT - LEFT,
            plot_bottom - TOP
        );
        let _ = write!(
            o,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            (LEFT + W - RIGHT) / 2.0,
            plot_bottom + 32.0,
            esc(&self.x_label)
        );
        let _ = write!(
            o,
            r#"<text transform="translate(14 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
            (TOP + plot_bottom) / 2.0,
            esc(&self.y_label)
        );
        for r in &self.hlines {
            if y.contains(r.value) {
                let py = y.map(r.value);
                let _ = write!(
                    o,
                    r#"<line class="rule" x1="{LEFT}" x2="{}" y1="{py:.1}" y2="{py:.1}" stroke="{}" stroke-width="1.5" stroke-dasharray="6 3"><title>{}</title></line><text x="{}" y="{:.1}" text-anchor="end" fill="{}">{}</text>"#,
                    W - RIGHT,
                    r.color,
                    esc(&r.label),
                    W - RIGHT - 4.0,
                    py - 4.0,
                    r.color,
                    esc(&r.label)
                );
            }
        }
        for (i, r) in self.vlines.iter().enumerate() {
            if x.contains(r.value) {
                let px = x.map(r.value);
                let _ = write!(
                    o,
                    r#"<line class="rule" x1="{px:.1}" x2="{px:.1}" y1="{TOP}" y2="{plot_bottom}" stroke="{}" stroke-width="1.5" stroke-dasharray="2 3"><title>{}</title></line><text x="{:.1}" y="{}" fill="{}">{}</text>"#,
                    r.color,
                    esc(&r.label),
                    px + 3.0,
                    TOP + 12.0 + 12.0 * i as f64,
                    r.color,
                    esc(&r.label)
                );
            }
        }
        for s in &self.series {
            let pts: Vec<(f64, f64)> =
                s.points.iter().copied().filter(|&(a, b)| x.contains(a) && y.contains(b)).collect();
            if pts.is_empty() {
                continue;
            }
            let mut d = String::new();
            for (a, b) in &pts {
                let _ = write!(d, "{:.1},{:.1} ", x.map(*a), y.map(*b));
            }
            let dash = s.dash.map(|d| format!(r#" stroke-dasharray="{d}""#)).unwrap_or_default();
            let _ = write!(
                o,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="1.8"{dash}><title>{}</title></polyline>"#,
                d.trim_end(),
                s.color,
                esc(&s.name)
            );
            if s.markers {
                for (a, b) in &pts {
                    let _ = write!(
                        o,
                        r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{}"><title>{}: {} → {}</title></circle>"#,
                        x.map(*a),
                        y.map(*b),
                        s.color,
                        esc(&s.name),
                        num(*a),
                        num(*b)
                    );
                }
            }
        }
        for (i, s) in self.series.iter().enumerate() {
            let lx = LEFT + (i % 3) as f64 * ((W - LEFT - RIGHT) / 3.0);
            let ly = H + 8.0 + (i / 3) as f64 * LEGEND_ROW - 4.0;
            let dash = s.dash.map(|d| format!(r#" stroke-dasharray="{d}""#)).unwrap_or_default();
            let _ = write!(
                o,
                r#"<line x1="{lx:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{ly:.1}">{}</text>"#,
                lx + 18.0,
                ly - 4.0,
                ly - 4.0,
                s.color,
                lx + 22.0,
                esc(&s.name)
            );
        }
        o.push_str("</svg>");
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_labels_and_render() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(130.0), 200.0);
        assert_eq!(num(12_500.0), "12.5k");
        assert_eq!(num(0.05), "0.05");
        assert_eq!(num(250.0), "250");
        let s = Scale::new([3.0, 870.0].into_iter(), true, false, (0.0, 100.0));
        assert_eq!((s.lo, s.hi), (1.0, 1000.0));
        assert_eq!(s.ticks(), vec![1.0, 10.0, 100.0, 1000.0]);
        let c = Chart {
            title: "p99 <latency>".into(),
            series: vec![Series {
                name: "direct".into(),
                color: PALETTE[0],
                dash: None,
                points: vec![(100.0, 1.0), (200.0, 3.0)],
                markers: true,
            }],
            hlines: vec![Rule { value: 2.0, label: "SLO".into(), color: "#c00" }],
            vlines: vec![Rule { value: 150.0, label: "knee".into(), color: "#333" }],
            ..Chart::default()
        }
        .render();
        assert!(c.starts_with("<svg") && c.ends_with("</svg>"));
        assert!(c.contains("<polyline") && c.contains("p99 &lt;latency&gt;"));
        assert_eq!(c.matches("class=\"rule\"").count(), 2);
    }
}
