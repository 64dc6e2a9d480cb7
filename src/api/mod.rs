//! The API surface, decided from the head alone: `(method, path)` → [`Route`], before a byte
//! of the body is read. Inference endpoints carry their [`EndpointSpec`] (schema, routing
//! text, id prefix) from one table; everything else is answered here ([`local`]).

pub mod decisions;
pub mod error;
pub mod history;
pub mod local;
pub mod realtime;
pub mod transcriptions;

pub use error::ApiError;

use crate::contract;
use crate::http::head::Method;
use crate::routing::TextSource;

/// What the gateway knows about one inference endpoint.
#[derive(Debug, PartialEq, Eq)]
pub struct EndpointSpec {
    pub path: &'static str,
    /// The `endpoint` label of the router metrics (SMG's names; `other` for the rest).
    pub metric: &'static str,
    /// Prefix of ids the gateway generates for this endpoint (OpenAI's own where one exists).
    pub id_prefix: &'static str,
    /// The request schema the contract validates, if it models this endpoint.
    pub schema: Option<contract::Endpoint>,
    /// Where the routing text lives in the body, for policies that route on it.
    pub text: Option<TextSource>,
    /// A large body may stream to the worker unparsed (SMG's list of such routes; see
    /// `serve::stream_body`).
    pub body_streams: bool,
    /// A Realtime API route: served only by workers labeled `realtime: "true"`.
    pub realtime: bool,
    /// A Responses turn the gateway serves itself (on gRPC workers; src/serve/responses.rs).
    pub turn: bool,
}

const fn spec(
    path: &'static str,
    id_prefix: &'static str,
    schema: Option<contract::Endpoint>,
    text: Option<TextSource>,
) -> EndpointSpec {
    let metric = match path.as_bytes() {
        b"/v1/chat/completions" => "chat",
        b"/v1/completions" => "completions",
        b"/generate" => "generate",
        b"/v1/rerank" | b"/rerank" => "rerank",
        b"/v1/responses" => "responses",
        b"/v1/messages" => "messages",
        b"/v1/decisions" => "decisions",
        // SMG's realtime labels; the calls route is `realtime` over `webrtc` in the
        // exposition (metrics::exposition::series).
        b"/v1/realtime" => "realtime",
        b"/v1/realtime/calls" => "realtime_calls",
        b"/v1/realtime/sessions" => "realtime_sessions",
        b"/v1/realtime/client_secrets" => "realtime_client_secrets",
        b"/v1/realtime/transcription_sessions" => "realtime_transcription",
        _ => "other",
    };
    let body_streams = matches!(
        path.as_bytes(),
        b"/generate"
            | b"/v1/chat/completions"
            | b"/v1/completions"
            | b"/v1/messages"
            | b"/v1/embeddings"
            | b"/v1/classify"
    );
    let realtime = matches!(
        path.as_bytes(),
        b"/v1/realtime"
            | b"/v1/realtime/calls"
            | b"/v1/realtime/sessions"
            | b"/v1/realtime/client_secrets"
            | b"/v1/realtime/transcription_sessions"
    );
    EndpointSpec { path, metric, id_prefix, schema, text, body_streams, realtime, turn: false }
}

/// Every inference endpoint forwarded to workers.
pub static ENDPOINTS: [EndpointSpec; 17] = [
    spec("/v1/chat/completions", "chatcmpl-", Some(contract::Endpoint::ChatCompletions), Some(TextSource::Chat)),
    spec("/v1/completions", "cmpl-", Some(contract::Endpoint::Completions), Some(TextSource::Completion)),
    spec("/generate", "gnt-", None, Some(TextSource::Generate)),
    spec("/v1/embeddings", "embd-", None, None),
    spec("/v1/rerank", "rerank-", None, None),
    spec("/rerank", "rerank-", None, None),
    spec("/v1/responses", "resp-", None, None),
    spec("/v1/messages", "msg_", None, None),
    spec("/v1/classify", "classify-", None, None),
    spec("/v1/tokenize", "tok-", None, None),
    spec("/v1/detokenize", "detok-", None, None),
    // A multipart form, checked by `transcriptions` and forwarded with its own Content-Type.
    spec(transcriptions::PATH, "trsc-", None, None),
    spec("/v1/decisions", "dec-", Some(contract::Endpoint::Decisions), None),
    // Realtime REST: forwarded as received to a realtime worker (model: see serve::inspect).
    spec(realtime::CALLS, "rtc-", None, None),
    spec("/v1/realtime/sessions", "sess_", None, None),
    spec("/v1/realtime/client_secrets", "cs_", None, None),
    spec("/v1/realtime/transcription_sessions", "sess_", None, None),
];

