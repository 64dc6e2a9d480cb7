//! Phase: upstream attempt, then relay. One attempt is a connection (pooled, or fresh when
//! the retry edge asks for one), the request written with one `writev`, and the worker's
//! response head. The relay then streams the response and hands the connection back to
//! the pool when it is clean.

use std::ops::Range;

use smg_wire::num::put_dec;

use super::client::Client;
use super::ctx::{Picked, RequestCtx};
use super::decisions;
use super::error::{Failure, InternalError, WorkerCause, WorkerError};
use super::finish::{announce_close, Outcome};
use crate::admission::auth::AuthConfig;
use crate::api::{realtime, transcriptions, EndpointSpec};
use crate::http::body::Body;
use crate::http::head::RequestHead;
use crate::http::held_body::{hold_chunked, Unheld};
use crate::http::hop;
use crate::http::pool::{self, UpstreamConn};
use crate::http::relay::{relay, RelayEnd, RelayLimits, RelayStats};
use crate::http::respond::{header_line, Stamp};
use crate::http::response_head::{read_response_head, HeadError, ResponseBody, ResponseHead};
use crate::io::{is_resource_exhaustion, Writev2};
use crate::shard::Shard;
use crate::spare::Spare;
use crate::trace::SpanIds;
use crate::workers::breaker::Verdict;
use crate::workers::snapshot::WorkerMeta;
use crate::workers::Worker;

/// A worker's answer: the connection, with the response head at the start of its buffer.
pub struct Answered {
    pub conn: UpstreamConn,
    pub head: ResponseHead,
}

/// How an attempt ended short of a response head.
pub enum AttemptError {
    Failed(Failure),
    ClientGone,
}

impl From<WorkerError> for AttemptError {
    fn from(e: WorkerError) -> Self {
        AttemptError::Failed(Failure::Worker(e))
    }
}

/// The request head a worker gets: the client's target, our Host and framing, and the
/// client headers the contract forwards; with tracing, our span replaces the caller's
/// `traceparent`; a worker registered with its own key gets that key instead of the
/// client's; a cloud provider gets one key, in its own style ([`provider_key`]). For a
/// data-parallel rank the body gets `"data_parallel_rank": k` spliced in after its opening
/// brace: the head ends with the brace and the field, and the returned count of body bytes (up
/// to and including the brace) is skipped when the body is written.
/// The Content-Type is `application/json`, or the client's own when `content_type` points
/// at it (a multipart form keeps its boundary). `body` is what is at hand of a body of
/// `body_len` bytes (all of it, except for a streamed body, which gets no splice).
#[allow(clippy::too_many_arguments)]
pub fn upstream_head(
    out: &mut Vec<u8>,
    head: &RequestHead,
    buf: &[u8],
    authority: &str,
    body: &[u8],
    body_len: usize,
    span: Option<&SpanIds>,
    meta: &WorkerMeta,
    content_type: Option<&Range<usize>>,
    auth: &AuthConfig,
) -> usize {
    let mut splice = [0u8; 48];
    let (skip, insert) = match meta.dp_rank.and_then(|r| rank_splice(body, r, &mut splice)) {
        Some((skip, n)) => (skip, &splice[..n]),
        None => (0, &splice[..0]),
    };
    out.extend_from_slice(b"POST ");
    out.extend_from_slice(&buf[head.target.clone()]);
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(authority.as_bytes());
    out.extend_from_slice(b"\r\ncontent-type: ");
    out.extend_from_slice(content_type.map_or(&b"application/json"[..], |r| &buf[r.clone()]));
    out.extend_from_slice(b"\r\ncontent-length: ");
    put_dec(out, (body_len - skip + insert.len()) as u64);
    out.extend_from_slice(b"\r\n");
    for h in &head.forward {
        let name = &buf[h.name.clone()];
        if span.is_some() && name.eq_ignore_ascii_case(b"traceparent") {
            continue;
        }
        if (meta.api_key.is_some() || meta.provider.is_some()) && name.eq_ignore_ascii_case(b"authorization") {
            continue;
        }
        header_line(out, name, &buf[h.value.clone()]);
    }
    match meta.provider {
        None => {
            if let Some(k) = &meta.api_key {
                out.extend_from_slice(b"authorization: Bearer ");
                out.extend_from_slice(k.expose().as_bytes());
                out.extend_from_slice(b"\r\n");
            }
        }
        Some(p) => {
            if let Some(k) = provider_key(head, buf, meta, auth) {
                crate::workers::provider::write_key(p, out, k, head.header(buf, "anthropic-version").is_some());
            }
        }
    }
    if let Some(s) = span {
        out.extend_from_slice(b"traceparent: ");
        s.write_traceparent(out);
        out.extend_from_slice(b"\r\n");
    }
    hop::write(out, head.hop.clone().map(|r| &buf[r]));
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(insert);
    skip
}

