//! The gRPC server connection: the h2 handshake, one task per call, and the method table.

use std::rc::Rc;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use monoio::io::poll_io::{AsyncRead, AsyncWrite};
use prost::Message;
use smg_proto::paths::sglang_scheduler as path;

use crate::sim::grpc::wire::{self, Code, Status};
use crate::sim::grpc::{bundle, embed, generate, info, subscribe};
use crate::sim::worker::{bump, Worker};

/// Per-stream and per-connection receive windows: h2's 64 KiB defaults would make a gateway
/// multiplexing many calls on one connection wait for WINDOW_UPDATEs.
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 16 << 20;
const MAX_STREAMS: u32 = 16_384;

/// Serves HTTP/2 on `io` until the client leaves or the worker dies.
pub async fn serve<T>(w: &Rc<Worker>, io: T)
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let handshake = h2::server::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(MAX_STREAMS)
        .max_send_buffer_size(1 << 20)
        .handshake::<_, Bytes>(io);
    let mut conn = match handshake.await {
        Ok(c) => c,
        Err(_) => return,
    };
    loop {
        monoio::select! {
            next = conn.accept() => match next {
                Some(Ok((req, respond))) => {
                    let path = req.uri().path().to_string();
                    monoio::spawn(call(w.clone(), path, req.into_body(), respond));
                }
                Some(Err(_)) => return,
                // The client's GOAWAY: no new calls, but those in flight still need the
                // connection driven until they end.
                None => break,
            },
            _ = w.died.wait() => return,
        }
    }
    monoio::select! {
        _ = std::future::poll_fn(|cx| conn.poll_closed(cx)) => {}
        _ = w.died.wait() => {}
    }
}

/// One call, dispatched on its method path.
async fn call(w: Rc<Worker>, path: String, mut body: RecvStream, respond: SendResponse<Bytes>) {
    bump(&w.stats.requests, 1);
    let method = path.rsplit('/').next().unwrap_or("");
    w.grpc_state.count_rpc(method);
    match path.as_str() {
        path::GENERATE if w.grpc.as_ref().is_some_and(|g| g.embedding) => {
            wire::reject(respond, &Status::new(Code::INVALID_ARGUMENT, "This model does not support generation"))
        }
        path::GENERATE => generate::run(&w, body, respond).await,
        path::EMBED => unary(&mut body, respond, |r| embed::embed(&w, r)).await,
        path::HEALTH_CHECK => unary(&mut body, respond, |r| info::health_check(&w, r)).await,
        path::GET_MODEL_INFO => unary(&mut body, respond, |r| info::model_info(&w, r)).await,
        path::GET_SERVER_INFO => unary(&mut body, respond, |r| info::server_info(&w, r)).await,
        path::GET_LOADS => unary(&mut body, respond, |r| info::loads(&w, r)).await,
        path::ABORT => unary(&mut body, respond, |r| info::abort(&w, r)).await,
        path::FLUSH_CACHE => unary(&mut body, respond, |r| info::flush_cache(&w, r)).await,
        path::GET_TOKENIZER => bundle::serve(body, respond).await,
        path::SUBSCRIBE_KV_EVENTS if w.grpc.as_ref().is_some_and(|g| g.kv_events) => {
            subscribe::serve(&w, body, respond).await
        }
        _ => wire::reject(respond, &Status::new(Code::UNIMPLEMENTED, format!("smg-sim does not serve {path}"))),
    }
}

/// A unary call: one request message in, one response message (or a status) out.
async fn unary<Req, Resp>(
    body: &mut RecvStream,
    mut respond: SendResponse<Bytes>,
    handle: impl FnOnce(Req) -> Result<Resp, Status>,
) where
    Req: Message + Default,
    Resp: Message,
{
    let resp = match wire::read_request::<Req>(body).await.and_then(handle) {
        Ok(r) => r,
        Err(s) => return wire::reject(respond, &s),
    };
    let Ok(mut send) = respond.send_response(wire::response_head(), false) else { return };
    if send.send_data(wire::frame(&resp), false).is_ok() {
        let _ = send.send_trailers(wire::trailers(None));
    }
}
