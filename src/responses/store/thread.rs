//! The storage thread, `smg-history`: owns the backend and answers the shards' [`Ask`]s.
//! Memory answers each call in turn on a plain thread (a map lookup; no runtime). A remote
//! backend (Redis, PostgreSQL) runs on a current-thread tokio runtime, the calls concurrent,
//! because their client crates need tokio and a round trip must not hold up the next call.

use std::sync::Arc;
use std::time::Duration;

use super::history::{Ask, History};
use super::memory::Memory;
use super::postgres_store::PostgresHistory;
use super::record::{unix_now, Backend, Op, Remote, Reply};
use super::redis_store::RedisHistory;

/// Starts the storage thread for `backend`; `within` bounds each call a shard makes.
/// Err: a remote backend that cannot be reached at start (the gateway does not start, as
/// SMG does not).
pub fn start(backend: Backend, within: Duration) -> Result<History, String> {
    let (tx, rx) = flume::unbounded::<Ask>();
    // The memory store's writes: taken before each call, never a wake-up of their own.
    let (writes_tx, writes_rx) = flume::unbounded::<Op>();
    let stores = backend != Backend::None;
    let backend_kind = if matches!(backend, Backend::Memory(_)) { Kind::Memory } else { Kind::Other };
    let (ready_tx, ready_rx) = flume::bounded::<Result<(), String>>(1);
    std::thread::Builder::new()
        .name("smg-history".into())
        .spawn(move || match backend {
            Backend::Memory(limits) => {
                let _ = ready_tx.send(Ok(()));
                let mut m = Memory::new(limits);
                for ask in rx.iter() {
                    let now = unix_now();
                    for op in writes_rx.try_iter() {
                        m.apply(op, now);
                    }
                    let _ = ask.reply.send(Ok(m.apply(ask.op, now)));
                }
            }
            Backend::None => {
                let _ = ready_tx.send(Ok(()));
                for ask in rx.iter() {
                    let _ = ask.reply.send(Ok(nothing_stored(&ask.op)));
                }
            }
            remote => {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("history store runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(async move {
                    let store = match connect(remote, within).await {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    while let Ok(ask) = rx.recv_async().await {
                        let store = Arc::clone(&store);
                        tokio::spawn(async move {
                            let r = store.apply(ask.op, unix_now()).await;
                            let _ = ask.reply.send(r);
                        });
                    }
                });
            }
        })
        .map_err(|e| format!("history store thread: {e}"))?;
    ready_rx.recv().map_err(|_| "history store thread ended at start".to_string())??;
    let writes = matches!(backend_kind, Kind::Memory).then_some(writes_tx);
    Ok(History::new(tx, within, stores, writes))
}

enum Kind {
    Memory,
    Other,
}

/// `--history-backend none`: every read finds nothing, every write is dropped.
fn nothing_stored(op: &Op) -> Reply {
    match op {
        Op::GetResponse(_) => Reply::Response(None),
        Op::Chain(_) => Reply::Chain(None),
        Op::GetConversation(_) => Reply::Conversation(None),
        Op::ListItems { .. } => Reply::Items(Vec::new()),
        Op::GetItem { .. } => Reply::Item(None),
        Op::DeleteResponse(_) | Op::DeleteConversation(_) | Op::DeleteItem { .. } => Reply::Deleted(false),
        Op::Flush | Op::PutResponse(_) | Op::PutConversation(_) | Op::AppendItems { .. } => Reply::Done,
    }
}

/// The remote backend, connected (Err: the server cannot be reached within `within`).
async fn connect(backend: Backend, within: Duration) -> Result<Arc<dyn Remote>, String> {
    match backend {
        Backend::Redis { url, retention_days } => {
            Ok(Arc::new(RedisHistory::connect(&url, retention_days, within).await?))
        }
        Backend::Postgres { url } => Ok(Arc::new(PostgresHistory::connect(&url, within).await?)),
        Backend::Memory(_) | Backend::None => unreachable!("local backends have no connection"),
    }
}
