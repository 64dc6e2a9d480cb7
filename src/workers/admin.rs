//! The worker admin API (SMG's `/workers` surface) and the fan-out and pass-through routes
//! that need the fleet: answered on the control thread, which alone owns the fleet.
//!
//! Shapes are SMG's: `POST /workers` → `202 {"status":"accepted","worker_id",…}` with
//! `Location`, ids are UUIDv7 strings, errors are `{"error":…,"code":…}` (not the OpenAI
//! envelope: SMG's worker API has its own), `409 WORKER_ALREADY_EXISTS`, `404
//! WORKER_NOT_FOUND`, `400 BAD_REQUEST`. Unknown fields are ignored, as SMG's serde does.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use smg_wire::json::put_str;
use smg_wire::num::put_dec;
use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};

use super::breaker::BreakerState;
use super::fleet::{Entry, Fleet, RegisterError, WorkerSpec};
use super::probe;
use super::snapshot::Runtime;
use super::WorkerUrl;
use crate::secret::Secret;
#[cfg(test)]
use crate::uuid::uuid_v7;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminMethod {
    Get,
    Post,
    Put,
    Patch,
    Delete,
    Other,
}

/// An admin request as a shard read it.
#[derive(Debug)]
pub struct AdminRequest {
    pub method: AdminMethod,
    /// The path without the query.
    pub path: String,
    pub query: String,
    pub body: Vec<u8>,
}

/// A failure the gateway answers with its own error envelope (mapped by the shard).
#[derive(Debug)]
pub enum ReplyError {
    /// No routable worker to pass the request to.
    NoWorkers,
    Unreachable {
        worker: String,
        error: std::io::Error,
    },
}

/// The answer, written by the shard.
#[derive(Debug)]
pub struct AdminReply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    pub location: Option<String>,
    /// The gateway's own error (the contract's envelope and `X-SMG-Error-Code`) instead.
    pub api_error: Option<ReplyError>,
}

pub enum Answer {
    Now(AdminReply),
    /// Needs the network (fan-out, pass-through): finished by a task of the control loop.
    Later(Pin<Box<dyn Future<Output = AdminReply> + Send>>),
}

fn json(status: u16, body: Vec<u8>) -> AdminReply {
    AdminReply { status, content_type: "application/json", body, location: None, api_error: None }
}

/// What a request whose handling panicked gets (the panic itself is logged where caught).
pub fn panicked() -> AdminReply {
    error(500, "INTERNAL_ERROR", "the control thread failed on this request; see the gateway's log")
}

/// SMG's worker-API error body.
fn error(status: u16, code: &str, msg: &str) -> AdminReply {
    let mut b = b"{\"error\":".to_vec();
    put_str(&mut b, msg);
    b.extend_from_slice(b",\"code\":");
    put_str(&mut b, code);
    b.push(b'}');
    json(status, b)
}

fn accepted(id: &str, msg: &str, extra: Option<(&str, &str)>) -> AdminReply {
    let mut b = b"{\"status\":\"accepted\",\"worker_id\":".to_vec();
    put_str(&mut b, id);
    let location = format!("/workers/{id}");
    if let Some((_, url)) = extra {
        b.extend_from_slice(b",\"url\":");
        put_str(&mut b, url);
        b.extend_from_slice(b",\"location\":");
        put_str(&mut b, &location);
    }
    b.extend_from_slice(b",\"message\":");
    put_str(&mut b, msg);
    b.push(b'}');
    let mut r = json(202, b);
    if extra.is_some() {
        r.location = Some(location);
    }
    r
}

