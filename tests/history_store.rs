//! The remote history stores (`--history-backend redis|postgres`, src/responses/store/)
//! against real servers (tests/support's redis-server and PostgreSQL): every operation answers
//! as the memory store does, two replicas share the store, an outage answers `Unavailable`
//! within the bound and heals, and Redis keys carry the retention. Through the store's own
//! handle (`start`, `History::ask`), on the shards' kind of runtime; the gateway's use of it
//! through the binary is tests/responses_storage.rs.
// A test's threads are not shards: they read the clock and wait.
#![allow(clippy::disallowed_methods)]

mod support;

use std::future::Future;
use std::process::Command;
use std::time::Duration;

use smg::responses::store::{
    start, unix_now, Backend, Conversation, History, Item, Memory, MemoryLimits, Op, Reply, StoredResponse,
    Unavailable, MAX_CHAIN,
};
use support::free_port;
use support::postgres_server::PostgresServer;
use support::redis_server::RedisServer;

/// Each call's bound in the tests.
const WITHIN: Duration = Duration::from_secs(2);
/// How long a server may take to come up (PostgreSQL's crash recovery included).
const BOOT: Duration = Duration::from_secs(60);

/// Runs `f` on a shard's kind of runtime (monoio), as `History::ask` is used.
fn block_on<F: Future>(f: F) -> F::Output {
    let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new().enable_timer().build().expect("monoio runtime");
    rt.block_on(f)
}

/// `kill -s <sig> -- <target>` (a negative target: a process group).
fn signal(sig: &str, target: &str) {
    let _ = Command::new("kill").args(["-s", sig, "--", target]).stderr(std::process::Stdio::null()).status();
}

/// A server of the test's own, which the outage suite stops and brings back.
trait Server {
    fn backend(&self) -> Backend;
    /// Whether records survive `kill` and `restart`.
    fn durable(&self) -> bool;
    /// Stops answering (SIGSTOP), connections held open.
    fn freeze(&self);
    fn thaw(&self);
    /// Gone: connections broken, new ones refused.
    fn kill(&mut self);
    /// Up again on the same port (after `kill`), once it answers.
    async fn restart(&mut self);
}

