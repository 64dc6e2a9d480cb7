//! Single-thread async primitives (no locks, no Send): a FIFO semaphore for batch slots, a one-shot event, a work queue.
//!
//! Everything here lives on one shard's runtime, so `Cell`/`RefCell` are enough and cheaper than
//! the cross-thread versions.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// Parks `waker` unless an equivalent one is already parked (a task re-polled in a loop would otherwise grow the list).
fn park(list: &RefCell<Vec<Waker>>, waker: &Waker) {
    let mut list = list.borrow_mut();
    if !list.iter().any(|w| w.will_wake(waker)) {
        list.push(waker.clone());
    }
}

/// A one-shot broadcast: once fired, every current and future `wait()` completes.
#[derive(Default)]
pub struct Event {
    fired: Cell<bool>,
    wakers: RefCell<Vec<Waker>>,
}

// === impl Event ===

impl Event {
    pub fn fire(&self) {
        self.fired.set(true);
        for w in self.wakers.borrow_mut().drain(..) {
            w.wake();
        }
    }

    pub fn is_fired(&self) -> bool {
        self.fired.get()
    }

    pub fn wait(&self) -> EventWait<'_> {
        EventWait { event: self }
    }
}

pub struct EventWait<'a> {
    event: &'a Event,
}

impl Future for EventWait<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.event.fired.get() {
            return Poll::Ready(());
        }
        park(&self.event.wakers, cx.waker());
        Poll::Pending
    }
}

/// A FIFO counting semaphore. Waiters are served in arrival order, which is how an engine's waiting queue admits requests.
pub struct Semaphore {
    permits: Cell<usize>,
    queue: RefCell<VecDeque<Rc<Waiter>>>,
    waiting: Cell<usize>,
}

#[derive(Default)]
struct Waiter {
    granted: Cell<bool>,
    cancelled: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

// === impl Semaphore ===

impl Semaphore {
    pub fn new(permits: usize) -> Rc<Self> {
        Rc::new(Self { permits: Cell::new(permits), queue: RefCell::new(VecDeque::new()), waiting: Cell::new(0) })
    }

    /// Requests queued for a permit right now.
    pub fn waiting(&self) -> usize {
        self.waiting.get()
    }

    pub fn available(&self) -> usize {
        self.permits.get()
    }

    pub fn acquire(self: &Rc<Self>) -> Acquire {
        Acquire { sem: self.clone(), waiter: None }
    }

    /// Hands the permit straight to the oldest live waiter, so a newcomer cannot overtake the queue.
    fn release(&self) {
        loop {
            let next = self.queue.borrow_mut().pop_front();
            match next {
                Some(w) if w.cancelled.get() => continue,
                Some(w) => {
                    w.granted.set(true);
                    self.waiting.set(self.waiting.get() - 1);
                    if let Some(waker) = w.waker.borrow_mut().take() {
                        waker.wake();
                    }
                    return;
                }
                None => {
                    self.permits.set(self.permits.get() + 1);
                    return;
                }
            }
        }
    }
}

pub struct Acquire {
    sem: Rc<Semaphore>,
    waiter: Option<Rc<Waiter>>,
}

impl Future for Acquire {
    type Output = Permit;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Permit> {
        if let Some(w) = &self.waiter {
            if w.granted.get() {
                self.waiter = None;
                return Poll::Ready(Permit { sem: self.sem.clone() });
            }
            *w.waker.borrow_mut() = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let sem = &self.sem;
        if sem.permits.get() > 0 && sem.queue.borrow().is_empty() {
            sem.permits.set(sem.permits.get() - 1);
            return Poll::Ready(Permit { sem: sem.clone() });
        }
        let w = Rc::new(Waiter::default());
        *w.waker.borrow_mut() = Some(cx.waker().clone());
        sem.queue.borrow_mut().push_back(w.clone());
        sem.waiting.set(sem.waiting.get() + 1);
        self.waiter = Some(w);
        Poll::Pending
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        // Dropped while queued: a permit may already have been handed over; give it back.
        if let Some(w) = self.waiter.take() {
            if w.granted.get() {
                self.sem.release();
            } else {
                w.cancelled.set(true);
                self.sem.waiting.set(self.sem.waiting.get() - 1);
            }
        }
    }
}

/// A held slot; dropping it admits the next waiter.
pub struct Permit {
    sem: Rc<Semaphore>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.sem.release();
    }
}

/// A multi-consumer work queue: the open-loop generator pushes tickets, connection tasks pop them.
pub struct WorkQueue<T> {
    items: RefCell<VecDeque<T>>,
    closed: Cell<bool>,
    idle: RefCell<Vec<Waker>>,
}

// === impl WorkQueue ===

impl<T> WorkQueue<T> {
    pub fn new() -> Rc<Self> {
        Rc::new(Self { items: RefCell::new(VecDeque::new()), closed: Cell::new(false), idle: RefCell::new(Vec::new()) })
    }

