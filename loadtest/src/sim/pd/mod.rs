//! Prefill/decode disaggregation (PD, `--pd-role`), in the shape of the worker's runtime:
//! SGLang's bootstrap fields (over HTTP, or as `disaggregated_params` over gRPC), or vLLM's
//! `kv_transfer_params`. Every shape hands the KV over the same simulated way (below).
//!
//! **SGLang** (`--runtime sglang`). A gateway sends the same request body to a prefill worker and
//! a decode worker at the same time, with three fields added: `bootstrap_host` (the prefill's
//! host), `bootstrap_port` (its bootstrap port, or null) and `bootstrap_room` (an integer in
//! [0, 2^63-1], equal on both legs); in a batch each is an array with one entry per item
//! ([`fields`]).
//!
//! - A **prefill** worker needs `bootstrap_room`. It admits the request and spends the prompt's
//!   prefill time as any worker does, marks the room(s) finished on its bootstrap listener, and
//!   answers with one token in the request's own shape (finish_reason "length").
//! - A **decode** worker needs all three fields. Before the request takes a batch slot it waits for
//!   the KV of every room (sim/handoff.rs); then it answers as any worker does, except that the
//!   prompt costs no prefill: TTFT is the handoff wait plus one decode step. When the KV never
//!   comes (the bootstrap server is unreachable, says 404, or `--handoff-timeout-ms` runs out)
//!   the request is not generated and the answer is a 500 whose message starts with
//!   `KV transfer failed`.
//! - `/generate` with `return_logprob`: a prefill answers `meta_info.input_token_logprobs` for
//!   the prompt as any worker does; a decode computes no prompt log-probabilities and answers
//!   `"input_token_logprobs":[]` (in every chunk when streaming), its output ones as usual. A
//!   gateway in front of the pair puts the prefill's list before the decode's (sim/render.rs).
//!
//! **SGLang over gRPC** (`--grpc`, SGLang's scheduler API; sglang workers only). The gateway
//! sends the same `GenerateRequest` to both workers at the same time, with
//! `disaggregated_params: {bootstrap_host, bootstrap_port, bootstrap_room}` naming the prefill's
//! bootstrap listener (the room an int32 in [0, 2^31-1); a port of 0, the proto's unset, means
//! SGLang's default 8998). Both roles need `disaggregated_params` (else INVALID_ARGUMENT, as is
//! a negative room, an empty host or a port beyond 65535). The prefill spends the prompt's
//! prefill time, finishes the room as above, and answers one token (one chunk when streaming)
//! and a GenerateComplete with finish_reason "length". The decode waits for the room's KV
//! before its call answers anything (sim/handoff.rs, the same budget); then it streams as any
//! gRPC worker, with TTFT the handoff wait plus one decode step and no prompt log-probabilities
//! (`input_logprobs` unset, as an SGLang decode sends none). When the KV never comes the call
//! fails before its first message ("trailers only") with INTERNAL and a message starting
//! `KV transfer failed`. GetServerInfo's `server_args` say `disaggregation_mode` (and a
//! prefill's `disaggregation_bootstrap_port`); GetLoads with `include` "disagg" or "all" fills
//! each load's `disaggregation.mode`. grpc/disagg.rs reads the params.
//!
//! **vLLM** (`--runtime vllm`), as vLLM's NixlConnector and its disaggregated proxy do it
//! ([`vllm`]). The legs go one after the other; bootstrap fields are ignored.
//!
//! - The gateway sends the **prefill** first: the client's body with `max_tokens` (and
//!   `max_completion_tokens`) 1, `stream` false, and `"kv_transfer_params":
//!   {"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,
//!   "remote_block_ids":null,"remote_host":null,"remote_port":null}`. Without
//!   `do_remote_decode: true` the worker answers 400. It takes a fresh room, spends the prefill
//!   time and finishes the room as an SGLang prefill does, and answers one token (finish_reason
//!   "length") with a top-level `"kv_transfer_params":{"do_remote_prefill":true,
//!   "do_remote_decode":false,"remote_block_ids":[..],"remote_request_id":"<room>",
//!   "remote_engine_id":"<this worker>","remote_host":"<bootstrap host>",
//!   "remote_port":<bootstrap port>,"tp_size":1}` (`remote_request_id` is the sim's own field:
//!   the room, as a decimal string). A streamed prefill streams its token without them, as vLLM
//!   reports them in non-streaming answers only.
//! - The **decode** then gets the client's request with `kv_transfer_params` set to what the
//!   prefill answered. It needs `do_remote_prefill: true`, `remote_host`, `remote_port` and
//!   `remote_request_id` (else 400), fetches that room from `remote_host:remote_port` and
//!   answers as an SGLang decode does: the same TTFT, the same 500 `KV transfer failed...`. The
//!   prefill has finished the room by then, so the fetch is answered at once.
//!
//! The handoff is our own, simulated: real engines move KV through Mooncake/NIXL after a
//! bootstrap or side-channel exchange; here only its timing and failure modes matter. Each
//! prefill worker serves HTTP/1.1 on its bootstrap port (sim/bootstrap.rs), one request per
//! connection:
//!
//! - `GET /handoff/{room}?wait_ms=N` answers `200` as soon as that room's prefill has finished on
//!   this worker (at once when it already has: finished rooms are remembered for 60 s, at most
//!   65,536 of them), or `404` when it has not within `N` ms (default 10 s, at most 60 s). This is
//!   a long-poll because SGLang's legs leave the gateway together: the decode's question usually
//!   arrives before the prefill has even started.
//! - The decode asks once per room, in order, with `wait_ms` set to what is left of its
//!   `--handoff-timeout-ms` budget, and asks again after a 404 while budget remains (a prefill
//!   caps its wait at 60 s).
//!
//! Everything runs on the worker's own runtime thread, like the rest of the simulator.

