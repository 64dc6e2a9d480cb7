//! A --grpc worker's KV-cache events (SGLang's `SubscribeKvEvents`): what its prefix cache
//! stored, evicted and flushed, as numbered `KvEventBatch`es. The last [`KEEP_BATCHES`] are
//! kept for subscribers resuming from a sequence number; each subscriber has its own bounded
//! queue, so a slow one never holds up a Generate (it is ended instead). The RPC that drains
//! a queue onto a stream is grpc/subscribe.rs.
//!
//! Batches are numbered from 1 (`kv_events_skip` in /sim/control leaves a gap), event ids
//! increase across batches, `dp_rank` is never set (the simulated DP ranks share one cache).
//! A batch is encoded once, as a gRPC message frame, and shared by the log and every queue.
//! (HTTP workers publish the same changes over ZMQ in vLLM's format: sim/zmq_events.rs, which
//! shares [`stored_runs`] and [`ids_from_bytes`] with this module.)

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use smg_proto::common::kv_cache_event::Data;
use smg_proto::common::{KvBlock, KvBlocksRemoved, KvBlocksStored, KvCacheCleared, KvCacheEvent, KvEventBatch};

use crate::sim::prefix_cache::{CacheChanges, StoredBlock};

/// Batches kept for replay, and the most a subscriber may have queued (a queue holds the
/// latest batches, so with this bound everything queued is also in the log: no extra memory).
pub const KEEP_BATCHES: usize = 4096;

pub struct KvEventLog {
    /// The number of the last batch published (0: none yet).
    last_sequence: Cell<u64>,
    /// Numbers the next batch skips (`kv_events_skip`).
    pending_skip: Cell<u64>,
    last_event_id: Cell<u64>,
    published: Cell<u64>,
    /// Subscribers ended because their queue overflowed.
    overflowed: Cell<u64>,
    /// (sequence number, framed batch), oldest first.
    kept: RefCell<VecDeque<(u64, Bytes)>>,
    keep: usize,
    queue_limit: usize,
    subscribers: RefCell<Vec<Weak<Subscriber>>>,
    /// Reused by every tracked cache lookup of the worker.
    pub scratch: RefCell<CacheChanges>,
}

/// One subscriber's queue of framed batches, drained by its stream's task.
pub struct Subscriber {
    queue: RefCell<VecDeque<Bytes>>,
    limit: usize,
    overflowed: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

/// What a subscriber's stream sends next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// A framed `KvEventBatch`.
    Batch(Bytes),
    /// The queue overflowed (its batches are dropped): end the stream with RESOURCE_EXHAUSTED.
    Overflow,
}

// === impl KvEventLog ===

impl Default for KvEventLog {
    fn default() -> Self {
        Self::new(KEEP_BATCHES, KEEP_BATCHES)
    }
}

impl KvEventLog {
    /// A log keeping `keep` batches, whose subscribers may queue `queue_limit` (at least `keep`,
    /// so a replay always fits).
    pub fn new(keep: usize, queue_limit: usize) -> Self {
        Self {
            last_sequence: Cell::new(0),
            pending_skip: Cell::new(0),
            last_event_id: Cell::new(0),
            published: Cell::new(0),
            overflowed: Cell::new(0),
            kept: RefCell::new(VecDeque::with_capacity(keep.min(1024))),
            keep: keep.max(1),
            queue_limit: queue_limit.max(keep).max(1),
            subscribers: RefCell::new(Vec::new()),
            scratch: RefCell::new(CacheChanges::default()),
        }
    }

    /// The next batch's number is `n` higher than it would be (added to any skip not yet applied).
    pub fn skip(&self, n: u64) {
        self.pending_skip.set(self.pending_skip.get().saturating_add(n));
    }

    pub fn pending_skip(&self) -> u64 {
        self.pending_skip.get()
    }

    pub fn last_sequence(&self) -> u64 {
        self.last_sequence.get()
    }

    pub fn published(&self) -> u64 {
        self.published.get()
    }

    /// Open subscriptions (streams not yet ended).
    pub fn subscribers(&self) -> usize {
        self.subscribers.borrow().iter().filter(|s| s.strong_count() > 0).count()
    }

