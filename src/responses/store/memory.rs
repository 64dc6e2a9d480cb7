//! The memory backend (`--history-backend memory`, the default): maps on the storage
//! thread, bounded as SMG's `--history-memory-*` flags say. On every write the oldest
//! records go first past a count bound, and records older than the retention go (a
//! conversation counts from its last use). Time is the caller's `now`, in unix seconds.

use std::collections::VecDeque;

// Keyed by ids a client may choose (items, lookups): a randomly keyed hash, faster than SipHash.
use ahash::AHashMap as HashMap;

use super::record::{Conversation, Item, MemoryLimits, Op, Reply, StoredResponse, MAX_CHAIN};

struct Conv {
    record: Conversation,
    /// Its items' ids, in the order they were added.
    items: Vec<String>,
    last_used: u64,
}

#[derive(Default)]
pub struct Memory {
    limits: MemoryLimits,
    responses: HashMap<String, StoredResponse>,
    /// Response ids, oldest first (a deleted one stays until it reaches the front).
    response_order: VecDeque<(String, u64)>,
    conversations: HashMap<String, Conv>,
    items: HashMap<String, Item>,
    /// Item ids, oldest first.
    item_order: VecDeque<(String, u64)>,
    /// When idle conversations were last looked for.
    swept: u64,
}

// === impl Memory ===

impl Memory {
    pub fn new(limits: MemoryLimits) -> Self {
        Memory { limits, ..Memory::default() }
    }

    pub fn apply(&mut self, op: Op, now: u64) -> Reply {
        match op {
            Op::Flush => Reply::Done,
            Op::PutResponse(r) => {
                let r = *r;
                self.response_order.push_back((r.id.clone(), now));
                self.responses.insert(r.id.clone(), r);
                self.evict(now);
                Reply::Done
            }
            Op::GetResponse(id) => Reply::Response(self.responses.get(&id).cloned().map(Box::new)),
            Op::Chain(id) => Reply::Chain(self.chain(&id)),
            Op::DeleteResponse(id) => Reply::Deleted(self.responses.remove(&id).is_some()),
            Op::PutConversation(c) => {
                match self.conversations.get_mut(&c.id) {
                    Some(conv) => {
                        conv.record = c;
                        conv.last_used = now;
                    }
                    None => {
                        let id = c.id.clone();
                        self.conversations.insert(id, Conv { record: c, items: Vec::new(), last_used: now });
                    }
                }
                self.evict(now);
                Reply::Done
            }
            Op::GetConversation(id) => Reply::Conversation(self.conversations.get_mut(&id).map(|c| {
                c.last_used = now;
                c.record.clone()
            })),
            Op::DeleteConversation(id) => {
                let Some(conv) = self.conversations.remove(&id) else { return Reply::Deleted(false) };
                for item in conv.items {
                    self.items.remove(&item);
                }
                Reply::Deleted(true)
            }
            Op::AppendItems { conversation, items } => {
                let Some(conv) = self.conversations.get_mut(&conversation) else { return Reply::Done };
                conv.last_used = now;
                for item in items {
                    conv.items.push(item.id.clone());
                    self.item_order.push_back((item.id.clone(), now));
                    self.items.insert(item.id.clone(), item);
                }
                self.evict(now);
                Reply::Done
            }
            Op::ListItems { conversation, after, limit, ascending } => {
                let Some(conv) = self.conversations.get(&conversation) else { return Reply::Items(Vec::new()) };
                let live = |id: &&String| self.items.contains_key(*id);
                let ordered: Box<dyn Iterator<Item = &String>> =
                    if ascending { Box::new(conv.items.iter()) } else { Box::new(conv.items.iter().rev()) };
                let mut ordered = ordered.filter(live).peekable();
                if let Some(after) = after {
                    // Past the cursor; an unknown cursor lists nothing.
                    for id in ordered.by_ref() {
                        if *id == after {
                            break;
                        }
                    }
                }
                Reply::Items(ordered.take(limit).filter_map(|id| self.items.get(id).cloned()).collect())
            }
            Op::GetItem { conversation, item } => {
                let linked = self.conversations.get(&conversation).is_some_and(|c| c.items.contains(&item));
                Reply::Item(if linked { self.items.get(&item).cloned() } else { None })
            }
            Op::DeleteItem { conversation, item } => {
                let Some(conv) = self.conversations.get_mut(&conversation) else { return Reply::Deleted(false) };
                let before = conv.items.len();
                conv.items.retain(|i| *i != item);
                let removed = conv.items.len() != before;
                if removed {
                    self.items.remove(&item);
                }
                Reply::Deleted(removed)
            }
        }
    }

