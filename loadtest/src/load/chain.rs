//! Stateful load: Responses conversations whose turns chain off the previous answer by
//! `previous_response_id`, as an agent or chat client holding no history sends them.
//!
//! A chained turn cannot be built before its previous turn is answered, so the pool of
//! prebuilt requests does not carry these scenarios: a [`Chain`] holds every conversation's
//! turns unchained, and each load thread keeps its virtual users ([`Users`]): a user is a
//! conversation in progress, the turn it sends next and the id of its last answer. A send
//! takes the user idle longest (or begins a new conversation when none is idle), sends its
//! turn with `"previous_response_id"` spliced in, and hands it back with the answer's `id`:
//! it then waits for its next send, or, after its last turn, or a turn that failed or was
//! answered without an id, its conversation ends and a later send begins another. In a closed
//! loop there are at most as many users as connections; in an open loop, as many as the turns
//! in flight at once. Every turn is one request of the report (latency, CPU per request: per
//! turn), and the report counts first and chained turns and conversations cut short.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;
use sonic_rs::JsonValueTrait;

use crate::load::client::build_request;
use crate::sim::render::put_json_str;

/// A chained scenario's turns, for every thread's users.
pub struct Chain {
    turns: usize,
    /// Turn t of pool conversation c at `c * turns + t`, without `previous_response_id`.
    bodies: Vec<Vec<u8>>,
    path: String,
    host: String,
    headers: Vec<String>,
}

/// One virtual user between two turns of its conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// The conversation's number in the run (the pool's conversations repeat past their count).
    pub conversation: usize,
    /// The turn it sends next, from 0.
    pub turn: usize,
    /// The id of its last answer: what the next turn chains off (None for a first turn).
    pub previous: Option<String>,
}

/// What the report counts of chained conversations.
#[derive(Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChainCounts {
    /// Turns that began a conversation (no `previous_response_id`).
    pub first_turns: u64,
    /// Turns sent with `previous_response_id` from the answer before.
    pub chained_turns: u64,
    /// Conversations ended before their last turn: a turn failed, or its answer carried no `id`.
    pub cut_short: u64,
}

// === impl Chain ===

impl Chain {
    pub fn new(turns: usize, bodies: Vec<Vec<u8>>, path: &str, host: &str, headers: &[String]) -> Self {
        Self { turns: turns.max(1), bodies, path: path.into(), host: host.into(), headers: headers.to_vec() }
    }

    pub fn turns(&self) -> usize {
        self.turns
    }

    /// The user's next turn as a complete request.
    pub fn request(&self, user: &User) -> Bytes {
        let conversations = (self.bodies.len() / self.turns).max(1);
        let at = (user.conversation % conversations) * self.turns + user.turn.min(self.turns - 1);
        let body = self.bodies.get(at).map_or(&b"{}"[..], Vec::as_slice);
        match &user.previous {
            None => build_request("POST", &self.path, &self.host, &self.headers, body),
            Some(id) => build_request("POST", &self.path, &self.host, &self.headers, &chained_body(body, id)),
        }
    }
}

/// `body` (a JSON object) with `"previous_response_id": id` as its first key.
pub fn chained_body(body: &[u8], id: &str) -> Vec<u8> {
    let rest = body.strip_prefix(b"{").unwrap_or(body);
    let mut b = Vec::with_capacity(body.len() + id.len() + 32);
    b.extend_from_slice(b"{\"previous_response_id\":");
    put_json_str(&mut b, id);
    if !rest.trim_ascii_start().starts_with(b"}") {
        b.push(b',');
    }
    b.extend_from_slice(rest);
    b
}

/// A response object's `id`: what the next turn chains off. None when the body is no JSON
/// object or has no string `id`.
pub fn response_id(body: &[u8]) -> Option<String> {
    let v = sonic_rs::get(body, &["id"]).ok()?;
    v.as_str().filter(|s| !s.is_empty()).map(str::to_string)
}

/// One load thread's users. Thread t of T numbers its conversations t, t+T, t+2T, … so the
/// threads together walk the pool's conversations in order.
pub struct Users {
    chain: Arc<Chain>,
    /// Users whose last turn is answered, longest idle first.
    idle: RefCell<VecDeque<User>>,
    begun: Cell<usize>,
    thread_index: usize,
    threads: usize,
}

// === impl Users ===

impl Users {
    pub fn new(chain: Arc<Chain>, thread_index: usize, threads: usize) -> Self {
        Self { chain, idle: RefCell::default(), begun: Cell::new(0), thread_index, threads: threads.max(1) }
    }

