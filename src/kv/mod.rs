//! KV-cache events: what the engines say they cached, for `cache_aware` to route on
//! (issue 28). The pieces, in the order an event travels:
//!
//! - `event.rs`: one shape for every engine's events, decoded from vLLM's ZMQ msgpack
//!   payloads (both layouts) and from SGLang's gRPC `KvEventBatch`.
//! - `keys.rs`: the gateway's own key of a block (a chain hash of the token ids up to it, in
//!   its LoRA's namespace) and, per worker, the map from the engine's block hashes to those
//!   keys, which turns events into index changes. The engine's hash is never recomputed.
//! - `index.rs`: which workers hold which keys on the GPU, and the longest prefix of a
//!   request's keys each holds.
//!
//! - `feed.rs`: what every feed tells the thread, and their one backoff.
//! - `grpc_feed.rs`: a gRPC worker's `SubscribeKvEvents` stream, resubscribed from its last
//!   sequence number when it ends.
//! - `zmq_feed.rs`: an HTTP worker's events over ZMQ (where it publishes is part of its
//!   registration: workers/kv_events_source.rs), with vLLM's replay of missed batches.
//! - `thread.rs`: the events thread: follows the workers, applies their events, and sends
//!   every shard the index changes (shard.rs applies them; `cache_aware` reads them through
//!   each candidate's `cached` prefix).
//!
//! - `bookings.rs`: what a shard just sent where, counted as held for a short TTL until the
//!   events catch up (`--selection-accounting-ttl-ms`).
//! - `prompt_ids.rs`: an HTTP request's token ids as its engine will compute them
//!   (`--tokenizer-path`), for matching; gRPC requests carry the gateway's own ids.

pub mod bookings;
pub mod event;
pub mod feed;
pub mod grpc_feed;
pub mod index;
pub mod keys;
pub mod prompt_ids;
pub mod thread;
pub mod zmq_feed;
