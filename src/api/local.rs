//! The gateway's own answers: health, readiness and the model list, from the Snapshot.

use super::Local;
use crate::http::respond::{write_simple, Simple, Stamp};
use crate::workers::Snapshot;

/// Appends the answer to `local` and returns its status.
pub fn answer(out: &mut Vec<u8>, local: Local, snap: &Snapshot, head_only: bool, stamp: &Stamp<'_>) -> u16 {
    match local {
        Local::Health => {
            let resp = Simple { status: 200, content_type: "text/plain", headers: &[], body: b"OK" };
            write_simple(out, &resp, head_only, stamp);
            200
        }
        Local::Readiness => {
            let healthy = snap.workers.iter().filter(|w| w.healthy).count();
            let (status, state) = if healthy > 0 { (200, "ready") } else { (503, "not_ready") };
            let body = format!(
                "{{\"status\":\"{state}\",\"healthy_workers\":{healthy},\"total_workers\":{}}}",
                snap.workers.len()
            );
            let resp = Simple { status, content_type: "application/json", headers: &[], body: body.as_bytes() };
            write_simple(out, &resp, head_only, stamp);
            status
        }
        Local::Models => {
            let resp = match &snap.models_body {
                Some(b) => Simple { status: 200, content_type: "application/json", headers: &[], body: b },
                None => Simple { status: 503, content_type: "text/plain", headers: &[], body: b"No models available" },
            };
            write_simple(out, &resp, head_only, stamp);
            resp.status
        }
    }
}