pub(crate) mod fields;
pub(crate) mod rooms;
pub(crate) mod vllm;

use std::cell::Cell;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use clap::ValueEnum;

use fields::{Leg, MAX_ROOM};
use rooms::Rooms;
use vllm::Announce;

/// The part a worker plays in a PD pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PdRole {
    Prefill,
    Decode,
}

// === impl PdRole ===

impl PdRole {
    pub fn name(self) -> &'static str {
        match self {
            PdRole::Prefill => "prefill",
            PdRole::Decode => "decode",
        }
    }
}

/// Whose PD protocol a worker speaks: its runtime's (set from the worker's `--runtime`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PdProtocol {
    /// Bootstrap fields on both legs, sent together.
    Sglang,
    /// `kv_transfer_params`, the prefill's answer passed on to the decode.
    Vllm,
}

/// A worker's PD settings, from the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PdSpec {
    pub role: PdRole,
    pub protocol: PdProtocol,
    /// Prefill: the bootstrap listener's port (0: an ephemeral one).
    pub bootstrap_port: u16,
    /// Prefill: where the bootstrap listener was bound, once it is (a vLLM prefill names this
    /// address in its answers; None before, and in unit tests).
    pub bootstrap_addr: Option<SocketAddr>,
    /// Decode: how long a request may wait for its KV.
    pub handoff_timeout: Duration,
}

/// A worker's PD state on its owning thread.
pub(crate) struct PdState {
    pub(crate) role: PdRole,
    pub(crate) protocol: PdProtocol,
    pub(crate) handoff_timeout: Duration,
    /// Prefill: rooms finished here, and the long-polls waiting for others.
    pub(crate) rooms: Rooms,
    /// vLLM prefill: what its answers say about it.
    pub(crate) announce: Option<Announce>,
    /// vLLM prefill: the next room it takes (the gateway names none).
    next_room: Cell<u64>,
    /// Prefill: where its bootstrap listener was bound (None before, and in unit tests).
    pub(crate) bootstrap_addr: Option<SocketAddr>,
}

// === impl PdState ===

impl PdState {
    pub(crate) fn new(spec: &PdSpec) -> Self {
        let announce = (spec.role == PdRole::Prefill && spec.protocol == PdProtocol::Vllm).then(|| {
            let addr =
                spec.bootstrap_addr.unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), spec.bootstrap_port));
            // The bootstrap address names the worker for as long as it lives, and no other.
            Announce::new(&format!("smg-sim-{addr}"), &addr.ip().to_string(), addr.port())
        });
        Self {
            role: spec.role,
            protocol: spec.protocol,
            handoff_timeout: spec.handoff_timeout,
            rooms: Rooms::default(),
            announce,
            // A random start, so that a restarted prefill on the same port does not take the rooms
            // of the one before it, which a late decode may still ask for.
            next_room: Cell::new(fastrand::u64(..MAX_ROOM / 2)),
            bootstrap_addr: spec.bootstrap_addr,
        }
    }

    /// A room no earlier request of this worker took.
    pub(crate) fn new_room(&self) -> u64 {
        let room = self.next_room.get();
        self.next_room.set(if room >= MAX_ROOM { 0 } else { room + 1 });
        room
    }
}

/// What a generation job owes the PD protocol.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Handoff {
    /// Not a PD worker (or an embeddings request).
    #[default]
    None,
    /// Prefill: mark these rooms finished when the first token is due.
    Prefill(Vec<u64>),
    /// vLLM prefill: mark this room finished, and name it in the answer's `kv_transfer_params`.
    VllmPrefill(u64),
    /// Decode: wait for the KV of these rooms before taking a batch slot.
    Decode(Vec<Leg>),
}

// === impl Handoff ===

impl Handoff {
    /// The rooms a prefill marks finished when its first token is due.
    pub(crate) fn finishes(&self) -> &[u64] {
        match self {
            Handoff::Prefill(rooms) => rooms,
            Handoff::VllmPrefill(room) => std::slice::from_ref(room),
            Handoff::None | Handoff::Decode(_) => &[],
        }
    }
}
