//! ApiError: every error the gateway itself answers, turned into the contract's envelope
//! (`type` = reason phrase, `code`, `message`, `param: null`) plus `X-SMG-Error-Code`.

use crate::http::respond::{reason, write_simple, Simple, Stamp};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    /// Seconds for `Retry-After`, on sheds that ask the client to back off.
    pub retry_after: Option<u16>,
    /// `X-SMG-Preempted: true` (the priority scheduler preempted the request).
    pub preempted: bool,
}

// === impl ApiError ===

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), retry_after: None, preempted: false }
    }

    pub fn model_not_found(model: &str) -> Self {
        Self::new(404, "model_not_found", format!("No worker serves model '{model}'"))
    }

    pub fn no_available_workers(model: Option<&str>) -> Self {
        let message = match model {
            Some(m) => {
                format!("No available workers for model '{m}': all are unhealthy or their circuit breakers are open")
            }
            None => "No available workers: all are unhealthy or their circuit breakers are open".to_string(),
        };
        Self::new(503, "no_available_workers", message)
    }

    /// Every eligible worker is over its overload threshold (`--worker-overload-shed`).
    pub fn overload_shed(model: Option<&str>, retry_after_secs: u64) -> Self {
        let message = match model {
            Some(m) => format!("Every worker for model '{m}' is overloaded"),
            None => "Every worker is overloaded".to_string(),
        };
        let mut e = Self::new(503, "worker_overload_protection_shed", message);
        e.retry_after = Some(retry_after_secs.min(u16::MAX as u64) as u16);
        e
    }

    /// A pair's decode worker had no free slot in its running window within
    /// `--pd-admission-wait-secs`.
    pub fn pd_decode_shed(decode: &str, retry_after_secs: u64) -> Self {
        let message = format!("Decode worker {decode} had no free slot within --pd-admission-wait-secs");
        let mut e = Self::new(503, "worker_overload_protection_shed", message);
        e.retry_after = Some(retry_after_secs.min(u16::MAX as u64) as u16);
        e
    }

    /// A pair's prefill worker is at `--prefill-max-inflight-requests-per-worker` and the
    /// prefill queue has no place left (Retry-After as the admission queue's).
    pub fn pd_prefill_queue_full() -> Self {
        let e = Self::new(
            429,
            "pd_prefill_queue_full",
            "Too many requests: the prefill worker is at --prefill-max-inflight-requests-per-worker and the prefill queue is full",
        );
        Self { retry_after: Some(2), ..e }
    }

    /// A pair waited in the prefill queue past `--prefill-queue-timeout-secs`.
    pub fn pd_prefill_queue_timeout(waited: std::time::Duration) -> Self {
        let e = Self::new(
            429,
            "pd_prefill_queue_timeout",
            format!("Waited {}s in the prefill queue (--prefill-queue-timeout-secs)", waited.as_secs()),
        );
        Self { retry_after: Some(2), ..e }
    }

    /// Decisions: no worker of the model can serve them (`decisions_not_supported`).
    pub fn decisions_not_supported(model: &str) -> Self {
        Self::new(
            501,
            "decisions_not_supported",
            format!("Decisions are not supported by any worker serving model '{model}'"),
        )
    }

    /// Decisions on an SGLang worker that SGLang Decisions cannot honor.
    pub fn unsupported_decisions_request(why: impl Into<String>) -> Self {
        Self::new(400, "unsupported_decisions_request", why)
    }

    /// An SGLang worker's successful Decisions reply that does not map to the contract.
    pub fn invalid_decisions_response() -> Self {
        Self::new(
            502,
            "invalid_decisions_response",
            "The worker's decisions result could not be mapped to a valid response",
        )
    }

    pub fn body_too_large(limit: usize) -> Self {
        Self::new(413, "request_body_too_large", format!("Request body exceeds --max-payload-size ({limit} bytes)"))
    }

    /// A streamed body's client went away (EOF or reset) before all of it was forwarded.
    pub fn body_aborted() -> Self {
        Self::new(400, "request_body_aborted", "The client's upload ended before the request body was complete")
    }

    pub fn body_stalled() -> Self {
        Self::new(408, "request_body_stalled", "The request body stalled")
    }

    pub fn route_not_found(path: &str) -> Self {
        Self::new(404, "not_found", format!("No route for {path}"))
    }

    pub fn method_not_allowed(path: &str) -> Self {
        Self::new(405, "method_not_allowed", format!("Method not allowed for {path}"))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "bad_request", message)
    }

    pub fn uri_too_long() -> Self {
        Self::new(414, "uri_too_long", "Request line too long")
    }

    pub fn head_too_large() -> Self {
        Self::new(431, "header_fields_too_large", "Request header fields too large")
    }

    pub fn unknown_transfer_coding() -> Self {
        Self::new(501, "unsupported_transfer_coding", "Transfer-Encoding other than chunked is not implemented")
    }

    /// A tenant's token or request budget cannot fit the request now (`Retry-After`: whole
    /// seconds until it can), or ever (no `Retry-After`).
    pub fn tenant_rate_limited(retry_after_secs: Option<u64>) -> Self {
        let e = Self::new(429, "tenant_rate_limit_exceeded", "Tenant rate limit exceeded for this request");
        Self { retry_after: retry_after_secs.map(|s| s.min(u16::MAX as u64) as u16), ..e }
    }

    pub fn admission_queue_full() -> Self {
        let e = Self::new(
            429,
            "admission_queue_full",
            "Too many requests: --max-concurrent-requests reached and the queue is full",
        );
        Self { retry_after: Some(2), ..e }
    }

    pub fn admission_queue_timeout(waited: std::time::Duration) -> Self {
        let e = Self::new(
            503,
            "admission_queue_timeout",
            format!("Waited {}s in the admission queue (--queue-timeout-secs)", waited.as_secs()),
        );
        Self { retry_after: Some(2), ..e }
    }

    /// The priority scheduler: the request's class queue is full.
    pub fn scheduler_queue_full() -> Self {
        let e = Self::new(429, "scheduler_queue_full", "request queue is full for this priority class");
        Self { retry_after: Some(2), ..e }
    }

    /// The priority scheduler: waited longer than the class's `queue_timeout_secs`.
    pub fn scheduler_queue_timeout() -> Self {
        let e = Self::new(503, "scheduler_queue_timeout", "timed out waiting for an admission slot");
        Self { retry_after: Some(2), ..e }
    }

    /// The priority scheduler: preempted by a higher class before its first byte.
    pub fn scheduler_preempted() -> Self {
        let e = Self::new(503, "scheduler_preempted", "request preempted by higher-priority traffic");
        Self { retry_after: Some(1), preempted: true, ..e }
    }

    pub fn admin_not_implemented(path: &str) -> Self {
        Self::new(501, "not_implemented", format!("{path} is not implemented by this gateway yet"))
    }

    /// The request came back to this gateway (`http/hop.rs`).
    pub fn loop_detected() -> Self {
        Self::new(
            508,
            "loop_detected",
            "The request came back to this gateway: a worker URL leads to the gateway itself",
        )
    }

    pub fn internal(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(500, code, message)
    }

    pub fn upstream_connect(worker: &str, err: &std::io::Error) -> Self {
        Self::new(502, "upstream_connect_failed", format!("Failed to connect to worker {worker}: {err}"))
    }

    pub fn upstream_failed(worker: &str, what: &str) -> Self {
        Self::new(502, "upstream_error", format!("Worker {worker} failed: {what}"))
    }

    pub fn upstream_too_large(worker: &str, len: u64, max: usize) -> Self {
        Self::new(
            502,
            "upstream_response_too_large",
            format!("Worker {worker} answered with {len} bytes, over --max-payload-size ({max})"),
        )
    }

    pub fn upstream_timeout(worker: &str) -> Self {
        Self::new(504, "upstream_timeout", format!("Worker {worker} sent no response within --request-timeout-secs"))
    }

    /// The JSON envelope; the message is escaped, since it may quote a client's model name.
    pub fn envelope(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96 + self.message.len());
        out.extend_from_slice(b"{\"error\":{\"type\":\"");
        out.extend_from_slice(reason(self.status).as_bytes());
        out.extend_from_slice(b"\",\"code\":\"");
        out.extend_from_slice(self.code.as_bytes());
        out.extend_from_slice(b"\",\"message\":");
        smg_wire::json::put_str(&mut out, &self.message);
        out.extend_from_slice(b",\"param\":null}}");
        out
    }

    /// Appends the full HTTP response (envelope + `x-smg-error-code`) to `out`.
    pub fn write_response(&self, out: &mut Vec<u8>, head_only: bool, stamp: &Stamp<'_>) {
        let body = self.envelope();
        let mut secs = Vec::new();
        let mut headers: [(&str, &[u8]); 3] = [("x-smg-error-code", self.code.as_bytes()), ("", b""), ("", b"")];
        let mut n = 1;
        if let Some(s) = self.retry_after {
            smg_wire::num::put_dec(&mut secs, s as u64);
            headers[n] = ("retry-after", &secs);
            n += 1;
        }
        if self.preempted {
            headers[n] = ("x-smg-preempted", b"true");
            n += 1;
        }
        let resp =
            Simple { status: self.status, content_type: "application/json", headers: &headers[..n], body: &body };
        write_simple(out, &resp, head_only, stamp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_shape() {
        let e = ApiError::model_not_found("a\"b");
        let v: sonic_rs::Value = sonic_rs::from_slice(&e.envelope()).unwrap();
        use sonic_rs::JsonValueTrait;
        assert_eq!(v["error"]["type"].as_str(), Some("Not Found"));
        assert_eq!(v["error"]["code"].as_str(), Some("model_not_found"));
        assert!(v["error"]["param"].is_null());
        assert!(v["error"]["message"].as_str().unwrap().contains("a\"b"));
    }
}
