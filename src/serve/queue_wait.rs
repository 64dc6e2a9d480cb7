//! Waiting in a queue with the client watched: the one way every admission queue (the
//! permits, the scheduler, a pair's per-role pools) waits for its grant.

use super::client::Client;
use super::finish::Outcome;
use crate::io::{peer_closed, sleep};

/// A queued request's wait: the grant, or None at `limit`; a client that hangs up meanwhile
/// leaves the queue at once (its socket is watched until it shows pipelined bytes, after
/// which watching says nothing more).
pub(super) async fn queue_wait<F: std::future::Future>(
    client: &Client,
    limit: std::time::Duration,
    mut wait: impl FnMut() -> F,
) -> Result<Option<F::Output>, Outcome> {
    let queued = crate::clock::now();
    let mut watch = true;
    loop {
        let waited = wait();
        let expired = sleep(limit.saturating_sub(queued.elapsed()));
        if watch {
            monoio::select! {
                granted = waited => return Ok(Some(granted)),
                _ = expired => return Ok(None),
                closed = peer_closed(&client.stream) => {
                    if closed {
                        return Err(Outcome::ClientGone);
                    }
                    watch = false;
                }
            }
        } else {
            monoio::select! {
                granted = waited => return Ok(Some(granted)),
                _ = expired => return Ok(None),
            }
        }
    }
}
