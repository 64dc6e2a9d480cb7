//! Phase for the routes the worker control thread answers (the `/workers` admin API,
//! fan-outs, worker info): the body is read here, the request handed over as a message,
//! and the answer awaited; the shard serves everything else meanwhile.

use std::time::Duration;

use super::client::Client;
use super::ctx::RequestCtx;
use super::error::{ClientError, Failure};
use super::finish::Outcome;
use crate::api::ApiError;
use crate::http::body::{read_body, BodyError, BodyLimits};
use crate::http::head::{Method, RequestHead};
use crate::shard::Shard;
use crate::workers::admin::{AdminMethod, AdminRequest};

/// Admin bodies are worker specs: small.
const MAX_ADMIN_BODY: usize = 1 << 20;
/// Longest wait for the control thread (a fan-out waits for its slowest worker's timeout).
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

pub async fn ask(shard: &Shard, client: &mut Client, head: &RequestHead, ctx: &mut RequestCtx) -> Outcome {
    let limits =
        BodyLimits { max: MAX_ADMIN_BODY.min(shard.cfg().max_payload_size), within: shard.cfg().client_read_timeout };
    let (res, buf) = read_body(&mut client.stream, head, std::mem::take(&mut client.buf), limits).await;
    client.buf = buf;
    let body = match res {
        Ok((body, next)) => {
            ctx.body_unread = false;
            client.next = next;
            body.bytes(&client.buf).to_vec()
        }
        Err(BodyError::Gone) => return Outcome::ClientGone,
        Err(e) => return Outcome::Failed(Failure::Client(ClientError::Body(e))),
    };
    let target = String::from_utf8_lossy(&client.buf[head.target.clone()]).into_owned();
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (target, String::new()),
    };
    let method = match head.method {
        Method::Get | Method::Head => AdminMethod::Get,
        Method::Post => AdminMethod::Post,
        Method::Put => AdminMethod::Put,
        Method::Patch => AdminMethod::Patch,
        Method::Delete => AdminMethod::Delete,
        _ => AdminMethod::Other,
    };
    let answer = shard.ask_control(AdminRequest { method, path, query, body });
    monoio::select! {
        r = answer.recv_async() => match r {
            Ok(reply) => Outcome::Control(reply),
            Err(_) => Outcome::Failed(Failure::Rejected(ApiError::internal("internal_error", "worker control thread is gone"))),
        },
        _ = crate::io::sleep(ANSWER_WITHIN) => {
            Outcome::Failed(Failure::Rejected(ApiError::internal("internal_error", "worker control thread did not answer")))
        }
    }
}
