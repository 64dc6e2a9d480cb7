//! `smg-load compare`: one scenario against several targets, interleaved A B A B, with the pinning from DESIGN.md, then a ratio table.
//!
//! Targets: `direct` (the simulator itself), `smg` (this gateway's binary), `nginx` (reverse
//! proxy with upstream keep-alive) and `smg-python` (the `pip install smg` launcher). Missing
//! peers are skipped with a note, so the comparison always runs. The system under test is pinned
//! to `--sut-core`; the simulator and the load generator share `--load-core`. Each target is
//! started fresh per round and stopped after it, so no target warms caches for another. The
//! workers behind the targets are load/fleet.rs's: whole-request ones, or prefill/decode pairs
//! (`--pd`), which only the gateway targets can drive.
//!
//! Responses scenarios (`responses-1k`, `responses-chain10`, …) need `--grpc` or
//! `--provider`: the gateway serves that API itself on gRPC workers, and keeps its history for
//! a cloud provider that keeps none (smg-sim's, with `--provider`), storing each turn and
//! chaining the next off it, while the simulator's engine workers serve no `/v1/responses`;
//! compare refuses them without either. Of the targets, only the gateways (smg, smg-base, smg-python) can run them: `direct`
//! and `nginx` hold no state and are skipped with a note saying so. A chained scenario's rows
//! also count its chained turns and the conversations cut short.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use crate::load::entry::{Entry, Page};
use crate::load::fleet::{request_headers, Fleet, FleetArgs};
use crate::load::pd_fleet::{Handoffs, PdRuntime};
use crate::load::procs::{free_port, on_path, pinned, wait_ready, Proc, TempDir};
use crate::load::report::Report;
use crate::load::report_dir;
use crate::load::run::{execute_recorded, LoadPlan, Mode};
use crate::load::scenario::Scenario;
use crate::rt;

/// How long a request may take before it counts as a timeout (and, with `--pd`, how long a
/// decode waits for its KV: the same patience).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What the systems under test are and how they start: the simulated workers behind them,
/// the gateway builds and their flags, nginx, SMG itself (`compare` and `sweep` share it).
#[derive(Args, Debug, Clone)]
pub struct SutArgs {
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Gateway binary (default: $SMG_BIN, else target/release/smg of this workspace).
    #[arg(long)]
    pub gateway_bin: Option<PathBuf>,
    /// A second gateway build for the `smg-base` target, to A/B a change against (e.g. the
    /// previous commit's binary) in the same interleaved rounds.
    #[arg(long)]
    pub base_bin: Option<PathBuf>,
    /// Extra flags for the `smg` target, space separated (e.g. "--api-key k
    /// --max-concurrent-requests 100000"): A/B a feature on against `smg-base` with it off.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub smg_args: String,
    /// Extra flags for the `smg-base` target, space separated.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub base_args: String,
    /// Request header line sent to every target ("Name: value"), repeatable.
    #[arg(long = "header", value_name = "NAME: VALUE")]
    pub headers: Vec<String>,
    /// nginx binary (default: nginx on PATH or /usr/sbin/nginx).
    #[arg(long)]
    pub nginx_bin: Option<PathBuf>,
    /// Python SMG launcher (default: an `smg` script on PATH).
    #[arg(long)]
    pub smg_python_bin: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// Scenario file or name; `ws-1k` is the WebSocket relay (see load/ws_compare.rs).
    #[arg(long, default_value = "chat-1k")]
    pub scenario: String,
    /// Replace the scenario's model name. With --provider, an OpenAI name (`gpt-4o`): SMG
    /// 1.13 sends its own engine fields (`top_k`) to a provider, which refuses them, unless
    /// the model is named as OpenAI's are.
    #[arg(long)]
    pub model: Option<String>,
    /// Targets: direct, smg, smg-base, nginx, nginx-log (nginx with its own buffered access
    /// log, the match for smg's default configuration), smg-python. Each round runs them all,
    /// starting one further along the list than the round before.
    #[arg(long, default_value = "direct,smg,nginx,smg-python")]
    pub targets: String,
    /// Rounds; each round runs every target once (use a multiple of the target count so each
    /// target leads equally often).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Measured time per target per round.
    #[arg(long, value_parser = rt::parse_duration, default_value = "5s")]
    pub duration: Duration,
    /// Unrecorded warm-up per target per round.
    #[arg(long, value_parser = rt::parse_duration, default_value = "1s")]
    pub warmup: Duration,
    /// Closed-loop connections.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Core of the system under test.
    #[arg(long, default_value_t = 1)]
    pub sut_core: usize,
    /// Core of the load generator and the simulator.
    #[arg(long, default_value_t = 0)]
    pub load_core: usize,
    #[command(flatten)]
    pub sut: SutArgs,
    /// Print rows as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write per-request records (records.csv), summary.json and report.html into this directory.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
}

