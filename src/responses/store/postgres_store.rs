//! `--history-backend postgres`: stored responses and conversations in a PostgreSQL that
//! every gateway replica shares, so any replica chains off any other's responses. Answers
//! every [`Op`] as [`Memory`](super::memory::Memory) does; records are kept until deleted.
//!
//! The tables, created at connect when missing (`SCHEMA`): every record is its JSON
//! (`record`, as serde writes it), beside the columns the queries select and order by.
//! A conversation's items go with it (`ON DELETE CASCADE`). An item belongs to its
//! conversation: the same item id in two conversations is two rows (memory shares one), and
//! an id appended again keeps its first position with the newer record (memory lists it twice).
//!
//! Every call is one statement (prepared once per connection), so each is atomic without a
//! transaction and concurrent calls pipeline on the one connection: an append reserves its
//! positions by bumping the conversation's `next_position` (the row lock orders concurrent
//! appends, and a deleted conversation takes nothing), and the chain is one recursive query
//! bounded by [`MAX_CHAIN`].
//!
//! Runs on the history control thread (a current-thread tokio runtime), never on a shard.
//! A connection that closes or does not answer within the bound is dropped, and the next call
//! connects anew.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Mutex;
use tokio_postgres::{Client, Config, NoTls, Row, Statement};

use super::record::{Op, Remote, Reply, Unavailable, MAX_CHAIN};

/// The tables, made once by whichever replica connects first (the advisory lock keeps two
/// replicas' `CREATE`s apart: `IF NOT EXISTS` alone races). One simple query: one
/// transaction, the lock held to its end.
const SCHEMA: &str = "
SELECT pg_advisory_xact_lock(7164033585373930356);
CREATE TABLE IF NOT EXISTS smg_history_responses (
    id text PRIMARY KEY,
    previous text,
    created_at bigint NOT NULL,
    record text NOT NULL
);
CREATE TABLE IF NOT EXISTS smg_history_conversations (
    id text PRIMARY KEY,
    created_at bigint NOT NULL,
    next_position bigint NOT NULL DEFAULT 0,
    record text NOT NULL
);
CREATE TABLE IF NOT EXISTS smg_history_conversation_items (
    conversation_id text NOT NULL REFERENCES smg_history_conversations (id) ON DELETE CASCADE,
    item_id text NOT NULL,
    position bigint NOT NULL,
    created_at bigint NOT NULL,
    record text NOT NULL,
    PRIMARY KEY (conversation_id, item_id)
);
CREATE UNIQUE INDEX IF NOT EXISTS smg_history_conversation_items_position
    ON smg_history_conversation_items (conversation_id, position);
";

/// Whether `SCHEMA` is in place already (then it is not run: a role that may use the tables
/// need not be one that may create them).
const SCHEMA_IN_PLACE: &str = "
SELECT to_regclass('smg_history_responses') IS NOT NULL
    AND to_regclass('smg_history_conversations') IS NOT NULL
    AND to_regclass('smg_history_conversation_items') IS NOT NULL
    AND to_regclass('smg_history_conversation_items_position') IS NOT NULL";

const PUT_RESPONSE: &str = "
INSERT INTO smg_history_responses (id, previous, created_at, record) VALUES ($1, $2, $3, $4)
ON CONFLICT (id) DO UPDATE
    SET previous = excluded.previous, created_at = excluded.created_at, record = excluded.record";
