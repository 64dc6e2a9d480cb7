//! The request context: everything known about one request, created when its head is
//! parsed and classified, passed `&mut` through every phase, consumed by `finish`.

use std::rc::Rc;
use std::time::Instant;

use smg_wire::num::hex_digits;

use crate::admission::auth::Tenant;
use crate::admission::priority::Class;
use crate::admission::priority::Slot;
use crate::admission::Permit;
use crate::api::Route;
use crate::budget::shard::Reservation;
use crate::http::head::RequestHead;
use crate::shard::{InflightGuard, LoadGuard, LocalSnapshot, Shard};
use crate::trace::SpanIds;
use crate::workers::breaker::Verdict;
use crate::workers::{Worker, WorkerId};

/// Proof that pick chose a worker: what attempts and relays take (pick alone makes one), so
/// none of them asks the context whether a worker was chosen.
#[derive(Clone)]
pub struct Picked {
    snapshot: LocalSnapshot,
    /// Position in `snapshot.workers`.
    pos: usize,
    /// A decode worker's prefill leg (serve/pair.rs), likewise.
    prefill: Option<usize>,
}

impl Picked {
    pub(super) fn new(snapshot: LocalSnapshot, pos: usize, prefill: Option<usize>) -> Self {
        Picked { snapshot, pos, prefill }
    }

    /// The worker whose answer the client gets (a pair's decode worker).
    pub fn worker(&self) -> &Worker {
        &self.snapshot.workers[self.pos]
    }

    /// The prefill worker picked beside a decode worker.
    pub fn prefill(&self) -> Option<&Worker> {
        self.prefill.map(|p| &self.snapshot.workers[p])
    }
}

/// The worker a request was sent to, kept in the context for `finish` (accounting, logs).
pub struct Chosen {
    pub picked: Picked,
    /// The request's count on the worker's load, released when `finish` drops the context.
    pub _load: LoadGuard,
    /// Likewise on a pair's prefill worker.
    pub _prefill_load: Option<LoadGuard>,
}

impl Chosen {
    pub fn worker(&self) -> &Worker {
        self.picked.worker()
    }
}

/// Verdicts of a request's attempts: the first inline (most requests make one attempt, and
/// a request allocates nothing for it), retries' in a list.
#[derive(Default)]
struct Verdicts {
    first: Option<(WorkerId, Verdict)>,
    more: Vec<(WorkerId, Verdict)>,
}

impl Verdicts {
    /// `worker`'s verdict is this attempt's, replacing an earlier attempt's there.
    fn note(&mut self, worker: WorkerId, v: Verdict) {
        match &mut self.first {
            None => self.first = Some((worker, v)),
            Some(f) if f.0 == worker => f.1 = v,
            Some(_) => match self.more.iter_mut().find(|(w, _)| *w == worker) {
                Some(m) => m.1 = v,
                None => self.more.push((worker, v)),
            },
        }
    }

    fn drain(self) -> impl Iterator<Item = (WorkerId, Verdict)> {
        self.first.into_iter().chain(self.more)
    }
}

/// A request's id, inline up to 40 bytes: ours are at most 33 (`chatcmpl-` and 24 hex digits),
/// and one allocation a request fewer (see `Shard::candidates`).
pub type RequestId = smallvec::SmallVec<[u8; 40]>;

/// When things happened.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    pub started: Instant,
    /// The worker was picked: `--request-timeout-secs` counts from here, so time in the
    /// admission queue or spent receiving the body is not the worker's.
    pub upstream_started: Option<Instant>,
    /// The worker's response head arrived (taken when metrics, the access log or traces
    /// are on).
    pub upstream_head: Option<Instant>,
    /// The response's first bytes went to the client (likewise).
    pub first_byte: Option<Instant>,
}

