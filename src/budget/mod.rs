//! Tenant token budgets (SMG's tenant rate limiting, on every inference endpoint of the HTTP
//! path): a reservation before dispatch, settled against the worker's reported usage, exact
//! across shards through leases from one budget owner, and across replicas through Redis.

pub mod config;
pub mod owner;
pub mod redis_store;
mod remote;
pub mod shard;
pub mod store;
