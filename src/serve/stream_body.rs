//! Phase: body, streamed. A large body that nothing in the gateway needs to read goes to
//! the worker while it arrives, through one bounded buffer, instead of waiting in memory:
//! a 200 MB upload costs a few hundred KiB here and the worker sees its first byte at once.
//!
//! The decision is made from the head and the gateway's state, before a byte of the body is
//! read, by SMG's rules (its Request Streaming page): only on the routes whose bodies may
//! stream (`EndpointSpec::body_streams`), only with a `Content-Length`, and only when
//! nothing needs the body's text: not `--routing-key-override` (the body's `rid`), not a
//! policy routing on text without a valid `X-SMG-Routing-Tokens` hint, not a fleet serving
//! more than one model (the model is in the body), not data-parallel workers (their rank is
//! spliced into it). Past that, a body streams when it is larger than
//! `--max-buffered-request-bytes`, the most the gateway holds just to keep a request
//! retryable. A streamed body is forwarded as the client sent it (no contract validation, no
//! alias splice) and gets one attempt: it cannot be replayed.
//!
//! A transcription form (`/v1/audio/transcriptions`) streams by the same size rule, but its
//! model is in the body: `stream_form` reads the form's head for it, and checks
//! every byte of the form before the worker gets it (the [`Check`] the pump runs).
//!
//! The stall clock (`--stream-body-stall-timeout-secs`) runs only while waiting on the
//! client; while the worker is slow to read, the gateway is not asking the client for bytes
//! and the clock is paused. A stall answers `408 request_body_stalled`, an upload that ends
//! early `400 request_body_aborted`; both close the worker connection and neither counts
//! against the worker.

use std::rc::Rc;
use std::time::Duration;

use monoio::net::TcpStream;

use super::client::Client;
use super::ctx::{Picked, RequestCtx};
use super::error::{Failure, WorkerCause, WorkerError};
use super::finish::Outcome;
use super::pick::pick_worker;
use super::upstream::{await_head, head_buffer, open, relay_response, upstream_head, AttemptError};
use crate::api::{transcriptions, ApiError, EndpointSpec};
use crate::http::head::{BodyKind, RequestHead};
use crate::http::respond::CONTINUE;
use crate::io::{read_into, write_all, Writev2};
use crate::routing::parse_routing_tokens;
use crate::shard::Shard;
use crate::worker_id::WorkerId;
use crate::workers::breaker::Verdict;

/// The largest read of a streamed body: big enough that a fast upload is a few thousand
/// reads and writes per 200 MB, small enough that it is all the memory it takes.
pub(super) const PUMP: usize = 256 * 1024;

