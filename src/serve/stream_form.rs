//! Phase: body, streamed, for a transcription form (`POST /v1/audio/transcriptions` with a
//! `Content-Length` over `--max-buffered-request-bytes`; [`super::stream_body::decide`]
//! says when). The form goes to the worker through the pump's one bounded buffer, and the
//! multipart check ([`FormCheck`]) reads every byte before the worker gets it: a 150 MB
//! upload costs the reads' buffer and the form's head, not 150 MB.
//!
//! The model is in the body, so the form's head is held (up to the larger of
//! `--max-buffered-request-bytes` and [`MIN_HOLD`]) until its `model` part has ended; the
//! worker is picked on it, an alias spliced over it as in a buffered form. A form whose
//! `file` part comes first cannot be routed by model without holding the file: with one
//! model in the fleet it goes to that model's workers, and the `model` it names at its end
//! must resolve to it; with several it is refused (plain-text `400`). SMG reads the whole
//! form into memory first (its `AudioTranscriptionMultipart` extractor), so the order does
//! not matter there; here memory is bounded by configuration instead.
//!
//! A form refused while its head is held gets the contract's plain-text `400` with nothing
//! sent to a worker. One refused later (a field after the file, a truncated form, a missing
//! file) is refused before the read that shows it is written: the worker has part of the
//! form, never all of it, and its connection is closed; the client gets the `400` (no byte
//! of the worker's answer has reached it: that is read only after the whole body). Either
//! way the client connection closes, as its body is not read to the end.

use std::rc::Rc;

use super::client::Client;
use super::ctx::RequestCtx;
use super::error::Failure;
use super::finish::Outcome;
use super::pick::pick_worker;
use super::stream_body::{stream, Check, Upload, PUMP};
use super::upstream::client_content_type;
use crate::api::transcriptions::FormCheck;
use crate::api::{ApiError, EndpointSpec};
use crate::contract::Aliases;
use crate::http::head::RequestHead;
use crate::http::respond::CONTINUE;
use crate::io::{read_into, write_all};
use crate::shard::Shard;

/// The least of a form's head held for its `model` field, whatever
/// `--max-buffered-request-bytes` says (0 there streams every form).
const MIN_HOLD: usize = 64 * 1024;

/// Streams the form to a worker picked on its `model` field and relays the answer.
pub(super) async fn forward(
    shard: &Rc<Shard>,
    client: &mut Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    spec: &EndpointSpec,
    len: usize,
) -> Outcome {
    let mut form = match FormCheck::new(head.header(&client.buf, "content-type")) {
        Ok(f) => f,
        Err(msg) => return refused(ctx, Failure::Form(msg)),
    };
    let hold = usize::try_from(shard.cfg().max_buffered_request_bytes).unwrap_or(usize::MAX).max(MIN_HOLD);
    let continued = match read_form_head(shard, client, head, ctx, &mut form, len, hold).await {
        Ok(c) => c,
        Err(o) => return o,
    };
    let here = (client.buf.len() - head.len).min(len);
    if here == len {
        if let Err(msg) = form.finish() {
            return refused(ctx, Failure::Form(msg));
        }
    }
    let aliases = &shard.cfg().aliases;
    let mut sent_len = len;
    let canonical = match form.model() {
        Some(Err(msg)) => return refused(ctx, Failure::Form(msg)),
        Some(Ok((named, at))) => match resolve(aliases, named) {
            Some(canonical) => {
                // The alias is in the held head: the worker gets the canonical id in its
                // place, and a body longer or shorter by the difference.
                let at = head.len + at.start..head.len + at.end;
                sent_len = len - at.len() + canonical.len();
                client.buf.splice(at, canonical.bytes());
                canonical.to_owned()
            }
            None => named.to_owned(),
        },
        None => match shard.snapshot().only_model.clone() {
            Some(only) => only,
            None => {
                let msg = format!(
                    "Missing required field: model (a form over {hold} bytes must name its model before its file)"
                );
                return refused(ctx, Failure::Form(msg));
            }
        },
    };
    ctx.model = Some(canonical.clone());
    ctx.streaming = form.streaming();
    let picked = match pick_worker(shard, spec, head, &client.buf, &[], ctx, &[], None) {
        Ok(p) => p,
        Err(f) => return refused(ctx, f),
    };
    if let Err(o) = super::reserve::reserve(shard, ctx, len).await {
        ctx.close = true;
        return o;
    }
    ctx.bytes_in = len as u64;
    // It cannot be re-sent, so it is not preempted once its body starts moving.
    if let Some(slot) = &ctx.slot {
        slot.held().start();
    }
    let content_type = client_content_type(spec, head, &client.buf);
    let mut rest = Rest { form, routed: canonical, aliases };
    stream(shard, client, head, ctx, &picked, sent_len, Upload { check: Some(&mut rest), continued, content_type })
        .await
}

