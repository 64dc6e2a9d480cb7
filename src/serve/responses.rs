//! Phase for `POST /v1/responses` when the model's workers speak gRPC (they keep no state):
//! the gateway serves the Responses API itself. The turn is read (src/responses/turn.rs),
//! its history loaded from the store (the chain of `previous_response_id`, or the
//! conversation's items), and it runs as a chat through the one upstream loop, the relay
//! reshaping the answer into the response and storing it (src/serve/grpc/mod.rs).

use std::rc::Rc;
use std::time::Duration;

use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};

use super::client::Client;
use super::ctx::RequestCtx;
use super::error::Failure;
use super::finish::Outcome;
use super::forward::{self, Made};
use super::grpc::GrpcRequest;
use super::history::{tenant_of, unavailable, visible};
use crate::api::{ApiError, EndpointSpec, RESPONSES_TURN};
use crate::http::body::Body;
use crate::http::head::RequestHead;
use crate::responses::answer::{listing_item, mcp_call_item_approved, Shell};
use crate::responses::mcp::{Called, McpUrl, Server};
use crate::responses::ordered;
use crate::responses::plan::{McpPlan, TurnPlan};
use crate::responses::provider_turn::ProviderTurn;
use crate::responses::store::{unix_now, Op, Reply};
use crate::responses::turn::{chain_items, new_id, parsed, Turn};
use crate::shard::Shard;
use crate::workers::provider::Provider;

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
    let tenant = tenant_of(ctx);
    let prior: Vec<Value> = match history_of(shard, &turn, &tenant).await {
        Ok(items) => parsed(&items),
        Err(e) => return reject(e),
    };
    let context = context_of(shard, client, head);
    let model = ctx.model.clone().unwrap_or_else(|| turn.model.clone());
    let mut mcp = match mcp_plan(shard, &turn).await {
        Ok(m) => m,
        Err(e) => return reject(e),
    };
    if let Some(plan) = mcp.as_mut() {
        if let Err(e) = answer_approvals(shard, ctx, plan, &turn, &prior).await {
            return reject(e);
        }
    }
    let (extra, answered): (&[Value], &[Value]) = mcp.as_ref().map_or((&[], &[]), |m| (&m.chat_tools, &m.answered));
    let chat = turn.chat_after(prior.iter().chain(turn.input.iter()).chain(answered.iter()), extra, turn.stream);
    ctx.streaming = turn.stream;
    let plan = TurnPlan {
        shell: Shell::new(&turn, new_id("resp"), unix_now(), &model),
        previous: turn.previous.clone(),
        conversation: turn.conversation.clone(),
        store: turn.store,
        tenant,
        context,
        mcp,
        prior,
        turn,
    };
    forward::forward(
        shard,
        client,
        head,
        ctx,
        &RESPONSES_TURN,
        body,
        Made::Grpc(Box::new(GrpcRequest::turn(chat, plan))),
    )
    .await
}

/// The stored history a turn follows, oldest first, as JSON text: the chain of its
/// `previous_response_id` (each turn's input, then output), or its conversation's items.
async fn history_of(shard: &Shard, turn: &Turn, tenant: &Option<String>) -> Result<Vec<String>, ApiError> {
    let history = shard.history();
    if let Some(prev) = &turn.previous {
        return match history.ask(Op::Chain(prev.clone())).await {
            Ok(Reply::Chain(Some(chain))) if chain.last().is_some_and(|r| visible(&r.tenant, tenant)) => {
                Ok(chain_items(chain))
            }
            Ok(_) => {
                let msg = format!("Previous response with id '{prev}' not found.");
                Err(ApiError::new(400, "previous_response_not_found", msg))
            }
            Err(e) => Err(unavailable(e)),
        };
    }
    let Some(conv) = &turn.conversation else { return Ok(Vec::new()) };
    match history.ask(Op::GetConversation(conv.clone())).await {
        Ok(Reply::Conversation(Some(c))) if visible(&c.tenant, tenant) => {}
        Ok(_) => return Err(ApiError::new(404, "not_found", format!("Conversation '{conv}' not found"))),
        Err(e) => return Err(unavailable(e)),
    }
    let op = Op::ListItems { conversation: conv.clone(), after: None, limit: MAX_CONVERSATION_ITEMS, ascending: true };
    match history.ask(op).await {
        Ok(Reply::Items(items)) => Ok(items.into_iter().map(|i| i.json).collect()),
        Ok(_) => Ok(Vec::new()),
        Err(e) => Err(unavailable(e)),
    }
}

