//! `smg-load sweep`: open-loop runs at rising offered rates against one or more targets, goodput under an SLO, and each target's capacity (the knee).
//!
//! Rates come from a list (`--rates 100,200,400`) or a geometric search (`--search
//! start,factor`) that drops a target one step past its knee and ends when every target has
//! passed it (or after `--max-steps`). Within a step the targets run one after another, the
//! leader rotating as in `compare`, so every target meets the same machine state at every
//! rate. Named targets (`direct`, `smg`, `smg-base`, `nginx`, `smg-python`) are started fresh
//! for each run behind one shared smg-sim, exactly as `compare` starts them (pinned, CPU per
//! request of the process tree); a `http://` URL is driven as it is, without CPU figures.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;

use crate::load::blocking::{self, Client};
use crate::load::compare::{self, CompareArgs, SutArgs, Target};
use crate::load::entry::{Capacity, Entry, Page};
use crate::load::fleet::Fleet;
use crate::load::open_loop::Arrivals;
use crate::load::procs::{on_path, Proc};
use crate::load::report_dir;
use crate::load::run::{execute_recorded, resolve, split_url, ArrivalArg, LoadPlan, Mode};
use crate::load::scenario::Scenario;
use crate::load::slo::Slo;
use crate::load::svg::num;
use crate::rt;

#[derive(Args, Debug, Clone)]
pub struct SweepArgs {
    /// Targets: direct, smg, smg-base, nginx, smg-python (as in compare) and/or http:// URLs.
    #[arg(long, default_value = "direct")]
    pub targets: String,
    /// Offered rates in req/s, e.g. "100,200,400"; every target runs every rate.
    #[arg(long, conflicts_with = "search")]
    pub rates: Option<String>,
    /// Geometric search "start,factor" (e.g. "100,1.5"): rates start·factor^k until one step past each target's knee.
    #[arg(long)]
    pub search: Option<String>,
    /// Search steps at most (a bound, so a target that never misses still ends).
    #[arg(long, default_value_t = 10)]
    pub max_steps: usize,
    /// Objectives that define goodput, e.g. "ttft=500ms,itl=50ms,e2e=10s" (none: every success counts).
    #[arg(long, default_value = "")]
    pub slo: String,
    /// Goodput fraction a rate must keep to count toward capacity.
    #[arg(long, default_value_t = 0.99)]
    pub goodput: f64,
    /// Measured time per rate and target.
    #[arg(long, value_parser = rt::parse_duration, default_value = "5s")]
    pub duration: Duration,
    /// Unrecorded warm-up per rate and target (same rate).
    #[arg(long, value_parser = rt::parse_duration, default_value = "1s")]
    pub warmup: Duration,
    /// Per-request timeout (late answers count as timeouts, so as misses).
    #[arg(long, value_parser = rt::parse_duration, default_value = "30s")]
    pub timeout: Duration,
    /// Scenario file or name.
    #[arg(long, default_value = "chat-1k")]
    pub scenario: String,
    #[arg(long, value_enum, default_value = "poisson")]
    pub arrival: ArrivalArg,
    /// Connections per load thread at most.
    #[arg(long, default_value_t = 1024)]
    pub max_conns: usize,
    /// Load threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Core of the system under test.
    #[arg(long, default_value_t = 1)]
    pub sut_core: usize,
    /// Core of the load generator and the simulator.
    #[arg(long, default_value_t = 0)]
    pub load_core: usize,
    #[command(flatten)]
    pub sut: SutArgs,
    /// Write records.csv, summary.json and report.html into this directory.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    /// Print the summary as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Where the rates come from.
#[derive(Clone, Debug, PartialEq)]
enum Rates {
    List(Vec<f64>),
    Search { start: f64, factor: f64 },
}

// === impl Rates ===

impl Rates {
    fn parse(args: &SweepArgs) -> Result<Rates, String> {
        let nums = |s: &str| -> Result<Vec<f64>, String> {
            s.split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(|x| x.parse::<f64>().map_err(|e| format!("bad rate {x:?}: {e}")))
                .collect()
        };
        match (&args.rates, &args.search) {
            (Some(list), None) => {
                let mut v = nums(list)?;
                if v.is_empty() || v.iter().any(|r| r.is_nan() || *r <= 0.0) {
                    return Err("--rates needs positive rates".into());
                }
                v.sort_by(f64::total_cmp);
                v.dedup();
                Ok(Rates::List(v))
            }
            (None, Some(s)) => match nums(s)?.as_slice() {
                &[start, factor] if start > 0.0 && factor > 1.0 => Ok(Rates::Search { start, factor }),
                _ => Err("--search wants \"start,factor\" with start > 0 and factor > 1".into()),
            },
            _ => Err("give --rates r1,r2,… or --search start,factor".into()),
        }
    }

