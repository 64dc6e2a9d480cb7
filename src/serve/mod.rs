//! The request's life, top to bottom. One loop per client connection, one pass per request:
//!
//! ```text
//!  head ─► classify ─► authorize ─► admit ─► body ─► inspect ─► pick ─► attempt ─► relay ─┐
//!   │         │            │          │        │        │         │      │ ▲             │
//!   │ 400     │ 404/405,   │ 401/403  │ 429/   │ 408/   │ 400     │ 404/ │ │ no byte sent │
//!   │ 414     │ local and  │          │ 503    │ 413/   │         │ 503  │ │ yet: a stale │
//!   │ 431     │ control    │          │        │ 400    │         │      │ │ pooled socket│
//!   │ 501     │ answers    │          │        │        │         │      │ │ (same worker,│
//!   │         │            │          │        │        │         │      │ │ fresh conn), │
//!   │         │            │          │        │        │         │      │ └ or a failure │
//!   │         │            │          │        │        │         │      │   / retryable  │
//!   │         │            │          │        │        │         │      │   status: pick │
//!   │         │            │          │        │        │         │      │   again        │
//!   ▼         ▼            ▼          ▼        ▼        ▼         ▼      ▼ 502/504        ▼
//!  finish ◄───────────────────────────────────────────────────────────────────────────────┘
//!   keep-alive ─► head        close ─► (linger) close
//! ```
//!
//! Every edge ends in [`finish::finish`], the one exit. Pipelined requests are answered in
//! order simply because each one is finished before the next head is parsed from the bytes
//! left in the buffer. `authorize` and `admit` run before the body is read. pick → attempt →
//! relay and the retry edge are one loop for every worker protocol ([`forward`]); each
//! attempt's verdict on its worker is noted in the context and recorded by `finish`.
//! A large body that nothing needs to read leaves the path after `admit`: it is picked a
//! worker from the head alone and streamed to it as it arrives, one attempt
//! ([`stream_body`]); a large transcription form likewise, picked on the `model` part at
//! its head and checked as it passes ([`stream_form`]).

mod client;
mod control;
mod ctx;
mod decisions;
mod error;
mod finish;
mod forward;
mod grpc;
mod history;
mod inspect;
mod isolate;
mod merged;
mod models;
mod pair;
mod pair_admit;
mod pick;
mod provider_turn;
mod queue_wait;
mod realtime;
mod reserve;
mod reshaped;
mod responses;
mod stream_body;
mod stream_form;
mod upstream;
mod whole;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use monoio::net::TcpStream;

use crate::admission::auth::{unauthenticated_tenant, Tenant, Verdict};
use crate::admission::permits::{Admit, Permits};
use crate::admission::priority::{Admission, Class, Scheduler};
use crate::admission::Permit;
use crate::api::{self, Action, ApiError, Local, Route};
use crate::http::body::{read_body, Body, BodyError, BodyLimits};
use crate::http::head::{parse_request, ParseError, RequestHead};
use crate::io::{nodelay, read_more_within, send_deadline, Timed};
use crate::shard::{ConnectionSlot, Shard};
use client::Client;
use ctx::RequestCtx;
use error::{ClientError, Failure, InternalError};
use finish::{finish, Next, Outcome, READ_BUF};
use queue_wait::queue_wait;
use stream_body::BodyPath;

/// Serves one client connection until it closes; a panic outside a request's phases ends
/// only this connection.
pub async fn connection(shard: Rc<Shard>, stream: TcpStream, slot: ConnectionSlot) {
    // The clock is read once a wake for all a connection does (crate::clock).
    if let Err(msg) = crate::clock::per_wake(isolate::catch_panic(serve_connection(shard, stream, slot))).await {
        crate::error!("connection task panicked: {msg}; connection closed");
    }
}

