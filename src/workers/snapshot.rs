//! The Snapshot: the one thing the control thread publishes to every shard (via arc-swap).
//!
//! It is immutable; a change builds a new one. Shards keep a shard-local `Rc` of the
//! current Arc (see `shard::SnapshotCache`) so no request touches a shared refcount.

// aHash, not SipHash: these maps are looked up by the request's model on every request (SipHash
// was 1.4% of a chat-1k request's instructions, `bench/callgrind-per-request`); its keys are
// still randomized per process.
use ahash::AHashMap as HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::url::{WorkerId, WorkerUrl};

pub type Registry = Arc<ArcSwap<Snapshot>>;

#[derive(Debug, Clone)]
pub struct Worker {
    pub id: WorkerId,
    /// For a data-parallel rank, `url.url` is `base@rank` (what `x-smg-routed-worker-id` says).
    pub url: WorkerUrl,
    /// The model id the worker reported; None until it first answered.
    pub model: Option<String>,
    /// Routable: Ready by its health checks, and its circuit breaker is not open.
    pub healthy: bool,
    /// The last load the worker reported on `/v1/loads` (least_load, overload protection).
    pub engine_load: Option<u64>,
    /// Past its overload threshold by the load monitor's last look.
    pub overloaded: bool,
    /// `max_running_requests` from discovery (`/get_server_info`), when it reported one.
    pub max_running: Option<u64>,
    pub meta: Arc<WorkerMeta>,
}

/// What a worker was registered with and what discovery found: read by the paths that
/// need it (the worker's own key, a data-parallel rank, the runtime), shared by Arc so a
/// publish copies none of it.
#[derive(Debug, Clone, Default)]
pub struct WorkerMeta {
    pub runtime: Runtime,
    pub labels: Vec<(String, String)>,
    /// Sent to the worker as `Authorization: Bearer`, replacing the client's.
    pub api_key: Option<crate::secret::Secret>,
    /// `--dp-aware`: this entry is one rank of a data-parallel worker.
    pub dp_rank: Option<u32>,
    /// A `grpc://` worker's model (tokenizer, context window, sampling defaults); None for
    /// HTTP workers. Set once discovery loaded the tokenizer: before that the worker is not
    /// routable.
    pub grpc: Option<Arc<crate::grpc::model::GrpcModel>>,
    /// Its part in prefill/decode disaggregation, if any.
    pub role: Role,
    /// Where it publishes KV-cache events over ZMQ (HTTP workers; gRPC workers stream them).
    pub kv_events: Option<Arc<crate::workers::kv_events_source::KvEventsSource>>,
    /// A cloud provider: its key goes in the provider's style, never a gateway key
    /// (`serve/upstream.rs`), and its models are not in the keyless `/v1/models`.
    pub provider: Option<super::provider::Provider>,
    /// A provider's models after `Worker::model`.
    pub more_models: Vec<String>,
    /// An `https://` worker: how a shard gets a TLS connection to it (`egress/`). Its
    /// `url.addr` is then the egress thread's loopback port, for the control thread.
    pub tls: Option<Arc<crate::egress::TlsRoute>>,
}

/// The part a worker plays: whole requests, or one leg of a prefill/decode pair. A prefill
/// worker never gets a request of its own: it is picked beside a decode worker
/// (serve/pair.rs), which is what routing picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    #[default]
    Regular,
    /// `bootstrap_port`: where an SGLang decode engine fetches the KV from (None: the
    /// engine's default, sent as `null`).
    Prefill {
        bootstrap_port: Option<u16>,
    },
    Decode,
}

// === impl Role ===

impl Role {
    /// From a registration's `worker_type` (SMG's names; `encode` and the empty default
    /// route as regular workers).
    pub fn of(worker_type: &str, bootstrap_port: Option<u16>) -> Self {
        match worker_type {
            "prefill" => Role::Prefill { bootstrap_port },
            "decode" => Role::Decode,
            _ => Role::Regular,
        }
    }

