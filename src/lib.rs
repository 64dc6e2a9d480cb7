//! smg: a shard-per-core, SMG-compatible LLM inference gateway.
//!
//! Follow a request by file name: `runtime/` boots pinned shards and accepts,
//! `http/server.rs` drives a connection through its phases, `api/` answers or forwards,
//! `http/upstream.rs` + `http/relay.rs` talk to the worker, `workers/` keeps the worker set.

#[macro_use]
pub mod log;
pub mod api;
pub mod config;
pub mod contract;
pub mod demo;
pub mod http;
pub mod routing;
pub mod runtime;
pub mod workers;
