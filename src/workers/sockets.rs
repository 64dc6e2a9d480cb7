//! The control thread's descriptor budget: every exchange it has with a worker (a health
//! check, discovery, a load poll, an admin fan-out's call) first takes one of
//! [`MAX_OPEN`] places, so however many workers are registered, the control thread holds
//! at most that many sockets. Before, 10,000 registrations opened 10,000 probes at once and
//! took the descriptors the shards accept clients with. A place is taken before the
//! exchange's own deadline starts: waiting for one is not a worker's fault.

use tokio::sync::{Semaphore, SemaphorePermit};

/// Sockets the control thread may hold at once (a fraction of the 128 descriptors the
/// gateway keeps in reserve beside its client connections: `config::DESCRIPTOR_RESERVE`).
pub const MAX_OPEN: usize = 64;

static OPEN: Semaphore = Semaphore::const_new(MAX_OPEN);

/// Waits for a place; dropping the permit gives it back.
pub async fn place() -> SemaphorePermit<'static> {
    OPEN.acquire().await.expect("the budget is never closed")
}
