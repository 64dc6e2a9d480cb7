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

//!
//! The catching is futures-util's `FutureExt::catch_unwind` (a std `catch_unwind` around each
//! poll); this module only adapts its result to the panic's message.

use std::future::{Future, IntoFuture};
use std::panic::AssertUnwindSafe;

use futures_util::future::{CatchUnwind, FutureExt, Map};

/// Awaits to the future's output, or to the panic's message.
pub struct CatchPanic<F>(pub F);

type Caught<T> = fn(std::thread::Result<T>) -> Result<T, String>;

impl<F: Future> IntoFuture for CatchPanic<F> {
    type Output = Result<F::Output, String>;
    type IntoFuture = Map<CatchUnwind<AssertUnwindSafe<F>>, Caught<F::Output>>;

    fn into_future(self) -> Self::IntoFuture {
        // AssertUnwindSafe: what the request held is released by its guards as it unwinds
        // (see above), so nothing observes half-written state afterwards.
        AssertUnwindSafe(self.0).catch_unwind().map(message as Caught<F::Output>)
    }
}

fn message<T>(caught: std::thread::Result<T>) -> Result<T, String> {
    caught.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into())
    })
}