/// Answers one admin request; the flag says whether routing must see a change.
pub fn handle(fleet: &mut Fleet, req: AdminRequest, now: Instant) -> (Answer, bool) {
    use AdminMethod::*;
    let path = req.path.strip_prefix("/v1").filter(|p| p.starts_with("/workers")).unwrap_or(&req.path);
    let now_answer = |r| (Answer::Now(r), false);
    // Fault hooks for the control thread's panic isolation test; not in release builds.
    #[cfg(debug_assertions)]
    match req.query.as_str() {
        "smg_debug_panic=now" => panic!("deliberate panic in an admin request (debug builds only)"),
        "smg_debug_panic=later" => {
            return (
                Answer::Later(Box::pin(async { panic!("deliberate panic in an admin task (debug builds only)") })),
                false,
            )
        }
        _ => {}
    }
    match (req.method, path) {
        (Post, "/workers") => register(fleet, &req.body, now),
        (Get, "/workers") => now_answer(list(fleet, &req.query)),
        (_, "/workers") => now_answer(error(405, "METHOD_NOT_ALLOWED", "Method not allowed")),
        (m, p) if p.starts_with("/workers/") => one(fleet, m, &p["/workers/".len()..], &req.body, now),
        (Post, "/flush_cache") => {
            (Answer::Later(Box::pin(flush_cache(targets(fleet), fleet.cfg.health_timeout))), false)
        }
        (Get, "/get_loads") => (Answer::Later(Box::pin(get_loads(targets(fleet), fleet.cfg.health_timeout))), false),
        (Get, "/get_server_info" | "/get_model_info" | "/health_generate") => {
            let path = path.to_string();
            let first = fleet
                .entries
                .iter()
                .find(|e| e.routable() && e.provider().is_none())
                .map(|e| (e.base.clone(), e.spec.api_key.clone()));
            (Answer::Later(Box::pin(pass_through(first, path))), false)
        }
        _ => now_answer(error(405, "METHOD_NOT_ALLOWED", "Method not allowed")),
    }
}

fn register(fleet: &mut Fleet, body: &[u8], now: Instant) -> (Answer, bool) {
    let spec = match parse_spec(body) {
        Ok(s) => s,
        Err(r) => return (Answer::Now(r), false),
    };
    let url = spec.url.clone();
    match fleet.register(spec, now) {
        Ok(id) => {
            let uuid = fleet.get(id).map(|e| e.uuid.clone()).unwrap_or_default();
            crate::info!("worker {url}: registered ({uuid})");
            let r = accepted(&uuid, "Worker addition queued for background processing", Some(("url", &url)));
            (Answer::Now(r), true)
        }
        Err(RegisterError::Duplicate(id)) => {
            let uuid = fleet.get(id).map(|e| e.uuid.clone()).unwrap_or_default();
            let msg = format!(
                "Worker already exists at URL '{url}' with ID {uuid}. Use PUT /workers/{uuid} to replace or PATCH /workers/{uuid} to update."
            );
            (Answer::Now(error(409, "WORKER_ALREADY_EXISTS", &msg)), false)
        }
        Err(RegisterError::Full) => {
            let msg = format!("{} workers are registered: the most this gateway holds", super::fleet::MAX_WORKERS);
            (Answer::Now(error(503, "SERVICE_UNAVAILABLE", &msg)), false)
        }
        Err(RegisterError::BadUrl(why) | RegisterError::OwnListener(why)) => {
            (Answer::Now(error(400, "BAD_REQUEST", &why)), false)
        }
    }
}

