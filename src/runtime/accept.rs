//! One shard's accept loop, its inbox task and its ticker.
//!
//! The accept loop races nothing: a `select!` between `accept()` and the inbox, rebuilt every
//! iteration, dropped an accept the kernel had already completed whenever the inbox won
//! (about 1 connection in 2,000 on io_uring with two shards: accepted, never read, its
//! descriptor leaked in CLOSE-WAIT). Now inbox messages have their own task, and drain ends
//! the loop by cancelling the pending accept and still awaiting it: an accept that completed
//! before the cancel comes back with its connection, which is served. The listening socket
//! itself is left alone, so a successor that inherited it (a binary upgrade) keeps accepting.
//!
//! At the shard's share of `--max-connections` the loop parks until a connection closes, so
//! the kernel's backlog holds new clients instead of us running out of descriptors. Accept
//! errors back off (10 ms doubling to 1 s) and are logged once per second with a count.

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::admission::permits::PoolMsg;
use crate::admission::priority::SchedMsg;
use crate::io::{self, TcpListener};
use crate::kv::index::KvUpdate;
use crate::shard::{Shard, ShardMsg};

/// How often a shard hands its cache-aware inserts to its peers. A conversation's next turn
/// arrives seconds later, so 100 ms keeps every shard's tree current (see routing/cache_aware.rs).
const TICK: Duration = Duration::from_millis(100);
/// Ticks between the slow chores (pool sweep, routing ages): about once a second.
const SLOW_EVERY: u32 = 10;

/// How long a drain waits for connections that have not sent their first request (taken
/// from the backlog as it began): a client sends its request right after connecting.
const FIRST_REQUEST_IN_DRAIN: Duration = Duration::from_secs(2);

/// Accepts until drained, then waits for in-flight requests (bounded by the grace period).
/// `systemd_socket`: the listener is systemd's, which keeps its queue when we close ours.
pub async fn serve(
    shard: Rc<Shard>,
    listener: TcpListener,
    inbox: flume::Receiver<ShardMsg>,
    unbounded: UnboundedInbox,
    systemd_socket: bool,
) {
    let listener = Rc::new(listener);
    let ticker = monoio::spawn(tick(Rc::clone(&shard)));
    let messages = monoio::spawn(receive(Rc::clone(&shard), inbox));
    let permits = monoio::spawn(receive_unbounded(Rc::clone(&shard), unbounded));
    accept_loop(&shard, &listener).await;
    if !shard.hands_over() && !systemd_socket {
        super::backlog::drain(&shard, &listener).await;
    }
    drop(listener);
    let now = crate::clock::now();
    let deadline = now + shard.cfg().shutdown_grace;
    let unread_until = now + FIRST_REQUEST_IN_DRAIN.min(shard.cfg().shutdown_grace);
    // A handover also waits for idle keep-alive clients (each leaves after one more request).
    let busy = |s: &Shard| {
        s.inflight() > 0
            || (s.hands_over() && s.connections() > 0)
            || (s.unread() > 0 && crate::clock::now() < unread_until)
    };
    while busy(&shard) && crate::clock::now() < deadline {
        io::sleep(Duration::from_millis(10)).await;
    }
    if busy(&shard) {
        crate::warn!(
            "shard {}: grace period over with {} requests in flight, {} connections open",
            shard.index(),
            shard.inflight(),
            shard.connections()
        );
    }
    drop(ticker);
    drop(messages);
    drop(permits);
}

async fn accept_loop(shard: &Rc<Shard>, listener: &TcpListener) {
    let mut backoff = Duration::ZERO;
    let mut errors = ErrorLog::default();
    loop {
        let slot = loop {
            if shard.is_draining() {
                return;
            }
            match shard.open_connection() {
                Some(slot) => break slot,
                None => shard.slot_free().await,
            }
        };
        match listener.cancelable_accept(shard.accept_handle()).await {
            Ok((stream, _peer)) => {
                backoff = Duration::ZERO;
                monoio::spawn(crate::serve::connection(Rc::clone(shard), stream, slot));
            }
            Err(_) if shard.is_draining() => return,
            Err(e) => {
                drop(slot);
                errors.record(shard.index(), &e);
                if io::is_resource_exhaustion(&e) || backoff > Duration::ZERO {
                    backoff = (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                    io::sleep(backoff).await;
                }
            }
        }
    }
}

/// Accept errors, logged at most once a second with how many there were.
#[derive(Default)]
struct ErrorLog {
    since: Option<Instant>,
    count: u64,
}

impl ErrorLog {
    fn record(&mut self, shard: usize, e: &std::io::Error) {
        self.count += 1;
        let now = crate::clock::now();
        if self.since.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
            crate::warn!("shard {shard}: accept failed {} time(s) in the last second: {e}", self.count);
            self.since = Some(now);
            self.count = 0;
        }
    }
}

/// The inbox: digests and loads from peers, drain from the control thread.
async fn receive(shard: Rc<Shard>, inbox: flume::Receiver<ShardMsg>) {
    loop {
        let go_on = match inbox.recv_async().await {
            Ok(msg) => shard.on_message(msg),
            Err(_) => false,
        };
        if !go_on {
            shard.start_drain();
            return;
        }
    }
}

/// A shard's unbounded channels: from its peers, permits (the admission permits, when the
/// scheduler does not replace them, and the PD pools) and scheduler slots; from the KV-cache
/// events thread, index changes. None may drop a message: a lost permit, slot or change
/// stays lost.
pub struct UnboundedInbox {
    pub permits: flume::Receiver<PoolMsg>,
    pub sched: flume::Receiver<SchedMsg>,
    pub kv: flume::Receiver<Arc<KvUpdate>>,
}

/// Permits (admission/permits.rs, admission/pd.rs), scheduler slots (admission/priority/)
/// and KV index changes (kv/).
async fn receive_unbounded(shard: Rc<Shard>, inbox: UnboundedInbox) {
    let permits = async {
        while let Ok(msg) = inbox.permits.recv_async().await {
            shard.on_permit_message(msg);
        }
    };
    let sched = async {
        while let Ok(msg) = inbox.sched.recv_async().await {
            shard.on_sched_message(msg);
        }
    };
    let kv = async {
        while let Ok(u) = inbox.kv.recv_async().await {
            shard.on_kv_update(&u);
        }
    };
    // Each ends only when its channel closes (every sender gone).
    monoio::join!(permits, sched, kv);
}

async fn tick(shard: Rc<Shard>) {
    let mut n = 0u32;
    loop {
        io::sleep(TICK).await;
        n = n.wrapping_add(1);
        shard.tick(n.is_multiple_of(SLOW_EVERY));
    }
}
