//! The simulated workers behind `compare`'s and `sweep`'s targets: one smg-sim of whole-request
//! workers, or with `--pd` a prefill smg-sim and a decode smg-sim (see load/pd_fleet.rs), and
//! the worker flags every gateway target is launched with to reach them.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::load::pd_fleet::{self, PdRuntime, PdWorkers};
use crate::load::procs::{listening_port, pinned, sim_bin, spawn_sim_lines, Proc, TempDir};

/// The port of a `listening` line's `tls=HOST:PORT` (smg-sim --tls-dir).
fn tls_port(line: &str) -> Option<u16> {
    line.split_whitespace().find_map(|f| f.strip_prefix("tls="))?.rsplit(':').next()?.parse().ok()
}

/// What the simulated workers are (flattened into the targets' flags).
#[derive(Args, Debug, Clone)]
pub struct FleetArgs {
    /// smg-sim binary (default: next to this executable).
    #[arg(long)]
    pub sim_bin: Option<PathBuf>,
    /// Simulated workers per model, all behind every proxy target (`direct` uses the first):
    /// how routing cost grows with the fleet. With --pd, this many prefill and as many decode
    /// workers per model.
    #[arg(long, default_value_t = 1)]
    pub sim_workers: usize,
    /// Extra smg-sim flags, space separated (e.g. "--ttft-ms 5 --itl-ms 1"); with --pd both
    /// roles get them.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub sim_args: String,
    /// gRPC workers: the simulators serve SGLang's scheduler API (`smg-sim --grpc`) and the
    /// gateways register them as `grpc://`, so they tokenize, render and detokenize
    /// themselves. Only the gateway targets (smg, smg-base, smg-python) speak it; direct and
    /// nginx are skipped.
    #[arg(long)]
    pub grpc: bool,
    /// Prefill/decode disaggregation: --sim-workers prefill workers (each with its own
    /// bootstrap port) and as many decode workers per model instead of whole-request ones, and
    /// every gateway target launched with `--pd-disaggregation --prefill URL PORT … --decode
    /// URL …`. direct and nginx are skipped: a lone prefill or decode is half an answer, and
    /// nginx cannot pair them. Run compare with and without it to set PD beside one fleet.
    #[arg(long)]
    pub pd: bool,
    /// With --pd: the engine whose PD protocol the pairs speak [default: sglang].
    #[arg(long, value_enum, requires = "pd")]
    pub pd_runtime: Option<PdRuntime>,
    /// TLS upstreams, as a cloud provider is reached: every simulator also serves HTTPS
    /// (`smg-sim --tls-dir`, a CA of its own), and the proxy targets are sent there over TLS
    /// (nginx: `proxy_pass https://` trusting the CA, with upstream keep-alive; the gateways:
    /// `https://` worker URLs with SSL_CERT_FILE). `direct` stays plain.
    #[arg(long, conflicts_with_all = ["grpc", "pd"])]
    pub tls: bool,
    /// The workers are a cloud provider: every simulator answers as OpenAI does
    /// (`smg-sim --provider-keys`, one key for the fleet's models, its Responses API keeping
    /// no state), every gateway target is launched with `--backend openai` and the key in
    /// `OPENAI_API_KEY`, and every request carries the key (`direct` and nginx pass it on).
    /// With it the Responses scenarios run without --grpc: the gateway keeps their history.
    #[arg(long, conflicts_with_all = ["grpc", "pd", "tls"])]
    pub provider: bool,
}

/// The one key of a --provider fleet.
pub(crate) const PROVIDER_KEY: &str = "sk-smg-load";

/// The header lines every request carries: `extra`, and with --provider the fleet's key.
pub(crate) fn request_headers(args: &FleetArgs, extra: &[String]) -> Vec<String> {
    let mut h = extra.to_vec();
    if args.provider {
        h.push(format!("authorization: Bearer {PROVIDER_KEY}"));
    }
    h
}

/// Started simulators (stopped when this drops) and the workers they serve.
pub(crate) struct Fleet {
    _sims: Vec<Proc>,
    workers: Workers,
    /// What the report's header says the workers are.
    label: String,
    /// With --tls: each worker's HTTPS port, in `workers`' order, and the CA that signed them.
    tls: Option<Tls>,
    /// With --provider: the directory of the simulators' keys file.
    provider: Option<TempDir>,
}

pub(crate) struct Tls {
    pub(crate) ports: Vec<u16>,
    pub(crate) ca: PathBuf,
    _dir: TempDir,
}

enum Workers {
    Whole(Vec<u16>),
    Pd(PdWorkers),
}

// === impl Fleet ===