/// One target's aggregated result.
#[derive(Serialize, Clone, Debug)]
pub struct Row {
    pub target: String,
    pub rounds: usize,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// CPU µs per request of the system under test (None for direct).
    pub cpu_us_per_request: Option<f64>,
    /// The system (kernel) part of it: what no user-space change can remove.
    pub system_us_per_request: Option<f64>,
    /// Requests answered without error, over all rounds (measured windows only).
    pub ok: u64,
    pub errors: u64,
    pub rps_vs_direct: Option<f64>,
    pub p50_vs_direct: Option<f64>,
    pub p99_vs_direct: Option<f64>,
    /// With `--pd`: the decode workers' mean wait for a room's KV, in ms (part of every
    /// request's latency and TTFT), over this target's rounds, warm-up included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoff_wait_ms: Option<f64>,
    /// With `--pd`: rooms whose KV never reached the decode (each a failed request).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoffs_failed: Option<u64>,
    /// A chained scenario's turns sent with `previous_response_id` (measured windows only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chained_turns: Option<u64>,
    /// A chained scenario's conversations ended early: a turn failed or had no `id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chains_cut_short: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Direct,
    Smg,
    Nginx,
    SmgPython,
}

pub(crate) struct Target {
    pub(crate) kind: Kind,
    pub(crate) name: &'static str,
    pub(crate) bin: Option<PathBuf>,
}

/// True when the file starts with a shebang naming python (pip console scripts do).
fn is_python_script(p: &Path) -> bool {
    let mut head = [0u8; 128];
    let n = std::fs::File::open(p).and_then(|mut f| f.read(&mut head)).unwrap_or(0);
    head[..n].starts_with(b"#!") && memchr::memmem::find(&head[..n], b"python").is_some()
}

