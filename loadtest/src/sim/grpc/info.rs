//! The unary RPCs: health, model and server information, loads, abort and cache flush. Figures
//! are the worker's own (the same the HTTP mode's /server_info and /v1/loads report).

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use prost_types::value::Kind;
use smg_proto::common::{FlushCacheRequest, FlushCacheResponse};
use smg_proto::scheduler::{
    AbortRequest, AbortResponse, AggregateMetrics, DisaggregationMetrics, GetLoadsRequest, GetLoadsResponse,
    GetModelInfoRequest, GetModelInfoResponse, GetServerInfoRequest, GetServerInfoResponse, HealthCheckRequest,
    HealthCheckResponse, SchedulerLoad,
};

use crate::sim::grpc::wire::{Code, Status};
use crate::sim::tokenizer::{self, CONTEXT_LENGTH};
use crate::sim::worker::Worker;

/// The simulated engine's version, as the HTTP mode reports it.
const VERSION: &str = "0.0.0-smg-sim";
/// Sampling defaults the model advertises (a real model's generation_config.json would): a
/// gateway applies them to fields the client left out.
pub const DEFAULT_SAMPLING_JSON: &str = "{\"temperature\":0.7,\"top_p\":0.8,\"top_k\":20}";

pub fn health_check(w: &Worker, _: HealthCheckRequest) -> Result<HealthCheckResponse, Status> {
    let healthy = w.health.is_healthy();
    let message = if healthy { "ok" } else { "simulated unhealthy worker" };
    Ok(HealthCheckResponse { healthy, message: message.into() })
}

pub fn model_info(w: &Worker, _: GetModelInfoRequest) -> Result<GetModelInfoResponse, Status> {
    let dir = w.grpc.as_ref().map(|g| g.advertised_path.clone()).unwrap_or_default();
    let bridged = w.grpc.as_ref().is_some_and(|g| g.llama.is_some());
    let harmony = crate::sim::grpc::markup::is_harmony_model(&w.model);
    Ok(GetModelInfoResponse {
        // The model's files are the tokenizer directory (it also holds a config.json).
        model_path: dir.clone(),
        tokenizer_path: dir,
        is_generation: !w.grpc.as_ref().is_some_and(|g| g.embedding),
        preferred_sampling_params: String::new(),
        weight_version: "default".into(),
        served_model_name: w.model.clone(),
        max_context_length: CONTEXT_LENGTH as i32,
        vocab_size: tokenizer::vocab_size() as i32,
        supports_vision: false,
        model_type: if harmony { "gpt_oss" } else { "llama" }.into(),
        eos_token_ids: vec![tokenizer::IM_END_ID as i32],
        pad_token_id: tokenizer::ENDOFTEXT_ID as i32,
        bos_token_id: 0,
        max_req_input_len: CONTEXT_LENGTH as i32 - 1,
        architectures: vec![if harmony { "GptOssForCausalLM" } else { "LlamaForCausalLM" }.into()],
        id2label_json: String::new(),
        num_labels: 0,
        // A real model behind --llama-url has its own defaults, which the simulator does not know.
        default_sampling_params_json: if bridged { String::new() } else { DEFAULT_SAMPLING_JSON.into() },
    })
}

pub fn server_info(w: &Worker, _: GetServerInfoRequest) -> Result<GetServerInfoResponse, Status> {
    let dir = w.grpc.as_ref().map(|g| g.advertised_path.clone()).unwrap_or_default();
    let now = now_secs();
    let mut args = vec![
        ("model_path", Kind::StringValue(dir.clone())),
        ("tokenizer_path", Kind::StringValue(dir)),
        ("served_model_name", Kind::StringValue(w.model.clone())),
        ("port", Kind::NumberValue(w.port as f64)),
        ("tp_size", Kind::NumberValue(1.0)),
        ("dp_size", Kind::NumberValue(w.stats.dp_rank_requests.len() as f64)),
        ("max_running_requests", Kind::NumberValue(w.max_running as f64)),
        ("context_length", Kind::NumberValue(CONTEXT_LENGTH as f64)),
        ("skip_tokenizer_init", Kind::BoolValue(true)),
        // SGLang's own server args: "null" when not a PD worker.
        ("disaggregation_mode", Kind::StringValue(disaggregation_mode(w).into())),
    ];
    if let Some(addr) = w.pd.as_ref().and_then(|p| p.bootstrap_addr) {
        args.push(("disaggregation_bootstrap_port", Kind::NumberValue(addr.port() as f64)));
    }
    let server_args = structure(&args);
    let scheduler_info = structure(&[
        ("max_total_num_tokens", Kind::NumberValue(w.max_total_tokens() as f64)),
        ("max_req_input_len", Kind::NumberValue((CONTEXT_LENGTH - 1) as f64)),
    ]);
    Ok(GetServerInfoResponse {
        server_args: Some(server_args),
        scheduler_info: Some(scheduler_info),
        active_requests: (w.running() + w.waiting()) as i32,
        is_paused: false,
        last_receive_timestamp: now,
        uptime_seconds: (now - w.created as f64).max(0.0),
        sglang_version: VERSION.into(),
        server_type: "grpc".into(),
        start_time: Some(prost_types::Timestamp { seconds: w.created as i64, nanos: 0 }),
        max_total_num_tokens: clamp_i32(w.max_total_tokens()),
    })
}

