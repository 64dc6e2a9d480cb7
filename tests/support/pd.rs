//! Prefill/decode pairs of smg-sim workers and a gateway in PD mode in front of them
//! (tests/pd_pairs.rs, tests/pd_admission.rs).

use std::time::Duration;

use sonic_rs::JsonValueTrait;

use super::sim::Sim;
use super::Gateway;

/// A prefill sim on its own bootstrap port, with `flags`.
pub fn prefill(flags: &[&str]) -> (Sim, u16) {
    prefill_of("m", flags)
}

pub fn prefill_of(model: &str, flags: &[&str]) -> (Sim, u16) {
    let mut all = vec!["--pd-role", "prefill"];
    all.extend(defaults(&[("--ttft-ms", "5"), ("--itl-ms", "1")], flags));
    all.extend_from_slice(flags);
    let sim = Sim::start(model, &all);
    let bport = sim.bootstrap.expect("a prefill worker binds a bootstrap port");
    (sim, bport)
}

/// A decode sim that waits for its KV at most `handoff`.
pub fn decode(handoff: Duration, flags: &[&str]) -> Sim {
    decode_of("m", handoff, flags)
}

pub fn decode_of(model: &str, handoff: Duration, flags: &[&str]) -> Sim {
    let ms = handoff.as_millis().to_string();
    let mut all = vec!["--pd-role", "decode", "--handoff-timeout-ms", &ms];
    all.extend(defaults(&[("--itl-ms", "1")], flags));
    all.extend_from_slice(flags);
    Sim::start(model, &all)
}

/// The timing flags of `defaults` that `flags` does not set.
pub fn defaults<'a>(defaults: &[(&'a str, &'a str)], flags: &[&str]) -> Vec<&'a str> {
    defaults.iter().filter(|(f, _)| !flags.contains(f)).flat_map(|&(f, v)| [f, v]).collect()
}

/// A gateway in PD mode in front of `prefills` (URL, bootstrap port) and `decodes`, with
/// `extra` flags; returns once every worker is routable.
pub fn pd_gateway(legacy: bool, prefills: &[(String, Option<u16>)], decodes: &[String], extra: &[&str]) -> Gateway {
    let ports: Vec<String> = prefills.iter().map(|(_, p)| p.map(|p| p.to_string()).unwrap_or_default()).collect();
    let mut args = vec!["--pd-disaggregation"];
    for ((url, _), port) in prefills.iter().zip(&ports) {
        args.extend(["--prefill", url.as_str()]);
        if !port.is_empty() {
            args.push(port);
        }
    }
    for url in decodes {
        args.extend(["--decode", url.as_str()]);
    }
    args.extend_from_slice(extra);
    let gw = Gateway::start(legacy, &args);
    gw.ready_workers(prefills.len() + decodes.len());
    gw
}

pub fn chat(extra: &str) -> String {
    format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hello there"}}],"max_tokens":4{extra}}}"#)
}

pub fn stat(s: &Sim, key: &str) -> u64 {
    s.stats()[key].as_u64().unwrap_or(0)
}
