//! The load-only policies: `random`, `round_robin`, `power_of_two` and `least_load`.

use super::hashing::mix;
use super::types::Candidate;

/// `random`: uniform over the candidates.
pub(crate) fn random(rng: &mut fastrand::Rng, n: usize) -> usize {
    rng.usize(..n)
}

/// `round_robin`: this shard's own counter. Each shard starts at its own index, so shards that
/// all see one request do not all pick worker 0; the union of per-shard rotations stays even.
pub(crate) fn round_robin(counter: &mut usize, n: usize) -> usize {
    let i = *counter % n;
    *counter = counter.wrapping_add(1);
    i
}

/// The load figure `least_load` and `power_of_two` compare: the engine's own report (which
/// also counts other gateways' traffic) plus this gateway's in-flight requests (which reacts
/// between polls, so one poll interval's arrivals do not all go to the worker that looked
/// idle). A worker without a report is charged `fill`, the mean report of those that have one,
/// so a silent worker neither attracts nor repels everything.
fn score(c: &Candidate<'_>, fill: u64) -> u64 {
    c.engine_load.unwrap_or(fill).saturating_add(c.load as u64)
}

fn fill(cands: &[Candidate<'_>]) -> u64 {
    let (sum, n) =
        cands.iter().filter_map(|c| c.engine_load).fold((0u64, 0u64), |(s, n), l| (s.saturating_add(l), n + 1));
    sum.checked_div(n).unwrap_or(0)
}

/// `power_of_two`: two distinct random candidates, the lighter one wins.
pub(crate) fn power_of_two(rng: &mut fastrand::Rng, cands: &[Candidate<'_>]) -> usize {
    let n = cands.len();
    if n == 1 {
        return 0;
    }
    let a = rng.usize(..n);
    let b = (a + 1 + rng.usize(..n - 1)) % n;
    let f = fill(cands);
    if score(&cands[b], f) < score(&cands[a], f) {
        b
    } else {
        a
    }
}

/// `least_load`: the lowest score; ties broken at random so equal workers share the traffic.
pub(crate) fn least_load(rng: &mut fastrand::Rng, cands: &[Candidate<'_>]) -> usize {
    let f = fill(cands);
    let mut best = 0;
    let mut best_score = u64::MAX;
    let mut ties = 0usize;
    for (i, c) in cands.iter().enumerate() {
        let s = score(c, f);
        if s < best_score {
            best = i;
            best_score = s;
            ties = 1;
        } else if s == best_score {
            // Reservoir sampling: each tied candidate ends up chosen with probability 1/ties.
            ties += 1;
            if rng.usize(..ties) == 0 {
                best = i;
            }
        }
    }
    best
}

/// The candidate with the least in-flight load among `indices`; ties go to the highest
/// rendezvous score of `tie_key` with the URL, so every shard breaks the same tie the same way
/// while different keys spread over the tied workers. `tie_key` runs only on a tie.
pub(crate) fn least_loaded_by_key(
    cands: &[Candidate<'_>],
    url_hash: &[u64],
    mut tie_key: impl FnMut() -> u64,
    indices: impl Iterator<Item = usize>,
) -> Option<usize> {
    let mut best: Option<usize> = None;
    let mut best_score: Option<u64> = None;
    let mut key: Option<u64> = None;
    for i in indices {
        let Some(b) = best else {
            best = Some(i);
            continue;
        };
        if cands[i].load < cands[b].load {
            best = Some(i);
            best_score = None;
        } else if cands[i].load == cands[b].load && i != b {
            let k = *key.get_or_insert_with(&mut tie_key);
            let bs = *best_score.get_or_insert_with(|| mix(k, url_hash[b]));
            let s = mix(k, url_hash[i]);
            if s > bs {
                best = Some(i);
                best_score = Some(s);
            }
        }
    }
    best
}
