//! gRPC exchanges of the control thread with `grpc://` workers (SGLang's scheduler API):
//! HealthCheck as the health check, GetModelInfo + GetServerInfo (+ GetTokenizer) as
//! discovery, GetLoads for the load monitor. They run on the control thread's tokio runtime
//! (h2 needs an executor for its connection task; shards never run this code), each with a
//! connection of its own and one deadline, like the HTTP probes.

// The tokenizer cache (`loaded`) is shared by the control thread's probes, never by a shard, and
// is locked once per registration: a std Mutex is the plain tool for that.
#![allow(clippy::disallowed_types)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use prost::Message;
use smg_proto::common::{FlushCacheRequest, FlushCacheResponse, GetTokenizerChunk, GetTokenizerRequest};
use smg_proto::paths::sglang_scheduler as path;
use smg_proto::scheduler::{
    GetLoadsRequest, GetLoadsResponse, GetModelInfoRequest, GetModelInfoResponse, GetServerInfoRequest,
    GetServerInfoResponse, HealthCheckRequest, HealthCheckResponse,
};
use tokio::net::TcpStream;

use super::fleet::Discovery;
use super::snapshot::Runtime;
use super::WorkerUrl;
use crate::grpc::harmony::HarmonyTokens;
use crate::grpc::model::{GrpcModel, ModelSource, SamplingDefaults};
use crate::grpc::output::ModelParsers;
use crate::grpc::wire::{self, Code, Deframer, Status};
use crate::routing::EngineLoad;
use crate::tokenizer::Tokenizer;

pub(crate) async fn connect(url: &WorkerUrl) -> Result<SendRequest<Bytes>, Status> {
    let tcp = TcpStream::connect(url.addr).await.map_err(wire::transport)?;
    let _ = tcp.set_nodelay(true);
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(1 << 20)
        .initial_connection_window_size(16 << 20)
        .handshake::<_, Bytes>(tcp)
        .await
        .map_err(wire::transport)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

/// One call: the request message out, every response message back (one for a unary call).
async fn call<Req: Message, Resp: Message + Default>(
    send: &mut SendRequest<Bytes>,
    url: &WorkerUrl,
    method: &str,
    req: &Req,
) -> Result<Vec<Resp>, Status> {
    let mut ready = send.clone().ready().await.map_err(wire::transport)?;
    let (resp, mut body) = ready.send_request(wire::request(&url.authority, method), false).map_err(wire::transport)?;
    body.send_data(wire::frame(req), true).map_err(wire::transport)?;
    let resp = resp.await.map_err(wire::transport)?;
    if let Some(Err(s)) = wire::status_of(resp.headers()) {
        return Err(s);
    }
    let mut recv = resp.into_body();
    let mut frames = Deframer::default();
    let mut out = Vec::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.map_err(wire::transport)?;
        let _ = recv.flow_control().release_capacity(chunk.len());
        frames.push(&chunk);
        while let Some(m) = frames.next_message::<Resp>() {
            out.push(m?);
        }
    }
    match recv.trailers().await.map_err(wire::transport)?.as_ref().and_then(wire::status_of) {
        Some(Err(s)) => Err(s),
        _ if frames.pending() > 0 => Err(Status::new(Code::INTERNAL, "stream ended inside a message")),
        _ => Ok(out),
    }
}

async fn unary<Req: Message, Resp: Message + Default>(
    send: &mut SendRequest<Bytes>,
    url: &WorkerUrl,
    method: &str,
    req: &Req,
) -> Result<Resp, Status> {
    call(send, url, method, req).await?.pop().ok_or_else(|| Status::new(Code::INTERNAL, "no response message"))
}

async fn within<T>(timeout: Duration, f: impl std::future::Future<Output = Result<T, Status>>) -> Result<T, Status> {
    tokio::time::timeout(timeout, f)
        .await
        .unwrap_or_else(|_| Err(Status::new(Code::DEADLINE_EXCEEDED, "no answer within the health-check timeout")))
}

/// The health check: HealthCheck answers `healthy: true`.
pub async fn health(url: &WorkerUrl, timeout: Duration) -> Result<bool, Status> {
    within(timeout, async {
        let mut send = connect(url).await?;
        let r: HealthCheckResponse = unary(&mut send, url, path::HEALTH_CHECK, &HealthCheckRequest {}).await?;
        Ok(r.healthy)
    })
    .await
}

