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
}

// === impl History ===

impl History {
    pub(crate) fn new(tx: flume::Sender<Ask>, within: Duration, stores: bool) -> Self {
        History { tx, within, stores }
    }

    /// Asks the storage thread; Err when it does not answer within the bound.
    pub(crate) async fn ask(&self, op: Op) -> Result<Reply, Unavailable> {
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
