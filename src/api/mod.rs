//! The API surface: which path is which endpoint, and the gateway's own answers
//! (health, readiness, models, errors). Inference endpoints go to `proxy`.

pub mod error;
pub mod proxy;

pub use error::ApiError;

use std::rc::Rc;

use monoio::net::TcpStream;

use crate::http::head::{Method, RequestHead};
use crate::http::response::{write_simple, Simple};
use crate::http::server::{Body, Finish};
use crate::runtime::io::write_all;
use crate::runtime::shard::Shard;

/// Inference endpoints forwarded to workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Generate,
    Embeddings,
    Rerank,
    Responses,
    Messages,
    Classify,
    Tokenize,
    Detokenize,
}

impl Endpoint {
    /// Prefix of ids the gateway generates for this endpoint (OpenAI's own where one exists).
    pub fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chatcmpl-",
            Endpoint::Completions => "cmpl-",
            Endpoint::Generate => "gnt-",
            Endpoint::Embeddings => "embd-",
            Endpoint::Rerank => "rerank-",
            Endpoint::Responses => "resp-",
            Endpoint::Messages => "msg_",
            Endpoint::Classify => "classify-",
            Endpoint::Tokenize => "tok-",
            Endpoint::Detokenize => "detok-",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Health,
    Readiness,
    Models,
    Inference(Endpoint),
    NotFound,
}

pub fn route(path: &[u8]) -> Route {
    match path {
        b"/health" | b"/liveness" => Route::Health,
        b"/readiness" => Route::Readiness,
        b"/v1/models" => Route::Models,
        b"/v1/chat/completions" => Route::Inference(Endpoint::ChatCompletions),
        b"/v1/completions" => Route::Inference(Endpoint::Completions),
        b"/generate" => Route::Inference(Endpoint::Generate),
        b"/v1/embeddings" => Route::Inference(Endpoint::Embeddings),
        b"/v1/rerank" | b"/rerank" => Route::Inference(Endpoint::Rerank),
        b"/v1/responses" => Route::Inference(Endpoint::Responses),
        b"/v1/messages" => Route::Inference(Endpoint::Messages),
        b"/v1/classify" => Route::Inference(Endpoint::Classify),
        b"/v1/tokenize" => Route::Inference(Endpoint::Tokenize),
        b"/v1/detokenize" => Route::Inference(Endpoint::Detokenize),
        _ => Route::NotFound,
    }
}

/// Answers one request. Returns the keep-alive decision and the connection buffer.
pub async fn dispatch(
    shard: &Rc<Shard>,
    client: &mut TcpStream,
    head: &RequestHead,
    buf: Vec<u8>,
    body: Body,
) -> (Finish, Vec<u8>) {
    // Only error answers name the path; borrow it lazily so a proxied request allocates nothing here.
    let path_str = || String::from_utf8_lossy(&buf[head.path.clone()]);
    let r = route(&buf[head.path.clone()]);
    let head_only = head.method == Method::Head;
    let readable = matches!(head.method, Method::Get | Method::Head);
    let mut out = Vec::with_capacity(512);
    let close = head.close || shard.draining.get();
    match r {
        Route::Inference(ep) if head.method == Method::Post => {
            return proxy::forward(shard, client, head, buf, body, ep).await
        }
        Route::Inference(_) => {
            ApiError::method_not_allowed(&path_str()).write_response(&mut out, None, head_only, close)
        }
        Route::Health if readable => write_simple(
            &mut out,
            &Simple { status: 200, content_type: "text/plain", headers: &[], body: b"OK" },
            head_only,
            close,
        ),
        Route::Readiness if readable => {
            let snap = shard.snapshot();
            let healthy = snap.workers.iter().filter(|w| w.healthy).count();
            let (status, state) = if healthy > 0 { (200, "ready") } else { (503, "not_ready") };
            let body = format!(
                "{{\"status\":\"{state}\",\"healthy_workers\":{healthy},\"total_workers\":{}}}",
                snap.workers.len()
            );
            write_simple(
                &mut out,
                &Simple { status, content_type: "application/json", headers: &[], body: body.as_bytes() },
                head_only,
                close,
            );
        }
        Route::Models if readable => {
            let snap = shard.snapshot();
            let resp = match &snap.models_body {
                Some(b) => Simple { status: 200, content_type: "application/json", headers: &[], body: b },
                None => Simple { status: 503, content_type: "text/plain", headers: &[], body: b"No models available" },
            };
            write_simple(&mut out, &resp, head_only, close);
        }
        Route::Health | Route::Readiness | Route::Models => {
            ApiError::method_not_allowed(&path_str()).write_response(&mut out, None, head_only, close)
        }
        Route::NotFound => ApiError::route_not_found(&path_str()).write_response(&mut out, None, head_only, close),
    }
    let (res, _) = write_all(client, out).await;
    (if res.is_ok() && !close { Finish::KeepAlive } else { Finish::Close }, buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route(b"/v1/chat/completions"), Route::Inference(Endpoint::ChatCompletions));
        assert_eq!(route(b"/rerank"), Route::Inference(Endpoint::Rerank));
        assert_eq!(route(b"/liveness"), Route::Health);
        assert_eq!(route(b"/v1/chat/completions/"), Route::NotFound);
        assert_eq!(route(b"/nope"), Route::NotFound);
    }
}
