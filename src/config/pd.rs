//! The prefill/decode disaggregation flags (SMG's names): which workers are prefill and
//! decode engines, and the policy each role is routed by.

use clap::{ArgAction, Args};

use crate::admission::pd::PdAdmission;
use crate::routing::{AssignmentMode, PolicyKind, RoutingConfig};
use crate::workers::fleet::WorkerSpec;
use crate::workers::WorkerUrl;

#[derive(Args, Debug, Clone, Default)]
pub struct PdArgs {
    /// Prefill/decode disaggregation: each request goes to a pair, a prefill worker (--prefill)
    /// that computes the prompt's KV cache and a decode worker (--decode) that generates.
    #[arg(long)]
    pub pd_disaggregation: bool,
    /// A prefill worker, with the port its engine serves KV bootstrap on ("none": the engine's
    /// default, sent as null). Repeatable.
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"], action = ArgAction::Append,
          requires = "pd_disaggregation")]
    pub prefill: Vec<String>,
    /// A decode worker. Repeatable.
    #[arg(long, value_name = "URL", action = ArgAction::Append, requires = "pd_disaggregation")]
    pub decode: Vec<String>,
    /// The policy prefill workers are picked by (default: --policy).
    #[arg(long)]
    pub prefill_policy: Option<String>,
    /// The policy decode workers are picked by (default: --policy).
    #[arg(long)]
    pub decode_policy: Option<String>,
    /// Seconds a pair's dispatch waits for a free slot in its decode engine's running window
    /// (its max_running_requests) before shedding with 503 worker_overload_protection_shed;
    /// 0 sheds at once. Engines that report no window are never gated.
    #[arg(long, default_value_t = 30)]
    pub pd_admission_wait_secs: u64,
    /// Most prefill requests in flight on each prefill worker, gateway-wide; a non-positive
    /// value disables the limit.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub prefill_max_inflight_requests_per_worker: i64,
    /// Requests that may wait for prefill admission, gateway-wide (default 100 when prefill
    /// admission is on; 0: none wait, 429 pd_prefill_queue_full at once).
    #[arg(long)]
    pub prefill_queue_size: Option<usize>,
    /// Longest wait for prefill admission before 429 pd_prefill_queue_timeout (default 60).
    #[arg(long)]
    pub prefill_queue_timeout_secs: Option<u64>,
}

// === impl PdArgs ===

impl PdArgs {
    /// Admission per role (applied to pairs only).
    pub fn admission(&self) -> Result<PdAdmission, String> {
        let secs = crate::duration::secs;
        let prefill_inflight = u32::try_from(self.prefill_max_inflight_requests_per_worker.max(0))
            .map_err(|_| "--prefill-max-inflight-requests-per-worker: at most 4294967295".to_string())?;
        Ok(PdAdmission {
            decode_wait: secs("--pd-admission-wait-secs", self.pd_admission_wait_secs, 0)?,
            prefill_inflight,
            prefill_queue: self.prefill_queue_size.unwrap_or(100),
            prefill_queue_timeout: secs(
                "--prefill-queue-timeout-secs",
                self.prefill_queue_timeout_secs.unwrap_or(60),
                1,
            )?,
        })
    }

    /// The prefill and decode workers, as registrations.
    pub fn workers(&self) -> Result<Vec<WorkerSpec>, String> {
        let mut out = Vec::with_capacity(self.prefill.len() + self.decode.len());
        // Every occurrence's values arrive in one list: a URL (it has a scheme) starts one,
        // and what follows it before the next URL is its bootstrap port.
        let mut values = self.prefill.iter().peekable();
        while let Some(url) = values.next() {
            WorkerUrl::parse(url).map_err(|e| format!("--prefill: {e}"))?;
            let port = values.next_if(|v| !v.contains("://"));
            let bootstrap_port = match port.map(String::as_str) {
                None | Some("none") => None,
                Some(port) => Some(
                    port.parse::<u16>()
                        .map_err(|_| format!("--prefill {url}: '{port}' is not a port number or \"none\""))?,
                ),
            };
            out.push(WorkerSpec { worker_type: "prefill".into(), bootstrap_port, ..WorkerSpec::from_url(url) });
        }
        for url in &self.decode {
            WorkerUrl::parse(url).map_err(|e| format!("--decode: {e}"))?;
            out.push(WorkerSpec { worker_type: "decode".into(), ..WorkerSpec::from_url(url) });
        }
        Ok(out)
    }

