//! Parses a worker's `/v1/loads` answer (SGLang's schema) into one load figure for
//! `least_load` and `power_of_two`. The polling loop (`--load-monitor-interval`) is the
//! caller's.

use sonic_rs::{JsonType, JsonValueTrait};

/// One load figure from an SGLang `/v1/loads` body: the requests the engine holds (running plus
/// waiting), summed over its data-parallel ranks.
///
/// The schema is `{"timestamp": .., "dp_rank_count": n, "loads": [{"dp_rank": 0,
/// "num_running_reqs": r, "num_waiting_reqs": w, "num_total_reqs": t, ..}, ..]}`. A rank's figure
/// is `num_total_reqs` when present, else running + waiting. Queued work is what a new request
/// waits behind, so requests (not KV tokens) are the figure. A body that is not this schema is
/// `None`, and the worker falls back to the gateway's in-flight count.
pub fn parse_sglang_loads(body: &[u8]) -> Option<u64> {
    parse_engine_load(body, None).map(|l| l.total)
}

/// What the load monitor reads from `/v1/loads`: the routing figure, and the overload
/// signals SMG uses (waiting requests summed, KV `token_usage` averaged over the ranks).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineLoad {
    pub total: u64,
    pub waiting: u64,
    pub token_usage: Option<f64>,
}

/// The figures of every rank, or of `rank` alone (a data-parallel rank routed on its own).
pub fn parse_engine_load(body: &[u8], rank: Option<u32>) -> Option<EngineLoad> {
    let loads = crate::bounded_json::get(body, &["loads"])?;
    if loads.get_type() != JsonType::Array {
        return None;
    }
    let mut out = EngineLoad { total: 0, waiting: 0, token_usage: None };
    let (mut ranks, mut usage_sum, mut usage_n) = (0usize, 0f64, 0usize);
    for (i, r) in loads.into_array_iter()?.enumerate() {
        let r = r.ok()?;
        if r.get_type() != JsonType::Object {
            return None;
        }
        let field = |name: &str| r.get(name).and_then(|v| v.as_u64());
        if let Some(want) = rank {
            let this = field("dp_rank").unwrap_or(i as u64);
            if this != u64::from(want) {
                continue;
            }
        }
        let running = field("num_running_reqs");
        let waiting = field("num_waiting_reqs");
        let figure = match field("num_total_reqs") {
            Some(t) => t,
            None if running.is_none() && waiting.is_none() => return None,
            None => running.unwrap_or(0).saturating_add(waiting.unwrap_or(0)),
        };
        out.total = out.total.saturating_add(figure);
        out.waiting = out.waiting.saturating_add(waiting.unwrap_or(0));
        if let Some(u) = r.get("token_usage").and_then(|v| v.as_f64()) {
            usage_sum += u;
            usage_n += 1;
        }
        ranks += 1;
    }
    out.token_usage = (usage_n > 0).then(|| usage_sum / usage_n as f64);
    (ranks > 0).then_some(out)
}
