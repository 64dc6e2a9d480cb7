//! Maps method + path to an endpoint and answers everything that is not generation (health, info, loads, control).
//!
//! Generation requests come back as a [`Job`] for `engine` to run with the timing model;
//! faults are drawn here, before the job takes a batch slot.

use std::fmt::Write as _;

use sonic_rs::JsonValueTrait;

use crate::sim::config::{ms_to_us, Runtime};
use crate::sim::faults::{self, Fault};
use crate::sim::pd::{self, Handoff, PdProtocol, PdRole};
use crate::sim::provider::ProviderFail;
use crate::sim::realtime;
use crate::sim::render::{put_embeddings_body, put_error_body, put_response};
use crate::sim::request::{self, Api};
use crate::sim::timing;
use crate::sim::worker::{bump, Worker};

/// Endpoints the simulator knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Health,
    HealthGenerate,
    Models,
    ModelInfo,
    ServerInfo,
    /// SGLang `/v1/loads`.
    Loads,
    /// SGLang's older `/get_load`.
    GetLoad,
    /// vLLM `/load`.
    VllmLoad,
    /// vLLM `/version`, which SGLang lacks: one way a gateway tells the engines apart.
    Version,
    Infer(Api),
    /// SGLang `/v1/systemone`, or vLLM `/v1/decisions` (see systemone.rs).
    Decisions,
    FlushCache,
    SimControl,
    SimStats,
    /// `/sim/requests`: what the worker was sent (request_log.rs).
    SimRequests,
    /// `/sim/connects`: what the CONNECT proxy was asked (tls.rs).
    SimConnects,
    /// `GET /v1/realtime`, a WebSocket session (see realtime.rs).
    Realtime,
    /// One of the Realtime REST routes, echoed.
    RealtimeRest(&'static str),
    /// `POST /v1/responses`: served by `--provider-keys` workers only (provider_responses.rs);
    /// other workers answer 404 as for any unknown path.
    Responses,
    NotFound,
}

/// Resolves a path (query string already removed) for a worker of `runtime`.
pub fn resolve(path: &str, runtime: Runtime) -> Route {
    let sglang = runtime == Runtime::Sglang;
    match path {
        "/health" => Route::Health,
        "/v1/models" => Route::Models,
        "/v1/chat/completions" => Route::Infer(Api::Chat),
        "/v1/completions" => Route::Infer(Api::Completions),
        "/v1/embeddings" => Route::Infer(Api::Embeddings),
        "/v1/messages" => Route::Infer(Api::Messages),
        "/v1/responses" => Route::Responses,
        "/sim/control" => Route::SimControl,
        "/sim/stats" => Route::SimStats,
        "/sim/requests" => Route::SimRequests,
        "/sim/connects" => Route::SimConnects,
        realtime::WS_PATH => Route::Realtime,
        p if realtime::REST_PATHS.contains(&p) => {
            Route::RealtimeRest(realtime::REST_PATHS.iter().copied().find(|r| *r == p).unwrap_or(""))
        }
        "/health_generate" if sglang => Route::HealthGenerate,
        "/get_model_info" | "/model_info" if sglang => Route::ModelInfo,
        "/get_server_info" | "/server_info" if sglang => Route::ServerInfo,
        "/v1/loads" if sglang => Route::Loads,
        "/get_load" if sglang => Route::GetLoad,
        "/generate" if sglang => Route::Infer(Api::Generate),
        "/flush_cache" if sglang => Route::FlushCache,
        "/v1/systemone" if sglang => Route::Decisions,
        "/v1/decisions" if !sglang => Route::Decisions,
        "/reset_prefix_cache" if !sglang => Route::FlushCache,
        "/load" if !sglang => Route::VllmLoad,
        "/version" if !sglang => Route::Version,
        _ => Route::NotFound,
    }
}

/// A generation request ready for the timing model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub api: Api,
    pub stream: bool,
    pub include_usage: bool,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u32,
    /// Generation stopped at max_tokens (finish_reason "length").
    pub hit_limit: bool,
    /// Some(after) when the response is to be cut off.
    pub truncate: Option<Option<u32>>,
    /// A PD worker's part: rooms to mark finished (prefill) or to wait for (decode).
    pub(crate) handoff: Handoff,
    /// `/generate` with `return_logprob`: the prompt positions its `input_token_logprobs` cover
    /// (empty on a PD decode server); None without.
    pub logprobs: Option<std::ops::Range<u64>>,
}

/// What the connection does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// A complete response is in the output buffer.
    Reply {
        keep_alive: bool,
    },
    Generate(Job),
    /// A `--provider-keys` worker's Responses answer, for `provider_responses::run`.
    Responses(Box<crate::sim::provider_responses::Turn>),
    Hang,
    /// Close without answering (the worker is dead).
    Close,
    /// A control request asked the worker to die: kill every other connection at once, then
    /// write the reply in the output buffer and close.
    Die,
}

const JSON: &str = "application/json";

/// The vLLM release a vLLM worker claims at `/version`.
pub const VLLM_VERSION: &str = "0.10.1";