    /// Publishes one batch of `events` (ids assigned here, in order) to the log and every
    /// subscriber; returns its sequence number. Never waits.
    pub fn publish(&self, events: Vec<Data>) -> u64 {
        let seq = self.last_sequence.get() + 1 + self.pending_skip.replace(0);
        self.last_sequence.set(seq);
        self.published.set(self.published.get() + 1);
        let events = events
            .into_iter()
            .map(|data| {
                self.last_event_id.set(self.last_event_id.get() + 1);
                KvCacheEvent { event_id: self.last_event_id.get(), data: Some(data) }
            })
            .collect();
        let batch = KvEventBatch { sequence_number: seq, timestamp: now_secs(), events, ..Default::default() };
        let frame = smg_proto::framing::frame(&batch);
        {
            let mut kept = self.kept.borrow_mut();
            if kept.len() == self.keep {
                kept.pop_front();
            }
            kept.push_back((seq, frame.clone()));
        }
        self.subscribers.borrow_mut().retain(|s| match s.upgrade() {
            Some(s) => {
                if !s.push(frame.clone()) {
                    self.overflowed.set(self.overflowed.get() + 1);
                }
                true
            }
            None => false,
        });
        seq
    }

    /// Publishes what a cache lookup changed (nothing when it changed nothing): the evicted
    /// blocks, then each run of consecutive stored blocks; `ids_of(i)` gives block i's token ids.
    pub fn publish_changes(&self, changes: &CacheChanges, block_tokens: usize, ids_of: impl Fn(usize) -> Vec<u32>) {
        if !changes.is_empty() {
            self.publish(change_events(changes, block_tokens, ids_of));
        }
    }

    /// Publishes that the whole cache was dropped.
    pub fn publish_cleared(&self) {
        self.publish(vec![Data::Cleared(KvCacheCleared::default())]);
    }

    /// A new subscription: with `start` 0 it gets batches published from now on; otherwise
    /// first the kept batches numbered above `start` (all kept ones when `start` is older).
    pub fn subscribe(&self, start: u64) -> Rc<Subscriber> {
        let s = Rc::new(Subscriber {
            queue: RefCell::new(VecDeque::new()),
            limit: self.queue_limit,
            overflowed: Cell::new(false),
            waker: RefCell::new(None),
        });
        if start > 0 {
            let kept = self.kept.borrow();
            let from = kept.partition_point(|(seq, _)| *seq <= start);
            s.queue.borrow_mut().extend(kept.range(from..).map(|(_, f)| f.clone()));
        }
        let mut subs = self.subscribers.borrow_mut();
        subs.retain(|s| s.strong_count() > 0);
        subs.push(Rc::downgrade(&s));
        s
    }

    /// The `"kv_events":{...}` member of /sim/stats.
    pub fn stats_json(&self) -> String {
        format!(
            "{{\"published\":{},\"last_sequence\":{},\"subscribers\":{},\"overflowed\":{}}}",
            self.published.get(),
            self.last_sequence.get(),
            self.subscribers(),
            self.overflowed.get()
        )
    }
}

// === impl Subscriber ===

impl Subscriber {
    /// Queues a batch; false when that overflowed the queue (which is then dropped for good).
    fn push(&self, frame: Bytes) -> bool {
        if self.overflowed.get() {
            return true;
        }
        let mut q = self.queue.borrow_mut();
        let ok = q.len() < self.limit;
        if ok {
            q.push_back(frame);
        } else {
            q.clear();
            self.overflowed.set(true);
        }
        drop(q);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
        ok
    }

