//! Phases pick → attempt → outcome → retry: the one upstream loop, whatever protocol the
//! picked worker speaks. Each protocol's attempt lives in its own module (HTTP and HTTP
//! Decisions in `upstream`, gRPC in `grpc`) and ends in an answer or a [`WorkerError`]
//! that says what happened; this loop alone decides what follows:
//!
//! - a stale pooled socket (nothing reached the worker): the same worker, on a fresh
//!   connection;
//! - any other worker-side failure, or an HTTP answer with a retryable status, while
//!   attempts are left and nothing reached the client: a worker picked again, after the
//!   backoff. The failed workers are passed over while others are left, so a model served
//!   by HTTP and gRPC workers fails over from one protocol to the other;
//! - otherwise the answer is relayed, or the failure is the client's answer.
//!
//! Each attempt's verdict on its worker goes into the request context, once; `finish`
//! hands them to the breakers.

use std::rc::Rc;

use super::client::Client;
use super::ctx::RequestCtx;
use super::error::{Failure, WorkerError};
use super::finish::Outcome;
use super::upstream::{relay_response, Answered, AttemptError, HttpRequest};
use super::{decisions, grpc, merged, pair, pair_admit, pick, provider_turn, reshaped};
use crate::api::{ApiError, EndpointSpec};
use crate::http::body::Body;
use crate::http::head::RequestHead;
use crate::io::sleep;
use crate::responses::provider_turn::ProviderTurn;
use crate::retry::{self, RetryPolicy};
use crate::shard::Shard;
use crate::workers::breaker::Verdict;
use crate::workers::provider::Provider;
use crate::workers::WorkerId;

/// What an attempt got: an answer to relay, by protocol.
enum Answer {
    Http(Answered),
    /// A pair's 2xx `/generate` answer, with the prefill's prompt log-probabilities to merge.
    Merged(Answered, pair::Merge),
    Grpc(grpc::Begun),
}

/// What the phases before made of the request for the loop.
pub(super) enum Made<'a> {
    /// Nothing: the client's request, as it came.
    Nothing,
    /// A gRPC request (a Responses turn's chat, src/serve/responses.rs).
    Grpc(Box<grpc::GrpcRequest>),
    /// A Responses turn the gateway keeps for a provider, its answer relayed by
    /// src/serve/provider_turn.rs.
    Kept(&'a ProviderTurn),
}