/// Answers one request. `out` receives any immediate response.
pub fn dispatch(w: &Worker, route: Route, is_post: bool, body: &[u8], keep_alive: bool, out: &mut Vec<u8>) -> Action {
    bump(&w.stats.requests, 1);
    if w.died.is_fired() {
        return Action::Close;
    }
    let extra = &w.extra_headers;
    let reply = |out: &mut Vec<u8>, status: u16, ctype: &str, body: &[u8]| {
        put_response(out, status, ctype, body, keep_alive, extra);
        Action::Reply { keep_alive }
    };
    match route {
        Route::Health | Route::HealthGenerate => {
            let status = if w.health.is_healthy() { 200 } else { 503 };
            reply(out, status, "text/plain", b"")
        }
        Route::Models => reply(out, 200, JSON, &w.models_body),
        Route::ModelInfo => reply(out, 200, JSON, &w.model_info_body),
        Route::ServerInfo => reply(out, 200, JSON, &w.server_info_body),
        Route::Loads => reply(out, 200, JSON, loads_body(w).as_bytes()),
        Route::GetLoad => {
            let (running, waiting) = w.reported_load();
            let body = format!(
                "[{{\"dp_rank\":0,\"num_reqs\":{},\"num_waiting_reqs\":{waiting},\"num_tokens\":{}}}]",
                running + waiting,
                w.stats.used_tokens.get()
            );
            reply(out, 200, JSON, body.as_bytes())
        }
        Route::VllmLoad => {
            let (running, waiting) = w.reported_load();
            let body = format!("{{\"server_load\":{}}}", running + waiting);
            reply(out, 200, JSON, body.as_bytes())
        }
        Route::Version => {
            let body = format!("{{\"version\":\"{VLLM_VERSION}\"}}");
            reply(out, 200, JSON, body.as_bytes())
        }
        Route::FlushCache => {
            w.flush_cache();
            reply(out, 200, "text/plain", b"Cache flushed.\n")
        }
        Route::SimStats => reply(out, 200, JSON, stats_body(w).as_bytes()),
        Route::SimRequests => reply(out, 200, JSON, w.requests.json().as_bytes()),
        Route::SimConnects => reply(out, 200, JSON, connects_json(w).as_bytes()),
        Route::SimControl if is_post => match apply_control(w, body) {
            Ok(Control { die: false }) => reply(out, 200, JSON, stats_body(w).as_bytes()),
            Ok(Control { die: true }) => {
                // Fired now so the reply already says "dead" and the accept loop stops;
                // the connection layer shuts the other connections before writing this.
                w.died.fire();
                put_response(out, 200, JSON, stats_body(w).as_bytes(), false, extra);
                Action::Die
            }
            Err(e) => error_reply(out, 400, &e, keep_alive, extra),
        },
        Route::Infer(api) if is_post => infer(w, api, body, keep_alive, out),
        Route::Responses if w.providers.is_some() && is_post => {
            use crate::sim::provider_responses::{dispatch, Opening};
            match dispatch(w, body, keep_alive, out) {
                Opening::Replied => Action::Reply { keep_alive },
                Opening::Hang => Action::Hang,
                Opening::Turn(t) => Action::Responses(t),
            }
        }
        Route::Responses if w.providers.is_some() => error_reply(out, 405, "method not allowed", keep_alive, extra),
        Route::Decisions if is_post => match (bump(&w.stats.inference, 1), w.runtime).1 {
            Runtime::Sglang => {
                let (status, body) = crate::sim::systemone::systemone(body);
                reply(out, status, JSON, &body)
            }
            _ => reply(out, 200, JSON, body),
        },
        Route::SimControl | Route::Infer(_) | Route::Decisions => {
            error_reply(out, 405, "method not allowed", keep_alive, extra)
        }
        // Served by the connection (http.rs) when the method is right.
        Route::Realtime | Route::RealtimeRest(_) => error_reply(out, 405, "method not allowed", keep_alive, extra),
        Route::NotFound | Route::Responses => error_reply(out, 404, "not found", keep_alive, extra),
    }
}

/// `[{"target": "host:port", "proxy_authorization": "..." | null}, ...]`, oldest first.
fn connects_json(w: &Worker) -> String {
    let log = w.connects.lock().map(|g| g.clone()).unwrap_or_default();
    let mut b = Vec::with_capacity(64 * log.len() + 2);
    b.push(b'[');
    for (i, (target, auth)) in log.iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        b.extend_from_slice(b"{\"target\":");
        crate::sim::render::put_json_str(&mut b, target);
        b.extend_from_slice(b",\"proxy_authorization\":");
        match auth {
            Some(a) => crate::sim::render::put_json_str(&mut b, a),
            None => b.extend_from_slice(b"null"),
        }
        b.push(b'}');
    }
    b.push(b']');
    String::from_utf8(b).unwrap_or_default()
}

fn error_reply(out: &mut Vec<u8>, status: u16, msg: &str, keep_alive: bool, extra: &[u8]) -> Action {
    let mut body = Vec::with_capacity(128);
    put_error_body(&mut body, status, msg);
    put_response(out, status, JSON, &body, keep_alive, extra);
    Action::Reply { keep_alive }
}

