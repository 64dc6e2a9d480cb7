//! `smg-load failover`: how long after a worker dies does the gateway stop routing to it?
//!
//! Per gateway configuration (one `--gateway-args` each): start the gateway in front of one
//! stable simulated worker, keep a closed-loop background load of small chat requests on it,
//! then per trial register a fresh simulated worker through `POST /workers`, wait until it is
//! routable and has served requests, kill it (`/sim/control {"die":true}`) and poll
//! `GET /workers/{id}` every millisecond until it is no longer routable (status not "ready" or
//! breaker "open"). That interval is when the control thread published a snapshot without the
//! worker; shards pick it up on their next request. Then `DELETE` it and wait for 404. The
//! background load's non-2xx answers and transport errors over all trials are the
//! client-visible cost of the failover.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use crate::load::blocking::{self, Client, WorkerState};
use crate::load::compare;
use crate::load::procs::{self, Proc};
use crate::load::report::Report;
use crate::load::run::{execute, LoadPlan, Mode};
use crate::load::scenario::Scenario;
use crate::rt;

#[derive(Args, Debug, Clone)]
pub struct FailoverArgs {
    /// Gateway flags of one configuration, space separated (e.g. "--health-check-interval-secs
    /// 1 --disable-circuit-breaker"); repeat for more configurations, each measured on a fresh
    /// gateway. `--policy round_robin`, `--prometheus-port 0` and `--drain-settle-secs 0` are
    /// added unless given.
    #[arg(long = "gateway-args", allow_hyphen_values = true)]
    pub gateway_args: Vec<String>,
    /// Trials (worker deaths) per configuration.
    #[arg(long, default_value_t = 20)]
    pub trials: usize,
    /// Background closed-loop connections to the gateway.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Model every simulated worker serves and the load asks for.
    #[arg(long, default_value = "sim-model")]
    pub model: String,
    /// Extra smg-sim flags for every simulated worker, space separated. The default TTFT keeps
    /// the load near 3k req/s, leaving CPU for the gateway's control thread on a small box.
    #[arg(long, default_value = "--ttft-ms 5", allow_hyphen_values = true)]
    pub sim_args: String,
    /// Longest wait for a dead worker to be taken out of routing; a trial past it counts as a timeout.
    #[arg(long, value_parser = rt::parse_duration, default_value = "120s")]
    pub trial_timeout: Duration,
    /// Time between polls of GET /workers/{id} after the kill.
    #[arg(long, value_parser = rt::parse_duration, default_value = "1ms")]
    pub poll: Duration,
    /// Gateway binary (default: $SMG_BIN, else target/release/smg of this workspace).
    #[arg(long)]
    pub gateway_bin: Option<PathBuf>,
    /// smg-sim binary (default: next to this executable).
    #[arg(long)]
    pub sim_bin: Option<PathBuf>,
    /// Print rows as JSON.
    #[arg(long)]
    pub json: bool,
}

/// One configuration's result.
#[derive(Serialize, Clone, Debug)]
pub struct Row {
    /// The flags the gateway ran with, after the ones this command adds.
    pub gateway_flags: String,
    pub trials: usize,
    /// Trials whose worker was still routable after `--trial-timeout`.
    pub timeouts: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// Every detection, in trial order (ms).
    pub detect_ms: Vec<f64>,
    /// What took the worker out, per trial: "breaker" or the status it reached.
    pub caught_by: Vec<String>,
    /// Background requests over the whole run and the client-visible failures among them.
    pub requests: u64,
    pub errors: u64,
    /// Failures by status or transport error, when there were any.
    pub error_kinds: Vec<String>,
}

/// How a trial ended.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Out { after: Duration, cause: String },
    Timeout,
}

/// Nearest-rank percentile of sorted values (q in 0..=1): the smallest value with at least
/// q of the values at or below it; None when empty.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// True when `flags` sets `name` (as `--name v` or `--name=v`).
pub fn has_flag(flags: &[String], name: &str) -> bool {
    flags.iter().any(|f| f == name || f.strip_prefix(name).is_some_and(|rest| rest.starts_with('=')))
}

/// The user's flags after the defaults this measurement needs and the user did not set:
/// round robin so a new worker gets traffic at once (cache_aware would keep prefixes on the
/// stable worker), no metrics listener (no port clash), and DELETE removing without a settle.
pub fn gateway_flags(user: &str) -> Vec<String> {
    let user: Vec<String> = user.split_whitespace().map(str::to_string).collect();
    let mut out = Vec::new();
    for (name, value) in [("--policy", "round_robin"), ("--prometheus-port", "0"), ("--drain-settle-secs", "0")] {
        if !has_flag(&user, name) {
            out.push(name.to_string());
            out.push(value.to_string());
        }
    }
    out.extend(user);
    out
}