/// `--storage-context-headers`: (context key, the request header's value) of those sent.
fn context_of(shard: &Shard, client: &Client, head: &RequestHead) -> Vec<(String, String)> {
    shard
        .cfg()
        .history
        .context_headers
        .iter()
        .filter_map(|(h, key)| {
            let v = head.header(&client.buf, h)?;
            Some((key.clone(), String::from_utf8_lossy(v).into_owned()))
        })
        .collect()
}

/// The gateway keeps the turn's history for a cloud provider whose Responses API it is
/// sent to (OpenAI's, xAI's): one serves the model (src/responses/provider_turn.rs).
pub(super) fn kept_here(shard: &Shard, ctx: &RequestCtx) -> bool {
    let snap = shard.snapshot();
    let serves = |w: &crate::workers::snapshot::Worker| match ctx.model.as_deref() {
        None => true,
        Some(m) => w.model.as_deref() == Some(m) || w.meta.more_models.iter().any(|x| x == m),
    };
    snap.providers
        && snap.workers.iter().any(|w| matches!(w.meta.provider, Some(Provider::OpenAi | Provider::Xai)) && serves(w))
}

/// Phase for `POST /v1/responses` on a provider that keeps no state for the gateway: the
/// history loaded as for a gRPC turn, the provider sent it whole (`store: false`), and its
/// answer kept as it is relayed (src/serve/provider_turn.rs).
pub(super) async fn for_provider(
    shard: &Rc<Shard>,
    client: &mut Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    spec: &EndpointSpec,
    body: &Body,
) -> Outcome {
    let mut turn = match Turn::read_for_provider(body.bytes(&client.buf)) {
        Ok(t) => t,
        Err(e) => return reject(e),
    };
    turn.store &= shard.history().stores;
    let tenant = tenant_of(ctx);
    let prior = match history_of(shard, &turn, &tenant).await {
        Ok(items) => items,
        Err(e) => return reject(e),
    };
    let context = context_of(shard, client, head);
    let kept = ProviderTurn::new(&turn, prior, tenant, context);
    ctx.streaming = turn.stream;
    let mut sent = Body::Owned(kept.body(body.bytes(&client.buf)));
    forward::forward(shard, client, head, ctx, spec, &mut sent, Made::Kept(&kept)).await
}

/// Calls the MCP loop runs in a turn when the request does not say (`max_tool_calls`).
const DEFAULT_MAX_CALLS: usize = 10;

/// How long listing one server's tools may take.
const LIST_WITHIN: Duration = Duration::from_secs(30);

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(400, "invalid_request_error", message)
}

/// The turn's MCP servers, each one's tools listed (and narrowed by `allowed_tools`).
async fn mcp_plan(shard: &Shard, turn: &Turn) -> Result<Option<McpPlan>, ApiError> {
    if turn.mcp.is_empty() {
        return Ok(None);
    }
    let mut plan = McpPlan {
        servers: Vec::new(),
        approval: Vec::new(),
        answered: Vec::new(),
        tools: Vec::new(),
        listings: Vec::new(),
        chat_tools: Vec::new(),
        max_calls: turn.max_tool_calls.map_or(DEFAULT_MAX_CALLS, |n| n as usize),
    };
    for spec in &turn.mcp {
        let (server, asks) = mcp_server(shard, spec)?;
        let listed = shard.mcp().list(server.clone(), LIST_WITHIN).await.map_err(|e| {
            let msg = format!("Error retrieving tool list from MCP server '{}': {e}", server.label);
            ApiError::new(424, "mcp_list_tools_failed", msg)
        })?;
        let allowed = allowed_tools(spec)?;
        let tools: Vec<_> =
            listed.tools.into_iter().filter(|t| allowed.as_ref().is_none_or(|a| a.contains(&t.name))).collect();
        let index = plan.servers.len();
        for t in &tools {
            // A name two servers offer goes to the first.
            if plan.tools.iter().any(|(n, _)| *n == t.name) {
                continue;
            }
            plan.tools.push((t.name.clone(), index));
            let description = t.description.as_deref().map(Value::from);
            let mut f: Vec<(&str, &Value)> = vec![];
            let name = Value::from(t.name.as_str());
            f.push(("name", &name));
            if let Some(d) = &description {
                f.push(("description", d));
            }
            f.push(("parameters", &t.input_schema));
            let function = ordered(&f);
            plan.chat_tools.push(ordered(&[("type", &Value::from("function")), ("function", &function)]));
        }
        plan.listings.push(listing_item(&new_id("mcpl"), &server.label, &tools));
        plan.servers.push((server, listed.session));
        plan.approval.push(asks);
    }
    Ok(Some(plan))
}

