//! Phase for `POST /v1/responses` when the model's workers speak gRPC (they keep no state):
//! the gateway serves the Responses API itself. The turn is read (src/responses/turn.rs),
//! its history loaded from the store (the chain of `previous_response_id`, or the
//! conversation's items), and it runs as a chat through the one upstream loop, the relay
//! reshaping the answer into the response and storing it (src/serve/grpc/mod.rs).

use std::rc::Rc;

use super::client::Client;
use super::ctx::RequestCtx;
use super::error::Failure;
use super::finish::Outcome;
use super::forward;
use super::grpc::GrpcRequest;
use super::history::{chain_items, tenant_of, unavailable, visible};
use crate::api::{ApiError, RESPONSES_TURN};
use crate::http::body::Body;
use crate::http::head::RequestHead;
use crate::responses::answer::Shell;
use crate::responses::plan::TurnPlan;
use crate::responses::store::{unix_now, Op, Reply};
use crate::responses::turn::{new_id, Turn};
use crate::shard::Shard;

/// Most conversation items a turn replays.
const MAX_CONVERSATION_ITEMS: usize = 10_000;

/// The gateway serves the turn: a gRPC worker serves the model.
pub(super) fn served_here(shard: &Shard, ctx: &RequestCtx) -> bool {
    let snap = shard.snapshot();
    snap.any_grpc && snap.workers.iter().any(|w| w.url.grpc && (ctx.model.is_none() || w.model == ctx.model))
}

fn reject(e: ApiError) -> Outcome {
    Outcome::Failed(Failure::Rejected(e))
}

pub(super) async fn turn(
    shard: &Rc<Shard>,
    client: &mut Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    body: &mut Body,
) -> Outcome {
    let mut turn = match Turn::read(body.bytes(&client.buf)) {
        Ok(t) => t,
        Err(e) => return reject(e),
    };
    let history = shard.history();
    // A response says it is stored only when it will be.
    turn.store &= history.stores;
    if !turn.mcp.is_empty() {
        return reject(ApiError::new(501, "not_implemented", "MCP tools are not served on gRPC workers yet"));
    }
    let tenant = tenant_of(ctx);
    let mut prior = Vec::new();
    if let Some(prev) = &turn.previous {
        match history.ask(Op::Chain(prev.clone())).await {
            Ok(Reply::Chain(Some(chain))) if chain.last().is_some_and(|r| visible(&r.tenant, &tenant)) => {
                prior = chain_items(&chain);
            }
            Ok(_) => {
                let msg = format!("Previous response with id '{prev}' not found.");
                return reject(ApiError::new(400, "previous_response_not_found", msg));
            }
            Err(e) => return reject(unavailable(e)),
        }
    }
    if let Some(conv) = &turn.conversation {
        match history.ask(Op::GetConversation(conv.clone())).await {
            Ok(Reply::Conversation(Some(c))) if visible(&c.tenant, &tenant) => {}
            Ok(_) => return reject(ApiError::new(404, "not_found", format!("Conversation '{conv}' not found"))),
            Err(e) => return reject(unavailable(e)),
        }
        let op =
            Op::ListItems { conversation: conv.clone(), after: None, limit: MAX_CONVERSATION_ITEMS, ascending: true };
        match history.ask(op).await {
            Ok(Reply::Items(items)) => {
                prior = items.iter().map(|i| sonic_rs::from_str(&i.json).unwrap_or_default()).collect();
            }
            Ok(_) => {}
            Err(e) => return reject(unavailable(e)),
        }
    }
    let context = shard
        .cfg()
        .history
        .context_headers
        .iter()
        .filter_map(|(h, key)| {
            let v = head.header(&client.buf, h)?;
            Some((key.clone(), String::from_utf8_lossy(v).into_owned()))
        })
        .collect();
    let model = ctx.model.clone().unwrap_or_else(|| turn.model.clone());
    let plan = TurnPlan {
        shell: Shell::new(&turn, new_id("resp"), unix_now(), &model),
        input: turn.input.clone(),
        previous: turn.previous.clone(),
        conversation: turn.conversation.clone(),
        store: turn.store,
        tenant,
        context,
    };
    let chat = turn.chat(&prior, &[], turn.stream);
    ctx.streaming = turn.stream;
    forward::forward(shard, client, head, ctx, &RESPONSES_TURN, body, Some(GrpcRequest::turn(chat, plan))).await
}
