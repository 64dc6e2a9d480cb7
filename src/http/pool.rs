//! Upstream connections and one shard's keep-alive pools of them, per worker id.
//!
//! The pool is LIFO (the most recently used socket is the one most likely still open) and
//! forgets connections idle longer than `--upstream-pool-idle-timeout-secs` (default 3 s,
//! shorter than engines' 5 s keep-alive so we close first and rarely race their close).
//!
//! A pooled connection must be proven clean before it carries a request: with no request
//! outstanding, anything readable on it is either the worker closing or bytes that belong
//! to no request (a short Content-Length, a duplicated response, a late write after the
//! last chunk). Parsed as the next response, those bytes would reach the wrong client. So
//! `take` peeks each candidate once, non-blocking, and drops every one that is readable.
//! It is one `recv(MSG_PEEK | MSG_DONTWAIT)` per reused connection; cost measured in the
//! README.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use crate::io::{self, Upstream};
use crate::worker_id::WorkerId;

/// Read buffer size of an upstream connection.
pub const UPSTREAM_BUF: usize = 16 * 1024;

pub struct UpstreamConn {
    pub stream: Upstream,
    /// Read buffer, owned by the connection so it travels through the pool with it.
    pub buf: Vec<u8>,
    idle_since: Instant,
    /// Came from the pool: a failure before any response byte may be a stale socket.
    pub reused: bool,
}

/// A new plain connection to `addr`.
pub async fn connect(addr: std::net::SocketAddr) -> std::io::Result<UpstreamConn> {
    Ok(UpstreamConn::new(Upstream::Plain(io::connect(addr).await?)))
}

impl UpstreamConn {
    /// A new connection over `stream` (a TLS one: `egress::TlsRoute::connect`).
    pub fn new(stream: Upstream) -> UpstreamConn {
        UpstreamConn { stream, buf: Vec::with_capacity(UPSTREAM_BUF), idle_since: crate::clock::now(), reused: false }
    }
}

/// Idle connections of one shard, per worker id.
pub struct Pool {
    idle: RefCell<Vec<Vec<UpstreamConn>>>,
    idle_timeout: Duration,
}

// === impl Pool ===

impl Pool {
    pub fn new(idle_timeout: Duration) -> Self {
        Self { idle: RefCell::new(Vec::new()), idle_timeout }
    }

    /// The most recent idle connection to `worker` that is young enough at `now` and clean.
    pub fn take(&self, worker: WorkerId, now: Instant) -> Option<UpstreamConn> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(worker.index())?;
        while let Some(mut c) = list.pop() {
            if now.duration_since(c.idle_since) >= self.idle_timeout {
                // The newest is too old, so every older one is too.
                list.clear();
                return None;
            }
            if io::idle_is_clean(&c.stream) {
                c.reused = true;
                return Some(c);
            }
            crate::debug!("worker {}: pooled connection was readable while idle; dropped", worker.0);
        }
        None
    }

    /// Pools `conn` for reuse. The caller vouches that its last response ended exactly at the
    /// end of what was read and that the worker allowed keep-alive. It is idle from `now`.
    pub fn put(&self, worker: WorkerId, mut conn: UpstreamConn, now: Instant) {
        conn.buf.clear();
        if conn.buf.capacity() > 4 * UPSTREAM_BUF {
            conn.buf.shrink_to(UPSTREAM_BUF);
        }
        conn.idle_since = now;
        let mut idle = self.idle.borrow_mut();
        let i = worker.index();
        if idle.len() <= i {
            idle.resize_with(i + 1, Vec::new);
        }
        idle[i].push(conn);
    }

    /// Drops every idle connection to `worker`: one of them turned out stale, and the rest
    /// were opened to the same worker process.
    pub fn clear(&self, worker: WorkerId) {
        if let Some(list) = self.idle.borrow_mut().get_mut(worker.index()) {
            list.clear();
        }
    }

    /// Closes every idle connection to a worker `keep` refuses (it was removed).
    pub fn retain(&self, keep: impl Fn(WorkerId) -> bool) {
        for (i, list) in self.idle.borrow_mut().iter_mut().enumerate() {
            if !list.is_empty() && !keep(WorkerId(i as u32)) {
                list.clear();
            }
        }
    }

    /// Closes connections idle past the timeout at `now` (oldest sit at the front).
    pub fn sweep(&self, now: Instant) {
        for list in self.idle.borrow_mut().iter_mut() {
            let keep_from =
                list.iter().position(|c| now.duration_since(c.idle_since) < self.idle_timeout).unwrap_or(list.len());
            list.drain(..keep_from);
        }
    }
}
