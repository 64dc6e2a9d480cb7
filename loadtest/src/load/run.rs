//! `smg-load run`: turn flags into per-thread plans, run one monoio runtime per (pinned) thread, merge, report.

use std::io::{IsTerminal, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};

use crate::load::chain::Chain;
use crate::load::client::build_request;
use crate::load::cpu;
use crate::load::driver::{Ctx, Progress, ThreadPlan};
use crate::load::entry::{Curves, Entry, Measured, Page};
use crate::load::open_loop::Arrivals;
use crate::load::records::Records;
use crate::load::report::{CpuUse, Report, Stats};
use crate::load::report_dir;
use crate::load::scenario::Scenario;
use crate::load::trace::Trace;
use crate::load::{closed_loop, open_loop};
use crate::rt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ArrivalArg {
    Fixed,
    Poisson,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Target base URL, e.g. http://127.0.0.1:30000 (a path here overrides the scenario's).
    #[arg(long)]
    pub url: String,
    /// Scenario file or name in loadtest/scenarios (chat-1k, chat-200k, sse-long, multi-turn, mixed-models,
    /// generate, responses-1k, responses-chain10, responses-fresh).
    #[arg(long, default_value = "chat-1k")]
    pub scenario: String,
    /// Replace the scenario's model name.
    #[arg(long)]
    pub model: Option<String>,
    /// Extra request header, "name: value"; repeatable.
    #[arg(long = "header")]
    pub headers: Vec<String>,
    /// Closed loop with this many connections (the default mode, 64).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Open loop at this many requests/s in total.
    #[arg(long)]
    pub rate: Option<f64>,
    #[arg(long, value_enum, default_value = "poisson")]
    pub arrival: ArrivalArg,
    /// Open loop: connections per thread at most (due requests queue beyond that).
    #[arg(long, default_value_t = 1024)]
    pub max_conns: usize,
    /// Measured run time ("10s", "500ms"); default 10s unless --requests is given.
    #[arg(long, value_parser = rt::parse_duration)]
    pub duration: Option<Duration>,
    /// Stop after this many requests in total.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Unrecorded warm-up before the measured window.
    #[arg(long, value_parser = rt::parse_duration, default_value = "0s")]
    pub warmup: Duration,
    /// Per-request timeout.
    #[arg(long, value_parser = rt::parse_duration, default_value = "60s")]
    pub timeout: Duration,
    /// Load threads (one runtime each).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Cores to pin load threads to ("0", "0-1").
    #[arg(long)]
    pub cores: Option<String>,
    /// Report CPU µs per request of this process tree (utime+stime from /proc); repeatable.
    #[arg(long = "target-pid")]
    pub target_pids: Vec<u32>,
    /// Skip reading usage from non-streaming bodies (saves a JSON lookup per response).
    #[arg(long)]
    pub no_usage: bool,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Live progress line on stderr (default: when stderr is a terminal).
    #[arg(long)]
    pub progress: bool,

    // --- trace replay (load/trace.rs) ---
    /// Replay a trace: Azure LLM inference CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or
    /// Mooncake JSONL (timestamp, input_length, output_length, hash_ids). Arrivals, prompt and
    /// output lengths (and shared prefixes) come from the file; the scenario still picks API,
    /// model and streaming. Open loop; ends with the trace unless --requests / --duration.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<String>,
    /// Trace replay speed: 2 sends twice as fast as recorded.
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Prompt bytes per token when sizing trace prompts (smg-sim's --bytes-per-token).
    #[arg(long, default_value_t = 4)]
    pub trace_bytes_per_token: usize,
    /// Send only part K of N of the trace: requests K, K+N, K+2N, … (0-based, in trace order),
    /// at their trace times and with their own prompts. N runs with parts 0/N … N-1/N, each
    /// against another gateway, are a round-robin client in front of N gateway replicas.
    #[arg(long, value_name = "K/N", value_parser = parse_part)]
    pub trace_part: Option<(usize, usize)>,
    /// Write per-request records (records.csv), summary.json and report.html into this directory.
    #[arg(long, value_name = "DIR")]
    pub report: Option<std::path::PathBuf>,
}

/// Load mode of a run.
#[derive(Clone, Debug)]
pub enum Mode {
    Closed { concurrency: usize },
    Open { rate: f64, arrivals: Arrivals, max_conns: usize },
}

/// Everything one run needs, independent of the command line (compare builds these too).
#[derive(Clone)]
pub struct LoadPlan {
    pub addr: SocketAddr,
    pub url: String,
    pub scenario_name: String,
    pub requests: Arc<Vec<bytes::Bytes>>,
    pub mode: Mode,
    pub duration: Option<Duration>,
    pub count: Option<u64>,
    pub warmup: Duration,
    pub timeout: Duration,
    pub threads: usize,
    pub cores: Option<Vec<usize>>,
    pub parse_usage: bool,
    pub progress: bool,
    pub target_pids: Vec<u32>,
    /// Ends the run when set (with neither `duration` nor `count` the run lasts until then).
    pub stop: Option<Arc<AtomicBool>>,
    /// A chained scenario's turns, built per send off the answers (`Scenario::chain`); its
    /// `requests` are then only a readiness probe's.
    pub chain: Option<Arc<Chain>>,
}

/// Splits "http://host:port/path" into (host:port, optional path).
pub fn split_url(url: &str) -> Result<(String, Option<String>), String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("only http:// URLs are supported: {url:?}"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(rest[i..].to_string()).filter(|p| p != "/")),
        None => (rest, None),
    };
    let authority = if authority.contains(':') { authority.to_string() } else { format!("{authority}:80") };
    Ok((authority, path))
}