/// One DP rank (the simulated ranks share one batch), as the HTTP mode's /v1/loads.
pub fn loads(w: &Worker, req: GetLoadsRequest) -> Result<GetLoadsResponse, Status> {
    if let Some(rank) = req.dp_rank.filter(|&r| r != 0) {
        return Err(Status::new(Code::INVALID_ARGUMENT, format!("dp_rank {rank} out of range (1 rank)")));
    }
    let (running, waiting) = w.reported_load();
    let used = w.stats.used_tokens.get();
    let max_tokens = w.max_total_tokens().max(1);
    let token_usage = used as f64 / max_tokens as f64;
    let utilization = running as f64 / w.max_running as f64;
    let throughput = w.gen_throughput();
    let load = SchedulerLoad {
        dp_rank: 0,
        num_running_reqs: running as i32,
        num_waiting_reqs: waiting as i32,
        num_total_reqs: (running + waiting) as i32,
        num_used_tokens: clamp_i32(used),
        max_total_num_tokens: clamp_i32(max_tokens),
        token_usage,
        gen_throughput: throughput,
        cache_hit_rate: w.cache.borrow().hit_rate(),
        utilization,
        max_running_requests: w.max_running as i32,
        // An optional section, there when asked for (only its mode is simulated).
        disaggregation: req
            .include
            .iter()
            .any(|s| s == "disagg" || s == "all")
            .then(|| DisaggregationMetrics { mode: disaggregation_mode(w).into(), ..Default::default() }),
        ..Default::default()
    };
    Ok(GetLoadsResponse {
        timestamp: iso8601(now_secs() as i64),
        version: VERSION.into(),
        dp_rank_count: 1,
        loads: vec![load],
        aggregate: Some(AggregateMetrics {
            total_running_reqs: running as i32,
            total_waiting_reqs: waiting as i32,
            total_reqs: (running + waiting) as i32,
            avg_token_usage: token_usage,
            avg_throughput: throughput,
            avg_utilization: utilization,
        }),
    })
}

pub fn abort(w: &Worker, req: AbortRequest) -> Result<AbortResponse, Status> {
    let hit = w.grpc_state.abort(&req.request_id);
    let message = if hit { "aborted" } else { "no such running request" };
    // SGLang answers success either way: the request may have finished meanwhile.
    Ok(AbortResponse { success: true, message: message.into() })
}

pub fn flush_cache(w: &Worker, _: FlushCacheRequest) -> Result<FlushCacheResponse, Status> {
    w.flush_cache();
    Ok(FlushCacheResponse { success: true, message: "cache flushed".into() })
}

/// SGLang's `--disaggregation-mode`: "prefill", "decode", or "null".
fn disaggregation_mode(w: &Worker) -> &'static str {
    w.pd.as_ref().map_or("null", |p| p.role.name())
}

fn structure(fields: &[(&str, Kind)]) -> prost_types::Struct {
    let fields: BTreeMap<String, prost_types::Value> =
        fields.iter().map(|(k, v)| (k.to_string(), prost_types::Value { kind: Some(v.clone()) })).collect();
    prost_types::Struct { fields }
}

fn clamp_i32(v: u64) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// `2026-01-31T12:00:00Z` from Unix seconds.
fn iso8601(secs: i64) -> String {
    let c = smg_wire::civil::from_unix(secs);
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", c.year, c.month, c.day, c.hour, c.minute, c.second)
}

#[cfg(test)]
mod tests {
    use super::iso8601;

    #[test]
    fn timestamps() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601(1_767_225_599), "2025-12-31T23:59:59Z");
    }
}