/// The one key a cloud provider gets. The caller's own wins: the provider's native header
/// where the contract has it read (`x-api-key` on `/v1/messages`; `x-api-key`, then
/// `x-goog-api-key`, on `/v1/responses` and `/v1/interactions`), else their `Authorization:
/// Bearer` when the gateway checks no keys (when it does, that header carries a gateway key).
/// A gateway key never goes, whatever header it came in. Otherwise the key stored with the
/// worker, which goes to no other worker. None: no key is sent (the provider answers 401).
fn provider_key<'a>(head: &RequestHead, buf: &'a [u8], meta: &'a WorkerMeta, auth: &AuthConfig) -> Option<&'a [u8]> {
    let own = |name: &str| head.header(buf, name).map(|v| v.trim_ascii()).filter(|v| !v.is_empty());
    let native: &[&str] = match &buf[head.path.clone()] {
        b"/v1/responses" | b"/v1/interactions" => &["x-api-key", "x-goog-api-key"],
        b"/v1/messages" => &["x-api-key"],
        _ => &[],
    };
    let bearer = || own("authorization").map(crate::workers::provider::bearer).filter(|k| !k.is_empty());
    let caller = native
        .iter()
        .find_map(|n| own(n))
        .or_else(|| if auth.serving_enabled() { None } else { bearer() })
        .filter(|k| !auth.is_gateway_key(k));
    caller.or_else(|| meta.api_key.as_ref().map(|k| k.expose().as_bytes()))
}

/// Where the client's Content-Type value is in the connection buffer, for the endpoints that
/// forward it (transcriptions: a form and its boundary; realtime calls: SDP or a form);
/// None for the JSON ones.
pub fn client_content_type(spec: &EndpointSpec, head: &RequestHead, buf: &[u8]) -> Option<Range<usize>> {
    if spec.path != transcriptions::PATH && spec.path != realtime::CALLS {
        return None;
    }
    let h = head.headers.iter().find(|h| buf[h.name.clone()].eq_ignore_ascii_case(b"content-type"))?;
    Some(h.value.clone())
}

/// `{"data_parallel_rank":k,` (or without the comma for an empty object) and how many body
/// bytes it replaces; None for a body that is not a JSON object.
fn rank_splice(body: &[u8], rank: u32, out: &mut [u8; 48]) -> Option<(usize, usize)> {
    let open = body.iter().position(|b| !b.is_ascii_whitespace())?;
    if body[open] != b'{' {
        return None;
    }
    let empty = body[open + 1..].iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
    let mut v = Vec::with_capacity(48);
    v.extend_from_slice(b"{\"data_parallel_rank\":");
    put_dec(&mut v, u64::from(rank));
    if !empty {
        v.push(b',');
    }
    out[..v.len()].copy_from_slice(&v);
    Some((open + 1, v.len()))
}

/// How to make one attempt.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Body bytes replaced by the head's splice (see [`upstream_head`]).
    pub skip: usize,
    /// Skip the pool: a pooled connection just proved stale.
    pub fresh: bool,
}