const GET_RESPONSE: &str = "SELECT record FROM smg_history_responses WHERE id = $1";
const DELETE_RESPONSE: &str = "DELETE FROM smg_history_responses WHERE id = $1";
/// The response and those before it, oldest first: at most `$2 + 1` rows, so a chain longer
/// than the bound (or a loop) shows as too many rows, and a missing link as an oldest row
/// that still names a previous one.
const CHAIN: &str = "
WITH RECURSIVE chain (depth, previous, record) AS (
    SELECT 1::bigint, previous, record FROM smg_history_responses WHERE id = $1
  UNION ALL
    SELECT c.depth + 1, r.previous, r.record
    FROM chain c JOIN smg_history_responses r ON r.id = c.previous
    WHERE c.depth <= $2::bigint
)
SELECT previous, record FROM chain ORDER BY depth DESC";
const PUT_CONVERSATION: &str = "
INSERT INTO smg_history_conversations (id, created_at, record) VALUES ($1, $2, $3)
ON CONFLICT (id) DO UPDATE SET created_at = excluded.created_at, record = excluded.record";
const GET_CONVERSATION: &str = "SELECT record FROM smg_history_conversations WHERE id = $1";
const DELETE_CONVERSATION: &str = "DELETE FROM smg_history_conversations WHERE id = $1";
/// $1 the conversation, $2 how many items, $3.. their ids, times and records (ids distinct).
const APPEND_ITEMS: &str = "
WITH conv AS (
    UPDATE smg_history_conversations SET next_position = next_position + $2::bigint
    WHERE id = $1 RETURNING next_position - $2::bigint AS base
)
INSERT INTO smg_history_conversation_items (conversation_id, item_id, position, created_at, record)
SELECT $1, n.id, conv.base + n.ord, n.created_at, n.record
FROM conv, unnest($3::text[], $4::bigint[], $5::text[]) WITH ORDINALITY AS n (id, created_at, record, ord)
ON CONFLICT (conversation_id, item_id) DO UPDATE
    SET created_at = excluded.created_at, record = excluded.record";
const LIST_ASC: &str = "
SELECT record FROM smg_history_conversation_items WHERE conversation_id = $1
ORDER BY position LIMIT $2";
const LIST_DESC: &str = "
SELECT record FROM smg_history_conversation_items WHERE conversation_id = $1
ORDER BY position DESC LIMIT $2";
/// An unknown cursor's position is NULL: nothing compares greater, nothing is listed.
const LIST_ASC_AFTER: &str = "
SELECT record FROM smg_history_conversation_items WHERE conversation_id = $1 AND position >
    (SELECT position FROM smg_history_conversation_items WHERE conversation_id = $1 AND item_id = $2)
ORDER BY position LIMIT $3";
const LIST_DESC_AFTER: &str = "
SELECT record FROM smg_history_conversation_items WHERE conversation_id = $1 AND position <
    (SELECT position FROM smg_history_conversation_items WHERE conversation_id = $1 AND item_id = $2)
ORDER BY position DESC LIMIT $3";
const GET_ITEM: &str = "SELECT record FROM smg_history_conversation_items WHERE conversation_id = $1 AND item_id = $2";
const DELETE_ITEM: &str = "DELETE FROM smg_history_conversation_items WHERE conversation_id = $1 AND item_id = $2";

/// Every statement, prepared on a connection.
struct Statements {
    put_response: Statement,
    get_response: Statement,
    delete_response: Statement,
    chain: Statement,
    put_conversation: Statement,
    get_conversation: Statement,
    delete_conversation: Statement,
    append_items: Statement,
    list_asc: Statement,
    list_desc: Statement,
    list_asc_after: Statement,
    list_desc_after: Statement,
    get_item: Statement,
    delete_item: Statement,
}

// === impl Statements ===

impl Statements {
    async fn prepare(client: &Client) -> Result<Statements, tokio_postgres::Error> {
        Ok(Statements {
            put_response: client.prepare(PUT_RESPONSE).await?,
            get_response: client.prepare(GET_RESPONSE).await?,
            delete_response: client.prepare(DELETE_RESPONSE).await?,
            chain: client.prepare(CHAIN).await?,
            put_conversation: client.prepare(PUT_CONVERSATION).await?,
            get_conversation: client.prepare(GET_CONVERSATION).await?,
            delete_conversation: client.prepare(DELETE_CONVERSATION).await?,
            append_items: client.prepare(APPEND_ITEMS).await?,
            list_asc: client.prepare(LIST_ASC).await?,
            list_desc: client.prepare(LIST_DESC).await?,
            list_asc_after: client.prepare(LIST_ASC_AFTER).await?,
            list_desc_after: client.prepare(LIST_DESC_AFTER).await?,
            get_item: client.prepare(GET_ITEM).await?,
            delete_item: client.prepare(DELETE_ITEM).await?,
        })
    }
}

