//! `smg-sim --grpc`: SGLang's scheduler gRPC API (`sglang.grpc.scheduler.SglangScheduler`),
//! as the gateway drives a `grpc://` worker: token ids in, token ids out, paced by the same
//! timing model, batch slots and prefix cache as the HTTP workers.
//!
//! One port serves both protocols: a connection opening with the HTTP/2 preface is gRPC (h2 on
//! monoio's poll-io bridge), anything else is the HTTP/1.1 server, so tests keep reading
//! /sim/stats and driving /sim/control on the worker's own port.
//!
//! - `server`: the h2 connection and the method table;
//! - `generate`: the Generate call; `stream`: its response stream, whichever engine fills it;
//! - `disagg`: a PD worker's part in it (`--pd-role`: `disaggregated_params`, the KV wait);
//! - `info`: the unary RPCs; `bundle`: GetTokenizer's zip;
//! - `subscribe`: SubscribeKvEvents, the prefix cache's changes as KV event batches;
//! - `wire`: gRPC message framing and statuses; `rewind`: replay of the sniffed bytes;
//! - `tokenizer`: the simulated model's tokenizer files and context window;
//! - `llama`: `--llama-url`, Generate served by a real model on a llama.cpp server;
//! - `markup`: answers in a model family's reasoning and tool-call markup.

pub mod bundle;
pub(crate) mod disagg;
pub mod embed;
pub mod generate;
pub mod info;
pub mod llama;
pub mod markup;
pub mod rewind;
pub mod server;
pub mod stream;
pub mod subscribe;
pub mod wire;

use std::rc::Rc;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, IntoPollIo};
use monoio::net::TcpStream;

use crate::sim::http;
use crate::sim::worker::{ConnGuard, Worker};

/// The client preface every HTTP/2 connection starts with (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Serves one connection of a gRPC worker: HTTP/2 goes to the gRPC server, HTTP/1.1 to the
/// control surface.
pub async fn serve(w: Rc<Worker>, mut stream: TcpStream, guard: ConnGuard) {
    let _ = stream.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    // Read until the bytes either complete the preface or stop matching it.
    while buf.len() < H2_PREFACE.len() && H2_PREFACE.starts_with(&buf) {
        let len = buf.len();
        let (res, slice) = stream.read(buf.slice_mut(len..)).await;
        buf = slice.into_inner();
        match res {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
    if !buf.starts_with(H2_PREFACE) {
        return http::serve_prefixed(w, stream, buf, guard).await;
    }
    match stream.into_poll_io() {
        Ok(io) => server::serve(&w, rewind::Rewind::new(buf, io)).await,
        Err(e) => eprintln!("smg-sim: port {}: poll io: {e}", w.port),
    }
    drop(guard);
}
