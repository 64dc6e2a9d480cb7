//! `GET /v1/realtime`: a WebSocket session, admitted like a request and holding its
//! permit (or scheduler slot), its worker load and its in-flight count until it ends.
//!
//! In order, as SMG answers: no `model` in the query → 400 (plain text); no realtime
//! worker for it → 404/503 (see [`pick::pick_realtime`]); no credentials to forward →
//! 401; a malformed upgrade → 400 (plain text). Then the worker's handshake comes first: the
//! client gets its `101` only once the worker sent a `101` with the right accept, so a
//! worker that refuses is answered with the worker's own response, as any worker error
//! is. Then the frames are relayed ([`crate::realtime::relay`]) and the connection closes
//! when the session does.
//!
//! A session holds two descriptors, the client's and the worker's, so it holds two units of
//! `--max-connections`: the worker's is taken before connecting, and a shard whose sessions
//! reached their share of the cap answers `503 connection_limit` instead, so sessions
//! cannot run the process out of descriptors nor lock other clients out.

use std::rc::Rc;
use std::time::Duration;

use super::client::Client;
use super::ctx::{Picked, RequestCtx};
use super::error::{Failure, InternalError, WorkerCause, WorkerError};
use super::finish::Outcome;
use super::pick;
use super::upstream::{relay_response, Answered};
use crate::api::error::ApiError;
use crate::http::head::RequestHead;
use crate::http::pool::{self, UpstreamConn, UPSTREAM_BUF};
use crate::http::response_head::{parse_response, ResponseHead};
use crate::io::{self, is_resource_exhaustion, read_more, shutdown_write, write_all};
use crate::realtime::handshake::{self, ClientUpgrade, WorkerRequest};
use crate::realtime::query;
use crate::realtime::relay::{self, Direction, End, Sides};
use crate::shard::Shard;
use crate::workers::breaker::Verdict;

/// Runs one session from its checks to its end.
pub async fn session(shard: &Rc<Shard>, client: &mut Client, head: &RequestHead, ctx: &mut RequestCtx) -> Outcome {
    // Whatever happens, this connection carries nothing after the session.
    ctx.close = true;
    let model = match query::param(&client.buf[head.target.clone()], b"model") {
        Some(m) if !m.trim().is_empty() => m,
        _ => return Outcome::Failed(Failure::Form("Missing required 'model' query parameter".into())),
    };
    let aliases = &shard.cfg().aliases;
    let canonical = (!aliases.is_empty()).then(|| aliases.resolve(&model)).flatten().map(str::to_owned);
    ctx.model = Some(canonical.unwrap_or(model));
    let picked = match pick::pick_realtime(shard, head, &client.buf, ctx, &[]) {
        Ok(p) => p,
        Err(f) => return Outcome::Failed(f),
    };
    let (worker_id, worker_url) = (picked.worker().id, picked.worker().url.url.clone());
    let upgrade = match handshake::client_upgrade(head, &client.buf) {
        Ok(u) => u,
        Err(why) => return Outcome::Failed(Failure::Form(why.into())),
    };
    // Held until the session ends: the worker socket's unit of the connection cap.
    let Some(_worker_slot) = shard.open_session_unit() else {
        return Outcome::Failed(Failure::Rejected(ApiError::new(
            503,
            "connection_limit",
            "The gateway is at --max-connections; retry later",
        )));
    };
    let (mut conn, rhead) = match open(shard, client, head, ctx, &picked, &upgrade).await {
        Ok(Opened::Upgraded(c, h)) => (c, h),
        Ok(Opened::Refused(answered)) => {
            // The worker's own answer (a 4xx, a 5xx) goes to the client as it is.
            return match relay_response(shard, client, head, ctx, &picked, answered, Vec::new(), true).await {
                Ok(o) => o,
                Err((e, _)) => {
                    ctx.judge(worker_id, Verdict::Failure);
                    Outcome::Failed(Failure::Worker(e))
                }
            };
        }
        Err(f) => {
            if let Failure::Worker(_) = f {
                ctx.judge(worker_id, Verdict::Failure);
            }
            return Outcome::Failed(f);
        }
    };
    ctx.judge(worker_id, Verdict::Success);
    // Answered: no longer preemptible, as a response that started.
    if let Some(slot) = &ctx.slot {
        slot.held().start();
    }
    let mut out = Vec::with_capacity(256);
    let protocol = rhead.protocol.clone().map(|r| &conn.buf[r]);
    handshake::client_101(&mut out, &client.buf[upgrade.key.clone()], protocol, &ctx.request_id, &worker_url);
    let (res, _) = write_all(&mut client.stream, out).await;
    if res.is_err() {
        return Outcome::ClientGone;
    }
    ctx.status = 101;
    ctx.timings.first_byte = Some(crate::clock::now());
    crate::debug!("request {}: realtime session with {worker_url}", ctx.id_str());

    // Bytes each side sent after its handshake start its direction.
    let max = shard.cfg().max_payload_size as u64;
    let mut up = Direction::new(max, &client.buf[head.len.min(client.buf.len())..]);
    let mut down = Direction::new(max, &conn.buf[rhead.len..]);
    client.next = client.buf.len();
    let ended = {
        let (client_read, client_write) = io::split(&mut client.stream);
        // A realtime session's connection is a plain one (`open`: an `https://` worker's goes
        // through the egress thread's loopback port).
        let crate::io::Upstream::Plain(worker_stream) = &mut conn.stream else {
            return Outcome::Failed(worker_error(WorkerCause::Connect(std::io::Error::other(
                "not a plain connection",
            ))));
        };
        let (worker_read, worker_write) = io::split(worker_stream);
        let sides = Sides { client_read, client_write, worker_read, worker_write };
        // The worker must not be able to predict it (RFC 6455 §5.3): not the request ids' generator.
        relay::run(sides, &mut up, &mut down, shard.drained(), shard.cfg().websocket_idle_timeout).await
    };
    shutdown_write(&mut conn.stream).await;
    ctx.bytes_in = up.bytes;
    ctx.bytes_out = down.bytes;
    if ended.sent_close.is_some() {
        // The offender may still be sending the rest of its message.
        client.linger = true;
    }
    if matches!(ended.worker, End::Gone) && !matches!(ended.client, End::Closed) {
        crate::debug!("request {}: worker {worker_url} ended the session without a close", ctx.id_str());
    }
    crate::debug!("request {}: realtime session ended: {ended:?}", ctx.id_str());
    Outcome::Upgraded
}