async fn serve_connection(shard: Rc<Shard>, stream: TcpStream, slot: ConnectionSlot) {
    nodelay(&stream);
    send_deadline(&stream, shard.cfg().client_write_timeout);
    let unread = Some(shard.unread_connection());
    let mut client = Client { stream, buf: Vec::with_capacity(READ_BUF), next: 0, linger: false, unread };
    loop {
        let read = read_head(&shard, &mut client).await;
        client.unread = None;
        let next = match read {
            HeadRead::Head(head) => {
                // Until a body is read (or drained), the request is its head.
                client.next = head.len;
                let route = api::classify(head.method, &client.buf[head.path.clone()]);
                let mut ctx = RequestCtx::new(&shard, &head, &client.buf, route);
                let outcome = match isolate::catch_panic(request(&shard, &mut client, &head, &mut ctx, route)).await {
                    Ok(o) => o,
                    Err(msg) => {
                        crate::error!("request {}: panicked: {msg}", ctx.id_str());
                        ctx.close = true;
                        Outcome::Failed(Failure::Internal(InternalError::Panic))
                    }
                };
                finish(&shard, &mut client, Some(&head), &mut ctx, outcome).await
            }
            HeadRead::Reject(e) => {
                let mut ctx = RequestCtx::unparsed(&shard, &client.buf);
                let outcome = Outcome::Failed(Failure::Client(ClientError::Head(e)));
                finish(&shard, &mut client, None, &mut ctx, outcome).await
            }
            HeadRead::Closed => Next::Close,
        };
        if next == Next::Close {
            break;
        }
    }
    finish::close(client).await;
    drop(slot);
}

/// The phases from classify to relay; every way out is an [`Outcome`] for `finish`.
async fn request(
    shard: &Rc<Shard>,
    client: &mut Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    route: Route,
) -> Outcome {
    if let Err(f) = authorize(shard, client, head, ctx, route) {
        return Outcome::Failed(f);
    }
    if head.hop.clone().is_some_and(|r| crate::http::hop::looped(&client.buf[r])) {
        return reject(ApiError::loop_detected());
    }
    let spec = match route.action {
        Action::Proxy(spec) => spec,
        // A WebSocket session holds its admission for as long as it lives.
        Action::Realtime(_) => match admit(shard, client, head, ctx).await {
            Ok(()) => return realtime::session(shard, client, head, ctx).await,
            Err(o) => return o,
        },
        Action::Local(Local::Models) if shard.snapshot().providers => {
            return models::list(shard, head, &client.buf).await
        }
        Action::Local(l) => return Outcome::Local(l),
        Action::Control => return control::ask(shard, client, head, ctx).await,
        Action::History(op) => {
            let body = match head.method {
                crate::http::head::Method::Post => match body(shard, client, head, ctx).await {
                    Ok(b) => Some(b),
                    Err(o) => return o,
                },
                _ => None,
            };
            return history::serve(shard, &client.buf, head, ctx, op, body.as_ref()).await;
        }
        Action::AdminNotImplemented => return reject(ApiError::admin_not_implemented(&path(client, head))),
        Action::NotFound => return reject(ApiError::route_not_found(&path(client, head))),
        Action::MethodNotAllowed => return reject(ApiError::method_not_allowed(&path(client, head))),
    };
    if let Err(o) = admit(shard, client, head, ctx).await {
        return o;
    }
    // A fault hook for the panic-isolation test, with a permit held; not in release builds.
    #[cfg(debug_assertions)]
    if head.header(&client.buf, "x-smg-debug-panic").is_some() {
        panic!("deliberate panic (debug builds only)");
    }
    if let Some(path) = stream_body::decide(shard, spec, head, &client.buf) {
        ctx.body_path = Some(path.labels());
        if let BodyPath::Stream { len, .. } = path {
            if spec.path == api::transcriptions::PATH {
                return stream_form::forward(shard, client, head, ctx, spec, len).await;
            }
            match stream_body::forward(shard, client, head, ctx, spec, len).await {
                Ok(o) => return o,
                Err(_) => ctx.body_path = Some(("buffered", "no_available_worker")),
            }
        }
    }
    let body = match body(shard, client, head, ctx).await {
        Ok(b) => b,
        Err(o) => return o,
    };
    let mut body = match inspect::inspect(shard, spec, head, &client.buf, body, ctx) {
        Ok(b) => b,
        Err(f) => return Outcome::Failed(f),
    };
    if let Err(o) = reserve::reserve(shard, ctx, body.bytes(&client.buf).len()).await {
        return o;
    }
    if spec.path == api::history::RESPONSES && responses::served_here(shard, ctx) {
        return responses::turn(shard, client, head, ctx, &mut body).await;
    }
    if spec.path == api::history::RESPONSES && responses::kept_here(shard, ctx) {
        return responses::for_provider(shard, client, head, ctx, spec, &body).await;
    }
    forward::forward(shard, client, head, ctx, spec, &mut body, forward::Made::Nothing).await
}