/// One attempt: writes `up_head` and the body, reads the response head. `fresh` skips the
/// pool. `watch` says whether the client is still worth watching (it has not pipelined).
// The phases' shared state, passed as the other phases take it.
#[allow(clippy::too_many_arguments)]
async fn attempt(
    shard: &Shard,
    client: &mut Client,
    ctx: &mut RequestCtx,
    picked: &Picked,
    up_head: &mut Vec<u8>,
    body: &mut Body,
    plan: Plan,
    watch: &mut bool,
) -> Result<Answered, AttemptError> {
    let Plan { skip, fresh } = plan;
    let mut conn = open(shard, picked, fresh).await?;
    let reused = conn.reused;
    // The body travels through the writev in the buffer that holds it (the connection
    // buffer for a Content-Length body) and comes back for a retry or the next request.
    let (res, h) = match body {
        Body::None => {
            debug_assert_eq!(skip, 0, "no body, nothing spliced");
            let (res, h, _) = Writev2::write(&mut conn.stream, std::mem::take(up_head), Vec::new(), 0, 0).await;
            (res, h)
        }
        Body::InBuf(r) => {
            let (res, h, b) = Writev2::write(
                &mut conn.stream,
                std::mem::take(up_head),
                std::mem::take(&mut client.buf),
                r.start + skip,
                r.end,
            )
            .await;
            client.buf = b;
            (res, h)
        }
        Body::Owned(v) => {
            let n = v.len();
            let (res, h, b) =
                Writev2::write(&mut conn.stream, std::mem::take(up_head), std::mem::take(v), skip, n).await;
            *v = b;
            (res, h)
        }
    };
    *up_head = h;
    if let Err(e) = res {
        return Err(WorkerError::new(WorkerCause::Write(e), reused).into());
    }
    await_head(shard, client, ctx, conn, watch).await
}

/// The request as HTTP workers take it: the client's head rewritten for the picked worker
/// (made again per attempt, in a buffer kept across attempts), and for Decisions on an
/// SGLang worker, the System One body (made when one is first picked).
pub struct HttpRequest {
    pub up_head: Vec<u8>,
    content_type: Option<Range<usize>>,
    decisions: bool,
    systemone: Option<decisions::Translated>,
    /// For a cloud provider, the body without engine-only fields when it had any
    /// (`contract/engine_fields.rs`); made when a provider is first picked.
    for_provider: Option<Option<Body>>,
}

thread_local! {
    /// The upstream head buffer of the shard's last request, for its next (crate::spare).
    /// The client's response head is written into the same buffer after it.
    static HEAD_BUF: Spare<u8> = const { Spare::new(16 * 1024) };
}

/// A buffer for an upstream request head.
pub fn head_buffer() -> Vec<u8> {
    HEAD_BUF.with(|s| s.take(512))
}

/// Keeps a buffer [`head_buffer`] gave for the next request's.
pub fn give_head_buffer(buf: Vec<u8>) {
    HEAD_BUF.with(|s| s.give(buf));
}

impl Drop for HttpRequest {
    fn drop(&mut self) {
        give_head_buffer(std::mem::take(&mut self.up_head));
    }
}

impl HttpRequest {
    pub fn new(spec: &EndpointSpec, head: &RequestHead, buf: &[u8]) -> Self {
        HttpRequest {
            up_head: head_buffer(),
            content_type: client_content_type(spec, head, buf),
            decisions: spec.schema == Some(crate::contract::Endpoint::Decisions),
            systemone: None,
            for_provider: None,
        }
    }

    /// The picked worker is sent the System One body instead of the client's.
    pub fn translates(&self, picked: &Picked) -> bool {
        self.decisions && picked.worker().meta.runtime == crate::workers::snapshot::Runtime::Sglang
    }

    /// How to map the System One reply (once translated).
    pub fn plan(&self) -> Option<&crate::api::decisions::Plan> {
        self.systemone.as_ref().map(|t| &t.plan)
    }

