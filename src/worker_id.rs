//! A worker's id: on the ground floor, as the floors below the worker table (the HTTP
//! pool, the gRPC connections) key their state by it.

/// A worker's name for as long as it is registered: handed out once by the control thread,
/// never reused, and independent of where the worker sits in a Snapshot, so per-shard pools
/// and load tables keyed by it stay right while workers come and go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkerId(pub u32);

impl WorkerId {
    /// For tables indexed by id (ids are dense: handed out in order from 0).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}
