//! A prefill/decode pair of gRPC workers (SGLang's scheduler API): the prompt is tokenized
//! once (the request was prepared for the decode's model), and both engines get the same
//! Generate calls with `disaggregated_params` naming the prefill's bootstrap server and one
//! room per prompt. The decode's stream is the answer, assembled as any gRPC worker's.
//!
//! The prefill's calls are read to their end by a task of their own (an engine aborts a
//! request whose stream is reset, and the prefill must run to hand its KV over), which
//! holds the pair's place among the prefill's legs in flight until then. A prefill
//! that fails before the decode's first message fails the attempt
//! (`prefill_worker_failed_to_start`, its status mapped as any engine's), and the decode's
//! calls are dropped, which aborts them; so does a decode that fails to start
//! (`decode_worker_failed_to_start`), unless the prefill failed too: then the prefill's
//! failure is the cause (the decode only says its KV never came).

use std::pin::pin;
use std::rc::Rc;

use smg_proto::paths::sglang_scheduler as path;
use smg_proto::scheduler::{DisaggregatedParams, GenerateResponse};

use super::calls::{engine_request, start, Started, Target};
use crate::admission::Permit;
use crate::grpc::conn::{Call, Limits};
use crate::grpc::request::Prepared;
use crate::grpc::wire::{self, Status};
use crate::pair::bootstrap_host;
use crate::serve::client::Client;
use crate::serve::error::{Failure, WorkerCause, WorkerError};
use crate::serve::upstream::AttemptError;
use crate::shard::Shard;
use crate::workers::snapshot::Role;
use crate::workers::Worker;

/// SGLang's bootstrap port when a prefill worker was registered without one.
const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// See the module doc. `decode`: the picked worker's connection, `id`: the engine request
/// id, `slot`: the prefill leg's admission (serve/pair_admit.rs). The decode's started
/// calls are the answer's.
#[allow(clippy::too_many_arguments)]
pub(super) async fn attempt(
    shard: &Rc<Shard>,
    client: &Client,
    prefill: &Worker,
    mut decode: Target,
    prep: &Prepared,
    id: &str,
    limits: Limits,
    slot: Option<Permit>,
) -> Result<(Target, Started), AttemptError> {
    let Role::Prefill { bootstrap_port } = prefill.meta.role else { unreachable!("picked as a prefill worker") };
    let host = bootstrap_host(&prefill.url.authority);
    let port = i32::from(bootstrap_port.unwrap_or(DEFAULT_BOOTSTRAP_PORT));
    // The proto's room is an int32: drawn in [0, 2^31-1).
    let params: Vec<DisaggregatedParams> = (0..prep.prompts.len())
        .map(|_| DisaggregatedParams {
            bootstrap_host: host.to_string(),
            bootstrap_port: port,
            bootstrap_room: (shard.next_random() % (i32::MAX as u64)) as i32,
        })
        .collect();
    let decode_id = decode.id;
    let prefill_failed = |s: Status| failed(shard, s, Some(prefill), decode_id);
    let calls = start_prefill(shard, prefill, prep, id, limits, &params).await.map_err(prefill_failed)?;
    let mut drained = monoio::spawn(drain(calls, slot));
    let started = {
        let mut decoding = pin!(start(&mut decode, client, prep, id, limits, Some(&params)));
        monoio::select! {
            d = &mut decoding => d,
            p = &mut drained => match p {
                Ok(()) => decoding.as_mut().await,
                Err(s) => return Err(prefill_failed(s)),
            },
        }
    };
    match started {
        Ok(Some(started)) => Ok((decode, started)),
        Ok(None) => Err(AttemptError::ClientGone),
        Err(s) => match drained.await {
            Err(p) => Err(prefill_failed(p)),
            Ok(()) => Err(failed(shard, s, None, decode_id)),
        },
    }
}

/// Opens the prefill's Generate calls (one per prompt).
async fn start_prefill(
    shard: &Shard,
    prefill: &Worker,
    prep: &Prepared,
    id: &str,
    limits: Limits,
    params: &[DisaggregatedParams],
) -> Result<Vec<Call>, Status> {
    let send = shard.grpc().ready(prefill.id, prefill.url.addr).await?;
    let many = prep.prompts.len() > 1;
    let mut calls = Vec::with_capacity(prep.prompts.len());
    for (i, ids) in prep.prompts.iter().enumerate() {
        let rid = if many { format!("{id}-{i}") } else { id.to_string() };
        let req = engine_request(prep, rid, ids, prefill.meta.dp_rank, Some(params[i].clone()));
        let mut send = send.clone().ready().await.map_err(wire::transport)?;
        let mut call = Call::start(&mut send, &prefill.url.authority, path::GENERATE, &req).await?;
        call.limit(limits);
        calls.push(call);
    }
    Ok(calls)
}

/// Reads every prefill call to its end, `slot` held until then; the first engine failure.
async fn drain(calls: Vec<Call>, slot: Option<Permit>) -> Result<(), Status> {
    let _slot = slot;
    for mut call in calls {
        while let Some(m) = call.next::<GenerateResponse>().await {
            m?;
        }
    }
    Ok(())
}

/// A leg's engine failure (`on`: the prefill's; else the decode's), as the worker-side
/// error the loop judges and answers; a broken connection is forgotten.
fn failed(shard: &Shard, s: Status, on: Option<&Worker>, decode: crate::workers::WorkerId) -> AttemptError {
    if s.message.starts_with("transport") || s.message.starts_with("connect") {
        shard.grpc().forget(on.map_or(decode, |w| w.id));
    }
    let e = WorkerError::new(WorkerCause::PairEngine { status: s, prefill: on.is_some() }, false);
    AttemptError::Failed(Failure::Worker(match on {
        Some(w) => e.on(w),
        None => e,
    }))
}