    fn chain(&self, id: &str) -> Option<Vec<StoredResponse>> {
        let mut out = Vec::new();
        let mut next = Some(id.to_string());
        while let Some(id) = next {
            if out.len() >= MAX_CHAIN {
                return None;
            }
            let r = self.responses.get(&id)?;
            next = r.previous.clone();
            out.push(r.clone());
        }
        out.reverse();
        Some(out)
    }

    /// The bounds, applied on a write.
    fn evict(&mut self, now: u64) {
        let old = |at: u64| self.limits.retention_secs > 0 && now.saturating_sub(at) > self.limits.retention_secs;
        while let Some((id, at)) = self.response_order.front() {
            if self.response_order.len() <= self.limits.max_responses && !old(*at) {
                break;
            }
            let id = id.clone();
            self.response_order.pop_front();
            self.responses.remove(&id);
        }
        while let Some((id, at)) = self.item_order.front() {
            if self.item_order.len() <= self.limits.max_items && !old(*at) {
                break;
            }
            let id = id.clone();
            self.item_order.pop_front();
            self.items.remove(&id);
        }
        // Idle conversations are looked for once a second, not on every write (a scan of
        // them all).
        if self.limits.retention_secs > 0 && now != self.swept {
            self.swept = now;
            self.conversations.retain(|_, c| now.saturating_sub(c.last_used) <= self.limits.retention_secs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(id: &str, previous: Option<&str>) -> Op {
        Op::PutResponse(Box::new(StoredResponse {
            id: id.into(),
            tenant: None,
            previous: previous.map(Into::into),
            conversation: None,
            created_at: 0,
            input: vec![format!("{{\"id\":\"in-{id}\"}}")],
            output: vec![],
            body: "{}".into(),
            context: vec![],
        }))
    }

    fn chain_ids(m: &mut Memory, id: &str) -> Option<Vec<String>> {
        match m.apply(Op::Chain(id.into()), 0) {
            Reply::Chain(c) => c.map(|c| c.into_iter().map(|r| r.id).collect()),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn a_chain_is_oldest_first_and_missing_when_a_link_is() {
        let mut m = Memory::new(MemoryLimits::default());
        m.apply(response("a", None), 0);
        m.apply(response("b", Some("a")), 0);
        m.apply(response("c", Some("b")), 0);
        assert_eq!(chain_ids(&mut m, "c"), Some(vec!["a".into(), "b".into(), "c".into()]));
        assert_eq!(m.apply(Op::DeleteResponse("a".into()), 0), Reply::Deleted(true));
        assert_eq!(m.apply(Op::DeleteResponse("a".into()), 0), Reply::Deleted(false));
        assert_eq!(chain_ids(&mut m, "c"), None);
        assert_eq!(chain_ids(&mut m, "zzz"), None);
    }

    #[test]
    fn a_loop_of_previous_ids_is_refused() {
        let mut m = Memory::new(MemoryLimits::default());
        m.apply(response("a", Some("b")), 0);
        m.apply(response("b", Some("a")), 0);
        assert_eq!(chain_ids(&mut m, "a"), None);
    }

    #[test]
    fn the_oldest_responses_go_past_the_count_and_the_retention() {
        let got = |m: &mut Memory, id: &str| matches!(m.apply(Op::GetResponse(id.into()), 0), Reply::Response(Some(_)));
        let mut m = Memory::new(MemoryLimits { max_responses: 2, max_items: 10, retention_secs: 0 });
        for id in ["a", "b", "c"] {
            m.apply(response(id, None), 0);
        }
        assert!(!got(&mut m, "a") && got(&mut m, "b") && got(&mut m, "c"));
        let mut m = Memory::new(MemoryLimits { max_responses: 10, max_items: 10, retention_secs: 100 });
        m.apply(response("a", None), 0);
        m.apply(response("b", None), 50);
        // At 120, a is 120 s old (past the retention), b 70 s.
        m.apply(response("c", None), 120);
        assert!(!got(&mut m, "a") && got(&mut m, "b") && got(&mut m, "c"));
    }

    fn conv(m: &mut Memory, id: &str, now: u64) {
        let c = Conversation { id: id.into(), tenant: None, created_at: now, metadata: None };
        m.apply(Op::PutConversation(c), now);
    }

    fn items(ids: &[&str]) -> Vec<Item> {
        ids.iter().map(|i| Item { id: (*i).into(), json: format!("{{\"id\":\"{i}\"}}"), created_at: 0 }).collect()
    }

    fn list(m: &mut Memory, after: Option<&str>, limit: usize, ascending: bool) -> Vec<String> {
        let op = Op::ListItems { conversation: "c".into(), after: after.map(Into::into), limit, ascending };
        match m.apply(op, 0) {
            Reply::Items(i) => i.into_iter().map(|i| i.id).collect(),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn items_list_in_order_after_a_cursor_and_leave_with_their_conversation() {
        let mut m = Memory::new(MemoryLimits::default());
        conv(&mut m, "c", 0);
        m.apply(Op::AppendItems { conversation: "c".into(), items: items(&["1", "2", "3"]) }, 0);
        assert_eq!(list(&mut m, None, 10, true), ["1", "2", "3"]);
        assert_eq!(list(&mut m, None, 2, false), ["3", "2"]);
        assert_eq!(list(&mut m, Some("1"), 10, true), ["2", "3"]);
        assert_eq!(list(&mut m, Some("x"), 10, true), Vec::<String>::new());
        assert_eq!(m.apply(Op::DeleteItem { conversation: "c".into(), item: "2".into() }, 0), Reply::Deleted(true));
        assert_eq!(list(&mut m, None, 10, true), ["1", "3"]);
        assert_eq!(m.apply(Op::GetItem { conversation: "c".into(), item: "2".into() }, 0), Reply::Item(None));
        assert_eq!(m.apply(Op::DeleteConversation("c".into()), 0), Reply::Deleted(true));
        assert!(m.items.is_empty());
        assert_eq!(m.apply(Op::GetConversation("c".into()), 0), Reply::Conversation(None));
    }

    #[test]
    fn the_oldest_items_go_past_the_count_and_an_idle_conversation_past_the_retention() {
        let mut m = Memory::new(MemoryLimits { max_responses: 10, max_items: 2, retention_secs: 50 });
        conv(&mut m, "c", 0);
        m.apply(Op::AppendItems { conversation: "c".into(), items: items(&["1", "2", "3"]) }, 0);
        assert_eq!(list(&mut m, None, 10, true), ["2", "3"]);
        conv(&mut m, "idle", 0);
        // "c" is used at 40; at 60 "idle" (last used at 0) goes, "c" stays.
        m.apply(Op::GetConversation("c".into()), 40);
        conv(&mut m, "new", 60);
        assert_eq!(m.apply(Op::GetConversation("idle".into()), 60), Reply::Conversation(None));
        assert!(matches!(m.apply(Op::GetConversation("c".into()), 60), Reply::Conversation(Some(_))));
    }
}