/// Phase: authorize. Serving routes need a serving key when keys are configured and get
/// their tenant identity here; admin routes follow the contract's admin rules; every other
/// route (local answers, unknown paths) is open.
fn authorize(
    shard: &Shard,
    client: &Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    route: Route,
) -> Result<(), Failure> {
    let auth = &shard.cfg().auth;
    // Looked up only when a key can matter: a header scan per request is not free.
    let authorization = || head.header(&client.buf, "authorization");
    let deny = |v: Verdict| if v == Verdict::Forbidden { Failure::Forbidden } else { Failure::Unauthorized };
    if route.admin {
        return match auth.check_admin(authorization()) {
            Verdict::Pass => Ok(()),
            v => Err(deny(v)),
        };
    }
    if let Action::Proxy(_) | Action::Realtime(_) | Action::History(_) = route.action {
        let presented = if auth.serving_enabled() { authorization() } else { None };
        let tenant = match auth.check_serving(presented).map_err(deny)? {
            Some(key) => Tenant::Key(key),
            None => unauthenticated_tenant(auth.tenant_header().and_then(|h| head.header(&client.buf, h))),
        };
        ctx.tenant = Some(tenant);
    }
    Ok(())
}

/// Phase: admit. With `--max-concurrent-requests`, takes a permit or waits for one in the
/// queue, the body unread; a client that hangs up while queued leaves at once.
async fn admit(shard: &Shard, client: &Client, head: &RequestHead, ctx: &mut RequestCtx) -> Result<(), Outcome> {
    if let Some(sched) = shard.scheduler() {
        return admit_class(sched, client, head, ctx).await;
    }
    let Some(permits) = shard.permits() else { return Ok(()) };
    let ticket = match Permits::admit(permits) {
        Admit::Now => {
            ctx.permit = Some(Permit::new(permits));
            ctx.admitted = Some(true);
            return Ok(());
        }
        Admit::Full => {
            ctx.admitted = Some(false);
            return Err(reject(ApiError::admission_queue_full()));
        }
        Admit::Queued(t) => t,
    };
    let limit = shard.cfg().admission.as_ref().map(|a| a.queue_timeout).unwrap_or_default();
    let queued = crate::clock::now();
    let granted = queue_wait(client, limit, || Permits::wait(&ticket)).await?;
    ctx.admitted = Some(granted == Some(true));
    match granted {
        Some(true) => {
            ticket.into_held();
            ctx.permit = Some(Permit::new(permits));
            Ok(())
        }
        Some(false) => Err(reject(ApiError::admission_queue_full())),
        None => Err(reject(ApiError::admission_queue_timeout(queued.elapsed()))),
    }
}

