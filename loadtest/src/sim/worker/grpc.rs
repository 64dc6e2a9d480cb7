//! What the gRPC mode remembers beyond the HTTP worker's counters: the Generate calls in flight
//! by request id (so an Abort RPC can stop one), and what tests observe through /sim/stats
//! (aborts, client cancellations, the last request's sampling parameters).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use crate::sync::Event;

/// Abort ids kept for /sim/stats (the most recent ones).
const KEEP_ABORT_IDS: usize = 32;

#[derive(Default)]
pub struct GrpcState {
    /// Generate calls in flight: request id -> fired when an Abort names it.
    running: RefCell<HashMap<String, Rc<Event>>>,
    /// Abort RPCs received, whether or not they named a running request.
    pub aborts: Cell<u64>,
    /// Abort RPCs that stopped a running request.
    pub aborts_hit: Cell<u64>,
    /// The latest Abort RPCs: request id and arrival (Unix ms), so a test can time how long a
    /// gateway took to send one after its client left.
    recent_aborts: RefCell<VecDeque<(String, u64)>>,
    /// Generate streams the client reset (went away) before they ended.
    pub cancelled: Cell<u64>,
    /// Every RPC by method name, unknown ones included.
    rpcs: RefCell<Vec<(String, u64)>>,
    /// The last Generate request's parameters, as JSON (for gateway mapping tests).
    pub last_generate: RefCell<String>,
}

// === impl GrpcState ===

impl GrpcState {
    /// Registers a running Generate call under `id`; returns what fires on Abort.
    pub fn register(&self, id: &str) -> Rc<Event> {
        let ev = Rc::new(Event::default());
        self.running.borrow_mut().insert(id.to_string(), ev.clone());
        ev
    }

    pub fn unregister(&self, id: &str) {
        self.running.borrow_mut().remove(id);
    }

    /// An Abort RPC for `id`: recorded, and the call stopped if it is running. Returns whether it was.
    pub fn abort(&self, id: &str) -> bool {
        self.aborts.set(self.aborts.get() + 1);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let mut recent = self.recent_aborts.borrow_mut();
        if recent.len() == KEEP_ABORT_IDS {
            recent.pop_front();
        }
        recent.push_back((id.to_string(), now_ms));
        drop(recent);
        let hit = self.running.borrow().get(id).cloned();
        match hit {
            Some(ev) => {
                ev.fire();
                self.aborts_hit.set(self.aborts_hit.get() + 1);
                true
            }
            None => false,
        }
    }

    pub fn count_rpc(&self, method: &str) {
        let mut rpcs = self.rpcs.borrow_mut();
        match rpcs.iter_mut().find(|(m, _)| m == method) {
            Some((_, n)) => *n += 1,
            None => rpcs.push((method.to_string(), 1)),
        }
    }

    pub fn running_ids(&self) -> usize {
        self.running.borrow().len()
    }

    /// The `"grpc":{...}` member of /sim/stats.
    pub fn stats_json(&self) -> String {
        let q = |s: &str| {
            let mut v = Vec::new();
            crate::sim::render::put_json_str(&mut v, s);
            String::from_utf8(v).unwrap_or_default()
        };
        let recent = self.recent_aborts.borrow();
        let ids: Vec<String> = recent.iter().map(|(id, _)| q(id)).collect();
        let times: Vec<String> = recent.iter().map(|(_, t)| t.to_string()).collect();
        let rpcs: Vec<String> = self.rpcs.borrow().iter().map(|(m, n)| format!("{}:{n}", q(m))).collect();
        let last = self.last_generate.borrow();
        format!(
            "{{\"aborts\":{},\"aborts_hit\":{},\"abort_ids\":[{}],\"abort_unix_ms\":[{}],\"cancelled\":{},\"in_flight\":{},\"rpcs\":{{{}}},\"last_generate\":{}}}",
            self.aborts.get(),
            self.aborts_hit.get(),
            ids.join(","),
            times.join(","),
            self.cancelled.get(),
            self.running_ids(),
            rpcs.join(","),
            if last.is_empty() { "null" } else { last.as_str() }
        )
    }
}