fn infer(w: &Worker, api: Api, body: &[u8], keep_alive: bool, out: &mut Vec<u8>) -> Action {
    let req = match request::parse(api, body) {
        Ok(r) => r,
        Err(e) => return error_reply(out, 400, &e, keep_alive, &w.extra_headers),
    };
    if let Some(rank) = req.dp_rank {
        let ranks = &w.stats.dp_rank_requests;
        match usize::try_from(rank).ok().and_then(|r| ranks.get(r)) {
            Some(c) => bump(c, 1),
            None => {
                let msg = format!("data_parallel_rank {rank} out of range (dp_size {})", ranks.len());
                return error_reply(out, 400, &msg, keep_alive, &w.extra_headers);
            }
        }
    }
    let handoff = match pd_handoff(w, api, body) {
        Ok(h) => h,
        Err(e) => return error_reply(out, 400, &e, keep_alive, &w.extra_headers),
    };
    let logprobs = match (api, req.return_logprob) {
        (Api::Generate, true) => {
            let prompt_tokens = w.cache.borrow().tokens_for(req.prompt.len());
            match logprob_positions(req.logprob_start_len, prompt_tokens, &handoff) {
                Ok(r) => Some(r),
                Err(e) => return error_reply(out, 400, &e, keep_alive, &w.extra_headers),
            }
        }
        _ => None,
    };
    let fault = faults::draw(&w.faults.get(), &w.rng);
    let truncate = match fault {
        Fault::Fail { status } => {
            bump(&w.stats.failed, 1);
            return error_reply(out, status, "simulated worker failure", keep_alive, &w.extra_headers);
        }
        Fault::Hang => {
            bump(&w.stats.hung, 1);
            return Action::Hang;
        }
        Fault::Truncate { after_tokens } => Some(after_tokens),
        Fault::None => None,
    };
    bump(&w.stats.inference, 1);
    let ids = match api {
        Api::Chat | Api::Completions | Api::Generate if w.tokenize_http => {
            crate::sim::tokenizer::http_prompt_ids(matches!(api, Api::Chat | Api::Messages), &req.prompt)
        }
        _ => None,
    };
    let cache = match &ids {
        Some(ids) => {
            let bpt = w.cache.borrow().bytes_per_token();
            w.cache_prompt(&crate::sim::prefix_cache::ids_key(ids, bpt), Some(ids))
        }
        None => w.cache_prompt(req.prompt.as_bytes(), None),
    };
    bump(&w.stats.prompt_tokens, cache.prompt_tokens);
    bump(&w.stats.cached_tokens, cache.cached_tokens);
    if api == Api::Embeddings {
        let mut b = Vec::with_capacity(64 + w.embedding_json.len());
        put_embeddings_body(&mut b, &w.model_json, &w.embedding_json, cache.prompt_tokens);
        put_response(out, 200, JSON, &b, keep_alive, &w.extra_headers);
        bump(&w.stats.completed, 1);
        return Action::Reply { keep_alive };
    }
    let (output_tokens, hit_limit) = match handoff {
        // A prefill server answers with the first token only; the decode server generates the rest.
        Handoff::Prefill(_) | Handoff::VllmPrefill(_) => (1, true),
        _ => timing::output_tokens(&w.timing.get(), req.max_tokens),
    };
    Action::Generate(Job {
        api,
        stream: req.stream,
        include_usage: req.include_usage,
        prompt_tokens: cache.prompt_tokens,
        cached_tokens: cache.cached_tokens,
        output_tokens,
        hit_limit,
        truncate,
        handoff,
        logprobs,
    })
}

/// The prompt positions `/generate`'s `input_token_logprobs` cover: from `logprob_start_len`
/// (SGLang's default -1, or any negative: the last prompt token only) to the prompt's end; none
/// on a PD decode server, which computes no prompt log-probabilities. A start at or past the
/// prompt's end is an error, as SGLang's.
fn logprob_positions(
    start: Option<i64>,
    prompt_tokens: u64,
    handoff: &Handoff,
) -> Result<std::ops::Range<u64>, String> {
    let from = match start.and_then(|s| u64::try_from(s).ok()) {
        Some(s) if s >= prompt_tokens => {
            return Err(format!(
                "logprob_start_len ({s}) is higher than the number of input tokens ({prompt_tokens}). Request with a lower logprob_start_len."
            ))
        }
        Some(s) => s,
        None => prompt_tokens.saturating_sub(1),
    };
    Ok(match handoff {
        Handoff::Decode(_) => prompt_tokens..prompt_tokens,
        _ => from..prompt_tokens,
    })
}

/// A PD worker's part in a generation request, from the fields of its protocol (a 400 when the
/// role's are missing).
fn pd_handoff(w: &Worker, api: Api, body: &[u8]) -> Result<Handoff, String> {
    let Some(state) = w.pd.as_ref() else { return Ok(Handoff::None) };
    if api == Api::Embeddings {
        return Ok(Handoff::None);
    }
    match (state.protocol, state.role) {
        (PdProtocol::Sglang, PdRole::Prefill) => pd::fields::read(body)?.rooms().map(Handoff::Prefill),
        (PdProtocol::Sglang, PdRole::Decode) => pd::fields::read(body)?.legs().map(Handoff::Decode),
        // vLLM's proxy names no room: the prefill takes one and says which in its answer.
        (PdProtocol::Vllm, PdRole::Prefill) => {
            pd::vllm::check_prefill(body).map(|()| Handoff::VllmPrefill(state.new_room()))
        }
        (PdProtocol::Vllm, PdRole::Decode) => pd::vllm::decode_leg(body).map(|leg| Handoff::Decode(vec![leg])),
    }
}