/// Phase: admit, with the priority scheduler: the class from `X-SMG-Priority` (unknown or
/// missing: `default`), clamped to the tenant's `max_class`; a slot now, or a wait in the
/// class's queue until the scheduler grants one or the class's queue timeout.
async fn admit_class(
    sched: &Rc<RefCell<Scheduler>>,
    client: &Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
) -> Result<(), Outcome> {
    let asked = head.header(&client.buf, "x-smg-priority").map_or(Class::Default, Class::parse_header);
    let (class, limit) = {
        let s = sched.borrow();
        let cfg = s.config();
        let class = asked.min(cfg.max_class(ctx.tenant.as_ref().map(|t| t.as_str())));
        (class, cfg.queue_timeout(class))
    };
    ctx.class = Some(class);
    let ticket = match Scheduler::admit(sched, class) {
        Admission::Now(slot) => {
            ctx.slot = Some(slot);
            ctx.admitted = Some(true);
            return Ok(());
        }
        Admission::Full => {
            ctx.admitted = Some(false);
            return Err(reject(ApiError::scheduler_queue_full()));
        }
        Admission::Queued(t) => t,
    };
    let granted = queue_wait(client, limit, || Scheduler::wait(&ticket)).await?;
    ctx.admitted = Some(granted == Some(true));
    match granted {
        Some(true) => {}
        Some(false) => return Err(reject(ApiError::scheduler_queue_full())),
        None => return Err(reject(ApiError::scheduler_queue_timeout())),
    }
    ctx.slot = Some(ticket.into_slot());
    Ok(())
}

/// Phase: body.
async fn body(shard: &Shard, client: &mut Client, head: &RequestHead, ctx: &mut RequestCtx) -> Result<Body, Outcome> {
    let limits = BodyLimits { max: shard.cfg().max_payload_size, within: shard.cfg().client_read_timeout };
    let (res, buf) = read_body(&mut client.stream, head, std::mem::take(&mut client.buf), limits).await;
    client.buf = buf;
    match res {
        Ok((body, next)) => {
            ctx.body_unread = false;
            client.next = next;
            Ok(body)
        }
        Err(BodyError::Gone) => Err(Outcome::ClientGone),
        Err(e) => Err(Outcome::Failed(Failure::Client(ClientError::Body(e)))),
    }
}

fn reject(e: ApiError) -> Outcome {
    Outcome::Failed(Failure::Rejected(e))
}

/// Only error answers name the path.
fn path(client: &Client, head: &RequestHead) -> String {
    String::from_utf8_lossy(&client.buf[head.path.clone()]).into_owned()
}

enum HeadRead {
    Head(RequestHead),
    Closed,
    Reject(ParseError),
}

/// Phase: head. Waits up to the idle timeout for a first byte, then up to the read timeout
/// for the whole head; a timeout or EOF before a complete head closes without an answer.
async fn read_head(shard: &Shard, client: &mut Client) -> HeadRead {
    let mut deadline: Option<Instant> = None;
    loop {
        if !client.buf.is_empty() {
            match parse_request(&client.buf) {
                Ok(Some(h)) => return HeadRead::Head(h),
                Ok(None) => {}
                Err(e) => return HeadRead::Reject(e),
            }
        }
        // A drain closes idle connections, except a handover to a successor: the client may
        // be sending its next request right now, so it is read and answered (with
        // `connection: close`) instead of finding the connection closed under it.
        // A connection that has sent nothing yet is read all the same: closing it with its
        // first request arriving would reset it.
        if client.buf.is_empty() && shard.is_draining() && !shard.hands_over() && client.unread.is_none() {
            return HeadRead::Closed;
        }
        // Idle keep-alive wait before the first byte; slow-client deadline after it.
        let wait = match deadline {
            None if client.buf.is_empty() => shard.cfg().client_idle_timeout,
            None => {
                let d = crate::clock::now() + shard.cfg().client_read_timeout;
                deadline = Some(d);
                shard.cfg().client_read_timeout
            }
            Some(d) => d.saturating_duration_since(crate::clock::now()),
        };
        let (res, buf) =
            read_more_within(&mut client.stream, std::mem::take(&mut client.buf), READ_BUF / 2, wait).await;
        client.buf = buf;
        match res {
            Timed::Done(Ok(n)) if n > 0 => {
                if deadline.is_none() {
                    deadline = Some(crate::clock::now() + shard.cfg().client_read_timeout);
                }
            }
            _ => return HeadRead::Closed,
        }
    }
}