/// Reads the form's head into the connection buffer, each read checked, until its `model`
/// part has ended, its `file` part has started, `hold` bytes are held or the body is all
/// here. Ok: whether the client got its `100 Continue`.
async fn read_form_head(
    shard: &Shard,
    client: &mut Client,
    head: &RequestHead,
    ctx: &mut RequestCtx,
    form: &mut FormCheck,
    len: usize,
    hold: usize,
) -> Result<bool, Outcome> {
    let mut continued = false;
    let mut fed = 0;
    let mut chunk = Vec::new();
    loop {
        let here = (client.buf.len() - head.len).min(len);
        if here > fed {
            if let Err(msg) = form.feed(&client.buf[head.len + fed..head.len + here]) {
                return Err(refused(ctx, Failure::Form(msg)));
            }
            fed = here;
        }
        if form.model().is_some() || form.file_started() || here >= hold || here == len {
            return Ok(continued);
        }
        if head.expect_continue && !continued {
            continued = true;
            if write_all(&mut client.stream, CONTINUE.to_vec()).await.0.is_err() {
                return Err(Outcome::ClientGone);
            }
        }
        // The body ends `len - here` bytes on: a read must not take the next request's.
        let want = (len - here).min(hold - here).min(PUMP);
        let read = read_into(&mut client.stream, std::mem::take(&mut chunk), want);
        let (res, b) = match shard.cfg().stream_body_stall {
            Some(limit) => match crate::clock::timeout(limit, read).await {
                Ok(r) => r,
                Err(_) => return Err(refused(ctx, Failure::Rejected(ApiError::body_stalled()))),
            },
            None => read.await,
        };
        chunk = b;
        match res {
            Ok(n) if n > 0 => client.buf.extend_from_slice(&chunk),
            _ => return Err(refused(ctx, Failure::Rejected(ApiError::body_aborted()))),
        }
    }
}

/// The canonical id an alias names; None for a name that is no alias.
fn resolve<'a>(aliases: &'a Aliases, named: &str) -> Option<&'a str> {
    (!aliases.is_empty()).then(|| aliases.resolve(named)).flatten()
}

/// Refused before the body was read to its end: the connection closes.
fn refused(ctx: &mut RequestCtx, f: Failure) -> Outcome {
    ctx.close = true;
    Outcome::Failed(f)
}

/// The form's check for the bytes the pump reads, with the rule that needs its end: the
/// `model` it names (last, as a buffered form's check reads it) routes where it was routed.
struct Rest<'a> {
    form: FormCheck,
    /// The canonical model the form was routed on.
    routed: String,
    aliases: &'a Aliases,
}

impl Check for Rest<'_> {
    fn feed(&mut self, bytes: &[u8], last: bool) -> Result<(), Failure> {
        self.form.feed(bytes).map_err(Failure::Form)?;
        if !last {
            return Ok(());
        }
        let t = self.form.finish().map_err(Failure::Form)?;
        if resolve(self.aliases, &t.model).unwrap_or(&t.model) != self.routed {
            return Err(Failure::Rejected(ApiError::model_not_found(&t.model)));
        }
        Ok(())
    }

    fn streaming(&self) -> bool {
        self.form.streaming()
    }
}