fn one(fleet: &mut Fleet, m: AdminMethod, raw: &str, body: &[u8], now: Instant) -> (Answer, bool) {
    let now_answer = |r| (Answer::Now(r), false);
    if !is_uuid(raw) {
        let msg = format!("Invalid worker_id '{raw}' (expected UUID)");
        return now_answer(error(400, "BAD_REQUEST", &msg));
    }
    let Some(id) = fleet.entries.iter().find(|e| e.uuid.eq_ignore_ascii_case(raw)).map(|e| e.id) else {
        return now_answer(error(404, "WORKER_NOT_FOUND", &format!("Worker {raw} not found")));
    };
    match m {
        AdminMethod::Get => {
            let mut b = Vec::new();
            info(&mut b, fleet.get(id).expect("found"));
            now_answer(json(200, b))
        }
        AdminMethod::Delete => {
            fleet.drain(id, now);
            (Answer::Now(accepted(raw, "Worker removal queued for background processing", None)), true)
        }
        AdminMethod::Patch => {
            let v: Value = match crate::bounded_json::value(body) {
                Ok(v) => v,
                Err(e) => return now_answer(error(400, "BAD_REQUEST", &format!("Invalid JSON: {e}"))),
            };
            let mut patch = WorkerSpec::default();
            if let Err(why) = apply_fields(&mut patch, &v) {
                return now_answer(error(422, "BAD_REQUEST", &why));
            }
            fleet.respec(id, |s| {
                if v.get("priority").is_some() {
                    s.priority = patch.priority;
                }
                if v.get("cost").is_some() {
                    s.cost = patch.cost;
                }
                if v.get("labels").is_some() {
                    s.labels = patch.labels;
                }
                if v.get("api_key").is_some() {
                    s.api_key = patch.api_key;
                }
                if let Some(h) = v.get("health") {
                    if h.get("check_interval_secs").is_some() {
                        s.health_interval = patch.health_interval;
                    }
                    if h.get("disable_health_check").is_some() {
                        s.health_disabled = patch.health_disabled;
                    }
                }
            });
            (Answer::Now(accepted(raw, "Worker update queued for background processing", None)), true)
        }
        AdminMethod::Put => {
            let spec = match parse_spec(body) {
                Ok(s) => s,
                Err(r) => return now_answer(r),
            };
            let same = fleet.get(id).is_some_and(|e| WorkerUrl::parse(&spec.url).is_ok_and(|u| u.url == e.base.url));
            if !same {
                return now_answer(error(400, "BAD_REQUEST", "PUT must keep the worker's url"));
            }
            if fleet.cfg.dp_aware {
                return now_answer(error(400, "BAD_REQUEST", "PUT is not supported with --dp-aware"));
            }
            fleet.respec(id, |s| *s = spec);
            (Answer::Now(accepted(raw, "Worker update queued for background processing", None)), true)
        }
        _ => now_answer(error(405, "METHOD_NOT_ALLOWED", "Method not allowed")),
    }
}

/// `GET /workers[?model=X]`.
fn list(fleet: &Fleet, query: &str) -> AdminReply {
    let model = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "model")
        .map(|(_, v)| percent_decode(v));
    let shown: Vec<&Entry> = fleet
        .entries
        .iter()
        .filter(|e| model.as_deref().is_none_or(|m| e.model.as_deref().is_none_or(|w| w == m)))
        .collect();
    let count = |t: &str| shown.iter().filter(|e| worker_type(e) == t).count();
    let mut b = b"{\"workers\":[".to_vec();
    for (i, e) in shown.iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        info(&mut b, e);
    }
    b.extend_from_slice(
        format!(
            "],\"total\":{},\"stats\":{{\"prefill_count\":{},\"decode_count\":{},\"regular_count\":{}}}}}",
            shown.len(),
            count("prefill"),
            count("decode"),
            count("regular")
        )
        .as_bytes(),
    );
    json(200, b)
}

fn worker_type(e: &Entry) -> &str {
    if e.spec.worker_type.is_empty() {
        "regular"
    } else {
        &e.spec.worker_type
    }
}

