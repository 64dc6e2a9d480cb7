//! The approximate prefix tree behind `cache_aware`: a radix tree over bytes (text) or token
//! ids, one root per (model, namespace), each node marked with the workers that were sent its
//! prefix and when.
//!
//! Nodes live in an arena (`Vec`) addressed by `u32`, so a shard's tree is one allocation of
//! nodes plus one label per node, and nothing is shared or locked.
//!
//! LRU without a heap: one logical clock ticks per insert, and an insert stamps every node and
//! mark on its path. An ancestor is therefore never older than its descendants, and a worker's
//! mark on an ancestor never older than its mark below. Eviction picks a cutoff stamp that
//! frees enough, drops every mark at or below it, and removes every node left without marks;
//! by the invariant those form whole subtrees, so no node is left dangling.
//!
//! Budget: `chars + NODE_CHARGE × nodes` stays within `--max-tree-size` after every insert
//! (evicting to 90 % when crossed, so the sort is amortized over many inserts).

use std::fmt::Debug;
use std::hash::Hash;

use super::hashing::FastMap;

/// What one node costs against `--max-tree-size`, in characters: it bounds memory for trees
/// of many short labels, where per-node overhead, not label bytes, dominates.
pub const NODE_CHARGE: usize = 32;
/// Eviction frees down to this share of the budget, so it runs once per ~10 % of churn.
const EVICT_TO_PERCENT: usize = 90;
/// Children kept in a vector up to this many; a hash map beyond.
const FEW_CHILDREN: usize = 12;
const NIL: u32 = u32::MAX;

/// A tree element: a byte of text or a token id.
pub trait Elem: Copy + Eq + Hash + Debug + 'static {
    /// Length of the common prefix of `a` and `b`.
    fn common_prefix(a: &[Self], b: &[Self]) -> usize;
}

impl Elem for u8 {
    fn common_prefix(a: &[u8], b: &[u8]) -> usize {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut i = 0;
        // 32-byte blocks compare as arrays (vector compares, no memcmp call per block).
        while i + 32 <= n {
            let x: &[u8; 32] = a[i..i + 32].try_into().unwrap_or(&[0; 32]);
            let y: &[u8; 32] = b[i..i + 32].try_into().unwrap_or(&[0; 32]);
            if x != y {
                break;
            }
            i += 32;
        }
        while i + 8 <= n {
            let x = u64::from_le_bytes(a[i..i + 8].try_into().unwrap_or([0; 8]));
            let y = u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
            if x != y {
                return i + ((x ^ y).trailing_zeros() / 8) as usize;
            }
            i += 8;
        }
        while i < n && a[i] == b[i] {
            i += 1;
        }
        i
    }
}

impl Elem for u32 {
    fn common_prefix(a: &[u32], b: &[u32]) -> usize {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut i = 0;
        while i + 8 <= n && a[i..i + 8] == b[i..i + 8] {
            i += 8;
        }
        while i < n && a[i] == b[i] {
            i += 1;
        }
        i
    }
}

/// A worker's claim on a node: "sent this prefix at stamp `last`".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    pub(crate) slot: u32,
    pub(crate) last: u64,
}

#[derive(Debug)]
enum Children<T: Elem> {
    Few(Vec<(T, u32)>),
    Many(FastMap<T, u32>),
}

// === impl Children ===

impl<T: Elem> Children<T> {
    fn get(&self, k: T) -> Option<u32> {
        match self {
            Children::Few(v) => v.iter().find(|(e, _)| *e == k).map(|&(_, id)| id),
            Children::Many(m) => m.get(&k).copied(),
        }
    }

    /// Inserts or replaces the child for `k`.
    fn set(&mut self, k: T, id: u32) {
        match self {
            Children::Few(v) => {
                if let Some(e) = v.iter_mut().find(|(e, _)| *e == k) {
                    e.1 = id;
                } else if v.len() < FEW_CHILDREN {
                    v.push((k, id));
                } else {
                    let mut m: FastMap<T, u32> = v.drain(..).collect();
                    m.insert(k, id);
                    *self = Children::Many(m);
                }
            }
            Children::Many(m) => {
                m.insert(k, id);
            }
        }
    }

    fn remove(&mut self, k: T) {
        match self {
            Children::Few(v) => v.retain(|(e, _)| *e != k),
            Children::Many(m) => {
                m.remove(&k);
            }
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Children::Few(v) => v.is_empty(),
            Children::Many(m) => m.is_empty(),
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Children::Few(v) => v.capacity() * std::mem::size_of::<(T, u32)>(),
            // hashbrown: one control byte per bucket plus the entries.
            Children::Many(m) => m.capacity() * (std::mem::size_of::<(T, u32)>() + 1),
        }
    }
}