/// FlushCache (the admin `/flush_cache` fan-out): Ok(()) when the engine flushed.
pub async fn flush_cache(url: &WorkerUrl, timeout: Duration) -> Result<(), String> {
    let r: Result<FlushCacheResponse, Status> = within(timeout, async {
        let mut send = connect(url).await?;
        unary(&mut send, url, path::FLUSH_CACHE, &FlushCacheRequest { timeout_s: 0.0 }).await
    })
    .await;
    match r {
        Ok(r) if r.success => Ok(()),
        Ok(r) => Err(if r.message.is_empty() { "the engine did not flush".into() } else { r.message }),
        Err(s) => Err(s.to_string()),
    }
}

async fn get_loads(url: &WorkerUrl, timeout: Duration) -> Option<GetLoadsResponse> {
    within(timeout, async {
        let mut send = connect(url).await?;
        unary(&mut send, url, path::GET_LOADS, &GetLoadsRequest { dp_rank: None, include: Vec::new() }).await
    })
    .await
    .ok()
}

/// GetLoads as the load monitor's figures: requests (running + waiting) and waiting summed
/// over the ranks, and their mean KV token usage; under `--dp-aware`, the one rank `rank`
/// (each rank's entry is its own worker, as for HTTP workers' `/v1/loads`).
pub async fn loads(url: &WorkerUrl, rank: Option<u32>, timeout: Duration) -> Option<EngineLoad> {
    engine_load(&get_loads(url, timeout).await?, rank)
}

fn engine_load(r: &GetLoadsResponse, rank: Option<u32>) -> Option<EngineLoad> {
    let ranks: Vec<_> = r.loads.iter().filter(|s| rank.is_none_or(|want| s.dp_rank == want as i32)).collect();
    if ranks.is_empty() {
        return None;
    }
    let mut l = EngineLoad { total: 0, waiting: 0, token_usage: None };
    for s in &ranks {
        let total = if s.num_total_reqs > 0 { s.num_total_reqs } else { s.num_running_reqs + s.num_waiting_reqs };
        l.total += total.max(0) as u64;
        l.waiting += s.num_waiting_reqs.max(0) as u64;
    }
    let usage: f64 = ranks.iter().map(|s| s.token_usage).filter(|u| u.is_finite()).sum();
    l.token_usage = Some(usage / ranks.len() as f64);
    Some(l)
}

/// A float for JSON: non-finite engine figures (NaN, ∞) as `null`, which JSON can carry.
struct JsonF64(f64);

impl std::fmt::Display for JsonF64 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_finite() {
            write!(f, "{:?}", self.0)
        } else {
            f.write_str("null")
        }
    }
}

/// GetLoads for the admin `/get_loads`: the ranks' used KV tokens summed (None when the
/// engine reports no rank), and the answer as the JSON SGLang's HTTP `/v1/loads` gives
/// (the scalar fields; the optional per-section metrics are left out).
pub async fn load_details(url: &WorkerUrl, timeout: Duration) -> Option<(Option<u64>, String)> {
    use std::fmt::Write as _;
    let r = get_loads(url, timeout).await?;
    let used = (!r.loads.is_empty()).then(|| r.loads.iter().map(|s| s.num_used_tokens.max(0) as u64).sum());
    let mut j = String::with_capacity(256 + r.loads.len() * 320);
    let q = |s: &str| sonic_rs::to_string(s).unwrap_or_else(|_| "\"\"".into());
    let _ = write!(
        j,
        "{{\"timestamp\":{},\"version\":{},\"dp_rank_count\":{},\"loads\":[",
        q(&r.timestamp),
        q(&r.version),
        r.dp_rank_count
    );
    for (i, s) in r.loads.iter().enumerate() {
        if i > 0 {
            j.push(',');
        }
        let _ = write!(
            j,
            "{{\"dp_rank\":{},\"num_running_reqs\":{},\"num_waiting_reqs\":{},\"num_total_reqs\":{},\"num_used_tokens\":{},\"max_total_num_tokens\":{},\"token_usage\":{},\"gen_throughput\":{},\"cache_hit_rate\":{},\"utilization\":{},\"max_running_requests\":{},\"num_waiting_uncached_tokens\":{}}}",
            s.dp_rank,
            s.num_running_reqs,
            s.num_waiting_reqs,
            s.num_total_reqs,
            s.num_used_tokens,
            s.max_total_num_tokens,
            JsonF64(s.token_usage),
            JsonF64(s.gen_throughput),
            JsonF64(s.cache_hit_rate),
            JsonF64(s.utilization),
            s.max_running_requests,
            s.num_waiting_uncached_tokens,
        );
    }
    j.push(']');
    if let Some(a) = &r.aggregate {
        let _ = write!(
            j,
            ",\"aggregate\":{{\"total_running_reqs\":{},\"total_waiting_reqs\":{},\"total_reqs\":{},\"avg_token_usage\":{},\"avg_throughput\":{},\"avg_utilization\":{}}}",
            a.total_running_reqs,
            a.total_waiting_reqs,
            a.total_reqs,
            JsonF64(a.avg_token_usage),
            JsonF64(a.avg_throughput),
            JsonF64(a.avg_utilization)
        );
    }
    j.push('}');
    Some((used, j))
}