/// SMG's WorkerInfo, plus what this gateway knows beyond it (breaker, processed count,
/// engine load, overload).
fn info(b: &mut Vec<u8>, e: &Entry) {
    let field = |b: &mut Vec<u8>, name: &str, first: bool| {
        if !first {
            b.push(b',');
        }
        put_str(b, name);
        b.push(b':');
    };
    b.push(b'{');
    field(b, "id", true);
    put_str(b, &e.uuid);
    field(b, "url", false);
    put_str(b, &e.url.url);
    if let Some(m) = &e.model {
        field(b, "model_id", false);
        put_str(b, m);
        field(b, "models", false);
        b.extend_from_slice(b"[{\"id\":");
        put_str(b, m);
        b.extend_from_slice(b"}]");
    }
    field(b, "worker_type", false);
    put_str(b, worker_type(e));
    if let Some(p) = e.spec.bootstrap_port.filter(|_| worker_type(e) == "prefill") {
        field(b, "bootstrap_port", false);
        put_dec(b, u64::from(p));
    }
    if let Some(k) = &e.spec.kv_connector {
        field(b, "kv_connector", false);
        put_str(b, k);
    }
    if let Some(k) = &e.spec.kv_events {
        field(b, "kv_events", false);
        b.extend_from_slice(b"{\"endpoint\":");
        put_str(b, &k.endpoint);
        if let Some(r) = &k.replay {
            b.extend_from_slice(b",\"replay_endpoint\":");
            put_str(b, r);
        }
        b.extend_from_slice(b",\"topic\":");
        put_str(b, &k.topic);
        b.push(b'}');
    }
    field(b, "connection_mode", false);
    put_str(b, if e.base.grpc { "grpc" } else { "http" });
    field(b, "runtime_type", false);
    put_str(b, e.runtime.as_str());
    if let Some(p) = e.provider() {
        field(b, "provider", false);
        put_str(b, p.name());
    }
    if !e.spec.labels.is_empty() {
        field(b, "labels", false);
        b.push(b'{');
        for (i, (k, v)) in e.spec.labels.iter().enumerate() {
            if i > 0 {
                b.push(b',');
            }
            put_str(b, k);
            b.push(b':');
            put_str(b, v);
        }
        b.push(b'}');
    }
    let status = e.health.status();
    let rest = format!(
        ",\"priority\":{},\"cost\":{},\"is_healthy\":{},\"status\":\"{}\",\"load\":{},\"processed\":{},\
         \"circuit_breaker\":{{\"state\":\"{}\",\"consecutive_failures\":{},\"total_failures\":{},\"total_successes\":{}}},\
         \"overloaded\":{},\"engine_load\":{}",
        e.spec.priority,
        e.spec.cost,
        status == super::status::Status::Ready,
        status.as_str(),
        e.inflight_total(),
        e.processed,
        e.breaker.state().as_str(),
        e.breaker.consecutive_failures(),
        e.breaker.total_failures,
        e.breaker.total_successes,
        e.overloaded,
        e.engine_load.map_or("null".to_string(), |l| l.to_string()),
    );
    b.extend_from_slice(rest.as_bytes());
    if let (Some(rank), Some(size)) = (e.dp_rank, e.dp_size) {
        field(b, "dp_base_url", false);
        put_str(b, &e.base.url);
        b.extend_from_slice(format!(",\"dp_rank\":{rank},\"dp_size\":{size}").as_bytes());
    }
    if let Some(n) = e.max_running {
        b.extend_from_slice(format!(",\"max_running_requests\":{n}").as_bytes());
    }
    b.extend_from_slice(b",\"job_status\":null}");
    debug_assert!(BreakerState::Closed.as_str() == "closed");
}

/// SMG's WorkerSpec: `url` required; `models[0].id` (or `model_id`) pins the model.
fn parse_spec(body: &[u8]) -> Result<WorkerSpec, AdminReply> {
    let v: Value =
        crate::bounded_json::value(body).map_err(|e| error(400, "BAD_REQUEST", &format!("Invalid JSON body: {e}")))?;
    if !v.is_object() {
        return Err(error(422, "BAD_REQUEST", "expected a JSON object"));
    }
    let Some(url) = v.get("url").and_then(|u| u.as_str()) else {
        return Err(error(422, "BAD_REQUEST", "missing field `url`"));
    };
    let mut spec = WorkerSpec::from_url(url);
    apply_fields(&mut spec, &v).map_err(|why| error(422, "BAD_REQUEST", &why))?;
    // The URL's scheme says how the worker is spoken to; a contradicting mode is refused.
    if let Some(t) = v.get("connection_mode").and_then(|t| t.as_str()) {
        let grpc = url.starts_with("grpc://");
        let ok = (t.eq_ignore_ascii_case("http") && !grpc) || (t.eq_ignore_ascii_case("grpc") && grpc);
        if !ok {
            return Err(error(400, "BAD_REQUEST", &format!("connection_mode '{t}' does not match the URL '{url}'")));
        }
    }
    Ok(spec)
}

/// Refuses a value that would end or split a header line where the gateway writes it (the
/// worker's `authorization`, the model and labels in headers and logs): CR, LF and NUL.
fn header_safe(field: &str, s: &str) -> Result<(), String> {
    if s.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
        return Err(format!("`{field}` must not contain CR, LF or NUL"));
    }
    Ok(())
}