/// Ends the connection's task when the last call using it is done.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One connection, its statements, and the task that drives it.
struct Conn {
    client: Client,
    st: Statements,
    _task: AbortOnDrop,
}

/// `--history-backend postgres`.
pub(crate) struct PostgresHistory {
    config: Config,
    /// The connection calls share; None after it failed, until the next call connects.
    slot: Mutex<Option<Arc<Conn>>>,
    /// Bound on connecting and on each call.
    within: Duration,
}

// === impl PostgresHistory ===

impl PostgresHistory {
    /// Connects, creates the tables when missing and prepares the statements, within
    /// `within`. `url` is `postgres://user[:password]@host[:port]/database` (or libpq's
    /// `key=value` form); no TLS.
    pub(crate) async fn connect(url: &str, within: Duration) -> Result<PostgresHistory, String> {
        // The URL may carry a password: not in the error.
        let mut config: Config =
            url.parse().map_err(|e| format!("--history-backend postgres: the URL does not parse: {e}"))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(within);
        }
        if config.get_application_name().is_none() {
            config.application_name("smg");
        }
        let store = PostgresHistory { config, slot: Mutex::new(None), within };
        tokio::time::timeout(within, store.connection())
            .await
            .map_err(|_| format!("--history-backend postgres: no connection within {within:?}"))?
            .map_err(|Unavailable(e)| format!("--history-backend {e}"))?;
        Ok(store)
    }

    /// The shared connection, made anew when there is none or it closed.
    async fn connection(&self) -> Result<Arc<Conn>, Unavailable> {
        let mut slot = self.slot.lock().await;
        if let Some(conn) = slot.as_ref().filter(|c| !c.client.is_closed()) {
            return Ok(Arc::clone(conn));
        }
        *slot = None;
        let conn = Arc::new(self.open().await.map_err(|e| Unavailable(format!("postgres: {e}")))?);
        *slot = Some(Arc::clone(&conn));
        Ok(conn)
    }

    async fn open(&self) -> Result<Conn, tokio_postgres::Error> {
        let (client, connection) = self.config.connect(NoTls).await?;
        let task = AbortOnDrop(
            tokio::spawn(async move {
                let _ = connection.await;
            })
            .abort_handle(),
        );
        let in_place: bool = client.query_one(SCHEMA_IN_PLACE, &[]).await?.try_get(0)?;
        if !in_place {
            client.batch_execute(SCHEMA).await?;
        }
        let st = Statements::prepare(&client).await?;
        Ok(Conn { client, st, _task: task })
    }

    /// Drops `conn` (if it is still the shared one).
    async fn drop_connection(&self, conn: &Arc<Conn>) {
        let mut slot = self.slot.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *slot = None;
        }
    }

    async fn call(&self, op: Op, now: u64) -> Result<Reply, Unavailable> {
        let conn = tokio::time::timeout(self.within, self.connection()).await.map_err(|_| late(self.within))??;
        match tokio::time::timeout(self.within, run(&conn, op, now)).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(Failure::Postgres(e))) => {
                // A statement's error leaves the connection sound; a closed one is dropped
                // (the next call would see it closed anyway).
                if conn.client.is_closed() {
                    self.drop_connection(&conn).await;
                }
                Err(Unavailable(format!("postgres: {e}")))
            }
            Ok(Err(Failure::Record(e))) => Err(Unavailable(e)),
            Err(_) => {
                self.drop_connection(&conn).await;
                Err(late(self.within))
            }
        }
    }
}

impl Remote for PostgresHistory {
    fn apply(&self, op: Op, now: u64) -> Pin<Box<dyn Future<Output = Result<Reply, Unavailable>> + Send + '_>> {
        Box::pin(self.call(op, now))
    }
}

