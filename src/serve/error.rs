//! Why a request ended without a relayed response, by the side that failed, and the one
//! function that turns each into what the client gets.
//!
//! - [`ClientError`]: the client's framing (head or body). The byte stream is no longer
//!   trustworthy, so the connection closes after the answer.
//! - [`WorkerError`]: the worker's side, whatever its protocol (I/O, an HTTP answer the
//!   relay could not carry, a gRPC engine's status), carrying whether the connection was a
//!   reused pooled one and whether any byte already went to the client. Its methods are the
//!   one place that says what a failure means to the retry edge and to the breaker.
//! - [`InternalError`]: this process ran short of something.
//! - Rejections: the request is well-framed but refused (no route, no worker, the contract).

use std::io;

use crate::api::ApiError;
use crate::contract::ContractError;
use crate::grpc::wire::{self as grpc, Status};
use crate::http::body::BodyError;
use crate::http::head::ParseError;
use crate::http::respond::{write_simple, Simple, Stamp};
use crate::workers::breaker::Verdict;
use crate::workers::WorkerId;

#[derive(Debug)]
pub enum ClientError {
    Head(ParseError),
    Body(BodyError),
}

#[derive(Debug)]
pub enum WorkerCause {
    Connect(io::Error),
    Write(io::Error),
    /// Closed or failed before a byte of the response (what a stale pooled socket does).
    ClosedBeforeHead(io::Error),
    BadHead(&'static str),
    /// No response head within `--request-timeout-secs`.
    HeadTimeout,
    /// The body's framing broke before anything reached the client.
    BadBody(&'static str),
    /// A non-streaming response declared a body over `--max-payload-size`.
    TooLarge {
        len: u64,
        max: usize,
    },
    /// A gRPC engine refused the call (before its first message).
    Engine(Status),
    /// A gRPC engine failed the call after generation began, before anything reached the
    /// client.
    Generation(Status),
    /// A gRPC pair's leg (its prefill, or else its decode) refused the call before the
    /// decode's first message.
    PairEngine {
        status: Status,
        prefill: bool,
    },
    /// A pair's prefill leg answered this non-2xx status, with this message (its error's
    /// `message`, or its body).
    Prefill {
        status: u16,
        message: String,
    },
}

#[derive(Debug)]
pub struct WorkerError {
    pub cause: WorkerCause,
    /// The connection came from the pool.
    pub reused: bool,
    /// Some of the response already reached the client.
    pub sent: bool,
    /// The worker it happened on, when not the picked one (a pair's prefill leg): its id
    /// and URL.
    pub on: Option<(WorkerId, String)>,
}

impl WorkerError {
    pub fn new(cause: WorkerCause, reused: bool) -> Self {
        Self { cause, reused, sent: false, on: None }
    }

    /// The same failure, on `worker` (a pair's prefill) rather than the picked worker.
    pub fn on(mut self, worker: &crate::workers::Worker) -> Self {
        self.on = Some((worker.id, worker.url.url.clone()));
        self
    }

    /// Another worker would not do better: the answer itself is refused (over a size cap,
    /// HTTP's or gRPC's), or the engine says the request is at fault or the method is not
    /// there. Not retried.
    pub fn final_answer(&self) -> bool {
        match &self.cause {
            WorkerCause::TooLarge { .. } => true,
            WorkerCause::Prefill { status, .. } => !crate::retry::retryable_status(*status),
            WorkerCause::Engine(s) | WorkerCause::Generation(s) | WorkerCause::PairEngine { status: s, .. } => {
                grpc::too_large(s) || !crate::retry::retryable_status(grpc::http_status(s.code))
            }
            _ => false,
        }
    }

    /// What this failure says about the worker, for its breaker: a failure, except an HTTP
    /// answer over the size cap (no mark: the worker is well, the answer is refused) and an
    /// engine's statuses, read as the HTTP statuses they map to, where an invalid argument is
    /// the request's fault.
    pub fn verdict(&self) -> Option<Verdict> {
        Some(match &self.cause {
            WorkerCause::TooLarge { .. } => return None,
            WorkerCause::Prefill { status, .. } => Verdict::of_status(*status),
            WorkerCause::Engine(s) | WorkerCause::Generation(s) | WorkerCause::PairEngine { status: s, .. }
                if grpc::too_large(s) =>
            {
                Verdict::Failure
            }
            WorkerCause::Engine(s) | WorkerCause::Generation(s) | WorkerCause::PairEngine { status: s, .. } => {
                match grpc::http_status(s.code) {
                    400 => Verdict::Success,
                    http => Verdict::of_status(http),
                }
            }
            _ => Verdict::Failure,
        })
    }

    /// A reused connection that failed before the worker said anything was most likely
    /// closed by the worker while pooled: the request never reached it, and a fresh
    /// connection may carry it safely.
    pub fn stale_socket(&self) -> bool {
        self.reused && !self.sent && matches!(self.cause, WorkerCause::Write(_) | WorkerCause::ClosedBeforeHead(_))
    }
}

#[derive(Debug)]
pub enum InternalError {
    /// Out of descriptors (or socket memory) connecting to a worker: not the worker's fault.
    NoDescriptors(io::Error),
    /// A bug: the request's phases panicked (see isolate.rs).
    Panic,
}

#[derive(Debug)]
pub enum Failure {
    Client(ClientError),
    Worker(WorkerError),
    Internal(InternalError),
    /// Refused by the gateway's own rules (route, model, workers), with its envelope.
    Rejected(ApiError),
    /// Refused by the request contract, with the contract's own body.
    Invalid(ContractError),
    /// A transcription form the contract refuses: a plain-text `400` with this message.
    Form(String),
    /// No key, or one that matches nothing: 401 with an empty body.
    Unauthorized,
    /// A valid key without the right role: 403 with an empty body.
    Forbidden,
}

impl Failure {
    /// The connection cannot carry another request after this answer.
    pub fn closes_connection(&self) -> bool {
        matches!(self, Failure::Client(_))
    }

    /// Worker-side failures are logged once, where the request finishes.
    pub fn is_worker_side(&self) -> bool {
        matches!(self, Failure::Worker(_) | Failure::Internal(_))
    }
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        Failure::Rejected(e)
    }
}

impl std::fmt::Display for WorkerCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerCause::Connect(e) => write!(f, "connect failed: {e}"),
            WorkerCause::Write(e) => write!(f, "write: {e}"),
            WorkerCause::ClosedBeforeHead(e) => write!(f, "closed before responding: {e}"),
            WorkerCause::BadHead(why) | WorkerCause::BadBody(why) => f.write_str(why),
            WorkerCause::HeadTimeout => f.write_str("no response head within --request-timeout-secs"),
            WorkerCause::TooLarge { len, max } => write!(f, "response of {len} bytes over --max-payload-size {max}"),
            WorkerCause::Engine(s) | WorkerCause::Generation(s) => write!(f, "engine: {s}"),
            WorkerCause::Prefill { status, message } => write!(f, "prefill answered {status}: {message}"),
            WorkerCause::PairEngine { status, prefill: true } => write!(f, "prefill engine: {status}"),
            WorkerCause::PairEngine { status, prefill: false } => write!(f, "decode engine: {status}"),
        }
    }
}