/// See the module doc.
pub(super) async fn forward(
    shard: &Rc<Shard>,
    client: &mut Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    spec: &EndpointSpec,
    body: &mut Body,
    made: Made<'_>,
) -> Outcome {
    // The gRPC request stays boxed: inline, its size was copied into this future (and on
    // every move of it) on every request, gRPC or not.
    let (made, kept) = match made {
        Made::Nothing => (None, None),
        Made::Grpc(g) => (Some(g), None),
        Made::Kept(k) => (None, Some(k)),
    };
    let mut http = HttpRequest::new(spec, head, &client.buf);
    // gRPC workers with a text policy route on the prompt's token ids: tokenized before pick.
    // A Responses turn comes with its chat request made.
    let mut on_grpc = match made {
        Some(g) => Some(g),
        None if shard.snapshot().any_grpc => grpc::early(shard, spec, ctx, body.bytes(&client.buf)).map(Box::new),
        None => None,
    };
    let mut watch = true;
    let mut fresh = false;
    // Workers this request failed on (allocates only on a retry).
    let mut failed_on: Vec<WorkerId> = Vec::new();
    loop {
        let tokens = on_grpc.as_ref().and_then(|g| g.tokens());
        let picked =
            match pick::pick_worker(shard, spec, head, &client.buf, body.bytes(&client.buf), ctx, &failed_on, tokens) {
                Ok(p) => p,
                Err(f) => return Outcome::Failed(f),
            };
        let worker = picked.worker();
        let (id, is_grpc, pair) = (worker.id, worker.url.grpc, picked.prefill().is_some());
        if is_grpc && on_grpc.is_none() {
            match grpc::GrpcRequest::new(spec, body.bytes(&client.buf), ctx.model.as_deref()) {
                Ok(g) => on_grpc = Some(Box::new(g)),
                Err(f) => return Outcome::Failed(f),
            }
        }
        if pair {
            if let Err(o) = pair_admit::admit(shard, client, ctx, &picked).await {
                return o;
            }
        }
        ctx.attempts += 1;
        // Until its response reaches the client, a request holding a scheduler slot may be
        // preempted: the attempt (and with it the worker connection) is dropped at once.
        let held = ctx.slot.as_ref().map(|s| Rc::clone(s.held()));
        // A closure, so that the common path awaits the future where it is made: a future kept
        // in a variable and then awaited is copied whole into the await (two copies of the
        // attempt's state per request, `bench/callgrind-per-request`).
        let mut attempt = async || {
            match on_grpc.as_mut() {
                Some(g) if is_grpc => grpc::attempt(shard, client, ctx, &picked, g).await.map(Answer::Grpc),
                // Boxed: a pair's legs make a large future, which a request to one worker
                // would otherwise carry (and copy) in its own.
                _ if pair => Box::pin(pair::attempt(shard, client, head, ctx, spec, &picked, body, fresh, &mut watch))
                    .await
                    .map(|(answered, items)| match items {
                        Some(merge) => Answer::Merged(answered, merge),
                        None => Answer::Http(answered),
                    }),
                _ => http.attempt(shard, client, head, ctx, &picked, body, fresh, &mut watch).await.map(Answer::Http),
            }
        };
        let attempted = match held {
            Some(held) => {
                monoio::select! {
                    r = attempt() => {
                        if r.is_ok() {
                            held.start();
                        }
                        r
                    }
                    _ = held.preempted() => {
                        // The attempt may have been writing the body from the connection's
                        // buffer when it was dropped: what followed it cannot be trusted.
                        ctx.close = true;
                        return Outcome::Failed(Failure::Rejected(ApiError::scheduler_preempted()));
                    }
                }
            }
            None => attempt().await,
        };
        let failure: Option<WorkerError> = match attempted {
            Ok(Answer::Grpc(begun)) => {
                // A pair's prefill took its calls (its failures end the attempt first).
                if let Some(p) = picked.prefill() {
                    ctx.judge(p.id, Verdict::Success);
                }
                let Some(g) = on_grpc.as_ref() else { unreachable!("a gRPC attempt had its request") };
                match grpc::relay(shard, client, head, ctx, g, begun).await {
                    Ok(o) => return o,
                    Err(e) => Some(e),
                }
            }
            Ok(Answer::Http(answered))
                if retry_status(
                    answered.head.status,
                    ctx.attempts,
                    shard.cfg().retry,
                    picked.worker().meta.provider,
                ) =>
            {
                // Dropping the answer closes its connection: its body is not worth reading.
                let status = answered.head.status;
                drop(answered);
                ctx.judge(id, Verdict::of_status(status));
                crate::debug!("request {}: worker {} answered {status}; retrying", ctx.id_str(), ctx.worker_url());
                None
            }
            Ok(Answer::Http(answered)) if kept.is_some() && (200..300).contains(&answered.head.status) => {
                let Some(turn) = kept else { unreachable!("a kept turn") };
                let (shape, mut keeping) = provider_turn::reshape(turn);
                // Boxed, as a pair's merge: the relay's future would otherwise enlarge every request's.
                match Box::pin(reshaped::relay(shard, client, head, ctx, &picked, answered, shape, &mut keeping)).await
                {
                    Ok(o) => return o,
                    Err(e) => Some(e),
                }
            }
            Ok(Answer::Http(answered)) if http.translates(&picked) && (200..300).contains(&answered.head.status) => {
                let Some(plan) = http.plan() else { unreachable!("a translated attempt had its plan") };
                return decisions::answer(shard, ctx, &picked, answered.conn, answered.head, plan).await;
            }
            Ok(Answer::Http(answered)) => {
                ctx.retries_exhausted = retry::retryable_status(answered.head.status) && exhausted(shard, ctx);
                let spare = std::mem::take(&mut http.up_head);
                match relay_response(shard, client, head, ctx, &picked, answered, spare, watch).await {
                    Ok(o) => return o,
                    Err((e, spare)) => {
                        http.up_head = spare;
                        Some(e)
                    }
                }
            }
            Ok(Answer::Merged(answered, merge)) => {
                let (shape, mut merging) = merged::reshape(&picked, &merge);
                match Box::pin(reshaped::relay(shard, client, head, ctx, &picked, answered, shape, &mut merging)).await
                {
                    Ok(o) => return o,
                    Err(e) => Some(e),
                }
            }
            Err(AttemptError::Failed(Failure::Worker(e))) => Some(e),
            Err(AttemptError::Failed(f)) => return Outcome::Failed(f),
            Err(AttemptError::ClientGone) => return Outcome::ClientGone,
        };
        // The worker that failed: the picked one, or a pair's prefill leg.
        let mut failed = id;
        if let Some(e) = failure {
            failed = e.on.as_ref().map_or(id, |on| on.0);
            match after_failure(&e, fresh, ctx.attempts, shard.cfg().retry) {
                Next::Fresh => {
                    // Its siblings in the pool were opened to the same worker process.
                    shard.forget_conns(failed);
                    crate::debug!("request {}: stale pooled connection; retrying on a fresh one", ctx.id_str());
                    fresh = true;
                    continue;
                }
                Next::Fail { exhausted } => {
                    if let Some(v) = e.verdict() {
                        ctx.judge(failed, v);
                    }
                    ctx.retries_exhausted = exhausted;
                    return Outcome::Failed(Failure::Worker(e));
                }
                Next::Retry => {
                    if let Some(v) = e.verdict() {
                        ctx.judge(failed, v);
                    }
                    crate::debug!("request {}: worker {}: {}; retrying", ctx.id_str(), ctx.worker_url(), e.cause);
                }
            }
        }
        failed_on.push(failed);
        ctx.chosen = None;
        fresh = false;
        let Some(policy) = shard.cfg().retry else { unreachable!("retried with retries off") };
        let unit = (shard.next_random() >> 11) as f64 / (1u64 << 53) as f64;
        sleep(policy.backoff(u32::from(ctx.attempts) + 1, unit)).await;
    }
}

