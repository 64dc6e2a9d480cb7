//! Decisions on an SGLang worker, the serving side: the System One body is prepared when
//! pick chooses an SGLang worker (its refusals answered before dispatch), and a 2xx reply is
//! read whole (up to `--max-payload-size`) and answered with the mapped Decisions body. A
//! non-2xx reply is relayed as the worker sent it; every other worker never comes here.

use super::ctx::{Picked, RequestCtx};
use super::error::{Failure, WorkerError};
use super::finish::Outcome;
use super::whole::read_whole;
use crate::api::decisions::{self, Plan};
use crate::api::ApiError;
use crate::contract;
use crate::http::body::Body;
use crate::http::pool::UpstreamConn;
use crate::http::response_head::ResponseHead;
use crate::shard::Shard;
use crate::workers::admin::AdminReply;
use crate::workers::breaker::Verdict;

/// The translated request: its body (sent instead of the client's) and how to map the reply.
pub struct Translated {
    pub body: Body,
    pub plan: Plan,
}

/// Translates the (already validated) forwarded body for an SGLang worker.
pub fn translate(body: &[u8], model: &str) -> Result<Translated, Failure> {
    let bad = |m: String| Failure::Rejected(ApiError::unsupported_decisions_request(m));
    let doc = contract::json::parse(body).map_err(|e| bad(e.describe(body)))?;
    let d = contract::decisions::read(doc).map_err(|e| bad(e.message().to_owned()))?;
    let (out, plan) = decisions::translate(&d, model).map_err(|u| bad(u.0))?;
    Ok(Translated { body: Body::Owned(out), plan })
}

/// Replaces the request target of a written upstream head with `/v1/systemone`.
pub fn retarget(up_head: &mut Vec<u8>, target_len: usize) {
    up_head.splice(5..5 + target_len, decisions::SYSTEMONE_PATH.iter().copied());
}

/// A 2xx System One reply: read whole, mapped, answered by the gateway (502 when it does not
/// map). The connection goes back to the pool when the body ended cleanly.
pub async fn answer(
    shard: &Shard,
    ctx: &mut RequestCtx,
    picked: &Picked,
    mut conn: UpstreamConn,
    head: ResponseHead,
    plan: &Plan,
) -> Outcome {
    let id = picked.worker().id;
    let (max, idle) = (shard.cfg().max_payload_size, shard.cfg().upstream_read_timeout);
    let (body, reusable) = match read_whole(&mut conn, &head, max, idle).await {
        Ok(read) => read,
        Err(cause) => {
            ctx.judge(id, Verdict::Failure);
            return Outcome::Failed(Failure::Worker(WorkerError::new(cause, conn.reused)));
        }
    };
    ctx.judge(id, Verdict::of_status(head.status));
    if reusable {
        conn.buf.clear();
        shard.put_conn(id, conn);
    }
    match decisions::map_reply(&body, plan) {
        Some((out, tokens)) => {
            // A tenant budget is trued up to what the worker counted (no output tokens).
            ctx.used_tokens = Some(tokens);
            Outcome::Control(AdminReply {
                status: 200,
                content_type: "application/json",
                body: out,
                location: None,
                api_error: None,
            })
        }
        None => Outcome::Failed(Failure::Rejected(ApiError::invalid_decisions_response())),
    }
}