/// The envelope a failure is answered with; `None` for contract rejections, which have a
/// body of their own.
fn api_error(f: &Failure, worker: &str) -> Option<ApiError> {
    Some(match f {
        Failure::Client(ClientError::Head(e)) => match e {
            ParseError::UriTooLong => ApiError::uri_too_long(),
            ParseError::HeadTooLarge => ApiError::head_too_large(),
            ParseError::UnknownCoding => ApiError::unknown_transfer_coding(),
            ParseError::Malformed(why) => ApiError::bad_request(*why),
        },
        Failure::Client(ClientError::Body(e)) => match e {
            BodyError::TooLarge(max) => ApiError::body_too_large(*max),
            BodyError::Stalled => ApiError::body_stalled(),
            BodyError::Malformed(why) => ApiError::bad_request(*why),
            BodyError::Gone => ApiError::bad_request("client closed mid-body"),
        },
        Failure::Worker(w) => match (&w.cause, w.on.as_ref().map_or(worker, |(_, url)| url.as_str())) {
            (WorkerCause::Prefill { status, message }, _) => prefill_error(*status, message),
            (cause, worker) => worker_error(cause, worker),
        },
        Failure::Internal(InternalError::NoDescriptors(e)) => {
            ApiError::internal("upstream_connect_no_descriptors", format!("Cannot open a connection to {worker}: {e}"))
        }
        Failure::Internal(InternalError::Panic) => ApiError::internal("internal_error", "Internal error"),
        Failure::Rejected(e) => e.clone(),
        Failure::Invalid(_) | Failure::Form(_) | Failure::Unauthorized | Failure::Forbidden => return None,
    })
}

