//! What a worker's event feed (grpc_feed.rs, zmq_feed.rs) tells the events thread, and the
//! backoff both use between connections.

use std::time::Duration;

use super::event::Batch;

/// What a feed tells the events thread about its worker (`url`: the registered base URL).
#[derive(Debug)]
pub enum Feed {
    /// The stream is (again) open.
    Up {
        url: String,
    },
    Batch {
        url: String,
        seq: u64,
        batch: Batch,
    },
    /// The stream ended or failed; the feed subscribes again after a backoff.
    Down {
        url: String,
        why: String,
    },
}

/// The backoff between connections: doubling from the first to the last.
pub const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// Sleeps `backoff` before a feed subscribes again, then doubles it up to the cap (a batch
/// that arrives resets it to `BACKOFF.0`).
pub async fn back_off(backoff: &mut Duration) {
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(BACKOFF.1);
}