/// The server an `mcp` tool names: its `server_url`, else `--mcp-config-path`'s server of
/// its label; its `authorization` and `headers` go with every message.
fn mcp_server(shard: &Shard, spec: &Value) -> Result<(Server, bool), ApiError> {
    let label =
        spec.get("server_label").and_then(|l| l.as_str()).ok_or_else(|| bad("an mcp tool needs a 'server_label'"))?;
    // SMG's rule: "always" asks the client before each call; any other value runs them.
    let asks = spec.get("require_approval").and_then(|v| v.as_str()) == Some("always");
    let mut server = match spec.get("server_url").and_then(|u| u.as_str()) {
        Some(url) => {
            let url = McpUrl::parse(url).map_err(bad)?;
            Server { label: label.to_string(), url, headers: Vec::new() }
        }
        None => shard.cfg().mcp.as_ref().and_then(|c| c.server(label)).ok_or_else(|| {
            bad(format!("MCP server '{label}': no 'server_url', and --mcp-config-path names no such server"))
        })?,
    };
    if let Some(headers) = spec.get("headers").filter(|h| !h.is_null()) {
        let headers = headers.as_object().ok_or_else(|| bad("an mcp tool's 'headers' must be an object"))?;
        for (k, v) in headers.iter() {
            let v = v.as_str().ok_or_else(|| bad("an mcp tool's header values must be strings"))?;
            if !header_safe(k) || !header_safe(v) {
                return Err(bad(format!("an mcp tool's header '{k}' cannot be sent")));
            }
            server.headers.push((k.to_string(), v.to_string()));
        }
    }
    if let Some(a) = spec.get("authorization").and_then(|a| a.as_str()) {
        if !header_safe(a) {
            return Err(bad("an mcp tool's 'authorization' cannot be sent"));
        }
        server.headers.retain(|(k, _)| !k.eq_ignore_ascii_case("authorization"));
        let value = if a.starts_with("Bearer ") { a.to_string() } else { format!("Bearer {a}") };
        server.headers.push(("Authorization".to_string(), value));
    }
    Ok((server, asks))
}

/// The client's answers to approval requests of an earlier turn (`mcp_approval_response`
/// items in the input): each approved call is run, each refused one is not, and both become
/// `mcp_call` items the model reads before it answers. An answer to a request the history
/// does not hold is refused.
async fn answer_approvals(
    shard: &Shard,
    ctx: &RequestCtx,
    plan: &mut McpPlan,
    turn: &Turn,
    prior: &[Value],
) -> Result<(), ApiError> {
    let s = |v: &Value, k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
    for answer in turn.input.iter().filter(|i| i.get("type").and_then(|t| t.as_str()) == Some("mcp_approval_response"))
    {
        let asked = s(answer, "approval_request_id");
        let request = prior
            .iter()
            .find(|i| i.get("type").and_then(|t| t.as_str()) == Some("mcp_approval_request") && s(i, "id") == asked)
            .ok_or_else(|| bad(format!("No MCP approval request with id '{asked}' in this conversation")))?;
        let (label, name, arguments) = (s(request, "server_label"), s(request, "name"), s(request, "arguments"));
        let approved = answer.get("approve").and_then(|a| a.as_bool()) == Some(true);
        let result = match plan.server_of(&name) {
            _ if !approved => Err("the call was not approved".to_string()),
            None => Err(format!("no MCP server of this turn offers '{name}'")),
            Some((server, session)) => {
                let args: Value = sonic_rs::from_str(&arguments).unwrap_or_else(|_| Value::new_object());
                let started = ctx.timings.started;
                let within = (started + shard.cfg().request_timeout).saturating_duration_since(crate::clock::now());
                match shard.mcp().call(server.clone(), session.clone(), name.clone(), args, within).await {
                    Called::Output(o) => Ok(o),
                    Called::Failed(e) => Err(e),
                }
            }
        };
        let item = mcp_call_item_approved(&new_id("mcp"), &label, &name, &arguments, Some(&result), Some(&asked));
        plan.answered.push(item);
    }
    Ok(())
}

/// Nothing that ends or splits a header line.
fn header_safe(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic() || b >= 0x80)
        && !s.contains(['\r', '\n'])
}

/// `allowed_tools`: a list of names, or `{"tool_names": [...]}`; None: every tool.
fn allowed_tools(spec: &Value) -> Result<Option<Vec<String>>, ApiError> {
    let Some(a) = spec.get("allowed_tools").filter(|a| !a.is_null()) else { return Ok(None) };
    let list = a.as_array().or_else(|| a.get("tool_names").and_then(|t| t.as_array()));
    let list = list.ok_or_else(|| bad("'allowed_tools' must be a list of tool names"))?;
    Ok(Some(list.iter().filter_map(|n| n.as_str().map(str::to_string)).collect()))
}
