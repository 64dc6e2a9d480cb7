//! Phase for `GET /v1/models` with a caller's own provider key (bring your own key), when
//! the fleet has a cloud provider: the control thread asks the providers' `/v1/models` with
//! that key and the first non-empty list is the answer, `owned_by` the provider. A key every
//! provider refuses, and a request with no key or with one of the gateway's own keys (never
//! sent to a provider), get the self-hosted list.

use std::time::Duration;

use super::finish::Outcome;
use crate::api::Local;
use crate::http::head::RequestHead;
use crate::secret::Secret;
use crate::shard::Shard;
use crate::workers::admin::AdminReply;
use crate::workers::control::ControlMsg;

/// Longest wait for the providers' lists (each is asked within the health-check timeout).
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

pub async fn list(shard: &Shard, head: &RequestHead, buf: &[u8]) -> Outcome {
    let Some(key) = callers_key(shard, head, buf) else { return Outcome::Local(Local::Models) };
    let (tx, rx) = flume::bounded(1);
    shard.tell_control(ControlMsg::ProviderModels { key, reply: tx });
    let body = monoio::select! {
        r = rx.recv_async() => r.ok().flatten(),
        _ = crate::io::sleep(ANSWER_WITHIN) => None,
    };
    match body {
        Some(body) => Outcome::Control(AdminReply {
            status: 200,
            content_type: "application/json",
            body,
            location: None,
            api_error: None,
        }),
        None => Outcome::Local(Local::Models),
    }
}

/// The caller's own key: `Authorization: Bearer`, else `x-api-key`, else `x-goog-api-key`;
/// None when absent or one of the gateway's keys.
fn callers_key(shard: &Shard, head: &RequestHead, buf: &[u8]) -> Option<Secret> {
    let auth = &shard.cfg().auth;
    let found = ["authorization", "x-api-key", "x-goog-api-key"].iter().find_map(|name| {
        let v = head.header(buf, name)?;
        let k = if *name == "authorization" { crate::workers::provider::bearer(v) } else { v.trim_ascii() };
        (!k.is_empty()).then_some(k)
    })?;
    if auth.is_gateway_key(found) {
        return None;
    }
    // The key goes into a header line to the provider: nothing that ends or splits one.
    let k = std::str::from_utf8(found).ok().filter(|k| k.bytes().all(|b| b.is_ascii_graphic()))?;
    Some(Secret::new(k.to_string()))
}
