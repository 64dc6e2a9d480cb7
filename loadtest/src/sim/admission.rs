//! Admission into a worker's running batch: a FIFO gate over two budgets, batch slots
//! (`--max-running`) and KV-cache tokens (`--kv-cache-tokens`).
//!
//! A request is admitted when a slot is free *and* its prompt plus output tokens fit in the KV
//! cache, as SGLang's and vLLM's schedulers reserve room before they prefill. Admission is
//! first come, first served with head-of-line blocking: a large request at the head waits for
//! room rather than being overtaken, which is SGLang's default FCFS policy. A request larger than
//! the whole cache is charged the whole cache, so it runs alone instead of waiting forever.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

pub struct Gate {
    max_slots: usize,
    free_slots: Cell<usize>,
    /// 0: tokens are not limited.
    capacity: u64,
    free_tokens: Cell<u64>,
    queue: RefCell<VecDeque<Rc<Waiter>>>,
    waiting: Cell<usize>,
    /// The most requests ever running, and ever waiting, at once: what a gateway's
    /// admission in front let through (`peak_running`, `peak_waiting` in /sim/stats).
    peak_running: Cell<usize>,
    peak_waiting: Cell<usize>,
}

struct Waiter {
    need: u64,
    granted: Cell<bool>,
    cancelled: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

// === impl Gate ===

impl Gate {
    pub fn new(max_slots: usize, kv_tokens: u64) -> Rc<Self> {
        Rc::new(Self {
            max_slots,
            free_slots: Cell::new(max_slots),
            capacity: kv_tokens,
            free_tokens: Cell::new(kv_tokens),
            queue: RefCell::new(VecDeque::new()),
            waiting: Cell::new(0),
            peak_running: Cell::new(0),
            peak_waiting: Cell::new(0),
        })
    }

    pub fn running(&self) -> usize {
        self.max_slots - self.free_slots.get()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.get()
    }

    /// (most running, most waiting) at once so far.
    pub fn peaks(&self) -> (usize, usize) {
        (self.peak_running.get(), self.peak_waiting.get())
    }

    /// KV tokens reserved by running requests (0 when tokens are not limited).
    pub fn used_tokens(&self) -> u64 {
        self.capacity - self.free_tokens.get()
    }

    pub fn capacity_tokens(&self) -> u64 {
        self.capacity
    }

    /// Waits for a slot and `tokens` of KV cache.
    pub fn admit(self: &Rc<Self>, tokens: u64) -> Admit {
        let need = if self.capacity == 0 { 0 } else { tokens.min(self.capacity) };
        Admit { gate: self.clone(), need, waiter: None }
    }

    fn fits(&self, need: u64) -> bool {
        self.free_slots.get() > 0 && self.free_tokens.get() >= need
    }

    fn take(&self, need: u64) {
        self.free_slots.set(self.free_slots.get() - 1);
        self.peak_running.set(self.peak_running.get().max(self.running()));
        self.free_tokens.set(self.free_tokens.get() - need);
    }

    fn release(&self, need: u64) {
        self.free_slots.set(self.free_slots.get() + 1);
        self.free_tokens.set(self.free_tokens.get() + need);
        self.grant();
    }

    /// Admits waiters from the head while they fit (one release may admit several small ones).
    fn grant(&self) {
        loop {
            let mut q = self.queue.borrow_mut();
            let Some(front) = q.front() else { return };
            if front.cancelled.get() {
                q.pop_front();
                continue;
            }
            if !self.fits(front.need) {
                return;
            }
            let w = q.pop_front().unwrap_or_else(|| unreachable!("front exists"));
            drop(q);
            self.take(w.need);
            w.granted.set(true);
            self.waiting.set(self.waiting.get() - 1);
            let waker = w.waker.borrow_mut().take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }
}

pub struct Admit {
    gate: Rc<Gate>,
    need: u64,
    waiter: Option<Rc<Waiter>>,
}

impl Future for Admit {
    type Output = Ticket;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Ticket> {
        let need = self.need;
        if let Some(w) = &self.waiter {
            if w.granted.get() {
                self.waiter = None;
                return Poll::Ready(Ticket { gate: self.gate.clone(), need });
            }
            *w.waker.borrow_mut() = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let gate = &self.gate;
        if gate.queue.borrow().is_empty() && gate.fits(need) {
            gate.take(need);
            return Poll::Ready(Ticket { gate: gate.clone(), need });
        }
        let w = Rc::new(Waiter {
            need,
            granted: Cell::new(false),
            cancelled: Cell::new(false),
            waker: RefCell::new(Some(cx.waker().clone())),
        });
        gate.queue.borrow_mut().push_back(w.clone());
        gate.waiting.set(gate.waiting.get() + 1);
        gate.peak_waiting.set(gate.peak_waiting.get().max(gate.waiting.get()));
        self.waiter = Some(w);
        Poll::Pending
    }
}

impl Drop for Admit {
    fn drop(&mut self) {
        if let Some(w) = self.waiter.take() {
            if w.granted.get() {
                self.gate.release(self.need);
            } else {
                // A client gone while queued: it may have been blocking the head.
                w.cancelled.set(true);
                self.gate.waiting.set(self.gate.waiting.get() - 1);
                self.gate.grant();
            }
        }
    }
}

/// A running request's slot and KV reservation; dropping it admits the next waiters.
pub struct Ticket {
    gate: Rc<Gate>,
    need: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.gate.release(self.need);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::task::Wake;

    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }

    fn poll(f: &mut Admit) -> Option<Ticket> {
        let waker = Waker::from(Arc::new(Noop));
        match Pin::new(f).poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(t) => Some(t),
            Poll::Pending => None,
        }
    }

    #[test]
    fn tokens_and_slots_both_gate_fifo() {
        let g = Gate::new(3, 1000);
        let a = poll(&mut g.admit(600)).unwrap();
        let mut b = g.admit(600);
        assert!(poll(&mut b).is_none(), "600 + 600 > 1000");
        // A small one behind b waits too (no overtaking).
        let mut c = g.admit(100);
        assert!(poll(&mut c).is_none());
        assert_eq!((g.running(), g.waiting(), g.used_tokens()), (1, 2, 600));
        drop(a);
        // Both b and c fit now and are admitted together.
        let (b, c) = (poll(&mut b).unwrap(), poll(&mut c).unwrap());
        assert_eq!((g.running(), g.waiting(), g.used_tokens()), (2, 0, 700));
        drop((b, c));
        assert_eq!(g.used_tokens(), 0);
    }

    #[test]
    fn oversized_runs_alone_and_cancel_unblocks() {
        let g = Gate::new(2, 100);
        let big = poll(&mut g.admit(5_000)).unwrap();
        assert_eq!(g.used_tokens(), 100);
        let mut x = g.admit(10);
        assert!(poll(&mut x).is_none());
        let mut y = g.admit(50);
        assert!(poll(&mut y).is_none());
        drop(x);
        assert_eq!(g.waiting(), 1);
        drop(big);
        assert!(poll(&mut y).is_some());
        // Unlimited tokens: only slots count.
        let u = Gate::new(1, 0);
        let t = poll(&mut u.admit(1 << 40)).unwrap();
        assert!(poll(&mut u.admit(1)).is_none());
        drop(t);
    }
}