/// The optional fields of a spec or a PATCH.
fn apply_fields(spec: &mut WorkerSpec, v: &Value) -> Result<(), String> {
    let string = |name: &str| -> Result<Option<String>, String> {
        match v.get(name) {
            None => Ok(None),
            Some(x) if x.is_null() => Ok(None),
            Some(x) => {
                let s = x.as_str().ok_or_else(|| format!("`{name}` must be a string"))?;
                header_safe(name, s)?;
                Ok(Some(s.to_string()))
            }
        }
    };
    if let Some(models) = v.get("models") {
        let arr = models.as_array().ok_or("`models` must be an array")?;
        spec.model_id = arr.first().and_then(|m| m.get("id")).and_then(|id| id.as_str()).map(Into::into);
        header_safe("models[0].id", spec.model_id.as_deref().unwrap_or(""))?;
    }
    if let Some(m) = string("model_id")? {
        spec.model_id = Some(m);
    }
    if let Some(k) = string("api_key")? {
        spec.api_key = Some(Secret::new(k));
    }
    if let Some(t) = string("worker_type")? {
        let t = t.to_ascii_lowercase();
        if !matches!(t.as_str(), "regular" | "prefill" | "decode" | "encode") {
            return Err(format!("unknown worker_type '{t}'"));
        }
        spec.worker_type = t;
    }
    if let Some(p) = v.get("bootstrap_port") {
        spec.bootstrap_port = match p.is_null() {
            true => None,
            false => {
                Some(p.as_u64().and_then(|p| u16::try_from(p).ok()).ok_or("`bootstrap_port` must be a port number")?)
            }
        };
    }
    if let Some(k) = string("kv_connector")? {
        spec.kv_connector = Some(k);
    }
    if let Some(k) = v.get("kv_events") {
        spec.kv_events = match k.is_null() {
            true => None,
            false => Some(crate::workers::kv_events_source::KvEventsSource::from_json(k)?),
        };
    }
    if let Some(p) = string("provider")? {
        let known = super::provider::Provider::parse(&p);
        spec.provider =
            Some(known.ok_or_else(|| format!("unknown provider '{p}' (openai, anthropic, gemini or xai)"))?);
    }
    if let Some(r) = string("runtime_type")?.or(string("runtime")?) {
        if r.eq_ignore_ascii_case("external") {
            // A cloud provider: named by `provider`, else by the URL's host; a host no
            // provider owns speaks OpenAI's API (SMG's default for external workers).
            let host = spec.url.split_once("://").map_or("", |(_, r)| r).split(':').next().unwrap_or("");
            let by_host = super::provider::Provider::of_host(host);
            spec.provider = spec.provider.or(by_host).or(Some(super::provider::Provider::OpenAi));
            spec.runtime = Some(Runtime::External);
        } else if !r.eq_ignore_ascii_case("unspecified") {
            spec.runtime = Some(Runtime::parse(&r).ok_or_else(|| format!("unknown runtime_type '{r}'"))?);
        }
    }
    if let Some(l) = v.get("labels") {
        let obj = l.as_object().ok_or("`labels` must be an object")?;
        spec.labels.clear();
        for (k, val) in obj.iter() {
            let val = val.as_str().ok_or("label values must be strings")?;
            header_safe("labels", k)?;
            header_safe("labels", val)?;
            spec.labels.push((k.to_string(), val.to_string()));
        }
    }
    if let Some(p) = v.get("priority") {
        spec.priority = p.as_u64().and_then(|p| u32::try_from(p).ok()).ok_or("`priority` must be a u32")?;
    }
    if let Some(c) = v.get("cost") {
        spec.cost = c.as_f64().ok_or("`cost` must be a number")?;
    }
    if let Some(h) = v.get("health") {
        if let Some(i) = h.get("check_interval_secs") {
            let secs = i.as_u64().ok_or("`health.check_interval_secs` must be a positive integer")?;
            spec.health_interval = Some(crate::duration::secs("`health.check_interval_secs`", secs, 1)?);
        }
        if let Some(d) = h.get("disable_health_check") {
            spec.health_disabled = Some(d.as_bool().ok_or("`health.disable_health_check` must be a boolean")?);
        }
    }
    Ok(())
}