    /// Phase: attempt, on an HTTP worker (picked): the head for it, then [`attempt`].
    #[allow(clippy::too_many_arguments)]
    pub async fn attempt(
        &mut self,
        shard: &Shard,
        client: &mut Client,
        head: &RequestHead,
        ctx: &mut RequestCtx,
        picked: &Picked,
        body: &mut Body,
        fresh: bool,
        watch: &mut bool,
    ) -> Result<Answered, AttemptError> {
        let translate = self.translates(picked);
        if translate && self.systemone.is_none() {
            let t = decisions::translate(body.bytes(&client.buf), ctx.model.as_deref().unwrap_or(""))
                .map_err(AttemptError::Failed)?;
            self.systemone = Some(t);
        }
        let worker = picked.worker();
        self.up_head.clear();
        let span = ctx.span.as_ref().map(|(ids, _)| ids);
        let provider = worker.meta.provider.is_some();
        if provider && self.for_provider.is_none() {
            let stripped = crate::contract::engine_fields::without_engine_fields(body.bytes(&client.buf));
            self.for_provider = Some(stripped.map(Body::Owned));
        }
        let sent: &mut Body = match (self.systemone.as_mut(), self.for_provider.as_mut()) {
            (Some(t), _) if translate => &mut t.body,
            (_, Some(Some(b))) if provider => b,
            _ => body,
        };
        let bytes = sent.bytes(&client.buf);
        let (authority, ct) = (&worker.url.authority, self.content_type.as_ref());
        let auth = &shard.cfg().auth;
        let skip = upstream_head(
            &mut self.up_head,
            head,
            &client.buf,
            authority,
            bytes,
            bytes.len(),
            span,
            &worker.meta,
            ct,
            auth,
        );
        if translate {
            decisions::retarget(&mut self.up_head, head.target.len());
        }
        attempt(shard, client, ctx, picked, &mut self.up_head, sent, Plan { skip, fresh }, watch).await
    }
}

/// The chosen worker's connection: a pooled one unless `fresh`, else a new one.
pub async fn open(shard: &Shard, picked: &Picked, fresh: bool) -> Result<UpstreamConn, AttemptError> {
    open_to(shard, picked.worker(), fresh).await
}

/// A connection to `worker`: a pooled one unless `fresh`, else a new one.
pub async fn open_to(shard: &Shard, worker: &Worker, fresh: bool) -> Result<UpstreamConn, AttemptError> {
    let (id, addr) = (worker.id, worker.url.addr);
    if let Some(c) = (!fresh).then(|| shard.take_conn(id)).flatten() {
        return Ok(c);
    }
    // A cloud provider's TLS: the egress thread makes the connection, this shard carries it.
    let made = match &worker.meta.tls {
        Some(route) => route.connect().await.map(|t| UpstreamConn::new(crate::io::Upstream::Tls(Box::new(t)))),
        None => pool::connect(addr).await,
    };
    match made {
        Ok(c) => Ok(c),
        Err(e) if is_resource_exhaustion(&e) => {
            Err(AttemptError::Failed(Failure::Internal(InternalError::NoDescriptors(e))))
        }
        Err(e) => {
            shard.report_connect_failed(id);
            Err(WorkerError::new(WorkerCause::Connect(e), false).into())
        }
    }
}

/// The worker's response head, once the whole request is written; a non-streaming
/// response over `--max-payload-size` is refused here, before a byte reaches the client
/// (a chunked one is read whole first: http/held_body.rs).
pub async fn await_head(
    shard: &Shard,
    client: &Client,
    ctx: &mut RequestCtx,
    mut conn: UpstreamConn,
    watch: &mut bool,
) -> Result<Answered, AttemptError> {
    let reused = conn.reused;
    match read_response_head(&mut conn, &client.stream, watch, shard.cfg().request_timeout).await {
        Ok(h) => {
            if shard.accounting() {
                ctx.timings.upstream_head = Some(crate::clock::now());
            }
            let max = shard.cfg().max_payload_size;
            match (h.body, ctx.streaming) {
                (ResponseBody::Length { len }, false) if len > max as u64 => {
                    return Err(WorkerError::new(WorkerCause::TooLarge { len, max }, reused).into());
                }
                (ResponseBody::Chunked, false) => {
                    let idle = shard.cfg().upstream_read_timeout;
                    match hold_chunked(&mut conn, h.len, max as u64, idle).await {
                        Ok(()) => {}
                        Err(Unheld::TooLarge(len)) => {
                            return Err(WorkerError::new(WorkerCause::TooLarge { len, max }, reused).into());
                        }
                        Err(Unheld::Bad(why)) => {
                            return Err(WorkerError::new(WorkerCause::BadBody(why), reused).into());
                        }
                    }
                }
                _ => {}
            }
            ctx.status = h.status;
            Ok(Answered { conn, head: h })
        }
        Err(e) => Err(head_failed(e, reused)),
    }
}

