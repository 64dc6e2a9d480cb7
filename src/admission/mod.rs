//! Who may come in, and how many at once: the `authorize` and `admit` phases' rules, both
//! decided before the body is read. `auth.rs` checks keys and names the tenant; `permits.rs`
//! holds one shard's share of the gateway-wide admission permits; `priority/` is the
//! priority scheduler that replaces them with `--priority-scheduler-enabled`; `pd.rs` holds
//! the per-worker pools of prefill/decode pairs (taken after pick, per attempt).

pub mod auth;
pub mod pd;
pub mod permits;
pub mod priority;

pub use permits::{AdmissionConfig, Permit};