/// Every registered self-hosted worker once (ranks share their base URL), with its key. A
/// cloud provider has no engine to flush or load to report, and its key is for its API only.
fn targets(fleet: &Fleet) -> Vec<(WorkerUrl, Option<Secret>)> {
    let mut out: Vec<(WorkerUrl, Option<Secret>)> = Vec::new();
    for e in fleet.entries.iter().filter(|e| e.draining_since.is_none() && e.provider().is_none()) {
        if !out.iter().any(|(u, _)| u.url == e.base.url) {
            out.push((e.base.clone(), e.spec.api_key.clone()));
        }
    }
    out
}

/// `POST /flush_cache` to every worker (FlushCache for gRPC ones), one result each (SMG's
/// FlushCacheResult).
async fn flush_cache(targets: Vec<(WorkerUrl, Option<Secret>)>, timeout: Duration) -> AdminReply {
    let tasks: Vec<_> = targets
        .into_iter()
        .map(|(u, key)| {
            tokio::spawn(async move {
                let _place = super::sockets::place().await;
                // gRPC workers flush through the scheduler API's FlushCache.
                let outcome = if u.grpc {
                    super::grpc_probe::flush_cache(&u, timeout).await
                } else {
                    match probe::request(
                        &u,
                        "POST",
                        "/flush_cache",
                        Some(b""),
                        key.as_ref().map(Secret::expose),
                        timeout,
                    )
                    .await
                    {
                        Ok(r) if (200..300).contains(&r.status) => Ok(()),
                        Ok(r) => Err(format!("HTTP {}", r.status)),
                        Err(e) => Err(e.to_string()),
                    }
                };
                (u.url, u.grpc, outcome)
            })
        })
        .collect();
    // Counted from the answers, so every count is of the workers listed.
    let (mut ok, mut failed, mut grpc) = (Vec::new(), Vec::new(), 0);
    for t in tasks {
        if let Ok((url, is_grpc, outcome)) = t.await {
            grpc += usize::from(is_grpc);
            match outcome {
                Ok(()) => ok.push(url),
                Err(e) => failed.push((url, e)),
            }
        }
    }
    let total = ok.len() + failed.len();
    let message = if total == 0 {
        "No workers available for cache flush".to_string()
    } else if failed.is_empty() {
        format!("Successfully flushed cache on all {total} workers")
    } else {
        format!("Cache flush: {} succeeded, {} failed", ok.len(), failed.len())
    };
    let mut b = b"{\"successful\":[".to_vec();
    for (i, u) in ok.iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        put_str(&mut b, u);
    }
    b.extend_from_slice(b"],\"failed\":[");
    for (i, (u, e)) in failed.iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        b.push(b'[');
        put_str(&mut b, u);
        b.push(b',');
        put_str(&mut b, e);
        b.push(b']');
    }
    b.extend_from_slice(
        format!(
            "],\"total_workers\":{total},\"http_workers\":{},\"grpc_workers\":{grpc},\"zmq_workers\":0,\"message\":",
            total - grpc
        )
        .as_bytes(),
    );
    put_str(&mut b, &message);
    b.push(b'}');
    json(200, b)
}

