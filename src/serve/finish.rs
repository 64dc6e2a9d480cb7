//! The one exit: every request, answered here, rejected or relayed, ends in [`finish`]. It
//! writes what is still to be written, logs worker-side failures, decides keep-alive (the
//! only place that does). The request context it is lent is dropped as it returns (by the
//! connection loop, the next statement), which releases the worker's load count and the
//! in-flight count. Permits, budget settlements, breaker outcomes (the
//! verdicts attempts noted in the context, one per attempt), metrics and the access line
//! belong here too: nothing else settles a budget or records an outcome.

use std::time::Duration;

use monoio::net::TcpStream;

use super::client::Client;
use super::ctx::RequestCtx;
use super::error::{self, Failure};
use crate::access_log::Entry;
use crate::api::ApiError;
use crate::api::{local, Action, Local};
use crate::http::head::{BodyKind, RequestHead};
use crate::http::relay::{RelayEnd, RelayStats};
use crate::http::respond::{write_simple, Simple, Stamp};
use crate::io::{read_more, read_more_within, shutdown_write, write_all, Timed};
use crate::metrics::{self, Finished, Routed};
use crate::shard::Shard;
use crate::trace::SpanRecord;
use crate::workers::admin::{AdminReply, ReplyError};

/// Read buffer of a client connection; it grows for large bodies and is shrunk back after.
pub const READ_BUF: usize = 8 * 1024;
/// A buffer that grew past this is shrunk back between requests.
const KEEP_BUF: usize = 64 * 1024;
/// An unread body up to this size is read and dropped after an early answer, so the
/// connection survives; a larger one closes it.
const DRAIN_MAX: u64 = 64 * 1024;

/// How a request ended, for `finish`.
pub enum Outcome {
    /// Answered by the gateway itself.
    Local(Local),
    /// Answered by the worker control thread (admin API, worker info).
    Control(AdminReply),
    /// Answered with an error.
    Failed(Failure),
    /// The worker's response went to the client (whole, or cut short).
    Relayed { end: RelayEnd, stats: RelayStats },
    /// Nobody to answer: the client left or its socket failed.
    ClientGone,
    /// The connection was upgraded (a WebSocket session) and its session is over: the
    /// connection closes.
    Upgraded,
}

/// Whether the connection goes on after this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    KeepAlive,
    Close,
}

/// An unread body that is cheap to read and drop: short, declared, and not waiting for our
/// `100 Continue`.
fn drainable(head: Option<&RequestHead>) -> bool {
    head.is_some_and(|h| !h.expect_continue && matches!(h.body, BodyKind::Length { len } if len <= DRAIN_MAX))
}

/// Whether the response about to be sent must say `connection: close`: the client asked
/// (or is HTTP/1.0 without keep-alive), the shard drains, or an early answer leaves a body
/// unread that we will not drain.
pub fn announce_close(ctx: &RequestCtx, head: Option<&RequestHead>) -> bool {
    ctx.close || (ctx.body_unread && !drainable(head))
}

/// Ends a request; see the module doc.
pub async fn finish(
    shard: &Shard,
    client: &mut Client,
    head: Option<&RequestHead>,
    ctx: &mut RequestCtx,
    outcome: Outcome,
) -> Next {
    let mut keep = match outcome {
        Outcome::Local(l) => answer(shard, client, head, ctx, Answer::Local(l)).await,
        Outcome::Control(r) => {
            let keep = answer(shard, client, head, ctx, Answer::Control(r)).await;
            if let (Some(r), Some(used)) = (ctx.reservation.take(), ctx.used_tokens) {
                if (200..300).contains(&ctx.status) {
                    r.settle(used);
                }
            }
            keep
        }
        Outcome::Failed(f) => answer(shard, client, head, ctx, Answer::Failure(f)).await,
        Outcome::Relayed { end, stats } => {
            // The budget is trued up to what the worker says it used; with no figure (or a
            // failed answer) the reservation's estimate stands.
            if let (Some(r), Some(used)) = (ctx.reservation.take(), stats.usage.total()) {
                if (200..300).contains(&ctx.status) && matches!(end, RelayEnd::Done { .. }) {
                    r.settle(used);
                }
            }
            ctx.timings.first_byte = stats.first_byte;
            ctx.bytes_out = stats.bytes;
            ctx.engine_cached = stats.usage.cached;
            if let RelayEnd::Worker { why, .. } = &end {
                crate::warn!(
                    "request {}: worker {} {why} after {:?}; client response cut short",
                    ctx.id_str(),
                    ctx.worker_url(),
                    ctx.timings.started.elapsed()
                );
            }
            !announce_close(ctx, head) && matches!(end, RelayEnd::Done { .. }) && !stats.close_delimited
        }
        Outcome::ClientGone | Outcome::Upgraded => false,
    };
    if keep && ctx.body_unread {
        keep = drain_body(shard, client, head).await;
    }
    for (worker, verdict) in ctx.take_verdicts() {
        shard.record_outcome(worker, verdict);
    }
    account(shard, client, head, ctx);
    // The caller drops the context (its permit, slots and reservation) as this returns. It
    // is lent, not given: an async fn copies what it is given into its state and then into
    // its locals (544 bytes, twice a request).
    if !keep {
        return Next::Close;
    }
    let buf = &mut client.buf;
    buf.drain(..client.next.min(buf.len()));
    if buf.capacity() > KEEP_BUF && buf.len() < READ_BUF {
        buf.shrink_to(READ_BUF);
    }
    Next::KeepAlive
}