/// nginx pinned to `core`, running `conf(dir)` from a temporary directory of its own
/// (prefix, config and error log there); the directory goes when the returned guard does.
pub(crate) fn spawn_nginx(
    core: usize,
    bin: &Path,
    name: &str,
    conf: impl FnOnce(&Path) -> String,
) -> Result<(Child, TempDir), String> {
    let dir = TempDir::new(name).map_err(|e| e.to_string())?;
    let path = dir.0.join("nginx.conf");
    std::fs::write(&path, conf(&dir.0)).map_err(|e| e.to_string())?;
    let child = pinned(core, bin)
        .arg("-p")
        .arg(&dir.0)
        .arg("-c")
        .arg(&path)
        .arg("-e")
        .arg(dir.0.join("error.log"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start {}: {e}", bin.display()))?;
    Ok((child, dir))
}

/// nginx as a reverse proxy to the workers; `access_log`: with its own buffered access log
/// (the `combined` format, 64 KB buffer), the fair match for a gateway whose access log is on.
/// `tls_ca`: the upstreams speak TLS with a certificate that CA signed (for `localhost`).
fn nginx_conf(dir: &Path, port: u16, upstreams: &[u16], access_log: bool, tls_ca: Option<&Path>) -> String {
    let servers: String = upstreams.iter().map(|p| format!("    server 127.0.0.1:{p};\n")).collect();
    let (scheme, tls) = match tls_ca {
        Some(ca) => (
            "https",
            format!(
                "      proxy_ssl_trusted_certificate {};\n      proxy_ssl_verify on;\n      proxy_ssl_name localhost;\n      proxy_ssl_server_name on;\n      proxy_ssl_session_reuse on;\n",
                ca.display()
            ),
        ),
        None => ("http", String::new()),
    };
    let d = dir.display();
    let log = if access_log {
        format!("access_log {d}/access.log combined buffer=64k flush=1s;")
    } else {
        "access_log off;".to_string()
    };
    format!(
        "worker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log error;\n\
events {{ worker_connections 8192; }}\n\
http {{\n  {log}\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  client_max_body_size 64m;\n  client_body_buffer_size 1m;\n  keepalive_requests 1000000;\n\
  upstream sim {{\n{servers}    keepalive 64;\n  }}\n\
  server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass {scheme}://sim;\n{tls}      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n    }}\n  }}\n}}\n"
    )
}

/// Starts the system under test; None for direct.
pub(crate) fn start_target(
    t: &Target,
    args: &CompareArgs,
    fleet: &Fleet,
    probe_req: &dyn Fn(u16) -> Vec<u8>,
) -> Result<(Option<Proc>, u16), String> {
    let scheme = if args.sut.fleet.grpc { "grpc" } else { "http" };
    let port = free_port()?;
    let (mut child, dir) = match t.kind {
        Kind::Direct => return Ok((None, fleet.direct_port().ok_or("direct: no whole-request worker")?)),
        Kind::Smg | Kind::SmgPython => {
            let bin = t.bin.as_ref().ok_or("no binary")?;
            let mut cmd = pinned(args.sut_core, bin);
            cmd.arg("launch").args(fleet.gateway_args(scheme));
            if let Some(tls) = fleet.tls() {
                cmd.env("SSL_CERT_FILE", &tls.ca);
            }
            if let Some(key) = fleet.provider_key() {
                cmd.args(["--backend", "openai"]).env("OPENAI_API_KEY", key);
            }
            cmd.args(["--host", "127.0.0.1", "--port", &port.to_string(), "--policy", "round_robin"]);
            if t.kind == Kind::SmgPython {
                // Its metrics listener defaults to 0.0.0.0:29000, which another gateway on the
                // box may hold: a port of its own on loopback.
                cmd.args(["--prometheus-host", "127.0.0.1", "--prometheus-port", &free_port()?.to_string()]);
            }
            if t.kind == Kind::Smg {
                cmd.args(["--cores", "1"]);
                let extra = if t.name == "smg-base" { &args.sut.base_args } else { &args.sut.smg_args };
                cmd.args(extra.split_whitespace());
            }
            let child = cmd
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("start {}: {e}", bin.display()))?;
            (child, None)
        }
        Kind::Nginx => {
            let bin = t.bin.as_ref().ok_or("no binary")?;
            let upstreams = fleet.whole_ports().ok_or("nginx: no whole-request workers to proxy")?;
            let tls = fleet.tls();
            let upstreams = tls.map_or(upstreams, |t| &t.ports);
            let (child, dir) = spawn_nginx(args.sut_core, bin, "nginx", |dir| {
                nginx_conf(dir, port, upstreams, t.name == "nginx-log", tls.map(|t| t.ca.as_path()))
            })?;
            (child, Some(dir))
        }
    };
    let addr = ([127, 0, 0, 1], port).into();
    if let Err(e) = wait_ready(addr, &probe_req(port), &mut child, Duration::from_secs(30)) {
        drop(Proc { child, _dir: dir });
        return Err(e);
    }
    Ok((Some(Proc { child, _dir: dir }), port))
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// The gateway binary: the one given, else $SMG_BIN, else target/release/smg of this workspace.
pub(crate) fn gateway_bin(given: Option<&Path>) -> PathBuf {
    given
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("SMG_BIN").map(PathBuf::from))
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/smg"))
}

/// Why a Responses scenario cannot be run with this fleet (it needs gRPC workers, whose
/// gateway serves the API itself); None when it can, or is no Responses scenario.
pub(crate) fn responses_need_grpc(scenario: &Scenario, fleet: &FleetArgs) -> Option<String> {
    (scenario.api == "responses" && !fleet.grpc && !fleet.provider).then(|| {
        format!(
            "scenario {:?} sends the Responses API, which the gateway serves on gRPC workers, or keeps the \
             history of for a cloud provider (smg-sim's engine workers serve no /v1/responses): add --grpc or \
             --provider",
            scenario.name
        )
    })
}

pub(crate) fn find_targets(args: &CompareArgs, notes: &mut Vec<String>) -> Result<Vec<Target>, String> {
    // ws-1k is no scenario file.
    let responses = Scenario::load(&args.scenario).ok().filter(|s| s.api == "responses");
    let mut out = Vec::new();
    for name in args.targets.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (kind, name, bin) = match name {
            "direct" => (Kind::Direct, "direct", None),
            "smg" => (Kind::Smg, "smg", Some(gateway_bin(args.sut.gateway_bin.as_deref())).filter(|b| b.is_file())),
            "smg-base" => (Kind::Smg, "smg-base", args.sut.base_bin.clone().filter(|b| b.is_file())),
            "nginx" | "nginx-log" => {
                let bin = args
                    .sut
                    .nginx_bin
                    .clone()
                    .or_else(|| on_path("nginx"))
                    .or_else(|| Some(PathBuf::from("/usr/sbin/nginx")));
                let name = if name == "nginx" { "nginx" } else { "nginx-log" };
                (Kind::Nginx, name, bin.filter(|b| b.is_file()))
            }
            "smg-python" => {
                let bin = args.sut.smg_python_bin.clone().or_else(|| on_path("smg"));
                (Kind::SmgPython, "smg-python", bin.filter(|b| b.is_file() && is_python_script(b)))
            }
            other => {
                return Err(format!("unknown target {other:?} (direct, smg, smg-base, nginx, nginx-log, smg-python)"))
            }
        };
        if let (Some(s), Kind::Direct | Kind::Nginx) = (&responses, kind) {
            notes.push(format!(
                "{name}: skipped ({}: Responses turns are stored and chained by a gateway; {name} holds no state)",
                s.name
            ));
            continue;
        }
        if args.sut.fleet.grpc && matches!(kind, Kind::Direct | Kind::Nginx) {
            notes.push(format!("{name}: skipped (--grpc: it speaks no gRPC)"));
            continue;
        }
        if args.sut.fleet.pd && kind == Kind::Direct {
            notes.push(format!("{name}: skipped (--pd: a lone prefill or decode worker is half an answer)"));
            continue;
        }
        if args.sut.fleet.pd && kind == Kind::Nginx {
            notes.push(format!("{name}: skipped (--pd: nginx cannot pair prefill and decode workers)"));
            continue;
        }
        if args.sut.fleet.pd_runtime == Some(PdRuntime::Vllm) && kind == Kind::SmgPython {
            // Seen: its flag-given pairs get SGLang's bootstrap fields, which a vLLM prefill
            // answers 400, so it would only time out at start-up.
            notes.push(format!(
                "{name}: skipped (--pd-runtime vllm: SMG 1.13's --prefill/--decode pairs speak SGLang's shape only)"
            ));
            continue;
        }
        if kind != Kind::Direct && bin.is_none() {
            notes.push(format!("{name}: skipped (not installed; see --help for how to point at it)"));
            continue;
        }
        out.push(Target { kind, name, bin });
    }
    Ok(out)
}

