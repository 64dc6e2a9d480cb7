//! Who may come in, and how many at once: the `authorize` and `admit` phases' rules, both
//! decided before the body is read. `auth.rs` checks keys and names the tenant; `permits.rs`
//! holds one shard's share of the gateway-wide admission permits.

pub mod auth;
pub mod permits;

pub use permits::{AdmissionConfig, Permit};