/// A worker's answer to our upgrade request.
enum Opened {
    /// A valid `101`; its head and the subprotocol it chose.
    Upgraded(UpstreamConn, Upgraded),
    /// A final response instead.
    Refused(Answered),
}

struct Upgraded {
    len: usize,
    protocol: Option<std::ops::Range<usize>>,
}

/// Connects to the chosen worker, sends our upgrade request and reads its answer.
async fn open(
    shard: &Shard,
    client: &Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    picked: &Picked,
    upgrade: &ClientUpgrade,
) -> Result<Opened, Failure> {
    ctx.attempts += 1;
    let worker = picked.worker();
    // A fresh connection: the upgraded one never goes back to the pool.
    let mut conn = match pool::connect(worker.url.addr).await {
        Ok(c) => c,
        Err(e) if is_resource_exhaustion(&e) => return Err(Failure::Internal(InternalError::NoDescriptors(e))),
        Err(e) => {
            shard.report_connect_failed(worker.id);
            return Err(worker_error(WorkerCause::Connect(e)));
        }
    };
    let key = handshake::fresh_key(crate::random::bytes());
    let bearer;
    let authorization = match head.header(&client.buf, "authorization") {
        Some(v) => v,
        None => {
            bearer = format!("Bearer {}", worker.meta.api_key.as_ref().map_or("", crate::secret::Secret::expose));
            bearer.as_bytes()
        }
    };
    let mut out = Vec::with_capacity(512);
    let req = WorkerRequest {
        model: ctx.model.as_deref().unwrap_or(""),
        authority: &worker.url.authority,
        authorization,
        key: &key,
    };
    handshake::worker_request(&mut out, &req, head, &client.buf, upgrade);
    let (res, _) = write_all(&mut conn.stream, out).await;
    if let Err(e) = res {
        return Err(worker_error(WorkerCause::Write(e)));
    }
    let rhead = read_answer(&mut conn, shard.cfg().request_timeout).await.map_err(worker_error)?;
    ctx.status = rhead.status;
    if rhead.status != 101 {
        return Ok(Opened::Refused(Answered { conn, head: rhead }));
    }
    match handshake::worker_accepts(&conn.buf[..rhead.len], &key) {
        Ok(protocol) => Ok(Opened::Upgraded(conn, Upgraded { len: rhead.len, protocol })),
        Err(why) => Err(worker_error(WorkerCause::BadHead(why))),
    }
}

fn worker_error(cause: WorkerCause) -> Failure {
    Failure::Worker(WorkerError::new(cause, false))
}

/// Reads the worker's answer head: a `101`, or a final response (`100`s are skipped).
async fn read_answer(conn: &mut UpstreamConn, limit: Duration) -> Result<ResponseHead, WorkerCause> {
    let read = async {
        loop {
            if !conn.buf.is_empty() {
                match parse_response(&conn.buf) {
                    Ok(Some(h)) if h.status < 200 && h.status != 101 => {
                        conn.buf.drain(..h.len);
                        continue;
                    }
                    Ok(Some(h)) => return Ok(h),
                    Ok(None) => {}
                    Err(e) => return Err(WorkerCause::BadHead(e.0)),
                }
            }
            let (res, buf) = read_more(&mut conn.stream, std::mem::take(&mut conn.buf), UPSTREAM_BUF / 2).await;
            conn.buf = buf;
            match res {
                Ok(n) if n > 0 => {}
                Ok(_) => return Err(WorkerCause::ClosedBeforeHead(std::io::ErrorKind::UnexpectedEof.into())),
                Err(e) => return Err(WorkerCause::ClosedBeforeHead(e)),
            }
        }
    };
    match crate::clock::timeout(limit, read).await {
        Ok(r) => r,
        Err(_) => Err(WorkerCause::HeadTimeout),
    }
}
