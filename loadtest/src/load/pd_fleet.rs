//! A prefill/decode fleet's shape (`--pd`): the smg-sim flags that give each process its role,
//! where a prefill's `listening` line names its bootstrap port, the gateway flags that pair the
//! workers (SMG's `--pd-disaggregation --prefill URL PORT … --decode URL …`), and the decode
//! workers' handoff counters, which say how much of the measured latency was the KV wait.

use std::time::Duration;

use clap::ValueEnum;
use sonic_rs::{JsonValueTrait, Value};

use crate::load::blocking::Client;

/// Which engine's PD protocol the simulated pairs speak (smg-sim's `--runtime` for them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum PdRuntime {
    /// SGLang: both legs leave the gateway at once with the bootstrap fields; the decode
    /// long-polls the prefill's bootstrap port for the KV.
    #[default]
    Sglang,
    /// vLLM with a NIXL-style connector: the prefill first (one token), then the decode with
    /// the prefill's `kv_transfer_params`.
    Vllm,
}

// === impl PdRuntime ===

impl PdRuntime {
    /// smg-sim's runtime name, the third part of `--worker PORTS:MODEL:RUNTIME`.
    pub(crate) fn sim_name(self) -> &'static str {
        match self {
            PdRuntime::Sglang => "sglang",
            PdRuntime::Vllm => "vllm",
        }
    }
}

/// The role flags of the prefill smg-sim: a free bootstrap port per worker (`0`), so several
/// prefills in one process never collide.
pub(crate) fn prefill_flags() -> [&'static str; 4] {
    ["--pd-role", "prefill", "--bootstrap-port", "0"]
}

/// The role flags of the decode smg-sim. `handoff_timeout` is how long a decode waits for its
/// KV; None keeps what `sim_args` say (or smg-sim's default). The caller passes its own
/// request timeout: a decode whose prefill is queued then waits as long as the client would, so
/// a slow prefill shows as latency (the decode's TTFT includes the wait) and not as a 500.
pub(crate) fn decode_flags(handoff_timeout: Option<Duration>) -> Vec<String> {
    let mut f = vec!["--pd-role".to_string(), "decode".to_string()];
    if let Some(t) = handoff_timeout {
        f.extend(["--handoff-timeout-ms".to_string(), t.as_millis().max(1).to_string()]);
    }
    f
}

/// The bootstrap port in a prefill's `listening` line (`HOST:PORT … role=prefill
/// bootstrap=HOST:BPORT`).
pub(crate) fn bootstrap_port(line: &str) -> Option<u16> {
    let addr = line.split_whitespace().find_map(|f| f.strip_prefix("bootstrap="))?;
    addr.rsplit(':').next()?.parse().ok()
}

/// The workers of a started PD fleet, on 127.0.0.1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PdWorkers {
    /// (worker port, bootstrap port) of each prefill.
    pub(crate) prefill: Vec<(u16, u16)>,
    pub(crate) decode: Vec<u16>,
}

// === impl PdWorkers ===

impl PdWorkers {
    /// The gateway flags naming the pairs' workers, for SMG and this gateway alike (the same
    /// flags): every prefill with its own bootstrap port, then every decode.
    pub(crate) fn gateway_args(&self, scheme: &str) -> Vec<String> {
        let mut a = vec!["--pd-disaggregation".to_string()];
        for (port, bootstrap) in &self.prefill {
            a.extend(["--prefill".to_string(), format!("{scheme}://127.0.0.1:{port}"), bootstrap.to_string()]);
        }
        for port in &self.decode {
            a.extend(["--decode".to_string(), format!("{scheme}://127.0.0.1:{port}")]);
        }
        a
    }

    /// Every worker port, prefill first.
    pub(crate) fn ports(&self) -> Vec<u16> {
        self.prefill.iter().map(|p| p.0).chain(self.decode.iter().copied()).collect()
    }

    /// The decode workers' handoff counters so far, summed; None when one cannot be read.
    pub(crate) fn handoffs(&self) -> Option<Handoffs> {
        let mut sum = Handoffs::default();
        for &port in &self.decode {
            let mut c = Client::new(([127, 0, 0, 1], port).into(), Duration::from_secs(2));
            let r = c.call("GET", "/sim/stats", None).ok().filter(|r| r.status == 200)?;
            sum = sum.plus(Handoffs::parse(&r.body)?);
        }
        Some(sum)
    }
}

/// A decode's handoff counters (`/sim/stats`): rooms whose KV arrived, rooms whose did not, and
/// the total time requests waited for it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Handoffs {
    pub(crate) waited: u64,
    pub(crate) failed: u64,
    pub(crate) wait_ms: f64,
}

// === impl Handoffs ===

impl Handoffs {
    fn parse(stats: &[u8]) -> Option<Self> {
        let v: Value = sonic_rs::from_slice(stats).ok()?;
        Some(Self {
            waited: v.get("handoffs_waited")?.as_u64()?,
            failed: v.get("handoffs_failed")?.as_u64()?,
            wait_ms: v.get("handoff_wait_ms")?.as_f64()?,
        })
    }

    pub(crate) fn plus(self, o: Self) -> Self {
        Self { waited: self.waited + o.waited, failed: self.failed + o.failed, wait_ms: self.wait_ms + o.wait_ms }
    }

    /// What happened between two readings of the same workers.
    pub(crate) fn since(self, before: Self) -> Self {
        Self {
            waited: self.waited.saturating_sub(before.waited),
            failed: self.failed.saturating_sub(before.failed),
            wait_ms: (self.wait_ms - before.wait_ms).max(0.0),
        }
    }

    /// Mean KV wait per room that arrived, in ms.
    pub(crate) fn mean_wait_ms(self) -> Option<f64> {
        (self.waited > 0).then(|| self.wait_ms / self.waited as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_from_the_listening_line() {
        let l = "127.0.0.1:40001 model=m runtime=sglang role=prefill bootstrap=127.0.0.1:40002";
        assert_eq!(bootstrap_port(l), Some(40002));
        assert_eq!(bootstrap_port("127.0.0.1:40003 model=m runtime=sglang role=decode"), None);
    }

    #[test]
    fn gateway_flags_pair_every_worker() {
        let w = PdWorkers { prefill: vec![(1, 11), (2, 12)], decode: vec![3, 4] };
        assert_eq!(
            w.gateway_args("http").join(" "),
            "--pd-disaggregation --prefill http://127.0.0.1:1 11 --prefill http://127.0.0.1:2 12 \
             --decode http://127.0.0.1:3 --decode http://127.0.0.1:4"
        );
        assert_eq!(w.ports(), vec![1, 2, 3, 4]);
    }

    #[test]
    fn decode_flags_carry_the_timeout() {
        assert_eq!(decode_flags(None), ["--pd-role", "decode"]);
        assert_eq!(
            decode_flags(Some(Duration::from_secs(30))),
            ["--pd-role", "decode", "--handoff-timeout-ms", "30000"]
        );
    }

    #[test]
    fn handoff_counters() {
        let s = br#"{"handoffs_waited":4,"handoffs_failed":1,"handoff_wait_ms":2.000}"#;
        let h = Handoffs::parse(s).unwrap();
        assert_eq!(h, Handoffs { waited: 4, failed: 1, wait_ms: 2.0 });
        let later = h.plus(h);
        assert_eq!(later.since(h), h);
        assert_eq!(h.mean_wait_ms(), Some(0.5));
        assert_eq!(Handoffs::default().mean_wait_ms(), None);
        assert!(Handoffs::parse(b"{}").is_none());
    }
}