enum Answer {
    Local(Local),
    Control(AdminReply),
    Failure(Failure),
}

/// Writes a gateway-made answer; true if the connection may go on.
async fn answer(
    shard: &Shard,
    client: &mut Client,
    head: Option<&RequestHead>,
    ctx: &mut RequestCtx,
    a: Answer,
) -> bool {
    let close = announce_close(ctx, head) || matches!(&a, Answer::Failure(f) if f.closes_connection());
    let date = shard.date();
    let stamp = Stamp { request_id: &ctx.request_id, date: &date, close, http10: ctx.http10 };
    let head_only = head.is_some_and(|h| h.method == crate::http::head::Method::Head);
    let mut out = Vec::with_capacity(256);
    ctx.status = match &a {
        Answer::Local(l) => local::answer(&mut out, *l, &shard.snapshot(), head_only, &stamp),
        Answer::Control(r) => match &r.api_error {
            Some(e) => {
                let e = match e {
                    ReplyError::NoWorkers => ApiError::no_available_workers(None),
                    ReplyError::Unreachable { worker, error } => ApiError::upstream_connect(worker, error),
                };
                e.write_response(&mut out, head_only, &stamp);
                ctx.error_code = e.code;
                e.status
            }
            None => {
                // An answer the gateway assembled from a worker's (Decisions, gRPC embeddings)
                // names that worker, as a relayed one does.
                let routed = ctx.chosen.as_ref().filter(|_| (200..300).contains(&r.status));
                let lines = [
                    r.location.as_deref().map(|l| ("location", l.as_bytes())),
                    routed.map(|c| ("x-smg-routed-worker-id", c.worker().url.url.as_bytes())),
                ];
                let mut headers: [(&str, &[u8]); 2] = [("", b""); 2];
                let mut n = 0;
                for line in lines.into_iter().flatten() {
                    headers[n] = line;
                    n += 1;
                }
                let resp =
                    Simple { status: r.status, content_type: r.content_type, headers: &headers[..n], body: &r.body };
                write_simple(&mut out, &resp, head_only, &stamp);
                r.status
            }
        },
        Answer::Failure(f) => {
            let (status, code) = error::respond(&mut out, f, ctx.worker_url(), head_only, &stamp);
            ctx.error_code = code;
            if f.is_worker_side() || status >= 500 {
                crate::warn!(
                    "request {}: {status} from the gateway, worker {}: {}",
                    ctx.id_str(),
                    ctx.worker_url(),
                    error::cause(f)
                );
            }
            status
        }
    };
    ctx.bytes_out = out.len() as u64;
    let (res, _) = write_all(&mut client.stream, out).await;
    if res.is_err() {
        return false;
    }
    if close && (ctx.body_unread || matches!(&a, Answer::Failure(f) if f.closes_connection())) {
        client.linger = true;
    }
    !close
}