    /// The rate of step `k`, None past the end.
    fn at(&self, k: usize, max_steps: usize) -> Option<f64> {
        match self {
            Rates::List(v) => v.get(k).copied(),
            Rates::Search { start, factor } => (k < max_steps).then(|| start * factor.powi(k as i32)),
        }
    }
}

/// A target of the sweep: started per run like compare's, or an address as given.
enum SweepTarget {
    Named(Target),
    Url { url: String, authority: String, addr: SocketAddr, path: Option<String> },
}

// === impl SweepTarget ===

impl SweepTarget {
    fn name(&self) -> &str {
        match self {
            SweepTarget::Named(t) => t.name,
            SweepTarget::Url { url, .. } => url,
        }
    }
}

/// Capacity per target: the highest passing rate below the first miss.
fn capacities(names: &[String], entries: &[Entry], bar: f64) -> Vec<Capacity> {
    let mut out: Vec<Capacity> = names
        .iter()
        .map(|t| {
            let mut rps = None;
            let mut first_miss = None;
            for e in entries.iter().filter(|e| &e.target == t) {
                let pass = passes(e, bar);
                if pass && first_miss.is_none() {
                    rps = e.rate;
                } else if !pass && first_miss.is_none() {
                    first_miss = e.rate;
                }
            }
            Capacity { target: t.clone(), rps, first_miss_rps: first_miss, ratio_to_first: None }
        })
        .collect();
    let first = out.first().and_then(|c| c.rps);
    for c in &mut out {
        c.ratio_to_first = match (c.rps, first) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
    }
    out
}

fn passes(e: &Entry, bar: f64) -> bool {
    e.report.requests > 0 && e.goodput.is_some_and(|g| g.fraction >= bar)
}

/// Waits until no simulated worker has requests running or queued (a timed-out run leaves
/// the simulator busy, and the next target must not pay for it). Bounded by `within`.
fn wait_sim_idle(ports: &[u16], within: Duration) -> bool {
    let deadline = Instant::now() + within;
    for &p in ports {
        let mut c = Client::new(([127, 0, 0, 1], p).into(), Duration::from_secs(2));
        loop {
            let busy = c.call("GET", "/sim/stats", None).ok().map(|r| {
                blocking::json_u64(&r.body, "running").unwrap_or(0)
                    + blocking::json_u64(&r.body, "waiting").unwrap_or(0)
            });
            if busy == Some(0) {
                break;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    true
}

fn compare_args(a: &SweepArgs) -> CompareArgs {
    CompareArgs {
        scenario: a.scenario.clone(),
        model: None,
        targets: String::new(),
        rounds: 1,
        duration: a.duration,
        warmup: a.warmup,
        concurrency: 1,
        sut_core: a.sut_core,
        load_core: a.load_core,
        sut: a.sut.clone(),
        json: false,
        report: None,
    }
}

pub fn run(args: &SweepArgs) -> Result<(), String> {
    let rates = Rates::parse(args)?;
    let slo = Slo::parse(&args.slo)?;
    let scenario = Scenario::load(&args.scenario)?;
    let mut notes = Vec::new();
    let mut cargs = compare_args(args);
    let mut targets = Vec::new();
    for spec in args.targets.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if spec.starts_with("http://") {
            let (authority, path) = split_url(spec)?;
            let addr = resolve(&authority)?;
            targets.push(SweepTarget::Url { url: spec.to_string(), authority, addr, path });
        } else {
            cargs.targets = spec.to_string();
            targets.extend(compare::find_targets(&cargs, &mut notes)?.into_iter().map(SweepTarget::Named));
        }
    }
    if targets.is_empty() {
        return Err("no target to run".into());
    }
    let names: Vec<String> = targets.iter().map(|t| t.name().to_string()).collect();
    if on_path("taskset").is_none() {
        notes.push("taskset not found: processes run unpinned".into());
    }
    rt::pin_to(args.load_core);
    let needs_sim = targets.iter().any(|t| matches!(t, SweepTarget::Named(_)));
    if let Some(e) = needs_sim.then(|| compare::responses_need_grpc(&scenario, &args.sut.fleet)).flatten() {
        return Err(e);
    }
    let fleet = if needs_sim {
        Some(Fleet::start(&args.sut.fleet, args.load_core, &scenario.model_names(), args.timeout)?)
    } else {
        None
    };
    let sim_ports = fleet.as_ref().map(Fleet::ports).unwrap_or_default();
    let headers = crate::load::fleet::request_headers(&args.sut.fleet, &args.sut.headers);
    let req_for = |port: u16| -> Vec<u8> {
        let host = format!("127.0.0.1:{port}");
        scenario.requests(&host, None, &headers).swap_remove(0).to_vec()
    };
    let session = Instant::now();
    let mut entries: Vec<Entry> = Vec::new();
    // In search mode a target that missed is done: its knee is found.
    let mut done = vec![false; targets.len()];
    let mut step = 0;
    while let Some(rate) = rates.at(step, args.max_steps) {
        for k in 0..targets.len() {
            let i = (k + step) % targets.len();
            if done[i] {
                continue;
            }
            let t = &targets[i];
            let (proc_, addr, host, path): (Option<Proc>, SocketAddr, String, Option<String>) = match t {
                // A named target is why the fleet started, so it is there.
                SweepTarget::Named(nt) => {
                    match compare::start_target(nt, &cargs, fleet.as_ref().ok_or("no fleet")?, &req_for) {
                        Ok((p, port)) => (p, ([127, 0, 0, 1], port).into(), format!("127.0.0.1:{port}"), None),
                        Err(e) => {
                            notes.push(format!("{} at {rate} req/s: {e}", nt.name));
                            done[i] = true;
                            continue;
                        }
                    }
                }
                SweepTarget::Url { authority, addr, path, .. } => (None, *addr, authority.clone(), path.clone()),
            };
            let plan = LoadPlan {
                addr,
                url: format!("http://{host}{}", path.as_deref().unwrap_or("")),
                scenario_name: scenario.name.clone(),
                requests: Arc::new(scenario.requests(&host, path.as_deref(), &headers)),
                mode: Mode::Open {
                    rate,
                    arrivals: match args.arrival {
                        ArrivalArg::Fixed => Arrivals::Fixed,
                        ArrivalArg::Poisson => Arrivals::Poisson,
                    },
                    max_conns: args.max_conns,
                },
                duration: Some(args.duration),
                count: None,
                warmup: args.warmup,
                timeout: args.timeout,
                threads: args.threads.max(1),
                cores: Some(vec![args.load_core]),
                parse_usage: true,
                progress: false,
                target_pids: proc_.as_ref().map(|p| vec![p.pid()]).unwrap_or_default(),
                stop: None,
                chain: scenario.chain(&host, path.as_deref(), &headers),
            };
            let t0_s = session.elapsed().as_secs_f64() + args.warmup.as_secs_f64();
            let measured = execute_recorded(&plan, true)?;
            drop(proc_);
            let mut e = Entry::new(t.name(), Some(rate), step + 1, t0_s, measured);
            e.goodput = Some(slo.goodput(&e.records, e.report.duration_s));
            let pass = passes(&e, args.goodput);
            if !args.json {
                eprintln!("{}", progress_line(&e, pass));
            }
            if !pass && matches!(rates, Rates::Search { .. }) {
                done[i] = true;
            }
            entries.push(e);
            if needs_sim && !wait_sim_idle(&sim_ports, args.timeout) {
                notes.push(format!("simulator still busy {:?} after {} at {rate} req/s", args.timeout, t.name()));
            }
        }
        step += 1;
        if done.iter().all(|d| *d) {
            break;
        }
    }
    if matches!(rates, Rates::Search { .. }) && step >= args.max_steps && done.iter().any(|d| !d) {
        notes.push(format!(
            "--max-steps {} reached before every target missed: capacity is a lower bound",
            args.max_steps
        ));
    }
    let capacity = capacities(&names, &entries, args.goodput);
    let page = Page {
        title: format!("smg-load sweep: {} ({})", scenario.name, names.join(", ")),
        kind: "sweep",
        slo: Some(slo),
        goodput_bar: Some(args.goodput),
        capacity,
        notes,
    };
    if args.json {
        println!("{}", report_dir::summary_json(&page, &entries));
    } else {
        print!("{}", table(&page, &entries, args));
    }
    if let Some(dir) = &args.report {
        report_dir::write(dir, &page, &entries)?;
        eprintln!("report: {}", dir.join("report.html").display());
    }
    Ok(())
}

fn progress_line(e: &Entry, pass: bool) -> String {
    let g = e.goodput.unwrap_or_default();
    format!(
        "{:<12} {:>9} req/s offered  {:>9.0} served  goodput {:>5.1}%  p99 {:.1} ms  errors {}  {}",
        e.target,
        num(e.rate.unwrap_or(0.0)),
        e.report.rps,
        g.fraction * 100.0,
        e.report.latency_ms.as_ref().map_or(0.0, |p| p.p99),
        e.report.errors,
        if pass { "pass" } else { "MISS" }
    )
}

fn table(page: &Page, entries: &[Entry], args: &SweepArgs) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let slo = page.slo.map(|s| s.describe()).unwrap_or_default();
    let _ = writeln!(
        o,
        "sweep {}  SLO {}  goodput bar {:.0}%  {:?} per rate (+{:?} warm-up)",
        args.scenario,
        slo,
        args.goodput * 100.0,
        args.duration,
        args.warmup
    );
    let _ = writeln!(
        o,
        "{:<12} {:>9} {:>9} {:>9} {:>7} {:>24} {:>24} {:>24} {:>10} {:>7}",
        "target",
        "offered",
        "req/s",
        "goodput",
        "good%",
        "e2e p50/p90/p99 ms",
        "ttft p50/p90/p99 ms",
        "itl p50/p90/p99 ms",
        "cpu µs/req",
        "errors"
    );
    let p3 = |p: &Option<crate::load::report::Percentiles>| {
        p.as_ref().map_or_else(|| "-".into(), |p| format!("{}/{}/{}", num(p.p50), num(p.p90), num(p.p99)))
    };
    for e in entries {
        let g = e.goodput.unwrap_or_default();
        let _ = writeln!(
            o,
            "{:<12} {:>9} {:>9.0} {:>9.0} {:>7.1} {:>24} {:>24} {:>24} {:>10} {:>7}",
            e.target,
            num(e.rate.unwrap_or(0.0)),
            e.report.rps,
            g.rps,
            g.fraction * 100.0,
            p3(&e.report.latency_ms),
            p3(&e.report.ttft_ms),
            p3(&e.report.itl_ms),
            e.cpu_us_per_request().map_or_else(|| "-".into(), |c| format!("{c:.2}")),
            e.report.errors
        );
        let mut errs: Vec<String> =
            e.report.status.iter().filter(|(k, _)| !k.starts_with('2')).map(|(k, v)| format!("{k}={v}")).collect();
        errs.extend(e.report.error_codes.iter().map(|(k, v)| format!("{k}={v}")));
        errs.extend(e.report.transport_errors.iter().map(|(k, v)| format!("{k}={v}")));
        if !errs.is_empty() {
            let _ = writeln!(o, "{:<12} errors {}", "", errs.join(" "));
        }
    }
    let _ = writeln!(o, "capacity (highest rate with goodput >= {:.0}%, below the first miss):", args.goodput * 100.0);
    for c in &page.capacity {
        let _ = writeln!(
            o,
            "  {:<12} {:>9} req/s  first miss {:>9}  ratio to {} {}",
            c.target,
            c.rps.map_or_else(|| "<lowest".into(), num),
            c.first_miss_rps.map_or_else(|| "none".into(), num),
            page.capacity.first().map_or("", |f| f.target.as_str()),
            c.ratio_to_first.map_or_else(|| "-".into(), |r| format!("{r:.2}"))
        );
    }
    for n in &page.notes {
        let _ = writeln!(o, "note: {n}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::entry::{Curves, Measured};
    use crate::load::records::Records;
    use crate::load::report::{Report, Stats};
    use crate::load::slo::Goodput;

    fn entry(target: &str, rate: f64, fraction: f64) -> Entry {
        let report = Report::build("s", "u", "open", 1, 1.0, &Stats::default(), vec![]);
        let mut e = Entry::new(
            target,
            Some(rate),
            1,
            0.0,
            Measured { report, records: Records::new(true), curves: Curves::default() },
        );
        e.report.requests = 100;
        e.goodput = Some(Goodput { good: (fraction * 100.0) as u64, total: 100, fraction, rps: 0.0 });
        e
    }

    #[test]
    fn rates_and_capacity() {
        let mut a = SweepArgs::try_parse_from_sweep(&["--search", "100,1.5"]);
        assert_eq!(Rates::parse(&a).unwrap(), Rates::Search { start: 100.0, factor: 1.5 });
        assert_eq!(Rates::parse(&a).unwrap().at(2, 10), Some(225.0));
        assert_eq!(Rates::parse(&a).unwrap().at(10, 10), None);
        a.search = None;
        a.rates = Some("400,100,200".into());
        assert_eq!(Rates::parse(&a).unwrap(), Rates::List(vec![100.0, 200.0, 400.0]));
        a.rates = Some("0".into());
        assert!(Rates::parse(&a).is_err());
        let entries = vec![
            entry("a", 100.0, 1.0),
            entry("b", 100.0, 1.0),
            entry("a", 200.0, 0.995),
            entry("b", 200.0, 0.5),
            entry("a", 400.0, 0.2),
            // A pass after a miss (noise) does not raise capacity.
            entry("b", 400.0, 1.0),
        ];
        let c = capacities(&["a".into(), "b".into()], &entries, 0.99);
        assert_eq!((c[0].rps, c[0].first_miss_rps), (Some(200.0), Some(400.0)));
        assert_eq!((c[1].rps, c[1].first_miss_rps), (Some(100.0), Some(200.0)));
        assert_eq!(c[1].ratio_to_first, Some(0.5));
    }

    impl SweepArgs {
        fn try_parse_from_sweep(extra: &[&str]) -> SweepArgs {
            use clap::Parser;
            #[derive(Parser)]
            struct W {
                #[command(flatten)]
                a: SweepArgs,
            }
            let mut argv = vec!["sweep"];
            argv.extend_from_slice(extra);
            W::parse_from(argv).a
        }
    }
}
