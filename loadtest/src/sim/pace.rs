//! A stream's tokens on the timing model, shared by every streaming answer the simulator
//! writes (engine.rs's chat, completions and messages; provider_responses.rs's Responses
//! events): when each token is due, and a truncation fault's cut.

use std::io;

use monoio::net::TcpStream;
use monoio::time::Instant;

use crate::rt::write_out;
use crate::sim::render::{flush_events, Scratch};
use crate::sim::timing::{self, Schedule};
use crate::sim::worker::{bump, Worker};

/// Writes a stream's `n` token events, each by `put(events, prefix, k)`, on the timing model.
/// Token k is due one ITL after token k-1, at the ITL of the batch as it is then: a stream
/// slows down when others join and speeds up when they leave. Deadlines chain from admission
/// (not from when the task woke), so sleeps do not drift. False: the stream was cut after
/// `cut_after` tokens (a truncation fault), and ends now.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn stream_tokens(
    w: &Worker,
    sched: Schedule,
    admitted: Instant,
    stream: &mut TcpStream,
    s: &mut Scratch,
    n: u32,
    cut_after: Option<u32>,
    mut put: impl FnMut(&mut Vec<u8>, &[u8], u32),
) -> io::Result<bool> {
    let each = w.timing.get().write_each_event;
    let (t, dynamic) = (w.timing.get(), w.timing.get().itl_batch_factor > 0.0);
    let mut due = admitted + sched.first_token;
    for k in 0..n {
        if k > 0 {
            due += if dynamic { timing::itl(&t, w.running(), w.max_running) } else { sched.itl };
        }
        if cut_after == Some(k) {
            bump(&w.stats.truncated, 1);
            bump(&w.stats.output_tokens, k as u64);
            flush_events(&mut s.out, &mut s.events);
            write_out(stream, &mut s.out).await?;
            return Ok(false);
        }
        if due > Instant::now() {
            flush_events(&mut s.out, &mut s.events);
            write_out(stream, &mut s.out).await?;
            monoio::time::sleep_until(due).await;
        }
        put(&mut s.events, &s.prefix, k);
        if each {
            flush_events(&mut s.out, &mut s.events);
            write_out(stream, &mut s.out).await?;
        }
    }
    Ok(true)
}