/// SGLang's `/v1/loads` schema, one DP rank (the simulated ranks share one batch). The request
/// counts honour the "reported_load" override; token figures stay real.
fn loads_body(w: &Worker) -> String {
    let (running, waiting) = w.reported_load();
    let used = w.stats.used_tokens.get();
    let max_tokens = w.max_total_tokens().max(1);
    let cache = w.cache.borrow();
    let token_usage = used as f64 / max_tokens as f64;
    let util = running as f64 / w.max_running as f64;
    let thr = w.gen_throughput();
    let hit = cache.hit_rate();
    let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format!(
        "{{\"timestamp\":\"{ts}\",\"version\":\"0.0.0-smg-sim\",\"dp_rank_count\":1,\"loads\":[{{\"dp_rank\":0,\"num_running_reqs\":{running},\"num_waiting_reqs\":{waiting},\"num_total_reqs\":{total},\"num_used_tokens\":{used},\"max_total_num_tokens\":{max_tokens},\"max_running_requests\":{maxr},\"token_usage\":{token_usage:.4},\"gen_throughput\":{thr:.2},\"cache_hit_rate\":{hit:.4},\"utilization\":{util:.4}}}],\"aggregate\":{{\"total_running_reqs\":{running},\"total_waiting_reqs\":{waiting},\"total_reqs\":{total},\"avg_token_usage\":{token_usage:.4},\"avg_throughput\":{thr:.2},\"avg_utilization\":{util:.4}}}}}",
        total = running + waiting,
        maxr = w.max_running,
    )
}

/// Counters and current settings, as /sim/stats and /sim/control return them.
pub fn stats_body(w: &Worker) -> String {
    let s = &w.stats;
    let t = w.timing.get();
    let f = w.faults.get();
    let opt = |v: Option<u64>| v.map_or_else(|| "null".to_string(), |n| n.to_string());
    let mut out = String::with_capacity(768);
    let _ = write!(
        out,
        "{{\"port\":{},\"model\":{},\"runtime\":\"{}\",\"healthy\":{},\"dead\":{},\"connections_open\":{},\"requests\":{},\"inference_requests\":{},\"completed\":{},\"failed\":{},\"hung\":{},\"truncated\":{},\"running\":{},\"waiting\":{},\"prompt_tokens\":{},\"cached_tokens\":{},\"output_tokens\":{},\"cache_hit_rate\":{:.4},\"cache_used_tokens\":{},\"dp_rank_requests\":[",
        w.port,
        w.model_json,
        w.runtime.name(),
        w.health.is_healthy(),
        w.died.is_fired(),
        w.conns.borrow().len(),
        s.requests.get(),
        s.inference.get(),
        s.completed.get(),
        s.failed.get(),
        s.hung.get(),
        s.truncated.get(),
        w.running(),
        w.waiting(),
        s.prompt_tokens.get(),
        s.cached_tokens.get(),
        s.output_tokens.get(),
        w.cache.borrow().hit_rate(),
        w.cache.borrow().used_tokens(),
    );
    for (i, c) in s.dp_rank_requests.iter().enumerate() {
        let _ = write!(out, "{}{}", if i == 0 { "" } else { "," }, c.get());
    }
    out.push(']');
    let _ = write!(
        out,
        ",\"pd_role\":{},\"handoffs_served\":{},\"handoffs_waited\":{},\"handoffs_failed\":{},\"handoff_wait_ms\":{:.3}",
        w.pd.as_ref().map_or_else(|| "null".to_string(), |p| format!("\"{}\"", p.role.name())),
        s.handoffs_served.get(),
        s.handoffs_waited.get(),
        s.handoffs_failed.get(),
        s.handoff_wait_us.get() as f64 / 1000.0,
    );
    let (peak_running, peak_waiting) = w.gate.peaks();
    let _ = write!(out, ",\"peak_running\":{peak_running},\"peak_waiting\":{peak_waiting}");
    if let Some(pd) = w.pd.as_ref().filter(|p| p.role == PdRole::Prefill) {
        let _ = write!(out, ",\"handoffs_pending\":{}", pd.rooms.pending());
    }
    if w.grpc.is_some() {
        let _ = write!(out, ",\"grpc\":{}", w.grpc_state.stats_json());
    }
    if let Some(kv) = w.kv_events_stats() {
        let _ = write!(out, ",\"kv_events\":{kv}");
    }
    let _ = write!(
        out,
        ",\"settings\":{{\"ttft_ms\":{},\"itl_ms\":{},\"prefill_us_per_token\":{},\"itl_batch_factor\":{},\"output_tokens\":{},\"fail_rate\":{},\"fail_status\":{},\"hang_rate\":{},\"truncate_rate\":{},\"truncate_after_tokens\":{},\"die_after\":{},\"accept_delay_ms\":{},\"flap_health_ms\":{},\"close_after_response\":{},\"reported_load\":{},\"dp_size\":{},\"prefill_batch_factor\":{},\"max_running\":{},\"kv_cache_tokens\":{},\"profile\":{}",
        t.ttft_us as f64 / 1000.0,
        t.itl_us as f64 / 1000.0,
        t.prefill_ns_per_token as f64 / 1000.0,
        t.itl_batch_factor,
        t.output_tokens,
        f.fail_rate,
        f.fail_status,
        f.hang_rate,
        f.truncate_rate,
        opt(f.truncate_after_tokens.map(u64::from)),
        opt(f.die_after),
        f.accept_delay_ms,
        w.health.flap_ms(),
        f.close_after_response,
        opt(f.reported_load),
        s.dp_rank_requests.len(),
        t.prefill_batch_factor,
        w.max_running,
        w.gate.capacity_tokens(),
        w.profile.map_or_else(|| "null".to_string(), |p| format!("\"{p}\"")),
    );
    if let Some(skip) = w.kv_events_pending_skip() {
        let _ = write!(out, ",\"kv_events_skip\":{skip}");
    }
    out.push_str("}}");
    out
}

