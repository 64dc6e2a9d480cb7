//! SubscribeKvEvents (server streaming): the worker's KV event batches (sim/kv_events.rs), the
//! kept ones after `start_sequence_number` first when it is not 0, then each as it is published.
//!
//! A batch leaves only as HTTP/2 flow control lets it (so unread batches wait in the
//! subscriber's bounded queue, not in h2's unbounded send buffer), and a backlog leaves in
//! pieces of up to 64 KiB of whole batches rather than one small DATA frame per batch. A subscriber whose queue
//! overflows gets RESOURCE_EXHAUSTED once the batch on the wire is whole, and resubscribes from
//! the last sequence number it got. The stream ends with the worker (the connection is cut) or
//! when the client resets it; it never ends OK.

use std::rc::Rc;
use std::task::Poll;

use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use smg_proto::common::SubscribeKvEventsRequest;

use crate::sim::grpc::wire::{self, reject, Code, Status};
use crate::sim::kv_events::{Next, Subscriber, KEEP_BATCHES};
use crate::sim::worker::Worker;

/// The most queued batches sent in one piece.
const COALESCE_BYTES: usize = 64 * 1024;

pub async fn serve(w: &Rc<Worker>, mut body: RecvStream, mut respond: SendResponse<Bytes>) {
    let req: SubscribeKvEventsRequest = match wire::read_request(&mut body).await {
        Ok(r) => r,
        Err(s) => return reject(respond, &s),
    };
    let Some(log) = w.kv_events.as_ref() else {
        return reject(respond, &Status::new(Code::UNIMPLEMENTED, "this worker publishes no KV events"));
    };
    // Subscribed before the response head goes out: a client that has the head sees every
    // batch published after it.
    let sub = log.subscribe(req.start_sequence_number);
    let Ok(mut send) = respond.send_response(wire::response_head(), false) else { return };
    loop {
        let next = monoio::select! {
            n = next_batch(&sub, &mut send) => n,
            _ = w.died.wait() => return,
        };
        match next {
            None => return,
            Some(Next::Overflow) => {
                let msg = format!(
                    "KV event subscriber fell {KEEP_BATCHES} batches behind; resubscribe from the last sequence number received"
                );
                let _ = send.send_trailers(wire::trailers(Some(&Status::new(Code::RESOURCE_EXHAUSTED, msg))));
                return;
            }
            Some(Next::Batch(first)) => {
                // With a backlog (a replay, a reader behind), the batches queued behind it too.
                let data = if sub.queued() == 0 {
                    first
                } else {
                    let mut buf = BytesMut::from(&first[..]);
                    sub.drain_into(&mut buf, COALESCE_BYTES);
                    buf.freeze()
                };
                let sent = monoio::select! {
                    ok = send_flow_controlled(&mut send, data) => ok,
                    _ = w.died.wait() => return,
                };
                if !sent {
                    return;
                }
            }
        }
    }
}

/// The subscriber's next batch; None when the client reset the stream.
async fn next_batch(sub: &Subscriber, send: &mut SendStream<Bytes>) -> Option<Next> {
    std::future::poll_fn(|cx| {
        if send.poll_reset(cx).is_ready() {
            return Poll::Ready(None);
        }
        sub.poll_next(cx).map(Some)
    })
    .await
}

/// Sends `frame` in pieces as the client's flow-control window allows; false when the stream
/// is gone.
async fn send_flow_controlled(send: &mut SendStream<Bytes>, mut frame: Bytes) -> bool {
    while !frame.is_empty() {
        send.reserve_capacity(frame.len());
        let available = std::future::poll_fn(|cx| {
            if send.poll_reset(cx).is_ready() {
                return Poll::Ready(None);
            }
            match send.capacity() {
                0 => match send.poll_capacity(cx) {
                    Poll::Ready(Some(Ok(n))) if n > 0 => Poll::Ready(Some(n)),
                    Poll::Ready(Some(Ok(_))) => {
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                    Poll::Ready(Some(Err(_)) | None) => Poll::Ready(None),
                    Poll::Pending => Poll::Pending,
                },
                n => Poll::Ready(Some(n)),
            }
        })
        .await;
        let Some(n) = available else { return false };
        let piece = frame.split_to(n.min(frame.len()));
        if send.send_data(piece, false).is_err() {
            return false;
        }
    }
    true
}