/// Registration of a gRPC worker: the model (served_model_name, else model_path), the
/// batch capacity from server_args, and the tokenizer — the operator's path, else the
/// advertised tokenizer_path when it is a local directory, else the engine's GetTokenizer
/// bundle. None until all of it succeeded: the worker is not routable before its tokenizer
/// is loaded.
pub async fn discover(url: &WorkerUrl, timeout: Duration, source: &ModelSource) -> Option<Discovery> {
    let found = within(timeout, async {
        let mut send = connect(url).await?;
        let info: GetModelInfoResponse = unary(&mut send, url, path::GET_MODEL_INFO, &GetModelInfoRequest {}).await?;
        let server: Option<GetServerInfoResponse> =
            unary(&mut send, url, path::GET_SERVER_INFO, &GetServerInfoRequest {}).await.ok();
        let bundle = if source.path.is_none() && !Path::new(&info.tokenizer_path).is_dir() {
            let chunks: Vec<GetTokenizerChunk> =
                call(&mut send, url, path::GET_TOKENIZER, &GetTokenizerRequest {}).await?;
            Some(chunks)
        } else {
            None
        };
        Ok((info, server, bundle))
    })
    .await;
    let (info, server, bundle) = match found {
        Ok(f) => f,
        Err(e) => {
            crate::debug!("worker {}: gRPC discovery: {e}", url.url);
            return None;
        }
    };
    let model = [&info.served_model_name, &info.model_path].into_iter().find(|s| !s.is_empty())?.clone();
    let tokenizer = match tokenizer(&info, source, bundle).await {
        Ok(t) => t,
        Err(e) => {
            crate::warn!("worker {}: tokenizer not loaded: {e}", url.url);
            return None;
        }
    };
    let defaults_json = [&info.default_sampling_params_json, &info.preferred_sampling_params]
        .into_iter()
        .find(|s| !s.trim().is_empty())
        .cloned()
        .unwrap_or_default();
    let arg = |name: &str| {
        let a = server.as_ref()?.server_args.as_ref()?;
        match a.fields.get(name)?.kind.as_ref()? {
            prost_types::value::Kind::NumberValue(n) if *n >= 1.0 => Some(*n as u64),
            _ => None,
        }
    };
    let max_running = arg("max_running_requests");
    // `--dp-aware` splits a worker with dp_size > 1 into ranks; each call then names its rank.
    // Clamped as the HTTP probe clamps it: an engine's figure never builds a million entries.
    let dp_size = arg("dp_size").map(|n| n.clamp(1, 1024) as u32);
    let grpc = GrpcModel {
        tokenizer: Arc::clone(&tokenizer),
        max_context: u32::try_from(info.max_context_length).ok().filter(|&n| n > 0),
        eos_ids: info.eos_token_ids.iter().filter_map(|&i| u32::try_from(i).ok()).collect(),
        supports_vision: info.supports_vision,
        is_generation: info.is_generation,
        defaults: SamplingDefaults::parse(&defaults_json),
        parsers: parsers_of(source, &[&info.served_model_name, &info.model_path]),
        harmony: HarmonyTokens::detect(
            &[&info.served_model_name, &info.model_path],
            &info.architectures,
            &info.model_type,
            &tokenizer,
        ),
    };
    Some(Discovery {
        model,
        runtime: Runtime::Sglang,
        dp_size,
        max_running,
        grpc: Some(Arc::new(grpc)),
        more_models: Vec::new(),
    })
}