/// What follows a worker-side failure of attempt number `attempts`.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// The same worker on a fresh connection: a pooled socket proved stale (the request
    /// never reached the worker). Once per pick.
    Fresh,
    /// Another worker, after the backoff.
    Retry,
    /// The failure is the answer; `exhausted`: every attempt the policy allows was used.
    Fail { exhausted: bool },
}

/// The retry rule for failures, whatever the protocol: a stale socket gets one fresh
/// connection; a failure another worker could not do better on is final; any other is
/// retried while attempts are left (`retry` None: retries are off).
fn after_failure(e: &WorkerError, fresh: bool, attempts: u8, retry: Option<RetryPolicy>) -> Next {
    if e.stale_socket() && !fresh {
        return Next::Fresh;
    }
    if e.final_answer() {
        return Next::Fail { exhausted: false };
    }
    match retry {
        Some(p) if u32::from(attempts) < p.max_attempts => Next::Retry,
        Some(_) => Next::Fail { exhausted: true },
        None => Next::Fail { exhausted: false },
    }
}

/// An HTTP answer with this status is dropped and the request retried elsewhere. A cloud
/// provider's 429 is its rate limit on this key: asking again (any of its workers holds the
/// same key) only spends the limit, so it goes to the caller, `Retry-After` and all.
fn retry_status(status: u16, attempts: u8, retry: Option<RetryPolicy>, provider: Option<Provider>) -> bool {
    let limited = status == 429 && provider.is_some();
    retry::retryable_status(status) && !limited && retry.is_some_and(|p| u32::from(attempts) < p.max_attempts)
}

