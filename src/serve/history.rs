//! Phase for the history routes (src/api/history.rs): stored responses and the
//! Conversations API, answered from the history store (src/responses/store/). A record is
//! its tenant's: another tenant's id answers 404, as an unknown one does; a record stored
//! without a tenant identity is every caller's.

use sonic_rs::{json, JsonContainerTrait, JsonValueMutTrait, JsonValueTrait, Value};

use super::ctx::RequestCtx;
use super::error::Failure;
use super::finish::Outcome;
use crate::api::history::{ids, HistoryOp};
use crate::api::ApiError;
use crate::http::body::Body;
use crate::http::head::RequestHead;
use crate::responses::store::{Conversation, Item, Op, Reply, Unavailable};
use crate::responses::turn::new_id;
use crate::shard::Shard;
use crate::workers::admin::AdminReply;

/// SMG's bounds: metadata keys per conversation, items per `POST …/items`.
const MAX_METADATA: usize = 16;
const MAX_ITEMS_PER_REQUEST: usize = 20;

/// The item types a conversation accepts (SMG's list).
const ITEM_TYPES: [&str; 19] = [
    "message",
    "reasoning",
    "mcp_list_tools",
    "mcp_call",
    "item_reference",
    "function_call",
    "function_call_output",
    "file_search_call",
    "computer_call",
    "computer_call_output",
    "web_search_call",
    "image_generation_call",
    "code_interpreter_call",
    "local_shell_call",
    "local_shell_call_output",
    "mcp_approval_request",
    "mcp_approval_response",
    "custom_tool_call",
    "custom_tool_call_output",
];

/// The caller's tenant as records keep it (None: no identity).
pub(crate) fn tenant_of(ctx: &RequestCtx) -> Option<String> {
    match &ctx.tenant {
        Some(crate::admission::auth::Tenant::Anonymous) | None => None,
        Some(t) => Some(t.as_str().to_string()),
    }
}

/// Whether the caller may see a record of `owner`.
pub(crate) fn visible(owner: &Option<String>, caller: &Option<String>) -> bool {
    owner.is_none() || owner == caller
}

pub(crate) fn unavailable(e: Unavailable) -> ApiError {
    ApiError::new(503, "storage_unavailable", format!("The history store is unavailable: {}", e.0))
}

pub(crate) fn response_not_found(id: &str) -> ApiError {
    ApiError::new(404, "not_found", format!("No response found with id '{id}'"))
}

fn conversation_not_found() -> ApiError {
    ApiError::new(404, "not_found", "Conversation not found")
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(400, "invalid_request_error", message)
}

fn ok(body: Value) -> Outcome {
    Outcome::Control(AdminReply {
        status: 200,
        content_type: "application/json",
        body: sonic_rs::to_vec(&body).unwrap_or_default(),
        location: None,
        api_error: None,
    })
}

fn failed(e: ApiError) -> Outcome {
    Outcome::Failed(Failure::Rejected(e))
}

/// A query parameter's value (no percent-decoding: ids and numbers need none).
fn query<'a>(target: &'a [u8], name: &str) -> Option<&'a str> {
    let q = target.splitn(2, |b| *b == b'?').nth(1)?;
    q.split(|b| *b == b'&').find_map(|kv| {
        let mut it = kv.splitn(2, |b| *b == b'=');
        (it.next()? == name.as_bytes()).then(|| it.next().and_then(|v| std::str::from_utf8(v).ok()))?
    })
}