    /// The routing configurations of decode (and regular) workers and of prefill workers:
    /// `routing` with each role's policy, and that policy's default assignment mode unless
    /// `--assignment-mode` named one.
    pub fn role_routing(
        &self,
        routing: RoutingConfig,
        assignment_mode: Option<AssignmentMode>,
    ) -> Result<(RoutingConfig, RoutingConfig), String> {
        let with = |flag: &str, name: Option<&String>| -> Result<RoutingConfig, String> {
            let Some(name) = name else { return Ok(routing.clone()) };
            let policy: PolicyKind = name.parse().map_err(|e| format!("{flag}: {e}"))?;
            let assignment_mode = assignment_mode.unwrap_or(AssignmentMode::default_for(policy));
            Ok(RoutingConfig { policy, assignment_mode, ..routing.clone() })
        };
        Ok((
            with("--decode-policy", self.decode_policy.as_ref())?,
            with("--prefill-policy", self.prefill_policy.as_ref())?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Cli;
    use clap::Parser;

    fn launch(args: &[&str]) -> Result<crate::config::LaunchArgs, clap::Error> {
        let mut all = vec!["smg", "launch"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all)?.command {
            crate::config::Command::Launch(l) => Ok(*l),
            _ => unreachable!(),
        }
    }

    #[test]
    fn prefill_takes_an_optional_bootstrap_port_and_decode_a_url() {
        let l = launch(&[
            "--pd-disaggregation",
            "--prefill",
            "http://127.0.0.1:30001",
            "9001",
            "--prefill",
            "http://127.0.0.1:30002",
            "none",
            "--prefill",
            "http://127.0.0.1:30003",
            "--decode",
            "http://127.0.0.1:30011",
            "--decode",
            "http://127.0.0.1:30012",
        ])
        .unwrap();
        let specs = l.pd.workers().unwrap();
        let got: Vec<(&str, &str, Option<u16>)> =
            specs.iter().map(|s| (s.url.as_str(), s.worker_type.as_str(), s.bootstrap_port)).collect();
        assert_eq!(
            got,
            [
                ("http://127.0.0.1:30001", "prefill", Some(9001)),
                ("http://127.0.0.1:30002", "prefill", None),
                ("http://127.0.0.1:30003", "prefill", None),
                ("http://127.0.0.1:30011", "decode", None),
                ("http://127.0.0.1:30012", "decode", None),
            ]
        );
        let bad = launch(&["--pd-disaggregation", "--prefill", "http://127.0.0.1:1", "x"]).unwrap();
        assert!(bad.pd.workers().unwrap_err().contains("not a port number"));
        assert!(launch(&["--prefill", "http://127.0.0.1:1"]).is_err(), "roles need --pd-disaggregation");
    }

    #[test]
    fn each_role_is_routed_by_its_own_policy_defaulting_to_policy() {
        let l = launch(&["--policy", "round_robin", "--prefill-policy", "cache_aware"]).unwrap();
        let base = RoutingConfig { policy: PolicyKind::RoundRobin, ..RoutingConfig::default() };
        let (decode, prefill) = l.pd.role_routing(base, None).unwrap();
        assert_eq!((decode.policy, prefill.policy), (PolicyKind::RoundRobin, PolicyKind::CacheAware));
        assert_eq!(prefill.assignment_mode, AssignmentMode::default_for(PolicyKind::CacheAware));
        let l = launch(&["--decode-policy", "nope"]).unwrap();
        assert!(l.pd.role_routing(RoutingConfig::default(), None).unwrap_err().starts_with("--decode-policy"));
    }
}
