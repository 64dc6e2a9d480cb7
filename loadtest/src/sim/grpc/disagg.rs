//! A PD worker's part in a Generate call (`--grpc --pd-role`, protocol in pd/mod.rs): what
//! `disaggregated_params` (SGLang's DisaggregatedParams) ask of it, and a decode's wait for the
//! KV before its call answers anything.

use std::rc::Rc;

use bytes::Bytes;
use h2::server::SendResponse;
use smg_proto::scheduler::{DisaggregatedParams, GenerateRequest};

use crate::sim::grpc::wire::{Code, Status};
use crate::sim::handoff;
use crate::sim::pd::fields::Leg;
use crate::sim::pd::{Handoff, PdRole};
use crate::sim::worker::Worker;
use crate::sync::Event;

/// The call's part for this worker's role; INVALID_ARGUMENT when the role's params are missing
/// or malformed.
pub(crate) fn handoff(role: Option<PdRole>, req: &GenerateRequest) -> Result<Handoff, Status> {
    let Some(role) = role else { return Ok(Handoff::None) };
    let bad = |m: String| Status::new(Code::INVALID_ARGUMENT, m);
    let Some(p) = req.disaggregated_params.as_ref() else {
        return Err(bad(format!(
            "disaggregated_params (bootstrap_host, bootstrap_port, bootstrap_room) are required on a {} server",
            role.name()
        )));
    };
    let room = u64::try_from(p.bootstrap_room)
        .map_err(|_| bad(format!("disaggregated_params.bootstrap_room {} is negative", p.bootstrap_room)))?;
    match role {
        PdRole::Prefill => Ok(Handoff::Prefill(vec![room])),
        PdRole::Decode => leg(p, room).map(|l| Handoff::Decode(vec![l])).map_err(bad),
    }
}

/// Where a decode fetches the room: an empty host is no host, a port of 0 (the proto's unset)
/// is SGLang's default bootstrap port.
fn leg(p: &DisaggregatedParams, room: u64) -> Result<Leg, String> {
    if p.bootstrap_host.is_empty() {
        return Err("disaggregated_params.bootstrap_host is required on a decode server".into());
    }
    let port = match p.bootstrap_port {
        0 => None,
        n => Some(u16::try_from(n).map_err(|_| format!("disaggregated_params.bootstrap_port {n} is not a port"))?),
    };
    Ok(Leg { host: p.bootstrap_host.clone(), port, room })
}

/// How a decode's wait for its KV ended.
pub(crate) enum Received {
    /// The KV is here: the call goes on.
    Ready,
    /// An Abort named the call while it waited.
    Aborted,
    /// The client reset the stream.
    Gone,
    /// The KV never came: the reason, for INTERNAL ("KV transfer failed: ...").
    Failed(String),
}

/// A decode's wait for the KV of `legs`, before the call's response head (so that a failure
/// answers "trailers only"), within the worker's handoff budget.
pub(crate) async fn receive(
    w: &Rc<Worker>,
    legs: &[Leg],
    abort: &Event,
    respond: &mut SendResponse<Bytes>,
) -> Received {
    let budget = w.pd.as_ref().map(|p| p.handoff_timeout).unwrap_or_default();
    monoio::select! {
        r = handoff::receive(w, legs, budget) => match r {
            Ok(()) => Received::Ready,
            Err(msg) => Received::Failed(msg),
        },
        _ = abort.wait() => Received::Aborted,
        _ = std::future::poll_fn(|cx| respond.poll_reset(cx)) => Received::Gone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(p: Option<DisaggregatedParams>) -> GenerateRequest {
        GenerateRequest { disaggregated_params: p, ..Default::default() }
    }

    fn params(host: &str, port: i32, room: i32) -> Option<DisaggregatedParams> {
        Some(DisaggregatedParams { bootstrap_host: host.into(), bootstrap_port: port, bootstrap_room: room })
    }

    #[test]
    fn roles_read_disaggregated_params() {
        let ok = req(params("10.0.0.1", 8999, i32::MAX - 1));
        assert_eq!(handoff(None, &ok).unwrap(), Handoff::None);
        assert_eq!(handoff(None, &req(None)).unwrap(), Handoff::None);
        assert_eq!(handoff(Some(PdRole::Prefill), &ok).unwrap(), Handoff::Prefill(vec![(i32::MAX - 1) as u64]));
        let leg = Leg { host: "10.0.0.1".into(), port: Some(8999), room: (i32::MAX - 1) as u64 };
        assert_eq!(handoff(Some(PdRole::Decode), &ok).unwrap(), Handoff::Decode(vec![leg]));
        // Port 0 is the proto's unset: SGLang's default port.
        match handoff(Some(PdRole::Decode), &req(params("h", 0, 3))).unwrap() {
            Handoff::Decode(legs) => assert_eq!((legs[0].port, legs[0].room), (None, 3)),
            other => panic!("{other:?}"),
        }
        // A prefill needs only the room.
        assert!(handoff(Some(PdRole::Prefill), &req(params("", 0, 0))).is_ok());
        for role in [PdRole::Prefill, PdRole::Decode] {
            let e = handoff(Some(role), &req(None)).unwrap_err();
            assert_eq!(e.code, Code::INVALID_ARGUMENT);
            assert!(e.message.contains("disaggregated_params") && e.message.contains(role.name()), "{}", e.message);
            assert_eq!(handoff(Some(role), &req(params("h", 1, -1))).unwrap_err().code, Code::INVALID_ARGUMENT);
        }
        for bad in [params("", 1, 1), params("h", 70_000, 1), params("h", -5, 1)] {
            assert_eq!(handoff(Some(PdRole::Decode), &req(bad)).unwrap_err().code, Code::INVALID_ARGUMENT);
        }
    }
}
