//! The Snapshot: the one thing the control thread publishes to every shard (via arc-swap).
//!
//! It is immutable; a change builds a new one. Shards keep a shard-local `Rc` of the
//! current Arc (see `shard::SnapshotCache`) so no request touches a shared refcount.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::url::{WorkerId, WorkerUrl};

pub type Registry = Arc<ArcSwap<Snapshot>>;

#[derive(Debug, Clone)]
pub struct Worker {
    pub id: WorkerId,
    pub url: WorkerUrl,
    /// The model id the worker reported; None until it first answered.
    pub model: Option<String>,
    /// Routable: answered its health check and the model probe.
    pub healthy: bool,
    /// The last load the worker reported on `/v1/loads` (least_load only).
    pub engine_load: Option<u64>,
}

#[derive(Debug, Default)]
pub struct Snapshot {
    /// Bumped on every publish; routing uses it to skip re-fingerprinting worker lists.
    pub generation: u64,
    /// Every registered worker, in registration order (so sorted by id).
    pub workers: Vec<Worker>,
    /// Model id → positions in `workers` of its healthy workers (a model whose workers are
    /// all down keeps an empty list), and every healthy worker: computed once per publish
    /// so a request neither filters nor allocates them.
    healthy_by_model: HashMap<String, Vec<usize>>,
    healthy: Vec<usize>,
    /// Pre-rendered GET /v1/models body; None when no worker serves any model.
    pub models_body: Option<Vec<u8>>,
}

pub enum Candidates<'a> {
    /// No worker has ever reported this model.
    UnknownModel,
    /// Workers serve it, but none is healthy now.
    AllDown,
    /// Positions in `workers` of the healthy workers that serve it.
    Healthy(&'a [usize]),
}

// === impl Snapshot ===

impl Snapshot {
    pub fn new(generation: u64, workers: Vec<Worker>) -> Self {
        debug_assert!(workers.windows(2).all(|p| p[0].id < p[1].id), "workers sorted by id");
        let mut by_model: HashMap<String, Vec<usize>> = HashMap::new();
        let mut models: Vec<&str> = Vec::new();
        for (pos, w) in workers.iter().enumerate() {
            if let Some(m) = &w.model {
                let ids = by_model.entry(m.clone()).or_default();
                if ids.is_empty() {
                    models.push(m);
                }
                ids.push(pos);
            }
        }
        // Listed models are those with at least one routable worker.
        let listed: Vec<&str> =
            models.into_iter().filter(|m| by_model[*m].iter().any(|id| workers[*id].healthy)).collect();
        let models_body = (!listed.is_empty()).then(|| render_models(&listed));
        let healthy_by_model = by_model
            .iter()
            .map(|(m, ids)| (m.clone(), ids.iter().copied().filter(|id| workers[*id].healthy).collect()))
            .collect();
        let healthy = (0..workers.len()).filter(|&p| workers[p].healthy).collect();
        Snapshot { generation, workers, healthy_by_model, healthy, models_body }
    }

    /// The worker registered under `id`, if it still is.
    pub fn worker(&self, id: WorkerId) -> Option<&Worker> {
        self.workers.binary_search_by_key(&id, |w| w.id).ok().map(|p| &self.workers[p])
    }

    /// Healthy workers for `model`; with no model, every healthy worker.
    pub fn candidates(&self, model: Option<&str>) -> Candidates<'_> {
        let up = match model {
            Some(m) => match self.healthy_by_model.get(m) {
                None => return Candidates::UnknownModel,
                Some(ids) => ids,
            },
            None => &self.healthy,
        };
        if up.is_empty() {
            Candidates::AllDown
        } else {
            Candidates::Healthy(up)
        }
    }
}

fn render_models(models: &[&str]) -> Vec<u8> {
    let mut out = b"{\"object\":\"list\",\"data\":[".to_vec();
    for (i, m) in models.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"id\":");
        smg_wire::json::put_str(&mut out, m);
        out.extend_from_slice(b",\"object\":\"model\",\"created\":0,\"owned_by\":\"self_hosted\"}");
    }
    out.extend_from_slice(b"]}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(id: usize, model: Option<&str>, healthy: bool) -> Worker {
        Worker {
            id: WorkerId(id as u32),
            url: WorkerUrl::parse(&format!("http://127.0.0.1:{}", 1000 + id)).unwrap(),
            model: model.map(Into::into),
            healthy,
            engine_load: None,
        }
    }

    #[test]
    fn models_listed_once_and_only_when_routable() {
        let s = Snapshot::new(
            1,
            vec![w(0, Some("a"), true), w(1, Some("a"), true), w(2, Some("b"), false), w(3, None, false)],
        );
        let body = String::from_utf8(s.models_body.clone().unwrap()).unwrap();
        assert_eq!(
            body,
            r#"{"object":"list","data":[{"id":"a","object":"model","created":0,"owned_by":"self_hosted"}]}"#
        );
        assert!(matches!(s.candidates(Some("b")), Candidates::AllDown));
        assert!(matches!(s.candidates(Some("zzz")), Candidates::UnknownModel));
        match s.candidates(Some("a")) {
            Candidates::Healthy(v) => assert_eq!(v.len(), 2),
            _ => panic!(),
        }
        assert!(Snapshot::new(1, vec![w(0, None, false)]).models_body.is_none());
        assert_eq!(s.worker(WorkerId(2)).map(|w| w.healthy), Some(false));
        assert!(s.worker(WorkerId(9)).is_none());
    }
}