/// The model's output parsers: the operator's, else those of the first of its names (served
/// name, then path) that belongs to a known family.
fn parsers_of(source: &ModelSource, names: &[&String]) -> ModelParsers {
    let (r, t) = (source.reasoning_parser.as_deref(), source.tool_parser.as_deref());
    let mut chosen = ModelParsers::choose(r, t, "");
    for name in names.iter().filter(|n| !n.is_empty()) {
        let by_name = ModelParsers::choose(r, t, name);
        chosen.reasoning = chosen.reasoning.or(by_name.reasoning);
        chosen.tools = chosen.tools.or(by_name.tools);
    }
    chosen
}

/// Tokenizers by where they came from, so the workers of one model share one (and a
/// re-registration does not load it again while any worker holds it).
fn loaded() -> &'static Mutex<HashMap<String, Weak<Tokenizer>>> {
    static LOADED: std::sync::OnceLock<Mutex<HashMap<String, Weak<Tokenizer>>>> = std::sync::OnceLock::new();
    LOADED.get_or_init(Default::default)
}

async fn tokenizer(
    info: &GetModelInfoResponse,
    source: &ModelSource,
    bundle: Option<Vec<GetTokenizerChunk>>,
) -> Result<Arc<Tokenizer>, String> {
    let (key, job): (String, Box<dyn FnOnce() -> Result<Tokenizer, String> + Send>) = match (&source.path, bundle) {
        (Some(p), _) => {
            let p = p.clone();
            (format!("path:{}", p.display()), Box::new(move || Tokenizer::load(&p)))
        }
        (None, None) => {
            let p = PathBuf::from(&info.tokenizer_path);
            (format!("path:{}", p.display()), Box::new(move || Tokenizer::load(&p)))
        }
        (None, Some(chunks)) => {
            let sha = chunks.iter().rev().map(|c| c.sha256.clone()).find(|s| !s.is_empty()).unwrap_or_default();
            let zip: Vec<u8> = chunks.into_iter().flat_map(|c| c.data).collect();
            let key = format!(
                "bundle:{}:{}",
                info.model_path,
                if sha.is_empty() { zip.len().to_string() } else { sha.clone() }
            );
            (key, Box::new(move || crate::grpc::bundle::load(&zip, &sha)))
        }
    };
    if let Some(t) = loaded().lock().ok().and_then(|m| m.get(&key).and_then(Weak::upgrade)) {
        return Ok(t);
    }
    // Building a tokenizer takes tens of milliseconds for a real vocabulary: off the loop,
    // so other workers' probes keep their schedule.
    let t = Arc::new(tokio::task::spawn_blocking(job).await.map_err(|e| e.to_string())??);
    if let Ok(mut m) = loaded().lock() {
        m.retain(|_, w| w.strong_count() > 0);
        m.insert(key, Arc::downgrade(&t));
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use smg_proto::scheduler::SchedulerLoad;

    fn rank(dp_rank: i32, running: i32, waiting: i32, usage: f64) -> SchedulerLoad {
        SchedulerLoad {
            dp_rank,
            num_running_reqs: running,
            num_waiting_reqs: waiting,
            token_usage: usage,
            ..Default::default()
        }
    }

    #[test]
    fn a_dp_aware_entry_reads_its_own_rank() {
        let r = GetLoadsResponse { loads: vec![rank(0, 30, 5, 0.5), rank(1, 2, 0, f64::NAN)], ..Default::default() };
        assert_eq!(engine_load(&r, Some(0)), Some(EngineLoad { total: 35, waiting: 5, token_usage: Some(0.5) }));
        assert_eq!(engine_load(&r, Some(1)), Some(EngineLoad { total: 2, waiting: 0, token_usage: Some(0.0) }));
        assert_eq!(engine_load(&r, Some(2)), None, "a rank the engine does not report");
        assert_eq!(engine_load(&r, None), Some(EngineLoad { total: 37, waiting: 5, token_usage: Some(0.25) }));
    }

    #[test]
    fn non_finite_figures_are_null_in_json() {
        assert_eq!(format!("{} {} {}", JsonF64(0.25), JsonF64(f64::NAN), JsonF64(f64::INFINITY)), "0.25 null null");
    }
}
