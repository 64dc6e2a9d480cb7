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

#[cfg(test)]
mod tests {
    use std::fs::{File, OpenOptions};
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    use std::path::PathBuf;
    use std::process::{Child, Command, Stdio};

    use super::super::record::Backend;
    use super::super::redis_store::testkit::{self, block_on, eventually, free_port, signal, Server, BOOT, WITHIN};
    use super::super::thread::start;

    /// A PostgreSQL of the test's own: a fresh cluster (initdb) in a temporary directory,
    /// served on a free loopback port (no Unix socket), stopped on drop. PostgreSQL refuses
    /// to run as root: as root, the cluster belongs to the `postgres` user (the Debian
    /// package's, which .ci/run installs) and both programs run as it.
    struct Postgres {
        dir: PathBuf,
        port: u16,
        /// (uid, gid) to run as, when this process is root.
        owner: Option<(u32, u32)>,
        child: Option<Child>,
    }

    impl Postgres {
        async fn start() -> Postgres {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!("smg-history-pg-{}-{port}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let owner = unprivileged_owner();
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
            }
            let mut pg = Postgres { dir, port, owner, child: None };
            let log = File::create(pg.dir.join("initdb.log")).unwrap();
            let ok = pg
                .command("initdb")
                .arg("-D")
                .arg(pg.data())
                .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .status()
                .expect("initdb does not run (.ci/run installs PostgreSQL)")
                .success();
            assert!(ok, "initdb failed: {}", pg.log("initdb.log"));
            pg.spawn().await;
            pg
        }

        fn data(&self) -> PathBuf {
            self.dir.join("data")
        }

        fn log(&self, name: &str) -> String {
            std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
        }

        /// One of PostgreSQL's programs, run as the cluster's owner.
        fn command(&self, program: &str) -> Command {
            let mut c = Command::new(pg_bin(program));
            c.current_dir(&self.dir).stdin(Stdio::null());
            if let Some((uid, gid)) = self.owner {
                // std drops the supplementary groups too when root sets a uid.
                c.uid(uid).gid(gid);
            }
            c
        }

        async fn spawn(&mut self) {
            let log = OpenOptions::new().create(true).append(true).open(self.dir.join("postgres.log")).unwrap();
            let child = self
                .command("postgres")
                .arg("-D")
                .arg(self.data())
                .args(["-p", &self.port.to_string(), "-c", "listen_addresses=127.0.0.1"])
                .args(["-c", "unix_socket_directories=", "-c", "fsync=off"])
                .args(["-c", "shared_buffers=16MB", "-c", "max_connections=20"])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("postgres does not run (.ci/run installs PostgreSQL)");
            let pid = child.id();
            self.child = Some(child);
            let (pidfile, port) = (self.data().join("postmaster.pid"), self.port);
            let child = self.child.as_mut().unwrap();
            let mut exited = false;
            let ready = eventually(BOOT, || {
                exited = matches!(child.try_wait(), Ok(Some(_)));
                exited || ready(&pidfile, pid, port)
            })
            .await;
            assert!(ready && !exited, "postgres never became ready: {}", self.log("postgres.log"));
        }

        fn pid(&self) -> u32 {
            self.child.as_ref().expect("running").id()
        }
    }

    impl Server for Postgres {
        fn backend(&self) -> Backend {
            Backend::Postgres { url: format!("postgres://postgres@127.0.0.1:{}/postgres", self.port) }
        }

        fn durable(&self) -> bool {
            true
        }

        /// The postmaster first (it forks no more), then its children (each backend is a
        /// session of its own: a process group's signal would miss them).
        fn freeze(&self) {
            for pid in family(self.pid()) {
                signal("STOP", &pid.to_string());
            }
        }

        fn thaw(&self) {
            for pid in family(self.pid()) {
                signal("CONT", &pid.to_string());
            }
        }

        /// Immediate shutdown (SIGQUIT): the postmaster ends its backends and exits at once,
        /// as a crash would (the next start recovers from the WAL).
        fn kill(&mut self) {
            if let Some(mut c) = self.child.take() {
                for pid in family(c.id()) {
                    signal("CONT", &pid.to_string());
                }
                signal("QUIT", &c.id().to_string());
                let _ = c.wait();
            }
        }

        async fn restart(&mut self) {
            self.kill();
            self.spawn().await;
        }
    }

    impl Drop for Postgres {
        fn drop(&mut self) {
            self.kill();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// The postmaster `pid` and its children (from /proc: the 4th field of `stat`, after the
    /// parenthesised name, is the parent).
    fn family(pid: u32) -> Vec<u32> {
        let children = std::fs::read_dir("/proc").into_iter().flatten().flatten().filter_map(|e| {
            let child: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let parent: u32 = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            (parent == pid).then_some(child)
        });
        std::iter::once(pid).chain(children).collect()
    }

    /// postmaster.pid names this postmaster and says it accepts connections (its 8th line),
    /// and the port answers.
    fn ready(pidfile: &std::path::Path, pid: u32, port: u16) -> bool {
        let Ok(s) = std::fs::read_to_string(pidfile) else { return false };
        let lines: Vec<&str> = s.lines().collect();
        lines.first() == Some(&pid.to_string().as_str())
            && lines.get(7).is_some_and(|l| l.trim() == "ready")
            && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    }

    /// Root's stand-in: the `postgres` user (or `nobody`). None when not root.
    fn unprivileged_owner() -> Option<(u32, u32)> {
        if std::fs::metadata("/proc/self").ok()?.uid() != 0 {
            return None;
        }
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let user = |name: &str| {
            passwd.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                if f.len() > 3 && f[0] == name {
                    Some((f[2].parse().ok()?, f[3].parse().ok()?))
                } else {
                    None
                }
            })
        };
        Some(
            user("postgres")
                .or_else(|| user("nobody"))
                .expect("root, and no postgres or nobody user to run PostgreSQL"),
        )
    }

    /// A PostgreSQL program: on PATH, else the newest in Debian's /usr/lib/postgresql/<v>/bin
    /// (the package keeps the server's programs off PATH).
    fn pg_bin(name: &str) -> PathBuf {
        let on_path = std::env::var_os("PATH")
            .and_then(|path| std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()));
        if let Some(p) = on_path {
            return p;
        }
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin").join(name))))
            .filter(|(_, p)| p.is_file())
            .collect();
        versions.sort();
        versions.pop().map(|(_, p)| p).unwrap_or_else(|| PathBuf::from(name))
    }

    #[test]
    fn every_op_answers_as_memory_does_and_replicas_share_the_store() {
        block_on(async {
            let server = Postgres::start().await;
            // Two replicas making the tables at once, on a fresh database.
            let (h, other) = std::thread::scope(|s| {
                let other = s.spawn(|| start(server.backend(), WITHIN));
                (start(server.backend(), WITHIN), other.join().unwrap())
            });
            let (h, _other) = (h.expect("start"), other.expect("start at the same time"));
            testkit::every_op_as_memory(&h).await;
            testkit::two_replicas(server.backend()).await;
        });
    }

    #[test]
    fn an_outage_answers_unavailable_in_time_and_a_restart_heals() {
        block_on(async {
            let mut server = Postgres::start().await;
            testkit::outage(&mut server).await;
        });
    }

    #[test]
    fn start_fails_without_a_server() {
        block_on(async {
            let url = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
            testkit::unreachable_at_start(Backend::Postgres { url });
        });
    }
}
