//! A signal for "every shard has heard its peers": shards trade routing digests and loads
//! on their tick, so tests that need one shard to see what another did wait for a gossip
//! round here instead of sleeping past the tick.

use std::time::Duration;

use super::{patience, try_get, wait_until};

/// Each shard's `smg_shard_ticks_total`, in shard order.
fn shard_ticks(metrics_port: u16) -> Vec<u64> {
    let text = try_get(metrics_port, "/metrics").map(|r| r.text()).unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("smg_shard_ticks_total{"))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, n)| n.parse().ok()))
        .collect()
}

/// Returns once every shard has run a tick (and so gossiped) after this call, and every
/// shard has then handled a later message: a scrape reaches a shard through the same FIFO
/// inbox as its peers' gossip, so one more scrape after the ticks moved lands behind it.
pub fn gossip_round(metrics_port: u16) {
    let before = shard_ticks(metrics_port);
    assert!(!before.is_empty(), "no smg_shard_ticks_total on :{metrics_port}/metrics");
    let moved = || {
        let now = shard_ticks(metrics_port);
        now.len() == before.len() && now.iter().zip(&before).all(|(n, b)| n > b)
    };
    assert!(wait_until(patience(Duration::from_secs(5)), moved), "a shard stopped ticking: {before:?}");
    assert_eq!(shard_ticks(metrics_port).len(), before.len(), "a shard did not answer the last scrape");
}
