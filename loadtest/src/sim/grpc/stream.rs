//! A Generate call's response stream, whichever engine fills it (the simulator's timing model in
//! `generate`, a llama.cpp server in `llama`): how it ends early, the message wrapper, and
//! noticing that the client went away.

use bytes::Bytes;
use h2::SendStream;
use smg_proto::scheduler::{generate_response, GenerateRequest, GenerateResponse};

use crate::sim::grpc::wire::Status;

/// Why a call ended early.
pub(crate) enum End {
    /// The client reset the stream (or the connection went away).
    Gone,
    /// The call ends with this status after what was sent.
    Failed(Status),
}

/// One message of the call's stream, tagged with its request id.
pub(crate) fn response(req: &GenerateRequest, r: generate_response::Response) -> GenerateResponse {
    GenerateResponse { request_id: req.request_id.clone(), response: Some(r) }
}

/// Resolves when the client resets the stream or the connection fails.
pub(crate) async fn gone(send: &mut SendStream<Bytes>) {
    let _ = std::future::poll_fn(|cx| send.poll_reset(cx)).await;
}
