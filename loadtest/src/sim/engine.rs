//! Runs a generation job through the timing model: wait for a batch slot, prefill, then emit tokens on schedule.
//!
//! With zero TTFT and ITL nothing sleeps and a whole response leaves in one write, which is
//! what lets one core serve >100k responses/s. With delays, SSE events are flushed exactly when
//! each token is due (deadlines from admission, so sleeps do not drift).

use std::io;
use std::rc::Rc;

use monoio::net::TcpStream;
use monoio::time::Instant;

use crate::rt::write_out;
use crate::sim::handoff;
use crate::sim::pace::stream_tokens;
use crate::sim::pd::Handoff;
use crate::sim::render::Scratch;
use crate::sim::render::{
    flush_events, put_error_body, put_head, put_input_logprobs, put_response, Framing, Gen, DONE_EVENT,
};
use crate::sim::request::Api;
use crate::sim::routes::Job;
use crate::sim::timing::{self, Schedule};
use crate::sim::worker::{bump, Worker};
use crate::wire::LAST_CHUNK;

/// Runs `job`; returns whether the connection may be reused.
pub async fn run(
    w: &Rc<Worker>,
    job: Job,
    stream: &mut TcpStream,
    s: &mut Scratch,
    keep_alive: bool,
) -> io::Result<bool> {
    // A PD decode server takes the request into its batch only once the KV is here; without it
    // the request is not generated (SGLang aborts it with a 500).
    if let (Handoff::Decode(legs), Some(pd)) = (&job.handoff, w.pd.as_ref()) {
        if let Err(msg) = handoff::receive(w, legs, pd.handoff_timeout).await {
            s.events.clear();
            put_error_body(&mut s.events, 500, &msg);
            put_response(&mut s.out, 500, "application/json", &s.events, keep_alive, &w.extra_headers);
            write_out(stream, &mut s.out).await?;
            return Ok(keep_alive);
        }
    }
    let held_tokens = job.prompt_tokens + job.output_tokens as u64;
    let permit = w.gate.admit(held_tokens).await;
    let admitted = Instant::now();
    bump(&w.stats.used_tokens, held_tokens);
    let sched = match job.handoff {
        Handoff::Decode(_) => timing::decode_schedule(&w.timing.get(), w.running(), w.max_running),
        _ => timing::schedule(&w.timing.get(), job.prompt_tokens - job.cached_tokens, w.running(), w.max_running),
    };
    if let (rooms @ [_, ..], Some(pd)) = (job.handoff.finishes(), w.pd.as_ref()) {
        // The prompt's KV exists once its first token is due: from then on the decode may take
        // it. The one-token answer below is then due at once.
        sleep_until(admitted + sched.first_token).await;
        for room in rooms {
            pd.rooms.finish(*room);
        }
    }
    // Rendered once: a streamed answer repeats it in every chunk.
    let input_logprobs = job.logprobs.clone().map(|positions| {
        let mut b = Vec::with_capacity(24 * positions.end.saturating_sub(positions.start) as usize + 2);
        put_input_logprobs(&mut b, positions);
        b
    });
    let gen = Gen {
        api: job.api,
        port: w.port,
        id: w.next_id(),
        created: w.created,
        model_json: &w.model_json,
        prompt_tokens: job.prompt_tokens,
        cached_tokens: job.cached_tokens,
        completion_tokens: job.output_tokens,
        finish: if job.hit_limit { "length" } else { "stop" },
        input_logprobs: input_logprobs.as_deref(),
    };
    let result = if job.stream {
        stream_response(w, &gen, &job, sched, admitted, stream, s, keep_alive).await
    } else {
        full_response(w, &gen, &job, sched, admitted, stream, s, keep_alive).await
    };
    w.stats.used_tokens.set(w.stats.used_tokens.get() - held_tokens);
    drop(permit);
    if result.is_ok() {
        bump(&w.stats.completed, 1);
    }
    if w.reached_die_after() && !w.died.is_fired() {
        w.die();
        return Ok(false);
    }
    result
}

