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
    let loads = sonic_rs::get(body, ["loads"]).ok()?;
    if loads.get_type() != JsonType::Array {
        return None;
    }
    let mut total: u64 = 0;
    let mut ranks = 0usize;
    for rank in loads.into_array_iter()? {
        let rank = rank.ok()?;
        if rank.get_type() != JsonType::Object {
            return None;
        }
        let field = |name: &str| rank.get(name).and_then(|v| v.as_u64());
        let figure = match field("num_total_reqs") {
            Some(t) => t,
            None => {
                let running = field("num_running_reqs");
                let waiting = field("num_waiting_reqs");
                if running.is_none() && waiting.is_none() {
                    return None;
                }
                running.unwrap_or(0).saturating_add(waiting.unwrap_or(0))
            }
        };
        total = total.saturating_add(figure);
        ranks += 1;
    }
    (ranks > 0).then_some(total)
}
