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
//! The catching is a std `catch_unwind` around each poll, in one future that holds the task
//! in place. futures-util's `FutureExt::catch_unwind().map(..)` did the same through
//! adapters that each moved the task into the next, and a request's future is large (11 KB
//! by `size_of` in a debug build). Callgrind on chat-1k: two of the copies that were made
//! per request are gone (memcpy was the largest user-space symbol under `perf record`).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

pin_project_lite::pin_project! {
    /// Awaits to the future's output, or to the panic's message.
    pub struct CatchPanic<F> {
        #[pin]
        task: F,
    }
}

/// `task`, with a panic in any of its polls caught.
pub fn catch_panic<F: Future>(task: F) -> CatchPanic<F> {
    CatchPanic { task }
}

impl<F: Future> Future for CatchPanic<F> {
    type Output = Result<F::Output, String>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let task = self.project().task;
        // AssertUnwindSafe: what the request held is released by its guards as it unwinds
        // (see above), so nothing observes half-written state afterwards.
        match std::panic::catch_unwind(AssertUnwindSafe(|| task.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(payload) => Poll::Ready(Err(message(payload))),
        }
    }
}

fn message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::Waker;

    use super::*;

    fn poll<F: Future>(f: Pin<&mut CatchPanic<F>>) -> Poll<Result<F::Output, String>> {
        f.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn answers_pass_through_and_panics_become_their_message() {
        let mut wakes = 0;
        let mut f = pin!(catch_panic(std::future::poll_fn(|_| {
            wakes += 1;
            if wakes < 2 {
                Poll::Pending
            } else {
                Poll::Ready(7)
            }
        })));
        assert!(poll(f.as_mut()).is_pending());
        assert_eq!(poll(f.as_mut()), Poll::Ready(Ok(7)));

        let f = pin!(catch_panic(async { panic!("in a phase") }));
        assert_eq!(poll::<_>(f), Poll::Ready(Err::<(), _>("in a phase".to_string())));
        let n = 3;
        let f = pin!(catch_panic(async move { panic!("formatted {n}") }));
        assert_eq!(poll::<_>(f), Poll::Ready(Err::<(), _>("formatted 3".to_string())));
    }
}