/// What a control body asks for beyond setting knobs.
struct Control {
    die: bool,
}

/// Applies a /sim/control body. Unknown keys are an error so a typo does not silently do nothing;
/// nothing is applied unless the whole body is valid.
fn apply_control(w: &Worker, body: &[u8]) -> Result<Control, String> {
    let mut t = w.timing.get();
    let mut f = w.faults.get();
    // Some(None) clears a forced health state.
    let mut healthy: Option<Option<bool>> = None;
    let mut flap = None;
    let mut flush = false;
    let (mut provider_fail, mut retry_after) = (None, None);
    let mut kv_skip = None;
    let mut die = false;
    for entry in sonic_rs::to_object_iter(body) {
        let (key, v) = entry.map_err(|e| format!("invalid JSON body: {e}"))?;
        let num = || v.as_f64().ok_or_else(|| format!("{key} must be a number"));
        let opt_u64 = || {
            if v.is_null() {
                Ok(None)
            } else {
                v.as_u64().map(Some).ok_or_else(|| format!("{key} must be an integer or null"))
            }
        };
        match key.as_ref() {
            "healthy" if v.is_null() => healthy = Some(None),
            "healthy" => healthy = Some(Some(v.as_bool().ok_or("healthy must be a boolean or null")?)),
            "flap_health_ms" => flap = Some(num()?.max(0.0) as u64),
            "close_after_response" => {
                f.close_after_response = v.as_bool().ok_or("close_after_response must be a boolean")?;
            }
            "reported_load" => f.reported_load = opt_u64()?,
            "die" => die = v.as_bool().ok_or("die must be a boolean")?,
            "flush_cache" => flush = v.as_bool().unwrap_or(false),
            "ttft_ms" => t.ttft_us = ms_to_us(num()?),
            "itl_ms" => t.itl_us = ms_to_us(num()?),
            "prefill_us_per_token" => t.prefill_ns_per_token = (num()?.max(0.0) * 1000.0) as u64,
            "itl_batch_factor" => t.itl_batch_factor = num()?.max(0.0),
            "prefill_batch_factor" => t.prefill_batch_factor = num()?.max(0.0),
            "output_tokens" => t.output_tokens = (num()? as u32).max(1),
            "fail_rate" => f.fail_rate = num()?,
            "fail_status" => f.fail_status = num()? as u16,
            "hang_rate" => f.hang_rate = num()?,
            "truncate_rate" => f.truncate_rate = num()?,
            "truncate_after_tokens" => f.truncate_after_tokens = opt_u64()?.map(|n| n as u32),
            "die_after" => f.die_after = opt_u64()?,
            "accept_delay_ms" => f.accept_delay_ms = num()? as u64,
            "provider_fail" if w.providers.is_none() => {
                return Err("provider_fail: this worker is no provider (--provider-keys)".into())
            }
            "provider_fail" => provider_fail = Some(opt_u64()?.map(|s| s as u16)),
            "retry_after" => retry_after = opt_u64()?,
            "kv_events_skip" if w.kv_events_pending_skip().is_none() => {
                return Err(
                    "kv_events_skip: this worker publishes no KV events (--grpc, or --kv-events-endpoint)".into()
                )
            }
            "kv_events_skip" => {
                kv_skip = Some(v.as_u64().ok_or("kv_events_skip must be a non-negative integer")?);
            }
            other => return Err(format!("unknown control key {other:?}")),
        }
    }
    match healthy {
        Some(Some(h)) => w.health.force(h),
        Some(None) => w.health.unforce(),
        None => {}
    }
    if let Some(ms) = flap {
        w.health.set_flap(ms);
    }
    // Before the flush, so a body with both numbers the flush's batch past the gap.
    if let Some(n) = kv_skip {
        w.skip_kv_events(n);
    }
    if flush {
        w.flush_cache();
    }
    match provider_fail {
        Some(Some(status)) => w.provider_fail.set(Some(ProviderFail { status, retry_after })),
        Some(None) => w.provider_fail.set(None),
        None => {}
    }
    w.timing.set(t);
    w.faults.set(f);
    Ok(Control { die })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::config::SimArgs;
    use clap::Parser;
    use sonic_rs::JsonContainerTrait;
    use std::rc::Rc;

    fn worker(args: &[&str]) -> Rc<Worker> {
        let args = SimArgs::parse_from(["smg-sim", "--ports", "1"].iter().chain(args));
        Worker::new(&args.worker_specs().unwrap()[0], 1)
    }

    /// Dispatches one request and returns the status and body of the reply.
    fn call(w: &Worker, route: Route, body: &str) -> (u16, sonic_rs::Value) {
        let mut out = Vec::new();
        let action = dispatch(w, route, true, body.as_bytes(), true, &mut out);
        assert!(matches!(action, Action::Reply { .. } | Action::Die), "{action:?}");
        let status = std::str::from_utf8(&out[9..12]).unwrap().parse().unwrap();
        let start = out.windows(4).position(|x| x == b"\r\n\r\n").unwrap() + 4;
        (status, sonic_rs::from_slice(&out[start..]).unwrap_or_default())
    }

    #[test]
    fn runtime_specific_routes() {
        assert_eq!(resolve("/generate", Runtime::Sglang), Route::Infer(Api::Generate));
        assert_eq!(resolve("/generate", Runtime::Vllm), Route::NotFound);
        assert_eq!(resolve("/v1/loads", Runtime::Vllm), Route::NotFound);
        assert_eq!(resolve("/load", Runtime::Vllm), Route::VllmLoad);
        assert_eq!(resolve("/server_info", Runtime::Sglang), Route::ServerInfo);
        assert_eq!(resolve("/health", Runtime::Vllm), Route::Health);
        assert_eq!(resolve("/version", Runtime::Vllm), Route::Version);
        assert_eq!(resolve("/version", Runtime::Sglang), Route::NotFound);
    }

    #[test]
    fn reported_load_overrides_request_counts() {
        let w = worker(&["--max-running", "4"]);
        let (_, st) = call(&w, Route::SimControl, r#"{"reported_load":10}"#);
        assert_eq!(st["settings"]["reported_load"].as_u64(), Some(10));
        let (_, l) = call(&w, Route::Loads, "");
        let (r0, agg) = (&l["loads"][0], &l["aggregate"]);
        assert_eq!(r0["num_running_reqs"].as_u64(), Some(4));
        assert_eq!(r0["num_waiting_reqs"].as_u64(), Some(6));
        assert_eq!(r0["num_total_reqs"].as_u64(), Some(10));
        assert_eq!(r0["utilization"].as_f64(), Some(1.0));
        assert_eq!(agg["total_reqs"].as_u64(), Some(10));
        assert_eq!(call(&w, Route::GetLoad, "").1[0]["num_reqs"].as_u64(), Some(10));
        call(&w, Route::SimControl, r#"{"reported_load":null}"#);
        assert_eq!(call(&w, Route::Loads, "").1["loads"][0]["num_total_reqs"].as_u64(), Some(0));
        assert_eq!(call(&w, Route::SimControl, r#"{"reported_load":-1}"#).0, 400);
        let v = worker(&["--runtime", "vllm"]);
        call(&v, Route::SimControl, r#"{"reported_load":7}"#);
        assert_eq!(call(&v, Route::VllmLoad, "").1["server_load"].as_u64(), Some(7));
        assert_eq!(call(&v, Route::Version, "").1["version"].as_str(), Some(VLLM_VERSION));
    }

    #[test]
    fn dp_ranks_are_counted_and_checked() {
        let w = worker(&["--dp-size", "2", "--max-running", "3"]);
        let info = call(&w, Route::ServerInfo, "").1;
        assert_eq!((info["dp_size"].as_u64(), info["max_running_requests"].as_u64()), (Some(2), Some(3)));
        let chat = Route::Infer(Api::Embeddings);
        for rank in ["0", "1", "1", "null"] {
            let (status, _) = call(&w, chat, &format!(r#"{{"input":"x","data_parallel_rank":{rank}}}"#));
            assert_eq!(status, 200);
        }
        for rank in ["2", "-1", "\"0\""] {
            let (status, _) = call(&w, chat, &format!(r#"{{"input":"x","data_parallel_rank":{rank}}}"#));
            assert_eq!(status, 400, "rank {rank}");
        }
        let st = call(&w, Route::SimStats, "").1;
        let ranks: Vec<u64> = st["dp_rank_requests"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(ranks, [1, 2]);
        assert_eq!(st["settings"]["dp_size"].as_u64(), Some(2));
    }

    #[test]
    fn pd_roles_read_bootstrap_fields() {
        let body = r#"{"prompt":"p","max_tokens":9,"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":[4,5]}"#;
        let job = |w: &Worker| {
            let mut out = Vec::new();
            match dispatch(w, Route::Infer(Api::Completions), true, body.as_bytes(), true, &mut out) {
                Action::Generate(job) => job,
                other => panic!("{other:?}"),
            }
        };
        let prefill = worker(&["--pd-role", "prefill"]);
        let j = job(&prefill);
        assert_eq!((j.output_tokens, j.hit_limit, j.handoff), (1, true, Handoff::Prefill(vec![4, 5])));
        let decode = worker(&["--pd-role", "decode"]);
        let j = job(&decode);
        assert_eq!(j.output_tokens, 9);
        assert!(matches!(&j.handoff, Handoff::Decode(legs) if legs.len() == 2 && legs[1].room == 5));
        assert_eq!(job(&worker(&[])).handoff, Handoff::None);
        for w in [&prefill, &decode] {
            assert_eq!(call(w, Route::Infer(Api::Generate), r#"{"text":"a"}"#).0, 400);
        }
        assert_eq!(call(&decode, Route::Infer(Api::Generate), r#"{"text":"a","bootstrap_room":1}"#).0, 400);
        let st = call(&decode, Route::SimStats, "").1;
        assert_eq!(st["pd_role"].as_str(), Some("decode"));
        assert_eq!(st["handoffs_failed"].as_u64(), Some(0));
        assert!(call(&worker(&[]), Route::SimStats, "").1["pd_role"].is_null());
    }

    #[test]
    fn generate_logprob_positions() {
        let none = Handoff::None;
        assert_eq!(logprob_positions(None, 10, &none).unwrap(), 9..10, "SGLang's default: the last prompt token");
        assert_eq!(logprob_positions(Some(-1), 10, &none).unwrap(), 9..10);
        assert_eq!(logprob_positions(Some(0), 10, &none).unwrap(), 0..10);
        assert_eq!(logprob_positions(Some(9), 10, &none).unwrap(), 9..10);
        assert!(logprob_positions(Some(10), 10, &none).unwrap_err().contains("logprob_start_len"));
        assert_eq!(logprob_positions(Some(3), 10, &Handoff::Prefill(vec![1])).unwrap(), 3..10);
        assert!(logprob_positions(Some(3), 10, &Handoff::Decode(Vec::new())).unwrap().is_empty());
        // Through dispatch: only /generate reads return_logprob.
        let w = worker(&[]);
        let job = |route: Route, body: &str| {
            let mut out = Vec::new();
            match dispatch(&w, route, true, body.as_bytes(), true, &mut out) {
                Action::Generate(job) => job,
                other => panic!("{other:?}"),
            }
        };
        let j = job(Route::Infer(Api::Generate), r#"{"text":"abcdefgh","return_logprob":true,"logprob_start_len":0}"#);
        assert_eq!(j.logprobs, Some(0..j.prompt_tokens));
        assert_eq!(job(Route::Infer(Api::Generate), r#"{"text":"abcdefgh"}"#).logprobs, None);
        assert_eq!(job(Route::Infer(Api::Completions), r#"{"prompt":"a","return_logprob":true}"#).logprobs, None);
        let (status, err) =
            call(&w, Route::Infer(Api::Generate), r#"{"text":"a","return_logprob":true,"logprob_start_len":99}"#);
        assert_eq!(status, 400);
        assert!(err["error"]["message"].as_str().unwrap().contains("logprob_start_len"), "{err:?}");
    }

    #[test]
    fn vllm_pd_roles_read_kv_transfer_params() {
        let job = |w: &Worker, body: &str| {
            let mut out = Vec::new();
            match dispatch(w, Route::Infer(Api::Chat), true, body.as_bytes(), true, &mut out) {
                Action::Generate(job) => job,
                other => panic!("{other:?}: {}", String::from_utf8_lossy(&out)),
            }
        };
        let prefill = worker(&["--pd-role", "prefill", "--runtime", "vllm"]);
        let body =
            r#"{"messages":[],"max_tokens":1,"bootstrap_room":3,"kv_transfer_params":{"do_remote_decode":true}}"#;
        let (a, b) = (job(&prefill, body), job(&prefill, body));
        assert_eq!((a.output_tokens, a.hit_limit), (1, true));
        match (a.handoff, b.handoff) {
            (Handoff::VllmPrefill(x), Handoff::VllmPrefill(y)) => assert_ne!(x, y, "a fresh room per request"),
            other => panic!("{other:?}"),
        }
        // Bootstrap fields are not vLLM's: they neither stand in for kv_transfer_params nor hurt.
        let (status, err) = call(&prefill, Route::Infer(Api::Chat), r#"{"messages":[],"bootstrap_room":3}"#);
        assert_eq!(status, 400);
        assert!(err["error"]["message"].as_str().unwrap().contains("do_remote_decode"), "{err:?}");
        let decode = worker(&["--pd-role", "decode", "--runtime", "vllm"]);
        let body = r#"{"messages":[],"max_tokens":4,"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"h","remote_port":5,"remote_request_id":"6"}}"#;
        let j = job(&decode, body);
        assert_eq!(j.output_tokens, 4);
        assert!(
            matches!(&j.handoff, Handoff::Decode(legs) if legs.len() == 1 && legs[0].room == 6 && legs[0].port == Some(5))
        );
        assert_eq!(call(&decode, Route::Infer(Api::Chat), r#"{"messages":[],"bootstrap_room":1}"#).0, 400);
        assert_eq!(call(&decode, Route::SimStats, "").1["pd_role"].as_str(), Some("decode"));
    }

    #[test]
    fn control_knobs_and_die() {
        let w = worker(&[]);
        let (_, st) = call(&w, Route::SimControl, r#"{"flap_health_ms":60000,"close_after_response":true}"#);
        assert_eq!(st["settings"]["flap_health_ms"].as_u64(), Some(60000));
        assert_eq!(st["settings"]["close_after_response"].as_bool(), Some(true));
        assert!(w.health.is_healthy(), "flapping starts healthy");
        call(&w, Route::SimControl, r#"{"healthy":false}"#);
        assert!(!w.health.is_healthy());
        call(&w, Route::SimControl, r#"{"healthy":null}"#);
        assert!(w.health.is_healthy());
        // A bad key leaves every knob as it was.
        assert_eq!(call(&w, Route::SimControl, r#"{"close_after_response":false,"die":1}"#).0, 400);
        assert!(w.faults.get().close_after_response);
        let mut out = Vec::new();
        let action = dispatch(&w, Route::SimControl, true, br#"{"die":true}"#, true, &mut out);
        assert_eq!(action, Action::Die);
        assert!(w.died.is_fired());
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("connection: close") && text.contains("\"dead\":true"), "{text}");
        assert_eq!(dispatch(&w, Route::Health, false, b"", true, &mut out), Action::Close);
    }

    #[test]
    fn kv_events_knob_and_stats() {
        let args = SimArgs::parse_from(["smg-sim", "--ports", "1", "--block-tokens", "2"]);
        let mut spec = args.worker_specs().unwrap().remove(0);
        spec.grpc = Some(crate::sim::config::GrpcSpec {
            tokenizer_dir: std::path::PathBuf::new(),
            advertised_path: String::new(),
            llama: None,
            markup: (None, None),
            embedding: false,
            kv_events: true,
        });
        let w = Worker::new(&spec, 1);
        let log = w.kv_events.as_ref().unwrap();
        let st = call(&w, Route::SimStats, "").1;
        assert_eq!(st["kv_events"]["published"].as_u64(), Some(0));
        assert_eq!(st["settings"]["kv_events_skip"].as_u64(), Some(0));
        // An HTTP prompt on a gRPC worker publishes its blocks too (ids read from its bytes).
        let sub = log.subscribe(0);
        let body = br#"{"prompt":"abcdefghijklmnop"}"#;
        let action = dispatch(&w, Route::Infer(Api::Completions), true, body, true, &mut Vec::new());
        assert!(matches!(action, Action::Generate(_)), "{action:?}");
        assert_eq!(sub.queued(), 1);
        let (_, st) = call(&w, Route::SimControl, r#"{"kv_events_skip":3}"#);
        assert_eq!(st["settings"]["kv_events_skip"].as_u64(), Some(3));
        assert_eq!(call(&w, Route::SimControl, r#"{"kv_events_skip":-1}"#).0, 400);
        let (_, st) = call(&w, Route::SimControl, r#"{"flush_cache":true}"#);
        let kv = &st["kv_events"];
        assert_eq!((kv["published"].as_u64(), kv["last_sequence"].as_u64()), (Some(2), Some(5)));
        assert_eq!((kv["subscribers"].as_u64(), st["settings"]["kv_events_skip"].as_u64()), (Some(1), Some(0)));
        call(&w, Route::FlushCache, "");
        assert_eq!((log.last_sequence(), sub.queued()), (6, 3));
        // HTTP workers without --kv-events-endpoint have neither the knob nor the stats.
        let http = worker(&[]);
        assert_eq!(call(&http, Route::SimControl, r#"{"kv_events_skip":1}"#).0, 400);
        assert!(call(&http, Route::SimStats, "").1.get("kv_events").is_none());
    }

    #[test]
    fn zmq_kv_events_knob_and_stats() {
        use crate::sim::zmq_events::Event;
        let args = SimArgs::parse_from([
            "smg-sim",
            "--ports",
            "1",
            "--block-tokens",
            "2",
            "--bytes-per-token",
            "2",
            "--kv-events-endpoint",
            "tcp://127.0.0.1:5557",
        ]);
        let mut spec = args.worker_specs().unwrap().remove(0);
        let (tx, rx) = flume::bounded(16);
        spec.kv_events_zmq.as_mut().unwrap().sink = Some(tx);
        let w = Worker::new(&spec, 1);
        drop(spec);
        let st = call(&w, Route::SimStats, "").1;
        let kv = &st["kv_events"];
        assert_eq!((kv["published"].as_u64(), kv["dropped"].as_u64()), (Some(0), Some(0)));
        assert!(kv["last_sequence"].is_null());
        assert_eq!(kv["endpoint"].as_str(), Some("tcp://127.0.0.1:5557"));
        assert_eq!(st["settings"]["kv_events_skip"].as_u64(), Some(0));
        // The prompt's cache bytes are its raw JSON, `"abcdefghi"`: two whole blocks of 4
        // bytes (the last 3 bytes are no block), ids read 2 bytes each, little-endian.
        let body = br#"{"prompt":"abcdefghi"}"#;
        let action = dispatch(&w, Route::Infer(Api::Completions), true, body, true, &mut Vec::new());
        assert!(matches!(action, Action::Generate(_)), "{action:?}");
        let b = rx.try_recv().unwrap();
        assert_eq!(b.seq, 0);
        let Event::Stored { token_ids, parent, block_size, block_hashes } = &b.events[0] else { panic!("{b:?}") };
        let id = |s: &[u8]| u32::from(s[0]) | u32::from(s[1]) << 8;
        assert_eq!(token_ids, &[id(b"\"a"), id(b"bc"), id(b"de"), id(b"fg")]);
        assert_eq!((*parent, *block_size, block_hashes.len()), (None, 2, 2));
        // The skip numbers the flush's batch past the gap.
        let (_, st) = call(&w, Route::SimControl, r#"{"kv_events_skip":3,"flush_cache":true}"#);
        assert_eq!(
            (st["kv_events"]["last_sequence"].as_u64(), st["settings"]["kv_events_skip"].as_u64()),
            (Some(4), Some(0))
        );
        let b = rx.try_recv().unwrap();
        assert_eq!((b.seq, b.events.as_slice()), (4, &[Event::Cleared][..]));
        call(&w, Route::FlushCache, "");
        assert_eq!(rx.try_recv().unwrap().seq, 5);
        assert_eq!(call(&w, Route::SimStats, "").1["kv_events"]["published"].as_u64(), Some(3));
        // A dead worker publishes nothing more: its sockets close.
        w.die();
        w.flush_cache();
        assert!(rx.try_recv().is_err());
        assert!(rx.is_disconnected());
    }
}