async fn sleep_until(deadline: Instant) {
    if deadline > Instant::now() {
        monoio::time::sleep_until(deadline).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn full_response(
    w: &Worker,
    gen: &Gen<'_>,
    job: &Job,
    sched: Schedule,
    admitted: Instant,
    stream: &mut TcpStream,
    s: &mut Scratch,
    keep_alive: bool,
) -> io::Result<bool> {
    if !sched.is_instant() {
        sleep_until(admitted + sched.done_after(job.output_tokens)).await;
    }
    s.events.clear();
    gen.put_full_body(&mut s.events);
    if let (Handoff::VllmPrefill(room), Some(a)) = (&job.handoff, w.pd.as_ref().and_then(|p| p.announce.as_ref())) {
        // vLLM's proxy passes this on to the decode, which fetches the KV where it says.
        a.append(&mut s.events, *room, job.prompt_tokens);
    }
    bump(&w.stats.output_tokens, job.output_tokens as u64);
    let truncated = job.truncate.is_some();
    put_head(
        &mut s.out,
        200,
        "application/json",
        Framing::Length(s.events.len()),
        keep_alive && !truncated,
        &w.extra_headers,
    );
    if truncated {
        // Promise the whole length, deliver half, hang up: the client sees a short body.
        bump(&w.stats.truncated, 1);
        s.out.extend_from_slice(&s.events[..s.events.len() / 2]);
        write_out(stream, &mut s.out).await?;
        return Ok(false);
    }
    s.out.extend_from_slice(&s.events);
    write_out(stream, &mut s.out).await?;
    Ok(keep_alive)
}

#[allow(clippy::too_many_arguments)]
async fn stream_response(
    w: &Worker,
    gen: &Gen<'_>,
    job: &Job,
    sched: Schedule,
    admitted: Instant,
    stream: &mut TcpStream,
    s: &mut Scratch,
    keep_alive: bool,
) -> io::Result<bool> {
    let n = job.output_tokens;
    let each = w.timing.get().write_each_event;
    let cut_after = job.truncate.map(|after| after.unwrap_or(n / 2).min(n));
    put_head(
        &mut s.out,
        200,
        "text/event-stream",
        Framing::Chunked,
        keep_alive && cut_after.is_none(),
        &w.extra_headers,
    );
    s.prefix.clear();
    s.events.clear();
    if matches!(gen.api, Api::Chat | Api::Completions) {
        gen.put_chunk_prefix(&mut s.prefix);
    }
    match gen.api {
        // The role delta goes out at admission, as engines send it before the first token.
        Api::Chat => gen.put_role_event(&mut s.events, &s.prefix),
        Api::Messages => gen.put_message_start(&mut s.events),
        _ => {}
    }
    if each {
        flush_events(&mut s.out, &mut s.events);
        write_out(stream, &mut s.out).await?;
    }
    if !stream_tokens(w, sched, admitted, stream, s, n, cut_after, |events, prefix, k| {
        gen.put_token_event(events, prefix, k + 1)
    })
    .await?
    {
        return Ok(false);
    }
    bump(&w.stats.output_tokens, n as u64);
    if cut_after == Some(n) {
        // Every token went out but the stream still ends without its final events.
        bump(&w.stats.truncated, 1);
        flush_events(&mut s.out, &mut s.events);
        write_out(stream, &mut s.out).await?;
        return Ok(false);
    }
    match gen.api {
        Api::Chat | Api::Completions => {
            gen.put_finish_event(&mut s.events, &s.prefix);
            if job.include_usage {
                gen.put_usage_event(&mut s.events, &s.prefix);
            }
        }
        Api::Messages => gen.put_message_end(&mut s.events),
        _ => {}
    }
    // Anthropic's stream ends with message_stop, not OpenAI's [DONE].
    if gen.api != Api::Messages {
        s.events.extend_from_slice(DONE_EVENT);
    }
    flush_events(&mut s.out, &mut s.events);
    s.out.extend_from_slice(LAST_CHUNK);
    write_out(stream, &mut s.out).await?;
    Ok(keep_alive)
}