impl Fleet {
    /// Starts the workers for `models`, every simulator pinned to `core`. `request_timeout` is
    /// how long the load waits for an answer; a PD decode waits as long for its KV.
    pub(crate) fn start(
        args: &FleetArgs,
        core: usize,
        models: &[String],
        request_timeout: Duration,
    ) -> Result<Fleet, String> {
        let bin = sim_bin(args.sim_bin.as_deref())?;
        let tls_dir = if args.tls { Some(TempDir::new("tls").map_err(|e| format!("--tls: {e}"))?) } else { None };
        let provider = if args.provider {
            let dir = TempDir::new("provider").map_err(|e| format!("--provider: {e}"))?;
            let models: Vec<String> = models.iter().map(|m| format!("{m:?}")).collect();
            let keys = format!(r#"{{"{PROVIDER_KEY}": {{"provider": "openai", "models": [{}]}}}}"#, models.join(","));
            std::fs::write(dir.0.join("keys.json"), keys).map_err(|e| format!("--provider: {e}"))?;
            Some(dir)
        } else {
            None
        };
        // One smg-sim per role (a process's workers share --pd-role), each with the same
        // workers: `--worker 0:MODEL[:RUNTIME]` per worker, on free ports.
        let sim = |role_flags: &[String]| -> Result<(Proc, Vec<String>), String> {
            let mut cmd = pinned(core, &bin);
            for m in models {
                for _ in 0..args.sim_workers.max(1) {
                    let worker = match args.pd_runtime {
                        Some(r) => format!("0:{m}:{}", r.sim_name()),
                        None => format!("0:{m}"),
                    };
                    cmd.arg("--worker").arg(worker);
                }
            }
            cmd.arg("--cores").arg(core.to_string());
            if args.grpc {
                cmd.arg("--grpc");
            }
            cmd.args(role_flags);
            if let Some(d) = &tls_dir {
                cmd.arg("--tls-dir").arg(&d.0);
            }
            if let Some(d) = &provider {
                cmd.arg("--provider-keys").arg(d.0.join("keys.json"));
            }
            cmd.args(args.sim_args.split_whitespace());
            spawn_sim_lines(cmd, &bin)
        };
        let ports = |lines: &[String]| -> Result<Vec<u16>, String> {
            lines.iter().map(|l| listening_port(l).ok_or_else(|| format!("bad sim line {l:?}"))).collect()
        };
        if !args.pd {
            let (p, lines) = sim(&[])?;
            let mut label = format!("{} per model", args.sim_workers.max(1));
            if provider.is_some() {
                label.push_str(", a cloud provider (OpenAI)");
            }
            let tls = match tls_dir {
                Some(dir) => {
                    label.push_str(", over TLS");
                    let ports = lines
                        .iter()
                        .map(|l| tls_port(l).ok_or_else(|| format!("sim line without tls=: {l:?}")))
                        .collect::<Result<Vec<_>, _>>()?;
                    Some(Tls { ports, ca: dir.0.join("ca.pem"), _dir: dir })
                }
                None => None,
            };
            return Ok(Fleet { _sims: vec![p], workers: Workers::Whole(ports(&lines)?), label, tls, provider });
        }
        let (prefill_sim, lines) = sim(&pd_fleet::prefill_flags().map(String::from))?;
        let bootstraps = lines
            .iter()
            .map(|l| pd_fleet::bootstrap_port(l).ok_or_else(|| format!("prefill sim line without bootstrap: {l:?}")))
            .collect::<Result<Vec<_>, _>>()?;
        let prefill = ports(&lines)?.into_iter().zip(bootstraps).collect();
        // The user's own --handoff-timeout-ms wins (smg-sim takes the flag once).
        let timeout = (!args.sim_args.contains("--handoff-timeout-ms")).then_some(request_timeout);
        let (decode_sim, lines) = sim(&pd_fleet::decode_flags(timeout))?;
        let decode = ports(&lines)?;
        let label = format!(
            "PD, {n} prefill + {n} decode per model ({})",
            args.pd_runtime.unwrap_or_default().sim_name(),
            n = args.sim_workers.max(1)
        );
        Ok(Fleet {
            _sims: vec![prefill_sim, decode_sim],
            workers: Workers::Pd(PdWorkers { prefill, decode }),
            label,
            tls: None,
            provider: None,
        })
    }

    /// What the workers are, for the report's header.
    pub(crate) fn describe(&self) -> &str {
        &self.label
    }

    /// The worker `direct` is sent to; None for a PD fleet (a lone prefill answers one token,
    /// a lone decode waits for KV no prefill makes).
    pub(crate) fn direct_port(&self) -> Option<u16> {
        match &self.workers {
            Workers::Whole(ports) => ports.first().copied(),
            Workers::Pd(_) => None,
        }
    }

    /// The upstreams of a plain proxy (nginx); None for a PD fleet, which only a gateway pairs.
    pub(crate) fn whole_ports(&self) -> Option<&[u16]> {
        match &self.workers {
            Workers::Whole(ports) => Some(ports),
            Workers::Pd(_) => None,
        }
    }

    /// Every worker port.
    pub(crate) fn ports(&self) -> Vec<u16> {
        match &self.workers {
            Workers::Whole(ports) => ports.clone(),
            Workers::Pd(pd) => pd.ports(),
        }
    }

    /// The PD workers, for their handoff counters; None for whole-request workers.
    pub(crate) fn pd(&self) -> Option<&PdWorkers> {
        match &self.workers {
            Workers::Whole(_) => None,
            Workers::Pd(pd) => Some(pd),
        }
    }

    /// With --tls: the workers' HTTPS ports and the CA.
    pub(crate) fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref()
    }

    /// With --provider: the workers are OpenAI (a gateway takes `--backend openai` and
    /// this key in `OPENAI_API_KEY`).
    pub(crate) fn provider_key(&self) -> Option<&'static str> {
        self.provider.as_ref().map(|_| PROVIDER_KEY)
    }

    /// The gateway flags that register every worker (`scheme`: http or grpc; with --tls,
    /// https to the workers' TLS ports).
    pub(crate) fn gateway_args(&self, scheme: &str) -> Vec<String> {
        match (&self.workers, &self.tls) {
            (Workers::Whole(_), Some(tls)) => std::iter::once("--worker-urls".to_string())
                .chain(tls.ports.iter().map(|p| format!("https://127.0.0.1:{p}")))
                .collect(),
            (Workers::Whole(ports), None) => std::iter::once("--worker-urls".to_string())
                .chain(ports.iter().map(|p| format!("{scheme}://127.0.0.1:{p}")))
                .collect(),
            (Workers::Pd(pd), _) => pd.gateway_args(scheme),
        }
    }
}
