//! `consistent_hashing`: a session key hashed onto the shared ring (150 points per worker), so
//! every shard, and every replica with the same workers, sends a key to the same worker, and
//! adding or removing a worker moves only the keys it gains or loses.
//!
//! Key priority: `X-SMG-Target-Worker` (an index, not a key: a missing worker is a 503), the
//! body `rid` with `--routing-key-override`, the routing key header, then `Authorization`,
//! `X-Forwarded-For`, `Cookie`; with none, a random worker.

use super::config::RoutingConfig;
use super::hashing::hash_str;
use super::headers::{parse_target_worker, rid_key};
use super::types::{RouteError, RouteInput};
use super::workers::View;

/// The session key `consistent_hashing` hashes, in SMG's priority order (after the target
/// worker, which the caller handles).
pub(crate) fn session_key<'a>(cfg: &RoutingConfig, input: &RouteInput<'a>) -> Option<&'a str> {
    let rid = if cfg.routing_key_override { input.rid.and_then(rid_key) } else { None };
    rid.or(input.routing_key).or(input.authorization).or(input.forwarded_for).or(input.cookie).filter(|k| !k.is_empty())
}

pub(crate) fn pick(
    cfg: &RoutingConfig,
    view: &mut View,
    n: usize,
    input: &RouteInput<'_>,
    rng: &mut fastrand::Rng,
) -> Result<usize, RouteError> {
    if let Some(t) = input.target_worker {
        return match parse_target_worker(t) {
            Some(i) if i < n => Ok(i),
            _ => Err(RouteError::NoWorker),
        };
    }
    match session_key(cfg, input) {
        Some(key) => view.ring().lookup(hash_str(key)).ok_or(RouteError::NoWorker),
        None => Ok(rng.usize(..n)),
    }
}