/// `POST /v1/responses` served by the gateway: a turn run as a chat on a gRPC worker and
/// stored (the same path as `/v1/responses` in [`ENDPOINTS`], which HTTP workers are sent).
pub static RESPONSES_TURN: EndpointSpec = EndpointSpec { turn: true, ..spec("/v1/responses", "resp_", None, None) };

/// `GET /v1/realtime`, the WebSocket session: not in [`ENDPOINTS`] (those are POSTs).
pub static REALTIME: EndpointSpec = spec("/v1/realtime", "rt-", None, None);

/// Answers the gateway gives itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    Health,
    Readiness,
    Models,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Local(Local),
    Proxy(&'static EndpointSpec),
    /// `GET /v1/realtime`: a WebSocket session relayed to a realtime worker.
    Realtime(&'static EndpointSpec),
    /// A stored response or conversation, answered from the history store.
    History(history::HistoryOp),
    /// Answered by the worker control thread: the `/workers` API, fan-outs, and the
    /// pass-through worker-info routes.
    Control,
    /// An admin/management endpoint of the contract this gateway does not serve yet.
    AdminNotImplemented,
    NotFound,
    MethodNotAllowed,
}

/// Admin and management routes (SMG's): never opened by a tenant key. A path is one of them
/// if it equals an entry or continues it with `/`.
pub const ADMIN_ROUTES: [&str; 10] = [
    "/workers",
    "/flush_cache",
    "/get_loads",
    "/start_profile",
    "/stop_profile",
    "/parse/function_call",
    "/parse/reasoning",
    "/wasm",
    "/v1/tokenizers",
    "/v1/workers",
];

/// Admin routes the control thread answers; the rest answer 501.
const CONTROL_ROUTES: [&str; 4] = ["/workers", "/v1/workers", "/flush_cache", "/get_loads"];

/// Public routes passed through to a worker by the control thread (SMG's).
const WORKER_INFO_ROUTES: [&str; 3] = ["/get_server_info", "/get_model_info", "/health_generate"];

/// The admin route `path` falls under, if any.
fn admin_route(path: &[u8]) -> Option<&'static str> {
    ADMIN_ROUTES.iter().copied().find(|r| {
        let r = r.as_bytes();
        path.starts_with(r) && (path.len() == r.len() || path[r.len()] == b'/')
    })
}

/// A request's route, from its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub action: Action,
    /// The route's template, as metrics label it (`other` for an unknown path).
    pub path: &'static str,
    /// An admin route (worker management, …): its own key rules.
    pub admin: bool,
}

impl Route {
    /// The body is read only for a request that will be forwarded.
    pub fn needs_body(&self) -> bool {
        matches!(self.action, Action::Proxy(_) | Action::Control | Action::History(_))
    }

    /// Prefix of a request id the gateway generates for this route.
    pub fn id_prefix(&self) -> &'static str {
        match self.action {
            Action::Proxy(spec) | Action::Realtime(spec) => spec.id_prefix,
            _ => "req-",
        }
    }
}