/// `GET /get_loads`: every worker's `/v1/loads`, with `load` = KV tokens in use (-1 when the
/// worker does not say), as SMG reports it.
async fn get_loads(targets: Vec<(WorkerUrl, Option<Secret>)>, timeout: Duration) -> AdminReply {
    let tasks: Vec<_> = targets
        .into_iter()
        .map(|(u, key)| {
            tokio::spawn(async move {
                let _place = super::sockets::place().await;
                // gRPC workers answer GetLoads; their details take the HTTP /v1/loads shape.
                if u.grpc {
                    let r = super::grpc_probe::load_details(&u, timeout).await;
                    let details = r.as_ref().and_then(|(_, j)| sonic_rs::from_str::<Value>(j).ok());
                    return (u.url, details);
                }
                let r = probe::request(&u, "GET", "/v1/loads", None, key.as_ref().map(Secret::expose), timeout).await;
                let details = r
                    .ok()
                    .filter(|r| (200..300).contains(&r.status))
                    .and_then(|r| crate::bounded_json::value(&r.body).ok());
                (u.url, details)
            })
        })
        .collect();
    let mut b = b"{\"loads\":[".to_vec();
    let (mut n, mut good) = (0usize, 0usize);
    for t in tasks {
        let Ok((url, details)) = t.await else { continue };
        let used: Option<u64> = details.as_ref().and_then(|d| {
            let ranks = d.get("loads")?.as_array()?.iter().map(|r| r.get("num_used_tokens").and_then(|x| x.as_u64()));
            ranks.sum::<Option<u64>>()
        });
        if n > 0 {
            b.push(b',');
        }
        n += 1;
        good += usize::from(used.is_some());
        b.extend_from_slice(b"{\"worker\":");
        put_str(&mut b, &url);
        b.extend_from_slice(format!(",\"load\":{}", used.map_or(-1, |u| u as i64)).as_bytes());
        if let Some(d) = details {
            b.extend_from_slice(b",\"details\":");
            b.extend_from_slice(sonic_rs::to_string(&d).unwrap_or_else(|_| "null".into()).as_bytes());
        }
        b.push(b'}');
    }
    b.extend_from_slice(format!("],\"total_workers\":{n},\"successful\":{good},\"failed\":{}}}", n - good).as_bytes());
    json(200, b)
}

/// `/get_server_info`, `/get_model_info`, `/health_generate`: the first routable worker's
/// answer, passed through. SMG's gRPC router implements none of the three (501, plain text):
/// so when that worker is a gRPC one.
async fn pass_through(first: Option<(WorkerUrl, Option<Secret>)>, path: String) -> AdminReply {
    let Some((url, key)) = first else {
        return gateway_error(ReplyError::NoWorkers);
    };
    if url.grpc {
        let what = match path.as_str() {
            "/get_server_info" => "Server info not implemented",
            "/get_model_info" => "Get model info not implemented",
            _ => "Health generate not implemented",
        };
        return AdminReply {
            status: 501,
            content_type: "text/plain; charset=utf-8",
            body: what.as_bytes().to_vec(),
            location: None,
            api_error: None,
        };
    }
    let _place = super::sockets::place().await;
    match probe::request(&url, "GET", &path, None, key.as_ref().map(Secret::expose), Duration::from_secs(30)).await {
        Ok(r) => json(r.status, r.body),
        Err(error) => gateway_error(ReplyError::Unreachable { worker: url.url, error }),
    }
}

fn gateway_error(e: ReplyError) -> AdminReply {
    AdminReply { status: 503, content_type: "application/json", body: Vec::new(), location: None, api_error: Some(e) }
}

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex =
            b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (c, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_v7_and_recognised() {
        let a = uuid_v7();
        assert!(is_uuid(&a), "{a}");
        assert_eq!(&a[14..15], "7");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"));
        assert_ne!(a, uuid_v7());
        assert!(!is_uuid("http://127.0.0.1:1"));
        assert_eq!(percent_decode("meta%2Fllama+3"), "meta/llama 3");
        assert_eq!(percent_decode("50%"), "50%");
    }

    #[test]
    fn specs_parse_as_smg_does() {
        let s = parse_spec(br#"{"url":"http://127.0.0.1:1","models":[{"id":"m"}],"labels":{"realtime":"true"},"priority":7,"runtime":"vLLM","extra":1}"#).unwrap();
        assert_eq!(s.model_id.as_deref(), Some("m"));
        assert_eq!(s.labels, [("realtime".to_string(), "true".to_string())]);
        assert_eq!((s.priority, s.cost, s.runtime), (7, 1.0, Some(Runtime::Vllm)));
        assert_eq!(parse_spec(b"{").unwrap_err().status, 400);
        assert_eq!(parse_spec(br#"{"models":[]}"#).unwrap_err().status, 422);
        assert_eq!(parse_spec(br#"{"url":"http://x:1","priority":-1}"#).unwrap_err().status, 422);
        assert!(parse_spec(br#"{"url":"grpc://x:1","connection_mode":"grpc"}"#).is_ok());
        assert_eq!(parse_spec(br#"{"url":"grpc://x:1","connection_mode":"http"}"#).unwrap_err().status, 400);
    }
}