pub struct RequestCtx {
    pub request_id: RequestId,
    /// None only for a head that could not be parsed.
    pub route: Option<Route>,
    /// The tenant identity, set by `authorize` on serving routes; read by the phases after
    /// it (budgets, priority classes, metrics and the access line read it from here).
    pub tenant: Option<Tenant>,
    /// The admission permit, held until `finish` drops the context.
    pub permit: Option<Permit>,
    /// A pair's slot in its decode worker's running window (serve/pair_admit.rs), held
    /// likewise; the next attempt's replaces it.
    pub decode_slot: Option<Permit>,
    /// A pair's place among its prefill worker's legs in flight, given back when the
    /// prefill leg ends (or with the context).
    pub prefill_slot: Option<Permit>,
    /// The tenant budget's reservation, settled by `finish` (dropped unsettled: the
    /// estimate stands).
    pub reservation: Option<Reservation>,
    /// Most output tokens per choice, and choices, as the contract read them.
    pub max_output: Option<u32>,
    pub choices: u32,
    /// The priority scheduler's slot (instead of `permit`), likewise; it also says whether
    /// the request was preempted.
    pub slot: Option<Slot>,
    /// The priority class it was admitted (or refused) in, with the scheduler on.
    pub class: Option<Class>,
    pub model: Option<String>,
    pub chosen: Option<Chosen>,
    /// Upstream attempts made (the retry edge adds one).
    pub attempts: u8,
    /// What each attempt said about its worker, handed to the breakers by `finish`.
    verdicts: Verdicts,
    /// Tokens the worker says the request used, where it is not a relayed body's `usage`
    /// (Decisions); `finish` settles the budget with it.
    pub used_tokens: Option<u64>,
    /// The KV precision metric's two sides: the prompt tokens the chosen worker holds by its
    /// KV-cache events, as routing read them (set by `pick`), and the `cached_tokens` its
    /// engine reported (set by `finish` from the relayed usage).
    pub kv_predicted: Option<u64>,
    pub engine_cached: Option<u64>,
    /// It failed with every attempt the retry policy allows used.
    pub retries_exhausted: bool,
    pub timings: Timings,
    /// Request body bytes received; response bytes sent to the client.
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// The status the client got (the gateway's or the worker's); 0 until one was sent.
    pub status: u16,
    /// The gateway's `X-SMG-Error-Code` on its own error answers; "" otherwise.
    pub error_code: &'static str,
    /// The request asked for a streamed response (`"stream": true`, where the contract reads it).
    pub streaming: bool,
    /// The admission decision, when the limit is on.
    pub admitted: Option<bool>,
    /// On the routes whose bodies may stream: streamed or buffered, and why.
    pub body_path: Option<(&'static str, &'static str)>,
    /// With `--enable-trace`: this request's span, and when it started on the wall clock.
    pub span: Option<(SpanIds, std::time::SystemTime)>,
    /// The client asked to close (`Connection: close`, HTTP/1.0 without keep-alive), or the
    /// shard is draining. Read by `finish`, which alone decides keep-alive.
    pub close: bool,
    /// The client spoke HTTP/1.0.
    pub http10: bool,
    /// The body was not read (an early answer): `finish` drains it or closes.
    pub body_unread: bool,
    /// The body's provider profile (inspect), for replies the gateway assembles.
    pub profile: crate::contract::Profile,
    _inflight: InflightGuard,
}

impl Drop for RequestCtx {
    fn drop(&mut self) {
        if let Some(name) = self.model.take() {
            crate::contract::give_back_model_name(name);
        }
    }
}

impl RequestCtx {
    pub fn new(shard: &Rc<Shard>, head: &RequestHead, buf: &[u8], route: Route) -> Self {
        let mut ctx = Self::bare(shard, head.close, head.http10);
        ctx.request_id = request_id(shard, Some((head, buf)), route.id_prefix());
        ctx.route = Some(route);
        ctx.body_unread = !matches!(head.body, crate::http::head::BodyKind::Empty);
        if shard.tracing() {
            let ids = SpanIds::new(head.header(buf, "traceparent"), || shard.next_random());
            ctx.span = Some((ids, std::time::SystemTime::now()));
        }
        ctx
    }