enum Target {
    Local(Local, &'static str),
    Endpoint(&'static EndpointSpec),
}

fn target(path: &[u8]) -> Option<Target> {
    Some(match path {
        b"/health" => Target::Local(Local::Health, "/health"),
        b"/liveness" => Target::Local(Local::Health, "/liveness"),
        b"/readiness" => Target::Local(Local::Readiness, "/readiness"),
        b"/v1/models" => Target::Local(Local::Models, "/v1/models"),
        _ => return ENDPOINTS.iter().find(|e| e.path.as_bytes() == path).map(Target::Endpoint),
    })
}

/// The route of `(method, path)`.
pub fn classify(method: Method, path: &[u8]) -> Route {
    if let Some(admin) = admin_route(path) {
        let action = if CONTROL_ROUTES.contains(&admin) { Action::Control } else { Action::AdminNotImplemented };
        return Route { action, path: admin, admin: true };
    }
    if let Some(info) = WORKER_INFO_ROUTES.iter().copied().find(|r| r.as_bytes() == path) {
        let action = if method == Method::Get { Action::Control } else { Action::MethodNotAllowed };
        return Route { action, path: info, admin: false };
    }
    if path == REALTIME.path.as_bytes() {
        let action = if method == Method::Get { Action::Realtime(&REALTIME) } else { Action::MethodNotAllowed };
        return Route { action, path: REALTIME.path, admin: false };
    }
    if let Some((op, label)) = history::classify(method, path) {
        let action = op.map_or(Action::MethodNotAllowed, Action::History);
        return Route { action, path: label, admin: false };
    }
    let (action, label) = match target(path) {
        None => (Action::NotFound, "other"),
        Some(Target::Local(l, p)) if matches!(method, Method::Get | Method::Head) => (Action::Local(l), p),
        Some(Target::Endpoint(e)) if method == Method::Post => (Action::Proxy(e), e.path),
        Some(Target::Local(_, p)) => (Action::MethodNotAllowed, p),
        Some(Target::Endpoint(e)) => (Action::MethodNotAllowed, e.path),
    };
    Route { action, path: label, admin: false }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let proxy = |p: &str| match classify(Method::Post, p.as_bytes()).action {
            Action::Proxy(s) => Some(s.path),
            _ => None,
        };
        assert_eq!(proxy("/v1/chat/completions"), Some("/v1/chat/completions"));
        assert_eq!(proxy("/rerank"), Some("/rerank"));
        assert_eq!(proxy("/v1/audio/transcriptions"), Some(transcriptions::PATH));
        assert_eq!(proxy("/v1/chat/completions/"), None);
        assert_eq!(classify(Method::Get, b"/liveness").action, Action::Local(Local::Health));
        assert_eq!(classify(Method::Head, b"/v1/models").action, Action::Local(Local::Models));
        assert_eq!(classify(Method::Post, b"/v1/models").action, Action::MethodNotAllowed);
        assert_eq!(classify(Method::Get, b"/v1/chat/completions").action, Action::MethodNotAllowed);
        assert_eq!(classify(Method::Get, b"/nope").action, Action::NotFound);
        assert_eq!(classify(Method::Get, b"/v1/realtime").action, Action::Realtime(&REALTIME));
        assert_eq!(classify(Method::Post, b"/v1/realtime").action, Action::MethodNotAllowed);
        assert_eq!(proxy("/v1/realtime/calls"), Some(realtime::CALLS));
        assert!(ENDPOINTS.iter().filter(|e| e.realtime).count() == 4 && REALTIME.realtime);
        assert!(!classify(Method::Get, b"/health").needs_body());
        assert_eq!(classify(Method::Post, b"/v1/messages").id_prefix(), "msg_");
        assert_eq!(classify(Method::Get, b"/health").id_prefix(), "req-");
        for admin in ["/workers", "/workers/abc", "/flush_cache", "/v1/tokenizers/t/status"] {
            assert!(classify(Method::Post, admin.as_bytes()).admin, "{admin}");
        }
        assert!(!classify(Method::Get, b"/workersx").admin);
        assert_eq!(classify(Method::Get, b"/workers/abc").path, "/workers");
        assert_eq!(classify(Method::Get, b"/nope/x").path, "other");
        assert_eq!(classify(Method::Get, b"/liveness").path, "/liveness");
    }

    #[test]
    fn endpoint_paths_are_unique() {
        for (i, a) in ENDPOINTS.iter().enumerate() {
            assert!(ENDPOINTS[i + 1..].iter().all(|b| b.path != a.path), "{}", a.path);
        }
    }
}
