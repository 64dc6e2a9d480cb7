//! The request-side types every routing policy shares: [`Candidate`], [`RouteInput`] and
//! [`RouteError`] (re-exported from `routing`).

/// One of the model's available (healthy) workers, in registration order (stable across
/// shards).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<'a> {
    pub url: &'a str,
    /// This gateway's in-flight requests on the worker (held until the response ends).
    pub load: usize,
    /// The last figure polled from the worker's `/v1/loads`
    /// ([`parse_sglang_loads`](super::loads::parse_sglang_loads)), if any.
    pub engine_load: Option<u64>,
    /// Tokens of the request's prefix the worker's engine says it holds (its KV-cache
    /// events, `cache_aware` on token ids); None: no events from it, the tree guesses.
    pub cached: Option<usize>,
}

/// Everything routing may look at for one request; all borrowed from the request head/body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteInput<'a> {
    pub model: &'a str,
    /// Routing text ([`scan_body`](super::text::scan_body) /
    /// [`routing_text`](super::text::routing_text)).
    pub text: Option<&'a str>,
    /// Token ids: a valid `X-SMG-Routing-Tokens` hint, else the body's ids. Takes precedence
    /// over `text`.
    pub tokens: Option<&'a [u32]>,
    /// Prefix-cache namespace ([`namespace`](super::text::namespace)).
    pub namespace: Option<&'a str>,
    /// The first valid value among `--routing-key-headers`
    /// ([`first_routing_key`](super::headers::first_routing_key)).
    pub routing_key: Option<&'a str>,
    /// `X-SMG-Target-Worker`, raw.
    pub target_worker: Option<&'a str>,
    pub authorization: Option<&'a str>,
    pub forwarded_for: Option<&'a str>,
    pub cookie: Option<&'a str>,
    /// The body `rid`, unstripped (read only with `--routing-key-override`).
    pub rid: Option<&'a str>,
}

/// Why no worker was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteError {
    /// No candidate, or `X-SMG-Target-Worker` names none: 503 `no_available_workers`.
    NoWorker,
}

impl std::fmt::Display for RouteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no available workers")
    }
}

impl std::error::Error for RouteError {}