    /// SMG's name for it (`worker_type`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Regular => "regular",
            Role::Prefill { .. } => "prefill",
            Role::Decode => "decode",
        }
    }

    pub fn is_prefill(self) -> bool {
        matches!(self, Role::Prefill { .. })
    }
}

/// The engine behind a worker, as registration detected it (or the spec said).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Runtime {
    /// A local engine of unknown make (llama.cpp, say): detected as none of the others, or
    /// not detected yet. SMG's `unspecified`.
    #[default]
    Unspecified,
    Sglang,
    Vllm,
    Trtllm,
    /// An external OpenAI-compatible API, not local inference: only when the registration
    /// says so.
    External,
}

// === impl Runtime ===

impl Runtime {
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Sglang => "sglang",
            Runtime::Vllm => "vllm",
            Runtime::Trtllm => "trtllm",
            Runtime::External => "external",
            Runtime::Unspecified => "unspecified",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "sglang" => Runtime::Sglang,
            "vllm" => Runtime::Vllm,
            "trtllm" | "tensorrt-llm" | "tensorrt_llm" => Runtime::Trtllm,
            "external" | "openai" | "generic" => Runtime::External,
            "unspecified" => Runtime::Unspecified,
            _ => return None,
        })
    }
}

#[derive(Debug, Default)]
pub struct Snapshot {
    /// Bumped on every publish; routing uses it to skip re-fingerprinting worker lists.
    pub generation: u64,
    /// Every registered worker, in registration order (so sorted by id).
    pub workers: Vec<Worker>,
    /// Model id → its routable workers, and the same over every worker: computed once per
    /// publish so a request neither filters nor allocates them. Prefill workers are not
    /// among them: they are picked beside a decode worker, from `prefill_by_model`.
    healthy_by_model: HashMap<String, Routable>,
    healthy: Routable,
    /// Model id → its routable prefill workers (empty without prefill/decode pairs).
    prefill_by_model: HashMap<String, Vec<usize>>,
    pairs: bool,
    /// Pre-rendered GET /v1/models body; None when no worker serves any model.
    pub models_body: Option<Vec<u8>>,
    /// Why a request body must be read to route on this fleet whatever the request says
    /// (several models: the body names one; data-parallel workers: their rank is spliced
    /// in; gRPC workers: it is tokenized), as the streamed-body decision's reason label;
    /// None when nothing here requires it.
    pub body_needed: Option<&'static str>,
    /// The fleet's one model, when it has exactly one.
    pub only_model: Option<String>,
    /// Some worker is `grpc://`: only then does a request look for a gRPC model to
    /// tokenize with before routing (the HTTP path pays one bool test).
    pub any_grpc: bool,
    /// Some worker is a cloud provider: a caller's own key may list its models.
    pub providers: bool,
}

/// A model's workers as routing sees them. Overloaded workers are left out while any
/// other is routable; when every routable one is overloaded the request is shed.
#[derive(Debug, Default)]
enum Routable {
    #[default]
    Down,
    Overloaded(Vec<usize>),
    Up(Vec<usize>),
}