    pub fn chain(&self) -> &Chain {
        &self.chain
    }

    /// The user whose turn goes next: the one idle longest, else the first of a new conversation.
    pub fn take(&self) -> User {
        if let Some(u) = self.idle.borrow_mut().pop_front() {
            return u;
        }
        let n = self.begun.get();
        self.begun.set(n + 1);
        User { conversation: n * self.threads + self.thread_index, turn: 0, previous: None }
    }

    /// Hands `user` back after its turn, `answer_id` being the id its answer carried (None:
    /// the turn failed or the answer had none). True when the conversation was cut short.
    pub fn give_back(&self, mut user: User, answer_id: Option<String>) -> bool {
        let Some(id) = answer_id else { return true };
        if user.turn + 1 < self.chain.turns {
            user.turn += 1;
            user.previous = Some(id);
            self.idle.borrow_mut().push_back(user);
        }
        false
    }

    /// Users waiting for their next turn.
    pub fn idle(&self) -> usize {
        self.idle.borrow().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(turns: usize, conversations: usize) -> Arc<Chain> {
        let bodies = (0..conversations * turns).map(|i| format!("{{\"input\":\"c{}t{}\"}}", i / turns, i % turns));
        Arc::new(Chain::new(turns, bodies.map(String::into_bytes).collect(), "/v1/responses", "h:1", &[]))
    }

    fn body_of(req: &Bytes) -> sonic_rs::Value {
        let at = memchr::memmem::find(req, b"\r\n\r\n").unwrap() + 4;
        sonic_rs::from_slice(&req[at..]).unwrap()
    }

    #[test]
    fn the_previous_answers_id_is_spliced_in_first() {
        assert_eq!(chained_body(br#"{"model":"m"}"#, "resp_1"), br#"{"previous_response_id":"resp_1","model":"m"}"#);
        assert_eq!(chained_body(b"{}", "a\"b"), br#"{"previous_response_id":"a\"b"}"#);
        assert_eq!(response_id(br#"{"id":"resp_9","object":"response"}"#).as_deref(), Some("resp_9"));
        assert_eq!(response_id(br#"{"error":{"id":"x"}}"#), None);
        assert_eq!(response_id(br#"{"id":""}"#), None);
        assert_eq!(response_id(b"not json"), None);
    }

    #[test]
    fn a_user_walks_its_conversation_then_begins_another() {
        let users = Users::new(chain(3, 2), 1, 2);
        let u = users.take();
        assert_eq!(u, User { conversation: 1, turn: 0, previous: None });
        let req = users.chain().request(&u);
        assert!(req.starts_with(b"POST /v1/responses HTTP/1.1\r\nhost: h:1\r\n"));
        let v = body_of(&req);
        assert_eq!(v["input"].as_str(), Some("c1t0"));
        assert!(v.get("previous_response_id").is_none());
        assert!(!users.give_back(u, Some("resp_a".into())));
        let u = users.take();
        assert_eq!((u.turn, u.previous.as_deref()), (1, Some("resp_a")));
        let v = body_of(&users.chain().request(&u));
        assert_eq!(v["previous_response_id"].as_str(), Some("resp_a"));
        assert_eq!(v["input"].as_str(), Some("c1t1"));
        users.give_back(u, Some("resp_b".into()));
        let u = users.take();
        assert_eq!(body_of(&users.chain().request(&u))["previous_response_id"].as_str(), Some("resp_b"));
        // The last turn answered: the conversation ends; the next send begins this thread's next.
        assert!(!users.give_back(u, Some("resp_c".into())));
        assert_eq!(users.idle(), 0);
        let u = users.take();
        assert_eq!(u, User { conversation: 3, turn: 0, previous: None });
        // Conversation 3 is the pool's conversation 1 again.
        assert_eq!(body_of(&users.chain().request(&u))["input"].as_str(), Some("c1t0"));
        // A failed turn (or an answer without an id) cuts the conversation short.
        assert!(users.give_back(u, None));
        assert_eq!(users.idle(), 0);
    }

    #[test]
    fn users_take_turns_longest_idle_first() {
        let users = Users::new(chain(10, 4), 0, 1);
        let (a, b) = (users.take(), users.take());
        assert_eq!((a.conversation, b.conversation), (0, 1));
        users.give_back(b, Some("rb".into()));
        users.give_back(a, Some("ra".into()));
        assert_eq!(users.take().previous.as_deref(), Some("rb"));
        assert_eq!(users.take().previous.as_deref(), Some("ra"));
        assert_eq!(users.take().conversation, 2, "none idle: a new conversation");
    }
}
