//! The radix tree on its own: splits, marks, eviction within budget, worker purge, memory.

use crate::routing::radix::{RadixTree, NODE_CHARGE};

fn holders(t: &RadixTree<u8>) -> Vec<(usize, Vec<u32>)> {
    t.path_marks()
        .map(|(len, marks)| {
            let mut s: Vec<u32> = marks.iter().map(|m| m.slot).collect();
            s.sort_unstable();
            (len, s)
        })
        .collect()
}

#[test]
fn match_split_and_marks() {
    let mut t = RadixTree::<u8>::new(1 << 20);
    assert_eq!(t.match_prefix(1, b"hello world"), 0);
    t.insert_matched(1, b"hello world", 0);
    assert_eq!(t.match_prefix(1, b"hello world"), 11);
    assert_eq!(t.match_prefix(1, b"hello there"), 6);
    t.insert_matched(1, b"hello there", 1);
    // "hello " is held by both; each branch by its own worker.
    assert_eq!(t.match_prefix(1, b"hello there!"), 11);
    assert_eq!(holders(&t), vec![(11, vec![1]), (6, vec![0, 1])]);
    assert_eq!(t.match_prefix(1, b"hello w"), 7);
    assert_eq!(holders(&t)[0], (7, vec![0]));
    // Another root (model or namespace) shares nothing.
    assert_eq!(t.match_prefix(2, b"hello world"), 0);
    let st = t.stats();
    assert_eq!(st.chars, 6 + 5 + 5);
    // Inserting a prefix of an existing edge splits it.
    t.insert(1, b"hel", 2);
    assert_eq!(t.match_prefix(1, b"help"), 3);
    assert_eq!(holders(&t), vec![(3, vec![0, 1, 2])]);
    assert_eq!(t.stats().chars, 16);
}

#[test]
fn eviction_keeps_the_budget_and_recent_paths() {
    let budget = 4_000;
    let mut t = RadixTree::<u8>::new(budget);
    let mut rng = fastrand::Rng::with_seed(9);
    let texts: Vec<Vec<u8>> = (0..200)
        .map(|i| {
            let mut v = format!("system prompt {} ", i % 3).into_bytes();
            v.extend((0..100).map(|_| b'a' + rng.usize(..26) as u8));
            v
        })
        .collect();
    for (i, x) in texts.iter().enumerate() {
        t.insert(7, x, (i % 4) as u32);
        assert!(t.cost() <= budget, "cost {} over budget after {i}", t.cost());
    }
    // The most recent text survives whole; the oldest is gone past its shared head.
    assert_eq!(t.match_prefix(7, &texts[199]), texts[199].len());
    assert!(t.match_prefix(7, &texts[0]) < 30);
    // Every surviving node still has a holder (no orphan subtrees).
    let st = t.stats();
    assert!(st.nodes > 0 && st.chars > 0);
    assert_eq!(st.cost, st.chars + NODE_CHARGE * st.nodes);
}

#[test]
fn explicit_eviction_to_zero_empties_the_tree() {
    let mut t = RadixTree::<u32>::new(usize::MAX);
    t.insert(1, &[1, 2, 3, 4], 0);
    t.insert(1, &[1, 2, 9], 1);
    t.insert(3, &[5], 1);
    t.evict_to(0);
    assert_eq!(t.stats().nodes, 0);
    assert_eq!(t.stats().chars, 0);
    assert_eq!(t.match_prefix(1, &[1, 2, 3]), 0);
    // And it is usable again.
    t.insert(1, &[1, 2], 4);
    assert_eq!(t.match_prefix(1, &[1, 2, 3]), 2);
}

#[test]
fn removing_a_worker_purges_its_marks_and_orphaned_nodes() {
    let mut t = RadixTree::<u8>::new(1 << 20);
    t.insert(1, b"shared prefix / a", 0);
    t.insert(1, b"shared prefix / b", 1);
    t.remove_slot(1);
    assert_eq!(t.match_prefix(1, b"shared prefix / b"), 16);
    assert_eq!(holders(&t), vec![(16, vec![0])]);
    assert_eq!(t.stats().chars, "shared prefix / a".len());
    t.remove_slot(0);
    assert_eq!(t.stats().nodes, 0);
    // Re-adding works from scratch.
    t.insert(1, b"shared prefix / b", 1);
    assert_eq!(t.match_prefix(1, b"shared prefix / b"), 17);
}

#[test]
fn memory_per_stored_character_is_bounded() {
    // Chat-like load: 8 system prompts, 400 conversations branching after them.
    let mut t = RadixTree::<u8>::new(usize::MAX);
    let mut rng = fastrand::Rng::with_seed(3);
    let systems: Vec<Vec<u8>> = (0..8).map(|_| (0..2000).map(|_| b'a' + rng.usize(..26) as u8).collect()).collect();
    for c in 0..400 {
        let mut x = systems[c % 8].clone();
        for turn in 0..4 {
            x.extend((0..600).map(|_| b'a' + rng.usize(..26) as u8));
            t.insert(1, &x, (c % 8) as u32 + turn);
        }
    }
    let st = t.stats();
    let per_char = st.heap_bytes as f64 / st.chars as f64;
    eprintln!(
        "tree: {} chars, {} nodes, {} heap bytes, {per_char:.2} bytes per stored char",
        st.chars, st.nodes, st.heap_bytes
    );
    assert!(per_char < 1.5, "{per_char} bytes per char");
}