#[derive(Debug)]
struct Node<T: Elem> {
    label: Box<[T]>,
    parent: u32,
    last: u64,
    children: Children<T>,
    marks: Vec<Mark>,
    live: bool,
}

// === impl Node ===

impl<T: Elem> Node<T> {
    fn touch(&mut self, slot: u32, now: u64) {
        self.last = now;
        match self.marks.iter_mut().find(|m| m.slot == slot) {
            Some(m) => m.last = now,
            None => self.marks.push(Mark { slot, last: now }),
        }
    }
}

/// Size figures of one tree, for tests, benches and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Stored elements (characters or token ids) over all labels.
    pub chars: usize,
    /// Live nodes (roots included).
    pub nodes: usize,
    /// `chars + NODE_CHARGE × nodes`, the figure held within `--max-tree-size`.
    pub cost: usize,
    /// Estimated heap bytes of the tree (nodes, labels, children, marks).
    pub heap_bytes: usize,
}

/// One kind of tree (bytes or tokens) for one shard: all models and namespaces, one root each.
#[derive(Debug)]
pub(crate) struct RadixTree<T: Elem> {
    nodes: Vec<Node<T>>,
    free: Vec<u32>,
    roots: FastMap<u64, u32>,
    chars: usize,
    live_nodes: usize,
    clock: u64,
    budget: usize,
    /// The last match's path: (node, matched length through it); the root first.
    path: Vec<(u32, usize)>,
    /// The last match ended inside this node's label, after this many elements.
    partial: Option<(u32, usize)>,
}

// === impl RadixTree ===

impl<T: Elem> RadixTree<T> {
    pub(crate) fn new(budget: usize) -> Self {
        RadixTree {
            nodes: Vec::new(),
            free: Vec::new(),
            roots: FastMap::default(),
            chars: 0,
            live_nodes: 0,
            clock: 0,
            budget,
            path: Vec::new(),
            partial: None,
        }
    }

    pub(crate) fn cost(&self) -> usize {
        self.chars + NODE_CHARGE * self.live_nodes
    }

    pub(crate) fn stats(&self) -> TreeStats {
        let node_bytes = self.nodes.capacity() * std::mem::size_of::<Node<T>>()
            + self.free.capacity() * 4
            + self.roots.capacity() * 13;
        let per_node: usize = self
            .nodes
            .iter()
            .filter(|n| n.live)
            .map(|n| {
                n.label.len() * std::mem::size_of::<T>()
                    + n.children.heap_bytes()
                    + n.marks.capacity() * std::mem::size_of::<Mark>()
            })
            .sum();
        TreeStats { chars: self.chars, nodes: self.live_nodes, cost: self.cost(), heap_bytes: node_bytes + per_node }
    }

    fn alloc(&mut self, node: Node<T>) -> u32 {
        self.chars += node.label.len();
        self.live_nodes += 1;
        match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn release(&mut self, id: u32) {
        let n = &mut self.nodes[id as usize];
        self.chars -= n.label.len();
        self.live_nodes -= 1;
        n.live = false;
        n.label = Box::default();
        n.children = Children::Few(Vec::new());
        n.marks = Vec::new();
        self.free.push(id);
    }

    fn new_node(label: Box<[T]>, parent: u32, last: u64, marks: Vec<Mark>) -> Node<T> {
        Node { label, parent, last, children: Children::Few(Vec::new()), marks, live: true }
    }

    /// Matches `key` under `root` and remembers the path for `path_marks` and `insert_matched`.
    /// Returns the matched length.
    pub(crate) fn match_prefix(&mut self, root: u64, key: &[T]) -> usize {
        self.path.clear();
        self.partial = None;
        let Some(&root_id) = self.roots.get(&root) else {
            return 0;
        };
        self.path.push((root_id, 0));
        let (mut cur, mut pos) = (root_id, 0);
        while pos < key.len() {
            let Some(child) = self.nodes[cur as usize].children.get(key[pos]) else {
                break;
            };
            let label = &self.nodes[child as usize].label;
            let n = T::common_prefix(label, &key[pos..]);
            pos += n;
            self.path.push((child, pos));
            if n < label.len() {
                self.partial = Some((child, n));
                break;
            }
            cur = child;
        }
        pos
    }

    /// The last match's nodes, deepest first, as (matched length, marks); the root excluded.
    pub(crate) fn path_marks(&self) -> impl Iterator<Item = (usize, &[Mark])> + '_ {
        self.path.iter().skip(1).rev().map(|&(id, len)| (len, self.nodes[id as usize].marks.as_slice()))
    }