fn response(id: &str, previous: Option<&str>) -> Op {
    Op::PutResponse(Box::new(StoredResponse {
        id: id.into(),
        tenant: Some("tenant-a".into()),
        previous: previous.map(Into::into),
        conversation: Some("conv-x".into()),
        created_at: 1_700_000_000,
        input: vec![format!(r#"{{"id":"in-{id}","type":"message","content":"h\u00e9llo \"quoted\" ✓"}}"#)],
        output: vec![format!(r#"{{"id":"out-{id}","type":"message"}}"#), "{}".into()],
        body: format!(r#"{{"id":"{id}","object":"response"}}"#),
        context: vec![("user".into(), "u-1".into())],
    }))
}

fn conversation(id: &str, metadata: Option<&str>) -> Op {
    Op::PutConversation(Conversation {
        id: id.into(),
        tenant: Some("tenant-a".into()),
        created_at: 1_700_000_000,
        metadata: metadata.map(Into::into),
    })
}

fn append(conversation: &str, ids: &[&str]) -> Op {
    let items = ids
        .iter()
        .map(|i| Item {
            id: (*i).into(),
            json: format!(r#"{{"id":"{i}","type":"message"}}"#),
            created_at: 1_700_000_001,
        })
        .collect();
    Op::AppendItems { conversation: conversation.into(), items }
}

fn list(conversation: &str, after: Option<&str>, limit: usize, ascending: bool) -> Op {
    Op::ListItems { conversation: conversation.into(), after: after.map(Into::into), limit, ascending }
}

fn get_item(conversation: &str, item: &str) -> Op {
    Op::GetItem { conversation: conversation.into(), item: item.into() }
}

fn delete_item(conversation: &str, item: &str) -> Op {
    Op::DeleteItem { conversation: conversation.into(), item: item.into() }
}

/// The ids a chain or a list answered (None: no chain).
fn ids(reply: &Reply) -> Option<Vec<String>> {
    match reply {
        Reply::Chain(c) => c.as_ref().map(|c| c.iter().map(|r| r.id.clone()).collect()),
        Reply::Items(i) => Some(i.iter().map(|i| i.id.clone()).collect()),
        r => panic!("not a chain or a list: {r:?}"),
    }
}

fn some(ids: &[&str]) -> Option<Vec<String>> {
    Some(ids.iter().map(|i| (*i).to_string()).collect())
}

/// The remote store and a [`Memory`], asked the same.
struct Both<'a> {
    remote: &'a History,
    memory: Memory,
}

impl Both<'_> {
    /// The remote's answer, which must be memory's.
    async fn ask(&mut self, op: Op) -> Reply {
        let want = self.memory.apply(op.clone(), unix_now());
        let got = self.remote.ask(op.clone()).await.unwrap_or_else(|e| panic!("{op:?}: {e:?}"));
        assert_eq!(got, want, "{op:?}");
        got
    }
}

/// Every op, answered as memory answers it (memory.rs's tests, and more).
async fn every_op_as_memory(h: &History) {
    let mut b = Both { remote: h, memory: Memory::new(MemoryLimits::default()) };

    // Responses and their chains.
    assert_eq!(b.ask(response("a", None)).await, Reply::Done);
    b.ask(response("b", Some("a"))).await;
    b.ask(response("c", Some("b"))).await;
    assert_eq!(ids(&b.ask(Op::Chain("c".into())).await), some(&["a", "b", "c"]));
    assert!(matches!(b.ask(Op::GetResponse("b".into())).await, Reply::Response(Some(_))));
    assert_eq!(b.ask(Op::GetResponse("zzz".into())).await, Reply::Response(None));
    assert_eq!(ids(&b.ask(Op::Chain("zzz".into())).await), None);
    assert_eq!(b.ask(Op::DeleteResponse("a".into())).await, Reply::Deleted(true));
    assert_eq!(b.ask(Op::DeleteResponse("a".into())).await, Reply::Deleted(false));
    assert_eq!(ids(&b.ask(Op::Chain("c".into())).await), None, "a link is missing");
    assert_eq!(ids(&b.ask(Op::Chain("b".into())).await), None);
    // A put replaces: c no longer follows b.
    b.ask(response("c", None)).await;
    assert_eq!(ids(&b.ask(Op::Chain("c".into())).await), some(&["c"]));
    // A loop of previous ids, and the bound: MAX_CHAIN links answer, one more does not.
    b.ask(response("x", Some("y"))).await;
    b.ask(response("y", Some("x"))).await;
    assert_eq!(ids(&b.ask(Op::Chain("x".into())).await), None, "a loop");
    for i in 0..=MAX_CHAIN {
        let previous = (i > 0).then(|| format!("long-{}", i - 1));
        b.ask(response(&format!("long-{i}"), previous.as_deref())).await;
    }
    let longest = ids(&b.ask(Op::Chain(format!("long-{}", MAX_CHAIN - 1))).await).expect("MAX_CHAIN links");
    assert_eq!((longest.len(), longest[0].as_str()), (MAX_CHAIN, "long-0"));
    assert_eq!(ids(&b.ask(Op::Chain(format!("long-{MAX_CHAIN}"))).await), None, "longer than MAX_CHAIN");

    // Conversations and their items.
    assert_eq!(b.ask(conversation("c1", None)).await, Reply::Done);
    assert!(matches!(b.ask(Op::GetConversation("c1".into())).await, Reply::Conversation(Some(_))));
    assert_eq!(b.ask(append("c1", &["1", "2", "3"])).await, Reply::Done);
    assert_eq!(ids(&b.ask(list("c1", None, 10, true)).await), some(&["1", "2", "3"]));
    assert_eq!(ids(&b.ask(list("c1", None, 2, false)).await), some(&["3", "2"]));
    assert_eq!(ids(&b.ask(list("c1", Some("1"), 10, true)).await), some(&["2", "3"]));
    assert_eq!(ids(&b.ask(list("c1", Some("3"), 10, false)).await), some(&["2", "1"]));
    assert_eq!(ids(&b.ask(list("c1", Some("2"), 1, true)).await), some(&["3"]));
    assert_eq!(ids(&b.ask(list("c1", Some("3"), 10, true)).await), some(&[]));
    assert_eq!(ids(&b.ask(list("c1", Some("x"), 10, true)).await), some(&[]), "an unknown cursor");
    assert_eq!(ids(&b.ask(list("c1", Some("x"), 10, false)).await), some(&[]));
    assert_eq!(ids(&b.ask(list("c1", None, 0, true)).await), some(&[]));
    assert_eq!(ids(&b.ask(list("c1", None, usize::MAX, false)).await), some(&["3", "2", "1"]));
    // A conversation that is not stored takes no items.
    assert_eq!(b.ask(append("nope", &["9"])).await, Reply::Done);
    assert_eq!(b.ask(Op::GetConversation("nope".into())).await, Reply::Conversation(None));
    assert_eq!(ids(&b.ask(list("nope", None, 10, true)).await), some(&[]));
    assert_eq!(b.ask(get_item("nope", "9")).await, Reply::Item(None));
    // An item is found only through its own conversation.
    b.ask(conversation("c2", None)).await;
    b.ask(append("c2", &["4"])).await;
    assert!(matches!(b.ask(get_item("c1", "2")).await, Reply::Item(Some(_))));
    assert_eq!(b.ask(get_item("c2", "2")).await, Reply::Item(None));
    assert_eq!(b.ask(get_item("c1", "4")).await, Reply::Item(None));
    // Replacing the record keeps the items.
    b.ask(conversation("c1", Some(r#"{"topic":"demo"}"#))).await;
    assert!(matches!(
        b.ask(Op::GetConversation("c1".into())).await,
        Reply::Conversation(Some(Conversation { metadata: Some(_), .. }))
    ));
    assert_eq!(ids(&b.ask(list("c1", None, 10, true)).await), some(&["1", "2", "3"]));
    // Deleting an item.
    assert_eq!(b.ask(delete_item("c1", "2")).await, Reply::Deleted(true));
    assert_eq!(b.ask(delete_item("c1", "2")).await, Reply::Deleted(false));
    assert_eq!(b.ask(delete_item("c2", "1")).await, Reply::Deleted(false), "not linked to c2");
    assert_eq!(b.ask(delete_item("nope", "1")).await, Reply::Deleted(false));
    assert_eq!(ids(&b.ask(list("c1", None, 10, true)).await), some(&["1", "3"]));
    assert_eq!(b.ask(get_item("c1", "2")).await, Reply::Item(None));
    assert_eq!(ids(&b.ask(list("c1", Some("2"), 10, true)).await), some(&[]), "a deleted cursor");
    b.ask(append("c1", &["5", "6"])).await;
    assert_eq!(ids(&b.ask(list("c1", None, 10, true)).await), some(&["1", "3", "5", "6"]));
    assert_eq!(ids(&b.ask(list("c1", Some("3"), 10, false)).await), some(&["1"]));
    // Deleting the conversation takes its items, and only its.
    assert_eq!(b.ask(Op::DeleteConversation("c1".into())).await, Reply::Deleted(true));
    assert_eq!(b.ask(Op::DeleteConversation("c1".into())).await, Reply::Deleted(false));
    assert_eq!(b.ask(Op::GetConversation("c1".into())).await, Reply::Conversation(None));
    assert_eq!(ids(&b.ask(list("c1", None, 10, true)).await), some(&[]));
    assert_eq!(b.ask(get_item("c1", "1")).await, Reply::Item(None));
    assert_eq!(ids(&b.ask(list("c2", None, 10, true)).await), some(&["4"]));
    b.ask(conversation("c1", None)).await;
    assert_eq!(ids(&b.ask(list("c1", None, 10, true)).await), some(&[]), "a new c1 starts empty");
    b.ask(append("c1", &["7"])).await;
    assert_eq!(ids(&b.ask(list("c1", None, 10, true)).await), some(&["7"]));

    // Where a remote store differs from memory, by design: an item belongs to its
    // conversation, and an id appended again keeps its first position, newer record.
    let ask = |op: Op| async move { h.ask(op).await.unwrap_or_else(|e| panic!("{e:?}")) };
    ask(conversation("d1", None)).await;
    ask(conversation("d2", None)).await;
    ask(append("d1", &["p", "q", "p"])).await;
    ask(append("d2", &["p"])).await;
    let again = Item { id: "p".into(), json: r#"{"id":"p","v":2}"#.into(), created_at: 5 };
    ask(Op::AppendItems { conversation: "d1".into(), items: vec![again.clone()] }).await;
    assert_eq!(ids(&ask(list("d1", None, 10, true)).await), some(&["p", "q"]));
    assert_eq!(ask(get_item("d1", "p")).await, Reply::Item(Some(again)));
    assert_eq!(ask(delete_item("d1", "p")).await, Reply::Deleted(true));
    assert_eq!(ids(&ask(list("d2", None, 10, true)).await), some(&["p"]), "d2's own p stays");
    assert!(matches!(ask(get_item("d2", "p")).await, Reply::Item(Some(_))));
}

/// Two gateway replicas (two `start`s) on one store: each chains off the other's
/// responses, and their concurrent appends to one conversation stay whole.
async fn two_replicas(backend: Backend) {
    let a = start(backend.clone(), WITHIN).expect("replica a");
    let b = start(backend, WITHIN).expect("replica b");
    a.ask(response("rep-1", None)).await.unwrap();
    b.ask(response("rep-2", Some("rep-1"))).await.unwrap();
    a.ask(response("rep-3", Some("rep-2"))).await.unwrap();
    let on_b = b.ask(Op::Chain("rep-3".into())).await.unwrap();
    assert_eq!(ids(&on_b), some(&["rep-1", "rep-2", "rep-3"]));
    assert_eq!(a.ask(Op::Chain("rep-3".into())).await.unwrap(), on_b);

    a.ask(conversation("rep-c", None)).await.unwrap();
    let appends = (0..20).map(|k| {
        let h = if k % 2 == 0 { &a } else { &b };
        let (first, second) = (format!("{k}-a"), format!("{k}-b"));
        async move { h.ask(append("rep-c", &[&first, &second])).await }
    });
    for r in futures_util::future::join_all(appends).await {
        assert_eq!(r.unwrap(), Reply::Done);
    }
    let listed = ids(&b.ask(list("rep-c", None, 100, true)).await.unwrap()).unwrap();
    assert_eq!(listed.len(), 40, "{listed:?}");
    for pair in listed.chunks(2) {
        let k = pair[0].strip_suffix("-a").unwrap_or_else(|| panic!("an append was split: {listed:?}"));
        assert_eq!(pair[1], format!("{k}-b"), "an append was split: {listed:?}");
    }
    assert!(matches!(a.ask(get_item("rep-c", "7-b")).await.unwrap(), Reply::Item(Some(_))));
    assert_eq!(b.ask(Op::DeleteConversation("rep-c".into())).await.unwrap(), Reply::Deleted(true));
    assert_eq!(a.ask(Op::GetConversation("rep-c".into())).await.unwrap(), Reply::Conversation(None));
}

/// One call: Unavailable, answered within the bound.
async fn unavailable_in_time(h: &History, what: &str) {
    let t = smg::clock::now();
    let r = h.ask(Op::GetResponse("o-1".into())).await;
    let took = smg::clock::now() - t;
    assert!(matches!(r, Err(Unavailable(_))), "{what}: {r:?}");
    assert!(took < WITHIN + Duration::from_secs(2), "{what}: answered after {took:?}");
}

/// Calls succeed again within `BOOT` (through the patience factor): polled, the signal being
/// a call that succeeds.
async fn answers_again(h: &History) -> bool {
    let until = smg::clock::now() + support::patience(BOOT);
    loop {
        if h.ask(Op::GetResponse("o-1".into())).await.is_ok() {
            return true;
        }
        if smg::clock::now() >= until {
            return false;
        }
        smg::io::sleep(Duration::from_millis(20)).await;
    }
}

/// The server freezes, then dies: every call answers Unavailable within the bound (none
/// hangs), and once the server is back the same handle works again.
async fn outage(server: &mut impl Server) {
    let h = start(server.backend(), WITHIN).expect("start");
    h.ask(response("o-1", None)).await.unwrap();
    h.ask(response("o-2", Some("o-1"))).await.unwrap();

    server.freeze();
    unavailable_in_time(&h, "frozen").await;
    unavailable_in_time(&h, "still frozen").await;
    server.thaw();
    assert!(answers_again(&h).await, "never answered again after a freeze");
    assert_eq!(ids(&h.ask(Op::Chain("o-2".into())).await.unwrap()), some(&["o-1", "o-2"]));

    server.kill();
    unavailable_in_time(&h, "killed").await;
    unavailable_in_time(&h, "still down").await;
    server.restart().await;
    assert!(answers_again(&h).await, "never answered again after a restart");
    if server.durable() {
        assert_eq!(ids(&h.ask(Op::Chain("o-2".into())).await.unwrap()), some(&["o-1", "o-2"]));
    }
    h.ask(response("o-3", Some("o-2"))).await.unwrap();
    assert!(matches!(h.ask(Op::GetResponse("o-3".into())).await.unwrap(), Reply::Response(Some(_))));
}

/// `start` refuses a server that is not there, within the bound.
fn unreachable_at_start(backend: Backend) {
    let t = smg::clock::now();
    let r = start(backend, WITHIN);
    let took = smg::clock::now() - t;
    let Err(e) = r else { panic!("started without a server") };
    assert!(e.starts_with("--history-backend"), "{e}");
    assert!(took < WITHIN + Duration::from_secs(2), "refused after {took:?}");
}

impl Server for RedisServer {
    fn backend(&self) -> Backend {
        Backend::Redis { url: self.url(), retention_days: 1 }
    }

    fn durable(&self) -> bool {
        false
    }

    fn freeze(&self) {
        signal("STOP", &self.pid().to_string());
    }

    fn thaw(&self) {
        signal("CONT", &self.pid().to_string());
    }

    fn kill(&mut self) {
        RedisServer::kill(self);
    }

    async fn restart(&mut self) {
        RedisServer::restart(self);
    }
}

impl Server for PostgresServer {
    fn backend(&self) -> Backend {
        Backend::Postgres { url: self.url() }
    }

    fn durable(&self) -> bool {
        true
    }

    fn freeze(&self) {
        PostgresServer::freeze(self);
    }

    fn thaw(&self) {
        PostgresServer::thaw(self);
    }

    fn kill(&mut self) {
        PostgresServer::kill(self);
    }

    async fn restart(&mut self) {
        PostgresServer::restart(self);
    }
}

#[test]
fn redis_answers_every_op_as_memory_does_and_replicas_share_it() {
    block_on(async {
        let server = RedisServer::start();
        let h = start(server.backend(), WITHIN).expect("start");
        every_op_as_memory(&h).await;
        two_replicas(server.backend()).await;
    });
}

#[test]
fn a_redis_outage_answers_unavailable_in_time_and_a_restart_heals() {
    block_on(async {
        let mut server = RedisServer::start();
        outage(&mut server).await;
    });
}

#[test]
fn redis_start_fails_without_a_server() {
    block_on(async {
        unreachable_at_start(Backend::Redis { url: format!("redis://127.0.0.1:{}", free_port()), retention_days: 1 });
    });
}

/// The keys, and the retention on every one written: a day, or none with -1.
#[test]
fn every_redis_key_written_gets_the_retention() {
    block_on(async {
        let server = RedisServer::start();
        let mut raw = redis::Client::open(server.url()).unwrap().get_connection().unwrap();
        let mut ttl = |key: &str| -> i64 { redis::cmd("TTL").arg(key).query(&mut raw).unwrap() };
        for (retention_days, tag) in [(1, "day"), (-1, "kept")] {
            let h = start(Backend::Redis { url: server.url(), retention_days }, WITHIN).expect("start");
            h.ask(response(&format!("r-{tag}"), None)).await.unwrap();
            let conversation = Conversation { id: format!("c-{tag}"), tenant: None, created_at: 0, metadata: None };
            h.ask(Op::PutConversation(conversation)).await.unwrap();
            let item = Item { id: "i".into(), json: r#"{"id":"i"}"#.into(), created_at: 0 };
            let append = Op::AppendItems { conversation: format!("c-{tag}"), items: vec![item] };
            assert_eq!(h.ask(append).await.unwrap(), Reply::Done);
            for key in [
                format!("smg:history:response:r-{tag}"),
                format!("smg:history:conversation:c-{tag}"),
                format!("smg:history:conversation-order:c-{tag}"),
                format!("smg:history:conversation-items:c-{tag}"),
            ] {
                let t = ttl(&key);
                match retention_days {
                    1 => assert!((86_000..=86_400).contains(&t), "{key}: TTL {t}"),
                    _ => assert_eq!(t, -1, "{key}: TTL {t} (-2: no such key)"),
                }
            }
        }
    });
}

#[test]
fn postgres_answers_every_op_as_memory_does_and_replicas_share_it() {
    block_on(async {
        let server = PostgresServer::start();
        // Two replicas making the tables at once, on a fresh database.
        let (h, other) = std::thread::scope(|s| {
            let other = s.spawn(|| start(server.backend(), WITHIN));
            (start(server.backend(), WITHIN), other.join().unwrap())
        });
        let (h, _other) = (h.expect("start"), other.expect("start at the same time"));
        every_op_as_memory(&h).await;
        two_replicas(server.backend()).await;
    });
}

#[test]
fn a_postgres_outage_answers_unavailable_in_time_and_a_restart_heals() {
    block_on(async {
        let mut server = PostgresServer::start();
        outage(&mut server).await;
    });
}

#[test]
fn postgres_start_fails_without_a_server() {
    block_on(async {
        let url = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
        unreachable_at_start(Backend::Postgres { url });
    });
}
