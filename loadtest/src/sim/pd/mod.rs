//! Prefill/decode disaggregation (PD) in SGLang's shape, for the HTTP mode (`--pd-role`).
//!
//! A gateway in front of an SGLang PD pair sends the same request body to a prefill worker and a
//! decode worker at the same time, with three fields added: `bootstrap_host` (the prefill's host),
//! `bootstrap_port` (its bootstrap port, or null) and `bootstrap_room` (an integer in
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
//!
//! The handoff is our own, simulated: real SGLang moves KV through Mooncake/NIXL after a
//! bootstrap exchange; here only its timing and failure modes matter. Each prefill worker serves
//! HTTP/1.1 on its bootstrap port (sim/bootstrap.rs), one request per connection:
//!
//! - `GET /handoff/{room}?wait_ms=N` answers `200` as soon as that room's prefill has finished on
//!   this worker (at once when it already has: finished rooms are remembered for 60 s, at most
//!   65,536 of them), or `404` when it has not within `N` ms (default 10 s, at most 60 s). This is
//!   a long-poll because both legs leave the gateway together: the decode's question usually
//!   arrives before the prefill has even started.
//! - The decode asks once per room, in order, with `wait_ms` set to what is left of its
//!   `--handoff-timeout-ms` budget, and asks again after a 404 while budget remains (a prefill
//!   caps its wait at 60 s).
//!
//! Everything runs on the worker's own runtime thread, like the rest of the simulator.

pub(crate) mod fields;
pub(crate) mod rooms;

use std::time::Duration;

use clap::ValueEnum;

use fields::Leg;
use rooms::Rooms;

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

/// A worker's PD settings, from the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PdSpec {
    pub role: PdRole,
    /// Prefill: the bootstrap listener's port (0: an ephemeral one).
    pub bootstrap_port: u16,
    /// Decode: how long a request may wait for its KV.
    pub handoff_timeout: Duration,
}

/// A worker's PD state on its owning thread.
pub(crate) struct PdState {
    pub(crate) role: PdRole,
    pub(crate) handoff_timeout: Duration,
    /// Prefill: rooms finished here, and the long-polls waiting for others.
    pub(crate) rooms: Rooms,
}

// === impl PdState ===

impl PdState {
    pub(crate) fn new(spec: &PdSpec) -> Self {
        Self { role: spec.role, handoff_timeout: spec.handoff_timeout, rooms: Rooms::default() }
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
    /// Decode: wait for the KV of these rooms before taking a batch slot.
    Decode(Vec<Leg>),
}