/// Retries are on and this request used every attempt.
fn exhausted(shard: &Shard, ctx: &RequestCtx) -> bool {
    shard.cfg().retry.is_some_and(|p| u32::from(ctx.attempts) >= p.max_attempts)
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::time::Duration;

    use super::*;
    use crate::grpc::wire::{Code, Status};
    use crate::serve::error::WorkerCause;

    fn policy(max_attempts: u32) -> Option<RetryPolicy> {
        let d = Duration::from_millis(1);
        Some(RetryPolicy { max_attempts, initial: d, max: d, multiplier: 1.0, jitter: 0.0 })
    }

    fn err(cause: WorkerCause, reused: bool) -> WorkerError {
        WorkerError::new(cause, reused)
    }

    fn io() -> io::Error {
        io::Error::from(io::ErrorKind::ConnectionReset)
    }

    #[test]
    fn a_stale_pooled_socket_gets_one_fresh_connection_then_counts_as_an_attempt() {
        let stale = err(WorkerCause::ClosedBeforeHead(io()), true);
        assert_eq!(after_failure(&stale, false, 1, policy(3)), Next::Fresh);
        assert_eq!(after_failure(&stale, false, 1, None), Next::Fresh, "even with retries off");
        assert_eq!(after_failure(&stale, true, 1, policy(3)), Next::Retry);
        assert_eq!(after_failure(&stale, true, 3, policy(3)), Next::Fail { exhausted: true });
        // A fresh connection that fails the same way is the worker's failure.
        let fresh = err(WorkerCause::ClosedBeforeHead(io()), false);
        assert_eq!(after_failure(&fresh, false, 1, policy(3)), Next::Retry);
    }

    #[test]
    fn io_failures_and_retryable_engine_statuses_are_retried_alike() {
        let failures = [
            err(WorkerCause::Connect(io()), false),
            err(WorkerCause::HeadTimeout, false),
            err(WorkerCause::BadBody("cut"), true),
            err(WorkerCause::Engine(Status::new(Code::UNAVAILABLE, "down")), false),
            err(WorkerCause::Engine(Status::new(Code::RESOURCE_EXHAUSTED, "full")), false),
        ];
        for e in &failures {
            assert_eq!(after_failure(e, false, 1, policy(2)), Next::Retry, "{e:?}");
            assert_eq!(after_failure(e, false, 2, policy(2)), Next::Fail { exhausted: true }, "{e:?}");
            assert_eq!(after_failure(e, false, 1, None), Next::Fail { exhausted: false }, "{e:?}");
        }
    }

    #[test]
    fn what_another_worker_would_refuse_too_is_final_and_judged_by_its_cause() {
        let invalid = err(WorkerCause::Engine(Status::new(Code::INVALID_ARGUMENT, "bad")), false);
        assert_eq!(after_failure(&invalid, false, 1, policy(5)), Next::Fail { exhausted: false });
        assert_eq!(invalid.verdict(), Some(Verdict::Success), "the request's fault, not the worker's");
        let internal = err(WorkerCause::Engine(Status::new(Code::INTERNAL, "boom")), false);
        assert_eq!(after_failure(&internal, false, 1, policy(5)), Next::Fail { exhausted: false }, "500, as HTTP's");
        assert_eq!(internal.verdict(), Some(Verdict::Failure));
        let too_large = err(WorkerCause::TooLarge { len: 10, max: 5 }, false);
        assert_eq!(after_failure(&too_large, false, 1, policy(5)), Next::Fail { exhausted: false });
        assert_eq!(too_large.verdict(), None, "no mark on the worker");
        let full = err(WorkerCause::Engine(Status::new(Code::RESOURCE_EXHAUSTED, "full")), false);
        assert_eq!(full.verdict(), Some(Verdict::Neutral), "429: pushing back, alive");
        assert_eq!(err(WorkerCause::Connect(io()), false).verdict(), Some(Verdict::Failure));
    }

    #[test]
    fn http_answers_are_retried_on_the_retryable_statuses_while_attempts_last() {
        for s in [408, 429, 502, 503, 504] {
            assert!(retry_status(s, 1, policy(2), None), "{s}");
            assert!(!retry_status(s, 2, policy(2), None), "{s}: attempts used");
            assert!(!retry_status(s, 1, None, None), "{s}: retries off");
        }
        for s in [200, 400, 404, 500, 501] {
            assert!(!retry_status(s, 1, policy(5), None), "{s}: answered once, as is");
        }
        // A provider's rate limit goes to the caller; its 503 is retried as any worker's.
        assert!(!retry_status(429, 1, policy(5), Some(Provider::OpenAi)));
        assert!(retry_status(503, 1, policy(5), Some(Provider::Anthropic)));
    }
}
