//! `GET /sim/requests`: the last requests a worker was sent, with the headers that carry
//! credentials and the host they were meant for, so a test can check what reached a worker
//! (a gateway must never pass its own key to a provider, nor one provider's key to another).
//! The simulator's own routes (`/sim/*`) are not logged. Bounded: the last [`KEEP`].

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt::Write as _;

use crate::sim::render::put_json_str;

/// Requests kept per worker.
pub const KEEP: usize = 4096;

/// The headers logged, lowercased, in the order each entry lists them.
pub const HEADERS: [&str; 6] =
    ["host", "authorization", "x-api-key", "x-goog-api-key", "anthropic-version", "anthropic-beta"];

#[derive(Debug, Default)]
pub struct RequestLog {
    entries: RefCell<VecDeque<String>>,
}

impl RequestLog {
    /// Logs one request: its method, path and each of [`HEADERS`] it carried (as sent).
    pub fn record(&self, method: &str, path: &str, headers: &[(usize, &[u8])]) {
        let mut e = String::with_capacity(128);
        let s = |v: &str| {
            let mut b = Vec::with_capacity(v.len() + 2);
            put_json_str(&mut b, v);
            String::from_utf8(b).unwrap_or_default()
        };
        let _ = write!(e, "{{\"method\":{},\"path\":{}", s(method), s(path));
        for &(i, v) in headers {
            let _ = write!(e, ",{}:{}", s(HEADERS[i]), s(&String::from_utf8_lossy(v)));
        }
        e.push('}');
        let mut q = self.entries.borrow_mut();
        if q.len() == KEEP {
            q.pop_front();
        }
        q.push_back(e);
    }

    /// The log as a JSON array, oldest first.
    pub fn json(&self) -> String {
        let q = self.entries.borrow();
        let mut out = String::with_capacity(2 + q.iter().map(|e| e.len() + 1).sum::<usize>());
        out.push('[');
        for (i, e) in q.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(e);
        }
        out.push(']');
        out
    }
}

#[cfg(test)]
mod tests {
    use sonic_rs::{JsonContainerTrait, JsonValueTrait};

    use super::*;

    #[test]
    fn logs_what_was_sent_and_keeps_the_last() {
        let log = RequestLog::default();
        log.record("POST", "/v1/chat/completions", &[(0, b"api.x.ai"), (1, b"Bearer k\"1")]);
        let v: sonic_rs::Value = sonic_rs::from_str(&log.json()).unwrap();
        assert_eq!(v[0]["host"].as_str(), Some("api.x.ai"));
        assert_eq!(v[0]["authorization"].as_str(), Some("Bearer k\"1"));
        assert!(v[0].get("x-api-key").is_none());
        for _ in 0..KEEP {
            log.record("GET", "/health", &[]);
        }
        let v: sonic_rs::Value = sonic_rs::from_str(&log.json()).unwrap();
        assert_eq!(v.as_array().map(|a| a.len()), Some(KEEP));
        assert_eq!(v[0]["path"].as_str(), Some("/health"));
    }
}
