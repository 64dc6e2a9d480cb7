//! A bug in one request must not take the gateway down. A panic while a request's phases run
//! is caught at the poll where it happens: its guards unwind (load count, in-flight count,
//! permit, connection slot all come back), the client gets `500 internal_error` and the
//! connection closes; every other connection on the shard goes on. A panic outside the
//! phases (reading a head, finishing) ends only that connection.
//!
//! Why unwinding and not `panic = "abort"` plus a supervisor restart: an abort drops every
//! stream of every shard at once, and a restart loses the pools and the routing trees.
//! Shard state is `Cell`/`RefCell` behind RAII guards, so what a panicking task held is
//! released as it unwinds, and nothing it half-wrote is shared with another core.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

/// Resolves to the future's output, or to the panic's message.
pub struct CatchPanic<F>(pub F);

impl<F: Future> Future for CatchPanic<F> {
    type Output = Result<F::Output, String>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: structural pinning of the only field; it is never moved out.
        let inner = unsafe { self.map_unchecked_mut(|s| &mut s.0) };
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panic".into());
                Poll::Ready(Err(msg))
            }
        }
    }
}