pub enum Candidates<'a> {
    /// No worker has ever reported this model.
    UnknownModel,
    /// Workers serve it, but none is healthy now.
    AllDown,
    /// Positions in `workers` of the healthy workers that serve it.
    Healthy(&'a [usize]),
    /// Healthy workers serve it, but every one is over its overload threshold.
    Overloaded(&'a [usize]),
}

// === impl Snapshot ===

impl Snapshot {
    pub fn new(generation: u64, workers: Vec<Worker>) -> Self {
        debug_assert!(workers.windows(2).all(|p| p[0].id < p[1].id), "workers sorted by id");
        let mut by_model: HashMap<String, Vec<usize>> = HashMap::new();
        let mut models: Vec<&str> = Vec::new();
        for (pos, w) in workers.iter().enumerate() {
            for m in w.model.iter().chain(&w.meta.more_models) {
                let ids = by_model.entry(m.clone()).or_default();
                // The keyless list is the self-hosted models' (a provider's need a key).
                if w.meta.provider.is_none() && !models.contains(&m.as_str()) {
                    models.push(m);
                }
                ids.push(pos);
            }
        }
        // Listed models are those with at least one routable worker.
        // A prefill worker serves no request alone: it neither lists a model nor is a candidate.
        let serving = |p: usize| workers[p].healthy && !workers[p].meta.role.is_prefill();
        let listed: Vec<&str> = models.into_iter().filter(|m| by_model[*m].iter().any(|&p| serving(p))).collect();
        let models_body = (!listed.is_empty()).then(|| render_models(&listed, "self_hosted"));
        let providers = workers.iter().any(|w| w.meta.provider.is_some());
        let routable = |ids: &[usize]| -> Routable {
            let up: Vec<usize> = ids.iter().copied().filter(|&p| serving(p)).collect();
            let cool: Vec<usize> = up.iter().copied().filter(|&p| !workers[p].overloaded).collect();
            match (up.is_empty(), cool.is_empty()) {
                (true, _) => Routable::Down,
                (false, true) => Routable::Overloaded(up),
                (false, false) => Routable::Up(cool),
            }
        };
        let healthy_by_model = by_model.iter().map(|(m, ids)| (m.clone(), routable(ids))).collect();
        let all: Vec<usize> = (0..workers.len()).collect();
        let healthy = routable(&all);
        let only_model = (by_model.len() == 1).then(|| by_model.keys().next().cloned()).flatten();
        let mut prefill_by_model: HashMap<String, Vec<usize>> = HashMap::new();
        for (pos, w) in workers.iter().enumerate() {
            if let (Some(m), true) = (&w.model, w.healthy && w.meta.role.is_prefill()) {
                prefill_by_model.entry(m.clone()).or_default().push(pos);
            }
        }
        let any_grpc = workers.iter().any(|w| w.url.grpc);
        let pairs = workers.iter().any(|w| w.meta.role != Role::Regular);
        // A gRPC worker takes token ids the gateway makes from the whole body: streaming one
        // to it would write HTTP/1.1 to its HTTP/2 port. A pair's legs get fields spliced in;
        // a provider gets engine-only fields spliced out.
        let body_needed = if by_model.len() > 1 {
            Some("model_ambiguous")
        } else if any_grpc || pairs || workers.iter().any(|w| w.meta.dp_rank.is_some() || w.meta.provider.is_some()) {
            Some("worker_mutates_body")
        } else {
            None
        };
        Snapshot {
            generation,
            workers,
            healthy_by_model,
            healthy,
            prefill_by_model,
            pairs,
            models_body,
            body_needed,
            only_model,
            any_grpc,
            providers,
        }
    }

    /// Some worker is one leg of a prefill/decode pair.
    pub fn has_pairs(&self) -> bool {
        self.pairs
    }

    /// Routable prefill workers for `model` (the decode leg's model).
    pub fn prefill_candidates(&self, model: &str) -> &[usize] {
        self.prefill_by_model.get(model).map_or(&[], Vec::as_slice)
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
                Some(r) => r,
            },
            None => &self.healthy,
        };
        match up {
            Routable::Down => Candidates::AllDown,
            Routable::Overloaded(list) => Candidates::Overloaded(list),
            Routable::Up(list) => Candidates::Healthy(list),
        }
    }
}

/// A `GET /v1/models` answer listing `models`, each `owned_by` `owner` (`self_hosted`, or a
/// provider's name).
pub fn render_models<S: AsRef<str>>(models: &[S], owner: &str) -> Vec<u8> {
    let mut out = b"{\"object\":\"list\",\"data\":[".to_vec();
    for (i, m) in models.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"id\":");
        smg_wire::json::put_str(&mut out, m.as_ref());
        out.extend_from_slice(b",\"object\":\"model\",\"created\":0,\"owned_by\":");
        smg_wire::json::put_str(&mut out, owner);
        out.push(b'}');
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
            overloaded: false,
            max_running: None,
            meta: Arc::default(),
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