fn list(data: Vec<Value>, has_more: bool) -> Value {
    let id = |v: Option<&Value>| v.and_then(|i| i.get("id")).cloned().unwrap_or_default();
    let (first, last) = (id(data.first()), id(data.last()));
    json!({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": has_more})
}

fn parse(s: &str) -> Value {
    sonic_rs::from_str(s).unwrap_or_default()
}

/// Answers a history route.
pub(crate) async fn serve(
    shard: &Shard,
    buf: &[u8],
    head: &RequestHead,
    ctx: &RequestCtx,
    op: HistoryOp,
    body: Option<&Body>,
) -> Outcome {
    let (a, b) = ids(&buf[head.path.clone()]);
    let (a, b) = (a.unwrap_or("").to_string(), b.unwrap_or("").to_string());
    let target = &buf[head.target.clone()];
    let doc = match body.map(|b| b.bytes(buf)).filter(|b| !b.is_empty()) {
        Some(bytes) => match crate::bounded_json::value(bytes) {
            Ok(v) if v.is_object() => v,
            Ok(_) => return failed(bad("the request body must be a JSON object")),
            Err(e) => return failed(bad(format!("request body: {e}"))),
        },
        None => Value::new_object(),
    };
    let tenant = tenant_of(ctx);
    let history = shard.history();
    let answer = async {
        use HistoryOp::*;
        match op {
            GetResponse | DeleteResponse | ListInputItems => {
                let r = match history.ask(Op::GetResponse(a.clone())).await? {
                    Reply::Response(Some(r)) if visible(&r.tenant, &tenant) => r,
                    _ => return Ok(Err(response_not_found(&a))),
                };
                Ok(Ok(match op {
                    GetResponse => parse(&r.body),
                    DeleteResponse => {
                        history.ask(Op::DeleteResponse(a.clone())).await?;
                        json!({"id": a.as_str(), "object": "response.deleted", "deleted": true})
                    }
                    _ => match input_page(&r.input, target) {
                        Ok(v) => v,
                        Err(e) => return Ok(Err(e)),
                    },
                }))
            }
            CreateConversation => {
                let metadata = match metadata_patch(None, &doc, false) {
                    Ok(m) => m,
                    Err(e) => return Ok(Err(e)),
                };
                let c = Conversation {
                    id: new_id("conv"),
                    tenant: tenant.clone(),
                    created_at: crate::responses::store::unix_now(),
                    metadata,
                };
                history.ask(Op::PutConversation(c.clone())).await?;
                // Items sent with the conversation join it.
                if let Some(items) = doc.get("items").and_then(|i| i.as_array()) {
                    let items = match new_items(items.iter()) {
                        Ok(i) => i,
                        Err(e) => return Ok(Err(e)),
                    };
                    history.ask(Op::AppendItems { conversation: c.id.clone(), items }).await?;
                }
                Ok(Ok(conversation_json(&c)))
            }
            _ => {
                let conv = match history.ask(Op::GetConversation(a.clone())).await? {
                    Reply::Conversation(Some(c)) if visible(&c.tenant, &tenant) => c,
                    _ => return Ok(Err(conversation_not_found())),
                };
                conversation_op(history, op, conv, &b, &doc, target).await
            }
        }
    };
    match answer.await {
        Ok(Ok(v)) => ok(v),
        Ok(Err(e)) => failed(e),
        Err(e) => failed(unavailable(e)),
    }
}

async fn conversation_op(
    history: &crate::responses::store::History,
    op: HistoryOp,
    conv: Conversation,
    item: &str,
    doc: &Value,
    target: &[u8],
) -> Result<Result<Value, ApiError>, Unavailable> {
    use HistoryOp::*;
    let id = conv.id.clone();
    Ok(Ok(match op {
        GetConversation => conversation_json(&conv),
        UpdateConversation => {
            let metadata = match metadata_patch(conv.metadata.as_deref(), doc, true) {
                Ok(m) => m,
                Err(e) => return Ok(Err(e)),
            };
            let c = Conversation { metadata, ..conv };
            history.ask(Op::PutConversation(c.clone())).await?;
            conversation_json(&c)
        }
        DeleteConversation => {
            history.ask(Op::DeleteConversation(id.clone())).await?;
            json!({"id": id.as_str(), "object": "conversation.deleted", "deleted": true})
        }
        ListItems => {
            let limit = match query(target, "limit").map(str::parse::<usize>) {
                None => 20,
                Some(Ok(n)) if (1..=100).contains(&n) => n,
                Some(_) => return Ok(Err(bad("'limit' must be an integer from 1 to 100"))),
            };
            let ascending = match query(target, "order") {
                None | Some("desc") => false,
                Some("asc") => true,
                Some(_) => return Ok(Err(bad("'order' must be 'asc' or 'desc'"))),
            };
            let after = query(target, "after").map(str::to_string);
            let op = Op::ListItems { conversation: id, after, limit: limit + 1, ascending };
            let Reply::Items(mut items) = history.ask(op).await? else { return Ok(Ok(list(Vec::new(), false))) };
            let more = items.len() > limit;
            items.truncate(limit);
            list(items.iter().map(|i| parse(&i.json)).collect(), more)
        }
        CreateItems => {
            let Some(items) = doc.get("items").and_then(|i| i.as_array()) else {
                return Ok(Err(bad("Missing or invalid 'items' field")));
            };
            if items.len() > MAX_ITEMS_PER_REQUEST {
                return Ok(Err(bad(format!("Cannot add more than {MAX_ITEMS_PER_REQUEST} items at a time"))));
            }
            let items = match new_items(items.iter()) {
                Ok(i) => i,
                Err(e) => return Ok(Err(e)),
            };
            let data = items.iter().map(|i| parse(&i.json)).collect();
            history.ask(Op::AppendItems { conversation: id, items }).await?;
            list(data, false)
        }
        GetItem | DeleteItem => {
            let found = history.ask(Op::GetItem { conversation: id.clone(), item: item.to_string() }).await?;
            let Reply::Item(Some(found)) = found else {
                return Ok(Err(ApiError::new(
                    404,
                    "not_found",
                    format!("Item '{item}' not found in this conversation"),
                )));
            };
            if op == GetItem {
                parse(&found.json)
            } else {
                history.ask(Op::DeleteItem { conversation: id, item: item.to_string() }).await?;
                conversation_json(&conv)
            }
        }
        _ => unreachable!("response routes are answered above"),
    }))
}

/// A stored response's input items: all of them in order (SMG's answer), or the page that
/// `limit`, `order` and `after` ask for when given (OpenAI's parameters).
fn input_page(input: &[String], target: &[u8]) -> Result<Value, ApiError> {
    let limit = match query(target, "limit").map(str::parse::<usize>) {
        None => usize::MAX,
        Some(Ok(n)) if (1..=100).contains(&n) => n,
        Some(_) => return Err(bad("'limit' must be an integer from 1 to 100")),
    };
    let mut items: Vec<Value> = input.iter().map(|i| parse(i)).collect();
    match query(target, "order") {
        None | Some("asc") => {}
        Some("desc") => items.reverse(),
        Some(_) => return Err(bad("'order' must be 'asc' or 'desc'")),
    }
    if let Some(after) = query(target, "after") {
        let at = items.iter().position(|i| i.get("id").and_then(|v| v.as_str()) == Some(after));
        items.drain(..at.map_or(items.len(), |p| p + 1));
    }
    let more = items.len() > limit;
    items.truncate(limit);
    Ok(list(items, more))
}

/// Items sent to a conversation, in their stored shape with ids.
fn new_items<'a>(items: impl Iterator<Item = &'a Value>) -> Result<Vec<Item>, ApiError> {
    let now = crate::responses::store::unix_now();
    items
        .map(|v| {
            if !v.is_object() {
                return Err(bad("items must be objects"));
            }
            let kind = v.get("type").and_then(|t| t.as_str()).unwrap_or("message");
            if !ITEM_TYPES.contains(&kind) {
                return Err(bad(format!("Unsupported item type '{kind}'. Supported types: {}", ITEM_TYPES.join(", "))));
            }
            if kind == "message" && !v.get("role").is_some_and(|r| r.is_str()) {
                return Err(bad("Message items require 'role' field"));
            }
            let mut item = v.clone();
            let obj = item.as_object_mut().expect("an object");
            obj.insert("type", kind);
            if kind == "message" {
                if let Some(text) = v.get("content").and_then(|c| c.as_str()) {
                    let part = if v.get("role").and_then(|r| r.as_str()) == Some("assistant") {
                        "output_text"
                    } else {
                        "input_text"
                    };
                    obj.insert("content", json!([{"type": part, "text": text}]));
                }
            }
            if !v.get("status").is_some_and(|s| s.is_str()) {
                obj.insert("status", "completed");
            }
            let id = match v.get("id").and_then(|i| i.as_str()) {
                Some(id) => id.to_string(),
                None => {
                    let prefix = match kind {
                        "message" => "msg",
                        "reasoning" => "rs",
                        "function_call" => "fc",
                        "function_call_output" => "fco",
                        "mcp_call" => "mcp",
                        "mcp_list_tools" => "mcpl",
                        _ => "itm",
                    };
                    let id = new_id(prefix);
                    obj.insert("id", id.as_str());
                    id
                }
            };
            Ok(Item { id, json: sonic_rs::to_string(&item).unwrap_or_default(), created_at: now })
        })
        .collect()
}

/// The metadata after `doc`'s: a create takes it whole; an update merges it, `null`
/// deleting a key. At most 16 keys.
fn metadata_patch(current: Option<&str>, doc: &Value, merge: bool) -> Result<Option<String>, ApiError> {
    let patch = match doc.get("metadata") {
        None => return Ok(current.map(str::to_string)),
        Some(v) if v.is_null() && !merge => return Ok(None),
        Some(v) if v.is_object() => v,
        Some(_) => return Err(bad("metadata must be an object")),
    };
    let mut merged: Value = match (merge, current) {
        (true, Some(c)) => parse(c),
        _ => Value::new_object(),
    };
    let m = merged.as_object_mut().ok_or_else(|| bad("metadata must be an object"))?;
    for (k, v) in patch.as_object().expect("an object").iter() {
        if v.is_null() {
            m.remove(&k);
        } else {
            m.insert(k, v.clone());
        }
    }
    if m.len() > MAX_METADATA {
        return Err(bad(format!("metadata cannot have more than {MAX_METADATA} properties")));
    }
    Ok((!m.is_empty()).then(|| sonic_rs::to_string(&merged).unwrap_or_default()))
}

fn conversation_json(c: &Conversation) -> Value {
    let mut o = json!({"id": c.id.as_str(), "object": "conversation", "created_at": c.created_at});
    let metadata = c.metadata.as_deref().map(parse).unwrap_or_else(Value::new_object);
    o.as_object_mut().expect("an object").insert("metadata", metadata);
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_merges_and_null_deletes() {
        let doc: Value = sonic_rs::from_str(r#"{"metadata":{"a":"1","b":null,"c":"3"}}"#).unwrap();
        let m = metadata_patch(Some(r#"{"b":"2","d":"4"}"#), &doc, true).unwrap().unwrap();
        let m: Value = sonic_rs::from_str(&m).unwrap();
        assert_eq!(m["a"].as_str(), Some("1"));
        assert!(m.get("b").is_none());
        assert_eq!(m["d"].as_str(), Some("4"));
        let many: String = (0..17).map(|i| format!("\"k{i}\":\"v\"")).collect::<Vec<_>>().join(",");
        let doc: Value = sonic_rs::from_str(&format!("{{\"metadata\":{{{many}}}}}")).unwrap();
        assert!(metadata_patch(None, &doc, false).is_err());
    }

    #[test]
    fn input_items_page_as_asked_and_whole_by_default() {
        let input: Vec<String> = (1..=3).map(|i| format!(r#"{{"id":"m{i}"}}"#)).collect();
        let ids = |v: &Value| -> Vec<String> {
            v["data"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap().to_string()).collect()
        };
        let all = input_page(&input, b"/x").unwrap();
        assert_eq!(ids(&all), ["m1", "m2", "m3"]);
        assert_eq!(all["has_more"].as_bool(), Some(false));
        let page = input_page(&input, b"/x?order=desc&limit=2").unwrap();
        assert_eq!(ids(&page), ["m3", "m2"]);
        assert_eq!(page["has_more"].as_bool(), Some(true));
        assert_eq!(ids(&input_page(&input, b"/x?after=m1").unwrap()), ["m2", "m3"]);
        assert_eq!(ids(&input_page(&input, b"/x?after=nope").unwrap()), Vec::<String>::new());
        assert!(input_page(&input, b"/x?limit=0").is_err());
    }

    #[test]
    fn query_parameters() {
        assert_eq!(query(b"/x?limit=5&order=asc", "order"), Some("asc"));
        assert_eq!(query(b"/x?limit=5", "after"), None);
        assert_eq!(query(b"/x", "limit"), None);
    }
}
