//! What the shards' schedulers tell each other.

use std::time::Instant;

use super::config::Class;

/// Shard → shard scheduler traffic (carried on the permit channel, which never drops).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedMsg {
    /// `from` has a `class` request waiting for a slot since `since`; with `preempt`, the
    /// receiver should preempt one of its lower-class requests for it.
    Want { from: usize, class: Class, since: Instant, preempt: bool },
    /// One slot, moved to the receiver.
    Grant,
    /// The sender's in-flight requests per class (for choosing where to preempt).
    Counts { from: usize, counts: [u32; 4] },
}