    /// For a head that was refused (`buf` holds it): the client's own id where the head can
    /// still be read, else a generated one; the connection closes.
    pub fn unparsed(shard: &Rc<Shard>, buf: &[u8]) -> Self {
        let mut ctx = Self::bare(shard, true, false);
        let client_id = shard
            .cfg()
            .request_id_headers
            .iter()
            .find_map(|name| crate::http::head::header_of_refused(buf, name).filter(|v| printable_id(v)));
        ctx.request_id = match client_id {
            Some(id) => RequestId::from_slice(id),
            None => request_id(shard, None, "req-"),
        };
        ctx
    }

    fn bare(shard: &Rc<Shard>, close: bool, http10: bool) -> Self {
        RequestCtx {
            request_id: RequestId::new(),
            route: None,
            tenant: None,
            permit: None,
            decode_slot: None,
            prefill_slot: None,
            reservation: None,
            max_output: None,
            choices: 1,
            slot: None,
            class: None,
            model: None,
            chosen: None,
            attempts: 0,
            verdicts: Verdicts::default(),
            used_tokens: None,
            kv_predicted: None,
            engine_cached: None,
            retries_exhausted: false,
            timings: Timings {
                started: crate::clock::now(),
                upstream_started: None,
                upstream_head: None,
                first_byte: None,
            },
            bytes_in: 0,
            bytes_out: 0,
            status: 0,
            error_code: "",
            streaming: false,
            admitted: None,
            body_path: None,
            span: None,
            close: close || shard.is_draining(),
            http10,
            body_unread: false,
            profile: crate::contract::Profile::OpenAi,
            _inflight: shard.begin_request(),
        }
    }

    /// Notes what an attempt said about `worker`; once per attempt (see `finish`).
    /// Notes what an attempt says about `worker`. A request counts once per worker it
    /// tried, with its last attempt there: retries against one worker must not multiply one
    /// request's failure on its breaker (a client's bad input cannot take a model offline).
    pub fn judge(&mut self, worker: WorkerId, v: Verdict) {
        self.verdicts.note(worker, v);
    }

    /// The attempts' verdicts, each given out once.
    pub fn take_verdicts(&mut self) -> impl Iterator<Item = (WorkerId, Verdict)> {
        std::mem::take(&mut self.verdicts).drain()
    }

    pub fn id_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.request_id)
    }

    pub fn worker_url(&self) -> &str {
        self.chosen.as_ref().map(|c| c.worker().url.url.as_str()).unwrap_or("-")
    }
}

/// A client's request id the gateway takes as its own: printable, no spaces, not empty.
fn printable_id(v: &[u8]) -> bool {
    !v.is_empty() && v.iter().all(|b| b.is_ascii_graphic())
}

/// The client's own id (first of `--request-id-headers` with a printable value), else a
/// fresh one with the route's prefix.
fn request_id(shard: &Shard, head: Option<(&RequestHead, &[u8])>, prefix: &str) -> RequestId {
    if let Some((head, buf)) = head {
        for name in &shard.cfg().request_id_headers {
            if let Some(v) = head.header(buf, name).filter(|v| printable_id(v)) {
                return RequestId::from_slice(v);
            }
        }
    }
    let mut digits = [0u8; 24];
    hex_digits(shard.next_random(), &mut digits[..16]);
    hex_digits(shard.next_random(), &mut digits[16..]);
    let mut id = RequestId::from_slice(prefix.as_bytes());
    id.extend_from_slice(&digits);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_counts_once_per_worker_with_its_last_attempt_there() {
        let (a, b) = (WorkerId(0), WorkerId(1));
        let mut v = Verdicts::default();
        for _ in 0..5 {
            v.note(a, Verdict::Failure);
        }
        v.note(b, Verdict::Failure);
        v.note(b, Verdict::Success);
        v.note(a, Verdict::Neutral);
        assert_eq!(v.drain().collect::<Vec<_>>(), [(a, Verdict::Neutral), (b, Verdict::Success)]);
    }
}
