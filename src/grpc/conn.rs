//! A shard's gRPC transport: one multiplexed HTTP/2 connection per worker, driven by h2 on
//! monoio's poll-io bridge (tokio's AsyncRead/AsyncWrite traits over the shard's io_uring or
//! epoll driver; no tokio runtime here). Created on first use, replaced when it fails.
//!
//! Windows are raised well past h2's 64 KiB defaults (DESIGN.md): many concurrent Generate
//! streams of small DATA frames otherwise stall on WINDOW_UPDATEs, and h2 answers a flood of
//! tiny frames against a small window with GOAWAY.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;

use bytes::Bytes;
use h2::client::SendRequest;
use h2::RecvStream;
use monoio::io::IntoPollIo;
use prost::Message;

use super::wire::{self, Code, Deframer, Status};
use crate::worker_id::WorkerId;

const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 64 << 20;

/// This shard's connections to its gRPC workers.
#[derive(Default)]
pub struct Channels {
    open: RefCell<HashMap<WorkerId, SendRequest<Bytes>>>,
}

impl Channels {
    /// A ready handle on the worker's connection: the open one, else a new one (also when
    /// the open one turns out closed).
    pub async fn ready(&self, id: WorkerId, addr: SocketAddr) -> Result<SendRequest<Bytes>, Status> {
        let existing = self.open.borrow().get(&id).cloned();
        if let Some(send) = existing {
            match send.ready().await {
                Ok(s) => return Ok(s),
                Err(_) => {
                    self.open.borrow_mut().remove(&id);
                }
            }
        }
        let send = connect(addr).await?;
        self.open.borrow_mut().insert(id, send.clone());
        send.ready().await.map_err(wire::transport)
    }

    /// The connection failed under a call: the next call opens a new one.
    pub fn forget(&self, id: WorkerId) {
        self.open.borrow_mut().remove(&id);
    }

    /// Drops connections of workers no longer registered.
    pub fn retain(&self, keep: impl Fn(WorkerId) -> bool) {
        self.open.borrow_mut().retain(|id, _| keep(*id));
    }
}