pub fn resolve(authority: &str) -> Result<SocketAddr, String> {
    authority
        .to_socket_addrs()
        .map_err(|e| format!("resolve {authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("resolve {authority}: no address"))
}

// === impl RunArgs ===

impl RunArgs {
    pub fn plan(&self) -> Result<LoadPlan, String> {
        let mut scenario = Scenario::load(&self.scenario)?;
        if let Some(m) = &self.model {
            scenario.model = m.clone();
            scenario.models.clear();
        }
        let (authority, path) = split_url(&self.url)?;
        let addr = resolve(&authority)?;
        if let Some(file) = &self.trace {
            return self.trace_plan(file, &scenario, &authority, path.as_deref(), addr);
        }
        let requests = scenario.requests(&authority, path.as_deref(), &self.headers);
        let chain = scenario.chain(&authority, path.as_deref(), &self.headers);
        let mode = match (self.rate, self.concurrency) {
            (Some(_), Some(_)) => return Err("give --rate (open loop) or --concurrency (closed loop), not both".into()),
            (Some(rate), None) if rate > 0.0 => Mode::Open {
                rate,
                arrivals: match self.arrival {
                    ArrivalArg::Fixed => Arrivals::Fixed,
                    ArrivalArg::Poisson => Arrivals::Poisson,
                },
                max_conns: self.max_conns,
            },
            (Some(_), None) => return Err("--rate must be positive".into()),
            (None, c) => Mode::Closed { concurrency: c.unwrap_or(64).max(1) },
        };
        let duration = match (self.duration, self.requests) {
            (None, None) => Some(Duration::from_secs(10)),
            (d, _) => d,
        };
        let plan = self.plan_from(addr, scenario.name.clone(), requests, mode, duration, self.requests)?;
        Ok(LoadPlan { chain, ..plan })
    }

    /// The plan's parts every kind of run takes from the command line alike.
    fn plan_from(
        &self,
        addr: SocketAddr,
        scenario_name: String,
        requests: Vec<bytes::Bytes>,
        mode: Mode,
        duration: Option<Duration>,
        count: Option<u64>,
    ) -> Result<LoadPlan, String> {
        Ok(LoadPlan {
            addr,
            url: self.url.clone(),
            scenario_name,
            requests: Arc::new(requests),
            mode,
            duration,
            count,
            warmup: self.warmup,
            timeout: self.timeout,
            threads: self.threads.max(1),
            cores: self.cores.as_deref().map(rt::parse_cores).transpose()?,
            parse_usage: !self.no_usage,
            progress: self.progress || std::io::stderr().is_terminal(),
            target_pids: self.target_pids.clone(),
            stop: None,
            chain: None,
        })
    }

    /// A trace run: one request per trace line, each sent at its recorded offset ÷ --speedup.
    fn trace_plan(
        &self,
        file: &str,
        scenario: &Scenario,
        authority: &str,
        path: Option<&str>,
        addr: SocketAddr,
    ) -> Result<LoadPlan, String> {
        if self.rate.is_some() || self.concurrency.is_some() {
            return Err("--trace sets the arrivals: drop --rate / --concurrency".into());
        }
        if scenario.api == "responses" {
            return Err(format!(
                "--trace: scenario {:?} is a Responses one; traces replay chat, completions and generate prompts",
                scenario.name
            ));
        }
        if self.speedup.is_nan() || self.speedup <= 0.0 {
            return Err("--speedup must be positive".into());
        }
        let trace = Trace::load(file)?;
        let path = path.unwrap_or(scenario.path());
        let (k, n) = self.trace_part.unwrap_or((0, 1));
        let mine = |i: &usize| i % n == k;
        let requests: Vec<bytes::Bytes> = trace
            .bodies(scenario, self.trace_bytes_per_token)
            .iter()
            .enumerate()
            .filter(|(i, _)| mine(i))
            .map(|(_, b)| build_request("POST", path, authority, &self.headers, b))
            .collect();
        if requests.is_empty() {
            return Err(format!("--trace-part {k}/{n}: no request of the trace's {} is in it", trace.entries.len()));
        }
        let schedule: Vec<Duration> =
            trace.schedule(self.speedup).iter().enumerate().filter(|(i, _)| mine(i)).map(|(_, d)| *d).collect();
        let name = format!("{} trace {file} ({}, x{})", scenario.name, trace.format, self.speedup);
        let mode = Mode::Open {
            rate: trace.rate(self.speedup) / n as f64,
            arrivals: Arrivals::Trace(Arc::new(schedule)),
            max_conns: self.max_conns,
        };
        let count = Some(self.requests.unwrap_or(requests.len() as u64));
        self.plan_from(addr, name, requests, mode, self.duration, count)
    }
}

/// `K/N` with K < N.
fn parse_part(s: &str) -> Result<(usize, usize), String> {
    let (k, n) = s.split_once('/').ok_or("want K/N, e.g. 0/4")?;
    let (k, n): (usize, usize) = (k.parse().map_err(|_| "K: a number")?, n.parse().map_err(|_| "N: a number")?);
    if n == 0 || k >= n {
        return Err(format!("{s}: want 0 <= K < N"));
    }
    Ok((k, n))
}

/// `smg-load run`: run, print, and write the report directory when asked.
pub fn cli(args: &RunArgs) -> Result<(), String> {
    let plan = args.plan()?;
    let m = execute_recorded(&plan, args.report.is_some())?;
    if args.json {
        println!("{}", m.report.to_json());
    } else {
        print!("{}", m.report.to_table());
    }
    if let Some(dir) = &args.report {
        let rate = match plan.mode {
            Mode::Open { rate, .. } => Some(rate),
            Mode::Closed { .. } => None,
        };
        let entry = Entry::new(&args.url, rate, 1, 0.0, m);
        let page = Page { title: format!("smg-load run: {}", args.url), kind: "run", ..Default::default() };
        report_dir::write(dir, &page, &[entry])?;
        eprintln!("report: {}", dir.join("report.html").display());
    }
    Ok(())
}

/// Runs the plan on its threads and builds the report.
pub fn execute(plan: &LoadPlan) -> Result<Report, String> {
    execute_recorded(plan, false).map(|m| m.report)
}

/// Runs the plan; with `record`, every measured request also leaves a row.
pub fn execute_recorded(plan: &LoadPlan, record: bool) -> Result<Measured, String> {
    let progress = Arc::new(Progress::default());
    let cpu_before: Vec<Option<cpu::Ticks>> = plan.target_pids.iter().map(|&p| cpu::tree_ticks(p)).collect();
    let wall = Instant::now();
    let mut joins = Vec::new();
    for t in 0..plan.threads {
        let share = |n: u64| n / plan.threads as u64 + u64::from((t as u64) < n % plan.threads as u64);
        let tp = ThreadPlan {
            addr: plan.addr,
            requests: plan.requests.clone(),
            thread_index: t,
            threads: plan.threads,
            duration: plan.duration,
            count: plan.count.map(share),
            warmup: plan.warmup,
            timeout: plan.timeout,
            parse_usage: plan.parse_usage,
            progress: progress.clone(),
            stop: plan.stop.clone(),
            record,
            chain: plan.chain.clone(),
        };
        let mode = match &plan.mode {
            Mode::Closed { concurrency } => Mode::Closed { concurrency: share(*concurrency as u64).max(1) as usize },
            Mode::Open { rate, arrivals, max_conns } => {
                Mode::Open { rate: rate / plan.threads as f64, arrivals: arrivals.clone(), max_conns: *max_conns }
            }
        };
        let core = plan.cores.as_ref().map(|c| c[t % c.len()]);
        let join = std::thread::Builder::new()
            .name(format!("smg-load-{t}"))
            .spawn(move || {
                if let Some(c) = core {
                    rt::pin_to(c);
                }
                let waited_before = cpu::thread_cpu_wait_ns();
                let out = rt::block_on(async move {
                    let ctx = Rc::new(Ctx::new(tp));
                    match mode {
                        Mode::Closed { concurrency } => closed_loop::run(ctx.clone(), concurrency).await,
                        Mode::Open { rate, arrivals, max_conns } => {
                            open_loop::run(ctx.clone(), rate, arrivals, max_conns).await
                        }
                    }
                    let secs = ctx.measured_secs();
                    let stats = std::mem::take(&mut *ctx.stats.borrow_mut());
                    let records = std::mem::take(&mut *ctx.records.borrow_mut());
                    (stats, records, secs)
                })
                .map_err(|e| format!("runtime: {e}"));
                out.map(|(mut stats, records, secs)| {
                    if let (Some(a), Some(b)) = (waited_before, cpu::thread_cpu_wait_ns()) {
                        stats.cpu_wait_us = b.saturating_sub(a) / 1000;
                    }
                    (stats, records, secs)
                })
            })
            .map_err(|e| format!("spawn: {e}"))?;
        joins.push(join);
    }
    let mut last_print = Instant::now();
    let mut last_done = 0u64;
    while !joins.iter().all(|j| j.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        if plan.progress && last_print.elapsed() >= Duration::from_secs(1) {
            let done = progress.done.load(Ordering::Relaxed);
            let rate = (done - last_done) as f64 / last_print.elapsed().as_secs_f64();
            let _ = write!(
                std::io::stderr(),
                "\r[{:>6.1}s] {done} requests  {rate:>9.0} req/s  {} errors   ",
                wall.elapsed().as_secs_f64(),
                progress.errors.load(Ordering::Relaxed)
            );
            last_print = Instant::now();
            last_done = done;
        }
    }
    if plan.progress {
        let _ = writeln!(std::io::stderr());
    }
    let wall_secs = wall.elapsed().as_secs_f64();
    let mut merged = Stats::default();
    let mut records = Records::new(record);
    let mut secs: f64 = 0.0;
    for j in joins {
        let (s, r, t) = j.join().map_err(|_| "a load thread panicked".to_string())??;
        merged.merge(&s);
        records.merge(r);
        secs = secs.max(t);
    }
    let all_requests = progress.done.load(Ordering::Relaxed).max(1);
    let target_cpu = plan
        .target_pids
        .iter()
        .zip(cpu_before)
        .filter_map(|(&pid, before)| {
            let used = cpu::tree_ticks(pid)?.since(before?);
            let us = cpu::ticks_to_us(used.total());
            // All requests, warm-up included: the CPU window spans the whole run.
            let per_request = |ticks: u64| cpu::ticks_to_us(ticks) / all_requests as f64;
            Some(CpuUse {
                pid,
                cpu_ms: us / 1000.0,
                cpu_us_per_request: per_request(used.total()),
                user_us_per_request: per_request(used.user),
                system_us_per_request: per_request(used.system),
                cpu_percent: us / (wall_secs * 1e6) * 100.0,
            })
        })
        .collect();
    let mode = match &plan.mode {
        Mode::Closed { concurrency } => format!("closed c={concurrency}"),
        Mode::Open { rate, arrivals: Arrivals::Trace(_), .. } => format!("open trace, mean {rate:.1} rps"),
        Mode::Open { rate, arrivals, .. } => format!("open {rate} rps {arrivals:?}"),
    };
    let report = Report::build(&plan.scenario_name, &plan.url, &mode, plan.threads, secs, &merged, target_cpu);
    Ok(Measured { report, records, curves: Curves::of(&merged) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_parts() {
        assert_eq!(parse_part("1/4"), Ok((1, 4)));
        assert!(parse_part("4/4").is_err());
        assert!(parse_part("0/0").is_err());
        assert!(parse_part("1").is_err());
    }

    #[test]
    fn urls() {
        assert_eq!(split_url("http://127.0.0.1:30000").unwrap(), ("127.0.0.1:30000".into(), None));
        assert_eq!(split_url("http://h/v1/completions").unwrap(), ("h:80".into(), Some("/v1/completions".into())));
        assert!(split_url("https://h").is_err());
    }
}