/// A pair's prefill leg failed with an HTTP status: that status and the engine's message,
/// under SMG's codes for it.
fn prefill_error(status: u16, message: &str) -> ApiError {
    let code = match status {
        400 => "prefill_bad_request",
        404 => "prefill_not_found",
        500 => "prefill_internal_error",
        502 => "prefill_bad_gateway",
        503 => "prefill_unavailable",
        _ => "prefill_error",
    };
    ApiError::new(status, code, format!("Prefill server error ({status}): {message}"))
}

/// The envelope of a worker-side failure on `worker`.
fn worker_error(cause: &WorkerCause, worker: &str) -> ApiError {
    match cause {
        WorkerCause::Connect(e) => ApiError::upstream_connect(worker, e),
        WorkerCause::HeadTimeout => ApiError::upstream_timeout(worker),
        WorkerCause::TooLarge { len, max } => ApiError::upstream_too_large(worker, *len, *max),
        // An engine message over `--grpc-max-message-size` (refused from its length
        // prefix): too large for the gateway, as an HTTP answer over
        // `--max-payload-size` is; a 502, not the 429 its RESOURCE_EXHAUSTED would map
        // to, as the client is over no limit of its own.
        WorkerCause::Engine(s) | WorkerCause::Generation(s) | WorkerCause::PairEngine { status: s, .. }
            if grpc::too_large(s) =>
        {
            ApiError::new(
                502,
                "upstream_response_too_large",
                format!("The engine sent a message over --grpc-max-message-size ({})", s.message),
            )
        }
        // The engine did not start generation: the status follows its gRPC status.
        WorkerCause::Engine(s) => ApiError::new(
            grpc::http_status(s.code),
            "start_generation_failed",
            format!("Generation failed to start: {s}"),
        ),
        WorkerCause::Generation(s) => {
            ApiError::new(grpc::http_status(s.code), "generation_failed", format!("Generation failed: {s}"))
        }
        WorkerCause::PairEngine { status: s, prefill: true } => ApiError::new(
            grpc::http_status(s.code),
            "prefill_worker_failed_to_start",
            format!("Prefill worker failed to start: {}", s.message),
        ),
        WorkerCause::PairEngine { status: s, prefill: false } => ApiError::new(
            grpc::http_status(s.code),
            "decode_worker_failed_to_start",
            format!("Decode worker failed to start: {}", s.message),
        ),
        cause => ApiError::upstream_failed(worker, &cause.to_string()),
    }
}

/// Appends the answer to `f` and returns its status and `X-SMG-Error-Code` ("" for none):
/// the one place failures become responses.
pub fn respond(
    out: &mut Vec<u8>,
    f: &Failure,
    worker: &str,
    head_only: bool,
    stamp: &Stamp<'_>,
) -> (u16, &'static str) {
    if let Failure::Unauthorized | Failure::Forbidden = f {
        let status = if matches!(f, Failure::Unauthorized) { 401 } else { 403 };
        write_simple(out, &Simple { status, content_type: "", headers: &[], body: b"" }, head_only, stamp);
        return (status, "");
    }
    if let Failure::Invalid(c) = f {
        let body = c.body();
        let resp = Simple { status: c.status(), content_type: "application/json", headers: &[], body: &body };
        write_simple(out, &resp, head_only, stamp);
        return (c.status(), "");
    }
    if let Failure::Form(msg) = f {
        let resp =
            Simple { status: 400, content_type: "text/plain; charset=utf-8", headers: &[], body: msg.as_bytes() };
        write_simple(out, &resp, head_only, stamp);
        return (400, "");
    }
    let e = api_error(f, worker).unwrap_or_else(|| ApiError::internal("internal_error", "unmapped failure"));
    e.write_response(out, head_only, stamp);
    (e.status, e.code)
}

/// A short description for the log line of a worker-side failure.
pub fn cause(f: &Failure) -> String {
    match f {
        Failure::Worker(w) => w.cause.to_string(),
        Failure::Internal(InternalError::NoDescriptors(e)) => format!("out of descriptors: {e}"),
        Failure::Internal(InternalError::Panic) => "a bug: the request panicked".into(),
        other => format!("{other:?}"),
    }
}
