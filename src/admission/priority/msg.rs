//! What the shards' schedulers tell each other.

use std::time::Instant;

use super::config::Class;

/// Shard → shard scheduler traffic (carried on the permit channel, which never drops).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedMsg {
    /// `from` has a `class` request waiting for a slot since `since`; with `preempt`, the
    /// receiver should preempt one of its lower-class requests for it.
    Want { from: usize, ticket: u64, class: Class, since: Instant, preempt: bool },
    /// `from`'s waiter `ticket` needs no slot any more (served or gone): forget its debt.
    Cancel { from: usize, ticket: u64 },
    /// The receiver of `from`'s want has no slot for it now (it keeps the debt).
    Busy { ticket: u64 },
    /// One slot, moved to the receiver, for its waiter `ticket` if still there; with
    /// `reserved`, one unit of that class's reservation moves with it.
    Grant { ticket: u64, reserved: Option<Class> },
    /// The sender's in-flight requests per class (for choosing where to preempt).
    Counts { from: usize, counts: [u32; 4] },
    /// `from` has a `class` request that must wait and no place of its own left in that
    /// class's queue.
    WantPlace { from: usize, ticket: u64, class: Class },
    /// One place in `class`'s queue, moved to the receiver for its waiter `ticket`.
    GrantPlace { ticket: u64, class: Class },
    /// The sender has no free place in that class's queue either.
    DenyPlace { ticket: u64 },
}