async fn connect(addr: SocketAddr) -> Result<SendRequest<Bytes>, Status> {
    let tcp = crate::io::connect(addr).await.map_err(|e| Status::new(Code::UNAVAILABLE, format!("connect: {e}")))?;
    let io = tcp.into_poll_io().map_err(wire::transport)?;
    let (send, conn) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_send_buffer_size(1 << 20)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(wire::transport)?;
    // The connection task lives as long as the connection: it ends when the peer closes it
    // or when every handle (ours in Channels and the calls') is dropped.
    monoio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

/// A call in progress: the response's messages as they arrive, then its status.
pub struct Call {
    body: RecvStream,
    frames: Deframer,
    done: bool,
    limits: Limits,
    /// A message has arrived (the idle limit applies from then on).
    started: bool,
}

/// How long a call may take, as an HTTP worker's exchange: the whole of it within
/// `--request-timeout-secs` of the pick, and, once the engine has said something, no gap
/// between its messages longer than `--upstream-read-timeout-secs`. A call past either is
/// DEADLINE_EXCEEDED (the caller drops it, which resets the stream: the engine cancels).
#[derive(Debug, Clone, Copy, Default)]
pub struct Limits {
    pub deadline: Option<std::time::Instant>,
    pub idle: Option<std::time::Duration>,
    /// The largest message the engine may send (`--grpc-max-message-size`); None: the
    /// framing's own bound.
    pub max_message: Option<usize>,
}

impl Call {
    /// Sends `msg` to `path` and waits for the response head. A trailers-only answer (the
    /// engine refused before any message) is its status as an error.
    pub async fn start<M: Message>(
        send: &mut SendRequest<Bytes>,
        authority: &str,
        path: &str,
        msg: &M,
    ) -> Result<Call, Status> {
        let (resp, mut out) = send.send_request(wire::request(authority, path), false).map_err(wire::transport)?;
        out.send_data(wire::frame(msg), true).map_err(wire::transport)?;
        let resp = resp.await.map_err(stream_status)?;
        if let Some(Err(s)) = wire::status_of(resp.headers()) {
            return Err(s);
        }
        if resp.status() != http::StatusCode::OK {
            return Err(Status::new(Code::UNKNOWN, format!("HTTP status {} from the worker", resp.status())));
        }
        Ok(Call {
            body: resp.into_body(),
            frames: Deframer::default(),
            done: false,
            limits: Limits::default(),
            started: false,
        })
    }

    /// A whole message is already here: `next` will not wait.
    pub fn has_message(&self) -> bool {
        self.frames.has_message()
    }

    /// Holds the call's messages to `limits` from now on.
    pub fn limit(&mut self, limits: Limits) {
        self.limits = limits;
        if let Some(n) = limits.max_message {
            self.frames.set_limit(n);
        }
    }

    /// How long the next wait for data may last, if bounded.
    fn wait_limit(&self) -> Option<std::time::Duration> {
        let to_deadline = self.limits.deadline.map(|d| d.saturating_duration_since(crate::clock::now()));
        let idle = self.limits.idle.filter(|_| self.started);
        match (to_deadline, idle) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next message; None after the stream ended with OK.
    pub async fn next<M: Message + Default>(&mut self) -> Option<Result<M, Status>> {
        loop {
            if let Some(m) = self.frames.next_message::<M>() {
                return Some(m);
            }
            if self.done {
                return None;
            }
            let data = match self.wait_limit() {
                Some(limit) => match crate::clock::timeout(limit, self.body.data()).await {
                    Ok(d) => d,
                    Err(_) => {
                        self.done = true;
                        let why = if self.started { "the engine went silent" } else { "no answer from the engine" };
                        return Some(Err(Status::new(
                            Code::DEADLINE_EXCEEDED,
                            format!("{why} within the time allowed"),
                        )));
                    }
                },
                None => self.body.data().await,
            };
            match data {
                Some(Ok(chunk)) => {
                    let _ = self.body.flow_control().release_capacity(chunk.len());
                    self.frames.push(&chunk);
                    self.started = true;
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(stream_status(e)));
                }
                None => {
                    self.done = true;
                    let trailers = match self.body.trailers().await {
                        Ok(t) => t,
                        Err(e) => return Some(Err(stream_status(e))),
                    };
                    match trailers.as_ref().and_then(wire::status_of) {
                        Some(Err(s)) => return Some(Err(s)),
                        Some(Ok(())) if self.frames.pending() == 0 => return None,
                        Some(Ok(())) => return Some(Err(Status::new(Code::INTERNAL, "stream ended inside a message"))),
                        None => return Some(Err(Status::new(Code::INTERNAL, "stream ended without a grpc-status"))),
                    }
                }
            }
        }
    }
}

/// An h2 error as a status: a reset with a gRPC-meaningful reason keeps it, the rest is
/// the transport failing.
fn stream_status(e: h2::Error) -> Status {
    match e.reason() {
        Some(h2::Reason::REFUSED_STREAM) => Status::new(Code::UNAVAILABLE, format!("stream refused: {e}")),
        Some(h2::Reason::CANCEL) => Status::new(Code::CANCELLED, format!("stream cancelled: {e}")),
        Some(h2::Reason::ENHANCE_YOUR_CALM) => Status::new(Code::RESOURCE_EXHAUSTED, format!("{e}")),
        _ => wire::transport(e),
    }
}

/// A unary call on an open connection.
pub async fn unary<Req: Message, Resp: Message + Default>(
    send: &mut SendRequest<Bytes>,
    authority: &str,
    path: &str,
    req: &Req,
) -> Result<Resp, Status> {
    let mut call = Call::start(send, authority, path, req).await?;
    let first = call.next::<Resp>().await.unwrap_or_else(|| Err(Status::new(Code::INTERNAL, "no response message")));
    while let Some(Ok(_)) = call.next::<Resp>().await {}
    first
}
