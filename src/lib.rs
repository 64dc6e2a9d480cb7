//! smg: a shard-per-core, SMG-compatible LLM inference gateway.
//!
//! Follow a request by file name: `runtime/` boots pinned shards and accepts
//! (`runtime/accept.rs`), `serve/` drives each request through its phases (`serve/mod.rs`
//! draws them) and ends it in `serve/finish.rs`; `api/` decides routes from the head and
//! answers locally; `http/` is bytes only (heads, bodies, the relay, the pool); `io.rs`
//! is every system call; `shard.rs` is one core's state; `workers/` keeps the worker set.

// Unsafe code only where a comment proves it sound: each place has #[allow(unsafe_code)] and a SAFETY line.
#![deny(unsafe_code)]

#[macro_use]
pub mod log;
pub mod access_log;
pub mod admission;
pub mod allocator;
pub mod api;
pub mod bounded_json;
pub mod budget;
pub mod clock;
// UTC calendar fields, shared with the simulator (wire/src/civil.rs).
pub use smg_wire::civil;
pub mod config;
pub mod contract;
pub mod demo;
pub mod duration;
pub mod egress;
pub mod grpc;
pub mod http;
pub mod io;
pub mod kv;
pub mod metrics;
pub mod pair;
pub mod random;
pub mod realtime;
pub mod responses;
pub mod retry;
pub mod routing;
pub mod runtime;
pub mod secret;
pub mod serve;
pub mod shard;
pub mod spare;
pub mod tokenizer;
pub mod trace;
pub mod uuid;
pub mod worker_id;
pub mod workers;