/// What a response head that did not come means (`reused`: on a pooled connection).
pub fn head_failed(e: HeadError, reused: bool) -> AttemptError {
    match e {
        HeadError::ClientGone => AttemptError::ClientGone,
        HeadError::NothingReceived(e) => WorkerError::new(WorkerCause::ClosedBeforeHead(e), reused).into(),
        HeadError::Bad(why) => WorkerError::new(WorkerCause::BadHead(why), reused).into(),
        HeadError::TimedOut => WorkerError::new(WorkerCause::HeadTimeout, reused).into(),
    }
}

/// Phase: relay. Streams the response whose head is in `conn.buf` and pools the connection
/// when the response ended cleanly on a connection the worker keeps open. Err: the worker
/// failed before a byte reached the client (its outcome is recorded), with the head buffer
/// back for another attempt.
#[allow(clippy::too_many_arguments)]
pub async fn relay_response(
    shard: &Shard,
    client: &mut Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    picked: &Picked,
    answered: Answered,
    spare: Vec<u8>,
    watch: bool,
) -> Result<Outcome, (WorkerError, Vec<u8>)> {
    let Answered { mut conn, head: rhead } = answered;
    let worker = picked.worker();
    let date = shard.date();
    let stamp =
        Stamp { request_id: &ctx.request_id, date: &date, close: announce_close(ctx, Some(head)), http10: ctx.http10 };
    let extra: [(&str, &[u8]); 1] = [("x-smg-routed-worker-id", worker.url.url.as_bytes())];
    let limits = RelayLimits {
        read_idle: shard.cfg().upstream_read_timeout,
        deadline: ctx.timings.upstream_started.unwrap_or(ctx.timings.started) + shard.cfg().request_timeout,
    };
    // The first byte's time is taken only when something reads it (metrics, the access log,
    // traces): a clock read per request is not free.
    let mut stats = RelayStats { timed: shard.accounting(), ..RelayStats::default() };
    stats.usage.on = ctx.reservation.is_some() || ctx.kv_predicted.is_some();
    // A streamed response is as long as the generation; any other is held to the cap.
    stats.cap = (!ctx.streaming).then_some(shard.cfg().max_payload_size as u64);
    let (end, spare) =
        relay(&mut client.stream, &mut conn, &rhead, &extra, stamp, spare, watch, limits, &mut stats).await;
    let id = worker.id;
    match end {
        // Judged by the retry edge, which takes it.
        RelayEnd::Worker { sent: false, .. } => {}
        RelayEnd::Worker { .. } => ctx.judge(id, Verdict::Failure),
        _ => ctx.judge(id, Verdict::of_status(rhead.status)),
    }
    if let RelayEnd::Worker { why, sent: false } = end {
        // Nothing reached the client: the retry edge may still take it elsewhere.
        return Err((WorkerError::new(WorkerCause::BadBody(why), conn.reused), spare));
    }
    give_head_buffer(spare);
    match end {
        RelayEnd::Done { reusable: true } => shard.put_conn(id, conn),
        RelayEnd::ClientGone => {
            crate::debug!("request {}: client left; closing worker connection", ctx.id_str());
            return Ok(Outcome::ClientGone);
        }
        _ => {}
    }
    Ok(Outcome::Relayed { end, stats })
}