async fn run(conn: &Conn, op: Op, _now: u64) -> Result<Reply, Failure> {
    let (c, st) = (&conn.client, &conn.st);
    Ok(match op {
        Op::Flush => Reply::Done,
        Op::PutResponse(r) => {
            let record = encode(&*r)?;
            c.execute(&st.put_response, &[&r.id, &r.previous, &secs(r.created_at), &record]).await?;
            Reply::Done
        }
        Op::GetResponse(id) => {
            let row = c.query_opt(&st.get_response, &[&id]).await?;
            Reply::Response(row.map(|r| record(&r, 0)).transpose()?)
        }
        Op::Chain(id) => {
            let rows = c.query(&st.chain, &[&id, &(MAX_CHAIN as i64)]).await?;
            // Oldest first: complete when the oldest names no previous one.
            let complete = rows.len() <= MAX_CHAIN
                && rows.first().is_some_and(|oldest| oldest.get::<_, Option<String>>(0).is_none());
            Reply::Chain(if complete {
                Some(rows.iter().map(|r| record(r, 1)).collect::<Result<_, _>>()?)
            } else {
                None
            })
        }
        Op::DeleteResponse(id) => Reply::Deleted(c.execute(&st.delete_response, &[&id]).await? > 0),
        Op::PutConversation(conv) => {
            let record = encode(&conv)?;
            c.execute(&st.put_conversation, &[&conv.id, &secs(conv.created_at), &record]).await?;
            Reply::Done
        }
        Op::GetConversation(id) => {
            let row = c.query_opt(&st.get_conversation, &[&id]).await?;
            Reply::Conversation(row.map(|r| record(&r, 0)).transpose()?)
        }
        Op::DeleteConversation(id) => Reply::Deleted(c.execute(&st.delete_conversation, &[&id]).await? > 0),
        Op::AppendItems { conversation, items } => {
            // One row per id (a statement may not update a row twice): the first position,
            // the last record.
            let mut ids: Vec<&str> = Vec::with_capacity(items.len());
            let mut times = Vec::with_capacity(items.len());
            let mut records = Vec::with_capacity(items.len());
            for item in &items {
                let record = encode(item)?;
                match ids.iter().position(|id| *id == item.id) {
                    Some(i) => {
                        times[i] = secs(item.created_at);
                        records[i] = record;
                    }
                    None => {
                        ids.push(&item.id);
                        times.push(secs(item.created_at));
                        records.push(record);
                    }
                }
            }
            if !ids.is_empty() {
                let n = ids.len() as i64;
                c.execute(&st.append_items, &[&conversation, &n, &ids, &times, &records]).await?;
            }
            Reply::Done
        }
        Op::ListItems { conversation, after, limit, ascending } => {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = match (after, ascending) {
                (None, true) => c.query(&st.list_asc, &[&conversation, &limit]).await?,
                (None, false) => c.query(&st.list_desc, &[&conversation, &limit]).await?,
                (Some(after), true) => c.query(&st.list_asc_after, &[&conversation, &after, &limit]).await?,
                (Some(after), false) => c.query(&st.list_desc_after, &[&conversation, &after, &limit]).await?,
            };
            Reply::Items(rows.iter().map(|r| record(r, 0)).collect::<Result<_, _>>()?)
        }
        Op::GetItem { conversation, item } => {
            let row = c.query_opt(&st.get_item, &[&conversation, &item]).await?;
            Reply::Item(row.map(|r| record(&r, 0)).transpose()?)
        }
        Op::DeleteItem { conversation, item } => {
            Reply::Deleted(c.execute(&st.delete_item, &[&conversation, &item]).await? > 0)
        }
    })
}

/// Why a call failed: PostgreSQL, or a record that does not read back.
enum Failure {
    Postgres(tokio_postgres::Error),
    Record(String),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Postgres(e)
    }
}

/// Unix seconds as a `bigint`.
fn secs(t: u64) -> i64 {
    i64::try_from(t).unwrap_or(i64::MAX)
}

fn encode<T: Serialize>(record: &T) -> Result<String, Failure> {
    sonic_rs::to_string(record).map_err(|e| Failure::Record(format!("postgres: a record did not encode: {e}")))
}

/// The record in column `i` of `row`.
fn record<T: DeserializeOwned>(row: &Row, i: usize) -> Result<T, Failure> {
    let text: &str = row.try_get(i)?;
    sonic_rs::from_str(text).map_err(|e| Failure::Record(format!("postgres: a stored record does not read: {e}")))
}

fn late(within: Duration) -> Unavailable {
    Unavailable(format!("postgres: no answer within {within:?}"))
}