/// Where a body goes, and SMG's `reason` label for it (`smg_router_request_body_path_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyPath {
    Stream { len: usize, reason: &'static str },
    Buffer(&'static str),
}

impl BodyPath {
    /// The metric's `(path, reason)` labels.
    pub fn labels(self) -> (&'static str, &'static str) {
        match self {
            BodyPath::Stream { reason, .. } => ("streamed", reason),
            BodyPath::Buffer(reason) => ("buffered", reason),
        }
    }
}

/// The decision for a request on a route whose body may stream (None for the others), by
/// the first rule that applies (see the module doc).
/// A form is routed on its own `model` field, read as it passes, and neither routing keys,
/// text policies nor a data-parallel rank read or edit a form: only the size rule applies.
pub fn decide(shard: &Shard, spec: &EndpointSpec, head: &RequestHead, buf: &[u8]) -> Option<BodyPath> {
    let form = spec.path == transcriptions::PATH;
    if !spec.body_streams && !form {
        return None;
    }
    let cfg = shard.cfg();
    let routing = &cfg.routing;
    if routing.routing_key_override && !form {
        return Some(BodyPath::Buffer("routing_key_override"));
    }
    if !form
        && routing.policy.uses_text()
        && head.header(buf, "x-smg-routing-tokens").and_then(parse_routing_tokens).is_none()
    {
        return Some(BodyPath::Buffer("policy_needs_text"));
    }
    if let Some(reason) = shard.snapshot().body_needed.filter(|_| !form) {
        return Some(BodyPath::Buffer(reason));
    }
    let BodyKind::Length { len } = head.body else { return Some(BodyPath::Buffer("no_content_length")) };
    let retries = cfg.retry.is_some();
    // A declared length over the cap is refused by the buffered path's reader, at once.
    if len <= cfg.max_buffered_request_bytes || len > cfg.max_payload_size as u64 {
        return Some(BodyPath::Buffer(if retries { "retryable" } else { "small_body" }));
    }
    let reason = if retries { "retry_forfeited" } else { "pure_forward" };
    Some(BodyPath::Stream { len: len as usize, reason })
}

/// The body will be buffered after all (no worker could be chosen from the head alone).
pub struct Buffer;

/// Picks a worker from the head, then streams the body to it and relays its answer.
/// `Err(Buffer)`: no worker could be picked without the body (the buffered path says why,
/// or finds one once it has read the body); nothing was read or reserved.
pub async fn forward(
    shard: &Rc<Shard>,
    client: &mut Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    spec: &EndpointSpec,
    len: usize,
) -> Result<Outcome, Buffer> {
    let Some(model) = shard.snapshot().only_model.clone() else { return Err(Buffer) };
    ctx.model = Some(model);
    let Ok(picked) = pick_worker(shard, spec, head, &client.buf, &[], ctx, &[], None) else {
        ctx.model = None;
        return Err(Buffer);
    };
    if let Err(o) = super::reserve::reserve(shard, ctx, len).await {
        return Ok(o);
    }
    ctx.bytes_in = len as u64;
    // It cannot be re-sent, so it is not preempted once its body starts moving.
    if let Some(slot) = &ctx.slot {
        slot.held().start();
    }
    Ok(stream(shard, client, head, ctx, &picked, len, Upload::default()).await)
}

/// Sees every body byte the pump reads before the worker does; an Err stops the upload
/// there, so the worker never gets the rest (and its connection is closed).
pub(super) trait Check {
    /// The next bytes of the body; `last` when they end it.
    fn feed(&mut self, bytes: &[u8], last: bool) -> Result<(), Failure>;
    /// Once the body is all read: the client asked for a streamed answer (which the
    /// relay does not hold to `--max-payload-size`).
    fn streaming(&self) -> bool;
}

/// What a caller that already read part of the body tells [`stream`].
#[derive(Default)]
pub(super) struct Upload<'a> {
    /// Checks the bytes still to come (those already here were checked by the caller).
    pub check: Option<&'a mut dyn Check>,
    /// The client already got its `100 Continue`.
    pub continued: bool,
    /// Where the client's Content-Type is, when the worker gets it (a form's boundary).
    pub content_type: Option<std::ops::Range<usize>>,
}