/// An HTTP scenario's compare (`ws-1k` is `ws_compare::run`; the CLI picks by scenario).
pub fn run(args: &CompareArgs) -> Result<(), String> {
    let mut scenario = Scenario::load(&args.scenario)?;
    if let Some(m) = &args.model {
        scenario.model = m.clone();
        scenario.models.clear();
    }
    if let Some(e) = responses_need_grpc(&scenario, &args.sut.fleet) {
        return Err(e);
    }
    let mut notes = Vec::new();
    let targets = find_targets(args, &mut notes)?;
    if targets.is_empty() {
        return Err("no target to run".into());
    }
    if on_path("taskset").is_none() {
        notes.push("taskset not found: processes run unpinned".into());
    }
    rt::pin_to(args.load_core);
    let fleet = Fleet::start(&args.sut.fleet, args.load_core, &scenario.model_names(), REQUEST_TIMEOUT)?;
    let headers = request_headers(&args.sut.fleet, &args.sut.headers);
    let req_for = |port: u16| -> Vec<u8> {
        let host = format!("127.0.0.1:{port}");
        scenario.requests(&host, None, &headers).swap_remove(0).to_vec()
    };
    let mut results: Vec<Vec<Report>> = targets.iter().map(|_| Vec::new()).collect();
    // Per target, the decode workers' handoffs during its runs (PD fleets only).
    let mut handoffs: Vec<Option<Handoffs>> = targets.iter().map(|_| None).collect();
    let mut entries: Vec<Entry> = Vec::new();
    let session = Instant::now();
    for round in 0..args.rounds.max(1) {
        // The start position rotates each round: on this box whichever target runs first in
        // a round measured ~6% more CPU per request (an A/A run of one binary under two
        // names showed it), so a fixed order would bias every ratio.
        for k in 0..targets.len() {
            let i = (k + round) % targets.len();
            let t = &targets[i];
            let (proc_, port) = match start_target(t, args, &fleet, &req_for) {
                Ok(x) => x,
                Err(e) => {
                    notes.push(format!("{} round {}: {e}", t.name, round + 1));
                    continue;
                }
            };
            let host = format!("127.0.0.1:{port}");
            let plan = LoadPlan {
                addr: ([127, 0, 0, 1], port).into(),
                url: format!("http://{host}"),
                scenario_name: scenario.name.clone(),
                requests: Arc::new(scenario.requests(&host, None, &headers)),
                mode: Mode::Closed { concurrency: args.concurrency },
                duration: Some(args.duration),
                count: None,
                warmup: args.warmup,
                timeout: REQUEST_TIMEOUT,
                threads: 1,
                cores: Some(vec![args.load_core]),
                parse_usage: true,
                progress: false,
                target_pids: proc_.as_ref().map(|p| vec![p.child.id()]).unwrap_or_default(),
                stop: None,
                chain: scenario.chain(&host, None, &headers),
            };
            let t0_s = session.elapsed().as_secs_f64() + args.warmup.as_secs_f64();
            let pd_before = fleet.pd().and_then(|pd| pd.handoffs());
            let measured = execute_recorded(&plan, args.report.is_some())?;
            let pd_run = pd_before.zip(fleet.pd().and_then(|pd| pd.handoffs())).map(|(b, a)| a.since(b));
            drop(proc_);
            if let Some(h) = pd_run {
                handoffs[i] = Some(handoffs[i].unwrap_or_default().plus(h));
            }
            let report = measured.report.clone();
            if args.report.is_some() {
                entries.push(Entry::new(t.name, None, round + 1, t0_s, measured));
            }
            let kv_wait =
                pd_run.and_then(Handoffs::mean_wait_ms).map_or_else(String::new, |w| format!("  KV wait {w:.3} ms"));
            eprintln!(
                "round {} {:<10} {:>9.0} req/s  p50 {:.3} ms  p99 {:.3} ms  errors {}{kv_wait}",
                round + 1,
                t.name,
                report.rps,
                report.latency_ms.as_ref().map_or(0.0, |p| p.p50),
                report.latency_ms.as_ref().map_or(0.0, |p| p.p99),
                report.errors
            );
            results[i].push(report);
        }
    }
    let mut rows: Vec<Row> = targets
        .iter()
        .zip(&results)
        .zip(&handoffs)
        .filter(|((_, r), _)| !r.is_empty())
        .map(|((t, r), &h)| Row {
            target: t.name.to_string(),
            rounds: r.len(),
            rps: median(r.iter().map(|x| x.rps).collect()),
            p50_ms: median(r.iter().map(|x| x.latency_ms.as_ref().map_or(0.0, |p| p.p50)).collect()),
            p99_ms: median(r.iter().map(|x| x.latency_ms.as_ref().map_or(0.0, |p| p.p99)).collect()),
            cpu_us_per_request: (t.kind != Kind::Direct)
                .then(|| median(r.iter().filter_map(|x| x.target_cpu.first().map(|c| c.cpu_us_per_request)).collect())),
            system_us_per_request: (t.kind != Kind::Direct).then(|| {
                median(r.iter().filter_map(|x| x.target_cpu.first().map(|c| c.system_us_per_request)).collect())
            }),
            ok: r.iter().map(|x| x.ok).sum(),
            errors: r.iter().map(|x| x.errors).sum(),
            rps_vs_direct: None,
            p50_vs_direct: None,
            p99_vs_direct: None,
            handoff_wait_ms: h.and_then(Handoffs::mean_wait_ms),
            handoffs_failed: h.map(|h| h.failed),
            chained_turns: scenario.chained().then(|| r.iter().map(|x| x.chain.map_or(0, |c| c.chained_turns)).sum()),
            chains_cut_short: scenario.chained().then(|| r.iter().map(|x| x.chain.map_or(0, |c| c.cut_short)).sum()),
        })
        .collect();
    if let Some(d) = rows.iter().find(|r| r.target == "direct").cloned() {
        let ratio = |a: f64, b: f64| (b > 0.0).then(|| a / b);
        for r in &mut rows {
            r.rps_vs_direct = ratio(r.rps, d.rps);
            r.p50_vs_direct = ratio(r.p50_ms, d.p50_ms);
            r.p99_vs_direct = ratio(r.p99_ms, d.p99_ms);
        }
    }
    if args.json {
        println!("{}", sonic_rs::to_string_pretty(&rows).map_err(|e| e.to_string())?);
    } else {
        println!(
            "scenario {}  concurrency {}  {} rounds x {:?} (medians)  SUT core {}, load+sim core {}  workers: {}",
            scenario.name,
            args.concurrency,
            args.rounds,
            args.duration,
            args.sut_core,
            args.load_core,
            fleet.describe()
        );
        println!(
            "{:<11} {:>10} {:>9} {:>9} {:>12} {:>12} {:>10} {:>10} {:>10} {:>7}",
            "target",
            "req/s",
            "p50 ms",
            "p99 ms",
            "cpu µs/req",
            "sys µs/req",
            "rps/direct",
            "p50/direct",
            "p99/direct",
            "errors"
        );
        let f = |v: Option<f64>, prec: usize| v.map_or_else(|| "-".to_string(), |x| format!("{x:.prec$}"));
        for r in &rows {
            println!(
                "{:<11} {:>10.0} {:>9.3} {:>9.3} {:>12} {:>12} {:>10} {:>10} {:>10} {:>7}",
                r.target,
                r.rps,
                r.p50_ms,
                r.p99_ms,
                f(r.cpu_us_per_request, 2),
                f(r.system_us_per_request, 2),
                f(r.rps_vs_direct, 2),
                f(r.p50_vs_direct, 2),
                f(r.p99_vs_direct, 2),
                r.errors
            );
        }
        for r in rows.iter().filter(|r| r.handoffs_failed.is_some()) {
            println!(
                "{:<11} decode KV wait {} ms/request (in its latency and TTFT), {} handoffs failed",
                r.target,
                f(r.handoff_wait_ms, 3),
                r.handoffs_failed.unwrap_or(0)
            );
        }
        for r in &rows {
            if let (Some(chained), Some(cut)) = (r.chained_turns, r.chains_cut_short) {
                println!(
                    "{:<11} {} turns chained by previous_response_id, {} conversations cut short",
                    r.target, chained, cut
                );
            }
        }
    }
    for n in &notes {
        eprintln!("note: {n}");
    }
    if let Some(dir) = &args.report {
        let page = Page {
            title: format!("smg-load compare: {} c={}", scenario.name, args.concurrency),
            kind: "compare",
            notes,
            ..Default::default()
        };
        report_dir::write(dir, &page, &entries)?;
        eprintln!("report: {}", dir.join("report.html").display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_fleet_runs_responses_and_every_request_carries_its_key() {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            fleet: FleetArgs,
        }
        let fleet = |argv: &[&str]| <Flags as clap::Parser>::parse_from([&["x"], argv].concat()).fleet;
        let responses = Scenario::load("responses-1k").unwrap();
        assert!(responses_need_grpc(&responses, &fleet(&[])).is_some());
        assert!(responses_need_grpc(&responses, &fleet(&["--grpc"])).is_none());
        let provider = fleet(&["--provider"]);
        assert!(responses_need_grpc(&responses, &provider).is_none());
        let headers = request_headers(&provider, &["x-a: 1".to_string()]);
        assert_eq!(
            headers,
            ["x-a: 1".to_string(), format!("authorization: Bearer {}", crate::load::fleet::PROVIDER_KEY)]
        );
        assert_eq!(request_headers(&fleet(&[]), &[]), Vec::<String>::new());
    }

    #[test]
    fn nginx_conf_has_the_essentials() {
        assert!(nginx_conf(Path::new("/tmp/x"), 8080, &[1], false, None).contains("access_log off;"));
        assert!(nginx_conf(Path::new("/tmp/x"), 8080, &[1], true, None)
            .contains("access_log /tmp/x/access.log combined buffer=64k flush=1s;"));
        let tls = nginx_conf(Path::new("/tmp/x"), 8080, &[1], false, Some(Path::new("/tmp/x/ca.pem")));
        for needle in
            ["proxy_pass https://sim;", "proxy_ssl_trusted_certificate /tmp/x/ca.pem;", "proxy_ssl_verify on;"]
        {
            assert!(tls.contains(needle), "{needle}: {tls}");
        }
        let c = nginx_conf(Path::new("/tmp/x"), 8080, &[1, 2], false, None);
        for needle in [
            "worker_processes 1;",
            "daemon off;",
            "pid /tmp/x/nginx.pid;",
            "keepalive 64;",
            "proxy_http_version 1.1;",
            "proxy_buffering off;",
            "access_log off;",
            "server 127.0.0.1:2;",
            "listen 127.0.0.1:8080;",
        ] {
            assert!(c.contains(needle), "{needle}");
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }
}