    /// Queues `item`; returns false when no consumer was parked (the caller may add one).
    pub fn push(&self, item: T) -> bool {
        self.items.borrow_mut().push_back(item);
        let waker = self.idle.borrow_mut().pop();
        match waker {
            Some(w) => {
                w.wake();
                true
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.items.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.borrow().is_empty()
    }

    /// No more items will come; parked consumers finish once the queue drains.
    pub fn close(&self) {
        self.closed.set(true);
        for w in self.idle.borrow_mut().drain(..) {
            w.wake();
        }
    }

    pub fn pop(&self) -> Pop<'_, T> {
        Pop { queue: self }
    }
}

pub struct Pop<'a, T> {
    queue: &'a WorkQueue<T>,
}

impl<T> Future for Pop<'_, T> {
    type Output = Option<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if let Some(item) = self.queue.items.borrow_mut().pop_front() {
            return Poll::Ready(Some(item));
        }
        if self.queue.closed.get() {
            return Poll::Ready(None);
        }
        park(&self.queue.idle, cx.waker());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semaphore_is_fifo_and_cancel_safe() {
        crate::rt::block_on(async {
            let sem = Semaphore::new(1);
            let p1 = sem.acquire().await;
            let order = Rc::new(RefCell::new(Vec::new()));
            let mut handles = Vec::new();
            for i in 0..3 {
                let (sem, order) = (sem.clone(), order.clone());
                handles.push(monoio::spawn(async move {
                    let _p = sem.acquire().await;
                    order.borrow_mut().push(i);
                    monoio::time::sleep(std::time::Duration::from_millis(1)).await;
                }));
                // Let the task enqueue itself before the next one.
                monoio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            assert_eq!(sem.waiting(), 3);
            // A cancelled waiter must not swallow a permit.
            {
                let fut = sem.acquire();
                drop(fut);
            }
            drop(p1);
            for h in handles {
                h.await;
            }
            assert_eq!(*order.borrow(), vec![0, 1, 2]);
            assert_eq!(sem.available(), 1);
            assert_eq!(sem.waiting(), 0);
        })
        .unwrap();
    }

    #[test]
    fn queue_drains_then_ends() {
        crate::rt::block_on(async {
            let q = WorkQueue::new();
            let q2 = q.clone();
            let consumer = monoio::spawn(async move {
                let mut got = Vec::new();
                while let Some(v) = q2.pop().await {
                    got.push(v);
                }
                got
            });
            monoio::time::sleep(std::time::Duration::from_millis(1)).await;
            assert!(q.push(1));
            q.push(2);
            q.close();
            assert_eq!(consumer.await, vec![1, 2]);
        })
        .unwrap();
    }

    #[test]
    fn event_wakes_waiters() {
        crate::rt::block_on(async {
            let ev = Rc::new(Event::default());
            let ev2 = ev.clone();
            let h = monoio::spawn(async move { ev2.wait().await });
            monoio::time::sleep(std::time::Duration::from_millis(1)).await;
            ev.fire();
            h.await;
            assert!(ev.is_fired());
        })
        .unwrap();
    }
}