    /// Records `slot` for all of `key` after `match_prefix(root, key)`: stamps the matched path,
    /// splits the node the match ended inside, and hangs the unmatched rest as a new leaf.
    pub(crate) fn insert_matched(&mut self, root: u64, key: &[T], slot: u32) {
        if key.is_empty() {
            return;
        }
        self.clock += 1;
        let now = self.clock;
        if self.path.is_empty() {
            let id = self.alloc(Self::new_node(Box::default(), NIL, now, Vec::new()));
            self.roots.insert(root, id);
            self.path.push((id, 0));
        }
        if let Some((lower, off)) = self.partial.take() {
            let upper = self.split(lower, off);
            if let Some(last) = self.path.last_mut() {
                last.0 = upper;
            }
        }
        for i in 1..self.path.len() {
            let id = self.path[i].0;
            self.nodes[id as usize].touch(slot, now);
        }
        let (parent, depth) = self.path[self.path.len() - 1];
        self.nodes[parent as usize].last = now;
        if depth < key.len() {
            let rest: Box<[T]> = key[depth..].into();
            let first = rest[0];
            let leaf = self.alloc(Self::new_node(rest, parent, now, vec![Mark { slot, last: now }]));
            self.nodes[parent as usize].children.set(first, leaf);
        }
        self.path.clear();
        if self.cost() > self.budget {
            self.evict_to(self.budget - self.budget / 100 * (100 - EVICT_TO_PERCENT));
        }
    }

    /// Match then insert, for records that need no routing decision (digests from peers).
    pub(crate) fn insert(&mut self, root: u64, key: &[T], slot: u32) {
        self.match_prefix(root, key);
        self.insert_matched(root, key, slot);
    }

    /// Splits `lower` after `off` elements; returns the new upper node, which keeps the
    /// lower's marks (whoever was sent the whole label was sent its head).
    fn split(&mut self, lower: u32, off: usize) -> u32 {
        let (head, tail, parent, last, marks) = {
            let n = &self.nodes[lower as usize];
            (Box::<[T]>::from(&n.label[..off]), Box::<[T]>::from(&n.label[off..]), n.parent, n.last, n.marks.clone())
        };
        let head_first = head[0];
        let tail_first = tail[0];
        // `alloc` counts the head's elements; the tail shrinks by as many.
        let upper = self.alloc(Self::new_node(head, parent, last, marks));
        self.chars -= off;
        let n = &mut self.nodes[lower as usize];
        n.label = tail;
        n.parent = upper;
        self.nodes[upper as usize].children.set(tail_first, lower);
        self.nodes[parent as usize].children.set(head_first, upper);
        upper
    }

    /// Evicts least-recently-stamped marks and nodes until the cost is at most `target`.
    pub(crate) fn evict_to(&mut self, target: usize) {
        let cost = self.cost();
        if cost <= target {
            return;
        }
        let need = cost - target;
        let mut ages: Vec<(u64, usize)> = self
            .nodes
            .iter()
            .filter(|n| n.live && n.parent != NIL)
            .map(|n| (n.last, n.label.len() + NODE_CHARGE))
            .collect();
        ages.sort_unstable_by_key(|&(last, _)| last);
        let mut freed = 0;
        let mut cutoff = 0;
        for &(last, c) in &ages {
            freed += c;
            cutoff = last;
            if freed >= need {
                break;
            }
        }
        self.sweep(|m| m.last > cutoff);
    }

    /// Drops every mark of `slot` (a removed worker) and the nodes left without marks.
    pub(crate) fn remove_slot(&mut self, slot: u32) {
        self.sweep(|m| m.slot != slot);
    }

    /// Keeps the marks `keep` accepts and removes every non-root node left without marks, then
    /// every root left without children. Marks only shrink towards the leaves, so removed nodes
    /// form whole subtrees.
    fn sweep(&mut self, keep: impl Fn(&Mark) -> bool) {
        for n in self.nodes.iter_mut().filter(|n| n.live && n.parent != NIL) {
            n.marks.retain(|m| keep(m));
        }
        for id in 0..self.nodes.len() {
            let n = &self.nodes[id];
            if !n.live || n.parent == NIL || !n.marks.is_empty() {
                continue;
            }
            let (parent, first) = (n.parent as usize, n.label[0]);
            let p = &self.nodes[parent];
            let parent_stays = p.live && (p.parent == NIL || !p.marks.is_empty());
            if parent_stays {
                self.nodes[parent].children.remove(first);
            }
            self.release(id as u32);
        }
        let dead: Vec<(u64, u32)> = self
            .roots
            .iter()
            .filter(|(_, &id)| self.nodes[id as usize].children.is_empty())
            .map(|(&k, &id)| (k, id))
            .collect();
        for (k, id) in dead {
            self.roots.remove(&k);
            self.release(id);
        }
    }
}
