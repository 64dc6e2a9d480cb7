//! The shards' side of the storage thread: a call, and its bound.

use std::time::Duration;

use super::record::{Op, Reply, Unavailable};

/// A message to the storage thread.
pub(crate) struct Ask {
    pub op: Op,
    pub reply: flume::Sender<Result<Reply, Unavailable>>,
}

/// A shard's way to the storage thread.
#[derive(Clone)]
pub struct History {
    tx: flume::Sender<Ask>,
    /// Each call's bound (`--redis-op-timeout-secs` / `--postgres-op-timeout-secs`; memory
    /// answers at once).
    within: Duration,
    /// `--history-backend none`.
    pub stores: bool,
    /// The memory store's writes (None for the others): a write there cannot fail, so it
    /// is queued, not awaited.
    writes: Option<flume::Sender<Op>>,
}

/// The memory store's queued writes wake its thread once this many wait (a read takes them
/// before it is answered, whenever it comes): one wake-up per so many turns, not one each.
const WAKE_EVERY: usize = 32;

// === impl History ===

impl History {
    pub(crate) fn new(
        tx: flume::Sender<Ask>,
        within: Duration,
        stores: bool,
        writes: Option<flume::Sender<Op>>,
    ) -> Self {
        History { tx, within, stores, writes }
    }

    /// A write. In memory it is queued and not awaited: the storage thread applies the
    /// queued writes before it answers any call, so every later read (a chained turn, from
    /// any shard) finds it, and no turn pays for waking another thread, nor for being woken
    /// by it (measured, responses-1k: 80 µs of CPU a turn with the write awaited, against
    /// chat-1k's 51). A remote store's write is awaited: it can fail, and a response says it
    /// is stored only when it is. `--history-backend none` drops it.
    pub(crate) async fn write(&self, op: Op) -> Result<(), Unavailable> {
        if !self.stores {
            return Ok(());
        }
        let Some(writes) = &self.writes else { return self.ask(op).await.map(|_| ()) };
        writes.send(op).map_err(|_| Unavailable("the storage thread is gone".into()))?;
        if writes.len() >= WAKE_EVERY {
            let (reply, _) = flume::bounded(1);
            let _ = self.tx.send(Ask { op: Op::Flush, reply });
        }
        Ok(())
    }

    /// Asks the storage thread; Err when it does not answer within the bound.
    pub async fn ask(&self, op: Op) -> Result<Reply, Unavailable> {
        let (reply, rx) = flume::bounded(1);
        if self.tx.send(Ask { op, reply }).is_err() {
            return Err(Unavailable("the storage thread is gone".into()));
        }
        monoio::select! {
            r = rx.recv_async() => r.unwrap_or_else(|_| Err(Unavailable("the storage thread dropped the call".into()))),
            _ = crate::io::sleep(self.within) => Err(Unavailable("the history store did not answer in time".into())),
        }
    }
}
