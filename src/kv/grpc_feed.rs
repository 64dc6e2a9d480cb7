//! One gRPC worker's KV-cache events: `SubscribeKvEvents` (SGLang's scheduler API), read as
//! they come and handed to the events thread (thread.rs). A stream that ends or fails is
//! subscribed again after a backoff, from the last sequence number the thread saw, so the
//! engine replays what it published meanwhile.

use std::time::Duration;

use smg_proto::common::{KvEventBatch, SubscribeKvEventsRequest};
use smg_proto::paths::sglang_scheduler as path;
use tokio::sync::mpsc::UnboundedSender;

use super::event::from_proto;
use super::feed::{back_off, Feed, BACKOFF};
use crate::grpc::wire::{self, Code, Deframer, Status};
use crate::workers::grpc_probe::connect;
use crate::workers::WorkerUrl;

/// Follows `url`'s events until the thread drops the receiver (or aborts the task).
/// `resume_from` reads the last sequence number the thread applied, at each subscription.
pub async fn follow(url: WorkerUrl, tx: UnboundedSender<Feed>, resume_from: impl Fn() -> u64) {
    let name = url.url.clone();
    let mut backoff = BACKOFF.0;
    loop {
        let from = resume_from();
        let ended = subscribe(&url, &name, from, &tx, &mut backoff).await;
        // An engine without the method never will have it: its worker is routed by the
        // gateway's own guess, and not asked again (until it is registered again).
        let unsupported = matches!(&ended, Err(s) if s.code == Code::UNIMPLEMENTED);
        let why = match ended {
            Ok(()) => "the stream ended".to_string(),
            Err(s) => s.to_string(),
        };
        if tx.send(Feed::Down { url: name.clone(), why }).is_err() || unsupported {
            if unsupported {
                crate::info!("KV-cache events of {name}: the engine does not serve SubscribeKvEvents; routing it by the gateway's own view");
            }
            return;
        }
        back_off(&mut backoff).await;
    }
}

/// One subscription, until its stream ends; a batch resets the backoff.
async fn subscribe(
    url: &WorkerUrl,
    name: &str,
    from: u64,
    tx: &UnboundedSender<Feed>,
    backoff: &mut Duration,
) -> Result<(), Status> {
    let send = connect(url).await?;
    let mut ready = send.ready().await.map_err(wire::transport)?;
    let (resp, mut body) =
        ready.send_request(wire::request(&url.authority, path::SUBSCRIBE_KV_EVENTS), false).map_err(wire::transport)?;
    let req = SubscribeKvEventsRequest { start_sequence_number: from, load_records_before_first_batch: false };
    body.send_data(wire::frame(&req), true).map_err(wire::transport)?;
    let resp = resp.await.map_err(wire::transport)?;
    if let Some(Err(s)) = wire::status_of(resp.headers()) {
        return Err(s);
    }
    let _ = tx.send(Feed::Up { url: name.to_string() });
    let mut recv = resp.into_body();
    let mut frames = Deframer::default();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.map_err(wire::transport)?;
        let _ = recv.flow_control().release_capacity(chunk.len());
        frames.push(&chunk);
        while let Some(m) = frames.next_message::<KvEventBatch>() {
            let m = m?;
            *backoff = BACKOFF.0;
            // Numbered 0: load records only (never asked for).
            if m.sequence_number == 0 {
                continue;
            }
            let feed = Feed::Batch { url: name.to_string(), seq: m.sequence_number, batch: from_proto(&m) };
            if tx.send(feed).is_err() {
                return Ok(());
            }
        }
    }
    match recv.trailers().await.map_err(wire::transport)?.as_ref().and_then(wire::status_of) {
        Some(Err(s)) => Err(s),
        _ if frames.pending() > 0 => Err(Status::new(Code::INTERNAL, "stream ended inside a message")),
        _ => Ok(()),
    }
}