    pub fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Next> {
        if self.overflowed.get() {
            return Poll::Ready(Next::Overflow);
        }
        if let Some(f) = self.queue.borrow_mut().pop_front() {
            return Poll::Ready(Next::Batch(f));
        }
        *self.waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Moves queued batches after `buf`'s while `buf` stays within `max` bytes (at least one
    /// when there is one), so a backlog leaves in few large DATA frames: a peer that sees many
    /// small ones buffered unread (h2: `too_many_data_frames`) ends the connection.
    pub fn drain_into(&self, buf: &mut BytesMut, max: usize) {
        let mut q = self.queue.borrow_mut();
        while let Some(f) = q.front() {
            if !buf.is_empty() && buf.len() + f.len() > max {
                break;
            }
            buf.extend_from_slice(f);
            q.pop_front();
        }
    }

    /// Batches waiting to be sent.
    pub fn queued(&self) -> usize {
        self.queue.borrow().len()
    }
}

/// A lookup's changes as events: one `KvBlocksRemoved` with every evicted block, then one
/// `KvBlocksStored` per run of consecutive stored blocks, parented on the block before the run
/// (none for a run from the prompt's first block). Hashes are the cache's keys, bit cast.
pub fn change_events(c: &CacheChanges, block_tokens: usize, ids_of: impl Fn(usize) -> Vec<u32>) -> Vec<Data> {
    let mut out = Vec::new();
    if !c.removed.is_empty() {
        let block_hashes = c.removed.iter().map(|&k| k as i64).collect();
        out.push(Data::Removed(KvBlocksRemoved { block_hashes, ..Default::default() }));
    }
    let block_size = i32::try_from(block_tokens).unwrap_or(i32::MAX);
    for run in stored_runs(&c.stored) {
        let blocks = run
            .iter()
            .map(|b| KvBlock { block_hash: b.key as i64, token_ids: ids_of(b.index), block_size, ..Default::default() })
            .collect();
        out.push(Data::Stored(KvBlocksStored {
            blocks,
            parent_block_hash: run[0].parent.map(|p| p as i64),
            ..Default::default()
        }));
    }
    out
}

/// The stored blocks of a lookup cut into runs of consecutive prompt blocks (each non-empty),
/// in order: one stored event each, parented on its first block's parent.
pub fn stored_runs(stored: &[StoredBlock]) -> impl Iterator<Item = &[StoredBlock]> {
    stored.chunk_by(|a, b| b.index == a.index + 1)
}

/// Token ids of a prompt known only as bytes (an HTTP request on a --grpc port, any request on
/// an HTTP worker publishing over ZMQ): each token's `bytes_per_token` bytes, the first four
/// read as a little-endian id (fewer bytes than four: the high bytes are 0).
pub fn ids_from_bytes(bytes: &[u8], bytes_per_token: usize) -> Vec<u32> {
    bytes
        .chunks(bytes_per_token.max(1))
        .map(|t| t.iter().take(4).enumerate().fold(0u32, |id, (i, &b)| id | (b as u32) << (8 * i)))
        .collect()
}

/// Seconds since the epoch: a batch's timestamp, on either transport.
pub(crate) fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::prefix_cache::PrefixCache;
    use prost::Message;