/// Counts the request in the shard's metrics and writes its access line.
fn account(shard: &Shard, client: &Client, head: Option<&RequestHead>, ctx: &RequestCtx) {
    if !shard.accounting() {
        return;
    }
    let now = crate::clock::now();
    let started = ctx.timings.started;
    let took = now.saturating_duration_since(started);
    let first_byte = ctx.timings.first_byte.map(|t| t.saturating_duration_since(started));
    let to_head = first_byte.unwrap_or(took);
    let model = ctx.chosen.as_ref().and_then(|c| c.worker().model.as_deref());
    let endpoint = match ctx.route.map(|r| r.action) {
        Some(Action::Proxy(spec) | Action::Realtime(spec)) => Some(spec.metric),
        _ => None,
    };
    let retries = ctx.attempts.saturating_sub(1);
    let routed = match (model, endpoint) {
        (Some(model), Some(endpoint)) => Some(Routed {
            model,
            endpoint,
            streaming: ctx.streaming,
            first_byte,
            retries,
            retries_exhausted: ctx.retries_exhausted,
        }),
        _ => None,
    };
    let method = head.map(|h| h.method.name()).unwrap_or("OTHER");
    let path = ctx.route.map(|r| r.path).unwrap_or("other");
    shard.record(&Finished {
        method,
        path,
        status: ctx.status,
        error_code: ctx.error_code,
        to_head,
        routed,
        admitted: ctx.admitted,
        worker_error: (ctx.chosen.is_some() && ctx.status >= 500).then(|| metrics::error_type(ctx.status)),
        class: ctx.class.map(|c| c.as_str()),
        body_path: ctx.body_path,
        kv_precision: match (ctx.kv_predicted, ctx.engine_cached, &ctx.chosen) {
            (Some(p), Some(c), Some(chosen)) if (200..300).contains(&ctx.status) => {
                Some((chosen.worker().url.url.as_str(), p, c))
            }
            _ => None,
        },
    });
    // The buffer may be gone (a body read that timed out takes it with the cancelled read).
    if let Some((ids, start)) = ctx.span {
        shard.record_span(SpanRecord {
            ids,
            name: format!("{method} {path}"),
            start,
            duration: took,
            status: ctx.status,
            request_id: String::from_utf8_lossy(&ctx.request_id).into_owned(),
            worker: ctx.chosen.as_ref().map(|c| c.worker().url.url.clone()).unwrap_or_default(),
            model: ctx.model.clone().unwrap_or_default(),
        });
    }
    let raw_path = head.and_then(|h| client.buf.get(h.path.clone())).unwrap_or(b"");
    shard.access_line(
        &Entry {
            request_id: &ctx.request_id,
            tenant: ctx.tenant.as_ref().map(|t| t.as_str()).unwrap_or(""),
            priority: ctx.class.map_or("", |c| c.as_str()),
            method,
            path: raw_path,
            model: ctx.model.as_deref().unwrap_or(""),
            worker: ctx.chosen.as_ref().map(|c| c.worker().url.url.as_str()).unwrap_or(""),
            status: ctx.status,
            error_code: ctx.error_code,
            bytes_in: ctx.bytes_in,
            bytes_out: ctx.bytes_out,
            duration_us: took.as_micros() as u64,
            upstream_us: ctx.timings.upstream_head.map(|t| t.saturating_duration_since(started).as_micros() as u64),
            ttfb_us: first_byte.map(|d| d.as_micros() as u64),
            retries,
        },
        now,
    );
}

/// Reads and drops a short unread body so the connection can carry the next request.
async fn drain_body(shard: &Shard, client: &mut Client, head: Option<&RequestHead>) -> bool {
    let Some(BodyKind::Length { len }) = head.map(|h| h.body) else { return false };
    let Some(h) = head else { return false };
    let end = h.len + len as usize;
    while client.buf.len() < end {
        let want = end - client.buf.len();
        let (res, b) = read_more_within(
            &mut client.stream,
            std::mem::take(&mut client.buf),
            want,
            shard.cfg().client_read_timeout,
        )
        .await;
        client.buf = b;
        match res {
            Timed::Done(Ok(n)) if n > 0 => {}
            _ => return false,
        }
    }
    client.next = end;
    true
}

/// Closes a client connection. After an early answer the client may still be sending: stop
/// writing, discard what it sends for a short while, then close, so the kernel does not
/// reset the connection under the client's unread answer (nginx's lingering close).
pub async fn close(mut client: Client) {
    shutdown_write(&mut client.stream).await;
    if client.linger {
        linger(&mut client.stream).await;
    }
}

async fn linger(stream: &mut TcpStream) {
    let until = crate::clock::now() + Duration::from_millis(500);
    let mut scratch = Vec::with_capacity(16 * 1024);
    let mut discarded = 0usize;
    while discarded < (4 << 20) {
        let left = until.saturating_duration_since(crate::clock::now());
        if left.is_zero() {
            break;
        }
        scratch.clear();
        match crate::clock::timeout(left, read_more(stream, scratch, 16 * 1024)).await {
            Ok((Ok(n), b)) if n > 0 => {
                discarded += n;
                scratch = b;
            }
            _ => break,
        }
    }
}
