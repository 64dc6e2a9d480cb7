//! Who may come in, and how many at once: the `authorize` and `admit` phases' rules, both
//! decided before the body is read. `auth.rs` checks keys and names the tenant; `permits.rs`
//! holds one shard's share of the gateway-wide admission permits.

pub mod auth;
pub mod permits;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use permits::Permits;

/// `--max-concurrent-requests` and its queue, validated.
#[derive(Debug, Clone)]
pub struct AdmissionConfig {
    /// Requests at the workers at once, gateway-wide.
    pub permits: usize,
    /// Token-bucket refill, permits per second, gateway-wide (0 = a pure concurrency cap).
    pub refill_per_sec: f64,
    /// Requests that may wait, gateway-wide (0 = refuse at once).
    pub queue_size: usize,
    pub queue_timeout: Duration,
}

/// An admitted request's permit, given back when the request finishes (its response fully
/// relayed, or the client gone): dropped with the request context in `finish`.
pub struct Permit(Rc<RefCell<Permits>>);

impl Permit {
    pub fn new(permits: &Rc<RefCell<Permits>>) -> Self {
        Permit(Rc::clone(permits))
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.borrow_mut().release();
    }
}