    fn decode(frame: &Bytes) -> KvEventBatch {
        assert_eq!(frame[0], 0, "uncompressed");
        let len = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]) as usize;
        assert_eq!(frame.len(), 5 + len);
        KvEventBatch::decode(&frame[5..]).unwrap()
    }

    fn next(s: &Subscriber) -> Option<Next> {
        let waker = std::task::Waker::noop();
        match s.poll_next(&mut Context::from_waker(waker)) {
            Poll::Ready(n) => Some(n),
            Poll::Pending => None,
        }
    }

    fn next_batch(s: &Subscriber) -> KvEventBatch {
        match next(s) {
            Some(Next::Batch(f)) => decode(&f),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn numbering_ids_skips_and_replay() {
        let log = KvEventLog::new(3, 3);
        let live = log.subscribe(0);
        assert_eq!(next(&live), None);
        assert_eq!(log.publish(vec![Data::Cleared(KvCacheCleared::default())]), 1);
        let cleared = || Data::Cleared(KvCacheCleared::default());
        log.publish(vec![cleared(), cleared()]);
        let b1 = next_batch(&live);
        assert_eq!((b1.sequence_number, b1.dp_rank), (1, None));
        assert!(b1.timestamp > 1.0e9);
        assert_eq!(b1.events[0].event_id, 1);
        let b2 = next_batch(&live);
        assert_eq!(b2.events.iter().map(|e| e.event_id).collect::<Vec<_>>(), [2, 3]);
        // A skip applies to the next batch only.
        log.skip(5);
        assert_eq!((log.pending_skip(), log.last_sequence()), (5, 2));
        assert_eq!(log.publish(vec![cleared()]), 8);
        assert_eq!(log.publish(vec![cleared()]), 9);
        assert_eq!((log.published(), log.pending_skip()), (4, 0));
        // Replay: what followed `start` among the 3 kept (2, 8, 9), all of them when older.
        let seqs = |s: &Subscriber| {
            let mut v = Vec::new();
            while let Some(Next::Batch(f)) = next(s) {
                v.push(decode(&f).sequence_number);
            }
            v
        };
        assert_eq!(seqs(&log.subscribe(2)), [8, 9]);
        assert_eq!(seqs(&log.subscribe(1)), [2, 8, 9]);
        assert_eq!(seqs(&log.subscribe(8)), [9]);
        assert_eq!(seqs(&log.subscribe(9)), Vec::<u64>::new());
        assert_eq!(seqs(&live), [8, 9]);
        // Dropped subscriptions stop counting.
        assert_eq!(log.subscribers(), 1);
        drop(live);
        assert_eq!(log.subscribers(), 0);
    }

    #[test]
    fn a_full_queue_ends_its_subscriber_only() {
        let log = KvEventLog::new(2, 2);
        let slow = log.subscribe(0);
        let fast = log.subscribe(0);
        for _ in 0..3 {
            log.publish_cleared();
            assert!(matches!(next(&fast), Some(Next::Batch(_))));
        }
        assert_eq!(next(&slow), Some(Next::Overflow));
        assert_eq!(slow.queued(), 0, "an overflowed queue is dropped");
        log.publish_cleared();
        assert_eq!(next(&slow), Some(Next::Overflow));
        assert!(matches!(next(&fast), Some(Next::Batch(_))));
        assert!(log.stats_json().contains("\"overflowed\":1"), "{}", log.stats_json());
    }

    #[test]
    fn a_backlog_drains_in_pieces_of_whole_batches() {
        let log = KvEventLog::default();
        let sub = log.subscribe(0);
        for _ in 0..10 {
            log.publish_cleared();
        }
        let one = match next(&sub) {
            Some(Next::Batch(f)) => f.len(),
            other => panic!("{other:?}"),
        };
        let mut buf = BytesMut::new();
        sub.drain_into(&mut buf, one * 4 + 1);
        assert_eq!((buf.len(), sub.queued()), (one * 4, 5));
        // Always at least one, however large.
        let mut buf = BytesMut::new();
        sub.drain_into(&mut buf, 1);
        assert_eq!((buf.len(), sub.queued()), (one, 4));
        let seq = decode(&buf.freeze()).sequence_number;
        assert_eq!(seq, 6);
    }

    #[test]
    fn changes_become_removed_then_stored_runs() {
        let block = |index: usize, key: u64, parent: Option<u64>| StoredBlock { index, key, parent };
        let mut c = CacheChanges::default();
        c.stored = vec![block(0, 10, None), block(1, 11, Some(10)), block(3, u64::MAX, Some(12))];
        c.removed = vec![7];
        let ids = |i: usize| vec![i as u32 * 2, i as u32 * 2 + 1];
        let ev = change_events(&c, 2, ids);
        assert_eq!(ev.len(), 3);
        assert!(matches!(&ev[0], Data::Removed(r) if r.block_hashes == [7]));
        let Data::Stored(first) = &ev[1] else { panic!("{:?}", ev[1]) };
        assert_eq!(first.parent_block_hash, None);
        assert_eq!(first.blocks.iter().map(|b| b.block_hash).collect::<Vec<_>>(), [10, 11]);
        assert_eq!(first.blocks[1].token_ids, [2, 3]);
        assert_eq!(first.blocks[1].block_size, 2);
        let Data::Stored(second) = &ev[2] else { panic!("{:?}", ev[2]) };
        assert_eq!(second.parent_block_hash, Some(12));
        assert_eq!(second.blocks[0].block_hash, -1, "keys are bit cast to i64");
        assert_eq!(second.blocks[0].token_ids, [6, 7]);
    }

    #[test]
    fn a_cache_lookup_published() {
        let mut cache = PrefixCache::new(1000, 2, 4);
        let log = KvEventLog::default();
        let sub = log.subscribe(0);
        let ids: Vec<u32> = (1..=5).collect();
        let key: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        let mut ch = log.scratch.borrow_mut();
        cache.lookup_insert_tracked(&key, &mut ch);
        log.publish_changes(&ch, 2, |i| ids[i * 2..i * 2 + 2].to_vec());
        let b = next_batch(&sub);
        let Some(Data::Stored(s)) = &b.events[0].data else { panic!("{b:?}") };
        assert_eq!(s.blocks.iter().map(|b| b.token_ids.clone()).collect::<Vec<_>>(), [vec![1, 2], vec![3, 4]]);
        // Nothing changed: nothing published.
        cache.lookup_insert_tracked(&key, &mut ch);
        log.publish_changes(&ch, 2, |_| unreachable!());
        assert_eq!((log.published(), next(&sub)), (1, None));
        assert_eq!(ids_from_bytes(&key[..8], 4), [1, 2]);
        assert_eq!(ids_from_bytes(b"ab", 1), [97, 98]);
    }
}
