//! Engine calls: the worker a request's Generate calls go to, starting them, and aborting
//! them. Shared by the one-worker attempt (mod.rs) and a prefill/decode pair's (pair.rs).

use bytes::Bytes;
use h2::client::SendRequest;
use smg_proto::paths::sglang_scheduler as path;
use smg_proto::scheduler::{
    AbortRequest, AbortResponse, DisaggregatedParams, GenerateRequest, GenerateResponse, TokenizedInput,
};

use crate::grpc::conn::{self, Call, Limits};
use crate::grpc::request::Prepared;
use crate::grpc::wire::{self, Code, Status};
use crate::io::peer_closed;
use crate::serve::client::Client;
use crate::workers::WorkerId;

/// The worker a call went to.
pub(super) struct Target {
    pub(super) id: WorkerId,
    /// `--dp-aware`: the data-parallel rank this worker entry stands for.
    pub(super) dp_rank: Option<u32>,
    pub(super) url: String,
    pub(super) authority: String,
    pub(super) send: SendRequest<Bytes>,
}

/// Engine calls that have produced their first message.
pub(super) struct Started {
    pub(super) calls: Vec<(String, Call, Option<GenerateResponse>)>,
}

pub(super) fn engine_request(
    prep: &Prepared,
    rid: String,
    ids: &[u32],
    dp_rank: Option<u32>,
    disaggregated: Option<DisaggregatedParams>,
) -> GenerateRequest {
    GenerateRequest {
        disaggregated_params: disaggregated,
        data_parallel_rank: dp_rank.and_then(|r| i32::try_from(r).ok()),
        request_id: rid,
        tokenized: Some(TokenizedInput { original_text: String::new(), input_ids: ids.to_vec() }),
        sampling_params: Some(prep.params.clone()),
        logprob_start_len: prep.logprob_start,
        stream: prep.stream,
        require_reasoning: prep.reasoning,
        return_logprob: prep.logprobs.is_some(),
        top_logprobs_num: prep.logprobs.map_or(0, |k| k.min(i32::MAX as u32) as i32),
        ..Default::default()
    }
}

/// Sends every engine request and waits for each one's first message, watching the client.
/// Ok(None): the client left (its requests were aborted).
pub(super) async fn start(
    target: &mut Target,
    client: &Client,
    prep: &Prepared,
    id: &str,
    limits: Limits,
    pair: Option<&[DisaggregatedParams]>,
) -> Result<Option<Started>, Status> {
    let many = prep.prompts.len() > 1;
    let mut calls = Vec::with_capacity(prep.prompts.len());
    for (i, ids) in prep.prompts.iter().enumerate() {
        let rid = if many { format!("{id}-{i}") } else { id.to_string() };
        let req = engine_request(prep, rid.clone(), ids, target.dp_rank, pair.map(|p| p[i].clone()));
        let mut send = target.send.clone().ready().await.map_err(wire::transport)?;
        // The response head comes at once (the engine answers it before admitting the
        // request): the client is watched from the first message on.
        let mut call = Call::start(&mut send, &target.authority, path::GENERATE, &req).await?;
        call.limit(limits);
        calls.push((rid, call, None));
    }
    for i in 0..calls.len() {
        let first = monoio::select! {
            m = calls[i].1.next::<GenerateResponse>() => m,
            closed = peer_closed(&client.stream) => {
                if closed {
                    abort_all(target, calls.iter().map(|(r, _, _)| r.clone()));
                    return Ok(None);
                }
                calls[i].1.next::<GenerateResponse>().await
            }
        };
        match first {
            Some(Ok(m)) => calls[i].2 = Some(m),
            Some(Err(s)) => return Err(s),
            None => return Err(Status::new(Code::INTERNAL, "the engine ended the call without a message")),
        }
    }
    Ok(Some(Started { calls }))
}

/// Abort RPCs for `rids`, sent from a task of their own (the request is over for us).
pub(super) fn abort_all(target: &Target, rids: impl Iterator<Item = String>) {
    for rid in rids {
        let send = target.send.clone();
        let authority = target.authority.clone();
        monoio::spawn(async move {
            let Ok(mut send) = send.ready().await else { return };
            let req = AbortRequest { request_id: rid, reason: "client disconnected".into() };
            let _ = conn::unary::<_, AbortResponse>(&mut send, &authority, path::ABORT, &req).await;
        });
    }
}
