//! Workers: their URLs, the immutable Snapshot shards route from, and the control thread
//! that probes them and publishes a new Snapshot (arc-swap) whenever anything changes.

pub mod health;
pub mod probe;
pub mod snapshot;
mod url;

pub use snapshot::{Candidates, Registry, Snapshot, Worker};
pub use url::{WorkerId, WorkerUrl};
