//! Workers: their URLs, the immutable Snapshot shards route from, and the control thread
//! that owns the fleet (health, breakers, loads, the admin API) and publishes a new
//! Snapshot (arc-swap) whenever routing must see a change.

pub mod admin;
pub mod breaker;
pub mod control;
pub mod fleet;
pub mod grpc_probe;
pub mod kv_events_source;
pub mod probe;
pub mod provider;
pub mod snapshot;
mod sockets;
pub mod status;
mod url;

pub use snapshot::{Candidates, Registry, Snapshot, Worker};
pub use url::{WorkerId, WorkerUrl};