/// One attempt (two only when a stale pooled socket fails before any byte was taken from
/// the client): the head with the body bytes already here, the rest pumped as it arrives,
/// then the worker's answer relayed. `len` is the body the worker is told of, and the bytes
/// here are its start (a caller may have edited them: the client still owes `len - here`).
#[allow(clippy::too_many_arguments)]
pub(super) async fn stream(
    shard: &Rc<Shard>,
    client: &mut Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    picked: &Picked,
    len: usize,
    mut upload: Upload<'_>,
) -> Outcome {
    let here = (client.buf.len() - head.len).min(len);
    let mut up_head = head_buffer();
    {
        let worker = picked.worker();
        let span = ctx.span.as_ref().map(|(ids, _)| ids);
        let ct = upload.content_type.as_ref();
        let auth = &shard.cfg().auth;
        upstream_head(&mut up_head, head, &client.buf, &worker.url.authority, &[], len, span, &worker.meta, ct, auth);
    }
    let id = picked.worker().id;
    let mut fresh = false;
    loop {
        ctx.attempts += 1;
        let mut conn = match open(shard, picked, fresh).await {
            Ok(c) => c,
            Err(e) => return failed(ctx, id, e),
        };
        let (res, h, b) = Writev2::write(
            &mut conn.stream,
            std::mem::take(&mut up_head),
            std::mem::take(&mut client.buf),
            head.len,
            head.len + here,
        )
        .await;
        (up_head, client.buf) = (h, b);
        if let Err(e) = res {
            if conn.reused && !fresh {
                shard.forget_conns(id);
                fresh = true;
                continue;
            }
            return failed(ctx, id, WorkerError::new(WorkerCause::Write(e), conn.reused).into());
        }
        let mut rest = len - here;
        if rest > 0 {
            if head.expect_continue && !upload.continued {
                upload.continued = true;
                let (res, _) = write_all(&mut client.stream, CONTINUE.to_vec()).await;
                if res.is_err() {
                    return Outcome::ClientGone;
                }
            }
            let stall = shard.cfg().stream_body_stall;
            match pump(&mut client.stream, &mut conn.stream, rest, stall, upload.check.as_deref_mut()).await {
                Pumped::All => {
                    rest = 0;
                    ctx.streaming |= upload.check.as_ref().is_some_and(|c| c.streaming());
                }
                Pumped::Stalled => return client_failed(ctx, ApiError::body_stalled()),
                Pumped::Aborted => return client_failed(ctx, ApiError::body_aborted()),
                // The worker has part of the body and will never get the rest: its
                // connection is dropped here, closed.
                Pumped::Refused(f) => {
                    ctx.close = true;
                    return Outcome::Failed(f);
                }
                // The worker stopped reading: it may have answered already (a 413 of its own),
                // and that answer is the one to give. The rest of the body is not read.
                Pumped::WorkerClosed => ctx.close = true,
            }
        }
        let pumped = len > here;
        let mut watch = true;
        let answered = match await_head(shard, client, ctx, conn, &mut watch).await {
            Ok(a) => a,
            // All of the body was here and still is: it can go again on a fresh connection.
            Err(AttemptError::Failed(Failure::Worker(e))) if e.stale_socket() && !fresh && !pumped => {
                shard.forget_conns(id);
                fresh = true;
                continue;
            }
            Err(e) => return failed(ctx, id, e),
        };
        if rest == 0 {
            // The pumped bytes never entered the connection buffer; what follows the body
            // there (a pipelined request) now follows the head.
            client.buf.drain(head.len..head.len + here);
            client.next = head.len;
            ctx.body_unread = false;
        }
        return match relay_response(shard, client, head, ctx, picked, answered, up_head, watch).await {
            Ok(o) => o,
            Err((e, _)) => {
                ctx.judge(id, Verdict::Failure);
                Outcome::Failed(Failure::Worker(e))
            }
        };
    }
}

enum Pumped {
    All,
    Stalled,
    Aborted,
    WorkerClosed,
    Refused(Failure),
}

/// Copies `rest` body bytes from the client to the worker, one bounded read at a time; the
/// stall limit applies to each wait on the client, and `check` sees each read before it is
/// written.
async fn pump(
    from: &mut TcpStream,
    to: &mut crate::io::Upstream,
    mut rest: usize,
    stall: Option<Duration>,
    mut check: Option<&mut (dyn Check + '_)>,
) -> Pumped {
    let mut chunk = Vec::with_capacity(PUMP.min(rest));
    while rest > 0 {
        let want = PUMP.min(rest);
        let (res, b) = match stall {
            Some(limit) => match crate::clock::timeout(limit, read_into(from, chunk, want)).await {
                Ok(r) => r,
                Err(_) => return Pumped::Stalled,
            },
            None => read_into(from, chunk, want).await,
        };
        chunk = b;
        match res {
            Ok(n) if n > 0 => rest -= n,
            _ => return Pumped::Aborted,
        }
        if let Some(c) = check.as_deref_mut() {
            if let Err(f) = c.feed(&chunk, rest == 0) {
                return Pumped::Refused(f);
            }
        }
        let (res, b) = write_all(to, chunk).await;
        chunk = b;
        if res.is_err() {
            return Pumped::WorkerClosed;
        }
    }
    Pumped::All
}

/// The client broke the upload: answered, and the connection (its stream is mid-body) and
/// the worker's (dropped here) closed; not the worker's fault.
fn client_failed(ctx: &mut RequestCtx, e: ApiError) -> Outcome {
    ctx.close = true;
    Outcome::Failed(Failure::Rejected(e))
}

/// An attempt that got no answer: counted against the worker (a refused answer aside), and
/// final, as a streamed body is not retried.
fn failed(ctx: &mut RequestCtx, worker: WorkerId, e: AttemptError) -> Outcome {
    match e {
        AttemptError::Failed(Failure::Worker(e)) => {
            if let Some(v) = e.verdict() {
                ctx.judge(worker, v);
            }
            if ctx.body_unread {
                ctx.close = true;
            }
            Outcome::Failed(Failure::Worker(e))
        }
        AttemptError::Failed(f) => {
            ctx.close |= ctx.body_unread;
            Outcome::Failed(f)
        }
        AttemptError::ClientGone => Outcome::ClientGone,
    }
}