/// Polls `f` every `every` until it yields a value or `within` has passed.
fn wait_for<T>(
    within: Duration,
    every: Duration,
    what: &str,
    mut f: impl FnMut() -> Result<Option<T>, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(format!("{what}: not within {within:?}"));
        }
        std::thread::sleep(every);
    }
}

/// Everything one configuration's trials share.
struct Bench<'a> {
    args: &'a FailoverArgs,
    sim_bin: PathBuf,
    admin: Client,
}

// === impl Bench ===

impl Bench<'_> {
    fn start_sim(&self) -> Result<(Proc, u16), String> {
        let mut cmd = Command::new(&self.sim_bin);
        cmd.args(["--host", "127.0.0.1", "--ports", "0", "--model", &self.args.model]);
        cmd.args(self.args.sim_args.split_whitespace());
        let (p, ports) = procs::spawn_sim(cmd, &self.sim_bin)?;
        Ok((p, ports[0]))
    }

    fn worker_state(&mut self, id: &str) -> Result<Option<WorkerState>, String> {
        let r = self.admin.call("GET", &format!("/workers/{id}"), None)?;
        match r.status {
            200 => WorkerState::parse(&r.body).map(Some),
            404 => Ok(None),
            s => Err(format!("GET /workers/{id}: {s} {}", String::from_utf8_lossy(&r.body))),
        }
    }

    /// One worker death, from registration to removal.
    fn trial(&mut self) -> Result<Outcome, String> {
        let setup = Duration::from_secs(30);
        let (_sim, port) = self.start_sim()?;
        let sim_addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let body = format!("{{\"url\":\"http://127.0.0.1:{port}\"}}");
        let r = self.admin.call("POST", "/workers", Some(&body))?;
        if r.status != 202 {
            return Err(format!("POST /workers: {} {}", r.status, String::from_utf8_lossy(&r.body)));
        }
        let id = blocking::json_str(&r.body, "worker_id").ok_or("POST /workers: no worker_id")?;
        let mut sim = Client::new(sim_addr, Duration::from_secs(2));
        wait_for(setup, Duration::from_millis(10), "new worker routable and serving", || {
            if !self.worker_state(&id)?.is_some_and(|w| w.routable()) {
                return Ok(None);
            }
            let stats = sim.call("GET", "/sim/stats", None)?;
            Ok(blocking::json_u64(&stats.body, "inference_requests").filter(|&n| n > 0))
        })?;
        drop(sim);

        // The die request's own reply may never leave (the worker drops every connection at
        // once), so it is written and not read; the stream stays open until the trial ends.
        let mut killer = TcpStream::connect_timeout(&sim_addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
        let die = blocking::request("POST", "/sim/control", "sim", Some(r#"{"die":true}"#));
        let t0 = Instant::now();
        std::io::Write::write_all(&mut killer, &die).map_err(|e| format!("die: {e}"))?;
        let outcome = loop {
            // The time is taken when the answer is read: an upper bound, late by at most one
            // poll interval plus one admin round trip.
            match self.worker_state(&id)? {
                Some(w) if w.routable() => {}
                Some(w) => break Outcome::Out { after: t0.elapsed(), cause: w.cause().to_string() },
                None => return Err(format!("worker {id} vanished before it was taken out")),
            }
            if t0.elapsed() >= self.args.trial_timeout {
                break Outcome::Timeout;
            }
            std::thread::sleep(self.args.poll);
        };
        // A worker still accepting would make the number meaningless.
        wait_for(Duration::from_secs(2), Duration::from_millis(5), "killed worker's port to close", || {
            Ok(TcpStream::connect_timeout(&sim_addr, Duration::from_millis(200)).is_err().then_some(()))
        })?;
        drop(killer);

        let r = self.admin.call("DELETE", &format!("/workers/{id}"), None)?;
        if r.status != 202 {
            return Err(format!("DELETE /workers/{id}: {} {}", r.status, String::from_utf8_lossy(&r.body)));
        }
        wait_for(setup, Duration::from_millis(10), "deleted worker gone (404)", || {
            Ok(self.worker_state(&id)?.is_none().then_some(()))
        })?;
        Ok(outcome)
    }
}

/// The background load: closed loop until `stop` is set.
fn start_load(
    args: &FailoverArgs,
    port: u16,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<Report, String>> {
    let host = format!("127.0.0.1:{port}");
    let scenario = load_scenario(&args.model);
    let plan = LoadPlan {
        addr: ([127, 0, 0, 1], port).into(),
        url: format!("http://{host}"),
        scenario_name: scenario.name.clone(),
        requests: Arc::new(scenario.requests(&host, None, &[])),
        mode: Mode::Closed { concurrency: args.concurrency.max(1) },
        duration: None,
        count: None,
        warmup: Duration::ZERO,
        timeout: Duration::from_secs(30),
        threads: 1,
        cores: None,
        parse_usage: false,
        progress: false,
        target_pids: Vec::new(),
        stop: Some(stop),
        chain: None,
    };
    std::thread::spawn(move || execute(&plan))
}

/// Small non-streaming chat requests: the load is there to exercise routing, not bandwidth.
fn load_scenario(model: &str) -> Scenario {
    Scenario {
        name: "failover-chat".into(),
        model: model.into(),
        include_usage: false,
        max_tokens: 4,
        user_bytes: 200,
        variants: 16,
        ..Scenario::default()
    }
}

/// One configuration: a fresh gateway, the background load, the trials.
fn run_config(args: &FailoverArgs, user_flags: &str, gateway: &Path, stable_port: u16) -> Result<Row, String> {
    let flags = gateway_flags(user_flags);
    let port = procs::free_port()?;
    let mut cmd = Command::new(gateway);
    cmd.args(["launch", "--host", "127.0.0.1", "--port", &port.to_string(), "--worker-urls"]);
    cmd.arg(format!("http://127.0.0.1:{stable_port}"));
    cmd.args(&flags);
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start {}: {e}", gateway.display()))?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let host = format!("127.0.0.1:{port}");
    let probe = load_scenario(&args.model).requests(&host, None, &[]).swap_remove(0);
    if let Err(e) = procs::wait_ready(addr, &probe, &mut child, Duration::from_secs(60)) {
        drop(Proc::new(child));
        return Err(format!("gateway {}: {e}", flags.join(" ")));
    }
    let _gateway = Proc::new(child);

    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(args, port, stop.clone());
    let mut bench = Bench {
        args,
        sim_bin: procs::sim_bin(args.sim_bin.as_deref())?,
        admin: Client::new(addr, Duration::from_secs(5)),
    };
    let mut outcomes = Vec::new();
    let mut failure = None;
    for i in 0..args.trials.max(1) {
        match bench.trial() {
            Ok(o) => {
                match &o {
                    Outcome::Out { after, cause } => {
                        eprintln!("trial {:>2}: out after {:>9.3} ms ({cause})", i + 1, after.as_secs_f64() * 1e3)
                    }
                    Outcome::Timeout => eprintln!("trial {:>2}: still routable after {:?}", i + 1, args.trial_timeout),
                }
                outcomes.push(o);
            }
            Err(e) => {
                failure = Some(format!("trial {}: {e}", i + 1));
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let report = load.join().map_err(|_| "the load thread panicked".to_string())??;
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(row(flags.join(" "), &outcomes, &report))
}

fn row(gateway_flags: String, outcomes: &[Outcome], report: &Report) -> Row {
    let mut detect_ms = Vec::new();
    let mut caught_by = Vec::new();
    for o in outcomes {
        if let Outcome::Out { after, cause } = o {
            detect_ms.push(after.as_secs_f64() * 1e3);
            caught_by.push(cause.clone());
        }
    }
    let mut sorted = detect_ms.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let error_kinds = report
        .status
        .iter()
        .filter(|(s, _)| !s.starts_with('2'))
        .map(|(s, n)| format!("{s}:{n}"))
        .chain(report.transport_errors.iter().map(|(k, n)| format!("{k}:{n}")))
        .collect();
    Row {
        gateway_flags,
        trials: outcomes.len(),
        timeouts: outcomes.iter().filter(|o| **o == Outcome::Timeout).count(),
        p50_ms: percentile(&sorted, 0.50),
        p99_ms: percentile(&sorted, 0.99),
        max_ms: sorted.last().copied(),
        detect_ms,
        caught_by,
        requests: report.requests,
        errors: report.errors,
        error_kinds,
    }
}

/// "breaker 20" / "not_ready 19, breaker 1": how often each mechanism won.
fn causes(caught_by: &[String]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for c in caught_by {
        match counts.iter_mut().find(|(k, _)| k == c) {
            Some((_, n)) => *n += 1,
            None => counts.push((c, 1)),
        }
    }
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    let parts: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

pub fn run(args: &FailoverArgs) -> Result<(), String> {
    let gateway = compare::gateway_bin(args.gateway_bin.as_deref());
    if !gateway.is_file() {
        return Err(format!("gateway binary {} not found (give --gateway-bin or $SMG_BIN)", gateway.display()));
    }
    let sim_bin = procs::sim_bin(args.sim_bin.as_deref())?;
    let mut stable = Command::new(&sim_bin);
    stable.args(["--host", "127.0.0.1", "--ports", "0", "--model", &args.model]);
    stable.args(args.sim_args.split_whitespace());
    let (_stable, ports) = procs::spawn_sim(stable, &sim_bin)?;
    let configs = if args.gateway_args.is_empty() { vec![String::new()] } else { args.gateway_args.clone() };
    let mut rows = Vec::new();
    for c in &configs {
        eprintln!("config: {}", gateway_flags(c).join(" "));
        rows.push(run_config(args, c, &gateway, ports[0])?);
    }
    if args.json {
        println!("{}", sonic_rs::to_string_pretty(&rows).map_err(|e| e.to_string())?);
        return Ok(());
    }
    println!(
        "failover: time from worker death to not routable (GET /workers/{{id}} polled every {:?}), {} trials per config, background closed loop c={} (model {}, sim {:?})",
        args.poll, args.trials, args.concurrency, args.model, args.sim_args
    );
    println!(
        "{:<3} {:>6} {:>8} {:>10} {:>10} {:>10} {:>10} {:>7}  caught by",
        "#", "trials", "timeouts", "p50 ms", "p99 ms", "max ms", "requests", "errors"
    );
    let f = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |x| format!("{x:.1}"));
    for (i, r) in rows.iter().enumerate() {
        println!(
            "{:<3} {:>6} {:>8} {:>10} {:>10} {:>10} {:>10} {:>7}  {}",
            i + 1,
            r.trials,
            r.timeouts,
            f(r.p50_ms),
            f(r.p99_ms),
            f(r.max_ms),
            r.requests,
            r.errors,
            causes(&r.caught_by)
        );
    }
    for (i, r) in rows.iter().enumerate() {
        println!("{:<3} smg launch {}", i + 1, r.gateway_flags);
        if !r.error_kinds.is_empty() {
            println!("    errors: {}", r.error_kinds.join(" "));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.50), Some(10.0));
        assert_eq!(percentile(&v, 0.99), Some(20.0));
        assert_eq!(percentile(&v, 1.0), Some(20.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        let h: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(percentile(&h, 0.99), Some(198.0));
        assert_eq!(percentile(&[7.0], 0.5), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn flags_add_only_what_is_missing() {
        assert_eq!(
            gateway_flags("--health-check-interval-secs 1 --disable-circuit-breaker").join(" "),
            "--policy round_robin --prometheus-port 0 --drain-settle-secs 0 --health-check-interval-secs 1 --disable-circuit-breaker"
        );
        assert_eq!(
            gateway_flags("--policy=random --prometheus-port 9 --drain-settle-secs 1").join(" "),
            "--policy=random --prometheus-port 9 --drain-settle-secs 1"
        );
        let f: Vec<String> = vec!["--policyx".into()];
        assert!(!has_flag(&f, "--policy"));
    }

    #[test]
    fn rows_and_causes() {
        let ms = |n| Duration::from_millis(n);
        let out = |n, c: &str| Outcome::Out { after: ms(n), cause: c.into() };
        let outcomes = vec![out(30, "breaker"), Outcome::Timeout, out(10, "not_ready"), out(20, "breaker")];
        let report = Report::build("s", "u", "m", 1, 1.0, &crate::load::report::Stats::default(), Vec::new());
        let r = row("--x".into(), &outcomes, &report);
        assert_eq!((r.trials, r.timeouts), (4, 1));
        assert_eq!((r.p50_ms, r.p99_ms, r.max_ms), (Some(20.0), Some(30.0), Some(30.0)));
        assert_eq!(r.detect_ms, vec![30.0, 10.0, 20.0]);
        assert_eq!(causes(&r.caught_by), "breaker 2, not_ready 1");
        assert_eq!(causes(&[]), "-");
    }
}
